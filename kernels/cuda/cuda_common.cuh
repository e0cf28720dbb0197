// kernels/cuda/cuda_common.cuh: the launch helpers and warp reductions shared by the CUDA kernel files
// (included by .cu files only). Two shapes of work: one thread per element (linear_kernel, a grid-stride
// loop) and one warp per row (warp_rows_kernel). WarpRow is the warp's team for the row functions of
// kernels/row_functors.h: its sum (warp_lane_sum) performs lane_tree_sum's additions in lane_tree_sum's
// order (kernels/functors.h) and its max combines the lanes' candidates to SerialRow::max's answer, so
// the GPU's row results are the CPU's bits wherever no math-library function is involved.
//
//   return launch_linear(out.numel, MyBody{out, in}, stream);          // body(i) for every i
//   return launch_warp_rows(rows, MyRowBody{...}, stream);             // body(r, lane) for every row
//   softmax_row<false>(WarpRow{lane}, x, y, n);                        // inside a row body
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>
#include "kernels/cuda/grid.h"
#include "kernels/functors.h"
#include "kernels/row_functors.h"

namespace ampscope::cuda {

inline constexpr unsigned kFullMask = 0xFFFFFFFFu;

static_assert(kWarp == kReduceLanes, "warp_lane_sum must use lane_tree_sum's number of lanes");

// ---- kernels -------------------------------------------------------------------------------------

// body(i) for every linear index i < n.
template <class Body>
__global__ void linear_kernel(std::int64_t n, Body body) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) body(i);
}

// body(r, lane) for every row r < rows, one warp per row. The loop bound is the same for every lane of
// a warp, so whole warps enter the body together and may use shuffles.
template <class Body>
__global__ void warp_rows_kernel(std::int64_t rows, Body body) {
  const std::int64_t warps_per_block = blockDim.x / kWarp;
  const std::int64_t total_warps = warps_per_block * gridDim.x;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (std::int64_t r = blockIdx.x * warps_per_block + threadIdx.x / kWarp; r < rows; r += total_warps) body(r, lane);
}

// The sum of load(0) ... load(n - 1) in lane_tree_sum's order: lane k adds elements k, k + 32, ... in
// turn, starting from +0, then the partial sums are folded in halves (lane k += lane k + 16, 8, 4, 2, 1).
// Every lane of the warp must call it; every lane gets the result.
template <class Acc, class Load>
__device__ Acc warp_lane_sum(int lane, std::int64_t n, const Load& load) {
  Acc s = strided_partial_sum<Acc>(lane, kWarp, n, load);
  for (int width = kWarp / 2; width > 0; width /= 2) s += __shfl_down_sync(kFullMask, s, width);
  return __shfl_sync(kFullMask, s, 0);
}

// One warp sharing a row (kernels/row_functors.h says what a team is). Every lane of the warp must call
// each member, as warp_rows_kernel guarantees.
struct WarpRow {
  int lane;

  template <class Acc, class Load>
  __device__ Acc sum(std::int64_t n, const Load& load) const {
    return warp_lane_sum<Acc>(lane, n, load);
  }
  // Each lane's candidate over its elements, then a shuffle tree of replaces_max: any order of
  // combinations gives the first NaN, else the first of the largest values (SerialRow::max's answer).
  template <class Acc, class Load>
  __device__ Acc max(std::int64_t n, const Load& load) const {
    MaxCandidate<Acc> c = strided_max_candidate<Acc>(lane, kWarp, n, load);
    for (int width = kWarp / 2; width > 0; width /= 2) {
      const MaxCandidate<Acc> other{__shfl_down_sync(kFullMask, c.value, width),
                                    __shfl_down_sync(kFullMask, c.index, width)};
      if (replaces_max(other, c)) c = other;
    }
    return __shfl_sync(kFullMask, c.value, 0);
  }
  template <class F>
  __device__ void for_each(std::int64_t n, const F& f) const {
    for (std::int64_t j = lane; j < n; j += kWarp) f(j);
  }
  __device__ bool leader() const { return lane == 0; }
};

// ---- launchers -----------------------------------------------------------------------------------

template <class Body>
cudaError_t launch_linear(std::int64_t n, const Body& body, cudaStream_t stream) {
  const std::int64_t blocks = linear_blocks(n);
  if (blocks == 0) return cudaSuccess;
  linear_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, body);
  return cudaGetLastError();
}

template <class Body>
cudaError_t launch_warp_rows(std::int64_t rows, const Body& body, cudaStream_t stream) {
  const std::int64_t blocks = row_blocks(rows);
  if (blocks == 0) return cudaSuccess;
  warp_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(rows, body);
  return cudaGetLastError();
}

template <class T>
constexpr bool is_float_like() {
  return std::is_floating_point_v<T> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
}

}  // namespace ampscope::cuda
