#include "probes/analysis/fp8.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace ampscope::analysis {

namespace {

int operand_rank(const std::string& operand) { return operand == "input" ? 0 : operand == "weight" ? 1 : 2; }

// Indices of the operands whose `fraction` is above 0, highest first (a stable sort keeps operands' order on
// ties), at most kFp8Worst.
template <typename Fraction>
std::vector<std::size_t> worst(const std::vector<Fp8OperandSummary>& operands, Fraction fraction) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < operands.size(); ++i)
    if (fraction(operands[i]) > 0) out.push_back(i);
  std::stable_sort(out.begin(), out.end(),
                   [&](std::size_t a, std::size_t b) { return fraction(operands[a]) > fraction(operands[b]); });
  if (out.size() > kFp8Worst) out.resize(kFp8Worst);
  return out;
}

double fp8_format_max(const std::string& format) { return format == "e5m2" ? 57344.0 : 448.0; }

// The steps of one operand's rows (in step order) whose per-step fraction of `count` exceeds `threshold`, as a
// finding of `kind` without remedies; nullopt when no step does.
template <typename Count>
std::optional<Fp8Finding> flagged(const std::vector<const trace::Fp8Row*>& list, const std::string& kind,
                                  double threshold, Count count) {
  Fp8Finding f;
  for (const trace::Fp8Row* r : list) {
    const double fraction = trace::fp8_fraction(count(*r), r->nonzero);
    if (!(fraction > threshold)) continue;
    if (f.steps == 0) f.first_step = r->step;
    f.last_step = r->step;
    ++f.steps;
    f.nonzero += r->nonzero;
    f.count += count(*r);
    if (fraction > f.worst_fraction) {
      f.worst_fraction = fraction;
      f.worst_step = r->step;
    }
    if (kind == "saturation") {
      // amax * scale: where the largest value landed before satfinite held it at max.
      const double scaled = r->amax * r->scale;
      f.max_scaled_amax = std::max(f.max_scaled_amax, scaled);
    }
  }
  if (f.steps == 0) return std::nullopt;
  f.kind = kind;
  f.module = list.front()->module;
  f.operand = list.front()->operand;
  f.format = list.front()->format;
  f.threshold = threshold;
  f.fraction = trace::fp8_fraction(f.count, f.nonzero);
  return f;
}

Fp8Remedy remedy(std::string option, std::string value, std::string why) {
  Fp8Remedy r{std::move(option), std::move(value), "", std::move(why)};
  r.command_line = r.option + " " + r.value;
  return r;
}

void add_findings(const std::vector<const trace::Fp8Row*>& list, std::vector<Fp8Finding>& underflow,
                  std::vector<Fp8Finding>& saturation) {
  const trace::Fp8Row& first = *list.front();
  if (first.operand == "grad_output" && first.format == "e4m3") {
    if (auto f = flagged(list, "e4m3_grad_underflow", kFp8GradUnderflowThreshold,
                         [](const trace::Fp8Row& r) { return r.underflow; })) {
      f->remedies.push_back(remedy("--fp8-format", "hybrid",
                                   "E5M2 for gradients: 57344 / 2^-16, about 2^32, between max and the smallest subnormal; E4M3 has 448 / 2^-9, about 2^18"));
      underflow.push_back(std::move(*f));
    }
  }
  if (auto f = flagged(list, "saturation", kFp8SaturationThreshold,
                       [](const trace::Fp8Row& r) { return r.saturated; })) {
    // The scale a delayed-recipe step uses is fp8_max / 2^margin / (the history's amax); values clipped because
    // this step's amax outgrew the history by amax * scale / fp8_max fit with a margin of ceil(log2 of that).
    const double over = f->max_scaled_amax / fp8_format_max(f->format);
    if (std::isfinite(over)) {
      f->margin = std::clamp(static_cast<int>(std::ceil(std::log2(std::max(over, 1.0)))), 1, 64);
      f->remedies.push_back(remedy("--fp8-margin", std::to_string(f->margin),
                                   "scale / 2^margin keeps amax * scale under the format's max"));
    }
    f->remedies.push_back(remedy("--fp8-recipe", "current", "each cast scales by its own tensor's amax"));
    saturation.push_back(std::move(*f));
  }
}

}  // namespace

