// tests/probes/stats_test.cpp: the probe's tensor statistics (probes/stats.h) against values worked out
// by hand: exact counts of NaN, +-inf, zeros and subnormals in each dtype's own terms, moments of the
// finite values in double, exponent histogram bins, and cast overflow/underflow counts.
//
// Expected moments are written as the formula over the finite values, evaluated in double; the values
// are chosen so that every one is exact in its dtype (or its rounding is given by the independent
// reference roundings of tests/test_support.h).
#include "probes/stats.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using probe::histogram_bin;
using probe::kInfBin;
using probe::kNanBin;
using probe::kSubnormalBin;
using probe::kZeroBin;
using probe::tensor_stats;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The bin of binary exponent e (floor(log2 |v|) = e).
int bin_of_exponent(int e) { return e - trace::kHistMinExponent; }

TEST(stats_test, counts_and_moments_of_an_f32_tensor_with_every_kind_of_value) {
  const double tiny = std::ldexp(1.0, -130);  // subnormal in f32 (below 2^-126), exact
  const Tensor t = from_values({1.5, -2.0, 0.0, -0.0, kNaN, kInf, -kInf, tiny, 3.0}, {9});
  const trace::TensorHealth h = tensor_stats(t).health;
  EXPECT_EQ(h.numel, 9);
  EXPECT_EQ(h.nan, 1);
  EXPECT_EQ(h.pos_inf, 1);
  EXPECT_EQ(h.neg_inf, 1);
  EXPECT_EQ(h.zero, 2) << "+0 and -0";
  EXPECT_EQ(h.subnormal, 1);
  // Finite values: 1.5, -2, 0, -0, 2^-130, 3.
  EXPECT_EQ(h.min, -2.0);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_EQ(h.absmax, 3.0);
  EXPECT_DOUBLE_EQ(h.mean, (1.5 - 2.0 + 0.0 + 0.0 + tiny + 3.0) / 6.0);
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt((2.25 + 4.0 + tiny * tiny + 9.0) / 6.0));
}

TEST(stats_test, f16_subnormals_start_below_two_to_the_minus_14) {
  const double sub = std::ldexp(1.0, -20);         // f16 subnormal, exact
  const double min_normal = std::ldexp(1.0, -14);  // the smallest normal f16: not subnormal
  // 70000 and -1e5 overflow to +-inf when rounded to f16; 0.1 rounds to the nearest f16.
  const Tensor t = from_values({1.0, sub, min_normal, 0.0, 70000.0, -1e5, kNaN, 0.1}, {2, 4}, {.dtype = DType::f16});
  const trace::TensorHealth h = tensor_stats(t).health;
  EXPECT_EQ(h.numel, 8);
  EXPECT_EQ(h.nan, 1);
  EXPECT_EQ(h.pos_inf, 1);
  EXPECT_EQ(h.neg_inf, 1);
  EXPECT_EQ(h.zero, 1);
  EXPECT_EQ(h.subnormal, 1);
  const double tenth = testing::reference_f16(0.1f);  // 0.0999755859375
  EXPECT_EQ(h.min, 0.0);
  EXPECT_EQ(h.max, 1.0);
  EXPECT_EQ(h.absmax, 1.0);
  EXPECT_DOUBLE_EQ(h.mean, (1.0 + sub + min_normal + 0.0 + tenth) / 5.0);
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt((1.0 + sub * sub + min_normal * min_normal + tenth * tenth) / 5.0));
}

TEST(stats_test, bf16_subnormals_start_below_two_to_the_minus_126) {
  const double sub = std::ldexp(1.0, -127);  // a bf16 subnormal, exact
  const double third = testing::reference_bf16(static_cast<float>(1.0 / 3.0));
  // 1e39 is beyond f32's range: f64 -> f32 already gives +inf.
  const Tensor t = from_values({sub, 1e39, 3.0, -0.0, 1.0 / 3.0, -kInf}, {6}, {.dtype = DType::bf16});
  const trace::TensorHealth h = tensor_stats(t).health;
  EXPECT_EQ(h.nan, 0);
  EXPECT_EQ(h.pos_inf, 1);
  EXPECT_EQ(h.neg_inf, 1);
  EXPECT_EQ(h.zero, 1);
  EXPECT_EQ(h.subnormal, 1);
  EXPECT_EQ(h.min, -0.0);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_DOUBLE_EQ(h.mean, (sub + 3.0 + 0.0 + third) / 4.0);
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt((sub * sub + 9.0 + third * third) / 4.0));
}

TEST(stats_test, f32_values_between_f16_and_f32_subnormal_range_are_normal_in_f32) {
  // 2^-20 is subnormal as an f16 but a normal f32: subnormal is judged in the tensor's own dtype.
  const Tensor t = from_values({std::ldexp(1.0, -20), std::ldexp(1.0, -126), std::ldexp(1.0, -149)}, {3});
  EXPECT_EQ(tensor_stats(t).health.subnormal, 1) << "only 2^-149 is subnormal in f32";
}

TEST(stats_test, integer_tensors_have_moments_and_zeros_but_no_special_values) {
  const Tensor t = from_values({0, 3, -5}, {3}, {.dtype = DType::i64});
  const trace::TensorHealth h = tensor_stats(t).health;
  EXPECT_EQ(h.zero, 1);
  EXPECT_EQ(h.nan + h.pos_inf + h.neg_inf + h.subnormal, 0);
  EXPECT_EQ(h.min, -5.0);
  EXPECT_EQ(h.max, 3.0);
  EXPECT_EQ(h.absmax, 5.0);
  EXPECT_DOUBLE_EQ(h.mean, -2.0 / 3.0);
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt(34.0 / 3.0));
}

TEST(stats_test, a_tensor_without_finite_values_has_nan_moments) {
  for (const Tensor& t : {from_values({kNaN, kInf}, {2}), Tensor::empty({0}), Tensor()}) {
    const trace::TensorHealth h = tensor_stats(t).health;
    EXPECT_TRUE(std::isnan(h.min) && std::isnan(h.max) && std::isnan(h.absmax) && std::isnan(h.mean) &&
                std::isnan(h.rms));
  }
  EXPECT_EQ(tensor_stats(Tensor::empty({0})).health.numel, 0);
}

