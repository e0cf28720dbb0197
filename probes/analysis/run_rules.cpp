// What the whole run shows (Analyser::finish), after the scaler's health and calibration: propagation over
// the steps, later steps made non-finite by corrupted weights, gradient underflow, scale collapse
// (probes/analysis/internal/analyser_state.h).
#include "probes/analysis/internal/analyser_state.h"

#include "probes/analysis/internal/remedies.h"
#include "probes/analysis/internal/scaler_health.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampscope::analysis {

using namespace detail;
using trace::EventRow;
using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

// ---- what the whole run shows (Analyser::finish) ----

// Skipped steps whose ops are all finite, after the first origin: the scaler found inf in gradients no op
// of the step produced, so the inf stayed in .grad: gradients are never cleared.
std::vector<std::int64_t> Analyser::State::stale_steps() const {
  std::vector<std::int64_t> stale;
  std::int64_t first_origin_step = -1;
  for (const auto& [step, f] : facts)
    if (f.origin) {
      first_origin_step = step;
      break;
    }
  if (first_origin_step >= 0) {
    for (const StepRow& s : steps) {
      auto f = facts.find(s.step);
      if (s.step > first_origin_step && s.skipped && f != facts.end() && !f->second.nonfinite && f->second.has_ops)
        stale.push_back(s.step);
    }
  }
  return stale;
}

// Each diagnosis's consequences over the run (its later non-finite ops, the loss, the skipped steps from its
// step on); a gradient overflow followed by stale skipped steps (stale_steps) is gradients that accumulate.
void Analyser::State::propagation_over_steps() {
  const std::vector<std::int64_t> stale = stale_steps();
  for (Diagnosis& d : rep.anomalies) {
    d.skipped_steps = skipped_from(steps, d.step);
    d.evidence.push_back(fmt::format("{} later op{} of step {} turned non-finite{}; the loss was {}; {} step{} "
                                     "skipped from step {} on",
                                     d.downstream_nonfinite, d.downstream_nonfinite == 1 ? "" : "s", d.step,
                                     d.silently_wrong > 0 || !d.absorbed_by.empty()
                                         ? fmt::format(" and {} more are silently wrong (finite, from absorbed "
                                                       "NaN/inf)",
                                                       d.silently_wrong + static_cast<std::int64_t>(d.absorbed_by.size()))
                                         : "",
                                     d.loss_nonfinite ? "non-finite" : "finite", d.skipped_steps,
                                     d.skipped_steps == 1 ? "" : "s", d.step));
    if (d.cause == "gradient_overflow" && stale.size() >= 2) {
      d.cause = "accumulating_gradients";
      d.evidence.push_back(fmt::format("{} later skipped step{} (first {}) had no non-finite op: the inf stayed in "
                                       ".grad, so gradients are never cleared",
                                       stale.size(), stale.size() == 1 ? "" : "s", stale.front()));
      std::vector<std::string> norms;
      for (const StepRow& s : steps)
        if (s.step <= d.step) norms.push_back(fmt::format("{:.4g}", s.grad_norm));
      d.evidence.push_back(fmt::format("grad_norm up to step {}: {}", d.step, fmt::join(norms, ", ")));
      d.remedies = {zero_grad_remedy()};
      d.remedy = remedy_text(d.remedies);
    }
  }
}

// Steps made non-finite by weights that the optimizer, or an applied non-finite step, turned NaN/inf: evidence
// of the diagnosis that explains them, not diagnoses of their own.
void Analyser::State::later_steps_evidence() {
  // Steps made non-finite by weights the optimizer itself turned NaN/inf: evidence of that diagnosis.
  if (optimizer_wrote.later_steps > 0) {
    const auto& w = optimizer_wrote;
    for (Diagnosis& d : rep.anomalies) {
      if (d.step != w.step || d.phase != Phase::optimizer) continue;
      d.evidence.push_back(fmt::format(
          "the weights it wrote hold NaN/inf: {} later step{} ({} to {}) turned non-finite from their first op ({}) "
          "with no new origin",
          w.later_steps, w.later_steps == 1 ? "" : "s", w.first_later, w.last_later,
          w.first_op.empty() ? "?" : w.first_op));
      break;
    }
  }

  // Steps made non-finite by weights that an applied non-finite step corrupted: evidence of the diagnosis of
  // that step (or the last one before it), not diagnoses of their own.
  if (applied.later_steps > 0) {
    const auto& a = applied;
    Diagnosis* cause = nullptr;
    for (Diagnosis& d : rep.anomalies)
      if (d.step <= a.step && (cause == nullptr || d.step > cause->step)) cause = &d;
    if (cause == nullptr && !rep.anomalies.empty()) cause = &rep.anomalies.front();
    if (cause != nullptr) {
      cause->evidence.push_back(fmt::format(
          "step {} was not skipped ({}), so the optimizer applied its non-finite gradients: the weights hold "
          "NaN/inf, and {} later step{} ({} to {}) turned non-finite from their first op ({}) with no new origin",
          a.step, a.scale == 1 ? "the scale is 1: no GradScaler to skip it" : "the scaler did not skip it",
          a.later_steps, a.later_steps == 1 ? "" : "s", a.first_later, a.last_later,
          a.first_op.empty() ? "?" : a.first_op));
      cause->remedies.push_back(simple("enable_scaler",
                                       "never apply a step whose gradients are non-finite (a GradScaler skips it), so "
                                       "one bad step cannot write NaN/inf into the weights",
                                       "", "GradScaler scaler;  // scaler.scale(loss).backward(); scaler.step(opt); "
                                           "scaler.update();"));
      cause->remedy = remedy_text(cause->remedies);
    }
  }
}

