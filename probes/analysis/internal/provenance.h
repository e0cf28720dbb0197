// probes/analysis/internal/provenance.h: what the dataflow provenance (trace::OpRow::inputs) says about an
// origin: the root-cause walk upstream from it, and the silent damage downstream. Internal to the analysis
// library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
//
//   root_walk(d, origin_row, idx);   // fills d.chain and d.root_cause when the walk finds a cause
#pragma once

#include <span>

#include "probes/analysis/analysis.h"
#include "probes/analysis/internal/rows.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// From an origin that met zeros (a log of 0, a division by 0, 0/0) or negative values (a sqrt of a difference
// that cancelled below 0), walks the provenance upstream to the op that made them. Fills d.chain (root first)
// and d.root_cause; leaves both empty when the trace has no provenance or the walk finds no cause.
void root_walk(Diagnosis& d, const trace::OpRow& origin, const SeqIndex& idx);

// Silent damage: forward ops of the step that took NaN/inf in and returned finite values, and the ops
// downstream of them (their finite outputs are computed from wrong values): d.absorbed_by, d.silently_wrong
// and a sentence of evidence.
void silent_damage(Diagnosis& d, std::span<const trace::OpRow> ops, const SeqIndex& idx,
                   const trace::StepRow* step_row);

}  // namespace ampscope::analysis::detail
