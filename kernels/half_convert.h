// kernels/half_convert.h: the CPU backend's bulk f16/bf16 <-> float conversions, for its hot loops
// (matrix operands widened for sgemm, products rounded back, casts, element-wise kernels).
//
//   std::vector<float> wide(n);
//   cpu::widen(static_cast<const f16*>(src), wide.data(), n);      // exact
//   cpu::narrow(wide.data(), static_cast<f16*>(dst), n);           // round to nearest even, once
//
// Every function gives the bits of core/float16.h's scalar conversions, element for element (NaN
// payloads and signalling NaNs included). f16 uses the CPU's F16C instructions (vcvtph2ps, vcvtps2ph
// with round-to-nearest-even) where the CPU has F16C and AVX2, chosen at run time; the portable path,
// core/float16.h in a loop, stays for CPUs without them and is what AMPSCOPE_NO_F16C=1 (read once at
// start-up) or set_f16c_enabled(false) selects. bf16 is a shift one way and an add and shift the other,
// written branch-free so the compiler vectorises it (an AVX2 build of the loops is chosen at run time).
// tests/kernels/half_convert_test.cpp checks both paths against each other and against core/float16.h
// for all 2^16 and all 2^32 inputs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/convert.h"
#include "core/float16.h"

namespace ampscope::cpu {

// Whether the f16 functions below use F16C now: the CPU has F16C and AVX2, AMPSCOPE_NO_F16C was not set
// to a value other than 0 at start-up, and no test turned it off.
bool f16c_active();
// Whether this CPU has F16C and AVX2, whatever the setting.
bool cpu_has_f16c();
// Tests and benchmarks: false forces the portable path; true uses F16C again where the CPU has it.
// Not meant to be changed while kernels run on other threads.
void set_f16c_enabled(bool enabled);

void widen_f16(const f16* in, float* out, std::int64_t n);
void narrow_f16(const float* in, f16* out, std::int64_t n);
void widen_bf16(const bf16* in, float* out, std::int64_t n);
void narrow_bf16(const float* in, bf16* out, std::int64_t n);

// The portable paths themselves, whatever f16c_active() says: core/float16.h in a loop for f16, the
// baseline (SSE2) build of the branch-free bf16 loops.
void widen_f16_portable(const f16* in, float* out, std::int64_t n);
void narrow_f16_portable(const float* in, f16* out, std::int64_t n);
void widen_bf16_portable(const bf16* in, float* out, std::int64_t n);
void narrow_bf16_portable(const float* in, bf16* out, std::int64_t n);

// out[i] = convert<Acc>(in[i]) for n contiguous elements of a storage type T (f16/bf16 in bulk; f32 and f64
// are copied).
template <class T>
inline void widen(const T* in, acc_type<T>* out, std::int64_t n) {
  if constexpr (std::is_same_v<T, f16>) {
    widen_f16(in, out, n);
  } else if constexpr (std::is_same_v<T, bf16>) {
    widen_bf16(in, out, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = in[i];
  }
}

// out[i] = convert<T>(in[i]): each value rounded once to T.
template <class T>
inline void narrow(const acc_type<T>* in, T* out, std::int64_t n) {
  if constexpr (std::is_same_v<T, f16>) {
    narrow_f16(in, out, n);
  } else if constexpr (std::is_same_v<T, bf16>) {
    narrow_bf16(in, out, n);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = in[i];
  }
}

}  // namespace ampscope::cpu
