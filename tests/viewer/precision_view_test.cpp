// tests/viewer/precision_view_test.cpp: the Precision panel's view model (viewer/view_model.h): the heatmap built
// from a trace written here with known f32-twin rows (rows ranked by the jumps worked out below, occurrences,
// cells, the lookup Op detail uses), the colour scale's values at hand-computed points, local bits, Op detail's
// precision numbers and the error histogram's bars.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "probes/trace/writer.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/document.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

using testing::kUnit;
using testing::twin_row;
using testing::write_twin_fixture;

TEST(precision_view_test, the_heatmap_ranks_ops_as_the_report_and_places_each_row_in_its_step) {
  const auto path = write_twin_fixture(testing::fixture_dir() / "twin_map.h5");
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->wait_idle();
  ASSERT_EQ(doc->precision_error(), "");
  const PrecisionMap* m = doc->precision();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->steps, (std::vector<std::int64_t>{0, 2}));
  ASSERT_EQ(m->rows.size(), 4u);
  EXPECT_EQ(m->rows[0].label, "(no module) rsub #0");
  EXPECT_EQ(m->rows[1].label, "(no module) sigmoid #0");
  EXPECT_EQ(m->rows[2].label, "fc1 linear #0");
  EXPECT_EQ(m->rows[3].label, "fc1 linear #1");
  EXPECT_EQ(m->rows[3].occurrence, 1);
  EXPECT_EQ(m->rows[3].out_dtype, "f32");
  // Cells: rsub at step 2 is seq 2 with its max error 1 (0 bits); the second linear ran at step 0 only.
  ASSERT_NE(m->at(0, 1), nullptr);
  EXPECT_EQ(m->at(0, 1)->step, 2);
  EXPECT_EQ(m->at(0, 1)->seq, 2);
  EXPECT_EQ(m->at(0, 1)->bits, 0);
  ASSERT_NE(m->at(3, 0), nullptr);
  EXPECT_EQ(m->at(3, 0)->seq, 3);
  EXPECT_EQ(m->at(3, 1), nullptr);
  EXPECT_EQ(m->at(4, 0), nullptr);  // past the rows
  EXPECT_EQ(m->at(0, 2), nullptr);  // past the steps
  // Op detail's lookup, by (step, seq).
  ASSERT_NE(precision_at(*m, 0, 1), nullptr);
  EXPECT_EQ(precision_at(*m, 0, 1)->op, "sigmoid");
  EXPECT_EQ(precision_at(*m, 0, 1)->flips, 2);
  EXPECT_EQ(precision_at(*m, 2, 3), nullptr);  // not twinned there
  EXPECT_EQ(precision_at(*m, 1, 0), nullptr);  // a step the twin skipped
}

