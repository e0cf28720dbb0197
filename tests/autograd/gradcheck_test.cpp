// tests/autograd/gradcheck_test.cpp: one harness that checks the backward of every differentiable op in
// core/ops.h (and the differentiable Tensor views and casts) in every dtype and on every backend.
//
// A case is a row of the table in all_cases(): a name, its inputs (shape, how the values are made,
// whether the input wants a gradient, integer/bool auxiliaries such as targets and masks) and a lambda
// that builds the op's output from them. Each case is reduced to a scalar the same way,
// L = sum(out * w) with a fixed pseudo-random weighting w (multiples of 1/16 in [-1, 1], exact in every
// dtype, so that every output element matters with a different weight), and checked three ways:
//
//   1. f64: the analytic gradient (L.backward()) against central finite differences of L in f64. This is
//      the independent reference: it only uses forward passes.
//   2. f32, f16, bf16: the same forward and backward in the lower dtype must give a gradient of the
//      input's dtype that agrees with the f64 analytic gradient (checked by 1) within a tolerance per
//      dtype, scaled to the gradient's magnitude.
//   3. CUDA (when a GPU is present): every dtype's gradients on Device::cuda() against the CPU's. Another
//      backend gets the whole table from one more check like it; no case changes.
//
// Each (check, case) pair is its own ctest entry: ops/gradcheck_test.f64_matches_finite_differences/
// conv2d_stride2_pad1_bias. Inputs stay away from kinks (relu at 0, clamp bounds, max-pool ties) so the
// finite differences see a differentiable function.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using Inputs = std::vector<Tensor>;
using Values = std::vector<std::vector<double>>;  // one row-major list per input
using Build = std::function<Tensor(const Inputs&)>;

// ---- deterministic input values ------------------------------------------------------------------

// splitmix64: the case's values come from its name, so adding a case never changes another one's inputs,
// and nothing here depends on the library's own random stream.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next_u64() >> 11) * 0x1p-53; }

 private:
  std::uint64_t state_;
};

std::uint64_t hash_name(const std::string& s) {  // FNV-1a
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

enum class Kind { floating, index, mask };

struct InputSpec {
  Shape shape;
  Kind kind = Kind::floating;
  bool requires_grad = true;  // floating inputs only
  std::function<std::vector<double>(std::int64_t n, Rng& rng)> make;
};

std::int64_t count(const Shape& s) {
  std::int64_t n = 1;
  for (std::int64_t d : s) n *= d;
  return n;
}

// Uniform in [lo, hi).
InputSpec uniform(Shape shape, double lo = -2.0, double hi = 2.0) {
  return {std::move(shape), Kind::floating, true, [lo, hi](std::int64_t n, Rng& rng) {
            std::vector<double> v(n);
            for (double& x : v) x = rng.uniform(lo, hi);
            return v;
          }};
}

// Uniform in [lo, hi) but at least `margin` from every kink, so that x +- h never crosses one (and the
// lower dtypes' rounding never moves a value across one either).
InputSpec away_from(Shape shape, double lo, double hi, std::vector<double> kinks, double margin) {
  return {std::move(shape), Kind::floating, true, [=](std::int64_t n, Rng& rng) {
            std::vector<double> v(n);
            for (double& x : v) {
              do {
                x = rng.uniform(lo, hi);
              } while (std::any_of(kinks.begin(), kinks.end(), [&](double k) { return std::fabs(x - k) < margin; }));
            }
            return v;
          }};
}

// n distinct values evenly spaced over [lo, hi], shuffled: every max is unique with a gap of (hi - lo) / n
// to the runner-up, far above the finite-difference step and bf16's spacing at these magnitudes.
InputSpec distinct(Shape shape, double lo = -2.0, double hi = 2.0) {
  return {std::move(shape), Kind::floating, true, [lo, hi](std::int64_t n, Rng& rng) {
            std::vector<double> v(n);
            for (std::int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * (static_cast<double>(i) + 0.5) / n;
            for (std::int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.next_u64() % (i + 1)]);
            return v;
          }};
}

// Random multiples of `step` in [lo, hi]: exact in every dtype when step is a power of two.
InputSpec grid(Shape shape, double lo, double hi, double step) {
  return {std::move(shape), Kind::floating, true, [=](std::int64_t n, Rng& rng) {
            std::vector<double> v(n);
            const auto k = static_cast<std::int64_t>((hi - lo) / step);
            for (double& x : v) x = lo + step * static_cast<double>(rng.next_u64() % (k + 1));
            return v;
          }};
}

// Distinct values (as `distinct`), then the largest copied onto one other element and the smallest onto
// another: the full max and min each have exactly two ties. With two ties the central difference at a
// tied element is exactly 1/2 (x + h raises the max, x - h leaves the twin in charge), which is
// PyTorch's even share g / 2; with three it would be 1/2 against 1/3, so two it is.
InputSpec two_tied_extremes(Shape shape) {
  return {std::move(shape), Kind::floating, true, [](std::int64_t n, Rng& rng) {
            std::vector<double> v(n);
            for (std::int64_t i = 0; i < n; ++i) v[i] = -2.0 + 4.0 * (static_cast<double>(i) + 0.5) / n;
            for (std::int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.next_u64() % (i + 1)]);
            const auto hi = std::max_element(v.begin(), v.end()) - v.begin();
            const auto lo = std::min_element(v.begin(), v.end()) - v.begin();
            std::int64_t twin_hi = 0, twin_lo = 0;
            while (twin_hi == hi || twin_hi == lo) ++twin_hi;
            while (twin_lo == hi || twin_lo == lo || twin_lo == twin_hi) ++twin_lo;
            v[twin_hi] = v[hi];
            v[twin_lo] = v[lo];
            return v;
          }};
}

// A floating input that takes part without a gradient (a target, a constant operand).
InputSpec constant(InputSpec spec) {
  spec.requires_grad = false;
  return spec;
}

