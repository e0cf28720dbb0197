#include "core/dtype.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f64", DType::f64},   {"float64", DType::f64},   {"double", DType::f64},  {"fp64", DType::f64},
      {"f32", DType::f32},   {"float32", DType::f32},   {"float", DType::f32},   {"fp32", DType::f32},
      {"f16", DType::f16},   {"float16", DType::f16},   {"half", DType::f16},    {"fp16", DType::f16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16}, {"i64", DType::i64},     {"int64", DType::i64},
      {"long", DType::i64},  {"bool", DType::boolean},
  };
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  throw DTypeError(fmt::format("unknown dtype '{}': expected one of f64, f32, f16, bf16, i64, bool "
                               "(PyTorch names such as float16 and bfloat16 work too)",
                               name));
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Category order bool < integer < floating: the higher category wins outright.
  const auto category = [](DType t) { return t == DType::boolean ? 0 : t == DType::i64 ? 1 : 2; };
  if (category(a) != category(b)) return category(a) > category(b) ? a : b;
  // Both floating and different. f16 and bf16 have no common 16-bit type: f32 holds both exactly.
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

}  // namespace ampscope
