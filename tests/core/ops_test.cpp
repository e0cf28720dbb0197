// tests/core/ops_test.cpp: the element-wise ops of core/ops.h (broadcasting, PyTorch's result_type, the
// binary ops in tensor and scalar forms, neg/relu/exp) and the backend dispatch of core/backend.h.
//
// Where the expected values come from:
//   * every output element is recomputed in this file from the exact input values: f64 in double, f32 in
//     float, f16 as (_Float16)((float)a op (float)b) with g++'s host _Float16 (IEEE round-to-nearest-
//     even, independent of core/float16.h), bf16 as a separate reference rounding (reference_bf16 in tests/test_support.h, in
//     double arithmetic) of the float result: widen, compute in float, round once, as on the GPU;
//   * inputs are generated as values already exact in their dtype (rounded by the same references), so
//     creating the tensor does not blur what is being checked;
//   * result dtypes: PyTorch's documented type promotion (torch.result_type examples in the comments);
//   * special cases (overflow, exp limits, double rounding): worked out by hand in the comments.
#include "core/ops.h"

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <cstring>
#include <set>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/format.h"

namespace {

using ampscope::Device;
using ampscope::DType;
using ampscope::from_values;
using ampscope::Shape;
using ampscope::Tensor;
using ampscope::zeros;
using ampscope::testing::reference_bf16;
using ampscope::testing::reference_f16;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- references ---------------------------------------------------------------------------------


// Rounds a double to dtype `t` the way an exactly representable input is made (f64 -> f32 -> half).
double round_to(DType t, double x) {
  switch (t) {
    case DType::f64: return x;
    case DType::f32: return static_cast<float>(x);
    case DType::f16: return reference_f16(static_cast<float>(x));
    case DType::bf16: return reference_bf16(static_cast<float>(x));
    default: return x;
  }
}

enum class BinOp { add, sub, mul, div };
const char* bin_name(BinOp op) {
  switch (op) {
    case BinOp::add: return "add";
    case BinOp::sub: return "sub";
    case BinOp::mul: return "mul";
    case BinOp::div: return "div";
  }
  return "?";
}

template <class A>
A apply(BinOp op, A a, A b) {
  switch (op) {
    case BinOp::add: return a + b;
    case BinOp::sub: return a - b;
    case BinOp::mul: return a * b;
    case BinOp::div: return a / b;
  }
  return a;
}

// The reference result of one element: compute in the dtype's compute type, round once to the dtype.
double reference(BinOp op, DType t, double a, double b) {
  if (t == DType::f64) return apply(op, a, b);
  const float r = apply(op, static_cast<float>(a), static_cast<float>(b));
  switch (t) {
    case DType::f32: return r;
    case DType::f16: return reference_f16(r);
    case DType::bf16: return reference_bf16(r);
    default: return r;
  }
}

Tensor run_op(BinOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinOp::add: return ampscope::add(a, b);
    case BinOp::sub: return ampscope::sub(a, b);
    case BinOp::mul: return ampscope::mul(a, b);
    case BinOp::div: return ampscope::div(a, b);
  }
  return a;
}

bool same_value(double a, double b, bool zero_sign_matters = true) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && (!zero_sign_matters || std::signbit(a) == std::signbit(b));
}

// Compares element by element (NaN equals NaN); on failure prints how many differ and the first few
// (index, reference, actual).
void expect_values(const std::vector<double>& actual, const std::vector<double>& ref, const std::string& what,
                   bool zero_sign_matters = true) {
  ASSERT_EQ(actual.size(), ref.size()) << what << ": element count";
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (same_value(actual[i], ref[i], zero_sign_matters)) continue;
    if (bad < 5) first += fmt::format("\n  [{}] reference {} actual {}", i, ref[i], actual[i]);
    ++bad;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << actual.size() << " elements differ; first:" << first;
}

// Deterministic inputs (xorshift64*), exact in dtype `t`: signed values with magnitudes spread over
// 2^-12 .. 2^9, one in 61 an exact zero, so div also meets x / 0 and 0 / 0.
std::vector<double> make_inputs(std::size_t n, DType t, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const std::uint64_t r = s * 0x2545F4914F6CDD1Dull;
    if (r % 61 == 0) {
      v[i] = 0.0;
      continue;
    }
    const double u = static_cast<double>(r >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
    const int e = static_cast<int>((r >> 3) % 22) - 12;
    v[i] = round_to(t, std::ldexp(u, e));
  }
  return v;
}

constexpr DType kFloatTypes[] = {DType::f64, DType::f32, DType::f16, DType::bf16};
constexpr BinOp kBinOps[] = {BinOp::add, BinOp::sub, BinOp::mul, BinOp::div};

// ---- broadcast_shapes ---------------------------------------------------------------------------

TEST(ops_test, broadcast_shapes_aligns_dimensions_from_the_right) {
  EXPECT_EQ(ampscope::broadcast_shapes({4, 1}, {3}), (Shape{4, 3}));
  EXPECT_EQ(ampscope::broadcast_shapes({3}, {4, 1}), (Shape{4, 3}));
  EXPECT_EQ(ampscope::broadcast_shapes({2, 1, 5}, {3, 1}), (Shape{2, 3, 5}));
  EXPECT_EQ(ampscope::broadcast_shapes({}, {2, 3}), (Shape{2, 3}));
  EXPECT_EQ(ampscope::broadcast_shapes({0}, {1}), (Shape{0}));  // torch: size 1 broadcasts to 0
  EXPECT_EQ(ampscope::broadcast_shapes({5, 0}, {1}), (Shape{5, 0}));
}

