// Every collective of the test program's process group (single, or MPI with 2 and 3 ranks) against values
// worked out independently: rank r contributes numbers whose sums and maxima over ranks have closed forms
// (exact in every dtype used), and the f16/bf16 sums are checked against a left fold over ranks whose
// every step is the exact sum rounded to nearest even by code written here from the formats' definitions
// (not core/float16.h).
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "tests/distributed/distributed_test_support.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::test_group;

// ---- reference formats: decode, encode and round, from the definitions ----

// An IEEE binary format with p significand bits (hidden bit included) and minimum normal exponent emin.
struct Format {
  int p;      // 11 for f16, 8 for bf16
  int emin;   // -14, -126
  int emax;   // 15, 127
  int ebits;  // 5, 8
};
constexpr Format kF16{11, -14, 15, 5};
constexpr Format kBF16{8, -126, 127, 8};

double decode(const Format& f, std::uint16_t bits) {
  const int mbits = f.p - 1;
  const bool negative = (bits >> 15) != 0;
  const int e = (bits >> mbits) & ((1 << f.ebits) - 1);
  const int m = bits & ((1 << mbits) - 1);
  double v;
  if (e == (1 << f.ebits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), f.emin - mbits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1 << mbits)), e - f.emax - mbits);
  }
  return negative ? -v : v;
}

// Rounds an exact value (a double holding it exactly) to the format, nearest, ties to even; overflow
// gives infinity. Returns the rounded value as a double.
double round_to(const Format& f, double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| = m 2^e, 0.5 <= m < 1: the leading bit is 2^(e - 1)
  const int lead = std::max(e - 1, f.emin);
  const double quantum = std::ldexp(1.0, lead - (f.p - 1));
  const double n = std::nearbyint(x / quantum);  // x / quantum is exact (a power of two); ties to even
  const double r = n * quantum;
  const double max = std::ldexp(std::ldexp(1.0, f.p) - 1, f.emax - (f.p - 1));
  if (std::fabs(r) > max) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

// The bits of a value the format holds exactly.
std::uint16_t encode(const Format& f, double v) {
  const int mbits = f.p - 1;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const std::uint16_t all_ones = static_cast<std::uint16_t>(((1 << f.ebits) - 1) << mbits);
  if (std::isinf(v)) return sign | all_ones;
  const double a = std::fabs(v);
  if (a == 0) return sign;
  int e = 0;
  std::frexp(a, &e);
  if (e - 1 < f.emin) {  // subnormal
    return sign | static_cast<std::uint16_t>(a / std::ldexp(1.0, f.emin - mbits));
  }
  const auto m = static_cast<std::uint16_t>(a / std::ldexp(1.0, e - 1 - mbits)) - (1 << mbits);
  return sign | static_cast<std::uint16_t>((e - 1 + f.emax) << mbits) | static_cast<std::uint16_t>(m);
}

// A reproducible 32-bit hash, the same on every rank.
std::uint32_t mix(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

Tensor from_bits(const std::vector<std::uint16_t>& bits, DType dtype) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(bits.size())}, {.dtype = dtype});
  std::memcpy(t.data(), bits.data(), bits.size() * 2);
  return t;
}

std::vector<std::uint16_t> bits_of(const Tensor& t) {
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(t.numel()));
  std::memcpy(bits.data(), t.data(), bits.size() * 2);
  return bits;
}

