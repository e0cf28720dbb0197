// The two-trace diff of probes/analysis/diff.h: hand-built traces written with the TraceWriter (identical
// runs, planted divergences, NaN, ops and steps in one run only, dtype differences, repeated ops, loss-scaled
// backward rows and gradients, rows outside steps, saturated outputs, new exact zeros), and real pairs: the
// transformer's attention-overflow scenario trained in fp16 and in fp32 with the same seed, and healthy
// fp16/bf16 runs of every sample against their fp32 twins (tests/diff/healthy_pairs_test.cpp).
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

#include <nlohmann/json.hpp>

#include "probes/analysis/diff.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/run.h"
#include "tests/test_support.h"

namespace ampscope::analysis {
namespace {

using trace::GradRow;
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
  std::string config = "{}";  // the run's config JSON (the PyTorch recorder's names it: "recorder")
  std::vector<StepRow> steps;
  std::vector<OpRow> ops;
  std::vector<GradRow> grads;
  // Op rows written outside the steps' loop, after step `outside_after` ended (-1: before the first): an
  // evaluation pass (step -1), or the rows of a step the writer stopped in (no /steps row).
  std::vector<OpRow> outside;
  std::int64_t outside_after = 0;

  void write(const std::filesystem::path& path) const {
    trace::TraceWriter w(path, {.precision = precision, .device = "cpu", .model = "hand", .seed = 1, .config = config});
    if (outside_after == -1) {
      for (const OpRow& r : outside) w.write(r);
    }
    for (const StepRow& s : steps) {
      for (const OpRow& r : ops) {
        if (r.step == s.step) w.write(r);
      }
      for (const GradRow& g : grads) {
        if (g.step == s.step) w.write(g);
      }
      w.write(s);
      w.end_step(s.step);
      if (s.step == outside_after) {
        for (const OpRow& r : outside) w.write(r);
      }
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
  // (absmax, one element, is reported but does not decide: the divergence is planted in the rms.)
  for (OpRow& r : b.ops) r.health.rms *= 1.0 + 1e-4;
  b.op(3, 4).health.rms *= 1.5;
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
    EXPECT_EQ(f.stat, "rms");
    // The op's rms grows with the step (0.5 + 0.1 * 4 + 0.01 * step), so its largest so far is b's planted
    // one: |r - 1.5 r (1 + 1e-4)| / (1.5 r (1 + 1e-4)) with r = 0.93.
    const double r = 0.93, rb = 1.5 * r * (1 + 1e-4);
    EXPECT_NEAR(f.rel_rms, (rb - r) / rb, 1e-12);
    EXPECT_NEAR(f.rel_rms, 1 - 1 / (1.5 * (1 + 1e-4)), 1e-12);
    EXPECT_EQ(f.max_rel, f.rel_rms);
    EXPECT_EQ(f.rel_absmax, 0.0);
    EXPECT_FALSE(f.nonfinite_differs);
    EXPECT_FALSE(f.dtype_differs);
    EXPECT_EQ(f.dtypes_a, "f32,f32 -> f32");
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
  both.op(0, 2).health.rms = NAN;
  b.op(0, 2).health.rms = NAN;
  Pair same(both, b);
  const DiffReport d0 = same.diff();
  EXPECT_FALSE(d0.first_divergence.has_value());
  Pair parted(a, b);
  const DiffReport d1 = parted.diff();
  ASSERT_TRUE(d1.first_divergence.has_value());
  EXPECT_EQ(d1.first_divergence->seq_a, 2);
  EXPECT_EQ(d1.first_divergence->rel_rms, kInf);
  EXPECT_EQ(d1.first_divergence->stat, "rms");
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

TEST(diff_test, a_pytorch_recorders_trace_is_named_so_and_its_unlisted_integer_inputs_are_no_dtype_difference) {
  HandRun a = make_run(2);
  HandRun b = a;
  b.config = R"({"recorder": "ampscope.torch", "torch": "1.13.0"})";
  // Our runtime lists the token ids and a mask among the inputs; the recorder lists floating inputs only.
  for (OpRow& r : a.ops) {
    if (r.phase == Phase::forward && r.module == "fc1") r.in_dtypes = "i64,f32";
    if (r.phase == Phase::forward && r.module == "fc2") r.in_dtypes = "bool,f32,f32";
  }
  for (OpRow& r : b.ops) {
    if (r.phase == Phase::forward && r.module == "fc1") r.in_dtypes = "f32";
    if (r.phase == Phase::forward && r.module == "fc2") r.in_dtypes = "f32,f32";
    // A floating dtype that differs still does.
    if (r.phase == Phase::forward && r.module == "fc3") r.in_dtypes = "bf16,f32";
  }
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_EQ(d.producer_a, "ampscope");
  EXPECT_EQ(d.producer_b, "pytorch");
  EXPECT_TRUE(d.producers_differ());
  ASSERT_EQ(d.dtype_differences.size(), 1u);
  EXPECT_EQ(d.dtype_differences[0].module, "fc3");
  EXPECT_EQ(d.dtype_differences[0].dtypes_b, "bf16,f32 -> f32");
  EXPECT_EQ(d.dtype_differences[0].count, 2);
  EXPECT_FALSE(d.first_divergence.has_value());
  const std::string text = analysis::render_text(d);
  EXPECT_NE(text.find("DIFFERENT PRODUCERS: run a is ampscope's runtime (ampscope train), run b is a PyTorch script "
                      "recorded by ampscope record"),
            std::string::npos)
      << text;
  const auto doc = nlohmann::json::parse(analysis::render_json(d));
  EXPECT_EQ(doc.at("producer_a"), "ampscope");
  EXPECT_EQ(doc.at("producer_b"), "pytorch");
  // Two runs of ours: no such line. Neither is a config that is not JSON, nor another recorder's name.
  Pair same(a, a);
  const DiffReport s = same.diff();
  EXPECT_FALSE(s.producers_differ());
  EXPECT_EQ(analysis::render_text(s).find("DIFFERENT PRODUCERS"), std::string::npos);
  for (const char* config : {"not json", R"({"recorder": "other"})", R"({"recorder": 1})", "[]"}) {
    trace::RunInfo info;
    info.config = config;
    EXPECT_EQ(analysis::producer_of(info), "ampscope") << config;
  }
}

TEST(diff_test, rows_of_two_producers_whose_sizes_differ_are_different_tensors_listed_and_not_judged) {
  // The backward of linear in fc2: ours records a [16] gradient (another input's), the recorder's the [8, 16]
  // one, with a very different rms. A reshaped row of the same size (fc1's [128] against [8, 16]) is compared.
  HandRun a = make_run(2);
  HandRun b = a;
  b.config = R"({"recorder": "ampscope.torch"})";
  for (OpRow& r : a.ops) {
    if (r.phase == Phase::backward && r.module == "fc2") {
      r.shape = "[16]";
      r.health.numel = 16;
      r.health.rms *= 5;
    }
    if (r.phase == Phase::forward && r.module == "fc1") r.shape = "[128]";
  }
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_EQ(d.ops_aligned, 2 * static_cast<std::int64_t>(kStep.size()));
  ASSERT_EQ(d.different_tensors.size(), 1u);
  const DifferentTensors& x = d.different_tensors[0];
  EXPECT_EQ(x.phase, Phase::backward);
  EXPECT_EQ(x.module, "fc2");
  EXPECT_EQ(x.op, "linear");
  EXPECT_EQ(x.shape_a, "[16]");
  EXPECT_EQ(x.shape_b, "[8, 16]");
  EXPECT_EQ(x.count, 2);
  EXPECT_EQ(x.first_step, 0);
  EXPECT_NE(analysis::render_text(d).find("the backward of linear in fc2: a [16], b [8, 16] (2 rows, from step 0)"),
            std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(analysis::render_json(d)).at("different_tensors").at(0).at("shape_a"), "[16]");
  // Two runs of one producer: the same key is the same tensor, and a size that differs is judged.
  b.config = "{}";
  Pair same(a, b);
  const DiffReport s = same.diff();
  EXPECT_TRUE(s.different_tensors.empty());
  ASSERT_TRUE(s.first_divergence.has_value());
  EXPECT_EQ(s.first_divergence->key.module, "fc2");
  EXPECT_EQ(s.first_divergence->key.phase, Phase::backward);
}

TEST(diff_test, the_first_divergence_names_the_ops_without_a_partner_before_it_in_its_module) {
  // Step 2 of b runs gelu where a runs the first relu in `act`: b's only relu that step (seq 3) then meets a's
  // first (seq 1), whose statistics differ (rms 0.5 + 0.1 seq + 0.01 step: 0.62 against 0.82, 0.2 / 0.82 of the
  // largest = 0.24 > 0.2); a's second relu has no partner, and it ran after the divergent row.
  const HandRun a = make_run(4);
  HandRun b = a;
  b.op(2, 1).op = "gelu";
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  ASSERT_TRUE(d.first_divergence.has_value());
  const OpDiff& f = *d.first_divergence;
  EXPECT_EQ(f.key.step, 2);
  EXPECT_EQ(f.key.module, "act");
  EXPECT_EQ(f.key.op, "relu");
  EXPECT_EQ(f.seq_a, 1);
  EXPECT_EQ(f.seq_b, 3);
  EXPECT_NEAR(f.rel_rms, 0.2 / 0.82, 1e-12);
  EXPECT_TRUE(f.unpaired_before_a.empty());
  EXPECT_EQ(f.unpaired_before_b, (std::vector<std::string>{"gelu"}));
  EXPECT_NE(analysis::render_text(d).find("before it in act, ops without a partner: a none; b gelu"), std::string::npos);
  const auto doc = nlohmann::json::parse(analysis::render_json(d));
  EXPECT_EQ(doc.at("first_divergence").at("unpaired_before_b"), nlohmann::json::array({"gelu"}));
  // The ones after it or in other modules are not named: a's second relu (seq 3) came after.
  Pair reversed(b, a);
  const DiffReport r = reversed.diff();
  ASSERT_TRUE(r.first_divergence.has_value());
  EXPECT_EQ(r.first_divergence->seq_a, 3);
  EXPECT_EQ(r.first_divergence->unpaired_before_a, (std::vector<std::string>{"gelu"}));
  EXPECT_TRUE(r.first_divergence->unpaired_before_b.empty());
}

TEST(diff_test, loss_curves_cover_every_step_of_either_run) {
  HandRun a = make_run(6);
  HandRun b = make_run(4);
  b.steps[2].loss = a.steps[2].loss * 1.5;
  // A skip at a scale step 0 ran at unskipped: the gradients grew (not the scaler calibrating), so the
  // steps still pair by number (see a_calibration_skip_in_one_run_pairs_the_steps_by_optimizer_update).
  b.steps[0].scale = 1024;
  b.steps[1].scale = 1024;
  b.steps[1].skipped = true;
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.aligned_by_update);
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
  // Step 2: |l - 1.5 l| against the largest loss so far, b's 1.5 l = 2.7 (above step 0's 2.0).
  EXPECT_NEAR(d.losses[2].rel, (1.5 * 1.8 - 1.8) / (1.5 * 1.8), 1e-12);
  // Step 1 (equal losses, before the plant): 0.
  EXPECT_EQ(d.losses[1].rel, 0.0);
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
  b.op(1, 4).health.mean += 0.5;  // mean 0.04 -> 0.54, against an rms of 0.81
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
  // The mean against the op's largest rms so far: 0.5 + 0.1 * 3 + 0.01 * step, at step 1 0.81.
  EXPECT_NEAR(f.rel_mean, 0.5 / 0.81, 1e-12);
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
  EXPECT_EQ(diffs[3].max_rel, 0.0);  // absmax is reported, not judged: one element
  EXPECT_EQ(diffs[2].max_rel, 0.0);
  // A mean near 0 is measured against the rms (0.5 for seq 0): |1e-9 - 2e-9| / 0.5, not 1 (its own scale).
  std::vector<OpRow> tiny_a = {a[0]}, tiny_b = {a[0]};
  tiny_a[0].health.mean = 1e-9;
  tiny_b[0].health.mean = 2e-9;
  EXPECT_NEAR(diff_ops(tiny_a, tiny_b)[0].rel_mean, 1e-9 / 0.5, 1e-18);
  // A floor above the magnitudes replaces them: 1e-9 / 10.
  EXPECT_NEAR(diff_ops(tiny_a, tiny_b, {.floor = 10})[0].rel_mean, 1e-9 / 10, 1e-20);
}

TEST(diff_test, refuses_a_block_size_below_one_row) {
  const HandRun run = make_run(1);
  Pair pair(run, run);
  EXPECT_THROW_MSG(pair.diff({.rows_per_read = 0}), Error, "rows_per_read must be at least 1, got 0", "hint:");
}

// ---- scale-aware comparison, gradients, rows outside steps, saturation, exact zeros ----

// b: a's run under a GradScaler: each step's scale (65536 for steps 0-2, then 32768, as after a back-off),
// every backward row's magnitudes multiplied by it, as a scaled backward records them.
HandRun scaled_copy(const HandRun& a) {
  HandRun b = a;
  b.precision = "fp16";
  for (StepRow& s : b.steps) {
    s.scale = s.step < 3 ? 65536.0 : 32768.0;
    s.scale_after = s.step < 2 ? 65536.0 : 32768.0;
  }
  for (OpRow& r : b.ops) {
    if (r.phase != Phase::backward) continue;
    const double scale = r.step < 3 ? 65536.0 : 32768.0;
    for (double* x : {&r.health.min, &r.health.max, &r.health.absmax, &r.health.mean, &r.health.rms}) *x *= scale;
  }
  return b;
}

TEST(diff_test, a_scaled_backward_matches_the_unscaled_one_exactly_after_division_by_each_steps_scale) {
  const HandRun a = make_run();
  const HandRun b = scaled_copy(a);
  // Compared as recorded (scale 1 for both), every backward row is 65536 times larger: rms differs by
  // 1 - 1/65536 of the larger. This is what the diff must not do.
  const std::vector<OpRow> step0_a(a.ops.begin(), a.ops.begin() + 11), step0_b(b.ops.begin(), b.ops.begin() + 11);
  const std::vector<OpDiff> raw = diff_ops(step0_a, step0_b);
  EXPECT_NEAR(raw[6].rel_rms, 1 - 1 / 65536.0, 1e-12);
  // With the step's scales, nothing differs at all: the division by a power of two is exact.
  for (const OpDiff& o : diff_ops(step0_a, step0_b, {}, 1, 65536)) {
    EXPECT_EQ(o.max_rel, 0.0) << o.key.op;
    EXPECT_EQ(o.rel_absmax, 0.0) << o.key.op;
  }
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_TRUE(d.largest.empty());  // every max_rel is exactly 0
  EXPECT_EQ(d.ops_aligned, 66);
  EXPECT_EQ(d.losses[4].scale_b, 32768.0);

  // A divergence planted on top of the scaling is found, at its step and op, measured after the division:
  // b's backward linear in fc2 at step 4 (seq 8) has 1.5 times the rms: 1 - 1/1.5 of the larger.
  HandRun planted = b;
  planted.op(4, 8).health.rms *= 1.5;
  Pair pair2(a, planted);
  const DiffReport d2 = pair2.diff();
  ASSERT_TRUE(d2.first_divergence.has_value());
  const OpDiff& f = *d2.first_divergence;
  EXPECT_EQ(f.key.step, 4);
  EXPECT_EQ(f.key.phase, Phase::backward);
  EXPECT_EQ(f.key.module, "fc2");
  EXPECT_EQ(f.seq_a, 8);
  EXPECT_EQ(f.stat, "rms");
  EXPECT_EQ(f.scale_a, 1.0);
  EXPECT_EQ(f.scale_b, 32768.0);
  const double rms = 0.5 + 0.1 * 8 + 0.01 * 4;  // make_op's rms of seq 8 at step 4
  EXPECT_EQ(f.a.rms, rms);
  EXPECT_EQ(f.b.rms, 1.5 * rms);  // as compared: divided by 32768
  EXPECT_NEAR(f.rel_rms, 1 - 1 / 1.5, 1e-12);
}

void scale_backward(OpRow& r, double scale) {
  if (r.phase != Phase::backward) return;
  for (double* x : {&r.health.min, &r.health.max, &r.health.absmax, &r.health.mean, &r.health.rms}) *x *= scale;
}

// An f16 run whose GradScaler skipped step 0 while calibrating (scale 65536 overflowed the backward, 32768
// did not), against an f32 run of the same model and data: a's step s + 1 starts from the parameters b's
// step s started from, so its rows are b's step s rows (backward ones times 32768).
HandRun calibrating_copy(const HandRun& b) {
  HandRun a;
  a.precision = "fp16";
  StepRow first = b.steps.front();
  first.skipped = true;
  first.found_inf = true;
  first.scale = 65536;
  first.scale_after = 32768;
  a.steps.push_back(first);
  for (std::size_t i = 0; i < kStep.size(); ++i) {
    OpRow r = make_op(0, static_cast<std::int64_t>(i), kStep[i]);
    scale_backward(r, 65536);
    if (r.phase == Phase::backward) r.health.pos_inf = 3;  // the scaled gradients overflowed
    a.ops.push_back(r);
  }
  for (StepRow s : b.steps) {
    s.step += 1;
    s.scale = s.scale_after = 32768;
    a.steps.push_back(s);
  }
  for (OpRow r : b.ops) {
    r.step += 1;
    scale_backward(r, 32768);
    a.ops.push_back(r);
  }
  return a;
}

TEST(diff_test, a_calibration_skip_in_one_run_pairs_the_steps_by_optimizer_update) {
  const HandRun b = make_run();  // steps 0..5
  const HandRun a = calibrating_copy(b);  // steps 0..6, step 0 skipped
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_TRUE(d.aligned_by_update);
  EXPECT_EQ(d.calibration_skips_a, (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(d.calibration_skips_b.empty());
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_FALSE(d.first_loss_divergence.has_value());
  EXPECT_TRUE(d.largest.empty());   // every pair equal after dividing by the scales
  EXPECT_EQ(d.ops_aligned, 66);     // a's steps 1..6 with b's 0..5; a's step 0 set aside
  EXPECT_TRUE(d.steps_only_in_a.empty());
  EXPECT_TRUE(d.steps_only_in_b.empty());
  for (const LossPoint& p : d.losses) {
    if (p.in_a && p.in_b) {
      EXPECT_EQ(p.step_b, p.step - 1);
    }
  }

  // A divergence planted in b's step 3 is found at a's step 4, with b's own step named.
  HandRun planted = b;
  planted.op(3, 2).health.rms *= 1.5;  // linear in fc2, forward
  Pair pair2(a, planted);
  const DiffReport d2 = pair2.diff();
  ASSERT_TRUE(d2.first_divergence.has_value());
  EXPECT_EQ(d2.first_divergence->key.step, 4);
  EXPECT_EQ(d2.first_divergence->step_b, 3);
  EXPECT_EQ(d2.first_divergence->key.module, "fc2");
  EXPECT_NEAR(d2.first_divergence->rel_rms, 1 - 1 / 1.5, 1e-12);
  const std::string text = render_text(d2);
  EXPECT_EQ(text.rfind("PAIRED BY UPDATE: the GradScaler skipped steps while its scale calibrated: run a step 0, run b "
                       "none (not compared).",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("FIRST DIVERGENCE: step 4 (b's step 3), linear in fc2"), std::string::npos) << text;
}

TEST(diff_test, a_skip_with_a_non_finite_loss_is_not_calibration_and_steps_pair_by_number) {
  const HandRun b = make_run();
  HandRun a = calibrating_copy(b);
  a.steps.front().loss = std::numeric_limits<double>::quiet_NaN();  // the forward pass broke: an anomaly
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.aligned_by_update);
  EXPECT_TRUE(d.calibration_skips_a.empty());
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 0);
  EXPECT_EQ(d.first_divergence->step_b, 0);
  EXPECT_EQ(d.first_divergence->stat, "nonfinite");
}

TEST(diff_test, a_step_without_a_steps_row_is_divided_by_the_scale_the_step_before_left_or_not_at_all) {
  // Both writers stopped inside step 6 (its op rows, no /steps row): its backward used the scale step 5
  // left (scale_after: 32768 in b, 1 in a).
  HandRun a = make_run(6);
  HandRun b = scaled_copy(a);
  for (std::size_t i = 0; i < kStep.size(); ++i) {
    OpRow r = make_op(6, static_cast<std::int64_t>(i), kStep[i]);
    a.outside.push_back(r);
    scale_backward(r, 32768.0);
    b.outside.push_back(r);
  }
  a.outside_after = b.outside_after = 5;
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_TRUE(d.largest.empty());
  EXPECT_EQ(d.ops_aligned, 7 * 11);  // step 6 compared too
  EXPECT_EQ(d.steps_compared, 6);

  // Stopped inside step 0: no step says what scale b's backward used, so its magnitudes are not compared
  // (its NaN/inf counts still are); the forward is.
  HandRun a0, b0;
  for (std::size_t i = 0; i < kStep.size(); ++i) {
    OpRow r = make_op(0, static_cast<std::int64_t>(i), kStep[i]);
    a0.outside.push_back(r);
    scale_backward(r, 65536.0);
    b0.outside.push_back(r);
  }
  a0.outside_after = b0.outside_after = -1;
  Pair pair0(a0, b0);
  const DiffReport d0 = pair0.diff();
  EXPECT_EQ(d0.ops_aligned, 11);
  EXPECT_FALSE(d0.first_divergence.has_value());
  b0.outside[8].health.pos_inf = 1;
  Pair inf0(a0, b0);
  const DiffReport i0 = inf0.diff();
  ASSERT_TRUE(i0.first_divergence.has_value());
  EXPECT_EQ(i0.first_divergence->seq_a, 8);
  EXPECT_EQ(i0.first_divergence->stat, "nonfinite");
  EXPECT_FALSE(i0.first_divergence->magnitudes_compared);
  EXPECT_TRUE(std::isnan(i0.first_divergence->scale_b));
}

TEST(diff_test, rows_outside_steps_are_neither_steps_nor_divergences) {
  HandRun a = make_run();
  HandRun b = a;
  // An evaluation forward pass after step 2 (step -1): in b it holds NaN and other magnitudes, and one op
  // more than in a. None of it may become a "step -1" divergence, a step or an unmatched op.
  for (std::size_t i = 0; i < 6; ++i) {
    OpRow r = make_op(-1, static_cast<std::int64_t>(i), kStep[i]);
    a.outside.push_back(r);
    r.health.rms *= 10;
    if (i == 4) r.health.nan = 7;
    b.outside.push_back(r);
  }
  b.outside.push_back(make_op(-1, 6, {Phase::forward, "softmax", ""}));
  a.outside_after = b.outside_after = 2;
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  EXPECT_FALSE(d.first_divergence.has_value());
  EXPECT_FALSE(d.diverged());
  EXPECT_EQ(d.rows_outside_steps_a, 6);
  EXPECT_EQ(d.rows_outside_steps_b, 7);
  EXPECT_EQ(d.steps_compared, 6);
  EXPECT_EQ(d.ops_aligned, 66);
  EXPECT_TRUE(d.only_in_b.empty());
  EXPECT_TRUE(d.steps_only_in_a.empty());
  EXPECT_TRUE(d.steps_only_in_b.empty());
  ASSERT_EQ(d.losses.size(), 6u);
  EXPECT_EQ(d.losses.front().step, 0);
  for (const OpDiff& o : d.largest) EXPECT_GE(o.key.step, 0);
}

// Gradients of two parameters per step: norm 1 + 0.1 step (+1 for the bias), absmax a tenth of it.
void add_grads(HandRun& run, double scale, bool scaled_row, bool unscaled_row) {
  for (const StepRow& s : run.steps) {
    for (const char* param : {"fc1.weight", "fc1.bias"}) {
      GradRow g;
      g.step = s.step;
      g.param = param;
      g.dtype = "f32";
      g.norm = 1.0 + 0.1 * static_cast<double>(s.step) + (std::string(param) == "fc1.bias" ? 1.0 : 0.0);
      g.absmax = g.norm / 10;
      if (scaled_row) {
        GradRow x = g;
        x.norm *= scale;
        x.absmax *= scale;
        x.unscaled = false;
        run.grads.push_back(x);
      }
      if (unscaled_row) {
        g.unscaled = true;
        run.grads.push_back(g);
      }
    }
  }
}

TEST(diff_test, gradients_are_compared_after_unscaling_or_divided_by_the_scale) {
  HandRun a = make_run();
  add_grads(a, 1, false, true);  // no scaler: one row per parameter, after "unscale"
  HandRun both = scaled_copy(a);  // a GradScaler's run: the scaled row, then the unscaled one
  both.grads.clear();
  HandRun only_scaled = both;
  for (HandRun* run : {&both, &only_scaled}) {
    for (const StepRow& s : run->steps) {
      HandRun one;
      one.steps = {s};
      add_grads(one, s.scale, true, run == &both);
      run->grads.insert(run->grads.end(), one.grads.begin(), one.grads.end());
    }
  }
  for (const HandRun* b : {&both, &only_scaled}) {
    Pair pair(a, *b);
    const DiffReport d = pair.diff();
    EXPECT_EQ(d.grads_aligned, 12);
    EXPECT_FALSE(d.first_grad_divergence.has_value());
    EXPECT_FALSE(d.diverged());
  }
  // b's fc1.bias gradient at step 3 twice as large (after unscale_): its norm 2 (1 + 0.3 + 1) against the
  // largest so far, b's: |n - 2n| / 2n = 0.5.
  HandRun planted = both;
  for (GradRow& g : planted.grads) {
    if (g.step == 3 && g.param == "fc1.bias" && g.unscaled) g.norm *= 2;
  }
  Pair pair(a, planted);
  const DiffReport d = pair.diff();
  ASSERT_TRUE(d.first_grad_divergence.has_value());
  EXPECT_EQ(d.first_grad_divergence->step, 3);
  EXPECT_EQ(d.first_grad_divergence->param, "fc1.bias");
  EXPECT_EQ(d.first_grad_divergence->stat, "norm");
  EXPECT_NEAR(d.first_grad_divergence->rel_norm, 0.5, 1e-12);
  EXPECT_TRUE(d.diverged());
  EXPECT_FALSE(d.first_divergence.has_value());
  // An inf in one run's gradient is a divergence whatever the threshold.
  HandRun inf = both;
  for (GradRow& g : inf.grads) {
    if (g.step == 1 && g.param == "fc1.weight") g.pos_inf = 2;
  }
  Pair pair3(a, inf);
  const DiffReport d3 = pair3.diff({.threshold = 1e300});
  ASSERT_TRUE(d3.first_grad_divergence.has_value());
  EXPECT_EQ(d3.first_grad_divergence->step, 1);
  EXPECT_EQ(d3.first_grad_divergence->stat, "nonfinite");
}

OpRow unit_op(std::int64_t step, std::int64_t seq, const char* op, double min, double max) {
  OpRow r = make_op(step, seq, {Phase::forward, op, "head"});
  r.health.min = min;
  r.health.max = max;
  r.health.absmax = std::max(std::fabs(min), std::fabs(max));
  r.health.mean = (min + max) / 2;
  r.health.rms = r.health.absmax / 2;
  return r;
}

// Both runs end each step's forward with `op` in "head"; b's at `step` is `pinned` instead.
DiffReport diff_with_head(const char* op, double min, double max, const OpRow& pinned, std::int64_t step) {
  HandRun a = make_run();
  for (std::int64_t s = 0; s < 6; ++s) a.ops.push_back(unit_op(s, 11, op, min, max));
  HandRun b = a;
  b.op(step, 11) = pinned;
  Pair pair(a, b);
  return pair.diff();
}

TEST(diff_test, an_output_pinned_at_the_end_of_its_open_range_in_one_run_is_saturation) {
  // A sigmoid whose largest value is exactly 1 in b (f16 rounds 1 - 2^-12 and above to 1) and 0.9997 in a:
  // the statistics agree within 0.03%, yet 1 - s is 0 in b only.
  OpRow sat = unit_op(2, 11, "sigmoid", 0.01, 1.0);
  DiffReport d = diff_with_head("sigmoid", 0.01, 0.9997, sat, 2);
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 2);
  EXPECT_EQ(d.first_divergence->key.op, "sigmoid");
  EXPECT_EQ(d.first_divergence->stat, "saturation");
  EXPECT_EQ(d.first_divergence->pins_a, 0u);
  EXPECT_EQ(d.first_divergence->pins_b, kPinUpper);
  EXPECT_EQ(d.first_divergence->max_rel, 1.0);
  EXPECT_LT(d.first_divergence->rel_rms, 0.001);

  // Softmax probabilities at exactly 0 (exact zeros) in b only.
  OpRow zero = unit_op(4, 11, "softmax", 0.0, 0.5);
  zero.health.zero = 3;
  d = diff_with_head("softmax", 1e-9, 0.5, zero, 4);
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 4);
  EXPECT_EQ(d.first_divergence->stat, "saturation");
  EXPECT_EQ(d.first_divergence->pins_b, kPinLower);

  // tanh at exactly -1.
  d = diff_with_head("tanh", -0.999, 0.5, unit_op(1, 11, "tanh", -1.0, 0.5), 1);
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 1);
  EXPECT_EQ(d.first_divergence->pins_b, kPinLower);

