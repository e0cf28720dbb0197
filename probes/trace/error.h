// probes/trace/error.h: the exception the trace writer and reader throw. Its message names the file, the
// table (dataset) and what went wrong, with HDF5's own error stack where HDF5 reported the problem and a
// `hint:` line where a fix is known.
//
//   try { trace::TraceReader r("run.h5"); }
//   catch (const trace::TraceError& e) { fmt::print(stderr, "{}\n", e.what()); }
#pragma once

#include "core/error.h"

namespace ampscope::trace {

class TraceError : public Error {
 public:
  using Error::Error;
};

}  // namespace ampscope::trace
