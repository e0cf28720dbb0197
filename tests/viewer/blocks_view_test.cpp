// tests/viewer/blocks_view_test.cpp: the Blocks panel (viewer/view_model.h BlockMap, viewer/app.h): on a trace
// written here (modules not in name order, a copy quantized twice in a step, a what-if copy, a missing cell) the
// heatmap's rows are the copies in the documented order and its cells the underflow and saturation fractions this
// test computes by hand; the hover text and the detail rows say what-if in the conditional and where the blocks lie;
// a picked cell selects its step and module; and only a trace with /blocks rows places the panel.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <imgui.h>

#include "probes/trace/writer.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/app.h"
#include "viewer/document.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

namespace fs = std::filesystem;

trace::BlockRow block_row(std::int64_t step, const char* module, const char* operand, const char* copy, const char* format,
                          bool what_if, std::int64_t nonzero, std::int64_t underflow, std::int64_t saturated) {
  trace::BlockRow r;
  r.step = step, r.module = module, r.operand = operand, r.copy = copy, r.format = format, r.what_if = what_if;
  r.rows = 32, r.cols = 64, r.numel = 2048, r.blocks = 64;
  r.nonzero = nonzero, r.underflow = underflow, r.saturated = saturated;
  r.max_block_range = 4.0 + static_cast<double>(step);
  r.max_range_block = 3, r.max_range_row = 1, r.max_range_col = 32;
  if (underflow > 0) r.worst_block = 10, r.worst_block_underflow = 1, r.worst_block_row = 5, r.worst_block_col = 0;
  r.scale_log2_min = -10, r.scale_log2_median = -4, r.scale_log2_max = 1;
  r.rel_rms_error = 0.05;
  return r;
}

// fc2 runs first (its rows come first in each step: the map keeps the model's order, not the names'). Step 1
// quantizes fc2's input rowwise twice; fc1's what-if nvfp4 weight has no row at step 0.
fs::path write_blocks_fixture(const fs::path& path) {
  trace::TraceWriter w(path, {.precision = "mxfp8", .device = "cpu", .model = "blocks view", .seed = 1, .config = "{}"});
  for (std::int64_t step = 0; step < 2; ++step) {
    w.write(block_row(step, "fc2", "input", "rowwise", "mxfp8", false, 1000, 10 * (step + 1), 0));
    if (step == 1) w.write(block_row(step, "fc2", "input", "rowwise", "mxfp8", false, 1000, 50, 4));
    w.write(block_row(step, "fc2", "grad_output", "columnwise", "mxfp8", false, 500, 0, 5));
    w.write(block_row(step, "fc1", "input", "rowwise", "mxfp8", false, 2000, 0, 0));
    if (step == 1) w.write(block_row(step, "fc1", "weight", "rowwise", "nvfp4", true, 400, 100, 2));
    trace::StepRow s;
    s.step = step;
    s.loss = 1;
    w.write(s);
    w.end_step(step);
  }
  w.close();
  return path;
}

