// tests/probes/stats_cache_test.cpp: the probe's step-scoped statistics cache (probes/probe.h) never hands back
// the statistics of values that have since been written. Each test reads a tensor's statistics, checks that
// reading it again unchanged was served by the cache (the counters: the test would be vacuous otherwise),
// writes the tensor in place by one route (GradScaler's unscale, clipping, a second backward accumulating into
// .grad, copy_, fill_, set, a pointer from data_as or kernel_view, an optimizer step, a write through a view),
// then reads it again. The expected rows are computed here from the tensor's values in double (Tensor::values,
// not the probe); scales are powers of two, so a scaled or doubled gradient's absmax and norm are exact
// multiples. Every test fails if a route to a writable pointer leaves the storage's version as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "kernels/cpu/fused_optim.h"
#include "probes/probe.h"
#include "probes/stats.h"
#include "tests/probes/memory_sink.h"

namespace ampscope {
namespace {

using testing::MemorySink;
using testing::Probed;

// The values whose statistics the cache served so far.
std::int64_t cached(const Probed& p) { return p.probe->counters().stats_values_cached; }

void run_step(std::int64_t step, const std::function<void()>& body) {
  probe::StepScope scope(step);
  body();
  scope.end({.step = step});
}

struct Reference {
  std::int64_t zero = 0, nan = 0;
  double absmax = 0, norm = 0;
};

// The gradient row's statistics from the values as they are now, in double.
Reference reference_of(const Tensor& t) {
  Reference r;
  double sum_sq = 0;
  for (double v : t.values()) {
    if (std::isnan(v)) {
      ++r.nan;
      continue;
    }
    if (v == 0) ++r.zero;
    r.absmax = std::max(r.absmax, std::fabs(v));
    sum_sq += v * v;
  }
  r.norm = std::sqrt(sum_sq);
  return r;
}

void expect_row(const trace::GradRow& row, const Reference& r, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(row.zero, r.zero);
  EXPECT_EQ(row.nan, r.nan);
  EXPECT_EQ(row.absmax, r.absmax);
  EXPECT_NEAR(row.norm, r.norm, 1e-12 * r.norm);
}

// The probe's gradient row for `t` (reported as a gradient named `name`, unscaled).
void report(Probed& p, const Tensor& t, const std::string& name = "t") {
  const std::vector<std::pair<std::string, Tensor>> grads{{name, t}};
  p.probe->on_grads(probe::GradEvent{0, true, grads});
}

// A 6x5 weight and the loss sum(x w) * 0.5 of a random 4x6 x: w's gradient is a backward node's output (a
// matmul's), read by the probe there, and then cloned into w.grad(), which the probe reads again.
struct Linear {
  Generator gen{11};
  Tensor x = randn({4, 6}, gen);
  Tensor w = randn({6, 5}, gen).requires_grad_();
  Tensor loss() const { return mul(sum(matmul(x, w)), 0.5); }
};

// Reads `t`, reads it again (asserting the second read came from the cache), runs `write`, reads it again:
// the last row must be the values after the write.
void check_route(const std::function<void(Tensor&)>& write, Tensor t, const std::string& what) {
  Probed p;
  run_step(0, [&] {
    report(p, t);
    const std::int64_t before = cached(p);
    report(p, t);
    ASSERT_EQ(cached(p) - before, t.numel()) << what << ": an unchanged tensor read twice is read once";
    write(t);
    report(p, t);
  });
  ASSERT_EQ(p.sink->grads.size(), 3u);
  expect_row(p.sink->grads[2], reference_of(t), what);
  EXPECT_NE(p.sink->grads[2].absmax, p.sink->grads[0].absmax) << what << ": the write changed the values";
}

Tensor random_tensor(std::uint64_t seed) {
  Generator gen(seed);
  return randn({7, 9}, gen);
}

TEST(stats_cache_test, a_weight_gradient_is_read_once_as_its_node_output_and_as_its_grad) {
  Probed p;
  Linear m;
  run_step(0, [&] {
    m.loss().backward();
    const std::int64_t before = cached(p);
    probe::report_grads({m.w}, true);
    EXPECT_EQ(cached(p) - before, m.w.numel()) << "w.grad() is an unwritten clone of the matmul's gradient";
  });
  ASSERT_EQ(p.sink->grads.size(), 1u);
  expect_row(p.sink->grads[0], reference_of(m.w.grad()), "w.grad()");
}

TEST(stats_cache_test, a_gradient_unscaled_in_place_by_the_grad_scaler_is_read_again) {
  Probed p;
  Linear m;
  optim::SGD opt({m.w}, {.lr = 0.1});
  GradScaler scaler({.device = "cpu", .init_scale = 1024.0});
  run_step(0, [&] {
    scaler.scale(m.loss()).backward();
    scaler.unscale_(opt);  // reports the scaled gradient, then the unscaled one
  });
  ASSERT_EQ(p.sink->grads.size(), 2u);
  const trace::GradRow& scaled = p.sink->grads[0];
  const trace::GradRow& unscaled = p.sink->grads[1];
  EXPECT_FALSE(scaled.unscaled);
  EXPECT_TRUE(unscaled.unscaled);
  expect_row(unscaled, reference_of(m.w.grad()), "after unscale_");
  EXPECT_EQ(scaled.absmax, 1024.0 * unscaled.absmax) << "a power-of-two scale is exact";
}

TEST(stats_cache_test, a_gradient_clipped_in_place_is_read_again) {
  Probed p;
  Linear m;
  run_step(0, [&] {
    m.loss().backward();
    probe::report_grads({m.w}, true);  // served by the cache (the clone of the node's output)
    optim::clip_grad_norm_({m.w}, 0.25);
    probe::report_grads({m.w}, true);
  });
  ASSERT_EQ(p.sink->grads.size(), 2u);
  const Reference after = reference_of(m.w.grad());
  expect_row(p.sink->grads[1], after, "after clip_grad_norm_");
  EXPECT_NEAR(after.norm, 0.25, 1e-6) << "the premise: clipping scaled the gradient down to the norm";
  EXPECT_GT(p.sink->grads[0].norm, 0.5);
}

TEST(stats_cache_test, a_gradient_accumulated_over_two_backwards_is_read_again) {
  Probed p;
  Linear m;
  run_step(0, [&] {
    m.loss().backward();
    probe::report_grads({m.w}, true);
    m.loss().backward();  // .grad += the same gradient, in place
    probe::report_grads({m.w}, true);
  });
  ASSERT_EQ(p.sink->grads.size(), 2u);
  expect_row(p.sink->grads[1], reference_of(m.w.grad()), "after the second backward");
  EXPECT_EQ(p.sink->grads[1].absmax, 2 * p.sink->grads[0].absmax) << "g + g is exact";
}

// The parameter read as a tensor before and after an optimizer step writes it in place: SGD and AdamW, each by
// the fused CPU kernels (the default) and op by op.
void check_optimizer_step(bool fused, bool adam) {
  const std::string what = std::string(adam ? "AdamW" : "SGD") + (fused ? ", fused" : ", op by op");
  const bool was = cpu::fused_optim_enabled();
  cpu::set_fused_optim_enabled(fused);
  const std::uint64_t fused_calls = cpu::fused_optim_call_count();
  Probed p;
  Linear m;
  std::unique_ptr<optim::Optimizer> opt;
  if (adam) {
    opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{m.w}, optim::OptimizerOptions{.lr = 0.5});
  } else {
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{m.w}, optim::OptimizerOptions{.lr = 0.5});
  }
  run_step(0, [&] {
    m.loss().backward();
    const Tensor w = m.w.detach();  // the same storage
    report(p, w, "w");
    const std::int64_t before = cached(p);
    report(p, w, "w");
    ASSERT_EQ(cached(p) - before, w.numel()) << what;
    opt->step();
    report(p, w, "w");
  });
  cpu::set_fused_optim_enabled(was);
  EXPECT_EQ(cpu::fused_optim_call_count() > fused_calls, fused) << what << ": the premise, the path taken";
  ASSERT_EQ(p.sink->grads.size(), 3u);
  expect_row(p.sink->grads[2], reference_of(m.w), what + ", after step()");
  EXPECT_NE(p.sink->grads[2].norm, p.sink->grads[0].norm) << what;
}

