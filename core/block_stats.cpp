// core/block_stats.cpp: the statistics of a block-scaled quantization (see block_stats.h for each field).
//
// Both formats go through one accumulation (accumulate below): the format-specific part is only which block
// each element belongs to, the value each element was scaled to before rounding (to tell a clipped value),
// the dequantized values (dequantize_mxfp8 / dequantize_nvfp4, the tested decoders) and each block's decode
// scale.
#include "core/block_stats.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/float8.h"

namespace ampscope {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

void check_values(const char* what, std::size_t size, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) != size) {
    throw ShapeError(std::string(what) + ": " + std::to_string(size) + " values for a " + std::to_string(rows) +
                     "x" + std::to_string(cols) +
                     " quantized matrix\nhint: pass exactly the values that were quantized, row-major, "
                     "rows * cols of them");
  }
}

// What the format-specific code hands to the accumulation, one entry per element (row-major) or per block.
struct Layout {
  std::vector<std::int64_t> block_of;  // element -> block number (the order of the scales)
  std::vector<bool> clipped;           // element's |scaled value| exceeded the element max before rounding
  std::vector<float> dequantized;
  std::vector<double> scale_log2;      // block -> log2 of its decode scale; NaN when the scale is NaN
};

BlockStats accumulate(std::span<const float> x, const Layout& l) {
  BlockStats s;
  s.numel = static_cast<std::int64_t>(x.size());
  s.blocks = static_cast<std::int64_t>(l.scale_log2.size());
  const std::size_t nb = l.scale_log2.size();
  std::vector<std::int64_t> block_underflow(nb, 0);
  std::vector<bool> block_clipped(nb, false), block_nan(nb, false);
  // Per block: the largest and the smallest non-zero finite magnitude.
  std::vector<double> block_amax(nb, 0.0), block_min(nb, std::numeric_limits<double>::infinity());
  double err2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t b = static_cast<std::size_t>(l.block_of[i]);
    const double v = x[i];
    const double d = l.dequantized[i];
    if (std::isnan(d)) block_nan[b] = true;
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      block_nan[b] = true;
      continue;
    }
    const double a = std::fabs(v);
    if (a != 0.0) {
      ++s.nonzero;
      block_amax[b] = std::max(block_amax[b], a);
      block_min[b] = std::min(block_min[b], a);
      if (d == 0.0) {  // -0 included
        ++s.underflow;
        ++block_underflow[b];
      }
    }
    // A value whose dequantized value is 0 was lost, not clipped (NVFP4's zero block scale: its elements are
    // multiplied by FLT_MAX and clamped to 6, then decoded with a scale of 0); it is counted as underflow only.
    if (l.clipped[i] && d != 0.0) {
      ++s.saturated;
      block_clipped[b] = true;
    }
    if (std::isfinite(d)) {
      err2 += (d - v) * (d - v);
      ref2 += v * v;
    }
  }
  for (std::size_t b = 0; b < nb; ++b) {
    if (block_clipped[b]) ++s.blocks_clipped;
    if (block_nan[b]) ++s.blocks_nan;
    if (block_min[b] < block_amax[b]) {
      const double range = std::log2(block_amax[b]) - std::log2(block_min[b]);
      if (range > s.max_block_range) {
        s.max_block_range = range;
        s.max_range_block = static_cast<std::int64_t>(b);
      }
    }
    if (block_underflow[b] > s.worst_block_underflow) {
      s.worst_block_underflow = block_underflow[b];
      s.worst_block = static_cast<std::int64_t>(b);
    }
  }
  std::vector<double> scales;
  scales.reserve(nb);
  for (double v : l.scale_log2) {
    if (!std::isnan(v)) scales.push_back(v);
  }
  if (!scales.empty()) {
    std::sort(scales.begin(), scales.end());
    s.scale_log2_min = scales.front();
    s.scale_log2_max = scales.back();
    s.scale_log2_median = scales[(scales.size() - 1) / 2];
  } else {
    s.scale_log2_min = s.scale_log2_median = s.scale_log2_max = kNaN;
  }
  s.rel_rms_error = ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0;
  return s;
}

}  // namespace

