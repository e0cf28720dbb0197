// probes/analysis/internal/scaler_health.h: what the GradScaler did over the run (/steps) and its verdict. The
// calibration rule (skips a smaller scale cured are no anomalies) is Analyser::State::decide_calibration, in
// scaler_health.cpp beside it. Internal to the analysis library (not installed: cmake/headers.cmake installs
// probes/*/*.h, not this folder).
//
//   rep.scaler = scaler_health(steps, rep.run);
#pragma once

#include <cstdint>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// The growths, backoffs and skips, the longest run of skips, the range of the scale, and the verdict.
ScalerHealth scaler_health(const std::vector<trace::StepRow>& steps, const trace::RunInfo& run_info);
// Skipped steps from `step` on.
std::int64_t skipped_from(const std::vector<trace::StepRow>& steps, std::int64_t step);

}  // namespace ampscope::analysis::detail
