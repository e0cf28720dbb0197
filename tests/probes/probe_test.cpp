// tests/probes/probe_test.cpp: the probe (probes/probe.h) as a training loop hears it, written to an
// in-memory sink: what each level records, filters and sampling, origins and propagation in forward and
// backward, cast overflow/underflow, first-origin dumps, gradients before and after unscaling and the
// scaler's events.
//
// Expected values are worked out by hand in the comments: an f16 linear of 1000 * 20 summed over 4
// inputs is 80000, above 65504 (it rounds to +inf, since 80000 >= 65520); the f16 cast of x overflows
// for |x| >= 65520 and flushes to zero for |x| <= 2^-25. Gradient norms are compared with the norm of
// the gradient computed here from its values in double; scales are powers of two, so a scaled gradient
// is exactly scale times the unscaled one and so is its norm.
#include "probes/probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/probes/memory_sink.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using probe::Level;
using testing::MemorySink;
using testing::Probed;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool contains(const std::string& text, std::string_view piece) { return text.find(piece) != std::string::npos; }

void run_step(std::int64_t step, const std::function<void()>& body) {
  probe::StepScope scope(step);
  body();
  scope.end({.step = step});
}

Tensor param(Tensor t) {
  t.requires_grad_();
  return t;
}

// ---- levels ----

TEST(probe_test, level_dtype_writes_dtypes_and_shapes_but_no_statistics) {
  Probed p({.level = Level::dtype});
  const Tensor x = from_values({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {4, 3});
  const Tensor w = param(full({2, 3}, 0.5)), b = param(zeros({2}));
  run_step(0, [&] {
    AutocastGuard region;
    relu(linear(x, w, b));
    probe::report_grads({w, b}, true);
  });
  ASSERT_EQ(p.sink->ops.size(), 2u);
  const trace::OpRow& lin = p.sink->ops[0];
  EXPECT_EQ(lin.op, "linear");
  EXPECT_EQ(lin.step, 0);
  EXPECT_EQ(lin.seq, 0);
  EXPECT_EQ(lin.phase, trace::Phase::forward);
  EXPECT_EQ(lin.in_dtypes, "f16,f16,f16") << "the inputs after autocast's casts";
  EXPECT_EQ(lin.out_dtype, "f16");
  EXPECT_EQ(lin.shape, "[4, 2]");
  EXPECT_TRUE(contains(lin.autocast, "lower_precision_fp")) << lin.autocast;
  const trace::OpRow& r = p.sink->ops[1];
  EXPECT_EQ(r.op, "relu");
  EXPECT_EQ(r.seq, 1);
  EXPECT_EQ(r.in_dtypes, "f16");
  for (const trace::OpRow& row : p.sink->ops) {
    EXPECT_EQ(row.health.numel, 0) << row.op;
    EXPECT_EQ(row.health.zero, 0) << row.op;
    EXPECT_EQ(row.health.absmax, 0) << row.op;
    EXPECT_EQ(row.cast_overflow + row.cast_underflow, 0) << row.op;
    EXPECT_FALSE(row.origin);
  }
  EXPECT_TRUE(p.sink->grads.empty()) << "gradients need a pass over the data: level health";
  EXPECT_TRUE(p.sink->histograms.empty());
  EXPECT_TRUE(p.sink->events.empty());
}

TEST(probe_test, level_health_records_the_health_of_each_output) {
  Probed p({.level = Level::health});
  run_step(0, [] { relu(from_values({-1, 2, -3, 4}, {4})); });  // -> 0, 2, 0, 4
  ASSERT_EQ(p.sink->ops.size(), 1u);
  const trace::TensorHealth& h = p.sink->ops[0].health;
  EXPECT_EQ(h.numel, 4);
  EXPECT_EQ(h.zero, 2);
  EXPECT_EQ(h.nan + h.pos_inf + h.neg_inf + h.subnormal, 0);
  EXPECT_EQ(h.min, 0.0);
  EXPECT_EQ(h.max, 4.0);
  EXPECT_EQ(h.absmax, 4.0);
  EXPECT_DOUBLE_EQ(h.mean, 1.5);
  EXPECT_DOUBLE_EQ(h.rms, std::sqrt(20.0 / 4.0));
  EXPECT_TRUE(p.sink->histograms.empty()) << "histograms come with level full";
}

TEST(probe_test, level_full_adds_an_exponent_histogram_of_each_output) {
  Probed p({.level = Level::full});
  run_step(0, [] {
    Tensor a = relu(from_values({-1, 2, -3, 4}, {4}));  // 0, 2, 0, 4
    mul(a, 0.25);                                       // 0, 0.5, 0, 1
  });
  ASSERT_EQ(p.sink->histograms.size(), 2u);
  const trace::HistogramRow& h = p.sink->histograms[0];
  EXPECT_EQ(h.step, 0);
  EXPECT_EQ(h.seq, p.sink->ops[0].seq);
  EXPECT_EQ(h.tensor, "output");
  std::array<std::int64_t, trace::kHistBins> expected{};
  expected[probe::kZeroBin] = 2;
  expected[1 - trace::kHistMinExponent] = 1;  // 2 = 2^1
  expected[2 - trace::kHistMinExponent] = 1;  // 4 = 2^2
  EXPECT_EQ(h.bins, expected);
  EXPECT_EQ(p.sink->histograms[1].bins[-1 - trace::kHistMinExponent], 1) << "0.5 = 2^-1";
}

TEST(probe_test, level_full_names_the_histograms_of_each_gradient_a_backward_node_computes) {
  Probed p({.level = Level::full});
  const Tensor x = param(ones({2, 3})), w = param(full({4, 3}, 0.5));
  run_step(0, [&] { sum(linear(x, w)).backward(); });
  std::int64_t seq = -1;
  for (const trace::OpRow& r : p.sink->ops) {
    if (r.phase == trace::Phase::backward && r.op == "linear") seq = r.seq;
  }
  ASSERT_GE(seq, 0);
  std::vector<std::string> names;
  for (const trace::HistogramRow& h : p.sink->histograms) {
    if (h.seq == seq) names.push_back(h.tensor);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"output", "output 1"})) << "d/dx, then d/dw";
}

