// tests/scaler/grad_scaler_test.cpp: GradScaler of core/grad_scaler.h against reference/amp-semantics.md
// section 1 and PyTorch's test_grad_scaling_* checks (section 3).
//
// Expected values come from the reference's tables (the worked trace of 1.14, the update_scale and
// state_dict checks), from the update rule of 1.9 worked by hand, and from exact binary arithmetic:
// multiplying by a power of two is exact, so 4.0 * 0.25 is exactly 1.0 and a gradient scaled by 2^k
// is exactly 2^k times the unscaled one. float(1 / 3.0) = 0.3333333432674408 is the f32 rounding of
// the double reciprocal. Error texts are PyTorch's, copied from the reference.
#include "core/grad_scaler.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/optim.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr const char* kFix =
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";

// A leaf parameter holding `values` (f32 unless asked), named.
Tensor param(const std::vector<double>& values, const std::string& name, DType dtype = DType::f32) {
  Tensor p = from_values(values, {static_cast<std::int64_t>(values.size())}, {dtype});
  p.requires_grad_();
  p.set_name(name);
  return p;
}

// loss = sum(w * x), so d loss / d w = x, and after scale(loss).backward() the gradient is x * scale.
void scaled_backward(GradScaler& scaler, const Tensor& w, const std::vector<double>& x) {
  scaler.scale(sum(mul(w, from_values(x, {static_cast<std::int64_t>(x.size())})))).backward();
}

// One iteration of PyTorch's loop on one parameter: zero_grad, scaled backward, an inf in the
// gradient when `overflow`, step, update. Returns whether the optimizer stepped.
bool iteration(GradScaler& scaler, Tensor& w, optim::Optimizer& opt, bool overflow) {
  opt.zero_grad();
  scaled_backward(scaler, w, {1.0, -2.0});
  if (overflow) w.grad().set({1}, kInf);
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

// ---- construction ----

TEST(grad_scaler_test, has_pytorchs_defaults) {
  GradScaler scaler({.device = "cpu"});
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.get_growth_factor(), 2.0);
  EXPECT_EQ(scaler.get_backoff_factor(), 0.5);
  EXPECT_EQ(scaler.get_growth_interval(), 2000);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  EXPECT_EQ(scaler.get_hysteresis_tracker(), -1);
  EXPECT_FALSE(scaler.extensions().any());
  EXPECT_EQ(GradScalerOptions{}.device, "cuda");
}

TEST(grad_scaler_test, refuses_a_growth_factor_not_above_one) {
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .growth_factor = 1.0}), GradScalerError,
                   "The growth factor must be > 1.0.");
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .growth_factor = kNaN}), GradScalerError,
                   "The growth factor must be > 1.0.");
}

TEST(grad_scaler_test, refuses_a_backoff_factor_not_below_one) {
  EXPECT_THROW_MSG(GradScaler({.device = "cpu", .backoff_factor = 1.0}), GradScalerError,
                   "The backoff factor must be < 1.0.");
  // No > 0 check, as in PyTorch.
  EXPECT_NO_THROW(GradScaler({.device = "cpu", .backoff_factor = -1.0}));
}

TEST(grad_scaler_test, disabled_scaler_checks_nothing) {
  EXPECT_NO_THROW(GradScaler({.device = "cpu", .growth_factor = 0.5, .backoff_factor = 3.0, .enabled = false}));
}

