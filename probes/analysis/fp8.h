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

// Marks the PRECISION entries of FP8 Linears (a forward `linear` whose module has /fp8 input or weight rows) in
// the lists of accumulated error, by_jump and by_trend: their error against the unquantized f32 Linear holds
// the FP8 quantization of the operands, not only the bf16 rounding their out_dtype names. Each gets fp8 (the
// operands' format); a by_jump entry of kind rounding becomes fp8_quantization, with its evidence saying so and
// its remedies (when it has any) the one that removes the quantization: --fp8-keep-bf16 'MODULE' (kind
// fp8_keep_bf16) in place of keeping it in f32. by_local and backward (local errors, measured against the
// same FP8 GEMM in f32: the bf16 rounding alone) are left as they are.
void mark_fp8_linears(PrecisionSection& precision, const Fp8Section& fp8);

// The same for block-scaled Linears (a forward `linear` whose module has trained /blocks input or weight copies:
// --precision mxfp8|nvfp4 with --twin; probes/twin.h "Block-scaled Linears"): fp8 holds the block format ("nvfp4"),
// a by_jump entry of kind rounding becomes block_quantization with the same evidence and remedy (--fp8-keep-bf16
// 'MODULE', which keeps the Linear's GEMMs in bf16).
void mark_block_linears(PrecisionSection& precision, const BlockSection& blocks);

}  // namespace ampscope::analysis
