// probes/analysis/f16_ranges.h checked against the project's exact conversions (core/float16.h, core/convert.h) and
// the probe's own binning (probe::histogram_bin): for every histogram bin, values of each source dtype that
// fall in it are rounded to f16 and what the rounding did must be what the bin's zone says. Exhaustive over
// every f32 value of the bins around f16's boundaries and over every f16 and bf16 pattern; strided over the
// other f32 bins; bf16's own boundaries likewise against the bf16 conversion.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <array>
#include <string>

#include "core/convert.h"
#include "core/float16.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/f16_ranges.h"
#include "probes/stats.h"

namespace ampscope::half_ranges {
namespace {

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// What rounding the value `v` (already rounded to f32, as the conversion does for f64) to a format gave,
// `r`, checked against the zone claimed for v's bin. Returns nullptr when they agree, else why not.
const char* disagreement(const Format& f, Zone zone, double v, double r) {
  const double a = std::fabs(v), ra = std::fabs(r);
  const double half_quantum = f.flush_threshold();  // half the spacing of subnormals
  switch (zone) {
    case Zone::flushes_to_zero:
      return ra == 0 ? nullptr : "did not flush to zero";
    case Zone::rounds_up:
      if (a == f.flush_threshold()) return ra == 0 ? nullptr : "the tie at the bin's bottom did not go to 0";
      return ra == f.smallest_subnormal() ? nullptr : "did not round up to the smallest subnormal";
    case Zone::subnormal:
      if (!(ra > 0 && ra <= f.smallest_normal())) return "not a subnormal (nor the smallest normal, at the top)";
      return std::fabs(ra - a) <= half_quantum ? nullptr : "rounded further than half a subnormal step";
    case Zone::normal:
      if (!std::isfinite(r)) return "overflowed";
      return ra >= f.smallest_normal() ? nullptr : "not normal";
    case Zone::partly_overflows:
      if (a >= f.overflow_threshold()) return std::isinf(r) ? nullptr : "at or above the overflow threshold but finite";
      return std::isfinite(r) && ra <= f.max_finite() ? nullptr : "below the overflow threshold but not finite";
    case Zone::overflows:
      return std::isinf(r) ? nullptr : "did not overflow";
    case Zone::zero:
      return v == 0 && r == 0 ? nullptr : "zero bin";
    case Zone::inf:
      return std::isinf(v) && std::isinf(r) ? nullptr : "inf bin";
    case Zone::nan:
      return std::isnan(v) && std::isnan(r) ? nullptr : "nan bin";
  }
  return "unknown zone";
}

// What a rounding gave, as bits of a mask: the outcomes met in a bin.
enum Outcome : unsigned { kGotZero = 1, kGotFinite = 2, kGotInf = 4, kGotNan = 8 };
unsigned outcome(double r) { return r == 0 ? kGotZero : std::isinf(r) ? kGotInf : std::isnan(r) ? kGotNan : kGotFinite; }

// Tallies one source dtype's values: the outcomes met in each bin, and the first disagreements.
struct Sweep {
  const Format& format;
  std::string dtype;
  std::int64_t checked = 0, failures = 0;
  std::string first_failures{};
  std::array<unsigned, trace::kHistBins> outcomes{};  // per bin: the Outcome bits met there

  std::array<Zone, trace::kHistBins> zones = [this] {
    std::array<Zone, trace::kHistBins> z{};
    for (int b = 0; b < trace::kHistBins; ++b) z[static_cast<std::size_t>(b)] = f16_bin_zone(b, dtype);
    return z;
  }();

