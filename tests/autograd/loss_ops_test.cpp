// tests/autograd/loss_ops_test.cpp: forward values, edge cases and recorded ops of the ops for
// hand-written losses (core/ops.h: operators, rsub, reciprocal, abs, log1p, expm1, logsigmoid, softplus,
// clamp_min/max, maximum/minimum, max/min, amax/amin, var/std). Expected values are worked out by hand
// or from std:: functions in double, and the edge cases (ties, NaN, infinities, -0.0, correction) are
// PyTorch 1.13's answers, written down from torch's documented semantics and checked against
// python3-torch when writing the test (the values are literal here; nothing is taken from our output).
// Gradients are checked against finite differences in gradcheck_test.cpp; here only the special points
// where a finite difference says nothing (kinks, NaN, ties, infinities).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using ::ampscope::testing::reference_bf16;
using ::ampscope::testing::reference_f16;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Same dtype, shape and bits (values() widens exactly, so the bits of the doubles decide).
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) return ::testing::AssertionFailure() << dtype_name(a.dtype()) << " vs " << dtype_name(b.dtype());
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  const std::vector<double> x = a.values(), y = b.values();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Element-wise equality that treats NaN as equal to NaN and tells -0 from +0.
void expect_values(const Tensor& t, const std::vector<double>& expected, const std::string& what) {
  const std::vector<double> v = t.values();
  ASSERT_EQ(v.size(), expected.size()) << what;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(v[i])) << what << " element " << i << ": " << v[i];
    } else {
      EXPECT_EQ(v[i], expected[i]) << what << " element " << i;
      EXPECT_EQ(std::signbit(v[i]), std::signbit(expected[i])) << what << " element " << i << ": sign of zero";
    }
  }
}

Tensor leaf(const std::vector<double>& v, const Shape& shape, DType dtype = DType::f32) {
  Tensor t = from_values(v, shape, {dtype});
  t.requires_grad_();
  return t;
}

Tensor grad_of_sum(const Tensor& x, const Tensor& y) {
  sum(y).backward();
  return x.grad();
}

// ---- operators ----

TEST(loss_ops_test, operators_give_the_bits_of_the_function_forms_in_every_dtype) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    Generator gen(3);
    const Tensor a = randn({3, 4}, gen, {.dtype = t}), b = add(rand({4}, gen, {.dtype = t}), 0.5);
    EXPECT_TRUE(same_bits(a + b, add(a, b)));
    EXPECT_TRUE(same_bits(a - b, sub(a, b)));
    EXPECT_TRUE(same_bits(a * b, mul(a, b)));
    EXPECT_TRUE(same_bits(a / b, div(a, b)));
    EXPECT_TRUE(same_bits(-a, neg(a)));
    EXPECT_TRUE(same_bits(a + 0.1, add(a, 0.1)));
    EXPECT_TRUE(same_bits(0.1 + a, add(a, 0.1)));
    EXPECT_TRUE(same_bits(a - 0.1, sub(a, 0.1)));
    EXPECT_TRUE(same_bits(a * 3.0, mul(a, 3.0)));
    EXPECT_TRUE(same_bits(3.0 * a, mul(a, 3.0)));
    EXPECT_TRUE(same_bits(a / 3.0, div(a, 3.0)));
    EXPECT_TRUE(same_bits(1.0 - a, rsub(a, 1.0)));
    EXPECT_TRUE(same_bits(2.0 / b, mul(reciprocal(b), 2.0)));
    // 1 - s is one subtraction with the scalar in the compute type: the same bits as sub of a 0-dim f32
    // tensor holding 1 (a dimensioned tensor keeps its dtype against a 0-dim one).
    EXPECT_TRUE(same_bits(1.0 - a, sub(full({}, 1.0), a)));
  }
}