// Checks `result` (after an all_reduce sum over ranks) against the left fold of `contribution(r, i)` over
// ranks, each step rounded by round_to; prints the first few mismatches.
template <class Contribution>
void expect_rounded_left_fold(const Format& f, const Tensor& result, Contribution contribution) {
  const std::vector<std::uint16_t> got = bits_of(result);
  int mismatches = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double acc = decode(f, contribution(0, i));
    for (int r = 1; r < test_group().size(); ++r) acc = round_to(f, acc + decode(f, contribution(r, i)));
    const double value = decode(f, got[i]);
    const bool ok = std::isnan(acc) ? std::isnan(value) : got[i] == encode(f, acc);
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << "element " << i << ": expected " << acc << " (bits 0x" << std::hex << encode(f, acc)
                    << "), got " << value << " (bits 0x" << got[i] << std::dec << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// c_i: small multiples of 1/2, so every sum over up to 3 ranks is exact in every dtype (bf16 included).
double c(std::int64_t i) { return static_cast<double>(i % 7 + 1) * 0.5; }

class Collectives : public ::testing::TestWithParam<DType> {};

TEST_P(Collectives, all_reduce_sums_to_the_closed_form_across_pieces_and_uneven_shares) {
  ProcessGroup& g = test_group();
  const DType dtype = GetParam();
  const int n = g.size(), r = g.rank();
  // 2501 elements: 10 pieces of kTestSegmentBytes or more for every dtype, each split unevenly among ranks.
  const std::int64_t count = 2501;
  std::vector<double> mine(count);
  for (std::int64_t i = 0; i < count; ++i) mine[i] = (r + 1) * (dtype == DType::i64 ? 2 * c(i) : c(i));
  Tensor t = from_values(mine, {count}, {.dtype = dtype});
  g.all_reduce(t);
  const std::vector<double> got = t.values();
  int wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    // sum over r of (r + 1) c_i = c_i n (n + 1) / 2
    const double expected = (dtype == DType::i64 ? 2 * c(i) : c(i)) * n * (n + 1) / 2;
    if (got[i] != expected && ++wrong <= 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << expected;
  }
  EXPECT_EQ(wrong, 0);
}

TEST_P(Collectives, all_reduce_max_takes_the_largest_over_ranks) {
  ProcessGroup& g = test_group();
  const DType dtype = GetParam();
  const int n = g.size(), r = g.rank();
  const std::int64_t count = 1001;
  std::vector<double> mine(count);
  // Even elements grow with the rank (max: the last rank's), odd ones shrink (max: rank 0's).
  for (std::int64_t i = 0; i < count; ++i) mine[i] = (i % 2 == 0 ? 1 : -1) * (r + 1) * 2 * c(i);
  Tensor t = from_values(mine, {count}, {.dtype = dtype});
  g.all_reduce(t, ReduceOp::max);
  const std::vector<double> got = t.values();
  int wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double expected = i % 2 == 0 ? n * 2 * c(i) : -2 * c(i);
    if (got[i] != expected && ++wrong <= 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << expected;
  }
  EXPECT_EQ(wrong, 0);
}

TEST_P(Collectives, broadcast_copies_each_roots_tensor_to_every_rank) {
  ProcessGroup& g = test_group();
  const DType dtype = GetParam();
  const std::int64_t count = 1203;
  for (int root = 0; root < g.size(); ++root) {
    std::vector<double> mine(count);
    for (std::int64_t i = 0; i < count; ++i) mine[i] = g.rank() * 100 + i % 100;  // exact in bf16 up to 256
    if (dtype == DType::bf16) {
      for (std::int64_t i = 0; i < count; ++i) mine[i] = g.rank() * 64 + i % 64;
    }
    Tensor t = from_values(mine, {count}, {.dtype = dtype});
    g.broadcast(t, root);
    const std::vector<double> got = t.values();
    int wrong = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const double expected = dtype == DType::bf16 ? root * 64 + i % 64 : root * 100 + i % 100;
      if (got[i] != expected && ++wrong <= 5) ADD_FAILURE() << "root " << root << ", element " << i << ": " << got[i];
    }
    EXPECT_EQ(wrong, 0) << "root " << root;
  }
}

