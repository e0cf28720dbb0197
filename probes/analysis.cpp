#include "probes/analysis.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "probes/f16_ranges.h"

namespace ampscope::analysis {
namespace {

using trace::EventRow;
using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

// masked_fill writes -inf on purpose (a causal mask): only its NaN and +inf are anomalies.
std::int64_t non_finite(const OpRow& r) {
  const std::int64_t neg = (r.phase == Phase::forward && r.op == "masked_fill") ? 0 : r.health.neg_inf;
  return r.health.nan + r.health.pos_inf + neg;
}

std::string counts_text(const trace::TensorHealth& h) {
  std::vector<std::string> parts;
  if (h.nan > 0) parts.push_back(fmt::format("{} NaN", h.nan));
  if (h.pos_inf > 0) parts.push_back(fmt::format("{} +inf", h.pos_inf));
  if (h.neg_inf > 0) parts.push_back(fmt::format("{} -inf", h.neg_inf));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string place(const OpRow& r) {
  std::string s = r.phase == Phase::backward ? fmt::format("the backward of {}", r.op) : r.op;
  return r.module.empty() ? s + " (outside any module)" : fmt::format("{} in {}", s, r.module);
}

bool is_log(const std::string& op) { return op == "log" || op == "log2" || op == "log10"; }

// A wildcard over numbered children ("blocks.0.attn" -> "blocks.*.attn") for the same layer in every block.
std::string wildcard(const std::string& module) {
  std::string out, part;
  bool changed = false;
  auto flush = [&] {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!out.empty()) out += '.';
    out += digits ? "*" : part;
    changed |= digits;
    part.clear();
  };
  for (char c : module) {
    if (c == '.') flush(); else part += c;
  }
  flush();
  return changed ? out : "";
}

std::string cause_of(const OpRow& r) {
  const auto& h = r.health;
  const bool inf = h.pos_inf + h.neg_inf > 0;
  if (is_log(r.op) && (h.neg_inf > 0 || h.nan > 0)) return "log_of_zero";
  if (r.phase == Phase::backward) return "gradient_overflow";
  if (r.cast_overflow > 0) return "f16_overflow";
  if (r.op == "exp" && h.pos_inf > 0) return "exp_overflow";
  if ((r.op == "div" || r.op == "reciprocal" || r.op == "rsqrt") && inf) return "division_by_zero";
  if (inf && r.out_dtype == "f16") return "f16_overflow";
  if (!inf && h.nan > 0) return "invalid_operation";
  return "unknown";
}

std::string remedy_of(const Diagnosis& d, const OpRow& r) {
  const std::string pat = d.module.empty() ? autocast_pattern(d.op) : autocast_pattern(d.module);
  const std::string wild = wildcard(d.module);
  const std::string all = wild.empty() ? "" : fmt::format(" (every block: --autocast-fp32 '{}')", wild);
  if (d.cause == "log_of_zero")
    return "use log_softmax (or cross_entropy) instead of log(softmax(x)), or clamp before the log "
           "(clamp(p, 1e-8), a stopgap); --precision bf16 shows whether the failure is f16's range";
  if (d.cause == "exp_overflow")
    return fmt::format("subtract the max before exp, or run it in f32: --autocast-fp32 {}{}; or --precision bf16",
                       pat, all);
  if (d.cause == "division_by_zero")
    return fmt::format("add an epsilon to the denominator or mask the zero entries in {}; "
                       "or run it in f32: --autocast-fp32 {}",
                       d.module.empty() ? d.op : d.module, pat);
  if (d.cause == "invalid_operation")
    return fmt::format("mask with a finite value rather than the dtype's extreme (inf - inf and 0 * inf give NaN), "
                       "or run it in f32: --autocast-fp32 {}{}; or --precision bf16",
                       pat, all);
  if (d.cause == "f16_overflow") {
    if (r.cast_overflow > 0)
      return fmt::format("the input of {} is beyond f16's range before autocast's cast: rescale it (standardise "
                         "the data or activations feeding it{}), or run it in f32: --autocast-fp32 {}{}; or "
                         "--precision bf16. Raising or lowering the scale cannot fix a forward overflow",
                         place(r),
                         r.op == "softmax" || r.op == "log_softmax"
                             ? "; an additive mask: mask with a value that stays within f16 once the terms are "
                               "summed, not the dtype's minimum"
                             : "",
                         pat, all);
    return fmt::format("run it in f32: --autocast-fp32 {}{}; or train in bf16 (--precision bf16); or scale the "
                       "inputs down (or clamp) before the op; if the values grew during training, lower the "
                       "learning rate (--lr)",
                       pat, all);
  }
  if (d.cause == "gradient_overflow")
    return "lower the initial scale (--init-scale); an occasional overflow that the scaler skips and backs off "
           "is normal, a persistent one means the loss or the learning rate is too large (lower --lr)";
  if (d.cause == "accumulating_gradients")
    return "clear gradients every step (optimizer.zero_grad()), or every accumulation window when accumulating "
           "on purpose";
  if (d.cause == "nonfinite_input")
    return "check the data: the batch already held NaN or inf before the first op (filter or clean it)";
  return "compare with an fp32 run of the same seed (--precision fp32) to see whether the failure is the precision's";
}

struct Key {
  std::string op, module, cause;
  Phase phase;
  bool operator<(const Key& o) const {
    return std::tie(op, module, cause, phase) < std::tie(o.op, o.module, o.cause, o.phase);
  }
};

struct WarningKey {
  std::string kind, module, op, tensor;
  Phase phase;
  bool operator<(const WarningKey& o) const {
    return std::tie(kind, module, op, tensor, phase) < std::tie(o.kind, o.module, o.op, o.tensor, o.phase);
  }
};

// What the rules need to remember of a step once its rows are gone.
struct StepFacts {
  bool has_ops = false;
  bool nonfinite = false;  // some op output held NaN/inf (masked_fill's -inf aside)
  bool origin = false;
  int grad_state = -1;     // -1 no gradient rows, 1 every gradient exactly zero, 0 otherwise
};

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

bool is_low(const std::string& dtype) { return dtype == "f16" || dtype == "bf16"; }

// A warning about the output of op row r.
HeadroomWarning warning_at(const char* kind, const OpRow& r) {
  HeadroomWarning w;
  w.kind = kind;
  w.step = r.step;
  w.seq = r.seq;
  w.phase = r.phase;
  w.module = r.module;
  w.op = r.op;
  w.tensor = "output";
  w.dtype = r.out_dtype;
  return w;
}

std::string fraction_text(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

}  // namespace

std::string autocast_pattern(const std::string& module) { return "'" + module + "'"; }

struct Analyser::State {
  AnalysisOptions options;
  Report rep;
  std::vector<StepRow> steps;
  std::map<std::int64_t, StepFacts> facts;
  std::map<Key, std::size_t> index;
  std::map<WarningKey, std::size_t> warning_index;
  std::set<std::string> params;                // every parameter with a gradient row
  std::int64_t last_step = std::numeric_limits<std::int64_t>::min();
  bool any_nonfinite = false;

