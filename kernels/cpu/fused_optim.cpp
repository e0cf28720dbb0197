// One-pass SGD and Adam/AdamW steps on the CPU (kernels/cpu/fused_optim.h). Every element runs the
// unfused path's sequence of functors with the same f32 scalars, so only the number of memory passes
// changes: that sequence, and the scalars, are kernels/optim_functors.h's, which the CUDA kernels run too. -ffp-contract=off (the top-level CMakeLists.txt) keeps the compiler from fusing a multiply
// and an add into one rounding here, which the separate ops of the unfused path never do. This file is
// also built with -fno-math-errno and -fno-trapping-math (kernels/CMakeLists.txt), without which GCC
// leaves these loops scalar (the step over GPT-2 small's 124M parameters took a quarter of the training
// step): neither flag licenses a transformation that changes a value (those are -fassociative-math,
// -ffinite-math-only and the like, never used here); sqrt stays IEEE's correctly rounded square root,
// only errno and the floating-point exception flags, which nothing reads, are no longer kept exact.
// fused_cpu_test checks the bits against the unfused ops, NaN, infinities and subnormals included.
#include "kernels/cpu/fused_optim.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/parallel.h"
#include "kernels/optim_functors.h"

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

// One Adam/AdamW tensor's pointers and scalars.
struct AdamRow {
  float* param;
  const float* grad;
  float *exp_avg, *exp_avg_sq, *max_exp_avg_sq;
  AdamScalars scalars;
  AdamBiasCorrection bias_correction;
};

// adam_element on elements [b, e), the options compile-time constants so that the loop vectorises.
template <class Flags>
void adam_elements(const AdamRow& r, std::int64_t b, std::int64_t e) {
  float* __restrict param = r.param;
  const float* __restrict grad = r.grad;
  float* __restrict exp_avg = r.exp_avg;
  float* __restrict exp_avg_sq = r.exp_avg_sq;
  float* __restrict max_exp_avg_sq = r.max_exp_avg_sq;
  const AdamScalars s = r.scalars;
  const AdamBiasCorrection bc = r.bias_correction;
  for (std::int64_t i = b; i < e; ++i) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adam_element(Flags{}, s, bc, p, grad[i], m, v, Flags::amsgrad ? max_exp_avg_sq + i : nullptr);
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
  const SgdStep step = sgd_step(o);
  for (const FusedSgdTensor& t : tensors) {
    float* param = t.param.ptr<float>();
    const float* grad = t.grad.ptr<float>();
    float* buf = has_momentum ? t.momentum_buffer.ptr<float>() : nullptr;
    parallel_for(t.param.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) param[i] = step(param[i], grad[i], buf ? buf + i : nullptr, t.first_step);
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
  const AdamScalars scalars = adam_scalars(o);
  const AdamFlags flags = adam_flags(o);
  for (const FusedAdamTensor& t : tensors) {
    const AdamRow row{t.param.ptr<float>(),
                      t.grad.ptr<float>(),
                      t.exp_avg.ptr<float>(),
                      t.exp_avg_sq.ptr<float>(),
                      o.amsgrad ? t.max_exp_avg_sq.ptr<float>() : nullptr,
                      scalars,
                      adam_bias_correction(o, t.step)};
    // The options as template arguments, so that the loop has no branches and the compiler vectorises it.
    with_bool(flags.maximize, [&](auto maximize) {
      with_bool(flags.decoupled_decay, [&](auto decoupled) {
        with_bool(flags.coupled_decay, [&](auto coupled) {
          with_bool(flags.first_form, [&](auto first) {
            with_bool(flags.amsgrad, [&](auto amsgrad) {
              using Static = AdamStaticFlags<decltype(maximize)::value, decltype(decoupled)::value,
                                             decltype(coupled)::value, decltype(first)::value, decltype(amsgrad)::value>;
              parallel_for(t.param.numel, kElementwiseGrain,
                           [&](std::int64_t b, std::int64_t e) { adam_elements<Static>(row, b, e); });
            });
          });
        });
      });
    });
  }
}

}  // namespace ampscope::cpu
