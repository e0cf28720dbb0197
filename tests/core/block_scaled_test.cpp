// tests/core/block_scaled_test.cpp: MXFP8 and NVFP4 (core/block_scaled.h) against references written here.
//
// The references are the specifications' formulas in double, written independently of the code under test:
// - element rounding: the value on the format's grid nearest to y, ties to the even code, found from the
//   binade's quantum (FP8) or by searching the 8-point grid (E2M1), then saturated;
// - MX scales: floor(log2 amax) - emax_elem (std::log2 in double), or ceil(log2(amax * fl(1/max))),
//   clamped to E8M0's range;
// - NVFP4: TransformerEngine's reference chain, each f32 step computed in double and rounded once to float
//   (for float operands the double result of +, -, *, / rounded to float is the correctly rounded float
//   result, so this equals the f32 arithmetic without reusing the code's expressions).
// Decoded FP8 values come from core/float8.h, whose decoder tests/core/float8_test.cpp checks code by code.
// Hand-worked blocks (the values docs/fp8.md shows) are asserted as literal numbers.
#include "core/block_scaled.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/float8.h"
#include "core/philox.h"

namespace ampscope {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

#define EXPECT_BITS_EQ(a, b) EXPECT_EQ(bits_of(a), bits_of(b)) << (a) << " vs " << (b)

// ------------------------------------------------------------------------------------ references

// y rounded to the FP8 grid (mbits mantissa bits, smallest normal exponent emin, largest value maxv),
// ties to even, saturated to +-maxv (infinities too); NaN stays NaN. In double, sign kept (also of zero).
double ref_fp8_round(double y, int mbits, int emin, double maxv) {
  if (std::isnan(y)) return y;
  const double a = std::fabs(y);
  double r;
  if (std::isinf(a)) {
    r = maxv;
  } else if (a == 0.0) {
    r = 0.0;
  } else {
    int k;
    std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1): floor(log2 a) = k - 1
    const int e = std::max(k - 1, emin);
    const double quantum = std::ldexp(1.0, e - mbits);
    r = std::nearbyint(a / quantum) * quantum;  // the default rounding mode: ties to even
    if (r > maxv) r = maxv;
  }
  return std::copysign(r, y);
}
double ref_round(double y, Fp8Format f) {
  return f == Fp8Format::e4m3 ? ref_fp8_round(y, 3, -6, 448.0) : ref_fp8_round(y, 2, -14, 57344.0);
}

// y rounded to the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} after saturating to 6: the nearest point, a tie
// going to the point with the even index. NaN -> 0 (as TE's reference). Sign kept.
const double kGrid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
int ref_e2m1_index(double a) {
  a = std::min(a, 6.0);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(a - kGrid[i]);
    const double dbest = std::fabs(a - kGrid[best]);
    if (d < dbest || (d == dbest && i % 2 == 0)) best = i;
  }
  return best;
}
double ref_e2m1(double y) {
  if (std::isnan(y)) return 0.0;
  return std::copysign(kGrid[ref_e2m1_index(std::fabs(y))], y);
}

// The E8M0 value of a code, from its definition.
double ref_e8m0(int c) { return std::ldexp(1.0, c - 127); }

struct RefMxBlock {
  int scale_code;              // 255 = NaN
  std::vector<double> values;  // the elements' quantized values (before the scale); NaN for NaN
};

// The OCP floor rule: shared exponent floor(log2 amax) - emax, clamped to >= -127; NaN/inf in the block
// give the NaN scale.
RefMxBlock ref_mx_floor(const std::vector<float>& block, Fp8Format f) {
  RefMxBlock out;
  double amax = 0.0;
  bool special = false;
  for (float v : block) {
    if (!std::isfinite(v)) special = true;
    amax = std::max(amax, std::fabs(static_cast<double>(v)));
  }
  if (special) {
    out.scale_code = 255;
    out.values.assign(block.size(), std::numeric_limits<double>::quiet_NaN());
    return out;
  }
  const int emax = f == Fp8Format::e4m3 ? 8 : 15;
  int s = amax == 0.0 ? -127 : static_cast<int>(std::floor(std::log2(amax))) - emax;
  s = std::max(s, -127);
  out.scale_code = s + 127;
  for (float v : block) out.values.push_back(ref_round(static_cast<double>(v) / std::ldexp(1.0, s), f));
  return out;
}

// NVIDIA's round-up rule as TransformerEngine runs it: amax over the non-NaN values, v = fl(amax * fl(1/max)),
// scale 2^ceil(log2 v) clamped to [2^-127, 2^127] (v = 0 -> code 0, v = inf -> 254); elements multiplied by
// 2^(127 - code), except 1 for code 0 and 0 for code 254 (TE's exp2f_rcp), then rounded with saturation.
RefMxBlock ref_mx_round_up(const std::vector<float>& block, Fp8Format f) {
  RefMxBlock out;
  double amax = 0.0;
  for (float v : block) {
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  }
  const float rcp = static_cast<float>(1.0 / (f == Fp8Format::e4m3 ? 448.0 : 57344.0));
  const float v = static_cast<float>(amax * static_cast<double>(rcp));
  int code;
  if (std::isinf(v)) {
    code = 254;
  } else if (v == 0.0f) {
    code = 0;
  } else {
    code = static_cast<int>(std::ceil(std::log2(static_cast<double>(v)))) + 127;
    code = std::min(std::max(code, 0), 254);
  }
  out.scale_code = code;
  const double mult = code == 0 ? 1.0 : (code == 254 ? 0.0 : std::ldexp(1.0, 127 - code));
  for (float x : block) out.values.push_back(ref_round(static_cast<double>(x) * mult, f));
  return out;
}

