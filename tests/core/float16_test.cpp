// tests/core/float16_test.cpp: proves that core/float16.h converts exactly as IEEE 754 says.
//
// What it proves:
//   * every one of the 65,536 f16 and 65,536 bf16 bit patterns widens to float exactly (f16: as the CPU's
//     own conversion does, bit for bit; bf16: `bits << 16`) and narrows back to the same bits, signalling
//     NaNs coming back quieted and nothing else changing;
//   * every one of the 2^32 float bit patterns narrows to f16 exactly as x86 F16C (`vcvtps2ph`, round to
//     nearest even) does, and to bf16 exactly as an independently written reference (nearest of the two
//     candidate neighbours, compared in exact double arithmetic, ties to even) does;
//   * the documented boundary facts of amp-semantics section 5 hold (expected values derived by hand);
//   * the public `f16` / `bf16` types do the same through their constructor, cast and `from_bits`;
//   * the CPU backend's bulk conversions (kernels/half_convert.h) give the same bits on both of their
//     paths, the F16C/AVX2 one and the portable one, for all 2^16 patterns and all 2^32 floats: each sweep
//     block is also converted by both bulk paths and compared with the same reference.
//
// How the exhaustive sweeps are done: the 2^32 inputs are cut into 2^20-element chunks that
// max(2, hardware_concurrency()) threads take from a shared atomic counter. Within a chunk, inputs are
// handled in blocks of 4096: the reference (F16C 8 lanes at a time, or the double-based bf16 reference)
// fills one array, the header's scalar conversion is compared against it, and each thread keeps a count of
// mismatches and the first few. A failure prints the total and the lowest mismatching inputs as
// (input bits, ours, reference), never billions of lines.
#include "core/float16.h"

#include <gtest/gtest.h>

#include "kernels/half_convert.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AMPSCOPE_TEST_X86 1
#else
#define AMPSCOPE_TEST_X86 0
#endif

// g++ defines __FLT16_MANT_DIG__ exactly when the target has _Float16.
#if defined(__FLT16_MANT_DIG__)
#define AMPSCOPE_TEST_HAS_FLOAT16 1
#else
#define AMPSCOPE_TEST_HAS_FLOAT16 0
#endif

namespace {

namespace cpu = ampscope::cpu;
using ampscope::bf16;
using ampscope::f16;
using ampscope::detail::bf16_bits_to_float;
using ampscope::detail::bits_float;
using ampscope::detail::f16_bits_to_float;
using ampscope::detail::float_bits;
using ampscope::detail::float_to_bf16_bits;
using ampscope::detail::float_to_f16_bits;

std::string hex(std::uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, static_cast<unsigned>(v));
  return buf;
}

bool f16_is_nan(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }
bool f16_is_signalling_nan(std::uint16_t h) { return f16_is_nan(h) && (h & 0x0200u) == 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0; }
bool bf16_is_signalling_nan(std::uint16_t b) { return bf16_is_nan(b) && (b & 0x0040u) == 0; }

// ---------------------------------------------------------------------------------------------------------
// The CPU's own f16 conversions: F16C where the CPU has it, otherwise g++'s _Float16 (libgcc soft-float).

#if AMPSCOPE_TEST_X86
__attribute__((target("f16c"))) float f16c_to_float(std::uint16_t h) { return _cvtsh_ss(h); }

// Converts n floats (n a multiple of 8) to f16 bits, 8 at a time, round to nearest even.
__attribute__((target("f16c,avx"))) void f16c_from_floats(const float* in, std::uint16_t* out,
                                                          std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
}
#endif

