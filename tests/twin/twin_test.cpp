// tests/twin/twin_test.cpp: the f32 twin (probes/twin.h). Its errors against an f64 computation done here,
// independently of the twin; planted precision losses (a cancellation ranked first, a sum that stops
// growing); and a run that is bit-identical with and without the twin.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "probes/probe.h"
#include "probes/twin.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

using testing::NullSink;
using testing::row_of;

// The errors of f16 values against an f64 reference, as probes/twin.h defines them for f16.
testing::Errors errors_f16(const std::vector<double>& y, const std::vector<double>& r) {
  return testing::errors_of(y, r, DType::f16);
}

// sigmoid then 1 - s on f16 logits, the twin's numbers against f64 computed here.
TEST(Twin, ErrorsMatchAnF64ComputationOnSmallTensors) {
  const std::vector<double> logits{0.5, -2.0, 3.0, 9.0, 12.0, 6.5};
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  Tensor s, t;
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    const Tensor z = from_values(logits, {6}).to(DType::f16);
    s = sigmoid(z);
    t = rsub(s, 1.0);
    step.end({});
  }
  std::vector<double> ref_s, ref_t;
  for (double z : logits) {
    const double zz = static_cast<double>(static_cast<float>(f16(static_cast<float>(z))));
    ref_s.push_back(1.0 / (1.0 + std::exp(-zz)));
    ref_t.push_back(1.0 - ref_s.back());
  }
  const probe::PrecisionRow& sig = row_of(twin->rows(), "sigmoid");
  const testing::Errors es = errors_f16(s.values(), ref_s);
  // The twin's reference is f32, 2^-24 relative from f64: its relative errors differ from ours by about that.
  EXPECT_NEAR(sig.local_max_rel, es.max_rel, 1e-6);
  EXPECT_NEAR(sig.local_mean_rel, es.mean_rel, 1e-6);
  EXPECT_NEAR(sig.local_max_ulp, es.max_ulp, 1e-2);
  EXPECT_NEAR(sig.acc_max_rel, es.max_rel, 1e-6);  // the logits are data: the twin's inputs are the same
  EXPECT_LT(es.max_rel, std::ldexp(1.0, -11));      // sigmoid rounds once: at most half an f16 ulp
  EXPECT_EQ(sig.flips, 2);                           // sigmoid(9) and sigmoid(12) round to exactly 1 in f16

  const probe::PrecisionRow& sub = row_of(twin->rows(), "rsub");
  const testing::Errors et = errors_f16(t.values(), ref_t);
  // Local: 1 - s on the f16 s, in f64, rounded by f16 alone.
  std::vector<double> own_t;
  for (double v : s.values()) own_t.push_back(1.0 - v);
  const testing::Errors lt = errors_f16(t.values(), own_t);
  EXPECT_NEAR(sub.local_max_rel, lt.max_rel, 1e-6);
  EXPECT_NEAR(sub.local_max_ulp, lt.max_ulp, 1e-2);
  // 1 - 1 = 0 where 1 - sigmoid(9) = 1.2e-4: relative to the floor 2^-11 * (1 - sigmoid(-2)) = 4.3e-4.
  EXPECT_NEAR(et.max_rel, (1.0 - ref_s[3]) / ((1.0 - ref_s[1]) * std::ldexp(1.0, -11)), 1e-9);
  EXPECT_NEAR(sub.acc_max_rel, et.max_rel, 1e-3);
  EXPECT_NEAR(sub.acc_mean_rel, et.mean_rel, 1e-3);
  EXPECT_EQ(sub.flips, 2);
  EXPECT_NEAR(sub.in_acc_max_rel, es.max_rel, 1e-6);  // its input is sigmoid's output, against sigmoid's twin
  EXPECT_NEAR(sub.bits, -std::log2(et.max_rel), 1e-3);
  // (|1| + |s|) / |1 - s| is largest at z = 12: 1 - sigmoid(12) = 6.1e-6 lies under the f16 floor 2^-14.
  double cond = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    cond = std::max(cond, (1.0 + ref_s[i]) / std::max(ref_t[i], std::ldexp(1.0, -14)));
  }
  EXPECT_NEAR(sub.cond, cond, cond * 1e-3);
}

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> hidden, out;
  explicit Net(Generator& gen) : Module("Net") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(4, 16, gen));
    out = register_module("out", std::make_shared<nn::Linear>(16, 1, gen));
  }
  Tensor forward(const Tensor& x) override { return (*out)(tanh((*hidden)(x))); }
};