  // The forward ops of the last few steps (absmax of their finite outputs), for "the values grew" evidence.
  struct Seen {
    std::string module, op;
    double absmax;
  };
  static constexpr std::size_t kRecentSteps = 4;
  std::deque<std::pair<std::int64_t, std::vector<Seen>>> recent;
  std::map<std::int64_t, double> lr_of;

  // The absmax of the k-th (module, op) forward row in each recent step where it was finite.
  std::vector<std::pair<std::int64_t, double>> history(const OpRow& r, std::span<const OpRow> ops) const {
    std::int64_t k = 0;
    for (const OpRow& o : ops)
      if (&o != &r && o.seq < r.seq && o.phase == r.phase && o.op == r.op && o.module == r.module) ++k;
    std::vector<std::pair<std::int64_t, double>> out;
    for (const auto& [step, seen] : recent) {
      std::int64_t i = 0;
      for (const Seen& x : seen) {
        if (x.op != r.op || x.module != r.module) continue;
        if (i++ == k) {
          if (std::isfinite(x.absmax)) out.emplace_back(step, x.absmax);
          break;
        }
      }
    }
    return out;
  }

  void remember(std::int64_t step, std::span<const OpRow> ops) {
    std::vector<Seen> seen;
    seen.reserve(ops.size());
    for (const OpRow& o : ops)
      if (o.phase == Phase::forward)
        seen.push_back({o.module, o.op, non_finite(o) == 0 ? o.health.absmax : std::nan("")});
    recent.emplace_back(step, std::move(seen));
    if (recent.size() > kRecentSteps) recent.pop_front();
  }
  bool finished = false;

  // A step that was not skipped although its gradients were non-finite (no scaler to catch them): the
  // optimizer wrote NaN/inf into the weights, so later steps are non-finite from their first op without any
  // origin. Those steps follow from the diagnosis of that step; they are not non-finite input data.
  struct Applied {
    std::int64_t step = -1;  // the first such step, -1 when none
    double scale = 1;
    std::int64_t later_steps = 0, first_later = -1, last_later = -1;
    std::string first_op;    // the first non-finite op of the first later step
  } applied;

