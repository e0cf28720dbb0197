// viewer/options.h: ampscope-view's command line, parsed without a window (tested in tests/viewer).
//
//   ampscope-view [TRACE [TRACE2]] [--screenshot FILE.png] [--panel NAME] [--step N] [--rank R] [--size WxH]
//   ampscope-view run.h5               a data-parallel run's rank traces (run.rank0.h5, ...; view_model.h, OpenPlan)
//
//   ViewerOptions o = parse_options({"run.h5", "--screenshot", "ops.png", "--panel", "ops"});  // throws Error
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ampscope::viewer {

// The panels, by the name --panel takes. "all" is the whole window.
inline constexpr std::string_view kPanelNames[] = {"all", "overview", "scale", "ops", "detail", "why", "compare", "precision", "fp8",
                                                   "blocks"};

struct ViewerOptions {
  std::vector<std::string> traces;       // trace a [and b], or a data-parallel run's rank traces (OpenPlan)
  std::string screenshot;                // headless: write this PNG and exit
  std::string panel = "all";
  std::optional<std::int64_t> step;      // the step to select (default: the first anomaly's, else the first)
  std::optional<std::int64_t> seq;       // the op to select in that step
  std::optional<int> rank;               // the rank to show, when the traces are a data-parallel run's
  int width = 1280, height = 800;
  bool help = false;
  // Benchmarks (bench/viewer_bench): print timings; scroll the ops table for N frames and print frame times.
  bool timings = false;
  int scroll_frames = 0;
};

// Throws ampscope::Error naming the bad argument, with a hint.
ViewerOptions parse_options(const std::vector<std::string>& args);
std::string usage();

}  // namespace ampscope::viewer
