// kernels/functors.h: the element math of every op, written once. The CPU backend calls these in its
// loops and the CUDA backend in its kernels, so the CPU backend is the executable specification of the
// GPU one. Functors take and return the op's accumulation type (float for f16/bf16/f32, double for f64):
// loads widen, the functor computes, the store rounds once to the output dtype. The row ops (softmax,
// layer norm, argmax, ...) are in kernels/row_functors.h, the fused optimizer steps in
// kernels/optim_functors.h, both built from the functors here.
//
//   float y = AddFn{}(1.0f, 2.0f);       // 3
//   float r = ReluFn{}(std::nanf(""));    // NaN: relu keeps NaN, as torch.relu does
//
// NaN bits: an x86 CPU returns a negative "default NaN" (0xFFC00000) for inf - inf and passes input
// payloads through, while an NVIDIA GPU returns the canonical 0x7FFFFFFF. So that both backends store
// the same bits, every arithmetic functor returns the canonical quiet NaN (all exponent and mantissa
// bits set, sign clear: 0x7FFFFFFF in f32, 0x7FFF once rounded to f16 or bf16) whenever its result is a
// NaN. Ops that only move values (relu, copy) keep a NaN's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#include "core/convert.h"
#include "core/float16.h"

namespace ampscope {

// x, or the canonical quiet NaN if x is a NaN.
template <class T>
AMPSCOPE_HD inline T canonical_nan(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x != x ? detail::bits_float(0x7FFFFFFFu) : x;
  } else if constexpr (std::is_same_v<T, double>) {
    if (x == x) return x;
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(0x7FFFFFFFFFFFFFFFll);
#else
    const std::uint64_t bits = 0x7FFFFFFFFFFFFFFFull;
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
#endif
  } else {
    return x;  // integers have no NaN
  }
}

// -infinity in float or double, on the host and the GPU (std::numeric_limits is host-only under nvcc
// without --expt-relaxed-constexpr).
template <class T>
AMPSCOPE_HD inline T minus_infinity() {
  if constexpr (std::is_same_v<T, float>) {
    return detail::bits_float(0xFF800000u);
  } else {
    static_assert(std::is_same_v<T, double>, "minus_infinity is for float and double");
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(0xFFF0000000000000ull));
#else
    const std::uint64_t bits = 0xFFF0000000000000ull;
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
#endif
  }
}

