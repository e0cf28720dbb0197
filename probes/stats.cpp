#include "probes/stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include <fmt/format.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "core/block_stats.h"
#include "core/device.h"
#include "core/error.h"
#include "core/float8.h"
#include "core/probe_hook.h"
#include "kernels/parallel.h"

namespace ampscope::probe {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kExponentOffset = -trace::kHistMinExponent;  // bin of exponent e is e + 64

// The bit layout of each floating storage type: the magnitude bits (sign cleared) order values by
// magnitude, so one comparison classifies a value (>= inf bits: inf or NaN; < min-normal bits and
// non-zero: subnormal), and the exponent field gives the histogram bin without a log.
template <class T>
struct Bits;
template <>
struct Bits<float> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFFFFFu, kInf = 0x7F800000u, kMinNormal = 0x00800000u, kSign = 0x80000000u;
  static constexpr int kShift = 23, kBias = 127;
  static U raw(float x) {
    U u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  }
  static double value(float x) { return x; }
};
template <>
struct Bits<double> {
  using U = std::uint64_t;
  static constexpr U kAbs = 0x7FFFFFFFFFFFFFFFull, kInf = 0x7FF0000000000000ull, kMinNormal = 0x0010000000000000ull,
                     kSign = 0x8000000000000000ull;
  static constexpr int kShift = 52, kBias = 1023;
  static U raw(double x) {
    U u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  }
  static double value(double x) { return x; }
};
template <>
struct Bits<f16> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFu, kInf = 0x7C00u, kMinNormal = 0x0400u, kSign = 0x8000u;
  static constexpr int kShift = 10, kBias = 15;
  static U raw(f16 x) { return x.bits; }
  static double value(f16 x) { return ampscope::detail::f16_bits_to_float(x.bits); }
};
template <>
struct Bits<bf16> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFu, kInf = 0x7F80u, kMinNormal = 0x0080u, kSign = 0x8000u;
  static constexpr int kShift = 7, kBias = 127;
  static U raw(bf16 x) { return x.bits; }
  static double value(bf16 x) { return ampscope::detail::bf16_bits_to_float(x.bits); }
};

template <class T>
constexpr bool kIsFloat =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// The histogram bin of a finite, non-zero magnitude given by its bits.
template <class T>
int exponent_bin(typename Bits<T>::U magnitude) {
  using B = Bits<T>;
  if (magnitude < B::kMinNormal) return kSubnormalBin;
  const int e = static_cast<int>(magnitude >> B::kShift) - B::kBias;
  if (e < trace::kHistMinExponent) return kSubnormalBin;
  return std::min(e, trace::kHistMaxExponent) + kExponentOffset;
}

int integer_bin(double v) {
  if (v == 0) return kZeroBin;
  return std::min(std::ilogb(std::fabs(v)), trace::kHistMaxExponent) + kExponentOffset;
}

// Calls fn(offset_a, offset_b, count, stride_a, stride_b) for the runs along the last dimension that
// cover the row-major elements [begin, end) of two same-shaped strided tensors (offsets in elements).
template <class Fn>
void for_each_run(const Shape& sizes, const Shape& sa, const Shape& sb, std::int64_t begin, std::int64_t end, Fn&& fn) {
  const int nd = static_cast<int>(sizes.size());
  if (begin >= end) return;
  if (nd == 0) {
    fn(0, 0, 1, 0, 0);
    return;
  }
  std::int64_t idx[kMaxDims] = {};
  std::int64_t rem = begin, oa = 0, ob = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % sizes[d];
    rem /= sizes[d];
    oa += idx[d] * sa[d];
    ob += idx[d] * sb[d];
  }
  const std::int64_t inner = sizes[nd - 1], ia = sa[nd - 1], ib = sb[nd - 1];
  for (std::int64_t pos = begin; pos < end;) {
    const std::int64_t count = std::min(inner - idx[nd - 1], end - pos);
    fn(oa, ob, count, ia, ib);
    pos += count;
    idx[nd - 1] += count;
    oa += count * ia;
    ob += count * ib;
    for (int d = nd - 1; d > 0 && idx[d] == sizes[d]; --d) {
      oa += sa[d - 1] - sizes[d] * sa[d];
      ob += sb[d - 1] - sizes[d] * sb[d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// Runs fn(begin, end, partial) over [0, n) in chunks, one partial result per chunk, in chunk order, so
// the merged result does not depend on which thread ran which chunk. The chunks' bounds depend on n only,
// never on the number of threads, so the sums, and the mean and rms, are the same bits at any
// AMPSCOPE_NUM_THREADS: one chunk below kElementwiseGrain values, from there n / kElementwiseGrain chunks but at
// least two and at most kStatChunks. (Two from kElementwiseGrain, not from twice it: a step whose own kernels leave
// the second core idle, the MLP's, then reads its many 32k-value activations on both cores, 4% of its step at a
// quiet machine; bench/RESULTS.md, probe_bench, 2026-11-29 16:04. Before, 32,768 to 65,535 values were one chunk.)
inline constexpr std::int64_t kStatChunks = 16;
int stat_chunks(std::int64_t n) {
  if (n < cpu::kElementwiseGrain) return 1;
  return static_cast<int>(std::clamp<std::int64_t>(n / cpu::kElementwiseGrain, 2, kStatChunks));
}
template <class Partial, class Fn>
void run_chunked(std::int64_t n, std::vector<Partial>& parts, Fn&& fn) {
  const int chunks = stat_chunks(n);
  parts.assign(static_cast<std::size_t>(chunks), Partial{});
  if (chunks == 1) {
    fn(0, n, parts[0]);
    return;
  }
  cpu::parallel_for(chunks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c)
      fn(n * c / chunks, n * (c + 1) / chunks, parts[static_cast<std::size_t>(c)]);
  });
}

// Statistics are read from host memory. A CUDA tensor is copied to the host first, for now: a
// device-side reduction (issue 10) will replace the copy.
Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.detach().to(Device::cpu()); }

struct Partial {
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0;
  double min = kInf, max = -kInf, absmax = 0, sum = 0, sum_sq = 0;
  std::array<std::int64_t, trace::kHistBins> hist{};
};

// The hot loop: one run of `count` elements `stride` apart. The common case (a finite value) takes no
// unpredictable branch: zero and subnormal counts are added as comparisons, since relu outputs are
// half zeros.
// Always inlined, so that inside the AVX2 version of the fast path below it is AVX code too: a call from
// there into SSE code would run with the vector registers' upper halves dirty, which is slow.
template <class T, bool kHist>
[[gnu::always_inline]] inline void accumulate_run(const T* p, std::int64_t count, std::int64_t stride, Partial& a) {
  double sum = 0, sum_sq = 0, mn = a.min, mx = a.max, amax = a.absmax;
  std::int64_t zero = 0, subnormal = 0;
  if constexpr (kIsFloat<T>) {
    using B = Bits<T>;
    for (std::int64_t i = 0; i < count; ++i) {
      const T x = p[i * stride];
      const typename B::U r = B::raw(x);
      const typename B::U m = r & B::kAbs;
      if (m >= B::kInf) [[unlikely]] {
        if (m > B::kInf) {
          ++a.nan;
          if constexpr (kHist) ++a.hist[kNanBin];
        } else {
          ++((r & B::kSign) != 0 ? a.neg_inf : a.pos_inf);
          if constexpr (kHist) ++a.hist[kInfBin];
        }
        continue;
      }
      const double v = B::value(x);
      sum += v;
      sum_sq += v * v;
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
      const double av = std::fabs(v);
      amax = av > amax ? av : amax;
      zero += m == 0;
      subnormal += (m - 1) < (B::kMinNormal - 1);  // m in [1, min normal): wraps around for m == 0
      if constexpr (kHist) ++a.hist[m == 0 ? kZeroBin : exponent_bin<T>(m)];
    }
  } else {
    for (std::int64_t i = 0; i < count; ++i) {
      const double v = static_cast<double>(p[i * stride]);
      sum += v;
      sum_sq += v * v;
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
      amax = std::max(amax, std::fabs(v));
      zero += v == 0;
      if constexpr (kHist) ++a.hist[integer_bin(v)];
    }
  }
  a.sum += sum;
  a.sum_sq += sum_sq;
  a.min = mn;
  a.max = mx;
  a.absmax = amax;
  a.zero += zero;
  a.subnormal += subnormal;
}

// A block of the vector loops below that holds NaN or inf, in their lanes: lane k (0..7) takes values 8t + k in order,
// each finite one added to its sum from zero and its square to its sum of squares (exact in double: one rounding, as
// the loops' FMA), its min and max kept in float (x < m ? x : m); NaN and inf are counted and skipped. What the block
// gives the loops' running lanes is then folded as any block's: lanes k + (k + 4) of the sums (bs, bq), and the
// lanes' min and max combined the same way (cmn, cmx). Scalar code, for the baseline and AVX2 builds: eight
// independent chains instead of the one a value-by-value sum made, 1.55 -> 1.21 ns a value at one thread on a causal
// mask's scores (-inf above the diagonal: nearly every block of them holds one); the AVX-512 build has its own below.
struct NonFiniteBlock {
  double bs[4], bq[4];
  float cmn[4], cmx[4];
  std::int64_t zero = 0, subnormal = 0, nan = 0, pos_inf = 0, neg_inf = 0;
  bool any_finite = false;
};

