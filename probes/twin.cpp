// probes/twin.cpp: the f32 twin (probes/twin.h).
#include "probes/twin.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "probes/stats.h"

namespace ampscope::probe {

namespace {

bool low_precision(DType d) { return d == DType::f16 || d == DType::bf16; }

double largest_finite(DType d) {
  switch (d) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return static_cast<double>(FLT_MAX);
    default: return std::numeric_limits<double>::max();
  }
}

int min_exponent(DType d) {
  switch (d) {
    case DType::f16: return -14;
    case DType::f64: return -1022;
    default: return -126;
  }
}

double ulp_of(double r, DType d) {
  const int p = significand_bits(d);
  int e = min_exponent(d);
  if (r != 0) e = std::max(e, std::ilogb(r));
  return std::ldexp(1.0, e - (p - 1));
}

// The bucket of a relative error e > 0: floor(-log2 e), clamped to [0, kErrorBins - 1].
int error_bucket(double e) {
  const double b = std::floor(-std::log2(e));
  return b <= 0 ? 0 : b >= trace::kErrorBins - 1 ? trace::kErrorBins - 1 : static_cast<int>(b);
}

bool saturating(std::string_view op) { return op == "sigmoid" || op == "tanh"; }

// Ops whose body must not run again: it draws random numbers.
bool random_op(std::string_view op) { return op == "dropout"; }

Tensor widened(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.dtype() == DType::f32) return t;
  return t.to(DType::f32);
}

double max_ratio(const Tensor& num, const Tensor& den, double floor) {
  const std::vector<double> n = num.values(), d = den.values();
  double best = 0;
  for (std::size_t i = 0; i < n.size() && i < d.size(); ++i) {
    if (!std::isfinite(n[i]) || !std::isfinite(d[i])) continue;
    best = std::max(best, n[i] / std::max(std::fabs(d[i]), floor));
  }
  return best;
}

}  // namespace

int significand_bits(DType dtype) {
  switch (dtype) {
    case DType::f16: return 11;
    case DType::bf16: return 8;
    case DType::f64: return 53;
    default: return 24;
  }
}

double relative_error_floor(DType dtype) {
  return std::ldexp(1.0, min_exponent(dtype));
}

namespace {
// The elements of `t`, row-major, as T on the host (f32 by the cast kernel, or widened to double).
template <class T>
std::vector<T> host_values(const Tensor& t) {
  if constexpr (std::is_same_v<T, double>) {
    return t.values();
  } else {
    const Tensor c = t.to(DType::f32).to(Device::cpu()).contiguous();
    const float* p = c.data_as<float>();
    return std::vector<float>(p, p + c.numel());
  }
}

template <class T>
ErrorStats compare_as(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op) {
  const std::vector<T> y = host_values<T>(value), r = host_values<T>(reference);
  double scale = 0;
  for (T ri : r) {
    if (std::isfinite(ri)) scale = std::max(scale, static_cast<double>(std::fabs(ri)));
  }
  const double floor = std::max(relative_error_floor(dtype), std::ldexp(scale, -significand_bits(dtype)));
  const double top = largest_finite(dtype);
  ErrorStats s;
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double yi = y[i], ri = r[i];
    if (!std::isfinite(ri)) continue;
    if (!std::isfinite(yi)) {
      ++s.flips;
      continue;
    }
    const bool flip = (yi == 0 && ri != 0) || (std::fabs(yi) == top && std::fabs(ri) < top) ||
                      (saturating(op) && std::fabs(yi) == 1 && std::fabs(ri) != 1);
    if (flip) ++s.flips;
    const double err = std::fabs(yi - ri);
    const double rel = err / std::max(std::fabs(ri), floor);
    if (!flip) {
      if (rel == 0) {
        ++s.exact;
      } else {
        ++s.error_bins[static_cast<std::size_t>(error_bucket(rel))];
      }
    }
    s.max_rel = std::max(s.max_rel, rel);
    s.max_ulp = std::max(s.max_ulp, err / ulp_of(ri, dtype));
    sum += rel;
    ++s.counted;
  }
  s.mean_rel = s.counted > 0 ? sum / static_cast<double>(s.counted) : 0;
  const double p = significand_bits(dtype);
  s.bits = s.max_rel == 0 ? p : std::clamp(-std::log2(s.max_rel), 0.0, p) + 0.0;  // + 0.0: no -0 for an error of 1
  return s;
}

