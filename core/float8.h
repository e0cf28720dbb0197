// core/float8.h: the two FP8 element formats (OCP OFP8 E4M3 "e4m3fn" and E5M2) and their exact
// conversions to and from float, beside the f16/bf16 ones of core/float16.h and in the same style: one
// bit-level definition for host and CUDA device code, so both sides round every value the same way.
//
//   std::uint8_t q = float_to_e4m3_satfinite(500.0f);  // 0x7E (448): saturated, as TransformerEngine casts
//   std::uint8_t p = float_to_e4m3_torch(500.0f);      // 0x7F (NaN): PyTorch's .to(torch.float8_e4m3fn)
//   float back = e5m2_to_float(0x3C);                  // 1.0f
//
// Bit layouts (most significant bit first):
//
//   E4M3   s eeee mmm     1 / 4 / 3, bias 7
//          max 448 = S.1111.110 (0x7E); no infinity; NaN is S.1111.111 only (0x7F, 0xFF);
//          smallest normal 2^-6 (0x08), smallest subnormal 2^-9 (0x01): value m * 2^-9 when e == 0
//   E5M2   s eeeee mm     1 / 5 / 2, bias 15 (the top byte of an IEEE binary16)
//          max 57344 = S.11110.11 (0x7B); infinity S.11111.00 (0x7C, 0xFC); NaN S.11111.{01,10,11};
//          smallest normal 2^-14 (0x04), smallest subnormal 2^-16 (0x01): value m * 2^-16 when e == 0
//
// Encoding from float is round to nearest, ties to even (on the code's last bit), subnormals kept, and
// zero keeps its sign (-0.0f gives 0x80). Two rules, for values too large and for NaN:
//
// - satfinite (TransformerEngine): TransformerEngine's FP8 casts are PTX `cvt.rn.satfinite`, whose
//   `.satfinite` clamps any result beyond the largest finite value, infinities included, to +-max and
//   leaves NaN a NaN. CUDA's cuda_fp8.hpp defines that conversion on the host too
//   (__nv_cvt_float_to_fp8 with __NV_SATFINITE), and this header follows that definition: +-inf -> +-448
//   in E4M3 (which has no inf) and +-57344 in E5M2 (which has one: satfinite never produces it), and
//   every NaN gives the canonical 0x7F whatever its sign ("Canonical NaN" there). tests/core/float8_test.cpp
//   compares the two where the toolkit is installed; on a GPU the cvt instruction itself is still to be
//   compared (issue 34's CUDA part). This is the rule for quantizing in the runtime: a clipped value shows
//   up as saturation, never as a NaN.
// - torch (PyTorch's `.to(torch.float8_e4m3fn / float8_e5m2)`, c10's fp8e4m3fn_from_fp32_value and
//   fp8e5m2_from_fp32_value): no saturation. E4M3: anything that rounds past 448 is NaN, i.e. |x| > 464
//   (464 is the tie between 448 = 0x7E and the would-be 480 = 0x7F, and goes to the even 0x7E), so
//   (464, 480) rounds onto the NaN pattern and 480 and up, and +-inf, give NaN. E5M2: rounding as IEEE
//   binary16 does, |x| >= 61440 (the tie between 57344 and 65536, odd 0x7B rounds up) and +-inf give +-inf.
//   A NaN gives 0x7F with the input's sign (0xFF for a negative NaN), as c10 ORs the sign in last.
//
// Why not CUDA's __nv_fp8_e4m3 types here: they exist only with cuda_fp8.h, not in host-only builds, and
// the CPU backend must give the same bits without a GPU. The GPU kernels that come later (issue 34) must
// be checked against these functions.
#pragma once

#include <cstdint>

#include "core/float16.h"  // AMPSCOPE_HD, detail::float_bits / bits_float

namespace ampscope {

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };

// What an encode does with a value beyond the format's largest finite value (see the top of the file).
enum class Fp8Overflow : std::uint8_t { satfinite, torch };

