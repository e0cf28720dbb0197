// A data-parallel run's rank traces in the diff (probes/analysis/ranks.h), on hand-built traces written with
// the TraceWriter: finding a run's siblings, a trace's rank from its config, two ranks of one run checked for
// what must be identical, the first divergence across ranks (planted at known steps, phases and ranks), and
// the refusals. tests/distributed/rank_diff_test.cpp runs the same on traces of real 2- and 3-rank runs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "probes/analysis/ranks.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"

namespace ampscope::analysis {
namespace {

using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

std::filesystem::path scratch() { return ampscope::testing::process_scratch_dir("ampscope_rank_diff_test"); }

std::string config(int rank, int world, double lr = 0.01, const std::string& device = "cpu") {
  return fmt::format(R"({{"sample": "mlp", "device": "{}", "lr": {}, "world_size": {}, "rank": {}}})", device, lr, world, rank);
}

// One rank's trace of a 4-step run: a forward and a backward row of fc1 and its weight's gradient per step, the
// forward's values depending on the rank (its share of the batch), the gradient and the step's scale on the
// step only (after the all-reduce, every rank holds the same). Plants: NaN in the forward (or backward) row or
// in the gradient at a step.
struct RankRun {
  int rank = 0, world = 2;
  std::string config_text{};  // "": config(rank, world)
  std::int64_t nan_forward_at = -1, nan_backward_at = -1, nan_grad_at = -1;
  double grad_norm_at_step_1 = 0.5;   // step 1's gradient norm (others: 0.5 + 0.1 step)
  bool skip_step_2 = false;
  bool closed = true;  // false: the writer is destroyed without close(), as a killed or failed run leaves it

