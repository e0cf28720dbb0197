// tests/scaler/training_loop_test.cpp: GradScaler in PyTorch's training loop (scale the loss, backward,
// unscale_, clip_grad_norm_, step, update) on the CPU backend, the section-3 loop checks of
// reference/amp-semantics.md (clipping, accumulation, several optimizers, invalidated gradients), and
// the probe events.
//
// References: the scale sequence is recomputed in the test from rule 1.9 in double; the parameters are
// compared with an unscaled control run of the same model. Scales are powers of two and a product by
// 2^k is exact in binary floating point (away from overflow and subnormals), and every backward op is
// linear in the incoming gradient, so the scaled gradients are exactly 2^k times the control's and,
// once unscaled, equal to them bit for bit: the f32 runs must match the control exactly, not within a
// tolerance. Clipping the scaled gradients at max_norm * scale is the one check that is only close
// (the 1e-6 in clip_grad_norm_'s denominator is not scaled).
#include "core/grad_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Rule 1.9 of the reference, in double (every scale here is a power of two, exact in f32 too).
struct ReferenceScaler {
  double scale;
  double growth, backoff;
  std::int64_t interval;
  std::int64_t tracker = 0;

  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      if (std::isfinite(static_cast<float>(scale * growth))) scale *= growth;
      tracker = 0;
    }
  }
};

std::vector<std::vector<double>> values_of(const std::vector<Tensor>& params) {
  std::vector<std::vector<double>> out;
  for (const Tensor& p : params) out.push_back(p.values());
  return out;
}

samples::Dataset blobs(std::int64_t samples, std::int64_t features) {
  Generator gen(7);
  return samples::make_blobs({.samples = samples, .features = features, .classes = 4}, gen);
}

std::shared_ptr<nn::Sequential> mlp(std::uint64_t seed) {
  Generator gen(seed);
  return samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
}

// ---- the "done when" loop ----

// A two-layer classifier whose parameters are f32 and whose activations are f16, cast by hand the way
// autocast would: linear runs in f16, the loss in f32. Gradients come back to the f32 parameters.
struct HalfActivationModel {
  Tensor w1, b1, w2, b2;

  explicit HalfActivationModel(Generator& gen) {
    w1 = mul(randn({16, 8}, gen), 0.3).set_name("fc1.weight").requires_grad_();
    b1 = zeros({16}).set_name("fc1.bias").requires_grad_();
    w2 = mul(randn({4, 16}, gen), 0.3).set_name("fc2.weight").requires_grad_();
    b2 = zeros({4}).set_name("fc2.bias").requires_grad_();
  }
  std::vector<Tensor> parameters() const { return {w1, b1, w2, b2}; }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    const Tensor h = relu(linear(x.to(DType::f16), w1.to(DType::f16), b1.to(DType::f16)));
    const Tensor logits = linear(h, w2.to(DType::f16), b2.to(DType::f16)).to(DType::f32);
    return cross_entropy(logits, y);
  }
};

