#include "probes/analysis/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

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

// Whether a step's clipping cost more than rounding (saturation, analysis.h kFp8SaturationThreshold): its relative
// RMS error above the format's unit roundoff. A step without a finite error (no finite value to measure) is judged
// by its fraction alone.
bool clipping_lost_values(const trace::Fp8Row& r) {
  return !std::isfinite(r.rel_rms_error) || r.rel_rms_error > fp8_unit_roundoff(r.format);
}

// The steps of one operand's rows (in step order) whose per-step fraction of `count` exceeds `threshold` (for
// saturation, also clipping_lost_values), as a finding of `kind` without remedies; nullopt when no step does.
template <typename Count>
std::optional<Fp8Finding> flagged(const std::vector<const trace::Fp8Row*>& list, const std::string& kind,
                                  double threshold, Count count) {
  Fp8Finding f;
  const bool saturation = kind == "saturation";
  for (const trace::Fp8Row* r : list) {
    const double fraction = trace::fp8_fraction(count(*r), r->nonzero);
    if (!(fraction > threshold)) continue;
    if (saturation && !clipping_lost_values(*r)) continue;
    if (f.steps == 0) f.first_step = r->step;
    f.last_step = r->step;
    ++f.steps;
    f.nonzero += r->nonzero;
    f.count += count(*r);
    if (fraction > f.worst_fraction) {
      f.worst_fraction = fraction;
      f.worst_step = r->step;
    }
    if (saturation) {
      // amax * scale: where the largest value landed before satfinite held it at max.
      const double scaled = r->amax * r->scale;
      f.max_scaled_amax = std::max(f.max_scaled_amax, scaled);
      if (std::isfinite(r->rel_rms_error)) f.error = std::max(f.error, r->rel_rms_error);
    }
  }
  if (f.steps == 0) return std::nullopt;
  f.kind = kind;
  f.module = list.front()->module;
  f.operand = list.front()->operand;
  f.format = list.front()->format;
  f.threshold = threshold;
  f.fraction = trace::fp8_fraction(f.count, f.nonzero);
  if (saturation) f.error_bound = fp8_unit_roundoff(f.format);
  return f;
}

Fp8Remedy remedy(std::string option, std::string value, std::string why) {
  Fp8Remedy r{std::move(option), std::move(value), "", std::move(why)};
  r.command_line = r.option + " " + r.value;
  return r;
}

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

