// tests/core/what_if_test.cpp: --what-if's measurement (core/what_if.h, core/block_recipe.h) on a tiny model.
//
// A test hook captures every probe::BlockQuantizeEvent. Each event's statistics must equal those of the same operand
// values quantized directly here with core/block_scaled.h in the layout the recipe prescribes, written out in the
// test (the transposes, the Hadamard transform of the wgrad operands, 16x16 weight tiles, stochastic rounding from
// the stream block_rounding_seed(seed) at offsets counted here in the backward's order), and two fields (underflow,
// rel_rms_error) are also counted here from the dequantized values. The operand values are obtained from the model
// itself: x and W rounded to bf16 by autocast, the second Linear's input from the first Linear's output, and the
// gradients from a run cut at the second Linear's input. The run with the measurement must be the run without it:
// outputs, gradients and the hook's op events bit for bit.
#include "core/what_if.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/block_scaled.h"
#include "core/block_stats.h"
#include "core/fp8_linear.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "core/tensor.h"
#include "probes/twin.h"

namespace ampscope {
namespace {

struct Captured {
  std::int64_t step;
  std::string module, operand, copy, format;
  bool what_if;
  std::int64_t rows, cols;
  BlockStats stats;
};

struct OpSeen {
  std::string op, scope;
  probe::Phase phase;
  std::vector<double> output;
};

class CaptureHook : public probe::Hook {
 public:
  std::vector<Captured> events;
  std::vector<OpSeen> ops;
  std::int64_t fp8_events = 0;
  void on_block_quantize(const probe::BlockQuantizeEvent& e) override {
    events.push_back({e.step, e.module, std::string(e.operand), std::string(e.copy), std::string(e.format), e.what_if,
                      e.rows, e.cols, e.stats});
  }
  void on_op(const probe::OpEvent& e) override { ops.push_back({std::string(e.op), e.scope, e.phase, e.output.values()}); }
  void on_backward_op(const probe::OpEvent& e) override {
    ops.push_back({std::string(e.op), e.scope, e.phase, e.output.defined() ? e.output.values() : std::vector<double>{}});
  }
  void on_fp8_quantize(const probe::Fp8QuantizeEvent&) override { ++fp8_events; }
};

std::vector<float> as_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

std::vector<float> transpose(const std::vector<float>& m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return t;
}

// Underflow and the relative RMS error counted from the dequantized values (block_stats.h's definitions).
void expect_counts(const std::vector<float>& x, const std::vector<float>& back, const BlockStats& s, const std::string& where) {
  std::int64_t under = 0;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0 && back[i] == 0) ++under;
    num += (double{back[i]} - x[i]) * (double{back[i]} - x[i]);
    den += double{x[i]} * x[i];
  }
  EXPECT_EQ(s.underflow, under) << where;
  EXPECT_NEAR(s.rel_rms_error, std::sqrt(num / den), 1e-12) << where;
}

void expect_same(const BlockStats& a, const BlockStats& b, const std::string& where) {
  EXPECT_EQ(a.numel, b.numel) << where;
  EXPECT_EQ(a.nonzero, b.nonzero) << where;
  EXPECT_EQ(a.underflow, b.underflow) << where;
  EXPECT_EQ(a.saturated, b.saturated) << where;
  EXPECT_EQ(a.blocks, b.blocks) << where;
  EXPECT_EQ(a.blocks_clipped, b.blocks_clipped) << where;
  EXPECT_EQ(a.max_block_range, b.max_block_range) << where;
  EXPECT_EQ(a.max_range_block, b.max_range_block) << where;
  EXPECT_EQ(a.worst_block, b.worst_block) << where;
  EXPECT_EQ(a.scale_log2_min, b.scale_log2_min) << where;
  EXPECT_EQ(a.scale_log2_median, b.scale_log2_median) << where;
  EXPECT_EQ(a.scale_log2_max, b.scale_log2_max) << where;
  EXPECT_EQ(a.rel_rms_error, b.rel_rms_error) << where;
}