TEST(loss_ops_test, scalar_minus_tensor_keeps_the_scalar_in_float_and_rounds_once) {
  // 0.1 - x in f16: float(0.1) - x rounded once to f16, not f16(0.1) - x. The elements are chosen so
  // that the two differ: f16(0.1) = 0.0999755859375.
  const std::vector<double> xs = {1e-3, -2.5e-4, 0.05, 3.0};
  const Tensor x = from_values(xs, {4}, {.dtype = DType::f16});
  const Tensor r = 0.1 - x;
  ASSERT_EQ(r.dtype(), DType::f16);
  const std::vector<double> xv = x.values(), rv = r.values();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(rv[i], reference_f16(0.1f - static_cast<float>(xv[i]))) << "element " << i;
  }
  // And 2 / x is PyTorch's reciprocal(x) * 2: two roundings.
  const Tensor q = 2.0 / x;
  const std::vector<double> qv = q.values();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float rec = static_cast<float>(reference_f16(1.0f / static_cast<float>(xv[i])));
    EXPECT_EQ(qv[i], reference_f16(rec * 2.0f)) << "element " << i;
  }
}

TEST(loss_ops_test, operators_record_what_pytorch_records) {
  Tensor x = leaf({1, 2, 3}, {3});
  EXPECT_EQ((x + x).grad_fn()->op(), "add");
  EXPECT_EQ((x - x).grad_fn()->op(), "sub");
  EXPECT_EQ((x * x).grad_fn()->op(), "mul");
  EXPECT_EQ((x / x).grad_fn()->op(), "div");
  EXPECT_EQ((-x).grad_fn()->op(), "neg");
  EXPECT_EQ((2.0 + x).grad_fn()->op(), "add");
  EXPECT_EQ((x - 2.0).grad_fn()->op(), "sub");
  EXPECT_EQ((2.0 * x).grad_fn()->op(), "mul");
  EXPECT_EQ((x / 2.0).grad_fn()->op(), "div");
  // Python's 1 - t is torch.rsub (RsubBackward1), one op; 2 / t is t.reciprocal() * 2 (two ops).
  const Tensor r = 1.0 - x;
  EXPECT_EQ(r.grad_fn()->op(), "rsub");
  EXPECT_EQ(r.grad_fn()->next().size(), 1u);
  const Tensor q = 2.0 / x;
  ASSERT_EQ(q.grad_fn()->op(), "mul");
  EXPECT_EQ(q.grad_fn()->next()[0]->op(), "reciprocal");
  // d(1 - x)/dx = -1; d(2 / x)/dx = -2 / x^2.
  expect_values(grad_of_sum(x, r), {-1, -1, -1}, "rsub gradient");
  x.set_grad(Tensor());
  expect_values(grad_of_sum(x, 2.0 / x), {-2.0, -0.5, static_cast<double>(-2.0f * (1.0f / 3.0f) * (1.0f / 3.0f))},
                "2 / x gradient");
}

// ---- element-wise ----

TEST(loss_ops_test, abs_clears_the_sign_and_its_gradient_is_zero_at_zero_and_nan) {
  const Tensor x = leaf({-2.0, 3.0, -0.0, 0.0, -kInf, kNan}, {6});
  const Tensor y = abs(x);
  expect_values(y, {2.0, 3.0, 0.0, 0.0, kInf, kNan}, "abs");
  // torch.sgn: 0 at +-0 and at NaN (torch.sign(nan) == 0).
  expect_values(grad_of_sum(x, y), {-1.0, 1.0, 0.0, 0.0, -1.0, 0.0}, "abs gradient");
  // A NaN's payload survives (only the sign bit is cleared), as std::abs leaves it.
  Tensor payload = Tensor::empty({1}, {.dtype = DType::f16});
  *payload.data_as<f16>() = f16::from_bits(0xFE01);
  EXPECT_EQ(abs(payload).data_as<f16>()->bits, 0x7E01);
}

