// probes/analysis/analysis.h: the diagnosis of a trace (issue 7): from the recorded rows alone, what went wrong
// first, where, why, and what to change. The report command and the viewer both call analyse(), so they
// show the same conclusions. It reads only trace rows (probes/trace/schema.h): no runtime, no model.
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
//     before the first op) gives nonfinite_input at its first non-finite op; nonfinite_weights instead when
//     the inputs of that op that no recorded op produced and that can hold NaN (not integers) are parameters
//     only, or parameters and data in a run that loaded its weights with --model-allow-nonfinite (its recorded
//     config says so), and no input came from an op the probe did not record: the weights held them, not the data.
//   - Skipped steps after a backward origin whose ops are all finite are stale gradients: the non-finite
//     .grad survived into the next step, so gradients are never cleared. That backward origin's cause
//     becomes accumulating_gradients (evidence: the stale steps and the /steps grad_norm trend).
//   - No non-finite op anywhere, and at most steps every recorded gradient has norm 0 and absmax 0 while
//     holding zeros: gradient_underflow (remedy: enable the scaler when the scale is 1 throughout, else
//     raise the initial scale; or bf16).
//   - The optimizer turned finite f16/bf16 parameter elements NaN/inf in a step whose forward pass and whose
//     gradient of that parameter were finite (a "nonfinite_update" event, analysis_optimizer.h): a diagnosis in
//     the optimizer phase, op the optimizer, module the parameter. optimizer_eps_underflow when it is Adam or
//     AdamW and its eps rounds to 0 in the state's dtype (f16: eps <= 2^-25, 1e-8 included), so sqrt(v) + eps
//     is 0 where v is 0; unknown otherwise. Later steps non-finite from their first op are its evidence.
//   - The scale falls below 1 while skipping (a persistent overflow that backing off cannot fix):
//     scale_collapse, a step-level diagnosis after the origin that recurs; the origin says what to fix.
// Anomalies are grouped by (op, module, phase, cause): the first occurrence is kept, with a recurrence
// count and the last step it was seen; they are ordered by (step, seq) of the first occurrence, and
// step-level diagnoses (op "") sort after the origins of their step.
#pragma once

#include <cstdint>
#include <limits>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "probes/trace/reader.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// The documented causes (Diagnosis::cause is one of these strings).
inline constexpr const char* kCauses[] = {
    "f16_overflow",       "exp_overflow",       "log_of_zero",        "division_by_zero",
    "invalid_operation",  "nonfinite_input",    "nonfinite_weights",  "gradient_overflow",  "gradient_underflow",
    "accumulating_gradients", "scale_collapse", "optimizer_eps_underflow", "unknown"};

inline constexpr double kF16Max = 65504.0;

// Root causes: why the values an origin met were what they were, found by walking the dataflow
// provenance (trace::OpRow::inputs) upstream from the origin.
//   saturation    an op whose mathematical range is open returned the boundary in f16/bf16: sigmoid or
//                 tanh at exactly 1 (or -1), softmax probabilities at exactly 0 or 1, exp at 0;
//   cancellation  an add or sub returned exact zeros from inputs that held none (nearly equal values
//                 subtracted: 1 - s with s rounded to 1);
//   underflow     an op returned exact zeros from non-zero inputs (a product or a cast below the dtype's
//                 smallest subnormal; an added epsilon that rounds to 0 in the dtype does not lift them);
//   amplification an overflow's values were made far larger upstream: an op whose output's absmax is at least
//                 8 times its input's (a division by a small temperature, a large factor or weight, a dot
//                 product nothing scales by 1/sqrt(d)); ChainLink::factor says by how much.
inline constexpr const char* kRootCauses[] = {"saturation", "cancellation", "underflow", "amplification"};

