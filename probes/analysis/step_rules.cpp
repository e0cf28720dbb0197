// The rules of one step (Analyser::add_step): origins and their diagnoses, non-finite input, the values that
// grew, and the headroom warnings (probes/analysis/internal/analyser_state.h).
#include "probes/analysis/internal/analyser_state.h"

#include "probes/analysis/internal/provenance.h"
#include "probes/analysis/internal/remedies.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/f16_ranges.h"
#include "probes/analysis/op_traits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampscope::analysis {

using namespace detail;
using trace::EventRow;
using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

namespace {

std::string cause_of(const OpRow& r) {
  const auto& h = r.health;
  const bool inf = h.pos_inf + h.neg_inf > 0;
  if (op_has(r.op, OpFlag::logarithm) && (h.neg_inf > 0 || h.nan > 0)) return "log_of_zero";
  if (r.phase == Phase::backward) return "gradient_overflow";
  if (r.cast_overflow > 0) return "f16_overflow";
  if (op_has(r.op, OpFlag::exponential) && h.pos_inf > 0) return "exp_overflow";
  if (op_has(r.op, OpFlag::divides) && inf) return "division_by_zero";
  if (inf && r.out_dtype == "f16") return "f16_overflow";
  if (!inf && h.nan > 0) return "invalid_operation";
  return "unknown";
}

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

}  // namespace

// ---- the rules of one step (Analyser::add_step) ----

