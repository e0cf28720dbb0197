// tests/optim/scheduler_test.cpp: the learning-rate schedules of core/optim.h.
//
// Expected values: PyTorch's closed forms (_get_closed_form_lr of StepLR, CosineAnnealingLR, LinearLR),
// written out again in this file, plus points worked out by hand (StepLR's 0.1, 0.01, 0.001; cosine at
// 0, T_max / 2 and T_max; LinearLR's 1/3 -> 1 ramp). The schedules compute the same double expressions,
// so values are compared to 4 ulps (EXPECT_DOUBLE_EQ); the hand-worked points to 1e-15.
#include "core/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"
#include "tests/test_support.h"

namespace {

using namespace ampscope;
using namespace ampscope::optim;

Tensor make_param() {
  Tensor p = zeros({2});
  p.requires_grad_();
  return p;
}

double step_closed(double base, std::int64_t epoch, std::int64_t step_size, double gamma) {
  return base * std::pow(gamma, static_cast<double>(epoch / step_size));
}
double cosine_closed(double base, std::int64_t epoch, std::int64_t t_max, double eta_min) {
  return eta_min + (base - eta_min) * (1 + std::cos(std::numbers::pi * epoch / t_max)) / 2;
}
double linear_closed(double base, std::int64_t epoch, double start, double end, std::int64_t total) {
  return base * (start + (end - start) * std::min(total, epoch) / total);
}

// The lr of every group after construction (epoch 0) and after each of `steps` further steps.
std::vector<std::vector<double>> trace(LRScheduler& sched, Optimizer& opt, int steps) {
  std::vector<std::vector<double>> out;
  for (int e = 0; e <= steps; ++e) {
    if (e > 0) sched.step();
    EXPECT_EQ(sched.last_epoch(), e);
    std::vector<double> lrs;
    for (const ParamGroup& g : opt.param_groups()) lrs.push_back(g.options.lr);
    EXPECT_EQ(sched.get_last_lr(), lrs) << "get_last_lr and the groups disagree at epoch " << e;
    out.push_back(lrs);
  }
  return out;
}

TEST(step_lr_test, decays_by_gamma_every_step_size_epochs) {
  Tensor a = make_param(), b = make_param();
  SGD opt({{.params = {a}, .options = {.lr = 0.1}}, {.params = {b}, .options = {.lr = 0.5}}});
  StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.1);
  const auto lrs = trace(sched, opt, 8);
  for (std::int64_t e = 0; e <= 8; ++e) {
    EXPECT_DOUBLE_EQ(lrs[e][0], step_closed(0.1, e, 2, 0.1)) << "epoch " << e;
    EXPECT_DOUBLE_EQ(lrs[e][1], step_closed(0.5, e, 2, 0.1)) << "epoch " << e;
  }
  // By hand: 0.1, 0.1, 0.01, 0.01, 0.001, ...
  EXPECT_NEAR(lrs[0][0], 0.1, 1e-15);
  EXPECT_NEAR(lrs[1][0], 0.1, 1e-15);
  EXPECT_NEAR(lrs[2][0], 0.01, 1e-15);
  EXPECT_NEAR(lrs[4][0], 0.001, 1e-15);
  EXPECT_EQ(sched.base_lrs(), (std::vector<double>{0.1, 0.5}));
}

TEST(cosine_annealing_lr_test, follows_the_half_cosine_to_eta_min) {
  Tensor a = make_param();
  SGD opt({a}, {.lr = 0.1});
  CosineAnnealingLR sched(opt, /*t_max=*/10, /*eta_min=*/0.001);
  const auto lrs = trace(sched, opt, 14);
  for (std::int64_t e = 0; e <= 14; ++e) {
    EXPECT_DOUBLE_EQ(lrs[e][0], cosine_closed(0.1, e, 10, 0.001)) << "epoch " << e;
  }
  EXPECT_NEAR(lrs[0][0], 0.1, 1e-15);
  EXPECT_NEAR(lrs[5][0], (0.1 + 0.001) / 2, 1e-15);
  EXPECT_NEAR(lrs[10][0], 0.001, 1e-15);
  EXPECT_GT(lrs[12][0], lrs[10][0]);  // the closed form rises again past T_max, as PyTorch's
}

TEST(linear_lr_test, warms_up_from_a_third_over_five_epochs_by_default) {
  Tensor a = make_param();
  SGD opt({a}, {.lr = 0.3});
  LinearLR sched(opt);
  const auto lrs = trace(sched, opt, 8);
  for (std::int64_t e = 0; e <= 8; ++e) {
    EXPECT_DOUBLE_EQ(lrs[e][0], linear_closed(0.3, e, 1.0 / 3, 1.0, 5)) << "epoch " << e;
  }
  // By hand: 0.3 * (1/3 + (2/3) * e / 5) = 0.1, 0.14, 0.18, 0.22, 0.26, then 0.3 from epoch 5 on.
  const double by_hand[] = {0.1, 0.14, 0.18, 0.22, 0.26, 0.3, 0.3, 0.3, 0.3};
  for (int e = 0; e <= 8; ++e) EXPECT_NEAR(lrs[e][0], by_hand[e], 1e-15) << "epoch " << e;
}

