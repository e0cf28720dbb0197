// The failure scenarios of `ampscope train --scenario` (samples/scenarios.cpp, docs/scenarios.md): each
// produces its first anomaly at the step, op and module it documents, the scaler does what the document
// says, and the comparison runs (fp32, bf16, an autocast override) are clean where the failure is f16's.
//
// References: the expected first anomalies are the table below, written from docs/scenarios.md; the
// scale sequences are recomputed here from GradScaler's rule (x0.5 on an overflow, x2 after
// growth_interval clean steps), exact in double because every scale is a power of two; counts of
// non-finite values come from the shapes (a fully masked row of T keys gives T NaN); whether a value
// exceeds f16 is checked in the fp32 run of the same scenario (the same value, computed in f32).
// Every run goes through train() with a RunLogHook (run_log.h), so the same checks can read a trace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <filesystem>
#include <unistd.h>

#include "core/error.h"
#include "probes/trace/reader.h"
#include "cli/run.h"
#include "tests/scenarios/run_log.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

using testing::GradEntry;
using testing::OpEntry;
using testing::RunLog;
using testing::run_logged;

constexpr double kF16Max = 65504.0;

TrainConfig scenario_config(const std::string& scenario, Precision precision,
                            const std::vector<std::string>& autocast_fp32 = {}) {
  TrainConfig c;
  c.scenario = scenario;
  c.precision = precision;
  c.device = "cpu";
  c.autocast_fp32 = autocast_fp32;
  return c;
}

// Each (scenario, precision, overrides) runs once per test program: several tests read the same run.
const RunLog& logged(const std::string& scenario, Precision precision = Precision::fp16,
                     const std::vector<std::string>& autocast_fp32 = {}) {
  static std::map<std::string, RunLog> cache;
  std::string key = scenario + "/" + std::string(precision_name(precision));
  for (const std::string& p : autocast_fp32) key += "/" + p;
  auto found = cache.find(key);
  if (found == cache.end()) found = cache.emplace(key, run_logged(scenario_config(scenario, precision, autocast_fp32))).first;
  return found->second;
}

// The forward op of `step` named `op` in `scope` (the first one, when it runs more than once).
const OpEntry* forward_op(const RunLog& log, std::int64_t step, const std::string& op, const std::string& scope) {
  for (const OpEntry& e : log.ops) {
    if (e.step == step && e.phase == probe::Phase::forward && e.op == op && e.scope == scope) return &e;
  }
  return nullptr;
}

std::vector<const OpEntry*> origins_in_step(const RunLog& log, std::int64_t step) {
  std::vector<const OpEntry*> out;
  for (const OpEntry& e : log.ops) {
    if (e.step == step && e.origin) out.push_back(&e);
  }
  return out;
}

double mean(const std::vector<double>& v, std::size_t begin, std::size_t end) {
  double s = 0;
  for (std::size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

// A run where every step overflows: skipped, and the scale halves each time from 65536.
void expect_backoff_every_step(const RunLog& log) {
  ASSERT_FALSE(log.steps.empty());
  double scale = 65536.0;
  for (std::size_t k = 0; k < log.steps.size(); ++k) {
    EXPECT_TRUE(log.steps[k].skipped) << "step " << k;
    EXPECT_EQ(log.steps[k].scale, scale) << "step " << k;
    EXPECT_EQ(log.steps[k].scale_after, scale * 0.5) << "step " << k;
    scale *= 0.5;
  }
  ASSERT_EQ(log.scaler.size(), log.steps.size());
  for (const probe::ScalerEvent& e : log.scaler) EXPECT_EQ(e.change, probe::ScalerEvent::Change::backoff);
  EXPECT_EQ(log.result.skipped, static_cast<std::int64_t>(log.steps.size()));
}

void expect_clean(const RunLog& log) {
  ASSERT_FALSE(log.steps.empty());
  EXPECT_EQ(log.origins(), 0) << "first origin: " << (log.first_origin() ? log.first_origin()->describe() : "");
  for (const probe::StepSummary& s : log.steps) {
    EXPECT_TRUE(std::isfinite(s.loss)) << "step " << s.step;
    EXPECT_FALSE(s.skipped) << "step " << s.step;
  }
}

// ---- the registry ----

TEST(scenario_registry_test, holds_the_fifteen_scenarios_of_the_issues_in_order) {
  std::vector<std::string> names;
  for (const Scenario& s : scenario_registry()) {
    names.push_back(s.name);
    EXPECT_FALSE(s.description.empty()) << s.name;
    EXPECT_FALSE(s.expect.empty()) << s.name;
    EXPECT_NO_THROW(find_sample(s.sample)) << s.name;
    EXPECT_TRUE(s.configure) << s.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"attention-overflow", "masked-softmax", "activation-overflow", "log-zero",
                                             "lr-explosion", "grad-underflow", "scale-collapse", "no-zero-grad",
                                             "rank-bad-batch", "rank-drift", "fp8-stale-scale", "fp8-e4m3-grads",
                                             "fp8-saturation", "mx-floor-clipping", "nvfp4-outlier",
                                             "nvfp4-batch-outlier"}));
}