TEST(grad_scaler_training_test, scale_sequence_and_skipped_steps_follow_the_update_rule) {
  const samples::Dataset data = blobs(256, 8);
  Generator gen(3);
  HalfActivationModel model(gen);
  const std::vector<Tensor> params = model.parameters();
  optim::Adam opt(params, {.lr = 1e-2});
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0, .growth_interval = 3});
  ReferenceScaler ref{1024.0, 2.0, 0.5, 3};

  const std::set<int> inject = {2, 5, 6, 13, 20, 21};
  int skipped = 0;
  for (int it = 0; it < 24; ++it) {
    const std::int64_t b = (it % 4) * 64;
    const Tensor loss = model.loss(data.x.slice(0, b, b + 64), data.y.slice(0, b, b + 64));
    opt.zero_grad();
    scaler.scale(loss).backward();
    EXPECT_EQ(params[0].grad().dtype(), DType::f32);
    if (inject.count(it) != 0) params[it % 4].grad().view({-1}).set({1}, it % 2 == 0 ? kInf : kNaN);
    scaler.unscale_(opt);
    optim::clip_grad_norm_(params, 1.0);
    const auto before = values_of(params);
    const std::int64_t adam_steps = opt.state(params[0]).step;
    const StepResult r = scaler.step(opt, return_found_inf);
    scaler.update();
    ref.update(inject.count(it) != 0);

    // Only the injected iterations overflow (the scales stay far from f16's range).
    EXPECT_EQ(r.found_inf, inject.count(it) != 0) << "iteration " << it;
    EXPECT_EQ(r.stepped, !r.found_inf);
    if (r.found_inf) {
      ++skipped;
      EXPECT_EQ(values_of(params), before) << "iteration " << it << " was skipped";
      EXPECT_EQ(opt.state(params[0]).step, adam_steps) << "Adam's step count must not advance";
    } else {
      EXPECT_NE(values_of(params), before) << "iteration " << it << " stepped";
      EXPECT_EQ(opt.state(params[0]).step, adam_steps + 1);
    }
    ASSERT_EQ(scaler.get_scale(), ref.scale) << "iteration " << it;
    ASSERT_EQ(scaler.get_growth_tracker(), ref.tracker) << "iteration " << it;
  }
  EXPECT_EQ(skipped, static_cast<int>(inject.size()));
  // By hand: 1024 -> 512 (it 2) -> 256, 128 (5, 6) -> 256 (9) -> 512 (12) -> 256 (13) -> 512 (16)
  // -> 1024 (19) -> 512, 256 (20, 21): the rule grew and backed off along the way.
  EXPECT_EQ(scaler.get_scale(), 256.0);
}

// ---- section 3 loop checks, against an unscaled control ----

struct Pair {
  std::shared_ptr<nn::Sequential> model = mlp(11);
  std::shared_ptr<nn::Sequential> control = mlp(11);
};

TEST(grad_scaler_training_test, unscale_then_clip_matches_an_unscaled_control_exactly) {
  // test_grad_scaling_clipping_separate_unscale: init 128, interval 1, 4 batches, inf at batch 2.
  const samples::Dataset data = blobs(128, 8);
  Pair p;
  optim::Adam opt(p.model->parameters(), {.lr = 1e-2});
  optim::Adam control_opt(p.control->parameters(), {.lr = 1e-2});
  GradScaler scaler({.device = "cpu", .init_scale = 128.0, .growth_interval = 1});
  const double max_norm = 0.2;  // small enough that every batch clips
  for (int i = 0; i < 4; ++i) {
    const Tensor x = data.x.slice(0, i * 32, i * 32 + 32), y = data.y.slice(0, i * 32, i * 32 + 32);
    opt.zero_grad();
    scaler.scale(cross_entropy((*p.model)(x), y)).backward();
    if (i == 2) p.model->parameters()[2].grad().set({0, 0}, kInf);
    scaler.unscale_(opt);
    const double total = optim::clip_grad_norm_(p.model->parameters(), max_norm).item();
    scaler.step(opt);
    scaler.update();

    control_opt.zero_grad();
    cross_entropy((*p.control)(x), y).backward();
    const double control_total = optim::clip_grad_norm_(p.control->parameters(), max_norm).item();
    if (i != 2) {
      EXPECT_EQ(total, control_total) << "batch " << i;
      EXPECT_GT(control_total, max_norm);
      control_opt.step();
    }
    ASSERT_EQ(values_of(p.model->parameters()), values_of(p.control->parameters())) << "batch " << i;
  }
  EXPECT_EQ(scaler.get_scale(), 128.0 * 2 * 2 * 2 * 0.5);  // 512: three growths, one backoff
}

