#include "cli/recording.h"

#include "core/probe_hook.h"
#include "probes/probe.h"
#include "probes/twin.h"
#include "probes/trace/writer.h"

namespace ampscope::samples {

// The probe writes rows to the trace writer; both live as long as the recording.
struct Recording::Impl {
  std::shared_ptr<trace::TraceWriter> writer;
  std::shared_ptr<probe::Probe> probe;
  std::shared_ptr<probe::Twin> twin;  // wraps the probe with --twin
  std::unique_ptr<probe::HookGuard> installed;
  bool closed = false;
};

Recording::Recording(const TrainConfig& config, const std::string& config_json, Device device,
                     const std::string& model)
    : impl_(std::make_unique<Impl>()), path_(config.out) {
  if (config.out.empty()) return;
  trace::RunInfo info;
  info.precision = std::string(precision_name(config.precision));
  info.device = device.str();
  info.model = model;
  info.seed = static_cast<std::int64_t>(config.seed);
  info.config = config_json;
  probe::ProbeOptions options;
  options.level = probe::parse_level(config.probe);
  options.every = config.sample_every;
  // With sampling, the flight recorder keeps every step in memory and writes the anomalous ones too.
  options.flight_recorder = config.sample_every > 1;
  // A data-parallel rank checksums its parameters after every step: the multi-rank report compares the ranks'.
  options.checksums = config.process_group != nullptr && config.process_group->size() > 1;
  info.probe = probe::describe(options);  // the autocast overrides are installed by now
  // A SIGTERM (mpirun's, to the other ranks when one dies) is noted beside the trace: the multi-rank report
  // then tells the rank that died from those ended after it.
  impl_->writer = std::make_shared<trace::TraceWriter>(config.out, info, trace::TraceWriterOptions{.note_termination = true});
  impl_->probe = std::make_shared<probe::Probe>(impl_->writer, options);
  if (config.twin) {
    // The twin rides along with the probe: it sees every op first, forwards every call unchanged and
    // writes its rows to the same trace (/precision), so the run is the same with and without it.
    impl_->twin = std::make_shared<probe::Twin>(
        impl_->probe, probe::TwinOptions{.every = config.twin_every, .sink = impl_->writer, .keep_rows = false,
                           .backward = config.twin_backward, .f32_in_f64 = config.twin_f64});
    impl_->installed = std::make_unique<probe::HookGuard>(impl_->twin);
  } else {
    impl_->installed = std::make_unique<probe::HookGuard>(impl_->probe);
  }
}

Recording::~Recording() {
  // Reached without close() only when training failed: the rows so far are written, but the trace keeps
  // complete = 0 (the writer's destructor closes the file that way), so nobody mistakes it for a
  // finished run.
  if (impl_->closed || !impl_->writer) return;
  impl_->installed.reset();
  try {
    impl_->probe->flush();
  } catch (...) {
    // Unwinding already: the training error is the one to report.
  }
  impl_->twin.reset();
  impl_->probe.reset();
  impl_->writer.reset();
}

std::int64_t Recording::anomalies() const { return impl_->probe ? impl_->probe->counters().origins : 0; }

void Recording::quiesce() {
  if (impl_->writer && !impl_->closed) impl_->writer->flush();
}

void Recording::close() {
  if (impl_->closed || !impl_->writer) return;
  impl_->closed = true;
  impl_->installed.reset();
  impl_->probe->flush();
  impl_->writer->close();
}

}  // namespace ampscope::samples
