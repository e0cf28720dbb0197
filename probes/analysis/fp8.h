// probes/analysis/fp8.h: the report's FP8 OPERANDS section (analysis.h, Fp8Section) from a --precision fp8
// trace's /fp8 rows (trace::Fp8Row): each FP8 Linear operand's underflow, subnormal and saturation fractions
// and quantization error over the recorded steps, and the worst operands by underflow and by saturation. Trace
// rows in, numbers out: no runtime. analyse(TraceReader&) fills Report::fp8 with it.
//
//   analysis::Fp8Section s = analysis::analyse_fp8(reader.fp8());
//   for (std::size_t i : s.worst_underflow) fmt::print("{} {}\n", s.operands[i].module, s.operands[i].operand);
#pragma once

#include <span>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// Rows in any order. Fractions are of the nonzero values (trace::fp8_fraction), summed over the steps first.
// `run`: the run's FP8 options (fp8_run_settings of the trace's config), so that no remedy repeats one the run
// used; the default (unknown) offers every remedy.
Fp8Section analyse_fp8(std::span<const trace::Fp8Row> rows, const Fp8RunSettings& run = {});

}  // namespace ampscope::analysis
