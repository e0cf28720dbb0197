// tests/analysis/fp8_findings_test.cpp: the FP8 findings of analyse_fp8 (docs/fp8.md, "Diagnoses") on hand-built
// /fp8 rows, every number worked by hand: the thresholds are strict (exactly 2% or 1% is not a finding), only an
// e4m3 grad_output can underflow-flag, steps come in any order, and the margin is the smallest integer M >= 1 with
// amax * scale / 2^M <= the format's max. tests/train/fp8_findings_test.sh covers real runs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "probes/analysis/fp8.h"

namespace ampscope::analysis {
namespace {

trace::Fp8Row row(std::int64_t step, std::string module, std::string operand, std::string format, std::int64_t nonzero,
                  std::int64_t underflow, std::int64_t saturated, double amax = 1, double scale = 1) {
  trace::Fp8Row r;
  r.step = step;
  r.module = std::move(module);
  r.operand = std::move(operand);
  r.format = std::move(format);
  r.numel = nonzero;
  r.nonzero = nonzero;
  r.underflow = underflow;
  r.saturated = saturated;
  r.amax = amax;
  r.scale = scale;
  return r;
}

TEST(Fp8Findings, GradUnderflowInE4m3IsStrictlyAboveTwoPercentPerStep) {
  const std::vector<trace::Fp8Row> rows = {
      row(3, "fc1", "grad_output", "e4m3", 1000, 21, 0),  // 2.1%: flagged
      row(1, "fc1", "grad_output", "e4m3", 1000, 20, 0),  // exactly 2%: not
      row(2, "fc1", "grad_output", "e4m3", 200, 50, 0),   // 25%: flagged, the worst
      row(4, "fc1", "grad_output", "e4m3", 0, 0, 0),      // no nonzero values: not
      row(1, "fc2", "grad_output", "e5m2", 100, 90, 0),   // e5m2: never this finding
      row(1, "fc2", "input", "e4m3", 100, 90, 0),         // not a gradient
  };
  const Fp8Section s = analyse_fp8(rows);
  ASSERT_EQ(s.findings.size(), 1u);
  const Fp8Finding& f = s.findings[0];
  EXPECT_EQ(f.kind, "e4m3_grad_underflow");
  EXPECT_EQ(f.module, "fc1");
  EXPECT_EQ(f.operand, "grad_output");
  EXPECT_EQ(f.first_step, 2);
  EXPECT_EQ(f.last_step, 3);
  EXPECT_EQ(f.steps, 2);
  EXPECT_EQ(f.nonzero, 1200);
  EXPECT_EQ(f.count, 71);
  EXPECT_DOUBLE_EQ(f.fraction, 71.0 / 1200.0);
  EXPECT_EQ(f.worst_step, 2);
  EXPECT_DOUBLE_EQ(f.worst_fraction, 0.25);
  ASSERT_EQ(f.remedies.size(), 1u);
  EXPECT_EQ(f.remedies[0].command_line, "--fp8-format hybrid");
}

TEST(Fp8Findings, SaturationMarginBringsScaledAmaxUnderMax) {
  const double big = 448.0 * 2.0;  // exactly twice E4M3's max: margin 1
  const std::vector<trace::Fp8Row> rows = {
      row(0, "a", "weight", "e4m3", 1000, 0, 11, 4.0, big / 4.0),                    // 1.1%: margin 1
      row(0, "b", "weight", "e4m3", 1000, 0, 10, 8.0, 448.0),                        // exactly 1%: not
      row(0, "c", "input", "e4m3", 1000, 0, 500, big * 1.001, 1.0),  // just over 2x: margin 2
      row(0, "d", "grad_output", "e5m2", 100, 0, 2, 57344.0 * 5.0, 1.0),             // 5x: margin 3
      row(0, "e", "weight", "e4m3", 100, 0, 2, std::numeric_limits<double>::infinity(), 1.0),  // no margin fits
      row(0, "f", "weight", "e4m3", 100, 0, 2, 448.0, 1.0),  // at max (a rounding past it): margin still 1
  };
  const Fp8Section s = analyse_fp8(rows);
  ASSERT_EQ(s.findings.size(), 5u);
  const auto lines = [](const Fp8Finding& f) {
    std::vector<std::string> out;
    for (const Fp8Remedy& r : f.remedies) out.push_back(r.command_line);
    return out;
  };
  EXPECT_EQ(s.findings[0].module, "a");
  EXPECT_EQ(s.findings[0].kind, "saturation");
  EXPECT_EQ(s.findings[0].margin, 1);
  EXPECT_EQ(s.findings[0].count, 11);
  EXPECT_EQ(lines(s.findings[0]), (std::vector<std::string>{"--fp8-margin 1", "--fp8-recipe current"}));
  EXPECT_EQ(s.findings[1].module, "c");
  EXPECT_EQ(s.findings[1].margin, 2);
  EXPECT_EQ(s.findings[2].module, "d");
  EXPECT_EQ(s.findings[2].margin, 3);
  EXPECT_DOUBLE_EQ(s.findings[2].max_scaled_amax, 57344.0 * 5.0);
  EXPECT_EQ(s.findings[3].module, "e");
  EXPECT_EQ(lines(s.findings[3]), (std::vector<std::string>{"--fp8-recipe current"}));
  EXPECT_EQ(s.findings[4].module, "f");
  EXPECT_EQ(s.findings[4].margin, 1);
}

TEST(Fp8Findings, UnderflowFindingsComeBeforeSaturation) {
  const std::vector<trace::Fp8Row> rows = {
      row(0, "a", "weight", "e4m3", 100, 0, 50, 896.0, 1.0),
      row(0, "z", "grad_output", "e4m3", 100, 50, 50, 896.0, 1.0),
  };
  const Fp8Section s = analyse_fp8(rows);
  ASSERT_EQ(s.findings.size(), 3u);
  EXPECT_EQ(s.findings[0].kind, "e4m3_grad_underflow");
  EXPECT_EQ(s.findings[0].module, "z");
  EXPECT_EQ(s.findings[1].kind, "saturation");
  EXPECT_EQ(s.findings[1].module, "a");
  EXPECT_EQ(s.findings[2].kind, "saturation");
  EXPECT_EQ(s.findings[2].module, "z");
  EXPECT_TRUE(analyse_fp8(std::vector<trace::Fp8Row>{}).findings.empty());
}

}  // namespace
}  // namespace ampscope::analysis
