// tests/core/block_stats_test.cpp: the blockwise statistics (core/block_stats.h) against references written here.
//
// The reference quantizes each block itself from the specifications' formulas in double (OCP MX v1.0's floor
// rule, TransformerEngine's round-up rule and NVFP4 reference chain; each f32 step of TE's chain computed in
// double and rounded once to float, which for float operands is the correctly rounded f32 result), then counts
// every field from its definition in block_stats.h. It calls nothing of block_scaled.h or block_stats.cpp except
// to obtain the tensor under test (and core/philox.h's uniform_at for the stochastic-rounding draws, which
// tests/core/philox_test.cpp checks). Small cases are also worked by hand, the arithmetic in comments.
#include "core/block_stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/block_scaled.h"
#include "core/philox.h"

namespace ampscope {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kDNaN = std::numeric_limits<double>::quiet_NaN();

// --------------------------------------------------------------------------------------- element grids

// y on the FP8 grid (mbits mantissa bits, smallest normal exponent emin), ties to even, saturated to +-maxv;
// NaN stays NaN.
double ref_fp8_round(double y, int mbits, int emin, double maxv) {
  if (std::isnan(y)) return y;
  const double a = std::fabs(y);
  double r;
  if (std::isinf(a)) {
    r = maxv;
  } else if (a == 0.0) {
    r = 0.0;
  } else {
    const int e = std::max(static_cast<int>(std::floor(std::log2(a))), emin);
    const double quantum = std::ldexp(1.0, e - mbits);
    r = std::min(std::nearbyint(a / quantum) * quantum, maxv);
  }
  return std::copysign(r, y);
}
double ref_fp8(double y, Fp8Format f) {
  return f == Fp8Format::e4m3 ? ref_fp8_round(y, 3, -6, 448.0) : ref_fp8_round(y, 2, -14, 57344.0);
}
double elem_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0 : 57344.0; }

const double kGrid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
// E2M1 after saturating to 6: the nearest grid point, a tie to the even index; NaN -> 0.
double ref_e2m1(double y) {
  if (std::isnan(y)) return 0.0;
  const double a = std::min(std::fabs(y), 6.0);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(a - kGrid[i]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return std::copysign(kGrid[best], y);
}
// Stochastic: between the grid neighbours lo < |y| < hi, hi when u < (|y| - lo) / (hi - lo).
double ref_e2m1_sr(double y, double u) {
  if (std::isnan(y)) return 0.0;
  const double a = std::min(std::fabs(y), 6.0);
  int lo = 0;
  while (lo < 7 && kGrid[lo + 1] <= a) ++lo;
  if (kGrid[lo] == a) return std::copysign(a, y);
  return std::copysign(u < (a - kGrid[lo]) / (kGrid[lo + 1] - kGrid[lo]) ? kGrid[lo + 1] : kGrid[lo], y);
}

float f32(double v) { return static_cast<float>(v); }
// min(v, cap) keeping a NaN (torch.clamp / torch.min).
double cap(double v, double c) { return v > c ? c : v; }

// ---------------------------------------------------------------------------------------- reference

// What the reference quantizer says of one tensor: per element its block, dequantized value and whether its
// scaled magnitude exceeded the element max; per block log2 of its decode scale (NaN for a NaN scale).
struct RefQuant {
  std::vector<std::int64_t> block;
  std::vector<double> deq;
  std::vector<bool> over;
  std::vector<double> scale_log2;
};

// The element indices of each block, in scale order.
std::vector<std::vector<std::size_t>> mx_blocks(std::int64_t rows, std::int64_t cols, BlockAxis axis) {
  std::vector<std::vector<std::size_t>> out;
  if (axis == BlockAxis::along_row) {
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c0 = 0; c0 < cols; c0 += 32) {
        out.emplace_back();
        for (int k = 0; k < 32; ++k) out.back().push_back(static_cast<std::size_t>(r * cols + c0 + k));
      }
  } else {
    for (std::int64_t r0 = 0; r0 < rows; r0 += 32)
      for (std::int64_t c = 0; c < cols; ++c) {
        out.emplace_back();
        for (int k = 0; k < 32; ++k) out.back().push_back(static_cast<std::size_t>((r0 + k) * cols + c));
      }
  }
  return out;
}

