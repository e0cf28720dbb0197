// One-pass SGD and Adam/AdamW steps on the CPU (kernels/cpu/fused_optim.h). Every element runs the
// unfused path's sequence of functors with the same f32 scalars, so only the number of memory passes
// changes. -ffp-contract=off (the top-level CMakeLists.txt) keeps the compiler from fusing a multiply
// and an add into one rounding here, which the separate ops of the unfused path never do. This file is
// also built with -fno-math-errno and -fno-trapping-math (kernels/CMakeLists.txt), without which GCC
// leaves these loops scalar (the step over GPT-2 small's 124M parameters took a quarter of the training
// step): neither flag licenses a transformation that changes a value (those are -fassociative-math,
// -ffinite-math-only and the like, never used here); sqrt stays IEEE's correctly rounded square root,
// only errno and the floating-point exception flags, which nothing reads, are no longer kept exact.
// fused_cpu_test checks the bits against the unfused ops, NaN, infinities and subnormals included.
#include "kernels/cpu/fused_optim.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/parallel.h"
#include "kernels/functors.h"

namespace ampscope::cpu {
namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("AMPSCOPE_FUSED_OPTIM");
    return env == nullptr || std::string(env) != "0";
  }();
  return flag;
}

std::atomic<std::uint64_t> g_calls{0};

void check_f32(const TensorView& v, std::int64_t numel, const char* op, const char* what, std::size_t index) {
  if (v.dtype != DType::f32) {
    throw DTypeError(fmt::format("{}: {} of tensor {} is {}; the fused CPU step takes f32 only\nhint: run the "
                                 "optimizer's unfused ops (the optimizers do so by themselves for other dtypes)",
                                 op, what, index, dtype_name(v.dtype)));
  }
  if (!v.is_contiguous() || v.numel != numel) {
    throw ShapeError(fmt::format("{}: {} of tensor {} must be contiguous with {} elements (it has {})", op, what,
                                 index, numel, v.numel));
  }
}

bool skipped(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }

template <class F>
void with_bool(bool value, const F& f) {
  if (value) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// One Adam/AdamW tensor's pointers and its f32 scalars.
struct AdamRow {
  float* param;
  const float* grad;
  float *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
  float decay_factor, weight_decay, lerp_weight, one_minus_lerp, beta2, one_minus_beta2, eps, inv_bc2_sqrt,
      neg_step_size;
};

// Adam::update's ops on elements [b, e), one element at a time, each op's result rounded to f32.
template <bool kMaximize, bool kDecoupled, bool kCoupled, bool kFirstForm, bool kAmsgrad>
void adam_elements(const AdamRow& r, std::int64_t b, std::int64_t e) {
  float* __restrict param = r.param;
  const float* __restrict grad = r.grad;
  float* __restrict exp_avg = r.exp_avg;
  float* __restrict exp_avg_sq = r.exp_avg_sq;
  float* __restrict max_exp_avg_sq = r.max_exp_avg_sq;
  for (std::int64_t i = b; i < e; ++i) {
    float p = param[i];
    float g = grad[i];
    if constexpr (kMaximize) g = NegFn{}(g);
    if constexpr (kDecoupled) p = MulFn{}(p, r.decay_factor);             // mul(p, 1 - lr * wd)
    if constexpr (kCoupled) g = AddFn{}(g, MulFn{}(p, r.weight_decay));   // fused_add(g, p, wd)
    // fused_lerp(m, g, 1 - beta1), the form chosen on |w| < 0.5
    float m = exp_avg[i];
    const float diff = SubFn{}(g, m);
    if constexpr (kFirstForm) {
      m = AddFn{}(m, MulFn{}(diff, r.lerp_weight));
    } else {
      m = SubFn{}(g, MulFn{}(diff, r.one_minus_lerp));
    }
    // fused_addcmul(mul(v, beta2), g, g, 1 - beta2)
    const float v = AddFn{}(MulFn{}(exp_avg_sq[i], r.beta2), MulFn{}(MulFn{}(g, g), r.one_minus_beta2));
    float second = v;
    if constexpr (kAmsgrad) {
      // exact_maximum: argmax over (old, v), NaN the largest and the first on ties, then where():
      // values move without rounding, NaN bits kept.
      const float old = max_exp_avg_sq[i];
      second = (old == old && (v != v || v > old)) ? v : old;
      max_exp_avg_sq[i] = second;
    }
    // add(div(sqrt(second), bias_correction2_sqrt), eps)
    const float denom = AddFn{}(MulFn{}(SqrtFn{}(second), r.inv_bc2_sqrt), r.eps);
    // fused_addcdiv(p, m, denom, -step_size)
    p = AddFn{}(p, MulFn{}(DivFn{}(m, denom), r.neg_step_size));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
  }
}

}  // namespace

bool fused_optim_enabled() { return enabled_flag().load(); }
void set_fused_optim_enabled(bool enabled) { enabled_flag().store(enabled); }
std::uint64_t fused_optim_call_count() { return g_calls.load(); }

