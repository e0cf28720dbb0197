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
// f64 for f32 ops, on request (TwinOptions::f32_in_f64, `ampscope train --twin-f64`): every forward op is computed
// one dtype wider than it ran: f16/bf16 ops in f32 as above, and f32 ops in f64, on their own inputs widened
// exactly to f64 (local) and on the twin's (accumulated); an f32 op's twin value is kept in f64, and an f16/bf16 op
// that reads it takes it rounded to f32, its own reference. A row's reference is therefore known from the row: f64
// where out_dtype is f32 and local is set, else f32 (f64 for an f64 output). An f32 run twinned this way shows
// where f32 itself loses digits (a variance as E[x^2] - E[x]^2, a long f32 running sum). The comparisons against
// f64 take compare()'s element-by-element path (slower than the float path below). Backward nodes likewise: a
// node whose narrowest gradient is f32 is run again in f64 (autograd::WidenTo(f64)), f16/bf16 nodes in f32.
//
// Twin is a hook that wraps another (normally the Probe): it forwards every call unchanged and records
// only ops the wrapped hook wants, so the trace and the run are the same with and without it. With a sink
// (TwinOptions::sink, the trace writer), each step's rows are written there when the step ends: the trace's
// /precision table (`ampscope train --twin`), which the report's PRECISION section reads. The twin's
// tensors are made under NoGradGuard, by ops nested in the reported op (never reported, never cast by
// autocast, never cached); ops that draw random numbers (dropout) are not computed again.
//
//   auto probe = std::make_shared<probe::Probe>(sink, options);
//   auto twin = std::make_shared<probe::Twin>(probe, probe::TwinOptions{.every = 1, .sink = writer});
//   probe::HookGuard installed(twin);
//   ... train ...;  twin->rows();   // one PrecisionRow per twinned op
//
// Not covered (counted by uncovered()): ops dispatched without a body to run again ("to", max/min along a
// dim), ops that draw random numbers (dropout), and ops whose body throws when run again in f32 (the error
// is swallowed: the run goes on as without the twin). Composites (cross_entropy, attention) are twinned
// step by step. An input the twin cannot match to its producer's twin
// value (a transposed view of it, or a contiguous copy of one, as attention's heads merged back into
// [batch, time, d], or a plain copy: only the output itself, a view with its start and strides, or a reshape
// of a contiguous output is followed) is taken as it is, widened (PrecisionRow::followed is then false).
// Memory: the twin keeps an f32 copy of every twinned op's output until the step ends.
// Cost: the local value of a large unary element-wise op on f16/bf16 (gelu, tanh, mul by a scalar, ...) is
// looked up in a table of the op's body run on all 65536 widened inputs (the same values as running it on the
// input), an input the twin takes as it is gets no comparison pass (its errors are 0), and compare() reads
// f16/bf16/f32 tensors as floats (an f16/bf16 value as it is stored, widened a block at a time), four elements
// at a time, with the mean's sum still added in element order: the same bits as the element-by-element
// definition below. A value bit for bit equal to its reference (the local value of relu or max_pool2d, a
// view's backward) is answered from one scan: every finite element exact. An op's comparisons (output against
// local and accumulated values, inputs against the twin's) and a node's (one per gradient) run side by side on
// the CPU's threads, each whole on one. The backward's matrix products on the CPU read f16/bf16 operands in
// place (core/tensor.cpp, reads_half_as_f32). Measured (bench/RESULTS.md, twin_train_bench.sh, medians of runs on
// a loaded 2-core machine): a twinned step about 1.9x to 2.3x an untwinned one on the samples, the forward ops
// alone (TwinOptions::backward = false) 1.5x to 1.9x.
//
// Backward (local error only): every autograd node the wrapped hook wants whose gradients (any of them) are f16
// or bf16 is computed again, right after it ran, by the same backward function in f32 (OpEvent::
// recompute_backward, autograd::WidenToF32: the incoming gradient and the saved tensors it reads widened
// exactly, every result made in f32), and its gradients are compared with that, each in its own dtype, as above
// (no saturation rule: a gradient at 1 is not a boundary); the row takes the largest max and mean relative error
// over the node's gradients, and sums their flips and histograms. One row per node, phase backward, named by the forward
// op it belongs to (trace_schema.h PrecisionRow). Not covered: the sums of the gradients that meet at a tensor
// (the engine adds them in the gradients' dtype, between nodes), AccumulateGrad, and nodes whose backward throws
// when run again in f32 (counted in uncovered() as "backward of OP"). The design: docs/twin-backward.md.
//
// FP8 Linears (`--precision fp8`, core/fp8_linear.h): a Linear that ran its GEMMs in FP8 rounded twice, once
// when it quantized its operands to FP8 and once when it rounded the f32 GEMM to bf16. Its rows keep the two
// apart: the local reference of its forward row, and of its backward node's dgrad and wgrad, is the GEMM it ran on
// the FP8 operands it quantized (copied from their Fp8QuantizeEvent, the codes and scale_inv), in f32
// (fp8_gemm with an f32 output), so local_* are the bf16 output rounding alone, as out_dtype says; the twin checks
// that this reference rounds to the op's output bit for bit (operands that do not match make the op uncovered,
// never a wrong row). The FP8 quantization error is in the accumulated errors: the forward row's accumulated
// reference is the unquantized Linear in f32 on the twin's inputs, as for every op, so acc_* (and precision_jump)
// hold what FP8 and bf16 together lost and the twin follows f32 values past it, never FP8 ones. The bias
// gradient of the node (from the unquantized grad_output, TE's bgrad) is judged against f32 as before. The twin
// forwards every FP8 cast to the wrapped hook (the probe's /fp8 rows).
//
// Block-scaled Linears (`--precision mxfp8|nvfp4`, core/block_linear.h) likewise: the local reference of the forward
// row is the run's own block GEMM (block_gemm with an f32 output) of the decoded copies it quantized, input rowwise
// times weight rowwise (BlockQuantizeEvent::decoded, block_operand_from_decoded); of its backward node, the dgrad
// grad_output rowwise times weight columnwise and the wgrad grad_output columnwise times input columnwise (NVFP4's
// columnwise copies after the Hadamard transform where applied: the transform is orthogonal, so the GEMM of the
// transformed copies is the wgrad). Each is checked to round to the op's output bit for bit (else the op is
// uncovered, as FP8's; a node whose copies were seen without its forward's too). The forward row's accumulated
// reference is the unquantized Linear in f32 on the twin's inputs, so acc_* and precision_jump hold what block
// quantization and the bf16 rounding together lost (the report labels it block_quantization), and the twin follows
// f32 values past it. --what-if's copies carry no values and are not kept.
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
//   bits            of agreement: -log2(max relative error), between 0 and p (p when the error is 0);
//   histogram       each element with a finite r counted once: a flip (flips), exact (error 0: exact), or in
//                   bucket floor(-log2 relative error) of error_bins, clamped to [0, trace::kErrorBins - 1].
// Elements where r is not finite, or y is not finite (those are flips), are left out of the errors.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/block_linear.h"
#include "core/fp8_linear.h"
#include "core/probe_hook.h"
#include "probes/analysis/precision.h"
#include "probes/trace/schema.h"

