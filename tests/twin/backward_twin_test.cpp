// tests/twin/backward_twin_test.cpp: the f32 twin's backward rows (probes/twin.h, issue 20: local error per
// autograd node). Each node's recorded errors are checked against an f64 computation written here from the
// widened inputs (the incoming gradient, the saved tensors) and the f16 gradients the run produced: the f16
// backward of a matmul, of a softmax and of a division. A precision loss planted in a model written as a user
// writes one (logits divided by a small learned temperature, stored in f16: the temperature's gradient divides
// by t * t, which is subnormal in f16) ranks first among the backward rows; and a run with the twin is bit for
// bit the run without it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/float16.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/training_step.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/render.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"
#include "tests/test_support.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

using testing::NullSink;

// f16's value of x (round to nearest even), as f64.
double f16_of(double x) { return static_cast<double>(static_cast<float>(f16(static_cast<float>(x)))); }

// The errors of f16 values against an exact reference, as probes/twin.h defines them for an f16 output.
using Errors = testing::Errors;
Errors f16_errors(const std::vector<double>& y, const std::vector<double>& r) { return testing::errors_of(y, r, DType::f16); }

// A node's gradients together, as the twin's backward row takes them: the largest max, mean and ulps.
Errors together(const std::vector<Errors>& parts) {
  Errors all;
  for (const Errors& p : parts) {
    all.max_rel = std::max(all.max_rel, p.max_rel);
    all.mean_rel = std::max(all.mean_rel, p.mean_rel);
    all.max_ulp = std::max(all.max_ulp, p.max_ulp);
    all.flips += p.flips;
  }
  return all;
}

std::vector<probe::PrecisionRow> backward_rows(const std::vector<probe::PrecisionRow>& rows) {
  std::vector<probe::PrecisionRow> out;
  for (const probe::PrecisionRow& r : rows) {
    if (r.phase == trace::Phase::backward) out.push_back(r);
  }
  return out;
}

// Runs `backward` inside step 0 with a twin installed; returns the twin.
template <class Fn>
std::shared_ptr<probe::Twin> twinned(Fn&& backward) {
  auto twin = std::make_shared<probe::Twin>(std::make_shared<probe::Probe>(std::make_shared<NullSink>()));
  probe::HookGuard installed(twin);
  probe::StepScope step(0);
  backward();
  step.end({});
  return twin;
}

Tensor f16_leaf(const std::vector<double>& values, const Shape& shape) {
  return from_values(values, shape, {DType::f16}).requires_grad_();
}

// The twin's row against the f64 reference: its reference is f32, 2^-24 relative from f64, so the relative
// errors agree to about that (the tolerances leave room for a few f32 roundings), ulps to a hundredth.
void expect_row_matches(const probe::PrecisionRow& row, const Errors& ref) {
  EXPECT_NEAR(row.local_max_rel, ref.max_rel, 1e-6);
  EXPECT_NEAR(row.local_mean_rel, ref.mean_rel, 1e-6);
  EXPECT_NEAR(row.local_max_ulp, ref.max_ulp, 1e-2);
  EXPECT_EQ(row.flips, ref.flips);
  EXPECT_TRUE(row.local);
  EXPECT_EQ(row.out_dtype, "f16");
  const double bits = ref.max_rel == 0 ? 11.0 : std::clamp(-std::log2(ref.max_rel), 0.0, 11.0);
  EXPECT_NEAR(row.bits, bits, 1e-3);
}

