// Host side of the CUDA FP8 kernels (kernels/cuda/fp8_cuda.h): argument checks, ordering against the backend,
// and the cuBLASLt FP8 matmul.
#include "kernels/cuda/fp8_cuda.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/fp8_launch.h"

namespace ampscope::cuda {
namespace {

std::atomic<std::uint64_t> g_cublaslt_calls{0};
std::atomic<std::uint64_t> g_exact_calls{0};

// cuBLASLt's workspace for one matmul (its heuristics pick among the algorithms that fit).
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

bool exact_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("AMPSCOPE_FP8_EXACT_GEMM");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return forced;
}

// cuBLASLt's functions, loaded on first use (kernels/cuda/cublas_library.h).
const CublasLibrary& lt() { return cublas_library(); }

void check_lt(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw DeviceRuntimeError(fmt::format("cuBLASLt call {} failed: {} ({})", call, lt().cublasGetStatusName(status),
                                       lt().cublasGetStatusString(status)));
}
#define AMPSCOPE_LT_CHECK(call) check_lt((call), #call)

// One cuBLASLt handle per process, made on first use, never destroyed (as the backends).
cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    AMPSCOPE_LT_CHECK(lt().cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  AMPSCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  AMPSCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// Ordered after the backend's queued work, on this thread's default stream, drained before returning (the
// pattern of fused_amp.cpp's run_ordered: the backend does not export its stream yet).
cudaStream_t begin_ordered(Backend& backend, const char* what) {
  const Device device = backend.device();
  if (!device.is_cuda()) {
    throw DeviceError(fmt::format("{}: backend '{}' is not a CUDA backend", what, backend.name()));
  }
  backend.synchronize();
  AMPSCOPE_CUDA_CHECK(cudaSetDevice(device.index));
  return cudaStreamPerThread;
}

void check_launch(cudaError_t status, const char* kernel) {
  if (status != cudaSuccess) check(status, fmt::format("launch of kernel '{}'", kernel));
}

// Scratch memory from the backend for work on this thread's default stream. The backend's pool allocates and frees
// in the backend's stream order, not this stream's: the caller calls backend.synchronize() after allocating (the
// allocation point reached) and before the first launch that uses it, and the destructor drains this stream before
// handing the memory back (also when a launch threw), so the pool never reuses memory a kernel here still reads.
class Scratch {
 public:
  Scratch(Backend& backend, std::size_t bytes) : backend_(backend), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = backend_.allocate(bytes_);
  }
  ~Scratch() {
    if (ptr_ == nullptr) return;
    (void)cudaStreamSynchronize(cudaStreamPerThread);  // an error here is the launch's, reported by the caller
    backend_.deallocate(ptr_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  Backend& backend_;
  std::size_t bytes_;
  void* ptr_ = nullptr;
};

bool float_output(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }

struct Dims {
  std::int64_t I, P, J;
};
Dims dims_of(const Fp8GemmArgs& g) {
  return {g.transpose_a ? g.a_cols : g.a_rows, g.transpose_a ? g.a_rows : g.a_cols,
          g.transpose_b ? g.b_rows : g.b_cols};
}

void check_gemm_args(const Fp8GemmArgs& g) {
  const Dims d = dims_of(g);
  const std::int64_t pb = g.transpose_b ? g.b_cols : g.b_rows;
  if (d.P != pb) {
    throw ShapeError(fmt::format("fp8_gemm (CUDA): inner sizes differ ([{}, {}] times [{}, {}])", d.I, d.P, pb, d.J));
  }
  if (!float_output(g.out.dtype) || !g.out.is_contiguous() || g.out.numel != d.I * d.J) {
    throw DTypeError(fmt::format("fp8_gemm (CUDA): the output must be a contiguous f32/f64/f16/bf16 [{}, {}] tensor "
                                 "(got {} with {} elements)",
                                 d.I, d.J, dtype_name(g.out.dtype), g.out.numel));
  }
  if (g.bias.data != nullptr && (g.bias.dtype != DType::f32 || !g.bias.is_contiguous() || g.bias.numel != d.J)) {
    throw DTypeError(fmt::format("fp8_gemm (CUDA): the bias must be {} contiguous f32 values", d.J));
  }
}

cudaDataType_t lt_type(Fp8Format f) { return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// RAII for the cuBLASLt descriptors of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (pref != nullptr) lt().cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) lt().cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) lt().cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) lt().cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) lt().cublasLtMatmulDescDestroy(op);
  }
};

// D (f32) = alpha * op(A) op(B) with cuBLASLt. Row-major C[I][J] is column-major C^T [J][I] = op(B)^T op(A)^T,
// and cuBLASLt's FP8 matmul takes only the "TN" form (both operands K-major): its A is op(B)^T stored as
// row-major [J][P] (= column-major [P][J], transposed), its B is op(A) stored as row-major [I][P] (= column-major
// [P][I]). Operands not already in that layout were transposed by the caller. Returns false (nothing run) when
// cuBLASLt offers no algorithm for the problem.
bool run_cublaslt(const std::uint8_t* op_a_rows, Fp8Format a_format, const std::uint8_t* op_b_cols,
                  Fp8Format b_format, const Dims& d, float alpha, bool fast_accumulation, float* out, void* workspace,
                  cudaStream_t stream) {
  LtDescriptors desc;
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  const std::int8_t fast = fast_accumulation ? 1 : 0;
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  AMPSCOPE_LT_CHECK(lt().cublasLtMatrixLayoutCreate(&desc.a, lt_type(b_format), u(d.P), u(d.J), d.P));
  AMPSCOPE_LT_CHECK(lt().cublasLtMatrixLayoutCreate(&desc.b, lt_type(a_format), u(d.P), u(d.I), d.P));
  AMPSCOPE_LT_CHECK(lt().cublasLtMatrixLayoutCreate(&desc.c, CUDA_R_32F, u(d.J), u(d.I), d.J));
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulPreferenceCreate(&desc.pref));
  const std::uint64_t ws = kWorkspaceBytes;
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof(ws)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t h = lt().cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.op, desc.a, desc.b, desc.c, desc.c,
                                                          desc.pref, 1, &heuristic, &found);
  if (h == CUBLAS_STATUS_NOT_SUPPORTED || (h == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  check_lt(h, "cublasLtMatmulAlgoGetHeuristic");
  const float beta = 0.0f;
  AMPSCOPE_LT_CHECK(lt().cublasLtMatmul(lt_handle(), desc.op, &alpha, op_b_cols, desc.a, op_a_rows, desc.b, &beta, out,
                                   desc.c, out, desc.c, &heuristic.algo, workspace, kWorkspaceBytes, stream));
  return true;
}

void run_exact(const Fp8GemmArgs& args, cudaStream_t stream) {
  check_launch(launch_fp8_gemm_exact(args, stream), "fp8_gemm_exact");
  g_exact_calls.fetch_add(1);
}

}  // namespace

void fp8_quantize(Backend& backend, const Fp8QuantizeArgs& args) {
  const DType t = args.x.dtype;
  if (t != DType::f32 && t != DType::f64 && t != DType::f16 && t != DType::bf16) {
    throw DTypeError(fmt::format("fp8_quantize (CUDA): the operand is {}; FP8 quantizes f64, f32, f16 or bf16 "
                                 "values",
                                 dtype_name(t)));
  }
  const cudaStream_t stream = begin_ordered(backend, "fp8_quantize");
  check_launch(launch_fp8_quantize(args.x, args.scale, args.format, Fp8Overflow::satfinite, args.codes, args.amax,
                                   stream),
               "fp8_quantize");
  AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

bool fp8_gemm_uses_cublaslt(const Fp8GemmArgs& args, int device) {
  if (exact_forced()) return false;
  if (args.a_format == Fp8Format::e5m2 && args.b_format == Fp8Format::e5m2) return false;
  // The backend's epilogue reads an f64 output's accumulator as double; FP8 outputs are f32/f16/bf16 in practice.
  if (args.out.dtype == DType::f64) return false;
  const Dims d = dims_of(args);
  if (d.I % 16 != 0 || d.J % 16 != 0 || d.P % 16 != 0 || d.P == 0 || d.I == 0 || d.J == 0) return false;
  return compute_capability(device) >= 89;
}

void fp8_gemm(Backend& backend, const Fp8GemmArgs& args) {
  check_gemm_args(args);
  const cudaStream_t stream = begin_ordered(backend, "fp8_gemm");
  if (!fp8_gemm_uses_cublaslt(args, backend.device().index)) {
    run_exact(args, stream);
    AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  const Dims d = dims_of(args);
  const auto bytes = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  // op(A) as row-major [I][P] and op(B)^T as row-major [J][P]: as stored, or transposed into scratch.
  Scratch a_t(backend, args.transpose_a ? bytes(d.I * d.P) : 0);
  Scratch b_t(backend, args.transpose_b ? 0 : bytes(d.J * d.P));
  Scratch acc(backend, bytes(d.I * d.J) * sizeof(float));
  Scratch workspace(backend, kWorkspaceBytes);
  backend.synchronize();  // the allocations above are ordered on the backend's stream (Scratch)
  const std::uint8_t* op_a = args.a;
  const std::uint8_t* op_bt = args.b;
  if (args.transpose_a) {  // A is [P][I]
    check_launch(launch_fp8_transpose(args.a, args.a_rows, args.a_cols, static_cast<std::uint8_t*>(a_t.get()), stream),
                 "fp8_transpose");
    op_a = static_cast<const std::uint8_t*>(a_t.get());
  }
  if (!args.transpose_b) {  // B is [P][J]
    check_launch(launch_fp8_transpose(args.b, args.b_rows, args.b_cols, static_cast<std::uint8_t*>(b_t.get()), stream),
                 "fp8_transpose");
    op_bt = static_cast<const std::uint8_t*>(b_t.get());
  }
  float* acc_f = static_cast<float*>(acc.get());
  if (!run_cublaslt(op_a, args.a_format, op_bt, args.b_format, d, args.alpha, args.fast_accumulation, acc_f,
                    workspace.get(), stream)) {
    run_exact(args, stream);
    AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // The bias in f32 and the one rounding to the output dtype: the backend's gemm epilogue (out = round(acc + bias)).
  GemmEpilogue epilogue;
  epilogue.out = args.out;
  epilogue.acc = acc_f;
  epilogue.bias = args.bias.data;
  epilogue.m = d.I;
  epilogue.n = d.J;
  check_launch(launch_gemm_epilogue(epilogue, stream), "gemm_epilogue");
  g_cublaslt_calls.fetch_add(1);
  AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::uint64_t fp8_gemm_cublaslt_count() { return g_cublaslt_calls.load(); }
std::uint64_t fp8_gemm_exact_count() { return g_exact_calls.load(); }

double fp8_cublaslt_bound(double abs_product_sum, std::int64_t inner) {
  return std::ldexp(abs_product_sum, -9) + static_cast<double>(inner) * std::ldexp(abs_product_sum, -23);
}

}  // namespace ampscope::cuda