TEST(ops_test, broadcast_shapes_error_names_the_op_both_shapes_and_the_dimension) {
  // Dimensions are counted from the end: [2, 3] vs [4, 3] disagree at dimension -2 (2 vs 4).
  EXPECT_THROW_MSG((ampscope::broadcast_shapes({2, 3}, {4, 3})), ampscope::ShapeError, "broadcast", "[2, 3]",
                   "[4, 3]", "dimension -2", "2 in the first", "4 in the second");
  EXPECT_THROW_MSG((ampscope::broadcast_shapes({3}, {4, 2}, "mul")), ampscope::ShapeError, "mul:", "[3]", "[4, 2]",
                   "dimension -1", "3 in the first", "2 in the second");
  EXPECT_THROW_MSG((ampscope::add(zeros({2, 3}), zeros({4, 3}))), ampscope::ShapeError, "add", "[2, 3]", "[4, 3]",
                   "dimension -2");
}

// ---- result_type --------------------------------------------------------------------------------

TEST(ops_test, result_type_follows_pytorch_promotion_with_zero_dim_tensors_ranked_lower) {
  const auto dimensioned = [](DType t) { return zeros({2}, {.dtype = t}); };
  const auto zero_dim = [](DType t) { return zeros({}, {.dtype = t}); };
  // torch.result_type(torch.ones(2, dtype=float16), torch.tensor(1., dtype=float32)) == float16
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::f16), zero_dim(DType::f32)), DType::f16);
  EXPECT_EQ(ampscope::result_type(zero_dim(DType::f32), dimensioned(DType::f16)), DType::f16);
  // torch.tensor([1, 2]).half() + torch.tensor(1., dtype=float64) -> float16
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::f16), zero_dim(DType::f64)), DType::f16);
  // A zero-dim operand of a higher category still wins: int64 [2] with float32 0-dim -> float32,
  // with float16 0-dim -> float16, with float64 0-dim -> float64; bool [2] with int64 0-dim -> int64.
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::i64), zero_dim(DType::f32)), DType::f32);
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::i64), zero_dim(DType::f16)), DType::f16);
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::i64), zero_dim(DType::f64)), DType::f64);
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::boolean), zero_dim(DType::i64)), DType::i64);
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::i64), zero_dim(DType::boolean)), DType::i64);
  // Same rank: plain promote_types. float16 with bfloat16 -> float32.
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::f16), dimensioned(DType::bf16)), DType::f32);
  EXPECT_EQ(ampscope::result_type(zero_dim(DType::f16), zero_dim(DType::f32)), DType::f32);
  EXPECT_EQ(ampscope::result_type(dimensioned(DType::i64), dimensioned(DType::f16)), DType::f16);
}

TEST(ops_test, result_type_with_a_float_scalar_keeps_floating_tensors_and_lifts_integers_to_f32) {
  // torch.tensor([1, 2]) + 2.5 -> float32 (the default dtype); a half tensor stays half.
  EXPECT_EQ(ampscope::result_type(zeros({2}, {.dtype = DType::i64}), 2.5), DType::f32);
  EXPECT_EQ(ampscope::result_type(zeros({2}, {.dtype = DType::boolean}), 2.5), DType::f32);
  EXPECT_EQ(ampscope::result_type(zeros({2}, {.dtype = DType::f16}), 2.5), DType::f16);
  EXPECT_EQ(ampscope::result_type(zeros({2}, {.dtype = DType::bf16}), 2.5), DType::bf16);
  EXPECT_EQ(ampscope::result_type(zeros({2}, {.dtype = DType::f64}), 2.5), DType::f64);
  EXPECT_EQ(ampscope::result_type(zeros({}, {.dtype = DType::f16}), 2.5), DType::f16);
}

// ---- binary ops against the reference -----------------------------------------------------------

TEST(ops_test, binary_ops_on_large_contiguous_tensors_match_the_reference_in_every_float_dtype) {
  // 150,000 elements: above the 32,768-element grain, so the kernel runs split across threads.
  constexpr std::size_t n = 150000;
  for (DType t : kFloatTypes) {
    const std::vector<double> x = make_inputs(n, t, 1), y = make_inputs(n, t, 2);
    const Tensor a = from_values(x, {static_cast<std::int64_t>(n)}, {.dtype = t});
    const Tensor b = from_values(y, {static_cast<std::int64_t>(n)}, {.dtype = t});
    for (BinOp op : kBinOps) {
      const Tensor c = run_op(op, a, b);
      ASSERT_EQ(c.dtype(), t);
      ASSERT_EQ(c.shape(), (Shape{static_cast<std::int64_t>(n)}));
      std::vector<double> ref(n);
      for (std::size_t i = 0; i < n; ++i) ref[i] = reference(op, t, x[i], y[i]);
      expect_values(c.values(), ref, fmt::format("{} {} contiguous", bin_name(op), ampscope::dtype_name(t)));
    }
  }
}

