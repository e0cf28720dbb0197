// kernels/cuda/stats_launch.h: the launcher of kernels/cuda/stats_kernels.cu (used by stats_cuda.cpp).
//
//   check(launch_tensor_stats(view, true, partials, result, stream));
#pragma once

#include <cuda_runtime_api.h>

#include "core/tensor_view.h"
#include "kernels/cuda/stats_cuda.h"

namespace ampscope::cuda {

// The number of blocks of the first pass, fixed so that the summation order (and so the bits of sum
// and sum_sq) does not depend on the GPU. partials: room for kStatsBlocks partial results
// (kStatsPartialBytes).
inline constexpr int kStatsBlocks = 1024;
inline constexpr std::size_t kStatsPartialBytes = static_cast<std::size_t>(kStatsBlocks) * sizeof(DeviceStats);

// Two launches: block partials, then one block that folds them in order into *result. Returns
// cudaErrorInvalidValue for a dtype without floating values.
cudaError_t launch_tensor_stats(const TensorView& t, bool histogram, void* partials, DeviceStats* result,
                                cudaStream_t stream);

}  // namespace ampscope::cuda
