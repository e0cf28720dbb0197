// The fused SGD/Adam/AdamW steps on CUDA (kernels/cuda/fused_amp.h) against the unfused per-op path on
// the same GPU and against the CPU backend: the same bits for parameters and every state tensor over
// several steps, for each option that changes the op sequence; and the device-side skip: with found_inf
// set, parameters and state keep their bits. Every test skips, saying why, where there is no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "tests/test_support.h"
#include "tests/fused_cuda_support.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include "kernels/cuda/fused_amp.h"
#endif

namespace ampscope {
namespace {

#if defined(AMPSCOPE_WITH_CUDA)

using testing::bytes_of;
using testing::expect_same_bits;
using testing::FusedGuard;

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Two parameters (one larger than a grid-stride step, one odd-sized), `steps` steps with fresh
// gradients each time (one gradient absent at step 1: no state for it yet). Returns the parameters and
// every state tensor after the last step.
std::vector<Tensor> train(Device device, bool fused, const MakeOptimizer& make, int steps) {
  const FusedGuard guard(fused);
  Generator gen(7);
  Tensor w = randn({1024, 300}, gen).to(device).requires_grad_();
  Tensor b = randn({37}, gen).to(device).requires_grad_();
  std::unique_ptr<optim::Optimizer> opt = make({w, b});
  for (int s = 0; s < steps; ++s) {
    Generator g(100 + s);
    w.set_grad(mul(randn({1024, 300}, g), 1e-2).to(device));
    b.set_grad(s == 1 ? Tensor() : randn({37}, g).to(device));
    const std::uint64_t calls = cuda::fused_amp_call_count();
    opt->step();
    // Fused against unfused means nothing if the fused run quietly took the unfused path.
    EXPECT_EQ(cuda::fused_amp_call_count() > calls, fused && device.is_cuda()) << "fused step, step " << s;
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
  const std::vector<Tensor> fused = train(Device::cuda(0), true, make, 4);
  const std::vector<Tensor> unfused = train(Device::cuda(0), false, make, 4);
  const std::vector<Tensor> cpu = train(Device::cpu(), false, make, 4);
  ASSERT_EQ(fused.size(), unfused.size()) << name;
  ASSERT_EQ(fused.size(), cpu.size()) << name;
  for (std::size_t i = 0; i < fused.size(); ++i) {
    expect_same_bits(unfused[i], fused[i], name + ", tensor " + std::to_string(i) + ", fused vs unfused on CUDA");
    expect_same_bits(cpu[i], fused[i], name + ", tensor " + std::to_string(i) + ", fused CUDA vs CPU");
  }
}

template <class Opt>
MakeOptimizer maker(optim::OptimizerOptions o) {
  return [o](std::vector<Tensor> params) { return std::make_unique<Opt>(std::move(params), o); };
}

#endif  // AMPSCOPE_WITH_CUDA

TEST(fused_optimizer_cuda_test, sgd_matches_the_unfused_ops_bit_for_bit) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_fused_matches(maker<optim::SGD>({.lr = 0.1}), "plain SGD");
  expect_fused_matches(maker<optim::SGD>({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2}),
                       "SGD with momentum, dampening, weight decay");
  expect_fused_matches(maker<optim::SGD>({.lr = 0.05, .momentum = 0.9, .nesterov = true, .maximize = true}),
                       "SGD nesterov maximize");
#endif
}

TEST(fused_optimizer_cuda_test, adam_and_adamw_match_the_unfused_ops_bit_for_bit) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_fused_matches(maker<optim::Adam>({.lr = 1e-3}), "Adam");
  expect_fused_matches(maker<optim::Adam>({.lr = 3e-3, .amsgrad = true, .weight_decay = 0.1}),
                       "Adam with coupled weight decay and amsgrad");
  expect_fused_matches(maker<optim::AdamW>({.lr = 3e-4}), "AdamW");
  // beta1 = 0.3 takes lerp's second form (weight 0.7 >= 0.5).
  expect_fused_matches(maker<optim::AdamW>({.lr = 1e-2, .betas = {{0.3, 0.99}}, .eps = 1e-6, .amsgrad = true,
                                            .weight_decay = 0.5, .maximize = true}),
                       "AdamW with lerp's second form, amsgrad, maximize");
#endif
}

TEST(fused_optimizer_cuda_test, leaves_f16_parameters_to_the_unfused_path) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  // Not eligible: the fused kernels take f32 only; the step must still run, unfused, with the CPU's bits.
  // The fast path is on, or the test would pass whatever the eligibility check does.
  const FusedGuard guard(true);
  std::vector<Tensor> results[2];
  for (const Device device : {Device::cpu(), Device::cuda(0)}) {
    Tensor w = full({64}, 0.5, {DType::f16, device}).requires_grad_();
    w.set_grad(full({64}, 0.25, {DType::f16, device}));
    optim::Adam opt({w}, {.lr = 0.1});
    const std::uint64_t calls = cuda::fused_amp_call_count();
    opt.step();
    EXPECT_EQ(cuda::fused_amp_call_count(), calls) << "an f16 parameter took the fused path on " << device.str();
    results[device.is_cuda()].push_back(w.detach());
  }
  const std::vector<std::uint8_t> a = bytes_of(results[0][0]), b = bytes_of(results[1][0]);
  EXPECT_EQ(a, b);
  EXPECT_NE(results[1][0].to(Device::cpu()).values()[0], 0.5) << "the step did not run";
#endif
}

