// Host side of the statistics kernel (kernels/cuda/stats_cuda.h): the ring of result slots, the
// asynchronous copies to pinned memory, and the waited-for convenience call.
#include "kernels/cuda/stats_cuda.h"

#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stats_launch.h"

namespace ampscope::cuda {

double DeviceStats::mean() const {
  const std::uint64_t n = finite();
  return n == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(n);
}

double DeviceStats::rms() const {
  const std::uint64_t n = finite();
  return n == 0 ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(sum_sq / static_cast<double>(n));
}

namespace {
void check_slot(int slot, int slots) {
  if (slot < 0 || slot >= slots) {
    throw IndexError(fmt::format("StatsBuffer: slot {} is out of range (the ring has {} slots)", slot, slots));
  }
}
}  // namespace

StatsBuffer::StatsBuffer(int device, int slots) : device_(device), slots_(slots) {
  if (slots <= 0) throw Error(fmt::format("StatsBuffer: needs at least one slot, got {}", slots));
  AMPSCOPE_CUDA_CHECK(cudaSetDevice(device_));
  try {
    // One partials region for the whole ring: launches on one stream run one after the other, so a
    // slot's two kernels finish with it before the next slot's first kernel starts (launch() orders a
    // launch on another stream after the previous one).
    AMPSCOPE_CUDA_CHECK(cudaMalloc(&partials_, kStatsPartialBytes));
    AMPSCOPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_results_), sizeof(DeviceStats) * slots_));
    AMPSCOPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_results_), sizeof(DeviceStats) * slots_));
    events_.resize(static_cast<std::size_t>(slots_), nullptr);
    for (cudaEvent_t& e : events_) AMPSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    release();
    throw;
  }
}

StatsBuffer::~StatsBuffer() { release(); }

void StatsBuffer::release() noexcept {
  if (partials_ == nullptr && device_results_ == nullptr && host_results_ == nullptr && events_.empty()) return;
  cudaSetDevice(device_);
  // A queued copy may still be writing into host_results_ (and its kernels reading partials_): wait
  // for every slot before the memory goes back.
  for (cudaEvent_t e : events_) {
    if (e != nullptr) {
      cudaEventSynchronize(e);
      cudaEventDestroy(e);
    }
  }
  events_.clear();
  if (host_results_ != nullptr) cudaFreeHost(host_results_);
  if (device_results_ != nullptr) cudaFree(device_results_);
  if (partials_ != nullptr) cudaFree(partials_);
  host_results_ = nullptr;
  device_results_ = nullptr;
  partials_ = nullptr;
}

StatsBuffer::StatsBuffer(StatsBuffer&& other) noexcept
    : device_(other.device_),
      slots_(other.slots_),
      partials_(std::exchange(other.partials_, nullptr)),
      device_results_(std::exchange(other.device_results_, nullptr)),
      host_results_(std::exchange(other.host_results_, nullptr)),
      events_(std::move(other.events_)),
      last_stream_(other.last_stream_),
      last_slot_(other.last_slot_) {
  other.events_.clear();
  other.slots_ = 0;
  other.last_slot_ = -1;
}

void StatsBuffer::launch(const TensorView& t, bool histogram, int slot, cudaStream_t stream) {
  check_slot(slot, slots_);
  if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::f16 && t.dtype != DType::bf16) {
    throw DTypeError(fmt::format("StatsBuffer: the statistics kernel takes f32, f64, f16 or bf16, got {}\nhint: "
                                 "integer and bool tensors go through probe::tensor_stats on the host",
                                 dtype_name(t.dtype)));
  }
  AMPSCOPE_CUDA_CHECK(cudaSetDevice(device_));
  // The shared partials: the previous launch's kernels (recorded with its slot's event, after its copy)
  // must be done with them before this launch's kernels start. On one stream that is the stream's order.
  if (last_slot_ >= 0 && stream != last_stream_) {
    AMPSCOPE_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[static_cast<std::size_t>(last_slot_)], 0));
  }
  const cudaError_t status = launch_tensor_stats(t, histogram, partials_, device_results_ + slot, stream);
  if (status != cudaSuccess) check(status, "launch of kernel 'tensor_stats'");
  AMPSCOPE_CUDA_CHECK(cudaMemcpyAsync(host_results_ + slot, device_results_ + slot, sizeof(DeviceStats),
                                      cudaMemcpyDeviceToHost, stream));
  AMPSCOPE_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(slot)], stream));
  last_stream_ = stream;
  last_slot_ = slot;
}

bool StatsBuffer::ready(int slot) const {
  check_slot(slot, slots_);
  const cudaError_t status = cudaEventQuery(events_[static_cast<std::size_t>(slot)]);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  AMPSCOPE_CUDA_CHECK(status);
  return true;
}

cudaEvent_t StatsBuffer::event(int slot) const {
  check_slot(slot, slots_);
  return events_[static_cast<std::size_t>(slot)];
}

const DeviceStats& StatsBuffer::wait(int slot) {
  check_slot(slot, slots_);
  AMPSCOPE_CUDA_CHECK(cudaEventSynchronize(events_[static_cast<std::size_t>(slot)]));
  return host_results_[slot];
}

DeviceStats cuda_tensor_stats(Backend& backend, const TensorView& t, bool histogram) {
  if (!backend.device().is_cuda()) {
    throw DeviceError(fmt::format("cuda_tensor_stats: backend '{}' is not a CUDA backend", backend.name()));
  }
  // Through the backend's own ring: on its stream, so ordered after its queued work without a separate sync.
  const std::unique_ptr<StatsQueue> queue = backend.make_stats_queue(1);
  const int slot = queue->launch(t, histogram);
  const DeviceStatsResult r = queue->read(slot);
  DeviceStats d;
  d.numel = r.numel;
  d.nan = r.nan;
  d.pos_inf = r.pos_inf;
  d.neg_inf = r.neg_inf;
  d.zero = r.zero;
  d.subnormal = r.subnormal;
  d.min = r.min;
  d.max = r.max;
  d.absmax = r.absmax;
  d.sum = r.sum;
  d.sum_sq = r.sum_sq;
  for (int b = 0; b < kStatsHistBins; ++b) d.histogram[b] = r.histogram[static_cast<std::size_t>(b)];
  return d;
}

}  // namespace ampscope::cuda
