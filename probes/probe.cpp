#include "probes/probe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fnmatch.h>

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "core/autocast.h"
#include "core/error.h"
#include "probes/analysis/op_traits.h"

namespace ampscope::probe {
namespace {

trace::Phase to_trace_phase(Phase phase) {
  switch (phase) {
    case Phase::forward: return trace::Phase::forward;
    case Phase::backward: return trace::Phase::backward;
    case Phase::optimizer: return trace::Phase::optimizer;
    case Phase::scaler: return trace::Phase::scaler;
  }
  return trace::Phase::forward;
}

bool glob_matches(const std::vector<std::string>& patterns, std::string_view text) {
  if (patterns.empty()) return true;
  const std::string s(text);
  for (const std::string& p : patterns) {
    if (fnmatch(p.c_str(), s.c_str(), 0) == 0) return true;
  }
  return false;
}

// "fc1" for "fc1.weight", "" for an unnamed or top-level parameter.
std::string_view parameter_module(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : name.substr(0, dot);
}

double largest_finite(DType dtype) {
  switch (dtype) {
    case DType::f16: return kF16Max;
    case DType::bf16: return kBF16Max;
    case DType::f32: return std::numeric_limits<float>::max();
    case DType::f64: return std::numeric_limits<double>::max();
    default: return 0;
  }
}

double smallest_subnormal(DType dtype) {
  switch (dtype) {
    case DType::f16: return kF16MinSubnormal;
    case DType::bf16: return std::ldexp(1.0, -133);
    case DType::f32: return std::numeric_limits<float>::denorm_min();
    case DType::f64: return std::numeric_limits<double>::denorm_min();
    default: return 0;
  }
}

// "2 NaN, 3 +inf"
std::string count_text(std::int64_t nan, std::int64_t pos_inf, std::int64_t neg_inf) {
  std::string out;
  auto add = [&](std::int64_t n, std::string_view what) {
    if (n == 0) return;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", n, what);
  };
  add(nan, "NaN");
  add(pos_inf, "+inf");
  add(neg_inf, "-inf");
  return out;
}

std::string count_text(const trace::TensorHealth& h) { return count_text(h.nan, h.pos_inf, h.neg_inf); }

std::string where(const std::string& scope) { return scope.empty() ? std::string() : " in '" + scope + "'"; }

// shape_str's text ("[128, 256]", "[]": fmt's join of the sizes with ", "), written without fmt's formatting
// machinery: it runs for every op row.
std::string shape_text(const Shape& shape) {
  std::string out;
  out.reserve(2 + shape.size() * 6);
  out += '[';
  char digits[24];
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, shape[i]);
    out.append(digits, end);
  }
  out += ']';
  return out;
}

// The row of an op as level dtype records it (its input producers aside, Probe::input_producers): step, seq,
// phase, op, module, input and output dtypes, shape and autocast's reason.
trace::OpRow op_row(const OpEvent& e, trace::Phase phase) {
  trace::OpRow row;
  row.step = e.step;
  row.seq = e.seq;
  row.phase = phase;
  row.op = std::string(e.op);
  row.module = e.scope;
  for (const Tensor& t : e.inputs) {
    if (!t.defined()) continue;
    if (!row.in_dtypes.empty()) row.in_dtypes += ',';
    row.in_dtypes += dtype_name(t.dtype());
  }
  if (e.output.defined()) {
    row.out_dtype = dtype_name(e.output.dtype());
    row.shape = shape_text(e.output.shape());
  }
  row.autocast = e.autocast.reason;
  return row;
}

// Frees a written step's rows (clear() would keep the capacity for the recorder's whole life).
template <class T>
void clear_rows(std::vector<T>& rows) {
  std::vector<T>().swap(rows);
}

}  // namespace

std::string describe(const ProbeOptions& o) {
  nlohmann::ordered_json j;
  j["level"] = std::string(level_name(o.level));
  j["ops"] = o.ops;
  j["modules"] = o.modules;
  j["every"] = o.every;
  j["flight_recorder"] = o.flight_recorder;
  j["recorder_steps"] = o.recorder_steps;
  j["outside_steps"] = o.outside_steps;
  if (o.checksums) j["checksums"] = true;  // format_version 6; absent when off, as in older traces
  nlohmann::ordered_json overrides = nlohmann::ordered_json::array();
  for (const AutocastOverride& r : autocast_overrides()) {
    overrides.push_back({{"op", r.op}, {"module", r.module}, {"precision", r.precision == Precision::f32 ? "f32" : "lower"}});
  }
  j["autocast_overrides"] = std::move(overrides);
  return j.dump();
}

std::string_view level_name(Level level) {
  switch (level) {
    case Level::off: return "off";
    case Level::dtype: return "dtype";
    case Level::health: return "health";
    case Level::full: return "full";
  }
  return "?";
}

const std::vector<std::string_view>& level_names() {
  static const std::vector<std::string_view> names{"off", "dtype", "health", "full"};
  return names;
}

Level parse_level(std::string_view name) {
  for (Level level : {Level::off, Level::dtype, Level::health, Level::full}) {
    if (level_name(level) == name) return level;
  }
  throw Error(fmt::format("unknown probe level '{}' (known levels: {})", name, fmt::join(level_names(), ", ")));
}

Probe::Probe(std::shared_ptr<trace::Sink> sink, ProbeOptions options)
    : sink_(std::move(sink)), options_(std::move(options)) {
  if (!sink_) throw Error("Probe: no sink given\nhint: pass a trace::Sink, for example a trace::TraceWriter");
  if (options_.every < 1) {
    throw Error(
        fmt::format("Probe: every must be at least 1, got {}\nhint: every = 1 records every step", options_.every));
  }
  if (options_.recorder_steps < 1) {
    throw Error(
        fmt::format("Probe: recorder_steps must be at least 1 (the current step), got {}", options_.recorder_steps));
  }
  if (options_.dump_max_elements < 0) {
    throw Error(fmt::format("Probe: dump_max_elements must not be negative, got {}\nhint: 0 dumps no values",
                            options_.dump_max_elements));
  }
  recording_ = options_.level != Level::off && options_.outside_steps;
}