TEST(stats_cache_test, a_parameter_written_by_an_optimizer_step_is_read_again) {
  for (bool fused : {true, false}) {
    for (bool adam : {false, true}) check_optimizer_step(fused, adam);
  }
}

TEST(stats_cache_test, copy_fill_and_set_between_two_reads_are_seen) {
  check_route([](Tensor& t) { t.copy_(mul(random_tensor(5), 3.0)); }, random_tensor(1), "copy_");
  check_route([](Tensor& t) { t.fill_(4.5); }, random_tensor(2), "fill_");
  check_route([](Tensor& t) { t.set({3, 4}, 1000.0); }, random_tensor(3), "set");
}

TEST(stats_cache_test, writes_through_a_pointer_between_two_reads_are_seen) {
  check_route([](Tensor& t) { t.data_as<float>()[10] = -2000.0F; }, random_tensor(4), "data_as");
  check_route(
      [](Tensor& t) {
        const float v = 3000.0F;
        std::memcpy(t.data(), &v, sizeof v);
      },
      random_tensor(6), "data");
  check_route([](Tensor& t) { t.kernel_view().ptr<float>()[62] = 4000.0F; }, random_tensor(7), "kernel_view");
  check_route([](Tensor& t) { t.copy_(add(t, t)); }, random_tensor(8), "an op's output written into it");
}

