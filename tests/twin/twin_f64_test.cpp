// tests/twin/twin_f64_test.cpp: f64 for f32 ops, on request (probe::TwinOptions::f32_in_f64, `ampscope train
// --twin-f64`). The twin's numbers for f32 ops against f64 computed here; f16 rows unchanged by the option; a
// run bit-identical with and without it; and two precision losses of f32 itself, in models written as a user
// writes them and trained in fp32, ranked first by the report's PRECISION section with remedies that, applied
// to the model and run again, remove them:
//   - a batch variance as E[x^2] - E[x]^2 on features near 300 (spread 1): E[x^2] is about 9e4, where f32's
//     spacing is 2^-7, so the difference of about 1 keeps only a few of its bits (cancellation);
//   - event times as a Unix timestamp (about 1.7e9, where f32's spacing is 128) plus a running sum of gaps of 1
//     to 50 s: every add rounds the gap away (accumulation).
// f32 rounding: p = 24 significand bits, smallest normal 2^-126 (probes/twin.h defines the errors).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/precision.h"
#include "probes/analysis/render.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"
#include "tests/test_support.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;

using testing::Errors;
using testing::NullSink;
using testing::row_of;

Errors errors_f32(const std::vector<double>& y, const std::vector<double>& r) { return testing::errors_of(y, r, DType::f32); }

std::shared_ptr<probe::Twin> f64_twin(bool f32_in_f64 = true) {
  return std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()),
                                       probe::TwinOptions{.f32_in_f64 = f32_in_f64});
}

// exp then exp(x) - 1 on f32 data (the second cancels for small x), and a sum: each against f64 computed here.
TEST(TwinF64, F32OpsMatchAnF64ComputationOnSmallTensors) {
  const std::vector<double> xs{1e-6, 3e-4, 0.1, 1.0 / 3.0, 2.5, -7.25};
  std::vector<double> big;  // 4096 values of 0.1 (i + 1): an f32 sum of them rounds at every add past 2^-4
  for (int i = 0; i < 4096; ++i) big.push_back(0.1 * (i + 1));
  auto twin = f64_twin();
  Tensor x, e, t, s, b;
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    x = from_values(xs, {6});  // f32
    e = exp(x);
    t = e - 1.0;
    b = from_values(big, {4096});
    s = sum(b);
    step.end({});
  }
  ASSERT_EQ(x.dtype(), DType::f32);
  ASSERT_EQ(t.dtype(), DType::f32);
  // exp: the reference is exp in f64 of each f32 input, exactly widened.
  std::vector<double> ref_e, ref_t;
  for (double v : x.values()) {
    ref_e.push_back(std::exp(v));
    ref_t.push_back(ref_e.back() - 1.0);
  }
  const probe::PrecisionRow& er = row_of(twin->rows(), "exp");
  EXPECT_EQ(er.out_dtype, "f32");
  EXPECT_TRUE(er.local);
  EXPECT_EQ(analysis::reference_of(er), "f64");
  const Errors ee = errors_f32(e.values(), ref_e);
  EXPECT_GT(ee.max_rel, 0);                         // exp rounds
  EXPECT_LE(ee.max_rel, std::ldexp(1.0, -23));      // to within an f32 ulp (libm's f32 exp is not always correctly rounded)
  EXPECT_NEAR(er.local_max_rel, ee.max_rel, 1e-15);
  EXPECT_NEAR(er.local_mean_rel, ee.mean_rel, 1e-15);
  EXPECT_NEAR(er.local_max_ulp, ee.max_ulp, 1e-9);
  EXPECT_NEAR(er.acc_max_rel, ee.max_rel, 1e-15);  // data: the twin's inputs are the op's own
  EXPECT_EQ(er.in_acc_max_rel, 0);

  // e - 1: local against (f32 e) - 1 in f64 (exact for e in [1/2, 2], rounded for exp(-7.25)), accumulated
  // against f64's exp(x) - 1.
  const probe::PrecisionRow& tr = row_of(twin->rows(), "sub");
  EXPECT_TRUE(tr.local);
  std::vector<double> own_t;
  for (double v : e.values()) own_t.push_back(v - 1.0);
  const Errors lt = errors_f32(t.values(), own_t);
  EXPECT_GT(lt.max_rel, 0);
  EXPECT_EQ(tr.local_max_rel, lt.max_rel);
  EXPECT_EQ(tr.local_max_ulp, lt.max_ulp);
  const Errors et = errors_f32(t.values(), ref_t);
  EXPECT_GT(et.max_rel, 1e-3);  // exp(1e-6) - 1 in f32: one ulp of 1 (1.2e-7) over 1e-6
  EXPECT_NEAR(tr.acc_max_rel, et.max_rel, 1e-12);
  EXPECT_NEAR(tr.acc_mean_rel, et.mean_rel, 1e-12);
  EXPECT_NEAR(tr.in_acc_max_rel, ee.max_rel, 1e-15);  // its input is exp's output, against exp's f64 twin
  EXPECT_NEAR(tr.bits, -std::log2(et.max_rel), 1e-9);
  // The scalar's condition: (|e| + 1) / |e - 1|, largest at x = 1e-6.
  double cond = 0;
  for (std::size_t i = 0; i < ref_e.size(); ++i) cond = std::max(cond, (std::fabs(ref_e[i]) + 1.0) / std::fabs(ref_t[i]));
  EXPECT_NEAR(tr.cond, cond, cond * 1e-9);

  // sum: the f32 sum against the f64 sum of the same f32 values.
  double ref_sum = 0;
  for (double v : b.values()) ref_sum += v;
  const probe::PrecisionRow& sr = row_of(twin->rows(), "sum");
  const double y = s.values()[0];
  EXPECT_NEAR(sr.local_max_rel, std::fabs(y - ref_sum) / std::fabs(ref_sum), 1e-12);
  EXPECT_NEAR(sr.cond, 1.0, 1e-12);  // positive terms: sum |x| = |sum x|
}