RefQuant ref_mx(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const MxOptions& o) {
  RefQuant q;
  q.block.resize(x.size());
  q.deq.resize(x.size());
  q.over.assign(x.size(), false);
  const auto blocks = mx_blocks(rows, cols, o.axis);
  const double mx = elem_max(o.element);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    for (std::size_t i : blocks[b]) q.block[i] = static_cast<std::int64_t>(b);
    if (o.rule == MxScaleRule::floor) {
      // OCP: X = 2^(floor(log2 amax) - emax_elem), >= 2^-127; a NaN or inf in the block: NaN scale.
      double amax = 0;
      bool special = false;
      for (std::size_t i : blocks[b]) {
        special = special || !std::isfinite(x[i]);
        amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      }
      if (special) {
        q.scale_log2.push_back(kDNaN);
        for (std::size_t i : blocks[b]) q.deq[i] = kDNaN;
        continue;
      }
      const int emax = o.element == Fp8Format::e4m3 ? 8 : 15;
      const int s = std::max(amax == 0 ? -127 : static_cast<int>(std::floor(std::log2(amax))) - emax, -127);
      q.scale_log2.push_back(s);
      for (std::size_t i : blocks[b]) {
        const double y = std::ldexp(static_cast<double>(x[i]), -s);
        q.over[i] = std::fabs(y) > mx;
        q.deq[i] = ref_fp8(y, o.element) * std::ldexp(1.0, s);
      }
    } else {
      // TE: v = fl(amax * fl(1/max)) over the non-NaN values, code = ceil(log2 v) + 127 clamped to [0, 254]
      // (v = 0 -> 0, v = inf -> 254); multiplier 2^(127 - code), 1 for code 0, 0 for code 254; decode 2^(code-127).
      double amax = 0;
      for (std::size_t i : blocks[b])
        if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      const double v = f32(amax * f32(1.0 / mx));
      int code = std::isinf(v) ? 254 : v == 0 ? 0 : std::clamp(static_cast<int>(std::ceil(std::log2(v))) + 127, 0, 254);
      q.scale_log2.push_back(code - 127);
      const double mult = code == 0 ? 1.0 : code == 254 ? 0.0 : std::ldexp(1.0, 127 - code);
      for (std::size_t i : blocks[b]) {
        const double y = f32(static_cast<double>(x[i]) * mult);
        q.over[i] = std::isfinite(x[i]) && std::fabs(y) > mx;
        q.deq[i] = ref_fp8(y, o.element) * std::ldexp(1.0, code - 127);
      }
    }
  }
  return q;
}

RefQuant ref_nvfp4(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const Nvfp4Options& o) {
  RefQuant q;
  q.block.resize(x.size());
  q.deq.resize(x.size());
  q.over.assign(x.size(), false);
  // TE's reference: global_amax (NaN propagating), global_encode = fl(2688 / amax) capped at FLT_MAX, 0 -> 1;
  // decode = fl(1 / encode).
  double gamax = 0;
  for (float v : x) gamax = std::isnan(gamax) || std::isnan(v) ? kDNaN : std::max(gamax, std::fabs(double{v}));
  double genc = cap(f32(2688.0 / gamax), FLT_MAX);
  if (genc == 0) genc = 1;
  const double gdec = f32(1.0 / genc);
  const double mult = f32(genc * f32(1.0 / 6.0));
  const bool square = o.tile == Nvfp4Tile::square_16x16;
  const std::int64_t th = square ? 16 : 1;
  for (std::int64_t r0 = 0; r0 < rows; r0 += th) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
      const auto b = static_cast<std::int64_t>(q.scale_log2.size());
      double bamax = 0;
      for (std::int64_t r = r0; r < r0 + th; ++r)
        for (std::int64_t c = c0; c < c0 + 16; ++c) {
          const double v = x[static_cast<std::size_t>(r * cols + c)];
          bamax = std::isnan(bamax) || std::isnan(v) ? kDNaN : std::max(bamax, std::fabs(v));
        }
      // block decode = e4m3(min(fl(bamax * mult), 448)), RNE (a NaN stays NaN); its value times the global decode.
      const double sval = ref_fp8(cap(cap(f32(bamax * mult), FLT_MAX), 448.0), Fp8Format::e4m3);
      const double dec = f32(sval * gdec);
      q.scale_log2.push_back(std::isnan(dec) ? kDNaN : std::log2(dec));
      const double enc = cap(f32(1.0 / dec), FLT_MAX);
      for (std::int64_t r = r0; r < r0 + th; ++r)
        for (std::int64_t c = c0; c < c0 + 16; ++c) {
          const auto i = static_cast<std::size_t>(r * cols + c);
          q.block[i] = b;
          const double y = f32(static_cast<double>(x[i]) * enc);
          q.over[i] = std::isfinite(x[i]) && std::fabs(y) > 6.0;
          const double e = o.stochastic_rounding
                               ? ref_e2m1_sr(y, uniform_at<float>(o.stream.seed, o.stream.offset, i))
                               : ref_e2m1(y);
          q.deq[i] = f32(e * dec);
        }
    }
  }
  return q;
}

