// probes/trace/schema.h: the rows of an ampscope trace, as plain structs, and the sink they are written
// to. The probe (probes/probe.h) produces rows; the HDF5 writer (probes/trace/writer.h) is one sink, an
// in-memory vector is another (tests); the reader (probes/trace/reader.h) gives the same structs back.
// The on-disk layout of each table is documented field by field in docs/trace-format.md; the table and
// field names are fixed, since tools outside ampscope read them.
//
//   struct Memory : trace::Sink { std::vector<trace::OpRow> ops; void write(const trace::OpRow& r) override { ops.push_back(r); } ... };
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::trace {

inline constexpr std::string_view kFormat = "ampscope-trace";
// 2: /ops `inputs` (provenance), the root attribute `probe`. 3: root text attributes are fixed-length
// strings (no variable-length data, which HDF5 keeps unchecksummed in its global heap), the root attribute
// `attributes_crc32` and the /index field `crc32`. 4: every text field of a row is an id into the string
// table (/strings and /string_bytes, each text with its CRC-32), so no name is ever cut; /index counts
// the two new tables. 5: /precision, the f32 twin's rows (`ampscope train --twin`); /index counts it.
// 6 (data-parallel observability): the /grads field `before_all_reduce` (a rank's own gradients before the
// all-reduce) and /checksums (each rank's parameter checksums after every step); /index counts /checksums.
// Also 6: /precision's field `phase` (the f32 twin's backward rows; format 5 rows read as forward rows).
// 7 (FP8): the precision "fp8" (`ampscope train --precision fp8`) and /fp8, each FP8 Linear operand's
// quantization statistics; /index counts /fp8. A reader of 6 refuses 7 as newer, rather than calling an fp8
// run's precision damage or taking every /index row for damaged.
// 8 (block-scaled formats): the precisions "mxfp8" and "nvfp4" (`ampscope train --precision mxfp8|nvfp4`) and
// /blocks, each block-scaled operand copy's statistics (and --what-if's for a format the run does not train in);
// /index counts /blocks. A reader of 7 refuses 8 as newer, as a reader of 6 refuses 7.
// 9 (issue 37): /ops stores `absmax_xor` (uint64: absmax's bits XOR those of max(|min|, |max|), 0 where absmax
// is that, as the probe writes it) in place of `absmax`, which cost as many bytes as min or max; the reader
// restores OpRow's absmax bit for bit. A reader of 8 refuses 9 as newer.
inline constexpr std::int64_t kFormatVersion = 9;

// Root attributes.
struct RunInfo {
  std::string precision;  // "fp32", "fp16", "bf16", (format_version 7) "fp8" or (8) "mxfp8", "nvfp4"
  std::string device;     // "cpu", "cuda:0"
  std::string model;      // sample or model name
  std::int64_t seed = 0;
  std::string config;     // JSON text
  // How the probe was set up, as JSON text (level, op and module filters, sampling, flight recorder, the
  // autocast overrides in force): what the trace can and cannot show. "" when unknown (format_version 1,
  // or a sink the probe never described itself to).
  std::string probe{};
};

// Phases, stored as their names ("forward", "backward", "optimizer", "scaler").
enum class Phase : std::uint8_t { forward, backward, optimizer, scaler };

// Counts and moments of one tensor, accumulated in double. For an empty tensor or one without finite
// values, min/max/absmax/mean/rms are NaN.
struct TensorHealth {
  std::int64_t numel = 0;
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0;
  double min = 0, max = 0, absmax = 0, mean = 0, rms = 0;  // over the finite values
};

// /steps: one row per optimizer step.
struct StepRow {
  std::int64_t step = 0;
  double loss = 0;
  double scale = 1;        // used in this step's backward
  double scale_after = 1;  // after update()
  bool found_inf = false;
  bool skipped = false;
  std::int64_t growth_tracker = 0;  // after update()
  double grad_norm = 0;             // unscaled
  double lr = 0;
  double time_ms = 0;
};

// Provenance of an op's inputs (OpRow::inputs): the seq of the row, in the same step, whose op produced the
// input (a backward row's input is the gradient it received), or one of these markers.
inline constexpr int kOpInputs = 4;  // inputs recorded per row; an op with more records its first four
inline constexpr std::int64_t kInputNone = -1;        // no input at this position
inline constexpr std::int64_t kInputParameter = -2;   // a parameter (a leaf that requires grad)
inline constexpr std::int64_t kInputData = -3;        // data or a constant: no reported op produced it
inline constexpr std::int64_t kInputUnrecorded = -4;  // an op of this step the probe did not record produced
                                                      // it (filtered out by the probe's op or module globs)
inline constexpr std::int64_t kInputSummed = -5;      // backward: gradients from several nodes, summed
inline constexpr std::int64_t kInputUnknown = -6;     // not recorded (format_version 1 traces)
inline constexpr std::int64_t kInputOtherStep = -7;   // an op of an earlier step (or outside any step) produced
                                                      // it: a tensor kept across steps, data prepared before
                                                      // the loop
std::string_view input_marker_name(std::int64_t marker);  // "none", "parameter", "data", ...; "" for a seq

// /ops: one row per recorded op (forward ops and backward nodes).
struct OpRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;       // order within the step
  Phase phase = Phase::forward;
  std::string op;             // "linear"
  std::string module;         // "blocks.0.attn.qkv"
  std::string in_dtypes;      // the inputs' dtypes after autocast, comma-separated: "f16,f16,f16"
  std::string out_dtype;      // "f16"
  std::string shape;          // of the output: "[64, 128]"
  std::string autocast;       // the reason autocast gave ("" outside autocast)
  TensorHealth health;        // of the output (all zero at level dtype)
  std::int64_t cast_overflow = 0;   // casts only: finite values that became inf
  std::int64_t cast_underflow = 0;  // casts only: non-zero values that became zero
  bool origin = false;        // non-finite output from all-finite inputs
  // Which rows produced the inputs (after autocast: a cast input names the producer of what was cast),
  // in input order: a seq of the same step, or a marker (kInputNone, ...).
  std::array<std::int64_t, kOpInputs> inputs{kInputNone, kInputNone, kInputNone, kInputNone};
};

