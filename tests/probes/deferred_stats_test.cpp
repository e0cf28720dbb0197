// tests/probes/deferred_stats_test.cpp: the probe's deferred statistics (probes/probe.h, "Statistics on a
// device") without a GPU. probe::host_stats_queue computes each tensor's statistics with tensor_stats when the
// op runs and hands them back when the probe reads its slots, the way the CUDA ring does; so a deferred run's
// trace must equal the immediate run's row for row, bit for bit, whatever the ring's size: one slot (every op
// larger than the ring is read at once), three (the ring fills within a step) or many (read once per step).
// The reference is the immediate run (the CPU path, which the other probe tests check against hand-worked
// values), and the dump test checks the dumped values against the inputs as they were when the op ran.
#include "probes/probe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/error.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/probes/memory_sink.h"

namespace ampscope {
namespace {

using testing::MemorySink;

// Doubles by their bits, so that NaN equals NaN and -0 differs from +0.
std::string bits(double v) {
  std::uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return fmt::format("{:016x}", u);
}

std::string health_text(const trace::TensorHealth& h) {
  return fmt::format("{} {} {} {} {} {} {} {} {} {} {}", h.numel, h.nan, h.pos_inf, h.neg_inf, h.zero, h.subnormal,
                     bits(h.min), bits(h.max), bits(h.absmax), bits(h.mean), bits(h.rms));
}

// Every row the sink got, table by table, in arrival order.
std::vector<std::string> trace_text(const MemorySink& s) {
  std::vector<std::string> out;
  for (const trace::OpRow& r : s.ops) {
    out.push_back(fmt::format("op {} {} {} {} {} {} {} {} {} | {} | {} {} {} | {} {} {} {}", r.step, r.seq,
                              static_cast<int>(r.phase), r.op, r.module, r.in_dtypes, r.out_dtype, r.shape, r.autocast,
                              health_text(r.health), r.cast_overflow, r.cast_underflow, r.origin, r.inputs[0],
                              r.inputs[1], r.inputs[2], r.inputs[3]));
  }
  for (const trace::GradRow& r : s.grads) {
    out.push_back(fmt::format("grad {} {} {} {} {} {} {} {} {} {} {}", r.step, r.param, r.dtype, r.nan, r.pos_inf,
                              r.neg_inf, r.zero, bits(r.absmax), bits(r.norm), r.unscaled, r.before_all_reduce));
  }
  for (const trace::EventRow& r : s.events) {
    out.push_back(fmt::format("event {} {} {} {} {} {}", r.step, r.seq, r.kind, r.op, r.module, r.detail));
  }
  for (const trace::HistogramRow& r : s.histograms) {
    out.push_back(fmt::format("hist {} {} {} {}", r.step, r.seq, r.tensor, fmt::join(r.bins, ",")));
  }
  for (const trace::DumpRow& r : s.dumps) {
    std::vector<std::string> v;
    for (double x : r.values) v.push_back(bits(x));
    out.push_back(fmt::format("dump {} {} {} {} {} {} {} {}", r.step, r.seq, r.op, r.module, r.tensor, r.dtype,
                              r.shape, fmt::join(v, ",")));
  }
  for (const trace::StepRow& r : s.steps) {
    out.push_back(fmt::format("step {} {} {} {} {} {}", r.step, bits(r.loss), bits(r.scale), bits(r.scale_after),
                              r.found_inf, r.skipped));
  }
  for (std::int64_t e : s.ended) out.push_back(fmt::format("end {}", e));
  return out;
}

struct ProbedRun {
  std::vector<std::string> rows;
  probe::Probe::Counters counters;
};

// A host queue that takes only f32 tensors: as a device ring takes only its device's tensors, so an op with none
// of them (an f16 op under autocast) is read at once, after the pending ones, and an op with some is queued
// with the others read in place.
class F32Only final : public probe::DeferredStats {
 public:
  explicit F32Only(int slots) : inner_(probe::host_stats_queue(slots)) {}
  int capacity() const override { return inner_->capacity(); }
  int free_slots() const override { return inner_->free_slots(); }
  int launch(const Tensor& t, bool h) override { return inner_->launch(t, h); }
  probe::TensorStats read(int slot) override { return inner_->read(slot); }
  bool takes(const Tensor& t) const override { return inner_->takes(t) && t.dtype() == DType::f32; }