InputSpec indices(Shape shape, std::vector<double> v) {
  return {std::move(shape), Kind::index, false, [v](std::int64_t, Rng&) { return v; }};
}

InputSpec mask(Shape shape, std::vector<double> v) {
  return {std::move(shape), Kind::mask, false, [v](std::int64_t, Rng&) { return v; }};
}

// ---- the case type ----------------------------------------------------------------------------------

struct GradCase {
  std::string name;
  std::vector<InputSpec> inputs;
  Build build;
  // Absolute finite-difference step; 0 means kRelativeStep * max(1, |x|).
  double step = 0.0;
  // Lower dtypes in which comparing with f64 says nothing for this case, and why.
  std::vector<DType> skip_dtypes;
  std::string skip_reason;

  bool skips(DType t) const { return std::find(skip_dtypes.begin(), skip_dtypes.end(), t) != skip_dtypes.end(); }
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

Values initial_values(const GradCase& c) {
  Rng rng(hash_name(c.name));
  Values v;
  for (const InputSpec& s : c.inputs) {
    v.push_back(s.make(count(s.shape), rng));
    if (static_cast<std::int64_t>(v.back().size()) != count(s.shape)) {
      throw Error("gradcheck case '" + c.name + "': an input of shape " + shape_str(s.shape) + " got " +
                  std::to_string(v.back().size()) + " values");
    }
  }
  return v;
}

// The weighting of L = sum(out * w): k / 16 with k in [-16, 16] \ {0}, exact in f16 and bf16 as well.
std::vector<double> weights(const GradCase& c, std::int64_t n) {
  Rng rng(hash_name(c.name) ^ 0x5bd1e995ull);
  std::vector<double> w(n);
  for (double& x : w) {
    const auto k = static_cast<std::int64_t>(rng.next_u64() % 32);
    x = static_cast<double>(k < 16 ? k - 16 : k - 15) / 16.0;
  }
  return w;
}

Inputs materialise(const GradCase& c, const Values& v, DType dtype, Device device, bool track) {
  Inputs in;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const InputSpec& s = c.inputs[i];
    const DType t = s.kind == Kind::index ? DType::i64 : s.kind == Kind::mask ? DType::boolean : dtype;
    Tensor x = from_values(v[i], s.shape, {t, device});
    if (track && s.kind == Kind::floating && s.requires_grad) x.requires_grad_();
    in.push_back(x);
  }
  return in;
}

// The floating inputs as the lower dtype stores them (f64 -> f32 -> f16/bf16, as from_values rounds).
Values rounded_values(const GradCase& c, const Values& v, DType dtype) {
  Values r = v;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i].kind == Kind::floating) r[i] = from_values(v[i], c.inputs[i].shape, {dtype}).values();
  }
  return r;
}

Tensor weighted_sum(const GradCase& c, const Tensor& out) {
  const Tensor w = from_values(weights(c, out.numel()), out.shape(), {out.dtype(), out.device()});
  return sum(mul(out, w));
}

// d L / d input for every input that wants a gradient (undefined for the others), as backward() left
// them in .grad: same dtype and device as the input.
std::vector<Tensor> analytic_gradients(const GradCase& c, const Values& v, DType dtype, Device device) {
  const Inputs in = materialise(c, v, dtype, device, true);
  weighted_sum(c, c.build(in)).backward();
  std::vector<Tensor> grads;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool wants = c.inputs[i].kind == Kind::floating && c.inputs[i].requires_grad;
    if (wants && !in[i].grad().defined()) {
      throw Error("gradcheck case '" + c.name + "': no gradient reached input " + std::to_string(i));
    }
    grads.push_back(wants ? in[i].grad() : Tensor());
  }
  return grads;
}

// Central differences of L in f64. The step is relative to |x| (absolute below 1) so that x + h and
// x - h differ from x in about the same number of significant bits whatever x's magnitude. The
// denominator is the difference of the perturbed values as stored, not 2h, so that the rounding of
// x +- h does not enter the quotient.
constexpr double kRelativeStep = 1e-6;

std::vector<double> numeric_gradient(const GradCase& c, Values v, std::size_t input) {
  NoGradGuard no_grad;
  const auto loss = [&] {
    return weighted_sum(c, c.build(materialise(c, v, DType::f64, Device::cpu(), false))).item();
  };
  std::vector<double> grad(v[input].size());
  for (std::size_t j = 0; j < grad.size(); ++j) {
    const double x = v[input][j];
    const double h = c.step > 0 ? c.step : kRelativeStep * std::max(1.0, std::fabs(x));
    const double xp = x + h, xm = x - h;
    v[input][j] = xp;
    const double lp = loss();
    v[input][j] = xm;
    const double lm = loss();
    v[input][j] = x;
    grad[j] = (lp - lm) / (xp - xm);
  }
  return grad;
}

// ---- comparison with a readable failure ------------------------------------------------------------

struct Tolerance {
  double abs;  // |actual - expected| <= abs + rel * |expected|
  double rel;
  std::string why;
};

// Compares element by element and, on failure, prints the first few (index, actual, expected) pairs
// so that the shape of the error is visible (all wrong by a factor, one row wrong, signs flipped ...).
void expect_close(const std::string& what, const std::vector<double>& actual, const std::vector<double>& expected,
                  const Tolerance& tol, const char* actual_name, const char* expected_name) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  constexpr int kShown = 6;
  int bad = 0;
  std::ostringstream report;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double limit = tol.abs + tol.rel * std::fabs(expected[i]);
    const double diff = std::fabs(actual[i] - expected[i]);
    if (!(diff <= limit)) {  // NaN fails too
      if (bad < kShown) {
        report << "\n  [" << i << "] " << actual_name << " " << actual[i] << ", " << expected_name << " " << expected[i]
               << ", |diff| " << diff << " > " << limit;
      }
      ++bad;
    }
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << actual.size() << " elements differ beyond " << tol.abs << " + "
                  << tol.rel << " |" << expected_name << "| (" << tol.why << ")" << report.str()
                  << (bad > kShown ? "\n  ..." : "");
  }
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