TEST(loss_ops_test, log1p_and_expm1_are_accurate_near_zero_and_round_once) {
  const std::vector<double> xs = {1e-10, -3e-8, 1e-4, 0.5, -0.75, 4.0};
  const Tensor x = from_values(xs, {6});
  const std::vector<double> xv = x.values(), l = log1p(x).values(), e = expm1(x).values();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    // std::log1p in double, rounded to float: within one float rounding of the float math.
    const double ref_l = static_cast<float>(std::log1p(xv[i])), ref_e = static_cast<float>(std::expm1(xv[i]));
    EXPECT_NEAR(l[i], ref_l, std::fabs(ref_l) * 0x1p-23) << "log1p element " << i;
    EXPECT_NEAR(e[i], ref_e, std::fabs(ref_e) * 0x1p-23) << "expm1 element " << i;
  }
  EXPECT_EQ(log1p(x).values()[0], xv[0]);  // log(1 + 1e-10) would be 0 in float
  expect_values(log1p(from_values({-1.0, -2.0, kInf}, {3})), {-kInf, kNan, kInf}, "log1p edges");
  expect_values(expm1(from_values({-kInf, 100.0}, {2})), {-1.0, kInf}, "expm1 edges");
  // f16: computed in float, rounded once.
  const Tensor h = from_values({0.001, 2.0, -0.75}, {3}, {.dtype = DType::f16});
  const std::vector<double> hv = h.values(), hl = log1p(h).values(), he = expm1(h).values();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(hl[i], reference_f16(std::log1p(static_cast<float>(hv[i])))) << i;
    EXPECT_EQ(he[i], reference_f16(std::expm1(static_cast<float>(hv[i])))) << i;
  }
}

TEST(loss_ops_test, logsigmoid_never_overflows_and_matches_the_stable_formula) {
  const Tensor x = leaf({-100.0, 0.0, 100.0, -kInf, kInf, 3.0, -3.0}, {7});
  const Tensor y = logsigmoid(x);
  const std::vector<double> v = y.values();
  EXPECT_EQ(v[0], -100.0);                                      // log(sigmoid(-100)) = -100 - log1p(e^-100)
  EXPECT_NEAR(v[1], -std::log(2.0), 0x1p-24);
  EXPECT_EQ(v[2], static_cast<double>(-std::log1p(std::exp(-100.0f))));  // -3.78e-44, a float subnormal
  EXPECT_LT(v[2], 0.0);
  EXPECT_EQ(v[3], -kInf);
  EXPECT_EQ(v[4], 0.0);
  for (int i : {5, 6}) {
    const double xi = i == 5 ? 3.0 : -3.0;
    const double ref = std::min(xi, 0.0) - std::log1p(std::exp(-std::fabs(xi)));
    EXPECT_NEAR(v[i], ref, std::fabs(ref) * 0x1p-22) << "element " << i;
  }
  EXPECT_TRUE(std::isnan(logsigmoid(from_values({kNan}, {1})).item()));
  // d/dx = 1 - sigmoid(x) = sigmoid(-x): 1 at -inf, 0 at +inf, 1/2 at 0 (PyTorch: [1, 0, 0.5]).
  const std::vector<double> g = grad_of_sum(x, y).values();
  EXPECT_EQ(g[0], 1.0);
  EXPECT_EQ(g[1], 0.5);
  EXPECT_EQ(g[3], 1.0);
  EXPECT_EQ(g[4], 0.0);
  EXPECT_NEAR(g[5], 1.0 / (1.0 + std::exp(3.0)), 1e-7);
}

