// tests/core/float8_test.cpp: proves core/float8.h's E4M3 and E5M2 conversions against definitions written
// here, independently of the header.
//
// What it proves:
//   * all 256 codes of each format decode as the format's formula says, evaluated in double with ldexp
//     (sign, exponent field, mantissa, the subnormal rule, E4M3's only NaN S.1111.111, E5M2's inf and NaNs);
//   * encoding agrees with a reference that knows nothing of bit tricks: the nearest of the 2 x 127 (E4M3:
//     126 finite magnitudes and zero per sign) finite values found by exhaustive search over the decoded
//     table in double, ties to the even code, then the overflow rule (satfinite: +-max; torch: E4M3 NaN,
//     E5M2 inf), NaN to NaN (satfinite: the canonical 0x7F; torch: 0x7F with the input's sign).
//     Inputs: all 65,536 f16 and all 65,536 bf16 values widened to float, every midpoint between
//     consecutive FP8 values and the floats 1..4 ulps either side of it and of each FP8 value, both
//     signs, and 3 million random floats (1 million uniform bit patterns, 2 million with exponents drawn
//     in and around each format's range);
//   * the documented boundary facts (448, 464, 480, 57344, 61440, 2^-9, 2^-16, -0, inf) by hand;
//   * where the CUDA toolkit's cuda_fp8.h is on the include path, the same inputs agree with NVIDIA's host
//     definition __nv_cvt_float_to_fp8 (__NV_SATFINITE for satfinite, __NV_NOSAT for torch, NaN signs
//     aside), the reference for the GPU kernels to come;
//   * the PyTorch variant: torch 1.13 (the one /usr/bin/python3 has) has no float8 dtypes, so it is checked
//     against c10's documented rule (E4M3: |x| > 464 is NaN; E5M2: |x| >= 61440 is inf) via the reference.
#include "core/float8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/float16.h"
#include "core/fp8_recipe.h"
#include "core/tensor.h"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define AMPSCOPE_HAVE_CUDA_FP8 1
#endif

namespace ampscope {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct Format {
  Fp8Format id;
  int ebits, mbits, bias;
  const char* name;
};
const Format kE4M3{Fp8Format::e4m3, 4, 3, 7, "e4m3"};
const Format kE5M2{Fp8Format::e5m2, 5, 2, 15, "e5m2"};

enum class Kind { finite, inf, nan };

// The format's definition, in double.
struct Decoded {
  Kind kind;
  double value;  // finite only; -0.0 for the negative zero
};
Decoded reference_decode(const Format& f, unsigned code) {
  const int s = (code >> 7) & 1;
  const int e = (code >> f.mbits) & ((1 << f.ebits) - 1);
  const int m = code & ((1 << f.mbits) - 1);
  const int emax_field = (1 << f.ebits) - 1;
  if (f.id == Fp8Format::e4m3) {
    if (e == emax_field && m == (1 << f.mbits) - 1) return {Kind::nan, 0};
  } else if (e == emax_field) {
    return {m == 0 ? Kind::inf : Kind::nan, 0};
  }
  double mag;
  if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mbits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mbits), e - f.bias);
  }
  return {Kind::finite, s ? -mag : mag};
}

// The decoded table of one format's 128 non-negative codes, built once from reference_decode.
struct Table {
  Decoded code[128];
  double max_mag = 0;
  unsigned max_code = 0;
};
const Table& table_of(const Format& f) {
  static Table tables[2];
  static bool built[2] = {false, false};
  const int i = f.id == Fp8Format::e4m3 ? 0 : 1;
  if (!built[i]) {
    for (unsigned c = 0; c < 0x80u; ++c) {
      tables[i].code[c] = reference_decode(f, c);
      if (tables[i].code[c].kind == Kind::finite && tables[i].code[c].value > tables[i].max_mag) {
        tables[i].max_mag = tables[i].code[c].value;
        tables[i].max_code = c;
      }
    }
    built[i] = true;
  }
  return tables[i];
}