  // Adds a diagnosis or counts a recurrence of one already seen.
  void add(Diagnosis d, std::int64_t step, bool* was_new = nullptr) {
    Key k{d.op, d.module, d.cause, d.phase};
    auto found = index.find(k);
    if (found != index.end()) {
      Diagnosis& first = rep.anomalies[found->second];
      if (step != first.last_step) ++first.occurrences;
      first.last_step = std::max(first.last_step, step);
      if (was_new) *was_new = false;
      return;
    }
    d.last_step = step;
    index.emplace(k, rep.anomalies.size());
    rep.anomalies.push_back(std::move(d));
    if (was_new) *was_new = true;
  }
  bool seen(const Diagnosis& d) const { return index.count(Key{d.op, d.module, d.cause, d.phase}) > 0; }

  void warn(HeadroomWarning w) {
    WarningKey k{w.kind, w.module, w.op, w.tensor, w.phase};
    auto found = warning_index.find(k);
    if (found != warning_index.end()) {
      HeadroomWarning& first = rep.warnings[found->second];
      if (w.step != first.last_step) ++first.occurrences;
      first.last_step = std::max(first.last_step, w.step);
      return;
    }
    w.last_step = w.step;
    warning_index.emplace(k, rep.warnings.size());
    rep.warnings.push_back(std::move(w));
  }

  // Propagation within the step: later non-finite ops, the loss, the gradients.
  void propagation(Diagnosis& d, std::span<const OpRow> ops, const OpRow* origin, const StepRow* step_row,
                   std::span<const GradRow> grads) {
    for (const OpRow& o : ops) {
      if (origin != nullptr && o.seq <= origin->seq) continue;
      if (&o != origin && !o.origin && non_finite(o) > 0) ++d.downstream_nonfinite;
    }
    d.loss_nonfinite = step_row != nullptr && !std::isfinite(step_row->loss);
    std::set<std::string> seen_params;
    for (const GradRow& g : grads)
      if (g.nan + g.pos_inf + g.neg_inf > 0 && seen_params.insert(g.param).second) d.gradients.push_back(g.param);
  }

  void origins(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row, std::span<const GradRow> grads,
               std::span<const EventRow> events) {
    for (const OpRow& r : ops) {
      if (!r.origin) continue;
      Diagnosis d;
      d.step = r.step;
      d.seq = r.seq;
      d.phase = r.phase;
      d.module = r.module;
      d.op = r.op;
      d.in_dtypes = r.in_dtypes;
      d.out_dtype = r.out_dtype;
      d.autocast = r.autocast;
      d.cause = cause_of(r);
      if (seen(d)) {
        add(std::move(d), step);
        continue;
      }
      const auto& h = r.health;
      if (non_finite(r) > 0)
        d.evidence.push_back(fmt::format("{} of {} values in the {} {} output of {} at step {} (inputs finite)",
                                         counts_text(h), h.numel, r.out_dtype, r.shape, place(r), r.step));
      else  // the row's statistics are those of the first output; another output (a weight's gradient) held them
        d.evidence.push_back(fmt::format("non-finite values in an output of {} at step {} other than its first "
                                         "({} {}), from finite inputs",
                                         place(r), r.step, r.out_dtype, r.shape));
      if (r.cast_overflow > 0)
        d.evidence.push_back(fmt::format("{} finite value{} overflowed on the cast to {} (largest finite f16 {})",
                                         r.cast_overflow, r.cast_overflow == 1 ? "" : "s", r.out_dtype, kF16Max));
      // With a cast overflow the inf entered through the input: the finite values say nothing about 65504.
      if (h.pos_inf + h.neg_inf > 0 && r.out_dtype == "f16" && std::isfinite(h.absmax) && r.cast_overflow == 0)
        d.evidence.push_back(fmt::format("output absmax of the finite values {:.6g}; the results beyond f16 max {} "
                                         "became inf",
                                         h.absmax, kF16Max));
      if (d.cause == "log_of_zero") {
        // The op before the log in the same phase produced its input: its zeros are the log's -inf.
        const OpRow* before = nullptr;
        for (const OpRow& o : ops)
          if (o.phase == r.phase && o.seq < r.seq && (before == nullptr || o.seq > before->seq)) before = &o;
        if (before != nullptr)
          d.evidence.push_back(fmt::format("min of log input = {:.6g}: the output of {} ({}) holds {} exact zero{}",
                                           before->health.min, before->op, before->out_dtype, before->health.zero,
                                           before->health.zero == 1 ? "" : "s"));
      }
      for (const EventRow& e : events) {
        if (e.step == r.step && e.seq == r.seq && (e.kind == "origin" || e.kind == "cast_overflow"))
          d.evidence.push_back(fmt::format("probe ({}): {}", e.kind, e.detail));
      }
      propagation(d, ops, &r, step_row, grads);
      d.remedy = remedy_of(d, r);
      if (d.cause == "f16_overflow" && r.cast_overflow == 0 && r.phase == Phase::forward) grown(d, r, ops);
      add(std::move(d), step);
    }
  }