TEST(grad_scaler_test, cuda_without_a_gpu_warns_and_disables_itself) {
  if (cuda_status().device_count > 0) GTEST_SKIP() << "a CUDA device is present, so a cuda scaler stays enabled";
  GradScaler scaler;  // device "cuda", PyTorch's default
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_NE(scaler.disabled_reason().find("CUDA is not available"), std::string::npos) << scaler.disabled_reason();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(grad_scaler_test, refuses_an_unknown_device) {
  EXPECT_THROW(GradScaler({.device = "tpu"}), DeviceError);
}

// ---- scale ----

TEST(grad_scaler_test, creates_its_state_at_the_first_scale_call) {
  GradScaler scaler({.device = "cpu", .init_scale = 3.3});
  EXPECT_EQ(scaler.get_scale(), 3.3);  // init_scale itself until the f32 tensor exists
  const Tensor out = scaler.scale(full({}, 1.0));
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(3.3f));
  EXPECT_EQ(out.item(), static_cast<double>(3.3f));
  // No state change: the same scale every call.
  EXPECT_EQ(scaler.scale(full({}, 1.0)).item(), static_cast<double>(3.3f));
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

TEST(grad_scaler_test, scale_follows_pytorchs_type_promotion) {
  GradScaler scaler({.device = "cpu"});
  const Tensor f32_loss = scaler.scale(full({}, 2.0));
  EXPECT_EQ(f32_loss.dtype(), DType::f32);
  EXPECT_EQ(f32_loss.item(), 131072.0);
  // A 0-dim f16 loss meets a 0-dim f32 scale: f32, so 2 * 65536 does not overflow f16's 65504.
  const Tensor f16_loss = scaler.scale(full({}, 2.0, {DType::f16}));
  EXPECT_EQ(f16_loss.dtype(), DType::f32);
  EXPECT_EQ(f16_loss.item(), 131072.0);
  // A dimensioned f16 tensor outranks the 0-dim scale: it stays f16 and overflows.
  const Tensor f16_outputs = scaler.scale(from_values({2.0, 0.5}, {2}, {DType::f16}));
  EXPECT_EQ(f16_outputs.dtype(), DType::f16);
  EXPECT_EQ(f16_outputs.values(), (std::vector<double>{kInf, 32768.0}));
}

TEST(grad_scaler_test, scales_each_tensor_of_a_list) {
  // test_grad_scaling_scale: init 2, 4.0 -> 8.0.
  GradScaler scaler({.device = "cpu", .init_scale = 2.0});
  const std::vector<Tensor> out = scaler.scale(std::vector<Tensor>{full({}, 4.0), full({2}, 4.0, {DType::f64})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].item(), 8.0);
  EXPECT_EQ(out[1].values(), (std::vector<double>{8.0, 8.0}));
  EXPECT_EQ(out[1].dtype(), DType::f64);
  EXPECT_THROW_MSG(scaler.scale(std::vector<Tensor>{full({}, 1.0), Tensor()}), GradScalerError,
                   "outputs must be a Tensor or an iterable of Tensors");
  EXPECT_THROW_MSG(scaler.scale(Tensor()), GradScalerError, "outputs must be a Tensor or an iterable of Tensors");
}

TEST(grad_scaler_test, scale_creates_its_state_on_the_first_tensors_device) {
  // test_grad_scaling_scale on two devices: one scale copy per device, the state on the first one's.
  SKIP_WITHOUT_GPU();
  GradScaler scaler({.device = "cuda", .init_scale = 2.0});
  const std::vector<Tensor> out = scaler.scale(std::vector<Tensor>{full({}, 4.0).to(Device::cuda()), full({}, 4.0)});
  EXPECT_EQ(out[0].device(), Device::cuda());
  EXPECT_EQ(out[1].device(), Device::cpu());
  EXPECT_EQ(out[0].item(), 8.0);
  EXPECT_EQ(out[1].item(), 8.0);
  // The scaler's own state lives on cuda: an unscale_ of a CUDA gradient needs no copy of it.
  Tensor w = zeros({2}).to(Device::cuda()).requires_grad_();
  w.set_grad(full({2}, 4.0).to(Device::cuda()));
  optim::SGD opt({w}, {.lr = 0.5});
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(w.values(), (std::vector<double>{-1.0, -1.0}));  // 0 - 0.5 * 4 / 2
}

TEST(grad_scaler_test, scaled_loss_back_propagates_scaled_gradients) {
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0});
  Tensor w = param({0.5, 0.25}, "w");
  scaled_backward(scaler, w, {3.0, -0.125});
  EXPECT_EQ(w.grad().values(), (std::vector<double>{3.0 * 1024, -0.125 * 1024}));
}

// ---- the unscale kernel (test_grad_scaling_unscale) ----

TEST(grad_scaler_test, unscale_kernel_unscales_contiguous_transposed_and_sliced_grads) {
  const Tensor inv_scale = full({1}, 0.25);
  const Tensor g = full({20, 20}, 4.0);
  Tensor found_inf = zeros({1});
  const std::vector<Tensor> grads = {g.clone().transpose(0, 1), g.clone().slice(1, 0, 5), g.clone()};
  EXPECT_FALSE(grads[0].is_contiguous());
  EXPECT_FALSE(grads[1].is_contiguous());
  non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  EXPECT_EQ(found_inf.item(), 0.0);
  for (const Tensor& grad : grads) {
    for (double v : grad.values()) ASSERT_EQ(v, 1.0);
  }
}

