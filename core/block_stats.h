// core/block_stats.h: what quantizing a GEMM operand to a block-scaled format (MXFP8, NVFP4; core/block_scaled.h)
// did to its values, block by block: the statistics the probe records per operand and copy (--precision
// mxfp8|nvfp4) and per format asked for with --what-if, and the evidence the block-scaled diagnoses cite.
//
//   MxTensor q = quantize_mxfp8(x, rows, cols, options);
//   BlockStats s = mxfp8_block_stats(x, q);        // x: exactly the values that were quantized
//
// Everything is counted over the values the quantizer saw (for NVFP4 weight-gradient operands: after the
// Hadamard transform), in double where it sums. Blocks are numbered in the order of the tensor's scales
// (row-major over the scale layout: core/block_scaled.h BlockAxis, Nvfp4Tile); block_origin gives a block's
// first element.
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "core/block_scaled.h"

namespace ampscope {

struct BlockStats {
  std::int64_t numel = 0;
  std::int64_t nonzero = 0;    // finite values != 0
  std::int64_t nonfinite = 0;  // NaN or +-inf in the input
  // Finite non-zero values whose dequantized value is 0 (lost to the block's scale).
  std::int64_t underflow = 0;
  // Finite values whose magnitude after scaling (the value the element rounding saw, before saturation) exceeded
  // the element's max, strictly, and were clipped to it (the MX floor rule's clipping, NVFP4's clamp to +-6);
  // never counted under MX round-up for a finite block. A value is counted under at most one of underflow and
  // saturated: one that comes back 0 is underflow (NVFP4's zero block scale multiplies by FLT_MAX, clamps to 6 and
  // decodes to 0). Under NVFP4 the block holding the global amax can count its largest value here when float
  // rounding of the scales puts it a few ulps past 6: that clip changes nothing.
  std::int64_t saturated = 0;
  std::int64_t blocks = 0;
  std::int64_t blocks_clipped = 0;  // blocks with at least one saturated value
  std::int64_t blocks_nan = 0;      // blocks with a value that dequantizes to NaN (MX NaN scale, NVFP4 NaN global
                                    // amax) or that hold a non-finite input
  // The largest block dynamic range: max over blocks of log2(block amax) - log2(smallest non-zero |x| in the
  // block), over finite values; 0 when no block holds two different non-zero magnitudes. max_range_block: that
  // block (the first such), -1 when the largest range is 0.
  double max_block_range = 0;
  std::int64_t max_range_block = -1;
  // The block that lost the most non-zero values to underflow (the first such), -1 when none underflowed; and
  // how many it lost.
  std::int64_t worst_block = -1;
  std::int64_t worst_block_underflow = 0;
  // The distribution of block decode scales, as log2 of the value each block's elements are multiplied by (MX:
  // code - 127; NVFP4: log2(e4m3 value of the block scale * global decode scale), -inf for a zero block scale):
  // min, median (the lower middle of an even count) and max over blocks with a non-NaN scale; NaN when none.
  double scale_log2_min = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_median = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_max = std::numeric_limits<double>::quiet_NaN();
  // sqrt(sum (dequantized - x)^2 / sum x^2) over finite inputs whose dequantized value is finite, in double; 0 when
  // sum x^2 is 0 (an all-zero tensor, or one whose every block decodes to NaN).
  double rel_rms_error = 0;
};

// Statistics of q = quantize_mxfp8(x, ...) (x the same values, row-major as q). Throws ShapeError when x's size is
// not q.rows * q.cols.
BlockStats mxfp8_block_stats(std::span<const float> x, const MxTensor& q);
// Statistics of q = quantize_nvfp4(x, ...).
BlockStats nvfp4_block_stats(std::span<const float> x, const Nvfp4Tensor& q);

// The (row, col) of a block's first element in the quantized matrix.
struct BlockOrigin {
  std::int64_t row = 0;
  std::int64_t col = 0;
};
// A block outside 0 .. blocks - 1 throws IndexError.
BlockOrigin block_origin(const MxTensor& q, std::int64_t block);
BlockOrigin block_origin(const Nvfp4Tensor& q, std::int64_t block);

}  // namespace ampscope
