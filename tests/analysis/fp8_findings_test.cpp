// tests/analysis/fp8_findings_test.cpp: the FP8 findings of analyse_fp8 (docs/fp8.md, "Diagnoses") on hand-built
// /fp8 rows, every number worked by hand: the thresholds are strict (exactly 2% or 1% is not a finding), only an
// e4m3 grad_output can underflow-flag, steps come in any order, and the margin is the smallest integer M >= 1 with
// amax * scale / 2^M <= the format's max. tests/train/fp8_findings_test.sh covers real runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
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
  // No error recorded (NaN, as for a cast without finite values): the saturation tests below that are about the
  // fraction, the margin and the order are judged by the fraction alone; SaturationNeedsAnErrorAboveRounding sets it.
  r.rel_rms_error = std::numeric_limits<double>::quiet_NaN();
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

// Pointers into `s`: keep the section alive while they are used.
// One operand's rows for the stale-scale tests: (step, amax, scale, underflow) of 1000 nonzero values each.
struct Cast {
  std::int64_t step;
  double amax, scale;
  std::int64_t underflow;
};
std::vector<trace::Fp8Row> operand_rows(const std::string& module, const std::vector<Cast>& casts,
                                        std::string operand = "input", std::string format = "e4m3") {
  std::vector<trace::Fp8Row> out;
  for (const Cast& c : casts) out.push_back(row(c.step, module, operand, format, 1000, c.underflow, 0, c.amax, c.scale));
  return out;
}
Fp8RunSettings delayed_max(std::int64_t history = 1024, std::int64_t margin = 0) {
  Fp8RunSettings s;
  s.known = true;
  s.history = history;
  s.margin = margin;
  return s;
}
std::vector<std::string> remedy_lines(const Fp8Finding& f) {
  std::vector<std::string> out;
  for (const Fp8Remedy& r : f.remedies) out.push_back(r.command_line);
  return out;
}
std::vector<const Fp8Finding*> of_kind(const Fp8Section& s, const std::string& kind) {
  std::vector<const Fp8Finding*> out;
  for (const Fp8Finding& f : s.findings)
    if (f.kind == kind) out.push_back(&f);
  return out;
}

// E4M3, max 448. Steady amax 2 (scale 448 / 2 = 224); step 2 spikes to 64 (32x), so steps 3 on are cast with
// 448 / 64 = 7. Underflow of 1000 nonzero values: 0 through the spike step, then 50, 21, 30 (raised 5%, 2.1%, 3%:
// each more than 2%), then 20 (exactly 2% more than the spike step's 0: not more than 2%, the stretch ends), then
// 90 (after the stretch: not counted).
TEST(Fp8Findings, StaleScaleHeldThreeStepsAfterASpike) {
  const std::vector<trace::Fp8Row> rows = operand_rows(
      "fc1", {{0, 2, 1, 0}, {1, 2, 224, 0}, {2, 64, 224, 0}, {3, 2, 7, 50}, {4, 4, 7, 21}, {5, 2, 7, 30}, {6, 2, 7, 20},
              {7, 2, 7, 90}});
  const Fp8Section s = analyse_fp8(rows, delayed_max());
  const auto stale = of_kind(s, "stale_scale");
  ASSERT_EQ(stale.size(), 1u);
  const Fp8Finding& f = *stale[0];
  EXPECT_EQ(f.module, "fc1");
  EXPECT_EQ(f.operand, "input");
  EXPECT_EQ(f.spike_step, 2);
  EXPECT_EQ(f.amax_before, 2.0);
  EXPECT_EQ(f.amax_spike, 64.0);
  EXPECT_EQ(f.scale_before, 224.0);
  EXPECT_EQ(f.scale_held, 7.0);
  EXPECT_EQ(f.underflow_before, 0.0);
  EXPECT_DOUBLE_EQ(f.underflow_after, 0.05);
  EXPECT_EQ(f.first_step, 3);
  EXPECT_EQ(f.last_step, 5);
  EXPECT_EQ(f.steps, 3);
  EXPECT_EQ(f.nonzero, 3000);
  EXPECT_EQ(f.count, 101);
  EXPECT_DOUBLE_EQ(f.fraction, 101.0 / 3000.0);
  EXPECT_EQ(f.worst_step, 3);
  EXPECT_DOUBLE_EQ(f.worst_fraction, 0.05);
  EXPECT_EQ(f.window, 1024);
  EXPECT_EQ(remedy_lines(f), (std::vector<std::string>{"--fp8-amax-algo most_recent", "--fp8-amax-history 2",
                                                       "--fp8-recipe current"}));
  // Unknown settings (a trace without the fp8_* configuration): no window, every remedy offered.
  const Fp8Section unknown_section = analyse_fp8(rows);
  const auto unknown = of_kind(unknown_section, "stale_scale");
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_EQ(unknown[0]->window, 0);
  EXPECT_EQ(unknown[0]->remedies.size(), 3u);
}

