// The host/device functions the CUDA kernels call, run serially on the CPU so that the arithmetic the GPU
// runs is checked without a GPU:
// - the row functions of kernels/row_functors.h (softmax, log_softmax, layer norm, sum/mean, argmax and
//   their backward) driven by a SerialRow against values computed here in f64 (rows with -inf, +inf,
//   NaN, all-equal values, length 1, and lengths on both sides of the 32 lanes), and RMS norm as the
//   models compose it (pow, mean, add, rsqrt, mul: the element functors and sum_row) against f64 too;
// - the same functions against the CPU backend's kernels (its registered kernels, rows split over the
//   cores), bit for bit, for f64, f32, f16 and bf16;
// - the pieces of the GPU's warp team (strided_partial_sum, strided_max_candidate, replaces_max) replayed
//   lane by lane with __shfl_down_sync's semantics: lane 0 must end with SerialRow's bits;
// - the optimizer elements of kernels/optim_functors.h in the GPU's form (run-time flags) against the
//   CPU's fused step (compile-time flags) bit for bit, and against an f64 Adam/SGD.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/convert.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cpu/fused_optim.h"
#include "kernels/functors.h"
#include "kernels/optim_functors.h"
#include "kernels/rank_fold.h"
#include "kernels/row_functors.h"

namespace ampscope {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kU32 = 0x1p-24;  // unit roundoff of f32

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
std::uint64_t bits(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
std::uint16_t bits(f16 h) { return h.bits; }
std::uint16_t bits(bf16 h) { return h.bits; }
float float_of_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The rows every reference test runs: values as doubles, rounded to the storage type on load.
struct Row {
  std::string name;
  std::vector<double> x;
};
std::vector<Row> edge_rows() {
  std::vector<Row> rows = {
      {"one two three", {1, 2, 3}},
      {"length 1", {5}},
      {"length 1 negative", {-3.25}},
      {"all equal", {0.7, 0.7, 0.7, 0.7, 0.7}},
      {"all equal powers of two", {0.5, 0.5, 0.5, 0.5}},
      {"a -inf", {-kInf, 0, 1, -2}},
      {"all -inf", {-kInf, -kInf, -kInf}},
      {"a +inf", {1, kInf, 2}},
      {"a NaN", {1, kNaN, 2, 3}},
      {"a NaN first", {kNaN, 1}},
      {"wide spread", {-100, 0, 80, 88.5, -87}},
      {"signed zeros", {-0.0, 0.0, -0.0}},
      {"tiny", {1e-30, -2e-30, 3e-30}},
  };
  // Lengths around the 32 lanes, and a longer row: lane partial sums of unequal lengths.
  Generator gen(17);
  for (const std::int64_t n : {31, 32, 33, 64, 65, 100, 333}) {
    const std::vector<double> v = randn({n}, gen).values();
    Row r{"random length " + std::to_string(n), {}};
    for (std::int64_t j = 0; j < n; ++j) r.x.push_back(v[j] * 3 + (j % 7 == 0 ? 4 : 0));
    rows.push_back(r);
  }
  return rows;
}

template <class T>
std::vector<T> stored(const std::vector<double>& x) {
  std::vector<T> out;
  for (double v : x) out.push_back(convert<T>(v));
  return out;
}
template <class T>
std::vector<double> widened(const std::vector<T>& x) {
  std::vector<double> out;
  for (T v : x) out.push_back(static_cast<double>(convert<acc_type<T>>(v)));
  return out;
}

// Compares one result against its f64 reference: a NaN reference wants the canonical NaN's bits, an
// infinite or zero reference the same value exactly, anything else |got - ref| <= tol.
template <class T>
void expect_near_reference(T got_t, double ref, double tol, const std::string& what) {
  const double got = static_cast<double>(convert<acc_type<T>>(got_t));
  if (std::isnan(ref)) {
    EXPECT_EQ(bits(got_t), bits(convert<T>(canonical_nan(static_cast<acc_type<T>>(kNaN))))) << what << ": expected the canonical NaN, got " << got;
  } else if (std::isinf(ref) || ref == 0) {
    EXPECT_EQ(got, ref) << what;
  } else {
    EXPECT_LE(std::fabs(got - ref), tol) << what << ": got " << got << " expected " << ref;
  }
}

// Relative error the stored type adds on top of the f32 computation: half an ulp when rounding to
// f16 (11 bits) or bf16 (8 bits).
template <class T>
double store_rel() {
  if constexpr (std::is_same_v<T, f16>) return 0x1p-11;
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-8;
  if constexpr (std::is_same_v<T, double>) return 0x1p-53;
  return kU32;
}
template <class T>
double acc_unit() {
  return std::is_same_v<acc_type<T>, double> ? 0x1p-53 : kU32;
}
// The smallest spacing near zero of the stored type (subnormal results round to it).
template <class T>
double store_abs() {
  if constexpr (std::is_same_v<T, f16>) return 0x1p-24;
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-133;
  if constexpr (std::is_same_v<T, double>) return 0x1p-1074;
  return 0x1p-149;
}

// ---- f64 references ----

std::vector<double> softmax_f64(const std::vector<double>& x, bool log) {
  double m = -kInf;
  for (double v : x) m = std::isnan(v) || std::isnan(m) ? kNaN : std::max(m, v);
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  std::vector<double> y;
  for (double v : x) y.push_back(log ? v - m - std::log(s) : std::exp(v - m) / s);
  return y;
}

struct LayerNormF64 {
  std::vector<double> y;
  double mean, rstd;
};
LayerNormF64 layer_norm_f64(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                            double eps) {
  const double n = static_cast<double>(x.size());
  double mean = 0;
  for (double v : x) mean += v;
  mean /= n;
  double var = 0;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  const double rstd = 1 / std::sqrt(var + eps);
  LayerNormF64 r{{}, mean, rstd};
  for (std::size_t j = 0; j < x.size(); ++j) r.y.push_back((x[j] - mean) * rstd * w[j] + b[j]);
  return r;
}

// ---- softmax and log_softmax against f64 ----

template <class T>
void check_softmax_against_f64(bool log) {
  for (const Row& row : edge_rows()) {
    const std::vector<T> x = stored<T>(row.x);
    const std::vector<double> xd = widened(x);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<T> y(x.size());
    if (log) {
      softmax_row<true>(SerialRow{}, x.data(), y.data(), n);
    } else {
      softmax_row<false>(SerialRow{}, x.data(), y.data(), n);
    }
    const std::vector<double> ref = softmax_f64(xd, log);
    double m = -kInf, log_s = 0;
    for (double v : xd) m = std::max(m, v);
    for (double v : xd) log_s += std::exp(v - m);
    log_s = std::log(log_s);
    for (std::size_t j = 0; j < x.size(); ++j) {
      // softmax: n + 4 roundings of relative size u in the sum, the exp, the division (each exp within
      // 1 ulp); log_softmax: x - m is exact or one rounding, log(sum) carries the sum's relative error
      // as an absolute one, and the two subtractions round relative to their operands.
      const double u = acc_unit<T>();
      const double tol = log ? 4 * u * (std::fabs(xd[j] - m) + std::fabs(log_s) + 1) + (n + 4) * u +
                                   store_rel<T>() * std::fabs(ref[j])
                             : ((n + 6) * u + store_rel<T>()) * std::fabs(ref[j]) + store_abs<T>();
      expect_near_reference(y[j], ref[j], tol, row.name + " element " + std::to_string(j));
    }
  }
}

TEST(row_functors_test, softmax_row_matches_f64_on_edge_rows_in_every_dtype) {
  check_softmax_against_f64<float>(false);
  check_softmax_against_f64<double>(false);
  check_softmax_against_f64<f16>(false);
  check_softmax_against_f64<bf16>(false);
}

TEST(row_functors_test, log_softmax_row_matches_f64_on_edge_rows_in_every_dtype) {
  check_softmax_against_f64<float>(true);
  check_softmax_against_f64<double>(true);
  check_softmax_against_f64<f16>(true);
  check_softmax_against_f64<bf16>(true);
}

// Values the f64 reference gives only up to rounding, that the functions must give exactly.
TEST(row_functors_test, softmax_of_equal_values_is_exactly_one_over_n_and_of_one_value_exactly_one) {
  for (const int n : {1, 2, 3, 5, 32, 33, 100}) {
    const std::vector<float> x(static_cast<std::size_t>(n), 0.7f);
    std::vector<float> y(x.size()), ly(x.size());
    softmax_row<false>(SerialRow{}, x.data(), y.data(), n);
    softmax_row<true>(SerialRow{}, x.data(), ly.data(), n);
    for (int j = 0; j < n; ++j) {
      // exp(0) = 1 exactly, the sum of n ones is exact, so 1 / n rounded once.
      EXPECT_EQ(bits(y[j]), bits(1.0f / static_cast<float>(n))) << "n " << n;
      EXPECT_EQ(bits(ly[j]), bits(0.0f - std::log(static_cast<float>(n)))) << "n " << n;
    }
  }
}

// ---- layer norm against f64 ----

template <class T>
void check_layer_norm_against_f64() {
  using Acc = acc_type<T>;
  const double eps = 1e-5;
  for (const Row& row : edge_rows()) {
    const std::vector<T> x = stored<T>(row.x);
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<double> wd, bd;
    for (std::int64_t j = 0; j < n; ++j) {
      wd.push_back(0.5 + 0.125 * static_cast<double>(j % 5));
      bd.push_back(0.25 * static_cast<double>(j % 3) - 0.25);
    }
    const std::vector<T> w = stored<T>(wd), b = stored<T>(bd);
    std::vector<T> y(x.size());
    Acc mean = 0, rstd = 0;
    layer_norm_row(SerialRow{}, x.data(), w.data(), b.data(), y.data(), n, static_cast<Acc>(eps), &mean, &rstd);
    const LayerNormF64 ref = layer_norm_f64(widened(x), widened(w), widened(b), eps);
    // The saved mean is kept unrounded and uncanonicalised: a NaN, but not necessarily the canonical one.
    if (std::isnan(ref.mean)) {
      EXPECT_TRUE(std::isnan(static_cast<double>(mean))) << row.name;
    } else if (std::isinf(ref.mean)) {
      EXPECT_EQ(static_cast<double>(mean), ref.mean) << row.name;
    } else {
      double scale = 0;
      for (double v : widened(x)) scale = std::max(scale, std::fabs(v));
      EXPECT_LE(std::fabs(static_cast<double>(mean) - ref.mean), (n + 2) * acc_unit<T>() * scale) << row.name;
    }
    double dev = 0;  // the largest |x - mean| * rstd: the size of the normalised values
    for (double v : widened(x)) dev = std::max(dev, std::fabs(v - ref.mean) * ref.rstd);
    for (std::int64_t j = 0; j < n; ++j) {
      // The mean's and variance's sums carry (n + 2) u relative errors; rstd's sqrt and division two more;
      // an all-equal row leaves the mean's rounding error times rstd, bounded through dev + n u x rstd.
      double x_scale = 0;
      for (double v : widened(x)) x_scale = std::max(x_scale, std::fabs(v));
      const double u = acc_unit<T>();
      const double tol = (2 * n + 16) * u * (dev + x_scale * ref.rstd) * 1.25 +
                         4 * u * std::fabs(ref.y[j]) + store_rel<T>() * std::fabs(ref.y[j]) + store_abs<T>();
      expect_near_reference(y[j], ref.y[j], tol, row.name + " element " + std::to_string(j));
    }
  }
}

TEST(row_functors_test, layer_norm_row_matches_f64_on_edge_rows_in_every_dtype) {
  check_layer_norm_against_f64<float>();
  check_layer_norm_against_f64<double>();
  check_layer_norm_against_f64<f16>();
  check_layer_norm_against_f64<bf16>();
}

// A row whose values are equal and sum exactly (powers of two) has mean = x and x - mean = 0 exactly: the
// output is the bias, bit for bit, and rstd is 1 / sqrt(eps); a row of one value likewise.
TEST(row_functors_test, layer_norm_of_a_constant_row_or_of_one_value_is_exactly_the_bias) {
  for (const int n : {1, 4, 32, 64}) {
    const std::vector<float> x(static_cast<std::size_t>(n), n == 1 ? 3.7f : 0.5f);
    std::vector<float> b, y(x.size());
    for (int j = 0; j < n; ++j) b.push_back(0.1f * static_cast<float>(j) - 1.0f);
    float mean = 0, rstd = 0;
    layer_norm_row(SerialRow{}, x.data(), static_cast<const float*>(nullptr), b.data(), y.data(), n, 1e-5f, &mean,
                   &rstd);
    EXPECT_EQ(bits(mean), bits(x[0])) << "n " << n;
    EXPECT_EQ(bits(rstd), bits(1.0f / std::sqrt(1e-5f))) << "n " << n;
    for (int j = 0; j < n; ++j) EXPECT_EQ(bits(y[j]), bits(b[static_cast<std::size_t>(j)])) << "n " << n << " j " << j;
  }
}

// ---- RMS norm as LlamaRMSNorm and the rmsnorm sample compose it ----

// x * rsqrt(mean(x^2) + eps) from the functors each op runs (PowFn, sum_row with mean's factor, AddFn,
// RsqrtFn, MulFn): there is no RMS norm kernel; this is the arithmetic a GPU runs for one, op by op.
std::vector<float> rms_norm_from_functors(const std::vector<float>& x, float eps) {
  const auto n = static_cast<std::int64_t>(x.size());
  const double two = 2.0;
  std::vector<float> sq;
  for (float v : x) sq.push_back(PowFn(&two)(v));
  const float mean_sq = sum_row(SerialRow{}, sq.data(), n, 1.0f / static_cast<float>(n), 1.0f);
  const float r = RsqrtFn{}(AddFn{}(mean_sq, eps));
  std::vector<float> y;
  for (float v : x) y.push_back(MulFn{}(v, r));
  return y;
}

TEST(row_functors_test, rms_norm_from_the_functors_is_what_the_cpu_ops_compute_and_matches_f64) {
  const double eps = 1e-6;
  for (const Row& row : edge_rows()) {
    const std::vector<float> x = stored<float>(row.x);
    const auto n = static_cast<std::int64_t>(x.size());
    const std::vector<float> got = rms_norm_from_functors(x, static_cast<float>(eps));
    // The CPU backend running the model's ops.
    const Tensor xt = from_values(widened(x), {1, n}, {DType::f32});
    const Tensor yt = mul(xt, rsqrt(add(mean(pow(xt, 2.0), {-1}, true), eps)));
    const std::vector<double> backend = yt.values();
    double ms = 0;
    for (double v : widened(x)) ms += v * v;
    ms /= static_cast<double>(n);
    const double r = 1 / std::sqrt(ms + eps);
    for (std::int64_t j = 0; j < n; ++j) {
      EXPECT_EQ(bits(got[j]), bits(static_cast<float>(backend[j]))) << row.name << " element " << j;
      const double ref = static_cast<double>(x[j]) * r;
      // n + 6 roundings (squares, the sum, the factor, eps, rsqrt's division and sqrt, the product).
      expect_near_reference(got[j], ref, (n + 6) * kU32 * std::fabs(ref) + 0x1p-149,
                            row.name + " element " + std::to_string(j));
    }
  }
}

// x^2 overflows f32 for |x| > 1.8e19: rsqrt(inf) = 0 turns the whole row into zeros and the inf into a
// NaN (the silent damage docs/scenarios.md describes), on the CPU and so, by the same functors, on the GPU.
TEST(row_functors_test, rms_norm_of_a_row_whose_square_overflows_is_zeros_and_nan_as_in_f32) {
  const std::vector<float> x = {1.0f, 3e19f, -2.0f, std::numeric_limits<float>::infinity()};
  const std::vector<float> y = rms_norm_from_functors(x, 1e-6f);
  EXPECT_EQ(bits(y[0]), bits(0.0f));
  EXPECT_EQ(bits(y[1]), bits(0.0f));
  EXPECT_EQ(bits(y[2]), bits(-0.0f));
  EXPECT_EQ(bits(y[3]), 0x7FFFFFFFu);
}

// ---- argmax and sum ----

TEST(row_functors_test, argmax_row_takes_the_first_largest_value_or_the_first_nan) {
  struct Case {
    std::vector<float> x;
    std::int64_t expected;
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const Case cases[] = {{{1, 3, 3, 2}, 1},         {{-inf, -inf}, 0},   {{1, nan, 5, nan}, 1}, {{nan}, 0},
                        {{-0.0f, 0.0f}, 0},        {{0.0f, -0.0f}, 0},  {{-1, inf, inf}, 1},   {{7}, 0},
                        {{-5, -4, -4.5f, -4}, 1}};
  for (const Case& c : cases) {
    EXPECT_EQ(argmax_row(c.x.data(), static_cast<std::int64_t>(c.x.size())), c.expected) << c.x.size();
  }
  // Where a row spans more than one lane's worth of elements, the largest value late in the row.
  std::vector<float> long_row(100, 1.0f);
  long_row[77] = 2.0f;
  long_row[99] = 2.0f;
  EXPECT_EQ(argmax_row(long_row.data(), 100), 77);
  EXPECT_EQ(argmax_row(long_row.data(), 0), 0);  // an empty row (never reaches a kernel) is index 0
}

TEST(row_functors_test, sum_row_matches_f64_and_overflows_only_on_store) {
  for (const Row& row : edge_rows()) {
    const std::vector<float> x = stored<float>(row.x);
    const auto n = static_cast<std::int64_t>(x.size());
    double ref = 0, mag = 0;
    for (double v : widened(x)) {
      ref += v;
      mag += std::fabs(v);
    }
    expect_near_reference(sum_row(SerialRow{}, x.data(), n, 1.0f, 1.0f), ref, n * kU32 * mag, row.name);
  }
  // 40 f16 values of 60000: the sum (2.4e6) is kept in float, then mean's factor brings it back in range.
  const std::vector<f16> big(40, f16(60000.0f));
  EXPECT_EQ(static_cast<float>(sum_row(SerialRow{}, big.data(), 40, 1.0f / 40.0f, 1.0f)), 60000.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(sum_row(SerialRow{}, big.data(), 40, 1.0f, 1.0f))));
}

// ---- the backward rows against f64 ----

TEST(row_functors_test, softmax_and_layer_norm_backward_rows_match_f64) {
  Generator gen(5);
  for (const std::int64_t n : {1, 7, 33, 100}) {
    const std::vector<double> xd = randn({n}, gen).values(), gd = randn({n}, gen).values();
    const std::vector<float> x = stored<float>(xd), g = stored<float>(gd);
    std::vector<float> y(x.size()), ly(x.size()), dx(x.size()), ldx(x.size());
    softmax_row<false>(SerialRow{}, x.data(), y.data(), n);
    softmax_row<true>(SerialRow{}, x.data(), ly.data(), n);
    softmax_backward_row<false>(SerialRow{}, g.data(), y.data(), dx.data(), n);
    softmax_backward_row<true>(SerialRow{}, g.data(), ly.data(), ldx.data(), n);
    double sgy = 0, sg = 0, mag = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      sgy += static_cast<double>(g[j]) * static_cast<double>(y[j]);
      sg += static_cast<double>(g[j]);
      mag += std::fabs(static_cast<double>(g[j]));
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const double yj = static_cast<double>(y[j]), gj = static_cast<double>(g[j]);
      const double ref = yj * (gj - sgy), lref = gj - std::exp(static_cast<double>(ly[j])) * sg;
      EXPECT_NEAR(dx[j], ref, (n + 4) * kU32 * (std::fabs(yj) * (std::fabs(gj) + mag) + 1e-30)) << n << " " << j;
      EXPECT_NEAR(ldx[j], lref, (n + 8) * kU32 * (std::fabs(gj) + mag)) << n << " " << j;
    }
    // Layer norm's input gradient without weight, from the saved mean and rstd.
    float mean = 0, rstd = 0;
    std::vector<float> ln(x.size()), lndx(x.size());
    const float* none = nullptr;
    layer_norm_row(SerialRow{}, x.data(), none, none, ln.data(), n, 1e-5f, &mean, &rstd);
    layer_norm_backward_row(SerialRow{}, g.data(), x.data(), none, lndx.data(), n, mean, rstd);
    double sxh = 0;
    std::vector<double> xhat;
    for (std::int64_t j = 0; j < n; ++j) {
      xhat.push_back((static_cast<double>(x[j]) - mean) * rstd);
      sxh += static_cast<double>(g[j]) * xhat.back();
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const double ref = rstd / static_cast<double>(n) *
                         (static_cast<double>(n) * static_cast<double>(g[j]) - sg - xhat[j] * sxh);
      EXPECT_NEAR(lndx[j], ref, (2 * n + 8) * kU32 * rstd * (mag + std::fabs(xhat[j]) * mag * 4)) << n << " " << j;
    }
  }
}

// ---- the row functions against the CPU backend's kernels, bit for bit ----

Backend& cpu() { return backend_for(Device::cpu()); }

// A [rows, cols] tensor of dtype d with the edge values planted among random ones.
Tensor edge_tensor(std::int64_t rows, std::int64_t cols, DType d, std::uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v = randn({rows, cols}, gen).values();
  const double cases[] = {kNaN, kInf, -kInf, 0.0, -0.0, 1e-40, 70000.0, -3e38};
  // Plant in a few rows only, so most rows stay finite and exercise the arithmetic.
  for (std::int64_t r = 0; r < rows; r += 7) v[static_cast<std::size_t>(r * cols + (r * 13) % cols)] = cases[(r / 7) % 8];
  return from_values(v, {rows, cols}, {d});
}

template <class T>
void expect_same_bits(const T* expected, const T* got, std::int64_t n, const std::string& what) {
  int shown = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (bits(expected[i]) != bits(got[i]) && shown++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " functor " << static_cast<double>(convert<acc_type<T>>(expected[i]))
                    << " backend " << static_cast<double>(convert<acc_type<T>>(got[i]));
    }
  }
}

