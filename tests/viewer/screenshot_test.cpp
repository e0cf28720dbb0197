// ampscope-view run headless (--screenshot) on small traces written here, and the picture checked: the
// skipped-step colour appears where the skipped step is on the scale panel and nowhere for a healthy run,
// the non-finite cell colour appears in the ops table of the NaN step and nowhere for a healthy one, a file
// that is not HDF5 gives the error box (and exit status 0, no crash), and without a display the program
// says so and exits 2. Needs an X display: ctest runs these under xvfb-run (tests/CMakeLists.txt); run
// directly without DISPLAY, they skip.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <stb_image.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/view_model.h"

#ifndef AMPSCOPE_VIEW_BINARY
#error "AMPSCOPE_VIEW_BINARY must name the ampscope-view program"
#endif

namespace ampscope::viewer {
namespace {

#define SKIP_WITHOUT_DISPLAY()                                                                  \
  do {                                                                                          \
    if (std::getenv("DISPLAY") == nullptr) {                                                    \
      GTEST_SKIP() << "no X display (DISPLAY is not set): ctest runs this test under xvfb-run"; \
    }                                                                                           \
  } while (0)

struct Image {
  int w = 0, h = 0;
  std::unique_ptr<unsigned char, void (*)(void*)> pixels{nullptr, stbi_image_free};
  std::uint32_t at(int x, int y) const {
    const unsigned char* p = pixels.get() + (static_cast<std::size_t>(y) * w + x) * 3;
    return rgba(p[0], p[1], p[2]);
  }
};

Image load_png(const std::filesystem::path& path) {
  Image img;
  int channels = 0;
  img.pixels.reset(stbi_load(path.c_str(), &img.w, &img.h, &channels, 3));
  return img;
}

struct ProgramRun {
  int status = -1;
  std::string output;
};

ProgramRun run(const std::string& args, const std::string& env = "") {
  const std::string command = env + " '" AMPSCOPE_VIEW_BINARY "' " + args + " 2>&1";
  ProgramRun r;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), buffer.size(), pipe)) r.output += buffer.data();
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

// Renders `panel` of the traces into a PNG of w x h (800x500 unless given) and loads it.
Image screenshot(const std::string& traces, const std::string& panel, const std::string& name, const std::string& extra = "",
                 int w = 800, int h = 500) {
  const auto png = testing::fixture_dir() / name;
  std::filesystem::remove(png);
  const ProgramRun r = run(traces + " --screenshot '" + png.string() + "' --panel " + panel +
                           fmt::format(" --size {}x{} ", w, h) + extra);
  EXPECT_EQ(r.status, 0) << r.output;
  Image img = load_png(png);
  EXPECT_TRUE(img.pixels) << "no PNG at " << png << "; output:\n" << r.output;
  EXPECT_EQ(img.w, w);
  EXPECT_EQ(img.h, h);
  return img;
}

// Pixels of exactly this colour, and the range of their x coordinates.
struct Found {
  int count = 0, min_x = 1 << 30, max_x = -1;
};
Found find_colour(const Image& img, std::uint32_t colour) {
  Found f;
  if (!img.pixels) return f;
  for (int y = 0; y < img.h; ++y) {
    for (int x = 0; x < img.w; ++x) {
      if (img.at(x, y) == colour) {
        ++f.count;
        f.min_x = std::min(f.min_x, x);
        f.max_x = std::max(f.max_x, x);
      }
    }
  }
  return f;
}

// Pixels of exactly this colour inside [x0, x1) x [y0, y1), as bands of rows: a band is a run of rows that
// hold the colour (a gap of 3 or more rows ends it), with its rows and the x range of its pixels.
struct Band {
  int y0 = 0, y1 = 0, min_x = 1 << 30, max_x = -1;
};
std::vector<Band> colour_bands(const Image& img, std::uint32_t colour, int x0, int x1, int y0, int y1) {
  std::vector<Band> bands;
  int last_row = -100;
  for (int y = y0; y < std::min(y1, img.h); ++y) {
    for (int x = x0; x < std::min(x1, img.w); ++x) {
      if (img.at(x, y) != colour) continue;
      if (y - last_row >= 3) bands.push_back({.y0 = y, .y1 = y});
      Band& b = bands.back();
      b.y1 = y;
      b.min_x = std::min(b.min_x, x);
      b.max_x = std::max(b.max_x, x);
      last_row = y;
    }
  }
  return bands;
}

