// The statistics kernel (kernels/cuda/stats_cuda.h): one pass, two launches. Pass one: kStatsBlocks
// blocks (fewer for small tensors) read the tensor with 16-byte loads where it is contiguous and
// aligned, classify each value from its bits as probes/stats.cpp does, and fold their threads in a
// fixed tree into one partial per block. Pass two: one block folds the partials in block order. No
// floating atomics, so sum and sum_sq have the same bits on every run.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <math_constants.h>

#include "core/convert.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/stats_launch.h"

namespace ampscope::cuda {
namespace {

constexpr int kHistMinExponent = -64, kHistMaxExponent = 63;
constexpr int kSubnormalBin = kHistMaxExponent - kHistMinExponent + 1, kZeroBin = kSubnormalBin + 1,
              kInfBin = kSubnormalBin + 2, kNanBin = kSubnormalBin + 3;
static_assert(kNanBin + 1 == kStatsHistBins, "bins as trace::HistogramRow::bins");

// probes/stats.cpp's Bits: the magnitude bits order values by magnitude; the exponent field gives the bin.
template <class T> struct StatBits;
template <> struct StatBits<float> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFFFFFu, kInf = 0x7F800000u, kMinNormal = 0x00800000u, kSign = 0x80000000u;
  static constexpr int kShift = 23, kBias = 127;
  __device__ static U raw(float x) { return __float_as_uint(x); }
};
template <> struct StatBits<double> {
  using U = std::uint64_t;
  static constexpr U kAbs = 0x7FFFFFFFFFFFFFFFull, kInf = 0x7FF0000000000000ull, kMinNormal = 0x0010000000000000ull,
                     kSign = 0x8000000000000000ull;
  static constexpr int kShift = 52, kBias = 1023;
  __device__ static U raw(double x) { return static_cast<U>(__double_as_longlong(x)); }
};
template <> struct StatBits<f16> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFu, kInf = 0x7C00u, kMinNormal = 0x0400u, kSign = 0x8000u;
  static constexpr int kShift = 10, kBias = 15;
  __device__ static U raw(f16 x) { return x.bits; }
};
template <> struct StatBits<bf16> {
  using U = std::uint32_t;
  static constexpr U kAbs = 0x7FFFu, kInf = 0x7F80u, kMinNormal = 0x0080u, kSign = 0x8000u;
  static constexpr int kShift = 7, kBias = 127;
  __device__ static U raw(bf16 x) { return x.bits; }
};

// Trivially constructible, so that it can live in shared memory; empty_acc() is the starting value.
struct Acc {
  std::uint64_t nan, pos_inf, neg_inf, zero, subnormal;
  double min, max, absmax, sum, sum_sq;
};

__device__ Acc empty_acc() { return Acc{0, 0, 0, 0, 0, CUDART_INF, -CUDART_INF, 0.0, 0.0, 0.0}; }

// b folded into a: the same comparisons as the CPU's merge.
__device__ void fold(Acc& a, const Acc& b) {
  a.nan += b.nan;
  a.pos_inf += b.pos_inf;
  a.neg_inf += b.neg_inf;
  a.zero += b.zero;
  a.subnormal += b.subnormal;
  a.min = b.min < a.min ? b.min : a.min;
  a.max = b.max > a.max ? b.max : a.max;
  a.absmax = b.absmax > a.absmax ? b.absmax : a.absmax;
  a.sum += b.sum;
  a.sum_sq += b.sum_sq;
}

template <class T, bool kHist>
__device__ void accumulate(T x, Acc& a, unsigned* hist) {
  using B = StatBits<T>;
  const typename B::U r = B::raw(x);
  const typename B::U m = r & B::kAbs;
  if (m >= B::kInf) {
    if (m > B::kInf) {
      ++a.nan;
      if constexpr (kHist) atomicAdd(&hist[kNanBin], 1u);
    } else {
      ++((r & B::kSign) != 0 ? a.neg_inf : a.pos_inf);
      if constexpr (kHist) atomicAdd(&hist[kInfBin], 1u);
    }
    return;
  }
  const double v = static_cast<double>(convert<acc_type<T>>(x));
  a.sum += v;
  a.sum_sq += v * v;  // exact for f16, bf16 and f32 (at most 48 bits); an f64 square rounds once, as on the CPU
  a.min = v < a.min ? v : a.min;
  a.max = v > a.max ? v : a.max;
  const double av = fabs(v);
  a.absmax = av > a.absmax ? av : a.absmax;
  a.zero += m == 0;
  a.subnormal += (m - 1) < (B::kMinNormal - 1);  // m in [1, min normal)
  if constexpr (kHist) {
    int bin = kZeroBin;
    if (m != 0) {
      if (m < B::kMinNormal) {
        bin = kSubnormalBin;
      } else {
        const int e = static_cast<int>(m >> B::kShift) - B::kBias;
        bin = e < kHistMinExponent ? kSubnormalBin : min(e, kHistMaxExponent) - kHistMinExponent;
      }
    }
    atomicAdd(&hist[bin], 1u);
  }
}