TEST(scenario_registry_test, an_unknown_name_lists_the_known_ones) {
  EXPECT_THROW_MSG(find_scenario("attention"), Error, "unknown scenario 'attention'",
                   "attention-overflow, masked-softmax, activation-overflow, log-zero, lr-explosion, grad-underflow, "
                   "scale-collapse, no-zero-grad, rank-bad-batch, rank-drift, fp8-stale-scale, fp8-e4m3-grads, "
                   "fp8-saturation, mx-floor-clipping, nvfp4-outlier, nvfp4-batch-outlier",
                   "hint: ampscope train --list-scenarios");
}

TEST(scenario_registry_test, configure_sets_the_sample_and_what_the_failure_needs) {
  for (const Scenario& s : scenario_registry()) {
    TrainConfig c;
    s.configure(c);
    EXPECT_EQ(c.sample, s.sample) << s.name;
    EXPECT_EQ(c.precision, Precision::fp16) << s.name << ": a scenario never changes the precision";
    EXPECT_EQ(c.use_scaler, s.name != "grad-underflow") << s.name;
    EXPECT_EQ(c.zero_grad, s.name != "no-zero-grad") << s.name;
  }
}

TEST(scenario_registry_test, configure_keeps_values_the_user_set) {
  for (const Scenario& s : scenario_registry()) {
    TrainConfig c;
    c.sample = "cnn";  // the sample is the scenario's, always
    c.precision = Precision::bf16;
    c.steps = 3;
    c.batch = 16;
    c.lr = 1e-4;
    c.growth_interval = 7;
    s.configure(c);
    EXPECT_EQ(c.sample, s.sample) << s.name;
    EXPECT_EQ(c.precision, Precision::bf16) << s.name;
    EXPECT_EQ(c.steps, 3) << s.name;
    EXPECT_EQ(c.batch, 16) << s.name;
    EXPECT_EQ(c.lr, 1e-4) << s.name;
    EXPECT_EQ(c.growth_interval, 7) << s.name;
  }
  TrainConfig c = scenario_config("attention-overflow", Precision::fp16);
  c.steps = 2;
  EXPECT_EQ(train(c).steps, 2);
}

// ---- where each first anomaly is ----

struct FirstAnomaly {
  std::string scenario;
  std::int64_t step;
  probe::Phase phase;
  std::string op;
  std::string scope;  // "" for ops outside modules (the loss)
};

void PrintTo(const FirstAnomaly& a, std::ostream* os) {
  *os << a.scenario << ": " << probe::phase_name(a.phase) << " " << a.op << " in '" << a.scope << "' at step " << a.step;
}

const std::vector<FirstAnomaly>& first_anomalies() {
  static const std::vector<FirstAnomaly> kTable = {
      {"attention-overflow", 0, probe::Phase::forward, "bmm", "blocks.0.attn"},
      {"masked-softmax", 0, probe::Phase::forward, "softmax", "blocks.0.attn"},
      {"activation-overflow", 3, probe::Phase::forward, "linear", "blocks.1.mlp.2"},
      {"log-zero", 0, probe::Phase::forward, "log", ""},
      {"lr-explosion", 1, probe::Phase::forward, "linear", "fc3"},
      {"scale-collapse", 0, probe::Phase::forward, "linear", "fc1"},
      {"no-zero-grad", 5, probe::Phase::backward, "linear", "fc3"},
      {"rank-bad-batch", 3, probe::Phase::forward, "linear", "fc1"},
  };
  return kTable;
}

