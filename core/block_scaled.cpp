// core/block_scaled.cpp: MXFP8 and NVFP4 block quantization (see block_scaled.h for the formulas and sources).
#include "core/block_scaled.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/philox.h"

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

// min(a, b) that keeps a NaN in `a`, as torch.min / torch.clamp do (std::min(a, b) returns a when
// b < a is false, which is the case for a NaN a).
float min_keep_nan(float a, float b) { return b < a ? b : a; }

// The E2M1 grid's magnitudes, by code 0..7.
constexpr float kE2M1Grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

void check_shape(const char* what, std::size_t size, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw ShapeError(std::string(what) + ": a " + std::to_string(rows) + "x" + std::to_string(cols) +
                     " matrix has a negative dimension\nhint: pass the row and column counts of the matrix");
  }
  if (static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) != size) {
    throw ShapeError(std::string(what) + ": " + std::to_string(size) + " values do not make a " +
                     std::to_string(rows) + "x" + std::to_string(cols) +
                     " matrix\nhint: pass rows * cols values in row-major order");
  }
}

void check_divides(const char* what, std::int64_t rows, std::int64_t cols, const char* dim_name, std::int64_t dim,
                   std::int64_t block, const char* block_desc) {
  if (dim % block != 0) {
    throw ShapeError(std::string(what) + ": " + block_desc + " need " + dim_name + " to be a multiple of " +
                     std::to_string(block) + ", but the matrix is " + std::to_string(rows) + "x" +
                     std::to_string(cols) + "\nhint: pad " + dim_name + " to a multiple of " +
                     std::to_string(block) + ", or keep this tensor in bf16");
  }
}

// floor(log2 |a|) of a finite nonzero float, exact, subnormals included.
int floor_log2(float a) {
  const std::uint32_t u = bits_of(a) & 0x7FFFFFFFu;
  const int e = static_cast<int>(u >> 23);
  if (e != 0) return e - 127;
  // subnormal: value = m * 2^-149, floor(log2) = index of m's top bit - 149
  int top = 31;
  while (((u >> top) & 1u) == 0u) --top;
  return top - 149;
}

}  // namespace

// TE's float_to_e8m0 (the path without Blackwell's cvt.rp.satfinite.ue8m0x2.f32, which it emulates).
std::uint8_t float_to_e8m0_round_up(float v) {
  if (std::isnan(v)) return kE8M0NaN;
  if (std::isinf(v)) return 0xFE;
  if (v == 0.0f) return 0;
  const std::uint32_t u = bits_of(v);
  std::uint32_t exponent = (u >> 23) & 0xFFu;
  const std::uint32_t mantissa = u & 0x7FFFFFu;
  // A mantissa rounds the exponent up, except at 0xFE (satfinite: 2^127 is the largest scale) and for
  // subnormals at or below 2^-127 (mantissa 0x400000 is exactly 2^-127, code 0).
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

namespace {

// TE's exp2f_rcp: the multiplier 2^(127 - c) that scales a block into the element range, with its two
// edge cases kept (c == 0 -> 1; c == 254 -> (254 - 254) << 23 = +0).
float e8m0_encode_multiplier(std::uint8_t c) {
  if (c == 0) return 1.0f;
  return float_of(static_cast<std::uint32_t>(254 - c) << 23);
}

std::uint8_t fp8_nan_code() { return 0x7F; }  // NaN in both E4M3 (S.1111.111) and E5M2 (S.11111.11)

}  // namespace

float e2m1_to_float(std::uint8_t code) {
  const int s = (code >> 3) & 1;
  const int e = (code >> 1) & 3;
  const int m = code & 1;
  const float mag = e == 0 ? 0.5f * static_cast<float>(m) : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
  return s ? -mag : mag;
}

std::uint8_t float_to_e2m1(float x) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  std::uint8_t code;
  // Midpoints between neighbours; at a midpoint the even code wins.
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.0f) {
    code = 6;
  } else {
    code = 7;  // (5, inf]: 6, saturated
  }
  return static_cast<std::uint8_t>(sign | code);
}

std::uint8_t float_to_e2m1_stochastic(float x, float u) {
  if (std::isnan(x)) return 0;
  const std::uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fmin(std::fabs(x), kE2M1Max);
  std::uint8_t lo = 0;
  while (lo < 7 && kE2M1Grid[lo + 1] <= a) ++lo;
  if (kE2M1Grid[lo] == a) return static_cast<std::uint8_t>(sign | lo);
  // (a - lo) is exact (a and the grid point are within a factor of 2, or lo is 0) and the step is a power
  // of two, so p is the exact fraction of the way from lo to hi.
  const float p = (a - kE2M1Grid[lo]) / (kE2M1Grid[lo + 1] - kE2M1Grid[lo]);
  const std::uint8_t code = u < p ? static_cast<std::uint8_t>(lo + 1) : lo;
  return static_cast<std::uint8_t>(sign | code);
}

