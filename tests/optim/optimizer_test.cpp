// tests/optim/optimizer_test.cpp: SGD, Adam and AdamW of core/optim.h (updates, parameter groups,
// zero_grad, per-parameter state, errors, the registry).
//
// Where the expected values come from:
//   * a double-precision reference written in this file from PyTorch's documented update rules
//     (torch.optim docs, _single_tensor_sgd / _single_tensor_adam / _single_tensor_adamw). The optimizer
//     works in f32, so it is compared with a tolerance of 2e-6 * max(1, |value|): each f32 op is off
//     by at most half an ulp (6e-8 relative), a step is about ten ops, three steps compound to well
//     under 1e-6, with margin for the 1/denominator amplification in Adam;
//   * an exact reference, for the claim that results agree with PyTorch's CUDA kernels to the bit:
//     the same rules in f32 (and _Float16) host arithmetic, one expression per PyTorch op, written from
//     the kernels' element lambdas (AddFunctor a + alpha * b, Lerp.h, addcmul a + alpha * (b * c),
//     addcdiv a + alpha * (b / c), division by a scalar as multiplication by its float reciprocal).
//     Tests are built with -ffp-contract=off, so nothing is fused;
//   * error texts: PyTorch's own ValueError messages.
#include "core/optim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "tests/test_support.h"

namespace {

using namespace ampscope;
using namespace ampscope::optim;

using Vec = std::vector<double>;

// The inputs, as f32 values (the references start from exactly what the tensors hold).
Vec as_f32(Vec v) {
  for (double& x : v) x = static_cast<float>(x);
  return v;
}
const Vec kP0 = as_f32({1.0, -2.0, 0.5, 3.0});
const std::vector<Vec> kGrads = {as_f32({0.1, -0.2, 0.3, -0.4}), as_f32({0.5, 0.25, -0.125, 0.0}),
                                 as_f32({-0.3, 0.7, 0.2, 1.5})};

// Many values of varied magnitude (2^-6 .. 4 times [-1, 1)), exact in f32, for the bit-exact tests:
// with a handful of values, a different order of operations can round the same by luck.
Vec pseudo_random(std::size_t n, std::uint64_t seed, double scale) {
  Vec out;
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // Knuth's MMIX LCG
    const double unit = static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    out.push_back(static_cast<float>(scale * std::ldexp(unit, static_cast<int>((x >> 3) % 9) - 6)));
  }
  return out;
}
const Vec kBigP0 = pseudo_random(512, 1, 1.0);
const std::vector<Vec> kBigGrads = {pseudo_random(512, 2, 0.25), pseudo_random(512, 3, 0.25),
                                    pseudo_random(512, 4, 0.25)};

Tensor make_param(const Vec& v, DType dtype = DType::f32) {
  Tensor p = from_values(v, {static_cast<std::int64_t>(v.size())}, {dtype});
  p.requires_grad_();
  return p;
}

void set_grad(Tensor& p, const Vec& g) {
  p.set_grad(from_values(g, {static_cast<std::int64_t>(g.size())}, {p.dtype()}));
}

void expect_close(const Vec& actual, const Vec& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 2e-6 * std::max(1.0, std::fabs(expected[i])))
        << what << ", element " << i << ": actual " << actual[i] << ", reference " << expected[i];
  }
}

