// kernels/cpu/elementwise.h: the CPU backend's loops for element-wise kernels over strided views. Each
// loads elements in the tensor's dtype, calls the op's functor (kernels/functors.h) in the accumulation
// type and rounds once on store. Contiguous inputs take a plain indexed loop; others walk a cursor.
//
//   register_kernel(Op::relu, DType::f16, &cpu::unary_kernel<f16, ReluFn>);
#pragma once

#include <array>
#include <cstdint>

#include "core/backend.h"
#include "core/convert.h"
#include "kernels/cpu/parallel.h"
#include "kernels/functors.h"

namespace ampscope::cpu {

// Walks the elements of up to four views that share one shape, in row-major order, keeping each
// view's element offset. Starting anywhere costs one division per dimension; each step after that is
// an increment, so a chunk of a parallel loop pays the divisions once.
template <int N>
class StridedCursor {
 public:
  StridedCursor(const TensorView& shape, const std::array<const TensorView*, N>& views, std::int64_t start)
      : ndim_(shape.ndim) {
    for (int d = 0; d < ndim_; ++d) sizes_[d] = shape.sizes[d];
    for (int v = 0; v < N; ++v) {
      off_[v] = 0;
      for (int d = 0; d < ndim_; ++d) strides_[v][d] = views[v]->strides[d];
    }
    std::int64_t rest = start;
    for (int d = ndim_ - 1; d >= 0; --d) {
      idx_[d] = rest % sizes_[d];
      rest /= sizes_[d];
      for (int v = 0; v < N; ++v) off_[v] += idx_[d] * strides_[v][d];
    }
  }

  std::int64_t offset(int v) const { return off_[v]; }

  void next() {
    for (int d = ndim_ - 1; d >= 0; --d) {
      if (++idx_[d] < sizes_[d]) {
        for (int v = 0; v < N; ++v) off_[v] += strides_[v][d];
        return;
      }
      for (int v = 0; v < N; ++v) off_[v] -= (sizes_[d] - 1) * strides_[v][d];
      idx_[d] = 0;
    }
  }

 private:
  int ndim_;
  std::int64_t sizes_[kMaxDims] = {};
  std::int64_t idx_[kMaxDims] = {};
  std::int64_t strides_[N][kMaxDims] = {};
  std::int64_t off_[N] = {};
};

// ---- element-wise loops ----

template <class T, class Fn>
void unary_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if (a.in[0].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(in[i])));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<1> c(a.out, {&a.in[0]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[i] = convert<T>(fn(convert<Acc>(in[c.offset(0)])));
  });
}

template <class T, class Fn>
void binary_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  const T* y = a.in[1].ptr<T>();
  T* out = a.out.ptr<T>();
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if (a.in[0].is_contiguous() && a.in[1].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(x[i]), convert<Acc>(y[i])));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<2> c(a.out, {&a.in[0], &a.in[1]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) {
      out[i] = convert<T>(fn(convert<Acc>(x[c.offset(0)]), convert<Acc>(y[c.offset(1)])));
    }
  });
}

template <class T, class Fn>
void binary_scalar_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const Acc y = static_cast<Acc>(a.scalars[0]);
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if (a.in[0].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(x[i]), y));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<1> c(a.out, {&a.in[0]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[i] = convert<T>(fn(convert<Acc>(x[c.offset(0)]), y));
  });
}


// Three inputs of dtype T, all broadcast to out's shape.
template <class T, class Fn>
void ternary_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  const T* y = a.in[1].ptr<T>();
  const T* z = a.in[2].ptr<T>();
  T* out = a.out.ptr<T>();
  const Fn fn = make_functor<Fn>(a.scalars.data());
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<3> c(a.out, {&a.in[0], &a.in[1], &a.in[2]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) {
      out[i] = convert<T>(fn(convert<Acc>(x[c.offset(0)]), convert<Acc>(y[c.offset(1)]), convert<Acc>(z[c.offset(2)])));
    }
  });
}

}  // namespace ampscope::cpu