  // An output that was finite in the steps before and grew past f16's range: the weights grew, so the
  // learning rate is the first suspect (a jump in one step: far too high; a steady climb: too high for f16).
  void grown(Diagnosis& d, const OpRow& r, std::span<const OpRow> ops) {
    const auto h = history(r, ops);
    if (h.empty() || h.front().second * 4 > kF16Max) return;
    std::vector<std::string> points;
    for (const auto& [step, absmax] : h) points.push_back(fmt::format("{:.4g} (step {})", absmax, step));
    d.evidence.push_back(fmt::format("the same output's absmax before: {}; then beyond {} at step {}: it grew "
                                     "{:.3g}x as the weights trained",
                                     fmt::join(points, ", "), kF16Max, r.step, kF16Max / h.front().second));
    auto lr = lr_of.find(h.back().first);
    const std::string lr_text = lr == lr_of.end() ? "" : fmt::format(", this run: {:.4g}", lr->second);
    const std::string pat = d.module.empty() ? autocast_pattern(d.op) : autocast_pattern(d.module);
    if (h.size() == 1)
      d.remedy = fmt::format("lower the learning rate (--lr{}) or add warm-up: one optimizer step took this output "
                             "from {:.4g} past f16's range; keeping it in f32 (--autocast-fp32 {}) or bf16 only "
                             "trades the inf for a diverging loss",
                             lr_text, h.front().second, pat);
    else
      d.remedy = fmt::format("keep it in f32 (--autocast-fp32 {}) or train in bf16 (--precision bf16); the output "
                             "climbed step after step, so also lower the learning rate (--lr{}) or regularise "
                             "(weight decay); clamping to f16's range is a stopgap that hides the growth",
                             pat, lr_text);
  }

