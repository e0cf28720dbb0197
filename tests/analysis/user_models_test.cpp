// Models the analysis rules were not written against (tests/analysis/user_models.h), trained in f16 the
// way a user trains them: the failure each one is built to show happens, where and when the rounding of
// the run's own tensors says it must; fp32 is clean; and every remedy, applied to the same config and
// re-run, leaves no NaN/inf origin (or, for the remedies that cannot work, does not). The expected step,
// op and counts are derived from the run's recorded tensors (RunResult) and the f16/bf16 rounding of
// tests/test_support.h, never from the trace itself; the trace is then checked against them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "probes/trace/reader.h"
#include "tests/analysis/user_models.h"
#include "tests/test_support.h"

namespace ampscope::user_models {
namespace {

using ampscope::testing::reference_bf16;
using ampscope::testing::reference_f16;

// Runs `c` into a fresh temporary trace, removed when the test ends.
class user_models_test : public ::testing::Test {
 protected:
  RunResult train(RunConfig c) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("ampscope_user_model_" + std::to_string(::getpid()) + "_" + std::to_string(paths_.size()) + ".h5");
    paths_.push_back(path);
    c.trace_path = path.string();
    return run(c);
  }
  void TearDown() override {
    for (const auto& p : paths_) std::filesystem::remove(p);
  }

 private:
  std::vector<std::filesystem::path> paths_;
};

// A clean run: no origin in the trace, no NaN/inf anywhere in it, every loss finite, no step skipped.
void expect_clean(const RunResult& r, const std::string& what) {
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  EXPECT_FALSE(o.has_value()) << what << ": origin at step " << o->step << ", " << o->op << " in '" << o->module << "'";
  EXPECT_EQ(r.origins, 0) << what;
  EXPECT_EQ(nonfinite_op_rows(r.trace_path), 0) << what;
  EXPECT_EQ(r.first_nonfinite_loss, -1) << what;
  EXPECT_EQ(r.skipped_steps(), 0) << what;
}

// ---- 1. tagger: hand-written BCE on sigmoid probabilities ----

// Elements of a step's logits whose sigmoid, computed in float and rounded once to the dtype (what the
// kernels do), is exactly 1.0: there 1 - s cancels to 0 and log(1 - s) = -inf.
std::int64_t saturated(const std::vector<double>& logits, bool bf16) {
  std::int64_t n = 0;
  for (double z : logits) {
    const float s = 1.0f / (1.0f + std::exp(-static_cast<float>(z)));
    n += (bf16 ? reference_bf16(s) : reference_f16(s)) == 1.0 ? 1 : 0;
  }
  return n;
}

std::int64_t first_step_with(const std::vector<std::int64_t>& per_step) {
  for (std::size_t i = 0; i < per_step.size(); ++i) {
    if (per_step[i] > 0) return static_cast<std::int64_t>(i);
  }
  return -1;
}

void expect_tagger_log_origin(const RunResult& r, bool bf16) {
  std::vector<std::int64_t> sat;
  for (const auto& out : r.outputs) sat.push_back(saturated(out, bf16));
  const std::int64_t step = first_step_with(sat);
  ASSERT_GE(step, 1) << "the logits saturate sigmoid from the start: the run shows nothing";
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, step);
  EXPECT_EQ(o->phase, trace::Phase::forward);
  EXPECT_EQ(o->op, "log");
  EXPECT_EQ(o->module, "loss");
  EXPECT_EQ(o->out_dtype, "f32");  // autocast runs log in f32: the zero it takes came from f16's 1 - s
  EXPECT_EQ(o->health.neg_inf, sat[static_cast<std::size_t>(step)]);  // one -inf per saturated sigmoid
  EXPECT_EQ(r.first_nonfinite_loss, step);
}

TEST_F(user_models_test, tagger_fp16_hand_written_bce_turns_saturated_sigmoid_into_log_of_zero) {
  const RunResult r = train(default_config(Model::tagger));
  expect_tagger_log_origin(r, false);
  EXPECT_GT(r.skipped_steps(), 0);  // the NaN loss gives NaN gradients: the scaler skips
}