inline constexpr float kE4M3Max = 448.0f;                  // 0x7E
inline constexpr float kE4M3MinNormal = 0.015625f;         // 2^-6, 0x08
inline constexpr float kE4M3MinSubnormal = 0.001953125f;   // 2^-9, 0x01
inline constexpr float kE5M2Max = 57344.0f;                // 0x7B
inline constexpr float kE5M2MinNormal = 6.103515625e-05f;  // 2^-14, 0x04
inline constexpr float kE5M2MinSubnormal = 1.52587890625e-05f;  // 2^-16, 0x01

AMPSCOPE_HD inline constexpr float fp8_max(Fp8Format format) {
  return format == Fp8Format::e4m3 ? kE4M3Max : kE5M2Max;
}

namespace detail {

// A format's shape: mantissa bits and bias; the largest finite code magnitude.
struct Fp8Shape {
  std::uint32_t mbits;
  std::int32_t bias;
  std::uint32_t max_code;  // 0x7E (E4M3) or 0x7B (E5M2)
};

AMPSCOPE_HD inline constexpr Fp8Shape fp8_shape(Fp8Format format) {
  return format == Fp8Format::e4m3 ? Fp8Shape{3u, 7, 0x7Eu} : Fp8Shape{2u, 15, 0x7Bu};
}

// float -> FP8 code, round to nearest even.
AMPSCOPE_HD inline std::uint8_t float_to_fp8_bits(float f, Fp8Format format, Fp8Overflow overflow) {
  const Fp8Shape s = fp8_shape(format);
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 24) & 0x80u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN stays NaN: canonical under satfinite, signed under torch
    return static_cast<std::uint8_t>(overflow == Fp8Overflow::satfinite ? 0x7Fu : (sign | 0x7Fu));
  }

  std::uint32_t code;  // the magnitude's code, possibly past max_code (then handled below)
  if (a == 0x7F800000u) {
    code = 0x80u;  // inf: past every finite code
  } else if (a < 0x00800000u) {
    code = 0;  // float zeros and subnormals (< 2^-126) are far below half the smallest FP8 subnormal
  } else {
    // a normal float: |x| = mant * 2^(e - 150) with the implicit bit made explicit. The FP8 quantum in
    // x's binade is 2^(e - 127 - mbits) for a normal FP8 value, and the subnormal quantum
    // 2^(1 - bias - mbits) below the smallest normal: shift mant down to that quantum, rounding to
    // nearest even. For a normal result r carries the implicit bit (r in [2^mbits, 2^(mbits+1)]), so
    // adding it to (exponent - 1) << mbits gives the code, and a carry from rounding up correctly lands
    // on the next binade; a subnormal result is the code itself, and rounding up from the largest
    // subnormal gives the smallest normal's code, again right.
    const std::int32_t e = static_cast<std::int32_t>(a >> 23) - 127;  // unbiased, -126 .. 127
    const std::uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
    const std::int32_t min_normal_exp = 1 - s.bias;
    const bool normal = e >= min_normal_exp;
    const std::int32_t shift =
        normal ? 23 - static_cast<std::int32_t>(s.mbits) : 23 - static_cast<std::int32_t>(s.mbits) + (min_normal_exp - e);
    std::uint32_t r;
    if (shift > 25) {
      r = 0;  // |x| < 2^(quantum - 1) / 2: below half the smallest subnormal
    } else {
      r = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (r & 1u))) ++r;
    }
    if (normal) {
      // e + bias - 1 >= 0 here; e up to 127 keeps this far from overflowing 32 bits.
      code = (static_cast<std::uint32_t>(e + s.bias - 1) << s.mbits) + r;
    } else {
      code = r;
    }
  }

  if (code > s.max_code) {
    if (overflow == Fp8Overflow::satfinite) {
      code = s.max_code;
    } else {
      code = format == Fp8Format::e4m3 ? 0x7Fu : 0x7Cu;  // E4M3: NaN (no inf); E5M2: inf
    }
  }
  return static_cast<std::uint8_t>(sign | code);
}

