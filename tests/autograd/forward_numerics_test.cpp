// tests/autograd/forward_numerics_test.cpp: exact checks of the forward kernels that define what the GPU
// computes in f16/bf16 (core/ops.h: load in the dtype, compute and accumulate in float, round once on
// store), against references computed here in double:
//   * products of small integers are exact in float whatever the summation order, so a matmul or linear
//     whose only rounding is the final store must equal the exact integer result rounded once
//     (reference_f16 / reference_bf16 from tests/test_support.h, independent of core/float16.h);
//   * softmax against the double-precision softmax of the same f16 inputs;
//   * the overflow behaviour a user of FP16 must see: a total above 65504 is inf in f16 but fine when
//     asked for in f32; a mean or a partial sum above 65504 stays finite because it is accumulated in
//     float; a dot product above 65504 becomes inf when it is stored.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using ::ampscope::testing::reference_bf16;
using ::ampscope::testing::reference_f16;

constexpr double kF16Max = 65504.0;

double round_to(DType t, double exact) {
  // `exact` is an integer below 2^24 here, so the float conversion is exact and only one rounding happens.
  return t == DType::f16 ? reference_f16(static_cast<float>(exact)) : reference_bf16(static_cast<float>(exact));
}

// Integers in [-10, 50] (exact in f16 and bf16), spread by a fixed pattern. Dot products of 8 of them are
// mostly in the thousands, where f16 keeps only even numbers or multiples of 4 and bf16 multiples of 16 or
// 32, so many results are rounded on store; they stay below 8 * 2500 = 20000, far from f16's overflow.
std::vector<double> small_integers(std::int64_t n, std::int64_t salt) {
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + salt * 11 + (i * i) % 13) % 61 - 10);
  return v;
}

class half_product_test : public ::testing::TestWithParam<DType> {};

TEST_P(half_product_test, matmul_equals_the_exact_product_rounded_once) {
  const DType t = GetParam();
  constexpr std::int64_t M = 4, K = 8, N = 5;
  const std::vector<double> a = small_integers(M * K, 1), b = small_integers(K * N, 2);
  const Tensor out = matmul(from_values(a, {M, K}, {t}), from_values(b, {K, N}, {t}));
  ASSERT_EQ(out.dtype(), t);
  ASSERT_EQ(out.shape(), (Shape{M, N}));
  const std::vector<double> got = out.values();
  int rounded = 0;
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      double exact = 0.0;
      for (std::int64_t k = 0; k < K; ++k) exact += a[i * K + k] * b[k * N + j];
      EXPECT_EQ(got[i * N + j], round_to(t, exact)) << "element (" << i << ", " << j << "), exact " << exact;
      rounded += round_to(t, exact) != exact;
    }
  }
  EXPECT_GT(rounded, 0) << "the data must exercise the rounding on store";
}

TEST_P(half_product_test, linear_adds_the_bias_before_the_single_rounding) {
  const DType t = GetParam();
  constexpr std::int64_t B = 2, T = 3, K = 8, O = 5;  // a 3-D input, folded into rows
  const std::vector<double> x = small_integers(B * T * K, 3), w = small_integers(O * K, 4), bias = small_integers(O, 5);
  const Tensor out = linear(from_values(x, {B, T, K}, {t}), from_values(w, {O, K}, {t}), from_values(bias, {O}, {t}));
  ASSERT_EQ(out.dtype(), t);
  ASSERT_EQ(out.shape(), (Shape{B, T, O}));
  const std::vector<double> got = out.values();
  int twice_would_differ = 0;
  for (std::int64_t r = 0; r < B * T; ++r) {
    for (std::int64_t o = 0; o < O; ++o) {
      double dot = 0.0;
      for (std::int64_t k = 0; k < K; ++k) dot += x[r * K + k] * w[o * K + k];
      const double once = round_to(t, dot + bias[o]);
      EXPECT_EQ(got[r * O + o], once) << "row " << r << ", output " << o << ", exact " << dot + bias[o];
      twice_would_differ += round_to(t, round_to(t, dot) + bias[o]) != once;
    }
  }
  EXPECT_GT(twice_would_differ, 0) << "the data must tell one rounding from two";
}

INSTANTIATE_TEST_SUITE_P(half, half_product_test, ::testing::Values(DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// The spacing of f16 values at |y|: 2^(e - 10) for normal numbers, 2^-24 for subnormals.
double f16_ulp(double y) {
  const double a = std::fabs(y);
  if (a < 0x1p-14) return 0x1p-24;
  return std::ldexp(1.0, std::ilogb(a) - 10);
}

// Rows of `x` (row-major [rows, cols]) through softmax or log_softmax in double.
std::vector<double> reference_softmax(const std::vector<double>& x, std::int64_t rows, std::int64_t cols, bool log) {
  std::vector<double> y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t c = 0; c < cols; ++c) m = std::max(m, x[r * cols + c]);
    double s = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (std::int64_t c = 0; c < cols; ++c) {
      const double z = x[r * cols + c] - m;
      y[r * cols + c] = log ? z - std::log(s) : std::exp(z) / s;
    }
  }
  return y;
}

