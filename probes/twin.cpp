// probes/twin.cpp: the f32 twin (probes/twin.h).
#include "probes/twin.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "kernels/half_convert.h"
#include "kernels/parallel.h"
#include "probes/analysis/op_traits.h"
#include "probes/stats.h"

namespace ampscope::probe {

namespace {

bool low_precision(DType d) { return d == DType::f16 || d == DType::bf16; }

double largest_finite(DType d) {
  switch (d) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f32: return static_cast<double>(FLT_MAX);
    default: return std::numeric_limits<double>::max();
  }
}

int min_exponent(DType d) {
  switch (d) {
    case DType::f16: return -14;
    case DType::f64: return -1022;
    default: return -126;
  }
}

double ulp_of(double r, DType d) {
  const int p = significand_bits(d);
  int e = min_exponent(d);
  if (r != 0) e = std::max(e, std::ilogb(r));
  return std::ldexp(1.0, e - (p - 1));
}

// The bucket of a relative error e > 0: floor(-log2 e), clamped to [0, kErrorBins - 1].
int error_bucket(double e) {
  const double b = std::floor(-std::log2(e));
  return b <= 0 ? 0 : b >= trace::kErrorBins - 1 ? trace::kErrorBins - 1 : static_cast<int>(b);
}

// ulp_of and error_bucket read from the bits of a double where that gives the same answer, bit for bit, and
// call them where it might not: compare() runs them once per element, and libm's ilogb, ldexp and log2 were
// most of the twin's time (bench/RESULTS.md).
constexpr std::uint64_t kMantissa = (std::uint64_t{1} << 52) - 1;

std::uint64_t bits_of(double v) {
  std::uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The exponent field of a normal double, unbiased; INT_MIN for zero, subnormals, infinities and NaN.
int normal_exponent(double v) {
  const int field = static_cast<int>((bits_of(v) >> 52) & 0x7ff);
  return field == 0 || field == 0x7ff ? std::numeric_limits<int>::min() : field - 1023;
}

// ulp_of(r, d), with p = significand_bits(d) and emin = min_exponent(d).
double fast_ulp_of(double r, DType d, int p, int emin) {
  int e = emin;
  if (r != 0) {
    const int k = normal_exponent(r);
    if (k == std::numeric_limits<int>::min()) return ulp_of(r, d);  // subnormal (ilogb's answer) or not finite
    e = std::max(e, k);  // ilogb of a normal double is its exponent field
  }
  const int u = e - (p - 1);
  if (u < -1022 || u > 1023) return ulp_of(r, d);  // 2^u is not a normal double
  const std::uint64_t b = static_cast<std::uint64_t>(u + 1023) << 52;
  double out;
  std::memcpy(&out, &b, sizeof out);
  return out;
}

// error_bucket(e). For a normal e = m 2^k with 1 + 2^-20 <= m < 2, -log2 e lies in (-k - 1, -k - 2^-21]:
// log2's result (within an ulp, at most 2^-42 for |k| < 2048) stays inside, so the floor is -k - 1. For m
// closer to 1 (a power of two included), where the rounded log2 may land on -k, and for zero, subnormal or
// non-finite e, log2 itself decides.
int fast_error_bucket(double e) {
  const std::uint64_t b = bits_of(e);
  const int field = static_cast<int>((b >> 52) & 0x7ff);
  if (field == 0 || field == 0x7ff || (b & kMantissa) >> 32 == 0) return error_bucket(e);
  const int bucket = -(field - 1023) - 1;
  return bucket <= 0 ? 0 : bucket >= trace::kErrorBins - 1 ? trace::kErrorBins - 1 : bucket;
}

bool saturating(std::string_view op) { return analysis::op_kind(op) == analysis::OpKind::saturating; }

// Ops whose body must not run again: it draws random numbers.
bool random_op(std::string_view op) { return analysis::op_kind(op) == analysis::OpKind::random; }

// t widened exactly to `to` where it is a floating tensor of fewer significand bits (f16/bf16 to f32 or f64, f32
// to f64); otherwise t itself.
Tensor widened(const Tensor& t, DType to = DType::f32) {
  if (!t.defined() || !is_floating(t.dtype()) || significand_bits(t.dtype()) >= significand_bits(to)) return t;
  return t.to(to);
}

double max_ratio(const Tensor& num, const Tensor& den, double floor) {
  const std::vector<double> n = num.values(), d = den.values();
  double best = 0;
  for (std::size_t i = 0; i < n.size() && i < d.size(); ++i) {
    if (!std::isfinite(n[i]) || !std::isfinite(d[i])) continue;
    best = std::max(best, n[i] / std::max(std::fabs(d[i]), floor));
  }
  return best;
}

}  // namespace

int significand_bits(DType dtype) {
  switch (dtype) {
    case DType::f16: return 11;
    case DType::bf16: return 8;
    case DType::f64: return 53;
    default: return 24;
  }
}

double relative_error_floor(DType dtype) {
  return std::ldexp(1.0, min_exponent(dtype));
}

namespace {
// The comparison loop over y and r (n elements each, host memory), in the order the elements are counted.
template <class T>
ErrorStats compare_values(const T* y, const T* r, std::size_t n, DType dtype, std::string_view op) {
  double scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(r[i])) scale = std::max(scale, static_cast<double>(std::fabs(r[i])));
  }
  const int p = significand_bits(dtype), emin = min_exponent(dtype);
  const double floor = std::max(relative_error_floor(dtype), std::ldexp(scale, -p));
  const double top = largest_finite(dtype);
  const bool saturates = saturating(op);
  ErrorStats s;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double yi = y[i], ri = r[i];
    if (!std::isfinite(ri)) continue;
    if (!std::isfinite(yi)) {
      ++s.flips;
      continue;
    }
    const bool flip = (yi == 0 && ri != 0) || (std::fabs(yi) == top && std::fabs(ri) < top) ||
                      (saturates && std::fabs(yi) == 1 && std::fabs(ri) != 1);
    if (flip) ++s.flips;
    const double err = std::fabs(yi - ri);
    const double rel = err / std::max(std::fabs(ri), floor);
    if (!flip) {
      if (rel == 0) {
        ++s.exact;
      } else {
        ++s.error_bins[static_cast<std::size_t>(fast_error_bucket(rel))];
      }
    }
    s.max_rel = std::max(s.max_rel, rel);
    s.max_ulp = std::max(s.max_ulp, err / fast_ulp_of(ri, dtype, p, emin));
    sum += rel;
    ++s.counted;
  }
  s.mean_rel = s.counted > 0 ? sum / static_cast<double>(s.counted) : 0;
  s.bits = s.max_rel == 0 ? p : std::clamp(-std::log2(s.max_rel), 0.0, static_cast<double>(p)) + 0.0;  // + 0.0: no -0 for an error of 1
  return s;
}

