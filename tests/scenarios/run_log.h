// tests/scenarios/run_log.h: what a training run did, op by op, as the scenario tests read it: every
// forward op and backward node with the health of its output, the parameter gradients, the scaler's
// decisions and the step summaries, plus the anomaly rule the trace uses (an *origin* is an op whose
// output holds NaN or inf while its inputs, judged before autocast's casts, are finite).
//
//   RunLog log = run_logged(config);                // train(config) with a RunLogHook installed
//   const OpEntry* first = log.first_origin();      // step, op, scope, phase of the first anomaly
//
// The tests only read a RunLog, so the same assertions can later be fed from a trace read back from
// HDF5 (a `RunLog from_trace(path)` beside run_logged) without changing them.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/probe_hook.h"
#include "cli/run.h"

namespace ampscope::samples::testing {

// Counts over the elements of a tensor, read independently of the probe's statistics.
struct Health {
  std::int64_t numel = 0;
  std::int64_t nan = 0;
  std::int64_t pos_inf = 0;
  std::int64_t neg_inf = 0;
  std::int64_t zero = 0;
  double absmax = 0;  // of the finite values

  std::int64_t non_finite() const { return nan + pos_inf + neg_inf; }
};

inline Health health_of(const Tensor& t) {
  Health h;
  if (!t.defined() || !is_floating(t.dtype())) return h;
  for (double v : t.values()) {
    ++h.numel;
    if (std::isnan(v)) {
      ++h.nan;
    } else if (std::isinf(v)) {
      ++(v > 0 ? h.pos_inf : h.neg_inf);
    } else {
      if (v == 0) ++h.zero;
      h.absmax = std::max(h.absmax, std::fabs(v));
    }
  }
  return h;
}

struct OpEntry {
  std::int64_t step = -1;
  std::int64_t seq = -1;
  probe::Phase phase = probe::Phase::forward;
  std::string op;
  std::string scope;
  DType dtype = DType::f32;  // of the (first) output
  Health out;                // every output together (backward: the gradients of the inputs)
  bool inputs_finite = true;
  bool origin = false;       // non-finite output, finite inputs
  bool propagates = false;   // non-finite output, an input already non-finite

  std::string describe() const {
    return fmt::format("{} {} in '{}' at step {} (seq {}): {} NaN, {} +inf, {} -inf", probe::phase_name(phase), op,
                       scope, step, seq, out.nan, out.pos_inf, out.neg_inf);
  }
};

struct GradEntry {
  std::int64_t step = -1;
  bool unscaled = true;
  std::string name;
  Health health;
};

struct RunLog {
  std::vector<OpEntry> ops;
  std::vector<GradEntry> grads;
  std::vector<probe::ScalerEvent> scaler;
  std::vector<probe::StepSummary> steps;
  TrainResult result;

  // The first origin of the run (ops are logged in step and sequence order), or null.
  const OpEntry* first_origin() const {
    for (const OpEntry& e : ops) {
      if (e.origin) return &e;
    }
    return nullptr;
  }
  // The first op whose output held a NaN, or null.
  const OpEntry* first_nan() const {
    for (const OpEntry& e : ops) {
      if (e.out.nan > 0) return &e;
    }
    return nullptr;
  }
  std::int64_t origins() const {
    std::int64_t n = 0;
    for (const OpEntry& e : ops) n += e.origin ? 1 : 0;
    return n;
  }
  // Largest finite |value| of the outputs of `op` in `scope` during the forward pass of `step`.
  double forward_absmax(const std::string& op, const std::string& scope, std::int64_t step) const {
    double m = 0;
    for (const OpEntry& e : ops) {
      if (e.step == step && e.phase == probe::Phase::forward && e.op == op && e.scope == scope) {
        m = std::max(m, e.out.absmax);
      }
    }
    return m;
  }
  // The unscaled gradients of `step`.
  std::vector<const GradEntry*> unscaled_grads(std::int64_t step) const {
    std::vector<const GradEntry*> out;
    for (const GradEntry& g : grads) {
      if (g.step == step && g.unscaled) out.push_back(&g);
    }
    return out;
  }
};

// Logs every event of the run into a RunLog.
class RunLogHook : public probe::Hook {
 public:
  explicit RunLogHook(RunLog& log) : log_(log) {}

  void on_op(const probe::OpEvent& e) override { record(e); }
  void on_backward_op(const probe::OpEvent& e) override { record(e); }
  void on_grads(const probe::GradEvent& e) override {
    for (const auto& [name, grad] : e.grads) log_.grads.push_back({e.step, e.unscaled, name, health_of(grad)});
  }
  void on_scaler(const probe::ScalerEvent& e) override { log_.scaler.push_back(e); }
  void on_step_end(const probe::StepSummary& s) override { log_.steps.push_back(s); }

 private:
  void record(const probe::OpEvent& e) {
    OpEntry entry;
    entry.step = e.step;
    entry.seq = e.seq;
    entry.phase = e.phase;
    entry.op = std::string(e.op);
    entry.scope = e.scope;
    if (e.output.defined()) entry.dtype = e.output.dtype();
    for (const Tensor& out : e.outputs) {
      const Health h = health_of(out);
      entry.out.numel += h.numel;
      entry.out.nan += h.nan;
      entry.out.pos_inf += h.pos_inf;
      entry.out.neg_inf += h.neg_inf;
      entry.out.zero += h.zero;
      entry.out.absmax = std::max(entry.out.absmax, h.absmax);
    }
    for (std::size_t i = 0; i < e.inputs.size(); ++i) {
      Tensor t = e.inputs[i];
      // Judged before autocast's cast, as the trace does: an overflowing cast makes this op the origin.
      for (const probe::CastRecord& c : e.autocast.casts) {
        if (c.input == static_cast<int>(i) && c.source.defined()) t = c.source;
      }
      if (health_of(t).non_finite() > 0) entry.inputs_finite = false;
    }
    // masked_fill's -inf is the mask it was asked to write (the causal mask of every attention), not an
    // overflow: only NaN and +inf in its output count.
    const std::int64_t bad = (e.phase == probe::Phase::forward && e.op == "masked_fill")
                                 ? entry.out.nan + entry.out.pos_inf
                                 : entry.out.non_finite();
    entry.origin = bad > 0 && entry.inputs_finite;
    entry.propagates = bad > 0 && !entry.inputs_finite;
    log_.ops.push_back(std::move(entry));
  }

  RunLog& log_;
};

// train(config) with a RunLogHook installed for the run.
inline RunLog run_logged(const TrainConfig& config) {
  RunLog log;
  {
    probe::HookGuard guard(std::make_shared<RunLogHook>(log));
    log.result = train(config);
  }
  return log;
}

}  // namespace ampscope::samples::testing
