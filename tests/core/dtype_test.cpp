// tests/core/dtype_test.cpp: dtype sizes, names and parsing (core/dtype.h), PyTorch's promotion table, and
// the element conversion rules of core/convert.h.
//
// Where the expected values come from:
//   * sizes, names and promotions: PyTorch's documentation (torch.finfo/iinfo sizes, torch.promote_types),
//     written out as literal tables below, never computed by the code under test;
//   * f16 rounding: g++'s host `_Float16` (IEEE round-to-nearest-even, libgcc soft-float or F16C), a
//     conversion that shares no code with core/float16.h;
//   * bf16 rounding: a separate reference in this file that rounds in double arithmetic by scaling to an
//     integer quantum and calling nearbyint (core/float16.h works on the bit pattern instead);
//   * integer saturation and truncation: values worked out by hand in the comments.
#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/format.h"

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

namespace {

using ampscope::bf16;
using ampscope::convert;
using ampscope::DType;
using ampscope::f16;
using ampscope::testing::reference_bf16;
using ampscope::testing::reference_f16;


// Hides a value from the optimiser, so conversions run at run time (as in a kernel) instead of being
// folded at compile time, where out-of-range float-to-integer casts may fold differently.
template <class T>
T opaque(T x) {
  volatile T v = x;
  return v;
}

constexpr DType kAll[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::boolean};

// ---- sizes and names ----------------------------------------------------------------------------

TEST(dtype_test, sizes_match_the_ieee_and_integer_formats) {
  // binary64 8 bytes, binary32 4, binary16 2, bfloat16 2, int64 8, bool 1 (torch.finfo(...).bits / 8).
  EXPECT_EQ(ampscope::dtype_size(DType::f64), 8u);
  EXPECT_EQ(ampscope::dtype_size(DType::f32), 4u);
  EXPECT_EQ(ampscope::dtype_size(DType::f16), 2u);
  EXPECT_EQ(ampscope::dtype_size(DType::bf16), 2u);
  EXPECT_EQ(ampscope::dtype_size(DType::i64), 8u);
  EXPECT_EQ(ampscope::dtype_size(DType::boolean), 1u);
}

TEST(dtype_test, storage_type_of_every_dtype_has_the_dtype_size) {
  for (DType t : kAll) {
    const std::size_t storage = ampscope::visit_dtype(t, [](auto tag) { return sizeof(tag); });
    EXPECT_EQ(storage, ampscope::dtype_size(t)) << ampscope::dtype_name(t);
  }
}

TEST(dtype_test, names_are_the_short_forms) {
  EXPECT_EQ(ampscope::dtype_name(DType::f64), "f64");
  EXPECT_EQ(ampscope::dtype_name(DType::f32), "f32");
  EXPECT_EQ(ampscope::dtype_name(DType::f16), "f16");
  EXPECT_EQ(ampscope::dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(ampscope::dtype_name(DType::i64), "i64");
  EXPECT_EQ(ampscope::dtype_name(DType::boolean), "bool");
}

TEST(dtype_test, fmt_prints_a_dtype_by_its_name) {
  EXPECT_EQ(fmt::format("{}", DType::bf16), "bf16");
  EXPECT_EQ(fmt::format("[{}]", DType::boolean), "[bool]");
}

TEST(dtype_test, only_the_four_float_formats_are_floating) {
  EXPECT_TRUE(ampscope::is_floating(DType::f64));
  EXPECT_TRUE(ampscope::is_floating(DType::f32));
  EXPECT_TRUE(ampscope::is_floating(DType::f16));
  EXPECT_TRUE(ampscope::is_floating(DType::bf16));
  EXPECT_FALSE(ampscope::is_floating(DType::i64));
  EXPECT_FALSE(ampscope::is_floating(DType::boolean));
}

// ---- parse_dtype --------------------------------------------------------------------------------

TEST(dtype_test, parse_dtype_accepts_our_names_and_round_trips_dtype_name) {
  for (DType t : kAll) EXPECT_EQ(ampscope::parse_dtype(ampscope::dtype_name(t)), t) << ampscope::dtype_name(t);
}

TEST(dtype_test, parse_dtype_accepts_pytorch_names) {
  // torch.float64 == torch.double, torch.float32 == torch.float, torch.float16 == torch.half,
  // torch.int64 == torch.long, torch.bfloat16, torch.bool; plus the "fpNN" spellings in the header.
  struct Case {
    const char* name;
    DType dtype;
  };
  const Case cases[] = {
      {"float64", DType::f64},   {"double", DType::f64}, {"fp64", DType::f64},  {"float32", DType::f32},
      {"float", DType::f32},     {"fp32", DType::f32},   {"float16", DType::f16}, {"half", DType::f16},
      {"fp16", DType::f16},      {"bfloat16", DType::bf16}, {"int64", DType::i64}, {"long", DType::i64},
      {"bool", DType::boolean},
  };
  for (const Case& c : cases) EXPECT_EQ(ampscope::parse_dtype(c.name), c.dtype) << c.name;
}

TEST(dtype_test, parse_dtype_rejects_an_unknown_name_and_lists_the_valid_ones) {
  EXPECT_THROW_MSG(ampscope::parse_dtype("f8"), ampscope::DTypeError, "'f8'", "f64", "f32", "f16", "bf16", "i64",
                   "bool");
  EXPECT_THROW_MSG(ampscope::parse_dtype(""), ampscope::DTypeError, "''", "bf16");
  // Names are case-sensitive, as torch's attribute names are.
  EXPECT_THROW_MSG(ampscope::parse_dtype("F16"), ampscope::DTypeError, "'F16'", "f16");
}

// ---- promote_types ------------------------------------------------------------------------------

TEST(dtype_test, promote_types_matches_the_pytorch_table) {
  // torch.promote_types for {float64, float32, float16, bfloat16, int64, bool}, row x column, as printed by
  // PyTorch: the higher category wins (bool < integer < floating), within floating the wider type wins,
  // and float16 with bfloat16 gives float32 (the documented example).
  constexpr DType F64 = DType::f64, F32 = DType::f32, F16 = DType::f16, BF16 = DType::bf16, I64 = DType::i64,
                  B = DType::boolean;
  const DType table[6][6] = {
      //          f64  f32   f16   bf16  i64  bool
      /* f64  */ {F64, F64, F64, F64, F64, F64},
      /* f32  */ {F64, F32, F32, F32, F32, F32},
      /* f16  */ {F64, F32, F16, F32, F16, F16},
      /* bf16 */ {F64, F32, F32, BF16, BF16, BF16},
      /* i64  */ {F64, F32, F16, BF16, I64, I64},
      /* bool */ {F64, F32, F16, BF16, I64, B},
  };
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) {
      EXPECT_EQ(ampscope::promote_types(kAll[i], kAll[j]), table[i][j])
          << "promote_types(" << ampscope::dtype_name(kAll[i]) << ", " << ampscope::dtype_name(kAll[j]) << ") gave "
          << ampscope::dtype_name(ampscope::promote_types(kAll[i], kAll[j])) << ", PyTorch gives "
          << ampscope::dtype_name(table[i][j]);
    }
  }
}

