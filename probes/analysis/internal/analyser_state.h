// probes/analysis/internal/analyser_state.h: what the Analyser remembers across steps (Analyser::State) and the
// rules it runs, whose definitions are in step_rules.cpp (one step), scaler_health.cpp (calibration) and
// run_rules.cpp (the whole run). Internal to the analysis library (not installed: cmake/headers.cmake installs
// probes/*/*.h, not this folder).
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/analysis/internal/provenance.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/precision.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {
namespace detail {

using trace::OpRow;
using trace::Phase;

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

// ---- what the analyser remembers across steps ----

// The forward ops of the last few steps (absmax of their finite outputs), for "the values grew" evidence.
struct RecentOutputs {
  struct Seen {
    std::string module, op;
    double absmax;
  };
  static constexpr std::size_t kRecentSteps = 4;
  std::deque<std::pair<std::int64_t, std::vector<Seen>>> recent;

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
};

// The later steps that were non-finite from their first op, with no origin of their own.
struct LaterSteps {
  std::int64_t later_steps = 0, first_later = -1, last_later = -1;
  std::string first_op;    // the first non-finite op of the first later step
  void note(std::int64_t step, std::span<const OpRow> ops) {
    if (first_later < 0) {
      const OpRow* first = nullptr;
      for (const OpRow& o : ops)
        if (non_finite(o) > 0 && (first == nullptr || o.seq < first->seq)) first = &o;
      first_later = step;
      if (first != nullptr) first_op = place(*first);
    }
    ++later_steps;
    last_later = step;
  }
};

}  // namespace detail

struct Analyser::State {
  PrecisionAnalyser precision;
  AnalysisOptions options;
  Report rep;
  bool finished = false;
  std::int64_t last_step = std::numeric_limits<std::int64_t>::min();

  // What the steps so far left behind.
  std::vector<trace::StepRow> steps;
  std::map<std::int64_t, detail::StepFacts> facts;
  std::map<std::int64_t, double> lr_of;
  std::set<std::string> params;                // every parameter with a gradient row
  std::set<std::string> overrides_applied;     // globs of autocast overrides that decided some op's dtype
  // The (op, module) of forward rows outside any autocast region, kept when the probe recorded autocast
  // overrides (watch_outside): the coverage note on an override that decided nothing says why.
  bool watch_outside = false;
  std::set<std::pair<std::string, std::string>> outside_autocast;
  bool any_nonfinite = false;
  detail::RecentOutputs recent;

  // Diagnoses and warnings by key, to count a recurrence on the first one (add, warn).
  std::map<detail::Key, std::size_t> index;
  std::map<detail::WarningKey, std::size_t> warning_index;

  // A step that was not skipped although its gradients were non-finite (no scaler to catch them): the
  // optimizer wrote NaN/inf into the weights, so later steps are non-finite from their first op without any
  // origin. Those steps follow from the diagnosis of that step; they are not non-finite input data.
  struct Applied : detail::LaterSteps {
    std::int64_t step = -1;  // the first such step, -1 when none
    double scale = 1;
  } applied;

  // Parameters the optimizer itself turned NaN/inf (analysis_optimizer.h): later steps that are non-finite from
  // their first op follow from that diagnosis (the weights hold NaN/inf), not from the data.
  struct OptimizerWrote : detail::LaterSteps {
    std::int64_t step = -1;  // the first step with such a diagnosis, -1 when none
  } optimizer_wrote;

  // Diagnoses of skipped steps that may be the scaler calibrating (forward and loss finite, only
  // gradients overflowed): decided in finish(), when the later steps are known.
  std::map<std::int64_t, std::vector<Diagnosis>> pending_calibration;

  // Adds a diagnosis or counts a recurrence of one already seen.
  void add(Diagnosis d, std::int64_t step, bool* was_new = nullptr);
  bool seen(const Diagnosis& d) const { return index.count(detail::Key{d.op, d.module, d.cause, d.phase}) > 0; }
  // Adds a warning or counts a recurrence of one already seen.
  void warn(HeadroomWarning w);

  // ---- add_step(): the rules of one step ----

  // One diagnosis per origin row of a step (or a recurrence of one seen before): its cause, evidence, root-cause
  // chain, propagation, silent damage and remedies. Backward origins of a step that may be the scaler
  // calibrating wait in pending_calibration.
  void origins(std::int64_t step, std::span<const trace::OpRow> ops, const trace::StepRow* step_row,
               std::span<const trace::GradRow> grads, std::span<const trace::EventRow> events,
               const detail::SeqIndex& idx);
  // Propagation within the step: later non-finite ops, the loss, the gradients.
  void propagation(Diagnosis& d, std::span<const trace::OpRow> ops, const trace::OpRow* origin,
                   const trace::StepRow* step_row, std::span<const trace::GradRow> grads) const;
  // An output that was finite in the steps before and grew past f16's range: the weights grew, so the
  // learning rate is the first suspect (a jump in one step: far too high; a steady climb: too high for f16).
  void grown(Diagnosis& d, const trace::OpRow& r, std::span<const trace::OpRow> ops);
  // Whether the amplifier a root walk found amplified less on the steps before (a.grew, a.growth), and the run's
  // learning rate at its step (a.lr).
  void amplifier_growth(detail::Amplification& a, std::span<const trace::OpRow> ops) const;
  // Non-finite forward outputs in a step without origin: the data were non-finite before the first op.
  void nonfinite_input(std::int64_t step, std::span<const trace::OpRow> ops, const trace::StepRow* step_row,
                       std::span<const trace::GradRow> grads);
  // Warnings about values near f16's limits: outputs near its largest value, subnormal outputs, values a cast
  // flushed to zero, and (at level full) values below its smallest subnormal.
  void headroom(std::span<const trace::OpRow> ops, std::span<const trace::GradRow> grads,
                std::span<const trace::HistogramRow> hists);

  // ---- finish(): what the whole run shows, in the order finish() runs it (after scaler_health()); the
  // calibration in scaler_health.cpp, the rest in run_rules.cpp ----
  void decide_calibration();
  std::vector<std::int64_t> stale_steps() const;
  void propagation_over_steps();
  void later_steps_evidence();
  void gradient_underflow();
  void scale_collapse();
};

}  // namespace ampscope::analysis