namespace ampscope::probe {

struct TwinOptions {
  std::int64_t every = 1;  // twin steps whose number is a multiple of this (and that the wrapped hook records)
  // Where each step's rows go when the step ends (or is abandoned), before the wrapped hook hears of it: the
  // trace writer the probe writes to (its /precision table). None: rows are only kept (rows()).
  std::shared_ptr<trace::Sink> sink{};
  // Keep every row in memory for rows(); false with a sink keeps only the open step's.
  bool keep_rows = true;
  // Twin the backward pass too (a row per autograd node that ran in f16/bf16, below); false: forward ops only.
  bool backward = true;
  // Twin the ops that ran in f32 too, in f64 (`ampscope train --twin-f64`): each op and autograd node is computed
  // one dtype wider than it ran (f16/bf16 in f32 as always, f32 in f64), so an f32 op gets local errors and the
  // twin follows values in f64 through f32 ops (above, "f64 for f32 ops").
  bool f32_in_f64 = false;
};

// The errors of `value` against `reference` (same shape), as above; `dtype` is the dtype whose spacing and
// range judge them (the op's output dtype); `op` names the op (sigmoid and tanh saturate at 1).
struct ErrorStats {
  std::int64_t counted = 0;  // elements with finite y and r
  double max_rel = 0, mean_rel = 0, max_ulp = 0;
  std::int64_t flips = 0;
  double bits = 0;
  std::array<std::int64_t, trace::kErrorBins> error_bins{};  // the histogram, as above
  std::int64_t exact = 0;
};
ErrorStats compare(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op);
double relative_error_floor(DType dtype);  // the smallest normal of dtype
int significand_bits(DType dtype);         // 11, 8, 24, 53

// One twinned op: a row of the trace's /precision table (probes/trace/schema.h documents its fields).
using PrecisionRow = trace::PrecisionRow;

// The rankings of the twin's rows (precision_jump, rank_by_jump, rank_by_local, precision_trends) live with the
// analysis that the report shares (probes/analysis/precision.h), which reads them back from the trace.
using analysis::precision_jump;
using analysis::precision_trends;
using analysis::PrecisionTrend;
using analysis::rank_by_jump;
using analysis::rank_backward;
using analysis::rank_by_local;

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
  void on_update(const UpdateEvent& event) override;
  void on_fp8_quantize(const Fp8QuantizeEvent& event) override;
  // A block-scaled Linear's copy (below, "Block-scaled Linears"), kept for its GEMMs' reference; forwarded unchanged
  // (--what-if's copies are statistics only: not kept).
  void on_block_quantize(const BlockQuantizeEvent& event) override;
  bool wants_params() override;
  void on_params(const ParamsEvent& event) override;
  void on_step_begin(std::int64_t step) override;
  void on_step_end(const StepSummary& summary) override;
  void on_step_abandoned(std::int64_t step) override;

