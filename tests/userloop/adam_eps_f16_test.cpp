// Adam's eps in pure f16 (docs/report-format.md, optimizer_eps_underflow): a user trains a model stored in f16
// (model.to(f16), Adam on those parameters, no f32 master weights) with PyTorch's default eps = 1e-8. The loop
// below is written as a user writes one from docs/api.md: a small regressor on tabular data whose last two
// features are missing in every row and filled with 0 (so fc1's weights for them get a gradient of exactly 0).
// eps = 1e-8 is below 2^-25, so it rounds to 0 in f16; where the second moment v is 0 the denominator
// sqrt(v) + eps is 0 and Adam writes m / 0 into the weights: NaN where m is 0, inf where the gradient was
// non-zero but its square underflowed f16.
//
// What is expected comes from an independent computation in this test: the first Adam step worked from the
// gradient the loop sees, with f16 rounding done here in double (m = 0.1 g and v = 0.001 g^2 rounded to f16,
// zero at or below 2^-25), which predicts the elements that turn NaN, +inf and -inf; the run's parameter after
// the step must hold exactly those, and the report must cite exactly those counts. Then both remedies the report
// proposes are applied as their fields say and the loop re-run: the anomaly must be gone.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>

#include "core/autocast.h"
#include "core/float16.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/optimizer.h"
#include "probes/probe.h"
#include "tests/analysis/recorded_run.h"
#include "tests/test_support.h"

namespace ampscope::testing {
namespace {

struct Regressor : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Regressor(Generator& gen) : Module("Regressor") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 1, gen));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
};

// How the loop is run: the user's (pure f16, default eps), or with one of the remedies applied.
struct Setup {
  double eps = 1e-8;             // Adam's default
  bool master_weights = false;   // f32 parameters and state, f16 autocast around the forward pass, GradScaler
  double sgd_lr = 0;             // > 0: SGD at this learning rate instead of Adam
};

constexpr double kLr = 1e-3;

// What the first Adam step does to fc1.weight, worked here from its gradient g (f16 values): m = lerp(0, g,
// 0.1) and v = 0 * 0.999 + 0.001 * g * g, each computed in float and rounded once to f16, where a value at or
// below 2^-25 (half the smallest subnormal) rounds to 0. With eps rounding to 0, the denominator is 0 exactly
// where v is 0, and u = -(lr / 0.1) * m / 0 is NaN where m is 0, -inf where m > 0, +inf where m < 0.
struct Predicted {
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, v_zero = 0;
  std::vector<int> kind;  // per element: 0 finite, 1 NaN, 2 +inf, 3 -inf
};

Predicted predict(const std::vector<double>& g) {
  const double half_tiny = std::ldexp(1.0, -25);
  const auto f16_zero = [&](float x) { return std::fabs(static_cast<double>(x)) <= half_tiny; };
  Predicted p;
  for (double gd : g) {
    const float gf = static_cast<float>(gd);
    const bool m_zero = f16_zero(static_cast<float>(1.0 - 0.9) * gf);
    const bool v_zero = f16_zero(static_cast<float>(1.0 - 0.999) * (gf * gf));
    int kind = 0;
    if (v_zero) {
      ++p.v_zero;
      if (m_zero) kind = 1, ++p.nan;
      else if (gf > 0) kind = 3, ++p.neg_inf;
      else kind = 2, ++p.pos_inf;
    }
    p.kind.push_back(kind);
  }
  return p;
}

struct LoopRun {
  analysis::Report report;
  std::vector<double> fc1_grad0, fc1_after0;  // fc1.weight's gradient and value at step 0
};

