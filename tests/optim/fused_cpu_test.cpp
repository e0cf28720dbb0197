// The CPU backend's one-pass SGD/Adam/AdamW steps (kernels/cpu/fused_optim.h) against the unfused per-op
// path (core/optim.cpp, reached with the fused steps switched off): the same bits for parameters and
// every state tensor over several steps, for each option that changes the op sequence, with gradients and
// parameters that hold NaN, infinities, subnormals, signed zeros and values near the f32 limits.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "kernels/cpu/fused_optim.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

struct FusedOptimGuard {
  explicit FusedOptimGuard(bool on) : before(cpu::fused_optim_enabled()) { cpu::set_fused_optim_enabled(on); }
  ~FusedOptimGuard() { cpu::set_fused_optim_enabled(before); }
  bool before;
};

std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()));
  if (!out.empty()) std::memcpy(out.data(), c.data(), out.size());
  return out;
}

// The same bits (both undefined counts as the same); a failure shows the first five differing elements.
void expect_same_bits(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.defined(), actual.defined()) << what;
  if (!expected.defined()) return;
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  ASSERT_EQ(expected.numel(), actual.numel()) << what;
  const std::vector<std::uint8_t> eb = bytes_of(expected), ab = bytes_of(actual);
  if (eb == ab) return;
  const auto* e = reinterpret_cast<const std::uint32_t*>(eb.data());
  const auto* a = reinterpret_cast<const std::uint32_t*>(ab.data());
  int shown = 0;
  for (std::size_t i = 0; i < eb.size() / 4 && shown < 5; ++i) {
    if (e[i] == a[i]) continue;
    float ef, af;
    std::memcpy(&ef, &e[i], 4);
    std::memcpy(&af, &a[i], 4);
    ADD_FAILURE() << what << ": element " << i << " unfused " << ef << " (0x" << std::hex << e[i] << ") fused " << af
                  << " (0x" << a[i] << std::dec << ")";
    ++shown;
  }
}

