// kernels/cuda/stats_cuda.h: the probe's statistics on the GPU (issue 10): one pass over a tensor gives
// every `health` statistic of probes/stats.h (counts of NaN, +inf, -inf, zero and subnormal values;
// min, max, absmax, and the sums for mean and rms of the finite values, in double) and the exponent
// histogram of probes/trace/schema.h, into a device buffer that is copied to pinned host memory
// asynchronously. A StatsBuffer is a ring of slots, so a probe can queue many tensors and read them
// later without a host sync per op. Host code; only built with AMPSCOPE_WITH_CUDA.
//
//   cuda::StatsBuffer ring(/*device=*/0, /*slots=*/64);
//   ring.launch(y.kernel_view(), /*histogram=*/true, slot, stream);   // returns at once
//   ...
//   const cuda::DeviceStats& s = ring.wait(slot);                    // only this slot's copy is awaited
//
// Sums: each value is exact in double and so is its square for f16, bf16 and f32 (at most 2 x 24
// significant bits; an f64 square rounds once, as on the CPU), so only the additions round; they run in a fixed tree order (per thread, per block, then over the blocks in
// order), the same on every run and every GPU, but not the CPU's order (probes/stats.cpp: chunks per
// thread, 4-lane vectors), so sum and sum_sq may differ from the CPU's in the last bits: at most
// about n * 2^-53 * sum|v| (sum_sq: relative n * 2^-53). Counts, min, max, absmax and the histogram
// are exact (min/max of {-0, +0} may pick the other zero, which compares equal).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/backend.h"
#include "core/tensor_view.h"

namespace ampscope::cuda {

// trace::kHistBins: exponents -64..63, then subnormal, zero, inf, NaN (checked in the test, since
// kernels may not include probes/).
inline constexpr int kStatsHistBins = 132;

// What the kernel writes (device) and what the host reads back (pinned), plain data.
struct DeviceStats {
  std::uint64_t numel = 0, nan = 0, pos_inf = 0, neg_inf = 0, zero = 0, subnormal = 0;
  double min = 0, max = 0, absmax = 0, sum = 0, sum_sq = 0;  // over the finite values
  std::uint64_t histogram[kStatsHistBins] = {};

  std::uint64_t finite() const { return numel - nan - pos_inf - neg_inf; }
  double mean() const;  // sum / finite, NaN when nothing is finite (as probes/stats.cpp)
  double rms() const;   // sqrt(sum_sq / finite)
};

// A ring of `slots` result slots on CUDA device `device`: device memory for each slot's block partials
// and result, pinned host memory for the copies, one event per slot. Movable, not copyable; the
// destructor never throws.
class StatsBuffer {
 public:
  StatsBuffer(int device, int slots);
  ~StatsBuffer();
  StatsBuffer(StatsBuffer&& other) noexcept;
  StatsBuffer& operator=(StatsBuffer&&) = delete;
  StatsBuffer(const StatsBuffer&) = delete;
  StatsBuffer& operator=(const StatsBuffer&) = delete;

  int slots() const { return slots_; }
  // Queues the statistics of `t` (f32, f64, f16 or bf16; any strides) into `slot` on `stream`, then the
  // copy of the result to the slot's pinned host memory; returns without waiting. Throws DTypeError for
  // other dtypes, DeviceRuntimeError on a CUDA failure. The slots share one scratch region, so a launch
  // on another stream than the previous launch first waits (on the device) for that launch.
  void launch(const TensorView& t, bool histogram, int slot, cudaStream_t stream);
  // Whether the slot's copy has landed (no wait).
  bool ready(int slot) const;
  // The event recorded after the slot's copy (valid while the buffer lives).
  cudaEvent_t event(int slot) const;
  // Waits for the slot's copy only, then returns the pinned result (valid until the slot is reused).
  const DeviceStats& wait(int slot);

 private:
  void release() noexcept;  // waits for queued copies, then frees everything (destructor, failed constructor)

  int device_ = 0;
  int slots_ = 0;
  void* partials_ = nullptr;          // slots x kStatsBlocks partial results
  DeviceStats* device_results_ = nullptr;
  DeviceStats* host_results_ = nullptr;  // pinned
  std::vector<cudaEvent_t> events_;
  cudaStream_t last_stream_ = nullptr;  // the stream and slot of the latest launch (-1: none yet)
  int last_slot_ = -1;
};

// The statistics of `t` on `backend`'s device, waited for: queued on the backend's stream behind its work
// (one wait, counted in backend.host_syncs()).
// For tests and benchmarks; a probe uses a StatsBuffer.
DeviceStats cuda_tensor_stats(Backend& backend, const TensorView& t, bool histogram);

}  // namespace ampscope::cuda
