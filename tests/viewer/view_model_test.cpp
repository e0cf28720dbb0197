// What the viewer's panels show, checked without a window (viewer/view_model.h, document.h, options.h):
// series and markers from hand-written step rows, the ops table's filtering and sorting, exponent zones
// from f16's definition (max 65504 < 2^16, smallest normal 2^-14, smallest subnormal 2^-24), cards from the
// analysis of a hand-built trace, and a document opened from files written with the real TraceWriter.
#include <gtest/gtest.h>

#include <hdf5.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "tests/test_support.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/document.h"
#include "viewer/options.h"
#include "viewer/view_model.h"
#include "probes/analysis/diff.h"

namespace ampscope::viewer {
namespace {

using testing::op_row;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

trace::StepRow step_row(std::int64_t step, double scale, double scale_after, bool skipped) {
  trace::StepRow r;
  r.step = step;
  r.loss = skipped ? kNaN : 1.0;
  r.scale = scale;
  r.scale_after = scale_after;
  r.skipped = skipped;
  r.found_inf = skipped;
  return r;
}

TEST(view_model_test, step_series_marks_skipped_steps_backoffs_and_growths) {
  const std::vector<trace::StepRow> steps = {step_row(0, 8, 8, false), step_row(1, 8, 4, true),
                                             step_row(2, 4, 8, false), step_row(3, 8, 8, false)};
  const StepSeries s = step_series(steps);
  EXPECT_EQ(s.step, (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(s.scale, (std::vector<double>{8, 8, 4, 8}));
  EXPECT_EQ(s.skipped, (std::vector<double>{1}));
  EXPECT_EQ(s.backoffs, (std::vector<double>{1}));  // 8 -> 4
  EXPECT_EQ(s.growths, (std::vector<double>{2}));   // 4 -> 8
  EXPECT_TRUE(std::isnan(s.loss[1]));               // a gap in the loss curve
  EXPECT_EQ(nearest_step(steps, 1.4), 1);
  EXPECT_EQ(nearest_step(steps, 2.6), 3);
  EXPECT_EQ(step_index(steps, 2), 2u);
  EXPECT_FALSE(step_index(steps, 9).has_value());
}

TEST(view_model_test, ops_table_filters_case_insensitively_and_sorts_nan_after_numbers) {
  std::vector<trace::OpRow> rows = {op_row(0, 0, "blocks.0.attn", "bmm", "f16", 30), op_row(0, 1, "fc", "linear", "f32", 10),
                                    op_row(0, 2, "blocks.1.ATTN", "softmax", "f16", kNaN), op_row(0, 3, "fc", "add", "f16", 20)};
  rows[2].health.nan = 3;
  EXPECT_EQ(op_order(rows, {}, OpColumn::seq, true), (std::vector<std::uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(op_order(rows, {.text = "attn"}, OpColumn::seq, true), (std::vector<std::uint32_t>{0, 2}));
  EXPECT_EQ(op_order(rows, {.text = "f32"}, OpColumn::seq, true), (std::vector<std::uint32_t>{1}));
  OpFilter nonfinite;
  nonfinite.nonfinite_only = true;
  EXPECT_EQ(op_order(rows, nonfinite, OpColumn::seq, true), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(op_order(rows, {}, OpColumn::absmax, true), (std::vector<std::uint32_t>{1, 3, 0, 2}));
  EXPECT_EQ(op_order(rows, {}, OpColumn::absmax, false), (std::vector<std::uint32_t>{2, 0, 3, 1}));
  EXPECT_EQ(op_order(rows, {}, OpColumn::seq, false), (std::vector<std::uint32_t>{3, 2, 1, 0}));
  EXPECT_EQ(op_order(rows, {}, OpColumn::module, true), (std::vector<std::uint32_t>{0, 2, 1, 3}));  // stable ties
  EXPECT_EQ(op_cell(rows[2], OpColumn::nonfinite), "3 nan");
  EXPECT_EQ(op_cell(rows[2], OpColumn::absmax), "nan");
  EXPECT_EQ(op_cell(rows[0], OpColumn::dtypes), "f16,f16 -> f16");
  rows[3].health.pos_inf = 2;
  rows[3].health.neg_inf = 1;
  EXPECT_EQ(op_cell(rows[3], OpColumn::nonfinite), "2 +inf, 1 -inf");
  EXPECT_NE(dtype_colour("f16"), dtype_colour("bf16"));
  EXPECT_NE(dtype_colour("f16"), dtype_colour("f32"));
}

// The histogram's zones are probes/analysis/f16_ranges.h's (tested against the conversion in tests/probes); here:
// the viewer uses them, with the tensor's dtype, where it used to call bin -25 "flush to zero" and count
// [65520, 65536) as finite.
TEST(view_model_test, exponent_histogram_counts_each_bin_by_what_f16_makes_of_it) {
  trace::HistogramRow row;
  row.seq = 4;
  row.tensor = "output";
  auto bin = [](int e) { return static_cast<std::size_t>(e - trace::kHistMinExponent); };
  row.bins[bin(0)] = 100;   // 1 .. 2
  row.bins[bin(15)] = 6;    // 32768 .. 65536: from 65520 inf in f16
  row.bins[bin(16)] = 7;    // 65536 .. : inf in f16
  row.bins[bin(-20)] = 5;   // f16 subnormal
  row.bins[bin(-25)] = 4;   // 2^-25 .. 2^-24: round UP to 2^-24 (only 2^-25 itself goes to 0)
  row.bins[bin(-30)] = 3;   // flushes to zero in f16
  row.bins[half_ranges::kSubnormalBin] = 2;  // f32 subnormal or < 2^-64: flushes
  row.bins[half_ranges::kZeroBin] = 11;
  row.bins[half_ranges::kInfBin] = 7101;
  row.bins[half_ranges::kNanBin] = 1;
  const auto h = op_histogram(std::vector<trace::HistogramRow>{row}, 4, "f32");
  ASSERT_TRUE(h.has_value());
  using half_ranges::Zone;
  EXPECT_EQ(h->exponent, (std::vector<double>{-30, -25, -20, 0, 15, 16}));
  EXPECT_EQ(h->count, (std::vector<double>{3, 4, 5, 100, 6, 7}));
  EXPECT_EQ(h->zone, (std::vector<Zone>{Zone::flushes_to_zero, Zone::rounds_up, Zone::subnormal, Zone::normal,
                                        Zone::partly_overflows, Zone::overflows}));
  EXPECT_EQ(h->f16[Zone::overflows], 7);
  EXPECT_EQ(h->f16[Zone::partly_overflows], 6);
  EXPECT_EQ(h->f16[Zone::subnormal], 5);
  EXPECT_EQ(h->f16[Zone::rounds_up], 4);
  EXPECT_EQ(h->f16[Zone::flushes_to_zero], 3 + 2);
  EXPECT_EQ(h->inf, 7101);
  EXPECT_EQ(h->zero, 11);
  EXPECT_EQ(h->nan, 1);
  EXPECT_EQ(h->total, 100 + 6 + 7 + 5 + 4 + 3 + 2 + 11 + 7101 + 1);
  EXPECT_FALSE(op_histogram(std::vector<trace::HistogramRow>{row}, 5, "f32").has_value());

  // The lines under the plot: the recorded infs are in the overflow line (not "above f16's max: 0"), bin 15
  // is named as partly overflowing, bin -25 as rounding up.
  const auto lines = f16_zone_lines(*h);
  EXPECT_NE(lines[0].text.find("7,101 inf recorded"), std::string::npos) << lines[0].text;
  EXPECT_NE(lines[0].text.find("7 finite >= 2^16"), std::string::npos) << lines[0].text;
  EXPECT_NE(lines[0].text.find(">= 65520 of 6 in 2^15 .. 2^16"), std::string::npos) << lines[0].text;
  EXPECT_EQ(lines[0].colour, colours::kNonFiniteCell);
  EXPECT_NE(lines[2].text.find("round up to 2^-24 (2^-25 .. 2^-24): 4"), std::string::npos) << lines[2].text;
  EXPECT_NE(lines[3].text.find("flush to 0 in f16 (<= 2^-25): 5"), std::string::npos) << lines[3].text;
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_NE(lines[4].text.find("NaN: 1; zero: 11; sub: 2 (f32 subnormal or < 2^-64: flush)"), std::string::npos)
      << lines[4].text;

  // Infs alone still fill the overflow line.
  trace::HistogramRow only_inf;
  only_inf.bins[half_ranges::kInfBin] = 7101;
  const auto lines_inf = f16_zone_lines(exponent_histogram(only_inf, "f16"));
  EXPECT_NE(lines_inf[0].text.find("7,101 inf recorded"), std::string::npos) << lines_inf[0].text;
  EXPECT_EQ(lines_inf[0].colour, colours::kNonFiniteCell);

  // An f16 tensor: bin 15 is finite (nothing above 65504), the subnormal bin is f16's subnormals.
  const auto f16 = exponent_histogram(row, "f16");
  EXPECT_EQ(f16.f16[Zone::partly_overflows], 0);
  EXPECT_EQ(f16.f16[Zone::normal], 106);
  EXPECT_EQ(f16.f16[Zone::subnormal], 5 + 2);
}

TEST(view_model_test, special_bins_are_bars_of_their_own_and_zones_have_f16s_exact_edges) {
  trace::HistogramRow row;
  row.bins[half_ranges::kSubnormalBin] = 2;
  row.bins[half_ranges::kZeroBin] = 11;
  row.bins[half_ranges::kInfBin] = 7101;
  row.bins[half_ranges::kNanBin] = 3;
  const auto bars = special_bars(exponent_histogram(row, "f32"));
  ASSERT_EQ(bars.size(), 4u);
  EXPECT_EQ(bars[0].label, "sub");
  EXPECT_EQ(bars[0].count, 2);
  EXPECT_EQ(bars[1].label, "0");
  EXPECT_EQ(bars[1].count, 11);
  EXPECT_EQ(bars[2].label, "inf");
  EXPECT_EQ(bars[2].count, 7101);
  EXPECT_EQ(bars[2].colour, colours::kInfBar);
  EXPECT_EQ(bars[3].label, "NaN");
  EXPECT_EQ(bars[3].count, 3);

  // On the log2|x| axis: flush up to -25, round up in (-25, -24), subnormal [-24, -14), inf from log2(65520).
  using half_ranges::Zone;
  const auto bands = f16_zone_bands();
  auto band = [&](Zone z) {
    for (const auto& b : bands)
      if (b.zone == z) return b;
    ADD_FAILURE() << "no band for " << half_ranges::zone_name(z);
    return ZoneBand{};
  };
  EXPECT_EQ(band(Zone::flushes_to_zero).x1, -25);
  EXPECT_EQ(band(Zone::rounds_up).x0, -25);
  EXPECT_EQ(band(Zone::rounds_up).x1, -24);
  EXPECT_EQ(band(Zone::subnormal).x0, -24);
  EXPECT_EQ(band(Zone::subnormal).x1, -14);
  EXPECT_DOUBLE_EQ(band(Zone::overflows).x0, std::log2(65520.0));
  EXPECT_LT(band(Zone::overflows).x0, 16);
}

TEST(view_model_test, why_nan_cards_select_the_origin_step_and_op) {
  std::vector<trace::StepRow> steps = {step_row(0, 8, 8, false), step_row(1, 8, 4, true)};
  std::vector<trace::OpRow> ops = {op_row(0, 0, "fc1", "linear", "f16", 3), op_row(1, 0, "fc1", "linear", "f16", 3),
                                   op_row(1, 1, "fc2", "exp", "f16", kNaN)};
  ops[2].health.pos_inf = 4;
  ops[2].origin = true;
  const analysis::Report rep = analysis::analyse(steps, ops, {});
  const auto cards = why_nan_cards(rep);
  ASSERT_FALSE(cards.empty());
  EXPECT_EQ(cards[0].kind, Card::Kind::anomaly);
  EXPECT_EQ(cards[0].step, 1);
  EXPECT_EQ(cards[0].seq, 1);
  EXPECT_NE(cards[0].title.find("exp_overflow"), std::string::npos) << cards[0].title;
  EXPECT_NE(cards[0].title.find("fc2"), std::string::npos) << cards[0].title;
  // The remedies, each with its kind and text, are the analysis's (the paragraph is not repeated as a line).
  ASSERT_EQ(cards[0].remedies.size(), rep.anomalies[0].remedies.size());
  ASSERT_FALSE(cards[0].remedies.empty());
  for (std::size_t i = 0; i < cards[0].remedies.size(); ++i) {
    EXPECT_EQ(cards[0].remedies[i].kind, rep.anomalies[0].remedies[i].kind);
    EXPECT_FALSE(cards[0].remedies[i].text.empty());
  }
  for (const auto& kv : cards[0].lines) EXPECT_NE(kv.key, "remedy") << kv.value;
  // The scaler skipped a step: its card comes last.
  EXPECT_EQ(cards.back().kind, Card::Kind::scaler);
}

// ---- The first anomaly at open (early_anomaly) ----

trace::EventRow event(std::int64_t step, std::int64_t seq, const std::string& kind, const std::string& op = "",
                      const std::string& module = "") {
  return trace::EventRow{.step = step, .seq = seq, .kind = kind, .op = op, .module = module, .detail = ""};
}

TEST(view_model_test, early_anomaly_is_the_earliest_recorded_step_an_anomaly_event_or_a_step_row_names) {
  // Steps 0..5, written out of order; step 4's row says found_inf and skipped (no event of its own).
  std::vector<trace::StepRow> steps = {step_row(3, 8, 8, false), step_row(0, 8, 8, false), step_row(1, 8, 8, false),
                                       step_row(2, 8, 8, false), step_row(4, 8, 4, true), step_row(5, 4, 4, false)};
  auto a = early_anomaly(steps, {});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->step, 4);
  EXPECT_FALSE(a->seq.has_value()) << "a step row names no op";
  EXPECT_FALSE(a->from_events);
  EXPECT_EQ(a->what, "loss nan, inf/NaN in the gradients, skipped step");
  // Events that are no anomaly (an underflowing cast, a growth, a kind this build does not know), and anomaly
  // events of steps without a /steps row (-1, 9, and 2.5's neighbour 7), do not count.
  std::vector<trace::EventRow> events = {event(0, 2, "cast_underflow", "to", "fc1"), event(1, 9, "scale_growth"),
                                         event(1, 3, "mystery_kind", "mul", "fc1"), event(-1, 0, "origin", "exp", "x"),
                                         event(9, 0, "origin", "exp", "x"), event(7, 0, "skipped_step")};
  a = early_anomaly(steps, events);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->step, 4) << "only the step row's flag is left";
  // At step 3 (before the flag): within the step the origin is chosen over a propagation, a cast overflow and the
  // scaler's events, whatever their order in the table; its seq is the op's.
  events.push_back(event(3, 6, "scale_backoff"));
  events.push_back(event(3, 5, "propagate", "softmax", "head"));
  events.push_back(event(3, 7, "grad_overflow", "", "fc1.weight"));
  events.push_back(event(3, 4, "origin", "linear", "fc2"));
  events.push_back(event(3, 2, "origin", "exp", "fc1"));
  a = early_anomaly(steps, events);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->step, 3);
  EXPECT_EQ(a->seq, 2) << "the first origin of the step";
  EXPECT_TRUE(a->from_events);
  EXPECT_EQ(a->what, "NaN/inf created by exp in fc1");
  // A step-level event earlier still: its step wins, with no op.
  events.push_back(event(2, 8, "skipped_step"));
  a = early_anomaly(steps, events);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->step, 2);
  EXPECT_FALSE(a->seq.has_value());
  EXPECT_EQ(a->what, "skipped step");
  // A step row flagged before every event: the step row's step (a non-finite loss alone is a flag).
  steps[2].loss = std::numeric_limits<double>::infinity();  // step 1
  a = early_anomaly(steps, events);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->step, 1);
  EXPECT_FALSE(a->from_events);
  EXPECT_EQ(a->what, "loss inf");
  // Nothing flagged, no anomaly event: none.
  EXPECT_FALSE(early_anomaly(std::vector<trace::StepRow>{step_row(0, 8, 8, false)},
                             std::vector<trace::EventRow>{event(0, 1, "cast_underflow", "to", "fc1")})
                   .has_value());
  EXPECT_FALSE(early_anomaly({}, std::vector<trace::EventRow>{event(0, 1, "origin", "exp", "fc1")}).has_value())
      << "no recorded step at all";
}

TEST(view_model_test, early_anomalys_op_is_the_events_when_the_step_holds_it_else_the_first_origin_else_none) {
  std::vector<trace::OpRow> rows = {op_row(2, 0, "fc1", "linear", "f16", 3), op_row(2, 1, "fc2", "linear", "f16", 3),
                                    op_row(2, 2, "head", "softmax", "f16", 3)};
  EXPECT_EQ(early_anomaly_op(rows, 2), 2);
  EXPECT_EQ(early_anomaly_op(rows, 7), std::nullopt) << "seq 7 is not in the step, and no row is an origin";
  EXPECT_EQ(early_anomaly_op(rows, std::nullopt), std::nullopt);
  rows[1].origin = true;
  EXPECT_EQ(early_anomaly_op(rows, std::nullopt), 1);
  EXPECT_EQ(early_anomaly_op(rows, 7), 1);
  EXPECT_EQ(early_anomaly_op({}, 1), std::nullopt) << "a step without rows";
}

TEST(view_model_test, early_anomalys_label_says_provisional_and_the_verdict_says_why_the_selection_moved) {
  const EarlyAnomaly from_events{.step = 1, .seq = 4, .from_events = true, .what = "skipped step"};
  EXPECT_EQ(early_anomaly_label(from_events, 0.25),
            "Provisional: step 1 (skipped step), the first anomaly the trace's events name. The analysis (25%) gives the "
            "verdict and may move the selection.");
  const EarlyAnomaly from_steps{.step = 7, .seq = std::nullopt, .from_events = false, .what = "loss nan"};
  EXPECT_EQ(early_anomaly_label(from_steps, 0, false),
            "Unconfirmed: step 7 (loss nan), the first anomaly the trace's step rows name; the analysis did not finish, "
            "so nothing confirms it.");
  // The verdicts, against a report built by hand.
  analysis::Report rep;
  EXPECT_EQ(early_anomaly_verdict(from_events, rep, 0),
            "The analysis found no anomaly: step 1 (skipped step, from the trace's events) is not one. Showing step 0.");
  analysis::Diagnosis d;
  d.step = 3;
  d.seq = 1;
  d.op = "linear";
  d.module = "fc2";
  d.cause = "f16_overflow";
  rep.anomalies.push_back(d);
  EXPECT_EQ(early_anomaly_verdict(from_events, rep, 3),
            "Moved to step 3, the analysis's first anomaly (f16_overflow, linear in fc2): step 1 (skipped step, from the "
            "trace's events), shown until then, is not.");
  rep.anomalies.front().step = 1;
  EXPECT_EQ(early_anomaly_verdict(from_events, rep, 1), "") << "the same step: the label just goes";
}

// ---- Op detail: inputs and consumers ----

// One step of hand-made rows whose provenance is written down here:
//   seq 0  linear in fc1     inputs: data, parameter, parameter
//   seq 1  exp in fc2        inputs: 0                    (4 +inf, 2 zeros: the unhealthy one)
//   seq 2  mul in fc2        inputs: 1, 1                 (x * x: both operands are seq 1)
//   seq 3  add in head       inputs: 2, unrecorded, 9     (seq 9 is not in the step: a damaged row)
//   seq 4  backward of add   inputs: summed
//   seq 5  mean (no module)  inputs: 3, none, 0           (a position left empty is skipped, not the rest)
// and a row of the next step (seq 0) whose inputs name seq 1 and 2: it must not count as a consumer.
std::vector<trace::OpRow> provenance_rows() {
  std::vector<trace::OpRow> rows = {op_row(4, 0, "fc1", "linear", "f16", 3), op_row(4, 1, "fc2", "exp", "f16", 20),
                                    op_row(4, 2, "fc2", "mul", "f16", 400),  op_row(4, 3, "head", "add", "f32", 401),
                                    op_row(4, 4, "head", "add", "f32", 1),   op_row(4, 5, "", "mean", "f32", 5),
                                    op_row(5, 0, "fc1", "linear", "f16", 3)};
  rows[0].inputs = {trace::kInputData, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
  rows[1].inputs = {0, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  rows[1].health.pos_inf = 4;
  rows[1].health.zero = 2;
  rows[2].inputs = {1, 1, trace::kInputNone, trace::kInputNone};
  rows[3].inputs = {2, trace::kInputUnrecorded, 9, trace::kInputNone};
  rows[3].shape = "[4]";
  rows[4].phase = trace::Phase::backward;
  rows[4].inputs = {trace::kInputSummed, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  rows[5].inputs = {3, trace::kInputNone, 0, trace::kInputNone};
  rows[6].inputs = {1, 2, trace::kInputNone, trace::kInputNone};
  return rows;
}

TEST(view_model_test, producers_name_each_inputs_row_in_order_or_say_its_marker_in_words) {
  const auto rows = provenance_rows();
  const std::span<const trace::OpRow> step(rows.data(), 6);

  // seq 0: markers only, in input order.
  auto p = producers(rows[0], step);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].positions, std::vector<int>{0});
  EXPECT_EQ(p[0].marker, trace::kInputData);
  EXPECT_EQ(p[0].text, "data or constant");
  EXPECT_EQ(p[1].text, "parameter");
  EXPECT_EQ(p[2].positions, std::vector<int>{2});
  for (const auto& l : p) {
    EXPECT_FALSE(l.found);
    EXPECT_EQ(l.seq, -1);
    EXPECT_TRUE(l.health.empty());
  }

  // seq 1: its input is seq 0's row, with that row's op, module, seq, dtype, shape and health.
  p = producers(rows[1], step);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].found);
  EXPECT_EQ(p[0].seq, 0);
  EXPECT_EQ(p[0].marker, 0);
  EXPECT_EQ(p[0].text, "seq 0  linear in fc1  f16 [4, 8]");
  EXPECT_EQ(p[0].health, "NaN/inf 0, zeros 0 of 32, absmax 3");
  EXPECT_FALSE(p[0].nonfinite);
  EXPECT_EQ(p[0].out_dtype, "f16");

