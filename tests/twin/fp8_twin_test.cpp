// tests/twin/fp8_twin_test.cpp: the f32 twin on FP8 Linears (probes/twin.h, "FP8 Linears"; issue 34). A Linear
// under bf16 autocast and an FP8 region rounds twice: its operands to FP8, its f32 GEMM to bf16. The twin's rows
// must keep the two apart: local errors (labelled bf16) are the bf16 rounding of the FP8 GEMM alone, accumulated
// errors are against the unquantized Linear in f32. Both are checked against references computed here: FP8
// quantization by searching the 256 codes decoded by the format's formula, the FP8 GEMM summed in f32 in
// ascending order as docs/fp8.md defines it, and the unquantized product in f64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/fp8_linear.h"
#include "core/ops.h"
#include "probes/probe.h"
#include "probes/twin.h"
#include "tests/test_support.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

using testing::Errors;
using testing::errors_of;
using testing::exact_product;
using testing::quantized_linear_step;

// ---- an FP8 reference of the test's own ----
struct Format {
  int exp_bits, man_bits, bias;
  double max;
  bool e4m3;
};
const Format kE4M3{4, 3, 7, 448.0, true};
const Format kE5M2{5, 2, 15, 57344.0, false};

double decode(int code, const Format& f) {
  const int s = code >> 7, e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  const int e_max = (1 << f.exp_bits) - 1;
  if ((f.e4m3 && e == e_max && m == (1 << f.man_bits) - 1) || (!f.e4m3 && e == e_max)) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, 1 - f.bias - f.man_bits) : std::ldexp(1.0 + std::ldexp(m, -f.man_bits), e - f.bias);
  return s ? -mag : mag;
}

// The nearest code's value (ties to the even code; past max: +-max).
float quantized(float v, const Format& f) {
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double d = decode(c, f);
    if (std::isnan(d) || std::signbit(d) != std::signbit(v)) continue;
    const double err = std::fabs(d - static_cast<double>(v));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<float>(decode(best, f));
}

// One operand quantized with the current recipe: scale = max / amax (in double, rounded once), values decoded.
struct Operand {
  std::vector<float> q;  // decoded FP8 values, unscaled, row-major
  std::int64_t cols;
  float scale_inv;
};
Operand quantize(const std::vector<double>& x, std::int64_t cols, const Format& f) {
  double amax = 0;
  for (double v : x) amax = std::max(amax, std::fabs(v));
  const float scale = static_cast<float>(f.max / amax);
  Operand o{{}, cols, 1.0f / scale};
  for (double v : x) o.q.push_back(quantized(static_cast<float>(v) * scale, f));
  return o;
}
float at(const Operand& a, bool transpose, std::int64_t i, std::int64_t p) {
  return transpose ? a.q[static_cast<std::size_t>(p * a.cols + i)] : a.q[static_cast<std::size_t>(i * a.cols + p)];
}
// C = op(A) op(B), summed in f32 over p ascending, times fl(scale_inv_a * scale_inv_b): the FP8 GEMM before its
// bf16 rounding.
std::vector<double> fp8_product(const Operand& a, bool ta, const Operand& b, bool tb, std::int64_t I, std::int64_t P,
                                std::int64_t J) {
  const float alpha = a.scale_inv * b.scale_inv;
  std::vector<double> c;
  for (std::int64_t i = 0; i < I; ++i) {
    for (std::int64_t j = 0; j < J; ++j) {
      float s = 0;
      for (std::int64_t p = 0; p < P; ++p) s += at(a, ta, i, p) * at(b, tb, p, j);
      c.push_back(static_cast<double>(s * alpha));
    }
  }
  return c;
}

// bf16 values (random, any spread): what an autocast cast leaves unchanged.
std::vector<double> bf16_values(std::size_t n, double spread, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, spread);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return from_values(v, {static_cast<std::int64_t>(n)}, {DType::bf16}).to(DType::f32).values();
}