TEST_F(user_models_test, tagger_fp32_is_clean_and_never_saturates) {
  RunConfig c = default_config(Model::tagger);
  set_precision(c, Precision::fp32);
  const RunResult r = train(c);
  expect_clean(r, "tagger fp32");
  // The same model reaches the logits that saturate f16 (f32's sigmoid only rounds to 1 past 16.6).
  double max_logit = 0;
  for (const auto& out : r.outputs) max_logit = std::max(max_logit, *std::max_element(out.begin(), out.end()));
  EXPECT_GT(max_logit, 8.4);
  EXPECT_LT(max_logit, 16.0);
}

TEST_F(user_models_test, tagger_bf16_fails_too_and_earlier_precision_not_range) {
  RunConfig c = default_config(Model::tagger);
  set_precision(c, Precision::bf16);
  const RunResult r = train(c);
  expect_tagger_log_origin(r, true);
  const RunResult f16 = train(default_config(Model::tagger));
  EXPECT_LT(first_origin(r.trace_path)->step, first_origin(f16.trace_path)->step);
}

TEST_F(user_models_test, tagger_remedy_logits_loss_is_clean_in_fp16) {
  RunConfig c = default_config(Model::tagger);
  c.use_logits_loss = true;
  expect_clean(train(c), "binary_cross_entropy_with_logits");
}

TEST_F(user_models_test, tagger_remedy_clamp_1e_4_is_clean_in_fp16) {
  RunConfig c = default_config(Model::tagger);
  c.clamp_eps = 1e-4;  // above f16's smallest normal, 6.1e-5
  expect_clean(train(c), "clamp 1e-4");
}

TEST_F(user_models_test, tagger_clamp_1e_8_does_not_help_in_fp16_it_rounds_to_zero) {
  ASSERT_EQ(reference_f16(1e-8f), 0.0);
  RunConfig c = default_config(Model::tagger);
  c.clamp_eps = 1e-8;
  const RunResult r = train(c);
  expect_tagger_log_origin(r, false);
}

TEST_F(user_models_test, tagger_remedy_sigmoid_in_f32_is_clean_in_fp16) {
  RunConfig c = default_config(Model::tagger);
  apply_override(c, "sigmoid", /*is_op=*/true);
  expect_clean(train(c), "sigmoid kept in f32");
  RunConfig m = default_config(Model::tagger);
  apply_override(m, "loss", /*is_op=*/false);  // the whole loss scope in f32
  expect_clean(train(m), "module 'loss' kept in f32");
}

TEST_F(user_models_test, tagger_remedy_lower_lr_is_clean_in_fp16) {
  RunConfig c = default_config(Model::tagger);
  c.lr = 1e-3;
  expect_clean(train(c), "lr 1e-3");
}

// ---- 2. handnorm: (x - mean) / sqrt(var + 1e-8) by hand ----

TEST_F(user_models_test, handnorm_fp16_divides_zero_by_zero_where_a_relu_unit_is_dead_over_the_batch) {
  const RunResult r = train(default_config(Model::handnorm));
  // The first step and norm whose input has a constant column (var = 0), from the run's own tensors.
  std::int64_t step = -1;
  std::string module;
  std::int64_t columns = 0;
  for (std::size_t s = 0; s < r.constant_columns.size() && step < 0; ++s) {
    for (const auto& [name, count] : r.constant_columns[s]) {
      if (count > 0) {
        step = static_cast<std::int64_t>(s);
        module = name;
        columns = count;
        break;
      }
    }
  }
  ASSERT_GE(step, 1) << "no unit dies after the first step: the run shows nothing";
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, step);
  EXPECT_EQ(o->phase, trace::Phase::forward);
  EXPECT_EQ(o->op, "div");
  EXPECT_EQ(o->module, module);
  EXPECT_EQ(o->out_dtype, "f16");
  EXPECT_EQ(o->health.nan, columns * r.batch);  // 0 / 0 on every row of each dead column
  EXPECT_EQ(r.first_nonfinite_loss, step);
}

TEST_F(user_models_test, handnorm_fp32_survives_the_same_dead_unit) {
  RunConfig c = default_config(Model::handnorm);
  set_precision(c, Precision::fp32);
  const RunResult r = train(c);
  expect_clean(r, "handnorm fp32");
  std::int64_t dead = 0;
  for (const auto& step : r.constant_columns) {
    for (const auto& entry : step) dead += entry.second;
  }
  EXPECT_GT(dead, 0);  // var = 0 happened in f32 too; 0 / sqrt(1e-8) = 0
}