TEST(ops_test, binary_ops_on_large_strided_and_broadcast_tensors_match_the_reference) {
  // a is the transpose of a [300, 500] tensor (shape [500, 300], strides [1, 500]); b has shape [300] and
  // broadcasts along the rows (stride 0). out[i][j] = a[i][j] op b[j] = x[j * 500 + i] op y[j]. The
  // reversed operand order (b op a) is checked too.
  constexpr int R = 300, C = 500;
  for (DType t : kFloatTypes) {
    const std::vector<double> x = make_inputs(R * C, t, 3), y = make_inputs(R, t, 4);
    const Tensor a = from_values(x, {R, C}, {.dtype = t}).transpose(0, 1);
    const Tensor b = from_values(y, {R}, {.dtype = t});
    ASSERT_FALSE(a.is_contiguous());
    for (BinOp op : kBinOps) {
      const Tensor c = run_op(op, a, b);
      const Tensor d = run_op(op, b, a);
      ASSERT_EQ(c.shape(), (Shape{C, R}));
      ASSERT_EQ(d.dtype(), t);
      std::vector<double> ref_c(R * C), ref_d(R * C);
      for (int i = 0; i < C; ++i)
        for (int j = 0; j < R; ++j) {
          ref_c[i * R + j] = reference(op, t, x[j * C + i], y[j]);
          ref_d[i * R + j] = reference(op, t, y[j], x[j * C + i]);
        }
      expect_values(c.values(), ref_c, fmt::format("{} {} strided a op b", bin_name(op), ampscope::dtype_name(t)));
      expect_values(d.values(), ref_d, fmt::format("{} {} strided b op a", bin_name(op), ampscope::dtype_name(t)));
    }
  }
}

TEST(ops_test, binary_ops_broadcast_a_column_against_a_row) {
  // [4, 1] op [3] -> [4, 3]; out[i][j] = x[i] op y[j].
  for (DType t : kFloatTypes) {
    const std::vector<double> x = make_inputs(4, t, 5), y = make_inputs(3, t, 6);
    const Tensor a = from_values(x, {4, 1}, {.dtype = t});
    const Tensor b = from_values(y, {3}, {.dtype = t});
    for (BinOp op : kBinOps) {
      const Tensor c = run_op(op, a, b);
      ASSERT_EQ(c.shape(), (Shape{4, 3}));
      std::vector<double> ref;
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) ref.push_back(reference(op, t, x[i], y[j]));
      expect_values(c.values(), ref, fmt::format("{} {} [4,1] x [3]", bin_name(op), ampscope::dtype_name(t)));
    }
  }
}

TEST(ops_test, f16_results_round_once_from_float) {
  // Hand-worked: f16 values in [1, 2) are spaced 2^-10. 1 + 2^-10 (f16) plus 2^-11 (f16) is exactly
  // 1 + 3 * 2^-11 in float, the tie between 1 + 2^-10 (odd) and 1 + 2^-9 (even): 1 + 2^-9.
  const Tensor a = from_values({1.0 + std::ldexp(1.0, -10)}, {1}, {.dtype = DType::f16});
  const Tensor b = from_values({std::ldexp(1.0, -11)}, {1}, {.dtype = DType::f16});
  EXPECT_EQ(ampscope::add(a, b).item(), 1.0 + std::ldexp(1.0, -9));
  // 0.1 * 3 in f16: f16(0.1) = 0.0999755859375, times 3 = 0.2999267578125 in float; f16 values in
  // [0.25, 0.5) are spaced 2^-12, so 0.2999267578125 * 4096 = 1228.5 is a tie: to the even 1228,
  // 0.2998046875.
  const Tensor c = from_values({0.1}, {1}, {.dtype = DType::f16});
  const Tensor three = from_values({3.0}, {1}, {.dtype = DType::f16});
  EXPECT_EQ(ampscope::mul(c, three).item(), 0.2998046875);
  EXPECT_EQ(reference_f16(static_cast<float>(0.0999755859375 * 3)), 0.2998046875);
}

TEST(ops_test, f16_addition_overflows_to_infinity) {
  // 60000 + 10000 = 70000 >= 65520, the rounding threshold above the f16 maximum 65504: +inf.
  const Tensor a = from_values({60000, -60000, 300, 1}, {4}, {.dtype = DType::f16});
  const Tensor b = from_values({10000, 10000, 300, std::ldexp(1.0, -24)}, {4}, {.dtype = DType::f16});
  EXPECT_EQ(ampscope::add(a, b).at({0}), kInf);
  EXPECT_EQ(ampscope::sub(a, b).at({1}), -kInf);  // -60000 - 10000
  EXPECT_EQ(ampscope::mul(a, b).at({2}), kInf);   // 300 * 300 = 90000
  EXPECT_EQ(ampscope::div(a, b).at({3}), kInf);   // 1 / 2^-24 = 2^24
  // In bf16 the same sum is finite: values in [2^16, 2^17) are spaced 2^9 = 512 and 70000 / 512 =
  // 136.7, so 137 * 512 = 70144.
  const Tensor c = from_values({60000}, {1}, {.dtype = DType::bf16});
  const Tensor d = from_values({10000}, {1}, {.dtype = DType::bf16});
  // bf16(60000) = 59904 (spacing 256 in [2^15, 2^16): 234.4 -> 234), bf16(10000) = 9984 (spacing 64:
  // 156.25 -> 156); 59904 + 9984 = 69888 = 136.5 * 512, a tie: to the even 136 * 512 = 69632.
  EXPECT_EQ(c.item(), 59904.0);
  EXPECT_EQ(d.item(), 9984.0);
  EXPECT_EQ(ampscope::add(c, d).item(), 69632.0);
  EXPECT_EQ(reference_bf16(70000.0f), 70144.0);
}

