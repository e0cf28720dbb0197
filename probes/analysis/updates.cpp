#include "probes/analysis/updates.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "probes/analysis/precision.h"

namespace ampscope::analysis {

namespace {

// The remedy for every stalled parameter. A larger learning rate is named and rejected on purpose: it is
// the first thing a user tries, and it only moves the elements whose update then clears half an ulp, by a
// rounded amount, while changing the training the learning rate was tuned for.
Remedy master_weights_remedy(const std::string& dtype) {
  Remedy m;
  m.kind = "master_weights_f32";
  m.text = fmt::format(
      "keep f32 master weights: leave the model's parameters (and the optimizer's state) in f32 and run the ops in "
      "{} under autocast, so each update is added in f32, where it survives; a larger learning rate is not the "
      "remedy (it changes the training and still rounds away every update under half an ulp)",
      dtype);
  m.code = fmt::format(
      "// no model.to(DType::{}): parameters stay f32;  AutocastGuard autocast(DType::{});  // around the forward "
      "pass only, with a GradScaler for f16",
      dtype, dtype);
  return m;
}

std::string percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

}  // namespace

SwampedSection analyse_updates(std::span<const trace::UpdateRow> rows) {
  SwampedSection out;
  out.rows = static_cast<std::int64_t>(rows.size());
  if (rows.empty()) return out;
  std::set<std::int64_t> steps;
  std::set<std::string> params;
  for (const trace::UpdateRow& r : rows) {
    steps.insert(r.step);
    params.insert(r.param);
  }
  out.steps = static_cast<std::int64_t>(steps.size());
  out.params = static_cast<std::int64_t>(params.size());
  out.window = std::min<std::int64_t>(kSwampedWindow, out.steps);
  auto first = steps.end();
  std::advance(first, -out.window);
  out.first_step = *first;
  out.last_step = *steps.rbegin();

  std::map<std::string, SwampedParam> by_param;
  std::map<std::string, double> p_weighted, u_weighted;
  for (const trace::UpdateRow& r : rows) {
    if (r.step < out.first_step) continue;
    SwampedParam& p = by_param[r.param];
    p.param = r.param;
    p.dtype = r.dtype;
    p.numel = std::max(p.numel, r.numel);
    p.steps += 1;
    p.nonzero += r.nonzero;
    p.swamped += r.swamped;
    p_weighted[r.param] += r.param_abs_mean * static_cast<double>(r.nonzero);
    u_weighted[r.param] += r.update_abs_mean * static_cast<double>(r.nonzero);
  }
  for (auto& [name, p] : by_param) {
    if (p.nonzero > 0) {
      p.fraction = static_cast<double>(p.swamped) / static_cast<double>(p.nonzero);
      p.param_abs_mean = p_weighted[name] / static_cast<double>(p.nonzero);
      p.update_abs_mean = u_weighted[name] / static_cast<double>(p.nonzero);
    }
    if (p.param_abs_mean > 0) {
      p.half_ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(p.param_abs_mean))) - significand_bits_of(p.dtype));
    }
    const std::string steps_text = out.first_step == out.last_step
                                       ? fmt::format("step {}", out.first_step)
                                       : fmt::format("steps {} to {}", out.first_step, out.last_step);
    p.evidence = fmt::format(
        "{} of {} non-zero updates ({}) rounded away over {}: its values average |p| = {:.3g}, its updates "
        "|u| = {:.3g}, {} half an ulp of {} at that magnitude ({:.3g})",
        p.swamped, p.nonzero, percent(p.fraction), steps_text, p.param_abs_mean, p.update_abs_mean,
        p.update_abs_mean < p.half_ulp ? "under" : "not under", p.dtype, p.half_ulp);
    if (p.nonzero > 0 && 2 * p.swamped > p.nonzero) p.remedies.push_back(master_weights_remedy(p.dtype));
    out.all.push_back(p);
  }
  auto order = [](const SwampedParam& a, const SwampedParam& b) {
    if (a.fraction != b.fraction) return a.fraction > b.fraction;
    return a.param < b.param;
  };
  std::sort(out.all.begin(), out.all.end(), order);
  for (const SwampedParam& p : out.all) {
    if (!p.remedies.empty()) out.stalled.push_back(p);
  }
  return out;
}

}  // namespace ampscope::analysis