// ---- convert: floating -> integer ---------------------------------------------------------------

TEST(dtype_test, nan_converts_to_integer_zero) {
  EXPECT_EQ(convert<std::int64_t>(opaque(std::nan(""))), 0);
  EXPECT_EQ(convert<std::int64_t>(opaque(std::nanf(""))), 0);
  EXPECT_EQ(convert<std::int64_t>(opaque(-std::nan(""))), 0);
  EXPECT_EQ(convert<std::int64_t>(f16::from_bits(0x7E00)), 0);   // f16 quiet NaN
  EXPECT_EQ(convert<std::int64_t>(bf16::from_bits(0x7FC0)), 0);  // bf16 quiet NaN
}

TEST(dtype_test, infinities_and_huge_values_saturate_at_the_int64_range) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(convert<std::int64_t>(opaque(inf)), INT64_MAX);
  EXPECT_EQ(convert<std::int64_t>(opaque(-inf)), INT64_MIN);
  EXPECT_EQ(convert<std::int64_t>(opaque(1e300)), INT64_MAX);
  EXPECT_EQ(convert<std::int64_t>(opaque(-1e300)), INT64_MIN);
  EXPECT_EQ(convert<std::int64_t>(opaque(3.0e38f)), INT64_MAX);
  // 2^63 itself is one past INT64_MAX: saturates. -2^63 is INT64_MIN exactly.
  EXPECT_EQ(convert<std::int64_t>(opaque(9223372036854775808.0)), INT64_MAX);
  EXPECT_EQ(convert<std::int64_t>(opaque(-9223372036854775808.0)), INT64_MIN);
  // The largest double below 2^63 is 2^63 - 2^10 = 9223372036854774784: in range, converted exactly.
  EXPECT_EQ(convert<std::int64_t>(opaque(std::nextafter(9223372036854775808.0, 0.0))), 9223372036854774784LL);
  // The largest float below 2^63 is 2^63 - 2^39 = 9223371487098961920.
  EXPECT_EQ(convert<std::int64_t>(opaque(std::nextafter(9223372036854775808.0f, 0.0f))), 9223371487098961920LL);
  EXPECT_EQ(convert<std::int64_t>(f16::from_bits(0x7C00)), INT64_MAX);  // f16 +inf
  EXPECT_EQ(convert<std::int64_t>(f16::from_bits(0xFC00)), INT64_MIN);  // f16 -inf
  EXPECT_EQ(convert<std::int64_t>(bf16::from_bits(0x7F7F)), INT64_MAX);  // bf16 max, ~3.39e38
}