#if !defined(__CUDA_ARCH__)
namespace detail {
// tanh of a float on the host, computed in double and rounded once to float: a branch-free, call-free
// replacement for glibc's tanhf (a call per element, 30% of the tiny GPT's f32 step in GELU) that the
// compiler vectorises. The double result is within a few double ulps of tanh, so the float is the
// correctly rounded tanh except where tanh lies within about 1e-15 (relative) of a midpoint between two
// floats; glibc's tanhf is itself up to about 2 float ulps off, so the two differ by at most that
// (docs/numerics.md; tests/kernels/tanh_f32_test.cpp checks every 7th float against f64 tanh).
//   |x| < 2^-6: the odd Taylor series to x^9 (the next term is below 2^-60 of x);
//   otherwise 1 - 2 / (exp(2|x|) + 1), with 2|x| (capped at 40, where tanh is 1 in float) = n ln2 + r,
//   |r| <= ln2 / 2, exp(r) by its Taylor series to r^13 and 2^n built in the exponent bits;
// then the sign of x. A NaN comes back as itself.
inline float tanh_f32(float xf) {
  // The selects are on the float's bits, as masks: branch-free, so that a loop over this vectorises.
  std::uint32_t xb;
  std::memcpy(&xb, &xf, sizeof xf);
  const std::uint32_t ab = xb & 0x7FFFFFFFu;                      // |x|
  const std::uint32_t cb = ab < 0x41A00000u ? ab : 0x41A00000u;  // min(|x|, 20); a NaN gives 20
  float cf;
  std::memcpy(&cf, &cb, sizeof cf);
  const double a = cf;
  const double a2 = a * a;
  const double series = a + a * a2 * (-1.0 / 3 + a2 * (2.0 / 15 + a2 * (-17.0 / 315 + a2 * (62.0 / 2835))));
  const double y = 2.0 * a;
  // Adding 1.5 * 2^52 rounds y / ln2 to an integer n, held in the low bits of the sum's representation.
  const double kShift = 0x1.8p52;
  const double v = y * 0x1.71547652b82fep+0 + kShift;
  const double n = v - kShift;
  // ln2 in two parts, the first with 32 significant bits so that n * ln2_hi is exact (n <= 58).
  const double r = (y - n * 0x1.62e42feep-1) - n * 0x1.a39ef35793c76p-33;
  double p = 1.0 / 6227020800.0;  // 1/13!, then Horner down to 1 + r (1 + r (1/2 + ...))
  p = 1.0 / 479001600.0 + r * p;
  p = 1.0 / 39916800.0 + r * p;
  p = 1.0 / 3628800.0 + r * p;
  p = 1.0 / 362880.0 + r * p;
  p = 1.0 / 40320.0 + r * p;
  p = 1.0 / 5040.0 + r * p;
  p = 1.0 / 720.0 + r * p;
  p = 1.0 / 120.0 + r * p;
  p = 1.0 / 24.0 + r * p;
  p = 1.0 / 6.0 + r * p;
  p = 0.5 + r * p;
  p = 1.0 + r * p;
  p = 1.0 + r * p;
  std::int64_t vb, sb;
  std::memcpy(&vb, &v, sizeof v);
  std::memcpy(&sb, &kShift, sizeof kShift);
  const std::int64_t scale_bits = (vb - sb + 1023) * (std::int64_t{1} << 52);  // 2^n
  double scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  const double large = 1.0 - 2.0 / (p * scale + 1.0);
  const float sf = static_cast<float>(series), lf = static_cast<float>(large);
  std::uint32_t s_bits, l_bits;
  std::memcpy(&s_bits, &sf, sizeof sf);
  std::memcpy(&l_bits, &lf, sizeof lf);
  const std::uint32_t small = 0u - static_cast<std::uint32_t>(ab < 0x3C800000u);  // |x| < 2^-6
  std::uint32_t tb = ((s_bits & small) | (l_bits & ~small)) | (xb & 0x80000000u);  // with the sign of x
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>(ab > 0x7F800000u);
  tb = (xb & nan) | (tb & ~nan);
  float out;
  std::memcpy(&out, &tb, sizeof out);
  return out;
}
}  // namespace detail
#endif

// The tanh of GELU: detail::tanh_f32 for float on the host, the math library's tanh otherwise (double;
// the GPU's tanhf).
template <class T>
AMPSCOPE_HD inline T gelu_tanh(T x) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, float>) return detail::tanh_f32(x);
#endif
  return std::tanh(x);
}

struct AddFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return canonical_nan(a + b); }
};
struct SubFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return canonical_nan(a - b); }
};
struct MulFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return canonical_nan(a * b); }
};
struct DivFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return canonical_nan(a / b); }
};

struct NegFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(-a); }
};
struct ReluFn {
  // `a > 0 ? a : 0` would turn NaN into 0 and hide it; a diagnostics tool must let NaN through.
  template <class T> AMPSCOPE_HD T operator()(T a) const { return (a != a || a > T(0)) ? a : T(0); }
};
struct ExpFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::exp(a)); }
};
struct LogFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::log(a)); }
};
struct SqrtFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::sqrt(a)); }
};
struct RsqrtFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(T(1) / std::sqrt(a)); }
};
struct SigmoidFn {  // PyTorch's CUDA form: 1 / (1 + exp(-x))
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(T(1) / (T(1) + std::exp(-a))); }
};
struct TanhFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::tanh(a)); }
};
// x * sigmoid(x) as PyTorch's CUDA kernel writes it, x / (1 + exp(-x)): one division, no product of a
// rounded sigmoid. exp(-x) overflows to inf for x < -88.7 (f32) and x / inf is -0, as in PyTorch.
struct SiluFn {
  template <class T> AMPSCOPE_HD T operator()(T x) const { return canonical_nan(x / (T(1) + std::exp(-x))); }
};

