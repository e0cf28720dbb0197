// The rules of probes/analysis/analysis.h that no training scenario reaches, on hand-built rows whose expected
// diagnosis follows from the rule text: an anomaly only in backward, a truncated trace (writer killed),
// the scaler verdicts on hand-made scale trajectories (PyTorch's update rule: halve on a skip, double after
// growth_interval clean steps), the headroom warnings with fractions computed by hand, and the streaming
// reader path against the in-memory one.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"

namespace ampscope::analysis {
namespace {

using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

OpRow op_row(std::int64_t step, std::int64_t seq, std::string op, std::string module, std::string dtype = "f16") {
  OpRow r;
  r.step = step;
  r.seq = seq;
  r.op = std::move(op);
  r.module = std::move(module);
  r.in_dtypes = dtype + "," + dtype;
  r.out_dtype = std::move(dtype);
  r.shape = "[4, 4]";
  r.health.numel = 16;
  r.health.absmax = 1.5;
  r.health.min = -1.5;
  r.health.max = 1.5;
  return r;
}

StepRow step_row(std::int64_t step, double scale, double scale_after, bool skipped) {
  StepRow s;
  s.step = step;
  s.loss = skipped ? NAN : 1.0;
  s.scale = scale;
  s.scale_after = scale_after;
  s.found_inf = skipped;
  s.skipped = skipped;
  s.lr = 1e-3;
  return s;
}

// PyTorch's update rule over a pattern of skips: halve on a skip, double after `interval` clean steps.
std::vector<StepRow> trajectory(double start, const std::vector<bool>& skips, std::int64_t interval = 2000) {
  std::vector<StepRow> out;
  double scale = start;
  std::int64_t tracker = 0;
  for (std::size_t i = 0; i < skips.size(); ++i) {
    double after = scale;
    if (skips[i]) {
      after = scale * 0.5;
      tracker = 0;
    } else if (++tracker == interval) {
      after = scale * 2;
      tracker = 0;
    }
    out.push_back(step_row(static_cast<std::int64_t>(i), scale, after, skips[i]));
    scale = after;
  }
  return out;
}

// The rows of a step whose forward pass is finite and whose backward overflowed (relu's backward, seq 2),
// then a clean step at the backed-off scale: what the GradScaler calibrating from too high a scale looks
// like.
struct BackwardOnly {
  std::vector<OpRow> ops;
  std::vector<GradRow> grads;
  BackwardOnly() {
    ops = {op_row(0, 0, "linear", "fc1"), op_row(0, 1, "relu", "fc1"), op_row(0, 2, "relu", "fc1"),
           op_row(0, 3, "linear", "fc1"), op_row(1, 0, "linear", "fc1"), op_row(1, 1, "relu", "fc1")};
    ops[2].phase = ops[3].phase = Phase::backward;
    ops[2].health.pos_inf = 3;
    ops[2].origin = true;
    ops[3].health.pos_inf = 3;  // propagated to the next backward node
    grads.resize(1);
    grads[0].param = "fc1.weight";
    grads[0].pos_inf = 2;
  }
};

TEST(analysis_rules_test, a_backward_overflow_that_the_backoff_cures_is_calibration_not_an_anomaly) {
  // Skipped at 65536, clean at 32768 and no clean step at 65536 or above before: the scale was too high.
  std::vector<StepRow> steps = {step_row(0, 65536, 32768, true), step_row(1, 32768, 32768, false)};
  steps[0].loss = 2.0;  // the forward was finite: only the backward overflowed
  const BackwardOnly b;
  const Report rep = analyse(steps, b.ops, b.grads);
  EXPECT_TRUE(rep.anomalies.empty());
  EXPECT_EQ(rep.scaler.calibration_skips, 1);
  EXPECT_EQ(rep.scaler.last_calibration_step, 0);
}

TEST(analysis_rules_test, a_run_of_overflows_at_scales_that_were_fine_before_stays_an_anomaly) {
  // Step 0 ran clean at 65536; steps 1 and 2 overflowed at 65536 and 32768: the gradients grew, twice in a
  // row. Not the scaler's calibration, and the learning rate is the first remedy.
  std::vector<StepRow> steps = {step_row(0, 65536, 65536, false), step_row(1, 65536, 32768, true),
                                step_row(2, 32768, 16384, true), step_row(3, 16384, 16384, false)};
  steps[1].loss = 2.0;
  BackwardOnly b;
  for (OpRow& o : b.ops) o.step += 1;
  const Report rep = analyse(steps, b.ops, b.grads);
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].cause, "gradient_overflow");
  EXPECT_EQ(rep.anomalies[0].step, 1);
  ASSERT_FALSE(rep.anomalies[0].remedies.empty());
  EXPECT_EQ(rep.anomalies[0].remedies.front().kind, "learning_rate");
  EXPECT_EQ(rep.scaler.calibration_skips, 0);
}

