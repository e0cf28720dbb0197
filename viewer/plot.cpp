// viewer/plot.cpp: the plot widget. The axis arithmetic works in "transformed" units (the value itself on
// a linear axis, log2 or log10 of it on a log axis), where every scale is linear, so zoom, pan and fit
// are written once.
#include "viewer/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include <imgui_internal.h>  // SetItemUsingMouseWheel: stops the parent window scrolling while we zoom

#include "core/error.h"

namespace ampscope::viewer::plot {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Ranges are kept inside [-1e300, 1e300] (positive values in [1e-300, 1e300] on log axes) so that spans,
// zoom products and pixel positions stay finite in double.
constexpr double kMaxMagnitude = 1e300;
constexpr double kMinPositive = 1e-300;
// Below this span (relative to the values) neighbouring pixels would map to the same double.
constexpr double kMinRelativeSpan = 1e-12;
constexpr double kMinLinearSpan = 1e-290;
constexpr double kMinLogSpan = 1e-12;  // in powers of the base

constexpr double kMinTickSpacing = 70;  // pixels between ticks: 70 to 175 with steps of 1/2/5 x 10^k
constexpr double kMinLabelSpacing = 24; // closer than this, labels (13 px high) would touch
constexpr int kMaxTicks = 64;            // whatever the axis length, never more labels than this
constexpr double kFitMargin = 0.05;      // of the data span, on each side
constexpr double kWheelZoom = 0.8;       // one notch of the wheel shows 80% of the range
constexpr float kPixelClamp = 1e5f;      // pixel positions further than this outside the plot are clamped
constexpr int kPolylineChunk = 4096;     // points per AddPolyline call

double forward(Scale scale, double v) {
  switch (scale) {
    case Scale::linear:
      return v;
    case Scale::log2:
      return v > 0 ? std::log2(v) : kNaN;
    case Scale::log10:
      return v > 0 ? std::log10(v) : kNaN;
  }
  return kNaN;
}

double inverse(Scale scale, double t) {
  switch (scale) {
    case Scale::linear:
      return t;
    case Scale::log2:
      return std::exp2(t);
    case Scale::log10:
      return std::pow(10.0, t);
  }
  return kNaN;
}

// The transformed range every axis is kept inside.
double bound_lo(Scale scale) { return scale == Scale::linear ? -kMaxMagnitude : forward(scale, kMinPositive); }
double bound_hi(Scale scale) { return forward(scale, kMaxMagnitude); }

// Ranges used when there is nothing to go on (no data, NaN ends).
double default_lo(Scale scale) { return scale == Scale::linear ? 0.0 : 1.0; }
double default_hi(Scale scale) { return scale == Scale::linear ? 1.0 : scale == Scale::log2 ? 2.0 : 10.0; }
// How far below max a log axis whose min is <= 0 starts, in powers of the base (2^-10, 10^-3).
double default_log_decades(Scale scale) { return scale == Scale::log2 ? 10.0 : 3.0; }

// Sets the transformed range [t0, t1] (t0 < t1 assumed), writing back only what changed so that an axis
// that needs no repair is not nudged by a log/exp round trip every frame.
void set_transformed(Axis& axis, double t0, double t1, double old_t0, double old_t1) {
  if (t0 != old_t0) axis.min = inverse(axis.scale, t0);  // a NaN old end compares unequal: rewritten
  if (t1 != old_t1) axis.max = inverse(axis.scale, t1);
}

// Data <-> pixel for a valid axis, with the transform's constants computed once per frame.
struct Mapper {
  Scale scale;
  double t0, p0, k;  // pixel = p0 + (t - t0) * k

  Mapper(const Axis& axis, double p0_, double p1_) : scale(axis.scale), p0(p0_) {
    t0 = forward(axis.scale, axis.min);
    const double span = forward(axis.scale, axis.max) - t0;
    k = span > 0 && std::isfinite(span) ? (p1_ - p0_) / span : 0.0;
  }
  double pixel(double v) const { return p0 + (forward(scale, v) - t0) * k; }
  double value(double p) const { return k != 0 ? inverse(scale, t0 + (p - p0) / k) : kNaN; }
};

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string format(const char* fmt, int precision, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, precision, v);
  return buf;
}

// A label for a multiple of `step` that tells neighbouring ticks apart: fixed decimals for everyday
// magnitudes, %g with just enough significant digits otherwise.
std::string linear_label(double v, double step, double max_abs) {
  const int step_exp = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  if (v == 0) v = 0;  // no "-0"
  if (max_abs >= 1e6 || max_abs < 1e-4) {
    const int mag_exp = static_cast<int>(std::floor(std::log10(std::max(max_abs, step))));
    return format("%.*g", std::clamp(mag_exp - step_exp + 1, 1, 17), v);
  }
  return format("%.*f", std::max(0, -step_exp), v);
}

// The smallest step from {1, 2, 5} x 10^k that is at least `raw`.
double nice_step(double raw) {
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * base >= raw * (1 - 1e-9)) return m * base;
  }
  return 10 * base;
}

