// tests/core/block_scaled_elements_test.cpp: the shared host/device element functions of
// core/block_scaled_elements.h give the results the CPU's own definitions gave before they were moved there
// (issue 35's CUDA kernels share them). The "before" functions below are the definitions core/block_scaled.cpp
// had at commit 53638cd, kept here verbatim as the regression reference (std::ldexp, std::fmin, std::signbit
// and the grid table, where the shared ones use bit operations); tests/core/block_scaled_test.cpp checks the
// formats themselves against the specification. Runs without a GPU.
#include "core/block_scaled_elements.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/block_scaled.h"

namespace ampscope {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- the definitions before the move (core/block_scaled.cpp at 53638cd)
constexpr float kOldGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float old_e2m1_to_float(std::uint8_t code) {
  const int s = (code >> 3) & 1;
  const int e = (code >> 1) & 3;
  const int m = code & 1;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m) : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
  return s ? -mag : mag;
}

std::uint8_t old_float_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  std::uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return static_cast<std::uint8_t>(sign | code);
}

std::uint8_t old_float_to_e2m1_stochastic(float x, float u) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fmin(std::fabs(x), 6.0f);
  std::uint8_t lo = 0;
  while (lo < 7 && kOldGrid[lo + 1] <= a) ++lo;
  if (kOldGrid[lo] == a) return static_cast<std::uint8_t>(sign | lo);
  const float p = (a - kOldGrid[lo]) / (kOldGrid[lo + 1] - kOldGrid[lo]);
  const std::uint8_t code = u < p ? static_cast<std::uint8_t>(lo + 1) : lo;
  return static_cast<std::uint8_t>(sign | code);
}

float old_e8m0_to_float(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return float_of(0x00400000u);
  return float_of(static_cast<std::uint32_t>(code) << 23);
}

std::uint8_t old_float_to_e8m0_round_up(float v) {
  if (std::isnan(v)) return 0xFF;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  const std::uint32_t u = bits_of(v);
  std::uint32_t exponent = (u >> 23) & 0xFFu;
  const std::uint32_t mantissa = u & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

// The floor rule's element before: std::ldexp by the scale's exponent.
std::uint8_t old_mx_floor_element(float v, std::uint8_t scale, Fp8Format element) {
  return scale == 0xFF ? 0x7F : float_to_fp8(std::ldexp(v, 127 - static_cast<int>(scale)), element);
}

// f32 bit patterns spread over the whole range (every exponent and sign, NaNs and infs included), plus the
// values the E2M1 and E8M0 boundaries sit on and their neighbours.
std::vector<float> probe_values() {
  std::vector<float> v;
  for (std::uint32_t i = 0; i < (1u << 20); ++i) v.push_back(float_of(i * 4099u));
  for (float b : {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f,
                  0x1p-127f, 0x1p-126f, 0x1p127f, std::numeric_limits<float>::infinity()}) {
    for (float s : {1.0f, -1.0f}) {
      const float x = s * b;
      v.push_back(x);
      v.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
      v.push_back(std::nextafter(x, -std::numeric_limits<float>::infinity()));
    }
  }
  return v;
}

TEST(block_scaled_elements_test, all_16_e2m1_codes_decode_as_before) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits_of(e2m1_to_float(static_cast<std::uint8_t>(c))), bits_of(old_e2m1_to_float(static_cast<std::uint8_t>(c))))
        << "code " << c;
  }
  // Only the low 4 bits are read: 0xF7 is code 7 (+6), 0x1F code 15 (-6).
  EXPECT_EQ(bits_of(e2m1_to_float(0xF7)), bits_of(6.0f));
  EXPECT_EQ(bits_of(e2m1_to_float(0x1F)), bits_of(-6.0f));
  for (int c = 16; c < 256; ++c) {
    EXPECT_EQ(bits_of(e2m1_to_float(static_cast<std::uint8_t>(c))), bits_of(old_e2m1_to_float(static_cast<std::uint8_t>(c))))
        << "byte " << c;
  }
}

TEST(block_scaled_elements_test, all_256_e8m0_codes_decode_as_before) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(bits_of(e8m0_to_float(static_cast<std::uint8_t>(c))), bits_of(old_e8m0_to_float(static_cast<std::uint8_t>(c))))
        << "code " << c;
  }
}

