// tests/autocast/autocast_cache_test.cpp: the weight-cast cache (reference/amp-semantics.md 2.6) and
// backward outside autocast (2.7).
//
// The cache is seen two ways: autocast_cache_size(), and the probe hook's CastRecord.from_cache with the
// identity of the cast tensor the op received. Gradients are checked against values worked out by hand
// (inputs chosen so that every f16 product and sum is exact) and against the same computation written
// without autocast, with the casts made by hand.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

// What a probe saw of one op, copied out of the event (whose fields are references).
struct SeenOp {
  std::string op;
  std::string scope;
  probe::AutocastInfo autocast;
  // The inputs as the op received them, kept alive so that no later tensor can reuse their identity.
  std::vector<Tensor> inputs;
  DType output = DType::f32;
};

class RecordingHook : public probe::Hook {
 public:
  void on_op(const probe::OpEvent& e) override {
    ops.push_back({std::string(e.op), e.scope, e.autocast, e.inputs, e.output.dtype()});
  }
  std::vector<SeenOp> ops;
};

Tensor param(Tensor t) {
  t.requires_grad_();
  return t;
}

void expect_cast(const probe::CastRecord& c, int input, DType from, DType to, bool from_cache) {
  EXPECT_EQ(c.input, input);
  EXPECT_EQ(c.from, from) << "input " << input;
  EXPECT_EQ(c.to, to) << "input " << input;
  EXPECT_EQ(c.from_cache, from_cache) << "input " << input;
}

// ---- the cache ----

TEST(autocast_cache_test, f32_parameter_used_by_two_linears_in_one_region_is_cast_once) {
  Generator gen(7);
  const Tensor w = param(randn({3, 4}, gen)), b = param(randn({3}, gen));
  const Tensor x1 = randn({2, 4}, gen), x2 = randn({5, 4}, gen);
  auto hook = std::make_shared<RecordingHook>();
  {
    probe::HookGuard installed(hook);
    AutocastGuard region;
    ASSERT_EQ(autocast_cache_size(), 0u);
    linear(x1, w, b);
    EXPECT_EQ(autocast_cache_size(), 2u) << "weight and bias; the activation x1 requires no grad";
    linear(x2, w, b);
    EXPECT_EQ(autocast_cache_size(), 2u);
  }
  ASSERT_EQ(hook->ops.size(), 2u);
  const SeenOp& first = hook->ops[0];
  const SeenOp& second = hook->ops[1];
  ASSERT_EQ(first.autocast.casts.size(), 3u);
  ASSERT_EQ(second.autocast.casts.size(), 3u);
  expect_cast(first.autocast.casts[0], 0, DType::f32, DType::f16, false);
  expect_cast(first.autocast.casts[1], 1, DType::f32, DType::f16, false);
  expect_cast(first.autocast.casts[2], 2, DType::f32, DType::f16, false);
  expect_cast(second.autocast.casts[0], 0, DType::f32, DType::f16, false);
  expect_cast(second.autocast.casts[1], 1, DType::f32, DType::f16, true);
  expect_cast(second.autocast.casts[2], 2, DType::f32, DType::f16, true);
  EXPECT_EQ(first.inputs[1].id(), second.inputs[1].id()) << "both linears received the same cast weight";
  EXPECT_EQ(first.inputs[2].id(), second.inputs[2].id()) << "and the same cast bias";
  EXPECT_NE(first.inputs[0].id(), second.inputs[0].id());
}

TEST(autocast_cache_test, bf16_region_caches_bf16_casts) {
  Generator gen(8);
  const Tensor w = param(randn({3, 4}, gen));
  const Tensor x = randn({2, 4}, gen);
  AutocastGuard region(DType::bf16);
  const Tensor y1 = linear(x, w), y2 = linear(x, w);
  EXPECT_EQ(y1.dtype(), DType::bf16);
  EXPECT_EQ(autocast_cache_size(), 1u);
}