TEST(grad_scaler_training_test, copying_the_scaler_between_iterations_changes_nothing) {
  // test_grad_scaling_autocast's pickle round trip: a copy taken after each update() (PyTorch's
  // pickling) continues exactly as the original would.
  const samples::Dataset data = blobs(192, 8);
  Pair p;
  optim::Adam opt(p.model->parameters(), {.lr = 1e-2});
  optim::Adam other_opt(p.control->parameters(), {.lr = 1e-2});
  GradScaler scaler({.device = "cpu", .init_scale = 128.0, .growth_interval = 2});
  GradScaler copied({.device = "cpu", .init_scale = 128.0, .growth_interval = 2});
  for (int i = 0; i < 6; ++i) {
    const Tensor x = data.x.slice(0, i * 32, i * 32 + 32), y = data.y.slice(0, i * 32, i * 32 + 32);
    for (auto [model, o, s] :
         {std::tuple{p.model.get(), &opt, &scaler}, std::tuple{p.control.get(), &other_opt, &copied}}) {
      o->zero_grad();
      s->scale(cross_entropy((*model)(x), y)).backward();
      if (i == 3) model->parameters()[0].grad().set({0, 0}, kNaN);
      s->step(*o);
      s->update();
    }
    copied = GradScaler(copied);
    EXPECT_EQ(copied.get_scale(), scaler.get_scale()) << "iteration " << i;
    EXPECT_EQ(copied.get_growth_tracker(), scaler.get_growth_tracker()) << "iteration " << i;
    ASSERT_EQ(values_of(p.model->parameters()), values_of(p.control->parameters())) << "iteration " << i;
  }
  EXPECT_EQ(scaler.get_scale(), 128.0 * 2 * 0.5 * 2);  // grew at 1, backed off at 3, grew at 5
}

TEST(grad_scaler_training_test, clipping_scaled_grads_at_max_norm_times_scale_matches_the_control) {
  // test_grad_scaling_clipping: clip before unscaling, at max_norm * get_scale().
  const samples::Dataset data = blobs(128, 8);
  Pair p;
  optim::SGD opt(p.model->parameters(), {.lr = 0.1});
  optim::SGD control_opt(p.control->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 128.0, .growth_interval = 1});
  const double max_norm = 0.2;
  for (int i = 0; i < 4; ++i) {
    const Tensor x = data.x.slice(0, i * 32, i * 32 + 32), y = data.y.slice(0, i * 32, i * 32 + 32);
    opt.zero_grad();
    scaler.scale(cross_entropy((*p.model)(x), y)).backward();
    if (i == 2) p.model->parameters()[2].grad().set({0, 0}, kInf);
    optim::clip_grad_norm_(p.model->parameters(), max_norm * scaler.get_scale());
    scaler.step(opt);
    scaler.update();

    control_opt.zero_grad();
    cross_entropy((*p.control)(x), y).backward();
    optim::clip_grad_norm_(p.control->parameters(), max_norm);
    if (i != 2) control_opt.step();
    const auto a = values_of(p.model->parameters()), c = values_of(p.control->parameters());
    for (std::size_t t = 0; t < a.size(); ++t) {
      for (std::size_t e = 0; e < a[t].size(); ++e) {
        // The coefficients differ by the unscaled 1e-6 guard: a few f32 ulps after the step.
        ASSERT_NEAR(a[t][e], c[t][e], 1e-6) << "batch " << i << ", tensor " << t << ", element " << e;
      }
    }
  }
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

TEST(grad_scaler_training_test, accumulation_steps_once_per_effective_batch) {
  // test_grad_scaling_accumulation: 4 micro-batches, step every 2: two growths, scale 512.
  const samples::Dataset data = blobs(128, 8);
  Pair p;
  optim::SGD opt(p.model->parameters(), {.lr = 0.1});
  optim::SGD control_opt(p.control->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 128.0, .growth_interval = 1});
  for (int i = 0; i < 4; ++i) {
    const Tensor x = data.x.slice(0, i * 32, i * 32 + 32), y = data.y.slice(0, i * 32, i * 32 + 32);
    scaler.scale(div(cross_entropy((*p.model)(x), y), 2.0)).backward();
    div(cross_entropy((*p.control)(x), y), 2.0).backward();
    if ((i + 1) % 2 == 0) {
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
      opt.zero_grad();
      control_opt.step();
      control_opt.zero_grad();
    }
    ASSERT_EQ(values_of(p.model->parameters()), values_of(p.control->parameters())) << "micro-batch " << i;
  }
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

