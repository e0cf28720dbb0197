// Forward + backward step time of the sample models on the CPU backend, in f32 and in f16 storage
// (parameters, activations and gradients all f16; element math in float, products accumulated in
// float). One iteration = forward, loss, backward, zero_grad: what a training step costs before the
// optimizer. Results: bench/RESULTS.md.
//
// gpt2_small is issue 18's shape (12 blocks, d 768, 12 heads, vocabulary 50257, batch 1, context 256; an
// untied head, so 163M parameters instead of GPT-2's 124M, the same step arithmetic) with f32 parameters,
// in f32 and under fp16/bf16 autocast: the comparison the goal (fp16 autocast at most 1.5x f32)
// is about. AMPSCOPE_NO_F16C=1 runs it on the portable f16 conversions.
//
// Each case checks its own premise after timing: the last step's loss is finite and every parameter of the
// model received a gradient of its own shape and dtype (the backward pass reached the whole model); when it
// breaks, the case stops with an error naming the parameter and the program exits 1 (ctest
// bench_training_premises runs the sample models' cases once each).
//
//   build/bench/training_bench --benchmark_filter=cnn
//   build/bench/training_bench --benchmark_filter=gpt2_small
#include <time.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/parallel.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

// CPU seconds of every thread of the process: on a shared machine, less disturbed by other work than the
// wall time.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A broken premise: the program exits 1 (Google Benchmark alone would report the error and exit 0).
bool premise_broken = false;

// The premise of a step: a finite loss and a gradient of each parameter's shape and dtype. False (and the
// benchmark stopped) when it does not hold.
bool step_premise(benchmark::State& state, const nn::Module& model, const Tensor& loss) {
  std::string problems;
  const double value = loss.defined() ? loss.item() : std::nan("");
  if (!std::isfinite(value)) problems += fmt::format("loss: expected a finite value, found {}; ", value);
  int missing = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor g = p.grad();
    const bool ok = g.defined() && g.shape() == p.shape() && g.dtype() == p.dtype();
    if (!ok && missing++ < 3) {
      problems += g.defined() ? fmt::format("gradient of {}: expected {} {}, found {} {}; ", name, dtype_name(p.dtype()),
                                            shape_str(p.shape()), dtype_name(g.dtype()), shape_str(g.shape()))
                              : fmt::format("gradient of {}: none (backward did not reach it); ", name);
    }
  }
  if (missing > 3) problems += fmt::format("{} parameters without their gradient; ", missing);
  if (problems.empty()) return true;
  problems.resize(problems.size() - 2);
  // Google Benchmark names the case on the line of its error; this line is for logs that keep stderr only.
  std::fprintf(stderr, "training_bench: premise broken: %s\n", problems.c_str());
  premise_broken = true;
  state.SkipWithError(("premise broken: " + problems).c_str());
  return false;
}

// Runs fwd+bwd of `model` on (x, y) once per iteration; `loss_of` maps the output to a scalar loss. With
// `autocast`, the forward pass and the loss run in an autocast region of that dtype (backward after it).
template <class LossFn>
void step_loop(benchmark::State& state, nn::Module& model, const Tensor& x, const Tensor& y, LossFn loss_of,
               std::optional<DType> autocast = std::nullopt) {
  double cpu = 0;
  Tensor last_loss;
  for (auto _ : state) {
    const double cpu0 = process_cpu_seconds();
    for (const Tensor& p : model.parameters()) const_cast<Tensor&>(p).set_grad(Tensor());
    Tensor loss;
    {
      AutocastGuard region(autocast.value_or(DType::f16), autocast.has_value());
      loss = loss_of(model(x), y);
    }
    loss.backward();
    benchmark::DoNotOptimize(loss.data());
    cpu += process_cpu_seconds() - cpu0;
    last_loss = loss;
  }
  if (!step_premise(state, model, last_loss)) return;
  // All threads' CPU time per step (ms), the step's own work whatever else the machine runs.
  state.counters["all_threads_cpu_ms"] = 1000 * cpu / static_cast<double>(state.iterations());
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(x.size(0)), benchmark::Counter::kIsIterationInvariantRate);
  // What was trained, for bench/cpu_vs_pytorch.sh's premise (the PyTorch side trained the same model on the thread
  // count asked): the number of parameter tensors and of their elements, and the CPU pool's threads.
  double elements = 0;
  for (const Tensor& p : model.parameters()) elements += static_cast<double>(p.numel());
  state.counters["param_tensors"] = static_cast<double>(model.parameters().size());
  state.counters["param_elements"] = elements;
  state.counters["pool_threads"] = cpu::num_threads();  // not "threads": Google Benchmark's own JSON key
}

// MLP 784 -> 256 -> 256 -> 10, batch 128.
void mlp(benchmark::State& state, DType dtype) {
  Generator gen(1);
  auto model = samples::make_mlp({.in_features = 784, .hidden = 256, .classes = 10}, gen);
  model->to(dtype);
  const samples::Dataset d = samples::make_blobs({.samples = 128, .features = 784, .classes = 10}, gen);
  step_loop(state, *model, d.x.to(dtype), d.y, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
}

// The classic MNIST CNN, batch 64.
void cnn(benchmark::State& state, DType dtype) {
  Generator gen(2);
  auto model = samples::make_mnist_cnn(gen);
  model->to(dtype);
  const samples::Dataset d = samples::make_random_images(64, gen);
  step_loop(state, *model, d.x.to(dtype), d.y, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
}

// Tiny GPT: 2 blocks, d_model 128, 4 heads, context 64, vocabulary 256, batch 16.
void transformer(benchmark::State& state, DType dtype) {
  Generator gen(3);
  const samples::TinyTransformerConfig config{.vocab = 256, .context = 64, .d_model = 128, .n_heads = 4, .n_layers = 2};
  samples::TinyTransformer model(config, gen);
  model.to(dtype);
  const samples::Dataset d = samples::make_token_sequences(16, 64, 256, gen);
  step_loop(state, model, d.x, d.y, [](const Tensor& out, const Tensor& y) {
    return cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
  });
}

// GPT-2-small shapes, f32 parameters; `autocast` empty: plain f32, else that autocast dtype.
void gpt2_small(benchmark::State& state, std::optional<DType> autocast) {
  Generator gen(4);
  const samples::TinyTransformerConfig config{.vocab = 50257, .context = 256, .d_model = 768, .n_heads = 12, .n_layers = 12};
  samples::TinyTransformer model(config, gen);
  const samples::Dataset d = samples::make_token_sequences(1, 256, 50257, gen);
  step_loop(
      state, model, d.x, d.y,
      [](const Tensor& out, const Tensor& y) { return cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1})); },
      autocast);
}

BENCHMARK_CAPTURE(mlp, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f16, DType::f16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f16, DType::f16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f16, DType::f16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(gpt2_small, f32, std::nullopt)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(gpt2_small, fp16_autocast, DType::f16)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK_CAPTURE(gpt2_small, bf16_autocast, DType::bf16)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
}  // namespace ampscope

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ampscope::premise_broken) {
    std::fprintf(stderr, "training_bench: a benchmark's premise did not hold (above): its figures do not measure what its "
                         "name says\n");
    return 1;
  }
  return 0;
}
