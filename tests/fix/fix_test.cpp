// `ampscope fix` (cli/fix_command.h): every failure scenario is re-run with the remedies its report
// proposes, and the remedies expected to work are the ones whose mechanism removes the failure's cause.
// The expectations below come from the arithmetic of the dtypes, not from what the command printed:
//   - f16's largest finite value is 65504; f32's and bf16's is about 3.4e38 (8 exponent bits both). An
//     overflow of f16's range (attention scores x120, a feed-forward output past 65504, a raw feature of
//     1e5, logits of a diverging run) cannot happen in f32 or bf16, so keeping the overflowing op or module
//     in f32 (--autocast-fp32) or training in bf16 removes an f16_overflow.
//   - grad-underflow multiplies the loss by 2^-20, so gradients fall below f16's smallest subnormal
//     (2^-24 ~ 6e-8) and flush to 0 without a scaler; a GradScaler at 65536 = 2^16 multiplies them back
//     into f16's range, and bf16 shares f32's exponent range (its smallest normal is ~1.2e-38).
//   - no-zero-grad never clears .grad, so one overflow stays in the gradients and every later step sees
//     it; clearing the gradients every step (zero_grad) starts each step from 0.
//   - log-zero: the loss's softmax is called with the logits' dtype (f16), which autocast respects, so no
//     autocast override reaches it (the report says so and offers no override). Its zeros are
//     probabilities below f16's smallest subnormal (2^-24, about exp(-16.6)) while the class scores span
//     tens; bf16 shares f32's exponent range (down to about exp(-92)), so a bf16 run's softmax keeps them
//     above 0 and the log finite: bf16 is verified. (Its other cures, log_softmax and a clamp, are code.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "cli/fix_command.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "tests/test_support.h"
#include "tests/userloop/hand_loss_loop.h"

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) { return process_scratch_dir("ampscope_fix") / name; }

fs::path train_scenario(const std::string& scenario, std::int64_t steps = 50) {
  samples::TrainConfig c;
  c.scenario = scenario;
  c.device = "cpu";
  c.steps = steps;  // 50 is the default: the scenario proposes its own
  c.out = scratch(scenario + ".h5").string();
  samples::train(c);
  return c.out;
}

struct FixRun {
  int status = -1;
  nlohmann::json doc;
  std::string out, err;
};

FixRun fix(const fs::path& trace, std::int64_t after) {
  std::ostringstream out, err;
  FixRun r;
  r.status = samples::run_fix({.trace = trace.string(), .after = after, .json = true}, out, err);
  r.out = out.str();
  r.err = err.str();
  if (r.status != samples::kExitUsage && !r.out.empty() && r.out.front() == '{') r.doc = nlohmann::json::parse(r.out);
  return r;
}

// The lines "fix: NAME: N steps in Ts: ..." (the plan's lines are "fix: plan ..." and "fix:   ...").
std::size_t progress_lines(const std::string& err) {
  static const std::regex progress(R"(^fix: [^ ]+: \d+ steps in [0-9.]+s: )");
  std::size_t n = 0;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) n += std::regex_search(line, progress) ? 1 : 0;
  return n;
}

bool verified(const FixRun& r, const std::string& kind, const std::string& flag_part = "") {
  for (const auto& e : r.doc["runs"])
    if (e["kind"] == kind && e["verified"].get<bool>() && e["flag"].get<std::string>().find(flag_part) != std::string::npos)
      return true;
  return false;
}

struct Expectation {
  const char* scenario;
  std::int64_t after;
  const char* kind;      // a remedy kind that must be verified (reasoning at the top of the file)
  const char* flag_part; // part of its flag
};

