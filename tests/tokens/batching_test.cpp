// The window rules of issues 18 and 19 on examples worked by hand from the rule (the windows are listed
// below in comments and as literals, not computed from the code's formula):
//   decoder models: window k covers tokens [k*T, k*T + T + 1), inputs its first T, targets its last T;
//   T5: window k covers tokens [k*T, k*T + T), encoder input its first T/2, labels its last T/2, decoder
//   input the labels shifted right behind decoder_start_token_id;
//   step s uses windows s*B .. s*B + B - 1, each modulo the number of whole windows.
#include <gtest/gtest.h>

#include <numeric>

#include "models/token_data.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

using Rows = std::vector<std::vector<std::int64_t>>;

std::vector<std::int32_t> iota_tokens(int n, int first = 0) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

Rows rows(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.dim(), 2);
  Rows out(static_cast<std::size_t>(t.size(0)));
  const std::int64_t* p = t.contiguous().data_as<std::int64_t>();
  for (std::int64_t r = 0; r < t.size(0); ++r) out[r].assign(p + r * t.size(1), p + (r + 1) * t.size(1));
  return out;
}

TEST(batching_test, counts_whole_windows_as_the_rules_say) {
  // Decoder: floor((n - 1) / T). 21 tokens, T 4: 20 / 4 = 5; 20 tokens: 19 / 4 = 4; T + 1 tokens: 1.
  EXPECT_EQ(window_count(21, 4, false), 5);
  EXPECT_EQ(window_count(20, 4, false), 4);
  EXPECT_EQ(window_count(5, 4, false), 1);
  EXPECT_EQ(window_count(2, 1, false), 1);
  // T5: floor(n / T). 21 tokens, T 4: 5; 20 tokens: 5; 4 tokens: 1.
  EXPECT_EQ(window_count(21, 4, true), 5);
  EXPECT_EQ(window_count(20, 4, true), 5);
  EXPECT_EQ(window_count(4, 4, true), 1);
  EXPECT_EQ(window_count(21, 6, true), 3);
}

TEST(batching_test, too_few_tokens_for_one_window_says_how_many_are_needed) {
  EXPECT_THROW_MSG(window_count(4, 4, false), TokenFileError, "4 tokens make no whole window at context 4",
                   "needs 5 tokens", "--context");
  EXPECT_THROW_MSG(window_count(0, 4, false), TokenFileError, "0 tokens", "needs 5 tokens");
  EXPECT_THROW_MSG(window_count(3, 4, true), TokenFileError, "3 tokens make no whole window at context 4",
                   "needs 4 tokens", "2 encoder tokens and 2 labels");
  EXPECT_THROW_MSG(causal_lm_batch(iota_tokens(8), 8, 1, 0), TokenFileError, "8 tokens", "needs 9 tokens");
  EXPECT_THROW_MSG(seq2seq_batch(iota_tokens(5), 6, 1, 0, 0), TokenFileError, "5 tokens", "needs 6 tokens");
}

TEST(batching_test, refuses_contexts_batches_and_steps_that_make_no_sense) {
  EXPECT_THROW_MSG(window_count(100, 0, false), Error, "context 0 is below 1");
  EXPECT_THROW_MSG(window_count(100, 5, true), Error, "context 5 is not an even number", "T/2 encoder tokens");
  EXPECT_THROW_MSG(causal_lm_batch(iota_tokens(21), 4, 0, 0), Error, "batch 0 is below 1");
  EXPECT_THROW_MSG(causal_lm_batch(iota_tokens(21), 4, 1, -1), Error, "step -1 is negative");
  EXPECT_THROW_MSG(seq2seq_batch(iota_tokens(21), 4, 1, 0, -1), Error, "decoder_start_token_id -1 is negative");
}

TEST(batching_test, decoder_windows_of_steps_0_to_3_for_21_tokens_context_4_batch_2) {
  // Tokens 0..20, T = 4: 5 whole windows (floor(20 / 4)); token 20 is only ever a target.
  //   window 0: tokens [0, 5)   -> x 0 1 2 3      y 1 2 3 4
  //   window 1: tokens [4, 9)   -> x 4 5 6 7      y 5 6 7 8
  //   window 2: tokens [8, 13)  -> x 8 9 10 11    y 9 10 11 12
  //   window 3: tokens [12, 17) -> x 12 13 14 15  y 13 14 15 16
  //   window 4: tokens [16, 21) -> x 16 17 18 19  y 17 18 19 20
  // B = 2: step 0 windows 0, 1; step 1 windows 2, 3; step 2 windows 4, 5 mod 5 = 0; step 3 windows
  // 6 mod 5 = 1, 7 mod 5 = 2.
  const auto tokens = iota_tokens(21);
  const Rows x[4] = {{{0, 1, 2, 3}, {4, 5, 6, 7}},
                     {{8, 9, 10, 11}, {12, 13, 14, 15}},
                     {{16, 17, 18, 19}, {0, 1, 2, 3}},
                     {{4, 5, 6, 7}, {8, 9, 10, 11}}};
  const Rows y[4] = {{{1, 2, 3, 4}, {5, 6, 7, 8}},
                     {{9, 10, 11, 12}, {13, 14, 15, 16}},
                     {{17, 18, 19, 20}, {1, 2, 3, 4}},
                     {{5, 6, 7, 8}, {9, 10, 11, 12}}};
  for (int s = 0; s < 4; ++s) {
    const TokenBatch b = causal_lm_batch(tokens, 4, 2, s);
    EXPECT_EQ(b.x.shape(), (Shape{2, 4}));
    EXPECT_EQ(b.y.shape(), (Shape{2, 4}));
    EXPECT_EQ(rows(b.x), x[s]) << "step " << s;
    EXPECT_EQ(rows(b.y), y[s]) << "step " << s;
  }
  // Step 5 uses windows 10 mod 5 = 0 and 11 mod 5 = 1: step 0 again (the cycle is 5 steps here).
  EXPECT_EQ(rows(causal_lm_batch(tokens, 4, 2, 5).x), x[0]);
}