TEST(analysis_rules_test, an_isolated_overflow_at_a_fine_scale_in_a_healthy_run_is_the_scaler_at_work) {
  // One skip between clean steps (the same scale ran clean before, the next step ran clean after the
  // back-off): gradients drift over a long run and the GradScaler follows; not an anomaly.
  std::vector<StepRow> steps = {step_row(0, 65536, 65536, false), step_row(1, 65536, 32768, true),
                                step_row(2, 32768, 32768, false)};
  steps[1].loss = 2.0;
  BackwardOnly b;
  for (OpRow& o : b.ops) o.step += 1;
  const Report rep = analyse(steps, b.ops, b.grads);
  EXPECT_TRUE(rep.anomalies.empty());
  EXPECT_EQ(rep.scaler.calibration_skips, 1);
}

TEST(analysis_rules_test, an_anomaly_only_in_backward_is_a_gradient_overflow_of_that_node) {
  // Skipped twice: backing off did not cure it within the run, so it is not calibration.
  std::vector<StepRow> steps = {step_row(0, 65536, 32768, true), step_row(1, 32768, 16384, true)};
  steps[0].loss = 2.0;  // the forward was finite: only the backward overflowed
  std::vector<OpRow> ops = {op_row(0, 0, "linear", "fc1"), op_row(0, 1, "relu", "fc1"),
                            op_row(0, 2, "relu", "fc1"), op_row(0, 3, "linear", "fc1"),
                            op_row(1, 0, "linear", "fc1"), op_row(1, 1, "relu", "fc1")};
  ops[2].phase = ops[3].phase = Phase::backward;
  ops[2].health.pos_inf = 3;
  ops[2].origin = true;
  ops[3].health.pos_inf = 3;  // propagated to the next backward node
  std::vector<GradRow> grads(1);
  grads[0].param = "fc1.weight";
  grads[0].pos_inf = 2;
  const Report rep = analyse(steps, ops, grads);
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies[0];
  EXPECT_EQ(d.phase, Phase::backward);
  EXPECT_EQ(d.op, "relu");
  EXPECT_EQ(d.cause, "gradient_overflow");
  EXPECT_EQ(d.downstream_nonfinite, 1);
  EXPECT_FALSE(d.loss_nonfinite);
  EXPECT_EQ(d.gradients, std::vector<std::string>{"fc1.weight"});
  EXPECT_EQ(d.skipped_steps, 2);
  EXPECT_NE(d.remedy.find("--init-scale"), std::string::npos) << d.remedy;
  EXPECT_EQ(rep.scaler.skipped, 2);
  EXPECT_EQ(rep.scaler.backoffs, 2);
  EXPECT_EQ(rep.scaler.calibration_skips, 0);
}

TEST(analysis_rules_test, cause_rules_pick_exp_division_and_invalid_operation) {
  std::vector<OpRow> ops = {op_row(0, 0, "exp", "head", "f32"), op_row(0, 1, "div", "head", "f32"),
                            op_row(0, 2, "sub", "head", "f32"), op_row(0, 3, "mul", "head", "f32")};
  ops[0].health.pos_inf = 1;
  ops[1].health.neg_inf = 1;
  ops[2].health.nan = 1;   // NaN only: inf - inf
  ops[3].health.pos_inf = 1;  // inf in an f32 output that is neither exp nor div: no rule knows it
  for (OpRow& r : ops) r.origin = true;
  const Report rep = analyse({step_row(0, 1, 1, false)}, ops, {});
  ASSERT_EQ(rep.anomalies.size(), 4u);
  EXPECT_EQ(rep.anomalies[0].cause, "exp_overflow");
  EXPECT_EQ(rep.anomalies[1].cause, "division_by_zero");
  EXPECT_EQ(rep.anomalies[2].cause, "invalid_operation");
  EXPECT_EQ(rep.anomalies[3].cause, "unknown");
}

// The "subtract the max" remedy quotes the limit of the dtype the exp ran in: ln of its largest finite value, by
// hand ln(65504) = 11.0898 (f16), ln((2 - 2^-7) * 2^127) = 88.7189 (bf16), ln((2 - 2^-23) * 2^127) = 88.7228
// (f32). Keeping the exp in f32 is offered only for an f16 exp: bf16 has f32's range, so f32 overflows there too.
TEST(analysis_rules_test, the_exp_remedy_quotes_the_limit_of_the_exps_own_dtype) {
  for (const auto& [dtype, words] : std::vector<std::pair<std::string, std::string>>{
           {"f16", "exp of a value above 11.09 overflows f16"},
           {"bf16", "exp of a value above 88.72 overflows bf16"},
           {"f32", "exp of a value above 88.72 overflows f32"}}) {
    OpRow exp_row = op_row(0, 0, "exp", "head", dtype);
    exp_row.health.pos_inf = 1;
    exp_row.origin = true;
    const Report rep = analyse({step_row(0, 1, 1, false)}, {exp_row}, {});
    ASSERT_EQ(rep.anomalies.size(), 1u) << dtype;
    const Diagnosis& d = rep.anomalies[0];
    EXPECT_EQ(d.cause, "exp_overflow") << dtype;
    ASSERT_FALSE(d.remedies.empty()) << dtype;
    const auto stable = std::find_if(d.remedies.begin(), d.remedies.end(),
                                     [](const Remedy& m) { return m.kind == "stable_formulation"; });
    ASSERT_NE(stable, d.remedies.end()) << dtype;
    EXPECT_NE(stable->text.find(words), std::string::npos) << stable->text;
    const bool f32_remedy = std::any_of(d.remedies.begin(), d.remedies.end(), [](const Remedy& m) {
      return m.kind == "autocast_fp32" || m.kind == "cast_f32";
    });
    EXPECT_EQ(f32_remedy, dtype == "f16") << dtype << ": " << d.remedy;
    EXPECT_EQ(d.remedy.find("overflows f16") != std::string::npos, dtype == "f16") << d.remedy;
  }
}

