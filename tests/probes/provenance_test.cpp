// tests/probes/provenance_test.cpp: dataflow provenance (trace::OpRow::inputs, format_version 2). Each
// op row names the rows that produced its inputs; the expected seqs below follow from the order the ops
// are called in (seq counts the step's reported ops from 0, forward and backward together), worked out by
// hand next to each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/probes/memory_sink.h"
#include "tests/trace/trace_test_util.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using testing::MemorySink;
using trace::kInputData;
using trace::kInputNone;
using trace::kInputParameter;
using trace::kInputSummed;
using trace::kInputUnknown;
using trace::kInputUnrecorded;
using Inputs = std::array<std::int64_t, trace::kOpInputs>;

const trace::OpRow& row(const std::vector<trace::OpRow>& rows, std::int64_t seq) {
  auto it = std::find_if(rows.begin(), rows.end(), [&](const trace::OpRow& r) { return r.seq == seq; });
  if (it == rows.end()) throw std::runtime_error("no row with seq " + std::to_string(seq));
  return *it;
}

// The hand-written binary cross-entropy of issue 15's tagger, on one linear layer.
//   seq 0 linear(x data, w parameter, b parameter)     (autocast: x and w cast to f16; the cast is not a row)
//   seq 1 sigmoid(0)
//   seq 2 neg(1)
//   seq 3 add(2, scalar 1.0)   -> 1 - s
//   seq 4 log(3)
//   seq 5 mean(4)
Tensor tagger_loss(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor z = linear(x, w, b);
  Tensor s = sigmoid(z);
  Tensor one_minus = add(neg(s), 1.0);
  return mean(log(one_minus));
}

TEST(Provenance, ForwardRowsNameTheirProducersThroughAutocastCasts) {
  auto sink = std::make_shared<MemorySink>();
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
  Generator gen(3);
  Tensor x = randn({4, 3}, gen);
  Tensor w = randn({2, 3}, gen).requires_grad_();
  Tensor b = zeros({2}).requires_grad_();
  {
    probe::StepScope scope(0);
    AutocastGuard autocast(DType::f16);
    Tensor loss = tagger_loss(x, w, b);
    scope.end({.step = 0});
  }
  const auto ops = sink->ops_of_step(0);
  ASSERT_GE(ops.size(), 6u);
  EXPECT_EQ(row(ops, 0).op, "linear");
  EXPECT_EQ(row(ops, 0).inputs, (Inputs{kInputData, kInputParameter, kInputParameter, kInputNone}));
  EXPECT_EQ(row(ops, 1).inputs, (Inputs{0, kInputNone, kInputNone, kInputNone}));
  EXPECT_EQ(row(ops, 2).inputs, (Inputs{1, kInputNone, kInputNone, kInputNone}));
  EXPECT_EQ(row(ops, 3).op, "add");
  EXPECT_EQ(row(ops, 3).inputs, (Inputs{2, kInputNone, kInputNone, kInputNone}));
  EXPECT_EQ(row(ops, 4).inputs, (Inputs{3, kInputNone, kInputNone, kInputNone}));
  EXPECT_EQ(row(ops, 5).inputs, (Inputs{4, kInputNone, kInputNone, kInputNone}));
}

TEST(Provenance, BackwardRowsNameTheGradientTheyReceived) {
  auto sink = std::make_shared<MemorySink>();
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
  Generator gen(4);
  Tensor x = randn({4, 3}, gen);
  Tensor w = randn({3, 3}, gen).requires_grad_();
  {
    probe::StepScope scope(0);
    // seq 0 linear(x, w); seq 1 mul(0, 0): both inputs are the linear's output, so its backward returns two
    // gradients for the same node, which the engine sums; seq 2 sum(1).
    Tensor h = linear(x, w);
    Tensor sq = mul(h, h);
    Tensor loss = sum(sq);
    loss.backward();
    scope.end({.step = 0});
  }
  const auto ops = sink->ops_of_step(0);
  EXPECT_EQ(row(ops, 1).inputs, (Inputs{0, 0, kInputNone, kInputNone}));
  // Backward runs newest first: seq 3 the backward of sum (its incoming gradient is the root's ones: data),
  // seq 4 the backward of mul (receives seq 3's gradient), seq 5 the backward of linear (receives the sum of
  // mul's two gradients).
  std::vector<trace::OpRow> backward;
  for (const auto& r : ops)
    if (r.phase == trace::Phase::backward) backward.push_back(r);
  ASSERT_EQ(backward.size(), 3u);
  EXPECT_EQ(backward[0].op, "sum");
  EXPECT_EQ(backward[0].inputs[0], kInputData);
  EXPECT_EQ(backward[1].op, "mul");
  EXPECT_EQ(backward[1].inputs[0], backward[0].seq);
  EXPECT_EQ(backward[2].op, "linear");
  EXPECT_EQ(backward[2].inputs[0], kInputSummed);
}

