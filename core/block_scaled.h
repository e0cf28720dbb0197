// core/block_scaled.h: the block-scaled formats of Blackwell-class training, MXFP8 (OCP Microscaling v1.0)
// and NVFP4 (NVIDIA), as exact host-side conversions: the E2M1 element and E8M0 scale codes, the block
// quantizers with both MX scale rules, dequantization, the 16-point random Hadamard transform NVFP4 applies
// to the weight-gradient operands, and stochastic rounding to E2M1 from a seeded Philox stream. The FP8
// element math is core/float8.h's; docs/fp8.md ("Block-scaled formats") works through blocks by hand.
//
//   MxTensor q = quantize_mxfp8(x, rows, cols, {.axis = BlockAxis::along_row});   // 1x32 blocks, round-up
//   std::vector<float> back = dequantize_mxfp8(q);
//   Nvfp4Tensor w = quantize_nvfp4(wt, rows, cols, {.tile = Nvfp4Tile::square_16x16});
//   std::vector<float> y = random_hadamard_transform(x);  // per 16 consecutive values; inverse_... undoes it
//
// Foundation only: nothing in the runtime calls these yet (no `--precision mxfp8/nvfp4`, no statistics).
//
// What each follows (read at the sources named; no code copied):
// - E2M1 and E8M0 and the MX block: the OCP Microscaling Formats (MX) v1.0 specification, and its reference
//   code microsoft/microxcaling mx/mx_ops.py (_shared_exponents, _quantize_mx) for the floor rule.
// - The round-up MX rule: TransformerEngine's MXFP8 cast kernels (transformer_engine/common/cast/mxfp8/,
//   util/ptx.cuh float_to_e8m0 and exp2f_rcp): the block amax folded with fmaxf, times
//   Quantized_Limits<OType>::max_norm_rcp (1/448 or 1/57344 rounded to float), rounded up to a power of two.
// - NVFP4: TransformerEngine's reference quantizer transformer_engine/pytorch/custom_recipes/
//   quantization_nvfp4.py (NVFP4QuantizerRef._quantize_blockwise_reference, cast_to_fp4x2,
//   get_wgrad_sign_vector, _build_hadamard_matrix, _apply_rht).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/block_scaled_elements.h"  // the element and block math, shared with the CUDA kernels
#include "core/error.h"
#include "core/float8.h"