TEST(grad_scaler_training_test, only_the_overflowing_optimizer_skips_and_the_scale_backs_off_once) {
  // test_grad_scaling_multiple: two models, two optimizers, two losses; an inf in model1 at batch 2;
  // unscale_ called separately for optimizer0.
  const samples::Dataset data = blobs(128, 8);
  auto model0 = mlp(21), model1 = mlp(22), control0 = mlp(21), control1 = mlp(22);
  optim::SGD opt0(model0->parameters(), {.lr = 0.1}), c_opt0(control0->parameters(), {.lr = 0.1});
  optim::Adam opt1(model1->parameters(), {.lr = 1e-2}), c_opt1(control1->parameters(), {.lr = 1e-2});
  GradScaler scaler({.device = "cpu", .init_scale = 128.0, .growth_interval = 1});
  const auto losses = [](nn::Sequential& m0, nn::Sequential& m1, const Tensor& x, const Tensor& y) {
    const Tensor out0 = m0(x), out1 = m1(x);
    return std::pair{cross_entropy(add(mul(out0, 0.3), mul(out1, 0.7)), y),
                     cross_entropy(sub(mul(out0, 0.6), mul(out1, 0.4)), y)};
  };
  for (int i = 0; i < 4; ++i) {
    const Tensor x = data.x.slice(0, i * 32, i * 32 + 32), y = data.y.slice(0, i * 32, i * 32 + 32);
    opt0.zero_grad();
    opt1.zero_grad();
    const auto [loss0, loss1] = losses(*model0, *model1, x, y);
    scaler.scale(loss0).backward(Tensor(), /*retain_graph=*/true);
    scaler.scale(loss1).backward();
    if (i == 2) {
      NoGradGuard no_grad;
      model1->parameters()[2].grad().fill_(kInf);  // fc2.weight of model1
    }
    scaler.unscale_(opt0);
    EXPECT_TRUE(scaler.step(opt0)) << "batch " << i;
    EXPECT_EQ(scaler.step(opt1), i != 2) << "batch " << i;
    scaler.update();

    c_opt0.zero_grad();
    c_opt1.zero_grad();
    const auto [c_loss0, c_loss1] = losses(*control0, *control1, x, y);
    c_loss0.backward(Tensor(), true);
    c_loss1.backward();
    c_opt0.step();
    if (i != 2) c_opt1.step();
    ASSERT_EQ(values_of(model0->parameters()), values_of(control0->parameters())) << "batch " << i;
    ASSERT_EQ(values_of(model1->parameters()), values_of(control1->parameters())) << "batch " << i;
  }
  EXPECT_EQ(scaler.get_scale(), 512.0);  // 128 * 2^3 * 0.5: one backoff for the iteration
}

TEST(grad_scaler_training_test, grads_broken_after_unscale_are_not_checked_again) {
  // test_grads_invalidated_between_unscale_and_step.
  const samples::Dataset data = blobs(32, 8);
  auto model = mlp(5);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu"});
  scaler.scale(cross_entropy((*model)(data.x), data.y)).backward();
  scaler.unscale_(opt);
  const std::vector<Tensor> params = model->parameters();
  for (std::size_t j = 0; j < params.size(); ++j) {
    NoGradGuard no_grad;
    params[j].grad().fill_(j % 2 == 1 ? kInf : kNaN);
  }
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  for (const Tensor& p : params) {
    bool non_finite = false;
    for (double v : p.values()) non_finite = non_finite || !std::isfinite(v);
    EXPECT_TRUE(non_finite) << p.name();
  }
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // the recorded check was clean: no backoff
}