// ---- functors for hand-written losses (PyTorch's CUDA kernels, in the op-math type) ----
struct RsubFn {  // (x, s) -> s - x: the scalar operand comes second, as binary_scalar_kernel passes it
  template <class T> AMPSCOPE_HD T operator()(T x, T s) const { return canonical_nan(s - x); }
};
struct ReciprocalFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(T(1) / a); }
};
// |x| only clears the sign bit, on both backends, as std::abs does in PyTorch's kernel: a NaN keeps its
// payload (like relu, abs moves a value rather than computing one).
// abs moves values, so it keeps a NaN's payload: the sign bit is cleared with an integer mask. (PTX's
// abs.f32, what fabsf compiles to, leaves a NaN's other bits unspecified; x86's andps keeps them.)
struct AbsFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const {
    if constexpr (std::is_same_v<T, float>) {
      return detail::bits_float(detail::float_bits(a) & 0x7FFFFFFFu);
    } else if constexpr (std::is_same_v<T, double>) {
#if defined(__CUDA_ARCH__)
      return __longlong_as_double(__double_as_longlong(a) & 0x7FFFFFFFFFFFFFFFll);
#else
      std::uint64_t bits;
      std::memcpy(&bits, &a, sizeof bits);
      bits &= 0x7FFFFFFFFFFFFFFFull;
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
#endif
    } else {
      return a < T(0) ? T(-a) : a;  // integers
    }
  }
};
struct Log1pFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::log1p(a)); }
};
struct Expm1Fn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return canonical_nan(std::expm1(a)); }
};
// PyTorch's abs backward is grad * sgn(x); sgn of 0 and of NaN is 0 (torch.sign(nan) == 0).
struct AbsBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    const T s = x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
    return canonical_nan(g * s);
  }
};
// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): exp never overflows. min(0, NaN) is 0 as std::min
// gives it, and the NaN then comes through exp.
struct LogSigmoidFn {
  template <class T> AMPSCOPE_HD T operator()(T x) const {
    const T m = x < T(0) ? x : T(0);
    return canonical_nan(m - std::log1p(std::exp(-std::fabs(x))));
  }
};
struct LogSigmoidBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    const bool negative = x < T(0);
    const T max_deriv = negative ? T(1) : T(0);
    const T sign = negative ? T(1) : T(-1);
    const T z = std::exp(-std::fabs(x));
    return canonical_nan(g * (max_deriv - sign * (z / (T(1) + z))));
  }
};
// maximum and minimum of two tensors: a NaN operand wins (the first one's bits if both are NaN), equal
// values (-0 and +0) give the first operand, as PyTorch's kernels do.
struct MaximumFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};
struct MinimumFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return b < a ? b : a;
  }
};
// x's share of the gradient of maximum(x, y) (PyTorch: where(x == y, g / 2, g).masked_fill_(x < y, 0)):
// half each on a tie, all of it to both when a NaN makes every comparison false. y's share is the same
// functor with the operands swapped.
struct MaximumBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x, T y) const {
    if (x == y) return canonical_nan(g * T(0.5));
    return x < y ? T(0) : g;
  }
};
struct MinimumBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x, T y) const {
    if (x == y) return canonical_nan(g * T(0.5));
    return x > y ? T(0) : g;
  }
};
// std's backward divides by the result and then zeroes where the result is 0 (masked_fill_).
struct StdBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T q, T y) const { return y == T(0) ? T(0) : q; }
};

// ---- functors with parameters: built from KernelArgs::scalars by make_functor ----