TEST(fix_test, verifies_the_remedy_whose_mechanism_removes_each_scenarios_failure) {
  const Expectation cases[] = {
      {"attention-overflow", 1, "autocast_fp32", "blocks.0.attn"},
      {"attention-overflow", 1, "bf16", "bf16"},
      {"masked-softmax", 1, "bf16", "bf16"},
      {"activation-overflow", 1, "autocast_fp32", "blocks.1.mlp.2"},
      {"activation-overflow", 1, "bf16", "bf16"},
      {"lr-explosion", 2, "bf16", "bf16"},
      {"grad-underflow", 2, "enable_scaler", ""},
      {"grad-underflow", 2, "bf16", "bf16"},
      {"scale-collapse", 2, "autocast_fp32", "fc1"},
      {"scale-collapse", 2, "bf16", "bf16"},
      {"no-zero-grad", 10, "zero_grad", ""},
  };
  std::string last;
  FixRun r;
  for (const Expectation& e : cases) {
    if (last != e.scenario) {
      r = fix(train_scenario(e.scenario), e.after);
      last = e.scenario;
      ASSERT_EQ(r.status, samples::kExitClean) << e.scenario << "\n" << r.err << r.out;
      EXPECT_TRUE(r.doc["reproduced"].get<bool>()) << e.scenario;
      // The plan first, then one progress line per re-run on stderr: the original, fp32 and each remedy.
      EXPECT_EQ(r.err.rfind("fix: plan for ", 0), 0u) << r.err;
      EXPECT_EQ(progress_lines(r.err), r.doc["runs"].size()) << r.err;
      // The fp32 reference never has the f16 failure.
      EXPECT_TRUE(r.doc["runs"][1]["anomaly_gone"].get<bool>()) << e.scenario;
      for (const auto& run : r.doc["runs"]) EXPECT_TRUE(fs::exists(run["trace"].get<std::string>())) << run["trace"];
      EXPECT_TRUE(fs::exists(samples::fix_results_path(scratch(std::string(e.scenario) + ".h5").string())));
    }
    EXPECT_TRUE(verified(r, e.kind, e.flag_part)) << e.scenario << ": " << e.kind << " " << e.flag_part << "\n" << r.out;
  }
}

TEST(fix_test, log_zero_verifies_bf16_and_tries_no_override_that_cannot_reach_its_softmax) {
  const FixRun r = fix(train_scenario("log-zero"), 1);
  EXPECT_EQ(r.status, samples::kExitClean) << r.err << r.out;
  EXPECT_TRUE(r.doc["runs"][1]["anomaly_gone"].get<bool>());  // the fp32 reference is clean
  EXPECT_TRUE(verified(r, "bf16")) << r.out;
  for (const auto& run : r.doc["runs"]) EXPECT_NE(run.value("kind", ""), "autocast_fp32") << run.dump();
}

TEST(fix_test, the_verified_remedy_applied_by_hand_in_a_plain_train_removes_the_overflow) {
  const FixRun r = fix(train_scenario("attention-overflow"), 1);
  ASSERT_TRUE(verified(r, "autocast_fp32", "blocks.0.attn"));
  // What `ampscope train --scenario attention-overflow --autocast-fp32 'blocks.0.attn'` does.
  samples::TrainConfig c;
  c.scenario = "attention-overflow";
  c.device = "cpu";
  c.steps = 3;
  c.autocast_fp32 = {"blocks.0.attn"};
  c.out = scratch("by-hand.h5").string();
  samples::train(c);
  trace::TraceReader reader(c.out);
  const analysis::Report rep = analysis::analyse(reader);
  for (const analysis::Diagnosis& d : rep.anomalies) EXPECT_NE(d.cause, "f16_overflow") << d.op << " " << d.module;
}

