// The Analyser (probes/analysis/analysis.h): streams a run's steps through the rules of one step
// (step_rules.cpp), then what the whole run shows (scaler_health.cpp, run_rules.cpp, coverage.cpp). The rules
// share the helpers of probes/analysis/internal/: rows.h (what a row says), provenance.h (root-cause walks),
// remedies.h (remedies by cause), scaler_health.h, coverage.h and analyser_state.h (what the Analyser
// remembers across steps).
#include "probes/analysis/analysis.h"
#include "probes/analysis/internal/analyser_state.h"
#include "probes/analysis/internal/coverage.h"
#include "probes/analysis/internal/remedies.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/internal/scaler_health.h"
#include "probes/analysis/optimizer.h"
#include "probes/analysis/blocks.h"
#include "probes/analysis/fp8.h"
#include "probes/analysis/updates.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

namespace ampscope::analysis {

using namespace detail;
using trace::EventRow;
using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

Analyser::Analyser(AnalysisOptions options) : state_(std::make_unique<State>()) { state_->options = options; }
Analyser::~Analyser() = default;
Analyser::Analyser(Analyser&&) noexcept = default;
Analyser& Analyser::operator=(Analyser&&) noexcept = default;

void Analyser::set_run(const trace::RunInfo& run, std::string path, bool complete) {
  state_->rep.run = run;
  state_->rep.path = std::move(path);
  state_->rep.complete = complete;
  // nlohmann writes an empty list as [] (probe::describe): any other value names at least one override.
  state_->watch_outside = run.probe.find("\"autocast_overrides\":") != std::string::npos &&
                          run.probe.find("\"autocast_overrides\":[]") == std::string::npos;
}

void Analyser::add_step(std::int64_t step, const StepRow* step_row, std::span<const OpRow> ops,
                        std::span<const GradRow> grads, std::span<const EventRow> events,
                        std::span<const trace::HistogramRow> histograms,
                        std::span<const trace::PrecisionRow> precision) {
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
  for (const GradRow& g : grads)
    if (std::find(st.rep.grad_dtypes.begin(), st.rep.grad_dtypes.end(), g.dtype) == st.rep.grad_dtypes.end()) {
      st.rep.grad_dtypes.push_back(g.dtype);
      std::sort(st.rep.grad_dtypes.begin(), st.rep.grad_dtypes.end());
    }

  if (!ops.empty()) st.rep.provenance |= ops.front().inputs[0] != trace::kInputUnknown;
  StepFacts& f = st.facts[step];
  f.has_ops = !ops.empty();
  // Which autocast overrides decided a dtype: the reason reads "override (op 'x', module 'y') -> f32".
  for (const OpRow& r : ops) {
    if (r.autocast.rfind("override (", 0) != 0) continue;
    const std::size_t close = r.autocast.find(") -> ");
    for (std::size_t q = r.autocast.find('\''); q != std::string::npos && q < close;) {
      const std::size_t e = r.autocast.find('\'', q + 1);
      if (e == std::string::npos) break;
      st.overrides_applied.insert(r.autocast.substr(q + 1, e - q - 1));
      q = r.autocast.find('\'', e + 1);
    }
  }
  if (st.watch_outside) {
    for (const OpRow& r : ops)
      if (r.phase == Phase::forward && r.autocast.empty()) st.outside_autocast.emplace(r.op, r.module);
  }
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
  SeqIndex idx;
  if (f.origin || f.nonfinite) {
    idx.reserve(ops.size());
    for (const OpRow& r : ops) idx.emplace(r.seq, &r);
  }
  if (f.origin) {
    st.origins(step, ops, step_row, grads, events, idx);
  } else if (f.nonfinite && st.optimizer_wrote.step >= 0) {
    st.optimizer_wrote.note(step, ops);
  } else if (f.nonfinite && st.applied.step >= 0 && !st.rep.anomalies.empty()) {
    st.applied.note(step, ops);
  } else if (f.nonfinite) {
    st.nonfinite_input(step, ops, step_row, grads);
  }
  if (!f.nonfinite) {  // the optimizer turned finite weights NaN/inf (analysis_optimizer.h)
    for (Diagnosis& d : optimizer_diagnoses(step, events, grads)) {
      d.remedy = remedy_text(d.remedies);
      if (st.optimizer_wrote.step < 0) st.optimizer_wrote.step = step;
      st.add(std::move(d), step);
    }
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
  st.recent.remember(step, ops);
  st.precision.add_step(step, ops, precision);
}

Report Analyser::finish() {
  State& st = *state_;
  if (st.finished) throw std::logic_error("Analyser::finish called twice");
  st.finished = true;
  Report& rep = st.rep;
  rep.precision = st.precision.finish();
  const std::vector<StepRow>& steps = st.steps;
  // Rows outside steps (step -1: an evaluation pass the probe was asked to record) are no step of their own.
  std::int64_t numbered = 0;
  for (const auto& [step, _] : st.facts) numbered += step >= 0 ? 1 : 0;
  rep.steps = static_cast<std::int64_t>(std::max<std::size_t>(steps.size(), static_cast<std::size_t>(numbered)));
  rep.scaler = scaler_health(steps, rep.run);
  st.decide_calibration();
  st.propagation_over_steps();
  st.later_steps_evidence();
  st.gradient_underflow();
  st.scale_collapse();
  coverage(rep, st.overrides_applied, st.outside_autocast);

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

// A block's op rows grouped by step where they lie: the rows are put in step order (a stable sort, only when
// they are not in it already: a file written in order is), and each step's rows in seq order, the order the
// rules read them in (a stable sort again, only where needed). The same rows in the same order as moving each
// row into a vector of its step would give, without moving 200,000 rows of six strings each (issue 37: that
// move, and the page faults of its second copy of the block, were about a fifth of the report's time).
std::map<std::int64_t, std::span<const OpRow>> ops_by_step(std::vector<OpRow>& rows) {
  auto by_step_order = [](const OpRow& x, const OpRow& y) { return x.step < y.step; };
  if (!std::is_sorted(rows.begin(), rows.end(), by_step_order)) std::stable_sort(rows.begin(), rows.end(), by_step_order);
  std::map<std::int64_t, std::span<const OpRow>> out;
  auto by_seq = [](const OpRow& x, const OpRow& y) { return x.seq < y.seq; };
  for (auto first = rows.begin(); first != rows.end();) {
    auto last = std::find_if(first, rows.end(), [&](const OpRow& r) { return r.step != first->step; });
    if (!std::is_sorted(first, last, by_seq)) std::stable_sort(first, last, by_seq);
    out.emplace_hint(out.end(), first->step, std::span<const OpRow>(&*first, static_cast<std::size_t>(last - first)));
    first = last;
  }
  return out;
}

void feed(Analyser& a, const std::map<std::int64_t, const StepRow*>& step_rows,
          const std::map<std::int64_t, std::span<const OpRow>>& ops, const std::map<std::int64_t, std::vector<GradRow>>& grads,
          const std::map<std::int64_t, std::vector<EventRow>>& events,
          const std::map<std::int64_t, std::vector<trace::HistogramRow>>& hists,
          const std::map<std::int64_t, std::vector<trace::PrecisionRow>>& precision, std::int64_t begin, std::int64_t end) {
  std::set<std::int64_t> all;
  for (const auto& [s, _] : step_rows) if (s >= begin && s < end) all.insert(s);
  for (const auto& [s, _] : ops) all.insert(s);
  for (const auto& [s, _] : grads) all.insert(s);
  for (const auto& [s, _] : events) all.insert(s);
  for (const auto& [s, _] : hists) all.insert(s);
  for (const auto& [s, _] : precision) all.insert(s);
  for (std::int64_t s : all) {
    auto row = step_rows.find(s);
    const auto it = ops.find(s);
    const std::span<const OpRow> step_ops = it == ops.end() ? std::span<const OpRow>{} : it->second;
    a.add_step(s, row == step_rows.end() ? nullptr : row->second, step_ops, rows_of(grads, s), rows_of(events, s),
               rows_of(hists, s), rows_of(precision, s));
  }
}

}  // namespace

Report analyse(const std::vector<StepRow>& steps, const std::vector<OpRow>& ops, const std::vector<GradRow>& grads,
               const std::vector<EventRow>& events, const std::vector<trace::HistogramRow>& histograms,
               const AnalysisOptions& options, const std::vector<trace::PrecisionRow>& precision) {
  Analyser a(options);
  std::map<std::int64_t, const StepRow*> step_rows;
  for (const StepRow& s : steps) step_rows[s.step] = &s;
  std::vector<OpRow> op_rows = ops;
  feed(a, step_rows, ops_by_step(op_rows), by_step(grads), by_step(events), by_step(histograms), by_step(precision),
       trace::kFirstStep, trace::kLastStep);
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
  std::vector<OpRow> ops;  // one block's rows; its memory is reused by the next block
  // The twin's forward linear rows (a few per step): block_error_dominates measures block-scaled Linears by them.
  std::vector<trace::PrecisionRow> linear_twin;
  for (std::size_t i = 0; i == 0 || i < numbers.size(); i += block) {
    const std::int64_t begin = i == 0 ? trace::kFirstStep : numbers[i];
    const std::int64_t end = i + block >= numbers.size() ? trace::kLastStep : numbers[i + block];
    std::map<std::int64_t, const StepRow*> rows_here;
    for (auto it = step_rows.lower_bound(begin); it != step_rows.end() && it->first < end; ++it) rows_here.insert(*it);
    reader.ops(begin, end, ops);
    done += static_cast<std::int64_t>(ops.size());
    std::vector<trace::PrecisionRow> precision = reader.precision(begin, end);
    for (const trace::PrecisionRow& r : precision)
      if (r.op == "linear" && r.phase == trace::Phase::forward) linear_twin.push_back(r);
    feed(a, rows_here, ops_by_step(ops), by_step(reader.grads(begin, end)), by_step(reader.events(begin, end)),
         by_step(reader.histograms(begin, end)), by_step(std::move(precision)), begin, end);
    if (progress) progress(done, counts.ops);
    if (numbers.empty()) break;
  }
  Report report = a.finish();
  report.swamped = analyse_updates(reader.updates());  // one row per f16/bf16 parameter and step: small
  report.fp8 = analyse_fp8(reader.fp8(), fp8_run_settings(reader.run_info().config));  // three rows per FP8 Linear and recorded step: small
  mark_fp8_linears(report.precision, report.fp8);
  {
    const std::vector<trace::BlockRow> block_rows = reader.blocks();  // a row per operand copy, Linear and recorded step: small
    report.blocks = analyse_blocks(block_rows);
    mark_block_linears(report.precision, report.blocks);
    // The block-scaled findings join the FP8 ones: calibration-like, fixed and verified by `ampscope fix` alike.
    for (Fp8Finding& f : block_findings(block_rows, block_run_settings(reader.run_info().config), linear_twin))
      report.fp8.findings.push_back(std::move(f));
  }
  report.damage = reader.damage();
  return report;
}

}  // namespace ampscope::analysis