TEST(probe_test, level_off_writes_only_step_rows) {
  Probed p({.level = Level::off});
  run_step(0, [] { relu(from_values({1, kInf}, {2})); });
  EXPECT_FALSE(p.probe->wants_op("relu", ""));
  EXPECT_TRUE(p.sink->ops.empty());
  EXPECT_TRUE(p.sink->events.empty());
  ASSERT_EQ(p.sink->steps.size(), 1u);
  EXPECT_EQ(p.sink->ended, (std::vector<std::int64_t>{0}));
}

TEST(probe_test, levels_parse_by_name_and_unknown_names_list_the_known_ones) {
  EXPECT_EQ(probe::parse_level("full"), Level::full);
  EXPECT_EQ(probe::level_name(Level::dtype), "dtype");
  EXPECT_EQ(probe::level_names().size(), 4u);
  EXPECT_THROW_MSG(probe::parse_level("verbose"), Error, "unknown probe level 'verbose'", "off, dtype, health, full");
}

TEST(probe_test, invalid_options_are_refused_with_the_value) {
  auto sink = std::make_shared<MemorySink>();
  EXPECT_THROW_MSG(probe::Probe(sink, {.every = 0}), Error, "every must be at least 1, got 0", "hint:");
  EXPECT_THROW_MSG(probe::Probe(sink, {.recorder_steps = 0}), Error, "recorder_steps must be at least 1", "got 0");
  EXPECT_THROW_MSG(probe::Probe(sink, {.dump_max_elements = -1}), Error, "dump_max_elements", "-1");
  EXPECT_THROW_MSG(probe::Probe(nullptr), Error, "no sink");
}

// ---- filters and sampling ----

std::shared_ptr<nn::Sequential> small_mlp() {
  Generator gen(3);
  return samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
}

TEST(probe_test, op_filters_keep_only_matching_ops) {
  Probed p({.ops = {"lin*"}});
  auto model = small_mlp();
  Generator gen(4);
  const Tensor x = randn({5, 8}, gen);
  run_step(0, [&] { (*model)(x); });
  ASSERT_EQ(p.sink->ops.size(), 3u);
  EXPECT_EQ(p.sink->ops[0].module, "fc1");
  EXPECT_EQ(p.sink->ops[1].module, "fc2");
  EXPECT_EQ(p.sink->ops[2].module, "fc3");
  for (const trace::OpRow& r : p.sink->ops) EXPECT_EQ(r.op, "linear");
}

