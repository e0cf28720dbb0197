// kernels/cpu/exp_kernels.h. The softmax rows' exps were a call to libm's expf per element (tiny GPT, 1
// thread: 4.7% of the step, about 1 M calls; PyTorch's SLEEF loop costs a quarter of that, issue 37). The
// vector loop below is glibc's expf (sysdeps/ieee754/flt-32/e_expf.c, as its FMA build compiles it:
// x86_64/fpu/multiarch/e_expf-fma.c) lane by lane, the same double operations with the same fused
// multiply-adds in the same order, so each lane rounds as the scalar call does. The arithmetic, per x:
//   z = x * 32/ln2 (double, x exact in it); kd = fma(32/ln2, x, 1.5 * 2^52): z rounded to an integer k in its
//   low bits; r = fma(32/ln2, x, -(kd - 1.5 * 2^52)) = z - k, |r| <= 1/2;
//   s = 2^(k/32) = the double 2^((k mod 32)/32) with k div 32 added to its exponent;
//   y = fma(fma(C0, r, C1), r * r, fma(C2, r, 1)) * s, rounded to float.
// Lanes that glibc sends off its main path (|x| >= 88, infinities, NaN) go to std::exp itself, but -inf
// (every masked attention score) which gives +0 in the vector too. Whether the libm at hand computes exactly
// this is not assumed: the first call compares the loop with std::exp on a spread of about 96,000 floats,
// and a single difference keeps every call on std::exp.
#include "kernels/cpu/exp_kernels.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ampscope::cpu {
namespace {

void exp_scalar(const float* x, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
}

#if defined(__x86_64__)
// 2^(i/32), i = 0..31, each the double nearest to it (computed to 60 digits and rounded); glibc's table holds
// their bits minus i << 47, so that adding k << 47 for k = 32 q + i gives 2^(k/32) in one integer add.
constexpr double kPow2[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0};
struct Table {
  alignas(64) std::uint64_t t[32];
};
constexpr Table make_table() {
  Table tab{};
  for (std::uint64_t i = 0; i < 32; ++i) tab.t[i] = std::bit_cast<std::uint64_t>(kPow2[i]) - (i << 47);
  return tab;
}
constexpr Table kTable = make_table();
// glibc's constants, as its expf reads them (__exp2f_data): 32/ln2, the cubic's coefficients for 2^(r/32)
// (a fit of its own, so taken as they are: other coefficients give other bits), and the shift 1.5 * 2^52.
constexpr double kInvLn2N = 0x1.71547652b82fep+5;
constexpr double kC0 = 0x1.c6af84b912394p-20, kC1 = 0x1.ebfce50fac4f3p-13, kC2 = 0x1.62e42ff0c52d6p-6;
constexpr double kShift = 0x1.8p+52;

// GCC 12 warns that the undefined vectors some intrinsics start from (_mm512_undefined_*, in its own
// headers) may be used uninitialized: they are fully overwritten, a false positive of those headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Eight lanes: glibc's main path (its special cases are the caller's).
__attribute__((target("avx512f"), always_inline)) inline __m256 exp8(__m256 xf) {
  const __m512d inv_ln2n = _mm512_set1_pd(kInvLn2N), shift = _mm512_set1_pd(kShift);
  const __m512d xd = _mm512_cvtps_pd(xf);
  const __m512d kd_shifted = _mm512_fmadd_pd(inv_ln2n, xd, shift);
  const __m512i ki = _mm512_castpd_si512(kd_shifted);
  const __m512d kd = _mm512_sub_pd(kd_shifted, shift);
  const __m512d r = _mm512_fmsub_pd(inv_ln2n, xd, kd);
  // tab[ki mod 32]: two 16-entry permutes (index bits 0-3), chosen between by bit 4.
  const __m512d t0 = _mm512_load_pd(reinterpret_cast<const double*>(kTable.t));
  const __m512d t1 = _mm512_load_pd(reinterpret_cast<const double*>(kTable.t + 8));
  const __m512d t2 = _mm512_load_pd(reinterpret_cast<const double*>(kTable.t + 16));
  const __m512d t3 = _mm512_load_pd(reinterpret_cast<const double*>(kTable.t + 24));
  const __m512d low = _mm512_permutex2var_pd(t0, ki, t1);
  const __m512d high = _mm512_permutex2var_pd(t2, ki, t3);
  const __mmask8 upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
  const __m512i tab = _mm512_castpd_si512(_mm512_mask_blend_pd(upper, low, high));
  const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(tab, _mm512_slli_epi64(ki, 47)));
  const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(kC0), r, _mm512_set1_pd(kC1));
  const __m512d r2 = _mm512_mul_pd(r, r);
  __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(kC2), r, _mm512_set1_pd(1.0));
  y = _mm512_fmadd_pd(z, r2, y);
  y = _mm512_mul_pd(y, s);
  return _mm512_cvtpd_ps(y);
}