// The CPU backend's layer_norm_param_grad of g and x (rows x cols; mean and rstd as tensors and as the values em,
// er) against layer_norm_param_grad_column one column at a time, bit for bit; `finite`: first asserts that every
// expected weight gradient is finite (a test that means to compare finite values).
template <class T>
void check_param_grad(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                      const std::vector<acc_type<T>>& em, const std::vector<acc_type<T>>& er, bool finite,
                      const std::string& weight_what, const std::string& bias_what) {
  constexpr DType D = dtype_of<T>::value;
  const std::int64_t rows = x.size(0), cols = x.size(1);
  Tensor dw = Tensor::empty({cols}, {D}), db = Tensor::empty({cols}, {D});
  KernelArgs ap;
  ap.in[0] = g.kernel_view();
  ap.in[1] = x.kernel_view();
  ap.in[2] = mean.kernel_view();
  ap.in[3] = rstd.kernel_view();
  ap.num_inputs = 4;
  ap.out = dw.kernel_view();
  ap.aux[0] = db.kernel_view();
  cpu().run(Op::layer_norm_param_grad, D, ap);
  std::vector<T> edw(static_cast<std::size_t>(cols)), edb(static_cast<std::size_t>(cols));
  const T* gp = static_cast<const T*>(g.data());
  const T* xp = static_cast<const T*>(x.data());
  for (std::int64_t c = 0; c < cols; ++c) {
    layer_norm_param_grad_column(gp, xp, em.data(), er.data(), rows, cols, c, edw.data(), edb.data());
  }
  if (finite) {
    for (std::int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(std::isfinite(static_cast<double>(convert<acc_type<T>>(edw[static_cast<std::size_t>(c)])))) << weight_what;
    }
  }
  expect_same_bits(edw.data(), static_cast<const T*>(dw.data()), cols, weight_what);
  expect_same_bits(edb.data(), static_cast<const T*>(db.data()), cols, bias_what);
}