// Bit-for-bit equality; on failure prints the first few pairs and the count.
void expect_same(const Vec& actual, const Vec& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const bool same = actual[i] == expected[i] || (std::isnan(actual[i]) && std::isnan(expected[i]));
    if (!same && ++mismatches <= 5) {
      ADD_FAILURE() << what << ", element " << i << ": actual " << actual[i] << ", reference " << expected[i]
                    << " (difference " << actual[i] - expected[i] << ")";
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": elements that differ from the reference, of " << actual.size();
}

// ---- double references ----

struct SgdRef {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
};

Vec sgd_reference(Vec p, const std::vector<Vec>& grads, const SgdRef& o) {
  Vec buf(p.size());
  for (std::size_t t = 0; t < grads.size(); ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grads[t][i] : grads[t][i];
      g += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = t == 0 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
  }
  return p;
}

struct AdamRef {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false, amsgrad = false, maximize = false;
};

struct AdamResult {
  Vec p, m, v;
};

AdamResult adam_reference(Vec p, const std::vector<Vec>& grads, const AdamRef& o) {
  Vec m(p.size()), v(p.size()), vmax(p.size());
  for (std::size_t t = 0; t < grads.size(); ++t) {
    const double step = static_cast<double>(t + 1);
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grads[t][i] : grads[t][i];
      if (o.decoupled) {
        p[i] *= 1 - o.lr * o.weight_decay;
      } else {
        g += o.weight_decay * p[i];
      }
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double m_hat = m[i] / (1 - std::pow(o.beta1, step));
      const double v_hat = (o.amsgrad ? vmax[i] : v[i]) / (1 - std::pow(o.beta2, step));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
  return {p, m, v};
}

// ---- exact references: PyTorch's kernels, element by element, in the storage type T ----

template <class T>
T add_alpha_k(T a, T b, double alpha) {  // AddFunctor: a + alpha * b in float
  return static_cast<T>(static_cast<float>(a) + static_cast<float>(alpha) * static_cast<float>(b));
}
template <class T>
T mul_k(T a, double s) {
  return static_cast<T>(static_cast<float>(a) * static_cast<float>(s));
}
template <class T>
T lerp_k(T a, T b, double w) {  // ATen Lerp.h
  const float fa = static_cast<float>(a), fb = static_cast<float>(b), fw = static_cast<float>(w);
  return static_cast<T>(std::fabs(fw) < 0.5f ? fa + fw * (fb - fa) : fb - (fb - fa) * (1.0f - fw));
}
template <class T>
T addcmul_k(T a, T b, T c, double value) {
  return static_cast<T>(static_cast<float>(a) +
                        static_cast<float>(value) * (static_cast<float>(b) * static_cast<float>(c)));
}
template <class T>
T addcdiv_k(T a, T b, T c, double value) {
  return static_cast<T>(static_cast<float>(a) +
                        static_cast<float>(value) * (static_cast<float>(b) / static_cast<float>(c)));
}

// _single_tensor_adam(w), op by op, with every tensor stored in T.
template <class T>
Vec adam_exact(const Vec& p0, const std::vector<Vec>& grads, const AdamRef& o) {
  std::vector<T> p(p0.size()), m(p0.size(), T(0)), v(p0.size(), T(0));
  for (std::size_t i = 0; i < p0.size(); ++i) p[i] = static_cast<T>(static_cast<float>(p0[i]));
  for (std::size_t t = 0; t < grads.size(); ++t) {
    const double step = static_cast<double>(t + 1);
    const double bias_correction1 = 1 - std::pow(o.beta1, step);
    const double bias_correction2 = 1 - std::pow(o.beta2, step);
    const double step_size = o.lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    const float inv_bc2_sqrt = 1.0f / static_cast<float>(bias_correction2_sqrt);
    for (std::size_t i = 0; i < p.size(); ++i) {
      T g = static_cast<T>(static_cast<float>(grads[t][i]));
      if (o.decoupled) {
        p[i] = mul_k(p[i], 1 - o.lr * o.weight_decay);
      } else if (o.weight_decay != 0) {
        g = add_alpha_k(g, p[i], o.weight_decay);
      }
      m[i] = lerp_k(m[i], g, 1 - o.beta1);
      v[i] = addcmul_k(mul_k(v[i], o.beta2), g, g, 1 - o.beta2);
      const T root = static_cast<T>(std::sqrt(static_cast<float>(v[i])));
      const T scaled = static_cast<T>(static_cast<float>(root) * inv_bc2_sqrt);
      const T denom = static_cast<T>(static_cast<float>(scaled) + static_cast<float>(o.eps));
      p[i] = addcdiv_k(p[i], m[i], denom, -step_size);
    }
  }
  Vec out;
  for (T x : p) out.push_back(static_cast<double>(x));
  return out;
}

// _single_tensor_sgd with momentum, op by op, with every tensor stored in T.
template <class T>
Vec sgd_momentum_exact(const Vec& p0, const std::vector<Vec>& grads, const SgdRef& o) {
  std::vector<T> p, buf(p0.size());
  for (double x : p0) p.push_back(static_cast<T>(static_cast<float>(x)));
  for (std::size_t t = 0; t < grads.size(); ++t) {
    for (std::size_t i = 0; i < p.size(); ++i) {
      T g = static_cast<T>(static_cast<float>(grads[t][i]));
      if (o.weight_decay != 0) g = add_alpha_k(g, p[i], o.weight_decay);
      buf[i] = t == 0 ? g : add_alpha_k(mul_k(buf[i], o.momentum), g, 1 - o.dampening);
      g = o.nesterov ? add_alpha_k(g, buf[i], o.momentum) : buf[i];
      p[i] = add_alpha_k(p[i], g, -o.lr);
    }
  }
  Vec out;
  for (T x : p) out.push_back(static_cast<double>(x));
  return out;
}

// Runs three steps of `opt` on `p`, setting the fixed gradients before each.
void run_steps(Optimizer& opt, Tensor& p, const std::vector<Vec>& grads = kGrads) {
  for (const Vec& g : grads) {
    set_grad(p, g);
    opt.step();
  }
}

// ---- SGD ----

TEST(sgd_test, takes_plain_gradient_steps) {
  Tensor p = make_param(kP0);
  SGD opt({p}, {.lr = 0.1});
  run_steps(opt, p);
  expect_close(p.values(), sgd_reference(kP0, kGrads, {.lr = 0.1}), "plain SGD");
  EXPECT_EQ(opt.find_state(p)->momentum_buffer.defined(), false);  // no momentum, no buffer
}

TEST(sgd_test, applies_momentum_dampening_and_weight_decay_as_pytorch) {
  const SgdRef ref{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  const OptimizerOptions options{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  Tensor p = make_param(kP0);
  SGD opt({p}, options);
  run_steps(opt, p);
  expect_close(p.values(), sgd_reference(kP0, kGrads, ref), "SGD momentum");
  Tensor big = make_param(kBigP0);
  SGD big_opt({big}, options);
  run_steps(big_opt, big, kBigGrads);
  expect_same(big.values(), sgd_momentum_exact<float>(kBigP0, kBigGrads, ref), "SGD momentum, bit-exact f32");
}

TEST(sgd_test, applies_nesterov_momentum_as_pytorch) {
  const SgdRef ref{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  const OptimizerOptions options{.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01};
  Tensor p = make_param(kP0);
  SGD opt({p}, options);
  run_steps(opt, p);
  expect_close(p.values(), sgd_reference(kP0, kGrads, ref), "SGD nesterov");
  Tensor big = make_param(kBigP0);
  SGD big_opt({big}, options);
  run_steps(big_opt, big, kBigGrads);
  expect_same(big.values(), sgd_momentum_exact<float>(kBigP0, kBigGrads, ref), "SGD nesterov, bit-exact f32");
}

TEST(sgd_test, updates_f16_parameters_rounding_once_per_pytorch_op) {
  const SgdRef ref{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
  Tensor p = make_param(kBigP0, DType::f16);
  SGD opt({p}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  run_steps(opt, p, kBigGrads);
  EXPECT_EQ(opt.state(p).momentum_buffer.dtype(), DType::f16);
  expect_same(p.values(), sgd_momentum_exact<_Float16>(kBigP0, kBigGrads, ref), "SGD f16");
}

TEST(sgd_test, maximize_ascends_the_gradient) {
  Tensor p = make_param(kP0);
  SGD opt({p}, {.lr = 0.1, .momentum = 0.5, .maximize = true});
  run_steps(opt, p);
  expect_close(p.values(), sgd_reference(kP0, kGrads, {.lr = 0.1, .momentum = 0.5, .maximize = true}),
               "SGD maximize");
}

TEST(sgd_test, uses_pytorch_defaults) {
  Tensor p = make_param(kP0);
  SGD opt({p});
  const Hyperparameters& h = opt.param_groups()[0].options;
  EXPECT_EQ(h.lr, 1e-3);
  EXPECT_EQ(h.momentum, 0.0);
  EXPECT_EQ(h.dampening, 0.0);
  EXPECT_EQ(h.weight_decay, 0.0);
  EXPECT_FALSE(h.nesterov);
  EXPECT_FALSE(h.maximize);
  run_steps(opt, p);
  expect_close(p.values(), sgd_reference(kP0, kGrads, {}), "SGD defaults");
}

TEST(sgd_test, momentum_buffer_is_a_copy_not_the_gradient_itself) {
  Tensor p = make_param(kP0);
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, kGrads[0]);
  opt.step();
  const Tensor buf = opt.state(p).momentum_buffer;
  ASSERT_TRUE(buf.defined());
  EXPECT_FALSE(buf.shares_storage_with(p.grad()));
  p.grad().fill_(100.0);  // must not leak into the buffer
  expect_same(buf.values(), kGrads[0], "momentum buffer after step 1");
}

// ---- Adam, AdamW ----

TEST(adam_test, matches_the_adam_update_rule) {
  const AdamRef ref{.lr = 0.01};
  Tensor p = make_param(kP0);
  Adam opt({p}, {.lr = 0.01});
  run_steps(opt, p);
  const AdamResult r = adam_reference(kP0, kGrads, ref);
  expect_close(p.values(), r.p, "Adam parameter");
  const ParamState& s = opt.state(p);
  EXPECT_EQ(s.step, 3);
  expect_close(s.exp_avg.values(), r.m, "Adam exp_avg");
  expect_close(s.exp_avg_sq.values(), r.v, "Adam exp_avg_sq");
  EXPECT_EQ(s.exp_avg.dtype(), DType::f32);
}

TEST(adam_test, agrees_with_pytorch_kernels_to_the_bit_in_f32) {
  for (const AdamRef& ref : {AdamRef{.lr = 0.01}, AdamRef{.lr = 0.01, .beta1 = 0.5, .beta2 = 0.9, .weight_decay = 0.1},
                             AdamRef{.lr = 0.003, .beta1 = 0.2, .eps = 1e-3}}) {
    Tensor p = make_param(kBigP0);
    Adam opt({p}, {.lr = ref.lr, .betas = {{ref.beta1, ref.beta2}}, .eps = ref.eps, .weight_decay = ref.weight_decay});
    run_steps(opt, p, kBigGrads);
    // beta1 = 0.5 takes lerp's second form (weight 1 - beta1 = 0.5 is not < 0.5).
    expect_same(p.values(), adam_exact<float>(kBigP0, kBigGrads, ref), "Adam f32, beta1 " + std::to_string(ref.beta1));
  }
}

TEST(adam_test, updates_f16_parameters_rounding_once_per_pytorch_op) {
  const AdamRef ref{.lr = 0.01, .weight_decay = 0.1};
  Tensor p = make_param(kP0, DType::f16);
  Adam opt({p}, {.lr = 0.01, .weight_decay = 0.1});
  Tensor handle = p;  // the same tensor object, as a model would hold it
  run_steps(opt, p);
  EXPECT_EQ(handle.dtype(), DType::f16);
  EXPECT_EQ(opt.state(p).exp_avg.dtype(), DType::f16);
  expect_same(handle.values(), adam_exact<_Float16>(kP0, kGrads, ref), "Adam f16");
  Tensor big = make_param(kBigP0, DType::f16);
  Adam big_opt({big}, {.lr = 0.01, .weight_decay = 0.1});
  run_steps(big_opt, big, kBigGrads);
  expect_same(big.values(), adam_exact<_Float16>(kBigP0, kBigGrads, ref), "Adam f16, many values");
  // And still the Adam rule, to f16 precision (2^-11 relative per rounding).
  const Vec r = adam_reference(kP0, kGrads, ref).p;
  for (std::size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(handle.values()[i], r[i], 4e-3 * std::fabs(r[i]));
}

TEST(adam_test, amsgrad_divides_by_the_running_maximum) {
  // Gradients that shrink make v fall after its peak, so the maximum and v differ.
  const std::vector<Vec> grads = {as_f32({2.0, -1.0, 0.5, 0.0}), as_f32({0.1, 0.1, 0.1, 0.1}),
                                  as_f32({0.01, -0.02, 0.03, 0.0})};
  Tensor p = make_param(kP0);
  Adam opt({p}, {.lr = 0.1, .betas = {{0.5, 0.6}}, .amsgrad = true});
  run_steps(opt, p, grads);
  expect_close(p.values(), adam_reference(kP0, grads, {.lr = 0.1, .beta1 = 0.5, .beta2 = 0.6, .amsgrad = true}).p,
               "Adam amsgrad");
  const Vec plain = adam_reference(kP0, grads, {.lr = 0.1, .beta1 = 0.5, .beta2 = 0.6}).p;
  EXPECT_GT(std::fabs(plain[0] - p.values()[0]), 1e-3);  // the variant made a difference
}

TEST(adam_test, maximize_ascends_the_gradient) {
  Tensor p = make_param(kP0);
  Adam opt({p}, {.lr = 0.01, .maximize = true});
  run_steps(opt, p);
  expect_close(p.values(), adam_reference(kP0, kGrads, {.lr = 0.01, .maximize = true}).p, "Adam maximize");
}

TEST(adamw_test, decays_weights_before_the_adam_step) {
  const AdamRef ref{.lr = 0.01, .weight_decay = 0.1, .decoupled = true};
  Tensor p = make_param(kP0);
  AdamW opt({p}, {.lr = 0.01, .weight_decay = 0.1});
  run_steps(opt, p);
  expect_close(p.values(), adam_reference(kP0, kGrads, ref).p, "AdamW");
  Tensor big = make_param(kBigP0);
  AdamW big_opt({big}, {.lr = 0.01, .weight_decay = 0.1});
  run_steps(big_opt, big, kBigGrads);
  expect_same(big.values(), adam_exact<float>(kBigP0, kBigGrads, ref), "AdamW, bit-exact f32");
  EXPECT_EQ(opt.name(), "AdamW");
}

TEST(adamw_test, defaults_to_weight_decay_one_hundredth) {
  Tensor p = make_param(kP0);
  AdamW opt({p});
  EXPECT_EQ(opt.param_groups()[0].options.weight_decay, 1e-2);
  EXPECT_EQ(opt.param_groups()[0].options.lr, 1e-3);
  EXPECT_EQ(opt.param_groups()[0].options.betas[0], 0.9);
  EXPECT_EQ(opt.param_groups()[0].options.betas[1], 0.999);
  EXPECT_EQ(opt.param_groups()[0].options.eps, 1e-8);
  run_steps(opt, p);
  expect_close(p.values(), adam_reference(kP0, kGrads, {.weight_decay = 1e-2, .decoupled = true}).p, "AdamW defaults");
  Tensor q = make_param(kP0);
  Adam adam({q});
  EXPECT_EQ(adam.param_groups()[0].options.weight_decay, 0.0);
}

// ---- groups, skipping, zero_grad, state ----

TEST(optimizer_test, parameter_groups_use_their_own_learning_rates) {
  Tensor a = make_param(kP0), b = make_param(kP0), c = make_param(kP0);
  SGD opt({{.params = {a}, .options = {.lr = 0.1}}, {.params = {b}, .options = {.lr = 0.01}}, {.params = {c}}},
          {.lr = 0.5, .momentum = 0.9});
  ASSERT_EQ(opt.param_groups().size(), 3u);
  EXPECT_EQ(opt.param_groups()[2].options.lr, 0.5);        // not overridden: the optimizer's value
  EXPECT_EQ(opt.param_groups()[1].options.momentum, 0.9);  // inherited
  for (int t = 0; t < 3; ++t) {
    set_grad(a, kGrads[t]);
    set_grad(b, kGrads[t]);
    set_grad(c, kGrads[t]);
    opt.step();
  }
  expect_close(a.values(), sgd_reference(kP0, kGrads, {.lr = 0.1, .momentum = 0.9}), "group 0");
  expect_close(b.values(), sgd_reference(kP0, kGrads, {.lr = 0.01, .momentum = 0.9}), "group 1");
  expect_close(c.values(), sgd_reference(kP0, kGrads, {.lr = 0.5, .momentum = 0.9}), "group 2");
}

TEST(optimizer_test, changing_a_groups_lr_takes_effect_at_the_next_step) {
  Tensor p = make_param(kP0);
  SGD opt({p}, {.lr = 0.1});
  set_grad(p, kGrads[0]);
  opt.step();
  opt.param_groups()[0].options.lr = 0.01;
  set_grad(p, kGrads[1]);
  opt.step();
  Vec ref = kP0;
  for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = ref[i] - 0.1 * kGrads[0][i] - 0.01 * kGrads[1][i];
  expect_close(p.values(), ref, "lr changed between steps");
}

TEST(optimizer_test, skips_parameters_without_a_gradient) {
  Tensor a = make_param(kP0), b = make_param(kP0);
  Adam opt({a, b}, {.lr = 0.1});
  set_grad(a, kGrads[0]);
  opt.step();
  expect_same(b.values(), kP0, "b had no gradient");
  EXPECT_EQ(opt.find_state(b), nullptr);
  ASSERT_NE(opt.find_state(a), nullptr);
  EXPECT_EQ(opt.find_state(a)->step, 1);
}

TEST(optimizer_test, zero_grad_clears_or_zeroes_gradients) {
  Tensor a = make_param(kP0), b = make_param(kP0);
  SGD opt({a, b});
  set_grad(a, kGrads[0]);
  set_grad(b, kGrads[1]);
  const Tensor b_grad = b.grad();
  opt.zero_grad(/*set_to_none=*/false);
  expect_same(a.grad().values(), {0, 0, 0, 0}, "a.grad zeroed");
  EXPECT_EQ(b.grad().id(), b_grad.id());  // zeroed in place, the same gradient tensor
  expect_same(b_grad.values(), {0, 0, 0, 0}, "b.grad zeroed");
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(optimizer_test, updates_the_parameter_in_place_keeping_its_name_and_grad) {
  Tensor p = make_param(kP0);
  p.set_name("layer.weight");
  Tensor model_view = p;  // another handle to the same tensor
  SGD opt({p}, {.lr = 0.1});
  set_grad(p, kGrads[0]);
  opt.step();
  EXPECT_EQ(model_view.name(), "layer.weight");
  EXPECT_TRUE(model_view.grad().defined());
  EXPECT_TRUE(model_view.is_leaf());
  EXPECT_TRUE(model_view.requires_grad());
  expect_close(model_view.values(), sgd_reference(kP0, {kGrads[0]}, {.lr = 0.1}), "through another handle");
}

TEST(optimizer_test, continues_from_state_written_back_as_from_a_checkpoint) {
  // A runs three steps; B runs two, its state is copied into a fresh C (as a checkpoint would), and C
  // takes the third. C must land exactly where A did.
  Tensor pa = make_param(kP0), pb = make_param(kP0);
  Adam a({pa}, {.lr = 0.01});
  Adam b({pb}, {.lr = 0.01});
  run_steps(a, pa);
  run_steps(b, pb, {kGrads[0], kGrads[1]});

  Tensor pc = make_param(kP0);
  {
    NoGradGuard no_grad;
    pc.copy_(pb);
  }
  Adam c({pc}, {.lr = 0.01});
  const ParamState& saved = b.state(pb);
  ParamState& restored = c.state(pc);
  restored.exp_avg = saved.exp_avg.clone();
  restored.exp_avg_sq = saved.exp_avg_sq.clone();
  restored.step = saved.step;
  set_grad(pc, kGrads[2]);
  c.step();
  expect_same(pc.values(), pa.values(), "resumed Adam");
  EXPECT_EQ(restored.step, 3);
}

TEST(optimizer_test, add_param_group_adds_a_group_with_its_options) {
  Tensor a = make_param(kP0), b = make_param(kP0);
  SGD opt({a}, {.lr = 0.1});
  opt.add_param_group({.params = {b}, .options = {.lr = 0.2}});
  ASSERT_EQ(opt.param_groups().size(), 2u);
  set_grad(b, kGrads[0]);
  opt.step();
  expect_close(b.values(), sgd_reference(kP0, {kGrads[0]}, {.lr = 0.2}), "added group");
  EXPECT_THROW_MSG(opt.add_param_group({.params = {a}}), Error, "more than one parameter group");
}

// ---- errors ----

TEST(optimizer_errors_test, non_leaf_parameter_is_named_with_a_hint) {
  Tensor w = make_param(kP0);
  Tensor scaled = mul(w, 2.0);
  scaled.set_name("encoder.scale");
  EXPECT_THROW_MSG(SGD({w, scaled}), Error, "SGD", "non-leaf", "'encoder.scale'", "'mul'", "hint:");
  Tensor unnamed = mul(w, 3.0);
  EXPECT_THROW_MSG(Adam({{.params = {w}}, {.params = {make_param(kP0), unnamed}}}), Error, "Adam",
                   "parameter #1 of group 1", "non-leaf");
}

TEST(optimizer_errors_test, parameter_that_does_not_require_grad_is_named_with_a_hint) {
  Tensor frozen = from_values(kP0, {4});
  frozen.set_name("embedding.weight");
  EXPECT_THROW_MSG(SGD({frozen}), Error, "'embedding.weight'", "does not require grad", "hint: call requires_grad_()");
}

TEST(optimizer_errors_test, the_same_tensor_twice_is_refused) {
  Tensor w = make_param(kP0);
  w.set_name("w");
  EXPECT_THROW_MSG(SGD({w, w}), Error, "'w'", "twice", "group 0");
  EXPECT_THROW_MSG(SGD({{.params = {w}}, {.params = {w}}}), Error,
                   "some parameters appear in more than one parameter group", "'w'");
}

TEST(optimizer_errors_test, an_empty_parameter_list_is_refused) {
  EXPECT_THROW_MSG(SGD(std::vector<Tensor>{}), Error, "optimizer got an empty parameter list");
  EXPECT_THROW_MSG(AdamW(std::vector<ParamGroupSpec>{}), Error, "optimizer got an empty parameter list");
}

TEST(optimizer_errors_test, invalid_hyper_parameters_give_pytorchs_messages) {
  Tensor w = make_param(kP0);
  EXPECT_THROW_MSG(SGD({w}, {.lr = -0.1}), Error, "Invalid learning rate: -0.1");
  EXPECT_THROW_MSG(SGD({w}, {.momentum = -0.5}), Error, "Invalid momentum value: -0.5");
  EXPECT_THROW_MSG(SGD({w}, {.weight_decay = -1.0}), Error, "Invalid weight_decay value: -1.0");
  EXPECT_THROW_MSG(SGD({w}, {.nesterov = true}), Error, "Nesterov momentum requires a momentum and zero dampening");
  EXPECT_THROW_MSG(SGD({w}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error,
                   "Nesterov momentum requires a momentum and zero dampening");
  EXPECT_THROW_MSG(Adam({w}, {.lr = -1e-05}), Error, "Invalid learning rate: -1e-05");
  EXPECT_THROW_MSG(Adam({w}, {.betas = {{1.0, 0.999}}}), Error, "Invalid beta parameter at index 0: 1.0");
  EXPECT_THROW_MSG(Adam({w}, {.betas = {{0.9, -0.1}}}), Error, "Invalid beta parameter at index 1: -0.1");
  EXPECT_THROW_MSG(AdamW({w}, {.eps = -1e-8}), Error, "AdamW", "Invalid epsilon value: -1e-08");
  EXPECT_THROW_MSG(AdamW({w}, {.weight_decay = -0.01}), Error, "Invalid weight_decay value: -0.01");
}

TEST(optimizer_errors_test, an_invalid_group_value_names_the_group) {
  Tensor a = make_param(kP0), b = make_param(kP0);
  EXPECT_THROW_MSG(SGD({{.params = {a}}, {.params = {b}, .options = {.lr = -1.0}}}), Error,
                   "Invalid learning rate: -1.0 (parameter group 1)");
}

TEST(optimizer_errors_test, an_option_the_optimizer_lacks_is_refused_with_the_list) {
  Tensor w = make_param(kP0);
  EXPECT_THROW_MSG(SGD({w}, {.betas = {{0.9, 0.99}}}), Error, "'betas'",
                   "lr, momentum, dampening, weight_decay, nesterov, maximize");
  EXPECT_THROW_MSG(Adam({{.params = {w}, .options = {.momentum = 0.9}}}), Error, "'momentum' (parameter group 0)",
                   "lr, betas, eps, weight_decay, amsgrad, maximize");
}

TEST(optimizer_errors_test, state_of_a_foreign_tensor_is_refused) {
  Tensor w = make_param(kP0), other = make_param(kP0);
  other.set_name("other");
  SGD opt({w});
  EXPECT_THROW_MSG(opt.state(other), Error, "'other' is not one of this optimizer's parameters");
}

// ---- registry ----

TEST(optimizer_registry_test, creates_optimizers_by_name_with_their_defaults) {
  Tensor w = make_param(kP0);
  const auto sgd = make_optimizer("sgd", {w}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_EQ(sgd->name(), "SGD");
  EXPECT_EQ(sgd->param_groups()[0].options.momentum, 0.9);
  Tensor v = make_param(kP0);
  const auto adamw = make_optimizer("adamw", {v});
  EXPECT_EQ(adamw->name(), "AdamW");
  EXPECT_EQ(adamw->param_groups()[0].options.weight_decay, 1e-2);
  run_steps(*adamw, v);
  expect_close(v.values(), adam_reference(kP0, kGrads, {.weight_decay = 1e-2, .decoupled = true}).p, "registry AdamW");
  EXPECT_EQ(optimizer_registry().names(), (std::vector<std::string>{"adam", "adamw", "sgd"}));
}

TEST(optimizer_registry_test, unknown_and_duplicate_names_are_refused) {
  Tensor w = make_param(kP0);
  EXPECT_THROW_MSG(make_optimizer("lion", {w}), Error, "unknown optimizer 'lion'", "adam, adamw, sgd");
  OptimizerRegistry registry;
  registry.add("sgd", [](std::vector<ParamGroupSpec> g, const OptimizerOptions& o) {
    return std::make_unique<SGD>(std::move(g), o);
  });
  EXPECT_THROW_MSG(registry.add("sgd", nullptr), Error, "'sgd' is already registered");
  EXPECT_TRUE(registry.contains("sgd"));
  EXPECT_FALSE(registry.contains("adam"));
}

// ---- GPU ----

TEST(optimizer_cuda_test, adam_on_the_gpu_matches_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::f16}) {
    Tensor cpu = make_param(kP0, dtype);
    Tensor gpu = from_values(kP0, {4}, {dtype, Device::cuda()});
    gpu.requires_grad_();
    AdamW a({cpu}, {.lr = 0.01, .amsgrad = true});
    AdamW b({gpu}, {.lr = 0.01, .amsgrad = true});
    for (const Vec& g : kGrads) {
      set_grad(cpu, g);
      gpu.set_grad(from_values(g, {4}, {dtype, Device::cuda()}));
      a.step();
      b.step();
    }
    expect_same(gpu.values(), cpu.values(), std::string("AdamW on cuda, ") + std::string(dtype_name(dtype)));
  }
}

}  // namespace
