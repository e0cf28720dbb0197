// exp over float arrays (kernels/cpu/exp_kernels.h): every path against the C library's std::exp called one
// element at a time, whose bits the softmax rows had before (issue 37). The reference is the libm itself, not
// the loop's own arithmetic: a different table entry, coefficient, rounding or fused multiply-add shows here.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/exp_kernels.h"

namespace ampscope {
namespace {

using cpu::ExpPath;

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// x[i] in, out[i] = exp on `path`, compared with std::exp; returns the first difference's index or -1.
std::int64_t first_difference(ExpPath path, const std::vector<float>& x) {
  std::vector<float> out(x.size(), -1.0f);
  cpu::exp_f32_on(path, x.data(), out.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (bits(out[i]) != bits(std::exp(x[i]))) return static_cast<std::int64_t>(i);
  }
  return -1;
}

// The values glibc's expf treats apart, and its thresholds' neighbours: zeros, subnormals, 88 (where its main
// path ends), the overflow bound 0x1.62e42ep6, the underflow bounds -0x1.9d1d9ep6 and -0x1.9fe368p6,
// infinities, NaNs of both signs and several payloads.
std::vector<float> edge_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),
                          std::bit_cast<float>(0xffc12345u), std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()};
  for (const float t : {88.0f, -88.0f, 0x1.62e42ep6f, -0x1.9d1d9ep6f, -0x1.9fe368p6f, 1.0f, -1.0f, 0x1p-30f}) {
    float below = t, above = t;
    for (int k = 0; k < 4; ++k) {
      v.push_back(below);
      v.push_back(above);
      below = std::nextafter(below, -inf);
      above = std::nextafter(above, inf);
    }
  }
  return v;
}

std::vector<ExpPath> available_paths() {
  std::vector<ExpPath> paths;
  for (const ExpPath p : {ExpPath::scalar, ExpPath::avx512}) {
    if (cpu::exp_path_available(p)) paths.push_back(p);
  }
  return paths;
}

TEST(exp_f32, every_path_gives_std_exp_bits_on_a_sweep_of_all_floats) {
  // Every 251st bit pattern: about 17 million floats, both signs, subnormals to the largest, NaNs included.
  // (Every one of the 2^32 floats was compared once on the development machine: no difference.)
  std::vector<float> x;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 251) x.push_back(std::bit_cast<float>(std::uint32_t(u)));
  for (const ExpPath p : available_paths()) {
    const std::int64_t at = first_difference(p, x);
    EXPECT_EQ(at, -1) << "path " << static_cast<int>(p) << " differs from std::exp at x = " << std::hexfloat
                      << (at >= 0 ? x[static_cast<std::size_t>(at)] : 0.0f);
  }
}

TEST(exp_f32, every_path_gives_std_exp_bits_on_the_softmax_range_and_edges) {
  // The softmax's arguments x - max lie in [-inf, 0]: every 1021st float from -2 to -0 (about a million),
  // plus glibc's thresholds and the special values, each at every lane position of a 16-wide vector.
  std::vector<float> x;
  for (std::uint32_t u = bits(-2.0f); u >= 0x80000000u && u <= bits(-2.0f); u -= 1021) x.push_back(std::bit_cast<float>(u));
  const std::vector<float> edges = edge_values();
  for (std::size_t shift = 0; shift < 16; ++shift) {
    x.insert(x.end(), shift, 0.5f);
    x.insert(x.end(), edges.begin(), edges.end());
  }
  for (const ExpPath p : available_paths()) {
    const std::int64_t at = first_difference(p, x);
    EXPECT_EQ(at, -1) << "path " << static_cast<int>(p) << " differs from std::exp at x = " << std::hexfloat
                      << (at >= 0 ? x[static_cast<std::size_t>(at)] : 0.0f);
  }
}

TEST(exp_f32, lengths_that_leave_a_partial_vector_and_in_place) {
  for (const ExpPath p : available_paths()) {
    for (std::int64_t n = 0; n <= 40; ++n) {
      // Guards on both sides: a partial vector's lanes past n must not be written.
      std::vector<float> x(static_cast<std::size_t>(n) + 2, 123.0f), out(x.size(), 7.0f);
      for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i) + 1] = -0.37f * static_cast<float>(i);
      cpu::exp_f32_on(p, x.data() + 1, out.data() + 1, n);
      EXPECT_EQ(bits(out[0]), bits(7.0f));
      EXPECT_EQ(bits(out[static_cast<std::size_t>(n) + 1]), bits(7.0f)) << "n " << n;
      std::vector<float> in_place = x;
      cpu::exp_f32_on(p, in_place.data() + 1, in_place.data() + 1, n);
      for (std::int64_t i = 1; i <= n; ++i) {
        const float ref = std::exp(x[static_cast<std::size_t>(i)]);
        ASSERT_EQ(bits(out[static_cast<std::size_t>(i)]), bits(ref)) << "n " << n << " at " << i;
        ASSERT_EQ(bits(in_place[static_cast<std::size_t>(i)]), bits(ref)) << "in place, n " << n << " at " << i;
      }
    }
  }
}

TEST(exp_f32, the_vector_path_is_taken_where_glibc_computes_expf_with_fma) {
  // glibc (2.28 on) runs its FMA build of expf on a CPU with FMA and AVX2, the arithmetic the vector loop
  // reproduces: there the first-use check must pass, or exp_f32 has quietly fallen back to one call an element.
#if defined(__GLIBC__) && defined(__x86_64__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28))
  __builtin_cpu_init();
  if (!cpu::exp_path_available(ExpPath::avx512) || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
    GTEST_SKIP() << "no AVX-512 F, FMA or AVX2 on this CPU";
  }
  EXPECT_TRUE(cpu::exp_path_matches_libm(ExpPath::avx512));
  const std::vector<float> x = edge_values();
  std::vector<float> out(x.size());
  cpu::exp_f32(x.data(), out.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(out[i]), bits(std::exp(x[i]))) << "at " << i;
#else
  GTEST_SKIP() << "not glibc 2.28 or later on x86-64";
#endif
}

}  // namespace
}  // namespace ampscope