  // Non-finite forward outputs in a step without origin: the data were non-finite before the first op.
  void nonfinite_input(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
                       std::span<const GradRow> grads) {
    const OpRow* first = nullptr;
    for (const OpRow& o : ops)
      if (o.phase == Phase::forward && non_finite(o) > 0 && (first == nullptr || o.seq < first->seq)) first = &o;
    if (first == nullptr) return;
    Diagnosis d;
    d.step = step;
    d.seq = first->seq;
    d.phase = first->phase;
    d.module = first->module;
    d.op = first->op;
    d.in_dtypes = first->in_dtypes;
    d.out_dtype = first->out_dtype;
    d.autocast = first->autocast;
    d.cause = "nonfinite_input";
    if (seen(d)) {
      add(std::move(d), step);
      return;
    }
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}, and no op of the step produced them from "
                                     "finite inputs: its input already held them",
                                     counts_text(first->health), place(*first), step));
    propagation(d, ops, first, step_row, grads);
    d.remedy = remedy_of(d, *first);
    add(std::move(d), step);
  }

  void headroom(std::span<const OpRow> ops, std::span<const GradRow> grads, std::span<const trace::HistogramRow> hists) {
    const bool f16_run = rep.run.precision == "fp16";
    const double factor = options.headroom_factor, frac = options.underflow_fraction;
    for (const OpRow& r : ops) {
      const auto& h = r.health;
      if (h.numel <= 0) continue;
      // Close to f16's largest value, still finite, in an f16 output. (f32 outputs are left alone: the
      // scaled loss and its gradient are large on purpose.)
      if (r.out_dtype == "f16" && non_finite(r) == 0 &&
          std::isfinite(h.absmax) && h.absmax * factor >= kF16Max) {
        HeadroomWarning w = warning_at("near_f16_max", r);
        w.absmax = h.absmax;
        w.message = fmt::format("absmax {:.6g} of the {} output of {} is within a factor {:.3g} of f16's max {} "
                                      "({:.3g}x headroom left)",
                                      h.absmax, r.out_dtype, place(r), factor, kF16Max, kF16Max / h.absmax);
        warn(std::move(w));
      }
      if (is_low(r.out_dtype) && h.subnormal > 0) {
        const double f = static_cast<double>(h.subnormal) / static_cast<double>(h.numel);
        if (f >= frac) {
          HeadroomWarning w = warning_at("subnormal", r);
          w.fraction = f;
          w.message = fmt::format("{} of {} values ({}) of the {} output of {} are subnormal: they keep few "
                                  "significant bits and are next to flushing to zero",
                                  h.subnormal, h.numel, fraction_text(f), r.out_dtype, place(r));
          warn(std::move(w));
        }
      }
      if (r.cast_underflow > 0) {
        const double f = static_cast<double>(r.cast_underflow) / static_cast<double>(h.numel);
        if (f >= frac) {
          HeadroomWarning w = warning_at("flush_to_zero", r);
          w.fraction = f;
          w.message = fmt::format("{} of {} values ({}) became 0 on the cast to {} in {}", r.cast_underflow, h.numel,
                                  fraction_text(f), r.out_dtype, place(r));
          warn(std::move(w));
        }
      }
    }
    for (const GradRow& g : grads) {
      if (g.dtype == "f16" && g.nan + g.pos_inf + g.neg_inf == 0 && std::isfinite(g.absmax) &&
          g.absmax * factor >= kF16Max) {
        HeadroomWarning w;
        w.kind = "near_f16_max";
        w.step = g.step;
        w.phase = Phase::backward;
        w.tensor = g.param;
        w.dtype = g.dtype;
        w.absmax = g.absmax;
        w.message = fmt::format("the gradient of {} reached absmax {:.6g}, within a factor {:.3g} of f16's max {}",
                                g.param, g.absmax, factor, kF16Max);
        warn(std::move(w));
      }
    }
    // At level full: values below f16's smallest subnormal (2^-24) flush to zero in f16, or round up to it.
    if (!f16_run) return;
    for (const trace::HistogramRow& hr : hists) {
      // f16's zones (probes/f16_ranges.h); the tensor's dtype says what its subnormal bin holds.
      std::string_view dtype;
      for (const OpRow& r : ops) if (hr.seq >= 0 && r.seq == hr.seq) dtype = r.out_dtype;
      for (const GradRow& g : grads) if (hr.seq < 0 && g.param == hr.tensor) dtype = g.dtype;
      const half_ranges::ZoneCounts zones = half_ranges::f16_zone_counts(hr, dtype);
      const std::int64_t below = zones.below_f16(), nonzero = zones.nonzero_finite();
      if (nonzero == 0 || below == 0) continue;
      const double f = static_cast<double>(below) / static_cast<double>(nonzero);
      if (f < frac) continue;
      const OpRow* op = nullptr;
      if (hr.seq >= 0)
        for (const OpRow& r : ops)
          if (r.seq == hr.seq) op = &r;
      if (op != nullptr && op->out_dtype == "f16") continue;  // an f16 tensor shows this as subnormal/zero
      HeadroomWarning w;
      if (op != nullptr) w = warning_at("below_f16", *op);
      w.kind = "below_f16";
      w.step = hr.step;
      w.seq = hr.seq;
      if (op == nullptr) w.phase = Phase::backward;
      w.tensor = hr.tensor;
      w.fraction = f;
      w.message = op != nullptr
                      ? fmt::format("{} of {} non-zero values ({}) of the output of {} are below 2^-24, f16's smallest "
                                    "subnormal: in f16 they would flush to 0 (or, just under it, round up to 2^-24)",
                                    below, nonzero, fraction_text(f), place(*op))
                      : fmt::format("{} of {} non-zero values ({}) of the gradient of {} are below 2^-24, f16's "
                                    "smallest subnormal: in f16 they would flush to 0 (or, just under it, round up to 2^-24)",
                                    below, nonzero, fraction_text(f), hr.tensor);
      warn(std::move(w));
    }
  }
};

Analyser::Analyser(AnalysisOptions options) : state_(std::make_unique<State>()) { state_->options = options; }
Analyser::~Analyser() = default;
Analyser::Analyser(Analyser&&) noexcept = default;
Analyser& Analyser::operator=(Analyser&&) noexcept = default;

void Analyser::set_run(const trace::RunInfo& run, std::string path, bool complete) {
  state_->rep.run = run;
  state_->rep.path = std::move(path);
  state_->rep.complete = complete;
}

