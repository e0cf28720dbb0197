// Tests of viewer/plot.h: the axis arithmetic against hand-worked values, then draw() run headless (an
// ImGui context with a built font atlas and no backend), driving the mouse through io over frames.
#include "viewer/plot.h"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <imgui_internal.h>

#include "core/error.h"
#include "tests/test_support.h"

namespace ampscope::viewer::plot {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Axis axis(Scale scale, double min, double max) {
  Axis a;
  a.scale = scale;
  a.min = min;
  a.max = max;
  a.fit = false;
  return a;
}

std::vector<double> values_of(const std::vector<Tick>& ts) {
  std::vector<double> out;
  for (const Tick& t : ts) out.push_back(t.value);
  return out;
}

std::vector<std::string> labels_of(const std::vector<Tick>& ts) {
  std::vector<std::string> out;
  for (const Tick& t : ts) out.push_back(t.label);
  return out;
}

void expect_valid(const Axis& a) {
  EXPECT_TRUE(std::isfinite(a.min) && std::isfinite(a.max)) << a.min << " .. " << a.max;
  EXPECT_LT(a.min, a.max);
  if (a.scale != Scale::linear) {
    EXPECT_GT(a.min, 0);
  }
}

// ---- data <-> pixel -------------------------------------------------------------------------------

TEST(plot_axis_test, maps_linear_values_onto_pixels_in_either_direction) {
  const Axis a = axis(Scale::linear, 0, 1000);
  EXPECT_DOUBLE_EQ(to_pixel(a, 250, 100, 700), 100 + 0.25 * 600);
  EXPECT_DOUBLE_EQ(to_pixel(a, 0, 100, 700), 100);
  EXPECT_DOUBLE_EQ(to_pixel(a, 1000, 100, 700), 700);
  // y grows downwards: p0 is the bottom.
  EXPECT_DOUBLE_EQ(to_pixel(a, 250, 500, 100), 500 - 0.25 * 400);
  EXPECT_DOUBLE_EQ(from_pixel(a, 400, 500, 100), 250);
}

TEST(plot_axis_test, maps_log_values_by_their_exponent_and_nonpositive_values_to_nan) {
  const Axis a2 = axis(Scale::log2, 1, 65536);  // 16 powers over 160 px: 10 px per power
  EXPECT_DOUBLE_EQ(to_pixel(a2, 256, 0, 160), 80);
  EXPECT_DOUBLE_EQ(to_pixel(a2, 2, 0, 160), 10);
  EXPECT_DOUBLE_EQ(from_pixel(a2, 120, 0, 160), 4096);
  EXPECT_TRUE(std::isnan(to_pixel(a2, 0, 0, 160)));
  EXPECT_TRUE(std::isnan(to_pixel(a2, -3, 0, 160)));
  EXPECT_TRUE(std::isnan(to_pixel(a2, kNaN, 0, 160)));

  const Axis a10 = axis(Scale::log10, 1e-3, 1e3);  // 6 decades over 600 px
  EXPECT_NEAR(to_pixel(a10, 1, 0, 600), 300, 1e-9);
  EXPECT_NEAR(to_pixel(a10, 10, 0, 600), 400, 1e-9);
  EXPECT_NEAR(from_pixel(a10, 500, 0, 600), 100, 1e-9);
}

TEST(plot_axis_test, pixel_round_trips_are_exact_to_1e_9_on_every_scale) {
  const Axis axes[] = {axis(Scale::linear, -3.5, 1234.25), axis(Scale::log2, 1, 65536),
                       axis(Scale::log10, 3e-5, 7e8), axis(Scale::linear, 1e6, 3e6)};
  for (const Axis& a : axes) {
    for (double p : {0.0, 0.5, 17.25, 333.0, 599.75, 600.0, -40.0, 812.5}) {
      EXPECT_NEAR(to_pixel(a, from_pixel(a, p, 0, 600), 0, 600), p, 1e-9) << a.min << " .. " << a.max;
      EXPECT_NEAR(to_pixel(a, from_pixel(a, p, 550, 20), 550, 20), p, 1e-9);
    }
  }
}

TEST(plot_axis_test, degenerate_axes_map_into_the_middle_rather_than_to_nan) {
  EXPECT_DOUBLE_EQ(to_pixel(axis(Scale::linear, 5, 5), 5, 0, 100), 50);
  EXPECT_TRUE(std::isnan(from_pixel(axis(Scale::linear, 0, 1), 10, 7, 7)));
}

// ---- ticks ----------------------------------------------------------------------------------------

TEST(plot_ticks_test, an_integer_axis_puts_ticks_on_whole_numbers_only) {
  // Steps 0..5 over 900 px: a free axis takes 0.5 apart (about 75 px each); a step axis takes 1 apart.
  Axis steps = axis(Scale::linear, 0, 5);
  EXPECT_EQ(values_of(ticks(steps, 900)), (std::vector<double>{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5}));
  steps.integer = true;
  EXPECT_EQ(values_of(ticks(steps, 900)), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(labels_of(ticks(steps, 900)), (std::vector<std::string>{"0", "1", "2", "3", "4", "5"}));
  // A long run keeps its coarser 1/2/5 x 10^k spacing.
  steps.max = 1000;
  EXPECT_EQ(values_of(ticks(steps, 600)), (std::vector<double>{0, 200, 400, 600, 800, 1000}));
}

TEST(plot_ticks_test, puts_linear_ticks_at_1_2_5_times_powers_of_ten) {
  const auto t = ticks(axis(Scale::linear, 0, 1000), 600);
  EXPECT_EQ(values_of(t), (std::vector<double>{0, 200, 400, 600, 800, 1000}));
  EXPECT_EQ(labels_of(t), (std::vector<std::string>{"0", "200", "400", "600", "800", "1000"}));

  // span 1 over 600 px: 70 px needs 0.117 -> 0.2
  const auto u = ticks(axis(Scale::linear, 0, 1), 600);
  ASSERT_EQ(u.size(), 6u);
  for (size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(u[i].value, 0.2 * i, 1e-15);
  EXPECT_EQ(labels_of(u), (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));

  // span 0.0055 over 600 px: 70 px needs 0.00064 -> 0.001; the range starts between ticks
  const auto v = ticks(axis(Scale::linear, -0.0031, 0.0024), 600);
  EXPECT_EQ(labels_of(v), (std::vector<std::string>{"-0.003", "-0.002", "-0.001", "0.000", "0.001", "0.002"}));

  // span 5e6 over 400 px: 70 px needs 0.875e6 -> 1e6
  const auto w = ticks(axis(Scale::linear, 0, 5e6), 400);
  EXPECT_EQ(values_of(w), (std::vector<double>{0, 1e6, 2e6, 3e6, 4e6, 5e6}));
  EXPECT_EQ(labels_of(w), (std::vector<std::string>{"0", "1e+06", "2e+06", "3e+06", "4e+06", "5e+06"}));

  // A short axis: span 3 over 200 px, ticks 50 px apart need 0.75 -> 1; over 60 px, 24 px apart -> 2.
  EXPECT_EQ(values_of(ticks(axis(Scale::linear, 0, 3), 200)), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(values_of(ticks(axis(Scale::linear, 0, 3), 60)), (std::vector<double>{0, 2}));
}

TEST(plot_ticks_test, labels_the_loss_scale_axis_with_powers_of_two) {
  const Axis a = axis(Scale::log2, 1, 65536);
  // 1200 px over 16 powers is 75 px per power: every power.
  const auto all = ticks(a, 1200);
  ASSERT_EQ(all.size(), 17u);
  for (int k = 0; k <= 16; ++k) {
    EXPECT_EQ(all[k].value, std::ldexp(1.0, k));
    EXPECT_EQ(all[k].label, "2^" + std::to_string(k));
  }
  // 600 px: 37.5 px per power, so every 2nd; 200 px: 12.5 px per power and ticks 50 px apart, every 4th.
  EXPECT_EQ(labels_of(ticks(a, 600)),
            (std::vector<std::string>{"2^0", "2^2", "2^4", "2^6", "2^8", "2^10", "2^12", "2^14", "2^16"}));
  EXPECT_EQ(values_of(ticks(a, 200)), (std::vector<double>{1, 16, 256, 4096, 65536}));
  // Negative powers for small scales.
  EXPECT_EQ(labels_of(ticks(axis(Scale::log2, 0.125, 1), 600)), (std::vector<std::string>{"2^-3", "2^-2", "2^-1", "2^0"}));
}

TEST(plot_ticks_test, puts_log10_ticks_at_powers_of_ten_and_values_within_one_decade) {
  const auto t = ticks(axis(Scale::log10, 1e-3, 1e6), 900);  // 100 px per decade
  EXPECT_EQ(labels_of(t), (std::vector<std::string>{"0.001", "0.01", "0.1", "1", "10", "100", "1000", "1e+04",
                                                    "1e+05", "1e+06"}));
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i].value, std::pow(10.0, static_cast<int>(i) - 3), 1e-12 * t[i].value);
  // 20 decades over 200 px: 10 px per decade, ticks 50 px apart: every 5th power
  EXPECT_EQ(labels_of(ticks(axis(Scale::log10, 1e-10, 1e10), 200)),
            (std::vector<std::string>{"1e-10", "1e-05", "1", "1e+05", "1e+10"}));
  // 20 decades over 60 px: 3 px per decade, ticks 24 px apart: every 10th power
  EXPECT_EQ(labels_of(ticks(axis(Scale::log10, 1e-10, 1e10), 60)), (std::vector<std::string>{"1e-10", "1", "1e+10"}));
  // [2, 8] holds no power of ten: 1/2/5 ticks on the values (span 6 over 600 px -> step 1)
  EXPECT_EQ(values_of(ticks(axis(Scale::log10, 2, 8), 600)), (std::vector<double>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(plot_ticks_test, caps_the_tick_count_and_survives_degenerate_input) {
  EXPECT_LE(ticks(axis(Scale::linear, 0, 1), 1e9).size(), 64u);
  EXPECT_LE(ticks(axis(Scale::linear, -1e300, 1e300), 1e12).size(), 64u);
  EXPECT_LE(ticks(axis(Scale::log2, 1e-300, 1e300), 1e9).size(), 64u);
  EXPECT_LE(ticks(axis(Scale::log10, 1e-300, 1e300), 1e9).size(), 64u);
  EXPECT_TRUE(ticks(axis(Scale::linear, 0, 1), 0).empty());
  EXPECT_TRUE(ticks(axis(Scale::linear, 0, 1), kNaN).empty());
  EXPECT_TRUE(ticks(axis(Scale::linear, 0, 1), std::numeric_limits<double>::infinity()).empty());
  const Axis degenerate[] = {axis(Scale::linear, 5, 5),         axis(Scale::linear, kNaN, kNaN),
                             axis(Scale::linear, 3, -3),        axis(Scale::log2, -4, 0),
                             axis(Scale::log10, 0, 100),        axis(Scale::log2, 65536, 65536),
                             axis(Scale::linear, 1e6, 1e6 + 1e-9)};
  for (const Axis& a : degenerate) {
    const auto t = ticks(a, 300);
    EXPECT_FALSE(t.empty()) << a.min << " .. " << a.max;
    EXPECT_LE(t.size(), 64u);
    for (const Tick& k : t) EXPECT_TRUE(std::isfinite(k.value));
  }
}

// ---- make_valid, zoom, pan ------------------------------------------------------------------------

TEST(plot_axis_test, make_valid_repairs_ranges_that_cannot_be_drawn_and_leaves_good_ones_alone) {
  Axis a = axis(Scale::linear, 5, 5);
  make_valid(a);
  EXPECT_DOUBLE_EQ(a.min, 4.5);
  EXPECT_DOUBLE_EQ(a.max, 5.5);
  a = axis(Scale::linear, 0, 0);
  make_valid(a);
  EXPECT_EQ(a.min, -1);
  EXPECT_EQ(a.max, 1);
  a = axis(Scale::linear, kNaN, 3);
  make_valid(a);
  expect_valid(a);
  a = axis(Scale::linear, 7, 2);
  make_valid(a);
  EXPECT_EQ(a.min, 2);
  EXPECT_EQ(a.max, 7);
  a = axis(Scale::log2, -4, 0);
  make_valid(a);
  EXPECT_EQ(a.min, 1);
  EXPECT_EQ(a.max, 2);
  a = axis(Scale::log10, 0, 100);  // three decades below the top
  make_valid(a);
  EXPECT_NEAR(a.min, 0.1, 1e-15);
  EXPECT_EQ(a.max, 100);
  a = axis(Scale::log2, 65536, 65536);  // one power either side
  make_valid(a);
  EXPECT_EQ(a.min, 32768);
  EXPECT_EQ(a.max, 131072);
  a = axis(Scale::linear, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity());
  make_valid(a);
  expect_valid(a);
  a = axis(Scale::log10, 3, 7);  // already valid: not even an ulp of log/exp drift
  make_valid(a);
  EXPECT_EQ(a.min, 3);
  EXPECT_EQ(a.max, 7);
}

TEST(plot_axis_test, zoom_keeps_the_point_it_zooms_about_on_the_same_pixel) {
  Axis a = axis(Scale::linear, 0, 100);
  a.fit = true;
  zoom(a, 30, 0.5);
  EXPECT_DOUBLE_EQ(a.min, 15);
  EXPECT_DOUBLE_EQ(a.max, 65);
  EXPECT_FALSE(a.fit);

  Axis b = axis(Scale::log2, 1, 65536);  // powers [0, 16] about 4, halved: [2, 10]
  zoom(b, 16, 0.5);
  EXPECT_DOUBLE_EQ(b.min, 4);
  EXPECT_DOUBLE_EQ(b.max, 1024);

  for (Axis c : {axis(Scale::linear, -7, 13), axis(Scale::log2, 0.5, 3e4), axis(Scale::log10, 1e-4, 10)}) {
    const double about = from_pixel(c, 123, 0, 600);
    for (double f : {0.8, 1.25, 0.1, 7.0}) {
      zoom(c, about, f);
      EXPECT_NEAR(to_pixel(c, about, 0, 600), 123, 1e-6);
    }
  }
}

TEST(plot_axis_test, zoom_about_a_nonpositive_value_on_a_log_axis_zooms_about_the_middle) {
  Axis a = axis(Scale::log10, 1, 1e4);  // decades [0, 4], middle 2, halved: [1, 3]
  zoom(a, -5, 0.5);
  EXPECT_NEAR(a.min, 10, 1e-12);
  EXPECT_NEAR(a.max, 1000, 1e-9);
}

TEST(plot_axis_test, zoom_rejects_a_factor_that_is_not_positive) {
  Axis a = axis(Scale::linear, 0, 1);
  EXPECT_THROW_MSG(zoom(a, 0.5, 0), Error, "plot::zoom", "factor", "got 0");
  EXPECT_THROW_MSG(zoom(a, 0.5, kNaN), Error, "plot::zoom", "got nan");
}

TEST(plot_axis_test, endless_zooming_stays_finite_and_ordered) {
  for (Scale s : {Scale::linear, Scale::log2, Scale::log10}) {
    Axis out = axis(s, 1, 2), in = axis(s, 1, 2);
    for (int i = 0; i < 2000; ++i) {
      zoom(out, 1.5, 3.0);
      zoom(in, 1.5, 0.3);
    }
    expect_valid(out);
    expect_valid(in);
  }
}

TEST(plot_axis_test, pan_moves_the_value_under_the_mouse_with_the_mouse) {
  Axis a = axis(Scale::linear, 0, 100);
  a.fit = true;
  pan(a, 50, 0, 500);  // 50 px of 500 is 10 units, moved right: the range goes left
  EXPECT_DOUBLE_EQ(a.min, -10);
  EXPECT_DOUBLE_EQ(a.max, 90);
  EXPECT_FALSE(a.fit);

  Axis y = axis(Scale::linear, 0, 10);  // y: bottom at 400, top at 0; dragging down 40 px shows higher values
  pan(y, 40, 400, 0);
  EXPECT_DOUBLE_EQ(y.min, 1);
  EXPECT_DOUBLE_EQ(y.max, 11);

  Axis b = axis(Scale::log2, 1, 256);  // 8 powers over 800 px; dragging left 100 px is one power
  pan(b, -100, 0, 800);
  EXPECT_DOUBLE_EQ(b.min, 2);
  EXPECT_DOUBLE_EQ(b.max, 512);

  Axis c = axis(Scale::log10, 1e-2, 1e5);
  const double v = from_pixel(c, 200, 0, 600);
  pan(c, 37.5, 0, 600);
  EXPECT_NEAR(to_pixel(c, v, 0, 600), 237.5, 1e-9);
}

TEST(plot_axis_test, pan_keeps_log_axes_positive_however_far_it_goes) {
  for (Scale s : {Scale::log2, Scale::log10}) {
    Axis a = axis(s, 1, 10);
    pan(a, 1e12, 0, 100);
    expect_valid(a);
    Axis b = axis(s, 1, 10);
    pan(b, -1e12, 0, 100);
    expect_valid(b);
  }
  Axis lin = axis(Scale::linear, 0, 1);
  pan(lin, 1e308, 0, 1);
  expect_valid(lin);
  Axis same = axis(Scale::linear, 0, 1);
  pan(same, 10, 5, 5);  // a zero-length pixel range cannot be panned over
  EXPECT_EQ(same.min, 0);
  EXPECT_EQ(same.max, 1);
}

// ---- fit ------------------------------------------------------------------------------------------

TEST(plot_axis_test, zoom_and_pan_stop_an_axis_following_new_data) {
  State st;
  st.x = axis(Scale::linear, 0, 100);
  st.y = axis(Scale::linear, 0, 10);
  follow_data(st);  // untouched axes follow: both refit at the next draw
  EXPECT_TRUE(st.x.fit && st.y.fit);
  st.x.fit = st.y.fit = false;
  pan(st.y, 0, 0, 400);  // a drag with no vertical motion leaves y alone
  zoom(st.x, 50, 0.5);
  EXPECT_FALSE(st.x.follow);
  EXPECT_TRUE(st.y.follow);
  follow_data(st);
  EXPECT_FALSE(st.x.fit);
  EXPECT_TRUE(st.y.fit);
  pan(st.y, 10, 0, 400);
  EXPECT_FALSE(st.y.follow);
}

TEST(plot_fit_test, fits_both_axes_to_the_data_with_a_five_percent_margin) {
  const std::vector<double> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<double> y = {3, kNaN, 5, 4, 7, 2, kNaN, 6, 5, 4, 3};  // finite 2..7
  const Series s{.label = "loss", .x = x, .y = y};
  State st;
  fit(st, {&s, 1});
  EXPECT_DOUBLE_EQ(st.x.min, -0.5);
  EXPECT_DOUBLE_EQ(st.x.max, 10.5);
  EXPECT_DOUBLE_EQ(st.y.min, 2 - 0.25);
  EXPECT_DOUBLE_EQ(st.y.max, 7 + 0.25);
  EXPECT_FALSE(st.x.fit);
  EXPECT_FALSE(st.y.fit);
}

TEST(plot_fit_test, fits_a_log_axis_to_the_positive_values_only) {
  const std::vector<double> x = {0, 1, 2, 3, 4};
  const std::vector<double> y = {0, -1, 1, 1024, kNaN};  // positive: 2^0 .. 2^10, margin half a power
  const Series s{.label = "", .x = x, .y = y};
  State st;
  st.y.scale = Scale::log2;
  fit(st, {&s, 1});
  EXPECT_DOUBLE_EQ(st.y.min, std::exp2(-0.5));
  EXPECT_DOUBLE_EQ(st.y.max, std::exp2(10.5));
}

TEST(plot_fit_test, fits_y_over_the_visible_x_range_only) {
  std::vector<double> x, y;
  for (int i = 0; i <= 10; ++i) x.push_back(i), y.push_back(i);
  const Series s{.label = "", .x = x, .y = y};
  State st;
  st.x = axis(Scale::linear, 0, 5);
  fit(st, {&s, 1});
  EXPECT_DOUBLE_EQ(st.y.min, -0.25);
  EXPECT_DOUBLE_EQ(st.y.max, 5.25);
  EXPECT_EQ(st.x.max, 5);  // x was not asked to fit
}

TEST(plot_fit_test, keeps_the_range_and_the_flag_when_there_is_nothing_to_fit) {
  const std::vector<double> x = {1, 2, 3}, nan_y = {kNaN, kNaN, kNaN}, neg_y = {-1, 0, -2};
  const Series all_nan{.label = "", .x = x, .y = nan_y};
  const Series nonpositive{.label = "", .x = x, .y = neg_y};
  State empty;
  fit(empty, {});
  EXPECT_TRUE(empty.x.fit && empty.y.fit);
  expect_valid(empty.x);

  State nan_state;
  fit(nan_state, {&all_nan, 1});
  EXPECT_FALSE(nan_state.x.fit);  // x has data
  EXPECT_TRUE(nan_state.y.fit);
  EXPECT_EQ(nan_state.y.min, 0);
  EXPECT_EQ(nan_state.y.max, 1);

  State log_state;
  log_state.y.scale = Scale::log10;
  log_state.y.min = 1;
  log_state.y.max = 10;
  fit(log_state, {&nonpositive, 1});
  EXPECT_TRUE(log_state.y.fit);
  expect_valid(log_state.y);
}

TEST(plot_fit_test, widens_a_single_point_into_a_usable_range) {
  const std::vector<double> x = {5}, y = {0};
  const Series s{.label = "", .x = x, .y = y};
  State st;
  fit(st, {&s, 1});
  EXPECT_DOUBLE_EQ(st.x.min, 4.5);
  EXPECT_DOUBLE_EQ(st.x.max, 5.5);
  EXPECT_EQ(st.y.min, -1);
  EXPECT_EQ(st.y.max, 1);
}

// ---- draw(), headless -----------------------------------------------------------------------------

constexpr ImU32 kBlue = IM_COL32(40, 110, 250, 255);
constexpr ImU32 kGreen = IM_COL32(20, 220, 60, 255);
constexpr ImU32 kPurple = IM_COL32(170, 30, 200, 255);
constexpr ImU32 kMarkerRed = IM_COL32(230, 20, 20, 255);

// An ImGui context with no backend: a font atlas, a display, and frames stepped by hand.
class PlotDrawTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(800, 600);
    io.DeltaTime = 1.0f / 60;
    io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset;  // as the OpenGL 3 backend does
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
    for (int i = 0; i < 100; ++i) xs_.push_back(i), ys_.push_back(0.1 * i);
    state_.x = axis(Scale::linear, 0, 100);
    state_.y = axis(Scale::linear, 0, 10);
  }
  void TearDown() override { ImGui::DestroyContext(ctx_); }

  // One frame with the mouse at `mouse`; returns what draw() reported.
  Result frame(ImVec2 mouse, bool down, float wheel = 0, bool shift = false) {
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = mouse;
    io.MouseDown[0] = down;
    io.MouseWheel = wheel;
    io.KeyShift = shift;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(io.DisplaySize);
    ImGui::Begin("plot test", nullptr, ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove);
    const Series s{.label = "loss", .x = xs_, .y = ys_, .colour = kBlue};
    const Result r = draw("##p", state_, {&s, 1}, markers_, ImVec2(-1, 400));
    ImGui::End();
    ImGui::Render();
    return r;
  }

  // Where a fraction of the plot area lies on screen (fy = 0 is the bottom), on a whole pixel: ImGui
  // floors the mouse position.
  static ImVec2 at(const Result& r, double fx, double fy) {
    return ImVec2(std::floor(r.plot_min.x + fx * (r.plot_max.x - r.plot_min.x)),
                  std::floor(r.plot_max.y - fy * (r.plot_max.y - r.plot_min.y)));
  }
  // The data value at a screen position, by proportion over the fixture's ranges x [0, 100], y [0, 10].
  static double x_at(const Result& r, float px) { return 100.0 * (px - r.plot_min.x) / (r.plot_max.x - r.plot_min.x); }
  static double y_at(const Result& r, float py) { return 10.0 * (r.plot_max.y - py) / (r.plot_max.y - r.plot_min.y); }

  ImGuiContext* ctx_ = nullptr;
  std::vector<double> xs_, ys_;
  std::vector<Marker> markers_;
  State state_;
};

std::vector<ImDrawVert> vertices_of_colour(ImU32 colour) {
  std::vector<ImDrawVert> out;
  const ImDrawData* data = ImGui::GetDrawData();
  for (int l = 0; l < data->CmdListsCount; ++l) {
    for (const ImDrawVert& v : data->CmdLists[l]->VtxBuffer) {
      if (v.col == colour) out.push_back(v);
    }
  }
  return out;
}

bool all_vertices_finite() {
  const ImDrawData* data = ImGui::GetDrawData();
  for (int l = 0; l < data->CmdListsCount; ++l) {
    for (const ImDrawVert& v : data->CmdLists[l]->VtxBuffer) {
      if (!std::isfinite(v.pos.x) || !std::isfinite(v.pos.y)) return false;
    }
  }
  return true;
}

const ImVec2 kAway(-1000, -1000);  // a valid mouse position off the window

// A frame with a window that is shown at once (an auto-sized window skips drawing its first frame).
void begin_frame() {
  ImGui::NewFrame();
  ImGui::SetNextWindowPos(ImVec2(0, 0));
  ImGui::SetNextWindowSize(ImGui::GetIO().DisplaySize);
  ImGui::Begin("w", nullptr, ImGuiWindowFlags_NoDecoration);
}

TEST_F(PlotDrawTest, draws_series_markers_and_legend_into_the_draw_list) {
  std::vector<double> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, y = {1, 3, 2, kNaN, kNaN, 4, 5, 3, 2, 1};
  std::vector<double> nan_y(10, kNaN);
  const Series series[] = {
      {.label = "loss", .x = x, .y = y, .colour = kBlue, .style = Style::line_and_markers},
      {.label = "", .x = x, .y = nan_y, .colour = kPurple},  // all NaN, no legend: nothing of its colour
  };
  const Marker marker{.x = 6, .colour = kMarkerRed, .label = "skipped"};
  State st;  // fits on the first frame
  begin_frame();
  const Result r = draw("##p", st, series, {&marker, 1}, ImVec2(600, 300));
  ImGui::End();
  ImGui::Render();

  EXPECT_GT(ImGui::GetDrawData()->TotalVtxCount, 100);
  EXPECT_TRUE(all_vertices_finite());
  EXPECT_FALSE(vertices_of_colour(kBlue).empty());
  EXPECT_TRUE(vertices_of_colour(kPurple).empty());
  EXPECT_FALSE(st.x.fit);
  EXPECT_DOUBLE_EQ(st.x.min, -0.45);
  EXPECT_DOUBLE_EQ(st.x.max, 9.45);

  // The marker line sits at its x (anti-aliasing spreads it by a pixel or two).
  const auto red = vertices_of_colour(kMarkerRed);
  ASSERT_FALSE(red.empty());
  const double marker_px = to_pixel(st.x, 6, r.plot_min.x, r.plot_max.x);
  for (const ImDrawVert& v : red) EXPECT_NEAR(v.pos.x, marker_px, 3.0);

  // The series line never crosses the NaN gap between x = 2 and x = 5: no blue vertex strictly between
  // x = 2.2 and x = 4.8 (markers are 2.5 px circles around the points).
  const double gap_lo = to_pixel(st.x, 2.2, r.plot_min.x, r.plot_max.x);
  const double gap_hi = to_pixel(st.x, 4.8, r.plot_min.x, r.plot_max.x);
  for (const ImDrawVert& v : vertices_of_colour(kBlue)) {
    const bool in_legend = v.pos.y < r.plot_min.y + 40 && v.pos.x > r.plot_max.x - 100;
    if (!in_legend) {
      EXPECT_FALSE(v.pos.x > gap_lo && v.pos.x < gap_hi) << v.pos.x;
    }
  }
}

TEST_F(PlotDrawTest, draws_a_100k_point_series_with_a_few_points_per_pixel_column) {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 1);
  std::vector<double> x(100000), y(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i, y[i] = std::sin(i * 1e-4) + noise(rng);
  const Series s{.label = "", .x = x, .y = y, .colour = kGreen};
  State st;
  begin_frame();
  const Result r = draw("##p", st, {&s, 1}, {}, ImVec2(700, 300));
  ImGui::End();
  ImGui::Render();
  // At most 4 points per column, and a thick anti-aliased polyline uses 4 vertices per point; without
  // the reduction it would be 400,000.
  const double columns = r.plot_max.x - r.plot_min.x + 3;
  const auto green = vertices_of_colour(kGreen);
  EXPECT_GT(green.size(), 100u);
  EXPECT_LE(static_cast<double>(green.size()), 4 * 4 * columns);
  // The noise reaches the top and bottom of the fitted range: min/max per column keeps the extremes.
  float top = 1e9f, bottom = -1e9f;
  for (const ImDrawVert& v : green) top = std::min(top, v.pos.y), bottom = std::max(bottom, v.pos.y);
  EXPECT_LT(top, r.plot_min.y + 0.1f * (r.plot_max.y - r.plot_min.y));
  EXPECT_GT(bottom, r.plot_max.y - 0.1f * (r.plot_max.y - r.plot_min.y));
}

TEST_F(PlotDrawTest, reports_hover_position_in_data_units_and_snaps_the_readout_to_the_nearest_x) {
  markers_.push_back({.x = 25, .colour = kMarkerRed, .label = "skipped step 25"});
  Result r = frame(kAway, false);
  EXPECT_FALSE(r.hovered);
  // About 0.253 of [0, 100]: the nearest data x is 25.
  const ImVec2 p = at(r, 0.253, 0.5);
  ASSERT_GT(x_at(r, p.x), 25.1);
  ASSERT_LT(x_at(r, p.x), 25.4);
  frame(p, false);  // the window must exist in a frame before the mouse can hover it
  r = frame(p, false);
  EXPECT_TRUE(r.hovered);
  EXPECT_NEAR(r.hover_x, x_at(r, p.x), 1e-9);
  EXPECT_NEAR(r.hover_y, y_at(r, p.y), 1e-9);
  ImGuiWindow* tooltip = ImGui::FindWindowByName("##Tooltip_00");
  ASSERT_NE(tooltip, nullptr);
  EXPECT_TRUE(tooltip->Active);
  const double line_px = to_pixel(state_.x, 25, r.plot_min.x, r.plot_max.x);
  const auto hover_line = vertices_of_colour(ImGui::GetColorU32(ImGuiCol_Text, 0.5f));
  ASSERT_FALSE(hover_line.empty());
  for (const ImDrawVert& v : hover_line) EXPECT_NEAR(v.pos.x, line_px, 3.0);  // data x 24 and 26 are 7.5 px away
  // The marker's label is in the tooltip, in the marker's colour: red text vertices inside the tooltip.
  int red_in_tooltip = 0;
  for (const ImDrawVert& v : vertices_of_colour(kMarkerRed)) {
    red_in_tooltip += v.pos.x >= tooltip->Pos.x && v.pos.y >= tooltip->Pos.y &&
                      v.pos.x <= tooltip->Pos.x + tooltip->Size.x && v.pos.y <= tooltip->Pos.y + tooltip->Size.y;
  }
  EXPECT_GT(red_in_tooltip, 0);
}

TEST_F(PlotDrawTest, reports_a_click_without_drag_at_the_x_under_the_mouse) {
  Result r = frame(kAway, false);
  const ImVec2 p = at(r, 0.4, 0.3);
  frame(p, false);
  r = frame(p, true);
  EXPECT_FALSE(r.clicked);  // a click is reported on release
  r = frame(p, false);
  EXPECT_TRUE(r.clicked);
  EXPECT_NEAR(r.clicked_x, x_at(r, p.x), 1e-9);
  EXPECT_EQ(state_.x.min, 0);  // a click does not move the view
  EXPECT_EQ(state_.x.max, 100);
}

TEST_F(PlotDrawTest, drag_pans_both_axes_and_is_not_a_click) {
  Result r = frame(kAway, false);
  const float w = r.plot_max.x - r.plot_min.x, h = r.plot_max.y - r.plot_min.y;
  ImVec2 p = at(r, 0.5, 0.5);
  frame(p, false);
  frame(p, true);
  for (int i = 0; i < 4; ++i) {  // 100 px right and 40 px down in 4 frames
    p.x += 25;
    p.y += 10;
    r = frame(p, true);
    EXPECT_FALSE(r.clicked);
  }
  r = frame(p, false);
  EXPECT_FALSE(r.clicked);
  EXPECT_NEAR(state_.x.min, -100.0 * 100 / w, 1e-9);
  EXPECT_NEAR(state_.x.max, 100 - 100.0 * 100 / w, 1e-9);
  EXPECT_NEAR(state_.y.min, 40.0 * 10 / h, 1e-9);
  EXPECT_NEAR(state_.y.max, 10 + 40.0 * 10 / h, 1e-9);
}

TEST_F(PlotDrawTest, wheel_zooms_x_about_the_mouse_and_shift_wheel_zooms_y) {
  Result r = frame(kAway, false);
  const ImVec2 p = at(r, 0.25, 0.5);
  const double x = x_at(r, p.x), y = y_at(r, p.y);  // about 25 and 5
  frame(p, false);
  frame(p, false, 1.0f);  // one notch in: 80% of the range, about x
  EXPECT_NEAR(state_.x.min, x - x * 0.8, 1e-9);
  EXPECT_NEAR(state_.x.max, x + (100 - x) * 0.8, 1e-9);
  EXPECT_EQ(state_.y.min, 0);
  frame(p, false, -1.0f, true);  // shift, one notch out: the y range grows by 1 / 0.8 about y
  EXPECT_NEAR(state_.y.min, y - y / 0.8, 1e-9);
  EXPECT_NEAR(state_.y.max, y + (10 - y) / 0.8, 1e-9);
}

TEST_F(PlotDrawTest, double_click_refits_and_only_its_first_click_selects) {
  state_.x = axis(Scale::linear, 40, 50);
  Result r = frame(kAway, false);
  const ImVec2 p = at(r, 0.5, 0.5);
  frame(p, false);
  frame(p, true);
  r = frame(p, false);
  EXPECT_TRUE(r.clicked);
  frame(p, true);
  r = frame(p, false);
  EXPECT_FALSE(r.clicked);
  // The data: x 0..99, y 0..9.9, each with a 5% margin.
  EXPECT_NEAR(state_.x.min, -4.95, 1e-12);
  EXPECT_NEAR(state_.x.max, 103.95, 1e-12);
  EXPECT_NEAR(state_.y.min, -0.495, 1e-12);
  EXPECT_NEAR(state_.y.max, 10.395, 1e-12);
}

TEST_F(PlotDrawTest, new_data_refit_an_axis_until_the_user_zooms_it_and_again_after_a_double_click) {
  // As the scale panel does for a live trace: data grow, follow_data(), draw.
  const auto grow_to = [&](int n) {
    xs_.clear();
    ys_.clear();
    for (int i = 0; i < n; ++i) xs_.push_back(i), ys_.push_back(0.1 * i);
    follow_data(state_);
  };
  grow_to(200);
  Result r = frame(kAway, false);
  EXPECT_NEAR(state_.x.min, -0.05 * 199, 1e-9);  // x 0 .. 199 with a 5% margin
  EXPECT_NEAR(state_.x.max, 199 + 0.05 * 199, 1e-9);

  const ImVec2 p = at(r, 0.5, 0.5);
  frame(p, false);
  frame(p, false, 2.0f);  // two notches in: the user has chosen an x range
  const double x_min = state_.x.min, x_max = state_.x.max;
  ASSERT_LT(x_max - x_min, 0.7 * 199 * 1.1);
  grow_to(300);
  frame(kAway, false);
  EXPECT_EQ(state_.x.min, x_min);  // stays where the user put it
  EXPECT_EQ(state_.x.max, x_max);
  // y still follows: refit over the points in view, y = 0.1 x for whole x in [x_min, x_max].
  const double y_lo = 0.1 * std::ceil(x_min), y_hi = 0.1 * std::floor(x_max);
  EXPECT_NEAR(state_.y.min, y_lo - 0.05 * (y_hi - y_lo), 1e-9);
  EXPECT_NEAR(state_.y.max, y_hi + 0.05 * (y_hi - y_lo), 1e-9);

  frame(p, false);  // a double click: fit the data, and follow them again
  frame(p, true);
  frame(p, false);
  frame(p, true);
  frame(p, false);
  EXPECT_TRUE(state_.x.follow && state_.y.follow);
  EXPECT_NEAR(state_.x.max, 299 + 0.05 * 299, 1e-9);
  grow_to(400);
  frame(kAway, false);
  EXPECT_NEAR(state_.x.min, -0.05 * 399, 1e-9);
  EXPECT_NEAR(state_.x.max, 399 + 0.05 * 399, 1e-9);
  EXPECT_NEAR(state_.y.max, 39.9 + 0.05 * 39.9, 1e-9);
}

TEST_F(PlotDrawTest, draws_bands_over_their_x_range_behind_the_series_and_names_them_on_hover) {
  constexpr ImU32 kBandA = IM_COL32(200, 40, 40, 60), kBandB = IM_COL32(40, 200, 40, 61),
                  kBandC = IM_COL32(40, 40, 200, 62), kBandNaN = IM_COL32(90, 90, 90, 63);
  const Band bands[] = {
      {.x0 = 40, .x1 = 20, .colour = kBandA, .label = "zone A"},  // ends in either order
      {.x0 = 90, .x1 = std::numeric_limits<double>::infinity(), .colour = kBandB, .label = ""},
      {.x0 = -std::numeric_limits<double>::infinity(), .x1 = 5, .colour = kBandC, .label = "zone C"},
      {.x0 = kNaN, .x1 = 3, .colour = kBandNaN, .label = "never"},
  };
  const auto draw_frame = [&](ImVec2 mouse) {
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = mouse;
    begin_frame();
    const Series s{.label = "", .x = xs_, .y = ys_, .colour = kBlue};
    const Result r = draw("##p", state_, {&s, 1}, {}, ImVec2(600, 300), bands);
    ImGui::End();
    ImGui::Render();
    return r;
  };
  const Result r = draw_frame(kAway);
  const auto span_of = [](const std::vector<ImDrawVert>& vs) {
    ImVec4 out(1e9f, 1e9f, -1e9f, -1e9f);  // min x, min y, max x, max y
    for (const ImDrawVert& v : vs) {
      out = ImVec4(std::min(out.x, v.pos.x), std::min(out.y, v.pos.y), std::max(out.z, v.pos.x), std::max(out.w, v.pos.y));
    }
    return out;
  };
  const auto a = vertices_of_colour(kBandA), b = vertices_of_colour(kBandB), c = vertices_of_colour(kBandC);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(c.empty());
  EXPECT_TRUE(vertices_of_colour(kBandNaN).empty());
  const ImVec4 sa = span_of(a), sb = span_of(b), sc = span_of(c);
  EXPECT_NEAR(sa.x, to_pixel(state_.x, 20, r.plot_min.x, r.plot_max.x), 0.01);
  EXPECT_NEAR(sa.z, to_pixel(state_.x, 40, r.plot_min.x, r.plot_max.x), 0.01);
  EXPECT_FLOAT_EQ(sa.y, r.plot_min.y);  // the plot's whole height
  EXPECT_FLOAT_EQ(sa.w, r.plot_max.y);
  EXPECT_NEAR(sb.x, to_pixel(state_.x, 90, r.plot_min.x, r.plot_max.x), 0.01);
  EXPECT_FLOAT_EQ(sb.z, r.plot_max.x);  // +infinity: the right edge
  EXPECT_FLOAT_EQ(sc.x, r.plot_min.x);  // -infinity: the left edge
  EXPECT_NEAR(sc.z, to_pixel(state_.x, 5, r.plot_min.x, r.plot_max.x), 0.01);

  // Behind the series: the band's rectangle comes before the line in the draw list.
  const ImDrawList* list = nullptr;
  for (int l = 0; l < ImGui::GetDrawData()->CmdListsCount; ++l) {
    for (const ImDrawVert& v : ImGui::GetDrawData()->CmdLists[l]->VtxBuffer) {
      if (v.col == kBandA) list = ImGui::GetDrawData()->CmdLists[l];
    }
  }
  ASSERT_NE(list, nullptr);
  int first_blue = -1, last_band = -1;
  for (int i = 0; i < list->VtxBuffer.Size; ++i) {
    if (list->VtxBuffer[i].col == kBandA) last_band = i;
    if (list->VtxBuffer[i].col == kBlue && first_blue < 0) first_blue = i;
  }
  EXPECT_GT(first_blue, last_band);

  // Band A's label (opaque) is written at its foot; C (5 units, about 28 px) is too narrow for "zone C".
  const auto label_a = vertices_of_colour(IM_COL32(200, 40, 40, 255));
  ASSERT_FALSE(label_a.empty());
  const ImVec4 sl = span_of(label_a);
  EXPECT_GE(sl.x, sa.x);
  EXPECT_LE(sl.z, sa.z);
  EXPECT_GT(sl.y, r.plot_max.y - 2 * ImGui::GetFontSize());
  EXPECT_TRUE(vertices_of_colour(IM_COL32(40, 40, 200, 255)).empty());

  // Hovering inside band C names it in the tooltip, in its colour.
  const ImVec2 in_c(std::floor(r.plot_min.x + 0.5f * (sc.z - sc.x)), std::floor(0.5f * (r.plot_min.y + r.plot_max.y)));
  draw_frame(in_c);
  draw_frame(in_c);
  ImGuiWindow* tooltip = ImGui::FindWindowByName("##Tooltip_00");
  ASSERT_NE(tooltip, nullptr);
  EXPECT_TRUE(tooltip->Active);
  int c_in_tooltip = 0;
  for (const ImDrawVert& v : vertices_of_colour(IM_COL32(40, 40, 200, 255))) {
    c_in_tooltip += v.pos.x >= tooltip->Pos.x && v.pos.y >= tooltip->Pos.y &&
                    v.pos.x <= tooltip->Pos.x + tooltip->Size.x && v.pos.y <= tooltip->Pos.y + tooltip->Size.y;
  }
  EXPECT_GT(c_in_tooltip, 0);
}

TEST_F(PlotDrawTest, draws_bars_over_x_to_x_plus_width_from_the_bottom_in_their_own_colours) {
  // Exponent-bin bars on a log10 count axis: bin e is the bar over [e, e + 1), from the plot's floor up to
  // its count; a count of 0 (nothing on a log axis) draws nothing; per-bar colours override the series'.
  const std::vector<double> x = {2, 5, 7}, y = {10, 1000, 0};
  const std::vector<ImU32> colours = {kBlue, kGreen, kPurple};
  state_.x = axis(Scale::linear, 0, 10);
  state_.y = axis(Scale::log10, 1, 10000);
  begin_frame();
  const Series s{.label = "", .x = x, .y = y, .colour = kBlue, .style = Style::bars, .bar_width = 1,
                 .bar_colours = colours};
  const Result r = draw("##bars", state_, {&s, 1}, {}, ImVec2(600, 300));
  ImGui::End();
  ImGui::Render();
  const auto blue = vertices_of_colour(kBlue), green = vertices_of_colour(kGreen);
  ASSERT_EQ(blue.size(), 4u);  // one filled rectangle each
  ASSERT_EQ(green.size(), 4u);
  EXPECT_TRUE(vertices_of_colour(kPurple).empty());
  auto span = [](const std::vector<ImDrawVert>& vs) {
    ImVec4 out(1e9f, 1e9f, -1e9f, -1e9f);
    for (const ImDrawVert& v : vs)
      out = ImVec4(std::min(out.x, v.pos.x), std::min(out.y, v.pos.y), std::max(out.z, v.pos.x), std::max(out.w, v.pos.y));
    return out;
  };
  const ImVec4 b = span(blue), g = span(green);
  EXPECT_NEAR(b.x, to_pixel(state_.x, 2, r.plot_min.x, r.plot_max.x), 0.01);
  EXPECT_NEAR(b.z, to_pixel(state_.x, 3, r.plot_min.x, r.plot_max.x) - 1, 0.01);  // a pixel's gap to the next
  EXPECT_NEAR(b.y, to_pixel(state_.y, 10, r.plot_max.y, r.plot_min.y), 0.01);
  EXPECT_FLOAT_EQ(b.w, r.plot_max.y);
  EXPECT_NEAR(g.x, to_pixel(state_.x, 5, r.plot_min.x, r.plot_max.x), 0.01);
  EXPECT_NEAR(g.y, to_pixel(state_.y, 1000, r.plot_max.y, r.plot_min.y), 0.01);
  EXPECT_FLOAT_EQ(g.w, r.plot_max.y);
  EXPECT_LT(g.y, b.y);  // the taller count reaches higher
}

TEST_F(PlotDrawTest, fixed_labels_replace_computed_ticks_and_fit_also_widens_the_fit) {
  Axis a = axis(Scale::linear, 0, 4);
  a.labels = {{0.5, "subn"}, {1.5, "zero"}, {2.5, "inf"}, {3.5, "NaN"}, {9.5, "outside"}};
  EXPECT_EQ(labels_of(ticks(a, 200)), (std::vector<std::string>{"subn", "zero", "inf", "NaN"}));
  EXPECT_EQ(values_of(ticks(a, 200)), (std::vector<double>{0.5, 1.5, 2.5, 3.5}));

  // A y fit over the series' counts and over counts drawn elsewhere on the same axis.
  const std::vector<double> x = {0, 1}, y = {10, 100};
  const Series s{.label = "", .x = x, .y = y, .colour = kBlue, .style = Style::bars};
  State st;
  st.y.scale = Scale::log10;
  fit(st, {&s, 1});
  EXPECT_LT(st.y.max, 1000);
  st.x.fit = st.y.fit = true;
  st.y.fit_also = {7101};
  fit(st, {&s, 1});
  EXPECT_GE(st.y.max, 7101);
  EXPECT_GE(st.x.max, 2);  // the last bar's right edge, x + bar_width
}

TEST_F(PlotDrawTest, draws_degenerate_data_without_nan_ranges_or_vertices) {
  const std::vector<double> none;
  const std::vector<double> one_x = {3}, one_y = {7};
  const std::vector<double> x = {1, 2, 3}, nan_y = {kNaN, kNaN, kNaN}, nonpositive = {0, -1, 0};
  const Series cases[][1] = {{{.label = "", .x = none, .y = none}},
                             {{.label = "", .x = one_x, .y = one_y}},
                             {{.label = "", .x = x, .y = nan_y}},
                             {{.label = "", .x = x, .y = nonpositive}}};
  for (Scale scale : {Scale::linear, Scale::log2, Scale::log10}) {
    for (const auto& c : cases) {
      State st;
      st.y.scale = scale;
      begin_frame();
      draw("##p", st, c, {}, ImVec2(300, 200));
      ImGui::End();
      ImGui::Render();
      expect_valid(st.x);
      expect_valid(st.y);
      EXPECT_TRUE(all_vertices_finite());
    }
  }
}

TEST_F(PlotDrawTest, rejects_a_series_whose_x_and_y_differ_in_length_before_drawing) {
  const std::vector<double> x = {1, 2, 3}, y = {1, 2};
  const Series s{.label = "loss", .x = x, .y = y};
  State st;
  begin_frame();
  EXPECT_THROW_MSG(draw("##p", st, {&s, 1}, {}, ImVec2(300, 200)), ShapeError, "plot::draw('##p')",
                   "series 'loss'", "3 x values but 2 y values", "hint:");
  ImGui::End();  // the frame is still well formed: no child was left open
  ImGui::Render();
}

}  // namespace
}  // namespace ampscope::viewer::plot