// Multiples of a 1/2/5 x 10^k step inside [lo, hi], at least `spacing` pixels apart over `pixels`.
std::vector<Tick> linear_ticks(double lo, double hi, double pixels, double spacing, bool integer = false) {
  std::vector<Tick> out;
  const double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) return out;
  double step = nice_step(span * spacing / pixels);
  if (integer) step = std::max(step, 1.0);  // nice steps >= 1 are whole numbers (1, 2, 5, 10, ...)
  double first = std::ceil(lo / step), last = std::floor(hi / step);
  while (last - first + 1 > kMaxTicks) {  // only when pixels is huge; each pass at least doubles the step
    step = nice_step(step * 1.5);
    first = std::ceil(lo / step);
    last = std::floor(hi / step);
  }
  const double max_abs = std::max(std::fabs(lo), std::fabs(hi));
  for (double k = first; k <= last; k += 1) {
    const double v = k * step;
    out.push_back({v, linear_label(v, step, max_abs)});
  }
  return out;
}

std::string power_label(Scale scale, int k) {
  if (scale == Scale::log2) return "2^" + std::to_string(k);
  if (k >= -3 && k <= 3) return linear_label(std::pow(10.0, k), std::pow(10.0, k), 1.0);
  return format("%.0e", std::pow(10.0, k));
}

// Whether the left button, since it went down, has moved further than ImGui's drag threshold.
bool dragged(const ImGuiIO& io) {
  return io.MouseDragMaxDistanceSqr[0] >= io.MouseDragThreshold * io.MouseDragThreshold;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::round(v) && std::fabs(v) < 1e15) return format("%.0f", v);
  return format("%.6g", v);
}

ImU32 with_alpha(ImU32 colour, int alpha) {
  return (colour & ~IM_COL32_A_MASK) | (static_cast<ImU32>(alpha) << IM_COL32_A_SHIFT);
}

// A band's span in pixels, inside [left, right]: -infinity (and <= 0 on a log axis) is the left edge,
// +infinity the right; {0, 0} for a NaN end.
std::pair<float, float> band_pixels(const Band& b, const Mapper& mx, double left, double right) {
  const auto pixel = [&](double v) {
    if (std::isnan(v)) return kNaN;
    if (std::isinf(v)) return v > 0 ? right : left;
    const double p = mx.pixel(v);
    return std::isnan(p) ? left : std::clamp(p, left, right);
  };
  double p0 = pixel(b.x0), p1 = pixel(b.x1);
  if (std::isnan(p0) || std::isnan(p1)) return {0.0f, 0.0f};
  if (p0 > p1) std::swap(p0, p1);
  return {static_cast<float>(p0), static_cast<float>(p1)};
}

// One series in pixels: the points to draw, split into runs at NaN gaps. Consecutive points that fall in
// the same pixel column collapse to at most four (first, the minimum and maximum in the order they
// occurred, last), so a 100k-point series costs a few points per column; points outside the plot on
// either side collapse to their first and last, which keeps the slope of the line that enters the plot.
struct Polyline {
  std::vector<ImVec2> points;
  std::vector<size_t> run_begin;  // index into points where each run starts
};

class ColumnReducer {
 public:
  ColumnReducer(Polyline& out, double left, double right) : out_(out), left_(left), right_(right) {}

  void add(double px, double py) {
    const int64_t key = px < left_ - 1   ? std::numeric_limits<int64_t>::min()
                        : px > right_ + 1 ? std::numeric_limits<int64_t>::max()
                                          : static_cast<int64_t>(std::floor(px));
    const ImVec2 p(static_cast<float>(px), static_cast<float>(py));
    if (count_ == 0 || key != key_) {
      flush();
      key_ = key;
      first_ = last_ = min_ = max_ = p;
      min_index_ = max_index_ = 0;
      count_ = 1;
      return;
    }
    if (p.y < min_.y) {
      min_ = p;
      min_index_ = count_;
    }
    if (p.y > max_.y) {
      max_ = p;
      max_index_ = count_;
    }
    last_ = p;
    ++count_;
  }

  void gap() {
    flush();
    run_open_ = false;
  }

  void flush() {
    if (count_ == 0) return;
    emit(first_);
    const bool offscreen = key_ == std::numeric_limits<int64_t>::min() || key_ == std::numeric_limits<int64_t>::max();
    if (!offscreen && count_ > 2) {
      emit(min_index_ < max_index_ ? min_ : max_);
      emit(min_index_ < max_index_ ? max_ : min_);
    }
    if (count_ > 1) emit(last_);
    count_ = 0;
  }

 private:
  void emit(ImVec2 p) {
    if (!run_open_) {
      out_.run_begin.push_back(out_.points.size());
      run_open_ = true;
    } else if (out_.points.back().x == p.x && out_.points.back().y == p.y) {
      return;
    }
    out_.points.push_back(p);
  }

  Polyline& out_;
  double left_, right_;
  bool run_open_ = false;
  int64_t key_ = 0;
  int count_ = 0;
  int min_index_ = 0, max_index_ = 0;
  ImVec2 first_, last_, min_, max_;
};