TEST(dtype_test, floating_to_integer_truncates_toward_zero) {
  EXPECT_EQ(convert<std::int64_t>(-3.7), -3);
  EXPECT_EQ(convert<std::int64_t>(3.7), 3);
  EXPECT_EQ(convert<std::int64_t>(-0.5f), 0);
  EXPECT_EQ(convert<std::int64_t>(2.9999f), 2);
  EXPECT_EQ(convert<std::int64_t>(f16::from_bits(0xC366)), -3);  // f16 0xC366 = -(1 + 870/1024) * 2 = -3.69921875
  EXPECT_EQ(convert<std::int64_t>(bf16::from_bits(0x4070)), 3);  // bf16 3.75
  EXPECT_EQ(convert<std::int64_t>(4611686018427387904.0), 4611686018427387904LL);  // 2^62 exactly
}

// ---- convert: to bool ---------------------------------------------------------------------------

TEST(dtype_test, anything_to_bool_is_not_equal_to_zero_so_nan_is_true) {
  EXPECT_TRUE(convert<bool>(std::nan("")));
  EXPECT_TRUE(convert<bool>(std::nanf("")));
  EXPECT_TRUE(convert<bool>(f16::from_bits(0x7E00)));
  EXPECT_TRUE(convert<bool>(bf16::from_bits(0x7FC0)));
  EXPECT_FALSE(convert<bool>(0.0));
  EXPECT_FALSE(convert<bool>(-0.0));
  EXPECT_FALSE(convert<bool>(f16::from_bits(0x8000)));  // f16 -0
  EXPECT_TRUE(convert<bool>(f16::from_bits(0x0001)));   // smallest f16 subnormal, 2^-24
  EXPECT_TRUE(convert<bool>(1e-300));
  EXPECT_TRUE(convert<bool>(std::int64_t{-5}));
  EXPECT_FALSE(convert<bool>(std::int64_t{0}));
}

// ---- convert: integer -> floating ---------------------------------------------------------------

TEST(dtype_test, int64_to_f32_rounds_to_nearest_even) {
  // Floats in [2^24, 2^25) are spaced 2 apart.
  // 2^24 + 1 is the tie between 2^24 (mantissa ...0, even) and 2^24 + 2 (mantissa ...1, odd): 2^24.
  EXPECT_EQ(convert<float>(std::int64_t{16777217}), 16777216.0f);
  // 2^24 + 3 is the tie between 2^24 + 2 (odd) and 2^24 + 4 (even): 2^24 + 4.
  EXPECT_EQ(convert<float>(std::int64_t{16777219}), 16777220.0f);
  // Not a tie: 2^24 + 2^1 + ... exact values stay exact.
  EXPECT_EQ(convert<float>(std::int64_t{16777218}), 16777218.0f);
  // INT64_MAX = 2^63 - 1 rounds up to 2^63.
  EXPECT_EQ(convert<float>(INT64_MAX), 9223372036854775808.0f);
  // Doubles in [2^53, 2^54) are spaced 2 apart: 2^53 + 1 ties to the even 2^53.
  EXPECT_EQ(convert<double>(std::int64_t{9007199254740993}), 9007199254740992.0);
  EXPECT_EQ(convert<float>(true), 1.0f);
  EXPECT_EQ(convert<double>(false), 0.0);
}