// Always inlined, as accumulate_run: inside the AVX2 and AVX-512 builds it is their code (no call into SSE code
// with the vector registers' upper halves dirty).
template <class T>
[[gnu::always_inline]] inline void non_finite_block(const T* p, int block, NonFiniteBlock& out) {
  using B = Bits<T>;
  constexpr float kBig = std::numeric_limits<float>::infinity();
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float mn[8], mx[8];
  std::fill(mn, mn + 8, kBig);
  std::fill(mx, mx + 8, -kBig);
  std::int64_t small = 0;
  for (int t = 0; t < block; t += 8) {
    for (int k = 0; k < 8; ++k) {
      const T x = p[t + k];
      const typename B::U r = B::raw(x);
      const typename B::U m = r & B::kAbs;
      if (m >= B::kInf) {
        if (m > B::kInf) {
          ++out.nan;
        } else {
          ++((r & B::kSign) != 0 ? out.neg_inf : out.pos_inf);
        }
        continue;
      }
      out.any_finite = true;
      const double v = B::value(x);
      const auto f = static_cast<float>(v);  // exact: the value came from f32, f16 or bf16
      s[k] += v;
      q[k] += v * v;
      mn[k] = f < mn[k] ? f : mn[k];
      mx[k] = f > mx[k] ? f : mx[k];
      out.zero += m == 0;
      small += m < B::kMinNormal;
    }
  }
  out.subnormal = small - out.zero;
  for (int k = 0; k < 4; ++k) {
    out.bs[k] = s[k] + s[k + 4];
    out.bq[k] = q[k] + q[k + 4];
    out.cmn[k] = mn[k] < mn[k + 4] ? mn[k] : mn[k + 4];
    out.cmx[k] = mx[k] > mx[k + 4] ? mx[k] : mx[k + 4];
  }
}

// Its counts into the run's partial result; whether it has lanes to fold (a block of NaN and inf only has none).
inline bool count_non_finite_block(const NonFiniteBlock& b, Partial& a) {
  a.nan += b.nan;
  a.pos_inf += b.pos_inf;
  a.neg_inf += b.neg_inf;
  a.zero += b.zero;
  a.subnormal += b.subnormal;
  return b.any_finite;
}

// ---- the fast path: contiguous f32, f16 and bf16 without histogram ----
// Blocks of kBlock values, eight at a time. The magnitude bits give the zero and subnormal counts as two
// vector compares (signed compares: a magnitude has its sign bit clear). min and max are kept in float
// (widening to double is exact and keeps order, so the same values win every comparison), and the values,
// widened to double, feed separate accumulators (two vectors each for the sum and the sum of squares) so
// that no add waits for the one before. A block that turns out to hold NaN or inf is re-read in the same lanes
// with those values counted and skipped (non_finite_block). It needs no compare of its own where the values widen to their own
// NaN and inf (f32, bf16, f16 with F16C): a square of a finite f32 is below 2^256, so a lane's sum of
// squares over a block is finite exactly when every value it took was. The types are GCC/Clang vector
// extensions.
//
// The additions are those of the earlier loop, in the same order (lane by lane, then s0 + s1 per block,
// then the four lanes pairwise at the end), so the sums are the same bits; the counts, min, max and absmax
// are exact either way. With AVX2 (and F16C, FMA) 0.18 ns per f32 value on one core of the development
// machine, 0.27 per f16 or bf16; the earlier loop took 0.35 and 0.55 (bench/RESULTS.md, 2026-11-29 06:43).
using F8 = float __attribute__((vector_size(32)));
using F4 = float __attribute__((vector_size(16)));
using D4 = double __attribute__((vector_size(32)));
using I8 = std::int32_t __attribute__((vector_size(32)));
using H8 = std::uint16_t __attribute__((vector_size(16)));

template <class T>
constexpr bool kHasFastPath = std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// The helpers pass vectors by reference: a 32-byte vector by value would change the calling convention
// between the AVX2 build and the file's own target (GCC's -Wpsabi), and they are always inlined anyway.

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AMPSCOPE_STATS_X86 1
// Declared before the loop below uses AVX and F16C builtins: GCC declares an instruction set's builtins
// when it first meets a function that targets it.
template <class T>
__attribute__((target("avx2,f16c,fma"))) void accumulate_contiguous_avx2(const T* p, std::int64_t count, Partial& a);
#define AMPSCOPE_STATS_AVX512_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,f16c,fma,popcnt"
template <class T>
__attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) void accumulate_contiguous_avx512(const T* p, std::int64_t count,
                                                                                     Partial& a);
#endif

// The AVX2 build's helpers and loop, compiled only into accumulate_contiguous_avx2 below (always inlined), where the
// AVX and F16C builtins are available.
#ifdef AMPSCOPE_STATS_X86
// The magnitude bits and the values of eight elements; f16 widens by F16C's vcvtph2ps (exact, NaN and inf included).
template <class T>
[[gnu::always_inline]] inline void load8(const T* p, I8& magnitude, F8& value) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&value, p, sizeof value);
    magnitude = reinterpret_cast<I8>(value) & 0x7FFFFFFF;
  } else {
    H8 h;
    std::memcpy(&h, p, sizeof h);
    const I8 r = __builtin_convertvector(h, I8);  // zero-extended
    magnitude = r & 0x7FFF;
    if constexpr (std::is_same_v<T, bf16>) {
      value = reinterpret_cast<F8>(r << 16);  // a bf16 is the top half of a float
    } else {
      using S8 = short __attribute__((vector_size(16)));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // always inlined into the AVX2 build: no call, no ABI
      value = __builtin_ia32_vcvtph2ps256(reinterpret_cast<S8>(h));
#pragma GCC diagnostic pop
    }
  }
}

// One vcvtps2pd (GCC 12 widens a 4-float vector in two halves and joins them).
[[gnu::always_inline]] inline void widen4(const F4& f, D4& d) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // always inlined into the AVX2 build: no call, no ABI
  d = __builtin_ia32_cvtps2pd256(f);
#pragma GCC diagnostic pop
}

// q += v * v. The square of a value widened from f32, f16 or bf16 is exact in double (at most 2 x 24
// significant bits), so a fused multiply-add rounds where the add alone did: the same bits, one
// instruction fewer.
[[gnu::always_inline]] inline void add_square(D4& q, const D4& v) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // always inlined into the AVX2 build: no call, no ABI
  q = __builtin_ia32_vfmaddpd256(v, v, q);
#pragma GCC diagnostic pop
}