namespace ampscope {

// ---------------------------------------------------------------------------------------------------
// E2M1 (FP4): s ee m, bias 1; no inf, no NaN. Codes 0..7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the same
// negated (8 is -0). Value = (-1)^s * 2^(e-1) * (1 + m/2) for e > 0, (-1)^s * m/2 for e == 0.
// ---------------------------------------------------------------------------------------------------
// kE2M1Max = 6 (core/block_scaled_elements.h, with the functions below: host and device code).

// e2m1_to_float(code): the value of a 4-bit code (only the low 4 bits are read), by the formula above.

// float_to_e2m1(x): float -> E2M1 code: round to nearest, ties to the even code (the code's last bit), magnitudes
// past 6 (infinities included) saturate to +-6, zero keeps its sign (-0.0f gives 8, as a small negative value that
// rounds to zero does). NaN gives code 0: E2M1 has no NaN, and TransformerEngine's reference (cast_to_fp4x2)
// leaves a NaN at its initial 0. The ties, in |x|: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
// 5 -> 4. (TE's Python reference maps an exact -0.0 to code 0, not 8, because its range tests count -0.0 as >= 0;
// the value is the same.)

// float_to_e2m1_stochastic(x, u): stochastic rounding to E2M1 with a uniform draw u in [0, 1): |x| (saturated to
// 6) lies between two neighbours lo <= |x| <= hi of the grid; the result is hi when u < (|x| - lo) / (hi - lo),
// else lo, with x's sign. An exact grid value is returned as itself whatever u. Expected value: x for |x| <= 6, to
// within the 2^-24 granularity of u (uniform_from_bits<float>). NaN gives 0, as float_to_e2m1.

// ---------------------------------------------------------------------------------------------------
// E8M0 (the MX shared scale): 8 exponent bits, bias 127, no sign, no mantissa. Code c is 2^(c - 127) for
// c in 0..254 (2^-127 .. 2^127; 2^-127 is a float subnormal, exact); 0xFF is NaN. There is no zero and no
// infinity. kE8M0NaN = 0xFF; e8m0_to_float(code) decodes (NaN for 0xFF).
// ---------------------------------------------------------------------------------------------------

// float_to_e8m0_round_up(v): a non-negative float rounded up to an E8M0 code, as TransformerEngine's float_to_e8m0
// (the emulation of Blackwell's cvt.rp.satfinite.ue8m0x2.f32): the smallest 2^(c - 127) >= v, c clamped to 0 ..
// 254, so v <= 2^-127 (0 and float subnormals up to 2^-127 included) gives 0 and v > 2^127 gives 254 (satfinite,
// as does inf); NaN gives 0xFF.

// ---------------------------------------------------------------------------------------------------
// Blocks and layouts. Matrices are row-major rows x cols f32. Codes come back one per byte in the same
// row-major order (FP4 codes are not packed two to a byte here).
// ---------------------------------------------------------------------------------------------------

// Which way a 1-D block runs: along_row = consecutive elements of a row (1xN, the "rowwise" copy: blocks
// along the contraction dimension of x in x @ W^T); along_column = down a column (Nx1, the "columnwise"
// copy used by the backward GEMMs). Scales are stored row-major: rows x cols/N for along_row,
// rows/N x cols for along_column. (enum class BlockAxis { along_row, along_column }: block_scaled_elements.h)

// The two ways of choosing an MX block's E8M0 scale (see docs/fp8.md for worked blocks):
// - floor (the OCP specification and its reference code): X = 2^(floor(log2 amax) - emax_elem), emax_elem
//   8 for E4M3 and 15 for E5M2, clamped to [2^-127, 2^127]; amax is the block's max |x| with NaN propagating.
//   A block's largest values can exceed the element's max after scaling and are clipped (satfinite).
//   A block containing a NaN or an infinity gets the NaN scale 0xFF (its elements are then all NaN,
//   stored as the element NaN code 0x7F); an all-zero block gets 2^-127 (code 0) and zero elements.
// - round_up (NVIDIA: TransformerEngine, cuBLAS): amax is folded with fmaxf from 0 (a NaN element is
//   skipped, an infinity wins); v = amax * fl(1 / elem_max) in float; the code is v rounded up to a power
//   of two (0 for v == 0 or v <= 2^-127, 0xFE for v = inf). Elements are multiplied by 2^(127 - code) in
//   float, except that code 0 multiplies by 1 and code 0xFE by 0, as TE's exp2f_rcp does (so a block whose
//   amax is below about 2.6e-36, f32 subnormals included, quantizes to zeros, and an infinity becomes NaN
//   in a block of zeros). Never clips a finite block: amax / scale <= elem_max.
// (enum class MxScaleRule { floor, round_up } and the MX block size kMxBlock = 32, OCP's k: block_scaled_elements.h)

// struct MxOptions { axis = along_row; element = e4m3; rule = round_up (NVIDIA's, the default of the libraries
// that run MXFP8) }: block_scaled_elements.h, so that the CUDA kernels' API takes it too.

struct MxTensor {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MxOptions options;
  std::vector<std::uint8_t> codes;   // rows * cols element codes, row-major
  std::vector<std::uint8_t> scales;  // E8M0 codes, layout by options.axis (see BlockAxis)
};

// The E8M0 code one block of an MX tensor gets under `rule` from that block's values (any length > 0).
std::uint8_t mx_block_scale(std::span<const float> block, Fp8Format element, MxScaleRule rule);

// Quantizes a rows x cols row-major matrix (x.size() == rows * cols) in 32-value blocks. The blocked
// dimension (cols for along_row, rows for along_column) must be a multiple of 32: anything else throws
// ShapeError naming the shape and the dimension, with a hint; a size that does not match rows * cols, or a
// negative dimension, throws ShapeError too.
MxTensor quantize_mxfp8(std::span<const float> x, std::int64_t rows, std::int64_t cols, const MxOptions& options = {});

// Element value times the block's scale, in float (exact: both are powers of two times at most 4
// significant bits, except where the product leaves float's range); a block with the NaN scale gives NaN.
std::vector<float> dequantize_mxfp8(const MxTensor& q);

// ---------------------------------------------------------------------------------------------------
// NVFP4: x ~ e2m1 * block_decode_scale (E4M3, one per 16 values) * global_decode_scale (f32, per tensor).
// The formulas, all in float as TE's reference computes them (fl() = rounded to float):
//   global_amax   = max |x| over the tensor (NaN propagating)
//   global_encode = fl(448 * 6 / global_amax), capped at FLT_MAX; 0 (global_amax = inf) becomes 1
//                   (global_amax = 0 gives inf, capped to FLT_MAX)
//   global_decode = fl(1 / global_encode)
//   multiplier    = fl(global_encode * fl(1 / 6))
//   block_decode  = e4m3(min(fl(block_amax * multiplier), 448))         (RNE; a NaN block amax gives 0x7F)
//   block_encode  = min(fl(1 / fl(e4m3_value(block_decode) * global_decode)), FLT_MAX)
//   element       = e2m1(clamp(fl(x * block_encode), -6, 6))            (RNE, or stochastic)
// The columnwise copy TE makes is the quantization of the transpose (with the Hadamard transform applied
// to it first for the weight-gradient operands), with its own global amax: pass the transpose here.
// ---------------------------------------------------------------------------------------------------
// enum class Nvfp4Tile (block_scaled_elements.h): row_1x16 = 16 consecutive values of a row (activations,
// gradients); square_16x16 = 16x16 tiles (weights), one scale per tile: rows and cols must be multiples of 16.

// Where stochastic rounding draws its uniforms: element i (row-major index) uses
// uniform_at<float>(seed, offset, i) of core/philox.h. Reproducible for a (seed, offset); not the GPU
// libraries' stream (their bits come from a different generator layout), so runs match them only in
// distribution. (struct PhiloxStream { seed, offset } and struct Nvfp4Options { tile = row_1x16;
// stochastic_rounding = false: elements rounded stochastically (gradients), from `stream`; stream }:
// block_scaled_elements.h.)

// kNvfp4Block = 16 (block_scaled_elements.h).

struct Nvfp4Tensor {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  Nvfp4Options options;
  float global_amax = 0.0f;
  float global_encode_scale = 1.0f;
  float global_decode_scale = 1.0f;
  std::vector<std::uint8_t> codes;   // rows * cols E2M1 codes (low 4 bits), row-major
  std::vector<std::uint8_t> scales;  // E4M3 block decode scales: rows x cols/16 (1x16) or rows/16 x cols/16
};

// nvfp4_global_scales(global_amax) -> Nvfp4GlobalScales {encode, decode}: the global scales of a tensor whose
// amax is `global_amax` (the first three formulas above; a NaN amax gives both that NaN, quieted).
// nvfp4_block_scale(block_amax, global_encode): the E4M3 code of a block's decode scale from its amax and the
// tensor's global encode scale. Both in block_scaled_elements.h (host and device).

// Quantizes a rows x cols row-major matrix. cols must be a multiple of 16 (and rows too for 16x16 tiles):
// anything else throws ShapeError with a hint; so does a size that does not match rows * cols.
Nvfp4Tensor quantize_nvfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                           const Nvfp4Options& options = {});

