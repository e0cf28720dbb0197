// The FP8 scenarios (samples/scenarios.cpp, docs/scenarios.md "FP8"): each, trained with --precision fp8 as a user
// would run it, gives the finding its `expect` line names (kind, module, operand, step), the same scenario in bf16
// trains without a NaN/Inf, and each remedy the report offers, applied to the configuration and re-run, leaves no
// finding of that kind (or, for --fp8-margin on the saturating run, is shown not to: docs/fp8.md explains why).
// The findings' numbers are recomputed from the /fp8 rows in tests/train/fp8_findings*_test.sh; here, the
// scenarios' story.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cli/run.h"
#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"

namespace ampscope::samples {
namespace {

struct Fp8Run {
  analysis::Report report;
  double final_loss = 0;
};

// Trains `scenario` (seed 0, its own steps) with `change` applied to the configuration, and analyses the trace.
Fp8Run run_fp8(const std::string& scenario, Precision precision, const std::function<void(TrainConfig&)>& change = {}) {
  TrainConfig c;
  c.scenario = scenario;
  c.precision = precision;
  c.device = "cpu";
  if (change) {
    // The scenario's configuration first, as train() would apply it, then the remedy over it (as `ampscope fix`
    // replays a recorded run: scenario_applied).
    find_scenario(scenario).configure(c);
    change(c);
    c.scenario_applied = true;
  }
  static int n = 0;
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_fp8_scenario_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".h5");
  c.out = path.string();
  Fp8Run out;
  out.final_loss = train(c).final_loss;
  {
    trace::TraceReader reader(path);
    out.report = analysis::analyse(reader);
  }
  std::filesystem::remove(path);
  return out;
}

std::vector<const analysis::Fp8Finding*> of_kind(const analysis::Report& r, const std::string& kind) {
  std::vector<const analysis::Fp8Finding*> out;
  for (const analysis::Fp8Finding& f : r.fp8.findings)
    if (f.kind == kind) out.push_back(&f);
  return out;
}

std::vector<std::string> remedy_lines(const analysis::Fp8Finding& f) {
  std::vector<std::string> out;
  for (const analysis::Fp8Remedy& r : f.remedies) out.push_back(r.command_line);
  return out;
}

TEST(fp8_stale_scale_test, the_raw_record_holds_fc1s_input_scale_and_each_remedy_clears_it) {
  const Fp8Run run = run_fp8("fp8-stale-scale", Precision::fp8);
  EXPECT_TRUE(run.report.anomalies.empty());
  const auto stale = of_kind(run.report, "stale_scale");
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0]->module, "fc1");
  EXPECT_EQ(stale[0]->operand, "input");
  EXPECT_EQ(stale[0]->spike_step, 3);
  EXPECT_EQ(stale[0]->first_step, 4);
  EXPECT_EQ(stale[0]->last_step, 9);  // held to the end of the 10 steps
  EXPECT_EQ(stale[0]->amax_spike, 195.0 * 512);  // 1e5 in bf16 (autocast casts fc1's input): 8 bits, 195 * 2^9
  EXPECT_EQ(remedy_lines(*stale[0]), (std::vector<std::string>{"--fp8-amax-algo most_recent", "--fp8-amax-history 2",
                                                               "--fp8-recipe current"}));
  EXPECT_TRUE(run_fp8("fp8-stale-scale", Precision::bf16).report.anomalies.empty());
  for (const auto& [name, apply] : std::vector<std::pair<std::string, std::function<void(TrainConfig&)>>>{
           {"most_recent", [](TrainConfig& c) { c.fp8_amax_algo = "most_recent"; }},
           {"history 2", [](TrainConfig& c) { c.fp8_amax_history = 2; }},
           {"current", [](TrainConfig& c) { c.fp8_recipe = "current"; }}}) {
    EXPECT_TRUE(of_kind(run_fp8("fp8-stale-scale", Precision::fp8, apply).report, "stale_scale").empty()) << name;
  }
}

TEST(fp8_e4m3_grads_test, gradients_underflow_in_e4m3_and_hybrid_clears_it) {
  const Fp8Run run = run_fp8("fp8-e4m3-grads", Precision::fp8);
  EXPECT_TRUE(run.report.anomalies.empty());
  const auto under = of_kind(run.report, "e4m3_grad_underflow");
  // Every Linear's gradients, after the start-up step and to the run's last step (9): the sharpened softmax's
  // gradients spread wider than E4M3 holds once the model is confident, whatever the scale.
  ASSERT_EQ(under.size(), 3u);
  const std::vector<std::string> modules = {"fc1", "fc2", "fc3"};
  for (std::size_t i = 0; i < under.size(); ++i) {
    const auto* f = under[i];
    EXPECT_EQ(f->module, modules[i]);
    EXPECT_EQ(f->operand, "grad_output");
    EXPECT_GE(f->first_step, 1);
    EXPECT_EQ(f->last_step, 9);
    EXPECT_EQ(remedy_lines(*f), (std::vector<std::string>{"--fp8-format hybrid"}));
  }
  // Step 0, cast with the initial scale 1, is the recipe's start-up: reported apart, for the three gradients.
  ASSERT_EQ(run.report.fp8.start_up.size(), 3u);
  for (const analysis::Fp8StartUp& u : run.report.fp8.start_up) {
    EXPECT_EQ(u.operand, "grad_output");
    EXPECT_EQ(u.first_step, 0);
    EXPECT_EQ(u.last_step, 0);
    EXPECT_TRUE(u.underflow_over);
  }
  // A user who asked for HYBRID explicitly gets e4m3 only where they left the default: the scenario configures an
  // FP8 run only; a bf16 run has no format and trains clean.
  EXPECT_TRUE(run_fp8("fp8-e4m3-grads", Precision::bf16).report.anomalies.empty());
  const Fp8Run hybrid = run_fp8("fp8-e4m3-grads", Precision::fp8, [](TrainConfig& c) { c.fp8_format = "hybrid"; });
  EXPECT_TRUE(of_kind(hybrid.report, "e4m3_grad_underflow").empty());
}

TEST(fp8_saturation_test, weights_outgrow_the_delayed_scale_and_current_scaling_clears_it) {
  const Fp8Run run = run_fp8("fp8-saturation", Precision::fp8);
  EXPECT_TRUE(run.report.anomalies.empty());
  const auto sat = of_kind(run.report, "saturation");
  ASSERT_FALSE(sat.empty());
  EXPECT_EQ(sat[0]->module, "fc1");
  EXPECT_EQ(sat[0]->operand, "weight");
  EXPECT_EQ(sat[0]->worst_step, 1);
  EXPECT_EQ(sat[0]->worst_fraction, 1.0);  // every weight value clipped in step 1
  int largest = 0;
  for (const auto* f : sat) largest = std::max(largest, f->margin);
  EXPECT_TRUE(run_fp8("fp8-saturation", Precision::bf16).report.anomalies.empty());
  EXPECT_TRUE(of_kind(run_fp8("fp8-saturation", Precision::fp8, [](TrainConfig& c) { c.fp8_recipe = "current"; }).report,
                      "saturation")
                  .empty());
  // The largest margin of the findings does not clear it: the weights grow faster than a history-based scale can
  // absorb at this learning rate (docs/fp8.md); what fix reports as not verified.
  EXPECT_EQ(largest, 5);
  EXPECT_FALSE(of_kind(run_fp8("fp8-saturation", Precision::fp8, [&](TrainConfig& c) { c.fp8_margin = largest; }).report,
                       "saturation")
                   .empty());
}

}  // namespace
}  // namespace ampscope::samples