// The learning-rate remedy of a gradient overflow no back-off cured says what the steps before show. All skipped
// (as an f16 model at GradScaler's 2^16 whose gradients overflow at every scale tried): no update was applied, the
// weights are the initial ones, nothing grew. One step applied at a smaller scale before: the weights changed, at
// smaller scales only (the gradients grew is not shown either).
TEST(analysis_rules_test, the_learning_rate_remedy_of_an_uncured_overflow_is_worded_from_the_steps_before_it) {
  const auto lr_text = [](const Report& rep) {
    EXPECT_EQ(rep.anomalies.size(), 1u);
    if (rep.anomalies.empty()) return std::string();
    for (const Remedy& m : rep.anomalies[0].remedies)
      if (m.kind == "learning_rate") return m.text;
    std::string kinds = rep.anomalies[0].cause + ":";
    for (const Remedy& m : rep.anomalies[0].remedies) kinds += " " + m.kind;
    return "(no learning_rate remedy: " + kinds + ")";
  };
  {
    std::vector<StepRow> steps = trajectory(65536, {true, true, true});
    for (StepRow& st : steps) st.loss = 2.0;  // finite forward passes: only the scaled gradients overflowed
    const BackwardOnly b;
    const Report rep = analyse(steps, b.ops, b.grads);
    const std::string text = lr_text(rep);
    EXPECT_EQ(text, "lower the learning rate (this run: 0.001; try 0.0001) or add warm-up: no update was applied "
                    "before step 0 (the first step recorded), so its weights are the ones the run started with and a "
                    "smaller learning rate changes nothing up to there; it matters once steps run, if the gradients "
                    "then grow");
    EXPECT_EQ(text.find("grew"), std::string::npos);
  }
  {
    // Step 0 ran clean at 16384 and the scale grew (growth interval 1) to 32768; step 1 overflowed there and at
    // every smaller scale after it: one update applied before, at a smaller scale than step 1's.
    std::vector<StepRow> steps = {step_row(0, 16384, 32768, false), step_row(1, 32768, 16384, true),
                                  step_row(2, 16384, 8192, true), step_row(3, 8192, 4096, true)};
    for (StepRow& st : steps) st.loss = 2.0;
    BackwardOnly b;
    for (OpRow& o : b.ops) o.step += 1;
    const Report rep = analyse(steps, b.ops, b.grads);
    EXPECT_EQ(lr_text(rep), "lower the learning rate (this run: 0.001; try 0.0001) or add warm-up: 1 earlier step "
                            "applied updates, at smaller scales only; gradients that grow with the weights overflow f16 "
                            "when scaled");
  }
}

TEST(analysis_rules_test, recurrences_are_grouped_with_a_count_and_the_last_step) {
  std::vector<OpRow> ops;
  std::vector<StepRow> steps;
  for (int s = 0; s < 5; ++s) {
    steps.push_back(step_row(s, 1024, 512, true));
    OpRow r = op_row(s, 0, "bmm", "attn");
    r.health.pos_inf = 2;
    r.origin = true;
    ops.push_back(r);
  }
  const Report rep = analyse(steps, ops, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].occurrences, 5);
  EXPECT_EQ(rep.anomalies[0].step, 0);
  EXPECT_EQ(rep.anomalies[0].last_step, 4);
}

TEST(analysis_rules_test, a_truncated_trace_is_analysed_up_to_its_last_flushed_rows_and_marked_incomplete) {
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_truncated_" + std::to_string(::getpid()) + ".h5");
  {
    trace::RunInfo info;
    info.precision = "fp16";
    info.device = "cpu";
    info.model = "hand";
    trace::TraceWriter w(path, info);
    for (int s = 0; s < 3; ++s) {
      w.write(op_row(s, 0, "linear", "fc1"));
      OpRow r = op_row(s, 1, "linear", "fc2");
      if (s == 2) {
        r.health.pos_inf = 4;
        r.origin = true;
      }
      w.write(r);
      w.write(step_row(s, 65536, s == 2 ? 32768 : 65536, s == 2));
      w.end_step(s);
    }
    w.write(op_row(3, 0, "linear", "fc1"));  // step 3 never ends: no step row
    // No close(): the destructor leaves complete = 0, as a killed or failed run does.
  }
  Report rep;
  {
    trace::TraceReader reader(path);
    rep = analyse(reader);
  }
  std::filesystem::remove(path);
  EXPECT_FALSE(rep.complete);
  EXPECT_EQ(rep.run.model, "hand");
  EXPECT_EQ(rep.scaler.steps, 3);
  EXPECT_EQ(rep.steps, 4);  // three step rows and the unfinished step's ops
  EXPECT_EQ(rep.op_rows, 7);
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].step, 2);
  EXPECT_EQ(rep.anomalies[0].module, "fc2");
  EXPECT_EQ(rep.anomalies[0].cause, "f16_overflow");
}

