// tests/core/fp8_linear_test.cpp: FP8 Linear GEMMs (core/fp8_linear.h) against a reference written here.
//
// The reference does not use core/float8.h or core/fp8_recipe.h: it rounds to bf16 by its own bit rule,
// decodes FP8 codes by the format's formula in double, quantizes by searching all codes for the nearest
// value (ties to the even code, saturating at +-max), and computes scales as fp8_max / amax in double rounded
// once to float (the correctly rounded float quotient). Two comparisons per GEMM:
// - bit for bit with the same order of operations: the products of decoded values (exact in float) summed in
//   float over the inner index in ascending order, times fl(scale_inv_a * scale_inv_b), plus the bias, in
//   float, then rounded to bf16;
// - against the exact value computed in double (f64 sums of the same quantized operands), within the bound
//   derived in accumulation_bound(): this is what holds whatever order a GEMM (cuBLASLt) sums in.
#include "core/fp8_linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "core/autocast.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope {
namespace {

// ---- the reference ----

float bf16_round(float f) {  // round to nearest even on the top 16 bits (no NaN in these tests)
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, sizeof u);
  return f;
}

struct RefFormat {
  int exp_bits, man_bits, bias;
  double max;
  bool e4m3;
};
const RefFormat kE4M3{4, 3, 7, 448.0, true};
const RefFormat kE5M2{5, 2, 15, 57344.0, false};

// (-1)^s 2^(e-bias) (1 + m/2^M), or (-1)^s m 2^(1-bias-M) for e = 0; NaN/inf codes give NaN (never chosen).
double ref_decode(int code, const RefFormat& f) {
  const int s = code >> 7, e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  const int e_max = (1 << f.exp_bits) - 1;
  if (f.e4m3 && e == e_max && m == (1 << f.man_bits) - 1) return std::nan("");
  if (!f.e4m3 && e == e_max) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, 1 - f.bias - f.man_bits) : std::ldexp(1.0 + std::ldexp(m, -f.man_bits), e - f.bias);
  return s ? -mag : mag;
}

// The code nearest to v (v finite), ties to the even code, beyond max saturating to +-max.
int ref_quantize(float v, const RefFormat& f) {
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double d = ref_decode(c, f);
    if (std::isnan(d) || std::signbit(d) != std::signbit(v)) continue;
    const double err = std::fabs(d - static_cast<double>(v));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

struct RefOperand {
  std::vector<double> decoded;  // row-major [rows, cols], unscaled
  std::int64_t rows, cols;
  float scale, scale_inv;
};

// Quantizes bf16 values (given as floats) with `scale`: q = nearest(fl(x * scale)).
RefOperand ref_operand(const std::vector<float>& x, std::int64_t rows, std::int64_t cols, float scale, const RefFormat& f) {
  RefOperand r{{}, rows, cols, scale, static_cast<float>(1.0 / static_cast<double>(scale))};
  for (float v : x) r.decoded.push_back(ref_decode(ref_quantize(v * scale, f), f));
  return r;
}

float amax_of(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}
float current_scale(float amax, const RefFormat& f) { return static_cast<float>(f.max / static_cast<double>(amax)); }

double at(const RefOperand& a, bool t, std::int64_t i, std::int64_t p) {
  return t ? a.decoded[static_cast<std::size_t>(p * a.cols + i)] : a.decoded[static_cast<std::size_t>(i * a.cols + p)];
}

struct RefGemm {
  std::vector<float> ordered;    // the f32 sequence of operations, rounded to bf16
  std::vector<double> exact;     // in double, unrounded
  std::vector<double> abs_sum;   // alpha * sum |a b| (+ |bias|), for the bound
  std::int64_t inner = 0;
};

RefGemm ref_gemm(const RefOperand& a, bool ta, const RefOperand& b, bool tb, const std::vector<float>& bias = {}) {
  const std::int64_t I = ta ? a.cols : a.rows, P = ta ? a.rows : a.cols, J = tb ? b.rows : b.cols;
  const float alpha = a.scale_inv * b.scale_inv;
  RefGemm r;
  r.inner = P;
  for (std::int64_t i = 0; i < I; ++i) {
    for (std::int64_t j = 0; j < J; ++j) {
      float acc = 0.0f;
      double exact = 0.0, abs_sum = 0.0;
      for (std::int64_t p = 0; p < P; ++p) {
        const double prod = at(a, ta, i, p) * (tb ? b.decoded[static_cast<std::size_t>(j * b.cols + p)]
                                                  : b.decoded[static_cast<std::size_t>(p * b.cols + j)]);
        acc += static_cast<float>(prod);  // exact in float: at most 8 significant bits
        exact += prod;
        abs_sum += std::fabs(prod);
      }
      float y = acc * alpha;
      double e = exact * static_cast<double>(a.scale_inv) * static_cast<double>(b.scale_inv);
      double s = abs_sum * static_cast<double>(a.scale_inv) * static_cast<double>(b.scale_inv);
      if (!bias.empty()) {
        y += bias[static_cast<std::size_t>(j)];
        e += bias[static_cast<std::size_t>(j)];
        s += std::fabs(bias[static_cast<std::size_t>(j)]);
      }
      r.ordered.push_back(bf16_round(y));
      r.exact.push_back(e);
      r.abs_sum.push_back(s);
    }
  }
  return r;
}

// The error of the f32 result before the bf16 rounding: a sum of P exact products in any order is within
// gamma_(P-1) * sum|products| of the exact sum (gamma_n = n u / (1 - n u), u = 2^-24, Higham 3.1); the scaling
// by alpha (one rounding of alpha = fl(sa_inv * sb_inv), one of the product) adds 2u relative and the bias
// addition u: all within (P + 3) * u / (1 - (P + 3) u) * abs_sum. The bf16 rounding then adds at most 2^-9
// relative of the f32 value (bf16 keeps 8 significant bits: u = 2^-8). alpha itself differs from sa_inv * sb_inv by u relative, included above.
double accumulation_bound(double abs_sum, double exact, std::int64_t P) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(P + 3);
  const double f32_err = n * u / (1 - n * u) * abs_sum;
  return f32_err + std::ldexp(1.0, -8) * (std::fabs(exact) + f32_err);
}