float e8m0_to_float(std::uint8_t code) {
  if (code == kE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return float_of(0x00400000u);  // 2^-127, a float subnormal
  return float_of(static_cast<std::uint32_t>(code) << 23);
}

// ------------------------------------------------------------------------------------------------- MX

std::uint8_t mx_block_scale(std::span<const float> block, Fp8Format element, MxScaleRule rule) {
  if (rule == MxScaleRule::floor) {
    float amax = 0.0f;
    for (float v : block) {
      const float a = std::fabs(v);
      if (std::isnan(a)) return kE8M0NaN;  // NaN propagates through the max
      if (a > amax) amax = a;
    }
    if (std::isinf(amax)) return kE8M0NaN;  // floor(log2 inf) - emax is past 127: NaN
    // amax 0: the reference takes log2 of FP32_MIN_NORMAL (-126); minus emax it is below -127 either way.
    const int emax_elem = element == Fp8Format::e4m3 ? 8 : 15;
    int shared = (amax == 0.0f ? -126 : floor_log2(amax)) - emax_elem;
    if (shared < -127) shared = -127;  // (> 127 cannot happen for a finite float: floor_log2 <= 127)
    return static_cast<std::uint8_t>(shared + 127);
  }
  float amax = 0.0f;
  for (float v : block) amax = std::fmax(amax, std::fabs(v));  // fmaxf: NaN skipped, inf wins
  const float max_norm_rcp = static_cast<float>(1.0 / static_cast<double>(fp8_max(element)));
  return float_to_e8m0_round_up(amax * max_norm_rcp);
}

MxTensor quantize_mxfp8(std::span<const float> x, std::int64_t rows, std::int64_t cols, const MxOptions& options) {
  check_shape("quantize_mxfp8", x.size(), rows, cols);
  const bool along_row = options.axis == BlockAxis::along_row;
  if (along_row) {
    check_divides("quantize_mxfp8", rows, cols, "cols", cols, kMxBlock, "1x32 blocks along rows");
  } else {
    check_divides("quantize_mxfp8", rows, cols, "rows", rows, kMxBlock, "32x1 blocks down columns");
  }
  MxTensor q;
  q.rows = rows;
  q.cols = cols;
  q.options = options;
  q.codes.assign(x.size(), 0);
  const std::int64_t n_blocks = rows * cols / kMxBlock;
  q.scales.assign(static_cast<std::size_t>(n_blocks), 0);

  std::vector<float> block(kMxBlock);
  std::vector<std::size_t> index(kMxBlock);
  const std::int64_t blocks_per_line = along_row ? cols / kMxBlock : cols;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    // Scale b sits at (b / blocks_per_line, b % blocks_per_line) of the scale matrix.
    const std::int64_t sr = b / blocks_per_line;
    const std::int64_t sc = b % blocks_per_line;
    for (std::int64_t k = 0; k < kMxBlock; ++k) {
      const std::int64_t r = along_row ? sr : sr * kMxBlock + k;
      const std::int64_t c = along_row ? sc * kMxBlock + k : sc;
      index[static_cast<std::size_t>(k)] = static_cast<std::size_t>(r * cols + c);
      block[static_cast<std::size_t>(k)] = x[static_cast<std::size_t>(r * cols + c)];
    }
    const std::uint8_t scale = mx_block_scale(block, options.element, options.rule);
    q.scales[static_cast<std::size_t>(b)] = scale;
    for (std::int64_t k = 0; k < kMxBlock; ++k) {
      const float v = block[static_cast<std::size_t>(k)];
      std::uint8_t code;
      if (options.rule == MxScaleRule::floor) {
        // X = 2^(scale - 127); v / X is exact (a power of two; results below float's normal range round
        // once, far below the element's smallest subnormal).
        code = scale == kE8M0NaN ? fp8_nan_code()
                                 : float_to_fp8(std::ldexp(v, 127 - static_cast<int>(scale)), options.element);
      } else {
        code = float_to_fp8(v * e8m0_encode_multiplier(scale), options.element);
      }
      q.codes[index[static_cast<std::size_t>(k)]] = code;
    }
  }
  return q;
}