template <class T>
void check_backend_rows(std::int64_t rows, std::int64_t cols) {
  using Acc = acc_type<T>;
  constexpr DType D = dtype_of<T>::value;
  const std::string shape = std::string(dtype_name(D)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  const Tensor x = edge_tensor(rows, cols, D, 11), g = edge_tensor(rows, cols, D, 12);
  const Tensor w = edge_tensor(1, cols, D, 13).reshape({cols}), b = edge_tensor(1, cols, D, 14).reshape({cols});
  const T* xp = static_cast<const T*>(x.data());
  const T* gp = static_cast<const T*>(g.data());
  const std::int64_t n = rows * cols;
  const DType acc_d = dtype_of<Acc>::value;

  for (const bool log : {false, true}) {
    Tensor out = Tensor::empty({rows, cols}, {D});
    KernelArgs a;
    a.in[0] = x.kernel_view();
    a.num_inputs = 1;
    a.out = out.kernel_view();
    cpu().run(log ? Op::log_softmax_rows : Op::softmax_rows, D, a);
    std::vector<T> expected(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < rows; ++r) {
      if (log) {
        softmax_row<true>(SerialRow{}, xp + r * cols, expected.data() + r * cols, cols);
      } else {
        softmax_row<false>(SerialRow{}, xp + r * cols, expected.data() + r * cols, cols);
      }
    }
    expect_same_bits(expected.data(), static_cast<const T*>(out.data()), n, (log ? "log_softmax " : "softmax ") + shape);

    // The backward row from the forward's output.
    Tensor dx = Tensor::empty({rows, cols}, {D});
    KernelArgs ab;
    ab.in[0] = g.kernel_view();
    ab.in[1] = out.kernel_view();
    ab.num_inputs = 2;
    ab.out = dx.kernel_view();
    cpu().run(log ? Op::log_softmax_backward_rows : Op::softmax_backward_rows, D, ab);
    std::vector<T> expected_dx(static_cast<std::size_t>(n));
    const T* yp = static_cast<const T*>(out.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      if (log) {
        softmax_backward_row<true>(SerialRow{}, gp + r * cols, yp + r * cols, expected_dx.data() + r * cols, cols);
      } else {
        softmax_backward_row<false>(SerialRow{}, gp + r * cols, yp + r * cols, expected_dx.data() + r * cols, cols);
      }
    }
    expect_same_bits(expected_dx.data(), static_cast<const T*>(dx.data()), n,
                     (log ? "log_softmax backward " : "softmax backward ") + shape);
  }

  for (const bool affine : {false, true}) {
    const std::string what = (affine ? "layer norm with weight and bias " : "layer norm ") + shape;
    Tensor y = Tensor::empty({rows, cols}, {D}), mean = Tensor::empty({rows}, {acc_d}), rstd = Tensor::empty({rows}, {acc_d});
    KernelArgs a;
    a.in[0] = x.kernel_view();
    a.in[1] = affine ? w.kernel_view() : TensorView{};
    a.in[2] = affine ? b.kernel_view() : TensorView{};
    a.num_inputs = 3;
    a.out = y.kernel_view();
    a.aux[0] = mean.kernel_view();
    a.aux[1] = rstd.kernel_view();
    a.scalars[0] = 1e-5;
    cpu().run(Op::layer_norm_rows, D, a);
    const T* wp = affine ? static_cast<const T*>(w.data()) : nullptr;
    const T* bp = affine ? static_cast<const T*>(b.data()) : nullptr;
    std::vector<T> expected(static_cast<std::size_t>(n));
    std::vector<Acc> em(static_cast<std::size_t>(rows)), er(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      layer_norm_row(SerialRow{}, xp + r * cols, wp, bp, expected.data() + r * cols, cols, static_cast<Acc>(1e-5),
                     &em[r], &er[r]);
    }
    expect_same_bits(expected.data(), static_cast<const T*>(y.data()), n, what);
    expect_same_bits(em.data(), static_cast<const Acc*>(mean.data()), rows, what + " mean");
    expect_same_bits(er.data(), static_cast<const Acc*>(rstd.data()), rows, what + " rstd");

    Tensor dx = Tensor::empty({rows, cols}, {D});
    KernelArgs ab;
    ab.in[0] = g.kernel_view();
    ab.in[1] = x.kernel_view();
    ab.in[2] = mean.kernel_view();
    ab.in[3] = rstd.kernel_view();
    ab.in[4] = affine ? w.kernel_view() : TensorView{};
    ab.num_inputs = 5;
    ab.out = dx.kernel_view();
    cpu().run(Op::layer_norm_backward_rows, D, ab);
    std::vector<T> expected_dx(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < rows; ++r) {
      layer_norm_backward_row(SerialRow{}, gp + r * cols, xp + r * cols, wp, expected_dx.data() + r * cols, cols, em[r],
                              er[r]);
    }
    expect_same_bits(expected_dx.data(), static_cast<const T*>(dx.data()), n, what + " backward");

    if (affine) check_param_grad<T>(g, x, mean, rstd, em, er, false, what + " weight gradient", what + " bias gradient");
  }

  {  // sum_rows with mean's factor, and argmax
    Tensor s = Tensor::empty({rows}, {D});
    KernelArgs a;
    a.in[0] = x.kernel_view();
    a.num_inputs = 1;
    a.out = s.kernel_view();
    a.scalars[0] = 1.0 / 3.0;
    a.scalars[1] = 1.0;
    cpu().run(Op::sum_rows, D, a);
    std::vector<T> expected;
    for (std::int64_t r = 0; r < rows; ++r) {
      expected.push_back(sum_row(SerialRow{}, xp + r * cols, cols, static_cast<Acc>(1.0 / 3.0), Acc(1)));
    }
    expect_same_bits(expected.data(), static_cast<const T*>(s.data()), rows, "sum_rows " + shape);

    Tensor idx = Tensor::empty({rows}, {DType::i64});
    KernelArgs am;
    am.in[0] = x.kernel_view();
    am.num_inputs = 1;
    am.out = idx.kernel_view();
    cpu().run(Op::argmax_rows, DType::i64, am);
    const auto* got = static_cast<const std::int64_t*>(idx.data());
    for (std::int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[r], argmax_row(xp + r * cols, cols)) << "argmax " << shape << " row " << r;
  }
}

// Layer norm's parameter gradients on finite values only (check_backend_rows plants a NaN in row 0 of x,
// whose mean then makes every column's weight gradient NaN there): the CPU kernel, which walks the rows of a
// block of columns at once, against layer_norm_param_grad_column one column at a time, with mean and rstd
// from layer_norm_row.
template <class T>
void check_param_grad_on_finite_values(std::int64_t rows, std::int64_t cols) {
  using Acc = acc_type<T>;
  constexpr DType D = dtype_of<T>::value;
  const std::string shape = std::string(dtype_name(D)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
  Generator gen(31);
  const Tensor x = from_values(randn({rows, cols}, gen).values(), {rows, cols}, {D});
  const Tensor g = from_values(randn({rows, cols}, gen).values(), {rows, cols}, {D});
  const T* xp = static_cast<const T*>(x.data());
  std::vector<T> y(static_cast<std::size_t>(rows * cols));
  std::vector<Acc> em(static_cast<std::size_t>(rows)), er(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    layer_norm_row(SerialRow{}, xp + r * cols, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr),
                   y.data() + r * cols, cols, static_cast<Acc>(1e-5), &em[r], &er[r]);
  }
  const DType acc_d = dtype_of<Acc>::value;
  const Tensor mean = from_values(std::vector<double>(em.begin(), em.end()), {rows}, {acc_d});
  const Tensor rstd = from_values(std::vector<double>(er.begin(), er.end()), {rows}, {acc_d});
  check_param_grad<T>(g, x, mean, rstd, em, er, true, "weight gradient " + shape, "bias gradient " + shape);
}

TEST(row_functors_test, layer_norm_parameter_gradients_on_finite_values_in_every_dtype) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1024, 130}, {300, 97}, {7, 5}, {3, 1000}}) {
    check_param_grad_on_finite_values<float>(rows, cols);
    check_param_grad_on_finite_values<double>(rows, cols);
    check_param_grad_on_finite_values<f16>(rows, cols);
    check_param_grad_on_finite_values<bf16>(rows, cols);
  }
}