TEST(stats_test, views_are_read_through_their_strides) {
  const Tensor x = from_values({1, 2, 3, 4, 5, 6}, {2, 3});
  const trace::TensorHealth t = tensor_stats(x.transpose(0, 1)).health;
  EXPECT_EQ(t.numel, 6);
  EXPECT_DOUBLE_EQ(t.mean, 3.5);
  EXPECT_DOUBLE_EQ(t.rms, std::sqrt(91.0 / 6.0));
  // Columns 0 and 2: 1, 3, 4, 6.
  const trace::TensorHealth s = tensor_stats(x.slice(1, 0, 3, 2)).health;
  EXPECT_EQ(s.numel, 4);
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.max, 6.0);
  EXPECT_DOUBLE_EQ(s.mean, 14.0 / 4.0);
  // A broadcast view counts each element as often as it appears.
  const trace::TensorHealth b = tensor_stats(from_values({0, 2}, {2, 1}).expand({2, 5})).health;
  EXPECT_EQ(b.numel, 10);
  EXPECT_EQ(b.zero, 5);
  EXPECT_DOUBLE_EQ(b.mean, 1.0);
}

TEST(stats_test, large_tensors_split_over_threads_give_exact_counts) {
  // v_i = (i mod 4) - 1: -1, 0, 1, 2 repeated 25000 times; element 5 (a 0) becomes NaN and element
  // 99999 (a 2) becomes +inf.
  const std::int64_t n = 100000;
  std::vector<double> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>(i % 4) - 1.0;
  v[5] = kNaN;
  v[99999] = kInf;
  const probe::TensorStats s = tensor_stats(from_values(v, {n / 100, 100}), /*with_histogram=*/true);
  const trace::TensorHealth& h = s.health;
  EXPECT_EQ(h.nan, 1);
  EXPECT_EQ(h.pos_inf, 1);
  EXPECT_EQ(h.zero, 24999);
  EXPECT_DOUBLE_EQ(h.mean, (25000.0 * 2.0 - 2.0) / (n - 2));
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt((25000.0 * 6.0 - 4.0) / (n - 2)));
  EXPECT_EQ(s.sum_sq, 25000.0 * 6.0 - 4.0);
  EXPECT_EQ(s.histogram[bin_of_exponent(0)], 50000) << "the -1s and 1s";
  EXPECT_EQ(s.histogram[bin_of_exponent(1)], 24999) << "the 2s";
  EXPECT_EQ(s.histogram[kZeroBin], 24999);
  EXPECT_EQ(s.histogram[kNanBin], 1);
  EXPECT_EQ(s.histogram[kInfBin], 1);
}

// A plain reference for the vectorised path: the tensor's values (core's own widening to double) classified
// one by one with <cmath>, moments summed in order. Counts and extremes must match exactly; the sums
// may differ by the order of additions only.
void expect_matches_reference(const Tensor& t, double min_normal) {
  const std::vector<double> v = t.values();
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0, finite = 0;
  double mn = kInf, mx = -kInf, absmax = 0, sum = 0, sum_sq = 0;
  for (double x : v) {
    if (std::isnan(x)) {
      ++nan;
    } else if (std::isinf(x)) {
      ++(x > 0 ? pos_inf : neg_inf);
    } else {
      ++finite;
      zero += x == 0;
      subnormal += x != 0 && std::fabs(x) < min_normal;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
      absmax = std::max(absmax, std::fabs(x));
      sum += x;
      sum_sq += x * x;
    }
  }
  const trace::TensorHealth h = tensor_stats(t).health;
  EXPECT_EQ(h.numel, static_cast<std::int64_t>(v.size()));
  EXPECT_EQ(h.nan, nan);
  EXPECT_EQ(h.pos_inf, pos_inf);
  EXPECT_EQ(h.neg_inf, neg_inf);
  EXPECT_EQ(h.zero, zero);
  EXPECT_EQ(h.subnormal, subnormal);
  EXPECT_GT(subnormal, 0) << "the pattern must reach the subnormal range";
  EXPECT_EQ(h.min, mn);
  EXPECT_EQ(h.max, mx);
  EXPECT_EQ(h.absmax, absmax);
  EXPECT_NEAR(h.mean, sum / finite, 1e-12 * std::fabs(sum / finite));
  EXPECT_NEAR(h.rms, std::sqrt(sum_sq / finite), 1e-12 * std::sqrt(sum_sq / finite));
}

// 1000 values (three full blocks of the vectorised loop and a tail), multipliers -3 .. 3 (zeros among
// them) times powers of two from `lowest` up `span` exponents; optionally NaN in the second block and
// -inf in the tail.
Tensor pattern(DType dtype, int lowest, int span, bool with_special) {
  std::vector<double> v(1000);
  for (int i = 0; i < 1000; ++i) v[static_cast<std::size_t>(i)] = (i % 7 - 3) * std::ldexp(1.0, i % span + lowest);
  if (with_special) {
    v[300] = kNaN;
    v[990] = -kInf;
  }
  return from_values(v, {1000}, {.dtype = dtype});
}

TEST(stats_test, the_vectorised_path_matches_a_plain_reference_in_each_dtype) {
  for (bool special : {false, true}) {
    SCOPED_TRACE(special ? "with NaN and -inf" : "finite");
    {
      SCOPED_TRACE("f32");
      expect_matches_reference(pattern(DType::f32, -140, 250, special), std::ldexp(1.0, -126));
    }
    {
      SCOPED_TRACE("f16");
      expect_matches_reference(pattern(DType::f16, -24, 35, special), std::ldexp(1.0, -14));
    }
    {
      SCOPED_TRACE("bf16");
      expect_matches_reference(pattern(DType::bf16, -133, 250, special), std::ldexp(1.0, -126));
    }
  }
}

TEST(stats_test, the_vectorised_path_reads_negative_zero_and_f16_extremes) {
  std::vector<double> v(512, -0.0);
  v[7] = 65504;
  v[300] = -65504;
  v[301] = std::ldexp(1.0, -24);   // the smallest f16 subnormal
  v[302] = -std::ldexp(1.0, -14);  // the smallest normal
  const trace::TensorHealth h = tensor_stats(from_values(v, {512}, {.dtype = DType::f16})).health;
  EXPECT_EQ(h.zero, 508);
  EXPECT_EQ(h.subnormal, 1);
  EXPECT_EQ(h.min, -65504.0);
  EXPECT_EQ(h.max, 65504.0);
  EXPECT_EQ(h.absmax, 65504.0);
  EXPECT_DOUBLE_EQ(h.mean, (std::ldexp(1.0, -24) - std::ldexp(1.0, -14)) / 512);
}

