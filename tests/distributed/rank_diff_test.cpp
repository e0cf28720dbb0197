// `ampscope diff` of data-parallel runs (probes/analysis/ranks.h, run_diff in cli/report_command.cpp) on
// traces every rank of this program writes with `train()` on the process group, as `mpirun ... ampscope
// train --ddp` does: two N-rank runs diffed rank by rank, and two ranks of one run. What each test expects
// follows from how the runs were made, not from the diff's output: the same configuration twice gives the
// same bits (deterministic replay) on every rank, so nothing parts; a healthy fp16 run against its fp32 twin
// is inside the false-divergence rules a one-process pair passes (docs/report-format.md, The diff); the
// rank-bad-batch scenario puts 1e6 in the global batch's last row at step 3 (samples/scenarios.cpp), which is
// in the last rank's share ([r*B/N, (r+1)*B/N)), so that rank's forward is the first place anything parts;
// and the all-reduce and the shared GradScaler decision make the gradients, scales and skips the same bits
// on every rank. Under the single-process group there are no rank traces: the tests skip.
#include <stdlib.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "probes/analysis/ranks.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "tests/distributed/distributed_test_support.h"

namespace ampscope {
namespace {

using samples::Precision;
using samples::TrainConfig;
using testing::shared_temp_folder;
using testing::test_group;

// A 2- or 3-rank mlp run: batch 48 splits over 1, 2 and 3 ranks; 6 steps pass step 3 and the step after it.
std::string train_run(ProcessGroup& g, const std::filesystem::path& dir, const std::string& name, Precision precision,
                      const std::string& scenario = "") {
  TrainConfig c;
  c.sample = "mlp";
  c.scenario = scenario;
  c.precision = precision;
  c.device = "cpu";
  c.steps = 6;
  c.batch = 48;
  c.seed = 5;
  c.out = (dir / (name + ".h5")).string();
  c.process_group = &g;
  samples::train(c);
  return c.out;
}

struct Outcome {
  int status = -1;
  std::string out, err;
  nlohmann::json json;
};

Outcome run_diff(const std::string& a, const std::string& b, bool json) {
  Outcome o;
  std::ostringstream out, err;
  samples::DiffRequest request;
  request.a = a;
  request.b = b;
  request.json = json;
  o.status = samples::run_diff(request, out, err);
  o.out = out.str();
  o.err = err.str();
  if (json && o.status != samples::kExitUsage) o.json = nlohmann::json::parse(o.out);
  return o;
}

class rank_diff : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test_group().size() == 1) GTEST_SKIP() << "needs two ranks or more (ctest: distributed_mpi_np2, _np3)";
    dir_ = shared_temp_folder(test_group(), "rankdiff");
  }
  void TearDown() override {
    if (dir_.empty()) return;  // skipped
    test_group().barrier();
    if (test_group().rank() == 0) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

TEST_F(rank_diff, the_same_configuration_twice_has_no_divergence_on_any_rank) {
  ProcessGroup& g = test_group();
  const std::string a = train_run(g, dir_, "first", Precision::fp16), b = train_run(g, dir_, "second", Precision::fp16);
  g.barrier();  // every trace is closed
  if (g.rank() != 0) return;
  const Outcome o = run_diff(a, b, true);  // the runs' --out names: each finds its rank traces
  ASSERT_EQ(o.status, samples::kExitClean) << o.err << o.out;
  EXPECT_EQ(o.json.at("kind"), "diff_ranks");
  EXPECT_EQ(o.json.at("ranks"), g.size());
  EXPECT_EQ(o.json.at("diverged"), false);
  EXPECT_TRUE(o.json.at("first_divergence").is_null());
  ASSERT_EQ(o.json.at("diffs").size(), static_cast<std::size_t>(g.size()));
  for (int r = 0; r < g.size(); ++r) {
    const nlohmann::json& d = o.json.at("diffs").at(static_cast<std::size_t>(r));
    EXPECT_EQ(d.at("path_a"), samples::rank_trace_path(a, r));
    EXPECT_EQ(d.at("path_b"), samples::rank_trace_path(b, r));
    EXPECT_EQ(d.at("steps_compared"), 6);
    // The same bits: every loss of rank r equals, every difference is 0.
    for (const nlohmann::json& p : d.at("losses")) EXPECT_EQ(p.at("rel"), 0.0) << "rank " << r << " step " << p.at("step");
    EXPECT_TRUE(d.at("largest").empty()) << "rank " << r;
  }
  // One rank's file names its whole run just as well.
  EXPECT_EQ(run_diff(samples::rank_trace_path(a, g.size() - 1), samples::rank_trace_path(b, 0), false).status,
            samples::kExitClean);
}

TEST_F(rank_diff, a_healthy_fp16_run_against_its_fp32_twin_parts_on_no_rank) {
  ProcessGroup& g = test_group();
  const std::string a = train_run(g, dir_, "fp32", Precision::fp32), b = train_run(g, dir_, "fp16", Precision::fp16);
  g.barrier();
  if (g.rank() != 0) return;
  const Outcome o = run_diff(a, b, true);
  EXPECT_EQ(o.status, samples::kExitClean) << o.err << o.out.substr(0, 4000);
  EXPECT_EQ(o.json.at("diverged"), false);
  for (int r = 0; r < g.size(); ++r) {
    const nlohmann::json& d = o.json.at("diffs").at(static_cast<std::size_t>(r));
    EXPECT_EQ(d.at("diverged"), false) << "rank " << r;
    EXPECT_GT(d.at("ops_aligned").get<int>(), 0) << "rank " << r;
    EXPECT_FALSE(d.at("dtype_differences").empty()) << "rank " << r << ": fp16 against fp32 runs ops in other dtypes";
  }
}

TEST_F(rank_diff, one_ranks_bad_batch_parts_first_at_step_3_in_that_ranks_forward) {
  ProcessGroup& g = test_group();
  const std::string a = train_run(g, dir_, "healthy", Precision::fp16),
                    b = train_run(g, dir_, "bad", Precision::fp16, "rank-bad-batch");
  g.barrier();
  if (g.rank() != 0) return;
  const int last = g.size() - 1;
  const Outcome o = run_diff(a, b, true);
  ASSERT_EQ(o.status, samples::kExitFound) << o.err;
  const nlohmann::json& first = o.json.at("first_divergence");
  ASSERT_FALSE(first.is_null());
  EXPECT_EQ(first.at("rank"), last);
  EXPECT_EQ(first.at("step"), 3);
  EXPECT_EQ(first.at("kind"), "op");
  EXPECT_EQ(first.at("phase"), "forward");
  EXPECT_EQ(first.at("module"), "fc1");
  EXPECT_EQ(first.at("op"), "linear");
  EXPECT_EQ(first.at("stat"), "nonfinite");
  // Every other rank's data was healthy: its forward at step 3 matches; the inf reached it through the
  // all-reduce, so its first difference is a gradient after the backward, at the same step.
  for (int r = 0; r < last; ++r) {
    const nlohmann::json& own = o.json.at("rank_divergences").at(static_cast<std::size_t>(r));
    ASSERT_FALSE(own.is_null()) << "rank " << r;
    EXPECT_EQ(own.at("step"), 3) << "rank " << r;
    EXPECT_EQ(own.at("kind"), "gradient") << "rank " << r;
    EXPECT_EQ(own.at("stat"), "nonfinite") << "rank " << r;
  }
  // Steps 0 to 2 trained on the same data in both runs: the same bits on every rank.
  for (int r = 0; r < g.size(); ++r) {
    for (const nlohmann::json& p : o.json.at("diffs").at(static_cast<std::size_t>(r)).at("losses")) {
      if (p.at("step").get<int>() < 3) {
        EXPECT_EQ(p.at("rel"), 0.0) << "rank " << r << " step " << p.at("step");
      }
    }
  }

  const Outcome text = run_diff(a, b, false);
  EXPECT_NE(text.out.find("FIRST DIVERGENCE ACROSS RANKS: rank " + std::to_string(last) +
                          ", step 3, forward linear in fc1: NaN/inf counts differ: a none"),
            std::string::npos)
      << text.out.substr(0, 2000);
  EXPECT_NE(text.out.find("== rank 0: a " + samples::rank_trace_path(a, 0) + ", b " + samples::rank_trace_path(b, 0) + " =="),
            std::string::npos);
}

TEST_F(rank_diff, two_ranks_of_one_run_hold_the_same_gradients_scales_and_skips) {
  ProcessGroup& g = test_group();
  const std::string run = train_run(g, dir_, "bad", Precision::fp16, "rank-bad-batch");
  g.barrier();
  if (g.rank() != 0) return;
  const std::string first = samples::rank_trace_path(run, 0), last = samples::rank_trace_path(run, g.size() - 1);
  const Outcome o = run_diff(first, last, true);
  // The last rank's forward overflows and the others' do not: their op rows differ (NaN/inf counts), which is
  // the data, not a fault; what must be equal is, so the exit status is 0.
  EXPECT_EQ(o.status, samples::kExitClean) << o.err;
  const nlohmann::json& check = o.json.at("ranks_of_one_run");
  EXPECT_EQ(check.at("rank_a"), 0);
  EXPECT_EQ(check.at("rank_b"), g.size() - 1);
  EXPECT_EQ(check.at("world_size"), g.size());
  EXPECT_EQ(check.at("agree"), true);
  EXPECT_EQ(check.at("steps_compared"), 6);
  // The mlp has 6 parameters (3 linear layers' weight and bias); an fp16 run records each gradient before and
  // after unscale_: 12 rows a step.
  EXPECT_EQ(check.at("grads_compared"), 6 * 12);
  EXPECT_EQ(o.json.at("first_divergence").at("key").at("step"), 3) << "the last rank's inf at step 3 is in its ops only";
  const Outcome text = run_diff(first, last, false);
  EXPECT_EQ(text.out.rfind("RANKS OF ONE RUN: a is rank 0 and b rank " + std::to_string(g.size() - 1), 0), 0u) << text.out;
  EXPECT_NE(text.out.find("AFTER THE ALL-REDUCE: identical on both ranks, bit for bit: 6 steps'"), std::string::npos);
}

TEST_F(rank_diff, runs_with_other_numbers_of_ranks_are_refused_naming_both_counts) {
  ProcessGroup& g = test_group();
  const std::string a = train_run(g, dir_, "run", Precision::fp32);
  g.barrier();
  if (g.rank() != 0) return;
  // A run of one rank more: copies of the traces under a second name, one extra.
  std::vector<std::string> more;
  for (int r = 0; r <= g.size(); ++r) {
    more.push_back((dir_ / ("more.rank" + std::to_string(r) + ".h5")).string());
    std::filesystem::copy_file(samples::rank_trace_path(a, std::min(r, g.size() - 1)), more.back());
  }
  const Outcome o = run_diff(a, (dir_ / "more.h5").string(), false);
  EXPECT_EQ(o.status, samples::kExitUsage);
  EXPECT_NE(o.err.find("ampscope diff: error: run a has " + std::to_string(g.size()) + " ranks"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("and run b " + std::to_string(g.size() + 1) + " ("), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("both runs must have the same number of ranks"), std::string::npos) << o.err;
}

}  // namespace
}  // namespace ampscope
