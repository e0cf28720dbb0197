// kernels/cpu/elementwise.h: the CPU backend's loops for element-wise kernels over strided views. Each
// loads elements in the tensor's dtype, calls the op's functor (kernels/functors.h) in the accumulation
// type and rounds once on store. Contiguous inputs take a plain indexed loop; others walk a cursor.
// f16/bf16 go through float blocks: loaded and widened in bulk (kernels/half_convert.h: F16C where the
// CPU has it), the functor applied, the block rounded in bulk; the same bits as one element at a time.
//
//   register_kernel(Op::relu, DType::f16, &cpu::unary_kernel<f16, ReluFn>);
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/backend.h"
#include "core/convert.h"
#include "kernels/half_convert.h"
#include "kernels/parallel.h"
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

// Calls row(i, count, offsets, strides) for the stretches of [begin, end) (row-major linear indices of
// `shape`) that lie in one row of the last dimension: out index i..i+count-1, view v's element offset
// offsets[v] + j * strides[v] for j < count. The cursor then moves once per row rather than once per
// element, and the row loop can be a plain (vectorisable) loop when the strides are 0 or 1: a bias
// added along rows, a 0-dim coefficient multiplied into a gradient, a transposed copy.
template <int N, class Row>
void for_each_row(const TensorView& shape, const std::array<const TensorView*, N>& views, std::int64_t begin,
                  std::int64_t end, const Row& row) {
  std::array<std::int64_t, N> offsets{}, strides{};
  if (shape.ndim == 0) {
    if (begin < end) row(begin, end - begin, offsets, strides);
    return;
  }
  const int last = shape.ndim - 1;
  const std::int64_t inner = shape.sizes[last];
  // The views without their last dimension: the cursor walks rows.
  TensorView outer_shape = shape;
  outer_shape.ndim = last;
  std::array<TensorView, N> outer;
  std::array<const TensorView*, N> outer_ptrs;
  for (int v = 0; v < N; ++v) {
    outer[v] = *views[v];
    outer[v].ndim = last;
    outer_ptrs[v] = &outer[v];
    strides[v] = views[v]->strides[last];
  }
  StridedCursor<N> c(outer_shape, outer_ptrs, begin / inner);
  std::int64_t j = begin % inner;
  for (std::int64_t i = begin; i < end; c.next()) {
    const std::int64_t count = std::min(inner - j, end - i);
    for (int v = 0; v < N; ++v) offsets[v] = c.offset(v) + j * strides[v];
    row(i, count, offsets, strides);
    i += count;
    j = 0;
  }
}

// ---- element-wise loops ----

// Elements per float block of the f16/bf16 loops (two or three blocks live on the stack).
inline constexpr std::int64_t kHalfBlock = 512;

// Loads elements [begin, begin + n) of `in` (contiguous when `cursor` is null, else at the cursor's offset
// `v`, which it advances) into `dst` as floats.
template <class T, class Cursor>
inline void load_block(const T* in, std::int64_t begin, std::int64_t n, Cursor* cursor, int v, float* dst) {
  if (cursor == nullptr) {
    widen(in + begin, dst, n);
    return;
  }
  for (std::int64_t j = 0; j < n; ++j, cursor->next()) dst[j] = convert<float>(in[cursor->offset(v)]);
}

template <class T, class Fn>
void unary_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if constexpr (ampscope::detail::is_half_v<T>) {
    const bool contiguous = a.in[0].is_contiguous();
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      StridedCursor<1> c(a.out, {&a.in[0]}, b);
      float x[kHalfBlock];
      for (std::int64_t k = b; k < e; k += kHalfBlock) {
        const std::int64_t n = std::min(kHalfBlock, e - k);
        load_block(in, k, n, contiguous ? nullptr : &c, 0, x);
        for (std::int64_t j = 0; j < n; ++j) x[j] = fn(x[j]);
        narrow(x, out + k, n);
      }
    });
    return;
  }
  if (a.in[0].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(in[i])));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for_each_row<1>(a.out, {&a.in[0]}, b, e, [&](std::int64_t i, std::int64_t n, const auto& off, const auto& st) {
      const T* x = in + off[0];
      T* o = out + i;
      if (st[0] == 1) {
        for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(convert<Acc>(x[j])));
      } else {
        for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(convert<Acc>(x[j * st[0]])));
      }
    });
  });
}

