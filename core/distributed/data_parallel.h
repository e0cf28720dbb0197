// core/distributed/data_parallel.h: the gradient all-reduce of data-parallel training (`ampscope train --ddp`,
// docs/distributed.md), as PyTorch's DistributedDataParallel does it after backward: the parameters'
// gradients, in buckets of about 25 MiB taken in reverse registration order (the order backward produces
// them), are each flattened into one buffer, summed over the ranks (ProcessGroup::all_reduce) and divided
// by the number of ranks, then copied back into the gradients.
//
//   GradientAllReducer reducer(group, model.parameters());   // buckets fixed here, from the shapes
//   scaler.scale(loss).backward();
//   reducer.all_reduce();                                    // every rank now holds the same mean gradient
//   scaler.unscale_(opt); ...                                // unscale, clip and step as one process would
//
// With equal shares of the batch, each rank's loss the mean over its share, the mean of the ranks'
// gradients is the gradient of the global batch's mean loss. Every rank gets the same bits (the group's
// sum is the same left fold in rank order on every rank), so the ranks' parameters stay identical.
// Parameters without a gradient are left out of their bucket; every rank must have gradients for the
// same parameters (the same model running the same code does). The calls record no autograd node and no
// probe sees them.
#pragma once

#include <cstddef>
#include <vector>

#include "core/distributed/process_group.h"
#include "core/tensor.h"

namespace ampscope {

class GradientAllReducer {
 public:
  // PyTorch's DistributedDataParallel bucket_cap_mb default (25 MiB).
  static constexpr std::size_t kDefaultBucketBytes = std::size_t{25} << 20;

  // `params`: the model's parameters in registration order (Module::parameters()). A bucket is closed
  // once it holds at least bucket_bytes (a parameter is never split: one larger than bucket_bytes is a
  // bucket of its own). Throws Error when bucket_bytes is 0.
  GradientAllReducer(ProcessGroup& group, std::vector<Tensor> params, std::size_t bucket_bytes = kDefaultBucketBytes);

  // Sums every gradient over the ranks and divides it by the number of ranks, bucket by bucket. With a
  // group of size 1, does nothing (the gradients keep their bits).
  void all_reduce();

  // The buckets, as indices into the parameters given (each bucket in the order it is reduced).
  const std::vector<std::vector<std::size_t>>& buckets() const { return buckets_; }

 private:
  ProcessGroup* group_;
  std::vector<Tensor> params_;
  std::vector<std::vector<std::size_t>> buckets_;
};

}  // namespace ampscope
