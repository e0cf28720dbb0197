#include "samples/recording.h"

namespace ampscope::samples {

// Until the probe and the trace writer land, a run records nothing.
struct Recording::Impl {};

Recording::Recording(const TrainConfig& config, const std::string& config_json, Device device)
    : impl_(std::make_unique<Impl>()), path_(config.out) {}
Recording::~Recording() = default;
std::int64_t Recording::anomalies() const { return 0; }
void Recording::close() {}

}  // namespace ampscope::samples