// Checks an MX tensor against the reference, block by block; returns the number of blocks checked.
int check_mx(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const MxOptions& o) {
  const MxTensor q = quantize_mxfp8(x, rows, cols, o);
  const std::vector<float> back = dequantize_mxfp8(q);
  const bool along_row = o.axis == BlockAxis::along_row;
  const std::int64_t n_blocks = rows * cols / 32;
  const std::int64_t per_line = along_row ? cols / 32 : cols;
  EXPECT_EQ(q.scales.size(), static_cast<std::size_t>(n_blocks));
  int checked = 0;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    std::vector<float> block;
    std::vector<std::size_t> idx;
    for (int k = 0; k < 32; ++k) {
      const std::int64_t r = along_row ? b / per_line : (b / per_line) * 32 + k;
      const std::int64_t c = along_row ? (b % per_line) * 32 + k : b % per_line;
      idx.push_back(static_cast<std::size_t>(r * cols + c));
      block.push_back(x[idx.back()]);
    }
    const RefMxBlock ref = o.rule == MxScaleRule::floor ? ref_mx_floor(block, o.element) : ref_mx_round_up(block, o.element);
    EXPECT_EQ(q.scales[static_cast<std::size_t>(b)], ref.scale_code) << "block " << b;
    for (int k = 0; k < 32; ++k) {
      const std::size_t i = idx[static_cast<std::size_t>(k)];
      const float got = fp8_to_float(q.codes[i], o.element);
      const double want = ref.values[static_cast<std::size_t>(k)];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "block " << b << " element " << k << " x=" << block[static_cast<std::size_t>(k)];
        EXPECT_TRUE(std::isnan(back[i]));
      } else {
        EXPECT_BITS_EQ(got, static_cast<float>(want));
        if (ref.scale_code == 255) {
          EXPECT_TRUE(std::isnan(back[i]));
        } else {
          EXPECT_BITS_EQ(back[i], static_cast<float>(want * ref_e8m0(ref.scale_code)));
        }
      }
    }
    ++checked;
  }
  return checked;
}

// ------------------------------------------------------------------------------------------ E2M1, E8M0

TEST(E2M1, EveryCodeDecodesByFormula) {
  // Hand-written table of the magnitudes (OCP MX v1.0, FP4 E2M1): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
  const float table[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const int s = c >> 3, e = (c >> 1) & 3, m = c & 1;
    const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);  // bias 1
    const float want = static_cast<float>(s ? -mag : mag);
    EXPECT_BITS_EQ(e2m1_to_float(static_cast<std::uint8_t>(c)), want) << "code " << c;
    EXPECT_EQ(std::fabs(e2m1_to_float(static_cast<std::uint8_t>(c))), table[c & 7]);
  }
  EXPECT_TRUE(std::signbit(e2m1_to_float(8)));  // -0
}

TEST(E8M0, EveryCodeDecodesByFormula) {
  for (int c = 0; c < 255; ++c) {
    EXPECT_BITS_EQ(e8m0_to_float(static_cast<std::uint8_t>(c)), static_cast<float>(ref_e8m0(c))) << "code " << c;
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(bits_of(e8m0_to_float(0)), 0x00400000u);  // 2^-127, a float subnormal
  EXPECT_EQ(bits_of(e8m0_to_float(254)), 0x7F000000u);  // 2^127
}

TEST(E8M0, RoundUpEncodeAgainstCeilLog2) {
  // The smallest 2^(c - 127) >= v: c = ceil(log2 v) + 127, clamped to 0 .. 254.
  auto want = [](float v) {
    const int c = static_cast<int>(std::ceil(std::log2(static_cast<double>(v)))) + 127;
    return std::min(std::max(c, 0), 254);
  };
  int n = 0;
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float v : {p, std::nextafter(p, kInf), std::nextafter(p, 0.0f), 1.5f * p}) {
      if (v == 0.0f || std::isinf(v)) continue;
      EXPECT_EQ(float_to_e8m0_round_up(v), want(v)) << "v=" << v;
      ++n;
    }
  }
  EXPECT_GT(n, 1000);
  EXPECT_EQ(float_to_e8m0_round_up(std::ldexp(1.0f, -127)), 0);  // exactly 2^-127 (a subnormal)
  EXPECT_EQ(float_to_e8m0_round_up(std::nextafter(std::ldexp(1.0f, -127), kInf)), 1);
  EXPECT_EQ(float_to_e8m0_round_up(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_round_up(FLT_MAX), 254);  // past 2^127: satfinite
  EXPECT_EQ(float_to_e8m0_round_up(kInf), 254);
  EXPECT_EQ(float_to_e8m0_round_up(kNaN), 255);
  EXPECT_EQ(float_to_e8m0_round_up(1.0f), 127);
}

