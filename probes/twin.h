// probes/twin.h: an f32 twin of the forward pass, in the same run. Every forward op whose output is f16 or
// bf16 is computed again in f32 (probe::OpEvent::recompute) on two kinds of inputs:
//   local        the op's own inputs (after autocast's casts) widened exactly to f32: what this op's own
//                rounding costs;
//   accumulated  the twin's inputs: for an input that a twinned op of the same step produced (its producer
//                stamp, core/probe_hook.h), that op's twin value; otherwise the input before autocast's cast
//                (widened to f32): how far the value is from what f32 would have computed.
// An op that runs in f32 but has an input the twin follows is computed again on the twin's inputs too
// (accumulated error only), so the twin follows values through f32 ops (log after autocast's f32 cast).
//
// Twin is a hook that wraps another (normally the Probe): it forwards every call unchanged and records
// only ops the wrapped hook wants, so the trace and the run are the same with and without it. The twin's
// tensors are made under NoGradGuard, by ops nested in the reported op (never reported, never cast by
// autocast, never cached); ops that draw random numbers (dropout) are not computed again.
//
//   auto probe = std::make_shared<probe::Probe>(sink, options);
//   auto twin = std::make_shared<probe::Twin>(probe, probe::TwinOptions{.every = 1});
//   probe::HookGuard installed(twin);
//   ... train ...;  twin->rows();   // one PrecisionRow per twinned op
//
// Not covered (counted by uncovered()): ops dispatched without a body to run again ("to", max/min along a
// dim), ops that draw random numbers (dropout), and ops whose body throws when run again in f32 (the error
// is swallowed: the run goes on as without the twin). Composites (cross_entropy, attention) are twinned
// step by step. The backward pass is not twinned. An input the twin cannot match to its producer's twin
// value (a transposed view of it) is taken as it is, widened (PrecisionRow::followed is then false).
// Memory: the twin keeps an f32 copy of every twinned op's output until the step ends.
//
// The numbers (compare()), per element i with y the op's value, r the reference (both widened to double) and
// D the op's output dtype (f16: p = 11 significand bits, emin = -14; bf16: p = 8, emin = -126; f32: p = 24,
// emin = -126):
//   relative error  |y - r| / max(|r|, floor), floor = the larger of D's smallest normal (f16 6.1e-5) and
//                   2^-p times the tensor's largest finite |r| (one rounding of its largest value): a
//                   reference near zero, beside values D rounds far more coarsely, does not make the error
//                   explode (a matmul's near-zero outputs), while a value that cancelled to 0 is still 100%;
//   ulps            |y - r| / ulp_D(r), ulp_D(r) = 2^(max(floor(log2|r|), emin) - (p - 1));
//   flips           y is 0 while r is not; y is ±inf while r is finite; |y| is D's largest finite value
//                   while |r| is smaller; for sigmoid and tanh, |y| is 1 while |r| is not;
//   bits            of agreement: -log2(max relative error), between 0 and p (p when the error is 0).
// Elements where r is not finite, or y is not finite (those are flips), are left out of the errors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/probe_hook.h"

namespace ampscope::probe {

struct TwinOptions {
  std::int64_t every = 1;  // twin steps whose number is a multiple of this (and that the wrapped hook records)
};

// The errors of `value` against `reference` (same shape), as above; `dtype` is the dtype whose spacing and
// range judge them (the op's output dtype); `op` names the op (sigmoid and tanh saturate at 1).
struct ErrorStats {
  std::int64_t counted = 0;  // elements with finite y and r
  double max_rel = 0, mean_rel = 0, max_ulp = 0;
  std::int64_t flips = 0;
  double bits = 0;
};
ErrorStats compare(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op);
double relative_error_floor(DType dtype);  // the smallest normal of dtype
int significand_bits(DType dtype);         // 11, 8, 24, 53

// One twinned op.
struct PrecisionRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;  // the op's seq (its /ops row)
  std::string op;
  std::string module;
  std::string out_dtype;  // the op's output dtype
  std::int64_t numel = 0;
  bool local = false;  // the op ran in f16/bf16: local errors computed (else 0: an f32 op on twin inputs)
  double local_max_rel = 0, local_mean_rel = 0, local_max_ulp = 0;
  double acc_max_rel = 0, acc_mean_rel = 0, acc_max_ulp = 0;
  // The largest accumulated max relative error among the op's floating inputs (each input against its twin
  // value, judged in the input's own dtype): how much error reached the op, to compare with its output's.
  double in_acc_max_rel = 0;
  double in_acc_mean_rel = 0;  // the largest accumulated mean relative error among the inputs
  std::int64_t flips = 0;  // accumulated: against the twin's values
  double bits = 0;         // accumulated
  // add, sub, rsub: max over elements of (|a| + |b|) / max(|a ± b|, floor); sum, mean: of sum|x| / max(|sum x|,
  // floor); from the twin's values (floor: relative_error_floor of the output dtype). NaN for other ops.
  double cond = 0;
  bool followed = true;  // every input the twin follows had a twin value of its shape (else: widened input)
};