  // seq 2 (x * x): both inputs are seq 1, whose output holds 4 +inf.
  p = producers(rows[2], step);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].seq, 1);
  EXPECT_EQ(p[1].seq, 1);
  EXPECT_EQ(p[0].positions, std::vector<int>{0});
  EXPECT_EQ(p[1].positions, std::vector<int>{1});
  EXPECT_TRUE(p[0].nonfinite);
  EXPECT_EQ(p[0].health, "NaN/inf 4 +inf, zeros 2 of 32, absmax 20");

  // seq 3: a row, an op the trace did not record, and a seq the step does not hold (said, not dropped).
  p = producers(rows[3], step);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].seq, 2);
  EXPECT_EQ(p[0].text, "seq 2  mul in fc2  f16 [4, 8]");
  EXPECT_EQ(p[1].marker, trace::kInputUnrecorded);
  EXPECT_EQ(p[1].text, "an op of this step the probe did not record (filtered out)");
  EXPECT_EQ(p[2].seq, 9);
  EXPECT_FALSE(p[2].found);
  EXPECT_NE(p[2].text.find("seq 9"), std::string::npos) << p[2].text;
  EXPECT_NE(p[2].text.find("not among"), std::string::npos) << p[2].text;

  // A backward node's input: the summed gradients; its phase is named in a link to it.
  p = producers(rows[4], step);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].text, "summed gradients");

  // seq 5: position 1 is empty, position 2 is still read; a row outside any module says so.
  p = producers(rows[5], step);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].seq, 3);
  EXPECT_EQ(p[0].text, "seq 3  add in head  f32 [4]");
  EXPECT_EQ(p[1].seq, 0);
  EXPECT_EQ(p[1].positions, std::vector<int>{2});
  const auto c = consumers(rows[3], step);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].text, "seq 5  mean in (no module)  f32 [4, 8]");

  // Producers found in a step other than the row's are not its producers.
  p = producers(rows[6], std::span<const trace::OpRow>(rows.data(), 6));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_FALSE(p[0].found);
  EXPECT_FALSE(p[1].found);
}