// Random tensors of every floating dtype with every kind of value (normal values of many magnitudes, +-0,
// subnormals of the dtype, the dtype's largest values, NaN, +-inf; some tensors without NaN/inf, so that
// whole blocks take the vectorised path), contiguous and as views, against a reference computed here from
// the tensor's values (core's widening to double) in long double: counts, min, max and absmax exactly;
// the sums within the bound of docs/numerics.md for any order of the additions (|error| <= n 2^-53 sum |v|,
// the same bound the CUDA statistics kernel states), mean and rms within one more rounding.
struct Reference {
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0, finite = 0;
  double min = kInf, max = -kInf, absmax = 0;
  long double sum = 0, sum_abs = 0, sum_sq = 0;
};

Reference reference_of(const std::vector<double>& v, double min_normal) {
  Reference r;
  for (double x : v) {
    if (std::isnan(x)) {
      ++r.nan;
    } else if (std::isinf(x)) {
      ++(x > 0 ? r.pos_inf : r.neg_inf);
    } else {
      ++r.finite;
      r.zero += x == 0;
      r.subnormal += x != 0 && std::fabs(x) < min_normal;
      r.min = std::min(r.min, x);
      r.max = std::max(r.max, x);
      r.absmax = std::max(r.absmax, std::fabs(x));
      r.sum += x;
      r.sum_abs += std::fabs(x);
      r.sum_sq += static_cast<long double>(x) * x;
    }
  }
  return r;
}

void expect_within_bound(const Tensor& t) {
  const Reference r = reference_of(t.values(), probe::smallest_normal(t.dtype()));
  const probe::TensorStats s = tensor_stats(t);
  const trace::TensorHealth& h = s.health;
  EXPECT_EQ(h.numel, t.numel());
  EXPECT_EQ(h.nan, r.nan);
  EXPECT_EQ(h.pos_inf, r.pos_inf);
  EXPECT_EQ(h.neg_inf, r.neg_inf);
  EXPECT_EQ(h.zero, r.zero);
  EXPECT_EQ(h.subnormal, r.subnormal);
  if (r.finite == 0) {
    EXPECT_TRUE(std::isnan(h.mean));
    return;
  }
  EXPECT_EQ(h.min, r.min);
  EXPECT_EQ(h.max, r.max);
  EXPECT_EQ(h.absmax, r.absmax);
  const long double u = std::ldexp(1.0L, -53), n = static_cast<long double>(t.numel());
  const long double finite = static_cast<long double>(r.finite);
  const long double sum_bound = n * u * r.sum_abs, sq_bound = n * u * r.sum_sq;
  EXPECT_LE(std::fabs(static_cast<long double>(s.sum_sq) - r.sum_sq), sq_bound);
  const long double mean = r.sum / finite;
  EXPECT_LE(std::fabs(static_cast<long double>(h.mean) - mean), sum_bound / finite + 2 * u * std::fabs(mean))
      << "mean " << h.mean << ", reference " << static_cast<double>(mean);
  const long double rms = std::sqrt(r.sum_sq / finite);
  if (rms == 0) {
    EXPECT_EQ(h.rms, 0.0) << "only zeros: every square is 0 exactly";
    return;
  }
  EXPECT_LE(std::fabs(static_cast<long double>(h.rms) - rms), (sq_bound / finite) / (2 * rms) + 4 * u * rms)
      << "rms " << h.rms << ", reference " << static_cast<double>(rms);
}

// n values; `specials`: the share (per 1000) of NaN and +-inf among them.
std::vector<double> random_values(std::mt19937_64& gen, std::size_t n, DType dtype, int specials) {
  const double min_normal = probe::smallest_normal(dtype);
  const double largest = dtype == DType::f16 ? 65504.0 : static_cast<double>(std::numeric_limits<float>::max());
  std::uniform_int_distribution<int> kind(0, 999), exponent(-20, 20);
  std::uniform_real_distribution<double> unit(-1, 1), fraction(0.01, 0.99);
  std::vector<double> v(n);
  for (double& x : v) {
    const int k = kind(gen);
    if (k < specials) {
      x = k % 3 == 0 ? kNaN : k % 3 == 1 ? kInf : -kInf;
    } else if (k < 150) {
      x = k % 2 == 0 ? 0.0 : -0.0;
    } else if (k < 200) {
      x = (k % 2 == 0 ? 1 : -1) * fraction(gen) * min_normal;  // subnormal in the dtype (or its zero)
    } else if (k < 215) {
      x = (k % 2 == 0 ? 1 : -1) * largest * (1 - fraction(gen) / 64);  // huge: near the largest finite value
    } else {
      x = unit(gen) * std::ldexp(1.0, exponent(gen));
    }
  }
  return v;
}

TEST(stats_test, random_tensors_with_special_values_match_a_long_double_reference_in_each_dtype) {
  std::mt19937_64 gen(20261129);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    // Sizes: a tail only, one block, blocks and a tail, and sizes cut into 2 and 9 chunks over threads.
    for (std::int64_t n : {1, 255, 256, 1000, 4099, 70000, 300001}) {
      for (int specials : {0, 1, 30}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << ", NaN/inf per 1000: " << specials);
        const Tensor t = from_values(random_values(gen, static_cast<std::size_t>(n), dtype, specials), {n},
                                     {.dtype = dtype});
        expect_within_bound(t);
      }
    }
    // Views: a transpose (elements apart) and heads split by a permute (the last dimension adjacent).
    const Tensor m = from_values(random_values(gen, 300 * 257, dtype, 1), {300, 257}, {.dtype = dtype});
    expect_within_bound(m.transpose(0, 1));
    const Tensor q = from_values(random_values(gen, 4 * 64 * 4 * 32, dtype, 0), {4, 64, 4, 32}, {.dtype = dtype});
    expect_within_bound(q.permute({0, 2, 1, 3}));
  }
}