bool f32_exact(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }
}  // namespace

ErrorStats compare(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op) {
  if (value.numel() != reference.numel()) {
    throw Error(fmt::format("twin: {} has {} elements but its reference has {}; compare tensors of one shape", op,
                            value.numel(), reference.numel()));
  }
  // f16, bf16 and f32 values are exact in float: read them as floats, not widened to double vectors.
  if (f32_exact(value.dtype()) && f32_exact(reference.dtype())) return compare_as<float>(value, reference, dtype, op);
  return compare_as<double>(value, reference, dtype, op);
}

Twin::Twin(std::shared_ptr<Hook> inner, TwinOptions options) : inner_(std::move(inner)), options_(options) {
  if (!inner_) throw Error("twin: no hook to wrap; pass the probe the twin rides along with");
  if (options_.every < 1) {
    throw Error(fmt::format("twin: every must be at least 1 (got {}); 1 twins every step", options_.every));
  }
}

bool Twin::wants_op(std::string_view op, const std::string& scope) { return inner_->wants_op(op, scope); }
void Twin::before_op(std::string_view op, const std::string& scope) { inner_->before_op(op, scope); }

void Twin::on_op(const OpEvent& event) {
  if (active_ && event.step == step_) {
    // The twin never changes the run: an op its body refuses to compute again in f32 is not covered.
    try {
      twin(event);
    } catch (const std::exception&) {
      ++uncovered_[std::string(event.op)];
    }
  }
  inner_->on_op(event);
}

void Twin::on_backward_op(const OpEvent& event) {
  if (active_ && options_.backward && event.step == step_) {
    // As forward: a node whose backward refuses to run again in f32 is not covered, and the run goes on.
    try {
      twin_backward(event);
    } catch (const std::exception&) {
      ++uncovered_[fmt::format("backward of {}", event.op)];
    }
  }
  inner_->on_backward_op(event);
}
void Twin::on_grads(const GradEvent& event) { inner_->on_grads(event); }
void Twin::on_scaler(const ScalerEvent& event) { inner_->on_scaler(event); }
void Twin::on_update(const UpdateEvent& event) { inner_->on_update(event); }

void Twin::on_step_begin(std::int64_t step) {
  values_.clear();
  stats_.clear();
  layouts_.clear();
  step_ = step;
  active_ = step % options_.every == 0;
  inner_->on_step_begin(step);
}

void Twin::hand_over() {
  if (!options_.sink) return;
  for (std::size_t i = handed_; i < rows_.size(); ++i) options_.sink->write(rows_[i]);
  if (options_.keep_rows) {
    handed_ = rows_.size();
  } else {
    rows_.clear();
    handed_ = 0;
  }
}

void Twin::on_step_end(const StepSummary& summary) {
  values_.clear();
  stats_.clear();
  layouts_.clear();
  active_ = false;
  hand_over();  // before the probe ends the step: its end_step makes the rows durable with the step's
  inner_->on_step_end(summary);
}

void Twin::on_step_abandoned(std::int64_t step) {
  values_.clear();
  stats_.clear();
  layouts_.clear();
  active_ = false;
  hand_over();
  inner_->on_step_abandoned(step);
}