TEST_P(Collectives, all_gather_puts_rank_rs_input_in_part_r_concatenated_stacked_and_in_place) {
  ProcessGroup& g = test_group();
  const DType dtype = GetParam();
  const int n = g.size(), r = g.rank();
  const std::int64_t rows = 37, cols = 7;  // 259 elements: several pieces, not a multiple of anything
  auto value = [](int rank, std::int64_t i) { return static_cast<double>(rank * 8 + i % 8); };  // exact in bf16
  std::vector<double> mine(rows * cols);
  for (std::int64_t i = 0; i < rows * cols; ++i) mine[i] = value(r, i);
  const Tensor input = from_values(mine, {rows, cols}, {.dtype = dtype});

  auto expect_gathered = [&](const Tensor& out, const char* how) {
    const std::vector<double> got = out.values();
    int wrong = 0;
    for (int p = 0; p < n; ++p) {
      for (std::int64_t i = 0; i < rows * cols; ++i) {
        if (got[p * rows * cols + i] != value(p, i) && ++wrong <= 5) {
          ADD_FAILURE() << how << ": part " << p << ", element " << i << ": " << got[p * rows * cols + i];
        }
      }
    }
    EXPECT_EQ(wrong, 0) << how;
  };
  Tensor concatenated = zeros({n * rows, cols}, {.dtype = dtype});
  g.all_gather(concatenated, input);
  expect_gathered(concatenated, "concatenated");
  Tensor stacked = zeros({n, rows, cols}, {.dtype = dtype});
  g.all_gather(stacked, input);
  expect_gathered(stacked, "stacked");
  Tensor in_place = zeros({n, rows, cols}, {.dtype = dtype});
  Tensor part = in_place.slice(0, r, r + 1).view({rows, cols});
  part.copy_(input);
  g.all_gather(in_place, part);
  expect_gathered(in_place, "in place");
}

TEST_P(Collectives, reduce_scatter_gives_rank_j_the_sum_and_max_of_part_j) {
  ProcessGroup& g = test_group();
  const DType dtype = GetParam();
  const int n = g.size(), r = g.rank();
  const std::int64_t m = 301;
  // Rank r's element (j, i) of the input: (r + 1) d(j m + i), d(k) = 2 c(k) = k % 7 + 1 (integers, for i64);
  // part j's sum over ranks is d(j m + i) n (n + 1) / 2 and its max the last rank's, n d(j m + i).
  auto d = [](std::int64_t k) { return 2 * c(k); };
  std::vector<double> mine(n * m);
  for (std::int64_t k = 0; k < n * m; ++k) mine[k] = (r + 1) * d(k);
  const Tensor input = from_values(mine, {n * m}, {.dtype = dtype});
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    for (bool in_place : {false, true}) {
      Tensor in = input.clone();
      Tensor out = in_place ? in.slice(0, r * m, (r + 1) * m) : zeros({m}, {.dtype = dtype});
      g.reduce_scatter(out, in, op);
      const std::vector<double> got = out.values();
      int wrong = 0;
      for (std::int64_t i = 0; i < m; ++i) {
        const double base = d(r * m + i);
        const double expected = op == ReduceOp::sum ? base * n * (n + 1) / 2 : base * n;
        if (got[i] != expected && ++wrong <= 5) {
          ADD_FAILURE() << reduce_op_name(op) << (in_place ? " in place" : "") << ", element " << i << ": " << got[i]
                        << " != " << expected;
        }
      }
      EXPECT_EQ(wrong, 0) << reduce_op_name(op) << (in_place ? " in place" : "");
    }
  }
  // Stacked: input [n, m] for an output [m].
  Tensor stacked_out = zeros({m}, {.dtype = dtype});
  g.reduce_scatter(stacked_out, input.view({n, m}));
  EXPECT_EQ(stacked_out.values()[0], d(r * m) * n * (n + 1) / 2);
}

