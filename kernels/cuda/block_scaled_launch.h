// kernels/cuda/block_scaled_launch.h: the launchers of kernels/cuda/block_scaled_kernels.cu, the only way into it
// (block_scaled_cuda.cpp and the GPU tests call them). Each takes the stream and returns the launch status; no
// exceptions cross the .cu boundary (nvcc 13 cannot compile fmt at C++20). Every pointer is device memory; the
// matrices are row-major f32, codes one per byte, scales laid out as core/block_scaled.h says. Shapes are checked
// by the caller (block_scaled_cuda.cpp); these only return cudaErrorInvalidValue for a negative size.
//
//   cudaError_t e = launch_mx_quantize(x, 64, 96, BlockAxis::along_row, Fp8Format::e4m3, MxScaleRule::round_up,
//                                      codes, scales, stream);
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/block_scaled_elements.h"

namespace ampscope::cuda {

// One thread per 32-value block: scales[b] = mx_quantize_block(...) of core/block_scaled_elements.h, the
// function core's quantize_mxfp8 calls for the same block.
cudaError_t launch_mx_quantize(const float* x, std::int64_t rows, std::int64_t cols, BlockAxis axis, Fp8Format element,
                               MxScaleRule rule, std::uint8_t* codes, std::uint8_t* scales, cudaStream_t stream);

// out[i] = mx_dequantize_element(codes[i], the scale of i's block, element).
cudaError_t launch_mx_dequantize(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                 std::int64_t cols, BlockAxis axis, Fp8Format element, float* out, cudaStream_t stream);

// globals[0] = the tensor's amax as core's quantize_nvfp4 finds it (max |x|; with a NaN anywhere, the magnitude of
// the first NaN in row-major order, its bits kept), globals[1] and [2] = nvfp4_global_scales(globals[0]).encode and
// .decode. scratch: two 64-bit words of device memory, written by this launch. Three launches (clear, fold, one
// thread to finish), all on `stream`.
cudaError_t launch_nvfp4_global_scales(const float* x, std::int64_t n, unsigned long long* scratch, float* globals,
                                       cudaStream_t stream);

// One thread per tile (1x16 or 16x16): scales[t] = nvfp4_quantize_tile(...) with the global scales read from
// globals[1..2] (launch_nvfp4_global_scales' output); stochastic rounding draws uniform_at<float>(seed, offset, i)
// for element i, as the CPU does.
cudaError_t launch_nvfp4_quantize(const float* x, std::int64_t rows, std::int64_t cols, Nvfp4Tile tile,
                                  bool stochastic, std::uint64_t seed, std::uint64_t offset, const float* globals,
                                  std::uint8_t* codes, std::uint8_t* scales, cudaStream_t stream);

// out[i] = nvfp4_dequantize_element(codes[i], the scale of i's tile, *global_decode).
cudaError_t launch_nvfp4_dequantize(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                    std::int64_t cols, Nvfp4Tile tile, const float* global_decode, float* out,
                                    cudaStream_t stream);

// One thread per output: y[16 g + j] = rht16_forward(x + 16 g, j), or rht16_inverse with `inverse`. n must be a
// multiple of 16 (checked by the caller).
cudaError_t launch_rht16(const float* x, std::int64_t n, bool inverse, float* y, cudaStream_t stream);

}  // namespace ampscope::cuda
