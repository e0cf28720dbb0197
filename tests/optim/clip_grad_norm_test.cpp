// tests/optim/clip_grad_norm_test.cpp: clip_grad_norm_ of core/optim.h.
//
// Expected values: the total norm and the scaled gradients recomputed in double from the gradients'
// exact values (f32 results within 1e-6 relative: a sum of a few float squares and a square root,
// each off by at most half an ulp); f16 results from a _Float16 reference that follows PyTorch's steps
// (each per-gradient norm in float rounded to f16, the total from those in float rounded to f16, the
// coefficient as reciprocal(total + 1e-6) * max_norm in f16); non-finite cases worked out by hand:
// an inf total makes the coefficient 0, so finite gradients become 0 and infinite ones NaN (inf * 0);
// a NaN total makes every gradient NaN.
#include "core/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "tests/test_support.h"

namespace {

using namespace ampscope;
using namespace ampscope::optim;

using Vec = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor param_with_grad(const Vec& grad, DType dtype = DType::f32) {
  const Shape shape{static_cast<std::int64_t>(grad.size())};
  Tensor p = zeros(shape, {dtype});
  p.requires_grad_();
  p.set_grad(from_values(grad, shape, {dtype}));
  return p;
}

double l2(const std::vector<Vec>& grads) {
  double s = 0;
  for (const Vec& g : grads) {
    for (double x : g) s += x * x;
  }
  return std::sqrt(s);
}

void expect_rel(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, 1e-6 * std::fabs(expected)) << what;
}

// Values exact in f32, so the reference starts from what the tensors hold.
const Vec kG1 = {3.0, -4.0, 0.5};
const Vec kG2 = {1.0, 2.0, -2.0, 0.25};

TEST(clip_grad_norm_test, scales_gradients_down_to_max_norm) {
  Tensor a = param_with_grad(kG1), b = param_with_grad(kG2);
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  const double ref_total = l2({kG1, kG2});
  EXPECT_EQ(total.dim(), 0);
  EXPECT_EQ(total.dtype(), DType::f32);
  expect_rel(total.item(), ref_total, "total norm");
  const double coef = 1.0 / (ref_total + 1e-6);
  for (std::size_t i = 0; i < kG1.size(); ++i) expect_rel(a.grad().values()[i], kG1[i] * coef, "a.grad");
  for (std::size_t i = 0; i < kG2.size(); ++i) expect_rel(b.grad().values()[i], kG2[i] * coef, "b.grad");
  // The result clips to the norm asked for (within the 1e-6 guard).
  EXPECT_NEAR(l2({a.grad().values(), b.grad().values()}), 1.0, 1e-5);
}

TEST(clip_grad_norm_test, leaves_gradients_unchanged_below_max_norm) {
  Tensor a = param_with_grad(kG1), b = param_with_grad(kG2);
  const Tensor total = clip_grad_norm_({a, b}, 100.0);
  expect_rel(total.item(), l2({kG1, kG2}), "total norm");
  EXPECT_EQ(a.grad().values(), kG1);  // multiplied by exactly 1.0
  EXPECT_EQ(b.grad().values(), kG2);
}

TEST(clip_grad_norm_test, infinity_norm_is_the_largest_magnitude) {
  Tensor a = param_with_grad(kG1), b = param_with_grad(kG2);
  const Tensor total = clip_grad_norm_({a, b}, 2.0, kInfNorm);
  EXPECT_EQ(total.item(), 4.0);  // |-4|, exact
  const double coef = static_cast<float>(1.0f / (4.0f + 1e-6f)) * 2.0f;
  for (std::size_t i = 0; i < kG1.size(); ++i) expect_rel(a.grad().values()[i], kG1[i] * coef, "a.grad");
  for (std::size_t i = 0; i < kG2.size(); ++i) expect_rel(b.grad().values()[i], kG2[i] * coef, "b.grad");
}

TEST(clip_grad_norm_test, skips_parameters_without_gradients_and_returns_zero_for_none) {
  Tensor a = param_with_grad(kG1);
  Tensor no_grad = zeros({3});
  no_grad.requires_grad_();
  const Tensor total = clip_grad_norm_({no_grad, a}, 1.0);
  expect_rel(total.item(), l2({kG1}), "total with a skipped parameter");
  const Tensor none = clip_grad_norm_({no_grad}, 1.0);
  EXPECT_EQ(none.item(), 0.0);
  EXPECT_FALSE(no_grad.grad().defined());
}

TEST(clip_grad_norm_test, an_infinite_gradient_zeroes_finite_ones_and_turns_itself_nan) {
  Tensor a = param_with_grad({1.0, kInf, -2.0});
  Tensor b = param_with_grad(kG2);
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(total.item(), kInf);
  const Vec ga = a.grad().values();
  EXPECT_EQ(ga[0], 0.0);
  EXPECT_TRUE(std::isnan(ga[1]));
  EXPECT_EQ(ga[2], 0.0);  // -2 * 0 = -0, equal to 0
  for (double x : b.grad().values()) EXPECT_EQ(x, 0.0);
}

TEST(clip_grad_norm_test, a_nan_gradient_turns_every_gradient_nan) {
  Tensor a = param_with_grad({1.0, kNaN});
  Tensor b = param_with_grad(kG2);
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_TRUE(std::isnan(total.item()));
  for (double x : a.grad().values()) EXPECT_TRUE(std::isnan(x));
  for (double x : b.grad().values()) EXPECT_TRUE(std::isnan(x));
  // The infinity norm propagates NaN too.
  Tensor c = param_with_grad({kNaN, 1.0});
  EXPECT_TRUE(std::isnan(clip_grad_norm_({c}, 1.0, kInfNorm).item()));
}

