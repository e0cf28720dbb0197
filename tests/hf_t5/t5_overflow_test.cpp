// T5's classic fp16 failure on a tiny model: encoder block 1's feed-forward output layer (wo) scaled, as the
// scenarios scale weights, so that its output passes 65504 (f16's largest finite value) while its weights and
// inputs stay finite in f16. Under f16 autocast the wo product overflows to inf there (the first non-finite
// op of the forward pass), and the logits end NaN; keeping '*.DenseReluDense.wo' in f32 (what
// --autocast-fp32 does, and HF's _keep_in_fp32_modules = ["wo"]) removes every inf; HF's clamp, when turned on,
// keeps the run finite and records where it fired.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "models/hf_t5.h"
#include "models/token_data.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace hf = samples::hf;

constexpr const char* kWo = "encoder.block.1.layer.1.DenseReluDense.wo.weight";
constexpr double kScale = 40000.0;  // wo's weights stay below 65504 (checked below): finite in f16

Tensor param(hf::Seq2SeqLM& model, const std::string& name) {
  for (const auto& [n, p] : model.named_parameters()) {
    if (n == name) return p;
  }
  throw Error("no parameter " + name);
}

struct Fixture {
  std::shared_ptr<hf::Seq2SeqLM> model;
  samples::Seq2SeqBatch batch;
};

Fixture make() {
  Generator gen(3);
  Fixture f;
  f.model = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  Tensor wo = param(*f.model, kWo);
  {
    NoGradGuard no_grad;
    std::vector<double> v = wo.values();
    for (double& x : v) x *= kScale;
    wo.copy_(from_values(v, wo.shape()));
  }
  std::vector<std::int32_t> ids(32);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7 + 3) % 48);
  f.batch = samples::seq2seq_batch(ids, 16, 2, 0, f.model->decoder_start_token_id());
  return f;
}