  void check(int bin, double v, double r) {
    ++checked;
    const Zone zone = zones[static_cast<std::size_t>(bin)];
    outcomes[static_cast<std::size_t>(bin)] |= outcome(r);
    const char* why = disagreement(format, zone, v, r);
    if (why == nullptr) return;
    if (++failures <= 5)
      first_failures += fmt::format("  {} value {:a} in bin {} ({}): {} -> {:a}\n", dtype, v, bin, zone_name(zone), why, r);
  }
};

double to_f16(float v) { return static_cast<float>(f16(v)); }

// Each bin whose zone is "partly" something must actually hold both kinds of result.
void expect_partial_bins_hold_both(const Sweep& s) {
  for (int bin = 0; bin < trace::kHistBins; ++bin) {
    const unsigned seen = s.outcomes[static_cast<std::size_t>(bin)];
    const Zone z = f16_bin_zone(bin, s.dtype);
    if (z == Zone::partly_overflows && seen != 0) {
      EXPECT_EQ(seen, kGotInf | kGotFinite) << s.dtype << " bin " << bin << " should partly overflow";
    }
    if (z == Zone::rounds_up && seen != 0) {
      EXPECT_EQ(seen, kGotZero | kGotFinite) << s.dtype << " bin " << bin << " should partly round up";
    }
  }
}

TEST(f16_ranges_test, boundaries_are_where_the_conversions_put_them) {
  // f16: 65504 is the largest finite; up to just below 65520 rounds to it; 65520 is inf.
  EXPECT_EQ(to_f16(static_cast<float>(kF16.max_finite())), 65504.0);
  EXPECT_EQ(to_f16(std::nextafter(static_cast<float>(kF16.overflow_threshold()), 0.0f)), 65504.0);
  EXPECT_TRUE(std::isinf(to_f16(static_cast<float>(kF16.overflow_threshold()))));
  // 2^-25 ties to 0, the next float above it rounds up to 2^-24.
  EXPECT_EQ(to_f16(static_cast<float>(kF16.flush_threshold())), 0.0);
  EXPECT_EQ(to_f16(std::nextafter(static_cast<float>(kF16.flush_threshold()), 1.0f)), kF16.smallest_subnormal());
  EXPECT_EQ(f16(static_cast<float>(kF16.smallest_subnormal())).bits, 0x0001u);
  EXPECT_EQ(f16(static_cast<float>(kF16.smallest_normal())).bits, 0x0400u);
  EXPECT_EQ(f16(static_cast<float>(kF16.max_finite())).bits, 0x7BFFu);
  // bf16 likewise.
  const auto to_bf16 = [](float v) { return static_cast<double>(static_cast<float>(bf16(v))); };
  EXPECT_EQ(bf16(static_cast<float>(kBf16.max_finite())).bits, 0x7F7Fu);
  EXPECT_EQ(to_bf16(std::nextafter(static_cast<float>(kBf16.overflow_threshold()), 0.0f)), kBf16.max_finite());
  EXPECT_TRUE(std::isinf(to_bf16(static_cast<float>(kBf16.overflow_threshold()))));
  EXPECT_EQ(to_bf16(static_cast<float>(kBf16.flush_threshold())), 0.0);
  EXPECT_EQ(to_bf16(std::nextafter(static_cast<float>(kBf16.flush_threshold()), 1.0f)), kBf16.smallest_subnormal());
  EXPECT_EQ(bf16(static_cast<float>(kBf16.smallest_subnormal())).bits, 0x0001u);
  EXPECT_EQ(bf16(static_cast<float>(kBf16.smallest_normal())).bits, 0x0080u);
}

TEST(f16_ranges_test, the_bins_at_f16s_edges_are_the_ones_that_are_only_partly_lost) {
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(-26), "f32"), Zone::flushes_to_zero);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(-25), "f32"), Zone::rounds_up);  // not "flush to zero"
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(-24), "f32"), Zone::subnormal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(-15), "f32"), Zone::subnormal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(-14), "f32"), Zone::normal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(14), "f32"), Zone::normal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(15), "f32"), Zone::partly_overflows);  // [65520, 65536) is inf
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(16), "f32"), Zone::overflows);
  // An f16 or bf16 tensor holds nothing in [65520, 65536): its bin 15 is finite in f16.
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(15), "f16"), Zone::normal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(15), "bf16"), Zone::normal);
  EXPECT_EQ(f16_bin_zone(bin_of_exponent(15), "i64"), Zone::partly_overflows);
  // The subnormal bin: an f16 tensor's subnormals stay; any other dtype's (below 2^-64) flush.
  EXPECT_EQ(f16_bin_zone(kSubnormalBin, "f16"), Zone::subnormal);
  EXPECT_EQ(f16_bin_zone(kSubnormalBin, "f32"), Zone::flushes_to_zero);
  EXPECT_EQ(f16_bin_zone(kSubnormalBin, "bf16"), Zone::flushes_to_zero);
  EXPECT_EQ(f16_bin_zone(kZeroBin, "f32"), Zone::zero);
  EXPECT_EQ(f16_bin_zone(kInfBin, "f32"), Zone::inf);
  EXPECT_EQ(f16_bin_zone(kNanBin, "f32"), Zone::nan);
  EXPECT_THROW(f16_bin_zone(-1, "f32"), Error);
  EXPECT_THROW(f16_bin_zone(trace::kHistBins, "f32"), Error);
}

