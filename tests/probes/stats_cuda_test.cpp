// The statistics kernel (kernels/cuda/stats_cuda.h) against probe::tensor_stats (probes/stats.cpp) on
// the same tensors: counts, min, max, absmax and the exponent histogram exactly; mean and rms within
// the bound that different summation orders allow (stats_cuda.h). The gpu_timing tests are not tests
// but the measurements bench/gpu_bench.sh takes (disabled unless asked for with
// --gtest_also_run_disabled_tests). Everything skips, saying why, where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"
#include "core/random.h"
#include "probes/stats.h"
#include "probes/trace/schema.h"
#include "tests/test_support.h"
#if defined(AMPSCOPE_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/stats_cuda.h"
#endif

namespace ampscope {
namespace {

#if defined(AMPSCOPE_WITH_CUDA)
static_assert(cuda::kStatsHistBins == trace::kHistBins, "the kernel's histogram must have the trace's bins");

constexpr double kInf = std::numeric_limits<double>::infinity();

// Values of every class: normals over many binades, zeros of both signs, subnormals of the dtype,
// values beyond the top and below the bottom histogram exponent (f64), and non-finite ones.
Tensor mixed_tensor(std::int64_t n, DType dtype, std::uint64_t seed) {
  Generator gen(seed);
  std::vector<double> v = randn({n}, gen, {DType::f64}).values();
  const std::vector<double> e = rand({n}, gen, {DType::f64}).values();
  for (std::int64_t i = 0; i < n; ++i) v[i] *= std::ldexp(1.0, static_cast<int>(e[i] * 40) - 20);
  const double tiny = dtype == DType::f16 ? 3e-6 : dtype == DType::f64 ? 1e-310 : 1e-39;
  const std::vector<double> specials = {0.0, -0.0, tiny, -tiny, kInf, -kInf, std::nan(""), 65504.0, -1e-3};
  for (std::size_t k = 0; k < specials.size() && static_cast<std::int64_t>(k * 97) < n; ++k) v[k * 97] = specials[k];
  if (dtype == DType::f64 && n > 2000) {
    v[1500] = 1e30;   // exponent 99: the top bin
    v[1501] = 1e-25;  // exponent -84: below the histogram, into the subnormal bin
  }
  return from_values(v, {n}, {dtype, Device::cpu()});
}

void expect_stats_match(const Tensor& cpu_view, const Tensor& gpu_view, bool histogram, const std::string& what) {
  const probe::TensorStats ref = probe::tensor_stats(cpu_view, histogram);
  const cuda::DeviceStats got =
      cuda::cuda_tensor_stats(backend_for(Device::cuda(0)), gpu_view.kernel_view(), histogram);
  const trace::TensorHealth& h = ref.health;
  EXPECT_EQ(got.numel, static_cast<std::uint64_t>(h.numel)) << what;
  EXPECT_EQ(got.nan, static_cast<std::uint64_t>(h.nan)) << what;
  EXPECT_EQ(got.pos_inf, static_cast<std::uint64_t>(h.pos_inf)) << what;
  EXPECT_EQ(got.neg_inf, static_cast<std::uint64_t>(h.neg_inf)) << what;
  EXPECT_EQ(got.zero, static_cast<std::uint64_t>(h.zero)) << what;
  EXPECT_EQ(got.subnormal, static_cast<std::uint64_t>(h.subnormal)) << what;
  const std::uint64_t finite = got.finite();
  if (finite == 0) {
    EXPECT_TRUE(std::isnan(got.min) && std::isnan(got.max) && std::isnan(got.absmax)) << what;
    EXPECT_TRUE(std::isnan(got.mean()) && std::isnan(h.mean)) << what;
  } else {
    EXPECT_EQ(got.min, h.min) << what;  // -0 == +0: which zero is the minimum depends on the order
    EXPECT_EQ(got.max, h.max) << what;
    EXPECT_EQ(got.absmax, h.absmax) << what;
    // Sums of the same exact terms in two orders: each differs from the exact sum by at most
    // (n - 1) u sum|v| (u = 2^-53), so from each other by twice that; sum|v| <= n absmax.
    const double n = static_cast<double>(finite);
    const double u = std::ldexp(1.0, -53);
    const double sum_bound = 2.0 * n * u * n * h.absmax;
    EXPECT_NEAR(got.mean(), h.mean, sum_bound / n) << what;
    const double sq_bound = 2.0 * n * u * ref.sum_sq + 4 * u * ref.sum_sq;
    EXPECT_NEAR(got.sum_sq, ref.sum_sq, sq_bound) << what;
    EXPECT_NEAR(got.rms(), h.rms, h.rms * (n * u * 2 + 4 * u)) << what;
  }
  if (histogram) {
    for (int b = 0; b < trace::kHistBins; ++b) {
      EXPECT_EQ(got.histogram[b], static_cast<std::uint64_t>(ref.histogram[b])) << what << ": bin " << b;
    }
  }
}

void expect_stats_match(const Tensor& cpu, bool histogram, const std::string& what) {
  expect_stats_match(cpu, cpu.to(Device::cuda(0)), histogram, what);
}
#endif  // AMPSCOPE_WITH_CUDA

TEST(stats_cuda_test, gives_the_cpu_statistics_for_every_floating_dtype) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{4099}, std::int64_t{3'000'001}}) {
      const Tensor t = mixed_tensor(n, dtype, 10 + static_cast<std::uint64_t>(n));
      for (const bool histogram : {false, true}) {
        expect_stats_match(t, histogram,
                           std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + (histogram ? " +hist" : ""));
      }
    }
  }