TEST(autocast_cache_test, does_not_cache_tensors_without_grad_non_leaves_casts_to_f32_or_when_disabled) {
  Generator gen(9);
  const Tensor x = randn({2, 4}, gen);
  const Tensor plain = randn({3, 4}, gen);                   // requires no grad
  const Tensor w = param(randn({3, 4}, gen));
  const Tensor non_leaf = mul(w, 1.0);                       // requires grad, produced by an op
  const Tensor w16 = param(randn({4}, gen, {.dtype = DType::f16}));  // cast up to f32 by layer_norm
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    linear(x, plain);
    linear(x, plain);
    EXPECT_EQ(autocast_cache_size(), 0u) << "a tensor that requires no grad";
    linear(x, non_leaf);
    linear(x, non_leaf);
    EXPECT_EQ(autocast_cache_size(), 0u) << "a non-leaf";
    layer_norm(x, {4}, w16);
    layer_norm(x, {4}, w16);
    EXPECT_EQ(autocast_cache_size(), 0u) << "a cast to f32";
  }
  {
    AutocastGuard region(std::nullopt, true, /*cache_enabled=*/false);
    linear(x, w);
    linear(x, w);
    EXPECT_EQ(autocast_cache_size(), 0u) << "cache_enabled = false";
  }
  ASSERT_EQ(hook->ops.size(), 8u);
  for (const SeenOp& op : hook->ops) {
    for (const probe::CastRecord& c : op.autocast.casts) EXPECT_FALSE(c.from_cache) << op.op << " input " << c.input;
  }
  // The casts happened all the same, each use getting its own: the second use sees a new cast tensor.
  EXPECT_NE(hook->ops[0].inputs[1].id(), hook->ops[1].inputs[1].id());
  EXPECT_NE(hook->ops[2].inputs[1].id(), hook->ops[3].inputs[1].id());
  EXPECT_NE(hook->ops[6].inputs[1].id(), hook->ops[7].inputs[1].id());
  ASSERT_EQ(hook->ops[4].autocast.casts.size(), 1u);
  expect_cast(hook->ops[4].autocast.casts[0], 1, DType::f16, DType::f32, false);
}

TEST(autocast_cache_test, is_cleared_when_the_outermost_region_exits) {
  Generator gen(10);
  const Tensor w = param(randn({3, 4}, gen));
  const Tensor x = randn({2, 4}, gen);
  {
    AutocastGuard outer;
    {
      AutocastGuard inner;
      linear(x, w);
      EXPECT_EQ(autocast_cache_size(), 1u);
    }
    EXPECT_EQ(autocast_cache_size(), 1u) << "an inner region's exit keeps the cache";
  }
  EXPECT_EQ(autocast_cache_size(), 0u);
}

TEST(autocast_cache_test, parameter_used_through_its_cached_cast_gets_an_f32_grad_summing_both_uses) {
  // L = sum(x1 W^T) + sum(x2 W^T), so dL/dW[o][i] = sum_r x1[r][i] + sum_r x2[r][i] for every row o:
  // column sums (1, 5, 0.5) and (2, -2, 1.5), total (3, 3, 2). Every value is exact in f16.
  Tensor w = param(from_values({0.5, -1, 2, 1.5, 0.25, -3}, {2, 3}));
  const Tensor x1 = from_values({1, 2, -1, 0, 3, 1.5}, {2, 3});
  const Tensor x2 = from_values({2, -2, 1.5}, {1, 3});
  Tensor loss;
  {
    AutocastGuard region;
    const Tensor y1 = linear(x1, w), y2 = linear(x2, w);
    ASSERT_EQ(autocast_cache_size(), 1u);
    loss = add(sum(y1), sum(y2));
  }
  ASSERT_EQ(loss.dtype(), DType::f32);
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().values(), (std::vector<double>{3, 3, 2, 3, 3, 2}));

  // Without autocast, one hand-made cast used twice.
  const Tensor by_autocast = w.grad();
  w.set_grad(Tensor());
  const Tensor w_half = w.to(DType::f16);
  const Tensor manual = add(sum(linear(x1.to(DType::f16), w_half), DType::f32),
                            sum(linear(x2.to(DType::f16), w_half), DType::f32));
  manual.backward();
  EXPECT_EQ(by_autocast.values(), w.grad().values());
}

TEST(autocast_cache_test, gradients_match_a_run_without_autocast_on_random_values) {
  // Random values, where f16 rounding of the two contributions matters: the cached cast's backward sums
  // the two f16 gradients, then converts once to f32, exactly as one hand-made cast used twice does.
  Generator gen(13);
  Tensor w = param(randn({4, 6}, gen)), b = param(randn({4}, gen));
  const Tensor x1 = randn({5, 6}, gen), x2 = randn({3, 6}, gen);
  const Tensor t1 = randn({5, 4}, gen), t2 = randn({3, 4}, gen);
  Tensor loss;
  {
    AutocastGuard region;
    loss = add(mse_loss(linear(x1, w, b), t1), mse_loss(linear(x2, w, b), t2));
  }
  loss.backward();
  const Tensor gw = w.grad(), gb = b.grad();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  const DType h = DType::f16;
  const Tensor wh = w.to(h), bh = b.to(h);
  const Tensor manual = add(mse_loss(linear(x1.to(h), wh, bh).to(DType::f32), t1),
                            mse_loss(linear(x2.to(h), wh, bh).to(DType::f32), t2));
  EXPECT_EQ(loss.item(), manual.item());
  manual.backward();
  EXPECT_EQ(gw.dtype(), DType::f32);
  EXPECT_EQ(gb.dtype(), DType::f32);
  EXPECT_EQ(gw.values(), w.grad().values());
  EXPECT_EQ(gb.values(), b.grad().values());
}

// ---- backward and the runtime's own ops run outside autocast ----