// The reference encoder: nearest finite value by exhaustive search, ties to the even code, then overflow.
std::uint8_t reference_encode(const Format& f, float x, Fp8Overflow overflow) {
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  // NaN: satfinite gives CUDA's canonical 0x7F, torch keeps the sign (c10).
  if (std::isnan(x)) return static_cast<std::uint8_t>(overflow == Fp8Overflow::satfinite ? 0x7Fu : (sign | 0x7Fu));
  const double ax = std::fabs(static_cast<double>(x));
  const Table& t = table_of(f);
  // Past max: the value the next code would have in an unbounded format is max + one quantum of max's
  // binade; the midpoint to it decides, a tie going to the even neighbour.
  const double quantum = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(t.max_mag))) - f.mbits);
  const bool overflows = std::isinf(x) || ax > t.max_mag + quantum / 2 ||
                         (ax == t.max_mag + quantum / 2 && (t.max_code & 1u));
  if (overflows) {
    if (overflow == Fp8Overflow::satfinite) return static_cast<std::uint8_t>(sign | t.max_code);
    return static_cast<std::uint8_t>(sign | (f.id == Fp8Format::e4m3 ? 0x7Fu : 0x7Cu));
  }
  unsigned best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (unsigned c = 0; c < 0x80u; ++c) {
    const Decoded& d = t.code[c];
    if (d.kind != Kind::finite) continue;
    const double err = std::fabs(d.value - ax);  // exact: both have few significant bits
    if (err < best_err || (err == best_err && (c & 1u) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

const Format* const kFormats[] = {&kE4M3, &kE5M2};

TEST(Float8, DecodesAll256CodesByTheFormula) {
  for (const Format* f : kFormats) {
    int nans = 0, infs = 0;
    for (unsigned c = 0; c < 256; ++c) {
      const Decoded d = reference_decode(*f, c);
      const float got = fp8_to_float(static_cast<std::uint8_t>(c), f->id);
      SCOPED_TRACE(testing::Message() << f->name << " code 0x" << std::hex << c);
      switch (d.kind) {
        case Kind::nan:
          ++nans;
          EXPECT_TRUE(std::isnan(got));
          EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0);
          break;
        case Kind::inf:
          ++infs;
          EXPECT_TRUE(std::isinf(got));
          EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0);
          break;
        case Kind::finite:
          EXPECT_EQ(static_cast<double>(got), d.value);
          EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0);  // -0 included
          break;
      }
    }
    if (f->id == Fp8Format::e4m3) {
      EXPECT_EQ(nans, 2);
      EXPECT_EQ(infs, 0);
    } else {
      EXPECT_EQ(nans, 6);
      EXPECT_EQ(infs, 2);
    }
  }
}