TEST(analysis_rules_test, streaming_in_small_blocks_gives_the_same_report_as_rows_in_memory) {
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_blocks_" + std::to_string(::getpid()) + ".h5");
  std::vector<StepRow> steps;
  std::vector<OpRow> ops;
  trace::RunInfo info;
  info.precision = "fp16";
  {
    trace::TraceWriter w(path, info);
    double absmax = 4000;
    for (int s = 0; s < 12; ++s, absmax *= 1.6) {
      for (int k = 0; k < 3; ++k) {
        OpRow r = op_row(s, k, k == 1 ? "gelu" : "linear", fmt::format("mlp.{}", k));
        if (k == 2) r.health.absmax = absmax;
        if (k == 2 && absmax > kF16Max) {
          r.health.pos_inf = 1;
          r.origin = true;
        }
        ops.push_back(r);
        w.write(r);
      }
      steps.push_back(step_row(s, 65536, 65536, absmax > kF16Max));
      w.write(steps.back());
      w.end_step(s);
    }
    w.close();
  }
  Report streamed;
  std::vector<std::int64_t> progress;
  {
    trace::TraceReader reader(path);
    streamed = analyse(reader, AnalysisOptions{.rows_per_read = 5},
                       [&](std::int64_t done, std::int64_t total) { progress.push_back(done * 100 + total); });
  }
  std::filesystem::remove(path);
  Report memory = analyse(steps, ops, {}, {}, {});
  memory.run = streamed.run;
  ASSERT_EQ(streamed.anomalies.size(), memory.anomalies.size());
  ASSERT_EQ(streamed.anomalies.size(), 1u);
  EXPECT_EQ(streamed.anomalies[0].step, memory.anomalies[0].step);
  EXPECT_EQ(streamed.anomalies[0].evidence, memory.anomalies[0].evidence);
  EXPECT_EQ(streamed.anomalies[0].remedy, memory.anomalies[0].remedy);
  EXPECT_EQ(streamed.anomalies[0].occurrences, memory.anomalies[0].occurrences);
  ASSERT_EQ(streamed.warnings.size(), memory.warnings.size());
  // 5 rows per read at 3 rows per step: one step per block, 12 blocks; the last reports every row.
  ASSERT_EQ(progress.size(), 12u);
  EXPECT_EQ(progress.back(), 36 * 100 + 36);
  // absmax 4000 * 1.6^k: first within a factor 2 of 65504 at step 5 (41943; step 4 has 26214), beyond it
  // at step 6 (67109).
  ASSERT_EQ(streamed.anomalies[0].step, 6);
  ASSERT_FALSE(streamed.warnings.empty());
  EXPECT_EQ(streamed.warnings[0].kind, "near_f16_max");
  EXPECT_EQ(streamed.warnings[0].step, 5);
  EXPECT_EQ(streamed.warnings[0].occurrences, 1);
  EXPECT_DOUBLE_EQ(streamed.warnings[0].absmax, 4000 * std::pow(1.6, 5));
}

TEST(analysis_rules_test, subnormal_and_flush_to_zero_warnings_quote_the_fraction) {
  std::vector<OpRow> ops = {op_row(0, 0, "mul", "head"), op_row(0, 1, "to", "head")};
  ops[0].health.numel = 1000;
  ops[0].health.subnormal = 300;  // 30% >= 25%
  ops[1].health.numel = 1000;
  ops[1].cast_underflow = 240;    // 24% < 25%: no warning at the default
  Report rep = analyse({step_row(0, 1, 1, false)}, ops, {});
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_EQ(rep.warnings[0].kind, "subnormal");
  EXPECT_DOUBLE_EQ(rep.warnings[0].fraction, 0.3);
  EXPECT_NE(rep.warnings[0].message.find("300 of 1000 values (30.0%)"), std::string::npos) << rep.warnings[0].message;
  rep = analyse({step_row(0, 1, 1, false)}, ops, {}, {}, {}, AnalysisOptions{.underflow_fraction = 0.2});
  ASSERT_EQ(rep.warnings.size(), 2u);
  EXPECT_EQ(rep.warnings[1].kind, "flush_to_zero");
  EXPECT_DOUBLE_EQ(rep.warnings[1].fraction, 0.24);
  EXPECT_TRUE(rep.healthy());  // warnings are not anomalies
}

