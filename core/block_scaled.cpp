// core/block_scaled.cpp: MXFP8 and NVFP4 block quantization (see block_scaled.h for the formulas and sources).
#include "core/block_scaled.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/philox.h"

namespace ampscope {

// The element and block math (E2M1, E8M0, one MX block, one NVFP4 tile, one Hadamard output) is
// core/block_scaled_elements.h's, shared with the CUDA kernels; this file walks the tensors and checks shapes.

// ------------------------------------------------------------------------------------------------- MX

std::uint8_t mx_block_scale(std::span<const float> block, Fp8Format element, MxScaleRule rule) {
  return mx_block_scale_strided(block.data(), 1, static_cast<std::int64_t>(block.size()), element, rule);
}

MxTensor quantize_mxfp8(std::span<const float> x, std::int64_t rows, std::int64_t cols, const MxOptions& options) {
  check_block_matrix("quantize_mxfp8", x.size(), rows, cols);
  check_mx_shape("quantize_mxfp8", rows, cols, options.axis);
  MxTensor q;
  q.rows = rows;
  q.cols = cols;
  q.options = options;
  q.codes.assign(x.size(), 0);
  const std::int64_t n_blocks = rows * cols / kMxBlock;
  q.scales.assign(static_cast<std::size_t>(n_blocks), 0);

  const std::int64_t stride = mx_block_stride(cols, options.axis);
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::int64_t first = mx_block_first(b, cols, options.axis);
    q.scales[static_cast<std::size_t>(b)] =
        mx_quantize_block(x.data() + first, stride, options.element, options.rule, q.codes.data() + first);
  }
  return q;
}

std::vector<float> dequantize_mxfp8(const MxTensor& q) {
  check_block_matrix("dequantize_mxfp8", q.codes.size(), q.rows, q.cols);
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
      const std::size_t s = static_cast<std::size_t>(mx_scale_index(r, c, q.cols, q.options.axis));
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      out[i] = mx_dequantize_element(q.codes[i], q.scales[s], q.options.element);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- NVFP4

Nvfp4Tensor quantize_nvfp4(std::span<const float> x, std::int64_t rows, std::int64_t cols,
                           const Nvfp4Options& options) {
  check_block_matrix("quantize_nvfp4", x.size(), rows, cols);
  check_nvfp4_shape("quantize_nvfp4", rows, cols, options.tile);
  const bool square = options.tile == Nvfp4Tile::square_16x16;

  Nvfp4Tensor q;
  q.rows = rows;
  q.cols = cols;
  q.options = options;
  // torch.max(torch.abs(x)): NaN propagates (the first NaN's magnitude).
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
      q.scales[static_cast<std::size_t>(sr * scale_cols + sc)] =
          nvfp4_quantize_tile(x.data(), cols, sr * tile_rows, tile_rows, sc * kNvfp4Block, g,
                              options.stochastic_rounding, options.stream.seed, options.stream.offset, q.codes.data());
    }
  }
  return q;
}

std::vector<float> dequantize_nvfp4(const Nvfp4Tensor& q) {
  check_block_matrix("dequantize_nvfp4", q.codes.size(), q.rows, q.cols);
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
      const std::uint8_t scale = q.scales[static_cast<std::size_t>(nvfp4_scale_index(r, c, q.cols, q.options.tile))];
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      out[i] = nvfp4_dequantize_element(q.codes[i], scale, q.global_decode_scale);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------- Hadamard

std::vector<float> random_hadamard_transform(std::span<const float> x) {
  check_rht_length("random_hadamard_transform", x.size());
  std::vector<float> y(x.size());
  for (std::size_t g = 0; g < x.size(); g += kRhtSize) {
    for (int j = 0; j < kRhtSize; ++j) y[g + static_cast<std::size_t>(j)] = rht16_forward(x.data() + g, j);
  }
  return y;
}

std::vector<float> inverse_random_hadamard_transform(std::span<const float> y) {
  check_rht_length("inverse_random_hadamard_transform", y.size());
  std::vector<float> x(y.size());
  for (std::size_t g = 0; g < y.size(); g += kRhtSize) {
    for (int i = 0; i < kRhtSize; ++i) x[g + static_cast<std::size_t>(i)] = rht16_inverse(y.data() + g, i);
  }
  return x;
}

}  // namespace ampscope
