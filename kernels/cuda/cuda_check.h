// kernels/cuda/cuda_check.h: the one checked wrapper for CUDA runtime and cuBLAS calls in the CUDA
// backend's host code (.cpp only: it uses fmt, which nvcc 13 cannot compile at C++20). A failure throws
// DeviceRuntimeError naming the call, the error's name and the library's own text.
//
//   AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
//   AMPSCOPE_CUBLAS_CHECK(cublas_library().cublasSetStream(handle, stream));
#pragma once

#include <string_view>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cublas_library.h"

namespace ampscope::cuda {

inline void check(cudaError_t status, std::string_view call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear the non-sticky error state so later calls report their own errors
  throw DeviceRuntimeError(
      fmt::format("CUDA call {} failed: {} ({})", call, cudaGetErrorName(status), cudaGetErrorString(status)));
}

inline void check(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  // A status comes from a cuBLAS call, so cuBLAS is loaded by now.
  const CublasLibrary& blas = cublas_library();
  throw DeviceRuntimeError(fmt::format("cuBLAS call {} failed: {} ({})", call, blas.cublasGetStatusName(status),
                                       blas.cublasGetStatusString(status)));
}

}  // namespace ampscope::cuda

#define AMPSCOPE_CUDA_CHECK(call) ::ampscope::cuda::check((call), #call)
#define AMPSCOPE_CUBLAS_CHECK(call) ::ampscope::cuda::check((call), #call)