TEST(grad_scaler_test, unscale_kernel_finds_inf_and_nan) {
  const Tensor inv_scale = full({1}, 0.25);
  for (double bad : {kInf, -kInf, kNaN}) {
    Tensor g = full({20, 20}, 4.0);
    g.set({2, 2}, bad);
    Tensor found_inf = zeros({1});
    non_finite_check_and_unscale_({g.clone().transpose(0, 1), g.slice(1, 0, 5)}, found_inf, inv_scale);
    EXPECT_EQ(found_inf.item(), 1.0) << bad;
    // The non-finite element is still multiplied: inf stays inf, NaN stays NaN; the rest are unscaled.
    const double v = g.at({2, 2});
    if (std::isnan(bad)) {
      EXPECT_TRUE(std::isnan(v));
    } else {
      EXPECT_EQ(v, bad);
    }
    EXPECT_EQ(g.at({2, 3}), 1.0);
    EXPECT_EQ(g.at({2, 7}), 4.0);  // outside the slice
  }
}

TEST(grad_scaler_test, unscale_kernel_only_ever_sets_found_inf) {
  Tensor found_inf = full({}, 1.0);
  non_finite_check_and_unscale_({full({3}, 4.0)}, found_inf, full({}, 0.25));
  EXPECT_EQ(found_inf.item(), 1.0);
}

TEST(grad_scaler_test, unscale_kernel_handles_mixed_f32_and_f16_lists) {
  // A raw call with mixed dtypes unscales each (PyTorch falls back to per-tensor kernels), and an inf
  // injected anywhere in the "perfect storm" list is found.
  const Tensor g = full({20, 20}, 4.0);
  const Tensor inv_scale = full({1}, 0.25);
  for (int inject = -1; inject < 4; ++inject) {
    std::vector<Tensor> grads = {g.clone(), g.clone().slice(1, 0, 5), g.to(DType::f16), g.to(DType::f16)};
    if (inject >= 0) grads[static_cast<std::size_t>(inject)].set({2, 3}, kInf);
    Tensor found_inf = zeros({1});
    non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    EXPECT_EQ(found_inf.item(), inject < 0 ? 0.0 : 1.0) << "inf injected in grads[" << inject << "]";
    if (inject < 0) {
      for (const Tensor& grad : grads) {
        for (double v : grad.values()) ASSERT_EQ(v, 1.0);
      }
    }
  }
}

TEST(grad_scaler_test, unscale_kernel_passes_values_through_when_inv_scale_is_exactly_one) {
  Tensor g = zeros({2});
  // A NaN with a payload: a multiply would give the canonical NaN, the pass-through keeps the bits.
  const std::uint32_t payload_nan = 0x7fc01234u;
  float* p = g.data_as<float>();
  std::memcpy(&p[0], &payload_nan, sizeof(float));
  p[1] = 3.0f;
  Tensor found_inf = zeros({1});
  non_finite_check_and_unscale_({g}, found_inf, full({1}, 1.0));
  EXPECT_EQ(found_inf.item(), 1.0);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(g.data_as<float>()[0]), payload_nan);
  EXPECT_EQ(g.data_as<float>()[1], 3.0f);
}

TEST(grad_scaler_test, unscale_kernel_counts_f64_values_beyond_f32_range_as_non_finite) {
  // PyTorch tests finiteness on a float, even for f64 gradients.
  Tensor g = from_values({1e300, 4.0}, {2}, {DType::f64});
  Tensor found_inf = zeros({1});
  non_finite_check_and_unscale_({g}, found_inf, full({1}, 0.25));
  EXPECT_EQ(found_inf.item(), 1.0);
  EXPECT_EQ(g.values(), (std::vector<double>{1e300 * 0.25, 1.0}));  // unscaled in double
}