void expect_matches(const std::vector<double>& got, const RefGemm& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.ordered.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], static_cast<double>(ref.ordered[i])) << what << " element " << i;
    EXPECT_LE(std::fabs(got[i] - ref.exact[i]), accumulation_bound(ref.abs_sum[i], ref.exact[i], ref.inner))
        << what << " element " << i << ": " << got[i] << " vs exact " << ref.exact[i];
  }
}

std::vector<float> random_bf16(std::size_t n, double spread, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, spread);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(static_cast<float>(d(rng)));
  return v;
}

Tensor tensor_of(const std::vector<float>& v, const Shape& shape) {
  return from_values(std::vector<double>(v.begin(), v.end()), shape, {.dtype = DType::f32});
}

// ---- the tests ----

struct Case {
  Fp8FormatMix mix;
  const char* name;
};

class Fp8LinearCurrent : public ::testing::TestWithParam<Case> {};

// One Linear under bf16 autocast and current scaling: y, dx, dW and db against the reference. The input is
// 3-D ([2, 5, 24]: rows folded as a Linear does) and its values span several binades so that some quantize to
// subnormals; the weight is wide enough that the inner sums have 24 and 16 terms.
TEST_P(Fp8LinearCurrent, forward_and_backward_match_the_reference_bit_for_bit_and_the_exact_value_within_the_bound) {
  const Fp8FormatMix mix = GetParam().mix;
  const RefFormat& grad_format = mix == Fp8FormatMix::hybrid ? kE5M2 : kE4M3;
  std::mt19937 rng(1234);
  const std::int64_t B = 2, T = 5, K = 24, N = 16, M = B * T;
  const std::vector<float> x = random_bf16(static_cast<std::size_t>(M * K), 3.0, rng);
  const std::vector<float> w = random_bf16(static_cast<std::size_t>(N * K), 0.2, rng);
  const std::vector<float> bias = random_bf16(static_cast<std::size_t>(N), 0.1, rng);
  const std::vector<float> g = random_bf16(static_cast<std::size_t>(M * N), 1e-3, rng);

  Tensor xt = tensor_of(x, {B, T, K}).requires_grad_();
  Tensor wt = tensor_of(w, {N, K}).requires_grad_();
  Tensor bt = tensor_of(bias, {N}).requires_grad_();
  auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::current, .formats = mix});
  Tensor y;
  {
    AutocastGuard autocast(DType::bf16);
    Fp8Guard region(fp8);
    y = linear(xt, wt, bt);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_EQ(y.shape(), (Shape{B, T, N}));
  y.backward(tensor_of(g, {B, T, N}).to(DType::bf16));

  const RefOperand qx = ref_operand(x, M, K, current_scale(amax_of(x), kE4M3), kE4M3);
  const RefOperand qw = ref_operand(w, N, K, current_scale(amax_of(w), kE4M3), kE4M3);
  const RefOperand qg = ref_operand(g, M, N, current_scale(amax_of(g), grad_format), grad_format);
  expect_matches(y.values(), ref_gemm(qx, false, qw, true, bias), "y = Q(x) Q(W)^T + b");
  expect_matches(xt.grad().values(), ref_gemm(qg, false, qw, false), "dx = Q(dy) Q(W)");
  expect_matches(wt.grad().values(), ref_gemm(qg, true, qx, false), "dW = Q(dy)^T Q(x)");
  // db from the unquantized gradient: a bf16 rounding of an f32 sum of M terms.
  const std::vector<double> db = bt.grad().values();
  for (std::int64_t j = 0; j < N; ++j) {
    double exact = 0, abs_sum = 0;
    for (std::int64_t m = 0; m < M; ++m) {
      exact += g[static_cast<std::size_t>(m * N + j)];
      abs_sum += std::fabs(g[static_cast<std::size_t>(m * N + j)]);
    }
    EXPECT_LE(std::fabs(db[static_cast<std::size_t>(j)] - exact), accumulation_bound(abs_sum, exact, M)) << j;
  }
  // The quantization did something: y is not the bf16 product (x and W in E4M3 lose bits bf16 keeps).
  Tensor y_bf16;
  {
    AutocastGuard autocast(DType::bf16);
    y_bf16 = linear(xt.detach(), wt.detach(), bt.detach());
  }
  EXPECT_NE(y.values(), y_bf16.values());
  EXPECT_TRUE(fp8->states().empty()) << "current scaling keeps no state";
}

