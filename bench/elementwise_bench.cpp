// Throughput of the CPU backend's element-wise work: a binary op and the f32 -> f16/bf16 casts, on
// tensors large enough to be split over the cores. Run with OMP_NUM_THREADS=1 and without to see what
// the second core buys. Results: bench/RESULTS.md.
//
// Each case checks its own premise after timing (the output has the dtype and size named, and 1,000 of its
// elements, spread over the whole tensor so both threads' halves count, equal the f64 sum or value rounded to
// that dtype: within half an ulp of the dtype, relative to the exact result); when it breaks, the case stops
// with an error naming it and the program exits 1 (ctest bench_elementwise_premises: --elements 65536, one
// iteration each).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "core/ops.h"
#include "core/random.h"

namespace ampscope {
namespace {

// 16M (64 MiB of f32, well beyond the caches) unless --elements N (a square of a power of 2: ctest's small run).
std::int64_t elements = std::int64_t{1} << 24;
std::int64_t side = 4096;  // of the strided case's square
constexpr std::int64_t kSamples = 1000;                     // elements checked per case

// A broken premise: the program exits 1 (Google Benchmark alone would report the error and exit 0).
bool premise_broken = false;

// Half an ulp of `dtype` relative to the value: what rounding a float result to it may lose.
double half_ulp(DType dtype) { return dtype == DType::f16 ? 0x1p-11 : dtype == DType::bf16 ? 0x1p-8 : 0x1p-24; }

// Checks `out` against `expected(i)` (f64) at kSamples flat indices; `scale(i)`: the magnitude the rounding
// error is relative to (the exact result's). Stops the benchmark with the first few problems.
template <class Expected, class Scale>
void check_premise(benchmark::State& state, const char* name, const Tensor& out, DType dtype, Expected expected, Scale scale) {
  std::string problems;
  if (out.dtype() != dtype) problems += fmt::format("output dtype: expected {}, found {}; ", dtype_name(dtype), dtype_name(out.dtype()));
  if (out.numel() != elements) problems += fmt::format("output elements: expected {}, found {}; ", elements, out.numel());
  if (problems.empty()) {
    const Tensor flat = out.reshape({-1});
    int wrong = 0;
    for (std::int64_t k = 0; k < kSamples; ++k) {
      const std::int64_t i = k * (elements / kSamples) + k % 7;
      const double want = expected(i), got = flat.at({i});
      // Rounding loses at most half an ulp of the exact result (plus f16's smallest subnormal step near 0).
      if (!(std::abs(got - want) <= half_ulp(dtype) * scale(i) * 1.0000001 + 0x1p-25) && wrong++ < 3) {
        problems += fmt::format("element {}: expected {} (within half an ulp of {}), found {}; ", i, want, dtype_name(dtype), got);
      }
    }
    if (wrong > 3) problems += fmt::format("{} of {} sampled elements wrong; ", wrong, kSamples);
  }
  if (problems.empty()) return;
  problems.resize(problems.size() - 2);
  std::fprintf(stderr, "elementwise_bench: %s: premise broken: %s\n", name, problems.c_str());
  premise_broken = true;
  state.SkipWithError(("premise broken: " + problems).c_str());
}

void add_same_dtype(benchmark::State& state, DType dtype) {
  Generator gen(1);
  const Tensor a = randn({elements}, gen, {dtype}), b = randn({elements}, gen, {dtype});
  Tensor out;
  for (auto _ : state) {
    out = add(a, b);
    benchmark::DoNotOptimize(out.data());
  }
  const Tensor fa = a.reshape({-1}), fb = b.reshape({-1});
  check_premise(state, "add_same_dtype", out, dtype, [&](std::int64_t i) { return fa.at({i}) + fb.at({i}); },
                [&](std::int64_t i) { return std::abs(fa.at({i}) + fb.at({i})); });
  state.SetItemsProcessed(state.iterations() * elements);
  state.SetBytesProcessed(state.iterations() * elements * 3 * static_cast<std::int64_t>(dtype_size(dtype)));
}

void cast_from_f32(benchmark::State& state, DType to) {
  Generator gen(2);
  const Tensor a = mul(randn({elements}, gen), 1000.0);
  Tensor out;
  for (auto _ : state) {
    out = a.to(to);
    benchmark::DoNotOptimize(out.data());
  }
  check_premise(state, "cast_from_f32", out, to, [&](std::int64_t i) { return a.at({i}); },
                [&](std::int64_t i) { return std::abs(a.at({i})); });
  state.SetItemsProcessed(state.iterations() * elements);
  state.SetBytesProcessed(state.iterations() * elements * (4 + static_cast<std::int64_t>(dtype_size(to))));
}

void add_strided_f16(benchmark::State& state) {
  Generator gen(3);
  const Tensor a = randn({side, side}, gen, {DType::f16}).transpose(0, 1);
  const Tensor b = randn({side}, gen, {DType::f16});
  Tensor out;
  for (auto _ : state) {
    out = add(a, b);
    benchmark::DoNotOptimize(out.data());
  }
  // out[r][c] = a[r][c] + b[c], where a[r][c] is the transposed tensor's element (stored at [c][r]).
  check_premise(state, "add_strided_f16", out, DType::f16, [&](std::int64_t i) { return a.at({i / side, i % side}) + b.at({i % side}); },
                [&](std::int64_t i) { return std::abs(a.at({i / side, i % side}) + b.at({i % side})); });
  state.SetItemsProcessed(state.iterations() * elements);
}

BENCHMARK_CAPTURE(add_same_dtype, f32, DType::f32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(add_same_dtype, f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(add_same_dtype, bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(cast_from_f32, to_f16, DType::f16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(cast_from_f32, to_bf16, DType::bf16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(add_strided_f16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ampscope

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Our own option, after Google Benchmark has taken its own: --elements N.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--elements") continue;
    const long long n = i + 1 < argc ? std::atoll(argv[i + 1]) : 0;
    long long s = 1;
    while (s * s < n) s *= 2;
    if (n < 4096 || s * s != n) {
      std::fprintf(stderr, "elementwise_bench: error: --elements needs the square of a power of 2, at least 4096, got '%s'\n"
                           "hint: elementwise_bench --elements 65536 runs the premise checks at a small size\n",
                   i + 1 < argc ? argv[i + 1] : "");
      return 2;
    }
    ampscope::elements = n;
    ampscope::side = s;
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    break;
  }
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ampscope::premise_broken) {
    std::fprintf(stderr, "elementwise_bench: a benchmark's premise did not hold (above): its figures do not measure what "
                         "its name says\n");
    return 1;
  }
  return 0;
}