// The first stale delayed scale of one operand's rows (in step order), as analysis.h defines it
// (kFp8SpikeRatio, kFp8StaleUnderflowJump, kFp8StaleMinHeld); nullopt when there is none.
std::optional<Fp8Finding> stale_scale(const std::vector<const trace::Fp8Row*>& list, const Fp8RunSettings& run) {
  const double fmax = fp8_format_max(list.front()->format);
  for (std::size_t i = 1; i + 1 < list.size(); ++i) {
    const trace::Fp8Row& before = *list[i - 1];
    const trace::Fp8Row& spike = *list[i];
    const trace::Fp8Row& after = *list[i + 1];
    // A spike: finite, at least kFp8SpikeRatio times the step before and the step after (a zero or non-finite
    // amax on either side is no measure: the recipe keeps the previous scale for those).
    if (!finite_positive(before.amax) || !finite_positive(spike.amax) || !finite_positive(after.amax)) continue;
    if (!(spike.amax >= kFp8SpikeRatio * before.amax) || !(spike.amax >= kFp8SpikeRatio * after.amax)) continue;
    if (after.step != spike.step + 1 || spike.nonzero == 0 || after.nonzero == 0) continue;
    // Held by the spike: the next step's scale fell, and is fp8_max / 2^m / the spike's amax for an integer m >= 0
    // (the run's margin). The recipe computes it in float: 2^-20 relative covers that rounding.
    if (!(after.scale < spike.scale) || !finite_positive(after.scale)) continue;
    const double ratio = fmax / (after.scale * spike.amax);
    const double m = std::round(std::log2(ratio));
    if (!(m >= 0) || std::fabs(ratio / std::exp2(m) - 1.0) > 0x1p-20) continue;
    const double u_spike = trace::fp8_fraction(spike.underflow, spike.nonzero);
    Fp8Finding f;
    for (std::size_t j = i + 1; j < list.size(); ++j) {
      const trace::Fp8Row& r = *list[j];
      const double u = trace::fp8_fraction(r.underflow, r.nonzero);
      if (r.step != list[j - 1]->step + 1 || r.scale != after.scale || r.nonzero == 0 ||
          !(u - u_spike > kFp8StaleUnderflowJump))
        break;
      if (f.steps == 0) f.first_step = r.step;
      f.last_step = r.step;
      ++f.steps;
      f.nonzero += r.nonzero;
      f.count += r.underflow;
      if (u > f.worst_fraction) {
        f.worst_fraction = u;
        f.worst_step = r.step;
      }
    }
    if (f.steps < kFp8StaleMinHeld) continue;
    f.kind = "stale_scale";
    f.module = spike.module;
    f.operand = spike.operand;
    f.format = spike.format;
    f.threshold = kFp8StaleUnderflowJump;
    f.fraction = trace::fp8_fraction(f.count, f.nonzero);
    f.spike_step = spike.step;
    f.amax_before = before.amax;
    f.amax_spike = spike.amax;
    f.scale_before = spike.scale;
    f.scale_held = after.scale;
    f.underflow_before = u_spike;
    f.underflow_after = trace::fp8_fraction(after.underflow, after.nonzero);
    f.window = run.known && run.recipe == "delayed" && run.algo == "max" ? run.history : 0;
    const bool used_most_recent = run.known && run.algo == "most_recent";
    if (!used_most_recent)
      f.remedies.push_back(remedy("--fp8-amax-algo", "most_recent",
                                  "the scale follows the last step's amax: a spike lowers it for the one step every "
                                  "delayed scale lags"));
    if (!run.known || (run.history > kFp8ShortHistory && !used_most_recent))
      f.remedies.push_back(remedy("--fp8-amax-history", std::to_string(kFp8ShortHistory),
                                  fmt::format("a spike leaves the window after {} steps", kFp8ShortHistory)));
    if (!run.known || run.recipe != "current")
      f.remedies.push_back(remedy("--fp8-recipe", "current", "each cast scales by its own tensor's amax"));
    return f;
  }
  return std::nullopt;
}

// `all`: the operand's rows in step order; `list`: those that are not start-up rows (fp8_start_up_row), which
// the underflow and saturation findings judge. A stale scale is computed from a recorded amax, never the initial
// one, so it is looked for over all rows.
void add_findings(const std::vector<const trace::Fp8Row*>& all, const std::vector<const trace::Fp8Row*>& list,
                  const Fp8RunSettings& run, std::vector<Fp8Finding>& underflow, std::vector<Fp8Finding>& stale,
                  std::vector<Fp8Finding>& saturation) {
  if (auto f = stale_scale(all, run)) stale.push_back(std::move(*f));
  if (list.empty()) return;
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
    // The run's own margin is already in that scale: the margin offered is the run's plus what is missing, and
    // none under the current recipe (margins are the delayed recipe's).
    const double over = f->max_scaled_amax / fp8_format_max(f->format);
    const bool current = run.known && run.recipe == "current";
    if (std::isfinite(over) && !current) {
      const int extra = std::clamp(static_cast<int>(std::ceil(std::log2(std::max(over, 1.0)))), 1, 64);
      f->margin = static_cast<int>(std::min<std::int64_t>(64, extra + (run.known ? run.margin : 0)));
      if (f->margin > (run.known ? run.margin : 0))
        f->remedies.push_back(remedy("--fp8-margin", std::to_string(f->margin),
                                     "scale / 2^margin keeps amax * scale under the format's max"));
    }
    if (!current) f->remedies.push_back(remedy("--fp8-recipe", "current", "each cast scales by its own tensor's amax"));
    saturation.push_back(std::move(*f));
  }
}