// The order in which tensor_stats adds (stats.cpp), written out here one value at a time in scalar double code, so
// that every build of the loop (baseline, AVX2, AVX-512: probes/stats.h StatsLoop) can be held to the same bits,
// not only to a bound. The values are split into chunks (one below 32768 values, else n / 32768 of them, 2 to 16); a chunk of a
// contiguous tensor is one run, a chunk of a view is gathered in runs of 4096 values. A run is read in blocks of 256:
// a block adds value 8t + k to lane k (k = 0..7, t in order) from zero, squares by one rounding each, NaN and inf
// counted and skipped; the block then adds lanes k + (k + 4) of each into four running sums (a block of NaN and inf
// only adds nothing); the run's last count % 256 values are added one by one into a sum of their own that starts at
// zero and goes into the chunk's total when done. Min and max: the first of equal values wins within a lane (x < m ? x : m), then the
// lanes combine as the loop combines them, so the sign of a zero minimum is fixed too.
struct Ordered {
  std::int64_t nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0;
  double min = kInf, max = -kInf, absmax = 0, sum = 0, sum_sq = 0;
};

// A NaN or an inf counted (true), or a finite value left to the caller (false).
bool counted_non_finite(double x, Ordered& a) {
  if (std::isnan(x)) {
    ++a.nan;
    return true;
  }
  if (std::isinf(x)) {
    ++(x > 0 ? a.pos_inf : a.neg_inf);
    return true;
  }
  return false;
}

// The loop's scalar path over values v[0, n) (accumulate_run).
void ordered_run(const double* v, std::size_t n, double min_normal, Ordered& a) {
  double sum = 0, sum_sq = 0, mn = a.min, mx = a.max, amax = a.absmax;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = v[i];
    if (counted_non_finite(x, a)) continue;
    sum += x;
    sum_sq += x * x;
    mn = x < mn ? x : mn;
    mx = x > mx ? x : mx;
    amax = std::fabs(x) > amax ? std::fabs(x) : amax;
    a.zero += x == 0;
    a.subnormal += x != 0 && std::fabs(x) < min_normal;
  }
  a.sum += sum;
  a.sum_sq += sum_sq;
  a.min = mn;
  a.max = mx;
  a.absmax = amax;
}

// One call of the vector loop over v[0, n).
void ordered_call(const double* v, std::size_t n, double min_normal, Ordered& a) {
  constexpr std::size_t kBlock = 256;
  double sum[4] = {0, 0, 0, 0}, sq[4] = {0, 0, 0, 0};
  float mn[4] = {INFINITY, INFINITY, INFINITY, INFINITY}, mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  bool any_fast = false;
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const double* b = v + i;
    // NaN and inf are counted and skipped; a block of nothing else adds nothing to the lanes.
    bool any_finite = false;
    double s[8] = {}, q[8] = {};
    float bmn[8], bmx[8];
    std::fill(bmn, bmn + 8, INFINITY);
    std::fill(bmx, bmx + 8, -INFINITY);
    for (std::size_t t = 0; t < kBlock / 8; ++t) {
      for (std::size_t k = 0; k < 8; ++k) {
        const double x = b[8 * t + k];
        if (counted_non_finite(x, a)) continue;
        any_finite = true;
        const auto f = static_cast<float>(x);  // exact: every value came from f32, f16 or bf16
        s[k] += x;
        q[k] += x * x;  // the square is exact in double: one rounding, as the FMA
        bmn[k] = f < bmn[k] ? f : bmn[k];
        bmx[k] = f > bmx[k] ? f : bmx[k];
        a.zero += x == 0;
        a.subnormal += x != 0 && std::fabs(x) < min_normal;
      }
    }
    if (!any_finite) continue;
    any_fast = true;
    for (std::size_t k = 0; k < 4; ++k) {
      sum[k] += s[k] + s[k + 4];
      sq[k] += q[k] + q[k + 4];
      const float cmn = bmn[k] < bmn[k + 4] ? bmn[k] : bmn[k + 4];
      const float cmx = bmx[k] > bmx[k + 4] ? bmx[k] : bmx[k + 4];
      mn[k] = cmn < mn[k] ? cmn : mn[k];
      mx[k] = cmx > mx[k] ? cmx : mx[k];
    }
  }
  if (any_fast) {
    const double lo = std::min(std::min<double>(mn[0], mn[1]), std::min<double>(mn[2], mn[3]));
    const double hi = std::max(std::max<double>(mx[0], mx[1]), std::max<double>(mx[2], mx[3]));
    a.sum += (sum[0] + sum[1]) + (sum[2] + sum[3]);
    a.sum_sq += (sq[0] + sq[1]) + (sq[2] + sq[3]);
    a.min = std::min(a.min, lo);
    a.max = std::max(a.max, hi);
    a.absmax = std::max({a.absmax, std::fabs(lo), std::fabs(hi)});
  }
  ordered_run(v + i, n - i, min_normal, a);
}

// The values in the order tensor_stats reads them, and whether that is one contiguous run: a view whose elements
// fill a block of memory without gaps or overlaps (a transpose or permute of a contiguous tensor) in memory order,
// any other view in its own row-major order. Worked out here from each element's place in the storage, not by the
// code under test.
std::vector<double> values_as_read(const Tensor& t, bool& contiguous_run) {
  std::vector<double> v = t.values();  // row-major
  const auto n = static_cast<std::int64_t>(v.size());
  std::vector<std::int64_t> place(v.size());
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t rest = i, offset = 0;
    for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
      offset += rest % t.size(d) * t.strides()[static_cast<std::size_t>(d)];
      rest /= t.size(d);
    }
    place[static_cast<std::size_t>(i)] = offset;
  }
  std::vector<std::size_t> by_place(v.size());
  for (std::size_t i = 0; i < by_place.size(); ++i) by_place[i] = i;
  std::sort(by_place.begin(), by_place.end(), [&](std::size_t a, std::size_t b) { return place[a] < place[b]; });
  bool dense = true;
  for (std::size_t k = 0; k < by_place.size(); ++k) dense = dense && place[by_place[k]] == place[by_place[0]] + static_cast<std::int64_t>(k);
  contiguous_run = dense;
  if (!dense) return v;
  std::vector<double> in_memory(v.size());
  for (std::size_t k = 0; k < by_place.size(); ++k) in_memory[k] = v[by_place[k]];
  return in_memory;
}

