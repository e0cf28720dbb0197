// `ampscope train --ddp` on the process group (cli/run.cpp, core/distributed/data_parallel.h): the run with N
// ranks and global batch B against the one-process run with batch B, computed by every rank itself as the
// reference; the gradient all-reduce's buckets and values; the GradScaler's found_inf agreement; ranks
// started differently or with a batch that does not split refuse together. Under the single-process
// group (distributed_single) the "data-parallel" run is the one-process run, bit for bit.
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/distributed/data_parallel.h"
#include "core/error.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "probes/trace/reader.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "tests/distributed/distributed_test_support.h"

namespace ampscope {
namespace {

using testing::Case;
using testing::small_run;

using samples::Precision;
using samples::TrainConfig;
using samples::TrainResult;
using testing::shared_temp_folder;
using testing::test_group;

// ---- the gradient all-reduce ----

TEST(gradient_all_reducer, buckets_take_parameters_in_reverse_order_until_the_cap) {
  ProcessGroup& g = test_group();
  // f32 parameters of 10, 3, 6 and 2 elements (40, 12, 24, 8 bytes); cap 30 bytes. Reverse order: p3 (8 B:
  // open), p2 (8 < 30: joins, 32 B), p1 (32 >= 30: a new bucket, 12 B), p0 (12 < 30: joins, 52 B).
  std::vector<Tensor> params = {zeros({10}), zeros({3}), zeros({2, 3}), zeros({2})};
  GradientAllReducer reducer(g, params, 30);
  const std::vector<std::vector<std::size_t>> want = {{3, 2}, {1, 0}};
  EXPECT_EQ(reducer.buckets(), want);
  // One parameter larger than the cap is a bucket of its own; the default cap holds all four in one.
  EXPECT_EQ(GradientAllReducer(g, params, 4).buckets(), (std::vector<std::vector<std::size_t>>{{3}, {2}, {1}, {0}}));
  EXPECT_EQ(GradientAllReducer(g, params).buckets(), (std::vector<std::vector<std::size_t>>{{3, 2, 1, 0}}));
  EXPECT_THROW(GradientAllReducer(g, params, 0), Error);
}

TEST(gradient_all_reducer, every_rank_ends_with_the_mean_of_the_ranks_gradients) {
  ProcessGroup& g = test_group();
  const int n = g.size(), r = g.rank();
  // Rank r's gradient element k is (r + 1) * (k + 1): the mean over ranks is (k + 1) * (n + 1) / 2, exact in
  // f32 for these small integers and halves. A parameter without a gradient stays without one.
  std::vector<Tensor> params = {zeros({5}), zeros({2, 2}), zeros({3}), zeros({4})};
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (p == 2) continue;
    Tensor grad = Tensor::empty(params[p].shape());
    for (std::int64_t k = 0; k < grad.numel(); ++k) grad.data_as<float>()[k] = static_cast<float>((r + 1) * (k + 1));
    params[p].set_grad(grad);
  }
  GradientAllReducer reducer(g, params, 16);  // several buckets
  reducer.all_reduce();
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (p == 2) {
      EXPECT_FALSE(params[p].grad().defined());
      continue;
    }
    const std::vector<double> got = params[p].grad().values();
    ASSERT_EQ(got.size(), static_cast<std::size_t>(params[p].numel()));
    for (std::size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], (k + 1) * (n + 1) / 2.0) << "parameter " << p;
  }
}

// ---- the GradScaler's found_inf over the group ----

