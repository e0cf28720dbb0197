// tests/viewer/fp8_view_test.cpp: the FP8 panel (viewer/view_model.h Fp8Map, viewer/app.h): the heatmap's cells hold
// the underflow and saturation fractions this test computes from the trace's /fp8 rows as the reader returns them
// (summed per operand and step, divided here), on a trace written here (rows out of order, an operand cast twice in
// a step, a missing cell) and on the format 7 fixture of a real `train --precision fp8` run; the colour scale at
// hand-computed points; the scale and amax series; a cell picked selects its step and module; and a trace without
// /fp8 rows places no FP8 panel (a frame drawn in an ImGui context without a window).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <imgui.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/app.h"
#include "viewer/document.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

namespace fs = std::filesystem;

trace::Fp8Row fp8_row(std::int64_t step, const std::string& module, const std::string& operand, std::int64_t nonzero,
                      std::int64_t underflow, std::int64_t saturated, double scale, double amax) {
  return trace::Fp8Row{.step = step, .module = module, .operand = operand,
                       .format = operand == "grad_output" ? "e5m2" : "e4m3", .numel = nonzero + 3, .nonzero = nonzero,
                       .underflow = underflow, .subnormal = 0, .saturated = saturated, .amax = amax, .scale = scale};
}

// blocks.1.fc runs first in the forward pass (its rows come first), then blocks.0.fc; step 2 casts blocks.0.fc's input
// twice; blocks.1.fc's grad_output has no row at step 1.
fs::path write_fp8_fixture(const fs::path& path) {
  trace::TraceWriter w(path, {.precision = "fp8", .device = "cpu", .model = "fp8 view", .seed = 1, .config = "{}"});
  for (std::int64_t step = 0; step < 3; ++step) {
    const double k = static_cast<double>(step + 1);
    w.write(fp8_row(step, "blocks.1.fc", "weight", 1000, 10 * step, step, 64 * k, 3.5 * k));
    w.write(fp8_row(step, "blocks.1.fc", "input", 400, 0, 7 - step, 128 / k, 2 * k));
    w.write(fp8_row(step, "blocks.0.fc", "input", 250, 3 + step, 0, 32, 14));
    if (step == 2) w.write(fp8_row(step, "blocks.0.fc", "input", 750, 100, 5, 16, 28));
    w.write(fp8_row(step, "blocks.0.fc", "grad_output", 800, 200 - 50 * step, 0, 1e6, 0.05 * k));
    if (step != 1) w.write(fp8_row(step, "blocks.1.fc", "grad_output", 300, 299, 0, 2e6, 0.01));
    trace::StepRow s;
    s.step = step;
    s.loss = 1;
    w.write(s);
    w.end_step(step);
  }
  w.close();
  return path;
}

// The fractions of every (module, operand, step), from the reader's rows: counts summed, then divided.
struct Sums {
  std::int64_t nonzero = 0, underflow = 0, saturated = 0;
};
std::map<std::tuple<std::string, std::string, std::int64_t>, Sums> sums_of(const fs::path& path) {
  trace::TraceReader r(path);
  std::map<std::tuple<std::string, std::string, std::int64_t>, Sums> out;
  for (const trace::Fp8Row& row : r.fp8()) {
    Sums& s = out[{row.module, row.operand, row.step}];
    s.nonzero += row.nonzero;
    s.underflow += row.underflow;
    s.saturated += row.saturated;
  }
  return out;
}

