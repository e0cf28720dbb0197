// kernels/cuda/cublas_library.cpp: cuBLAS and cuBLASLt loaded at run time (kernels/cuda/cublas_library.h says why).
#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"

#define AMPSCOPE_CUBLAS_TEXT2(x) #x
#define AMPSCOPE_CUBLAS_TEXT(x) AMPSCOPE_CUBLAS_TEXT2(x)  // the text after macro expansion: cublasCreate_v2

namespace ampscope::cuda {
namespace {

// The two types written out in the header are those of the headers' C functions (a cast that picks an
// overload compiles only if one has exactly that type; unevaluated, so nothing is linked).
static_assert(std::is_same_v<decltype(static_cast<detail::CublasGemmEx>(&::cublasGemmEx)), detail::CublasGemmEx>);
static_assert(std::is_same_v<decltype(static_cast<detail::CublasGemmStridedBatchedEx>(&::cublasGemmStridedBatchedEx)),
                             detail::CublasGemmStridedBatchedEx>);

// dlopen by soname (LD_LIBRARY_PATH, the program's run path, the system's), then in the folder where the
// build found the Toolkit. Each handle is kept for the process's life: the functions are called to its end.
void* open_library(const char* soname) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first = dlerror();
#ifdef AMPSCOPE_CUDA_LIBRARY_DIR
  const std::string path = std::string(AMPSCOPE_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  throw DeviceRuntimeError(fmt::format(
      "cannot load {}, which the CUDA backend's matrix products need: {}\n"
      "hint: install the CUDA Toolkit's cuBLAS {} (or put the folder that holds {} on LD_LIBRARY_PATH); "
      "--device cpu runs without it",
      soname, first, CUBLAS_VER_MAJOR, soname));
}

template <typename F>
void look_up(void* library, const char* soname, const char* symbol, F& slot) {
  dlerror();
  void* p = dlsym(library, symbol);
  if (p == nullptr) {
    const char* why = dlerror();
    throw DeviceRuntimeError(fmt::format(
        "{} has no function {} ({}): it is not the cuBLAS this program was built against ({}.{})\n"
        "hint: install the CUDA Toolkit's cuBLAS {} or rebuild ampscope against the one installed",
        soname, symbol, why != nullptr ? why : "not found", CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_MAJOR));
  }
  slot = reinterpret_cast<F>(p);
}

}  // namespace

CublasLibrary load_cublas(const char* lt_soname, const char* blas_soname) {
  CublasLibrary lib;
  // libcublas needs libcublasLt: loading it first names the missing file when that is the one missing.
  void* lt = open_library(lt_soname);
  void* blas = open_library(blas_soname);
#define AMPSCOPE_CUBLAS_LOOK_UP(name, type) look_up(blas, blas_soname, AMPSCOPE_CUBLAS_TEXT(name), lib.name);
#define AMPSCOPE_CUBLASLT_LOOK_UP(name, type) look_up(lt, lt_soname, AMPSCOPE_CUBLAS_TEXT(name), lib.name);
  AMPSCOPE_CUBLAS_FUNCTIONS(AMPSCOPE_CUBLAS_LOOK_UP)
  AMPSCOPE_CUBLASLT_FUNCTIONS(AMPSCOPE_CUBLASLT_LOOK_UP)
#undef AMPSCOPE_CUBLAS_LOOK_UP
#undef AMPSCOPE_CUBLASLT_LOOK_UP
  return lib;
}

const char* cublaslt_soname() { return "libcublasLt.so." AMPSCOPE_CUBLAS_TEXT(CUBLAS_VER_MAJOR); }
const char* cublas_soname() { return "libcublas.so." AMPSCOPE_CUBLAS_TEXT(CUBLAS_VER_MAJOR); }

const CublasLibrary& cublas_library() {
  // A throwing initializer leaves the static uninitialized, so the next call tries again.
  static const CublasLibrary lib = load_cublas(cublaslt_soname(), cublas_soname());
  return lib;
}

}  // namespace ampscope::cuda