bool cpu_has_f16c() {
#if AMPSCOPE_TEST_X86 && !defined(AMPSCOPE_TEST_FORCE_SOFT_F16)  // the macro exercises the fallback
  return __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool have_reference_f16() { return cpu_has_f16c() || AMPSCOPE_TEST_HAS_FLOAT16; }

#if AMPSCOPE_TEST_HAS_FLOAT16
float soft_f16_to_float(std::uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}

std::uint16_t soft_f16_from_float(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  std::uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}
#endif

float reference_f16_to_float(std::uint16_t h) {
#if AMPSCOPE_TEST_X86
  if (cpu_has_f16c()) return f16c_to_float(h);
#endif
#if AMPSCOPE_TEST_HAS_FLOAT16
  return soft_f16_to_float(h);
#else
  (void)h;
  return std::numeric_limits<float>::quiet_NaN();  // unreachable: callers check have_reference_f16()
#endif
}

// ---------------------------------------------------------------------------------------------------------
// An independent float -> bf16 reference: no bit trick. For non-NaN x the answer is one of two neighbours,
// lo (the truncation, bits >> 16) and hi (lo + 1, the next pattern away from zero). Both are decoded to
// double, and the distances to x are compared in double, which is exact here (x, lo and hi all have at most
// 24 significant bits within a factor 2 of each other). The pattern 0x7F80 as hi stands for 2^128, the value
// an unbounded exponent range would give, so values at or past the midpoint (2-2^-8)*2^127 round to it and
// are reported as inf, as IEEE overflow under round-to-nearest requires.

std::uint16_t reference_bf16_bits(std::uint32_t u) {
  const float x = bits_float(u);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // contract: sign, top payload, quiet
  if (std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1u);
  const double xd = static_cast<double>(x);
  const double lo_value = static_cast<double>(bits_float(static_cast<std::uint32_t>(lo) << 16));
  const double hi_value = (hi & 0x7FFFu) == 0x7F80u
                              ? std::copysign(0x1p128, xd)
                              : static_cast<double>(bits_float(static_cast<std::uint32_t>(hi) << 16));
  const double to_lo = std::fabs(xd - lo_value);
  const double to_hi = std::fabs(hi_value - xd);
  if (to_lo < to_hi) return lo;
  if (to_hi < to_lo) return hi;
  return (lo & 1u) == 0 ? lo : hi;  // a tie: the even mantissa
}

// ---------------------------------------------------------------------------------------------------------
// The bulk paths: the fast one (F16C and AVX2; the portable one again on a CPU without them) and the
// portable one, called on the same block, as the bits they write.

// Turns the fast path on for the test's lifetime (whatever AMPSCOPE_NO_F16C says), and back as it was.
class FastPathOn {
 public:
  FastPathOn() : was_(cpu::f16c_active()) { cpu::set_f16c_enabled(true); }
  ~FastPathOn() { cpu::set_f16c_enabled(was_); }

 private:
  bool was_;
};

void bulk_narrow_f16(bool fast, const std::uint32_t* in, std::uint16_t* out, std::size_t n) {
  const float* f = reinterpret_cast<const float*>(in);
  ampscope::f16* h = reinterpret_cast<ampscope::f16*>(out);
  if (fast) {
    cpu::narrow_f16(f, h, static_cast<std::int64_t>(n));
  } else {
    cpu::narrow_f16_portable(f, h, static_cast<std::int64_t>(n));
  }
}

void bulk_narrow_bf16(bool fast, const std::uint32_t* in, std::uint16_t* out, std::size_t n) {
  const float* f = reinterpret_cast<const float*>(in);
  ampscope::bf16* b = reinterpret_cast<ampscope::bf16*>(out);
  if (fast) {
    cpu::narrow_bf16(f, b, static_cast<std::int64_t>(n));
  } else {
    cpu::narrow_bf16_portable(f, b, static_cast<std::int64_t>(n));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Sweep machinery.

struct Mismatch {
  std::uint32_t input;
  std::uint16_t ours;
  std::uint16_t reference;
};

constexpr std::size_t kMaxReported = 8;

struct SweepResult {
  std::uint64_t checked = 0;
  std::uint64_t mismatches = 0;
  std::vector<Mismatch> first;  // the lowest inputs that mismatched, at most kMaxReported

  void record(std::uint32_t input, std::uint16_t ours, std::uint16_t reference) {
    ++mismatches;
    if (first.size() < kMaxReported) first.push_back({input, ours, reference});
  }

  void merge(const SweepResult& other) {
    checked += other.checked;
    mismatches += other.mismatches;
    first.insert(first.end(), other.first.begin(), other.first.end());
    std::sort(first.begin(), first.end(),
              [](const Mismatch& a, const Mismatch& b) { return a.input < b.input; });
    if (first.size() > kMaxReported) first.resize(kMaxReported);
  }

  std::string report(const char* what) const {
    std::string s = std::to_string(mismatches) + " of " + std::to_string(checked) + " inputs mismatch (" +
                    what + "); first few as input -> ours vs reference:\n";
    for (const Mismatch& m : first) {
      s += "  " + hex(m.input, 8) + " -> " + hex(m.ours, 4) + " vs " + hex(m.reference, 4) + "\n";
    }
    return s;
  }
};

constexpr std::uint64_t kAllFloats = std::uint64_t{1} << 32;
constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;  // 4096 chunks of work
constexpr std::size_t kBlock = 4096;                      // inputs per reference/compare pass

unsigned sweep_threads() { return std::max(2u, std::thread::hardware_concurrency()); }

// Calls check_block(first_input, count, result) over all 2^32 inputs in blocks of kBlock, on several threads,
// and returns the merged result.
template <class CheckBlock>
SweepResult sweep_all_floats(CheckBlock check_block) {
  std::atomic<std::uint64_t> next_chunk{0};
  const unsigned n_threads = sweep_threads();
  std::vector<SweepResult> results(n_threads);
  std::vector<std::thread> threads;
  threads.reserve(n_threads);
  for (unsigned t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      SweepResult& local = results[t];
      for (;;) {
        const std::uint64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t begin = chunk * kChunk;
        if (begin >= kAllFloats) break;
        for (std::uint64_t b = begin; b < begin + kChunk; b += kBlock) {
          check_block(static_cast<std::uint32_t>(b), kBlock, local);
        }
        local.checked += kChunk;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  SweepResult total;
  for (const SweepResult& r : results) total.merge(r);
  return total;
}

#if AMPSCOPE_TEST_HAS_FLOAT16
// Without F16C, the scalar _Float16 conversion (libgcc soft-float, tens of ns each) is too slow for 2^32
// inputs, so the fallback checks a reduced set that still reaches every rounding decision:
//   * both signs x all 256 float exponents (zero/subnormal floats, every f16 subnormal shift 14..24, every
//     normal, the overflow exponents, inf/NaN);
//   * for every mantissa bit position p (0..22) that can be the "half" bit of some rounding: a kept part
//     that is zero, odd only, even-nonzero, or all ones (so both tie directions and the carry into the next
//     exponent happen), times a discarded part that is just below half, exactly half, just above half, and
//     all ones below the half bit;
//   * the all-zero and all-one mantissas, and 2^22 further inputs from a fixed linear congruential sequence.
std::vector<std::uint32_t> reduced_f16_inputs() {
  std::vector<std::uint32_t> mantissas = {0u, 1u, 0x7FFFFFu, 0x400000u, 0x200000u, 0x3FFFFFu};
  for (unsigned p = 0; p < 23; ++p) {
    const std::uint32_t half = 1u << p;
    const std::uint32_t below = half - 1u;
    const std::uint32_t kept_mask = 0x7FFFFFu & ~((half << 1) - 1u);
    const std::uint32_t kept_options[] = {0u, (half << 1) & 0x7FFFFFu, kept_mask & 0x2AAAAAu,
                                          kept_mask & 0x555554u, kept_mask};
    const std::uint32_t low_options[] = {below, half, half | 1u, half | below, half ? below >> 1 : 0u};
    for (std::uint32_t k : kept_options) {
      for (std::uint32_t l : low_options) mantissas.push_back((k | l) & 0x7FFFFFu);
    }
  }
  std::sort(mantissas.begin(), mantissas.end());
  mantissas.erase(std::unique(mantissas.begin(), mantissas.end()), mantissas.end());

  std::vector<std::uint32_t> inputs;
  for (std::uint32_t sign = 0; sign < 2; ++sign) {
    for (std::uint32_t e = 0; e < 256; ++e) {
      for (std::uint32_t m : mantissas) inputs.push_back((sign << 31) | (e << 23) | m);
    }
  }
  std::uint64_t state = 0x853C49E6748FEA9Bull;
  for (int i = 0; i < (1 << 22); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    inputs.push_back(static_cast<std::uint32_t>(state >> 32));
  }
  return inputs;
}
#endif

// ---------------------------------------------------------------------------------------------------------
// 1. All 16-bit patterns.

TEST(float16_test, every_f16_bit_pattern_widens_to_float_exactly_as_the_cpu_does) {
  if (!have_reference_f16()) GTEST_SKIP() << "no F16C and no _Float16 on this target";
  // The bulk paths widen all 65,536 patterns in one call each (8 at a time, then a scalar tail).
  std::vector<ampscope::f16> all(0x10000);
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) all[h] = ampscope::f16::from_bits(static_cast<std::uint16_t>(h));
  std::vector<float> fast(all.size()), portable(all.size());
  {
    FastPathOn on;
    cpu::widen_f16(all.data(), fast.data(), static_cast<std::int64_t>(all.size()));
  }
  cpu::widen_f16_portable(all.data(), portable.data(), static_cast<std::int64_t>(all.size()));
  int mismatches = 0;
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const std::uint32_t ours = float_bits(f16_bits_to_float(static_cast<std::uint16_t>(h)));
    const std::uint32_t reference = float_bits(reference_f16_to_float(static_cast<std::uint16_t>(h)));
    const std::uint32_t bulk_fast = float_bits(fast[h]), bulk_portable = float_bits(portable[h]);
    if ((ours != reference || bulk_fast != reference || bulk_portable != reference) &&
        ++mismatches <= static_cast<int>(kMaxReported)) {
      ADD_FAILURE() << "f16 " << hex(h, 4) << " -> float " << hex(ours, 8) << ", bulk fast " << hex(bulk_fast, 8)
                    << ", bulk portable " << hex(bulk_portable, 8) << ", cpu gives " << hex(reference, 8);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(float16_test, every_f16_bit_pattern_round_trips_through_float) {
  int mismatches = 0;
  int signalling = 0;
  for (std::uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const std::uint16_t in = static_cast<std::uint16_t>(h);
    const bool snan = f16_is_signalling_nan(in);
    signalling += snan;
    const std::uint16_t expected = snan ? static_cast<std::uint16_t>(in | 0x0200u) : in;
    const std::uint16_t back = float_to_f16_bits(f16_bits_to_float(in));
    if (back != expected && ++mismatches <= static_cast<int>(kMaxReported)) {
      ADD_FAILURE() << "f16 " << hex(in, 4) << " -> float -> " << hex(back, 4) << ", expected "
                    << hex(expected, 4);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(signalling, 2 * 511);  // both signs, mantissas 0x001..0x1FF
}

TEST(float16_test, every_bf16_bit_pattern_widens_to_the_top_half_of_a_float) {
  std::vector<ampscope::bf16> all(0x10000);
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) all[b] = ampscope::bf16::from_bits(static_cast<std::uint16_t>(b));
  std::vector<float> fast(all.size()), portable(all.size());
  {
    FastPathOn on;
    cpu::widen_bf16(all.data(), fast.data(), static_cast<std::int64_t>(all.size()));
  }
  cpu::widen_bf16_portable(all.data(), portable.data(), static_cast<std::int64_t>(all.size()));
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const std::uint32_t ours = float_bits(bf16_bits_to_float(static_cast<std::uint16_t>(b)));
    const std::uint32_t bulk_fast = float_bits(fast[b]), bulk_portable = float_bits(portable[b]);
    if ((ours != (b << 16) || bulk_fast != (b << 16) || bulk_portable != (b << 16)) &&
        ++mismatches <= static_cast<int>(kMaxReported)) {
      ADD_FAILURE() << "bf16 " << hex(b, 4) << " -> float " << hex(ours, 8) << ", bulk fast " << hex(bulk_fast, 8)
                    << ", bulk portable " << hex(bulk_portable, 8) << ", expected " << hex(b << 16, 8);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(float16_test, every_bf16_bit_pattern_round_trips_through_float) {
  int mismatches = 0;
  int signalling = 0;
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const std::uint16_t in = static_cast<std::uint16_t>(b);
    const bool snan = bf16_is_signalling_nan(in);
    signalling += snan;
    const std::uint16_t expected = snan ? static_cast<std::uint16_t>(in | 0x0040u) : in;
    const std::uint16_t back = float_to_bf16_bits(bf16_bits_to_float(in));
    if (back != expected && ++mismatches <= static_cast<int>(kMaxReported)) {
      ADD_FAILURE() << "bf16 " << hex(in, 4) << " -> float -> " << hex(back, 4) << ", expected "
                    << hex(expected, 4);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(signalling, 2 * 63);  // both signs, mantissas 0x01..0x3F
}

// ---------------------------------------------------------------------------------------------------------
// 2. All 2^32 floats -> f16 against the CPU.

TEST(float16_test, every_float_bit_pattern_narrows_to_f16_exactly_as_the_cpu_does) {
#if AMPSCOPE_TEST_X86
  if (cpu_has_f16c()) {
    // Each block: the bulk portable path (float_to_f16_bits in a loop, so the scalar conversion itself) and
    // the bulk fast path, each against the instruction one value at a time.
    FastPathOn on;
    std::atomic<std::uint64_t> fast_mismatches{0};
    const SweepResult r = sweep_all_floats([&](std::uint32_t first, std::size_t n, SweepResult& out) {
      alignas(32) std::uint32_t in[kBlock];
      alignas(32) std::uint16_t reference[kBlock], fast[kBlock], portable[kBlock];
      for (std::size_t i = 0; i < n; ++i) in[i] = first + static_cast<std::uint32_t>(i);
      f16c_from_floats(reinterpret_cast<const float*>(in), reference, n);
      bulk_narrow_f16(true, in, fast, n);
      bulk_narrow_f16(false, in, portable, n);
      std::uint64_t bad_fast = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (portable[i] != reference[i]) out.record(in[i], portable[i], reference[i]);
        if (fast[i] != reference[i]) {
          out.record(in[i], fast[i], reference[i]);
          ++bad_fast;
        }
      }
      if (bad_fast) fast_mismatches.fetch_add(bad_fast, std::memory_order_relaxed);
    });
    EXPECT_EQ(r.checked, kAllFloats);
    EXPECT_EQ(r.mismatches, 0u) << r.report("float -> f16 (portable = scalar, and fast bulk path) vs F16C vcvtps2ph");
    EXPECT_EQ(fast_mismatches.load(), 0u) << "of those, from the fast bulk path";
    // The portable bulk path is float_to_f16_bits element by element; on hand-picked values, directly.
    for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 1.0f + std::ldexp(1.0f, -11), std::ldexp(1.0f, -25), 1e-7f}) {
      std::uint16_t h = 0;
      bulk_narrow_f16(false, reinterpret_cast<const std::uint32_t*>(&f), &h, 1);
      EXPECT_EQ(h, float_to_f16_bits(f)) << f;
    }
    return;
  }
#endif
#if AMPSCOPE_TEST_HAS_FLOAT16
  const std::vector<std::uint32_t> inputs = reduced_f16_inputs();
  SweepResult r;
  std::vector<std::uint16_t> bulk(inputs.size());
  bulk_narrow_f16(false, inputs.data(), bulk.data(), inputs.size());  // no F16C: both bulk paths are this one
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::uint32_t u = inputs[i];
    const std::uint16_t ours = float_to_f16_bits(bits_float(u));
    const std::uint16_t reference = soft_f16_from_float(bits_float(u));
    ++r.checked;
    if (ours != reference) r.record(u, ours, reference);
    if (bulk[i] != reference) r.record(u, bulk[i], reference);
  }
  EXPECT_EQ(r.mismatches, 0u) << r.report("float -> f16 vs _Float16, reduced set: no F16C on this CPU");
#else
  GTEST_SKIP() << "no F16C and no _Float16 on this target";
#endif
}

// ---------------------------------------------------------------------------------------------------------
// 3. All 2^32 floats -> bf16 against the independent reference.

TEST(float16_test, every_float_bit_pattern_narrows_to_bf16_as_the_nearest_even_reference_says) {
  std::atomic<std::uint64_t> nan_results_not_nan{0};
  FastPathOn on;
  const SweepResult r = sweep_all_floats([&](std::uint32_t first, std::size_t n, SweepResult& out) {
    std::uint64_t bad_nans = 0;
    alignas(32) std::uint32_t in[kBlock];
    alignas(32) std::uint16_t fast[kBlock], portable[kBlock];
    for (std::size_t i = 0; i < n; ++i) in[i] = first + static_cast<std::uint32_t>(i);
    bulk_narrow_bf16(true, in, fast, n);
    bulk_narrow_bf16(false, in, portable, n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t u = in[i];
      const std::uint16_t ours = float_to_bf16_bits(bits_float(u));
      const std::uint16_t reference = reference_bf16_bits(u);
      if (ours != reference) out.record(u, ours, reference);
      if (fast[i] != reference) out.record(u, fast[i], reference);
      if (portable[i] != reference) out.record(u, portable[i], reference);
      if ((u & 0x7FFFFFFFu) > 0x7F800000u && !bf16_is_nan(ours)) ++bad_nans;
    }
    if (bad_nans) nan_results_not_nan.fetch_add(bad_nans, std::memory_order_relaxed);
  });
  EXPECT_EQ(r.checked, kAllFloats);
  EXPECT_EQ(r.mismatches, 0u) << r.report("float -> bf16 (scalar, bulk fast, bulk portable) vs double-based nearest-even reference");
  EXPECT_EQ(nan_results_not_nan.load(), 0u) << "NaN inputs that did not give a bf16 NaN";
}

// The reference itself, on hand-derived values, so a wrong reference cannot hide a wrong header.
TEST(float16_test, bf16_reference_agrees_with_hand_derived_roundings) {
  EXPECT_EQ(reference_bf16_bits(0x3F808000u), 0x3F80u);  // 1 + 2^-8: tie, down to even 1.0
  EXPECT_EQ(reference_bf16_bits(0x3F818000u), 0x3F82u);  // 1 + 3*2^-8: tie, up to even
  EXPECT_EQ(reference_bf16_bits(0x3F808001u), 0x3F81u);  // just above the tie
  EXPECT_EQ(reference_bf16_bits(0x7F7FFFFFu), 0x7F80u);  // FLT_MAX -> inf
  EXPECT_EQ(reference_bf16_bits(0x7F7F8000u), 0x7F80u);  // (2-2^-8)*2^127: tie, even is 2^128 = inf
  EXPECT_EQ(reference_bf16_bits(0x7F7F7FFFu), 0x7F7Fu);
  EXPECT_EQ(reference_bf16_bits(0xFF7F8000u), 0xFF80u);
  EXPECT_EQ(reference_bf16_bits(0x00008000u), 0x0000u);  // 2^-134: tie between 0 and 2^-133, to 0
  EXPECT_EQ(reference_bf16_bits(0x00018000u), 0x0002u);  // 3*2^-134: tie, up to even
  EXPECT_EQ(reference_bf16_bits(0x7F800001u), 0x7FC0u);
  EXPECT_EQ(reference_bf16_bits(0xFF800000u), 0xFF80u);
  EXPECT_EQ(reference_bf16_bits(0x80000000u), 0x8000u);
}

// ---------------------------------------------------------------------------------------------------------
// 4. Documented facts (amp-semantics section 5). Each expected value is derived in its comment.

TEST(float16_test, f16_overflow_threshold_is_65520_with_ties_going_up_to_infinity) {
  // 65504 = (2-2^-10)*2^15 is the largest f16, pattern 0 11110 1111111111.
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFFu);
  EXPECT_EQ(float_to_f16_bits(-65504.0f), 0xFBFFu);
  // Floats near 65520 (exponent 15) are spaced 2^(15-23) = 2^-8, so 65519.996f is 65520 - 2^-8, below the
  // midpoint 65520 of 65504 and 2^16: it rounds down to 65504.
  const float just_below = std::nextafter(65520.0f, 0.0f);
  EXPECT_EQ(just_below, 65519.996f);
  EXPECT_EQ(just_below, 65520.0f - 0.00390625f);
  EXPECT_EQ(float_to_f16_bits(just_below), 0x7BFFu);
  EXPECT_EQ(float_to_f16_bits(-just_below), 0xFBFFu);
  // 65520 is the tie; 65504 has odd mantissa 0x3FF, 2^16 (would-be exponent 31, mantissa 0) is even:
  // rounds up, and 2^16 is out of range, so inf (never saturation).
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7C00u);
  EXPECT_EQ(float_to_f16_bits(-65520.0f), 0xFC00u);
  EXPECT_EQ(float_to_f16_bits(70000.0f), 0x7C00u);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::max()), 0x7C00u);
}

TEST(float16_test, f16_underflow_ties_to_zero_at_two_to_the_minus_25) {
  // The smallest f16 subnormal is 2^-24 (0x0001); 2^-25 is the midpoint of 0 and 2^-24, and 0 is even.
  const float two_m25 = std::ldexp(1.0f, -25);
  const float two_m24 = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_f16_bits(two_m25), 0x0000u);
  EXPECT_EQ(float_to_f16_bits(-two_m25), 0x8000u);  // zero keeps its sign
  EXPECT_EQ(float_to_f16_bits(std::nextafter(two_m25, 1.0f)), 0x0001u);  // just past the midpoint
  EXPECT_EQ(float_to_f16_bits(std::nextafter(two_m25, 0.0f)), 0x0000u);
  EXPECT_EQ(float_to_f16_bits(two_m24), 0x0001u);
  EXPECT_EQ(float_to_f16_bits(-two_m24), 0x8001u);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::denorm_min()), 0x0000u);
  // 1.5 * 2^-24 ties between 1 and 2 units (to 2); 2.5 * 2^-24 ties between 2 and 3 (to 2).
  EXPECT_EQ(float_to_f16_bits(1.5f * two_m24), 0x0002u);
  EXPECT_EQ(float_to_f16_bits(2.5f * two_m24), 0x0002u);
  // 1023.5 * 2^-24 ties between the largest subnormal 0x03FF and the smallest normal 2^-14 (0x0400, even).
  EXPECT_EQ(float_to_f16_bits(1023.5f * two_m24), 0x0400u);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400u);
}