INSTANTIATE_TEST_SUITE_P(formats, Fp8LinearCurrent,
                         ::testing::Values(Case{Fp8FormatMix::hybrid, "hybrid"}, Case{Fp8FormatMix::e4m3, "e4m3"}),
                         [](const auto& info) { return std::string(info.param.name); });

// A Linear kept out of FP8 by glob, and one on f32 inputs (an autocast override, the twin's recompute), run as
// plain linear(): bit for bit the result without the guard.
TEST(fp8_linear_test, kept_modules_and_f32_inputs_are_not_quantized) {
  Generator gen(5);
  nn::Sequential model;
  auto kept = model.push_back(std::make_shared<nn::Linear>(8, 4, gen));
  auto fp8_layer = model.push_back(std::make_shared<nn::Linear>(8, 4, gen));
  const Tensor x = randn({3, 8}, gen);
  auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::delayed, .keep_bf16 = {"0"}});
  AutocastGuard autocast(DType::bf16);
  std::vector<double> plain_kept, plain_fp8, plain_f32;
  {
    NoGradGuard no_grad;
    plain_kept = (*kept)(x).values();
    plain_fp8 = (*fp8_layer)(x).values();
    AutocastGuard off(std::nullopt, false);
    plain_f32 = (*fp8_layer)(x).values();
  }
  Fp8Guard region(fp8);
  NoGradGuard no_grad;
  EXPECT_EQ((*kept)(x).values(), plain_kept);
  EXPECT_NE((*fp8_layer)(x).values(), plain_fp8);
  {
    AutocastGuard off(std::nullopt, false);
    EXPECT_EQ((*fp8_layer)(x).values(), plain_f32);
  }
  ASSERT_EQ(fp8->states().size(), 1u);
  EXPECT_EQ(fp8->states().begin()->first, "1");
}

