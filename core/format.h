// core/format.h: fmt formatters for Tensor, DType, Device and Shape-like vectors. Kept out of
// tensor.h so CUDA sources (nvcc 13 fails on fmt 9 at C++20 with consteval errors) can use tensors.
//
//   fmt::print("{}\n", arange(3, {.dtype = DType::f16}));   // tensor([0., 1., 2.], dtype=f16, device=cpu)
#pragma once

#include <fmt/format.h>

#include "core/tensor.h"

namespace ampscope {
// The shortest decimal text that reads back to the same value in `dtype` ("0.1" for f16(0.1), not
// "0.0999755859375"), as used in tensor printing and in messages.
std::string format_value(double value, DType dtype);
}  // namespace ampscope

template <>
struct fmt::formatter<ampscope::Tensor> : fmt::formatter<std::string_view> {
  auto format(const ampscope::Tensor& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(t.to_string(), ctx);
  }
};

template <>
struct fmt::formatter<ampscope::DType> : fmt::formatter<std::string_view> {
  auto format(ampscope::DType t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ampscope::dtype_name(t), ctx);
  }
};

template <>
struct fmt::formatter<ampscope::Device> : fmt::formatter<std::string_view> {
  auto format(const ampscope::Device& d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