TEST(grad_scaler_test, unscale_kernel_checks_its_arguments) {
  Tensor found_inf = zeros({1});
  EXPECT_THROW_MSG(non_finite_check_and_unscale_({zeros({2})}, found_inf, full({2}, 0.25)), ShapeError,
                   "inv_scale must be a 1-element tensor.");
  Tensor two = zeros({2});
  EXPECT_THROW_MSG(non_finite_check_and_unscale_({zeros({2})}, two, full({1}, 0.25)), ShapeError,
                   "found_inf must be a 1-element tensor.");
  Tensor f64_found = zeros({1}, {DType::f64});
  EXPECT_THROW_MSG(non_finite_check_and_unscale_({zeros({2})}, f64_found, full({1}, 0.25)), DTypeError,
                   "found_inf must be a float tensor.", "f64");
  EXPECT_THROW_MSG(non_finite_check_and_unscale_({zeros({2})}, found_inf, full({1}, 0.25, {DType::f64})),
                   DTypeError, "inv_scale must be a float tensor.", "f64");
  // An empty list is a no-op.
  EXPECT_NO_THROW(non_finite_check_and_unscale_({}, found_inf, full({1}, 0.25)));
}

TEST(grad_scaler_test, unscale_kernel_refuses_grads_on_two_devices) {
  SKIP_WITHOUT_GPU();
  Tensor found_inf = zeros({1});
  EXPECT_THROW_MSG(non_finite_check_and_unscale_({zeros({2}), zeros({2}).to(Device::cuda())}, found_inf,
                                                 full({1}, 0.25)),
                   DeviceError, "all grads must be on one device", "cuda:0");
}

// ---- unscale_ ----

TEST(grad_scaler_test, unscale_divides_contiguous_transposed_and_sliced_grads_in_place) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0});  // inv_scale 0.25
  scaler.scale(full({}, 1.0));
  Tensor a = zeros({20, 20}).requires_grad_();
  Tensor b = zeros({20, 20}).requires_grad_();
  Tensor c = zeros({20, 5}).requires_grad_();
  const Tensor base_b = full({20, 20}, 4.0), base_c = full({20, 20}, 4.0);
  a.set_grad(full({20, 20}, 4.0));
  b.set_grad(base_b.transpose(0, 1));
  c.set_grad(base_c.slice(1, 0, 5));
  optim::SGD opt({a, b, c}, {.lr = 1.0});
  scaler.unscale_(opt);
  for (const Tensor& p : {a, b, c}) {
    for (double v : p.grad().values()) ASSERT_EQ(v, 1.0);
  }
  // Written through the views into the tensors they view.
  EXPECT_EQ(base_b.at({3, 7}), 1.0);
  EXPECT_EQ(base_c.at({3, 4}), 1.0);
  EXPECT_EQ(base_c.at({3, 5}), 4.0);
}

TEST(grad_scaler_test, unscale_multiplies_by_the_f32_rounded_double_reciprocal) {
  GradScaler scaler({.device = "cpu", .init_scale = 3.0});
  Tensor w = param({0.0}, "w");
  scaled_backward(scaler, w, {1.0});  // grad 3.0
  optim::SGD opt({w});
  scaler.unscale_(opt);
  EXPECT_EQ(w.grad().item(), static_cast<double>(3.0f * static_cast<float>(1.0 / 3.0)));
  EXPECT_EQ(static_cast<double>(static_cast<float>(1.0 / 3.0)), 0.3333333432674408);
}

TEST(grad_scaler_test, unscale_refuses_f16_gradients_before_touching_any) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0});
  scaler.scale(full({}, 1.0));
  Tensor a = param({1.0, 2.0}, "fc1.weight");
  Tensor h = param({1.0, 2.0}, "fc2.weight", DType::f16);
  a.set_grad(full({2}, 4.0));
  h.set_grad(full({2}, 4.0, {DType::f16}));
  optim::SGD opt({a, h});
  EXPECT_THROW_MSG(scaler.unscale_(opt), DTypeError, "Attempting to unscale FP16 gradients.", "fc2.weight", "SGD #0");
  EXPECT_EQ(a.grad().values(), (std::vector<double>{4.0, 4.0}));  // the f32 gradient was not unscaled
  // The stage stayed READY: without the f16 gradient, unscale_ runs (no "already been called").
  h.set_grad(Tensor());
  scaler.unscale_(opt);
  EXPECT_EQ(a.grad().values(), (std::vector<double>{1.0, 1.0}));
}