// GELU, exact (erf) or tanh-approximated, and its derivative, as in PyTorch's GeluKernel.
struct GeluFn {
  double mode = 0;  // 0: erf, 1: tanh
  AMPSCOPE_HD explicit GeluFn(const double* s) : mode(s[0]) {}
  template <class T> AMPSCOPE_HD T operator()(T x) const {
    if (mode == 0) {
      const T kAlpha = T(0.70710678118654752440);  // 1/sqrt(2)
      return canonical_nan(x * T(0.5) * (T(1) + std::erf(x * kAlpha)));
    }
    const T kBeta = T(0.79788456080286535588);  // sqrt(2/pi)
    const T kKappa = T(0.044715);
    const T x_cube = x * x * x;
    const T inner = kBeta * (x + kKappa * x_cube);
    return canonical_nan(T(0.5) * x * (T(1) + gelu_tanh(inner)));
  }
};
struct GeluBackwardFn {
  double mode = 0;
  AMPSCOPE_HD explicit GeluBackwardFn(const double* s) : mode(s[0]) {}
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    if (mode == 0) {
      const T kAlpha = T(0.70710678118654752440);
      const T kBeta = T(0.39894228040143267794);  // 1/sqrt(2 pi)
      const T cdf = T(0.5) * (T(1) + std::erf(x * kAlpha));
      const T pdf = kBeta * std::exp(T(-0.5) * x * x);
      return canonical_nan(g * (cdf + x * pdf));
    }
    const T kBeta = T(0.79788456080286535588);
    const T kKappa = T(0.044715);
    const T x_sq = x * x;
    const T x_cube = x_sq * x;
    const T inner = kBeta * (x + kKappa * x_cube);
    const T tanh_inner = gelu_tanh(inner);
    const T left = T(0.5) * x;
    const T right = T(1) + tanh_inner;
    const T left_derivative = T(0.5) * right;
    const T tanh_derivative = T(1) - tanh_inner * tanh_inner;
    const T inner_derivative = kBeta * (T(1) + T(3) * kKappa * x_sq);
    const T right_derivative = left * tanh_derivative * inner_derivative;
    return canonical_nan(g * (left_derivative + right_derivative));
  }
};

// x ** p with PyTorch's CUDA special cases (exact squares and square roots instead of pow()).
struct PowFn {
  double p = 1;
  AMPSCOPE_HD explicit PowFn(const double* s) : p(s[0]) {}
  template <class T> AMPSCOPE_HD T operator()(T x) const {
    if (p == 2) return canonical_nan(x * x);
    if (p == 3) return canonical_nan(x * x * x);
    if (p == 0.5) return canonical_nan(std::sqrt(x));
    if (p == -0.5) return canonical_nan(T(1) / std::sqrt(x));
    if (p == -1) return canonical_nan(T(1) / x);
    if (p == -2) return canonical_nan(T(1) / (x * x));
    return canonical_nan(std::pow(x, static_cast<T>(p)));
  }
};
// An absent bound is passed as -inf or +inf. NaN stays NaN (PyTorch's clamp propagates it).
struct ClampFn {
  double lo, hi;
  AMPSCOPE_HD explicit ClampFn(const double* s) : lo(s[0]), hi(s[1]) {}
  template <class T> AMPSCOPE_HD T operator()(T x) const {
    if (x != x) return x;
    const T l = static_cast<T>(lo), h = static_cast<T>(hi);
    const T y = x < l ? l : x;
    return y > h ? h : y;
  }
};
struct ClampBackwardFn {
  double lo, hi;
  AMPSCOPE_HD explicit ClampBackwardFn(const double* s) : lo(s[0]), hi(s[1]) {}
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    return (x >= static_cast<T>(lo) && x <= static_cast<T>(hi)) ? g : T(0);
  }
};

// softplus(x) = log1p(exp(beta x)) / beta, or x where beta x > threshold (PyTorch's form; beta and the
// threshold in the op-math type).
struct SoftplusFn {
  double beta, threshold;
  AMPSCOPE_HD explicit SoftplusFn(const double* s) : beta(s[0]), threshold(s[1]) {}
  template <class T> AMPSCOPE_HD T operator()(T x) const {
    const T b = static_cast<T>(beta), t = static_cast<T>(threshold);
    return canonical_nan((x * b) > t ? x : std::log1p(std::exp(x * b)) / b);
  }
};
struct SoftplusBackwardFn {
  double beta, threshold;
  AMPSCOPE_HD explicit SoftplusBackwardFn(const double* s) : beta(s[0]), threshold(s[1]) {}
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    const T b = static_cast<T>(beta), t = static_cast<T>(threshold);
    const T z = std::exp(x * b);
    return canonical_nan((x * b) > t ? g : g * z / (z + T(1)));
  }
};

