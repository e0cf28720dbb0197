// probes/analysis/blocks.h: the report's BLOCK-SCALED FORMATS section (analysis.h, BlockSection) from a trace's
// /blocks rows (trace::BlockRow: --precision mxfp8|nvfp4 runs, and --what-if statistics on other runs): per Linear
// operand, copy and format, the underflow and saturation fractions over the recorded steps, the widest block and
// where it lies, the spread of block scales and the quantization error; what-if copies kept apart from trained
// ones. Trace rows in, numbers out: no runtime. analyse(TraceReader&) fills Report::blocks with it.
//
//   analysis::BlockSection s = analysis::analyse_blocks(reader.blocks());
//   for (const analysis::BlockCopyRows& c : analysis::group_block_rows(rows)) ...   // per copy, in step order
#pragma once

#include <span>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// One operand copy's rows, for rules that judge a copy step by step (the block-scaled diagnoses): the rows of
// one (module, operand, copy, format, what_if), in step order (stable: rows of one step keep the trace's order).
struct BlockCopyRows {
  std::string module, operand, copy, format;
  bool what_if = false;
  std::vector<const trace::BlockRow*> rows;
};
// Rows in any order (they must outlive the result). Copies ordered by module, then operand (input, weight,
// grad_output), copy (rowwise, columnwise), format (mxfp8, nvfp4), trained before what-if.
std::vector<BlockCopyRows> group_block_rows(std::span<const trace::BlockRow> rows);

// The section: one BlockCopySummary per group_block_rows copy, in that order, and the worst by underflow and by
// saturation (of the nonzero values summed over the steps, trace::block_fraction).
BlockSection analyse_blocks(std::span<const trace::BlockRow> rows);

}  // namespace ampscope::analysis
