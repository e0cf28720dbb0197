#include "core/distributed/data_parallel.h"

#include <utility>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace ampscope {

GradientAllReducer::GradientAllReducer(ProcessGroup& group, std::vector<Tensor> params, std::size_t bucket_bytes)
    : group_(&group), params_(std::move(params)) {
  if (bucket_bytes == 0) {
    throw Error("GradientAllReducer: bucket_bytes is 0; give at least one element's size (PyTorch's default is 25 MiB)");
  }
  // Reverse registration order, as DistributedDataParallel: backward produces the last layers' gradients
  // first. A bucket holds one dtype on one device (it is reduced as one flat tensor).
  std::size_t bytes = 0;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const bool fits = !buckets_.empty() && bytes < bucket_bytes && params_[buckets_.back().front()].dtype() == p.dtype() &&
                      params_[buckets_.back().front()].device() == p.device();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(k);
    bytes += static_cast<std::size_t>(p.numel()) * dtype_size(p.dtype());
  }
}

void GradientAllReducer::all_reduce() {
  const int ranks = group_->size();
  if (ranks == 1) return;
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // the reduction is the run's, not the model's ops: no probe sees it
  for (const std::vector<std::size_t>& bucket : buckets_) {
    std::vector<Tensor> grads;
    std::int64_t total = 0;
    for (std::size_t k : bucket) {
      Tensor g = params_[k].grad();
      if (!g.defined()) continue;
      total += g.numel();
      grads.push_back(std::move(g));
    }
    if (grads.empty()) continue;
    Tensor flat = Tensor::empty({total}, {.dtype = grads.front().dtype(), .device = grads.front().device()});
    std::int64_t offset = 0;
    for (const Tensor& g : grads) {
      flat.slice(0, offset, offset + g.numel()).copy_(g.reshape({-1}));
      offset += g.numel();
    }
    group_->all_reduce(flat, ReduceOp::sum);
    // Sum, then divide: the division by the rank count is rounded once per element (exact for a power of 2).
    const Tensor mean = div(flat, static_cast<double>(ranks));
    offset = 0;
    for (Tensor& g : grads) {
      g.copy_(mean.slice(0, offset, offset + g.numel()).view(g.shape()));
      offset += g.numel();
    }
  }
}

}  // namespace ampscope
