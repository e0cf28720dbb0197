// kernels/cuda/fp8_launch.h: the launchers of kernels/cuda/fp8_kernels.cu, the only way into it (fp8_cuda.cpp
// and the GPU tests call them). Each takes the stream and returns the launch status; no exceptions cross the
// .cu boundary (nvcc 13 cannot compile fmt at C++20).
//
//   cudaError_t e = launch_fp8_quantize(x_view, scale, Fp8Format::e4m3, Fp8Overflow::satfinite, codes, amax, s);
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "core/float8.h"
#include "core/tensor_view.h"

namespace ampscope::cuda {

// codes[i] = float_to_fp8(float(x[i]) * scale, format, overflow) over x's elements in row-major order (x: f64,
// f32, f16 or bf16, any strides); with amax non-null, also *amax = max(*amax, fmaxf-fold of |float(x[i])|): a
// NaN element is skipped, an inf wins (each block folds its elements, then one atomic max on the float's bits,
// exact in any order because max is). scale 1 is the plain conversion (x * 1 is x; a NaN stays a NaN).
cudaError_t launch_fp8_quantize(const TensorView& x, float scale, Fp8Format format, Fp8Overflow overflow,
                                std::uint8_t* codes, float* amax, cudaStream_t stream);

// out[i] = fp8_to_float(codes[i], format) (core/float8.h's decode, on the device).
cudaError_t launch_fp8_decode(const std::uint8_t* codes, std::int64_t n, Fp8Format format, float* out,
                              cudaStream_t stream);

// codes[i] = the GPU's own conversion of x[i]: cuda_fp8.h's __nv_cvt_float_to_fp8 with __NV_SATFINITE, which on
// sm_89 and later is the PTX instruction cvt.rn.satfinite TransformerEngine's casts use. For the tests only:
// the runtime encodes with core/float8.h, and the tests check that the two agree.
cudaError_t launch_fp8_encode_hardware(const float* x, std::int64_t n, Fp8Format format, std::uint8_t* codes,
                                       cudaStream_t stream);

// out = in^T for a row-major [rows, cols] byte matrix (out is [cols, rows], row-major): the K-major copy
// cuBLASLt's FP8 GEMM needs of an operand whose inner index runs down its rows (TransformerEngine keeps the
// same transposed copies of its FP8 tensors).
cudaError_t launch_fp8_transpose(const std::uint8_t* in, std::int64_t rows, std::int64_t cols, std::uint8_t* out,
                                 cudaStream_t stream);

// The scaled GEMM of Fp8GemmArgs (core/backend.h) computed as core/fp8_linear.cpp computes it on the CPU:
// one thread per output, the decoded products (exact in float) summed in f32 over p in ascending order, then
// times alpha, plus bias[j], each one f32 operation, rounded once to out's dtype (f32, f64, f16, bf16). The same
// operations in the same order as the CPU, so the same bits. fast_accumulation is ignored (no tensor cores).
cudaError_t launch_fp8_gemm_exact(const Fp8GemmArgs& args, cudaStream_t stream);

}  // namespace ampscope::cuda