// e2m1_value * fl(e4m3_value(block scale) * global_decode_scale), in float.
std::vector<float> dequantize_nvfp4(const Nvfp4Tensor& q);

// ---------------------------------------------------------------------------------------------------
// The 16-point random Hadamard transform: each run of 16 consecutive values v (a row vector) becomes
// v * T with T = (1/4) * D * H16, H16 the Sylvester Hadamard matrix (H1 = [1], H2n = [[Hn, Hn], [Hn, -Hn]])
// and D = diag(kRhtSigns), TransformerEngine's fixed sign vector (get_wgrad_sign_vector). T is orthogonal
// (T T^T = (1/16) D H H^T D = I), so the inverse is v * T^T = v * (1/4) * H16 * D. Each output is the sum
// of its 16 terms in double, rounded once to float: not bit-identical to TE's tensor-core transform.
// The input length must be a multiple of 16 (ShapeError otherwise). A GPU summing the same terms in double in
// the same order gets the same bits (block_scaled_elements.h's rht16_forward / rht16_inverse, which both run).
// ---------------------------------------------------------------------------------------------------
inline constexpr float kRhtSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

std::vector<float> random_hadamard_transform(std::span<const float> x);
std::vector<float> inverse_random_hadamard_transform(std::span<const float> y);

}  // namespace ampscope