// Block b's partial: its threads' accumulators folded in a fixed tree, the shared histogram counts.
template <class T, bool kHist>
__global__ void stats_partial_kernel(TensorView t, DeviceStats* partials) {
  __shared__ Acc acc[kThreads];
  __shared__ unsigned hist[kStatsHistBins];
  if constexpr (kHist) {
    for (int b = threadIdx.x; b < kStatsHistBins; b += blockDim.x) hist[b] = 0;
    __syncthreads();
  }
  Acc a = empty_acc();
  const std::int64_t n = t.numel;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const T* p = t.ptr<const T>();
  constexpr int kVec = 16 / sizeof(T);
  std::int64_t done = 0;
  if (t.is_contiguous()) {
    if (reinterpret_cast<std::uintptr_t>(p) % 16 == 0) {
      // 16-byte loads: one uint4 holds kVec values.
      const std::int64_t vectors = n / kVec;
      const uint4* pv = reinterpret_cast<const uint4*>(p);
      for (std::int64_t i = first; i < vectors; i += stride) {
        const uint4 raw = pv[i];
        T vals[kVec];
        memcpy(vals, &raw, sizeof raw);
#pragma unroll
        for (int k = 0; k < kVec; ++k) accumulate<T, kHist>(vals[k], a, hist);
      }
      done = vectors * kVec;
    }
    for (std::int64_t i = done + first; i < n; i += stride) accumulate<T, kHist>(p[i], a, hist);
  } else {
    for (std::int64_t i = first; i < n; i += stride) accumulate<T, kHist>(p[t.offset_of(i)], a, hist);
  }
  acc[threadIdx.x] = a;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) fold(acc[threadIdx.x], acc[threadIdx.x + s]);
    __syncthreads();
  }
  DeviceStats& out = partials[blockIdx.x];
  if (threadIdx.x == 0) {
    const Acc& r = acc[0];
    out.nan = r.nan;
    out.pos_inf = r.pos_inf;
    out.neg_inf = r.neg_inf;
    out.zero = r.zero;
    out.subnormal = r.subnormal;
    out.min = r.min;
    out.max = r.max;
    out.absmax = r.absmax;
    out.sum = r.sum;
    out.sum_sq = r.sum_sq;
  }
  if constexpr (kHist) {
    for (int b = threadIdx.x; b < kStatsHistBins; b += blockDim.x) out.histogram[b] = hist[b];
  }
}

// One block: thread k folds partials k, k + kThreads, ... in order, then the fixed tree; the histogram
// bins are summed over the blocks in order, one thread per bin.
__global__ void stats_finalize_kernel(const DeviceStats* partials, int blocks, std::int64_t numel, bool histogram,
                                      DeviceStats* result) {
  __shared__ Acc acc[kThreads];
  Acc a = empty_acc();
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    const DeviceStats& p = partials[b];
    Acc q = empty_acc();
    q.nan = p.nan;
    q.pos_inf = p.pos_inf;
    q.neg_inf = p.neg_inf;
    q.zero = p.zero;
    q.subnormal = p.subnormal;
    q.min = p.min;
    q.max = p.max;
    q.absmax = p.absmax;
    q.sum = p.sum;
    q.sum_sq = p.sum_sq;
    fold(a, q);
  }
  acc[threadIdx.x] = a;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) fold(acc[threadIdx.x], acc[threadIdx.x + s]);
    __syncthreads();
  }
  for (int bin = threadIdx.x; bin < kStatsHistBins; bin += blockDim.x) {
    std::uint64_t c = 0;
    if (histogram) {
      for (int b = 0; b < blocks; ++b) c += partials[b].histogram[bin];
    }
    result->histogram[bin] = c;
  }
  if (threadIdx.x == 0) {
    const Acc& r = acc[0];
    result->numel = static_cast<std::uint64_t>(numel);
    result->nan = r.nan;
    result->pos_inf = r.pos_inf;
    result->neg_inf = r.neg_inf;
    result->zero = r.zero;
    result->subnormal = r.subnormal;
    const bool any_finite = static_cast<std::uint64_t>(numel) > r.nan + r.pos_inf + r.neg_inf;
    // probes/stats.cpp: min, max and absmax are NaN when no value is finite.
    result->min = any_finite ? r.min : CUDART_NAN;
    result->max = any_finite ? r.max : CUDART_NAN;
    result->absmax = any_finite ? r.absmax : CUDART_NAN;
    result->sum = r.sum;
    result->sum_sq = r.sum_sq;
  }
}

template <class T>
cudaError_t launch_typed(const TensorView& t, bool histogram, DeviceStats* partials, DeviceStats* result,
                         cudaStream_t stream) {
  // Four 16-byte loads per thread before a block is worth starting; at most kStatsBlocks.
  const std::int64_t per_block = static_cast<std::int64_t>(kThreads) * 4 * (16 / sizeof(T));
  const int blocks = static_cast<int>(std::min<std::int64_t>((t.numel + per_block - 1) / per_block, kStatsBlocks));
  if (blocks > 0) {
    if (histogram) {
      stats_partial_kernel<T, true><<<blocks, kThreads, 0, stream>>>(t, partials);
    } else {
      stats_partial_kernel<T, false><<<blocks, kThreads, 0, stream>>>(t, partials);
    }
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  stats_finalize_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, t.numel, histogram, result);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_tensor_stats(const TensorView& t, bool histogram, void* partials, DeviceStats* result,
                                cudaStream_t stream) {
  auto* p = static_cast<DeviceStats*>(partials);
  switch (t.dtype) {
    case DType::f32: return launch_typed<float>(t, histogram, p, result, stream);
    case DType::f64: return launch_typed<double>(t, histogram, p, result, stream);
    case DType::f16: return launch_typed<f16>(t, histogram, p, result, stream);
    case DType::bf16: return launch_typed<bf16>(t, histogram, p, result, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ampscope::cuda