TEST(f16_ranges_test, every_f32_value_of_the_bins_at_f16s_boundaries_rounds_as_its_bin_says) {
  Sweep s{kF16, "f32"};
  // Every positive f32 of the bins at and beside f16's edges (2^23 values each), and a stride through all
  // the others (finite and not), the f32 subnormals included.
  auto sweep_exponent = [&](int e) {
    const std::uint32_t first = static_cast<std::uint32_t>(e + 127) << 23;
    for (std::uint32_t u = first; u < first + (1u << 23); ++u) {
      const float v = bits_float(u);
      s.check(probe::histogram_bin(v, DType::f32), v, to_f16(v));
    }
  };
  for (int e : {-27, -26, -25, -24, -23, -15, -14, 14, 15, 16}) sweep_exponent(e);
  for (std::uint64_t u = 0; u <= 0x7FFFFFFFu; u += 4093) {
    const float v = bits_float(static_cast<std::uint32_t>(u));
    s.check(probe::histogram_bin(v, DType::f32), v, to_f16(v));
  }
  for (float v : {0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
    s.check(probe::histogram_bin(v, DType::f32), v, to_f16(v));
  }
  EXPECT_EQ(s.failures, 0) << s.failures << " of " << s.checked << " values disagree, first:\n" << s.first_failures;
  EXPECT_GT(s.checked, 10 * (1 << 23));
  expect_partial_bins_hold_both(s);
  // Every exponent bin and every special bin was met, and the partial ones with both outcomes.
  for (int bin = 0; bin < trace::kHistBins; ++bin) EXPECT_NE(s.outcomes[static_cast<std::size_t>(bin)], 0u) << bin;
  EXPECT_EQ(s.outcomes[static_cast<std::size_t>(bin_of_exponent(15))], kGotInf | kGotFinite);
  EXPECT_EQ(s.outcomes[static_cast<std::size_t>(bin_of_exponent(-25))], kGotZero | kGotFinite);
}

TEST(f16_ranges_test, every_f16_and_bf16_pattern_rounds_to_f16_as_its_bin_says) {
  Sweep halves{kF16, "f16"}, brains{kF16, "bf16"};
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const float h = static_cast<float>(f16::from_bits(static_cast<std::uint16_t>(b)));
    halves.check(probe::histogram_bin(h, DType::f16), h, to_f16(h));
    const float w = static_cast<float>(bf16::from_bits(static_cast<std::uint16_t>(b)));
    brains.check(probe::histogram_bin(w, DType::bf16), w, to_f16(w));
  }
  EXPECT_EQ(halves.failures, 0) << halves.first_failures;
  EXPECT_EQ(brains.failures, 0) << brains.first_failures;
  expect_partial_bins_hold_both(brains);
  // An f16 tensor's subnormal bin was met, and kept (the bin's zone says subnormal).
  EXPECT_EQ(halves.outcomes[kSubnormalBin], kGotFinite);
  // bf16 has values in bin -25: 2^-25 goes to 0, the others round up.
  EXPECT_EQ(brains.outcomes[static_cast<std::size_t>(bin_of_exponent(-25))], kGotZero | kGotFinite);
}