struct BceRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::vector<probe::PrecisionRow> rows;
};

// A hand-written BCE on sigmoid, trained in f16 as a user writes it, with or without the twin.
BceRun train_bce(bool with_twin, std::int64_t steps = 6) {
  Generator gen(11);
  Net model(gen);
  optim::SGD opt(model.parameters(), {.lr = 0.05});
  GradScaler scaler({.device = "cpu", .enabled = true});
  std::shared_ptr<probe::Hook> hook = std::make_shared<probe::Probe>(std::make_shared<NullSink>());
  std::shared_ptr<probe::Twin> twin;
  if (with_twin) hook = twin = std::make_shared<probe::Twin>(hook);
  probe::HookGuard installed(hook);
  const Tensor x = randn({32, 4}, gen) * 6.0;
  const std::vector<double> f = x.values();
  std::vector<double> labels;
  for (std::size_t i = 0; i < 32; ++i) labels.push_back(f[4 * i] + 0.5 * f[4 * i + 1] > 0 ? 1.0 : 0.0);
  const Tensor y = from_values(labels, {32, 1});
  BceRun run;
  for (std::int64_t n = 0; n < steps; ++n) {
    probe::Step step(n);
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(DType::f16);
      const Tensor s = sigmoid(model(x) * 40.0);
      loss = -mean(y * log(s) + (1.0 - y) * log(1.0 - s));
    }
    scaler.scale(loss).backward();
    run.losses.push_back(step.finish(loss, opt, scaler).loss);
  }
  for (const Tensor& p : model.parameters()) run.params.push_back(p.values());
  if (twin) run.rows = twin->rows();
  return run;
}

TEST(Twin, TheRunIsBitIdenticalWithAndWithoutIt) {
  const BceRun plain = train_bce(false), twinned = train_bce(true);
  ASSERT_FALSE(twinned.rows.empty());
  ASSERT_EQ(plain.losses.size(), twinned.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&plain.losses[i], &twinned.losses[i], sizeof(double)), 0) << "step " << i;
  }
  ASSERT_EQ(plain.params.size(), twinned.params.size());
  for (std::size_t p = 0; p < plain.params.size(); ++p) {
    ASSERT_EQ(plain.params[p].size(), twinned.params[p].size());
    EXPECT_EQ(std::memcmp(plain.params[p].data(), twinned.params[p].data(), plain.params[p].size() * sizeof(double)), 0)
        << "parameter " << p;
  }
}

// The planted cancellation: 1 - s with s = sigmoid(40 z) rounded to 1 in f16 is where precision entered.
TEST(Twin, ThePlantedCancellationIsRankedFirst) {
  const BceRun run = train_bce(true);
  const std::vector<probe::PrecisionRow> ranked = probe::rank_by_jump(run.rows);
  ASSERT_FALSE(ranked.empty());
  EXPECT_EQ(ranked.front().op, "rsub");
  EXPECT_GT(ranked.front().flips, 0);  // outputs cancelled to 0 while the twin's are not
}

// A long f16 running sum stops growing: every add's own rounding is the loss (local error), and the sum's
// accumulated error grows step after step.
TEST(Twin, ARunningF16SumThatStopsGrowing) {
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  Tensor total;
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    total = from_values({2048.0}, {1}).to(DType::f16);
    const Tensor one = from_values({1.0}, {1}).to(DType::f16);
    for (int i = 0; i < 100; ++i) total = add(total, one);
    step.end({});
  }
  EXPECT_DOUBLE_EQ(total.item(), 2048.0);  // 2048 + 1 rounds back to 2048 in f16 (spacing 2)
  const probe::PrecisionRow& last = twin->rows().back();
  EXPECT_EQ(last.op, "add");
  EXPECT_NEAR(last.acc_max_rel, 100.0 / 2148.0, 1e-9);  // the f32 twin counts to 2148
  EXPECT_NEAR(last.local_max_rel, 1.0 / 2049.0, 1e-9);  // this add alone loses the 1
}

