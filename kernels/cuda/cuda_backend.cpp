// The CUDA backend: device memory from the stream-ordered pool (plain cudaMalloc where pools are
// unsupported), one stream, kernels from
// cuda_kernels.cu and cuda_nn_kernels.cu, matrix products on cuBLAS (cuda_gemm.cpp). Every CUDA and
// cuBLAS call is checked once, and a failure carries the call, the error's name and the library's text.
#include "kernels/cuda/cuda_backend.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/fused_amp.h"
#include "kernels/cuda/stats_cuda.h"
#if defined(AMPSCOPE_WITH_NCCL)
#include "core/distributed/communicator.h"
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace ampscope {
namespace {

using cuda::check;

// Owns a cudaStream_t. Movable, not copyable; the destructor never throws.
class CudaStream {
 public:
  CudaStream() { AMPSCOPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  CudaStream(CudaStream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  CudaStream& operator=(CudaStream&&) = delete;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index)
      : index_(index), stream_(make_stream(index)), allow_tf32_(cuda::allow_tf32_from_env()),
        pools_(memory_pools_supported(index)) {
    if (pools_) {
      // Keep freed memory in the pool instead of returning it to the driver at every synchronisation:
      // training allocates the same sizes every step, and the pool then serves them without the driver.
      cudaMemPool_t pool = nullptr;
      AMPSCOPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
      std::uint64_t keep_all = UINT64_MAX;
      AMPSCOPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    }

    // The same (op, dtype) table as the CPU backend (kernels/cpu/cpu_backend.cpp, nn_kernels.cpp).
    for (int t = 0; t < kNumDTypes; ++t) {
      const DType d = static_cast<DType>(t);
      register_kernel(Op::fill, d, runner(Op::fill));
      register_kernel(Op::copy, d, runner(Op::copy));
      if (d != DType::boolean) register_kernel(Op::arange, d, runner(Op::arange));
      if (!is_floating(d)) continue;
      for (int o = 0; o < kNumOps; ++o) {
        const Op op = static_cast<Op>(o);
        if (op == Op::argmax_rows || !dispatched(op)) continue;
        if (op == Op::fill || op == Op::copy || op == Op::arange) continue;
        register_kernel(op, d, runner(op));
      }
    }
    // argmax is chosen by its output dtype (i64); the input's dtype is dispatched in the launcher.
    register_kernel(Op::argmax_rows, DType::i64, runner(Op::argmax_rows));
  }

  ~CudaBackend() override {
    // The pinned copy may still be written by a queued check: the stream first (no throwing here).
    if (record_ != nullptr || host_record_ != nullptr) {
      cudaSetDevice(index_);
      cudaStreamSynchronize(stream());
      if (host_record_ != nullptr) cudaFreeHost(host_record_);
      if (record_ != nullptr) cudaFree(record_);
      cudaGetLastError();
    }
  }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(index_); }
  cudaStream_t stream() const { return stream_.get(); }

  void* allocate(std::size_t nbytes) override {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    void* ptr = nullptr;
    const std::size_t n = nbytes == 0 ? 1 : nbytes;
    cudaError_t status = pools_ ? cudaMallocAsync(&ptr, n, stream()) : cudaMalloc(&ptr, n);
    if (status == cudaErrorMemoryAllocation && pools_) {
      // The pool keeps freed blocks (see the constructor); before giving up, hand them back to the driver
      // once the queued work is done with them, and ask again.
      cudaGetLastError();
      trim_pool();
      status = cudaMallocAsync(&ptr, n, stream());
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      throw DeviceRuntimeError(fmt::format(
          "cuda:{}: out of memory: asked for {} bytes ({:.1f} MiB), {:.1f} MiB free of {:.1f} MiB\n"
          "hint: lower the batch size, or run on the CPU backend with --device cpu",
          index_, nbytes, nbytes / 1048576.0, free_bytes / 1048576.0, total_bytes / 1048576.0));
    }
    AMPSCOPE_CUDA_CHECK(status);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t) noexcept override {
    if (ptr == nullptr) return;
    cudaError_t status = cudaSuccess;
    if (pools_) {
      // Stream-ordered: the block returns to the pool after the work already queued on the stream.
      status = cudaFreeAsync(ptr, stream());
    } else {
      // Without a pool the block is free at once, so first let the queued work that may use it finish
      // (this stream is non-blocking: cudaFree's own implicit synchronisation does not wait for it).
      host_syncs_.fetch_add(1, std::memory_order_relaxed);
      status = cudaStreamSynchronize(stream());
      const cudaError_t freed = cudaFree(ptr);
      if (status == cudaSuccess) status = freed;
    }
    if (status != cudaSuccess) {
      // No throwing here (a destructor frees tensors): the error is cleared from CUDA's last-error state,
      // so the next launch does not take the blame, and reported as itself by the next op (dispatch).
      cudaGetLastError();
      if (free_error_ == cudaSuccess) free_error_ = status;
    }
  }

  // Freed blocks back to the driver after the queued work, so that cuBLAS's workspace, NCCL's buffers and
  // the statistics buffers (plain cudaMalloc) can have them.
  void trim_pool() {
    if (!pools_) return;
    cudaMemPool_t pool = nullptr;
    host_syncs_.fetch_add(1, std::memory_order_relaxed);
    if (cudaStreamSynchronize(stream()) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, index_) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (cudaMemPoolTrimTo(pool, 0) != cudaSuccess) cudaGetLastError();
  }

  void copy_from_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes == 0) return;
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream()));
    wait_for_stream("cudaStreamSynchronize (after a copy from the host)");
  }

  void copy_to_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes == 0) return;
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream()));
    wait_for_stream("cudaStreamSynchronize (after a copy to the host)");
  }

  void synchronize() override { wait_for_stream("cudaStreamSynchronize"); }

  // Every wait of the host for this stream goes through here: it is counted (host_syncs), and the index
  // checks queued since the last wait are read then (their records reached pinned memory in stream order),
  // so an out-of-range index is reported at the first point where the host waits anyway.
  void wait_for_stream(const char* call) {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    host_syncs_.fetch_add(1, std::memory_order_relaxed);
    check(cudaStreamSynchronize(stream()), call);
    check_index_errors();
  }
  // A wait for one event on this stream (a statistics slot): counted the same way. The index checks are left
  // for the next wait for the whole stream: work queued after the event may still be writing their pinned
  // record, which could then be read half old, half new.
  void wait_for_event(cudaEvent_t event, const char* call) {
    host_syncs_.fetch_add(1, std::memory_order_relaxed);
    check(cudaEventSynchronize(event), call);
  }
  std::int64_t host_syncs() const override { return host_syncs_.load(std::memory_order_relaxed); }

  std::unique_ptr<StatsQueue> make_stats_queue(int slots) override;

  // The fused AMP fast path (core/backend.h): the kernels of fused_amp.h, while they are switched on.
  bool fused_amp_available() const override { return cuda::fused_amp_enabled(); }
  void fused_non_finite_check_and_unscale(const std::vector<TensorView>& grads, float* found_inf,
                                          float inv_scale) override {
    cuda::fused_non_finite_check_and_unscale(*this, grads, found_inf, inv_scale);
  }
  void fused_sgd_step(const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options,
                      const float* found_inf) override {
    cuda::fused_sgd_step(*this, tensors, options, found_inf);
  }
  void fused_adam_step(const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                       const float* found_inf) override {
    cuda::fused_adam_step(*this, tensors, options, found_inf);
  }

  // nll_loss's mean divisor on the device (core/backend.h): one kernel on the stream, no wait.
  void count_not_equal(const TensorView& indices, std::int64_t ignore, const TensorView& out) override {
    const bool f_out = out.dtype == DType::f32 || out.dtype == DType::f64;
    if (indices.dtype != DType::i64 || !indices.is_contiguous() || !f_out || out.numel != 1) {
      throw DTypeError(fmt::format("count_not_equal: expected contiguous i64 indices and one f32 or f64 output, got "
                                   "{} indices and {} elements of {}",
                                   dtype_name(indices.dtype), out.numel, dtype_name(out.dtype)));
    }
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    cuda::check_stale_error("count_not_equal");
    check(cuda::launch_count_not_equal(indices.ptr<std::int64_t>(), indices.numel, ignore, out.data,
                                       out.dtype == DType::f64, stream()),
          "launch of kernel 'count_not_equal'");
  }