// The statistics a copy must have, from the operand values [R, C] as the Linear holds them.
BlockStats expected(const std::vector<float>& v, std::int64_t R, std::int64_t C, const std::string& format,
                    const std::string& operand, bool columnwise, std::uint64_t seed, std::uint64_t offset,
                    std::int64_t& rows, std::int64_t& cols, const std::string& where) {
  if (format == "mxfp8") {
    rows = R, cols = C;
    const MxTensor q = quantize_mxfp8(v, R, C, {.axis = columnwise ? BlockAxis::along_column : BlockAxis::along_row,
                                                .element = Fp8Format::e4m3, .rule = MxScaleRule::round_up});
    const BlockStats s = mxfp8_block_stats(v, q);
    expect_counts(v, dequantize_mxfp8(q), s, where);
    return s;
  }
  std::vector<float> seen = v;
  rows = R, cols = C;
  if (columnwise) {
    seen = transpose(v, R, C);
    rows = C, cols = R;
    if (operand != "weight") seen = random_hadamard_transform(seen);  // the wgrad operands
  }
  Nvfp4Options o{.tile = operand == "weight" ? Nvfp4Tile::square_16x16 : Nvfp4Tile::row_1x16,
                 .stochastic_rounding = operand == "grad_output",
                 .stream = {.seed = seed ^ 0x9E3779B97F4A7C15ull, .offset = offset}};
  const Nvfp4Tensor q = quantize_nvfp4(seen, rows, cols, o);
  const BlockStats s = nvfp4_block_stats(seen, q);
  expect_counts(seen, dequantize_nvfp4(q), s, where);
  return s;
}

struct Model {
  nn::Sequential seq;
  std::shared_ptr<nn::Linear> l0, l1;
  explicit Model(std::uint64_t seed) {
    Generator gen(seed);
    l0 = seq.push_back(std::make_shared<nn::Linear>(64, 32, gen));
    l1 = seq.push_back(std::make_shared<nn::Linear>(32, 32, gen));
  }
};

constexpr std::int64_t kRows = 32;

Tensor input(std::uint64_t seed) {
  Generator gen(seed + 100);
  return randn({kRows, 64}, gen);
}
Tensor loss_weights(std::uint64_t seed) {
  Generator gen(seed + 200);
  return randn({kRows, 32}, gen);
}

// One step of the model: loss = sum(f32(y) * c) under bf16 autocast; returns the loss, the output and the gradients.
struct StepValues {
  std::vector<double> out, loss, g0, g1, b0, b1;
};
StepValues run_step(Model& m, const Tensor& x, const Tensor& c, std::shared_ptr<WhatIfContext> what_if,
                    std::shared_ptr<Fp8Context> fp8 = nullptr) {
  for (const Tensor& p : m.seq.parameters()) {
    Tensor mp = p;
    if (mp.grad().defined()) mp.grad().fill_(0.0);
  }
  Tensor y, loss;
  {
    AutocastGuard autocast(DType::bf16);
    WhatIfGuard measured(what_if);
    Fp8Guard region(fp8);
    y = m.seq(x);
    loss = sum(mul(y.to(DType::f32), c));
  }
  loss.backward();
  return {y.values(), loss.values(), m.l0->weight().grad().values(), m.l1->weight().grad().values(),
          m.l0->bias().grad().values(), m.l1->bias().grad().values()};
}

