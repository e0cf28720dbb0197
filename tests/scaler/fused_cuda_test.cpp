// The fused AMP kernels on CUDA (kernels/cuda/fused_amp.h) against the unfused per-op path on the same
// GPU and against the CPU backend: the same bits for the unscaled gradients and found_inf, and the
// device scale update against section 1.9 of the reference worked by hand. Every test skips, saying
// why, where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/backend.h"
#include "core/grad_scaler.h"
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

// A gradient with every kind of value: normal values around `magnitude`, zeros, subnormals (of the
// dtype), and, when `poison`, one +inf, one -inf and one NaN.
Tensor make_grad(std::int64_t n, DType dtype, double magnitude, bool poison, std::uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v = randn({n}, gen, {DType::f64}).values();
  for (double& x : v) x *= magnitude;
  if (n > 8) {
    v[1] = 0.0;
    v[2] = -0.0;
    v[3] = dtype == DType::f16 ? 1e-6 : 1e-40;  // subnormal in the dtype (f64: a tiny normal)
  }
  if (poison && n > 8) {
    v[5] = std::numeric_limits<double>::infinity();
    v[6] = -std::numeric_limits<double>::infinity();
    v[7] = std::numeric_limits<double>::quiet_NaN();
  }
  return from_values(v, {n}, {dtype, Device::cpu()});
}

struct UnscaleResult {
  std::vector<Tensor> grads;
  Tensor found_inf;
};

UnscaleResult unscale_on(Device device, const std::vector<Tensor>& grads, float inv_scale, bool fused) {
  const FusedGuard guard(fused);
  UnscaleResult r;
  for (const Tensor& g : grads) r.grads.push_back(g.to(device).clone());
  r.found_inf = zeros({}, {DType::f32, device});
  const Tensor inv = full({}, inv_scale, {DType::f32, device});
  const std::uint64_t calls = cuda::fused_amp_call_count();
  non_finite_check_and_unscale_(r.grads, r.found_inf, inv);
  // The comparison means nothing if the "fused" run quietly took the unfused path.
  EXPECT_EQ(cuda::fused_amp_call_count() > calls, fused && device.is_cuda()) << "fused kernel launched";
  return r;
}

void expect_unscale_matches(const std::vector<Tensor>& grads, float inv_scale) {
  const UnscaleResult fused = unscale_on(Device::cuda(0), grads, inv_scale, true);
  const UnscaleResult unfused = unscale_on(Device::cuda(0), grads, inv_scale, false);
  const UnscaleResult cpu = unscale_on(Device::cpu(), grads, inv_scale, false);
  expect_same_bits(unfused.found_inf, fused.found_inf, "found_inf, fused vs unfused on CUDA");
  expect_same_bits(cpu.found_inf, fused.found_inf, "found_inf, fused CUDA vs CPU");
  for (std::size_t i = 0; i < grads.size(); ++i) {
    expect_same_bits(unfused.grads[i], fused.grads[i], "grad " + std::to_string(i) + ", fused vs unfused on CUDA");
    expect_same_bits(cpu.grads[i], fused.grads[i], "grad " + std::to_string(i) + ", fused CUDA vs CPU");
  }
}

#endif  // AMPSCOPE_WITH_CUDA

TEST(fused_unscale_cuda_test, unscales_every_dtype_with_the_bits_of_the_unfused_ops) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  // Sizes that are not multiples of the block size, one larger than a grid-stride step.
  const std::vector<Tensor> grads = {make_grad(1000, DType::f32, 65536.0, false, 1),
                                     make_grad(3, DType::f32, 1e3, false, 2),
                                     make_grad(1 << 20, DType::bf16, 3e4, false, 3),
                                     make_grad(777, DType::f64, 1e5, false, 4)};
  expect_unscale_matches(grads, 1.0f / 65536.0f);
  expect_unscale_matches(grads, static_cast<float>(1.0 / 3.0));  // not a power of two: rounding matters
#endif
}

