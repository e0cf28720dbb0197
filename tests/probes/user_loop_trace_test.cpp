// tests/probes/user_loop_trace_test.cpp: a training loop written as a user writes it (a module of their own,
// f16 autocast, GradScaler, AdamW, gradients accumulated over micro-batches), probed at level health into the
// HDF5 trace writer, reads back exactly as the probe wrote it (issue 37). Its steps are short (a few dozen rows),
// so the writer takes the paths built for short steps: chunks under 256 rows whose unfinished chunk is coded at
// every step end by the codec's own fixed-code block and compressed on the writer thread, /index written with
// H5Dwrite_chunk; and the CPU pool's threads spin (and yield) between the step's kernels. The reference is the
// same rows kept in memory by a second sink the probe writes to at the same time: every field read back from the
// file, mid-run (while the writer holds it) and after close, must be the bits the probe produced.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/probes/memory_sink.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope {
namespace {

using testing::MemorySink;

// Every row to both sinks: the file and the memory that is the test's reference.
struct TeeSink : trace::Sink {
  TeeSink(std::shared_ptr<trace::TraceWriter> file, std::shared_ptr<MemorySink> memory) : file(std::move(file)), memory(std::move(memory)) {}
  void write(const trace::StepRow& r) override { file->write(r), memory->write(r); }
  void write(const trace::OpRow& r) override { file->write(r), memory->write(r); }
  void write(const trace::GradRow& r) override { file->write(r), memory->write(r); }
  void write(const trace::EventRow& r) override { file->write(r), memory->write(r); }
  void write(const trace::HistogramRow& r) override { file->write(r), memory->write(r); }
  void write(const trace::DumpRow& r) override { file->write(r), memory->write(r); }
  void end_step(std::int64_t step) override { file->end_step(step), memory->end_step(step); }
  std::shared_ptr<trace::TraceWriter> file;
  std::shared_ptr<MemorySink> memory;
};

class Classifier : public nn::Module {
 public:
  explicit Classifier(Generator& gen) : nn::Module("Classifier") {
    embed_ = register_module("embed", std::make_shared<nn::Linear>(20, 48, gen));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{48}));
    act_ = register_module("act", std::make_shared<nn::GELU>(GeluApproximation::tanh));
    head_ = register_module("head", std::make_shared<nn::Linear>(48, 5, gen));
  }

 protected:
  Tensor forward(const Tensor& x) override { return (*head_)((*act_)((*norm_)((*embed_)(x)))); }

 private:
  std::shared_ptr<nn::Linear> embed_, head_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::GELU> act_;
};

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

void expect_same_health(const trace::TensorHealth& got, const trace::TensorHealth& want, const std::string& what) {
  EXPECT_EQ(got.numel, want.numel) << what;
  EXPECT_EQ(got.nan, want.nan) << what;
  EXPECT_EQ(got.pos_inf, want.pos_inf) << what;
  EXPECT_EQ(got.neg_inf, want.neg_inf) << what;
  EXPECT_EQ(got.zero, want.zero) << what;
  EXPECT_EQ(got.subnormal, want.subnormal) << what;
  for (const auto& [name, g, w] : {std::tuple{"min", got.min, want.min}, std::tuple{"max", got.max, want.max},
                                   std::tuple{"absmax", got.absmax, want.absmax}, std::tuple{"mean", got.mean, want.mean},
                                   std::tuple{"rms", got.rms, want.rms}}) {
    EXPECT_TRUE(same_bits(g, w)) << what << " " << name << ": read " << g << ", written " << w;
  }
}

