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
#include <functional>
#include <memory>
#include <span>
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

// A warning before anything breaks (no NaN/inf yet): section "Headroom" of docs/report-format.md.
//   near_f16_max:  an f16 op output (or f16 gradient) whose absmax came within
//                  AnalysisOptions::headroom_factor of f16's largest finite value (absmax * factor >= 65504)
//                  while still finite (f32 outputs are not judged: the scaled loss is large on purpose);
//   subnormal:     a large fraction (>= underflow_fraction) of an f16/bf16 op output is subnormal;
//   flush_to_zero: a cast turned a large fraction of the non-zero values into zero (cast_underflow);
//   below_f16:     at level full, a large fraction of a tensor's non-zero values have exponents below f16's
//                  smallest subnormal (2^-24): they would flush to zero in f16 (gradients mostly).
// Grouped like anomalies by (kind, phase, module, op, tensor): the first occurrence is kept, with a count.
struct HeadroomWarning {
  std::string kind;       // near_f16_max, subnormal, flush_to_zero, below_f16
  std::int64_t step = 0;
  std::int64_t seq = -1;  // -1 for a gradient
  trace::Phase phase = trace::Phase::forward;
  std::string module;
  std::string op;         // "" for a gradient
  std::string tensor;     // "output", or the parameter's name for a gradient
  std::string dtype;
  double absmax = 0;      // near_f16_max: the recorded absmax
  double fraction = 0;    // subnormal / flush_to_zero / below_f16: the fraction of values concerned
  std::string message;    // one sentence quoting the recorded numbers
  std::int64_t occurrences = 1;
  std::int64_t last_step = 0;
};

// What the GradScaler did over the run. verdict, one of:
//   "no_scaler"     the scale is 1 at every step (no GradScaler, or fp32/bf16 without one);
//   "healthy"       no skipped step, or skips rare and spread out (rate under 5% after settling);
//   "settled"       the early skips of a too-high initial scale, then none for the rest of the run;
//   "persistent"    skips keep coming (over 5% of the steps after the first settle window, or a run of
//                   more than 5 in a row): an overflow that backing off does not cure;
//   "collapsed"     the scale fell below 1;
//   "never_grows"   the scaler ran more than growth_interval steps (from the run's config) without a single
//                   growth, although no step was skipped at the end: the interval may be too long.
struct ScalerHealth {
  bool used = false;          // some step ran with a scale other than 1
  std::int64_t steps = 0;
  std::int64_t skipped = 0;
  double skip_rate = 0;       // skipped / steps
  std::int64_t longest_skip_run = 0;
  std::int64_t first_skip = -1, last_skip = -1;  // steps, -1 when none
  std::int64_t growths = 0, backoffs = 0;        // scale_after above / below the step's scale
  double scale_start = 1, scale_min = 1, scale_max = 1, scale_end = 1;
  std::string verdict = "no_scaler";
  std::string message;        // one sentence for the report
};

struct AnalysisOptions {
  double headroom_factor = 2.0;     // near_f16_max when absmax * headroom_factor >= 65504
  double underflow_fraction = 0.25; // subnormal / flush_to_zero / below_f16 from this fraction on
  std::int64_t rows_per_read = 200000;  // op rows read at once from a file (bounds memory)
};

struct Report {
  std::string path;           // the trace, when read from a file
  trace::RunInfo run;
  bool complete = true;       // false: the writer did not close the file (killed, failed or still running)
  std::int64_t steps = 0, op_rows = 0, grad_rows = 0;  // what was analysed
  std::vector<Diagnosis> anomalies;
  std::vector<HeadroomWarning> warnings;
  ScalerHealth scaler;
  bool healthy() const { return anomalies.empty(); }
};

// Streams a run through the rules one step at a time, so memory holds one step's rows plus a few numbers
// per step. Steps must come in increasing order, each once (all its rows in one call); rows of a step
// without a StepRow (a truncated trace's last step) pass step = nullptr.
//   Analyser a(options);  a.set_run(info);
//   for (...) a.add_step(&step_row, ops, grads, events, histograms);
//   Report rep = a.finish();
class Analyser {
 public:
  explicit Analyser(AnalysisOptions options = {});
  ~Analyser();
  Analyser(Analyser&&) noexcept;
  Analyser& operator=(Analyser&&) noexcept;

  void set_run(const trace::RunInfo& run, std::string path = "", bool complete = true);
  void add_step(std::int64_t step, const trace::StepRow* step_row, std::span<const trace::OpRow> ops,
                std::span<const trace::GradRow> grads, std::span<const trace::EventRow> events = {},
                std::span<const trace::HistogramRow> histograms = {});
  Report finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Progress of a long analysis: rows done of rows in all (called every read).
using Progress = std::function<void(std::int64_t done, std::int64_t total)>;

// Reads every step of the trace in blocks of about options.rows_per_read op rows. Throws what the reader
// throws (TraceError) for a damaged file.
Report analyse(trace::TraceReader& reader, const AnalysisOptions& options = {}, const Progress& progress = {});

// The same rules on rows already in memory (hand-built traces in tests); rows in any order.
Report analyse(const std::vector<trace::StepRow>& steps, const std::vector<trace::OpRow>& ops,
               const std::vector<trace::GradRow>& grads, const std::vector<trace::EventRow>& events = {},
               const std::vector<trace::HistogramRow>& histograms = {}, const AnalysisOptions& options = {});

// The --autocast-fp32 pattern for a module: the module itself, quoted ("'blocks.0.attn'").
std::string autocast_pattern(const std::string& module);

}  // namespace ampscope::analysis
