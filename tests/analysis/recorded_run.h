// tests/analysis/recorded_run.h: a training loop written as a user writes it, recorded into a trace and
// analysed, for tests that judge the report on their own small loops.
//
//   const analysis::Report rep = record_and_analyse("filter", {.precision = "fp16", ...}, {.modules = {"fc3"}},
//                                                   [&] { for (...) { probe::StepScope scope(step); ... } });
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <unistd.h>

#include "core/probe_hook.h"
#include "probes/analysis/analysis.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"

namespace ampscope::testing {

// Runs `loop` with a probe (set up by `options`, described in the trace as docs/api.md says) writing to a
// temporary trace, closes it, analyses it and removes it. Autocast overrides the loop should run under
// are installed by the caller first, so the description lists them.
inline analysis::Report record_and_analyse(const std::string& name, trace::RunInfo info,
                                           const probe::ProbeOptions& options, const std::function<void()>& loop) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_recorded_" + std::to_string(::getpid()) + "_" + name + ".h5");
  info.probe = probe::describe(options);
  {
    auto writer = std::make_shared<trace::TraceWriter>(path, info);
    auto probe = std::make_shared<probe::Probe>(writer, options);
    probe::HookGuard installed(probe);
    loop();
    probe->flush();
    writer->close();
  }
  analysis::Report rep;
  {
    trace::TraceReader reader(path);
    rep = analysis::analyse(reader);
  }
  std::filesystem::remove(path);
  return rep;
}

}  // namespace ampscope::testing