Probe::~Probe() {
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; flush() called by the owner reports the error.
  }
}

bool Probe::selected(std::int64_t step) const { return (step % options_.every + options_.every) % options_.every == 0; }

bool Probe::module_wanted(std::string_view module) const { return glob_matches(options_.modules, module); }

bool Probe::wants_op(std::string_view op, const std::string& scope) {
  return recording_ && glob_matches(options_.ops, op) && glob_matches(options_.modules, scope);
}

Probe::StepRecord* Probe::record_for(std::int64_t step) { return open_ && step == step_ ? &recent_.back() : nullptr; }

void Probe::emit(trace::OpRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->ops.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::GradRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->grads.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::UpdateRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->updates.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::Fp8Row row) {
  if (StepRecord* r = record_for(row.step)) {
    r->fp8.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::BlockRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->blocks.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::HistogramRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->histograms.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit(trace::DumpRow row) {
  if (StepRecord* r = record_for(row.step)) {
    r->dumps.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::emit_event(trace::EventRow row, bool anomaly) {
  if (StepRecord* r = record_for(row.step)) {
    r->anomalous = r->anomalous || anomaly;
    r->events.push_back(std::move(row));
  } else {
    sink_->write(row);
  }
}

void Probe::mark_anomaly(std::int64_t step) {
  if (StepRecord* r = record_for(step)) r->anomalous = true;
}

void Probe::on_op(const OpEvent& event) {
  if (recording_) record_op(event, trace::Phase::forward);
}

void Probe::on_backward_op(const OpEvent& event) {
  if (recording_) record_op(event, to_trace_phase(event.phase));
}

// Which rows produced the op's inputs (trace::OpRow::inputs). An input autocast cast is named by the
// producer of what was cast: the cast is part of this op's row, not a row of its own.
std::array<std::int64_t, trace::kOpInputs> Probe::input_producers(const OpEvent& e) const {
  std::array<std::int64_t, trace::kOpInputs> out;
  out.fill(trace::kInputNone);
  for (std::size_t i = 0; i < e.inputs.size() && i < out.size(); ++i) {
    const Tensor* t = &e.inputs[i];  // not a copy: no reference count touched per input
    for (const CastRecord& c : e.autocast.casts) {
      if (c.input == static_cast<int>(i) && c.source.defined()) t = &c.source;
    }
    if (!t->defined()) continue;
    if (t->is_leaf() && t->requires_grad()) {
      out[i] = trace::kInputParameter;
      continue;
    }
    const auto [step, seq] = t->producer();
    if (seq == Producer::none) {
      out[i] = trace::kInputData;
    } else if (step != e.step) {
      out[i] = trace::kInputOtherStep;  // kept from an earlier step, or prepared outside any step
    } else if (seq == Producer::summed) {
      out[i] = trace::kInputSummed;
    } else if (seq >= 0) {
      out[i] = seq;
    } else {
      out[i] = trace::kInputUnrecorded;  // an op of this step the probe skipped
    }
  }
  return out;
}

void Probe::record_op(const OpEvent& e, trace::Phase phase) {
  const std::array<std::int64_t, trace::kOpInputs> producers = input_producers(e);
  // A CPU run never builds the lists below: its op's output is on the host and no queue was made.
  const bool off_host = deferred_ || (e.output.defined() && !e.output.device().is_cpu());
  if (off_host && options_.level != Level::dtype && record_for(e.step) != nullptr) {
    // The tensors whose statistics the op's rows need (a superset: the anomaly rule reads the inputs only
    // when an output holds NaN/inf): queued on the device when they live there.
    std::vector<Tensor> tensors = e.inputs;
    tensors.insert(tensors.end(), e.outputs.begin(), e.outputs.end());
    for (const CastRecord& c : e.autocast.casts) {
      tensors.push_back(c.source);
      tensors.push_back(c.result);
    }
    if (queue_for(tensors) != nullptr) {
      const bool full = options_.level == Level::full;
      std::vector<std::pair<Tensor, bool>> wanted;
      for (const Tensor& t : e.outputs) {
        if (t.defined()) wanted.emplace_back(t, full && is_floating(t.dtype()));
      }
      for (std::size_t i = 0; i < e.inputs.size(); ++i) {
        const Tensor& t = e.inputs[i];
        const bool cast_input = i == 0 && analysis::op_kind(e.op) == analysis::OpKind::cast;  // count_casts
        if (t.defined() && (is_floating(t.dtype()) || cast_input)) wanted.emplace_back(t, false);
      }
      for (const CastRecord& c : e.autocast.casts) {
        if (c.source.defined()) wanted.emplace_back(c.source, false);
        if (c.result.defined()) wanted.emplace_back(c.result, false);
      }
      Pending p;
      p.op = std::string(e.op);
      p.scope = e.scope;
      p.index = e.index;
      p.step = e.step;
      p.seq = e.seq;
      p.phase = phase;
      p.core_phase = e.phase;
      p.autocast = e.autocast;
      p.inputs = e.inputs;
      p.outputs = e.outputs;
      p.output = e.output;
      p.producers = producers;
      if (defer(std::move(p), wanted)) return;
    }
  }
  drain();  // an op read at once comes after the ops still pending (nothing to do on a CPU run)
  record_op(e, phase, producers);
}

void Probe::record_op(const OpEvent& e, trace::Phase phase, const std::array<std::int64_t, trace::kOpInputs>& producers) {
  trace::OpRow row = op_row(e, phase);
  row.inputs = producers;
  if (options_.level == Level::dtype) {
    emit(std::move(row));
    return;
  }

  // ---- health: one pass over every output ----
  const bool full = options_.level == Level::full;
  const bool backward = phase == trace::Phase::backward;
  const OutputStats out = output_stats(e, full);
  row.health = out.primary >= 0 ? out.health[static_cast<std::size_t>(out.primary)] : stats_of(Tensor(), false).health;

  // ---- casts: what they overflowed and flushed ----
  std::vector<trace::EventRow> events;
  bool anomaly = count_casts(e, backward, row, events);

  // ---- anomalies: did this op create the non-finite values, or pass them on? ----
  anomaly |= judge_nonfinite(e, phase, out, row, events);

  // ---- full: exponent histograms ----
  if (full) {
    for (std::size_t i = 0; i < e.outputs.size(); ++i) {
      if (!e.outputs[i].defined() || !is_floating(e.outputs[i].dtype())) continue;
      emit(trace::HistogramRow{e.step, e.seq, static_cast<int>(i) == out.primary ? "output" : fmt::format("output {}", i),
                               out.histograms[i]});
    }
  }

  emit(std::move(row));
  for (trace::EventRow& ev : events) {
    const bool is_anomaly = ev.kind != "cast_underflow";
    emit_event(std::move(ev), is_anomaly);
  }
  if (anomaly) mark_anomaly(e.step);
}

Probe::OutputStats Probe::output_stats(const OpEvent& e, bool histograms) {
  OutputStats out;
  out.health.resize(e.outputs.size());
  if (histograms) out.histograms.resize(e.outputs.size());
  for (std::size_t i = 0; i < e.outputs.size(); ++i) {
    const Tensor& t = e.outputs[i];
    if (!t.defined()) continue;
    if (histograms && is_floating(t.dtype())) {
      const TensorStats s = stats_of(t, true);
      out.health[i] = s.health;
      out.histograms[i] = s.histogram;
    } else {
      out.health[i] = plain_stats_of(t).health;  // a non-floating output has no histogram row
    }
    const trace::TensorHealth& h = out.health[i];
    if (out.primary < 0) out.primary = static_cast<int>(i);
    out.nan += h.nan;
    out.pos_inf += h.pos_inf;
    out.neg_inf += h.neg_inf;
  }
  return out;
}

bool Probe::count_casts(const OpEvent& e, bool backward, trace::OpRow& row, std::vector<trace::EventRow>& events) {
  bool anomaly = false;
  auto count_cast = [&](const Tensor& source, const Tensor& result, const std::string& which) {
    const CastCounts c = casts_of(source, result);
    row.cast_overflow += c.overflow;
    row.cast_underflow += c.underflow;
    counters_.cast_overflow += c.overflow;
    counters_.cast_underflow += c.underflow;
    const std::string_view from = dtype_name(source.dtype()), to = dtype_name(result.dtype());
    if (c.overflow > 0) {
      anomaly = true;
      events.push_back({e.step, e.seq, "cast_overflow", row.op, row.module,
                        fmt::format("{} finite value{} became inf casting {} from {} to {} (source absmax {:.6g}; the "
                                    "largest finite {} is {:.6g})",
                                    c.overflow, c.overflow == 1 ? "" : "s", which, from, to,
                                    stats_of(source, false).health.absmax, to, largest_finite(result.dtype()))});
    }
    if (c.underflow > 0) {
      events.push_back({e.step, e.seq, "cast_underflow", row.op, row.module,
                        fmt::format("{} non-zero value{} became zero casting {} from {} to {} (the smallest non-zero "
                                    "{} is {:.3g})",
                                    c.underflow, c.underflow == 1 ? "" : "s", which, from, to, to,
                                    smallest_subnormal(result.dtype()))});
    }
  };
  // The op's table lookup last: most ops keep their input's dtype.
  if (!e.inputs.empty() && e.inputs[0].defined() && e.output.defined() && e.inputs[0].dtype() != e.output.dtype() &&
      analysis::op_kind(e.op) == analysis::OpKind::cast && e.inputs[0].shape() == e.output.shape()) {
    count_cast(e.inputs[0], e.output, backward ? "the gradient in the backward of to" : "the input of to");
  }
  for (const CastRecord& c : e.autocast.casts) {
    // A cast from the weight-cast cache was counted at the op that made it.
    if (c.from_cache || !c.source.defined() || !c.result.defined()) continue;
    count_cast(c.source, c.result, fmt::format("input {} of {} (autocast)", c.input, row.op));
  }
  return anomaly;
}

std::vector<Probe::JudgedInput> Probe::judged_inputs(const OpEvent& e, bool backward, const trace::OpRow& row) {
  std::vector<JudgedInput> inputs;
  const StepRecord* record = record_for(e.step);
  for (std::size_t i = 0; i < e.inputs.size(); ++i) {
    Tensor t = e.inputs[i];
    if (!t.defined() || !is_floating(t.dtype())) continue;
    std::string label = backward ? "the incoming gradient" : fmt::format("input {}", i);
    for (const CastRecord& c : e.autocast.casts) {
      if (c.input == static_cast<int>(i) && c.source.defined()) {
        t = c.source;  // judged before autocast's cast: an overflowing cast makes this op the origin
        label += " before autocast";
      }
    }
    JudgedInput in{std::move(label), stats_of(t, false)};
    const std::int64_t from = i < row.inputs.size() ? row.inputs[i] : trace::kInputNone;
    if (!backward && record != nullptr && from >= 0 && in.stats.health.nan == 0 && in.stats.health.pos_inf == 0) {
      for (const trace::OpRow& o : record->ops)
        if (o.seq == from && analysis::op_has(o.op, analysis::OpFlag::mask_neg_inf)) in.mask = true;
    }
    inputs.push_back(std::move(in));
  }
  return inputs;
}

bool Probe::judge_nonfinite(const OpEvent& e, trace::Phase phase, const OutputStats& out, trace::OpRow& row,
                            std::vector<trace::EventRow>& events) {
  const bool backward = phase == trace::Phase::backward;
  const std::int64_t out_nan = out.nan, out_pos_inf = out.pos_inf;
  if (out_nan + out_pos_inf + out.neg_inf == 0) return false;  // all finite (the op's table lookup below skipped)
  // A mask's fill writes -inf on purpose (masked_fill, attention's causal mask): that is the mask, not an
  // overflow; only its NaN and +inf count.
  const bool intended_neg_inf = !backward && analysis::op_has(row.op, analysis::OpFlag::mask_neg_inf);
  const std::int64_t out_neg_inf = intended_neg_inf ? 0 : out.neg_inf;
  if (out_nan + out_pos_inf + out_neg_inf == 0) return false;
  const std::vector<JudgedInput> inputs = judged_inputs(e, backward, row);
  // NaN (and nothing else) made from a mask's -inf, a fully masked row through softmax (0 / 0), is made
  // here: this op is its origin. An op that only passes the -inf on (-inf out) is not.
  const bool nan_from_mask = out_nan > 0 && out_pos_inf + out_neg_inf == 0;
  const JudgedInput* first_bad = nullptr;
  for (const JudgedInput& in : inputs) {
    if (in.stats.non_finite() > 0 && !(in.mask && nan_from_mask)) {
      first_bad = &in;
      break;
    }
  }
  const std::string counts = count_text(out_nan, out_pos_inf, out_neg_inf);
  const std::string shape_text = fmt::format("{} {}", row.out_dtype, row.shape);
  const std::string subject =
      backward ? fmt::format("the gradients computed by the backward of {}{}", row.op, where(row.module))
               : fmt::format("the output of {}{}", row.op, where(row.module));
  const std::string what = fmt::format("{} in {} ({})", counts, subject, shape_text);
  // A backward node after a forward pass that already held NaN/inf in this step works on saved values
  // that were non-finite: it passes the failure on, even when its incoming gradient is finite.
  const bool after_forward_anomaly = backward && forward_anomaly_step_ == e.step;
  if (!backward) forward_anomaly_step_ = e.step;
  if (first_bad == nullptr && !after_forward_anomaly) {
    record_origin(e, backward, out.primary, out_pos_inf + out_neg_inf > 0, inputs, what, row, events);
  } else {
    record_propagation(e, phase, first_bad, what, row, events);
  }
  return true;
}

void Probe::record_origin(const OpEvent& e, bool backward, int primary, bool made_inf,
                          const std::vector<JudgedInput>& inputs, const std::string& what, trace::OpRow& row,
                          std::vector<trace::EventRow>& events) {
  row.origin = true;
  ++counters_.origins;
  std::string detail = what + "; ";
  if (inputs.empty()) {
    detail += "no floating inputs";
  } else {
    std::vector<std::string> absmax;
    for (const JudgedInput& in : inputs) absmax.push_back(fmt::format("{:.6g}", in.stats.health.absmax));
    detail += fmt::format("{} finite (absmax {})", backward ? "the incoming gradient is" : "inputs",
                          fmt::join(absmax, ", "));
  }
  if (made_inf && is_floating(e.output.dtype())) {
    detail += fmt::format("; the largest finite {} is {:.6g}", row.out_dtype, largest_finite(e.output.dtype()));
  }
  events.push_back({e.step, e.seq, "origin", row.op, row.module, std::move(detail)});
  if (options_.dump_first_origin && !dumped_) {
    dumped_ = true;
    dump_origin(e, row, primary);
  }
}

void Probe::dump_origin(const OpEvent& e, const trace::OpRow& row, int primary) {
  auto dump = [&](const std::string& name, const Tensor& t) {
    emit(trace::DumpRow{e.step, e.seq, row.op, row.module, name, std::string(dtype_name(t.dtype())),
                        shape_str(t.shape()), leading_of(t, options_.dump_max_elements)});
  };
  for (std::size_t i = 0; i < e.inputs.size(); ++i) {
    if (!e.inputs[i].defined()) continue;
    dump(fmt::format("input {}", i), e.inputs[i]);
    for (const CastRecord& c : e.autocast.casts) {
      if (c.input == static_cast<int>(i) && c.source.defined())
        dump(fmt::format("input {} before autocast", i), c.source);
    }
  }
  for (std::size_t i = 0; i < e.outputs.size(); ++i) {
    if (e.outputs[i].defined())
      dump(static_cast<int>(i) == primary ? "output" : fmt::format("output {}", i), e.outputs[i]);
  }
}

void Probe::record_propagation(const OpEvent& e, trace::Phase phase, const JudgedInput* first_bad,
                               const std::string& what, const trace::OpRow& row, std::vector<trace::EventRow>& events) {
  ++counters_.propagations;
  std::string key = row.op + '\0' + row.module + '\0' + std::string(trace::phase_name(phase));
  StepRecord* r = record_for(e.step);
  bool first = true;
  if (r != nullptr) {
    auto found = r->propagated.find(key);
    if (found != r->propagated.end()) {
      ++found->second.second;
      first = false;
    } else {
      // The event's index once the cast events of this op before it are in.
      r->propagated.emplace(std::move(key), std::make_pair(r->events.size() + events.size(), std::int64_t{0}));
    }
  } else {
    first = loose_propagated_.emplace(std::move(key), true).second;
  }
  if (first) {
    const std::string cause =
        first_bad != nullptr
            ? fmt::format("{} already held {}", first_bad->label, count_text(first_bad->stats.health))
            : std::string("the forward pass of this step already held NaN/inf, and this backward uses its saved "
                          "values");
    events.push_back({e.step, e.seq, "propagate", row.op, row.module, fmt::format("{}; {}", what, cause)});
  }
}
void Probe::on_grads(const GradEvent& event) {
  if (options_.level < Level::health || !recording_) return;
  std::vector<Tensor> tensors;
  bool off_host = deferred_ != nullptr;
  for (const auto& [name, grad] : event.grads) {
    tensors.push_back(grad);
    off_host = off_host || (grad.defined() && !grad.device().is_cpu());
  }
  if (off_host && queue_for(tensors) != nullptr && record_for(event.step) != nullptr) {
    const bool full = options_.level == Level::full;
    std::vector<std::pair<Tensor, bool>> wanted;
    for (const auto& [name, grad] : event.grads) {
      if (!grad.defined() || !module_wanted(parameter_module(name))) continue;
      wanted.emplace_back(grad, full && event.unscaled && !event.before_all_reduce && is_floating(grad.dtype()));
    }
    Pending p;
    p.is_op = false;
    p.step = event.step;
    p.unscaled = event.unscaled;
    p.before_all_reduce = event.before_all_reduce;
    p.grads = event.grads;
    if (defer(std::move(p), wanted)) return;
  }
  drain();
  record_grads(event);
}

void Probe::record_grads(const GradEvent& event) {
  const bool full = options_.level == Level::full;
  for (const auto& [name, grad] : event.grads) {
    if (!grad.defined() || !module_wanted(parameter_module(name))) continue;
    // Histograms of the true gradients only: a scaled gradient's histogram is the same shifted by
    // log2(scale) bins, and its overflows are counted in its GradRow.
    const bool histogram = full && event.unscaled && !event.before_all_reduce && is_floating(grad.dtype());
    const TensorStats s = stats_of(grad, histogram);
    trace::GradRow row;
    row.step = event.step;
    row.param = name;
    row.dtype = std::string(dtype_name(grad.dtype()));
    row.nan = s.health.nan;
    row.pos_inf = s.health.pos_inf;
    row.neg_inf = s.health.neg_inf;
    row.zero = s.health.zero;
    row.absmax = s.health.absmax;
    row.norm = s.norm();
    row.unscaled = event.unscaled;
    row.before_all_reduce = event.before_all_reduce;
    if (s.non_finite() > 0) mark_anomaly(event.step);
    emit(std::move(row));
    if (histogram) emit(trace::HistogramRow{event.step, -1, name, s.histogram});
  }
}

void Probe::on_params(const ParamsEvent& event) {
  if (!options_.checksums) return;
  // Written at once, every step: the table is in step order like /steps, whatever the sampling keeps.
  std::vector<std::uint64_t> sums;
  sums.reserve(event.params.size());
  for (const auto& [name, p] : event.params) {
    sums.push_back(tensor_checksum(p));
    sink_->write(trace::ChecksumRow{event.step, name, sums.back()});
  }
  sink_->write(trace::ChecksumRow{event.step, "", combine_checksums(sums)});
}

void Probe::on_update(const UpdateEvent& event) {
  if (options_.level < Level::health || !recording_ || !module_wanted(parameter_module(event.param))) return;
  // On the host, in double: every f16/bf16 value and every f32 update is exact there.
  const std::vector<double> before = event.before.values();
  const std::vector<double> update = event.update.values();
  const std::vector<double> after = event.after.values();
  trace::UpdateRow row;
  row.step = event.step;
  row.param = event.param;
  row.dtype = std::string(dtype_name(event.before.dtype()));
  row.numel = static_cast<std::int64_t>(before.size());
  double p_sum = 0, u_sum = 0;
  std::int64_t finite = 0;
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (update[i] == 0) continue;
    ++row.nonzero;
    // A NaN or infinite update, or a parameter already inf or NaN, changes (or cannot change) the value for
    // reasons other than rounding: counted as an update, never as swamped, and kept out of the means.
    if (!std::isfinite(update[i]) || !std::isfinite(before[i])) continue;
    ++finite;
    if (after[i] == before[i]) ++row.swamped;
    p_sum += std::fabs(before[i]);
    u_sum += std::fabs(update[i]);
  }
  if (finite > 0) {
    row.param_abs_mean = p_sum / static_cast<double>(finite);
    row.update_abs_mean = u_sum / static_cast<double>(finite);
  }
  record_nonfinite_update(event, before, after);
  emit(std::move(row));
}

// An FP8 Linear's operand: its /fp8 row on recorded steps, at level health and above, for wanted modules.
void Probe::on_fp8_quantize(const Fp8QuantizeEvent& event) {
  if (options_.level < Level::health) return;
  // Every cast, recorded or not, says which steps the delayed recipe's history holds (history_amax_step).
  Fp8HistorySteps* steps = nullptr;
  if (!event.amax_history.empty()) {
    steps = &fp8_history_steps_[event.module + '\n' + std::string(event.operand)];
    steps->note_cast(event.step, event.amax, event.amax_history.size());
  }
  if (!recording_ || !module_wanted(event.module)) return;
  emit(fp8_operand_row(event, steps));
}

// A block-scaled operand copy (trained in or measured for --what-if): its /blocks row on recorded steps, at level
// health and above, for wanted modules.
void Probe::on_block_quantize(const BlockQuantizeEvent& event) {
  if (options_.level < Level::health || !recording_ || !module_wanted(event.module)) return;
  emit(block_operand_row(event));
}

// Elements the update turned NaN or infinite from finite values: no op of the model made them, the optimizer
// did. One event (kind "nonfinite_update", docs/trace-format.md) with what the analysis needs to say why:
// the counts, and for Adam its eps and how many of those elements had a second moment of exactly 0.
void Probe::record_nonfinite_update(const UpdateEvent& event, const std::vector<double>& before,
                                    const std::vector<double>& after) {
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, v_zero = 0;
  const std::vector<double> v = event.second_moment != nullptr ? event.second_moment->values() : std::vector<double>{};
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (!std::isfinite(before[i]) || std::isfinite(after[i])) continue;
    if (std::isnan(after[i])) ++nan;
    else if (after[i] > 0) ++pos_inf;
    else ++neg_inf;
    if (i < v.size() && v[i] == 0) ++v_zero;
  }
  if (nan + pos_inf + neg_inf == 0) return;
  nlohmann::ordered_json d;
  d["dtype"] = std::string(dtype_name(event.before.dtype()));
  d["numel"] = static_cast<std::int64_t>(before.size());
  d["nan"] = nan;
  d["pos_inf"] = pos_inf;
  d["neg_inf"] = neg_inf;
  if (std::isfinite(event.eps)) d["eps"] = event.eps;
  if (event.second_moment != nullptr) {
    d["state_dtype"] = std::string(dtype_name(event.second_moment->dtype()));
    d["v_zero"] = v_zero;
  }
  trace::EventRow row{event.step, next_seq(), "nonfinite_update", std::string(event.optimizer), event.param, d.dump()};
  if (StepRecord* r = record_for(event.step)) {
    step_events_.push_back(std::move(row));
    r->anomalous = true;
  } else {
    sink_->write(row);
  }
}

void Probe::on_scaler(const ScalerEvent& event) {
  const std::int64_t step = current_step();
  auto add = [&](std::string kind, std::string module, std::string detail, bool anomaly) {
    trace::EventRow row{step, next_seq(), std::move(kind), "", std::move(module), std::move(detail)};
    if (open_ && step == step_) {
      step_events_.push_back(std::move(row));
      if (anomaly) recent_.back().anomalous = true;
    } else {
      sink_->write(row);
    }
  };
  for (const ScalerOptimizerReport& opt : event.optimizers) {
    for (const NonFiniteGrad& g : opt.non_finite) {
      ++counters_.grad_overflows;
      add("grad_overflow", g.name,
          fmt::format("{}: {} inf, {} NaN in its scaled gradient (scale {:.6g}, {})", g.name, g.inf_count, g.nan_count,
                      event.scale, opt.optimizer),
          true);
    }
    if (opt.skipped) {
      ++counters_.skipped_steps;
      add("skipped_step", "",
          fmt::format("{} skipped its step: its gradients held inf or NaN at scale {:.6g}", opt.optimizer, event.scale),
          true);
    }
  }
  if (event.change == ScalerEvent::Change::backoff) {
    add("scale_backoff", "",
        fmt::format("scale {:.6g} -> {:.6g}: the gradients held inf or NaN", event.scale, event.new_scale), true);
  } else if (event.change == ScalerEvent::Change::growth) {
    add("scale_growth", "",
        fmt::format("scale {:.6g} -> {:.6g}: growth after a run of steps without inf or NaN", event.scale,
                    event.new_scale),
        false);
  }
  if (open_ && step == step_) last_scaler_ = event;
}

void Probe::on_step_begin(std::int64_t step) {
  drain();
  if (open_) end_step(std::nullopt);
  recent_.push_back(StepRecord{});
  recent_.back().step = step;
  const std::size_t keep = options_.flight_recorder ? static_cast<std::size_t>(options_.recorder_steps) : 1;
  while (recent_.size() > keep) recent_.pop_front();
  open_ = true;
  step_ = step;
  recording_ = options_.level != Level::off && (options_.flight_recorder || selected(step));
  if (recording_) {  // a step that records nothing (not sampled) allocates nothing
    recent_.back().ops.reserve(last_ops_);
    recent_.back().grads.reserve(last_grads_);
  }
  loose_propagated_.clear();
  stats_cache_.clear();
  hist_cache_.clear();
}

void Probe::on_step_end(const StepSummary& summary) {
  drain();
  if (open_) {
    end_step(summary);
    return;
  }
  // The probe was installed after the step began: only the summary is known.
  trace::StepRow row{summary.step,    summary.loss,           summary.scale,     summary.scale_after, summary.found_inf,
                     summary.skipped, summary.growth_tracker, summary.grad_norm, summary.lr,          summary.time_ms};
  sink_->write(row);
  sink_->end_step(summary.step);
}

void Probe::on_step_abandoned(std::int64_t step) {
  drain();
  if (open_ && step == step_) end_step(std::nullopt);
}

void Probe::flush() {
  drain();
  if (open_) end_step(std::nullopt);
}

void Probe::write_record(StepRecord& r) {
  if (!r.ops.empty()) last_ops_ = r.ops.size();
  if (!r.grads.empty()) last_grads_ = r.grads.size();
  for (const trace::OpRow& row : r.ops) sink_->write(row);
  for (const trace::GradRow& row : r.grads) sink_->write(row);
  for (const trace::HistogramRow& row : r.histograms) sink_->write(row);
  for (const trace::DumpRow& row : r.dumps) sink_->write(row);
  for (const trace::EventRow& row : r.events) sink_->write(row);
  for (const trace::UpdateRow& row : r.updates) sink_->write(row);
  for (const trace::Fp8Row& row : r.fp8) sink_->write(row);
  for (const trace::BlockRow& row : r.blocks) sink_->write(row);
  r.written = true;
  ++counters_.steps_written;
  clear_rows(r.ops);
  clear_rows(r.grads);
  clear_rows(r.histograms);
  clear_rows(r.dumps);
  clear_rows(r.events);
  clear_rows(r.updates);
  clear_rows(r.fp8);
  clear_rows(r.blocks);
  r.propagated.clear();
}

void Probe::end_step(const std::optional<StepSummary>& summary) {
  StepRecord& rec = recent_.back();
  open_ = false;
  stats_cache_.clear();
  hist_cache_.clear();
  recording_ = options_.level != Level::off && options_.outside_steps;
  for (const auto& [key, first] : rec.propagated) {
    if (first.second > 0) rec.events[first.first].detail += fmt::format(" ({} more times in this step)", first.second);
  }

  std::optional<trace::StepRow> step_row;
  if (summary) {
    const StepSummary& s = *summary;
    trace::StepRow row{s.step,    s.loss,           s.scale,     s.scale_after, s.found_inf,
                       s.skipped, s.growth_tracker, s.grad_norm, s.lr,          s.time_ms};
    // The training loop's summary is authoritative; one that left the scaler's fields at their defaults
    // takes them from the step's scaler update.
    if (last_scaler_ && s.scale == 1 && s.scale_after == 1) {
      row.scale = last_scaler_->scale;
      row.scale_after = last_scaler_->new_scale;
      row.growth_tracker = last_scaler_->growth_tracker;
      for (const ScalerOptimizerReport& opt : last_scaler_->optimizers) {
        row.found_inf = row.found_inf || opt.found_inf;
        row.skipped = row.skipped || opt.skipped;
      }
    }
    if (row.found_inf || row.skipped) rec.anomalous = true;
    step_row = row;
  }

  if (!rec.written && (selected(rec.step) || rec.anomalous)) {
    if (options_.flight_recorder && rec.anomalous) {
      for (StepRecord& earlier : recent_) {
        if (&earlier != &rec && !earlier.written) write_record(earlier);
      }
    }
    write_record(rec);
  }
  for (const trace::EventRow& row : step_events_) sink_->write(row);
  if (step_row) sink_->write(*step_row);
  sink_->end_step(rec.step);
  step_events_.clear();
  last_scaler_.reset();
}

// ---- deferred statistics ----

void Probe::use_deferred_stats(std::unique_ptr<DeferredStats> queue) {
  drain();
  deferred_ = std::move(queue);
  device_queue_tried_ = true;
}

DeferredStats* Probe::queue_for(const std::vector<Tensor>& tensors) {
  if (!deferred_ && !device_queue_tried_) {
    for (const Tensor& t : tensors) {
      if (t.defined() && !t.device().is_cpu()) {
        device_queue_tried_ = true;
        deferred_ = device_stats_queue(t.device(), kDeviceStatsSlots);
        break;
      }
    }
  }
  if (!deferred_) return nullptr;
  // Only when some tensor lives where the queue computes: a CPU-only op is read in place at once (drain()
  // first keeps the order).
  for (const Tensor& t : tensors) {
    if (deferred_->takes(t)) return deferred_.get();
  }
  return nullptr;
}

bool Probe::defer(Pending p, const std::vector<std::pair<Tensor, bool>>& wanted) {
  DeferredStats& q = *deferred_;
  // Each (tensor, histogram) once; a tensor wanted with and without a histogram takes the histogram's slot.
  std::vector<std::pair<Tensor, bool>> unique;
  for (const auto& [t, hist] : wanted) {
    if (!t.defined() || t.numel() == 0) continue;  // tensor_stats reads nothing of them
    bool seen = false;
    for (auto& [u, uh] : unique) {
      if (u.id() == t.id()) {
        uh = uh || hist;
        seen = true;
      }
    }
    if (!seen) unique.emplace_back(t, hist);
  }
  std::int64_t device_count = 0;
  for (const auto& [t, hist] : unique) {
    if (q.takes(t)) {
      ++device_count;
    } else if (!t.device().is_cpu()) {
      drain();  // another device's tensor: read at once, after what came before
      return false;
    }
  }
  if (device_count > q.capacity()) {
    drain();
    return false;
  }
  if (device_count > q.free_slots()) drain();  // the ring is full: read it, then queue
  for (const auto& [t, hist] : unique) {
    if (q.takes(t)) {
      const int slot = q.launch(t, hist);
      if (slot < 0) throw Error("Probe: the statistics ring refused a launch it had room for (a bug)");
      p.slots.push_back({{t.id(), hist}, slot});
    } else {
      p.host.emplace(t.id(), tensor_stats(t, hist));  // a CPU tensor: read in place now
    }
  }
  // The run's first origin dumps its op's tensors as they were when it ran: while that dump is still to come,
  // each tensor keeps a copy of its leading values (queued on its device, no wait).
  if (p.is_op && options_.dump_first_origin && !dumped_) {
    auto snapshot = [&](const Tensor& t) {
      if (!t.defined() || p.snapshots.count(t.id()) > 0) return;
      const std::int64_t n = std::min(t.numel(), options_.dump_max_elements);
      p.snapshots.emplace(t.id(), n == 0 ? Tensor() : t.detach().reshape({-1}).slice(0, 0, n).clone());
    };
    for (const Tensor& t : p.inputs) snapshot(t);
    for (const CastRecord& c : p.autocast.casts) snapshot(c.source);
    for (const Tensor& t : p.outputs) snapshot(t);
  }
  pending_.push_back(std::move(p));
  return true;
}

void Probe::drain() {
  if (pending_.empty()) return;
  ++counters_.stats_reads;
  // Every slot is read before any row is completed: the first read waits for the device, the rest have landed.
  std::deque<Pending> items;
  items.swap(pending_);
  std::vector<std::pair<std::unordered_map<const void*, TensorStats>, std::unordered_map<const void*, TensorStats>>>
      results(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto& [plain, hist] = results[i];
    for (const auto& [key, slot] : items[i].slots) {
      TensorStats s = deferred_->read(slot);
      if (key.second) {
        TensorStats without = s;
        without.histogram.fill(0);
        plain.emplace(key.first, std::move(without));
        hist.emplace(key.first, std::move(s));
      } else {
        plain.emplace(key.first, std::move(s));
      }
    }
    for (const auto& [id, s] : items[i].host) plain.emplace(id, s);
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    Pending& p = items[i];
    resolved_plain_ = &results[i].first;
    resolved_hist_ = &results[i].second;
    snapshots_ = &p.snapshots;
    try {
      if (p.is_op) {
        const OpEvent e{p.op, p.scope, p.index, p.step, p.seq, p.core_phase, p.autocast, p.inputs, p.output, p.outputs};
        record_op(e, p.phase, p.producers);
      } else {
        record_grads(GradEvent{p.step, p.unscaled, p.grads, p.before_all_reduce});
      }
    } catch (...) {
      resolved_plain_ = resolved_hist_ = nullptr;
      snapshots_ = nullptr;
      throw;
    }
    resolved_plain_ = resolved_hist_ = nullptr;
    snapshots_ = nullptr;
  }
}

TensorStats Probe::stats_of(const Tensor& t, bool with_histogram) {
  if (resolved_plain_ != nullptr && t.defined()) {
    const auto& table = with_histogram ? *resolved_hist_ : *resolved_plain_;
    if (auto found = table.find(t.id()); found != table.end()) return found->second;
  }
  if (with_histogram) return cached_hist(t);
  const PlainStats p = cached_plain(t);
  TensorStats s;  // the histogram all zero, as tensor_stats leaves it without one
  s.health = p.health;
  s.sum_sq = p.sum_sq;
  return s;
}

Probe::PlainStats Probe::plain_stats_of(const Tensor& t) {
  if (resolved_plain_ != nullptr && t.defined()) {
    if (auto found = resolved_plain_->find(t.id()); found != resolved_plain_->end())
      return PlainStats{found->second.health, found->second.sum_sq};
  }
  return cached_plain(t);
}

std::size_t Probe::StatsKeyHash::operator()(const StatsKey& k) const {
  std::uint64_t h = k.serial * 0x9E3779B97F4A7C15ULL;
  auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 0x100000001B3ULL + (h >> 29); };
  mix(k.version);
  mix(static_cast<std::uint64_t>(k.offset));
  mix(static_cast<std::uint64_t>(k.numel));
  mix(static_cast<std::uint64_t>(k.dtype) * 2 + (k.contiguous ? 1 : 0));
  for (std::int64_t v : k.sizes) mix(static_cast<std::uint64_t>(v));
  for (std::int64_t v : k.strides) mix(static_cast<std::uint64_t>(v));
  return static_cast<std::size_t>(h);
}

Probe::StatsKey Probe::stats_key(const Tensor& view) {
  // A permuted view is read in memory order (tensor_stats): keyed as the contiguous tensor it permutes, whose
  // statistics are its own. (A contiguous view is used as it is: no Tensor copied.)
  Tensor permuted;
  if (!view.is_contiguous()) permuted = in_memory_order(view);
  const Tensor& t = permuted.defined() ? permuted : view;
  StatsKey k;
  k.dtype = t.dtype();
  k.numel = t.numel();
  k.contiguous = t.is_contiguous();
  if (!k.contiguous) {
    k.serial = t.storage_serial();
    k.version = t.storage_version();
    k.offset = t.storage_offset();
    k.sizes = t.shape();
    k.strides = t.strides();
    return k;
  }
  StorageCopy from;
  if (t.copied_from(from)) {  // an unwritten clone: the values of the view it was copied from, then
    k.serial = from.serial;
    k.version = from.version;
    k.offset = from.offset;
  } else {
    k.serial = t.storage_serial();
    k.version = t.storage_version();
    k.offset = t.storage_offset();
  }
  return k;
}

// Reads with a histogram (level full). Never served by the same read without one (cached_plain's cache):
// tensor_stats takes another loop for it (one sum, not the fast path's lanes), whose sums can differ in the last bits.
TensorStats Probe::cached_hist(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !t.device().is_cpu()) return tensor_stats(t, true);
  counters_.stats_values += t.numel();
  // The key depends on the tensor's own storage version only (an unwritten clone is keyed by its source only while
  // that version is the one its copy left): if the version is the same after the pass, so is the key.
  const std::uint64_t version = t.storage_version();
  StatsKey key = stats_key(t);
  if (auto found = hist_cache_.find(key); found != hist_cache_.end()) {
    counters_.stats_values_cached += t.numel();
    return found->second;
  }
  TensorStats s = tensor_stats(t, true);
  // tensor_stats reads through read_data(), which leaves the version as it was; a key changed meanwhile (a
  // pointer handed out on another thread) would make these statistics of no one version: not kept.
  if (t.storage_version() == version) {
    if (hist_cache_.size() >= kStatsCacheEntries) hist_cache_.clear();
    hist_cache_.emplace(std::move(key), s);
  }
  return s;
}