Fp8Section analyse_fp8(std::span<const trace::Fp8Row> rows) {
  Fp8Section out;
  out.rows = static_cast<std::int64_t>(rows.size());
  if (rows.empty()) return out;
  std::set<std::int64_t> steps;
  std::set<std::string> modules;
  // (module, operand's rank) -> its rows in step order
  std::map<std::tuple<std::string, int>, std::vector<const trace::Fp8Row*>> by_operand;
  for (const trace::Fp8Row& r : rows) {
    steps.insert(r.step);
    modules.insert(r.module);
    by_operand[{r.module, operand_rank(r.operand)}].push_back(&r);
  }
  out.steps = static_cast<std::int64_t>(steps.size());
  out.modules = static_cast<std::int64_t>(modules.size());
  out.first_step = *steps.begin();
  out.last_step = *steps.rbegin();
  std::vector<Fp8Finding> underflow_findings, saturation_findings;
  for (auto& [key, list] : by_operand) {
    std::stable_sort(list.begin(), list.end(), [](const trace::Fp8Row* a, const trace::Fp8Row* b) { return a->step < b->step; });
    add_findings(list, underflow_findings, saturation_findings);
    Fp8OperandSummary s;
    s.module = list.front()->module;
    s.operand = list.front()->operand;
    s.format = list.front()->format;
    std::set<std::int64_t> own_steps;
    for (const trace::Fp8Row* r : list) {
      own_steps.insert(r->step);
      s.nonzero += r->nonzero;
      s.underflow += r->underflow;
      s.subnormal += r->subnormal;
      s.saturated += r->saturated;
      s.max_rel_rms_error = std::max(s.max_rel_rms_error, r->rel_rms_error);
      const double u = trace::fp8_fraction(r->underflow, r->nonzero);
      const double sat = trace::fp8_fraction(r->saturated, r->nonzero);
      if (u > s.worst_underflow_fraction) {
        s.worst_underflow_fraction = u;
        s.worst_underflow_step = r->step;
      }
      if (sat > s.worst_saturated_fraction) {
        s.worst_saturated_fraction = sat;
        s.worst_saturated_step = r->step;
      }
      s.last_amax = r->amax;
      s.last_scale = r->scale;
      if (trace::fp8_has_range_columns(*r)) {
        if (!(s.max_dynamic_range >= r->dynamic_range)) s.max_dynamic_range = r->dynamic_range;
        s.last_dynamic_range = r->dynamic_range;
        s.last_quantized_dynamic_range = r->quantized_dynamic_range;
        s.last_history_len = r->history_len;
        s.last_history_amax = r->history_amax;
        s.last_history_amax_step = r->history_amax_step;
      }
    }
    s.steps = static_cast<std::int64_t>(own_steps.size());
    s.underflow_fraction = trace::fp8_fraction(s.underflow, s.nonzero);
    s.subnormal_fraction = trace::fp8_fraction(s.subnormal, s.nonzero);
    s.saturated_fraction = trace::fp8_fraction(s.saturated, s.nonzero);
    out.operands.push_back(std::move(s));
  }
  out.findings = std::move(underflow_findings);
  for (Fp8Finding& f : saturation_findings) out.findings.push_back(std::move(f));
  out.worst_underflow = worst(out.operands, [](const Fp8OperandSummary& s) { return s.underflow_fraction; });
  out.worst_saturation = worst(out.operands, [](const Fp8OperandSummary& s) { return s.saturated_fraction; });
  return out;
}

}  // namespace ampscope::analysis
