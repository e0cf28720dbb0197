// probes/analysis.h: the diagnosis of a trace (issue 7): from the recorded rows alone, what went wrong
// first, where, why, and what to change. The report command and the viewer both call analyse(), so they
// show the same conclusions. It reads only trace rows (probes/trace_schema.h): no runtime, no model.
//
//   trace::TraceReader r("run.h5");
//   analysis::Report rep = analysis::analyse(r);
//   if (!rep.anomalies.empty()) fmt::print("{} in {} at step {}: {}\n", rep.anomalies[0].op,
//                                          rep.anomalies[0].module, rep.anomalies[0].step, rep.anomalies[0].cause);
//
// Rules (each reads only what the probe recorded):
//   - Every OpRow with origin = true is an origin. Its cause, first rule that matches:
//       op log/log2/log10 with -inf or NaN                     log_of_zero (log of 0 gives -inf, of a negative NaN)
//       backward phase                                         gradient_overflow, or accumulating_gradients when
//                                                              stale skips follow (below)
//       cast_overflow > 0 (autocast's or to's cast overflowed)  f16_overflow (in the cast, before the op ran)
//       op exp with +inf                                       exp_overflow
//       op div/reciprocal/rsqrt with +-inf                     division_by_zero
//       +-inf in an f16 output                                 f16_overflow (a finite result beyond 65504)
//       NaN only (no inf)                                      invalid_operation (inf - inf, 0 * inf, 0 / 0)
//       anything else (inf in an f32 or bf16 output)           unknown
//   - A step whose forward holds non-finite outputs without any origin in it (the data were non-finite
//     before the first op) gives nonfinite_input at its first non-finite op.
//   - Skipped steps after a backward origin whose ops are all finite are stale gradients: the non-finite
//     .grad survived into the next step, so gradients are never cleared. That backward origin's cause
//     becomes accumulating_gradients (evidence: the stale steps and the /steps grad_norm trend).
//   - No non-finite op anywhere, and at most steps every recorded gradient has norm 0 and absmax 0 while
//     holding zeros: gradient_underflow (remedy: enable the scaler when the scale is 1 throughout, else
//     raise the initial scale; or bf16).
//   - The scale falls below 1 while skipping (a persistent overflow that backing off cannot fix):
//     scale_collapse, a step-level diagnosis after the origin that recurs; the origin says what to fix.
// Anomalies are grouped by (op, module, phase, cause): the first occurrence is kept, with a recurrence
// count and the last step it was seen; they are ordered by (step, seq) of the first occurrence, and
// step-level diagnoses (op "") sort after the origins of their step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "probes/trace_reader.h"
#include "probes/trace_schema.h"

namespace ampscope::analysis {

// The documented causes (Diagnosis::cause is one of these strings).
inline constexpr const char* kCauses[] = {
    "f16_overflow",       "exp_overflow",       "log_of_zero",        "division_by_zero",
    "invalid_operation",  "nonfinite_input",    "gradient_overflow",  "gradient_underflow",
    "accumulating_gradients", "scale_collapse", "unknown"};

inline constexpr double kF16Max = 65504.0;

struct Diagnosis {
  // Origin: where the anomaly first appeared. op and module are "" for step-level diagnoses
  // (gradient_underflow, scale_collapse); module is "" for an op outside any module (a hand-written loss).
  std::int64_t step = 0;
  std::int64_t seq = -1;
  trace::Phase phase = trace::Phase::forward;
  std::string module;
  std::string op;
  std::string in_dtypes;
  std::string out_dtype;
  std::string autocast;  // autocast's reason for the op's dtype, "" outside autocast

  std::string cause;                  // one of kCauses
  std::vector<std::string> evidence;  // sentences quoting recorded numbers

  // Propagation, in the step of the first occurrence.
  std::int64_t downstream_nonfinite = 0;  // later ops of that step whose output turned non-finite
  bool loss_nonfinite = false;
  std::vector<std::string> gradients;     // parameters whose gradients held NaN/inf in that step
  std::int64_t skipped_steps = 0;         // skipped steps from that step to the end of the run

  std::string remedy;

  std::int64_t occurrences = 1;  // steps (or rows) where the same origin came back, the first included
  std::int64_t last_step = 0;
};

struct ScalerHealth {
  bool used = false;          // some step ran with a scale other than 1
  std::int64_t steps = 0;
  std::int64_t skipped = 0;
  std::int64_t longest_skip_run = 0;
  double scale_start = 1, scale_min = 1, scale_max = 1, scale_end = 1;
};

struct Report {
  std::vector<Diagnosis> anomalies;
  ScalerHealth scaler;
  bool healthy() const { return anomalies.empty(); }
};

// Reads every step of the trace. Throws what the reader throws (TraceError) for a damaged file.
Report analyse(trace::TraceReader& reader);

// The same rules on rows already in memory (hand-built traces in tests, a streaming caller).
Report analyse(const std::vector<trace::StepRow>& steps, const std::vector<trace::OpRow>& ops,
               const std::vector<trace::GradRow>& grads, const std::vector<trace::EventRow>& events = {});

// The --autocast-fp32 pattern for a module: the module itself, quoted ("'blocks.0.attn'").
std::string autocast_pattern(const std::string& module);

}  // namespace ampscope::analysis
