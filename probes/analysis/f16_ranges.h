// probes/analysis/f16_ranges.h: one definition of where f16's (and bf16's) values end, and what becomes of the values
// of an exponent bin of the trace's histograms (docs/trace-format.md, /histograms) once rounded to f16. The
// analysis (below_f16 warnings) and the viewer (Op detail's histogram, its zones and counts) both use it, so
// they cannot disagree. Header only, no runtime: the viewer links only the trace reader and the analysis.
//
// Conversions round to nearest, ties to even (core/float16.h, docs/numerics.md), so the boundaries are not
// the powers of two one might guess:
//   - f16's largest finite value is 65504, but every |x| < 65520 rounds to a finite value; 65520 (half-way
//     to 2^16) ties to the even pattern, which is inf. So bin 15 ([2^15, 2^16)) partly overflows.
//   - f16's smallest subnormal is 2^-24; |x| = 2^-25 (half-way to 0) ties to 0, but everything in
//     (2^-25, 2^-24) rounds UP to 2^-24. So bin -25 does not flush to zero: all but its lowest value round up.
//
//   using namespace ampscope::half_ranges;
//   f16_bin_zone(bin_of_exponent(15), "f32");   // Zone::partly_overflows (from 65520: inf)
//   f16_bin_zone(bin_of_exponent(15), "f16");   // Zone::normal (an f16 tensor holds nothing above 65504)
//   f16_bin_zone(bin_of_exponent(-25), "f32");  // Zone::rounds_up (to 2^-24; exactly 2^-25 gives 0)
//   ZoneCounts c = f16_zone_counts(row, op.out_dtype);  // c[Zone::flushes_to_zero], c[Zone::inf], ...
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "probes/trace/schema.h"

namespace ampscope::half_ranges {

// 2^k, exactly, at compile time.
constexpr double pow2(int k) {
  double v = 1;
  for (; k > 0; --k) v *= 2;
  for (; k < 0; ++k) v /= 2;
  return v;
}

// A binary floating format with IEEE subnormals, seen through round-to-nearest-even conversion.
struct Format {
  std::string_view name;
  int fraction_bits;        // stored mantissa bits: 10 (f16), 7 (bf16)
  int max_exponent;         // floor(log2) of the largest finite value: 15, 127
  int min_normal_exponent;  // of the smallest normal value: -14, -126