TEST(f16_ranges_test, f64_values_round_through_f32_as_their_bins_say) {
  // core/convert.h rounds f64 to f32 first, then to f16 (as PyTorch): the zone is checked against the f32
  // value the conversion actually rounds.
  Sweep s{kF16, "f64"};
  for (int e = trace::kHistMinExponent - 2; e <= trace::kHistMaxExponent + 2; ++e) {
    for (int k = 0; k < 4096; ++k) {
      const double v = std::ldexp(1.0 + k / 4096.0 + 1e-9, e);
      const double r = static_cast<float>(convert<f16>(v));
      s.check(probe::histogram_bin(v, DType::f64), static_cast<float>(v), r);
    }
    const double top = std::nextafter(std::ldexp(1.0, e + 1), 0.0);
    s.check(probe::histogram_bin(top, DType::f64), static_cast<float>(top), static_cast<float>(convert<f16>(top)));
  }
  EXPECT_EQ(s.failures, 0) << s.first_failures;
  expect_partial_bins_hold_both(s);
}

TEST(f16_ranges_test, bf16s_boundaries_classify_f32_values_as_the_bf16_conversion_rounds_them) {
  // exponent_zone is format-generic: bf16's edges (2^-134 .. 2^-125, 2^126 .. 2^127) over every f32 there.
  const auto to_bf16 = [](float v) { return static_cast<double>(static_cast<float>(bf16(v))); };
  std::int64_t failures = 0, checked = 0;
  std::string first;
  std::array<unsigned, 400> seen_at{};  // exponent + 200 -> Outcome bits
  auto seen = [&](int e) -> unsigned& { return seen_at[static_cast<std::size_t>(e + 200)]; };
  auto check = [&](float v) {
    const int e = std::ilogb(v);
    const Zone z = exponent_zone(kBf16, e, dtype_fraction_bits("f32"));
    const double r = to_bf16(v);
    seen(e) |= outcome(r);
    ++checked;
    const char* why = disagreement(kBf16, z, v, r);
    if (why != nullptr && ++failures <= 5) first += fmt::format("  {:a} (e {}, {}): {} -> {:a}\n", v, e, zone_name(z), why, r);
  };
  // bf16's flush/round-up/subnormal edges lie among f32's subnormals (2^-149 .. 2^-126): every one with
  // exponent -136 .. -131 (f32 subnormals are slow to compute with: a stride through the others), then
  // every normal f32 of the bins at 2^-126 and at bf16's top.
  for (std::uint32_t u = 1; u < (1u << 23); u += (u >= (1u << 13) && u < (1u << 19)) ? 1 : 61) check(bits_float(u));
  for (int e : {-126, 126, 127})
    for (std::uint32_t u = static_cast<std::uint32_t>(e + 127) << 23, n = 0; n < (1u << 23); ++u, ++n) check(bits_float(u));
  EXPECT_EQ(failures, 0) << failures << " of " << checked << ", first:\n" << first;
  EXPECT_EQ(exponent_zone(kBf16, -134, 23), Zone::rounds_up);
  EXPECT_EQ(seen(-134), kGotZero | kGotFinite);
  EXPECT_EQ(exponent_zone(kBf16, 127, 23), Zone::partly_overflows);
  EXPECT_EQ(seen(127), kGotInf | kGotFinite);
  EXPECT_EQ(exponent_zone(kBf16, 127, dtype_fraction_bits("bf16")), Zone::normal);
  EXPECT_EQ(float_bits(static_cast<float>(kBf16.smallest_normal())), 0x00800000u);
}

