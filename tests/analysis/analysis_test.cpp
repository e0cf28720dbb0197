// The diagnosis of probes/analysis/analysis.h on traces written by real training runs of the failure scenarios
// (docs/scenarios.md): the first diagnosis names the origin module, op and cause the document gives, and
// a remedy with the option the document's fix uses. References: docs/scenarios.md's "Diagnosis" and
// "Fix" paragraphs per scenario; a healthy fp32 run has nothing to report; hand-built rows check the rules
// that no scenario reaches (non-finite input data).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>

#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "cli/run.h"

namespace ampscope::analysis {
namespace {

using samples::Precision;
using samples::TrainConfig;

// Each scenario runs once per test program; the trace is removed afterwards.
const Report& report_of(const std::string& scenario, Precision precision = Precision::fp16,
                        const std::string& sample = "") {
  static std::map<std::string, Report> cache;
  const std::string key = scenario + "/" + sample + "/" + std::string(samples::precision_name(precision));
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_analysis_" + std::to_string(::getpid()) + "_" + std::to_string(cache.size()) + ".h5");
  TrainConfig c;
  c.scenario = scenario;
  if (!sample.empty()) c.sample = sample;
  c.precision = precision;
  c.device = "cpu";
  c.out = path.string();
  if (scenario.empty()) c.steps = 4;
  samples::train(c);
  Report rep;
  {
    trace::TraceReader reader(path);
    rep = analyse(reader);
  }
  std::filesystem::remove(path);
  return cache.emplace(key, std::move(rep)).first->second;
}

bool mentions(const Diagnosis& d, const std::string& text) { return d.remedy.find(text) != std::string::npos; }

TEST(analysis_test, attention_overflow_is_an_f16_overflow_of_bmm_in_blocks_0_attn) {
  const Report& rep = report_of("attention-overflow");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.op, "bmm");
  EXPECT_EQ(d.module, "blocks.0.attn");
  EXPECT_EQ(d.cause, "f16_overflow");
  EXPECT_EQ(d.out_dtype, "f16");
  EXPECT_TRUE(d.loss_nonfinite);
  EXPECT_GT(d.downstream_nonfinite, 0);  // softmax's NaN and what follows
  EXPECT_EQ(d.skipped_steps, 6);         // 6 steps, every one skipped
  EXPECT_TRUE(mentions(d, "--autocast-fp32 'blocks.0.attn'")) << d.remedy;
  EXPECT_TRUE(mentions(d, "'blocks.*.attn'")) << d.remedy;
  EXPECT_EQ(d.occurrences, 6);
  EXPECT_EQ(rep.scaler.skipped, 6);
  EXPECT_EQ(rep.scaler.longest_skip_run, 6);
  EXPECT_EQ(rep.scaler.scale_start, 65536.0);
  EXPECT_EQ(rep.scaler.scale_end, 1024.0);  // halved six times
}

TEST(analysis_test, log_zero_is_a_log_of_zero_in_the_loss_outside_any_module) {
  const Report& rep = report_of("log-zero");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.op, "log");
  EXPECT_EQ(d.module, "");
  EXPECT_EQ(d.cause, "log_of_zero");
  EXPECT_TRUE(d.loss_nonfinite);
  EXPECT_TRUE(mentions(d, "log_softmax")) << d.remedy;
  bool min_zero = false;
  for (const std::string& e : d.evidence) min_zero |= e.find("min of log input = 0") != std::string::npos;
  EXPECT_TRUE(min_zero);
}

TEST(analysis_test, grad_underflow_is_a_gradient_underflow_without_a_scaler) {
  const Report& rep = report_of("grad-underflow");
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.op, "");
  EXPECT_EQ(d.module, "");
  EXPECT_EQ(d.cause, "gradient_underflow");
  EXPECT_EQ(d.occurrences, 20);  // every one of the 20 steps
  EXPECT_TRUE(mentions(d, "GradScaler")) << d.remedy;
  EXPECT_FALSE(rep.scaler.used);
  EXPECT_EQ(rep.scaler.skipped, 0);
}

TEST(analysis_test, scale_collapse_names_the_fc1_cast_overflow_first_then_the_collapse) {
  const Report& rep = report_of("scale-collapse");
  ASSERT_GE(rep.anomalies.size(), 2u);
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.op, "linear");
  EXPECT_EQ(d.module, "fc1");
  EXPECT_EQ(d.cause, "f16_overflow");
  EXPECT_EQ(d.occurrences, 20);
  EXPECT_TRUE(mentions(d, "standardise")) << d.remedy;
  EXPECT_TRUE(mentions(d, "--autocast-fp32 'fc1'")) << d.remedy;
  const Diagnosis& c = rep.anomalies.back();
  EXPECT_EQ(c.cause, "scale_collapse");
  // 65536 * 2^-k < 1 first after the 17th halving: step 16's update.
  EXPECT_EQ(c.step, 16);
  EXPECT_TRUE(mentions(c, "fc1")) << c.remedy;
  EXPECT_EQ(rep.scaler.skipped, 20);
  EXPECT_EQ(rep.scaler.longest_skip_run, 20);
  EXPECT_EQ(rep.scaler.scale_min, 65536.0 / std::ldexp(1.0, 20));
  EXPECT_EQ(rep.scaler.scale_end, 0.0625);
}