template <class T>
[[gnu::always_inline]] inline void accumulate_contiguous_impl(const T* p, std::int64_t count, Partial& a) {
  using B = Bits<T>;
  constexpr int kBlock = 256;
  constexpr float kBig = std::numeric_limits<float>::infinity();
  constexpr auto kMinNormalBits = static_cast<std::int32_t>(B::kMinNormal);
  const F4 inf4 = {kBig, kBig, kBig, kBig};
  const F8 inf8 = {kBig, kBig, kBig, kBig, kBig, kBig, kBig, kBig};
  // The bound as a vector whose value the compiler does not see: with a constant it turns m < c into
  // min(m, c - 1) == m, two instructions where one compare does.
  I8 min_normal = {kMinNormalBits, kMinNormalBits, kMinNormalBits, kMinNormalBits,
                   kMinNormalBits, kMinNormalBits, kMinNormalBits, kMinNormalBits};
  __asm__("" : "+m"(min_normal));
  D4 sum{}, sq{};
  F4 mn = inf4, mx = -inf4;
  bool any_fast = false;
  std::int64_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    D4 s0{}, s1{}, q0{}, q1{};
    F8 bmn = inf8, bmx = -inf8;
    I8 zero{}, small{};
    for (int j = 0; j < kBlock; j += 8) {
      I8 m;
      F8 f;
      load8<T>(p + i + j, m, f);
      zero += m == 0;              // a true compare is -1
      small += min_normal > m;  // zero or subnormal
      F4 flo, fhi;
      std::memcpy(&flo, &f, sizeof flo);
      std::memcpy(&fhi, reinterpret_cast<const char*>(&f) + sizeof flo, sizeof fhi);
      D4 lo, hi;
      widen4(flo, lo);
      widen4(fhi, hi);
      s0 += lo;
      s1 += hi;
      add_square(q0, lo);
      add_square(q1, hi);
      bmn = f < bmn ? f : bmn;
      bmx = f > bmx ? f : bmx;
    }
    const D4 q = q0 + q1;
    const D4 d = q - q;  // NaN exactly where q is inf or NaN
    if ((d[0] != 0) | (d[1] != 0) | (d[2] != 0) | (d[3] != 0)) {
      NonFiniteBlock b;
      non_finite_block(p + i, kBlock, b);
      if (!count_non_finite_block(b, a)) continue;
      any_fast = true;
      D4 bs, bq;
      F4 cmn, cmx;
      std::memcpy(&bs, b.bs, sizeof bs);
      std::memcpy(&bq, b.bq, sizeof bq);
      std::memcpy(&cmn, b.cmn, sizeof cmn);
      std::memcpy(&cmx, b.cmx, sizeof cmx);
      sum += bs;
      sq += bq;
      mn = cmn < mn ? cmn : mn;
      mx = cmx > mx ? cmx : mx;
      continue;
    }
    any_fast = true;
    // Horizontal sums of the counts (each lane's is minus its count).
    I8 zs = zero + __builtin_shufflevector(zero, zero, 4, 5, 6, 7, 0, 1, 2, 3);
    I8 ss = small + __builtin_shufflevector(small, small, 4, 5, 6, 7, 0, 1, 2, 3);
    zs += __builtin_shufflevector(zs, zs, 2, 3, 0, 1, 6, 7, 4, 5);
    ss += __builtin_shufflevector(ss, ss, 2, 3, 0, 1, 6, 7, 4, 5);
    const std::int32_t zeros = -(zs[0] + zs[1]), smalls = -(ss[0] + ss[1]);
    a.zero += zeros;
    a.subnormal += smalls - zeros;
    sum += s0 + s1;
    sq += q;
    // Lanes 0-3 and 4-7 of bmn, bmx are the earlier loop's mn0/mn1 and mx0/mx1, combined the same way.
    F4 mn0, mn1, mx0, mx1;
    std::memcpy(&mn0, &bmn, sizeof mn0);
    std::memcpy(&mn1, reinterpret_cast<const char*>(&bmn) + sizeof mn0, sizeof mn1);
    std::memcpy(&mx0, &bmx, sizeof mx0);
    std::memcpy(&mx1, reinterpret_cast<const char*>(&bmx) + sizeof mx0, sizeof mx1);
    const F4 cmn = mn0 < mn1 ? mn0 : mn1, cmx = mx0 > mx1 ? mx0 : mx1;
    mn = cmn < mn ? cmn : mn;
    mx = cmx > mx ? cmx : mx;
  }
  if (any_fast) {
    const double lo = std::min(std::min<double>(mn[0], mn[1]), std::min<double>(mn[2], mn[3]));
    const double hi = std::max(std::max<double>(mx[0], mx[1]), std::max<double>(mx[2], mx[3]));
    a.sum += (sum[0] + sum[1]) + (sum[2] + sum[3]);
    a.sum_sq += (sq[0] + sq[1]) + (sq[2] + sq[3]);
    a.min = std::min(a.min, lo);
    a.max = std::max(a.max, hi);
    a.absmax = std::max({a.absmax, std::fabs(lo), std::fabs(hi)});  // every value here lies in [lo, hi]
  }
  accumulate_run<T, false>(p + i, count - i, 1, a);
}
#endif

// ---- the baseline build (x86-64 without AVX2, and other architectures): the same lanes in 16-byte vectors ----
// Without AVX, GCC 12 splits the 32-byte vectors above through memory (stores and reloads of every F8, D4, I8):
// 3.3 ns a value for f32, slower than the scalar loop (1.5). Here each of those vectors is two 16-byte ones that
// SSE2 (or NEON) holds in a register: the values 0-3 and 4-7 of each eight are the lanes 0-3 and 4-7 above, and each
// 4-lane double accumulator is two 2-lane ones (lanes 0-1 and 2-3), so every lane takes the same values in the same
// order, a block ends with s0 + s1 and q0 + q1 lane by lane, and the four lanes are added pairwise at the end: the
// same bits as the AVX2 and AVX-512 builds (stats_test holds all three to the order written out in scalar code).
// 0.42 ns a value for f32, 0.65 for f16, 0.52 for bf16 (bench/RESULTS.md, 2026-11-29 13:37).
using D2 = double __attribute__((vector_size(16)));
using I4 = std::int32_t __attribute__((vector_size(16)));

// The magnitude bits and the values of four elements. Without F16C an f16 widens by its bits: exact for finite
// values, but NaN and inf come out finite, so the loop compares for them.
template <class T>
[[gnu::always_inline]] inline void load4(const T* p, I4& magnitude, F4& value) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&value, p, sizeof value);
    magnitude = reinterpret_cast<I4>(value) & 0x7FFFFFFF;
  } else {
    using H4 = std::uint16_t __attribute__((vector_size(8)));
    H4 h;
    std::memcpy(&h, p, sizeof h);
    const I4 r = __builtin_convertvector(h, I4);  // zero-extended
    magnitude = r & 0x7FFF;
    if constexpr (std::is_same_v<T, bf16>) {
      value = reinterpret_cast<F4>(r << 16);  // a bf16 is the top half of a float
    } else {
      // An f16's exponent and mantissa bits moved to a float's places read as its magnitude times
      // 2^-112, subnormals and zero included; multiplying by 2^112 is exact.
      const I4 bits = (magnitude << 13) | ((r & 0x8000) << 16);
      value = reinterpret_cast<F4>(bits) * 0x1p112f;
    }
  }
}

// Lanes 0-1 and 2-3 of four floats, widened to double (exact). On x86-64 by SSE2's cvtps2pd: GCC 12 converts an
// 8-byte float vector one value at a time, through a general register and the stack.
[[gnu::always_inline]] inline void widen2x2(const F4& f, D2& lo, D2& hi) {
#ifdef AMPSCOPE_STATS_X86
  lo = reinterpret_cast<D2>(_mm_cvtps_pd(f));
  hi = reinterpret_cast<D2>(_mm_cvtps_pd(_mm_movehl_ps(f, f)));
#else
  lo = __builtin_convertvector(__builtin_shufflevector(f, f, 0, 1), D2);
  hi = __builtin_convertvector(__builtin_shufflevector(f, f, 2, 3), D2);
#endif
}

