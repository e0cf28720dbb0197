// probes/analysis/render.h: the report and the diff as text for a person (optionally with terminal
// colours) and as JSON for a program (schema: docs/report-format.md). `ampscope report`, `ampscope diff`
// and `ampscope train --compare` print these; the viewer shows the structs themselves.
//
//   fmt::print("{}", analysis::render_text(report, {.colour = isatty(1)}));
//   std::ofstream("report.json") << analysis::render_json(report);
//
// The text's first lines answer "what went wrong first, and where": the first anomaly's origin, cause and
// remedy come before everything else.
#pragma once

#include <cstddef>
#include <string>

#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"

namespace ampscope::analysis {

struct TextStyle {
  bool colour = false;        // ANSI colours (a terminal)
  std::size_t max_items = 10; // anomalies, warnings, ops listed before "... and N more"
  bool brief = false;         // only the answer: the first anomaly (report), or the first divergence and the
                              // count of dtype differences (diff); `train --compare` prints these
};

std::string render_text(const Report& report, const TextStyle& style = {});
std::string render_json(const Report& report);

std::string render_text(const DiffReport& diff, const TextStyle& style = {});
std::string render_json(const DiffReport& diff);

// The JSON schema's version (a field of every document); raised when a field changes meaning.
inline constexpr int kReportSchemaVersion = 2;  // 2: remedies, root causes, coverage, calibration

}  // namespace ampscope::analysis