// The whole tensor, chunk by chunk, as tensor_stats reports it.
trace::TensorHealth ordered_health(const Tensor& t, double& sum_sq) {
  bool contiguous_run = false;
  const std::vector<double> v = values_as_read(t, contiguous_run);
  const auto n = static_cast<std::int64_t>(v.size());
  const double min_normal = probe::smallest_normal(t.dtype());
  const std::int64_t chunks = n < 32768 ? 1 : std::clamp<std::int64_t>(n / 32768, 2, 16);
  Ordered total;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    Ordered a;
    const std::int64_t run = contiguous_run ? end - begin : 4096;
    for (std::int64_t r = begin; r < end; r += run)
      ordered_call(v.data() + r, static_cast<std::size_t>(std::min(run, end - r)), min_normal, a);
    total.nan += a.nan;
    total.pos_inf += a.pos_inf;
    total.neg_inf += a.neg_inf;
    total.zero += a.zero;
    total.subnormal += a.subnormal;
    total.min = std::min(total.min, a.min);
    total.max = std::max(total.max, a.max);
    total.absmax = std::max(total.absmax, a.absmax);
    total.sum += a.sum;
    total.sum_sq += a.sum_sq;
  }
  trace::TensorHealth h;
  h.numel = n;
  h.nan = total.nan;
  h.pos_inf = total.pos_inf;
  h.neg_inf = total.neg_inf;
  h.zero = total.zero;
  h.subnormal = total.subnormal;
  const std::int64_t finite = n - total.nan - total.pos_inf - total.neg_inf;
  h.min = h.max = h.absmax = h.mean = h.rms = kNaN;
  if (finite > 0) {
    h.min = total.min;
    h.max = total.max;
    h.absmax = total.absmax;
    h.mean = total.sum / static_cast<double>(finite);
    h.rms = std::sqrt(total.sum_sq / static_cast<double>(finite));
  }
  sum_sq = total.sum_sq;
  return h;
}

std::uint64_t bits_of(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Every field of two results the same bits (NaN as NaN), the histogram's bins included.
void expect_same_stats(const probe::TensorStats& got, const probe::TensorStats& want, const std::string& what) {
  SCOPED_TRACE(what);
  const trace::TensorHealth &h = got.health, &w = want.health;
  EXPECT_EQ(h.numel, w.numel);
  EXPECT_EQ(h.nan, w.nan);
  EXPECT_EQ(h.pos_inf, w.pos_inf);
  EXPECT_EQ(h.neg_inf, w.neg_inf);
  EXPECT_EQ(h.zero, w.zero);
  EXPECT_EQ(h.subnormal, w.subnormal);
  const std::pair<const char*, std::pair<double, double>> fields[] = {
      {"min", {h.min, w.min}},    {"max", {h.max, w.max}}, {"absmax", {h.absmax, w.absmax}},
      {"mean", {h.mean, w.mean}}, {"rms", {h.rms, w.rms}}, {"sum_sq", {got.sum_sq, want.sum_sq}}};
  for (const auto& [name, pair] : fields) {
    if (std::isnan(pair.second)) {
      EXPECT_TRUE(std::isnan(pair.first)) << name;
    } else {
      EXPECT_EQ(bits_of(pair.first), bits_of(pair.second)) << name << ": " << pair.first << " and " << pair.second;
    }
  }
  EXPECT_EQ(got.histogram, want.histogram);
}

// Every field the same bits (NaN as NaN), the sign of a zero included.
void expect_same_bits(const Tensor& t) {
  probe::TensorStats want;  // the ordered sums' result; no histogram (all zero, as tensor_stats leaves it)
  want.health = ordered_health(t, want.sum_sq);
  expect_same_stats(tensor_stats(t), want, "against the ordered sums");
}

// Restores the statistics loop the process had.
class LoopChoice {
 public:
  explicit LoopChoice(probe::StatsLoop loop) : before_(probe::set_stats_loop(loop)) {}
  ~LoopChoice() { probe::set_stats_loop(before_); }
  LoopChoice(const LoopChoice&) = delete;
  LoopChoice& operator=(const LoopChoice&) = delete;

 private:
  probe::StatsLoop before_;
};

TEST(stats_test, every_build_of_the_loop_adds_in_the_documented_order_to_the_same_bits) {
  const std::vector<probe::StatsLoop> loops = probe::supported_stats_loops();
  ASSERT_EQ(loops.front(), probe::StatsLoop::baseline);
  std::printf("statistics loops on this CPU:");
  for (probe::StatsLoop loop : loops) std::printf(" %s", std::string(probe::stats_loop_name(loop)).c_str());
  std::printf("\n");
  for (probe::StatsLoop loop : loops) {
    SCOPED_TRACE(std::string(probe::stats_loop_name(loop)));
    const LoopChoice chosen(loop);
    std::mt19937_64 gen(20261129);
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)));
      // 32768 and 40000: two chunks of a size that is one chunk's below 32768 values.
      for (std::int64_t n : {1, 255, 256, 4099, 32767, 32768, 40000, 70000, 300001}) {
        for (int specials : {0, 1, 30}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << ", NaN/inf per 1000: " << specials);
          // Without the dtype's largest values (random_values puts 1.5% of them in: their sum absorbs every other
          // value exactly, whatever the order, and would hide an order changed).
          std::vector<double> v = random_values(gen, static_cast<std::size_t>(n), dtype, specials);
          for (double& x : v)
            if (std::fabs(x) > 1e6 && std::isfinite(x)) x = std::ldexp(x, -std::ilogb(x));
          expect_same_bits(from_values(v, {n}, {.dtype = dtype}));
          // Values of one sign with +0 and -0 among them: the minimum (maximum) is a zero, and which zero the
          // loop reports depends on the order of its comparisons.
          for (double& x : v) x = std::isnan(x) ? x : std::fabs(x) == 0 ? x : std::fabs(x);
          expect_same_bits(from_values(v, {n}, {.dtype = dtype}));
          for (double& x : v) x = -x;
          expect_same_bits(from_values(v, {n}, {.dtype = dtype}));
        }
      }
      // Blocks that hold NaN or inf: a block of nothing else between finite ones, and attention scores under a causal
      // mask (-inf above the diagonal of each 64 x 64 matrix: every block but the first rows' holds some).
      {
        std::vector<double> v = random_values(gen, 1000, dtype, 0);
        for (std::size_t k = 256; k < 512; ++k) v[k] = k % 3 == 0 ? kNaN : k % 3 == 1 ? kInf : -kInf;
        expect_same_bits(from_values(v, {1000}, {.dtype = dtype}));
        std::vector<double> scores = random_values(gen, 5 * 64 * 64, dtype, 0);
        for (std::size_t m = 0; m < 5; ++m)
          for (std::size_t r = 0; r < 64; ++r)
            for (std::size_t c = r + 1; c < 64; ++c) scores[(m * 64 + r) * 64 + c] = -kInf;
        expect_same_bits(from_values(scores, {5, 64, 64}, {.dtype = dtype}));
      }
      // Permuted views of whole tensors, read in memory order: a transpose, and heads split by a permute.
      const Tensor m = from_values(random_values(gen, 300 * 257, dtype, 1), {300, 257}, {.dtype = dtype});
      expect_same_bits(m.transpose(0, 1));
      const Tensor q = from_values(random_values(gen, 4 * 64 * 4 * 32, dtype, 0), {4, 64, 4, 32}, {.dtype = dtype});
      expect_same_bits(q.permute({0, 2, 1, 3}));
      // Views with gaps, read in their own order and gathered: heads split from a wider tensor (a query sliced
      // from the projection of query, key and value: the last dimension adjacent), and transposes of the last
      // two dimensions of such slices, read eight rows at a time: a key transposed for attention (rows a multiple
      // of 8, columns of 8), rows left over after the groups of 8 and columns not a multiple of 8 in two chunks
      // (78000 values, the chunk bound inside a row), and rows longer than the gather buffer.
      const Tensor qkv = from_values(random_values(gen, 4 * 64 * 3 * 128, dtype, 0), {4, 64, 3 * 128}, {.dtype = dtype});
      expect_same_bits(qkv.slice(2, 0, 128).view({4, 64, 4, 32}).permute({0, 2, 1, 3}));
      for (const Shape& shape : {Shape{2, 3, 64, 32}, Shape{4, 3, 500, 13}, Shape{3, 4100, 9}}) {
        Shape wider = shape;
        wider.back() += 3;
        std::int64_t n = 1;
        for (std::int64_t d : wider) n *= d;
        std::vector<double> v = random_values(gen, static_cast<std::size_t>(n), dtype, 1);
        for (double& x : v)
          if (std::fabs(x) > 1e6 && std::isfinite(x)) x = std::ldexp(x, -std::ilogb(x));
        const Tensor k =
            from_values(v, wider, {.dtype = dtype}).slice(static_cast<std::int64_t>(shape.size()) - 1, 0, shape.back());
        expect_same_bits(k.transpose(-2, -1));
      }
    }
  }
}


