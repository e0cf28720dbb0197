// Probe overhead: the forward + backward step of the sample models on the CPU backend without a probe and
// with a probe at level health (every op's output and every gradient measured), as a ratio of step times
// measured in the same run. Each iteration runs one step without and one step with the probe, in
// alternating order, so both see the same machine load; the counters give the mean step times and their
// ratio (of the means, and the median of the pairs' ratios), and the ratio of the process's CPU time
// over each kind of half (cpu_ratio: what a loaded machine moves least). The probe writes to a sink that discards
// rows ("discard") or to a real HDF5 trace in /tmp ("trace"). A step is what bench/training_bench.cpp
// times, plus a StepScope and the report of the gradients a training loop makes. Results:
// bench/RESULTS.md.
// Each benchmark checks its premise after its loop: the probe recorded rows in the probed half of every pair
// and in no other step (the same number of op rows each time, one gradient row per parameter), and the twin
// its rows in every twinned half; a trace written holds those rows. When one fails it stops with an error
// naming what it expected and found, and the program exits 1.
//
//   build/bench/probe_bench --benchmark_filter=mlp
#include <benchmark/benchmark.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

// Rows counted per step as they come (in step order: one increment per row, a new entry per step), so the
// timed half pays next to nothing for the count.
struct StepCounts {
  void add(std::int64_t step) {
    if (counts.empty() || counts.back().first != step) counts.emplace_back(step, 0);
    ++counts.back().second;
  }
  std::map<std::int64_t, std::int64_t> by_step() const {
    std::map<std::int64_t, std::int64_t> m;
    for (const auto& [step, n] : counts) m[step] += n;
    return m;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> counts;
};

// Drops the rows, counting them per step.
struct DiscardSink : trace::Sink {
  void write(const trace::StepRow&) override {}
  void write(const trace::OpRow& r) override { ops.add(r.step); }
  void write(const trace::GradRow& r) override { grads.add(r.step); }
  void write(const trace::EventRow&) override {}
  void write(const trace::HistogramRow&) override {}
  void write(const trace::DumpRow&) override {}
  StepCounts ops, grads;
};

// CPU time of the whole process (every thread: the step's pool, the trace writer's threads), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A broken premise: the benchmark stops with an error and the program exits 1.
bool premise_broken = false;

// The premise of one benchmark: rows recorded in `steps` steps (the probed ones), the same number of op
// rows in each (more than none) and one gradient row per parameter in each.
std::string check_rows(const char* what, const std::map<std::int64_t, std::int64_t>& by_step, std::int64_t steps,
                       std::int64_t per_step = -1) {
  if (static_cast<std::int64_t>(by_step.size()) != steps)
    return fmt::format("{}: expected rows in {} steps, found them in {}", what, steps, by_step.size());
  for (const auto& [step, n] : by_step) {
    const std::int64_t want = per_step >= 0 ? per_step : by_step.begin()->second;
    if (n != want || n == 0)
      return fmt::format("{}: expected {} rows in every step, found {} in step {}", what, want, n, step);
  }
  return "";
}

// twin: both halves run with the probe (discarding rows); the second also with the f32 twin wrapped
// around it (probes/twin.h), twinning every step (forward ops and backward nodes); the ratio is the twin's cost
// over the probe's. twin_forward: the same with the twin of the forward pass only (TwinOptions::backward false).
enum class SinkKind { discard, trace, twin, twin_forward };

std::shared_ptr<trace::Sink> make_sink(SinkKind kind, const std::string& model) {
  if (kind != SinkKind::trace) return std::make_shared<DiscardSink>();
  const auto path = std::filesystem::temp_directory_path() /
                    ("ampscope_probe_bench_" + model + "_" + std::to_string(::getpid()) + ".h5");
  return std::make_shared<trace::TraceWriter>(
      path, trace::RunInfo{.precision = "fp32", .device = "cpu", .model = model, .seed = 0, .config = "{}"});
}

template <class LossFn>
void compare(benchmark::State& state, nn::Module& model, const Tensor& x, const Tensor& y, LossFn loss_of,
             SinkKind kind, const std::string& name) {
  const std::vector<Tensor> params = model.parameters();
  std::int64_t step = 0;
  auto one_step = [&] {
    probe::StepScope scope(step);
    for (const Tensor& p : params) const_cast<Tensor&>(p).set_grad(Tensor());
    Tensor loss = loss_of(model(x), y);
    loss.backward();
    probe::report_grads(params, /*unscaled=*/true);
    scope.end({.step = step});
    ++step;
    benchmark::DoNotOptimize(loss.data());
  };
  const std::shared_ptr<trace::Sink> sink = make_sink(kind, name);
  const auto probe = std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::health});
  const bool twinned = kind == SinkKind::twin || kind == SinkKind::twin_forward;
  const auto twin = twinned ? std::make_shared<probe::Twin>(probe, probe::TwinOptions{.backward = kind == SinkKind::twin})
                            : nullptr;
  using clock = std::chrono::steady_clock;
  clock::duration plain{}, probed{};
  double plain_cpu = 0, probed_cpu = 0;  // process CPU seconds of each kind of half
  std::vector<double> pair_ratios;
  std::int64_t i = 0;
  for (auto _ : state) {
    const bool probe_first = (i++ % 2) == 1;
    clock::duration pair[2]{};  // [0] without, [1] with the probe
    for (int half = 0; half < 2; ++half) {
      const bool with_probe = (half == 0) == probe_first;
      const auto t0 = clock::now();
      const double c0 = process_cpu_seconds();
      if (twin) {
        probe::HookGuard installed(with_probe ? std::shared_ptr<probe::Hook>(twin) : probe);
        one_step();
      } else if (with_probe) {
        probe::HookGuard installed(probe);
        one_step();
      } else {
        one_step();
      }
      pair[with_probe ? 1 : 0] = clock::now() - t0;
      (with_probe ? probed_cpu : plain_cpu) += process_cpu_seconds() - c0;
    }
    plain += pair[0];
    probed += pair[1];
    pair_ratios.push_back(std::chrono::duration<double>(pair[1]) / std::chrono::duration<double>(pair[0]));
  }
  probe->flush();
  // The premise: the probed half of each pair recorded rows (a probe that records nothing costs nothing),
  // the other half none (with the twin, both halves have the probe and only the twinned one twin rows).
  const auto iterations = static_cast<std::int64_t>(state.iterations());
  const auto n_params = static_cast<std::int64_t>(params.size());
  std::vector<std::string> problems;
  if (auto* writer = dynamic_cast<trace::TraceWriter*>(sink.get())) {
    writer->close();
    const trace::RowCounts c = trace::TraceReader(writer->path()).row_counts();
    if (c.ops == 0 || c.ops % iterations != 0)
      problems.push_back(fmt::format("op rows in the trace: expected a multiple of the {} probed steps above 0, found {}",
                                     iterations, c.ops));
    if (c.grads != iterations * n_params)
      problems.push_back(fmt::format("gradient rows in the trace: expected {} ({} steps x {} parameters), found {}",
                                     iterations * n_params, iterations, n_params, c.grads));
    std::filesystem::remove(writer->path());
  } else {
    const auto& counts = dynamic_cast<DiscardSink&>(*sink);
    const std::int64_t probed_steps = twin ? 2 * iterations : iterations;
    // The twin keeps its rows (no sink of its own): one per twinned op, in the twinned halves' steps.
    std::map<std::int64_t, std::int64_t> twin_by_step;
    if (twin)
      for (const trace::PrecisionRow& r : twin->rows()) ++twin_by_step[r.step];
    for (const std::string& p : {check_rows("op rows", counts.ops.by_step(), probed_steps),
                                 check_rows("gradient rows", counts.grads.by_step(), probed_steps, n_params),
                                 twin ? check_rows("twin rows", twin_by_step, iterations) : std::string()})
      if (!p.empty()) problems.push_back(p);
  }
  if (!problems.empty()) {
    const std::string text = fmt::format("premise broken: {}", fmt::join(problems, "; "));
    std::fprintf(stderr, "probe_bench: %s: %s\n", name.c_str(), text.c_str());
    premise_broken = true;
    state.SkipWithError(text.c_str());
    return;
  }
  const double n = static_cast<double>(state.iterations());
  const double plain_ms = std::chrono::duration<double, std::milli>(plain).count() / n;
  const double probed_ms = std::chrono::duration<double, std::milli>(probed).count() / n;
  state.counters[twin ? "health_ms" : "plain_ms"] = plain_ms;
  state.counters[twin ? "twin_ms" : "health_ms"] = probed_ms;
  state.counters["ratio"] = probed_ms / plain_ms;
  // CPU time of the process over each kind of half: what a loaded machine moves less than wall time (work
  // the trace writer's threads do after a step ends counts in whichever half it lands in).
  state.counters["cpu_ratio"] = probed_cpu / plain_cpu;
  // Values whose statistics the probe asked for per probed step, and the share its step's statistics cache
  // served without reading them (an unwritten storage seen again: a weight gradient's clone in .grad).
  const probe::Probe::Counters& pc = probe->counters();
  state.counters["values_per_step"] = static_cast<double>(pc.stats_values) / n;
  state.counters["cached_share"] =
      pc.stats_values > 0 ? static_cast<double>(pc.stats_values_cached) / static_cast<double>(pc.stats_values) : 0;
  // On a shared machine a burst of other work can land in either half of a pair; the median of the
  // pairs' ratios is what such bursts move least.
  std::sort(pair_ratios.begin(), pair_ratios.end());
  state.counters["median_ratio"] = pair_ratios[pair_ratios.size() / 2];
}