void Analyser::State::add(Diagnosis d, std::int64_t step, bool* was_new) {
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

void Analyser::State::warn(HeadroomWarning w) {
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

void Analyser::State::propagation(Diagnosis& d, std::span<const OpRow> ops, const OpRow* origin,
                                  const StepRow* step_row, std::span<const GradRow> grads) const {
  for (const OpRow& o : ops) {
    if (origin != nullptr && o.seq <= origin->seq) continue;
    if (&o != origin && !o.origin && non_finite(o) > 0) ++d.downstream_nonfinite;
  }
  d.loss_nonfinite = step_row != nullptr && !std::isfinite(step_row->loss);
  std::set<std::string> seen_params;
  for (const GradRow& g : grads)
    if (g.nan + g.pos_inf + g.neg_inf > 0 && seen_params.insert(g.param).second) d.gradients.push_back(g.param);
}

void Analyser::State::origins(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
                              std::span<const GradRow> grads, std::span<const EventRow> events, const SeqIndex& idx) {
  // A skipped step whose forward pass and loss are finite: its backward origins may be calibration.
  bool forward_finite = true;
  for (const OpRow& r : ops) forward_finite &= r.phase != Phase::forward || non_finite(r) == 0;
  const bool maybe_calibration = step_row != nullptr && step_row->skipped && std::isfinite(step_row->loss) &&
                                 forward_finite && step_row->scale != 1.0;
  bool damage_told = false;
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
    const bool deferred = maybe_calibration && r.phase == Phase::backward;
    if (!deferred && seen(d)) {
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
    if (d.cause == "f16_overflow" && h.pos_inf + h.neg_inf > 0 && r.out_dtype == "f16" && std::isfinite(h.absmax) &&
        r.cast_overflow == 0)
      d.evidence.push_back(fmt::format("output absmax of the finite values {:.6g}; the results beyond f16 max {} "
                                       "became inf",
                                       h.absmax, kF16Max));
    if (d.cause == "log_of_zero") {
      if (r.inputs[0] != trace::kInputUnknown) {
        // The provenance names the row that produced the log's input.
        if (const OpRow* in = producer_of(r, 0, idx))
          d.evidence.push_back(fmt::format("min of log input = {}: its input is the output of {}, which holds {} "
                                           "exact zero{} of {}",
                                           number(in->health.min), where_text(*in), in->health.zero,
                                           in->health.zero == 1 ? "" : "s", in->health.numel));
        else
          d.evidence.push_back(fmt::format("the log's input is not the output of a recorded op of this step ({})",
                                           trace::input_marker_name(r.inputs[0])));
      } else {
        // No provenance (format_version 1): the op before the log in the same phase is the best guess.
        const OpRow* before = nullptr;
        for (const OpRow& o : ops)
          if (o.phase == r.phase && o.seq < r.seq && (before == nullptr || o.seq > before->seq)) before = &o;
        if (before != nullptr)
          d.evidence.push_back(fmt::format("the op recorded just before the log, {} ({}), holds {} exact zero{} "
                                           "(min {}); this trace has no provenance, so that it is the log's input "
                                           "is a guess",
                                           before->op, before->out_dtype, before->health.zero,
                                           before->health.zero == 1 ? "" : "s", number(before->health.min)));
      }
    }
    for (const EventRow& e : events) {
      if (e.step == r.step && e.seq == r.seq && (e.kind == "origin" || e.kind == "cast_overflow"))
        d.evidence.push_back(fmt::format("probe ({}): {}", e.kind, e.detail));
    }
    root_walk(d, r, idx);
    std::optional<Amplification> amplification;
    if (d.chain.empty()) amplification = amplification_walk(d, r, idx, ops);
    if (amplification) {
      amplifier_growth(*amplification, ops);
      if (amplification->grew) d.chain.front().evidence += "; " + amplification->growth;
    }
    // NaN from a masked_fill's -inf (a fully masked row through softmax is 0 / 0 in every dtype).
    bool from_mask = false;
    for (std::size_t i = 0; i < trace::kOpInputs && d.cause == "invalid_operation"; ++i) {
      const OpRow* q = producer_of(r, i, idx);
      if (q != nullptr && op_has(q->op, OpFlag::mask_neg_inf) && q->health.neg_inf > 0) {
        from_mask = true;
        d.evidence.push_back(fmt::format("its input is the output of {}, which filled {} of {} values with -inf: "
                                         "a row masked everywhere is 0 / 0 in softmax, in any dtype",
                                         where_text(*q), q->health.neg_inf, q->health.numel));
      }
    }
    for (const ChainLink& l : d.chain)
      if (l.role != "origin") d.evidence.push_back(fmt::format("{}: {}", l.role, l.evidence));
    propagation(d, ops, &r, step_row, grads);
    if (!damage_told && r.phase == Phase::forward) {
      silent_damage(d, ops, idx, step_row);
      damage_told = true;
    }
    d.remedies = remedies_of(d, r, rep.run.precision, from_mask, amplification ? &*amplification : nullptr);
    if (d.cause == "f16_overflow" && r.cast_overflow == 0 && r.phase == Phase::forward) grown(d, r, ops);
    d.remedy = remedy_text(d.remedies);
    if (deferred) {
      d.evidence.push_back(fmt::format("the step's forward pass and loss ({}) were finite: only the scaled "
                                       "gradients overflowed",
                                       number(step_row->loss)));
      pending_calibration[step].push_back(std::move(d));
      continue;
    }
    add(std::move(d), step);
  }
}

// An output that was finite in the steps before and grew past f16's range: the weights grew, so the
// learning rate is the first suspect (a jump in one step: far too high; a steady climb: too high for f16).
void Analyser::State::grown(Diagnosis& d, const OpRow& r, std::span<const OpRow> ops) {
  const auto h = recent.history(r, ops);
  if (h.empty() || h.front().second * 4 > kF16Max) return;
  // Did the batch itself grow? The first op that reads the data (provenance) tells: when its output jumped
  // as much since the last step, the data, not the weights, carried the output past f16's range.
  const OpRow* entry = nullptr;
  for (const OpRow& o : ops) {
    if (o.phase != Phase::forward) continue;
    if (std::find(o.inputs.begin(), o.inputs.end(), trace::kInputData) != o.inputs.end()) {
      entry = &o;
      break;
    }
  }
  if (entry != nullptr && entry != &r && non_finite(*entry) == 0) {
    // Only when that op was steady over the steps before (the weights feeding it barely moved) and then
    // jumped with this batch: one earlier point cannot tell a larger batch from a large update.
    const auto eh = recent.history(*entry, ops);
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const auto& [_, a] : eh) {
      lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
    const bool steady = eh.size() >= 2 && lo > 0 && hi <= 1.5 * lo;
    if (steady && entry->health.absmax >= 2 * eh.back().second) {
      d.evidence.push_back(fmt::format("the batch was larger: {} on the data went from absmax {:.4g} (step {}) to "
                                       "{:.4g}, while this output went from {:.4g} past {}",
                                       where_text(*entry), eh.back().second, eh.back().first, entry->health.absmax,
                                       h.back().second, kF16Max));
      d.remedies.insert(d.remedies.begin(),
                        simple("rescale_input",
                               fmt::format("standardise the input data (this batch's values reach {:.4g}, {:.3g}x "
                                           "the last one's): f16 cannot hold what it produces in {}",
                                           entry->health.absmax, entry->health.absmax / eh.back().second, place(r)),
                               "", "x = div(sub(x, mean), std);  // per feature, with the training set's statistics"));
      return;
    }
  }
  std::vector<std::string> points;
  for (const auto& [step, absmax] : h) points.push_back(fmt::format("{:.4g} (step {})", absmax, step));
  d.evidence.push_back(fmt::format("the same output's absmax before: {}; then beyond {} at step {}: it grew "
                                   "{:.3g}x as the weights trained",
                                   fmt::join(points, ", "), kF16Max, r.step, kF16Max / h.front().second));
  auto lr = lr_of.find(h.back().first);
  Remedy lower = lr_remedy(lr == lr_of.end() ? std::nan("") : lr->second);
  // The root walk may have proposed the learning rate for the amplifier upstream already: one remedy, worded
  // for this output (which the steps before show), in the place this rule gives it.
  std::erase_if(d.remedies, [](const Remedy& m) { return m.kind == "learning_rate"; });
  if (h.size() == 1) {
    lower.text += fmt::format(": one optimizer step took this output from {:.4g} past f16's range; keeping it in "
                              "f32 or bf16 only trades the inf for a diverging loss",
                              h.front().second);
    d.remedies.insert(d.remedies.begin(), std::move(lower));
  } else {
    lower.text += ": the output climbed step after step (or regularise with weight decay); clamping to f16's range "
                  "is a stopgap that hides the growth";
    d.remedies.push_back(std::move(lower));
  }
}

// The amplifier's gain on the earliest recent step that recorded it and its input: grown at least twice since,
// what it multiplies by (its weights, a learned factor) grew as the run trained.
void Analyser::State::amplifier_growth(Amplification& a, std::span<const OpRow> ops) const {
  if (const auto lr = lr_of.find(a.op->step); lr != lr_of.end()) a.lr = lr->second;
  const auto out = recent.history(*a.op, ops), in = recent.history(*a.input, ops);
  for (const auto& [step, out_absmax] : out) {
    const auto at = std::find_if(in.begin(), in.end(), [&](const auto& x) { return x.first == step; });
    if (at == in.end() || !(at->second > 0)) continue;
    const double before = out_absmax / at->second;
    if (a.gain >= 2 * before) {
      a.grew = true;
      a.growth = fmt::format("its output's absmax was {:.3g}x its input's at step {} and {}{:.3g}x at step {}: what "
                             "it multiplies by (its weights, a learned factor) grew as the run trained",
                             before, step, a.overflowed ? "at least " : "", a.gain, a.op->step);
    }
    break;
  }
}

namespace {

// What could have carried non-finite values into `first`: its floating inputs that no recorded op of the step
// produced, parameters and data apart; the parameters' names from the step's /grads rows (the module's own:
// MODULE.NAME with no further dot), since an op row names its module, not its parameters.
struct WeightSuspects {
  bool parameter = false, data = false;
  std::vector<std::string> names;
};

WeightSuspects weight_suspects(const OpRow& first, std::span<const GradRow> grads) {
  WeightSuspects w;
  std::vector<std::string> dtypes;
  for (std::size_t at = 0; at <= first.in_dtypes.size();) {
    const std::size_t comma = std::min(first.in_dtypes.find(',', at), first.in_dtypes.size());
    dtypes.push_back(first.in_dtypes.substr(at, comma - at));
    at = comma + 1;
  }
  for (std::size_t i = 0; i < first.inputs.size(); ++i) {
    const std::int64_t in = first.inputs[i];
    if (in >= 0 || in == trace::kInputNone || in == trace::kInputUnrecorded) continue;
    // Integer inputs (token ids, indices, masks) hold no NaN or inf; an unknown dtype may.
    const std::string dtype = i < dtypes.size() ? dtypes[i] : std::string();
    const bool integral = !dtype.empty() && dtype != "f16" && dtype != "bf16" && dtype != "f32" && dtype != "f64" &&
                          dtype.rfind("f8", 0) != 0;
    if (integral) continue;
    (in == trace::kInputParameter ? w.parameter : w.data) = true;
  }
  if (!w.parameter) return w;
  const std::string prefix = first.module.empty() ? std::string() : first.module + ".";
  for (const GradRow& g : grads) {
    if (g.param.rfind(prefix, 0) != 0 || g.param.find('.', prefix.size()) != std::string::npos) continue;
    if (std::find(w.names.begin(), w.names.end(), g.param) == w.names.end()) w.names.push_back(g.param);
  }
  return w;
}

}  // namespace

// Non-finite forward outputs in a step without origin: the data (nonfinite_input), or the weights
// (nonfinite_weights), were non-finite before the first op.
void Analyser::State::nonfinite_input(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
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
  // Where its non-finite input came from, when the trace says: an op the probe did not record (a filter,
  // or sampling) is a hidden origin, neither bad data nor bad weights.
  // Otherwise, which inputs can have carried the non-finite values in: floating inputs that no recorded op of
  // this step produced (a recorded producer's output was finite: `first` is the first non-finite op). When
  // they are parameters only, the weights held NaN/inf before the step (weights loaded with
  // --model-allow-nonfinite, or damaged), not the data; when a parameter and data both could have, the run's
  // own record decides: a run that loaded its weights with --model-allow-nonfinite is told about its weights.
  bool hidden = false;
  for (std::int64_t in : first->inputs) hidden |= in == trace::kInputUnrecorded;
  const WeightSuspects weights = weight_suspects(*first, grads);
  const bool allowed_nonfinite_weights =
      rep.run.config.find("\"model_allow_nonfinite\":true") != std::string::npos;
  const bool blame_weights = !hidden && weights.parameter && (!weights.data || allowed_nonfinite_weights);
  d.cause = blame_weights ? "nonfinite_weights" : "nonfinite_input";
  if (seen(d)) {
    add(std::move(d), step);
    return;
  }
  if (hidden) {
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}: an input came from an op of this step that "
                                     "the probe did not record (filtered out by its op or module globs), so the "
                                     "origin is upstream of what this trace holds",
                                     counts_text(first->health), place(*first), step));
    d.remedies.push_back(simple("record_every_op",
                                "record every op (no op or module filter, every step) and run again: the origin is "
                                "in an op this trace does not hold",
                                "--probe health --sample-every 1",
                                "probe::ProbeOptions options;  // no .ops / .modules filter, .every = 1"));
  } else if (blame_weights) {
    const std::string names = weights.names.empty() ? std::string("its parameters")
                              : weights.names.size() == 1
                                  ? fmt::format("'{}'", weights.names[0])
                                  : fmt::format("one of '{}'", fmt::join(weights.names, "', '"));
    d.evidence.push_back(fmt::format(
        "{} in the output of {} at step {}, and no op of the step produced them from finite inputs: the weights "
        "already held them ({}, an input of {}){}{}",
        counts_text(first->health), place(*first), step, names, first->op,
        weights.data ? "; another input that no recorded op produced (data, or a view of a parameter such as its "
                       "transpose) may hold some too"
                     : "",
        allowed_nonfinite_weights ? "; the run loaded its --model weights with --model-allow-nonfinite, which "
                                    "accepts weights holding NaN or inf"
                                  : ""));
    d.remedies.push_back(simple(
        "finite_weights",
        fmt::format("the weights hold NaN or inf before any op runs: load finite weights (leave "
                    "--model-allow-nonfinite out to have the load name every such tensor), or re-initialise {}",
                    weights.names.empty() ? std::string("the module's parameters") : names),
        "",
        fmt::format("// before training: find and replace the non-finite parameter\n"
                    "for (auto& [name, p] : model.named_parameters()) if (!all_finite(p)) re-initialise p;  // {}",
                    weights.names.empty() ? place(*first) : weights.names[0])));
  } else {
    bool earlier = false;
    for (std::int64_t in : first->inputs) earlier |= in == trace::kInputOtherStep;
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}, and no op of the step produced them from "
                                     "finite inputs: its input already held them{}",
                                     counts_text(first->health), place(*first), step,
                                     earlier ? " (a tensor computed before this step: data prepared with ops "
                                               "before the loop, or kept from an earlier step)"
                                             : ""));
    d.remedies = remedies_of(d, *first, rep.run.precision);
  }
  propagation(d, ops, first, step_row, grads);
  d.remedy = remedy_text(d.remedies);
  add(std::move(d), step);
}

void Analyser::State::headroom(std::span<const OpRow> ops, std::span<const GradRow> grads,
                              std::span<const trace::HistogramRow> hists) {
  const bool f16_run = rep.run.precision == "fp16";
  const double factor = options.headroom_factor, frac = options.underflow_fraction;
  for (const OpRow& r : ops) {
    const auto& h = r.health;
    if (h.numel <= 0) continue;
    // Close to f16's largest value, still finite, in an f16 output. (f32 outputs are left alone: the
    // scaled loss and its gradient are large on purpose.) A mask's fill is not a warning: where and
    // masked_fill only copy values, and one whose largest magnitude is exactly f16's largest wrote the
    // dtype's extreme on purpose (Hugging Face's causal masks fill with finfo(f16).min = -65504); a copied
    // input near the limit is warned about at the op that computed it.
    const bool mask_fill = r.phase == Phase::forward && op_kind(r.op) == OpKind::mask_fill &&
                           h.absmax == kF16Max;
    if (r.out_dtype == "f16" && non_finite(r) == 0 && !mask_fill &&
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
    // f16's zones (probes/analysis/f16_ranges.h); the tensor's dtype says what its subnormal bin holds.
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

}  // namespace ampscope::analysis