// Every field of block_stats.h from its definition, over the reference's quantization.
BlockStats ref_stats(const std::vector<float>& x, const RefQuant& q) {
  BlockStats s;
  const std::size_t nb = q.scale_log2.size();
  s.numel = static_cast<std::int64_t>(x.size());
  s.blocks = static_cast<std::int64_t>(nb);
  std::vector<std::int64_t> under(nb, 0);
  std::vector<int> clipped(nb, 0), nan(nb, 0);
  std::vector<std::vector<double>> mags(nb);
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto b = static_cast<std::size_t>(q.block[i]);
    if (std::isnan(q.deq[i]) || !std::isfinite(x[i])) nan[b] = 1;
    if (!std::isfinite(x[i])) {
      ++s.nonfinite;
      continue;
    }
    if (x[i] != 0) {
      ++s.nonzero;
      mags[b].push_back(std::fabs(double{x[i]}));
      if (q.deq[i] == 0) ++s.underflow, ++under[b];
    }
    if (q.over[i] && q.deq[i] != 0) ++s.saturated, clipped[b] = 1;
    if (std::isfinite(q.deq[i])) num += (q.deq[i] - x[i]) * (q.deq[i] - x[i]), den += double{x[i]} * x[i];
  }
  for (std::size_t b = 0; b < nb; ++b) {
    s.blocks_clipped += clipped[b];
    s.blocks_nan += nan[b];
    if (!mags[b].empty()) {
      const double range = std::log2(*std::max_element(mags[b].begin(), mags[b].end())) -
                           std::log2(*std::min_element(mags[b].begin(), mags[b].end()));
      if (range > s.max_block_range) s.max_block_range = range, s.max_range_block = static_cast<std::int64_t>(b);
    }
    if (under[b] > s.worst_block_underflow) s.worst_block_underflow = under[b], s.worst_block = static_cast<std::int64_t>(b);
  }
  std::vector<double> sc;
  for (double v : q.scale_log2)
    if (!std::isnan(v)) sc.push_back(v);
  std::sort(sc.begin(), sc.end());
  if (!sc.empty()) s.scale_log2_min = sc.front(), s.scale_log2_max = sc.back(), s.scale_log2_median = sc[(sc.size() - 1) / 2];
  s.rel_rms_error = den > 0 ? std::sqrt(num / den) : 0.0;
  return s;
}

void expect_same_double(double got, double want, const char* what, const std::string& where) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << " " << where;
  } else if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what << " " << where;
  } else {
    EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::fabs(want))) << what << " " << where;
  }
}

void expect_stats(const BlockStats& got, const BlockStats& want, const std::string& where) {
  EXPECT_EQ(got.numel, want.numel) << where;
  EXPECT_EQ(got.nonzero, want.nonzero) << where;
  EXPECT_EQ(got.nonfinite, want.nonfinite) << where;
  EXPECT_EQ(got.underflow, want.underflow) << where;
  EXPECT_EQ(got.saturated, want.saturated) << where;
  EXPECT_EQ(got.blocks, want.blocks) << where;
  EXPECT_EQ(got.blocks_clipped, want.blocks_clipped) << where;
  EXPECT_EQ(got.blocks_nan, want.blocks_nan) << where;
  expect_same_double(got.max_block_range, want.max_block_range, "max_block_range", where);
  EXPECT_EQ(got.max_range_block, want.max_range_block) << where;
  EXPECT_EQ(got.worst_block, want.worst_block) << where;
  EXPECT_EQ(got.worst_block_underflow, want.worst_block_underflow) << where;
  expect_same_double(got.scale_log2_min, want.scale_log2_min, "scale_log2_min", where);
  expect_same_double(got.scale_log2_median, want.scale_log2_median, "scale_log2_median", where);
  expect_same_double(got.scale_log2_max, want.scale_log2_max, "scale_log2_max", where);
  expect_same_double(got.rel_rms_error, want.rel_rms_error, "rel_rms_error", where);
}

BlockStats check_mx(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const MxOptions& o,
                    const std::string& where) {
  const BlockStats got = mxfp8_block_stats(x, quantize_mxfp8(x, rows, cols, o));
  expect_stats(got, ref_stats(x, ref_mx(x, rows, cols, o)), where);
  return got;
}

