#include "viewer/view_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <system_error>

#include <fmt/format.h>

#include "probes/analysis/precision.h"
#include "probes/analysis/ranks.h"

namespace ampscope::viewer {

std::uint32_t dtype_colour(std::string_view dtype) {
  if (dtype == "f16") return rgba(255, 170, 60);
  if (dtype == "bf16") return rgba(120, 220, 120);
  if (dtype == "f32") return rgba(130, 180, 255);
  if (dtype == "f64") return rgba(200, 150, 255);
  return rgba(170, 170, 170);
}

std::string format_number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{:.5g}", value);
}

std::string format_count(std::int64_t value) {
  // In unsigned arithmetic, so that the most negative count (a damaged row) has a magnitude too.
  const std::uint64_t magnitude = value < 0 ? 0 - static_cast<std::uint64_t>(value) : static_cast<std::uint64_t>(value);
  std::string digits = std::to_string(magnitude);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

// ---- Overview ----

std::vector<KeyValue> overview_rows(const OverviewInput& in) {
  std::vector<KeyValue> rows;
  rows.push_back({"file", in.path});
  rows.push_back({"model", in.run.model});
  rows.push_back({"precision", in.run.precision});
  rows.push_back({"device", in.run.device});
  rows.push_back({"seed", std::to_string(in.run.seed)});
  if (in.steps.empty()) {
    rows.push_back({"steps", "none recorded", true});
  } else {
    rows.push_back({"steps", fmt::format("{} (step {} .. {})", in.steps.size(), in.steps.front().step,
                                         in.steps.back().step)});
  }
  std::int64_t skipped = 0;
  for (const auto& s : in.steps) skipped += s.skipped ? 1 : 0;
  rows.push_back({"skipped steps", std::to_string(skipped), skipped > 0});
  if (in.report == nullptr) {
    rows.push_back({"anomalies", fmt::format("analysing... {:.0f}%", 100.0 * in.analysis_progress)});
  } else {
    rows.push_back({"anomalies", in.report->anomalies.empty() ? std::string("none")
                                                              : std::to_string(in.report->anomalies.size()),
                    !in.report->anomalies.empty()});
    rows.push_back({"warnings", std::to_string(in.report->warnings.size()), !in.report->warnings.empty()});
    rows.push_back({"scaler", in.report->scaler.verdict,
                    in.report->scaler.verdict != "healthy" && in.report->scaler.verdict != "no_scaler"});
  }
  if (!in.steps.empty()) {
    rows.push_back({"final scale", format_number(in.steps.back().scale_after)});
    rows.push_back({"final loss", format_number(in.steps.back().loss), !std::isfinite(in.steps.back().loss)});
  }
  rows.push_back({"op rows", format_count(in.counts.ops)});
  rows.push_back({"grad rows", format_count(in.counts.grads)});
  rows.push_back({"histogram rows", in.counts.histograms > 0 ? format_count(in.counts.histograms)
                                                              : std::string("none (probe level below full)")});
  rows.push_back({"status", in.complete ? "complete" : "not closed: still being written, or the writer stopped",
                  !in.complete});
  rows.push_back({"config", in.run.config});
  return rows;
}

// ---- Scale and loss ----

StepSeries step_series(std::span<const trace::StepRow> steps) {
  StepSeries s;
  s.step.reserve(steps.size());
  for (const auto& r : steps) {
    const double x = static_cast<double>(r.step);
    s.step.push_back(x);
    s.loss.push_back(r.loss);
    s.scale.push_back(r.scale);
    s.grad_norm.push_back(r.grad_norm);
    if (r.skipped) s.skipped.push_back(x);
    if (r.scale_after < r.scale) s.backoffs.push_back(x);
    if (r.scale_after > r.scale) s.growths.push_back(x);
  }
  return s;
}

std::optional<std::size_t> step_index(std::span<const trace::StepRow> steps, std::int64_t step) {
  auto it = std::lower_bound(steps.begin(), steps.end(), step,
                             [](const trace::StepRow& r, std::int64_t s) { return r.step < s; });
  if (it != steps.end() && it->step == step) return static_cast<std::size_t>(it - steps.begin());
  // Steps are written in order; fall back to a scan should a trace hold them otherwise.
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].step == step) return i;
  }
  return std::nullopt;
}

std::optional<std::int64_t> nearest_step(std::span<const trace::StepRow> steps, double x) {
  if (steps.empty() || std::isnan(x)) return std::nullopt;
  std::int64_t best = steps.front().step;
  double best_d = std::fabs(static_cast<double>(best) - x);
  for (const auto& r : steps) {
    const double d = std::fabs(static_cast<double>(r.step) - x);
    if (d < best_d) best = r.step, best_d = d;
  }
  return best;
}

std::optional<std::int64_t> initial_step(std::span<const trace::StepRow> steps, const analysis::Report* report) {
  if (report != nullptr && !report->anomalies.empty()) return report->anomalies.front().step;
  if (steps.empty()) return std::nullopt;
  return steps.front().step;
}

// ---- The first anomaly at open ----

bool is_anomaly_event(std::string_view kind) {
  return kind == "origin" || kind == "propagate" || kind == "cast_overflow" || kind == "grad_overflow" ||
         kind == "skipped_step" || kind == "scale_backoff";
}

namespace {

// Within a step, the event that says most about where it went wrong: an op creating NaN/inf first.
int event_rank(std::string_view kind) {
  constexpr std::string_view order[] = {"origin", "cast_overflow", "propagate", "grad_overflow", "skipped_step", "scale_backoff"};
  for (int i = 0; i < 6; ++i)
    if (kind == order[i]) return i;
  return 6;
}

bool names_op(const trace::EventRow& e) {
  return !e.op.empty() && e.seq >= 0 && (e.kind == "origin" || e.kind == "cast_overflow" || e.kind == "propagate");
}

std::string where(const trace::EventRow& e) {
  return e.module.empty() ? e.op : fmt::format("{} in {}", e.op, e.module);
}

std::string event_text(const trace::EventRow& e) {
  if (e.kind == "origin") return "NaN/inf created by " + where(e);
  if (e.kind == "cast_overflow") return "cast overflow in " + where(e);
  if (e.kind == "propagate") return "NaN/inf passed on by " + where(e);
  if (e.kind == "grad_overflow") return e.module.empty() ? "a gradient held inf/NaN" : "gradient of " + e.module + " held inf/NaN";
  if (e.kind == "skipped_step") return "skipped step";
  return "loss scale backed off";
}

std::string step_text(const trace::StepRow& r) {
  std::vector<std::string> parts;
  if (!std::isfinite(r.loss)) parts.push_back("loss " + format_number(r.loss));
  if (r.found_inf) parts.push_back("inf/NaN in the gradients");
  if (r.skipped) parts.push_back("skipped step");
  return fmt::format("{}", fmt::join(parts, ", "));
}

bool step_flagged(const trace::StepRow& r) { return r.found_inf || r.skipped || !std::isfinite(r.loss); }

}  // namespace

std::optional<EarlyAnomaly> early_anomaly(std::span<const trace::StepRow> steps, std::span<const trace::EventRow> events) {
  std::vector<std::int64_t> recorded;
  recorded.reserve(steps.size());
  const trace::StepRow* flagged = nullptr;  // the earliest /steps row that says something went wrong
  for (const trace::StepRow& r : steps) {
    recorded.push_back(r.step);
    if (step_flagged(r) && (!flagged || r.step < flagged->step)) flagged = &r;
  }
  if (!events.empty()) std::sort(recorded.begin(), recorded.end());  // only events are looked up in it
  const trace::EventRow* best = nullptr;
  for (const trace::EventRow& e : events) {
    if (!is_anomaly_event(e.kind) || !std::binary_search(recorded.begin(), recorded.end(), e.step)) continue;
    if (!best || e.step < best->step ||
        (e.step == best->step && std::make_tuple(event_rank(e.kind), !names_op(e), e.seq) <
                                     std::make_tuple(event_rank(best->kind), !names_op(*best), best->seq))) {
      best = &e;
    }
  }
  if (best && (!flagged || best->step <= flagged->step)) {
    EarlyAnomaly a{.step = best->step, .seq = std::nullopt, .from_events = true, .what = event_text(*best)};
    if (names_op(*best)) a.seq = best->seq;
    return a;
  }
  if (flagged) return EarlyAnomaly{.step = flagged->step, .seq = std::nullopt, .from_events = false, .what = step_text(*flagged)};
  return std::nullopt;
}

