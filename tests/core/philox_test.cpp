// The random stream: Philox 4x32-10 against the Random123 known-answer vectors, the (seed, offset)
// layout documented in core/philox.h, and the distributions of rand/randn.
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

#include "core/philox.h"
#include "core/random.h"

namespace ampscope {
namespace {

struct Kat {
  PhiloxBlock counter;
  std::uint32_t key[2];
  PhiloxBlock expected;
};

// Known-answer vectors published with Random123 (kat_vectors, philox4x32 with 10 rounds).
TEST(philox_test, matches_the_random123_known_answer_vectors) {
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, {0, 0}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {0xffffffffu, 0xffffffffu},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {0xa4093822u, 0x299f31d0u},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Kat& k : kats) {
    const PhiloxBlock r = philox4x32_10(k.counter, k.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.expected.v[i]) << "word " << i;
  }
}

TEST(philox_test, block_index_and_seed_fill_counter_and_key_as_documented) {
  // philox_block(seed, block) is philox4x32_10 with counter (block lo, block hi, 0, 0), key (seed lo, hi).
  const std::uint64_t seed = 0x299f31d0a4093822ull, block = 0x85a308d3243f6a88ull;
  const std::uint32_t key[2] = {0xa4093822u, 0x299f31d0u};
  const PhiloxBlock direct = philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0, 0}}, key);
  const PhiloxBlock via = philox_block(seed, block);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(via.v[i], direct.v[i]);
}

TEST(philox_test, uniform_values_use_exactly_the_significand_bits_and_never_reach_one) {
  // The largest 32-bit input gives the largest value below 1 that the dtype holds.
  EXPECT_EQ(uniform_from_bits<float>(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_EQ(static_cast<float>(uniform_from_bits<f16>(0xffffffffu)), 1.0f - 0x1p-11f);
  EXPECT_EQ(static_cast<float>(uniform_from_bits<bf16>(0xffffffffu)), 1.0f - 0x1p-8f);
  EXPECT_EQ(uniform_from_bits<double>(0xffffffffu), 1.0 - 0x1p-32);
  EXPECT_EQ(uniform_from_bits<float>(0u), 0.0f);
  // The top bits decide: 0x80000000 is one half in every dtype.
  EXPECT_EQ(uniform_from_bits<float>(0x80000000u), 0.5f);
  EXPECT_EQ(static_cast<float>(uniform_from_bits<f16>(0x80000000u)), 0.5f);
}

TEST(philox_test, rand_takes_word_i_mod_4_of_block_offset_plus_i_div_4) {
  Generator gen(1234);
  gen.set_offset(10);
  const Tensor t = rand({7}, gen);
  for (std::uint64_t i = 0; i < 7; ++i) {
    const PhiloxBlock b = philox_block(1234, 10 + i / 4);
    EXPECT_EQ(t.at({static_cast<std::int64_t>(i)}), uniform_from_bits<float>(b.v[i % 4])) << "element " << i;
  }
  EXPECT_EQ(gen.offset(), 12u) << "7 values take ceil(7/4) = 2 blocks";
}

TEST(philox_test, consecutive_draws_continue_the_stream_without_reusing_blocks) {
  Generator one(7), two(7);
  const std::vector<double> whole = rand({16}, one).values();
  const std::vector<double> first = rand({8}, two).values();
  const std::vector<double> second = rand({8}, two).values();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(first[i], whole[i]);
    EXPECT_EQ(second[i], whole[8 + i]);
  }
}

TEST(philox_test, same_seed_gives_same_values_and_another_seed_differs) {
  Generator a(99), b(99), c(100);
  const std::vector<double> x = randn({1000}, a).values(), y = randn({1000}, b).values(), z = randn({1000}, c).values();
  EXPECT_EQ(x, y);
  int same = 0;
  for (int i = 0; i < 1000; ++i) same += x[i] == z[i];
  EXPECT_LT(same, 5);
}

TEST(philox_test, randn_follows_box_muller_on_the_documented_words) {
  Generator gen(5);
  const Tensor t = randn({4}, gen, {DType::f64});
  const PhiloxBlock b = philox_block(5, 0);
  for (int pair = 0; pair < 2; ++pair) {
    const double u1 = (b.v[2 * pair] + 1.0) / 4294967296.0, u2 = b.v[2 * pair + 1] / 4294967296.0;
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
    // Rounded to float even for f64, so the CPU's and the GPU's libm agree (core/philox.h).
    EXPECT_EQ(t.at({2 * pair}), static_cast<double>(static_cast<float>(r * std::cos(theta))));
    EXPECT_EQ(t.at({2 * pair + 1}), static_cast<double>(static_cast<float>(r * std::sin(theta))));
  }
}

TEST(philox_test, rand_and_randn_have_the_moments_of_their_distributions) {
  // 2^20 samples: the standard error of the mean is 1/sqrt(12 * 2^20) ~ 2.8e-4 for U[0,1) and
  // 1/1024 ~ 9.8e-4 for N(0,1); allow 5 standard errors. The variance's standard error is about
  // sqrt(2/n) * var for the normal (~1.4e-3), again 5 of them.
  Generator gen(2024);
  const std::int64_t n = 1 << 20;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const std::vector<double> u = rand({n}, gen, {dtype}).values();
    double mean = 0, min = 1, max = 0;
    for (double v : u) {
      mean += v;
      min = std::min(min, v);
      max = std::max(max, v);
    }
    mean /= n;
    EXPECT_NEAR(mean, 0.5 - (dtype == DType::bf16 ? 0x1p-9 : dtype == DType::f16 ? 0x1p-12 : 0.0), 5 * 2.8e-4)
        << dtype_name(dtype);  // truncation to k bits lowers the mean by 2^-(k+1)
    EXPECT_GE(min, 0.0);
    EXPECT_LT(max, 1.0);
  }
  const std::vector<double> z = randn({n}, gen).values();
  double mean = 0, var = 0;
  for (double v : z) mean += v;
  mean /= n;
  for (double v : z) var += (v - mean) * (v - mean);
  var /= n - 1;
  EXPECT_NEAR(mean, 0.0, 5 * 9.8e-4);
  EXPECT_NEAR(var, 1.0, 5 * 1.4e-3);
}

TEST(philox_test, random_tensors_of_integer_dtype_are_refused_with_the_dtype_named) {
  Generator gen;
  try {
    rand({3}, gen, {DType::i64});
    FAIL() << "expected DTypeError";
  } catch (const DTypeError& e) {
    EXPECT_STREQ(e.what(), "rand: dtype i64 is not a floating-point type (use f64, f32, f16 or bf16)");
  }
}

}  // namespace
}  // namespace ampscope