  std::filesystem::path write(const std::filesystem::path& path) const {
    trace::TraceWriter w(path, {.precision = "fp32", .device = "cpu", .model = "mlp", .seed = 1,
                                .config = config_text.empty() ? config(rank, world) : config_text});
    for (std::int64_t s = 0; s < 4; ++s) {
      for (const Phase phase : {Phase::forward, Phase::backward}) {
        OpRow r;
        r.step = s;
        r.seq = phase == Phase::forward ? 0 : 1;
        r.phase = phase;
        r.op = "linear";
        r.module = "fc1";
        r.in_dtypes = "f32,f32";
        r.out_dtype = "f32";
        r.shape = "[4, 8]";
        r.health.numel = 32;
        r.health.rms = 1.0 + 0.01 * static_cast<double>(rank) + 0.1 * static_cast<double>(s);
        r.health.absmax = 2 * r.health.rms;
        r.health.max = r.health.absmax;
        r.health.min = -r.health.absmax;
        if ((phase == Phase::forward && s == nan_forward_at) || (phase == Phase::backward && s == nan_backward_at))
          r.health.nan = 3;
        w.write(r);
      }
      GradRow g;
      g.step = s;
      g.param = "fc1.weight";
      g.dtype = "f32";
      g.norm = s == 1 ? grad_norm_at_step_1 : 0.5 + 0.1 * static_cast<double>(s);
      g.absmax = g.norm / 2;
      g.unscaled = true;
      if (s == nan_grad_at) g.nan = 4;
      w.write(g);
      StepRow row;
      row.step = s;
      row.loss = 2.0 - 0.1 * static_cast<double>(s) + 0.05 * static_cast<double>(rank);  // the rank's share
      row.skipped = skip_step_2 && s == 2;
      row.grad_norm = g.norm;
      row.lr = 0.01;
      w.write(row);
      w.end_step(s);
    }
    if (closed) w.close();
    return path;
  }
};

// A run of `runs.size()` ranks written as NAME.rankR.h5 in the scratch folder; returns the paths by rank.
std::vector<std::string> write_run(const std::string& name, std::vector<RankRun> runs) {
  std::vector<std::string> paths;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    runs[r].rank = static_cast<int>(r);
    runs[r].world = static_cast<int>(runs.size());
    paths.push_back(runs[r].write(scratch() / fmt::format("{}.rank{}.h5", name, r)).string());
  }
  return paths;
}

TEST(rank_traces, siblings_are_found_from_the_runs_out_name_or_any_rank_and_an_ordinary_trace_has_none) {
  const std::vector<std::string> run = write_run("sib", {RankRun{}, RankRun{}, RankRun{}});
  EXPECT_EQ(rank_siblings({(scratch() / "sib.h5").string()}), run);
  EXPECT_EQ(rank_siblings({run[2]}), run);
  EXPECT_EQ(rank_siblings({run[2], run[0]}), (std::vector<std::string>{run[2], run[0]})) << "several names: as given";
  RankRun{}.write(scratch() / "plain.h5");
  EXPECT_TRUE(rank_siblings({(scratch() / "plain.h5").string()}).empty());
  EXPECT_TRUE(rank_siblings({(scratch() / "nothing.h5").string()}).empty());
  RankRun{}.write(scratch() / "alone.rank0.h5");
  EXPECT_TRUE(rank_siblings({(scratch() / "alone.rank0.h5").string()}).empty()) << "one rank alone is no set";
}

TEST(rank_traces, a_traces_rank_and_its_run_come_from_the_config_without_the_rank_local_fields) {
  const auto info = [](std::string c) { return trace::RunInfo{.precision = "fp32", .device = "cpu", .model = "m", .config = std::move(c)}; };
  ASSERT_TRUE(rank_place(info(config(1, 2))).has_value());
  EXPECT_EQ(rank_place(info(config(1, 2)))->rank, 1);
  EXPECT_EQ(rank_place(info(config(1, 2)))->world_size, 2);
  EXPECT_FALSE(rank_place(info(R"({"sample": "mlp"})")).has_value());
  EXPECT_FALSE(rank_place(info("not json")).has_value());
  EXPECT_FALSE(rank_place(info(R"({"rank": "1", "world_size": 2})")).has_value()) << "a rank that is not a number";
  // Each rank may have its own device; everything else is the run's.
  EXPECT_TRUE(same_run(info(config(0, 2, 0.01, "cuda:0")), info(config(1, 2, 0.01, "cuda:1"))));
  EXPECT_FALSE(same_run(info(config(0, 2, 0.01)), info(config(1, 2, 0.02))));
  EXPECT_FALSE(same_run(info(config(0, 2)), info(config(1, 3))));
  EXPECT_FALSE(same_run(info(R"({"sample": "mlp", "device": "cpu", "lr": 0.01})"), info(config(1, 2))));
}

TEST(rank_pair, two_ranks_that_agree_after_the_all_reduce_pass_although_their_values_differ) {
  const std::vector<std::string> run = write_run("agree", {RankRun{}, RankRun{.nan_forward_at = 2}});
  trace::TraceReader a(run[0]), b(run[1]);
  const RankPairCheck c = check_rank_pair(a, b);
  EXPECT_TRUE(c.agree());
  EXPECT_EQ(c.a.rank, 0);
  EXPECT_EQ(c.b.rank, 1);
  EXPECT_EQ(c.a.world_size, 2);
  EXPECT_EQ(c.steps_compared, 4);
  EXPECT_EQ(c.grads_compared, 4);  // one gradient row a step
  EXPECT_TRUE(c.mismatches.empty());
  const std::string text = render_text(c);
  EXPECT_EQ(text.rfind("RANKS OF ONE RUN: a is rank 0 and b rank 1 of one 2-rank data-parallel run.", 0), 0u) << text;
  EXPECT_NE(text.find("AFTER THE ALL-REDUCE: identical on both ranks, bit for bit: 4 steps' loss scale, skip, found_inf "
                      "and gradient norm, and 4 gradients after the all-reduce"),
            std::string::npos)
      << text;
}

TEST(rank_pair, a_gradient_one_ulp_apart_and_a_skip_on_one_rank_only_are_named_exactly) {
  const double norm = 0.5, next = std::nextafter(0.5, 1.0);  // 0.5 and 0.5000000000000001
  const std::vector<std::string> run =
      write_run("disagree", {RankRun{}, RankRun{.grad_norm_at_step_1 = next, .skip_step_2 = true}});
  trace::TraceReader a(run[0]), b(run[1]);
  const RankPairCheck c = check_rank_pair(a, b);
  EXPECT_FALSE(c.agree());
  // Step 1: the /steps row's grad_norm and the gradient row; step 2: the skip.
  ASSERT_EQ(c.mismatch_count, 3);
  ASSERT_EQ(c.mismatches.size(), 3u);
  EXPECT_EQ(c.mismatches[0].step, 1);
  EXPECT_EQ(c.mismatches[0].what, "grad_norm");
  EXPECT_EQ(c.mismatches[0].value_a, "0.5");
  EXPECT_EQ(c.mismatches[0].value_b, "0.5000000000000001");
  EXPECT_EQ(c.mismatches[1].what, "gradient");
  EXPECT_EQ(c.mismatches[1].param, "fc1.weight");
  EXPECT_EQ(c.mismatches[1].value_a, fmt::format("norm 0.5, absmax {}", norm / 2));
  EXPECT_EQ(c.mismatches[1].value_b, fmt::format("norm 0.5000000000000001, absmax {}", next / 2));
  EXPECT_EQ(c.mismatches[2].step, 2);
  EXPECT_EQ(c.mismatches[2].what, "skipped");
  EXPECT_EQ(c.mismatches[2].value_a, "false");
  EXPECT_EQ(c.mismatches[2].value_b, "true");
  const std::string text = render_text(c);
  EXPECT_NE(text.find("RANKS DISAGREE: 3 differences"), std::string::npos) << text;
  EXPECT_NE(text.find("  step 2, skipped: a false, b true\n"), std::string::npos) << text;
}

TEST(rank_pair, traces_of_different_runs_are_refused) {
  RankRun other;
  other.config_text = config(1, 2, 0.02);
  const std::filesystem::path a = RankRun{}.write(scratch() / "lr1.rank0.h5"), b = other.write(scratch() / "lr2.rank1.h5");
  trace::TraceReader ra(a), rb(b);
  EXPECT_THROW_MSG(check_rank_pair(ra, rb), Error, "are not two ranks of one data-parallel run");
}

TEST(rank_diff, the_first_divergence_across_ranks_is_the_earliest_step_then_the_forward_before_the_gradients) {
  const std::vector<std::string> a = write_run("base", {RankRun{}, RankRun{}});
  // Step 2: rank 0's gradient holds NaN (it came through the all-reduce), rank 1's forward made it. Rank 1's
  // forward comes first in the step, though rank 0 is the lower rank.
  const std::vector<std::string> b = write_run("grad_vs_forward", {RankRun{.nan_grad_at = 2}, RankRun{.nan_forward_at = 2, .nan_grad_at = 2}});
  const RankDiffReport d = diff_ranks(a, b);
  EXPECT_EQ(d.ranks, 2);
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.first->rank, 1);
  EXPECT_EQ(d.first->step, 2);
  EXPECT_EQ(d.first->kind, "op");
  EXPECT_EQ(d.first->phase, Phase::forward);
  EXPECT_EQ(d.first->module, "fc1");
  ASSERT_TRUE(d.firsts[0].has_value());
  EXPECT_EQ(d.firsts[0]->kind, "gradient");
  EXPECT_EQ(d.firsts[0]->param, "fc1.weight");
  EXPECT_EQ(d.firsts[0]->step, 2);
  const std::string text = render_text(d);
  EXPECT_NE(text.find("FIRST DIVERGENCE ACROSS RANKS: rank 1, step 2, forward linear in fc1: NaN/inf counts differ: a "
                      "none, b 3 NaN\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  rank 0: parts at step 2, the gradient of fc1.weight (nonfinite)\n"), std::string::npos) << text;

