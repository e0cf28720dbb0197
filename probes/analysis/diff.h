// probes/analysis/diff.h: the comparison of two traces (issue 7, typically an fp16 run against an fp32 run
// of the same seed): ops aligned by (step, phase, module, op, occurrence), the differences of their
// recorded statistics, dtype differences, the gradients, the two loss curves, the first step and op where
// the runs part, and what one run recorded that the other did not. `ampscope diff`, `train --compare` and
// the viewer's Compare panel all call these functions. Reads only trace rows: no runtime, no model.
//
//   trace::TraceReader a("run-fp32.h5"), b("run-fp16.h5");
//   analysis::DiffReport d = analysis::diff(a, b);
//   if (d.first_divergence) fmt::print("parted at step {} in {}\n", d.first_divergence->key.step, d.first_divergence->key.op);
//
// Producers: a trace is written by ampscope's runtime (`ampscope train`, the C++ API) or by the PyTorch recorder
// (`ampscope record`, its config's "recorder" is "ampscope.torch"). Both name rows alike (module paths of the
// model's modules, "h.0.attn.c_attn"; op names as torch users know them, the recorder renaming aten's: addmm ->
// linear, _softmax -> softmax, native_layer_norm -> layer_norm), so rows of the two producers align by the
// same key as two runs of ours. What one producer writes and the other does not is listed as only in a/b,
// not judged: the recorder's optimizer rows and the ops of torch.nn.utils.clip_grad_norm_, our runtime's
// backward rows of views (transpose, view, permute, slice, clone). Aligned rows whose output sizes differ
// describe different tensors (DifferentTensors) and are listed, not judged. Dtypes are compared on the floating
// inputs only: the recorder does not list integer and bool inputs (token ids, masks). DiffReport::producer_a/b
// name the producers; the text and JSON say when they differ.
//
// Alignment: within a step, the k-th row with the same (phase, module, op) in one run meets the k-th in the
// other (occurrence k, from 0). Rows without a partner are "only in a" / "only in b" (an fp16 run records
// casts an fp32 run does not have, for example). Op rows are compared in the steps both runs have a /steps
// row for, and in steps neither has one for (a step both writers stopped in); the op rows of a step that
// only one run finished are not listed one by one: the step is in steps_only_in_a/b. Rows outside any step
// (step -1: an evaluation pass between steps) are counted and not compared: they are no step.
//
// Scale-aware: a run with a GradScaler multiplies the loss by the scale before backward, so every backward
// row and every gradient before unscale_ holds values `scale` times the true ones. Backward rows' min, max,
// absmax, mean and rms are divided by the scale the step's backward used (the /steps row's `scale`; 1
// without a scaler); gradients are compared after unscale_ (or, when a run recorded only the scaled
// gradient, divided by the scale). The scales are powers of two, so the division is exact.
//
// What counts as a divergence, and why (docs/report-format.md has the long form):
//  - Rounding alone: an f16 result carries a relative error of up to u = 2^-11, a bf16 one 2^-8; errors of
//    D roundings along a path add up like a random walk, about sqrt(D) u, so a step of the samples
//    (D ~ 100) differs from fp32 by ~0.005 (f16) to ~0.04 (bf16) relative; over the steps the weights drift
//    further (Adam moves each weight by about lr whatever the gradient's size, so a gradient whose sign the
//    rounding flips moves it the other way). Measured on healthy pairs of every sample, 3 seeds, 30 steps:
//    op statistics at most 0.075 (bf16) and 0.05 (f16); gradient norms at most 0.155 (bf16: a conv bias,
//    whose gradient is a sum over the batch and positions that cancels like a mean).
//  - A numerical failure changes a statistic by a factor (a flush to zero 1, a halving 0.5), or shows
//    as a kind of its own: NaN/inf counts, an output pinned at a boundary, exact zeros.
//  - So the default threshold, 0.2, sits between the two on a log scale (sqrt(0.075 * 0.5) = 0.19: 2.7x the
//    worst healthy op difference measured, 2.5x under a halving; the gradient norms' margin is thinner, 1.3x).
//  - Each statistic is measured against the op's magnitude: the largest rms this op (same key) had in either
//    run in the steps compared so far. A rounding error is relative to the values a result is computed
//    from, so an output that shrank (a loss near 0, whose gradients shrink with it, differs by a few
//    percent of a tiny value as its margins drift) or a mean near 0 (the difference of two nearly equal
//    sums) has meaningless relative differences of its own. rel_rms = |rms_a - rms_b| / peak rms;
//    rel_mean = |mean_a - mean_b| / peak rms (|mean| <= rms).
//  - absmax is reported (rel_absmax, against the op's largest absmax so far) but does not decide: it is one
//    element, and rounding at a discontinuity (relu's kink, max-pool's choice, a mask) can switch which
//    element is largest; healthy pairs differ by up to 18% in it (cnn, seed 2). An absmax that overflows
//    shows in the NaN/inf counts, one pinned at the dtype's max as saturation.
//  - nonfinite: the NaN/+inf/-inf counts differ (max_rel inf), whatever the threshold.
//  - saturation: a forward output of an op whose range is open reaches the end of it in one run only
//    (sigmoid or softmax at exactly 0 or 1, tanh at exactly +-1, exp at exactly 0), or an f16/bf16 output
//    sits at its dtype's largest finite value in one run only. The distance to the boundary went to 0:
//    max_rel at least 1.
//  - zeros: names a divergence of the magnitudes when the fraction of exact zeros also differs by more than
//    the threshold (the zeroed values mattered). Zeros alone, with the magnitudes within the threshold, are
//    values too small to matter flushed to 0 (late in training, gradients below f16's 2^-24 even scaled).
//  - Losses: |loss_a - loss_b| / the largest |loss| of either run so far, for the same reason.
//  - Gradients: the L2 norm as the rms (against the parameter's largest norm so far) and the NaN/inf counts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "probes/trace/reader.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