class first_anomaly : public ::testing::TestWithParam<FirstAnomaly> {};

TEST_P(first_anomaly, is_at_the_documented_step_op_and_module_in_fp16) {
  const FirstAnomaly& want = GetParam();
  const RunLog& log = logged(want.scenario);
  const OpEntry* first = log.first_origin();
  ASSERT_NE(first, nullptr) << want.scenario << " produced no anomaly";
  EXPECT_EQ(first->step, want.step) << first->describe();
  EXPECT_EQ(first->phase, want.phase) << first->describe();
  EXPECT_EQ(first->op, want.op) << first->describe();
  EXPECT_EQ(first->scope, want.scope) << first->describe();
  EXPECT_GT(first->out.non_finite(), 0);
  // Nothing before it: the steps up to the anomaly's step trained normally.
  for (std::int64_t k = 0; k < want.step; ++k) EXPECT_FALSE(log.steps[static_cast<std::size_t>(k)].skipped) << k;
  EXPECT_TRUE(log.steps[static_cast<std::size_t>(want.step)].found_inf);
}

TEST_P(first_anomaly, is_what_the_scenarios_expect_line_says) {
  const FirstAnomaly& want = GetParam();
  const std::string& expect = find_scenario(want.scenario).expect;
  EXPECT_EQ(expect.rfind("origin: ", 0), 0u) << expect;
  EXPECT_NE(expect.find(want.op), std::string::npos) << expect;
  EXPECT_NE(expect.find(want.scope.empty() ? "loss" : "in " + want.scope), std::string::npos) << expect;
  const std::size_t at = expect.find("at step ");  // the first step named is the anomaly's
  ASSERT_NE(at, std::string::npos) << expect;
  EXPECT_EQ(std::stoll(expect.substr(at + 8)), want.step) << expect;
  if (want.phase == probe::Phase::backward) {
    EXPECT_NE(expect.find("backward"), std::string::npos) << expect;
  }
}

// The same first anomaly, read back from the HDF5 trace `ampscope train --out` writes: the probe's own
// origin rule and the file agree with the hook-based log above.
TEST_P(first_anomaly, is_the_first_origin_the_trace_records) {
  const FirstAnomaly& want = GetParam();
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_scenario_" + want.scenario + "_" + std::to_string(::getpid()) + ".h5");
  TrainConfig c = scenario_config(want.scenario, Precision::fp16);
  c.out = path.string();
  train(c);
  trace::TraceReader reader(path);
  ASSERT_TRUE(reader.complete());
  const std::vector<trace::OpRow> ops = reader.ops();
  const trace::OpRow* first = nullptr;
  for (const trace::OpRow& row : ops) {
    if (row.origin) {
      first = &row;
      break;
    }
  }
  ASSERT_NE(first, nullptr) << want.scenario << ": no origin in the trace";
  EXPECT_EQ(first->step, want.step);
  EXPECT_EQ(first->op, want.op);
  EXPECT_EQ(first->module, want.scope);
  EXPECT_EQ(first->phase, want.phase == probe::Phase::forward ? trace::Phase::forward : trace::Phase::backward);
  bool event = false;
  for (const trace::EventRow& e : reader.events()) {
    if (e.kind == "origin") {
      event = e.step == want.step && e.op == want.op && e.module == want.scope;
      break;
    }
  }
  EXPECT_TRUE(event) << "the first origin event names the same op";
  std::filesystem::remove(path);
}