// Without the option, f32 ops on data are not twinned at all: the f32 twin has nothing to compare them with.
TEST(TwinF64, WithoutTheOptionF32OpsHaveNoRows) {
  auto twin = f64_twin(false);
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    const Tensor t = exp(from_values({1e-6, 0.5}, {2})) - 1.0;
    step.end({});
  }
  EXPECT_TRUE(twin->rows().empty());
}

// Under autocast f16: a linear runs in f16 (twinned in f32, as without the option: its row is the same), the
// softmax after it in f32 (autocast's f32 list), twinned in f64 with its input's error against the f32 twin.
TEST(TwinF64, F16OpsKeepTheirF32TwinAndF32OpsGetAnF64One) {
  auto run = [](bool f32_in_f64) {
    Generator gen(5);
    nn::Linear layer(8, 6, gen);
    const Tensor x = randn({4, 8}, gen);
    auto twin = f64_twin(f32_in_f64);
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    AutocastGuard autocast(DType::f16);
    const Tensor p = softmax(layer(x), -1);
    step.end({});
    return twin->rows();
  };
  const std::vector<probe::PrecisionRow> with = run(true), without = run(false);
  const probe::PrecisionRow& lw = row_of(with, "linear");
  const probe::PrecisionRow& lo = row_of(without, "linear");
  EXPECT_EQ(lw.out_dtype, "f16");
  EXPECT_EQ(analysis::reference_of(lw), "f32");
  EXPECT_EQ(lw.local_max_rel, lo.local_max_rel);
  EXPECT_EQ(lw.local_mean_rel, lo.local_mean_rel);
  EXPECT_EQ(lw.acc_max_rel, lo.acc_max_rel);
  EXPECT_EQ(lw.acc_mean_rel, lo.acc_mean_rel);
  EXPECT_EQ(lw.error_bins, lo.error_bins);
  const probe::PrecisionRow& sw = row_of(with, "softmax");
  const probe::PrecisionRow& so = row_of(without, "softmax");
  EXPECT_EQ(sw.out_dtype, "f32");
  EXPECT_TRUE(sw.local);
  EXPECT_FALSE(so.local);  // the f32 twin follows it, no local error
  EXPECT_EQ(analysis::reference_of(sw), "f64");
  EXPECT_EQ(analysis::reference_of(so), "f32");
  EXPECT_GT(sw.local_max_rel, 0);
  EXPECT_LE(sw.local_max_rel, 4 * std::ldexp(1.0, -24));  // softmax in f32 rounds a few times
  // What reaches it is the linear's f16 rounding, in both: measured against the linear's f32 twin.
  EXPECT_EQ(sw.in_acc_max_rel, lw.acc_max_rel);
  EXPECT_EQ(so.in_acc_max_rel, lo.acc_max_rel);
}