// ---- scalar forms -------------------------------------------------------------------------------

TEST(ops_test, mul_of_f16_by_a_scalar_keeps_the_scalar_in_float) {
  // mul(x, 0.1) = f16(float(x) * 0.1f), not f16(float(x) * float(f16(0.1))): the scalar is not rounded
  // to f16 first. Over these inputs the two differ somewhere, so the test can tell them apart.
  constexpr std::size_t n = 100000;
  const std::vector<double> x = make_inputs(n, DType::f16, 7);
  const Tensor a = from_values(x, {static_cast<std::int64_t>(n)}, {.dtype = DType::f16});
  const Tensor c = ampscope::mul(a, 0.1);
  ASSERT_EQ(c.dtype(), DType::f16);
  std::vector<double> ref(n);
  std::size_t differs_from_f16_scalar = 0;
  const float h01 = static_cast<float>(static_cast<_Float16>(0.1f));
  for (std::size_t i = 0; i < n; ++i) {
    ref[i] = reference_f16(static_cast<float>(x[i]) * 0.1f);
    if (!same_value(ref[i], reference_f16(static_cast<float>(x[i]) * h01))) ++differs_from_f16_scalar;
  }
  ASSERT_GT(differs_from_f16_scalar, 0u);
  expect_values(c.values(), ref, "mul(f16, 0.1)");
}

TEST(ops_test, add_and_sub_of_a_scalar_compute_in_float_and_round_once) {
  constexpr std::size_t n = 5000;
  const std::vector<double> x = make_inputs(n, DType::f16, 8);
  const Tensor h = from_values(x, {static_cast<std::int64_t>(n)}, {.dtype = DType::f16});
  std::vector<double> ref_add(n), ref_sub(n);
  for (std::size_t i = 0; i < n; ++i) {
    ref_add[i] = reference_f16(static_cast<float>(x[i]) + 0.1f);
    ref_sub[i] = reference_f16(static_cast<float>(x[i]) - 0.1f);
  }
  expect_values(ampscope::add(h, 0.1).values(), ref_add, "add(f16, 0.1)");
  expect_values(ampscope::sub(h, 0.1).values(), ref_sub, "sub(f16, 0.1)");

  const std::vector<double> y = make_inputs(n, DType::bf16, 9);
  const Tensor b = from_values(y, {static_cast<std::int64_t>(n)}, {.dtype = DType::bf16});
  std::vector<double> ref_b(n);
  for (std::size_t i = 0; i < n; ++i) ref_b[i] = reference_bf16(static_cast<float>(y[i]) - 0.3f);
  expect_values(ampscope::sub(b, 0.3).values(), ref_b, "sub(bf16, 0.3)");
  EXPECT_EQ(ampscope::sub(b, 0.3).dtype(), DType::bf16);

  // f64 keeps the scalar in double.
  const std::vector<double> z = make_inputs(n, DType::f64, 10);
  const Tensor d = from_values(z, {static_cast<std::int64_t>(n)}, {.dtype = DType::f64});
  std::vector<double> ref_d(n);
  for (std::size_t i = 0; i < n; ++i) ref_d[i] = z[i] - 0.1;
  expect_values(ampscope::sub(d, 0.1).values(), ref_d, "sub(f64, 0.1)");
}