TEST(view_model_test, consumers_are_the_rows_of_the_step_naming_the_seq_each_once_with_its_positions) {
  const auto rows = provenance_rows();  // all of them: the row of step 5 must be left out
  auto c = consumers(rows[0], rows);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].seq, 1);
  EXPECT_EQ(c[0].positions, std::vector<int>{0});
  EXPECT_EQ(c[0].text, "seq 1  exp in fc2  f16 [4, 8]");
  EXPECT_TRUE(c[0].nonfinite);
  EXPECT_EQ(c[1].seq, 5);
  EXPECT_EQ(c[1].positions, std::vector<int>{2});

  c = consumers(rows[1], rows);  // x * x takes seq 1 in twice: one consumer, inputs 0 and 1
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq, 2);
  EXPECT_EQ((c[0].positions), (std::vector<int>{0, 1}));
  EXPECT_TRUE(c[0].found);
  EXPECT_EQ(c[0].health, "NaN/inf 0, zeros 0 of 32, absmax 400");

  EXPECT_EQ(consumers(rows[2], rows).size(), 1u);  // seq 3 (not step 5's seq 0)
  EXPECT_EQ(consumers(rows[2], rows)[0].seq, 3);
  EXPECT_TRUE(consumers(rows[5], rows).empty());   // the last op: nothing takes it in
  // The backward node is named by its phase.
  std::vector<trace::OpRow> bwd = {rows[4], rows[4]};
  bwd[1].seq = 6;
  bwd[1].inputs = {4, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  c = consumers(bwd[0], bwd);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].text, "seq 6  backward add in head  f32 [4, 8]");
}