TEST(backward_twin_test, an_f16_matmul_backward_matches_an_f64_computation) {
  const std::vector<double> a{0.8125, -1.3, 2.71, 0.0917, -0.577, 1.618, 3.14159, -2.2, 0.333, 1.25, -0.07, 0.9};
  const std::vector<double> b{1.1, -0.45, 0.3333, 2.5, -1.75, 0.61, 0.123, -3.3};
  const std::vector<double> g{0.71, -1.9, 0.37, 2.2, -0.013, 1.41};
  const Tensor A = f16_leaf(a, {3, 4}), B = f16_leaf(b, {4, 2});
  const auto twin = twinned([&] { matmul(A, B).backward(from_values(g, {3, 2}, {DType::f16})); });
  const std::vector<probe::PrecisionRow> rows = backward_rows(twin->rows());
  ASSERT_EQ(rows.size(), 1u);  // the matmul node; the leaves' AccumulateGrad is not twinned
  EXPECT_EQ(rows[0].op, "matmul");
  EXPECT_EQ(rows[0].numel, 12 + 8);
  // dA = G B^T, dB = A^T G, exactly in f64 from the f16 values (widened).
  std::vector<double> da(12, 0.0), db(8, 0.0);
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 4; ++k) {
      for (int j = 0; j < 2; ++j) {
        da[i * 4 + k] += f16_of(g[i * 2 + j]) * f16_of(b[k * 2 + j]);
        db[k * 2 + j] += f16_of(a[i * 4 + k]) * f16_of(g[i * 2 + j]);
      }
    }
  }
  const Errors ref = together({f16_errors(A.grad().values(), da), f16_errors(B.grad().values(), db)});
  EXPECT_GT(ref.max_rel, 0.0);  // the f16 gradients are rounded: there is an error to measure
  expect_row_matches(rows[0], ref);
}

TEST(backward_twin_test, an_f16_softmax_backward_matches_an_f64_computation) {
  const std::vector<double> x{0.3, -1.2, 2.05, 0.77, -0.41, 1.5, 1.49, -2.6, 0.02, 3.3};
  const std::vector<double> g{1.3, 0.6, -0.25, 2.1, 0.9, -0.7, 1.15, 0.4, -1.6, 0.05};
  const Tensor X = f16_leaf(x, {2, 5});
  Tensor y;
  const auto twin = twinned([&] {
    y = softmax(X, -1);
    y.backward(from_values(g, {2, 5}, {DType::f16}));
  });
  const std::vector<probe::PrecisionRow> rows = backward_rows(twin->rows());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].op, "softmax");
  // dx_i = y_i (g_i - sum_j g_j y_j), y the softmax output the node saved (f16), widened.
  const std::vector<double> yv = y.values();
  std::vector<double> dx(10);
  for (int r = 0; r < 2; ++r) {
    double dot = 0;
    for (int j = 0; j < 5; ++j) dot += f16_of(g[r * 5 + j]) * yv[r * 5 + j];
    for (int j = 0; j < 5; ++j) dx[r * 5 + j] = yv[r * 5 + j] * (f16_of(g[r * 5 + j]) - dot);
  }
  const Errors ref = f16_errors(X.grad().values(), dx);
  EXPECT_GT(ref.max_rel, 0.0);
  expect_row_matches(rows[0], ref);
}

// a / b in f16: the gradient of b is -g a / (b b), computed as f16 ops; b b is subnormal in f16 for the small
// divisors, so the f16 backward loses far more than one rounding there.
TEST(backward_twin_test, an_f16_division_backward_matches_an_f64_computation_and_loses_digits_to_b_squared) {
  const std::vector<double> a{1.5, -0.75, 2.0, 0.3, 1.0, -2.5};
  const std::vector<double> b{0.002, 0.0035, 0.25, 1.5, -0.7, 3.0};
  const std::vector<double> g{0.01, 0.02, 1.0, 0.37, -1.2, 0.9};
  const Tensor A = f16_leaf(a, {6}), B = f16_leaf(b, {6});
  const auto twin = twinned([&] { div(A, B).backward(from_values(g, {6}, {DType::f16})); });
  const std::vector<probe::PrecisionRow> rows = backward_rows(twin->rows());
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].op, "div");
  std::vector<double> da(6), db(6);
  for (int i = 0; i < 6; ++i) {
    const double ai = f16_of(a[i]), bi = f16_of(b[i]), gi = f16_of(g[i]);
    da[i] = gi / bi;
    db[i] = -gi * ai / (bi * bi);
  }
  const Errors ea = f16_errors(A.grad().values(), da), eb = f16_errors(B.grad().values(), db);
  expect_row_matches(rows[0], together({ea, eb}));
  EXPECT_LE(ea.max_rel, std::ldexp(1.0, -11) * (1 + 1e-6));  // g / b: one rounding
  EXPECT_GT(eb.max_rel, 4 * std::ldexp(1.0, -11));            // -g a / (b b): b b subnormal
}