template <class T>
void accumulate_contiguous_baseline(const T* p, std::int64_t count, Partial& a) {
  using B = Bits<T>;
  constexpr int kBlock = 256;
  // Whether a NaN or inf reaches the values as itself (then the sums of squares show it): not f16 here.
  constexpr bool kWidensSpecials = !std::is_same_v<T, f16>;
  constexpr float kBig = std::numeric_limits<float>::infinity();
  constexpr auto kInfBits = static_cast<std::int32_t>(B::kInf);
  constexpr auto kMinNormalBits = static_cast<std::int32_t>(B::kMinNormal);
  const F4 inf4 = {kBig, kBig, kBig, kBig};
  // Opaque to the compiler, as in the AVX2 loop: with a constant GCC makes m < c a compare and a negation.
  I4 min_normal = {kMinNormalBits, kMinNormalBits, kMinNormalBits, kMinNormalBits};
  __asm__("" : "+m"(min_normal));
  D2 sum_a{}, sum_b{}, sq_a{}, sq_b{};  // lanes 0-1 and 2-3 of the AVX2 loop's sum and sq
  F4 mn = inf4, mx = -inf4;
  bool any_fast = false;
  std::int64_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    // s0a, s0b: the AVX2 loop's s0 (values 0-3 of each eight); s1a, s1b: its s1 (values 4-7). q likewise.
    D2 s0a{}, s0b{}, s1a{}, s1b{}, q0a{}, q0b{}, q1a{}, q1b{};
    F4 bmn0 = inf4, bmn1 = inf4, bmx0 = -inf4, bmx1 = -inf4;
    I4 bad{}, zero{}, small{};
    for (int j = 0; j < kBlock; j += 8) {
      I4 m0, m1;
      F4 f0, f1;
      load4<T>(p + i + j, m0, f0);
      load4<T>(p + i + j + 4, m1, f1);
      if constexpr (!kWidensSpecials) bad |= (m0 >= kInfBits) | (m1 >= kInfBits);
      zero += m0 == 0;  // a true compare is -1; the counts are exact in any order
      zero += m1 == 0;
      small += min_normal > m0;  // zero or subnormal
      small += min_normal > m1;
      D2 v0a, v0b, v1a, v1b;
      widen2x2(f0, v0a, v0b);
      widen2x2(f1, v1a, v1b);
      s0a += v0a;
      s0b += v0b;
      s1a += v1a;
      s1b += v1b;
      // The square of a widened f32, f16 or bf16 is exact in double: the same bits as the other builds' FMA.
      q0a += v0a * v0a;
      q0b += v0b * v0b;
      q1a += v1a * v1a;
      q1b += v1b * v1b;
      bmn0 = f0 < bmn0 ? f0 : bmn0;
      bmn1 = f1 < bmn1 ? f1 : bmn1;
      bmx0 = f0 > bmx0 ? f0 : bmx0;
      bmx1 = f1 > bmx1 ? f1 : bmx1;
    }
    const D2 qa = q0a + q1a, qb = q0b + q1b;
    bool block_bad;
    if constexpr (kWidensSpecials) {
      const D2 da = qa - qa, db = qb - qb;  // NaN exactly where q is inf or NaN
      block_bad = (da[0] != 0) | (da[1] != 0) | (db[0] != 0) | (db[1] != 0);
    } else {
      block_bad = (bad[0] | bad[1] | bad[2] | bad[3]) != 0;
    }
    if (block_bad) {
      NonFiniteBlock b;
      non_finite_block(p + i, kBlock, b);
      if (!count_non_finite_block(b, a)) continue;
      any_fast = true;
      sum_a += D2{b.bs[0], b.bs[1]};
      sum_b += D2{b.bs[2], b.bs[3]};
      sq_a += D2{b.bq[0], b.bq[1]};
      sq_b += D2{b.bq[2], b.bq[3]};
      const F4 cmn = {b.cmn[0], b.cmn[1], b.cmn[2], b.cmn[3]}, cmx = {b.cmx[0], b.cmx[1], b.cmx[2], b.cmx[3]};
      mn = cmn < mn ? cmn : mn;
      mx = cmx > mx ? cmx : mx;
      continue;
    }
    any_fast = true;
    const std::int32_t zeros = -(zero[0] + zero[1] + zero[2] + zero[3]);
    const std::int32_t smalls = -(small[0] + small[1] + small[2] + small[3]);
    a.zero += zeros;
    a.subnormal += smalls - zeros;
    sum_a += s0a + s1a;
    sum_b += s0b + s1b;
    sq_a += qa;
    sq_b += qb;
    const F4 cmn = bmn0 < bmn1 ? bmn0 : bmn1, cmx = bmx0 > bmx1 ? bmx0 : bmx1;
    mn = cmn < mn ? cmn : mn;
    mx = cmx > mx ? cmx : mx;
  }
  if (any_fast) {
    const double lo = std::min(std::min<double>(mn[0], mn[1]), std::min<double>(mn[2], mn[3]));
    const double hi = std::max(std::max<double>(mx[0], mx[1]), std::max<double>(mx[2], mx[3]));
    a.sum += (sum_a[0] + sum_a[1]) + (sum_b[0] + sum_b[1]);
    a.sum_sq += (sq_a[0] + sq_a[1]) + (sq_b[0] + sq_b[1]);
    a.min = std::min(a.min, lo);
    a.max = std::max(a.max, hi);
    a.absmax = std::max({a.absmax, std::fabs(lo), std::fabs(hi)});  // every value here lies in [lo, hi]
  }
  accumulate_run<T, false>(p + i, count - i, 1, a);
}

// On x86-64 the loop is compiled twice, for AVX2 (with F16C and FMA) and for the baseline (SSE2), and
// chosen once by what the CPU supports. The AVX2 version ends with vzeroupper itself: GCC's target_clones left it
// out, and the dirty upper halves of the vector registers then made the next SSE code (glibc's tanhf and
// expm1f in gelu) about half again as slow.
#ifdef AMPSCOPE_STATS_X86
template <class T>
__attribute__((target("avx2,f16c,fma"))) void accumulate_contiguous_avx2(const T* p, std::int64_t count, Partial& a) {
  accumulate_contiguous_impl<T>(p, count, a);
  __builtin_ia32_vzeroupper();
}

#endif

// ---- the AVX-512 build: the same additions in the same order, fewer instructions ----
// The AVX2 loop above issues 14 vector instructions per 8 values and runs at about 5 cycles per 8 (0.17 ns a value
// on the development machine, in L2, in L3 and from DRAM alike: bound by its instructions, not by memory). Here:
// - s and q are 8-lane double vectors: lanes 0-3 are the AVX2 loop's s0 / q0 and lanes 4-7 its s1 / q1, each lane
//   taking the same values in the same order (one vcvtps2pd of 8 values instead of a split and two), and a block
//   ends with s0 + s1 and q0 + q1 as there;
// - the zero and subnormal counts are two vptestnm per 16 values (the magnitude bits all clear: zero; the exponent
//   bits all clear: zero or subnormal, i.e. a magnitude below the smallest normal) and a popcount of each mask;
// - min and max stay 8-lane float vectors updated by vminps / vmaxps per 8 values as there (x < m ? x : m), so
//   the same value, and the same zero's sign, wins every comparison.
// What is left is the chain of FMAs into q (4 cycles each on the development machine): 0.14 ns a value. More lanes
// would break that chain only by adding in another order, which would change the sums' bits. Two or four blocks at
// once would not (each block's lanes start from zero and are folded in block order), but on the AMD EPYC machine of
// 2026-11-29 it gained only 8% in L2 and was 3x slower on a 16 MB tensor (four streams 1 KB apart), and was dropped
// (bench/RESULTS.md, probe_bench, 2026-11-29 afternoon).
#ifdef AMPSCOPE_STATS_X86
template <class T>
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) __m256 values8_avx512(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<T, f16>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));  // exact, NaN and inf included
  } else {
    const __m256i r = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));  // a bf16 is the top half of a float
  }
}

// The zero (magnitude bits clear) and zero-or-subnormal (exponent bits clear) values among 16, as bit masks.
template <class T>
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) void classify16_avx512(
    const T* p, unsigned& zero, unsigned& small) {
  using B = Bits<T>;
  constexpr auto kExponent = static_cast<std::int32_t>(B::kInf);  // the exponent field's bits
  if constexpr (std::is_same_v<T, float>) {
    const __m512i x = _mm512_loadu_si512(p);
    zero = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(static_cast<std::int32_t>(B::kAbs)));
    small = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(kExponent));
  } else {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    zero = _mm256_testn_epi16_mask(x, _mm256_set1_epi16(static_cast<std::int16_t>(B::kAbs)));
    small = _mm256_testn_epi16_mask(x, _mm256_set1_epi16(static_cast<std::int16_t>(kExponent)));
  }
}

// Halves of an 8-lane double vector. GCC 12's _mm512_cvtps_pd, _mm512_castpd512_pd256 and _mm512_extractf64x4_pd
// start from an "undefined" vector that -Wmaybe-uninitialized flags, so the halves are written with vector
// extensions (the same vextractf64x4) and the widening below with the builtin.
using D8 = double __attribute__((vector_size(64)));
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) __m256d low_half(__m512d v) {
  return reinterpret_cast<__m256d>(__builtin_shufflevector(reinterpret_cast<D8>(v), reinterpret_cast<D8>(v), 0, 1, 2, 3));
}
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) __m256d high_half(__m512d v) {
  return reinterpret_cast<__m256d>(__builtin_shufflevector(reinterpret_cast<D8>(v), reinterpret_cast<D8>(v), 4, 5, 6, 7));
}

// One vcvtps2pd of 8 floats (__builtin_convertvector makes two of 4 and joins them). The builtin's pass-through
// operand is unused under the full mask; a zero vector rather than _mm512_cvtps_pd's "undefined" one.
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) __m512d widen8_avx512(__m256 f) {
  return __builtin_ia32_cvtps2pd512_mask(reinterpret_cast<__v8sf>(f), reinterpret_cast<__v8df>(_mm512_setzero_pd()),
                                         static_cast<__mmask8>(-1), _MM_FROUND_CUR_DIRECTION);
}

