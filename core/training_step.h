// core/training_step.h: one training step, recorded from what the loop already has. probe::Step opens
// the step (the probe groups the step's rows under its number and starts its clock); finish() takes the
// optimizer step itself - scaler.step(opt) then scaler.update() with a GradScaler, opt.step() without -
// and writes the step's /steps row (probe::StepSummary) with every field filled at the moment it is true.
//
//   for (std::int64_t n = 0; n < steps; ++n) {
//     probe::Step step(n);                              // opens step n
//     opt.zero_grad();
//     Tensor loss;
//     { AutocastGuard autocast; loss = cross_entropy(model(x), y); }
//     scaler.scale(loss).backward();
//     step.finish(loss, opt, scaler);                   // scaler.step(opt), scaler.update(), the /steps row
//   }
//   // bf16 or f32, no scaler: loss.backward(); step.finish(loss, opt);
//   // clipping: step.finish(loss, opt, scaler, {.max_grad_norm = 1.0});   // unscale_, clip, step, update
//
// Why the order cannot go wrong: finish() is the only place the loop's step and update happen, so it reads
// the scale the backward used (before update()), the scale after update(), whether the step was skipped
// (scaler.step's own answer), the gradient norm after unscaling and before the optimizer's step, and the lr
// the step used, each at its moment. The loop never fills a StepSummary. What it could still get wrong
// is refused with an Error before anything changes: a loop that also calls opt.step(), scaler.step() or
// scaler.update() itself in the same step (a second unscale and a second step otherwise), finish() called
// twice. A step left by an exception (the loop's code threw before finish()) is abandoned: the probe closes
// it without a /steps row and is ready for the next step.
//
// Gradients reach the probe once per step with or without a scaler: an enabled GradScaler reports them from
// unscale_ (scaled and unscaled); without one (or with a disabled one) finish() reports them (as
// probe::report_grads(params, true)) before clipping and stepping, unless the loop already did. After the
// optimizer step (and the scaler's update) finish() reports the parameters (probe::report_params) to a hook that
// wants them (ParamsEvent: the probe's parameter checksums in a data-parallel run).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "core/grad_scaler.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/tensor.h"

namespace ampscope::probe {

struct FinishOptions {
  // Clip the gradients, after unscaling, to this total norm (optim::clip_grad_norm_), before the step; the
  // norm clip_grad_norm_ returns is the row's grad_norm. With a GradScaler, finish() unscales first, so
  // the loop must not call scaler.unscale_(opt) itself (an Error says so).
  std::optional<double> max_grad_norm{};
  // The unscaled gradient norm the loop measured itself (after its own scaler.unscale_ and clipping);
  // recorded as given. Not with max_grad_norm.
  std::optional<double> grad_norm{};
};

class Step {
 public:
  explicit Step(std::int64_t step);
  // Without finish() (an exception in the loop's code, a loop that forgot), the step is abandoned: the
  // probe closes it without a /steps row. Never throws.
  ~Step() = default;
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // The end of the step with a GradScaler: [scaler.unscale_(optimizer) and clip_grad_norm_ when
  // max_grad_norm is given], scaler.step(optimizer), scaler.update(), then the /steps row: loss.item(), the
  // scale before and after update(), found_inf and skipped from scaler.step, the growth tracker after
  // update(), the unscaled gradient norm, optimizer's first group's lr, and the milliseconds since the Step
  // opened. The norm, when neither given nor clipped, is measured (optim::get_total_norm, no change to the
  // gradients) only while a probe hook is installed, and is NaN otherwise. A disabled scaler (bf16, f32)
  // behaves as none. Returns the row. Throws Error, before touching anything, when the loop already
  // stepped this optimizer or updated this scaler in this step, or when finish() already ran; the
  // GradScaler's own errors pass through with the step named.
  StepSummary finish(const Tensor& loss, optim::Optimizer& optimizer, GradScaler& scaler, FinishOptions options = {});
  // Without a scaler: the gradients are reported to the probe, [clipped], and optimizer.step() runs.
  StepSummary finish(const Tensor& loss, optim::Optimizer& optimizer, FinishOptions options = {});
  // The end of a forward-only step (evaluation: no backward, no optimizer): the /steps row holds the loss,
  // scale 1 before and after, not skipped, growth tracker 0, grad_norm 0 (there are no gradients), lr 0,
  // and the milliseconds since the Step opened. Throws as finish() does for a finished step or a bad loss.
  StepSummary finish_eval(const Tensor& loss);

  std::int64_t number() const { return step_; }

 private:
  void check_finishable(const Tensor& loss) const;
  StepSummary finish_impl(const Tensor& loss, optim::Optimizer& optimizer, GradScaler* scaler,
                          const FinishOptions& options);

  std::int64_t step_;
  std::chrono::steady_clock::time_point start_;
  StepScope scope_;
  bool finished_ = false;
};

}  // namespace ampscope::probe
