// ZeRO-1 (`ampscope train --ddp --shard-optimizer`, core/distributed/zero_optimizer.h): the partition against PyTorch's
// sorted-greedy rule worked by hand; a sharded AdamW against the unsharded one on the same gradients (every
// rank's parameters and every state bit, fused and op-by-op paths), and each rank's state being its shard's
// only; training every sample in fp32/fp16/bf16 sharded against plain DDP, bit for bit (losses, scales,
// skips, and the checkpoint rank 0 writes: parameters and the whole optimizer state); resuming sharded and
// unsharded checkpoints either way, and on another number of ranks (accepted when --batch splits, with a
// warning; refused with a message naming both rank counts when it does not). Under the single-process group
// (distributed_single) sharding is the unsharded run.
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/io/checkpoint.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "core/distributed/zero_optimizer.h"
#include "kernels/cpu/fused_optim.h"
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

// Same dtype, shape and bytes (so -0 and +0, and NaN payloads, count as different).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return std::memcmp(x.data(), y.data(), static_cast<std::size_t>(x.numel()) * dtype_size(x.dtype())) == 0;
}

// ---- the partition ----

// PyTorch's _partition_parameters, worked by hand for groups {10, 3, 7, 7, 1} and {4, 12} (element counts):
// group 0 sorted largest first, equal counts in their order: 10 (#0), 7 (#2), 7 (#3), 3 (#1), 1 (#4).
//  2 ranks: 10 -> r0 [10, 0]; 7#2 -> r1 [10, 7]; 7#3 -> r1 [10, 14]; 3 -> r0 [13, 14]; 1 -> r0 [14, 14].
//           group 1 (the counts carry over): 12 -> r0 (a tie: the lower rank) [26, 14]; 4 -> r1 [26, 18].
//  3 ranks: 10 -> r0 [10, 0, 0]; 7#2 -> r1 [10, 7, 0]; 7#3 -> r2 [10, 7, 7]; 3 -> r1 [10, 10, 7];
//           1 -> r2 [10, 10, 8]; then 12 -> r2 [10, 10, 20]; 4 -> r0 (tie of r0 and r1) [14, 10, 20].
TEST(zero_partition, whole_parameters_largest_first_to_the_rank_with_the_fewest_elements) {
  const std::vector<std::vector<std::int64_t>> numels = {{10, 3, 7, 7, 1}, {4, 12}};
  EXPECT_EQ(partition_parameters(numels, 1), (std::vector<std::vector<int>>{{0, 0, 0, 0, 0}, {0, 0}}));
  EXPECT_EQ(partition_parameters(numels, 2), (std::vector<std::vector<int>>{{0, 0, 1, 1, 0}, {1, 0}}));
  EXPECT_EQ(partition_parameters(numels, 3), (std::vector<std::vector<int>>{{0, 1, 1, 2, 2}, {0, 2}}));
  // More ranks than parameters: the last ranks own nothing.
  EXPECT_EQ(partition_parameters({{5, 5}}, 4), (std::vector<std::vector<int>>{{0, 1}}));
  try {
    partition_parameters(numels, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "partition_parameters: 0 ranks; a group has at least one");
  }
}

// ---- a sharded optimizer against the unsharded one ----