// Which text fields of an OpRow a read fills (TraceReader::ops with texts); the others are left empty. A pass that
// needs few skips decoding the rest: the diff reads no autocast reason, and shapes only across producers (issue 37).
struct OpTexts {
  bool op = true, module = true, in_dtypes = true, out_dtype = true, shape = true, autocast = true;
};

// /grads: one row per parameter per recorded step, before and after unscaling.
struct GradRow {
  std::int64_t step = 0;
  std::string param;  // "fc1.weight"
  std::string dtype;  // "f32"
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0;
  double absmax = 0;
  double norm = 0;    // L2, in double
  bool unscaled = false;
  // format_version 6: this rank's own gradient before the data-parallel all-reduce (--ddp with 2+ ranks); false
  // for the gradients the step used (after the all-reduce) and in every older trace.
  bool before_all_reduce = false;
};

// /events: anomalies and scaler decisions.
struct EventRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;
  std::string kind;    // "origin", "propagate", "cast_overflow", "cast_underflow", "grad_overflow",
                       // "skipped_step", "scale_backoff", "scale_growth"
  std::string op;      // op name, or "" for step-level events
  std::string module;
  std::string detail;  // human-readable: "3 NaN, 1 +inf in the output of linear; inputs finite"
};

// Exponent histogram bins: one per binary exponent from kHistMinExponent to kHistMaxExponent (values
// with floor(log2|x|) = e), below that "subnormal" (any dtype's subnormal range and anything smaller),
// plus zero, inf and NaN. The range covers f16 (2^-24 .. 2^15), bf16 and the f32 values training sees.
inline constexpr int kHistMinExponent = -64;
inline constexpr int kHistMaxExponent = 63;
inline constexpr int kHistBins = kHistMaxExponent - kHistMinExponent + 1 + 4;  // + subnormal, zero, inf, nan

// /histograms: at level full, one row per recorded tensor (op output or gradient).
struct HistogramRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;          // of the op; -1 for gradients
  std::string tensor;            // "output" of the op at seq, or a parameter name
  std::array<std::int64_t, kHistBins> bins{};  // [exponents..., subnormal, zero, inf, nan]
};

// /dumps: on the first origin, the op's inputs and output (size-bounded), values widened to double.
struct DumpRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;
  std::string op;
  std::string module;
  std::string tensor;  // "input 0", "input 1", "output"
  std::string dtype;   // the tensor's own dtype
  std::string shape;
  std::vector<double> values;  // row-major, at most the configured number of elements
};