  // An earlier step wins whatever the phase and rank: rank 1's backward at step 1 before rank 0's forward at 2.
  const std::vector<std::string> c = write_run("earlier", {RankRun{.nan_forward_at = 2}, RankRun{.nan_backward_at = 1}});
  const RankDiffReport e = diff_ranks(a, c);
  ASSERT_TRUE(e.first.has_value());
  EXPECT_EQ(e.first->rank, 1);
  EXPECT_EQ(e.first->step, 1);
  EXPECT_EQ(e.first->phase, Phase::backward);

  // The same place on both ranks: the lower rank.
  const std::vector<std::string> t = write_run("tie", {RankRun{.nan_forward_at = 3}, RankRun{.nan_forward_at = 3}});
  const RankDiffReport f = diff_ranks(a, t);
  ASSERT_TRUE(f.first.has_value());
  EXPECT_EQ(f.first->rank, 0);
  EXPECT_EQ(f.first->step, 3);

  // Ranks given in any order are put in rank order.
  const RankDiffReport g = diff_ranks({a[1], a[0]}, {b[1], b[0]});
  EXPECT_EQ(g.paths_a, a);
  EXPECT_EQ(g.paths_b, b);
  EXPECT_EQ(g.first->rank, 1);
  EXPECT_FALSE(diff_ranks(a, write_run("same", {RankRun{}, RankRun{}})).diverged());
}

