// trace_summary TRACE: the row counts and the diagnosis of a trace, through ampscope::reader only
// (tests/install/out_of_tree_test.sh compares the counts with h5py's).
#include <cstdio>
#include <exception>

#include <ampscope/probes/analysis/analysis.h>
#include <ampscope/probes/trace/reader.h>

// The installed headers must not need ampscope's source tree on the include path.
#if __has_include("kernels/functors.h") || __has_include("core/tensor.h")
#error "ampscope's source tree is on the include path of an installed-package consumer"
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: trace_summary TRACE\n");
    return 2;
  }
  try {
    ampscope::trace::TraceReader reader(argv[1]);
    const ampscope::trace::RowCounts rows = reader.row_counts();
    const ampscope::analysis::Report report = ampscope::analysis::analyse(reader);
    std::printf("steps %lld ops %lld complete %d anomalies %zu\n", static_cast<long long>(rows.steps),
                static_cast<long long>(rows.ops), reader.complete() ? 1 : 0, report.anomalies.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace_summary: %s\n", e.what());
    return 1;
  }
  return 0;
}