// The file's rows against the memory's, field by field, for the steps before `steps`.
void expect_file_holds(trace::TraceReader& r, const MemorySink& memory, std::int64_t steps, const std::string& when) {
  SCOPED_TRACE(when);
  std::vector<trace::OpRow> want_ops;
  for (const trace::OpRow& o : memory.ops) {
    if (o.step < steps) want_ops.push_back(o);
  }
  const std::vector<trace::OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), want_ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const trace::OpRow &g = ops[i], &w = want_ops[i];
    const std::string what = "op row " + std::to_string(i) + " (step " + std::to_string(w.step) + ", " + w.op + " " + w.module + ")";
    EXPECT_EQ(g.step, w.step) << what;
    EXPECT_EQ(g.seq, w.seq) << what;
    EXPECT_EQ(g.phase, w.phase) << what;
    EXPECT_EQ(g.op, w.op) << what;
    EXPECT_EQ(g.module, w.module) << what;
    EXPECT_EQ(g.in_dtypes, w.in_dtypes) << what;
    EXPECT_EQ(g.out_dtype, w.out_dtype) << what;
    EXPECT_EQ(g.shape, w.shape) << what;
    EXPECT_EQ(g.autocast, w.autocast) << what;
    EXPECT_EQ(g.cast_overflow, w.cast_overflow) << what;
    EXPECT_EQ(g.cast_underflow, w.cast_underflow) << what;
    EXPECT_EQ(g.origin, w.origin) << what;
    EXPECT_EQ(g.inputs, w.inputs) << what;
    expect_same_health(g.health, w.health, what);
  }
  std::vector<trace::GradRow> want_grads;
  for (const trace::GradRow& g : memory.grads) {
    if (g.step < steps) want_grads.push_back(g);
  }
  const std::vector<trace::GradRow> grads = r.grads();
  ASSERT_EQ(grads.size(), want_grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const trace::GradRow &g = grads[i], &w = want_grads[i];
    const std::string what = "gradient row " + std::to_string(i) + " (step " + std::to_string(w.step) + ", " + w.param + ")";
    EXPECT_EQ(g.step, w.step) << what;
    EXPECT_EQ(g.param, w.param) << what;
    EXPECT_EQ(g.dtype, w.dtype) << what;
    EXPECT_EQ(g.unscaled, w.unscaled) << what;
    EXPECT_EQ(g.nan + g.pos_inf + g.neg_inf, w.nan + w.pos_inf + w.neg_inf) << what;
    EXPECT_EQ(g.zero, w.zero) << what;
    EXPECT_TRUE(same_bits(g.absmax, w.absmax)) << what;
    EXPECT_TRUE(same_bits(g.norm, w.norm)) << what;
  }
  std::vector<trace::StepRow> want_steps;
  for (const trace::StepRow& s : memory.steps) {
    if (s.step < steps) want_steps.push_back(s);
  }
  const std::vector<trace::StepRow> rows = r.steps();
  ASSERT_EQ(rows.size(), want_steps.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].step, want_steps[i].step);
    EXPECT_TRUE(same_bits(rows[i].loss, want_steps[i].loss)) << "step " << rows[i].step;
    EXPECT_EQ(rows[i].scale, want_steps[i].scale) << "step " << rows[i].step;
    EXPECT_EQ(rows[i].skipped, want_steps[i].skipped) << "step " << rows[i].step;
  }
  std::vector<trace::EventRow> want_events;
  for (const trace::EventRow& e : memory.events) {
    if (e.step < steps) want_events.push_back(e);
  }
  const std::vector<trace::EventRow> events = r.events();
  ASSERT_EQ(events.size(), want_events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].kind, want_events[i].kind) << "event " << i;
    EXPECT_EQ(events[i].detail, want_events[i].detail) << "event " << i;
  }
}

TEST(user_loop_trace_test, a_users_amp_loop_reads_back_from_the_trace_as_the_probe_wrote_it) {
  const trace::testing::TempDir dir;
  const auto path = dir.file("run.h5");
  const probe::ProbeOptions options;
  const trace::RunInfo info{.precision = "fp16", .device = "cpu", .model = "Classifier", .seed = 7, .config = "{}",
                            .probe = probe::describe(options)};
  auto file = std::make_shared<trace::TraceWriter>(path, info);
  auto memory = std::make_shared<MemorySink>();
  auto probe = std::make_shared<probe::Probe>(std::make_shared<TeeSink>(file, memory), options);
  probe::HookGuard installed(probe);

  Generator gen(7);
  Classifier net(gen);
  const std::vector<Tensor> params = net.parameters();
  optim::AdamW opt(params, {.lr = 3e-3, .weight_decay = 0.01});
  GradScaler scaler({.device = "cpu", .init_scale = 16777216.0});  // 2^24: the first steps overflow and are skipped
  constexpr std::int64_t kSteps = 40, kMidRun = 23;
  for (std::int64_t step = 0; step < kSteps; ++step) {
    probe::StepScope scope(step);
    double loss_value = 0;
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = randn({16, 20}, gen);
      std::vector<double> labels(16);
      for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>((i * 3 + static_cast<std::size_t>(step)) % 5);
      const Tensor y = from_values(labels, {16}, {DType::i64});
      Tensor loss;
      {
        AutocastGuard autocast(DType::f16);
        loss = cross_entropy(net(x), y);
      }
      loss_value += loss.values()[0] / 2;
      scaler.scale(mul(loss, 0.5)).backward();
    }
    const double scale = scaler.get_scale();
    scaler.unscale_(opt);
    optim::clip_grad_norm_(params, 1.0);
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    scope.end({.step = step, .loss = loss_value, .scale = scale, .scale_after = scaler.get_scale()});
    if (step == kMidRun) {
      // A reader while the writer still holds the file sees every step ended so far, and no other rows.
      file->flush();
      trace::TraceReader mid(path);
      expect_file_holds(mid, *memory, step + 1, "mid-run, after step " + std::to_string(step));
    }
  }
  probe->flush();
  file->close();

  // The premises: short steps (chunks under 256 rows: the writer's short-step paths), the rows the loop made.
  ASSERT_LT(memory->ops_of_step(0).size(), 64u) << "chunks are about four first steps' rows: under 256 here";
  ASSERT_GT(memory->ops_of_step(0).size(), 10u);
  ASSERT_EQ(memory->steps.size(), static_cast<std::size_t>(kSteps));
  EXPECT_FALSE(memory->events_of_kind("skipped_step").empty()) << "the scaler skipped no step: no overflow to record";
  EXPECT_FALSE(memory->events_of_kind("scale_growth").empty() && memory->events_of_kind("scale_backoff").empty());

  trace::TraceReader r(path);
  EXPECT_TRUE(r.damage().empty());
  expect_file_holds(r, *memory, kSteps, "after close");
}

}  // namespace
}  // namespace ampscope
