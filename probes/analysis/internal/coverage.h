// probes/analysis/internal/coverage.h: what the probe's set-up (the root attribute `probe`) may have hidden,
// as the report's coverage notes and as evidence on the diagnoses it concerns. Internal to the analysis
// library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
#pragma once

#include <set>
#include <string>
#include <utility>

#include "probes/analysis/analysis.h"

namespace ampscope::analysis::detail {

// Fills rep.coverage. overrides_applied: the globs of autocast overrides that decided some recorded op's dtype;
// outside_autocast: the (op, module) of forward rows recorded outside any autocast region (no autocast reason),
// which an override cannot reach (internal/reach.h): an override that names only those is told so, not
// taken for a typo.
void coverage(Report& rep, const std::set<std::string>& overrides_applied,
              const std::set<std::pair<std::string, std::string>>& outside_autocast);

}  // namespace ampscope::analysis::detail