void expect_cells_match(const Fp8Map& m, const fs::path& path) {
  const auto sums = sums_of(path);
  std::size_t cells = 0;
  for (std::size_t r = 0; r < m.rows.size(); ++r) {
    for (std::size_t c = 0; c < m.steps.size(); ++c) {
      SCOPED_TRACE(m.rows[r].label + " step " + std::to_string(m.steps[c]));
      const auto it = sums.find({m.rows[r].module, m.rows[r].operand, m.steps[c]});
      if (it == sums.end()) {
        EXPECT_EQ(m.at(r, c), nullptr);
        EXPECT_TRUE(std::isnan(m.fraction(r, c, Fp8Measure::underflow)));
        continue;
      }
      ++cells;
      const Sums& s = it->second;
      EXPECT_EQ(m.fraction(r, c, Fp8Measure::underflow), static_cast<double>(s.underflow) / static_cast<double>(s.nonzero));
      EXPECT_EQ(m.fraction(r, c, Fp8Measure::saturation), static_cast<double>(s.saturated) / static_cast<double>(s.nonzero));
    }
  }
  EXPECT_EQ(cells, sums.size());  // every (operand, step) of the trace is a cell
}

TEST(fp8_view_test, the_heatmap_cells_are_the_fractions_of_the_trace_rows) {
  const fs::path path = write_fp8_fixture(testing::fixture_dir() / "fp8_map.h5");
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->wait_idle();
  ASSERT_EQ(doc->fp8_error(), "");
  const Fp8Map* m = doc->fp8();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->steps, (std::vector<std::int64_t>{0, 1, 2}));
  // Modules in the order they first appear, operands input, weight, grad_output.
  ASSERT_EQ(m->rows.size(), 5u);
  EXPECT_EQ(m->rows[0].label, "blocks.1.fc input [e4m3]");
  EXPECT_EQ(m->rows[1].label, "blocks.1.fc weight [e4m3]");
  EXPECT_EQ(m->rows[2].label, "blocks.1.fc grad_output [e5m2]");
  EXPECT_EQ(m->rows[3].label, "blocks.0.fc input [e4m3]");
  EXPECT_EQ(m->rows[4].label, "blocks.0.fc grad_output [e5m2]");
  expect_cells_match(*m, path);
  // By hand: blocks.0.fc's input at step 2 is two casts, (5 + 100) of (250 + 750) underflowed, 5 of 1000 saturated.
  EXPECT_EQ(m->fraction(3, 2, Fp8Measure::underflow), 0.105);
  EXPECT_EQ(m->fraction(3, 2, Fp8Measure::saturation), 0.005);
  EXPECT_EQ(m->at(3, 2)->amax, 28);   // the larger amax
  EXPECT_EQ(m->at(3, 2)->scale, 16);  // the last cast's scale
  EXPECT_EQ(m->at(2, 1), nullptr);    // no grad_output row of blocks.1.fc at step 1
  EXPECT_EQ(fp8_row(*m, "blocks.0.fc", "grad_output"), std::optional<std::size_t>(4));
  EXPECT_EQ(fp8_column(*m, 2), std::optional<std::size_t>(2));
  EXPECT_EQ(fp8_column(*m, 3), std::nullopt);
  // The plot's series: each step's scale and amax of the operand.
  const Fp8OperandSeries w = fp8_operand_series(*m, 1);
  EXPECT_EQ(w.step, (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(w.scale, (std::vector<double>{64, 128, 192}));
  EXPECT_EQ(w.amax, (std::vector<double>{3.5, 7, 10.5}));
  ASSERT_EQ(w.history_amax.size(), 3u);
  EXPECT_TRUE(std::isnan(w.history_amax[0]));  // the rows have no history columns
  EXPECT_EQ(fp8_operand_series(*m, 2).step, (std::vector<double>{0, 2}));
}

// A real run's trace: `train --sample mlp --steps 3 --seed 1 --precision fp8` (tests/fixtures/v7-mlp-fp8.h5).
TEST(fp8_view_test, a_real_fp8_runs_heatmap_holds_its_rows_fractions) {
  const fs::path path = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v7-mlp-fp8.h5";
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->wait_idle();
  const Fp8Map* m = doc->fp8();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rows.size(), 9u);
  EXPECT_EQ(m->rows[0].label, "fc1 input [e4m3]");
  EXPECT_EQ(m->rows[8].label, "fc3 grad_output [e5m2]");
  expect_cells_match(*m, path);
}