TEST(loss_ops_test, softplus_returns_the_input_itself_above_the_threshold) {
  // beta x > threshold gives x bit for bit; at beta x == threshold the formula still applies.
  const Tensor x = leaf({25.123, 20.0, 10.0, -100.0, 0.0, 1.5}, {6});
  const Tensor y = softplus(x);
  const std::vector<double> xv = x.values(), v = y.values();
  EXPECT_EQ(v[0], xv[0]);
  EXPECT_EQ(v[1], static_cast<double>(std::log1p(std::exp(20.0f))));  // 20 > 20 is false
  EXPECT_EQ(v[3], static_cast<double>(std::log1p(std::exp(-100.0f))));  // 3.78e-44: never 0 or negative
  EXPECT_NEAR(v[4], std::log(2.0), 0x1p-24);
  EXPECT_NEAR(v[5], std::log1p(std::exp(1.5)), 2e-7);
  // beta = 2, threshold = 20: x = 10.5 is past it (21 > 20), 10 is not; the result is divided by beta.
  const std::vector<double> b = softplus(from_values({10.5, 10.0, 0.25}, {3}), 2.0, 20.0).values();
  EXPECT_EQ(b[0], 10.5);
  EXPECT_EQ(b[1], static_cast<double>(std::log1p(std::exp(20.0f)) / 2.0f));
  EXPECT_NEAR(b[2], std::log1p(std::exp(0.5)) / 2.0, 1e-7);
  // Gradient: g past the threshold, g sigmoid(beta x) below it.
  const std::vector<double> g = grad_of_sum(x, y).values();
  EXPECT_EQ(g[0], 1.0);
  EXPECT_EQ(g[4], 0.5);
  EXPECT_NEAR(g[5], 1.0 / (1.0 + std::exp(-1.5)), 1e-7);
  // f16 in, f16 out, computed in float and rounded once.
  const Tensor h = from_values({-2.0, 0.5, 30.0}, {3}, {.dtype = DType::f16});
  const std::vector<double> hv = softplus(h).values();
  EXPECT_EQ(hv[0], reference_f16(std::log1p(std::exp(-2.0f))));
  EXPECT_EQ(hv[1], reference_f16(std::log1p(std::exp(0.5f))));
  EXPECT_EQ(hv[2], 30.0);
}

TEST(loss_ops_test, clamp_min_and_clamp_max_are_recorded_under_their_own_names) {
  Tensor x = leaf({-1.0, 0.25, 2.0, kNan}, {4});
  const Tensor lo = clamp_min(x, 0.0), hi = clamp_max(x, 0.5);
  EXPECT_EQ(lo.grad_fn()->op(), "clamp_min");
  EXPECT_EQ(hi.grad_fn()->op(), "clamp_max");
  expect_values(lo, {0.0, 0.25, 2.0, kNan}, "clamp_min");
  expect_values(hi, {-1.0, 0.25, 0.5, kNan}, "clamp_max");
  expect_values(grad_of_sum(x, lo), {0.0, 1.0, 1.0, 0.0}, "clamp_min gradient");  // NaN >= 0 is false
  x.set_grad(Tensor());
  expect_values(grad_of_sum(x, hi), {1.0, 1.0, 0.0, 0.0}, "clamp_max gradient");
}

TEST(loss_ops_test, a_bound_is_rounded_to_the_input_dtype_so_the_gradient_flows_at_it) {
  // f16(0.1) = 0.0999755859375 < 0.1. PyTorch compares with the bound rounded to f16 (Scalar::to<Half>),
  // so x = f16(0.1) is at the bound, not below it: the value stays, and the gradient flows.
  for (bool via_clamp : {false, true}) {
    const Tensor x = leaf({0.1, 0.05}, {2}, DType::f16);
    const Tensor y = via_clamp ? clamp(x, 0.1, std::nullopt) : clamp_min(x, 0.1);
    expect_values(y, {0.0999755859375, 0.0999755859375}, "clamp_min in f16");
    expect_values(grad_of_sum(x, y), {1.0, 0.0}, "clamp_min gradient at the rounded bound");
  }
  // The same in bf16, where PyTorch 1.13's CPU gives it: bf16(0.7) = 0.69921875 < 0.7, and
  // clamp_min(x, 0.7) and clamp_max(x, 0.7) both pass the gradient at x = bf16(0.7).
  Tensor b = leaf({0.7, 0.5}, {2}, DType::bf16);
  const Tensor lo = clamp_min(b, 0.7);
  expect_values(lo, {0.69921875, 0.69921875}, "clamp_min in bf16");
  expect_values(grad_of_sum(b, lo), {1.0, 0.0}, "clamp_min gradient in bf16");
  b = leaf({0.7, 0.9}, {2}, DType::bf16);
  const Tensor hi = clamp_max(b, 0.7);
  expect_values(hi, {0.69921875, 0.69921875}, "clamp_max in bf16");
  expect_values(grad_of_sum(b, hi), {1.0, 0.0}, "clamp_max gradient in bf16");
}