// The module with the largest mean relative RMS error of an operand, if that error exceeds its format's unit
// roundoff (analysis.h, fp8_error_dominates); nullopt otherwise. `by_operand` in (module, operand) order.
std::optional<Fp8Finding> error_dominates(
    const std::map<std::tuple<std::string, int>, std::vector<const trace::Fp8Row*>>& by_operand,
    const Fp8RunSettings& run) {
  // Compared by error / the format's unit roundoff: how far past what rounding alone explains (an E5M2 operand
  // rounds twice as coarsely as an E4M3 one).
  struct Worst {
    double error = -1, ratio = -1;
    const std::vector<const trace::Fp8Row*>* rows = nullptr;
  };
  std::map<std::string, Worst> by_module;
  for (const auto& [key, list] : by_operand) {
    double sum = 0;
    std::int64_t n = 0;
    for (const trace::Fp8Row* r : list) {
      if (!std::isfinite(r->rel_rms_error)) continue;  // no finite value to measure against: no error recorded
      sum += r->rel_rms_error;
      ++n;
    }
    if (n == 0) continue;
    const double mean = sum / static_cast<double>(n);
    const double ratio = mean / fp8_unit_roundoff(list.front()->format);
    Worst& w = by_module[std::get<0>(key)];
    if (ratio > w.ratio) w = {mean, ratio, &list};  // operands' order breaks ties
  }
  const Worst* top = nullptr;
  std::string top_module;
  for (const auto& [module, w] : by_module) {
    if (top == nullptr || w.ratio > top->ratio) {
      top = &w;
      top_module = module;
    }
  }
  if (top == nullptr) return std::nullopt;
  const std::vector<const trace::Fp8Row*>& list = *top->rows;
  const double bound = fp8_unit_roundoff(list.front()->format);
  if (!(top->ratio > 1)) return std::nullopt;
  Fp8Finding f;
  f.kind = "fp8_error_dominates";
  f.module = top_module;
  f.operand = list.front()->operand;
  f.format = list.front()->format;
  f.error = top->error;
  f.error_bound = bound;
  f.threshold = bound;
  double next_ratio = -1;
  for (const auto& [module, w] : by_module) {
    if (module != top_module && w.ratio > next_ratio) {
      next_ratio = w.ratio;
      f.next_error = w.error;
      f.next_module = module;
    }
  }
  // The steps whose own error exceeds the bound.
  for (const trace::Fp8Row* r : list) {
    if (!(r->rel_rms_error > bound)) continue;
    if (f.steps == 0) f.first_step = r->step;
    f.last_step = r->step;
    ++f.steps;
    if (r->rel_rms_error > f.worst_fraction) {
      f.worst_fraction = r->rel_rms_error;
      f.worst_step = r->step;
    }
  }
  if (f.steps == 0) {  // the mean exceeds the bound only if some step does; a guard for the record
    f.first_step = f.last_step = f.worst_step = list.front()->step;
  }
  f.fraction = f.error;
  (void)run;  // a module kept in bf16 has no rows, so its remedy is never one the run used
  f.remedies.push_back(remedy("--fp8-keep-bf16", f.module,
                              "its Linear's GEMMs stay in bf16; the other Linears keep FP8"));
  return f;
}

// What the start-up rows of one operand (in step order) lost, when it crossed a finding's threshold; nullopt
// otherwise (or without start-up rows).
std::optional<Fp8StartUp> start_up_summary(const std::vector<const trace::Fp8Row*>& start) {
  if (start.empty()) return std::nullopt;
  Fp8StartUp u;
  u.module = start.front()->module;
  u.operand = start.front()->operand;
  u.format = start.front()->format;
  u.first_step = start.front()->step;
  u.last_step = start.back()->step;
  u.steps = static_cast<std::int64_t>(start.size());
  const bool e4m3_grad = u.operand == "grad_output" && u.format == "e4m3";
  for (const trace::Fp8Row* r : start) {
    u.nonzero += r->nonzero;
    u.underflow += r->underflow;
    u.saturated += r->saturated;
    const double under = trace::fp8_fraction(r->underflow, r->nonzero);
    const double sat = trace::fp8_fraction(r->saturated, r->nonzero);
    u.worst_underflow_fraction = std::max(u.worst_underflow_fraction, under);
    u.worst_saturated_fraction = std::max(u.worst_saturated_fraction, sat);
    if (std::isfinite(r->rel_rms_error)) u.max_error = std::max(u.max_error, r->rel_rms_error);
    if (e4m3_grad && under > kFp8GradUnderflowThreshold) u.underflow_over = true;
    if (sat > kFp8SaturationThreshold && clipping_lost_values(*r)) u.saturation_over = true;
    if (r->rel_rms_error > fp8_unit_roundoff(r->format)) u.error_over = true;
  }
  if (!u.underflow_over && !u.saturation_over && !u.error_over) return std::nullopt;
  return u;
}

}  // namespace

