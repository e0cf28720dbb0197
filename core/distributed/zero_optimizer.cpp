#include "core/distributed/zero_optimizer.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"

namespace ampscope {

namespace {

// The state tensors of a parameter, in the order consolidate_state sends them.
constexpr std::array<Tensor optim::ParamState::*, 4> kStateTensors = {
    &optim::ParamState::momentum_buffer, &optim::ParamState::exp_avg, &optim::ParamState::exp_avg_sq,
    &optim::ParamState::max_exp_avg_sq};

}  // namespace

std::vector<std::vector<int>> partition_parameters(const std::vector<std::vector<std::int64_t>>& numels, int ranks) {
  if (ranks < 1) throw Error(fmt::format("partition_parameters: {} ranks; a group has at least one", ranks));
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(ranks), 0);  // elements given to each rank so far
  std::vector<std::vector<int>> owners;
  for (const std::vector<std::int64_t>& group : numels) {
    std::vector<std::size_t> order(group.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    // Python's sorted(key=numel, reverse=True) is stable: equal counts keep their order.
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return group[a] > group[b]; });
    std::vector<int> owner(group.size(), 0);
    for (std::size_t i : order) {
      // _get_min_index: the first rank holding the fewest elements.
      const auto r = static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      owner[i] = r;
      sizes[static_cast<std::size_t>(r)] += group[i];
    }
    owners.push_back(std::move(owner));
  }
  return owners;
}

ShardedOptimizer::ShardedOptimizer(ProcessGroup& group, optim::Optimizer& optimizer, std::size_t bucket_bytes)
    : group_(&group), optimizer_(&optimizer), per_rank_(static_cast<std::size_t>(group.size())) {
  if (bucket_bytes == 0) {
    throw Error("ShardedOptimizer: bucket_bytes is 0; give at least one element's size (the default is 25 MiB)");
  }
  if (optimizer.sharded()) {
    throw Error(fmt::format("ShardedOptimizer: the {} optimizer is already sharded\nhint: shard an optimizer once",
                            optimizer.name()));
  }
  std::vector<std::vector<std::int64_t>> numels;
  for (const optim::ParamGroup& g : optimizer.param_groups()) {
    std::vector<std::int64_t> n;
    for (const Tensor& p : g.params) n.push_back(p.numel());
    numels.push_back(std::move(n));
  }
  const std::vector<std::vector<int>> owners = partition_parameters(numels, group.size());
  // Each rank's list in the order the partition assigned the parameters (largest first within a group).
  for (std::size_t g = 0; g < numels.size(); ++g) {
    const std::vector<Tensor>& params = optimizer.param_groups()[g].params;
    std::vector<std::size_t> order(params.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return numels[g][a] > numels[g][b]; });
    for (std::size_t i : order) per_rank_[static_cast<std::size_t>(owners[g][i])].push_back(params[i]);
  }
  for (int r = 0; r < group.size(); ++r) {
    std::size_t bytes = 0;
    bool open = false;
    for (const Tensor& p : per_rank_[static_cast<std::size_t>(r)]) {
      const bool fits = open && bytes < bucket_bytes && buckets_.back().second.front().dtype() == p.dtype() &&
                        buckets_.back().second.front().device() == p.device();
      if (!fits) {
        buckets_.push_back({r, {}});
        bytes = 0;
        open = true;
      }
      buckets_.back().second.push_back(p);
      bytes += static_cast<std::size_t>(p.numel()) * dtype_size(p.dtype());
    }
  }
  release_state();
  optimizer.set_shard(per_rank_[static_cast<std::size_t>(group.rank())], [this] { broadcast_parameters(); });
}

ShardedOptimizer::~ShardedOptimizer() { optimizer_->set_shard({}, {}); }

int ShardedOptimizer::owner(const Tensor& param) const {
  for (std::size_t r = 0; r < per_rank_.size(); ++r) {
    for (const Tensor& p : per_rank_[r]) {
      if (p.id() == param.id()) return static_cast<int>(r);
    }
  }
  throw Error(fmt::format("ShardedOptimizer: {} is not one of the {} optimizer's parameters",
                          param.name().empty() ? std::string("the tensor") : fmt::format("'{}'", param.name()),
                          optimizer_->name()));
}