TEST(fused_unscale_cuda_test, sets_found_inf_and_still_multiplies_non_finite_gradients) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  const std::vector<Tensor> grads = {make_grad(100, DType::f32, 1.0, false, 5), make_grad(100, DType::f32, 1.0, true, 6),
                                     make_grad(50, DType::f16, 1.0, true, 7)};
  expect_unscale_matches(grads, 0.5f);
  const UnscaleResult fused = unscale_on(Device::cuda(0), grads, 0.5f, true);
  EXPECT_EQ(fused.found_inf.item(), 1.0);
  const std::vector<double> g1 = fused.grads[1].to(Device::cpu()).values();
  EXPECT_EQ(g1[5], std::numeric_limits<double>::infinity());   // inf * 0.5 stays inf
  EXPECT_EQ(g1[6], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(g1[7]));
  EXPECT_EQ(g1[0], grads[1].values()[0] * 0.5);  // finite values of a poisoned gradient are unscaled too
#endif
}

TEST(fused_unscale_cuda_test, counts_an_f64_value_beyond_the_f32_range_as_non_finite) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  const Tensor g = from_values({1.0, 1e300, 2.0}, {3}, {DType::f64});
  const UnscaleResult fused = unscale_on(Device::cuda(0), {g}, 0.25f, true);
  EXPECT_EQ(fused.found_inf.item(), 1.0);
  EXPECT_EQ(fused.grads[0].to(Device::cpu()).values()[1], 1e300 * 0.25);  // multiplied in double
#endif
}

TEST(fused_unscale_cuda_test, passes_values_through_bit_for_bit_when_inv_scale_is_one) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  // A NaN with a payload: a multiply would make it the canonical NaN; 1.0 must not touch it.
  Tensor g = zeros({4}, {DType::f32, Device::cpu()});
  const std::uint32_t payload = 0x7FC01234u;
  std::memcpy(static_cast<std::uint32_t*>(g.data()) + 2, &payload, sizeof payload);
  const UnscaleResult fused = unscale_on(Device::cuda(0), {g}, 1.0f, true);
  expect_same_bits(g, fused.grads[0], "grad with inv_scale 1");
  EXPECT_EQ(fused.found_inf.item(), 1.0);
#endif
}

TEST(fused_unscale_cuda_test, never_clears_a_found_inf_that_is_already_set) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  const FusedGuard guard(true);
  std::vector<Tensor> grads = {ones({10}, {DType::f32, Device::cuda(0)})};
  Tensor found = full({}, 1.0, {DType::f32, Device::cuda(0)});
  non_finite_check_and_unscale_(grads, found, full({}, 0.5, {DType::f32, Device::cuda(0)}));
  EXPECT_EQ(found.item(), 1.0);
  EXPECT_EQ(grads[0].to(Device::cpu()).values()[9], 0.5);
#endif
}

TEST(fused_unscale_cuda_test, splits_more_tensors_than_one_launch_holds_into_several_launches) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  std::vector<Tensor> grads;
  for (int i = 0; i < 130; ++i) grads.push_back(make_grad(17 + i, DType::f32, 100.0, i == 129, 100 + i));
  expect_unscale_matches(grads, 0.125f);
  EXPECT_EQ(unscale_on(Device::cuda(0), grads, 0.125f, true).found_inf.item(), 1.0);  // only the last one
#endif
}

TEST(fused_unscale_cuda_test, grad_scaler_unscale_gives_the_same_gradients_and_verdict_fused_or_not) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  for (const bool poison : {false, true}) {
    std::vector<Tensor> results[2];
    bool stepped[2] = {};
    for (const bool fused : {false, true}) {
      const FusedGuard guard(fused);
      Tensor w = make_grad(300, DType::f32, 1.0, false, 11).to(Device::cuda(0)).requires_grad_();
      Tensor b = make_grad(7, DType::f32, 1.0, false, 12).to(Device::cuda(0)).requires_grad_();
      w.set_grad(make_grad(300, DType::f32, 4096.0, poison, 13).to(Device::cuda(0)));
      b.set_grad(make_grad(7, DType::f32, 4096.0, false, 14).to(Device::cuda(0)));
      optim::SGD opt({w, b}, {.lr = 0.1});
      GradScaler scaler({.device = "cuda", .init_scale = 1024.0});
      scaler.scale(ones({}, {DType::f32, Device::cuda(0)}));
      const std::uint64_t calls = cuda::fused_amp_call_count();
      stepped[fused] = scaler.step(opt);
      EXPECT_EQ(cuda::fused_amp_call_count() > calls, fused) << "fused kernels launched by step()";
      scaler.update();
      results[fused] = {w.detach().clone(), w.grad().clone(), b.detach().clone(), b.grad().clone()};
      EXPECT_EQ(scaler.get_scale(), poison ? 512.0 : 1024.0);
    }
    EXPECT_EQ(stepped[0], !poison);
    EXPECT_EQ(stepped[1], stepped[0]);
    for (std::size_t i = 0; i < results[0].size(); ++i) {
      expect_same_bits(results[0][i], results[1][i], "tensor " + std::to_string(i) + (poison ? " (overflow)" : ""));
    }
  }
