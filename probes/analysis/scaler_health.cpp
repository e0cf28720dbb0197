// What the GradScaler did over the run, and which skips were it calibrating
// (probes/analysis/internal/scaler_health.h).
#include "probes/analysis/internal/scaler_health.h"

#include "probes/analysis/internal/analyser_state.h"
#include "probes/analysis/internal/remedies.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/scaler_calibration.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace ampscope::analysis {
namespace detail {

using trace::StepRow;

namespace {

// The growth interval the run's config names ("growth_interval": N in the JSON text), 2000 otherwise.
std::int64_t growth_interval_of(const trace::RunInfo& run) {
  const std::string key = "\"growth_interval\"";
  const auto at = run.config.find(key);
  if (at == std::string::npos) return 2000;
  std::size_t i = run.config.find(':', at + key.size());
  if (i == std::string::npos) return 2000;
  ++i;
  while (i < run.config.size() && run.config[i] == ' ') ++i;
  std::int64_t v = 0;
  bool any = false;
  while (i < run.config.size() && run.config[i] >= '0' && run.config[i] <= '9') {
    v = v * 10 + (run.config[i++] - '0');
    any = true;
  }
  return any && v > 0 ? v : 2000;
}

// Whether the run was an evaluation (`ampscope train --eval` writes "eval":true in its config): forward
// passes only, so no gradients and no scaler.
bool is_evaluation(const trace::RunInfo& run) { return run.config.find("\"eval\":true") != std::string::npos; }

}  // namespace

// ---- scaler health ----

// The scaler's verdict on the run (ScalerHealth::verdict and message), from the counts scaler_health() made;
// longest_clean: the longest run of unskipped steps.
void judge_scaler(ScalerHealth& sh, const std::vector<StepRow>& steps, const trace::RunInfo& run_info,
                  std::int64_t longest_clean) {
  // The settle window: the first max(20, 10%) steps, where a too-high initial scale backs off.
  const std::int64_t n = sh.steps;
  const std::int64_t window = std::max<std::int64_t>(20, n / 10);
  std::int64_t late_steps = 0, late_skips = 0, late_run = 0, late_longest = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (static_cast<std::int64_t>(i) < window) continue;
    ++late_steps;
    if (steps[i].skipped) {
      ++late_skips;
      late_longest = std::max(late_longest, ++late_run);
    } else {
      late_run = 0;
    }
  }
  const std::int64_t interval = growth_interval_of(run_info);
  const std::string trajectory = fmt::format("scale {} -> {} (min {}, max {})", sh.scale_start, sh.scale_end,
                                             sh.scale_min, sh.scale_max);
  const std::string skips = fmt::format("{} of {} steps skipped ({}), longest run {}", sh.skipped, n,
                                        fraction_text(sh.skip_rate), sh.longest_skip_run);
  if (!sh.used && is_evaluation(run_info)) {
    sh.verdict = "no_scaler";
    sh.message = "an evaluation run (--eval): forward passes only, no gradients to scale";
  } else if (!sh.used) {
    sh.verdict = "no_scaler";
    sh.message = "the scale is 1 at every step: no loss scaling (fine in fp32 and bf16; fp16 gradients can "
                 "underflow without it)";
  } else if (sh.scale_min < 1) {
    sh.verdict = "collapsed";
    sh.message = fmt::format("the scale collapsed below 1: {}; {}. Backing off cannot fix an overflow that "
                             "comes back every step",
                             trajectory, skips);
  } else if ((late_steps > 0 && (static_cast<double>(late_skips) > 0.05 * static_cast<double>(late_steps) ||
                                 late_longest > 5)) ||
             (late_steps == 0 && (sh.longest_skip_run > 5 || sh.skip_rate > 0.5))) {
    sh.verdict = "persistent";
    sh.message = fmt::format("skipping persists: {}; {}. An overflow keeps coming back", skips, trajectory);
  } else if (sh.growths == 0 && n > interval) {
    sh.verdict = "never_grows";
    sh.message = fmt::format("the scale never grew in {} steps (growth interval {}; longest run of unskipped "
                             "steps {}): {}; {}",
                             n, interval, longest_clean, trajectory,
                             longest_clean < interval ? "skips keep resetting the growth tracker"
                                                      : "a clean run long enough to grow did not");
  } else if (sh.skipped > 0 && late_skips == 0 && late_steps > 0) {
    sh.verdict = "settled";
    sh.message = fmt::format("{} early skip{} while the scale backed off from {} (normal), none after step {}; {}",
                             sh.skipped, sh.skipped == 1 ? "" : "s", sh.scale_start, sh.last_skip, trajectory);
  } else {
    sh.verdict = "healthy";
    sh.message = sh.skipped == 0 ? fmt::format("no step skipped; {}", trajectory)
                                 : fmt::format("occasional skips: {}; {}", skips, trajectory);
  }
}