std::int64_t ShardedOptimizer::shard_elements(int rank) const {
  std::int64_t n = 0;
  for (const Tensor& p : per_rank_.at(static_cast<std::size_t>(rank))) n += p.numel();
  return n;
}

void ShardedOptimizer::broadcast_parameters() {
  NoGradGuard no_grad;            // the parameters are leaves that require grad
  RuntimeInternalGuard internal;  // the exchange is the run's, not the model's ops: no probe sees it
  const int me = group_->rank();
  for (auto& [owner, params] : buckets_) {
    std::int64_t total = 0;
    for (const Tensor& p : params) total += p.numel();
    Tensor flat = Tensor::empty({total}, {.dtype = params.front().dtype(), .device = params.front().device()});
    std::int64_t offset = 0;
    if (me == owner) {
      for (const Tensor& p : params) {
        flat.slice(0, offset, offset + p.numel()).copy_(p.reshape({-1}));
        offset += p.numel();
      }
    }
    group_->broadcast(flat, owner);
    if (me != owner) {
      for (Tensor& p : params) {
        p.copy_(flat.slice(0, offset, offset + p.numel()).view(p.shape()));
        offset += p.numel();
      }
    }
  }
}

void ShardedOptimizer::consolidate_state(int root) {
  if (root < 0 || root >= group_->size()) {
    throw Error(fmt::format("ShardedOptimizer::consolidate_state: root {} is not a rank of the group ({})", root,
                            group_->describe()));
  }
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;
  const int me = group_->rank();
  for (int r = 0; r < group_->size(); ++r) {
    for (const Tensor& p : per_rank_[static_cast<std::size_t>(r)]) {
      // The owner says what the state holds: "-" for none, else the step and, per state tensor, its dtype
      // code or -1 when undefined.
      std::string header;
      if (me == r) {
        const optim::ParamState* s = optimizer_->find_state(p);
        if (s == nullptr) {
          header.assign(1, '-');  // (not = "-": GCC 12 warns falsely of an overlapping memcpy there)
        } else {
          header = fmt::format("{}", s->step);
          for (Tensor optim::ParamState::*field : kStateTensors) {
            const Tensor& t = s->*field;
            header += fmt::format(" {}", t.defined() ? static_cast<int>(t.dtype()) : -1);
          }
        }
      }
      header = group_->broadcast_bytes(header, r);
      if (header == "-") {
        if (me == root && me != r) optimizer_->erase_state(p);
        continue;
      }
      std::istringstream in(header);
      optim::ParamState received;
      in >> received.step;
      optim::ParamState* mine = me == r ? &optimizer_->state(p) : nullptr;
      for (Tensor optim::ParamState::*field : kStateTensors) {
        int code = -1;
        in >> code;
        if (code < 0) continue;
        Tensor t = mine != nullptr ? (mine->*field).contiguous()
                                   : Tensor::empty(p.shape(), {.dtype = static_cast<DType>(code), .device = p.device()});
        group_->broadcast(t, r);
        received.*field = std::move(t);  // on ranks other than root, dropped with `received` below
      }
      if (me == root && me != r) optimizer_->state(p) = std::move(received);
    }
  }
}

void ShardedOptimizer::release_state() {
  const int me = group_->rank();
  for (std::size_t r = 0; r < per_rank_.size(); ++r) {
    if (static_cast<int>(r) == me) continue;
    for (const Tensor& p : per_rank_[r]) optimizer_->erase_state(p);
  }
}

std::int64_t optimizer_state_elements(const optim::Optimizer& optimizer) {
  std::int64_t n = 0;
  for (const optim::ParamGroup& g : optimizer.param_groups()) {
    for (const Tensor& p : g.params) {
      const optim::ParamState* s = optimizer.find_state(p);
      if (s == nullptr) continue;
      for (Tensor optim::ParamState::*field : kStateTensors) {
        if ((s->*field).defined()) n += (s->*field).numel();
      }
    }
  }
  return n;
}

}  // namespace ampscope