TEST(float16_test, f16_keeps_signed_zero_infinities_and_rounds_normal_ties_to_even) {
  EXPECT_EQ(float_to_f16_bits(0.0f), 0x0000u);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00u);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xFC00u);
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3C00u);  // exponent 15, mantissa 0
  // f16 epsilon is 2^-10: 1 + 2^-11 ties to 1.0 (even), 1 + 3*2^-11 ties up to 1 + 2^-9 (mantissa 2).
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00u);
  EXPECT_EQ(float_to_f16_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3C02u);
  // Widening is exact.
  EXPECT_EQ(f16_bits_to_float(0x7BFFu), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001u), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x0400u), std::ldexp(1.0f, -14));
  EXPECT_EQ(float_bits(f16_bits_to_float(0x8000u)), 0x80000000u);
  EXPECT_EQ(float_bits(f16_bits_to_float(0x7C00u)), 0x7F800000u);
  EXPECT_EQ(float_bits(f16_bits_to_float(0xFC00u)), 0xFF800000u);
}

TEST(float16_test, a_nan_with_only_low_payload_bits_stays_a_nan_in_f16_and_bf16) {
  // 0x7F800001 is a signalling NaN whose payload lives only in bits that both narrowings discard; the naive
  // round-and-shift gives inf. The contract: a quiet NaN with the sign and the top payload bits (all zero
  // here), so f16 0x7E00 / bf16 0x7FC0, and with the sign bit set, 0xFE00 / 0xFFC0.
  const float snan_low = bits_float(0x7F800001u);
  ASSERT_TRUE(std::isnan(snan_low));
  const std::uint16_t h = float_to_f16_bits(snan_low);
  const std::uint16_t b = float_to_bf16_bits(snan_low);
  EXPECT_TRUE(f16_is_nan(h)) << hex(h, 4);
  EXPECT_TRUE(bf16_is_nan(b)) << hex(b, 4);
  EXPECT_EQ(h, 0x7E00u);
  EXPECT_EQ(b, 0x7FC0u);
  EXPECT_EQ(float_to_f16_bits(bits_float(0xFF800001u)), 0xFE00u);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0xFF800001u)), 0xFFC0u);
  // The canonical quiet NaNs map to the documented quiet NaNs.
  EXPECT_EQ(float_to_f16_bits(bits_float(0x7FC00000u)), 0x7E00u);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x7FC00000u)), 0x7FC0u);
  // A NaN whose payload bits all survive keeps them: float 0x7FFFFFFF -> f16 0x7FFF, bf16 0x7FFF.
  EXPECT_EQ(float_to_f16_bits(bits_float(0x7FFFFFFFu)), 0x7FFFu);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x7FFFFFFFu)), 0x7FFFu);
  // And widening a signalling f16 NaN gives a quiet float NaN with the payload shifted up: 0x7C01 -> bit 13.
  EXPECT_EQ(float_bits(f16_bits_to_float(0x7C01u)), 0x7FC02000u);
}