TEST(dtype_test, int64_to_f16_overflows_to_infinity) {
  // 65520 is the half-way point between 65504 (f16 max) and 2^16; at and above it f16 is +inf.
  EXPECT_EQ(convert<f16>(std::int64_t{65519}).bits, 0x7BFF);  // 65504
  EXPECT_EQ(convert<f16>(std::int64_t{65520}).bits, 0x7C00);  // +inf
  EXPECT_EQ(convert<f16>(std::int64_t{-70000}).bits, 0xFC00);  // -inf
  // 2049 is the tie between 2048 and 2050 (f16 spacing 2 in [2048, 4096)): to the even 2048.
  EXPECT_EQ(static_cast<float>(convert<f16>(std::int64_t{2049})), 2048.0f);
  EXPECT_EQ(static_cast<float>(convert<f16>(std::int64_t{2051})), 2052.0f);
}

// ---- convert: f64 -> f16/bf16 goes through float ------------------------------------------------

TEST(dtype_test, f64_to_f16_rounds_through_float_as_pytorch_does) {
  // d = 1 + 2^-11 + 2^-40. f16 values near 1 are spaced 2^-10, so 1 + 2^-11 is the tie between 1 and
  // 1 + 2^-10, and d lies just above it:
  //   * rounded directly to f16, d goes up to 1 + 2^-10 = 1.0009765625;
  //   * rounded to float first (spacing 2^-23 near 1; 2^-40 is far below half of it), d becomes exactly
  //     the tie 1 + 2^-11, which f16 then rounds to the even neighbour 1.0.
  // PyTorch's static_cast<Half>(double) goes through float, so the answer we want is 1.0.
  const double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const double direct = static_cast<double>(static_cast<_Float16>(d));              // compiler, one rounding
  const double through_float = static_cast<double>(static_cast<_Float16>(static_cast<float>(d)));
  ASSERT_EQ(direct, 1.0009765625) << "the example must really be a double-rounding case";
  ASSERT_EQ(through_float, 1.0);
  EXPECT_EQ(static_cast<double>(static_cast<float>(convert<f16>(d))), through_float);
  EXPECT_EQ(convert<f16>(d).bits, 0x3C00);  // 1.0

  // Same effect at the top of the range: 65519.999999 is below the overflow threshold 65520 (direct
  // rounding gives 65504), but the nearest float is 65520.0 exactly (float spacing there is 2^-8), and
  // 65520 is the tie between 65504 (odd mantissa 0x3FF) and 2^16 (even), so through float it is +inf.
  const double top = 65519.999999;
  ASSERT_EQ(static_cast<double>(static_cast<_Float16>(top)), 65504.0);
  ASSERT_TRUE(std::isinf(static_cast<double>(static_cast<_Float16>(static_cast<float>(top)))));
  EXPECT_EQ(convert<f16>(top).bits, 0x7C00);
}

TEST(dtype_test, f64_to_bf16_rounds_through_float_as_pytorch_does) {
  // bf16 values near 1 are spaced 2^-7; 1 + 2^-8 is the tie between 1 and 1 + 2^-7. d = 1 + 2^-8 + 2^-40
  // rounds directly to 1 + 2^-7, but through float it becomes the tie and goes to the even 1.0.
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  ASSERT_EQ(static_cast<float>(d), 1.0f + std::ldexp(1.0f, -8));
  EXPECT_EQ(convert<bf16>(d).bits, 0x3F80);  // 1.0
  EXPECT_EQ(static_cast<float>(convert<bf16>(d)), reference_bf16(static_cast<float>(d)));
}

TEST(dtype_test, float_to_f16_matches_the_compiler_on_boundary_values) {
  // Values around every f16 boundary: overflow threshold, max, min normal, min subnormal, ties.
  const float inputs[] = {0.1f,     1.0f / 3.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f,  -70000.0f,
                          6.1035156e-5f, 6.0e-5f, 5.9604645e-8f, 2.9802322e-8f, 2.99e-8f, 1e-8f,  -1e-8f,
                          2049.0f, 2051.0f, 1.00048828125f, 1.00146484375f, 0.0f, -0.0f};
  int shown = 0;
  for (float x : inputs) {
    const double ours = static_cast<double>(static_cast<float>(convert<f16>(x)));
    const double ref = reference_f16(x);
    const bool same = ours == ref && std::signbit(ours) == std::signbit(ref);
    if (!same && shown++ < 5) ADD_FAILURE() << "convert<f16>(" << x << "): reference " << ref << ", ours " << ours;
  }
  EXPECT_EQ(shown, 0);
  EXPECT_TRUE(std::isnan(static_cast<float>(convert<f16>(std::nanf("")))));
}

