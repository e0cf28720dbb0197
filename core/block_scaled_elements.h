// core/block_scaled_elements.h: the element and block math of the block-scaled formats (MXFP8, NVFP4;
// core/block_scaled.h has the whole-tensor API and the formulas' sources), written once for host and CUDA
// device code, as core/float8.h is: the CPU's quantize_mxfp8 / quantize_nvfp4 / the Hadamard transform and
// the CUDA kernels (kernels/cuda/block_scaled_kernels.cu) call these same functions on the same floats, so a
// code, a scale and a transformed value are the same bits on both sides.
//
//   std::uint8_t c = float_to_e2m1(2.5f);                                  // 4 (2.0): the tie goes to the even code
//   std::uint8_t s = mx_quantize_block(x, 1, Fp8Format::e4m3, MxScaleRule::round_up, codes);  // 32 values
//   float y3 = rht16_forward(x, 3);                                        // output 3 of a 16-value group
//
// Only bit operations, comparisons and IEEE +, -, *, / (no libm calls: the device's and the host's may differ
// in their last bits), with the project's flags on both sides: no contraction (-ffp-contract=off,
// -fmad=false), correctly rounded division, subnormals kept. Where a NaN is an operand of an arithmetic
// operation whose result is stored (global scales, dequantized values), the NaN is returned explicitly rather
// than left to the hardware, whose NaN results differ (x86 returns the NaN operand quieted, a GPU a canonical
// NaN); the choice made is x86's, so the host's results are the ones these functions gave before they were
// shared.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/float16.h"  // AMPSCOPE_HD, detail::float_bits / bits_float
#include "core/float8.h"
#include "core/philox.h"

