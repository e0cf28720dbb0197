// ampscope-view: the desktop viewer (docs/viewer.md). Only main exits; see viewer/app.h.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "viewer/app.h"
#include "viewer/options.h"

int main(int argc, char** argv) {
  using namespace ampscope::viewer;
  try {
    const ViewerOptions options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
    return run_viewer(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