// Condition numbers, worked by hand: (|a| + |b|) / |a + b| and sum|x| / |sum x|.
TEST(Twin, ConditionNumbersOfAddAndSum) {
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    const Tensor a = from_values({1000.0, 2.0}, {2}).to(DType::f16);
    const Tensor b = from_values({-999.5, 2.0}, {2}).to(DType::f16);
    add(a, b);                                                // (1000 + 999.5) / 0.5 = 3999; (2 + 2) / 4 = 1
    sum(from_values({1000.0, -1000.0, 0.5}, {3}).to(DType::f16));  // 2000.5 / 0.5 = 4001
    step.end({});
  }
  EXPECT_DOUBLE_EQ(row_of(twin->rows(), "add").cond, 3999.0);
  EXPECT_DOUBLE_EQ(row_of(twin->rows(), "sum").cond, 4001.0);
  EXPECT_DOUBLE_EQ(row_of(twin->rows(), "add").acc_max_rel, 0.0);  // every value exact in f16
}

// The accumulated errors' histogram on a tensor worked by hand (f64 values, judged as f16: p = 11). The largest
// finite |r| is 8, so the floor is max(2^-14, 8 * 2^-11) = 2^-8.
TEST(Twin, ErrorHistogramOfAHandWorkedTensor) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> y{1.0,  1.0 + std::ldexp(1.0, -10), 1.5, 3.0, 2.0 + std::ldexp(1.0, -20), 0.0, std::ldexp(1.0, -12),
                              inf,  1.0, 1.0 + std::ldexp(1.0, -40)};
  const std::vector<double> r{1.0, 1.0, 1.0, 1.0, 2.0, 0.5, 0.0, 8.0, inf, 1.0};
  const TensorOptions f64{.dtype = DType::f64};
  const probe::ErrorStats s = probe::compare(from_values(y, {10}, f64), from_values(r, {10}, f64), DType::f16, "mul");
  std::array<std::int64_t, trace::kErrorBins> bins{};
  bins[10] = 1;  // 1 + 2^-10 against 1: 2^-10
  bins[1] = 1;   // 1.5 against 1: 2^-1, one bit
  bins[0] = 1;   // 3 against 1: 200%, no bit
  bins[21] = 1;  // 2 + 2^-20 against 2: 2^-21
  bins[4] = 1;   // 2^-12 against 0: 2^-12 / 2^-8 = 2^-4
  bins[25] = 1;  // 1 + 2^-40 against 1: beyond the last bucket, clamped into it
  EXPECT_EQ(s.error_bins, bins);
  EXPECT_EQ(s.exact, 1);  // 1 against 1
  EXPECT_EQ(s.flips, 2);  // 0 against 0.5, inf against 8; the infinite reference is left out
  EXPECT_EQ(s.counted, 8);  // finite y and r: the flip to 0 is among them
}