// The sharded case, where ranks' gradients differ after backward (no all-reduce of the gradients): only
// the last rank's gradient holds inf. With the group, every rank's scaler skips the step and halves the
// scale (PyTorch's ShardedGradScaler); without it, only the last rank would.
TEST(grad_scaler_group, one_ranks_overflow_skips_the_step_on_every_rank) {
  ProcessGroup& g = test_group();
  const bool last = g.rank() == g.size() - 1;
  for (const bool with_group : {true, false}) {
    Tensor w = ones({3});
    w.requires_grad_(true);
    optim::SGD opt({w}, optim::OptimizerOptions{.lr = 0.5});
    GradScaler scaler(GradScalerOptions{.device = "cpu", .init_scale = 4.0, .process_group = with_group ? &g : nullptr});
    Tensor loss = sum(w);
    scaler.scale(loss).backward();  // grad = 4 (the scale) per element
    if (last) w.grad().data_as<float>()[1] = INFINITY;
    const bool stepped = scaler.step(opt);
    scaler.update();
    const bool want_skip = with_group ? g.size() > 1 || last : last;
    EXPECT_EQ(stepped, !want_skip) << "with group " << with_group;
    EXPECT_EQ(scaler.get_scale(), want_skip ? 2.0 : 4.0) << "with group " << with_group;
    // A step moves each weight by lr * 1 (the unscaled gradient): 1 - 0.5.
    EXPECT_EQ(w.values(), std::vector<double>(3, want_skip ? 1.0 : 0.5)) << "with group " << with_group;
  }
}

// ---- training: N ranks with global batch B against one process with batch B ----

// The global loss of a data-parallel step: the mean of the ranks' losses (each the mean over its share).
std::vector<double> global_losses(ProcessGroup& g, const std::vector<double>& mine) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(mine.size())}, {.dtype = DType::f64});
  for (std::size_t i = 0; i < mine.size(); ++i) t.data_as<double>()[i] = mine[i];
  g.all_reduce(t);
  std::vector<double> out = t.values();
  for (double& v : out) v /= g.size();
  return out;
}

class ddp_training : public ::testing::TestWithParam<Case> {};

