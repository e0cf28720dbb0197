// viewer/plot.h: the viewer's own small plot widget, drawn with ImDrawList (ImPlot is not packaged in
// Debian): linear and log2/log10 axes with ticks and labels, several series (lines or markers), vertical
// markers (skipped steps, backoffs), shaded x bands (f16's overflow zone), zoom with the wheel, pan by
// dragging, a hover read-out, and a click that reports the x under the mouse. The axis arithmetic (ticks,
// data <-> pixel) is plain functions, tested without a window.
//
//   plot::State state;                                   // lives in the panel's state, across frames
//   plot::Series loss{.label = "loss", .x = steps, .y = losses, .colour = IM_COL32(80, 160, 255, 255)};
//   plot::Result r = plot::draw("##loss", state, {&loss, 1}, {}, ImVec2(-1, 200));
//   if (r.clicked) select_step(std::llround(r.clicked_x));
//   when more data arrive: plot::follow_data(state);      // refits the axes the user has not zoomed
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <imgui.h>

namespace ampscope::viewer::plot {

enum class Scale { linear, log2, log10 };

struct Tick {
  double value;
  std::string label;  // "0.001", "2^16", "1e+05"
};

struct Axis {
  Scale scale = Scale::linear;
  double min = 0, max = 1;   // the visible range, in data units
  bool fit = true;           // refit to the data on the next draw (set after loading, cleared by zoom/pan)
  bool follow = true;        // the user has not zoomed or panned it: follow_data() refits it (zoom/pan
                             // clear this, a double click sets it again)
  std::string label;
  bool integer = false;      // linear ticks at whole numbers only (a step axis: no "2.5")
  std::vector<Tick> labels{};  // when not empty: the ticks, fixed (categories: "zero", "inf"), instead of computed ones
  std::vector<double> fit_also{};  // values a fit of this axis includes besides the series' (bars drawn elsewhere
                                 // on the same scale)
};

// Where a data value lands on a pixel range [p0, p1] (p1 < p0 allowed: y grows downwards), and back.
// Log scales map log(value); values <= 0 on a log axis map to NaN (not drawn).
double to_pixel(const Axis& axis, double value, double p0, double p1);
double from_pixel(const Axis& axis, double pixel, double p0, double p1);

// Ticks for an axis drawn over `pixels` pixels, at 1/2/5 x 10^k on a linear axis, at powers of 2 (log2)
// or 10 (log10) on a log axis (every k-th power when there are too many). The step is the smallest that
// puts ticks at least 70 pixels apart (a quarter of the length on an axis under 280 px, but not under
// 24 px), so [0, 1000] over 600 px gives 0, 200, ..., 1000 and [0, 3] over 200 px gives 0, 1, 2, 3; on
// log2 every 2^j-th power, on log10 every 1/2/5 x 10^j-th; a log range holding fewer than two such powers
// gets 1/2/5 x 10^k ticks on the values instead.
// An axis with `labels` gets those of them inside its range instead. Never more than 64 ticks; none for
// pixels < 1. Labels: fixed decimals for magnitudes in [1e-4, 1e6),
// otherwise %g with just enough digits; "2^k" on log2; "0.001" to "1000", then "1e+04", on log10.
std::vector<Tick> ticks(const Axis& axis, double pixels);

// Zoom about a data value (factor < 1 zooms in) and pan by a data distance; both keep log axes positive.
// zoom keeps `about` on the same pixel (about <= 0 on a log axis zooms about the middle) and throws
// ampscope::Error for a factor that is not finite and > 0. pan moves the range so that the value under
// pixel p lies under p + pixels_moved afterwards (over the same [p0, p1] as to_pixel). Both clear fit and
// follow (the user has chosen the range; a pan of 0 pixels changes nothing and clears nothing).
void zoom(Axis& axis, double about, double factor);
void pan(Axis& axis, double pixels_moved, double p0, double p1);

// Repairs a range that cannot be drawn: NaN or infinite ends, min > max, min == max (widened by 10% of
// the value, or by 1 at 0, or by one power on a log axis), a span too small to tell pixels apart, ends
// <= 0 on a log axis (the range then starts 10 octaves / 3 decades below max, or becomes [1, 2] / [1, 10]),
// magnitudes beyond 1e300 (1e-300 on a log axis). A valid range is left exactly as it is. ticks(), zoom(),
// pan() and draw() call it; panels that set min/max by hand may call it too.
void make_valid(Axis& axis);

// bars: each point (x, y) is a filled bar over [x, x + bar_width), from the bottom of the plot up to y (an
// exponent bin e, which holds [2^e, 2^(e+1)), is the bar over [e, e + 1) on a log2|x| axis).
enum class Style { line, markers, line_and_markers, bars };

struct Series {
  std::string label;
  std::span<const double> x, y;  // same length; NaN y leaves a gap
  ImU32 colour = IM_COL32(255, 255, 255, 255);
  Style style = Style::line;
  double bar_width = 1;               // Style::bars: in x's units
  std::span<const ImU32> bar_colours{}; // Style::bars: one colour per point (empty: `colour` for all)
};

// A vertical line at x across the plot (a skipped step, a backoff, the selected step).
struct Marker {
  double x = 0;
  ImU32 colour = IM_COL32(255, 80, 80, 255);
  std::string label;  // shown in the hover read-out
};

// A shaded band across the plot's height over x0 .. x1 (a range of x that means something, such as f16's
// overflow zone), drawn behind the grid lines, markers and series. An end may be -/+infinity: the band then
// reaches the plot's edge; x0 > x1 is taken as x1 .. x0. The colour is used as given, so give it a low alpha
// (IM_COL32(230, 40, 40, 60)) for the grid and series to show through. The label is written at the band's
// foot when it fits inside, and in the hover read-out when the mouse is over the band.
struct Band {
  double x0 = 0, x1 = 0;
  ImU32 colour = IM_COL32(255, 80, 80, 48);
  std::string label;
};

struct State {
  Axis x, y;
  bool legend = true;  // the box naming the labelled series, top right
  // Said in the middle of the plot area when no series has a point the axes can show (every y NaN or inf,
  // or nothing > 0 on a log axis), so an empty plot says why instead of showing a bare default range.
  std::string empty_note;
  std::uint32_t empty_note_box = 0;  // the note's box colour (ImGui's ABGR); 0: the style's popup background
};

// New data have arrived (a live trace grew): sets fit on the axes whose follow is still set, so the next
// draw() refits them, and leaves an axis the user has zoomed or panned where the user put it. The Axis
// form is for an axis shared by several plots.
void follow_data(Axis& axis);
void follow_data(State& state);

// Refits the axes whose `fit` is set and clears their flag: x over every series' finite x, then y over
// the points whose x lies inside the (new) x range, each with a 5% margin; a log axis from the positive
// values only. An axis with nothing to fit to (no series, all NaN, nothing > 0 on a log axis) keeps its
// range and its flag, so it fits when data arrives. draw() calls this at the start of every frame.
// Series should be given as in draw(); x need not be sorted.
void fit(State& state, std::span<const Series> series);

struct Result {
  bool hovered = false;
  double hover_x = 0, hover_y = 0;   // data coordinates under the mouse
  bool clicked = false;              // a left click without a drag
  double clicked_x = 0;
  // The data area this frame, in screen pixels (x grows right, y down): to_pixel(state.x, v, plot_min.x,
  // plot_max.x) and to_pixel(state.y, v, plot_max.y, plot_min.y) give where a value was drawn. For tests
  // and screenshot checks; zero when the plot was clipped away.
  ImVec2 plot_min{0, 0}, plot_max{0, 0};
};

// Draws in the current ImGui window at the cursor; size.x <= 0 takes the available width (size.y <= 0
// the available height; never under 60 x 40). Interaction: wheel zooms x about the mouse, shift+wheel zooms y, left drag pans
// both axes, double click refits both and makes them follow new data again (its second click is not
// reported as a click), hover shows a vertical line and a tooltip with each series' y at the data x
// nearest the mouse, the labels of markers on that x and of the bands under the mouse. Series of any length are cheap: points on one pixel column are drawn as that
// column's first, min, max and last. Throws ampscope::ShapeError, before drawing anything, when a series'
// x and y differ in length. The id must be unique in the window (it names a child window).
Result draw(const char* id, State& state, std::span<const Series> series, std::span<const Marker> markers,
            ImVec2 size, std::span<const Band> bands = {});

}  // namespace ampscope::viewer::plot