std::optional<std::int64_t> early_anomaly_op(std::span<const trace::OpRow> rows, std::optional<std::int64_t> seq) {
  if (seq && std::any_of(rows.begin(), rows.end(), [&](const trace::OpRow& r) { return r.seq == *seq; })) return seq;
  for (const trace::OpRow& r : rows)
    if (r.origin) return r.seq;
  return std::nullopt;
}

std::string early_anomaly_label(const EarlyAnomaly& early, double analysis_progress, bool analysing) {
  if (!analysing) {
    return fmt::format("Unconfirmed: step {} ({}), the first anomaly the trace's {} name; the analysis did not finish, so "
                       "nothing confirms it.",
                       early.step, early.what, early.from_events ? "events" : "step rows");
  }
  return fmt::format("Provisional: step {} ({}), the first anomaly the trace's {} name. The analysis ({:.0f}%) gives the "
                     "verdict and may move the selection.",
                     early.step, early.what, early.from_events ? "events" : "step rows", 100.0 * analysis_progress);
}

std::string early_anomaly_verdict(const EarlyAnomaly& early, const analysis::Report& report, std::optional<std::int64_t> now) {
  const std::string was = fmt::format("step {} ({}, from the trace's {})", early.step, early.what,
                                      early.from_events ? "events" : "step rows");
  if (report.anomalies.empty()) {
    return fmt::format("The analysis found no anomaly: {} is not one. Showing {}.", was,
                       now ? fmt::format("step {}", *now) : std::string("no step"));
  }
  const analysis::Diagnosis& d = report.anomalies.front();
  if (d.step == early.step) return "";
  const std::string op = d.op.empty() ? "" : d.module.empty() ? ", " + d.op : fmt::format(", {} in {}", d.op, d.module);
  return fmt::format("Moved to step {}, the analysis's first anomaly ({}{}): {}, shown until then, is not.",
                     d.step, d.cause, op, was);
}

// ---- Ops ----

std::string_view op_column_name(OpColumn c) {
  switch (c) {
    case OpColumn::seq: return "seq";
    case OpColumn::phase: return "phase";
    case OpColumn::module: return "module";
    case OpColumn::op: return "op";
    case OpColumn::dtypes: return "in -> out";
    case OpColumn::shape: return "shape";
    case OpColumn::numel: return "numel";
    case OpColumn::nonfinite: return "nan/inf";
    case OpColumn::zero: return "zero";
    case OpColumn::subnormal: return "subnormal";
    case OpColumn::absmax: return "absmax";
    case OpColumn::mean: return "mean";
    case OpColumn::rms: return "rms";
  }
  return "?";
}

std::string_view op_column_help(OpColumn c) {
  switch (c) {
    case OpColumn::seq: return "Order of the op within the step (forward ops, then backward nodes).";
    case OpColumn::phase: return "forward, backward, optimizer or scaler.";
    case OpColumn::module: return "The module the op ran in (\"\" outside any module).";
    case OpColumn::op: return "The op's name. A mark before it: this op created NaN/inf from finite inputs (an origin).";
    case OpColumn::dtypes: return "The inputs' dtypes after autocast -> the output's dtype.";
    case OpColumn::shape: return "The output's shape.";
    case OpColumn::numel: return "Elements in the output.";
    case OpColumn::nonfinite: return "NaN + inf + -inf values in the output. Red when not zero.";
    case OpColumn::zero: return "Values equal to zero in the output.";
    case OpColumn::subnormal: return "Subnormal values in the output (in its own dtype): precision already lost.";
    case OpColumn::absmax: return "Largest |x| over the finite values. f16 overflows above 65504.";
    case OpColumn::mean: return "Mean over the finite values, accumulated in double.";
    case OpColumn::rms: return "Root mean square over the finite values.";
  }
  return "";
}

namespace {

bool contains_nocase(std::string_view hay, std::string_view needle) {
  if (needle.empty()) return true;
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
  });
  return it != hay.end();
}

// NaN sorts after every number in ascending order (and first in descending), so non-finite rows gather.
int compare_double(double a, double b) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na == nb ? 0 : (na ? 1 : -1);
  return a < b ? -1 : (a > b ? 1 : 0);
}

template <class T>
int compare_plain(const T& a, const T& b) {
  return a < b ? -1 : (b < a ? 1 : 0);
}

int compare_rows(const trace::OpRow& a, const trace::OpRow& b, OpColumn c) {
  switch (c) {
    case OpColumn::seq: return compare_plain(a.seq, b.seq);
    case OpColumn::phase: return compare_plain(static_cast<int>(a.phase), static_cast<int>(b.phase));
    case OpColumn::module: return a.module.compare(b.module);
    case OpColumn::op: return a.op.compare(b.op);
    case OpColumn::dtypes: {
      const int o = a.out_dtype.compare(b.out_dtype);
      return o != 0 ? o : a.in_dtypes.compare(b.in_dtypes);
    }
    case OpColumn::shape: return a.shape.compare(b.shape);
    case OpColumn::numel: return compare_plain(a.health.numel, b.health.numel);
    case OpColumn::nonfinite: return compare_plain(nonfinite_count(a.health), nonfinite_count(b.health));
    case OpColumn::zero: return compare_plain(a.health.zero, b.health.zero);
    case OpColumn::subnormal: return compare_plain(a.health.subnormal, b.health.subnormal);
    case OpColumn::absmax: return compare_double(a.health.absmax, b.health.absmax);
    case OpColumn::mean: return compare_double(a.health.mean, b.health.mean);
    case OpColumn::rms: return compare_double(a.health.rms, b.health.rms);
  }
  return 0;
}

}  // namespace

std::int64_t nonfinite_count(const trace::TensorHealth& h) { return h.nan + h.pos_inf + h.neg_inf; }

bool op_matches(const trace::OpRow& row, const OpFilter& filter) {
  if (filter.nonfinite_only && nonfinite_count(row.health) == 0 && !row.origin) return false;
  if (filter.text.empty()) return true;
  return contains_nocase(row.module, filter.text) || contains_nocase(row.op, filter.text) ||
         contains_nocase(trace::phase_name(row.phase), filter.text) || contains_nocase(row.in_dtypes, filter.text) ||
         contains_nocase(row.out_dtype, filter.text) || contains_nocase(row.autocast, filter.text);
}

std::vector<std::uint32_t> op_order(std::span<const trace::OpRow> rows, const OpFilter& filter, OpColumn sort,
                                    bool ascending) {
  std::vector<std::uint32_t> order;
  order.reserve(rows.size());
  const bool all = filter.text.empty() && !filter.nonfinite_only;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (all || op_matches(rows[i], filter)) order.push_back(static_cast<std::uint32_t>(i));
  }
  // Rows arrive in seq order: sorting by seq ascending is the identity, and skipping it keeps a
  // million-row step instant.
  if (sort == OpColumn::seq && ascending) return order;
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const int c = compare_rows(rows[x], rows[y], sort);
    return ascending ? c < 0 : c > 0;
  });
  return order;
}

std::string dtype_arrow(const trace::OpRow& row) {
  return row.in_dtypes.empty() ? "-> " + row.out_dtype : row.in_dtypes + " -> " + row.out_dtype;
}

std::string op_cell(const trace::OpRow& row, OpColumn c) {
  switch (c) {
    case OpColumn::seq: return std::to_string(row.seq);
    case OpColumn::phase: return std::string(trace::phase_name(row.phase));
    case OpColumn::module: return row.module;
    case OpColumn::op: return row.op;
    case OpColumn::dtypes: return dtype_arrow(row);
    case OpColumn::shape: return row.shape;
    case OpColumn::numel: return std::to_string(row.health.numel);
    case OpColumn::nonfinite: {
      const auto& h = row.health;
      if (nonfinite_count(h) == 0) return "0";
      std::string s;
      if (h.nan) s += fmt::format("{} nan", h.nan);
      if (h.pos_inf) s += fmt::format("{}{} +inf", s.empty() ? "" : ", ", h.pos_inf);
      if (h.neg_inf) s += fmt::format("{}{} -inf", s.empty() ? "" : ", ", h.neg_inf);
      return s;
    }
    case OpColumn::zero: return std::to_string(row.health.zero);
    case OpColumn::subnormal: return std::to_string(row.health.subnormal);
    case OpColumn::absmax: return format_number(row.health.absmax);
    case OpColumn::mean: return format_number(row.health.mean);
    case OpColumn::rms: return format_number(row.health.rms);
  }
  return "";
}

