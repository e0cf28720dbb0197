// kernels/cuda/cuda_launch.h: the launchers of kernels/cuda/cuda_kernels.cu, the only way into it.
// Each takes the stream to run on and returns the launch status (cudaGetLastError) for the caller to
// check; no exceptions cross the .cu boundary (nvcc 13 fails on fmt 9 at C++20).
#pragma once

#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace ampscope::cuda {

cudaError_t launch_fill(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_copy(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_arange(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_uniform(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_normal(const KernelArgs& args, cudaStream_t stream);
// op is one of add, sub, mul, div, add_scalar, mul_scalar, neg, relu, exp.
cudaError_t launch_elementwise(Op op, const KernelArgs& args, cudaStream_t stream);

}  // namespace ampscope::cuda
