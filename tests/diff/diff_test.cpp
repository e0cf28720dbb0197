// The two-trace diff of probes/analysis_diff.h: hand-built traces written with the TraceWriter (identical
// runs, planted divergences, NaN, ops and steps in one run only, dtype differences, repeated ops), and a
// real pair: the transformer's attention-overflow scenario trained in fp16 and in fp32 with the same seed.
// Expected values are worked out by hand from the planted numbers, never read back from the diff.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "probes/analysis_diff.h"
#include "probes/trace_reader.h"
#include "probes/trace_writer.h"
#include "samples/train.h"
#include "tests/test_support.h"

namespace ampscope::analysis {
namespace {

using trace::OpRow;
using trace::Phase;
using trace::StepRow;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A trace file in the temp folder, removed when the test is done with it.
class TempTrace {
 public:
  explicit TempTrace(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("ampscope_diff_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + "_" + name + ".h5")) {}
  ~TempTrace() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempTrace(const TempTrace&) = delete;
  TempTrace& operator=(const TempTrace&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

// A hand-built run: step rows and op rows, written step by step as the probe would.
struct HandRun {
  std::string precision = "fp32";
  std::vector<StepRow> steps;
  std::vector<OpRow> ops;

  void write(const std::filesystem::path& path) const {
    trace::TraceWriter w(path, {.precision = precision, .device = "cpu", .model = "hand", .seed = 1, .config = "{}"});
    for (const StepRow& s : steps) {
      for (const OpRow& r : ops) {
        if (r.step == s.step) w.write(r);
      }
      w.write(s);
      w.end_step(s.step);
    }
    w.close();
  }

  OpRow& op(std::int64_t step, std::int64_t seq) {
    for (OpRow& r : ops) {
      if (r.step == step && r.seq == seq) return r;
    }
    throw std::runtime_error("no op at that step and seq");
  }
};

// One step of a small MLP: forward fc1, act, fc2, act, fc3, loss; backward in reverse. "relu" in "act"
// runs twice in each phase (occurrences 0 and 1). seq 4 is the 5th op: linear in fc3.
struct Template {
  Phase phase;
  const char* op;
  const char* module;
};
const std::vector<Template> kStep = {
    {Phase::forward, "linear", "fc1"},  {Phase::forward, "relu", "act"},     {Phase::forward, "linear", "fc2"},
    {Phase::forward, "relu", "act"},    {Phase::forward, "linear", "fc3"},   {Phase::forward, "cross_entropy", ""},
    {Phase::backward, "linear", "fc3"}, {Phase::backward, "relu", "act"},    {Phase::backward, "linear", "fc2"},
    {Phase::backward, "relu", "act"},   {Phase::backward, "linear", "fc1"},
};

// Statistics that differ from op to op and from step to step, so a misaligned pair cannot look equal.
double absmax_of(std::int64_t step, std::int64_t seq) { return 1.0 + 0.1 * static_cast<double>(step) + static_cast<double>(seq); }

OpRow make_op(std::int64_t step, std::int64_t seq, const Template& t) {
  OpRow r;
  r.step = step;
  r.seq = seq;
  r.phase = t.phase;
  r.op = t.op;
  r.module = t.module;
  r.in_dtypes = "f32,f32";
  r.out_dtype = "f32";
  r.shape = "[8, 16]";
  r.health.numel = 128;
  r.health.absmax = absmax_of(step, seq);
  r.health.max = r.health.absmax;
  r.health.min = -0.5 * r.health.absmax;
  r.health.mean = 0.01 * static_cast<double>(seq + 1);
  r.health.rms = 0.5 + 0.1 * static_cast<double>(seq) + 0.01 * static_cast<double>(step);
  return r;
}

HandRun make_run(std::int64_t steps = 6) {
  HandRun run;
  for (std::int64_t s = 0; s < steps; ++s) {
    StepRow row;
    row.step = s;
    row.loss = 2.0 - 0.1 * static_cast<double>(s);
    row.scale = 1;
    row.scale_after = 1;
    run.steps.push_back(row);
    for (std::size_t i = 0; i < kStep.size(); ++i) run.ops.push_back(make_op(s, static_cast<std::int64_t>(i), kStep[i]));
  }
  return run;
}

// Inserts an op at the start of a step's rows in `run` (seqs of the step's later ops move up by one).
void insert_first(HandRun& run, std::int64_t step, OpRow extra) {
  for (OpRow& r : run.ops) {
    if (r.step == step) ++r.seq;
  }
  extra.step = step;
  extra.seq = 0;
  const auto at = std::find_if(run.ops.begin(), run.ops.end(), [&](const OpRow& r) { return r.step == step; });
  run.ops.insert(at, extra);
}

struct Pair {
  TempTrace file_a{"a"}, file_b{"b"};
  Pair(const HandRun& a, const HandRun& b) {
    a.write(file_a.path());
    b.write(file_b.path());
  }
  DiffReport diff(const DiffOptions& options = {}, const DiffProgress& progress = {}) {
    trace::TraceReader a(file_a.path()), b(file_b.path());
    return analysis::diff(a, b, options, progress);
  }
};

TEST(diff_test, identical_runs_have_no_divergence_and_zero_differences) {
  const HandRun run = make_run();
  Pair pair(run, run);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_FALSE(d.first_loss_divergence.has_value());
  EXPECT_TRUE(d.largest.empty());
  EXPECT_TRUE(d.dtype_differences.empty());
  EXPECT_TRUE(d.only_in_a.empty());
  EXPECT_TRUE(d.only_in_b.empty());
  EXPECT_TRUE(d.steps_only_in_a.empty());
  EXPECT_TRUE(d.steps_only_in_b.empty());
  EXPECT_EQ(d.steps_compared, 6);
  EXPECT_EQ(d.ops_aligned, 6 * static_cast<std::int64_t>(kStep.size()));
  ASSERT_EQ(d.losses.size(), 6u);
  for (const LossPoint& p : d.losses) {
    EXPECT_TRUE(p.in_a && p.in_b);
    EXPECT_EQ(p.loss_a, 2.0 - 0.1 * static_cast<double>(p.step));
    EXPECT_EQ(p.loss_a, p.loss_b);
    EXPECT_EQ(p.rel, 0.0);
  }
  EXPECT_EQ(d.path_a, pair.file_a.path().string());
  EXPECT_EQ(d.run_b.model, "hand");
}

TEST(diff_test, finds_a_planted_divergence_at_its_step_phase_module_op_and_occurrence) {
  const HandRun a = make_run();
  HandRun b = a;
  // Noise far below the threshold everywhere, so the planted difference is not the only non-zero one.
  for (OpRow& r : b.ops) r.health.rms *= 1.0 + 1e-4;
  b.op(3, 4).health.absmax *= 1.3;
  Pair pair(a, b);
  // rows_per_read 7 (under one step's 11 rows) forces a block per step: the result must not depend on it.
  for (std::int64_t rows_per_read : {std::int64_t{200000}, std::int64_t{7}, std::int64_t{25}}) {
    SCOPED_TRACE(rows_per_read);
    std::vector<std::pair<std::int64_t, std::int64_t>> calls;
    const DiffReport d = pair.diff({.rows_per_read = rows_per_read},
                                   [&](std::int64_t done, std::int64_t total) { calls.emplace_back(done, total); });
    ASSERT_TRUE(d.first_divergence.has_value());
    const OpDiff& f = *d.first_divergence;
    EXPECT_EQ(f.key.step, 3);
    EXPECT_EQ(f.key.phase, Phase::forward);
    EXPECT_EQ(f.key.module, "fc3");
    EXPECT_EQ(f.key.op, "linear");
    EXPECT_EQ(f.key.occurrence, 0);
    EXPECT_EQ(f.seq_a, 4);
    EXPECT_EQ(f.seq_b, 4);
    EXPECT_EQ(f.stat, "absmax");
    // |x - 1.3x| / max(|x|, |1.3x|) with x = 1 + 0.1 * 3 + 4 = 5.3.
    const double x = 5.3;
    EXPECT_NEAR(f.rel_absmax, (1.3 * x - x) / (1.3 * x), 1e-12);
    EXPECT_NEAR(f.rel_absmax, 0.3 / 1.3, 1e-12);
    EXPECT_EQ(f.max_rel, f.rel_absmax);
    EXPECT_FALSE(f.nonfinite_differs);
    EXPECT_FALSE(f.dtype_differs);
    EXPECT_EQ(f.dtypes_a, "f32,f32 -> f32");
    // rms: |r - r(1 + 1e-4)| / (r (1 + 1e-4)).
    EXPECT_NEAR(f.rel_rms, 1e-4 / (1 + 1e-4), 1e-12);
    // The largest list is bounded by options.largest and led by the planted difference.
    ASSERT_EQ(d.largest.size(), 20u);
    EXPECT_EQ(d.largest.front().key.step, 3);
    EXPECT_EQ(d.largest.front().seq_a, 4);
    for (std::size_t i = 1; i < d.largest.size(); ++i) EXPECT_GE(d.largest[i - 1].max_rel, d.largest[i].max_rel);
    EXPECT_EQ(d.ops_aligned, 66);
    EXPECT_FALSE(d.first_loss_divergence.has_value());
    // Progress after every block, ending with every row of both files.
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back().first, 2 * 66);
    EXPECT_EQ(calls.back().second, 2 * 66);
    if (rows_per_read == 7) {
      EXPECT_EQ(calls.size(), 6u);  // one step per block
    }
    if (rows_per_read == 25) {
      EXPECT_EQ(calls.size(), 3u);  // two steps per block
    }
  }
}

TEST(diff_test, nan_in_one_run_is_a_nonfinite_divergence_even_under_a_huge_threshold) {
  const HandRun a = make_run();
  HandRun b = a;
  b.op(2, 1).health.nan = 3;  // the statistics of the finite values stay equal
  b.steps[4].loss = NAN;
  Pair pair(a, b);
  const DiffReport d = pair.diff({.threshold = 1e300});
  ASSERT_TRUE(d.first_divergence.has_value());
  const OpDiff& f = *d.first_divergence;
  EXPECT_EQ(f.key.step, 2);
  EXPECT_EQ(f.key.op, "relu");
  EXPECT_EQ(f.key.module, "act");
  EXPECT_EQ(f.key.occurrence, 0);
  EXPECT_EQ(f.stat, "nonfinite");
  EXPECT_TRUE(f.nonfinite_differs);
  EXPECT_EQ(f.max_rel, kInf);
  EXPECT_EQ(f.rel_absmax, 0.0);
  EXPECT_EQ(f.a.nan, 0);
  EXPECT_EQ(f.b.nan, 3);
  // A NaN loss against a number is infinitely far, beyond any threshold.
  ASSERT_TRUE(d.first_loss_divergence.has_value());
  EXPECT_EQ(*d.first_loss_divergence, 4);
  EXPECT_EQ(d.losses[4].rel, kInf);
}

TEST(diff_test, statistics_without_finite_values_agree_when_both_are_nan_and_part_when_one_is) {
  const HandRun a = make_run(1);
  HandRun b = a;
  HandRun both = a;
  both.op(0, 2).health.absmax = NAN;
  b.op(0, 2).health.absmax = NAN;
  Pair same(both, b);
  const DiffReport d0 = same.diff();
  EXPECT_FALSE(d0.first_divergence.has_value());
  Pair parted(a, b);
  const DiffReport d1 = parted.diff();
  ASSERT_TRUE(d1.first_divergence.has_value());
  EXPECT_EQ(d1.first_divergence->seq_a, 2);
  EXPECT_EQ(d1.first_divergence->rel_absmax, kInf);
  EXPECT_EQ(d1.first_divergence->stat, "absmax");
}

TEST(diff_test, an_op_recorded_in_one_run_only_is_listed_with_its_count_and_first_step) {
  const HandRun a = make_run();
  HandRun b = a;
  OpRow cast = make_op(0, 0, {Phase::forward, "to", "fc1"});
  cast.in_dtypes = "f32";
  cast.out_dtype = "f16";
  for (std::int64_t s = 2; s < 6; ++s) insert_first(b, s, cast);
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_TRUE(d.only_in_a.empty());
  ASSERT_EQ(d.only_in_b.size(), 1u);
  EXPECT_EQ(d.only_in_b[0].op, "to");
  EXPECT_EQ(d.only_in_b[0].module, "fc1");
  EXPECT_EQ(d.only_in_b[0].phase, Phase::forward);
  EXPECT_EQ(d.only_in_b[0].count, 4);
  EXPECT_EQ(d.only_in_b[0].first_step, 2);
  // Every other op still meets its partner, one seq further on in b.
  EXPECT_EQ(d.ops_aligned, 66);
  EXPECT_FALSE(d.first_divergence.has_value());

  Pair reversed(b, a);
  const DiffReport r = reversed.diff();
  EXPECT_TRUE(r.only_in_b.empty());
  ASSERT_EQ(r.only_in_a.size(), 1u);
  EXPECT_EQ(r.only_in_a[0].count, 4);
  EXPECT_EQ(r.only_in_a[0].first_step, 2);
}

TEST(diff_test, a_step_whose_ops_one_run_sampled_out_is_a_step_only_in_the_other_not_a_list_of_ops) {
  // --sample-every: both runs finish every step (a /steps row each), but b recorded the ops of steps 0, 3 only.
  const HandRun a = make_run();
  HandRun b = a;
  std::erase_if(b.ops, [](const OpRow& r) { return r.step != 0 && r.step != 3; });
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_TRUE(d.only_in_a.empty());
  EXPECT_TRUE(d.only_in_b.empty());
  EXPECT_EQ(d.steps_only_in_a, (std::vector<std::int64_t>{1, 2, 4, 5}));
  EXPECT_TRUE(d.steps_only_in_b.empty());
  EXPECT_EQ(d.ops_aligned, 2 * 11);
  EXPECT_EQ(d.steps_compared, 6);  // the losses of every step
  EXPECT_FALSE(d.first_divergence.has_value());

  Pair reversed(b, a);
  const DiffReport r = reversed.diff();
  EXPECT_TRUE(r.only_in_b.empty());
  EXPECT_EQ(r.steps_only_in_b, (std::vector<std::int64_t>{1, 2, 4, 5}));
}

TEST(diff_test, dtype_differences_are_grouped_by_op_with_their_count) {
  HandRun a = make_run();
  a.precision = "fp16";
  const HandRun b = make_run();
  for (OpRow& r : a.ops) {
    if (r.phase == Phase::forward && r.op == "linear" && r.module == "fc1") {
      r.in_dtypes = "f16,f16,f16";
      r.out_dtype = "f16";
    }
  }
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  ASSERT_EQ(d.dtype_differences.size(), 1u);
  const DtypeDifference& g = d.dtype_differences[0];
  EXPECT_EQ(g.phase, Phase::forward);
  EXPECT_EQ(g.module, "fc1");
  EXPECT_EQ(g.op, "linear");
  EXPECT_EQ(g.dtypes_a, "f16,f16,f16 -> f16");
  EXPECT_EQ(g.dtypes_b, "f32,f32 -> f32");
  EXPECT_EQ(g.count, 6);
  EXPECT_EQ(g.first_step, 0);
  EXPECT_EQ(d.run_a.precision, "fp16");
  EXPECT_FALSE(d.first_divergence.has_value());  // a dtype alone is not a divergence of the statistics
}

TEST(diff_test, loss_curves_cover_every_step_of_either_run) {
  HandRun a = make_run(6);
  HandRun b = make_run(4);
  b.steps[2].loss = a.steps[2].loss * 1.1;
  b.steps[1].scale = 1024;
  b.steps[1].skipped = true;
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_EQ(d.steps_compared, 4);
  EXPECT_EQ(d.steps_only_in_a, (std::vector<std::int64_t>{4, 5}));
  EXPECT_TRUE(d.steps_only_in_b.empty());
  ASSERT_EQ(d.losses.size(), 6u);
  for (std::int64_t s = 0; s < 6; ++s) {
    const LossPoint& p = d.losses[static_cast<std::size_t>(s)];
    EXPECT_EQ(p.step, s);
    EXPECT_TRUE(p.in_a);
    EXPECT_EQ(p.in_b, s < 4);
    EXPECT_EQ(p.loss_a, 2.0 - 0.1 * static_cast<double>(s));
  }
  EXPECT_EQ(d.losses[1].scale_b, 1024.0);
  EXPECT_TRUE(d.losses[1].skipped_b);
  EXPECT_FALSE(d.losses[1].skipped_a);
  // Step 2: |l - 1.1 l| / (1.1 l), l = 1.8.
  EXPECT_NEAR(d.losses[2].rel, (1.1 * 1.8 - 1.8) / (1.1 * 1.8), 1e-12);
  ASSERT_TRUE(d.first_loss_divergence.has_value());
  EXPECT_EQ(*d.first_loss_divergence, 2);
  // The ops of steps 4 and 5 are not listed one by one: the steps themselves are.
  EXPECT_TRUE(d.only_in_a.empty());
  EXPECT_EQ(d.ops_aligned, 4 * 11);
}

TEST(diff_test, repeated_ops_in_a_module_align_by_occurrence_not_by_seq) {
  const HandRun a = make_run();
  HandRun b = a;
  // b records an extra op at the start of step 1, so its seqs are one ahead; the second relu in act (seq 3
  // in a, 4 in b) diverges.
  OpRow extra = make_op(0, 0, {Phase::forward, "to", "fc1"});
  insert_first(b, 1, extra);
  b.op(1, 4).health.mean *= 2;  // mean 0.04 -> 0.08
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  ASSERT_TRUE(d.first_divergence.has_value());
  const OpDiff& f = *d.first_divergence;
  EXPECT_EQ(f.key.step, 1);
  EXPECT_EQ(f.key.op, "relu");
  EXPECT_EQ(f.key.module, "act");
  EXPECT_EQ(f.key.occurrence, 1);
  EXPECT_EQ(f.seq_a, 3);
  EXPECT_EQ(f.seq_b, 4);
  EXPECT_EQ(f.stat, "mean");
  EXPECT_NEAR(f.rel_mean, (0.08 - 0.04) / 0.08, 1e-12);
  EXPECT_EQ(f.rel_absmax, 0.0);  // the partner is the same op: its other statistics agree
  EXPECT_EQ(f.rel_rms, 0.0);
}

TEST(diff_test, an_extra_occurrence_in_one_run_is_unmatched) {
  HandRun a = make_run(2);
  const HandRun b = a;
  // a runs relu in act a third time in step 1's forward.
  OpRow third = make_op(1, 11, {Phase::forward, "relu", "act"});
  a.ops.push_back(third);
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  ASSERT_EQ(d.only_in_a.size(), 1u);
  EXPECT_EQ(d.only_in_a[0].op, "relu");
  EXPECT_EQ(d.only_in_a[0].module, "act");
  EXPECT_EQ(d.only_in_a[0].count, 1);
  EXPECT_EQ(d.only_in_a[0].first_step, 1);
  EXPECT_TRUE(d.only_in_b.empty());
  EXPECT_EQ(d.ops_aligned, 22);
  EXPECT_FALSE(d.first_divergence.has_value());
}

TEST(diff_test, diff_ops_pairs_one_steps_rows_in_the_order_of_a) {
  const HandRun run = make_run(1);
  std::vector<OpRow> a = run.ops, b = run.ops;
  // b: an extra cast first, and the second forward relu (occurrence 1) 10% larger in absmax.
  OpRow cast = make_op(0, 0, {Phase::forward, "to", "fc1"});
  b.insert(b.begin(), cast);
  for (std::size_t i = 1; i < b.size(); ++i) b[i].seq = static_cast<std::int64_t>(i);
  b[4].health.absmax *= 1.1;  // a's seq 3
  const std::vector<OpDiff> diffs = diff_ops(a, b);
  ASSERT_EQ(diffs.size(), a.size());
  for (std::size_t i = 0; i < diffs.size(); ++i) {
    EXPECT_EQ(diffs[i].seq_a, static_cast<std::int64_t>(i));
    EXPECT_EQ(diffs[i].seq_b, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(diffs[i].key.op, kStep[i].op);
  }
  EXPECT_EQ(diffs[1].key.occurrence, 0);
  EXPECT_EQ(diffs[3].key.occurrence, 1);
  EXPECT_EQ(diffs[7].key.occurrence, 0);  // the backward relu counts apart from the forward one
  EXPECT_EQ(diffs[9].key.occurrence, 1);
  const double x = absmax_of(0, 3);  // 4
  EXPECT_NEAR(diffs[3].rel_absmax, (1.1 * x - x) / (1.1 * x), 1e-12);
  EXPECT_EQ(diffs[3].stat, "absmax");
  EXPECT_EQ(diffs[2].max_rel, 0.0);
  // A floor keeps two tiny values from looking far apart: |1e-9 - 2e-9| / 1e-6.
  std::vector<OpRow> tiny_a = {a[0]}, tiny_b = {a[0]};
  tiny_a[0].health.mean = 1e-9;
  tiny_b[0].health.mean = 2e-9;
  EXPECT_NEAR(diff_ops(tiny_a, tiny_b)[0].rel_mean, 1e-9 / 1e-6, 1e-15);
}

TEST(diff_test, refuses_a_block_size_below_one_row) {
  const HandRun run = make_run(1);
  Pair pair(run, run);
  EXPECT_THROW_MSG(pair.diff({.rows_per_read = 0}), Error, "rows_per_read must be at least 1, got 0", "hint:");
}

// The README's demo pair: attention logits that overflow f16 in blocks.0.attn's score bmm.
TEST(diff_test, attention_overflow_fp16_parts_from_fp32_at_step_0_by_the_score_bmm_or_earlier) {
  constexpr std::int64_t kSteps = 3;
  TempTrace fp16_file("fp16"), fp32_file("fp32");
  for (auto [precision, file] : {std::pair{samples::Precision::fp16, &fp16_file}, std::pair{samples::Precision::fp32, &fp32_file}}) {
    samples::TrainConfig c;
    c.scenario = "attention-overflow";
    c.precision = precision;
    c.device = "cpu";
    c.steps = kSteps;
    c.seed = 7;
    c.out = file->path().string();
    samples::train(c);
  }
  trace::TraceReader a(fp16_file.path()), b(fp32_file.path());
  const DiffReport d = diff(a, b);
  EXPECT_EQ(d.steps_compared, kSteps);
  EXPECT_EQ(d.run_a.precision, "fp16");
  EXPECT_EQ(d.run_b.precision, "fp32");
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 0);

  // The fp16 run's first score bmm in blocks.0.attn (read independently of the diff).
  const std::vector<OpRow> step0_a = a.ops(0, 1), step0_b = b.ops(0, 1);
  const auto bmm = std::find_if(step0_a.begin(), step0_a.end(), [](const OpRow& r) {
    return r.phase == Phase::forward && r.op == "bmm" && r.module == "blocks.0.attn";
  });
  ASSERT_NE(bmm, step0_a.end());
  EXPECT_GT(bmm->health.pos_inf + bmm->health.neg_inf, 0);  // the scenario's overflow
  EXPECT_LE(d.first_divergence->seq_a, bmm->seq);
  const std::vector<OpDiff> ops = diff_ops(step0_a, step0_b);
  const auto bmm_diff = std::find_if(ops.begin(), ops.end(), [&](const OpDiff& o) { return o.seq_a == bmm->seq; });
  ASSERT_NE(bmm_diff, ops.end());
  EXPECT_TRUE(bmm_diff->nonfinite_differs);
  EXPECT_EQ(bmm_diff->stat, "nonfinite");

  // autocast ran linear in f16 in the fp16 run; the fp32 run has no autocast.
  const auto linear = std::find_if(d.dtype_differences.begin(), d.dtype_differences.end(), [](const DtypeDifference& g) {
    return g.op == "linear" && g.phase == Phase::forward;
  });
  ASSERT_NE(linear, d.dtype_differences.end());
  EXPECT_NE(linear->dtypes_a.find("-> f16"), std::string::npos) << linear->dtypes_a;
  EXPECT_NE(linear->dtypes_b.find("-> f32"), std::string::npos) << linear->dtypes_b;
  EXPECT_EQ(linear->first_step, 0);
  EXPECT_GE(linear->count, kSteps);
  // The fp16 run skips every step and halves its scale; the fp32 run never scales.
  for (const LossPoint& p : d.losses) {
    EXPECT_TRUE(p.skipped_a);
    EXPECT_FALSE(p.skipped_b);
    EXPECT_EQ(p.scale_b, 1.0);
  }
  EXPECT_EQ(d.losses[0].scale_a, 65536.0);
}

}  // namespace
}  // namespace ampscope::analysis