TEST(analysis_rules_test, gradients_below_f16s_smallest_subnormal_in_a_histogram_warn_in_an_fp16_run) {
  trace::HistogramRow h;
  h.step = 0;
  h.seq = -1;
  h.tensor = "fc1.weight";
  h.bins[static_cast<std::size_t>(-30 - trace::kHistMinExponent)] = 60;  // 2^-30: below 2^-24
  h.bins[static_cast<std::size_t>(-20 - trace::kHistMinExponent)] = 40;  // 2^-20: an f16 subnormal, kept
  h.bins[trace::kHistBins - 3] = 500;                                     // zeros do not count
  Analyser a;
  trace::RunInfo run;
  run.precision = "fp16";
  a.set_run(run);
  const StepRow s = step_row(0, 65536, 65536, false);
  a.add_step(0, &s, {}, {}, {}, std::span<const trace::HistogramRow>(&h, 1));
  const Report rep = a.finish();
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_EQ(rep.warnings[0].kind, "below_f16");
  EXPECT_EQ(rep.warnings[0].tensor, "fc1.weight");
  EXPECT_DOUBLE_EQ(rep.warnings[0].fraction, 0.6);
}

TEST(analysis_rules_test, a_trace_without_any_step_is_healthy_rather_than_a_crash) {
  // The block size divided by the op rows per step, 0 here (a division by zero before the fix).
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_no_steps_" + std::to_string(::getpid()) + ".h5");
  {
    trace::RunInfo info;
    info.precision = "fp16";
    info.model = "hand";
    trace::TraceWriter w(path, info);
    w.close();
  }
  Report rep;
  {
    trace::TraceReader reader(path);
    rep = analyse(reader);
  }
  std::filesystem::remove(path);
  EXPECT_TRUE(rep.healthy());
  EXPECT_EQ(rep.steps, 0);
  EXPECT_EQ(rep.op_rows, 0);
  EXPECT_EQ(rep.scaler.verdict, "no_scaler");
}

TEST(analysis_rules_test, steps_after_an_applied_nonfinite_step_are_evidence_of_its_origin_not_nonfinite_input) {
  // No scaler: step 0's log makes -inf, its gradients are NaN and the step is applied (not skipped), so the
  // weights are NaN: steps 1 and 2 are NaN from their first op with finite data. The data are not the cause.
  std::vector<StepRow> steps = {step_row(0, 1, 1, false), step_row(1, 1, 1, false), step_row(2, 1, 1, false)};
  for (StepRow& s : steps) s.loss = NAN;
  steps[0].grad_norm = NAN;
  std::vector<OpRow> ops = {op_row(0, 0, "linear", "fc1"), op_row(0, 1, "log", "", "f32")};
  ops[1].health.neg_inf = 3;
  ops[1].origin = true;
  for (std::int64_t s = 1; s < 3; ++s) {
    OpRow r = op_row(s, 0, "linear", "fc1");
    r.health.nan = 16;
    ops.push_back(r);
  }
  std::vector<GradRow> grads(1);
  grads[0].param = "fc1.weight";
  grads[0].nan = 4;
  const Report rep = analyse(steps, ops, grads);
  ASSERT_EQ(rep.anomalies.size(), 1u) << rep.anomalies.back().cause;
  const Diagnosis& d = rep.anomalies[0];
  EXPECT_EQ(d.cause, "log_of_zero");
  bool applied = false;
  for (const std::string& e : d.evidence)
    applied |= e.find("step 0 was not skipped (the scale is 1: no GradScaler to skip it)") != std::string::npos &&
               e.find("2 later steps (1 to 2) turned non-finite from their first op (linear in fc1)") != std::string::npos;
  EXPECT_TRUE(applied) << fmt::format("{}", fmt::join(d.evidence, "\n"));
  EXPECT_NE(d.remedy.find("never apply a step whose gradients are non-finite"), std::string::npos) << d.remedy;
}

TEST(analysis_rules_test, nonfinite_data_in_a_later_step_of_a_skipping_run_is_still_nonfinite_input) {
  // The same shape with a scaler that skipped step 0: the weights stayed finite, so step 1's NaN is the data's.
  std::vector<StepRow> steps = {step_row(0, 1024, 512, true), step_row(1, 512, 256, true)};
  std::vector<OpRow> ops = {op_row(0, 0, "exp", "head", "f32"), op_row(1, 0, "linear", "fc1")};
  ops[0].health.pos_inf = 1;
  ops[0].origin = true;
  ops[1].health.nan = 16;
  std::vector<GradRow> grads(1);
  grads[0].param = "fc1.weight";
  grads[0].nan = 4;
  const Report rep = analyse(steps, ops, grads);
  ASSERT_EQ(rep.anomalies.size(), 2u);
  EXPECT_EQ(rep.anomalies[1].cause, "nonfinite_input");
  EXPECT_EQ(rep.anomalies[1].step, 1);
}

TEST(analysis_rules_test, scale_collapse_counts_the_skips_from_its_own_step_and_its_non_finite_loss) {
  // Scale 4 halved at each of 6 skipped steps (loss NaN): below 1 first at step 2 (1 -> 0.5); steps 2..5 skip.
  std::vector<StepRow> steps = trajectory(4, std::vector<bool>(6, true));
  std::vector<OpRow> ops;
  for (std::int64_t s = 0; s < 6; ++s) {
    OpRow r = op_row(s, 0, "linear", "fc1");
    r.health.pos_inf = 2;
    r.origin = true;
    ops.push_back(r);
  }
  const Report rep = analyse(steps, ops, {});
  const Diagnosis* collapse = nullptr;
  for (const Diagnosis& d : rep.anomalies)
    if (d.cause == "scale_collapse") collapse = &d;
  ASSERT_NE(collapse, nullptr);
  EXPECT_EQ(collapse->step, 2);
  EXPECT_EQ(collapse->skipped_steps, 4);
  EXPECT_TRUE(collapse->loss_nonfinite);
}