TEST(loss_ops_test, maximum_and_minimum_propagate_nan_and_keep_the_first_of_equal_zeros) {
  const Tensor a = from_values({-0.0, 0.0, kNan, 1.0, 2.0}, {5}), b = from_values({0.0, -0.0, 1.0, kNan, -3.0}, {5});
  // PyTorch: maximum([-0, 0, nan, 1], [0, -0, 1, nan]) = [-0, 0, nan, nan].
  expect_values(maximum(a, b), {-0.0, 0.0, kNan, kNan, 2.0}, "maximum");
  expect_values(minimum(a, b), {-0.0, 0.0, kNan, kNan, -3.0}, "minimum");
  EXPECT_TRUE(same_bits(max(a, b), maximum(a, b)));  // torch.max(a, b) is maximum
  EXPECT_TRUE(same_bits(min(a, b), minimum(a, b)));
  // Broadcasting and promotion as in add: f16 [3] against an f32 [2, 1] gives f32 [2, 3].
  const Tensor h = from_values({1.0, -2.0, 3.0}, {3}, {.dtype = DType::f16});
  const Tensor m = maximum(h, from_values({0.0, 2.5}, {2, 1}));
  ASSERT_EQ(m.dtype(), DType::f32);
  ASSERT_EQ(m.shape(), (Shape{2, 3}));
  expect_values(m, {1.0, 0.0, 3.0, 2.5, 2.5, 3.0}, "maximum broadcast");
}

TEST(loss_ops_test, maximum_splits_the_gradient_on_ties_and_gives_it_all_to_both_on_nan) {
  // PyTorch: maximum([1, 2], [1, 3]) -> grads [0.5, 0] and [0.5, 1]; maximum([nan], [1]) -> [1] and [1].
  Tensor x = leaf({1.0, 2.0, kNan}, {3}), y = leaf({1.0, 3.0, 1.0}, {3});
  sum(maximum(x, y)).backward();
  expect_values(x.grad(), {0.5, 0.0, 1.0}, "maximum, first operand");
  expect_values(y.grad(), {0.5, 1.0, 1.0}, "maximum, second operand");
  x = leaf({1.0, 2.0, kNan}, {3});
  y = leaf({1.0, 3.0, 1.0}, {3});
  sum(minimum(x, y)).backward();
  expect_values(x.grad(), {0.5, 1.0, 1.0}, "minimum, first operand");
  expect_values(y.grad(), {0.5, 0.0, 1.0}, "minimum, second operand");
  // A broadcast operand sums its shares: [1, 1, 1] against the scalar 1 ties three times.
  Tensor row = leaf({1.0, 1.0, 1.0}, {3}), one = leaf({1.0}, {});
  sum(maximum(row, one)).backward();
  expect_values(one.grad(), {1.5}, "maximum, broadcast operand");
}

// ---- reductions ----

