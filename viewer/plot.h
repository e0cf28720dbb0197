// viewer/plot.h: the viewer's own small plot widget, drawn with ImDrawList (ImPlot is not packaged in
// Debian): linear and log2/log10 axes with ticks and labels, several series (lines or markers), vertical
// markers (skipped steps, backoffs), zoom with the wheel, pan by dragging, a hover read-out, and a click
// that reports the x under the mouse. The axis arithmetic (ticks, data <-> pixel) is plain functions,
// tested without a window.
//
//   plot::State state;                                   // lives in the panel's state, across frames
//   plot::Series loss{.label = "loss", .x = steps, .y = losses, .colour = IM_COL32(80, 160, 255, 255)};
//   plot::Result r = plot::draw("##loss", state, {&loss, 1}, {}, ImVec2(-1, 200));
//   if (r.clicked) select_step(std::llround(r.clicked_x));
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <imgui.h>

namespace ampscope::viewer::plot {

enum class Scale { linear, log2, log10 };

struct Axis {
  Scale scale = Scale::linear;
  double min = 0, max = 1;   // the visible range, in data units
  bool fit = true;           // refit to the data on the next draw (set after loading, cleared by zoom/pan)
  std::string label;
};

// Where a data value lands on a pixel range [p0, p1] (p1 < p0 allowed: y grows downwards), and back.
// Log scales map log(value); values <= 0 on a log axis map to NaN (not drawn).
double to_pixel(const Axis& axis, double value, double p0, double p1);
double from_pixel(const Axis& axis, double pixel, double p0, double p1);

struct Tick {
  double value;
  std::string label;  // "0.001", "2^16", "1e+05"
};
// Ticks for an axis drawn over `pixels` pixels: about one per 60-100 pixels, at 1/2/5 x 10^k on a linear
// axis, at powers of 2 (log2) or 10 (log10) on a log axis (every k-th power when there are too many).
std::vector<Tick> ticks(const Axis& axis, double pixels);

// Zoom about a data value (factor < 1 zooms in) and pan by a data distance; both keep log axes positive.
void zoom(Axis& axis, double about, double factor);
void pan(Axis& axis, double pixels_moved, double p0, double p1);

enum class Style { line, markers, line_and_markers };

struct Series {
  std::string label;
  std::span<const double> x, y;  // same length; NaN y leaves a gap
  ImU32 colour = IM_COL32(255, 255, 255, 255);
  Style style = Style::line;
};

// A vertical line at x across the plot (a skipped step, a backoff, the selected step).
struct Marker {
  double x = 0;
  ImU32 colour = IM_COL32(255, 80, 80, 255);
  std::string label;  // shown in the hover read-out
};

struct State {
  Axis x, y;
};

struct Result {
  bool hovered = false;
  double hover_x = 0, hover_y = 0;   // data coordinates under the mouse
  bool clicked = false;              // a left click without a drag
  double clicked_x = 0;
};

// Draws in the current ImGui window at the cursor; size.x <= 0 takes the available width.
Result draw(const char* id, State& state, std::span<const Series> series, std::span<const Marker> markers,
            ImVec2 size);

}  // namespace ampscope::viewer::plot
