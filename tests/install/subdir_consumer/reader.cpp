// ampscope::reader from a subproject: opens a trace if one is given.
#include <cstdio>

#include <ampscope/probes/trace/reader.h>

int main(int argc, char** argv) {
  if (argc > 1) {
    ampscope::trace::TraceReader reader(argv[1]);
    std::printf("steps %lld\n", static_cast<long long>(reader.row_counts().steps));
  }
  return 0;
}