// Remedy kinds (Remedy::kind). Each is applied and re-run in tests/analysis/user_models_test.cpp.
inline constexpr const char* kRemedyKinds[] = {
    "stable_formulation",  // a fused, stable op instead of the hand-written one (code only)
    "clamp",               // clamp the input of the op (value: the bound, representable in the op's dtype)
    "epsilon",             // an epsilon that survives the dtype (value)
    "autocast_fp32",       // keep an op or module in f32 (pattern, and whether it names an op or a module)
    "cast_f32",            // cast the input to f32 by hand (an op outside autocast, which overrides cannot reach)
    "rescale_input",       // the values feeding the op are too large: standardise the data or activations
    "bf16",                // train in bf16: only for range problems (overflow, underflow of gradients)
    "learning_rate",       // lower the learning rate (value: a suggestion)
    "init_scale",          // the GradScaler's initial scale (value)
    "enable_scaler",       // use a GradScaler
    "zero_grad",           // clear gradients every step
    "finite_mask",         // mask with a finite value rather than the dtype's extreme
    "clean_data",          // the input data hold NaN/inf
    "finite_weights",      // the weights held NaN/inf before the first op: load finite ones (code only)
    "record_every_op",     // the probe filtered or sampled the origin away: record every op and run again
    "compare_fp32",        // nothing specific: compare with an fp32 run
    // An FP8 Linear (`--precision fp8`): keep its GEMMs out of FP8, in bf16 (pattern: the module). The remedy of
    // fp8_error_dominates (verified by `ampscope fix`) and of a PRECISION jump at an FP8 Linear (kind
    // fp8_quantization); likewise for block-scaled Linears (block_error_dominates, block_quantization).
    "fp8_keep_bf16",
    // Precision remedies (the PRECISION section, from the f32 twin's rows; code only):
    "accumulate_f32",      // keep a running total (or a reduction's accumulator) in f32
    "accumulate_f64",      // the same in f64, for an f32 accumulator (an f64 twin's row: `--twin-f64`)
    "compute_f64",         // compute an f32 op (and what feeds it unrounded) in f64 (an f64 twin's row)
    "reorder",             // reorder the computation: subtract before rounding, add small terms together first
    // Swamped updates (the SWAMPED UPDATES section, from /updates; code only):
    "master_weights_f32",  // keep the parameters in f32 (autocast runs the ops in f16/bf16): updates survive
    // An overflow whose values an op upstream amplified (root cause amplification; code only). smaller_scale and
    // scale_scores are applied and re-run in tests/analysis/user_models_report_test.cpp; temperature is checked
    // on hand-built rows (analysis_rules_test.cpp) and normalise on the attention-overflow scenario, not re-run.
    "temperature",         // divide by a larger value (value: a divisor that keeps the values in range on the batch)
    "smaller_scale",       // multiply by a smaller factor (value: a factor that keeps the values in range)
    "scale_scores",        // scale a dot product's operand by 1/sqrt(d) before the product (value: 1/sqrt(d))
    "normalise",           // a layer_norm on what a matmul with large weights produces
};

// One remedy in the two forms a user needs: the `ampscope train` option (empty when none applies, for
// example a change to a hand-written loss) and the C++ for a training loop of their own.
struct Remedy {
  std::string kind;     // one of kRemedyKinds
  std::string text;     // what to change and why, one or two sentences
  std::string flag;     // "--autocast-fp32 'blocks.0.attn'", "--lr 0.0005", ""
  std::string code;     // "AutocastOverrideGuard keep_f32({.module = \"blocks.0.attn\", .precision = Precision::f32});"
  std::string pattern;  // autocast_fp32: the glob
  bool pattern_is_op = false;  // autocast_fp32: the glob names ops (true) or module paths (false)
  double value = 0;     // clamp/epsilon: the bound; learning_rate, init_scale: the suggested value
  bool verified = false;  // a re-run by `ampscope fix` removed the anomaly with it (mark_verified, analysis_fix.h)
};

// One op on the way from the root cause to the origin (Diagnosis::chain).
struct ChainLink {
  std::int64_t seq = -1;
  trace::Phase phase = trace::Phase::forward;
  std::string op, module, out_dtype;
  std::string autocast;  // autocast's reason for the op's dtype ("" outside autocast)
  std::string role;      // "saturation", "cancellation", "underflow", "amplification", "passes on", "origin"
  std::string evidence;  // one sentence quoting the recorded numbers of this op
  // amplification: how many times larger the op made the values, its output's absmax over its input's (a lower
  // bound when its output overflowed); 0 for the other roles.
  double factor = 0;
};

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

  // The root cause, when the provenance shows one: chain runs from the root op to the origin (the origin
  // last); root_cause is one of kRootCauses, "" when the walk found none (or the trace has no provenance).
  std::string root_cause;
  std::vector<ChainLink> chain;
  // Silent damage: ops of the step that took the non-finite values in and returned finite ones (rsqrt of
  // inf giving 0, a clamp, a mask), and the later ops whose finite outputs are wrong because of them.
  std::vector<std::string> absorbed_by;     // "rsqrt in blocks.1.norm (seq 14)"
  std::int64_t silently_wrong = 0;          // ops downstream of those, finite but computed from wrong values

  std::vector<Remedy> remedies;  // best first
  std::string remedy;            // the remedies' texts in one paragraph (what the text report prints)

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
  // Calibration: skipped steps whose forward pass and loss were finite, whose gradients overflowed only at
  // the scale of that step, and which a smaller scale cured (a later unskipped step ran at a smaller scale,
  // or, for the run's last step, an earlier skip at the same scale was cured; and no earlier unskipped step
  // ran at this scale or above). This is what the GradScaler is designed to
  // do while it settles from its initial scale, or after a growth overshoots; such skips are counted here,
  // not reported as anomalies. docs/report-format.md, "Calibration".
  std::int64_t calibration_skips = 0;
  std::int64_t last_calibration_step = -1;
};

