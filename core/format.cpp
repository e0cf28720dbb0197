#include "core/format.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/convert.h"

namespace ampscope {

namespace {
bool same_in_dtype(double a, double b, DType dtype) {
  return visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T x = convert<T>(a), y = convert<T>(b);
    return std::memcmp(&x, &y, sizeof(T)) == 0;
  });
}
}  // namespace

std::string format_value(double value, DType dtype) {
  if (dtype == DType::boolean) return value != 0 ? "true" : "false";
  if (dtype == DType::i64) return fmt::format("{}", convert<std::int64_t>(value));  // exact below 2^53
  if (std::isnan(value)) return std::signbit(value) ? "-nan" : "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  std::string text;
  if (value == std::trunc(value) && std::fabs(value) < 1e7) {
    // Whole numbers of up to 7 digits print in full ("65504." rather than "6.55e+04"): they are exact.
    text = fmt::format("{:.0f}", value);
  } else if (dtype == DType::f64) {
    text = fmt::format("{}", value);
  } else if (dtype == DType::f32) {
    text = fmt::format("{}", static_cast<float>(value));
  } else {
    for (int precision = 1; precision <= 9; ++precision) {
      text = fmt::format("{:.{}g}", value, precision);
      if (same_in_dtype(std::strtod(text.c_str(), nullptr), value, dtype)) break;
    }
  }
  // Mark whole numbers as floating point, as PyTorch prints them ("3." rather than "3").
  if (text.find_first_of(".e") == std::string::npos) text += ".";
  return text;
}

namespace {
constexpr std::int64_t kSummariseAbove = 1000;  // elements; larger tensors show their edges only
constexpr std::int64_t kEdgeItems = 3;

void format_dim(std::string& out, const std::vector<std::string>& cells, const Shape& shape, std::size_t d,
                std::int64_t base, std::size_t width, bool summarise, std::size_t indent) {
  const std::int64_t n = shape[d];
  std::int64_t inner = 1;
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  out += '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      out += (d + 1 == shape.size()) ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
      i = n - kEdgeItems;
    }
    if (d + 1 == shape.size()) {
      out += fmt::format("{:>{}}", cells[static_cast<std::size_t>(base + i)], width);
    } else {
      format_dim(out, cells, shape, d + 1, base + i * inner, width, summarise, indent + 1);
    }
    if (i + 1 < n) {
      out += ',';
      if (d + 1 == shape.size()) {
        out += ' ';
      } else {
        out += std::string(shape.size() - d - 1, '\n');
        out += std::string(indent + 1, ' ');
      }
    }
  }
  out += ']';
}
}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  // Formats from the stored values themselves: i64 must not pass through double (2^53 + 1, INT64_MAX).
  const Tensor host = contiguous().to(Device::cpu());
  std::vector<std::string> cells(static_cast<std::size_t>(numel()));
  visit_dtype(dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(host.data());
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if constexpr (std::is_same_v<T, std::int64_t>) {
        cells[i] = fmt::format("{}", p[i]);
      } else {
        cells[i] = format_value(convert<double>(p[i]), dtype());
      }
    }
  });
  std::size_t width = 0;
  for (const std::string& c : cells) width = std::max(width, c.size());
  std::string out = "tensor(";
  if (dim() == 0) {
    out += cells.at(0);
  } else {
    format_dim(out, cells, shape(), 0, 0, width, numel() > kSummariseAbove, 7);
  }
  out += fmt::format(", dtype={}, device={})", dtype_name(dtype()), device().str());
  return out;
}

}  // namespace ampscope
