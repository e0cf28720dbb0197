// kernels/half_convert.cpp: bulk f16/bf16 <-> float conversions (kernels/half_convert.h).
//
// Why F16C gives the same bits as core/float16.h: vcvtps2ph with an immediate round-to-nearest-even ignores
// MXCSR's rounding mode, keeps subnormals (it does not flush, whatever MXCSR.FTZ says), overflows to inf and
// returns a quiet NaN with the sign and the top payload bits, which is the contract core/float16.h was
// written to; vcvtph2ps is exact and quiets signalling NaNs the same way. tests/core/float16_test.cpp
// proves the scalar code equal to the instruction for all 2^32 floats, and tests/kernels/half_convert_test.cpp
// proves these loops equal to the scalar code.
#include "kernels/half_convert.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AMPSCOPE_X86 1
#else
#define AMPSCOPE_X86 0
#endif

namespace ampscope::cpu {
namespace {

bool detect_f16c() {
#if AMPSCOPE_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

// AMPSCOPE_NO_F16C set to anything but "" or "0" turns the fast path off.
bool f16c_wanted_by_environment() {
  const char* v = std::getenv("AMPSCOPE_NO_F16C");
  return v == nullptr || v[0] == '\0' || std::strcmp(v, "0") == 0;
}

// Function-local statics: kernels may run from other translation units' static initialisers.
bool has_f16c() {
  static const bool has = detect_f16c();
  return has;
}
std::atomic<bool>& f16c_flag() {
  static std::atomic<bool> flag{has_f16c() && f16c_wanted_by_environment()};
  return flag;
}

const std::uint16_t* bits_of(const f16* p) { return reinterpret_cast<const std::uint16_t*>(p); }
std::uint16_t* bits_of(f16* p) { return reinterpret_cast<std::uint16_t*>(p); }
const std::uint16_t* bits_of(const bf16* p) { return reinterpret_cast<const std::uint16_t*>(p); }
std::uint16_t* bits_of(bf16* p) { return reinterpret_cast<std::uint16_t*>(p); }

// ---- bf16: branch-free loops the compiler vectorises; instantiated for the baseline and for AVX2 ----

__attribute__((always_inline)) inline void widen_bf16_loop(const std::uint16_t* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &u, sizeof u);
  }
}

// detail::float_to_bf16_bits without its branch: the NaN answer and the rounded answer are both computed
// and one is selected.
__attribute__((always_inline)) inline void narrow_bf16_loop(const float* in, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, in + i, sizeof u);
    const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
    const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    out[i] = static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
  }
}

void widen_bf16_baseline(const std::uint16_t* in, float* out, std::int64_t n) { widen_bf16_loop(in, out, n); }
void narrow_bf16_baseline(const float* in, std::uint16_t* out, std::int64_t n) { narrow_bf16_loop(in, out, n); }

#if AMPSCOPE_X86
// The AVX2 builds end with vzeroupper themselves: SSE code that runs after a function that leaves the upper
// register halves dirty (glibc's expf, tanhf) runs much slower (bench/RESULTS.md, probe_bench).
__attribute__((target("avx2"))) void widen_bf16_avx2(const std::uint16_t* in, float* out, std::int64_t n) {
  widen_bf16_loop(in, out, n);
  _mm256_zeroupper();
}
__attribute__((target("avx2"))) void narrow_bf16_avx2(const float* in, std::uint16_t* out, std::int64_t n) {
  narrow_bf16_loop(in, out, n);
  _mm256_zeroupper();
}

// ---- f16 with F16C: 8 values per instruction, the tail with the scalar forms of the same instructions ----

__attribute__((target("f16c,avx2"))) void widen_f16_f16c(const std::uint16_t* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
  _mm256_zeroupper();
}

__attribute__((target("f16c,avx2"))) void narrow_f16_f16c(const float* in, std::uint16_t* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm256_zeroupper();
}
#endif

}  // namespace

bool cpu_has_f16c() { return has_f16c(); }
bool f16c_active() { return f16c_flag().load(std::memory_order_relaxed); }
void set_f16c_enabled(bool enabled) { f16c_flag().store(enabled && has_f16c(), std::memory_order_relaxed); }

void widen_f16_portable(const f16* in, float* out, std::int64_t n) {
  const std::uint16_t* h = bits_of(in);
  for (std::int64_t i = 0; i < n; ++i) out[i] = detail::f16_bits_to_float(h[i]);
}
void narrow_f16_portable(const float* in, f16* out, std::int64_t n) {
  std::uint16_t* h = bits_of(out);
  for (std::int64_t i = 0; i < n; ++i) h[i] = detail::float_to_f16_bits(in[i]);
}
void widen_bf16_portable(const bf16* in, float* out, std::int64_t n) { widen_bf16_baseline(bits_of(in), out, n); }
void narrow_bf16_portable(const float* in, bf16* out, std::int64_t n) { narrow_bf16_baseline(in, bits_of(out), n); }

void widen_f16(const f16* in, float* out, std::int64_t n) {
#if AMPSCOPE_X86
  if (f16c_active()) return widen_f16_f16c(bits_of(in), out, n);
#endif
  widen_f16_portable(in, out, n);
}
void narrow_f16(const float* in, f16* out, std::int64_t n) {
#if AMPSCOPE_X86
  if (f16c_active()) return narrow_f16_f16c(in, bits_of(out), n);
#endif
  narrow_f16_portable(in, out, n);
}
// bf16's AVX2 loops go with the same switch, so AMPSCOPE_NO_F16C=1 runs everything on the baseline code.
void widen_bf16(const bf16* in, float* out, std::int64_t n) {
#if AMPSCOPE_X86
  if (f16c_active()) return widen_bf16_avx2(bits_of(in), out, n);
#endif
  widen_bf16_baseline(bits_of(in), out, n);
}
void narrow_bf16(const float* in, bf16* out, std::int64_t n) {
#if AMPSCOPE_X86
  if (f16c_active()) return narrow_bf16_avx2(in, bits_of(out), n);
#endif
  narrow_bf16_baseline(in, bits_of(out), n);
}

}  // namespace ampscope::cpu