// Delayed scaling over six steps (history 4, max): module "0" runs every step with input amaxes 2, 4, 1, 1, 3, 1
// (docs/fp8.md's worked example); module "1" runs only in steps 1, 2 and 4 (counting from 0) with input amaxes
// 8, 0.5, 2, so its history rolls only then. At each step the scale used must be fp8_max / max(window of
// the amaxes of the steps the module ran before), 1 before any, computed here; the output and the gradients
// are checked bit for bit against the reference quantized with those scales, so a scale that was not the one
// used would show in the values too.
TEST(fp8_linear_test, delayed_scaling_uses_the_scale_from_the_history_up_to_the_previous_step) {
  const std::int64_t M = 4, K = 8, N = 6, len = 4;
  for (AmaxAlgo algo : {AmaxAlgo::max, AmaxAlgo::most_recent}) {
    SCOPED_TRACE(algo == AmaxAlgo::max ? "max" : "most_recent");
    Generator gen(9);
    nn::Sequential model;
    auto a = model.push_back(std::make_shared<nn::Linear>(K, N, gen));
    auto b = model.push_back(std::make_shared<nn::Linear>(K, N, gen));
    auto fp8 = std::make_shared<Fp8Context>(
        Fp8Options{.recipe = Fp8Recipe::delayed, .formats = Fp8FormatMix::hybrid,
                   .delayed = {.history_len = len, .algo = algo, .margin = 0}});
    const std::vector<float> amax_a = {2, 4, 1, 1, 3, 1};
    const std::vector<std::pair<int, float>> runs_b = {{1, 8}, {2, 0.5f}, {4, 2}};
    std::mt19937 rng(77);
    // Every module's past amaxes per operand (the steps it ran), newest last.
    std::map<std::string, std::vector<float>> seen_x, seen_w, seen_g;
    auto expected = [&](const std::vector<float>& past, const RefFormat& f) -> float {
      if (past.empty()) return 1.0f;
      float m = 0;
      if (algo == AmaxAlgo::most_recent) {
        m = past.back();
      } else {
        for (std::size_t i = past.size() > static_cast<std::size_t>(len) ? past.size() - len : 0; i < past.size(); ++i)
          m = std::max(m, past[i]);
      }
      return current_scale(m, f);
    };
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE(step);
      std::vector<std::pair<std::string, std::shared_ptr<nn::Linear>>> ran = {{"0", a}};
      std::vector<float> amaxes = {amax_a[static_cast<std::size_t>(step)]};
      for (const auto& [s, am] : runs_b) {
        if (s == step) {
          ran.push_back({"1", b});
          amaxes.push_back(am);
        }
      }
      for (std::size_t r = 0; r < ran.size(); ++r) {
        const std::string& name = ran[r].first;
        nn::Linear& layer = *ran[r].second;
        // Values in (-1, 1) scaled so that max |x| is exactly the amax of the step (a power of two or 3 times
        // one, exact in bf16), at a position that moves.
        std::vector<float> x = random_bf16(static_cast<std::size_t>(M * K), 0.3, rng);
        for (float& v : x) v = bf16_round(std::clamp(v, -0.9f, 0.9f) * amaxes[r]);
        x[static_cast<std::size_t>((step * 5 + 3) % (M * K))] = -amaxes[r];
        const std::vector<float> g = random_bf16(static_cast<std::size_t>(M * N), 0.01, rng);
        std::vector<float> w;
        for (double v : layer.weight().to(DType::bf16).values()) w.push_back(static_cast<float>(v));
        std::vector<float> bias;
        for (double v : layer.bias().to(DType::bf16).values()) bias.push_back(static_cast<float>(v));

        const float sx = expected(seen_x[name], kE4M3), sw = expected(seen_w[name], kE4M3),
                    sg = expected(seen_g[name], kE5M2);
        Tensor xt = tensor_of(x, {M, K}).requires_grad_();
        Tensor y;
        {
          AutocastGuard autocast(DType::bf16);
          Fp8Guard region(fp8);
          y = layer(xt);
        }
        const Fp8LinearState& st = fp8->states().at(name);
        EXPECT_EQ(st.input.scale, sx);
        EXPECT_EQ(st.weight.scale, sw);
        y.backward(tensor_of(g, {M, N}).to(DType::bf16));
        EXPECT_EQ(st.grad_output.scale, sg);
        const RefOperand qx = ref_operand(x, M, K, sx, kE4M3), qw = ref_operand(w, N, K, sw, kE4M3),
                         qg = ref_operand(g, M, N, sg, kE5M2);
        expect_matches(y.values(), ref_gemm(qx, false, qw, true, bias), "y");
        expect_matches(xt.grad().values(), ref_gemm(qg, false, qw, false), "dx");
        seen_x[name].push_back(amax_of(x));
        seen_w[name].push_back(amax_of(w));
        seen_g[name].push_back(amax_of(g));
      }
      fp8->end_step();
    }
    // Module "0"'s input scale after the six steps: 448 / 3 with max (3 still in the window 1, 1, 3, 1), 448 / 1
    // with most_recent: docs/fp8.md's table, last row.
    EXPECT_EQ(fp8->states().at("0").input.scale, algo == AmaxAlgo::max ? 448.0f / 3.0f : 448.0f);
  }
}