// What the probe's set-up may have hidden (from the trace's root attribute `probe`): a filter or sampling
// means the origin may be in an op the trace never saw.
struct Coverage {
  bool known = false;                   // the trace says how the probe was set up (format_version 2)
  std::string level;                    // "health", ...
  std::vector<std::string> ops, modules;  // the probe's filters ([] records every op)
  std::int64_t every = 1;               // sampling: steps recorded
  bool flight_recorder = false;
  std::vector<std::string> autocast_overrides;  // "module 'blocks.*.attn' -> f32"
  std::vector<std::string> notes;       // warnings for the report: "the probe recorded only modules 'head': ..."
};

// The PRECISION section (docs/report-format.md): from the f32 twin's rows (trace::PrecisionRow, `ampscope train
// --twin`), where precision was lost. One entry per op (op and module), its evidence from one row.
//   jump      ops ranked by how much more accumulated error leaves the op than reaches it: its output's mean
//             relative error over its inputs' (the inputs' taken as at least one rounding of the output dtype,
//             2^-p); a chain of calls of the same op, each fed by the one before (a running sum written as
//             acc = acc + x), is judged from the error entering its first call; an op whose outputs hit 0, inf,
//             the largest finite value or (sigmoid, tanh) 1 where f32's did not, and that ran in f16/bf16,
//             scores at least the fraction of such outputs times 2^p (half that for sigmoid and tanh: their
//             outputs at 1 keep their value within a rounding, so the op that then cancels them ranks above),
//             unless an input's producer (not a saturating one) had such outputs already: passed on, not new.
//             score = that factor (1: passes its inputs' error on).
//   local     ops ranked by their own rounding's mean relative error (ops run in f16/bf16 only).
//   trend     ops whose accumulated error grows over the steps: least-squares slope of log2(error) per step
//             (probes/twin.h precision_trends), listed when it is over 0.05 bits per step and the error grew.
//   conditioning  add, sub, rsub, sum and mean ranked by their condition number (cond).
//   backward  autograd nodes whose backward ran in f16/bf16 (the twin's backward rows, format_version 6), ranked
//             by their local mean relative error; named by the forward op (op, module) each belongs to.
// kind of an entry: cancellation (an add/sub with cond >= 8 whose output lost what its inputs had),
// saturation (sigmoid/tanh outputs at 1 where f32's are not), accumulation (a chain of 8 or more calls whose
// error grew), reduction (sum/mean), boundary (other outputs at 0, inf or the largest value), rounding;
// fp8_quantization: a jump or trend entry (accumulated error) of a Linear that ran its GEMMs in FP8, which would
// otherwise read rounding: its accumulated error is against the unquantized f32 Linear, so it holds the FP8
// quantization of its operands (its local error, against the same FP8 GEMM in f32, is the bf16 rounding alone:
// probes/twin.h), and its remedy is --fp8-keep-bf16 (mark_fp8_linears); block_quantization: the same for a Linear
// that ran its GEMMs block-scaled (--precision mxfp8|nvfp4; mark_block_linears).
struct PrecisionEntry {
  std::string op, module, out_dtype;
  // An FP8 Linear's entry in a list of accumulated error (jump, trend): the FP8 format of its forward operands
  // ("e4m3"; "e4m3/e5m2" if they differ), which its label shows ("fp8 e4m3 -> bf16"); a block-scaled Linear's: its
  // block format ("mxfp8", "nvfp4"; label "nvfp4 -> bf16"); "" otherwise.
  std::string fp8;
  // What the twin computed the op in, the errors' reference (analysis::reference_of): "f32", or "f64" for an f32
  // op twinned by `--twin-f64` (and an f64 op).
  std::string reference = "f32";
  std::string phase = "forward";    // "backward": an autograd node of op (the list backward), local error only
  std::int64_t step = 0, seq = -1;  // the row the evidence quotes
  std::string kind;
  double score = 0;                 // the ranking value of the list the entry is in
  std::int64_t calls = 1;           // accumulation: calls in the chain; else 1
  double in_error = 0;              // mean relative error reaching the op (a chain: its first call)
  double in_max_error = 0;
  double error = 0, max_error = 0;  // accumulated mean and max relative error of its output
  double local_error = 0, local_max_error = 0;
  double bits = 0;                  // bits of agreement of its output
  double cond = 0;                  // NaN when the op has none
  std::int64_t flips = 0, numel = 0;
  double bits_per_step = 0;         // trend
  std::int64_t steps = 0;           // trend: steps twinned
  double first = 0, last = 0;       // trend: error on the first and last step
  std::vector<std::string> producers;  // the ops whose outputs its inputs are ("sigmoid"), from /ops provenance
  std::vector<std::string> producer_dtypes;  // each producer's output dtype ("f16"), beside producers
  std::string evidence;             // one sentence quoting the numbers above
  std::vector<Remedy> remedies;     // best first; empty for an op that lost little (score under 8)
};

