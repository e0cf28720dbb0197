// kernels/optim_functors.h: one element of the fused SGD and Adam/AdamW steps, written once for the CPU
// loops (kernels/cpu/fused_optim.cpp) and the CUDA kernels (kernels/cuda/fused_amp_kernels.cu). Each runs
// the unfused path's ops (SGD::update, Adam::update in core/optim.cpp) as their functors
// (kernels/functors.h), in their order, every intermediate rounded to f32 as the unfused path's f32
// tensors round it; the scalars are rounded to f32 the way those ops round them, by the host-side
// builders at the end (sgd_step, adam_scalars, adam_flags, adam_bias_correction), which both backends call.
//
//   const SgdStep step = sgd_step(options);
//   param[i] = step(param[i], grad[i], has_momentum ? &buf[i] : nullptr, first_step);
//
// Nothing here may be contracted into a fused multiply-add: the CPU is built with -ffp-contract=off,
// nvcc with -fmad=false (cmake/cuda.cmake), so `AddFn{}(a, MulFn{}(b, c))` rounds twice on both.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/backend.h"
#include "kernels/functors.h"

namespace ampscope {

// ---- SGD (_single_tensor_sgd) ----

struct SgdStep {
  float weight_decay = 0, momentum = 0, one_minus_dampening = 1, neg_lr = 0;
  bool has_weight_decay = false, has_momentum = false, nesterov = false, maximize = false;