Polyline to_polyline(const Series& s, const Mapper& mx, const Mapper& my, ImVec2 lo, ImVec2 hi) {
  Polyline out;
  ColumnReducer reducer(out, lo.x, hi.x);
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t i = 0; i < n; ++i) {
    double px = mx.pixel(s.x[i]);
    double py = my.pixel(s.y[i]);
    if (!std::isfinite(px) || !std::isfinite(py)) {  // NaN y, or y <= 0 on a log axis: a gap
      reducer.gap();
      continue;
    }
    // Far-away points keep their direction but stay representable as float.
    px = std::clamp(px, static_cast<double>(lo.x - kPixelClamp), static_cast<double>(hi.x + kPixelClamp));
    py = std::clamp(py, static_cast<double>(lo.y - kPixelClamp), static_cast<double>(hi.y + kPixelClamp));
    reducer.add(px, py);
  }
  reducer.flush();
  return out;
}

// Where a point is read out on x: the point's x, or a bar's middle.
double anchor_x(const Series& s, size_t i) { return s.style == Style::bars ? s.x[i] + s.bar_width / 2 : s.x[i]; }

// Index of the point whose x (a bar's middle) is nearest `x` (any y), or npos when the series has no finite x.
size_t nearest_index(const Series& s, double x) {
  size_t best = std::string::npos;
  double best_d = std::numeric_limits<double>::infinity();
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(anchor_x(s, i) - x);
    if (d < best_d) {
      best_d = d;
      best = i;
    }
  }
  return best;
}

// Transformed min/max of the values an axis can show (finite; positive on a log axis).
struct Extent {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double t) {
    if (!std::isfinite(t)) return;
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  bool empty() const { return !(lo <= hi); }
};

void fit_axis(Axis& axis, const Extent& e) {
  if (e.empty()) return;  // nothing to fit to: keep the range, keep the flag for when data arrives
  double t0 = e.lo, t1 = e.hi;
  if (t0 == t1) {
    const double d = axis.scale != Scale::linear ? 1.0 : t0 == 0 ? 1.0 : std::fabs(t0) * 0.1;
    t0 -= d;
    t1 += d;
  } else {
    const double margin = (t1 - t0) * kFitMargin;
    t0 -= margin;
    t1 += margin;
  }
  t0 = std::max(t0, bound_lo(axis.scale));
  t1 = std::min(t1, bound_hi(axis.scale));
  axis.min = inverse(axis.scale, t0);
  axis.max = inverse(axis.scale, t1);
  axis.fit = false;
  make_valid(axis);
}

}  // namespace

double to_pixel(const Axis& axis, double value, double p0, double p1) {
  const double t = forward(axis.scale, value);
  const double t0 = forward(axis.scale, axis.min);
  const double span = forward(axis.scale, axis.max) - t0;
  if (!std::isfinite(t)) return kNaN;
  if (!(span > 0) || !std::isfinite(span)) return 0.5 * (p0 + p1);  // a degenerate axis: the middle
  return p0 + (t - t0) / span * (p1 - p0);
}

double from_pixel(const Axis& axis, double pixel, double p0, double p1) {
  const double t0 = forward(axis.scale, axis.min);
  const double t1 = forward(axis.scale, axis.max);
  if (p1 == p0 || !std::isfinite(t0) || !std::isfinite(t1)) return kNaN;
  return inverse(axis.scale, t0 + (pixel - p0) / (p1 - p0) * (t1 - t0));
}

void make_valid(Axis& axis) {
  const Scale s = axis.scale;
  const double old_t0 = forward(s, axis.min), old_t1 = forward(s, axis.max);
  double t0 = old_t0, t1 = old_t1;
  if (std::isnan(t1) && std::isnan(t0)) {  // NaN ends, or a log axis entirely <= 0
    t0 = forward(s, default_lo(s));
    t1 = forward(s, default_hi(s));
  } else if (std::isnan(t0) || std::isnan(t1)) {
    // One usable end: a log axis that reaches 0 or below starts a few powers below its top.
    const double good = std::isnan(t0) ? t1 : t0;
    const double width = s == Scale::linear ? 1.0 : default_log_decades(s);
    if (std::isnan(t0)) {
      t0 = good - width;
      t1 = good;
    } else {
      t1 = good + width;
    }
  }
  if (t0 > t1) std::swap(t0, t1);
  t0 = std::clamp(t0, bound_lo(s), bound_hi(s));
  t1 = std::clamp(t1, bound_lo(s), bound_hi(s));
  if (t0 == t1) {
    const double d = s != Scale::linear ? 1.0 : t0 == 0 ? 1.0 : std::fabs(t0) * 0.1;
    t0 -= d;
    t1 += d;
  }
  const double min_span = std::max(kMinRelativeSpan * std::max(std::fabs(t0), std::fabs(t1)),
                                   s == Scale::linear ? kMinLinearSpan : kMinLogSpan);
  if (t1 - t0 < min_span) {
    const double c = 0.5 * (t0 + t1);
    t0 = c - 0.5 * min_span;
    t1 = c + 0.5 * min_span;
  }
  set_transformed(axis, t0, t1, old_t0, old_t1);
}