INSTANTIATE_TEST_SUITE_P(dtypes, Collectives,
                         ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// ---- f16 and bf16 sums: one rounding per addition, in rank order ----

TEST(f16_all_reduce, every_addition_is_rounded_once_to_nearest_even_in_rank_order) {
  ProcessGroup& g = test_group();
  // Rank 0 holds every f16 bit pattern twice. In the first half every other rank holds hashed patterns;
  // in the second half rank 1 holds half a unit in the last place of rank 0's value (with its sign), so
  // the sum is a tie between two f16 values (rounded to the even one) wherever that half unit is itself
  // an f16 number, and the other ranks hold hashed patterns again.
  constexpr std::size_t kPatterns = 65536;
  auto contribution = [](int rank, std::size_t i) -> std::uint16_t {
    const auto pattern = static_cast<std::uint16_t>(i % kPatterns);
    if (rank == 0) return pattern;
    if (rank == 1 && i >= kPatterns) {
      const double v = decode(kF16, pattern);
      if (!std::isfinite(v) || v == 0) return 0;
      int e = 0;
      std::frexp(v, &e);
      const double half_ulp = std::ldexp(1.0, std::max(e - 1, kF16.emin) - 10 - 1);
      if (half_ulp < std::ldexp(1.0, -24)) return 0;  // not an f16 number
      return encode(kF16, std::copysign(half_ulp, v));
    }
    return static_cast<std::uint16_t>(mix(static_cast<std::uint32_t>(i * 7919 + rank)) & 0xFFFF);
  };
  std::vector<std::uint16_t> mine(2 * kPatterns);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = contribution(g.rank(), i);
  Tensor t = from_bits(mine, DType::f16);
  g.all_reduce(t);
  expect_rounded_left_fold(kF16, t, contribution);
}

TEST(bf16_all_reduce, every_addition_is_rounded_once_to_nearest_even_in_rank_order) {
  ProcessGroup& g = test_group();
  // Exponents kept within [2^-20, 2^20] so that every intermediate sum of the reference is exact in double
  // (8-bit significands 40 binades apart fit in 53 bits); the overflow is checked by hand below.
  constexpr std::size_t kCount = 65536;
  auto value_bits = [](std::uint32_t h) -> std::uint16_t {
    const std::uint16_t sign = (h & 1) ? 0x8000 : 0;
    const std::uint16_t exponent = static_cast<std::uint16_t>(127 - 20 + (h >> 1) % 41);
    return sign | static_cast<std::uint16_t>(exponent << 7) | static_cast<std::uint16_t>((h >> 8) & 0x7F);
  };
  auto contribution = [&](int rank, std::size_t i) -> std::uint16_t {
    const std::uint32_t h0 = mix(static_cast<std::uint32_t>(i));
    if (rank == 1 && i >= kCount / 2) {  // a tie: half a unit in the last place of rank 0's value
      const double v = decode(kBF16, value_bits(h0));
      int e = 0;
      std::frexp(v, &e);
      return encode(kBF16, std::copysign(std::ldexp(1.0, e - 1 - 7 - 1), v));
    }
    return value_bits(rank == 0 ? h0 : mix(static_cast<std::uint32_t>(i * 31 + rank)));
  };
  std::vector<std::uint16_t> mine(kCount);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = contribution(g.rank(), i);
  Tensor t = from_bits(mine, DType::bf16);
  g.all_reduce(t);
  expect_rounded_left_fold(kBF16, t, contribution);
}

TEST(bf16_all_reduce, overflows_to_infinity_as_one_rounding_says) {
  ProcessGroup& g = test_group();
  if (g.size() < 2) GTEST_SKIP() << "one rank: nothing is added";
  // The largest bf16, 0x7F7F = (2 - 2^-7) 2^127, whose last mantissa bit is odd; its half unit is 2^119.
  // max + 2^119 is a tie between max and 2^128: to even, which is 2^128, beyond the range: +inf. max + 2^118
  // rounds down to max. Only ranks 0 and 1 contribute; the others add 0.
  std::vector<std::uint16_t> mine{0, 0, 0};
  if (g.rank() == 0) mine = {0x7F7F, 0x7F7F, 0x7F7F};
  if (g.rank() == 1) mine = {encode(kBF16, std::ldexp(1.0, 119)), encode(kBF16, std::ldexp(1.0, 118)), 0x7F7F};
  Tensor t = from_bits(mine, DType::bf16);
  g.all_reduce(t);
  const std::vector<std::uint16_t> got = bits_of(t);
  EXPECT_EQ(got[0], 0x7F80) << "max + 2^119";
  EXPECT_EQ(got[1], 0x7F7F) << "max + 2^118";
  EXPECT_EQ(got[2], 0x7F80) << "max + max";
}

TEST(f16_all_reduce, sums_in_rank_order_not_in_a_tree) {
  ProcessGroup& g = test_group();
  // Rank 0 holds 1, every other rank 2^-11 (half a unit in the last place of 1). In rank order each
  // addition is a tie that rounds back to 1 (even), so the sum is exactly 1 for any number of ranks; a
  // tree that first added two ranks' 2^-11 would give 1 + 2^-10.
  Tensor t = full({5}, g.rank() == 0 ? 1.0 : std::ldexp(1.0, -11), {.dtype = DType::f16});
  g.all_reduce(t);
  for (double v : t.values()) EXPECT_EQ(v, 1.0);
}

TEST(all_reduce, nan_and_inf_follow_ieee_and_max_keeps_the_nan) {
  ProcessGroup& g = test_group();
  const int n = g.size(), last = n - 1;
  const double inf = std::numeric_limits<double>::infinity();
  // Element 0: +inf on rank 0 only -> sum +inf. Element 1: +inf on rank 0, -inf on the last rank -> NaN
  // when there are two ranks or more. Element 2: NaN on the last rank -> NaN in sum and max.
  std::vector<double> mine{g.rank() == 0 ? inf : 1.0, g.rank() == 0 ? inf : (g.rank() == last ? -inf : 0.0),
                           g.rank() == last ? std::nan("") : 2.0};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    Tensor sum = from_values(mine, {3}, {.dtype = dtype});
    Tensor max = sum.clone();
    g.all_reduce(sum);
    g.all_reduce(max, ReduceOp::max);
    const std::vector<double> s = sum.values(), m = max.values();
    EXPECT_EQ(s[0], inf) << dtype_name(dtype);
    if (n >= 2) {
      EXPECT_TRUE(std::isnan(s[1])) << dtype_name(dtype) << ": " << s[1];
    }
    EXPECT_TRUE(std::isnan(s[2])) << dtype_name(dtype);
    EXPECT_EQ(m[0], inf) << dtype_name(dtype);
    EXPECT_TRUE(std::isnan(m[2])) << dtype_name(dtype) << ": " << m[2];
  }
}