std::vector<float> dequantize_mxfp8(const MxTensor& q) {
  check_shape("dequantize_mxfp8", q.codes.size(), q.rows, q.cols);
  const bool along_row = q.options.axis == BlockAxis::along_row;
  const std::int64_t blocked = along_row ? q.cols : q.rows;
  if (blocked % kMxBlock != 0 || q.scales.size() != q.codes.size() / kMxBlock) {
    throw ShapeError("dequantize_mxfp8: " + std::to_string(q.scales.size()) + " scales for " +
                     std::to_string(q.codes.size()) +
                     " codes of a " + std::to_string(q.rows) + "x" + std::to_string(q.cols) +
                     " matrix, expected one per 32-value block\nhint: pass an MxTensor made by quantize_mxfp8");
  }
  std::vector<float> out(q.codes.size());
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::size_t s = along_row ? static_cast<std::size_t>(r * (q.cols / kMxBlock) + c / kMxBlock)
                                      : static_cast<std::size_t>((r / kMxBlock) * q.cols + c);
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      const std::uint8_t scale = q.scales[s];
      out[i] = scale == kE8M0NaN ? std::numeric_limits<float>::quiet_NaN()
                                 : fp8_to_float(q.codes[i], q.options.element) * e8m0_to_float(scale);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- NVFP4

Nvfp4GlobalScales nvfp4_global_scales(float global_amax) {
  // 448 * 6 = 2688 exactly; the quotient is rounded to float, as torch.div of two f32 tensors.
  float encode = min_keep_nan(kE4M3Max * kE2M1Max / global_amax, FLT_MAX);
  if (encode == 0.0f) encode = 1.0f;
  return {encode, 1.0f / encode};
}

std::uint8_t nvfp4_block_scale(float block_amax, float global_encode) {
  const float multiplier = global_encode * (1.0f / kE2M1Max);
  float decode = min_keep_nan(block_amax * multiplier, FLT_MAX);
  decode = min_keep_nan(decode, kE4M3Max);  // the clamp's lower bound -448 never binds: amax >= 0
  // torch's .to(float8_e4m3fn): RNE, no saturation needed after the clamp; NaN gives 0x7F.
  return float_to_e4m3_torch(decode);
}

Nvfp4Tensor quantize_nvfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                           const Nvfp4Options& options) {
  check_shape("quantize_nvfp4", x.size(), rows, cols);
  const bool square = options.tile == Nvfp4Tile::square_16x16;
  check_divides("quantize_nvfp4", rows, cols, "cols", cols, kNvfp4Block,
                square ? "16x16 tiles" : "1x16 blocks along rows");
  if (square) check_divides("quantize_nvfp4", rows, cols, "rows", rows, kNvfp4Block, "16x16 tiles");

  Nvfp4Tensor q;
  q.rows = rows;
  q.cols = cols;
  q.options = options;
  // torch.max(torch.abs(x)): NaN propagates.
  float amax = 0.0f;
  for (float v : x) {
    const float a = std::fabs(v);
    if (std::isnan(a) || a > amax) amax = a;
    if (std::isnan(amax)) break;
  }
  q.global_amax = amax;
  const Nvfp4GlobalScales g = nvfp4_global_scales(amax);
  q.global_encode_scale = g.encode;
  q.global_decode_scale = g.decode;

  const std::int64_t scale_rows = square ? rows / kNvfp4Block : rows;
  const std::int64_t scale_cols = cols / kNvfp4Block;
  const std::int64_t tile_rows = square ? kNvfp4Block : 1;
  q.scales.assign(static_cast<std::size_t>(scale_rows * scale_cols), 0);
  q.codes.assign(x.size(), 0);

  for (std::int64_t sr = 0; sr < scale_rows; ++sr) {
    for (std::int64_t sc = 0; sc < scale_cols; ++sc) {
      const std::int64_t r0 = sr * tile_rows;
      const std::int64_t c0 = sc * kNvfp4Block;
      float block_amax = 0.0f;  // torch.amax: NaN propagates
      for (std::int64_t r = r0; r < r0 + tile_rows; ++r) {
        for (std::int64_t c = c0; c < c0 + kNvfp4Block; ++c) {
          const float a = std::fabs(x[static_cast<std::size_t>(r * cols + c)]);
          if (std::isnan(block_amax)) break;
          if (std::isnan(a) || a > block_amax) block_amax = a;
        }
      }
      const std::uint8_t scale = nvfp4_block_scale(block_amax, g.encode);
      q.scales[static_cast<std::size_t>(sr * scale_cols + sc)] = scale;
      const float encode = min_keep_nan(1.0f / (e4m3_to_float(scale) * g.decode), FLT_MAX);
      for (std::int64_t r = r0; r < r0 + tile_rows; ++r) {
        for (std::int64_t c = c0; c < c0 + kNvfp4Block; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * cols + c);
          // torch.clamp(v, -6, 6) keeps a NaN; both encoders give code 0 for it.
          float v = x[i] * encode;
          v = min_keep_nan(v, kE2M1Max);
          if (v < -kE2M1Max) v = -kE2M1Max;
          q.codes[i] = options.stochastic_rounding
                           ? float_to_e2m1_stochastic(v, uniform_at<float>(options.stream.seed, options.stream.offset, i))
                           : float_to_e2m1(v);
        }
      }
    }
  }
  return q;
}