TEST(view_model_test, a_version_1_row_says_the_trace_has_no_provenance_once) {
  // What the reader gives for a format_version 1 trace: every input kInputUnknown.
  std::vector<trace::OpRow> rows = {op_row(0, 0, "fc1", "linear", "f16", 3), op_row(0, 1, "fc2", "linear", "f16", 3)};
  for (auto& r : rows) r.inputs.fill(trace::kInputUnknown);
  const auto p = producers(rows[1], rows);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].marker, trace::kInputUnknown);
  EXPECT_EQ(p[0].text, "unknown: this trace has no provenance (format_version 1)");
  EXPECT_FALSE(p[0].found);
  EXPECT_TRUE(consumers(rows[0], rows).empty());
  // Every marker has its words; a seq has none; an unknown negative value is called invalid, not a seq.
  EXPECT_EQ(input_marker_words(trace::kInputParameter), "parameter");
  EXPECT_EQ(input_marker_words(trace::kInputData), "data or constant");
  EXPECT_EQ(input_marker_words(trace::kInputSummed), "summed gradients");
  EXPECT_EQ(input_marker_words(3), "");
  EXPECT_NE(input_marker_words(-17).find("invalid"), std::string::npos);
  // A row with no inputs at all (a created tensor) has no producers.
  trace::OpRow none = op_row(0, 2, "", "zeros", "f32", 0);
  EXPECT_TRUE(producers(none, rows).empty());
}