// Shapes: rows split over the cores (300 x 97: several parallel chunks), one column, rows of 33 (one lane
// with two elements), long rows, and 1024 x 130 (about the tiny GPT's layer norm: the parameter gradients'
// columns taken in blocks of 16, whose vector loops end in a partial vector).
TEST(row_functors_test, the_cpu_backend_runs_exactly_the_row_functions_in_every_dtype) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{300, 97}, {5, 1}, {40, 33}, {9, 1000}, {1024, 130}}) {
    check_backend_rows<float>(rows, cols);
    check_backend_rows<double>(rows, cols);
    check_backend_rows<f16>(rows, cols);
    check_backend_rows<bf16>(rows, cols);
  }
}

// ---- the warp team's pieces, replayed lane by lane ----

// __shfl_down_sync(mask, v, width) on lane k reads lane k + width's value from before the step, or its
// own when k + width is past the warp.
template <class V, class Combine>
V replay_shuffle_down_tree(std::vector<V> lanes, const Combine& combine) {
  for (int width = kReduceLanes / 2; width > 0; width /= 2) {
    const std::vector<V> before = lanes;
    for (int k = 0; k < kReduceLanes; ++k) {
      const V& other = k + width < kReduceLanes ? before[static_cast<std::size_t>(k + width)] : before[static_cast<std::size_t>(k)];
      lanes[static_cast<std::size_t>(k)] = combine(before[static_cast<std::size_t>(k)], other);
    }
  }
  return lanes[0];
}