// What the GradScaler did over the run (/steps): its growths, backoffs and skips, the longest run of skips,
// the range of the scale, and the verdict.
ScalerHealth scaler_health(const std::vector<StepRow>& steps, const trace::RunInfo& run_info) {
  ScalerHealth sh;
  sh.steps = static_cast<std::int64_t>(steps.size());
  std::int64_t run = 0, clean_run = 0, longest_clean = 0;
  for (const StepRow& s : steps) {
    if (s.scale != 1 || s.scale_after != 1) sh.used = true;
    if (s.scale_after > s.scale) ++sh.growths;
    if (s.scale_after < s.scale) ++sh.backoffs;
    if (s.skipped) {
      ++sh.skipped;
      if (sh.first_skip < 0) sh.first_skip = s.step;
      sh.last_skip = s.step;
      sh.longest_skip_run = std::max(sh.longest_skip_run, ++run);
      clean_run = 0;
    } else {
      run = 0;
      longest_clean = std::max(longest_clean, ++clean_run);
    }
  }
  if (!steps.empty()) {
    sh.skip_rate = static_cast<double>(sh.skipped) / static_cast<double>(steps.size());
    sh.scale_start = steps.front().scale;
    sh.scale_end = steps.back().scale_after;
    sh.scale_min = sh.scale_max = sh.scale_start;
    for (const StepRow& s : steps) {
      sh.scale_min = std::min({sh.scale_min, s.scale, s.scale_after});
      sh.scale_max = std::max({sh.scale_max, s.scale, s.scale_after});
    }
  }
  judge_scaler(sh, steps, run_info, longest_clean);
  return sh;
}

// Skipped steps from `step` on.
std::int64_t skipped_from(const std::vector<StepRow>& steps, std::int64_t step) {
  std::int64_t n = 0;
  for (const StepRow& s : steps) n += (s.step >= step && s.skipped) ? 1 : 0;
  return n;
}

}  // namespace detail

using namespace detail;

// ---- calibration: skips that a smaller scale cured ----