TEST_P(ddp_training, ranks_follow_the_one_process_loss_trajectory_and_skip_together) {
  ProcessGroup& g = test_group();
  const Case& param = GetParam();
  // Two ranks are what the issue asks for; three (distributed_mpi_np3) oversubscribe CI's two cores so much
  // (MPI's waiting ranks spin) that the cnn and transformer runs take minutes: there, the mlp only.
  if (g.size() > 2 && param.sample != "mlp") GTEST_SKIP() << "cnn and transformer run with 1 and 2 ranks";
  const TrainConfig one_config = small_run(param.sample, param.precision);
  const TrainResult one = samples::train(one_config);
  TrainConfig ddp_config = one_config;
  ddp_config.process_group = &g;
  const TrainResult many = samples::train(ddp_config);
  ASSERT_EQ(many.losses.size(), one.losses.size());
  const std::vector<double> global = global_losses(g, many.losses);

  if (g.size() == 1) {  // the single-process group changes nothing
    EXPECT_EQ(many.losses, one.losses);
    EXPECT_EQ(many.scales, one.scales);
    return;
  }
  // Skip decisions and scales: the same (every rank's scaler sees the same reduced gradients; a skip is a
  // non-finite gradient, which the reduction order cannot create or remove at these magnitudes).
  EXPECT_EQ(many.scales, one.scales);
  EXPECT_EQ(many.skipped, one.skipped);
  // Every rank records the same scales (they decide together).
  Tensor scales = Tensor::empty({static_cast<std::int64_t>(many.scales.size())}, {.dtype = DType::f64});
  for (std::size_t i = 0; i < many.scales.size(); ++i) scales.data_as<double>()[i] = many.scales[i];
  Tensor rank0 = scales.clone();
  g.broadcast(rank0, 0);
  EXPECT_EQ(rank0.values(), scales.values());

  // Tolerance. The two runs compute the same exact quantities with the additions in another order: the
  // loss mean (B terms in one sum, against B/N terms per rank and N per-rank means), the weight gradients'
  // sums over the batch (one inner product of length B in the backward matmul, against N of length B/N
  // plus the all-reduce's N - 1 additions), and the 1/B against 1/(B/N) and 1/N scalings. At step 0 the
  // parameters are equal, so the losses differ only by the loss mean's order: at most 2 (B + N) u |L|
  // relative, u = 2^-24, first order (the per-row forward is the same computation in both runs). The
  // gradients differ by at most 2 (c + B + N) u relative (c = 64 roundings per term, gradient_test.cpp),
  // and AdamW's update m / (sqrt(v) + eps) carries that relative change (m and sqrt(v) both scale with the
  // gradient), so after the first step the parameters differ by about lr * 2 (c + B + N) u per step. In
  // f32 that moves the next losses by the same order; in f16/bf16 a change that small can still move a
  // value across a rounding boundary of the lower precision, changing it by one unit in the last place
  // (u_low = 2^-11 for f16, 2^-8 for bf16) relative; the loss, a mean of many such values, moves by at
  // most u_low |L| per flipped value's share, bounded by u_low |L| overall (every value flipping at once).
  // So: step 0 within 2 (B + N) u |L|; later steps within (2 (c + B + N) u + u_low) |L| per step taken.
  const double u = std::ldexp(1.0, -24), b = static_cast<double>(one_config.batch), n = g.size();
  const double u_low = param.precision == Precision::fp16   ? std::ldexp(1.0, -11)
                       : param.precision == Precision::bf16 ? std::ldexp(1.0, -8)
                                                            : 0.0;
  for (std::size_t s = 0; s < one.losses.size(); ++s) {
    const double tolerance = s == 0 ? 2 * (b + n) * u * std::fabs(one.losses[s])
                                    : s * (2 * (64 + b + n) * u + u_low) * std::fabs(one.losses[s]);
    EXPECT_NEAR(global[s], one.losses[s], tolerance) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(samples, ddp_training,
                         ::testing::Values(Case{"mlp", Precision::fp32}, Case{"mlp", Precision::fp16},
                                           Case{"mlp", Precision::bf16}, Case{"cnn", Precision::fp32},
                                           Case{"cnn", Precision::fp16}, Case{"cnn", Precision::bf16},
                                           Case{"transformer", Precision::fp32},
                                           Case{"transformer", Precision::fp16},
                                           Case{"transformer", Precision::bf16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.sample + "_" + std::string(samples::precision_name(info.param.precision));
                         });

// ---- resume ----

// Four steps at once against two steps, a checkpoint, and two steps resumed from it, every rank resuming
// from the checkpoint rank 0 wrote: the same losses and scales, bit for bit (fp16, so the GradScaler's
// state travels too).
TEST(ddp_resume, ranks_resumed_from_rank_0s_checkpoint_continue_bit_for_bit) {
  ProcessGroup& g = test_group();
  const std::filesystem::path dir = shared_temp_folder(g, "ddp");
  TrainConfig c = small_run("mlp", Precision::fp16);
  c.process_group = &g;
  c.steps = 4;
  const TrainResult whole = samples::train(c);
  TrainConfig first = c;
  first.steps = 2;
  first.checkpoint = (dir / "ck.h5").string();
  const TrainResult a = samples::train(first);
  TrainConfig second = c;
  second.steps = 2;
  second.resume = first.checkpoint;
  const TrainResult b = samples::train(second);
  std::vector<double> losses = a.losses, scales = a.scales;
  losses.insert(losses.end(), b.losses.begin(), b.losses.end());
  scales.insert(scales.end(), b.scales.begin(), b.scales.end());
  EXPECT_EQ(losses, whole.losses);
  EXPECT_EQ(scales, whole.scales);
  g.barrier();  // every rank has read the checkpoint
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- rank-bad-batch: one rank's bad data ----

// The scenario's bad row (step 3) is the global batch's last, so with N ranks only the last rank's forward
// overflows: its trace's first origin is fc1's linear at step 3 and no other rank's trace has one; the
// inf reaches every rank's gradients through the all-reduce, so every rank skips step 3 (and only it).
TEST(ddp_scenario, rank_bad_batch_overflows_on_the_last_rank_and_every_rank_skips_step_3) {
  ProcessGroup& g = test_group();
  const std::filesystem::path dir = shared_temp_folder(g, "ddp");
  TrainConfig c;
  c.scenario = "rank-bad-batch";
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 5;
  c.batch = 12;
  c.out = (dir / "run.h5").string();
  c.process_group = &g;
  const TrainResult r = samples::train(c);
  const bool last = g.rank() == g.size() - 1;
  EXPECT_EQ(r.skipped, 1);
  ASSERT_EQ(r.scales.size(), 5u);
  EXPECT_EQ(r.scales[4], r.scales[3] / 2) << "step 3 skipped and the scale backed off";
  EXPECT_EQ(r.anomalies > 0, last) << "origins on rank " << g.rank();
  const std::string path = g.size() == 1 ? c.out : samples::rank_trace_path(c.out, g.rank());
  EXPECT_EQ(r.trace, path);
  trace::TraceReader reader(path);
  const trace::OpRow* first = nullptr;
  const std::vector<trace::OpRow> ops = reader.ops();
  for (const trace::OpRow& row : ops) {
    if (row.origin) {
      first = &row;
      break;
    }
  }
  if (last) {
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->step, 3);
    EXPECT_EQ(first->op, "linear");
    EXPECT_EQ(first->module, "fc1");
  } else {
    EXPECT_EQ(first, nullptr) << "rank " << g.rank() << " has an origin at step " << first->step;
  }

  // The multi-rank report, given every rank's trace or one name whose siblings it finds, names the rank of
  // the first origin and tells how the gradients' inf spread (rank 0 reads; the others wait).
  g.barrier();  // every trace is closed
  if (g.size() > 1 && g.rank() == 0) {
    std::vector<std::string> all;
    for (int r = 0; r < g.size(); ++r) all.push_back(samples::rank_trace_path(c.out, r));
    EXPECT_EQ(samples::rank_siblings({c.out}), all);
    EXPECT_EQ(samples::rank_siblings({all.back()}), all);
    EXPECT_EQ(samples::rank_siblings({all.front(), all.back()}), (std::vector<std::string>{all.front(), all.back()}));
    std::ostringstream out, err;
    samples::ReportRequest request;
    request.rank_traces = samples::rank_siblings({c.out});
    EXPECT_EQ(samples::run_report(request, out, err), samples::kExitFound) << err.str();
    const std::string text = out.str();
    const std::string last_rank = std::to_string(g.size() - 1);
    EXPECT_NE(text.find("first origin across ranks: rank " + last_rank + ": f16_overflow in fc1 at step 3"),
              std::string::npos) << text;
    // With each rank's gradients before the all-reduce in the traces, the sentence says which rank's broke: the
    // last rank's gradients held NaN before the all-reduce (all six of the mlp's: fc1, fc2, fc3, weight and
    // bias, in registration order), the others' were finite, and after it every rank's did.
    std::string finite;
    for (int r = 0; r + 1 < g.size(); ++r) finite += (r ? ", rank " : "rank ") + std::to_string(r) + "'s";
    EXPECT_NE(text.find("gradients at step 3: rank " + last_rank +
                        "'s gradient of fc1.weight (and 5 more) held NaN before the all-reduce (" + finite +
                        " were finite); after it every rank's did"),
              std::string::npos) << text;
    EXPECT_NE(text.find("parameters across ranks: the same on every rank after each of the 5 steps compared"),
              std::string::npos) << text;
    std::ostringstream json_out, json_err;
    request.json = true;
    EXPECT_EQ(samples::run_report(request, json_out, json_err), samples::kExitFound) << json_err.str();
    const nlohmann::json j = nlohmann::json::parse(json_out.str());
    ASSERT_EQ(j.at("nonfinite_gradients_before_all_reduce").size(), static_cast<std::size_t>(g.size()));
    for (int r = 0; r < g.size(); ++r) {
      const nlohmann::json& entry = j.at("nonfinite_gradients_before_all_reduce").at(r);
      EXPECT_EQ(entry.at("rank"), r);
      EXPECT_EQ(entry.at("parameters").size(), r == g.size() - 1 ? 6u : 0u) << entry.dump();
    }
    EXPECT_TRUE(j.at("parameter_drift").is_null()) << j.dump();
  }
  // Independently of the report, from the traces: at step 3 rank 0's own gradients before the all-reduce are
  // finite (one row per parameter), the last rank's are not, and after the all-reduce every rank's are not.
  if (g.size() > 1) {
    const std::vector<trace::GradRow> before = reader.grads(3, 4, trace::GradRows::before_all_reduce);
    ASSERT_EQ(before.size(), 6u) << "one row per parameter of the mlp on rank " << g.rank();
    std::int64_t nonfinite_before = 0;
    for (const trace::GradRow& row : before) {
      EXPECT_TRUE(row.before_all_reduce);
      EXPECT_FALSE(row.unscaled) << "fp16 with a GradScaler: the gradients before the all-reduce are still scaled";
      nonfinite_before += row.nan + row.pos_inf + row.neg_inf;
    }
    if (last) {
      EXPECT_GT(nonfinite_before, 0);
    } else {
      EXPECT_EQ(nonfinite_before, 0) << "rank " << g.rank() << "'s own gradients at step 3 are finite";
    }
    std::int64_t nonfinite_after = 0;
    for (const trace::GradRow& row : reader.grads(3, 4)) {
      EXPECT_FALSE(row.before_all_reduce);
      nonfinite_after += row.nan + row.pos_inf + row.neg_inf;
    }
    EXPECT_GT(nonfinite_after, 0) << "after the all-reduce rank " << g.rank() << "'s gradients hold the last rank's NaN";
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- parameter drift across ranks (/checksums) ----

// The checksums of every rank's trace, as step -> (parameter -> checksum).
std::map<std::int64_t, std::map<std::string, std::uint64_t>> checksums_of(const std::string& path) {
  trace::TraceReader reader(path);
  std::map<std::int64_t, std::map<std::string, std::uint64_t>> out;
  for (const trace::ChecksumRow& c : reader.checksums()) out[c.step][c.param] = c.checksum;
  return out;
}

// rank-drift moves every value of the last rank's fc2.weight up by one ulp as step 3 begins. The gradients are
// still averaged, so the other parameters stay identical; fc2.weight's checksum after steps 0 to 2 is the same on
// every rank and differs from step 3 on. The multi-rank report names the step and the parameter (exit status 1).
TEST(ddp_drift, rank_drift_is_reported_at_the_step_it_began_naming_the_parameter) {
  ProcessGroup& g = test_group();
  if (g.size() < 2) GTEST_SKIP() << "parameter checksums are recorded by data-parallel runs of 2 or more ranks";
  const std::filesystem::path dir = shared_temp_folder(g, "ddp");
  TrainConfig c;
  c.scenario = "rank-drift";
  c.device = "cpu";
  c.steps = 5;
  c.batch = 12;
  c.out = (dir / "run.h5").string();
  c.process_group = &g;
  const TrainResult r = samples::train(c);
  EXPECT_EQ(r.anomalies, 0);
  g.barrier();
  if (g.rank() == 0) {
    const auto reference = checksums_of(samples::rank_trace_path(c.out, 0));
    ASSERT_EQ(reference.size(), 5u) << "a checksum row set after every step";
    for (const auto& [step, sums] : reference) {
      EXPECT_EQ(sums.size(), 7u) << "six parameters and the combined checksum, step " << step;
    }
    for (int k = 1; k < g.size(); ++k) {
      const auto theirs = checksums_of(samples::rank_trace_path(c.out, k));
      ASSERT_EQ(theirs.size(), 5u);
      for (const auto& [step, sums] : reference) {
        for (const auto& [param, sum] : sums) {
          const bool drifted = k == g.size() - 1 && step >= 3 && (param == "fc2.weight" || param.empty());
          EXPECT_EQ(theirs.at(step).at(param) != sum, drifted) << "rank " << k << ", step " << step << ", '" << param << "'";
        }
      }
    }
    std::ostringstream out, err;
    samples::ReportRequest request;
    request.rank_traces = samples::rank_siblings({c.out});
    EXPECT_EQ(samples::run_report(request, out, err), samples::kExitFound) << err.str();
    EXPECT_NE(out.str().find("no NaN/Inf origin on any rank"), std::string::npos) << out.str();
    EXPECT_NE(out.str().find("parameters diverged across ranks at step 3: rank " + std::to_string(g.size() - 1) +
                             "'s fc2.weight differs from rank 0's; they differ after 2 of the 5 steps compared"),
              std::string::npos) << out.str();
    std::ostringstream json_out, json_err;
    request.json = true;
    EXPECT_EQ(samples::run_report(request, json_out, json_err), samples::kExitFound) << json_err.str();
    const nlohmann::json j = nlohmann::json::parse(json_out.str());
    EXPECT_EQ(j.at("checksums_recorded"), true);
    EXPECT_EQ(j.at("checksum_steps_compared"), 5);
    const nlohmann::json& drift = j.at("parameter_drift");
    EXPECT_EQ(drift.at("step"), 3);
    EXPECT_EQ(drift.at("reference_rank"), 0);
    EXPECT_EQ(drift.at("steps_differing"), 2);
    ASSERT_EQ(drift.at("ranks").size(), 1u);
    EXPECT_EQ(drift.at("ranks").at(0).at("rank"), g.size() - 1);
    EXPECT_EQ(drift.at("ranks").at(0).at("parameters"), nlohmann::json::array({"fc2.weight"}));
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(ddp_drift, a_healthy_run_reports_the_same_parameters_on_every_rank) {
  ProcessGroup& g = test_group();
  if (g.size() < 2) GTEST_SKIP() << "parameter checksums are recorded by data-parallel runs of 2 or more ranks";
  const std::filesystem::path dir = shared_temp_folder(g, "ddp");
  TrainConfig c;
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 4;
  c.batch = 12;
  c.out = (dir / "run.h5").string();
  c.process_group = &g;
  samples::train(c);
  g.barrier();
  if (g.rank() == 0) {
    std::ostringstream out, err;
    samples::ReportRequest request;
    request.rank_traces = samples::rank_siblings({c.out});
    EXPECT_EQ(samples::run_report(request, out, err), samples::kExitClean) << out.str() << err.str();
    EXPECT_NE(out.str().find("parameters across ranks: the same on every rank after each of the 4 steps compared"),
              std::string::npos) << out.str();
    EXPECT_EQ(out.str().find("diverged"), std::string::npos) << out.str();
    std::ostringstream json_out, json_err;
    request.json = true;
    EXPECT_EQ(samples::run_report(request, json_out, json_err), samples::kExitClean);
    const nlohmann::json j = nlohmann::json::parse(json_out.str());
    EXPECT_TRUE(j.at("parameter_drift").is_null());
    EXPECT_EQ(j.at("checksums_recorded"), true);
    EXPECT_EQ(j.at("checksum_steps_compared"), 4);
    EXPECT_TRUE(j.at("first_origin").is_null());
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// ---- refusals ----

TEST(ddp_refusals, ranks_started_with_different_options_refuse_naming_the_field_and_both_values) {
  ProcessGroup& g = test_group();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.process_group = &g;
  c.lr = g.rank() == g.size() - 1 ? 0.02 : 0.01;
  c.device = g.rank() == 0 ? "cpu" : "auto";  // rank-local: not compared (auto is the CPU here or a GPU)
  try {
    samples::train(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string want = "'lr' is 0.01 on rank 0 and 0.02 on rank " + std::to_string(g.size() - 1);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(ddp_refusals, a_batch_that_does_not_split_evenly_is_refused_on_every_rank) {
  ProcessGroup& g = test_group();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.process_group = &g;
  c.batch = 4 * g.size() + 1;
  try {
    samples::train(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string want = "--batch " + std::to_string(c.batch) + " does not split evenly over " +
                             std::to_string(g.size()) + " ranks";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ampscope