TEST(batching_test, decoder_windows_ignore_tokens_past_the_last_whole_window) {
  // Tokens 1000..1021 (22 of them), T = 4, B = 3: floor(21 / 4) = 5 windows; window k starts at 1000 + 4k.
  // Tokens 1021 and (as a target only) 1020 lie past window 4's inputs; 1021 is never used.
  // step 0: windows 0 1 2; step 1: windows 3 4 0 (5 mod 5); step 2: windows 1 2 3 (6, 7, 8 mod 5).
  const auto tokens = iota_tokens(22, 1000);
  EXPECT_EQ(rows(causal_lm_batch(tokens, 4, 3, 1).x),
            (Rows{{1012, 1013, 1014, 1015}, {1016, 1017, 1018, 1019}, {1000, 1001, 1002, 1003}}));
  EXPECT_EQ(rows(causal_lm_batch(tokens, 4, 3, 1).y),
            (Rows{{1013, 1014, 1015, 1016}, {1017, 1018, 1019, 1020}, {1001, 1002, 1003, 1004}}));
  EXPECT_EQ(rows(causal_lm_batch(tokens, 4, 3, 2).x),
            (Rows{{1004, 1005, 1006, 1007}, {1008, 1009, 1010, 1011}, {1012, 1013, 1014, 1015}}));
  // A batch larger than the number of windows repeats windows within the step: T = 10 gives
  // floor(21 / 10) = 2 windows, B = 3 takes windows 0, 1, 0 at step 0 and 3 mod 2 = 1, 0, 1 at step 1.
  EXPECT_EQ(rows(causal_lm_batch(tokens, 10, 3, 1).x)[0][0], 1010);
  EXPECT_EQ(rows(causal_lm_batch(tokens, 10, 3, 1).x)[1][0], 1000);
  EXPECT_EQ(rows(causal_lm_batch(tokens, 10, 3, 1).x)[2][0], 1010);
  // Steps far out do not overflow: step 2^62 with B = 4 uses windows (2^64 + b) mod 2 = b mod 2.
  EXPECT_EQ(rows(causal_lm_batch(tokens, 10, 4, std::int64_t{1} << 62).x)[1][0], 1010);
}

TEST(batching_test, t5_windows_and_shift_right_for_21_tokens_context_4_batch_2) {
  // Tokens 0..20, T = 4: 5 whole windows (floor(21 / 4)); window k covers [4k, 4k + 4); token 20 unused.
  // Encoder input tokens 4k, 4k+1; labels 4k+2, 4k+3; decoder input 99 (the start id), 4k+2.
  //   step 0: windows 0, 1            step 2: windows 4, 5 mod 5 = 0
  const auto tokens = iota_tokens(21);
  const Seq2SeqBatch s0 = seq2seq_batch(tokens, 4, 2, 0, 99);
  EXPECT_EQ(s0.encoder_input.shape(), (Shape{2, 2}));
  EXPECT_EQ(rows(s0.encoder_input), (Rows{{0, 1}, {4, 5}}));
  EXPECT_EQ(rows(s0.labels), (Rows{{2, 3}, {6, 7}}));
  EXPECT_EQ(rows(s0.decoder_input), (Rows{{99, 2}, {99, 6}}));
  const Seq2SeqBatch s2 = seq2seq_batch(tokens, 4, 2, 2, 99);
  EXPECT_EQ(rows(s2.encoder_input), (Rows{{16, 17}, {0, 1}}));
  EXPECT_EQ(rows(s2.labels), (Rows{{18, 19}, {2, 3}}));
  EXPECT_EQ(rows(s2.decoder_input), (Rows{{99, 18}, {99, 2}}));
}

TEST(batching_test, t5_shift_right_over_a_longer_half) {
  // Tokens 0..20, T = 6: floor(21 / 6) = 3 windows, [0, 6), [6, 12), [12, 18); tokens 18..20 unused.
  // B = 2, step 1: windows 2 and 3 mod 3 = 0.
  //   window 2: encoder 12 13 14, labels 15 16 17, decoder 0 15 16
  //   window 0: encoder 0 1 2,    labels 3 4 5,    decoder 0 3 4
  const Seq2SeqBatch b = seq2seq_batch(iota_tokens(21), 6, 2, 1, 0);
  EXPECT_EQ(b.labels.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows(b.encoder_input), (Rows{{12, 13, 14}, {0, 1, 2}}));
  EXPECT_EQ(rows(b.labels), (Rows{{15, 16, 17}, {3, 4, 5}}));
  EXPECT_EQ(rows(b.decoder_input), (Rows{{0, 15, 16}, {0, 3, 4}}));
}

}  // namespace
}  // namespace ampscope::samples
