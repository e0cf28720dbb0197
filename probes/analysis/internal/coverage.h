// probes/analysis/internal/coverage.h: what the probe's set-up (the root attribute `probe`) may have hidden,
// as the report's coverage notes and as evidence on the diagnoses it concerns. Internal to the analysis
// library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
#pragma once

#include <set>
#include <string>

#include "probes/analysis/analysis.h"

namespace ampscope::analysis::detail {

// Fills rep.coverage; overrides_applied: the globs of autocast overrides that decided some recorded op's dtype.
void coverage(Report& rep, const std::set<std::string>& overrides_applied);

}  // namespace ampscope::analysis::detail
