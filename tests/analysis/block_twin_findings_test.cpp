// block_error_dominates measured by the f32 twin (probes/analysis/blocks.h block_findings with /precision rows;
// docs/fp8.md "Block-scaled diagnoses"), and the PRECISION entries of block-scaled Linears (fp8.h mark_block_linears),
// on hand-made rows: the jumps, means and bounds worked by hand below, not taken from the code.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/analysis/analysis.h"
#include "probes/analysis/blocks.h"
#include "probes/analysis/fp8.h"

namespace ampscope::analysis {
namespace {

trace::BlockRow block(std::int64_t step, const char* module, const char* operand, const char* format, bool what_if = false) {
  trace::BlockRow r;
  r.step = step, r.module = module, r.operand = operand, r.copy = "rowwise", r.format = format, r.what_if = what_if;
  r.rows = 64, r.cols = 64, r.numel = 4096, r.nonzero = 4000, r.blocks = 256;
  r.rel_rms_error = 0.03;  // far under either u: the /blocks rule alone gives no finding
  return r;
}

// A forward linear row of the twin: accumulated mean error `acc` over inputs' `in` (bf16 output: 2^-8 = 0.00390625
// is the least the inputs' error counts as).
trace::PrecisionRow twin_row(std::int64_t step, const char* module, double acc, double in) {
  trace::PrecisionRow r;
  r.step = step, r.seq = 0, r.op = "linear", r.module = module, r.out_dtype = "bf16", r.local = true;
  r.local_mean_rel = 0.001, r.acc_mean_rel = acc, r.in_acc_mean_rel = in, r.numel = 100;
  return r;
}

std::vector<Fp8Finding> dominates(const std::vector<trace::BlockRow>& blocks, const std::vector<trace::PrecisionRow>& twin) {
  BlockRunSettings run;
  run.known = true;
  run.precision = "nvfp4";
  std::vector<Fp8Finding> out;
  for (Fp8Finding& f : block_findings(blocks, run, twin))
    if (f.kind == "block_error_dominates") out.push_back(f);
  return out;
}

// fc1 reads data (inputs' error 0.001, counted as 2^-8): jumps 0.3 / 2^-8 = 76.8 and 0.32 / 2^-8 = 81.92, mean 79.36,
// mean error 0.31 > 0.25 (E2M1's u). fc2: inputs 0.3, output 0.6 and 0.66: jumps 2 and 2.2, mean 2.1, though its
// output is further from f32 (0.63): fc1 is where the error entered. fc3 (bf16, no /blocks rows) jumps more and is
// not a candidate; nor is fc4, measured only by --what-if.
TEST(block_twin_findings_test, the_linear_with_the_largest_mean_jump_is_named_when_its_error_passes_u) {
  const std::vector<trace::BlockRow> blocks = {block(0, "fc1", "input", "nvfp4"), block(0, "fc2", "weight", "nvfp4"),
                                               block(0, "fc4", "input", "nvfp4", true)};
  std::vector<trace::PrecisionRow> twin = {twin_row(0, "fc1", 0.3, 0.001), twin_row(1, "fc1", 0.32, 0.001),
                                           twin_row(0, "fc2", 0.6, 0.3),   twin_row(1, "fc2", 0.66, 0.3),
                                           twin_row(0, "fc3", 0.9, 0.001), twin_row(0, "fc4", 0.9, 0.001)};
  trace::PrecisionRow backward = twin_row(0, "fc2", 5.0, 0.0);  // a backward row: local only, not a jump
  backward.phase = trace::Phase::backward;
  twin.push_back(backward);
  const auto f = dominates(blocks, twin);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].module, "fc1");
  EXPECT_TRUE(f[0].twin);
  EXPECT_EQ(f[0].operand, "output");
  EXPECT_EQ(f[0].format, "nvfp4");
  EXPECT_NEAR(f[0].jump, (76.8 + 81.92) / 2, 1e-9);
  EXPECT_NEAR(f[0].error, 0.31, 1e-12);
  EXPECT_NEAR(f[0].in_error, 0.001, 1e-15);
  EXPECT_DOUBLE_EQ(f[0].error_bound, 0.25);
  EXPECT_EQ(f[0].steps, 2);
  EXPECT_EQ(f[0].first_step, 0);
  EXPECT_EQ(f[0].last_step, 1);
  EXPECT_EQ(f[0].worst_step, 1);
  EXPECT_NEAR(f[0].worst_jump, 81.92, 1e-9);
  EXPECT_DOUBLE_EQ(f[0].worst_fraction, 0.32);
  EXPECT_EQ(f[0].next_module, "fc2");
  EXPECT_NEAR(f[0].next_jump, 2.1, 1e-12);
  EXPECT_NEAR(f[0].next_error, 0.63, 1e-12);
  ASSERT_EQ(f[0].remedies.size(), 1u);
  EXPECT_EQ(f[0].remedies[0].command_line, "--fp8-keep-bf16 fc1");