TEST(grad_scaler_test, unscale_skips_parameters_without_gradients) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0});
  Tensor w = param({1.0}, "w"), unused = param({1.0}, "unused");
  scaled_backward(scaler, w, {2.0});
  optim::SGD opt({w, unused}, {.lr = 1.0});
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_EQ(w.item(), 1.0 - 2.0);
  EXPECT_FALSE(unused.grad().defined());
}

// ---- the state machine and its errors ----

TEST(grad_scaler_test, unscale_step_and_update_need_a_scale_call_first) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  w.set_grad(full({1}, 1.0));
  optim::SGD opt({w});
  EXPECT_THROW_MSG(scaler.unscale_(opt), GradScalerError, "Attempted unscale_ but _scale is None.  ", kFix);
  EXPECT_THROW_MSG(scaler.step(opt), GradScalerError, "Attempted step but _scale is None.  ", kFix);
  EXPECT_THROW_MSG(scaler.update(), GradScalerError, "Attempted update but _scale is None.  ", kFix);
  EXPECT_THROW_MSG(scaler.update(8.0), GradScalerError, "Attempted update but _scale is None.  ", kFix);
}

TEST(grad_scaler_test, refuses_a_second_unscale_before_update) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  scaled_backward(scaler, w, {1.0});
  optim::Adam opt({w});
  scaler.unscale_(opt);
  EXPECT_THROW_MSG(scaler.unscale_(opt), GradScalerError,
                   "unscale_() has already been called on this optimizer since the last update().", "Adam #0");
  // step() uses the recorded check and does not unscale again.
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST(grad_scaler_test, refuses_unscale_after_step) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  scaled_backward(scaler, w, {1.0});
  optim::SGD opt({w});
  scaler.step(opt);
  EXPECT_THROW_MSG(scaler.unscale_(opt), GradScalerError, "unscale_() is being called after step().");
}

TEST(grad_scaler_test, refuses_a_second_step_before_update) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  scaled_backward(scaler, w, {1.0});
  optim::SGD opt({w});
  scaler.step(opt);
  EXPECT_THROW_MSG(scaler.step(opt), GradScalerError, "step() has already been called since the last update().");
  scaler.update();
  // update() starts the next iteration: the same optimizer may step again.
  scaled_backward(scaler, w, {1.0});
  EXPECT_NO_THROW(scaler.step(opt));
}

TEST(grad_scaler_test, refuses_to_step_an_optimizer_without_gradients) {
  GradScaler scaler({.device = "cpu"});
  scaler.scale(full({}, 1.0));
  Tensor w = param({1.0}, "w");
  optim::SGD opt({w});
  EXPECT_THROW_MSG(scaler.step(opt), GradScalerError, "No inf checks were recorded for this optimizer.");
}

TEST(grad_scaler_test, refuses_update_without_any_recorded_check) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  scaled_backward(scaler, w, {1.0});
  EXPECT_THROW_MSG(scaler.update(), GradScalerError, "No inf checks were recorded prior to update.");
  optim::SGD opt({w});
  scaler.step(opt);
  scaler.update();
  // A second update() without a step has nothing recorded either.
  EXPECT_THROW_MSG(scaler.update(), GradScalerError, "No inf checks were recorded prior to update.");
}

TEST(grad_scaler_test, refuses_a_closure_while_enabled) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0}, "w");
  optim::SGD opt({w});
  EXPECT_THROW_MSG(scaler.step(opt, [] { return Tensor(); }), GradScalerError,
                   "Closure use is not currently supported if GradScaler is enabled.");
}

TEST(grad_scaler_test, step_reports_found_inf_when_asked) {
  GradScaler scaler({.device = "cpu"});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w}, {.lr = 0.5});
  scaled_backward(scaler, w, {1.0, kNaN});
  const StepResult skipped = scaler.step(opt, return_found_inf);
  EXPECT_FALSE(skipped.stepped);
  EXPECT_TRUE(skipped.found_inf);
  EXPECT_EQ(w.values(), (std::vector<double>{1.0, 1.0}));
  scaler.update();
  opt.zero_grad();
  scaled_backward(scaler, w, {1.0, 2.0});
  const StepResult stepped = scaler.step(opt, return_found_inf);
  EXPECT_TRUE(stepped.stepped);
  EXPECT_FALSE(stepped.found_inf);
  EXPECT_EQ(w.values(), (std::vector<double>{0.5, 0.0}));
}