// ---- backward functors: (g, saved) -> input gradient ----
struct ReluBackwardFn {  // PyTorch's threshold_backward: x <= 0 ? 0 : g (a NaN x passes g)
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const { return x <= T(0) ? T(0) : g; }
};
struct SigmoidBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T y) const { return canonical_nan(g * (T(1) - y) * y); }
};
struct TanhBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T y) const { return canonical_nan(g * (T(1) - y * y)); }
};
// (g, x): g s (1 + x (1 - s)), s = sigmoid(x), in PyTorch's order of operations (silu_backward_kernel).
struct SiluBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x) const {
    const T s = T(1) / (T(1) + std::exp(-x));
    return canonical_nan(g * s * (T(1) + x * (T(1) - s)));
  }
};
// ---- losses ----
// Binary cross-entropy on probabilities, each log clamped at -100 as in PyTorch. An input outside
// [0, 1] gives NaN (PyTorch asserts instead); a diagnostics tool lets it through to be seen.
struct BceFn {
  template <class T> AMPSCOPE_HD T operator()(T p, T y) const {
    T log_p = std::log(p), log_1mp = std::log1p(-p);
    if (log_p < T(-100)) log_p = T(-100);
    if (log_1mp < T(-100)) log_1mp = T(-100);
    return canonical_nan((y - T(1)) * log_1mp - y * log_p);
  }
};
struct BceBackwardFn {  // g (p - y) / max((1 - p) p, 1e-12)
  template <class T> AMPSCOPE_HD T operator()(T g, T p, T y) const {
    T d = (T(1) - p) * p;
    if (d < T(1e-12)) d = T(1e-12);
    return canonical_nan(g * (p - y) / d);
  }
};
// (1 - y) x - log_sigmoid(x), with log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)): never overflows.
struct BceLogitsFn {
  template <class T> AMPSCOPE_HD T operator()(T x, T y) const {
    const T min_x0 = x < T(0) ? x : T(0);
    const T log_sigmoid = min_x0 - std::log1p(std::exp(-std::fabs(x)));
    return canonical_nan((T(1) - y) * x - log_sigmoid);
  }
};
struct BceLogitsBackwardFn {
  template <class T> AMPSCOPE_HD T operator()(T g, T x, T y) const {
    return canonical_nan(g * (SigmoidFn{}(x) - y));
  }
};

// Dropout's keep/drop decision and scaling. PyTorch multiplies by the 0/1 mask (so a dropped NaN or
// inf still gives NaN), then by the scale; so do we.
struct MaskedScaleFn {
  double scale;
  AMPSCOPE_HD explicit MaskedScaleFn(const double* s) : scale(s[0]) {}
  template <class T> AMPSCOPE_HD T operator()(T x, bool keep) const {
    return canonical_nan(x * (keep ? T(1) : T(0)) * static_cast<T>(scale));
  }
};

// Builds a functor: from the kernel's scalars when it has parameters, default-constructed otherwise.
template <class Fn>
AMPSCOPE_HD inline Fn make_functor(const double* scalars) {
  if constexpr (std::is_constructible_v<Fn, const double*>) {
    return Fn(scalars);
  } else {
    return Fn{};
  }
}

// ---- reductions: one summation order for every backend ----
// A row is summed the way one warp of 32 threads sums it on the GPU: lane k adds elements k, k + 32,
// k + 64, ... in order, then the 32 partial sums are folded in halves (lane k += lane k + 16, then
// k + 8, 4, 2, 1). The CPU backend follows the same order, so sums agree bit for bit across backends.
inline constexpr int kReduceLanes = 32;

template <class Acc, class Load>
AMPSCOPE_HD inline Acc lane_tree_sum(std::int64_t n, const Load& load) {
  Acc lanes[kReduceLanes];
  for (int k = 0; k < kReduceLanes; ++k) lanes[k] = Acc(0);
  std::int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes) {
    for (int k = 0; k < kReduceLanes; ++k) lanes[k] += load(j + k);
  }
  for (int k = 0; j + k < n; ++k) lanes[k] += load(j + k);
  for (int width = kReduceLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  }
  return lanes[0];
}

}  // namespace ampscope
