// tests/autograd/silu_test.cpp: silu(x) = x * sigmoid(x) (torch.nn.functional.silu, Llama's activation).
// Forward values against x / (1 + e^-x) in double; f16 and bf16 over every bit pattern against the float
// formula of PyTorch's CUDA kernel rounded once by independent references (tests/test_support.h), and
// within one ulp of the double value; the edge cases (infinities, NaN, -0, exp overflowing) are PyTorch
// 1.13's answers, written down from python3-torch when writing the test (literal here, nothing taken
// from our output). Gradients against finite differences are in gradcheck_test.cpp (case "silu"); here
// the points a finite difference says nothing about.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using ::ampscope::testing::reference_bf16;
using ::ampscope::testing::reference_f16;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double silu_double(double x) { return x / (1.0 + std::exp(-x)); }

// Every value of a 16-bit format, from its bit pattern (f16 through g++'s _Float16; bf16 as the top half
// of a float), NaNs left out.
std::vector<double> all_values(DType dtype) {
  std::vector<double> v;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    double x;
    if (dtype == DType::f16) {
      const auto bits = static_cast<std::uint16_t>(b);
      _Float16 h;
      std::memcpy(&h, &bits, sizeof h);
      x = static_cast<double>(h);
    } else {
      const std::uint32_t bits = b << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      x = f;
    }
    if (!std::isnan(x)) v.push_back(x);
  }
  return v;
}

TEST(silu_test, f32_and_f64_values_are_x_over_one_plus_exp_minus_x) {
  const std::vector<double> xs = {-8.0, -1.0, -0.25, 0.5, 1.0, 3.0, 10.0};
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<double> y = silu(from_values(xs, {7}, {dtype})).values();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double ref = silu_double(xs[i]);
      // f32: exp, the add and the division each round once (a few units of 2^-24); f64 the same in 2^-53.
      const double rel = dtype == DType::f32 ? 4 * 0x1p-24 : 4 * 0x1p-53;
      EXPECT_NEAR(y[i], ref, std::fabs(ref) * rel) << xs[i];
    }
  }
  // Hand-worked: silu(0) = 0, silu(1) = 1 / (1 + 1/e) = 0.7310585786..., silu(-1) = -0.2689414213...
  const std::vector<double> v = silu(from_values({0.0, 1.0, -1.0}, {3}, {DType::f64})).values();
  EXPECT_EQ(v[0], 0.0);
  EXPECT_NEAR(v[1], 0.7310585786300049, 1e-15);
  EXPECT_NEAR(v[2], -0.2689414213699951, 1e-15);
}

// PyTorch 1.13 (F.silu on f32): [-inf, -100, -89, -88, -0, +inf, nan] -> [nan, -0, -0, -5.33e-37, -0, inf,
// nan]. exp(89) overflows float, so -89 / inf is -0; exp(88) does not.
TEST(silu_test, edge_cases_match_pytorch) {
  Tensor x = from_values({-kInf, -100.0, -89.0, -88.0, -0.0, kInf, kNan, 0.0}, {8});
  x.requires_grad_();
  const Tensor y = silu(x);
  const std::vector<double> v = y.values();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 0.0);
  EXPECT_TRUE(std::signbit(v[1]));
  EXPECT_EQ(v[2], 0.0);
  EXPECT_TRUE(std::signbit(v[2]));
  EXPECT_NEAR(v[3], -5.328049755387946e-37, 1e-43);
  EXPECT_EQ(v[4], 0.0);
  EXPECT_TRUE(std::signbit(v[4]));
  EXPECT_EQ(v[5], kInf);
  EXPECT_TRUE(std::isnan(v[6]));
  // PyTorch's gradients of sum(silu(x)): [nan, -0, -0, -5.27e-37, 0.5, nan, nan, 0.5]: s (1 + x (1 - s))
  // is 0 * -inf at -inf and inf * 0 at +inf.
  sum(y).backward();
  const std::vector<double> g = x.grad().values();
  EXPECT_TRUE(std::isnan(g[0]));
  EXPECT_EQ(g[1], 0.0);
  EXPECT_TRUE(std::signbit(g[1]));
  EXPECT_NEAR(g[3], -5.2675033481724166e-37, 1e-43);
  EXPECT_EQ(g[4], 0.5);
  EXPECT_TRUE(std::isnan(g[5]));
  EXPECT_TRUE(std::isnan(g[6]));
  EXPECT_EQ(g[7], 0.5);
}

