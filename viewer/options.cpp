#include "viewer/options.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope::viewer {
namespace {

std::int64_t parse_int(const std::string& flag, const std::string& text) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw Error(fmt::format("ampscope-view: {} expects an integer, got '{}'", flag, text));
  }
  return v;
}

}  // namespace

std::string usage() {
  return "usage: ampscope-view [TRACE [TRACE2]] [options]\n"
         "       ampscope-view RUN.h5 | RUN.rankR.h5 | RUN.rank0.h5 RUN.rank1.h5 ... [options]\n"
         "\n"
         "Opens one ampscope trace (or two, to compare them: TRACE2 is run b) in a window. Files can also be\n"
         "opened from File > Open, or dropped onto the window. A data-parallel run (`ampscope train --ddp --out\n"
         "RUN.h5`) opens with every rank's trace: one name finds its siblings; the rank box picks the rank shown.\n"
         "\n"
         "options:\n"
         "  --screenshot FILE.png  headless: load, let the analysis finish, render, write FILE.png, exit\n"
         "  --panel NAME           what to render: all (default), overview, scale, ops, detail, why, compare,\n"
         "                         precision (the heatmap above Op detail), fp8 (an FP8 run's underflow and\n"
         "                         saturation heatmap with its scale and amax plot; blank for other traces),\n"
         "                         blocks (block-scaled formats and --what-if: underflow and saturation by\n"
         "                         operand copy and step; blank for traces without them)\n"
         "  --step N               select step N (default: the step of the first anomaly, else the first step)\n"
         "  --seq N                select the op with this seq in that step (Op detail)\n"
         "  --rank R               show rank R of a data-parallel run (default: the rank file named, else 0)\n"
         "  --size WxH             window size in pixels (default 1280x800)\n"
         "  --timings              print open / first-frame / ready times (bench/viewer_bench)\n"
         "  --scroll-frames N      after loading, scroll the ops table for N frames and print frame times\n"
         "  -h, --help             this text\n"
         "\n"
         "Without a display (no DISPLAY), run under Xvfb: xvfb-run -a ampscope-view ...\n";
}

ViewerOptions parse_options(const std::vector<std::string>& args) {
  ViewerOptions o;
  auto value = [&](std::size_t& i, const std::string& flag) -> const std::string& {
    if (i + 1 >= args.size()) throw Error(fmt::format("ampscope-view: {} needs a value\nhint: see --help", flag));
    return args[++i];
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "--screenshot") {
      o.screenshot = value(i, a);
    } else if (a == "--panel") {
      o.panel = value(i, a);
      if (std::find(std::begin(kPanelNames), std::end(kPanelNames), o.panel) == std::end(kPanelNames)) {
        throw Error(fmt::format("ampscope-view: unknown panel '{}'\nhint: one of all, overview, scale, ops, "
                                "detail, why, compare, precision, fp8, blocks",
                                o.panel));
      }
    } else if (a == "--step") {
      o.step = parse_int(a, value(i, a));
    } else if (a == "--seq") {
      o.seq = parse_int(a, value(i, a));
    } else if (a == "--rank") {
      const std::int64_t r = parse_int(a, value(i, a));
      if (r < 0 || r > 1000000) throw Error(fmt::format("ampscope-view: --rank expects a rank from 0, got {}", r));
      o.rank = static_cast<int>(r);
    } else if (a == "--size") {
      const std::string& s = value(i, a);
      const auto x = s.find('x');
      if (x == std::string::npos) {
        throw Error(fmt::format("ampscope-view: --size expects WxH (1024x640), got '{}'", s));
      }
      o.width = static_cast<int>(parse_int(a, s.substr(0, x)));
      o.height = static_cast<int>(parse_int(a, s.substr(x + 1)));
      if (o.width < 200 || o.height < 150 || o.width > 8192 || o.height > 8192) {
        throw Error(fmt::format("ampscope-view: --size {}x{} is out of range (200x150 .. 8192x8192)", o.width,
                                o.height));
      }
    } else if (a == "--timings") {
      o.timings = true;
    } else if (a == "--scroll-frames") {
      o.scroll_frames = static_cast<int>(parse_int(a, value(i, a)));
    } else if (a.size() > 1 && a[0] == '-') {
      throw Error(fmt::format("ampscope-view: unknown option '{}'\nhint: see --help", a));
    } else {
      o.traces.push_back(a);
    }
  }
  return o;
}

}  // namespace ampscope::viewer
