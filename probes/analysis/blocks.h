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

// The null model of a block WITHOUT an outlier (docs/fp8.md, "Block-scaled diagnoses": what it assumes): `values`
// iid Gaussian values whose block scale is set by their own amax M, a value rounding to 0 when under `zero_below` x
// M. zero_below is the largest the format's scale allows: NVFP4's E2M1 rounds under 0.25 (half its smallest
// non-zero 0.5; round-to-nearest-even puts 0.25 itself at 0) with M at 6 x the E4M3 block scale, which rounds M / 6
// to nearest (at most 2^-4 up): (1 + 2^-4) / 24; MXFP8's E4M3 rounds under 2^-10 (half its smallest subnormal) with M
// at 224 or more after scaling (the round-up rule's least; the floor rule's is 256): 2^-10 / 224 = 2^-9 / 448.
// `stochastic`: NVFP4 gradients are rounded stochastically, a value v under 0.5 (in elements) to 0 with chance
// 1 - v / 0.5.
struct BlockNull {
  std::int64_t values = 0;  // 16 (NVFP4 1x16), 256 (NVFP4 16x16 weight tiles), 32 (MXFP8 1x32)
  double zero_below = 0;
  bool stochastic = false;
};
// The null of a copy: its format's block (NVFP4 weights in tiles) and rounding (NVFP4 grad_output stochastic).
BlockNull block_null(const std::string& format, const std::string& operand);
// P(X >= k) for k = 0..values: X the values of a null block that round to 0 (its amax never does, so P(X >= values)
// = 0). Integrated in double over the amax M's density values x f(M) F(M)^(values-1) (f, F the half-normal's): given
// M, the other values are iid half-normal under M, each lost with chance q(M), so X is binomial(values - 1, q(M)).
std::vector<double> block_null_tail(const BlockNull& null);
// The outlier bar of a copy's step: the smallest count k whose chance of being reached by the worst of `blocks` null
// blocks, 1 - (1 - P(X >= k))^blocks, is at most kBlockFalseAlarm (block_null_tail of block_null(format, operand)).
std::int64_t block_flattened_bar(const std::string& format, const std::string& operand, std::int64_t blocks);
// The share of its values a null copy loses on average: E[X] / values = sum over k >= 1 of P(X >= k), / values.
double block_null_loss(const std::string& format, const std::string& operand);
// block_copy_mismatch's underflow bar for two copies' counts (underflow of nonzero each): kBlockMismatchZ standard
// errors of the gap of two binomial fractions with the pooled rate p, z sqrt(p (1 - p) (1 / nonzero_a + 1 /
// nonzero_b)), but never under `floor` (block_null_loss of the copies' 1-D block: docs/fp8.md says why).
double block_mismatch_bar(std::int64_t underflow_a, std::int64_t nonzero_a, std::int64_t underflow_b,
                          std::int64_t nonzero_b, double floor);

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