// ---- the fast path: f16, bf16 and f32 values read as floats ----
// Four elements at a time as GCC/Clang vectors of doubles: the error, the relative error (one division), the
// ulps (ulp_D(r) is a power of two, so multiplying by its inverse, built from r's exponent bits, is exact for
// float values: the product lies between 2^-253 and 2^278) and the histogram bucket (from the relative error's
// exponent bits, as fast_error_bucket) are computed lane by lane with the same double operations as
// compare_values, and the maxima are exact in any order. The mean's sum is still added element by element, in
// order, so every field is bit for bit compare_values's. Four elements holding a NaN or an infinity (rare) go
// through the scalar loop's body, as does a relative error whose bucket needs log2.
using F4 = float __attribute__((vector_size(16)));
using D4 = double __attribute__((vector_size(32)));
using L4 = std::int64_t __attribute__((vector_size(32)));
using U4 = std::uint32_t __attribute__((vector_size(16)));
// Exponent fields of doubles whose sign bit is clear (|r|, a relative error) are taken by a logical shift of
// these, which AVX2 has for 64-bit lanes (an arithmetic one it has not, and the compiler builds it from three
// instructions); for a clear sign bit both give the same value.
using UL4 = std::uint64_t __attribute__((vector_size(32)));

struct Judge {  // what the comparison needs to know about the dtype and the op
  double floor, top;
  int p, emin;
  bool saturates;
};

// The scalar body: one element, exactly as compare_values counts it; returns its term of the mean's sum (0 for
// an element left out: adding +0 to a sum of non-negative terms leaves its bits as they are).
[[gnu::always_inline]] inline double count_element(double yi, double ri, const Judge& j, DType dtype, ErrorStats& s) {
  if (!std::isfinite(ri)) return 0.0;
  if (!std::isfinite(yi)) {
    ++s.flips;
    return 0.0;
  }
  const bool flip = (yi == 0 && ri != 0) || (std::fabs(yi) == j.top && std::fabs(ri) < j.top) ||
                    (j.saturates && std::fabs(yi) == 1 && std::fabs(ri) != 1);
  if (flip) ++s.flips;
  const double err = std::fabs(yi - ri);
  const double rel = err / std::max(std::fabs(ri), j.floor);
  if (!flip) {
    if (rel == 0) {
      ++s.exact;
    } else {
      ++s.error_bins[static_cast<std::size_t>(fast_error_bucket(rel))];
    }
  }
  s.max_rel = std::max(s.max_rel, rel);
  s.max_ulp = std::max(s.max_ulp, err / fast_ulp_of(ri, dtype, j.p, j.emin));
  ++s.counted;
  return rel;
}

// Histogram codes past the buckets: a flip, an exact element, a bucket log2 decides.
constexpr std::int64_t kFlipCode = trace::kErrorBins, kExactCode = trace::kErrorBins + 1,
                       kLogCode = trace::kErrorBins + 2, kCodes = trace::kErrorBins + 3;

// The largest finite |r[i]|; the comparison of n elements (both float, contiguous) into s and sum.
// For finite floats the order of |r| is the order of its bits read as integers: the largest finite |r| is
// the largest magnitude bit pattern below infinity's, eight at a time, widened once at the end.
using U8 = std::uint32_t __attribute__((vector_size(32)));
[[gnu::always_inline]] inline double largest_finite_impl(const float* r, std::size_t n) {
  U8 best{};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    U8 bits;
    std::memcpy(&bits, r + i, sizeof bits);
    bits &= 0x7fffffffu;
    bits = bits < 0x7f800000u ? bits : U8{};  // 0 where not finite
    best = best < bits ? bits : best;
  }
  std::uint32_t top = 0;
  for (int k = 0; k < 8; ++k) top = std::max(top, best[k]);
  float largest;
  std::memcpy(&largest, &top, sizeof largest);
  double scale = largest;
  for (; i < n; ++i) {
    if (std::isfinite(r[i])) scale = std::max(scale, static_cast<double>(std::fabs(r[i])));
  }
  return scale;
}

// With `terms`, each element's term of the mean's sum is stored there (terms[i] for element i) instead of
// being added to `total`: a later chunk's terms can only be added once the chunks before it are summed.
// kSaturates is j.saturates, a template argument so that the loop of an op that does not saturate (all but
// sigmoid and tanh) carries no test for it.
template <bool kStore, bool kSaturates>
[[gnu::always_inline]] inline void compare_floats_impl(const float* y, const float* r, std::size_t n, const Judge& j,
                                                       DType dtype, ErrorStats& s, double& total, double* terms) {
  double sum = total;  // a local, so that the adds chain in a register rather than through memory
  std::int64_t counted = 0;
  const D4 floor4 = {j.floor, j.floor, j.floor, j.floor}, top4 = {j.top, j.top, j.top, j.top};
  const D4 one4 = {1, 1, 1, 1}, zero4{};
  const L4 abs_mask = L4{} + std::numeric_limits<std::int64_t>::max();
  const L4 emin4 = L4{} + j.emin;
  D4 max_rel = zero4, max_ulp = zero4;
  std::int64_t hist[4][kCodes] = {};  // one histogram per lane: no increment waits for the one before
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    F4 yf, rf;
    std::memcpy(&yf, y + i, sizeof yf);
    std::memcpy(&rf, r + i, sizeof rf);
    const U4 yb = reinterpret_cast<U4>(yf) & 0x7fffffffu, rb = reinterpret_cast<U4>(rf) & 0x7fffffffu;
    const U4 bad = (yb >= 0x7f800000u) | (rb >= 0x7f800000u);
    std::uint64_t bad_halves[2];  // two 64-bit reads of the mask rather than four lane extracts
    std::memcpy(bad_halves, &bad, sizeof bad_halves);
    if ((bad_halves[0] | bad_halves[1]) != 0) {
      for (std::size_t k = i; k < i + 4; ++k) {
        const double term = count_element(y[k], r[k], j, dtype, s);
        if constexpr (kStore) {
          terms[k] = term;
        } else {
          sum += term;
        }
      }
      continue;
    }
    const D4 yd = __builtin_convertvector(yf, D4), rd = __builtin_convertvector(rf, D4);
    const D4 ay = reinterpret_cast<D4>(reinterpret_cast<L4>(yd) & abs_mask);
    const D4 ar = reinterpret_cast<D4>(reinterpret_cast<L4>(rd) & abs_mask);
    const D4 diff = yd - rd;
    const D4 err = reinterpret_cast<D4>(reinterpret_cast<L4>(diff) & abs_mask);
    const D4 rel = err / (ar < floor4 ? floor4 : ar);  // std::max(|r|, floor)
    L4 flip = ((yd == zero4) & (rd != zero4)) | ((ay == top4) & (ar < top4));
    if constexpr (kSaturates) flip |= (ay == one4) & (ar != one4);
    // ulp_D(r) = 2^(e - (p - 1)), e = max(exponent of r, emin) (emin for 0, whose field 0 reads as -1023, below
    // any emin; r is a normal double or 0)
    const L4 exponent = reinterpret_cast<L4>(reinterpret_cast<UL4>(ar) >> 52) - 1023;
    const L4 e = exponent < emin4 ? emin4 : exponent;
    const D4 inverse_ulp = reinterpret_cast<D4>(((j.p - 1) + 1023 - e) << 52);
    const D4 ulps = err * inverse_ulp;
    max_rel = max_rel < rel ? rel : max_rel;
    max_ulp = max_ulp < ulps ? ulps : max_ulp;
    // The bucket from rel's exponent bits (fast_error_bucket), or a code.
    const L4 rel_bits = reinterpret_cast<L4>(rel);
    const L4 rel_field = reinterpret_cast<L4>(reinterpret_cast<UL4>(rel) >> 52);
    L4 bucket = 1022 - rel_field;
    bucket = bucket < 0 ? L4{} : bucket;
    bucket = bucket > trace::kErrorBins - 1 ? L4{} + (trace::kErrorBins - 1) : bucket;
    const L4 top_mantissa = rel_bits & static_cast<std::int64_t>(kMantissa & ~std::uint64_t{0xffffffff});
    bucket = top_mantissa == 0 ? L4{} + kLogCode : bucket;  // rel's top 20 mantissa bits all 0: log2 decides
    bucket = rel == zero4 ? L4{} + kExactCode : bucket;
    bucket = flip != 0 ? L4{} + kFlipCode : bucket;
    // Through memory rather than lane extracts: fewer instructions.
    alignas(32) double rels[4];
    alignas(32) std::int64_t codes[4];
    std::memcpy(rels, &rel, sizeof rels);
    std::memcpy(codes, &bucket, sizeof codes);
    if constexpr (kStore) {
      std::memcpy(terms + i, rels, sizeof rels);
    } else {
      sum += rels[0];
      sum += rels[1];
      sum += rels[2];
      sum += rels[3];
    }
    if (((codes[0] == kLogCode) | (codes[1] == kLogCode) | (codes[2] == kLogCode) | (codes[3] == kLogCode)) != 0)
        [[unlikely]] {
      for (int k = 0; k < 4; ++k) {
        if (codes[k] == kLogCode) codes[k] = error_bucket(rels[k]);
      }
    }
    ++hist[0][codes[0]];
    ++hist[1][codes[1]];
    ++hist[2][codes[2]];
    ++hist[3][codes[3]];
    counted += 4;
  }
  for (; i < n; ++i) {
    const double term = count_element(y[i], r[i], j, dtype, s);
    if constexpr (kStore) {
      terms[i] = term;
    } else {
      sum += term;
    }
  }
  total = sum;
  s.counted += counted;
  s.max_rel = std::max({s.max_rel, max_rel[0], max_rel[1], max_rel[2], max_rel[3]});
  s.max_ulp = std::max({s.max_ulp, max_ulp[0], max_ulp[1], max_ulp[2], max_ulp[3]});
  for (int k = 0; k < 4; ++k) {
    for (int b = 0; b < trace::kErrorBins; ++b) s.error_bins[static_cast<std::size_t>(b)] += hist[k][b];
    s.flips += hist[k][kFlipCode];
    s.exact += hist[k][kExactCode];
  }
}