std::vector<Tick> ticks(const Axis& axis_in, double pixels) {
  if (!(pixels >= 1) || !std::isfinite(pixels)) return {};
  Axis axis = axis_in;
  make_valid(axis);
  // A short axis (a 200 px high plot) still gets three or four ticks, as long as their labels fit.
  const double spacing = std::clamp(pixels / 4, std::min(kMinLabelSpacing, pixels / 2), kMinTickSpacing);
  if (!axis.labels.empty()) {
    std::vector<Tick> out;
    for (const Tick& t : axis.labels)
      if (t.value >= axis.min && t.value <= axis.max && out.size() < static_cast<size_t>(kMaxTicks)) out.push_back(t);
    return out;
  }
  if (axis.scale == Scale::linear) return linear_ticks(axis.min, axis.max, pixels, spacing, axis.integer);

  const double t0 = forward(axis.scale, axis.min), t1 = forward(axis.scale, axis.max);
  const double px_per_power = pixels / (t1 - t0);
  // Every m-th power, m from 1, 2, 4, 8... (log2: the labels stay powers of two) or 1, 2, 5, 10...
  double m = 1;
  for (int i = 0; m * px_per_power < spacing || std::floor(t1 / m) - std::ceil(t0 / m) + 1 > kMaxTicks; ++i) {
    m = axis.scale == Scale::log2 ? std::exp2(i + 1) : nice_step(m * 1.5);
  }
  const double first = std::ceil(t0 / m), last = std::floor(t1 / m);
  if (last - first + 1 < 2) {
    // Less than a power of the base in view: plain 1/2/5 ticks on the values read better than one label.
    return linear_ticks(axis.min, axis.max, pixels, spacing);
  }
  std::vector<Tick> out;
  for (double k = first; k <= last; k += 1) {
    const int power = static_cast<int>(k * m);
    out.push_back({inverse(axis.scale, power), power_label(axis.scale, power)});
  }
  return out;
}

void zoom(Axis& axis, double about, double factor) {
  if (!(factor > 0) || !std::isfinite(factor)) {
    throw Error("plot::zoom: factor must be finite and > 0 (< 1 zooms in), got " + format("%g", factor));
  }
  make_valid(axis);
  const Scale s = axis.scale;
  const double t0 = forward(s, axis.min), t1 = forward(s, axis.max);
  double ta = forward(s, about);
  if (!std::isfinite(ta)) ta = 0.5 * (t0 + t1);  // about <= 0 on a log axis: zoom about the middle
  const double n0 = std::max(ta + (t0 - ta) * factor, bound_lo(s));
  const double n1 = std::min(ta + (t1 - ta) * factor, bound_hi(s));
  set_transformed(axis, n0, n1, t0, t1);
  axis.fit = false;
  axis.follow = false;
  make_valid(axis);
}

void pan(Axis& axis, double pixels_moved, double p0, double p1) {
  if (p1 == p0 || !std::isfinite(pixels_moved) || !std::isfinite(p0) || !std::isfinite(p1)) return;
  make_valid(axis);
  const Scale s = axis.scale;
  const double t0 = forward(s, axis.min), t1 = forward(s, axis.max);
  const double span = t1 - t0;
  // The value under pixel p moves to p + pixels_moved: the range shifts the other way.
  double shift = -pixels_moved * span / (p1 - p0);
  shift = std::clamp(shift, bound_lo(s) - t0, bound_hi(s) - t1);  // in transformed units, log stays > 0
  if (shift == 0) return;
  set_transformed(axis, t0 + shift, t1 + shift, t0, t1);
  axis.fit = false;
  axis.follow = false;
  make_valid(axis);
}

void follow_data(Axis& axis) {
  if (axis.follow) axis.fit = true;
}

void follow_data(State& state) {
  follow_data(state.x);
  follow_data(state.y);
}

void fit(State& state, std::span<const Series> series) {
  if (state.x.fit) {
    Extent e;
    for (const Series& s : series) {
      const size_t n = std::min(s.x.size(), s.y.size());
      for (size_t i = 0; i < n; ++i) {
        e.add(forward(state.x.scale, s.x[i]));
        if (s.style == Style::bars) e.add(forward(state.x.scale, s.x[i] + s.bar_width));
      }
    }
    for (double v : state.x.fit_also) e.add(forward(state.x.scale, v));
    fit_axis(state.x, e);
  }
  if (state.y.fit) {
    make_valid(state.x);
    Extent e;
    for (const Series& s : series) {
      const size_t n = std::min(s.x.size(), s.y.size());
      for (size_t i = 0; i < n; ++i) {
        const double right = s.style == Style::bars ? s.x[i] + s.bar_width : s.x[i];
        if (!(right >= state.x.min && s.x[i] <= state.x.max)) continue;
        e.add(forward(state.y.scale, s.y[i]));
      }
    }
    for (double v : state.y.fit_also) e.add(forward(state.y.scale, v));
    fit_axis(state.y, e);
  }
}

