// tests/probes/training_step_test.cpp: probe::Step (core/training_step.h) as a training loop uses it, with
// the probe writing to an in-memory sink.
//
// References, each independent of Step::finish:
// - the /steps rows of the same run written the way cli/run.cpp wrote them by hand before it used
//   Step (the loop below, a copy of that code): the rows must be the same, field for field but time;
// - the scale before and after each update from the GradScaler rules (reference/amp-semantics.md 1.9:
//   a clean step counts the tracker up and the scale doubles when it reaches growth_interval, the
//   tracker going back to 0; an overflow halves the scale and zeroes the tracker), worked out by hand for
//   init_scale 256, growth_interval 2 and an inf planted in the input of step 3;
// - the gradient norm computed here in double from the gradients' values.
#include "core/training_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "probes/probe.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/probes/memory_sink.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::MemorySink;
using testing::Probed;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kPlantedStep = 3;

bool same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// A small MLP and its data; step kPlantedStep's input holds 1e6, which overflows f16 (65504) when autocast
// casts it: the forward makes inf, the gradients NaN, and the scaler must skip that step.
struct Loop {
  Generator gen{3};
  std::shared_ptr<nn::Sequential> model = samples::make_mlp({.in_features = 6, .hidden = 8, .classes = 3}, gen);
  optim::Adam opt{model->parameters(), {.lr = 1e-2}};
  GradScaler scaler;
  samples::Dataset data;

  explicit Loop(GradScalerOptions scaler_options) : scaler(scaler_options) {
    Generator data_gen(11);
    data = samples::make_blobs({.samples = 16, .features = 6, .classes = 3}, data_gen);
  }
  Tensor input(std::int64_t step) const {
    if (step != kPlantedStep) return data.x;
    std::vector<double> v = data.x.values();
    v[0] = 1e6;
    return from_values(v, data.x.shape());
  }
  Tensor forward_loss(std::int64_t step, DType dtype = DType::f16) {
    AutocastGuard autocast(dtype);
    return cross_entropy((*model)(input(step)), data.y);
  }
  // The unscaled gradient norm, in double from the gradients' values.
  double grad_norm_in_double() const {
    double sum = 0;
    for (const Tensor& p : model->parameters()) {
      if (!p.grad().defined()) continue;
      for (double g : p.grad().values()) sum += g * g;
    }
    return std::sqrt(sum);
  }
};

// cli/run.cpp's step before probe::Step, kept here as the reference: scale read before backward,
// unscale_, report_grads without a scaler, clip (an infinite max_norm measures without changing a bit),
// step, update, then the summary filled field by field.
probe::StepSummary hand_filled_step(Loop& run, std::int64_t step, double& norm_in_double) {
  probe::StepScope scope(step);
  run.opt.zero_grad();
  const Tensor loss = run.forward_loss(step);
  const double scale = run.scaler.is_enabled() ? run.scaler.get_scale() : 1.0;
  run.scaler.scale(loss).backward();
  run.scaler.unscale_(run.opt);
  if (!run.scaler.is_enabled()) probe::report_grads(run.model->parameters(), /*unscaled=*/true);
  const double grad_norm = optim::clip_grad_norm_(run.model->parameters(), kInf).item();
  const StepResult stepped = run.scaler.step(run.opt, return_found_inf);
  run.scaler.update();
  norm_in_double = run.grad_norm_in_double();
  probe::StepSummary summary;
  summary.step = step;
  summary.loss = loss.item();
  summary.scale = scale;
  summary.scale_after = run.scaler.is_enabled() ? run.scaler.get_scale() : 1.0;
  summary.found_inf = stepped.found_inf;
  summary.skipped = !stepped.stepped;
  summary.growth_tracker = run.scaler.is_enabled() ? run.scaler.get_growth_tracker() : 0;
  summary.grad_norm = grad_norm;
  summary.lr = run.opt.param_groups()[0].options.lr;
  scope.end(summary);
  return summary;
}

probe::StepSummary recorded_step(Loop& run, std::int64_t step, probe::FinishOptions options, double& norm_in_double) {
  probe::Step recorded(step);
  run.opt.zero_grad();
  const Tensor loss = run.forward_loss(step);
  run.scaler.scale(loss).backward();
  const probe::StepSummary summary = recorded.finish(loss, run.opt, run.scaler, options);
  norm_in_double = run.grad_norm_in_double();  // the gradients finish() stepped with, still in place
  return summary;
}