// Compiled twice on x86-64, for AVX2 and for the baseline, and chosen once by what the CPU supports; the AVX2
// versions end with vzeroupper (probes/stats.cpp says why).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) double largest_finite_avx2(const float* r, std::size_t n) {
  const double v = largest_finite_impl(r, n);
  __builtin_ia32_vzeroupper();
  return v;
}
template <bool kStore, bool kSaturates>
__attribute__((target("avx2"))) void compare_floats_avx2(const float* y, const float* r, std::size_t n,
                                                         const Judge& j, DType dtype, ErrorStats& s, double& sum,
                                                         double* terms) {
  compare_floats_impl<kStore, kSaturates>(y, r, n, j, dtype, s, sum, terms);
  __builtin_ia32_vzeroupper();
}
bool use_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
double largest_finite_floats(const float* r, std::size_t n) {
  return use_avx2() ? largest_finite_avx2(r, n) : largest_finite_impl(r, n);
}
template <bool kStore>
void compare_floats(const float* y, const float* r, std::size_t n, const Judge& j, DType dtype, ErrorStats& s,
                    double& sum, double* terms) {
  if (use_avx2()) {
    if (j.saturates) {
      compare_floats_avx2<kStore, true>(y, r, n, j, dtype, s, sum, terms);
    } else {
      compare_floats_avx2<kStore, false>(y, r, n, j, dtype, s, sum, terms);
    }
  } else if (j.saturates) {
    compare_floats_impl<kStore, true>(y, r, n, j, dtype, s, sum, terms);
  } else {
    compare_floats_impl<kStore, false>(y, r, n, j, dtype, s, sum, terms);
  }
}
#else
double largest_finite_floats(const float* r, std::size_t n) { return largest_finite_impl(r, n); }
template <bool kStore>
void compare_floats(const float* y, const float* r, std::size_t n, const Judge& j, DType dtype, ErrorStats& s,
                    double& sum, double* terms) {
  if (j.saturates) {
    compare_floats_impl<kStore, true>(y, r, n, j, dtype, s, sum, terms);
  } else {
    compare_floats_impl<kStore, false>(y, r, n, j, dtype, s, sum, terms);
  }
}
#endif

// The compared value's elements as floats: f32 read in place; f16 and bf16 widened exactly (kernels/cpu/
// half_convert.h), a block at a time into a buffer on the reading thread's stack, so that a low-precision
// value is read once, as it is stored, rather than first copied whole into an f32 tensor.
struct FloatSource {
  const void* data = nullptr;
  DType dtype = DType::f32;  // f32, f16 or bf16, contiguous on the host
  static constexpr std::size_t kBlock = 2048;  // elements widened at a time
  // Elements [b, b + m) (m <= kBlock) as floats: in place, or widened into `buffer`.
  const float* floats(std::size_t b, std::size_t m, float* buffer) const {
    const auto count = static_cast<std::int64_t>(m);
    switch (dtype) {
      case DType::f16: cpu::widen(static_cast<const f16*>(data) + b, buffer, count); return buffer;
      case DType::bf16: cpu::widen(static_cast<const bf16*>(data) + b, buffer, count); return buffer;
      default: return static_cast<const float*>(data) + b;
    }
  }
  // fn(y, offset, m) over [b, e), a block of floats at a time (all at once for f32).
  template <class Fn>
  void for_blocks(std::size_t b, std::size_t e, const Fn& fn) const {
    if (dtype == DType::f32) {
      if (e > b) fn(static_cast<const float*>(data) + b, b, e - b);
      return;
    }
    alignas(32) float buffer[kBlock];
    for (std::size_t i = b; i < e; i += kBlock) {
      const std::size_t m = std::min(kBlock, e - i);
      fn(floats(i, m, buffer), i, m);
    }
  }
};

// How many of the CPU's threads a pass over n elements is split over: one inside a task of the pool (a
// comparison run beside others, compare_together), where a nested split would run on this thread anyway.
int chunks_for(std::size_t n) {
  if (cpu::detail::in_parallel_region()) return 1;
  return static_cast<int>(std::min<std::int64_t>(
      cpu::num_threads(), std::max<std::int64_t>(1, static_cast<std::int64_t>(n) / cpu::kElementwiseGrain)));
}

