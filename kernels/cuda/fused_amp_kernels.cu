// The fused AMP kernels (kernels/cuda/fused_amp.h): multi-tensor unscale + inf check, the scale update,
// fused SGD and Adam/AdamW steps. Each element's math is the unfused path's sequence of functors, so
// the results are its bits; only the number of launches and memory passes changes. The optimizer
// elements are kernels/optim_functors.h's SgdStep and adam_element, which the CPU's fused loops run too.
//
// Multi-tensor layout: blockIdx.y picks the tensor of the batch, blockIdx.x with a grid-stride loop
// covers its elements; blocks past a small tensor's end exit at once.
#include <cstdint>

#include "core/convert.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused_launch.h"
#include "kernels/functors.h"
#include "kernels/optim_functors.h"

namespace ampscope::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------------------

// The unfused check is sum(x - x) over the gradient widened to f32 (f64 narrowed first): NaN exactly
// when some float(v) is inf or NaN.
template <class T>
__device__ bool non_finite_as_float(T v) {
  const float f = convert<float>(v);
  return !(f - f == 0.0f);
}

template <class T>
__device__ void unscale_tensor(const UnscaleTensor& t, float* found_inf, float inv_scale, bool multiply) {
  using Acc = acc_type<T>;
  T* p = static_cast<T*>(t.data);
  const Acc inv = static_cast<Acc>(inv_scale);
  bool bad = false;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.numel; i += stride) {
    const T v = p[i];
    bad = bad || non_finite_as_float(v);
    // grad.copy_(mul(grad, inv)): widened, multiplied by the scalar in the op-math type, rounded once.
    if (multiply) p[i] = convert<T>(MulFn{}(convert<Acc>(v), inv));
  }
  // Only ever set, never cleared; concurrent writers store the same value (PyTorch's benign race).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

__global__ void fused_unscale_kernel(UnscaleBatch batch, float* found_inf, float inv_scale) {
  const UnscaleTensor& t = batch.tensors[blockIdx.y];
  const bool multiply = inv_scale != 1.0f;  // PyTorch's exact pass-through (payloads kept)
  switch (t.dtype) {
    case DType::f32: unscale_tensor<float>(t, found_inf, inv_scale, multiply); break;
    case DType::f64: unscale_tensor<double>(t, found_inf, inv_scale, multiply); break;
    case DType::f16: unscale_tensor<f16>(t, found_inf, inv_scale, multiply); break;
    case DType::bf16: unscale_tensor<bf16>(t, found_inf, inv_scale, multiply); break;
    default: break;  // refused on the host
  }
}

// Section 1.9, one thread.
__global__ void fused_update_scale_kernel(float* scale, std::int32_t* tracker, const float* found_inf, double growth,
                                          double backoff, std::int64_t interval) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff);  // no lower bound
    *tracker = 0;
    return;
  }
  const std::int64_t n = static_cast<std::int64_t>(*tracker) + 1;
  if (n == interval) {  // == as in PyTorch: an interval <= 0 never grows
    const float grown = static_cast<float>(static_cast<double>(*scale) * growth);
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;  // reset even when the growth was refused
  } else {
    *tracker = static_cast<std::int32_t>(n);
  }
}

// The block reads found_inf once; a skipped step writes nothing at all.
__device__ bool skip_step(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }

// _single_tensor_sgd, one element per thread.
__global__ void fused_sgd_kernel(SgdBatch batch, SgdStep step, const float* found_inf) {
  if (skip_step(found_inf)) return;
  const SgdTensor& t = batch.tensors[blockIdx.y];
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.numel; i += stride) {
    t.param[i] = step(t.param[i], t.grad[i], step.has_momentum ? t.buf + i : nullptr, t.first_step);
  }
}

// _single_tensor_adam(w), one element per thread; the flags are uniform across the launch.
__global__ void fused_adam_kernel(AdamBatch batch, AdamScalars s, AdamFlags flags, const float* found_inf) {
  if (skip_step(found_inf)) return;
  const AdamTensor& t = batch.tensors[blockIdx.y];
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.numel; i += stride) {
    adam_element(flags, s, t.bias_correction, t.param[i], t.grad[i], t.exp_avg[i], t.exp_avg_sq[i],
                 flags.amsgrad ? t.max_exp_avg_sq + i : nullptr);
  }
}

// Enough blocks in x for the largest tensor of the batch, capped: grid-stride loops cover the rest.
dim3 batch_grid(std::int64_t max_numel, int count) {
  const std::int64_t per_tensor = std::min<std::int64_t>((max_numel + kThreads - 1) / kThreads, 1024);
  return dim3(static_cast<unsigned>(std::max<std::int64_t>(per_tensor, 1)), static_cast<unsigned>(count));
}

}  // namespace

// ---- launchers -----------------------------------------------------------------------------------

cudaError_t launch_fused_unscale(const UnscaleBatch& batch, float* found_inf, float inv_scale, cudaStream_t stream) {
  if (batch.count == 0) return cudaSuccess;
  fused_unscale_kernel<<<batch_grid(batch.max_numel, batch.count), kThreads, 0, stream>>>(batch, found_inf, inv_scale);
  return cudaGetLastError();
}

cudaError_t launch_fused_update_scale(float* scale, std::int32_t* growth_tracker, const float* found_inf,
                                      double growth_factor, double backoff_factor, std::int64_t growth_interval,
                                      cudaStream_t stream) {
  fused_update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                                 growth_interval);
  return cudaGetLastError();
}

cudaError_t launch_fused_sgd(const SgdBatch& batch, const SgdStep& step, const float* found_inf, cudaStream_t stream) {
  if (batch.count == 0) return cudaSuccess;
  fused_sgd_kernel<<<batch_grid(batch.max_numel, batch.count), kThreads, 0, stream>>>(batch, step, found_inf);
  return cudaGetLastError();
}

cudaError_t launch_fused_adam(const AdamBatch& batch, const AdamScalars& scalars, const AdamFlags& flags,
                              const float* found_inf, cudaStream_t stream) {
  if (batch.count == 0) return cudaSuccess;
  fused_adam_kernel<<<batch_grid(batch.max_numel, batch.count), kThreads, 0, stream>>>(batch, scalars, flags,
                                                                                         found_inf);
  return cudaGetLastError();
}

}  // namespace ampscope::cuda
