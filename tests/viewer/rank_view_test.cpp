// ampscope-view with a data-parallel run's rank traces, without a window: what the names on the command line
// open (open_plan), the overlays' lines (rank_lines), the rank selector's labels, and a ViewerState opening a
// run's ranks and switching the rank shown (open_paths, select_rank). The rank traces are written with the real
// TraceWriter, with the config `train --ddp` writes (rank, world_size), and planted per-rank values; the
// rank_view_real_run tests read a real 2-rank `mpirun ... ampscope train --ddp` run that
// tests/viewer/rank_traces_test.sh makes (ctest viewer_rank_traces).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/viewer/viewer_fixtures.h"
#include "viewer/app.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

using testing::planted_loss;
using testing::write_rank;

// NAME.rank0.h5 ... NAME.rank{world-1}.h5 in the fixture folder; returns the run's --out name (NAME.h5).
std::string write_run(const std::string& name, int world, bool bad_rank_1 = false) {
  for (int r = 0; r < world; ++r) write_rank(testing::fixture_dir() / fmt::format("{}.rank{}.h5", name, r), r, world, bad_rank_1);
  return (testing::fixture_dir() / (name + ".h5")).string();
}
std::string rank_file(const std::string& name, int r) { return (testing::fixture_dir() / fmt::format("{}.rank{}.h5", name, r)).string(); }

// Polls the state until nothing is loading (as the frame loop does), at most 20 s.
void settle(ViewerState& s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    poll_documents(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } while ((!idle(s) || (s.a && !s.a->report())) && std::chrono::steady_clock::now() < until);
  poll_documents(s);
}

TEST(rank_view, one_name_of_a_run_opens_every_rank_and_a_rank_file_shows_that_rank) {
  const std::string run = write_run("plan", 3);
  const std::vector<std::string> all = {rank_file("plan", 0), rank_file("plan", 1), rank_file("plan", 2)};
  OpenPlan p = open_plan({run});
  EXPECT_EQ(p.ranks, all);
  EXPECT_EQ(p.shown, 0u);
  EXPECT_TRUE(p.a.empty());
  p = open_plan({all[2]});
  EXPECT_EQ(p.ranks, all);
  EXPECT_EQ(p.shown, 2u);
  // Two rank files of one run: those two ranks (not a comparison); three names: the names.
  p = open_plan({all[2], all[0]});
  EXPECT_EQ(p.ranks, (std::vector<std::string>{all[2], all[0]}));
  EXPECT_EQ(p.shown, 0u);
  EXPECT_EQ(open_plan({all[1], all[0], all[2]}).ranks, (std::vector<std::string>{all[1], all[0], all[2]}));
  // Ordinary traces: a, and b to compare; two runs' rank files: a and b too (their own ranks each).
  const std::string x = testing::write_fixture(testing::fixture_dir() / "plan_x.h5", false).string();
  const std::string y = testing::write_fixture(testing::fixture_dir() / "plan_y.h5", true).string();
  p = open_plan({x});
  EXPECT_TRUE(p.ranks.empty());
  EXPECT_EQ(p.a, x);
  EXPECT_TRUE(p.b.empty());
  p = open_plan({x, y});
  EXPECT_TRUE(p.ranks.empty());
  EXPECT_EQ(p.a, x);
  EXPECT_EQ(p.b, y);
  write_run("plan_other", 3);
  p = open_plan({all[0], rank_file("plan_other", 0)});
  EXPECT_TRUE(p.ranks.empty());
  EXPECT_EQ(p.a, all[0]);
  EXPECT_EQ(p.b, rank_file("plan_other", 0));
  // The same file twice is a comparison of the file with itself, as before.
  EXPECT_TRUE(open_plan({all[1], all[1]}).ranks.empty());
}

