// core/distributed/zero_optimizer.h: ZeRO-1 (`ampscope train --ddp --shard-optimizer`, docs/distributed.md): the
// optimizer state sharded over the ranks of a data-parallel run. Each rank keeps, and updates, only its
// shard's state (for AdamW, exp_avg and exp_avg_sq of the parameters it owns); after each step the owners
// broadcast the parameters they updated, so every rank holds every parameter again. The gradients are
// still all-reduced whole (GradientAllReducer): ZeRO-1 shards the state, not the gradients.
//
//   optim::AdamW opt(model.parameters(), {.lr = 1e-3});
//   load_checkpoint(path, ck);                        // (resuming: every rank loads the whole state first)
//   ShardedOptimizer zero(group, opt);                // partitions, frees the state of the others' parameters
//   scaler.scale(loss).backward();
//   reducer.all_reduce();                             // the gradients, whole, as plain DDP
//   scaler.step(opt);                                 // opt.step(): this rank's shard, then the broadcasts
//   zero.consolidate_state(0);                        // before a checkpoint: rank 0 holds every state
//   if (group.rank() == 0) save_checkpoint(path, ck); // the file an unsharded run writes
//   zero.release_state();                             // back to this rank's shard
//
// The partition is PyTorch's ZeroRedundancyOptimizer's (_partition_parameters): whole parameters, never
// split; parameter group after parameter group, each group's parameters sorted by element count, largest
// first (a stable sort: equal counts keep the group's order), each given to the rank with the fewest
// elements so far (counted over all groups before it too; the lowest rank on a tie). Every rank computes
// it from the shapes alone, so every rank agrees without a message.
//
// The arithmetic of each element's update is the unsharded optimizer's (the same ops, or the same fused
// kernel, on the same gradient), and the broadcast copies bits, so a sharded run is bit for bit the
// unsharded one. The GradScaler decides as before: every rank unscales the whole averaged gradient, reads
// the same found_inf (also max-reduced over the group) and skips or steps together; a skipped step calls
// no opt.step() and so no broadcast, on every rank alike. A probe hook hears the updates of f16/bf16
// parameters (probe::Hook::on_update) of this rank's shard only; the run's f32 master weights have none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/optim.h"
#include "core/distributed/process_group.h"
#include "core/tensor.h"

namespace ampscope {

// The owner rank of each parameter, group after group in the optimizer's order (PyTorch's sorted-greedy
// rule above). `numels[g][i]`: the element count of group g's parameter i. Throws Error when ranks < 1.
std::vector<std::vector<int>> partition_parameters(const std::vector<std::vector<std::int64_t>>& numels, int ranks);

class ShardedOptimizer {
 public:
  // The parameters owned by a rank are broadcast in buckets of about this many bytes (DistributedDataParallel's
  // bucket_cap_mb default, as GradientAllReducer).
  static constexpr std::size_t kDefaultBucketBytes = std::size_t{25} << 20;

  // Partitions the optimizer's parameters over the group's ranks, frees the state of the parameters this
  // rank does not own (a resumed run loaded them all), and shards the optimizer (Optimizer::set_shard):
  // its step() now updates this rank's parameters and then broadcasts every rank's updated parameters
  // from their owners. Every rank must build it over the same parameters (shapes, dtypes, order). The
  // optimizer must outlive this object; the destructor ends the sharding (the optimizer then steps every
  // parameter again, from whatever state it holds).
  ShardedOptimizer(ProcessGroup& group, optim::Optimizer& optimizer, std::size_t bucket_bytes = kDefaultBucketBytes);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // The rank that owns a parameter; throws Error for a tensor the optimizer does not hold.
  int owner(const Tensor& param) const;
  // Rank r's parameters, in the order the partition assigned them (group after group, largest first).
  const std::vector<std::vector<Tensor>>& partition() const { return per_rank_; }
  // Elements of every parameter rank r owns.
  std::int64_t shard_elements(int rank) const;

  // Collective. Afterwards the optimizer on `root` holds every parameter's state, as an unsharded one
  // would (for save_checkpoint); the other ranks keep their own shard. Each owner broadcasts its
  // parameters' state one parameter at a time (the group has no point-to-point send), and the ranks
  // other than root drop what they receive at once, so no rank holds more than its shard plus one
  // parameter's state, except root, which holds all of it until release_state().
  void consolidate_state(int root);
  // Frees the state of every parameter this rank does not own (after a consolidate_state and the save).
  void release_state();

 private:
  void broadcast_parameters();

  ProcessGroup* group_;
  optim::Optimizer* optimizer_;
  std::vector<std::vector<Tensor>> per_rank_;
  // The broadcasts of each step: (owner, the parameters of one flat buffer: one dtype and device).
  std::vector<std::pair<int, std::vector<Tensor>>> buckets_;
};

// Elements of optimizer state a rank holds: the sum of numel() over every defined state tensor of every
// parameter (momentum_buffer, exp_avg, exp_avg_sq, max_exp_avg_sq). For tests and the memory figures.
std::int64_t optimizer_state_elements(const optim::Optimizer& optimizer);

}  // namespace ampscope