namespace {

// One frame of a plot: where it is on screen and how values map to pixels. `lo`/`hi` are the plot area's
// corners (y grows downwards on screen, so `my` maps the axis minimum to hi.y).
struct Frame {
  ImDrawList* dl;
  float font;
  ImVec2 origin, outer_max;  // the child window's content
  ImVec2 lo, hi;             // the plot area
};

// Wheel zoom (shift: y), drag to pan, double click to refit, a click to select; on the range as laid out
// this frame. Returns whether the plot area is hovered and active (pressed) this frame.
std::pair<bool, bool> interact(const Frame& fr, State& state, Result& result) {
  const ImVec2 lo = fr.lo, hi = fr.hi;
  ImGuiIO& io = ImGui::GetIO();
  ImGui::SetCursorScreenPos(lo);
  const bool pressed = ImGui::InvisibleButton("##plot_area", ImVec2(hi.x - lo.x, hi.y - lo.y));
  const bool hovered = ImGui::IsItemHovered();
  const bool active = ImGui::IsItemActive();
  if (hovered) ImGui::SetItemUsingMouseWheel();
  const ImVec2 mouse = io.MousePos;
  if (hovered && (io.MouseWheel != 0 || (io.KeyShift && io.MouseWheelH != 0))) {
    // Shift+wheel arrives as a horizontal wheel on some systems. A clamp keeps a wild trackpad from
    // asking for a factor that underflows.
    const double notches = std::clamp(io.MouseWheel != 0 ? io.MouseWheel : io.MouseWheelH, -10.0f, 10.0f);
    const double factor = std::pow(kWheelZoom, notches);
    if (io.KeyShift) {
      zoom(state.y, from_pixel(state.y, mouse.y, hi.y, lo.y), factor);
    } else {
      zoom(state.x, from_pixel(state.x, mouse.x, lo.x, hi.x), factor);
    }
  }
  if (active && !io.MouseClicked[0] && (io.MouseDelta.x != 0 || io.MouseDelta.y != 0)) {
    pan(state.x, io.MouseDelta.x, lo.x, hi.x);
    pan(state.y, io.MouseDelta.y, hi.y, lo.y);
  }
  if (hovered && ImGui::IsMouseDoubleClicked(0)) {
    state.x.fit = state.y.fit = true;
    state.x.follow = state.y.follow = true;
  }
  // The second click of a double click refits; it does not select.
  if (pressed && !dragged(io) && io.MouseClickedLastCount[0] < 2) {
    result.clicked = true;
    result.clicked_x = from_pixel(state.x, mouse.x, lo.x, hi.x);
  }
  return {hovered, active};
}

// Frame, grid and tick labels; the bands over the background, under the grid.
void draw_axes(const Frame& fr, const State& state, const Mapper& mx, const Mapper& my, std::span<const Band> bands,
               const std::vector<Tick>& x_ticks, const std::vector<Tick>& y_ticks) {
  ImDrawList* dl = fr.dl;
  const ImVec2 lo = fr.lo, hi = fr.hi, origin = fr.origin, outer_max = fr.outer_max;
  const float font = fr.font;
  const ImU32 text_colour = ImGui::GetColorU32(ImGuiCol_Text);
  const ImU32 grid_colour = ImGui::GetColorU32(ImGuiCol_Text, 0.12f);
  dl->AddRectFilled(lo, hi, ImGui::GetColorU32(ImGuiCol_FrameBg));
  // Bands over the background, under the grid: the grid lines stay visible through them.
  for (const Band& b : bands) {
    const auto [x0, x1] = band_pixels(b, mx, lo.x, hi.x);
    if (!(x1 > x0)) continue;
    dl->AddRectFilled(ImVec2(x0, lo.y), ImVec2(x1, hi.y), b.colour);
    const ImVec2 text = ImGui::CalcTextSize(b.label.c_str());
    if (!b.label.empty() && text.x + 6 <= x1 - x0) {
      dl->AddText(ImVec2(x0 + 3, hi.y - text.y - 2), with_alpha(b.colour, 255), b.label.c_str());
    }
  }
  float label_end = -1e30f;  // long x labels ("1.00002e+06") can be wider than the tick spacing
  for (const Tick& t : x_ticks) {
    const float px = static_cast<float>(mx.pixel(t.value));
    if (!(px >= lo.x - 0.5f && px <= hi.x + 0.5f)) continue;
    dl->AddLine(ImVec2(px, lo.y), ImVec2(px, hi.y), grid_colour);
    const float w = ImGui::CalcTextSize(t.label.c_str()).x;
    const float tx = std::clamp(px - w / 2, origin.x, outer_max.x - w);
    if (tx < label_end + 6) continue;
    dl->AddText(ImVec2(tx, hi.y + 3), text_colour, t.label.c_str());
    label_end = tx + w;
  }
  for (const Tick& t : y_ticks) {
    const float py = static_cast<float>(my.pixel(t.value));
    if (!(py >= lo.y - 0.5f && py <= hi.y + 0.5f)) continue;
    dl->AddLine(ImVec2(lo.x, py), ImVec2(hi.x, py), grid_colour);
    const float w = ImGui::CalcTextSize(t.label.c_str()).x;
    const float ty = std::clamp(py - font / 2, origin.y, outer_max.y - font);
    dl->AddText(ImVec2(lo.x - 4 - w, ty), text_colour, t.label.c_str());
  }
  if (!state.y.label.empty()) dl->AddText(ImVec2(origin.x, origin.y), text_colour, state.y.label.c_str());
  if (!state.x.label.empty()) {
    const float w = ImGui::CalcTextSize(state.x.label.c_str()).x;
    dl->AddText(ImVec2(0.5f * (lo.x + hi.x) - w / 2, hi.y + font + 6), text_colour, state.x.label.c_str());
  }
}

// Vertical markers behind the series; many markers on one pixel column are drawn once.
void draw_markers(const Frame& fr, const Mapper& mx, std::span<const Marker> markers) {
  ImDrawList* dl = fr.dl;
  const ImVec2 lo = fr.lo, hi = fr.hi;
  float last_marker_px = -1e30f;
  ImU32 last_marker_colour = 0;
  for (const Marker& m : markers) {
    const double px = std::round(mx.pixel(m.x));
    if (!(px >= lo.x - 1 && px <= hi.x + 1)) continue;
    if (static_cast<float>(px) == last_marker_px && m.colour == last_marker_colour) continue;
    last_marker_px = static_cast<float>(px);
    last_marker_colour = m.colour;
    dl->AddLine(ImVec2(last_marker_px, lo.y), ImVec2(last_marker_px, hi.y), m.colour, 1.5f);
  }
}

// Each series as bars, a line (in chunks ImGui can take) and/or dots.
void draw_series(const Frame& fr, const Mapper& mx, const Mapper& my, std::span<const Series> series) {
  ImDrawList* dl = fr.dl;
  const ImVec2 lo = fr.lo, hi = fr.hi;
  for (const Series& s : series) {
    if (s.style == Style::bars) {
      const size_t n = std::min(s.x.size(), s.y.size());
      for (size_t i = 0; i < n; ++i) {
        const double py = my.pixel(s.y[i]);
        double x0 = mx.pixel(s.x[i]), x1 = mx.pixel(s.x[i] + s.bar_width);
        if (!std::isfinite(py) || !std::isfinite(x0) || !std::isfinite(x1)) continue;  // NaN, or <= 0 on a log axis
        if (x0 > x1) std::swap(x0, x1);
        if (x1 < lo.x || x0 > hi.x) continue;
        x0 = std::max(x0, static_cast<double>(lo.x));
        x1 = std::min(x1, static_cast<double>(hi.x));
        const float top = static_cast<float>(std::clamp(py, static_cast<double>(lo.y), static_cast<double>(hi.y)));
        const ImU32 colour = i < s.bar_colours.size() ? s.bar_colours[i] : s.colour;
        // At least a pixel wide, with a one-pixel gap between neighbouring bars when they are wide enough.
        const float right = static_cast<float>(x1 - x0 >= 4 ? x1 - 1 : std::max(x1, x0 + 1));
        dl->AddRectFilled(ImVec2(static_cast<float>(x0), top), ImVec2(right, hi.y), colour);
      }
      continue;
    }
    const Polyline line = to_polyline(s, mx, my, lo, hi);
    const bool lines = s.style != Style::markers;
    const bool dots = s.style != Style::line;
    for (size_t r = 0; r < line.run_begin.size(); ++r) {
      const size_t begin = line.run_begin[r];
      const size_t end = r + 1 < line.run_begin.size() ? line.run_begin[r + 1] : line.points.size();
      if (lines && end - begin == 1 && !dots) {
        dl->AddCircleFilled(line.points[begin], 1.5f, s.colour, 6);  // a point between two gaps
      }
      // Chunks overlap by one point so the line is continuous.
      for (size_t c = begin; lines && c + 1 < end; c += kPolylineChunk - 1) {
        const int count = static_cast<int>(std::min<size_t>(kPolylineChunk, end - c));
        dl->AddPolyline(&line.points[c], count, s.colour, ImDrawFlags_None, 1.5f);
      }
    }
    if (dots) {
      ImVec2 last(-1e30f, -1e30f);
      for (const ImVec2& p : line.points) {
        if (p.x < lo.x - 3 || p.x > hi.x + 3 || p.y < lo.y - 3 || p.y > hi.y + 3) continue;
        if (std::fabs(p.x - last.x) < 2 && std::fabs(p.y - last.y) < 2) continue;
        dl->AddCircleFilled(p, 2.5f, s.colour, 8);
        last = p;
      }
    }
  }
}

// Hover read-out: a line at the data x nearest the mouse, and each series' value there (with the markers
// and bands under the mouse) in a tooltip.
void draw_hover(const Frame& fr, const State& state, const Mapper& mx, const Mapper& my, std::span<const Series> series,
                std::span<const Marker> markers, std::span<const Band> bands, const Result& result) {
  ImDrawList* dl = fr.dl;
  const ImVec2 lo = fr.lo, hi = fr.hi;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  double snap_x = result.hover_x;
  std::string snap_text = format_value(snap_x);
  double best = std::numeric_limits<double>::infinity();
  for (const Series& s : series) {
    const size_t i = nearest_index(s, result.hover_x);
    if (i != std::string::npos && std::fabs(mx.pixel(anchor_x(s, i)) - mouse.x) < best) {
      best = std::fabs(mx.pixel(anchor_x(s, i)) - mouse.x);
      snap_x = anchor_x(s, i);
      // A bar reads as its span, or as its category when the axis names it.
      snap_text = format_value(s.x[i]);
      if (s.style == Style::bars) {
        snap_text += " .. ";
        snap_text += format_value(s.x[i] + s.bar_width);
        for (const Tick& t : state.x.labels)
          if (t.value >= s.x[i] && t.value <= s.x[i] + s.bar_width) snap_text = t.label;
      }
    }
  }
  const float snap_px = static_cast<float>(std::isfinite(mx.pixel(snap_x)) ? mx.pixel(snap_x) : mouse.x);
  dl->AddLine(ImVec2(snap_px, lo.y), ImVec2(snap_px, hi.y), ImGui::GetColorU32(ImGuiCol_Text, 0.5f));
  ImGui::BeginTooltip();
  ImGui::Text("x = %s", snap_text.c_str());
  for (const Series& s : series) {
    const size_t i = nearest_index(s, snap_x);
    if (i == std::string::npos) continue;
    const ImVec4 colour = ImGui::ColorConvertU32ToFloat4(with_alpha(s.colour, 255));
    if (anchor_x(s, i) == snap_x) {
      ImGui::TextColored(colour, "%s: %s", s.label.c_str(), format_value(s.y[i]).c_str());
    } else {
      ImGui::TextColored(colour, "%s: %s (at x = %s)", s.label.c_str(), format_value(s.y[i]).c_str(),
                         format_value(s.x[i]).c_str());
    }
    const double py = my.pixel(s.y[i]);
    if (std::isfinite(py) && py >= lo.y && py <= hi.y) {
      dl->AddCircle(ImVec2(static_cast<float>(mx.pixel(anchor_x(s, i))), static_cast<float>(py)), 4, s.colour, 12, 1.5f);
    }
  }
  for (const Marker& m : markers) {
    if (m.label.empty() || !(std::fabs(mx.pixel(m.x) - snap_px) <= 2)) continue;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(with_alpha(m.colour, 255)), "%s", m.label.c_str());
  }
  for (const Band& b : bands) {
    const auto [x0, x1] = band_pixels(b, mx, lo.x, hi.x);
    if (b.label.empty() || !(mouse.x >= x0 && mouse.x < x1)) continue;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(with_alpha(b.colour, 255)), "%s", b.label.c_str());
  }
  ImGui::EndTooltip();
}