// non_finite_block in this build's vectors: the same lanes, each NaN or inf left out of its lane by a mask (the
// masked add, FMA, min and max keep the lane as it was), so the same bits; 1.55 -> 0.41 ns a value at one thread on a
// causal mask's scores (bench/RESULTS.md, probe_bench, 2026-11-29 16:08). `block` values at p; the block's lanes
// combined k + (k + 4) as the loop combines a finite block's.
template <class T>
[[gnu::always_inline]] inline __attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) bool non_finite_block_avx512(
    const T* p, int block, __m256d& bs, __m256d& bq, __m128& cmn, __m128& cmx, Partial& a) {
  constexpr float kBig = std::numeric_limits<float>::infinity();
  const __m256 inf = _mm256_set1_ps(kBig), minus_inf = _mm256_set1_ps(-kBig);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m512d s = _mm512_setzero_pd(), q = _mm512_setzero_pd();
  __m256 bmn = inf, bmx = minus_inf;
  std::int64_t zeros = 0, smalls = 0, nan = 0, pos_inf = 0, neg_inf = 0;
  unsigned any_finite = 0;
  for (int j = 0; j < block; j += 16) {
    unsigned zero, small;
    classify16_avx512(p + j, zero, small);  // NaN and inf have every exponent bit set: in neither count
    zeros += __builtin_popcount(zero);
    smalls += __builtin_popcount(small);
    for (int h = 0; h < 16; h += 8) {
      const __m256 f = values8_avx512(p + j + h);  // NaN and inf widen to themselves
      const __mmask8 finite = _mm256_cmp_ps_mask(_mm256_and_ps(f, abs_mask), inf, _CMP_LT_OQ);
      nan += __builtin_popcount(static_cast<unsigned>(_mm256_cmp_ps_mask(f, f, _CMP_UNORD_Q)));
      pos_inf += __builtin_popcount(static_cast<unsigned>(_mm256_cmp_ps_mask(f, inf, _CMP_EQ_OQ)));
      neg_inf += __builtin_popcount(static_cast<unsigned>(_mm256_cmp_ps_mask(f, minus_inf, _CMP_EQ_OQ)));
      any_finite |= finite;
      const __m512d v = widen8_avx512(f);
      s = _mm512_mask_add_pd(s, finite, s, v);
      q = _mm512_mask3_fmadd_pd(v, v, q, finite);
      bmn = _mm256_mask_min_ps(bmn, finite, f, bmn);  // f < bmn ? f : bmn, in the finite lanes
      bmx = _mm256_mask_max_ps(bmx, finite, f, bmx);
    }
  }
  a.nan += nan;
  a.pos_inf += pos_inf;
  a.neg_inf += neg_inf;
  a.zero += zeros;
  a.subnormal += smalls - zeros;
  if (any_finite == 0) return false;  // NaN and inf only: nothing for the lanes
  bs = _mm256_add_pd(low_half(s), high_half(s));
  bq = _mm256_add_pd(low_half(q), high_half(q));
  cmn = _mm_min_ps(_mm256_castps256_ps128(bmn), _mm256_extractf128_ps(bmn, 1));
  cmx = _mm_max_ps(_mm256_castps256_ps128(bmx), _mm256_extractf128_ps(bmx, 1));
  return true;
}

template <class T>
__attribute__((target(AMPSCOPE_STATS_AVX512_TARGET))) void accumulate_contiguous_avx512(const T* p, std::int64_t count,
                                                                                     Partial& a) {
  constexpr int kBlock = 256;
  constexpr float kBig = std::numeric_limits<float>::infinity();
  __m256d sum = _mm256_setzero_pd(), sq = _mm256_setzero_pd();
  __m128 mn = _mm_set1_ps(kBig), mx = _mm_set1_ps(-kBig);
  bool any_fast = false;
  std::int64_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    __m512d s = _mm512_setzero_pd(), q = _mm512_setzero_pd();
    __m256 bmn = _mm256_set1_ps(kBig), bmx = _mm256_set1_ps(-kBig);
    std::int32_t zeros = 0, smalls = 0;
    for (int j = 0; j < kBlock; j += 16) {
      unsigned zero, small;
      classify16_avx512(p + i + j, zero, small);
      zeros += __builtin_popcount(zero);
      smalls += __builtin_popcount(small);
      for (int h = 0; h < 16; h += 8) {
        const __m256 f = values8_avx512(p + i + j + h);
        const __m512d v = widen8_avx512(f);
        s = _mm512_add_pd(s, v);
        q = _mm512_fmadd_pd(v, v, q);  // exact square, one rounding: as add_square
        bmn = _mm256_min_ps(f, bmn);   // f < bmn ? f : bmn
        bmx = _mm256_max_ps(f, bmx);   // f > bmx ? f : bmx
      }
    }
    const __m256d qb = _mm256_add_pd(low_half(q), high_half(q));  // q0 + q1
    // NaN exactly where a lane's sum of squares is inf or NaN, i.e. where the block held one (see above).
    const __m256d d = _mm256_sub_pd(qb, qb);
    if (_mm256_movemask_pd(_mm256_cmp_pd(d, _mm256_setzero_pd(), _CMP_NEQ_UQ)) != 0) {
      __m256d bs, bq;
      __m128 cmn, cmx;
      if (!non_finite_block_avx512(p + i, kBlock, bs, bq, cmn, cmx, a)) continue;
      any_fast = true;
      sum = _mm256_add_pd(sum, bs);
      sq = _mm256_add_pd(sq, bq);
      mn = _mm_min_ps(cmn, mn);  // cmn < mn ? cmn : mn
      mx = _mm_max_ps(cmx, mx);
      continue;
    }
    any_fast = true;
    a.zero += zeros;
    a.subnormal += smalls - zeros;
    sum = _mm256_add_pd(sum, _mm256_add_pd(low_half(s), high_half(s)));  // s0 + s1
    sq = _mm256_add_pd(sq, qb);
    const __m128 cmn = _mm_min_ps(_mm256_castps256_ps128(bmn), _mm256_extractf128_ps(bmn, 1));  // mn0 < mn1 ? ..
    const __m128 cmx = _mm_max_ps(_mm256_castps256_ps128(bmx), _mm256_extractf128_ps(bmx, 1));
    mn = _mm_min_ps(cmn, mn);
    mx = _mm_max_ps(cmx, mx);
  }
  if (any_fast) {
    alignas(16) float lo4[4], hi4[4];
    alignas(32) double s4[4], q4[4];
    _mm_store_ps(lo4, mn);
    _mm_store_ps(hi4, mx);
    _mm256_store_pd(s4, sum);
    _mm256_store_pd(q4, sq);
    const double lo = std::min(std::min<double>(lo4[0], lo4[1]), std::min<double>(lo4[2], lo4[3]));
    const double hi = std::max(std::max<double>(hi4[0], hi4[1]), std::max<double>(hi4[2], hi4[3]));
    a.sum += (s4[0] + s4[1]) + (s4[2] + s4[3]);
    a.sum_sq += (q4[0] + q4[1]) + (q4[2] + q4[3]);
    a.min = std::min(a.min, lo);
    a.max = std::max(a.max, hi);
    a.absmax = std::max({a.absmax, std::fabs(lo), std::fabs(hi)});
  }
  accumulate_run<T, false>(p + i, count - i, 1, a);
  _mm256_zeroupper();  // as the AVX2 build: no dirty upper halves for the SSE code that follows
}
#endif

// Which build runs: the widest the CPU supports, unless a test chose one (set_stats_loop).
std::atomic<StatsLoop>& chosen_loop() {
  static std::atomic<StatsLoop> loop{supported_stats_loops().back()};
  return loop;
}

template <class T>
void accumulate_contiguous(const T* p, std::int64_t count, Partial& a) {
  switch (chosen_loop().load(std::memory_order_relaxed)) {
#ifdef AMPSCOPE_STATS_X86
    case StatsLoop::avx512: accumulate_contiguous_avx512(p, count, a); return;
    case StatsLoop::avx2: accumulate_contiguous_avx2(p, count, a); return;
#else
    case StatsLoop::avx512:
    case StatsLoop::avx2:
#endif
    case StatsLoop::baseline: accumulate_contiguous_baseline(p, count, a); return;
  }
}