TEST(attention_overflow_test, the_fp32_trace_records_no_anomaly_although_the_causal_mask_writes_minus_inf) {
  // masked_fill's -inf is attention's causal mask, not an overflow: the probe must not call it an origin.
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_fp32_attention_" + std::to_string(::getpid()) + ".h5");
  TrainConfig c = scenario_config("attention-overflow", Precision::fp32);
  c.out = path.string();
  const TrainResult r = train(c);
  EXPECT_EQ(r.anomalies, 0);
  trace::TraceReader reader(path);
  for (const trace::EventRow& e : reader.events()) {
    EXPECT_NE(e.kind, "origin") << e.op << " in " << e.module << ": " << e.detail;
    EXPECT_NE(e.kind, "propagate") << e.op << " in " << e.module << ": " << e.detail;
  }
  bool saw_mask = false;
  for (const trace::OpRow& row : reader.ops()) saw_mask = saw_mask || (row.op == "masked_fill" && row.health.neg_inf > 0);
  EXPECT_TRUE(saw_mask) << "the mask's -inf is still counted in the op's health";
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(scenarios, first_anomaly, ::testing::ValuesIn(first_anomalies()),
                         [](const auto& info) {
                           std::string name = info.param.scenario;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

// ---- each scenario's own story ----

TEST(attention_overflow_test, scores_overflow_in_the_product_not_in_q_or_k_and_softmax_turns_them_to_nan) {
  const RunLog& log = logged("attention-overflow");
  const OpEntry* qkv = forward_op(log, 0, "linear", "blocks.0.attn.qkv");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->out.non_finite(), 0);
  EXPECT_LT(qkv->out.absmax, 1000.0);  // q and k are moderate; their 32-term dot products are not
  const OpEntry* scores = log.first_origin();
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(scores->dtype, DType::f16);
  EXPECT_GT(scores->out.pos_inf, 0);
  const OpEntry* softmax = forward_op(log, 0, "softmax", "blocks.0.attn");
  ASSERT_NE(softmax, nullptr);
  EXPECT_TRUE(softmax->propagates);
  EXPECT_GT(softmax->out.nan, 0);
  EXPECT_EQ(log.first_nan(), softmax) << log.first_nan()->describe();
  EXPECT_TRUE(std::isnan(log.steps[0].loss));
  expect_backoff_every_step(log);
}

TEST(attention_overflow_test, the_same_scores_are_finite_in_fp32_and_above_the_f16_range) {
  const RunLog& log = logged("attention-overflow", Precision::fp32);
  expect_clean(log);
  EXPECT_GT(log.forward_absmax("bmm", "blocks.0.attn", 0), kF16Max);
  EXPECT_LT(log.steps.back().loss, log.steps.front().loss);
}

TEST(attention_overflow_test, is_fixed_by_bf16_or_by_keeping_attention_in_f32) {
  expect_clean(logged("attention-overflow", Precision::bf16));
  expect_clean(logged("attention-overflow", Precision::fp16, {"blocks.*.attn"}));
}

TEST(masked_softmax_test, softmax_makes_nan_of_every_fully_masked_row_from_a_finite_input) {
  const RunLog& log = logged("masked-softmax");
  const OpEntry* softmax = log.first_origin();
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(softmax->dtype, DType::f16);
  EXPECT_TRUE(softmax->inputs_finite);
  // batch 4 x 4 heads x 8 padded query rows, each of 64 keys, all NaN; the other rows are finite.
  EXPECT_EQ(softmax->out.nan, 4 * 4 * 8 * 64);
  EXPECT_EQ(softmax->out.pos_inf + softmax->out.neg_inf, 0);
  // The masked scores are finite f32: the mask was added in f32 (f16 + f32 promotes).
  const OpEntry* masked = forward_op(log, 0, "add", "blocks.0.attn");
  ASSERT_NE(masked, nullptr);
  EXPECT_EQ(masked->dtype, DType::f32);
  EXPECT_EQ(masked->out.non_finite(), 0);
  EXPECT_GT(masked->out.absmax, 2 * kF16Max - 100);  // two -65504 terms, plus a score
  expect_backoff_every_step(log);
}

TEST(masked_softmax_test, is_clean_when_softmax_computes_in_f32_or_bf16) {
  expect_clean(logged("masked-softmax", Precision::fp32));
  expect_clean(logged("masked-softmax", Precision::bf16));
  expect_clean(logged("masked-softmax", Precision::fp16, {"softmax"}));
}

TEST(activation_overflow_test, the_feed_forward_output_grows_step_by_step_until_it_passes_65504) {
  const RunLog& log = logged("activation-overflow");
  std::vector<double> absmax;
  for (std::int64_t k = 0; k < 3; ++k) absmax.push_back(log.forward_absmax("linear", "blocks.1.mlp.2", k));
  EXPECT_LT(absmax[0], absmax[1]);
  EXPECT_LT(absmax[1], absmax[2]);
  EXPECT_LT(absmax[2], kF16Max);
  // Its input, the hidden activation, stays finite and inside f16 at the step it overflows.
  const OpEntry* hidden = forward_op(log, 3, "linear", "blocks.1.mlp.0");
  ASSERT_NE(hidden, nullptr);
  EXPECT_EQ(hidden->out.non_finite(), 0);
  EXPECT_LT(hidden->out.absmax, kF16Max);
  for (std::size_t k = 3; k < log.steps.size(); ++k) EXPECT_TRUE(log.steps[k].skipped) << k;
}

TEST(activation_overflow_test, fp32_reaches_the_same_values_without_harm) {
  const RunLog& log = logged("activation-overflow", Precision::fp32);
  expect_clean(log);
  EXPECT_GT(log.forward_absmax("linear", "blocks.1.mlp.2", 3), kF16Max);
}

TEST(activation_overflow_test, is_fixed_by_bf16_or_by_keeping_the_feed_forward_in_f32) {
  expect_clean(logged("activation-overflow", Precision::bf16));
  expect_clean(logged("activation-overflow", Precision::fp16, {"blocks.1.mlp.*"}));
}

TEST(log_zero_test, log_gives_minus_inf_exactly_where_the_f16_softmax_gave_zero) {
  const RunLog& log = logged("log-zero");
  const OpEntry* softmax = forward_op(log, 0, "softmax", "");
  const OpEntry* log_op = log.first_origin();
  ASSERT_NE(softmax, nullptr);
  ASSERT_NE(log_op, nullptr);
  EXPECT_EQ(softmax->dtype, DType::f16);
  EXPECT_EQ(softmax->out.non_finite(), 0);
  EXPECT_GT(softmax->out.zero, 0);
  EXPECT_EQ(log_op->out.neg_inf, softmax->out.zero);
  EXPECT_EQ(log_op->out.nan + log_op->out.pos_inf, 0);
  EXPECT_FALSE(std::isfinite(log.steps[0].loss));
  expect_backoff_every_step(log);
}

TEST(log_zero_test, is_clean_in_fp32_and_bf16_where_no_probability_underflows) {
  expect_clean(logged("log-zero", Precision::fp32));
  expect_clean(logged("log-zero", Precision::bf16));
  EXPECT_EQ(forward_op(logged("log-zero", Precision::fp32), 0, "softmax", "")->out.zero, 0);
}

TEST(lr_explosion_test, one_step_takes_the_logits_past_65504) {
  const RunLog& log = logged("lr-explosion");
  EXPECT_LT(log.forward_absmax("linear", "fc3", 0), 10.0);
  const OpEntry* fc2 = forward_op(log, 1, "linear", "fc2");
  ASSERT_NE(fc2, nullptr);
  EXPECT_EQ(fc2->out.non_finite(), 0);  // fc3's inputs are finite: fc3 is the origin
  for (std::size_t k = 1; k < log.steps.size(); ++k) EXPECT_TRUE(log.steps[k].skipped) << k;
}

TEST(lr_explosion_test, fp32_diverges_too_but_stays_finite) {
  const RunLog& log = logged("lr-explosion", Precision::fp32);
  expect_clean(log);
  EXPECT_GT(log.forward_absmax("linear", "fc3", 1), kF16Max);
  EXPECT_GT(log.steps[1].loss, 1000 * log.steps[0].loss);
}

TEST(grad_underflow_test, every_f16_gradient_is_zero_and_nothing_overflows) {
  const RunLog& log = logged("grad-underflow");
  EXPECT_EQ(log.origins(), 0);
  EXPECT_EQ(log.result.skipped, 0);
  ASSERT_EQ(log.steps.size(), 20u);
  for (const probe::StepSummary& s : log.steps) {
    EXPECT_EQ(s.scale, 1.0);  // no scaler
    const std::vector<const GradEntry*> grads = log.unscaled_grads(s.step);
    ASSERT_EQ(grads.size(), 6u) << "fc1, fc2, fc3: weight and bias";
    for (const GradEntry* g : grads) EXPECT_EQ(g->health.zero, g->health.numel) << g->name << " at step " << s.step;
  }
}

TEST(grad_underflow_test, the_loss_stays_flat_in_f16_and_falls_in_fp32_and_bf16) {
  std::vector<double> f16, f32, b16;
  for (const auto& s : logged("grad-underflow").steps) f16.push_back(s.loss);
  for (const auto& s : logged("grad-underflow", Precision::fp32).steps) f32.push_back(s.loss);
  for (const auto& s : logged("grad-underflow", Precision::bf16).steps) b16.push_back(s.loss);
  ASSERT_EQ(f16.size(), 20u);
  EXPECT_NEAR(mean(f16, 15, 20), mean(f16, 0, 5), 0.01 * mean(f16, 0, 5));
  EXPECT_LT(mean(f32, 15, 20), 0.85 * mean(f32, 0, 5));
  EXPECT_LT(mean(b16, 15, 20), 0.85 * mean(b16, 0, 5));
  // The same gradients are small but not zero where they are computed in f32.
  for (const GradEntry* g : logged("grad-underflow", Precision::fp32).unscaled_grads(0)) {
    EXPECT_LT(g->health.zero, g->health.numel) << g->name;
  }
}

TEST(scale_collapse_test, fc1_overflows_every_step_and_the_scale_halves_every_step) {
  const RunLog& log = logged("scale-collapse");
  ASSERT_EQ(log.steps.size(), 20u);
  for (std::int64_t k = 0; k < 20; ++k) {
    const std::vector<const OpEntry*> origins = origins_in_step(log, k);
    ASSERT_FALSE(origins.empty()) << "step " << k;
    EXPECT_EQ(origins[0]->op, "linear");
    EXPECT_EQ(origins[0]->scope, "fc1");
    EXPECT_EQ(origins[0]->phase, probe::Phase::forward);
  }
  expect_backoff_every_step(log);
  EXPECT_EQ(log.result.final_scale, 65536.0 / (1 << 20));
}

TEST(scale_collapse_test, the_raw_feature_is_harmless_in_fp32) { expect_clean(logged("scale-collapse", Precision::fp32)); }

TEST(no_zero_grad_test, one_overflow_stays_in_the_gradients_and_every_later_step_skips) {
  const RunLog& log = logged("no-zero-grad");
  ASSERT_EQ(log.steps.size(), 20u);
  // GradScaler's rule with growth_interval 1: x2 after each clean step, x0.5 after each overflow.
  double scale = 65536.0;
  for (const probe::StepSummary& s : log.steps) {
    EXPECT_EQ(s.scale, scale) << "step " << s.step;
    EXPECT_EQ(s.skipped, s.step >= 5) << "step " << s.step;
    scale *= s.step >= 5 ? 0.5 : 2.0;
  }
  // From step 7 on (scale 2^19 and below) the backward does not overflow any more: what the scaler
  // finds is the stale inf in .grad.
  for (std::int64_t k = 7; k < 20; ++k) EXPECT_TRUE(origins_in_step(log, k).empty()) << "step " << k;
  for (std::int64_t k = 7; k < 20; ++k) {
    std::int64_t non_finite = 0;
    for (const GradEntry* g : log.unscaled_grads(k)) non_finite += g->health.non_finite();
    EXPECT_GT(non_finite, 0) << "step " << k;
  }
}

TEST(no_zero_grad_test, the_same_loop_with_zero_grad_recovers_after_each_overflow) {
  TrainConfig c;
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 20;
  c.growth_interval = 1;
  const RunLog log = run_logged(c);
  std::int64_t later_clean = 0;
  for (const probe::StepSummary& s : log.steps) later_clean += s.step > 5 && !s.skipped ? 1 : 0;
  EXPECT_GE(later_clean, 5);
}

TEST(scenario_runs_test, are_bit_identical_for_the_same_seed) {
  const RunLog a = run_logged(scenario_config("lr-explosion", Precision::fp32));
  const RunLog& b = logged("lr-explosion", Precision::fp32);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t k = 0; k < a.steps.size(); ++k) EXPECT_EQ(a.steps[k].loss, b.steps[k].loss) << k;
}

}  // namespace
}  // namespace ampscope::samples