// Whether any series has a point with finite x and y that the y axis can show (> 0 on a log axis).
bool any_point(std::span<const Series> series, Scale y_scale) {
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (y_scale == Scale::linear || s.y[i] > 0)) return true;
  return false;
}

// The state's empty_note in the plot area, on a box of the frame's colour so marker lines do not strike
// through it; wrapped to 60% of the width, so it stays clear of the legend at the top right.
void draw_empty_note(const Frame& fr, const std::string& note, std::uint32_t box_colour) {
  const float width = std::max(60.0f, 0.6f * (fr.hi.x - fr.lo.x));
  const ImVec2 text = ImGui::CalcTextSize(note.c_str(), nullptr, false, width);
  const ImVec2 at(std::floor(fr.lo.x + 0.5f * (fr.hi.x - fr.lo.x - text.x) - 0.1f * (fr.hi.x - fr.lo.x)),
                  std::floor(0.5f * (fr.lo.y + fr.hi.y) - 0.5f * text.y));
  ImVec4 box = ImGui::GetStyleColorVec4(ImGuiCol_PopupBg);
  box.w = 1;  // opaque: the style's background colours are translucent
  fr.dl->AddRectFilled(ImVec2(at.x - 4, at.y - 2), ImVec2(at.x + text.x + 4, at.y + text.y + 2),
                       box_colour != 0 ? static_cast<ImU32>(box_colour) : ImGui::ColorConvertFloat4ToU32(box));
  fr.dl->AddRect(ImVec2(at.x - 4, at.y - 2), ImVec2(at.x + text.x + 4, at.y + text.y + 2),
                 ImGui::GetColorU32(ImGuiCol_Border));
  fr.dl->AddText(ImGui::GetFont(), ImGui::GetFontSize(), at, ImGui::GetColorU32(ImGuiCol_Text), note.c_str(), nullptr,
                 width);
}