#if defined(AMPSCOPE_WITH_NCCL)
  // Collectives between processes (core/backend.h): NCCL, on this backend's stream.
  std::string new_communicator_id() override {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    return cuda::nccl_unique_id();
  }
  std::unique_ptr<Communicator> create_communicator(const std::string& id, int rank, int size) override {
    return cuda::make_nccl_communicator(index_, stream(), id, rank, size);
  }
#endif

 private:
  // Stream-ordered memory pools (cudaMallocAsync) are missing on some virtualised GPUs and drivers
  // (cudaDevAttrMemoryPoolsSupported is 0 there): the backend then allocates with plain cudaMalloc.
  // AMPSCOPE_CUDA_NO_POOLS=1 takes that path on any GPU, so it can be tested where pools exist.
  static bool memory_pools_supported(int index) {
    if (const char* off = std::getenv("AMPSCOPE_CUDA_NO_POOLS"); off != nullptr && std::string_view(off) == "1") {
      return false;
    }
    int supported = 0;
    AMPSCOPE_CUDA_CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index));
    return supported != 0;
  }

  static CudaStream make_stream(int index) {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index));
    return CudaStream();
  }

  // The ops dispatch() knows; an op added to core/backend.h stays unsupported here (supports() says
  // so) until it has a kernel.
  static bool dispatched(Op op) {
    switch (op) {
      case Op::fill: case Op::copy: case Op::arange: case Op::uniform: case Op::normal: case Op::gemm:
      case Op::embedding_backward:
        return true;
      default:
        return cuda::is_elementwise_op(op) || cuda::is_nn_op(op);
    }
  }

  // The kernel function registered for an op: one instantiation of run<O> per op, so the table's plain
  // function pointers still know which op they run.
  static KernelFn runner(Op op) {
    switch (op) {
#define AMPSCOPE_CUDA_RUNNER(name) \
  case Op::name:                   \
    return &run<Op::name>;
      AMPSCOPE_OPS(AMPSCOPE_CUDA_RUNNER)
#undef AMPSCOPE_CUDA_RUNNER
      case Op::kCount: break;
    }
    return nullptr;
  }

  template <Op O>
  static void run(Backend& backend, const KernelArgs& args) {
    static_cast<CudaBackend&>(backend).dispatch(O, args);
  }

  void dispatch(Op op, const KernelArgs& a) {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    // An error left by an earlier call is named as that, before this op's launch could be blamed for it.
    if (free_error_ != cudaSuccess) {
      const cudaError_t earlier = free_error_;
      free_error_ = cudaSuccess;
      check(earlier, fmt::format("cudaFree(Async) of an earlier tensor (reported before kernel '{}')", op_name(op)));
    }
    if (const cudaError_t stale = cudaPeekAtLastError(); stale != cudaSuccess) {
      check(stale, fmt::format("an earlier, unchecked CUDA call (found before launching kernel '{}', which has not "
                               "run)",
                               op_name(op)));
    }
    const cudaStream_t s = stream();
    queue_index_check(op, a, s);
    switch (op) {
      case Op::fill: return check_launch(cuda::launch_fill(a, s), op);
      case Op::copy: return check_launch(cuda::launch_copy(a, s), op);
      case Op::arange: return check_launch(cuda::launch_arange(a, s), op);
      case Op::uniform: return check_launch(cuda::launch_uniform(a, s), op);
      case Op::normal: return check_launch(cuda::launch_normal(a, s), op);
      case Op::gemm: return cuda::gemm(*this, blas(), s, allow_tf32_, a);
      case Op::embedding_backward: {
        // Summed in the accumulation type: out itself for f32/f64, a scratch buffer for f16/bf16.
        void* acc = a.out.data;
        const bool wide = a.out.dtype == DType::f16 || a.out.dtype == DType::bf16;
        const std::size_t acc_bytes = static_cast<std::size_t>(a.out.numel) * sizeof(float);
        if (wide) acc = allocate(acc_bytes);
        const cudaError_t status = cuda::launch_embedding_backward(a, acc, s);
        if (wide) deallocate(acc, acc_bytes);  // stream-ordered: after the kernels that use it
        return check_launch(status, op);
      }
      default:
        if (cuda::is_elementwise_op(op)) return check_launch(cuda::launch_elementwise(op, a, s), op);
        if (cuda::is_nn_op(op)) return check_launch(cuda::launch_nn(op, a, s), op);
        throw UnsupportedError(fmt::format("op '{}' has no kernel on backend 'cuda' (not dispatched)", op_name(op)));
    }
  }

  static void check_launch(cudaError_t status, Op op) {
    if (status != cudaSuccess) check(status, fmt::format("launch of kernel '{}'", op_name(op)));
  }

  // Created on the first matrix product: a program that never multiplies matrices does not pay for
  // cuBLAS's initialisation and workspace.
  cublasHandle_t blas() {
    if (!blas_) blas_ = std::make_unique<cuda::CublasHandle>(stream());
    return blas_->get();
  }

  int index_;
  CudaStream stream_;
  bool allow_tf32_;
  bool pools_;  // cudaMallocAsync/cudaFreeAsync on the default pool, else cudaMalloc/cudaFree
  cudaError_t free_error_ = cudaSuccess;  // a failed free, reported by the next dispatch
  std::unique_ptr<cuda::CublasHandle> blas_;
  std::atomic<std::int64_t> host_syncs_{0};

  // ---- the index checks (cuda_launch.h, launch_index_check) ----
  struct PendingCheck {
    std::uint64_t launch;
    Op op;
  };
  // The ops whose indices are checked on the device: the index tensor, the valid range, the ignored value.
  static bool index_check_of(Op op, const KernelArgs& a, cuda::IndexCheck& c) {
    switch (op) {
      case Op::embedding: c = {a.in[1].ptr<std::int64_t>(), a.in[1].numel, a.in[0].sizes[0], 0, false}; return true;
      case Op::embedding_backward: c = {a.in[1].ptr<std::int64_t>(), a.in[1].numel, a.out.sizes[0], 0, false}; return true;
      case Op::nll_rows:
        c = {a.in[1].ptr<std::int64_t>(), a.in[1].numel, a.in[0].sizes[1], static_cast<std::int64_t>(a.scalars[0]), true};
        return true;
      case Op::nll_backward_rows:
        c = {a.in[1].ptr<std::int64_t>(), a.in[1].numel, a.out.sizes[1], static_cast<std::int64_t>(a.scalars[0]), true};
        return true;
      default: return false;
    }
  }

  // A launch's check, queued before its kernel; `pending_checks_` remembers which op each launch number was.
  void queue_index_check(Op op, const KernelArgs& a, cudaStream_t s) {
    cuda::IndexCheck c;
    if (!index_check_of(op, a, c)) return;
    if (record_ == nullptr) {
      // Once per backend: the device record and its pinned copy, both "no error".
      AMPSCOPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&record_), sizeof(cuda::IndexCheckRecord)));
      AMPSCOPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_record_), sizeof(cuda::IndexCheckRecord)));
      *host_record_ = cuda::IndexCheckRecord{};
      AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(record_, host_record_, sizeof(cuda::IndexCheckRecord),
                                          cudaMemcpyHostToDevice, s));
    }
    c.launch = ++launches_;
    pending_checks_.push_back({c.launch, op});
    const cudaError_t status = cuda::launch_index_check(c, record_, host_record_, s);
    if (status != cudaSuccess) check(status, fmt::format("launch of the index check of kernel '{}'", op_name(op)));
  }

  // After a wait for the whole stream: every queued check's record is in pinned memory.
  void check_index_errors() {
    if (pending_checks_.empty()) return;
    const cuda::IndexCheckRecord found = *host_record_;
    std::vector<PendingCheck> checks;
    checks.swap(pending_checks_);
    if (found.launch != 0) report_index_error(found, checks);
  }
  [[noreturn]] void report_index_error(const cuda::IndexCheckRecord& found, const std::vector<PendingCheck>& checks) {
    // Cleared first (device record and pinned copy, after the queued work), so the next check starts clean
    // whatever the caller does with the error.
    *host_record_ = cuda::IndexCheckRecord{};
    const cudaError_t reset = cudaMemcpyAsync(record_, host_record_, sizeof(cuda::IndexCheckRecord),
                                              cudaMemcpyHostToDevice, stream());
    if (reset != cudaSuccess) cudaGetLastError();
    Op op = Op::embedding;
    for (const PendingCheck& c : checks) {
      if (c.launch == found.launch) op = c.op;
    }
    throw IndexError(cuda::index_error_text(op, found));
  }

  cuda::IndexCheckRecord* record_ = nullptr;       // device
  cuda::IndexCheckRecord* host_record_ = nullptr;  // pinned: the device record as of the latest check
  std::uint64_t launches_ = 0;
  std::vector<PendingCheck> pending_checks_;
};

