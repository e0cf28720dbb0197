// The report and the diff as text and JSON (probes/analysis/render.h). The text answers "what went wrong
// first, and where" in its first lines, then gives the details; the JSON mirrors the structs of
// probes/analysis/analysis.h and probes/analysis/diff.h field for field (docs/report-format.md).
#include "probes/analysis/render.h"
#include "probes/analysis/op_traits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace ampscope::analysis {
namespace {

using json = nlohmann::ordered_json;  // fields in the order docs/report-format.md lists them
using trace::Phase;

// One line per cause: what the cause name means, for a reader who has not read docs/report-format.md.
struct CauseText {
  std::string_view cause;
  std::string_view explanation;
};
constexpr CauseText kCauseTexts[] = {
    {"f16_overflow", "a finite value beyond f16's largest (65504) became inf, in an f16 result or in autocast's cast to f16"},
    {"exp_overflow", "exp of a large argument overflowed to inf (above about 11.1 in f16, 88.7 in f32)"},
    {"log_of_zero", "log of 0 gives -inf and log of a negative value gives NaN (often log(softmax(x)) after softmax underflowed to 0)"},
    {"division_by_zero", "a division by zero (or by a denominator that underflowed to 0) gave inf"},
    {"invalid_operation", "an operation without a defined result (inf - inf, 0 * inf, 0 / 0) gave NaN"},
    {"nonfinite_input", "the data already held NaN or inf before the first op: no op created them"},
    {"nonfinite_weights", "the weights (parameters) already held NaN or inf before the first op: no op created them, and the data did not bring them"},
    {"gradient_overflow", "a gradient became inf or NaN in the backward pass (scaled gradients beyond the dtype's range)"},
    {"gradient_underflow", "gradients flushed to zero: too small for f16 (below 2^-24) without enough loss scaling"},
    {"accumulating_gradients", "gradients are never cleared, so they grow step after step and an inf in .grad stays there"},
    {"scale_collapse", "the GradScaler kept meeting inf/NaN and halved the scale below 1: an overflow that backing off cannot cure"},
    {"optimizer_eps_underflow", "Adam's eps rounds to 0 in the f16 state, so where the second moment v is 0 the update m / (sqrt(v) + eps) divides by 0 and writes NaN/inf into the weights"},
    {"unknown", "inf appeared where no rule applies (an f32 or bf16 result): compare with an fp32 run of the same seed"},
};

std::string_view explanation(std::string_view cause) {
  for (const CauseText& c : kCauseTexts)
    if (c.cause == cause) return c.explanation;
  return "not one of the documented causes";
}

// ---- text helpers ----

// ANSI SGR codes, written only when the style asks for colour.
constexpr std::string_view kBold = "1", kRed = "1;31", kYellow = "33", kGreen = "1;32", kCyan = "36", kDim = "2";

class Text {
 public:
  explicit Text(const TextStyle& style) : style_(style) {}
  std::string paint(std::string_view code, std::string_view text) const {
    if (!style_.colour || text.empty()) return std::string(text);
    return fmt::format("\x1b[{}m{}\x1b[0m", code, text);
  }
  template <typename... Args>
  void line(fmt::format_string<Args...> f, Args&&... args) {
    out_ += fmt::format(f, std::forward<Args>(args)...);
    out_ += '\n';
  }
  void blank() {
    if (!out_.empty() && out_.back() == '\n' && (out_.size() < 2 || out_[out_.size() - 2] != '\n')) out_ += '\n';
  }
  const TextStyle& style() const { return style_; }
  std::string take() { return std::move(out_); }