// fmt rather than "'" + s: GCC 12 gives a false -Wrestrict on operator+(const char*, string&&) at -O3.
std::string quoted(const std::filesystem::path& p) { return fmt::format("'{}'", p.string()); }

TEST(screenshot_test, skipped_step_colour_marks_step_1_of_4_on_the_scale_panel) {
  SKIP_WITHOUT_DISPLAY();
  const auto trace = testing::write_fixture(testing::fixture_dir() / "shot_nan.h5", true);
  const Image img = screenshot(quoted(trace), "scale", "scale_nan.png");
  const Found f = find_colour(img, colours::kSkippedStep);
  // The step strip spans the width: step 1 of steps 0..3 is its second quarter; the plots' markers at x = 1
  // of 0..3 sit a third of the way along. Both lie between a fifth and a little over half of the width.
  EXPECT_GT(f.count, 100);
  EXPECT_GE(f.min_x, img.w / 5);
  EXPECT_LE(f.max_x, img.w * 55 / 100);

  const auto healthy = testing::write_fixture(testing::fixture_dir() / "shot_ok.h5", false);
  const Image ok = screenshot(quoted(healthy), "scale", "scale_ok.png");
  EXPECT_GT(find_colour(ok, colours::kHealthyStep).count, 100);
  EXPECT_EQ(find_colour(ok, colours::kSkippedStep).count, 0);
}

// A 3-rank run's Scale and loss: each rank's colour in the plots (and their legends' swatches); a trace of one
// process has none of the colours of ranks 1 and 2. The skip at step 2 is every rank's (the shown rank's marker).
TEST(screenshot_test, a_data_parallel_run_draws_one_line_per_rank_in_the_rank_colours) {
  SKIP_WITHOUT_DISPLAY();
  for (int r = 0; r < 3; ++r)
    testing::write_rank(testing::fixture_dir() / fmt::format("shot_ranks.rank{}.h5", r), r, 3, /*bad_rank_1=*/true);
  const Image img = screenshot(quoted(testing::fixture_dir() / "shot_ranks.h5"), "scale", "scale_ranks.png", "--rank 1");
  for (int r = 0; r < 3; ++r) EXPECT_GT(find_colour(img, rank_colour(r)).count, 150) << "rank " << r;
  EXPECT_GT(find_colour(img, colours::kSkippedStep).count, 100);
  const auto single = testing::write_fixture(testing::fixture_dir() / "shot_single.h5", true);
  const Image one = screenshot(quoted(single), "scale", "scale_single.png");
  EXPECT_EQ(find_colour(one, rank_colour(1)).count, 0);
  EXPECT_EQ(find_colour(one, rank_colour(2)).count, 0);
  // --rank of a run that has no such rank: the error box, and the run shown.
  const Image wrong = screenshot(quoted(testing::fixture_dir() / "shot_ranks.h5"), "scale", "scale_rank_9.png", "--rank 9");
  EXPECT_GT(find_colour(wrong, colours::kErrorBackground).count, 1000);
  EXPECT_GT(find_colour(wrong, rank_colour(2)).count, 150);
}

TEST(screenshot_test, nan_step_shows_red_cells_in_the_ops_table_and_a_healthy_step_none) {
  SKIP_WITHOUT_DISPLAY();
  const auto trace = testing::write_fixture(testing::fixture_dir() / "shot_ops.h5", true);
  const Image bad = screenshot(quoted(trace), "ops", "ops_nan.png", "--step 1");
  EXPECT_GT(find_colour(bad, colours::kNonFiniteCell).count, 200);  // two cells with 5 NaN
  EXPECT_GT(find_colour(bad, colours::kOriginMark).count, 20);      // the origin's seq cell
  const Image good = screenshot(quoted(trace), "ops", "ops_ok.png", "--step 2");
  // The table was drawn (its f16 dtype cells are there), and none of its cells is red.
  EXPECT_GT(find_colour(good, dtype_colour("f16")).count, 50);
  EXPECT_EQ(find_colour(good, colours::kNonFiniteCell).count, 0);
  EXPECT_EQ(find_colour(good, colours::kOriginMark).count, 0);
}