TEST(ops_test, div_by_a_scalar_multiplies_by_the_reciprocal_in_the_compute_type) {
  // div(x, s) = x * (1 / s) with the reciprocal computed in float for f16/bf16/f32 (PyTorch's CUDA
  // kernel), in double for f64. For f32 that differs from x / 3.0f for some inputs; the test checks such
  // inputs exist so it can tell the two apart.
  constexpr std::size_t n = 20000;
  const float r3 = 1.0f / 3.0f;
  const std::vector<double> xf = make_inputs(n, DType::f32, 11);
  const Tensor f = from_values(xf, {static_cast<std::int64_t>(n)}, {.dtype = DType::f32});
  std::vector<double> ref_f(n);
  std::size_t differs_from_true_division = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ref_f[i] = static_cast<float>(xf[i]) * r3;
    if (!same_value(ref_f[i], static_cast<float>(xf[i]) / 3.0f)) ++differs_from_true_division;
  }
  ASSERT_GT(differs_from_true_division, 0u);
  expect_values(ampscope::div(f, 3.0).values(), ref_f, "div(f32, 3)");

  // The reciprocal is computed in float from the float scalar: 1.0f / float(1.1), which is one float ulp
  // away from float(1.0 / 1.1) (the reciprocal computed in double, then rounded).
  const float r11 = 1.0f / static_cast<float>(1.1);
  ASSERT_NE(r11, static_cast<float>(1.0 / 1.1)) << "the example must tell the two reciprocals apart";
  std::vector<double> ref_f11(n);
  std::size_t differs_from_double_reciprocal = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ref_f11[i] = static_cast<float>(xf[i]) * r11;
    if (!same_value(ref_f11[i], static_cast<float>(xf[i]) * static_cast<float>(1.0 / 1.1))) {
      ++differs_from_double_reciprocal;
    }
  }
  ASSERT_GT(differs_from_double_reciprocal, 0u);
  expect_values(ampscope::div(f, 1.1).values(), ref_f11, "div(f32, 1.1)");

  const std::vector<double> xh = make_inputs(n, DType::f16, 12);
  const Tensor h = from_values(xh, {static_cast<std::int64_t>(n)}, {.dtype = DType::f16});
  std::vector<double> ref_h(n), ref_h7(n);
  for (std::size_t i = 0; i < n; ++i) {
    ref_h[i] = reference_f16(static_cast<float>(xh[i]) * r3);
    ref_h7[i] = reference_f16(static_cast<float>(xh[i]) * (1.0f / 0.7f));
  }
  expect_values(ampscope::div(h, 3.0).values(), ref_h, "div(f16, 3)");
  expect_values(ampscope::div(h, 0.7).values(), ref_h7, "div(f16, 0.7)");

  const std::vector<double> xd = make_inputs(n, DType::f64, 13);
  const Tensor d = from_values(xd, {static_cast<std::int64_t>(n)}, {.dtype = DType::f64});
  std::vector<double> ref_d(n);
  for (std::size_t i = 0; i < n; ++i) ref_d[i] = xd[i] * (1.0 / 3.0);
  expect_values(ampscope::div(d, 3.0).values(), ref_d, "div(f64, 3)");
}

TEST(ops_test, scalar_ops_on_a_large_strided_tensor_match_the_reference) {
  // The transpose of a [400, 300] f16 tensor (120,000 elements, strided, split across threads).
  constexpr int R = 400, C = 300;
  const std::vector<double> x = make_inputs(R * C, DType::f16, 14);
  const Tensor a = from_values(x, {R, C}, {.dtype = DType::f16}).transpose(0, 1);
  const Tensor c = ampscope::mul(a, 0.1);
  std::vector<double> ref(R * C);
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < R; ++j) ref[i * R + j] = reference_f16(static_cast<float>(x[j * C + i]) * 0.1f);
  expect_values(c.values(), ref, "mul(f16 transposed, 0.1)");
}

TEST(ops_test, integer_and_bool_tensors_with_a_float_scalar_give_f32) {
  // torch.tensor([1, 2, 3]) + 2.5 = tensor([3.5, 4.5, 5.5]) (float32).
  const Tensor i = from_values({1, 2, 3}, {3}, {.dtype = DType::i64});
  const Tensor s = ampscope::add(i, 2.5);
  EXPECT_EQ(s.dtype(), DType::f32);
  expect_values(s.values(), {3.5, 4.5, 5.5}, "i64 + 2.5");
  // The integer is converted to float first: 2^24 + 1 -> 2^24 (tie to even), so + 0.5 gives 2^24 + 0.5
  // rounded in float (spacing 2): 2^24.
  const Tensor big = from_values({16777217}, {1}, {.dtype = DType::i64});
  EXPECT_EQ(ampscope::add(big, 0.5).item(), 16777216.0);
  const Tensor b = from_values({1, 0}, {2}, {.dtype = DType::boolean});
  const Tensor m = ampscope::mul(b, 1.5);
  EXPECT_EQ(m.dtype(), DType::f32);
  expect_values(m.values(), {1.5, 0.0}, "bool * 1.5");
}

// ---- mixed dtypes -------------------------------------------------------------------------------

TEST(ops_test, f16_plus_f32_is_f32_and_exact_in_float) {
  const std::vector<double> x = make_inputs(1000, DType::f16, 15), y = make_inputs(1000, DType::f32, 16);
  const Tensor h = from_values(x, {1000}, {.dtype = DType::f16});
  const Tensor f = from_values(y, {1000}, {.dtype = DType::f32});
  const Tensor c = ampscope::add(h, f);
  EXPECT_EQ(c.dtype(), DType::f32);
  std::vector<double> ref(1000);
  for (int i = 0; i < 1000; ++i) ref[i] = static_cast<float>(x[i]) + static_cast<float>(y[i]);
  expect_values(c.values(), ref, "f16 + f32");
  expect_values(ampscope::add(f, h).values(), ref, "f32 + f16");
}

TEST(ops_test, f16_plus_bf16_is_f32) {
  // torch.promote_types(float16, bfloat16) == float32; both widen exactly to float.
  const std::vector<double> x = make_inputs(1000, DType::f16, 17), y = make_inputs(1000, DType::bf16, 18);
  const Tensor h = from_values(x, {1000}, {.dtype = DType::f16});
  const Tensor b = from_values(y, {1000}, {.dtype = DType::bf16});
  const Tensor c = ampscope::mul(h, b);
  EXPECT_EQ(c.dtype(), DType::f32);
  std::vector<double> ref(1000);
  for (int i = 0; i < 1000; ++i) ref[i] = static_cast<float>(x[i]) * static_cast<float>(y[i]);
  expect_values(c.values(), ref, "f16 * bf16");
}