// The tagger's failure (testing::tagger_ops): step 0 healthy, step 1 sigmoid -> neg -> add -> log, -inf.
analysis::Report tagger_report() {
  std::vector<trace::StepRow> steps = {step_row(0, 8, 8, false), step_row(1, 8, 4, true)};
  std::vector<trace::OpRow> ops = testing::tagger_ops(0, false);
  for (const auto& r : testing::tagger_ops(1, true)) ops.push_back(r);
  return analysis::analyse(steps, ops, {});
}

TEST(view_model_test, why_nan_cards_show_the_root_cause_chain_root_first_and_remedies_in_both_forms) {
  const analysis::Report rep = tagger_report();
  ASSERT_FALSE(rep.anomalies.empty());
  const analysis::Diagnosis& d = rep.anomalies.front();
  ASSERT_EQ(d.root_cause, "saturation") << d.cause;
  const auto cards = why_nan_cards(rep);
  ASSERT_FALSE(cards.empty());
  const Card& c = cards[0];
  EXPECT_EQ(c.step, 1);
  EXPECT_EQ(c.seq, 4);
  EXPECT_EQ(c.root_cause, "saturation");
  // The chain, root first: sigmoid saturated, neg passed it on, add cancelled, log is the origin; each
  // link selects its op in the origin's step.
  ASSERT_EQ(c.chain.size(), 4u);
  const std::int64_t want_seq[] = {1, 2, 3, 4};
  const char* want_op[] = {"sigmoid in (no module), seq 1, f16", "neg in (no module), seq 2, f16",
                           "add in (no module), seq 3, f16", "log in (no module), seq 4, f16"};
  const char* want_role[] = {"saturation", "passes on", "cancellation", "origin"};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.chain[i].step, 1);
    EXPECT_EQ(c.chain[i].seq, want_seq[i]);
    EXPECT_EQ(c.chain[i].text, want_op[i]);
    EXPECT_EQ(c.chain[i].role, want_role[i]);
    EXPECT_EQ(c.chain[i].evidence, d.chain[i].evidence);
    EXPECT_FALSE(c.chain[i].evidence.empty());
  }
  // The root cause is a line of its own naming the root op.
  bool root_line = false;
  for (const auto& kv : c.lines) {
    if (kv.key == "root cause") {
      root_line = true;
      EXPECT_EQ(kv.value, "saturation: sigmoid in (no module), seq 1");
      EXPECT_TRUE(kv.alert);
    }
  }
  EXPECT_TRUE(root_line);
  // Remedies: the analysis's, each with its kind; at least one carries C++ for a user's own loop.
  ASSERT_EQ(c.remedies.size(), d.remedies.size());
  bool code = false;
  for (std::size_t i = 0; i < c.remedies.size(); ++i) {
    EXPECT_EQ(c.remedies[i].kind, d.remedies[i].kind);
    EXPECT_EQ(c.remedies[i].flag, d.remedies[i].flag);
    EXPECT_EQ(c.remedies[i].code, d.remedies[i].code);
    code |= !c.remedies[i].code.empty();
  }
  EXPECT_TRUE(code);

  // Op detail finds the diagnosis from the origin and from every link of its chain, and no other op's.
  const DiagnosisAt at_origin = diagnosis_at(rep, 1, 4);
  EXPECT_EQ(at_origin.diagnosis, &d);
  EXPECT_EQ(at_origin.link, 3);
  const DiagnosisAt at_root = diagnosis_at(rep, 1, 1);
  EXPECT_EQ(at_root.diagnosis, &d);
  EXPECT_EQ(at_root.link, 0);
  EXPECT_EQ(diagnosis_at(rep, 1, 0).diagnosis, nullptr);  // the linear: not on the chain
  EXPECT_EQ(diagnosis_at(rep, 0, 1).diagnosis, nullptr);  // the same seq in the healthy step
}