// The hook the twin wraps: counts the FP8 casts it hears (the probe's /fp8 rows come from them).
struct CastCounter : probe::Hook {
  int casts = 0;
  void on_fp8_quantize(const probe::Fp8QuantizeEvent&) override { ++casts; }
};

const probe::PrecisionRow& linear_row(const std::vector<probe::PrecisionRow>& rows, trace::Phase phase) {
  for (const probe::PrecisionRow& r : rows) {
    if (r.op == "linear" && r.phase == phase) return r;
  }
  throw std::runtime_error("no twin row for linear");
}

class Fp8Twin : public ::testing::TestWithParam<Fp8FormatMix> {};

TEST_P(Fp8Twin, local_errors_are_the_bf16_rounding_of_the_fp8_gemm_and_accumulated_ones_hold_the_quantization) {
  const Fp8FormatMix mix = GetParam();
  std::mt19937 rng(7);
  const std::int64_t M = 12, K = 48, N = 10;
  const std::vector<double> x = bf16_values(M * K, 1.0, rng);
  const std::vector<double> w = bf16_values(N * K, 0.2, rng);
  const std::vector<double> g = bf16_values(M * N, 0.01, rng);
  Tensor xt = from_values(x, {M, K}, {DType::f32}).requires_grad_();
  Tensor wt = from_values(w, {N, K}, {DType::f32}).requires_grad_();
  auto counter = std::make_shared<CastCounter>();
  auto twin = std::make_shared<probe::Twin>(counter);
  auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::current, .formats = mix});
  const Tensor y = quantized_linear_step(twin, fp8, xt, wt, from_values(g, {M, N}, {DType::bf16}));
  EXPECT_EQ(counter->casts, 3) << "the twin forwards every cast (input, weight, grad_output) to the hook it wraps";
  ASSERT_EQ(y.dtype(), DType::bf16);
  const Format& grad_format = mix == Fp8FormatMix::hybrid ? kE5M2 : kE4M3;
  const Operand qx = quantize(x, K, kE4M3), qw = quantize(w, K, kE4M3), qg = quantize(g, N, grad_format);

  // Forward: y = Q(x) Q(w)^T. Local against the FP8 GEMM in f32; accumulated against x w^T unquantized.
  const probe::PrecisionRow& fwd = linear_row(twin->rows(), trace::Phase::forward);
  EXPECT_EQ(fwd.out_dtype, "bf16");
  const std::vector<double> yv = y.to(DType::f32).values();
  const std::vector<double> y_fp8 = fp8_product(qx, false, qw, true, M, K, N);
  const Errors local = errors_of(yv, y_fp8, DType::bf16);
  EXPECT_DOUBLE_EQ(fwd.local_max_rel, local.max_rel);
  EXPECT_NEAR(fwd.local_mean_rel, local.mean_rel, 1e-12);
  EXPECT_DOUBLE_EQ(fwd.local_max_ulp, local.max_ulp);
  // One rounding to bf16 (8 significand bits) is at most half an ulp: 2^-8 relative.
  EXPECT_LE(fwd.local_max_rel, std::ldexp(1.0, -8));
  EXPECT_LE(fwd.local_max_ulp, 0.5);
  const Errors acc = errors_of(yv, exact_product(x, false, K, w, true, K, M, K, N), DType::bf16);
  // The twin's unquantized reference is f32 (a sum of 48 products: within 48 * 2^-24 relative of f64's).
  EXPECT_NEAR(fwd.acc_max_rel, acc.max_rel, 1e-4 * acc.max_rel);
  EXPECT_NEAR(fwd.acc_mean_rel, acc.mean_rel, 1e-4 * acc.mean_rel);
  // E4M3's 3 mantissa bits: the quantization costs far more than bf16's rounding, and the rows say where.
  EXPECT_GT(fwd.acc_mean_rel, 4 * fwd.local_mean_rel);

  // Backward: dx = Q(g) Q(w), dW = Q(g)^T Q(x), each against its FP8 GEMM in f32; the row takes the larger.
  const probe::PrecisionRow& bwd = linear_row(twin->rows(), trace::Phase::backward);
  EXPECT_EQ(bwd.out_dtype, "bf16");
  const std::vector<double> dx = xt.grad().values(), dw = wt.grad().values();
  const Errors ex = errors_of(dx, fp8_product(qg, false, qw, false, M, N, K), DType::bf16);
  const Errors ew = errors_of(dw, fp8_product(qg, true, qx, false, N, M, K), DType::bf16);
  EXPECT_DOUBLE_EQ(bwd.local_max_rel, std::max(ex.max_rel, ew.max_rel));
  EXPECT_NEAR(bwd.local_mean_rel, std::max(ex.mean_rel, ew.mean_rel), 1e-12);
  EXPECT_DOUBLE_EQ(bwd.local_max_ulp, std::max(ex.max_ulp, ew.max_ulp));
  EXPECT_LE(bwd.local_max_rel, std::ldexp(1.0, -8));
  // The unquantized dgrad is what the twin used to compare with: its error is the quantization's, far larger.
  const Errors ex_exact = errors_of(dx, exact_product(g, false, N, w, false, K, M, N, K), DType::bf16);
  EXPECT_GT(ex_exact.mean_rel, 4 * bwd.local_mean_rel);
  EXPECT_TRUE(twin->uncovered().empty());
}