TEST(WhatIf, EveryCopyOfEveryOperandHasTheStatisticsOfTheRecipesQuantization) {
  const std::uint64_t seed = 7;
  Model m(seed);
  const Tensor x = input(seed), c = loss_weights(seed);
  // The operand values, as the Linears see them: bf16 x and W; the first Linear's bf16 output; the gradients.
  std::vector<float> xv, w0, w1, h, dy1, dy0;
  {
    AutocastGuard autocast(DType::bf16);
    xv = as_float(x.to(DType::bf16).values());
    w0 = as_float(m.l0->weight().to(DType::bf16).values());
    w1 = as_float(m.l1->weight().to(DType::bf16).values());
  }
  {
    // dy of the second Linear is bf16(c); the first's is what the second's backward hands back: cut the graph at
    // the second Linear's input to read it.
    AutocastGuard autocast(DType::bf16);
    Tensor h0 = (*m.l0)(x).detach();
    h = as_float(h0.values());
    h0.requires_grad_();
    Tensor y = (*m.l1)(h0);
    Tensor loss = sum(mul(y.to(DType::f32), c));
    loss.backward();
    dy0 = as_float(h0.grad().values());
    dy1 = as_float(c.to(DType::bf16).values());
    for (const Tensor& p : m.seq.parameters()) {
      Tensor mp = p;
      if (mp.grad().defined()) mp.grad().fill_(0.0);
    }
  }
  auto hook = std::make_shared<CaptureHook>();
  probe::HookGuard installed(hook);
  auto what_if = std::make_shared<WhatIfContext>(
      WhatIfOptions{.formats = {BlockFormat::mxfp8, BlockFormat::nvfp4}, .seed = seed});
  run_step(m, x, c, what_if);

  // module, operand, copy, values, R, C, in the order the recipe quantizes them; each in both formats.
  struct Want {
    const char* module;
    const char* operand;
    bool columnwise;
    const std::vector<float>* v;
    std::int64_t R, C;
  };
  const std::vector<Want> want = {
      // "0": its input needs no gradient (x is data): no W columnwise (dgrad) copy, no dy rowwise copy.
      {"0", "input", false, &xv, kRows, 64}, {"0", "weight", false, &w0, 32, 64}, {"0", "input", true, &xv, kRows, 64},
      {"1", "input", false, &h, kRows, 32},  {"1", "weight", false, &w1, 32, 32}, {"1", "weight", true, &w1, 32, 32},
      {"1", "input", true, &h, kRows, 32},
      // The backward runs "1" first.
      {"1", "grad_output", false, &dy1, kRows, 32}, {"1", "grad_output", true, &dy1, kRows, 32},
      {"0", "grad_output", true, &dy0, kRows, 32}};
  ASSERT_EQ(hook->events.size(), want.size() * 2);
  std::uint64_t nvfp4_offset = 0;  // advanced by ceil(n / 4) per NVFP4 gradient copy, in this order
  for (std::size_t i = 0; i < hook->events.size(); ++i) {
    const Want& w = want[i / 2];
    const Captured& e = hook->events[i];
    const std::string format = i % 2 == 0 ? "mxfp8" : "nvfp4";
    const std::string where = std::string(w.module) + " " + w.operand + " " + (w.columnwise ? "columnwise" : "rowwise") +
                              " " + format;
    EXPECT_EQ(e.module, w.module) << where;
    EXPECT_EQ(e.operand, w.operand) << where;
    EXPECT_EQ(e.copy, w.columnwise ? "columnwise" : "rowwise") << where;
    EXPECT_EQ(e.format, format) << where;
    EXPECT_TRUE(e.what_if) << where;
    EXPECT_EQ(e.step, probe::current_step()) << where;
    std::int64_t rows = 0, cols = 0;
    const BlockStats s = expected(*w.v, w.R, w.C, format, w.operand, w.columnwise, seed, nvfp4_offset, rows, cols, where);
    if (format == "nvfp4" && std::string(w.operand) == "grad_output") nvfp4_offset += (w.v->size() + 3) / 4;
    EXPECT_EQ(e.rows, rows) << where;
    EXPECT_EQ(e.cols, cols) << where;
    expect_same(e.stats, s, where);
    if (format == "nvfp4" && std::string(w.operand) != "weight") {
      EXPECT_GT(e.stats.underflow, 0) << where;
    }
  }
  EXPECT_EQ(what_if->random_offset(BlockFormat::nvfp4), nvfp4_offset);
  EXPECT_EQ(what_if->random_offset(BlockFormat::mxfp8), 0u);
}

TEST(WhatIf, TheRunWithTheMeasurementIsTheRunWithoutIt) {
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8 run" : "bf16 run");
    const std::uint64_t seed = 3;
    const Tensor x = input(seed), c = loss_weights(seed);
    auto fp8_context = [&] { return fp8 ? std::make_shared<Fp8Context>(Fp8Options{}) : nullptr; };
    Model a(seed), b(seed);
    auto hook_a = std::make_shared<CaptureHook>(), hook_b = std::make_shared<CaptureHook>();
    StepValues plain, measured;
    {
      probe::HookGuard installed(hook_a);
      plain = run_step(a, x, c, nullptr, fp8_context());
    }
    {
      probe::HookGuard installed(hook_b);
      measured = run_step(b, x, c,
                          std::make_shared<WhatIfContext>(
                              WhatIfOptions{.formats = {BlockFormat::nvfp4, BlockFormat::mxfp8}, .seed = seed}),
                          fp8_context());
    }
    EXPECT_EQ(plain.out, measured.out);
    EXPECT_EQ(plain.loss, measured.loss);
    EXPECT_EQ(plain.g0, measured.g0);
    EXPECT_EQ(plain.g1, measured.g1);
    EXPECT_EQ(plain.b0, measured.b0);
    EXPECT_EQ(plain.b1, measured.b1);
    ASSERT_EQ(hook_a->ops.size(), hook_b->ops.size());
    for (std::size_t i = 0; i < hook_a->ops.size(); ++i) {
      EXPECT_EQ(hook_a->ops[i].op, hook_b->ops[i].op) << i;
      EXPECT_EQ(hook_a->ops[i].scope, hook_b->ops[i].scope) << i;
      EXPECT_EQ(hook_a->ops[i].phase, hook_b->ops[i].phase) << i;
      EXPECT_EQ(hook_a->ops[i].output, hook_b->ops[i].output) << i;
    }
    EXPECT_EQ(hook_a->fp8_events, hook_b->fp8_events);
    if (fp8) {
      EXPECT_EQ(hook_b->fp8_events, 6);  // 2 Linears x (input, weight, grad_output)
    }
    EXPECT_TRUE(hook_a->events.empty());
    EXPECT_EQ(hook_b->events.size(), 20u);
  }
}