// compare() on f16, bf16 and f32 tensors (the path that reads them as floats, four at a time) against the
// definition in probes/twin.h computed here in f64 with libm's log2, ilogb and ldexp, element by element in
// order: every field equal, bit for bit. The values: every f16 (or bf16) bit pattern, NaN, infinities,
// zeros and subnormals included, against references that put the relative errors on powers of two (the
// bucket boundaries), just off them, at 0, at flips (to 0, to the largest finite value, to 1 for tanh) and at
// seeded random distances; for f32, seeded random values and references.
probe::ErrorStats errors_by_definition(const std::vector<double>& y, const std::vector<double>& r, DType dtype,
                                       bool saturates) {
  const int p = dtype == DType::f16 ? 11 : dtype == DType::bf16 ? 8 : 24;
  const int emin = dtype == DType::f16 ? -14 : -126;
  const double top = dtype == DType::f16 ? 65504.0 : dtype == DType::bf16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  double scale = 0;
  for (double v : r) {
    if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  }
  const double floor = std::max(std::ldexp(1.0, emin), std::ldexp(scale, -p));
  probe::ErrorStats s;
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(r[i])) continue;
    if (!std::isfinite(y[i])) {
      ++s.flips;
      continue;
    }
    const bool flip = (y[i] == 0 && r[i] != 0) || (std::fabs(y[i]) == top && std::fabs(r[i]) < top) ||
                      (saturates && std::fabs(y[i]) == 1 && std::fabs(r[i]) != 1);
    const double err = std::fabs(y[i] - r[i]);
    const double rel = err / std::max(std::fabs(r[i]), floor);
    const int exponent = r[i] == 0 ? emin : std::max(emin, std::ilogb(r[i]));
    if (flip) {
      ++s.flips;
    } else if (rel == 0) {
      ++s.exact;
    } else {
      const double bucket = std::floor(-std::log2(rel));
      ++s.error_bins[static_cast<std::size_t>(std::clamp(bucket, 0.0, double{trace::kErrorBins - 1}))];
    }
    s.max_rel = std::max(s.max_rel, rel);
    s.max_ulp = std::max(s.max_ulp, err / std::ldexp(1.0, exponent - (p - 1)));
    sum += rel;
    ++s.counted;
  }
  s.mean_rel = s.counted > 0 ? sum / static_cast<double>(s.counted) : 0;
  s.bits = s.max_rel == 0 ? p : std::clamp(-std::log2(s.max_rel), 0.0, static_cast<double>(p)) + 0.0;
  return s;
}

void expect_same_stats(const probe::ErrorStats& got, const probe::ErrorStats& want) {
  EXPECT_EQ(got.counted, want.counted);
  EXPECT_EQ(got.flips, want.flips);
  EXPECT_EQ(got.exact, want.exact);
  EXPECT_EQ(got.error_bins, want.error_bins);
  for (const auto& [name, a, b] : {std::tuple{"max_rel", got.max_rel, want.max_rel}, {"mean_rel", got.mean_rel, want.mean_rel},
                                   {"max_ulp", got.max_ulp, want.max_ulp}, {"bits", got.bits, want.bits}}) {
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << name << ": " << a << " vs " << b << " by the definition";
  }
}