// ---- update ----

TEST(grad_scaler_test, update_scale_matches_pytorchs_check) {
  // test_grad_scaling_update_scale: growth 2, backoff 0.25, interval 2, scale 4:
  // clean -> (4, tracker 1); clean -> (8, 0); inf -> (2, 0).
  GradScaler scaler({.device = "cpu", .init_scale = 4.0, .growth_factor = 2.0, .backoff_factor = 0.25,
                     .growth_interval = 2});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  iteration(scaler, w, opt, false);
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
  iteration(scaler, w, opt, false);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  iteration(scaler, w, opt, true);
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

TEST(grad_scaler_test, reproduces_the_worked_trace) {
  // reference 1.14: init 65536, growth 2, backoff 0.5, interval 3.
  const std::vector<bool> found_inf = {false, false, false, true, false, true, true, false, false, false};
  const std::vector<double> scale_after = {65536, 65536, 131072, 65536, 65536, 32768, 16384, 16384, 16384, 32768};
  const std::vector<std::int64_t> tracker_after = {1, 2, 0, 0, 1, 0, 0, 1, 2, 0};
  GradScaler scaler({.device = "cpu", .growth_interval = 3});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w}, {.lr = 0.125});
  for (std::size_t i = 0; i < found_inf.size(); ++i) {
    const std::vector<double> before = w.values();
    const bool stepped = iteration(scaler, w, opt, found_inf[i]);
    EXPECT_EQ(stepped, !found_inf[i]) << "iteration " << i + 1;
    if (found_inf[i]) {
      EXPECT_EQ(w.values(), before) << "iteration " << i + 1 << " was skipped";
    } else {
      // gradient (1, -2), lr 1/8: exact steps.
      EXPECT_EQ(w.values(), (std::vector<double>{before[0] - 0.125, before[1] + 0.25})) << "iteration " << i + 1;
    }
    EXPECT_EQ(scaler.get_scale(), scale_after[i]) << "iteration " << i + 1;
    EXPECT_EQ(scaler.get_growth_tracker(), tracker_after[i]) << "iteration " << i + 1;
  }
}

TEST(grad_scaler_test, will_not_grow_the_scale_to_infinity) {
  // test_grad_scale_will_not_overflow: init 1e38, growth 16, interval 1; 1.6e39 is inf in f32.
  GradScaler scaler({.device = "cpu", .init_scale = 1e38, .growth_factor = 16.0, .growth_interval = 1});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  for (int i = 0; i < 3; ++i) {
    iteration(scaler, w, opt, false);
    EXPECT_EQ(scaler.get_scale(), static_cast<double>(1e38f));
    EXPECT_EQ(scaler.get_growth_tracker(), 0);  // reset although the growth was refused
  }
}

TEST(grad_scaler_test, backoff_has_no_lower_bound) {
  GradScaler scaler({.device = "cpu", .init_scale = 0x1p-148, .backoff_factor = 0.5});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  iteration(scaler, w, opt, true);
  EXPECT_EQ(scaler.get_scale(), 0x1p-149);  // the smallest f32 subnormal
  iteration(scaler, w, opt, true);
  EXPECT_EQ(scaler.get_scale(), 0.0);  // 2^-150 rounds to even: 0
}

TEST(grad_scaler_test, a_non_positive_growth_interval_never_grows) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0, .growth_interval = 0});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  for (int i = 0; i < 3; ++i) iteration(scaler, w, opt, false);
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 3);
}

TEST(grad_scaler_test, update_with_a_new_scale_sets_it_and_keeps_the_tracker) {
  GradScaler scaler({.device = "cpu", .growth_interval = 5});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  iteration(scaler, w, opt, false);
  iteration(scaler, w, opt, false);
  ASSERT_EQ(scaler.get_growth_tracker(), 2);
  scaled_backward(scaler, w, {1.0, 1.0});
  scaler.update(3.3);  // no step and no found_inf needed
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(3.3f));
  EXPECT_EQ(scaler.get_growth_tracker(), 2);
  scaler.update(from_values({256.0}, {1}, {DType::f64}));
  EXPECT_EQ(scaler.get_scale(), 256.0);
  scaler.update(-1.0);  // no positivity check
  EXPECT_EQ(scaler.get_scale(), -1.0);
}