// ---- probe events ----

struct Recorder : probe::Hook {
  std::vector<probe::ScalerEvent> events;
  int ops = 0;
  void on_op(const probe::OpEvent&) override { ++ops; }
  void on_scaler(const probe::ScalerEvent& event) override { events.push_back(event); }
};

TEST(grad_scaler_training_test, reports_each_update_to_the_probe_hook) {
  auto recorder = std::make_shared<Recorder>();
  Tensor a = zeros({2, 3}).set_name("a.weight").requires_grad_();
  Tensor b = zeros({3}).set_name("b.weight").requires_grad_();
  Tensor unnamed = zeros({2}).requires_grad_();
  optim::SGD opt0({a});
  optim::Adam opt1({b, unnamed});
  GradScaler scaler({.device = "cpu", .init_scale = 8.0, .growth_interval = 3});
  const auto backward = [&] {
    const Tensor loss = add(add(sum(a), sum(b)), sum(unnamed));
    scaler.scale(loss).backward();
  };

  probe::HookGuard guard(recorder);
  // Iteration 0: clean.
  backward();
  int ops_before = recorder->ops;
  scaler.unscale_(opt0);
  scaler.step(opt0);
  scaler.step(opt1);
  scaler.update();
  EXPECT_EQ(recorder->ops, ops_before) << "the scaler's own ops (and the optimizers') must not be reported";

  // Iteration 1: 2 infs and a NaN in a.weight, a NaN in the unnamed parameter; opt1 is used first.
  opt0.zero_grad();
  opt1.zero_grad();
  backward();
  a.grad().set({0, 1}, kInf);
  a.grad().set({1, 2}, -kInf);
  a.grad().set({1, 0}, kNaN);
  unnamed.grad().set({1}, kNaN);
  ops_before = recorder->ops;
  EXPECT_FALSE(scaler.step(opt1));
  EXPECT_FALSE(scaler.step(opt0));
  scaler.update();
  EXPECT_EQ(recorder->ops, ops_before) << "the scaler's own ops must not be reported";

  // Iteration 2: an explicit scale.
  opt0.zero_grad();
  opt1.zero_grad();
  backward();
  scaler.update(32.0);

  ASSERT_EQ(recorder->events.size(), 3u);
  const probe::ScalerEvent& e0 = recorder->events[0];
  EXPECT_EQ(e0.iteration, 0);
  EXPECT_EQ(e0.scale, 8.0);
  ASSERT_EQ(e0.optimizers.size(), 2u);
  EXPECT_EQ(e0.optimizers[0].optimizer, "SGD #0");
  EXPECT_EQ(e0.optimizers[1].optimizer, "Adam #1");
  for (const auto& o : e0.optimizers) {
    EXPECT_FALSE(o.found_inf);
    EXPECT_FALSE(o.skipped);
    EXPECT_TRUE(o.non_finite.empty());
  }
  EXPECT_EQ(e0.change, probe::ScalerEvent::Change::kept);
  EXPECT_EQ(e0.new_scale, 8.0);
  EXPECT_EQ(e0.growth_tracker, 1);
  EXPECT_EQ(e0.hysteresis_tracker, -1);

  const probe::ScalerEvent& e1 = recorder->events[1];
  EXPECT_EQ(e1.iteration, 1);
  EXPECT_EQ(e1.scale, 8.0);
  ASSERT_EQ(e1.optimizers.size(), 2u);
  // Ordered and numbered by first use, not by this iteration's order of calls.
  const probe::ScalerOptimizerReport& sgd = e1.optimizers[0];
  const probe::ScalerOptimizerReport& adam = e1.optimizers[1];
  EXPECT_EQ(sgd.optimizer, "SGD #0");
  EXPECT_TRUE(sgd.found_inf);
  EXPECT_TRUE(sgd.skipped);
  ASSERT_EQ(sgd.non_finite.size(), 1u);
  EXPECT_EQ(sgd.non_finite[0].name, "a.weight");
  EXPECT_EQ(sgd.non_finite[0].inf_count, 2);
  EXPECT_EQ(sgd.non_finite[0].nan_count, 1);
  EXPECT_EQ(adam.optimizer, "Adam #1");
  EXPECT_TRUE(adam.found_inf);
  EXPECT_TRUE(adam.skipped);
  ASSERT_EQ(adam.non_finite.size(), 1u);  // b.weight was clean
  EXPECT_EQ(adam.non_finite[0].name, "group 0, parameter 1");
  EXPECT_EQ(adam.non_finite[0].inf_count, 0);
  EXPECT_EQ(adam.non_finite[0].nan_count, 1);
  EXPECT_EQ(e1.change, probe::ScalerEvent::Change::backoff);
  EXPECT_EQ(e1.new_scale, 4.0);
  EXPECT_EQ(e1.growth_tracker, 0);
  EXPECT_EQ(probe::change_name(e1.change), "backoff");

  const probe::ScalerEvent& e2 = recorder->events[2];
  EXPECT_EQ(e2.iteration, 2);
  EXPECT_EQ(e2.scale, 4.0);
  EXPECT_EQ(e2.change, probe::ScalerEvent::Change::explicit_scale);
  EXPECT_EQ(e2.new_scale, 32.0);
  EXPECT_EQ(e2.growth_tracker, 0);
  EXPECT_TRUE(e2.optimizers.empty());
}