std::vector<float> dequantize_nvfp4(const Nvfp4Tensor& q) {
  check_shape("dequantize_nvfp4", q.codes.size(), q.rows, q.cols);
  const bool square = q.options.tile == Nvfp4Tile::square_16x16;
  const std::int64_t scale_cols = q.cols / kNvfp4Block;
  const std::int64_t scale_rows = square ? q.rows / kNvfp4Block : q.rows;
  if (q.cols % kNvfp4Block != 0 || (square && q.rows % kNvfp4Block != 0) ||
      q.scales.size() != static_cast<std::size_t>(scale_rows * scale_cols)) {
    throw ShapeError("dequantize_nvfp4: " + std::to_string(q.scales.size()) + " scales do not fit a " +
                     std::to_string(q.rows) + "x" + std::to_string(q.cols) +
                     " matrix in its tiles\nhint: pass an Nvfp4Tensor made by quantize_nvfp4");
  }
  std::vector<float> out(q.codes.size());
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::int64_t sr = square ? r / kNvfp4Block : r;
      const std::uint8_t scale = q.scales[static_cast<std::size_t>(sr * scale_cols + c / kNvfp4Block)];
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      out[i] = e2m1_to_float(q.codes[i]) * (e4m3_to_float(scale) * q.global_decode_scale);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------- Hadamard

namespace {

// Entry (i, j) of the Sylvester Hadamard matrix of order 16: (-1)^popcount(i & j).
double hadamard16(int i, int j) {
  int bits = i & j;
  int parity = 0;
  while (bits) {
    parity ^= bits & 1;
    bits >>= 1;
  }
  return parity ? -1.0 : 1.0;
}

void check_rht(const char* what, std::size_t n) {
  if (n % static_cast<std::size_t>(kRhtSize) != 0) {
    throw ShapeError(std::string(what) + ": " + std::to_string(n) +
                     " values are not a whole number of 16-value groups\nhint: the transform runs over the "
                     "dimension it is applied to in groups of 16; pad that dimension to a multiple of 16");
  }
}

}  // namespace

std::vector<float> random_hadamard_transform(std::span<const float> x) {
  check_rht("random_hadamard_transform", x.size());
  std::vector<float> y(x.size());
  for (std::size_t g = 0; g < x.size(); g += kRhtSize) {
    for (int j = 0; j < kRhtSize; ++j) {
      // (v * D * H)_j / 4 = sum_i v_i s_i H_ij / 4
      double sum = 0.0;
      for (int i = 0; i < kRhtSize; ++i) {
        sum += static_cast<double>(x[g + static_cast<std::size_t>(i)]) * kRhtSigns[i] * hadamard16(i, j);
      }
      y[g + static_cast<std::size_t>(j)] = static_cast<float>(sum * 0.25);
    }
  }
  return y;
}

std::vector<float> inverse_random_hadamard_transform(std::span<const float> y) {
  check_rht("inverse_random_hadamard_transform", y.size());
  std::vector<float> x(y.size());
  for (std::size_t g = 0; g < y.size(); g += kRhtSize) {
    for (int i = 0; i < kRhtSize; ++i) {
      // (w * H * D)_i / 4 = s_i * sum_j w_j H_ji / 4
      double sum = 0.0;
      for (int j = 0; j < kRhtSize; ++j) sum += static_cast<double>(y[g + static_cast<std::size_t>(j)]) * hadamard16(j, i);
      x[g + static_cast<std::size_t>(i)] = static_cast<float>(sum * kRhtSigns[i] * 0.25);
    }
  }
  return x;
}

}  // namespace ampscope
