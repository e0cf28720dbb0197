// The tanh-approximated GELU and its derivative over contiguous float arrays (the CPU backend's f32 path):
// GeluFn / GeluBackwardFn of kernels/functors.h with mode 1, element by element, in loops the compiler
// vectorises (AVX-512 where the CPU has AVX-512 F, DQ and VL, else AVX2 where it has that, else the
// baseline's SSE2). The values are those of the functors called one element at a time on every path: the
// same operations on each element, without contraction (tests/kernels/tanh_f32_test.cpp runs each path the
// CPU has).
#pragma once

#include <cstdint>

namespace ampscope::cpu {

// out[i] = GeluFn{tanh}(x[i]), on the widest path the CPU has.
void gelu_tanh_f32(const float* x, float* out, std::int64_t n);
// out[i] = GeluBackwardFn{tanh}(g[i], x[i]), on the widest path the CPU has.
void gelu_tanh_backward_f32(const float* g, const float* x, float* out, std::int64_t n);

// The same forward, also storing t[i] = the element's tanh (the inner tanh of GeluFn's tanh form); and the
// backward from that stored tanh instead of computing it again: the bits of the two functions above.
void gelu_tanh_save_f32(const float* x, float* out, float* t, std::int64_t n);
void gelu_tanh_backward_saved_f32(const float* g, const float* x, const float* t, float* out, std::int64_t n);

// One path by name, for the tests: each must give the bits the others give.
enum class GeluPath { baseline, avx2, avx512 };
// Whether this CPU (and build) can run `path`.
bool gelu_path_available(GeluPath path);
// The two loops on `path`; the caller checks gelu_path_available first.
void gelu_tanh_f32_on(GeluPath path, const float* x, float* out, std::int64_t n);
void gelu_tanh_backward_f32_on(GeluPath path, const float* g, const float* x, float* out, std::int64_t n);
void gelu_tanh_save_f32_on(GeluPath path, const float* x, float* out, float* t, std::int64_t n);
void gelu_tanh_backward_saved_f32_on(GeluPath path, const float* g, const float* x, const float* t, float* out,
                                     std::int64_t n);

}  // namespace ampscope::cpu
