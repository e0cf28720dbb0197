// probes/analysis/updates.h: which f16/bf16 parameters stopped learning because their updates were lost to
// rounding (swamped: p + u == p in the parameter's dtype while u != 0), from the trace's /updates rows
// (trace::UpdateRow), and the report's SWAMPED UPDATES section (analysis.h, SwampedSection). Trace rows in,
// conclusions out: no runtime. analyse(TraceReader&) fills Report::swamped with it.
//
//   analysis::SwampedSection s = analysis::analyse_updates(reader.updates());
//   for (const analysis::SwampedParam& p : s.stalled) fmt::print("{}: {}\n", p.param, p.evidence);
#pragma once

#include <span>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// Judges the last kSwampedWindow steps that have rows (rows in any order). Parameters over half of whose
// non-zero updates were swamped there are `stalled`; each gets its evidence and the master_weights_f32 remedy.
SwampedSection analyse_updates(std::span<const trace::UpdateRow> rows);

}  // namespace ampscope::analysis