// Backward rows (format_version 6): after the forward rows, in the report's backward order (the largest local
// mean error first), apart from the forward rows of the same op and module, and found by Op detail's lookup.
TEST(precision_view_test, backward_rows_follow_the_forward_rows_ranked_by_local_error) {
  const auto path = testing::fixture_dir() / "twin_backward.h5";
  {
    trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "twin backward", .seed = 1, .config = "{}"});
    w.write(twin_row(0, 0, "fc1", "linear", std::ldexp(1.0, -12), 0, std::ldexp(1.0, -10)));
    auto node = [](std::int64_t seq, const std::string& module, const std::string& op, double mean) {
      trace::PrecisionRow r = twin_row(0, seq, module, op, 0, 0, 0);
      r.phase = trace::Phase::backward;
      r.local_mean_rel = mean;
      r.local_max_rel = 2 * mean;
      r.bits = -std::log2(2 * mean);
      return r;
    };
    w.write(node(5, "head", "div", 0.004));
    w.write(node(6, "fc1", "linear", std::ldexp(1.0, -13)));
    trace::StepRow s;
    s.step = 0;
    s.loss = 1;
    w.write(s);
    w.end_step(0);
    w.close();
  }
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->wait_idle();
  const PrecisionMap* m = doc->precision();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->rows.size(), 3u);
  EXPECT_EQ(m->backward_begin, 1u);
  EXPECT_EQ(m->rows[0].label, "fc1 linear #0");
  EXPECT_EQ(m->rows[0].phase, trace::Phase::forward);
  EXPECT_EQ(m->rows[1].label, "backward of head div #0");  // local mean 0.004 > 2^-13
  EXPECT_EQ(m->rows[2].label, "backward of fc1 linear #0");
  EXPECT_EQ(m->rows[2].phase, trace::Phase::backward);
  ASSERT_NE(m->at(1, 0), nullptr);
  EXPECT_EQ(m->at(1, 0)->seq, 5);
  ASSERT_NE(precision_at(*m, 0, 6), nullptr);
  EXPECT_EQ(precision_at(*m, 0, 6)->phase, trace::Phase::backward);
  // Local bits of the div node: -log2(0.008) = 6.97; its detail says it is a backward node.
  EXPECT_NEAR(local_bits(*m->at(1, 0)), -std::log2(0.008), 1e-12);
  const std::vector<KeyValue> detail = precision_detail_rows(*m->at(1, 0));
  ASSERT_FALSE(detail.empty());
  EXPECT_EQ(detail[0].key, "backward");
}

TEST(precision_view_test, a_trace_without_twin_rows_has_no_map) {
  const auto path = testing::write_fixture(testing::fixture_dir() / "twin_none.h5", false);
  auto doc = TraceDocument::open(path);
  doc->wait_idle();
  EXPECT_EQ(doc->precision(), nullptr);
  EXPECT_FALSE(doc->precision_loading());
  EXPECT_EQ(doc->precision_error(), "");
}

TEST(precision_view_test, colours_are_linear_between_the_stops_of_the_bit_scale) {
  EXPECT_EQ(bits_colour(0), rgba(200, 30, 30));
  EXPECT_EQ(bits_colour(-1), rgba(200, 30, 30));  // clamped
  EXPECT_EQ(bits_colour(3), rgba(240, 120, 30));
  // Halfway from 3 (240, 120, 30) to 6 (230, 210, 60).
  EXPECT_EQ(bits_colour(4.5), rgba(235, 165, 45));
  // A third of the way from 9 (80, 180, 90) to 12 (40, 110, 200): 66.7, 156.7, 126.7, rounded.
  EXPECT_EQ(bits_colour(10), rgba(67, 157, 127));
  EXPECT_EQ(bits_colour(12), rgba(40, 110, 200));
  EXPECT_EQ(bits_colour(24), rgba(40, 110, 200));  // f32's bits: the top of the scale
  EXPECT_EQ(bits_colour(std::numeric_limits<double>::quiet_NaN()), kNoBits);
  const std::vector<LegendTick> legend = bits_legend();
  ASSERT_EQ(legend.size(), 5u);
  EXPECT_EQ(legend[0].label, "0");
  EXPECT_EQ(legend[4].label, "12+");
  EXPECT_EQ(legend[2].colour, rgba(230, 210, 60));
}

TEST(precision_view_test, local_bits_of_an_f16_op_and_of_an_f32_op) {
  trace::PrecisionRow r = twin_row(0, 0, "m", "mul", 0, 0, 0.125);
  EXPECT_DOUBLE_EQ(local_bits(r), 11.0);  // 2^-12 is more than f16's 11 bits: clamped to p
  r.local_max_rel = 0.1;
  EXPECT_DOUBLE_EQ(local_bits(r), -std::log2(0.1));
  r.local_max_rel = 0;
  EXPECT_DOUBLE_EQ(local_bits(r), 11);
  r.out_dtype = "bf16";
  EXPECT_DOUBLE_EQ(local_bits(r), 8);
  r.local = false;
  EXPECT_TRUE(std::isnan(local_bits(r)));
  EXPECT_DOUBLE_EQ(accumulated_bits(r), 3);  // the row's bits: -log2(0.125)
  r.bits = -0.0;                              // as a hand-made row may hold it: shown as 0, not -0
  EXPECT_EQ(format_number(accumulated_bits(r)), "0");
}