// A large comparison in chunks on the CPU's threads: the first chunk adds its terms to the sum as it goes, the
// others store theirs, which are then added in element order, so the mean is the one element-by-element
// summation gives; counts, histograms and maxima merge in any order. Within a chunk, blocks of a low-precision
// value are compared one after another, the sum carried from block to block: the same terms in the same order.
void compare_floats_chunked(const FloatSource& y, const float* r, std::size_t n, const Judge& j, DType dtype,
                            ErrorStats& s, double& sum) {
  const auto count = static_cast<std::int64_t>(n);
  const int chunks = chunks_for(n);
  if (chunks <= 1) {
    y.for_blocks(0, n, [&](const float* yb, std::size_t b, std::size_t m) {
      compare_floats<false>(yb, r + b, m, j, dtype, s, sum, nullptr);
    });
    return;
  }
  const auto bound = [&](std::int64_t c) { return static_cast<std::size_t>(count * c / chunks); };
  std::vector<ErrorStats> parts(static_cast<std::size_t>(chunks));
  std::vector<double> terms(n - bound(1));
  double first_sum = 0;
  cpu::parallel_for(chunks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c) {
      ErrorStats& part = parts[static_cast<std::size_t>(c)];
      y.for_blocks(bound(c), bound(c + 1), [&](const float* yb, std::size_t b, std::size_t m) {
        if (c == 0) {
          compare_floats<false>(yb, r + b, m, j, dtype, part, first_sum, nullptr);
        } else {
          double unused = 0;
          compare_floats<true>(yb, r + b, m, j, dtype, part, unused, terms.data() + (b - bound(1)));
        }
      });
    }
  });
  sum = first_sum;
  for (const double t : terms) sum += t;
  for (const ErrorStats& part : parts) {
    s.counted += part.counted;
    s.flips += part.flips;
    s.exact += part.exact;
    for (std::size_t b = 0; b < s.error_bins.size(); ++b) s.error_bins[b] += part.error_bins[b];
    s.max_rel = std::max(s.max_rel, part.max_rel);
    s.max_ulp = std::max(s.max_ulp, part.max_ulp);
  }
}

// Whether y and r (n elements each) agree bit for bit (y read as floats); if so, `finite` is how many of r's
// elements are finite. A value equal to its reference is common: the local value of an op that computes
// nothing its dtype rounds (relu, max_pool2d, masked_fill on f16 inputs) and the backward of one that only
// moves or selects values (a view's, a slice's, relu's, max_pool2d's). Such a pair's errors are known without
// the comparison pass: every element with a finite r counts as exact (error 0, no flip: y is r), the others are
// left out, as compare_values does. A pair that differs usually does so in its first elements, where the scan
// stops.
bool identical_floats(const FloatSource& y, const float* r, std::size_t n, std::int64_t& finite) {
  constexpr std::size_t kBlock = 1024;  // elements compared between looks at the other chunks' verdict
  const auto count = static_cast<std::int64_t>(n);
  const int chunks = chunks_for(n);
  std::atomic<bool> differ{false};
  std::vector<std::int64_t> counts(static_cast<std::size_t>(chunks), 0);
  cpu::parallel_for(chunks, 1, [&](std::int64_t first, std::int64_t last) {
    alignas(32) float buffer[kBlock];
    for (std::int64_t c = first; c < last; ++c) {
      const auto b = static_cast<std::size_t>(count * c / chunks), e = static_cast<std::size_t>(count * (c + 1) / chunks);
      std::int64_t finite_here = 0;
      for (std::size_t i = b; i < e; i += kBlock) {
        const std::size_t m = std::min(kBlock, e - i);
        if (differ.load(std::memory_order_relaxed) ||
            std::memcmp(y.floats(i, m, buffer), r + i, m * sizeof(float)) != 0) {
          differ.store(true, std::memory_order_relaxed);
          return;
        }
        const auto* bits = reinterpret_cast<const std::uint32_t*>(r + i);
        for (std::size_t k = 0; k < m; ++k) finite_here += (bits[k] & 0x7fffffffu) < 0x7f800000u ? 1 : 0;
      }
      counts[static_cast<std::size_t>(c)] = finite_here;
    }
  });
  if (differ.load()) return false;
  finite = 0;
  for (const std::int64_t k : counts) finite += k;
  return true;
}

// compare_values for floats, by the fast path where the dtype's smallest exponent is one a float's
// exponent bits reach (f16, bf16, f32).
ErrorStats compare_float_values(const FloatSource& y, const float* r, std::size_t n, DType dtype, std::string_view op) {
  const Judge j{0, largest_finite(dtype), significand_bits(dtype), min_exponent(dtype), saturating(op)};
  if (j.emin < -126) {
    std::vector<float> wide(n);
    y.for_blocks(0, n, [&](const float* yb, std::size_t b, std::size_t m) { std::copy(yb, yb + m, wide.data() + b); });
    return compare_values(wide.data(), r, n, dtype, op);
  }
  if (std::int64_t finite = 0; identical_floats(y, r, n, finite)) {
    ErrorStats same;
    same.counted = same.exact = finite;
    same.bits = j.p;
    return same;
  }
  const double scale = largest_finite_floats(r, n);
  Judge judge = j;
  judge.floor = std::max(relative_error_floor(dtype), std::ldexp(scale, -j.p));
  ErrorStats s;
  double sum = 0;
  compare_floats_chunked(y, r, n, judge, dtype, s, sum);
  s.mean_rel = s.counted > 0 ? sum / static_cast<double>(s.counted) : 0;
  s.bits = s.max_rel == 0 ? j.p : std::clamp(-std::log2(s.max_rel), 0.0, static_cast<double>(j.p)) + 0.0;  // + 0.0: no -0 for an error of 1
  return s;
}