std::string input_label(const GradCase& c, std::size_t i) {
  return c.name + ", gradient of input " + std::to_string(i) + " " + shape_str(c.inputs[i].shape);
}

// ---- tolerances --------------------------------------------------------------------------------------

// f64 analytic vs numeric. The central difference has truncation error h^2 |f'''| / 6 (~1e-12 |f'''| at
// h = 1e-6) and rounding error ~ eps |L| / h (~2e-10 |L|, |L| = O(1..10) here, each op adding a few eps).
// Both are orders of magnitude below 1e-6 + 1e-5 |n|, which still catches any wrong formula (a missing
// factor, a dropped term, a transposed gradient), since those are O(1) relative errors.
const Tolerance kFiniteDifference{1e-6, 1e-5, "f64 central differences: O(h^2) truncation + O(eps/h) rounding"};

// A lower dtype's gradient against the f64 analytic one at the same (rounded) inputs, as an absolute
// bound of (tolerance x the largest |gradient element| of that input): an element much smaller than the
// largest carries the absolute error of the terms it was computed from, so a relative bound per element
// would fail on cancellation (softmax, layer_norm: g - mean(g)) without anything being wrong.
//  * f32: unit roundoff u = 2^-24 ~ 6e-8. Math is done in float and stored in float, so the error is a few
//    u per rounded step; the worst case here (log_softmax, layer_norm, rsqrt) is ~3 u. 1e-5 (~170 u)
//    leaves room for longer sums, and a wrong formula is off by O(1).
//  * f16: every stored tensor (the forward output the backward reads, the incoming and outgoing gradients)
//    is rounded to 11 significant bits, u = 2^-11 ~ 4.9e-4. A gradient goes through two or three such
//    roundings, and rsqrt's y^3 triples the error of its stored output y, so the worst case here is
//    ~2.3 u; accumulations are in float and add nothing visible at this scale. Bound: 4 u ~ 0.2%.
//  * bf16: the same argument with 8 significant bits, u = 2^-8 ~ 3.9e-3; worst case here ~1.9 u.
//    Bound: 4 u ~ 1.6%.
double low_precision_rel(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-5;
    case DType::f16: return 4 * 0x1p-11;
    case DType::bf16: return 4 * 0x1p-8;
    default: return 1e-12;  // f64 against f64 (the device check): only summation order may differ
  }
}

// ---- the case table -----------------------------------------------------------------------------------