// Eight rows of a transposed view into a row-major tile: row k's element j is src[j * stride + k] (the rows are
// adjacent in memory, the columns `stride` apart). f32 with AVX2 moves 8 x 8 values at a time (eight loads of eight
// adjacent values, an in-register transpose, eight stores); the rest one value at a time.
#ifdef AMPSCOPE_STATS_X86
__attribute__((target("avx2"))) void fill_tile_f32_avx2(const float* src, std::int64_t stride, std::int64_t cols,
                                                       float* tile) {
  std::int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (j + i) * stride);  // column j + i, rows 0..7
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(tile + 0 * cols + j, _mm256_permute2f128_ps(u0, u4, 0x20));  // row k: columns j .. j + 7
    _mm256_storeu_ps(tile + 1 * cols + j, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(tile + 2 * cols + j, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(tile + 3 * cols + j, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(tile + 4 * cols + j, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(tile + 5 * cols + j, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(tile + 6 * cols + j, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(tile + 7 * cols + j, _mm256_permute2f128_ps(u3, u7, 0x31));
  }
  for (; j < cols; ++j)
    for (std::int64_t k = 0; k < 8; ++k) tile[k * cols + j] = src[j * stride + k];
  _mm256_zeroupper();  // as the loops above: no dirty upper halves for the SSE code that follows
}
#endif

template <class T>
void fill_tile(const T* src, std::int64_t stride, std::int64_t cols, T* tile) {
#ifdef AMPSCOPE_STATS_X86
  if constexpr (std::is_same_v<T, float>) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
      fill_tile_f32_avx2(src, stride, cols, tile);
      return;
    }
  }
#endif
  for (std::int64_t j = 0; j < cols; ++j)
    for (std::int64_t k = 0; k < 8; ++k) tile[k * cols + j] = src[j * stride + k];
}

template <class T, bool kHist>
void accumulate_range(const Tensor& t, const T* base, std::int64_t begin, std::int64_t end, Partial& a) {
  if (t.is_contiguous()) {
    if constexpr (!kHist && kHasFastPath<T>) {
      accumulate_contiguous(base + begin, end - begin, a);
    } else {
      accumulate_run<T, kHist>(base + begin, end - begin, 1, a);
    }
    return;
  }
  if constexpr (!kHist && kHasFastPath<T>) {
    // Views with gaps (heads split from a wider projection, transposes of such slices; a permute of a whole
    // tensor is read in memory order instead, in_memory_order) gathered into a small buffer reach the fast path:
    // the copy costs less than the scalar loop would.
    constexpr std::int64_t kGather = 4096;
    T buffer[kGather];
    std::int64_t filled = 0;
    // A run is copied in pieces that fill the buffer (memcpy where its elements are adjacent: heads split
    // by a permute keep their last dimension); the buffer is read at the same points as one element at a
    // time would, so the sums are the same.
    auto push = [&](const T* src, std::int64_t count, std::int64_t stride) {
      for (std::int64_t k = 0; k < count;) {
        const std::int64_t take = std::min(count - k, kGather - filled);
        const T* from = src + k * stride;
        if (stride == 1) {
          std::memcpy(buffer + filled, from, static_cast<std::size_t>(take) * sizeof(T));
        } else {
          for (std::int64_t q = 0; q < take; ++q) buffer[filled + q] = from[q * stride];
        }
        filled += take;
        k += take;
        if (filled == kGather) {
          accumulate_contiguous(buffer, filled, a);
          filled = 0;
        }
      }
    };
    // Transposes (the last dimension strided, the one before it adjacent: a key transposed for attention, a
    // transpose's backward) read one element of every row's cache line per value, row after row. Eight whole rows
    // are read together instead, column by column, eight adjacent values at a time, into a row-major tile that
    // then goes into the buffer like any run: the buffer gets the same values in the same order (same sums), and
    // each cache line is read once for eight rows.
    constexpr std::int64_t kTileRows = 8;
    const int nd = t.dim();
    const bool transposed = nd >= 2 && t.strides()[nd - 2] == 1 && t.strides()[nd - 1] != 1;
    const std::int64_t rows = transposed ? t.size(nd - 2) : 0, cols = transposed ? t.size(nd - 1) : 0;
    const bool tiled = transposed && rows >= kTileRows && cols <= kGather;  // a tile of at most 8 x 4096 values
    std::vector<T> tile(tiled ? static_cast<std::size_t>(cols * kTileRows) : 0);
    std::int64_t pos = begin;  // row-major position of the next run's first element
    std::int64_t skip = 0;     // runs (rows) a tile has already read
    for_each_run(t.shape(), t.strides(), t.strides(), begin, end,
                 [&](std::int64_t off, std::int64_t, std::int64_t count, std::int64_t stride, std::int64_t) {
                   const std::int64_t here = pos;
                   pos += count;
                   if (skip > 0) {
                     --skip;
                     return;
                   }
                   // A whole row (a run never spans two) that starts a group of eight inside this range.
                   if (tiled && count == cols && (here / cols) % rows % kTileRows == 0 &&
                       (here / cols) % rows + kTileRows <= rows && here + kTileRows * cols <= end) {
                     fill_tile(base + off, stride, cols, tile.data());
                     push(tile.data(), kTileRows * cols, 1);
                     skip = kTileRows - 1;
                     return;
                   }
                   push(base + off, count, stride);
                 });
    accumulate_contiguous(buffer, filled, a);
  } else {
    for_each_run(t.shape(), t.strides(), t.strides(), begin, end,
                 [&](std::int64_t off, std::int64_t, std::int64_t count, std::int64_t stride, std::int64_t) {
                   accumulate_run<T, kHist>(base + off, count, stride, a);
                 });
  }
}

// Cast counting over one run of paired elements.
template <class S, class R>
void count_cast_run(const S* s, std::int64_t ss, const R* r, std::int64_t rs, std::int64_t count, CastCounts& c) {
  using BR = Bits<R>;
  std::int64_t overflow = 0, underflow = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    bool finite = true, nonzero;
    if constexpr (kIsFloat<S>) {
      const auto m = Bits<S>::raw(s[i * ss]) & Bits<S>::kAbs;
      finite = m < Bits<S>::kInf;
      nonzero = m != 0;
    } else {
      nonzero = s[i * ss] != S{};
    }
    const auto rm = BR::raw(r[i * rs]) & BR::kAbs;
    overflow += finite && rm == BR::kInf;
    underflow += finite && nonzero && rm == 0;
  }
  c.overflow += overflow;
  c.underflow += underflow;
}

}  // namespace

std::vector<StatsLoop> supported_stats_loops() {
  std::vector<StatsLoop> loops{StatsLoop::baseline};
#ifdef AMPSCOPE_STATS_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma")) {
    loops.push_back(StatsLoop::avx2);
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("popcnt"))
      loops.push_back(StatsLoop::avx512);
  }
#endif
  return loops;
}

std::string_view stats_loop_name(StatsLoop loop) {
  switch (loop) {
    case StatsLoop::baseline: return "baseline";
    case StatsLoop::avx2: return "avx2";
    case StatsLoop::avx512: return "avx512";
  }
  return "?";
}

StatsLoop set_stats_loop(StatsLoop loop) {
  const std::vector<StatsLoop> loops = supported_stats_loops();
  if (std::find(loops.begin(), loops.end(), loop) == loops.end()) {
    throw Error(fmt::format("set_stats_loop: this CPU cannot run the {} build of the statistics loop\n"
                            "hint: choose one of supported_stats_loops()",
                            stats_loop_name(loop)));
  }
  return chosen_loop().exchange(loop);
}

double TensorStats::norm() const {
  if (health.nan > 0) return kNaN;
  if (health.pos_inf + health.neg_inf > 0) return kInf;
  return std::sqrt(sum_sq);
}

double smallest_normal(DType dtype) {
  switch (dtype) {
    case DType::f16: return std::ldexp(1.0, -14);
    case DType::bf16:
    case DType::f32: return std::ldexp(1.0, -126);
    case DType::f64: return std::numeric_limits<double>::min();
    case DType::i64:
    case DType::boolean: return 0;
  }
  return 0;
}

int histogram_bin(double value, DType dtype) {
  if (std::isnan(value)) return kNanBin;
  if (std::isinf(value)) return kInfBin;
  if (value == 0) return kZeroBin;
  const double a = std::fabs(value);
  if (a < smallest_normal(dtype)) return kSubnormalBin;
  const int e = std::ilogb(a);
  if (e < trace::kHistMinExponent) return kSubnormalBin;
  return std::min(e, trace::kHistMaxExponent) + kExponentOffset;
}

Tensor in_memory_order(const Tensor& t) {
  if (!t.defined() || t.dim() < 2 || t.is_contiguous()) return t;
  Shape order(static_cast<std::size_t>(t.dim()));
  for (std::size_t d = 0; d < order.size(); ++d) order[d] = static_cast<std::int64_t>(d);
  const Shape& strides = t.strides();
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return strides[static_cast<std::size_t>(a)] > strides[static_cast<std::size_t>(b)];
  });
  Tensor permuted = t.detach().permute(order);  // detached: a view only, never a node of the user's graph
  return permuted.is_contiguous() ? permuted : t;
}

TensorStats tensor_stats(const Tensor& input, bool with_histogram) {
  TensorStats out;
  trace::TensorHealth& h = out.health;
  h.min = h.max = h.absmax = h.mean = h.rms = kNaN;
  if (!input.defined() || input.numel() == 0) return out;
  // A permuted view in memory order: the contiguous loop reads it as it lies, with no gather, and the sums are
  // those of the tensor it permutes (which the probe's cache then serves for both).
  const Tensor t = in_memory_order(on_host(input));
  const std::int64_t n = t.numel();
  std::vector<Partial> parts;
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* base = static_cast<const T*>(t.read_data());
    run_chunked(n, parts, [&](std::int64_t begin, std::int64_t end, Partial& a) {
      if (with_histogram) {
        accumulate_range<T, true>(t, base, begin, end, a);
      } else {
        accumulate_range<T, false>(t, base, begin, end, a);
      }
    });
  });
  Partial total;
  for (const Partial& p : parts) {
    total.nan += p.nan;
    total.pos_inf += p.pos_inf;
    total.neg_inf += p.neg_inf;
    total.zero += p.zero;
    total.subnormal += p.subnormal;
    total.min = std::min(total.min, p.min);
    total.max = std::max(total.max, p.max);
    total.absmax = std::max(total.absmax, p.absmax);
    total.sum += p.sum;
    total.sum_sq += p.sum_sq;
    if (with_histogram) {
      for (int b = 0; b < trace::kHistBins; ++b) total.hist[b] += p.hist[b];
    }
  }
  h.numel = n;
  h.nan = total.nan;
  h.pos_inf = total.pos_inf;
  h.neg_inf = total.neg_inf;
  h.zero = total.zero;
  h.subnormal = total.subnormal;
  out.sum_sq = total.sum_sq;
  if (with_histogram) out.histogram = total.hist;
  const std::int64_t finite = n - out.non_finite();
  if (finite > 0) {
    h.min = total.min;
    h.max = total.max;
    h.absmax = total.absmax;
    h.mean = total.sum / static_cast<double>(finite);
    h.rms = std::sqrt(total.sum_sq / static_cast<double>(finite));
  }
  return out;
}