namespace ampscope {

// ---------------------------------------------------------------------------------------------------
// Constants, layout enums and options (core/block_scaled.h documents each).
// ---------------------------------------------------------------------------------------------------
inline constexpr float kE2M1Max = 6.0f;
inline constexpr std::uint8_t kE8M0NaN = 0xFF;
inline constexpr std::int64_t kMxBlock = 32;
inline constexpr std::int64_t kNvfp4Block = 16;
inline constexpr std::int64_t kRhtSize = 16;

enum class BlockAxis : std::uint8_t { along_row, along_column };
enum class MxScaleRule : std::uint8_t { floor, round_up };
enum class Nvfp4Tile : std::uint8_t { row_1x16, square_16x16 };

struct MxOptions {
  BlockAxis axis = BlockAxis::along_row;
  Fp8Format element = Fp8Format::e4m3;
  MxScaleRule rule = MxScaleRule::round_up;  // NVIDIA's, the default of the libraries that run MXFP8
};

// Stochastic rounding's stream: element i (row-major index) uses uniform_at<float>(seed, offset, i).
struct PhiloxStream {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
};

struct Nvfp4Options {
  Nvfp4Tile tile = Nvfp4Tile::row_1x16;
  bool stochastic_rounding = false;  // elements rounded stochastically (gradients), from `stream`
  PhiloxStream stream;
};

namespace detail {

AMPSCOPE_HD inline bool is_nan_float(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
AMPSCOPE_HD inline bool is_inf_float(float x) { return (float_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }
AMPSCOPE_HD inline float abs_float(float x) { return bits_float(float_bits(x) & 0x7FFFFFFFu); }
AMPSCOPE_HD inline float quiet_nan_float() { return bits_float(0x7FC00000u); }  // std::numeric_limits' quiet_NaN
AMPSCOPE_HD inline float flt_max_float() { return bits_float(0x7F7FFFFFu); }

// min(a, b) that keeps a NaN in `a`, as torch.min / torch.clamp do.
AMPSCOPE_HD inline float min_keep_nan(float a, float b) { return b < a ? b : a; }

// 2^k, exact, for k in -149 .. 127 (subnormals below -126).
AMPSCOPE_HD inline float pow2_float(int k) {
  if (k >= -126) return bits_float(static_cast<std::uint32_t>(k + 127) << 23);
  return bits_float(1u << (k + 149));
}

// floor(log2 |a|) of a finite nonzero float, exact, subnormals included.
AMPSCOPE_HD inline int floor_log2_float(float a) {
  const std::uint32_t u = float_bits(a) & 0x7FFFFFFFu;
  const int e = static_cast<int>(u >> 23);
  if (e != 0) return e - 127;
  // subnormal: value = m * 2^-149, floor(log2) = index of m's top bit - 149
  int top = 31;
  while (((u >> top) & 1u) == 0u) --top;
  return top - 149;
}

// The E2M1 grid's magnitude of code c (0..7): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
AMPSCOPE_HD inline float e2m1_magnitude(unsigned c) {
  const unsigned e = (c >> 1) & 3u, m = c & 1u;
  if (e == 0) return m ? 0.5f : 0.0f;
  return bits_float(((e - 1u + 127u) << 23) | (m << 22));  // 2^(e-1) * (1 + m/2)
}

// a * b where a NaN operand is returned itself, quieted (the first NaN of a, b), as x86 does for one NaN.
AMPSCOPE_HD inline float mul_keep_nan(float a, float b) {
  if (is_nan_float(a)) return bits_float(float_bits(a) | 0x00400000u);
  if (is_nan_float(b)) return bits_float(float_bits(b) | 0x00400000u);
  return a * b;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// E2M1 and E8M0 (core/block_scaled.h says what each code means and how ties, saturation and NaN go).
// ---------------------------------------------------------------------------------------------------
AMPSCOPE_HD inline float e2m1_to_float(std::uint8_t code) {
  const float mag = detail::e2m1_magnitude(code & 7u);
  return (code & 8u) ? detail::bits_float(detail::float_bits(mag) | 0x80000000u) : mag;
}

AMPSCOPE_HD inline std::uint8_t float_to_e2m1(float x) {
  if (detail::is_nan_float(x)) return 0;
  const std::uint8_t sign = (detail::float_bits(x) & 0x80000000u) ? 0x8 : 0x0;
  const float a = detail::abs_float(x);
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

AMPSCOPE_HD inline std::uint8_t float_to_e2m1_stochastic(float x, float u) {
  if (detail::is_nan_float(x)) return 0;
  const std::uint8_t sign = (detail::float_bits(x) & 0x80000000u) ? 0x8 : 0x0;
  const float abs_x = detail::abs_float(x);
  const float a = abs_x < kE2M1Max ? abs_x : kE2M1Max;
  unsigned lo = 0;
  while (lo < 7 && detail::e2m1_magnitude(lo + 1) <= a) ++lo;
  const float lo_value = detail::e2m1_magnitude(lo);
  if (lo_value == a) return static_cast<std::uint8_t>(sign | lo);
  // (a - lo) is exact (a and the grid point are within a factor of 2, or lo is 0) and the step is a power
  // of two, so p is the exact fraction of the way from lo to hi.
  const float p = (a - lo_value) / (detail::e2m1_magnitude(lo + 1) - lo_value);
  const unsigned code = u < p ? lo + 1 : lo;
  return static_cast<std::uint8_t>(sign | code);
}

AMPSCOPE_HD inline float e8m0_to_float(std::uint8_t code) {
  if (code == kE8M0NaN) return detail::quiet_nan_float();
  if (code == 0) return detail::bits_float(0x00400000u);  // 2^-127, a float subnormal
  return detail::bits_float(static_cast<std::uint32_t>(code) << 23);
}

// TE's float_to_e8m0 (the path without Blackwell's cvt.rp.satfinite.ue8m0x2.f32, which it emulates).
AMPSCOPE_HD inline std::uint8_t float_to_e8m0_round_up(float v) {
  if (detail::is_nan_float(v)) return kE8M0NaN;
  if (detail::is_inf_float(v)) return 0xFE;
  if (v == 0.0f) return 0;
  const std::uint32_t u = detail::float_bits(v);
  std::uint32_t exponent = (u >> 23) & 0xFFu;
  const std::uint32_t mantissa = u & 0x7FFFFFu;
  // A mantissa rounds the exponent up, except at 0xFE (satfinite: 2^127 is the largest scale) and for
  // subnormals at or below 2^-127 (mantissa 0x400000 is exactly 2^-127, code 0).
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<std::uint8_t>(exponent);
}

namespace detail {

// TE's exp2f_rcp: the multiplier 2^(127 - c) that scales a block into the element range, with its two
// edge cases kept (c == 0 -> 1; c == 254 -> (254 - 254) << 23 = +0).
AMPSCOPE_HD inline float e8m0_encode_multiplier(std::uint8_t c) {
  if (c == 0) return 1.0f;
  return bits_float(static_cast<std::uint32_t>(254 - c) << 23);
}

inline constexpr std::uint8_t kFp8NanCode = 0x7F;  // NaN in both E4M3 (S.1111.111) and E5M2 (S.11111.11)

}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// MX blocks: the scale of n values read with a stride, and the codes of one block.
// ---------------------------------------------------------------------------------------------------
AMPSCOPE_HD inline std::uint8_t mx_block_scale_strided(const float* x, std::int64_t stride, std::int64_t n,
                                                       Fp8Format element, MxScaleRule rule) {
  float amax = 0.0f;
  if (rule == MxScaleRule::floor) {
    for (std::int64_t k = 0; k < n; ++k) {
      const float a = detail::abs_float(x[k * stride]);
      if (detail::is_nan_float(a)) return kE8M0NaN;  // NaN propagates through the max
      if (a > amax) amax = a;
    }
    if (detail::is_inf_float(amax)) return kE8M0NaN;  // floor(log2 inf) - emax is past 127: NaN
    // amax 0: the reference takes log2 of FP32_MIN_NORMAL (-126); minus emax it is below -127 either way.
    const int emax_elem = element == Fp8Format::e4m3 ? 8 : 15;
    int shared = (amax == 0.0f ? -126 : detail::floor_log2_float(amax)) - emax_elem;
    if (shared < -127) shared = -127;  // (> 127 cannot happen for a finite float: floor_log2 <= 127)
    return static_cast<std::uint8_t>(shared + 127);
  }
  for (std::int64_t k = 0; k < n; ++k) {
    const float a = detail::abs_float(x[k * stride]);
    if (a > amax) amax = a;  // fmaxf's fold: a NaN is skipped (the comparison is false), an inf wins
  }
  const float max_norm_rcp = static_cast<float>(1.0 / static_cast<double>(fp8_max(element)));
  return float_to_e8m0_round_up(amax * max_norm_rcp);
}

// The element code of v in a block whose E8M0 scale is `scale`, under `rule`.
AMPSCOPE_HD inline std::uint8_t mx_element_code(float v, std::uint8_t scale, Fp8Format element, MxScaleRule rule) {
  if (rule == MxScaleRule::floor) {
    if (scale == kE8M0NaN) return detail::kFp8NanCode;
    // v / X with X = 2^(scale - 127): one multiplication by the exact power 2^(127 - scale) (-127 .. 127), so
    // the correctly rounded v * 2^(127 - scale), which is std::ldexp's result (the CPU's before it was shared).
    return float_to_fp8(v * detail::pow2_float(127 - static_cast<int>(scale)), element);
  }
  return float_to_fp8(v * detail::e8m0_encode_multiplier(scale), element);
}

// Where MX block b of a rows x cols matrix starts (its first value's row-major index) and the distance between its
// values: blocks are numbered as their scales are stored (row-major over rows x cols/32 along rows, rows/32 x cols
// down columns), block b's scale at (b / per_line, b % per_line) of that matrix.
AMPSCOPE_HD inline std::int64_t mx_block_first(std::int64_t b, std::int64_t cols, BlockAxis axis) {
  const bool along_row = axis == BlockAxis::along_row;
  const std::int64_t per_line = along_row ? cols / kMxBlock : cols;
  const std::int64_t sr = b / per_line, sc = b % per_line;
  return along_row ? sr * cols + sc * kMxBlock : sr * kMxBlock * cols + sc;
}
AMPSCOPE_HD inline std::int64_t mx_block_stride(std::int64_t cols, BlockAxis axis) {
  return axis == BlockAxis::along_row ? 1 : cols;
}
// The index of the scale of element (r, c).
AMPSCOPE_HD inline std::int64_t mx_scale_index(std::int64_t r, std::int64_t c, std::int64_t cols, BlockAxis axis) {
  return axis == BlockAxis::along_row ? r * (cols / kMxBlock) + c / kMxBlock : (r / kMxBlock) * cols + c;
}

// Quantizes the 32 values x[0], x[stride], ..., x[31 * stride] into codes[0], codes[stride], ...; returns the
// block's E8M0 scale code.
AMPSCOPE_HD inline std::uint8_t mx_quantize_block(const float* x, std::int64_t stride, Fp8Format element,
                                                  MxScaleRule rule, std::uint8_t* codes) {
  const std::uint8_t scale = mx_block_scale_strided(x, stride, kMxBlock, element, rule);
  for (std::int64_t k = 0; k < kMxBlock; ++k) codes[k * stride] = mx_element_code(x[k * stride], scale, element, rule);
  return scale;
}

// The decoded value of one element: NaN (0x7FC00000) in a block with the NaN scale; the element's NaN itself
// for an element NaN code; else decode(code) * 2^(scale - 127) in float.
AMPSCOPE_HD inline float mx_dequantize_element(std::uint8_t code, std::uint8_t scale, Fp8Format element) {
  if (scale == kE8M0NaN) return detail::quiet_nan_float();
  return detail::mul_keep_nan(fp8_to_float(code, element), e8m0_to_float(scale));
}

// ---------------------------------------------------------------------------------------------------
// NVFP4: the two-level scales (core/block_scaled.h has the formulas) and one tile's quantization.
// ---------------------------------------------------------------------------------------------------
struct Nvfp4GlobalScales {
  float encode;
  float decode;
};

AMPSCOPE_HD inline Nvfp4GlobalScales nvfp4_global_scales(float global_amax) {
  // A NaN amax gives encode = decode = that NaN, quieted (what the division by it gives on x86).
  if (detail::is_nan_float(global_amax)) {
    const float q = detail::bits_float(detail::float_bits(global_amax) | 0x00400000u);
    return {q, q};
  }
  // 448 * 6 = 2688 exactly; the quotient is rounded to float, as torch.div of two f32 tensors.
  float encode = detail::min_keep_nan(kE4M3Max * kE2M1Max / global_amax, detail::flt_max_float());
  if (encode == 0.0f) encode = 1.0f;
  return {encode, 1.0f / encode};
}

AMPSCOPE_HD inline std::uint8_t nvfp4_block_scale(float block_amax, float global_encode) {
  const float multiplier = global_encode * (1.0f / kE2M1Max);
  float decode = detail::min_keep_nan(block_amax * multiplier, detail::flt_max_float());
  decode = detail::min_keep_nan(decode, kE4M3Max);  // the clamp's lower bound -448 never binds: amax >= 0
  // torch's .to(float8_e4m3fn): RNE, no saturation needed after the clamp; NaN gives 0x7F.
  return float_to_e4m3_torch(decode);
}

// The multiplier that takes a tile's values to E2M1's range: min(fl(1 / fl(e4m3(scale) * global_decode)), FLT_MAX).
AMPSCOPE_HD inline float nvfp4_block_encode(std::uint8_t scale, float global_decode) {
  return detail::min_keep_nan(1.0f / (e4m3_to_float(scale) * global_decode), detail::flt_max_float());
}

// The max |x| of a tile_rows x 16 tile at (r0, c0) of a row-major matrix with `cols` columns, scanned row by
// row; the first NaN met is the result (torch.amax propagates NaN).
AMPSCOPE_HD inline float nvfp4_tile_amax(const float* x, std::int64_t cols, std::int64_t r0, std::int64_t tile_rows,
                                         std::int64_t c0) {
  float block_amax = 0.0f;
  for (std::int64_t r = r0; r < r0 + tile_rows; ++r) {
    for (std::int64_t c = c0; c < c0 + kNvfp4Block; ++c) {
      if (detail::is_nan_float(block_amax)) return block_amax;
      const float a = detail::abs_float(x[r * cols + c]);
      if (detail::is_nan_float(a) || a > block_amax) block_amax = a;
    }
  }
  return block_amax;
}

// One element's E2M1 code: fl(x * encode) clamped to [-6, 6] (a NaN kept), then RNE or, with `stochastic`,
// stochastic rounding with the uniform u.
AMPSCOPE_HD inline std::uint8_t nvfp4_element_code(float x, float encode, bool stochastic, float u) {
  float v = x * encode;
  v = detail::min_keep_nan(v, kE2M1Max);
  if (v < -kE2M1Max) v = -kE2M1Max;
  return stochastic ? float_to_e2m1_stochastic(v, u) : float_to_e2m1(v);
}

// Quantizes the tile_rows x 16 tile at (r0, c0) of a row-major rows x cols matrix: writes its codes at the
// same positions of `codes` and returns its E4M3 scale code. Stochastic rounding draws element i's uniform
// (i the row-major index) as uniform_at<float>(seed, offset, i).
AMPSCOPE_HD inline std::uint8_t nvfp4_quantize_tile(const float* x, std::int64_t cols, std::int64_t r0,
                                                    std::int64_t tile_rows, std::int64_t c0, Nvfp4GlobalScales g,
                                                    bool stochastic, std::uint64_t seed, std::uint64_t offset,
                                                    std::uint8_t* codes) {
  const std::uint8_t scale = nvfp4_block_scale(nvfp4_tile_amax(x, cols, r0, tile_rows, c0), g.encode);
  const float encode = nvfp4_block_encode(scale, g.decode);
  for (std::int64_t r = r0; r < r0 + tile_rows; ++r) {
    for (std::int64_t c = c0; c < c0 + kNvfp4Block; ++c) {
      const std::int64_t i = r * cols + c;
      const float u = stochastic ? uniform_at<float>(seed, offset, static_cast<std::uint64_t>(i)) : 0.0f;
      codes[i] = nvfp4_element_code(x[i], encode, stochastic, u);
    }
  }
  return scale;
}

// The index of the scale of element (r, c) of a matrix with `cols` columns (row-major over the scale matrix:
// rows x cols/16 for 1x16 blocks, rows/16 x cols/16 for 16x16 tiles); tile t starts at row (t / (cols/16)) times
// the tile's height and column (t % (cols/16)) * 16.
AMPSCOPE_HD inline std::int64_t nvfp4_scale_index(std::int64_t r, std::int64_t c, std::int64_t cols, Nvfp4Tile tile) {
  const std::int64_t sr = tile == Nvfp4Tile::square_16x16 ? r / kNvfp4Block : r;
  return sr * (cols / kNvfp4Block) + c / kNvfp4Block;
}

// e2m1_value * fl(e4m3_value(scale) * global_decode), a NaN scale or decode scale returned itself.
AMPSCOPE_HD inline float nvfp4_dequantize_element(std::uint8_t code, std::uint8_t scale, float global_decode) {
  return detail::mul_keep_nan(e2m1_to_float(code), detail::mul_keep_nan(e4m3_to_float(scale), global_decode));
}

// ---------------------------------------------------------------------------------------------------
// The 16-point random Hadamard transform (core/block_scaled.h): output j of a group v is
// fl(sum_i v_i s_i H_ij / 4), the 16 terms (+-v_i, exact in double) added in double in the order i = 0..15
// and the sum rounded once to float (the * 0.25 is exact). IEEE double addition and the double-to-float
// conversion are correctly rounded on the host and on a GPU, and nothing is contracted on either side, so a
// result that is not NaN is the same bits on both (a NaN is NaN on both; its bits are the hardware's).
// ---------------------------------------------------------------------------------------------------

// kRhtSigns[i] (TransformerEngine's get_wgrad_sign_vector) as a bit mask of the negative entries, usable in
// device code: 1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1.
inline constexpr std::uint32_t kRhtNegativeSigns = 0xD7E8u;

AMPSCOPE_HD inline double rht_sign(int i) { return ((kRhtNegativeSigns >> i) & 1u) ? -1.0 : 1.0; }

// Entry (i, j) of the Sylvester Hadamard matrix of order 16: (-1)^popcount(i & j).
AMPSCOPE_HD inline double hadamard16(int i, int j) {
  int bits = i & j;
  int parity = 0;
  while (bits) {
    parity ^= bits & 1;
    bits >>= 1;
  }
  return parity ? -1.0 : 1.0;
}

// Output j of the transform of the 16 values v[0..15]: (v * D * H)_j / 4.
AMPSCOPE_HD inline float rht16_forward(const float* v, int j) {
  double sum = 0.0;
  for (int i = 0; i < 16; ++i) sum += static_cast<double>(v[i]) * rht_sign(i) * hadamard16(i, j);
  return static_cast<float>(sum * 0.25);
}

// Output i of the inverse of the 16 values w[0..15]: (w * H * D)_i / 4.
AMPSCOPE_HD inline float rht16_inverse(const float* w, int i) {
  double sum = 0.0;
  for (int j = 0; j < 16; ++j) sum += static_cast<double>(w[j]) * hadamard16(j, i);
  return static_cast<float>(sum * rht_sign(i) * 0.25);
}

// ---------------------------------------------------------------------------------------------------
// Shape checks (host): the errors quantize_mxfp8 / quantize_nvfp4 and their CUDA versions throw. `what` names
// the caller.
// ---------------------------------------------------------------------------------------------------
inline void check_block_matrix(const char* what, std::uint64_t size, std::int64_t rows, std::int64_t cols) {
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

inline void check_block_divides(const char* what, std::int64_t rows, std::int64_t cols, const char* dim_name,
                                std::int64_t dim, std::int64_t block, const char* block_desc) {
  if (dim % block != 0) {
    throw ShapeError(std::string(what) + ": " + block_desc + " need " + dim_name + " to be a multiple of " +
                     std::to_string(block) + ", but the matrix is " + std::to_string(rows) + "x" +
                     std::to_string(cols) + "\nhint: pad " + dim_name + " to a multiple of " +
                     std::to_string(block) + ", or keep this tensor in bf16");
  }
}

// quantize_mxfp8's shape rule: the blocked dimension (cols along rows, rows down columns) a multiple of 32.
inline void check_mx_shape(const char* what, std::int64_t rows, std::int64_t cols, BlockAxis axis) {
  if (axis == BlockAxis::along_row) {
    check_block_divides(what, rows, cols, "cols", cols, kMxBlock, "1x32 blocks along rows");
  } else {
    check_block_divides(what, rows, cols, "rows", rows, kMxBlock, "32x1 blocks down columns");
  }
}

// The Hadamard transform's: a whole number of 16-value groups.
inline void check_rht_length(const char* what, std::uint64_t n) {
  if (n % static_cast<std::uint64_t>(kRhtSize) != 0) {
    throw ShapeError(std::string(what) + ": " + std::to_string(n) +
                     " values are not a whole number of 16-value groups\nhint: the transform runs over the "
                     "dimension it is applied to in groups of 16; pad that dimension to a multiple of 16");
  }
}

// quantize_nvfp4's: cols a multiple of 16, and rows too for 16x16 tiles.
inline void check_nvfp4_shape(const char* what, std::int64_t rows, std::int64_t cols, Nvfp4Tile tile) {
  const bool square = tile == Nvfp4Tile::square_16x16;
  check_block_divides(what, rows, cols, "cols", cols, kNvfp4Block, square ? "16x16 tiles" : "1x16 blocks along rows");
  if (square) check_block_divides(what, rows, cols, "rows", rows, kNvfp4Block, "16x16 tiles");
}

}  // namespace ampscope