TEST(probe_test, module_filters_select_ops_backward_nodes_and_gradients_by_module) {
  Probed p({.modules = {"fc[12]"}});
  auto model = small_mlp();
  Generator gen(5);
  const samples::Dataset d = samples::make_blobs({.samples = 6, .features = 8, .classes = 4}, gen);
  run_step(0, [&] {
    Tensor loss = cross_entropy((*model)(d.x), d.y);
    loss.backward();
    probe::report_grads(model->parameters(), true);
  });
  std::vector<std::string> seen;
  for (const trace::OpRow& r : p.sink->ops) {
    seen.push_back(std::string(trace::phase_name(r.phase)) + " " + r.op + " " + r.module);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"forward linear fc1", "forward linear fc2", "backward linear fc2",
                                            "backward linear fc1"}));
  std::vector<std::string> params;
  for (const trace::GradRow& g : p.sink->grads) params.push_back(g.param);
  EXPECT_EQ(params, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
}

TEST(probe_test, sampling_records_every_nth_step_and_writes_every_step_row) {
  Probed p({.every = 3});
  for (std::int64_t step = 0; step < 6; ++step) {
    run_step(step, [&] {
      EXPECT_EQ(p.probe->wants_op("relu", ""), step % 3 == 0) << "step " << step;
      relu(from_values({1, -1}, {2}));
      probe::report_grads({param(ones({2}))}, true);
    });
  }
  EXPECT_EQ(p.sink->steps_with_ops(), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(p.sink->steps.size(), 6u);
  EXPECT_EQ(p.sink->ended, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(probe_test, ops_outside_steps_are_written_as_they_come_when_asked_for) {
  Probed p({.outside_steps = true});
  relu(from_values({1, -1}, {2}));
  ASSERT_EQ(p.sink->ops.size(), 1u);
  EXPECT_EQ(p.sink->ops[0].step, -1);
  EXPECT_TRUE(p.sink->ended.empty());
}

TEST(probe_test, a_step_abandoned_or_left_open_is_written_without_a_step_row) {
  Probed p;
  {
    probe::StepScope scope(7);
    relu(from_values({1, -1}, {2}));
  }  // no end() (an exception, say): the scope tells the probe the step is abandoned
  ASSERT_EQ(p.sink->ops.size(), 1u) << "written when the scope ended";
  EXPECT_EQ(p.sink->ops[0].step, 7);
  EXPECT_TRUE(p.sink->steps.empty());
  EXPECT_EQ(p.sink->ended, (std::vector<std::int64_t>{7}));
  {
    probe::StepScope scope(8);
    relu(from_values({1, -1}, {2}));
    EXPECT_EQ(p.sink->ops.size(), 1u) << "still buffered while the step is open";
    p.probe->flush();  // a step still open when the run closes its trace
    ASSERT_EQ(p.sink->ops.size(), 2u);
    EXPECT_EQ(p.sink->ops[1].step, 8);
  }
  EXPECT_TRUE(p.sink->steps.empty());
  EXPECT_EQ(p.sink->ended, (std::vector<std::int64_t>{7, 8})) << "flushed once, not again when the scope ends";
}

// ---- origins and propagation ----

// x row 0 = 1000 (finite in f16), row 1 = 1; W1 = 20: row 0 of the f16 linear is 4 * 1000 * 20 = 80000,
// which rounds to +inf in f16 (8 outputs), row 1 is 80. relu passes the infs on; W2 = 0.5 (3 outputs)
// gives +inf from row 0 and 0.5 * 8 * 80 = 320 from row 1.
struct OverflowingModel {
  Tensor x = from_values({1000, 1000, 1000, 1000, 1, 1, 1, 1}, {2, 4});
  Tensor w1 = param(full({8, 4}, 20.0)), b1 = param(zeros({8}));
  Tensor w2 = param(full({3, 8}, 0.5)), b2 = param(zeros({3}));
  Tensor forward() {
    AutocastGuard region;
    return linear(relu(linear(x, w1, b1)), w2, b2);
  }
};

TEST(probe_test, an_f16_linear_that_overflows_is_the_origin_and_later_ops_propagate) {
  Probed p;
  OverflowingModel m;
  Tensor out;
  run_step(0, [&] { out = m.forward(); });
  EXPECT_EQ(out.at({1, 0}), 320.0);
  ASSERT_EQ(p.sink->ops.size(), 3u);
  const trace::OpRow& lin1 = p.sink->ops[0];
  EXPECT_EQ(lin1.op, "linear");
  EXPECT_TRUE(lin1.origin);
  EXPECT_EQ(lin1.health.pos_inf, 8);
  EXPECT_EQ(lin1.health.max, 80.0) << "the finite outputs of row 1";
  const trace::OpRow& r = p.sink->ops[1];
  EXPECT_EQ(r.op, "relu");
  EXPECT_FALSE(r.origin);
  EXPECT_EQ(r.health.pos_inf, 8);
  const trace::OpRow& lin2 = p.sink->ops[2];
  EXPECT_FALSE(lin2.origin);
  EXPECT_EQ(lin2.health.pos_inf, 3);

  const auto origins = p.sink->events_of_kind("origin");
  ASSERT_EQ(origins.size(), 1u);
  EXPECT_EQ(origins[0].op, "linear");
  EXPECT_EQ(origins[0].seq, lin1.seq);
  EXPECT_EQ(origins[0].step, 0);
  for (const char* piece : {"8 +inf in the output of linear", "(f16 [2, 8])", "inputs finite (absmax 1000, 20, 0)",
                            "the largest finite f16 is 65504"}) {
    EXPECT_TRUE(contains(origins[0].detail, piece)) << "lacks \"" << piece << "\": " << origins[0].detail;
  }
  const auto propagated = p.sink->events_of_kind("propagate");
  ASSERT_EQ(propagated.size(), 2u);
  EXPECT_EQ(propagated[0].op, "relu");
  EXPECT_TRUE(contains(propagated[0].detail, "input 0 already held 8 +inf")) << propagated[0].detail;
  EXPECT_EQ(propagated[1].op, "linear");
  EXPECT_EQ(propagated[1].seq, lin2.seq);
  EXPECT_EQ(p.probe->counters().origins, 1);
  EXPECT_EQ(p.probe->counters().propagations, 2);
}

TEST(probe_test, a_backward_node_that_creates_inf_is_an_origin_in_the_backward_phase) {
  Probed p;
  const Tensor x = param(from_values({0, 4}, {2}));
  run_step(0, [&] { sum(sqrt(x)).backward(); });  // d sqrt(x) / dx = 1 / (2 sqrt(x)): +inf at 0, 0.25 at 4
  EXPECT_EQ(x.grad().at({0}), kInf);
  const auto origins = p.sink->events_of_kind("origin");
  ASSERT_EQ(origins.size(), 1u);
  EXPECT_EQ(origins[0].op, "sqrt");
  EXPECT_TRUE(contains(origins[0].detail, "1 +inf in the gradients computed by the backward of sqrt"))
      << origins[0].detail;
  EXPECT_TRUE(contains(origins[0].detail, "the incoming gradient is finite (absmax 1)")) << origins[0].detail;
  int backward_origins = 0;
  for (const trace::OpRow& r : p.sink->ops) {
    if (r.origin) {
      EXPECT_EQ(r.phase, trace::Phase::backward);
      EXPECT_EQ(r.op, "sqrt");
      EXPECT_EQ(r.health.pos_inf, 1);
      ++backward_origins;
    }
  }
  EXPECT_EQ(backward_origins, 1);
}

TEST(probe_test, propagation_is_one_event_per_op_per_step_that_counts_the_rest) {
  Probed p;
  const Tensor x = from_values({kNaN, 1}, {2});
  run_step(0, [&] {
    for (int i = 0; i < 3; ++i) relu(x);
  });
  run_step(1, [&] { relu(x); });
  const auto propagated = p.sink->events_of_kind("propagate");
  ASSERT_EQ(propagated.size(), 2u) << "one in each step";
  EXPECT_EQ(propagated[0].step, 0);
  EXPECT_TRUE(contains(propagated[0].detail, "1 NaN in the output of relu")) << propagated[0].detail;
  EXPECT_TRUE(contains(propagated[0].detail, "(2 more times in this step)")) << propagated[0].detail;
  EXPECT_FALSE(contains(propagated[1].detail, "more times")) << propagated[1].detail;
  EXPECT_EQ(p.probe->counters().propagations, 4);
  EXPECT_TRUE(p.sink->events_of_kind("origin").empty()) << "NaN came from outside any op";
}

// ---- casts ----

TEST(probe_test, a_user_cast_counts_what_overflowed_and_what_flushed_to_zero) {
  Probed p;
  // 70000 and 65520 overflow f16; 1e-9 <= 2^-25 flushes to zero; 3e-8 rounds to 2^-24.
  const Tensor x = from_values({70000, 1, 1e-9, 65520, 3e-8}, {5});
  run_step(0, [&] { x.to(DType::f16); });
  ASSERT_EQ(p.sink->ops.size(), 1u);
  const trace::OpRow& row = p.sink->ops[0];
  EXPECT_EQ(row.op, "to");
  EXPECT_EQ(row.in_dtypes, "f32");
  EXPECT_EQ(row.out_dtype, "f16");
  EXPECT_EQ(row.cast_overflow, 2);
  EXPECT_EQ(row.cast_underflow, 1);
  EXPECT_TRUE(row.origin) << "finite input, inf output";
  const auto over = p.sink->events_of_kind("cast_overflow");
  ASSERT_EQ(over.size(), 1u);
  EXPECT_TRUE(contains(over[0].detail, "2 finite values became inf casting the input of to from f32 to f16"))
      << over[0].detail;
  EXPECT_TRUE(contains(over[0].detail, "source absmax 70000")) << over[0].detail;
  const auto under = p.sink->events_of_kind("cast_underflow");
  ASSERT_EQ(under.size(), 1u);
  EXPECT_TRUE(contains(under[0].detail, "1 non-zero value became zero")) << under[0].detail;
  EXPECT_EQ(p.probe->counters().cast_overflow, 2);
  EXPECT_EQ(p.probe->counters().cast_underflow, 1);
}

TEST(probe_test, autocast_casts_count_on_their_op_and_an_overflowing_one_makes_it_the_origin) {
  Probed p;
  const Tensor x = from_values({1e5, 1}, {1, 2});          // 1e5 overflows the cast of input 0
  const Tensor w = param(from_values({1e-9, 1}, {1, 2}));  // 1e-9 flushes in the cast of the weight
  const Tensor x2 = from_values({1, 1}, {1, 2});
  run_step(0, [&] {
    AutocastGuard region;
    linear(x, w);
    linear(x2, w);  // the weight's cast now comes from the cache: counted once, above
  });
  ASSERT_EQ(p.sink->ops.size(), 2u);
  const trace::OpRow& first = p.sink->ops[0];
  EXPECT_EQ(first.cast_overflow, 1);
  EXPECT_EQ(first.cast_underflow, 1);
  EXPECT_TRUE(first.origin) << "input 0 was finite before autocast's cast";
  const trace::OpRow& second = p.sink->ops[1];
  EXPECT_EQ(second.cast_overflow, 0);
  EXPECT_EQ(second.cast_underflow, 0);
  EXPECT_FALSE(second.origin);
  const auto over = p.sink->events_of_kind("cast_overflow");
  ASSERT_EQ(over.size(), 1u);
  EXPECT_TRUE(contains(over[0].detail, "casting input 0 of linear (autocast) from f32 to f16")) << over[0].detail;
  const auto origins = p.sink->events_of_kind("origin");
  ASSERT_EQ(origins.size(), 1u);
  EXPECT_TRUE(contains(origins[0].detail, "inputs finite (absmax 100000, 1)")) << origins[0].detail;
}

// ---- dumps ----

TEST(probe_test, the_first_origin_dumps_inputs_and_outputs_bounded_by_the_option) {
  Probed p({.dump_max_elements = 5});
  OverflowingModel m;
  run_step(0, [&] { m.forward(); });
  run_step(1, [&] { m.forward(); });  // a second origin: no second dump
  std::vector<std::string> names;
  for (const trace::DumpRow& d : p.sink->dumps) names.push_back(d.tensor);
  EXPECT_EQ(names, (std::vector<std::string>{"input 0", "input 0 before autocast", "input 1", "input 1 before autocast",
                                             "input 2", "input 2 before autocast", "output"}));
  for (const trace::DumpRow& d : p.sink->dumps) {
    EXPECT_EQ(d.step, 0);
    EXPECT_EQ(d.op, "linear");
    EXPECT_LE(d.values.size(), 5u) << d.tensor;
  }
  EXPECT_EQ(p.sink->dumps[0].values, (std::vector<double>{1000, 1000, 1000, 1000, 1}));
  EXPECT_EQ(p.sink->dumps[0].dtype, "f16");
  EXPECT_EQ(p.sink->dumps[0].shape, "[2, 4]");
  EXPECT_EQ(p.sink->dumps[1].dtype, "f32");
  EXPECT_EQ(p.sink->dumps[4].values, (std::vector<double>{0, 0, 0, 0, 0})) << "b1 has 8 elements, 5 kept";
  EXPECT_EQ(p.sink->dumps[6].values, (std::vector<double>(5, kInf)));
  EXPECT_EQ(p.sink->events_of_kind("origin").size(), 2u);
}

TEST(probe_test, dumps_can_be_turned_off) {
  Probed p({.dump_first_origin = false});
  OverflowingModel m;
  run_step(0, [&] { m.forward(); });
  EXPECT_TRUE(p.sink->dumps.empty());
  EXPECT_EQ(p.sink->events_of_kind("origin").size(), 1u);
}

// ---- gradients and the scaler ----

double reference_norm(const Tensor& g) {
  double s = 0;
  for (double v : g.values()) s += v * v;
  return std::sqrt(s);
}

TEST(probe_test, gradient_rows_before_and_after_unscaling_differ_by_the_scale) {
  Probed p;
  auto model = small_mlp();
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0});
  Generator gen(6);
  const samples::Dataset d = samples::make_blobs({.samples = 6, .features = 8, .classes = 4}, gen);
  run_step(0, [&] {
    opt.zero_grad();
    scaler.scale(cross_entropy((*model)(d.x), d.y)).backward();
    scaler.step(opt);
    scaler.update();
  });
  const std::vector<Tensor> params = model->parameters();
  ASSERT_EQ(p.sink->grads.size(), 2 * params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const trace::GradRow& scaled = p.sink->grads[i];
    const trace::GradRow& unscaled = p.sink->grads[params.size() + i];
    SCOPED_TRACE(params[i].name());
    EXPECT_EQ(scaled.param, params[i].name());
    EXPECT_EQ(unscaled.param, params[i].name());
    EXPECT_FALSE(scaled.unscaled);
    EXPECT_TRUE(unscaled.unscaled);
    EXPECT_EQ(unscaled.dtype, "f32");
    EXPECT_EQ(scaled.norm, 1024.0 * unscaled.norm) << "a power-of-two scale is exact";
    EXPECT_EQ(scaled.absmax, 1024.0 * unscaled.absmax);
    // After the step the parameter still holds the unscaled gradient.
    EXPECT_DOUBLE_EQ(unscaled.norm, reference_norm(params[i].grad()));
    EXPECT_EQ(unscaled.nan + unscaled.pos_inf + unscaled.neg_inf, 0);
  }
  ASSERT_EQ(p.sink->steps.size(), 1u);
  const trace::StepRow& s = p.sink->steps[0];
  EXPECT_EQ(s.scale, 1024.0) << "taken from the scaler: the summary left it at its default";
  EXPECT_EQ(s.scale_after, 1024.0);
  EXPECT_FALSE(s.found_inf);
  EXPECT_TRUE(p.sink->events.empty()) << "a clean step with no growth";
}

TEST(probe_test, a_scaler_overflow_gives_grad_overflow_skipped_step_and_backoff_events) {
  Probed p;
  auto model = small_mlp();
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0});
  Generator gen(7);
  const samples::Dataset d = samples::make_blobs({.samples = 6, .features = 8, .classes = 4}, gen);
  run_step(0, [&] {
    opt.zero_grad();
    scaler.scale(cross_entropy((*model)(d.x), d.y)).backward();
    model->parameters()[2].grad().set({0, 0}, kInf);  // fc2.weight
    scaler.step(opt);
    scaler.update();
  });
  const auto overflow = p.sink->events_of_kind("grad_overflow");
  ASSERT_EQ(overflow.size(), 1u);
  EXPECT_EQ(overflow[0].module, "fc2.weight");
  EXPECT_EQ(overflow[0].step, 0);
  EXPECT_TRUE(contains(overflow[0].detail, "fc2.weight: 1 inf, 0 NaN in its scaled gradient (scale 1024, SGD #0)"))
      << overflow[0].detail;
  const auto skipped = p.sink->events_of_kind("skipped_step");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_TRUE(contains(skipped[0].detail, "SGD #0 skipped its step")) << skipped[0].detail;
  const auto backoff = p.sink->events_of_kind("scale_backoff");
  ASSERT_EQ(backoff.size(), 1u);
  EXPECT_TRUE(contains(backoff[0].detail, "scale 1024 -> 512")) << backoff[0].detail;
  EXPECT_LT(overflow[0].seq, skipped[0].seq);
  EXPECT_LT(skipped[0].seq, backoff[0].seq);

  const trace::StepRow& s = p.sink->steps.at(0);
  EXPECT_EQ(s.scale, 1024.0);
  EXPECT_EQ(s.scale_after, 512.0);
  EXPECT_TRUE(s.found_inf);
  EXPECT_TRUE(s.skipped);
  // The scaled gradient row counts the inf; its norm is inf.
  bool found = false;
  for (const trace::GradRow& g : p.sink->grads) {
    if (g.param == "fc2.weight" && !g.unscaled) {
      EXPECT_EQ(g.pos_inf, 1);
      EXPECT_EQ(g.norm, kInf);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(p.probe->counters().grad_overflows, 1);
  EXPECT_EQ(p.probe->counters().skipped_steps, 1);
}

TEST(probe_test, scale_growth_is_an_event) {
  Probed p;
  auto model = small_mlp();
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0, .growth_interval = 1});
  Generator gen(8);
  const samples::Dataset d = samples::make_blobs({.samples = 6, .features = 8, .classes = 4}, gen);
  run_step(0, [&] {
    opt.zero_grad();
    scaler.scale(cross_entropy((*model)(d.x), d.y)).backward();
    scaler.step(opt);
    scaler.update();
  });
  const auto growth = p.sink->events_of_kind("scale_growth");
  ASSERT_EQ(growth.size(), 1u);
  EXPECT_TRUE(contains(growth[0].detail, "scale 1024 -> 2048")) << growth[0].detail;
  EXPECT_EQ(p.sink->steps.at(0).scale_after, 2048.0);
}

