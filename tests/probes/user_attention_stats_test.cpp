// tests/probes/user_attention_stats_test.cpp: causal self-attention written as a user writes it (a module of their
// own: one projection for query, key and value sliced apart, heads split by view and transpose, the scores masked
// with -inf above the diagonal, softmax, the heads merged back), probed at level health. The statistics pass reads
// blocks holding -inf in its vector lanes and permuted views in memory order (probes/stats.cpp, issue 37); the rows
// it gives must be those of the values: the masked scores' counts exact and their moments within the rounding bound
// of a sum in double, computed here from the values in long double; and a transpose's gradient row the same bits as
// the row of the gradient it transposes (the same values, read in the same order). The shapes are odd on purpose:
// 61 tokens, so neither rows nor matrices fill whole blocks of 256 values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nn.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/probe.h"
#include "tests/probes/memory_sink.h"

namespace ampscope {
namespace {

using testing::Probed;

constexpr std::int64_t kBatch = 3, kTokens = 61, kHeads = 4, kHeadDim = 24, kWidth = kHeads * kHeadDim;

// -inf above the diagonal of each head's tokens x tokens scores: true where masked.
Tensor causal_mask() {
  std::vector<double> m(static_cast<std::size_t>(kBatch * kHeads * kTokens * kTokens));
  for (std::int64_t b = 0; b < kBatch * kHeads; ++b)
    for (std::int64_t r = 0; r < kTokens; ++r)
      for (std::int64_t c = 0; c < kTokens; ++c) m[static_cast<std::size_t>((b * kTokens + r) * kTokens + c)] = c > r ? 1 : 0;
  return from_values(m, {kBatch, kHeads, kTokens, kTokens}, {.dtype = DType::boolean});
}

class CausalSelfAttention : public nn::Module {
 public:
  explicit CausalSelfAttention(Generator& gen) : nn::Module("CausalSelfAttention"), mask_(causal_mask()) {
    qkv_ = register_module("qkv", std::make_shared<nn::Linear>(kWidth, 3 * kWidth, gen));
    proj_ = register_module("proj", std::make_shared<nn::Linear>(kWidth, kWidth, gen));
  }

  // The masked scores, as forward computes them.
  Tensor masked_scores(const Tensor& x) {
    const Tensor qkv = (*qkv_)(x);
    const Tensor q = heads(qkv.slice(2, 0, kWidth)), k = heads(qkv.slice(2, kWidth, 2 * kWidth));
    return masked_fill(mul(matmul(q, k.transpose(2, 3)), 1.0 / std::sqrt(static_cast<double>(kHeadDim))), mask_,
                       -INFINITY);
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor v = heads((*qkv_)(x).slice(2, 2 * kWidth, 3 * kWidth));
    const Tensor att = softmax(masked_scores(x), -1);
    const Tensor y = matmul(att, v).transpose(1, 2).reshape({kBatch, kTokens, kWidth});
    return (*proj_)(y);
  }

 private:
  static Tensor heads(const Tensor& t) { return t.reshape({kBatch, kTokens, kHeads, kHeadDim}).transpose(1, 2); }

  Tensor mask_;
  std::shared_ptr<nn::Linear> qkv_, proj_;
};

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

TEST(user_attention_stats_test, masked_scores_and_transposed_gradients_have_the_statistics_of_their_values) {
  Generator gen(37);
  CausalSelfAttention attention(gen);
  const Tensor x = randn({kBatch, kTokens, kWidth}, gen);

  // The reference: the masked scores' values, computed before the probe is installed (the same module, the same
  // inputs: the same values), summed in long double.
  const std::vector<double> scores = attention.masked_scores(x).values();
  std::int64_t masked = 0;
  long double sum = 0, sum_sq = 0, sum_abs = 0;
  double lo = INFINITY, hi = -INFINITY;
  for (double v : scores) {
    if (std::isinf(v)) {
      ASSERT_LT(v, 0);
      ++masked;
      continue;
    }
    sum += v;
    sum_sq += static_cast<long double>(v) * v;
    sum_abs += std::fabs(v);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  ASSERT_EQ(masked, kBatch * kHeads * kTokens * (kTokens - 1) / 2);

  Probed p(probe::ProbeOptions{.level = probe::Level::health});
  {
    probe::StepScope scope(0);
    const Tensor out = attention(x);
    mean(mul(out, out)).backward();
    scope.end({.step = 0});
  }

  // The masked scores' row: counts exact, min and max the values', the moments within a double sum's bound.
  const trace::OpRow* fill = nullptr;
  for (const trace::OpRow& r : p.sink->ops)
    if (r.op == "masked_fill" && r.phase == trace::Phase::forward) fill = &r;
  ASSERT_NE(fill, nullptr) << "no forward masked_fill row";
  const trace::TensorHealth& h = fill->health;
  const auto finite = static_cast<long double>(static_cast<std::int64_t>(scores.size()) - masked);
  EXPECT_EQ(h.numel, static_cast<std::int64_t>(scores.size()));
  EXPECT_EQ(h.neg_inf, masked);
  EXPECT_EQ(h.pos_inf, 0);
  EXPECT_EQ(h.nan, 0);
  EXPECT_EQ(h.min, lo);
  EXPECT_EQ(h.max, hi);
  EXPECT_EQ(h.absmax, std::max(-lo, hi));
  const long double u = std::ldexp(1.0L, -53), n = static_cast<long double>(scores.size());
  EXPECT_LE(std::fabs(static_cast<long double>(h.mean) - sum / finite), n * u * sum_abs / finite + 2 * u * std::fabs(sum / finite));
  const long double rms = std::sqrt(sum_sq / finite);
  EXPECT_LE(std::fabs(static_cast<long double>(h.rms) - rms), n * u * rms + 4 * u * rms);

  // Each transpose's backward row against the row of the gradient it received: the same values, transposed.
  int compared = 0;
  for (const trace::OpRow& r : p.sink->ops) {
    if (r.op != "transpose" || r.phase != trace::Phase::backward || r.inputs[0] < 0) continue;
    const trace::OpRow* from = nullptr;
    for (const trace::OpRow& s : p.sink->ops)
      if (s.step == r.step && s.seq == r.inputs[0]) from = &s;
    ASSERT_NE(from, nullptr) << "the row of seq " << r.inputs[0];
    // A backward row describes its node's first output: only a node of one output (a clone's, a transpose's, a
    // view's) gave the transpose exactly the gradient its row describes, not a matmul's (two).
    if (from->op != "clone" && from->op != "transpose" && from->op != "view" && from->op != "reshape") continue;
    ASSERT_EQ(from->health.numel, r.health.numel);
    SCOPED_TRACE("transpose backward, seq " + std::to_string(r.seq) + ", from " + from->op + " seq " + std::to_string(from->seq));
    EXPECT_EQ(r.health.zero, from->health.zero);
    EXPECT_EQ(r.health.subnormal, from->health.subnormal);
    for (const auto& [name, g, w] : {std::tuple{"min", r.health.min, from->health.min},
                                     std::tuple{"max", r.health.max, from->health.max},
                                     std::tuple{"mean", r.health.mean, from->health.mean},
                                     std::tuple{"rms", r.health.rms, from->health.rms}})
      EXPECT_TRUE(same_bits(g, w)) << name << ": " << g << " and " << w;
    ++compared;
  }
  EXPECT_GE(compared, 2) << "transpose backward rows whose gradient's row was recorded (the heads merged, and q's)";
}

}  // namespace
}  // namespace ampscope