// A user's classifier stored in f16 whose logits are divided by a learned temperature (0.005, so that the
// logits are sharp): the temperature's gradient divides by t * t = 2.5e-5, subnormal in f16 (spacing 2^-24).
struct Tempered : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Tempered(Generator& gen) : Module("Tempered") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(16, 32, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 8, gen));
    register_parameter("temperature", full({1}, 0.005));
  }
  Tensor forward(const Tensor& x) override {
    return (*fc2)(tanh((*fc1)(x))) * 0.05 / parameter("temperature");
  }
};

struct TemperedRun {
  std::vector<double> losses;
  std::vector<std::vector<double>> params, grads;
  std::vector<probe::PrecisionRow> rows;
};

// Trains the tempered classifier for `steps` steps; with the twin (wrapping the probe); into a trace at
// `trace_path` (the probe and the twin writing to it, as `ampscope train --twin` sets them up) when one is given.
TemperedRun train_tempered(bool with_twin, std::int64_t steps = 4, const std::string& trace_path = "") {
  Generator gen(5);
  Tempered model(gen);
  model.to(DType::f16);
  optim::SGD opt(model.parameters(), {.lr = 1e-3});
  std::shared_ptr<trace::Sink> sink = std::make_shared<NullSink>();
  std::shared_ptr<trace::TraceWriter> writer;
  if (!trace_path.empty()) {
    sink = writer = std::make_shared<trace::TraceWriter>(
        trace_path, trace::RunInfo{.precision = "fp16", .device = "cpu", .model = "tempered", .seed = 5, .config = "{}"});
  }
  auto probe = std::make_shared<probe::Probe>(sink);
  std::shared_ptr<probe::Hook> hook = probe;
  std::shared_ptr<probe::Twin> twin;
  if (with_twin) hook = twin = std::make_shared<probe::Twin>(hook, probe::TwinOptions{.every = 1, .sink = writer});
  probe::HookGuard installed(hook);
  const Tensor x = randn({32, 16}, gen).to(DType::f16);
  const Tensor target = (randn({32, 8}, gen) * 4.0).to(DType::f16);
  TemperedRun run;
  for (std::int64_t n = 0; n < steps; ++n) {
    probe::Step step(n);
    opt.zero_grad();
    const Tensor loss = mse_loss(model(x), target);
    loss.backward();
    if (n + 1 == steps) {
      for (const Tensor& p : model.parameters()) run.grads.push_back(p.grad().values());
    }
    run.losses.push_back(step.finish(loss, opt).loss);
  }
  for (const Tensor& p : model.parameters()) run.params.push_back(p.values());
  if (twin) run.rows = twin->rows();
  if (writer) {
    probe->flush();
    writer->close();
  }
  return run;
}

TEST(backward_twin_test, a_learned_temperature_whose_square_is_subnormal_ranks_first_among_backward_rows) {
  const TemperedRun run = train_tempered(true);
  const std::vector<probe::PrecisionRow> ranked = probe::rank_backward(run.rows);
  ASSERT_GE(ranked.size(), 3u);  // mse_loss, div, mul, linear, tanh, ...
  EXPECT_EQ(ranked[0].op, "div");
  EXPECT_EQ(ranked[0].phase, trace::Phase::backward);
  // t * t = 2.5e-5 in f16 is a multiple of 2^-24: its relative error alone is |t t - round(t t)| / (t t).
  const double t = f16_of(0.005), tt = t * t;
  const double quantum = std::ldexp(1.0, -24);
  const double tt_error = std::fabs(std::nearbyint(tt / quantum) * quantum - tt) / tt;
  EXPECT_GT(ranked[0].local_max_rel, tt_error / 2);
  EXPECT_GT(ranked[0].local_mean_rel, 2 * ranked[1].local_mean_rel);
  // The forward rankings take forward rows only.
  for (const probe::PrecisionRow& r : probe::rank_by_local(run.rows)) EXPECT_EQ(r.phase, trace::Phase::forward);
  for (const probe::PrecisionRow& r : probe::rank_by_jump(run.rows)) EXPECT_EQ(r.phase, trace::Phase::forward);
}