// The legend: top right, only labelled series.
void draw_legend(const Frame& fr, const State& state, std::span<const Series> series) {
  ImDrawList* dl = fr.dl;
  const ImVec2 lo = fr.lo, hi = fr.hi;
  const float font = fr.font;
  const ImU32 text_colour = ImGui::GetColorU32(ImGuiCol_Text);
  float legend_w = 0;
  int legend_n = 0;
  for (const Series& s : series) {
    if (s.label.empty() || !state.legend) continue;
    legend_w = std::max(legend_w, ImGui::CalcTextSize(s.label.c_str()).x);
    ++legend_n;
  }
  if (legend_n > 0) {
    const float swatch = font * 0.8f, pad = 4, line_h = font + 2;
    const ImVec2 box_max(hi.x - 6, lo.y + 6 + pad * 2 + line_h * legend_n);
    const ImVec2 box_min(box_max.x - legend_w - swatch - pad * 3, lo.y + 6);
    dl->AddRectFilled(box_min, box_max, ImGui::GetColorU32(ImGuiCol_PopupBg, 0.85f));
    dl->AddRect(box_min, box_max, ImGui::GetColorU32(ImGuiCol_Border));
    float y = box_min.y + pad;
    for (const Series& s : series) {
      if (s.label.empty()) continue;
      const ImVec2 sw(box_min.x + pad, y + (line_h - swatch) / 2);
      dl->AddRectFilled(sw, ImVec2(sw.x + swatch, sw.y + swatch), with_alpha(s.colour, 255));
      dl->AddText(ImVec2(sw.x + swatch + pad, y + 1), text_colour, s.label.c_str());
      y += line_h;
    }
  }
}

}  // namespace