// Buckets of PrecisionRow::error_bins: bucket k (0 to kErrorBins - 1) counts the elements whose accumulated
// relative error e > 0 has floor(-log2 e) == k, clamped to [0, kErrorBins - 1] (bucket 0: errors above 1/2,
// 100% and more included; the last bucket: errors of 2^-25 and less, beyond f32's p + 1).
inline constexpr int kErrorBins = 26;

// /precision (format_version 5): one row per op the f32 twin computed again (probes/twin.h, `ampscope train
// --twin`): how far the op's output is from f32, on the op's own inputs (local) and on the twin's (accumulated).
// Relative errors are |y - r| / max(|r|, floor) (the floor is documented in probes/twin.h and
// docs/trace-format.md); ulps are in units in the last place of the output dtype.
struct PrecisionRow {
  std::int64_t step = 0;
  std::int64_t seq = 0;  // the op's seq (its /ops row)
  std::string op;
  std::string module;
  std::string out_dtype;  // the op's output dtype: "f16", "bf16" or "f32"
  std::int64_t numel = 0;
  bool local = false;  // the op ran in f16/bf16: local errors computed (else 0: an f32 op on twin inputs)
  double local_max_rel = 0, local_mean_rel = 0, local_max_ulp = 0;
  double acc_max_rel = 0, acc_mean_rel = 0, acc_max_ulp = 0;
  // The largest accumulated max relative error among the op's floating inputs (each input against its twin
  // value, judged in the input's own dtype): how much error reached the op, to compare with its output's.
  double in_acc_max_rel = 0;
  double in_acc_mean_rel = 0;  // the largest accumulated mean relative error among the inputs
  std::int64_t flips = 0;  // accumulated: outputs 0, inf, at the largest finite value or (sigmoid, tanh) at 1
                           // while the twin's are not
  double bits = 0;         // accumulated: bits of agreement, -log2(acc_max_rel), between 0 and the significand
  // add, sub, rsub: max over elements of (|a| + |b|) / max(|a ± b|, floor); sum, mean: of sum|x| / max(|sum x|,
  // floor); from the twin's values (floor: the output dtype's smallest normal). NaN for other ops.
  double cond = 0;
  bool followed = true;  // every input the twin follows had a twin value of its shape (else: widened input)
  // The accumulated errors' histogram: each element with a finite reference is counted once, as a flip (flips),
  // as exact (its error is 0: exact), or in the bucket of its relative error (error_bins, kErrorBins above).
  std::array<std::int64_t, kErrorBins> error_bins{};
  std::int64_t exact = 0;
  // format_version 6: forward (an op the twin computed again) or backward (an autograd node whose backward ran in
  // f16/bf16, computed again in f32 on its own inputs widened: probes/twin.h). A backward row is named by the
  // forward op the node belongs to (op, module); its seq is the node's /ops row (phase backward); its numbers are
  // local only: local is true, local_* hold its errors, and flips, bits, error_bins and exact describe that same
  // local comparison; acc_*, in_acc_* are 0, cond is NaN and followed is true. Each gradient the node produced
  // (one per input that wants one) is compared on its own, in its own dtype: local_max_rel, local_mean_rel and
  // local_max_ulp are the largest over them, flips, error_bins and exact their sums, bits from local_max_rel.
  // out_dtype is the gradients' dtype (the narrowest where they differ), numel their elements together. Traces
  // of format 5 have forward rows only.
  Phase phase = Phase::forward;
};

// /updates (format_version 5): one row per parameter stored in f16 or bf16 and per step its optimizer (SGD,
// Adam, AdamW) updated it (core/probe_hook.h UpdateEvent), written at probe level health and above on recorded
// steps: how many of its elements' updates rounding lost. u is the value the optimizer adds (in f32); an
// element's update is swamped when u != 0 and p + u rounds back to p in the parameter's dtype.
struct UpdateRow {
  std::int64_t step = 0;
  std::string param;        // the parameter's name ("fc1.weight")
  std::string dtype;        // "f16" or "bf16"
  std::int64_t numel = 0;
  std::int64_t nonzero = 0;  // elements with u != 0
  // Of those, elements whose value did not change (at most nonzero). An update that is NaN or infinite, or one
  // to a parameter element already NaN or infinite, counts in nonzero but never here.
  std::int64_t swamped = 0;
  // Means over the elements with a finite u != 0 and a finite p (0 when there are none):
  double param_abs_mean = 0;   // mean |p| before the update
  double update_abs_mean = 0;  // mean |u|
};