  // An f16 output at exactly 65504 (a clamp hiding an overflow) in b only, any op.
  OpRow clamp = unit_op(3, 11, "clamp", -2.0, 65504.0);
  clamp.out_dtype = "f16";
  d = diff_with_head("clamp", -2.0, 65000.0, clamp, 3);
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 3);
  EXPECT_EQ(d.first_divergence->pins_b, kPinDtypeMax);

  // Both runs at the boundary, or an op whose range is not open (relu reaching 1): no divergence.
  d = diff_with_head("sigmoid", 0.01, 1.0, unit_op(2, 11, "sigmoid", 0.01, 1.0), 2);
  EXPECT_FALSE(d.first_divergence.has_value());
  d = diff_with_head("exp", 0.5, 0.9997, unit_op(2, 11, "exp", 0.5, 1.0), 2);
  EXPECT_FALSE(d.first_divergence.has_value());
}

TEST(diff_test, new_exact_zeros_name_a_divergence_only_when_the_zeroed_values_mattered) {
  HandRun a = make_run();
  // b: at step 3, the first relu's output became all zeros (a layer silently zeroed): rms 0.
  HandRun b = a;
  OpRow& zeroed = b.op(3, 1);
  zeroed.health.zero = zeroed.health.numel;
  zeroed.health.min = zeroed.health.max = zeroed.health.absmax = zeroed.health.mean = zeroed.health.rms = 0;
  Pair pair(a, b);
  const DiffReport d = pair.diff();
  ASSERT_TRUE(d.first_divergence.has_value());
  EXPECT_EQ(d.first_divergence->key.step, 3);
  EXPECT_EQ(d.first_divergence->seq_a, 1);
  EXPECT_EQ(d.first_divergence->stat, "zeros");
  EXPECT_EQ(d.first_divergence->rel_zeros, 1.0);  // 0 of 128 against 128 of 128
  EXPECT_EQ(d.first_divergence->rel_rms, 1.0);

  // Half the values flushed to 0, but they were too small to move the rms (0.1%): not a divergence.
  HandRun c = a;
  c.op(3, 1).health.zero = 64;
  c.op(3, 1).health.rms *= 0.999;
  Pair flushed(a, c);
  const DiffReport f = flushed.diff();
  EXPECT_FALSE(f.first_divergence.has_value());
  ASSERT_FALSE(f.largest.empty());
  EXPECT_EQ(f.largest.front().rel_zeros, 0.5);
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
