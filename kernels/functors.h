// kernels/functors.h: the element math of every op, written once. The CPU backend calls these in its
// loops and the CUDA backend in its kernels, so the CPU backend is the executable specification of the
// GPU one. Functors take and return the op's accumulation type (float for f16/bf16/f32, double for f64):
// loads widen, the functor computes, the store rounds once to the output dtype.
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

}  // namespace ampscope