TEST(training_step_test, finish_writes_the_steps_rows_train_wrote_by_hand_and_follows_the_scaler_rules) {
  const GradScalerOptions scaler_options{.device = "cpu", .init_scale = 256.0, .growth_interval = 2};
  Probed by_hand, by_step;
  Loop hand_run(scaler_options), step_run(scaler_options);
  std::vector<double> hand_norms, step_norms, plain_norms;
  {
    probe::HookGuard installed(by_hand.probe);
    for (std::int64_t step = 0; step < 6; ++step) hand_filled_step(hand_run, step, hand_norms.emplace_back());
  }
  {
    probe::HookGuard installed(by_step.probe);
    for (std::int64_t step = 0; step < 6; ++step) {
      recorded_step(step_run, step, {.max_grad_norm = kInf}, step_norms.emplace_back());
    }
  }

  // Hand-worked from the update rule: (scale used, scale after, tracker after) per step.
  struct Expected {
    double scale, scale_after;
    std::int64_t tracker;
    bool skipped;
  };
  const std::vector<Expected> expected = {
      {256, 256, 1, false},  // clean: tracker 0 -> 1
      {256, 512, 0, false},  // clean: tracker reaches 2 = growth_interval: x2, tracker 0
      {512, 512, 1, false},  // clean
      {512, 256, 0, true},   // the planted inf: skipped, x0.5, tracker 0
      {256, 256, 1, false},
      {256, 512, 0, false},
  };
  ASSERT_EQ(by_step.sink->steps.size(), expected.size());
  ASSERT_EQ(by_hand.sink->steps.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const trace::StepRow& s = by_step.sink->steps[i];
    const trace::StepRow& h = by_hand.sink->steps[i];
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(s.step, static_cast<std::int64_t>(i));
    EXPECT_EQ(s.scale, expected[i].scale);
    EXPECT_EQ(s.scale_after, expected[i].scale_after);
    EXPECT_EQ(s.growth_tracker, expected[i].tracker);
    EXPECT_EQ(s.skipped, expected[i].skipped);
    EXPECT_EQ(s.found_inf, expected[i].skipped);
    EXPECT_EQ(s.lr, 1e-2);
    EXPECT_GE(s.time_ms, 0.0);
    if (expected[i].skipped) {
      EXPECT_FALSE(std::isfinite(s.grad_norm)) << "the gradients of the planted step are not finite";
    } else {
      EXPECT_TRUE(std::isfinite(s.loss));
      // f32 sums of squares against the double sum: a few ulps of f32.
      EXPECT_NEAR(s.grad_norm, step_norms[i], 1e-6 * step_norms[i]);
    }
    // The same run, written by hand: every field but the time.
    EXPECT_EQ(h.step, s.step);
    EXPECT_TRUE(same(h.loss, s.loss)) << h.loss << " vs " << s.loss;
    EXPECT_EQ(h.scale, s.scale);
    EXPECT_EQ(h.scale_after, s.scale_after);
    EXPECT_EQ(h.found_inf, s.found_inf);
    EXPECT_EQ(h.skipped, s.skipped);
    EXPECT_EQ(h.growth_tracker, s.growth_tracker);
    EXPECT_TRUE(same(h.grad_norm, s.grad_norm)) << h.grad_norm << " vs " << s.grad_norm;
    EXPECT_EQ(h.lr, s.lr);
  }
  // The same gradient rows too (the scaler reports them from unscale_ in both loops, once each way).
  ASSERT_EQ(by_step.sink->grads.size(), by_hand.sink->grads.size());
  ASSERT_EQ(by_step.sink->grads.size(), 6u * 2u * step_run.model->parameters().size())
      << "6 steps, scaled and unscaled, every parameter";
  for (std::size_t i = 0; i < by_step.sink->grads.size(); ++i) {
    EXPECT_EQ(by_step.sink->grads[i].param, by_hand.sink->grads[i].param);
    EXPECT_TRUE(same(by_step.sink->grads[i].norm, by_hand.sink->grads[i].norm));
  }

  // Without max_grad_norm the norm is measured (no clipping pass) and is the same number.
  Probed plain;
  Loop plain_run(scaler_options);
  for (std::int64_t step = 0; step < 3; ++step) recorded_step(plain_run, step, {}, plain_norms.emplace_back());
  ASSERT_EQ(plain.sink->steps.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(plain.sink->steps[i].grad_norm, by_step.sink->steps[i].grad_norm);
}

TEST(training_step_test, finish_returns_the_row_it_wrote_and_a_given_norm_is_recorded_as_given) {
  Probed p;
  Loop run({.device = "cpu", .init_scale = 1024.0});
  probe::Step step(0);
  const Tensor loss = run.forward_loss(0);
  run.scaler.scale(loss).backward();
  run.scaler.unscale_(run.opt);  // the loop clips itself, then tells finish() the norm
  const double norm = optim::clip_grad_norm_(run.model->parameters(), 0.5).item();
  const probe::StepSummary s = step.finish(loss, run.opt, run.scaler, {.grad_norm = norm});
  ASSERT_EQ(p.sink->steps.size(), 1u);
  EXPECT_EQ(p.sink->steps[0].grad_norm, norm);
  EXPECT_EQ(s.grad_norm, norm);
  EXPECT_EQ(s.loss, loss.item());
  EXPECT_EQ(s.scale, 1024.0);
  EXPECT_EQ(s.scale_after, 1024.0);  // one clean step of 2000 before a growth
  EXPECT_EQ(s.growth_tracker, 1);
}

TEST(training_step_test, runs_without_a_scaler_get_one_set_of_unscaled_gradient_rows_per_step) {
  for (const bool loop_reports_too : {false, true}) {
    for (const bool disabled_scaler : {false, true}) {
      SCOPED_TRACE(std::string(loop_reports_too ? "the loop also calls report_grads" : "finish reports") +
                   (disabled_scaler ? ", a disabled GradScaler" : ", no GradScaler"));
      Probed p;
      Loop run({.device = "cpu", .enabled = false});
      for (std::int64_t step = 0; step < 2; ++step) {
        probe::Step recorded(step);
        run.opt.zero_grad();
        const Tensor loss = run.forward_loss(/*step=*/0, DType::bf16);
        loss.backward();
        if (loop_reports_too) probe::report_grads(run.model->parameters(), /*unscaled=*/true);
        const double norm = run.grad_norm_in_double();
        const probe::StepSummary s =
            disabled_scaler ? recorded.finish(loss, run.opt, run.scaler) : recorded.finish(loss, run.opt);
        EXPECT_EQ(s.scale, 1.0);
        EXPECT_EQ(s.scale_after, 1.0);
        EXPECT_FALSE(s.skipped);
        EXPECT_NEAR(s.grad_norm, norm, 1e-6 * norm);
        std::vector<trace::GradRow> rows;
        for (const trace::GradRow& r : p.sink->grads) {
          if (r.step == step) rows.push_back(r);
        }
        const std::vector<Tensor> params = run.model->parameters();
        ASSERT_EQ(rows.size(), params.size()) << "one row per parameter, never two";
        for (std::size_t i = 0; i < rows.size(); ++i) {
          EXPECT_TRUE(rows[i].unscaled);
          EXPECT_EQ(rows[i].param, params[i].name());
          double sum = 0;
          for (double g : params[i].grad().values()) sum += g * g;
          EXPECT_NEAR(rows[i].norm, std::sqrt(sum), 1e-9 * std::sqrt(sum)) << rows[i].param;
        }
      }
      EXPECT_EQ(p.sink->steps.size(), 2u);
    }
  }
}

TEST(training_step_test, a_step_whose_code_throws_is_abandoned_and_the_probe_records_the_next_one) {
  Probed p;
  Loop run({.device = "cpu", .init_scale = 256.0});
  auto good_step = [&](std::int64_t step) {
    probe::Step recorded(step);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(0);
    run.scaler.scale(loss).backward();
    recorded.finish(loss, run.opt, run.scaler);
  };
  good_step(0);
  const std::size_t ops_of_a_step = p.sink->ops_of_step(0).size();
  ASSERT_GT(ops_of_a_step, 0u);
  try {
    probe::Step recorded(1);
    const Tensor loss = run.forward_loss(0);
    throw std::runtime_error("the loop's own code failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(probe::current_step(), -1);
  // The abandoned step is closed at once: written (it is selected) without a /steps row.
  ASSERT_EQ(p.sink->ended, (std::vector<std::int64_t>{0, 1}));
  EXPECT_FALSE(p.sink->ops_of_step(1).empty());
  // An evaluation after the failure is outside any step: not recorded (outside_steps is off).
  {
    NoGradGuard no_grad;
    (*run.model)(run.data.x);
  }
  EXPECT_TRUE(p.sink->ops_of_step(-1).empty());
  // The next step is recorded as the first was.
  good_step(2);
  EXPECT_EQ(p.sink->ended, (std::vector<std::int64_t>{0, 1, 2}));
  ASSERT_EQ(p.sink->steps.size(), 2u);
  EXPECT_EQ(p.sink->steps[0].step, 0);
  EXPECT_EQ(p.sink->steps[1].step, 2);
  const std::vector<trace::OpRow> ops = p.sink->ops_of_step(2);
  ASSERT_EQ(ops.size(), ops_of_a_step);
  EXPECT_EQ(ops.front().seq, 0);

  // A refusal inside finish() abandons the step the same way.
  try {
    probe::Step recorded(3);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(0);
    run.scaler.scale(loss).backward();
    recorded.finish(loss, run.opt, run.scaler, {.max_grad_norm = 1.0, .grad_norm = 2.0});
    ADD_FAILURE() << "finish() accepted both max_grad_norm and grad_norm";
  } catch (const Error&) {
  }
  EXPECT_EQ(p.sink->ended.back(), 3);
  EXPECT_EQ(p.sink->steps.size(), 2u);
}

TEST(training_step_test, pausing_hides_everything_until_the_guard_ends) {
  Probed p;
  const Tensor x = from_values({1, 2, 3, 4}, {2, 2});
  Tensor w = from_values({0.5, -1, 2, 0.25}, {2, 2});
  w.requires_grad_();
  Tensor hidden;
  {
    probe::StepScope scope(0);
    const Tensor a = relu(x);  // recorded: seq 0
    {
      probe::Paused paused;
      EXPECT_EQ(probe::hook(), nullptr);
      hidden = exp(matmul(a, w));  // not recorded, nor is its backward, nor the gradient report
      sum(hidden).backward();
      probe::report_grads({w}, true);
    }
    EXPECT_EQ(probe::hook(), p.probe.get());
    add(hidden, a);  // recorded: its first input was made while paused, so it counts as data
    scope.end({.step = 0});
  }
  const std::vector<trace::OpRow> ops = p.sink->ops_of_step(0);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].op, "relu");
  EXPECT_EQ(ops[1].op, "add");
  EXPECT_EQ(ops[1].inputs[0], trace::kInputData);
  EXPECT_EQ(ops[1].inputs[1], ops[0].seq);
  EXPECT_TRUE(p.sink->grads.empty());
  ASSERT_TRUE(w.grad().defined()) << "the paused backward ran";

  // A pause also ends with an exception, and reinstalls the probe.
  try {
    probe::Paused paused;
    throw std::runtime_error("inside the pause");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(probe::hook(), p.probe.get());
}

TEST(training_step_test, refuses_a_step_or_update_the_loop_already_took_before_changing_anything) {
  Loop run({.device = "cpu", .init_scale = 256.0});
  auto weights = [&] {
    std::vector<double> all;
    for (const Tensor& p : run.model->parameters()) {
      const std::vector<double> v = p.values();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  {
    Probed p;
    probe::Step step(0);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(0);
    run.scaler.scale(loss).backward();
    run.scaler.step(run.opt);
    run.scaler.update();
    const std::vector<double> after_loop_step = weights();
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler), Error,
                     "probe::Step::finish: the optimizer (Adam) has already stepped in step 0",
                     "remove the loop's own scaler.step(opt) and scaler.update()");
    EXPECT_EQ(weights(), after_loop_step) << "no second step";
  }
  {
    Probed p;
    probe::Step step(1);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(1);
    loss.backward();
    run.opt.step();
    EXPECT_THROW_MSG(step.finish(loss, run.opt), Error, "has already stepped in step 1", "remove the loop's own opt.step()");
  }
  {
    // The planted inf: scaler.step skips (the optimizer never stepped), update() ran.
    probe::Step step(kPlantedStep);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(kPlantedStep);
    run.scaler.scale(loss).backward();
    EXPECT_FALSE(run.scaler.step(run.opt));
    run.scaler.update();
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler), Error,
                     "the GradScaler has already been updated in step 3", "remove the loop's own scaler.update()");
  }
  {
    // scaler.step without update: the scaler's own error, naming finish().
    probe::Step step(kPlantedStep);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(kPlantedStep);
    run.scaler.scale(loss).backward();
    EXPECT_FALSE(run.scaler.step(run.opt));
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler), GradScalerError,
                     "step() has already been called since the last update()",
                     "in probe::Step::finish (step 3), which called scaler.step(opt)");
    run.scaler.update();  // the loop's iteration, finished by hand
  }
  {
    // A loop that unscales itself and asks finish() to clip: unscale_ would run twice.
    probe::Step step(4);
    run.opt.zero_grad();
    const Tensor loss = run.forward_loss(4);
    run.scaler.scale(loss).backward();
    run.scaler.unscale_(run.opt);
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler, {.max_grad_norm = 1.0}), GradScalerError,
                     "unscale_() has already been called", "which called scaler.unscale_(opt)");
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler, {.max_grad_norm = 1.0}), GradScalerError,
                     "unscale_() has already been called");
    const probe::StepSummary s = step.finish(loss, run.opt, run.scaler);  // without clipping: fine
    EXPECT_FALSE(s.skipped);
    EXPECT_THROW_MSG(step.finish(loss, run.opt, run.scaler), Error, "step 4 is already finished");
  }
  {
    probe::Step outer(5);
    const Tensor loss = run.forward_loss(5);
    EXPECT_THROW_MSG(outer.finish(Tensor(), run.opt), Error, "the loss must be a tensor with one element",
                     "an undefined tensor");
  }
}

}  // namespace
}  // namespace ampscope
