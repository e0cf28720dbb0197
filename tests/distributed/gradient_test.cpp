// Data parallelism on the process group, by hand: rank 0's parameters broadcast to every rank, each rank's
// gradient of its share of the batch all-reduced and averaged, compared with the gradient one process
// computes from the whole batch.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/nn.h"
#include "core/ops.h"
#include "samples/models.h"
#include "tests/distributed/distributed_test_support.h"

namespace ampscope {
namespace {

using testing::test_group;

constexpr std::int64_t kBatch = 12;  // divisible by 1, 2, 3 (the ctest entries' rank counts) and 4, 6
const samples::MlpConfig kConfig{.in_features = 5, .hidden = 8, .classes = 3};

std::vector<Tensor> gradients(const nn::Module& model) {
  std::vector<Tensor> g;
  for (const Tensor& p : model.parameters()) g.push_back(p.grad());
  return g;
}

TEST(data_parallel, rank_0s_parameters_reach_every_rank_bit_for_bit) {
  ProcessGroup& g = test_group();
  // Rank 0 starts from seed 0, every other rank from a seed of its own; after the broadcast all hold the
  // parameters of seed 0.
  Generator mine(g.rank() == 0 ? 0 : 1000 + g.rank()), zero(0);
  auto model = samples::make_mlp(kConfig, mine);
  auto reference = samples::make_mlp(kConfig, zero);
  for (const Tensor& p : model->parameters()) g.broadcast(p, 0);
  const auto got = model->named_parameters(), want = reference->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].second.values(), want[i].second.values()) << got[i].first;
}

TEST(data_parallel, averaged_share_gradients_equal_the_whole_batch_gradient) {
  ProcessGroup& g = test_group();
  const int n = g.size(), r = g.rank();
  ASSERT_EQ(kBatch % n, 0) << "the batch must split evenly";
  Generator gen(0), data(7);
  auto model = samples::make_mlp(kConfig, gen);
  const Tensor x = randn({kBatch, kConfig.in_features}, data);
  Tensor y = Tensor::empty({kBatch}, {.dtype = DType::i64});
  for (std::int64_t i = 0; i < kBatch; ++i) y.data_as<std::int64_t>()[i] = i % kConfig.classes;

  // One process, the whole batch (every rank computes it: the reference).
  cross_entropy((*model)(x), y).backward();
  const std::vector<Tensor> whole = gradients(*model);
  model->zero_grad();

  // The bound's scale: S_k = sum over samples i of |t_ik|, t_i being sample i's term of the batch-mean
  // gradient (its own loss divided by the batch), from one backward per sample.
  std::vector<std::vector<double>> scale;
  for (const Tensor& w : whole) scale.emplace_back(static_cast<std::size_t>(w.numel()), 0.0);
  for (std::int64_t i = 0; i < kBatch; ++i) {
    div(cross_entropy((*model)(x.slice(0, i, i + 1)), y.slice(0, i, i + 1)), static_cast<double>(kBatch)).backward();
    const std::vector<Tensor> term = gradients(*model);
    for (std::size_t p = 0; p < term.size(); ++p) {
      const std::vector<double> v = term[p].values();
      for (std::size_t k = 0; k < v.size(); ++k) scale[p][k] += std::fabs(v[k]);
    }
    model->zero_grad();
  }

  // Data parallel: rank r's contiguous share of the batch, its mean loss, the gradients summed over ranks
  // and divided by the number of ranks (PyTorch's DDP averages the same way).
  const std::int64_t share = kBatch / n;
  cross_entropy((*model)(x.slice(0, r * share, (r + 1) * share)), y.slice(0, r * share, (r + 1) * share)).backward();
  std::vector<Tensor> averaged;
  for (const Tensor& grad : gradients(*model)) {
    g.all_reduce(grad);
    averaged.push_back(div(grad, static_cast<double>(n)));
  }

  // Tolerance. Both results approximate the same exact value, (1/B) sum_i t_i. Each per-sample term passes
  // through at most c = 64 roundings on its way (the forward and backward of three Linear layers with
  // inner products of length <= 8, the softmax, and the 1/B or 1/(B/n) and 1/n scalings), so each carries
  // a relative error of at most c u (u = 2^-24, first order); the whole batch then adds its B terms in one
  // sum (error <= B u sum |t_i|), the data-parallel run in shares of B/n and a sum over n ranks (<= (B/n + n)
  // u sum |t_i|). Their difference is therefore at most 2 (c + B + n) u S_k, S_k = sum_i |t_ik|.
  const double u = std::ldexp(1.0, -24);
  const double factor = 2.0 * (64 + kBatch + n) * u;
  for (std::size_t p = 0; p < whole.size(); ++p) {
    const std::vector<double> want = whole[p].values(), got = averaged[p].values();
    int shown = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      const double tolerance = factor * scale[p][k];
      if (std::fabs(got[k] - want[k]) > tolerance && ++shown <= 5) {
        ADD_FAILURE() << "parameter " << p << ", element " << k << ": data parallel " << got[k] << ", whole batch "
                      << want[k] << ", difference " << std::fabs(got[k] - want[k]) << " > tolerance " << tolerance;
      }
    }
    EXPECT_EQ(shown, 0) << "parameter " << p;
  }

  // And every rank holds the same bits (the all-reduce's promise): rank 0's gradients, broadcast, equal ours.
  for (const Tensor& a : averaged) {
    Tensor from_rank0 = a.clone();
    g.broadcast(from_rank0, 0);
    EXPECT_EQ(from_rank0.values(), a.values());
  }
}

}  // namespace
}  // namespace ampscope
