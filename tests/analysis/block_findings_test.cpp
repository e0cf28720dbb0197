// The block-scaled findings (probes/analysis/blocks.h block_findings; docs/fp8.md "Block-scaled diagnoses") on
// hand-chosen /blocks rows: each rule fires just past its threshold and not at it (the thresholds worked by hand
// below, not taken from the code), what-if rows never give a finding, and no remedy repeats an option the run used
// (its recorded mx_scale, nvfp4_rht, fp8_keep_bf16) or one the runtime cannot apply to that copy.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/analysis/analysis.h"
#include "probes/analysis/blocks.h"

namespace ampscope::analysis {
namespace {

trace::BlockRow row(std::int64_t step, const char* module, const char* operand, const char* copy, const char* format) {
  trace::BlockRow r;
  r.step = step, r.module = module, r.operand = operand, r.copy = copy, r.format = format;
  r.rows = 64, r.cols = 64, r.numel = 4096, r.nonzero = 4000, r.blocks = format == std::string("mxfp8") ? 128 : 256;
  r.rel_rms_error = 0.03;
  return r;
}

std::vector<std::string> commands(const Fp8Finding& f) {
  std::vector<std::string> out;
  for (const Fp8Remedy& r : f.remedies) out.push_back(r.command_line);
  return out;
}

// Copies: the findings of a temporary outlive it.
std::vector<Fp8Finding> of_kind(const std::vector<Fp8Finding>& all, const std::string& kind) {
  std::vector<Fp8Finding> out;
  for (const Fp8Finding& f : all)
    if (f.kind == kind) out.push_back(f);
  return out;
}

BlockRunSettings settings(const char* precision, const char* mx_scale = "round-up", bool rht = true) {
  BlockRunSettings s;
  s.known = true;
  s.precision = precision;
  s.mx_scale = mx_scale;
  s.nvfp4_rht = rht;
  return s;
}

// E4M3's unit roundoff is 2^-4 = 0.0625 (3 mantissa bits: half a spacing of 2^-3 over 1). A clipped step with an
// error of exactly 0.0625 is rounding's worth: no finding; 0.0626 is one.
TEST(block_findings_test, floor_clipping_needs_saturated_values_and_an_error_past_e4m3s_unit_roundoff) {
  std::vector<trace::BlockRow> rows;
  trace::BlockRow a = row(0, "fc1", "input", "rowwise", "mxfp8");
  a.saturated = 60, a.blocks_clipped = 58, a.rel_rms_error = 0.0625;
  trace::BlockRow b = a;
  b.step = 1, b.rel_rms_error = 0.0626, b.saturated = 64, b.blocks_clipped = 64;
  trace::BlockRow c = a;
  c.step = 2, c.saturated = 0, c.blocks_clipped = 0, c.rel_rms_error = 0.2;  // a large error without clipping
  trace::BlockRow w = b;
  w.what_if = true;  // measured only: never a finding
  rows = {a, b, c, w};
  const std::vector<Fp8Finding> all = block_findings(rows, settings("mxfp8", "floor"));
  const auto f = of_kind(all, "mx_floor_clipping");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].module, "fc1");
  EXPECT_EQ(f[0].copy, "rowwise");
  EXPECT_EQ(f[0].first_step, 1);
  EXPECT_EQ(f[0].last_step, 1);
  EXPECT_EQ(f[0].count, 64);
  EXPECT_EQ(f[0].nonzero, 4000);
  EXPECT_EQ(f[0].blocks_clipped, 64);
  EXPECT_DOUBLE_EQ(f[0].fraction, 64.0 / 4000.0);
  EXPECT_DOUBLE_EQ(f[0].error, 0.0626);
  EXPECT_EQ(commands(f[0]), std::vector<std::string>{"--mx-scale round-up"});
  // A run that already rounds up is offered nothing for it (it cannot clip a finite block; here a hand-made row).
  const auto g = of_kind(block_findings(rows, settings("mxfp8", "round-up")), "mx_floor_clipping");
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].remedies.empty());
}