// Every f16 and bf16 value: computed in float as PyTorch's CUDA kernel (x / (1 + expf(-x))) and rounded
// once to the input's dtype (so never x * a rounded sigmoid), and within one ulp of the exact silu.
TEST(silu_test, f16_and_bf16_are_computed_in_float_and_rounded_once_for_every_value) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<double> xs = all_values(dtype);
    const Tensor y = silu(from_values(xs, {static_cast<std::int64_t>(xs.size())}, {dtype}));
    ASSERT_EQ(y.dtype(), dtype);
    const std::vector<double> v = y.values();
    int shown = 0, wrong = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float xf = static_cast<float>(xs[i]);
      const float in_float = xf / (1.0f + std::exp(-xf));
      const double want = dtype == DType::f16 ? reference_f16(in_float) : reference_bf16(in_float);
      const bool same = std::isnan(want) ? std::isnan(v[i]) : (v[i] == want && std::signbit(v[i]) == std::signbit(want));
      if (!same) {
        ++wrong;
        if (shown++ < 5) ADD_FAILURE() << "silu(" << xs[i] << ") = " << v[i] << ", float formula rounded once: " << want;
      }
      // One ulp of the exact value (the dtype's spacing at |exact|), where float's exp(-x) does not overflow
      // (below x = -88.7 the formula gives -0, as PyTorch's does, while the exact value is a bf16 normal).
      const double exact = silu_double(xs[i]);
      if (xs[i] > -88.0 && std::isfinite(v[i]) && std::fabs(exact) < (dtype == DType::f16 ? 65504.0 : 3e38)) {
        const int mant = dtype == DType::f16 ? 10 : 7;
        const int min_exp = dtype == DType::f16 ? -14 : -126;
        const int e = exact == 0.0 ? min_exp : std::max(std::ilogb(exact), min_exp);
        EXPECT_LE(std::fabs(v[i] - exact), std::ldexp(1.0, e - mant)) << "silu(" << xs[i] << ")";
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(silu_test, runs_in_its_inputs_dtype_under_autocast_and_records_one_op) {
  for (DType lower : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(lower));
    Tensor x = from_values({-3.0, -0.5, 0.25, 2.0}, {4}, {lower});
    x.requires_grad_();
    Tensor in_region;
    {
      AutocastGuard region(lower);
      in_region = silu(x);
    }
    EXPECT_EQ(in_region.dtype(), lower);
    ASSERT_NE(in_region.grad_fn(), nullptr);
    EXPECT_EQ(in_region.grad_fn()->op(), "silu");
    sum(in_region).backward();
    EXPECT_EQ(x.grad().dtype(), lower);
    // The gradient is the float formula rounded once: g s (1 + x (1 - s)) with g = 1.
    const std::vector<double> xs = x.values(), g = x.grad().values();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float xf = static_cast<float>(xs[i]);
      const float s = 1.0f / (1.0f + std::exp(-xf));
      const float d = 1.0f * s * (1.0f + xf * (1.0f - s));
      EXPECT_EQ(g[i], lower == DType::f16 ? reference_f16(d) : reference_bf16(d)) << xs[i];
    }
  }
  EXPECT_THROW_MSG(silu(from_values({1, 2}, {2}, {.dtype = DType::i64})), DTypeError,
                   "silu: input must be floating", "i64");
}

TEST(silu_test, silu_module_applies_silu) {
  const Tensor x = from_values({-2.0, -0.5, 0.0, 0.75, 3.0}, {5});
  nn::SiLU act;
  EXPECT_EQ(act(x).values(), silu(x).values());
  EXPECT_EQ(act.type_name(), "SiLU");
}

}  // namespace
}  // namespace ampscope