std::vector<GradCase> all_cases() {
  std::vector<GradCase> cases;
  auto add_case = [&](std::string name, std::vector<InputSpec> inputs, Build build) -> GradCase& {
    GradCase c;
    c.name = std::move(name);
    c.inputs = std::move(inputs);
    c.build = std::move(build);
    cases.push_back(std::move(c));
    return cases.back();
  };

  // ---- element-wise, tensor forms: broadcasting on either side, so sum_to runs in backward ----
  add_case("add_broadcast", {uniform({2, 3, 4}), uniform({3, 1})}, [](const Inputs& in) { return add(in[0], in[1]); });
  add_case("add_same_shape", {uniform({3, 4}), uniform({3, 4})}, [](const Inputs& in) { return add(in[0], in[1]); });
  add_case("sub_broadcast", {uniform({4}), uniform({3, 4})}, [](const Inputs& in) { return sub(in[0], in[1]); });
  add_case("mul_broadcast", {uniform({2, 1, 4}), uniform({3, 1})}, [](const Inputs& in) { return mul(in[0], in[1]); });
  add_case("mul_with_constant", {uniform({3, 4}), constant(uniform({3, 4}))},
           [](const Inputs& in) { return mul(in[0], in[1]); });
  // The divisor stays at least 0.5 from zero, where 1/b and its derivatives are tame.
  add_case("div_broadcast", {uniform({3, 4}), away_from({1, 4}, -2.0, 2.0, {0.0}, 0.5)},
           [](const Inputs& in) { return div(in[0], in[1]); });

  // ---- element-wise, scalar forms ----
  add_case("add_scalar", {uniform({3, 4})}, [](const Inputs& in) { return add(in[0], 1.5); });
  add_case("sub_scalar", {uniform({3, 4})}, [](const Inputs& in) { return sub(in[0], 0.75); });
  add_case("mul_scalar", {uniform({3, 4})}, [](const Inputs& in) { return mul(in[0], -2.5); });
  add_case("div_scalar", {uniform({3, 4})}, [](const Inputs& in) { return div(in[0], 3.0); });
  // Magnitudes up to 1e5 make |L| ~ 1e6: with a fixed step h = 1e-6 the rounding error of L over 2h
  // (eps |L| / h ~ 1e-4) would exceed the tolerance on gradients of size ~1; the step relative to |x|
  // keeps it near 1e-9. This case is what shows the scaling is needed.
  {
    GradCase& c = add_case("mul_large_magnitudes", {uniform({3, 4}, 1e4, 1e5), uniform({3, 4})},
                           [](const Inputs& in) { return mul(in[0], in[1]); });
    c.skip_dtypes = {DType::f16, DType::bf16};
    c.skip_reason = "inputs up to 1e5 overflow f16 (max 65504) and keep 3 digits in bf16; the case is here for "
                    "the f64 finite-difference step, f32 covers the op's arithmetic";
  }

  // ---- unary ----
  add_case("neg", {uniform({3, 4})}, [](const Inputs& in) { return neg(in[0]); });
  add_case("relu", {away_from({3, 5}, -2.0, 2.0, {0.0}, 0.1)}, [](const Inputs& in) { return relu(in[0]); });
  add_case("gelu_erf", {uniform({3, 5}, -3.0, 3.0)}, [](const Inputs& in) { return gelu(in[0]); });
  add_case("gelu_tanh", {uniform({3, 5}, -3.0, 3.0)},
           [](const Inputs& in) { return gelu(in[0], GeluApproximation::tanh); });
  add_case("sigmoid", {uniform({3, 5}, -4.0, 4.0)}, [](const Inputs& in) { return sigmoid(in[0]); });
  add_case("silu", {uniform({3, 5}, -6.0, 6.0)}, [](const Inputs& in) { return silu(in[0]); });
  add_case("tanh", {uniform({3, 5})}, [](const Inputs& in) { return tanh(in[0]); });
  add_case("exp", {uniform({3, 5})}, [](const Inputs& in) { return exp(in[0]); });
  // log, sqrt, rsqrt and the fractional and negative powers: positive inputs away from 0.
  add_case("log", {uniform({3, 5}, 0.3, 3.0)}, [](const Inputs& in) { return log(in[0]); });
  add_case("sqrt", {uniform({3, 5}, 0.3, 3.0)}, [](const Inputs& in) { return sqrt(in[0]); });
  add_case("rsqrt", {uniform({3, 5}, 0.3, 3.0)}, [](const Inputs& in) { return rsqrt(in[0]); });
  // Integer powers on signed inputs: the derivative's sign must follow x's.
  add_case("pow_2", {uniform({3, 5})}, [](const Inputs& in) { return pow(in[0], 2.0); });
  add_case("pow_3", {uniform({3, 5})}, [](const Inputs& in) { return pow(in[0], 3.0); });
  add_case("pow_0_5", {uniform({3, 5}, 0.3, 3.0)}, [](const Inputs& in) { return pow(in[0], 0.5); });
  add_case("pow_minus_1", {uniform({3, 5}, 0.5, 2.0)}, [](const Inputs& in) { return pow(in[0], -1.0); });
  add_case("pow_1_7", {uniform({3, 5}, 0.3, 3.0)}, [](const Inputs& in) { return pow(in[0], 1.7); });
  // Values on both sides of each bound, none within 0.05 of it.
  add_case("clamp_both_bounds", {away_from({4, 5}, -2.0, 2.0, {-1.0, 1.0}, 0.05)},
           [](const Inputs& in) { return clamp(in[0], -1.0, 1.0); });
  add_case("clamp_lower_bound", {away_from({4, 5}, -2.0, 2.0, {-0.5}, 0.05)},
           [](const Inputs& in) { return clamp(in[0], -0.5, std::nullopt); });
  add_case("clamp_upper_bound", {away_from({4, 5}, -2.0, 2.0, {0.5}, 0.05)},
           [](const Inputs& in) { return clamp(in[0], std::nullopt, 0.5); });

  // ---- selection ----
  add_case("masked_fill_broadcast_mask", {uniform({3, 4}), mask({1, 4}, {1, 0, 0, 1})},
           [](const Inputs& in) { return masked_fill(in[0], in[1], 5.0); });
  add_case("where_broadcast", {mask({3, 4}, {1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0}), uniform({3, 4}), uniform({4})},
           [](const Inputs& in) { return where(in[0], in[1], in[2]); });

  // ---- reductions ----
  add_case("sum_all", {uniform({2, 3, 4})}, [](const Inputs& in) { return sum(in[0]); });
  add_case("sum_over_dims_0_2", {uniform({2, 3, 4})}, [](const Inputs& in) { return sum(in[0], {0, 2}); });
  add_case("sum_last_dim_keepdim", {uniform({2, 3, 4})}, [](const Inputs& in) { return sum(in[0], {-1}, true); });
  add_case("mean_all", {uniform({2, 3, 4})}, [](const Inputs& in) { return mean(in[0]); });
  add_case("mean_over_dim_1_keepdim", {uniform({2, 3, 4})}, [](const Inputs& in) { return mean(in[0], {1}, true); });
  add_case("mean_over_dims_0_2", {uniform({2, 3, 4})}, [](const Inputs& in) { return mean(in[0], {0, 2}); });
  // An explicit dtype (what autocast asks for with f32): in the f32/f16/bf16 runs the output is f64 and the
  // gradient must come back in the input's dtype.
  add_case("sum_with_f64_dtype", {uniform({2, 3, 4})},
           [](const Inputs& in) { return sum(in[0], {1}, false, DType::f64); });
  add_case("softmax_middle_dim", {uniform({2, 3, 4}, -3.0, 3.0)}, [](const Inputs& in) { return softmax(in[0], 1); });
  add_case("softmax_last_dim", {uniform({2, 3, 4}, -3.0, 3.0)}, [](const Inputs& in) { return softmax(in[0], -1); });
  add_case("log_softmax_middle_dim", {uniform({2, 3, 4}, -3.0, 3.0)},
           [](const Inputs& in) { return log_softmax(in[0], 1); });
  add_case("log_softmax_last_dim", {uniform({2, 3, 4}, -3.0, 3.0)},
           [](const Inputs& in) { return log_softmax(in[0], -1); });
  add_case("softmax_with_f64_dtype", {uniform({3, 4}, -3.0, 3.0)},
           [](const Inputs& in) { return softmax(in[0], -1, DType::f64); });
  add_case("log_softmax_with_f64_dtype", {uniform({3, 4}, -3.0, 3.0)},
           [](const Inputs& in) { return log_softmax(in[0], 0, DType::f64); });

  // ---- matrix products ----
  const auto mm = [](const Inputs& in) { return matmul(in[0], in[1]); };
  add_case("matmul_2d", {uniform({3, 4}), uniform({4, 5})}, mm);
  add_case("matmul_batched", {uniform({2, 3, 4}), uniform({2, 4, 5})}, mm);
  add_case("matmul_4d_batched", {uniform({2, 2, 3, 4}), uniform({2, 2, 4, 3})}, mm);
  add_case("matmul_3d_by_2d", {uniform({2, 3, 4}), uniform({4, 5})}, mm);
  add_case("matmul_3d_by_vector", {uniform({2, 3, 4}), uniform({4})}, mm);
  add_case("matmul_vector_dot", {uniform({4}), uniform({4})}, mm);
  add_case("matmul_matrix_vector", {uniform({3, 4}), uniform({4})}, mm);
  add_case("matmul_vector_matrix", {uniform({4}), uniform({4, 5})}, mm);
  add_case("bmm", {uniform({2, 3, 4}), uniform({2, 4, 5})}, [](const Inputs& in) { return bmm(in[0], in[1]); });
  add_case("linear_with_bias", {uniform({3, 4}), uniform({5, 4}), uniform({5})},
           [](const Inputs& in) { return linear(in[0], in[1], in[2]); });
  add_case("linear_without_bias", {uniform({3, 4}), uniform({5, 4})},
           [](const Inputs& in) { return linear(in[0], in[1]); });
  add_case("linear_1d_input", {uniform({4}), uniform({5, 4}), uniform({5})},
           [](const Inputs& in) { return linear(in[0], in[1], in[2]); });
  add_case("linear_3d_input", {uniform({2, 3, 4}), uniform({5, 4}), uniform({5})},
           [](const Inputs& in) { return linear(in[0], in[1], in[2]); });

  // ---- convolution and pooling ----
  add_case("conv2d_stride2_pad1_bias", {uniform({2, 2, 5, 5}), uniform({3, 2, 3, 3}), uniform({3})},
           [](const Inputs& in) { return conv2d(in[0], in[1], in[2], {2, 2, 1, 1}); });
  add_case("conv2d_stride2_pad1_no_bias", {uniform({2, 2, 5, 5}), uniform({3, 2, 3, 3})},
           [](const Inputs& in) { return conv2d(in[0], in[1], Tensor(), {2, 2, 1, 1}); });
  // Different kernel, stride and padding per axis: an H/W mix-up in im2col or col2im shows here.
  add_case("conv2d_rectangular", {uniform({1, 2, 4, 6}), uniform({2, 2, 2, 3}), uniform({2})},
           [](const Inputs& in) { return conv2d(in[0], in[1], in[2], {1, 2, 0, 1}); });
  add_case("max_pool2d_2x2", {distinct({2, 2, 4, 4})}, [](const Inputs& in) { return max_pool2d(in[0]); });
  // Stride below the kernel: windows overlap, so one element can be the max of several windows and its
  // gradient is the sum of theirs.
  add_case("max_pool2d_overlapping_3x3_stride2", {distinct({1, 2, 5, 5})},
           [](const Inputs& in) { return max_pool2d(in[0], {3, 3, 2, 2, 0, 0}); });
  add_case("max_pool2d_overlapping_2x2_stride1", {distinct({1, 1, 4, 4})},
           [](const Inputs& in) { return max_pool2d(in[0], {2, 2, 1, 1, 0, 0}); });
  add_case("max_pool2d_padded", {distinct({1, 1, 5, 5})},
           [](const Inputs& in) { return max_pool2d(in[0], {3, 3, 2, 2, 1, 1}); });

  // ---- normalisation, embedding, dropout, concatenation ----
  add_case("layer_norm_affine", {uniform({3, 5}), uniform({5}, 0.5, 1.5), uniform({5}, -1.0, 1.0)},
           [](const Inputs& in) { return layer_norm(in[0], {5}, in[1], in[2]); });
  add_case("layer_norm_no_affine", {uniform({2, 3, 4})}, [](const Inputs& in) { return layer_norm(in[0], {4}); });
  add_case("layer_norm_over_two_dims", {uniform({2, 3, 4}), uniform({3, 4}, 0.5, 1.5), uniform({3, 4}, -1.0, 1.0)},
           [](const Inputs& in) { return layer_norm(in[0], {3, 4}, in[1], in[2]); });
  // Rows 1 and 3 are picked more than once (their gradients add up), row 2 never (zero gradient).
  add_case("embedding_repeated_indices", {indices({2, 3}, {1, 3, 1, 0, 3, 3}), uniform({4, 3})},
           [](const Inputs& in) { return embedding(in[0], in[1]); });
  // A fresh Generator with the same seed on every evaluation: x + h and x - h see the same mask, so the
  // finite difference differentiates one fixed mask, as backward does.
  add_case("dropout", {uniform({4, 5})}, [](const Inputs& in) {
    Generator gen(1234);
    return dropout(in[0], 0.3, true, gen);
  });
  add_case("cat_dim0", {uniform({2, 3}), uniform({1, 3})}, [](const Inputs& in) { return cat({in[0], in[1]}, 0); });
  add_case("cat_last_dim_with_constant", {uniform({2, 3}), constant(uniform({2, 2})), uniform({2, 1})},
           [](const Inputs& in) { return cat({in[0], in[1], in[2]}, -1); });

  // ---- views, copies and casts (Tensor members) ----
  add_case("reshape_view", {uniform({2, 3, 4})}, [](const Inputs& in) { return in[0].reshape({4, 6}); });
  // A transposed tensor cannot be viewed flat: reshape copies (through clone) and must still route the
  // gradient back through the transpose.
  add_case("reshape_copy", {uniform({2, 3, 4})}, [](const Inputs& in) { return in[0].transpose(0, 1).reshape({-1}); });
  add_case("view", {uniform({2, 3, 4})}, [](const Inputs& in) { return in[0].view({6, 4}); });
  add_case("transpose", {uniform({2, 3, 4})}, [](const Inputs& in) { return in[0].transpose(0, 2); });
  add_case("permute", {uniform({2, 3, 4})}, [](const Inputs& in) { return in[0].permute({2, 0, 1}); });
  add_case("slice_with_step", {uniform({3, 6})}, [](const Inputs& in) { return in[0].slice(1, 1, 6, 2); });
  add_case("slice_negative_start", {uniform({4, 3})}, [](const Inputs& in) { return in[0].slice(0, -2, 4); });
  add_case("expand", {uniform({3, 1})}, [](const Inputs& in) { return in[0].expand({2, 3, 4}); });
  add_case("clone", {uniform({3, 4})}, [](const Inputs& in) { return in[0].clone(); });
  // Down to f16 and back up: the function is linear, and with inputs and step on a 2^-8 grid every x, x + h
  // and x - h is exact in f16 (|x| <= 2 + 2^-8 needs 10 significant bits of f16's 11), so the finite
  // difference is exact although it goes through f16. The result is f64 whatever the input dtype.
  add_case("to_f16_and_back", {grid({3, 4}, -2.0, 2.0, 0x1p-8)},
           [](const Inputs& in) { return in[0].to(DType::f16).to(DType::f64); })
      .step = 0x1p-8;

  // ---- losses ----
  // Log-probabilities need not be normalised for nll_loss: its gradient does not depend on them.
  const std::vector<double> targets = {1, 0, 4, 1};
  for (const auto& [suffix, reduction] : {std::pair{"mean", Reduction::mean}, std::pair{"sum", Reduction::sum},
                                          std::pair{"none", Reduction::none}}) {
    const Reduction r = reduction;
    add_case(std::string("nll_loss_") + suffix, {uniform({4, 5}, -3.0, 0.0), indices({4}, targets)},
             [r](const Inputs& in) { return nll_loss(in[0], in[1], r); });
    add_case(std::string("cross_entropy_") + suffix, {uniform({4, 5}, -3.0, 3.0), indices({4}, targets)},
             [r](const Inputs& in) { return cross_entropy(in[0], in[1], r); });
    add_case(std::string("mse_loss_") + suffix, {uniform({3, 4}), uniform({3, 4})},
             [r](const Inputs& in) { return mse_loss(in[0], in[1], r); });
    // Probabilities away from 0 and 1, where the log clamp would flatten the function.
    add_case(std::string("binary_cross_entropy_") + suffix,
             {uniform({3, 4}, 0.1, 0.9), constant(uniform({3, 4}, 0.0, 1.0))},
             [r](const Inputs& in) { return binary_cross_entropy(in[0], in[1], r); });
    add_case(std::string("binary_cross_entropy_with_logits_") + suffix,
             {uniform({3, 4}, -3.0, 3.0), uniform({3, 4}, 0.0, 1.0)},
             [r](const Inputs& in) { return binary_cross_entropy_with_logits(in[0], in[1], r); });
  }
  // Ignored rows get no gradient, and mean divides by the 2 counted rows, not by 4.
  add_case("nll_loss_ignore_index_default", {uniform({4, 5}, -3.0, 0.0), indices({4}, {1, -100, 4, -100})},
           [](const Inputs& in) { return nll_loss(in[0], in[1]); });
  add_case("cross_entropy_ignore_index", {uniform({4, 5}, -3.0, 3.0), indices({4}, {2, 0, 2, 4})},
           [](const Inputs& in) { return cross_entropy(in[0], in[1], Reduction::mean, 2); });
  add_case("cross_entropy_ignore_index_sum", {uniform({4, 5}, -3.0, 3.0), indices({4}, {2, 0, 2, 4})},
           [](const Inputs& in) { return cross_entropy(in[0], in[1], Reduction::sum, 2); });

  // ---- ops for hand-written losses ----
  add_case("rsub", {uniform({3, 4})}, [](const Inputs& in) { return rsub(in[0], 1.5); });
  add_case("operator_scalar_minus_tensor", {uniform({3, 4})}, [](const Inputs& in) { return 1.0 - in[0]; });
  add_case("operators_tensor_expression", {uniform({3, 4}), away_from({4}, -2.0, 2.0, {0.0}, 0.5)},
           [](const Inputs& in) { return (in[0] * 2.0 + in[1]) / in[1] - -in[0]; });
  // The reciprocal and 2 / x keep x at least 0.5 from zero.
  add_case("reciprocal", {away_from({3, 5}, -2.0, 2.0, {0.0}, 0.5)}, [](const Inputs& in) { return reciprocal(in[0]); });
  add_case("operator_scalar_divided_by_tensor", {away_from({3, 5}, -2.0, 2.0, {0.0}, 0.5)},
           [](const Inputs& in) { return 2.0 / in[0]; });
  add_case("abs", {away_from({3, 5}, -2.0, 2.0, {0.0}, 0.1)}, [](const Inputs& in) { return abs(in[0]); });
  add_case("log1p", {uniform({3, 5}, -0.6, 3.0)}, [](const Inputs& in) { return log1p(in[0]); });
  add_case("expm1", {uniform({3, 5})}, [](const Inputs& in) { return expm1(in[0]); });
  add_case("logsigmoid", {uniform({3, 5}, -6.0, 6.0)}, [](const Inputs& in) { return logsigmoid(in[0]); });
  add_case("softplus_default", {uniform({3, 5}, -6.0, 6.0)}, [](const Inputs& in) { return softplus(in[0]); });
  // beta x crosses the threshold at x = 1.5, where softplus jumps from log1p(e^3) / 2 to x: values stay
  // 0.05 away from it.
  add_case("softplus_beta_2_threshold_3", {away_from({4, 5}, -3.0, 3.0, {1.5}, 0.05)},
           [](const Inputs& in) { return softplus(in[0], 2.0, 3.0); });
  add_case("clamp_min", {away_from({4, 5}, -2.0, 2.0, {-0.5}, 0.05)}, [](const Inputs& in) { return clamp_min(in[0], -0.5); });
  add_case("clamp_max", {away_from({4, 5}, -2.0, 2.0, {0.5}, 0.05)}, [](const Inputs& in) { return clamp_max(in[0], 0.5); });
  // Operands on two grids offset by 1/8: never equal, never closer than 1/8.
  add_case("maximum_broadcast", {grid({3, 4}, -2.0, 2.0, 0.25), grid({4}, -1.875, 1.875, 0.25)},
           [](const Inputs& in) { return maximum(in[0], in[1]); });
  add_case("minimum_broadcast", {grid({3, 1}, -2.0, 2.0, 0.25), grid({3, 4}, -1.875, 1.875, 0.25)},
           [](const Inputs& in) { return minimum(in[0], in[1]); });
  // Operands on one coarse grid tie often: the central difference at a tie is 1/2 for each operand,
  // which is PyTorch's even split.
  add_case("maximum_with_ties", {grid({3, 4}, -1.0, 1.0, 0.5), grid({3, 4}, -1.0, 1.0, 0.5)},
           [](const Inputs& in) { return maximum(in[0], in[1]); });
  add_case("minimum_with_ties", {grid({3, 4}, -1.0, 1.0, 0.5), grid({3, 4}, -1.0, 1.0, 0.5)},
           [](const Inputs& in) { return minimum(in[0], in[1]); });
  add_case("max_all", {distinct({3, 4})}, [](const Inputs& in) { return max(in[0]); });
  add_case("min_all", {distinct({3, 4})}, [](const Inputs& in) { return min(in[0]); });
  add_case("max_all_two_ties", {two_tied_extremes({3, 4})}, [](const Inputs& in) { return max(in[0]); });
  add_case("min_all_two_ties", {two_tied_extremes({3, 4})}, [](const Inputs& in) { return min(in[0]); });
  add_case("max_dim_keepdim", {distinct({2, 3, 4})}, [](const Inputs& in) { return max(in[0], 1, true).values; });
  add_case("min_negative_dim", {distinct({2, 3, 4})}, [](const Inputs& in) { return min(in[0], -1).values; });
  add_case("amax_dims_0_2", {distinct({2, 3, 4})}, [](const Inputs& in) { return amax(in[0], {0, 2}); });
  add_case("amin_all_keepdim", {distinct({2, 3})}, [](const Inputs& in) { return amin(in[0], {}, true); });
  add_case("amax_all_two_ties", {two_tied_extremes({3, 4})}, [](const Inputs& in) { return amax(in[0]); });
  add_case("var_all", {uniform({3, 4})}, [](const Inputs& in) { return var(in[0]); });
  add_case("var_dim_keepdim_population", {uniform({3, 4})}, [](const Inputs& in) { return var(in[0], {1}, 0.0, true); });
  add_case("var_dims_0_2_correction_2", {uniform({2, 3, 4})}, [](const Inputs& in) { return var(in[0], {0, -1}, 2.0); });
  add_case("std_all", {uniform({3, 4})}, [](const Inputs& in) { return std(in[0]); });
  add_case("std_last_dim", {uniform({2, 3, 4})}, [](const Inputs& in) { return std(in[0], {-1}); });

  // ---- attention: bmm, mul, masked_fill, softmax, bmm in one graph ----
  const auto sdpa = [](bool causal) {
    return [causal](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal); };
  };
  add_case("sdpa_3d", {uniform({2, 3, 4}), uniform({2, 3, 4}), uniform({2, 3, 4})}, sdpa(false));
  add_case("sdpa_3d_causal", {uniform({2, 3, 4}), uniform({2, 3, 4}), uniform({2, 3, 4})}, sdpa(true));
  add_case("sdpa_4d", {uniform({2, 2, 3, 4}), uniform({2, 2, 3, 4}), uniform({2, 2, 3, 4})}, sdpa(false));
  add_case("sdpa_4d_causal", {uniform({2, 2, 3, 4}), uniform({2, 2, 3, 4}), uniform({2, 2, 3, 4})}, sdpa(true));
  // Fewer queries than keys, a value width unlike the key width, and an explicit scale.
  add_case("sdpa_cross_lengths_explicit_scale", {uniform({1, 2, 3}), uniform({1, 4, 3}), uniform({1, 4, 2})},
           [](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], false, 0.5); });
  return cases;
}

