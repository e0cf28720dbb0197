// kernels/cpu/gelu_kernels.h. Built with -fno-math-errno and -fno-trapping-math (kernels/CMakeLists.txt), as
// fused_optim.cpp is: without them GCC keeps the functors' NaN selects as branches and the loops scalar. Neither
// flag changes a value; -ffp-contract=off (the top-level CMakeLists.txt) keeps every multiply and add rounded
// on its own, so the AVX2 and baseline loops give the same bits as the functors called one at a time
// (tests/kernels/tanh_f32_test.cpp compares them).
#include "kernels/cpu/gelu_kernels.h"

#include "kernels/functors.h"

namespace ampscope::cpu {
namespace {

constexpr double kTanhMode = 1;

__attribute__((always_inline)) inline void forward_loop(const float* x, float* out, std::int64_t n) {
  const GeluFn fn(&kTanhMode);
  for (std::int64_t i = 0; i < n; ++i) out[i] = fn(x[i]);
}
__attribute__((always_inline)) inline void backward_loop(const float* g, const float* x, float* out, std::int64_t n) {
  const GeluBackwardFn fn(&kTanhMode);
  for (std::int64_t i = 0; i < n; ++i) out[i] = fn(g[i], x[i]);
}

// The forward pass that also stores each element's tanh, and the backward pass that reads it back instead
// of computing it again (issue 37: the tanh, in double, was most of both loops). The arithmetic is
// GeluFn's and GeluBackwardFn's (kernels/functors.h) written out with the same operations in the same
// order, so the stored tanh is the one the backward functor computes from x and every result keeps its
// bits (tests/kernels/tanh_f32_test.cpp compares them with the functors on every path).
// The functors' constants as they write them: the double literals rounded to float.
constexpr float kGeluBeta = static_cast<float>(0.79788456080286535588), kGeluKappa = static_cast<float>(0.044715);
__attribute__((always_inline)) inline void forward_save_loop(const float* x, float* out, float* t, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float x_cube = v * v * v;
    const float th = gelu_tanh(kGeluBeta * (v + kGeluKappa * x_cube));
    t[i] = th;
    out[i] = canonical_nan(0.5f * v * (1.0f + th));
  }
}
__attribute__((always_inline)) inline void backward_saved_loop(const float* g, const float* x, const float* t, float* out,
                                                               std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i], th = t[i];
    const float x_sq = v * v;
    const float left = 0.5f * v;
    const float right = 1.0f + th;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.0f - th * th;
    const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * x_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    out[i] = canonical_nan(g[i] * (left_derivative + right_derivative));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void forward_save_avx2(const float* x, float* out, float* t, std::int64_t n) {
  forward_save_loop(x, out, t, n);
}
__attribute__((target("avx2"))) void backward_saved_avx2(const float* g, const float* x, const float* t, float* out,
                                                         std::int64_t n) {
  backward_saved_loop(g, x, t, out, n);
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx2"))) void forward_save_avx512(const float* x, float* out, float* t,
                                                                                       std::int64_t n) {
  forward_save_loop(x, out, t, n);
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx2"))) void backward_saved_avx512(const float* g, const float* x,
                                                                                         const float* t, float* out,
                                                                                         std::int64_t n) {
  backward_saved_loop(g, x, t, out, n);
}
__attribute__((target("avx2"))) void forward_avx2(const float* x, float* out, std::int64_t n) { forward_loop(x, out, n); }
__attribute__((target("avx2"))) void backward_avx2(const float* g, const float* x, float* out, std::int64_t n) {
  backward_loop(g, x, out, n);
}
// The loops work in double (tanh_f32), so AVX-512's eight doubles a register against AVX2's four take
// 35-40% off their time on the development machine's EPYC (16k-element microbenchmark); DQ brings the
// conversions between 64-bit integers and doubles that tanh_f32's 2^n needs, VL their narrower forms.
__attribute__((target("avx512f,avx512dq,avx512vl,avx2"))) void forward_avx512(const float* x, float* out,
                                                                                  std::int64_t n) {
  forward_loop(x, out, n);
}
__attribute__((target("avx512f,avx512dq,avx512vl,avx2"))) void backward_avx512(const float* g, const float* x,
                                                                                   float* out, std::int64_t n) {
  backward_loop(g, x, out, n);
}
bool has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
bool has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return has;
}
#endif

GeluPath widest_path() {
#if defined(__x86_64__)
  if (has_avx512()) return GeluPath::avx512;
  if (has_avx2()) return GeluPath::avx2;
#endif
  return GeluPath::baseline;
}

}  // namespace

bool gelu_path_available(GeluPath path) {
  switch (path) {
    case GeluPath::baseline:
      return true;
#if defined(__x86_64__)
    case GeluPath::avx2:
      return has_avx2();
    case GeluPath::avx512:
      return has_avx512();
#endif
    default:
      return false;
  }
}

void gelu_tanh_f32_on(GeluPath path, const float* x, float* out, std::int64_t n) {
#if defined(__x86_64__)
  if (path == GeluPath::avx512) return forward_avx512(x, out, n);
  if (path == GeluPath::avx2) return forward_avx2(x, out, n);
#endif
  forward_loop(x, out, n);
}

void gelu_tanh_backward_f32_on(GeluPath path, const float* g, const float* x, float* out, std::int64_t n) {
#if defined(__x86_64__)
  if (path == GeluPath::avx512) return backward_avx512(g, x, out, n);
  if (path == GeluPath::avx2) return backward_avx2(g, x, out, n);
#endif
  backward_loop(g, x, out, n);
}

void gelu_tanh_save_f32_on(GeluPath path, const float* x, float* out, float* t, std::int64_t n) {
#if defined(__x86_64__)
  if (path == GeluPath::avx512) return forward_save_avx512(x, out, t, n);
  if (path == GeluPath::avx2) return forward_save_avx2(x, out, t, n);
#endif
  forward_save_loop(x, out, t, n);
}

void gelu_tanh_backward_saved_f32_on(GeluPath path, const float* g, const float* x, const float* t, float* out,
                                     std::int64_t n) {
#if defined(__x86_64__)
  if (path == GeluPath::avx512) return backward_saved_avx512(g, x, t, out, n);
  if (path == GeluPath::avx2) return backward_saved_avx2(g, x, t, out, n);
#endif
  backward_saved_loop(g, x, t, out, n);
}

void gelu_tanh_save_f32(const float* x, float* out, float* t, std::int64_t n) {
  static const GeluPath path = widest_path();
  gelu_tanh_save_f32_on(path, x, out, t, n);
}

void gelu_tanh_backward_saved_f32(const float* g, const float* x, const float* t, float* out, std::int64_t n) {
  static const GeluPath path = widest_path();
  gelu_tanh_backward_saved_f32_on(path, g, x, t, out, n);
}

void gelu_tanh_f32(const float* x, float* out, std::int64_t n) {
  static const GeluPath path = widest_path();
  gelu_tanh_f32_on(path, x, out, n);
}

void gelu_tanh_backward_f32(const float* g, const float* x, float* out, std::int64_t n) {
  static const GeluPath path = widest_path();
  gelu_tanh_backward_f32_on(path, g, x, out, n);
}

}  // namespace ampscope::cpu
