// The FP8 kernels (kernels/cuda/fp8_launch.h): quantization with the amax fused in, decode, byte transpose, the
// exact scaled GEMM, and the hardware conversion the tests compare against. Every element's math is
// core/float8.h's host/device functions, so a code is the CPU's code bit for bit.
#include <cuda_fp8.h>

#include <cstdint>

#include "core/convert.h"
#include "core/float16.h"
#include "core/float8.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_launch.h"
#include "kernels/cuda/grid.h"

namespace ampscope::cuda {
namespace {

template <class T>
__global__ void fp8_quantize_kernel(TensorView x, float scale, Fp8Format format, Fp8Overflow overflow,
                                    std::uint8_t* codes, float* amax) {
  const T* p = static_cast<const T*>(x.data);
  float local = 0.0f;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < x.numel; i += stride) {
    // The CPU reads the operand as f32 (matrix.to(f32)): an f64 element is rounded to float first.
    const float v = convert<float>(p[x.offset_of(i)]);
    local = fmaxf(fabsf(v), local);  // NaN skipped (fmaxf returns the other operand), inf wins
    codes[i] = detail::float_to_fp8_bits(v * scale, format, overflow);
  }
  if (amax == nullptr) return;
  __shared__ float block_max[kThreads];
  block_max[threadIdx.x] = local;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) block_max[threadIdx.x] = fmaxf(block_max[threadIdx.x], block_max[threadIdx.x + half]);
    __syncthreads();
  }
  // The fold never holds a NaN, so the value is +0 .. +inf, whose bits order as the values do.
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(block_max[0]));
}

__global__ void fp8_decode_kernel(const std::uint8_t* codes, std::int64_t n, Fp8Format format, float* out) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = detail::fp8_bits_to_float(codes[i], format);
  }
}

__global__ void fp8_encode_hardware_kernel(const float* x, std::int64_t n, Fp8Format format, std::uint8_t* codes) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    codes[i] = static_cast<std::uint8_t>(
        __nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2));
  }
}

__global__ void fp8_transpose_kernel(const std::uint8_t* in, std::int64_t rows, std::int64_t cols,
                                     std::uint8_t* out) {
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const std::int64_t c = k / rows, r = k % rows;  // out[c][r], written in order
    out[k] = in[r * cols + c];
  }
}

template <class T>
__device__ void store_as(void* out, std::int64_t k, float y) {
  static_cast<T*>(out)[k] = convert<T>(y);
}

__global__ void fp8_gemm_exact_kernel(Fp8GemmArgs g, std::int64_t I, std::int64_t P, std::int64_t J) {
  // The 256 decoded values of each operand's format: decoding is exact, so a table is the formula.
  __shared__ float table_a[256], table_b[256];
  for (int c = threadIdx.x; c < 256; c += blockDim.x) {
    table_a[c] = detail::fp8_bits_to_float(static_cast<std::uint8_t>(c), g.a_format);
    table_b[c] = detail::fp8_bits_to_float(static_cast<std::uint8_t>(c), g.b_format);
  }
  __syncthreads();
  // op(A)[i][p] and op(B)[p][j] in the stored row-major matrices.
  const std::int64_t a_i = g.transpose_a ? 1 : g.a_cols, a_p = g.transpose_a ? g.a_cols : 1;
  const std::int64_t b_p = g.transpose_b ? 1 : g.b_cols, b_j = g.transpose_b ? g.b_cols : 1;
  const float* bias = static_cast<const float*>(g.bias.data);
  const std::int64_t n = I * J;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride) {
    const std::int64_t i = k / J, j = k % J;
    float acc = 0.0f;
    // -fmad=false keeps the multiply and the add apart, as the CPU's loop (-ffp-contract=off); the product of
    // two decoded FP8 values is exact in float anyway.
    for (std::int64_t p = 0; p < P; ++p) acc += table_a[g.a[i * a_i + p * a_p]] * table_b[g.b[p * b_p + j * b_j]];
    float y = acc * g.alpha;
    if (bias != nullptr) y += bias[j];
    switch (g.out.dtype) {
      case DType::f32: store_as<float>(g.out.data, k, y); break;
      case DType::f64: store_as<double>(g.out.data, k, y); break;
      case DType::f16: store_as<f16>(g.out.data, k, y); break;
      case DType::bf16: store_as<bf16>(g.out.data, k, y); break;
      default: break;  // refused on the host
    }
  }
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>(linear_blocks(n)); }

}  // namespace

cudaError_t launch_fp8_quantize(const TensorView& x, float scale, Fp8Format format, Fp8Overflow overflow,
                                std::uint8_t* codes, float* amax, cudaStream_t stream) {
  if (x.numel == 0) return cudaSuccess;
  const unsigned blocks = blocks_for(x.numel);
  switch (x.dtype) {
    case DType::f32: fp8_quantize_kernel<float><<<blocks, kThreads, 0, stream>>>(x, scale, format, overflow, codes, amax); break;
    case DType::f64: fp8_quantize_kernel<double><<<blocks, kThreads, 0, stream>>>(x, scale, format, overflow, codes, amax); break;
    case DType::f16: fp8_quantize_kernel<f16><<<blocks, kThreads, 0, stream>>>(x, scale, format, overflow, codes, amax); break;
    case DType::bf16: fp8_quantize_kernel<bf16><<<blocks, kThreads, 0, stream>>>(x, scale, format, overflow, codes, amax); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_fp8_decode(const std::uint8_t* codes, std::int64_t n, Fp8Format format, float* out,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fp8_decode_kernel<<<blocks_for(n), kThreads, 0, stream>>>(codes, n, format, out);
  return cudaGetLastError();
}

cudaError_t launch_fp8_encode_hardware(const float* x, std::int64_t n, Fp8Format format, std::uint8_t* codes,
                                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fp8_encode_hardware_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, format, codes);
  return cudaGetLastError();
}

cudaError_t launch_fp8_transpose(const std::uint8_t* in, std::int64_t rows, std::int64_t cols, std::uint8_t* out,
                                 cudaStream_t stream) {
  if (rows * cols <= 0) return cudaSuccess;
  fp8_transpose_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(in, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t launch_fp8_gemm_exact(const Fp8GemmArgs& args, cudaStream_t stream) {
  const std::int64_t I = args.transpose_a ? args.a_cols : args.a_rows;
  const std::int64_t P = args.transpose_a ? args.a_rows : args.a_cols;
  const std::int64_t J = args.transpose_b ? args.b_rows : args.b_cols;
  if (I * J <= 0) return cudaSuccess;
  fp8_gemm_exact_kernel<<<blocks_for(I * J), kThreads, 0, stream>>>(args, I, P, J);
  return cudaGetLastError();
}

}  // namespace ampscope::cuda