void Analyser::add_step(std::int64_t step, const StepRow* step_row, std::span<const OpRow> ops,
                        std::span<const GradRow> grads, std::span<const EventRow> events,
                        std::span<const trace::HistogramRow> histograms) {
  State& st = *state_;
  if (st.finished) throw std::logic_error("Analyser::add_step after finish()");
  if (step <= st.last_step)
    throw std::invalid_argument(fmt::format("Analyser::add_step: step {} after step {}; steps must come in "
                                            "increasing order, each once",
                                            step, st.last_step));
  st.last_step = step;
  if (step_row != nullptr) st.steps.push_back(*step_row);
  st.rep.op_rows += static_cast<std::int64_t>(ops.size());
  st.rep.grad_rows += static_cast<std::int64_t>(grads.size());

  StepFacts& f = st.facts[step];
  f.has_ops = !ops.empty();
  for (const OpRow& r : ops) {
    f.origin |= r.origin;
    f.nonfinite |= non_finite(r) > 0;
  }
  st.any_nonfinite |= f.nonfinite;
  for (const GradRow& g : grads) {
    st.params.insert(g.param);
    const bool zero = g.norm == 0 && g.absmax == 0 && g.zero > 0;
    f.grad_state = (f.grad_state != 0 && zero) ? 1 : 0;
  }

  if (step_row != nullptr) st.lr_of[step] = step_row->lr;
  if (f.origin) {
    st.origins(step, ops, step_row, grads, events);
  } else if (f.nonfinite && st.applied.step >= 0 && !st.rep.anomalies.empty()) {
    auto& a = st.applied;
    if (a.first_later < 0) {
      const OpRow* first = nullptr;
      for (const OpRow& o : ops)
        if (non_finite(o) > 0 && (first == nullptr || o.seq < first->seq)) first = &o;
      a.first_later = step;
      if (first != nullptr) a.first_op = place(*first);
    }
    ++a.later_steps;
    a.last_later = step;
  } else if (f.nonfinite) {
    st.nonfinite_input(step, ops, step_row, grads);
  }
  if (st.applied.step < 0 && step_row != nullptr && !step_row->skipped) {
    bool nonfinite_grads = !std::isfinite(step_row->grad_norm);
    for (const GradRow& g : grads) nonfinite_grads |= g.nan + g.pos_inf + g.neg_inf > 0;
    if (nonfinite_grads) {
      st.applied.step = step;
      st.applied.scale = step_row->scale;
    }
  }
  st.headroom(ops, grads, histograms);
  st.remember(step, ops);
}