void expect_within_one_f16_ulp(bool log) {
  constexpr std::int64_t R = 4, C = 9;
  std::vector<double> v(R * C);
  for (std::int64_t i = 0; i < R * C; ++i) v[i] = std::sin(1.7 * static_cast<double>(i) + 0.3) * 6.0;
  const Tensor x = from_values(v, {R, C}, {DType::f16});
  const std::vector<double> xs = x.values();  // the f16 inputs, exactly
  const Tensor out = log ? log_softmax(x, -1) : softmax(x, -1);
  ASSERT_EQ(out.dtype(), DType::f16);
  const std::vector<double> got = out.values();
  const std::vector<double> ref = reference_softmax(xs, R, C, log);
  int exact = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected = reference_f16(static_cast<float>(ref[i]));
    EXPECT_LE(std::fabs(got[i] - expected), f16_ulp(expected))
        << "element " << i << ": f16 " << got[i] << ", double " << ref[i] << " rounds to " << expected;
    exact += got[i] == expected;
  }
  // One ulp is the bound, not the norm: float math then one rounding matches the double result rounded
  // in almost every element.
  EXPECT_GE(exact, static_cast<int>(got.size()) * 3 / 4);
}

TEST(forward_numerics_test, f16_softmax_is_within_one_ulp_of_the_double_softmax) { expect_within_one_f16_ulp(false); }
TEST(forward_numerics_test, f16_log_softmax_is_within_one_ulp_of_the_double_one) { expect_within_one_f16_ulp(true); }

TEST(forward_numerics_test, f16_softmax_over_a_middle_dim_normalises_that_dim) {
  // Over dim 0 of a [3, 2] tensor: each column sums to 1; column 0 is softmax([0, 1, 2]).
  const Tensor x = from_values({0, 5, 1, 5, 2, 5}, {3, 2}, {DType::f16});
  const std::vector<double> got = softmax(x, 0).values();
  const std::vector<double> ref = reference_softmax({0, 1, 2}, 1, 3, false);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(std::fabs(got[r * 2] - ref[r]), f16_ulp(ref[r])) << "row " << r;
    EXPECT_EQ(got[r * 2 + 1], reference_f16(1.0f / 3.0f)) << "row " << r;
  }
}

// Eight values of 10000 (exact in f16): each fits, their total 80000 does not.
Tensor eight_times_ten_thousand() { return full({2, 4}, 10000.0, {DType::f16}); }

TEST(forward_numerics_test, f16_sum_overflows_only_in_the_total_and_is_right_in_f32) {
  const Tensor x = eight_times_ten_thousand();
  const Tensor s16 = sum(x);
  EXPECT_EQ(s16.dtype(), DType::f16);
  EXPECT_TRUE(std::isinf(s16.item()) && s16.item() > 0) << "got " << s16.item();
  const Tensor s32 = sum(x, DType::f32);
  EXPECT_EQ(s32.dtype(), DType::f32);
  EXPECT_EQ(s32.item(), 80000.0);
  // Per row the total is 40000: fits in f16, exactly representable.
  EXPECT_EQ(sum(x, {1}).values(), (std::vector<double>{40000.0, 40000.0}));
}

TEST(forward_numerics_test, f16_mean_of_values_whose_sum_exceeds_f16_max_is_finite) {
  // Sum 80000 > 65504, accumulated in float; mean 10000 is exact. Each value is exact in f16 (at most 11
  // significant bits).
  const Tensor x = from_values({9000, 10000, 11000, 12000, 8000, 10000, 10000, 10000}, {2, 4}, {DType::f16});
  const Tensor m = mean(x);
  EXPECT_EQ(m.dtype(), DType::f16);
  EXPECT_EQ(m.item(), 10000.0);
  EXPECT_EQ(mean(eight_times_ten_thousand(), {0, 1}, true).values(), (std::vector<double>{10000.0}));
}

TEST(forward_numerics_test, f16_matmul_whose_dot_products_exceed_f16_max_gives_inf_on_store) {
  // Each dot product is 4 * 200 * 200 = 160000 > 65504 (with sign -160000 in row 1): inf and -inf in
  // f16, the exact value in f32. This is the FP16 failure a user must see, not a silently clipped value.
  const std::vector<double> a = {200, 200, 200, 200, -200, -200, -200, -200};
  const std::vector<double> b(4 * 3, 200.0);
  const Tensor out = matmul(from_values(a, {2, 4}, {DType::f16}), from_values(b, {4, 3}, {DType::f16}));
  ASSERT_EQ(out.dtype(), DType::f16);
  for (double v : out.slice(0, 0, 1).values()) EXPECT_EQ(v, std::numeric_limits<double>::infinity());
  for (double v : out.slice(0, 1, 2).values()) EXPECT_EQ(v, -std::numeric_limits<double>::infinity());
  const Tensor out32 = matmul(from_values(a, {2, 4}), from_values(b, {4, 3}));
  for (double v : out32.values()) EXPECT_EQ(std::fabs(v), 160000.0);
  EXPECT_GT(160000.0, kF16Max);
}

TEST(forward_numerics_test, f16_matmul_partial_sums_above_f16_max_do_not_overflow) {
  // [300, 300, -300, -300] . [300, 300, 300, 300]: the partial sums 90000 and 180000 exceed 65504 in any
  // order that adds the positive terms first, but the accumulator is float, so the result is exactly 0.
  const Tensor a = from_values({300, 300, -300, -300}, {1, 4}, {DType::f16});
  const Tensor b = full({4, 1}, 300.0, {DType::f16});
  const Tensor out = matmul(a, b);
  EXPECT_EQ(out.values(), (std::vector<double>{0.0}));
}

}  // namespace
}  // namespace ampscope
