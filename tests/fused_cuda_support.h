// tests/fused_cuda_support.h: what the fused-AMP tests on CUDA share (tests/scaler and tests/optim):
// selecting the fused or unfused path for a scope, and a bit-for-bit tensor comparison that prints the
// first differing elements. Only with CUDA (AMPSCOPE_WITH_CUDA).
#pragma once

#if defined(AMPSCOPE_WITH_CUDA)

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/fused_amp.h"

namespace ampscope::testing {

// Selects the fused or the unfused path for the scope, then restores what was selected before.
struct FusedGuard {
  explicit FusedGuard(bool on) : before_(cuda::fused_amp_enabled()) { cuda::set_fused_amp_enabled(on); }
  ~FusedGuard() { cuda::set_fused_amp_enabled(before_); }
  bool before_;
};

inline std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()));
  if (!out.empty()) std::memcpy(out.data(), c.data(), out.size());
  return out;
}

// The same bits (both undefined counts as the same); a failure shows the first five differing elements.
inline void expect_same_bits(const Tensor& expected, const Tensor& actual, const std::string& what) {
  ASSERT_EQ(expected.defined(), actual.defined()) << what;
  if (!expected.defined()) return;
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  ASSERT_EQ(expected.numel(), actual.numel()) << what;
  const std::vector<std::uint8_t> eb = bytes_of(expected), ab = bytes_of(actual);
  if (eb == ab) return;
  const std::vector<double> e = expected.to(Device::cpu()).values(), a = actual.to(Device::cpu()).values();
  const std::size_t width = dtype_size(expected.dtype());
  int shown = 0;
  for (std::size_t i = 0; i < e.size() && shown < 5; ++i) {
    if (std::memcmp(eb.data() + i * width, ab.data() + i * width, width) != 0) {
      ADD_FAILURE() << what << ": element " << i << " expected " << e[i] << ", got " << a[i];
      ++shown;
    }
  }
}

}  // namespace ampscope::testing

#endif  // AMPSCOPE_WITH_CUDA