TEST(screenshot_test, a_bad_second_trace_shows_the_error_box_beside_the_first_trace) {
  SKIP_WITHOUT_DISPLAY();
  const auto trace = testing::write_fixture(testing::fixture_dir() / "shot_pair_a.h5", true);
  const auto bad = testing::write_not_hdf5(testing::fixture_dir() / "shot_pair_b.h5");
  const Image img = screenshot(quoted(trace) + " " + quoted(bad), "all", "pair_bad.png");
  EXPECT_GT(find_colour(img, colours::kErrorBackground).count, 800 * 20);
  EXPECT_GT(find_colour(img, colours::kOriginMark).count, 20);  // trace a's origin, in its ops table
}

TEST(screenshot_test, a_trace_without_steps_renders_every_panel_without_an_error) {
  SKIP_WITHOUT_DISPLAY();
  const auto path = testing::fixture_dir() / "shot_empty.h5";
  {
    trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "empty", .seed = 1, .config = "{}"});
    w.close();
  }
  const Image img = screenshot(quoted(path), "all", "empty.png");
  EXPECT_EQ(find_colour(img, colours::kErrorBackground).count, 0);
  EXPECT_EQ(find_colour(img, colours::kHealthyStep).count, 0);  // no step strip: there are no steps
  EXPECT_EQ(find_colour(img, colours::kSkippedStep).count, 0);
}

TEST(screenshot_test, op_detail_draws_the_histogram_as_bars_with_an_inf_bar_when_the_output_holds_infs) {
  SKIP_WITHOUT_DISPLAY();
  const auto with_inf = testing::write_histogram_fixture(testing::fixture_dir() / "shot_hist_inf.h5", 7101);
  const Image img = screenshot(quoted(with_inf), "detail", "detail_inf.png", "--step 0 --seq 0");
  // The exponent bins are bars (filled areas, not a line through two points), and the 7,101 infs are a bar
  // of their own, at least as tall as the 1,000-value bar.
  const Found bars = find_colour(img, colours::kHistogramBar);
  const Found inf = find_colour(img, colours::kInfBar);
  EXPECT_GT(bars.count, 400);
  EXPECT_GT(inf.count, 400);
  EXPECT_GT(inf.min_x, bars.max_x);  // beside the exponent bars, on the right
  EXPECT_EQ(find_colour(img, colours::kErrorBackground).count, 0);

  const auto without = testing::write_histogram_fixture(testing::fixture_dir() / "shot_hist_ok.h5", 0);
  const Image ok = screenshot(quoted(without), "detail", "detail_ok.png", "--step 0 --seq 0");
  EXPECT_GT(find_colour(ok, colours::kHistogramBar).count, 400);
  EXPECT_EQ(find_colour(ok, colours::kInfBar).count, 0);
}

TEST(screenshot_test, op_detail_marks_a_neighbour_holding_nan_red_and_a_healthy_neighbourhood_not) {
  SKIP_WITHOUT_DISPLAY();
  // Step 1: seq 0 (fc1, healthy) feeds seq 1, which holds 5 NaN: its consumer's swatch is red. Step 2: seq 1
  // takes seq 0 and feeds seq 2, all healthy: two f16 swatches (one input row, one consumer), nothing red.
  const auto trace = testing::write_fixture(testing::fixture_dir() / "shot_links.h5", true);
  const Image bad = screenshot(quoted(trace), "detail", "links_nan.png", "--step 1 --seq 0");
  const Found red = find_colour(bad, colours::kNonFiniteCell);
  EXPECT_GE(red.count, 60);   // one swatch of about 10x10 pixels
  EXPECT_LE(red.count, 150);  // and only one
  EXPECT_LT(red.max_x, bad.w / 2);  // in the left column, where inputs and consumers are listed
  const Image ok = screenshot(quoted(trace), "detail", "links_ok.png", "--step 2 --seq 1");
  EXPECT_EQ(find_colour(ok, colours::kNonFiniteCell).count, 0);
  EXPECT_GE(find_colour(ok, dtype_colour("f16")).count, 120);  // the two swatches
}

TEST(screenshot_test, why_nan_shows_the_root_cause_chain_with_its_origin_link_and_no_chain_without_one) {
  SKIP_WITHOUT_DISPLAY();
  // The tagger fixture's analysis finds sigmoid -> neg -> add -> log: the chain's origin link has a swatch
  // of the origin colour, which nothing else in the panel uses. The NaN fixture's linear origin has no chain.
  const auto tagger = testing::write_tagger_fixture(testing::fixture_dir() / "shot_chain.h5");
  const Image chain = screenshot(quoted(tagger), "why", "why_chain.png");
  EXPECT_GE(find_colour(chain, colours::kOriginMark).count, 60);
  const auto plain = testing::write_fixture(testing::fixture_dir() / "shot_nochain.h5", true);
  const Image none = screenshot(quoted(plain), "why", "why_nochain.png");
  EXPECT_GT(find_colour(none, colours::kNonFiniteCell).count, 100);  // the anomaly's card is drawn
  EXPECT_EQ(find_colour(none, colours::kOriginMark).count, 0);
}