TEST(float16_test, bf16_overflows_to_infinity_at_the_midpoint_above_its_largest_finite_value) {
  // The largest bf16 is (2-2^-7)*2^127 (0x7F7F); the next step would be 2^128. The midpoint (2-2^-8)*2^127 is
  // float 0x7F7F8000 (mantissa 1111111 1 0...): a tie, and 0x7F7F is odd, so it goes up to inf.
  const float midpoint = static_cast<float>(std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
  EXPECT_EQ(float_bits(midpoint), 0x7F7F8000u);
  EXPECT_EQ(float_to_bf16_bits(midpoint), 0x7F80u);
  EXPECT_EQ(float_to_bf16_bits(-midpoint), 0xFF80u);
  EXPECT_EQ(float_to_bf16_bits(std::nextafter(midpoint, 0.0f)), 0x7F7Fu);  // just below: the largest bf16
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0xFF80u);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80u);
  EXPECT_EQ(bf16_bits_to_float(0x7F7Fu), ampscope::kBF16Max);
}

TEST(float16_test, bf16_rounds_ties_to_even_and_keeps_zero_sign_and_subnormals) {
  // bf16 epsilon is 2^-7. 1 + 2^-8 is the midpoint of 1.0 (0x3F80, even) and 1 + 2^-7 (0x3F81): down.
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80u);
  EXPECT_EQ(float_to_bf16_bits(-(1.0f + std::ldexp(1.0f, -8))), 0xBF80u);
  // 1 + 3*2^-8 is the midpoint of 0x3F81 (odd) and 1 + 2^-6 (0x3F82, even): up.
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f * std::ldexp(1.0f, -8)), 0x3F82u);
  EXPECT_EQ(float_to_bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3F81u);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000u);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000u);
  // Subnormals are kept, not flushed: the smallest bf16 subnormal is 2^-133 (0x0001); 2^-134 ties to 0.
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -133)), 0x0001u);
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -134)), 0x0000u);
  EXPECT_EQ(float_to_bf16_bits(std::nextafter(std::ldexp(1.0f, -134), 1.0f)), 0x0001u);
  EXPECT_EQ(float_to_bf16_bits(std::ldexp(1.0f, -126)), 0x0080u);  // smallest normal
}

