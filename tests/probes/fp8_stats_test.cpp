// The probe's FP8 operand statistics (/fp8 rows, probes/stats.h fp8_operand_row, from core/fp8_linear.h's
// Fp8QuantizeEvent): on a hand-built tensor with a known scale, and on random tensors in both formats, the
// counts of values that underflow to zero (-0 included), become subnormal codes or saturate at +-max, and the
// relative RMS error, equal those this test computes with its own quantizer: the nearest of the values the
// format's formula decodes, searched in double, ties to the even code.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/fp8_linear.h"
#include "core/probe_hook.h"
#include "core/tensor.h"
#include "probes/probe.h"
#include "probes/stats.h"
#include "tests/probes/memory_sink.h"

namespace ampscope {
namespace {

struct Format {
  Fp8Format format;
  int exponent_bits, mantissa_bits, bias;
  double max, min_normal;
};
constexpr Format kE4M3{Fp8Format::e4m3, 4, 3, 7, 448.0, 0x1p-6};
constexpr Format kE5M2{Fp8Format::e5m2, 5, 2, 15, 57344.0, 0x1p-14};

// The format's non-negative finite values by the OCP formula, indexed by code (0x00 to the largest finite).
std::vector<double> finite_values(const Format& f) {
  std::vector<double> v;
  const int top = (1 << f.exponent_bits) - 1;
  for (int c = 0; c < 128; ++c) {
    const int e = c >> f.mantissa_bits, m = c & ((1 << f.mantissa_bits) - 1);
    const double value = e == 0 ? m * std::ldexp(1.0, 1 - f.bias - f.mantissa_bits)
                                : std::ldexp(1.0 + m / double(1 << f.mantissa_bits), e - f.bias);
    // E4M3: only S.1111.111 is NaN; E5M2: the top exponent is inf and NaN.
    if (f.format == Fp8Format::e4m3 ? (e == top && m == (1 << f.mantissa_bits) - 1) : e == top) break;
    v.push_back(value);
  }
  return v;
}

// |x| rounded to the nearest finite value, ties to the even code, past max held at max (satfinite).
double reference_magnitude(double y, const Format& f) {
  static const std::vector<double> e4m3 = finite_values(kE4M3), e5m2 = finite_values(kE5M2);
  const std::vector<double>& v = f.format == Fp8Format::e4m3 ? e4m3 : e5m2;
  y = std::fabs(y);
  if (y >= v.back()) return v.back();
  std::size_t best = 0;
  for (std::size_t c = 1; c < v.size(); ++c) {
    const double d = std::fabs(v[c] - y), bd = std::fabs(v[best] - y);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return v[best];
}

struct Expected {
  std::int64_t nonzero = 0, underflow = 0, subnormal = 0, saturated = 0;
  double rel_rms_error = 0;
};

// The counts by this test's own rule: y = fl(x * scale) (the cast multiplies in float), its reference value q;
// underflow when q is 0, subnormal when 0 < q < the smallest normal, saturated when |y| > max.
Expected expected_counts(const std::vector<float>& x, float scale, const Format& f) {
  Expected e;
  double err = 0, ref = 0;
  for (float v : x) {
    if (std::isnan(v)) continue;
    const float y = v * scale;
    const double q = reference_magnitude(y, f);
    if (v != 0.0f) {
      ++e.nonzero;
      if (q == 0) ++e.underflow;
      else if (q < f.min_normal) ++e.subnormal;
      if (std::fabs(static_cast<double>(y)) > f.max) ++e.saturated;
    }
    if (std::isinf(v)) continue;
    const double deq = static_cast<double>(static_cast<float>(std::copysign(q, y)) * (1.0f / scale));
    err += (deq - v) * (deq - v);
    ref += static_cast<double>(v) * v;
  }
  e.rel_rms_error = ref > 0 ? std::sqrt(err / ref) : 0;
  return e;
}

Tensor row_of(const std::vector<float>& v) {
  Tensor t = Tensor::empty({1, static_cast<std::int64_t>(v.size())}, {DType::f32, Device::cpu()});
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

// A sink that keeps the /fp8 rows as well.
struct Fp8Sink : testing::MemorySink {
  using MemorySink::write;
  std::vector<trace::Fp8Row> fp8;
  void write(const trace::Fp8Row& r) override { fp8.push_back(r); }
};

// Quantizes `x` as `operand` of module "fc1" with the delayed state's scale set to `scale`, inside step 0 of an
// installed probe, and returns the probe's row.
trace::Fp8Row probed_row(const std::vector<float>& x, float scale, Fp8Operand operand, Fp8FormatMix mix) {
  auto sink = std::make_shared<Fp8Sink>();
  {
    probe::HookGuard guard(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::health}));
    probe::StepScope scope(0);
    Fp8Options options{.recipe = Fp8Recipe::delayed, .formats = mix};
    Fp8LinearState state{make_delayed_scaling_state(options.delayed), make_delayed_scaling_state(options.delayed),
                         make_delayed_scaling_state(options.delayed)};
    state.operand(operand).scale = scale;
    state.operand(operand).scale_inv = 1.0f / scale;
    (void)fp8_quantize_operand(row_of(x), operand, options, &state, "fc1");
    scope.end({.step = 0});
  }
  EXPECT_EQ(sink->fp8.size(), 1u);
  return sink->fp8.empty() ? trace::Fp8Row{} : sink->fp8.front();
}

TEST(fp8_stats_test, a_hand_built_tensor_gives_the_fractions_counted_by_hand) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  // E4M3 at scale 2: the smallest subnormal is 2^-9, the smallest normal 2^-6, max 448. x * 2:
  const std::vector<float> x = {
      0.0f, -0.0f, nan,           // not nonzero: left out of every fraction
      1e-4f, -1e-4f, 0x1p-11f,    // 2e-4, -2e-4 (to the code -0, 0x80), 2^-10 (a tie between 0 and 2^-9: to 0): underflow
      0.004f, -0.003f, 0.0073f,   // 0.008, -0.006, 0.0146 (< 2^-6 - 2^-10): subnormal codes 4, 3, 7
      0.00733f, 0.5f, 224.0f,     // 0.01466 (rounds up to 2^-6), 1, 448 exactly: normal, not saturated
      230.0f, -300.0f, inf};      // 460, -600, inf: above 448, held at +-448: saturated
  const trace::Fp8Row r = probed_row(x, 2.0f, Fp8Operand::input, Fp8FormatMix::hybrid);
  EXPECT_EQ(r.step, 0);
  EXPECT_EQ(r.module, "fc1");
  EXPECT_EQ(r.operand, "input");
  EXPECT_EQ(r.format, "e4m3");
  EXPECT_EQ(r.numel, 15);
  EXPECT_EQ(r.nonzero, 12);
  EXPECT_EQ(r.underflow, 3);
  EXPECT_EQ(r.subnormal, 3);
  EXPECT_EQ(r.saturated, 3);
  EXPECT_DOUBLE_EQ(trace::fp8_fraction(r.underflow, r.nonzero), 0.25);
  EXPECT_EQ(r.scale, 2.0);
  EXPECT_EQ(r.amax, inf);  // the cast's amax: NaN skipped, inf wins
  const Expected e = expected_counts(x, 2.0f, kE4M3);
  EXPECT_EQ(e.nonzero, 12);  // the reference quantizer agrees with the hand count
  EXPECT_EQ(e.underflow, 3);
  EXPECT_EQ(e.subnormal, 3);
  EXPECT_EQ(e.saturated, 3);
  EXPECT_NEAR(r.rel_rms_error, e.rel_rms_error, 1e-12 * e.rel_rms_error);
  // By hand: -300 dequantizes to -448 / 2 = -224 (error 76), 230 to 224 (error 6), the rest by far less; sum x^2 is
  // about 224^2 + 230^2 + 300^2 = 193076: sqrt((76^2 + 6^2) / 193076) = 0.1735.
  EXPECT_NEAR(r.rel_rms_error, 0.1735, 0.0005);
}

TEST(fp8_stats_test, random_tensors_in_both_formats_match_the_reference_counts) {
  std::mt19937_64 rng(34);
  std::uniform_real_distribution<double> exponent(-30.0, 20.0);
  std::uniform_int_distribution<int> pick(0, 99);
  struct Case {
    Fp8Operand operand;
    Fp8FormatMix mix;
    const Format* format;
    float scale;
  };
  const Case cases[] = {{Fp8Operand::input, Fp8FormatMix::hybrid, &kE4M3, 448.0f / 3.0f},
                        {Fp8Operand::weight, Fp8FormatMix::e4m3, &kE4M3, 1.0f},
                        {Fp8Operand::grad_output, Fp8FormatMix::hybrid, &kE5M2, 1024.0f},
                        {Fp8Operand::grad_output, Fp8FormatMix::e4m3, &kE4M3, 0.0625f}};
  for (const Case& c : cases) {
    std::vector<float> x(20000);
    for (float& v : x) {
      const int k = pick(rng);
      v = k == 0 ? 0.0f : k == 1 ? -0.0f : static_cast<float>((k % 2 ? -1 : 1) * std::exp2(exponent(rng)));
    }
    const trace::Fp8Row r = probed_row(x, c.scale, c.operand, c.mix);
    const Expected e = expected_counts(x, c.scale, *c.format);
    SCOPED_TRACE(r.operand + " " + r.format);
    EXPECT_EQ(r.format, c.format == &kE4M3 ? "e4m3" : "e5m2");
    EXPECT_EQ(r.nonzero, e.nonzero);
    EXPECT_EQ(r.underflow, e.underflow);
    EXPECT_EQ(r.subnormal, e.subnormal);
    EXPECT_EQ(r.saturated, e.saturated);
    EXPECT_GT(e.underflow, 0);  // the exponents' range reaches each category
    EXPECT_GT(e.subnormal, 0);
    EXPECT_GT(e.saturated, 0);
    EXPECT_NEAR(r.rel_rms_error, e.rel_rms_error, 1e-12 * e.rel_rms_error);
  }
}

// No hook: nothing reported; a hook that is not recording (level off) writes no row.
TEST(fp8_stats_test, a_probe_at_level_off_writes_no_fp8_rows) {
  auto sink = std::make_shared<Fp8Sink>();
  probe::HookGuard guard(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::off}));
  probe::StepScope scope(0);
  Fp8Options options{.recipe = Fp8Recipe::current};
  (void)fp8_quantize_operand(row_of({1.0f, 2.0f}), Fp8Operand::input, options, nullptr, "fc1");
  scope.end({.step = 0});
  EXPECT_TRUE(sink->fp8.empty());
}

}  // namespace
}  // namespace ampscope
