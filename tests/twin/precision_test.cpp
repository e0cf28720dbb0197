// tests/twin/precision_test.cpp: the report's PRECISION section on planted precision losses, in models written as
// a user writes them (nn modules, autocast f16, a GradScaler, a loss by hand), recorded with the f32 twin into a
// real trace and read back by the report's own analysis: the planted op is ranked first, with its module. Also
// the twin's numbers for an autocast linear (inputs cast to f16) against f64 computed here, and `ampscope train
// --twin` leaving the run bit for bit as it is without it (losses, scales and every /ops statistic).
//
// Where each loss comes from (f16: 11 significand bits, spacing 2^-10 in [1, 2), 2^-11 just below 1):
//   - BCE by hand: sigmoid(z) rounds to exactly 1 for z > 8.3, so 1 - s is 0 where f32 has 1e-4 and more.
//   - tanh saturates: tanh(z) rounds to 1 for z > 4.5 (1 - tanh(z) under 2^-12); the error of the saturated
//     outputs relative to their distance from 1 is what the flips count.
//   - a running sum: 2048 + 1 rounds to 2048 in f16 (spacing 2), so a total that reaches 2048 stops growing.
//   - a sub of nearly equal activations: a - b with b = a (1 + 1e-4) keeps none of the difference's digits
//     once a and b are rounded to f16 (relative spacing 2^-11 = 4.9e-4).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/float16.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/render.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"
#include "cli/run.h"
#include "tests/test_support.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) { return testing::process_scratch_dir("ampscope_precision") / name; }

// Records `steps` steps of `body` with the probe at level health wrapped in the twin, both writing to a trace
// at `path`, as `ampscope train --twin` sets them up; returns the report's analysis of that trace.
analysis::Report record(const fs::path& path, std::int64_t steps, const std::function<void(std::int64_t)>& body) {
  return testing::record_twinned(path, steps, body);
}

// Prints the section when a ranking assertion fails (and always with AMPSCOPE_SHOW_PRECISION set: how the
// example in docs/report-format.md was made).
std::string section(const analysis::Report& rep) { return analysis::render_text(rep); }
void show(const analysis::Report& rep) {
  if (std::getenv("AMPSCOPE_SHOW_PRECISION") != nullptr) std::cout << section(rep);
}

// One optimizer step of `model` on `loss_of`, the PyTorch way (autocast f16 forward, scaled backward).
struct Trainer {
  nn::Module& model;
  optim::SGD opt;
  GradScaler scaler{{.device = "cpu", .enabled = true}};
  Trainer(nn::Module& m, double lr) : model(m), opt(m.parameters(), {.lr = lr}) {}
  void step(std::int64_t n, const std::function<Tensor()>& loss_of) {
    probe::Step step(n);
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(DType::f16);
      loss = loss_of();
    }
    scaler.scale(loss).backward();
    step.finish(loss, opt, scaler);
  }
};

// ---- a hand-written BCE on sigmoid ----

struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> hidden, head;
  explicit Classifier(Generator& gen) : Module("Classifier") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(6, 32, gen));
    head = register_module("head", std::make_shared<nn::Linear>(32, 1, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)(relu((*hidden)(x))); }
};