// A rank trace whose writer did not close it is compared as far as it goes and named in `incomplete` (the
// command prints a note for each, as for two traces); complete runs name none.
TEST(rank_diff, incomplete_rank_traces_are_named) {
  const std::vector<std::string> a = write_run("whole", {RankRun{}, RankRun{}});
  const std::vector<std::string> b = write_run("cut", {RankRun{}, RankRun{.closed = false}});
  const RankDiffReport d = diff_ranks(a, b);
  EXPECT_EQ(d.incomplete, std::vector<std::string>{b[1]});
  EXPECT_FALSE(d.diverged());  // the same rows, as far as they go
  const nlohmann::json doc = nlohmann::json::parse(render_json(d));
  EXPECT_EQ(doc.at("incomplete"), nlohmann::json::array({b[1]}));
  EXPECT_TRUE(diff_ranks(a, write_run("whole2", {RankRun{}, RankRun{}})).incomplete.empty());
}

TEST(rank_diff, other_rank_counts_traces_without_a_rank_and_missing_ranks_are_refused) {
  const std::vector<std::string> two = write_run("two", {RankRun{}, RankRun{}});
  const std::vector<std::string> three = write_run("three", {RankRun{}, RankRun{}, RankRun{}});
  EXPECT_THROW_MSG(diff_ranks(two, three), Error, "run a has 2 ranks (", "and run b 3 (",
                   "both runs must have the same number of ranks");
  RankRun plain;
  plain.config_text = R"({"sample": "mlp"})";
  const std::string p = plain.write(scratch() / "noranks.h5").string();
  EXPECT_THROW_MSG(diff_ranks(two, {p, two[1]}), Error, "'" + p + "' (run b) is not a trace of a data-parallel run");
  EXPECT_THROW_MSG(diff_ranks(two, {three[0], three[1]}), Error, "run b was trained on 3 ranks, but 2 of its traces were found");
  EXPECT_THROW_MSG(diff_ranks({two[0], two[0]}, two), Error, "the traces of run a are not ranks 0 to 1 of one run", "is rank 0 of 2");
  RankRun other_lr;
  other_lr.config_text = config(1, 2, 0.02);
  const std::string q = other_lr.write(scratch() / "other_lr.rank1.h5").string();
  EXPECT_THROW_MSG(diff_ranks(two, {two[0], q}), Error, "the traces of run b are not of one run: '" + q + "' has another configuration");
}

}  // namespace
}  // namespace ampscope::analysis