// The jump in accumulated error at an op: the factor by which its output's accumulated mean relative error
// exceeds its inputs' (in_acc_mean_rel, taken as at least 2^-p of the output dtype, one rounding). The mean,
// not the max: one near-zero output of a matmul whose terms cancel is a large relative error of little
// consequence, while a cancellation that zeroes many outputs (1 - s with s rounded to 1) moves the mean.
// An op that passes on its inputs' error scores about 1; one that adds only its own rounding about 1 to 2.
double precision_jump(const PrecisionRow& row);
// Where precision entered: the rows' ops (op and module), each with its row of the largest jump, largest
// jump first (ties: earlier step and seq first).
std::vector<PrecisionRow> rank_by_jump(const std::vector<PrecisionRow>& rows);

// The rows' ops (op and module), each with its row of the largest local mean relative error (what the op's
// own rounding costs), largest first (ties: earlier step and seq first); ops that ran in f32 are left out.
std::vector<PrecisionRow> rank_by_local(const std::vector<PrecisionRow>& rows);

// The trend of an op's accumulated error over steps: the least-squares slope of log2(acc_mean_rel) (as
// at least 2^-p of the output dtype) against the step, over the op's largest value per step; in bits per step
// lost (positive: the error grows). Ops seen on fewer than two steps are left out. Steepest first.
struct PrecisionTrend {
  std::string op, module;
  std::int64_t steps = 0;        // steps the op was twinned on
  double bits_per_step = 0;      // slope of log2(error)
  double first = 0, last = 0;    // acc_mean_rel on its first and last step
};
std::vector<PrecisionTrend> precision_trends(const std::vector<PrecisionRow>& rows);

class Twin : public Hook {
 public:
  // Throws Error for a null hook or an `every` below 1.
  Twin(std::shared_ptr<Hook> inner, TwinOptions options = {});

  bool wants_op(std::string_view op, const std::string& scope) override;
  void before_op(std::string_view op, const std::string& scope) override;
  void on_op(const OpEvent& event) override;
  void on_backward_op(const OpEvent& event) override;
  void on_grads(const GradEvent& event) override;
  void on_scaler(const ScalerEvent& event) override;
  void on_step_begin(std::int64_t step) override;
  void on_step_end(const StepSummary& summary) override;
  void on_step_abandoned(std::int64_t step) override;

  const std::vector<PrecisionRow>& rows() const { return rows_; }
  // Ops with a low-precision output that the twin could not compute again, by name: how many times (and
  // ops of any dtype whose body threw when run again).
  const std::map<std::string, std::int64_t>& uncovered() const { return uncovered_; }

 private:
  void twin(const OpEvent& event);

  std::shared_ptr<Hook> inner_;
  TwinOptions options_;
  bool active_ = false;  // twinning the open step
  std::int64_t step_ = -1;
  std::unordered_map<std::int64_t, Tensor> values_;      // seq -> the twin's f32 value, for the open step
  std::unordered_map<std::int64_t, ErrorStats> stats_;   // seq -> its accumulated errors
  std::vector<PrecisionRow> rows_;
  std::map<std::string, std::int64_t> uncovered_;
};

}  // namespace ampscope::probe