// ---- the checks --------------------------------------------------------------------------------------

class gradcheck_test : public ::testing::TestWithParam<GradCase> {};

void check_against_finite_differences(const GradCase& c) {
  const Values v = initial_values(c);
  const std::vector<Tensor> grads = analytic_gradients(c, v, DType::f64, Device::cpu());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    EXPECT_EQ(grads[i].dtype(), DType::f64) << input_label(c, i);
    EXPECT_EQ(grads[i].shape(), c.inputs[i].shape) << input_label(c, i);
    expect_close(input_label(c, i), grads[i].values(), numeric_gradient(c, v, i), kFiniteDifference, "analytic",
                 "numeric");
  }
}

TEST_P(gradcheck_test, f64_matches_finite_differences) { check_against_finite_differences(GetParam()); }

// The lower-dtype run against the f64 analytic gradient at the inputs that dtype actually holds: the
// reference is evaluated at the rounded inputs, so the tolerance measures only the op's arithmetic in
// that dtype, not how much the gradient changes when the inputs move by a rounding error.
void check_low_precision(const GradCase& c, DType dtype) {
  if (c.skips(dtype)) GTEST_SKIP() << "no " << dtype_name(dtype) << " check for " << c.name << ": " << c.skip_reason;
  const Values v = rounded_values(c, initial_values(c), dtype);
  const std::vector<Tensor> reference = analytic_gradients(c, v, DType::f64, Device::cpu());
  const std::vector<Tensor> low = analytic_gradients(c, v, dtype, Device::cpu());
  for (std::size_t i = 0; i < low.size(); ++i) {
    if (!low[i].defined()) continue;
    EXPECT_EQ(low[i].dtype(), dtype) << input_label(c, i) << ": a gradient has its input's dtype";
    const std::vector<double> expected = reference[i].values();
    const double scale = std::max(max_abs(expected), 1e-30);
    const Tolerance tol{low_precision_rel(dtype) * scale, 0.0,
                        std::string(dtype_name(dtype)) + " tolerance x the largest |gradient|, " +
                            std::to_string(scale)};
    expect_close(input_label(c, i) + " in " + std::string(dtype_name(dtype)), low[i].values(), expected, tol,
                 dtype_name(dtype).data(), "f64");
  }
}

