// The block-scaled findings (probes/analysis/blocks.h block_findings; docs/fp8.md "Block-scaled diagnoses") on
// hand-chosen /blocks rows: each rule fires just past its threshold and not at it (the thresholds worked by hand
// below, not taken from the code), what-if rows never give a finding, and no remedy repeats an option the run used
// (its recorded mx_scale, nvfp4_rht, fp8_keep_bf16) or one the runtime cannot apply to that copy.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/block_scaled.h"
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
  r = base, r.step = 1, r.worst_block_underflow = 8;  // what the worst of 256 Gaussian blocks reaches: trimmed
  edges.push_back(r);
  r = base, r.step = 2, r.underflow = 80;  // exactly 2% of the copy
  edges.push_back(r);
  EXPECT_TRUE(of_kind(block_findings(edges, settings("nvfp4", "round-up", false)), "block_outlier").empty());

  std::vector<trace::BlockRow> rows = edges;
  trace::BlockRow hit = base;
  hit.step = 3, hit.worst_block_underflow = 9;
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
  EXPECT_EQ(f[0].block_bar, 9);
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
// (flattened from 2 lost: block_null_bars_are_the_tails_worked_independently)
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
// than the underflow bar, one lost what the other kept. The bar, 4000 nonzero values each: at the pooled rate of
// 100 and 400 lost, p = 0.0625, z sqrt(p (1 - p) 2 / 4000) = 3.2905 x 0.0054127 = 1.781 points, under the floor,
// a null NVFP4 copy's loss (7.23%, block_null_loss): 7.5 points apart is past it, 7 points is not. grad_output's
// copies both feed the backward: not compared.
TEST(block_findings_test, rowwise_and_columnwise_copies_apart_past_u_or_the_underflow_bar) {
  trace::BlockRow r0 = row(0, "fc1", "input", "rowwise", "nvfp4");
  trace::BlockRow c0 = row(0, "fc1", "input", "columnwise", "nvfp4");
  r0.rel_rms_error = 0.05, c0.rel_rms_error = 0.30;  // 0.25 apart: not more than u
  r0.underflow = 100, c0.underflow = 380;             // 2.5% and 9.5%: 7 points apart, under the floor
  trace::BlockRow r1 = r0, c1 = c0;
  r1.step = c1.step = 1;
  c1.underflow = 400;  // 10%: 7.5 points
  trace::BlockRow g0 = row(1, "fc1", "grad_output", "rowwise", "nvfp4"), g1 = row(1, "fc1", "grad_output", "columnwise", "nvfp4");
  g0.rel_rms_error = 0.01, g1.rel_rms_error = 0.9;
  const std::vector<trace::BlockRow> rows{r0, c0, r1, c1, g0, g1};
  const auto f = of_kind(block_findings(rows, settings("nvfp4")), "block_copy_mismatch");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].operand, "input");
  EXPECT_EQ(f[0].first_step, 1);
  EXPECT_EQ(f[0].steps, 1);
  EXPECT_EQ(f[0].copy, "columnwise");  // set apart by underflow: the copy that lost more
  EXPECT_DOUBLE_EQ(f[0].worst_fraction, 400.0 / 4000.0);
  EXPECT_DOUBLE_EQ(f[0].other_fraction, 100.0 / 4000.0);
  EXPECT_NEAR(f[0].threshold, 0.0723, 5e-4);
  EXPECT_EQ(commands(f[0]), std::vector<std::string>{"--fp8-keep-bf16 fc1"});  // NVFP4: no MX rule to change
}

// Past the floor, the counts set the bar: MXFP8's null loses 8e-6 of a copy, so two copies of 10^4 and 10^6 nonzero
// values with 1% and 1.5% lost are judged by z sigma: p = (100 + 15000) / 1010000, sigma = sqrt(p (1 - p) (1e-4 +
// 1e-6)) = 0.0012196, bar 3.2905 sigma = 0.40131 points; 0.5 points apart is past it; at 100 times fewer values
// each the bar is 10 times wider and the same gap is not.
TEST(block_findings_test, the_underflow_bar_narrows_with_the_copies_counts) {
  EXPECT_NEAR(block_mismatch_bar(100, 10000, 15000, 1000000, 0.0), 0.0040131, 2e-7);
  trace::BlockRow r = row(0, "fc2", "input", "rowwise", "mxfp8"), c = row(0, "fc2", "input", "columnwise", "mxfp8");
  r.nonzero = 10000, r.underflow = 100, c.nonzero = 1000000, c.underflow = 15000;
  EXPECT_EQ(of_kind(block_findings(std::vector<trace::BlockRow>{r, c}, settings("mxfp8")), "block_copy_mismatch").size(), 1u);
  r.nonzero = 100, r.underflow = 1, c.nonzero = 10000, c.underflow = 150;
  EXPECT_TRUE(of_kind(block_findings(std::vector<trace::BlockRow>{r, c}, settings("mxfp8")), "block_copy_mismatch").empty());
}

// The null's tails against a Monte-Carlo of the model itself (blocks of Gaussian values, each value lost when under
// zero_below x the block's amax; stochastic: lost with chance 1 - |x| / (2 zero_below amax) under twice that), within
// 4 standard errors of the Monte-Carlo's own, and each tail at most what the real quantizers lose on Gaussian blocks
// (zero_below is the largest threshold their scales allow).
double mc_tail(std::int64_t n, double zero_below, bool stochastic, std::int64_t k, int blocks, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  std::vector<double> v(static_cast<std::size_t>(n));
  int hits = 0;
  for (int b = 0; b < blocks; ++b) {
    double m = 0;
    for (double& x : v) x = std::fabs(normal(gen)), m = std::max(m, x);
    std::int64_t lost = 0;
    for (double x : v) {
      if (x == m) continue;
      if (!stochastic) lost += x < zero_below * m ? 1 : 0;
      else lost += x < 2 * zero_below * m && uniform(gen) >= x / (2 * zero_below * m) ? 1 : 0;
    }
    hits += lost >= k ? 1 : 0;
  }
  return static_cast<double>(hits) / blocks;
}