TEST(precision_test, a_hand_written_bce_on_sigmoid_ranks_the_cancelling_one_minus_s_first) {
  Generator gen(21);
  Classifier model(gen);
  Trainer t(model, 0.05);
  const Tensor x = randn({64, 6}, gen) * 8.0;  // confident logits: many past 8.3
  std::vector<double> labels;
  const std::vector<double> f = x.values();
  for (std::size_t i = 0; i < 64; ++i) labels.push_back(f[6 * i] - f[6 * i + 2] > 0 ? 1.0 : 0.0);
  const Tensor y = from_values(labels, {64, 1});
  const analysis::Report rep = record(scratch("bce.h5"), 3, [&](std::int64_t n) {
    t.step(n, [&] {
      const Tensor s = sigmoid(model(x) * 4.0);
      ScopeGuard in_loss("loss");
      // The textbook formula, clamped as users do so the run itself stays finite.
      return -mean(y * log(clamp(s, 1e-4, 1.0)) + (1.0 - y) * log(clamp(1.0 - s, 1e-4, 1.0)));
    });
  });
  show(rep);
  const analysis::PrecisionSection& p = rep.precision;
  ASSERT_TRUE(p.recorded());
  ASSERT_FALSE(p.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = p.by_jump.front();
  EXPECT_EQ(first.op, "rsub") << section(rep);
  EXPECT_EQ(first.module, "loss") << section(rep);
  EXPECT_EQ(first.kind, "cancellation") << section(rep);
  EXPECT_GT(first.flips, 0);
  EXPECT_GE(first.cond, 8.0);
  // What reaches it agrees with f32 to a few f16 roundings (the logits' own error, through sigmoid); what leaves
  // it is more than 8 times (3 bits) further off on average, and some outputs lost most of their digits.
  EXPECT_LT(first.in_error, 4 * std::ldexp(1.0, -11));
  EXPECT_GT(first.error, 8 * first.in_error);
  EXPECT_GT(first.max_error, 0.2);
  ASSERT_FALSE(first.producers.empty());
  EXPECT_EQ(first.producers.front(), "sigmoid");
  // The remedies: the fused formulation first, then sigmoid kept in f32.
  ASSERT_GE(first.remedies.size(), 2u);
  EXPECT_EQ(first.remedies[0].kind, "stable_formulation");
  EXPECT_NE(first.remedies[0].text.find("binary_cross_entropy_with_logits"), std::string::npos);
  EXPECT_EQ(first.remedies[1].kind, "autocast_fp32");
  EXPECT_EQ(first.remedies[1].flag, "--autocast-fp32 'sigmoid'");
  EXPECT_NE(first.evidence.find("inputs agree with f32 to"), std::string::npos) << first.evidence;
  EXPECT_NE(first.evidence.find("cancellation"), std::string::npos) << first.evidence;
}

// ---- a saturating tanh ----

struct Squash : nn::Module {
  std::shared_ptr<nn::Linear> in, out;
  explicit Squash(Generator& gen) : Module("Squash") {
    in = register_module("in", std::make_shared<nn::Linear>(8, 16, gen));
    out = register_module("out", std::make_shared<nn::Linear>(16, 1, gen));
  }
  Tensor forward(const Tensor& x) override {
    ScopeGuard gate("gate");
    return (*out)(tanh((*in)(x) * 3.0));  // pre-activations of several units past 4.5
  }
};

TEST(precision_test, a_saturating_tanh_is_ranked_first_with_its_module) {
  Generator gen(5);
  Squash model(gen);
  Trainer t(model, 0.01);
  const Tensor x = randn({64, 8}, gen) * 4.0;
  const Tensor y = randn({64, 1}, gen);
  const analysis::Report rep = record(scratch("tanh.h5"), 3, [&](std::int64_t n) {
    t.step(n, [&] {
      const Tensor d = model(x) - y;
      return mean(d * d);
    });
  });
  const analysis::PrecisionSection& p = rep.precision;
  ASSERT_FALSE(p.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = p.by_jump.front();
  EXPECT_EQ(first.op, "tanh") << section(rep);
  EXPECT_EQ(first.module, "gate") << section(rep);
  EXPECT_EQ(first.kind, "saturation") << section(rep);
  EXPECT_GT(first.flips, 0);
  // The score is the fraction of outputs at exactly 1 times 2^11, halved for a saturating op.
  EXPECT_DOUBLE_EQ(first.score, static_cast<double>(first.flips) / static_cast<double>(first.numel) * 2048.0 / 2);
  ASSERT_FALSE(first.remedies.empty());
  EXPECT_EQ(first.remedies.back().kind, "autocast_fp32");
  EXPECT_EQ(first.remedies.back().flag, "--autocast-fp32 'gate'");
}

// ---- a running sum that stops growing ----

// Pools a sequence by adding its steps one at a time, as a user writes a running total.
struct RunningPool : nn::Module {
  std::shared_ptr<nn::Linear> embed, head;
  explicit RunningPool(Generator& gen) : Module("RunningPool") {
    embed = register_module("embed", std::make_shared<nn::Linear>(4, 8, gen));
    head = register_module("head", std::make_shared<nn::Linear>(8, 1, gen));
  }
  Tensor forward(const Tensor& x) override {  // x: [steps, batch, 4]
    const Tensor h = relu((*embed)(x)) + 1.0;  // positive terms around 1: the total grows past 2048
    Tensor total;
    {
      ScopeGuard pool("pool");
      total = h.slice(0, 0, 1).reshape({h.size(1), h.size(2)});
      for (std::int64_t t = 1; t < h.size(0); ++t) total = total + h.slice(0, t, t + 1).reshape({h.size(1), h.size(2)});
    }
    return (*head)(total * (1.0 / static_cast<double>(h.size(0))));
  }
};

TEST(precision_test, a_running_f16_sum_that_stops_growing_is_ranked_first_as_an_accumulation) {
  Generator gen(8);
  RunningPool model(gen);
  Trainer t(model, 0.001);
  const Tensor x = rand({3000, 4, 4}, gen);
  const Tensor y = randn({4, 1}, gen);
  const analysis::Report rep = record(scratch("running-sum.h5"), 1, [&](std::int64_t n) {
    t.step(n, [&] {
      const Tensor d = model(x) - y;
      return mean(d * d);
    });
  });
  const analysis::PrecisionSection& p = rep.precision;
  ASSERT_FALSE(p.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = p.by_jump.front();
  EXPECT_EQ(first.op, "add") << section(rep);
  EXPECT_EQ(first.module, "pool") << section(rep);
  EXPECT_EQ(first.kind, "accumulation") << section(rep);
  EXPECT_EQ(first.calls, 2999);  // every add of the loop, each fed by the one before
  // Past 2048 each term (about 1 to 3) is at most half to one and a half of f16's spacing of 2 there: the
  // f16 total falls well behind; the error entering the first add is one rounding or less.
  EXPECT_GT(first.max_error, 0.05) << section(rep);
  EXPECT_LE(first.in_error, std::ldexp(1.0, -11));
  ASSERT_FALSE(first.remedies.empty());
  EXPECT_EQ(first.remedies.front().kind, "accumulate_f32");
}

// ---- a sub of nearly equal activations ----

struct Difference : nn::Module {
  std::shared_ptr<nn::Linear> a, b, head;
  explicit Difference(Generator& gen) : Module("Difference") {
    a = register_module("a", std::make_shared<nn::Linear>(8, 16, gen));
    b = register_module("b", std::make_shared<nn::Linear>(8, 16, gen));
    head = register_module("head", std::make_shared<nn::Linear>(16, 1, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor d;
    {
      ScopeGuard contrast("contrast");
      d = (*a)(x) - (*b)(x);
    }
    return (*head)(d * 1000.0);
  }
};

TEST(precision_test, a_sub_of_nearly_equal_activations_is_ranked_first_as_a_cancellation) {
  Generator gen(13);
  Difference model(gen);
  {
    // b's weights are a's times (1 + 1e-4): the two activations agree to 1e-4, under f16's resolution.
    NoGradGuard no_grad;
    std::vector<double> w = model.a->weight().values(), bias = model.a->bias().values();
    for (double& v : w) v *= 1.0 + 1e-4;
    for (double& v : bias) v *= 1.0 + 1e-4;
    Tensor bw = model.b->weight(), bb = model.b->bias();
    bw.copy_(from_values(w, bw.shape()));
    bb.copy_(from_values(bias, bb.shape()));
  }
  Trainer t(model, 0.0);  // lr 0: the planted relation between a and b holds on every step
  const Tensor x = randn({32, 8}, gen) * 2.0;
  const Tensor y = randn({32, 1}, gen);
  const analysis::Report rep = record(scratch("difference.h5"), 2, [&](std::int64_t n) {
    t.step(n, [&] {
      const Tensor d = model(x) - y;
      return mean(d * d);
    });
  });
  const analysis::PrecisionSection& p = rep.precision;
  ASSERT_FALSE(p.by_jump.empty()) << section(rep);
  const analysis::PrecisionEntry& first = p.by_jump.front();
  EXPECT_EQ(first.op, "sub") << section(rep);
  EXPECT_EQ(first.module, "contrast") << section(rep);
  EXPECT_EQ(first.kind, "cancellation") << section(rep);
  EXPECT_GT(first.cond, 1000.0);  // |a| + |b| over |a - b|: about 2 / 1e-4
  EXPECT_GT(first.error, 0.1);
  // Also in the conditioning list, at the top.
  ASSERT_FALSE(p.conditioning.empty());
  EXPECT_EQ(p.conditioning.front().op, "sub");
  EXPECT_EQ(p.conditioning.front().module, "contrast");
}

// ---- the twin's numbers against f64 ----

// An autocast linear (its f32 inputs cast to f16) then tanh: the local reference is f64 on the f16-rounded
// inputs, the accumulated one f64 on the f32 inputs before the cast. Inputs are dyadic with few bits, so
// every reference sum is exact in f32 too and the twin's errors must match to rounding of the error itself.
TEST(precision_test, an_autocast_linear_and_tanh_match_an_f64_computation) {
  // x = 1 + k / 4096 (12 fraction bits: f16 keeps 10, so the cast rounds); w = 1 + m / 64; b = 1/8.
  const std::int64_t n = 3, in = 4, out = 2;
  std::vector<double> xv, wv;
  for (std::int64_t i = 0; i < n * in; ++i) xv.push_back(1.0 + static_cast<double>((i * 37) % 4096 + 1) / 4096.0);
  for (std::int64_t i = 0; i < out * in; ++i) wv.push_back(1.0 + static_cast<double>((i * 11) % 64) / 64.0 - 0.75);
  const std::vector<double> bv{0.125, -0.125};
  const Tensor x = from_values(xv, {n, in}), w = from_values(wv, {out, in}), b = from_values(bv, {out});
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<trace::TraceWriter>(
      scratch("f64.h5"), trace::RunInfo{.precision = "fp16", .device = "cpu", .model = "f64", .seed = 0, .config = "{}"})));
  Tensor y, z;
  {
    probe::HookGuard installed(twin);
    probe::StepScope step(0);
    AutocastGuard autocast(DType::f16);
    y = linear(x, w, b);
    z = tanh(y);
    step.end({});
  }
  auto f16_round = [](double v) { return static_cast<double>(static_cast<float>(f16(static_cast<float>(v)))); };
  std::vector<double> ref_local, ref_acc, yv = y.values(), zv = z.values();
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < out; ++c) {
      double local = f16_round(bv[c]), acc = bv[c];
      for (std::int64_t k = 0; k < in; ++k) {
        local += f16_round(xv[r * in + k]) * f16_round(wv[c * in + k]);
        acc += xv[r * in + k] * wv[c * in + k];
      }
      ref_local.push_back(local);
      ref_acc.push_back(acc);
    }
  }
  // The errors as probes/twin.h defines them for an f16 output, computed here in f64.
  struct Errors {
    double max_rel = 0, mean_rel = 0, max_ulp = 0;
  };
  auto errors = [](const std::vector<double>& v, const std::vector<double>& r) {
    Errors e;
    double scale = 0;
    for (double x : r) scale = std::max(scale, std::fabs(x));
    const double floor = std::max(std::ldexp(1.0, -14), scale * std::ldexp(1.0, -11));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double err = std::fabs(v[i] - r[i]);
      e.max_rel = std::max(e.max_rel, err / std::max(std::fabs(r[i]), floor));
      e.mean_rel += err / std::max(std::fabs(r[i]), floor) / static_cast<double>(v.size());
      const int exponent = std::max(-14, static_cast<int>(std::floor(std::log2(std::fabs(r[i])))));
      e.max_ulp = std::max(e.max_ulp, err / std::ldexp(1.0, exponent - 10));
    }
    return e;
  };
  const auto& rows = twin->rows();
  ASSERT_EQ(rows.size(), 2u);
  const probe::PrecisionRow& lin = rows[0];
  ASSERT_EQ(lin.op, "linear");
  const Errors local = errors(yv, ref_local), acc = errors(yv, ref_acc);
  ASSERT_GT(acc.max_rel, local.max_rel);  // the premise: the cast's rounding adds to the output's
  EXPECT_NEAR(lin.local_max_rel, local.max_rel, 1e-12);
  EXPECT_NEAR(lin.local_mean_rel, local.mean_rel, 1e-12);
  EXPECT_NEAR(lin.local_max_ulp, local.max_ulp, 1e-9);
  EXPECT_NEAR(lin.acc_max_rel, acc.max_rel, 1e-12);
  EXPECT_NEAR(lin.acc_mean_rel, acc.mean_rel, 1e-12);
  EXPECT_NEAR(lin.acc_max_ulp, acc.max_ulp, 1e-9);
  // Its inputs' error: the cast x (and w) against the uncast values, judged in f16.
  double in_max = 0;
  for (const std::vector<double>* v : {&xv, &wv}) {
    std::vector<double> rounded;
    for (double e : *v) rounded.push_back(f16_round(e));
    in_max = std::max(in_max, errors(rounded, *v).max_rel);
  }
  EXPECT_NEAR(lin.in_acc_max_rel, in_max, 1e-12);
  // tanh: local on the f16 y; accumulated against tanh of the exact linear (f32's tanh is within 2^-23 of f64's).
  const probe::PrecisionRow& th = rows[1];
  ASSERT_EQ(th.op, "tanh");
  std::vector<double> tanh_local, tanh_acc;
  for (std::size_t i = 0; i < yv.size(); ++i) {
    tanh_local.push_back(std::tanh(yv[i]));
    tanh_acc.push_back(std::tanh(ref_acc[i]));
  }
  EXPECT_NEAR(th.local_max_rel, errors(zv, tanh_local).max_rel, 1e-6);
  EXPECT_NEAR(th.acc_max_rel, errors(zv, tanh_acc).max_rel, 1e-6);
  EXPECT_NEAR(th.in_acc_max_rel, acc.max_rel, 1e-12);  // y against the twin's y: the linear's accumulated error
}