TEST_F(user_models_test, handnorm_remedy_eps_1e_4_is_clean_in_fp16) {
  RunConfig c = default_config(Model::handnorm);
  c.norm_eps = 1e-4;
  expect_clean(train(c), "eps 1e-4");
}

TEST_F(user_models_test, handnorm_remedy_norm_modules_in_f32_is_clean_in_fp16) {
  RunConfig c = default_config(Model::handnorm);
  apply_override(c, "norm*", /*is_op=*/false);
  expect_clean(train(c), "modules norm* kept in f32");
}

TEST_F(user_models_test, handnorm_remedy_lower_lr_is_clean_in_fp16) {
  RunConfig c = default_config(Model::handnorm);
  c.lr = 0.05;
  expect_clean(train(c), "lr 0.05");
}

TEST_F(user_models_test, handnorm_bf16_is_clean_1e_8_is_within_its_range) {
  ASSERT_GT(reference_bf16(1e-8f), 0.0);
  RunConfig c = default_config(Model::handnorm);
  set_precision(c, Precision::bf16);
  expect_clean(train(c), "handnorm bf16");
}

// ---- 3. lse: log(sum(exp(logits))) after the autocast region ----

// Logits whose exp, computed in float and rounded once to f16, is inf.
std::int64_t exp_overflows(const std::vector<double>& logits) {
  std::int64_t n = 0;
  for (double z : logits) n += std::isinf(reference_f16(std::exp(static_cast<float>(z)))) ? 1 : 0;
  return n;
}

TEST_F(user_models_test, lse_fp16_exp_outside_autocast_overflows_f16) {
  const RunResult r = train(default_config(Model::lse));
  std::vector<std::int64_t> over;
  for (const auto& out : r.outputs) over.push_back(exp_overflows(out));
  const std::int64_t step = first_step_with(over);
  ASSERT_GE(step, 1);
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, step);
  EXPECT_EQ(o->phase, trace::Phase::forward);
  EXPECT_EQ(o->op, "exp");
  EXPECT_EQ(o->module, "loss");
  EXPECT_EQ(o->out_dtype, "f16");
  EXPECT_EQ(o->autocast, "");  // outside the region: no autocast reason
  EXPECT_EQ(o->health.pos_inf, over[static_cast<std::size_t>(step)]);
  EXPECT_EQ(r.first_nonfinite_loss, step);
  EXPECT_TRUE(std::isinf(r.losses[static_cast<std::size_t>(step)]));
  // exp's gradient is 0 * inf = NaN: that step and every later one is skipped, the weights never move.
  EXPECT_EQ(r.skipped_steps(), static_cast<std::int64_t>(r.losses.size()) - step);
}

TEST_F(user_models_test, lse_fp32_is_clean) {
  RunConfig c = default_config(Model::lse);
  set_precision(c, Precision::fp32);
  expect_clean(train(c), "lse fp32");
}

TEST_F(user_models_test, lse_remedy_loss_inside_autocast_or_cast_to_f32_is_clean_in_fp16) {
  RunConfig inside = default_config(Model::lse);
  inside.loss_in_autocast = true;  // autocast's table runs exp in f32
  expect_clean(train(inside), "loss inside autocast");
  RunConfig cast = default_config(Model::lse);
  cast.loss_cast_f32 = true;
  expect_clean(train(cast), "logits.to(f32) before the loss");
}

// Overrides apply only inside enabled autocast regions: neither keeping the op exp nor the module 'loss'
// in f32 changes a loss computed after the region closed (a remedy must say logits.to(f32) instead).
TEST_F(user_models_test, lse_f32_overrides_do_not_reach_ops_outside_autocast) {
  const std::int64_t step = first_origin(train(default_config(Model::lse)).trace_path)->step;
  for (const bool is_op : {true, false}) {
    RunConfig c = default_config(Model::lse);
    apply_override(c, is_op ? "exp" : "loss", is_op);
    const RunResult r = train(c);
    const std::optional<trace::OpRow> o = first_origin(r.trace_path);
    ASSERT_TRUE(o.has_value()) << (is_op ? "op exp" : "module loss");
    EXPECT_EQ(o->step, step);
    EXPECT_EQ(o->op, "exp");
    EXPECT_EQ(o->out_dtype, "f16");
  }
}