TEST(view_model_test, a_card_names_silent_damage_when_an_op_turned_the_inf_into_finite_values) {
  // rmsnorm's failure (docs/scenarios.md): x * x overflows, rsqrt(inf) is 0, and x * 0 is finite but wrong.
  //   seq 0 linear (data, param, param) -> seq 1 mul (0, 0) +inf -> seq 2 rsqrt (1) zeros -> seq 3 mul (0, 2)
  std::vector<trace::StepRow> steps = {step_row(0, 8, 8, false)};
  std::vector<trace::OpRow> ops = {op_row(0, 0, "blocks.1.norm", "linear", "f16", 300),
                                   op_row(0, 1, "blocks.1.norm", "mul", "f16", 60000),
                                   op_row(0, 2, "blocks.1.norm", "rsqrt", "f16", 0.5),
                                   op_row(0, 3, "blocks.1.norm", "mul", "f16", 20)};
  ops[0].inputs = {trace::kInputData, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
  ops[1].inputs = {0, 0, trace::kInputNone, trace::kInputNone};
  ops[1].health.pos_inf = 8;
  ops[1].origin = true;
  ops[2].inputs = {1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  ops[2].health.zero = 8;
  ops[3].inputs = {0, 2, trace::kInputNone, trace::kInputNone};
  ops[3].health.zero = 8;
  const analysis::Report rep = analysis::analyse(steps, ops, {});
  ASSERT_FALSE(rep.anomalies.empty());
  ASSERT_FALSE(rep.anomalies[0].absorbed_by.empty());
  const auto cards = why_nan_cards(rep);
  std::string damage;
  for (const auto& kv : cards[0].lines) {
    if (kv.key == "silent damage") damage = kv.value;
  }
  EXPECT_NE(damage.find("rsqrt"), std::string::npos) << damage;
  EXPECT_NE(damage.find("wrong but finite"), std::string::npos) << damage;
  EXPECT_NE(damage.find("the loss does not show it"), std::string::npos) << damage;  // the step's loss is finite
  // The healthy-looking rsqrt lists the mul as its consumer, and the mul lists the inf row as its inputs.
  const auto c = consumers(ops[2], ops);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].seq, 3);
  EXPECT_EQ(c[0].positions, std::vector<int>{1});
  const auto p = producers(ops[2], ops);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].nonfinite);
}

TEST(view_model_test, a_card_without_provenance_has_no_chain_and_no_root_cause_line) {
  std::vector<trace::StepRow> steps = {step_row(0, 8, 4, true)};
  std::vector<trace::OpRow> ops = {op_row(0, 0, "fc1", "linear", "f16", 3), op_row(0, 1, "", "log", "f16", kNaN)};
  ops[1].health.neg_inf = 3;
  ops[1].origin = true;
  for (auto& r : ops) r.inputs.fill(trace::kInputUnknown);  // format_version 1
  const analysis::Report rep = analysis::analyse(steps, ops, {});
  const auto cards = why_nan_cards(rep);
  ASSERT_FALSE(cards.empty());
  EXPECT_TRUE(cards[0].root_cause.empty());
  EXPECT_TRUE(cards[0].chain.empty());
  for (const auto& kv : cards[0].lines) EXPECT_NE(kv.key, "root cause");
  const DiagnosisAt at = diagnosis_at(rep, 0, 1);
  EXPECT_EQ(at.diagnosis, &rep.anomalies.front());
  EXPECT_EQ(at.link, -1);
}

TEST(view_model_test, overview_counts_skipped_steps_and_says_when_analysis_runs) {
  const std::vector<trace::StepRow> steps = {step_row(0, 8, 8, false), step_row(1, 8, 4, true), step_row(2, 4, 4, true)};
  OverviewInput in;
  in.path = "x.h5";
  in.steps = steps;
  in.analysis_progress = 0.5;
  in.run.model = "mlp";
  const auto rows = overview_rows(in);
  auto value = [&](const std::string& key) {
    for (const auto& r : rows) if (r.key == key) return r.value;
    return std::string("<missing>");
  };
  EXPECT_EQ(value("skipped steps"), "2");
  EXPECT_EQ(value("steps"), "3 (step 0 .. 2)");
  EXPECT_EQ(value("anomalies"), "analysing... 50%");
  EXPECT_EQ(value("final scale"), "4");
  EXPECT_EQ(value("model"), "mlp");
}

TEST(view_model_test, numbers_print_with_thousands_separators_and_named_non_finite_values) {
  EXPECT_EQ(format_count(1234567), "1,234,567");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(-1000), "-1,000");
  EXPECT_EQ(format_count(std::numeric_limits<std::int64_t>::min()), "-9,223,372,036,854,775,808");
  EXPECT_EQ(format_number(65504), "65504");
  EXPECT_EQ(format_number(kNaN), "nan");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(view_model_test, compare_series_keeps_each_runs_own_steps) {
  analysis::DiffReport d;
  d.losses = {{.step = 0, .in_a = true, .in_b = true, .loss_a = 2, .loss_b = 2.1},
              {.step = 1, .in_a = true, .in_b = false, .loss_a = kNaN, .skipped_a = true},
              {.step = 2, .in_a = false, .in_b = true, .loss_b = 1.5}};
  const CompareSeries s = compare_series(d);
  EXPECT_EQ(s.step_a, (std::vector<double>{0, 1}));
  EXPECT_EQ(s.step_b, (std::vector<double>{0, 2}));
  EXPECT_EQ(s.loss_b, (std::vector<double>{2.1, 1.5}));
  EXPECT_EQ(s.skipped_a, (std::vector<double>{1}));
  EXPECT_TRUE(s.skipped_b.empty());
}