TEST(rank_view, the_overlays_have_one_line_per_rank_with_that_ranks_values_labelled_with_its_number) {
  std::vector<std::vector<trace::StepRow>> rows(2);
  for (int r = 0; r < 2; ++r) {
    for (std::int64_t step = 0; step < 3; ++step) {
      trace::StepRow s;
      s.step = step;
      s.loss = planted_loss(r, step);
      s.scale = step == 2 ? 512 : 1024;
      s.scale_after = step == 1 ? 512 : s.scale;
      s.skipped = step == 1;
      s.grad_norm = 1.0 + 0.125 * static_cast<double>(step);
      rows[static_cast<std::size_t>(r)].push_back(s);
    }
  }
  const std::vector<RankSteps> in = {{0, rows[0]}, {1, rows[1]}};
  const std::vector<RankLine> lines = rank_lines(in);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].label, "rank 0");
  EXPECT_EQ(lines[1].label, "rank 1");
  EXPECT_EQ(lines[0].colour, kRankColours[0]);
  EXPECT_EQ(lines[1].colour, kRankColours[1]);
  EXPECT_EQ(lines[0].series.step, (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(lines[0].series.loss, (std::vector<double>{2.0, 1.75, 1.5}));
  EXPECT_EQ(lines[1].series.loss, (std::vector<double>{2.5, 2.25, 2.0}));
  EXPECT_EQ(lines[1].series.scale, (std::vector<double>{1024, 1024, 512}));
  EXPECT_EQ(lines[1].series.grad_norm, (std::vector<double>{1.0, 1.125, 1.25}));
  EXPECT_EQ(lines[1].series.skipped, (std::vector<double>{1}));
  EXPECT_EQ(lines[1].series.backoffs, (std::vector<double>{1}));
  // A rank set that is not 0..N-1 (two ranks of a bigger run) keeps the ranks' own numbers and colours.
  const std::vector<RankSteps> some = {{3, rows[0]}, {9, rows[1]}};
  const std::vector<RankLine> other = rank_lines(some);
  EXPECT_EQ(other[0].label, "rank 3");
  EXPECT_EQ(other[1].label, "rank 9");
  EXPECT_EQ(other[1].colour, kRankColours[1]);  // 9 = 8 + 1: the palette repeats
}

TEST(rank_view, rank_colours_differ_from_each_other_and_from_the_plots_markers) {
  std::set<std::uint32_t> seen;
  for (int r = 0; r < 8; ++r) seen.insert(rank_colour(r));
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(rank_colour(8), rank_colour(0));
  for (const std::uint32_t marker : {colours::kSkippedStep, colours::kBackoff, colours::kGrowth, colours::kSelectedStep})
    EXPECT_EQ(seen.count(marker), 0u) << std::hex << marker;
}

TEST(rank_view, the_rank_selector_names_each_ranks_anomalies_once_analysed) {
  analysis::Report healthy, bad;
  bad.anomalies.resize(1);
  analysis::Report two;
  two.anomalies.resize(2);
  EXPECT_EQ(rank_item_label({.rank = 0, .report = &healthy}), "rank 0: healthy");
  EXPECT_EQ(rank_item_label({.rank = 1, .report = &bad}), "rank 1: 1 anomaly");
  EXPECT_EQ(rank_item_label({.rank = 2, .report = &two}), "rank 2: 2 anomalies");
  EXPECT_EQ(rank_item_label({.rank = 3, .analysing = true}), "rank 3: analysing");
  EXPECT_EQ(rank_item_label({.rank = 4}), "rank 4");
}

TEST(rank_view, a_state_opens_the_runs_ranks_and_switches_the_rank_shown_keeping_the_step) {
  const std::string run = write_run("state", 2, /*bad_rank_1=*/true);
  ViewerState s;
  open_paths(s, {run});
  ASSERT_TRUE(s.errors.empty()) << s.errors.front();
  ASSERT_EQ(s.ranks.size(), 2u);
  ASSERT_TRUE(s.a);
  EXPECT_EQ(s.a->path(), rank_file("state", 0));
  EXPECT_EQ(s.rank_shown, 0u);
  EXPECT_EQ(rank_document(s, 1)->path(), rank_file("state", 1));
  EXPECT_EQ(rank_document(s, 0), s.a.get());
  EXPECT_FALSE(rank_document(s, 1)->analysing()) << "a rank not shown is not analysed yet";
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  EXPECT_TRUE(s.a->report()->anomalies.empty()) << "rank 0's data was healthy";
  // The user picks step 1; showing rank 1 keeps it (and rank 1's analysis starts).
  select_step(s, 1);
  ASSERT_TRUE(select_rank(s, 1));
  EXPECT_EQ(s.a->path(), rank_file("state", 1));
  EXPECT_EQ(s.rank_shown, 1u);
  EXPECT_EQ(s.a->selected_step(), 1);
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  ASSERT_EQ(s.a->report()->anomalies.size(), 1u);
  EXPECT_EQ(s.a->report()->anomalies.front().step, 2);
  EXPECT_EQ(s.a->selected_step(), 1) << "the user's step stays";
  ASSERT_NE(s.a->step_data(), nullptr);
  EXPECT_EQ(s.a->step_data()->ops.front().health.absmax, 11.0) << "rank 1's own op row";
  // Back to rank 0: its document (and its analysis) were kept.
  ASSERT_TRUE(select_rank(s, 0));
  EXPECT_EQ(s.a->path(), rank_file("state", 0));
  EXPECT_NE(s.a->report(), nullptr);
  EXPECT_FALSE(select_rank(s, 2)) << "no rank 2 in a 2-rank run";
  EXPECT_EQ(s.a->path(), rank_file("state", 0));
}

TEST(rank_view, until_the_user_picks_a_step_the_rank_shown_jumps_to_its_first_anomaly) {
  const std::string run = write_run("jump", 2, /*bad_rank_1=*/true);
  ViewerState s;
  open_paths(s, {rank_file("jump", 1)});  // rank 1's file: rank 1 shown
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.a->path(), rank_file("jump", 1));
  settle(s);
  EXPECT_EQ(s.a->selected_step(), 2) << "rank 1's origin";
  EXPECT_EQ(s.selected_seq, 0);
  ASSERT_TRUE(select_rank(s, 0));
  settle(s);
  EXPECT_EQ(s.a->selected_step(), 2) << "rank 0 has no anomaly: the step stays";
}