TEST(Float8, BoundaryFactsByHand) {
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_float(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);

  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // E4M3 satfinite: everything past 448 clamps, infinities included; NaN stays NaN with its sign.
  EXPECT_EQ(float_to_e4m3_satfinite(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_satfinite(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_satfinite(500.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_satfinite(inf), 0x7E);
  EXPECT_EQ(float_to_e4m3_satfinite(-inf), 0xFE);
  EXPECT_EQ(float_to_e4m3_satfinite(nan), 0x7F);
  EXPECT_EQ(float_to_e4m3_satfinite(-nan), 0x7F);  // canonical, as __nv_cvt_float_to_fp8
  EXPECT_EQ(float_to_e5m2_satfinite(-nan), 0x7F);
  EXPECT_EQ(float_to_e4m3_torch(-nan), 0xFF);  // c10 keeps the sign
  EXPECT_EQ(float_to_e5m2_torch(-nan), 0xFF);
  // E4M3 torch: 464 is a tie that goes to the even 448; just above it, 480 and inf are NaN.
  EXPECT_EQ(float_to_e4m3_torch(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3_torch(std::nextafter(464.0f, inf)), 0x7F);
  EXPECT_EQ(float_to_e4m3_torch(480.0f), 0x7F);
  EXPECT_EQ(float_to_e4m3_torch(-1e6f), 0xFF);
  EXPECT_EQ(float_to_e4m3_torch(inf), 0x7F);
  // E5M2: satfinite never produces inf; torch gives inf from 61440 (the tie, odd 0x7B rounds up).
  EXPECT_EQ(float_to_e5m2_satfinite(inf), 0x7B);
  EXPECT_EQ(float_to_e5m2_satfinite(-inf), 0xFB);
  EXPECT_EQ(float_to_e5m2_satfinite(1e9f), 0x7B);
  EXPECT_EQ(float_to_e5m2_torch(std::nextafter(61440.0f, 0.0f)), 0x7B);
  EXPECT_EQ(float_to_e5m2_torch(61440.0f), 0x7C);
  EXPECT_EQ(float_to_e5m2_torch(-inf), 0xFC);
  EXPECT_EQ(float_to_e5m2_torch(nan), 0x7F);
  // -0 stays -0; half the smallest subnormal is a tie that goes to the even 0; just above it, to 0x01.
  EXPECT_EQ(float_to_e4m3_satfinite(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2_satfinite(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(float_to_e4m3_satfinite(-std::ldexp(1.0f, -10)), 0x80);
  EXPECT_EQ(float_to_e4m3_satfinite(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e5m2_satfinite(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(float_to_e5m2_satfinite(std::ldexp(3.0f, -17)), 0x02);  // 1.5 quanta: tie to even 2
  EXPECT_EQ(float_to_e4m3_satfinite(std::ldexp(1.0f, -149)), 0x00);  // the smallest float subnormal
  // 1 + 1/16 is the tie between 1 (0x38, even) and 1.125 (0x39); 1 + 3/16 between 0x39 and 0x3A (even).
  EXPECT_EQ(float_to_e4m3_satfinite(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3_satfinite(1.1875f), 0x3A);
}

// Compares the header with the reference over `inputs`, for both formats and both overflow rules.
void expect_encodes_like_reference(const std::vector<float>& inputs, const char* what) {
  for (const Format* f : kFormats) {
    for (const Fp8Overflow ov : {Fp8Overflow::satfinite, Fp8Overflow::torch}) {
      std::size_t mismatches = 0;
      for (const float x : inputs) {
        const std::uint8_t want = reference_encode(*f, x, ov);
        const std::uint8_t got = float_to_fp8(x, f->id, ov);
        if (got != want && ++mismatches <= 5) {
          ADD_FAILURE() << what << " " << f->name << (ov == Fp8Overflow::satfinite ? " satfinite" : " torch")
                        << ": x = " << x << " (bits 0x" << std::hex << bits_of(x) << ") got 0x" << int(got)
                        << " want 0x" << int(want);
        }
      }
      EXPECT_EQ(mismatches, 0u) << what << " " << f->name;
    }
  }
}

TEST(Float8, EncodesEveryF16AndBf16Value) {
  std::vector<float> inputs;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    inputs.push_back(static_cast<float>(f16::from_bits(static_cast<std::uint16_t>(b))));
    inputs.push_back(static_cast<float>(bf16::from_bits(static_cast<std::uint16_t>(b))));
  }
  expect_encodes_like_reference(inputs, "f16/bf16");
}

std::vector<float> boundary_inputs() {
  std::vector<float> inputs;
  auto around = [&](float v) {
    float lo = v, hi = v;
    inputs.push_back(v);
    for (int k = 0; k < 4; ++k) {
      lo = std::nextafter(lo, -std::numeric_limits<float>::infinity());
      hi = std::nextafter(hi, std::numeric_limits<float>::infinity());
      inputs.push_back(lo);
      inputs.push_back(hi);
    }
  };
  for (const Format* f : kFormats) {
    std::vector<double> values;  // non-negative finite values, ascending by code
    for (unsigned c = 0; c < 0x80u; ++c) {
      const Decoded d = reference_decode(*f, c);
      if (d.kind == Kind::finite) values.push_back(d.value);
    }
    // One more step past max in an unbounded format, so the midpoint above max is tested too.
    const double q = values.back() - values[values.size() - 2];
    values.push_back(values.back() + q);
    values.push_back(values.back() + q);
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (const double sgn : {1.0, -1.0}) {
        around(static_cast<float>(sgn * values[i]));
        if (i + 1 < values.size()) {
          const double mid = (values[i] + values[i + 1]) / 2;  // exact in float: one more bit
          if (static_cast<double>(static_cast<float>(mid)) != mid) ADD_FAILURE() << "midpoint not exact: " << mid;
          around(static_cast<float>(sgn * mid));
        }
      }
    }
  }
  around(std::numeric_limits<float>::infinity());
  around(std::numeric_limits<float>::max());
  around(std::numeric_limits<float>::denorm_min());
  inputs.push_back(std::numeric_limits<float>::quiet_NaN());
  inputs.push_back(-std::numeric_limits<float>::quiet_NaN());
  inputs.push_back(float_of(0x7F800001u));  // a signalling NaN
  inputs.push_back(float_of(0xFFFFFFFFu));
  return inputs;
}

TEST(Float8, EncodesEveryBoundaryAndTie) {
  const std::vector<float> inputs = boundary_inputs();
  EXPECT_GT(inputs.size(), 4000u);
  expect_encodes_like_reference(inputs, "boundaries");
}

std::vector<float> random_inputs() {
  std::mt19937_64 rng(0xF8F8);
  std::vector<float> inputs;
  inputs.reserve(3'000'000);
  for (int i = 0; i < 1'000'000; ++i) inputs.push_back(float_of(static_cast<std::uint32_t>(rng())));
  // Exponents from 2^-20 (below E5M2's smallest subnormal) to 2^18 (past 57344), any mantissa and sign.
  std::uniform_int_distribution<int> exponent(-20, 18);
  for (int i = 0; i < 2'000'000; ++i) {
    const std::uint32_t r = static_cast<std::uint32_t>(rng());
    const std::uint32_t e = static_cast<std::uint32_t>(exponent(rng) + 127);
    inputs.push_back(float_of((r & 0x807FFFFFu) | (e << 23)));
  }
  return inputs;
}

TEST(Float8, EncodesThreeMillionRandomFloats) {
  const std::vector<float> inputs = random_inputs();
  expect_encodes_like_reference(inputs, "random");
}

// NVIDIA's own conversion, where the CUDA toolkit's cuda_fp8.h is there: on the host
// __nv_cvt_float_to_fp8 is CUDA's software definition of cvt.rn.satfinite (__NV_SATFINITE) and of the
// non-saturating cast (__NV_NOSAT, whose overflow rule is c10's). It turns every NaN into the canonical
// 0x7F, which the torch rule does not (c10 keeps the sign), so NaN inputs compare their magnitudes there.
TEST(Float8, AgreesWithCudaFp8HostConversion) {
#if defined(AMPSCOPE_HAVE_CUDA_FP8)
  std::vector<float> inputs = boundary_inputs();
  const std::vector<float> random = random_inputs();
  inputs.insert(inputs.end(), random.begin(), random.end());
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    inputs.push_back(static_cast<float>(f16::from_bits(static_cast<std::uint16_t>(b))));
    inputs.push_back(static_cast<float>(bf16::from_bits(static_cast<std::uint16_t>(b))));
  }
  std::size_t mismatches = 0;
  for (const float x : inputs) {
    const std::uint8_t nv[4] = {
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2))};
    std::uint8_t ours[4] = {float_to_e4m3_satfinite(x), float_to_e5m2_satfinite(x), float_to_e4m3_torch(x),
                            float_to_e5m2_torch(x)};
    if (std::isnan(x)) {
      ours[2] &= 0x7F;
      ours[3] &= 0x7F;
    }
    for (int k = 0; k < 4; ++k) {
      if (nv[k] != ours[k] && ++mismatches <= 5) {
        ADD_FAILURE() << "case " << k << " x = " << x << " (bits 0x" << std::hex << bits_of(x) << ") cuda 0x"
                      << int(nv[k]) << " ours 0x" << int(ours[k]);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
#else
  GTEST_SKIP() << "cuda_fp8.h is not on the include path: no CUDA toolkit to compare with";
#endif
}

TEST(Float8, RoundTripsEveryFiniteCode) {
  for (const Format* f : kFormats) {
    for (unsigned c = 0; c < 256; ++c) {
      const Decoded d = reference_decode(*f, c);
      const float x = fp8_to_float(static_cast<std::uint8_t>(c), f->id);
      if (d.kind == Kind::finite) {
        EXPECT_EQ(float_to_fp8(x, f->id, Fp8Overflow::satfinite), c) << f->name << " 0x" << std::hex << c;
        EXPECT_EQ(float_to_fp8(x, f->id, Fp8Overflow::torch), c) << f->name << " 0x" << std::hex << c;
      }
    }
  }
}

TEST(Float8, QuantizesWithAScaleAndBack) {
  // scale 2^-3 = 0.125 (a power of two: x * scale is exact), E4M3: 100 -> 12.5 -> 12 (tie between 12 and 13
  // goes to 12, code even); 4000 -> 500 -> saturates to 448; dequantize multiplies by scale_inv = 8.
  const std::vector<float> x{100.0f, 4000.0f, -0.0f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  const std::vector<std::uint8_t> q = quantize_fp8(x, 0.125f, Fp8Format::e4m3);
  ASSERT_EQ(q.size(), 5u);
  EXPECT_EQ(e4m3_to_float(q[0]), 12.0f);
  EXPECT_EQ(q[1], 0x7E);
  EXPECT_EQ(q[2], 0x80);
  EXPECT_EQ(e4m3_to_float(q[3]), 0.125f);
  EXPECT_EQ(q[4], 0x7F);
  const std::vector<float> back = dequantize_fp8(q, 8.0f, Fp8Format::e4m3);
  EXPECT_EQ(back[0], 96.0f);
  EXPECT_EQ(back[1], 3584.0f);
  EXPECT_TRUE(std::signbit(back[2]) && back[2] == 0.0f);
  EXPECT_EQ(back[3], 1.0f);
  EXPECT_TRUE(std::isnan(back[4]));
  // A scale that is not a power of two: the product rounds to float first (0.1f * 3.0f), then to E5M2.
  const float prod = 0.1f * 3.0f;
  EXPECT_EQ(quantize_fp8(0.1f, 3.0f, Fp8Format::e5m2), reference_encode(kE5M2, prod, Fp8Overflow::satfinite));
}

TEST(Float8, QuantizesTensorsRowMajor) {
  // A transposed (non-contiguous) view: its elements are read in row-major order of the view.
  const Tensor base = from_values({1, 2, 3, 500, -0.25, 7}, {2, 3});
  const Tensor t = base.transpose(0, 1);  // [[1, 500], [2, -0.25], [3, 7]]
  const std::vector<std::uint8_t> q = quantize_fp8(t, 1.0f, Fp8Format::e4m3);
  const std::vector<float> row_major{1, 500, 2, -0.25f, 3, 7};
  ASSERT_EQ(q.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(q[i], float_to_e4m3_satfinite(row_major[i])) << i;
  const Tensor back = dequantize_fp8_tensor(q, {3, 2}, 2.0f, Fp8Format::e4m3);
  EXPECT_EQ(back.shape(), (Shape{3, 2}));
  EXPECT_EQ(back.dtype(), DType::f32);
  EXPECT_EQ(back.values(), (std::vector<double>{2, 896, 4, -0.5, 6, 14}));  // 500 saturated at 448, times 2

  try {
    quantize_fp8(from_values({1, 2}, {2}, {.dtype = DType::f16}), 1.0f, Fp8Format::e4m3);
    FAIL() << "f16 accepted";
  } catch (const DTypeError& e) {
    EXPECT_STREQ(e.what(), "quantize_fp8: the tensor is f16 of shape [2], but FP8 quantization reads f32\n"
                           "hint: convert it first with x.to(DType::f32)");
  }
  try {
    dequantize_fp8_tensor(q, {4, 2}, 1.0f, Fp8Format::e4m3);
    FAIL() << "wrong shape accepted";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "dequantize_fp8_tensor: 6 codes do not fill shape [4, 2] (8 elements)\n"
                           "hint: pass the shape of the tensor the codes were quantized from");
  }
}

}  // namespace
}  // namespace ampscope