  const std::vector<PrecisionRow>& rows() const { return rows_; }
  // Ops with a low-precision output that the twin could not compute again, by name: how many times (and
  // ops of any dtype whose body threw when run again).
  const std::map<std::string, std::int64_t>& uncovered() const { return uncovered_; }

 private:
  void twin(const OpEvent& event);
  DType reference_dtype(DType out) const;  // what an op of output dtype `out` is computed again in
  void twin_backward(const OpEvent& event);  // the backward rows (twin.cpp, "the backward twin")
  void hand_over();  // the open step's rows to the sink
  void forget_fp8();  // the open step's FP8 operands and block-scaled copies (the step ended)
  // The reference of an FP8 Linear (below, "FP8 Linears"): its forward output before the rounding to the output
  // dtype, from the operands it quantized; undefined when `event` is not an FP8 Linear.
  Tensor fp8_forward_reference(const OpEvent& event);
  // Its backward node's dgrad and wgrad before their rounding, in place of `reference`'s first two; false when
  // `event` is not the node of an FP8 Linear whose forward the twin saw.
  bool fp8_backward_reference(const OpEvent& event, std::vector<Tensor>& reference);
  // The same for a block-scaled Linear (below, "Block-scaled Linears"), from the copies its BlockQuantizeEvents carried.
  Tensor block_forward_reference(const OpEvent& event);
  bool block_backward_reference(const OpEvent& event, std::vector<Tensor>& reference);

  std::shared_ptr<Hook> inner_;
  TwinOptions options_;
  bool active_ = false;  // twinning the open step
  std::int64_t step_ = -1;
  std::unordered_map<std::int64_t, Tensor> values_;      // seq -> the twin's f32 value, for the open step
  std::unordered_map<std::int64_t, ErrorStats> stats_;   // seq -> its accumulated errors
  struct Layout {
    const void* start = nullptr;  // where the op's output starts
    Shape strides;
    bool contiguous = false;
  };
  std::unordered_map<std::int64_t, Layout> layouts_;  // seq -> its output's layout
  std::vector<PrecisionRow> rows_;
  std::size_t handed_ = 0;  // rows_[0, handed_) went to the sink
  std::map<std::string, std::int64_t> uncovered_;
  // FP8 Linears of the open step, by module path: the operands cast since the module's last Linear or node
  // (input, weight, grad_output; Fp8QuantizeEvent copied), and the forward's quantized (input, weight) of each
  // FP8 Linear the twin compared, the latest last (its backward node takes the latest: autograd runs a module's
  // calls in reverse).
  struct Fp8Cast {
    bool seen = false;
    Fp8Quantized q;
  };
  struct Fp8Pending {
    Fp8Cast input, weight, grad_output;
  };
  std::unordered_map<std::string, Fp8Pending> fp8_pending_;
  std::unordered_map<std::string, std::vector<std::pair<Fp8Quantized, Fp8Quantized>>> fp8_forward_;
  // Block-scaled Linears of the open step, by module path, likewise: the copies quantized since the module's last
  // Linear or node (as GEMM operands, from BlockQuantizeEvent::decoded), and the forward's columnwise copies (input,
  // weight: the wgrad's and dgrad's operands) of each block Linear the twin compared, the latest last.
  struct BlockCopies {
    std::optional<BlockOperand> input_row, weight_row, input_col, weight_col, grad_row, grad_col;
  };
  std::unordered_map<std::string, BlockCopies> block_pending_;
  std::unordered_map<std::string, std::vector<std::pair<std::optional<BlockOperand>, std::optional<BlockOperand>>>>
      block_forward_;
};

}  // namespace ampscope::probe
