// The CPU GEMM that the FP8 and the block-scaled Linears share (core/fp8_linear.cpp, core/block_linear.cpp):
// their operands are already decoded to float, so one loop serves both. Internal: not a public header
// (cmake/headers.cmake, AMPSCOPE_INTERNAL_HEADERS).
#pragma once

#include <cstdint>

namespace ampscope {

// C = (A B) * alpha (+ bias), A [I, P] and B [P, J] row-major floats, C [I, J] row-major, bias J floats or
// nullptr. Each C[i][j] is sum_p A[i][p] * B[p][j] added in f32 with p ascending, from 0, then times alpha, then
// plus bias[j]: the order docs/fp8.md defines, whatever the blocking or the thread count (the rows are split
// over the CPU backend's pool, each element computed whole by one thread).
void decoded_gemm(const float* A, const float* B, float* C, std::int64_t I, std::int64_t P, std::int64_t J, float alpha,
                  const float* bias);

}  // namespace ampscope