TEST(WhatIf, TheTwinPassesTheEventsOnAndItsRecomputationsAddNone) {
  // `ampscope train --what-if --twin`: the f32 twin wraps the probe. Its forward recomputations (f32) and widened
  // backward nodes measure nothing, and the measured events reach the probe unchanged: as many as without the twin.
  const std::uint64_t seed = 6;
  const Tensor x = input(seed), c = loss_weights(seed);
  auto options = WhatIfOptions{.formats = {BlockFormat::mxfp8, BlockFormat::nvfp4}, .seed = seed};
  Model a(seed), b(seed);
  auto alone = std::make_shared<CaptureHook>(), inner = std::make_shared<CaptureHook>();
  {
    probe::HookGuard installed(alone);
    probe::StepScope scope(0);
    run_step(a, x, c, std::make_shared<WhatIfContext>(options));
  }
  {
    probe::HookGuard installed(std::make_shared<probe::Twin>(inner));
    probe::StepScope scope(0);
    run_step(b, x, c, std::make_shared<WhatIfContext>(options));
  }
  ASSERT_EQ(alone->events.size(), 20u);
  ASSERT_EQ(inner->events.size(), alone->events.size());
  for (std::size_t i = 0; i < alone->events.size(); ++i) {
    EXPECT_EQ(inner->events[i].module, alone->events[i].module) << i;
    EXPECT_EQ(inner->events[i].copy, alone->events[i].copy) << i;
    expect_same(inner->events[i].stats, alone->events[i].stats, std::to_string(i));
  }
}

TEST(WhatIf, KeptModulesF32LinearsTheTwinsWideningAndNoHookAreNotMeasured) {
  const std::uint64_t seed = 4;
  Model m(seed);
  const Tensor x = input(seed), c = loss_weights(seed);
  auto hook = std::make_shared<CaptureHook>();
  {
    probe::HookGuard installed(hook);
    run_step(m, x, c,
             std::make_shared<WhatIfContext>(WhatIfOptions{.formats = {BlockFormat::mxfp8}, .keep_bf16 = {"1"}}));
  }
  ASSERT_EQ(hook->events.size(), 4u);  // "0": x rowwise, W rowwise, x columnwise; dy columnwise
  for (const Captured& e : hook->events) EXPECT_EQ(e.module, "0");
  hook->events.clear();
  {
    probe::HookGuard installed(hook);
    auto what_if = std::make_shared<WhatIfContext>(WhatIfOptions{.formats = {BlockFormat::mxfp8}});
    WhatIfGuard measured(what_if);
    NoGradGuard no_grad;
    (void)m.seq(x);  // f32: no autocast
    {
      AutocastGuard autocast(DType::bf16);
      autograd::WidenToF32 widening;  // the twin's recompute
      (void)m.seq(x);
    }
  }
  EXPECT_TRUE(hook->events.empty());
  {
    // No hook: nothing is measured (not even the shape check runs: a Linear of 10 outputs passes).
    Generator gen(1);
    nn::Linear odd(64, 10, gen);
    auto what_if = std::make_shared<WhatIfContext>(WhatIfOptions{.formats = {BlockFormat::mxfp8}});
    AutocastGuard autocast(DType::bf16);
    WhatIfGuard measured(what_if);
    EXPECT_NO_THROW((void)odd(x));
  }
}

TEST(WhatIf, EvalMeasuresTheForwardCopiesOnlyAndAShapeTheFormatCannotBlockIsRefused) {
  Model m(5);
  const Tensor x = input(5);
  auto hook = std::make_shared<CaptureHook>();
  probe::HookGuard installed(hook);
  auto what_if = std::make_shared<WhatIfContext>(WhatIfOptions{.formats = {BlockFormat::nvfp4}});
  WhatIfGuard measured(what_if);
  {
    AutocastGuard autocast(DType::bf16);
    NoGradGuard no_grad;
    (void)m.seq(x.slice(0, 0, 8));  // 8 rows: fine without gradients (no wgrad contraction over the rows)
  }
  ASSERT_EQ(hook->events.size(), 4u);
  for (const Captured& e : hook->events) EXPECT_EQ(e.copy, "rowwise");
  // With gradients the 8 rows are the wgrad contraction: refused, as a real nvfp4 run would. (A new autocast region:
  // the previous one's cast cache holds the weights cast without gradients.)
  try {
    AutocastGuard autocast(DType::bf16);
    (void)m.seq(x.slice(0, 0, 8));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--what-if nvfp4: linear in '0': nvfp4 quantizes in 1x16 blocks along each GEMM's contraction dimension "
              "and 16x16 weight tiles, so in_features, out_features and the input's rows must be multiples of 16, but "
              "the weight is [32, 64] and the input has 8 rows\nhint: keep this Linear in bf16 (--fp8-keep-bf16 '0'), "
              "or make its sizes and the batch's rows multiples of 16");
  }
}

}  // namespace
}  // namespace ampscope