float replay_warp_sum(const std::vector<float>& x) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<float> lanes;
  for (int k = 0; k < kReduceLanes; ++k) lanes.push_back(strided_partial_sum<float>(k, kReduceLanes, n, RowLoad<float, float>{x.data()}));
  return replay_shuffle_down_tree(lanes, [](float a, float b) { return a + b; });
}

float replay_warp_max(const std::vector<float>& x) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<MaxCandidate<float>> lanes;
  for (int k = 0; k < kReduceLanes; ++k) {
    lanes.push_back(strided_max_candidate<float>(k, kReduceLanes, n, RowLoad<float, float>{x.data()}));
  }
  return replay_shuffle_down_tree(lanes, [](const MaxCandidate<float>& mine, const MaxCandidate<float>& other) {
           return replaces_max(other, mine) ? other : mine;
         }).value;
}

TEST(row_functors_test, the_warps_sum_and_max_replayed_lane_by_lane_give_the_serial_rows_bits) {
  const float nan_a = float_of_bits(0x7FC00001u), nan_b = float_of_bits(0xFFC00002u);
  const float inf = std::numeric_limits<float>::infinity();
  Generator gen(23);
  for (const std::int64_t n : {0, 1, 2, 5, 31, 32, 33, 63, 64, 65, 100, 1000}) {
    const std::vector<double> v = randn({std::max<std::int64_t>(n, 1)}, gen).values();
    std::vector<float> base;
    for (std::int64_t j = 0; j < n; ++j) base.push_back(static_cast<float>(v[static_cast<std::size_t>(j)] * 1e3));
    std::vector<std::pair<std::string, std::vector<float>>> rows = {{"random", base}};
    if (n >= 3) {
      std::vector<float> r = base;
      r[n - 1] = nan_a;  // a later NaN in a lower lane ...
      r[1] = nan_b;      // ... and the first NaN: its payload is the answer
      rows.push_back({"two NaNs", r});
      std::vector<float> z(static_cast<std::size_t>(n), -1.0f);
      z[n - 1] = -0.0f;
      z[n / 2] = 0.0f;  // the first zero wins: +0
      rows.push_back({"signed zeros", z});
      std::vector<float> z2 = z;
      z2[n / 2] = -0.0f;
      z2[n - 1] = 0.0f;  // now -0 comes first
      rows.push_back({"signed zeros reversed", z2});
      std::vector<float> i = base;
      i[n / 3] = -inf;
      i[0] = inf;
      rows.push_back({"infinities", i});
      rows.push_back({"all -inf", std::vector<float>(static_cast<std::size_t>(n), -inf)});
    }
    for (const auto& [name, x] : rows) {
      const std::string what = name + " n " + std::to_string(n);
      const auto len = static_cast<std::int64_t>(x.size());
      const RowLoad<float, float> load{x.data()};
      // A sum's NaN has no defined payload: the compiler may commute an addition, and x86 keeps the
      // first operand's NaN (the GPU gives its canonical one). Every consumer of a row sum canonicalises
      // (sum_row, softmax, layer norm's outputs), so a NaN sum need only be a NaN on both sides.
      const float serial_sum = SerialRow{}.sum<float>(len, load), warp_sum = replay_warp_sum(x);
      if (std::isnan(serial_sum)) {
        EXPECT_TRUE(std::isnan(warp_sum)) << what;
      } else {
        EXPECT_EQ(bits(warp_sum), bits(serial_sum)) << what;
      }
      EXPECT_EQ(bits(replay_warp_max(x)), bits(SerialRow{}.max<float>(len, load))) << what;
    }
  }
}

