// tests/probes/flight_recorder_test.cpp: the probe's flight recorder (probes/probe.h): every step is
// recorded, only sampled and anomalous steps are written, an anomalous step is written whole, and the
// kept steps before it come with it.
//
// Each step runs relu, mul and a cast to f16 on 4 values; in the chosen steps one value is 1e5, which
// the cast overflows (f16's largest finite value is 65504), so the cast is an origin there.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "core/ops.h"
#include "core/probe_hook.h"
#include "probes/probe.h"
#include "tests/probes/memory_sink.h"

namespace ampscope {
namespace {

using testing::MemorySink;

struct RecordedRun {
  std::shared_ptr<MemorySink> sink = std::make_shared<MemorySink>();
  std::shared_ptr<probe::Probe> probe;
};

// Runs steps 0 .. steps-1; the steps in `bad` overflow their cast.
RecordedRun run(probe::ProbeOptions options, std::int64_t steps, const std::vector<std::int64_t>& bad) {
  RecordedRun r;
  r.probe = std::make_shared<probe::Probe>(r.sink, options);
  probe::HookGuard installed(r.probe);
  for (std::int64_t step = 0; step < steps; ++step) {
    probe::StepScope scope(step);
    const bool overflow = std::find(bad.begin(), bad.end(), step) != bad.end();
    const Tensor x = from_values({1, -2, 3, overflow ? 5e4 : 4}, {4});
    mul(relu(x), 2.0).to(DType::f16);  // 5e4 * 2 = 1e5 -> +inf in f16
    scope.end({.step = step, .loss = static_cast<double>(step)});
  }
  return r;
}

TEST(flight_recorder_test, writes_only_sampled_or_anomalous_steps) {
  const RecordedRun r = run({.every = 4, .flight_recorder = true, .recorder_steps = 1}, 8, {5});
  EXPECT_EQ(r.sink->steps_with_ops(), (std::vector<std::int64_t>{0, 4, 5}));
  EXPECT_EQ(r.sink->steps.size(), 8u) << "every step's /steps row";
  EXPECT_EQ(r.sink->ended, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(r.probe->counters().steps_written, 3);
  for (const trace::EventRow& e : r.sink->events) EXPECT_EQ(e.step, 5) << e.kind << ": " << e.detail;
  EXPECT_EQ(r.sink->events_of_kind("origin").size(), 1u);
  EXPECT_EQ(r.sink->events_of_kind("cast_overflow").size(), 1u);
}

TEST(flight_recorder_test, keeps_the_anomalous_step_complete) {
  const RecordedRun r = run({.every = 4, .flight_recorder = true, .recorder_steps = 1}, 8, {5});
  const auto step5 = r.sink->ops_of_step(5);
  ASSERT_EQ(step5.size(), 3u) << "relu, mul and to, although only the last was anomalous";
  EXPECT_EQ(step5[0].op, "relu");
  EXPECT_EQ(step5[1].op, "mul");
  EXPECT_EQ(step5[2].op, "to");
  EXPECT_EQ(step5[0].health.numel, 4) << "recorded at the configured level";
  EXPECT_TRUE(step5[2].origin);
  EXPECT_EQ(step5[2].cast_overflow, 1);
}

TEST(flight_recorder_test, an_anomalous_step_brings_the_kept_steps_before_it) {
  // Keeps 3 steps: at step 6 the recorder holds 4 (written, sampled), 5 and 6.
  const RecordedRun r = run({.every = 4, .flight_recorder = true, .recorder_steps = 3}, 8, {6});
  EXPECT_EQ(r.sink->steps_with_ops(), (std::vector<std::int64_t>{0, 4, 5, 6}));
  EXPECT_EQ(r.sink->ops_of_step(5).size(), 3u);
  for (std::size_t i = 1; i < r.sink->ops.size(); ++i) {
    EXPECT_LE(r.sink->ops[i - 1].step, r.sink->ops[i].step) << "rows reach the sink in step order";
  }
}

TEST(flight_recorder_test, without_the_recorder_unsampled_steps_are_not_recorded_at_all) {
  const RecordedRun r = run({.every = 4}, 8, {5});
  EXPECT_EQ(r.sink->steps_with_ops(), (std::vector<std::int64_t>{0, 4}));
  EXPECT_TRUE(r.sink->events.empty());
  EXPECT_EQ(r.sink->steps.size(), 8u);
}

TEST(flight_recorder_test, at_level_full_the_anomalous_step_has_its_histograms) {
  const RecordedRun r =
      run({.level = probe::Level::full, .every = 100, .flight_recorder = true, .recorder_steps = 1}, 4, {2});
  EXPECT_EQ(r.sink->steps_with_ops(), (std::vector<std::int64_t>{0, 2}));
  std::vector<std::int64_t> steps;
  for (const trace::HistogramRow& h : r.sink->histograms) steps.push_back(h.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 0, 0, 2, 2, 2}));
}

TEST(flight_recorder_test, a_non_finite_gradient_selects_the_step) {
  auto sink = std::make_shared<MemorySink>();
  auto p = std::make_shared<probe::Probe>(
      sink, probe::ProbeOptions{.every = 10, .flight_recorder = true, .recorder_steps = 1});
  probe::HookGuard installed(p);
  for (std::int64_t step = 0; step < 3; ++step) {
    probe::StepScope scope(step);
    Tensor w = zeros({2});
    w.requires_grad_();
    w.set_grad(from_values({1, step == 2 ? std::numeric_limits<double>::infinity() : 1.0}, {2}));
    relu(from_values({1}, {1}));
    probe::report_grads({w}, true);
    scope.end({.step = step});
  }
  EXPECT_EQ(sink->steps_with_ops(), (std::vector<std::int64_t>{0, 2}));
  ASSERT_EQ(sink->grads.size(), 2u);
  EXPECT_EQ(sink->grads[1].step, 2);
  EXPECT_EQ(sink->grads[1].pos_inf, 1);
}

}  // namespace
}  // namespace ampscope
