// allreduce_bench: what the gradient all-reduce of data-parallel training costs per step, at the sizes of
// the sample models' gradients (the models training_bench times), on the CPU over the MPI process group.
// Run under the launcher (a plain program, no Google Benchmark):
//
//   mpirun --oversubscribe -np 2 build/bin/allreduce_bench [repeats]
//
// For each model and dtype it times, as the median and the fastest of `repeats` steps (each after a barrier;
// the values double every step, so f16 reaches inf after about 26 steps, which costs no more to add):
//   flat        one ProcessGroup::all_reduce of all the gradients in one buffer (a bucketed DDP's best case);
//   per-tensor  one all_reduce per parameter tensor (DDP without buckets);
//   MPI_Allreduce  Open MPI's own MPI_SUM on the same flat f32 buffer, for scale (f32 only: MPI has no f16).
// Rank 0 prints one table row per (model, dtype).
// Then ZeRO-1 against plain DDP (issue 21), per model, f32 parameters and gradients (the runs' master
// weights): the part of a training step that differs between them, timed the same way:
//   plain DDP   GradientAllReducer::all_reduce, then AdamW's step over every parameter;
//   ZeRO-1      the same all-reduce, then AdamW's step over this rank's shard (ShardedOptimizer) and the
//               owners' broadcasts of the updated parameters;
// with the elements of optimizer state each rank holds (the largest shard's for ZeRO-1).
// The premise, checked after timing (each rank prints "allreduce_bench: premise broken: expected X, found Y" and
// exits 1, whatever the timings): at least 2 ranks; every buffer all-reduced holds the sum it should after the
// warm-up and the timed steps (1/1024 times ranks^(1 + repeats), rounded to its dtype: the reduction really summed
// over every rank each time); ZeRO-1's parameters equal plain DDP's bit for bit after the same steps (the sharded
// step computed the same update) and its largest shard holds less state than plain DDP's whole.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/distributed/data_parallel.h"
#include "core/optim.h"
#include "core/distributed/process_group.h"
#include "core/distributed/zero_optimizer.h"
#include "samples/models.h"