TEST(E2M1, EncodeEveryBoundaryAndTie) {
  struct Tie {
    float mid;
    int below, at, above;  // codes just below, at and just above the midpoint
  };
  // Midpoints between neighbours; at the midpoint the even code wins.
  const Tie ties[] = {{0.25f, 0, 0, 1}, {0.75f, 1, 2, 2}, {1.25f, 2, 2, 3}, {1.75f, 3, 4, 4},
                      {2.5f, 4, 4, 5},  {3.5f, 5, 6, 6}, {5.0f, 6, 6, 7}};
  for (const Tie& t : ties) {
    const float lo = std::nextafter(t.mid, 0.0f), hi = std::nextafter(t.mid, kInf);
    EXPECT_EQ(float_to_e2m1(lo), t.below) << t.mid;
    EXPECT_EQ(float_to_e2m1(t.mid), t.at) << t.mid;
    EXPECT_EQ(float_to_e2m1(hi), t.above) << t.mid;
    EXPECT_EQ(float_to_e2m1(-lo), t.below | 8) << -t.mid;
    EXPECT_EQ(float_to_e2m1(-t.mid), t.at | 8) << -t.mid;
    EXPECT_EQ(float_to_e2m1(-hi), t.above | 8) << -t.mid;
  }
  // Saturation, zeros, NaN.
  EXPECT_EQ(float_to_e2m1(6.0f), 7);
  EXPECT_EQ(float_to_e2m1(std::nextafter(6.0f, kInf)), 7);
  EXPECT_EQ(float_to_e2m1(1e30f), 7);
  EXPECT_EQ(float_to_e2m1(kInf), 7);
  EXPECT_EQ(float_to_e2m1(-kInf), 15);
  EXPECT_EQ(float_to_e2m1(FLT_MAX), 7);
  EXPECT_EQ(float_to_e2m1(0.0f), 0);
  EXPECT_EQ(float_to_e2m1(-0.0f), 8);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(float_to_e2m1(-std::numeric_limits<float>::denorm_min()), 8);
  EXPECT_EQ(float_to_e2m1(kNaN), 0);
  // Every code round-trips.
  for (int c = 0; c < 16; ++c) EXPECT_EQ(float_to_e2m1(e2m1_to_float(static_cast<std::uint8_t>(c))), c);
}

TEST(E2M1, EncodeMatchesNearestEvenOverASweepOfFloats) {
  // Every 251st bit pattern from 0 to 8.0 (about 4.3 million floats), both signs, against the grid search.
  int n = 0;
  for (std::uint32_t u = 0; u <= 0x41000000u; u += 251) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    for (float v : {x, -x}) {
      const double want = ref_e2m1(static_cast<double>(v));
      const float got = e2m1_to_float(float_to_e2m1(v));
      ASSERT_EQ(bits_of(got), bits_of(static_cast<float>(want))) << "x=" << v;
      ++n;
    }
  }
  EXPECT_GT(n, 8000000);
}

// --------------------------------------------------------------------------------------------- MXFP8

// A random matrix mixing magnitudes: every value gets its own power of two (2^-40 .. 2^40, or 2^-10 .. 2^10 in
// alternate runs of 8 columns), about one value in 53 is an exact zero.
std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-40, 40);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const int e = exp_dist(gen);
      const float v = std::ldexp(normal(gen), (c / 8) % 2 == 0 ? e / 4 : e);
      x[static_cast<std::size_t>(r * cols + c)] = (gen() % 53 == 0) ? 0.0f : v;
    }
  }
  return x;
}

TEST(Mxfp8, RandomBlocksMatchTheReferenceForEveryRuleFormatAndAxis) {
  const std::vector<float> x = random_matrix(64, 96, 35);
  int blocks = 0;
  for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::round_up}) {
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      blocks += check_mx(x, 64, 96, {.axis = BlockAxis::along_row, .element = f, .rule = rule});
      blocks += check_mx(x, 64, 96, {.axis = BlockAxis::along_column, .element = f, .rule = rule});
    }
  }
  EXPECT_EQ(blocks, 8 * 64 * 96 / 32);
}

// One 1x32 block, padded with `fill` after the given values.
std::vector<float> block_of(std::vector<float> values, float fill = 0.0f) {
  values.resize(32, fill);
  return values;
}

TEST(Mxfp8, AdversarialBlocksMatchTheReference) {
  const float sub = std::numeric_limits<float>::denorm_min();
  std::vector<std::vector<float>> blocks = {
      block_of({}),                                                  // all zero
      block_of({-0.0f, 0.0f, -0.0f}),                                // signed zeros
      block_of({256.0f, 264.0f, 17.0f, -19.0f, 272.0f, 0.5f}),       // E4M3 ties at scale 1
      block_of({1000.0f, 1e-3f, -2e-3f, 3e-4f}, 1e-3f),              // one outlier over small values
      block_of({sub, 2 * sub, 1e-39f, -3e-39f, 1e-38f}, 5e-40f),     // all f32 subnormal
      block_of({1.0f, kNaN, 2.0f, -3.0f}, 0.25f),                    // NaN inside
      block_of({1.0f, kInf, 2.0f}, 0.5f),                            // inf inside
      block_of({-kInf, 1.0f}),                                       // -inf
      block_of({500.0f, 1.0f, 2.0f, 3.0f}),                          // clipped by floor
      block_of({FLT_MAX, -FLT_MAX, 1.0f}),                           // the largest floats
      block_of({449.0f, 0.001953125f, 0.0029296875f}),               // round-up underflows these
      block_of({std::ldexp(1.0f, -120), std::ldexp(1.5f, -126)}),     // tiny normal amax
  };
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (MxScaleRule rule : {MxScaleRule::floor, MxScaleRule::round_up}) {
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        SCOPED_TRACE("block " + std::to_string(b));
        check_mx(blocks[b], 1, 32, {.element = f, .rule = rule});
      }
    }
  }
}

TEST(Mxfp8, FloorClipsABlockThatRoundUpDoesNot) {
  // Worked in docs/fp8.md. amax 500: floor(log2 500) = 8, 8 - 8 = 0, X = 2^0 (code 127): 500 exceeds 448
  // and is clipped to 448 (0x7E). Round-up: 500 * fl(1/448) = 1.116.. -> 2^1 (code 128): 500 / 2 = 250,
  // which E4M3 rounds to 256 (quantum 16 in [128, 256): 240 or 256, 250 is nearer 256) = 0x78, i.e. 512.
  const std::vector<float> x = block_of({500.0f, 1.0f, 0.01f});
  const MxTensor fl = quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::floor});
  const MxTensor up = quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::round_up});
  EXPECT_EQ(fl.scales[0], 127);
  EXPECT_EQ(fl.codes[0], 0x7E);
  EXPECT_EQ(dequantize_mxfp8(fl)[0], 448.0f);  // clipped: error 52
  EXPECT_EQ(up.scales[0], 128);
  EXPECT_EQ(up.codes[0], 0x78);
  EXPECT_EQ(dequantize_mxfp8(up)[0], 512.0f);  // not clipped: error 12
  // 1.0 survives both; 0.01: floor 0.01 -> 0.009765625 (5 * 2^-9); round-up 0.005 -> 0.005859375 (3 * 2^-9),
  // i.e. 0.01171875 after the scale of 2.
  EXPECT_EQ(dequantize_mxfp8(fl)[2], 0.009765625f);
  EXPECT_EQ(dequantize_mxfp8(up)[2], 0.01171875f);
}