// Writes the f32 bit patterns of the edge cases over the first elements of t (contiguous f32).
void plant_edge_cases(Tensor& t) {
  const float inf = std::numeric_limits<float>::infinity();
  const float values[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f,
                          std::numeric_limits<float>::denorm_min(), -1e-40f, 1e-30f, 3e38f, -3e38f, 1e19f, 1e-19f};
  float* p = static_cast<float*>(t.data());
  for (std::size_t i = 0; i < std::size(values) && static_cast<std::int64_t>(i) < t.numel(); ++i) p[i] = values[i];
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Two parameters (one large enough to be split over the threads, one odd-sized), `steps` steps with
// fresh gradients each time (one gradient absent at step 1); edge cases in the first elements of the
// large gradient at every step and of the large parameter at the start. Returns the parameters and
// every state tensor after the last step.
std::vector<Tensor> train(bool fused, bool edge_cases, const MakeOptimizer& make, int steps) {
  const FusedOptimGuard guard(fused);
  Generator gen(7);
  Tensor w = randn({1024, 300}, gen);
  if (edge_cases) plant_edge_cases(w);
  w.requires_grad_();
  Tensor b = randn({37}, gen).requires_grad_();
  std::unique_ptr<optim::Optimizer> opt = make({w, b});
  for (int s = 0; s < steps; ++s) {
    Generator g(100 + s);
    Tensor gw = mul(randn({1024, 300}, g), 1e-2);
    if (edge_cases) {
      // Shifted by the step so each position meets several of the cases.
      Tensor shifted = gw.reshape({-1}).slice(0, s, gw.numel());
      Tensor tmp = shifted.contiguous();
      plant_edge_cases(tmp);
      shifted.copy_(tmp);
    }
    w.set_grad(gw);
    b.set_grad(s == 1 ? Tensor() : randn({37}, g));
    const std::uint64_t calls = cpu::fused_optim_call_count();
    opt->step();
    // Fused against unfused means nothing if the fused run quietly took the unfused path.
    EXPECT_EQ(cpu::fused_optim_call_count() > calls, fused) << "fused step, step " << s;
  }
  std::vector<Tensor> out = {w.detach(), b.detach()};
  for (const Tensor& p : {w, b}) {
    const optim::ParamState* st = opt->find_state(p);
    if (st == nullptr) continue;
    out.insert(out.end(), {st->momentum_buffer, st->exp_avg, st->exp_avg_sq, st->max_exp_avg_sq});
    out.push_back(full({}, static_cast<double>(st->step), {DType::f32}));
  }
  return out;
}

void expect_fused_matches(const MakeOptimizer& make, const std::string& name) {
  for (const bool edge : {false, true}) {
    const std::vector<Tensor> fused = train(true, edge, make, 4);
    const std::vector<Tensor> unfused = train(false, edge, make, 4);
    ASSERT_EQ(fused.size(), unfused.size()) << name;
    for (std::size_t i = 0; i < fused.size(); ++i) {
      expect_same_bits(unfused[i], fused[i],
                       name + (edge ? " with edge cases" : "") + ", tensor " + std::to_string(i));
    }
  }
}

template <class Opt>
MakeOptimizer maker(optim::OptimizerOptions o) {
  return [o](std::vector<Tensor> params) { return std::make_unique<Opt>(std::move(params), o); };
}

TEST(fused_optimizer_cpu_test, sgd_matches_the_unfused_ops_bit_for_bit) {
  expect_fused_matches(maker<optim::SGD>({.lr = 0.1}), "plain SGD");
  expect_fused_matches(maker<optim::SGD>({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2}),
                       "SGD with momentum, dampening, weight decay");
  expect_fused_matches(maker<optim::SGD>({.lr = 0.05, .momentum = 0.9, .nesterov = true, .maximize = true}),
                       "SGD nesterov maximize");
}

TEST(fused_optimizer_cpu_test, adam_and_adamw_match_the_unfused_ops_bit_for_bit) {
  expect_fused_matches(maker<optim::Adam>({.lr = 1e-3}), "Adam");
  expect_fused_matches(maker<optim::Adam>({.lr = 3e-3, .amsgrad = true, .weight_decay = 0.1}),
                       "Adam with coupled weight decay and amsgrad");
  expect_fused_matches(maker<optim::AdamW>({.lr = 3e-4}), "AdamW");
  expect_fused_matches(maker<optim::AdamW>({.lr = 5e-5, .weight_decay = 0.0}), "AdamW as ampscope train --model runs it");
  // beta1 = 0.3 takes lerp's second form (weight 0.7 >= 0.5).
  expect_fused_matches(maker<optim::AdamW>({.lr = 1e-2, .betas = {{0.3, 0.99}}, .eps = 1e-6, .amsgrad = true,
                                            .weight_decay = 0.5, .maximize = true}),
                       "AdamW with lerp's second form, amsgrad, maximize");
}

TEST(fused_optimizer_cpu_test, leaves_f16_parameters_to_the_unfused_path) {
  const FusedOptimGuard guard(true);
  Tensor w = full({64}, 0.5, {DType::f16}).requires_grad_();
  w.set_grad(full({64}, 0.25, {DType::f16}));
  optim::Adam opt({w}, {.lr = 0.1});
  const std::uint64_t calls = cpu::fused_optim_call_count();
  opt.step();
  EXPECT_EQ(cpu::fused_optim_call_count(), calls) << "an f16 parameter took the fused path";
  EXPECT_NE(w.detach().values()[0], 0.5) << "the step did not run";
}

TEST(fused_optimizer_cpu_test, skips_the_whole_step_when_found_inf_is_set_and_refuses_bad_tensors) {
  Generator gen(3);
  Tensor p = randn({5000}, gen), g = randn({5000}, gen), m = randn({5000}, gen), v = rand({5000}, gen);
  const std::vector<std::uint8_t> before = bytes_of(p), m_before = bytes_of(m);
  const float found = 1.0f;
  cpu::fused_adam_step({{p.kernel_view(), g.kernel_view(), m.kernel_view(), v.kernel_view(), {}, 1}}, {.lr = 0.1},
                       &found);
  EXPECT_EQ(bytes_of(p), before);
  EXPECT_EQ(bytes_of(m), m_before);
  Tensor h = full({5000}, 1.0, {DType::f16});
  EXPECT_THROW_MSG(cpu::fused_sgd_step({{h.kernel_view(), g.kernel_view(), {}, false}}, {.lr = 0.1}, nullptr),
                   DTypeError, "fused_sgd_step: param of tensor 0 is f16", "hint:");
  Tensor short_grad = randn({10}, gen);
  EXPECT_THROW_MSG(cpu::fused_adam_step({{p.kernel_view(), short_grad.kernel_view(), m.kernel_view(),
                                          v.kernel_view(), {}, 1}},
                                        {.lr = 0.1}, nullptr),
                   ShapeError, "fused_adam_step: grad of tensor 0 must be contiguous with 5000 elements (it has 10)");
  EXPECT_EQ(bytes_of(p), before) << "a refused step touched the parameter";
}

}  // namespace
}  // namespace ampscope