__attribute__((target("avx512f"))) void exp_avx512(const float* x, float* out, std::int64_t n) {
  const __m512i abs_top_mask = _mm512_set1_epi32(0x7ff);
  const __m512i top_88 = _mm512_set1_epi32(0x42a);  // glibc's test: top12(x) & 0x7ff >= top12(88.0f) = 0x42b
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  for (std::int64_t i = 0; i < n; i += 16) {
    const std::int64_t left = n - i;
    const __mmask16 lanes = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, x + i);
    const __m512 lo = _mm512_castps256_ps512(exp8(_mm512_castps512_ps256(v)));
    const __m256 hi8 = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m512 y = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(lo), _mm256_castps_pd(hi8), 1));
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 20), abs_top_mask);
    const __mmask16 off_path = _mm512_mask_cmpgt_epi32_mask(lanes, top, top_88);
    if (off_path != 0) {
      const __mmask16 neg_inf = _mm512_mask_cmpeq_ps_mask(off_path, v, minus_inf);
      y = _mm512_mask_mov_ps(y, neg_inf, _mm512_setzero_ps());
      __mmask16 rest = off_path & static_cast<__mmask16>(~neg_inf);
      if (rest != 0) {
        alignas(64) float in[16], res[16];
        _mm512_store_ps(in, v);
        _mm512_store_ps(res, y);
        for (; rest != 0; rest &= static_cast<__mmask16>(rest - 1)) {
          const int lane = __builtin_ctz(rest);
          res[lane] = std::exp(in[lane]);
        }
        y = _mm512_load_ps(res);
      }
    }
    _mm512_mask_storeu_ps(out + i, lanes, y);
  }
}

#pragma GCC diagnostic pop

bool has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}

// The first-use check: every 53,687th bit pattern (80,000 floats: both signs, subnormals, infinities, NaNs) and
// 16,384 evenly spaced values over the main path's range, [-104, 89], where each of the 32 table entries and
// both ends of r are hit many times.
bool avx512_matches_libm() {
  std::vector<float> probe;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 53687) {
    probe.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(u)));
  }
  for (int i = 0; i < 16384; ++i) probe.push_back(-104.0f + 193.0f * static_cast<float>(i) / 16384.0f);
  std::vector<float> got(probe.size());
  exp_avx512(probe.data(), got.data(), static_cast<std::int64_t>(probe.size()));
  for (std::size_t i = 0; i < probe.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(std::exp(probe[i]))) return false;
  }
  return true;
}
#endif

bool avx512_usable() {
#if defined(__x86_64__)
  static const bool usable = has_avx512f() && avx512_matches_libm();
  return usable;
#else
  return false;
#endif
}

}  // namespace

bool exp_path_available(ExpPath path) {
  switch (path) {
    case ExpPath::scalar:
      return true;
#if defined(__x86_64__)
    case ExpPath::avx512:
      return has_avx512f();
#endif
    default:
      return false;
  }
}

bool exp_path_matches_libm(ExpPath path) { return path == ExpPath::scalar || avx512_usable(); }

void exp_f32_on(ExpPath path, const float* x, float* out, std::int64_t n) {
#if defined(__x86_64__)
  if (path == ExpPath::avx512) return exp_avx512(x, out, n);
#endif
  exp_scalar(x, out, n);
}

void exp_f32(const float* x, float* out, std::int64_t n) {
#if defined(__x86_64__)
  if (avx512_usable()) return exp_avx512(x, out, n);
#endif
  exp_scalar(x, out, n);
}

}  // namespace ampscope::cpu