TEST(all_reduce, max_compares_f64_and_i64_at_their_own_precision) {
  ProcessGroup& g = test_group();
  // Rank r: 1 + r 2^-40 (equal once rounded to float), and 10^300 r (beyond float's range), and 2^60 + r
  // (equal once rounded to double): the max is the last rank's in each.
  const int last = g.size() - 1;
  Tensor d = from_values({1 + g.rank() * std::ldexp(1.0, -40), 1e300 * g.rank()}, {2}, {.dtype = DType::f64});
  g.all_reduce(d, ReduceOp::max);
  EXPECT_EQ(d.values()[0], 1 + last * std::ldexp(1.0, -40));
  EXPECT_EQ(d.values()[1], 1e300 * last);
  Tensor i = Tensor::empty({1}, {.dtype = DType::i64});
  i.data_as<std::int64_t>()[0] = (std::int64_t{1} << 60) + g.rank();
  g.all_reduce(i, ReduceOp::max);
  EXPECT_EQ(i.data_as<std::int64_t>()[0], (std::int64_t{1} << 60) + last);
}

TEST(all_reduce, i64_sums_exactly_beyond_double_precision) {
  ProcessGroup& g = test_group();
  // 2^53 + rank: a sum no double holds exactly, so the values cannot have gone through floating point.
  const std::int64_t base = std::int64_t{1} << 53;
  Tensor t = Tensor::empty({2}, {.dtype = DType::i64});
  t.data_as<std::int64_t>()[0] = base + g.rank();
  t.data_as<std::int64_t>()[1] = -base - 1;
  g.all_reduce(t);
  const std::int64_t n = g.size();
  EXPECT_EQ(t.data_as<std::int64_t>()[0], n * base + n * (n - 1) / 2);
  EXPECT_EQ(t.data_as<std::int64_t>()[1], n * (-base - 1));
}