TEST(f16_ranges_test, a_rows_counts_by_zone_depend_on_the_tensors_dtype) {
  trace::HistogramRow row;
  row.bins[static_cast<std::size_t>(bin_of_exponent(-30))] = 3;
  row.bins[static_cast<std::size_t>(bin_of_exponent(-25))] = 4;
  row.bins[static_cast<std::size_t>(bin_of_exponent(-20))] = 5;
  row.bins[static_cast<std::size_t>(bin_of_exponent(0))] = 100;
  row.bins[static_cast<std::size_t>(bin_of_exponent(15))] = 6;
  row.bins[static_cast<std::size_t>(bin_of_exponent(16))] = 7;
  row.bins[kSubnormalBin] = 2;
  row.bins[kZeroBin] = 11;
  row.bins[kInfBin] = 7101;
  row.bins[kNanBin] = 1;
  const ZoneCounts f32 = f16_zone_counts(row, "f32");
  EXPECT_EQ(f32[Zone::flushes_to_zero], 3 + 2);
  EXPECT_EQ(f32[Zone::rounds_up], 4);
  EXPECT_EQ(f32[Zone::subnormal], 5);
  EXPECT_EQ(f32[Zone::normal], 100);
  EXPECT_EQ(f32[Zone::partly_overflows], 6);
  EXPECT_EQ(f32[Zone::overflows], 7);
  EXPECT_EQ(f32[Zone::inf], 7101);
  EXPECT_EQ(f32.below_f16(), 9);
  EXPECT_EQ(f32.nonzero_finite(), 3 + 4 + 5 + 100 + 6 + 7 + 2);
  const ZoneCounts h = f16_zone_counts(row, "f16");
  EXPECT_EQ(h[Zone::subnormal], 5 + 2);
  EXPECT_EQ(h[Zone::normal], 106);
  EXPECT_EQ(h[Zone::partly_overflows], 0);
}

// The analysis's below_f16 warning counts with the same zones: bin -25 is below 2^-24 (it rounds up to it),
// and an f16 gradient's subnormal bin holds f16 subnormals, which are kept, not values below f16.
analysis::Report analyse_gradient_histogram(const std::string& dtype, const trace::HistogramRow& h) {
  analysis::Analyser a;
  trace::RunInfo run;
  run.precision = "fp16";
  a.set_run(run);
  trace::StepRow s;
  s.scale = s.scale_after = 65536;
  trace::GradRow g;
  g.param = h.tensor;
  g.dtype = dtype;
  g.norm = g.absmax = 1e-5;
  a.add_step(0, &s, {}, std::span<const trace::GradRow>(&g, 1), {}, std::span<const trace::HistogramRow>(&h, 1));
  return a.finish();
}

TEST(f16_ranges_test, the_analysis_counts_values_below_f16_by_the_same_zones) {
  trace::HistogramRow h;
  h.seq = -1;
  h.tensor = "fc1.weight";
  h.bins[static_cast<std::size_t>(bin_of_exponent(-25))] = 60;
  h.bins[static_cast<std::size_t>(bin_of_exponent(-14))] = 40;
  const analysis::Report f32 = analyse_gradient_histogram("f32", h);
  ASSERT_EQ(f32.warnings.size(), 1u);
  EXPECT_EQ(f32.warnings[0].kind, "below_f16");
  EXPECT_DOUBLE_EQ(f32.warnings[0].fraction, static_cast<double>(f16_zone_counts(h, "f32").below_f16()) / 100);
  EXPECT_DOUBLE_EQ(f32.warnings[0].fraction, 0.6);

  trace::HistogramRow sub;
  sub.seq = -1;
  sub.tensor = "fc1.weight";
  sub.bins[kSubnormalBin] = 60;
  sub.bins[static_cast<std::size_t>(bin_of_exponent(-14))] = 40;
  EXPECT_EQ(f16_zone_counts(sub, "f16").below_f16(), 0);
  for (const auto& w : analyse_gradient_histogram("f16", sub).warnings) EXPECT_NE(w.kind, "below_f16") << w.message;
  // The same bins in an f32 gradient are below 2^-64: they flush.
  const analysis::Report wide = analyse_gradient_histogram("f32", sub);
  ASSERT_EQ(wide.warnings.size(), 1u);
  EXPECT_EQ(wide.warnings[0].kind, "below_f16");
}

}  // namespace
}  // namespace ampscope::half_ranges