// A glob remedy keeps its pattern in the table and the results (issue 31: "autocast-fp32-blocks._.attn"); only its
// trace's file name is made file-safe.
TEST(fix_test, names_a_glob_remedy_by_its_pattern_and_only_its_file_name_is_made_safe) {
  const fs::path trace = train_scenario("attention-overflow");
  const FixRun r = fix(trace, 1);
  ASSERT_EQ(r.status, samples::kExitClean) << r.err << r.out;
  bool found = false;
  for (const auto& run : r.doc["runs"]) {
    if (run.value("name", "") != "autocast-fp32-blocks.*.attn") continue;
    found = true;
    EXPECT_EQ(fs::path(run.value("trace", "")).filename(), "attention-overflow.fix-autocast-fp32-blocks._.attn.h5")
        << run.dump();
  }
  EXPECT_TRUE(found) << r.doc.dump(1);
  // The progress lines name it as the table does ("fix: NAME: 3 steps in ..."); the plan's "writes:" line has the file.
  EXPECT_NE(r.err.find("fix: autocast-fp32-blocks.*.attn: "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("fix: autocast-fp32-blocks._.attn: "), std::string::npos) << r.err;
}

TEST(fix_test, report_marks_verified_remedies_and_ignores_a_damaged_results_file_with_a_note) {
  const fs::path trace = train_scenario("attention-overflow");
  ASSERT_EQ(fix(trace, 1).status, samples::kExitClean);
  auto report = [&](bool json, std::string& err) {
    std::ostringstream out, e;
    samples::ReportRequest q;
    q.trace = trace.string();
    q.json = json;
    EXPECT_EQ(samples::run_report(q, out, e), samples::kExitFound);
    err = e.str();
    return out.str();
  };
  std::string err;
  const nlohmann::json doc = nlohmann::json::parse(report(true, err));
  EXPECT_TRUE(err.empty()) << err;
  bool bf16 = false;
  for (const auto& m : doc["anomalies"][0]["remedies"]) {
    ASSERT_TRUE(m.contains("verified"));
    if (m["kind"] == "bf16") bf16 = m["verified"].get<bool>();
  }
  EXPECT_TRUE(bf16);
  EXPECT_NE(report(false, err).find("(verified by `ampscope fix`)"), std::string::npos);

  // A damaged results file: a note, no mark, the report as before.
  std::ofstream(samples::fix_results_path(trace.string())) << "{\"runs\": [tru";
  const std::string text = report(false, err);
  EXPECT_EQ(text.find("verified by"), std::string::npos);
  EXPECT_NE(err.find("NOTE: ignoring"), std::string::npos) << err;
  EXPECT_NE(err.find("not JSON"), std::string::npos) << err;

  // A well-formed file of another run (its first anomaly at another step): ignored too.
  std::ofstream(samples::fix_results_path(trace.string()))
      << R"({"cause": "f16_overflow", "first_anomaly": {"step": 4, "op": "bmm", "module": "blocks.0.attn"},
            "runs": [{"kind": "bf16", "remedy_flag": "--precision bf16", "verified": true}]})";
  EXPECT_EQ(report(false, err).find("verified by"), std::string::npos);
  EXPECT_NE(err.find("written for another run"), std::string::npos) << err;
}

TEST(fix_test, refuses_a_trace_of_a_users_own_loop_with_a_clear_message) {
  const fs::path trace = scratch("user.h5");
  train_hand_loss(trace, "fp16", LossForm::naive, 4);
  const FixRun r = fix(trace, 1);
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("was not written by `ampscope train`"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("needs a run it can repeat"), std::string::npos) << r.err;
}

TEST(fix_test, a_healthy_run_has_nothing_to_fix_and_bad_arguments_exit_2) {
  samples::TrainConfig c;
  c.sample = "mlp";
  c.precision = samples::Precision::fp32;
  c.device = "cpu";
  c.steps = 3;
  c.out = scratch("healthy.h5").string();
  samples::train(c);
  std::ostringstream out, err;
  EXPECT_EQ(samples::run_fix({.trace = c.out, .after = 1}, out, err), samples::kExitClean);
  EXPECT_NE(out.str().find("nothing to fix"), std::string::npos) << out.str();
  EXPECT_EQ(fix(scratch("missing.h5"), 1).status, samples::kExitUsage);
  EXPECT_EQ(fix(c.out, -1).status, samples::kExitUsage);
}