TEST(view_model_test, options_parse_the_headless_flags_and_reject_bad_values) {
  const ViewerOptions o = parse_options({"a.h5", "b.h5", "--screenshot", "x.png", "--panel", "ops", "--step", "3",
                                         "--size", "1024x640"});
  EXPECT_EQ(o.traces, (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_EQ(o.screenshot, "x.png");
  EXPECT_EQ(o.panel, "ops");
  EXPECT_EQ(o.step, 3);
  EXPECT_EQ(o.width, 1024);
  EXPECT_EQ(o.height, 640);
  EXPECT_TRUE(parse_options({"--help"}).help);
  EXPECT_THROW_MSG(parse_options({"--panel", "plots"}), Error, "unknown panel 'plots'", "hint:");
  EXPECT_THROW_MSG(parse_options({"--size", "big"}), Error, "--size expects WxH", "'big'");
  EXPECT_THROW_MSG(parse_options({"--step", "x3"}), Error, "--step expects an integer", "'x3'");
  // Three names or more are a data-parallel run's rank traces (open_plan; checked when opened).
  EXPECT_EQ(parse_options({"r0.h5", "r1.h5", "r2.h5"}).traces, (std::vector<std::string>{"r0.h5", "r1.h5", "r2.h5"}));
  EXPECT_EQ(parse_options({"run.h5", "--rank", "1"}).rank, 1);
  EXPECT_FALSE(parse_options({"run.h5"}).rank.has_value());
  EXPECT_THROW_MSG(parse_options({"--rank", "-1"}), Error, "--rank expects a rank from 0, got -1");
  EXPECT_THROW_MSG(parse_options({"--rank", "one"}), Error, "--rank expects an integer", "'one'");
  EXPECT_THROW_MSG(parse_options({"--screenshot"}), Error, "--screenshot needs a value");
}

TEST(view_model_test, document_reads_steps_at_open_and_a_steps_ops_on_demand) {
  const auto path = testing::write_fixture(testing::fixture_dir() / "doc_nan.h5", true);
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  EXPECT_EQ(doc->steps().size(), 4u);
  EXPECT_EQ(doc->run_info().model, "fixture");
  EXPECT_TRUE(doc->complete());
  EXPECT_EQ(doc->step_data(), nullptr);  // nothing read before a step is selected
  doc->select_step(1);
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr);
  EXPECT_EQ(doc->step_data()->step, 1);
  ASSERT_EQ(doc->step_data()->ops.size(), 3u);
  EXPECT_TRUE(doc->step_data()->ops[1].origin);
  EXPECT_EQ(doc->step_data()->ops[1].health.nan, 5);
  ASSERT_NE(doc->report(), nullptr) << doc->analysis_error();
  ASSERT_FALSE(doc->report()->anomalies.empty());
  EXPECT_EQ(doc->report()->anomalies[0].step, 1);
  EXPECT_EQ(doc->report()->anomalies[0].module, "fc2");
  std::filesystem::remove(path);
}

// A writer in another process (as a training run would be) writes steps 0 and 1, waits for a byte on a
// pipe, then writes steps 2 .. 4 and closes the file.
pid_t start_live_writer(const std::filesystem::path& path, int ready_fd, int go_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "live", .seed = 1, .config = "{}"});
    auto step = [&](std::int64_t n) {
      for (int seq = 0; seq < 3; ++seq) w.write(op_row(n, seq, "fc", "linear", "f16", 1.0 + seq));
      trace::StepRow r;
      r.step = n;
      r.loss = 1.0;
      r.scale = r.scale_after = 1024;
      w.write(r);
      w.end_step(n);
    };
    step(0);
    step(1);
    w.flush();
    char c = 1;
    if (write(ready_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1) status = 3;
    for (std::int64_t n = 2; n < 5; ++n) step(n);
    w.close();
  } catch (...) {
    status = 2;
  }
  _exit(status);
}

TEST(view_model_test, live_document_appends_new_steps_and_keeps_the_selected_step) {
  const auto path = testing::fixture_dir() / "live.h5";
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t writer = start_live_writer(path, ready[1], go[0]);
  ASSERT_GT(writer, 0);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);  // steps 0 and 1 are flushed; the file is still open for writing

  TraceDocument::Options options;
  options.live_interval = std::chrono::milliseconds(20);
  auto doc = TraceDocument::open(path, options);
  ASSERT_TRUE(doc->ok()) << doc->error();
  EXPECT_TRUE(doc->live());
  EXPECT_EQ(doc->steps().size(), 2u);
  doc->select_step(1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (doc->step_loading() && std::chrono::steady_clock::now() < until) {
    doc->poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();

  ASSERT_EQ(write(go[1], &c, 1), 1);
  int status = -1;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  while ((doc->live() || doc->analysing()) && std::chrono::steady_clock::now() < until) {
    doc->poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(doc->complete());
  ASSERT_EQ(doc->steps().size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(doc->steps()[i].step, static_cast<std::int64_t>(i));
  EXPECT_EQ(doc->selected_step(), 1);
  ASSERT_NE(doc->step_data(), nullptr);
  EXPECT_EQ(doc->step_data()->ops.size(), 3u);
  ASSERT_NE(doc->report(), nullptr) << doc->analysis_error();  // analysed again, over the five steps
  EXPECT_EQ(doc->report()->steps, 5);
  EXPECT_TRUE(doc->report()->complete);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) close(fd);
  std::filesystem::remove(path);
}

TEST(view_model_test, document_of_a_trace_without_steps_or_ops_is_analysed_without_dividing_by_zero) {
  // A live run that has only just started: the file exists, nothing is written yet.
  const auto path = testing::fixture_dir() / "doc_empty.h5";
  {
    trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "empty", .seed = 1, .config = "{}"});
    w.close();
  }
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  EXPECT_TRUE(doc->steps().empty());
  doc->wait_idle();
  ASSERT_NE(doc->report(), nullptr) << doc->analysis_error();
  EXPECT_EQ(doc->report()->steps, 0);
  EXPECT_TRUE(doc->report()->healthy());
  std::filesystem::remove(path);
}

TEST(view_model_test, document_selecting_the_last_representable_step_reads_no_rows) {
  const auto path = testing::write_fixture(testing::fixture_dir() / "doc_last.h5", false);
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->select_step(std::numeric_limits<std::int64_t>::max());  // --step 9223372036854775807
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();
  EXPECT_TRUE(doc->step_data()->ops.empty());
  std::filesystem::remove(path);
}

TEST(view_model_test, document_of_a_bad_file_says_why_instead_of_throwing) {
  const auto dir = testing::fixture_dir();
  const auto bad = testing::write_not_hdf5(dir / "not_a_trace.h5");
  auto doc = TraceDocument::open(bad);
  EXPECT_FALSE(doc->ok());
  EXPECT_NE(doc->error().find("not_a_trace.h5"), std::string::npos) << doc->error();
  auto missing = TraceDocument::open(dir / "missing.h5");
  EXPECT_FALSE(missing->ok());
  EXPECT_NE(missing->error().find("missing.h5"), std::string::npos) << missing->error();
  std::filesystem::remove(bad);
}