struct DiffOptions {
  double threshold = 0.2;       // a relative difference above this is a divergence (the reasoning: above)
  double floor = 0;             // reference magnitudes below this count as this (0: none; the op's own largest
                                // magnitude so far is the reference, so two tiny values need no floor)
  std::size_t largest = 20;     // how many of the largest per-op differences DiffReport keeps
  std::int64_t rows_per_read = 200000;  // op rows read at once from each file (bounds memory: about 0.5 KB
                                        // per row, so 100 MB per file at the default); at least 1
};

struct OpKey {
  std::int64_t step = 0;
  trace::Phase phase = trace::Phase::forward;
  std::string module;
  std::string op;
  std::int64_t occurrence = 0;  // k-th row with this (phase, module, op) in the step, from 0
};

// Boundaries an op's output sits at (OpDiff::pins_a/b): the lower or upper end of an open range (sigmoid and
// softmax at exactly 0 or 1, tanh at exactly -1 or 1, exp at exactly 0), or the largest finite magnitude of
// its f16/bf16 dtype (65504 for f16).
inline constexpr unsigned kPinLower = 1, kPinUpper = 2, kPinDtypeMax = 4;

struct OpDiff {
  OpKey key;
  std::int64_t seq_a = -1, seq_b = -1;
  std::string dtypes_a, dtypes_b;       // "f16,f16 -> f16" (inputs -> output)
  std::int64_t step_b = 0;              // run b's own step number: key.step unless the steps are paired by
                                        // optimizer update (DiffReport::aligned_by_update)
  // The loss scale each backward row was divided by (its step's /steps scale; 1 for forward rows and runs
  // without a GradScaler; NaN when the step's scale is unknown, and then magnitudes are not compared).
  double scale_a = 1, scale_b = 1;
  trace::TensorHealth a, b;             // as compared: min, max, absmax, mean, rms divided by scale_a/b
  double rel_absmax = 0;                // reported, not deciding (see above)
  double rel_mean = 0, rel_rms = 0;     // against the op's largest rms so far
  double rel_zeros = 0;                 // |zero_a / numel_a - zero_b / numel_b|
  double max_rel = 0;                   // the larger of rel_mean and rel_rms (inf when the NaN/inf counts differ,
                                        // at least 1 when the pins differ)
  std::string stat;                     // why: "mean", "rms", "zeros", "saturation" or "nonfinite"
  unsigned pins_a = 0, pins_b = 0;      // kPin* bits: the boundaries each run's output sits at
  bool nonfinite_differs = false;       // NaN/+inf/-inf counts differ
  bool dtype_differs = false;           // the floating dtypes differ (integer and bool inputs are not compared)
  bool magnitudes_compared = true;      // false for a backward row whose step's loss scale is unknown, and for a
                                        // mask fill (where/masked_fill writing its dtype's lowest value)
  // DiffReport::first_divergence only: the ops of the same step, phase and module that ran before this row in
  // each run and have no partner in the other (in order): where the two runs computed different ops (a
  // PyTorch script's erf where ours ran tanh), the row that parts is the first aligned one after them.
  std::vector<std::string> unpaired_before_a, unpaired_before_b;
};

// The gradient of one parameter in one step, in both runs (after unscale_).
struct GradDiff {
  std::int64_t step = 0;
  std::int64_t step_b = 0;              // run b's own step number (as OpDiff::step_b)
  std::string param;
  double scale_a = 1, scale_b = 1;      // what the recorded row was divided by: 1 for a row after unscale_
  trace::GradRow a, b;                  // as compared: absmax and norm divided by scale_a/b
  double rel_norm = 0;                  // against the parameter's largest norm so far
  double rel_absmax = 0;                // against its largest absmax so far; reported, not deciding
  double max_rel = 0;                   // rel_norm, or inf when the NaN/inf counts differ
  std::string stat;                     // "norm" or "nonfinite"
  bool nonfinite_differs = false;
};

struct LossPoint {
  std::int64_t step = 0;                // run a's step (run b's when the step is in b only)
  std::int64_t step_b = 0;              // run b's own step number (as OpDiff::step_b)
  bool in_a = false, in_b = false;      // the step is recorded in that run
  double loss_a = 0, loss_b = 0;
  double scale_a = 1, scale_b = 1;
  bool skipped_a = false, skipped_b = false;
  double rel = 0;                       // |loss_a - loss_b| / the largest |loss| of either run up to this step
};