LoopRun run(const Setup& s, const std::string& name, std::int64_t steps = 6) {
  LoopRun out;
  out.report = record_and_analyse(
      name, {.precision = "fp16", .device = "cpu", .model = "user regressor", .seed = 3, .config = "{}"},
      {.level = probe::Level::health}, [&] {
        Generator gen(3);
        Regressor model(gen);
        const DType storage = s.master_weights ? DType::f32 : DType::f16;
        model.to(storage);
        std::unique_ptr<optim::Optimizer> optimizer;
        if (s.sgd_lr > 0) {
          optimizer = std::make_unique<optim::SGD>(model.parameters(), optim::OptimizerOptions{.lr = s.sgd_lr});
        } else {
          optimizer = std::make_unique<optim::Adam>(model.parameters(), optim::OptimizerOptions{.lr = kLr, .eps = s.eps});
        }
        optim::Optimizer& opt = *optimizer;
        GradScaler scaler({.device = "cpu", .enabled = s.master_weights});
        std::vector<double> xv = randn({64, 8}, gen).values();
        for (std::size_t i = 0; i < xv.size(); i += 8) xv[i + 6] = xv[i + 7] = 0;  // two features never present
        const Tensor x = from_values(xv, {64, 8}, {storage});
        const Tensor y = randn({64, 1}, gen).to(storage);
        for (std::int64_t n = 0; n < steps; ++n) {
          probe::Step step(n);
          opt.zero_grad();
          Tensor loss;
          {
            std::optional<AutocastGuard> autocast;
            if (s.master_weights) autocast.emplace(DType::f16);
            loss = mse_loss(model(x), y);
          }
          if (s.master_weights) {
            scaler.scale(loss).backward();
          } else {
            loss.backward();
          }
          if (n == 0) out.fc1_grad0 = model.fc1->parameter("weight").grad().values();
          if (s.master_weights) {
            step.finish(loss, opt, scaler);
          } else {
            step.finish(loss, opt);
          }
          if (n == 0) out.fc1_after0 = model.fc1->parameter("weight").values();
        }
      });
  return out;
}

bool contains(const std::vector<std::string>& texts, const std::string& piece) {
  for (const std::string& t : texts)
    if (t.find(piece) != std::string::npos) return true;
  return false;
}

TEST(adam_eps_f16_test, eps_rounds_to_zero_in_f16_exactly_where_f16_conversion_says_so) {
  // Against core's f16 conversion (itself checked exhaustively against the CPU's F16C): the threshold 2^-25.
  for (double x : {1e-8, 2e-8, std::ldexp(1.0, -25), std::nextafter(std::ldexp(1.0, -25), 1.0), 3e-8, 5.96e-8, 6e-8,
                   1e-7, 1e-4}) {
    const bool zero = f16(static_cast<float>(x)).bits == 0;
    EXPECT_EQ(analysis::rounds_to_zero_in(x, "f16"), zero) << x;
  }
  EXPECT_TRUE(analysis::rounds_to_zero_in(1e-8, "f16"));
  EXPECT_FALSE(analysis::rounds_to_zero_in(6e-8, "f16"));  // rounds to 2^-24, the smallest subnormal
  EXPECT_FALSE(analysis::rounds_to_zero_in(1e-8, "bf16"));  // bf16 has f32's exponent range
  EXPECT_EQ(analysis::rounds_to_zero_in(1e-45, "bf16"), bf16(1e-45f).bits == 0);
}

TEST(adam_eps_f16_test, pure_f16_adam_with_default_eps_is_diagnosed_with_the_counts_the_step_predicts) {
  const LoopRun r = run({}, "eps_1e-8");
  const Predicted p = predict(r.fc1_grad0);
  ASSERT_GT(p.nan, 0) << "the missing features give gradients of exactly 0";
  ASSERT_GT(p.pos_inf + p.neg_inf, 0) << "some gradients are non-zero but their squares underflow f16";
  // The run's parameter after step 0 holds exactly the predicted non-finite elements.
  ASSERT_EQ(r.fc1_after0.size(), p.kind.size());
  for (std::size_t i = 0; i < p.kind.size(); ++i) {
    const double a = r.fc1_after0[i];
    const int kind = std::isnan(a) ? 1 : a == INFINITY ? 2 : a == -INFINITY ? 3 : 0;
    EXPECT_EQ(kind, p.kind[i]) << "fc1.weight[" << i << "] after step 0: " << a << ", gradient " << r.fc1_grad0[i];
  }

  const analysis::Report& rep = r.report;
  ASSERT_EQ(rep.anomalies.size(), 1u) << "one diagnosis, no nonfinite_input for the steps after it";
  const analysis::Diagnosis& d = rep.anomalies[0];
  EXPECT_EQ(d.cause, "optimizer_eps_underflow");
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.phase, trace::Phase::optimizer);
  EXPECT_EQ(d.op, "Adam");
  EXPECT_EQ(d.module, "fc1.weight");
  const std::int64_t bad = p.nan + p.pos_inf + p.neg_inf;
  EXPECT_TRUE(contains(d.evidence, "turned " + std::to_string(bad) + " of the 128 elements of fc1.weight (f16)"));
  std::string counts = std::to_string(p.nan) + " NaN";
  if (p.pos_inf > 0) counts += ", " + std::to_string(p.pos_inf) + " +inf";
  if (p.neg_inf > 0) counts += ", " + std::to_string(p.neg_inf) + " -inf";
  EXPECT_TRUE(contains(d.evidence, "(" + counts + ")")) << counts;
  EXPECT_TRUE(contains(d.evidence, "eps = 1e-08 rounds to 0 in f16"));
  EXPECT_TRUE(contains(d.evidence, "v was exactly 0 at " + std::to_string(p.v_zero) + " of those " +
                                       std::to_string(bad) + " elements"));
  EXPECT_TRUE(contains(d.evidence, "5 later steps (1 to 5) turned non-finite from their first op (linear in fc1)"));
  ASSERT_EQ(d.remedies.size(), 2u);
  EXPECT_EQ(d.remedies[0].kind, "master_weights_f32");
  EXPECT_EQ(d.remedies[1].kind, "epsilon");
  EXPECT_EQ(d.remedies[1].value, 6e-8);
  EXPECT_FALSE(analysis::rounds_to_zero_in(d.remedies[1].value, "f16"));
  EXPECT_TRUE(d.remedies[0].flag.empty() && d.remedies[1].flag.empty()) << "no ampscope train option applies them";
}

