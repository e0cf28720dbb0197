// What shapes a trace, and what the report makes of it (issue 15): skips while the GradScaler calibrates
// are not anomalies; a probe filter that hides the origin is said so; an evaluation pass after the step
// is not a step; the trace records the probe's set-up and the run's overrides and data sources. Expected
// values come from the trace's own /steps rows (which steps were skipped, at which scale) and from the
// set-up the test chose, never from the report's text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/analysis/analysis.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "samples/models.h"
#include "cli/run.h"
#include "tests/analysis/recorded_run.h"

namespace ampscope::analysis {
namespace {

bool contains(const std::string& text, std::string_view piece) { return text.find(piece) != std::string::npos; }

std::filesystem::path temp_trace(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("ampscope_coverage_" + std::to_string(::getpid()) + "_" + name + ".h5");
}

// A healthy fp16 run whose initial scale is far too high: the first steps' scaled gradients overflow f16
// (forward and loss finite), the scaler skips and halves, and from some scale on every step is clean.
TEST(coverage_test, skips_while_the_scaler_settles_are_calibration_and_the_run_is_healthy) {
  const auto path = temp_trace("calibration");
  samples::TrainConfig c;
  c.sample = "mlp";
  c.precision = samples::Precision::fp16;
  c.device = "cpu";
  c.steps = 12;
  c.init_scale = 16777216;  // 2^24
  c.out = path.string();
  samples::train(c);
  trace::TraceReader reader(path);
  // The reference: the skipped steps before the first unskipped one, from /steps; and the backward origins
  // the probe recorded in them (what used to be reported as gradient_overflow anomalies).
  std::int64_t leading_skips = 0;
  for (const trace::StepRow& s : reader.steps()) {
    if (!s.skipped) break;
    ++leading_skips;
    EXPECT_TRUE(std::isfinite(s.loss));
  }
  ASSERT_GT(leading_skips, 0) << "2^24 should overflow the first steps' gradients";
  std::int64_t backward_origins = 0;
  for (const trace::OpRow& o : reader.ops()) backward_origins += o.origin && o.phase == trace::Phase::backward ? 1 : 0;
  ASSERT_GT(backward_origins, 0);
  const Report rep = analyse(reader);
  std::filesystem::remove(path);
  EXPECT_TRUE(rep.healthy()) << (rep.anomalies.empty() ? "" : rep.anomalies.front().cause);
  EXPECT_EQ(rep.scaler.calibration_skips, leading_skips);
  EXPECT_EQ(rep.scaler.last_calibration_step, leading_skips - 1);
  EXPECT_EQ(rep.scaler.verdict, "settled");
}

// A user's loop whose probe records only fc3: the overflow happens in fc1 (an input scaled past f16's range),
// so the first recorded non-finite op is fc3, fed by an op the probe skipped.
Report filtered_run(const std::vector<std::string>& modules, const std::string& name) {
  return testing::record_and_analyse(name, {.precision = "fp16", .device = "cpu", .model = "user mlp", .seed = 1,
                                            .config = "{}"},
                                     {.modules = modules}, [] {
    Generator gen(11);
    auto model = samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    for (std::int64_t step = 0; step < 2; ++step) {
      probe::StepScope scope(step);
      Tensor x = mul(randn({4, 8}, gen), 1e5);  // fc1's f16 cast of x overflows
      Tensor loss;
      {
        AutocastGuard autocast(DType::f16);
        loss = mean((*model)(x));
      }
      scope.end({.step = step, .loss = loss.item()});
    }
  });
}

TEST(coverage_test, a_module_filter_that_hides_the_origin_is_named_and_not_blamed_on_the_data) {
  const Report rep = filtered_run({"fc3"}, "filter");
  ASSERT_TRUE(rep.coverage.known);
  EXPECT_EQ(rep.coverage.modules, std::vector<std::string>{"fc3"});
  ASSERT_FALSE(rep.coverage.notes.empty());
  EXPECT_TRUE(contains(rep.coverage.notes.front(), "recorded only modules 'fc3'")) << rep.coverage.notes.front();
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.module, "fc3");
  EXPECT_EQ(d.cause, "nonfinite_input");
  bool hidden = false;
  for (const std::string& e : d.evidence) hidden |= contains(e, "the probe did not record (filtered out");
  EXPECT_TRUE(hidden);
  for (const Remedy& m : d.remedies) EXPECT_NE(m.kind, "clean_data") << "the data are fine; the origin is hidden";
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "record_every_op");
  // Every diagnosis the filter may have misplaced (step-level ones too) leads with recording every op.
  for (const Diagnosis& a : rep.anomalies) {
    if (a.op.empty() || a.cause == "nonfinite_input") {
      EXPECT_EQ(a.remedies.front().kind, "record_every_op") << a.cause;
    }
  }
  // The remedy applied: the same run with every op recorded finds the origin, fc1's cast of x.
  const Report all = filtered_run({}, "filter-removed");
  ASSERT_FALSE(all.anomalies.empty());
  EXPECT_EQ(all.anomalies.front().module, "fc1");
  EXPECT_EQ(all.anomalies.front().cause, "f16_overflow");
  EXPECT_TRUE(all.coverage.notes.empty());
}

