// core/dtype.h: the element types a tensor can hold, their sizes and names, and PyTorch's promotion
// rule between them.
//
//   DType t = promote_types(DType::f16, DType::bf16);   // DType::f32, as torch.promote_types
//   std::string_view n = dtype_name(DType::bf16);        // "bf16"
//   DType p = parse_dtype("fp16");                       // DType::f16 (throws DTypeError if unknown)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/float16.h"

namespace ampscope {

enum class DType : std::uint8_t { f64, f32, f16, bf16, i64, boolean };
inline constexpr int kNumDTypes = 6;

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

constexpr bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

// Accepts our names ("f16") and PyTorch's ("float16", "half", "fp16", "bfloat16", "int64", "long", ...).
// Throws DTypeError listing the valid names.
DType parse_dtype(std::string_view name);

// torch.promote_types for the dtypes we have: bool < i64 < floating; f16 with bf16 gives f32.
DType promote_types(DType a, DType b);

// The C++ storage type of each dtype, both ways.
template <DType D> struct cpp_type_of;
template <> struct cpp_type_of<DType::f64> { using type = double; };
template <> struct cpp_type_of<DType::f32> { using type = float; };
template <> struct cpp_type_of<DType::f16> { using type = f16; };
template <> struct cpp_type_of<DType::bf16> { using type = bf16; };
template <> struct cpp_type_of<DType::i64> { using type = std::int64_t; };
template <> struct cpp_type_of<DType::boolean> { using type = bool; };
template <DType D> using cpp_type = typename cpp_type_of<D>::type;

template <class T> struct dtype_of;
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };

// Calls fn(T{}) with a value of the storage type of `t`: the one switch from a runtime dtype to a
// compile-time type. Host code only (dispatch happens before a kernel launch).
template <class Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f64: return fn(double{});
    case DType::f32: return fn(float{});
    case DType::f16: return fn(f16{});
    case DType::bf16: return fn(bf16{});
    case DType::i64: return fn(std::int64_t{});
    case DType::boolean: return fn(bool{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

}  // namespace ampscope