TEST(grad_scaler_training_test, reports_growth_and_hysteresis_in_events) {
  auto recorder = std::make_shared<Recorder>();
  Tensor w = zeros({2}).set_name("w").requires_grad_();
  optim::SGD opt({w});
  GradScaler scaler({.device = "cpu", .init_scale = 8.0, .growth_interval = 1, .extensions = {.hysteresis = 2}});
  probe::HookGuard guard(recorder);
  for (bool overflow : {false, true}) {
    opt.zero_grad();
    scaler.scale(sum(w)).backward();
    if (overflow) w.grad().set({0}, kInf);
    scaler.step(opt);
    scaler.update();
  }
  ASSERT_EQ(recorder->events.size(), 2u);
  EXPECT_EQ(recorder->events[0].change, probe::ScalerEvent::Change::growth);
  EXPECT_EQ(recorder->events[0].new_scale, 16.0);
  EXPECT_EQ(recorder->events[0].hysteresis_tracker, 2);
  // The overflow is absorbed by hysteresis: skipped, scale kept, tracker down to 1.
  EXPECT_EQ(recorder->events[1].change, probe::ScalerEvent::Change::kept);
  EXPECT_TRUE(recorder->events[1].optimizers.at(0).skipped);
  EXPECT_EQ(recorder->events[1].new_scale, 16.0);
  EXPECT_EQ(recorder->events[1].hysteresis_tracker, 1);
}

TEST(grad_scaler_training_test, sends_nothing_without_a_hook) {
  // No hook: no counts are computed either (they would appear in the next event otherwise).
  Tensor w = zeros({2}).set_name("w").requires_grad_();
  optim::SGD opt({w});
  GradScaler scaler({.device = "cpu"});
  scaler.scale(sum(w)).backward();
  w.grad().set({0}, kInf);
  EXPECT_FALSE(scaler.step(opt));
  auto recorder = std::make_shared<Recorder>();
  probe::HookGuard guard(recorder);
  scaler.update();
  ASSERT_EQ(recorder->events.size(), 1u);
  EXPECT_TRUE(recorder->events[0].optimizers.at(0).found_inf);
  EXPECT_TRUE(recorder->events[0].optimizers.at(0).non_finite.empty());
}

}  // namespace
}  // namespace ampscope