TEST(adam_eps_f16_test, the_epsilon_remedy_applied_as_its_value_says_removes_the_anomaly) {
  const LoopRun bad = run({}, "eps_before");
  ASSERT_FALSE(bad.report.anomalies.empty());
  const analysis::Remedy& eps = bad.report.anomalies[0].remedies.at(1);
  ASSERT_EQ(eps.kind, "epsilon");
  const LoopRun fixed = run({.eps = eps.value}, "eps_after");
  EXPECT_TRUE(fixed.report.anomalies.empty()) << fixed.report.anomalies.front().cause << " at step "
                                              << fixed.report.anomalies.front().step;
  for (double v : fixed.fc1_after0) EXPECT_TRUE(std::isfinite(v));
}

TEST(adam_eps_f16_test, the_master_weights_remedy_applied_removes_the_anomaly) {
  const LoopRun bad = run({}, "master_before");
  ASSERT_FALSE(bad.report.anomalies.empty());
  ASSERT_EQ(bad.report.anomalies[0].remedies.at(0).kind, "master_weights_f32");
  const LoopRun fixed = run({.master_weights = true}, "master_after");  // eps stays 1e-8: it survives in f32
  EXPECT_TRUE(fixed.report.anomalies.empty()) << fixed.report.anomalies.front().cause << " at step "
                                              << fixed.report.anomalies.front().step;
  for (double v : fixed.fc1_after0) EXPECT_TRUE(std::isfinite(v));
}

TEST(adam_eps_f16_test, an_update_that_overflows_f16_is_the_optimizers_doing_not_the_datas) {
  // SGD at an absurd learning rate: u = -lr * g is finite in f32, p + u is beyond 65504 and rounds to inf in
  // f16. Not Adam's eps: the cause is "unknown", still in the optimizer, never nonfinite_input.
  const LoopRun r = run({.sgd_lr = 1e7}, "sgd_overflow", 3);
  std::int64_t inf = 0;
  for (std::size_t i = 0; i < r.fc1_after0.size(); ++i) {
    const double u = static_cast<double>(static_cast<float>(r.fc1_grad0[i]) * -1e7f);
    if (std::fabs(u) >= 65520) ++inf;  // p + u rounds to inf in f16 (|p| < 1): at or beyond 65504 + half an ulp
    EXPECT_EQ(std::isinf(r.fc1_after0[i]), std::fabs(u) >= 65520) << i << ": u " << u;
  }
  ASSERT_GT(inf, 0);
  ASSERT_FALSE(r.report.anomalies.empty());
  const analysis::Diagnosis& d = r.report.anomalies[0];
  EXPECT_EQ(d.cause, "unknown");
  EXPECT_EQ(d.phase, trace::Phase::optimizer);
  EXPECT_EQ(d.op, "SGD");
  for (const analysis::Diagnosis& a : r.report.anomalies) EXPECT_NE(a.cause, "nonfinite_input") << a.module;
}

}  // namespace
}  // namespace ampscope::testing