// ---- optimizer elements: the GPU's form against the CPU's fused step, and against f64 ----

struct AdamCase {
  std::string name;
  FusedAdamOptions o;
};
std::vector<AdamCase> adam_cases() {
  std::vector<AdamCase> cases;
  for (const bool maximize : {false, true}) {
    for (const int decay : {0, 1, 2}) {  // none, Adam's coupled, AdamW's decoupled
      for (const double beta1 : {0.9, 0.3}) {  // lerp weight 0.1 (first form) and 0.7 (second form)
        for (const bool amsgrad : {false, true}) {
          FusedAdamOptions o;
          o.lr = 1e-2;
          o.beta1 = beta1;
          o.beta2 = 0.99;
          o.eps = 1e-8;
          o.weight_decay = decay == 0 ? 0.0 : 0.05;
          o.decoupled_weight_decay = decay == 2;
          o.maximize = maximize;
          o.amsgrad = amsgrad;
          cases.push_back({std::string(maximize ? "maximize " : "") + (decay == 0 ? "no decay" : decay == 1 ? "Adam decay" : "AdamW decay") +
                               " beta1 " + std::to_string(beta1) + (amsgrad ? " amsgrad" : ""),
                           o});
        }
      }
    }
  }
  return cases;
}

std::vector<float> optim_values(std::uint64_t seed, std::int64_t n, double scale, bool edges) {
  Generator gen(seed);
  const std::vector<double> v = randn({n}, gen).values();
  std::vector<float> out;
  for (double d : v) out.push_back(static_cast<float>(d * scale));
  if (edges) {
    const float e[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 0.0f,
                       -0.0f, 1e-40f, 3e38f, -3e38f};
    for (std::size_t i = 0; i < std::size(e); ++i) out[i * 5] = e[i];
  }
  return out;
}

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, {DType::f32});
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

