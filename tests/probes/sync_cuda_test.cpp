// tests/probes/sync_cuda_test.cpp: what the host waits for on CUDA (issue 30, docs/cuda.md "What synchronises").
// (Named to sort after the probe tests that run without a GPU: the device check's dry run starts each program with its
// first test, which must pass there.)
// A probed CUDA run's rows, statistics read once per step through the device ring, against the same run
// probed the old way (each tensor copied to the host and read by tensor_stats: use_deferred_stats(nullptr));
// cuBLAS's products are not the CPU's bits, so the reference is the same CUDA computation, and the rows must be
// equal except mean and rms, within the sums bound of kernels/cuda/stats_cuda.h. Then the device-side index
// check, and the count of host synchronisations per step, which must not grow with the number of ops. Last,
// embedding and nll_loss called through core on CUDA: a bad index reported at the next wait naming the op, nll's
// mean (its count of non-ignored targets a device value) equal to the CPU's bits forward and backward, and no
// wait inside the calls. Every test skips, saying why, where there is no GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/probe.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "tests/probes/memory_sink.h"
#include "tests/test_support.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include "kernels/cuda/fused_amp.h"
#endif

namespace ampscope {
namespace {

using testing::MemorySink;

// `steps` steps of an f16-autocast MLP on CUDA under a GradScaler, with `extra` more element-wise ops on the
// logits (each a multiply by 1: they change the number of ops, not the values). Step 1 gets an inf planted
// in a gradient. Returns the backend's host syncs of each step.
std::vector<std::int64_t> cuda_training(std::int64_t steps, int extra) {
  const Device cuda = Device::cuda(0);
  Backend& backend = backend_for(cuda);
  Generator gen(11);
  auto model = samples::make_mlp({.in_features = 8, .hidden = 16, .classes = 4}, gen);
  model->to(cuda);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler({.device = "cuda", .init_scale = 256.0});
  const samples::Dataset d = samples::make_blobs({.samples = 12, .features = 8, .classes = 4}, gen);
  const Tensor x = d.x.to(cuda), y = d.y.to(cuda);
  std::vector<std::int64_t> syncs;
  for (std::int64_t step = 0; step < steps; ++step) {
    backend.synchronize();  // outside the step: its work done, so the count below is the step's own
    const std::int64_t before = backend.host_syncs();
    probe::StepScope scope(step);
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard region;
      Tensor logits = (*model)(x);
      for (int k = 0; k < extra; ++k) logits = mul(logits, 1.0);
      loss = cross_entropy(logits, y);
    }
    scaler.scale(loss).backward();
    if (step == 1) model->parameters()[0].grad().set({0, 0}, std::numeric_limits<double>::infinity());
    scaler.step(opt);
    scaler.update();
    scope.end({.step = step, .loss = loss.item()});
    syncs.push_back(backend.host_syncs() - before);
  }
  return syncs;
}

struct Probed {
  std::shared_ptr<MemorySink> sink = std::make_shared<MemorySink>();
  std::vector<std::int64_t> syncs;
  probe::Probe::Counters counters;
};

Probed probed_cuda_training(probe::Level level, bool host_path, int extra) {
  Probed out;
  auto p = std::make_shared<probe::Probe>(out.sink, probe::ProbeOptions{.level = level});
  if (host_path) p->use_deferred_stats(nullptr);  // every tensor copied to the host, as before issue 30
  {
    probe::HookGuard guard(p);
    out.syncs = cuda_training(3, extra);
    p->flush();
  }
  out.counters = p->counters();
  return out;
}

void expect_health_near(const trace::TensorHealth& got, const trace::TensorHealth& ref, const std::string& what) {
  EXPECT_EQ(got.numel, ref.numel) << what;
  EXPECT_EQ(got.nan, ref.nan) << what;
  EXPECT_EQ(got.pos_inf, ref.pos_inf) << what;
  EXPECT_EQ(got.neg_inf, ref.neg_inf) << what;
  EXPECT_EQ(got.zero, ref.zero) << what;
  EXPECT_EQ(got.subnormal, ref.subnormal) << what;
  const std::int64_t finite = ref.numel - ref.nan - ref.pos_inf - ref.neg_inf;
  if (finite == 0) {
    EXPECT_TRUE(std::isnan(got.mean) && std::isnan(ref.mean)) << what;
    return;
  }
  EXPECT_EQ(got.min, ref.min) << what;
  EXPECT_EQ(got.max, ref.max) << what;
  EXPECT_EQ(got.absmax, ref.absmax) << what;
  // kernels/cuda/stats_cuda.h: each sum within n u sum|v| of the exact one (u = 2^-53, sum|v| <= n absmax),
  // so the two orders within twice that; sum_sq relatively within 2 n u.
  const double n = static_cast<double>(finite), u = std::ldexp(1.0, -53);
  EXPECT_NEAR(got.mean, ref.mean, 2.0 * n * u * ref.absmax + 4 * u * std::fabs(ref.mean)) << what;
  EXPECT_NEAR(got.rms, ref.rms, ref.rms * (2.0 * n * u + 4 * u)) << what;
}

TEST(sync_cuda_test, a_probed_cuda_run_reads_its_statistics_per_step_with_the_host_paths_rows) {
  SKIP_WITHOUT_GPU();
  for (probe::Level level : {probe::Level::health, probe::Level::full}) {
    SCOPED_TRACE(probe::level_name(level));
    const Probed ref = probed_cuda_training(level, true, 0);
    const Probed got = probed_cuda_training(level, false, 0);
    EXPECT_EQ(ref.counters.stats_reads, 0);
    // At least once per step (its end); more only where an op of the step has no tensor on the GPU (read at once,
    // after the pending ones). That it does not grow with the ops is checked below.
    EXPECT_GE(got.counters.stats_reads, 3);
    ASSERT_EQ(got.sink->ops.size(), ref.sink->ops.size());
    ASSERT_GT(ref.sink->ops.size(), 20u);
    for (std::size_t i = 0; i < ref.sink->ops.size(); ++i) {
      const trace::OpRow &a = got.sink->ops[i], &b = ref.sink->ops[i];
      const std::string what = "op row " + std::to_string(i) + " " + b.op;
      EXPECT_EQ(a.step, b.step) << what;
      EXPECT_EQ(a.seq, b.seq) << what;
      EXPECT_EQ(a.op, b.op) << what;
      EXPECT_EQ(a.module, b.module) << what;
      EXPECT_EQ(a.in_dtypes, b.in_dtypes) << what;
      EXPECT_EQ(a.shape, b.shape) << what;
      EXPECT_EQ(a.cast_overflow, b.cast_overflow) << what;
      EXPECT_EQ(a.cast_underflow, b.cast_underflow) << what;
      EXPECT_EQ(a.origin, b.origin) << what;
      EXPECT_EQ(a.inputs, b.inputs) << what;
      expect_health_near(a.health, b.health, what);
    }
    ASSERT_EQ(got.sink->grads.size(), ref.sink->grads.size());
    for (std::size_t i = 0; i < ref.sink->grads.size(); ++i) {
      const trace::GradRow &a = got.sink->grads[i], &b = ref.sink->grads[i];
      EXPECT_EQ(a.param, b.param);
      EXPECT_EQ(a.unscaled, b.unscaled);
      EXPECT_EQ(a.pos_inf, b.pos_inf) << a.param;
      EXPECT_EQ(a.absmax, b.absmax) << a.param;
      if (std::isfinite(b.norm)) {
        EXPECT_NEAR(a.norm, b.norm, b.norm * 1e-12) << a.param;
      }
    }
    ASSERT_EQ(got.sink->histograms.size(), ref.sink->histograms.size());
    for (std::size_t i = 0; i < ref.sink->histograms.size(); ++i) {
      EXPECT_EQ(got.sink->histograms[i].tensor, ref.sink->histograms[i].tensor);
      EXPECT_EQ(got.sink->histograms[i].bins, ref.sink->histograms[i].bins) << i;
    }
    ASSERT_EQ(got.sink->events.size(), ref.sink->events.size());
    for (std::size_t i = 0; i < ref.sink->events.size(); ++i) {
      EXPECT_EQ(got.sink->events[i].kind, ref.sink->events[i].kind) << i;
      EXPECT_EQ(got.sink->events[i].seq, ref.sink->events[i].seq) << i;
    }
    EXPECT_EQ(got.sink->ended, ref.sink->ended);
  }
}

TEST(sync_cuda_test, host_syncs_per_step_do_not_grow_with_the_number_of_ops) {
  SKIP_WITHOUT_GPU();
  const Probed few = probed_cuda_training(probe::Level::health, false, 0);
  const Probed many = probed_cuda_training(probe::Level::health, false, 40);
  const Probed old = probed_cuda_training(probe::Level::health, true, 40);
  EXPECT_EQ(many.counters.stats_reads, few.counters.stats_reads) << "40 more ops per step, the same reads";
  for (std::size_t s = 0; s < few.syncs.size(); ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    EXPECT_EQ(many.syncs[s], few.syncs[s]) << "40 more ops, the same waits";
    // The loss, the scaler's found_inf and per-parameter reports, the statistics read: a handful, and far
    // below the host path's one per tensor.
    EXPECT_LE(few.syncs[s], 32);
    EXPECT_GT(old.syncs[s], many.syncs[s] + 40) << "the host path waited for every op";
  }
}

#if defined(AMPSCOPE_WITH_CUDA)
TEST(sync_cuda_test, fused_amp_calls_queue_on_the_backend_stream_without_waiting) {
  SKIP_WITHOUT_GPU();
  Backend& backend = backend_for(Device::cuda(0));
  const Tensor g = from_values({1, 2, std::numeric_limits<double>::infinity(), 4}, {4}, {DType::f32, Device::cuda(0)});
  Tensor p = from_values({1, 1, 1, 1}, {4}, {DType::f32, Device::cuda(0)});
  Tensor found = zeros({1}, {DType::f32, Device::cuda(0)});
  backend.synchronize();
  const std::int64_t before = backend.host_syncs();
  backend.fused_non_finite_check_and_unscale({g.kernel_view()}, static_cast<float*>(found.data()), 0.5f);
  backend.fused_sgd_step({{p.kernel_view(), g.kernel_view(), TensorView{}, false}}, {.lr = 0.1},
                         static_cast<const float*>(found.data()));
  EXPECT_EQ(backend.host_syncs(), before) << "no wait inside the fused calls";
  // The one wait is the caller's: found_inf read on the host. 1 (an inf) so the step was skipped.
  EXPECT_EQ(found.item(), 1.0);
  EXPECT_EQ(backend.host_syncs(), before + 1);
  EXPECT_EQ(p.values(), (std::vector<double>{1, 1, 1, 1})) << "skipped: found_inf was read on the device";
  EXPECT_EQ(g.values()[0], 0.5) << "unscaled in place, in stream order before the read";
}

TEST(sync_cuda_test, an_out_of_range_index_is_reported_at_the_next_wait_naming_the_op) {
  SKIP_WITHOUT_GPU();
  const Device cuda = Device::cuda(0);
  Backend& backend = backend_for(cuda);
  // embedding: weight [5, 3], indices (0, 2, 7, 1): 7 at position 2 is out of range for 5 rows.
  const Tensor w = full({5, 3}, 2.0, {DType::f32, cuda});
  const Tensor idx = from_values({0, 2, 7, 1}, {4}, {DType::i64, cuda});
  Tensor out = Tensor::empty({4, 3}, {DType::f32, cuda});
  KernelArgs a;
  a.out = out.kernel_view();
  a.in[0] = w.kernel_view();
  a.in[1] = idx.kernel_view();
  a.num_inputs = 2;
  backend.synchronize();
  EXPECT_NO_THROW(backend.run(Op::embedding, DType::f32, a)) << "the launch does not wait";
  try {
    backend.synchronize();
    FAIL() << "the out-of-range index was not reported";
  } catch (const IndexError& e) {
    EXPECT_EQ(std::string(e.what()),
              "embedding: index 7 at position 2 is out of range for 5 embeddings\n(checked on the device by the index "
              "check of kernel 'embedding'; reported at the next host synchronisation, so later ops may already have "
              "been queued)");
  }
  EXPECT_NO_THROW(backend.synchronize()) << "reported once";
  const std::vector<double> v = out.values();
  EXPECT_TRUE(std::isnan(v[6]) && std::isnan(v[8])) << "the bad row reads nothing: NaN";
  EXPECT_EQ(v[0], 2.0);

  // nll_rows: logp [3, 4], targets (1, -100 ignored, 9): 9 in row 2 is out of bounds for 4 classes.
  const Tensor logp = full({3, 4}, -1.0, {DType::f32, cuda});
  const Tensor target = from_values({1, -100, 9}, {3}, {DType::i64, cuda});
  Tensor per = Tensor::empty({3}, {DType::f32, cuda});
  KernelArgs n;
  n.out = per.kernel_view();
  n.in[0] = logp.kernel_view();
  n.in[1] = target.kernel_view();
  n.num_inputs = 2;
  n.scalars[0] = -100;
  backend.run(Op::nll_rows, DType::f32, n);
  try {
    (void)per.values();  // a copy to the host waits too
    FAIL() << "the out-of-range target was not reported";
  } catch (const IndexError& e) {
    EXPECT_EQ(std::string(e.what()).substr(0, std::string(e.what()).find('\n')),
              "nll_loss: target 9 (row 2) is out of bounds for 4 classes");
    EXPECT_NE(std::string(e.what()).find("kernel 'nll_rows'"), std::string::npos) << e.what();
  }
}
#endif

// ---- embedding and nll_loss through core (core/ops.cpp): no host copy of the indices on CUDA ----

const std::string kCheckedLine =
    "\n(checked on the device by the index check of kernel '{}'; reported at the next host synchronisation, so "
    "later ops may already have been queued)";

std::string checked_by(const std::string& kernel) {
  std::string out = kCheckedLine;
  out.replace(out.find("{}"), 2, kernel);
  return out;
}

TEST(sync_cuda_test, embedding_and_nll_loss_report_a_bad_index_at_the_next_wait_naming_the_op) {
  SKIP_WITHOUT_GPU();
  const Device cuda = Device::cuda(0);
  Backend& backend = backend_for(cuda);
  backend.synchronize();
  const Tensor w = full({5, 3}, 2.0, {DType::f32, cuda});
  Tensor out;
  EXPECT_NO_THROW(out = embedding(from_values({0, 2, 7, 1}, {4}, {DType::i64, cuda}), w)) << "the call does not wait";
  try {
    (void)out.values();
    FAIL() << "the out-of-range index was not reported";
  } catch (const IndexError& e) {
    EXPECT_EQ(std::string(e.what()),
              "embedding: index 7 at position 2 is out of range for 5 embeddings" + checked_by("embedding"));
  }
  const Tensor logp = full({3, 4}, -1.0, {DType::f32, cuda});
  Tensor loss;
  EXPECT_NO_THROW(loss = nll_loss(logp, from_values({1, -100, 9}, {3}, {DType::i64, cuda})));
  try {
    (void)loss.item();
    FAIL() << "the out-of-range target was not reported";
  } catch (const IndexError& e) {
    EXPECT_EQ(std::string(e.what()),
              "nll_loss: target 9 (row 2) is out of bounds for 4 classes" + checked_by("nll_rows"));
  }
  EXPECT_NO_THROW(backend.synchronize()) << "reported once";
}

// Equal as stored values (f16/bf16/f32 widen to double exactly), zeros' signs included; a NaN matches a NaN.
bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

TEST(sync_cuda_test, nll_loss_mean_with_ignore_index_is_the_cpus_bits_forward_and_backward) {
  SKIP_WITHOUT_GPU();
  const Device cuda = Device::cuda(0);
  struct Case {
    DType dtype;
    std::int64_t rows, classes, every;  // every k-th target ignored (0: none; 1: all, 0 / 0 = NaN)
  };
  for (const Case c : {Case{DType::f32, 1000, 9, 7}, Case{DType::f16, 1000, 9, 7}, Case{DType::bf16, 333, 5, 3},
                       Case{DType::f64, 1000, 9, 7}, Case{DType::f16, 11, 6, 0}, Case{DType::f32, 4, 3, 1}}) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + " rows " + std::to_string(c.rows));
    Generator gen(77 + c.rows);
    const Tensor lp = log_softmax(mul(randn({c.rows, c.classes}, gen, {DType::f64}), 3.0), 1).to(c.dtype);
    std::vector<double> tv;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      tv.push_back(c.every > 0 && i % c.every == 0 ? -100.0 : double((i * 5 + 1) % c.classes));
    }
    const Tensor t = from_values(tv, {c.rows}, {DType::i64});
    const Tensor g = from_values({0.7}, {}, {c.dtype});  // not 1, so that g / count rounds
    std::vector<double> loss_bits[2], grad_bits[2];
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      const Device d = on_gpu ? cuda : Device::cpu();
      const Tensor logp = lp.to(d).detach().requires_grad_();
      const Tensor loss = nll_loss(logp, t.to(d), Reduction::mean, -100);
      loss.backward(g.to(d));
      loss_bits[on_gpu] = loss.values();
      grad_bits[on_gpu] = logp.grad().values();
    }
    EXPECT_TRUE(same_value(loss_bits[1][0], loss_bits[0][0])) << loss_bits[1][0] << " vs " << loss_bits[0][0];
    ASSERT_EQ(grad_bits[1].size(), grad_bits[0].size());
    for (std::size_t i = 0; i < grad_bits[0].size(); ++i) {
      ASSERT_TRUE(same_value(grad_bits[1][i], grad_bits[0][i])) << "element " << i;
    }
  }
}