// Views, clones and detached tensors are the same values, not ops: they carry their source's producer.
TEST(Provenance, ViewsAndClonesCarryTheirSourcesProducer) {
  auto sink = std::make_shared<MemorySink>();
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
  Generator gen(9);
  {
    probe::StepScope scope(0);
    Tensor s = sigmoid(randn({4, 3}, gen));              // seq 0
    Tensor a = neg(s.reshape({12}));                      // seq 1, its input a view of seq 0
    Tensor b = neg(s.transpose(0, 1).contiguous());      // seq 2 (contiguous copies: not a reported op)
    Tensor c = neg(s.clone().detach());                   // seq 3
    scope.end({.step = 0});
  }
  const auto ops = sink->ops_of_step(0);
  ASSERT_EQ(ops.size(), 4u);
  for (std::int64_t seq = 1; seq <= 3; ++seq) EXPECT_EQ(row(ops, seq).inputs[0], 0) << "seq " << seq;
}

// Attention's own steps (bmm, softmax) run on autocast's casts of q, k and v reshaped into heads: their
// inputs still name the linear rows that made q, k and v.
TEST(Provenance, AttentionStepsNameTheProjectionsThroughCastsAndReshapes) {
  auto sink = std::make_shared<MemorySink>();
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
  Generator gen(10);
  Tensor x = randn({2, 4, 8}, gen);
  Tensor wq = randn({8, 8}, gen).requires_grad_();
  Tensor wk = randn({8, 8}, gen).requires_grad_();
  Tensor wv = randn({8, 8}, gen).requires_grad_();
  std::vector<trace::OpRow> ops;
  {
    probe::StepScope scope(0);
    AutocastGuard autocast(DType::f16);
    Tensor q = linear(x, wq);  // seq 0
    Tensor k = linear(x, wk);  // seq 1
    Tensor v = linear(x, wv);  // seq 2
    scaled_dot_product_attention(q, k, v, /*causal=*/true);
    scope.end({.step = 0});
  }
  ops = sink->ops_of_step(0);
  const auto bmm = std::find_if(ops.begin(), ops.end(), [](const trace::OpRow& r) { return r.op == "bmm"; });
  ASSERT_NE(bmm, ops.end());
  // The first bmm is q against k's transpose: inputs 0 and 1 name seqs 0 and 1.
  EXPECT_EQ(bmm->inputs[0], 0);
  EXPECT_EQ(bmm->inputs[1], 1);
}

TEST(Provenance, AnOpTheProbeSkippedIsUnrecordedNotData) {
  auto sink = std::make_shared<MemorySink>();
  // Only log is recorded: its input comes from add, which the probe skipped.
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.ops = {"log"}}));
  Generator gen(5);
  Tensor x = randn({4, 3}, gen);
  Tensor w = randn({2, 3}, gen).requires_grad_();
  Tensor b = zeros({2}).requires_grad_();
  {
    probe::StepScope scope(0);
    tagger_loss(x, w, b);
    scope.end({.step = 0});
  }
  const auto ops = sink->ops_of_step(0);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].op, "log");
  EXPECT_EQ(ops[0].inputs[0], kInputUnrecorded);
}

TEST(Provenance, ATensorFromAnEarlierStepIsMarkedAsSuch) {
  auto sink = std::make_shared<MemorySink>();
  probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
  Generator gen(6);
  Tensor kept;
  {
    probe::StepScope scope(0);
    kept = exp(randn({3}, gen));  // seq 0 of step 0
    scope.end({.step = 0});
  }
  {
    probe::StepScope scope(1);
    Tensor y = log(kept);  // seq 0 of step 1: its input's producer is in step 0
    scope.end({.step = 1});
  }
  const auto ops = sink->ops_of_step(1);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].inputs[0], trace::kInputOtherStep);
}

