// T5's relative position buckets (HF's T5Attention._relative_position_bucket) against values worked by hand.
// relative_position = key position - query position. With num_buckets N: bidirectional halves it (n = N/2;
// keys after the query add n), causal keeps n = N and maps keys after the query to distance 0. Then with
// max_exact = n/2: distance d < max_exact is bucket d; otherwise
//   max_exact + trunc(log(d / max_exact) / log(max_distance / max_exact) * (n - max_exact)), at most n - 1.
#include <gtest/gtest.h>

#include <string>

#include "models/hf_t5.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace hf = samples::hf;

TEST(t5_buckets_test, bidirectional_32_buckets_max_distance_128_match_the_hand_computed_buckets) {
  // n = 16, max_exact = 8, log(128 / 8) = log 16 = 2.7725887, n - max_exact = 8.
  struct Case {
    std::int64_t rel, bucket;
  };
  const Case cases[] = {
      // keys before the query (rel <= 0): no offset, d = |rel|
      {-200, 15},  // 8 + trunc(log(200/8) / log 16 * 8) = 8 + trunc(3.2188758 / 2.7725887 * 8 = 9.288) = 17 -> 15
      {-64, 14},   // 8 + trunc(log 8 / log 16 * 8) = 8 + trunc(0.75 * 8 = 6.0) = 14 (f32 gives 6.0 here, as torch)
      {-8, 8},     // 8 + trunc(log 1 / ...) = 8 + 0
      {-1, 1},     // exact: d = 1 < 8
      {0, 0},      // rel 0 is not > 0: no offset, d = 0
      // keys after the query (rel > 0): offset n = 16
      {1, 17},     // 16 + 1
      {7, 23},     // 16 + 7, the last exact bucket
      {8, 24},     // 16 + 8 + trunc(log 1) = 24
      {9, 24},     // 16 + 8 + trunc(log(9/8) / log 16 * 8 = 0.1177830 / 2.7725887 * 8 = 0.340) = 24
      {100, 31},   // 16 + 8 + trunc(log 12.5 / log 16 * 8 = 2.5257286 / 2.7725887 * 8 = 7.288) = 16 + 15
      {500, 31},   // 16 + min(8 + trunc(log 62.5 / log 16 * 8 = 11.93), 15) = 16 + 15
  };
  for (const Case& c : cases) {
    EXPECT_EQ(hf::relative_position_bucket(c.rel, true, 32, 128), c.bucket) << "relative position " << c.rel;
  }
}

TEST(t5_buckets_test, causal_32_buckets_max_distance_128_match_the_hand_computed_buckets) {
  // n = 32, max_exact = 16, log(128 / 16) = log 8 = 2.0794415, n - max_exact = 16; d = max(-rel, 0).
  struct Case {
    std::int64_t rel, bucket;
  };
  const Case cases[] = {
      {5, 0},       // a later key: d = 0 (the causal mask hides it anyway)
      {0, 0},
      {-1, 1},
      {-15, 15},    // the last exact bucket
      {-16, 16},    // 16 + trunc(log 1) = 16
      {-17, 16},    // 16 + trunc(log(17/16) / log 8 * 16 = 0.0606246 / 2.0794415 * 16 = 0.466) = 16
      {-64, 26},    // 16 + trunc(log 4 / log 8 * 16 = 1.3862944 / 2.0794415 * 16 = 10.667) = 26
      {-100, 30},   // 16 + trunc(log 6.25 / log 8 * 16 = 1.8325815 / 2.0794415 * 16 = 14.10) = 30
      {-127, 31},   // 16 + trunc(log 7.9375 / log 8 * 16 = 2.0715973 / 2.0794415 * 16 = 15.94) = 31
      {-128, 31},   // 16 + trunc(16.0) = 32 -> at most 31
      {-200, 31},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(hf::relative_position_bucket(c.rel, false, 32, 128), c.bucket) << "relative position " << c.rel;
  }
}

TEST(t5_buckets_test, the_tests_tiny_8_bucket_table_reaches_its_log_spaced_buckets) {
  // The configuration of the tests' tiny models (8 buckets, max distance 16).
  // Bidirectional: n = 4, max_exact = 2, log(16 / 2) = log 8 = 2.0794415, n - max_exact = 2.
  EXPECT_EQ(hf::relative_position_bucket(-1, true, 8, 16), 1);
  EXPECT_EQ(hf::relative_position_bucket(-3, true, 8, 16), 2);  // 2 + trunc(log 1.5 / log 8 * 2 = 0.390)
  EXPECT_EQ(hf::relative_position_bucket(-5, true, 8, 16), 2);  // 2 + trunc(log 2.5 / log 8 * 2 = 0.881)
  EXPECT_EQ(hf::relative_position_bucket(-6, true, 8, 16), 3);  // 2 + trunc(log 3 / log 8 * 2 = 1.057)
  EXPECT_EQ(hf::relative_position_bucket(6, true, 8, 16), 7);   // 4 + 3
  EXPECT_EQ(hf::relative_position_bucket(1, true, 8, 16), 5);   // 4 + 1
  // Causal: n = 8, max_exact = 4, log(16 / 4) = log 4 = 1.3862944, n - max_exact = 4.
  EXPECT_EQ(hf::relative_position_bucket(-5, false, 8, 16), 4);  // 4 + trunc(log 1.25 / log 4 * 4 = 0.644)
  EXPECT_EQ(hf::relative_position_bucket(-7, false, 8, 16), 5);  // 4 + trunc(log 1.75 / log 4 * 4 = 1.615)
  EXPECT_EQ(hf::relative_position_bucket(-16, false, 8, 16), 7); // 4 + trunc(4.0) = 8 -> at most 7
}

TEST(t5_buckets_test, refuses_tables_too_small_to_split) {
  EXPECT_THROW(
      {
        try {
          hf::relative_position_bucket(3, true, 2, 128);
        } catch (const hf::ModelError& e) {
          EXPECT_STREQ(e.what(),
                       "relative_position_bucket: needs num_buckets >= 4 and max_distance >= 1, got 2 and 128\nhint: "
                       "T5 checkpoints use 32 buckets and max distance 128");
          throw;
        }
      },
      hf::ModelError);
}

}  // namespace
}  // namespace ampscope
