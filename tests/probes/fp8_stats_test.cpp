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

// The dynamic ranges of the hand-built tensor above, by hand: the finite nonzero magnitudes run from 1e-4 (as a
// float) to 300 (inf left out); what survives the cast at scale 2 runs from the subnormal code 3 (3 * 2^-9) to 448,
// log2(448 * 512 / 3) = 16.2224 binades (the scale cancels).
TEST(fp8_stats_test, the_dynamic_ranges_are_those_worked_by_hand) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f,   -0.0f, nan,     1e-4f, -1e-4f, 0x1p-11f, 0.004f, -0.003f,
                                0.0073f, 0.00733f, 0.5f, 224.0f, 230.0f, -300.0f, inf};
  const trace::Fp8Row r = probed_row(x, 2.0f, Fp8Operand::input, Fp8FormatMix::hybrid);
  EXPECT_NEAR(r.dynamic_range, std::log2(300.0 / static_cast<double>(1e-4f)), 1e-12);
  EXPECT_NEAR(r.dynamic_range, 21.5165, 5e-5);
  EXPECT_NEAR(r.quantized_dynamic_range, 16.22239, 5e-6);
  // One value: no range; nothing finite and nonzero: 0 as well.
  EXPECT_EQ(probed_row({0.0f, 3.0f, -3.0f}, 1.0f, Fp8Operand::weight, Fp8FormatMix::hybrid).dynamic_range, 0.0);
  const trace::Fp8Row none = probed_row({0.0f, nan, inf}, 1.0f, Fp8Operand::weight, Fp8FormatMix::hybrid);
  EXPECT_EQ(none.dynamic_range, 0.0);
  EXPECT_EQ(none.quantized_dynamic_range, 0.0);  // inf saturates to 448: finite, nonzero, alone
}

// The amax history's state over a run of steps (delayed scaling, history 3, driven through Fp8Context as training
// drives it), worked by hand from core/fp8_recipe.h's rules: h = [this step, older .. newer], a roll only when this
// step's slot is nonzero. Amaxes 2, 8 (a spike), 1, 0 (an all-zero operand: no roll), 1, 0.5:
//   step 0  h [2, 0, 0]   max 2 (this step)             rolls to [0, 0, 2]
//   step 1  h [8, 0, 2]   max 8 (this step)             rolls to [0, 2, 8]
//   step 2  h [1, 2, 8]   max 8 in slot 2: step 1        rolls to [0, 8, 1]
//   step 3  h [0, 8, 1]   slot 0 is 0: no roll, the scale is kept: history_amax 0, step -1
//   step 4  h [1, 8, 1]   max 8 in slot 1: two rolls back, step 1 (step 3 did not roll)   rolls to [0, 1, 1]
//   step 5  h [0.5, 1, 1] max 1 in slots 1 and 2: the older, step 2
// With most_recent the state is this step's amax (0 at step 3).
TEST(fp8_stats_test, the_history_state_names_the_amax_and_step_that_set_the_next_scale) {
  const std::vector<float> amaxes = {2, 8, 1, 0, 1, 0.5f};
  for (const bool most_recent : {false, true}) {
    SCOPED_TRACE(most_recent ? "most_recent" : "max");
    auto sink = std::make_shared<Fp8Sink>();
    {
      probe::HookGuard guard(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::health}));
      auto context = std::make_shared<Fp8Context>(Fp8Options{
          .recipe = Fp8Recipe::delayed,
          .delayed = {.history_len = 3, .algo = most_recent ? AmaxAlgo::most_recent : AmaxAlgo::max}});
      for (std::int64_t step = 0; step < 6; ++step) {
        probe::StepScope scope(step);
        const float a = amaxes[static_cast<std::size_t>(step)];
        (void)fp8_quantize_operand(row_of({a / 2, -a}), Fp8Operand::input, context->options(), &context->state("fc1"),
                                   "fc1");
        context->end_step();
        scope.end({.step = step});
      }
    }
    ASSERT_EQ(sink->fp8.size(), 6u);
    const std::vector<double> want_amax = most_recent ? std::vector<double>{2, 8, 1, 0, 1, 0.5}
                                                      : std::vector<double>{2, 8, 8, 0, 8, 1};
    const std::vector<std::int64_t> want_step = most_recent ? std::vector<std::int64_t>{0, 1, 2, -1, 4, 5}
                                                            : std::vector<std::int64_t>{0, 1, 1, -1, 1, 2};
    for (std::size_t i = 0; i < 6; ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(sink->fp8[i].history_len, 3);
      EXPECT_EQ(sink->fp8[i].history_amax, want_amax[i]);
      EXPECT_EQ(sink->fp8[i].history_amax_step, want_step[i]);
    }
    // The scale each step used is the one the previous step's state sets: 448 / history_amax (step 3 kept its).
    EXPECT_EQ(sink->fp8[2].scale, 448.0f / static_cast<float>(want_amax[1]));
    EXPECT_EQ(sink->fp8[4].scale, sink->fp8[3].scale);
    EXPECT_EQ(sink->fp8[5].scale, 448.0f / static_cast<float>(want_amax[4]));
  }
}

// Current scaling keeps no history; a history older than the casts the probe saw has no step for its slots.
TEST(fp8_stats_test, current_scaling_has_no_history_and_an_unseen_slot_has_no_step) {
  auto sink = std::make_shared<Fp8Sink>();
  {
    probe::HookGuard guard(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::health}));
    probe::StepScope scope(0);
    (void)fp8_quantize_operand(row_of({1.0f, 2.0f}), Fp8Operand::input, Fp8Options{.recipe = Fp8Recipe::current},
                               nullptr, "fc1");
    scope.end({.step = 0});
  }
  ASSERT_EQ(sink->fp8.size(), 1u);
  EXPECT_EQ(sink->fp8[0].history_len, 0);
  EXPECT_EQ(sink->fp8[0].history_amax, 0.0);
  EXPECT_EQ(sink->fp8[0].history_amax_step, -1);
  EXPECT_TRUE(trace::fp8_has_range_columns(sink->fp8[0]));

  probe::Fp8HistorySteps steps;
  steps.note_cast(10, 1.0f, 4);
  steps.note_cast(11, 0.0f, 4);  // no roll
  steps.note_cast(12, 1.0f, 4);
  steps.note_cast(12, 2.0f, 4);  // the same step again
  steps.note_cast(13, 1.0f, 4);
  // As of a cast in step 13 with a 4-entry history: slot 3 is the latest roll (12), slot 2 the one before (10),
  // slot 1 one the probe never saw.
  EXPECT_EQ(steps.slot_step(0, 4, 13), 13);
  EXPECT_EQ(steps.slot_step(3, 4, 13), 12);
  EXPECT_EQ(steps.slot_step(2, 4, 13), 10);
  EXPECT_EQ(steps.slot_step(1, 4, 13), -1);
  // Only as many steps as the history holds are kept: after 100 rolling steps, the oldest slot is 97 steps on.
  for (std::int64_t s = 14; s < 114; ++s) steps.note_cast(s, 1.0f, 4);
  EXPECT_EQ(steps.slot_step(1, 4, 113), 110);
  EXPECT_EQ(steps.slot_step(1, 4, 114), 111);
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