struct PrecisionSection {
  std::int64_t rows = 0;        // /precision rows read (0: the run was not twinned)
  std::int64_t steps = 0;       // steps twinned
  std::int64_t ops = 0;         // distinct ops (op and module)
  std::vector<PrecisionEntry> by_jump, by_local, by_trend, conditioning;  // at most 5 each, highest first
  // The f32 twin's backward rows (format_version 6): how many, over how many nodes (op and module of the forward
  // op each belongs to), and the nodes of the largest local mean relative error (at most 5, highest first; kind
  // boundary when gradient elements flipped to 0/inf/the largest value, else rounding; error and max_error are
  // the local errors). Only the lists above read forward rows.
  std::int64_t backward_rows = 0, backward_nodes = 0;
  std::vector<PrecisionEntry> backward;
  bool recorded() const { return rows > 0; }
};

// The SWAMPED UPDATES section (docs/report-format.md): from the /updates rows (trace::UpdateRow), written for
// parameters stored in f16/bf16 that an optimizer updated. A parameter *stopped learning* when, over the last
// `window` steps that have rows (the window is kSwampedWindow steps, fewer in a shorter run), more than half
// of its non-zero updates were swamped: p + u rounded back to p.
inline constexpr std::int64_t kSwampedWindow = 10;

struct SwampedParam {
  std::string param, dtype;
  std::int64_t numel = 0;
  std::int64_t steps = 0;                 // steps of the window with a row for it
  std::int64_t nonzero = 0, swamped = 0;  // summed over those steps
  double fraction = 0;                    // swamped / nonzero
  double param_abs_mean = 0;              // the rows' means, weighted by their nonzero counts
  double update_abs_mean = 0;
  // Half an ulp of the dtype at param_abs_mean (2^(floor(log2 |p|) - significand bits)): an update below it
  // rounds away.
  double half_ulp = 0;
  std::string evidence;           // one sentence quoting the numbers above
  std::vector<Remedy> remedies;   // master_weights_f32
};

struct SwampedSection {
  std::int64_t rows = 0;    // /updates rows read (0: no f16/bf16 parameter was updated while recorded)
  std::int64_t steps = 0;   // steps with rows
  std::int64_t params = 0;  // distinct parameters
  std::int64_t window = 0;  // the last steps judged
  std::int64_t first_step = 0, last_step = 0;  // of the window
  std::vector<SwampedParam> stalled;  // parameters that stopped learning, highest fraction first
  std::vector<SwampedParam> all;      // every parameter over the window, highest fraction first
  bool recorded() const { return rows > 0; }
};

// The FP8 OPERANDS section (docs/report-format.md): from the /fp8 rows (trace::Fp8Row) of a --precision fp8 run,
// each FP8 Linear operand (module, operand) over the recorded steps: what fraction of its nonzero values
// underflowed to zero, became subnormal codes or saturated at +-max, and its quantization error.
struct Fp8OperandSummary {
  std::string module, operand, format;  // "fc1", "grad_output", "e5m2"
  std::int64_t steps = 0;               // recorded steps with a row for it
  std::int64_t nonzero = 0, underflow = 0, subnormal = 0, saturated = 0;  // summed over those steps
  double underflow_fraction = 0, subnormal_fraction = 0, saturated_fraction = 0;  // of nonzero, over all steps
  // The step where each fraction was highest (the first such step) and its fraction there.
  std::int64_t worst_underflow_step = 0, worst_saturated_step = 0;
  double worst_underflow_fraction = 0, worst_saturated_fraction = 0;
  double max_rel_rms_error = 0;  // the largest relative RMS quantization error of a step
  double last_amax = 0, last_scale = 1;  // at the last recorded step
  // The optional /fp8 columns (NaN / -1 when the trace lacks them, trace::Fp8Row): the widest dynamic range of a
  // step, in binades, and at the last recorded step the ranges and the history state that sets the next scale.
  double max_dynamic_range = std::numeric_limits<double>::quiet_NaN();
  double last_dynamic_range = std::numeric_limits<double>::quiet_NaN();
  double last_quantized_dynamic_range = std::numeric_limits<double>::quiet_NaN();
  std::int64_t last_history_len = -1;  // 0: current scaling
  double last_history_amax = std::numeric_limits<double>::quiet_NaN();
  std::int64_t last_history_amax_step = -1;
};