INSTANTIATE_TEST_SUITE_P(formats, Fp8Twin, ::testing::Values(Fp8FormatMix::hybrid, Fp8FormatMix::e4m3));

// The delayed recipe's first step uses scale 1 (no history yet): the twin takes the scale the cast used, whatever
// it is; and a step the twin skips (every = 2) leaves no row, while the casts still reach the wrapped hook.
TEST(fp8_twin_test, the_delayed_recipe_and_untwinned_steps) {
  std::mt19937 rng(11);
  const std::int64_t M = 4, K = 16, N = 6;
  const std::vector<double> x = bf16_values(M * K, 3.0, rng);
  const std::vector<double> w = bf16_values(N * K, 0.5, rng);
  Tensor xt = from_values(x, {M, K}, {DType::bf16});
  Tensor wt = from_values(w, {N, K}, {DType::bf16});
  auto counter = std::make_shared<CastCounter>();
  auto twin = std::make_shared<probe::Twin>(counter, probe::TwinOptions{.every = 2});
  auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::delayed});
  std::vector<Tensor> ys;
  {
    probe::HookGuard installed(twin);
    for (std::int64_t n = 0; n < 3; ++n) {
      probe::StepScope step(n);
      {
        Fp8Guard region(fp8);
        ys.push_back(linear(xt, wt));
      }
      fp8->end_step();
      step.end({});
    }
  }
  EXPECT_EQ(counter->casts, 6);
  std::vector<probe::PrecisionRow> rows;
  for (const probe::PrecisionRow& r : twin->rows()) {
    if (r.op == "linear") rows.push_back(r);
  }
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].step, 0);
  EXPECT_EQ(rows[1].step, 2);
  // Step 0 quantized with scale 1 (x up to ~10 keeps few codes' worth of precision), step 2 with max / amax.
  Operand qx1{{}, K, 1.0f}, qw1{{}, K, 1.0f};
  for (double v : x) qx1.q.push_back(quantized(static_cast<float>(v), kE4M3));
  for (double v : w) qw1.q.push_back(quantized(static_cast<float>(v), kE4M3));
  const Operand qx2 = quantize(x, K, kE4M3), qw2 = quantize(w, K, kE4M3);
  const Errors e0 = errors_of(ys[0].to(DType::f32).values(), fp8_product(qx1, false, qw1, true, M, K, N), DType::bf16);
  const Errors e2 = errors_of(ys[2].to(DType::f32).values(), fp8_product(qx2, false, qw2, true, M, K, N), DType::bf16);
  EXPECT_DOUBLE_EQ(rows[0].local_max_rel, e0.max_rel);
  EXPECT_DOUBLE_EQ(rows[1].local_max_rel, e2.max_rel);
  EXPECT_TRUE(twin->uncovered().empty());
}

}  // namespace
}  // namespace ampscope