TEST(Mxfp8, RoundUpUnderflowsWhatFloorKeeps) {
  // amax 449: floor keeps X = 1 (449 -> 448) and the E4M3 subnormal 2^-9 survives; round-up takes
  // X = 2, so 2^-9 / 2 = 2^-10 is the tie between 0 and 2^-9 and rounds to the even 0.
  const std::vector<float> x = block_of({449.0f, 0.001953125f});
  EXPECT_EQ(dequantize_mxfp8(quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::floor}))[1], 0.001953125f);
  EXPECT_EQ(dequantize_mxfp8(quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::round_up}))[1], 0.0f);
}

TEST(Mxfp8, SpecialBlocksAsStated) {
  // Zero block: scale 2^-127 (code 0) under both rules, elements zero with their signs.
  const MxTensor z = quantize_mxfp8(block_of({-0.0f}), 1, 32, {.rule = MxScaleRule::floor});
  EXPECT_EQ(z.scales[0], 0);
  EXPECT_EQ(z.codes[0], 0x80);
  EXPECT_EQ(quantize_mxfp8(block_of({}), 1, 32, {.rule = MxScaleRule::round_up}).scales[0], 0);
  // NaN inside: floor gives the NaN scale and a NaN block; round-up skips it in the amax (fmaxf) and only
  // the NaN element is NaN.
  const std::vector<float> n = block_of({4.0f, kNaN});
  const std::vector<float> fl = dequantize_mxfp8(quantize_mxfp8(n, 1, 32, {.rule = MxScaleRule::floor}));
  EXPECT_TRUE(std::isnan(fl[0]) && std::isnan(fl[1]) && std::isnan(fl[31]));
  const MxTensor up = quantize_mxfp8(n, 1, 32, {.rule = MxScaleRule::round_up});
  EXPECT_EQ(up.scales[0], 127 - 6);  // 4 * fl(1/448) = 0.00892857.. -> 2^-6
  const std::vector<float> upd = dequantize_mxfp8(up);
  EXPECT_EQ(upd[0], 4.0f);
  EXPECT_TRUE(std::isnan(upd[1]));
  EXPECT_EQ(upd[2], 0.0f);
  // inf inside, round-up: amax inf -> code 0xFE, multiplier 0: finite values become 0, inf * 0 NaN.
  const MxTensor inf = quantize_mxfp8(block_of({kInf, 3.0f}), 1, 32, {.rule = MxScaleRule::round_up});
  EXPECT_EQ(inf.scales[0], 0xFE);
  EXPECT_EQ(inf.codes[0], 0x7F);
  EXPECT_EQ(inf.codes[1], 0x00);
  // All f32-subnormal block, round-up: v <= 2^-127 -> code 0, multiplier 1: everything rounds to zero;
  // floor: X = 2^-127 keeps 1e-38 (1e-38 * 2^127 = 1.70..: E4M3 1.75).
  const std::vector<float> s = block_of({1e-38f, 5e-39f});
  EXPECT_EQ(dequantize_mxfp8(quantize_mxfp8(s, 1, 32, {.rule = MxScaleRule::round_up}))[0], 0.0f);
  const std::vector<float> sf = dequantize_mxfp8(quantize_mxfp8(s, 1, 32, {.rule = MxScaleRule::floor}));
  EXPECT_EQ(sf[0], static_cast<float>(std::ldexp(1.75, -127)));
}

TEST(Mxfp8, RowwiseAndColumnwiseCopiesDiffer) {
  // A 32x32 matrix with one outlier: the rowwise copy flattens only the outlier's row, the columnwise copy
  // only its column; the two dequantized copies are not equal (why the backward pass sees other values).
  std::vector<float> x(32 * 32);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(1 + i % 7);
  x[5 * 32 + 9] = 1e6f;  // scale 2^12: the others (0.01 .. 0.07) fall below half of 2^-9 * 2^12
  const std::vector<float> row = dequantize_mxfp8(quantize_mxfp8(x, 32, 32, {.axis = BlockAxis::along_row}));
  const std::vector<float> col = dequantize_mxfp8(quantize_mxfp8(x, 32, 32, {.axis = BlockAxis::along_column}));
  EXPECT_EQ(row[5 * 32 + 0], 0.0f);   // flattened in the outlier's row
  EXPECT_NE(col[5 * 32 + 0], 0.0f);   // kept in its own column block
  EXPECT_NE(row[0 * 32 + 9], 0.0f);
  EXPECT_EQ(col[0 * 32 + 9], 0.0f);   // flattened in the outlier's column
  EXPECT_EQ(check_mx(x, 32, 32, {.axis = BlockAxis::along_column}), 32);
}

