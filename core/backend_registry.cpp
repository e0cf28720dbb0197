// Which backend serves which device. The CPU backend always exists; CUDA backends are created on first
// use, one per device index, when the build has CUDA and the machine has a GPU.
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "core/backend.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/fp8_cuda.h"
#endif

namespace ampscope {

CudaStatus cuda_status() {
  CudaStatus s;
#if defined(AMPSCOPE_WITH_CUDA)
  s.compiled = true;
  s.device_count = cuda_device_count(&s.reason);
#else
  s.reason = "this build of ampscope has no CUDA backend (configured with AMPSCOPE_CUDA=OFF, or no nvcc was found)";
#endif
  return s;
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) {
    // Never destroyed: a tensor with static storage may be freed after any function-local static.
    static Backend* const cpu = make_cpu_backend().release();
    return *cpu;
  }
  static std::mutex mutex;
  static std::map<int, Backend*> cuda_backends;  // never destroyed, as the CPU backend
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cuda_backends.find(device.index); it != cuda_backends.end()) return *it->second;

  const CudaStatus status = cuda_status();
  if (status.device_count == 0) {
    throw DeviceError(fmt::format("device '{}' is not available: {}\nhint: use device 'cpu'; the CPU backend computes "
                                  "the same FP16/BF16 numerics",
                                  device.str(), status.reason));
  }
  if (device.index >= status.device_count) {
    throw DeviceError(fmt::format("device '{}' is not available: {} CUDA device(s) found (cuda:0 to cuda:{})",
                                  device.str(), status.device_count, status.device_count - 1));
  }
#if defined(AMPSCOPE_WITH_CUDA)
  Backend* created = make_cuda_backend(device.index).release();
  cuda_backends.emplace(device.index, created);
  return *created;
#else
  throw DeviceError(fmt::format("device '{}' is not available: {}", device.str(), status.reason));
#endif
}

const Fp8DeviceKernels* fp8_device_kernels(Device device) {
  if (device.is_cpu()) return nullptr;
#if defined(AMPSCOPE_WITH_CUDA)
  return &cuda::kFp8Kernels;
#else
  return nullptr;
#endif
}

}  // namespace ampscope