BlockStats check_nv(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, const Nvfp4Options& o,
                    const std::string& where) {
  const BlockStats got = nvfp4_block_stats(x, quantize_nvfp4(x, rows, cols, o));
  expect_stats(got, ref_stats(x, ref_nvfp4(x, rows, cols, o)), where);
  return got;
}

// Values spread over many binades, with zeros and sign changes, and a per-row and per-column magnitude so that
// blocks differ (and row- and column-wise blocks differ).
std::vector<float> random_matrix(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<double> row_scale(static_cast<std::size_t>(rows)), col_scale(static_cast<std::size_t>(cols));
  for (auto& s : row_scale) s = std::ldexp(1.0, static_cast<int>(uni(gen) * 40) - 20);
  for (auto& s : col_scale) s = std::ldexp(1.0, static_cast<int>(uni(gen) * 12) - 6);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      double v = normal(gen) * row_scale[static_cast<std::size_t>(r)] * col_scale[static_cast<std::size_t>(c)];
      const double u = uni(gen);
      if (u < 0.05) v = 0;
      else if (u < 0.10) v *= std::ldexp(1.0, -16);  // stragglers that underflow
      else if (u < 0.12) v *= 300;                     // outliers
      x[static_cast<std::size_t>(r * cols + c)] = static_cast<float>(v);
    }
  return x;
}

const Nvfp4Options kTiles{.tile = Nvfp4Tile::square_16x16, .stochastic_rounding = false, .stream = {}};
const MxScaleRule kRules[] = {MxScaleRule::floor, MxScaleRule::round_up};
const BlockAxis kAxes[] = {BlockAxis::along_row, BlockAxis::along_column};

std::string name(const MxOptions& o) {
  return std::string(o.rule == MxScaleRule::floor ? "floor" : "round_up") + "/" +
         (o.axis == BlockAxis::along_row ? "rowwise" : "columnwise") + "/" + (o.element == Fp8Format::e4m3 ? "e4m3" : "e5m2");
}

// ------------------------------------------------------------------------------------------- hand-worked

TEST(BlockStatsByHand, MxOneBlockFloorClipsRoundUpDoesNot) {
  // One 1x32 block: 500, 1, 2^-20 and 29 zeros.
  std::vector<float> x(32, 0.0f);
  x[0] = 500.0f;
  x[1] = 1.0f;
  x[2] = std::ldexp(1.0f, -20);
  // Floor rule: floor(log2 500) = 8, shared exponent 8 - 8 = 0, X = 1 (code 127). 500 / 1 > 448: clipped to 448.
  // 1 stays 1. 2^-20 is below half of E4M3's smallest subnormal 2^-9: 0 (underflow).
  // error^2 = (448 - 500)^2 + (2^-20)^2 = 2704 + 2^-40; sum x^2 = 250000 + 1 + 2^-40.
  // Range: log2 500 - log2 2^-20 = 8.965784284662087 + 20.
  BlockStats f = mxfp8_block_stats(x, quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::floor}));
  EXPECT_EQ(f.numel, 32);
  EXPECT_EQ(f.nonzero, 3);
  EXPECT_EQ(f.nonfinite, 0);
  EXPECT_EQ(f.underflow, 1);
  EXPECT_EQ(f.saturated, 1);
  EXPECT_EQ(f.blocks, 1);
  EXPECT_EQ(f.blocks_clipped, 1);
  EXPECT_EQ(f.blocks_nan, 0);
  EXPECT_NEAR(f.max_block_range, 28.965784284662087, 1e-12);
  EXPECT_EQ(f.max_range_block, 0);
  EXPECT_EQ(f.worst_block, 0);
  EXPECT_EQ(f.worst_block_underflow, 1);
  EXPECT_EQ(f.scale_log2_min, 0.0);
  EXPECT_EQ(f.scale_log2_median, 0.0);
  EXPECT_EQ(f.scale_log2_max, 0.0);
  EXPECT_NEAR(f.rel_rms_error, std::sqrt((2704.0 + std::ldexp(1.0, -40)) / (250001.0 + std::ldexp(1.0, -40))), 1e-15);
  // Round-up rule: 500 * fl(1/448) = 1.116..., rounded up to 2 (code 128). 500 / 2 = 250, which E4M3 (binade
  // [128, 256), step 16) rounds to 256: 512 back. 1 / 2 = 0.5 exactly: 1 back. 2^-21: 0. Nothing clips.
  // error^2 = 12^2 + 2^-40.
  BlockStats u = mxfp8_block_stats(x, quantize_mxfp8(x, 1, 32, {.rule = MxScaleRule::round_up}));
  EXPECT_EQ(u.underflow, 1);
  EXPECT_EQ(u.saturated, 0);
  EXPECT_EQ(u.blocks_clipped, 0);
  EXPECT_EQ(u.scale_log2_median, 1.0);
  EXPECT_NEAR(u.rel_rms_error, std::sqrt((144.0 + std::ldexp(1.0, -40)) / (250001.0 + std::ldexp(1.0, -40))), 1e-15);
}