TEST(fp8_view_test, the_fraction_colours_are_the_stops_and_between_them_linear_in_log10) {
  EXPECT_EQ(fraction_colour(0), kFp8Nothing);
  EXPECT_EQ(fraction_colour(std::numeric_limits<double>::quiet_NaN()), kFp8NoRow);
  EXPECT_EQ(fraction_colour(1e-5), kFractionStops[0]);
  EXPECT_EQ(fraction_colour(1e-9), kFractionStops[0]);  // below the scale: its bottom
  EXPECT_EQ(fraction_colour(0.01), kFractionStops[3]);
  EXPECT_EQ(fraction_colour(1), kFractionStops[5]);
  // 10^-2.5: halfway from the 1e-3 stop (80, 180, 90) to the 1e-2 stop (230, 210, 60).
  EXPECT_EQ(fraction_colour(std::pow(10.0, -2.5)), rgba(155, 195, 75));
  const std::vector<FractionTick> legend = fraction_legend();
  ASSERT_EQ(legend.size(), 7u);
  EXPECT_EQ(legend[0].label, "0");
  EXPECT_EQ(legend[1].label, "1e-5");
  EXPECT_EQ(legend[6].label, "1");
  EXPECT_EQ(legend[6].colour, kFractionStops[5]);
}

// An ImGui context without a window or renderer: frames are drawn into draw lists only.
class Fp8PanelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1000, 700);
    io.DeltaTime = 1.0f / 60;
    io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset;
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
  }
  void TearDown() override { ImGui::DestroyContext(ctx_); }
  void frame(ViewerState& s) {
    ImGui::NewFrame();
    draw_frame(s);
    ImGui::Render();
  }
  ImGuiContext* ctx_ = nullptr;
};

TEST_F(Fp8PanelTest, only_a_trace_with_fp8_rows_places_the_fp8_panel) {
  ViewerState s;
  s.a = TraceDocument::open(write_fp8_fixture(testing::fixture_dir() / "fp8_panel.h5"));
  s.a->wait_idle();
  s.panel = "fp8";
  frame(s);
  EXPECT_TRUE(s.layout.fp8.visible);
  s.panel = "all";
  s.show_fp8 = true;
  frame(s);
  EXPECT_TRUE(s.layout.fp8.visible);
  EXPECT_FALSE(s.layout.scale.visible);  // FP8 takes Scale and loss's place

  ViewerState plain;
  plain.a = TraceDocument::open(testing::write_fixture(testing::fixture_dir() / "fp8_panel_plain.h5", false));
  plain.a->wait_idle();
  plain.show_fp8 = true;  // asked for, but the trace has no /fp8 rows
  frame(plain);
  EXPECT_FALSE(plain.layout.fp8.visible);
  EXPECT_TRUE(plain.layout.scale.visible);
  plain.panel = "fp8";
  frame(plain);
  EXPECT_FALSE(plain.layout.fp8.visible);
  EXPECT_EQ(plain.a->fp8(), nullptr);  // nothing read for it either
}

TEST_F(Fp8PanelTest, a_picked_cell_selects_its_step_and_its_module_in_the_ops_table) {
  ViewerState s;
  s.a = TraceDocument::open(write_fp8_fixture(testing::fixture_dir() / "fp8_pick.h5"));
  s.a->wait_idle();
  s.panel = "fp8";
  frame(s);
  select_fp8_cell(s, 3, 2);  // blocks.0.fc input at step 2
  EXPECT_EQ(s.a->selected_step(), std::optional<std::int64_t>(2));
  EXPECT_EQ(s.fp8_row, std::optional<std::size_t>(3));
  EXPECT_EQ(s.filter.text, "blocks.0.fc");
  EXPECT_STREQ(s.filter_text, "blocks.0.fc");
  frame(s);  // the plot now shows that operand
  EXPECT_EQ(s.fp8_plot_for, std::optional<std::size_t>(3));
}

}  // namespace
}  // namespace ampscope::viewer