TEST(analysis_rules_test, a_cast_overflow_does_not_quote_the_finite_absmax_as_if_the_op_had_passed_65504) {
  // fc1's f32 input overflowed in the cast to f16; the op's finite outputs are small (7892), so "beyond f16
  // max became inf" about them would be false: the inf came in through the input.
  OpRow r = op_row(0, 0, "linear", "fc1");
  r.autocast = "linear is on the lower_precision_fp list: runs in f16";
  r.health.pos_inf = 5;
  r.health.absmax = 7892;
  r.cast_overflow = 2;
  r.origin = true;
  const Report rep = analyse({step_row(0, 65536, 32768, true)}, {r}, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies[0];
  EXPECT_EQ(d.cause, "f16_overflow");
  for (const std::string& e : d.evidence) EXPECT_EQ(e.find("output absmax of the finite values"), std::string::npos) << e;
  // The inf came in through the cast: rescaling what feeds the op is among the remedies, with keeping the op
  // in f32 (the cast is what overflows) first.
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "autocast_fp32");
  EXPECT_EQ(d.remedies.front().pattern, "fc1");
  bool rescale = false;
  for (const Remedy& m : d.remedies) rescale |= m.kind == "rescale_input" && m.text.rfind("rescale what feeds linear in fc1", 0) == 0;
  EXPECT_TRUE(rescale) << d.remedy;
}

TEST(analysis_rules_test, steps_out_of_order_are_refused) {
  Analyser a;
  a.add_step(3, nullptr, {}, {});
  EXPECT_THROW_MSG(a.add_step(2, nullptr, {}, {}), std::invalid_argument, "step 2 after step 3");
}

TEST(analysis_rules_test, scaler_verdicts_follow_the_skip_pattern) {
  // No scaler: the scale is 1 throughout.
  EXPECT_EQ(analyse(trajectory(1, std::vector<bool>(50, false)), {}, {}).scaler.verdict, "no_scaler");
  // A too-high initial scale: 5 skips at the start, then 95 clean steps.
  std::vector<bool> settle(100, false);
  for (int i = 0; i < 5; ++i) settle[static_cast<std::size_t>(i)] = true;
  ScalerHealth h = analyse(trajectory(65536, settle), {}, {}).scaler;
  EXPECT_EQ(h.verdict, "settled");
  EXPECT_EQ(h.skipped, 5);
  EXPECT_EQ(h.first_skip, 0);
  EXPECT_EQ(h.last_skip, 4);
  EXPECT_EQ(h.scale_end, 2048);
  EXPECT_DOUBLE_EQ(h.skip_rate, 0.05);
  // A skip every 10th step after the window: 10% > 5% of the late steps.
  std::vector<bool> persistent(100, false);
  for (std::size_t i = 0; i < 100; i += 10) persistent[i] = true;
  EXPECT_EQ(analyse(trajectory(65536, persistent), {}, {}).scaler.verdict, "persistent");
  // Two skips in 100 steps, spread out: occasional, healthy.
  std::vector<bool> rare(100, false);
  rare[40] = rare[80] = true;
  EXPECT_EQ(analyse(trajectory(65536, rare), {}, {}).scaler.verdict, "healthy");
  // Growth interval 30 in the config; a skip every 25 steps keeps resetting the tracker: never grows.
  std::vector<bool> resets(100, false);
  for (std::size_t i = 24; i < 100; i += 25) resets[i] = true;
  std::vector<StepRow> rows = trajectory(65536, resets, 30);
  Analyser a;
  trace::RunInfo run;
  run.config = R"({"sample": "mlp", "growth_interval": 30, "use_scaler": true})";
  a.set_run(run);
  for (const StepRow& s : rows) a.add_step(s.step, &s, {}, {});
  h = a.finish().scaler;
  EXPECT_EQ(h.growths, 0);
  EXPECT_EQ(h.verdict, "never_grows");
  EXPECT_NE(h.message.find("growth interval 30"), std::string::npos) << h.message;
  // The same pattern with clean runs of 30 grows: healthy.
  std::vector<bool> grows(100, false);
  grows[45] = true;
  EXPECT_EQ(analyse(trajectory(65536, grows, 30), {}, {}).scaler.growths, 2);  // after steps 29 and 75
  // Collapse: halving every step below 1.
  const ScalerHealth c = analyse(trajectory(4, std::vector<bool>(6, true)), {}, {}).scaler;
  EXPECT_EQ(c.verdict, "collapsed");
  EXPECT_EQ(c.scale_min, 4.0 / 64);
}

// Provenance rules on hand-built rows (inputs written down): what the dataflow lets the report say.

