// cli/recording.h: what `ampscope train` attaches to a run to watch it: the probe at the chosen
// level, writing to the HDF5 trace (probes/), wrapped in the f32 twin with --twin. Installed for the lifetime
// of the object.
//
//   Recording rec(config, config_json, device, "mlp");   // installs the probe hook when config.out is set
//   ... training ...
//   rec.close();                                   // flushes and marks the trace complete
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "cli/run.h"

namespace ampscope::samples {

class Recording {
 public:
  // `model` names what is trained (the trace's model field: the sample's name, "gpt2", ...).
  Recording(const TrainConfig& config, const std::string& config_json, Device device, const std::string& model);
  ~Recording();
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;

  const std::string& trace_path() const { return path_; }
  std::int64_t anomalies() const;  // NaN/Inf origins recorded so far (ops that created non-finite values)
  void close();                    // a clean end: the trace is marked complete
  // Waits until the writer thread has written and flushed everything: HDF5 here is not thread-safe,
  // so the loop calls this before it saves a checkpoint (also HDF5) on its own thread.
  void quiesce();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace ampscope::samples