void fused_sgd_step(const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& o, const float* found_inf) {
  const char* op = "fused_sgd_step";
  const bool has_momentum = o.momentum != 0.0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const FusedSgdTensor& t = tensors[i];
    check_f32(t.param, t.param.numel, op, "param", i);
    check_f32(t.grad, t.param.numel, op, "grad", i);
    if (has_momentum) {
      if (t.momentum_buffer.data == nullptr) {
        throw Error(fmt::format("{}: tensor {} has no momentum buffer but momentum is {}", op, i, o.momentum));
      }
      check_f32(t.momentum_buffer, t.param.numel, op, "momentum_buffer", i);
    }
  }
  g_calls.fetch_add(1);
  if (skipped(found_inf)) return;
  // SGD::update's scalars as its ops round them: mul/add take a double and compute in float.
  const float weight_decay = static_cast<float>(o.weight_decay);
  const float momentum = static_cast<float>(o.momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - o.dampening);
  const float neg_lr = static_cast<float>(-o.lr);
  const bool has_weight_decay = o.weight_decay != 0.0;
  for (const FusedSgdTensor& t : tensors) {
    float* param = t.param.ptr<float>();
    const float* grad = t.grad.ptr<float>();
    float* buf = has_momentum ? t.momentum_buffer.ptr<float>() : nullptr;
    parallel_for(t.param.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        const float p = param[i];
        float g = o.maximize ? NegFn{}(grad[i]) : grad[i];
        if (has_weight_decay) g = AddFn{}(g, MulFn{}(p, weight_decay));  // fused_add(g, p, wd)
        if (has_momentum) {
          // buf = g.clone() on the first step, else fused_add(mul(buf, momentum), g, 1 - dampening).
          const float nb = t.first_step ? g : AddFn{}(MulFn{}(buf[i], momentum), MulFn{}(g, one_minus_dampening));
          buf[i] = nb;
          g = o.nesterov ? AddFn{}(g, MulFn{}(nb, momentum)) : nb;
        }
        param[i] = AddFn{}(p, MulFn{}(g, neg_lr));  // fused_add(param, g, -lr)
      }
    });
  }
}

void fused_adam_step(const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& o, const float* found_inf) {
  const char* op = "fused_adam_step";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const FusedAdamTensor& t = tensors[i];
    check_f32(t.param, t.param.numel, op, "param", i);
    check_f32(t.grad, t.param.numel, op, "grad", i);
    check_f32(t.exp_avg, t.param.numel, op, "exp_avg", i);
    check_f32(t.exp_avg_sq, t.param.numel, op, "exp_avg_sq", i);
    if (o.amsgrad) check_f32(t.max_exp_avg_sq, t.param.numel, op, "max_exp_avg_sq", i);
  }
  g_calls.fetch_add(1);
  if (skipped(found_inf)) return;
  // Adam::update's scalars, rounded to float as its ops round them.
  const bool coupled_decay = o.weight_decay != 0.0 && !o.decoupled_weight_decay;
  const bool decoupled_decay = o.weight_decay != 0.0 && o.decoupled_weight_decay;
  const float weight_decay = static_cast<float>(o.weight_decay);      // fused_add(g, p, wd)
  const float decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);  // mul(p, 1 - lr * wd)
  // fused_lerp's weight in opmath; its two forms are chosen on |w| < 0.5, the second uses 1 - w in float.
  const float lerp_weight = static_cast<float>(1.0 - o.beta1);
  const float one_minus_lerp = 1.0f - lerp_weight;
  const bool first_form = std::fabs(lerp_weight) < 0.5f;
  const float beta2 = static_cast<float>(o.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  const float eps = static_cast<float>(o.eps);
  for (const FusedAdamTensor& t : tensors) {
    // The Python-side scalars in double, as Adam::update computes them.
    const double step = static_cast<double>(t.step);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
    const double step_size = o.lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    // div(x, s) multiplies by the f32 reciprocal of s (core/ops.cpp, div_impl); addcdiv's value in float.
    const float inv_bc2_sqrt = 1.0f / static_cast<float>(bias_correction2_sqrt);
    const float neg_step_size = static_cast<float>(-step_size);
    const AdamRow row{t.param.ptr<float>(), t.grad.ptr<float>(), t.exp_avg.ptr<float>(), t.exp_avg_sq.ptr<float>(),
                      o.amsgrad ? t.max_exp_avg_sq.ptr<float>() : nullptr, decay_factor, weight_decay, lerp_weight,
                      one_minus_lerp, beta2, one_minus_beta2, eps, inv_bc2_sqrt, neg_step_size};
    // The options as template arguments, so that the loop has no branches and the compiler vectorises it.
    with_bool(o.maximize, [&](auto maximize) {
      with_bool(decoupled_decay, [&](auto decoupled) {
        with_bool(coupled_decay, [&](auto coupled) {
          with_bool(first_form, [&](auto first) {
            with_bool(o.amsgrad, [&](auto amsgrad) {
              parallel_for(t.param.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
                adam_elements<decltype(maximize)::value, decltype(decoupled)::value, decltype(coupled)::value,
                              decltype(first)::value, decltype(amsgrad)::value>(row, b, e);
              });
            });
          });
        });
      });
    });
  }
}

}  // namespace ampscope::cpu