// FP8 findings (docs/fp8.md, "Diagnoses"): calibration-like, not anomalies. The casts saturate (satfinite) and
// underflow silently, so nothing here is a NaN/Inf; a finding says which operand lost values, over which recorded
// steps, and which --fp8-* options would stop it. Judged per recorded step on that step's row.
//
// Gradients in E4M3 underflowing: a grad_output operand quantized to e4m3 with more than this fraction of its
// nonzero values quantized to zero in a step. 2% is the level bionemo's FP8 analyzer flags in its gradient
// underflow heatmaps; E4M3's range below the scaled amax is 2^-9 / 448, about 2^-18 (E5M2's is 2^-16 / 57344,
// about 2^-32), so gradients whose spread is wider than that lose their small values, which HYBRID keeps.
inline constexpr double kFp8GradUnderflowThreshold = 0.02;
// Silent saturation: an operand with more than this fraction of its nonzero values clipped at +-max in a step, in a
// step whose relative RMS quantization error (trace::Fp8Row::rel_rms_error) exceeds its format's unit roundoff
// (fp8_unit_roundoff, below). The delayed recipe clips by design wherever an amax grew past the history's: values
// between max and amax * scale. Clipped by less than a rounding they lose no more than rounding would (E4M3 rounds
// everything in (432, 464) to 448 anyway): the sample transformer's weights clip 1.1-3.4% in steps 1 to 4 at
// amax * scale up to 1.067 max with an RMS error of 0.027 (0.43 u, as unclipped steps). A step's RMS error above
// u is what rounding cannot make: values were lost, and with over 1% clipped, to the clipping (docs/fp8.md).
inline constexpr double kFp8SaturationThreshold = 0.01;

// A stale delayed scale (docs/fp8.md, "Diagnoses"): an operand's amax spikes in one recorded step, the next step's
// scale is fp8_max / 2^margin / (the spike's amax), and the underflow fraction of the steps cast with that scale
// rises by more than kFp8StaleUnderflowJump over the spike step's (cast with the scale from before the spike).
// A spike: the amax is at least kFp8SpikeRatio times the previous recorded step's and the next step's: one binade,
// the smallest drop of the scale that moves the underflow boundary a whole exponent step.
inline constexpr double kFp8SpikeRatio = 2.0;
// The new underflow: of the nonzero values, this many more quantize to zero than in the spike step (2%, the level
// of kFp8GradUnderflowThreshold, applied to the values the held scale loses).
inline constexpr double kFp8StaleUnderflowJump = 0.02;
// Every delayed scale lags one step (most_recent too: the step after a spike is cast with the spike's scale), and a
// history of 2 holds it one step more; a scale is stale when the raised underflow lasts longer than that: this many
// consecutive recorded steps. A spike in the last two recorded steps cannot be told from the lag.
inline constexpr std::int64_t kFp8StaleMinHeld = 3;
// The shorter history offered: the longest that cannot hold a spike kFp8StaleMinHeld steps.
inline constexpr std::int64_t kFp8ShortHistory = kFp8StaleMinHeld - 1;

// A layer whose FP8 error dominates (fp8_error_dominates): the Linear with the largest mean relative RMS quantization
// error of an operand over the recorded steps (trace::Fp8Row::rel_rms_error), measured in units of the operand's
// format's unit roundoff, if that error exceeds the unit roundoff: 2^-4 (E4M3: 4 significant bits) or 2^-3 (E5M2). Round to nearest moves a value
// in the normal range and under +-max by at most that much relative to itself, so an RMS error above it can come
// only from values lost to underflow, subnormal codes or saturation; ordinary runs sit at about 0.4 of it.
inline double fp8_unit_roundoff(const std::string& format) { return format == "e5m2" ? 0.125 : 0.0625; }

// `ampscope fix` verifies the fp8_error_dominates remedy (--fp8-keep-bf16 MODULE) by the re-run's final loss: within
// fp8_loss_tolerance of the bf16 run's (same seed, same steps, so the same batches), a tolerance derived from the
// bf16 run's own losses (docs/fp8.md, "The loss tolerance"). A run's final loss is one batch's loss, and the loss
// moves around its trend from batch to batch: sigma, estimated from the second differences of the last
// kFp8LossNoiseSteps recorded losses (L_t - 2 L_{t-1} + L_{t-2} removes a locally linear trend; for independent
// noise of deviation sigma its variance is 6 sigma^2), so sigma = sqrt(mean of the squared second differences / 6).
// The tolerance is kFp8LossNoiseSigmas sigma relative to the bf16 run's final loss: a remedy closer to bf16 than
// that is within what the bf16 run's own last steps scatter around their trend. NaN (nothing verifies by loss) with
// fewer than 3 losses or a non-finite one among them, or a final loss of 0. A tolerance of 1 or more would accept any
// loss from 0 to twice the bf16 run's: its final loss then measures nothing, and `fix` verifies nothing by loss.
inline constexpr std::size_t kFp8LossNoiseSteps = 5;
inline constexpr double kFp8LossNoiseSigmas = 2.0;
double fp8_loss_tolerance(std::span<const double> bf16_losses);