// The CUDA backend's statistics ring (core/backend.h, StatsQueue): a StatsBuffer on the backend's stream,
// with the slots' bookkeeping (which are taken) and the waits counted as the backend's host syncs.
class CudaStatsQueue final : public StatsQueue {
 public:
  CudaStatsQueue(CudaBackend& backend, int slots)
      : backend_(backend), buffer_(backend.device().index, slots), taken_(static_cast<std::size_t>(slots), false) {}
  int capacity() const override { return buffer_.slots(); }
  int free_slots() const override { return capacity() - used_; }
  int launch(const TensorView& t, bool histogram) override {
    if (used_ == capacity()) return -1;
    // The next free slot after the last one taken: slots are read roughly in launch order, so this finds one
    // at once.
    int slot = next_;
    while (taken_[static_cast<std::size_t>(slot)]) slot = (slot + 1) % capacity();
    buffer_.launch(t, histogram, slot, backend_.stream());
    taken_[static_cast<std::size_t>(slot)] = true;
    ++used_;
    next_ = (slot + 1) % capacity();
    return slot;
  }
  DeviceStatsResult read(int slot) override {
    if (slot < 0 || slot >= capacity() || !taken_[static_cast<std::size_t>(slot)]) {
      throw IndexError(fmt::format("StatsQueue: slot {} holds no launch (the ring has {} slots)", slot, capacity()));
    }
    taken_[static_cast<std::size_t>(slot)] = false;
    --used_;
    if (!buffer_.ready(slot)) backend_.wait_for_event(buffer_.event(slot), "cudaEventSynchronize (statistics slot)");
    const cuda::DeviceStats& d = buffer_.wait(slot);  // ready: no wait
    DeviceStatsResult r;
    r.numel = d.numel;
    r.nan = d.nan;
    r.pos_inf = d.pos_inf;
    r.neg_inf = d.neg_inf;
    r.zero = d.zero;
    r.subnormal = d.subnormal;
    r.min = d.min;
    r.max = d.max;
    r.absmax = d.absmax;
    r.sum = d.sum;
    r.sum_sq = d.sum_sq;
    for (int b = 0; b < kDeviceStatsBins; ++b) r.histogram[static_cast<std::size_t>(b)] = d.histogram[b];
    return r;
  }