  // The new value of one parameter element p with gradient grad. With momentum, buf is the element's
  // momentum buffer: read (unless first_step, when the buffer starts as the gradient) and written.
  AMPSCOPE_HD float operator()(float p, float grad, float* buf, bool first_step) const {
    float g = maximize ? NegFn{}(grad) : grad;
    if (has_weight_decay) g = AddFn{}(g, MulFn{}(p, weight_decay));  // fused_add(g, p, wd)
    if (has_momentum) {
      // buf = g.clone() on the first step, else fused_add(mul(buf, momentum), g, 1 - dampening).
      const float nb = first_step ? g : AddFn{}(MulFn{}(*buf, momentum), MulFn{}(g, one_minus_dampening));
      *buf = nb;
      g = nesterov ? AddFn{}(g, MulFn{}(nb, momentum)) : nb;
    }
    return AddFn{}(p, MulFn{}(g, neg_lr));  // fused_add(param, g, -lr)
  }
};

// ---- Adam / AdamW (_single_tensor_adam) ----

// A parameter group's f32 scalars.
struct AdamScalars {
  float weight_decay = 0;    // coupled (Adam): g += weight_decay * p
  float decay_factor = 1;    // decoupled (AdamW): p *= 1 - lr * weight_decay
  float lerp_weight = 0;     // 1 - beta1
  float one_minus_lerp = 1;  // 1 - lerp_weight, in float (ATen's Lerp.h second form)
  float beta2 = 0, one_minus_beta2 = 0, eps = 0;
};
// One tensor's scalars, from its step count.
struct AdamBiasCorrection {
  float neg_step_size = 0;              // -lr / (1 - beta1^step)
  float inv_bias_correction2_sqrt = 1;  // 1 / sqrt(1 - beta2^step): div by a scalar is a mul by this
};
// The options as run-time values (the GPU kernel reads them per launch)...
struct AdamFlags {
  bool maximize = false, decoupled_decay = false, coupled_decay = false, first_form = false, amsgrad = false;
};
// ... or as compile-time ones (the CPU loop: no branches, so the compiler vectorises it). adam_element
// reads `flags.x` either way.
template <bool kMaximize, bool kDecoupled, bool kCoupled, bool kFirstForm, bool kAmsgrad>
struct AdamStaticFlags {
  static constexpr bool maximize = kMaximize, decoupled_decay = kDecoupled, coupled_decay = kCoupled,
                        first_form = kFirstForm, amsgrad = kAmsgrad;
};

// One element: param, exp_avg and exp_avg_sq updated in place; max_exp_avg_sq (amsgrad only, else
// unused and may be null) too.
template <class Flags>
AMPSCOPE_HD inline void adam_element(const Flags& flags, const AdamScalars& s, const AdamBiasCorrection& bc,
                                     float& param, float grad, float& exp_avg, float& exp_avg_sq,
                                     float* max_exp_avg_sq) {
  float p = param;
  float g = grad;
  if (flags.maximize) g = NegFn{}(g);
  if (flags.decoupled_decay) p = MulFn{}(p, s.decay_factor);            // mul(p, 1 - lr * wd)
  if (flags.coupled_decay) g = AddFn{}(g, MulFn{}(p, s.weight_decay));  // fused_add(g, p, wd)
  // fused_lerp(m, g, 1 - beta1): the two forms of ATen's Lerp.h, chosen on |w| < 0.5
  float m = exp_avg;
  const float diff = SubFn{}(g, m);
  m = flags.first_form ? AddFn{}(m, MulFn{}(diff, s.lerp_weight)) : SubFn{}(g, MulFn{}(diff, s.one_minus_lerp));
  // fused_addcmul(mul(v, beta2), g, g, 1 - beta2)
  const float v = AddFn{}(MulFn{}(exp_avg_sq, s.beta2), MulFn{}(MulFn{}(g, g), s.one_minus_beta2));
  float second = v;
  if (flags.amsgrad) {
    // exact_maximum: argmax over (old, v), NaN the largest and the first on ties, then where(): values
    // move without rounding, NaN bits kept.
    const float old = *max_exp_avg_sq;
    second = (old == old && (v != v || v > old)) ? v : old;
    *max_exp_avg_sq = second;
  }
  // add(div(sqrt(second), bias_correction2_sqrt), eps)
  const float denom = AddFn{}(MulFn{}(SqrtFn{}(second), bc.inv_bias_correction2_sqrt), s.eps);
  // fused_addcdiv(p, m, denom, -step_size)
  param = AddFn{}(p, MulFn{}(DivFn{}(m, denom), bc.neg_step_size));
  exp_avg = m;
  exp_avg_sq = v;
}

// ---- the scalars, on the host, as the unfused ops round them ----

// mul(t, s) rounds s to f32; 1 - dampening and -lr are computed in double first.
inline SgdStep sgd_step(const FusedSgdOptions& o) {
  SgdStep s;
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.has_weight_decay = o.weight_decay != 0.0;
  s.momentum = static_cast<float>(o.momentum);
  s.has_momentum = o.momentum != 0.0;
  s.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
  s.neg_lr = static_cast<float>(-o.lr);
  s.nesterov = o.nesterov;
  s.maximize = o.maximize;
  return s;
}

inline AdamScalars adam_scalars(const FusedAdamOptions& o) {
  AdamScalars s;
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);
  // fused_lerp's weight in opmath; the second form uses 1 - w in float.
  s.lerp_weight = static_cast<float>(1.0 - o.beta1);
  s.one_minus_lerp = 1.0f - s.lerp_weight;
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.eps = static_cast<float>(o.eps);
  return s;
}

inline AdamFlags adam_flags(const FusedAdamOptions& o) {
  AdamFlags f;
  f.maximize = o.maximize;
  f.coupled_decay = o.weight_decay != 0.0 && !o.decoupled_weight_decay;
  f.decoupled_decay = o.weight_decay != 0.0 && o.decoupled_weight_decay;
  f.first_form = std::fabs(adam_scalars(o).lerp_weight) < 0.5f;
  f.amsgrad = o.amsgrad;
  return f;
}

// The Python-side scalars in double, as Adam::update computes them from the step count (after this step's
// increment), then rounded as its ops round them: div(x, s) multiplies by the f32 reciprocal of s
// (core/ops.cpp, div_impl); addcdiv's value in float.
inline AdamBiasCorrection adam_bias_correction(const FusedAdamOptions& o, std::int64_t step) {
  const double k = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, k);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, k);
  const double step_size = o.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  AdamBiasCorrection bc;
  bc.neg_step_size = static_cast<float>(-step_size);
  bc.inv_bias_correction2_sqrt = 1.0f / static_cast<float>(bias_correction2_sqrt);
  return bc;
}

}  // namespace ampscope
