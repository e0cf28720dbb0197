// probes/analysis_diff.h: the comparison of two traces (issue 7, typically an fp16 run against an fp32 run
// of the same seed): ops aligned by (step, phase, module, op, occurrence), the relative differences of
// their recorded statistics, dtype differences, the two loss curves, the first step and op where the runs
// part, and what one run recorded that the other did not. `ampscope diff`, `train --compare` and the
// viewer's Compare panel all call these functions. Reads only trace rows: no runtime, no model.
//
//   trace::TraceReader a("run-fp16.h5"), b("run-fp32.h5");
//   analysis::DiffReport d = analysis::diff(a, b);
//   if (d.first_divergence) fmt::print("parted at step {} in {}\n", d.first_divergence->key.step, d.first_divergence->key.op);
//
// Alignment: within a step, the k-th row with the same (phase, module, op) in one run meets the k-th in the
// other (occurrence k, from 0). Rows without a partner are "only in a" / "only in b" (an fp16 run records
// casts an fp32 run does not have, for example). Op rows are compared in the steps both runs have a /steps
// row for, and in steps neither has one for (ops outside steps, step -1); the op rows of a step that only
// one run finished are not listed one by one: the step is in steps_only_in_a/b.
// Relative difference of a statistic x: |x_a - x_b| / max(|x_a|, |x_b|, options.floor); 0 when both are
// NaN (no finite values in either); infinite when one is NaN and the other not. The compared statistics are
// absmax, mean and rms of the output; a difference in the NaN/inf counts is a divergence of its own
// (stat "nonfinite"), whatever the threshold.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "probes/trace_reader.h"
#include "probes/trace_schema.h"

namespace ampscope::analysis {

struct DiffOptions {
  double threshold = 0.05;      // a relative difference above this is a divergence
  double floor = 1e-6;          // magnitudes below this count as this (no huge ratios between two tiny values)
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

struct OpDiff {
  OpKey key;
  std::int64_t seq_a = -1, seq_b = -1;
  std::string dtypes_a, dtypes_b;       // "f16,f16 -> f16" (inputs -> output)
  trace::TensorHealth a, b;
  double rel_absmax = 0, rel_mean = 0, rel_rms = 0;
  double max_rel = 0;                   // the largest of the three (inf when the NaN/inf counts differ)
  std::string stat;                     // which: "absmax", "mean", "rms" or "nonfinite"
  bool nonfinite_differs = false;       // NaN/+inf/-inf counts differ
  bool dtype_differs = false;
};

struct LossPoint {
  std::int64_t step = 0;
  bool in_a = false, in_b = false;      // the step is recorded in that run
  double loss_a = 0, loss_b = 0;
  double scale_a = 1, scale_b = 1;
  bool skipped_a = false, skipped_b = false;
  double rel = 0;                       // relative difference of the losses (as for statistics)
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

struct DiffReport {
  std::string path_a, path_b;
  trace::RunInfo run_a, run_b;
  DiffOptions options;
  std::int64_t steps_compared = 0;      // steps recorded in both runs
  std::int64_t ops_aligned = 0;         // op rows with a partner
  std::vector<LossPoint> losses;        // every step of either run, in step order
  std::optional<std::int64_t> first_loss_divergence;  // first step whose losses differ beyond the threshold
  std::optional<OpDiff> first_divergence;             // first (step, seq in a) aligned op beyond the threshold
  std::vector<OpDiff> largest;          // the options.largest largest max_rel above 0, largest first (ties:
                                        // earlier step and seq first)
  std::vector<DtypeDifference> dtype_differences;     // in order of first appearance
  std::vector<Unmatched> only_in_a, only_in_b;        // in order of first appearance
  // Steps only one run finished, or whose ops only one run recorded (--sample-every, the flight recorder).
  std::vector<std::int64_t> steps_only_in_a, steps_only_in_b;
};

// The per-op comparison of one step's rows (the viewer's Compare panel): every aligned pair, in a's order.
std::vector<OpDiff> diff_ops(std::span<const trace::OpRow> a, std::span<const trace::OpRow> b,
                             const DiffOptions& options = {});

using DiffProgress = std::function<void(std::int64_t done, std::int64_t total)>;

// Streams both traces step by step (memory: a block of rows of each). Throws TraceError for a damaged file,
// Error for rows_per_read below 1.
DiffReport diff(trace::TraceReader& a, trace::TraceReader& b, const DiffOptions& options = {},
                const DiffProgress& progress = {});

}  // namespace ampscope::analysis