bool all_finite(const Tensor& t) {
  const auto v = t.values();
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

TEST(t5_overflow_test, the_scaled_wo_weights_fit_f16_and_the_f32_forward_stays_finite) {
  Fixture f = make();
  // The weights stay finite in f16 (the cast autocast inserts must not be what overflows).
  const auto w = param(*f.model, kWo).values();
  double wmax = 0;
  for (double x : w) wmax = std::max(wmax, std::fabs(x));
  EXPECT_LT(wmax, 65504.0);
  EXPECT_GT(wmax, 1000.0) << "the scaled weights are large, as a trained T5's wo grew";
  // In f32 the same wo output passes 65504 somewhere and stays finite.
  t5_test::Recorder rec;
  {
    auto hook = std::make_shared<t5_test::Recorder>();
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    EXPECT_TRUE(all_finite(f.model->forward2(f.batch.encoder_input, f.batch.decoder_input)));
    rec = *hook;
  }
  EXPECT_EQ(rec.first_nonfinite(), nullptr);
}

TEST(t5_overflow_test, f32_wo_output_passes_65504) {
  Fixture f = make();
  // Capture wo's output in f32 with a hook on its linear.
  struct WoOutput : probe::Hook {
    double max_abs = 0;
    void on_op(const probe::OpEvent& e) override {
      if (e.op == "linear" && e.scope == "encoder.block.1.layer.1.DenseReluDense.wo") {
        for (double v : e.output.values()) max_abs = std::max(max_abs, std::fabs(v));
      }
    }
  };
  auto hook = std::make_shared<WoOutput>();
  {
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_GT(hook->max_abs, 65504.0);
  std::printf("wo output max abs in f32: %g\n", hook->max_abs);
  EXPECT_TRUE(std::isfinite(hook->max_abs));
}

TEST(t5_overflow_test, under_f16_autocast_the_first_inf_is_the_scaled_wo_and_the_logits_end_nan) {
  Fixture f = make();
  auto hook = std::make_shared<t5_test::Recorder>();
  Tensor logits;
  {
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::f16);
    logits = f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  const t5_test::Seen* first = hook->first_nonfinite();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->op, "linear");
  EXPECT_EQ(first->scope, "encoder.block.1.layer.1.DenseReluDense.wo");
  EXPECT_GT(first->infs, 0);
  EXPECT_EQ(first->nans, 0);
  EXPECT_FALSE(all_finite(logits));
  EXPECT_TRUE(f.model->clamp_events().empty());  // the clamp is off by default
}

TEST(t5_overflow_test, keeping_wo_in_f32_under_autocast_removes_every_inf) {
  Fixture f = make();
  auto hook = std::make_shared<t5_test::Recorder>();
  Tensor logits;
  {
    AutocastOverrideGuard keep({.module = "*.DenseReluDense.wo", .precision = Precision::f32});
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::f16);
    logits = f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_EQ(hook->first_nonfinite(), nullptr)
      << hook->first_nonfinite()->op << " in " << hook->first_nonfinite()->scope;
  EXPECT_TRUE(all_finite(logits));
  // The override reached the wo products only: those ran in f32, the other linears in f16.
  EXPECT_EQ(logits.dtype(), DType::f16);
}

TEST(t5_overflow_test, the_clamp_option_keeps_the_autocast_run_finite_and_records_where_it_fired) {
  Fixture f = make();
  f.model->set_clamp_inf(true);
  auto hook = std::make_shared<t5_test::Recorder>();
  Tensor logits;
  {
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::f16);
    logits = f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_TRUE(all_finite(logits));
  ASSERT_EQ(f.model->clamp_events().size(), 1u);
  const hf::ClampEvent& e = f.model->clamp_events()[0];
  EXPECT_EQ(e.block, "encoder.block.1");
  EXPECT_EQ(e.after, "layer.1.DenseReluDense");
  EXPECT_GT(e.inf_count, 0);
  EXPECT_EQ(f.model->clamp_count(), 1);
  // The trace sees the clamp op in the block's scope, right after the residual add that held the infs, and
  // its output is finite.
  std::size_t i = 0;
  for (; i < hook->ops.size(); ++i) {
    if (hook->ops[i].op == "clamp") break;
  }
  ASSERT_LT(i, hook->ops.size());
  EXPECT_EQ(hook->ops[i].scope, "encoder.block.1");
  EXPECT_EQ(hook->ops[i].infs, 0);
  ASSERT_GT(i, 0u);
  EXPECT_EQ(hook->ops[i - 1].op, "add");
  EXPECT_EQ(hook->ops[i - 1].infs, e.inf_count);
  // A second forward pass starts a new record; the count goes on.
  {
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::f16);
    f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_EQ(f.model->clamp_events().size(), 1u);
  EXPECT_EQ(f.model->clamp_count(), 2);
}

TEST(t5_overflow_test, the_clamp_fires_on_f16_hidden_states_as_in_hf_half_models) {
  // HF's own condition: a model stored in f16 (model.half()), no autocast.
  Fixture f = make();
  f.model->to(DType::f16);
  f.model->set_clamp_inf(true);
  Tensor logits;
  {
    NoGradGuard no_grad;
    logits = f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_TRUE(all_finite(logits));
  ASSERT_FALSE(f.model->clamp_events().empty());
  EXPECT_EQ(f.model->clamp_events()[0].block, "encoder.block.1");
  EXPECT_EQ(f.model->clamp_events()[0].after, "layer.1.DenseReluDense");
}

TEST(t5_overflow_test, the_clamp_does_nothing_in_f32_or_without_inf) {
  Fixture f = make();
  f.model->set_clamp_inf(true);
  {
    NoGradGuard no_grad;
    f.model->forward2(f.batch.encoder_input, f.batch.decoder_input);  // f32: values past 65504 are not inf
  }
  EXPECT_TRUE(f.model->clamp_events().empty());
  Generator gen(3);
  auto plain = hf::make_seq2seq(t5_test::v1_0_config(), gen);  // unscaled: no overflow in f16
  plain->set_clamp_inf(true);
  {
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::f16);
    plain->forward2(f.batch.encoder_input, f.batch.decoder_input);
  }
  EXPECT_TRUE(plain->clamp_events().empty());
  EXPECT_EQ(plain->clamp_count(), 0);
}


TEST(t5_overflow_test, a_healthy_t5_runs_forward_and_backward_under_f16_autocast_without_a_nonfinite_value) {
  // The unscaled model: no op may write inf or NaN, the decoder's causal mask included (it is masked with f16's
  // finite minimum, not HF's finfo(f32).min that becomes -inf in f16 scores).
  Generator gen(3);
  auto model = hf::make_seq2seq(t5_test::v1_1_config(), gen);
  std::vector<std::int32_t> ids(32);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 5 + 1) % 48);
  const auto batch = samples::seq2seq_batch(ids, 16, 2, 0, model->decoder_start_token_id());
  std::vector<double> f32;
  {
    NoGradGuard no_grad;
    f32 = model->forward2(batch.encoder_input, batch.decoder_input).values();
  }
  auto hook = std::make_shared<t5_test::Recorder>();
  Tensor loss;
  std::vector<double> f16;
  {
    probe::HookGuard guard(hook);
    AutocastGuard autocast(DType::f16);
    const Tensor logits = model->forward2(batch.encoder_input, batch.decoder_input);
    EXPECT_EQ(logits.dtype(), DType::f16);
    f16 = logits.to(DType::f32).values();
    loss = hf::seq2seq_loss(logits, batch.labels);
  }
  EXPECT_EQ(hook->first_nonfinite(), nullptr)
      << hook->first_nonfinite()->op << " in " << hook->first_nonfinite()->scope;
  EXPECT_EQ(loss.dtype(), DType::f32);  // log_softmax and nll_loss run in f32 under autocast
  loss.backward();
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(all_finite(p.grad())) << name;
  }
  // A sanity bound, not a reference comparison: f16 keeps 11 significant bits (2^-11 = 4.9e-4 relative per
  // rounding); a few dozen roundings on the way through two blocks per stack stay well inside 2e-2 of the
  // logits' scale, while a wrong op (a lost scale, a wrong mask) moves them by their whole size.
  double sq = 0;
  for (double v : f32) sq += v * v;
  const double rms = std::sqrt(sq / static_cast<double>(f32.size()));
  for (std::size_t i = 0; i < f32.size(); ++i) {
    EXPECT_LE(std::fabs(f16[i] - f32[i]), 2e-2 * std::max(std::fabs(f32[i]), rms)) << "logit " << i;
  }
}

}  // namespace
}  // namespace ampscope