// The f32 twin runs a node's backward again under WidenToF32 (Node::apply_in_f32): an FP8 Linear's node then
// computes the unquantized products in f32 and records nothing into the module's state (a backward function
// has no side effects). Its dx is the f32 product of the bf16 values, within f32's accumulation bound of the
// f64 product, and differs from the FP8 dx.
TEST(fp8_linear_test, the_twins_widened_backward_is_unquantized_and_leaves_the_state_alone) {
  std::mt19937 rng(42);
  const std::int64_t M = 6, K = 16, N = 8;
  const std::vector<float> x = random_bf16(static_cast<std::size_t>(M * K), 1.0, rng);
  const std::vector<float> w = random_bf16(static_cast<std::size_t>(N * K), 0.3, rng);
  const std::vector<float> g = random_bf16(static_cast<std::size_t>(M * N), 0.01, rng);
  auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::delayed});
  Tensor xt = tensor_of(x, {M, K}).to(DType::bf16).requires_grad_();
  Tensor wt = tensor_of(w, {N, K}).to(DType::bf16).requires_grad_();
  Tensor y;
  {
    Fp8Guard region(fp8);
    y = linear(xt, wt);
  }
  const Tensor gt = tensor_of(g, {M, N}).to(DType::bf16);
  const std::vector<Tensor> quantized = y.grad_fn()->apply(gt, {true, true, true});
  const std::vector<float> history = fp8->states().at("").grad_output.amax_history;
  EXPECT_EQ(history[0], amax_of(g)) << "apply() recorded grad_output's amax";
  const std::vector<Tensor> widened = y.grad_fn()->apply_in_f32(gt, {true, true, true});
  EXPECT_EQ(fp8->states().at("").grad_output.amax_history, history) << "the twin's run recorded nothing";
  ASSERT_EQ(widened[0].dtype(), DType::f32);
  const std::vector<double> dx = widened[0].values();
  for (std::int64_t m = 0; m < M; ++m) {
    for (std::int64_t k = 0; k < K; ++k) {
      double exact = 0, abs_sum = 0;
      for (std::int64_t n = 0; n < N; ++n) {
        const double p = static_cast<double>(g[static_cast<std::size_t>(m * N + n)]) * w[static_cast<std::size_t>(n * K + k)];
        exact += p;
        abs_sum += std::fabs(p);
      }
      const double u = std::ldexp(1.0, -24);
      EXPECT_LE(std::fabs(dx[static_cast<std::size_t>(m * K + k)] - exact), (N + 1) * u * abs_sum + u * std::fabs(exact));
    }
  }
  EXPECT_NE(quantized[0].to(DType::f32).values(), dx);
}

// amax as TE's cast kernels fold it, with fmaxf: a NaN element is skipped (it quantizes to the NaN code,
// 0x7F), an inf wins (and saturates at +-max).
TEST(fp8_linear_test, the_amax_skips_nan_elements_and_an_inf_wins) {
  const Fp8Options current{.recipe = Fp8Recipe::current};
  const Fp8Quantized q = fp8_quantize_operand(tensor_of({1.0f, std::nanf(""), -3.0f, 0.5f}, {2, 2}),
                                              Fp8Operand::input, current, nullptr);
  EXPECT_EQ(q.amax, 3.0f);
  EXPECT_EQ(q.scale, current_scale(3.0f, kE4M3));
  EXPECT_EQ(q.codes[1], 0x7F);
  EXPECT_EQ(q.codes[2], ref_quantize(-3.0f * q.scale, kE4M3));
  const float inf = std::numeric_limits<float>::infinity();
  const Fp8Quantized qi = fp8_quantize_operand(tensor_of({1.0f, -inf, std::nanf(""), 2.0f}, {1, 4}),
                                               Fp8Operand::grad_output, current, nullptr);
  EXPECT_EQ(qi.amax, inf);
  EXPECT_EQ(qi.scale, 1.0f) << "current scaling: an infinite amax gives scale 1";
  EXPECT_EQ(qi.format, Fp8Format::e5m2);
  EXPECT_EQ(qi.codes[1], 0xFB) << "-inf saturates at -57344";
  Fp8LinearState state{make_delayed_scaling_state({}), make_delayed_scaling_state({}), make_delayed_scaling_state({})};
  (void)fp8_quantize_operand(tensor_of({std::nanf(""), 0.25f}, {1, 2}), Fp8Operand::weight,
                             Fp8Options{.recipe = Fp8Recipe::delayed}, &state);
  EXPECT_EQ(state.weight.amax_history[0], 0.25f);
}