#endif
}

TEST(stats_cuda_test, reads_strided_and_unaligned_views_in_place) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  const Tensor cpu = mixed_tensor(300 * 513, DType::f16, 3).reshape({300, 513});
  const Tensor gpu = cpu.to(Device::cuda(0));
  // A transpose (strided), and a slice starting one element in (not 16-byte aligned).
  expect_stats_match(cpu.transpose(0, 1), gpu.transpose(0, 1), true, "transposed f16");
  expect_stats_match(cpu.reshape({-1}).slice(0, 1, 100001), gpu.reshape({-1}).slice(0, 1, 100001), true,
                     "unaligned f16 slice");
#endif
}

TEST(stats_cuda_test, reports_nan_moments_for_empty_and_all_non_finite_tensors) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  expect_stats_match(zeros({0}, {DType::f32}), true, "empty");
  expect_stats_match(from_values({kInf, -kInf, std::nan("")}, {3}, {DType::bf16}), true, "all non-finite");
#endif
}

TEST(stats_cuda_test, keeps_earlier_ring_slots_while_later_ones_are_queued) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  Backend& be = backend_for(Device::cuda(0));
  std::vector<Tensor> tensors;
  for (int i = 0; i < 4; ++i) tensors.push_back(full({1000 + i}, static_cast<double>(i + 1), {DType::f32, Device::cuda(0)}));
  be.synchronize();
  cuda::StatsBuffer ring(0, 4);
  for (int i = 0; i < 4; ++i) ring.launch(tensors[i].kernel_view(), false, i, cudaStreamPerThread);
  for (int i = 3; i >= 0; --i) {
    const cuda::DeviceStats& s = ring.wait(i);
    EXPECT_EQ(s.numel, static_cast<std::uint64_t>(1000 + i));
    EXPECT_EQ(s.max, i + 1.0);
    EXPECT_EQ(s.sum, (i + 1.0) * (1000 + i));  // exact: small integers
  }
  EXPECT_THROW_MSG(ring.launch(tensors[0].kernel_view(), false, 4, cudaStreamPerThread), IndexError,
                   "slot 4 is out of range (the ring has 4 slots)");
#endif
}

TEST(stats_cuda_test, orders_launches_on_two_streams_that_share_the_ring) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  // Large tensors, so that the first launch is still running when the second is queued on another
  // stream: without the ring's ordering the second would overwrite the first's block partials.
  const Tensor a = full({1 << 24}, 1.0, {DType::f32, Device::cuda(0)});
  const Tensor b = full({1 << 24}, 3.0, {DType::f32, Device::cuda(0)});
  backend_for(Device::cuda(0)).synchronize();
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  {
    cuda::StatsBuffer ring(0, 2);
    ring.launch(a.kernel_view(), true, 0, cudaStreamPerThread);
    ring.launch(b.kernel_view(), true, 1, other);
    EXPECT_EQ(ring.wait(0).sum, static_cast<double>(1 << 24));
    EXPECT_EQ(ring.wait(0).histogram[64], static_cast<std::uint64_t>(1) << 24);  // 1.0: exponent 0
    EXPECT_EQ(ring.wait(1).sum, 3.0 * (1 << 24));
    EXPECT_EQ(ring.wait(1).histogram[65], static_cast<std::uint64_t>(1) << 24);  // 3.0: exponent 1
  }
  cudaStreamDestroy(other);