CastCounts cast_counts(const Tensor& source_in, const Tensor& result_in) {
  CastCounts total;
  if (!source_in.defined() || !result_in.defined() || !is_floating(result_in.dtype())) return total;
  if (source_in.shape() != result_in.shape()) {
    throw ShapeError("cast_counts: source " + shape_str(source_in.shape()) + " and result " +
                     shape_str(result_in.shape()) + " differ in shape");
  }
  const Tensor source = on_host(source_in), result = on_host(result_in);
  const std::int64_t n = source.numel();
  std::vector<CastCounts> parts;
  visit_dtype(source.dtype(), [&](auto stag) {
    using S = decltype(stag);
    visit_dtype(result.dtype(), [&](auto rtag) {
      using R = decltype(rtag);
      if constexpr (kIsFloat<R>) {
        const S* sp = static_cast<const S*>(source.read_data());
        const R* rp = static_cast<const R*>(result.read_data());
        const bool contiguous = source.is_contiguous() && result.is_contiguous();
        run_chunked(n, parts, [&](std::int64_t begin, std::int64_t end, CastCounts& c) {
          if (contiguous) {
            count_cast_run(sp + begin, 1, rp + begin, 1, end - begin, c);
            return;
          }
          for_each_run(source.shape(), source.strides(), result.strides(), begin, end,
                       [&](std::int64_t os, std::int64_t orr, std::int64_t count, std::int64_t ss, std::int64_t rs) {
                         count_cast_run(sp + os, ss, rp + orr, rs, count, c);
                       });
        });
      }
    });
  });
  for (const CastCounts& c : parts) {
    total.overflow += c.overflow;
    total.underflow += c.underflow;
  }
  return total;
}

std::vector<double> leading_values(const Tensor& input, std::int64_t max_elements) {
  std::vector<double> out;
  if (!input.defined() || max_elements <= 0) return out;
  const Tensor t = on_host(input);
  const std::int64_t n = std::min(t.numel(), max_elements);
  out.reserve(static_cast<std::size_t>(n));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* base = static_cast<const T*>(t.read_data());
    for_each_run(t.shape(), t.strides(), t.strides(), 0, n,
                 [&](std::int64_t off, std::int64_t, std::int64_t count, std::int64_t stride, std::int64_t) {
                   for (std::int64_t i = 0; i < count; ++i) {
                     const T x = base[off + i * stride];
                     if constexpr (kIsFloat<T>) {
                       out.push_back(Bits<T>::value(x));
                     } else {
                       out.push_back(static_cast<double>(x));
                     }
                   }
                 });
  });
  return out;
}

namespace {
std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
}  // namespace

std::uint64_t checksum_bytes(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  const std::size_t words = size / 8;
  std::uint64_t sum = splitmix64_mix(static_cast<std::uint64_t>(size));
  // Four independent sums: the multiplications of consecutive words overlap in the pipeline.
  std::uint64_t s[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    for (std::size_t k = 0; k < 4; ++k) {
      std::uint64_t w;
      std::memcpy(&w, bytes + 8 * (i + k), 8);  // little-endian host (the trace's byte order)
      s[k] += splitmix64_mix(w + (i + k + 1) * kGolden);
    }
  }
  for (; i < words; ++i) {
    std::uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    s[0] += splitmix64_mix(w + (i + 1) * kGolden);
  }
  if (const std::size_t tail = size % 8; tail > 0) {
    std::uint64_t w = 0;
    for (std::size_t b = 0; b < tail; ++b) w |= static_cast<std::uint64_t>(bytes[8 * words + b]) << (8 * b);
    s[0] += splitmix64_mix(w + (words + 1) * kGolden);
  }
  return sum + s[0] + s[1] + s[2] + s[3];
}

std::uint64_t tensor_checksum(const Tensor& t) {
  const Tensor host = t.contiguous().to(Device::cpu());
  return checksum_bytes(host.read_data(), static_cast<std::size_t>(host.numel()) * dtype_size(host.dtype()));
}

std::uint64_t combine_checksums(const std::vector<std::uint64_t>& checksums) {
  std::vector<unsigned char> bytes(checksums.size() * 8);
  for (std::size_t i = 0; i < checksums.size(); ++i) {
    for (std::size_t b = 0; b < 8; ++b) bytes[8 * i + b] = static_cast<unsigned char>(checksums[i] >> (8 * b));
  }
  return checksum_bytes(bytes.data(), bytes.size());
}

static_assert(kDeviceStatsBins == trace::kHistBins, "core's DeviceStatsResult holds the trace's histogram bins");

