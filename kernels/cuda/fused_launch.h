// kernels/cuda/fused_launch.h: the launchers of kernels/cuda/fused_amp_kernels.cu, the only way into it
// (fused_amp.cpp calls them). Each takes one batch of at most kFusedMaxTensors tensors by value (the
// batch travels in the kernel's parameter space, so no metadata copy is needed) and the stream, and
// returns the launch status; no exceptions cross the .cu boundary.
//
//   UnscaleBatch b; b.count = 1; b.tensors[0] = {ptr, numel, DType::f32};
//   cudaError_t e = launch_fused_unscale(b, found_inf, 0.5f, stream);
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "kernels/optim_functors.h"

namespace ampscope::cuda {

// 48 tensors of 24 bytes (unscale) or of 56 (Adam) stay well inside the 4 KiB of kernel parameters
// every CUDA version accepts.
inline constexpr int kFusedMaxTensors = 48;

struct UnscaleTensor {
  void* data = nullptr;
  std::int64_t numel = 0;
  DType dtype = DType::f32;
};
struct UnscaleBatch {
  int count = 0;
  std::int64_t max_numel = 0;
  UnscaleTensor tensors[kFusedMaxTensors];
};
cudaError_t launch_fused_unscale(const UnscaleBatch& batch, float* found_inf, float inv_scale, cudaStream_t stream);

cudaError_t launch_fused_update_scale(float* scale, std::int32_t* growth_tracker, const float* found_inf,
                                      double growth_factor, double backoff_factor, std::int64_t growth_interval,
                                      cudaStream_t stream);

// The optimizer kernels take kernels/optim_functors.h's step and scalars, built on the host by its
// builders (sgd_step, adam_scalars, adam_flags, adam_bias_correction): the CPU's fused loops use the same.
struct SgdTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* buf = nullptr;
  std::int64_t numel = 0;
  bool first_step = false;
};
struct SgdBatch {
  int count = 0;
  std::int64_t max_numel = 0;
  SgdTensor tensors[kFusedMaxTensors];
};
cudaError_t launch_fused_sgd(const SgdBatch& batch, const SgdStep& step, const float* found_inf, cudaStream_t stream);

struct AdamTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float *exp_avg = nullptr, *exp_avg_sq = nullptr, *max_exp_avg_sq = nullptr;
  std::int64_t numel = 0;
  AdamBiasCorrection bias_correction;  // from the tensor's step count
};
struct AdamBatch {
  int count = 0;
  std::int64_t max_numel = 0;
  AdamTensor tensors[kFusedMaxTensors];
};
cudaError_t launch_fused_adam(const AdamBatch& batch, const AdamScalars& scalars, const AdamFlags& flags,
                              const float* found_inf, cudaStream_t stream);

}  // namespace ampscope::cuda