// The run's FP8 options as the trace's configuration records them (fp8_run_settings); known false when the
// configuration does not say (a trace from elsewhere): then every remedy is offered.
struct Fp8RunSettings {
  bool known = false;
  std::string recipe = "delayed", format = "hybrid", algo = "max";
  std::int64_t history = 1024;
  std::int64_t margin = 0;
  std::vector<std::string> keep_bf16;
};
// From RunInfo::config (JSON); a configuration without the fp8_* keys or not JSON gives known = false.
Fp8RunSettings fp8_run_settings(const std::string& config_json);

struct Fp8Remedy {
  std::string option;        // "--fp8-format", "--fp8-margin", "--fp8-recipe"
  std::string value;         // "hybrid", "1", "current"
  std::string command_line;  // "--fp8-format hybrid"
  std::string why;
  bool verified = false;  // `ampscope fix`'s results file beside the trace confirms it (mark_verified)
};

struct Fp8Finding {
  std::string kind;  // "e4m3_grad_underflow", "stale_scale", "saturation" or "fp8_error_dominates"
  std::string module, operand, format;
  std::int64_t first_step = 0, last_step = 0;  // the first and last recorded step over the threshold
  std::int64_t steps = 0;                       // recorded steps over the threshold
  // Summed over the steps over the threshold: the nonzero values and those that underflowed (or saturated).
  std::int64_t nonzero = 0, count = 0;
  double fraction = 0;        // count / nonzero
  double threshold = 0;       // the per-step fraction it exceeded
  std::int64_t worst_step = 0;
  double worst_fraction = 0;  // the highest per-step fraction, at worst_step (the first such step)
  // Saturation only: the largest amax * scale of a flagged step (how far past max the scaled values reached) and
  // the margin 2^margin that brings it to or under the format's max (at least 1); error and error_bound (below) are
  // the largest relative RMS error of a flagged step and the format's unit roundoff it exceeds.
  double max_scaled_amax = 0;
  int margin = 0;
  // stale_scale only: the spike step, the amax of the recorded step before it and at it, the scale the spike
  // step used and the one held after it, the underflow fraction in the spike step (before) and the step after it
  // (after), and the history length that holds it (the run's --fp8-amax-history with max; 0 when unknown).
  // first_step..last_step are the steps cast with the held scale and the underflow raised (steps of them).
  std::int64_t spike_step = 0;
  double amax_before = 0, amax_spike = 0, scale_before = 0, scale_held = 0;
  double underflow_before = 0, underflow_after = 0;
  std::int64_t window = 0;
  // fp8_error_dominates only: the module's worst operand's mean relative RMS error over its recorded steps, the
  // bound it exceeds (fp8_unit_roundoff of its format), and the module next by error / bound, with its error.
  double error = 0, error_bound = 0, next_error = 0;
  std::string next_module;
  // Block-scaled findings (kinds mx_floor_clipping, block_outlier, block_error_dominates, block_copy_mismatch; docs/
  // fp8.md "Block-scaled diagnoses"), from the /blocks rows: the copy judged ("rowwise", "columnwise"; for
  // block_copy_mismatch the one that lost more), and at worst_step the block flattened most (block_outlier: its step,
  // origin (row, col) in the quantized matrix, the values it zeroed, the copy's widest block range in binades and
  // the element format's in-block range it exceeds) or both copies' errors and underflow fractions
  // (block_copy_mismatch: error/worst_fraction are the worse copy's, other_* the other's). mx_floor_clipping also
  // fills error/error_bound (the worst step's RMS error, the element's unit roundoff) and count/nonzero with the
  // saturated values; blocks_clipped summed over the flagged steps.
  std::string copy;
  std::int64_t block_step = -1, block_row = -1, block_col = -1, block_zeroed = 0, block_values = 0, blocks_clipped = 0;
  // block_outlier: the count the flagged block had to reach at its step (blocks.h block_flattened_bar).
  std::int64_t block_bar = 0;
  double block_range = 0, range_bound = 0;
  double other_error = 0, other_fraction = 0;
  // block_error_dominates measured by the f32 twin (twin true; a --twin run's /precision rows of its block-scaled
  // Linears): operand "output" and copy "" (the Linear's output is measured, not a copy); over the Linear's twinned
  // forward rows (steps of them, first_step..last_step), jump is the mean of precision_jump (its output's
  // accumulated mean relative error against the unquantized f32 Linear, over its inputs'), error and in_error the
  // means of those two errors, error_bound = threshold the element's unit roundoff that error exceeds; worst_step
  // the row of the largest jump (worst_jump, its error worst_fraction); next_module the Linear next by mean jump
  // (next_jump, next_error). twin false: the /blocks rule (the copy's mean RMS error; jump fields 0).
  bool twin = false;
  double jump = 0, in_error = 0, worst_jump = 0, next_jump = 0;
  std::vector<Fp8Remedy> remedies;
};
// The block-scaled kinds above (block_finding_kind): fix judges them by their re-run's /blocks rows and its final
// loss against the bf16 run's.
inline bool block_finding_kind(const std::string& kind) {
  return kind == "mx_floor_clipping" || kind == "block_outlier" || kind == "block_error_dominates" ||
         kind == "block_copy_mismatch";
}
// The relative rounding error an element format cannot exceed inside its range (round to nearest, half a spacing
// over the smallest value of a binade): E4M3 (MXFP8's elements) 2^-4, E2M1 (NVFP4's: 2 significant bits) 2^-2.
inline double block_unit_roundoff(const std::string& format) { return format == "nvfp4" ? 0.25 : 0.0625; }
// The widest range a block can hold without its smallest values rounding to 0, in binades: log2 of the element's
// largest value over half its smallest non-zero one (values under half of it round to 0): E2M1 log2(6 / 0.25) =
// 4.58, E4M3 log2(448 / 2^-10) = 18.81 (MX round-up puts the block's amax at or under 448).
inline double block_element_range(const std::string& format) {
  return format == "nvfp4" ? 4.584962500721156 : 18.807354922057604;
}
// block_outlier and block_copy_mismatch judge a copy's step against what a block WITHOUT an outlier loses, from a
// stated null model (docs/fp8.md "Block-scaled diagnoses", blocks.h block_null): a block's values iid Gaussian, its
// scale set by its own amax. kBlockFalseAlarm is the chance a copy's step of null blocks gives either finding: the
// outlier bar is the smallest count the worst of the step's blocks reaches with at most this chance (blocks.h
// block_flattened_bar); the mismatch's underflow bar puts the gap of two binomial fractions kBlockMismatchZ standard
// errors out, the two-sided normal quantile of the same chance (blocks.h block_mismatch_bar).
inline constexpr double kBlockFalseAlarm = 1e-3;
inline constexpr double kBlockMismatchZ = 3.2905267314918945;  // Phi^-1(1 - kBlockFalseAlarm / 2)

