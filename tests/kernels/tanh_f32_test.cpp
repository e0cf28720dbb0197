// GELU's tanh on the CPU (kernels/functors.h, detail::tanh_f32: computed in double, rounded once) and the
// vectorised f32 GELU loops (kernels/cpu/gelu_kernels.h). References: tanh in double from the math library,
// rounded to float (the correctly rounded float tanh but for near-midpoint cases), and the functors called
// one element at a time, whose bits the loops must reproduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gelu_kernels.h"
#include "kernels/functors.h"

namespace ampscope {
namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof f);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Distance in float steps between two finite floats (a monotone integer map of the bit patterns).
std::int64_t ulps_apart(float a, float b) {
  auto ord = [](float f) {
    const std::int64_t u = bits(f);
    return u & 0x80000000 ? -(u & 0x7FFFFFFF) : u;
  };
  return std::llabs(ord(a) - ord(b));
}

TEST(tanh_f32, within_one_ulp_of_the_double_tanh_rounded_across_the_float_range) {
  // Every 4099th bit pattern (about a million floats, both signs, subnormals to the largest), NaNs apart.
  std::int64_t differ = 0, worst = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099) {
    const float x = from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(x)) continue;
    const float ref = static_cast<float>(std::tanh(static_cast<double>(x)));
    const float got = detail::tanh_f32(x);
    const std::int64_t d = ulps_apart(got, ref);
    worst = std::max(worst, d);
    differ += d != 0;
    ASSERT_LE(d, 1) << "x = " << x << " (bits " << std::hex << bits(x) << "): got " << got << ", expected " << ref;
  }
  // Only near-midpoint cases may differ: every 7th float (611M values) measured 1 difference.
  EXPECT_LE(differ, 2) << "values one ulp from the rounded double tanh";
}

TEST(tanh_f32, special_values) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits(detail::tanh_f32(0.0f)), bits(0.0f));
  EXPECT_EQ(bits(detail::tanh_f32(-0.0f)), bits(-0.0f));  // odd: the sign of zero kept
  EXPECT_EQ(detail::tanh_f32(inf), 1.0f);
  EXPECT_EQ(detail::tanh_f32(-inf), -1.0f);
  EXPECT_EQ(detail::tanh_f32(20.0f), 1.0f);
  EXPECT_EQ(detail::tanh_f32(-1e30f), -1.0f);
  EXPECT_TRUE(std::isnan(detail::tanh_f32(std::numeric_limits<float>::quiet_NaN())));
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(detail::tanh_f32(tiny), tiny);
  EXPECT_EQ(detail::tanh_f32(-1e-30f), -1e-30f);
  // Hand-worked values: tanh(0.5) = 0.46211715726..., tanh(1) = 0.76159415595..., tanh(-3) = -0.99505475368...
  EXPECT_EQ(detail::tanh_f32(0.5f), 0.46211715726f);
  EXPECT_EQ(detail::tanh_f32(1.0f), 0.76159415595f);
  EXPECT_EQ(detail::tanh_f32(-3.0f), -0.99505475368f);
  // Either side of the switch from the series to the exponential (|x| = 2^-6).
  for (float x : {0.015624999f, 0.015625f, 0.015625001f, -0.015625f}) {
    EXPECT_LE(ulps_apart(detail::tanh_f32(x), static_cast<float>(std::tanh(static_cast<double>(x)))), 1) << x;
  }
}

TEST(gelu_tanh_f32, vectorised_loops_give_the_functors_bits) {
  // Values over GELU's working range and beyond, with the edge cases planted; an odd length so that the
  // loops' scalar tails run too.
  std::vector<float> x, g;
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0);
  };
  for (int i = 0; i < 100003; ++i) {
    x.push_back((next() - 0.5f) * (i % 3 == 0 ? 20.0f : 6.0f));
    g.push_back((next() - 0.5f) * 2.0f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float cases[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f,
                         std::numeric_limits<float>::denorm_min(), -1e-40f, 3e38f, -3e38f, 1e-3f, -9.5f};
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    x[i * 37] = cases[i];
    g[i * 41 + 1] = cases[i];
  }
  const double mode = 1;
  const GeluFn fwd(&mode);
  const GeluBackwardFn bwd(&mode);
  // Every path this CPU has (the dispatching entry points, then each path by name), against the functors.
  std::vector<float> y(x.size()), dx(x.size());
  const auto n = static_cast<std::int64_t>(x.size());
  int paths_run = 0;
  for (int p = -1; p <= static_cast<int>(cpu::GeluPath::avx512); ++p) {
    const auto path = static_cast<cpu::GeluPath>(p);
    if (p >= 0 && !cpu::gelu_path_available(path)) continue;
    std::fill(y.begin(), y.end(), 7.0f);
    std::fill(dx.begin(), dx.end(), 7.0f);
    if (p < 0) {
      cpu::gelu_tanh_f32(x.data(), y.data(), n);
      cpu::gelu_tanh_backward_f32(g.data(), x.data(), dx.data(), n);
    } else {
      cpu::gelu_tanh_f32_on(path, x.data(), y.data(), n);
      cpu::gelu_tanh_backward_f32_on(path, g.data(), x.data(), dx.data(), n);
      ++paths_run;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits(y[i]), bits(fwd(x[i]))) << "path " << p << ", forward at " << i << ", x = " << x[i];
      ASSERT_EQ(bits(dx[i]), bits(bwd(g[i], x[i])))
          << "path " << p << ", backward at " << i << ", g = " << g[i] << ", x = " << x[i];
    }
    // The forward that stores each tanh, and the backward from the stored tanh (issue 37): the same bits.
    std::vector<float> t(x.size(), 7.0f);
    std::fill(y.begin(), y.end(), 7.0f);
    std::fill(dx.begin(), dx.end(), 7.0f);
    if (p < 0) {
      cpu::gelu_tanh_save_f32(x.data(), y.data(), t.data(), n);
      cpu::gelu_tanh_backward_saved_f32(g.data(), x.data(), t.data(), dx.data(), n);
    } else {
      cpu::gelu_tanh_save_f32_on(path, x.data(), y.data(), t.data(), n);
      cpu::gelu_tanh_backward_saved_f32_on(path, g.data(), x.data(), t.data(), dx.data(), n);
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits(y[i]), bits(fwd(x[i]))) << "path " << p << ", saving forward at " << i << ", x = " << x[i];
      ASSERT_EQ(bits(dx[i]), bits(bwd(g[i], x[i])))
          << "path " << p << ", backward from the stored tanh at " << i << ", g = " << g[i] << ", x = " << x[i];
    }
  }
  EXPECT_GE(paths_run, 1);
  std::printf("gelu paths checked: %d (baseline%s%s)\n", paths_run,
              cpu::gelu_path_available(cpu::GeluPath::avx2) ? ", avx2" : "",
              cpu::gelu_path_available(cpu::GeluPath::avx512) ? ", avx512" : "");
  // And the values themselves: GELU computed in double from the same formula, within a few float ulps of
  // x (1 + tanh cancels for negative x, so the bound is on |x|, not on the small result).
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i];
    if (!std::isfinite(xd) || std::fabs(xd) > 1e3) continue;
    const double ref = 0.5 * xd * (1 + std::tanh(0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd)));
    EXPECT_NEAR(y[i], ref, 4e-7 * (std::fabs(ref) + std::fabs(xd)) + 1e-37) << "x = " << x[i];
  }
}

}  // namespace
}  // namespace ampscope
