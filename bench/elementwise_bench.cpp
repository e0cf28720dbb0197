// Throughput of the CPU backend's element-wise work: a binary op and the f32 -> f16/bf16 casts, on
// tensors large enough to be split over the cores. Run with OMP_NUM_THREADS=1 and without to see what
// the second core buys. Results: bench/RESULTS.md.
#include <benchmark/benchmark.h>

#include "core/ops.h"
#include "core/random.h"

namespace ampscope {
namespace {

constexpr std::int64_t kElements = std::int64_t{1} << 24;  // 16M: 64 MiB of f32, well beyond the caches

void add_same_dtype(benchmark::State& state, DType dtype) {
  Generator gen(1);
  const Tensor a = randn({kElements}, gen, {dtype}), b = randn({kElements}, gen, {dtype});
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b).data());
  state.SetItemsProcessed(state.iterations() * kElements);
  state.SetBytesProcessed(state.iterations() * kElements * 3 * static_cast<std::int64_t>(dtype_size(dtype)));
}

void cast_from_f32(benchmark::State& state, DType to) {
  Generator gen(2);
  const Tensor a = mul(randn({kElements}, gen), 1000.0);
  for (auto _ : state) benchmark::DoNotOptimize(a.to(to).data());
  state.SetItemsProcessed(state.iterations() * kElements);
  state.SetBytesProcessed(state.iterations() * kElements * (4 + static_cast<std::int64_t>(dtype_size(to))));
}

void add_strided_f16(benchmark::State& state) {
  Generator gen(3);
  const Tensor a = randn({4096, 4096}, gen, {DType::f16}).transpose(0, 1);
  const Tensor b = randn({4096}, gen, {DType::f16});
  for (auto _ : state) benchmark::DoNotOptimize(add(a, b).data());
  state.SetItemsProcessed(state.iterations() * kElements);
}

BENCHMARK_CAPTURE(add_same_dtype, f32, DType::f32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(add_same_dtype, f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(add_same_dtype, bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(cast_from_f32, to_f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(cast_from_f32, to_bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(add_strided_f16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ampscope

BENCHMARK_MAIN();
