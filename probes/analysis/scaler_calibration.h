// probes/analysis/scaler_calibration.h: what the analysis (a skip that is the GradScaler calibrating is no anomaly)
// and the diff (calibration skips pair the runs by optimizer update) both read off a run's /steps rows.
// Internal to the analysis library (not installed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// For steps in increasing order: max_before[i], the largest scale an unskipped step ran at before step i
// (-inf when none), and min_after[i + 1], the smallest one after it (+inf when none). A skip at scale s is
// the scaler calibrating when min_after[i + 1] < s (backing off cured it) and !(max_before[i] >= s) (no
// clean step had run at s: the scale was too high, the gradients had not grown).
struct CleanScales {
  std::vector<double> max_before, min_after;  // n + 1 entries each
};

inline CleanScales clean_scales(std::span<const trace::StepRow> steps) {
  const std::size_t n = steps.size();
  CleanScales c{std::vector<double>(n + 1, -std::numeric_limits<double>::infinity()),
                std::vector<double>(n + 1, std::numeric_limits<double>::infinity())};
  for (std::size_t i = 0; i < n; ++i)
    c.max_before[i + 1] = steps[i].skipped ? c.max_before[i] : std::max(c.max_before[i], steps[i].scale);
  for (std::size_t i = n; i-- > 0;)
    c.min_after[i] = steps[i].skipped ? c.min_after[i + 1] : std::min(c.min_after[i + 1], steps[i].scale);
  return c;
}

}  // namespace ampscope::analysis::detail
