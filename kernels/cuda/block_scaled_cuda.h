// kernels/cuda/block_scaled_cuda.h: the block-scaled conversions of core/block_scaled.h (MXFP8, NVFP4, the 16-point
// random Hadamard transform) on a CUDA device (issue 35). Host code only; only built with AMPSCOPE_WITH_CUDA.
// docs/cuda.md ("Block-scaled conversions") says what matches the CPU and what a GPU run still owes.
//
//   cuda::mxfp8_quantize(backend, {.x = x_dev, .rows = 64, .cols = 96, .options = {}, .codes = c, .scales = s});
//   cuda::nvfp4_quantize(backend, {.x = w_dev, .rows = 32, .cols = 32,
//                                  .options = {.tile = Nvfp4Tile::square_16x16},
//                                  .codes = c, .scales = s, .globals = g});
//
// Device pointers in, device pointers out, laid out as the CPU's MxTensor / Nvfp4Tensor fields (row-major f32
// values, one code per byte, scales as core/block_scaled.h's BlockAxis and Nvfp4Tile say). Every block, tile and
// element is computed by core/block_scaled_elements.h's functions, the ones the CPU runs, so codes and scales are
// the CPU's bytes, and the floats (global scales, dequantized values) the CPU's bits; the transform's outputs are
// the CPU's bits wherever they are not NaN (a NaN output is NaN on both, with the hardware's bits).
//
// Each call is ordered after everything queued on `backend` and finished before it returns (as kernels/cuda/
// fp8_cuda.h's calls). Errors: DeviceError for a backend that is not CUDA's; ShapeError, with the CPU functions'
// text (the same checks, core/block_scaled_elements.h, naming "... (CUDA)"), for a shape the CPU refuses, before
// any device work; DeviceRuntimeError for a failed CUDA call or launch.
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "core/block_scaled_elements.h"

namespace ampscope::cuda {

struct MxQuantizeDeviceArgs {
  const float* x = nullptr;  // rows * cols values
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MxOptions options;
  std::uint8_t* codes = nullptr;   // rows * cols
  std::uint8_t* scales = nullptr;  // rows * cols / 32
};
// quantize_mxfp8 on the device.
void mxfp8_quantize(Backend& backend, const MxQuantizeDeviceArgs& args);

struct MxDequantizeDeviceArgs {
  const std::uint8_t* codes = nullptr;
  const std::uint8_t* scales = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MxOptions options;  // axis and element (the rule is not needed to decode)
  float* out = nullptr;  // rows * cols
};
// dequantize_mxfp8 on the device.
void mxfp8_dequantize(Backend& backend, const MxDequantizeDeviceArgs& args);

struct Nvfp4QuantizeDeviceArgs {
  const float* x = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  Nvfp4Options options;
  std::uint8_t* codes = nullptr;   // rows * cols E2M1 codes (low 4 bits)
  std::uint8_t* scales = nullptr;  // rows x cols/16 (1x16) or rows/16 x cols/16 E4M3 codes
  float* globals = nullptr;        // 3 floats: global_amax, global_encode_scale, global_decode_scale
};
// quantize_nvfp4 on the device, the global amax reduced on the device too (nothing is read back to the host).
void nvfp4_quantize(Backend& backend, const Nvfp4QuantizeDeviceArgs& args);

struct Nvfp4DequantizeDeviceArgs {
  const std::uint8_t* codes = nullptr;
  const std::uint8_t* scales = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  Nvfp4Tile tile = Nvfp4Tile::row_1x16;
  const float* globals = nullptr;  // as nvfp4_quantize wrote them (only [2], the decode scale, is read)
  float* out = nullptr;
};
// dequantize_nvfp4 on the device.
void nvfp4_dequantize(Backend& backend, const Nvfp4DequantizeDeviceArgs& args);

// random_hadamard_transform / inverse_random_hadamard_transform of n device floats (n a multiple of 16) into y.
void random_hadamard_transform(Backend& backend, const float* x, std::int64_t n, float* y);
void inverse_random_hadamard_transform(Backend& backend, const float* y, std::int64_t n, float* x);

}  // namespace ampscope::cuda