// /checksums (format_version 6): a 64-bit checksum of each parameter's bytes after a step's optimizer step,
// every step (not only recorded ones), written in data-parallel runs (probes/stats.h param_checksum). The row
// whose param is "" holds the step's combined checksum: of every parameter's checksum, in registration order.
struct ChecksumRow {
  std::int64_t step = 0;
  std::string param;          // "fc2.weight"; "" for the combined checksum
  std::uint64_t checksum = 0;
};

// /fp8 (format_version 7): one row per FP8 operand a Linear quantized on a recorded step (core/fp8_linear.h,
// probe::Fp8QuantizeEvent): the input and weight of each fprop, the grad_output of each backward. Counts are over
// the operand's elements; a value is "nonzero" when it is neither +-0 nor NaN (infinities count: they saturate).
// Of the nonzero values: underflow quantized to a zero code (0x00 or 0x80: -0 is zero), subnormal to a code
// whose exponent field is 0 and mantissa is not, saturated: |fl(x * scale)| was above the format's max (448,
// 57344), so satfinite held it at +-max (silent: no NaN or inf shows it). rel_rms_error =
// sqrt(sum (fl(decode(q) * scale_inv) - x)^2 / sum x^2) in double over the finite values whose code is not NaN
// (0 when that sum of squares is 0): the quantization error against the unquantized tensor.
//
// The dynamic range and the amax history's state are optional columns of format 7 (added after the first format 7
// traces, which lack them: docs/trace-format.md, "Versioning"). Read from a trace without them, each holds its
// "not recorded" value: dynamic_range and quantized_dynamic_range NaN, history_len -1, history_amax NaN,
// history_amax_step -1 (fp8_has_range_columns says which).
//  - dynamic_range: log2(max |x|) - log2(min |x|) over the finite nonzero values of the unquantized operand (0 when
//    it has none); quantized_dynamic_range: the same over the finite nonzero decoded codes (what survived: the
//    scale cancels out).
//  - history_len: the delayed recipe's amax history length (--fp8-amax-history); 0 under current scaling, which
//    keeps no history. history_amax: the amax the end-of-step update would reduce the history to as it stood just
//    after this cast (the window's max, NaN entries skipped, for the algorithm max; this step's slot for
//    most_recent), which sets the next step's scale (fp8_max * 2^-margin / history_amax when finite and > 0);
//    history_amax_step: the step whose amax that is (the first such step when several hold it), -1 when unknown
//    (the history predates the probe) or under current scaling (history_amax 0 then).
struct Fp8Row {
  std::int64_t step = 0;
  std::string module;   // the Linear's module path ("fc1")
  std::string operand;  // "input", "weight" or "grad_output"
  std::string format;   // "e4m3" or "e5m2"
  std::int64_t numel = 0;
  std::int64_t nonzero = 0;
  std::int64_t underflow = 0, subnormal = 0, saturated = 0;  // each at most nonzero
  double amax = 0;          // the amax the cast folded (max |x|, NaN skipped), as the recipe recorded it
  double scale = 1;         // the scale the cast used: q = satfinite(RNE(x * scale))
  double rel_rms_error = 0;
  // Optional columns (see above).
  double dynamic_range = std::numeric_limits<double>::quiet_NaN();
  double quantized_dynamic_range = std::numeric_limits<double>::quiet_NaN();
  std::int64_t history_len = -1;
  double history_amax = std::numeric_limits<double>::quiet_NaN();
  std::int64_t history_amax_step = -1;
};
// Whether a row holds the optional range and history columns (false for a row of a trace written before them).
inline bool fp8_has_range_columns(const Fp8Row& row) { return row.history_len >= 0; }
// A count of an Fp8Row as a fraction of its nonzero values (0 when there are none).
inline double fp8_fraction(std::int64_t count, std::int64_t nonzero) {
  return nonzero > 0 ? static_cast<double>(count) / static_cast<double>(nonzero) : 0.0;
}

