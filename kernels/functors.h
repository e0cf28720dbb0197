// kernels/functors.h: the element math of every op, written once. The CPU backend calls these in its
// loops and the CUDA backend in its kernels, so the CPU backend is the executable specification of the
// GPU one. Functors take and return the op's accumulation type (float for f16/bf16/f32, double for f64):
// loads widen, the functor computes, the store rounds once to the output dtype.
//
//   float y = AddFn{}(1.0f, 2.0f);       // 3
//   float r = ReluFn{}(std::nanf(""));    // NaN: relu keeps NaN, as torch.relu does
#pragma once

#include <cmath>

#include "core/float16.h"

namespace ampscope {

struct AddFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return a + b; }
};
struct SubFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return a - b; }
};
struct MulFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return a * b; }
};
struct DivFn {
  template <class T> AMPSCOPE_HD T operator()(T a, T b) const { return a / b; }
};

struct NegFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return -a; }
};
struct ReluFn {
  // `a > 0 ? a : 0` would turn NaN into 0 and hide it; a diagnostics tool must let NaN through.
  template <class T> AMPSCOPE_HD T operator()(T a) const { return (a != a || a > T(0)) ? a : T(0); }
};
struct ExpFn {
  template <class T> AMPSCOPE_HD T operator()(T a) const { return std::exp(a); }
};

}  // namespace ampscope
