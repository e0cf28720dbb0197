// The launch geometry of the CUDA kernels (kernels/cuda/grid.h), checked without a GPU: block counts at
// n = 0, 1, the block edges, 2^31 and 2^40, and the grid-stride loop of linear_kernel replayed on the host
// for capped grids: every index visited exactly once, in 64-bit arithmetic.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/grid.h"

namespace ampscope::cuda {
namespace {

TEST(grid_test, block_counts_at_the_edges) {
  EXPECT_EQ(linear_blocks(0), 0);
  EXPECT_EQ(linear_blocks(-1), 0);
  EXPECT_EQ(linear_blocks(1), 1);
  EXPECT_EQ(linear_blocks(kThreads), 1);
  EXPECT_EQ(linear_blocks(kThreads + 1), 2);
  EXPECT_EQ(linear_blocks(kThreads * kMaxBlocks), kMaxBlocks);
  EXPECT_EQ(linear_blocks(std::int64_t{1} << 31), kMaxBlocks);
  EXPECT_EQ(linear_blocks(std::int64_t{1} << 40), kMaxBlocks);
  EXPECT_EQ(linear_blocks(INT64_MAX), kMaxBlocks);  // (n - 1) / threads + 1: no overflow at the top
  EXPECT_EQ(row_blocks(0), 0);
  EXPECT_EQ(row_blocks(1), 1);
  EXPECT_EQ(row_blocks(kRowsPerBlock), 1);
  EXPECT_EQ(row_blocks(kRowsPerBlock + 1), 2);
  EXPECT_EQ(row_blocks(std::int64_t{1} << 31), kMaxBlocks);
  EXPECT_EQ(row_blocks(std::int64_t{1} << 40), kMaxBlocks);
  EXPECT_EQ(row_blocks(INT64_MAX), kMaxBlocks);
}

// linear_kernel's loop, thread by thread, as the GPU runs it (blockIdx, blockDim, gridDim).
std::vector<int> visits(std::int64_t n) {
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  const std::int64_t blocks = linear_blocks(n);
  const std::int64_t stride = static_cast<std::int64_t>(kThreads) * blocks;
  for (std::int64_t b = 0; b < blocks; ++b)
    for (std::int64_t t = 0; t < kThreads; ++t)
      for (std::int64_t i = b * kThreads + t; i < n; i += stride) ++seen[static_cast<std::size_t>(i)];
  return seen;
}

TEST(grid_test, the_grid_stride_loop_visits_every_index_once) {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{255}, std::int64_t{256}, std::int64_t{257},
                         std::int64_t{kThreads} * kMaxBlocks - 1, std::int64_t{kThreads} * kMaxBlocks + 1,
                         std::int64_t{kThreads} * kMaxBlocks * 3 + 17}) {
    const std::vector<int> seen = visits(n);
    std::int64_t wrong = 0;
    for (int v : seen) wrong += v != 1;
    EXPECT_EQ(wrong, 0) << "n = " << n;
  }
}

// At 2^40 elements the stride and the last index a thread reaches stay far inside int64 (a 32-bit loop
// variable would wrap at 2^31): the largest i a thread computes before leaving is below n + stride.
TEST(grid_test, indices_of_a_2_to_the_40_launch_fit_in_64_bits) {
  const std::int64_t n = std::int64_t{1} << 40;
  const std::int64_t stride = static_cast<std::int64_t>(kThreads) * linear_blocks(n);
  EXPECT_EQ(stride, std::int64_t{kThreads} * kMaxBlocks);
  const std::int64_t last_thread = stride - 1;
  const std::int64_t iterations = (n - last_thread + stride - 1) / stride;
  EXPECT_LT(last_thread + iterations * stride, n + stride);
  EXPECT_GT(iterations * stride, std::int64_t{1} << 31);
}

}  // namespace
}  // namespace ampscope::cuda