TEST(Fp8Findings, StaleScaleEdges) {
  // Each module one case; all steady at amax 2 around the spike in step 2, 25 underflows (2.5%) after it.
  const auto held = [](const std::string& m, double before, double spike, double held_scale, int steps_held,
                       double after = 2) {
    std::vector<Cast> c = {{1, before, 224, 0}, {2, spike, 224, 0}};
    for (int i = 0; i < steps_held; ++i) c.push_back({3 + i, i == 0 ? after : 2, held_scale, 25});
    c.push_back({3 + steps_held, 2, 224, 0});
    return operand_rows(m, c);
  };
  std::vector<trace::Fp8Row> rows;
  auto add = [&](std::vector<trace::Fp8Row> r) { rows.insert(rows.end(), r.begin(), r.end()); };
  add(held("ratio2", 2, 4, 112, 3));                // exactly 2x (448 / 4 = 112): a spike
  add(held("under2", 2, 3.99, 448 / 3.99, 3));      // under 2x: not
  add(held("zero_before", 0, 64, 7, 3));            // amax 0 before (the module did not run): no measure
  add(held("inf_spike", 2, INFINITY, 224, 3));      // inf: the recipe keeps the scale; not
  add(held("nan_spike", 2, NAN, 224, 3));           // NaN: skipped, scale kept; not
  add(held("two_steps", 2, 64, 7, 2));              // held two steps (history 2's lag): not
  add(held("not_from_spike", 2, 64, 7.5, 3));       // the held scale is not 448 / 2^m / 64: not
  add(held("margin1", 2, 64, 3.5, 3));              // 448 / 2 / 64: the run's margin 1; a spike
  add(held("stays_high", 2, 64, 7, 3, 40));         // the step after keeps amax 40 (> 64 / 2): growth, not a spike
  // A gap in the recorded steps (--sample-every): step 3 not recorded, so the step after the spike is unknown.
  add(operand_rows("gap", {{1, 2, 224, 0}, {2, 64, 224, 0}, {4, 2, 7, 25}, {5, 2, 7, 25}, {6, 2, 7, 25}, {7, 2, 7, 25}}));
  const Fp8Section s = analyse_fp8(rows, delayed_max(1024, 1));
  std::vector<std::string> modules;
  for (const Fp8Finding* f : of_kind(s, "stale_scale")) modules.push_back(f->module);
  EXPECT_EQ(modules, (std::vector<std::string>{"margin1", "ratio2"}));
  // Options the run used are not offered: most_recent (then no history either), a history already <= 2, current.
  Fp8RunSettings recent = delayed_max();
  recent.algo = "most_recent";
  const Fp8Section recent_section = analyse_fp8(held("x", 2, 64, 7, 3), recent);
  const auto r = of_kind(recent_section, "stale_scale");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]->window, 0);  // not max: the window does not hold it
  EXPECT_EQ(remedy_lines(*r[0]), (std::vector<std::string>{"--fp8-recipe current"}));
  const Fp8Section short_section = analyse_fp8(held("x", 2, 64, 7, 3), delayed_max(2));
  const auto h = of_kind(short_section, "stale_scale");
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(remedy_lines(*h[0]), (std::vector<std::string>{"--fp8-amax-algo most_recent", "--fp8-recipe current"}));
}