bool f32_exact(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

// One comparison, its tensors made ready on the calling thread (tensors are made there only: the passes over
// their elements may then run on any thread).
struct Prepared {
  Tensor y, r;  // host, contiguous; y f32, f16 or bf16 and r f32 (fast), or both as given (double path)
  DType dtype = DType::f32;
  std::string_view op;
  bool fast = false;  // f16, bf16 and f32 values are exact in float: read as floats, not widened to doubles
  std::optional<ErrorStats> settled;  // the errors, already known (a value identical to its reference)
  ErrorStats run() const {
    if (settled) return *settled;
    if (!fast) {
      const std::vector<double> yv = y.values(), rv = r.values();
      return compare_values(yv.data(), rv.data(), std::min(yv.size(), rv.size()), dtype, op);
    }
    return compare_float_values(FloatSource{y.data(), y.dtype()}, r.data_as<float>(), static_cast<std::size_t>(y.numel()),
                                dtype, op);
  }
};

// Whether t's elements fill one block of memory with no gaps, its dimensions in some order (a transposed or
// permuted contiguous tensor): element [0, ..., 0] is then the block's first, and the order of the elements in
// memory is one permutation of their order in the tensor, the same for every tensor of t's sizes and strides.
bool dense_block(const Tensor& t) {
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of the dimensions longer than 1
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.strides()[static_cast<std::size_t>(d)], t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  std::int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

Prepared prepare(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op) {
  if (value.numel() != reference.numel()) {
    throw Error(fmt::format("twin: {} has {} elements but its reference has {}; compare tensors of one shape", op,
                            value.numel(), reference.numel()));
  }
  Prepared p;
  p.dtype = dtype;
  p.op = op;
  p.fast = f32_exact(value.dtype()) && f32_exact(reference.dtype());
  if (!p.fast) {
    p.y = value;
    p.r = reference;
    return p;
  }
  // A value and reference laid out alike in one block each, not in element order (the gradient of a transpose,
  // and its twin, both transposed views): whether they are identical does not depend on the order the
  // elements are read in, so they are scanned as they lie, without the two copies into element order that the
  // comparison pass needs (and makes only if they differ).
  if (!value.is_contiguous() && value.device().is_cpu() && reference.device().is_cpu() &&
      reference.dtype() == DType::f32 && value.shape() == reference.shape() && value.strides() == reference.strides() &&
      dense_block(value)) {
    if (std::int64_t finite = 0; identical_floats(FloatSource{value.data(), value.dtype()},
                                                  static_cast<const float*>(reference.data()),
                                                  static_cast<std::size_t>(value.numel()), finite)) {
      ErrorStats same;
      same.counted = same.exact = finite;
      same.bits = significand_bits(dtype);
      p.settled = same;
      return p;
    }
  }
  // r as f32 on the host, contiguous (the cast kernel widens f16 and bf16, F16C where the CPU has it); y as it
  // is stored when it is contiguous on the host (FloatSource widens it a block at a time), not copied.
  p.y = value.to(Device::cpu()).contiguous();
  p.r = reference.to(DType::f32).to(Device::cpu()).contiguous();
  return p;
}
}  // namespace

ErrorStats compare(const Tensor& value, const Tensor& reference, DType dtype, std::string_view op) {
  return prepare(value, reference, dtype, op).run();
}

namespace {
// Several comparisons at once, one per thread of the pool (the largest first, each to the thread with the
// least work so far), each whole on its thread. A comparison split over threads (compare_floats_chunked) gains
// little: its mean is a sum in element order, so the chunks after the first store their terms and one thread
// adds them afterwards, a pass of dependent additions; two comparisons side by side (an op's local and
// accumulated values, a node's gradients) each run whole, with no terms stored. Each gives the bits compare()
// gives; the result's i-th entry is the errors of comparisons[i] (value, reference, dtype, op).
struct Comparison {
  const Tensor& value;
  const Tensor& reference;
  DType dtype;
  std::string_view op;
};
std::vector<ErrorStats> compare_together(const std::vector<Comparison>& comparisons) {
  std::vector<Prepared> jobs;
  jobs.reserve(comparisons.size());
  for (const Comparison& c : comparisons) jobs.push_back(prepare(c.value, c.reference, c.dtype, c.op));
  std::vector<ErrorStats> out(jobs.size());
  const int threads = cpu::num_threads();
  const bool all_fast = std::all_of(jobs.begin(), jobs.end(), [](const Prepared& p) { return p.fast; });
  if (jobs.size() < 2 || threads < 2 || !all_fast || cpu::detail::in_parallel_region()) {
    for (std::size_t i = 0; i < jobs.size(); ++i) out[i] = jobs[i].run();
    return out;
  }
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto work = [&](std::size_t i) { return jobs[i].settled ? std::int64_t{0} : jobs[i].y.numel(); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return work(a) > work(b); });
  const auto bins = static_cast<std::size_t>(std::min<std::int64_t>(threads, static_cast<std::int64_t>(jobs.size())));
  std::vector<std::vector<std::size_t>> bin(bins);
  std::vector<std::int64_t> load(bins, 0);
  for (const std::size_t i : order) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bin[least].push_back(i);
    load[least] += work(i) + 1;
  }
  cpu::parallel_for(static_cast<std::int64_t>(bins), 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b) {
      for (const std::size_t i : bin[static_cast<std::size_t>(b)]) out[i] = jobs[i].run();
    }
  });
  return out;
}
}  // namespace

namespace {

// ---- the local value of a large unary element-wise op, by table ----
// An op that maps each element of one f16 or bf16 input on its own (its scalar operands fixed) has at most
// 65536 distinct inputs: its body run once on every one of them, widened as widened() widens them, is a table
// whose entries are exactly what the body computes for those elements wherever they stand, so the local
// value of a large input is a lookup per element (gelu over a transformer's MLP activations: 524288 tanhf
// calls become 65536). Only ops whose kernels compute each element alone, from its value, are marked
// (OpFlag::element_table); add, sub, mul, div and rsub qualify with a scalar operand, when the only input is
// the tensor.
bool elementwise_unary(std::string_view op) { return analysis::op_has(op, analysis::OpFlag::element_table); }

constexpr std::int64_t kHalfValues = 65536;  // bit patterns of an f16 or bf16

// The body of `event` run on its input widened, through a table; an undefined tensor where that does not apply
// (then the caller runs the body on the input itself).
Tensor local_by_table(const OpEvent& event) {
  if (event.inputs.size() != 1 || !elementwise_unary(event.op)) return {};
  const Tensor& in = event.inputs[0];
  if (!in.defined() || !low_precision(in.dtype()) || !in.device().is_cpu() || !in.is_contiguous() ||
      in.numel() < 4 * kHalfValues) {
    return {};  // a smaller input costs less than the table
  }
  Tensor every = Tensor::empty({kHalfValues}, {.dtype = in.dtype()});
  auto* bits = static_cast<std::uint16_t*>(every.data());
  for (std::int64_t b = 0; b < kHalfValues; ++b) bits[b] = static_cast<std::uint16_t>(b);
  const Tensor table = (*event.recompute)({widened(every)}).contiguous();
  if (table.dtype() != DType::f32 || table.numel() != kHalfValues || !table.device().is_cpu()) return {};
  Tensor out = Tensor::empty(in.shape(), {.dtype = DType::f32});
  const float* t = table.data_as<float>();
  const auto* x = static_cast<const std::uint16_t*>(in.data());
  float* o = out.data_as<float>();
  for (std::int64_t i = 0, n = in.numel(); i < n; ++i) o[i] = t[x[i]];
  return out;
}

}  // namespace

Twin::Twin(std::shared_ptr<Hook> inner, TwinOptions options) : inner_(std::move(inner)), options_(options) {
  if (!inner_) throw Error("twin: no hook to wrap; pass the probe the twin rides along with");
  if (options_.every < 1) {
    throw Error(fmt::format("twin: every must be at least 1 (got {}); 1 twins every step", options_.every));
  }
}

bool Twin::wants_op(std::string_view op, const std::string& scope) { return inner_->wants_op(op, scope); }
void Twin::before_op(std::string_view op, const std::string& scope) { inner_->before_op(op, scope); }

void Twin::on_op(const OpEvent& event) {
  if (active_ && event.step == step_) {
    // The twin never changes the run: an op its body refuses to compute again in f32 is not covered.
    try {
      twin(event);
    } catch (const std::exception&) {
      ++uncovered_[std::string(event.op)];
    }
  }
  inner_->on_op(event);
}

void Twin::on_backward_op(const OpEvent& event) {
  if (active_ && options_.backward && event.step == step_) {
    // As forward: a node whose backward refuses to run again in f32 is not covered, and the run goes on.
    try {
      twin_backward(event);
    } catch (const std::exception&) {
      ++uncovered_[fmt::format("backward of {}", event.op)];
    }
  }
  inner_->on_backward_op(event);
}
void Twin::on_grads(const GradEvent& event) { inner_->on_grads(event); }
void Twin::on_scaler(const ScalerEvent& event) { inner_->on_scaler(event); }
void Twin::on_update(const UpdateEvent& event) { inner_->on_update(event); }

void Twin::on_fp8_quantize(const Fp8QuantizeEvent& event) {
  if (active_ && event.step == step_) {
    Fp8Pending& pending = fp8_pending_[event.module];
    Fp8Cast& cast = event.operand == "input" ? pending.input : event.operand == "weight" ? pending.weight : pending.grad_output;
    cast.seen = true;
    cast.q.codes.assign(event.codes.begin(), event.codes.end());
    cast.q.format = event.format == "e5m2" ? Fp8Format::e5m2 : Fp8Format::e4m3;
    cast.q.amax = event.amax;
    cast.q.scale = event.scale;
    cast.q.scale_inv = event.scale_inv;
  }
  inner_->on_fp8_quantize(event);
}