Report Analyser::finish() {
  State& st = *state_;
  if (st.finished) throw std::logic_error("Analyser::finish called twice");
  st.finished = true;
  Report& rep = st.rep;
  const std::vector<StepRow>& steps = st.steps;
  rep.steps = static_cast<std::int64_t>(std::max(steps.size(), st.facts.size()));

  // ---- scaler health ----
  ScalerHealth& sh = rep.scaler;
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
  {
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
    const std::int64_t interval = growth_interval_of(rep.run);
    const std::string trajectory = fmt::format("scale {} -> {} (min {}, max {})", sh.scale_start, sh.scale_end,
                                               sh.scale_min, sh.scale_max);
    const std::string skips = fmt::format("{} of {} steps skipped ({}), longest run {}", sh.skipped, n,
                                          fraction_text(sh.skip_rate), sh.longest_skip_run);
    if (!sh.used) {
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

  // Skipped steps whose ops are all finite, after the first origin: the scaler found inf in gradients no op
  // of the step produced, so the inf stayed in .grad: gradients are never cleared.
  std::vector<std::int64_t> stale;
  std::int64_t first_origin_step = -1;
  for (const auto& [step, f] : st.facts)
    if (f.origin) {
      first_origin_step = step;
      break;
    }
  if (first_origin_step >= 0) {
    for (const StepRow& s : steps) {
      auto f = st.facts.find(s.step);
      if (s.step > first_origin_step && s.skipped && f != st.facts.end() && !f->second.nonfinite && f->second.has_ops)
        stale.push_back(s.step);
    }
  }
  auto skipped_from = [&](std::int64_t step) {
    std::int64_t n = 0;
    for (const StepRow& s : steps) n += (s.step >= step && s.skipped) ? 1 : 0;
    return n;
  };
  for (Diagnosis& d : rep.anomalies) {
    d.skipped_steps = skipped_from(d.step);
    d.evidence.push_back(fmt::format("{} later op{} of step {} turned non-finite; the loss was {}; {} step{} "
                                     "skipped from step {} on",
                                     d.downstream_nonfinite, d.downstream_nonfinite == 1 ? "" : "s", d.step,
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
      d.remedy = "clear gradients every step (optimizer.zero_grad()), or every accumulation window when "
                 "accumulating on purpose";
    }
  }

  // Steps made non-finite by weights that an applied non-finite step corrupted: evidence of the diagnosis of
  // that step (or the last one before it), not diagnoses of their own.
  if (st.applied.later_steps > 0) {
    const auto& a = st.applied;
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
      cause->remedy += "; also never apply a step whose gradients are non-finite (the GradScaler skips it), so "
                       "one bad step cannot write NaN/inf into the weights";
    }
  }

  // ---- gradient underflow: nothing non-finite, and every gradient exactly zero at most steps ----
  std::int64_t grad_steps = 0, zero_steps = 0, first_zero = -1, last_grad_step = 0;
  for (const auto& [step, f] : st.facts) {
    if (f.grad_state < 0) continue;
    ++grad_steps;
    last_grad_step = step;
    if (f.grad_state == 1) {
      ++zero_steps;
      if (first_zero < 0) first_zero = step;
    }
  }
  if (!st.any_nonfinite && grad_steps > 0 && zero_steps * 2 > grad_steps) {
    Diagnosis d;
    d.step = first_zero;
    d.phase = Phase::backward;
    d.cause = "gradient_underflow";
    d.occurrences = zero_steps;
    d.evidence.push_back(fmt::format("every gradient ({} parameters: {}) is exactly 0 (norm 0, absmax 0) at {} of "
                                     "{} recorded steps, from step {}; no NaN or inf anywhere",
                                     st.params.size(), fmt::join(st.params, ", "), zero_steps, grad_steps, first_zero));
    if (!steps.empty())
      d.evidence.push_back(fmt::format("the loss went {:.6g} -> {:.6g}: no parameter moved", steps.front().loss,
                                       steps.back().loss));
    if (!sh.used) {
      d.evidence.push_back("the scale is 1 at every step: no loss scaler");
      d.remedy = "enable the GradScaler (ampscope train uses one by default in fp16), or raise the initial scale "
                 "(--init-scale), or train in bf16 (--precision bf16)";
    } else {
      d.evidence.push_back(fmt::format("the scale ran between {} and {}", sh.scale_min, sh.scale_max));
      d.remedy = "raise the initial scale (--init-scale) so the scaled gradients stay above f16's smallest "
                 "subnormal (2^-24), or train in bf16 (--precision bf16)";
    }
    d.gradients.assign(st.params.begin(), st.params.end());
    d.last_step = last_grad_step;
    rep.anomalies.push_back(std::move(d));
  }

  // ---- scale collapse: the scale fell below 1 while skipping ----
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
      d.skipped_steps = skipped_from(below->step);
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
        d.remedy = fmt::format("fix the recurring origin ({} in {}: {}); raising the initial scale or lowering the "
                               "minimum scale only delays the collapse",
                               recurring->op, recurring->module.empty() ? "no module" : recurring->module,
                               recurring->remedy);
      } else {
        d.remedy = "find the overflow the scaler keeps meeting (non-finite gradients every step); lower the "
                   "learning rate (--lr) or the initial scale (--init-scale)";
      }
      rep.anomalies.push_back(std::move(d));
    }
  }

  std::stable_sort(rep.anomalies.begin(), rep.anomalies.end(), [](const Diagnosis& a, const Diagnosis& b) {
    return std::tie(a.step, a.seq) < std::tie(b.step, b.seq);
  });
  std::stable_sort(rep.warnings.begin(), rep.warnings.end(), [](const HeadroomWarning& a, const HeadroomWarning& b) {
    return std::tie(a.step, a.seq) < std::tie(b.step, b.seq);
  });
  return std::move(rep);
}