TEST(Fp8Findings, SaturationRemediesSkipWhatTheRunUsed) {
  // amax * scale = 896 = 2 * 448 with the run's margin 2 already in the scale: 2 more, margin 3.
  const std::vector<trace::Fp8Row> rows = {row(0, "a", "weight", "e4m3", 100, 0, 5, 4.0, 224.0)};
  const Fp8Section margin_section = analyse_fp8(rows, delayed_max(1024, 2));
  const auto f = of_kind(margin_section, "saturation");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0]->margin, 3);
  EXPECT_EQ(remedy_lines(*f[0]), (std::vector<std::string>{"--fp8-margin 3", "--fp8-recipe current"}));
  Fp8RunSettings current = delayed_max();
  current.recipe = "current";
  const Fp8Section current_section = analyse_fp8(rows, current);
  const auto c = of_kind(current_section, "saturation");
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0]->remedies.empty());  // no margin under current scaling, and current is what it used
}

// Saturation counts a step over 1% clipped only when its relative RMS error exceeds the unit roundoff (2^-4 E4M3,
// 2^-3 E5M2): the rows are those of real runs (the numbers docs/fp8.md quotes), the errors and fractions as
// recorded. a: the transformer sample's blocks.0.mlp.2 weight, steps 1 and 2 (3.21% and 2.50% clipped at 1.066 and
// 1.067 times max, RMS errors 0.0273 and 0.0270: rounding's level): no finding. b: the cnn sample's fc2 input,
// step 1 (59.47% clipped at 2.45 times max, error 0.4316) and step 8 (4.5% clipped, error 0.0499 under the bound):
// a finding on step 1 only. c: an E5M2 grad_output 5.78% clipped with error 0.0422, over E4M3's bound but under
// E5M2's 0.125: none. d: exactly at the bound (0.0625): not over it. e: over 1% with a NaN error: the fraction
// alone decides (a finding).
TEST(Fp8Findings, SaturationNeedsAnErrorAboveRounding) {
  const auto sat = [](std::int64_t step, std::string module, std::string operand, std::string format,
                      std::int64_t nonzero, std::int64_t saturated, double over, double error) {
    const double fmax = format == "e5m2" ? 57344.0 : 448.0;
    trace::Fp8Row r = row(step, std::move(module), std::move(operand), std::move(format), nonzero, 0, saturated,
                          over * fmax / 1024.0, 1024.0);
    r.rel_rms_error = error;
    return r;
  };
  const std::vector<trace::Fp8Row> rows = {
      sat(1, "a", "weight", "e4m3", 262144, 8415, 1.0663, 0.0273),  // 3.21%
      sat(2, "a", "weight", "e4m3", 262144, 6554, 1.0674, 0.0270),  // 2.50%
      sat(1, "b", "input", "e4m3", 2048, 1218, 2.4516, 0.4316),    // 59.47%
      sat(8, "b", "input", "e4m3", 2000, 90, 1.2518, 0.0499),      // 4.5%
      sat(1, "c", "grad_output", "e5m2", 1000, 58, 1.0667, 0.0422),
      sat(1, "d", "weight", "e4m3", 1000, 20, 1.1, 0.0625),
      sat(1, "e", "weight", "e4m3", 1000, 20, 1.1, std::numeric_limits<double>::quiet_NaN()),
  };
  const Fp8Section s = analyse_fp8(rows);
  const auto f = of_kind(s, "saturation");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0]->module, "b");
  EXPECT_EQ(f[0]->first_step, 1);
  EXPECT_EQ(f[0]->last_step, 1);
  EXPECT_EQ(f[0]->steps, 1);
  EXPECT_EQ(f[0]->nonzero, 2048);
  EXPECT_EQ(f[0]->count, 1218);
  EXPECT_DOUBLE_EQ(f[0]->max_scaled_amax, 2.4516 * 448.0);
  EXPECT_EQ(f[0]->margin, 2);  // 2.45 times max: 2^2 brings it under
  EXPECT_DOUBLE_EQ(f[0]->error, 0.4316);
  EXPECT_EQ(f[0]->error_bound, 0.0625);
  EXPECT_EQ(f[1]->module, "e");
  EXPECT_EQ(f[1]->count, 20);
}