TEST(analysis_test, a_healthy_fp32_mlp_run_has_no_anomalies) {
  const Report& rep = report_of("", Precision::fp32, "mlp");
  EXPECT_TRUE(rep.healthy()) << rep.anomalies.front().cause << " at " << rep.anomalies.front().op;
  EXPECT_EQ(rep.scaler.skipped, 0);
  EXPECT_FALSE(rep.scaler.used);
}

TEST(analysis_test, a_healthy_fp16_mlp_run_has_no_anomalies_and_no_headroom_warnings) {
  // The scaled loss (65536 x loss, f32) and its gradient are large on purpose: not a warning.
  const Report& rep = report_of("", Precision::fp16, "mlp");
  EXPECT_TRUE(rep.healthy()) << rep.anomalies.front().cause << " at " << rep.anomalies.front().op;
  EXPECT_TRUE(rep.warnings.empty()) << rep.warnings.front().message;
  EXPECT_TRUE(rep.scaler.used);
  EXPECT_EQ(rep.scaler.verdict, "healthy");
}

TEST(analysis_test, nan_in_the_input_data_is_nonfinite_input_at_the_first_op) {
  std::vector<trace::StepRow> steps(1);
  steps[0].loss = NAN;
  steps[0].skipped = true;
  std::vector<trace::OpRow> ops(2);
  ops[0].seq = 0;
  ops[0].op = "linear";
  ops[0].module = "fc1";
  ops[0].out_dtype = "f16";
  ops[0].health.numel = 8;
  ops[0].health.nan = 2;
  ops[1] = ops[0];
  ops[1].seq = 1;
  ops[1].op = "relu";
  const Report rep = analyse(steps, ops, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].cause, "nonfinite_input");
  EXPECT_EQ(rep.anomalies[0].op, "linear");
  EXPECT_EQ(rep.anomalies[0].module, "fc1");
  EXPECT_EQ(rep.anomalies[0].downstream_nonfinite, 1);
  EXPECT_TRUE(rep.anomalies[0].loss_nonfinite);
}

TEST(analysis_test, masked_softmax_is_an_f16_overflow_on_the_cast_into_softmax_in_blocks_0_attn) {
  const Report& rep = report_of("masked-softmax");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 0);
  EXPECT_EQ(d.phase, trace::Phase::forward);
  EXPECT_EQ(d.op, "softmax");
  EXPECT_EQ(d.module, "blocks.0.attn");
  // docs/scenarios.md: the f32 input held -131008, which the cast to f16 made -inf.
  EXPECT_EQ(d.cause, "f16_overflow");
  bool cast = false;
  for (const std::string& e : d.evidence) cast |= e.find("overflowed on the cast to f16") != std::string::npos;
  EXPECT_TRUE(cast);
  EXPECT_TRUE(mentions(d, "--autocast-fp32 'blocks.0.attn'")) << d.remedy;
  EXPECT_GT(d.downstream_nonfinite, 0);
}

TEST(analysis_test, activation_overflow_is_an_f16_overflow_of_blocks_1_mlp_2_that_grew_over_three_steps) {
  const Report& rep = report_of("activation-overflow");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 3);
  EXPECT_EQ(d.op, "linear");
  EXPECT_EQ(d.module, "blocks.1.mlp.2");
  EXPECT_EQ(d.cause, "f16_overflow");
  // docs/scenarios.md: steps 0-2 are clean and the op's absmax grows toward 65504 over them.
  bool grew = false;
  for (const std::string& e : d.evidence) grew |= e.find("grew") != std::string::npos && e.find("(step 2)") != std::string::npos;
  EXPECT_TRUE(grew);
  EXPECT_TRUE(mentions(d, "--autocast-fp32 'blocks.1.mlp.2'")) << d.remedy;
  EXPECT_TRUE(mentions(d, "--lr")) << d.remedy;
  // The warning a trace gives before the overflow: within a factor 2 of 65504 at step 2 (about 47000).
  const HeadroomWarning* w = nullptr;
  for (const HeadroomWarning& x : rep.warnings)
    if (x.kind == "near_f16_max" && x.module == "blocks.1.mlp.2" && x.op == "linear" && w == nullptr) w = &x;
  ASSERT_NE(w, nullptr);
  EXPECT_LT(w->step, 3);
  EXPECT_GE(w->absmax * 2, kF16Max);
  EXPECT_LE(w->absmax, kF16Max);
}