#endif
}

// ---- the scale update on the device ----

#if defined(AMPSCOPE_WITH_CUDA)
// Section 1.9 worked in double by hand, independently of GradScaler::update.
struct HostScale {
  float scale;
  std::int32_t tracker;
  void update(bool found, double growth, double backoff, std::int64_t interval) {
    if (found) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff);
      tracker = 0;
      return;
    }
    if (tracker + 1 == interval) {
      const float g = static_cast<float>(static_cast<double>(scale) * growth);
      if (std::isfinite(g)) scale = g;
      tracker = 0;
    } else {
      ++tracker;
    }
  }
};

void expect_device_update_matches(float scale0, std::int32_t tracker0, const std::vector<bool>& found_seq,
                                  double growth, double backoff, std::int64_t interval) {
  Backend& be = backend_for(Device::cuda(0));
  Tensor scale = full({}, scale0, {DType::f32, Device::cuda(0)});
  // The tracker is an int32 on the device (PyTorch's); an f32 tensor of one element provides its 4 bytes.
  Tensor tracker32 = zeros({1}, {DType::f32, Device::cuda(0)});
  be.copy_from_host(tracker32.data(), &tracker0, sizeof tracker0);
  HostScale host{scale0, tracker0};
  for (std::size_t i = 0; i < found_seq.size(); ++i) {
    const Tensor found = full({}, found_seq[i] ? 1.0 : 0.0, {DType::f32, Device::cuda(0)});
    cuda::fused_update_scale(be, static_cast<float*>(scale.data()), static_cast<std::int32_t*>(tracker32.data()),
                             static_cast<const float*>(found.data()), growth, backoff, interval);
    host.update(found_seq[i], growth, backoff, interval);
    float got_scale = 0;
    std::int32_t got_tracker = -1;
    be.copy_to_host(&got_scale, scale.data(), sizeof got_scale);
    be.copy_to_host(&got_tracker, tracker32.data(), sizeof got_tracker);
    EXPECT_EQ(std::memcmp(&got_scale, &host.scale, sizeof got_scale), 0)
        << "update " << i << ": scale " << got_scale << ", expected " << host.scale;
    EXPECT_EQ(got_tracker, host.tracker) << "update " << i;
  }
}
#endif

TEST(fused_update_scale_cuda_test, grows_backs_off_and_tracks_as_section_1_9) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  // The worked trace of section 1.14's shape: interval 3, growth 2, backoff 0.5.
  expect_device_update_matches(65536.0f, 0, {false, false, false, true, false, true, false, false, false}, 2.0, 0.5,
                               3);
  // A factor that is not a power of two: the product is rounded once from double.
  expect_device_update_matches(3.0f, 0, {false, true, false, false, true}, 1.1, 0.3, 2);
#endif
}

TEST(fused_update_scale_cuda_test, refuses_to_grow_to_infinity_but_resets_the_tracker) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_device_update_matches(std::numeric_limits<float>::max(), 0, {false, false, false}, 2.0, 0.5, 1);
#endif
}

TEST(fused_update_scale_cuda_test, backs_off_below_one_into_subnormals_without_a_floor) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_device_update_matches(1e-37f, 0, std::vector<bool>(30, true), 2.0, 0.5, 2000);
#endif
}

TEST(fused_update_scale_cuda_test, never_grows_with_an_interval_of_zero) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_device_update_matches(8.0f, 0, {false, false, false, false}, 2.0, 0.5, 0);
#endif
}

}  // namespace
}  // namespace ampscope