TEST(clip_grad_norm_test, error_if_nonfinite_throws_pytorchs_message_and_leaves_grads) {
  Tensor a = param_with_grad({1.0, kInf});
  EXPECT_THROW_MSG(clip_grad_norm_({a}, 1.0, 2.0, /*error_if_nonfinite=*/true), Error,
                   "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be "
                   "clipped. To disable this error and scale the gradients by the non-finite norm anyway, set "
                   "`error_if_nonfinite=False`");
  EXPECT_EQ(a.grad().values(), (Vec{1.0, kInf}));
  Tensor b = param_with_grad({kNaN});
  EXPECT_THROW_MSG(clip_grad_norm_({b}, 1.0, kInfNorm, true), Error, "The total norm of order inf");
  // Finite norms pass.
  Tensor c = param_with_grad(kG1);
  expect_rel(clip_grad_norm_({c}, 1.0, 2.0, true).item(), l2({kG1}), "finite with error_if_nonfinite");
}

TEST(clip_grad_norm_test, f16_gradients_are_normed_in_float_without_overflow) {
  // 300^2 = 90000 overflows f16 (max 65504); the norm must be accumulated in float.
  const Vec g1 = {300.0, -400.0};
  const Vec g2 = {0.5, 0.25, 1024.0};
  Tensor a = param_with_grad(g1, DType::f16), b = param_with_grad(g2, DType::f16);
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(total.dtype(), DType::f16);
  using H = _Float16;
  const H n1 = static_cast<H>(std::sqrt(300.0f * 300.0f + 400.0f * 400.0f));                    // 500
  const H n2 = static_cast<H>(std::sqrt(0.5f * 0.5f + 0.25f * 0.25f + 1024.0f * 1024.0f));
  const H ref_total = static_cast<H>(std::sqrt(static_cast<float>(n1) * static_cast<float>(n1) +
                                               static_cast<float>(n2) * static_cast<float>(n2)));
  EXPECT_EQ(total.item(), static_cast<double>(ref_total));
  const H shifted = static_cast<H>(static_cast<float>(ref_total) + 1e-6f);
  const H reciprocal = static_cast<H>(1.0f / static_cast<float>(shifted));
  const H coef = static_cast<H>(static_cast<float>(reciprocal) * 1.0f);
  for (std::size_t i = 0; i < g1.size(); ++i) {
    EXPECT_EQ(a.grad().values()[i],
              static_cast<double>(static_cast<H>(static_cast<float>(g1[i]) * static_cast<float>(coef))));
  }
  for (std::size_t i = 0; i < g2.size(); ++i) {
    EXPECT_EQ(b.grad().values()[i],
              static_cast<double>(static_cast<H>(static_cast<float>(g2[i]) * static_cast<float>(coef))));
  }
}

TEST(clip_grad_norm_test, mixed_f32_and_f16_gradients_give_an_f32_total) {
  Tensor a = param_with_grad(kG1, DType::f16), b = param_with_grad(kG2, DType::f32);
  const Tensor total = clip_grad_norm_({a, b}, 1.0);
  EXPECT_EQ(total.dtype(), DType::f32);
  // |kG1| = sqrt(25.25) is rounded to f16 first (5.0234375), as PyTorch's per-gradient f16 norm is.
  const double n1 = static_cast<double>(static_cast<_Float16>(std::sqrt(25.25f)));
  const double n2 = l2({kG2});
  expect_rel(total.item(), std::sqrt(n1 * n1 + n2 * n2), "mixed total");
}

TEST(clip_grad_norm_test, unsupported_norm_types_are_refused) {
  Tensor a = param_with_grad(kG1);
  EXPECT_THROW_MSG(clip_grad_norm_({a}, 1.0, 1.0), Error, "norm_type 1.0 is not supported", "hint:");
}

}  // namespace

namespace {

TEST(clip_grad_norm_test, get_total_norm_is_the_clipping_norm_and_changes_no_gradient) {
  // Mixed dtypes, so the grouping and the promotion of the total matter; an undefined tensor is skipped.
  const Vec g3 = {0.5, -8.0, 2.0};
  const Tensor a = param_with_grad(kG1), b = param_with_grad(kG2, DType::f16), c = param_with_grad(g3);
  const Tensor total = get_total_norm({a.grad(), Tensor(), b.grad(), c.grad()});
  // b's own norm is rounded to f16 before it joins the f32 total (PyTorch's per-dtype groups).
  const double b_norm = ampscope::testing::reference_f16(static_cast<float>(l2({kG2})));
  expect_rel(total.item(), std::sqrt(l2({kG1}) * l2({kG1}) + b_norm * b_norm + l2({g3}) * l2({g3})), "total norm");
  EXPECT_EQ(a.grad().values(), kG1);
  EXPECT_EQ(b.grad().values(), kG2);
  EXPECT_EQ(get_total_norm({a.grad(), b.grad(), c.grad()}, kInfNorm).item(), 8.0);
  // clip_grad_norm_ returns the same bits (it measures with the same code), also for the inf norm.
  Tensor a2 = param_with_grad(kG1), b2 = param_with_grad(kG2, DType::f16), c2 = param_with_grad(g3);
  EXPECT_EQ(clip_grad_norm_({a2, b2, c2}, kInf).item(), total.item());
  EXPECT_EQ(get_total_norm({}).item(), 0.0);
  EXPECT_THROW_MSG(get_total_norm({a.grad()}, 1.0), Error, "get_total_norm: norm_type 1.0 is not supported");
}

}  // namespace