TEST_P(gradcheck_test, f32_gradient_tracks_f64) { check_low_precision(GetParam(), DType::f32); }
TEST_P(gradcheck_test, f16_gradient_tracks_f64) { check_low_precision(GetParam(), DType::f16); }
TEST_P(gradcheck_test, bf16_gradient_tracks_f64) { check_low_precision(GetParam(), DType::bf16); }

// Every dtype's gradient on each accelerator backend against the CPU backend's at the same inputs. The
// CPU backend is the executable specification of the GPU one: element-wise math is the same functor, so
// only accumulation order (BLAS vs cuBLAS, reduction trees) may differ, well inside the per-dtype
// tolerance. A backend that lacks one of the case's kernels refuses cleanly (UnsupportedError); the test
// then skips with the backend's message, so the list of missing kernels is visible in the test output.
// With AMPSCOPE_REQUIRE_GPU=1 (exactly "1", the rule of SKIP_WITHOUT_GPU in tests/test_support.h) it fails
// instead: the CUDA backend claims every op the CPU has (docs/cuda.md), so on a GPU machine a refusal is
// a missing kernel, not a reason to pass by skipping.
bool gpu_required() {
  const char* require = std::getenv("AMPSCOPE_REQUIRE_GPU");
  return require != nullptr && std::string(require) == "1";
}

