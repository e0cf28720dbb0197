// kernels/cuda/cuda_backend.h: the CUDA backend. Memory comes from CUDA's stream-ordered allocator
// (cudaMallocAsync on the device's default memory pool, which keeps freed blocks for reuse and is trimmed
// back to the driver when an allocation would fail); where the device has no memory pools (some
// virtualised GPUs), or with AMPSCOPE_CUDA_NO_POOLS=1, from cudaMalloc/cudaFree after the stream's work.
// Every kernel runs on the backend's one stream; an error left by an earlier call (a failed free) is
// reported as that before the next launch, not blamed on it. Element math comes from kernels/functors.h,
// shared with the CPU backend. Only built when AMPSCOPE_WITH_CUDA is defined.
//
//   std::string why;
//   if (cuda_device_count(&why) > 0) { auto be = make_cuda_backend(0); }
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"

namespace ampscope {

// Number of usable CUDA devices. 0 when there is no GPU or no driver (CUDA errors 35 and 100, platform
// notes trap 6) or any other failure; `reason` then says which.
int cuda_device_count(std::string* reason);

// The backend for CUDA device `index`. Throws DeviceRuntimeError if the device cannot be set up.
std::unique_ptr<Backend> make_cuda_backend(int index);

}  // namespace ampscope