// Ops that ran in different dtypes in the two runs, grouped by (phase, module, op, dtypes_a, dtypes_b).
struct DtypeDifference {
  trace::Phase phase = trace::Phase::forward;
  std::string module, op;
  std::string dtypes_a, dtypes_b;
  std::int64_t count = 0;               // aligned rows with this difference
  std::int64_t first_step = 0;
};

// Rows of one run without a partner in the other, grouped by (phase, module, op).
struct Unmatched {
  trace::Phase phase = trace::Phase::forward;
  std::string module, op;
  std::int64_t count = 0;
  std::int64_t first_step = 0;
};

// Aligned rows of two producers whose output sizes differ, grouped by (phase, module, op, shape_a, shape_b):
// they describe different tensors of the op (a backward row of weight * x: our runtime records the weight's
// gradient, the PyTorch recorder the gradient that flows on), so they are listed and not judged.
struct DifferentTensors {
  trace::Phase phase = trace::Phase::forward;
  std::string module, op;
  std::string shape_a, shape_b;         // "[32]", "[2, 8, 32]"
  std::int64_t count = 0;
  std::int64_t first_step = 0;
};

// Who wrote a trace: "pytorch" (ampscope record: the config's "recorder" is "ampscope.torch") or "ampscope"
// (ampscope's runtime: ampscope train, the C++ API).
std::string producer_of(const trace::RunInfo& run);

struct DiffReport {
  bool diverged() const { return first_divergence || first_loss_divergence || first_grad_divergence; }
  bool producers_differ() const { return producer_a != producer_b; }

  std::string path_a, path_b;
  trace::RunInfo run_a, run_b;
  std::string producer_a, producer_b;   // producer_of(run_a/b)
  DiffOptions options;
  std::int64_t steps_compared = 0;      // steps recorded in both runs
  std::int64_t ops_aligned = 0;         // op rows with a partner
  // Op rows outside any step (step -1: an evaluation pass between steps): neither steps nor compared.
  std::int64_t rows_outside_steps_a = 0, rows_outside_steps_b = 0;
  std::vector<LossPoint> losses;        // every step of either run, in step order
  std::optional<std::int64_t> first_loss_divergence;  // first step whose losses differ beyond the threshold
  std::optional<OpDiff> first_divergence;             // first (step, seq in a) aligned op beyond the threshold
  std::vector<OpDiff> largest;          // the options.largest largest max_rel above 0, largest first (ties:
                                        // earlier step and seq first)
  std::int64_t grads_aligned = 0;       // (step, parameter) gradients recorded in both runs
  std::optional<GradDiff> first_grad_divergence;      // first (step, then a's order) beyond the threshold
  std::vector<DtypeDifference> dtype_differences;     // in order of first appearance
  std::vector<Unmatched> only_in_a, only_in_b;        // in order of first appearance
  std::vector<DifferentTensors> different_tensors;    // producers differ only; in order of first appearance
  // Steps only one run finished, or whose ops only one run recorded (--sample-every, the flight recorder).
  std::vector<std::int64_t> steps_only_in_a, steps_only_in_b;
  // Damage each reader found in a trace whose rest it could read (trace::TraceReader::damage).
  std::vector<std::string> damage_a, damage_b;
  // Steps a run skipped while its GradScaler calibrated (a skipped step with a finite loss, cured by a
  // smaller scale later and at a scale no unskipped step had run at before: the first steps of most f16 runs
  // at PyTorch's initial scale 65536). When the two runs' calibration skips differ, one run has taken fewer
  // optimizer updates from then on, so comparing step s with step s compares states an update or more
  // apart: the steps are then paired by optimizer update instead (aligned_by_update): calibration skips are
  // set aside (listed here, not compared) and the k-th remaining step of a is compared with the k-th of b.
  // Every step and loss point then carries b's own step number (step_b).
  std::vector<std::int64_t> calibration_skips_a, calibration_skips_b;
  bool aligned_by_update = false;
};

// The per-op comparison of one step's rows (the viewer's Compare panel): every aligned pair, in a's order.
// scale_a/b: the loss scale of that step in each run (the /steps row's `scale`), which backward rows are
// divided by. Without the earlier steps, an op's reference magnitude is the larger of its two rms here.
std::vector<OpDiff> diff_ops(std::span<const trace::OpRow> a, std::span<const trace::OpRow> b,
                             const DiffOptions& options = {}, double scale_a = 1, double scale_b = 1);

using DiffProgress = std::function<void(std::int64_t done, std::int64_t total)>;

// Streams both traces step by step (memory: a block of rows of each). Throws TraceError for a damaged file,
// Error for rows_per_read below 1.
DiffReport diff(trace::TraceReader& a, trace::TraceReader& b, const DiffOptions& options = {},
                const DiffProgress& progress = {});

}  // namespace ampscope::analysis