TEST(blocks_view_test, the_heatmap_rows_are_the_copies_and_the_cells_their_fractions) {
  const fs::path path = write_blocks_fixture(testing::fixture_dir() / "blocks_map.h5");
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  doc->wait_idle();
  ASSERT_EQ(doc->blocks_error(), "");
  const BlockMap* m = doc->blocks();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->steps, (std::vector<std::int64_t>{0, 1}));
  ASSERT_EQ(m->rows.size(), 4u);
  EXPECT_EQ(m->rows[0].label, "fc2 input rowwise [mxfp8]");
  EXPECT_EQ(m->rows[1].label, "fc2 grad_output columnwise [mxfp8]");
  EXPECT_EQ(m->rows[2].label, "fc1 input rowwise [mxfp8]");
  EXPECT_EQ(m->rows[3].label, "fc1 weight rowwise [nvfp4 what-if]");
  EXPECT_TRUE(m->rows[3].what_if);
  // By hand: fc2's input at step 0: 10 of 1000; at step 1 two rows, (20 + 50) of 2000 underflowed, 4 of 2000 saturated.
  EXPECT_EQ(m->fraction(0, 0, Fp8Measure::underflow), 0.01);
  EXPECT_EQ(m->fraction(0, 1, Fp8Measure::underflow), 70.0 / 2000.0);
  EXPECT_EQ(m->fraction(0, 1, Fp8Measure::saturation), 4.0 / 2000.0);
  EXPECT_EQ(m->fraction(1, 0, Fp8Measure::saturation), 0.01);  // 5 of 500
  EXPECT_EQ(m->fraction(2, 1, Fp8Measure::underflow), 0.0);
  EXPECT_EQ(m->fraction(3, 1, Fp8Measure::underflow), 0.25);    // 100 of 400
  EXPECT_EQ(m->at(3, 0), nullptr);                              // no what-if row at step 0
  EXPECT_TRUE(std::isnan(m->fraction(3, 0, Fp8Measure::underflow)));
  EXPECT_EQ(m->at(0, 1)->worst_block_underflow, 1);
  EXPECT_EQ(m->at(0, 1)->numel, 4096);  // the two rows' values together
  // The texts: conditional for what-if, the blocks placed.
  const std::string hover = block_cell_text(m->rows[3], *m->at(3, 1));
  EXPECT_NE(hover.find("fc1 weight rowwise [nvfp4 what-if]\nstep 1, 32 x 64 values, 64 blocks\nwould underflow 100 of 400 (25%)\n"
                       "would saturate 2 of 400 (0.5%)\nwidest block 5 binades: block 3 at row 1, col 32\nscales 2^-10 .. 2^1, "
                       "median 2^-4"),
            std::string::npos)
      << hover;
  const std::vector<KeyValue> detail = block_detail_rows(*m->at(0, 0));
  ASSERT_GE(detail.size(), 7u);
  EXPECT_EQ(detail[2].key, "underflow");
  EXPECT_EQ(detail[2].value, "10 of 1,000 (1%)");
  EXPECT_TRUE(detail[2].alert);
  EXPECT_EQ(detail[6].key, "most lost");
  EXPECT_EQ(detail[6].value, "1 lost, block 10 at row 5, col 0");
  EXPECT_EQ(block_detail_rows(*m->at(3, 1))[2].key, "would underflow");
}

class BlocksPanelTest : public ::testing::Test {
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

TEST_F(BlocksPanelTest, only_a_trace_with_block_rows_places_the_panel_and_a_picked_cell_selects_step_and_module) {
  ViewerState s;
  s.a = TraceDocument::open(write_blocks_fixture(testing::fixture_dir() / "blocks_panel.h5"));
  s.a->wait_idle();
  s.panel = "blocks";
  frame(s);
  EXPECT_TRUE(s.layout.blocks.visible);
  s.panel = "all";
  s.show_blocks = true;
  frame(s);
  EXPECT_TRUE(s.layout.blocks.visible);
  EXPECT_FALSE(s.layout.scale.visible);  // Blocks takes Scale and loss's place
  select_block_cell(s, 2, 1);            // fc1 input at step 1
  EXPECT_EQ(s.a->selected_step(), std::optional<std::int64_t>(1));
  EXPECT_EQ(s.blocks_row, std::optional<std::size_t>(2));
  EXPECT_STREQ(s.filter_text, "fc1");
  frame(s);

  ViewerState plain;
  plain.a = TraceDocument::open(testing::write_fixture(testing::fixture_dir() / "blocks_panel_plain.h5", false));
  plain.a->wait_idle();
  plain.show_blocks = true;  // asked for, but the trace has no /blocks rows
  frame(plain);
  EXPECT_FALSE(plain.layout.blocks.visible);
  EXPECT_TRUE(plain.layout.scale.visible);
  plain.panel = "blocks";
  frame(plain);
  EXPECT_FALSE(plain.layout.blocks.visible);
  EXPECT_EQ(plain.a->blocks(), nullptr);
}

}  // namespace
}  // namespace ampscope::viewer