// The backward of an f32 matmul, twinned in f64: its gradients g b^T and a^T g against sums in f64 done here
// (g = w exactly: the gradient of sum(y * w) with respect to y). Without the option, f32 nodes have no rows.
TEST(TwinF64, F32BackwardNodesMatchAnF64Computation) {
  Generator gen(41);
  const std::int64_t n = 5, k = 7, m = 3;
  const std::vector<double> av = randn({n, k}, gen).values(), bv = randn({k, m}, gen).values(),
                            wv = randn({n, m}, gen).values();
  auto run = [&](bool f32_in_f64) {
    auto twin = f64_twin(f32_in_f64);
    Tensor a = from_values(av, {n, k}).requires_grad_(), b = from_values(bv, {k, m}).requires_grad_();
    {
      probe::HookGuard installed(twin);
      probe::StepScope step(0);
      sum(matmul(a, b) * from_values(wv, {n, m})).backward();
      step.end({});
    }
    std::vector<probe::PrecisionRow> backward;
    for (const probe::PrecisionRow& r : twin->rows()) {
      if (r.phase == trace::Phase::backward) backward.push_back(r);
    }
    return std::make_tuple(backward, a.grad().values(), b.grad().values());
  };
  const auto [without, unused_a, unused_b] = run(false);
  EXPECT_TRUE(without.empty());  // f32 nodes: nothing ran in f16/bf16
  const auto [rows, ga, gb] = run(true);
  const probe::PrecisionRow* mm = nullptr;
  for (const probe::PrecisionRow& r : rows) {
    if (r.op == "matmul") mm = &r;
  }
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->out_dtype, "f32");
  EXPECT_TRUE(mm->local);
  EXPECT_EQ(analysis::reference_of(*mm), "f64");
  EXPECT_EQ(mm->numel, n * k + k * m);
  // References: dA = W B^T, dB = A^T W, in f64 from the f32 values.
  std::vector<double> ref_a(static_cast<std::size_t>(n * k)), ref_b(static_cast<std::size_t>(k * m));
  const auto at = [](const std::vector<double>& v, std::int64_t i, std::int64_t j, std::int64_t cols) {
    return v[static_cast<std::size_t>(i * cols + j)];
  };
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t c = 0; c < k; ++c) {
      for (std::int64_t j = 0; j < m; ++j) ref_a[static_cast<std::size_t>(i * k + c)] += at(wv, i, j, m) * at(bv, c, j, m);
    }
  }
  const std::vector<double> a32 = from_values(av, {n, k}).values(), w32 = from_values(wv, {n, m}).values();
  for (std::int64_t c = 0; c < k; ++c) {
    for (std::int64_t j = 0; j < m; ++j) {
      for (std::int64_t i = 0; i < n; ++i) ref_b[static_cast<std::size_t>(c * m + j)] += at(a32, i, c, k) * at(w32, i, j, m);
    }
  }
  const Errors ea = errors_f32(ga, ref_a), eb = errors_f32(gb, ref_b);
  EXPECT_GT(std::max(ea.max_rel, eb.max_rel), 0);  // f32 products round
  // The node's row: the largest max, mean and ulps over its two gradients (each judged on its own).
  EXPECT_NEAR(mm->local_max_rel, std::max(ea.max_rel, eb.max_rel), 1e-12);
  EXPECT_NEAR(mm->local_mean_rel, std::max(ea.mean_rel, eb.mean_rel), 1e-12);
  EXPECT_NEAR(mm->local_max_ulp, std::max(ea.max_ulp, eb.max_ulp), 1e-6);
}

// ---- models written as a user writes them, trained in fp32 ----

fs::path scratch(const std::string& name) { return testing::process_scratch_dir("ampscope_twin_f64") / name; }

// Records `steps` steps of `body` as `ampscope train --twin-f64` does (testing::record_twinned).
analysis::Report record(const fs::path& path, std::int64_t steps, const std::function<void(std::int64_t)>& body) {
  return testing::record_twinned(path, steps, body, probe::TwinOptions{.f32_in_f64 = true}, "fp32");
}

std::string section(const analysis::Report& rep) { return analysis::render_text(rep); }
void show(const analysis::Report& rep) {
  if (std::getenv("AMPSCOPE_SHOW_PRECISION") != nullptr) std::cout << section(rep);
}

// Entries of the jump list with remedies (3 bits or more lost beyond their inputs') in `module`.
std::vector<const analysis::PrecisionEntry*> significant_in(const analysis::Report& rep, const std::string& module) {
  std::vector<const analysis::PrecisionEntry*> out;
  for (const analysis::PrecisionEntry& e : rep.precision.by_jump) {
    if (e.module == module && !e.remedies.empty()) out.push_back(&e);
  }
  return out;
}