bool fp8_start_up_row(const trace::Fp8Row& row, bool earlier_amax) {
  // The initial scale is exactly 1 (make_delayed_scaling_state); a scale computed from an amax a is
  // fp8_max / 2^margin / a, which is 1 only for a = fp8_max / 2^margin exactly, and then the history would hold
  // a's earlier step, not this one, unless this step's amax is at least as large: both together are the one case
  // the rule would misjudge, and only when that earlier step was not recorded.
  return row.history_len > 0 && row.scale == 1.0 && !earlier_amax &&
         (row.history_amax_step == row.step || row.amax == 0);
}

namespace {
// Marks the accumulated-error entries of the forward `linear`s of `formats`' modules (module -> the formats its
// input and weight were quantized to): an entry of by_jump of kind rounding becomes fp8_quantization (`fp8`) or
// block_quantization, its evidence says so, and its remedies lead with --fp8-keep-bf16 'MODULE'.
void mark_quantized_linears(PrecisionSection& precision, const std::map<std::string, std::set<std::string>>& formats,
                            bool fp8) {
  const auto mark = [&](PrecisionEntry& e, bool jump) {
    if (e.op != "linear" || e.phase != "forward") return;
    const auto it = formats.find(e.module);
    if (it == formats.end()) return;
    e.fp8 = fmt::format("{}", fmt::join(it->second, "/"));
    if (!jump || e.kind != "rounding") return;
    e.kind = fp8 ? "fp8_quantization" : "block_quantization";
    const std::string format = fp8 ? "FP8" : e.fp8;
    // Before the evidence's closing "(step N, seq M)".
    const std::string why = fmt::format("; its input and weight were {} {} for the GEMM, and its own {} rounding is "
                                        "{:.2g} (its local error, against the same {} GEMM in f32): the rest of the "
                                        "jump is the quantization",
                                        fp8 ? "quantized to FP8" : "block-quantized to", e.fp8, e.out_dtype,
                                        e.local_error, format);
    const std::size_t at = e.evidence.rfind(" (step ");
    e.evidence.insert(at == std::string::npos ? e.evidence.size() : at, why);
    if (e.remedies.empty()) return;  // an op that lost little gets none (precision.cpp, kSignificant)
    Remedy m;
    m.kind = "fp8_keep_bf16";
    m.pattern = e.module;
    m.flag = "--fp8-keep-bf16 " + autocast_pattern(e.module);
    m.text = fmt::format("run the GEMMs of linear in {} in bf16, out of {} (the other Linears keep {}): its operands "
                         "are then not quantized",
                         e.module, format, fp8 ? "FP8" : "theirs");
    m.code = fmt::format("fp8_options.keep_bf16.push_back(\"{}\");  // Fp8Options (core/fp8_linear.h)", e.module);
    // Keeping it in f32 (an autocast override) also takes it out of FP8, at f32's cost: the bf16 remedy replaces it.
    std::erase_if(e.remedies, [](const Remedy& r) { return r.kind == "autocast_fp32" || r.kind == "cast_f32"; });
    e.remedies.insert(e.remedies.begin(), std::move(m));
  };
  for (PrecisionEntry& e : precision.by_jump) mark(e, true);
  for (PrecisionEntry& e : precision.by_trend) mark(e, false);
}
}  // namespace

void mark_fp8_linears(PrecisionSection& precision, const Fp8Section& fp8) {
  // module -> the formats of its forward operands (input, weight), from its /fp8 rows.
  std::map<std::string, std::set<std::string>> forward_formats;
  for (const Fp8OperandSummary& o : fp8.operands)
    if (o.operand == "input" || o.operand == "weight") forward_formats[o.module].insert(o.format);
  mark_quantized_linears(precision, forward_formats, true);
}