 private:
  CudaBackend& backend_;
  cuda::StatsBuffer buffer_;
  std::vector<bool> taken_;
  int used_ = 0;
  int next_ = 0;
};

std::unique_ptr<StatsQueue> CudaBackend::make_stats_queue(int slots) {
  return std::make_unique<CudaStatsQueue>(*this, slots);
}

}  // namespace

namespace cuda {

static_assert(kStatsHistBins == kDeviceStatsBins, "the statistics kernel's bins are core's DeviceStatsResult's");

std::string index_error_text(Op op, const IndexCheckRecord& found) {
  const std::string where = fmt::format("\n(checked on the device by the index check of kernel '{}'; reported at the "
                                        "next host synchronisation, so later ops may already have been queued)",
                                        op_name(op));
  if (op == Op::nll_rows || op == Op::nll_backward_rows) {
    return fmt::format("nll_loss: target {} (row {}) is out of bounds for {} classes{}", found.index,
                       found.first_position, found.limit, where);
  }
  return fmt::format("embedding: index {} at position {} is out of range for {} embeddings{}", found.index,
                     found.first_position, found.limit, where);
}

cudaStream_t backend_stream(Backend& backend, const char* who) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) {
    throw DeviceError(fmt::format("{}: backend '{}' is not a CUDA backend", who, backend.name()));
  }
  AMPSCOPE_CUDA_CHECK(cudaSetDevice(cuda->device().index));
  return cuda->stream();
}

void check_stale_error(const char* what) {
  if (const cudaError_t stale = cudaPeekAtLastError(); stale != cudaSuccess) {
    check(stale, fmt::format("an earlier, unchecked CUDA call (found before launching '{}', which has not run)", what));
  }
}

}  // namespace cuda

int cuda_device_count(std::string* reason) {
  int count = 0;  // the runtime leaves it untouched when there is no driver
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (reason != nullptr) {
      // Error 35 means either no driver at all (a machine without a GPU) or a driver older than this
      // runtime needs (a GPU machine that needs a driver update); the driver version tells them apart.
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      std::string what = "CUDA is not usable";
      if (status == cudaErrorNoDevice || (status == cudaErrorInsufficientDriver && driver == 0)) {
        what = "no GPU or no NVIDIA driver on this machine";
      } else if (status == cudaErrorInsufficientDriver) {
        what = fmt::format("the NVIDIA driver (CUDA {}.{}) is older than this build's CUDA runtime ({}.{}); update the "
                           "driver",
                           driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
      }
      *reason = fmt::format("{} ({}: {})", what, cudaGetErrorName(status), cudaGetErrorString(status));
    }
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device found";
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int index) { return std::make_unique<CudaBackend>(index); }

}  // namespace ampscope