// ---- gradient underflow: nothing non-finite, and every gradient exactly zero at most steps ----

void Analyser::State::gradient_underflow() {
  const ScalerHealth& sh = rep.scaler;
  std::int64_t grad_steps = 0, zero_steps = 0, first_zero = -1, last_grad_step = 0;
  for (const auto& [step, f] : facts) {
    if (f.grad_state < 0) continue;
    ++grad_steps;
    last_grad_step = step;
    if (f.grad_state == 1) {
      ++zero_steps;
      if (first_zero < 0) first_zero = step;
    }
  }
  if (!any_nonfinite && grad_steps > 0 && zero_steps * 2 > grad_steps) {
    Diagnosis d;
    d.step = first_zero;
    d.phase = Phase::backward;
    d.cause = "gradient_underflow";
    d.occurrences = zero_steps;
    d.evidence.push_back(fmt::format("every gradient ({} parameters: {}) is exactly 0 (norm 0, absmax 0) at {} of "
                                     "{} recorded steps, from step {}; no NaN or inf anywhere",
                                     params.size(), fmt::join(params, ", "), zero_steps, grad_steps, first_zero));
    if (!steps.empty())
      d.evidence.push_back(fmt::format("the loss went {:.6g} -> {:.6g}: no parameter moved", steps.front().loss,
                                       steps.back().loss));
    if (!sh.used) {
      d.evidence.push_back("the scale is 1 at every step: no loss scaler");
      d.remedies.push_back(simple("enable_scaler",
                                  "enable the GradScaler (ampscope train uses one in fp16 unless --no-scaler is "
                                  "given: drop it): it multiplies the loss so small gradients stay above f16's "
                                  "smallest subnormal (2^-24)",
                                  "",
                                  "GradScaler scaler({.init_scale = 65536});  // scaler.scale(loss).backward(); "
                                  "scaler.step(opt); scaler.update();",
                                  65536));
    } else {
      d.evidence.push_back(fmt::format("the scale ran between {} and {}", sh.scale_min, sh.scale_max));
      const double higher = std::max(65536.0, sh.scale_max * 256);
      d.remedies.push_back(simple("init_scale",
                                  "raise the initial scale so the scaled gradients stay above f16's smallest "
                                  "subnormal (2^-24)",
                                  fmt::format("--init-scale {}", number(higher)),
                                  fmt::format("GradScaler scaler({{.init_scale = {}}});", number(higher)), higher));
    }
    if (rep.run.precision == "fp16") d.remedies.push_back(bf16_remedy());
    d.remedy = remedy_text(d.remedies);
    d.gradients.assign(params.begin(), params.end());
    d.last_step = last_grad_step;
    rep.anomalies.push_back(std::move(d));
  }
}

// ---- scale collapse: the scale fell below 1 while skipping ----

void Analyser::State::scale_collapse() {
  const ScalerHealth& sh = rep.scaler;
  if (sh.used && sh.scale_min < 1) {
    const StepRow* below = nullptr;
    for (const StepRow& s : steps) {
      if (s.skipped && s.scale_after < 1) {
        below = &s;
        break;
      }
    }
    if (below != nullptr) {
      Diagnosis d;
      d.step = below->step;
      d.seq = std::numeric_limits<std::int64_t>::max();
      d.phase = Phase::scaler;
      d.cause = "scale_collapse";
      // Propagation as for any diagnosis: from its own step on (the skips before it are in the evidence).
      d.skipped_steps = skipped_from(steps, below->step);
      d.loss_nonfinite = !std::isfinite(below->loss);
      d.last_step = below->step;
      d.evidence.push_back(fmt::format("the scale went {} -> {} (min {}); {} of {} steps skipped, the longest run {}",
                                       sh.scale_start, sh.scale_end, sh.scale_min, sh.skipped, sh.steps,
                                       sh.longest_skip_run));
      const Diagnosis* recurring = nullptr;
      for (const Diagnosis& a : rep.anomalies)
        if (a.seq != d.seq && (recurring == nullptr || a.occurrences > recurring->occurrences)) recurring = &a;
      if (recurring != nullptr) {
        d.evidence.push_back(fmt::format("the same origin ({} in {}, {}) came back in {} steps: the overflow is "
                                         "not transient, so backing off cannot fix it",
                                         recurring->op, recurring->module.empty() ? "no module" : recurring->module,
                                         recurring->cause, recurring->occurrences));
        d.remedies = recurring->remedies;
        d.remedy = fmt::format("fix the recurring origin ({} in {}: {}); raising the initial scale or lowering the "
                               "minimum scale only delays the collapse",
                               recurring->op, recurring->module.empty() ? "no module" : recurring->module,
                               recurring->remedy);
      } else {
        d.remedies.push_back(lr_remedy(steps.empty() ? std::nan("") : steps.front().lr));
        d.remedy = "find the overflow the scaler keeps meeting (non-finite gradients every step); " +
                   remedy_text(d.remedies);
      }
      rep.anomalies.push_back(std::move(d));
    }
  }
}

}  // namespace ampscope::analysis