// FP8 code -> float, exact (every FP8 value is a normal float).
AMPSCOPE_HD inline float fp8_bits_to_float(std::uint8_t c, Fp8Format format) {
  const Fp8Shape s = fp8_shape(format);
  const std::uint32_t sign = static_cast<std::uint32_t>(c & 0x80u) << 24;
  const std::uint32_t mag = c & 0x7Fu;
  const std::uint32_t e = mag >> s.mbits;
  const std::uint32_t m = mag & ((1u << s.mbits) - 1u);
  if (format == Fp8Format::e4m3) {
    if (mag == 0x7Fu) return bits_float(sign | 0x7FC00000u);
  } else if (e == 0x1Fu) {
    return bits_float(sign | (m == 0 ? 0x7F800000u : 0x7FC00000u));
  }
  if (e == 0) {
    // m * 2^(1 - bias - mbits): 2^-9 (E4M3) or 2^-16 (E5M2), exact in float.
    const float quantum = format == Fp8Format::e4m3 ? kE4M3MinSubnormal : kE5M2MinSubnormal;
    return bits_float(sign | float_bits(static_cast<float>(m) * quantum));
  }
  const std::uint32_t fe = e + 127u - static_cast<std::uint32_t>(s.bias);  // re-bias
  return bits_float(sign | (fe << 23) | (m << (23u - s.mbits)));
}

}  // namespace detail

AMPSCOPE_HD inline float e4m3_to_float(std::uint8_t c) { return detail::fp8_bits_to_float(c, Fp8Format::e4m3); }
AMPSCOPE_HD inline float e5m2_to_float(std::uint8_t c) { return detail::fp8_bits_to_float(c, Fp8Format::e5m2); }
AMPSCOPE_HD inline float fp8_to_float(std::uint8_t c, Fp8Format format) { return detail::fp8_bits_to_float(c, format); }

AMPSCOPE_HD inline std::uint8_t float_to_e4m3_satfinite(float f) {
  return detail::float_to_fp8_bits(f, Fp8Format::e4m3, Fp8Overflow::satfinite);
}
AMPSCOPE_HD inline std::uint8_t float_to_e5m2_satfinite(float f) {
  return detail::float_to_fp8_bits(f, Fp8Format::e5m2, Fp8Overflow::satfinite);
}
AMPSCOPE_HD inline std::uint8_t float_to_e4m3_torch(float f) {
  return detail::float_to_fp8_bits(f, Fp8Format::e4m3, Fp8Overflow::torch);
}
AMPSCOPE_HD inline std::uint8_t float_to_e5m2_torch(float f) {
  return detail::float_to_fp8_bits(f, Fp8Format::e5m2, Fp8Overflow::torch);
}
AMPSCOPE_HD inline std::uint8_t float_to_fp8(float f, Fp8Format format, Fp8Overflow overflow = Fp8Overflow::satfinite) {
  return detail::float_to_fp8_bits(f, format, overflow);
}

// One scaled element as TransformerEngine quantizes it: q = sat(RNE(x * scale)), the product rounded
// to float first (the cast kernels multiply in f32), then encoded with satfinite.
AMPSCOPE_HD inline std::uint8_t quantize_fp8(float x, float scale, Fp8Format format) {
  return detail::float_to_fp8_bits(x * scale, format, Fp8Overflow::satfinite);
}

// One element back: decode(q) * scale_inv in float, scale_inv being 1 / scale as the recipe keeps it.
AMPSCOPE_HD inline float dequantize_fp8(std::uint8_t q, float scale_inv, Fp8Format format) {
  return detail::fp8_bits_to_float(q, format) * scale_inv;
}

}  // namespace ampscope