void Twin::twin(const OpEvent& event) {
  if (!event.output.defined() || !is_floating(event.output.dtype())) return;
  const DType out_dtype = event.output.dtype();
  const bool low = low_precision(out_dtype);
  // The twin's inputs: a twin value where a twinned op of this step produced the input, else the input
  // before autocast's cast.
  std::vector<Tensor> twin_inputs(event.inputs.size());
  // Per input: the producer row's accumulated errors, where the input is that row's output, uncast (its
  // errors against the twin are then those already computed).
  std::vector<const ErrorStats*> known(event.inputs.size(), nullptr);
  bool follows = false, followed = true, cast = false;
  for (std::size_t i = 0; i < event.inputs.size(); ++i) {
    const Tensor& in = event.inputs[i];
    if (!in.defined()) continue;
    Tensor source = in;
    bool was_cast = false;
    for (const CastRecord& c : event.autocast.casts) {
      if (c.input == static_cast<int>(i)) {
        source = c.source;
        was_cast = cast = true;
      }
    }
    twin_inputs[i] = widened(source);
    const auto [step, seq] = in.producer();
    if (step != event.step) continue;
    const auto it = values_.find(seq);
    if (it == values_.end()) continue;
    // The input holds the producer's output values in the output's order only when it is the output itself
    // (or a view with its start and strides) or a reshape of a contiguous output (same start, contiguous): a
    // transposed view, and a contiguous copy of one (attention's heads merged back), keep the producer's
    // stamp too, but hold the elements in another order.
    const auto layout = layouts_.find(seq);
    const bool same_start = layout != layouts_.end() && in.data() == layout->second.start;
    if (it->second.shape() == in.shape() && same_start && in.strides() == layout->second.strides) {
      twin_inputs[i] = it->second;
      follows = true;
    } else if (it->second.numel() == in.numel() && same_start && layout->second.contiguous && in.is_contiguous()) {
      twin_inputs[i] = it->second.reshape(in.shape());
      follows = true;
    } else {
      followed = false;
      continue;
    }
    const auto st = stats_.find(seq);
    if (!was_cast && st != stats_.end()) known[i] = &st->second;
  }
  if (!low && !follows) return;  // an f32 op on values f32 computed: nothing to compare
  if (event.recompute == nullptr || random_op(event.op)) {
    if (low) ++uncovered_[std::string(event.op)];
    return;
  }
  NoGradGuard no_grad;
  PrecisionRow row;
  row.step = event.step;
  row.seq = event.seq;
  row.op = std::string(event.op);
  row.module = event.scope;
  row.out_dtype = std::string(dtype_name(out_dtype));
  row.numel = event.output.numel();
  row.followed = followed;
  Tensor local;
  ErrorStats l;
  if (low) {
    std::vector<Tensor> own(event.inputs.size());
    for (std::size_t i = 0; i < event.inputs.size(); ++i) own[i] = widened(event.inputs[i]);
    local = (*event.recompute)(own);
    l = compare(event.output, local, out_dtype, event.op);
    row.local = true;
    row.local_max_rel = l.max_rel;
    row.local_mean_rel = l.mean_rel;
    row.local_max_ulp = l.max_ulp;
  }
  // Inputs the twin does not follow and autocast did not cast are the op's own: the accumulated values are
  // the local ones.
  const bool same = low && !follows && !cast;
  const Tensor acc = same ? local.to(DType::f32) : (*event.recompute)(twin_inputs).to(DType::f32);
  const ErrorStats a = same ? l : compare(event.output, acc, out_dtype, event.op);
  row.acc_max_rel = a.max_rel;
  row.acc_mean_rel = a.mean_rel;
  row.acc_max_ulp = a.max_ulp;
  row.flips = a.flips;
  row.bits = a.bits;
  row.error_bins = a.error_bins;
  row.exact = a.exact;
  for (std::size_t i = 0; i < event.inputs.size(); ++i) {
    const Tensor& in = event.inputs[i];
    if (!in.defined() || !is_floating(in.dtype()) || !twin_inputs[i].defined()) continue;
    if (in.numel() != twin_inputs[i].numel()) continue;
    const ErrorStats e = known[i] != nullptr ? *known[i] : compare(in, twin_inputs[i], in.dtype(), "");
    row.in_acc_max_rel = std::max(row.in_acc_max_rel, e.max_rel);
    row.in_acc_mean_rel = std::max(row.in_acc_mean_rel, e.mean_rel);
  }
  // Condition numbers, from the twin's values.
  row.cond = std::numeric_limits<double>::quiet_NaN();
  const double floor = relative_error_floor(out_dtype);
  const std::string_view op = event.op;
  if ((op == "add" || op == "sub") && twin_inputs.size() == 2 && twin_inputs[1].defined()) {
    row.cond = max_ratio(add(abs(twin_inputs[0]), abs(twin_inputs[1])), acc, floor);
  } else if ((op == "add" || op == "sub" || op == "rsub") && twin_inputs.size() == 1) {
    // The scalar operand is not an input: |s| = |out - a| (add, sub) or |out + a| (rsub, out = s - a).
    const Tensor& x = twin_inputs[0];
    const Tensor other = op == "rsub" ? abs(add(acc, x)) : abs(sub(acc, x));
    row.cond = max_ratio(add(abs(x), other), acc, floor);
  } else if ((op == "sum" || op == "mean") && twin_inputs.size() == 1) {
    row.cond = max_ratio((*event.recompute)({abs(twin_inputs[0])}).to(DType::f32), acc, floor);
  }
  values_[event.seq] = acc;
  stats_[event.seq] = a;
  layouts_[event.seq] = Layout{event.output.data(), event.output.strides(), event.output.is_contiguous()};
  rows_.push_back(std::move(row));
}

