#include "core/device.h"

#include <charconv>

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && index >= 0) {
      return cuda(index);
    }
  }
  throw DeviceError(fmt::format("unknown device '{}': expected 'cpu', 'cuda' or 'cuda:N' (N = 0, 1, ...)", text));
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index); }

}  // namespace ampscope