// ---- Op detail ----

std::vector<KeyValue> op_detail_rows(const trace::OpRow& row) {
  const auto& h = row.health;
  std::vector<KeyValue> rows = {
      {"step / seq", fmt::format("{} / {}", row.step, row.seq)},
      {"phase", std::string(trace::phase_name(row.phase))},
      {"module", row.module.empty() ? "(outside any module)" : row.module},
      {"op", row.op},
      {"dtypes", dtype_arrow(row)},
      {"autocast", row.autocast.empty() ? "(outside autocast)" : row.autocast},
      {"shape", row.shape},
      {"numel", format_count(h.numel)},
      {"NaN", format_count(h.nan), h.nan > 0},
      {"+inf", format_count(h.pos_inf), h.pos_inf > 0},
      {"-inf", format_count(h.neg_inf), h.neg_inf > 0},
      {"zero", format_count(h.zero)},
      {"subnormal", format_count(h.subnormal), h.subnormal > 0},
      {"min", format_number(h.min)},
      {"max", format_number(h.max)},
      {"absmax", format_number(h.absmax), std::isfinite(h.absmax) && h.absmax * 2 >= analysis::kF16Max},
      {"mean", format_number(h.mean)},
      {"rms", format_number(h.rms)},
  };
  if (row.cast_overflow || row.cast_underflow) {
    rows.push_back({"cast overflow", format_count(row.cast_overflow), row.cast_overflow > 0});
    rows.push_back({"cast underflow", format_count(row.cast_underflow), row.cast_underflow > 0});
  }
  rows.push_back({"origin", row.origin ? "yes: NaN/inf created here from finite inputs" : "no", row.origin});
  return rows;
}

std::string input_marker_words(std::int64_t marker) {
  switch (marker) {
    case trace::kInputNone: return "no input";
    case trace::kInputParameter: return "parameter";
    case trace::kInputData: return "data or constant";
    case trace::kInputUnrecorded: return "an op of this step the probe did not record (filtered out)";
    case trace::kInputOtherStep: return "an op of an earlier step, or run outside any step (data prepared before the loop)";
    case trace::kInputSummed: return "summed gradients";
    case trace::kInputUnknown: return "unknown: this trace has no provenance (format_version 1)";
    default: return marker >= 0 ? "" : fmt::format("invalid marker {} (a damaged row?)", marker);
  }
}