TEST(BlockStatsByHand, MxColumnwiseBlocksAndOrigins) {
  // 64x2, blocks down each column: block b sits at scale (b / 2, b % 2), first element (32 * (b / 2), b % 2).
  // Column 1's lower block (block 3) holds 1 and 2^-12: round-up scale 1 * fl(1/448) -> 2^-8 (code 119);
  // 2^-12 / 2^-8 = 2^-4, an E4M3 normal: kept. Column 0's upper block (block 0) holds 1000 and 0.001:
  // 1000 * fl(1/448) = 2.23 -> 4; 0.001 / 4 = 0.00025 < 2^-10: underflows. Range of block 0:
  // log2(1000 / 0.001) = log2 10^6 = 19.93156856932417 (0.001f is 0.0010000000474974513).
  std::vector<float> x(128, 0.0f);
  x[0 * 2 + 0] = 1000.0f;
  x[5 * 2 + 0] = 0.001f;
  x[40 * 2 + 1] = 1.0f;
  x[41 * 2 + 1] = std::ldexp(1.0f, -12);
  const MxTensor q = quantize_mxfp8(x, 64, 2, {.axis = BlockAxis::along_column});
  const BlockStats s = mxfp8_block_stats(x, q);
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.underflow, 1);
  EXPECT_EQ(s.worst_block, 0);
  EXPECT_NEAR(s.max_block_range, std::log2(1000.0 / static_cast<double>(0.001f)), 1e-12);
  EXPECT_EQ(s.max_range_block, 0);
  // Scales: block 0: 2 (code 129), block 1: zero block (code 0, -127), block 2: zero (-127), block 3: -8.
  EXPECT_EQ(s.scale_log2_min, -127.0);
  EXPECT_EQ(s.scale_log2_median, -127.0);  // sorted {-127, -127, -8, 2}: the lower middle
  EXPECT_EQ(s.scale_log2_max, 2.0);
  EXPECT_EQ(block_origin(q, 3).row, 32);
  EXPECT_EQ(block_origin(q, 3).col, 1);
  const MxTensor qr = quantize_mxfp8(std::vector<float>(64 * 96, 1.0f), 64, 96, {});
  EXPECT_EQ(block_origin(qr, 5).row, 1);  // 3 blocks per row: block 5 = row 1, third block
  EXPECT_EQ(block_origin(qr, 5).col, 64);
  EXPECT_THROW(block_origin(qr, 64 * 3), IndexError);
  EXPECT_THROW(block_origin(qr, -1), IndexError);
}