// E2M1: largest element 6, smallest non-zero 0.5, values under 0.25 (of the block's scale) round to 0: a block can
// hold log2(6 / 0.25) = log2 24 = 4.585 binades. A 1x16 block is flattened when it loses more than 12 values, and
// the copy's loss must pass 2% of its nonzero values (80 of 4000).
TEST(block_findings_test, an_outlier_flattens_a_block_past_the_elements_range_and_half_its_values) {
  trace::BlockRow base = row(0, "fc1", "input", "columnwise", "nvfp4");
  base.max_block_range = 4.6, base.worst_block = 5, base.worst_block_row = 0, base.worst_block_col = 80;
  base.worst_block_underflow = 13, base.underflow = 81;
  std::vector<trace::BlockRow> edges;
  trace::BlockRow r = base;
  r.max_block_range = std::log2(24.0) - 1e-9;  // within the element's range
  edges.push_back(r);
  r = base, r.step = 1, r.worst_block_underflow = 12;  // three quarters of the block: trimmed, not flattened
  edges.push_back(r);
  r = base, r.step = 2, r.underflow = 80;  // exactly 2% of the copy
  edges.push_back(r);
  EXPECT_TRUE(of_kind(block_findings(edges, settings("nvfp4", "round-up", false)), "block_outlier").empty());

  std::vector<trace::BlockRow> rows = edges;
  trace::BlockRow hit = base;
  hit.step = 3;
  rows.push_back(hit);
  trace::BlockRow worse = base;
  worse.step = 4, worse.worst_block_underflow = 15, worse.worst_block_row = 3, worse.worst_block_col = 16,
  worse.max_block_range = 9.5, worse.underflow = 200;
  rows.push_back(worse);
  const auto f = of_kind(block_findings(rows, settings("nvfp4", "round-up", false)), "block_outlier");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].first_step, 3);
  EXPECT_EQ(f[0].last_step, 4);
  EXPECT_EQ(f[0].count, 281);
  EXPECT_EQ(f[0].nonzero, 8000);
  EXPECT_EQ(f[0].block_step, 4);
  EXPECT_EQ(f[0].block_row, 3);
  EXPECT_EQ(f[0].block_col, 16);
  EXPECT_EQ(f[0].block_zeroed, 15);
  EXPECT_EQ(f[0].block_values, 16);
  EXPECT_DOUBLE_EQ(f[0].block_range, 9.5);
  EXPECT_NEAR(f[0].range_bound, std::log2(24.0), 1e-12);
  // A columnwise NVFP4 input copy is a wgrad operand: the transform applies, and the run had it off.
  EXPECT_EQ(commands(f[0]), (std::vector<std::string>{"drop --nvfp4-no-rht", "--fp8-keep-bf16 fc1"}));
  // With the transform on, it is not offered again; with fc1 already kept, neither is that.
  BlockRunSettings on = settings("nvfp4");
  on.keep_bf16 = {"fc1"};
  const auto g = of_kind(block_findings(rows, on), "block_outlier");
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0].remedies.empty());
}

// The rowwise copy (fprop) and the transform: never on rowwise copies nor on weights. MXFP8 blocks hold 32 values
// (flattened past 24 lost)
// and E4M3's range is log2(448 / 2^-10) = 18.81 binades; per-tensor FP8 is offered for MXFP8 runs.
TEST(block_findings_test, outlier_remedies_follow_the_copy_and_the_format) {
  trace::BlockRow nv = row(0, "fc2", "input", "rowwise", "nvfp4");
  nv.max_block_range = 20, nv.worst_block = 0, nv.worst_block_underflow = 15, nv.underflow = 900;
  trace::BlockRow mx = row(0, "fc1", "weight", "rowwise", "mxfp8");
  mx.max_block_range = 18.8, mx.worst_block = 0, mx.worst_block_underflow = 25, mx.underflow = 900;
  trace::BlockRow mx2 = mx;
  mx2.step = 1, mx2.max_block_range = 18.9;
  const auto f = of_kind(block_findings(std::vector<trace::BlockRow>{mx, mx2}, settings("mxfp8")), "block_outlier");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].module, "fc1");
  EXPECT_EQ(f[0].first_step, 1);  // 18.8 binades fit E4M3's 18.81
  EXPECT_EQ(f[0].block_values, 32);
  EXPECT_EQ(commands(f[0]), (std::vector<std::string>{"--fp8-keep-bf16 fc1", "--precision fp8"}));
  const auto g = of_kind(block_findings(std::vector<trace::BlockRow>{nv}, settings("nvfp4", "round-up", false)), "block_outlier");
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].module, "fc2");
  EXPECT_EQ(commands(g[0]), std::vector<std::string>{"--fp8-keep-bf16 fc2"});  // rowwise: no transform there
}