TEST(stats_test, a_permuted_view_has_the_statistics_of_the_tensor_it_permutes) {
  std::mt19937_64 gen(29112026);
  int orders_differ = 0;  // cases where the view read in its own order gives other sums
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    // One chunk, and 81920 values in two chunks (over both threads where there are two).
    for (const Shape& shape : {Shape{6, 35, 4, 37}, Shape{8, 64, 4, 40}}) {
      std::int64_t n = 1;
      for (std::int64_t d : shape) n *= d;
      std::vector<double> v = random_values(gen, static_cast<std::size_t>(n), dtype, 1);
      for (double& x : v)  // without the huge values, whose sums absorb the rest in any order
        if (std::fabs(x) > 1e6 && std::isfinite(x)) x = std::ldexp(x, -std::ilogb(x));
      const Tensor x = from_values(v, shape, {.dtype = dtype});
      for (const Shape& order : {Shape{0, 2, 1, 3}, Shape{3, 1, 0, 2}, Shape{1, 0, 2, 3}}) {
        for (bool histogram : {false, true}) {
          const std::string what = fmt::format("{} {} permuted {}{}", dtype_name(dtype), fmt::join(shape, "x"),
                                               fmt::join(order, ","), histogram ? ", with histogram" : "");
          const Tensor view = x.permute(order);
          const probe::TensorStats want = tensor_stats(x, histogram);
          expect_same_stats(tensor_stats(view, histogram), want, what);
          // A copy in the view's own order has the same values in another order: its sums may differ.
          const probe::TensorStats own_order = tensor_stats(view.contiguous(), histogram);
          if (bits_of(own_order.sum_sq) != bits_of(want.sum_sq) || bits_of(own_order.health.mean) != bits_of(want.health.mean))
            ++orders_differ;
        }
      }
    }
  }
  EXPECT_GT(orders_differ, 0) << "no case where the order matters: the test would not see a view read in its own order";
  // A transpose of whole rows of a matrix (a view with a storage offset): the statistics of those rows.
  std::vector<double> v = random_values(gen, 40 * 70, DType::f32, 0);
  const Tensor rows = from_values(v, {40, 70}).slice(0, 5, 25);
  expect_same_stats(tensor_stats(rows.transpose(0, 1)), tensor_stats(rows), "a transpose of rows 5-24");
}