// Polls a document until `done` or 20 s have passed.
template <class Done>
bool poll_until(TraceDocument& doc, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < until) {
    doc.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

TEST(view_model_test, a_step_is_read_while_a_comparison_of_the_same_file_is_half_way) {
  const auto dir = testing::fixture_dir();
  const auto a = testing::write_fixture(dir / "cmp_a.h5", true);
  const auto b = testing::write_fixture(dir / "cmp_b.h5", false);
  // The comparison stops in its first progress call until released (20 s at most, so a failure cannot hang).
  std::promise<void> entered_promise, release_promise;
  std::shared_future<void> release = release_promise.get_future().share();
  auto entered = entered_promise.get_future();
  bool first = true;
  Comparison::Options options;
  options.diff.rows_per_read = 3;  // one step of 3 ops per block: four progress calls
  options.on_progress = [&, release](std::int64_t, std::int64_t) {
    if (!first) return;
    first = false;
    entered_promise.set_value();
    release.wait_for(std::chrono::seconds(20));
  };
  Comparison comparison(a, b, options);
  ASSERT_EQ(entered.wait_for(std::chrono::seconds(20)), std::future_status::ready);

  TraceDocument::Options doc_options;
  doc_options.analyse = false;
  auto doc = TraceDocument::open(a, doc_options);  // the same file as the comparison's a
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->select_step(1);
  const bool read = poll_until(*doc, [&] { return doc->step_data() != nullptr || !doc->step_error().empty(); });
  const bool comparison_still_held = comparison.running() && !comparison.report();
  release_promise.set_value();
  ASSERT_TRUE(read) << "the step's rows waited for the comparison";
  EXPECT_TRUE(comparison_still_held);
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();
  ASSERT_EQ(doc->step_data()->ops.size(), 3u);
  EXPECT_EQ(doc->step_data()->ops[1].health.nan, 5);

  // Released, the comparison finishes with every step and op of the two runs (4 steps of 3 ops each).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!comparison.poll() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_NE(comparison.report(), nullptr) << comparison.error();
  EXPECT_EQ(comparison.report()->steps_compared, 4);
  EXPECT_EQ(comparison.report()->ops_aligned, 12);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// Where the first chunk of /ops lies in the file (offset, bytes), from HDF5.
std::pair<haddr_t, hsize_t> first_ops_chunk(const std::filesystem::path& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ops = H5Dopen2(file, "/ops", H5P_DEFAULT);
  const hsize_t origin[1] = {0};
  unsigned mask = 0;
  haddr_t address = 0;
  hsize_t size = 0;
  const herr_t status = H5Dget_chunk_info_by_coord(ops, origin, &mask, &address, &size);
  H5Dclose(ops);
  H5Fclose(file);
  return status < 0 ? std::pair<haddr_t, hsize_t>{0, 0} : std::pair{address, size};
}

// Inverts a byte range of a file in place (twice restores it).
void invert_bytes(const std::filesystem::path& path, std::uint64_t offset, std::uint64_t size) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> bytes(size);
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  for (char& c : bytes) c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(view_model_test, a_step_whose_read_failed_is_read_again_when_selected_again) {
  const auto path = testing::write_fixture(testing::fixture_dir() / "retry.h5", true);
  const auto [offset, size] = first_ops_chunk(path);
  ASSERT_GT(size, 16u);
  TraceDocument::Options options;
  options.analyse = false;
  auto doc = TraceDocument::open(path, options);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->select_step(0);
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();

  invert_bytes(path, offset, size);  // the chunk holding every op row is damaged: step 1 cannot be read
  doc->select_step(1);
  doc->wait_idle();
  EXPECT_EQ(doc->step_data(), nullptr);
  ASSERT_FALSE(doc->step_error().empty());
  EXPECT_NE(doc->step_error().find("step 1"), std::string::npos) << doc->step_error();

  invert_bytes(path, offset, size);  // repaired; selecting step 1 again reads it
  doc->select_step(1);
  EXPECT_TRUE(doc->step_error().empty()) << doc->step_error();
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();
  EXPECT_EQ(doc->step_data()->step, 1);
  ASSERT_EQ(doc->step_data()->ops.size(), 3u);
  EXPECT_EQ(doc->step_data()->ops[1].health.nan, 5);
  // A step read well is not read again when selected again.
  const std::uint64_t load = doc->step_data()->load_id;
  doc->select_step(1);
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr);
  EXPECT_EQ(doc->step_data()->load_id, load);
  std::filesystem::remove(path);
}

TEST(view_model_test, file_browser_lists_folders_first_then_h5_files) {
  const auto dir = testing::fixture_dir() / "browse";
  std::filesystem::create_directories(dir / "sub");
  testing::write_not_hdf5(dir / "b.h5");
  testing::write_not_hdf5(dir / "a.h5");
  testing::write_not_hdf5(dir / "notes.txt");
  std::string error;
  const auto entries = list_directory(dir, &error);
  EXPECT_TRUE(error.empty()) << error;
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].name, "..");
  EXPECT_EQ(entries[1].name, "sub");
  EXPECT_TRUE(entries[1].directory);
  EXPECT_EQ(entries[2].name, "a.h5");
  EXPECT_EQ(entries[3].name, "b.h5");
  EXPECT_TRUE(list_directory(dir / "nowhere", &error).empty());
  EXPECT_NE(error.find("nowhere"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

// The Compare panel divides a step's backward rows by each run's loss scale of that step: a step's own
// scale, or for a step without a row (unfinished) the scale the step before left, or 1.
TEST(view_model_test, the_loss_scale_of_a_step_is_its_rows_scale_or_the_one_left_before_it) {
  std::vector<trace::StepRow> steps(2);
  steps[0].step = 0;
  steps[0].scale = 65536;
  steps[0].scale_after = 32768;
  steps[1].step = 1;
  steps[1].scale = 32768;
  steps[1].scale_after = 32768;
  EXPECT_EQ(loss_scale_at(steps, 0), 65536.0);
  EXPECT_EQ(loss_scale_at(steps, 1), 32768.0);
  steps[1].scale_after = 65536;  // grew after step 1: step 2, unfinished, used 65536
  EXPECT_EQ(loss_scale_at(steps, 2), 65536.0);
  EXPECT_EQ(loss_scale_at({}, 0), 1.0);
  // A pair of backward rows that differ only by the runs' scales compares equal once divided.
  trace::OpRow a;
  a.phase = trace::Phase::backward;
  a.op = "linear";
  a.health = {.numel = 4, .absmax = 65536 * 0.5, .mean = 65536 * 0.25, .rms = 65536 * 0.3};
  trace::OpRow b = a;
  b.health = {.numel = 4, .absmax = 0.5, .mean = 0.25, .rms = 0.3};
  const auto d = analysis::diff_ops(std::vector<trace::OpRow>{a}, std::vector<trace::OpRow>{b}, {},
                                    loss_scale_at(steps, 0), 1.0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].max_rel, 0.0);
}

}  // namespace
}  // namespace ampscope::viewer