TEST(backward_twin_test, a_run_with_the_backward_twin_is_bit_identical_to_one_without) {
  const TemperedRun plain = train_tempered(false), twinned_run = train_tempered(true);
  ASSERT_FALSE(backward_rows(twinned_run.rows).empty());
  ASSERT_EQ(plain.losses.size(), twinned_run.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&plain.losses[i], &twinned_run.losses[i], sizeof(double)), 0) << "step " << i;
  }
  for (const auto* pair : {&plain.params, &plain.grads}) {
    const auto& other = pair == &plain.params ? twinned_run.params : twinned_run.grads;
    ASSERT_EQ(pair->size(), other.size());
    for (std::size_t p = 0; p < pair->size(); ++p) {
      ASSERT_EQ((*pair)[p].size(), other[p].size());
      EXPECT_EQ(std::memcmp((*pair)[p].data(), other[p].data(), other[p].size() * sizeof(double)), 0)
          << (pair == &plain.params ? "parameter " : "gradient ") << p;
    }
  }
}

// The report reads the backward rows back from the trace: the PRECISION section's backward list names the
// planted node first, as the backward of the forward op it belongs to, and the forward lists hold no backward row.
TEST(backward_twin_test, the_report_lists_the_planted_node_first_as_the_backward_of_its_op) {
  const std::string path = (testing::process_scratch_dir("ampscope_backward_twin") / "tempered.h5").string();
  const TemperedRun run = train_tempered(true, 3, path);
  trace::TraceReader reader(path);
  EXPECT_EQ(reader.format_version(), 9);
  std::int64_t written = 0;
  for (const trace::PrecisionRow& r : reader.precision()) written += r.phase == trace::Phase::backward ? 1 : 0;
  EXPECT_EQ(written, static_cast<std::int64_t>(backward_rows(run.rows).size()));
  const analysis::Report rep = analysis::analyse(reader);
  const analysis::PrecisionSection& p = rep.precision;
  EXPECT_EQ(p.backward_rows, written);
  ASSERT_FALSE(p.backward.empty());
  EXPECT_EQ(p.backward[0].op, "div");
  EXPECT_EQ(p.backward[0].phase, "backward");
  EXPECT_EQ(p.backward[0].module, probe::rank_backward(run.rows).front().module);
  for (const auto* list : {&p.by_jump, &p.by_local, &p.conditioning}) {
    for (const analysis::PrecisionEntry& e : *list) EXPECT_EQ(e.phase, "forward");
  }
  const std::string text = analysis::render_text(rep);
  EXPECT_NE(text.find("backward of div ["), std::string::npos) << text;
  // How the example in docs/report-format.md was made.
  if (std::getenv("AMPSCOPE_SHOW_PRECISION") != nullptr) std::cout << text;
}

// Nothing outside the twin's call computes under the f32 mode: a cast or an empty tensor made after a node's
// backward ran again has the dtype asked for.
TEST(backward_twin_test, the_f32_mode_ends_with_the_nodes_second_run) {
  const Tensor A = f16_leaf({1.0, 2.0}, {2});
  twinned([&] { mul(A, A).backward(from_values({1.0, 1.0}, {2}, {DType::f16})); });
  EXPECT_FALSE(autograd::widening_to_f32());
  EXPECT_EQ(Tensor::empty({2}, {DType::f16}).dtype(), DType::f16);
  EXPECT_EQ(from_values({0.1}, {1}).to(DType::bf16).dtype(), DType::bf16);
  {
    autograd::WidenToF32 widen;
    EXPECT_EQ(Tensor::empty({2}, {DType::f16}).dtype(), DType::f32);
    EXPECT_EQ(from_values({0.1}, {1}).to(DType::bf16).dtype(), DType::f32);
    EXPECT_EQ(add(A.detach(), A.detach()).dtype(), DType::f32);  // f16 inputs widened, the result f32
  }
  EXPECT_EQ(add(A.detach(), A.detach()).dtype(), DType::f16);
}

}  // namespace
}  // namespace ampscope
