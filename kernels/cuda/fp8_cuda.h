// kernels/cuda/fp8_cuda.h: the CUDA backend's FP8 kernels (issue 34), reached by core through
// fp8_device_kernels(device) (core/backend.h) as kFp8Kernels. Host code only; only built with
// AMPSCOPE_WITH_CUDA. docs/cuda.md ("FP8") says what matches the CPU bit for bit and what does not.
//
//   cuda::fp8_quantize(backend, {.x = x.kernel_view(), .codes = q, .amax = amax, .scale = s});
//   cuda::fp8_gemm(backend, args);     // cuBLASLt FP8 where it can run, else the exact kernel
//
// - Quantization: core/float8.h's encode on the device, every code the CPU's (tests/kernels/fp8_cuda_test.cpp
//   checks every f16 and bf16 value and the 256 codes); the amax is folded in the same pass, exactly.
// - The scaled GEMMs run one of two ways:
//   * cuBLASLt's FP8 matmul (CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 operands, f32 compute, f32 result, alpha = the
//     product of the operands' scale_inv), as TransformerEngine runs them, with TE's default accumulation
//     setting (fast accumulation in fprop, the split accumulator in dgrad and wgrad), then the bias added and
//     the result rounded to the output dtype by the backend's gemm epilogue. Used when the device has FP8
//     tensor cores (compute capability 8.9 or later), every dimension is a multiple of 16 (cuBLASLt's FP8
//     alignment), the operands are not both E5M2 (cuBLASLt has no E5M2 x E5M2), the output is not f64, cuBLASLt
//     offers an algorithm and AMPSCOPE_FP8_EXACT_GEMM is not 1. Its accumulation order (and, on Hopper, the tensor cores'
//     accumulator precision) is its own: the result is within fp8_cublaslt_bound() of the CPU's, not equal.
//   * otherwise the exact kernel (fp8_launch.h): the CPU's operations in the CPU's order, the same bits.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace ampscope::cuda {

// Both synchronous: ordered after everything queued on `backend` and finished before returning (the backend
// does not export its stream yet; see fused_amp.cpp's run_ordered). Throws DeviceError for a backend that is
// not CUDA's, DTypeError for an operand or output dtype the kernels do not take, DeviceRuntimeError on a failed
// CUDA or cuBLASLt call.
void fp8_quantize(Backend& backend, const Fp8QuantizeArgs& args);
void fp8_gemm(Backend& backend, const Fp8GemmArgs& args);

inline constexpr Fp8DeviceKernels kFp8Kernels{&fp8_quantize, &fp8_gemm};

// Which way fp8_gemm runs a GEMM of these arguments on device `device`: true for cuBLASLt (see above; the
// algorithm's availability is only known when it runs, when cuBLASLt offers none the exact kernel runs).
bool fp8_gemm_uses_cublaslt(const Fp8GemmArgs& args, int device);
// How many GEMMs each way ran in this process (the tests check which path a comparison exercised).
std::uint64_t fp8_gemm_cublaslt_count();
std::uint64_t fp8_gemm_exact_count();

// The largest |cuBLASLt result - exact result| fp8_gemm's cuBLASLt path is held to, for one output element
// before its rounding to the output dtype: with S = alpha * sum_p |op(A)[i][p] op(B)[p][j]| (in double) and P the
// inner size, 2^-9 * S + P * 2^-23 * S. Why (docs/cuda.md, "FP8"): every product is exact, so the two differ
// only in how the f32 sum rounds. An f32 sum in any order is within (P - 1) 2^-24 S of the exact one, so two
// orders within P 2^-23 S; Hopper's FP8 tensor cores add products in an accumulator that keeps only about 14
// bits below the largest term's exponent before the sum is promoted to f32 (DeepSeek-V3 technical report,
// section 3.3.2, measured on H800), which bounds each promoted block's error by about 2^-13 of its terms'
// sum; 2^-9 S leaves a factor 16 of margin for the fast-accumulation mode of fprop, in which promotion is less
// frequent. Not yet measured here: tests/kernels/fp8_cuda_test.cpp checks it on the first GPU session.
double fp8_cublaslt_bound(double abs_product_sum, std::int64_t inner);

}  // namespace ampscope::cuda