TEST(Twin, CompareOnHalfAndFloatTensorsMatchesItsDefinitionBitForBit) {
  std::mt19937_64 gen(2026);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> shift(1, 40);
  // A reference for y: the i-th of a cycle of kinds of distance.
  const auto reference_for = [&](double y, std::size_t i, double top) {
    switch (i % 12) {
      case 0: return y;                                               // exact
      case 1: return y * (1 + std::ldexp(1.0, -shift(gen)));          // a power-of-two error, about
      case 2: return y / (1 + std::ldexp(1.0, -shift(gen)));          // just under one
      case 3: return y + std::ldexp(y, -shift(gen)) * unit(gen);      // random
      case 4: return y == 0 ? std::ldexp(1.0, -shift(gen)) : y * 2;   // a flip to 0, or 100%
      case 5: return y * (1 + unit(gen) * 1e-3);
      case 6: return std::fabs(y) == top ? y * 0.999 : y * 1.5;       // a flip to the largest finite value
      case 7: return std::fabs(y) == 1 ? y * (1 - 1e-6) : y;          // tanh's flip to 1
      case 8: return i % 24 == 8 ? std::numeric_limits<double>::infinity() : -y;
      case 9: return i % 24 == 9 ? std::numeric_limits<double>::quiet_NaN() : y * 0.75;
      case 10: return 0.0;
      default: return y + unit(gen);
    }
  };
  for (const DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (const char* op : {"mul", "tanh"}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << op);
      std::vector<double> yv, rv;
      const double top = dtype == DType::f16 ? 65504.0 : dtype == DType::bf16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
      for (std::uint32_t b = 0; b < 65536 * 3; ++b) {
        const std::uint16_t h = static_cast<std::uint16_t>(b);
        double y = dtype == DType::f16 ? static_cast<float>(f16::from_bits(h))
                   : dtype == DType::bf16 ? static_cast<float>(bf16::from_bits(h))
                                          : static_cast<float>(std::ldexp(unit(gen), shift(gen) - 20));
        if (dtype == DType::f32 && b % 97 == 0) y = b % 2 ? 1.0 : -1.0;  // for tanh
        if (dtype == DType::f32 && b % 7 == 0) y = 0.0;
        yv.push_back(y);
        rv.push_back(reference_for(y, b / 3 + b % 3 * 5, top));
      }
      yv.resize(yv.size() - 3);  // not a multiple of four
      rv.resize(yv.size());
      const Tensor y = from_values(yv, {static_cast<std::int64_t>(yv.size())}, {.dtype = dtype});
      const Tensor r = from_values(rv, {static_cast<std::int64_t>(rv.size())}, {.dtype = DType::f32});
      ASSERT_EQ(std::memcmp(y.values().data(), yv.data(), yv.size() * sizeof(double)), 0) << "y not exact in its dtype";
      const probe::ErrorStats want = errors_by_definition(y.values(), r.values(), dtype, std::string_view(op) == "tanh");
      ASSERT_GT(want.exact, 0);
      ASSERT_GT(want.flips, 0);
      ASSERT_GT(std::accumulate(want.error_bins.begin() + 1, want.error_bins.end() - 1, std::int64_t{0}), 0);
      expect_same_stats(probe::compare(y, r, dtype, op), want);
      // The same comparison with y and r swapped, both f32 values.
      const probe::ErrorStats swapped = errors_by_definition(r.values(), y.values(), dtype, false);
      expect_same_stats(probe::compare(r, y.to(DType::f32), dtype, "mul"), swapped);
    }
  }
}

// A value against its own exact widening (the local value of relu or max_pool2d, a view's backward): compare()
// answers such a pair from one scan, without the comparison pass. Its errors are still those of the definition
// above: every f16 or bf16 bit pattern three times over (NaN and infinities left out, zeros and subnormals
// exact), with f32 values too; and the same pair with one element changed, last (the scan reads to the end
// before it finds it) or in the middle, which takes the comparison pass and gives the definition's numbers; and
// both again as transposed views.
TEST(Twin, CompareOfAValueWithItsOwnWideningMatchesItsDefinition) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::int64_t n = 3 * 65536 + 5;  // split over threads, not a multiple of four
    Tensor y = Tensor::empty({n}, {.dtype = dtype});
    auto* bits = static_cast<std::uint16_t*>(y.data());
    for (std::int64_t i = 0; i < n; ++i) bits[i] = static_cast<std::uint16_t>(i * 40503);  // every pattern, mixed
    const Tensor r = y.to(DType::f32);
    const probe::ErrorStats want = errors_by_definition(y.values(), r.values(), dtype, false);
    ASSERT_EQ(want.exact, want.counted);
    ASSERT_LT(want.counted, n);  // the NaNs and infinities are left out
    expect_same_stats(probe::compare(y, r, dtype, "relu"), want);
    expect_same_stats(probe::compare(r, r, dtype, "relu"), want);  // f32 against f32
    for (const std::int64_t at : {n - 1, n / 2}) {
      Tensor other = r.clone();
      other.data_as<float>()[at] = 1.5f * other.data_as<float>()[at] + 1.0f;
      const probe::ErrorStats changed = errors_by_definition(y.values(), other.values(), dtype, false);
      ASSERT_EQ(changed.exact + 1, changed.counted);
      expect_same_stats(probe::compare(y, other, dtype, "relu"), changed);
    }
    // Both transposed alike (a transpose's gradient and its twin): scanned as they lie in memory when identical;
    // with one element changed, compared in element order.
    const Tensor yt = y.slice(0, 0, 256 * 768).reshape({256, 768}).transpose(0, 1);
    const Tensor rt = r.slice(0, 0, 256 * 768).reshape({256, 768}).transpose(0, 1);
    ASSERT_FALSE(yt.is_contiguous());
    const probe::ErrorStats want_t = errors_by_definition(yt.values(), rt.values(), dtype, false);
    ASSERT_EQ(want_t.exact, want_t.counted);
    expect_same_stats(probe::compare(yt, rt, dtype, "relu"), want_t);
    Tensor other = r.slice(0, 0, 256 * 768).clone();
    other.data_as<float>()[1000] = 1.5f * other.data_as<float>()[1000] + 1.0f;
    const Tensor ot = other.reshape({256, 768}).transpose(0, 1);
    const probe::ErrorStats changed_t = errors_by_definition(yt.values(), ot.values(), dtype, false);
    ASSERT_EQ(changed_t.exact + 1, changed_t.counted);
    expect_same_stats(probe::compare(yt, ot, dtype, "relu"), changed_t);
  }
}