namespace {

// Groups rows by step, moving them (the reader's blocks are large: no copy per row).
template <class Row>
std::map<std::int64_t, std::vector<Row>> by_step(std::vector<Row>&& rows) {
  std::map<std::int64_t, std::vector<Row>> out;
  for (Row& r : rows) out[r.step].push_back(std::move(r));
  return out;
}

// The same for rows the caller keeps (hand-built traces).
template <class Row>
std::map<std::int64_t, std::vector<Row>> by_step(const std::vector<Row>& rows) {
  return by_step(std::vector<Row>(rows));
}

template <class Row>
std::span<const Row> rows_of(const std::map<std::int64_t, std::vector<Row>>& m, std::int64_t step) {
  auto it = m.find(step);
  return it == m.end() ? std::span<const Row>{} : std::span<const Row>(it->second);
}

void feed(Analyser& a, const std::map<std::int64_t, const StepRow*>& step_rows,
          std::map<std::int64_t, std::vector<OpRow>>& ops, const std::map<std::int64_t, std::vector<GradRow>>& grads,
          const std::map<std::int64_t, std::vector<EventRow>>& events,
          const std::map<std::int64_t, std::vector<trace::HistogramRow>>& hists, std::int64_t begin, std::int64_t end) {
  std::set<std::int64_t> all;
  for (const auto& [s, _] : step_rows) if (s >= begin && s < end) all.insert(s);
  for (const auto& [s, _] : ops) all.insert(s);
  for (const auto& [s, _] : grads) all.insert(s);
  for (const auto& [s, _] : events) all.insert(s);
  for (const auto& [s, _] : hists) all.insert(s);
  for (std::int64_t s : all) {
    auto row = step_rows.find(s);
    // The rules read a step's ops in seq order; a file written in order is already sorted.
    std::span<const OpRow> step_ops;
    if (auto it = ops.find(s); it != ops.end()) {
      auto by_seq = [](const OpRow& x, const OpRow& y) { return x.seq < y.seq; };
      if (!std::is_sorted(it->second.begin(), it->second.end(), by_seq))
        std::stable_sort(it->second.begin(), it->second.end(), by_seq);
      step_ops = it->second;
    }
    a.add_step(s, row == step_rows.end() ? nullptr : row->second, step_ops, rows_of(grads, s), rows_of(events, s),
               rows_of(hists, s));
  }
}

}  // namespace

Report analyse(const std::vector<StepRow>& steps, const std::vector<OpRow>& ops, const std::vector<GradRow>& grads,
               const std::vector<EventRow>& events, const std::vector<trace::HistogramRow>& histograms,
               const AnalysisOptions& options) {
  Analyser a(options);
  std::map<std::int64_t, const StepRow*> step_rows;
  for (const StepRow& s : steps) step_rows[s.step] = &s;
  auto ops_by_step = by_step(ops);
  feed(a, step_rows, ops_by_step, by_step(grads), by_step(events), by_step(histograms), trace::kFirstStep,
       trace::kLastStep);
  return a.finish();
}

Report analyse(trace::TraceReader& reader, const AnalysisOptions& options, const Progress& progress) {
  Analyser a(options);
  a.set_run(reader.run_info(), reader.path().string(), reader.complete());
  const std::vector<StepRow> steps = reader.steps();
  const trace::RowCounts counts = reader.row_counts();
  std::map<std::int64_t, const StepRow*> step_rows;
  for (const StepRow& s : steps) step_rows[s.step] = &s;

  // Blocks of whole steps, about rows_per_read op rows each; the first block starts at the smallest step
  // number and the last one is open-ended, so rows of a step without a step row are read too.
  std::vector<std::int64_t> numbers;
  for (const auto& [s, _] : step_rows) numbers.push_back(s);
  // At least 1: a trace without steps (or without op rows) has nothing to divide by.
  const std::int64_t per_step = std::max<std::int64_t>(
      1, numbers.empty() ? counts.ops : counts.ops / static_cast<std::int64_t>(numbers.size()));
  const std::size_t block = static_cast<std::size_t>(std::max<std::int64_t>(1, options.rows_per_read / per_step));
  std::int64_t done = 0;
  for (std::size_t i = 0; i == 0 || i < numbers.size(); i += block) {
    const std::int64_t begin = i == 0 ? trace::kFirstStep : numbers[i];
    const std::int64_t end = i + block >= numbers.size() ? trace::kLastStep : numbers[i + block];
    std::map<std::int64_t, const StepRow*> rows_here;
    for (auto it = step_rows.lower_bound(begin); it != step_rows.end() && it->first < end; ++it) rows_here.insert(*it);
    auto ops = by_step(reader.ops(begin, end));
    for (const auto& [_, v] : ops) done += static_cast<std::int64_t>(v.size());
    feed(a, rows_here, ops, by_step(reader.grads(begin, end)), by_step(reader.events(begin, end)),
         by_step(reader.histograms(begin, end)), begin, end);
    if (progress) progress(done, counts.ops);
    if (numbers.empty()) break;
  }
  return a.finish();
}

}  // namespace ampscope::analysis