BlockStats mxfp8_block_stats(std::span<const float> x, const MxTensor& q) {
  check_values("mxfp8_block_stats", x.size(), q.rows, q.cols);
  const bool along_row = q.options.axis == BlockAxis::along_row;
  const std::int64_t blocks_per_line = along_row ? q.cols / kMxBlock : q.cols;
  const std::int64_t n_blocks = q.rows * q.cols / kMxBlock;
  if (static_cast<std::int64_t>(q.scales.size()) != n_blocks) {
    throw ShapeError("mxfp8_block_stats: " + std::to_string(q.scales.size()) + " scales for a " +
                     std::to_string(q.rows) + "x" + std::to_string(q.cols) +
                     " matrix, expected one per 32-value block\nhint: pass an MxTensor made by quantize_mxfp8");
  }
  Layout l;
  l.dequantized = dequantize_mxfp8(q);
  l.block_of.resize(x.size());
  l.clipped.assign(x.size(), false);
  l.scale_log2.resize(static_cast<std::size_t>(n_blocks));
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t c = q.scales[static_cast<std::size_t>(b)];
    l.scale_log2[static_cast<std::size_t>(b)] = c == kE8M0NaN ? kNaN : static_cast<double>(c) - 127.0;
  }
  const double elem_max = fp8_max(q.options.element);
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      const std::int64_t b = along_row ? r * blocks_per_line + c / kMxBlock : (r / kMxBlock) * blocks_per_line + c;
      l.block_of[i] = b;
      const std::uint8_t code = q.scales[static_cast<std::size_t>(b)];
      if (code == kE8M0NaN || !std::isfinite(x[i])) continue;
      // The value the element rounding saw. Floor rule: x / 2^(code - 127), exact. Round-up rule: x times TE's
      // exp2f_rcp multiplier (2^(127 - code); 1 for code 0, 0 for code 254), in float as the quantizer does.
      double scaled;
      if (q.options.rule == MxScaleRule::floor) {
        scaled = std::ldexp(static_cast<double>(x[i]), 127 - static_cast<int>(code));
      } else {
        const float mult = code == 0 ? 1.0f : code == 254 ? 0.0f : std::ldexp(1.0f, 127 - static_cast<int>(code));
        scaled = x[i] * mult;
      }
      l.clipped[i] = std::fabs(scaled) > elem_max;
    }
  }
  return accumulate(x, l);
}

BlockStats nvfp4_block_stats(std::span<const float> x, const Nvfp4Tensor& q) {
  check_values("nvfp4_block_stats", x.size(), q.rows, q.cols);
  const bool square = q.options.tile == Nvfp4Tile::square_16x16;
  const std::int64_t scale_cols = q.cols / kNvfp4Block;
  const std::int64_t scale_rows = square ? q.rows / kNvfp4Block : q.rows;
  if (q.cols % kNvfp4Block != 0 || (square && q.rows % kNvfp4Block != 0) ||
      static_cast<std::int64_t>(q.scales.size()) != scale_rows * scale_cols) {
    throw ShapeError("nvfp4_block_stats: " + std::to_string(q.scales.size()) + " scales do not fit a " +
                     std::to_string(q.rows) + "x" + std::to_string(q.cols) +
                     " matrix in its tiles\nhint: pass an Nvfp4Tensor made by quantize_nvfp4");
  }
  Layout l;
  l.dequantized = dequantize_nvfp4(q);
  l.block_of.resize(x.size());
  l.clipped.assign(x.size(), false);
  const std::size_t nb = static_cast<std::size_t>(scale_rows * scale_cols);
  l.scale_log2.resize(nb);
  std::vector<float> block_encode(nb);
  for (std::size_t b = 0; b < nb; ++b) {
    // The decode scale dequantize_nvfp4 multiplies by, and the encode scale quantize_nvfp4 multiplied by
    // (min(fl(1 / decode), FLT_MAX), a NaN kept).
    const float decode = e4m3_to_float(q.scales[b]) * q.global_decode_scale;
    l.scale_log2[b] = std::isnan(decode) ? kNaN : std::log2(static_cast<double>(decode));
    const float enc = 1.0f / decode;
    block_encode[b] = enc > FLT_MAX ? FLT_MAX : enc;
  }
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      const std::int64_t b = (square ? r / kNvfp4Block : r) * scale_cols + c / kNvfp4Block;
      l.block_of[i] = b;
      if (!std::isfinite(x[i])) continue;
      const float scaled = x[i] * block_encode[static_cast<std::size_t>(b)];
      l.clipped[i] = std::fabs(scaled) > kE2M1Max;  // false for NaN
    }
  }
  return accumulate(x, l);
}

namespace {

void check_block(const char* what, std::int64_t block, std::int64_t blocks) {
  if (block < 0 || block >= blocks) {
    throw IndexError(std::string(what) + ": block " + std::to_string(block) + " of a tensor with " +
                     std::to_string(blocks) + " blocks\nhint: blocks are numbered 0 .. blocks - 1 in the order "
                     "of the tensor's scales");
  }
}

}  // namespace

BlockOrigin block_origin(const MxTensor& q, std::int64_t block) {
  check_block("block_origin", block, static_cast<std::int64_t>(q.scales.size()));
  if (q.options.axis == BlockAxis::along_row) {
    const std::int64_t per_row = q.cols / kMxBlock;
    return {block / per_row, (block % per_row) * kMxBlock};
  }
  return {(block / q.cols) * kMxBlock, block % q.cols};
}

BlockOrigin block_origin(const Nvfp4Tensor& q, std::int64_t block) {
  check_block("block_origin", block, static_cast<std::int64_t>(q.scales.size()));
  const std::int64_t per_row = q.cols / kNvfp4Block;
  const std::int64_t row = block / per_row;
  const std::int64_t col = (block % per_row) * kNvfp4Block;
  return {q.options.tile == Nvfp4Tile::square_16x16 ? row * kNvfp4Block : row, col};
}

}  // namespace ampscope