TEST(probe_test, a_summary_that_gives_the_scale_is_written_as_given) {
  Probed p;
  probe::StepScope scope(3);
  probe::ScalerEvent e;
  e.scale = 1024;
  e.new_scale = 512;
  e.change = probe::ScalerEvent::Change::backoff;
  p.probe->on_scaler(e);
  scope.end({.step = 3, .loss = 0.5, .scale = 8, .scale_after = 4, .lr = 0.01});
  ASSERT_EQ(p.sink->steps.size(), 1u);
  EXPECT_EQ(p.sink->steps[0].scale, 8.0);
  EXPECT_EQ(p.sink->steps[0].scale_after, 4.0);
  EXPECT_EQ(p.sink->steps[0].loss, 0.5);
  EXPECT_EQ(p.sink->steps[0].lr, 0.01);
  EXPECT_EQ(p.sink->events_of_kind("scale_backoff").size(), 1u);
}

TEST(probe_test, gradient_histograms_at_level_full_are_of_the_unscaled_gradients) {
  Probed p({.level = Level::full});
  Tensor w = param(zeros({3}));
  w.set_grad(from_values({0.5, 4, 0}, {3}));
  w.set_name("w");
  run_step(0, [&] {
    probe::report_grads({w}, false);
    probe::report_grads({w}, true);
  });
  ASSERT_EQ(p.sink->histograms.size(), 1u);
  const trace::HistogramRow& h = p.sink->histograms[0];
  EXPECT_EQ(h.tensor, "w");
  EXPECT_EQ(h.seq, -1);
  EXPECT_EQ(h.bins[-1 - trace::kHistMinExponent], 1);
  EXPECT_EQ(h.bins[2 - trace::kHistMinExponent], 1);
  EXPECT_EQ(h.bins[probe::kZeroBin], 1);
  ASSERT_EQ(p.sink->grads.size(), 2u);
  EXPECT_EQ(p.sink->grads[1].zero, 1);
  EXPECT_EQ(p.sink->grads[1].norm, std::sqrt(16.25));
}

}  // namespace
}  // namespace ampscope