// A large unary element-wise op on f16 or bf16 (every bit pattern, four times over, shuffled): the twin's local
// errors, whose reference it looks up in a table of the op's f32 values, are those of the op run in f32 on the
// whole input widened, here, outside the twin, bit for bit.
TEST(Twin, ALargeElementwiseOpsLocalErrorsAreThoseOfTheOpRunInF32OnItsInput) {
  const std::vector<std::pair<const char*, Tensor (*)(const Tensor&)>> ops{
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x, GeluApproximation::tanh); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"mul", [](const Tensor& x) { return x * 0.125; }},
      {"pow", [](const Tensor& x) { return pow(x, 3.0); }},
  };
  std::mt19937_64 gen(7);
  std::vector<std::uint16_t> patterns(4 * 65536);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<std::uint16_t>(i);
  std::shuffle(patterns.begin(), patterns.end(), gen);
  for (const DType dtype : {DType::f16, DType::bf16}) {
    Tensor x = Tensor::empty({4, 65536}, {.dtype = dtype});
    std::memcpy(x.data(), patterns.data(), patterns.size() * sizeof(std::uint16_t));
    for (const auto& [name, op] : ops) {
      SCOPED_TRACE(::testing::Message() << name << " on " << dtype_name(dtype));
      auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
      Tensor y;
      {
        probe::HookGuard installed(twin);
        probe::StepScope step(0);
        y = op(x);
        step.end({});
      }
      ASSERT_EQ(twin->rows().size(), 1u);
      const probe::PrecisionRow& row = twin->rows()[0];
      ASSERT_EQ(row.op, name);
      const probe::ErrorStats want = probe::compare(y, op(x.to(DType::f32)), dtype, name);
      for (const auto& [field, got, expected] :
           {std::tuple{"local_max_rel", row.local_max_rel, want.max_rel}, {"local_mean_rel", row.local_mean_rel, want.mean_rel},
            {"local_max_ulp", row.local_max_ulp, want.max_ulp}, {"acc_max_rel", row.acc_max_rel, want.max_rel},
            {"acc_mean_rel", row.acc_mean_rel, want.mean_rel}, {"bits", row.bits, want.bits}}) {
        EXPECT_EQ(std::memcmp(&got, &expected, sizeof got), 0) << field << ": " << got << " vs " << expected;
      }
      EXPECT_EQ(row.error_bins, want.error_bins);
      EXPECT_EQ(row.exact, want.exact);
      EXPECT_EQ(row.flips, want.flips);
    }
  }
}

// What the twin does not compute again is counted, and dropout's generator is not advanced by it.
TEST(Twin, CountsTheOpsItDoesNotCover) {
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  Generator with_twin(5), without(5);
  Tensor kept;
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    const Tensor x = from_values({1.0, 2.0, 3.0, 4.0}, {4}).to(DType::f16);  // "to": no body to run again
    kept = dropout(x, 0.5, true, with_twin);
    step.end({});
  }
  const Tensor plain = dropout(from_values({1.0, 2.0, 3.0, 4.0}, {4}).to(DType::f16), 0.5, true, without);
  EXPECT_EQ(kept.values(), plain.values());
  EXPECT_EQ(twin->uncovered().at("to"), 1);
  EXPECT_EQ(twin->uncovered().at("dropout"), 1);
  EXPECT_TRUE(twin->rows().empty());
}

