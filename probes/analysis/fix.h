// probes/analysis/fix.h: the verified mark. `ampscope fix TRACE` writes TRACE's results file (run.h5 ->
// run.fix.json beside it, docs/report-format.md "Verified remedies"); mark_verified reads it and sets
// Remedy::verified on each remedy a re-run confirmed (matched by kind and flag, and by text where the
// entry has a remedy_text). A missing file is not an error; a damaged one, or
// one written for another run, is ignored and the returned note says why.
//
//   analysis::Report rep = analysis::analyse(reader);
//   if (std::string note = analysis::mark_verified(rep, "run.h5"); !note.empty()) std::cerr << note << "\n";
#pragma once

#include <string>

#include "probes/analysis/analysis.h"

namespace ampscope::analysis {

// "run.h5" -> "run.fix.json" (same folder).
std::string fix_results_path(const std::string& trace);

// Marks the report's remedies that the results file beside `trace` verified. Returns "" when it marked
// what the file confirms or there is no file; a "NOTE: ..." line when the file was damaged or belongs to
// another run (nothing is marked then). Never throws for the file's contents.
std::string mark_verified(Report& report, const std::string& trace);

}  // namespace ampscope::analysis