TEST(sync_cuda_test, embedding_and_nll_loss_calls_add_no_host_sync) {
  SKIP_WITHOUT_GPU();
  const Device cuda = Device::cuda(0);
  Backend& backend = backend_for(cuda);
  Generator gen(5);
  const Tensor w = randn({10, 4}, gen, {DType::f32, cuda}).requires_grad_();
  const Tensor idx = from_values({3, 0, 9, 3, 5, 1}, {2, 3}, {DType::i64, cuda});
  const Tensor target = from_values({1, -100, 3, 2, -100, 0}, {6}, {DType::i64, cuda});
  backend.synchronize();
  const std::int64_t before = backend.host_syncs();
  const Tensor e = embedding(idx, w).reshape({6, 4});
  const Tensor mean = nll_loss(log_softmax(e, 1), target);
  const Tensor summed = nll_loss(log_softmax(e, 1), target, Reduction::sum);
  const Tensor none = nll_loss(log_softmax(e, 1), target, Reduction::none);
  const Tensor ce = cross_entropy(e, target);
  add(add(mean, summed), add(sum(none), ce)).backward();
  EXPECT_EQ(backend.host_syncs(), before) << "embedding, nll_loss (mean, sum, none), cross_entropy and their backward";
  EXPECT_TRUE(std::isfinite(mean.item()));
  EXPECT_EQ(backend.host_syncs(), before + 1) << "the one wait is the caller's item()";
}

}  // namespace
}  // namespace ampscope