TEST(grad_scaler_test, update_refuses_a_new_scale_tensor_that_is_not_one_plain_element) {
  GradScaler scaler({.device = "cpu"});
  scaler.scale(full({}, 1.0));
  const char* reason =
      "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with "
      "requires_grad=False.";
  EXPECT_THROW_MSG(scaler.update(full({2}, 8.0)), GradScalerError, reason, "[2]");
  EXPECT_THROW_MSG(scaler.update(full({1}, 8.0).requires_grad_()), GradScalerError, reason, "requires grad");
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

TEST(grad_scaler_test, update_refuses_a_new_scale_on_another_device_type) {
  SKIP_WITHOUT_GPU();
  GradScaler scaler({.device = "cpu"});
  scaler.scale(full({}, 1.0));
  EXPECT_THROW_MSG(scaler.update(full({1}, 8.0).to(Device::cuda())), GradScalerError,
                   "new_scale should be a float or a 1-element", "cuda:0");
}

TEST(grad_scaler_test, setters_take_effect_at_the_next_update_without_checks) {
  GradScaler scaler({.device = "cpu", .init_scale = 8.0, .growth_interval = 100});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  scaler.set_growth_factor(3.0);
  scaler.set_growth_interval(1);
  iteration(scaler, w, opt, false);
  EXPECT_EQ(scaler.get_scale(), 24.0);
  scaler.set_backoff_factor(2.0);  // not < 1, accepted: setters do not validate
  EXPECT_EQ(scaler.get_backoff_factor(), 2.0);
  iteration(scaler, w, opt, true);
  EXPECT_EQ(scaler.get_scale(), 48.0);
  EXPECT_EQ(scaler.get_growth_factor(), 3.0);
  EXPECT_EQ(scaler.get_growth_interval(), 1);
}

// ---- state_dict ----

TEST(grad_scaler_test, state_dict_has_exactly_pytorchs_keys_and_types) {
  GradScaler scaler({.device = "cpu", .init_scale = 4.0, .growth_interval = 3});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  iteration(scaler, w, opt, false);
  const StateDict sd = scaler.state_dict();
  ASSERT_EQ(sd.size(), 5u);
  EXPECT_EQ(std::get<double>(sd.at("scale")), 4.0);
  EXPECT_EQ(std::get<double>(sd.at("growth_factor")), 2.0);
  EXPECT_EQ(std::get<double>(sd.at("backoff_factor")), 0.5);
  EXPECT_EQ(std::get<std::int64_t>(sd.at("growth_interval")), 3);
  EXPECT_EQ(std::get<std::int64_t>(sd.at("_growth_tracker")), 1);
  EXPECT_TRUE(GradScaler({.device = "cpu", .enabled = false}).state_dict().empty());
}

TEST(grad_scaler_test, state_dict_loads_into_a_differently_configured_scaler_lazy_or_not) {
  // test_grad_scaling_state_dict: s0(3, 4, .5, 2) into s1(6, 7, .8, 1) whose tracker is 7.
  for (bool lazy_init_scale : {true, false}) {
    GradScaler s0({.device = "cpu", .init_scale = 3.0, .growth_factor = 4.0, .backoff_factor = 0.5,
                   .growth_interval = 2});
    GradScaler s1({.device = "cpu", .init_scale = 6.0, .growth_factor = 7.0, .backoff_factor = 0.8,
                   .growth_interval = 1});
    StateDict seven = s1.state_dict();  // a tracker value for the load to overwrite
    seven["_growth_tracker"] = std::int64_t{7};
    s1.load_state_dict(seven);
    ASSERT_EQ(s1.get_growth_tracker(), 7);
    if (lazy_init_scale) {
      const Tensor out = s1.scale(full({1}, 4.0));
      ASSERT_EQ(out.item(), 24.0);
    }
    s1.load_state_dict(s0.state_dict());
    EXPECT_EQ(s1.get_scale(), 3.0) << lazy_init_scale;
    EXPECT_EQ(s1.get_growth_factor(), 4.0);
    EXPECT_EQ(s1.get_backoff_factor(), 0.5);
    EXPECT_EQ(s1.get_growth_interval(), 2);
    EXPECT_EQ(s1.get_growth_tracker(), 0);
    // The loaded scale is what the next scale() multiplies by.
    EXPECT_EQ(s1.scale(full({}, 1.0)).item(), 3.0);
  }
}

TEST(grad_scaler_test, load_state_dict_refuses_an_empty_or_incomplete_dict) {
  GradScaler scaler({.device = "cpu"});
  EXPECT_THROW_MSG(scaler.load_state_dict({}), GradScalerError,
                   "The source state dict is empty, possibly because it was saved from a disabled instance of "
                   "GradScaler.");
  StateDict sd = scaler.state_dict();
  sd.erase("backoff_factor");
  sd["scale"] = 2.0;
  EXPECT_THROW_MSG(scaler.load_state_dict(sd), GradScalerError, "backoff_factor");
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // nothing loaded from a dict that fails
  // A disabled scaler loads nothing, whatever it is given.
  GradScaler disabled({.device = "cpu", .enabled = false});
  EXPECT_NO_THROW(disabled.load_state_dict({}));
  EXPECT_NO_THROW(disabled.load_state_dict(scaler.state_dict()));
  EXPECT_EQ(disabled.get_scale(), 1.0);
}

// ---- copies (PyTorch's pickling) ----

TEST(grad_scaler_test, copies_only_between_iterations) {
  GradScaler scaler({.device = "cpu", .init_scale = 16.0, .growth_interval = 3});
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w});
  iteration(scaler, w, opt, true);  // scale 8, tracker 0
  iteration(scaler, w, opt, false);  // tracker 1
  scaled_backward(scaler, w, {1.0, 1.0});
  GradScaler copy_after_scale = scaler;  // after scale(), before unscale_: allowed
  EXPECT_EQ(copy_after_scale.get_scale(), 8.0);
  EXPECT_EQ(copy_after_scale.get_growth_tracker(), 1);
  scaler.unscale_(opt);
  EXPECT_THROW_MSG(GradScaler copy = scaler, GradScalerError,
                   "A GradScaler instance may only be pickled at the beginning of an iteration, or at the end after "
                   "scaler.update().");
  scaler.step(opt);
  scaler.update();
  GradScaler copy = scaler;
  // The copy continues the run: its tensors are re-created from the current values at its first scale().
  EXPECT_EQ(copy.get_scale(), 8.0);
  EXPECT_EQ(copy.get_growth_tracker(), 2);
  iteration(copy, w, opt, false);
  EXPECT_EQ(copy.get_scale(), 16.0);
  EXPECT_EQ(copy.get_growth_tracker(), 0);
}