TEST(screenshot_test, the_precision_heatmap_colours_cells_by_bits_and_op_detail_draws_the_error_histogram) {
  SKIP_WITHOUT_DISPLAY();
  // The twin fixture: rsub has 2 bits of agreement at step 0 (max error 0.25) and 0 at step 2 (max error 1);
  // no op reaches 12 bits, so the top of the scale is only the error histogram's "exact" bar of the selected op.
  const auto trace = testing::write_twin_fixture(testing::fixture_dir() / "shot_twin.h5");
  const Image img = screenshot(quoted(trace), "precision", "precision.png", "--step 2 --seq 2");
  EXPECT_GT(find_colour(img, bits_colour(2)).count, 60);   // rsub's cell at step 0
  EXPECT_GT(find_colour(img, bits_colour(0)).count, 60);   // and at step 2 (the selected cell, outlined)
  EXPECT_GT(find_colour(img, bits_colour(kBitsScaleTop)).count, 250);  // the exact bar (more than its legend swatch)
  EXPECT_EQ(find_colour(img, colours::kErrorBackground).count, 0);
  // Step 0 has its /ops rows: Op detail shows the op's recorded numbers with the twin's, and the histogram.
  const Image with_ops = screenshot(quoted(trace), "precision", "precision_ops.png", "--step 0 --seq 2");
  EXPECT_GT(find_colour(with_ops, bits_colour(kBitsScaleTop)).count, 250);
  EXPECT_EQ(find_colour(with_ops, colours::kErrorBackground).count, 0);

  const auto plain = testing::write_fixture(testing::fixture_dir() / "shot_no_twin.h5", false);
  const Image none = screenshot(quoted(plain), "precision", "precision_none.png");
  EXPECT_EQ(find_colour(none, bits_colour(0)).count, 0);  // no heatmap: the panel says how to record one
  EXPECT_EQ(find_colour(none, colours::kErrorBackground).count, 0);
}

// The FP8 heatmap of a real run (tests/fixtures/v7-mlp-fp8.h5: `train --sample mlp --steps 3 --precision fp8`): every
// cell's colour, computed here from the reader's rows (fraction_colour of underflow / nonzero), is on the picture;
// the saturation view draws those of saturated / nonzero. A trace without /fp8 rows draws no FP8 panel at all.
TEST(screenshot_test, the_fp8_heatmap_draws_each_cell_in_its_fraction_colour_and_a_non_fp8_trace_none) {
  SKIP_WITHOUT_DISPLAY();
  const std::filesystem::path fixture = std::filesystem::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v7-mlp-fp8.h5";
  trace::TraceReader reader(fixture);
  std::map<std::uint32_t, int> cells;  // colour -> cells of that colour
  for (const trace::Fp8Row& r : reader.fp8()) ++cells[fraction_colour(trace::fp8_fraction(r.underflow, r.nonzero))];
  ASSERT_GE(cells.size(), 2u);
  const Image img = screenshot(quoted(fixture), "fp8", "fp8.png", "--step 1", 1000, 600);
  for (const auto& [colour, n] : cells) {
    SCOPED_TRACE(fmt::format("colour {:08x}, {} cells", colour, n));
    // A cell is at least 26 x 14 pixels (3 columns are 28 wide); the legend's swatch of a stop colour is smaller.
    EXPECT_GE(find_colour(img, colour).count, 250 * n);
  }
  EXPECT_EQ(find_colour(img, colours::kErrorBackground).count, 0);

  const auto plain = testing::write_fixture(testing::fixture_dir() / "shot_no_fp8.h5", false);
  const Image none = screenshot(quoted(plain), "fp8", "fp8_none.png", "", 1000, 600);
  EXPECT_EQ(find_colour(none, kFp8Nothing).count, 0);
  for (const std::uint32_t stop : kFractionStops) EXPECT_EQ(find_colour(none, stop).count, 0);
}

