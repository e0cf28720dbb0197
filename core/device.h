// core/device.h: where a tensor lives.
//
//   Device d = Device::parse("cuda:0");   // {DeviceType::cuda, 0}; throws DeviceError if unknown
//   std::string s = d.str();              // "cuda:0"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ampscope {

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }

  // "cpu", "cuda" (index 0) or "cuda:N". Anything else throws DeviceError naming the valid forms.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu", "cuda:0"

  friend bool operator==(const Device&, const Device&) = default;
};

}  // namespace ampscope