#endif
}

// ---- measurements for bench/gpu_bench.sh (disabled: not tests) ----

#if defined(AMPSCOPE_WITH_CUDA)
// Median of `reps` timings of fn() in milliseconds, with CUDA events on `stream`.
template <class Fn>
double median_ms(cudaStream_t stream, int reps, Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; ++r) {
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (r >= 2) ms.push_back(t);  // two warm-up runs
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#endif

TEST(gpu_timing, DISABLED_statistics_kernel_against_a_device_copy) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  Backend& be = backend_for(Device::cuda(0));
  std::printf("| dtype | elements | MiB | copy GB/s | stats GB/s | stats+hist GB/s | stats/copy |\n|---|---|---|---|---|---|---|\n");
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const std::int64_t n : {std::int64_t{1} << 16, std::int64_t{1} << 22, std::int64_t{1} << 26}) {
      Generator gen(1);
      const Tensor t = randn({n}, gen, {dtype}).to(Device::cuda(0));
      const Tensor dst = zeros({n}, {dtype, Device::cuda(0)});
      be.synchronize();
      const std::size_t bytes = static_cast<std::size_t>(n) * dtype_size(dtype);
      const cudaStream_t s = cudaStreamPerThread;
      cuda::StatsBuffer ring(0, 1);
      // A copy reads and writes `bytes`; the statistics read them once: GB/s counts bytes moved.
      const double copy_ms = median_ms(s, 20, [&] { cudaMemcpyAsync(dst.data(), t.data(), bytes, cudaMemcpyDeviceToDevice, s); });
      const double stats_ms = median_ms(s, 20, [&] { ring.launch(t.kernel_view(), false, 0, s); });
      const double hist_ms = median_ms(s, 20, [&] { ring.launch(t.kernel_view(), true, 0, s); });
      const double copy_gbs = 2.0 * bytes / copy_ms / 1e6, stats_gbs = bytes / stats_ms / 1e6,
                   hist_gbs = bytes / hist_ms / 1e6;
      std::printf("| %s | %lld | %.1f | %.0f | %.0f | %.0f | %.2f |\n", std::string(dtype_name(dtype)).c_str(),
                  static_cast<long long>(n), bytes / 1048576.0, copy_gbs, stats_gbs, hist_gbs, stats_gbs / copy_gbs);
    }
  }
#endif
}

TEST(gpu_timing, DISABLED_matrix_products_f16_and_bf16) {
  SKIP_WITHOUT_GPU();
#if defined(AMPSCOPE_WITH_CUDA)
  Backend& be = backend_for(Device::cuda(0));
  // The shapes of the sample models' products (bench/pytorch_bench.py times torch.matmul on the same).
  struct Shape3 { std::int64_t m, k, n; const char* what; };
  const Shape3 shapes[] = {{64, 64, 256, "mlp fc1"},           {64, 256, 256, "mlp fc2"},
                           {32, 9216, 128, "cnn fc1"},         {512, 128, 384, "transformer qkv"},
                           {512, 128, 512, "transformer mlp"}, {4096, 4096, 4096, "large square"}};
  std::printf("| shape (M x K x N) | what | dtype | ms | TFLOP/s |\n|---|---|---|---|---|\n");
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const Shape3& s : shapes) {
      Generator gen(2);
      const Tensor a = randn({s.m, s.k}, gen, {dtype}).to(Device::cuda(0));
      const Tensor b = randn({s.k, s.n}, gen, {dtype}).to(Device::cuda(0));
      be.synchronize();
      // Wall time around a synchronised call: the backend's stream is not exported, so no event on it.
      std::vector<double> ms;
      for (int r = 0; r < 22; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const Tensor c = matmul(a, b);
        be.synchronize();
        const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r >= 2) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      std::printf("| %lld x %lld x %lld | %s | %s | %.4f | %.2f |\n", static_cast<long long>(s.m),
                  static_cast<long long>(s.k), static_cast<long long>(s.n), s.what,
                  std::string(dtype_name(dtype)).c_str(), med, 2.0 * s.m * s.k * s.n / med / 1e9);
    }
  }
#endif
}

}  // namespace
}  // namespace ampscope