// How the batch statistics are computed: as written first (E[x^2] - E[x]^2 in f32), with the report's compute_f64
// remedy (the statistics and the standardisation in f64, rounded once), or with its reorder remedy (shifted by
// the first sample, which f32 subtracts exactly since every value lies within a factor 2 of it, then
// E[d^2] - E[d]^2 on values of about 1).
enum class Variance { naive, f64, shifted };

// Standardises each feature over the batch, then a linear head: a notebook's "batch standardise" layer.
struct Standardised : nn::Module {
  std::shared_ptr<nn::Linear> head;
  Variance how;
  Tensor last_var;
  Standardised(Generator& gen, Variance v) : Module("Standardised"), how(v) {
    head = register_module("head", std::make_shared<nn::Linear>(4, 1, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor z;
    {
      ScopeGuard norm("norm");
      if (how == Variance::naive) {
        const Tensor mu = mean(x, {0}, true);
        last_var = mean(x * x, {0}, true) - mu * mu;
        z = (x - mu) / sqrt(last_var + 1e-5);
      } else if (how == Variance::f64) {
        const Tensor x64 = x.to(DType::f64);
        const Tensor mu = mean(x64, {0}, true);
        const Tensor var = mean(x64 * x64, {0}, true) - mu * mu;
        last_var = var.to(DType::f32);
        z = ((x64 - mu) / sqrt(var + 1e-5)).to(DType::f32);
      } else {
        const Tensor d = x - x.slice(0, 0, 1);
        const Tensor mu = mean(d, {0}, true);
        last_var = mean(d * d, {0}, true) - mu * mu;
        z = (d - mu) / sqrt(last_var + 1e-5);
      }
    }
    return (*head)(z);
  }
};

struct F32Run {
  analysis::Report report;
  std::vector<double> var;  // the last step's batch variances
};

F32Run train_standardised(Variance how, const std::string& name) {
  Generator gen(17);
  Standardised model(gen, how);
  optim::SGD opt(model.parameters(), {.lr = 0.01});
  // Raw sensor readings: four features near 300 with a spread of about 1.
  const Tensor x = randn({256, 4}, gen) + 300.0;
  const Tensor y = randn({256, 1}, gen);
  F32Run run;
  run.report = record(scratch(name), 2, [&](std::int64_t n) {
    probe::Step step(n);
    opt.zero_grad();
    const Tensor d = model(x) - y;
    const Tensor loss = mean(d * d);
    loss.backward();
    step.finish(loss, opt);
  });
  run.var = model.last_var.values();
  return run;
}

// The batch variances in f64, two passes, from the same f32 data: the value a variance should have.
std::vector<double> true_variances() {
  Generator gen(17);
  Standardised unused(gen, Variance::naive);  // the same draws as train_standardised before the data
  const std::vector<double> x = (randn({256, 4}, gen) + 300.0).values();
  std::vector<double> out;
  for (int f = 0; f < 4; ++f) {
    double mu = 0, var = 0;
    for (int i = 0; i < 256; ++i) mu += x[static_cast<std::size_t>(4 * i + f)] / 256.0;
    for (int i = 0; i < 256; ++i) {
      const double d = x[static_cast<std::size_t>(4 * i + f)] - mu;
      var += d * d / 256.0;
    }
    out.push_back(var);
  }
  return out;
}

TEST(TwinF64, AnF32BatchVarianceAsEx2MinusEx2IsRankedFirstAsACancellation) {
  const F32Run run = train_standardised(Variance::naive, "variance-naive.h5");
  const analysis::Report& rep = run.report;
  show(rep);
  ASSERT_TRUE(rep.precision.recorded()) << section(rep);
  ASSERT_FALSE(rep.precision.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = rep.precision.by_jump.front();
  EXPECT_EQ(first.op, "sub") << section(rep);
  EXPECT_EQ(first.module, "norm") << section(rep);
  EXPECT_EQ(first.kind, "cancellation") << section(rep);
  EXPECT_EQ(first.out_dtype, "f32");
  EXPECT_EQ(first.reference, "f64");
  // E[x^2] + E[x]^2 over E[x^2] - E[x]^2: about 2 * 9e4 / 1.
  EXPECT_GT(first.cond, 1e4);
  // The variance the run computed is off from the two-pass f64 variance by what the row says.
  const std::vector<double> truth = true_variances();
  double worst = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) worst = std::max(worst, std::fabs(run.var[i] - truth[i]) / truth[i]);
  EXPECT_GT(worst, 1e-4);  // thousands of f32 roundings' worth
  // The row's errors are the run's variances against the f64 variances (the twin's E[x^2] - E[x]^2 in f64 is the
  // two-pass variance to within 1e-12); the floor, 2^-24 of the largest, is far below every variance.
  double mean_rel = 0, max_rel = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) {
    const double rel = std::fabs(run.var[i] - truth[i]) / truth[i];
    mean_rel += rel / static_cast<double>(truth.size());
    max_rel = std::max(max_rel, rel);
  }
  EXPECT_NEAR(first.error, mean_rel, 1e-9) << section(rep);
  EXPECT_NEAR(first.max_error, max_rel, 1e-9) << section(rep);
  EXPECT_LT(first.in_error, 1e-6);  // what reaches it: the means, a few f32 roundings off
  EXPECT_NE(first.evidence.find("inputs agree with f64 to"), std::string::npos) << first.evidence;
  // Remedies: compute the producer and the subtraction in f64, or reorder (centre first); nothing that keeps
  // an op "in f32", which it already was.
  std::vector<std::string> kinds;
  for (const analysis::Remedy& m : first.remedies) kinds.push_back(m.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"compute_f64", "reorder"})) << section(rep);
  EXPECT_NE(first.remedies[0].text.find("mean and sub in norm"), std::string::npos) << first.remedies[0].text;
}

