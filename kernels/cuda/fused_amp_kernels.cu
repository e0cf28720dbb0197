// The fused AMP kernels (kernels/cuda/fused_amp.h): multi-tensor unscale + inf check, the scale update,
// fused SGD and Adam/AdamW steps. Each element's math is the unfused path's sequence of functors, so
// the results are its bits; only the number of launches and memory passes changes.
//
// Multi-tensor layout: blockIdx.y picks the tensor of the batch, blockIdx.x with a grid-stride loop
// covers its elements; blocks past a small tensor's end exit at once.
#include <cstdint>

#include "core/convert.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fused_launch.h"
#include "kernels/functors.h"

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

// _single_tensor_sgd, one element: the ops of SGD::update (core/optim.cpp), each rounded to f32.
__global__ void fused_sgd_kernel(SgdBatch batch, SgdScalars s, const float* found_inf) {
  if (skip_step(found_inf)) return;
  const SgdTensor& t = batch.tensors[blockIdx.y];
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.numel; i += stride) {
    const float p = t.param[i];
    float g = s.maximize ? NegFn{}(t.grad[i]) : t.grad[i];
    if (s.has_weight_decay) g = AddFn{}(g, MulFn{}(p, s.weight_decay));
    if (s.has_momentum) {
      float buf;
      if (t.first_step) {
        buf = g;
      } else {
        buf = AddFn{}(MulFn{}(t.buf[i], s.momentum), MulFn{}(g, s.one_minus_dampening));
      }
      t.buf[i] = buf;
      g = s.nesterov ? AddFn{}(g, MulFn{}(buf, s.momentum)) : buf;
    }
    t.param[i] = AddFn{}(p, MulFn{}(g, s.neg_lr));
  }
}

// _single_tensor_adam(w), one element: the ops of Adam::update (core/optim.cpp), each rounded to f32.
__global__ void fused_adam_kernel(AdamBatch batch, AdamScalars s, const float* found_inf) {
  if (skip_step(found_inf)) return;
  const AdamTensor& t = batch.tensors[blockIdx.y];
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.numel; i += stride) {
    float p = t.param[i];
    float g = s.maximize ? NegFn{}(t.grad[i]) : t.grad[i];
    if (s.decoupled_decay) p = MulFn{}(p, s.decay_factor);
    if (s.coupled_decay) g = AddFn{}(g, MulFn{}(p, s.weight_decay));
    // fused_lerp: the two forms of ATen's Lerp.h, chosen on |w| < 0.5 (uniform across the launch).
    float m = t.exp_avg[i];
    const float diff = SubFn{}(g, m);
    m = fabsf(s.lerp_weight) < 0.5f ? AddFn{}(m, MulFn{}(diff, s.lerp_weight))
                                    : SubFn{}(g, MulFn{}(diff, s.one_minus_lerp));
    // fused_addcmul(mul(v, beta2), g, g, 1 - beta2)
    const float v = AddFn{}(MulFn{}(t.exp_avg_sq[i], s.beta2), MulFn{}(MulFn{}(g, g), s.one_minus_beta2));
    float second = v;
    if (s.amsgrad) {
      // exact_maximum: argmax over (old, v) with NaN largest and the first on ties, then where():
      // values move without rounding, NaN bits kept.
      const float old = t.max_exp_avg_sq[i];
      second = (old == old && (v != v || v > old)) ? v : old;
      t.max_exp_avg_sq[i] = second;
    }
    // add(div(sqrt(second), bc2_sqrt), eps); div by a scalar is a mul by its f32 reciprocal.
    const float denom = AddFn{}(MulFn{}(SqrtFn{}(second), t.inv_bias_correction2_sqrt), s.eps);
    // fused_addcdiv(p, m, denom, -step_size)
    p = AddFn{}(p, MulFn{}(DivFn{}(m, denom), t.neg_step_size));
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.param[i] = p;
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

cudaError_t launch_fused_sgd(const SgdBatch& batch, const SgdScalars& s, const float* found_inf, cudaStream_t stream) {
  if (batch.count == 0) return cudaSuccess;
  fused_sgd_kernel<<<batch_grid(batch.max_numel, batch.count), kThreads, 0, stream>>>(batch, s, found_inf);
  return cudaGetLastError();
}

cudaError_t launch_fused_adam(const AdamBatch& batch, const AdamScalars& s, const float* found_inf,
                              cudaStream_t stream) {
  if (batch.count == 0) return cudaSuccess;
  fused_adam_kernel<<<batch_grid(batch.max_numel, batch.count), kThreads, 0, stream>>>(batch, s, found_inf);
  return cudaGetLastError();
}

}  // namespace ampscope::cuda