Result draw(const char* id, State& state, std::span<const Series> series, std::span<const Marker> markers,
            ImVec2 size, std::span<const Band> bands) {
  // Checked before any ImGui call, so a throw leaves no child window open.
  for (const Series& s : series) {
    if (s.x.size() != s.y.size()) {
      throw ShapeError("plot::draw('" + std::string(id) + "'): series '" + s.label + "' has " +
                       std::to_string(s.x.size()) + " x values but " + std::to_string(s.y.size()) +
                       " y values\nhint: pass x and y spans of the same length");
    }
  }
  Result result;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = avail.x;
  if (size.y <= 0) size.y = avail.y;
  size.x = std::max(size.x, 60.0f);
  size.y = std::max(size.y, 40.0f);

  const bool visible =
      ImGui::BeginChild(id, size, false, ImGuiWindowFlags_NoScrollbar | ImGuiWindowFlags_NoScrollWithMouse);
  if (!visible) {
    ImGui::EndChild();
    return result;
  }
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float font = ImGui::GetFontSize();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const ImVec2 outer_max(origin.x + size.x, origin.y + size.y);

  fit(state, series);
  make_valid(state.x);
  make_valid(state.y);

  // Layout: y tick labels on the left, the y axis label above the plot, x tick labels and the x axis
  // label below. The y ticks depend only on the height, so they size the left margin.
  const float top = origin.y + (state.y.label.empty() ? font * 0.5f + 2 : font + 4);
  const float bottom = outer_max.y - (font + 6) - (state.x.label.empty() ? 0 : font + 2);
  const float plot_h = std::max(bottom - top, 10.0f);
  std::vector<Tick> y_ticks = ticks(state.y, plot_h);
  float label_w = 0;
  for (const Tick& t : y_ticks) label_w = std::max(label_w, ImGui::CalcTextSize(t.label.c_str()).x);
  const ImVec2 lo(origin.x + label_w + 8, top);
  const ImVec2 hi(std::max(outer_max.x - 12, lo.x + 10), top + plot_h);
  result.plot_min = lo;
  result.plot_max = hi;
  const Frame fr{dl, font, origin, outer_max, lo, hi};

  const auto [hovered, active] = interact(fr, state, result);
  fit(state, series);
  make_valid(state.x);
  make_valid(state.y);
  y_ticks = ticks(state.y, plot_h);
  const std::vector<Tick> x_ticks = ticks(state.x, hi.x - lo.x);
  const Mapper mx(state.x, lo.x, hi.x);
  const Mapper my(state.y, hi.y, lo.y);

  result.hovered = hovered;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  if (hovered) {
    result.hover_x = mx.value(mouse.x);
    result.hover_y = my.value(mouse.y);
  }

  draw_axes(fr, state, mx, my, bands, x_ticks, y_ticks);

  dl->PushClipRect(lo, hi, true);
  draw_markers(fr, mx, markers);
  draw_series(fr, mx, my, series);
  if (!state.empty_note.empty() && !any_point(series, state.y.scale)) draw_empty_note(fr, state.empty_note, state.empty_note_box);

  // Hover read-out, unless a drag is under way.
  const bool dragging = active && dragged(ImGui::GetIO()) && ImGui::IsMouseDown(0);
  if (hovered && !dragging) draw_hover(fr, state, mx, my, series, markers, bands, result);

  draw_legend(fr, state, series);
  dl->PopClipRect();
  dl->AddRect(lo, hi, ImGui::GetColorU32(ImGuiCol_Border));

  ImGui::EndChild();
  return result;
}

}  // namespace ampscope::viewer::plot