TEST(TwinF64, TheComputeF64RemedyAppliedAndRunAgainRemovesTheCancellation) {
  const F32Run run = train_standardised(Variance::f64, "variance-f64.h5");
  EXPECT_TRUE(significant_in(run.report, "norm").empty()) << section(run.report);
  const std::vector<double> truth = true_variances();
  for (std::size_t i = 0; i < truth.size(); ++i) EXPECT_NEAR(run.var[i], truth[i], truth[i] * 1e-6);
}

TEST(TwinF64, TheReorderRemedyAppliedAndRunAgainRemovesTheCancellation) {
  const F32Run run = train_standardised(Variance::shifted, "variance-shifted.h5");
  EXPECT_TRUE(significant_in(run.report, "norm").empty()) << section(run.report);
  const std::vector<double> truth = true_variances();
  for (std::size_t i = 0; i < truth.size(); ++i) EXPECT_NEAR(run.var[i], truth[i], truth[i] * 1e-5);
}

// Event times as a user computes them: each session's start (Unix seconds, about 1.7e9) plus the running sum of
// the gaps between its events, fed to the model as a timestamp scaled by 1e-9. f32 spaces values near 1.7e9 by
// 128, so every gap under 64 s rounds away: the total stops growing at the start time.
struct EventClock : nn::Module {
  std::shared_ptr<nn::Linear> head;
  Tensor start;  // [sessions, 1]
  bool in_f64;
  EventClock(Generator& gen, Tensor session_start, bool f64)
      : Module("EventClock"), start(std::move(session_start)), in_f64(f64) {
    head = register_module("head", std::make_shared<nn::Linear>(1, 1, gen));
  }
  Tensor forward(const Tensor& gaps) override {  // gaps: [events, sessions, 1]
    Tensor stamp;
    {
      ScopeGuard clock("clock");
      Tensor total = in_f64 ? start.to(DType::f64) : start;
      for (std::int64_t t = 0; t < gaps.size(0); ++t) {
        const Tensor gap = gaps.slice(0, t, t + 1).reshape({gaps.size(1), 1});
        total = total + (in_f64 ? gap.to(DType::f64) : gap);
      }
      stamp = in_f64 ? (total * 1e-9).to(DType::f32) : total * 1e-9;
    }
    return (*head)(stamp);
  }
};

struct ClockRun {
  analysis::Report report;
  std::vector<double> start, gaps;  // [3], [1000, 3]
};