void Twin::on_block_quantize(const BlockQuantizeEvent& event) {
  if (active_ && event.step == step_ && !event.what_if && !event.decoded.empty() &&
      static_cast<std::int64_t>(event.decoded.size()) == event.rows * event.cols) {
    BlockCopies& pending = block_pending_[event.module];
    const bool columnwise = event.copy == "columnwise";
    std::optional<BlockOperand>& slot =
        event.operand == "input"    ? (columnwise ? pending.input_col : pending.input_row)
        : event.operand == "weight" ? (columnwise ? pending.weight_col : pending.weight_row)
                                    : (columnwise ? pending.grad_col : pending.grad_row);
    slot = block_operand_from_decoded(std::vector<float>(event.decoded.begin(), event.decoded.end()), event.rows,
                                      event.cols, event.format == "mxfp8" && columnwise, event.global_decode);
  }
  inner_->on_block_quantize(event);
}

void Twin::forget_fp8() {
  fp8_pending_.clear();
  fp8_forward_.clear();
  block_pending_.clear();
  block_forward_.clear();
}
bool Twin::wants_params() { return inner_->wants_params(); }
void Twin::on_params(const ParamsEvent& event) { inner_->on_params(event); }

void Twin::on_step_begin(std::int64_t step) {
  forget_fp8();
  values_.clear();
  stats_.clear();
  layouts_.clear();
  step_ = step;
  active_ = step % options_.every == 0;
  inner_->on_step_begin(step);
}

void Twin::hand_over() {
  if (!options_.sink) return;
  for (std::size_t i = handed_; i < rows_.size(); ++i) options_.sink->write(rows_[i]);
  if (options_.keep_rows) {
    handed_ = rows_.size();
  } else {
    rows_.clear();
    handed_ = 0;
  }
}

void Twin::on_step_end(const StepSummary& summary) {
  forget_fp8();
  values_.clear();
  stats_.clear();
  layouts_.clear();
  active_ = false;
  hand_over();  // before the probe ends the step: its end_step makes the rows durable with the step's
  inner_->on_step_end(summary);
}

void Twin::on_step_abandoned(std::int64_t step) {
  forget_fp8();
  values_.clear();
  stats_.clear();
  layouts_.clear();
  active_ = false;
  hand_over();
  inner_->on_step_abandoned(step);
}

namespace {
// A row naming the op or node of `event` (step, seq, op, module) with output dtype `dtype`.
PrecisionRow row_for(const OpEvent& event, DType dtype) {
  PrecisionRow row;
  row.step = event.step;
  row.seq = event.seq;
  row.op = std::string(event.op);
  row.module = event.scope;
  row.out_dtype = std::string(dtype_name(dtype));
  return row;
}
}  // namespace

DType Twin::reference_dtype(DType out) const {
  if (low_precision(out)) return DType::f32;
  if (out == DType::f32 && options_.f32_in_f64) return DType::f64;
  return out;
}

void Twin::twin(const OpEvent& event) {
  if (!event.output.defined() || !is_floating(event.output.dtype())) return;
  const DType out_dtype = event.output.dtype();
  // The dtype the twin computes this op in (f32 for f16/bf16; f64 for f32 with f32_in_f64), and the dtype its
  // inputs are widened to and its twin value kept in: the reference with f32_in_f64, else f32 (an f64 op, which
  // only an f32 twin would follow, keeps the f32 twin's values as they are).
  const DType ref = reference_dtype(out_dtype);
  const DType keep = options_.f32_in_f64 ? ref : DType::f32;
  const bool low = ref != out_dtype;
  // The twin's inputs: a twin value where a twinned op of this step produced the input, else the input
  // before autocast's cast.
  std::vector<Tensor> twin_inputs(event.inputs.size());
  // Per input: the producer row's accumulated errors, where the input is that row's output, uncast (its
  // errors against the twin are then those already computed).
  std::vector<const ErrorStats*> known(event.inputs.size(), nullptr);
  // Per input: the twin's input is this input itself, widened exactly (neither cast nor followed).
  std::vector<char> own_value(event.inputs.size(), 0);
  bool follows = false, followed = true, cast = false;
  for (std::size_t i = 0; i < event.inputs.size(); ++i) {
    const Tensor& in = event.inputs[i];
    if (!in.defined()) continue;
    Tensor source = in;
    bool was_cast = false;
    for (const CastRecord& c : event.autocast.casts) {
      if (c.input == static_cast<int>(i)) {
        source = c.source;
        was_cast = cast = true;
      }
    }
    twin_inputs[i] = widened(source, keep);
    own_value[i] = !was_cast && f32_exact(in.dtype());
    const auto [step, seq] = in.producer();
    if (step != event.step) continue;
    const auto it = values_.find(seq);
    if (it == values_.end()) continue;
    // The input holds the producer's output values in the output's order only when it is the output itself
    // (or a view with its start and strides) or a reshape of a contiguous output (same start, contiguous): a
    // transposed view, and a contiguous copy of one (attention's heads merged back), keep the producer's
    // stamp too, but hold the elements in another order.
    const auto layout = layouts_.find(seq);
    const bool same_start = layout != layouts_.end() && in.data() == layout->second.start;
    // With f32_in_f64 a producer's twin value is in its own reference dtype (f32 for an f16 op, f64 for an f32
    // op): taken in this op's.
    const auto in_keep = [&](const Tensor& v) { return options_.f32_in_f64 && v.dtype() != keep ? v.to(keep) : v; };
    if (it->second.shape() == in.shape() && same_start && in.strides() == layout->second.strides) {
      twin_inputs[i] = in_keep(it->second);
      own_value[i] = 0;
      follows = true;
    } else if (it->second.numel() == in.numel() && same_start && layout->second.contiguous && in.is_contiguous()) {
      twin_inputs[i] = in_keep(it->second.reshape(in.shape()));
      own_value[i] = 0;
      follows = true;
    } else {
      followed = false;
      continue;
    }
    const auto st = stats_.find(seq);
    if (!was_cast && st != stats_.end()) known[i] = &st->second;
  }
  if (!low && !follows) return;  // an f32 op on values f32 computed: nothing to compare
  if (event.recompute == nullptr || random_op(event.op)) {
    if (low) ++uncovered_[std::string(event.op)];
    return;
  }
  NoGradGuard no_grad;
  // An op computed again in f64 makes every tensor in f64 (autograd::WidenTo), also where autocast or its caller
  // set f32 (softmax, sum(x, f32)), as the f64 twin of a backward node does.
  std::optional<autograd::WidenTo> widen;
  if (keep == DType::f64) widen.emplace(DType::f64);
  PrecisionRow row = row_for(event, out_dtype);
  row.numel = event.output.numel();
  row.followed = followed;
  Tensor local;
  // An FP8 or block-scaled Linear: its local value is its quantized GEMM in f32, not its accumulated one.
  bool fp8 = false;
  if (low) {
    local = fp8_forward_reference(event);
    if (!local.defined()) local = block_forward_reference(event);
    fp8 = local.defined();
    if (!fp8) local = local_by_table(event);
    if (!local.defined()) {
      std::vector<Tensor> own(event.inputs.size());
      for (std::size_t i = 0; i < event.inputs.size(); ++i) own[i] = widened(event.inputs[i], keep);
      local = (*event.recompute)(own);
    }
  }
  // Inputs the twin does not follow and autocast did not cast are the op's own: the accumulated values are
  // the local ones.
  const bool same = low && !follows && !cast && !fp8;
  const Tensor acc = same ? local.to(keep) : (*event.recompute)(twin_inputs).to(keep);
  // The comparisons, side by side (compare_together): the output against the local and the accumulated values,
  // and each input the twin replaced against the twin's input. Against its own exact widening every finite
  // element of an input is exact: errors of 0, which leave the row's maxima as they are, without a pass over it
  // (attention's transposed q, k and v); an input that is a twinned output of this step, uncast, has the errors
  // its producer's row already holds.
  std::vector<Comparison> comparisons;
  if (low) comparisons.push_back({event.output, local, out_dtype, event.op});
  if (!same) comparisons.push_back({event.output, acc, out_dtype, event.op});
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> input_at(event.inputs.size(), kNone);  // per input: its comparison, if it has one
  for (std::size_t i = 0; i < event.inputs.size(); ++i) {
    const Tensor& in = event.inputs[i];
    if (!in.defined() || !is_floating(in.dtype()) || !twin_inputs[i].defined()) continue;
    if (in.numel() != twin_inputs[i].numel() || own_value[i] != 0 || known[i] != nullptr) continue;
    input_at[i] = comparisons.size();
    comparisons.push_back({in, twin_inputs[i], in.dtype(), ""});
  }
  const std::vector<ErrorStats> errors = compare_together(comparisons);
  ErrorStats l;
  if (low) {
    l = errors[0];
    row.local = true;
    row.local_max_rel = l.max_rel;
    row.local_mean_rel = l.mean_rel;
    row.local_max_ulp = l.max_ulp;
  }
  const ErrorStats a = same ? l : errors[low ? 1 : 0];
  row.acc_max_rel = a.max_rel;
  row.acc_mean_rel = a.mean_rel;
  row.acc_max_ulp = a.max_ulp;
  row.flips = a.flips;
  row.bits = a.bits;
  row.error_bins = a.error_bins;
  row.exact = a.exact;
  for (std::size_t i = 0; i < event.inputs.size(); ++i) {
    const ErrorStats* e = known[i] != nullptr ? known[i] : input_at[i] != kNone ? &errors[input_at[i]] : nullptr;
    if (e == nullptr) continue;
    const Tensor& in = event.inputs[i];
    if (!in.defined() || !is_floating(in.dtype()) || !twin_inputs[i].defined()) continue;
    if (in.numel() != twin_inputs[i].numel() || own_value[i] != 0) continue;
    row.in_acc_max_rel = std::max(row.in_acc_max_rel, e->max_rel);
    row.in_acc_mean_rel = std::max(row.in_acc_mean_rel, e->mean_rel);
  }
  // Condition numbers, from the twin's values.
  row.cond = std::numeric_limits<double>::quiet_NaN();
  const double floor = relative_error_floor(out_dtype);
  const analysis::OpKind kind = analysis::op_kind(event.op);
  // rsub (s - a) negates its tensor; add and sub keep its sign.
  const bool negates = analysis::op_has(event.op, analysis::OpFlag::negates);
  if (kind == analysis::OpKind::additive && !negates && twin_inputs.size() == 2 && twin_inputs[1].defined()) {
    row.cond = max_ratio(add(abs(twin_inputs[0]), abs(twin_inputs[1])), acc, floor);
  } else if (kind == analysis::OpKind::additive && twin_inputs.size() == 1) {
    // The scalar operand is not an input: |s| = |out - a| (add, sub) or |out + a| (rsub, out = s - a).
    const Tensor& x = twin_inputs[0];
    const Tensor other = negates ? abs(add(acc, x)) : abs(sub(acc, x));
    row.cond = max_ratio(add(abs(x), other), acc, floor);
  } else if (kind == analysis::OpKind::reduction && twin_inputs.size() == 1) {
    row.cond = max_ratio((*event.recompute)({abs(twin_inputs[0])}).to(keep), acc, floor);
  }
  values_[event.seq] = acc;
  stats_[event.seq] = a;
  layouts_[event.seq] = Layout{event.output.data(), event.output.strides(), event.output.is_contiguous()};
  rows_.push_back(std::move(row));
}