TEST(fp8_linear_test, a_bad_recipe_is_refused_and_hybrid_quantizes_only_gradients_to_e5m2) {
  EXPECT_THROW((Fp8Context(Fp8Options{.delayed = {.history_len = 0}})), Fp8RecipeError);
  EXPECT_EQ(fp8_operand_format(Fp8Operand::grad_output, Fp8FormatMix::hybrid), Fp8Format::e5m2);
  EXPECT_EQ(fp8_operand_format(Fp8Operand::grad_output, Fp8FormatMix::e4m3), Fp8Format::e4m3);
  EXPECT_EQ(fp8_operand_format(Fp8Operand::input, Fp8FormatMix::hybrid), Fp8Format::e4m3);
}

// The GEMM's row blocks (several, on the pool) and column blocks (full 32-column blocks and a remainder) sum
// each element as the one-at-a-time definition does: p ascending from 0 in f32, then alpha, then the bias.
// Codes drawn at random over every finite E4M3 / E5M2 value; sizes chosen so that fp8_gemm cuts 5 row blocks.
TEST(fp8_linear_test, the_blocked_threaded_gemm_sums_every_element_in_the_defined_order) {
  std::mt19937 rng(5);
  const std::int64_t I = 1200, P = 64, J = 70;
  const auto random_codes = [&](std::int64_t n, Fp8Format f) {
    std::vector<std::uint8_t> c(static_cast<std::size_t>(n));
    for (auto& v : c) {
      do v = static_cast<std::uint8_t>(rng() & 0xFF);
      while (!std::isfinite(fp8_to_float(v, f)));
    }
    return c;
  };
  for (const bool transpose_b : {false, true}) {
    Fp8Quantized a{.codes = random_codes(I * P, Fp8Format::e4m3), .rows = I, .cols = P, .format = Fp8Format::e4m3,
                   .amax = 1.0f, .scale = 3.0f, .scale_inv = 0.375f};
    Fp8Quantized b{.codes = random_codes(P * J, Fp8Format::e5m2), .rows = transpose_b ? J : P,
                   .cols = transpose_b ? P : J, .format = Fp8Format::e5m2, .amax = 1.0f, .scale = 0.5f,
                   .scale_inv = 0.0078125f};
    std::vector<double> bias_v(static_cast<std::size_t>(J));
    for (auto& v : bias_v) v = std::ldexp(static_cast<double>(rng() % 1000) - 500.0, -6);
    const Tensor bias = from_values(bias_v, {J}, {DType::f32});
    const Tensor c = fp8_gemm(a, false, b, transpose_b, DType::f32, bias);
    const std::vector<double> got = c.values();
    const float alpha = a.scale_inv * b.scale_inv;
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < I; ++i) {
      for (std::int64_t j = 0; j < J; ++j) {
        float s = 0.0f;
        for (std::int64_t p = 0; p < P; ++p) {
          const std::uint8_t bc = transpose_b ? b.codes[static_cast<std::size_t>(j * P + p)] : b.codes[static_cast<std::size_t>(p * J + j)];
          s += fp8_to_float(a.codes[static_cast<std::size_t>(i * P + p)], Fp8Format::e4m3) * fp8_to_float(bc, Fp8Format::e5m2);
        }
        const float want = s * alpha + static_cast<float>(bias_v[static_cast<std::size_t>(j)]);
        const float have = static_cast<float>(got[static_cast<std::size_t>(i * J + j)]);  // an f32 output: exact
        if (std::memcmp(&want, &have, sizeof want) != 0) ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << "transpose_b " << transpose_b;
  }
}

}  // namespace
}  // namespace ampscope