TEST(ops_test, i64_plus_f16_is_f16_rounded_once_from_float) {
  // 2049 + 0.5: in float 2049.5, which f16 (spacing 2 in [2048, 4096)) rounds to 2050. Rounding the
  // integer to f16 first would give 2048 (2049 is a tie, to even) and then 2048.5 -> 2048.
  const Tensor i = from_values({2049, 3, -70000, 16777217}, {4}, {.dtype = DType::i64});
  const Tensor h = from_values({0.5, 0.1, 1.0, -16777216}, {4}, {.dtype = DType::f16});
  const Tensor c = ampscope::add(i, h);
  EXPECT_EQ(c.dtype(), DType::f16);
  const double h01 = reference_f16(0.1f);
  // -16777216 is far beyond f16's range: the f16 operand is -inf, so the last sum is -inf.
  expect_values(c.values(),
                {2050.0, reference_f16(3.0f + static_cast<float>(h01)), reference_f16(-69999.0f), -kInf},
                "i64 + f16");
  EXPECT_EQ(c.at({0}), 2050.0);
}

TEST(ops_test, f16_tensor_plus_f64_zero_dim_tensor_stays_f16) {
  // torch.tensor([1, 2]).half() + torch.tensor(0.1, dtype=torch.float64) -> float16 [1.0996, 2.0996]:
  // 1 + 0.1f = 1.1 -> f16 spacing 2^-10 in [1, 2): 102.4 -> 102, 1.099609375; 2.1 -> spacing 2^-9 in
  // [2, 4): 51.2 -> 51, 2.099609375.
  const Tensor h = from_values({1, 2}, {2}, {.dtype = DType::f16});
  const Tensor s = from_values({0.1}, {}, {.dtype = DType::f64});
  const Tensor c = ampscope::add(h, s);
  EXPECT_EQ(c.dtype(), DType::f16);
  EXPECT_EQ(c.shape(), (Shape{2}));
  expect_values(c.values(), {1.099609375, 2.099609375}, "f16 + f64 0-dim");
  expect_values(ampscope::add(s, h).values(), {1.099609375, 2.099609375}, "f64 0-dim + f16");
}

// ---- unary ops ----------------------------------------------------------------------------------

TEST(ops_test, relu_keeps_nan_and_zeroes_negatives) {
  const double nan = std::nan("");
  const std::vector<double> in = {-2.0, -0.0, 0.0, 1.5, nan, -kInf, kInf, -1e-30};
  const std::vector<double> ref = {0.0, 0.0, 0.0, 1.5, nan, 0.0, kInf, 0.0};
  for (DType t : kFloatTypes) {
    const Tensor r = ampscope::relu(from_values(in, {8}, {.dtype = t}));
    EXPECT_EQ(r.dtype(), t);
    std::vector<double> ref_t;
    for (double v : ref) ref_t.push_back(round_to(t, v));
    // The sign of a zero result is not part of relu's contract.
    expect_values(r.values(), ref_t, fmt::format("relu {}", ampscope::dtype_name(t)), false);
  }
}

TEST(ops_test, relu_of_a_large_strided_tensor_matches_the_reference) {
  constexpr int R = 300, C = 400;
  std::vector<double> x = make_inputs(R * C, DType::f16, 19);
  for (int k = 0; k < R * C; k += 997) x[k] = std::nan("");
  const Tensor a = from_values(x, {R, C}, {.dtype = DType::f16}).transpose(0, 1);
  std::vector<double> ref(R * C);
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < R; ++j) {
      const double v = x[j * C + i];
      ref[i * R + j] = (std::isnan(v) || v > 0) ? v : 0.0;
    }
  expect_values(ampscope::relu(a).values(), ref, "relu f16 transposed", false);
}

TEST(ops_test, neg_flips_the_sign_exactly) {
  const std::vector<double> in = {0.0, 1.5, -65504.0, 0.0999755859375, kInf};
  const Tensor n = ampscope::neg(from_values(in, {5}, {.dtype = DType::f16}));
  expect_values(n.values(), {-0.0, -1.5, 65504.0, -0.0999755859375, -kInf}, "neg f16");
}

TEST(ops_test, exp_overflows_f16_at_12_but_not_f32) {
  // e^12 = 162754.79 > 65504: +inf in f16. e^11 = 59874.14; f16 values in [32768, 65536) are spaced 32,
  // 59874.14 / 32 = 1871.07, so 1871 * 32 = 59872. e^-17 = 4.14e-8 lies between 2^-25 (the rounding
  // threshold to zero) and 2^-24 (the smallest subnormal), nearer 2^-24. e^-20 = 2.06e-9 -> 0.
  const Tensor h = ampscope::exp(from_values({12, 11, 0, -17, -20}, {5}, {.dtype = DType::f16}));
  EXPECT_EQ(h.dtype(), DType::f16);
  expect_values(h.values(), {kInf, 59872.0, 1.0, std::ldexp(1.0, -24), 0.0}, "exp f16");
  // Against the library exp rounded by _Float16, over a range of inputs.
  std::vector<double> in, ref;
  for (int k = -200; k <= 200; ++k) {
    const double v = reference_f16(k * 0.0625f);
    in.push_back(v);
    ref.push_back(reference_f16(std::exp(static_cast<float>(v))));
  }
  expect_values(ampscope::exp(from_values(in, {401}, {.dtype = DType::f16})).values(), ref, "exp f16 sweep");

  const Tensor f = ampscope::exp(from_values({12}, {1}, {.dtype = DType::f32}));
  EXPECT_TRUE(std::isfinite(f.item()));
  EXPECT_NEAR(f.item(), 162754.791419, 162754.791419 * 1e-6);
  // bf16: values in [2^17, 2^18) are spaced 2^10 = 1024; 162754.79 / 1024 = 158.94 -> 159 * 1024.
  EXPECT_EQ(ampscope::exp(from_values({12}, {1}, {.dtype = DType::bf16})).item(), 162816.0);
}