TEST(BlockStatsByHand, Nvfp4RowAndTile) {
  // 1x16: 6, 3, 1, 0.1, 0.01 and zeros. Global amax 6: encode = 2688 / 6 = 448, decode = fl(1/448).
  // Block decode = e4m3(min(6 * fl(448 * fl(1/6)), 448)) = 448 (6 * 74.66667 = 448.00003 clamps to 448);
  // its value 448 * fl(1/448) = 1 + 0.75 * 2^-24 rounds to 1 in float: elements are x * 1.
  // 6, 3, 1 are on the grid; 0.1 and 0.01 are below 0.25: 0 (two underflows). log2 of the decode scale: 0.
  std::vector<float> x(16, 0.0f);
  x[0] = 6.0f, x[1] = 3.0f, x[2] = 1.0f, x[3] = 0.1f, x[4] = 0.01f;
  const BlockStats s = nvfp4_block_stats(x, quantize_nvfp4(x, 1, 16, {}));
  EXPECT_EQ(s.underflow, 2);
  EXPECT_EQ(s.saturated, 0);
  EXPECT_EQ(s.scale_log2_median, 0.0);
  const double e2 = double{0.1f} * 0.1f + double{0.01f} * 0.01f;
  EXPECT_NEAR(s.rel_rms_error, std::sqrt(e2 / (36.0 + 9.0 + 1.0 + e2)), 1e-15);
  EXPECT_NEAR(s.max_block_range, std::log2(6.0 / double{0.01f}), 1e-12);

  // 16x32, two 16x16 tiles. Tile 0: 6 at (0, 0), 0.5 elsewhere; as above its decode scale is 1, so 0.5 stays.
  // Tile 1: 0.01 everywhere: decode = e4m3(fl(0.01 * 74.66667) = 0.74667) = 0.75 (step 1/16 in [0.5, 1)), whose
  // value fl(0.75 * fl(1/448)) = 0.0016741 (log2 = log2(0.75 / 448) = -9.2224); encode 1 / that = 597.33;
  // 0.01 * 597.33 = 5.973 < 6 (no clipping) rounds to 6: 6 * 0.0016741 = 0.010045. No underflow.
  std::vector<float> w(16 * 32, 0.5f);
  w[0] = 6.0f;
  for (int r = 0; r < 16; ++r)
    for (int c = 16; c < 32; ++c) w[static_cast<std::size_t>(r * 32 + c)] = 0.01f;
  const Nvfp4Tensor q = quantize_nvfp4(w, 16, 32, kTiles);
  const BlockStats t = nvfp4_block_stats(w, q);
  EXPECT_EQ(t.blocks, 2);
  EXPECT_EQ(t.underflow, 0);
  EXPECT_EQ(t.saturated, 0);
  EXPECT_NEAR(t.scale_log2_min, std::log2(0.75 / 448.0), 1e-6);
  EXPECT_EQ(t.scale_log2_max, 0.0);
  EXPECT_NEAR(t.max_block_range, std::log2(12.0), 1e-12);  // tile 0: 6 / 0.5; tile 1 has one magnitude
  EXPECT_EQ(t.max_range_block, 0);
  EXPECT_EQ(block_origin(q, 1).row, 0);
  EXPECT_EQ(block_origin(q, 1).col, 16);
  const Nvfp4Tensor q2 = quantize_nvfp4(std::vector<float>(32 * 32, 1.0f), 32, 32, kTiles);
  EXPECT_EQ(block_origin(q2, 3).row, 16);
  EXPECT_EQ(block_origin(q2, 3).col, 16);
  const Nvfp4Tensor q3 = quantize_nvfp4(std::vector<float>(3 * 32, 1.0f), 3, 32, {});
  EXPECT_EQ(block_origin(q3, 5).row, 2);
  EXPECT_EQ(block_origin(q3, 5).col, 16);
}

// ----------------------------------------------------------------------------------- against the reference

TEST(BlockStats, MxRandomBothRulesAxesAndElements) {
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    const std::vector<float> x = random_matrix(64, 96, seed);
    for (MxScaleRule rule : kRules)
      for (BlockAxis axis : kAxes)
        for (Fp8Format el : {Fp8Format::e4m3, Fp8Format::e5m2}) {
          const MxOptions o{.axis = axis, .element = el, .rule = rule};
          const BlockStats s = check_mx(x, 64, 96, o, name(o) + " seed " + std::to_string(seed));
          // The rules' contract: round-up never clips a finite block; the data has outliers the floor rule clips.
          if (rule == MxScaleRule::round_up) {
            EXPECT_EQ(s.saturated, 0) << name(o);
          }
          if (rule == MxScaleRule::floor && el == Fp8Format::e4m3) {
            EXPECT_GT(s.saturated, 0) << name(o);
          }
          EXPECT_GT(s.underflow, 0) << name(o);
        }
  }
}