void mark_block_linears(PrecisionSection& precision, const BlockSection& blocks) {
  // module -> the block format of its trained forward copies (input, weight); --what-if copies measured a GEMM the
  // run did not run.
  std::map<std::string, std::set<std::string>> forward_formats;
  for (const BlockCopySummary& c : blocks.copies)
    if (!c.what_if && (c.operand == "input" || c.operand == "weight")) forward_formats[c.module].insert(c.format);
  mark_quantized_linears(precision, forward_formats, false);
}

double fp8_loss_tolerance(std::span<const double> bf16_losses) {
  const std::size_t n = std::min(bf16_losses.size(), kFp8LossNoiseSteps);
  if (n < 3) return std::numeric_limits<double>::quiet_NaN();
  const std::span<const double> w = bf16_losses.last(n);
  double sum = 0;
  for (std::size_t t = 2; t < n; ++t) {
    const double d2 = w[t] - 2.0 * w[t - 1] + w[t - 2];
    sum += d2 * d2;
  }
  const double sigma = std::sqrt(sum / static_cast<double>(n - 2) / 6.0);
  const double final_loss = std::fabs(w[n - 1]);
  if (!std::isfinite(sigma) || !(final_loss > 0) || !std::isfinite(final_loss))
    return std::numeric_limits<double>::quiet_NaN();
  return kFp8LossNoiseSigmas * sigma / final_loss;
}

Fp8RunSettings fp8_run_settings(const std::string& config_json) {
  Fp8RunSettings s;
  const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (!j.is_object()) return s;
  const auto text = [&](const char* key, std::string& out) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  const auto integer = [&](const char* key, std::int64_t& out) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return false;
    out = it->get<std::int64_t>();
    return true;
  };
  // All five, or the trace is not one this build recorded: known stays false and every remedy is offered.
  Fp8RunSettings r;
  if (!text("fp8_recipe", r.recipe) || !text("fp8_format", r.format) || !text("fp8_amax_algo", r.algo) ||
      !integer("fp8_amax_history", r.history) || !integer("fp8_margin", r.margin))
    return s;
  if (const auto it = j.find("fp8_keep_bf16"); it != j.end() && it->is_array())
    for (const auto& g : *it)
      if (g.is_string()) r.keep_bf16.push_back(g.get<std::string>());
  r.known = true;
  return r;
}

Fp8Section analyse_fp8(std::span<const trace::Fp8Row> rows, const Fp8RunSettings& run) {
  Fp8Section out;
  out.settings = run;
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
  std::vector<Fp8Finding> underflow_findings, stale_findings, saturation_findings;
  std::map<std::tuple<std::string, int>, std::vector<const trace::Fp8Row*>> steady;  // by_operand less start-up rows
  for (auto& [key, list] : by_operand) {
    std::stable_sort(list.begin(), list.end(), [](const trace::Fp8Row* a, const trace::Fp8Row* b) { return a->step < b->step; });
    // Start-up rows (analysis.h, Fp8StartUp) apart from the rest.
    std::vector<const trace::Fp8Row*>& rest = steady[key];
    std::vector<const trace::Fp8Row*> start;
    bool earlier_amax = false;
    for (const trace::Fp8Row* r : list) {
      (fp8_start_up_row(*r, earlier_amax) ? start : rest).push_back(r);
      if (r->amax != 0) earlier_amax = true;  // the history rolled: later scales are computed
    }
    if (auto u = start_up_summary(start)) out.start_up.push_back(std::move(*u));
    add_findings(list, rest, run, underflow_findings, stale_findings, saturation_findings);
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
  for (Fp8Finding& f : stale_findings) out.findings.push_back(std::move(f));
  for (Fp8Finding& f : saturation_findings) out.findings.push_back(std::move(f));
  std::erase_if(steady, [](const auto& kv) { return kv.second.empty(); });
  if (auto f = error_dominates(steady, run)) out.findings.push_back(std::move(*f));
  out.worst_underflow = worst(out.operands, [](const Fp8OperandSummary& s) { return s.underflow_fraction; });
  out.worst_saturation = worst(out.operands, [](const Fp8OperandSummary& s) { return s.saturated_fraction; });
  return out;
}

}  // namespace ampscope::analysis