// Two copies of a tensor rounded alone stay within u each: apart by more than u in error (E2M1: 0.25) or by more
// than 10 points in underflow, one lost what the other kept. grad_output's copies both feed the backward: not
// compared.
TEST(block_findings_test, rowwise_and_columnwise_copies_apart_past_u_or_two_percent_underflow) {
  trace::BlockRow r0 = row(0, "fc1", "input", "rowwise", "nvfp4");
  trace::BlockRow c0 = row(0, "fc1", "input", "columnwise", "nvfp4");
  r0.rel_rms_error = 0.05, c0.rel_rms_error = 0.30;  // 0.25 apart: not more than u
  r0.underflow = 100, c0.underflow = 500;             // 2.5% and 12.5%: 10 points apart, not more
  trace::BlockRow r1 = r0, c1 = c0;
  r1.step = c1.step = 1;
  c1.underflow = 501;  // 12.525%: more than 10 points
  trace::BlockRow g0 = row(1, "fc1", "grad_output", "rowwise", "nvfp4"), g1 = row(1, "fc1", "grad_output", "columnwise", "nvfp4");
  g0.rel_rms_error = 0.01, g1.rel_rms_error = 0.9;
  const std::vector<trace::BlockRow> rows{r0, c0, r1, c1, g0, g1};
  const auto f = of_kind(block_findings(rows, settings("nvfp4")), "block_copy_mismatch");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].operand, "input");
  EXPECT_EQ(f[0].first_step, 1);
  EXPECT_EQ(f[0].steps, 1);
  EXPECT_EQ(f[0].copy, "columnwise");  // set apart by underflow: the copy that lost more
  EXPECT_DOUBLE_EQ(f[0].worst_fraction, 501.0 / 4000.0);
  EXPECT_DOUBLE_EQ(f[0].other_fraction, 100.0 / 4000.0);
  EXPECT_EQ(commands(f[0]), std::vector<std::string>{"--fp8-keep-bf16 fc1"});  // NVFP4: no MX rule to change
}

// fp8_error_dominates' rule with the element's u: NVFP4's 0.25, MXFP8's 0.0625. fc1 (MXFP8-sized error 0.07, 1.12
// u) against fc2 (NVFP4 0.26, 1.04 u): fc1 dominates by error / u, and its remedy keeps it in bf16.
TEST(block_findings_test, the_linear_whose_error_dominates_is_judged_in_units_of_its_elements_roundoff) {
  trace::BlockRow a = row(0, "fc1", "weight", "rowwise", "mxfp8");
  a.rel_rms_error = 0.07;
  trace::BlockRow b = row(0, "fc2", "grad_output", "columnwise", "nvfp4");
  b.rel_rms_error = 0.26;
  const auto f = of_kind(block_findings(std::vector<trace::BlockRow>{a, b}, settings("mxfp8")), "block_error_dominates");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].module, "fc1");
  EXPECT_DOUBLE_EQ(f[0].error, 0.07);
  EXPECT_DOUBLE_EQ(f[0].error_bound, 0.0625);
  EXPECT_EQ(f[0].next_module, "fc2");
  EXPECT_DOUBLE_EQ(f[0].next_error, 0.26);
  EXPECT_EQ(commands(f[0]), std::vector<std::string>{"--fp8-keep-bf16 fc1"});
  b.rel_rms_error = 0.25, a.rel_rms_error = 0.0625;  // both at u: rounding's worth
  EXPECT_TRUE(of_kind(block_findings(std::vector<trace::BlockRow>{a, b}, settings("mxfp8")), "block_error_dominates").empty());
}

TEST(block_findings_test, run_settings_come_from_the_recorded_configuration) {
  const BlockRunSettings s = block_run_settings(
      R"({"precision": "nvfp4", "nvfp4_rht": false, "fp8_keep_bf16": ["fc3", 7], "mx_scale": "floor"})");
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.precision, "nvfp4");
  EXPECT_FALSE(s.nvfp4_rht);
  EXPECT_EQ(s.mx_scale, "floor");
  EXPECT_EQ(s.keep_bf16, std::vector<std::string>{"fc3"});
  EXPECT_FALSE(block_run_settings("not json").known);
  EXPECT_FALSE(block_run_settings(R"({"steps": 3})").known);
}

}  // namespace
}  // namespace ampscope::analysis