TEST(loss_ops_test, full_max_and_min_propagate_nan_and_share_the_gradient_among_ties) {
  expect_values(max(from_values({1.0, 3.0, -2.0}, {3})), {3.0}, "max");
  expect_values(min(from_values({1.0, 3.0, -2.0}, {3})), {-2.0}, "min");
  EXPECT_TRUE(std::isnan(max(from_values({1.0, kNan, 3.0}, {3})).item()));
  EXPECT_TRUE(std::isnan(min(from_values({1.0, kNan, 3.0}, {3})).item()));
  EXPECT_EQ(max(from_values({1.0, 3.0}, {2})).shape(), Shape{});
  // PyTorch 1.13: max([1, 3, 3, 2]).backward() -> [0, 0.5, 0.5, 0]; max([1, nan, 3, nan]) -> [0, .5, 0, .5].
  Tensor x = leaf({1.0, 3.0, 3.0, 2.0}, {4});
  expect_values(grad_of_sum(x, max(x)), {0.0, 0.5, 0.5, 0.0}, "max, ties");
  x = leaf({1.0, kNan, 3.0, kNan}, {2, 2});
  expect_values(grad_of_sum(x, max(x)), {0.0, 0.5, 0.0, 0.5}, "max, NaNs");
  x = leaf({-1.0, -1.0, -1.0, 5.0}, {4});
  const double third = static_cast<double>(1.0f / 3.0f);
  expect_values(grad_of_sum(x, min(x)), {third, third, third, 0.0}, "min, three ties");
  EXPECT_THROW_MSG(max(zeros({2, 0})), IndexError, "max: the tensor of shape [2, 0] is empty", "hint:");
}

TEST(loss_ops_test, max_and_min_over_a_dim_return_the_first_index_and_nan_as_the_extreme) {
  // PyTorch: max([[1,3,3],[nan,5,nan],[-0,0,-1]], 1) = values [3, nan, -0], indices [1, 0, 0];
  //          min([[1,3,1],[2,nan,nan],[0,-0,1]], 1) = values [1, nan, 0], indices [0, 1, 0].
  const ValuesAndIndices mx = max(from_values({1, 3, 3, kNan, 5, kNan, -0.0, 0.0, -1}, {3, 3}), 1);
  expect_values(mx.values, {3.0, kNan, -0.0}, "max values");
  ASSERT_EQ(mx.indices.dtype(), DType::i64);
  EXPECT_EQ(mx.indices.values(), (std::vector<double>{1, 0, 0}));
  const ValuesAndIndices mn = min(from_values({1, 3, 1, 2, kNan, kNan, 0.0, -0.0, 1}, {3, 3}), -1);
  expect_values(mn.values, {1.0, kNan, 0.0}, "min values");
  EXPECT_EQ(mn.indices.values(), (std::vector<double>{0, 1, 0}));
  // keepdim, a middle dimension, and the gradient going to the selected index only.
  Tensor x = leaf({1, 7, 2, 7, 3, 0, 4, 5, 9, 8, 6, 1}, {2, 3, 2});
  const ValuesAndIndices k = max(x, 1, /*keepdim=*/true);
  ASSERT_EQ(k.values.shape(), (Shape{2, 1, 2}));
  ASSERT_EQ(k.indices.shape(), (Shape{2, 1, 2}));
  expect_values(k.values, {3, 7, 9, 8}, "max over dim 1");
  EXPECT_EQ(k.indices.values(), (std::vector<double>{2, 0, 1, 1}));  // the 7 in row 0 ties: the first wins
  expect_values(grad_of_sum(x, k.values), {0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0}, "max over dim 1, gradient");
  // A 0-dim tensor reduces over dim 0 or -1 to itself, index 0.
  const ValuesAndIndices s = min(full({}, 5.0), 0);
  expect_values(s.values, {5.0}, "0-dim");
  EXPECT_EQ(s.indices.item(), 0.0);
  EXPECT_THROW_MSG(max(zeros({2, 0}), 1), IndexError, "max: dimension 1 of shape [2, 0] is empty");
  EXPECT_EQ(max(zeros({0, 3}), 1).values.shape(), Shape{0});
  EXPECT_THROW_MSG(min(zeros({2, 3}), 2), IndexError, "dimension 2 is out of range");
}