// A run that kept its periodic checkpoints is re-run from the last one at or before the first anomaly
// (lr-explosion's first overflow is at step 1, so from "ck.step-1.h5"): the runs in the recorded precision
// resume there, the fp32 and bf16 runs start at step 0 (a checkpoint's scaler state belongs to its
// precision), and every verdict is the one a re-run from step 0 reaches (the same run recorded without
// checkpoints is the independent reference): a remedy that fails from the checkpoint is tried from step 0.
TEST(fix_test, a_run_that_kept_checkpoints_is_re_run_from_the_last_one_before_the_anomaly_with_the_same_verdicts) {
  const fs::path dir = scratch("kept");
  fs::create_directories(dir);
  samples::TrainConfig c;
  c.scenario = "lr-explosion";
  c.device = "cpu";
  c.out = (dir / "run.h5").string();
  c.checkpoint = (dir / "ck.h5").string();
  c.checkpoint_every = 1;
  c.keep_checkpoints = true;
  samples::train(c);
  ASSERT_TRUE(fs::is_regular_file(samples::kept_checkpoint_path(c.checkpoint, 1)));
  const fs::path plain = train_scenario("lr-explosion");

  const FixRun kept = fix(c.out, 3), scratch_run = fix(plain, 3);
  ASSERT_EQ(kept.status, 0) << kept.err;
  ASSERT_EQ(scratch_run.status, 0) << scratch_run.err;
  EXPECT_EQ(kept.doc["first_anomaly"]["step"], 1);
  EXPECT_EQ(kept.doc["checkpoint"]["step"], 1);
  EXPECT_EQ(kept.doc["checkpoint"]["path"], samples::kept_checkpoint_path(c.checkpoint, 1));
  EXPECT_TRUE(kept.doc["checkpoint"]["used"].get<bool>());
  EXPECT_TRUE(kept.doc["reproduced"].get<bool>());
  ASSERT_EQ(kept.doc["runs"].size(), scratch_run.doc["runs"].size());
  for (std::size_t i = 0; i < kept.doc["runs"].size(); ++i) {
    const auto& a = kept.doc["runs"][i];
    const auto& b = scratch_run.doc["runs"][i];
    SCOPED_TRACE(a["name"].get<std::string>());
    EXPECT_EQ(a["name"], b["name"]);
    EXPECT_EQ(a["anomaly_gone"], b["anomaly_gone"]);
    EXPECT_EQ(a["verified"], b["verified"]);
    EXPECT_EQ(a["first_anomaly"], b["first_anomaly"]);
    // lr-0.15 fails from step 1 (step 0's update at lr 1.5 already did the damage) and is tried again from
    // step 0, where it works.
    const bool resumed = a["name"] != "fp32" && a["name"] != "bf16" && a["name"] != "lr-0.15";
    EXPECT_EQ(a["from_step"], resumed ? 1 : 0);
    EXPECT_EQ(a.contains("retried_from_step_0"), a["name"] == "lr-0.15");
    // The original resumes bit for bit: the same final loss. A remedy applies from the checkpoint's step
    // on (step 0 ran without it), so its losses differ from a re-run that applied it from step 0.
    if (a["name"] == "original") {
      EXPECT_EQ(a["final_loss"], b["final_loss"]);
    }
  }
  EXPECT_TRUE(scratch_run.doc.find("checkpoint") == scratch_run.doc.end());
}

TEST(fix_test, remedy_trace_names_are_safe_file_names) {
  EXPECT_EQ(samples::fix_trace_path("dir/run.h5", "autocast-fp32-blocks.*.attn"), "dir/run.fix-autocast-fp32-blocks._.attn.h5");
  EXPECT_EQ(samples::fix_results_path("dir/run.h5"), "dir/run.fix.json");
  EXPECT_EQ(samples::fix_trace_path("run.h5", "a/../b c"), "run.fix-a_.._b_c.h5");
}

}  // namespace
}  // namespace ampscope::testing
