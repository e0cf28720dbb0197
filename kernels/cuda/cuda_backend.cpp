// The CUDA backend: device memory from the stream-ordered pool, one stream, kernels from
// cuda_kernels.cu. Every CUDA call is checked once, and a failure carries the call, the error's name
// and CUDA's own text.
#include "kernels/cuda/cuda_backend.h"

#include <cstdint>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_launch.h"

namespace ampscope {
namespace {

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky-free error state so later calls report their own errors
  throw DeviceRuntimeError(
      fmt::format("CUDA call {} failed: {} ({})", call, cudaGetErrorName(status), cudaGetErrorString(status)));
}
#define AMPSCOPE_CUDA_CHECK(call) check((call), #call)

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
  explicit CudaBackend(int index) : index_(index), stream_(make_stream(index)) {
    // Keep freed memory in the pool instead of returning it to the driver at every synchronisation:
    // training allocates the same sizes every step, and the pool then serves them without the driver.
    cudaMemPool_t pool = nullptr;
    AMPSCOPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
    std::uint64_t keep_all = UINT64_MAX;
    AMPSCOPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));

    for (int t = 0; t < kNumDTypes; ++t) {
      const DType d = static_cast<DType>(t);
      register_kernel(Op::fill, d, &run<cuda::launch_fill>);
      register_kernel(Op::copy, d, &run<cuda::launch_copy>);
      if (d != DType::boolean) register_kernel(Op::arange, d, &run<cuda::launch_arange>);
      if (!is_floating(d)) continue;
      register_kernel(Op::uniform, d, &run<cuda::launch_uniform>);
      register_kernel(Op::normal, d, &run<cuda::launch_normal>);
      for (Op op : {Op::add, Op::sub, Op::mul, Op::div, Op::add_scalar, Op::mul_scalar, Op::neg, Op::relu, Op::exp}) {
        register_kernel(op, d, elementwise_runner(op));
      }
    }
  }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(index_); }
  cudaStream_t stream() const { return stream_.get(); }

  void* allocate(std::size_t nbytes) override {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocAsync(&ptr, nbytes == 0 ? 1 : nbytes, stream());
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
    // Stream-ordered: the block returns to the pool after the work already queued on the stream.
    if (ptr != nullptr) cudaFreeAsync(ptr, stream());
  }

  void copy_from_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes == 0) return;
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream()));
    AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  void copy_to_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes == 0) return;
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index_));
    AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream()));
    AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  void synchronize() override { AMPSCOPE_CUDA_CHECK(cudaStreamSynchronize(stream())); }

 private:
  static CudaStream make_stream(int index) {
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(index));
    return CudaStream();
  }

  template <cudaError_t (*Launch)(const KernelArgs&, cudaStream_t)>
  static void run(Backend& backend, const KernelArgs& args) {
    auto& self = static_cast<CudaBackend&>(backend);
    AMPSCOPE_CUDA_CHECK(cudaSetDevice(self.index_));
    check(Launch(args, self.stream()), "kernel launch");
  }

  template <Op O>
  static cudaError_t launch_op(const KernelArgs& args, cudaStream_t stream) {
    return cuda::launch_elementwise(O, args, stream);
  }

  static KernelFn elementwise_runner(Op op) {
    switch (op) {
      case Op::add: return &run<launch_op<Op::add>>;
      case Op::sub: return &run<launch_op<Op::sub>>;
      case Op::mul: return &run<launch_op<Op::mul>>;
      case Op::div: return &run<launch_op<Op::div>>;
      case Op::add_scalar: return &run<launch_op<Op::add_scalar>>;
      case Op::mul_scalar: return &run<launch_op<Op::mul_scalar>>;
      case Op::neg: return &run<launch_op<Op::neg>>;
      case Op::relu: return &run<launch_op<Op::relu>>;
      case Op::exp: return &run<launch_op<Op::exp>>;
      default: return nullptr;
    }
  }

  int index_;
  CudaStream stream_;
};

}  // namespace

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