TEST(rank_view, traces_of_different_runs_are_not_opened_as_ranks_and_the_error_box_says_why) {
  write_rank(testing::fixture_dir() / "mixed.rank0.h5", 0, 2);
  write_rank(testing::fixture_dir() / "mixed_other.rank1.h5", 1, 2, false, /*lr=*/0.02);
  ViewerState s;
  open_ranks(s, {rank_file("mixed", 0), (testing::fixture_dir() / "mixed_other.rank1.h5").string()});
  EXPECT_TRUE(s.ranks.empty());
  ASSERT_TRUE(s.a);
  EXPECT_EQ(s.a->path(), rank_file("mixed", 0));
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_NE(s.errors.front().find("is not a rank of the same run as"), std::string::npos) << s.errors.front();
  EXPECT_NE(s.errors.front().find("showing " + rank_file("mixed", 0) + " alone"), std::string::npos) << s.errors.front();
  // Two traces that are both rank 0.
  ViewerState t;
  write_rank(testing::fixture_dir() / "twice.rank0.h5", 0, 2);
  write_rank(testing::fixture_dir() / "twice_copy.rank0.h5", 0, 2);
  open_ranks(t, {rank_file("twice", 0), (testing::fixture_dir() / "twice_copy.rank0.h5").string()});
  EXPECT_TRUE(t.ranks.empty());
  ASSERT_EQ(t.errors.size(), 1u);
  EXPECT_NE(t.errors.front().find("are both rank 0"), std::string::npos) << t.errors.front();
}

// ---- a real 2-rank run (tests/viewer/rank_traces_test.sh) ----

// `mpirun -np 2 ampscope train --scenario rank-bad-batch --ddp --steps 6 --out run.h5`: the scenario puts 1e6
// in the global batch's last row at step 3 (samples/scenarios.cpp), in rank 1's share, so only rank 1's forward
// overflows (its loss there is not finite) and, the inf reaching every rank through the all-reduce, every rank
// skips step 3 and halves the scale: the ranks' scale and gradient-norm lines are one, their loss lines two.
TEST(rank_view_real_run, a_rank_bad_batch_run_opens_both_ranks_with_one_scale_line_and_rank_1s_anomaly) {
  const char* run = std::getenv("AMPSCOPE_RANK_RUN");
  if (run == nullptr) GTEST_SKIP() << "run by ctest's viewer_rank_traces (tests/viewer/rank_traces_test.sh), which makes the run";
  ViewerState s;
  open_paths(s, {run});
  ASSERT_TRUE(s.errors.empty()) << s.errors.front();
  ASSERT_EQ(s.ranks.size(), 2u);
  std::vector<RankSteps> in;
  for (std::size_t i = 0; i < 2; ++i) in.push_back({s.ranks[i].rank, rank_document(s, i)->steps()});
  const std::vector<RankLine> lines = rank_lines(in);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].label, "rank 0");
  EXPECT_EQ(lines[1].label, "rank 1");
  ASSERT_EQ(lines[0].series.step.size(), 6u);
  ASSERT_EQ(lines[1].series.step.size(), 6u);
  EXPECT_EQ(lines[0].series.scale, lines[1].series.scale) << "one GradScaler decision for every rank";
  EXPECT_EQ(lines[0].series.skipped, (std::vector<double>{3}));
  EXPECT_EQ(lines[1].series.skipped, (std::vector<double>{3}));
  EXPECT_EQ(lines[0].series.scale[4], lines[0].series.scale[3] / 2) << "the backoff after step 3";
  for (std::size_t k = 0; k < 6; ++k) {
    if (k == 3) continue;  // inf on both: the norm of a gradient holding inf
    EXPECT_EQ(lines[0].series.grad_norm[k], lines[1].series.grad_norm[k]) << "step " << k << ": the all-reduced gradients";
    EXPECT_TRUE(std::isfinite(lines[0].series.loss[k]) && std::isfinite(lines[1].series.loss[k])) << "step " << k;
    EXPECT_NE(lines[0].series.loss[k], lines[1].series.loss[k]) << "step " << k << ": each rank's own share";
  }
  EXPECT_TRUE(std::isfinite(lines[0].series.loss[3])) << "rank 0's share is healthy";
  EXPECT_FALSE(std::isfinite(lines[1].series.loss[3])) << "rank 1's share holds the 1e6";
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  EXPECT_TRUE(s.a->report()->anomalies.empty()) << "rank 0: no origin";
  ASSERT_TRUE(select_rank(s, 1));
  settle(s);
  ASSERT_NE(s.a->report(), nullptr);
  ASSERT_FALSE(s.a->report()->anomalies.empty());
  const analysis::Diagnosis& d = s.a->report()->anomalies.front();
  EXPECT_EQ(d.step, 3);
  EXPECT_EQ(d.module, "fc1");
  EXPECT_EQ(d.op, "linear");
  EXPECT_EQ(s.a->selected_step(), 3) << "shown after the rank switch: rank 1's first anomaly";
}

}  // namespace
}  // namespace ampscope::viewer