// ---- disabled ----

TEST(grad_scaler_test, disabled_scaler_leaves_the_loop_unchanged) {
  GradScaler scaler({.device = "cpu", .enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
  Tensor w = param({1.0, 1.0}, "w");
  optim::SGD opt({w}, {.lr = 0.5});
  const Tensor loss = sum(mul(w, from_values({1.0, 2.0}, {2})));
  const Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.id(), loss.id());  // the very same tensor
  scaled.backward();
  scaler.unscale_(opt);
  scaler.unscale_(opt);  // no state machine either
  EXPECT_EQ(w.grad().values(), (std::vector<double>{1.0, 2.0}));
  w.grad().set({0}, kInf);
  EXPECT_TRUE(scaler.step(opt));  // just steps, inf and all
  EXPECT_EQ(w.at({0}), -kInf);
  EXPECT_EQ(w.at({1}), 0.0);
  EXPECT_NO_THROW(scaler.update());
  EXPECT_NO_THROW(scaler.update(4.0));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  const StepResult r = scaler.step(opt, return_found_inf);
  EXPECT_TRUE(r.stepped);
  EXPECT_FALSE(r.found_inf);
  // A closure is allowed: it runs, the optimizer steps, and its loss comes back.
  int calls = 0;
  const Tensor closure_loss = scaler.step(opt, [&] {
    ++calls;
    return full({}, 5.0);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(closure_loss.item(), 5.0);
}

}  // namespace
}  // namespace ampscope