template <class T, class Fn>
void binary_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  const T* y = a.in[1].ptr<T>();
  T* out = a.out.ptr<T>();
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if constexpr (ampscope::detail::is_half_v<T>) {
    const bool contiguous = a.in[0].is_contiguous() && a.in[1].is_contiguous();
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      StridedCursor<1> cx(a.out, {&a.in[0]}, b), cy(a.out, {&a.in[1]}, b);
      float xs[kHalfBlock], ys[kHalfBlock];
      for (std::int64_t k = b; k < e; k += kHalfBlock) {
        const std::int64_t n = std::min(kHalfBlock, e - k);
        load_block(x, k, n, contiguous ? nullptr : &cx, 0, xs);
        load_block(y, k, n, contiguous ? nullptr : &cy, 0, ys);
        for (std::int64_t j = 0; j < n; ++j) xs[j] = fn(xs[j], ys[j]);
        narrow(xs, out + k, n);
      }
    });
    return;
  }
  if (a.in[0].is_contiguous() && a.in[1].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(x[i]), convert<Acc>(y[i])));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for_each_row<2>(a.out, {&a.in[0], &a.in[1]}, b, e, [&](std::int64_t i, std::int64_t n, const auto& off, const auto& st) {
      const T* xr = x + off[0];
      const T* yr = y + off[1];
      T* o = out + i;
      // The same functor on the same operands in every branch: only the loads differ.
      if (st[0] == 1 && st[1] == 1) {
        for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(convert<Acc>(xr[j]), convert<Acc>(yr[j])));
      } else if (st[0] == 1 && st[1] == 0) {
        const Acc yv = convert<Acc>(yr[0]);
        for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(convert<Acc>(xr[j]), yv));
      } else if (st[0] == 0 && st[1] == 1) {
        const Acc xv = convert<Acc>(xr[0]);
        for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(xv, convert<Acc>(yr[j])));
      } else {
        for (std::int64_t j = 0; j < n; ++j) {
          o[j] = convert<T>(fn(convert<Acc>(xr[j * st[0]]), convert<Acc>(yr[j * st[1]])));
        }
      }
    });
  });
}

template <class T, class Fn>
void binary_scalar_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const Acc y = static_cast<Acc>(a.scalars[0]);
  const Fn fn = make_functor<Fn>(a.scalars.data());
  if constexpr (ampscope::detail::is_half_v<T>) {
    const bool contiguous = a.in[0].is_contiguous();
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      StridedCursor<1> c(a.out, {&a.in[0]}, b);
      float xs[kHalfBlock];
      for (std::int64_t k = b; k < e; k += kHalfBlock) {
        const std::int64_t n = std::min(kHalfBlock, e - k);
        load_block(x, k, n, contiguous ? nullptr : &c, 0, xs);
        for (std::int64_t j = 0; j < n; ++j) xs[j] = fn(xs[j], y);
        narrow(xs, out + k, n);
      }
    });
    return;
  }
  if (a.in[0].is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(fn(convert<Acc>(x[i]), y));
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for_each_row<1>(a.out, {&a.in[0]}, b, e, [&](std::int64_t i, std::int64_t n, const auto& off, const auto& st) {
      const T* xr = x + off[0];
      T* o = out + i;
      for (std::int64_t j = 0; j < n; ++j) o[j] = convert<T>(fn(convert<Acc>(xr[j * st[0]]), y));
    });
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