// Rankings by local error and by trend, on rows whose numbers are chosen here.
TEST(Twin, RanksByLocalErrorAndByTrend) {
  const auto row = [](std::int64_t step, std::int64_t seq, const char* op, bool local, double local_mean, double acc_mean) {
    probe::PrecisionRow r;
    r.step = step;
    r.seq = seq;
    r.op = op;
    r.out_dtype = "f16";
    r.local = local;
    r.local_mean_rel = local_mean;
    r.acc_mean_rel = acc_mean;
    return r;
  };
  // sum's error doubles each step (1 bit per step); mul's halves; log ran in f32 (no local error).
  const std::vector<probe::PrecisionRow> rows{
      row(0, 0, "sum", true, 1e-4, 0.01),  row(0, 1, "mul", true, 3e-4, 0.04), row(0, 2, "log", false, 0, 0.5),
      row(1, 0, "sum", true, 2e-4, 0.02),  row(1, 1, "mul", true, 1e-4, 0.02), row(1, 2, "log", false, 0, 0.5),
      row(2, 0, "sum", true, 5e-5, 0.04),  row(2, 1, "mul", true, 1e-4, 0.01),
  };
  const std::vector<probe::PrecisionRow> local = probe::rank_by_local(rows);
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].op, "mul");
  EXPECT_EQ(local[0].step, 0);
  EXPECT_EQ(local[1].op, "sum");
  EXPECT_EQ(local[1].step, 1);
  const std::vector<probe::PrecisionTrend> trends = probe::precision_trends(rows);
  ASSERT_EQ(trends.size(), 3u);
  EXPECT_EQ(trends[0].op, "sum");
  EXPECT_NEAR(trends[0].bits_per_step, 1.0, 1e-12);
  EXPECT_EQ(trends[0].steps, 3);
  EXPECT_DOUBLE_EQ(trends[0].first, 0.01);
  EXPECT_DOUBLE_EQ(trends[0].last, 0.04);
  EXPECT_EQ(trends[1].op, "log");
  EXPECT_NEAR(trends[1].bits_per_step, 0.0, 1e-12);
  EXPECT_EQ(trends[2].op, "mul");
  EXPECT_NEAR(trends[2].bits_per_step, -1.0, 1e-12);
}

// A contiguous copy of a transposed output keeps its producer's stamp but holds the values in another order:
// the twin must not take its producer's twin value reshaped for it (that scrambled attention's merged heads
// into errors of 800%). A reshape view of the output is the same order, and is followed.
TEST(Twin, FollowsAReshapeViewButNotACopyOfATransposedOutput) {
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    // Every value exact in f16, so every error against the twin is 0 when the twin follows the right values.
    const Tensor y = from_values({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}).to(DType::f16) * 2.0;
    const Tensor copied = y.transpose(0, 1).contiguous().reshape({2, 3});  // 2 8 4 10 6 12: another order
    const Tensor viewed = y.reshape({3, 2});                                // 2 4 6 8 10 12: the same order
    copied * 1.0;
    viewed * 1.0;
    step.end({});
  }
  const auto& rows = twin->rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[1].followed);  // the copy: taken as it is
  EXPECT_EQ(rows[1].acc_max_rel, 0.0);
  EXPECT_EQ(rows[1].in_acc_max_rel, 0.0);
  EXPECT_TRUE(rows[2].followed);  // the view: the producer's twin value, reshaped
  EXPECT_EQ(rows[2].acc_max_rel, 0.0);
}

TEST(Twin, RefusesANullHookAndEveryBelowOne) {
  EXPECT_THROW(probe::Twin(nullptr), Error);
  EXPECT_THROW(probe::Twin(std::make_shared<probe::Probe>(std::make_shared<NullSink>()), {.every = 0}), Error);
}

}  // namespace
}  // namespace ampscope