TEST_P(gradcheck_test, cuda_gradient_matches_cpu) {
  SKIP_WITHOUT_GPU();
  const GradCase& c = GetParam();
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    if (c.skips(dtype)) continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Values v = rounded_values(c, initial_values(c), dtype);
    const std::vector<Tensor> cpu = analytic_gradients(c, v, dtype, Device::cpu());
    std::vector<Tensor> gpu;
    try {
      gpu = analytic_gradients(c, v, dtype, Device::cuda());
    } catch (const UnsupportedError& e) {
      if (gpu_required()) {
        FAIL() << "AMPSCOPE_REQUIRE_GPU=1 but the cuda backend cannot run this case in " << dtype_name(dtype)
               << ": " << e.what();
      }
      GTEST_SKIP() << "the cuda backend cannot run this case yet: " << e.what();
    }
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      if (!cpu[i].defined()) continue;
      EXPECT_EQ(gpu[i].dtype(), dtype) << input_label(c, i);
      EXPECT_TRUE(gpu[i].device().is_cuda()) << input_label(c, i);
      const std::vector<double> expected = cpu[i].values();
      const double scale = std::max(max_abs(expected), 1e-30);
      const Tolerance tol{low_precision_rel(dtype) * scale, 0.0,
                          "summation order only, per-dtype tolerance x the largest |gradient|"};
      expect_close(input_label(c, i) + " on cuda in " + std::string(dtype_name(dtype)),
                   gpu[i].to(Device::cpu()).values(), expected, tol, "cuda", "cpu");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ops, gradcheck_test, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// The table itself: names are unique, and every op that records a node is exercised by some case. The
// second list is read from the graphs the cases build (each node's op()), so it checks what the cases
// really run, not their names; a new differentiable op belongs in kDifferentiable and in a case.
TEST(gradcheck_table_test, has_unique_names_and_covers_every_differentiable_op) {
  const std::vector<std::string> kDifferentiable = {
      "add", "sub", "mul", "div", "neg", "relu", "gelu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "pow",
      "clamp", "masked_fill", "where", "sum", "mean", "softmax", "log_softmax", "matmul", "bmm", "linear",
      "conv2d", "max_pool2d", "layer_norm", "embedding", "dropout", "cat", "nll_loss", "mse_loss",
      "binary_cross_entropy", "binary_cross_entropy_with_logits", "reshape", "view", "transpose", "permute",
      "slice", "expand", "to", "clone", "rsub", "reciprocal", "abs", "log1p", "expm1", "logsigmoid", "softplus",
      "clamp_min", "clamp_max", "maximum", "minimum", "max", "min", "amax", "amin", "var", "std", "silu"};
  std::vector<std::string> names;
  std::set<std::string> recorded;
  for (const GradCase& c : all_cases()) {
    names.push_back(c.name);
    const Tensor out = c.build(materialise(c, initial_values(c), DType::f64, Device::cpu(), true));
    std::vector<std::shared_ptr<autograd::Node>> stack{out.grad_fn()};
    while (!stack.empty()) {
      const std::shared_ptr<autograd::Node> node = stack.back();
      stack.pop_back();
      if (!node) continue;
      recorded.insert(node->op());
      stack.insert(stack.end(), node->next().begin(), node->next().end());
    }
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate case name";
  for (const std::string& op : kDifferentiable) EXPECT_EQ(recorded.count(op), 1u) << "no case records '" << op << "'";
}

// The harness itself catches a wrong backward: an op that doubles its input but claims a gradient of 3
// fails, and the message shows the pairs.
TEST(gradcheck_harness_test, reports_a_wrong_backward_with_its_first_pairs) {
  GradCase c;
  c.name = "wrong_backward";
  c.inputs = {uniform({3})};
  c.build = [](const Inputs& in) {
    const Tensor out = mul(in[0].detach(), 2.0);
    return autograd::record("wrong_backward", out, {in[0]}, [](const Tensor& g, const std::vector<bool>&) {
      return std::vector<Tensor>{mul(g, 3.0)};
    });
  };
  EXPECT_NONFATAL_FAILURE(check_against_finite_differences(c), "3 of 3 elements differ");
  EXPECT_NONFATAL_FAILURE(check_against_finite_differences(c), "[0] analytic");
}

}  // namespace
}  // namespace ampscope