  // fc1's mean error exactly at u (0.24 and 0.26): not past it, no finding, although its jump is still the largest.
  twin[0].acc_mean_rel = 0.24, twin[1].acc_mean_rel = 0.26;
  EXPECT_TRUE(dominates(blocks, twin).empty());
  twin[1].acc_mean_rel = 0.2601;
  EXPECT_EQ(dominates(blocks, twin).size(), 1u);
}

// Without twin rows for the block-scaled Linears the /blocks rule decides: here fc1's copy at 0.26 > 0.25 (1.04 u).
// Twin rows of other Linears only (fc3 in bf16) do not count as a twin measurement.
TEST(block_twin_findings_test, without_twin_rows_of_the_block_linears_the_blocks_rule_decides) {
  std::vector<trace::BlockRow> blocks = {block(0, "fc1", "input", "nvfp4"), block(0, "fc2", "weight", "nvfp4")};
  blocks[0].rel_rms_error = 0.26;
  for (const std::vector<trace::PrecisionRow>& twin :
       {std::vector<trace::PrecisionRow>{}, std::vector<trace::PrecisionRow>{twin_row(0, "fc3", 0.9, 0.001)}}) {
    const auto f = dominates(blocks, twin);
    ASSERT_EQ(f.size(), 1u);
    EXPECT_FALSE(f[0].twin);
    EXPECT_EQ(f[0].module, "fc1");
    EXPECT_EQ(f[0].operand, "input");
    EXPECT_DOUBLE_EQ(f[0].error, 0.26);
  }
  // With twin rows for them, the twin decides, even where the /blocks rule would fire: fc1 jumps 0.1 / 2^-8 = 25.6 but
  // its output is 10% off f32, under u.
  EXPECT_TRUE(dominates(blocks, {twin_row(0, "fc1", 0.1, 0.001), twin_row(0, "fc2", 0.2, 0.1)}).empty());
}

// PRECISION: a block-scaled Linear's jump entry of kind rounding becomes block_quantization with its format and the
// --fp8-keep-bf16 remedy first (keeping it in f32 dropped); a bf16 Linear and a what-if-only one keep theirs.
TEST(block_twin_findings_test, precision_entries_of_block_linears_are_block_quantization) {
  BlockSection blocks;
  BlockCopySummary c;
  c.module = "fc1", c.operand = "input", c.copy = "rowwise", c.format = "mxfp8";
  blocks.copies.push_back(c);
  c.module = "fc4", c.what_if = true, c.format = "nvfp4";
  blocks.copies.push_back(c);
  PrecisionSection p;
  for (const char* module : {"fc1", "fc3", "fc4"}) {
    PrecisionEntry e;
    e.op = "linear", e.module = module, e.out_dtype = "bf16", e.kind = "rounding", e.local_error = 0.0013;
    e.evidence = "its output is 10% off (step 0, seq 0)";
    Remedy r;
    r.kind = "autocast_fp32";
    e.remedies.push_back(r);
    p.by_jump.push_back(e);
  }
  mark_block_linears(p, blocks);
  EXPECT_EQ(p.by_jump[0].kind, "block_quantization");
  EXPECT_EQ(p.by_jump[0].fp8, "mxfp8");
  ASSERT_EQ(p.by_jump[0].remedies.size(), 1u);
  EXPECT_EQ(p.by_jump[0].remedies[0].kind, "fp8_keep_bf16");
  EXPECT_EQ(p.by_jump[0].remedies[0].flag, "--fp8-keep-bf16 'fc1'");
  EXPECT_EQ(p.by_jump[0].evidence,
            "its output is 10% off; its input and weight were block-quantized to mxfp8 for the GEMM, and its own bf16 "
            "rounding is 0.0013 (its local error, against the same mxfp8 GEMM in f32): the rest of the jump is the "
            "quantization (step 0, seq 0)");
  for (std::size_t i : {1u, 2u}) {
    EXPECT_EQ(p.by_jump[i].kind, "rounding") << p.by_jump[i].module;
    EXPECT_EQ(p.by_jump[i].fp8, "") << p.by_jump[i].module;
    EXPECT_EQ(p.by_jump[i].remedies[0].kind, "autocast_fp32");
  }
}

}  // namespace
}  // namespace ampscope::analysis