TEST(loss_ops_test, amax_and_amin_share_ties_and_give_nan_gradients_to_a_nan_row) {
  Tensor x = leaf({1.0, kNan, 3.0, 2.0, 2.0, 1.0}, {2, 3});
  const Tensor m = amax(x, {1});
  expect_values(m, {kNan, 2.0}, "amax");
  // PyTorch 1.13: [[nan, nan, nan], [0.5, 0.5, 0]] ((g / count) * mask, count 0 in the NaN row).
  expect_values(grad_of_sum(x, m), {kNan, kNan, kNan, 0.5, 0.5, 0.0}, "amax gradient");
  const Tensor y = from_values({4, -1, 0, 2, 8, -5}, {3, 2});
  expect_values(amin(y), {-5.0}, "amin over everything");
  expect_values(amax(y, {0}, true), {8.0, 2.0}, "amax over dim 0");
  EXPECT_EQ(amax(y, {0}, true).shape(), (Shape{1, 2}));
  expect_values(amin(y, {-1, 0}), {-5.0}, "amin over both dims");
  EXPECT_THROW_MSG(amax(zeros({2, 0}), {1}), IndexError, "amax: dimension 1 of shape [2, 0] is empty");
}

TEST(loss_ops_test, var_and_std_follow_pytorchs_correction_rules) {
  // var([1, 2, 4]): mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9, over n - 1 = 2: 7/3.
  Tensor x = leaf({1.0, 2.0, 4.0}, {3});
  EXPECT_NEAR(var(x).item(), 7.0 / 3.0, 4e-7);
  const Tensor s = std(x);
  EXPECT_NEAR(s.item(), std::sqrt(7.0 / 3.0), 2e-7);
  // d std / dx = (x - mean) / ((n - 1) std): PyTorch [-0.4364, -0.1091, 0.5455].
  const std::vector<double> g = grad_of_sum(x, s).values();
  const double sd = std::sqrt(7.0 / 3.0);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(g[i], (x.values()[i] - 7.0 / 3.0) / (2.0 * sd), 1e-6) << i;
  // correction 0 (population) and its gradient 2 (x - mean) / n.
  x = leaf({1.0, 2.0}, {1, 2});
  const Tensor v0 = var(x, {1}, 0.0);
  expect_values(v0, {0.25}, "var, correction 0");
  expect_values(grad_of_sum(x, v0), {-0.5, 0.5}, "var gradient, correction 0");
  // correction = n divides by 0: inf, and the gradient (2 / 0) g (x - mean) = [-inf, inf] (PyTorch).
  x = leaf({1.0, 2.0}, {1, 2});
  const Tensor v2 = var(x, {1}, 2.0);
  expect_values(v2, {kInf}, "var, correction 2 of 2");
  expect_values(grad_of_sum(x, v2), {-kInf, kInf}, "var gradient, correction 2 of 2");
  // correction > n: still divides by 0, and the gradient uses 2 / (n - correction) = -2: [1, -1].
  x = leaf({1.0, 2.0}, {1, 2});
  const Tensor v3 = var(x, {1}, 3.0);
  expect_values(v3, {kInf}, "var, correction 3 of 2");
  expect_values(grad_of_sum(x, v3), {1.0, -1.0}, "var gradient, correction 3 of 2");
  // One element: 0 / 0 = NaN, and a NaN gradient. Constant values: std 0, gradient 0 (masked), not NaN.
  x = leaf({5.0}, {1, 1});
  const Tensor one = var(x, {1});
  expect_values(one, {kNan}, "var of one element");
  expect_values(grad_of_sum(x, one), {kNan}, "var gradient of one element");
  x = leaf({3.0, 3.0}, {2});
  const Tensor flat = std(x);
  expect_values(flat, {0.0}, "std of equal values");
  expect_values(grad_of_sum(x, flat), {0.0, 0.0}, "std gradient of equal values");
  // Empty: NaN, as PyTorch.
  expect_values(var(zeros({0})), {kNan}, "var of nothing");
  expect_values(var(zeros({2, 0}), {1}), {kNan, kNan}, "var over an empty dimension");
  // keepdim and negative dims.
  const Tensor y = from_values({1, 2, 3, 4, 6, 8}, {2, 3});
  const Tensor vk = var(y, {-1}, 1.0, true);
  ASSERT_EQ(vk.shape(), (Shape{2, 1}));
  expect_values(vk, {1.0, 4.0}, "var over the last dim");
  expect_values(std(y, {0}, 0.0), {1.5, 2.0, 2.5}, "std over dim 0, correction 0");
}