// Relative RMS errors: the bound is 2^-4 = 0.0625 (E4M3) and 2^-3 = 0.125 (E5M2); modules compared by error / bound.
TEST(Fp8Findings, ErrorDominatesAboveTheUnitRoundoff) {
  const auto err_row = [](std::int64_t step, std::string module, std::string operand, std::string format, double e) {
    trace::Fp8Row r = row(step, std::move(module), std::move(operand), std::move(format), 100, 0, 0);
    r.rel_rms_error = e;
    return r;
  };
  // a: input 0.05 and 0.09, mean 0.07 = 1.12 bounds; its weight 0.02. b: e5m2 grad_output 0.12 (0.96 bounds: the
  // larger error, but within what E5M2's rounding explains). c: a NaN error (no finite values) is skipped.
  std::vector<trace::Fp8Row> rows = {err_row(0, "a", "input", "e4m3", 0.05),        err_row(1, "a", "input", "e4m3", 0.09),
                                     err_row(0, "a", "weight", "e4m3", 0.02),       err_row(1, "a", "weight", "e4m3", 0.02),
                                     err_row(0, "b", "grad_output", "e5m2", 0.12), err_row(1, "b", "grad_output", "e5m2", 0.12),
                                     err_row(0, "c", "input", "e4m3", NAN),         err_row(1, "c", "input", "e4m3", 0.01)};
  const Fp8Section section = analyse_fp8(rows);
  const auto f = of_kind(section, "fp8_error_dominates");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0]->module, "a");
  EXPECT_EQ(f[0]->operand, "input");
  EXPECT_DOUBLE_EQ(f[0]->error, 0.07);
  EXPECT_EQ(f[0]->error_bound, 0.0625);
  EXPECT_EQ(f[0]->next_module, "b");
  EXPECT_DOUBLE_EQ(f[0]->next_error, 0.12);
  EXPECT_EQ(f[0]->first_step, 1);  // only step 1's own error (0.09) is over the bound
  EXPECT_EQ(f[0]->last_step, 1);
  EXPECT_EQ(f[0]->steps, 1);
  EXPECT_DOUBLE_EQ(f[0]->worst_fraction, 0.09);
  EXPECT_EQ(remedy_lines(*f[0]), (std::vector<std::string>{"--fp8-keep-bf16 a"}));
  // Exactly at the bound: not.
  rows = {err_row(0, "a", "input", "e4m3", 0.0625), err_row(0, "b", "grad_output", "e5m2", 0.125)};
  EXPECT_TRUE(of_kind(analyse_fp8(rows), "fp8_error_dominates").empty());
}

// A delayed-recipe row with the history columns (trace::Fp8Row): history 1024, the history's amax from hstep.
trace::Fp8Row delayed_row(std::int64_t step, std::string module, std::string operand, std::string format,
                          std::int64_t nonzero, std::int64_t underflow, double amax, double scale, std::int64_t hstep,
                          double error) {
  trace::Fp8Row r = row(step, std::move(module), std::move(operand), std::move(format), nonzero, underflow, 0, amax, scale);
  r.rel_rms_error = error;
  r.dynamic_range = r.quantized_dynamic_range = 10;
  r.history_len = 1024;
  r.history_amax = amax;
  r.history_amax_step = hstep;
  return r;
}