// ---- `ampscope train --twin` changes nothing ----

// Losses, scales and every /ops statistic of a trained sample, with and without the twin (every step),
// compared bit for bit.
TEST(precision_test, train_with_twin_is_bit_identical_to_train_without) {
  for (const char* sample : {"mlp", "transformer"}) {
    SCOPED_TRACE(sample);
    samples::TrainConfig c;
    c.sample = sample;
    c.device = "cpu";
    c.steps = 3;
    c.precision = samples::Precision::fp16;
    c.out = scratch(std::string(sample) + "-plain.h5").string();
    const samples::TrainResult plain = samples::train(c);
    c.twin = true;
    c.out = scratch(std::string(sample) + "-twin.h5").string();
    const samples::TrainResult twinned = samples::train(c);
    ASSERT_EQ(plain.losses.size(), twinned.losses.size());
    EXPECT_EQ(std::memcmp(plain.losses.data(), twinned.losses.data(), plain.losses.size() * sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(plain.scales.data(), twinned.scales.data(), plain.scales.size() * sizeof(double)), 0);
    trace::TraceReader a(scratch(std::string(sample) + "-plain.h5")), b(c.out);
    EXPECT_TRUE(a.precision().empty());
    EXPECT_FALSE(b.precision().empty());
    const std::vector<trace::OpRow> oa = a.ops(), ob = b.ops();
    ASSERT_EQ(oa.size(), ob.size());
    for (std::size_t i = 0; i < oa.size(); ++i) {
      const trace::OpRow &x = oa[i], &y = ob[i];
      SCOPED_TRACE(::testing::Message() << "op row " << i << ": " << x.op << " in " << x.module);
      EXPECT_EQ(x.step, y.step);
      EXPECT_EQ(x.seq, y.seq);
      EXPECT_EQ(x.op, y.op);
      EXPECT_EQ(x.module, y.module);
      EXPECT_EQ(x.in_dtypes, y.in_dtypes);
      EXPECT_EQ(x.out_dtype, y.out_dtype);
      EXPECT_EQ(x.shape, y.shape);
      EXPECT_EQ(x.autocast, y.autocast);
      EXPECT_EQ(x.inputs, y.inputs);
      EXPECT_EQ(x.origin, y.origin);
      const trace::TensorHealth &h = x.health, &k = y.health;
      EXPECT_EQ(h.numel, k.numel);
      EXPECT_EQ(h.nan, k.nan);
      EXPECT_EQ(h.pos_inf, k.pos_inf);
      EXPECT_EQ(h.neg_inf, k.neg_inf);
      EXPECT_EQ(h.zero, k.zero);
      EXPECT_EQ(h.subnormal, k.subnormal);
      for (const auto& [u, v] : {std::pair{h.min, k.min}, {h.max, k.max}, {h.absmax, k.absmax}, {h.mean, k.mean}, {h.rms, k.rms}}) {
        EXPECT_EQ(std::memcmp(&u, &v, sizeof u), 0) << u << " vs " << v;
      }
    }
    const std::vector<trace::StepRow> sa = a.steps(), sb = b.steps();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(std::memcmp(&sa[i].grad_norm, &sb[i].grad_norm, sizeof(double)), 0);
      EXPECT_EQ(sa[i].scale_after, sb[i].scale_after);
      EXPECT_EQ(sa[i].skipped, sb[i].skipped);
    }
  }
}

// ---- the report without the twin's rows ----

TEST(precision_test, a_trace_without_precision_rows_says_to_run_with_twin_in_one_line) {
  trace::TraceReader r(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v4-mlp-log-zero-full.h5");
  const analysis::Report rep = analysis::analyse(r);
  EXPECT_FALSE(rep.precision.recorded());
  const std::string text = analysis::render_text(rep);
  std::size_t lines = 0;
  for (std::size_t at = text.find("PRECISION:"); at != std::string::npos; at = text.find("PRECISION:", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u);
  EXPECT_NE(text.find("PRECISION: not recorded (run with --twin"), std::string::npos) << text;
  const std::string json = analysis::render_json(rep);
  EXPECT_NE(json.find("\"recorded\": false"), std::string::npos);
}

}  // namespace
}  // namespace ampscope
