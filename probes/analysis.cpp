#include "probes/analysis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
                         "the data or activations feeding it), or run it in f32: --autocast-fp32 {}; or "
                         "--precision bf16. Raising or lowering the scale cannot fix a forward overflow",
                         d.module.empty() ? d.op : d.module, pat);
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

}  // namespace

std::string autocast_pattern(const std::string& module) { return "'" + module + "'"; }

Report analyse(const std::vector<StepRow>& steps, const std::vector<OpRow>& ops, const std::vector<GradRow>& grads,
               const std::vector<EventRow>& events, const std::vector<trace::HistogramRow>&, const AnalysisOptions&) {
  Report rep;

  // ---- scaler health ----
  ScalerHealth& sh = rep.scaler;
  sh.steps = static_cast<std::int64_t>(steps.size());
  std::int64_t run = 0;
  std::map<std::int64_t, const StepRow*> step_of;
  for (const StepRow& s : steps) {
    step_of[s.step] = &s;
    if (s.scale != 1 || s.scale_after != 1) sh.used = true;
    if (s.skipped) {
      ++sh.skipped;
      sh.longest_skip_run = std::max(sh.longest_skip_run, ++run);
    } else {
      run = 0;
    }
  }
  if (!steps.empty()) {
    sh.scale_start = steps.front().scale;
    sh.scale_end = steps.back().scale_after;
    sh.scale_min = sh.scale_max = sh.scale_start;
    for (const StepRow& s : steps) {
      sh.scale_min = std::min({sh.scale_min, s.scale, s.scale_after});
      sh.scale_max = std::max({sh.scale_max, s.scale, s.scale_after});
    }
  }
  auto skipped_from = [&](std::int64_t step) {
    std::int64_t n = 0;
    for (const StepRow& s : steps) n += (s.step >= step && s.skipped) ? 1 : 0;
    return n;
  };

  // ---- per-step summaries ----
  std::map<std::int64_t, std::vector<const OpRow*>> ops_of;
  for (const OpRow& r : ops) ops_of[r.step].push_back(&r);
  std::set<std::int64_t> steps_with_origin, steps_with_nonfinite;
  for (const OpRow& r : ops) {
    if (r.origin) steps_with_origin.insert(r.step);
    if (non_finite(r) > 0) steps_with_nonfinite.insert(r.step);
  }

  std::map<Key, std::size_t> index;
  auto add = [&](Diagnosis d, std::int64_t step) {
    Key k{d.op, d.module, d.cause, d.phase};
    auto found = index.find(k);
    if (found != index.end()) {
      Diagnosis& first = rep.anomalies[found->second];
      if (step != first.last_step) ++first.occurrences;
      first.last_step = std::max(first.last_step, step);
      return;
    }
    d.last_step = step;
    index.emplace(k, rep.anomalies.size());
    rep.anomalies.push_back(std::move(d));
  };

  auto fill_propagation = [&](Diagnosis& d, const OpRow* origin) {
    for (const OpRow* o : ops_of[d.step]) {
      if (origin != nullptr && o->seq <= origin->seq) continue;
      if (o != origin && !o->origin && non_finite(*o) > 0) ++d.downstream_nonfinite;
    }
    auto s = step_of.find(d.step);
    if (s != step_of.end()) d.loss_nonfinite = !std::isfinite(s->second->loss);
    std::set<std::string> seen;
    for (const GradRow& g : grads) {
      if (g.step == d.step && g.nan + g.pos_inf + g.neg_inf > 0 && seen.insert(g.param).second)
        d.gradients.push_back(g.param);
    }
    d.skipped_steps = skipped_from(d.step);
    d.evidence.push_back(fmt::format("{} later op{} of step {} turned non-finite; the loss was {}; {} step{} "
                                     "skipped from step {} on",
                                     d.downstream_nonfinite, d.downstream_nonfinite == 1 ? "" : "s", d.step,
                                     d.loss_nonfinite ? "non-finite" : "finite", d.skipped_steps,
                                     d.skipped_steps == 1 ? "" : "s", d.step));
  };

  // Skipped steps whose ops are all finite: the scaler found inf in gradients no op of the step produced.
  std::vector<std::int64_t> stale;
  const std::int64_t first_origin_step = steps_with_origin.empty() ? -1 : *steps_with_origin.begin();
  if (first_origin_step >= 0) {
    for (const StepRow& s : steps) {
      if (s.step > first_origin_step && s.skipped && !steps_with_nonfinite.count(s.step) && !ops_of[s.step].empty())
        stale.push_back(s.step);
    }
  }

  // ---- origins ----
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
    if (d.cause == "gradient_overflow" && stale.size() >= 2) d.cause = "accumulating_gradients";
    Key k{d.op, d.module, d.cause, d.phase};
    if (index.count(k)) {
      add(std::move(d), r.step);
      continue;
    }
    const auto& h = r.health;
    d.evidence.push_back(fmt::format("{} of {} values in the {} {} output of {} at step {} (inputs finite)",
                                     counts_text(h), h.numel, r.out_dtype, r.shape, place(r), r.step));
    if (r.cast_overflow > 0)
      d.evidence.push_back(fmt::format("{} finite value{} overflowed on the cast to {} (largest finite f16 {})",
                                       r.cast_overflow, r.cast_overflow == 1 ? "" : "s", r.out_dtype, kF16Max));
    if (h.pos_inf + h.neg_inf > 0 && r.out_dtype == "f16" && std::isfinite(h.absmax))
      d.evidence.push_back(fmt::format("output absmax of the finite values {:.6g}; beyond f16 max {} became inf",
                                       h.absmax, kF16Max));
    if (d.cause == "log_of_zero") {
      // The op before the log in the same step produced its input: its zeros are the log's -inf.
      const OpRow* before = nullptr;
      for (const OpRow* o : ops_of[r.step])
        if (o->phase == r.phase && o->seq < r.seq && (before == nullptr || o->seq > before->seq)) before = o;
      if (before != nullptr)
        d.evidence.push_back(fmt::format("min of log input = {:.6g}: the output of {} ({}) holds {} exact zero{}",
                                         before->health.min, before->op, before->out_dtype, before->health.zero,
                                         before->health.zero == 1 ? "" : "s"));
    }
    for (const EventRow& e : events) {
      if (e.step == r.step && e.seq == r.seq && (e.kind == "origin" || e.kind == "cast_overflow"))
        d.evidence.push_back(fmt::format("probe ({}): {}", e.kind, e.detail));
    }
    if (d.cause == "accumulating_gradients") {
      d.evidence.push_back(fmt::format("{} later skipped step{} (first {}) had no non-finite op: the inf stayed in "
                                       ".grad, so gradients are never cleared",
                                       stale.size(), stale.size() == 1 ? "" : "s", stale.front()));
      std::vector<std::string> norms;
      for (const StepRow& s : steps)
        if (s.step <= r.step) norms.push_back(fmt::format("{:.4g}", s.grad_norm));
      d.evidence.push_back(fmt::format("grad_norm up to step {}: {}", r.step, fmt::join(norms, ", ")));
    }
    fill_propagation(d, &r);
    d.remedy = remedy_of(d, r);
    add(std::move(d), r.step);
  }

  // ---- non-finite input data: non-finite forward outputs in a step without origin ----
  for (const auto& [step, rows] : ops_of) {
    if (steps_with_origin.count(step) || !steps_with_nonfinite.count(step)) continue;
    const OpRow* first = nullptr;
    for (const OpRow* o : rows)
      if (o->phase == Phase::forward && non_finite(*o) > 0 && (first == nullptr || o->seq < first->seq)) first = o;
    if (first == nullptr) continue;
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
    if (index.count(Key{d.op, d.module, d.cause, d.phase})) {
      add(std::move(d), step);
      continue;
    }
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}, and no op of the step produced them from "
                                     "finite inputs: its input already held them",
                                     counts_text(first->health), place(*first), step));
    fill_propagation(d, first);
    d.remedy = remedy_of(d, *first);
    add(std::move(d), step);
  }

  // ---- gradient underflow: nothing non-finite, and every gradient exactly zero ----
  if (steps_with_nonfinite.empty() && !grads.empty()) {
    std::map<std::int64_t, bool> all_zero;
    std::set<std::string> params;
    for (const GradRow& g : grads) {
      params.insert(g.param);
      const bool zero = g.norm == 0 && g.absmax == 0 && g.zero > 0;
      auto [it, inserted] = all_zero.emplace(g.step, zero);
      if (!inserted) it->second = it->second && zero;
    }
    std::int64_t zero_steps = 0, first_step = -1;
    for (const auto& [step, z] : all_zero) {
      if (!z) continue;
      ++zero_steps;
      if (first_step < 0) first_step = step;
    }
    if (zero_steps * 2 > static_cast<std::int64_t>(all_zero.size())) {
      Diagnosis d;
      d.step = first_step;
      d.phase = Phase::backward;
      d.cause = "gradient_underflow";
      d.occurrences = zero_steps;
      d.evidence.push_back(fmt::format("every gradient ({} parameters: {}) is exactly 0 (norm 0, absmax 0) at {} of "
                                       "{} recorded steps, from step {}; no NaN or inf anywhere",
                                       params.size(), fmt::join(params, ", "), zero_steps, all_zero.size(),
                                       first_step));
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
      d.gradients.assign(params.begin(), params.end());
      d.last_step = all_zero.rbegin()->first;
      index.emplace(Key{"", "", d.cause, d.phase}, rep.anomalies.size());
      rep.anomalies.push_back(std::move(d));
    }
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
      d.skipped_steps = sh.skipped;
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
  return rep;
}

Report analyse(trace::TraceReader& reader, const AnalysisOptions& options, const Progress&) {
  return analyse(reader.steps(), reader.ops(), reader.grads(), reader.events(), {}, options);
}

}  // namespace ampscope::analysis