TEST(all_reduce, a_contiguous_view_with_an_offset_reduces_only_its_elements) {
  ProcessGroup& g = test_group();
  Tensor whole = full({4, 3}, 1.0);
  Tensor row = whole.slice(0, 2, 3);  // contiguous, offset 6
  g.all_reduce(row);
  const std::vector<double> v = whole.values();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(v[i], i / 3 == 2 ? g.size() : 1.0) << i;
  Tensor empty = zeros({0, 3});
  g.all_reduce(empty);  // every rank calls; nothing to send
  EXPECT_EQ(empty.numel(), 0);
}

// ---- host-side collectives ----

TEST(barrier, returns_only_after_every_rank_reached_it) {
  ProcessGroup& g = test_group();
  // Rank 0 arrives 300 ms late; no other rank can leave the barrier before rank 0 entered it.
  const auto start = std::chrono::steady_clock::now();
  if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  g.barrier();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.25) << "rank " << g.rank();
}

TEST(all_gather_bytes, gives_every_ranks_bytes_in_rank_order_whatever_their_lengths) {
  ProcessGroup& g = test_group();
  // Rank r's bytes: r copies of "ab\0" (rank 0's are empty; the NUL is data, not an end).
  auto bytes_of = [](int r) {
    std::string s;
    for (int k = 0; k < r; ++k) s += std::string("ab\0", 3);
    return s;
  };
  const std::vector<std::string> all = g.all_gather_bytes(bytes_of(g.rank()));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(g.size()));
  for (int r = 0; r < g.size(); ++r) EXPECT_EQ(all[r], bytes_of(r)) << "rank " << r;
}

TEST(broadcast_bytes, gives_every_rank_the_roots_bytes) {
  ProcessGroup& g = test_group();
  const int root = g.size() - 1;
  const std::string got = g.broadcast_bytes(g.rank() == root ? std::string("config\0hash", 11) : "ignored", root);
  EXPECT_EQ(got, std::string("config\0hash", 11));
  EXPECT_THROW_MSG(g.broadcast_bytes("x", g.size()), IndexError, "broadcast_bytes", g.describe(),
                   std::to_string(g.size()));
}

// ---- errors: thrown on the calling rank, before anything is sent ----

TEST(process_group_errors, name_the_op_the_group_and_the_tensor) {
  ProcessGroup& g = test_group();
  const std::string who = g.describe();
  Tensor m = zeros({3, 4});
  EXPECT_THROW_MSG(g.all_reduce(m.transpose(0, 1)), ShapeError, "all_reduce", who, "[4, 3] f32 on cpu",
                   "not contiguous", "hint:");
  EXPECT_THROW_MSG(g.all_reduce(zeros({2}, {.dtype = DType::boolean})), DTypeError, "all_reduce", who, "[2] bool",
                   "hint:");
  EXPECT_THROW_MSG(g.all_reduce(Tensor()), Error, "all_reduce", who, "undefined");
  EXPECT_THROW_MSG(g.broadcast(m, -1), IndexError, "broadcast", who, "root -1", "[3, 4] f32");
  EXPECT_THROW_MSG(g.broadcast(m, g.size()), IndexError, "broadcast", who, "root " + std::to_string(g.size()));
  EXPECT_THROW_MSG(g.all_gather(zeros({5, 4}), m), ShapeError, "all_gather", who, "[5, 4] f32",
                   "[" + std::to_string(3 * g.size()) + ", 4] (concatenated)");
  EXPECT_THROW_MSG(g.all_gather(zeros({3 * g.size(), 4}, {.dtype = DType::f16}), m), DTypeError, "all_gather", who,
                   "f16", "f32");
  EXPECT_THROW_MSG(g.reduce_scatter(zeros({4}), zeros({3 * g.size()})), ShapeError, "reduce_scatter", who,
                   "[" + std::to_string(3 * g.size()) + "] f32", "[4]");
  if (g.size() > 1) {
    // The output overlapping the input elsewhere than in its own part.
    Tensor whole = zeros({g.size() * 4});
    const int other = (g.rank() + 1) % g.size();
    EXPECT_THROW_MSG(g.reduce_scatter(whole.slice(0, other * 4, other * 4 + 4), whole), ShapeError, "reduce_scatter",
                     who, "overlaps");
  }
}

}  // namespace
}  // namespace ampscope