TEST(precision_view_test, op_detail_shows_the_twins_numbers_and_the_error_histogram) {
  trace::PrecisionRow r = twin_row(0, 2, "", "rsub", 0.25, kUnit, 0.25);
  r.cond = 8192;
  r.flips = 3;
  r.error_bins = {};
  r.error_bins[0] = 4;
  r.error_bins[11] = 80;
  r.error_bins[trace::kErrorBins - 1] = 1;
  r.exact = 12;
  const std::vector<KeyValue> rows = precision_detail_rows(r);
  auto value = [&](const std::string& key) {
    for (const KeyValue& kv : rows) {
      if (kv.key == key) return kv.value;
    }
    return std::string("(missing)");
  };
  EXPECT_EQ(value("bits"), "2 accumulated, 11 local (of 11)");  // -log2 0.25; local 2^-12 clamped to 11
  EXPECT_EQ(value("jump"), "512");                               // 0.25 / 2^-11
  EXPECT_EQ(value("flips"), "3");
  EXPECT_EQ(value("condition"), "8192");
  EXPECT_EQ(value("accumulated"), "max rel 0.25, mean rel 0.25, max 3 ulp");
  EXPECT_EQ(value("followed"), "(missing)");  // only said when an input was not followed
  EXPECT_EQ(value("reference"), "f32: the op ran in f16, computed again in f32");
  // An f32 op with local errors is an f64 twin's row (--twin-f64); one without, the f32 twin following it.
  trace::PrecisionRow f32_local = r, f32_followed = r;
  f32_local.out_dtype = f32_followed.out_dtype = "f32";
  f32_followed.local = false;
  const auto reference_of = [](const trace::PrecisionRow& row) {
    for (const KeyValue& kv : precision_detail_rows(row)) {
      if (kv.key == "reference") return kv.value;
    }
    return std::string("(missing)");
  };
  EXPECT_EQ(reference_of(f32_local), "f64: the op ran in f32, computed again in f64 (--twin-f64)");
  EXPECT_EQ(reference_of(f32_followed), "f32: the op ran in f32 (on the twin's inputs)");

  const std::vector<Bar> bars = error_histogram_bars(r);
  ASSERT_EQ(bars.size(), static_cast<std::size_t>(trace::kErrorBins + 2));
  EXPECT_EQ(bars.front().label, "flip");
  EXPECT_EQ(bars.front().count, 3);
  EXPECT_EQ(bars[1].label, "0");
  EXPECT_EQ(bars[1].count, 4);
  EXPECT_EQ(bars[1].colour, bits_colour(0));
  EXPECT_EQ(bars[12].label, "11");
  EXPECT_EQ(bars[12].count, 80);
  EXPECT_EQ(bars[trace::kErrorBins].label, "25+");
  EXPECT_EQ(bars[trace::kErrorBins].count, 1);
  EXPECT_EQ(bars.back().label, "exact");
  EXPECT_EQ(bars.back().count, 12);
  EXPECT_EQ(bars.back().colour, bits_colour(kBitsScaleTop));

  // The hover text of a cell.
  const PrecisionMapRow map_row{.module = "", .op = "rsub", .occurrence = 0, .out_dtype = "f16", .label = "(no module) rsub #0"};
  EXPECT_EQ(precision_cell_text(map_row, r),
            "(no module) rsub #0\nstep 0, seq 2, f16 (100 values)\nbits of agreement: accumulated 2, local 11\n"
            "max relative error: accumulated 0.25, local 0.00024414\nflips 3");
}

}  // namespace
}  // namespace ampscope::viewer
