// Every remedy kind, applied and re-run (the kinds that change a model's own code are applied on the user
// models, tests/analysis/user_models_report_test.cpp): the training-loop kinds here, on a small loop
// written as a user writes it (an MLP, AdamW, autocast f16, optionally a GradScaler) and on the
// lr-explosion scenario. Each test takes the remedy from the report, applies what its fields say (the
// value, the kind), re-runs the same loop, and requires the anomaly to be gone.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>

#include "core/autocast.h"
#include "core/nn.h"
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

std::filesystem::path temp_trace(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("ampscope_remedy_" + std::to_string(::getpid()) + "_" + name + ".h5");
}

// A user's loop: mlp 16 -> 32 -> 4 on fixed Gaussian data, AdamW, autocast f16 around forward and loss.
struct Loop {
  std::int64_t steps = 12;
  bool scaler = true;
  double init_scale = 65536;
  std::int64_t growth_interval = 2000;
  bool zero_grad = true;
  double loss_weight = 1.0;  // a tiny weight (an auxiliary loss averaged over many elements) underflows f16
  double lr = 1e-3;
  double feature_scale = 1.0;  // feature 0 in raw units (1e5: a price, a count) overflows f16's cast
  bool nan_in_data = false;    // one NaN in the batch, from step 1 on
};

Report run_and_report(const Loop& l, const std::string& name) {
  return testing::record_and_analyse(name, {.precision = "fp16", .device = "cpu", .model = "user mlp", .seed = 5,
                                            .config = "{}"},
                                     {}, [&] {
    Generator gen(5);
    auto model = samples::make_mlp({.in_features = 16, .hidden = 32, .classes = 4}, gen);
    optim::AdamW opt(model->parameters(), {.lr = l.lr});
    GradScaler scaler({.device = "cpu", .init_scale = l.init_scale, .growth_interval = l.growth_interval,
                       .enabled = l.scaler});
    std::vector<double> xv = randn({32, 16}, gen).values();
    for (std::size_t i = 0; i < xv.size(); i += 16) xv[i] *= l.feature_scale;
    const Tensor clean_x = from_values(xv, {32, 16});
    xv[5] = std::nan("");
    const Tensor dirty_x = from_values(xv, {32, 16});
    std::vector<double> labels(32);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(i % 4);
    const Tensor y = from_values(labels, {32}, {.dtype = DType::i64});
    for (std::int64_t step = 0; step < l.steps; ++step) {
      probe::StepScope scope(step);
      if (l.zero_grad) opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DType::f16);
        const Tensor& x = l.nan_in_data && step >= 1 ? dirty_x : clean_x;
        loss = mul(cross_entropy((*model)(x), y), l.loss_weight);
      }
      const double scale = scaler.is_enabled() ? scaler.get_scale() : 1.0;
      scaler.scale(loss).backward();
      if (!l.scaler) probe::report_grads(model->parameters(), /*unscaled=*/true);
      const StepResult stepped = scaler.step(opt, return_found_inf);
      scaler.update();
      scope.end({.step = step,
                 .loss = loss.item(),
                 .scale = scale,
                 .scale_after = scaler.is_enabled() ? scaler.get_scale() : 1.0,
                 .found_inf = stepped.found_inf,
                 .skipped = !stepped.stepped,
                 .lr = l.lr});
    }
  });
}

const Remedy* find_kind(const Diagnosis& d, std::string_view kind) {
  for (const Remedy& m : d.remedies)
    if (m.kind == kind) return &m;
  return nullptr;
}

TEST(remedy_kinds_test, enable_scaler_cures_gradients_that_underflow_f16) {
  // Cross-entropy times 2^-20: each logit's gradient is at most 2^-26, below half of f16's smallest
  // subnormal, so every f16 gradient is 0 without a scaler.
  Loop l{.scaler = false, .loss_weight = std::ldexp(1.0, -20)};
  const Report before = run_and_report(l, "underflow");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.cause, "gradient_underflow");
  const Remedy* m = find_kind(d, "enable_scaler");
  ASSERT_NE(m, nullptr) << d.remedy;
  l.scaler = true;
  l.init_scale = m->value;
  const Report after = run_and_report(l, "underflow-fixed");
  EXPECT_TRUE(after.healthy()) << after.anomalies.front().cause;
}

TEST(remedy_kinds_test, init_scale_cures_an_initial_scale_no_backoff_reached_in_time) {
  // 2^40 is so far above what the gradients allow that 4 steps of halving do not reach a clean step:
  // not calibration (no later clean step), an anomaly whose first remedy is the initial scale.
  Loop l{.steps = 4, .init_scale = std::ldexp(1.0, 40)};
  const Report before = run_and_report(l, "init-scale");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.cause, "gradient_overflow");
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "init_scale");
  l.init_scale = d.remedies.front().value;
  const Report after = run_and_report(l, "init-scale-fixed");
  EXPECT_TRUE(after.healthy()) << after.anomalies.front().cause;
  EXPECT_EQ(after.scaler.skipped, 0);
}

TEST(remedy_kinds_test, zero_grad_cures_gradients_that_accumulate) {
  // The scale doubles every step (growth interval 1) until the scaled gradients overflow; without
  // zero_grad the inf stays in .grad and every later step skips.
  Loop l{.steps = 20, .init_scale = 1024, .growth_interval = 1, .zero_grad = false};
  const Report before = run_and_report(l, "accumulate");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.cause, "accumulating_gradients");
  ASSERT_NE(find_kind(d, "zero_grad"), nullptr) << d.remedy;
  l.zero_grad = true;
  const Report after = run_and_report(l, "accumulate-fixed");
  // With gradients cleared, the overflow a doubled scale meets is cured by the next back-off: calibration.
  EXPECT_TRUE(after.healthy()) << after.anomalies.front().cause;
  EXPECT_GT(after.scaler.calibration_skips, 0);
}

