// Forward + backward step time of the sample models on the CPU backend, in f32 and in f16 storage
// (parameters, activations and gradients all f16; element math in float, products accumulated in
// float). One iteration = forward, loss, backward, zero_grad: what a training step costs before the
// optimizer. Results: bench/RESULTS.md.
//
//   build/bench/training_bench --benchmark_filter=cnn
#include <benchmark/benchmark.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

// Runs fwd+bwd of `model` on (x, y) once per iteration; `loss_of` maps the output to a scalar loss.
template <class LossFn>
void step_loop(benchmark::State& state, nn::Module& model, const Tensor& x, const Tensor& y, LossFn loss_of) {
  for (auto _ : state) {
    for (const Tensor& p : model.parameters()) const_cast<Tensor&>(p).set_grad(Tensor());
    Tensor loss = loss_of(model(x), y);
    loss.backward();
    benchmark::DoNotOptimize(loss.data());
  }
  state.counters["samples/s"] = benchmark::Counter(static_cast<double>(x.size(0)), benchmark::Counter::kIsIterationInvariantRate);
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

BENCHMARK_CAPTURE(mlp, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(mlp, f16, DType::f16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(cnn, f16, DType::f16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f32, DType::f32)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(transformer, f16, DType::f16)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ampscope

BENCHMARK_MAIN();
