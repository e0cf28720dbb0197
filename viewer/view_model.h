// viewer/view_model.h: what each panel of ampscope-view shows, as plain data computed from trace rows and
// the analysis (no ImGui, no OpenGL), so the tests check the panels' content without a window: the
// overview's lines, the scale/loss/gradient-norm series and their markers, the ops table's filtered and
// sorted rows and their colours, the op detail's exponent histogram against the f16/bf16 ranges, the
// "Why NaN?" cards, the compare panel's series. The colours are exact values the screenshot tests look for.
//
//   StepSeries s = step_series(steps);                 // s.skipped holds the steps to mark
//   std::vector<std::uint32_t> rows = op_order(ops, {.text = "attn"}, OpColumn::absmax, false);
//   std::vector<Card> cards = why_nan_cards(report);   // cards[0].step, cards[0].seq select the op
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/analysis/f16_ranges.h"
#include "probes/trace/reader.h"
#include "probes/trace/schema.h"

namespace ampscope::viewer {

// A colour packed as ImGui packs IM_COL32 (0xAABBGGRR), so the model needs no ImGui.
constexpr std::uint32_t rgba(std::uint32_t r, std::uint32_t g, std::uint32_t b, std::uint32_t a = 255) {
  return r | (g << 8) | (b << 16) | (a << 24);
}

// Exact colours that mean something; the screenshot tests look for them, so each differs from every
// colour ImGui's dark theme uses.
namespace colours {
inline constexpr std::uint32_t kSkippedStep = rgba(255, 0, 255);    // magenta: a skipped step
inline constexpr std::uint32_t kSkippedText = rgba(255, 90, 255);   // words about skipping (not a marker)
inline constexpr std::uint32_t kBackoff = rgba(255, 150, 0);        // the scale was halved
inline constexpr std::uint32_t kGrowth = rgba(0, 200, 120);         // the scale grew
inline constexpr std::uint32_t kHealthyStep = rgba(40, 90, 60);     // a step that ran
inline constexpr std::uint32_t kSelectedStep = rgba(255, 255, 0);
inline constexpr std::uint32_t kNonFiniteCell = rgba(230, 20, 20);  // a cell counting NaN/inf values
inline constexpr std::uint32_t kOriginMark = rgba(255, 0, 128);     // an op that created NaN/inf
inline constexpr std::uint32_t kErrorBackground = rgba(120, 0, 30); // the box that shows an error
inline constexpr std::uint32_t kErrorText = rgba(255, 210, 210);
inline constexpr std::uint32_t kWarning = rgba(255, 200, 60);
inline constexpr std::uint32_t kPlotNote = rgba(24, 28, 40);  // the box of a plot's note (nothing finite to draw)
inline constexpr std::uint32_t kLoss = rgba(80, 160, 255);
inline constexpr std::uint32_t kLossB = rgba(255, 120, 80);
inline constexpr std::uint32_t kScale = rgba(120, 230, 120);
inline constexpr std::uint32_t kGradNorm = rgba(200, 170, 255);
inline constexpr std::uint32_t kF16Range = rgba(255, 170, 60);
inline constexpr std::uint32_t kBf16Range = rgba(120, 220, 120);
// The shaded zones of the exponent histogram (see-through, over the plot's background).
inline constexpr std::uint32_t kF16OverflowZone = rgba(230, 40, 40, 70);
inline constexpr std::uint32_t kF16SubnormalZone = rgba(255, 170, 60, 55);
inline constexpr std::uint32_t kF16FlushZone = rgba(200, 90, 255, 60);
inline constexpr std::uint32_t kF16RoundUpZone = rgba(120, 140, 255, 70);  // (2^-25, 2^-24): rounds up to 2^-24
// The histogram's bars: exponent bins, and the special bins (the inf and NaN bars are what a screenshot
// test looks for).
inline constexpr std::uint32_t kHistogramBar = rgba(90, 150, 240);
inline constexpr std::uint32_t kSubnormalBar = rgba(255, 190, 90);
inline constexpr std::uint32_t kZeroBar = rgba(170, 170, 185);
inline constexpr std::uint32_t kInfBar = rgba(250, 50, 70);
inline constexpr std::uint32_t kNanBar = rgba(255, 110, 200);
}  // namespace colours

// The colour of a dtype's name in the ops table ("f16" orange, "bf16" green, "f32" blue, others grey).
std::uint32_t dtype_colour(std::string_view dtype);

// Numbers as the panels print them: 4 significant digits, "nan", "inf", "-inf".
std::string format_number(double value);
std::string format_count(std::int64_t value);  // 1234567 -> "1,234,567"

// ---- Overview ----
struct KeyValue {
  std::string key, value;
  bool alert = false;  // drawn in the warning colour (skipped steps, anomalies, an unfinished trace)
};

struct OverviewInput {
  std::string path;
  trace::RunInfo run;
  std::span<const trace::StepRow> steps;
  trace::RowCounts counts;
  bool complete = true;
  const analysis::Report* report = nullptr;  // null while the analysis runs
  double analysis_progress = 0;              // 0..1, shown while report is null
};
std::vector<KeyValue> overview_rows(const OverviewInput& in);

// ---- Scale and loss ----
struct StepSeries {
  std::vector<double> step, loss, scale, grad_norm;
  std::vector<double> skipped, backoffs, growths;  // steps to mark
};
StepSeries step_series(std::span<const trace::StepRow> steps);

// The index in `steps` of the row for `step`, if recorded.
std::optional<std::size_t> step_index(std::span<const trace::StepRow> steps, std::int64_t step);
// The recorded step nearest to a (plot) x value; nullopt when there are no steps.
std::optional<std::int64_t> nearest_step(std::span<const trace::StepRow> steps, double x);
// The step to show first: that of the first anomaly when there is one, else the first step.
std::optional<std::int64_t> initial_step(std::span<const trace::StepRow> steps, const analysis::Report* report);

// ---- The first anomaly at open, before the analysis (issue 37) ----
// The analysis reads every op row (minutes at 100M rows); the trace's small tables already say where something
// first went wrong. The early anomaly is the earliest recorded step (one with a /steps row) holding an anomaly
// event (/events: is_anomaly_event) or whose /steps row says found_inf, skipped or a non-finite loss. The viewer
// selects it, labelled provisional (early_anomaly_label), until the analysis gives its verdict, which may differ: a
// skipped step alone is the scaler's job, not an anomaly, and the analysis's causes need the op rows.
struct EarlyAnomaly {
  std::int64_t step = 0;
  std::optional<std::int64_t> seq;  // the op an op event of that step names (origin, then cast_overflow, propagate)
  bool from_events = false;         // an /events row named it (else the /steps row alone)
  std::string what;                 // "NaN/inf created by linear in fc2", "skipped step", ...
};
// The probe's anomaly events: origin, propagate, cast_overflow, grad_overflow, skipped_step, scale_backoff. Not
// cast_underflow (every f16 run flushes small values), scale_growth, nor a kind this build does not know.
bool is_anomaly_event(std::string_view kind);
// The early anomaly of these rows (steps in any order; events of any steps: an event whose step has no /steps row
// does not count, so a damaged or foreign event cannot select a step without rows). nullopt when nothing names one.
std::optional<EarlyAnomaly> early_anomaly(std::span<const trace::StepRow> steps, std::span<const trace::EventRow> events);
// The op to select in the early anomaly's step once its rows are read: `seq` when a row has it, else the step's
// first origin row (a trace whose /steps alone named the step), else none.
std::optional<std::int64_t> early_anomaly_op(std::span<const trace::OpRow> rows, std::optional<std::int64_t> seq);
// The line shown while the early anomaly is selected: the analysis running (progress 0..1), or failed (`analysing`
// false and no report), when nothing confirms it.
std::string early_anomaly_label(const EarlyAnomaly& early, double analysis_progress, bool analysing = true);
// Why the selection moved when the analysis ended, for the early anomaly shown until then: "" when the analysis's
// first anomaly is in the same step (the label just goes); `now` is the step selected instead.
std::string early_anomaly_verdict(const EarlyAnomaly& early, const analysis::Report& report, std::optional<std::int64_t> now);

// ---- Ops ----
// In the table's order: what identifies the op, then what went wrong, then the rest.
enum class OpColumn { seq, phase, module, op, dtypes, nonfinite, absmax, mean, rms, zero, subnormal, numel, shape };
inline constexpr int kOpColumns = 13;
std::string_view op_column_name(OpColumn c);
std::string_view op_column_help(OpColumn c);  // the definition, shown when hovering the header

struct OpFilter {
  std::string text;            // case-insensitive substring of module, op, phase, dtypes or autocast reason
  bool nonfinite_only = false; // only rows with NaN/inf outputs (and origins)
};
bool op_matches(const trace::OpRow& row, const OpFilter& filter);
// Indices of the rows that match, ordered by the column (stable: ties keep seq order).
std::vector<std::uint32_t> op_order(std::span<const trace::OpRow> rows, const OpFilter& filter, OpColumn sort,
                                    bool ascending);

std::string dtype_arrow(const trace::OpRow& row);  // "f16,f16 -> f16"
std::int64_t nonfinite_count(const trace::TensorHealth& h);
// The text of a cell (the ops table, the bench and the tests agree on it).
std::string op_cell(const trace::OpRow& row, OpColumn c);

// ---- Op detail ----
std::vector<KeyValue> op_detail_rows(const trace::OpRow& row);

// The op's place in the dataflow (OpRow::inputs, format_version 2): where each input came from and which
// rows of the step took its output in. A link to a row carries that row's seq (a click selects it); a
// marker is said in words.
struct OpLink {
  std::vector<int> positions;  // producers: the input's position in the selected row; consumers: where the
                               // consumer takes the selected row's output in (x * x: inputs 0 and 1)
  std::int64_t seq = -1;       // the linked row's seq; -1 for a marker
  std::int64_t marker = 0;     // producers: the marker (trace::kInputParameter, ...) when there is no row, else 0
  bool found = false;          // the row is among the step's rows (a seq that is not says so in `text`)
  std::string text;            // "seq 3  linear in fc1  f16 [4, 8]", or the marker in words
  std::string health;          // the row's output in a few numbers: "NaN/inf 0, zeros 2 of 32, absmax 12.5"
  bool nonfinite = false;      // the row's output holds NaN or inf
  std::string out_dtype;       // the row's output dtype ("" for a marker)
};
// What a marker means, in words: "parameter", "data or constant", ...; "" for a seq (>= 0).
std::string input_marker_words(std::int64_t marker);
// The row's inputs in order, each its producer among `step_rows` (the rows of the row's step) or its
// marker. Positions without an input (kInputNone) are left out; a row whose inputs are all kInputUnknown (a
// format_version 1 trace) gives one link that says the trace has no provenance.
std::vector<OpLink> producers(const trace::OpRow& row, std::span<const trace::OpRow> step_rows);

// The loss scale a step's backward used (its /steps row's `scale`), which the Compare panel divides that
// step's backward rows by (analysis::diff_ops); the previous step's scale after update() when the step has
// no row of its own (an unfinished last step); 1 when nothing earlier is known.
double loss_scale_at(std::span<const trace::StepRow> steps, std::int64_t step);
// The step of run b the Compare panel shows beside run a's `step`: the one `ampscope diff` paired with it
// (a different step when a calibration skip made diff pair the runs by optimizer update:
// DiffReport::aligned_by_update), else `step` itself (also while the diff is still running: report null).
std::int64_t paired_step_b(const analysis::DiffReport* report, std::int64_t step);
// The rows of the row's step whose inputs name the row's seq, in their order, each once with the positions
// where it takes the row in.
std::vector<OpLink> consumers(const trace::OpRow& row, std::span<const trace::OpRow> step_rows);

// The exponent histogram (level full) against f16's range. What becomes of each bin in f16 is
// probes/analysis/f16_ranges.h's (the analysis uses the same): a bin e holds |x| in [2^e, 2^(e+1)), so on the plot's
// axis, log2|x|, it is the bar over [e, e + 1), and f16's zones have their exact edges there: flush to zero
// up to 2^-25 (a tie, to 0), round up to 2^-24 in (2^-25, 2^-24), subnormal 2^-24 .. 2^-14, normal, inf from
// 65520 (log2 65520 = 15.9996: bin 15 partly overflows when the tensor is finer than f16).
struct ExponentHistogram {
  std::string dtype;                          // the tensor's own dtype: what its bin 15 and subnormal bin mean
  std::vector<double> exponent, count;        // non-empty exponent bins (count > 0), for the bars
  std::vector<half_ranges::Zone> zone;        // each of those bins' zone in f16
  std::int64_t total = 0;                     // every value counted
  std::int64_t subnormal = 0, zero = 0, inf = 0, nan = 0;  // the recorded special bins
  half_ranges::ZoneCounts f16;                // every bin's values by their zone in f16
};
ExponentHistogram exponent_histogram(const trace::HistogramRow& row, std::string_view dtype);
// The histogram of an op's output (of dtype `dtype`) among a step's histogram rows; nullopt when none.
std::optional<ExponentHistogram> op_histogram(std::span<const trace::HistogramRow> rows, std::int64_t seq,
                                              std::string_view dtype);

// The bins that are not exponents, each drawn as a bar of its own beside the exponent bars: "sub" (the
// subnormal bin: an f16 tensor's subnormals; for other dtypes their subnormals and anything below 2^-64),
// "0", "inf" and "NaN".
struct Bar {
  std::string label;
  double count = 0;
  std::uint32_t colour = 0;
};
std::vector<Bar> special_bars(const ExponentHistogram& h);

// f16's zones on the log2|x| axis, in the order drawn (an end may be -/+infinity).
struct ZoneBand {
  double x0 = 0, x1 = 0;
  std::uint32_t colour = 0;
  std::string label;
  half_ranges::Zone zone = half_ranges::Zone::normal;
};
std::vector<ZoneBand> f16_zone_bands();

// The lines under the plot: what each zone holds (with the recorded infs and NaNs), each with the swatch of
// its band; the colour says whether the line is a warning.
struct ZoneLine {
  std::uint32_t swatch = 0;  // 0: no swatch
  std::uint32_t colour = 0;
  std::string text;
};
std::vector<ZoneLine> f16_zone_lines(const ExponentHistogram& h);

// ---- Why NaN? ----
// One op of a diagnosis's root-cause chain (analysis::Diagnosis::chain, root first, the origin last).
struct ChainItem {
  std::int64_t step = -1, seq = -1;  // what a click selects
  std::string text;                  // "sigmoid in (no module), seq 1, f16"
  std::string role;                  // "saturation", "cancellation", "underflow", "passes on", "origin"
  std::string evidence;              // the analysis's sentence quoting the op's recorded numbers
};
std::vector<ChainItem> chain_items(const analysis::Diagnosis& d);

struct Card {
  enum class Kind { anomaly, warning, scaler } kind = Kind::anomaly;
  std::string title;                  // "f16_overflow in blocks.0.attn (bmm), step 0"
  std::vector<KeyValue> lines;        // origin, cause, root cause, evidence, propagation, silent damage, recurs
                                      // (and "remedy", the paragraph, only when there are no remedies below)
  std::int64_t step = -1, seq = -1;   // what a click selects (-1: nothing / no op)
  std::string root_cause;             // anomalies: "saturation", "cancellation", "underflow", or ""
  std::vector<ChainItem> chain;       // anomalies: from the root op to the origin; each link selects its op
  std::vector<analysis::Remedy> remedies;  // anomalies: best first, each as a train flag and as C++ code
};
std::vector<Card> why_nan_cards(const analysis::Report& report);

// The diagnosis whose origin is the op (step, seq), or, when none, one whose root-cause chain passes through
// it; `link` is the op's index in that chain (-1 when it is not on it). Null when neither.
struct DiagnosisAt {
  const analysis::Diagnosis* diagnosis = nullptr;
  int link = -1;
};
DiagnosisAt diagnosis_at(const analysis::Report& report, std::int64_t step, std::int64_t seq);

// ---- Compare ----
struct CompareSeries {
  std::vector<double> step_a, loss_a, step_b, loss_b;
  std::vector<double> skipped_a, skipped_b;
};
CompareSeries compare_series(const analysis::DiffReport& d);
std::vector<KeyValue> compare_summary(const analysis::DiffReport& d);
std::string op_key_text(const analysis::OpKey& k);  // "step 3 forward blocks.0.attn bmm #0"

// ---- Precision ----
// The f32 twin's rows (the trace's /precision table, `ampscope train --twin`) as a heatmap: one row per twinned
// op, keyed as the viewer keys ops elsewhere (phase, module, op, occurrence: the k-th twinned row of that phase,
// module and op in its step, in seq order), one column per twinned step, each cell coloured by the bits of
// agreement with the twin. The forward rows come first, in the report's order (analysis::rank_by_jump: where
// precision entered first), then by occurrence; then the backward rows (format_version 6: autograd nodes, local
// error only), in the order of the report's backward list (analysis::rank_backward), then by occurrence.
struct PrecisionMapRow {
  trace::Phase phase = trace::Phase::forward;
  std::string module, op;
  std::int64_t occurrence = 0;
  std::string out_dtype;  // of its first row
  std::string label;      // "blocks.0.attn.proj linear #0" ("(no module)" outside any module); backward rows
                          // "backward of blocks.0.attn.proj linear #0"
};
struct PrecisionMap {
  std::vector<PrecisionMapRow> rows;
  std::size_t backward_begin = 0;          // rows [0, backward_begin) are forward, the rest backward
  std::vector<std::int64_t> steps;         // the columns: twinned steps, ascending
  std::vector<trace::PrecisionRow> source; // the twin's rows
  std::vector<std::int32_t> cells;         // rows.size() x steps.size(), row-major: an index into source, -1 none
  std::vector<std::uint32_t> by_seq;       // indices into source sorted by (step, seq): precision_at's lookup
  const trace::PrecisionRow* at(std::size_t row, std::size_t column) const;
};
// Builds the map from a trace's precision rows (any order). Work: O(n log n) in the rows, once, off the UI
// thread (TraceDocument reads and builds it in the background); a frame then draws only the visible cells.
PrecisionMap precision_map(std::vector<trace::PrecisionRow> rows);
// The twin's row of the op (step, seq); null when the twin did not compute it again.
const trace::PrecisionRow* precision_at(const PrecisionMap& map, std::int64_t step, std::int64_t seq);

// Bits of agreement: accumulated (the row's `bits`: -log2(acc_max_rel), 0..p) and local (-log2(local_max_rel),
// 0..p, p when 0; NaN for a row without local errors: an f32 op on the twin's inputs).
double accumulated_bits(const trace::PrecisionRow& row);
double local_bits(const trace::PrecisionRow& row);

// The heatmap's colour scale: bits of agreement from 0 (red: no bit agrees) to kBitsScaleTop (blue: f16's 11
// bits and one more; more bits, f32's, are that colour too), linear between the stops below; a NaN (no local
// errors) is kNoBits. The stops are at 0, 3, 6, 9 and 12 bits.
inline constexpr double kBitsScaleTop = 12;
inline constexpr std::uint32_t kBitsStops[5] = {rgba(200, 30, 30), rgba(240, 120, 30), rgba(230, 210, 60),
                                                rgba(80, 180, 90), rgba(40, 110, 200)};
inline constexpr std::uint32_t kNoBits = rgba(95, 95, 110);
std::uint32_t bits_colour(double bits);
// The legend: the scale's ticks (bits, their colour), every 3 bits.
struct LegendTick {
  double bits = 0;
  std::uint32_t colour = 0;
  std::string label;  // "0", "3", ..., "12+"
};
std::vector<LegendTick> bits_legend();

// What hovering a cell shows, and Op detail's numbers for a twinned op.
std::string precision_cell_text(const PrecisionMapRow& row, const trace::PrecisionRow& p);
std::vector<KeyValue> precision_detail_rows(const trace::PrecisionRow& p);

// The error histogram of a twinned op (its error_bins, exact and flips) as bars in the order drawn: "flip",
// then buckets 0 .. 25 ("25+": the last bucket), then "exact"; each bar coloured by the bits of its bucket (the
// flip bar kInfBar's red, exact the top of the scale).
std::vector<Bar> error_histogram_bars(const trace::PrecisionRow& p);

// ---- FP8 ----
// The /fp8 rows of a --precision fp8 run (docs/trace-format.md) as a heatmap: one row per FP8 operand (module and
// operand: "fc1 input [e4m3]"), modules in the order they first appear in the trace (step, then row order: the
// model's order of its forward pass), each module's operands as input, weight, grad_output; one column per
// recorded step with rows, ascending; each cell the underflow or the saturation fraction of that step's nonzero
// values (trace::fp8_fraction). Several rows of one operand in one step (a Linear called twice) are one cell:
// counts summed, amax the largest, scale and the optional columns the last row's, rel_rms_error the largest.
enum class Fp8Measure { underflow, saturation };
struct Fp8MapRow {
  std::string module, operand, format;
  std::string label;  // "fc1 input [e4m3]"
};
struct Fp8Map {
  std::vector<Fp8MapRow> rows;
  std::vector<std::int64_t> steps;        // the columns
  std::vector<trace::Fp8Row> source;      // one (merged) row per cell that has one
  std::vector<std::int32_t> cells;        // rows.size() x steps.size(), row-major: an index into source, -1 none
  const trace::Fp8Row* at(std::size_t row, std::size_t column) const;
  // The cell's fraction of the nonzero values (0 when it has none); NaN for a cell without a row.
  double fraction(std::size_t row, std::size_t column, Fp8Measure measure) const;
};
// Builds the map from a trace's /fp8 rows (any order); O(n log n), off the UI thread (TraceDocument).
Fp8Map fp8_map(std::vector<trace::Fp8Row> rows);
// Whether a trace gets the FP8 panel: it holds /fp8 rows (a --precision fp8 run; no other trace shows the panel).
bool has_fp8_panel(const trace::RowCounts& counts);
// The column of a step, the row of a module's operand; nullopt when the map has none.
std::optional<std::size_t> fp8_column(const Fp8Map& map, std::int64_t step);
std::optional<std::size_t> fp8_row(const Fp8Map& map, std::string_view module, std::string_view operand);

// The fraction colour scale: exactly 0 is kFp8Nothing (nothing lost); above, log10 of the fraction from 1e-5 (the
// first stop; smaller fractions are that colour too) to 1 (all), linear between the stops at 1e-5, 1e-4, 1e-3,
// 1e-2, 1e-1 and 1. 1e-2 is the 2% / 1% neighbourhood the report's findings flag (analysis.h).
inline constexpr std::uint32_t kFp8Nothing = rgba(34, 44, 70);
inline constexpr std::uint32_t kFp8NoRow = rgba(95, 95, 110);  // a cell without a row: not drawn, the legend's grey
inline constexpr std::uint32_t kFractionStops[6] = {rgba(40, 110, 200), rgba(60, 170, 190), rgba(80, 180, 90),
                                                    rgba(230, 210, 60), rgba(240, 120, 30), rgba(200, 30, 30)};
std::uint32_t fraction_colour(double fraction);
// The legend: a tick per stop ("0", "1e-5", ..., "1"), the first kFp8Nothing's.
struct FractionTick {
  double fraction = 0;
  std::uint32_t colour = 0;
  std::string label;
};
std::vector<FractionTick> fraction_legend();

// One operand over the steps, for the plot under the heatmap: its scale, its amax, and (when the trace has the
// optional columns) the history's amax that set the next scale, at each column with a row.
struct Fp8OperandSeries {
  std::vector<double> step, scale, amax, history_amax;
};
Fp8OperandSeries fp8_operand_series(const Fp8Map& map, std::size_t row);
// What hovering a cell shows, and the numbers beside the plot for the selected cell.
std::string fp8_cell_text(const Fp8MapRow& row, const trace::Fp8Row& r);
std::vector<KeyValue> fp8_detail_rows(const trace::Fp8Row& r);

// ---- Block-scaled formats ----
// The /blocks rows (docs/trace-format.md: --precision mxfp8|nvfp4 runs and --what-if statistics) as a heatmap built
// as the FP8 one is: one row per operand copy (module, operand, copy, format, what_if: "fc1 input rowwise [mxfp8]",
// "fc1 weight rowwise [nvfp4 what-if]"), modules in the order they first appear, then operand (input, weight,
// grad_output), copy (rowwise, columnwise), format (mxfp8, nvfp4), trained before what-if; one column per recorded
// step; each cell the underflow or saturation fraction of that step's nonzero values (trace::block_fraction).
// Several rows of one copy in one step (a Linear called twice) are one cell: counts summed, the widest block and
// the worst block the larger one's, scales' min and max over both and the median the last row's, the error the
// largest.
struct BlockMapRow {
  std::string module, operand, copy, format;
  bool what_if = false;
  std::string label;
};
struct BlockMap {
  std::vector<BlockMapRow> rows;
  std::vector<std::int64_t> steps;
  std::vector<trace::BlockRow> source;
  std::vector<std::int32_t> cells;  // rows.size() x steps.size(), row-major: an index into source, -1 none
  const trace::BlockRow* at(std::size_t row, std::size_t column) const;
  // The cell's fraction of the nonzero values (0 when it has none); NaN for a cell without a row.
  double fraction(std::size_t row, std::size_t column, Fp8Measure measure) const;
};
BlockMap block_map(std::vector<trace::BlockRow> rows);
// Whether a trace gets the Blocks panel: it holds /blocks rows.
bool has_blocks_panel(const trace::RowCounts& counts);
// What hovering a cell shows, and the numbers of the selected cell (what-if cells in the conditional).
std::string block_cell_text(const BlockMapRow& row, const trace::BlockRow& r);
std::vector<KeyValue> block_detail_rows(const trace::BlockRow& r);

// ---- Ranks of a data-parallel run ----
// `ampscope train --ddp --out run.h5` writes one trace per rank (run.rank0.h5, ...). The viewer opens a run's
// rank traces together: one rank's ops, anomalies and op detail at a time (the rank selector), and every
// rank's loss, loss scale and gradient norm overlaid in the Scale and loss plots, one line per rank.

// What the names on the command line (or dropped onto the window) open (probes/analysis/ranks.h finds
// siblings):
//  - one name of a data-parallel run (run.h5 when run.rank0.h5 ... exist, or one rank's file): every rank's
//    trace, showing the named rank (rank 0 for the run's name);
//  - two names that are traces of the same run (both rank files of one run): those two ranks, the first shown;
//  - three names or more: those ranks (the viewer checks that they are ranks of one run when it opens them);
//  - otherwise trace a and, for a second name, trace b to compare with.
struct OpenPlan {
  std::vector<std::string> ranks;  // the rank traces to open together (empty: no rank set)
  std::size_t shown = 0;           // the index in `ranks` shown first
  std::string a, b;                // without a rank set: trace a and trace b ("" when not given)
};
OpenPlan open_plan(const std::vector<std::string>& names);

// The colour of rank r's line in the overlays: 8 colours, distinct from each other, from the plots' markers
// and from the single-trace series, repeating from rank 8.
inline constexpr std::uint32_t kRankColours[8] = {rgba(80, 160, 255),  rgba(255, 120, 80),  rgba(90, 220, 140),
                                                  rgba(230, 200, 60),  rgba(200, 120, 255), rgba(60, 215, 220),
                                                  rgba(255, 140, 190), rgba(185, 185, 120)};
std::uint32_t rank_colour(int rank);

// One rank's steps, as its document holds them.
struct RankSteps {
  int rank = 0;
  std::span<const trace::StepRow> steps;
};
// One line per rank in each of the three plots: that rank's loss, scale and gradient norm by step
// (step_series of its rows), labelled "rank R" in its colour, in the order given.
struct RankLine {
  int rank = 0;
  std::string label;  // "rank 0"
  std::uint32_t colour = 0;
  StepSeries series;
};
std::vector<RankLine> rank_lines(std::span<const RankSteps> ranks);

// The rank selector's item for a rank: its number and, once its analysis is in, its anomalies ("rank 1: 1
// anomaly", "rank 0: healthy"); "rank 2: analysing" while it runs, "rank 3" before it has started.
struct RankItem {
  int rank = 0;
  const analysis::Report* report = nullptr;
  bool analysing = false;
};
std::string rank_item_label(const RankItem& item);

// ---- File browser ----
struct DirEntry {
  std::string name;
  bool directory = false;
  std::uintmax_t size = 0;
};
// Folders first, then files ending in .h5, each sorted by name; ".." first unless at the root. An unreadable
// folder gives its error text in `error` and no entries.
std::vector<DirEntry> list_directory(const std::filesystem::path& dir, std::string* error);

}  // namespace ampscope::viewer