TEST(BlockStats, MxAdversarialBlocks) {
  // Eight 1x32 rows (and, transposed by the columnwise copy, mixed across blocks):
  // 0: ties of E4M3 after scaling (amax 448 -> scale 1 under both rules): 1 + k/16 for odd k, midpoints;
  // 1: all zeros (and -0); 2: one outlier 1e5 over values 1e-3 .. 0.032 (flattened to zero);
  // 3: all f32 subnormals (round-up: code 0, multiplier 1; floor: scale 2^-127, x * 2^127 <= 1148 * 2^-22,
  //    below 2^-10: both lose everything);
  // 4: a NaN inside; 5: an inf inside; 6: values just above a power-of-two amax boundary (floor clips the
  // largest: 1.9 * 2^8 / 2^0 > 448); 7: mixed signs at the E4M3 subnormal edge.
  const std::int64_t rows = 32, cols = 32;
  std::vector<float> x(static_cast<std::size_t>(rows * cols), 0.0f);
  auto at = [&](int r, int c) -> float& { return x[static_cast<std::size_t>(r * cols + c)]; };
  for (int c = 0; c < 32; ++c) {
    at(0, c) = c == 0 ? 448.0f : static_cast<float>(1.0 + (2 * (c % 8) + 1) / 16.0);
    at(1, c) = c % 2 ? -0.0f : 0.0f;
    at(2, c) = c == 7 ? 1e5f : 1e-3f * static_cast<float>(c + 1);
    at(3, c) = std::ldexp(1.0f, -149) * static_cast<float>(c * 37 + 1);
    at(4, c) = c == 9 ? kNaN : static_cast<float>(c) - 16.0f;
    at(5, c) = c == 3 ? -kInf : static_cast<float>(c) * 0.25f;
    at(6, c) = static_cast<float>(486.4 - c);
    at(7, c) = std::ldexp(c % 2 ? -1.0f : 1.0f, -9 - (c % 4)) * 448.0f / 256.0f;
  }
  for (int r = 8; r < rows; ++r)
    for (int c = 0; c < cols; ++c) at(r, c) = static_cast<float>((r * 7 + c * 3) % 11) - 5.0f;
  for (MxScaleRule rule : kRules)
    for (BlockAxis axis : kAxes) {
      const MxOptions o{.axis = axis, .rule = rule};
      const BlockStats s = check_mx(x, rows, cols, o, name(o));
      EXPECT_EQ(s.nonfinite, 2);
      if (rule == MxScaleRule::round_up) {
        EXPECT_EQ(s.saturated, 0) << name(o);
      }
      if (rule == MxScaleRule::floor && axis == BlockAxis::along_row) {
        EXPECT_GT(s.saturated, 0);
        EXPECT_EQ(s.blocks_clipped, 1);  // row 6 only (row 0's 448 fits: floor(log2 448) = 8, X = 1)
      }
    }
  // Row by row in isolation, with the particular outcome each block was built for.
  auto row = [&](int r) { return std::vector<float>(x.begin() + r * cols, x.begin() + (r + 1) * cols); };
  const MxOptions up{.rule = MxScaleRule::round_up}, fl{.rule = MxScaleRule::floor};
  EXPECT_EQ(check_mx(row(1), 1, 32, up, "zeros").scale_log2_min, -127.0);
  EXPECT_EQ(check_mx(row(1), 1, 32, up, "zeros").rel_rms_error, 0.0);
  const BlockStats outlier = check_mx(row(2), 1, 32, up, "outlier");
  EXPECT_EQ(outlier.underflow, 31);  // 1e5 * fl(1/448) = 223.2 -> 256; 0.032 / 256 = 1.25e-4 < 2^-10
  EXPECT_EQ(outlier.worst_block_underflow, 31);
  EXPECT_EQ(check_mx(row(3), 1, 32, up, "subnormal up").underflow, 32);
  EXPECT_EQ(check_mx(row(3), 1, 32, fl, "subnormal floor").underflow, 32);
  const BlockStats nan_fl = check_mx(row(4), 1, 32, fl, "nan floor");
  EXPECT_EQ(nan_fl.blocks_nan, 1);
  EXPECT_TRUE(std::isnan(nan_fl.scale_log2_median));  // the only block has the NaN scale
  EXPECT_EQ(nan_fl.rel_rms_error, 0.0);                // every dequantized value is NaN
  const BlockStats nan_up = check_mx(row(4), 1, 32, up, "nan round-up");
  EXPECT_EQ(nan_up.blocks_nan, 1);
  EXPECT_EQ(nan_up.scale_log2_median, -4.0);  // amax 16 (the NaN skipped): 16 * fl(1/448) = 0.0357 -> 2^-4
  const BlockStats inf_up = check_mx(row(5), 1, 32, up, "inf round-up");
  EXPECT_EQ(inf_up.underflow, 30);  // code 254 multiplies by 0: every finite non-zero value (30: 0 and -inf aside) is lost
  EXPECT_EQ(inf_up.scale_log2_max, 127.0);
}