TEST(fused_optimizer_cuda_test, skips_the_whole_step_on_the_device_when_found_inf_is_set) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  Backend& be = backend_for(Device::cuda(0));
  const TensorOptions on_gpu{DType::f32, Device::cuda(0)};
  Generator gen(3);
  const Tensor p0 = randn({5000}, gen).to(Device::cuda(0));
  const Tensor g = randn({5000}, gen).to(Device::cuda(0));
  const Tensor m0 = randn({5000}, gen).to(Device::cuda(0));
  const Tensor v0 = exp(randn({5000}, gen)).to(Device::cuda(0));
  for (const float flag : {1.0f, 0.0f}) {
    const Tensor found = full({}, flag, on_gpu);
    Tensor p = p0.clone(), m = m0.clone(), v = v0.clone(), vmax = v0.clone(), buf = m0.clone();
    cuda::fused_adam_step(be, {{p.kernel_view(), g.kernel_view(), m.kernel_view(), v.kernel_view(), vmax.kernel_view(), 3}},
                          {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .decoupled_weight_decay = true},
                          static_cast<const float*>(found.data()));
    Tensor q = p0.clone();
    cuda::fused_sgd_step(be, {{q.kernel_view(), g.kernel_view(), buf.kernel_view(), false}},
                         {.lr = 0.1, .momentum = 0.9}, static_cast<const float*>(found.data()));
    const bool skipped = flag != 0.0f;
    EXPECT_EQ(bytes_of(p) == bytes_of(p0), skipped) << "Adam param, found_inf " << flag;
    EXPECT_EQ(bytes_of(m) == bytes_of(m0), skipped) << "exp_avg, found_inf " << flag;
    EXPECT_EQ(bytes_of(v) == bytes_of(v0), skipped) << "exp_avg_sq, found_inf " << flag;
    EXPECT_EQ(bytes_of(q) == bytes_of(p0), skipped) << "SGD param, found_inf " << flag;
    EXPECT_EQ(bytes_of(buf) == bytes_of(m0), skipped) << "momentum buffer, found_inf " << flag;
  }
#endif
}

TEST(fused_optimizer_cuda_test, refuses_a_non_f32_tensor_before_launching_anything) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  Backend& be = backend_for(Device::cuda(0));
  Tensor p = zeros({8}, {DType::f16, Device::cuda(0)});
  Tensor g = zeros({8}, {DType::f32, Device::cuda(0)});
  EXPECT_THROW_MSG(cuda::fused_sgd_step(be, {{p.kernel_view(), g.kernel_view(), TensorView{}, false}}, {}, nullptr),
                   DTypeError, "fused_sgd_step: param of tensor 0 is f16", "hint:");
#endif
}

}  // namespace
}  // namespace ampscope