// Parameters of 6x5, 5, 3x6 and 3 elements (two groups) with gradients that depend on the step only (the
// same on every rank, as after the all-reduce), three AdamW steps (amsgrad, so all three state tensors
// exist). Every rank's parameters must equal the unsharded optimizer's bit for bit after each step, and
// each rank holds state for its own parameters only: 3 tensors of the parameter's size each.
void run_sharded_against_unsharded(bool fused) {
  ProcessGroup& g = test_group();
  const bool before = cpu::fused_optim_enabled();
  cpu::set_fused_optim_enabled(fused);
  auto make_params = [] {
    Generator gen(7);
    std::vector<Tensor> p = {randn({6, 5}, gen), randn({5}, gen), randn({3, 6}, gen), randn({3}, gen)};
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i].requires_grad_(true);
      p[i].set_name(fmt::format("p{}", i));
    }
    return p;
  };
  auto groups = [](const std::vector<Tensor>& p) {
    return std::vector<optim::ParamGroupSpec>{{.params = {p[0], p[1]}, .options = {}},
                                              {.params = {p[2], p[3]}, .options = {.lr = 0.02}}};
  };
  std::vector<Tensor> ref = make_params(), mine = make_params();
  const optim::OptimizerOptions options{.lr = 0.01, .amsgrad = true, .weight_decay = 0.1};
  optim::AdamW ref_opt(groups(ref), options), opt(groups(mine), options);
  ShardedOptimizer zero(g, opt);
  for (int step = 0; step < 3; ++step) {
    Generator grads(100 + static_cast<std::uint64_t>(step));
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const Tensor grad = randn(ref[i].shape(), grads);
      ref[i].set_grad(grad.clone());
      mine[i].set_grad(grad.clone());
    }
    ref_opt.step();
    opt.step();
    for (std::size_t i = 0; i < ref.size(); ++i) {
      EXPECT_TRUE(same_bits(mine[i], ref[i])) << "parameter p" << i << " after step " << step << " on rank " << g.rank();
    }
  }
  // The state: this rank's parameters' only, and the same bits as the unsharded optimizer's.
  std::int64_t shard = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const bool owned = zero.owner(mine[i]) == g.rank();
    const optim::ParamState* s = opt.find_state(mine[i]);
    EXPECT_EQ(s != nullptr, owned) << "p" << i;
    if (!owned || s == nullptr) continue;
    shard += mine[i].numel();
    const optim::ParamState& r = *ref_opt.find_state(ref[i]);
    EXPECT_EQ(s->step, 3);
    EXPECT_TRUE(same_bits(s->exp_avg, r.exp_avg)) << "p" << i;
    EXPECT_TRUE(same_bits(s->exp_avg_sq, r.exp_avg_sq)) << "p" << i;
    EXPECT_TRUE(same_bits(s->max_exp_avg_sq, r.max_exp_avg_sq)) << "p" << i;
  }
  EXPECT_EQ(shard, zero.shard_elements(g.rank()));
  EXPECT_EQ(optimizer_state_elements(opt), 3 * shard);
  Tensor total = full({}, static_cast<double>(optimizer_state_elements(opt)), {.dtype = DType::i64});
  g.all_reduce(total);
  EXPECT_EQ(total.item(), 3.0 * (30 + 5 + 18 + 3));  // the shards add up to the whole state
  EXPECT_EQ(static_cast<double>(optimizer_state_elements(ref_opt)), 3.0 * (30 + 5 + 18 + 3));

  // consolidate_state(0): rank 0 then holds every parameter's state, equal to the unsharded one; the others
  // keep their shard; release_state() gives rank 0 its shard back.
  zero.consolidate_state(0);
  if (g.rank() == 0) {
    EXPECT_EQ(optimizer_state_elements(opt), optimizer_state_elements(ref_opt));
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const optim::ParamState* s = opt.find_state(mine[i]);
      EXPECT_NE(s, nullptr) << "p" << i;
      if (s == nullptr) continue;
      const optim::ParamState& r = *ref_opt.find_state(ref[i]);
      EXPECT_EQ(s->step, r.step);
      EXPECT_TRUE(same_bits(s->exp_avg, r.exp_avg) && same_bits(s->exp_avg_sq, r.exp_avg_sq) &&
                  same_bits(s->max_exp_avg_sq, r.max_exp_avg_sq) && !s->momentum_buffer.defined())
          << "p" << i;
    }
  } else {
    EXPECT_EQ(optimizer_state_elements(opt), 3 * shard);
  }
  zero.release_state();
  EXPECT_EQ(optimizer_state_elements(opt), 3 * shard);
  cpu::set_fused_optim_enabled(before);
}

TEST(sharded_optimizer, steps_every_parameter_as_the_unsharded_adamw_holding_only_its_shards_state_fused) {
  run_sharded_against_unsharded(true);
}
TEST(sharded_optimizer, steps_every_parameter_as_the_unsharded_adamw_holding_only_its_shards_state_op_by_op) {
  run_sharded_against_unsharded(false);
}

