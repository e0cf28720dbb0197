// tests/kernels/cublas_library_test.cpp: cuBLAS and cuBLASLt loaded at run time (kernels/cuda/cublas_library.h).
// Needs the CUDA Toolkit's libraries (present wherever the CUDA backend is built), not a GPU: loading them and
// looking up the functions touches no device, so these run on every machine that builds CUDA.
#include <gtest/gtest.h>

#ifdef AMPSCOPE_WITH_CUDA
#include <string>

#include "core/error.h"

#include "kernels/cuda/cublas_library.h"
#endif

namespace ampscope {
namespace {

#ifdef AMPSCOPE_WITH_CUDA
// Every function the backend calls is found under the name the Toolkit's headers map it to (cublasCreate is
// cublasCreate_v2): a misspelled or unmapped name fails here, not first on a GPU.
TEST(cublas_library_test, every_function_the_backend_calls_is_found) {
  const cuda::CublasLibrary& lib = cuda::cublas_library();
  int found = 0;
#define AMPSCOPE_EXPECT_FOUND(name, type)                       \
  EXPECT_NE(lib.name, nullptr) << #name " was not looked up"; \
  found += lib.name != nullptr;
  AMPSCOPE_CUBLAS_FUNCTIONS(AMPSCOPE_EXPECT_FOUND)
  AMPSCOPE_CUBLASLT_FUNCTIONS(AMPSCOPE_EXPECT_FOUND)
#undef AMPSCOPE_EXPECT_FOUND
  EXPECT_EQ(found, 19);  // 8 of cuBLAS, 11 of cuBLASLt: the lists in cublas_library.h
  // The same table on every call.
  EXPECT_EQ(&cuda::cublas_library(), &lib);
}

// The functions are the library's own: its status names, which need no device (the texts are cuBLAS's).
TEST(cublas_library_test, the_loaded_functions_answer_as_cublas_does) {
  const cuda::CublasLibrary& lib = cuda::cublas_library();
  EXPECT_EQ(std::string(lib.cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED)), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(std::string(lib.cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE)), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(lib.cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)), "");
  // A call that needs no device and must fail cleanly: a null handle.
  EXPECT_EQ(lib.cublasSetMathMode(nullptr, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_NOT_INITIALIZED);
}

// A library that is not there, and one that is there but is not cuBLAS: errors that name the file or the
// function and say what to do.
TEST(cublas_library_test, a_missing_or_foreign_library_is_named_with_a_hint) {
  try {
    cuda::load_cublas("libampscope-no-such-cublasLt.so.0", cuda::cublas_soname());
    FAIL() << "loading a library that does not exist succeeded";
  } catch (const DeviceRuntimeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot load libampscope-no-such-cublasLt.so.0, which the CUDA backend's matrix products need"),
              std::string::npos) << what;
    EXPECT_NE(what.find("\nhint: install the CUDA Toolkit's cuBLAS"), std::string::npos) << what;
    EXPECT_NE(what.find("--device cpu runs without it"), std::string::npos) << what;
  }
  try {
    cuda::load_cublas("libz.so.1", "libz.so.1");  // zlib: loads, but has none of cuBLAS's functions
    FAIL() << "zlib passed for cuBLAS";
  } catch (const DeviceRuntimeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("libz.so.1 has no function cublasCreate_v2"), std::string::npos) << what;
    EXPECT_NE(what.find("\nhint: "), std::string::npos) << what;
  }
}

TEST(cublas_library_test, the_files_are_this_toolkits_major_version) {
  EXPECT_EQ(std::string(cuda::cublas_soname()), "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR));
  EXPECT_EQ(std::string(cuda::cublaslt_soname()), "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR));
}
#else
TEST(cublas_library_test, skipped_without_the_cuda_backend) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

}  // namespace
}  // namespace ampscope