// The delayed recipe's start-up (docs/fp8.md, "Start-up"): fc1's gradients, amax 0.001, cast in step 0 with the
// initial scale 1, all underflow (0.001 < 2^-10, half E4M3's smallest subnormal) with an RMS error of 1; from step 1
// the scale is 448 / 0.001 and nothing underflows (error 0.03). Not a finding, and not in fp8_error_dominates' mean:
// with it fc1's mean would be (1 + 0.03 + 0.03) / 3 = 0.353, over E4M3's 0.0625; without it 0.03.
TEST(Fp8Findings, StartUpUnderflowIsNoFinding) {
  const double scale = 448.0 / 0.001;
  const std::vector<trace::Fp8Row> rows = {
      delayed_row(0, "fc1", "grad_output", "e4m3", 1000, 1000, 0.001, 1.0, 0, 1.0),
      delayed_row(1, "fc1", "grad_output", "e4m3", 1000, 0, 0.001, scale, 0, 0.03),
      delayed_row(2, "fc1", "grad_output", "e4m3", 1000, 0, 0.0009, scale, 0, 0.03),
      delayed_row(0, "fc2", "input", "e4m3", 1000, 0, 2.0, 1.0, 0, 0.02),  // start-up too, but lost nothing
      delayed_row(1, "fc2", "input", "e4m3", 1000, 0, 2.0, 224.0, 0, 0.02),
  };
  const Fp8Section s = analyse_fp8(rows);
  EXPECT_TRUE(s.findings.empty()) << s.findings.front().kind;
  ASSERT_EQ(s.start_up.size(), 1u);
  const Fp8StartUp& u = s.start_up[0];
  EXPECT_EQ(u.module, "fc1");
  EXPECT_EQ(u.operand, "grad_output");
  EXPECT_EQ(u.first_step, 0);
  EXPECT_EQ(u.last_step, 0);
  EXPECT_EQ(u.steps, 1);
  EXPECT_EQ(u.nonzero, 1000);
  EXPECT_EQ(u.underflow, 1000);
  EXPECT_DOUBLE_EQ(u.worst_underflow_fraction, 1.0);
  EXPECT_DOUBLE_EQ(u.max_error, 1.0);
  EXPECT_TRUE(u.underflow_over);
  EXPECT_TRUE(u.error_over);
  EXPECT_FALSE(u.saturation_over);
  // The operand's summary still counts every step (the worst step is step 0).
  EXPECT_EQ(s.operands[0].underflow, 1000);
  EXPECT_EQ(s.operands[0].worst_underflow_step, 0);
}

// The same start-up followed by 3% underflow in steps 1 and 2: the finding covers those two steps only, and the
// start-up is still reported apart. fc1's error after start-up, 0.08 and 0.1 (mean 0.09 > 0.0625), makes it
// fp8_error_dominates with step 0's error 1 left out of the mean.
TEST(Fp8Findings, UnderflowThatOutlastsTheStartUpIsAFinding) {
  const double scale = 448.0 / 0.001;
  const std::vector<trace::Fp8Row> rows = {
      delayed_row(0, "fc1", "grad_output", "e4m3", 1000, 1000, 0.001, 1.0, 0, 1.0),
      delayed_row(1, "fc1", "grad_output", "e4m3", 1000, 30, 0.001, scale, 0, 0.08),
      delayed_row(2, "fc1", "grad_output", "e4m3", 1000, 30, 0.0009, scale, 0, 0.1),
  };
  const Fp8Section s = analyse_fp8(rows);
  ASSERT_EQ(s.start_up.size(), 1u);
  const auto under = of_kind(s, "e4m3_grad_underflow");
  ASSERT_EQ(under.size(), 1u);
  EXPECT_EQ(under[0]->first_step, 1);
  EXPECT_EQ(under[0]->last_step, 2);
  EXPECT_EQ(under[0]->steps, 2);
  EXPECT_EQ(under[0]->nonzero, 2000);
  EXPECT_EQ(under[0]->count, 60);
  EXPECT_DOUBLE_EQ(under[0]->worst_fraction, 0.03);
  EXPECT_EQ(under[0]->worst_step, 1);
  const auto err = of_kind(s, "fp8_error_dominates");
  ASSERT_EQ(err.size(), 1u);
  EXPECT_DOUBLE_EQ(err[0]->error, (0.08 + 0.1) / 2);
  EXPECT_EQ(err[0]->first_step, 1);
  EXPECT_DOUBLE_EQ(err[0]->worst_fraction, 0.1);
}

