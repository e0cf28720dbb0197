// kernels/cuda/grid.h: how many blocks a launch gets (plain C++, so the host tests check it without a
// GPU). Grid-stride loops cover whatever a capped grid does not: for element i the loop visits
// i, i + stride, ... with stride = threads * blocks computed in 64 bits, so n up to 2^62 is covered once.
//
//   const std::int64_t blocks = linear_blocks(n);   // 0 for n <= 0: no launch
#pragma once

#include <algorithm>
#include <cstdint>

namespace ampscope::cuda {

inline constexpr int kThreads = 256;
inline constexpr int kWarp = 32;
// Enough blocks to fill any current GPU several times over; grid-stride loops cover the rest.
inline constexpr std::int64_t kMaxBlocks = 4096;
inline constexpr int kRowsPerBlock = kThreads / kWarp;

// Blocks for one thread per element of n (linear_kernel); 0 when there is nothing to do.
constexpr std::int64_t linear_blocks(std::int64_t n) {
  if (n <= 0) return 0;
  return std::min<std::int64_t>((n - 1) / kThreads + 1, kMaxBlocks);
}

// Blocks for one warp per row (warp_rows_kernel); 0 when there are no rows.
constexpr std::int64_t row_blocks(std::int64_t rows) {
  if (rows <= 0) return 0;
  return std::min<std::int64_t>((rows - 1) / kRowsPerBlock + 1, kMaxBlocks);
}

}  // namespace ampscope::cuda