TEST(stats_cache_test, a_write_through_another_view_of_the_storage_is_seen) {
  // The view read is a transpose (keyed as the base it permutes); the write goes through the base tensor.
  Tensor base = random_tensor(9);
  check_route([base](Tensor&) mutable { base.slice(0, 2, 3).fill_(-7000.0); }, base.transpose(0, 1), "the base");
  // The view read is the base; the write goes through a slice of it.
  Tensor other = random_tensor(10);
  check_route([other](Tensor&) { other.slice(1, 1, 2).fill_(8000.0); }, other, "a slice");
}

TEST(stats_cache_test, a_transpose_of_a_tensor_read_before_has_its_statistics_without_a_read) {
  Probed p;
  const Tensor base = random_tensor(13);
  run_step(0, [&] {
    report(p, base, "base");
    const std::int64_t before = cached(p);
    report(p, base.transpose(0, 1), "its transpose");
    ASSERT_EQ(cached(p) - before, base.numel()) << "a transpose is read in memory order: its base's pass";
    report(p, base.slice(1, 0, 4).transpose(0, 1), "a transposed slice");
    EXPECT_EQ(cached(p) - before, base.numel()) << "a view with gaps is read in its own order: not the base's";
  });
  ASSERT_EQ(p.sink->grads.size(), 3u);
  expect_row(p.sink->grads[1], reference_of(base), "the transpose");
  EXPECT_EQ(p.sink->grads[1].norm, p.sink->grads[0].norm) << "the same pass: the same bits";
  expect_row(p.sink->grads[2], reference_of(base.slice(1, 0, 4)), "the transposed slice");
}

TEST(stats_cache_test, a_clone_written_after_the_copy_is_read_again) {
  Probed p;
  const Tensor source = random_tensor(12);
  Tensor copy;
  run_step(0, [&] {
    report(p, source, "source");
    copy = source.clone();
    const std::int64_t before = cached(p);
    report(p, copy, "copy");
    ASSERT_EQ(cached(p) - before, copy.numel()) << "an unwritten clone has its source's statistics";
    copy.fill_(-1.0);
    report(p, copy, "copy");
  });
  ASSERT_EQ(p.sink->grads.size(), 3u);
  expect_row(p.sink->grads[1], reference_of(source), "the clone");
  expect_row(p.sink->grads[2], reference_of(copy), "the clone after fill_");
  EXPECT_EQ(p.sink->grads[2].absmax, 1.0);
}

TEST(stats_cache_test, a_read_without_a_histogram_is_not_served_by_one_with) {
  // tensor_stats sums in another order when it also makes a histogram, so the two reads' sums may differ in
  // their last bits: each row must have the bits of its own read.
  Probed p({.level = probe::Level::full});
  Generator gen(14);
  const Tensor t = randn({300, 333}, gen);
  const probe::TensorStats with = probe::tensor_stats(t, true), without = probe::tensor_stats(t, false);
  ASSERT_NE(with.sum_sq, without.sum_sq) << "the premise: the two loops' sums differ for this tensor";
  run_step(0, [&] {
    const std::vector<std::pair<std::string, Tensor>> grads{{"t", t}};
    p.probe->on_grads(probe::GradEvent{0, true, grads});   // level full, unscaled: with a histogram
    p.probe->on_grads(probe::GradEvent{0, false, grads});  // scaled: without
  });
  ASSERT_EQ(p.sink->grads.size(), 2u);
  EXPECT_EQ(p.sink->grads[0].norm, with.norm());
  EXPECT_EQ(p.sink->grads[1].norm, without.norm());
}