// ---- the backward twin (local error of each autograd node that ran in f16/bf16) ----

namespace {
// The narrower of two floating dtypes (fewer significand bits).
DType narrower(DType a, DType b) { return significand_bits(b) < significand_bits(a) ? b : a; }

// A node's gradients judged together: the largest max and mean (each gradient is a quantity of its own: a
// bias's gradient of 8 elements that lost its digits is not diluted by a weight's 4096 good ones), counts summed.
void merge(ErrorStats& into, const ErrorStats& more, double p) {
  into.counted += more.counted;
  into.mean_rel = std::max(into.mean_rel, more.mean_rel);
  into.max_rel = std::max(into.max_rel, more.max_rel);
  into.max_ulp = std::max(into.max_ulp, more.max_ulp);
  into.flips += more.flips;
  into.exact += more.exact;
  for (std::size_t k = 0; k < into.error_bins.size(); ++k) into.error_bins[k] += more.error_bins[k];
  into.bits = into.max_rel == 0 ? p : std::clamp(-std::log2(into.max_rel), 0.0, p) + 0.0;
}
}  // namespace

void Twin::twin_backward(const OpEvent& event) {
  if (event.recompute_backward == nullptr || event.inputs.empty() || !event.inputs[0].defined()) return;
  bool low = false;
  DType dtype = DType::f64;
  for (const Tensor& g : event.outputs) {
    if (!g.defined() || !is_floating(g.dtype())) continue;
    low = low || low_precision(g.dtype());
    dtype = narrower(dtype, g.dtype());
  }
  if (!low) return;  // a node whose gradients are f32 (or f64) computed nothing in f16/bf16
  NoGradGuard no_grad;
  const std::vector<Tensor> reference = (*event.recompute_backward)(event.inputs[0]);
  PrecisionRow row;
  row.step = event.step;
  row.seq = event.seq;
  row.op = std::string(event.op);
  row.module = event.scope;
  row.out_dtype = std::string(dtype_name(dtype));
  row.phase = trace::Phase::backward;
  row.local = true;
  row.cond = std::numeric_limits<double>::quiet_NaN();
  ErrorStats all;
  const double p = significand_bits(dtype);
  all.bits = p;
  for (std::size_t i = 0; i < event.outputs.size() && i < reference.size(); ++i) {
    const Tensor& g = event.outputs[i];
    if (!g.defined() || !is_floating(g.dtype()) || !reference[i].defined()) continue;
    merge(all, compare(g, reference[i], g.dtype(), ""), p);
    row.numel += g.numel();
  }
  row.local_max_rel = all.max_rel;
  row.local_mean_rel = all.mean_rel;
  row.local_max_ulp = all.max_ulp;
  row.flips = all.flips;
  row.bits = all.bits;
  row.error_bins = all.error_bins;
  row.exact = all.exact;
  rows_.push_back(std::move(row));
}

}  // namespace ampscope::probe