TEST(block_scaled_elements_test, every_e8m0_value_and_the_spread_round_up_as_before) {
  std::vector<float> v = probe_values();
  for (int c = 0; c < 255; ++c) {
    const float x = old_e8m0_to_float(static_cast<std::uint8_t>(c));
    v.push_back(x);
    v.push_back(std::nextafter(x, 0.0f));
    v.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
  }
  int mismatches = 0;
  for (float x : v) {
    const float a = std::fabs(x);  // the encoder's input is a non-negative amax quotient (or NaN)
    if (float_to_e8m0_round_up(a) != old_float_to_e8m0_round_up(a) && ++mismatches <= 5) {
      ADD_FAILURE() << "0x" << std::hex << bits_of(a);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(block_scaled_elements_test, e2m1_encoders_give_the_codes_they_gave_before) {
  const std::vector<float> v = probe_values();
  std::mt19937 rng(35);
  std::uniform_int_distribution<std::uint32_t> bits(0, (1u << 24) - 1);
  int mismatches = 0;
  for (float x : v) {
    const float u = static_cast<float>(bits(rng)) * 0x1p-24f;
    const bool rne = float_to_e2m1(x) == old_float_to_e2m1(x);
    const bool sr = float_to_e2m1_stochastic(x, u) == old_float_to_e2m1_stochastic(x, u);
    if ((!rne || !sr) && ++mismatches <= 5) ADD_FAILURE() << "0x" << std::hex << bits_of(x) << " u " << u;
  }
  EXPECT_EQ(mismatches, 0);
  // Every grid interval at u just below and at its p, where the choice flips.
  for (int lo = 0; lo < 7; ++lo) {
    const float a = kOldGrid[lo], b = kOldGrid[lo + 1];
    for (float frac : {0.25f, 0.5f, 0.75f}) {
      const float x = a + frac * (b - a);
      for (float u : {std::nextafter(frac, 0.0f), frac, std::nextafter(frac, 1.0f)}) {
        EXPECT_EQ(float_to_e2m1_stochastic(x, u), old_float_to_e2m1_stochastic(x, u)) << x << " " << u;
        EXPECT_EQ(float_to_e2m1_stochastic(-x, u), old_float_to_e2m1_stochastic(-x, u)) << -x << " " << u;
      }
    }
  }
}

// The floor rule's multiplication by 2^(127 - scale) against std::ldexp, for every scale and both elements.
TEST(block_scaled_elements_test, the_floor_rules_element_codes_equal_ldexps) {
  std::vector<float> v;
  for (std::uint32_t i = 0; i < (1u << 14); ++i) v.push_back(float_of(i * 262147u));
  int mismatches = 0;
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (int s = 0; s < 256; ++s) {
      for (float x : v) {
        const std::uint8_t got = mx_element_code(x, static_cast<std::uint8_t>(s), f, MxScaleRule::floor);
        if (got != old_mx_floor_element(x, static_cast<std::uint8_t>(s), f) && ++mismatches <= 5) {
          ADD_FAILURE() << "x 0x" << std::hex << bits_of(x) << " scale " << std::dec << s;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(block_scaled_elements_test, the_sign_mask_is_kRhtSigns) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(rht_sign(i), static_cast<double>(kRhtSigns[i])) << i;
}

// NVFP4's global scales: a NaN amax gives that NaN, quieted, for both (what x86's division by it gave before).
TEST(block_scaled_elements_test, a_nan_global_amax_gives_its_own_quieted_nan) {
  const float snan = float_of(0x7F800123u);
  const Nvfp4GlobalScales g = nvfp4_global_scales(snan);
  EXPECT_EQ(bits_of(g.encode), 0x7FC00123u);
  EXPECT_EQ(bits_of(g.decode), 0x7FC00123u);
  // And a finite one: the formula in float, checked by hand: 2688 / 2 = 1344, 1 / 1344 rounded to float.
  const Nvfp4GlobalScales h = nvfp4_global_scales(2.0f);
  EXPECT_EQ(h.encode, 1344.0f);
  EXPECT_EQ(bits_of(h.decode), bits_of(static_cast<float>(1.0 / 1344.0)));
}

// Dequantizing: the NaN that comes back is the scale's or the element's own, never the hardware's choice.
TEST(block_scaled_elements_test, dequantized_nans_are_defined_bits) {
  EXPECT_EQ(bits_of(mx_dequantize_element(0x38, 0xFF, Fp8Format::e4m3)), 0x7FC00000u);
  EXPECT_EQ(bits_of(mx_dequantize_element(0xFF, 127, Fp8Format::e4m3)), 0xFFC00000u);  // -NaN element
  EXPECT_EQ(bits_of(mx_dequantize_element(0x38, 128, Fp8Format::e4m3)), bits_of(2.0f));  // 1.0 * 2^1
  EXPECT_EQ(bits_of(nvfp4_dequantize_element(0x3, 0x7F, float_of(0x7FC00abcu))), 0x7FC00000u);  // the scale's NaN first
  EXPECT_EQ(bits_of(nvfp4_dequantize_element(0x3, 0x38, float_of(0x7FC00abcu))), 0x7FC00abcu);
  EXPECT_EQ(nvfp4_dequantize_element(0xB, 0x38, 0.5f), -0.75f);  // -1.5 * (1.0 * 0.5)
}

}  // namespace
}  // namespace ampscope