TEST(autocast_backward_test, grads_have_the_parameters_dtypes_when_backward_runs_after_the_region) {
  Generator gen(14);
  Tensor w32 = param(randn({4, 3}, gen));
  Tensor w16 = param(randn({2, 4}, gen, {.dtype = DType::f16}));
  const Tensor x = randn({5, 3}, gen), target = randn({5, 2}, gen);
  Tensor loss;
  {
    AutocastGuard region;
    const Tensor h = linear(x, w32);  // f16
    const Tensor y = linear(h, w16);  // f16, w16 needs no cast
    loss = mse_loss(y, target);       // f32
  }
  loss.backward();
  ASSERT_TRUE(w32.grad().defined());
  ASSERT_TRUE(w16.grad().defined());
  EXPECT_EQ(w32.grad().dtype(), DType::f32);
  EXPECT_EQ(w16.grad().dtype(), DType::f16);
  const Tensor g32 = w32.grad(), g16 = w16.grad();
  w32.set_grad(Tensor());
  w16.set_grad(Tensor());
  const Tensor manual =
      mse_loss(linear(linear(x.to(DType::f16), w32.to(DType::f16)), w16).to(DType::f32), target);
  manual.backward();
  EXPECT_EQ(g32.values(), w32.grad().values());
  EXPECT_EQ(g16.values(), w16.grad().values());
}

TEST(autocast_backward_test, backward_inside_a_region_is_not_autocast) {
  // pow's backward calls pow (grad * 3 * x^2): under autocast that pow would run in f32 and the f16
  // leaf would get a gradient of the wrong dtype or rounding.
  Generator gen(15);
  Tensor x = param(add(rand({6}, gen, {.dtype = DType::f16}), 0.5).detach());
  sum(pow(x, 3.0)).backward();
  const Tensor outside = x.grad();
  x.set_grad(Tensor());
  const Tensor loss = sum(pow(x, 3.0));
  {
    AutocastGuard region;
    loss.backward();
  }
  ASSERT_EQ(x.grad().dtype(), DType::f16);
  EXPECT_EQ(x.grad().values(), outside.values());
}

TEST(autocast_backward_test, ops_that_backward_runs_are_not_reported_to_the_probe) {
  Generator gen(16);
  const Tensor w = param(randn({3, 4}, gen));
  const Tensor x = randn({2, 4}, gen), target = randn({2, 3}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  Tensor loss;
  {
    AutocastGuard region;
    loss = mse_loss(pow(linear(x, w), 2.0), target);  // backward calls mul, sub and pow
  }
  ASSERT_EQ(hook->ops.size(), 3u);
  hook->ops.clear();
  loss.backward();
  EXPECT_TRUE(hook->ops.empty()) << hook->ops.size() << " ops reported, the first " << hook->ops.front().op;
  EXPECT_TRUE(w.grad().defined());
}

TEST(autocast_backward_test, optimizer_step_inside_a_region_neither_autocasts_nor_reports) {
  // Adam's first step moves each element by lr * sign(g) (m / sqrt(v) = g / |g| after bias correction,
  // up to eps): from (1, 2, 3) with g = (0.5, -1, 2) and lr 0.25, to about (0.75, 2.25, 2.75).
  Tensor w = param(from_values({1, 2, 3}, {3}));
  Tensor ref = param(from_values({1, 2, 3}, {3}));
  w.set_grad(from_values({0.5, -1, 2}, {3}));
  ref.set_grad(from_values({0.5, -1, 2}, {3}));
  optim::Adam opt(std::vector<Tensor>{w}, {.lr = 0.25});
  optim::Adam ref_opt(std::vector<Tensor>{ref}, {.lr = 0.25});
  ref_opt.step();
  auto hook = std::make_shared<RecordingHook>();
  {
    probe::HookGuard installed(hook);
    AutocastGuard region;
    opt.step();
  }
  EXPECT_TRUE(hook->ops.empty()) << hook->ops.size() << " ops reported, the first " << hook->ops.front().op;
  ASSERT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.values(), ref.values());
  const std::vector<double> expected = {0.75, 2.25, 2.75};
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(w.values()[i], expected[i], 1e-6) << "element " << i;
}

TEST(autocast_backward_test, runtime_internal_ops_run_without_autocast_and_unreported) {
  Generator gen(17);
  const Tensor a = randn({2, 3}, gen), b = randn({3, 2}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  AutocastGuard region;
  {
    RuntimeInternalGuard internal;
    EXPECT_EQ(matmul(a, b).dtype(), DType::f32) << "not lowered to f16";
    EXPECT_EQ(softmax(a.to(DType::f16), 1).dtype(), DType::f16) << "not raised to f32";
  }
  EXPECT_TRUE(hook->ops.empty());
  EXPECT_EQ(matmul(a, b).dtype(), DType::f16) << "the guard's end restores autocast";
  EXPECT_EQ(hook->ops.size(), 1u);
}

}  // namespace
}  // namespace ampscope
