// The CPU GEMM the FP8 and block-scaled Linears share (core/cpu_gemm.h).
#include "core/cpu_gemm.h"

#include <algorithm>

#include "core/backend.h"

namespace ampscope {
namespace {

// The GEMM's blocking: the bf16/f32 path's row blocks (kMaxRowBlocks, below in decoded_gemm), and within a row
// kVecCols columns whose sums stay in registers while p runs over the whole inner dimension (32 floats: eight
// SSE registers), so a sum is never stored and reloaded between two of its terms.
constexpr std::int64_t kMaxRowBlocks = 8;
constexpr std::int64_t kVecCols = 32;

// Rows [r0, r1) of C (decoded_gemm's order: a product of two decoded FP8 values has at most 8 significant bits
// and is exact in float; docs/fp8.md). The column blocks change which elements are summed side by side, never the order of one element's terms.
void gemm_rows(const float* A, const float* B, float* C, std::int64_t r0, std::int64_t r1, std::int64_t P,
               std::int64_t J, float alpha, const float* bias) {
  for (std::int64_t i = r0; i < r1; ++i) {
    const float* arow = A + i * P;
    float* crow = C + i * J;
    std::int64_t j0 = 0;
    for (; j0 + kVecCols <= J; j0 += kVecCols) {
      float acc[kVecCols] = {};
      for (std::int64_t p = 0; p < P; ++p) {
        const float av = arow[p];
        const float* brow = B + p * J + j0;
        for (std::int64_t j = 0; j < kVecCols; ++j) acc[j] += av * brow[j];
      }
      for (std::int64_t j = 0; j < kVecCols; ++j) crow[j0 + j] = acc[j] * alpha;
    }
    if (j0 < J) {  // the last columns, fewer than kVecCols
      const std::int64_t nc = J - j0;
      float acc[kVecCols] = {};
      for (std::int64_t p = 0; p < P; ++p) {
        const float av = arow[p];
        const float* brow = B + p * J + j0;
        for (std::int64_t j = 0; j < nc; ++j) acc[j] += av * brow[j];
      }
      for (std::int64_t j = 0; j < nc; ++j) crow[j0 + j] = acc[j] * alpha;
    }
    if (bias != nullptr) {
      for (std::int64_t j = 0; j < J; ++j) crow[j] += bias[j];
    }
  }
}

}  // namespace

void decoded_gemm(const float* A, const float* B, float* C, std::int64_t I, std::int64_t P, std::int64_t J, float alpha,
                  const float* bias) {
  // Threads as the bf16/f32 GEMM splits a product (kernels/cpu/nn_kernels.cpp, rows_per_task and
  // for_row_blocks): at most kMaxRowBlocks blocks of rows, each about 2^20 multiply-adds or more, cut by I and
  // that grain only, run on the CPU backend's pool. Each output element is computed whole by one thread, so the
  // result does not depend on the thread count.
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(J * P, 1));
  const std::int64_t blocks = std::clamp<std::int64_t>(I / grain, 1, kMaxRowBlocks);
  backend_for(Device::cpu()).parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      gemm_rows(A, B, C, I * blk / blocks, I * (blk + 1) / blocks, P, J, alpha, bias);
    }
  });
}

}  // namespace ampscope