// A model and a loop as a user writes them, not shaped for the cache: a module of their own (Linear, LayerNorm,
// tanh GELU, Linear), GradScaler's unscale_, clipping, AdamW. Step 0 has one micro-batch and sets the gradients to
// None after it; steps 1 and 2 accumulate two micro-batches, and step 1 zeroes the gradients in place
// (set_to_none = false), so step 2's backwards add into the same storages. Step 3 runs without the scaler, so
// its first report reads gradients that are unwritten clones of the backward nodes' outputs (served by the
// cache; with the scaler, its found-inf check reads them first, which counts as a write). Every gradient row
// the probe writes must be the gradient's values at the moment it was reported.
class UserNet : public nn::Module {
 public:
  explicit UserNet(Generator& gen) : nn::Module("UserNet") {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(12, 32, gen));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{32}));
    act_ = register_module("act", std::make_shared<nn::GELU>(GeluApproximation::tanh));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(32, 3, gen));
  }

 protected:
  Tensor forward(const Tensor& x) override { return (*fc2_)((*act_)((*norm_)((*fc1_)(x)))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::GELU> act_;
};

TEST(stats_cache_test, a_users_loop_gets_every_gradient_row_as_the_gradient_was_when_reported) {
  Probed p;
  Generator gen(23);
  UserNet net(gen);
  const std::vector<Tensor> params = net.parameters();
  optim::AdamW opt(params, {.lr = 1e-2});
  GradScaler scaler({.device = "cpu", .init_scale = 256.0});
  // The references, taken right after each report (the probe hands a step's rows to the sink at its end), one
  // per parameter. Reading the values takes a pointer, which counts as a write: so the scaled gradients are not
  // read before unscale_ reports them (their reference is the unscaled one times the scale, exact for a power of
  // two), and each reference is taken after its report.
  struct Report {
    std::string what;
    bool unscaled;
    std::vector<Reference> expected;
  };
  std::vector<Report> reports;
  auto note = [&](std::string what, double times = 1.0, bool unscaled = true) {
    Report r{std::move(what), unscaled, {}};
    for (const Tensor& param : params) {
      Reference ref = reference_of(param.grad());
      ref.absmax *= times;
      ref.norm *= times;
      r.expected.push_back(ref);
    }
    reports.push_back(std::move(r));
  };
  auto backward = [&](bool scaled) {
    const Tensor x = randn({8, 12}, gen), y = randn({8, 3}, gen);
    const Tensor loss = mul(mse_loss(net(x), y), 0.5);
    (scaled ? scaler.scale(loss) : loss).backward();
  };
  for (std::int64_t step = 0; step < 3; ++step) {
    run_step(step, [&] {
      for (int micro = 0; micro < (step == 0 ? 1 : 2); ++micro) backward(true);
      scaler.unscale_(opt);  // reports the scaled gradients, unscales them in place, reports them again
      note(fmt::format("step {}, scaled", step), 256.0, false);
      note(fmt::format("step {}, after unscale_", step));
      optim::clip_grad_norm_(params, 0.05);
      probe::report_grads(params, true);
      note(fmt::format("step {}, after clipping", step));
      scaler.step(opt);
      scaler.update();
      opt.zero_grad(/*set_to_none=*/step != 1);
    });
  }
  std::int64_t cached_before = 0;
  run_step(3, [&] {
    backward(false);
    cached_before = cached(p);
    probe::report_grads(params, true);
    note("step 3, without the scaler");
    optim::clip_grad_norm_(params, 0.05);
    probe::report_grads(params, true);
    note("step 3, after clipping");
    opt.step();
  });
  // Each report's rows, in order, one per parameter.
  const std::size_t n = params.size();
  ASSERT_EQ(p.sink->grads.size(), reports.size() * n);
  for (std::size_t k = 0; k < reports.size(); ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      const trace::GradRow& row = p.sink->grads[k * n + i];
      EXPECT_EQ(row.unscaled, reports[k].unscaled) << reports[k].what;
      expect_row(row, reports[k].expected[i], reports[k].what + ", " + row.param);
    }
  }
  // The premises: clipping changed what the reports after it read, and the cache served step 3's first report
  // (the weights' gradients at least; a bias gradient is a sum's output, read in place too).
  EXPECT_LT(reports[2].expected[0].norm, reports[1].expected[0].norm);
  EXPECT_GE(cached(p) - cached_before, params[0].numel() + params[params.size() - 2].numel());
}

TEST(stats_cache_test, the_cache_is_emptied_at_a_step_boundary) {
  Probed p;
  const Tensor t = random_tensor(13);
  run_step(0, [&] { report(p, t); });
  const std::int64_t before = cached(p);
  run_step(1, [&] { report(p, t); });
  EXPECT_EQ(cached(p), before) << "the next step reads it again";
}

}  // namespace
}  // namespace ampscope
