// The block-scaled conversion kernels (kernels/cuda/block_scaled_launch.h): MXFP8 and NVFP4 quantization and
// dequantization, NVFP4's global amax, the 16-point Hadamard transform. Every block's, tile's and element's math
// is core/block_scaled_elements.h's host/device functions, the ones core/block_scaled.cpp runs on the CPU, so a
// code, a scale and a transformed value are the CPU's bits. Simple on purpose: one thread per block or tile (the
// CPU's loop over its values, in its order); no shared-memory staging, no vector loads.
#include <cstdint>

#include "core/block_scaled_elements.h"
#include "core/float16.h"
#include "kernels/cuda/block_scaled_launch.h"
#include "kernels/cuda/grid.h"

namespace ampscope::cuda {
namespace {

__device__ std::int64_t first_thread() { return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::int64_t thread_stride() { return static_cast<std::int64_t>(blockDim.x) * gridDim.x; }

__global__ void mx_quantize_kernel(const float* x, std::int64_t rows, std::int64_t cols, BlockAxis axis,
                                   Fp8Format element, MxScaleRule rule, std::uint8_t* codes, std::uint8_t* scales) {
  const std::int64_t n_blocks = rows * cols / kMxBlock;
  const std::int64_t stride = mx_block_stride(cols, axis);
  for (std::int64_t b = first_thread(); b < n_blocks; b += thread_stride()) {
    // The CPU's block b (core/block_scaled.cpp quantize_mxfp8): down a column, neighbouring threads read
    // neighbouring addresses.
    const std::int64_t first = mx_block_first(b, cols, axis);
    scales[b] = mx_quantize_block(x + first, stride, element, rule, codes + first);
  }
}

__global__ void mx_dequantize_kernel(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                     std::int64_t cols, BlockAxis axis, Fp8Format element, float* out) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = first_thread(); i < n; i += thread_stride()) {
    out[i] = mx_dequantize_element(codes[i], scales[mx_scale_index(i / cols, i % cols, cols, axis)], element);
  }
}

constexpr unsigned long long kNoNan = ~0ull;

// scratch[0] = max over the non-NaN |x[i]| as float bits (they order as the values: all are +0 .. +inf);
// scratch[1] = the smallest index of a NaN. Both exact in any order (a max and a min).
__global__ void nvfp4_amax_kernel(const float* x, std::int64_t n, unsigned long long* scratch) {
  float local = 0.0f;
  unsigned long long nan_at = kNoNan;
  for (std::int64_t i = first_thread(); i < n; i += thread_stride()) {
    const float a = detail::abs_float(x[i]);
    if (detail::is_nan_float(a)) {
      if (static_cast<unsigned long long>(i) < nan_at) nan_at = static_cast<unsigned long long>(i);
    } else if (a > local) {
      local = a;
    }
  }
  __shared__ float block_max[kThreads];
  __shared__ unsigned long long block_nan[kThreads];
  block_max[threadIdx.x] = local;
  block_nan[threadIdx.x] = nan_at;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      block_max[threadIdx.x] = fmaxf(block_max[threadIdx.x], block_max[threadIdx.x + half]);
      block_nan[threadIdx.x] = min(block_nan[threadIdx.x], block_nan[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicMax(&scratch[0], static_cast<unsigned long long>(__float_as_uint(block_max[0])));
    if (block_nan[0] != kNoNan) atomicMin(&scratch[1], block_nan[0]);
  }
}

// The CPU's amax is the magnitude of the first NaN when there is one (its loop stops there), else the max.
__global__ void nvfp4_global_kernel(const float* x, const unsigned long long* scratch, float* globals) {
  const float amax = scratch[1] != kNoNan ? detail::abs_float(x[scratch[1]])
                                          : __uint_as_float(static_cast<unsigned>(scratch[0]));
  const Nvfp4GlobalScales g = nvfp4_global_scales(amax);
  globals[0] = amax;
  globals[1] = g.encode;
  globals[2] = g.decode;
}

__global__ void nvfp4_quantize_kernel(const float* x, std::int64_t rows, std::int64_t cols, Nvfp4Tile tile,
                                      bool stochastic, std::uint64_t seed, std::uint64_t offset, const float* globals,
                                      std::uint8_t* codes, std::uint8_t* scales) {
  const bool square = tile == Nvfp4Tile::square_16x16;
  const std::int64_t tile_rows = square ? kNvfp4Block : 1;
  const std::int64_t scale_cols = cols / kNvfp4Block;
  const std::int64_t n_tiles = (rows / tile_rows) * scale_cols;
  const Nvfp4GlobalScales g{globals[1], globals[2]};
  for (std::int64_t t = first_thread(); t < n_tiles; t += thread_stride()) {
    const std::int64_t sr = t / scale_cols, sc = t % scale_cols;
    scales[t] = nvfp4_quantize_tile(x, cols, sr * tile_rows, tile_rows, sc * kNvfp4Block, g, stochastic, seed, offset,
                                    codes);
  }
}

__global__ void nvfp4_dequantize_kernel(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                        std::int64_t cols, Nvfp4Tile tile, const float* global_decode, float* out) {
  const std::int64_t n = rows * cols;
  const float decode = *global_decode;
  for (std::int64_t i = first_thread(); i < n; i += thread_stride()) {
    out[i] = nvfp4_dequantize_element(codes[i], scales[nvfp4_scale_index(i / cols, i % cols, cols, tile)], decode);
  }
}

__global__ void rht16_kernel(const float* x, std::int64_t n, bool inverse, float* y) {
  for (std::int64_t k = first_thread(); k < n; k += thread_stride()) {
    const std::int64_t g = k - k % kRhtSize;
    const int j = static_cast<int>(k % kRhtSize);
    y[k] = inverse ? rht16_inverse(x + g, j) : rht16_forward(x + g, j);
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(linear_blocks(n)); }

}  // namespace

cudaError_t launch_mx_quantize(const float* x, std::int64_t rows, std::int64_t cols, BlockAxis axis, Fp8Format element,
                               MxScaleRule rule, std::uint8_t* codes, std::uint8_t* scales, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const std::int64_t n_blocks = rows * cols / kMxBlock;
  if (n_blocks == 0) return cudaSuccess;
  mx_quantize_kernel<<<blocks_for(n_blocks), kThreads, 0, stream>>>(x, rows, cols, axis, element, rule, codes, scales);
  return cudaGetLastError();
}

cudaError_t launch_mx_dequantize(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                 std::int64_t cols, BlockAxis axis, Fp8Format element, float* out, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows * cols == 0) return cudaSuccess;
  mx_dequantize_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(codes, scales, rows, cols, axis, element, out);
  return cudaGetLastError();
}

cudaError_t launch_nvfp4_global_scales(const float* x, std::int64_t n, unsigned long long* scratch, float* globals,
                                       cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(scratch, 0, sizeof(unsigned long long), stream);  // +0.0f's bits
  if (e == cudaSuccess) e = cudaMemsetAsync(scratch + 1, 0xFF, sizeof(unsigned long long), stream);  // kNoNan
  if (e != cudaSuccess) return e;
  if (n > 0) {
    nvfp4_amax_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, scratch);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  nvfp4_global_kernel<<<1, 1, 0, stream>>>(x, scratch, globals);
  return cudaGetLastError();
}

cudaError_t launch_nvfp4_quantize(const float* x, std::int64_t rows, std::int64_t cols, Nvfp4Tile tile,
                                  bool stochastic, std::uint64_t seed, std::uint64_t offset, const float* globals,
                                  std::uint8_t* codes, std::uint8_t* scales, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const std::int64_t tile_rows = tile == Nvfp4Tile::square_16x16 ? kNvfp4Block : 1;
  const std::int64_t n_tiles = (rows / tile_rows) * (cols / kNvfp4Block);
  if (n_tiles == 0) return cudaSuccess;
  nvfp4_quantize_kernel<<<blocks_for(n_tiles), kThreads, 0, stream>>>(x, rows, cols, tile, stochastic, seed, offset,
                                                                       globals, codes, scales);
  return cudaGetLastError();
}

cudaError_t launch_nvfp4_dequantize(const std::uint8_t* codes, const std::uint8_t* scales, std::int64_t rows,
                                    std::int64_t cols, Nvfp4Tile tile, const float* global_decode, float* out,
                                    cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows * cols == 0) return cudaSuccess;
  nvfp4_dequantize_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(codes, scales, rows, cols, tile,
                                                                            global_decode, out);
  return cudaGetLastError();
}

cudaError_t launch_rht16(const float* x, std::int64_t n, bool inverse, float* y, cudaStream_t stream) {
  if (n < 0 || n % kRhtSize != 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  rht16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, inverse, y);
  return cudaGetLastError();
}

}  // namespace ampscope::cuda