// An evaluation forward pass after the step (outside any StepScope) is not recorded: no step -1 rows, and
// the report counts the steps the loop ran.
TEST(coverage_test, an_evaluation_pass_after_the_step_is_not_a_step) {
  const auto path = temp_trace("eval");
  probe::ProbeOptions options;
  trace::RunInfo info{.precision = "fp32", .device = "cpu", .model = "user mlp", .seed = 1, .config = "{}",
                      .probe = probe::describe(options)};
  constexpr std::int64_t kSteps = 3;
  {
    auto writer = std::make_shared<trace::TraceWriter>(path, info);
    auto probe = std::make_shared<probe::Probe>(writer, options);
    probe::HookGuard installed(probe);
    Generator gen(12);
    auto model = samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
    optim::SGD opt(model->parameters(), {.lr = 0.01});
    Tensor x = randn({4, 8}, gen);
    for (std::int64_t step = 0; step < kSteps; ++step) {
      {
        probe::StepScope scope(step);
        opt.zero_grad();
        Tensor loss = mean(mul((*model)(x), (*model)(x)));
        loss.backward();
        opt.step();
        scope.end({.step = step, .loss = loss.item()});
      }
      NoGradGuard eval;
      (*model)(x);  // evaluation after the step
    }
    probe->flush();
    writer->close();
  }
  trace::TraceReader reader(path);
  for (const trace::OpRow& o : reader.ops()) EXPECT_GE(o.step, 0) << o.op;
  const Report rep = analyse(reader);
  std::filesystem::remove(path);
  EXPECT_EQ(rep.steps, kSteps);
  EXPECT_TRUE(rep.healthy());
}

// ampscope train writes its overrides and data sources into the trace's config, and the probe's set-up into
// the probe attribute, so a report can say what the run changed.
TEST(coverage_test, the_trace_records_the_overrides_and_the_probe_set_up) {
  const auto path = temp_trace("config");
  samples::TrainConfig c;
  c.sample = "transformer";
  c.scenario = "attention-overflow";
  c.precision = samples::Precision::fp16;
  c.device = "cpu";
  c.steps = 1;
  c.autocast_fp32 = {"blocks.*.attn"};
  c.out = path.string();
  samples::train(c);
  trace::TraceReader reader(path);
  const trace::RunInfo info = reader.run_info();
  std::filesystem::remove(path);
  EXPECT_TRUE(contains(info.config, R"("autocast_fp32":["blocks.*.attn"])")) << info.config;
  EXPECT_TRUE(contains(info.config, R"("text":"")")) << info.config;
  EXPECT_TRUE(contains(info.probe, R"("module":"blocks.*.attn")")) << info.probe;
  EXPECT_TRUE(contains(info.probe, R"("level":"health")")) << info.probe;
}

// An --autocast-fp32 glob with a typo matches nothing: the trace's probe description lists it, no op row's
// autocast reason names it, and the report says so (the run itself only warns at its end).
TEST(coverage_test, an_override_that_decided_no_op_is_named) {
  for (const std::string glob : {"sofmax", "softmax"}) {
    const auto path = temp_trace("override-" + glob);
    samples::TrainConfig c;
    c.scenario = "attention-overflow";
    c.precision = samples::Precision::fp16;
    c.device = "cpu";
    c.steps = 1;
    c.autocast_fp32 = {glob};
    c.out = path.string();
    samples::train(c);
    trace::TraceReader reader(path);
    const Report rep = analyse(reader);
    std::filesystem::remove(path);
    bool named = false;
    for (const std::string& n : rep.coverage.notes) named |= contains(n, "override '" + glob + "' decided no recorded op");
    EXPECT_EQ(named, glob == "sofmax") << glob;
  }
}

}  // namespace
}  // namespace ampscope::analysis