TensorStats stats_from_device(const DeviceStatsResult& r, bool with_histogram) {
  TensorStats out;
  trace::TensorHealth& h = out.health;
  h.min = h.max = h.absmax = h.mean = h.rms = kNaN;
  h.numel = static_cast<std::int64_t>(r.numel);
  h.nan = static_cast<std::int64_t>(r.nan);
  h.pos_inf = static_cast<std::int64_t>(r.pos_inf);
  h.neg_inf = static_cast<std::int64_t>(r.neg_inf);
  h.zero = static_cast<std::int64_t>(r.zero);
  h.subnormal = static_cast<std::int64_t>(r.subnormal);
  out.sum_sq = r.sum_sq;
  if (with_histogram) {
    for (int b = 0; b < trace::kHistBins; ++b)
      out.histogram[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(r.histogram[static_cast<std::size_t>(b)]);
  }
  const std::int64_t finite = h.numel - out.non_finite();
  if (finite > 0) {
    h.min = r.min;
    h.max = r.max;
    h.absmax = r.absmax;
    h.mean = r.sum / static_cast<double>(finite);
    h.rms = std::sqrt(r.sum_sq / static_cast<double>(finite));
  }
  return out;
}

CastCounts cast_counts_from_stats(const TensorStats& source, const TensorStats& result, DType result_dtype) {
  CastCounts c;
  if (!is_floating(result_dtype)) return c;
  c.overflow = (result.health.pos_inf + result.health.neg_inf) - (source.health.pos_inf + source.health.neg_inf);
  c.underflow = result.health.zero - source.health.zero;
  return c;
}

namespace {

class DeviceQueue final : public DeferredStats {
 public:
  DeviceQueue(Device device, std::unique_ptr<StatsQueue> queue) : device_(device), queue_(std::move(queue)) {}
  int capacity() const override { return queue_->capacity(); }
  int free_slots() const override { return queue_->free_slots(); }
  bool takes(const Tensor& t) const override { return t.defined() && t.device() == device_; }
  int launch(const Tensor& t, bool with_histogram) override {
    if (queue_->free_slots() == 0) return -1;
    // Integer and bool values widened on the device, as tensor_stats widens them on the host; the widened
    // copy may go at once: its memory is freed in stream order, after the statistics kernel read it.
    const Tensor floating = is_floating(t.dtype()) ? t : t.to(DType::f64);
    const int slot = queue_->launch(floating.kernel_view(), with_histogram);
    if (slot >= 0) histogram_[slot] = with_histogram;
    return slot;
  }
  TensorStats read(int slot) override {
    const bool with_histogram = histogram_.count(slot) > 0 && histogram_[slot];
    histogram_.erase(slot);
    return stats_from_device(queue_->read(slot), with_histogram);
  }

 private:
  Device device_;
  std::unique_ptr<StatsQueue> queue_;
  std::unordered_map<int, bool> histogram_;
};

class HostQueue final : public DeferredStats {
 public:
  explicit HostQueue(int slots) : slots_(static_cast<std::size_t>(slots)) {
    if (slots <= 0) throw Error(fmt::format("host_stats_queue: needs at least one slot, got {}", slots));
  }
  int capacity() const override { return static_cast<int>(slots_.size()); }
  int free_slots() const override { return capacity() - used_; }
  bool takes(const Tensor& t) const override { return t.defined() && t.device().is_cpu(); }
  int launch(const Tensor& t, bool with_histogram) override {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i]) {
        slots_[i] = tensor_stats(t, with_histogram);
        ++used_;
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  TensorStats read(int slot) override {
    if (slot < 0 || slot >= capacity() || !slots_[static_cast<std::size_t>(slot)]) {
      throw IndexError(fmt::format("host_stats_queue: slot {} holds no launch (the ring has {} slots)", slot,
                                   capacity()));
    }
    TensorStats out = *slots_[static_cast<std::size_t>(slot)];
    slots_[static_cast<std::size_t>(slot)].reset();
    --used_;
    return out;
  }

 private:
  std::vector<std::optional<TensorStats>> slots_;
  int used_ = 0;
};

}  // namespace

std::unique_ptr<DeferredStats> device_stats_queue(Device device, int slots) {
  std::unique_ptr<StatsQueue> queue = backend_for(device).make_stats_queue(slots);
  if (!queue) return nullptr;
  return std::make_unique<DeviceQueue>(device, std::move(queue));
}

std::unique_ptr<DeferredStats> host_stats_queue(int slots) { return std::make_unique<HostQueue>(slots); }

void Fp8HistorySteps::note_cast(std::int64_t step, float amax, std::size_t history_len) {
  // A roll needs slot 0 nonzero: TE compares the amax's bits (a NaN amax rolls too).
  if (amax == 0.0f) return;
  if (!runs_.empty() && runs_.back().second >= step) return;  // the step is noted already
  if (!runs_.empty() && runs_.back().second + 1 == step) {
    runs_.back().second = step;
  } else {
    runs_.emplace_back(step, step);
  }
  ++count_;
  // Keep the steps a history of history_len entries can hold: the current step and len - 1 rolled ones.
  while (count_ > history_len && !runs_.empty()) {
    auto& front = runs_.front();
    if (front.first == front.second) {
      runs_.pop_front();
    } else {
      ++front.first;
    }
    --count_;
  }
}

std::int64_t Fp8HistorySteps::slot_step(std::size_t slot, std::size_t history_len, std::int64_t step) const {
  if (slot == 0) return step;
  if (slot >= history_len) return -1;
  // The age-th latest step before `step` that rolled.
  std::size_t age = history_len - slot;
  for (auto it = runs_.rbegin(); it != runs_.rend(); ++it) {
    const std::int64_t last = std::min(it->second, step - 1);
    if (last < it->first) continue;
    const std::size_t in_run = static_cast<std::size_t>(last - it->first + 1);
    if (age <= in_run) return last - static_cast<std::int64_t>(age - 1);
    age -= in_run;
  }
  return -1;
}

trace::Fp8Row fp8_operand_row(const Fp8QuantizeEvent& event, const Fp8HistorySteps* steps) {
  const Fp8Format format = event.format == "e5m2" ? Fp8Format::e5m2 : Fp8Format::e4m3;
  const float max = fp8_max(format);
  // The smallest normal code's magnitude bits: 0x08 (2^-6) in E4M3, 0x04 (2^-14) in E5M2; below it and above
  // 0 are the subnormal codes.
  const std::uint8_t min_normal = format == Fp8Format::e4m3 ? 0x08 : 0x04;
  trace::Fp8Row row;
  row.step = event.step;
  row.module = event.module;
  row.operand = std::string(event.operand);
  row.format = std::string(event.format);
  row.numel = static_cast<std::int64_t>(event.values.size());
  row.amax = event.amax;
  row.scale = event.scale;
  // Codes at or above this magnitude are NaN (E4M3: 0x7F) or inf and NaN (E5M2: 0x7C and up); below it a code's value
  // grows with its magnitude bits, so the extremes of the nonzero finite codes are those of their magnitudes.
  const std::uint8_t finite_end = format == Fp8Format::e4m3 ? 0x7F : 0x7C;
  std::uint8_t qlo = 0xFF, qhi = 0;
  float lo = std::numeric_limits<float>::infinity(), hi = 0;
  double err_sq = 0, ref_sq = 0;
  const std::size_t n = std::min(event.values.size(), event.codes.size());
  for (std::size_t i = 0; i < n; ++i) {
    const float x = event.values[i];
    const std::uint8_t c = event.codes[i];
    const std::uint8_t mag = c & 0x7F;
    if (mag != 0 && mag < finite_end) qlo = std::min(qlo, mag), qhi = std::max(qhi, mag);
    if (const float a = std::fabs(x); a != 0.0f && std::isfinite(a)) lo = std::min(lo, a), hi = std::max(hi, a);
    if (x != 0.0f && !std::isnan(x)) {
      ++row.nonzero;
      if (mag == 0) ++row.underflow;
      else if (mag < min_normal) ++row.subnormal;
      // The product the cast rounded (core/fp8_recipe.h quantize_fp8: x * scale in float first).
      if (std::fabs(x * event.scale) > max) ++row.saturated;
    }
    if (!std::isfinite(x)) continue;
    const float q = fp8_to_float(c, format);
    if (std::isnan(q)) continue;
    const double d = static_cast<double>(q * event.scale_inv) - static_cast<double>(x);
    err_sq += d * d;
    ref_sq += static_cast<double>(x) * static_cast<double>(x);
  }
  row.rel_rms_error = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : 0.0;
  // The dynamic ranges, in binades: log2(max) - log2(min) over the finite nonzero magnitudes, of the operand and of
  // its decoded codes (the scale multiplies both ends, so it cancels).
  const auto range = [](float min, float max) {
    return max > 0 ? std::log2(static_cast<double>(max)) - std::log2(static_cast<double>(min)) : 0.0;
  };
  row.dynamic_range = range(lo, hi);
  row.quantized_dynamic_range = qhi > 0 ? range(fp8_to_float(qlo, format), fp8_to_float(qhi, format)) : 0.0;
  // The history's state that sets the next scale (core/fp8_recipe.h delayed_scaling_update): nothing when slot 0
  // is 0 (no roll, the scale is kept), else this step's amax (most_recent) or the window's max (NaN skipped).
  const std::span<const float> h = event.amax_history;
  row.history_len = static_cast<std::int64_t>(h.size());
  row.history_amax = 0;
  row.history_amax_step = -1;
  if (!h.empty() && h[0] != 0.0f) {
    std::size_t slot = 0;
    float amax = h[0];
    if (!event.most_recent) {
      amax = 0.0f;
      for (const float a : h) amax = std::fmax(amax, a);
      // The oldest slot holding it: 1 .. len-1 are the earlier steps, oldest first; 0 is this step.
      slot = h.size();
      for (std::size_t k = 1; k < h.size() && slot == h.size(); ++k)
        if (h[k] == amax) slot = k;
      if (slot == h.size()) slot = 0;
    }
    row.history_amax = amax;
    if (amax != 0.0f) {
      row.history_amax_step = slot == 0 ? event.step : steps ? steps->slot_step(slot, h.size(), event.step) : -1;
    }
  }
  return row;
}

BlockPlace block_place(std::string_view format, std::string_view copy, std::string_view operand, std::int64_t rows,
                       std::int64_t cols, std::int64_t block) {
  if (block < 0 || rows <= 0 || cols <= 0) return {};
  // (block rows, block cols) of one block; the scales are row-major over (rows / block rows) x (cols / block cols).
  std::int64_t br = 1, bc = 1;
  if (format == "mxfp8") {
    (copy == "columnwise" ? br : bc) = kMxBlock;
  } else if (format == "nvfp4") {
    bc = kNvfp4Block;
    if (operand == "weight") br = kNvfp4Block;
  } else {
    return {};
  }
  if (rows % br != 0 || cols % bc != 0) return {};
  const std::int64_t across = cols / bc;
  if (block >= (rows / br) * across) return {};
  return {(block / across) * br, (block % across) * bc};
}

trace::BlockRow block_operand_row(const BlockQuantizeEvent& event) {
  const BlockStats& s = event.stats;
  trace::BlockRow row;
  row.step = event.step;
  row.module = event.module;
  row.operand = std::string(event.operand);
  row.copy = std::string(event.copy);
  row.format = std::string(event.format);
  row.what_if = event.what_if;
  row.rows = event.rows;
  row.cols = event.cols;
  row.numel = s.numel;
  row.nonzero = s.nonzero;
  row.nonfinite = s.nonfinite;
  row.underflow = s.underflow;
  row.saturated = s.saturated;
  row.blocks = s.blocks;
  row.blocks_clipped = s.blocks_clipped;
  row.blocks_nan = s.blocks_nan;
  row.max_block_range = s.max_block_range;
  row.max_range_block = s.max_range_block;
  const BlockPlace range = block_place(event.format, event.copy, event.operand, event.rows, event.cols, s.max_range_block);
  row.max_range_row = range.row;
  row.max_range_col = range.col;
  row.worst_block = s.worst_block;
  row.worst_block_underflow = s.worst_block_underflow;
  const BlockPlace worst = block_place(event.format, event.copy, event.operand, event.rows, event.cols, s.worst_block);
  row.worst_block_row = worst.row;
  row.worst_block_col = worst.col;
  row.scale_log2_min = s.scale_log2_min;
  row.scale_log2_median = s.scale_log2_median;
  row.scale_log2_max = s.scale_log2_max;
  row.rel_rms_error = s.rel_rms_error;
  return row;
}

}  // namespace ampscope::probe