// Which rows are start-up rows: only the delayed recipe's (history_len > 0), at scale exactly 1, with the history's
// amax from the row's own step (or an amax of 0), before any row of the operand recorded an amax other than 0.
TEST(Fp8Findings, StartUpRowsAreTheInitialScaleOnly) {
  trace::Fp8Row r = delayed_row(0, "fc1", "grad_output", "e4m3", 100, 100, 0.001, 1.0, 0, 1.0);
  EXPECT_TRUE(fp8_start_up_row(r, false));
  EXPECT_FALSE(fp8_start_up_row(r, true));  // an earlier amax rolled the history: the scale was computed
  trace::Fp8Row other = r;
  other.scale = 2.0;  // not the initial scale
  EXPECT_FALSE(fp8_start_up_row(other, false));
  other = r;
  other.history_amax_step = -1;  // a history older than the probe (attached later, or resumed)
  EXPECT_FALSE(fp8_start_up_row(other, false));
  other = r;
  other.history_len = 0;  // current scaling: each cast's scale is its own amax's
  EXPECT_FALSE(fp8_start_up_row(other, false));
  other = r;
  other.history_len = -1;  // a trace without the history columns cannot show it
  EXPECT_FALSE(fp8_start_up_row(other, false));
  other = r;
  other.amax = 0;  // all zeros: nothing recorded, the next step is still cast with scale 1
  other.history_amax_step = -1;
  EXPECT_TRUE(fp8_start_up_row(other, false));

  // In a run: step 0 ran with all zeros (no amax recorded), so step 1 is start-up too; step 2 (scale 448 / 0.001
  // from step 1's amax) is not. b: its step-0 amax is 448, so its step-1 scale is 448 / 448 = 1, computed: a finding.
  const double scale = 448.0 / 0.001;
  std::vector<trace::Fp8Row> rows = {
      delayed_row(0, "a", "grad_output", "e4m3", 0, 0, 0.0, 1.0, -1, 0.0),
      delayed_row(1, "a", "grad_output", "e4m3", 100, 50, 0.001, 1.0, 1, 0.7),
      delayed_row(2, "a", "grad_output", "e4m3", 100, 1, 0.001, scale, 1, 0.03),
      delayed_row(0, "b", "grad_output", "e4m3", 100, 0, 448.0, 1.0, 0, 0.03),
      delayed_row(1, "b", "grad_output", "e4m3", 100, 5, 4.0, 1.0, 0, 0.03),
  };
  const Fp8Section s = analyse_fp8(rows);
  ASSERT_EQ(s.start_up.size(), 1u);
  EXPECT_EQ(s.start_up[0].module, "a");
  EXPECT_EQ(s.start_up[0].first_step, 0);
  EXPECT_EQ(s.start_up[0].last_step, 1);
  EXPECT_EQ(s.start_up[0].steps, 2);
  EXPECT_EQ(s.start_up[0].underflow, 50);
  const auto under = of_kind(s, "e4m3_grad_underflow");
  ASSERT_EQ(under.size(), 1u);
  EXPECT_EQ(under[0]->module, "b");
  EXPECT_EQ(under[0]->first_step, 1);
}

