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
#include <string>
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

// The run's block-scaled options from RunInfo::config (JSON: precision, mx_scale, nvfp4_rht, fp8_keep_bf16); known
// false when the configuration does not name the precision or is not JSON.
BlockRunSettings block_run_settings(const std::string& config_json);

// The block-scaled findings (docs/fp8.md, "Block-scaled diagnoses"; analysis.h Fp8Finding, block_finding_kind) of a
// run's trained /blocks rows (what-if rows are measurements of GEMMs the run did not run: no finding): in kind order
// mx_floor_clipping, block_outlier, block_copy_mismatch (each in group_block_rows order), then block_error_dominates.
// Each carries the remedies the runtime applies and the run did not already use (`run`); analyse(TraceReader&)
// appends them to Report::fp8.findings, where `ampscope fix` picks FP8 findings up. `twin`: the trace's forward
// `linear` rows of /precision (a --twin run; any other rows are skipped): block_error_dominates is then measured by
// the f32 twin (Fp8Finding::twin), else from the /blocks rows.
std::vector<Fp8Finding> block_findings(std::span<const trace::BlockRow> rows, const BlockRunSettings& run = {},
                                       std::span<const trace::PrecisionRow> twin = {});

}  // namespace ampscope::analysis