// The delayed recipe's start-up (docs/fp8.md, "Start-up"): an operand's first casts use the initial scale 1, set
// before any amax was seen (core/fp8_recipe.h make_delayed_scaling_state), so what they lose (a whole E4M3 gradient
// below 2^-9, values above 448 clipped) says nothing about the run's scales, as a GradScaler's calibration skips say
// nothing about its gradients. A row is a start-up row (fp8_start_up_row) when it was cast with the delayed recipe
// (history_len > 0), with scale exactly 1, the history's amax after its cast is its own step's (history_amax_step
// == step, or its amax is 0), and no earlier row of the operand recorded an amax other than 0 (which would have
// rolled the history and computed a scale). Those rows are judged by no finding (e4m3_grad_underflow, saturation,
// and fp8_error_dominates' mean leave them out); an operand whose start-up rows would have crossed a finding's
// threshold gets one Fp8StartUp, which the report prints on its own "start-up:" line. Traces without the history
// columns (history_len -1) have no start-up rows: they cannot show them.
bool fp8_start_up_row(const trace::Fp8Row& row, bool earlier_amax);

struct Fp8StartUp {
  std::string module, operand, format;
  std::int64_t first_step = 0, last_step = 0, steps = 0;  // its start-up rows
  std::int64_t nonzero = 0, underflow = 0, saturated = 0;  // summed over them
  double worst_underflow_fraction = 0, worst_saturated_fraction = 0;  // of a start-up row
  double max_error = 0;  // the largest finite relative RMS error of a start-up row
  // What a finding would have said of these rows: E4M3 gradient underflow over kFp8GradUnderflowThreshold,
  // saturation over kFp8SaturationThreshold with values lost, an error above the format's unit roundoff.
  bool underflow_over = false, saturation_over = false, error_over = false;
};

struct Fp8Section {
  std::int64_t rows = 0;     // /fp8 rows read (0: not an fp8 run, or nothing recorded)
  std::int64_t steps = 0;    // steps with rows
  std::int64_t modules = 0;  // distinct FP8 Linears
  std::int64_t first_step = 0, last_step = 0;
  std::vector<Fp8OperandSummary> operands;  // by module, then input, weight, grad_output
  // Indices into operands of those with any underflow (or saturation), worst fraction first (ties: operands'
  // order), at most kFp8Worst each.
  std::vector<std::size_t> worst_underflow, worst_saturation;
  // Findings (kinds in that order, then operands' order); empty when nothing crossed a threshold.
  std::vector<Fp8Finding> findings;
  // The operands whose start-up rows crossed a finding's threshold (operands' order); not findings.
  std::vector<Fp8StartUp> start_up;
  Fp8RunSettings settings;  // what the remedies were judged against (options the run already used are not offered)
  bool recorded() const { return rows > 0; }
};
inline constexpr std::size_t kFp8Worst = 5;