// /blocks (format_version 8): one row per block-scaled operand copy on a recorded step (core/block_stats.h
// BlockStats, probe::BlockQuantizeEvent): under --precision mxfp8|nvfp4 each Linear's input and weight (fprop) and
// grad_output (backward), in each copy the runtime makes ("rowwise": blocks along each row, "columnwise": down each
// column; for NVFP4 the columnwise copy is the quantization of the transpose); with --what-if, the same statistics
// measured (what_if = true) for a format the run does not train in. Counts are over the rows x cols values the
// quantizer saw (numel = rows * cols; NVFP4 weight-gradient operands: after the Hadamard transform):
//  - nonzero: finite values != 0; nonfinite: NaN or +-inf; underflow: nonzero values whose dequantized value is 0
//    (lost to the block's scale); saturated: finite values clipped to the element's max after scaling (the MX floor
//    rule, NVFP4's clamp to +-6); underflow + saturated <= nonzero.
//  - blocks: blocks of the copy; blocks_clipped: blocks with a saturated value; blocks_nan: blocks that dequantize
//    to NaN or hold a non-finite input.
//  - max_block_range: the largest block dynamic range, log2(block amax) - log2(smallest non-zero |x| of the block),
//    over finite values (0 when no block holds two non-zero magnitudes); max_range_block: that block's number in
//    the order of the copy's scales (-1 when none), and max_range_row, max_range_col: its first element in the
//    quantized rows x cols matrix (-1 when none, and when the probe could not place the block: probes/stats.h
//    block_place).
//  - worst_block: the block that lost the most nonzero values to underflow (-1 when none underflowed),
//    worst_block_underflow: how many (0 when none), worst_block_row, worst_block_col: its first element (-1 when
//    none or not placed).
//  - scale_log2_min, scale_log2_median (the lower middle of an even count), scale_log2_max: log2 of the blocks'
//    decode scales (MX: E8M0 code - 127; NVFP4: log2(E4M3 block scale * global decode scale), -inf for a zero
//    block scale), over the blocks whose scale is not NaN; all three NaN when there are none.
//  - rel_rms_error: sqrt(sum (dequantized - x)^2 / sum x^2) in double over the finite inputs whose dequantized
//    value is finite (0 when sum x^2 is 0).
struct BlockRow {
  std::int64_t step = 0;
  std::string module;   // the Linear's module path ("fc1")
  std::string operand;  // "input", "weight" or "grad_output"
  std::string copy;     // "rowwise" or "columnwise"
  std::string format;   // "mxfp8" or "nvfp4"
  bool what_if = false; // statistics only (--what-if): the run's GEMM did not use this quantization
  std::int64_t rows = 0, cols = 0;  // the quantized matrix
  std::int64_t numel = 0, nonzero = 0, nonfinite = 0, underflow = 0, saturated = 0;
  std::int64_t blocks = 0, blocks_clipped = 0, blocks_nan = 0;
  double max_block_range = 0;
  std::int64_t max_range_block = -1, max_range_row = -1, max_range_col = -1;
  std::int64_t worst_block = -1, worst_block_underflow = 0, worst_block_row = -1, worst_block_col = -1;
  double scale_log2_min = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_median = std::numeric_limits<double>::quiet_NaN();
  double scale_log2_max = std::numeric_limits<double>::quiet_NaN();
  double rel_rms_error = 0;
};
// A count of a BlockRow as a fraction of its nonzero values (0 when there are none).
inline double block_fraction(std::int64_t count, std::int64_t nonzero) { return fp8_fraction(count, nonzero); }

// Where rows go. Calls come from one thread (the probe's); a sink may queue them for another.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void begin(const RunInfo& info) {}
  virtual void write(const StepRow& row) = 0;
  virtual void write(const OpRow& row) = 0;
  virtual void write(const GradRow& row) = 0;
  virtual void write(const EventRow& row) = 0;
  virtual void write(const HistogramRow& row) = 0;
  virtual void write(const DumpRow& row) = 0;
  // The f32 twin's rows (written only when a run twins ops); a sink that keeps no precision rows ignores them.
  virtual void write(const PrecisionRow& row) {}
  // Swamped-update counts of f16/bf16 parameters; a sink that keeps none ignores them.
  virtual void write(const UpdateRow& row) {}
  // Parameter checksums (data-parallel runs); a sink that keeps none ignores them.
  virtual void write(const ChecksumRow& row) {}
  // FP8 operand statistics (--precision fp8 runs); a sink that keeps none ignores them.
  virtual void write(const Fp8Row& row) {}
  // Block-scaled operand statistics (--precision mxfp8|nvfp4, --what-if); a sink that keeps none ignores them.
  virtual void write(const BlockRow& row) {}
  // The end of a step's rows: a file sink flushes so a killed run keeps every finished step.
  virtual void end_step(std::int64_t step) {}
  // A clean end of the run (root attribute complete = 1 for the file).
  virtual void close() {}
};

std::string_view phase_name(Phase phase);  // "forward", ...
Phase parse_phase(std::string_view name);  // throws on an unknown name

}  // namespace ampscope::trace