TEST(analysis_rules_test, a_loss_that_picks_finite_entries_is_not_silent_damage) {
  // log's output holds -inf in a column nll_loss does not pick; nll_loss's finite value is exactly right.
  OpRow log_row = op_row(0, 0, "log", "", "f32");
  log_row.health.neg_inf = 3;
  log_row.origin = true;
  log_row.inputs = {trace::kInputData, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  OpRow nll = op_row(0, 1, "nll_loss", "", "f32");
  nll.inputs = {0, trace::kInputData, trace::kInputNone, trace::kInputNone};
  OpRow after = op_row(0, 2, "mul", "", "f32");  // the loss times a weight: downstream of nll_loss
  after.inputs = {1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  const Report rep = analyse({step_row(0, 1, 1, false)}, {log_row, nll, after}, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_TRUE(rep.anomalies[0].absorbed_by.empty());
  EXPECT_EQ(rep.anomalies[0].silently_wrong, 0);
}

TEST(analysis_rules_test, rsqrt_of_inf_is_silent_damage_and_its_consumers_are_counted) {
  // seq 0 mul overflows (+inf), seq 1 mean passes it on, seq 2 rsqrt gives 0 (finite), seq 3 mul and
  // seq 4 linear compute from that 0: 2 ops silently wrong after the absorbing one.
  std::vector<OpRow> rows;
  const char* ops[] = {"mul", "mean", "rsqrt", "mul", "linear"};
  for (std::int64_t i = 0; i < 5; ++i) {
    OpRow r = op_row(0, i, ops[i], "blocks.1.norm");
    r.inputs = {i == 0 ? trace::kInputData : i - 1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
    rows.push_back(r);
  }
  rows[0].health.pos_inf = 4;
  rows[0].origin = true;
  rows[1].health.pos_inf = 1;
  rows[2].health.zero = 16;
  rows[2].health.absmax = 0;
  const Report rep = analyse({step_row(0, 1024, 1024, false)}, rows, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies[0];
  ASSERT_EQ(d.absorbed_by.size(), 1u);
  EXPECT_NE(d.absorbed_by[0].find("rsqrt"), std::string::npos);
  EXPECT_EQ(d.silently_wrong, 2);
}

TEST(analysis_rules_test, non_finite_data_prepared_before_the_step_is_data_not_a_hidden_origin) {
  OpRow r = op_row(0, 0, "linear", "fc1");
  r.health.nan = 2;
  r.inputs = {trace::kInputOtherStep, trace::kInputParameter, trace::kInputNone, trace::kInputNone};
  const Report rep = analyse({step_row(0, 1, 1, false)}, {r}, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].cause, "nonfinite_input");
  ASSERT_FALSE(rep.anomalies[0].remedies.empty());
  EXPECT_EQ(rep.anomalies[0].remedies.front().kind, "clean_data");
}

TEST(analysis_rules_test, non_finite_input_from_a_filtered_op_is_a_hidden_origin) {
  OpRow r = op_row(0, 3, "linear", "head");
  r.health.nan = 2;
  r.inputs = {trace::kInputUnrecorded, trace::kInputParameter, trace::kInputNone, trace::kInputNone};
  const Report rep = analyse({step_row(0, 1, 1, false)}, {r}, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  ASSERT_FALSE(rep.anomalies[0].remedies.empty());
  EXPECT_EQ(rep.anomalies[0].remedies.front().kind, "record_every_op");
}

// ---- amplification: the op upstream of an overflow that made the values that large ----

// linear (from the data) -> div by a scalar temperature -> exp, the last two after the autocast region (no
// autocast reason): exp overflows f16. Hand-worked: the division made |x| 58.2 / 0.58 = 100.3 times larger (a
// temperature of about 0.01); exp takes at most ln(65504) = 11.09 in f16, so within half of it (5.545) the
// divisor must be at least 0.58 / 5.545 = 0.1046: 0.11 rounded up to two digits.
std::vector<OpRow> temperature_rows() {
  OpRow enc = op_row(0, 0, "linear", "encoder");
  enc.shape = "[8, 8]";
  enc.health.numel = 64;
  enc.health.absmax = 0.58;
  enc.inputs = {trace::kInputData, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
  enc.autocast = "linear is on the lower_precision_fp list: runs in f16";
  OpRow div = op_row(0, 1, "div", "loss");
  div.shape = "[8, 8]";
  div.health.numel = 64;
  div.health.absmax = 58.2;
  div.inputs = {0, trace::kInputNone, trace::kInputNone, trace::kInputNone};  // div(x, 0.01): a scalar
  OpRow exp_row = op_row(0, 2, "exp", "loss");
  exp_row.shape = "[8, 8]";
  exp_row.health.numel = 64;
  exp_row.health.pos_inf = 3;
  exp_row.health.absmax = 60000;
  exp_row.origin = true;
  exp_row.inputs = {1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  return {enc, div, exp_row};
}

TEST(analysis_rules_test, a_division_by_a_small_temperature_before_exp_is_the_amplification_root) {
  const Report rep = analyse({step_row(0, 1024, 512, true)}, temperature_rows(), {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies[0];
  EXPECT_EQ(d.cause, "exp_overflow");
  EXPECT_EQ(d.root_cause, "amplification");
  ASSERT_EQ(d.chain.size(), 2u);
  EXPECT_EQ(d.chain[0].op, "div");
  EXPECT_EQ(d.chain[0].role, "amplification");
  EXPECT_DOUBLE_EQ(d.chain[0].factor, 58.2 / 0.58);
  EXPECT_EQ(d.chain[1].op, "exp");
  EXPECT_EQ(d.chain[1].role, "origin");
  EXPECT_NE(d.chain[0].evidence.find("a division by a constant, about 0.01, made |x| 100x larger: absmax 0.58 -> 58.2"),
            std::string::npos)
      << d.chain[0].evidence;
  ASSERT_GE(d.remedies.size(), 2u);
  EXPECT_EQ(d.remedies[0].kind, "temperature");
  EXPECT_DOUBLE_EQ(d.remedies[0].value, 0.11);
  EXPECT_LT(0.58 / d.remedies[0].value, std::log(65504.0) / 2);
  EXPECT_NE(d.remedies[0].code.find("div(x, 0.11)"), std::string::npos) << d.remedies[0].code;
  // The division in f32: it ran outside autocast, so a cast of its input, not an override (nor one for exp).
  EXPECT_EQ(d.remedies[1].kind, "cast_f32");
  EXPECT_NE(d.remedies[1].text.find("div in loss ran outside autocast"), std::string::npos) << d.remedies[1].text;
  for (const Remedy& m : d.remedies) EXPECT_NE(m.kind, "autocast_fp32") << m.text;
}

TEST(analysis_rules_test, the_temperature_under_autocast_is_reached_by_an_override_and_followed_by_f32_ops) {
  // The same rows with the division and exp under autocast (exp on the fp32 list keeps an f32 input in f32):
  // the division in f32 is an override for its module.
  std::vector<OpRow> rows = temperature_rows();
  rows[1].autocast = "div is on no autocast list: runs in its inputs' dtype";
  rows[2].autocast = "exp is on the fp32 list: runs in f32";
  const Report rep = analyse({step_row(0, 1024, 512, true)}, rows, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  const Diagnosis& d = rep.anomalies[0];
  ASSERT_GE(d.remedies.size(), 2u);
  EXPECT_EQ(d.remedies[1].kind, "autocast_fp32");
  EXPECT_EQ(d.remedies[1].pattern, "loss");
  // After a linear (lower_precision_fp: an f32 input is cast back to f16) the division in f32 cures nothing. (A
  // division by 1e-4 here: an amplifier must bring the values within 2^10 of 65504, and 0.58 / 1e-4 = 5800 does.)
  rows[1].health.absmax = 5800;
  rows[2].op = "linear";
  rows[2].autocast = "linear is on the lower_precision_fp list: runs in f16";
  rows[2].health.pos_inf = 0;
  rows[2].health.neg_inf = 3;
  const Report linear = analyse({step_row(0, 1024, 512, true)}, rows, {});
  ASSERT_EQ(linear.anomalies.size(), 1u);
  EXPECT_EQ(linear.anomalies[0].cause, "f16_overflow");
  EXPECT_EQ(linear.anomalies[0].root_cause, "amplification");
  ASSERT_FALSE(linear.anomalies[0].chain.empty());
  EXPECT_EQ(linear.anomalies[0].chain[0].op, "div");
  for (const Remedy& m : linear.anomalies[0].remedies) EXPECT_FALSE(m.kind == "autocast_fp32" && m.pattern == "loss" &&
                                                                   m.text.find("scaled values") != std::string::npos)
      << m.text;
}

TEST(analysis_rules_test, values_made_large_by_an_added_operand_have_no_amplification_root) {
  // linear (absmax 2) + a constant the trace does not hold (an additive mask of -1e5) -> softmax whose cast to
  // f16 overflows: the add made the values 50000 times larger, but through an operand the walk cannot follow.
  OpRow lin = op_row(0, 0, "linear", "attn");
  lin.health.absmax = 2;
  lin.inputs = {trace::kInputData, trace::kInputParameter, trace::kInputNone, trace::kInputNone};
  OpRow add = op_row(0, 1, "add", "attn", "f32");
  add.health.absmax = 1e5;
  add.inputs = {0, trace::kInputData, trace::kInputNone, trace::kInputNone};
  OpRow soft = op_row(0, 2, "softmax", "attn");
  soft.health.nan = 16;
  soft.cast_overflow = 4;
  soft.origin = true;
  soft.inputs = {1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  const Report rep = analyse({step_row(0, 1024, 512, true)}, {lin, add, soft}, {});
  ASSERT_EQ(rep.anomalies.size(), 1u);
  EXPECT_EQ(rep.anomalies[0].cause, "f16_overflow");
  EXPECT_EQ(rep.anomalies[0].root_cause, "");
  EXPECT_TRUE(rep.anomalies[0].chain.empty());
}

}  // namespace
}  // namespace ampscope::analysis