// ---- the backward twin (local error of each autograd node that ran in f16/bf16) ----

namespace {
// The narrower of two floating dtypes (fewer significand bits).
DType narrower(DType a, DType b) { return significand_bits(b) < significand_bits(a) ? b : a; }

// A node's gradients judged together: the largest max and mean (each gradient is a quantity of its own: a
// bias's gradient of 8 elements that lost its digits is not diluted by a weight's 4096 good ones), counts summed.
void merge(ErrorStats& into, const ErrorStats& more, double p) {
  into.counted += more.counted;
  into.mean_rel = std::max(into.mean_rel, more.mean_rel);
  into.max_rel = std::max(into.max_rel, more.max_rel);
  into.max_ulp = std::max(into.max_ulp, more.max_ulp);
  into.flips += more.flips;
  into.exact += more.exact;
  for (std::size_t k = 0; k < into.error_bins.size(); ++k) into.error_bins[k] += more.error_bins[k];
  into.bits = into.max_rel == 0 ? p : std::clamp(-std::log2(into.max_rel), 0.0, p) + 0.0;
}
}  // namespace

void Twin::twin_backward(const OpEvent& event) {
  if (event.recompute_backward == nullptr || event.inputs.empty() || !event.inputs[0].defined()) return;
  DType dtype = DType::f64;
  for (const Tensor& g : event.outputs) {
    if (g.defined() && is_floating(g.dtype())) dtype = narrower(dtype, g.dtype());
  }
  // One dtype wider than its narrowest gradient: f32 for f16/bf16; f64 for f32 with f32_in_f64. A node whose
  // gradients are f32 (without f32_in_f64) or f64 has nothing to compare.
  const DType ref = reference_dtype(dtype);
  if (ref == dtype) return;
  NoGradGuard no_grad;
  std::vector<Tensor> reference = (*event.recompute_backward)(event.inputs[0], ref);
  if (!fp8_backward_reference(event, reference)) (void)block_backward_reference(event, reference);
  PrecisionRow row = row_for(event, dtype);
  row.phase = trace::Phase::backward;
  row.local = true;
  row.cond = std::numeric_limits<double>::quiet_NaN();
  ErrorStats all;
  const double p = significand_bits(dtype);
  all.bits = p;
  std::vector<Comparison> comparisons;  // the node's gradients, compared side by side (compare_together)
  for (std::size_t i = 0; i < event.outputs.size() && i < reference.size(); ++i) {
    const Tensor& g = event.outputs[i];
    if (!g.defined() || !is_floating(g.dtype()) || !reference[i].defined()) continue;
    comparisons.push_back({g, reference[i], g.dtype(), ""});
    row.numel += g.numel();
  }
  for (const ErrorStats& e : compare_together(comparisons)) merge(all, e, p);
  row.local_max_rel = all.max_rel;
  row.local_mean_rel = all.mean_rel;
  row.local_max_ulp = all.max_ulp;
  row.flips = all.flips;
  row.bits = all.bits;
  row.error_bins = all.error_bins;
  row.exact = all.exact;
  rows_.push_back(std::move(row));
}

// ---- FP8 Linears (probes/twin.h, "FP8 Linears") ----