// ---------------------------------------------------------------------------------------------------------
// 5. The public types.

TEST(float16_test, f16_and_bf16_are_two_byte_trivially_copyable_storage_types) {
  static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2);
  static_assert(std::is_trivially_copyable_v<f16> && std::is_trivially_copyable_v<bf16>);
  static_assert(std::is_trivially_default_constructible_v<f16>);
  static_assert(!std::is_convertible_v<float, f16> && !std::is_convertible_v<f16, float>);  // explicit
  static_assert(!std::is_convertible_v<float, bf16> && !std::is_convertible_v<bf16, float>);
  SUCCEED();
}

TEST(float16_test, f16_struct_converts_like_the_bit_functions) {
  EXPECT_EQ(f16{70000.0f}.bits, 0x7C00u);
  // 0.1 = 1.6 * 2^-4; 0.6 * 1024 = 614.4 -> 614, so the nearest f16 is 1638 * 2^-14 = 0.0999755859375.
  EXPECT_EQ(static_cast<float>(f16{0.1f}), 0.0999755859375f);
  EXPECT_EQ(f16{1.0f}.bits, 0x3C00u);
  EXPECT_EQ(f16{-2.0f}.bits, 0xC000u);
  EXPECT_EQ(f16{65504.0f}.bits, 0x7BFFu);
  EXPECT_EQ(f16{-0.0f}.bits, 0x8000u);
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x3C00u)), 1.0f);
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x7BFFu)), ampscope::kF16Max);
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x0400u)), ampscope::kF16MinNormal);
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x0001u)), ampscope::kF16MinSubnormal);
  EXPECT_TRUE(std::isinf(static_cast<float>(f16::from_bits(0xFC00u))));
  EXPECT_TRUE(std::isnan(static_cast<float>(f16::from_bits(0x7E00u))));
  for (float v : {0.5f, 3.0f, -1024.0f, 0.000061035156f, 1.0f / 1024.0f}) {
    EXPECT_EQ(static_cast<float>(f16{v}), v) << v;  // representable values survive unchanged
    EXPECT_EQ(f16{v}.bits, float_to_f16_bits(v));
  }
}