TEST(ops_test, exp_and_true_division_of_integers_give_f32_as_torch_does) {
  // torch.exp(torch.tensor([1, 2])) is float32 [e, e^2]; torch.tensor([7]) / torch.tensor([2]) is 3.5.
  const Tensor i = from_values({1, 2}, {2}, {.dtype = DType::i64});
  const Tensor e = ampscope::exp(i);
  EXPECT_EQ(e.dtype(), DType::f32);
  EXPECT_EQ(e.at({0}), static_cast<double>(std::exp(1.0f)));
  EXPECT_EQ(e.at({1}), static_cast<double>(std::exp(2.0f)));
  EXPECT_EQ(ampscope::exp(from_values({1, 0}, {2}, {.dtype = DType::boolean})).values(),
            (std::vector<double>{static_cast<double>(std::exp(1.0f)), 1.0}));
  const Tensor q = ampscope::div(from_values({7}, {1}, {.dtype = DType::i64}), from_values({2}, {1}, {.dtype = DType::i64}));
  EXPECT_EQ(q.dtype(), DType::f32);
  EXPECT_EQ(q.item(), 3.5);
}

TEST(ops_test, an_op_without_an_integer_kernel_is_refused_with_op_dtype_and_backend) {
  const Tensor i = from_values({1, 2}, {2}, {.dtype = DType::i64});
  try {
    (void)ampscope::neg(i);
    ADD_FAILURE() << "neg(i64) did not throw";
  } catch (const ampscope::UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "op 'neg' has no i64 kernel on backend 'cpu'");
  }
  EXPECT_THROW_MSG((ampscope::relu(from_values({1}, {1}, {.dtype = DType::boolean}))), ampscope::UnsupportedError,
                   "op 'relu' has no bool kernel on backend 'cpu'");
}

// ---- devices and backends -----------------------------------------------------------------------

TEST(ops_test, the_cpu_backend_reports_what_it_supports) {
  ampscope::Backend& cpu = ampscope::backend_for(Device::cpu());
  EXPECT_EQ(cpu.name(), "cpu");
  EXPECT_EQ(cpu.device(), Device::cpu());
  EXPECT_EQ(&ampscope::backend_for(Device::cpu()), &cpu);  // one backend per device
  for (DType t : kFloatTypes) {
    EXPECT_TRUE(cpu.supports(ampscope::Op::add, t)) << ampscope::dtype_name(t);
    EXPECT_TRUE(cpu.supports(ampscope::Op::exp, t)) << ampscope::dtype_name(t);
  }
  EXPECT_FALSE(cpu.supports(ampscope::Op::exp, DType::i64));
  EXPECT_TRUE(cpu.supports(ampscope::Op::copy, DType::boolean));
  EXPECT_TRUE(cpu.supports(ampscope::Op::fill, DType::i64));
  EXPECT_FALSE(cpu.supports(ampscope::Op::arange, DType::boolean));
  EXPECT_THROW_MSG(cpu.run(ampscope::Op::mul, DType::boolean, ampscope::KernelArgs{}), ampscope::UnsupportedError,
                   "op 'mul' has no bool kernel on backend 'cpu'");
}

TEST(ops_test, op_names_are_the_enumerator_names) {
  using ampscope::Op;
  const std::pair<Op, const char*> names[] = {
      {Op::fill, "fill"},     {Op::copy, "copy"},       {Op::arange, "arange"},         {Op::uniform, "uniform"},
      {Op::normal, "normal"}, {Op::add, "add"},         {Op::sub, "sub"},               {Op::mul, "mul"},
      {Op::div, "div"},       {Op::add_scalar, "add_scalar"}, {Op::mul_scalar, "mul_scalar"}, {Op::neg, "neg"},
      {Op::relu, "relu"},     {Op::exp, "exp"},
      // The ops for hand-written losses, each under its own name.
      {Op::rsub_scalar, "rsub_scalar"}, {Op::reciprocal, "reciprocal"}, {Op::abs, "abs"}, {Op::log1p, "log1p"},
      {Op::expm1, "expm1"}, {Op::abs_backward, "abs_backward"}, {Op::logsigmoid, "logsigmoid"},
      {Op::logsigmoid_backward, "logsigmoid_backward"}, {Op::softplus, "softplus"},
      {Op::softplus_backward, "softplus_backward"}, {Op::maximum, "maximum"}, {Op::minimum, "minimum"},
      {Op::maximum_backward, "maximum_backward"}, {Op::minimum_backward, "minimum_backward"},
      {Op::std_backward, "std_backward"}, {Op::max_rows, "max_rows"}, {Op::min_rows, "min_rows"},
      {Op::var_rows, "var_rows"}, {Op::evenly_distribute_rows, "evenly_distribute_rows"},
      {Op::index_backward_rows, "index_backward_rows"}, {Op::silu, "silu"}, {Op::silu_backward, "silu_backward"},
  };
  for (const auto& [op, name] : names) EXPECT_EQ(ampscope::op_name(op), name);
}