 private:
  const TextStyle& style_;
  std::string out_;
};

std::string plural(std::int64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

std::string plural(std::int64_t n, std::string_view word) { return plural(n, word, std::string(word) + "s"); }

// A statistic for a person: 4 significant digits; NaN (no finite values) as "nan".
std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return fmt::format("{:.4g}", x);
}

// A loss scale: shortest exact form (65536, 0.5), since scales are powers of two.
std::string scale(double x) {
  if (!std::isfinite(x)) return num(x);
  return fmt::format("{}", x);
}

std::string percent(double fraction) {
  if (!std::isfinite(fraction)) return num(fraction);
  return fmt::format("{:.1f}%", 100.0 * fraction);
}

bool has_seq(std::int64_t seq) { return seq >= 0 && seq != std::numeric_limits<std::int64_t>::max(); }

// "bmm in blocks.0.attn", "log (outside any module)", "the backward of linear in fc1".
std::string place(Phase phase, const std::string& op, const std::string& module) {
  if (op.empty()) return module.empty() ? std::string() : module;
  std::string s = phase == Phase::backward ? "the backward of " + op : op;
  return module.empty() ? s + " (outside any module)" : fmt::format("{} in {}", s, module);
}

// place() for lists that give no phase column: the optimizer's and scaler's ops say their phase.
std::string phase_place(Phase phase, const std::string& op, const std::string& module) {
  std::string s = place(phase, op, module);
  if (phase == Phase::optimizer || phase == Phase::scaler) s += fmt::format(" [{}]", trace::phase_name(phase));
  return s;
}

// Where a diagnosis sits: an op, or the whole run for the step-level causes.
std::string where(const Diagnosis& d) {
  if (!d.op.empty()) return place(d.phase, d.op, d.module);
  if (d.cause == "gradient_underflow") return "every gradient (no single op)";
  if (d.cause == "scale_collapse") return "the GradScaler (no single op)";
  return "the whole step (no single op)";
}

// "f16,f16 -> f16; autocast: lower_precision_fp"
std::string dtypes(const std::string& in, const std::string& out, const std::string& autocast) {
  std::string s;
  if (!in.empty() || !out.empty()) s = fmt::format("{} -> {}", in.empty() ? "?" : in, out.empty() ? "?" : out);
  if (!autocast.empty()) s += (s.empty() ? "" : "; ") + fmt::format("autocast: {}", autocast);
  return s;
}

std::string run_text(const trace::RunInfo& run) {
  std::vector<std::string> parts;
  if (!run.model.empty()) parts.push_back(run.model);
  if (!run.precision.empty()) parts.push_back(run.precision);
  if (!run.device.empty()) parts.push_back(run.device);
  parts.push_back(fmt::format("seed {}", run.seed));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string propagation(const Diagnosis& d, std::size_t max_names) {
  std::vector<std::string> parts;
  if (has_seq(d.seq) || d.downstream_nonfinite > 0)
    parts.push_back(fmt::format("{} of step {} turned non-finite", plural(d.downstream_nonfinite, "later op"), d.step));
  if (!d.absorbed_by.empty())
    parts.push_back(fmt::format("SILENT DAMAGE: {} took the NaN/inf in and returned finite values, so {} {} wrong "
                                "but finite",
                                d.absorbed_by.front(), plural(d.silently_wrong + static_cast<std::int64_t>(d.absorbed_by.size()), "op output", "op outputs"),
                                d.silently_wrong + static_cast<std::int64_t>(d.absorbed_by.size()) == 1 ? "is" : "are"));
  parts.push_back(d.loss_nonfinite ? "the loss was non-finite" : "the loss stayed finite");
  if (!d.gradients.empty()) {
    std::string names;
    for (std::size_t i = 0; i < d.gradients.size() && i < max_names; ++i) names += (i ? ", " : "") + d.gradients[i];
    if (d.gradients.size() > max_names) names += fmt::format(" and {} more", d.gradients.size() - max_names);
    // gradient_underflow lists the parameters whose gradients were all zero, not non-finite ones.
    parts.push_back(fmt::format("{} gradients of {} ({})", d.cause == "gradient_underflow" ? "all-zero" : "non-finite",
                                plural(static_cast<std::int64_t>(d.gradients.size()), "parameter"), names));
  }
  parts.push_back(fmt::format("{} skipped from step {} on", plural(d.skipped_steps, "step"), d.step));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// "sigmoid (seq 41, saturation) -> neg -> add (cancellation) -> log (the origin)"
std::string chain_text(const Diagnosis& d) {
  std::vector<std::string> parts;
  for (const ChainLink& l : d.chain) {
    std::string p = l.module.empty() ? l.op : fmt::format("{} in {}", l.op, l.module);
    p += fmt::format(" (seq {}", l.seq);
    if (l.role != "passes on") p += ", " + l.role;
    p += ")";
    parts.push_back(std::move(p));
  }
  return fmt::format("{}", fmt::join(parts, " -> "));
}

std::string_view root_explanation(std::string_view root) {
  if (root == "saturation") return "an op returned a value its math never reaches (sigmoid or tanh at exactly 1, softmax at 0 or 1, exp at 0): the dtype rounded it there";
  if (root == "cancellation") return "an addition or subtraction of nearly equal values cancelled to exact zeros";
  if (root == "underflow") return "results below the dtype's smallest subnormal became exact zeros";
  if (root == "amplification")
    return "an op made the values far larger than its input (a small divisor, a large factor or weight, a dot "
           "product not scaled by 1/sqrt(d)): the overflow is there or downstream of it";
  return "";
}

std::string occurrences(std::int64_t n, std::int64_t first, std::int64_t last) {
  if (n <= 1 && last <= first) return fmt::format("once (step {})", first);
  return fmt::format("{} (steps {} to {})", plural(n, "time"), first, last);
}

std::string headroom_message(const HeadroomWarning& w) {
  if (!w.message.empty()) return w.message;
  // The analysis writes the sentence; this is only the fallback for a warning built without one.
  if (w.kind == "near_f16_max") return fmt::format("absmax {} is within a factor {} of f16's largest value 65504", num(w.absmax),
                                                   num(w.absmax > 0 ? kF16Max / w.absmax : 0));
  if (w.kind == "subnormal") return fmt::format("{} of the values are subnormal", percent(w.fraction));
  if (w.kind == "flush_to_zero") return fmt::format("{} of the non-zero values became zero in the cast", percent(w.fraction));
  if (w.kind == "below_f16") return fmt::format("{} of the non-zero values are below f16's smallest subnormal (2^-24)",
                                                percent(w.fraction));
  return w.kind;
}

std::string scaler_numbers(const ScalerHealth& s) {
  std::string skips = fmt::format("{} of {} skipped ({})", s.skipped, plural(s.steps, "step"), percent(s.skip_rate));
  if (s.skipped > 0)
    skips += fmt::format(", longest run {}, first at step {}, last at step {}", s.longest_skip_run, s.first_skip, s.last_skip);
  return fmt::format("{}; scale {} -> {} (min {}, max {}); {} growths, {} backoffs", skips, scale(s.scale_start),
                     scale(s.scale_end), scale(s.scale_min), scale(s.scale_max), s.growths, s.backoffs);
}

std::string scaler_message(const ScalerHealth& s) {
  if (!s.message.empty()) return s.message;
  if (!s.used) return "no loss scaling (the scale is 1 at every step)";
  return s.skipped == 0 ? "no step was skipped" : fmt::format("{} skipped", plural(s.skipped, "step"));
}

std::string_view verdict_colour(const std::string& verdict) {
  if (verdict == "healthy" || verdict == "settled" || verdict == "no_scaler") return kGreen;
  if (verdict == "never_grows") return kYellow;
  return kRed;
}

// ---- JSON helpers ----

// JSON has no NaN or infinity: NaN is written null, the infinities as the strings "inf" and "-inf".
json number(double x) {
  if (std::isnan(x)) return nullptr;
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

json seq_json(std::int64_t seq) { return has_seq(seq) ? json(seq) : json(nullptr); }

json run_json(const trace::RunInfo& r) {
  return {{"precision", r.precision}, {"device", r.device}, {"model", r.model},
          {"seed", r.seed},           {"config", r.config}, {"probe", r.probe}};
}

json health_json(const trace::TensorHealth& h) {
  return {{"numel", h.numel}, {"nan", h.nan},           {"pos_inf", h.pos_inf},   {"neg_inf", h.neg_inf},
          {"zero", h.zero},   {"subnormal", h.subnormal}, {"min", number(h.min)}, {"max", number(h.max)},
          {"absmax", number(h.absmax)}, {"mean", number(h.mean)}, {"rms", number(h.rms)}};
}

json chain_json(const std::vector<ChainLink>& chain) {
  json out = json::array();
  for (const ChainLink& l : chain) {
    json j = {{"seq", l.seq},
              {"phase", std::string(trace::phase_name(l.phase))},
              {"op", l.op},
              {"module", l.module},
              {"out_dtype", l.out_dtype},
              {"role", l.role},
              {"evidence", l.evidence}};
    if (l.role == "amplification") j["factor"] = number(l.factor);
    out.push_back(std::move(j));
  }
  return out;
}

json remedies_json(const std::vector<Remedy>& remedies) {
  json out = json::array();
  for (const Remedy& m : remedies)
    out.push_back({{"kind", m.kind},
                   {"text", m.text},
                   {"flag", m.flag},
                   {"code", m.code},
                   {"pattern", m.pattern},
                   {"pattern_is_op", m.pattern_is_op},
                   {"value", number(m.value)},
                   {"verified", m.verified}});
  return out;
}

json diagnosis_json(const Diagnosis& d) {
  return {{"step", d.step},
          {"seq", seq_json(d.seq)},
          {"phase", std::string(trace::phase_name(d.phase))},
          {"module", d.module},
          {"op", d.op},
          {"in_dtypes", d.in_dtypes},
          {"out_dtype", d.out_dtype},
          {"autocast", d.autocast},
          {"cause", d.cause},
          {"explanation", std::string(explanation(d.cause))},
          {"evidence", d.evidence},
          {"downstream_nonfinite", d.downstream_nonfinite},
          {"loss_nonfinite", d.loss_nonfinite},
          {"gradients", d.gradients},
          {"skipped_steps", d.skipped_steps},
          {"root_cause", d.root_cause},
          {"chain", chain_json(d.chain)},
          {"absorbed_by", d.absorbed_by},
          {"silently_wrong", d.silently_wrong},
          {"remedies", remedies_json(d.remedies)},
          {"remedy", d.remedy},
          {"occurrences", d.occurrences},
          {"last_step", d.last_step}};
}

json warning_json(const HeadroomWarning& w) {
  return {{"kind", w.kind},
          {"step", w.step},
          {"seq", seq_json(w.seq)},
          {"phase", std::string(trace::phase_name(w.phase))},
          {"module", w.module},
          {"op", w.op},
          {"tensor", w.tensor},
          {"dtype", w.dtype},
          {"absmax", number(w.absmax)},
          {"fraction", number(w.fraction)},
          {"message", headroom_message(w)},
          {"occurrences", w.occurrences},
          {"last_step", w.last_step}};
}

json scaler_json(const ScalerHealth& s) {
  return {{"used", s.used},
          {"steps", s.steps},
          {"skipped", s.skipped},
          {"skip_rate", number(s.skip_rate)},
          {"longest_skip_run", s.longest_skip_run},
          {"first_skip", s.first_skip},
          {"last_skip", s.last_skip},
          {"growths", s.growths},
          {"backoffs", s.backoffs},
          {"scale_start", number(s.scale_start)},
          {"scale_min", number(s.scale_min)},
          {"scale_max", number(s.scale_max)},
          {"scale_end", number(s.scale_end)},
          {"verdict", s.verdict},
          {"message", s.message},
          {"calibration_skips", s.calibration_skips},
          {"last_calibration_step", s.last_calibration_step}};
}

json coverage_json(const Coverage& c) {
  return {{"known", c.known},
          {"level", c.level},
          {"ops", c.ops},
          {"modules", c.modules},
          {"every", c.every},
          {"flight_recorder", c.flight_recorder},
          {"autocast_overrides", c.autocast_overrides},
          {"notes", c.notes}};
}

json key_json(const OpKey& k) {
  return {{"step", k.step}, {"phase", std::string(trace::phase_name(k.phase))}, {"module", k.module}, {"op", k.op},
          {"occurrence", k.occurrence}};
}

json pins_json(unsigned pins) {
  json out = json::array();
  if (pins & kPinLower) out.push_back("lower");
  if (pins & kPinUpper) out.push_back("upper");
  if (pins & kPinDtypeMax) out.push_back("dtype_max");
  return out;
}

json op_diff_json(const OpDiff& d) {
  return {{"key", key_json(d.key)},
          {"step_b", d.step_b},
          {"seq_a", d.seq_a},
          {"seq_b", d.seq_b},
          {"dtypes_a", d.dtypes_a},
          {"dtypes_b", d.dtypes_b},
          {"scale_a", number(d.scale_a)},
          {"scale_b", number(d.scale_b)},
          {"a", health_json(d.a)},
          {"b", health_json(d.b)},
          {"rel_absmax", number(d.rel_absmax)},
          {"rel_mean", number(d.rel_mean)},
          {"rel_rms", number(d.rel_rms)},
          {"rel_zeros", number(d.rel_zeros)},
          {"max_rel", number(d.max_rel)},
          {"stat", d.stat},
          {"pinned_a", pins_json(d.pins_a)},
          {"pinned_b", pins_json(d.pins_b)},
          {"nonfinite_differs", d.nonfinite_differs},
          {"dtype_differs", d.dtype_differs},
          {"magnitudes_compared", d.magnitudes_compared}};
}

json grad_json(const trace::GradRow& g) {
  return {{"dtype", g.dtype}, {"nan", g.nan},   {"pos_inf", g.pos_inf},        {"neg_inf", g.neg_inf},
          {"zero", g.zero},   {"absmax", number(g.absmax)}, {"norm", number(g.norm)}, {"unscaled", g.unscaled}};
}

json grad_diff_json(const GradDiff& d) {
  return {{"step", d.step},
          {"step_b", d.step_b},
          {"param", d.param},
          {"scale_a", number(d.scale_a)},
          {"scale_b", number(d.scale_b)},
          {"a", grad_json(d.a)},
          {"b", grad_json(d.b)},
          {"rel_norm", number(d.rel_norm)},
          {"rel_absmax", number(d.rel_absmax)},
          {"max_rel", number(d.max_rel)},
          {"stat", d.stat},
          {"nonfinite_differs", d.nonfinite_differs}};
}

json unmatched_json(const std::vector<Unmatched>& list) {
  json out = json::array();
  for (const Unmatched& u : list)
    out.push_back({{"phase", std::string(trace::phase_name(u.phase))}, {"module", u.module}, {"op", u.op},
                   {"count", u.count}, {"first_step", u.first_step}});
  return out;
}

// ---- diff text helpers ----

bool diverged(const DiffReport& d) { return d.diverged(); }

// "step 5", or "step 5 (b's step 4)" when the runs' steps are paired by optimizer update.
std::string steps_text(const DiffReport& d, std::int64_t a, std::int64_t b) {
  return !d.aligned_by_update || a == b ? fmt::format("step {}", a) : fmt::format("step {} (b's step {})", a, b);
}

std::string op_diff_place(const OpDiff& d) {
  std::string s = phase_place(d.key.phase, d.key.op, d.key.module);
  if (d.key.occurrence > 0) s += fmt::format(" (occurrence {})", d.key.occurrence);
  return s;
}

// "nonfinite: a 12 +inf, b none" / "absmax: a 6.55e+04, b 1.45e+05 (rel 0.55)"
std::string op_diff_detail(const OpDiff& d) {
  auto counts = [](const trace::TensorHealth& h) {
    std::vector<std::string> parts;
    if (h.nan > 0) parts.push_back(fmt::format("{} NaN", h.nan));
    if (h.pos_inf > 0) parts.push_back(fmt::format("{} +inf", h.pos_inf));
    if (h.neg_inf > 0) parts.push_back(fmt::format("{} -inf", h.neg_inf));
    return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
  };
  // Backward rows are compared divided by the loss scale; say so where a scale is not 1.
  const bool scaled = d.key.phase == Phase::backward && (d.scale_a != 1 || d.scale_b != 1);
  const std::string divided = scaled ? fmt::format("; divided by the loss scale, a {}, b {}", scale(d.scale_a), scale(d.scale_b)) : "";
  if (d.stat == "nonfinite" || d.nonfinite_differs)
    return fmt::format("NaN/inf counts differ: a {}, b {} (absmax a {}, b {}{})", counts(d.a), counts(d.b), num(d.a.absmax),
                       num(d.b.absmax), divided);
  if (d.stat == "saturation") {
    // Which boundary, in which run: the first bit one run has and the other not.
    const unsigned only = d.pins_a ^ d.pins_b;
    const bool in_a = (d.pins_a & only) != 0;
    const char* run = in_a ? "a" : "b";
    const trace::TensorHealth& pinned = in_a ? d.a : d.b;
    const trace::TensorHealth& other = in_a ? d.b : d.a;
    const double s_pinned = in_a ? d.scale_a : d.scale_b, s_other = in_a ? d.scale_b : d.scale_a;
    if (only & kPinLower) {
      if (op_range(d.key.op) == OpRange::signed_unit)  // tanh: its lower end is -1, not 0
        return fmt::format("saturation: {} reaches -1 in {} only (min {} against {})", d.key.op, run, num(pinned.min), num(other.min));
      return fmt::format("saturation: {} reaches exactly 0 in {} only ({} exact zeros of {}; the other run: {} zeros, min {})",
                         d.key.op, run, pinned.zero, pinned.numel, other.zero, num(other.min));
    }
    if (only & kPinUpper)
      return fmt::format("saturation: {} reaches exactly 1 in {} only (max {} against {})", d.key.op, run, num(pinned.max),
                         num(other.max));
    return fmt::format("saturation: the output sits at its dtype's largest finite value in {} only (absmax {} against {})", run,
                       num(pinned.absmax * s_pinned), num(other.absmax * s_other));
  }
  if (d.stat == "zeros") {
    const double za = d.a.numel > 0 ? static_cast<double>(d.a.zero) / static_cast<double>(d.a.numel) : 0.0;
    const double zb = d.b.numel > 0 ? static_cast<double>(d.b.zero) / static_cast<double>(d.b.numel) : 0.0;
    return fmt::format("exact zeros: a {} ({}), b {} ({}) of {}; rms a {}, b {} (difference {} of the op's largest rms{})", d.a.zero,
                       percent(za), d.b.zero, percent(zb), d.a.numel, num(d.a.rms), num(d.b.rms), num(d.rel_rms), divided);
  }
  const bool mean = d.stat == "mean";
  return fmt::format("{}: a {}, b {} (difference {} of the op's largest rms{})", mean ? "mean" : "rms",
                     num(mean ? d.a.mean : d.a.rms), num(mean ? d.b.mean : d.b.rms), num(d.max_rel), divided);
}

std::string grad_diff_detail(const GradDiff& d) {
  auto counts = [](const trace::GradRow& g) {
    std::vector<std::string> parts;
    if (g.nan > 0) parts.push_back(fmt::format("{} NaN", g.nan));
    if (g.pos_inf > 0) parts.push_back(fmt::format("{} +inf", g.pos_inf));
    if (g.neg_inf > 0) parts.push_back(fmt::format("{} -inf", g.neg_inf));
    return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
  };
  if (d.nonfinite_differs) return fmt::format("NaN/inf counts differ: a {}, b {}", counts(d.a), counts(d.b));
  return fmt::format("norm: a {}, b {} (difference {} of the parameter's largest norm)", num(d.a.norm), num(d.b.norm), num(d.max_rel));
}

// "1 (no scaler)", "65536", "65536 to 1024": the loss scales a run's steps used.
std::string scales_text(const std::vector<LossPoint>& losses, bool run_a) {
  double lo = 0, hi = 0, first = 0, last = 0;
  bool any = false;
  for (const LossPoint& p : losses) {
    if (!(run_a ? p.in_a : p.in_b)) continue;
    const double x = run_a ? p.scale_a : p.scale_b;
    if (!any) lo = hi = first = x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    last = x;
    any = true;
  }
  if (!any) return "no steps";
  if (lo == 1 && hi == 1) return "1 (no scaler)";
  if (lo == hi) return scale(lo);
  return fmt::format("{} to {} (min {}, max {})", scale(first), scale(last), scale(lo), scale(hi));
}

// The PRECISION section's lists.
std::string precision_place(const PrecisionEntry& e) {
  const std::string place = e.module.empty() ? e.op : fmt::format("{} in {}", e.op, e.module);
  return e.phase == "backward" ? "backward of " + place : place;
}

// The dtype an entry's label shows: its output's, and for an FP8 Linear's accumulated error the FP8 format its
// operands were quantized to first ("fp8 e4m3 -> bf16"); for a block-scaled Linear's, the block format ("nvfp4 ->
// bf16").
std::string precision_dtype(const PrecisionEntry& e) {
  if (e.fp8.empty()) return e.out_dtype;
  if (e.fp8.starts_with("mxfp8") || e.fp8.starts_with("nvfp4")) return fmt::format("{} -> {}", e.fp8, e.out_dtype);
  return fmt::format("fp8 {} -> {}", e.fp8, e.out_dtype);
}

json precision_entry_json(const PrecisionEntry& e) {
  const auto finite_or_null = [](double v) { return number(v); };  // NaN null, infinities "inf" / "-inf"
  return json{{"op", e.op},
              {"module", e.module},
              {"phase", e.phase},
              {"out_dtype", e.out_dtype},
              {"fp8", e.fp8},
              {"reference", e.reference},
              {"step", e.step},
              {"seq", e.seq},
              {"kind", e.kind},
              {"score", finite_or_null(e.score)},
              {"calls", e.calls},
              {"in_error", finite_or_null(e.in_error)},
              {"in_max_error", finite_or_null(e.in_max_error)},
              {"error", finite_or_null(e.error)},
              {"max_error", finite_or_null(e.max_error)},
              {"local_error", finite_or_null(e.local_error)},
              {"local_max_error", finite_or_null(e.local_max_error)},
              {"bits", finite_or_null(e.bits)},
              {"cond", finite_or_null(e.cond)},
              {"flips", e.flips},
              {"numel", e.numel},
              {"bits_per_step", finite_or_null(e.bits_per_step)},
              {"steps", e.steps},
              {"first", finite_or_null(e.first)},
              {"last", finite_or_null(e.last)},
              {"producers", e.producers},
              {"evidence", e.evidence},
              {"remedies", remedies_json(e.remedies)}};
}

json precision_json(const PrecisionSection& p) {
  json out{{"recorded", p.recorded()}, {"rows", p.rows},
           {"steps", p.steps},       {"ops", p.ops},
           {"backward_rows", p.backward_rows}, {"backward_nodes", p.backward_nodes}};
  for (const auto& [name, list] : {std::pair<const char*, const std::vector<PrecisionEntry>*>{"by_jump", &p.by_jump},
                                   {"by_local", &p.by_local},
                                   {"by_trend", &p.by_trend},
                                   {"conditioning", &p.conditioning},
                                   {"backward", &p.backward}}) {
    out[name] = json::array();
    for (const PrecisionEntry& e : *list) out[name].push_back(precision_entry_json(e));
  }
  return out;
}

json swamped_param_json(const SwampedParam& p) {
  return json{{"param", p.param},
              {"dtype", p.dtype},
              {"numel", p.numel},
              {"steps", p.steps},
              {"nonzero", p.nonzero},
              {"swamped", p.swamped},
              {"fraction", number(p.fraction)},
              {"param_abs_mean", number(p.param_abs_mean)},
              {"update_abs_mean", number(p.update_abs_mean)},
              {"half_ulp", number(p.half_ulp)},
              {"evidence", p.evidence},
              {"remedies", remedies_json(p.remedies)}};
}

json swamped_json(const SwampedSection& s) {
  json out{{"recorded", s.recorded()}, {"rows", s.rows},       {"steps", s.steps},
           {"params", s.params},       {"window", s.window},   {"first_step", s.first_step},
           {"last_step", s.last_step}, {"stalled", json::array()}, {"all", json::array()}};
  for (const SwampedParam& p : s.stalled) out["stalled"].push_back(swamped_param_json(p));
  for (const SwampedParam& p : s.all) out["all"].push_back(swamped_param_json(p));
  return out;
}

json fp8_operand_json(const Fp8OperandSummary& o) {
  return json{{"module", o.module},
              {"operand", o.operand},
              {"format", o.format},
              {"steps", o.steps},
              {"nonzero", o.nonzero},
              {"underflow", o.underflow},
              {"subnormal", o.subnormal},
              {"saturated", o.saturated},
              {"underflow_fraction", number(o.underflow_fraction)},
              {"subnormal_fraction", number(o.subnormal_fraction)},
              {"saturated_fraction", number(o.saturated_fraction)},
              {"worst_underflow_step", o.worst_underflow_step},
              {"worst_underflow_fraction", number(o.worst_underflow_fraction)},
              {"worst_saturated_step", o.worst_saturated_step},
              {"worst_saturated_fraction", number(o.worst_saturated_fraction)},
              {"max_rel_rms_error", number(o.max_rel_rms_error)},
              {"last_amax", number(o.last_amax)},
              {"last_scale", number(o.last_scale)},
              {"max_dynamic_range", number(o.max_dynamic_range)},
              {"last_dynamic_range", number(o.last_dynamic_range)},
              {"last_quantized_dynamic_range", number(o.last_quantized_dynamic_range)},
              {"last_history_len", o.last_history_len},
              {"last_history_amax", number(o.last_history_amax)},
              {"last_history_amax_step", o.last_history_amax_step}};
}

// An "error dominates" finding's fields (FP8's and the block-scaled one): judged from each step's RMS error, not
// from counted values, so no count to report (docs/report-format.md).
void error_dominates_json(json& out, const Fp8Finding& f) {
  out.erase("nonzero");
  out.erase("count");
  out["error"] = number(f.error);
  out["error_bound"] = number(f.error_bound);
  out["next_module"] = f.next_module;
  out["next_error"] = number(f.next_error);
  if (f.kind == "block_error_dominates") {
    out["twin"] = f.twin;
    if (f.twin) {
      out["jump"] = number(f.jump);
      out["in_error"] = number(f.in_error);
      out["worst_jump"] = number(f.worst_jump);
      out["next_jump"] = number(f.next_jump);
    }
  }
}

json fp8_finding_json(const Fp8Finding& f) {
  json out{{"kind", f.kind},
           {"module", f.module},
           {"operand", f.operand},
           {"format", f.format},
           {"first_step", f.first_step},
           {"last_step", f.last_step},
           {"steps", f.steps},
           {"nonzero", f.nonzero},
           {"count", f.count},
           {"fraction", number(f.fraction)},
           {"threshold", number(f.threshold)},
           {"worst_step", f.worst_step},
           {"worst_fraction", number(f.worst_fraction)},
           {"remedies", json::array()}};
  if (f.kind == "saturation") {
    out["max_scaled_amax"] = number(f.max_scaled_amax);
    out["margin"] = f.margin;
    out["error"] = number(f.error);
    out["error_bound"] = number(f.error_bound);
  }
  if (f.kind == "stale_scale") {
    out["spike_step"] = f.spike_step;
    out["amax_before"] = number(f.amax_before);
    out["amax_spike"] = number(f.amax_spike);
    out["scale_before"] = number(f.scale_before);
    out["scale_held"] = number(f.scale_held);
    out["underflow_before"] = number(f.underflow_before);
    out["underflow_after"] = number(f.underflow_after);
    out["window"] = f.window;
  }
  if (block_finding_kind(f.kind)) {
    out["copy"] = f.copy;
    if (f.kind == "mx_floor_clipping") {
      out["blocks_clipped"] = f.blocks_clipped;
      out["error"] = number(f.error);
      out["error_bound"] = number(f.error_bound);
    } else if (f.kind == "block_outlier") {
      out["block_step"] = f.block_step;
      out["block_row"] = f.block_row;
      out["block_col"] = f.block_col;
      out["block_zeroed"] = f.block_zeroed;
      out["block_values"] = f.block_values;
      out["block_bar"] = f.block_bar;
      out["block_range"] = number(f.block_range);
      out["range_bound"] = number(f.range_bound);
    } else if (f.kind == "block_copy_mismatch") {
      out.erase("nonzero");
      out.erase("count");
      out.erase("fraction");
      out["error"] = number(f.error);
      out["other_error"] = number(f.other_error);
      out["other_fraction"] = number(f.other_fraction);
      out["error_bound"] = number(f.error_bound);
    } else {
      error_dominates_json(out, f);
    }
  }
  if (f.kind == "fp8_error_dominates") error_dominates_json(out, f);
  for (const Fp8Remedy& r : f.remedies)
    out["remedies"].push_back(
        json{{"option", r.option}, {"value", r.value}, {"command_line", r.command_line}, {"why", r.why},
             {"verified", r.verified}});
  return out;
}

// The FP8 and block-scaled sections' worst lists: indices into their operands or copies.
void worst_lists_json(json& out, const std::vector<std::size_t>& underflow, const std::vector<std::size_t>& saturation) {
  for (std::size_t i : underflow) out["worst_underflow"].push_back(i);
  for (std::size_t i : saturation) out["worst_saturation"].push_back(i);
}

json fp8_json(const Fp8Section& s) {
  json out{{"recorded", s.recorded()}, {"rows", s.rows},           {"steps", s.steps},
           {"modules", s.modules},     {"first_step", s.first_step}, {"last_step", s.last_step},
           {"operands", json::array()}, {"worst_underflow", json::array()}, {"worst_saturation", json::array()}};
  for (const Fp8OperandSummary& o : s.operands) out["operands"].push_back(fp8_operand_json(o));
  worst_lists_json(out, s.worst_underflow, s.worst_saturation);
  out["start_up"] = json::array();
  for (const Fp8StartUp& u : s.start_up)
    out["start_up"].push_back(json{{"module", u.module},
                                   {"operand", u.operand},
                                   {"format", u.format},
                                   {"first_step", u.first_step},
                                   {"last_step", u.last_step},
                                   {"steps", u.steps},
                                   {"nonzero", u.nonzero},
                                   {"underflow", u.underflow},
                                   {"saturated", u.saturated},
                                   {"worst_underflow_fraction", number(u.worst_underflow_fraction)},
                                   {"worst_saturated_fraction", number(u.worst_saturated_fraction)},
                                   {"max_error", number(u.max_error)},
                                   {"underflow_over", u.underflow_over},
                                   {"saturation_over", u.saturation_over},
                                   {"error_over", u.error_over}});
  return out;
}

json block_copy_json(const BlockCopySummary& c) {
  return json{{"module", c.module},
              {"operand", c.operand},
              {"copy", c.copy},
              {"format", c.format},
              {"what_if", c.what_if},
              {"steps", c.steps},
              {"rows", c.rows},
              {"cols", c.cols},
              {"nonzero", c.nonzero},
              {"nonfinite", c.nonfinite},
              {"underflow", c.underflow},
              {"saturated", c.saturated},
              {"blocks", c.blocks},
              {"blocks_clipped", c.blocks_clipped},
              {"blocks_nan", c.blocks_nan},
              {"underflow_fraction", number(c.underflow_fraction)},
              {"saturated_fraction", number(c.saturated_fraction)},
              {"worst_underflow_step", c.worst_underflow_step},
              {"worst_underflow_fraction", number(c.worst_underflow_fraction)},
              {"worst_saturated_step", c.worst_saturated_step},
              {"worst_saturated_fraction", number(c.worst_saturated_fraction)},
              {"max_block_range", number(c.max_block_range)},
              {"max_range_step", c.max_range_step},
              {"max_range_block", c.max_range_block},
              {"max_range_row", c.max_range_row},
              {"max_range_col", c.max_range_col},
              {"worst_block_underflow", c.worst_block_underflow},
              {"worst_block_step", c.worst_block_step},
              {"worst_block", c.worst_block},
              {"worst_block_row", c.worst_block_row},
              {"worst_block_col", c.worst_block_col},
              {"scale_log2_min", number(c.scale_log2_min)},
              {"scale_log2_median", number(c.scale_log2_median)},
              {"scale_log2_max", number(c.scale_log2_max)},
              {"max_rel_rms_error", number(c.max_rel_rms_error)},
              {"mean_rel_rms_error", number(c.mean_rel_rms_error)}};
}

json blocks_json(const BlockSection& s) {
  json out{{"recorded", s.recorded()}, {"rows", s.rows},       {"what_if_rows", s.what_if_rows},
           {"steps", s.steps},         {"modules", s.modules}, {"first_step", s.first_step},
           {"last_step", s.last_step}, {"copies", json::array()}, {"worst_underflow", json::array()},
           {"worst_saturation", json::array()}};
  for (const BlockCopySummary& c : s.copies) out["copies"].push_back(block_copy_json(c));
  worst_lists_json(out, s.worst_underflow, s.worst_saturation);
  return out;
}

std::string loss_cell(bool in, double loss, bool skipped) {
  if (!in) return "-";
  return num(loss) + (skipped ? " S" : "");
}

}  // namespace

// ===================================================================================================
// Report

namespace {

// The answer first: the first anomaly with its cause, root cause, evidence and fix, or OK; damage
// before it (the answer covers only what is intact), then the notes a brief report keeps.
void text_answer(Text& t, const Report& rep, const TextStyle& style) {
  for (const std::string& note : rep.damage)
    t.line("{} {}; analysed what is intact", t.paint(kRed, "DAMAGED:"), note);
  if (rep.anomalies.empty()) {
    t.line("{}", t.paint(kGreen, fmt::format("OK: no NaN/Inf found in {} ({} op rows, {} gradient rows)",
                                             plural(rep.steps, "step"), rep.op_rows, rep.grad_rows)));
  } else {
    const Diagnosis& d = rep.anomalies.front();
    const std::string types = dtypes(d.in_dtypes, d.out_dtype, d.autocast);
    t.line("{} step {}, {}, {}{}", t.paint(kRed, "FIRST ANOMALY:"), d.step, trace::phase_name(d.phase),
           t.paint(kBold, where(d)), types.empty() ? "" : " (" + types + ")");
    t.line("  cause: {}: {}", t.paint(kRed, d.cause), explanation(d.cause));
    if (!d.root_cause.empty())
      t.line("  root cause: {} at {}: {}", t.paint(kRed, d.root_cause), chain_text(d), root_explanation(d.root_cause));
    if (!d.evidence.empty()) t.line("  evidence: {}", d.evidence.front());
    if (!d.remedies.empty()) {
      const Remedy& m = d.remedies.front();
      t.line("  fix: {}{}", t.paint(kGreen, m.text), m.verified ? " (verified by `ampscope fix`)" : "");
      if (!m.flag.empty()) t.line("       ampscope train: {}", m.flag);
      if (!m.code.empty()) t.line("       your own loop:  {}", m.code);
    } else if (!d.remedy.empty()) {
      t.line("  fix: {}", t.paint(kGreen, d.remedy));
    }
    if (rep.anomalies.size() > 1)
      t.line("  {} more anomal{} {}", rep.anomalies.size() - 1, rep.anomalies.size() == 2 ? "y" : "ies",
             style.brief ? "(ampscope report lists them)" : "below (they come later, often because of this one)");
  }
  if (!rep.complete)
    t.line("{} the trace is incomplete: its writer did not close it (killed, failed or still running); "
           "analysed the {} it holds",
           t.paint(kYellow, "NOTE:"), plural(rep.steps, "step"));
  for (const std::string& note : rep.coverage.notes) t.line("{} {}", t.paint(kYellow, "NOTE:"), note);
  if (rep.scaler.calibration_skips > 0)
    t.line("{} {} while the GradScaler calibrated its scale (forward and loss finite; a smaller scale cured "
           "them): expected, not anomalies",
           t.paint(kCyan, "CALIBRATION:"), plural(rep.scaler.calibration_skips, "skipped step"));
}

// The trace and the run it recorded.
void text_run(Text& t, const Report& rep) {
  t.line("{} {}", t.paint(kCyan, "trace:"), rep.path.empty() ? std::string("(rows in memory)") : rep.path);
  t.line("{} {}; {} analysed, {} op rows, {} gradient rows{}", t.paint(kCyan, "run:  "), run_text(rep.run),
         plural(rep.steps, "step"), rep.op_rows, rep.grad_rows, rep.complete ? "" : " (incomplete)");
}

// Every anomaly: origin, cause, root cause, evidence, propagation, remedies, occurrences.
void text_anomalies(Text& t, const Report& rep, const TextStyle& style) {
  const std::size_t max_items = std::max<std::size_t>(style.max_items, 1);
  const std::size_t max_names = 5;
  if (!rep.anomalies.empty()) {
    t.blank();
    t.line("{}", t.paint(kBold, fmt::format("ANOMALIES ({})", rep.anomalies.size())));
    for (std::size_t i = 0; i < rep.anomalies.size() && i < max_items; ++i) {
      const Diagnosis& d = rep.anomalies[i];
      if (i > 0) t.blank();
      t.line("[{}] {} {}", i + 1, t.paint(kRed, d.cause), t.paint(kBold, where(d)));
      std::string origin = fmt::format("step {}, {}", d.step, trace::phase_name(d.phase));
      if (has_seq(d.seq)) origin += fmt::format(", op #{} of the step", d.seq);
      const std::string types = dtypes(d.in_dtypes, d.out_dtype, d.autocast);
      if (!types.empty()) origin += ", " + types;
      t.line("    {}  {}", t.paint(kCyan, "origin:     "), origin);
      t.line("    {}  {}", t.paint(kCyan, "cause:      "), explanation(d.cause));
      if (!d.root_cause.empty())
        t.line("    {}  {} at {}", t.paint(kCyan, "root cause: "), d.root_cause, chain_text(d));
      for (std::size_t e = 0; e < d.evidence.size(); ++e)
        t.line("    {}  - {}", t.paint(kCyan, e == 0 ? "evidence:   " : "            "), d.evidence[e]);
      t.line("    {}  {}", t.paint(kCyan, "propagation:"), propagation(d, max_names));
      if (!d.remedies.empty()) {
        for (std::size_t k = 0; k < d.remedies.size(); ++k) {
          const Remedy& m = d.remedies[k];
          t.line("    {}  {}. {}{}", t.paint(kCyan, k == 0 ? "remedies:   " : "            "), k + 1, t.paint(kGreen, m.text),
                 m.verified ? " (verified by `ampscope fix`)" : "");
          if (!m.flag.empty()) t.line("                     ampscope train: {}", m.flag);
          if (!m.code.empty()) t.line("                     your own loop:  {}", m.code);
        }
      } else if (!d.remedy.empty()) {
        t.line("    {}  {}", t.paint(kCyan, "remedy:     "), t.paint(kGreen, d.remedy));
      }
      t.line("    {}  {}", t.paint(kCyan, "occurrences:"), occurrences(d.occurrences, d.step, d.last_step));
    }
    if (rep.anomalies.size() > max_items) t.line("... and {} more (--json lists them all)", rep.anomalies.size() - max_items);
  }
}

// The GradScaler's verdict and its numbers.
void text_scaler(Text& t, const Report& rep) {
  t.blank();
  const ScalerHealth& s = rep.scaler;
  t.line("{} {}: {}", t.paint(kBold, "SCALER:"), t.paint(verdict_colour(s.verdict), s.verdict), scaler_message(s));
  if (s.used || s.skipped > 0) t.line("  {}", scaler_numbers(s));
}

// Values that came near f16's limits without becoming an anomaly.
void text_headroom(Text& t, const Report& rep, const TextStyle& style) {
  const std::size_t max_items = std::max<std::size_t>(style.max_items, 1);
  t.blank();
  if (rep.warnings.empty()) {
    // The headroom factor is applied to f16 outputs and gradients only (near_f16_max): in a bf16, fp8 or f32
    // run "no op came within f16's range" would credit a check that looked at nothing, so the line names the
    // run's precision instead. An unknown precision keeps the f16 wording.
    const std::string& prec = rep.run.precision;
    const bool f16_range_watched = prec.empty() || prec == "fp16";
    // After an overflow "none" alone reads as a contradiction: the anomaly is not repeated here.
    if (rep.anomalies.empty()) {
      if (f16_range_watched)
        t.line("{} none (no op came within the headroom factor of f16's range, nothing flushed to zero)",
               t.paint(kBold, "HEADROOM:"));
      else
        t.line("{} none (nothing flushed to zero; the headroom factor applies to f16 outputs and gradients, and "
               "this run's precision is {})",
               t.paint(kBold, "HEADROOM:"), prec);
    } else if (f16_range_watched) {
      t.line("{} no warnings besides the anomalies above (no other op came within the headroom factor of f16's "
             "range, nothing else flushed to zero)",
             t.paint(kBold, "HEADROOM:"));
    } else {
      t.line("{} no warnings besides the anomalies above (nothing else flushed to zero; the headroom factor "
             "applies to f16 outputs and gradients, and this run's precision is {})",
             t.paint(kBold, "HEADROOM:"), prec);
    }
  } else {
    t.line("{}", t.paint(kBold, fmt::format("HEADROOM WARNINGS ({})", rep.warnings.size())));
    for (std::size_t i = 0; i < rep.warnings.size() && i < max_items; ++i) {
      const HeadroomWarning& w = rep.warnings[i];
      std::string at = w.op.empty() ? fmt::format("gradient of {}", w.tensor) : place(w.phase, w.op, w.module);
      if (!w.op.empty() && !w.tensor.empty() && w.tensor != "output") at += fmt::format(" ({})", w.tensor);
      t.line("  {} step {}, {}{}: {}{}", t.paint(kYellow, w.kind), w.step, at, w.dtype.empty() ? "" : " [" + w.dtype + "]",
             headroom_message(w),
             w.occurrences > 1 ? fmt::format(" ({}, last at step {})", plural(w.occurrences, "time"), w.last_step) : "");
    }
    if (rep.warnings.size() > max_items) t.line("  ... and {} more (--json lists them all)", rep.warnings.size() - max_items);
  }
}

// The f32 twin's rows: where precision was lost, ranked.
void text_precision(Text& t, const Report& rep) {
  t.blank();
  const PrecisionSection& p = rep.precision;
  if (!p.recorded()) {
    t.line("{} not recorded (run with --twin to see where f16/bf16 lose precision, op by op)", t.paint(kBold, "PRECISION:"));
  } else {
    t.line("{} {} twinned op rows over {}, {} ops", t.paint(kBold, "PRECISION:"), p.rows - p.backward_rows,
           plural(p.steps, "step"), p.ops);
    t.line("  where precision was lost (jump: output's error over its inputs'):");
    for (std::size_t i = 0; i < p.by_jump.size(); ++i) {
      const PrecisionEntry& e = p.by_jump[i];
      t.line("  [{}] {} {} [{}]: jump {}: {}", i + 1, t.paint(e.remedies.empty() ? kCyan : kYellow, e.kind),
             t.paint(kBold, precision_place(e)), precision_dtype(e), num(e.score), e.evidence);
      for (std::size_t k = 0; k < e.remedies.size(); ++k) {
        const Remedy& m = e.remedies[k];
        t.line("      {}. {}", k + 1, t.paint(kGreen, m.text));
        if (!m.flag.empty()) t.line("         ampscope train: {}", m.flag);
        if (!m.code.empty()) t.line("         your own loop:  {}", m.code);
      }
    }
    if (!p.by_local.empty()) {
      t.line("  own rounding (local error):");
      for (const PrecisionEntry& e : p.by_local) t.line("    {} [{}]: {}", precision_place(e), e.out_dtype, e.evidence);
    }
    if (p.by_trend.empty()) {
      t.line("  growing over steps: none");
    } else {
      t.line("  growing over steps:");
      for (const PrecisionEntry& e : p.by_trend)
        t.line("    {}{}: {}", precision_place(e), e.fp8.empty() ? "" : " [" + precision_dtype(e) + "]", e.evidence);
    }
    if (!p.conditioning.empty()) {
      t.line("  condition (add, sub, sum, mean):");
      for (const PrecisionEntry& e : p.conditioning) t.line("    {}: {}", precision_place(e), e.evidence);
    }
    if (!p.backward.empty()) {
      t.line("  backward (local error of {} over {}, ranked):", plural(p.backward_nodes, "node"),
             plural(p.backward_rows, "row"));
      for (const PrecisionEntry& e : p.backward) t.line("    {} [{}]: {}", precision_place(e), e.out_dtype, e.evidence);
    }
  }
}

// f16/bf16 parameters whose updates rounded away (only when the trace has /updates rows).
void text_swamped(Text& t, const Report& rep) {
  const SwampedSection& sw = rep.swamped;
  if (sw.recorded()) {
    t.blank();
    if (sw.stalled.empty()) {
      t.line("{} none: {} f16/bf16 {} kept more than half of their updates over the last {}",
             t.paint(kBold, "SWAMPED UPDATES:"), sw.params, sw.params == 1 ? "parameter" : "parameters",
             plural(sw.window, "step"));
    } else {
      t.line("{} {} of {} f16/bf16 {} stopped learning (over half of their updates rounded away, last {}):",
             t.paint(kBold, "SWAMPED UPDATES:"), sw.stalled.size(), sw.params,
             sw.params == 1 ? "parameter" : "parameters", plural(sw.window, "step"));
      for (std::size_t i = 0; i < sw.stalled.size(); ++i) {
        const SwampedParam& p = sw.stalled[i];
        t.line("  [{}] {} [{}]: {}", i + 1, t.paint(kBold, p.param), p.dtype, p.evidence);
        if (i + 1 == sw.stalled.size() || sw.stalled[i + 1].dtype != p.dtype) {
          for (const Remedy& m : p.remedies) {
            t.line("      {}", t.paint(kGreen, m.text));
            if (!m.code.empty()) t.line("      your own loop:  {}", m.code);
          }
        }
      }
    }
  }
}

// A fraction as a percentage with three significant digits, for the FP8 and block-scaled sections: an underflow of
// 0.004% is worth seeing, and pct() would print 0.0%.
std::string pct3(double fraction) { return std::isfinite(fraction) ? fmt::format("{:.3g}%", 100.0 * fraction) : num(fraction); }

// "step 3" or "steps 3 to 9": the steps an FP8 or block-scaled finding spans.
std::string finding_steps(const Fp8Finding& x) {
  return x.first_step == x.last_step ? fmt::format("step {}", x.first_step)
                                     : fmt::format("steps {} to {}", x.first_step, x.last_step);
}

// The header of the FP8 and block-scaled findings' list.
void text_findings_header(Text& t) { t.line("  findings (calibration, not anomalies: nothing became NaN/Inf):"); }

// A finding's remedies, one line each.
void text_remedies(Text& t, const Fp8Finding& x) {
  for (const Fp8Remedy& r : x.remedies)
    t.line("      remedy: {} ({}){}", r.command_line, r.why, r.verified ? " (verified by `ampscope fix`)" : "");
}

// Block-scaled copies (only when the trace has /blocks rows): every copy (up to kBlockListed; --json has all), then
// the worst by underflow and by saturation. What-if copies speak in the conditional: the run did not train in them.
inline constexpr std::size_t kBlockListed = 32;
void text_blocks(Text& t, const Report& rep) {
  const BlockSection& b = rep.blocks;
  if (!b.recorded()) return;
  const auto pct = pct3;
  const auto name = [&](const BlockCopySummary& c) {
    return fmt::format("{} {} {} [{}{}]", t.paint(kBold, c.module), c.operand, c.copy, c.format, c.what_if ? ", what-if" : "");
  };
  t.blank();
  t.line("{} {} of {} {} over {} ({} to {}){}", t.paint(kBold, "BLOCK-SCALED FORMATS:"),
         plural(static_cast<std::int64_t>(b.copies.size()), "operand copy", "operand copies"), b.modules,
         b.modules == 1 ? "Linear" : "Linears", plural(b.steps, "recorded step"), b.first_step, b.last_step,
         b.what_if_rows > 0 ? fmt::format("; {} of {} rows what-if (measured only: the run did not train in that format)",
                                          b.what_if_rows, b.rows)
                            : "");
  for (std::size_t i = 0; i < b.copies.size() && i < kBlockListed; ++i) {
    const BlockCopySummary& c = b.copies[i];
    const std::string verb_u = c.what_if ? "would underflow" : "underflow", verb_s = c.what_if ? "would saturate" : "saturated";
    t.line("    {}: {} {} to 0 (step {}: {}), {} {} (step {}: {}); error {} rms at most", name(c), verb_u,
           pct(c.underflow_fraction), c.worst_underflow_step, pct(c.worst_underflow_fraction), verb_s,
           pct(c.saturated_fraction), c.worst_saturated_step, pct(c.worst_saturated_fraction), pct(c.max_rel_rms_error));
    const std::string widest = c.max_range_block < 0
                                   ? std::string("no block holds two non-zero magnitudes")
                                   : fmt::format("widest block {:.1f} binades (block {} at row {}, col {}, step {})",
                                                 c.max_block_range, c.max_range_block, c.max_range_row, c.max_range_col,
                                                 c.max_range_step);
    const std::string lost = c.worst_block < 0 ? std::string("")
                                               : fmt::format("; most lost in one block: {} (block {} at row {}, col {}, step {})",
                                                             c.worst_block_underflow, c.worst_block, c.worst_block_row,
                                                             c.worst_block_col, c.worst_block_step);
    t.line("      {}{}; block scales 2^{} .. 2^{} (median 2^{})", widest, lost, num(c.scale_log2_min), num(c.scale_log2_max),
           num(c.scale_log2_median));
  }
  if (b.copies.size() > kBlockListed) t.line("    ... {} more (report --json lists every copy)", b.copies.size() - kBlockListed);
  const auto worst_line = [&](const std::vector<std::size_t>& list, bool underflow) {
    std::vector<std::string> parts;
    for (std::size_t i : list) {
      const BlockCopySummary& c = b.copies[i];
      const double f = underflow ? c.underflow_fraction : c.saturated_fraction;
      parts.push_back(c.what_if ? fmt::format("{} would {} {} in {}", name(c), underflow ? "underflow" : "saturate", pct(f), c.format)
                                : fmt::format("{} {}", name(c), pct(f)));
    }
    return fmt::format("{}", fmt::join(parts, "; "));
  };
  t.line("  worst by underflow: {}", b.worst_underflow.empty() ? std::string("none (no nonzero value lost to a block's scale)")
                                                               : worst_line(b.worst_underflow, true));
  t.line("  worst by saturation: {}", b.worst_saturation.empty() ? std::string("none (no value clipped at the element's max)")
                                                                 : worst_line(b.worst_saturation, false));
  // The block-scaled findings (docs/fp8.md, "Block-scaled diagnoses"), kept with the FP8 findings in the report
  // (fix picks them up there) and printed here, beside the rows they come from.
  std::vector<const Fp8Finding*> findings;
  for (const Fp8Finding& x : rep.fp8.findings)
    if (block_finding_kind(x.kind)) findings.push_back(&x);
  if (b.what_if_rows == b.rows) return;  // measured only: the run's GEMMs used none of these copies, no finding
  if (findings.empty()) {
    t.line("  findings: none (no block clipped by the floor scale rule past rounding, no block flattened by an "
           "outlier, no rowwise/columnwise copies apart, no Linear's error above its element's unit roundoff)");
    return;
  }
  text_findings_header(t);
  for (const Fp8Finding* p : findings) {
    const Fp8Finding& x = *p;
    const std::string steps = finding_steps(x);
    if (x.kind == "mx_floor_clipping")
      t.line("    {} {} {} [{}]: blocks clipped by the floor scale rule: {} of {} nonzero values ({}) saturated in {} "
             "blocks over {}, RMS error up to {} (above E4M3's unit roundoff {}; worst step {}: {} clipped)",
             t.paint(kBold, x.module), x.operand, x.copy, x.format, x.count, x.nonzero, pct(x.fraction), x.blocks_clipped,
             steps, pct(x.error), pct(x.error_bound), x.worst_step, pct(x.worst_fraction));
    else if (x.kind == "block_outlier")
      t.line("    {} {} {} [{}]: a block flattened by an outlier: the block at row {}, col {} (step {}) lost {} of its "
             "{} values to 0 (the worst of as many blocks of Gaussian values reaches {} in at most 1 step of 1000), its copy's widest block "
             "spanning {:.1f} binades (the element holds {:.2f}); {} of {} nonzero values to 0 ({}) over {}",
             t.paint(kBold, x.module), x.operand, x.copy, x.format, x.block_row, x.block_col, x.block_step,
             x.block_zeroed, x.block_values, x.block_bar, x.block_range, x.range_bound, x.count, x.nonzero,
             pct(x.fraction), steps);
    else if (x.kind == "block_copy_mismatch")
      t.line("    {} {} [{}]: rowwise and columnwise copies apart: the {} copy's error {} rms and underflow {} against "
             "the other's {} and {} (step {}; apart by more than {} error or {} underflow over {}): the {} uses values "
             "the forward did not",
             t.paint(kBold, x.module), x.operand, x.format, x.copy, pct(x.error), pct(x.worst_fraction),
             pct(x.other_error), pct(x.other_fraction), x.worst_step, pct(x.error_bound), pct(x.threshold), steps,
             x.operand == "weight" ? "input gradient (dgrad)" : "weight gradient (wgrad)");
    else if (x.twin)
      t.line("    {} [{}]: block-scaled error dominates (f32 twin): its output is {} off the unquantized f32 Linear on "
             "average over {} (above {}, the element's unit roundoff), its inputs {}: a jump of {} on average ({} in "
             "step {}); {}",
             t.paint(kBold, x.module), x.format, pct(x.error), plural(x.steps, "twinned call"), pct(x.error_bound),
             pct(x.in_error), num(x.jump), num(x.worst_jump), x.worst_step,
             x.next_module.empty() ? std::string("no other block-scaled Linear has twin rows")
                                   : fmt::format("the next Linear by jump, {}, {} ({} off)", x.next_module,
                                                 num(x.next_jump), pct(x.next_error)));
    else
      t.line("    {} [{}]: block-scaled error dominates: {} {}'s quantization error is {} rms on average over the "
             "recorded steps, above {} (the element's unit roundoff), over {}; no twin rows (run with --twin to "
             "measure it at the Linear's output); {}",
             t.paint(kBold, x.module), x.format, x.operand, x.copy, pct(x.error), pct(x.error_bound), steps,
             x.next_module.empty() ? std::string("no other block-scaled Linear")
                                   : fmt::format("the next Linear, {}, {}", x.next_module, pct(x.next_error)));
    text_remedies(t, x);
  }
}

// A --precision fp8 run's operands (only when the trace has /fp8 rows): the worst by underflow and by saturation.
void text_fp8(Text& t, const Report& rep) {
  const Fp8Section& f = rep.fp8;
  if (!f.recorded()) return;
  const auto pct = pct3;
  t.blank();
  t.line("{} {} of {} FP8 {} over {} ({} to {})", t.paint(kBold, "FP8 OPERANDS:"),
         plural(static_cast<std::int64_t>(f.operands.size()), "operand"), f.modules, f.modules == 1 ? "Linear" : "Linears",
         plural(f.steps, "recorded step"), f.first_step, f.last_step);
  const auto line = [&](const Fp8OperandSummary& o) {
    t.line("    {} {} [{}]: {} underflow to 0 (step {}: {}), {} subnormal, {} saturated (step {}: {}); error {} rms "
           "at most; last scale {}, amax {}",
           t.paint(kBold, o.module), o.operand, o.format, pct(o.underflow_fraction), o.worst_underflow_step,
           pct(o.worst_underflow_fraction), pct(o.subnormal_fraction), pct(o.saturated_fraction),
           o.worst_saturated_step, pct(o.worst_saturated_fraction), pct(o.max_rel_rms_error), num(o.last_scale),
           num(o.last_amax));
    // The optional columns (absent from the first format 7 traces): ranges in binades, the next scale's source.
    if (o.last_history_len < 0) return;
    const std::string history =
        o.last_history_len == 0 ? std::string("current scaling: no history")
        : o.last_history_amax_step >= 0
            ? fmt::format("next scale from amax {} of step {} ({}-step history)", num(o.last_history_amax),
                          o.last_history_amax_step, o.last_history_len)
            : fmt::format("next scale from amax {} ({}-step history)", num(o.last_history_amax), o.last_history_len);
    t.line("      dynamic range {:.1f} binades ({:.1f} after the cast, widest {:.1f}); {}", o.last_dynamic_range,
           o.last_quantized_dynamic_range, o.max_dynamic_range, history);
  };
  if (f.worst_underflow.empty()) {
    t.line("  underflow: none (no nonzero value quantized to zero)");
  } else {
    t.line("  worst by underflow (of the nonzero values, over the recorded steps):");
    for (std::size_t i : f.worst_underflow) line(f.operands[i]);
  }
  if (f.worst_saturation.empty()) {
    t.line("  saturation: none (no value clipped at the format's max)");
  } else {
    t.line("  worst by saturation (values clipped at +-max, silently):");
    for (std::size_t i : f.worst_saturation) line(f.operands[i]);
  }
  // The delayed recipe's start-up (analysis.h, Fp8StartUp): what the initial scale lost, on a line of its own and
  // not a finding, as the GradScaler's calibration skips are.
  if (!f.start_up.empty()) {
    std::string items;
    for (const Fp8StartUp& u : f.start_up) {
      std::vector<std::string> lost;
      if (u.underflow_over) lost.push_back(fmt::format("{} underflow", pct(u.worst_underflow_fraction)));
      if (u.saturation_over) lost.push_back(fmt::format("{} saturated", pct(u.worst_saturated_fraction)));
      if (u.error_over) lost.push_back(fmt::format("error {} rms", pct(u.max_error)));
      items += fmt::format("{}{} {} [{}] {} in {}", items.empty() ? "" : "; ", u.module, u.operand, u.format,
                           fmt::join(lost, ", "),
                           u.first_step == u.last_step ? fmt::format("step {}", u.first_step)
                                                       : fmt::format("steps {} to {}", u.first_step, u.last_step));
    }
    t.line("  {} cast with the delayed recipe's initial scale 1, before any amax was recorded: {}; expected, not "
           "findings",
           t.paint(kCyan, "start-up:"), items);
  }
  // Findings: calibration-like (no NaN/Inf), kept apart from the anomalies as the scaler's calibration is.
  if (f.findings.empty()) {
    t.line("  findings: none (no E4M3 gradient underflow above {}, no saturation above {} in a step, no scale held "
           "by an amax spike, no Linear's error above its format's unit roundoff)",
           pct(kFp8GradUnderflowThreshold), pct(kFp8SaturationThreshold));
    return;
  }
  text_findings_header(t);
  for (const Fp8Finding& x : f.findings) {
    if (block_finding_kind(x.kind)) continue;  // printed in the BLOCK-SCALED FORMATS section
    const std::string steps = finding_steps(x);
    if (x.kind == "e4m3_grad_underflow")
      t.line("    {} {} [{}]: gradients underflow in E4M3: {} of {} nonzero values quantized to 0 ({}) over {} "
             "({} over {}; worst step {}: {})",
             t.paint(kBold, x.module), x.operand, x.format, x.count, x.nonzero, pct(x.fraction), steps,
             plural(x.steps, "recorded step"), pct(x.threshold), x.worst_step, pct(x.worst_fraction));
    else if (x.kind == "stale_scale")
      t.line("    {} {} [{}]: stale scale: amax spiked in step {} ({} after {}); the scale fell from {} to {} and "
             "stayed there over {}, underflow {} in step {} and {} in step {} ({} of {} nonzero values to 0 over "
             "the held steps; raised more than {} for {}){}",
             t.paint(kBold, x.module), x.operand, x.format, x.spike_step, num(x.amax_spike), num(x.amax_before),
             num(x.scale_before), num(x.scale_held), steps, pct(x.underflow_before), x.spike_step,
             pct(x.underflow_after), x.spike_step + 1, x.count, x.nonzero, pct(x.threshold),
             plural(x.steps, "recorded step"),
             x.window > 0 ? fmt::format("; the amax history ({} steps) holds it through step {}", x.window,
                                        x.spike_step + x.window)
                          : "");
    else if (x.kind == "fp8_error_dominates")
      t.line("    {} [{}]: FP8 error dominates: {}'s quantization error is {} rms on average over the recorded steps, "
             "above {} ({}'s unit roundoff, the most rounding alone can cost), over {}; {}",
             t.paint(kBold, x.module), x.format, x.operand, pct(x.error), pct(x.error_bound), x.format, steps,
             x.next_module.empty() ? std::string("no other FP8 Linear")
                                   : fmt::format("the next Linear, {}, {}", x.next_module, pct(x.next_error)));
    else
      t.line("    {} {} [{}]: silent saturation: {} of {} nonzero values clipped at +-max ({}) over {} ({} over "
             "{} with an RMS error above {}; worst step {}: {}); amax * scale reached {}, RMS error {}",
             t.paint(kBold, x.module), x.operand, x.format, x.count, x.nonzero, pct(x.fraction), steps,
             plural(x.steps, "recorded step"), pct(x.threshold), pct(x.error_bound), x.worst_step,
             pct(x.worst_fraction), num(x.max_scaled_amax), pct(x.error));
    text_remedies(t, x);
  }
}

// One closing line.
void text_summary(Text& t, const Report& rep) {
  const ScalerHealth& s = rep.scaler;
  t.blank();
  std::string summary;
  if (rep.anomalies.empty()) {
    summary = "healthy: no NaN/Inf";
  } else {
    const Diagnosis& d = rep.anomalies.front();
    summary = fmt::format("{} (first: {} at step {}, {})", plural(static_cast<std::int64_t>(rep.anomalies.size()), "anomaly",
                                                                  "anomalies"),
                          d.cause, d.step, where(d));
  }
  summary += fmt::format("; {}; scaler {}", plural(static_cast<std::int64_t>(rep.warnings.size()), "headroom warning"),
                         s.verdict);
  if (s.skipped > 0) summary += fmt::format(" ({} of {} steps skipped)", s.skipped, s.steps);
  if (!rep.complete) summary += "; trace incomplete";
  if (!rep.damage.empty()) summary += "; trace DAMAGED";
  t.line("{} {}", t.paint(rep.anomalies.empty() ? kGreen : kRed, "SUMMARY:"), summary);
}

}  // namespace

std::string render_text(const Report& rep, const TextStyle& style) {
  Text t(style);
  text_answer(t, rep, style);
  if (style.brief) return t.take();
  t.blank();
  text_run(t, rep);
  text_anomalies(t, rep, style);
  text_scaler(t, rep);
  text_headroom(t, rep, style);
  text_precision(t, rep);
  text_swamped(t, rep);
  text_fp8(t, rep);
  text_blocks(t, rep);
  text_summary(t, rep);
  return t.take();
}

std::string render_json(const Report& rep) {
  json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["kind"] = "report";
  doc["path"] = rep.path;
  doc["run"] = run_json(rep.run);
  doc["complete"] = rep.complete;
  doc["damage"] = rep.damage;  // [] for a sound trace
  doc["steps"] = rep.steps;
  doc["op_rows"] = rep.op_rows;
  doc["grad_rows"] = rep.grad_rows;
  doc["healthy"] = rep.healthy();
  doc["anomalies"] = json::array();
  for (const Diagnosis& d : rep.anomalies) doc["anomalies"].push_back(diagnosis_json(d));
  doc["warnings"] = json::array();
  for (const HeadroomWarning& w : rep.warnings) doc["warnings"].push_back(warning_json(w));
  doc["scaler"] = scaler_json(rep.scaler);
  doc["coverage"] = coverage_json(rep.coverage);
  doc["provenance"] = rep.provenance;
  doc["precision"] = precision_json(rep.precision);
  doc["swamped"] = swamped_json(rep.swamped);
  doc["fp8"] = fp8_json(rep.fp8);
  doc["fp8_findings"] = json::array();
  for (const Fp8Finding& f : rep.fp8.findings) doc["fp8_findings"].push_back(fp8_finding_json(f));
  doc["blocks"] = blocks_json(rep.blocks);
  // Invalid UTF-8 in a recorded name (a cut string) becomes U+FFFD rather than an exception.
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

// ===================================================================================================
// Diff

namespace {

// The answer first: where the runs part (ops, losses, gradients), or that they agree; damage before it
// (the comparison covers only what is intact).
void diff_answer(Text& t, const DiffReport& d) {
  const std::string threshold = num(d.options.threshold);
  const std::string reference = "of each op's largest rms so far";
  for (const std::string& note : d.damage_a) t.line("{} run a: {}; compared what is intact", t.paint(kRed, "DAMAGED:"), note);
  for (const std::string& note : d.damage_b) t.line("{} run b: {}; compared what is intact", t.paint(kRed, "DAMAGED:"), note);
  if (d.producers_differ()) {
    const auto who = [](const std::string& producer) {
      return producer == "pytorch" ? std::string("a PyTorch script recorded by ampscope record")
                                   : std::string("ampscope's runtime (ampscope train)");
    };
    t.line("{} run a is {}, run b is {}: ops are aligned by step, phase, module path, op and occurrence; rows only "
           "one of them writes (the recorder's optimizer and gradient-clipping ops, the runtime's casts and backward "
           "rows of views) are listed as only in a/b, not judged",
           t.paint(kYellow, "DIFFERENT PRODUCERS:"), who(d.producer_a), who(d.producer_b));
  }
  if (d.aligned_by_update) {
    const auto skips = [](const std::vector<std::int64_t>& steps) {
      return steps.empty() ? std::string("none") : fmt::format("step{} {}", steps.size() == 1 ? "" : "s", fmt::join(steps, ", "));
    };
    t.line("{} the GradScaler skipped steps while its scale calibrated: run a {}, run b {} (not compared). From there "
           "one run had taken fewer optimizer updates, so steps are paired by update, not by number; where each step "
           "reads a batch of its own, paired steps saw different batches",
           t.paint(kYellow, "PAIRED BY UPDATE:"), skips(d.calibration_skips_a), skips(d.calibration_skips_b));
  }
  if (d.first_divergence) {
    const OpDiff& f = *d.first_divergence;
    t.line("{} {}, {}", t.paint(kRed, "FIRST DIVERGENCE:"), steps_text(d, f.key.step, f.step_b),
           t.paint(kBold, op_diff_place(f)));
    t.line("  {}", op_diff_detail(f));
    if (!f.unpaired_before_a.empty() || !f.unpaired_before_b.empty()) {
      const auto ops = [](const std::vector<std::string>& v) {
        return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, ", "));
      };
      t.line("  before it in {}, ops without a partner: a {}; b {} (the runs computed different ops there)",
             f.key.module.empty() ? std::string("(outside any module)") : f.key.module, ops(f.unpaired_before_a),
             ops(f.unpaired_before_b));
    }
    if (f.dtypes_a != f.dtypes_b)
      t.line("  dtypes: a {}, b {}", f.dtypes_a.empty() ? "?" : f.dtypes_a, f.dtypes_b.empty() ? "?" : f.dtypes_b);
    else if (!f.dtypes_a.empty())
      t.line("  dtypes: {} in both", f.dtypes_a);
  } else {
    t.line("{}", t.paint(kGreen, fmt::format("NO OP DIVERGENCE: no aligned op differs by more than {} {} ({} aligned op rows)",
                                             threshold, reference, d.ops_aligned)));
  }
  if (d.first_loss_divergence) {
    const std::int64_t step = *d.first_loss_divergence;
    const auto p = std::find_if(d.losses.begin(), d.losses.end(), [&](const LossPoint& l) { return l.step == step; });
    if (p != d.losses.end())
      t.line("{} {}: a {}, b {} (difference {} of the largest loss so far)", t.paint(kRed, "LOSSES PART:"),
             steps_text(d, step, p->step_b), num(p->loss_a), num(p->loss_b), num(p->rel));
    else
      t.line("{} step {}", t.paint(kRed, "LOSSES PART:"), step);
  } else if (d.steps_compared > 0) {
    t.line("{} the losses stay within {} of the largest loss so far", t.paint(kGreen, "LOSSES AGREE:"), threshold);
  } else if (!d.losses.empty()) {
    t.line("{} no step is recorded in both runs: nothing to compare", t.paint(kYellow, "LOSSES:"));
  }
  if (d.first_grad_divergence) {
    const GradDiff& g = *d.first_grad_divergence;
    t.line("{} {}, {}: {}", t.paint(kRed, "GRADIENTS PART:"), steps_text(d, g.step, g.step_b), g.param,
           grad_diff_detail(g));
  } else if (d.grads_aligned > 0) {
    t.line("{} {} within {} of each parameter's largest gradient norm so far", t.paint(kGreen, "GRADIENTS AGREE:"),
           plural(d.grads_aligned, "gradient"), threshold);
  }
}

// The two runs and what was compared.
void diff_runs(Text& t, const DiffReport& d) {
  const std::string threshold = num(d.options.threshold);
  const std::string reference = "of each op's largest rms so far";
  t.line("{} {}  ({})", t.paint(kCyan, "a:"), d.path_a.empty() ? std::string("(rows in memory)") : d.path_a, run_text(d.run_a));
  t.line("{} {}  ({})", t.paint(kCyan, "b:"), d.path_b.empty() ? std::string("(rows in memory)") : d.path_b, run_text(d.run_b));
  t.line("compared: {} in both, {} aligned op rows, {} in both; threshold {} {} (mean and rms; absmax is shown, "
         "not judged)",
         plural(d.steps_compared, "step"), d.ops_aligned, plural(d.grads_aligned, "gradient"), threshold, reference);
  t.line("scale-aware: backward rows and gradients are compared divided by each run's loss scale of the step "
         "(a: {}; b: {})",
         scales_text(d.losses, true), scales_text(d.losses, false));
  if (d.rows_outside_steps_a > 0 || d.rows_outside_steps_b > 0)
    t.line("outside steps: {} in a, {} in b (step -1: an evaluation pass between steps); not steps, not compared",
           plural(d.rows_outside_steps_a, "op row"), d.rows_outside_steps_b);
}

// The loss curves side by side: every step when few, else evenly spaced rows plus the divergences.
void diff_losses(Text& t, const DiffReport& d) {
  if (!d.losses.empty()) {
    t.blank();
    // Every step when few; otherwise evenly spaced rows, plus the first and last and the divergence steps.
    constexpr std::size_t kAllRows = 24, kSampledRows = 16;
    std::set<std::size_t> rows;
    if (d.losses.size() <= kAllRows) {
      for (std::size_t i = 0; i < d.losses.size(); ++i) rows.insert(i);
    } else {
      for (std::size_t k = 0; k < kSampledRows; ++k) rows.insert(k * (d.losses.size() - 1) / (kSampledRows - 1));
      for (std::optional<std::int64_t> s : {d.first_loss_divergence, d.first_divergence
                                                                         ? std::optional<std::int64_t>(d.first_divergence->key.step)
                                                                         : std::nullopt}) {
        if (!s) continue;
        for (std::size_t i = 0; i < d.losses.size(); ++i)
          if (d.losses[i].step == *s) rows.insert(i);
      }
    }
    t.line("{}", t.paint(kBold, fmt::format("LOSS (a | b){}", rows.size() < d.losses.size()
                                                                  ? fmt::format(": {} of {} steps", rows.size(), d.losses.size())
                                                                  : "")));
    t.line("  {:>7}  {:>12}  {:>12}  {:>10}  {:>10}  {:>10}", "step", "loss a", "loss b", "rel diff", "scale a", "scale b");
    std::size_t previous = 0;
    bool any = false;
    for (std::size_t i : rows) {
      if (any && i > previous + 1) t.line("  {:>7}", "...");
      const LossPoint& p = d.losses[i];
      const bool mark = (d.first_loss_divergence && *d.first_loss_divergence == p.step) ||
                        (d.first_divergence && d.first_divergence->key.step == p.step);
      const std::string rel = p.in_a && p.in_b ? num(p.rel) : "-";
      std::string row = fmt::format("  {:>7}  {:>12}  {:>12}  {:>10}  {:>10}  {:>10}", p.step, loss_cell(p.in_a, p.loss_a, p.skipped_a),
                                    loss_cell(p.in_b, p.loss_b, p.skipped_b), rel, p.in_a ? scale(p.scale_a) : "-",
                                    p.in_b ? scale(p.scale_b) : "-");
      if (mark) row = t.paint(kRed, row + "  <- first divergence");
      t.line("{}", row);
      previous = i;
      any = true;
    }
    t.line("  (S: the step was skipped; -: not recorded in that run)");
  }
}

// The largest per-op differences.
void diff_largest(Text& t, const DiffReport& d, const TextStyle& style) {
  const std::size_t max_items = std::max<std::size_t>(style.max_items, 1);
  const std::string threshold = num(d.options.threshold);
  t.blank();
  if (d.largest.empty()) {
    t.line("{} none", t.paint(kBold, "LARGEST DIFFERENCES:"));
  } else {
    t.line("{}", t.paint(kBold, fmt::format("LARGEST DIFFERENCES ({} shown of the {} largest)", std::min(max_items, d.largest.size()),
                                            d.largest.size())));
    for (std::size_t i = 0; i < d.largest.size() && i < max_items; ++i) {
      const OpDiff& o = d.largest[i];
      const bool over = o.nonfinite_differs || o.max_rel > d.options.threshold;
      t.line("  {} step {}, {}: {}", t.paint(over ? kRed : kDim, fmt::format("{:>9}", num(o.max_rel))), o.key.step,
             op_diff_place(o), op_diff_detail(o));
    }
  }
}

// Ops that ran in other dtypes in the two runs.
void diff_dtypes(Text& t, const DiffReport& d, const TextStyle& style) {
  const std::size_t max_items = std::max<std::size_t>(style.max_items, 1);
  t.blank();
  if (d.dtype_differences.empty()) {
    t.line("{} none: every aligned op ran in the same dtypes", t.paint(kBold, "DTYPE DIFFERENCES:"));
  } else {
    t.line("{}", t.paint(kBold, fmt::format("DTYPE DIFFERENCES ({})", d.dtype_differences.size())));
    for (std::size_t i = 0; i < d.dtype_differences.size() && i < max_items; ++i) {
      const DtypeDifference& x = d.dtype_differences[i];
      t.line("  {}: a {}, b {} ({}, from step {})", phase_place(x.phase, x.op, x.module),
             x.dtypes_a, x.dtypes_b, plural(x.count, "row"), x.first_step);
    }
    if (d.dtype_differences.size() > max_items)
      t.line("  ... and {} more (--json lists them all)", d.dtype_differences.size() - max_items);
  }
}

// Op rows and steps only one run has.
void diff_only(Text& t, const DiffReport& d, const TextStyle& style) {
  const std::size_t max_items = std::max<std::size_t>(style.max_items, 1);
  auto only = [&](std::string_view label, const std::vector<Unmatched>& list, const std::vector<std::int64_t>& steps) {
    t.blank();
    if (list.empty() && steps.empty()) {
      t.line("{} nothing", t.paint(kBold, fmt::format("ONLY IN {}:", label)));
      return;
    }
    std::int64_t rows = 0;
    for (const Unmatched& u : list) rows += u.count;
    t.line("{}", t.paint(kBold, fmt::format("ONLY IN {} ({} op rows)", label, rows)));
    for (std::size_t i = 0; i < list.size() && i < max_items; ++i) {
      const Unmatched& u = list[i];
      t.line("  {}: {}, from step {}", phase_place(u.phase, u.op, u.module), plural(u.count, "row"),
             u.first_step);
    }
    if (list.size() > max_items) t.line("  ... and {} more (--json lists them all)", list.size() - max_items);
    if (!steps.empty()) {
      std::string s;
      for (std::size_t i = 0; i < steps.size() && i < 3 * max_items; ++i) s += (i ? ", " : "") + std::to_string(steps[i]);
      if (steps.size() > 3 * max_items) s += fmt::format(" and {} more", steps.size() - 3 * max_items);
      t.line("  {}: {}", plural(static_cast<std::int64_t>(steps.size()), "step"), s);
    }
  };
  only("A", d.only_in_a, d.steps_only_in_a);
  only("B", d.only_in_b, d.steps_only_in_b);
  if (d.different_tensors.empty()) return;
  std::int64_t rows = 0;
  for (const DifferentTensors& x : d.different_tensors) rows += x.count;
  t.blank();
  t.line("{}", t.paint(kBold, fmt::format("DIFFERENT TENSORS ({} aligned op rows, not judged: each producer "
                                          "recorded another tensor of the op)", rows)));
  for (std::size_t i = 0; i < d.different_tensors.size() && i < max_items; ++i) {
    const DifferentTensors& x = d.different_tensors[i];
    t.line("  {}: a {}, b {} ({}, from step {})", phase_place(x.phase, x.op, x.module), x.shape_a, x.shape_b,
           plural(x.count, "row"), x.first_step);
  }
  if (d.different_tensors.size() > max_items)
    t.line("  ... and {} more (--json lists them all)", d.different_tensors.size() - max_items);
}

// One closing line.
void diff_summary(Text& t, const DiffReport& d) {
  const std::string threshold = num(d.options.threshold);
  t.blank();
  std::string summary;
  if (d.first_divergence) {
    summary = fmt::format("the runs part at step {}, at {} ({})", d.first_divergence->key.step,
                          op_diff_place(*d.first_divergence), d.first_divergence->stat);
  } else if (d.first_loss_divergence) {
    summary = fmt::format("the losses part at step {}", *d.first_loss_divergence);
  } else if (d.first_grad_divergence) {
    summary = fmt::format("the gradients part at step {}, at {} ({})", d.first_grad_divergence->step,
                          d.first_grad_divergence->param, d.first_grad_divergence->stat);
  } else {
    summary = fmt::format("no divergence beyond {}", threshold);
  }
  std::int64_t dtype_rows = 0;
  for (const DtypeDifference& x : d.dtype_differences) dtype_rows += x.count;
  std::int64_t only_a = 0, only_b = 0;
  for (const Unmatched& u : d.only_in_a) only_a += u.count;
  for (const Unmatched& u : d.only_in_b) only_b += u.count;
  summary += fmt::format("; {} in other dtypes; {} only in a, {} only in b", plural(dtype_rows, "op row"), only_a, only_b);
  t.line("{} {}", t.paint(diverged(d) ? kRed : kGreen, "SUMMARY:"), summary);
}

}  // namespace

std::string render_text(const DiffReport& d, const TextStyle& style) {
  Text t(style);
  diff_answer(t, d);
  if (style.brief) {
    std::int64_t rows = 0;
    for (const DtypeDifference& x : d.dtype_differences) rows += x.count;
    t.line("  dtype differences: {} in {} (phase, module, op) group{}", plural(rows, "op row"), d.dtype_differences.size(),
           d.dtype_differences.size() == 1 ? "" : "s");
    return t.take();
  }
  t.blank();
  diff_runs(t, d);
  diff_losses(t, d);
  diff_largest(t, d, style);
  diff_dtypes(t, d, style);
  diff_only(t, d, style);
  diff_summary(t, d);
  return t.take();
}

std::string render_json(const DiffReport& d) {
  json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["kind"] = "diff";
  doc["path_a"] = d.path_a;
  doc["path_b"] = d.path_b;
  doc["run_a"] = run_json(d.run_a);
  doc["run_b"] = run_json(d.run_b);
  doc["producer_a"] = d.producer_a;  // "ampscope" (its runtime) or "pytorch" (ampscope record)
  doc["producer_b"] = d.producer_b;
  doc["options"] = {{"threshold", number(d.options.threshold)},
                    {"floor", number(d.options.floor)},
                    {"largest", d.options.largest},
                    {"rows_per_read", d.options.rows_per_read}};
  doc["scale_aware"] = true;
  doc["aligned_by"] = d.aligned_by_update ? "update" : "step";
  doc["calibration_skips_a"] = d.calibration_skips_a;
  doc["calibration_skips_b"] = d.calibration_skips_b;
  doc["damage_a"] = d.damage_a;  // [] for a sound trace
  doc["damage_b"] = d.damage_b;
  doc["steps_compared"] = d.steps_compared;
  doc["ops_aligned"] = d.ops_aligned;
  doc["rows_outside_steps_a"] = d.rows_outside_steps_a;
  doc["rows_outside_steps_b"] = d.rows_outside_steps_b;
  doc["grads_aligned"] = d.grads_aligned;
  doc["diverged"] = diverged(d);
  doc["losses"] = json::array();
  for (const LossPoint& p : d.losses)
    doc["losses"].push_back({{"step", p.step},
                             {"step_b", p.step_b},
                             {"in_a", p.in_a},
                             {"in_b", p.in_b},
                             {"loss_a", number(p.loss_a)},
                             {"loss_b", number(p.loss_b)},
                             {"scale_a", number(p.scale_a)},
                             {"scale_b", number(p.scale_b)},
                             {"skipped_a", p.skipped_a},
                             {"skipped_b", p.skipped_b},
                             {"rel", number(p.rel)}});
  doc["first_loss_divergence"] = d.first_loss_divergence ? json(*d.first_loss_divergence) : json(nullptr);
  doc["first_divergence"] = json(nullptr);
  if (d.first_divergence) {
    doc["first_divergence"] = op_diff_json(*d.first_divergence);
    doc["first_divergence"]["unpaired_before_a"] = d.first_divergence->unpaired_before_a;
    doc["first_divergence"]["unpaired_before_b"] = d.first_divergence->unpaired_before_b;
  }
  doc["first_grad_divergence"] = d.first_grad_divergence ? grad_diff_json(*d.first_grad_divergence) : json(nullptr);
  doc["largest"] = json::array();
  for (const OpDiff& o : d.largest) doc["largest"].push_back(op_diff_json(o));
  doc["dtype_differences"] = json::array();
  for (const DtypeDifference& x : d.dtype_differences)
    doc["dtype_differences"].push_back({{"phase", std::string(trace::phase_name(x.phase))},
                                        {"module", x.module},
                                        {"op", x.op},
                                        {"dtypes_a", x.dtypes_a},
                                        {"dtypes_b", x.dtypes_b},
                                        {"count", x.count},
                                        {"first_step", x.first_step}});
  doc["different_tensors"] = json::array();
  for (const DifferentTensors& x : d.different_tensors)
    doc["different_tensors"].push_back({{"phase", std::string(trace::phase_name(x.phase))},
                                        {"module", x.module},
                                        {"op", x.op},
                                        {"shape_a", x.shape_a},
                                        {"shape_b", x.shape_b},
                                        {"count", x.count},
                                        {"first_step", x.first_step}});
  doc["only_in_a"] = unmatched_json(d.only_in_a);
  doc["only_in_b"] = unmatched_json(d.only_in_b);
  doc["steps_only_in_a"] = d.steps_only_in_a;
  doc["steps_only_in_b"] = d.steps_only_in_b;
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace ampscope::analysis