TEST(row_functors_test, adam_element_with_run_time_flags_is_the_cpu_fused_steps_bits_in_every_configuration) {
  const std::int64_t n = 4099;  // several parallel chunks
  for (const AdamCase& c : adam_cases()) {
    std::vector<float> p = optim_values(1, n, 1.0, true), m = optim_values(2, n, 0.1, true),
                       v = optim_values(3, n, 0.01, false), mx = optim_values(4, n, 0.01, false);
    for (float& x : v) x = std::fabs(x);
    for (float& x : mx) x = std::fabs(x);
    Tensor tp = f32_tensor(p), tm = f32_tensor(m), tv = f32_tensor(v), tmx = f32_tensor(mx);
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = optim_values(10 + static_cast<std::uint64_t>(step), n, 1.0, step == 2);
      const Tensor tg = f32_tensor(g);
      FusedAdamTensor t;
      t.param = tp.kernel_view();
      t.grad = tg.kernel_view();
      t.exp_avg = tm.kernel_view();
      t.exp_avg_sq = tv.kernel_view();
      if (c.o.amsgrad) t.max_exp_avg_sq = tmx.kernel_view();
      t.step = step;
      cpu::fused_adam_step({t}, c.o, nullptr);
      // The GPU kernel's loop body, serially.
      const AdamScalars s = adam_scalars(c.o);
      const AdamFlags f = adam_flags(c.o);
      const AdamBiasCorrection bc = adam_bias_correction(c.o, step);
      for (std::int64_t i = 0; i < n; ++i) adam_element(f, s, bc, p[i], g[i], m[i], v[i], f.amsgrad ? &mx[i] : nullptr);
      const std::string what = c.name + " step " + std::to_string(step);
      expect_same_bits(p.data(), static_cast<const float*>(tp.data()), n, what + " param");
      expect_same_bits(m.data(), static_cast<const float*>(tm.data()), n, what + " exp_avg");
      expect_same_bits(v.data(), static_cast<const float*>(tv.data()), n, what + " exp_avg_sq");
      if (c.o.amsgrad) expect_same_bits(mx.data(), static_cast<const float*>(tmx.data()), n, what + " max_exp_avg_sq");
    }
  }
}

// PyTorch's Adam/AdamW update in f64 on finite values: the f32 element must agree to a few f32 roundings.
TEST(row_functors_test, adam_element_matches_an_f64_adam_and_adamw) {
  const std::int64_t n = 200;
  for (const AdamCase& c : adam_cases()) {
    const FusedAdamOptions& o = c.o;
    std::vector<float> p = optim_values(1, n, 1.0, false), m(static_cast<std::size_t>(n), 0.0f),
                       v(static_cast<std::size_t>(n), 0.0f), mx(static_cast<std::size_t>(n), 0.0f);
    std::vector<double> pd(p.begin(), p.end()), md(static_cast<std::size_t>(n), 0.0), vd = md, mxd = md;
    for (std::int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = optim_values(10 + static_cast<std::uint64_t>(step), n, 1.0, false);
      const AdamBiasCorrection bc = adam_bias_correction(o, step);
      const double bc1 = 1 - std::pow(o.beta1, step), bc2 = 1 - std::pow(o.beta2, step);
      for (std::int64_t i = 0; i < n; ++i) {
        adam_element(adam_flags(o), adam_scalars(o), bc, p[i], g[i], m[i], v[i], &mx[i]);
        double gi = o.maximize ? -static_cast<double>(g[i]) : static_cast<double>(g[i]);
        if (o.weight_decay != 0 && o.decoupled_weight_decay) pd[i] *= 1 - o.lr * o.weight_decay;
        if (o.weight_decay != 0 && !o.decoupled_weight_decay) gi += o.weight_decay * pd[i];
        md[i] = o.beta1 * md[i] + (1 - o.beta1) * gi;
        vd[i] = o.beta2 * vd[i] + (1 - o.beta2) * gi * gi;
        mxd[i] = std::max(mxd[i], vd[i]);
        const double second = o.amsgrad ? mxd[i] : vd[i];
        const double update = o.lr / bc1 * md[i] / (std::sqrt(second) / std::sqrt(bc2) + o.eps);
        pd[i] -= update;
        const std::string what = c.name + " step " + std::to_string(step) + " element " + std::to_string(i);
        // Each step's update is lr-sized; a few dozen f32 roundings of the values involved.
        EXPECT_NEAR(p[i], pd[i], 64 * kU32 * (std::fabs(pd[i]) + o.lr * step)) << what;
        EXPECT_NEAR(m[i], md[i], 16 * kU32 * (std::fabs(md[i]) + std::fabs(gi))) << what;
        EXPECT_NEAR(v[i], vd[i], 16 * kU32 * (vd[i] + gi * gi)) << what;
      }
    }
  }
}