TEST(Mxfp8, ShapesThatDoNotDivideAreRefused) {
  const std::vector<float> x(4 * 48, 1.0f);
  try {
    quantize_mxfp8(x, 4, 48);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(),
                 "quantize_mxfp8: 1x32 blocks along rows need cols to be a multiple of 32, but the matrix is 4x48\n"
                 "hint: pad cols to a multiple of 32, or keep this tensor in bf16");
  }
  try {
    quantize_mxfp8(x, 48, 4, {.axis = BlockAxis::along_column});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(),
                 "quantize_mxfp8: 32x1 blocks down columns need rows to be a multiple of 32, but the matrix is 48x4\n"
                 "hint: pad rows to a multiple of 32, or keep this tensor in bf16");
  }
  try {
    quantize_mxfp8(x, 4, 32);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "quantize_mxfp8: 192 values do not make a 4x32 matrix\n"
                           "hint: pass rows * cols values in row-major order");
  }
  EXPECT_THROW(quantize_mxfp8(x, -4, -48), ShapeError);
  // A 48x32 matrix is fine along rows (cols divide) but not down columns.
  const std::vector<float> y(48 * 32, 1.0f);
  EXPECT_NO_THROW(quantize_mxfp8(y, 48, 32));
  EXPECT_THROW(quantize_mxfp8(y, 48, 32, {.axis = BlockAxis::along_column}), ShapeError);
}

TEST(Mxfp8, DequantizeRefusesInconsistentTensors) {
  MxTensor q = quantize_mxfp8(std::vector<float>(64, 1.0f), 1, 64);
  q.scales.pop_back();
  try {
    dequantize_mxfp8(q);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "dequantize_mxfp8: 1 scales for 64 codes of a 1x64 matrix, expected one per 32-value "
                           "block\nhint: pass an MxTensor made by quantize_mxfp8");
  }
  // 16x64 down columns: 32 codes per scale would fit the count, but 16 rows make no 32x1 block.
  MxTensor c = quantize_mxfp8(std::vector<float>(64, 1.0f), 1, 64);
  c.rows = 16;
  c.cols = 4;
  c.options.axis = BlockAxis::along_column;
  EXPECT_THROW(dequantize_mxfp8(c), ShapeError);
  Nvfp4Tensor n = quantize_nvfp4(std::vector<float>(32, 1.0f), 1, 32);
  n.scales.push_back(0);
  EXPECT_THROW(dequantize_nvfp4(n), ShapeError);
}

// --------------------------------------------------------------------------------------------- NVFP4

struct RefNvfp4 {
  float global_encode, global_decode;
  std::vector<int> scale_codes;   // checked through their decoded E4M3 values
  std::vector<double> scale_values;
  std::vector<double> elements;   // E2M1 values
  std::vector<double> scaled;     // x * block_encode, clamped (for stochastic rounding's reference)
};

// TE's reference chain (quantization_nvfp4.py, _quantize_blockwise_reference), each f32 step in double and
// rounded once to float.
RefNvfp4 ref_nvfp4(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, bool square) {
  RefNvfp4 out;
  double gamax = 0.0;
  bool nan = false;
  for (float v : x) {
    if (std::isnan(v)) nan = true;
    gamax = std::max(gamax, std::fabs(static_cast<double>(v)));
  }
  if (nan) gamax = std::numeric_limits<double>::quiet_NaN();
  float ge = static_cast<float>(2688.0 / gamax);
  if (ge > FLT_MAX) ge = FLT_MAX;
  if (ge == 0.0f) ge = 1.0f;
  const float gd = static_cast<float>(1.0 / static_cast<double>(ge));
  const float sixth = static_cast<float>(1.0 / 6.0);
  const float mult = static_cast<float>(static_cast<double>(ge) * sixth);
  out.global_encode = ge;
  out.global_decode = gd;
  const std::int64_t th = square ? 16 : 1;
  out.elements.assign(x.size(), 0.0);
  out.scaled.assign(x.size(), 0.0);
  for (std::int64_t r0 = 0; r0 < rows; r0 += th) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      double bamax = 0.0;
      bool bnan = false;
      for (std::int64_t r = r0; r < r0 + th; ++r) {
        for (std::int64_t c = c0; c < c0 + 16; ++c) {
          const float v = x[static_cast<std::size_t>(r * cols + c)];
          if (std::isnan(v)) bnan = true;
          bamax = std::max(bamax, std::fabs(static_cast<double>(v)));
        }
      }
      double ds = bnan || std::isnan(mult) ? std::numeric_limits<double>::quiet_NaN()
                                           : static_cast<double>(static_cast<float>(bamax * mult));
      if (ds > FLT_MAX) ds = FLT_MAX;
      if (ds > 448.0) ds = 448.0;
      const double ds_q = ref_round(ds, Fp8Format::e4m3);  // after the clamp: plain RNE
      out.scale_values.push_back(ds_q);
      double enc = static_cast<double>(
          static_cast<float>(1.0 / static_cast<double>(static_cast<float>(ds_q * static_cast<double>(gd)))));
      if (enc > FLT_MAX) enc = FLT_MAX;
      for (std::int64_t r = r0; r < r0 + th; ++r) {
        for (std::int64_t c = c0; c < c0 + 16; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * cols + c);
          double v = static_cast<double>(static_cast<float>(static_cast<double>(x[i]) * enc));
          if (!std::isnan(v)) v = std::min(std::max(v, -6.0), 6.0);
          out.scaled[i] = v;
          out.elements[i] = ref_e2m1(v);
        }
      }
    }
  }
  return out;
}