ClockRun train_clock(bool in_f64, const std::string& name) {
  Generator gen(3);
  // Three sessions starting in November 2023; 1000 events each, 1 to 50 s apart.
  const Tensor start = from_values({1.7e9, 1.7e9 + 3600.0, 1.7e9 + 86400.0}, {3, 1});
  EventClock model(gen, start, in_f64);
  optim::SGD opt(model.parameters(), {.lr = 1e-3});
  const Tensor gaps = rand({1000, 3, 1}, gen) * 49.0 + 1.0;
  const Tensor y = randn({3, 1}, gen);
  ClockRun run;
  run.report = record(scratch(name), 1, [&](std::int64_t n) {
    probe::Step step(n);
    opt.zero_grad();
    const Tensor d = model(gaps) - y;
    const Tensor loss = mean(d * d);
    loss.backward();
    step.finish(loss, opt);
  });
  run.start = start.values();
  run.gaps = gaps.values();
  return run;
}

TEST(TwinF64, AnF32RunningSumOfTimeGapsOntoAUnixTimestampIsRankedFirstAsAnAccumulation) {
  const ClockRun run = train_clock(false, "clock-f32.h5");
  const analysis::Report& rep = run.report;
  show(rep);
  ASSERT_FALSE(rep.precision.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = rep.precision.by_jump.front();
  EXPECT_EQ(first.op, "add") << section(rep);
  EXPECT_EQ(first.module, "clock") << section(rep);
  EXPECT_EQ(first.kind, "accumulation") << section(rep);
  EXPECT_EQ(first.calls, 1000);  // every add of the loop, each fed by the one before; the last lost the most
  EXPECT_EQ(first.reference, "f64");
  // Every gap (under 64 s) rounded away: the f32 total is still the start (a multiple of 128), while f64's has
  // grown by the sum G of the gaps: the relative error of each session's total is G / (start + G), about 1.5e-5.
  // (The twin adds in f64 one gap at a time, this sums the gaps first: the two differ by f64 roundings, 1e-12.)
  double mean_rel = 0, max_rel = 0;
  for (std::size_t s = 0; s < 3; ++s) {
    double g = 0;
    for (std::size_t t = 0; t < 1000; ++t) g += run.gaps[3 * t + s];
    const double rel = g / (run.start[s] + g);
    mean_rel += rel / 3;
    max_rel = std::max(max_rel, rel);
  }
  EXPECT_NEAR(first.error, mean_rel, mean_rel * 1e-9) << section(rep);
  EXPECT_NEAR(first.max_error, max_rel, max_rel * 1e-9) << section(rep);
  EXPECT_EQ(first.in_error, 0);  // the first add's inputs are data, exact
  ASSERT_FALSE(first.remedies.empty());
  EXPECT_EQ(first.remedies.front().kind, "accumulate_f64") << section(rep);
  EXPECT_NE(first.remedies.front().code.find("DType::f64"), std::string::npos);
}

TEST(TwinF64, TheAccumulateF64RemedyAppliedAndRunAgainRemovesTheAccumulation) {
  const ClockRun run = train_clock(true, "clock-f64.h5");
  EXPECT_TRUE(significant_in(run.report, "clock").empty()) << section(run.report);
}

// The option never changes the run: an fp32 training run's losses and parameters, bit for bit.
TEST(TwinF64, AnF32RunIsBitIdenticalWithAndWithoutTheF64Twin) {
  auto train = [](bool with_twin) {
    Generator gen(29);
    Standardised model(gen, Variance::naive);
    optim::SGD opt(model.parameters(), {.lr = 0.05});
    const Tensor x = randn({64, 4}, gen) + 300.0;
    const Tensor y = randn({64, 1}, gen);
    std::shared_ptr<probe::Hook> hook = std::make_shared<probe::Probe>(std::make_shared<NullSink>());
    std::shared_ptr<probe::Twin> twin;
    if (with_twin) hook = twin = std::make_shared<probe::Twin>(hook, probe::TwinOptions{.f32_in_f64 = true});
    probe::HookGuard installed(hook);
    std::vector<double> out;
    for (std::int64_t n = 0; n < 4; ++n) {
      probe::Step step(n);
      opt.zero_grad();
      const Tensor d = model(x) - y;
      const Tensor loss = mean(d * d);
      loss.backward();
      out.push_back(step.finish(loss, opt).loss);
    }
    for (const Tensor& p : model.parameters()) {
      for (double v : p.values()) out.push_back(v);
    }
    if (twin) {
      EXPECT_FALSE(twin->rows().empty());
    }
    return out;
  };
  const std::vector<double> plain = train(false), twinned = train(true);
  ASSERT_EQ(plain.size(), twinned.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(std::memcmp(&plain[i], &twinned[i], sizeof(double)), 0) << "value " << i << ": " << plain[i] << " vs "
                                                                       << twinned[i];
  }
}

}  // namespace
}  // namespace ampscope