TEST(row_functors_test, sgd_step_with_run_time_options_is_the_cpu_fused_steps_bits_and_matches_f64) {
  const std::int64_t n = 4099;
  for (const double momentum : {0.0, 0.9}) {
    for (const bool nesterov : {false, true}) {
      for (const bool maximize : {false, true}) {
        for (const double weight_decay : {0.0, 0.01}) {
          if (nesterov && momentum == 0) continue;
          FusedSgdOptions o;
          o.lr = 0.05;
          o.momentum = momentum;
          o.dampening = momentum != 0 && !nesterov ? 0.25 : 0.0;
          o.nesterov = nesterov;
          o.maximize = maximize;
          o.weight_decay = weight_decay;
          const std::string name = "momentum " + std::to_string(momentum) + (nesterov ? " nesterov" : "") +
                                   (maximize ? " maximize" : "") + " decay " + std::to_string(weight_decay);
          std::vector<float> p = optim_values(1, n, 1.0, true), buf(static_cast<std::size_t>(n), 0.0f);
          std::vector<double> pd(p.begin(), p.end()), bufd(static_cast<std::size_t>(n), 0.0);
          Tensor tp = f32_tensor(p), tb = f32_tensor(buf);
          const SgdStep step = sgd_step(o);
          for (int k = 0; k < 3; ++k) {
            const std::vector<float> g = optim_values(20 + static_cast<std::uint64_t>(k), n, 1.0, k == 1);
            const Tensor tg = f32_tensor(g);
            FusedSgdTensor t;
            t.param = tp.kernel_view();
            t.grad = tg.kernel_view();
            if (momentum != 0) t.momentum_buffer = tb.kernel_view();
            t.first_step = k == 0;
            cpu::fused_sgd_step({t}, o, nullptr);
            for (std::int64_t i = 0; i < n; ++i) {
              const bool finite = std::isfinite(pd[i]) && std::isfinite(g[i]) && std::isfinite(p[i]) &&
                                  (momentum == 0 || std::isfinite(buf[i]));
              p[i] = step(p[i], g[i], step.has_momentum ? &buf[i] : nullptr, k == 0);
              // PyTorch's SGD in f64 on the finite elements.
              double gi = maximize ? -static_cast<double>(g[i]) : static_cast<double>(g[i]);
              gi += weight_decay * pd[i];
              if (momentum != 0) {
                bufd[i] = k == 0 ? gi : momentum * bufd[i] + (1 - o.dampening) * gi;
                gi = nesterov ? gi + momentum * bufd[i] : bufd[i];
              }
              pd[i] -= o.lr * gi;
              // Values near the f32 limit may overflow in f32 and not in f64: the bitwise check above covers them.
              if (finite && std::isfinite(pd[i]) && std::isfinite(p[i])) {
                EXPECT_NEAR(p[i], pd[i], 32 * kU32 * (std::fabs(pd[i]) + o.lr * 8 * (std::fabs(gi) + 1))) << name << " " << i;
              } else {
                pd[i] = p[i];  // the f64 run follows the f32 one past a non-finite value
                if (momentum != 0) bufd[i] = buf[i];
              }
            }
            expect_same_bits(p.data(), static_cast<const float*>(tp.data()), n, name + " param");
            if (momentum != 0) expect_same_bits(buf.data(), static_cast<const float*>(tb.data()), n, name + " buffer");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ampscope

namespace ampscope {
namespace {

// abs moves values: for every f32 NaN pattern of a stride through the payload space (quiet and signalling,
// both signs), every f32 value of a few exponents and the special values, AbsFn's result is the input's
// bits with the sign bit cleared, nothing else (the GPU compiles the same body; PTX's abs.f32 would not
// promise it for NaN). Doubles likewise on a sample.
TEST(value_moving_functors_test, abs_clears_only_the_sign_bit_including_nan_payloads) {
  const AbsFn abs_fn;
  std::uint64_t checked = 0;
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 0x10001ull) {  // 65,536 patterns over all exponents
    const auto x = static_cast<std::uint32_t>(u);
    float f;
    std::memcpy(&f, &x, 4);
    const float r = abs_fn(f);
    std::uint32_t rb;
    std::memcpy(&rb, &r, 4);
    ASSERT_EQ(rb, x & 0x7FFFFFFFu) << std::hex << x;
    ++checked;
  }
  for (std::uint32_t x : {0x7F800001u, 0xFF800001u, 0x7FC00001u, 0xFFC12345u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x80000000u,
                          0xFF800000u, 0x80000001u}) {
    float f;
    std::memcpy(&f, &x, 4);
    const float r = abs_fn(f);
    std::uint32_t rb;
    std::memcpy(&rb, &r, 4);
    EXPECT_EQ(rb, x & 0x7FFFFFFFu) << std::hex << x;
  }
  for (std::uint64_t x : {0x7FF0000000000001ull, 0xFFF8000000000077ull, 0xFFFFFFFFFFFFFFFFull, 0x8000000000000000ull,
                          0xBFF0000000000000ull, 0xFFF0000000000000ull}) {
    double f;
    std::memcpy(&f, &x, 8);
    const double r = abs_fn(f);
    std::uint64_t rb;
    std::memcpy(&rb, &r, 8);
    EXPECT_EQ(rb, x & 0x7FFFFFFFFFFFFFFFull) << std::hex << x;
  }
  EXPECT_EQ(abs_fn(std::int64_t{-5}), 5);
  EXPECT_GT(checked, 60000u);
}

}  // namespace
}  // namespace ampscope

namespace ampscope {
namespace {

std::uint16_t f16b(float f) { return detail::float_to_f16_bits(f); }

// The rank fold of a max collective (kernels/rank_fold.h, run by the NCCL communicator on the GPU) against
// the rule process_group.h states, worked by hand: three ranks, element by element.
TEST(rank_fold_test, max_over_ranks_keeps_the_lowest_ranks_nan_bits_and_the_lower_ranks_tie) {
  const float nan1 = detail::bits_float(0x7FC00011u), nan2 = detail::bits_float(0xFFC00022u);
  // parts[p * 5 + i]: rank p's element i.
  const std::vector<float> parts = {
      1.0f, -0.0f, 2.0f,  nan1, -1.0f,   // rank 0
      3.0f, 0.0f,  nan2,  nan2, -5.0f,   // rank 1
      2.0f, -0.0f, 9.0f,  1.0f, -1.0f};  // rank 2
  const std::vector<std::uint32_t> want = {detail::float_bits(3.0f), 0x80000000u /* rank 0's -0 */, 0xFFC00022u,
                                           0x7FC00011u, detail::float_bits(-1.0f)};
  for (std::int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(detail::float_bits(rank_fold_max(parts.data(), 3, 5, i, WidenSame{})), want[static_cast<std::size_t>(i)])
        << "element " << i;
  }
  // One rank: its own bits, NaN payload included.
  EXPECT_EQ(detail::float_bits(rank_fold_max(parts.data(), 1, 5, 3, WidenSame{})), 0x7FC00011u);
  // f16 and bf16 storage compare through float: 65504 > 1, -inf < -0, a payload NaN from rank 2.
  const std::vector<std::uint16_t> h = {f16b(1.0f), 0xFC00u, 0x3C00u, f16b(65504.0f), 0x8000u, 0x3C00u,
                                        f16b(2.0f), 0x7C00u, 0x7E05u};
  EXPECT_EQ(rank_fold_max(h.data(), 3, 3, 0, WidenF16Bits{}), f16b(65504.0f));
  EXPECT_EQ(rank_fold_max(h.data(), 3, 3, 1, WidenF16Bits{}), 0x7C00u);
  EXPECT_EQ(rank_fold_max(h.data(), 3, 3, 2, WidenF16Bits{}), 0x7E05u);
  const std::vector<std::uint16_t> b = {0x3F80u, 0xFFC1u, 0x4000u, 0x7FC2u};  // 1, NaN | 2, NaN: two ranks
  EXPECT_EQ(rank_fold_max(b.data(), 2, 2, 0, WidenBf16Bits{}), 0x4000u);
  EXPECT_EQ(rank_fold_max(b.data(), 2, 2, 1, WidenBf16Bits{}), 0xFFC1u);
}

// Against an independent statement of the rule on random data with NaNs and ties: the first NaN in rank
// order if any, else the first rank holding the largest value.
TEST(rank_fold_test, random_columns_match_first_nan_else_first_largest) {
  std::uint64_t state = 12345;
  auto next = [&] { state = state * 6364136223846793005ull + 1442695040888963407ull; return state >> 33; };
  const int ranks = 4;
  const std::int64_t n = 2000;
  std::vector<float> parts(static_cast<std::size_t>(ranks * n));
  for (float& v : parts) {
    const auto r = next() % 10;
    v = r == 0 ? detail::bits_float(0x7FC00000u | static_cast<std::uint32_t>(next() & 0xFFFF))
        : r == 1 ? -0.0f : static_cast<float>(static_cast<int>(next() % 5) - 2);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    int pick = 0;
    bool found_nan = false;
    for (int p = 0; p < ranks && !found_nan; ++p) {
      const float v = parts[static_cast<std::size_t>(p * n + i)];
      if (std::isnan(v)) { pick = p; found_nan = true; }
    }
    if (!found_nan) {
      for (int p = 1; p < ranks; ++p)
        if (parts[static_cast<std::size_t>(p * n + i)] > parts[static_cast<std::size_t>(pick * n + i)]) pick = p;
    }
    ASSERT_EQ(detail::float_bits(rank_fold_max(parts.data(), ranks, n, i, WidenSame{})),
              detail::float_bits(parts[static_cast<std::size_t>(pick * n + i)]))
        << "element " << i;
  }
}

}  // namespace
}  // namespace ampscope