namespace {
// Whether `y` is `reference` rounded to y's dtype, element for element (bits): what an FP8 GEMM's output is to
// its f32 value. A reference made from the wrong operands fails it.
bool rounds_to(const Tensor& y, const Tensor& reference) {
  if (!y.defined() || !reference.defined() || y.numel() != reference.numel()) return false;
  const Tensor a = y.contiguous();
  const Tensor b = reference.to(y.dtype()).contiguous();
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// A cast of the twin's copy as the [rows, cols] matrix it quantized; false when its codes do not fill one.
bool shaped(Fp8Quantized& q, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols <= 0 || static_cast<std::int64_t>(q.codes.size()) != rows * cols) return false;
  q.rows = rows;
  q.cols = cols;
  return true;
}
}  // namespace

Tensor Twin::fp8_forward_reference(const OpEvent& event) {
  if (event.op != "linear" || event.inputs.size() < 2 || !event.inputs[0].defined() || !event.inputs[1].defined()) {
    return {};
  }
  const auto it = fp8_pending_.find(event.scope);
  if (it == fp8_pending_.end() || !it->second.input.seen || !it->second.weight.seen) return {};
  Fp8Quantized qx = std::move(it->second.input.q), qw = std::move(it->second.weight.q);
  it->second.input.seen = it->second.weight.seen = false;
  const Tensor& x = event.inputs[0];
  const Tensor& w = event.inputs[1];
  if (w.dim() != 2) return {};
  const std::int64_t in = w.size(1);
  if (!shaped(qx, x.numel() / std::max<std::int64_t>(in, 1), in) || !shaped(qw, w.size(0), in)) {
    throw Error("the twin's FP8 operands do not have this Linear's shapes");  // on_op counts it uncovered
  }
  const Tensor bias = event.inputs.size() > 2 ? event.inputs[2] : Tensor();
  // The GEMM the run computed (core/fp8_linear.h fp8_gemm), kept in f32: the run's output is this value rounded
  // once to bf16 (checked), so the row's local error is that rounding's and nothing else.
  Tensor reference = fp8_gemm(qx, false, qw, true, DType::f32, bias).reshape(event.output.shape());
  if (!rounds_to(event.output, reference)) {
    throw Error("the twin's FP8 operands are not the ones this Linear used");  // on_op counts it uncovered
  }
  fp8_forward_[event.scope].emplace_back(std::move(qx), std::move(qw));
  return reference;
}

bool Twin::fp8_backward_reference(const OpEvent& event, std::vector<Tensor>& reference) {
  if (event.op != "linear") return false;
  const auto pending = fp8_pending_.find(event.scope);
  const auto forward = fp8_forward_.find(event.scope);
  if (pending == fp8_pending_.end() || !pending->second.grad_output.seen || forward == fp8_forward_.end() ||
      forward->second.empty()) {
    return false;
  }
  Fp8Quantized qg = std::move(pending->second.grad_output.q);
  pending->second.grad_output.seen = false;
  const auto [qx, qw] = std::move(forward->second.back());
  forward->second.pop_back();
  if (!shaped(qg, qx.rows, qw.rows) || reference.size() < 2 || event.outputs.size() < 2) {
    throw Error("the twin's FP8 grad_output is not this Linear's");  // on_backward_op counts it uncovered
  }
  const Tensor& gx = event.outputs[0];
  const Tensor& gw = event.outputs[1];
  // dgrad Q(dy) Q(W) and wgrad Q(dy)^T Q(x), as the node computed them, kept in f32 (checked as forward).
  if (gx.defined()) reference[0] = fp8_gemm(qg, false, qw, false, DType::f32).reshape(gx.shape());
  if (gw.defined()) reference[1] = fp8_gemm(qg, true, qx, false, DType::f32).reshape(gw.shape());
  if ((gx.defined() && !rounds_to(gx, reference[0])) || (gw.defined() && !rounds_to(gw, reference[1]))) {
    throw Error("the twin's FP8 operands are not the ones this Linear's backward used");
  }
  return true;
}

// ---- Block-scaled Linears (probes/twin.h, "Block-scaled Linears") ----

Tensor Twin::block_forward_reference(const OpEvent& event) {
  if (event.op != "linear" || event.inputs.size() < 2 || !event.inputs[0].defined() || !event.inputs[1].defined()) {
    return {};
  }
  const auto it = block_pending_.find(event.scope);
  if (it == block_pending_.end() || !it->second.input_row || !it->second.weight_row) return {};
  BlockCopies copies = std::move(it->second);
  it->second = BlockCopies{};
  const Tensor& x = event.inputs[0];
  const Tensor& w = event.inputs[1];
  if (w.dim() != 2 || copies.input_row->k != w.size(1) || copies.weight_row->rows != w.size(0) ||
      copies.weight_row->k != w.size(1) || copies.input_row->rows * w.size(1) != x.numel()) {
    throw Error("the twin's block-scaled copies do not have this Linear's shapes");  // on_op counts it uncovered
  }
  const Tensor bias = event.inputs.size() > 2 ? event.inputs[2] : Tensor();
  // fprop: x rowwise times W rowwise, the run's block GEMM kept in f32; the run's output is it rounded once (checked).
  Tensor reference = block_gemm(*copies.input_row, *copies.weight_row, DType::f32, bias).reshape(event.output.shape());
  if (!rounds_to(event.output, reference)) {
    throw Error("the twin's block-scaled copies are not the ones this Linear used");  // on_op counts it uncovered
  }
  block_forward_[event.scope].emplace_back(std::move(copies.input_col), std::move(copies.weight_col));
  return reference;
}

bool Twin::block_backward_reference(const OpEvent& event, std::vector<Tensor>& reference) {
  if (event.op != "linear") return false;
  const auto pending = block_pending_.find(event.scope);
  if (pending == block_pending_.end() || (!pending->second.grad_row && !pending->second.grad_col)) return false;
  std::optional<BlockOperand> g_row = std::move(pending->second.grad_row), g_col = std::move(pending->second.grad_col);
  pending->second.grad_row.reset();
  pending->second.grad_col.reset();
  const auto forward = block_forward_.find(event.scope);
  if (forward == block_forward_.end() || forward->second.empty()) {
    // Its forward was not compared (uncovered): a reference of the unquantized product would misname the error.
    throw Error("the twin has no block-scaled forward copies for this Linear's backward");
  }
  auto [x_col, w_col] = std::move(forward->second.back());
  forward->second.pop_back();
  if (reference.size() < 2 || event.outputs.size() < 2) throw Error("the twin's block-scaled Linear node has no dgrad and wgrad");
  const Tensor& gx = event.outputs[0];
  const Tensor& gw = event.outputs[1];
  if ((gx.defined() && (!g_row || !w_col)) || (gw.defined() && (!g_col || !x_col))) {
    throw Error("the twin's block-scaled copies are not this Linear's backward's");
  }
  // dgrad dy rowwise times W columnwise, wgrad dy columnwise times x columnwise, as the node computed them, in f32.
  if (gx.defined()) reference[0] = block_gemm(*g_row, *w_col, DType::f32).reshape(gx.shape());
  if (gw.defined()) reference[1] = block_gemm(*g_col, *x_col, DType::f32).reshape(gw.shape());
  if ((gx.defined() && !rounds_to(gx, reference[0])) || (gw.defined() && !rounds_to(gw, reference[1]))) {
    throw Error("the twin's block-scaled copies are not the ones this Linear's backward used");
  }
  return true;
}

}  // namespace ampscope::probe