TEST(remedy_kinds_test, rescale_input_cures_a_raw_feature_that_overflows_the_cast) {
  Loop l{.steps = 4, .feature_scale = 1e5};  // fc1's f16 cast of feature 0 (~1e5) overflows every step
  const Report before = run_and_report(l, "raw");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.cause, "f16_overflow");
  EXPECT_EQ(d.module, "fc1");
  const Remedy* m = find_kind(d, "rescale_input");
  ASSERT_NE(m, nullptr) << d.remedy;
  l.feature_scale = 1.0;  // standardised: the remedy applied
  EXPECT_TRUE(run_and_report(l, "raw-fixed").healthy());
  // Its f32 remedy works too: fc1 in f32 takes the raw feature (1e5 * weights ~ 1e4, within f16 after it).
  Loop f = {.steps = 4, .feature_scale = 1e5};
  const Remedy* f32 = find_kind(d, "autocast_fp32");
  ASSERT_NE(f32, nullptr);
  AutocastOverrideGuard keep({.op = f32->pattern_is_op ? f32->pattern : "", .module = f32->pattern_is_op ? "" : f32->pattern,
                              .precision = Precision::f32});
  const Report after = run_and_report(f, "raw-f32");
  for (const Diagnosis& a : after.anomalies) EXPECT_FALSE(a.module == "fc1" && a.cause == "f16_overflow");
}

TEST(remedy_kinds_test, clean_data_is_proposed_for_nan_in_the_batch_and_cleaning_cures_it) {
  Loop l{.steps = 3, .nan_in_data = true};
  const Report before = run_and_report(l, "nan-data");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.cause, "nonfinite_input");
  EXPECT_EQ(d.step, 1);
  ASSERT_NE(find_kind(d, "clean_data"), nullptr) << d.remedy;
  l.nan_in_data = false;
  EXPECT_TRUE(run_and_report(l, "nan-data-fixed").healthy());
}

// Attention written by hand with a padding mask that covers a whole row (an empty sequence in the batch):
// softmax of a row of -inf is 0 / 0 = NaN, in f16, bf16 and f32 alike. The fix is the mask's value.
Report masked_attention(double fill, const std::string& name) {
  return testing::record_and_analyse(name, {.precision = "fp16", .device = "cpu", .model = "user attention", .seed = 6,
                                            .config = "{}"},
                                     {}, [&] {
    Generator gen(6);
    nn::Linear proj(8, 8, gen);
    const Tensor x = randn({4, 8}, gen);
    std::vector<double> mask(16, 0.0);
    for (int j = 0; j < 4; ++j) mask[static_cast<std::size_t>(3 * 4 + j)] = 1.0;  // row 3: every key masked
    const Tensor m = from_values(mask, {4, 4}, {.dtype = DType::boolean});
    probe::StepScope scope(0);
    Tensor loss;
    {
      AutocastGuard autocast(DType::f16);
      Tensor h = proj(x);
      Tensor scores = matmul(h, h.transpose(0, 1));
      Tensor p = softmax(masked_fill(scores, m, fill), -1);
      loss = mean(matmul(p, h));
    }
    scope.end({.step = 0, .loss = loss.item()});
  });
}

TEST(remedy_kinds_test, finite_mask_cures_a_fully_masked_row) {
  const Report before = masked_attention(-std::numeric_limits<double>::infinity(), "mask");
  ASSERT_FALSE(before.anomalies.empty());
  const Diagnosis& d = before.anomalies.front();
  EXPECT_EQ(d.op, "softmax");
  EXPECT_EQ(d.cause, "invalid_operation");  // not nonfinite_input: the data are fine, the mask made the NaN
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "finite_mask");
  for (const Remedy& m : d.remedies) EXPECT_NE(m.kind, "bf16") << "0 / 0 is NaN in bf16 too";
  EXPECT_TRUE(masked_attention(-1e4, "mask-fixed").healthy());
}

// The lr-explosion scenario (lr 1.5): the report's learning-rate remedy, applied as often as the report
// keeps proposing it, makes the run healthy; each application divides the rate by 10.
TEST(remedy_kinds_test, learning_rate_applied_as_the_report_proposes_cures_lr_explosion) {
  samples::TrainConfig c;
  c.scenario = "lr-explosion";
  c.precision = samples::Precision::fp16;
  c.device = "cpu";
  const auto path = temp_trace("lr");
  c.out = path.string();
  std::vector<double> tried;
  for (int round = 0; round < 3; ++round) {
    samples::train(c);
    Report rep;
    {
      trace::TraceReader reader(path);
      rep = analyse(reader);
    }
    std::filesystem::remove(path);
    if (rep.healthy()) break;
    const Remedy* m = find_kind(rep.anomalies.front(), "learning_rate");
    ASSERT_NE(m, nullptr) << rep.anomalies.front().remedy;
    const double lr = c.lr > 0 ? c.lr : 1.5;
    EXPECT_DOUBLE_EQ(m->value, lr / 10);
    c.lr = m->value;
    tried.push_back(m->value);
  }
  ASSERT_FALSE(tried.empty());
  samples::train(c);
  trace::TraceReader reader(path);
  const Report last = analyse(reader);
  std::filesystem::remove(path);
  EXPECT_TRUE(last.healthy()) << "after lr " << tried.back();
  EXPECT_LE(tried.size(), 2u);
}

}  // namespace
}  // namespace ampscope::analysis
