// The tanh-approximated GELU and its derivative over contiguous float arrays (the CPU backend's f32 path):
// GeluFn / GeluBackwardFn of kernels/functors.h with mode 1, element by element, in loops the compiler
// vectorises (AVX2 where the CPU has it, else the baseline's SSE2). The values are those of the functors
// called one element at a time: the same operations on each element, without contraction.
#pragma once

#include <cstdint>

namespace ampscope::cpu {

// out[i] = GeluFn{tanh}(x[i]).
void gelu_tanh_f32(const float* x, float* out, std::int64_t n);
// out[i] = GeluBackwardFn{tanh}(g[i], x[i]).
void gelu_tanh_backward_f32(const float* g, const float* x, float* out, std::int64_t n);

}  // namespace ampscope::cpu