// A skipped step whose forward pass and loss were finite is the scaler calibrating when a later unskipped
// step ran at a smaller scale (the backoff cured it) and no earlier unskipped step had run at this scale or
// above (the gradients did not grow: the scale was too high, from the start or after a growth).
// A skip in the run's last step cannot show its cure: it is calibration when a skip at the same scale
// earlier in the run was (the same overshoot, cured before).
// One pass each way over /steps: the largest scale an unskipped step ran at before each step, and the
// smallest one after it (steps are in increasing order, each once).
void Analyser::State::decide_calibration() {
  ScalerHealth& sh = rep.scaler;
  const std::size_t n_steps = steps.size();
  const detail::CleanScales clean = detail::clean_scales(steps);
  const std::vector<double>& clean_max_before = clean.max_before;
  const std::vector<double>& clean_min_after = clean.min_after;
  std::set<double> cured_scales;
  const std::int64_t last_step_of_run = steps.empty() ? -1 : steps.back().step;
  for (auto& [step, diagnoses] : pending_calibration) {
    // Pending steps have a /steps row (origins() defers only those).
    const auto at = std::lower_bound(steps.begin(), steps.end(), step,
                                     [](const StepRow& s, std::int64_t k) { return s.step < k; });
    if (at == steps.end() || at->step != step) continue;
    const std::size_t i = static_cast<std::size_t>(at - steps.begin());
    const double scale = at->scale;
    bool cured = clean_min_after[i + 1] < scale;
    const bool fine_before = clean_max_before[i] >= scale;
    if (!cured && step == last_step_of_run && cured_scales.count(scale) > 0) cured = true;
    // At a scale that was fine before, the gradients grew: still the scaler's job when the skip is isolated
    // (the steps either side ran) and skips are rare overall (the verdict is not persistent); a run of such
    // skips, or many, is an anomaly.
    const bool prev_ran = i == 0 || !steps[i - 1].skipped;
    const bool next_ran = i + 1 == n_steps || !steps[i + 1].skipped;
    const bool occasional = prev_ran && next_ran && (sh.verdict == "healthy" || sh.verdict == "settled");
    if (cured && (!fine_before || occasional)) {
      cured_scales.insert(scale);
      ++sh.calibration_skips;
      sh.last_calibration_step = std::max(sh.last_calibration_step, step);
      continue;
    }
    const double lr = at->lr;
    for (Diagnosis& d : diagnoses) {
      d.evidence.push_back(
          !cured ? fmt::format("no later step ran unskipped at a smaller scale than this step's {}: backing off did "
                               "not cure it",
                               number(scale))
                 : fmt::format("an earlier step ran unskipped at scale {} or above: the gradients grew, it is not the "
                               "scaler calibrating",
                               number(scale)));
      // Gradients that grew past what a scale handled before point at the learning rate (or the loss) first;
      // an overflow no smaller scale cured, at the initial scale.
      // Worded from what the steps before show: the learning rate moves the weights only through applied
      // updates, so with none applied (every earlier step skipped) the gradients are those of the weights the run
      // started with, and nothing grew.
      std::int64_t applied_before = 0;
      for (std::size_t j = 0; j < i; ++j) applied_before += steps[j].skipped ? 0 : 1;
      Remedy lower = lr_remedy(lr);
      if (fine_before) {
        lower.text += ": the gradients grew until the scaled ones overflow f16";
      } else if (applied_before == 0) {
        lower.text += fmt::format(": no update was applied before step {} ({}), so its weights are the ones the "
                                  "run started with and a smaller learning rate changes nothing up to there; it "
                                  "matters once steps run, if the gradients then grow",
                                  step, i == 0 ? "the first step recorded" : fmt::format("all {} steps before it were skipped", i));
      } else {
        lower.text += fmt::format(": {} earlier step{} applied updates, at smaller scales only; gradients that grow "
                                  "with the weights overflow f16 when scaled",
                                  applied_before, applied_before == 1 ? "" : "s");
      }
      if (fine_before) d.remedies.insert(d.remedies.begin(), std::move(lower));
      else d.remedies.push_back(std::move(lower));
      d.remedy = remedy_text(d.remedies);
      add(std::move(d), step);
    }
  }
  pending_calibration.clear();
  if (sh.calibration_skips > 0 && sh.calibration_skips == sh.skipped &&
      (sh.verdict == "healthy" || sh.verdict == "persistent")) {
    // Every skip was the scaler settling: that is what the "settled" verdict means, whatever the run's length.
    sh.verdict = "settled";
    sh.message = fmt::format("{} skip{} while the scale backed off from {} (normal), none after step {}; scale {} -> {} "
                             "(min {}, max {})",
                             sh.skipped, sh.skipped == 1 ? "" : "s", sh.scale_start, sh.last_skip, sh.scale_start,
                             sh.scale_end, sh.scale_min, sh.scale_max);
  }
  if (sh.calibration_skips > 0) {
    sh.message += fmt::format("; {} skip{} up to step {} {} the scaler calibrating (gradients overflowed only at a "
                              "scale a smaller one cured): not anomalies",
                              sh.calibration_skips, sh.calibration_skips == 1 ? "" : "s", sh.last_calibration_step,
                              sh.calibration_skips == 1 ? "was" : "were");
  }
}

}  // namespace ampscope::analysis