TEST(stats_test, in_memory_order_permutes_only_views_that_fill_a_block_of_memory) {
  std::vector<double> v(3 * 4 * 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  const Tensor x = from_values(v, {3, 4, 5});
  const Tensor permuted = probe::in_memory_order(x.permute({2, 0, 1}));
  EXPECT_TRUE(permuted.is_contiguous());
  EXPECT_EQ(permuted.shape(), x.shape());
  EXPECT_EQ(permuted.values(), v);
  // Rows 1-2, transposed: a block that starts 20 elements into the storage.
  const Tensor rows = x.slice(0, 1, 3);
  const Tensor block = probe::in_memory_order(rows.transpose(1, 2));
  EXPECT_TRUE(block.is_contiguous());
  EXPECT_EQ(block.storage_offset(), 20);
  EXPECT_EQ(block.values(), rows.values());
  // Left as they are: a contiguous tensor, a slice with gaps (and its transpose), every other column, a broadcast.
  const Tensor pair = from_values({1, 2}, {2, 1});
  for (const Tensor& t : {x, x.slice(2, 0, 3), x.slice(2, 0, 3).transpose(0, 2), x.slice(2, 0, 5, 2).transpose(0, 1),
                          pair.expand({2, 5})}) {
    const Tensor same = probe::in_memory_order(t);
    EXPECT_EQ(same.shape(), t.shape());
    EXPECT_EQ(same.strides(), t.strides());
  }
}

TEST(stats_test, set_stats_loop_returns_the_build_it_replaced) {
  const probe::StatsLoop widest = probe::supported_stats_loops().back();
  const probe::StatsLoop before = probe::set_stats_loop(probe::StatsLoop::baseline);
  EXPECT_EQ(before, widest) << "the widest build the CPU supports runs unless a test chose another";
  EXPECT_EQ(probe::set_stats_loop(widest), probe::StatsLoop::baseline);
}

TEST(stats_test, set_stats_loop_refuses_a_build_the_cpu_cannot_run) {
  const std::vector<probe::StatsLoop> loops = probe::supported_stats_loops();
  if (loops.size() == 3) GTEST_SKIP() << "every build runs on this CPU: nothing to refuse";
  const auto missing = static_cast<probe::StatsLoop>(static_cast<int>(loops.back()) + 1);
  try {
    probe::set_stats_loop(missing);
    FAIL() << "set_stats_loop accepted a build the CPU cannot run";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("set_stats_loop: this CPU cannot run the {} build of the statistics loop\n"
                          "hint: choose one of supported_stats_loops()",
                          probe::stats_loop_name(missing)));
  }
  EXPECT_EQ(probe::set_stats_loop(loops.back()), loops.back()) << "a refused choice changes nothing";
}

TEST(stats_test, norm_is_inf_or_nan_when_the_tensor_holds_them) {
  EXPECT_EQ(tensor_stats(from_values({3, 4}, {2})).norm(), 5.0);
  EXPECT_EQ(tensor_stats(from_values({3, -kInf}, {2})).norm(), kInf);
  EXPECT_TRUE(std::isnan(tensor_stats(from_values({kInf, kNaN}, {2})).norm()));
}

TEST(stats_test, histogram_bin_is_the_binary_exponent_with_special_bins) {
  EXPECT_EQ(histogram_bin(1.0, DType::f32), bin_of_exponent(0));
  EXPECT_EQ(histogram_bin(1.5, DType::f32), bin_of_exponent(0));
  EXPECT_EQ(histogram_bin(-2.0, DType::f32), bin_of_exponent(1));
  EXPECT_EQ(histogram_bin(0.75, DType::f32), bin_of_exponent(-1));
  EXPECT_EQ(histogram_bin(65504.0, DType::f16), bin_of_exponent(15));
  EXPECT_EQ(histogram_bin(std::ldexp(1.0, -20), DType::f16), kSubnormalBin) << "subnormal in f16";
  EXPECT_EQ(histogram_bin(std::ldexp(1.0, -14), DType::f16), bin_of_exponent(-14));
  EXPECT_EQ(histogram_bin(std::ldexp(1.0, -20), DType::f32), bin_of_exponent(-20)) << "normal in f32";
  EXPECT_EQ(histogram_bin(std::ldexp(1.0, -64), DType::f32), bin_of_exponent(-64));
  EXPECT_EQ(histogram_bin(std::ldexp(1.0, -65), DType::f32), kSubnormalBin) << "below the range";
  EXPECT_EQ(histogram_bin(1e30, DType::f32), bin_of_exponent(63)) << "above the range: the top bin";
  EXPECT_EQ(histogram_bin(0.0, DType::bf16), kZeroBin);
  EXPECT_EQ(histogram_bin(-0.0, DType::bf16), kZeroBin);
  EXPECT_EQ(histogram_bin(-kInf, DType::f16), kInfBin);
  EXPECT_EQ(histogram_bin(kNaN, DType::f16), kNanBin);
  EXPECT_EQ(kNanBin, trace::kHistBins - 1);
}

TEST(stats_test, histogram_of_an_f16_tensor_puts_each_value_in_its_bin) {
  const Tensor t =
      from_values({1, 3, 0.75, std::ldexp(1.0, -20), 0, kInf, kNaN, 65504, -4}, {9}, {.dtype = DType::f16});
  const probe::TensorStats s = tensor_stats(t, /*with_histogram=*/true);
  std::array<std::int64_t, trace::kHistBins> expected{};
  expected[bin_of_exponent(0)] = 1;   // 1
  expected[bin_of_exponent(1)] = 1;   // 3
  expected[bin_of_exponent(-1)] = 1;  // 0.75
  expected[bin_of_exponent(15)] = 1;  // 65504
  expected[bin_of_exponent(2)] = 1;   // -4
  expected[kSubnormalBin] = 1;
  expected[kZeroBin] = 1;
  expected[kInfBin] = 1;
  expected[kNanBin] = 1;
  EXPECT_EQ(s.histogram, expected);
  EXPECT_EQ(tensor_stats(t).histogram, (std::array<std::int64_t, trace::kHistBins>{})) << "only when asked for";
}

TEST(stats_test, histogram_of_bf16_and_f64_uses_their_exponents) {
  const probe::TensorStats b =
      tensor_stats(from_values({std::ldexp(1.0, -100), std::ldexp(1.0, -127)}, {2}, {.dtype = DType::bf16}), true);
  EXPECT_EQ(b.histogram[kSubnormalBin], 2) << "2^-100 is below the range, 2^-127 a bf16 subnormal";
  const probe::TensorStats d = tensor_stats(from_values({std::ldexp(1.0, 40), 0.1}, {2}, {.dtype = DType::f64}), true);
  EXPECT_EQ(d.histogram[bin_of_exponent(40)], 1);
  EXPECT_EQ(d.histogram[bin_of_exponent(-4)], 1) << "0.1 = 1.6 * 2^-4";
}

TEST(stats_test, cast_counts_finite_to_inf_and_non_zero_to_zero) {
  const double half_tiny = std::ldexp(1.0, -25);  // the f16 rounding tie between 0 and 2^-24: goes to 0
  const Tensor x = from_values({70000, 65519, 65520, -1e5, 1e-8, half_tiny, std::ldexp(1.0, -24), 0, kNaN, kInf}, {10});
  const Tensor y = x.to(DType::f16);
  const probe::CastCounts c = probe::cast_counts(x, y);
  EXPECT_EQ(c.overflow, 3) << "70000, 65520 and -1e5 (65519 rounds down to 65504; inf was not finite)";
  EXPECT_EQ(c.underflow, 2) << "1e-8 and 2^-25 (2^-24 is the smallest f16 subnormal; 0 was zero already)";
}