TEST(BlockStats, Nvfp4RandomRowsTilesAndStochastic) {
  for (std::uint32_t seed = 11; seed <= 14; ++seed) {
    const std::vector<float> x = random_matrix(48, 64, seed);
    check_nv(x, 48, 64, {}, "1x16 seed " + std::to_string(seed));
    check_nv(x, 48, 64, kTiles, "16x16 seed " + std::to_string(seed));
    check_nv(x, 48, 64, {.stochastic_rounding = true, .stream = {.seed = seed, .offset = 3}},
             "1x16 stochastic seed " + std::to_string(seed));
    // The weight-gradient operands are quantized after the Hadamard transform: statistics of those values.
    const std::vector<float> t = random_hadamard_transform(x);
    check_nv(t, 48, 64, {}, "1x16 after RHT seed " + std::to_string(seed));
  }
}

TEST(BlockStats, Nvfp4AdversarialBlocks) {
  // Rows of 16: a block whose scale underflows to e4m3 zero next to a huge one (decode 0: elements clamp to 6
  // and come back 0; counted as underflow, not saturation); ties of E2M1; zeros; subnormals; an inf.
  const std::int64_t rows = 6, cols = 32;
  std::vector<float> x(static_cast<std::size_t>(rows * cols), 0.0f);
  auto at = [&](int r, int c) -> float& { return x[static_cast<std::size_t>(r * cols + c)]; };
  at(0, 0) = 3e4f;
  for (int c = 16; c < 32; ++c) at(0, c) = 1e-6f * static_cast<float>(c);  // scale e4m3(~1e-5 * ...) = 0
  const float ties[8] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  for (int c = 0; c < 16; ++c) at(1, c) = (c % 2 ? -1.0f : 1.0f) * ties[c % 8] * 1000.0f / 6.0f;
  for (int c = 0; c < 16; ++c) at(3, c) = std::ldexp(1.0f, -149) * static_cast<float>(c + 1);
  const BlockStats s = check_nv(x, rows, cols, {}, "nvfp4 adversarial");
  EXPECT_GE(s.underflow, 16 + 16);  // the zero-scale block and the subnormals
  EXPECT_EQ(s.scale_log2_min, -std::numeric_limits<double>::infinity());
  check_nv(x, rows, cols, {.stochastic_rounding = true, .stream = {.seed = 5}}, "nvfp4 adversarial sr");
  std::vector<float> y = x;
  y[static_cast<std::size_t>(2 * cols + 5)] = kInf;  // global amax inf: encode 1; that block holds the inf
  const BlockStats si = check_nv(y, rows, cols, {}, "nvfp4 inf");
  EXPECT_EQ(si.nonfinite, 1);
  EXPECT_EQ(si.blocks_nan, 1);
  std::vector<float> z = x;
  z[static_cast<std::size_t>(4 * cols + 20)] = kNaN;  // global amax NaN: every block decodes to NaN
  const BlockStats sn = check_nv(z, rows, cols, {}, "nvfp4 nan");
  EXPECT_EQ(sn.blocks_nan, sn.blocks);
  EXPECT_TRUE(std::isnan(sn.scale_log2_median));
  check_nv(std::vector<float>(32 * 16, 0.0f), 32, 16, kTiles, "nvfp4 zeros");
  // Exact E2M1 ties: global amax 6 makes every scale 1 (Nvfp4RowAndTile), so the values reach the rounding as
  // they are: 0.25 -> 0 (an underflow), 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  const std::vector<float> tie_row = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -1.25f, -1.75f,
                                      -2.5f, -3.5f, -5, 0};
  const BlockStats st = check_nv(tie_row, 1, 16, {}, "nvfp4 ties");
  EXPECT_EQ(st.underflow, 2);
  // error^2 = 2 * (4 * 0.25^2 + 2 * 0.5^2 + 1^2) = 2 * 1.75 = 3.5;
  // sum x^2 = 36 + 2 * (0.0625 + 0.5625 + 1.5625 + 3.0625 + 6.25 + 12.25 + 25) = 36 + 2 * 48.75 = 133.5.
  EXPECT_NEAR(st.rel_rms_error, std::sqrt(3.5 / 133.5), 1e-15);
}

TEST(BlockStats, RefusesValuesThatDoNotMatchTheTensor) {
  const std::vector<float> x(64, 1.0f);
  const MxTensor q = quantize_mxfp8(x, 2, 32);
  try {
    mxfp8_block_stats(std::vector<float>(63, 1.0f), q);
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "mxfp8_block_stats: 63 values for a 2x32 quantized matrix\nhint: pass exactly the values that were "
              "quantized, row-major, rows * cols of them");
  }
  EXPECT_THROW(nvfp4_block_stats(std::vector<float>(65, 1.0f), quantize_nvfp4(x, 2, 32)), ShapeError);
}

}  // namespace
}  // namespace ampscope
