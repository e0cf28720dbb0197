#include "core/training_step.h"

#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope::probe {
namespace {

std::vector<Tensor> parameters_of(const optim::Optimizer& optimizer) {
  std::vector<Tensor> params;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params.begin(), group.params.end());
  }
  return params;
}

// A GradScaler error raised inside finish() (the scaler's own order checks) names the step and what
// finish() itself calls, so a loop that also calls them sees why.
template <typename Fn>
auto scaler_call(std::int64_t step, const char* call, Fn&& fn) {
  try {
    return fn();
  } catch (const GradScalerError& e) {
    throw GradScalerError(fmt::format("{}\n  in probe::Step::finish (step {}), which called scaler.{}: finish() runs "
                                      "scaler.step(opt) and scaler.update() itself (and scaler.unscale_(opt) when "
                                      "max_grad_norm is given); the loop must not call them in the same step",
                                      e.what(), step, call));
  }
}

}  // namespace

Step::Step(std::int64_t step) : step_(step), start_(std::chrono::steady_clock::now()), scope_(step) {}

StepSummary Step::finish(const Tensor& loss, optim::Optimizer& optimizer, GradScaler& scaler, FinishOptions options) {
  return finish_impl(loss, optimizer, &scaler, options);
}

StepSummary Step::finish(const Tensor& loss, optim::Optimizer& optimizer, FinishOptions options) {
  return finish_impl(loss, optimizer, nullptr, options);
}

void Step::check_finishable(const Tensor& loss) const {
  if (finished_) {
    throw Error(fmt::format("probe::Step::finish: step {} is already finished\nhint: call finish() once, at the end "
                            "of the step",
                            step_));
  }
  if (current_step() != step_) {
    throw Error(fmt::format("probe::Step::finish: step {} is not the open step (the open step is {})\nhint: open one "
                            "probe::Step per iteration, inside the loop, and finish it before the next one opens",
                            step_, current_step()));
  }
  if (!loss.defined() || loss.numel() != 1) {
    throw Error(fmt::format("probe::Step::finish (step {}): the loss must be a tensor with one element, got {}", step_,
                            loss.defined() ? "shape " + shape_str(loss.shape()) : std::string("an undefined tensor")));
  }
}

StepSummary Step::finish_eval(const Tensor& loss) {
  check_finishable(loss);
  StepSummary summary;
  summary.step = step_;
  summary.loss = loss.item();
  summary.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  finished_ = true;
  scope_.end(summary);
  return summary;
}

StepSummary Step::finish_impl(const Tensor& loss, optim::Optimizer& optimizer, GradScaler* scaler,
                              const FinishOptions& options) {
  // Every refusal comes before anything changes: the step can still be abandoned cleanly.
  check_finishable(loss);
  if (options.max_grad_norm && options.grad_norm) {
    throw Error(fmt::format("probe::Step::finish (step {}): both max_grad_norm and grad_norm are given\nhint: give "
                            "max_grad_norm to let finish() clip and measure, or grad_norm when the loop clipped "
                            "itself",
                            step_));
  }
  if (detail::acted_in_open_step(&optimizer)) {
    throw Error(fmt::format("probe::Step::finish: the optimizer ({}) has already stepped in step {}; finish() takes "
                            "the step itself\nhint: remove the loop's own {}",
                            optimizer.name(), step_,
                            scaler != nullptr ? "scaler.step(opt) and scaler.update()" : "opt.step()"));
  }
  if (scaler != nullptr && detail::acted_in_open_step(scaler)) {
    throw Error(fmt::format("probe::Step::finish: the GradScaler has already been updated in step {}; finish() runs "
                            "scaler.step(opt) and scaler.update() itself\nhint: remove the loop's own "
                            "scaler.update() (and scaler.step(opt))",
                            step_));
  }

  StepSummary summary;
  summary.step = step_;
  summary.loss = loss.item();
  summary.lr = optimizer.param_groups().empty() ? 0.0 : optimizer.param_groups()[0].options.lr;
  const bool scaling = scaler != nullptr && scaler->is_enabled();
  // The scale backward used: only update() (and load_state_dict) change it, and update() comes below.
  summary.scale = scaling ? scaler->get_scale() : 1.0;

  const std::vector<Tensor> params = parameters_of(optimizer);
  // An enabled scaler reports the gradients from unscale_; without one, they are reported here, as
  // they are before clipping and stepping, unless the loop did it already.
  if (!scaling && hook() != nullptr && !unscaled_grads_reported()) report_grads(params, /*unscaled=*/true);

  std::optional<double> grad_norm = options.grad_norm;
  if (options.max_grad_norm) {
    if (scaling) scaler_call(step_, "unscale_(opt)", [&] { scaler->unscale_(optimizer); });
    grad_norm = optim::clip_grad_norm_(params, *options.max_grad_norm).item();
  }

  StepResult stepped{.stepped = true, .found_inf = false};
  if (scaler != nullptr) {
    stepped = scaler_call(step_, "step(opt)", [&] { return scaler->step(optimizer, return_found_inf); });
  } else {
    optimizer.step();
  }
  // Measured after the step: the gradients are unscaled by now (scaler.step unscales unless the loop
  // did), and no optimizer changes a gradient, so this is the norm the step used.
  if (!grad_norm && hook() != nullptr) {
    std::vector<Tensor> grads;
    for (const Tensor& p : params) grads.push_back(p.grad());
    grad_norm = optim::get_total_norm(grads).item();
  }
  if (scaler != nullptr) scaler_call(step_, "update()", [&] { scaler->update(); });
  // The parameters as the step left them (a hook that asks: the probe's checksums of a data-parallel run).
  report_params(params);

  summary.scale_after = scaling ? scaler->get_scale() : 1.0;
  summary.found_inf = stepped.found_inf;
  summary.skipped = !stepped.stepped;
  summary.growth_tracker = scaling ? scaler->get_growth_tracker() : 0;
  summary.grad_norm = grad_norm.value_or(std::numeric_limits<double>::quiet_NaN());
  summary.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  finished_ = true;
  scope_.end(summary);
  return summary;
}

}  // namespace ampscope::probe