void check_nvfp4(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, Nvfp4Tile tile) {
  Nvfp4Options options;
  options.tile = tile;
  const Nvfp4Tensor q = quantize_nvfp4(x, rows, cols, options);
  const RefNvfp4 ref = ref_nvfp4(x, rows, cols, tile == Nvfp4Tile::square_16x16);
  EXPECT_BITS_EQ(q.global_encode_scale, ref.global_encode);
  EXPECT_BITS_EQ(q.global_decode_scale, ref.global_decode);
  ASSERT_EQ(q.scales.size(), ref.scale_values.size());
  for (std::size_t b = 0; b < q.scales.size(); ++b) {
    EXPECT_BITS_EQ(e4m3_to_float(q.scales[b]), static_cast<float>(ref.scale_values[b])) << "block " << b;
  }
  const std::vector<float> back = dequantize_nvfp4(q);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::fabs(e2m1_to_float(q.codes[i])), std::fabs(static_cast<float>(ref.elements[i]))) << "element " << i;
    if (ref.elements[i] != 0.0) {
      EXPECT_EQ(std::signbit(e2m1_to_float(q.codes[i])), std::signbit(ref.elements[i]));
    }
    const std::int64_t r = static_cast<std::int64_t>(i) / cols, c = static_cast<std::int64_t>(i) % cols;
    const std::size_t b = tile == Nvfp4Tile::square_16x16 ? static_cast<std::size_t>((r / 16) * (cols / 16) + c / 16)
                                                          : static_cast<std::size_t>(r * (cols / 16) + c / 16);
    const float block_decode = static_cast<float>(ref.scale_values[b] * static_cast<double>(ref.global_decode));
    const float want = static_cast<float>(ref.elements[i] * static_cast<double>(block_decode));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(back[i]));
    } else {
      EXPECT_EQ(back[i], want) << "element " << i;
    }
  }
}

TEST(Nvfp4, RandomTensorsMatchTheReferenceBitForBit) {
  check_nvfp4(random_matrix(32, 64, 7), 32, 64, Nvfp4Tile::row_1x16);
  check_nvfp4(random_matrix(32, 64, 7), 32, 64, Nvfp4Tile::square_16x16);
  // Gaussian values of one magnitude: most blocks get normal E4M3 scales.
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(48 * 80);
  for (float& v : w) v = normal(gen);
  check_nvfp4(w, 48, 80, Nvfp4Tile::row_1x16);
  check_nvfp4(w, 48, 80, Nvfp4Tile::square_16x16);
}

TEST(Nvfp4, AdversarialTensorsMatchTheReference) {
  std::vector<float> zeros(16 * 32, 0.0f);
  check_nvfp4(zeros, 16, 32, Nvfp4Tile::row_1x16);
  check_nvfp4(zeros, 16, 32, Nvfp4Tile::square_16x16);
  std::vector<float> outlier(16 * 32, 1e-3f);
  outlier[40] = 1e5f;  // the other blocks' scales fall to E4M3 subnormals
  check_nvfp4(outlier, 16, 32, Nvfp4Tile::row_1x16);
  check_nvfp4(outlier, 16, 32, Nvfp4Tile::square_16x16);
  std::vector<float> with_nan(16 * 32, 0.5f);
  with_nan[3] = kNaN;
  check_nvfp4(with_nan, 16, 32, Nvfp4Tile::row_1x16);
  std::vector<float> with_inf(16 * 32, 0.5f);
  with_inf[17] = -kInf;
  check_nvfp4(with_inf, 16, 32, Nvfp4Tile::row_1x16);
  check_nvfp4(with_inf, 16, 32, Nvfp4Tile::square_16x16);
  std::vector<float> tiny(16 * 32, std::numeric_limits<float>::denorm_min());
  tiny[0] = 1e-38f;
  check_nvfp4(tiny, 16, 32, Nvfp4Tile::row_1x16);
  std::vector<float> huge(16 * 32, FLT_MAX);
  huge[1] = -3.0e38f;
  check_nvfp4(huge, 16, 32, Nvfp4Tile::row_1x16);
}

TEST(Nvfp4, WorkedBlockWithTies) {
  // Worked in docs/fp8.md. Global amax 2688 = 448 * 6: global encode 1, decode 1, multiplier fl(1/6).
  // Block 0 (amax 6): decode scale fl(6 * fl(1/6)) = 1 (E4M3 0x38), encode 1, so the elements are the values
  // themselves rounded to E2M1 with ties to even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  // 3.5 -> 4, 5 -> 4, 6 -> 6, -2.9 -> -3. Block 1 (amax 2688): decode scale fl(2688 * fl(1/6)) = 448 (0x7E),
  // encode fl(1/448): 2688 -> 6, 100 -> 0.2232.. -> 0.
  std::vector<float> x = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, -2.9f, 0, 0, 0, 0, 0, 0, 0,
                          2688.0f, 100.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const Nvfp4Tensor q = quantize_nvfp4(x, 1, 32);
  EXPECT_EQ(q.global_amax, 2688.0f);
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_EQ(q.global_decode_scale, 1.0f);
  EXPECT_EQ(q.scales[0], 0x38);
  EXPECT_EQ(q.scales[1], 0x7E);
  const std::uint8_t want0[9] = {0, 2, 2, 4, 4, 6, 6, 7, 13};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(q.codes[static_cast<std::size_t>(i)], want0[i]) << i;
  EXPECT_EQ(q.codes[16], 7);
  EXPECT_EQ(q.codes[17], 0);
  const std::vector<float> back = dequantize_nvfp4(q);
  EXPECT_EQ(back[16], 2688.0f);  // 6 * 448 * 1
  EXPECT_EQ(back[8], -3.0f);
}

TEST(Nvfp4, BlockScaleFollowsTheKernelOrderOfOperations) {
  // TE's reference folds 1/6 into the global scale first (multiplier = fl(global_encode * fl(1/6))) and
  // multiplies the block amax by it. With global encode 1 and block amax a = 1.78125 - 2^-23, a * fl(1/6)
  // rounds to 0.296875 exactly, the E4M3 midpoint between 0.28125 (0x29) and 0.3125 (0x2A): the even 0x2A.
  // Dividing by 6 first would give 0.29687497.. and 0x29.
  std::vector<float> x(32, 0.0f);
  x[0] = std::nextafter(1.78125f, 0.0f);
  x[16] = 2688.0f;
  const Nvfp4Tensor q = quantize_nvfp4(x, 1, 32);
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_EQ(q.scales[0], 0x2A);
  EXPECT_EQ(e4m3_to_float(q.scales[0]), 0.3125f);
  check_nvfp4(x, 1, 32, Nvfp4Tile::row_1x16);
}