TEST(loss_ops_test, f16_var_is_computed_in_float_and_rounded_once) {
  // Squares of 200 are 40000 and four of them sum to 160000, past f16's 65504; computed in float the
  // variance 160000 / 3 is finite and rounds once to f16: 53344.
  const Tensor h = from_values({-200.0, 200.0, -200.0, 200.0}, {4}, {.dtype = DType::f16});
  const Tensor v = var(h);
  ASSERT_EQ(v.dtype(), DType::f16);
  EXPECT_EQ(v.item(), reference_f16(160000.0f / 3.0f));
  EXPECT_EQ(v.item(), 53344.0);
  EXPECT_EQ(std(h).item(), reference_f16(std::sqrt(160000.0f / 3.0f)));
  const Tensor b = from_values({-200.0, 200.0, -200.0, 200.0}, {4}, {.dtype = DType::bf16});
  EXPECT_EQ(var(b).item(), reference_bf16(160000.0f / 3.0f));
}

TEST(loss_ops_test, sum_and_mean_take_negative_dims_and_keepdim) {
  const Tensor x = from_values({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor s = sum(x, {-1}, true), m = mean(x, {-2}, true);
  ASSERT_EQ(s.shape(), (Shape{2, 1}));
  ASSERT_EQ(m.shape(), (Shape{1, 3}));
  expect_values(s, {6, 15}, "sum over the last dim");
  expect_values(m, {2.5, 3.5, 4.5}, "mean over the first dim");
  EXPECT_EQ(mean(x, {-1, 0}).item(), 3.5);
}

TEST(loss_ops_test, ops_that_need_floating_inputs_name_the_dtype) {
  const Tensor i = from_values({1, 2}, {2}, {.dtype = DType::i64});
  EXPECT_THROW_MSG(var(i), DTypeError, "var: input must be floating", "i64");
  EXPECT_THROW_MSG(max(i), DTypeError, "max: input must be floating");
  EXPECT_THROW_MSG(softplus(i), DTypeError, "softplus: input must be floating");
  // Integer inputs of log1p and expm1 give f32, as exp and log do.
  EXPECT_EQ(log1p(i).dtype(), DType::f32);
}

// A loss written with the operators and new ops, the way issue 17's user wanted to: the numerically
// stable log-sum-exp (subtract the max before exp) and a hinge, both with finite gradients where the
// naive forms overflow.
TEST(loss_ops_test, a_hand_written_stable_loss_trains_where_the_naive_one_overflows) {
  Tensor logits = leaf({100.0, 101.0, 99.0, -50.0, 0.0, 50.0}, {2, 3});
  const Tensor m = max(logits, 1, true).values;
  const Tensor lse = log(sum(exp(logits - m), {1}, true)) + m;
  const Tensor loss = mean(lse - logits.slice(1, 0, 1)) + mean(clamp_min(1.0 - logits, 0.0)) * 0.5;
  ASSERT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  for (double g : logits.grad().values()) EXPECT_TRUE(std::isfinite(g));
  // The naive log(sum(exp(x))) overflows float at 100.
  EXPECT_TRUE(std::isinf(log(sum(exp(from_values({100.0, 101.0, 99.0}, {3})))).item()));
  EXPECT_NEAR(lse.values()[0], 101.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)), 1e-4);
}

}  // namespace
}  // namespace ampscope