// The BLOCK-SCALED FORMATS section (docs/report-format.md): from the /blocks rows (trace::BlockRow) of a
// --precision mxfp8|nvfp4 run and of --what-if statistics, each operand copy (module, operand, copy, format, what_if)
// over the recorded steps. what_if copies were only measured: the run's GEMMs did not use them ("would underflow").
struct BlockCopySummary {
  std::string module, operand, copy, format;  // "fc1", "grad_output", "columnwise", "nvfp4"
  bool what_if = false;
  std::int64_t steps = 0;  // recorded steps with a row for it
  std::int64_t rows = 0, cols = 0;  // the quantized matrix at the last recorded step
  std::int64_t nonzero = 0, nonfinite = 0, underflow = 0, saturated = 0;  // summed over the steps
  std::int64_t blocks = 0, blocks_clipped = 0, blocks_nan = 0;           // summed over the steps
  double underflow_fraction = 0, saturated_fraction = 0;  // of nonzero, over all steps
  // The step where each fraction was highest (the first such step) and its fraction there.
  std::int64_t worst_underflow_step = 0, worst_saturated_step = 0;
  double worst_underflow_fraction = 0, worst_saturated_fraction = 0;
  // The widest block over the steps (the first step that has it): its range in binades, its number and origin
  // (row, col) in the quantized matrix, the step; block -1 (row, col -1) when no step had a block with a range.
  double max_block_range = 0;
  std::int64_t max_range_step = -1, max_range_block = -1, max_range_row = -1, max_range_col = -1;
  // The block that lost the most nonzero values to underflow in one step (the first such step), as above; -1 when
  // none underflowed.
  std::int64_t worst_block_underflow = 0, worst_block_step = -1, worst_block = -1, worst_block_row = -1,
               worst_block_col = -1;
  // The blocks' decode scales, log2: the smallest and largest over the steps, and the median of the steps'
  // medians (the lower middle of an even count); NaN when no step had a block with a scale.
  double scale_log2_min = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_median = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_max = std::numeric_limits<double>::quiet_NaN();
  double max_rel_rms_error = 0;   // the largest relative RMS quantization error of a step
  double mean_rel_rms_error = 0;  // over the steps
};

// The run's block-scaled options as its configuration records them (block_run_settings): known false when it does
// not say (every remedy is offered then).
struct BlockRunSettings {
  bool known = false;
  std::string precision;              // "mxfp8", "nvfp4", "bf16" (a --what-if run), ...
  std::string mx_scale = "round-up";  // "round-up" or "floor"
  bool nvfp4_rht = true;
  std::vector<std::string> keep_bf16;
};

struct BlockSection {
  std::int64_t rows = 0;     // /blocks rows read (0: no block-scaled run, no --what-if, or nothing recorded)
  std::int64_t what_if_rows = 0;  // of those, what_if rows
  std::int64_t steps = 0;    // steps with rows
  std::int64_t modules = 0;  // distinct Linears
  std::int64_t first_step = 0, last_step = 0;
  std::vector<BlockCopySummary> copies;  // in group_block_rows order (probes/analysis/blocks.h)
  // Indices into copies of those with any underflow (or saturation), worst fraction first (ties: copies' order), at
  // most kBlockWorst each.
  std::vector<std::size_t> worst_underflow, worst_saturation;
  bool recorded() const { return rows > 0; }
};
inline constexpr std::size_t kBlockWorst = 8;

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
  // The distinct dtypes of the /grads rows ("f32"; "bf16" for a model whose parameters are stored in bf16), sorted:
  // `ampscope fix` runs no f32 reference ("autocast off") for a recorded run whose gradients are all f16/bf16, as
  // that re-run would not be f32. Not rendered.
  std::vector<std::string> grad_dtypes;
  std::vector<Diagnosis> anomalies;
  std::vector<HeadroomWarning> warnings;
  ScalerHealth scaler;
  Coverage coverage;
  bool provenance = false;    // the trace records which rows produced each op's inputs (format_version 2)
  // Damage the reader found in a trace whose rest it could read (trace::TraceReader::damage): the analysis
  // covers what is intact; every rendering says DAMAGED.
  std::vector<std::string> damage;
  PrecisionSection precision;  // empty (rows 0) without the f32 twin's rows
  SwampedSection swamped;      // empty (rows 0) without /updates rows (analyse_updates, analysis_updates.h)
  Fp8Section fp8;              // empty (rows 0) without /fp8 rows (analyse_fp8, probes/analysis/fp8.h)
  BlockSection blocks;         // empty (rows 0) without /blocks rows (analyse_blocks, probes/analysis/blocks.h)
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
                std::span<const trace::HistogramRow> histograms = {},
                std::span<const trace::PrecisionRow> precision = {});
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
               const std::vector<trace::HistogramRow>& histograms = {}, const AnalysisOptions& options = {},
               const std::vector<trace::PrecisionRow>& precision = {});

// The --autocast-fp32 pattern for a module: the module itself, quoted ("'blocks.0.attn'").
std::string autocast_pattern(const std::string& module);

}  // namespace ampscope::analysis