// Every op of core/backend.h has a distinct name, and the CPU backend has a kernel for it in every
// floating dtype (argmax_rows is chosen by its i64 output): an op added to the list without a kernel,
// or registered for only some dtypes, shows here.
TEST(ops_test, every_op_has_a_unique_name_and_a_cpu_kernel_in_every_floating_dtype) {
  ampscope::Backend& cpu = ampscope::backend_for(Device::cpu());
  std::set<std::string_view> seen;
  for (int o = 0; o < ampscope::kNumOps; ++o) {
    const auto op = static_cast<ampscope::Op>(o);
    EXPECT_TRUE(seen.insert(ampscope::op_name(op)).second) << "duplicate name " << ampscope::op_name(op);
    if (op == ampscope::Op::argmax_rows) {
      EXPECT_TRUE(cpu.supports(op, DType::i64));
      continue;
    }
    for (DType t : kFloatTypes) EXPECT_TRUE(cpu.supports(op, t)) << ampscope::op_name(op) << " " << ampscope::dtype_name(t);
  }
}

TEST(ops_test, backend_for_a_missing_gpu_throws_device_error) {
  if (ampscope::cuda_status().device_count != 0) {
    GTEST_SKIP() << "a CUDA device is present; this test checks the message when there is none";
  }
  EXPECT_THROW_MSG(ampscope::backend_for(Device::cuda()), ampscope::DeviceError, "device 'cuda:0' is not available",
                   "hint: use device 'cpu'");
}

}  // namespace

// ---- NaN bits and argument checks ---------------------------------------------------------------

namespace {
template <class Bits>
Bits bits_at(const Tensor& t, std::int64_t i) {
  Bits b;
  std::memcpy(&b, static_cast<const char*>(t.data()) + i * sizeof(Bits), sizeof(Bits));
  return b;
}
}  // namespace

TEST(ops_test, arithmetic_that_makes_a_nan_stores_the_canonical_quiet_nan) {
  // x86 gives 0xFFC00000 (negative) for inf - inf and an NVIDIA GPU 0x7FFFFFFF; ampscope stores the
  // GPU's canonical NaN on both backends: 0x7FFFFFFF in f32, which rounds to 0x7FFF in f16 and bf16.
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor a32 = from_values({inf, 0.0, inf}, {3}), b32 = from_values({inf, inf, 0.0}, {3});
  const Tensor d = ampscope::sub(a32, b32), m = ampscope::mul(b32, a32);
  EXPECT_EQ(bits_at<std::uint32_t>(d, 0), 0x7FFFFFFFu);  // inf - inf
  EXPECT_EQ(bits_at<std::uint32_t>(m, 1), 0x7FFFFFFFu);  // inf * 0
  EXPECT_EQ(bits_at<std::uint32_t>(m, 2), 0x7FFFFFFFu);  // 0 * inf
  for (DType t : {DType::f16, DType::bf16}) {
    const Tensor r = ampscope::sub(a32.to(t), b32.to(t));
    EXPECT_EQ(bits_at<std::uint16_t>(r, 0), 0x7FFFu) << ampscope::dtype_name(t);
  }
  const Tensor r64 = ampscope::div(from_values({0.0}, {1}, {.dtype = DType::f64}), from_values({0.0}, {1}, {.dtype = DType::f64}));
  EXPECT_EQ(bits_at<std::uint64_t>(r64, 0), 0x7FFFFFFFFFFFFFFFull);  // 0 / 0
  // A NaN input with a payload and a negative sign comes out canonical from arithmetic...
  Tensor payload = Tensor::empty({1}, {.dtype = DType::f16});
  *payload.data_as<ampscope::f16>() = ampscope::f16::from_bits(0xFE01);
  EXPECT_EQ(bits_at<std::uint16_t>(ampscope::add(payload, 1.0), 0), 0x7FFFu);
  EXPECT_EQ(bits_at<std::uint16_t>(ampscope::neg(payload), 0), 0x7FFFu);
  // ...but relu and copies only move it, bits intact.
  EXPECT_EQ(bits_at<std::uint16_t>(ampscope::relu(payload), 0), 0xFE01u);
  EXPECT_EQ(bits_at<std::uint16_t>(payload.clone(), 0), 0xFE01u);
}

TEST(ops_test, devices_in_a_mismatch_message_follow_argument_order) {
  SKIP_WITHOUT_GPU();
  const Tensor a = zeros({2});
  const Tensor b = zeros({2}, {.device = Device::cuda()});
  EXPECT_THROW_MSG(ampscope::add(a, b), ampscope::DeviceError, "add: expected all tensors on the same device, got cpu and cuda:0");
  EXPECT_THROW_MSG(ampscope::add(b, a), ampscope::DeviceError, "add: expected all tensors on the same device, got cuda:0 and cpu");
}