TEST(stats_test, cast_counts_to_bf16_agree_with_the_reference_rounding) {
  const std::vector<double> values{3.4e38, 3.3e38, 1e-40, 3e-41, -3.398e38, 1.0, 1e-45};
  const Tensor x = from_values(values, {7});
  const probe::CastCounts c = probe::cast_counts(x, x.to(DType::bf16));
  std::int64_t overflow = 0, underflow = 0;
  for (double v : values) {
    const float f = static_cast<float>(v);
    const double r = testing::reference_bf16(f);
    overflow += std::isinf(r) && std::isfinite(f);
    underflow += r == 0 && f != 0;
  }
  EXPECT_EQ(underflow, 2)
      << "the reference itself: 3e-41 and 1e-45 are below half of bf16's smallest subnormal, 2^-133";
  EXPECT_EQ(overflow, 2) << "the reference itself: 3.4e38 and -3.398e38 lie above the midpoint between bf16's largest "
                            "value (3.3895e38) and 2^128";
  EXPECT_EQ(c.overflow, overflow);
  EXPECT_EQ(c.underflow, underflow);
}

TEST(stats_test, cast_counts_read_strided_sources) {
  const Tensor x = from_values({1e5, 1, 1, 1e-9}, {2, 2}).transpose(0, 1);
  const Tensor y = x.to(DType::f16);
  const probe::CastCounts c = probe::cast_counts(x, y);
  EXPECT_EQ(c.overflow, 1);
  EXPECT_EQ(c.underflow, 1);
}

TEST(stats_test, cast_counts_refuse_tensors_of_different_shapes) {
  EXPECT_THROW_MSG(probe::cast_counts(zeros({2, 3}), zeros({3, 2}, {.dtype = DType::f16})), ShapeError, "cast_counts",
                   "[2, 3]", "[3, 2]");
}

TEST(stats_test, leading_values_stop_at_the_bound_in_row_major_order) {
  const Tensor x = from_values({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);  // rows [1, 4], [2, 5], [3, 6]
  EXPECT_EQ(probe::leading_values(x, 4), (std::vector<double>{1, 4, 2, 5}));
  EXPECT_EQ(probe::leading_values(x, 100).size(), 6u);
  EXPECT_TRUE(probe::leading_values(x, 0).empty());
}

TEST(stats_test, smallest_normal_is_that_of_each_dtype) {
  EXPECT_EQ(probe::smallest_normal(DType::f16), std::ldexp(1.0, -14));
  EXPECT_EQ(probe::smallest_normal(DType::bf16), std::ldexp(1.0, -126));
  EXPECT_EQ(probe::smallest_normal(DType::f32), std::ldexp(1.0, -126));
  EXPECT_EQ(probe::smallest_normal(DType::f64), std::ldexp(1.0, -1022));
  EXPECT_EQ(probe::smallest_normal(DType::i64), 0.0);
}

// ---- parameter checksums (/checksums) ----

// The values below were computed by an independent implementation of the documented formula (Python's integers,
// mod 2^64: mix(size) + sum of mix(w_i + (i + 1) * 0x9E3779B97F4A7C15), mix the splitmix64 finalizer) on the
// little-endian bytes of the f32 values 1, -2, 0.5, 3, 65504: two whole words and a 4-byte tail.
TEST(param_checksum, matches_the_documented_formula_on_known_bytes) {
  const Tensor t = from_values({1.0, -2.0, 0.5, 3.0, 65504.0}, {5}, {.dtype = DType::f32});
  EXPECT_EQ(probe::tensor_checksum(t), 0x8b8f74d0b425de3bull);
  EXPECT_EQ(probe::checksum_bytes(nullptr, 0), 0u) << "mix(0) is 0 and there is no word";
  EXPECT_EQ(probe::combine_checksums({0x8b8f74d0b425de3bull, 0}), 0x86bfcd8fc7ade9d8ull);
}

TEST(param_checksum, identical_parameters_give_identical_checksums_whatever_their_layout) {
  Generator gen(3);
  const Tensor a = randn({7, 5}, gen);
  const Tensor b = a.clone();
  EXPECT_EQ(probe::tensor_checksum(a), probe::tensor_checksum(b));
  // A transposed view's elements, row-major, are another tensor's bytes: made contiguous first.
  const Tensor at = a.transpose(0, 1);
  EXPECT_EQ(probe::tensor_checksum(at), probe::tensor_checksum(at.contiguous()));
  EXPECT_EQ(probe::combine_checksums({probe::tensor_checksum(a), probe::tensor_checksum(at)}),
            probe::combine_checksums({probe::tensor_checksum(b), probe::tensor_checksum(at.contiguous())}));
}

// Exhaustively over the bits of a small tensor (five f32 values: 160 bits, a tail word included): flipping any
// one bit changes the tensor's checksum and the combined checksum of a parameter set holding it; and every
// flipped tensor's checksum differs from every other's (no two one-bit flips collide).
TEST(param_checksum, every_one_bit_flip_of_a_small_tensor_changes_the_checksum) {
  const std::vector<double> values{0.25, -1.5, 3.0e-8, 1024.0, -0.0};
  const Tensor original = from_values(values, {5}, {.dtype = DType::f32});
  const Tensor other = from_values({7.0, 8.0}, {2}, {.dtype = DType::f32});
  const std::uint64_t sum = probe::tensor_checksum(original);
  const std::uint64_t combined = probe::combine_checksums({sum, probe::tensor_checksum(other)});
  std::vector<std::uint64_t> seen{sum};
  for (int bit = 0; bit < 5 * 32; ++bit) {
    Tensor flipped = original.clone();
    auto* bytes = static_cast<unsigned char*>(flipped.data());
    bytes[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    const std::uint64_t s = probe::tensor_checksum(flipped);
    EXPECT_NE(s, sum) << "bit " << bit;
    EXPECT_NE(probe::combine_checksums({s, probe::tensor_checksum(other)}), combined) << "bit " << bit;
    seen.push_back(s);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "two of the 161 tensors share a checksum";
}

}  // namespace
}  // namespace ampscope