// The Blocks heatmap of a trace with /blocks rows (3 copies, one what-if, over 3 steps, each cell its own
// fraction): every cell's fraction colour, computed from the reader's rows, covers at least a cell's area. A trace
// without /blocks rows draws no Blocks panel at all.
TEST(screenshot_test, the_blocks_heatmap_draws_each_cell_in_its_fraction_colour_and_a_trace_without_blocks_none) {
  SKIP_WITHOUT_DISPLAY();
  const auto path = testing::fixture_dir() / "shot_blocks.h5";
  {
    trace::TraceWriter w(path, {.precision = "nvfp4", .device = "cpu", .model = "blocks shot", .seed = 1, .config = "{}"});
    for (std::int64_t step = 0; step < 3; ++step) {
      int k = 0;
      for (const char* operand : {"input", "weight", "grad_output"}) {
        trace::BlockRow r;
        r.step = step, r.module = "fc1", r.operand = operand, r.copy = "rowwise", r.format = "nvfp4", r.what_if = k == 1;
        r.rows = 16, r.cols = 64, r.numel = 1024, r.blocks = 64, r.nonzero = 1000;
        // Fractions 0, 1e-4 .. 0.3 across the cells: several stops of the scale.
        const std::int64_t lost[3][3] = {{0, 1, 10}, {30, 100, 300}, {2, 50, 0}};
        r.underflow = lost[k][step];
        if (r.underflow > 0) r.worst_block = 0, r.worst_block_underflow = 1, r.worst_block_row = 0, r.worst_block_col = 0;
        w.write(r);
        ++k;
      }
      trace::StepRow st;
      st.step = step;
      st.loss = 1;
      w.write(st);
      w.end_step(step);
    }
    w.close();
  }
  trace::TraceReader reader(path);
  std::map<std::uint32_t, int> cells;
  for (const trace::BlockRow& r : reader.blocks()) ++cells[fraction_colour(trace::block_fraction(r.underflow, r.nonzero))];
  ASSERT_GE(cells.size(), 5u);
  const Image img = screenshot(quoted(path), "blocks", "blocks.png", "--step 1", 1000, 600);
  for (const auto& [colour, n] : cells) {
    SCOPED_TRACE(fmt::format("colour {:08x}, {} cells", colour, n));
    EXPECT_GE(find_colour(img, colour).count, 250 * n);
  }
  EXPECT_EQ(find_colour(img, colours::kErrorBackground).count, 0);

  const auto plain = testing::write_fixture(testing::fixture_dir() / "shot_no_blocks.h5", false);
  const Image none = screenshot(quoted(plain), "blocks", "blocks_none.png", "", 1000, 600);
  EXPECT_EQ(find_colour(none, kFp8Nothing).count, 0);
  for (const std::uint32_t stop : kFractionStops) EXPECT_EQ(find_colour(none, stop).count, 0);
}

TEST(screenshot_test, a_file_that_is_not_hdf5_shows_the_error_box_and_exits_cleanly) {
  SKIP_WITHOUT_DISPLAY();
  const auto bad = testing::write_not_hdf5(testing::fixture_dir() / "shot_bad.h5");
  const Image img = screenshot(quoted(bad), "overview", "bad.png");
  const Found f = find_colour(img, colours::kErrorBackground);
  EXPECT_GT(f.count, 800 * 20);  // a box across the window, a few lines high
  EXPECT_EQ(find_colour(img, colours::kSkippedStep).count, 0);
}

TEST(screenshot_test, without_a_display_the_program_says_so_and_exits_2) {
  // Needs no display: it takes the display away.
  const ProgramRun r = run("--screenshot /dev/null", "env -u DISPLAY -u WAYLAND_DISPLAY");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no display"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("DISPLAY"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("xvfb-run"), std::string::npos) << r.output;
}

TEST(screenshot_test, help_lists_the_headless_options) {
  const ProgramRun r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* flag : {"--screenshot", "--panel", "--step", "--size"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " missing from:\n" << r.output;
  }
}