TEST(Nvfp4, GlobalScaleEdgeCases) {
  // amax 0: 2688 / 0 = inf, capped to FLT_MAX; amax inf: 2688 / inf = 0, which becomes 1.
  EXPECT_EQ(nvfp4_global_scales(0.0f).encode, FLT_MAX);
  EXPECT_EQ(nvfp4_global_scales(kInf).encode, 1.0f);
  EXPECT_EQ(nvfp4_global_scales(kInf).decode, 1.0f);
  EXPECT_TRUE(std::isnan(nvfp4_global_scales(kNaN).encode));
  EXPECT_EQ(nvfp4_global_scales(2688.0f).encode, 1.0f);
  EXPECT_EQ(nvfp4_global_scales(1.0f).encode, 2688.0f);
  // A block scale past 448 is clamped; a NaN block amax gives the E4M3 NaN.
  EXPECT_EQ(nvfp4_block_scale(1e6f, 1.0f), 0x7E);
  EXPECT_EQ(nvfp4_block_scale(kNaN, 1.0f), 0x7F);
  EXPECT_EQ(nvfp4_block_scale(0.0f, 2688.0f), 0x00);
}

TEST(Nvfp4, ShapesThatDoNotDivideAreRefused) {
  const std::vector<float> x(8 * 24, 1.0f);
  try {
    quantize_nvfp4(x, 8, 24);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(),
                 "quantize_nvfp4: 1x16 blocks along rows need cols to be a multiple of 16, but the matrix is 8x24\n"
                 "hint: pad cols to a multiple of 16, or keep this tensor in bf16");
  }
  const std::vector<float> y(8 * 32, 1.0f);
  EXPECT_NO_THROW(quantize_nvfp4(y, 8, 32));
  try {
    Nvfp4Options square;
    square.tile = Nvfp4Tile::square_16x16;
    quantize_nvfp4(y, 8, 32, square);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "quantize_nvfp4: 16x16 tiles need rows to be a multiple of 16, but the matrix is 8x32\n"
                           "hint: pad rows to a multiple of 16, or keep this tensor in bf16");
  }
}

// ------------------------------------------------------------------------------------ Hadamard transform

// The Sylvester construction, built by doubling (independent of the code's bit-parity formula).
std::vector<std::vector<double>> sylvester(int n) {
  std::vector<std::vector<double>> h = {{1.0}};
  while (static_cast<int>(h.size()) < n) {
    const std::size_t m = h.size();
    std::vector<std::vector<double>> g(2 * m, std::vector<double>(2 * m));
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < m; ++j) {
        g[i][j] = h[i][j];
        g[i][j + m] = h[i][j];
        g[i + m][j] = h[i][j];
        g[i + m][j + m] = -h[i][j];
      }
    }
    h = g;
  }
  return h;
}

TEST(Hadamard, MatrixIsTheSignedSylvesterOneAndOrthogonal) {
  // TransformerEngine's sign vector (get_wgrad_sign_vector), written out again here.
  const double signs[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  const auto h = sylvester(16);
  double t[16][16];
  for (int k = 0; k < 16; ++k) {
    std::vector<float> e(16, 0.0f);
    e[static_cast<std::size_t>(k)] = 1.0f;
    const std::vector<float> row = random_hadamard_transform(e);  // e_k * T = row k of T
    for (int j = 0; j < 16; ++j) {
      t[k][j] = row[static_cast<std::size_t>(j)];
      EXPECT_EQ(t[k][j], 0.25 * signs[k] * h[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)]) << k << "," << j;
    }
  }
  // T T^T = I: the entries are +-1/4, so every product and sum is exact.
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double dot = 0.0;
      for (int k = 0; k < 16; ++k) dot += t[i][k] * t[j][k];
      EXPECT_EQ(dot, i == j ? 1.0 : 0.0) << i << "," << j;
    }
  }
}

TEST(Hadamard, InverseRestoresAndNormIsKept) {
  std::mt19937_64 gen(16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(16 * 256);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(normal(gen), static_cast<int>(i / 16 % 40) - 20);
  const std::vector<float> y = random_hadamard_transform(x);
  const std::vector<float> back = inverse_random_hadamard_transform(y);
  for (std::size_t g = 0; g < x.size(); g += 16) {
    double nx = 0.0, ny = 0.0;
    for (std::size_t i = g; i < g + 16; ++i) {
      nx += static_cast<double>(x[i]) * x[i];
      ny += static_cast<double>(y[i]) * y[i];
    }
    nx = std::sqrt(nx);
    ny = std::sqrt(ny);
    // Each output is rounded once to float: the norms agree to a few float ulps of the group norm.
    EXPECT_NEAR(ny, nx, 4 * 0x1p-24 * nx) << "group " << g / 16;
    for (std::size_t i = g; i < g + 16; ++i) {
      // two roundings of 2^-24 relative to values of at most the group norm, then one more
      EXPECT_NEAR(back[i], x[i], 8 * 0x1p-24 * nx) << "element " << i;
    }
  }
  // An outlier is spread: 100 in an otherwise zero group becomes 16 values of magnitude 25.
  std::vector<float> o(16, 0.0f);
  o[3] = 100.0f;
  for (float v : random_hadamard_transform(o)) EXPECT_EQ(std::fabs(v), 25.0f);
  EXPECT_EQ(inverse_random_hadamard_transform(random_hadamard_transform(o))[3], 100.0f);
}

TEST(Hadamard, LengthNotAMultipleOf16IsRefused) {
  const std::vector<float> x(24, 1.0f);
  try {
    random_hadamard_transform(x);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "random_hadamard_transform: 24 values are not a whole number of 16-value groups\n"
                           "hint: the transform runs over the dimension it is applied to in groups of 16; pad that "
                           "dimension to a multiple of 16");
  }
  EXPECT_THROW(inverse_random_hadamard_transform(x), ShapeError);
}

