// Matrix products on cuBLAS. cuBLAS is column-major and ampscope's tensors are row-major, so the row-major
// product C = A @ B is computed as the column-major product C^T = B^T @ A^T: cuBLAS sees m' = N, n' = M,
// k' = K, first operand B, second operand A, and C with leading dimension N. A row-major operand read in
// place (unit column stride) is then cuBLAS's OP_N with ld = its row stride; a transposed view (unit row
// stride) is OP_T with ld = its column stride. Anything else (other strides, another dtype) is packed
// into a dense row-major buffer by the copy kernel first.
#include "kernels/cuda/cuda_gemm.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_launch.h"

namespace ampscope::cuda {

CublasHandle::CublasHandle(cudaStream_t stream) {
  const CublasLibrary& blas = cublas_library();
  AMPSCOPE_CUBLAS_CHECK(blas.cublasCreate(&handle_));
  try {
    AMPSCOPE_CUBLAS_CHECK(blas.cublasSetStream(handle_, stream));
    // Default math: tensor cores for f16/bf16 inputs, and f32 products stay FP32 unless a call asks for
    // CUBLAS_COMPUTE_32F_FAST_TF32 (the TF32 switch).
    AMPSCOPE_CUBLAS_CHECK(blas.cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    blas.cublasDestroy(handle_);
    throw;
  }
}

CublasHandle::~CublasHandle() {
  // A handle exists only once cublas_library() has loaded.
  if (handle_ != nullptr) cublas_library().cublasDestroy(handle_);
}

bool allow_tf32_from_env() {
  const char* v = std::getenv("AMPSCOPE_ALLOW_TF32");
  return v != nullptr && std::string(v) == "1";
}

namespace {

// Device memory from the backend's pool, released in stream order when it goes out of scope.
class Scratch {
 public:
  Scratch() = default;
  Scratch(Backend& backend, std::size_t nbytes)
      : backend_(&backend), nbytes_(nbytes), ptr_(backend.allocate(nbytes)) {}
  ~Scratch() {
    if (ptr_ != nullptr) backend_->deallocate(ptr_, nbytes_);
  }
  Scratch(Scratch&& o) noexcept
      : backend_(o.backend_), nbytes_(o.nbytes_), ptr_(std::exchange(o.ptr_, nullptr)) {}
  Scratch& operator=(Scratch&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) backend_->deallocate(ptr_, nbytes_);
      backend_ = o.backend_;
      nbytes_ = o.nbytes_;
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  Backend* backend_ = nullptr;
  std::size_t nbytes_ = 0;
  void* ptr_ = nullptr;
};

cudaDataType blas_type(DType t) {
  switch (t) {
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

// One matrix operand as cuBLAS reads it (in the swapped, column-major formulation above).
struct Operand {
  const char* base = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  int ld = 0;
  long long batch_stride = 0;  // elements; 0 shares one matrix across the batch
  std::size_t elem = 0;
  Scratch packed;
  const void* at(std::int64_t batch) const { return base + static_cast<std::size_t>(batch * batch_stride) * elem; }
};

// Whether a row-major [rows, cols] matrix with strides (rs, cs) is dense along one dimension with a
// leading dimension cuBLAS accepts; a dimension of size 1 may have any stride.
bool blas_layout(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs, cublasOperation_t& op, int& ld) {
  if (cs == 1 || cols == 1) {
    const std::int64_t l = rows == 1 ? std::max<std::int64_t>(cols, 1) : rs;
    if (l >= std::max<std::int64_t>(cols, 1) && l <= INT_MAX) {
      op = CUBLAS_OP_N;
      ld = static_cast<int>(l);
      return true;
    }
  }
  if (rs == 1 || rows == 1) {
    const std::int64_t l = cols == 1 ? std::max<std::int64_t>(rows, 1) : cs;
    if (l >= std::max<std::int64_t>(rows, 1) && l <= INT_MAX) {
      op = CUBLAS_OP_T;
      ld = static_cast<int>(l);
      return true;
    }
  }
  return false;
}

// The operand for the [batches, rows, cols] view v, read in place when its dtype is `type` and its
// layout allows, else packed (converted) into a dense buffer of `type`.
Operand prepare_operand(Backend& backend, cudaStream_t stream, const TensorView& v, std::int64_t batches, DType type) {
  Operand o;
  o.elem = dtype_size(type);
  const std::int64_t rows = v.sizes[1], cols = v.sizes[2];
  const std::int64_t bs = v.sizes[0] <= 1 ? 0 : v.strides[0];
  if (v.dtype == type && blas_layout(rows, cols, v.strides[1], v.strides[2], o.op, o.ld)) {
    o.base = static_cast<const char*>(v.data);
    o.batch_stride = bs;
    return o;
  }
  const std::int64_t nb = bs == 0 ? 1 : batches;
  TensorView src = v;
  src.sizes[0] = nb;
  src.strides[0] = bs;
  src.numel = nb * rows * cols;
  TensorView dst;
  dst.dtype = type;
  dst.ndim = 3;
  dst.numel = src.numel;
  dst.sizes[0] = nb;
  dst.sizes[1] = rows;
  dst.sizes[2] = cols;
  dst.strides[0] = rows * cols;
  dst.strides[1] = cols;
  dst.strides[2] = 1;
  o.packed = Scratch(backend, static_cast<std::size_t>(dst.numel) * o.elem);
  dst.data = o.packed.get();
  KernelArgs copy;
  copy.out = dst;
  copy.in[0] = src;
  copy.num_inputs = 1;
  check(launch_copy(copy, stream), "gemm: packing an operand (copy kernel launch)");
  o.base = static_cast<const char*>(dst.data);
  o.op = CUBLAS_OP_N;
  o.ld = static_cast<int>(std::max<std::int64_t>(cols, 1));
  o.batch_stride = bs == 0 ? 0 : rows * cols;
  return o;
}

void check_fits_int(std::int64_t v, const char* what, const KernelArgs& a) {
  if (v > INT_MAX) {
    throw UnsupportedError(fmt::format("gemm on cuda: {} = {} exceeds cuBLAS's 32-bit sizes (out [{}, {}, {}])\n"
                                       "hint: split the product into smaller ones",
                                       what, v, a.out.sizes[0], a.out.sizes[1], a.out.sizes[2]));
  }
}

// cuBLAS's strided-batched calls are limited by the grid's y/z dimensions on some versions; stay below.
constexpr std::int64_t kMaxBatchPerCall = 65535;

}  // namespace

void gemm(Backend& backend, cublasHandle_t handle, cudaStream_t stream, bool allow_tf32, const KernelArgs& a) {
  const TensorView& A = a.in[0];
  const TensorView& B = a.in[1];
  const TensorView& bias = a.in[2];
  const bool sum_batches = a.scalars[1] != 0;
  const std::int64_t batches = a.out.sizes[0], m = a.out.sizes[1], n = a.out.sizes[2], k = A.sizes[2];
  const std::int64_t in_batches = sum_batches ? A.sizes[0] : batches;
  if (batches * m * n == 0) return;
  check_fits_int(m, "M", a);
  check_fits_int(n, "N", a);
  check_fits_int(k, "K", a);

  const bool f64 = a.out.dtype == DType::f64;
  const DType acc = f64 ? DType::f64 : DType::f32;
  const std::size_t acc_size = dtype_size(acc);
  // The product in the accumulation type: out itself when out has that dtype.
  Scratch acc_buffer;
  void* c = a.out.data;
  if (a.out.dtype != acc) {
    acc_buffer = Scratch(backend, static_cast<std::size_t>(batches * m * n) * acc_size);
    c = acc_buffer.get();
  }

  if (k == 0 || in_batches == 0) {
    AMPSCOPE_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<std::size_t>(batches * m * n) * acc_size, stream));
  } else {
    // Inputs of one dtype that cuBLAS multiplies with FP32 compute go in as they are; mixed or other
    // dtypes are widened to float (double for f64 out), which is exact for f16/bf16, as the CPU does.
    DType in_type = acc;
    if (!f64 && A.dtype == B.dtype && (A.dtype == DType::f32 || A.dtype == DType::f16 || A.dtype == DType::bf16)) {
      in_type = A.dtype;
    }
    const Operand oa = prepare_operand(backend, stream, A, in_batches, in_type);
    const Operand ob = prepare_operand(backend, stream, B, in_batches, in_type);
    const cudaDataType ab_type = blas_type(in_type), c_type = blas_type(acc);
    const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                        : (in_type == DType::f32 && allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                                : CUBLAS_COMPUTE_32F;
    // alpha and beta have the compute type's scalar type (host pointers, the handle's default mode).
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
    const void* beta0 = f64 ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
    const void* beta1 = alpha;
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    const CublasLibrary& blas = cublas_library();
    if (sum_batches) {
      // out [1, M, N] = sum_b A[b] @ B[b]: one accumulator, batches added in order (beta = 1 after the
      // first), rounded once by the epilogue.
      for (std::int64_t b = 0; b < in_batches; ++b) {
        AMPSCOPE_CUBLAS_CHECK(blas.cublasGemmEx(handle, ob.op, oa.op, ni, mi, ki, alpha, ob.at(b), ab_type, ob.ld, oa.at(b),
                                           ab_type, oa.ld, b == 0 ? beta0 : beta1, c, c_type, ni, compute,
                                           CUBLAS_GEMM_DEFAULT));
      }
    } else {
      for (std::int64_t b0 = 0; b0 < batches; b0 += kMaxBatchPerCall) {
        const int count = static_cast<int>(std::min(kMaxBatchPerCall, batches - b0));
        void* c_at = static_cast<char*>(c) + static_cast<std::size_t>(b0 * m * n) * acc_size;
        AMPSCOPE_CUBLAS_CHECK(blas.cublasGemmStridedBatchedEx(handle, ob.op, oa.op, ni, mi, ki, alpha, ob.at(b0), ab_type,
                                                         ob.ld, ob.batch_stride, oa.at(b0), ab_type, oa.ld,
                                                         oa.batch_stride, beta0, c_at, c_type, ni, m * n, count,
                                                         compute, CUBLAS_GEMM_DEFAULT));
      }
    }
  }

  // The bias in the accumulation type, one value per row or per column of each product.
  Scratch bias_buffer;
  if (bias.data != nullptr) {
    bias_buffer = Scratch(backend, static_cast<std::size_t>(std::max<std::int64_t>(bias.numel, 1)) * acc_size);
    TensorView src;
    src.data = bias.data;
    src.dtype = bias.dtype;
    src.ndim = 1;
    src.numel = bias.numel;
    src.sizes[0] = bias.numel;
    src.strides[0] = bias.ndim > 0 ? bias.strides[0] : 1;
    TensorView dst = src;
    dst.data = bias_buffer.get();
    dst.dtype = acc;
    dst.strides[0] = 1;
    KernelArgs copy;
    copy.out = dst;
    copy.in[0] = src;
    copy.num_inputs = 1;
    check(launch_copy(copy, stream), "gemm: widening the bias (copy kernel launch)");
  }
  GemmEpilogue e;
  e.out = a.out;
  e.acc = c;
  e.bias = bias_buffer.get();
  e.bias_per_row = a.scalars[0] != 0;
  e.m = m;
  e.n = n;
  check(launch_gemm_epilogue(e, stream), "gemm: epilogue kernel launch");
}

}  // namespace ampscope::cuda