TEST(float16_test, bf16_struct_converts_like_the_bit_functions) {
  EXPECT_EQ(bf16::from_bits(0x7F80u).bits, 0x7F80u);
  EXPECT_TRUE(std::isinf(static_cast<float>(bf16::from_bits(0x7F80u))));
  EXPECT_EQ(bf16{1.0f}.bits, 0x3F80u);
  EXPECT_EQ(bf16{-0.0f}.bits, 0x8000u);
  EXPECT_EQ(bf16{std::numeric_limits<float>::max()}.bits, 0x7F80u);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16{bits_float(0x7F800001u)})));
  // 3.14159274 (float 0x40490FDB) -> bf16 0x4049 (the discarded 0x0FDB is below half) = 3.140625.
  EXPECT_EQ(bf16{3.14159274f}.bits, 0x4049u);
  EXPECT_EQ(static_cast<float>(bf16{3.14159274f}), 3.140625f);
  EXPECT_EQ(static_cast<float>(bf16::from_bits(0x7F7Fu)), ampscope::kBF16Max);
  EXPECT_EQ(static_cast<float>(bf16::from_bits(0x0080u)), ampscope::kBF16MinNormal);
  for (float v : {0.5f, 3.0f, -1024.0f, 1.0f + 1.0f / 128.0f, 1e30f}) {
    EXPECT_EQ(bf16{v}.bits, float_to_bf16_bits(v)) << v;
  }
}

}  // namespace