TEST_F(user_models_test, lse_remedy_bf16_is_clean) {
  RunConfig c = default_config(Model::lse);
  set_precision(c, Precision::bf16);
  expect_clean(train(c), "lse bf16");
}

TEST_F(user_models_test, lse_remedy_lower_lr_is_clean_in_fp16) {
  RunConfig c = default_config(Model::lse);
  c.lr = 2e-3;
  const RunResult r = train(c);
  expect_clean(r, "lr 2e-3");
}

// ---- 4. rmsnorm: x * rsqrt(mean(x * x)), silent damage ----

// Elements of blocks.1.norm's input whose square, computed in float and rounded to f16, is inf.
std::int64_t square_overflows(const std::vector<double>& x) {
  std::int64_t n = 0;
  for (double v : x) n += std::isinf(reference_f16(static_cast<float>(v) * static_cast<float>(v))) ? 1 : 0;
  return n;
}

TEST_F(user_models_test, rmsnorm_fp16_square_overflow_silently_turns_the_block_into_its_bias) {
  const RunResult r = train(default_config(Model::rmsnorm));
  std::vector<std::int64_t> over;
  for (const auto& x : r.norm_inputs) over.push_back(square_overflows(x));
  const std::int64_t step = first_step_with(over);
  ASSERT_GE(step, 1);
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, step);
  EXPECT_EQ(o->phase, trace::Phase::forward);
  EXPECT_EQ(o->op, "mul");
  EXPECT_EQ(o->module, "blocks.1.norm");
  EXPECT_EQ(o->out_dtype, "f16");
  EXPECT_EQ(o->health.pos_inf, over[static_cast<std::size_t>(step)]);
  // The damage: rows of the block's output equal to its bias, exactly on the steps with an overflow.
  for (std::size_t s = 0; s < over.size(); ++s) {
    EXPECT_EQ(r.bias_rows[s] > 0, over[s] > 0) << "step " << s;
  }
  EXPECT_GT(r.bias_rows[static_cast<std::size_t>(step)], 0);
  // Silent: every loss finite, no step skipped, and no NaN/inf in the loss, the backward pass or the
  // gradients, only in the forward ops before rsqrt.
  EXPECT_EQ(r.first_nonfinite_loss, -1);
  EXPECT_EQ(r.skipped_steps(), 0);
  trace::TraceReader reader(r.trace_path);
  for (const trace::OpRow& row : reader.ops()) {
    if (row.health.nan + row.health.pos_inf + row.health.neg_inf == 0) continue;
    EXPECT_EQ(row.phase, trace::Phase::forward) << row.op << " in " << row.module;
    EXPECT_EQ(row.module, "blocks.1.norm") << row.op;
    EXPECT_NE(row.op, "rsqrt");
  }
  for (const trace::GradRow& g : reader.grads()) EXPECT_EQ(g.nan + g.pos_inf + g.neg_inf, 0) << g.param;
}

TEST_F(user_models_test, rmsnorm_fp32_is_clean_and_undamaged) {
  RunConfig c = default_config(Model::rmsnorm);
  set_precision(c, Precision::fp32);
  const RunResult r = train(c);
  expect_clean(r, "rmsnorm fp32");
  EXPECT_EQ(*std::max_element(r.bias_rows.begin(), r.bias_rows.end()), 0);
}

TEST_F(user_models_test, rmsnorm_remedy_norm_module_in_f32_is_clean_and_undamaged) {
  RunConfig c = default_config(Model::rmsnorm);
  apply_override(c, "blocks.1.norm", /*is_op=*/false);
  const RunResult r = train(c);
  expect_clean(r, "blocks.1.norm kept in f32");
  EXPECT_EQ(*std::max_element(r.bias_rows.begin(), r.bias_rows.end()), 0);
}

TEST_F(user_models_test, rmsnorm_remedy_bf16_is_clean_and_undamaged) {
  RunConfig c = default_config(Model::rmsnorm);
  set_precision(c, Precision::bf16);
  const RunResult r = train(c);
  expect_clean(r, "rmsnorm bf16");
  EXPECT_EQ(*std::max_element(r.bias_rows.begin(), r.bias_rows.end()), 0);
}

// ---- 5. pairs: a logit scale of 100 makes exp (f16, after the autocast region) overflow ----