// Reads without a histogram, as cached_hist above (the same key and version rule) in their own cache.
Probe::PlainStats Probe::cached_plain(const Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !t.device().is_cpu()) {
    const TensorStats s = tensor_stats(t, false);
    return PlainStats{s.health, s.sum_sq};
  }
  counters_.stats_values += t.numel();
  const std::uint64_t version = t.storage_version();
  StatsKey key = stats_key(t);
  if (auto found = stats_cache_.find(key); found != stats_cache_.end()) {
    counters_.stats_values_cached += t.numel();
    return found->second;
  }
  const TensorStats s = tensor_stats(t, false);
  const PlainStats p{s.health, s.sum_sq};
  if (t.storage_version() == version) {
    if (stats_cache_.size() >= kStatsCacheEntries) stats_cache_.clear();
    stats_cache_.emplace(std::move(key), p);
  }
  return p;
}

CastCounts Probe::casts_of(const Tensor& source, const Tensor& result) {
  if (resolved_plain_ != nullptr && source.defined() && result.defined()) {
    const auto s = resolved_plain_->find(source.id()), r = resolved_plain_->find(result.id());
    if (s != resolved_plain_->end() && r != resolved_plain_->end()) {
      if (source.shape() != result.shape()) return cast_counts(source, result);  // its ShapeError
      return cast_counts_from_stats(s->second, r->second, result.dtype());
    }
  }
  return cast_counts(source, result);
}

std::vector<double> Probe::leading_of(const Tensor& t, std::int64_t max_elements) {
  if (snapshots_ != nullptr && t.defined()) {
    if (auto found = snapshots_->find(t.id()); found != snapshots_->end()) {
      return leading_values(found->second, max_elements);
    }
  }
  return leading_values(t, max_elements);
}

}  // namespace ampscope::probe