TEST(sequential_lr_test, runs_warm_up_then_cosine_restarting_at_the_milestone) {
  Tensor a = make_param();
  AdamW opt({a}, {.lr = 0.01});
  auto warmup = std::make_shared<LinearLR>(opt, 0.1, 1.0, 3);
  auto cosine = std::make_shared<CosineAnnealingLR>(opt, 7, 1e-4);
  SequentialLR sched(opt, {warmup, cosine}, {3});
  const auto lrs = trace(sched, opt, 12);
  for (std::int64_t e = 0; e <= 12; ++e) {
    const double expected = e < 3 ? linear_closed(0.01, e, 0.1, 1.0, 3) : cosine_closed(0.01, e - 3, 7, 1e-4);
    EXPECT_DOUBLE_EQ(lrs[e][0], expected) << "epoch " << e;
  }
  EXPECT_NEAR(lrs[0][0], 0.001, 1e-15);
  EXPECT_NEAR(lrs[3][0], 0.01, 1e-15);   // cosine's epoch 0: the base lr
  EXPECT_NEAR(lrs[10][0], 1e-4, 1e-15);  // cosine's T_max
  // Every schedule took the optimizer's original lr as its base, though the warm-up had already
  // lowered the group's lr when the cosine was built (PyTorch's initial_lr).
  EXPECT_EQ(cosine->base_lrs(), std::vector<double>{0.01});
  EXPECT_EQ(opt.param_groups()[0].initial_lr, 0.01);
}

TEST(warmup_cosine_lr_test, equals_the_sequential_composition) {
  Tensor a = make_param(), b = make_param();
  SGD opt1({a}, {.lr = 0.02});
  SGD opt2({b}, {.lr = 0.02});
  WarmupCosineLR composite(opt1, /*warmup_iters=*/4, /*total_iters=*/20, /*start_factor=*/0.25, /*eta_min=*/0.0);
  auto warmup = std::make_shared<LinearLR>(opt2, 0.25, 1.0, 4);
  auto cosine = std::make_shared<CosineAnnealingLR>(opt2, 16);
  SequentialLR sequential(opt2, {warmup, cosine}, {4});
  const auto x = trace(composite, opt1, 22);
  const auto y = trace(sequential, opt2, 22);
  EXPECT_EQ(x, y);
  EXPECT_NEAR(x[20][0], 0.0, 1e-18);
}

TEST(lr_scheduler_test, resuming_needs_initial_lr_and_continues_the_schedule) {
  Tensor a = make_param();
  SGD opt({a}, {.lr = 0.1});
  EXPECT_THROW_MSG(StepLR(opt, 2, 0.5, /*last_epoch=*/3), Error, "'initial_lr' is not specified in param_groups[0]");
  {
    StepLR first(opt, 2, 0.5);
    for (int i = 0; i < 3; ++i) first.step();
  }
  StepLR resumed(opt, 2, 0.5, /*last_epoch=*/3);  // the constructor steps to epoch 4
  EXPECT_EQ(resumed.last_epoch(), 4);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options.lr, 0.1 * 0.25);
}

TEST(lr_scheduler_test, invalid_arguments_give_pytorchs_messages) {
  Tensor a = make_param();
  SGD opt({a}, {.lr = 0.1});
  EXPECT_THROW_MSG(LinearLR(opt, 0.0), Error,
                   "Starting multiplicative factor expected to be greater than 0 and less or equal to 1.");
  EXPECT_THROW_MSG(LinearLR(opt, 0.5, 1.5), Error, "Ending multiplicative factor expected to be between 0 and 1.");
  EXPECT_THROW_MSG(StepLR(opt, 0), Error, "StepLR", "step_size must be positive, got 0");
  EXPECT_THROW_MSG(CosineAnnealingLR(opt, 0), Error, "T_max must be positive");
  auto s = std::make_shared<StepLR>(opt, 1);
  EXPECT_THROW_MSG(SequentialLR(opt, {s, s}, {}), Error,
                   "expects number of schedulers provided to be one more than the number of milestone points, but "
                   "got number of schedulers 2 and the number of milestones to be equal to 0");
  Tensor b = make_param();
  SGD other({b});
  auto foreign = std::make_shared<StepLR>(other, 1);
  EXPECT_THROW_MSG(SequentialLR(opt, {s, foreign}, {2}), Error,
                   "expects all schedulers to belong to the same optimizer, but got schedulers at index 1");
}

}  // namespace
