// core/convert.h: converting one element from any dtype's storage type to another's, the same way on
// the host and on the GPU. This is the element math of the `copy` kernel (`to(dtype)`), of `fill`,
// and of element access in tests.
//
//   f16 h = convert<f16>(70000.0);          // +inf: values round once to the target, overflow gives inf
//   std::int64_t i = convert<std::int64_t>(std::nanf(""));  // 0: NaN to integer is defined here
//
// Rules (PyTorch's where it defines them):
// - floating -> f16/bf16 goes through float: f64 is first rounded to float, then to f16 (PyTorch's
//   static_cast<Half>(double) does the same double rounding on CPU and CUDA);
// - integer/bool -> floating: the nearest value (int64 -> float rounds to nearest even);
// - floating -> i64 truncates toward zero, saturates at the int64 range, and NaN gives 0 (what the
//   GPU's cvt.rzi instruction does; C++ leaves it undefined, so we define it once for both sides);
// - anything -> bool is `x != 0` (NaN is true).
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/float16.h"

namespace ampscope {

namespace detail {
template <class T> inline constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// Widen to the type the value's math happens in without loss: f16/bf16 -> float, others unchanged.
template <class T>
AMPSCOPE_HD inline auto widen(T x) {
  if constexpr (is_half_v<T>) {
    return static_cast<float>(x);
  } else {
    return x;
  }
}

template <class F>
AMPSCOPE_HD inline std::int64_t float_to_i64(F x) {
  if (x != x) return 0;  // NaN
  // 2^63 is exactly representable in float and double; anything at or beyond it saturates.
  if (x >= static_cast<F>(9223372036854775808.0)) return INT64_MAX;
  if (x <= static_cast<F>(-9223372036854775808.0)) return INT64_MIN;
  return static_cast<std::int64_t>(x);
}
}  // namespace detail

template <class To, class From>
AMPSCOPE_HD inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    auto w = detail::widen(x);  // float, double, int64 or bool
    using W = decltype(w);
    if constexpr (std::is_same_v<To, bool>) {
      return w != W(0);
    } else if constexpr (detail::is_half_v<To>) {
      return To(static_cast<float>(w));
    } else if constexpr (std::is_same_v<To, std::int64_t> && std::is_floating_point_v<W>) {
      return detail::float_to_i64(w);
    } else {
      return static_cast<To>(w);
    }
  }
}

// The type element math runs in for a storage type: float for f16/bf16/f32, double for f64 (an f16
// value is widened, computed on in float, and rounded once on store, as on the GPU).
template <class T> struct acc_type_of { using type = T; };
template <> struct acc_type_of<f16> { using type = float; };
template <> struct acc_type_of<bf16> { using type = float; };
template <class T> using acc_type = typename acc_type_of<T>::type;

}  // namespace ampscope
