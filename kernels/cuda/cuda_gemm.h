// kernels/cuda/cuda_gemm.h: matrix products on the CUDA backend through cuBLAS (cublasGemmEx and its
// strided-batched form), and the RAII owner of the cuBLAS handle. Host code only.
//
// What it computes is Op::gemm as core/backend.h and the CPU backend define it: out[b] = A[b] @ B[b],
// accumulated in float (double for f64 out), plus the bias in float, rounded once to out's dtype; with
// scalars[1] = 1 the products of all batches are summed into one [1, M, N] accumulator before rounding.
// f16/bf16 inputs run on tensor cores with FP32 compute; f32 inputs use exact FP32 (no TF32) unless
// allow_tf32 is set (AMPSCOPE_ALLOW_TF32=1, read when the backend starts).
//
//   CublasHandle blas(stream);
//   cuda::gemm(backend, blas.get(), stream, /*allow_tf32=*/false, args);
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace ampscope::cuda {

// Owns a cublasHandle_t bound to one stream. Movable, not copyable; the destructor never throws.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  CublasHandle& operator=(CublasHandle&&) = delete;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// True when the environment sets AMPSCOPE_ALLOW_TF32=1: f32 matrix products may then round their
// inputs to TF32 (10-bit mantissa) on tensor cores, as torch.backends.cuda.matmul.allow_tf32 = True.
bool allow_tf32_from_env();

// Runs Op::gemm for args (any floating input dtypes and strides; out contiguous). Scratch memory (operands
// that cuBLAS cannot read in place, the float accumulator of an f16/bf16 product) comes from `backend`
// and is released in stream order. Throws DeviceRuntimeError on a failed CUDA or cuBLAS call.
void gemm(Backend& backend, cublasHandle_t handle, cudaStream_t stream, bool allow_tf32, const KernelArgs& args);

}  // namespace ampscope::cuda