TEST(sharded_optimizer, a_sharded_optimizer_refuses_new_groups_and_a_second_sharding) {
  ProcessGroup& g = test_group();
  Tensor w = ones({3});
  w.requires_grad_(true);
  Tensor v = ones({2});
  v.requires_grad_(true);
  optim::SGD opt({w}, optim::OptimizerOptions{.lr = 0.5});
  {
    ShardedOptimizer zero(g, opt);
    EXPECT_THROW(ShardedOptimizer(g, opt), Error);
    try {
      opt.add_param_group({.params = {v}, .options = {}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("add_param_group on a sharded optimizer"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(opt.sharded());  // the destructor ended it
  opt.add_param_group({.params = {v}, .options = {}});
  Tensor stranger = ones({2});
  stranger.requires_grad_(true);
  stranger.set_name("stranger");
  try {
    opt.set_shard({stranger}, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "SGD: set_shard: 'stranger' is not one of this optimizer's parameters\nhint: shard the "
                           "optimizer's own parameters (param_groups())");
  }
  EXPECT_FALSE(opt.sharded());
}

// ---- training: sharded against plain DDP ----

// A checkpoint's model parameters and optimizer state, read into a freshly built task of the same run (the
// checkpoint's loader checks names, shapes and dtypes; the values are compared here).
struct SavedState {
  std::unique_ptr<samples::SampleTask> task;
  std::unique_ptr<optim::AdamW> opt;
};
SavedState read_checkpoint(const TrainConfig& config, const std::string& path) {
  SavedState s;
  Generator gen(config.seed);
  std::vector<std::string> warnings;
  s.task = samples::make_task(config, gen, warnings);
  s.opt = std::make_unique<optim::AdamW>(s.task->model().parameters(), optim::OptimizerOptions{.lr = 1.0});
  Checkpoint ck{.model = &s.task->model(), .optimizer = s.opt.get()};
  load_checkpoint(path, ck);
  return s;
}

// Compares two checkpoints' parameters and optimizer state bit for bit; returns the first difference.
std::string first_difference(const SavedState& a, const SavedState& b) {
  const auto pa = a.task->model().named_parameters(), pb = b.task->model().named_parameters();
  if (pa.size() != pb.size()) return "parameter counts";
  for (std::size_t i = 0; i < pa.size(); ++i) {
    if (!same_bits(pa[i].second, pb[i].second)) return "parameter " + pa[i].first;
    const optim::ParamState* sa = a.opt->find_state(pa[i].second);
    const optim::ParamState* sb = b.opt->find_state(pb[i].second);
    if ((sa == nullptr) != (sb == nullptr)) return "state presence of " + pa[i].first;
    if (sa == nullptr) continue;
    if (sa->step != sb->step || !same_bits(sa->exp_avg, sb->exp_avg) || !same_bits(sa->exp_avg_sq, sb->exp_avg_sq) ||
        !same_bits(sa->max_exp_avg_sq, sb->max_exp_avg_sq) || !same_bits(sa->momentum_buffer, sb->momentum_buffer)) {
      return "optimizer state of " + pa[i].first;
    }
  }
  if (a.opt->param_groups()[0].options.lr != b.opt->param_groups()[0].options.lr) return "lr";
  return "";
}

class zero_training : public ::testing::TestWithParam<Case> {};

// The requirement: ZeRO-1 equals plain DDP. Each element's update is the same arithmetic on the same
// averaged gradient, the GradScaler sees the same gradients, and the broadcast copies bits: the losses,
// scales and skips of every rank, and the parameters and optimizer state rank 0 saves, are bit for bit
// plain DDP's (fp16 with a large initial scale and a growth interval of 1, so that steps are skipped and
// taken and the scale moves both ways).
TEST_P(zero_training, sharded_runs_are_plain_ddp_bit_for_bit) {
  ProcessGroup& g = test_group();
  const Case& param = GetParam();
  // As ddp_training: three oversubscribed ranks make the cnn and transformer runs take minutes; the mlp only.
  if (g.size() > 2 && param.sample != "mlp") GTEST_SKIP() << "cnn and transformer run with 1 and 2 ranks";
  const std::filesystem::path dir = shared_temp_folder(g, "zero");
  TrainConfig plain = small_run(param.sample, param.precision);
  plain.process_group = &g;
  if (param.precision == Precision::fp16) {
    // 2^20 overflows the f16 gradients of these runs: steps are skipped and the scale backs off, then steps
    // are taken and it grows again (after every good step).
    plain.init_scale = 1048576.0;
    plain.growth_interval = 1;
  }
  plain.checkpoint = (dir / "plain.h5").string();
  TrainConfig sharded = plain;
  sharded.shard_optimizer = true;
  sharded.checkpoint = (dir / "sharded.h5").string();
  const TrainResult a = samples::train(plain);
  const TrainResult b = samples::train(sharded);
  EXPECT_EQ(b.losses, a.losses) << "rank " << g.rank();
  EXPECT_EQ(b.scales, a.scales) << "rank " << g.rank();
  EXPECT_EQ(b.skipped, a.skipped) << "rank " << g.rank();
  if (param.precision == Precision::fp16) {
    EXPECT_GT(a.skipped, 0) << "the scale should have overflowed at first";
    EXPECT_LT(a.skipped, plain.steps) << "some steps should have been taken";
  }
  if (g.rank() == 0) {
    const std::string diff = first_difference(read_checkpoint(plain, plain.checkpoint),
                                              read_checkpoint(sharded, sharded.checkpoint));
    EXPECT_EQ(diff, "") << "the sharded run's checkpoint differs from plain DDP's";
  }
  // Each rank held its shard's state only (AdamW: exp_avg and exp_avg_sq, two tensors per parameter), the
  // shards adding up to plain DDP's whole state.
  Tensor total = full({}, static_cast<double>(b.optimizer_state_elements), {.dtype = DType::i64});
  g.all_reduce(total);
  EXPECT_EQ(total.item(), static_cast<double>(a.optimizer_state_elements));
  if (g.size() > 1) {
    EXPECT_LT(b.optimizer_state_elements, a.optimizer_state_elements);
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(samples, zero_training,
                         ::testing::Values(Case{"mlp", Precision::fp32}, Case{"mlp", Precision::fp16},
                                           Case{"mlp", Precision::bf16}, Case{"cnn", Precision::fp32},
                                           Case{"cnn", Precision::fp16}, Case{"cnn", Precision::bf16},
                                           Case{"transformer", Precision::fp32},
                                           Case{"transformer", Precision::fp16},
                                           Case{"transformer", Precision::bf16}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.sample + "_" + std::string(samples::precision_name(info.param.precision));
                         });

// Per rank, the state is exactly the shard's: AdamW's two tensors for every parameter the partition gives
// this rank (computed here from the model's shapes with the rule worked above).
TEST(zero_training_state, each_rank_holds_adamws_two_tensors_for_exactly_its_shards_parameters) {
  ProcessGroup& g = test_group();
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.process_group = &g;
  c.shard_optimizer = true;
  c.steps = 2;
  const TrainResult r = samples::train(c);
  Generator gen(c.seed);
  std::vector<std::string> warnings;
  const auto task = samples::make_task(c, gen, warnings);
  const std::vector<Tensor> params = task->model().parameters();
  std::vector<std::int64_t> numels;
  std::int64_t whole = 0;
  for (const Tensor& p : params) {
    numels.push_back(p.numel());
    whole += p.numel();
  }
  const std::vector<int> owners = partition_parameters({numels}, g.size()).front();
  std::int64_t mine = 0;
  for (std::size_t i = 0; i < params.size(); ++i) mine += owners[i] == g.rank() ? params[i].numel() : 0;
  EXPECT_EQ(r.optimizer_state_elements, 2 * mine) << "rank " << g.rank();
  if (g.size() == 1) {
    EXPECT_EQ(r.optimizer_state_elements, 2 * whole);
  }
}

// ---- checkpoints and resume ----

// Four steps at once (plain DDP) against two steps and two resumed, in every combination of sharded and
// not: the file is the same, so all four continue bit for bit (fp16: the GradScaler's state travels too).
TEST(zero_resume, sharded_and_plain_checkpoints_resume_either_way_bit_for_bit) {
  ProcessGroup& g = test_group();
  const std::filesystem::path dir = shared_temp_folder(g, "zero");
  TrainConfig c = small_run("mlp", Precision::fp16);
  c.process_group = &g;
  c.steps = 4;
  const TrainResult whole = samples::train(c);
  for (const bool shard_first : {false, true}) {
    for (const bool shard_second : {false, true}) {
      TrainConfig first = c;
      first.steps = 2;
      first.shard_optimizer = shard_first;
      first.checkpoint = (dir / "ck.h5").string();
      const TrainResult a = samples::train(first);
      TrainConfig second = c;
      second.steps = 2;
      second.shard_optimizer = shard_second;
      second.resume = first.checkpoint;
      const TrainResult b = samples::train(second);
      std::vector<double> losses = a.losses, scales = a.scales;
      losses.insert(losses.end(), b.losses.begin(), b.losses.end());
      scales.insert(scales.end(), b.scales.begin(), b.scales.end());
      EXPECT_EQ(losses, whole.losses) << "sharded " << shard_first << " then " << shard_second;
      EXPECT_EQ(scales, whole.scales) << "sharded " << shard_first << " then " << shard_second;
      EXPECT_TRUE(b.warnings.empty()) << b.warnings.front();
      g.barrier();  // every rank has read the checkpoint before the next combination writes it again
    }
  }
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// The mean over ranks of the ranks' losses (the global batch's loss).
std::vector<double> global_losses(ProcessGroup& g, const std::vector<double>& mine) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(mine.size())}, {.dtype = DType::f64});
  for (std::size_t i = 0; i < mine.size(); ++i) t.data_as<double>()[i] = mine[i];
  g.all_reduce(t);
  std::vector<double> out = t.values();
  for (double& v : out) v /= g.size();
  return out;
}

// A checkpoint of N ranks (sharded) resumed on one rank, and one of one rank resumed on N (sharded): accepted,
// with a warning naming both counts. The resumed step starts from the same state either way, so its loss
// differs from the continued run's only by the order of the loss mean's additions (f32: at most 2 (B + N) u
// |L|, u = 2^-24, as ddp_training's step 0); the next by the ddp_training bound for one step taken.
TEST(zero_resume, a_checkpoint_resumes_on_another_number_of_ranks_when_the_batch_splits) {
  ProcessGroup& g = test_group();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  const std::filesystem::path dir = shared_temp_folder(g, "zero");
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.steps = 4;
  const double u = std::ldexp(1.0, -24), b = static_cast<double>(c.batch), n = g.size();
  auto within = [&](double got, double want, std::size_t resumed_step) {
    const double tol = resumed_step == 0 ? 2 * (b + n) * u * std::fabs(want) : 2 * (64 + b + n) * u * std::fabs(want);
    return std::fabs(got - want) <= tol;
  };
  const std::string ck = (dir / "ck.h5").string();

  // N ranks, sharded: 4 steps at once; 2 steps and a checkpoint; then rank 0 alone resumes for 2 steps.
  TrainConfig many = c;
  many.process_group = &g;
  many.shard_optimizer = true;
  const std::vector<double> continued = global_losses(g, samples::train(many).losses);
  TrainConfig first = many;
  first.steps = 2;
  first.checkpoint = ck;
  samples::train(first);
  if (g.rank() == 0) {
    TrainConfig one = c;
    one.steps = 2;
    one.resume = ck;
    const TrainResult r = samples::train(one);
    // EXPECT, not ASSERT, here and below: a rank returning early would leave the others at the barrier.
    EXPECT_EQ(r.losses.size(), 2u);
    for (std::size_t s = 0; s < 2 && s < r.losses.size(); ++s) {
      EXPECT_TRUE(within(r.losses[s], continued[2 + s], s)) << "step " << 2 + s << ": " << r.losses[s] << " against "
                                                            << continued[2 + s];
    }
    EXPECT_EQ(r.warnings.size(), 1u);
    EXPECT_EQ(r.warnings.empty() ? "" : r.warnings[0], "--resume: '" + ck + "' was written by a run of " + std::to_string(g.size()) +
                                 " rank(s) and resumed on 1: the same training up to the order of the additions (the "
                                 "gradient sums), so not bit for bit the run it continues");
  }
  g.barrier();

  // One rank: rank 0 alone writes the checkpoint after 2 steps and runs 4 at once; then the N ranks resume
  // from it, sharded.
  std::vector<double> alone(4, 0.0);
  if (g.rank() == 0) {
    alone = samples::train(c).losses;
    TrainConfig one = c;
    one.steps = 2;
    one.checkpoint = ck;
    samples::train(one);
  }
  Tensor shared = Tensor::empty({4}, {.dtype = DType::f64});
  for (std::size_t i = 0; i < 4; ++i) shared.data_as<double>()[i] = alone[i];
  g.broadcast(shared, 0);  // also: every rank waits for the checkpoint
  alone = shared.values();
  TrainConfig resumed = many;
  resumed.steps = 2;
  resumed.resume = ck;
  const TrainResult r = samples::train(resumed);
  const std::vector<double> global = global_losses(g, r.losses);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_TRUE(within(global[s], alone[2 + s], s)) << "step " << 2 + s << ": " << global[s] << " against "
                                                    << alone[2 + s];
  }
  EXPECT_EQ(r.warnings.size(), 1u);
  EXPECT_NE((r.warnings.empty() ? "" : r.warnings[0]).find("was written by a run of 1 rank(s) and resumed on " + std::to_string(g.size())),
            std::string::npos);
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// A global batch of 7 splits over neither 2 nor 3 ranks: a one-rank checkpoint with --batch 7 cannot resume
// on N ranks, and every rank refuses, naming the checkpoint's ranks, the new ones and what to do.
TEST(zero_resume, a_checkpoint_whose_batch_does_not_split_over_the_new_ranks_is_refused_naming_both_counts) {
  ProcessGroup& g = test_group();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  const std::filesystem::path dir = shared_temp_folder(g, "zero");
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.batch = 7;
  c.steps = 1;
  c.checkpoint = (dir / "ck.h5").string();
  if (g.rank() == 0) samples::train(c);
  g.barrier();
  TrainConfig resumed = c;
  resumed.checkpoint.clear();
  resumed.resume = c.checkpoint;
  resumed.process_group = &g;
  resumed.shard_optimizer = true;
  try {
    samples::train(resumed);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string n = std::to_string(g.size());
    EXPECT_EQ(std::string(e.what()),
              "--resume: '" + c.checkpoint + "' was written by a run of 1 rank(s); resuming it on " + n +
                  " ranks needs a global --batch that splits evenly over " + n +
                  ", and --batch 7 does not (every rank makes the same global batch and trains on an equal share of "
                  "it)\nhint: resume on a number of ranks that divides 7 (mpirun -np N with N one of 1, 7), for "
                  "instance on the checkpoint's 1");
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

// A checkpoint written before `world_size` was recorded (made here by removing it, and sharded_optimizer,
// from a one-rank checkpoint's run state): it resumes on N ranks with no warning, since nothing says the
// count changed, and a batch that does not split is refused saying the file does not record its ranks.
TEST(zero_resume, a_checkpoint_that_does_not_record_its_ranks_resumes_without_a_warning_and_a_refusal_says_so) {
  ProcessGroup& g = test_group();
  const std::filesystem::path dir = shared_temp_folder(g, "zero");
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.steps = 1;
  c.checkpoint = (dir / "old.h5").string();
  if (g.rank() == 0) {
    samples::train(c);
    SavedState s = read_checkpoint(c, c.checkpoint);
    Generator gen(0);
    Checkpoint ck{.model = &s.task->model(), .optimizer = s.opt.get(), .generators = {{"model", &gen}},
                  .states = {{"scaler", StateDict{}}, {"run", StateDict{}}}};
    load_checkpoint(c.checkpoint, ck);
    EXPECT_EQ(std::get<std::int64_t>(ck.states.at("run").at("world_size")), 1);
    EXPECT_EQ(std::get<bool>(ck.states.at("run").at("sharded_optimizer")), false);
    ck.states.at("run").erase("world_size");
    ck.states.at("run").erase("sharded_optimizer");
    save_checkpoint(c.checkpoint, ck);
  }
  g.barrier();
  TrainConfig resumed = c;
  resumed.checkpoint.clear();
  resumed.resume = c.checkpoint;
  resumed.process_group = &g;
  resumed.shard_optimizer = true;
  const TrainResult r = samples::train(resumed);
  EXPECT_EQ(r.losses.size(), 1u);
  EXPECT_TRUE(r.warnings.empty()) << (r.warnings.empty() ? "" : r.warnings.front());
  if (g.size() > 1) {
    resumed.batch = 7;
    try {
      samples::train(resumed);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string n = std::to_string(g.size());
      EXPECT_EQ(std::string(e.what()),
                "--resume: '" + c.checkpoint + "' does not record how many ranks wrote it; resuming it on " + n +
                    " ranks needs a global --batch that splits evenly over " + n +
                    ", and --batch 7 does not (every rank makes the same global batch and trains on an equal share "
                    "of it)\nhint: resume on a number of ranks that divides 7 (mpirun -np N with N one of 1, 7)");
    }
  }
  g.barrier();
  if (g.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(zero_refusals, shard_optimizer_with_eval_is_refused) {
  TrainConfig c = small_run("mlp", Precision::fp32);
  c.eval = true;
  c.shard_optimizer = true;
  try {
    samples::train(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--shard-optimizer with --eval: an evaluation has no optimizer whose state could be "
                                     "sharded\nhint: leave --shard-optimizer out");
  }
}

}  // namespace
}  // namespace ampscope