 private:
  std::unique_ptr<probe::DeferredStats> inner_;
};

// A probed run of `body` with the given options; `slots` > 0 sends the statistics through a host queue (of
// f32 tensors only when `f32_only`).
ProbedRun probed_run(probe::ProbeOptions options, int slots, const std::function<void()>& body, bool f32_only = false) {
  auto sink = std::make_shared<MemorySink>();
  auto p = std::make_shared<probe::Probe>(sink, options);
  if (slots > 0 && f32_only) p->use_deferred_stats(std::make_unique<F32Only>(slots));
  if (slots > 0 && !f32_only) p->use_deferred_stats(probe::host_stats_queue(slots));
  {
    probe::HookGuard guard(p);
    body();
    p->flush();
  }
  return {trace_text(*sink), p->counters()};
}

// Three steps of an f16-autocast MLP under a GradScaler (casts, gradients before and after unscaling): step 1
// gets an inf planted in a gradient (grad_overflow, skipped step), step 2 an input scaled to overflow the f16
// linear (an origin, propagation forward and backward, the first-origin dump), and after its forward pass the
// input is overwritten in place, so a dump read late would show the new values.
void training(std::int64_t steps_to_run) {
  Generator gen(11);
  auto model = samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler({.device = "cpu", .init_scale = 256.0});
  const samples::Dataset d = samples::make_blobs({.samples = 12, .features = 8, .classes = 4}, gen);
  for (std::int64_t step = 0; step < steps_to_run; ++step) {
    probe::StepScope scope(step);
    opt.zero_grad();
    Tensor x = d.x.clone();
    if (step == 2) x = mul(x, 1e6);
    Tensor loss;
    {
      AutocastGuard region;
      loss = cross_entropy((*model)(x), d.y);
    }
    if (step == 2) x.fill_(3.0);  // in place, after the forward pass that read it
    scaler.scale(loss).backward();
    if (step == 1) model->parameters()[0].grad().set({0, 0}, std::numeric_limits<double>::infinity());
    scaler.step(opt);
    scaler.update();
    scope.end({.step = step, .loss = loss.item()});
  }
}

TEST(deferred_stats_test, a_deferred_run_writes_the_immediate_runs_trace_at_any_ring_size) {
  for (probe::Level level : {probe::Level::health, probe::Level::full}) {
    const probe::ProbeOptions options{.level = level};
    const ProbedRun immediate = probed_run(options, 0, [] { training(3); });
    ASSERT_GT(immediate.rows.size(), 100u);
    ASSERT_EQ(immediate.counters.origins, 1) << "the scenario has its origin";
    EXPECT_EQ(immediate.counters.stats_reads, 0) << "the CPU path reads nothing late";
    for (int slots : {1, 3, 1024}) {
      SCOPED_TRACE(fmt::format("level {}, {} slots", probe::level_name(level), slots));
      const ProbedRun deferred = probed_run(options, slots, [] { training(3); });
      ASSERT_EQ(deferred.rows.size(), immediate.rows.size());
      for (std::size_t i = 0; i < immediate.rows.size(); ++i) ASSERT_EQ(deferred.rows[i], immediate.rows[i]) << i;
      EXPECT_EQ(deferred.counters.origins, immediate.counters.origins);
      EXPECT_EQ(deferred.counters.propagations, immediate.counters.propagations);
      EXPECT_EQ(deferred.counters.cast_overflow, immediate.counters.cast_overflow);
      EXPECT_EQ(deferred.counters.cast_underflow, immediate.counters.cast_underflow);
      EXPECT_EQ(deferred.counters.grad_overflows, immediate.counters.grad_overflows);
      if (slots == 1024) {
        // A roomy ring is read when a step ends (and when a step begins, for what came before it): at most
        // once per step here, however many ops a step has.
        EXPECT_GE(deferred.counters.stats_reads, 3);
        EXPECT_LE(deferred.counters.stats_reads, 3);
      } else if (slots == 3) {
        EXPECT_GT(deferred.counters.stats_reads, 3) << "a small ring is read when it fills";
      }
      // One slot: an op with more tensors than the ring holds is read at once (after the pending ones), so
      // most of this run takes the immediate path and the rows must still come out in order.
    }
    {
      SCOPED_TRACE(fmt::format("level {}, a ring that takes only f32 tensors", probe::level_name(level)));
      const ProbedRun mixed = probed_run(options, 1024, [] { training(3); }, true);
      ASSERT_EQ(mixed.rows.size(), immediate.rows.size());
      for (std::size_t i = 0; i < immediate.rows.size(); ++i) ASSERT_EQ(mixed.rows[i], immediate.rows[i]) << i;
      EXPECT_GT(mixed.counters.stats_reads, 3) << "the f16 ops, read at once, first read the pending ones";
    }
  }
}

TEST(deferred_stats_test, the_first_origin_dumps_its_inputs_as_they_were_when_it_ran) {
  // x [1, 2] = (1e5, 1): the f16 cast of input 0 overflows, so the linear is the origin; x is then
  // overwritten with 7 in place before the step ends and the probe reads its slots.
  for (int slots : {0, 64}) {
    SCOPED_TRACE(fmt::format("{} slots", slots));
    auto sink = std::make_shared<MemorySink>();
    auto p = std::make_shared<probe::Probe>(sink, probe::ProbeOptions{});
    if (slots > 0) p->use_deferred_stats(probe::host_stats_queue(slots));
    {
      probe::HookGuard guard(p);
      Tensor x = from_values({1e5, 1}, {1, 2});
      Tensor w = from_values({1, 1}, {1, 2});
      w.requires_grad_();
      probe::StepScope scope(0);
      {
        AutocastGuard region;
        linear(x, w);
      }
      x.fill_(7.0);
      scope.end({.step = 0});
    }
    ASSERT_EQ(p->counters().origins, 1);
    EXPECT_EQ(p->counters().stats_reads, slots > 0 ? 1 : 0) << "deferred: read once, when the step ended";
    bool found = false;
    for (const trace::DumpRow& d : sink->dumps) {
      if (d.tensor != "input 0 before autocast") continue;
      found = true;
      EXPECT_EQ(d.values, (std::vector<double>{1e5, 1}));
    }
    EXPECT_TRUE(found);
  }
}

TEST(deferred_stats_test, the_host_queue_hands_out_free_slots_until_full_and_frees_them_on_read) {
  auto q = probe::host_stats_queue(2);
  EXPECT_EQ(q->capacity(), 2);
  const Tensor a = from_values({1, -2, 0}, {3}), b = from_values({4}, {1});
  const int sa = q->launch(a, false), sb = q->launch(b, true);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(q->free_slots(), 0);
  EXPECT_EQ(q->launch(a, false), -1) << "full";
  const probe::TensorStats rb = q->read(sb);
  EXPECT_EQ(rb.health.max, 4.0);
  EXPECT_EQ(rb.histogram[2 + 64], 1) << "4 = 2^2: bin 2 + 64";
  EXPECT_EQ(q->free_slots(), 1);
  EXPECT_EQ(q->launch(b, false), sb) << "the freed slot is handed out again";
  EXPECT_EQ(q->read(sa).health.min, -2.0);
  try {
    q->read(sa);
    FAIL() << "a slot read twice";
  } catch (const IndexError& e) {
    EXPECT_EQ(std::string(e.what()), "host_stats_queue: slot " + std::to_string(sa) + " holds no launch (the ring has 2 slots)");
  }
  EXPECT_THROW(probe::host_stats_queue(0), Error);
}

TEST(deferred_stats_test, a_devices_result_reads_as_tensor_stats_reports_it) {
  // Hand-made: 6 values of which 1 NaN and 1 +inf; the 4 finite ones are -1, 0, 2, 3 (sum 4, sum of squares 14).
  DeviceStatsResult r;
  r.numel = 6;
  r.nan = 1;
  r.pos_inf = 1;
  r.zero = 1;
  r.min = -1;
  r.max = 3;
  r.absmax = 3;
  r.sum = 4;
  r.sum_sq = 14;
  r.histogram[5] = 9;
  const probe::TensorStats s = probe::stats_from_device(r, false);
  EXPECT_EQ(s.health.numel, 6);
  EXPECT_EQ(s.non_finite(), 2);
  EXPECT_EQ(s.health.mean, 1.0);               // 4 / 4
  EXPECT_EQ(s.health.rms, std::sqrt(14.0 / 4));
  EXPECT_EQ(s.health.min, -1.0);
  EXPECT_EQ(s.sum_sq, 14.0);
  EXPECT_EQ(s.histogram[5], 0) << "not asked for";
  EXPECT_EQ(probe::stats_from_device(r, true).histogram[5], 9);
  DeviceStatsResult none;
  none.numel = 2;
  none.nan = 2;
  const probe::TensorStats n = probe::stats_from_device(none, false);
  EXPECT_TRUE(std::isnan(n.health.mean) && std::isnan(n.health.min) && std::isnan(n.health.absmax));
}

TEST(deferred_stats_test, cast_counts_from_statistics_match_the_element_by_element_count) {
  // f32 -> f16: 7e4 and -1e5 overflow (>= 65520), 1e-8 flushes (<= 2^-25), NaN, inf and 0 map to themselves,
  // 1 and 2^-20 (an f16 subnormal) survive: 2 overflows, 1 underflow by hand.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor src = from_values({7e4, -1e5, 1e-8, nan, inf, -inf, 0, 1, std::ldexp(1.0, -20)}, {9});
  const Tensor f16 = src.to(DType::f16);
  const probe::CastCounts c =
      probe::cast_counts_from_stats(probe::tensor_stats(src), probe::tensor_stats(f16), DType::f16);
  EXPECT_EQ(c.overflow, 2);
  EXPECT_EQ(c.underflow, 1);
  const probe::CastCounts reference = probe::cast_counts(src, f16);
  EXPECT_EQ(c.overflow, reference.overflow);
  EXPECT_EQ(c.underflow, reference.underflow);
  // i64 -> f16: 70000 overflows, 0 stays 0.
  const Tensor ints = from_values({70000, 0, 5}, {3}, {DType::i64});
  const probe::CastCounts ci = probe::cast_counts_from_stats(probe::tensor_stats(ints),
                                                             probe::tensor_stats(ints.to(DType::f16)), DType::f16);
  EXPECT_EQ(ci.overflow, 1);
  EXPECT_EQ(ci.underflow, 0);
  // To an integer dtype nothing counts (as cast_counts).
  const probe::CastCounts cn = probe::cast_counts_from_stats(probe::tensor_stats(src.slice(0, 6, 9)),
                                                             probe::tensor_stats(src.slice(0, 6, 9).to(DType::i64)), DType::i64);
  EXPECT_EQ(cn.overflow, 0);
  EXPECT_EQ(cn.underflow, 0);
}

}  // namespace
}  // namespace ampscope