// MLP 784 -> 256 -> 256 -> 10, batch 128.
void mlp(benchmark::State& state, DType dtype, SinkKind kind) {
  Generator gen(1);
  auto model = samples::make_mlp({.in_features = 784, .hidden = 256, .classes = 10}, gen);
  model->to(dtype);
  const samples::Dataset d = samples::make_blobs({.samples = 128, .features = 784, .classes = 10}, gen);
  compare(
      state, *model, d.x.to(dtype), d.y, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, kind,
      "mlp");
}

// The classic MNIST CNN, batch 64.
void cnn(benchmark::State& state, DType dtype, SinkKind kind) {
  Generator gen(2);
  auto model = samples::make_mnist_cnn(gen);
  model->to(dtype);
  const samples::Dataset d = samples::make_random_images(64, gen);
  compare(
      state, *model, d.x.to(dtype), d.y, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }, kind,
      "cnn");
}

// Tiny GPT: 2 blocks, d_model 128, 4 heads, context 64, vocabulary 256, batch 16.
void transformer(benchmark::State& state, DType dtype, SinkKind kind) {
  Generator gen(3);
  const samples::TinyTransformerConfig config{.vocab = 256, .context = 64, .d_model = 128, .n_heads = 4, .n_layers = 2};
  samples::TinyTransformer model(config, gen);
  model.to(dtype);
  const samples::Dataset d = samples::make_token_sequences(16, 64, 256, gen);
  compare(
      state, model, d.x, d.y,
      [](const Tensor& out, const Tensor& y) {
        return cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
      },
      kind, "transformer");
}

BENCHMARK_CAPTURE(mlp, f32_discard, DType::f32, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f16_discard, DType::f16, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f32_trace, DType::f32, SinkKind::trace)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f32_discard, DType::f32, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f16_discard, DType::f16, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f32_trace, DType::f32, SinkKind::trace)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f32_discard, DType::f32, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f16_discard, DType::f16, SinkKind::discard)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f16_twin, DType::f16, SinkKind::twin)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f16_twin, DType::f16, SinkKind::twin)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f16_twin, DType::f16, SinkKind::twin)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f16_twin_forward, DType::f16, SinkKind::twin_forward)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f16_twin_forward, DType::f16, SinkKind::twin_forward)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f16_twin_forward, DType::f16, SinkKind::twin_forward)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f32_trace, DType::f32, SinkKind::trace)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ampscope

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ampscope::premise_broken) {
    std::fprintf(stderr, "probe_bench: a benchmark's premise did not hold (above): its figures do not measure what its "
                         "name says\n");
    return 1;
  }
  return 0;
}