// fix's loss tolerance against the bf16 run (fp8_loss_tolerance, docs/fp8.md "The loss tolerance"), worked by hand:
// losses 10, 8, 7, 6.5, 5 have second differences 7 - 16 + 10 = 1, 6.5 - 14 + 8 = 0.5, 5 - 13 + 7 = -1; their mean
// square is 2.25 / 3 = 0.75, sigma^2 = 0.75 / 6 = 0.125, and 2 sigma / 5 = 2 sqrt(0.125) / 5 = sqrt(2) / 10.
TEST(Fp8Findings, LossToleranceIsTwoSigmaOfTheBf16RunsLastSteps) {
  EXPECT_NEAR(fp8_loss_tolerance(std::vector<double>{10, 8, 7, 6.5, 5}), std::sqrt(2.0) / 10, 1e-15);
  // Only the last five steps count.
  EXPECT_NEAR(fp8_loss_tolerance(std::vector<double>{100, -50, 10, 8, 7, 6.5, 5}), std::sqrt(2.0) / 10, 1e-15);
  // Three steps: one second difference, 1 - 4 + 4 = 1 -> sigma = sqrt(1 / 6), over a final loss of 1.
  EXPECT_NEAR(fp8_loss_tolerance(std::vector<double>{4, 2, 1}), 2 * std::sqrt(1.0 / 6.0), 1e-15);
  // A straight line has no noise: nothing but the bf16 run's own loss passes.
  EXPECT_EQ(fp8_loss_tolerance(std::vector<double>{5, 4, 3, 2, 1}), 0.0);
  // Nothing to measure: fewer than 3 losses, a non-finite loss in the window, a final loss of 0.
  EXPECT_TRUE(std::isnan(fp8_loss_tolerance(std::vector<double>{2, 1})));
  EXPECT_TRUE(std::isnan(fp8_loss_tolerance(std::vector<double>{3, NAN, 2, 1, 1})));
  EXPECT_TRUE(std::isnan(fp8_loss_tolerance(std::vector<double>{3, 2, INFINITY, 1, 1})));
  EXPECT_TRUE(std::isnan(fp8_loss_tolerance(std::vector<double>{3, 2, 1, 1, 0})));
  // A NaN before the window does not matter.
  EXPECT_NEAR(fp8_loss_tolerance(std::vector<double>{NAN, 10, 8, 7, 6.5, 5}), std::sqrt(2.0) / 10, 1e-15);
}