  constexpr int min_subnormal_exponent() const { return min_normal_exponent - fraction_bits; }  // -24, -133
  constexpr double max_finite() const { return (2 - pow2(-fraction_bits)) * pow2(max_exponent); }
  // The smallest magnitude that rounds to inf: half-way between max_finite and 2^(max_exponent + 1); the
  // tie goes to the even pattern, which is inf.
  constexpr double overflow_threshold() const { return (2 - pow2(-fraction_bits - 1)) * pow2(max_exponent); }
  constexpr double smallest_normal() const { return pow2(min_normal_exponent); }
  constexpr double smallest_subnormal() const { return pow2(min_subnormal_exponent()); }
  // Magnitudes up to and including this one round to 0: half the smallest subnormal (the tie goes to 0,
  // the even pattern); anything above it rounds to the smallest subnormal or more.
  constexpr double flush_threshold() const { return pow2(min_subnormal_exponent() - 1); }
};

inline constexpr Format kF16{"f16", 10, 15, -14};
inline constexpr Format kBf16{"bf16", 7, 127, -126};

static_assert(kF16.max_finite() == 65504.0 && kF16.overflow_threshold() == 65520.0);
static_assert(kF16.smallest_normal() == 0x1p-14 && kF16.smallest_subnormal() == 0x1p-24 && kF16.flush_threshold() == 0x1p-25);
static_assert(kBf16.max_finite() == 0x1.fep127 && kBf16.overflow_threshold() == 0x1.ffp127);
static_assert(kBf16.smallest_subnormal() == 0x1p-133);

// What becomes of the values of one bin when rounded to a format.
enum class Zone : std::uint8_t {
  flushes_to_zero,   // every value rounds to +-0
  rounds_up,         // [2^(s-1), 2^s), s = the smallest subnormal's exponent: 2^(s-1) itself ties to 0, every
                     // larger value rounds up to the smallest subnormal 2^s (precision: none)
  subnormal,         // kept as a subnormal with fewer significant bits (the band's top may round up to the
                     // smallest normal)
  normal,            // rounds to a finite normal value
  partly_overflows,  // [2^M, 2^(M+1)), M = max_exponent, for values finer than the format: from the overflow
                     // threshold (f16: 65520) on they round to inf, below it to a finite value
  overflows,         // every value rounds to inf
  zero,              // the histogram's zero, inf and NaN bins: they stay what they are
  inf,
  nan,
};
inline constexpr int kZones = 9;

constexpr std::string_view zone_name(Zone z) {
  switch (z) {
    case Zone::flushes_to_zero: return "flushes to zero";
    case Zone::rounds_up: return "rounds up to the smallest subnormal";
    case Zone::subnormal: return "subnormal";
    case Zone::normal: return "normal";
    case Zone::partly_overflows: return "partly overflows";
    case Zone::overflows: return "overflows";
    case Zone::zero: return "zero";
    case Zone::inf: return "inf";
    case Zone::nan: return "nan";
  }
  return "?";
}

// Stored mantissa bits of a tensor's dtype as the trace names it ("f16", "bf16", "f32", "f64"); integers,
// bool and unknown names get 64: any value of a bin may occur.
constexpr int dtype_fraction_bits(std::string_view dtype) {
  if (dtype == "f16") return 10;
  if (dtype == "bf16") return 7;
  if (dtype == "f32") return 23;
  if (dtype == "f64") return 52;
  return 64;
}

// The zone in `f` of the values with floor(log2|x|) = e, for values with `source_fraction_bits` bits of
// mantissa (the tensor's own dtype): the top bin only partly overflows when the source holds values finer
// than the format's (an f16 or bf16 tensor has nothing between 65504 and 2^16; an f32 one has 65520).
// f64 values are rounded to f32 first (core/convert.h, as PyTorch): within half an f32 ulp above 2^(s-1)
// they flush too, and the overflow threshold moves down by as much.
constexpr Zone exponent_zone(const Format& f, int e, int source_fraction_bits = 64) {
  if (e > f.max_exponent) return Zone::overflows;
  if (e == f.max_exponent) return source_fraction_bits > f.fraction_bits ? Zone::partly_overflows : Zone::normal;
  if (e >= f.min_normal_exponent) return Zone::normal;
  if (e >= f.min_subnormal_exponent()) return Zone::subnormal;
  if (e == f.min_subnormal_exponent() - 1) return Zone::rounds_up;
  return Zone::flushes_to_zero;
}

// The bins of trace::HistogramRow::bins: exponents kHistMinExponent .. kHistMaxExponent (the top one also
// counts every larger value), then subnormal (subnormal in the tensor's dtype, or below 2^kHistMinExponent),
// zero, inf (either sign), NaN.
inline constexpr int kExponentBins = trace::kHistMaxExponent - trace::kHistMinExponent + 1;
inline constexpr int kSubnormalBin = kExponentBins, kZeroBin = kExponentBins + 1, kInfBin = kExponentBins + 2,
                     kNanBin = kExponentBins + 3;
static_assert(kNanBin + 1 == trace::kHistBins);
constexpr int bin_of_exponent(int e) { return e - trace::kHistMinExponent; }
constexpr int exponent_of_bin(int bin) { return bin + trace::kHistMinExponent; }

// f16's range lies inside the bins' range, so the open-ended bins classify exactly: the top bin (2^63 and up)
// overflows, the subnormal bin of any dtype but f16 (below 2^-64) flushes.
static_assert(trace::kHistMaxExponent > kF16.max_exponent);
static_assert(trace::kHistMinExponent < kF16.min_subnormal_exponent() - 1);

// The zone in f16 of histogram bin `bin` of a tensor whose dtype is `dtype` (the op's output dtype, or the
// gradient's). Throws ampscope::Error for a bin outside 0 .. trace::kHistBins - 1.
inline Zone f16_bin_zone(int bin, std::string_view dtype) {
  if (bin < 0 || bin >= trace::kHistBins)
    throw Error("f16_bin_zone: bin " + std::to_string(bin) + " is outside 0 .. " + std::to_string(trace::kHistBins - 1));
  if (bin < kExponentBins) return exponent_zone(kF16, exponent_of_bin(bin), dtype_fraction_bits(dtype));
  if (bin == kSubnormalBin) return dtype == "f16" ? Zone::subnormal : Zone::flushes_to_zero;
  if (bin == kZeroBin) return Zone::zero;
  if (bin == kInfBin) return Zone::inf;
  return Zone::nan;
}

// A histogram row's values counted by their zone in f16.
struct ZoneCounts {
  std::array<std::int64_t, kZones> n{};
  std::int64_t operator[](Zone z) const { return n[static_cast<std::size_t>(z)]; }
  std::int64_t& operator[](Zone z) { return n[static_cast<std::size_t>(z)]; }
  // Below f16's smallest subnormal (2^-24): flushed to zero, or (just under it) rounded up to it.
  std::int64_t below_f16() const { return (*this)[Zone::flushes_to_zero] + (*this)[Zone::rounds_up]; }
  // Finite and non-zero.
  std::int64_t nonzero_finite() const {
    std::int64_t t = 0;
    for (int z = 0; z < kZones; ++z)
      if (z != static_cast<int>(Zone::zero) && z != static_cast<int>(Zone::inf) && z != static_cast<int>(Zone::nan))
        t += n[static_cast<std::size_t>(z)];
    return t;
  }
};

inline ZoneCounts f16_zone_counts(const trace::HistogramRow& row, std::string_view dtype) {
  ZoneCounts c;
  for (int b = 0; b < trace::kHistBins; ++b) c[f16_bin_zone(b, dtype)] += row.bins[static_cast<std::size_t>(b)];
  return c;
}

}  // namespace ampscope::half_ranges