// A run whose every loss is NaN (every step skipped): the loss and gradient-norm plots have nothing to draw, and
// each says so in a note box (issue 31: they showed an empty 0..1 axis); a healthy run's plots have no note.
TEST(screenshot_test, plots_with_nothing_finite_to_draw_say_why_and_healthy_plots_do_not) {
  SKIP_WITHOUT_DISPLAY();
  const auto path = testing::fixture_dir() / "shot_all_nan.h5";
  {
    trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "fixture", .seed = 7, .config = "{}"});
    for (std::int64_t step = 0; step < 4; ++step) {
      trace::StepRow s;
      s.step = step;
      s.loss = std::numeric_limits<double>::quiet_NaN();
      s.scale = 1024.0 / static_cast<double>(1 << step);
      s.scale_after = s.scale / 2;
      s.found_inf = s.skipped = true;
      s.grad_norm = std::numeric_limits<double>::infinity();
      s.lr = 1e-3;
      w.write(s);
      w.end_step(step);
    }
    w.close();
  }
  const Image img = screenshot(quoted(path), "scale", "scale_all_nan.png");
  // Two boxes of text width (a few hundred pixels) and a line of text high: thousands of pixels, in the lower
  // two thirds of the panel where the loss and gradient-norm plots are (the scale plot is the top third).
  const std::vector<Band> notes = colour_bands(img, colours::kPlotNote, 0, img.w, 0, img.h);
  ASSERT_EQ(notes.size(), 2u) << "expected the loss plot's and the gradient-norm plot's note";
  for (const Band& b : notes) {
    EXPECT_GT(b.y0, img.h / 3);
    EXPECT_GT(b.max_x - b.min_x, 150);
  }
  const auto healthy = testing::write_fixture(testing::fixture_dir() / "shot_note_ok.h5", false);
  EXPECT_EQ(find_colour(screenshot(quoted(healthy), "scale", "scale_note_ok.png"), colours::kPlotNote).count, 0);
}

// A remedy `ampscope fix` verified: the words "verified by `ampscope fix`" on a line of their own under the
// remedy, and its command lines right after. In the default layout's narrow Why NaN? column they used to follow
// the wrapped remedy text on its last line, one letter a line, pushing the command lines ~300 px down (issue 31).
// Checked at 1280x800 and 1600x900 in the Why NaN? panel (the left column's lower half): the first band of the
// verified colour is the remedy's [kind] tag, the second the verified line: one line high, as wide as its words,
// within a few lines of the tag.
TEST(screenshot_test, a_verified_remedy_says_so_on_its_own_line_right_under_the_remedy) {
  SKIP_WITHOUT_DISPLAY();
  const auto trace_path = testing::write_fixture(testing::fixture_dir() / "shot_verified.h5", true);
  // The results file `ampscope fix` would write, marking every remedy of the first anomaly verified.
  trace::TraceReader reader(trace_path);
  const analysis::Report rep = analysis::analyse(reader);
  ASSERT_FALSE(rep.anomalies.empty());
  const analysis::Diagnosis& d = rep.anomalies.front();
  ASSERT_FALSE(d.remedies.empty()) << "the fixture's anomaly needs a remedy to verify";
  nlohmann::json doc = {{"cause", d.cause}, {"first_anomaly", {{"step", d.step}, {"op", d.op}}}, {"runs", nlohmann::json::array()}};
  for (const analysis::Remedy& m : d.remedies)
    doc["runs"].push_back({{"verified", true}, {"kind", m.kind}, {"remedy_flag", m.flag}});
  std::ofstream(testing::fixture_dir() / "shot_verified.fix.json") << doc.dump();
  for (const auto& [w, h] : {std::pair{1280, 800}, std::pair{1600, 900}}) {
    const Image img = screenshot(quoted(trace_path), "all", fmt::format("why_verified_{}.png", w), "", w, h);
    const std::vector<Band> bands = colour_bands(img, colours::kGrowth, 0, w * 30 / 100, h * 45 / 100, h);
    std::string found;
    for (const Band& b : bands) found += fmt::format(" [rows {}-{}, x {}-{}]", b.y0, b.y1, b.min_x, b.max_x);
    SCOPED_TRACE(fmt::format("{}x{}: bands of the verified colour in the Why NaN? panel:{}", w, h, found));
    ASSERT_GE(bands.size(), 2u);
    const int line = 13;  // the font's line height in pixels
    // Below the [kind] tag's line come the remedy's wrapped lines (up to four in the narrow column), then the
    // verified line: not the ~300 px the letter-a-line wrap pushed it.
    EXPECT_LE(bands[1].y0 - bands[0].y1, 5 * line) << "the verified line is far below the remedy";
    EXPECT_GT(bands[1].max_x - bands[1].min_x, 120) << "the verified words are squeezed";
    EXPECT_LE(bands[1].y1 - bands[1].y0, line) << "the verified words take more than a line";
  }
}

}  // namespace
}  // namespace ampscope::viewer