namespace {

// The row with this seq among a step's rows: they come in seq order, so a binary search finds it; a scan
// covers rows written otherwise. Null when there is none.
const trace::OpRow* find_seq(std::span<const trace::OpRow> rows, std::int64_t seq) {
  auto it = std::lower_bound(rows.begin(), rows.end(), seq,
                             [](const trace::OpRow& r, std::int64_t s) { return r.seq < s; });
  if (it != rows.end() && it->seq == seq) return &*it;
  for (const auto& r : rows) {
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

OpLink link_to(const trace::OpRow& r) {
  OpLink l;
  l.seq = r.seq;
  l.found = true;
  l.text = fmt::format("seq {}  {}{} in {}  {} {}", r.seq, r.phase == trace::Phase::forward ? "" : std::string(trace::phase_name(r.phase)) + " ",
                       r.op, r.module.empty() ? "(no module)" : r.module, r.out_dtype, r.shape);
  l.health = fmt::format("NaN/inf {}, zeros {} of {}, absmax {}", op_cell(r, OpColumn::nonfinite),
                         format_count(r.health.zero), format_count(r.health.numel), format_number(r.health.absmax));
  l.nonfinite = nonfinite_count(r.health) > 0;
  l.out_dtype = r.out_dtype;
  return l;
}

}  // namespace

std::vector<OpLink> producers(const trace::OpRow& row, std::span<const trace::OpRow> step_rows) {
  std::vector<OpLink> out;
  if (std::all_of(row.inputs.begin(), row.inputs.end(), [](std::int64_t v) { return v == trace::kInputUnknown; })) {
    OpLink l;
    l.marker = trace::kInputUnknown;
    l.text = input_marker_words(trace::kInputUnknown);
    out.push_back(std::move(l));
    return out;
  }
  for (int i = 0; i < trace::kOpInputs; ++i) {
    const std::int64_t v = row.inputs[static_cast<std::size_t>(i)];
    if (v == trace::kInputNone) continue;
    OpLink l;
    if (v < 0) {
      l.marker = v;
      l.text = input_marker_words(v);
    } else if (const trace::OpRow* p = find_seq(step_rows, v); p != nullptr && p->step == row.step) {
      l = link_to(*p);
    } else {
      l.seq = v;
      l.text = fmt::format("seq {}: not among this step's rows (a damaged trace?)", v);
    }
    l.positions = {i};
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<OpLink> consumers(const trace::OpRow& row, std::span<const trace::OpRow> step_rows) {
  std::vector<OpLink> out;
  for (const auto& r : step_rows) {
    if (r.step != row.step) continue;
    std::vector<int> positions;
    for (int i = 0; i < trace::kOpInputs; ++i) {
      if (r.inputs[static_cast<std::size_t>(i)] == row.seq) positions.push_back(i);
    }
    if (positions.empty()) continue;
    OpLink l = link_to(r);
    l.positions = std::move(positions);
    out.push_back(std::move(l));
  }
  return out;
}

ExponentHistogram exponent_histogram(const trace::HistogramRow& row, std::string_view dtype) {
  using namespace half_ranges;
  ExponentHistogram h;
  h.dtype = std::string(dtype);
  for (int i = 0; i < kExponentBins; ++i) {
    const std::int64_t n = row.bins[static_cast<std::size_t>(i)];
    if (n == 0) continue;
    h.exponent.push_back(exponent_of_bin(i));
    h.count.push_back(static_cast<double>(n));
    h.zone.push_back(f16_bin_zone(i, dtype));
  }
  h.subnormal = row.bins[kSubnormalBin];
  h.zero = row.bins[kZeroBin];
  h.inf = row.bins[kInfBin];
  h.nan = row.bins[kNanBin];
  h.f16 = f16_zone_counts(row, dtype);
  for (std::int64_t n : row.bins) h.total += n;
  return h;
}

std::optional<ExponentHistogram> op_histogram(std::span<const trace::HistogramRow> rows, std::int64_t seq,
                                              std::string_view dtype) {
  for (const auto& r : rows) {
    if (r.seq == seq && r.tensor == "output") return exponent_histogram(r, dtype);
  }
  return std::nullopt;
}

std::vector<Bar> special_bars(const ExponentHistogram& h) {
  return {
      {"sub", static_cast<double>(h.subnormal), colours::kSubnormalBar},
      {"0", static_cast<double>(h.zero), colours::kZeroBar},
      {"inf", static_cast<double>(h.inf), colours::kInfBar},
      {"NaN", static_cast<double>(h.nan), colours::kNanBar},
  };
}

std::vector<ZoneBand> f16_zone_bands() {
  using namespace half_ranges;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double s = kF16.min_subnormal_exponent();
  return {
      {-kInf, s - 1, colours::kF16FlushZone, "flush to 0", Zone::flushes_to_zero},
      {s - 1, s, colours::kF16RoundUpZone, "rounds up to 2^-24", Zone::rounds_up},
      {s, static_cast<double>(kF16.min_normal_exponent), colours::kF16SubnormalZone, "subnormal", Zone::subnormal},
      {std::log2(kF16.overflow_threshold()), kInf, colours::kF16OverflowZone, "inf", Zone::overflows},
  };
}

std::vector<ZoneLine> f16_zone_lines(const ExponentHistogram& h) {
  using half_ranges::Zone;
  const auto& c = h.f16;
  std::vector<ZoneLine> lines;
  // Overflow: the infs the tensor already holds, finite values from 2^16, and bin 15's values from 65520.
  std::string over = fmt::format("inf in f16: {} inf recorded, {} finite >= 2^16", format_count(c[Zone::inf]),
                                 format_count(c[Zone::overflows]));
  if (c[Zone::partly_overflows] > 0)
    over += fmt::format(", those >= 65520 of {} in 2^15 .. 2^16", format_count(c[Zone::partly_overflows]));
  const bool overflow = c[Zone::inf] + c[Zone::overflows] > 0;
  lines.push_back({colours::kF16OverflowZone,
                   overflow ? colours::kNonFiniteCell : c[Zone::partly_overflows] > 0 ? colours::kWarning : colours::kF16Range,
                   std::move(over)});
  lines.push_back({colours::kF16SubnormalZone, colours::kF16Range,
                   fmt::format("f16 subnormal (2^-24 .. 2^-14): {}", format_count(c[Zone::subnormal]))});
  lines.push_back({colours::kF16RoundUpZone, c[Zone::rounds_up] > 0 ? colours::kWarning : colours::kF16Range,
                   fmt::format("round up to 2^-24 (2^-25 .. 2^-24): {}", format_count(c[Zone::rounds_up]))});
  lines.push_back({colours::kF16FlushZone, c[Zone::flushes_to_zero] > 0 ? colours::kWarning : colours::kF16Range,
                   fmt::format("flush to 0 in f16 (<= 2^-25): {}", format_count(c[Zone::flushes_to_zero]))});
  const std::string sub = h.dtype == "f16" ? std::string("f16 subnormals")
                                           : fmt::format("{} subnormal or < 2^-64: flush", h.dtype.empty() ? "?" : h.dtype);
  lines.push_back({0, c[Zone::nan] > 0 ? colours::kNonFiniteCell : colours::kF16Range,
                   fmt::format("NaN: {}; zero: {}; sub: {} ({})", format_count(c[Zone::nan]), format_count(c[Zone::zero]),
                               format_count(h.subnormal), sub)});
  return lines;
}

// ---- Why NaN? ----

std::vector<ChainItem> chain_items(const analysis::Diagnosis& d) {
  std::vector<ChainItem> out;
  for (const auto& l : d.chain) {
    ChainItem c;
    c.step = d.step;
    c.seq = l.seq;
    c.text = fmt::format("{}{} in {}, seq {}, {}", l.phase == trace::Phase::forward ? "" : std::string(trace::phase_name(l.phase)) + " ",
                         l.op, l.module.empty() ? "(no module)" : l.module, l.seq, l.out_dtype);
    c.role = l.role;
    c.evidence = l.evidence;
    out.push_back(std::move(c));
  }
  return out;
}

DiagnosisAt diagnosis_at(const analysis::Report& report, std::int64_t step, std::int64_t seq) {
  auto link_of = [&](const analysis::Diagnosis& d) {
    for (std::size_t i = 0; i < d.chain.size(); ++i) {
      if (d.chain[i].seq == seq) return static_cast<int>(i);
    }
    return -1;
  };
  for (const auto& d : report.anomalies) {
    if (d.step == step && d.seq == seq && !d.op.empty()) return {&d, link_of(d)};
  }
  for (const auto& d : report.anomalies) {
    if (d.step != step) continue;
    if (const int i = link_of(d); i >= 0) return {&d, i};
  }
  return {};
}

std::vector<Card> why_nan_cards(const analysis::Report& report) {
  std::vector<Card> cards;
  for (const auto& d : report.anomalies) {
    Card c;
    c.kind = Card::Kind::anomaly;
    c.step = d.step;
    c.seq = d.seq;
    const std::string where = d.op.empty() ? std::string("the run")
                                           : fmt::format("{} ({})", d.module.empty() ? "(no module)" : d.module, d.op);
    c.title = fmt::format("{} in {}, step {}", d.cause, where, d.step);
    if (!d.op.empty()) {
      c.lines.push_back({"origin", fmt::format("step {}, seq {}, {} {} in {}: {} -> {}{}", d.step, d.seq,
                                               trace::phase_name(d.phase), d.op,
                                               d.module.empty() ? "(no module)" : d.module, d.in_dtypes,
                                               d.out_dtype, d.autocast.empty() ? "" : " (autocast: " + d.autocast + ")")});
    }
    c.lines.push_back({"cause", d.cause, true});
    if (!d.root_cause.empty()) {
      const analysis::ChainLink* root = d.chain.empty() ? nullptr : &d.chain.front();
      c.lines.push_back({"root cause", root == nullptr ? d.root_cause
                                                       : fmt::format("{}: {} in {}, seq {}", d.root_cause, root->op,
                                                                     root->module.empty() ? "(no module)" : root->module,
                                                                     root->seq),
                         true});
    }
    for (const auto& e : d.evidence) c.lines.push_back({"evidence", e});
    std::string spread = fmt::format("{} later ops non-finite; loss {}", d.downstream_nonfinite,
                                     d.loss_nonfinite ? "non-finite" : "finite");
    if (!d.gradients.empty()) {
      spread += fmt::format("; {} gradients with NaN/inf ({}{})", d.gradients.size(), d.gradients.front(),
                            d.gradients.size() > 1 ? ", ..." : "");
    }
    spread += fmt::format("; {} skipped steps from here", d.skipped_steps);
    c.lines.push_back({"propagation", spread});
    if (!d.absorbed_by.empty()) {
      std::string absorbed;
      for (const auto& a : d.absorbed_by) absorbed += (absorbed.empty() ? "" : ", ") + a;
      const std::int64_t wrong = d.silently_wrong + static_cast<std::int64_t>(d.absorbed_by.size());
      c.lines.push_back({"silent damage",
                         fmt::format("{} took the NaN/inf in and returned finite values: {} op output{} wrong but "
                                     "finite{}",
                                     absorbed, wrong, wrong == 1 ? " is" : "s are",
                                     d.loss_nonfinite ? "" : "; the loss does not show it"),
                         true});
    }
    if (d.occurrences > 1) {
      c.lines.push_back({"recurs", fmt::format("{} times, last at step {}", d.occurrences, d.last_step)});
    }
    if (d.remedies.empty() && !d.remedy.empty()) c.lines.push_back({"remedy", d.remedy});
    c.root_cause = d.root_cause;
    c.chain = chain_items(d);
    c.remedies = d.remedies;
    cards.push_back(std::move(c));
  }
  for (const auto& w : report.warnings) {
    Card c;
    c.kind = Card::Kind::warning;
    c.step = w.step;
    c.seq = w.seq;
    c.title = fmt::format("{}: {} {}, step {}", w.kind, w.module.empty() ? "(no module)" : w.module,
                          w.op.empty() ? w.tensor : w.op, w.step);
    c.lines.push_back({"warning", w.message});
    if (w.occurrences > 1) {
      c.lines.push_back({"recurs", fmt::format("{} times, last at step {}", w.occurrences, w.last_step)});
    }
    cards.push_back(std::move(c));
  }
  const auto& s = report.scaler;
  if (s.used || s.skipped > 0) {
    Card c;
    c.kind = Card::Kind::scaler;
    c.step = s.first_skip;
    c.title = fmt::format("GradScaler: {}", s.verdict);
    if (!s.message.empty()) c.lines.push_back({"verdict", s.message});
    c.lines.push_back({"skipped", fmt::format("{} of {} steps ({:.1f}%), longest run {}", s.skipped, s.steps,
                                              100.0 * s.skip_rate, s.longest_skip_run),
                       s.skipped > 0});
    c.lines.push_back({"scale", fmt::format("{} at the start, {} .. {}, {} at the end; {} growths, {} backoffs",
                                            format_number(s.scale_start), format_number(s.scale_min),
                                            format_number(s.scale_max), format_number(s.scale_end), s.growths,
                                            s.backoffs)});
    cards.push_back(std::move(c));
  }
  return cards;
}

// ---- Compare ----

CompareSeries compare_series(const analysis::DiffReport& d) {
  CompareSeries s;
  for (const auto& p : d.losses) {
    const double x = static_cast<double>(p.step);
    if (p.in_a) {
      s.step_a.push_back(x);
      s.loss_a.push_back(p.loss_a);
      if (p.skipped_a) s.skipped_a.push_back(x);
    }
    if (p.in_b) {
      s.step_b.push_back(x);
      s.loss_b.push_back(p.loss_b);
      if (p.skipped_b) s.skipped_b.push_back(x);
    }
  }
  return s;
}

std::string op_key_text(const analysis::OpKey& k) {
  return fmt::format("step {} {} {} {} #{}", k.step, trace::phase_name(k.phase), k.module.empty() ? "(no module)" : k.module,
                     k.op, k.occurrence);
}

std::vector<KeyValue> compare_summary(const analysis::DiffReport& d) {
  std::vector<KeyValue> rows;
  rows.push_back({"a", fmt::format("{} ({} {})", d.path_a, d.run_a.model, d.run_a.precision)});
  rows.push_back({"b", fmt::format("{} ({} {})", d.path_b, d.run_b.model, d.run_b.precision)});
  rows.push_back({"steps compared", std::to_string(d.steps_compared)});
  if (d.aligned_by_update) {
    const auto list = [](const std::vector<std::int64_t>& steps) {
      return steps.empty() ? std::string("none") : fmt::format("{}", fmt::join(steps, ", "));
    };
    rows.push_back({"paired by", fmt::format("optimizer update: calibration skips a {}, b {} (not compared)",
                                             list(d.calibration_skips_a), list(d.calibration_skips_b))});
  }
  rows.push_back({"ops aligned", format_count(d.ops_aligned)});
  rows.push_back({"losses part at", d.first_loss_divergence ? fmt::format("step {}", *d.first_loss_divergence)
                                                           : std::string("never (within the threshold)"),
                  d.first_loss_divergence.has_value()});
  if (d.first_divergence) {
    const auto& f = *d.first_divergence;
    rows.push_back({"first divergence", fmt::format("{}: {} differs by {} ({} vs {})", op_key_text(f.key), f.stat,
                                                    format_number(f.max_rel), f.dtypes_a, f.dtypes_b),
                    true});
  } else {
    rows.push_back({"first divergence", "none"});
  }
  rows.push_back({"dtype differences", std::to_string(d.dtype_differences.size()), !d.dtype_differences.empty()});
  rows.push_back({"only in a", fmt::format("{} op kinds, {} steps", d.only_in_a.size(), d.steps_only_in_a.size())});
  rows.push_back({"only in b", fmt::format("{} op kinds, {} steps", d.only_in_b.size(), d.steps_only_in_b.size())});
  return rows;
}


// ---- Precision ----

const trace::PrecisionRow* PrecisionMap::at(std::size_t row, std::size_t column) const {
  if (row >= rows.size() || column >= steps.size()) return nullptr;
  const std::int32_t i = cells[row * steps.size() + column];
  return i < 0 ? nullptr : &source[static_cast<std::size_t>(i)];
}

PrecisionMap precision_map(std::vector<trace::PrecisionRow> rows) {
  PrecisionMap m;
  if (rows.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw std::invalid_argument(fmt::format("the heatmap holds at most 2^31 - 1 precision rows; the trace has {}", rows.size()));
  }
  m.source = std::move(rows);
  // Seq order within each step: each row's occurrence among its step's rows of that module and op.
  m.by_seq.resize(m.source.size());
  std::iota(m.by_seq.begin(), m.by_seq.end(), 0u);
  std::sort(m.by_seq.begin(), m.by_seq.end(), [&](std::uint32_t a, std::uint32_t b) {
    const auto& x = m.source[a];
    const auto& y = m.source[b];
    return std::tie(x.step, x.seq) < std::tie(y.step, y.seq);
  });
  std::vector<std::int64_t> occurrence(m.source.size(), 0);
  // (phase, module, op) -> rows so far in the step
  std::map<std::tuple<trace::Phase, std::string, std::string>, std::int64_t> seen;
  for (std::size_t k = 0; k < m.by_seq.size(); ++k) {
    const auto& r = m.source[m.by_seq[k]];
    if (k == 0 || m.source[m.by_seq[k - 1]].step != r.step) seen.clear();
    occurrence[m.by_seq[k]] = seen[{r.phase, r.module, r.op}]++;
    if (m.steps.empty() || m.steps.back() != r.step) m.steps.push_back(r.step);
  }
  // The report's ranking of (op, module): rank_by_jump's order for forward rows, rank_backward's for backward.
  std::map<std::tuple<trace::Phase, std::string, std::string>, std::size_t> rank;
  const std::vector<trace::PrecisionRow> ranked = analysis::rank_by_jump(m.source);
  for (std::size_t i = 0; i < ranked.size(); ++i) rank.emplace(std::tuple{trace::Phase::forward, ranked[i].module, ranked[i].op}, i);
  const std::vector<trace::PrecisionRow> nodes = analysis::rank_backward(m.source);
  for (std::size_t i = 0; i < nodes.size(); ++i) rank.emplace(std::tuple{trace::Phase::backward, nodes[i].module, nodes[i].op}, i);
  // The rows: each distinct (phase, module, op, occurrence), forward first, ranked, then by occurrence. (A
  // backward row without local errors is not one the twin writes; rank_backward leaves it out: it goes last.)
  struct Key {
    trace::Phase phase;
    std::size_t rank;
    std::int64_t occurrence;
    std::string module, op;
    bool operator<(const Key& o) const {
      return std::tie(phase, rank, occurrence, module, op) < std::tie(o.phase, o.rank, o.occurrence, o.module, o.op);
    }
  };
  const auto key_of = [&](std::size_t i) {
    const auto& r = m.source[i];
    const auto it = rank.find({r.phase, r.module, r.op});
    return Key{r.phase, it == rank.end() ? rank.size() : it->second, occurrence[i], r.module, r.op};
  };
  std::map<Key, std::size_t> row_of;
  for (std::size_t i = 0; i < m.source.size(); ++i) row_of.emplace(key_of(i), 0);
  std::size_t n = 0;
  m.backward_begin = row_of.size();
  for (auto& [key, index] : row_of) {
    if (key.phase != trace::Phase::forward && m.backward_begin == row_of.size()) m.backward_begin = n;
    index = n++;
    PrecisionMapRow row;
    row.phase = key.phase;
    row.module = key.module;
    row.op = key.op;
    row.occurrence = key.occurrence;
    row.label = fmt::format("{}{} {} #{}", key.phase == trace::Phase::forward ? "" : "backward of ",
                            key.module.empty() ? "(no module)" : key.module, key.op, key.occurrence);
    m.rows.push_back(std::move(row));
  }
  m.cells.assign(m.rows.size() * m.steps.size(), -1);
  for (std::size_t i = 0; i < m.source.size(); ++i) {
    const auto& r = m.source[i];
    const std::size_t row = row_of.at(key_of(i));
    const std::size_t column = static_cast<std::size_t>(std::lower_bound(m.steps.begin(), m.steps.end(), r.step) - m.steps.begin());
    std::int32_t& cell = m.cells[row * m.steps.size() + column];
    if (cell < 0) cell = static_cast<std::int32_t>(i);
    if (m.rows[row].out_dtype.empty()) m.rows[row].out_dtype = r.out_dtype;
  }
  return m;
}

const trace::PrecisionRow* precision_at(const PrecisionMap& map, std::int64_t step, std::int64_t seq) {
  const auto it = std::lower_bound(map.by_seq.begin(), map.by_seq.end(), std::pair{step, seq},
                                   [&](std::uint32_t i, const std::pair<std::int64_t, std::int64_t>& key) {
                                     const auto& r = map.source[i];
                                     return std::pair{r.step, r.seq} < key;
                                   });
  if (it == map.by_seq.end()) return nullptr;
  const auto& r = map.source[*it];
  return r.step == step && r.seq == seq ? &r : nullptr;
}

double accumulated_bits(const trace::PrecisionRow& row) { return row.bits + 0.0; }  // + 0.0: never -0

double local_bits(const trace::PrecisionRow& row) {
  if (!row.local) return std::numeric_limits<double>::quiet_NaN();
  const double p = analysis::significand_bits_of(row.out_dtype);
  return row.local_max_rel == 0 ? p : std::clamp(-std::log2(row.local_max_rel), 0.0, p) + 0.0;
}

std::uint32_t bits_colour(double bits) {
  if (std::isnan(bits)) return kNoBits;
  const double step = kBitsScaleTop / 4;  // 3 bits between stops
  const double t = std::clamp(bits, 0.0, kBitsScaleTop) / step;
  const int i = std::min(3, static_cast<int>(std::floor(t)));
  const double f = t - i;
  const auto channel = [&](int shift) {
    const double a = (kBitsStops[i] >> shift) & 0xff, b = (kBitsStops[i + 1] >> shift) & 0xff;
    return static_cast<std::uint32_t>(std::lround(a + (b - a) * f));
  };
  return rgba(channel(0), channel(8), channel(16));
}

std::vector<LegendTick> bits_legend() {
  std::vector<LegendTick> ticks;
  for (int b = 0; b <= static_cast<int>(kBitsScaleTop); b += 3) {
    ticks.push_back({static_cast<double>(b), bits_colour(b), b == static_cast<int>(kBitsScaleTop) ? fmt::format("{}+", b) : fmt::format("{}", b)});
  }
  return ticks;
}

std::string precision_cell_text(const PrecisionMapRow& row, const trace::PrecisionRow& p) {
  const double lb = local_bits(p);
  if (p.phase == trace::Phase::backward) {  // an autograd node: its local error only
    return fmt::format("{}\nstep {}, seq {}, {} gradients ({} values)\nbits of agreement: local {}\nlocal relative "
                       "error: max {}, mean {}\nflips {}",
                       row.label, p.step, p.seq, p.out_dtype, format_count(p.numel), format_number(lb),
                       format_number(p.local_max_rel), format_number(p.local_mean_rel), format_count(p.flips));
  }
  return fmt::format(
      "{}\nstep {}, seq {}, {} ({} values)\nbits of agreement: accumulated {}, local {}\nmax relative error: "
      "accumulated {}, local {}\nflips {}{}",
      row.label, p.step, p.seq, p.out_dtype, format_count(p.numel), format_number(accumulated_bits(p)),
      std::isnan(lb) ? std::string("none (ran in f32)") : format_number(lb), format_number(p.acc_max_rel),
      p.local ? format_number(p.local_max_rel) : std::string("-"), format_count(p.flips),
      p.followed ? "" : "\nan input was not followed (taken as it is, widened)");
}

std::vector<KeyValue> precision_detail_rows(const trace::PrecisionRow& p) {
  std::vector<KeyValue> out;
  const double lb = local_bits(p);
  if (p.phase == trace::Phase::backward) {  // an autograd node: its backward again in f32, on its own inputs
    out.push_back({"backward", "local error of the node's gradients (its backward again in f32 on its inputs widened)"});
    out.push_back({"bits", fmt::format("{} local (of {})", format_number(lb), analysis::significand_bits_of(p.out_dtype)),
                   lb < 4});
    out.push_back({"local", fmt::format("max rel {}, mean rel {}, max {} ulp", format_number(p.local_max_rel),
                                        format_number(p.local_mean_rel), format_number(p.local_max_ulp))});
    out.push_back({"flips", format_count(p.flips), p.flips > 0});
    return out;
  }
  // What the twin computed the op in (analysis::reference_of).
  const std::string reference = analysis::reference_of(p);
  out.push_back({"reference", p.out_dtype == reference
                                  ? fmt::format("{}: the op ran in {} (on the twin's inputs)", reference, p.out_dtype)
                                  : fmt::format("{}: the op ran in {}, computed again in {}{}", reference, p.out_dtype,
                                                reference, reference == "f64" ? " (--twin-f64)" : "")});
  out.push_back({"bits", fmt::format("{} accumulated, {} local (of {})", format_number(accumulated_bits(p)),
                                     std::isnan(lb) ? std::string("none") : format_number(lb),
                                     analysis::significand_bits_of(p.out_dtype)),
                 p.bits < 4});
  if (p.local) {
    out.push_back({"local", fmt::format("max rel {}, mean rel {}, max {} ulp", format_number(p.local_max_rel),
                                        format_number(p.local_mean_rel), format_number(p.local_max_ulp))});
  } else {
    out.push_back({"local", "none: the op ran in f32 (on the twin's inputs)"});
  }
  out.push_back({"accumulated", fmt::format("max rel {}, mean rel {}, max {} ulp", format_number(p.acc_max_rel),
                                            format_number(p.acc_mean_rel), format_number(p.acc_max_ulp))});
  out.push_back({"inputs", fmt::format("max rel {}, mean rel {} (the largest among its inputs)", format_number(p.in_acc_max_rel),
                                       format_number(p.in_acc_mean_rel))});
  out.push_back({"jump", format_number(analysis::precision_jump(p))});
  out.push_back({"flips", format_count(p.flips), p.flips > 0});
  if (!std::isnan(p.cond)) out.push_back({"condition", format_number(p.cond), p.cond > 1e3});
  if (!p.followed) out.push_back({"followed", "no: an input was taken as it is, widened", true});
  return out;
}

std::vector<Bar> error_histogram_bars(const trace::PrecisionRow& p) {
  std::vector<Bar> bars;
  bars.push_back({"flip", static_cast<double>(p.flips), colours::kInfBar});
  for (int k = 0; k < trace::kErrorBins; ++k) {
    bars.push_back({k == trace::kErrorBins - 1 ? fmt::format("{}+", k) : fmt::format("{}", k),
                    static_cast<double>(p.error_bins[static_cast<std::size_t>(k)]), bits_colour(k)});
  }
  bars.push_back({"exact", static_cast<double>(p.exact), bits_colour(kBitsScaleTop)});
  return bars;
}

// ---- File browser ----

std::vector<DirEntry> list_directory(const std::filesystem::path& dir, std::string* error) {
  namespace fs = std::filesystem;
  std::vector<DirEntry> dirs, files;
  std::error_code ec;
  fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    if (error) *error = fmt::format("cannot list {}: {}", dir.string(), ec.message());
    return {};
  }
  if (error) error->clear();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::directory_entry& e = *it;
    std::error_code ec2;
    const std::string name = e.path().filename().string();
    if (!name.empty() && name[0] == '.') continue;
    if (e.is_directory(ec2)) {
      dirs.push_back({name, true, 0});
    } else if (e.path().extension() == ".h5") {
      files.push_back({name, false, e.file_size(ec2)});
    }
  }
  auto by_name = [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; };
  std::sort(dirs.begin(), dirs.end(), by_name);
  std::sort(files.begin(), files.end(), by_name);
  std::vector<DirEntry> out;
  const fs::path abs = fs::absolute(dir, ec);
  if (abs.has_relative_path()) out.push_back({"..", true, 0});
  out.insert(out.end(), dirs.begin(), dirs.end());
  out.insert(out.end(), files.begin(), files.end());
  return out;
}

std::int64_t paired_step_b(const analysis::DiffReport* report, std::int64_t step) {
  if (report == nullptr || !report->aligned_by_update) return step;
  for (const analysis::LossPoint& p : report->losses) {
    if (p.step == step && p.in_a && p.in_b) return p.step_b;
  }
  return step;
}

double loss_scale_at(std::span<const trace::StepRow> steps, std::int64_t step) {
  double scale = 1;
  std::int64_t best = std::numeric_limits<std::int64_t>::min();
  for (const trace::StepRow& r : steps) {
    if (r.step == step) return r.scale;
    if (r.step < step && r.step > best) {
      best = r.step;
      scale = r.scale_after;
    }
  }
  return scale;
}

// ---- Ranks of a data-parallel run ----

OpenPlan open_plan(const std::vector<std::string>& names) {
  OpenPlan plan;
  if (names.size() >= 3) {
    plan.ranks = names;
    return plan;
  }
  if (names.size() == 1) {
    plan.ranks = analysis::rank_siblings(names);
    if (plan.ranks.empty()) {
      plan.a = names.front();
      return plan;
    }
    // A rank's own file: show that rank (the run's --out name, which is no file: rank 0).
    std::error_code ec;
    for (std::size_t i = 0; i < plan.ranks.size(); ++i)
      if (std::filesystem::equivalent(plan.ranks[i], names.front(), ec)) plan.shown = i;
    return plan;
  }
  if (names.size() == 2) {
    const std::vector<std::string> x = analysis::rank_siblings({names[0]}), y = analysis::rank_siblings({names[1]});
    bool same = !x.empty() && x.size() == y.size();
    for (std::size_t i = 0; same && i < x.size(); ++i) {
      std::error_code ec;
      same = std::filesystem::equivalent(x[i], y[i], ec);
    }
    std::error_code ec;
    if (same && !std::filesystem::equivalent(names[0], names[1], ec)) {
      plan.ranks = names;
      return plan;
    }
    plan.a = names[0];
    plan.b = names[1];
  }
  return plan;
}

std::uint32_t rank_colour(int rank) {
  const int n = static_cast<int>(std::size(kRankColours));
  return kRankColours[((rank % n) + n) % n];
}

std::vector<RankLine> rank_lines(std::span<const RankSteps> ranks) {
  std::vector<RankLine> out;
  out.reserve(ranks.size());
  for (const RankSteps& r : ranks)
    out.push_back({.rank = r.rank, .label = fmt::format("rank {}", r.rank), .colour = rank_colour(r.rank),
                   .series = step_series(r.steps)});
  return out;
}

std::string rank_item_label(const RankItem& item) {
  if (!item.report) return fmt::format("rank {}{}", item.rank, item.analysing ? ": analysing" : "");
  const std::size_t n = item.report->anomalies.size();
  if (n == 0) return fmt::format("rank {}: healthy", item.rank);
  return fmt::format("rank {}: {} anomal{}", item.rank, n, n == 1 ? "y" : "ies");
}

// ---- FP8 ----

namespace {
int operand_rank(std::string_view operand) { return operand == "input" ? 0 : operand == "weight" ? 1 : 2; }
}  // namespace

Fp8Map fp8_map(std::vector<trace::Fp8Row> rows) {
  Fp8Map m;
  // Rows in step order, the trace's order within a step (stable), so "first appearance" is the model's order.
  std::stable_sort(rows.begin(), rows.end(), [](const trace::Fp8Row& a, const trace::Fp8Row& b) { return a.step < b.step; });
  std::map<std::string, std::size_t> module_order;
  std::map<std::int64_t, std::size_t> step_column;
  for (const trace::Fp8Row& r : rows) {
    module_order.emplace(r.module, module_order.size());
    step_column.emplace(r.step, 0);
  }
  // The map's rows: (module order, operand rank) -> row index.
  std::map<std::pair<std::size_t, int>, std::size_t> row_of;
  for (const trace::Fp8Row& r : rows) row_of.emplace(std::pair{module_order.at(r.module), operand_rank(r.operand)}, 0);
  for (auto& [key, index] : row_of) {
    index = m.rows.size();
    m.rows.emplace_back();
  }
  for (const trace::Fp8Row& r : rows) {
    Fp8MapRow& row = m.rows[row_of.at({module_order.at(r.module), operand_rank(r.operand)})];
    if (row.label.empty()) row = {r.module, r.operand, r.format, fmt::format("{} {} [{}]", r.module, r.operand, r.format)};
  }
  for (auto& [step, column] : step_column) {
    column = m.steps.size();
    m.steps.push_back(step);
  }
  m.cells.assign(m.rows.size() * m.steps.size(), -1);
  for (trace::Fp8Row& r : rows) {
    const std::size_t cell = row_of.at({module_order.at(r.module), operand_rank(r.operand)}) * m.steps.size() +
                             step_column.at(r.step);
    if (m.cells[cell] < 0) {
      m.cells[cell] = static_cast<std::int32_t>(m.source.size());
      m.source.push_back(std::move(r));
      continue;
    }
    trace::Fp8Row& into = m.source[static_cast<std::size_t>(m.cells[cell])];
    into.numel += r.numel;
    into.nonzero += r.nonzero;
    into.underflow += r.underflow;
    into.subnormal += r.subnormal;
    into.saturated += r.saturated;
    into.amax = std::fmax(into.amax, r.amax);
    into.rel_rms_error = std::max(into.rel_rms_error, r.rel_rms_error);
    into.scale = r.scale;
    into.dynamic_range = r.dynamic_range;
    into.quantized_dynamic_range = r.quantized_dynamic_range;
    into.history_len = r.history_len;
    into.history_amax = r.history_amax;
    into.history_amax_step = r.history_amax_step;
  }
  return m;
}

const trace::Fp8Row* Fp8Map::at(std::size_t row, std::size_t column) const {
  if (row >= rows.size() || column >= steps.size()) return nullptr;
  const std::int32_t i = cells[row * steps.size() + column];
  return i < 0 ? nullptr : &source[static_cast<std::size_t>(i)];
}

double Fp8Map::fraction(std::size_t row, std::size_t column, Fp8Measure measure) const {
  const trace::Fp8Row* r = at(row, column);
  if (!r) return std::numeric_limits<double>::quiet_NaN();
  return trace::fp8_fraction(measure == Fp8Measure::underflow ? r->underflow : r->saturated, r->nonzero);
}

bool has_fp8_panel(const trace::RowCounts& counts) { return counts.fp8 > 0; }

std::optional<std::size_t> fp8_column(const Fp8Map& map, std::int64_t step) {
  const auto it = std::lower_bound(map.steps.begin(), map.steps.end(), step);
  if (it == map.steps.end() || *it != step) return std::nullopt;
  return static_cast<std::size_t>(it - map.steps.begin());
}

std::optional<std::size_t> fp8_row(const Fp8Map& map, std::string_view module, std::string_view operand) {
  for (std::size_t i = 0; i < map.rows.size(); ++i)
    if (map.rows[i].module == module && map.rows[i].operand == operand) return i;
  return std::nullopt;
}

std::uint32_t fraction_colour(double fraction) {
  if (std::isnan(fraction)) return kFp8NoRow;
  if (fraction <= 0) return kFp8Nothing;
  const double t = std::clamp(std::log10(fraction) + 5.0, 0.0, 5.0);  // 1e-5 -> 0, 1 -> 5
  const int i = std::min(4, static_cast<int>(std::floor(t)));
  const double f = t - i;
  const auto channel = [&](int shift) {
    const double a = (kFractionStops[i] >> shift) & 0xff, b = (kFractionStops[i + 1] >> shift) & 0xff;
    return static_cast<std::uint32_t>(std::lround(a + (b - a) * f));
  };
  return rgba(channel(0), channel(8), channel(16));
}

std::vector<FractionTick> fraction_legend() {
  std::vector<FractionTick> ticks{{0.0, kFp8Nothing, "0"}};
  for (int e = -5; e <= 0; ++e) {
    const double f = std::pow(10.0, e);
    ticks.push_back({f, fraction_colour(f), e == 0 ? std::string("1") : fmt::format("1e{}", e)});
  }
  return ticks;
}

Fp8OperandSeries fp8_operand_series(const Fp8Map& map, std::size_t row) {
  Fp8OperandSeries out;
  for (std::size_t c = 0; c < map.steps.size(); ++c) {
    const trace::Fp8Row* r = map.at(row, c);
    if (!r) continue;
    out.step.push_back(static_cast<double>(map.steps[c]));
    out.scale.push_back(r->scale);
    out.amax.push_back(r->amax);
    // The history's amax only where the trace holds it (and the recipe keeps one): NaN leaves a gap.
    out.history_amax.push_back(trace::fp8_has_range_columns(*r) && r->history_len > 0
                                   ? r->history_amax
                                   : std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

namespace {
std::string percent(std::int64_t count, std::int64_t nonzero) {
  return fmt::format("{} of {} ({}%)", format_count(count), format_count(nonzero),
                     format_number(100.0 * trace::fp8_fraction(count, nonzero)));
}
std::string history_text(const trace::Fp8Row& r) {
  if (!trace::fp8_has_range_columns(r)) return "not recorded (a trace written before these columns)";
  if (r.history_len == 0) return "none (current scaling)";
  if (r.history_amax == 0) return fmt::format("no amax this step: the scale is kept ({}-step history)", r.history_len);
  return fmt::format("next scale from amax {}{} ({}-step history)", format_number(r.history_amax),
                     r.history_amax_step >= 0 ? fmt::format(" of step {}", r.history_amax_step) : std::string(),
                     r.history_len);
}
}  // namespace

std::string fp8_cell_text(const Fp8MapRow& row, const trace::Fp8Row& r) {
  std::string text = fmt::format("{}\nstep {}, {} values\nunderflow {}\nsaturated {}\nscale {}, amax {}", row.label,
                                 r.step, format_count(r.numel), percent(r.underflow, r.nonzero),
                                 percent(r.saturated, r.nonzero), format_number(r.scale), format_number(r.amax));
  if (trace::fp8_has_range_columns(r)) {
    text += fmt::format("\ndynamic range {} binades ({} after the cast)\n{}", format_number(r.dynamic_range),
                        format_number(r.quantized_dynamic_range), history_text(r));
  }
  return text;
}

std::vector<KeyValue> fp8_detail_rows(const trace::Fp8Row& r) {
  std::vector<KeyValue> out;
  out.push_back({"operand", fmt::format("{} {} [{}], step {}", r.module, r.operand, r.format, r.step)});
  out.push_back({"values", fmt::format("{} ({} nonzero)", format_count(r.numel), format_count(r.nonzero))});
  out.push_back({"underflow", percent(r.underflow, r.nonzero), r.underflow > 0});
  out.push_back({"subnormal", percent(r.subnormal, r.nonzero)});
  out.push_back({"saturated", percent(r.saturated, r.nonzero), r.saturated > 0});
  out.push_back({"scale", format_number(r.scale)});
  out.push_back({"amax", format_number(r.amax)});
  out.push_back({"rms error", format_number(r.rel_rms_error)});
  out.push_back({"dynamic range", trace::fp8_has_range_columns(r)
                                      ? fmt::format("{} binades, {} after the cast", format_number(r.dynamic_range),
                                                    format_number(r.quantized_dynamic_range))
                                      : std::string("not recorded")});
  out.push_back({"history", history_text(r)});
  return out;
}

// ---- Block-scaled formats ----

BlockMap block_map(std::vector<trace::BlockRow> rows) {
  BlockMap m;
  std::stable_sort(rows.begin(), rows.end(), [](const trace::BlockRow& a, const trace::BlockRow& b) { return a.step < b.step; });
  std::map<std::string, std::size_t> module_order;
  std::map<std::int64_t, std::size_t> step_column;
  for (const trace::BlockRow& r : rows) {
    module_order.emplace(r.module, module_order.size());
    step_column.emplace(r.step, 0);
  }
  using Key = std::tuple<std::size_t, int, int, int, bool>;
  const auto key_of = [&](const trace::BlockRow& r) {
    return Key{module_order.at(r.module), operand_rank(r.operand), r.copy == "rowwise" ? 0 : 1, r.format == "mxfp8" ? 0 : 1,
               r.what_if};
  };
  std::map<Key, std::size_t> row_of;
  for (const trace::BlockRow& r : rows) row_of.emplace(key_of(r), 0);
  for (auto& [key, index] : row_of) {
    index = m.rows.size();
    m.rows.emplace_back();
  }
  for (const trace::BlockRow& r : rows) {
    BlockMapRow& row = m.rows[row_of.at(key_of(r))];
    if (row.label.empty()) {
      row = {r.module, r.operand, r.copy, r.format, r.what_if,
             fmt::format("{} {} {} [{}{}]", r.module, r.operand, r.copy, r.format, r.what_if ? " what-if" : "")};
    }
  }
  for (auto& [step, column] : step_column) {
    column = m.steps.size();
    m.steps.push_back(step);
  }
  m.cells.assign(m.rows.size() * m.steps.size(), -1);
  for (trace::BlockRow& r : rows) {
    const std::size_t cell = row_of.at(key_of(r)) * m.steps.size() + step_column.at(r.step);
    if (m.cells[cell] < 0) {
      m.cells[cell] = static_cast<std::int32_t>(m.source.size());
      m.source.push_back(std::move(r));
      continue;
    }
    trace::BlockRow& into = m.source[static_cast<std::size_t>(m.cells[cell])];
    into.numel += r.numel;
    into.nonzero += r.nonzero;
    into.nonfinite += r.nonfinite;
    into.underflow += r.underflow;
    into.saturated += r.saturated;
    into.blocks += r.blocks;
    into.blocks_clipped += r.blocks_clipped;
    into.blocks_nan += r.blocks_nan;
    if (r.max_range_block >= 0 && (into.max_range_block < 0 || r.max_block_range > into.max_block_range)) {
      into.max_block_range = r.max_block_range;
      into.max_range_block = r.max_range_block;
      into.max_range_row = r.max_range_row;
      into.max_range_col = r.max_range_col;
    }
    if (r.worst_block_underflow > into.worst_block_underflow) {
      into.worst_block = r.worst_block;
      into.worst_block_underflow = r.worst_block_underflow;
      into.worst_block_row = r.worst_block_row;
      into.worst_block_col = r.worst_block_col;
    }
    if (!std::isnan(r.scale_log2_min)) {
      if (!(into.scale_log2_min <= r.scale_log2_min)) into.scale_log2_min = r.scale_log2_min;
      if (!(into.scale_log2_max >= r.scale_log2_max)) into.scale_log2_max = r.scale_log2_max;
      into.scale_log2_median = r.scale_log2_median;
    }
    into.rel_rms_error = std::max(into.rel_rms_error, r.rel_rms_error);
  }
  return m;
}

const trace::BlockRow* BlockMap::at(std::size_t row, std::size_t column) const {
  if (row >= rows.size() || column >= steps.size()) return nullptr;
  const std::int32_t i = cells[row * steps.size() + column];
  return i < 0 ? nullptr : &source[static_cast<std::size_t>(i)];
}

double BlockMap::fraction(std::size_t row, std::size_t column, Fp8Measure measure) const {
  const trace::BlockRow* r = at(row, column);
  if (!r) return std::numeric_limits<double>::quiet_NaN();
  return trace::block_fraction(measure == Fp8Measure::underflow ? r->underflow : r->saturated, r->nonzero);
}

bool has_blocks_panel(const trace::RowCounts& counts) { return counts.blocks > 0; }

namespace {
std::string block_place_text(std::int64_t block, std::int64_t row, std::int64_t col) {
  if (block < 0) return "none";
  if (row < 0) return fmt::format("block {} (not placed)", block);
  return fmt::format("block {} at row {}, col {}", block, row, col);
}
std::string scales_text(const trace::BlockRow& r) {
  if (std::isnan(r.scale_log2_median)) return "none (no block with a scale)";
  return fmt::format("2^{} .. 2^{}, median 2^{}", format_number(r.scale_log2_min), format_number(r.scale_log2_max),
                     format_number(r.scale_log2_median));
}
}  // namespace

std::string block_cell_text(const BlockMapRow& row, const trace::BlockRow& r) {
  const char* u = r.what_if ? "would underflow" : "underflow";
  const char* sat = r.what_if ? "would saturate" : "saturated";
  return fmt::format("{}\nstep {}, {} x {} values, {} blocks\n{} {}\n{} {}\nwidest block {} binades: {}\nscales {}", row.label,
                     r.step, format_count(r.rows), format_count(r.cols), format_count(r.blocks), u,
                     percent(r.underflow, r.nonzero), sat, percent(r.saturated, r.nonzero), format_number(r.max_block_range),
                     block_place_text(r.max_range_block, r.max_range_row, r.max_range_col), scales_text(r));
}

std::vector<KeyValue> block_detail_rows(const trace::BlockRow& r) {
  std::vector<KeyValue> out;
  out.push_back({"copy", fmt::format("{} {} {} [{}{}], step {}", r.module, r.operand, r.copy, r.format,
                                     r.what_if ? ", what-if: measured only" : "", r.step)});
  out.push_back({"values", fmt::format("{} x {} ({} nonzero, {} NaN/inf)", format_count(r.rows), format_count(r.cols),
                                       format_count(r.nonzero), format_count(r.nonfinite)),
                 r.nonfinite > 0});
  out.push_back({r.what_if ? "would underflow" : "underflow", percent(r.underflow, r.nonzero), r.underflow > 0});
  out.push_back({r.what_if ? "would saturate" : "saturated", percent(r.saturated, r.nonzero), r.saturated > 0});
  out.push_back({"blocks", fmt::format("{} ({} clipped, {} NaN)", format_count(r.blocks), format_count(r.blocks_clipped),
                                       format_count(r.blocks_nan))});
  out.push_back({"widest block", fmt::format("{} binades, {}", format_number(r.max_block_range),
                                             block_place_text(r.max_range_block, r.max_range_row, r.max_range_col))});
  out.push_back({"most lost", r.worst_block < 0 ? std::string("none")
                                                : fmt::format("{} lost, {}", format_count(r.worst_block_underflow),
                                                              block_place_text(r.worst_block, r.worst_block_row, r.worst_block_col)),
                 r.worst_block >= 0});
  out.push_back({"scales", scales_text(r)});
  out.push_back({"rms error", format_number(r.rel_rms_error)});
  return out;
}

}  // namespace ampscope::viewer