void expect_tail_near_mc(const BlockNull& null, std::int64_t k, int blocks) {
  const double p = mc_tail(null.values, null.zero_below, null.stochastic, k, blocks, 7 + k);
  const double se = std::sqrt(std::max(p * (1 - p), 1.0 / blocks) / blocks);
  EXPECT_NEAR(block_null_tail(null)[static_cast<std::size_t>(k)], p, 4 * se)
      << "values " << null.values << " stochastic " << null.stochastic << " k " << k;
}

TEST(block_findings_test, the_null_tails_agree_with_a_monte_carlo_of_the_model) {
  for (std::int64_t k : {1, 2, 3, 5}) expect_tail_near_mc(block_null("nvfp4", "input"), k, 200000);
  for (std::int64_t k : {1, 3, 5}) expect_tail_near_mc(block_null("nvfp4", "grad_output"), k, 200000);
  expect_tail_near_mc(block_null("mxfp8", "input"), 1, 400000);
  for (std::int64_t k : {20, 28, 40}) expect_tail_near_mc(block_null("nvfp4", "weight"), k, 20000);
  const std::vector<double> t = block_null_tail(block_null("nvfp4", "input"));
  EXPECT_DOUBLE_EQ(t[0], 1.0);
  EXPECT_EQ(t[16], 0.0);  // the amax never rounds to 0
}

TEST(block_findings_test, the_real_quantizers_lose_no_more_than_the_null_on_gaussian_blocks) {
  constexpr std::int64_t kRows = 100000;
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<std::size_t>(kRows * 32));
  for (float& v : x) v = normal(gen);
  const auto check = [&](const std::vector<float>& q, std::int64_t n, const BlockNull& null) {
    const std::vector<double> tail = block_null_tail(null);
    for (std::int64_t k = 1; k <= 3; ++k) {
      std::int64_t hits = 0, blocks = 0;
      for (std::size_t b = 0; b + static_cast<std::size_t>(n) <= q.size(); b += static_cast<std::size_t>(n), ++blocks) {
        std::int64_t lost = 0;
        for (std::size_t i = b; i < b + static_cast<std::size_t>(n); ++i) lost += x[i] != 0 && q[i] == 0 ? 1 : 0;
        hits += lost >= k ? 1 : 0;
      }
      const double p = static_cast<double>(hits) / static_cast<double>(blocks);
      const double se = std::sqrt(std::max(p * (1 - p), 1.0 / static_cast<double>(blocks)) / static_cast<double>(blocks));
      EXPECT_LE(p, tail[static_cast<std::size_t>(k)] + 4 * se) << "values " << n << " k " << k;
    }
  };
  check(dequantize_nvfp4(quantize_nvfp4(x, kRows * 2, 16, {})), 16, block_null("nvfp4", "input"));
  check(dequantize_mxfp8(quantize_mxfp8(x, kRows, 32, {})), 32, block_null("mxfp8", "input"));
}

// The bars the rules use, from the tails worked independently (numpy: the same integral, binomial pmf by lgamma, on
// 6000 points; docs/fp8.md lists them): NVFP4 1x16 P(X >= 8) = 1.18e-5, P(X >= 9) = 1.04e-6, P(X >= 10) = 7.4e-8,
// P(X >= 11) = 4.2e-9; MXFP8 P(X >= 1) = 2.6e-4, P(X >= 2) = 3.4e-8, P(X >= 3) = 2.9e-12. The worst of B blocks
// stays under 1e-3 when a block's tail is under about 1e-3 / B.
TEST(block_findings_test, block_null_bars_are_the_tails_worked_independently) {
  const std::vector<double> nv = block_null_tail(block_null("nvfp4", "input"));
  EXPECT_NEAR(nv[8], 1.18e-5, 0.01e-5);
  EXPECT_NEAR(nv[9], 1.04e-6, 0.01e-6);
  EXPECT_NEAR(nv[10], 7.42e-8, 0.01e-8);
  const std::vector<double> mx = block_null_tail(block_null("mxfp8", "input"));
  EXPECT_NEAR(mx[1], 2.60e-4, 0.01e-4);
  EXPECT_NEAR(mx[2], 3.36e-8, 0.01e-8);
  EXPECT_EQ(block_flattened_bar("nvfp4", "input", 1), 6);       // P(X >= 6) = 8.5e-4 <= 1e-3 (P(X >= 5) = 5.4e-3)
  EXPECT_EQ(block_flattened_bar("nvfp4", "input", 256), 9);     // 1.04e-6 <= 3.9e-6
  EXPECT_EQ(block_flattened_bar("nvfp4", "input", 1024), 10);   // 1.04e-6 > 9.8e-7
  EXPECT_EQ(block_flattened_bar("nvfp4", "input", 16384), 11);  // 7.4e-8 > 6.1e-8
  EXPECT_EQ(block_flattened_bar("mxfp8", "input", 128), 2);
  EXPECT_EQ(block_flattened_bar("mxfp8", "input", 40000), 3);   // 3.36e-8 > 2.5e-8
  EXPECT_NEAR(block_null_loss("nvfp4", "input"), 0.0723, 5e-4);
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
