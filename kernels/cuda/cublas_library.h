// kernels/cuda/cublas_library.h: the cuBLAS and cuBLASLt functions the CUDA backend calls, loaded with dlopen
// the first time a CUDA GEMM needs them instead of linked. Linked, libcublasLt alone cost every ampscope
// process about 0.1 s of system time and 210 MiB of resident memory to map and relocate at start
// (2026-11-29, CUDA 13), whether or not it ever touched a GPU: `ampscope report`, `diff` and every test
// program included. Call sites keep cuBLAS's names, as members:
//
//   const CublasLibrary& blas = cublas_library();  // throws DeviceRuntimeError when cuBLAS cannot be loaded
//   AMPSCOPE_CUBLAS_CHECK(blas.cublasSetStream(handle, stream));
//
// The member types are those of the Toolkit's headers (decltype), so a signature the headers change fails
// to compile rather than at run time; cublasCreate and the others that cublas_v2.h maps to their _v2
// symbols are looked up by those names.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace ampscope::cuda::detail {
// cublasGemmEx and cublasGemmStridedBatchedEx have a C++ overload in cublas_api.h (an inline wrapper taking
// the old cudaDataType compute type), so decltype cannot name them: these are the library's own functions'
// types, which cublas_library.cpp checks against the headers' declarations.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t,
                                        cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                                      int, int, const void*, const void*, cudaDataType, int,
                                                      long long int, const void*, cudaDataType, int, long long int,
                                                      const void*, void*, cudaDataType, int, long long int, int,
                                                      cublasComputeType_t, cublasGemmAlgo_t);
}  // namespace ampscope::cuda::detail

// X(name, type) for each function; the members and the symbols looked up are name after macro expansion.
#define AMPSCOPE_CUBLAS_FUNCTIONS(X)                                                \
  X(cublasCreate, decltype(&::cublasCreate))                                       \
  X(cublasDestroy, decltype(&::cublasDestroy))                                     \
  X(cublasSetStream, decltype(&::cublasSetStream))                                 \
  X(cublasSetMathMode, decltype(&::cublasSetMathMode))                             \
  X(cublasGemmEx, ::ampscope::cuda::detail::CublasGemmEx)                          \
  X(cublasGemmStridedBatchedEx, ::ampscope::cuda::detail::CublasGemmStridedBatchedEx) \
  X(cublasGetStatusName, decltype(&::cublasGetStatusName))                         \
  X(cublasGetStatusString, decltype(&::cublasGetStatusString))
#define AMPSCOPE_CUBLASLT_FUNCTIONS(X)                                                      \
  X(cublasLtCreate, decltype(&::cublasLtCreate))                                           \
  X(cublasLtMatmulDescCreate, decltype(&::cublasLtMatmulDescCreate))                       \
  X(cublasLtMatmulDescDestroy, decltype(&::cublasLtMatmulDescDestroy))                     \
  X(cublasLtMatmulDescSetAttribute, decltype(&::cublasLtMatmulDescSetAttribute))           \
  X(cublasLtMatrixLayoutCreate, decltype(&::cublasLtMatrixLayoutCreate))                   \
  X(cublasLtMatrixLayoutDestroy, decltype(&::cublasLtMatrixLayoutDestroy))                 \
  X(cublasLtMatmulPreferenceCreate, decltype(&::cublasLtMatmulPreferenceCreate))           \
  X(cublasLtMatmulPreferenceDestroy, decltype(&::cublasLtMatmulPreferenceDestroy))         \
  X(cublasLtMatmulPreferenceSetAttribute, decltype(&::cublasLtMatmulPreferenceSetAttribute)) \
  X(cublasLtMatmulAlgoGetHeuristic, decltype(&::cublasLtMatmulAlgoGetHeuristic))           \
  X(cublasLtMatmul, decltype(&::cublasLtMatmul))

namespace ampscope::cuda {

struct CublasLibrary {
#define AMPSCOPE_CUBLAS_MEMBER(name, type) type name = nullptr;
  AMPSCOPE_CUBLAS_FUNCTIONS(AMPSCOPE_CUBLAS_MEMBER)
  AMPSCOPE_CUBLASLT_FUNCTIONS(AMPSCOPE_CUBLAS_MEMBER)
#undef AMPSCOPE_CUBLAS_MEMBER
};

// Loads libcublasLt and libcublas (this Toolkit's major version: the dynamic linker's search path first,
// then the Toolkit's library folder the build found) and every function above, once per process; later
// calls return the same table. Throws DeviceRuntimeError naming the library or symbol and the loader's
// reason, with a hint; a later call tries again.
const CublasLibrary& cublas_library();

// What cublas_library() does once, from the files named (tests load others to see the errors).
CublasLibrary load_cublas(const char* lt_soname, const char* blas_soname);

// The files cublas_library() loads, in order, as it names them to the dynamic linker first.
const char* cublaslt_soname();
const char* cublas_soname();

}  // namespace ampscope::cuda