// The PRECISION entries of FP8 Linears (mark_fp8_linears): by their /fp8 rows' modules. fc1 (input and weight e4m3):
// its jump entry (rounding, with a remedy) becomes fp8_quantization with --fp8-keep-bf16 'fc1' in place of keeping
// it in f32, the evidence says what its own bf16 rounding was; its trend entry gets the format only. fc2 ran in
// bf16 (no /fp8 rows): untouched. fc1's local and backward entries (bf16 rounding alone) are left as they are, and
// so is a matmul in fc1 (not a Linear).
TEST(Fp8Findings, Fp8LinearsInThePrecisionLists) {
  const auto entry = [](std::string op, std::string module, std::string kind, bool remedy) {
    PrecisionEntry e;
    e.op = std::move(op);
    e.module = std::move(module);
    e.out_dtype = "bf16";
    e.kind = std::move(kind);
    e.local_error = 0.0019;
    e.evidence = "inputs agree with f32 to 0.0014 (mean relative error; max 0.0039), its output is 12.1% off (max 735%) "
                 "(step 9, seq 0)";
    if (remedy) {
      Remedy m;
      m.kind = "autocast_fp32";
      m.pattern = e.module;
      m.flag = "--autocast-fp32 '" + e.module + "'";
      e.remedies.push_back(m);
      Remedy other;
      other.kind = "reorder";
      e.remedies.push_back(other);
    }
    return e;
  };
  PrecisionSection p;
  p.by_jump = {entry("linear", "fc1", "rounding", true), entry("linear", "fc2", "rounding", true),
               entry("matmul", "fc1", "rounding", true)};
  p.by_trend = {entry("linear", "fc1", "rounding", false)};
  p.by_local = {entry("linear", "fc1", "rounding", true)};
  p.backward = {entry("linear", "fc1", "rounding", false)};
  p.backward[0].phase = "backward";
  const std::vector<trace::Fp8Row> rows = {row(0, "fc1", "input", "e4m3", 10, 0, 0), row(0, "fc1", "weight", "e4m3", 10, 0, 0),
                                           row(0, "fc1", "grad_output", "e5m2", 10, 0, 0)};
  mark_fp8_linears(p, analyse_fp8(rows));
  const PrecisionEntry& j = p.by_jump[0];
  EXPECT_EQ(j.kind, "fp8_quantization");
  EXPECT_EQ(j.fp8, "e4m3");
  EXPECT_EQ(j.out_dtype, "bf16");
  ASSERT_EQ(j.remedies.size(), 2u);
  EXPECT_EQ(j.remedies[0].kind, "fp8_keep_bf16");
  EXPECT_EQ(j.remedies[0].flag, "--fp8-keep-bf16 'fc1'");
  EXPECT_EQ(j.remedies[1].kind, "reorder");  // only the f32 remedy is replaced
  EXPECT_EQ(j.evidence,
            "inputs agree with f32 to 0.0014 (mean relative error; max 0.0039), its output is 12.1% off (max 735%); "
            "its input and weight were quantized to FP8 e4m3 for the GEMM, and its own bf16 rounding is 0.0019 (its "
            "local error, against the same FP8 GEMM in f32): the rest of the jump is the quantization (step 9, seq 0)");
  EXPECT_EQ(p.by_jump[1].kind, "rounding");
  EXPECT_EQ(p.by_jump[1].fp8, "");
  EXPECT_EQ(p.by_jump[1].remedies[0].kind, "autocast_fp32");
  EXPECT_EQ(p.by_jump[2].fp8, "");
  EXPECT_EQ(p.by_trend[0].fp8, "e4m3");
  EXPECT_EQ(p.by_trend[0].kind, "rounding");
  EXPECT_EQ(p.by_local[0].fp8, "");
  EXPECT_EQ(p.by_local[0].remedies[0].kind, "autocast_fp32");
  EXPECT_EQ(p.backward[0].fp8, "");
  // An entry that lost little (no remedies) gets none.
  PrecisionSection q;
  q.by_jump = {entry("linear", "fc1", "rounding", false)};
  mark_fp8_linears(q, analyse_fp8(rows));
  EXPECT_EQ(q.by_jump[0].kind, "fp8_quantization");
  EXPECT_TRUE(q.by_jump[0].remedies.empty());
}

TEST(Fp8Findings, RunSettingsFromTheConfiguration) {
  const Fp8RunSettings s = fp8_run_settings(
      R"({"fp8_recipe":"delayed","fp8_format":"e4m3","fp8_amax_history":16,"fp8_amax_algo":"most_recent",)"
      R"("fp8_margin":2,"fp8_keep_bf16":["head","x*"]})");
  EXPECT_TRUE(s.known);
  EXPECT_EQ(s.format, "e4m3");
  EXPECT_EQ(s.history, 16);
  EXPECT_EQ(s.algo, "most_recent");
  EXPECT_EQ(s.margin, 2);
  EXPECT_EQ(s.keep_bf16, (std::vector<std::string>{"head", "x*"}));
  EXPECT_FALSE(fp8_run_settings("not json").known);
  EXPECT_FALSE(fp8_run_settings(R"({"fp8_recipe":"delayed"})").known);
  EXPECT_FALSE(fp8_run_settings(R"({"fp8_recipe":"delayed","fp8_format":"e4m3","fp8_amax_history":"16",)"
                                R"("fp8_amax_algo":"max","fp8_margin":0})").known);
}

}  // namespace
}  // namespace ampscope::analysis