TEST(Provenance, OpsOutsideStepsAreNotRecordedUnlessAskedFor) {
  Generator gen(7);
  Tensor x = randn({3}, gen);
  {
    auto sink = std::make_shared<MemorySink>();
    probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
    exp(x);  // an evaluation pass after training: no StepScope
    EXPECT_TRUE(sink->ops.empty());
  }
  {
    auto sink = std::make_shared<MemorySink>();
    probe::HookGuard installed(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.outside_steps = true}));
    exp(x);
    ASSERT_EQ(sink->ops.size(), 1u);
    EXPECT_EQ(sink->ops[0].step, -1);
    // Two evaluation passes around a step: the second one's seqs are new, so its log names its own exp.
    Tensor e1 = exp(x);
    { probe::StepScope scope(0); scope.end({.step = 0}); }
    Tensor e2 = exp(x);
    Tensor l2 = log(e2);
    const trace::OpRow& second_exp = sink->ops[sink->ops.size() - 2];
    const trace::OpRow& second_log = sink->ops.back();
    EXPECT_EQ(second_log.inputs[0], second_exp.seq);
    for (std::size_t i = 0; i + 2 < sink->ops.size(); ++i) EXPECT_NE(sink->ops[i].seq, second_exp.seq) << i;
  }
}

TEST(Provenance, DescribeNamesFiltersSamplingAndOverrides) {
  AutocastOverrideGuard keep({.module = "blocks.*.attn", .precision = Precision::f32});
  const std::string d = probe::describe({.level = probe::Level::full, .modules = {"head"}, .every = 5});
  EXPECT_NE(d.find(R"("level":"full")"), std::string::npos) << d;
  EXPECT_NE(d.find(R"("modules":["head"])"), std::string::npos) << d;
  EXPECT_NE(d.find(R"("every":5)"), std::string::npos) << d;
  EXPECT_NE(d.find(R"("module":"blocks.*.attn")"), std::string::npos) << d;
}

// Written to a file and read back: the inputs column and the probe attribute survive; a format_version 1
// trace (written by ampscope before provenance, tests/fixtures) reads with every input unknown.
TEST(Provenance, RoundTripsThroughTheTraceAndOldTracesReadAsUnknown) {
  const trace::testing::TempDir dir;
  const std::filesystem::path path = dir.file("p.h5");
  probe::ProbeOptions options;
  trace::RunInfo info{.precision = "fp16", .device = "cpu", .model = "hand", .seed = 1, .config = "{}",
                      .probe = probe::describe(options)};
  {
    auto writer = std::make_shared<trace::TraceWriter>(path, info);
    auto probe = std::make_shared<probe::Probe>(writer, options);
    probe::HookGuard installed(probe);
    Generator gen(8);
    Tensor x = randn({4, 3}, gen);
    Tensor w = randn({2, 3}, gen).requires_grad_();
    Tensor b = zeros({2}).requires_grad_();
    {
      probe::StepScope scope(0);
      AutocastGuard autocast(DType::f16);
      tagger_loss(x, w, b);
      scope.end({.step = 0});
    }
    probe->flush();
    writer->close();
  }
  trace::TraceReader r(path);
  EXPECT_EQ(r.format_version(), trace::kFormatVersion);  // 2 added provenance
  EXPECT_EQ(r.run_info().probe, info.probe);
  const auto ops = r.ops();
  ASSERT_GE(ops.size(), 6u);
  EXPECT_EQ(row(ops, 0).inputs, (Inputs{kInputData, kInputParameter, kInputParameter, kInputNone}));
  EXPECT_EQ(row(ops, 4).inputs, (Inputs{3, kInputNone, kInputNone, kInputNone}));

  trace::TraceReader old(std::filesystem::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v1-mlp-log-zero.h5");
  EXPECT_EQ(old.format_version(), 1);
  EXPECT_EQ(old.run_info().probe, "");
  const auto old_ops = old.ops();
  ASSERT_FALSE(old_ops.empty());
  for (const auto& o : old_ops) EXPECT_EQ(o.inputs, (Inputs{kInputUnknown, kInputUnknown, kInputUnknown, kInputUnknown}));
}

}  // namespace
}  // namespace ampscope