namespace {

using namespace ampscope;

// Broken premises of this rank, reported after timing.
std::vector<std::string> problems;

// The first and last element of `t` hold `want` rounded to t's dtype (the all-reduce summed what it should).
void expect_sum(const Tensor& t, double want, const std::string& what) {
  const double rounded = full({1}, want, {.dtype = t.dtype()}).values()[0];
  const std::vector<double> v = t.values();
  for (double got : {v.front(), v.back()}) {
    if (!(got == rounded)) {
      problems.push_back(fmt::format("{}: expected {} ({} rounded to {}), found {}", what, rounded, want,
                                     dtype_name(t.dtype()), got));
      return;
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double median_ms, min_ms;
};

template <class Fn>
Timing time_ms(ProcessGroup& group, int repeats, Fn&& fn) {
  fn();  // warm-up: first-touch of buffers, MPI's connection set-up
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    group.barrier();
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  // The slowest rank's median (and fastest step) is the step's cost.
  double mine[2] = {median(times), *std::min_element(times.begin(), times.end())}, slowest[2] = {0, 0};
  MPI_Allreduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return {slowest[0], slowest[1]};
}

std::string format(const Timing& t) {
  char text[64];
  std::snprintf(text, sizeof text, "%.3f (%.3f)", t.median_ms, t.min_ms);
  return text;
}

struct Model {
  std::string name;
  std::vector<std::int64_t> sizes;  // numel of each parameter tensor
};

std::vector<std::int64_t> parameter_sizes(const nn::Module& model) {
  std::vector<std::int64_t> sizes;
  for (const Tensor& p : model.parameters()) sizes.push_back(p.numel());
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 20;
  try {
    std::unique_ptr<ProcessGroup> group = make_process_group();
    if (group->name() != std::string("mpi")) {
      std::fprintf(stderr, "allreduce_bench: run it under mpirun (mpirun --oversubscribe -np 2 %s)\n", argv[0]);
      return 2;
    }
    Generator gen(0);
    std::vector<Model> models;
    models.push_back({"MLP 784-256-256-10",
                      parameter_sizes(*samples::make_mlp({.in_features = 784, .hidden = 256, .classes = 10}, gen))});
    models.push_back({"MNIST CNN", parameter_sizes(*samples::make_mnist_cnn(gen))});
    const samples::TinyTransformerConfig gpt{.vocab = 256, .context = 64, .d_model = 128, .n_heads = 4, .n_layers = 2};
    models.push_back({"tiny GPT (2 blocks, d 128)", parameter_sizes(samples::TinyTransformer(gpt, gen))});

    if (group->rank() == 0) {
      std::printf("allreduce_bench: %d ranks, median (fastest) of %d steps in ms, the slowest rank's\n", group->size(),
                  repeats);
      std::printf("| model | parameters (tensors) | dtype | flat | per-tensor | MPI_Allreduce f32 |\n|---|---|---|---|---|---|\n");
    }
    for (const Model& m : models) {
      std::int64_t total = 0;
      for (std::int64_t n : m.sizes) total += n;
      for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        Tensor flat = full({total}, 1.0 / 1024, {.dtype = dtype});
        std::vector<Tensor> tensors;
        for (std::int64_t n : m.sizes) tensors.push_back(full({n}, 1.0 / 1024, {.dtype = dtype}));
        const Timing flat_ms = time_ms(*group, repeats, [&] { group->all_reduce(flat); });
        const Timing per_tensor_ms = time_ms(*group, repeats, [&] {
          for (Tensor& t : tensors) group->all_reduce(t);
        });
        Timing mpi_ms{-1, -1};
        if (dtype == DType::f32) {
          std::vector<float> out(static_cast<std::size_t>(total));
          mpi_ms = time_ms(*group, repeats, [&] {
            MPI_Allreduce(flat.data(), out.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          });
        }
        // The warm-up and `repeats` all-reduces, each a sum over the ranks.
        const double want = std::pow(static_cast<double>(group->size()), repeats + 1) / 1024;
        const std::string label = fmt::format("{} {}", m.name, dtype_name(dtype));
        expect_sum(flat, want, label + " flat buffer");
        expect_sum(tensors.front(), want, label + " first tensor");
        expect_sum(tensors.back(), want, label + " last tensor");
        if (group->rank() == 0) {
          const std::string mpi = mpi_ms.median_ms < 0 ? "" : format(mpi_ms);
          std::printf("| %s | %lld (%zu) | %s | %s | %s | %s |\n", m.name.c_str(), static_cast<long long>(total),
                      m.sizes.size(), std::string(dtype_name(dtype)).c_str(), format(flat_ms).c_str(),
                      format(per_tensor_ms).c_str(), mpi.c_str());
        }
      }
    }

    // ZeRO-1 against plain DDP: the models themselves (f32 parameters), a constant gradient (its mean over
    // the ranks is itself, so every step does the same work).
    if (group->rank() == 0) {
      std::printf("\nZeRO-1 against plain DDP: all-reduce + AdamW step (+ ZeRO-1's broadcasts), median (fastest) in "
                  "ms; optimizer state elements per rank (ZeRO-1: the largest shard's)\n");
      std::printf("| model | plain DDP | ZeRO-1 | state per rank, plain | state per rank, ZeRO-1 |\n|---|---|---|---|---|\n");
    }
    auto make_models = [&](Generator& g) {
      std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> out;
      out.emplace_back("MLP 784-256-256-10",
                       std::shared_ptr<nn::Module>(samples::make_mlp({.in_features = 784, .hidden = 256, .classes = 10}, g)));
      out.emplace_back("MNIST CNN", std::shared_ptr<nn::Module>(samples::make_mnist_cnn(g)));
      out.emplace_back("tiny GPT (2 blocks, d 128)", std::make_shared<samples::TinyTransformer>(gpt, g));
      return out;
    };
    Generator g1(1), g2(1);
    auto plain_models = make_models(g1), zero_models = make_models(g2);
    for (std::size_t m = 0; m < plain_models.size(); ++m) {
      std::vector<Tensor> plain_params = plain_models[m].second->parameters();
      std::vector<Tensor> zero_params = zero_models[m].second->parameters();
      for (std::vector<Tensor>* ps : {&plain_params, &zero_params}) {
        for (Tensor& p : *ps) p.set_grad(full(p.shape(), 1.0 / 1024));
      }
      optim::AdamW plain_opt(plain_params, {.lr = 1e-3}), zero_opt(zero_params, {.lr = 1e-3});
      GradientAllReducer plain_reducer(*group, plain_params), zero_reducer(*group, zero_params);
      ShardedOptimizer zero(*group, zero_opt);
      const Timing plain_ms = time_ms(*group, repeats, [&] {
        plain_reducer.all_reduce();
        plain_opt.step();
      });
      const Timing zero_ms = time_ms(*group, repeats, [&] {
        zero_reducer.all_reduce();
        zero_opt.step();
      });
      std::int64_t largest = 0;
      for (int r = 0; r < group->size(); ++r) largest = std::max(largest, 2 * zero.shard_elements(r));
      for (std::size_t i = 0; i < plain_params.size(); ++i) {
        if (plain_params[i].values() != zero_params[i].values()) {
          problems.push_back(fmt::format("{}: expected ZeRO-1's parameter {} equal to plain DDP's bit for bit after "
                                         "the same steps, found it differs", plain_models[m].first, i));
          break;
        }
      }
      if (group->size() >= 2 && largest >= optimizer_state_elements(plain_opt)) {
        problems.push_back(fmt::format("{}: expected ZeRO-1's largest shard below plain DDP's {} state elements, "
                                       "found {}", plain_models[m].first, optimizer_state_elements(plain_opt), largest));
      }
      if (group->rank() == 0) {
        std::printf("| %s | %s | %s | %lld | %lld |\n", plain_models[m].first.c_str(), format(plain_ms).c_str(),
                    format(zero_ms).c_str(), static_cast<long long>(optimizer_state_elements(plain_opt)),
                    static_cast<long long>(largest));
      }
    }
    if (group->size() < 2) problems.push_back(fmt::format("expected at least 2 ranks, found {}", group->size()));
    for (const std::string& p : problems) std::fprintf(stderr, "allreduce_bench: premise broken (rank %d): %s\n", group->rank(), p.c_str());
    return problems.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
}