TEST(analysis_test, lr_explosion_is_an_f16_overflow_of_fc3_at_step_1_whose_remedy_is_the_learning_rate) {
  const Report& rep = report_of("lr-explosion");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 1);
  EXPECT_EQ(d.op, "linear");
  EXPECT_EQ(d.module, "fc3");
  EXPECT_EQ(d.cause, "f16_overflow");
  // One step took the output past f16's range: the learning rate comes first, a tenth of the run's 1.5.
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "learning_rate") << d.remedy;
  EXPECT_DOUBLE_EQ(d.remedies.front().value, 0.15);
  EXPECT_EQ(d.remedies.front().flag, "--lr 0.15");
  EXPECT_EQ(d.remedy.rfind("lower the learning rate (this run: 1.5; try 0.15)", 0), 0u) << d.remedy;
}

// The scenario's planted cause is block 0's query and key weights, multiplied by 120 (docs/scenarios.md): the
// root walk goes from the bmm that overflowed to that linear, and its factor is the recorded absmax of its
// output over its input's (layer_norm ln1's).
TEST(analysis_test, attention_overflow_root_is_the_qkv_linear_whose_weights_were_grown) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_analysis_root_" + std::to_string(::getpid()) + ".h5");
  TrainConfig c;
  c.scenario = "attention-overflow";
  c.precision = Precision::fp16;
  c.device = "cpu";
  c.steps = 1;
  c.out = path.string();
  samples::train(c);
  Report rep;
  std::map<std::int64_t, trace::OpRow> rows;
  {
    trace::TraceReader reader(path);
    rep = analyse(reader);
    for (const trace::OpRow& r : reader.ops())
      if (r.step == 0 && r.phase == trace::Phase::forward) rows.emplace(r.seq, r);
  }
  std::filesystem::remove(path);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.op, "bmm");
  EXPECT_EQ(d.root_cause, "amplification");
  ASSERT_EQ(d.chain.size(), 2u);
  const ChainLink& root = d.chain.front();
  EXPECT_EQ(root.op, "linear");
  EXPECT_EQ(root.module, "blocks.0.attn.qkv");
  const trace::OpRow& qkv = rows.at(root.seq);
  ASSERT_GE(qkv.inputs[0], 0);
  const trace::OpRow& ln1 = rows.at(qkv.inputs[0]);
  EXPECT_EQ(ln1.op, "layer_norm");
  EXPECT_DOUBLE_EQ(root.factor, qkv.health.absmax / ln1.health.absmax);
  EXPECT_GT(root.factor, 8);
  // The f32 override stays the first remedy (an option: `ampscope fix` verifies it); the norm comes after bf16.
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().flag, "--autocast-fp32 'blocks.0.attn'");
  EXPECT_EQ(d.remedies.back().kind, "normalise");
}

TEST(analysis_test, lr_explosion_root_is_fc2_whose_gain_grew_in_one_step) {
  const Report& rep = report_of("lr-explosion");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.root_cause, "amplification");
  ASSERT_FALSE(d.chain.empty());
  EXPECT_EQ(d.chain.front().op, "linear");
  EXPECT_EQ(d.chain.front().module, "fc2");
  EXPECT_NE(d.chain.front().evidence.find("at step 0 and"), std::string::npos) << d.chain.front().evidence;
  EXPECT_NE(d.chain.front().evidence.find("grew as the run trained"), std::string::npos) << d.chain.front().evidence;
  // One learning-rate remedy, first (the origin's own growth words it).
  std::int64_t lr = 0;
  for (const Remedy& m : d.remedies) lr += m.kind == "learning_rate" ? 1 : 0;
  EXPECT_EQ(lr, 1);
  EXPECT_EQ(d.remedies.front().kind, "learning_rate");
}

TEST(analysis_test, no_zero_grad_is_accumulating_gradients_found_in_the_backward_of_fc3_at_step_5) {
  const Report& rep = report_of("no-zero-grad");
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.step, 5);
  EXPECT_EQ(d.phase, trace::Phase::backward);
  EXPECT_EQ(d.op, "linear");
  EXPECT_EQ(d.module, "fc3");
  EXPECT_EQ(d.cause, "accumulating_gradients");
  EXPECT_TRUE(mentions(d, "zero_grad")) << d.remedy;
  EXPECT_EQ(rep.scaler.verdict, "persistent");
  // The backward row's statistics are of its first output; the inf was in another (a weight's gradient).
  EXPECT_NE(d.evidence.front().find("non-finite values in an output of the backward of linear in fc3"),
            std::string::npos)
      << d.evidence.front();
}

TEST(analysis_test, every_scenario_cause_is_one_of_the_documented_causes) {
  for (const char* name : {"attention-overflow", "masked-softmax", "activation-overflow", "log-zero", "lr-explosion",
                           "grad-underflow", "scale-collapse", "no-zero-grad"}) {
    for (const Diagnosis& d : report_of(name).anomalies) {
      bool known = false;
      for (const char* c : kCauses) known |= d.cause == c;
      EXPECT_TRUE(known) << name << ": " << d.cause;
      EXPECT_FALSE(d.remedy.empty()) << name << ": " << d.cause;
      EXPECT_FALSE(d.evidence.empty()) << name << ": " << d.cause;
    }
  }
}

}  // namespace
}  // namespace ampscope::analysis