// ------------------------------------------------------------------------------------ stochastic rounding

TEST(StochasticRounding, UnbiasedInExpectation) {
  // x between neighbours lo and hi rounds up with probability (x - lo) / (hi - lo): the mean over n draws
  // is x within 5 standard deviations (step * sqrt(p (1 - p) / n)).
  const int n = 200000;
  for (float x : {0.3f, -1.2f, 2.7f, 4.9f, 5.999f, 0.01f, -0.74f, 10.0f}) {
    const double sat = std::min(std::fabs(static_cast<double>(x)), 6.0);
    int lo = 0;
    while (lo < 7 && kGrid[lo + 1] <= sat) ++lo;
    const double step = lo < 7 ? kGrid[lo + 1] - kGrid[lo] : 1.0;
    const double p = lo < 7 ? (sat - kGrid[lo]) / step : 0.0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
      sum += e2m1_to_float(float_to_e2m1_stochastic(x, uniform_at<float>(2026, 0, static_cast<std::uint64_t>(i))));
    }
    const double mean = sum / n;
    const double tol = 5.0 * step * std::sqrt(p * (1.0 - p) / n) + 1e-12;
    EXPECT_NEAR(mean, std::copysign(sat, static_cast<double>(x)), tol) << "x=" << x;
  }
  // Grid values are kept whatever the draw.
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_float(static_cast<std::uint8_t>(c));
    for (float u : {0.0f, 0.5f, 0.99999994f}) EXPECT_EQ(float_to_e2m1_stochastic(v, u), c);
  }
  // The draw's boundary: 0.25 is halfway between 0 and 0.5 (p = 1/2).
  EXPECT_EQ(float_to_e2m1_stochastic(0.25f, 0.49999997f), 1);
  EXPECT_EQ(float_to_e2m1_stochastic(0.25f, 0.5f), 0);
  EXPECT_EQ(float_to_e2m1_stochastic(-kInf, 0.3f), 15);
  EXPECT_EQ(float_to_e2m1_stochastic(kNaN, 0.3f), 0);
}

TEST(StochasticRounding, Nvfp4IsReproducibleForASeedAndUsesItsStream) {
  const std::vector<float> x = random_matrix(16, 64, 3);
  const Nvfp4Options sr{.stochastic_rounding = true, .stream = {.seed = 42, .offset = 7}};
  const Nvfp4Tensor a = quantize_nvfp4(x, 16, 64, sr);
  const Nvfp4Tensor b = quantize_nvfp4(x, 16, 64, sr);
  EXPECT_EQ(a.codes, b.codes);
  Nvfp4Options other = sr;
  other.stream.seed = 43;
  EXPECT_NE(quantize_nvfp4(x, 16, 64, other).codes, a.codes);
  // Scales do not depend on the rounding; element i uses draw i of the (seed, offset) stream.
  const RefNvfp4 ref = ref_nvfp4(x, 16, 64, false);
  const Nvfp4Tensor rne = quantize_nvfp4(x, 16, 64);
  EXPECT_EQ(a.scales, rne.scales);
  int differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = ref.scaled[i];
    const double u = static_cast<double>(uniform_at<float>(42, 7, i));
    const double av = std::fabs(v);
    int lo = 0;
    while (lo < 7 && kGrid[lo + 1] <= av) ++lo;
    int code = lo;
    if (kGrid[lo] != av && u < (av - kGrid[lo]) / (kGrid[lo + 1] - kGrid[lo])) code = lo + 1;
    EXPECT_EQ(std::fabs(e2m1_to_float(a.codes[i])), kGrid[code]) << "element " << i;
    if (a.codes[i] != rne.codes[i]) ++differ;
  }
  EXPECT_GT(differ, 0);
}

TEST(StochasticRounding, Nvfp4DequantizedMeanApproachesTheInput) {
  // Averaged over 2000 offsets, the dequantized tensor approaches x, while round-to-nearest keeps its bias.
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[static_cast<std::size_t>(i)] = 0.1f + 0.37f * static_cast<float>(i);
  const int draws = 2000;
  std::vector<double> mean(16, 0.0);
  for (int d = 0; d < draws; ++d) {
    const Nvfp4Tensor q =
        quantize_nvfp4(x, 1, 16, {.stochastic_rounding = true, .stream = {.seed = 9, .offset = static_cast<std::uint64_t>(d) * 4}});
    const std::vector<float> back = dequantize_nvfp4(q);
    for (int i = 0; i < 16; ++i) mean[static_cast<std::size_t>(i)] += back[static_cast<std::size_t>(i)] / draws;
  }
  const std::vector<float> rne = dequantize_nvfp4(quantize_nvfp4(x, 1, 16));
  double err_sr = 0.0, err_rne = 0.0;
  for (int i = 0; i < 16; ++i) {
    err_sr += std::fabs(mean[static_cast<std::size_t>(i)] - x[static_cast<std::size_t>(i)]);
    err_rne += std::fabs(static_cast<double>(rne[static_cast<std::size_t>(i)]) - x[static_cast<std::size_t>(i)]);
  }
  // The block scale is 5.65 / 6 (up to E4M3 rounding): one E2M1 step is at most 2 * 0.95; 2000 draws leave
  // a standard deviation of at most 0.95 * 0.5 / sqrt(2000) = 0.011 per element.
  EXPECT_LT(err_sr / 16, 0.03);
  EXPECT_GT(err_rne / 16, 2 * err_sr / 16);
}

}  // namespace
}  // namespace ampscope