// The largest |logit| of a step as the run computed it: each similarity (f16) times the scale, in float,
// rounded once to f16 (a 0-dim f32 factor does not promote the f16 matrix).
double max_logit_f16(const RunResult& r, std::size_t step) {
  double m = 0;
  for (double sim : r.similarities[step])
    m = std::max(m, std::fabs(reference_f16(static_cast<float>(sim) * static_cast<float>(r.logit_scales[step]))));
  return m;
}

TEST_F(user_models_test, pairs_fp16_exp_of_logits_scaled_by_100_overflows_at_step_0) {
  const RunResult r = train(default_config(Model::pairs));
  ASSERT_FALSE(r.similarities.empty());
  EXPECT_NEAR(r.logit_scales[0], 100.0, 1e-4);
  // exp in f16 overflows above ln(65504) = 11.09: the first step's logits are already past it.
  EXPECT_GT(max_logit_f16(r, 0), std::log(65504.0));
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, 0);
  EXPECT_EQ(o->op, "exp");
  EXPECT_EQ(o->module, "loss");
  EXPECT_EQ(o->out_dtype, "f16");
  EXPECT_EQ(o->autocast, "");  // after the region: an autocast override cannot reach it
  EXPECT_EQ(r.first_nonfinite_loss, 0);
}

TEST_F(user_models_test, pairs_fp32_is_clean) {
  RunConfig c = default_config(Model::pairs);
  set_precision(c, Precision::fp32);
  expect_clean(train(c), "pairs fp32");
}

TEST_F(user_models_test, pairs_with_a_logit_scale_of_10_stays_within_exps_f16_range) {
  RunConfig c = default_config(Model::pairs);
  c.logit_scale = 10;
  const RunResult r = train(c);
  expect_clean(r, "logit scale 10");
  for (std::size_t s = 0; s < r.similarities.size(); ++s) EXPECT_LT(max_logit_f16(r, s), std::log(65504.0)) << s;
}

// ---- 6. attention: q k^T without the 1/sqrt(d) overflows f16 in bmm ----

// The largest |score| of a step in f64 from the q and k the bmm took (row-major [16, 12, 64] each).
double max_score(const RunResult& r, std::size_t step) {
  const std::vector<double>& q = r.queries[step];
  const std::vector<double>& k = r.keys[step];
  double m = 0;
  for (std::size_t b = 0; b < 16; ++b)
    for (std::size_t i = 0; i < 12; ++i)
      for (std::size_t j = 0; j < 12; ++j) {
        double acc = 0;
        for (std::size_t d = 0; d < 64; ++d) acc += q[(b * 12 + i) * 64 + d] * k[(b * 12 + j) * 64 + d];
        m = std::max(m, std::fabs(acc));
      }
  return m;
}

TEST_F(user_models_test, attention_fp16_unscaled_scores_overflow_in_bmm_at_step_0) {
  const RunResult r = train(default_config(Model::attention));
  ASSERT_FALSE(r.queries.empty());
  // f16's largest finite value is 65504; a result from 65520 on rounds to inf.
  EXPECT_GE(max_score(r, 0), 65520.0);
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->step, 0);
  EXPECT_EQ(o->op, "bmm");
  EXPECT_EQ(o->module, "attn");
  EXPECT_EQ(o->out_dtype, "f16");
  EXPECT_GT(o->health.pos_inf + o->health.neg_inf, 0);
}

TEST_F(user_models_test, attention_fp32_is_clean) {
  RunConfig c = default_config(Model::attention);
  set_precision(c, Precision::fp32);
  expect_clean(train(c), "attention fp32");
}

TEST_F(user_models_test, attention_with_q_scaled_by_1_over_sqrt_64_keeps_the_scores_in_f16) {
  RunConfig c = default_config(Model::attention);
  c.q_scale = 0.125;
  const RunResult r = train(c);
  expect_clean(r, "q / sqrt(64)");
  // The same weights at step 0: q times 0.125 (a power of two, exact in f16) makes every score 8 times smaller.
  const RunResult unscaled = train(default_config(Model::attention));
  EXPECT_DOUBLE_EQ(max_score(r, 0), max_score(unscaled, 0) / 8);
  // And they stay below a quarter of f16's largest value while the run trains.
  for (std::size_t s = 0; s < r.queries.size(); ++s) EXPECT_LT(max_score(r, s), 65504.0 / 4) << s;
}

}  // namespace
}  // namespace ampscope::user_models
