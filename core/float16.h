// core/float16.h: the FP16 and BF16 storage types and their exact conversions to and from float.
//
// One definition, used by host code and by CUDA device code alike, so the CPU backend and the GPU
// backend round every value the same way, bit for bit. Conversions are IEEE 754 round-to-nearest,
// ties-to-even: overflow gives infinity (never saturation), subnormals are kept (never flushed),
// zero keeps its sign, and a NaN stays a NaN (never becomes infinity).
//
//   f16 h{70000.0f};             // h.bits == 0x7C00 (+inf): 70000 >= 65520 overflows
//   float back = float(f16{0.1f}); // 0.0999755859375f, exactly the nearest f16 value
//   bf16 b = bf16::from_bits(0x7F80); // +inf
//
// Bit layouts (most significant bit first):
//
//   float32   s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm    1 / 8 / 23, bias 127
//   float16   s eeeee mmmmmmmmmm                    1 / 5 / 10, bias 15, max 65504 (0x7BFF)
//   bfloat16  s eeeeeeee mmmmmmm                    1 / 8 / 7,  bias 127: the top half of a float32
//
// NaN: a conversion returns a quiet NaN with the input's sign and the top bits of its payload, as
// IEEE 754 and the x86 F16C instructions do. A signalling NaN comes back quieted (bit 9 of an f16,
// bit 22 of a float, bit 6 of a bf16 set), which is the only way a conversion may change a NaN.
//
// Why not `_Float16` or `__half` here: `_Float16` in host/device code crashes nvcc (an internal
// compiler error), and CUDA's intrinsics canonicalise NaNs (0x7FFF) where the CPU keeps the payload. This
// bit-level code gives the same answer on both sides; tests check it against the CPU's own F16C
// conversion for all 2^32 float inputs.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define AMPSCOPE_HD __host__ __device__
#else
#define AMPSCOPE_HD
#endif

#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

namespace ampscope {

namespace detail {

AMPSCOPE_HD inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

AMPSCOPE_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float -> binary16, round to nearest even.
AMPSCOPE_HD inline std::uint16_t float_to_f16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;  // magnitude

  if (a > 0x7F800000u) {  // NaN: quiet it, keep the top 9 payload bits
    return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  }
  if (a >= 0x477FF000u) {  // |x| >= 65520 (half-way between 65504 and 2^16; ties go up to even) or inf
    return static_cast<std::uint16_t>(sign | 0x7C00u);
  }
  if (a >= 0x38800000u) {  // |x| >= 2^-14: a normal f16
    // Re-bias the exponent (127 -> 15) in place, then round away the low 13 mantissa bits to nearest
    // even. A carry out of the mantissa correctly bumps the exponent; 65520 and up were handled above.
    std::uint32_t m = a - 0x38000000u;
    m += 0x0FFFu + ((m >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (m >> 13));
  }
  if (a <= 0x33000000u) {  // |x| <= 2^-25: rounds to zero (2^-25 itself is a tie and 0 is even)
    return sign;
  }
  // 2^-25 < |x| < 2^-14: a subnormal f16, in units of 2^-24. With the implicit bit made explicit the
  // float is mant * 2^(e - 150), so the f16 mantissa is mant >> (126 - e), rounded to nearest even.
  // Rounding up from 0x3FF gives 0x400, the smallest normal, which is again the right encoding.
  const std::uint32_t e = a >> 23;
  const std::uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const std::uint32_t shift = 126u - e;  // 14 .. 24
  std::uint32_t r = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

// binary16 -> float, exact.
AMPSCOPE_HD inline float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x03FFu;
  if (e == 0x1Fu) {  // inf, or NaN (quieted, payload kept)
    return bits_float(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x00400000u : 0u));
  }
  if (e == 0) {
    // Zero or subnormal: m * 2^-24 is exact in float (m < 2^10, and the result is a normal float).
    const float magnitude = static_cast<float>(m) * 5.9604644775390625e-8f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));  // re-bias 15 -> 127
}

// float -> bfloat16, round to nearest even.
AMPSCOPE_HD inline std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN first: the rounding below would carry some NaNs (0x7F800001) into inf.
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even; a carry into the exponent is right,
  // including the carry from the largest floats into inf. No NaN reaches this line, so no wrap-around.
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// bfloat16 -> float, exact (a bf16 is the top half of a float).
AMPSCOPE_HD inline float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

// IEEE binary16 value held as its bits. Arithmetic happens in float: widen, compute, round once.
struct f16 {
  std::uint16_t bits;

  f16() = default;
  AMPSCOPE_HD explicit f16(float f) : bits(detail::float_to_f16_bits(f)) {}
  AMPSCOPE_HD explicit operator float() const { return detail::f16_bits_to_float(bits); }
  AMPSCOPE_HD static f16 from_bits(std::uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
};

// bfloat16 value held as its bits. Arithmetic happens in float: widen, compute, round once.
struct bf16 {
  std::uint16_t bits;

  bf16() = default;
  AMPSCOPE_HD explicit bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  AMPSCOPE_HD explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  AMPSCOPE_HD static bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2, "f16 and bf16 must be 2-byte storage types");

// Format constants (amp-semantics section 5), for code that reasons about ranges.
inline constexpr float kF16Max = 65504.0f;                    // 0x7BFF
inline constexpr float kF16MinNormal = 6.103515625e-05f;      // 2^-14
inline constexpr float kF16MinSubnormal = 5.9604644775390625e-08f;  // 2^-24
inline constexpr float kBF16Max = 3.38953138925153547590470800371487866880e+38f;  // 0x7F7F
inline constexpr float kBF16MinNormal = 1.17549435082228750796873653722224568e-38f;  // 2^-126

}  // namespace ampscope