TEST(dtype_test, float_to_bf16_matches_the_separate_reference) {
  const float inputs[] = {0.1f,    1.0f / 3.0f, 1.00390625f, 1.01171875f, 3.3895314e38f, 3.40e38f,
                          -3.40e38f, 1e-40f,     257.0f,      259.0f,      -0.0f,         1.17549435e-38f};
  int shown = 0;
  for (float x : inputs) {
    const float ours = static_cast<float>(convert<bf16>(x));
    const float ref = reference_bf16(x);
    const bool same = ours == ref && std::signbit(ours) == std::signbit(ref);
    if (!same && shown++ < 5) ADD_FAILURE() << "convert<bf16>(" << x << "): reference " << ref << ", ours " << ours;
  }
  EXPECT_EQ(shown, 0);
  // Hand-checked anchors: 257 is the tie between 256 and 258 (spacing 2 in [256, 512)): the even 256.
  EXPECT_EQ(reference_bf16(257.0f), 256.0f);
  EXPECT_EQ(reference_bf16(259.0f), 260.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(convert<bf16>(std::nanf("")))));
}

TEST(dtype_test, widening_half_types_is_exact) {
  // f16 0x3555 = 1 + 0x155/1024 times 2^-2 = 0.333251953125; bf16 0x3EAB = (1 + 0x2B/128) * 2^-2.
  EXPECT_EQ(convert<double>(f16::from_bits(0x3555)), 0.333251953125);
  EXPECT_EQ(convert<double>(bf16::from_bits(0x3EAB)), (1.0 + 43.0 / 128.0) / 4.0);
  EXPECT_EQ(convert<float>(f16::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(convert<double>(f16::from_bits(0x7BFF)), 65504.0);
}

TEST(dtype_test, converting_to_the_same_type_is_the_identity) {
  EXPECT_EQ(convert<f16>(f16::from_bits(0x7E01)).bits, 0x7E01);  // even a NaN payload is kept
  EXPECT_EQ(convert<std::int64_t>(INT64_MIN), INT64_MIN);
  EXPECT_EQ(convert<double>(0.1), 0.1);
}

// ---- format_value -------------------------------------------------------------------------------

TEST(dtype_test, format_value_prints_the_shortest_text_that_round_trips_in_the_dtype) {
  // f16(0.1) = 1638 * 2^-14 = 0.0999755859375; "0.1" reads back to the same f16, so it is what prints.
  EXPECT_EQ(ampscope::format_value(0.0999755859375, DType::f16), "0.1");
  // f16(1/3) = 1365 * 2^-12 = 0.333251953125. "0.333" reads back as 1364 * 2^-12 (0.333 * 4096 =
  // 1363.97), "0.3333" as 1365 * 2^-12 (1365.20): four digits are needed.
  EXPECT_EQ(ampscope::format_value(0.333251953125, DType::f16), "0.3333");
  // Whole numbers print with a trailing point, as PyTorch does.
  EXPECT_EQ(ampscope::format_value(3.0, DType::f16), "3.");
  EXPECT_EQ(ampscope::format_value(65504.0, DType::f16), "65504.");
  EXPECT_EQ(ampscope::format_value(-0.0, DType::f16), "-0.");
  // f32(0.1) = 0.100000001490116...; the shortest float text is "0.1". As f64 the same double needs
  // all its digits.
  EXPECT_EQ(ampscope::format_value(static_cast<double>(0.1f), DType::f32), "0.1");
  EXPECT_EQ(ampscope::format_value(static_cast<double>(0.1f), DType::f64), "0.10000000149011612");
  EXPECT_EQ(ampscope::format_value(0.1, DType::f64), "0.1");
  // bf16(0.1) = 0x3DCD = 1.6015625 * 2^-4 = 0.10009765625; "0.1" reads back to it.
  EXPECT_EQ(ampscope::format_value(0.10009765625, DType::bf16), "0.1");
  EXPECT_EQ(ampscope::format_value(std::numeric_limits<double>::infinity(), DType::f16), "inf");
  EXPECT_EQ(ampscope::format_value(-std::numeric_limits<double>::infinity(), DType::bf16), "-inf");
  EXPECT_EQ(ampscope::format_value(std::nan(""), DType::f32), "nan");
  EXPECT_EQ(ampscope::format_value(42.0, DType::i64), "42");
  EXPECT_EQ(ampscope::format_value(1.0, DType::boolean), "true");
  EXPECT_EQ(ampscope::format_value(0.0, DType::boolean), "false");
}

}  // namespace
