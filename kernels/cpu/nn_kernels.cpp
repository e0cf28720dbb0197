// The CPU backend's kernels for the training runtime: element-wise math and its derivatives, row
// reductions (sum, softmax, layer norm), matrix products through OpenBLAS, im2col/col2im, pooling,
// embedding, dropout and the negative log-likelihood. Every kernel computes in the accumulation type
// (float for f16/bf16/f32, double for f64) and rounds once on store, as the CUDA backend does. The row
// ops are kernels/row_functors.h's functions run by a SerialRow: this file only splits rows over the cores.
#include "kernels/cpu/nn_kernels.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/convert.h"
#include "core/philox.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/exp_kernels.h"
#include "kernels/cpu/gelu_kernels.h"
#include "kernels/half_convert.h"
#include "kernels/parallel.h"
#include "kernels/functors.h"
#include "kernels/row_functors.h"

// OpenBLAS's own control of its thread pool (declared here too in case cblas.h is another vendor's).
extern "C" void openblas_set_num_threads(int num_threads);

namespace ampscope::cpu {
namespace {

// Row kernels split rows over the cores once a call has this many elements.
constexpr std::int64_t kRowGrain = 16384;

std::int64_t rows_grain(std::int64_t cols) { return std::max<std::int64_t>(1, kRowGrain / std::max<std::int64_t>(cols, 1)); }

// ---- element-wise with masks ----

template <class T>
void where_kernel(Backend&, const KernelArgs& a) {
  const bool* cond = a.in[0].ptr<bool>();
  const T* x = a.in[1].ptr<T>();
  const T* y = a.in[2].ptr<T>();
  T* out = a.out.ptr<T>();
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<3> c(a.out, {&a.in[0], &a.in[1], &a.in[2]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[i] = cond[c.offset(0)] ? x[c.offset(1)] : y[c.offset(2)];
  });
}

// The period P of a view that repeats one dense block: its trailing dimensions dense in row-major order,
// every leading one broadcast (stride 0) or of size 1, so that element i of the view is element i % P of
// the block. 0 when the view is not of that form (or empty). A causal mask [T, T] broadcast over
// [B, H, T, T] has P = T * T; a contiguous view has P = numel.
std::int64_t broadcast_period(const TensorView& v) {
  std::int64_t period = 1;
  int d = v.ndim - 1;
  for (; d >= 0 && (v.sizes[d] == 1 || v.strides[d] == period); --d) period *= v.sizes[d];
  for (; d >= 0; --d) {
    if (v.sizes[d] != 1 && v.strides[d] != 0) return 0;
  }
  return period;
}

template <class T>
void masked_fill_kernel(Backend&, const KernelArgs& a) {
  const T* x = a.in[0].ptr<T>();
  const bool* mask = a.in[1].ptr<bool>();
  const T value = convert<T>(a.scalars[0]);
  T* out = a.out.ptr<T>();
  // A contiguous input and a mask that repeats one dense block (attention's causal mask broadcast over batch
  // and heads): the mask read by position in its block, in runs the compiler vectorises, instead of a strided
  // cursor per element. The same select on the same elements.
  const std::int64_t period = broadcast_period(a.in[1]);
  if (period > 0 && a.in[0].is_contiguous() && a.out.is_contiguous()) {
    parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e;) {
        const std::int64_t p = i % period, count = std::min(period - p, e - i);
        const bool* m = mask + p;
        const T* xi = x + i;
        T* oi = out + i;
        for (std::int64_t j = 0; j < count; ++j) oi[j] = m[j] ? value : xi[j];
        i += count;
      }
    });
    return;
  }
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<2> c(a.out, {&a.in[0], &a.in[1]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[i] = mask[c.offset(1)] ? value : x[c.offset(0)];
  });
}

// out = x * keep * scale, aux[0] = keep, with keep drawn as uniform(seed, offset, i) < 1 - p.
template <class T>
void dropout_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  bool* keep = a.aux[0].ptr<bool>();
  const float keep_prob = static_cast<float>(1.0 - a.scalars[0]);
  const double scale = a.scalars[1];
  const MaskedScaleFn fn(&scale);
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<1> c(a.out, {&a.in[0]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) {
      const bool k = uniform_at<float>(a.seed, a.offset, static_cast<std::uint64_t>(i)) < keep_prob;
      keep[i] = k;
      out[i] = convert<T>(fn(convert<Acc>(x[c.offset(0)]), k));
    }
  });
}

template <class T>
void masked_scale_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const bool* keep = a.in[1].ptr<bool>();
  T* out = a.out.ptr<T>();
  const MaskedScaleFn fn(a.scalars.data());
  parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<2> c(a.out, {&a.in[0], &a.in[1]}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[i] = convert<T>(fn(convert<Acc>(g[c.offset(0)]), keep[c.offset(1)]));
  });
}

// ---- GELU ----

// The tanh form on contiguous f32 goes through the vectorised loops of gelu_kernels.h (the same functor, the
// same bits); everything else through the generic element-wise kernels.
template <class T>
void gelu_kernel(Backend& backend, const KernelArgs& a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.scalars[0] == 1 && a.in[0].is_contiguous()) {
      const float* x = a.in[0].ptr<float>();
      float* out = a.out.ptr<float>();
      if (a.aux[0].data) {
        // core/ops.cpp (gelu on the CPU, f32, tanh, for backward): aux[0], contiguous, takes each tanh.
        float* t = a.aux[0].ptr<float>();
        parallel_for(a.out.numel, kElementwiseGrain,
                     [&](std::int64_t b, std::int64_t e) { gelu_tanh_save_f32(x + b, out + b, t + b, e - b); });
        return;
      }
      parallel_for(a.out.numel, kElementwiseGrain,
                   [&](std::int64_t b, std::int64_t e) { gelu_tanh_f32(x + b, out + b, e - b); });
      return;
    }
  }
  unary_kernel<T, GeluFn>(backend, a);
}

template <class T>
void gelu_backward_kernel(Backend& backend, const KernelArgs& a) {
  if constexpr (std::is_same_v<T, float>) {
    if (a.scalars[0] == 1 && a.in[0].is_contiguous() && a.in[1].is_contiguous()) {
      const float* g = a.in[0].ptr<float>();
      const float* x = a.in[1].ptr<float>();
      float* out = a.out.ptr<float>();
      if (a.num_inputs == 3 && a.in[2].data && a.in[2].is_contiguous()) {
        // in[2]: the tanh the forward pass stored (gelu_kernel's aux[0]).
        const float* t = a.in[2].ptr<float>();
        parallel_for(a.out.numel, kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
          gelu_tanh_backward_saved_f32(g + b, x + b, t + b, out + b, e - b);
        });
        return;
      }
      parallel_for(a.out.numel, kElementwiseGrain,
                   [&](std::int64_t b, std::int64_t e) { gelu_tanh_backward_f32(g + b, x + b, out + b, e - b); });
      return;
    }
  }
  binary_kernel<T, GeluBackwardFn>(backend, a);
}

// ---- rows ----

// sum_rows of a strided view (core/ops.cpp, reduce_rows on the CPU): in[0]'s first `nr` dims index the
// rows, the rest the reduced elements, in row-major order, at any strides: the permuted views as_rows would
// have copied to make rows contiguous (a convolution's bias gradient, sum over N, H, W of [N, C, H, W];
// a linear layer's, sum over the rows of [rows, out]: 2-2.5% of the sample CNN's and MLP's steps went
// to that copy). Each row is summed exactly as lane_tree_sum sums it (element j of the row into lane
// j % kReduceLanes, each lane in increasing j from zero, then the lanes folded in halves), so the bits are
// sum_row's on the copy: tests/kernels/cpu_fast_paths_test.cpp compares them on both layouts.
template <class T>
void sum_strided_rows(const KernelArgs& a, int nr) {
  using Acc = acc_type<T>;
  constexpr int kLanes = kReduceLanes;
  const TensorView& v = a.in[0];
  const T* in = v.ptr<T>();
  T* out = a.out.ptr<T>();
  const Acc factor = static_cast<Acc>(a.scalars[0]), divisor = static_cast<Acc>(a.scalars[1]);
  const int nd = v.ndim;
  // The reduced elements in runs: the trailing reduced dims that form one evenly strided run (H and W of
  // a convolution's gradient), and the outer reduced dims [nr, run_dim) that place the runs.
  int run_dim = std::max(nr, nd - 1);
  while (run_dim > nr && run_dim < nd && v.strides[run_dim - 1] == v.sizes[run_dim] * v.strides[run_dim]) --run_dim;
  std::int64_t rows = 1, outer = 1, inner = 1;
  for (int d = 0; d < nr; ++d) rows *= v.sizes[d];
  for (int d = nr; d < run_dim; ++d) outer *= v.sizes[d];
  for (int d = run_dim; d < nd; ++d) inner *= v.sizes[d];
  const std::int64_t inner_stride = nr < nd ? v.strides[nd - 1] : 0;
  // Offsets of a row (dims [0, nr)) and of a run (dims [nr, run_dim)).
  auto offset = [&v](std::int64_t i, int d0, int d1) {
    std::int64_t off = 0;
    for (int d = d1 - 1; d >= d0; --d) {
      off += (i % v.sizes[d]) * v.strides[d];
      i /= v.sizes[d];
    }
    return off;
  };
  auto result = [&](Acc sum) { return convert<T>(canonical_nan(sum * factor / divisor)); };
  if (nr == 1 && v.strides[0] == 1 && rows > 1) {
    // Rows adjacent in memory (a column sum): a block of rows at a time, each reduced element adding a
    // contiguous run of the block's values to lane j % kLanes of each row.
    constexpr std::int64_t kBlock = 64;
    const std::int64_t blocks = (rows + kBlock - 1) / kBlock;
    parallel_for(blocks, rows_grain(kBlock * outer * inner), [&](std::int64_t b0, std::int64_t b1) {
      std::vector<Acc> lanes(static_cast<std::size_t>(kLanes * kBlock));
      for (std::int64_t blk = b0; blk < b1; ++blk) {
        const std::int64_t r0 = blk * kBlock, nrow = std::min(kBlock, rows - r0);
        std::fill(lanes.begin(), lanes.end(), Acc(0));
        std::int64_t lane = 0;
        for (std::int64_t o = 0; o < outer; ++o) {
          const T* run = in + r0 + offset(o, nr, run_dim);
          for (std::int64_t i = 0; i < inner; ++i) {
            const T* src = run + i * inner_stride;
            Acc* dst = lanes.data() + lane * kBlock;
            for (std::int64_t c = 0; c < nrow; ++c) dst[c] += convert<Acc>(src[c]);
            lane = lane + 1 == kLanes ? 0 : lane + 1;
          }
        }
        for (int width = kLanes / 2; width > 0; width /= 2) {
          for (int k = 0; k < width; ++k) {
            Acc* dst = lanes.data() + k * kBlock;
            const Acc* src = lanes.data() + (k + width) * kBlock;
            for (std::int64_t c = 0; c < nrow; ++c) dst[c] += src[c];
          }
        }
        for (std::int64_t c = 0; c < nrow; ++c) out[r0 + c] = result(lanes[static_cast<std::size_t>(c)]);
      }
    });
    return;
  }
  // A row at a time, its reduced elements in runs of `inner` (contiguous ones added 32 to a step).
  parallel_for(rows, rows_grain(outer * inner), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      Acc lanes[kLanes] = {};
      const T* row = in + offset(r, 0, nr);
      int lane = 0;
      for (std::int64_t o = 0; o < outer; ++o) {
        const T* run = row + offset(o, nr, run_dim);
        std::int64_t i = 0;
        if (inner_stride == 1) {
          // kLanes elements give every lane one term: lanes [lane, kLanes) the first ones, then [0, lane).
          const int head = kLanes - lane;
          for (; i + kLanes <= inner; i += kLanes) {
            for (int k = 0; k < head; ++k) lanes[lane + k] += convert<Acc>(run[i + k]);
            for (int k = 0; k < lane; ++k) lanes[k] += convert<Acc>(run[i + head + k]);
          }
        }
        for (; i < inner; ++i) {
          lanes[lane] += convert<Acc>(run[i * inner_stride]);
          lane = lane + 1 == kLanes ? 0 : lane + 1;
        }
      }
      for (int width = kLanes / 2; width > 0; width /= 2) {
        for (int k = 0; k < width; ++k) lanes[k] += lanes[k + width];
      }
      out[r] = result(lanes[0]);
    }
  });
}

template <class T>
void sum_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  if (a.scalars[2] > 0) {
    sum_strided_rows<T>(a, static_cast<int>(a.scalars[2]));
    return;
  }
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  const Acc factor = static_cast<Acc>(a.scalars[0]), divisor = static_cast<Acc>(a.scalars[1]);
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      out[r] = sum_row(SerialRow{}, in + r * cols, cols, factor, divisor);
    }
  });
}

template <class T>
void argmax_rows_kernel(Backend&, const KernelArgs& a) {
  const T* in = a.in[0].ptr<T>();
  std::int64_t* out = a.out.ptr<std::int64_t>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) out[r] = argmax_row(in + r * cols, cols);
  });
}

// ---- rows of the loss-writing reductions (kernels/row_functors.h has the per-row math) ----

// out[r] = the row's first largest (smallest) value, its bits moved; aux[0] (optional) its index.
template <class T, bool kMax>
void extreme_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  std::int64_t* index = a.aux[0].data ? a.aux[0].ptr<std::int64_t>() : nullptr;
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const T* row = in + r * cols;
      const std::int64_t j = row_extreme_index<kMax, Acc>(row, cols);
      out[r] = row[j];
      if (index) index[r] = j;
    }
  });
}

template <class T>
void var_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  const Acc correction = static_cast<Acc>(a.scalars[0]);
  const bool take_sqrt = a.scalars[1] == 1.0;
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const Acc v = row_variance<Acc>(in + r * cols, cols, correction);
      out[r] = convert<T>(canonical_nan(take_sqrt ? std::sqrt(v) : v));
    }
  });
}

// dx[r, j] = mask * (g[r] / count), the quotient rounded to T first (PyTorch divides a tensor by the
// mask's sum, then multiplies by the mask: 0 * inf is NaN when no element matches).
template <class T>
void evenly_distribute_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const T* x = a.in[1].ptr<T>();
  const T* v = a.in[2].ptr<T>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[1].sizes[0], cols = a.in[1].sizes[1];
  const bool nan_matches = a.scalars[0] == 1.0;
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const T* row = x + r * cols;
      const Acc value = convert<Acc>(v[r]);
      std::int64_t count = 0;
      for (std::int64_t j = 0; j < cols; ++j) count += selected_by(convert<Acc>(row[j]), value, nan_matches) ? 1 : 0;
      const Acc q = convert<Acc>(convert<T>(canonical_nan(convert<Acc>(g[r]) / static_cast<Acc>(count))));
      for (std::int64_t j = 0; j < cols; ++j) {
        const Acc m = selected_by(convert<Acc>(row[j]), value, nan_matches) ? Acc(1) : Acc(0);
        out[r * cols + j] = convert<T>(canonical_nan(m * q));
      }
    }
  });
}

// dx[r, j] = j == index[r] ? g[r] : 0 (the gradient of a value picked by max/min over a dimension).
template <class T>
void index_backward_rows_kernel(Backend&, const KernelArgs& a) {
  const T* g = a.in[0].ptr<T>();
  const std::int64_t* index = a.in[1].ptr<std::int64_t>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.out.sizes[0], cols = a.out.sizes[1];
  const T zero = convert<T>(0.0);
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      for (std::int64_t j = 0; j < cols; ++j) out[r * cols + j] = j == index[r] ? g[r] : zero;
    }
  });
}

// exp over a row of Acc values in place: for float, glibc's expf sixteen at a time with its bits
// (kernels/cpu/exp_kernels.h), else std::exp one by one.
template <class Acc>
void exp_in_place(Acc* v, std::int64_t n) {
  if constexpr (std::is_same_v<Acc, float>) {
    exp_f32(v, v, n);
  } else {
    for (std::int64_t j = 0; j < n; ++j) v[j] = std::exp(v[j]);
  }
}

// softmax_row<kLog> (kernels/row_functors.h) with each exp computed once and all of a row's exps together:
// the row's exps exp(x - max) are stored (softmax: in y itself when T is the accumulation type, else in
// `scratch`; log_softmax: in `scratch`), summed from there in lane_tree_sum's order, then divided
// (softmax) or subtracted as a log (log_softmax). The same exp of the same argument (exp_in_place: the C
// library's bits), the same additions in the same order, the same division or subtraction: the shared row
// function's bits (tests/kernels/cpu_fast_paths_test.cpp compares the two), at half its exps for softmax;
// the shared function computes exp twice because a warp cannot keep a row in registers.
// SerialRow::max of a row (the first NaN if there is one, else the first largest value), for f32 rows four
// lanes at a time (the scalar scan was most of the softmax rows' own time). Without a NaN the largest value's
// bits are the same whichever of its copies is taken, except +0 and -0, which compare equal: a row whose
// maximum is a zero, or that holds a NaN, is scanned again by SerialRow::max itself, so the maximum is always
// SerialRow's, bit for bit (tests/kernels/cpu_fast_paths_test.cpp has rows of both kinds).
template <class T>
acc_type<T> row_max(const T* x, std::int64_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (n >= 16) {
      __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, nan = _mm_setzero_ps();
      std::int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const __m128 a = _mm_loadu_ps(x + j), b = _mm_loadu_ps(x + j + 4);
        m0 = _mm_max_ps(m0, a);
        m1 = _mm_max_ps(m1, b);
        nan = _mm_or_ps(nan, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
      }
      alignas(16) float lanes[4];
      _mm_store_ps(lanes, _mm_max_ps(m0, m1));
      float m = lanes[0];
      for (int k = 1; k < 4; ++k) m = lanes[k] > m ? lanes[k] : m;
      bool has_nan = _mm_movemask_ps(nan) != 0;
      for (; j < n; ++j) {
        has_nan |= x[j] != x[j];
        m = x[j] > m ? x[j] : m;
      }
      if (!has_nan && m != 0.0f) return m;
    }
  }
#endif
  return SerialRow{}.max<acc_type<T>>(n, RowLoad<acc_type<T>, T>{x});
}

template <bool kLog, class T>
void softmax_row_stored_exp(const T* x, T* y, std::int64_t n, acc_type<T>* scratch) {
  using Acc = acc_type<T>;
  const Acc m = row_max(x, n);
  Acc* ex = nullptr;
  if constexpr (std::is_same_v<T, Acc> && !kLog) {
    ex = y;
  } else {
    ex = scratch;
  }
  for (std::int64_t j = 0; j < n; ++j) ex[j] = convert<Acc>(x[j]) - m;
  exp_in_place(ex, n);
  const Acc sum = lane_tree_sum<Acc>(n, [&](std::int64_t j) { return ex[j]; });
  if constexpr (kLog) {
    const Acc log_sum = std::log(sum);
    for (std::int64_t j = 0; j < n; ++j) y[j] = convert<T>(canonical_nan(convert<Acc>(x[j]) - m - log_sum));
  } else {
    for (std::int64_t j = 0; j < n; ++j) y[j] = convert<T>(canonical_nan(ex[j] / sum));
  }
}

template <class T, bool kLog>
void softmax_rows_kernel(Backend&, const KernelArgs& a) {
  const T* in = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    const bool needs_scratch = kLog || !std::is_same_v<T, acc_type<T>>;
    std::vector<acc_type<T>> scratch(needs_scratch ? static_cast<std::size_t>(cols) : 0);
    for (std::int64_t r = b; r < e; ++r) {
      softmax_row_stored_exp<kLog>(in + r * cols, out + r * cols, cols, scratch.data());
    }
  });
}

// log_softmax's backward row, dx = g - exp(y) sum(g) (softmax_backward_row<true>, kernels/row_functors.h),
// with the row's exp(y) computed together in `scratch` (exp_in_place: the C library's bits); the same sum,
// product and subtraction: the shared function's bits.
template <class T>
void log_softmax_backward_row_stored_exp(const T* g, const T* y, T* dx, std::int64_t n, acc_type<T>* scratch) {
  using Acc = acc_type<T>;
  const Acc s = SerialRow{}.sum<Acc>(n, RowLoad<Acc, T>{g});
  for (std::int64_t j = 0; j < n; ++j) scratch[j] = convert<Acc>(y[j]);
  exp_in_place(scratch, n);
  for (std::int64_t j = 0; j < n; ++j) dx[j] = convert<T>(canonical_nan(convert<Acc>(g[j]) - scratch[j] * s));
}

template <class T, bool kLog>
void softmax_backward_rows_kernel(Backend&, const KernelArgs& a) {
  const T* g = a.in[0].ptr<T>();
  const T* y = a.in[1].ptr<T>();
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    if constexpr (kLog) {
      std::vector<acc_type<T>> scratch(static_cast<std::size_t>(cols));
      for (std::int64_t r = b; r < e; ++r) {
        log_softmax_backward_row_stored_exp(g + r * cols, y + r * cols, out + r * cols, cols, scratch.data());
      }
    } else {
      for (std::int64_t r = b; r < e; ++r) {
        softmax_backward_row<kLog>(SerialRow{}, g + r * cols, y + r * cols, out + r * cols, cols);
      }
    }
  });
}

// Layer norm's mean and rstd go to aux[0] and aux[1] in the accumulation type, for the backward pass.
template <class T>
void layer_norm_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* x = a.in[0].ptr<T>();
  const T* w = a.in[1].data ? a.in[1].ptr<T>() : nullptr;
  const T* bias = a.in[2].data ? a.in[2].ptr<T>() : nullptr;
  T* out = a.out.ptr<T>();
  Acc* mean_out = a.aux[0].ptr<Acc>();
  Acc* rstd_out = a.aux[1].ptr<Acc>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  const Acc eps = static_cast<Acc>(a.scalars[0]);
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      layer_norm_row(SerialRow{}, x + r * cols, w, bias, out + r * cols, cols, eps, mean_out + r, rstd_out + r);
    }
  });
}

template <class T>
void layer_norm_backward_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const T* x = a.in[1].ptr<T>();
  const Acc* mean = a.in[2].ptr<Acc>();
  const Acc* rstd = a.in[3].ptr<Acc>();
  const T* w = a.in[4].data ? a.in[4].ptr<T>() : nullptr;
  T* out = a.out.ptr<T>();
  const std::int64_t rows = a.in[1].sizes[0], cols = a.in[1].sizes[1];
  parallel_for(rows, rows_grain(cols), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      layer_norm_backward_row(SerialRow{}, g + r * cols, x + r * cols, w, out + r * cols, cols, mean[r], rstd[r]);
    }
  });
}

template <class T>
void layer_norm_param_grad_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const T* x = a.in[1].ptr<T>();
  const Acc* mean = a.in[2].ptr<Acc>();
  const Acc* rstd = a.in[3].ptr<Acc>();
  T* dw = a.out.ptr<T>();
  T* db = a.aux[0].ptr<T>();
  const std::int64_t rows = a.in[1].sizes[0], cols = a.in[1].sizes[1];
  // layer_norm_param_grad_column (kernels/row_functors.h, one column at a time down the rows: what the GPU
  // runs) for a block of columns at once, walking the rows in order: each column's two sums take the same
  // terms in the same order with the same roundings, so the same bits, but a row's columns are contiguous, so
  // the loop over them vectorises and reads memory in order (tiny GPT: 2% of the f32 step before, strided).
  parallel_for(cols, std::max<std::int64_t>(1, kRowGrain / std::max<std::int64_t>(rows, 1)),
               [&](std::int64_t b, std::int64_t e) {
                 const std::int64_t width = e - b;
                 std::vector<Acc> sw(static_cast<std::size_t>(width), Acc(0)), sb(static_cast<std::size_t>(width), Acc(0));
                 Acc* psw = sw.data();
                 Acc* psb = sb.data();
                 for (std::int64_t r = 0; r < rows; ++r) {
                   const T* gr = g + r * cols + b;
                   const T* xr = x + r * cols + b;
                   const Acc m = mean[r], s = rstd[r];
                   for (std::int64_t c = 0; c < width; ++c) {
                     const Acc gv = convert<Acc>(gr[c]);
                     psw[c] += gv * ((convert<Acc>(xr[c]) - m) * s);
                     psb[c] += gv;
                   }
                 }
                 for (std::int64_t c = 0; c < width; ++c) {
                   dw[b + c] = convert<T>(canonical_nan(psw[c]));
                   db[b + c] = convert<T>(canonical_nan(psb[c]));
                 }
               });
}

// ---- matrix products ----

// Copies matrix `batch` of a [B, R, C] view into a dense row-major buffer of the accumulation type,
// rows split over the pool when the caller is not itself a pool task. f16/bf16 rows are widened in bulk
// (kernels/half_convert.h); a transposed view (a weight used as w^T) is widened a few source columns
// at a time, each contiguous in memory, and written out as rows of the buffer.
template <class Acc>
void pack_matrix(const TensorView& v, std::int64_t batch, Acc* dst) {
  const std::int64_t rows = v.sizes[1], cols = v.sizes[2];
  visit_dtype(v.dtype, [&](auto tag) {
    using S = decltype(tag);
    if constexpr (std::is_same_v<S, bool>) {
      return;
    } else {
      constexpr bool bulk = std::is_same_v<acc_type<S>, Acc>;
      const S* base = static_cast<const S*>(v.data) + batch * v.strides[0];
      const std::int64_t rs = v.strides[1], cs = v.strides[2];
      parallel_for(rows, std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(cols, 1)),
                   [&](std::int64_t r0, std::int64_t r1) {
                     if constexpr (bulk) {
                       if (cs == 1) {
                         for (std::int64_t r = r0; r < r1; ++r) widen(base + r * rs, dst + r * cols, cols);
                         return;
                       }
                       if (rs == 1) {
                         constexpr std::int64_t kTileCols = 8, kTileRows = 512;
                         Acc tile[kTileCols][kTileRows];
                         for (std::int64_t rb = r0; rb < r1; rb += kTileRows) {
                           const std::int64_t nr = std::min(kTileRows, r1 - rb);
                           for (std::int64_t cb = 0; cb < cols; cb += kTileCols) {
                             const std::int64_t nc = std::min(kTileCols, cols - cb);
                             for (std::int64_t j = 0; j < nc; ++j) widen(base + (cb + j) * cs + rb, tile[j], nr);
                             for (std::int64_t r = 0; r < nr; ++r) {
                               Acc* out = dst + (rb + r) * cols + cb;
                               for (std::int64_t j = 0; j < nc; ++j) out[j] = tile[j][r];
                             }
                           }
                         }
                         return;
                       }
                     }
                     for (std::int64_t r = r0; r < r1; ++r) {
                       const S* src = base + r * rs;
                       Acc* out = dst + r * cols;
                       if (cs == 1) {
                         for (std::int64_t c = 0; c < cols; ++c) out[c] = convert<Acc>(src[c]);
                       } else {
                         for (std::int64_t c = 0; c < cols; ++c) out[c] = convert<Acc>(src[c * cs]);
                       }
                     }
                   });
    }
  });
}

// o[i] = round(canonical_nan(c[i] + bias)) for the m x n product c in the accumulation type, rows split
// over the pool (a nested call runs on the calling thread). For f16/bf16 outputs c is scratch: the sums
// are written back into it and rounded in bulk; for f32/f64 c is o itself.
// Without a bias and without rounding (f32, f64) a block whose sums hold no NaN is left as it is: the same
// values as canonical_nan writing each back, read once instead of read and written (every product's output
// passed through here: 2.7% of the tiny GPT's and the CNN's f32 steps, issue 37).
// (GCC keeps `nan |= v[i] != v[i]` scalar, so on x86-64 f32 and f64 compare four and two lanes at a time with
// SSE2, the baseline: unordered with itself is NaN.)
template <class Acc>
bool holds_nan(const Acc* v, std::int64_t n) {
  std::int64_t i = 0;
  bool nan = false;
#if defined(__x86_64__)
  if constexpr (std::is_same_v<Acc, float>) {
    __m128 any0 = _mm_setzero_ps(), any1 = _mm_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m128 a = _mm_loadu_ps(v + i), b = _mm_loadu_ps(v + i + 4);
      any0 = _mm_or_ps(any0, _mm_cmpunord_ps(a, a));
      any1 = _mm_or_ps(any1, _mm_cmpunord_ps(b, b));
    }
    nan = _mm_movemask_ps(_mm_or_ps(any0, any1)) != 0;
  } else if constexpr (std::is_same_v<Acc, double>) {
    __m128d any0 = _mm_setzero_pd(), any1 = _mm_setzero_pd();
    for (; i + 4 <= n; i += 4) {
      const __m128d a = _mm_loadu_pd(v + i), b = _mm_loadu_pd(v + i + 2);
      any0 = _mm_or_pd(any0, _mm_cmpunord_pd(a, a));
      any1 = _mm_or_pd(any1, _mm_cmpunord_pd(b, b));
    }
    nan = _mm_movemask_pd(_mm_or_pd(any0, any1)) != 0;
  }
#endif
  for (; i < n; ++i) nan |= v[i] != v[i];
  return nan;
}

template <class T, class Acc>
void round_product(Acc* c, T* o, std::int64_t m, std::int64_t n, const Acc* bias, bool bias_per_row) {
  parallel_for(m, std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(n, 1)),
               [&](std::int64_t r0, std::int64_t r1) {
                 if constexpr (std::is_same_v<T, Acc>) {
                   if (!bias && !holds_nan(c + r0 * n, (r1 - r0) * n)) return;
                 }
                 for (std::int64_t r = r0; r < r1; ++r) {
                   Acc* row = c + r * n;
                   if (bias) {
                     for (std::int64_t j = 0; j < n; ++j) row[j] = canonical_nan(row[j] + bias[bias_per_row ? r : j]);
                   } else {
                     for (std::int64_t j = 0; j < n; ++j) row[j] = canonical_nan(row[j]);
                   }
                 }
                 if constexpr (!std::is_same_v<T, Acc>) narrow(c + r0 * n, o + r0 * n, (r1 - r0) * n);
               });
}

// A matrix BLAS can read in place: dense along one of its two dimensions, in the accumulation type.
struct BlasOperand {
  const void* data = nullptr;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int ld = 0;
};
template <class Acc>
bool direct_operand(const TensorView& v, std::int64_t batch, BlasOperand& op) {
  if (v.dtype != dtype_of<Acc>::value) return false;
  const std::int64_t rows = v.sizes[1], cols = v.sizes[2];
  const Acc* base = static_cast<const Acc*>(v.data) + batch * v.strides[0];
  if (v.strides[2] == 1 && v.strides[1] >= std::max<std::int64_t>(cols, 1)) {
    op = {base, CblasNoTrans, static_cast<int>(v.strides[1])};
    return true;
  }
  if (v.strides[1] == 1 && v.strides[2] >= std::max<std::int64_t>(rows, 1)) {
    op = {base, CblasTrans, static_cast<int>(v.strides[2])};
    return true;
  }
  return false;
}

template <class Acc>
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const Acc* a, int lda, const Acc* b,
               int ldb, Acc* c, int ldc, Acc beta = Acc(0)) {
  if constexpr (std::is_same_v<Acc, double>) {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  }
}

// How many rows (or batches) of n x k multiply-adds make a task worth a thread: about a million, or a
// few hundred microseconds of one core. Smaller products run on the calling thread, because starting
// and joining a thread team costs more than they do (and much more on a loaded machine).
std::int64_t rows_per_task(std::int64_t n, std::int64_t k) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(n * k, 1));
}

// Calls rows(r0, r1) on blocks of [0, m) whose bounds depend on m and the grain only, never on the number
// of threads, and runs the blocks on the pool. BLAS may round a row's dot products differently depending on
// how many rows one call holds (its kernels for a block's edge accumulate in another order), so blocks cut
// by the thread count made a product, and a training run, differ between AMPSCOPE_NUM_THREADS=1 and 2. At
// most kRowBlocks blocks, each at least `grain` rows where m allows.
//
// The blocks a thread runs one after another are one call when every block is above kPackedPathMacs
// (row_macs: multiply-adds a row, n * k; 0 never merges): OpenBLAS packs the whole right-hand operand in
// every call (for a linear layer, its weight), and at 1 thread the 8 calls packed it 8 times, a third of
// the MLP's step (issue 37). Above that size OpenBLAS takes its packed path for every call, whose sum for
// an element (the same k blocks, each one chain of multiply-adds) does not depend on how many rows the call
// holds, so the merged call gives the blocks' bits at any thread count (tests/kernels/cpu_gemm_blocks_test.cpp
// compares both against OpenBLAS called block by block). At or below it OpenBLAS may take its small-matrix
// kernels, which add in another order: those blocks stay separate calls.
inline constexpr std::int64_t kRowBlocks = 8;
// OpenBLAS 0.3.21's x86-64 small-matrix kernels (sgemm_small_kernel_permit): at most 100^3 multiply-adds a call.
inline constexpr std::int64_t kPackedPathMacs = 1000000;
//
// for_blocks is that rule for any extent (rows here, columns in for_column_blocks below): at most max_blocks
// blocks of at least `grain` units, a thread's blocks one call when every block is above kPackedPathMacs
// (unit_macs: multiply-adds a unit; 0 never merges).
template <class Fn>
void for_blocks(std::int64_t extent, std::int64_t grain, std::int64_t max_blocks, std::int64_t unit_macs,
                const Fn& run) {
  if (extent <= 0) return;
  const std::int64_t blocks =
      std::clamp<std::int64_t>(extent / std::max<std::int64_t>(grain, 1), 1, max_blocks);
  // The smallest block has extent / blocks units (floor: the bounds extent * b / blocks differ by that or one more).
  const bool merge = unit_macs > 0 && (extent / blocks) * unit_macs > kPackedPathMacs;
  parallel_for(blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    if (merge) {
      run(extent * b0 / blocks, extent * b1 / blocks);
      return;
    }
    for (std::int64_t b = b0; b < b1; ++b) run(extent * b / blocks, extent * (b + 1) / blocks);
  });
}
template <class Fn>
void for_row_blocks(std::int64_t m, std::int64_t grain, std::int64_t row_macs, const Fn& rows) {
  for_blocks(m, grain, kRowBlocks, row_macs, rows);
}

// The batch-summed product's blocks: columns of the output, not rows. OpenBLAS packs the whole of B (for a
// convolution's weight gradient, an image's transposed columns, 576 x 288 floats for the sample CNN's conv2)
// in every call, so 8 row blocks packed it 8 times an image and the packing cost about as much as the
// arithmetic; a column block packs only its own columns of B (and all of the small A). Bounds from the
// shapes only, as for_row_blocks: at most kColumnBlocks blocks of at least `grain` columns, and at least
// kMinBlockColumns (a few of the kernel's 16-column tiles) so that the blocks stay efficient.
//
// The blocks a thread runs back to back are one call by for_row_blocks' rule (column_macs: multiply-adds a
// column, m * k; 0 never merges): each call also packs the whole of A (an image's output gradient, 64 x 576
// for conv2), 4 times an image at 1 thread before. A column of C is a row of OpenBLAS's column-major C^T, and
// in the packed path its elements' sums do not depend on how many columns the call holds: 3,000 random shapes
// (m 8-307, n 64-963, k 1-1200, both transposes, beta 0 and 1), block by block against one call and against
// two calls, no bit differed (tests/kernels/cpu_gemm_blocks_test.cpp checks the sample CNN's shapes). With
// these grains every block of a split is above the size anyway; the check keeps the rule if they change.
inline constexpr std::int64_t kColumnBlocks = 4, kMinBlockColumns = 64;
std::int64_t columns_per_task(std::int64_t m, std::int64_t k) {
  return std::max(kMinBlockColumns, (std::int64_t{1} << 20) / std::max<std::int64_t>(m * k, 1));
}
template <class Fn>
void for_column_blocks(std::int64_t n, std::int64_t grain, std::int64_t column_macs, const Fn& cols) {
  for_blocks(n, grain, kColumnBlocks, column_macs, cols);
}

// out[b] = A[b] @ B[b] (+ bias), accumulated in float (double for f64) and rounded once to out's
// dtype, which is what cuBLAS does with f16/bf16 inputs and f32 compute. Inputs may have any floating
// dtype and any strides; those BLAS cannot read in place are widened into a dense buffer first.
//
// Threads: OpenBLAS runs single-threaded (see register_nn_kernels) and the work is split here on the
// backend's pool (kernels/parallel.h), over batches when there are enough of them, else over row blocks of each product. Two thread
// pools on two cores would spin against each other; one pool keeps both cores busy.
template <class T>
void gemm_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const TensorView& A = a.in[0];
  const TensorView& B = a.in[1];
  const TensorView& bias = a.in[2];
  const bool bias_per_row = a.scalars[0] != 0;
  const std::int64_t batches = a.out.sizes[0], m = a.out.sizes[1], n = a.out.sizes[2], k = A.sizes[2];
  T* out = a.out.ptr<T>();
  std::vector<Acc> bias_acc;
  if (bias.data) {
    bias_acc.resize(static_cast<std::size_t>(bias.numel));
    visit_dtype(bias.dtype, [&](auto tag) {
      using S = decltype(tag);
      if constexpr (!std::is_same_v<S, bool>) {
        const S* p = bias.ptr<S>();
        for (std::int64_t i = 0; i < bias.numel; ++i) bias_acc[i] = convert<Acc>(p[i * bias.strides[0]]);
      }
    });
  }
  // One product; with split_rows its row blocks run on all threads.
  auto product = [&](std::int64_t b, std::vector<Acc>& pa, std::vector<Acc>& pb, std::vector<Acc>& pc, bool split_rows) {
    Acc* c = nullptr;
    if constexpr (std::is_same_v<T, Acc>) {
      c = reinterpret_cast<Acc*>(out + b * m * n);
    } else {
      pc.resize(static_cast<std::size_t>(m * n));
      c = pc.data();
    }
    if (k == 0) {
      for (std::int64_t i = 0; i < m * n; ++i) c[i] = Acc(0);
    } else {
      BlasOperand oa, ob;
      // A matrix shared by every batch (batch stride 0, e.g. a convolution's weight) is packed once
      // per buffer: the buffer still holds it from the previous batch.
      if (!direct_operand<Acc>(A, b, oa)) {
        if (!(A.strides[0] == 0 && pa.size() == static_cast<std::size_t>(m * k))) {
          pa.resize(static_cast<std::size_t>(m * k));
          pack_matrix(A, b, pa.data());
        }
        oa = {pa.data(), CblasNoTrans, static_cast<int>(k)};
      }
      if (!direct_operand<Acc>(B, b, ob)) {
        if (!(B.strides[0] == 0 && pb.size() == static_cast<std::size_t>(k * n))) {
          pb.resize(static_cast<std::size_t>(k * n));
          pack_matrix(B, b, pb.data());
        }
        ob = {pb.data(), CblasNoTrans, static_cast<int>(n)};
      }
      auto rows = [&](std::int64_t r0, std::int64_t r1) {
        // Row r of A starts at r * ld when stored row-major (NoTrans), at column r when transposed.
        const Acc* a_rows = static_cast<const Acc*>(oa.data) + (oa.trans == CblasNoTrans ? r0 * oa.ld : r0);
        blas_gemm<Acc>(oa.trans, ob.trans, static_cast<int>(r1 - r0), static_cast<int>(n), static_cast<int>(k), a_rows,
                       oa.ld, static_cast<const Acc*>(ob.data), ob.ld, c + r0 * n, static_cast<int>(n));
      };
      if (split_rows) {
        // Only sgemm's calls merge: kPackedPathMacs is what was checked for sgemm (dgemm keeps its blocks).
        for_row_blocks(m, rows_per_task(n, k), std::is_same_v<Acc, float> ? n * k : 0, rows);
      } else {
        rows(0, m);
      }
    }
    round_product(c, out + b * m * n, m, n, bias.data ? bias_acc.data() : nullptr, bias_per_row);
  };
  if (a.scalars[1] != 0) {
    // out [1, M, N] = sum_b A[b] @ B[b]: one accumulator in the accumulation type, batches added in
    // order, rounded once (a weight gradient summed over a batch of images).
    std::vector<Acc> acc(static_cast<std::size_t>(m * n), Acc(0));
    std::vector<Acc> pa, pb;
    const std::int64_t in_batches = A.sizes[0];
    // Only sgemm's calls merge, as in for_row_blocks.
    const std::int64_t column_macs = std::is_same_v<Acc, float> ? m * k : 0;
    BlasOperand oa0, ob0;
    const bool in_place = in_batches > 0 && k > 0 && direct_operand<Acc>(A, 0, oa0) && direct_operand<Acc>(B, 0, ob0);
    if (in_place) {
      // Every batch's operands read in place (strides are the same for every batch): each thread takes its
      // column blocks through all the batches, one fork and join a product instead of one a batch (64 a
      // step for the sample CNN's conv2, each a wake-up of the other thread: issue 37). Each block gets
      // the same calls in the same order as batch by batch, so the same bits.
      for_column_blocks(n, columns_per_task(m, k), column_macs, [&](std::int64_t c0, std::int64_t c1) {
        for (std::int64_t b = 0; b < in_batches; ++b) {
          BlasOperand oa, ob;
          direct_operand<Acc>(A, b, oa);
          direct_operand<Acc>(B, b, ob);
          const Acc* b_cols = static_cast<const Acc*>(ob.data) + (ob.trans == CblasNoTrans ? c0 : c0 * ob.ld);
          blas_gemm<Acc>(oa.trans, ob.trans, static_cast<int>(m), static_cast<int>(c1 - c0), static_cast<int>(k),
                         static_cast<const Acc*>(oa.data), oa.ld, b_cols, ob.ld, acc.data() + c0, static_cast<int>(n),
                         b == 0 ? Acc(0) : Acc(1));
        }
      });
    }
    for (std::int64_t b = 0; b < in_batches && k > 0 && !in_place; ++b) {
      BlasOperand oa, ob;
      if (!direct_operand<Acc>(A, b, oa)) {
        pa.resize(static_cast<std::size_t>(m * k));
        pack_matrix(A, b, pa.data());
        oa = {pa.data(), CblasNoTrans, static_cast<int>(k)};
      }
      if (!direct_operand<Acc>(B, b, ob)) {
        pb.resize(static_cast<std::size_t>(k * n));
        pack_matrix(B, b, pb.data());
        ob = {pb.data(), CblasNoTrans, static_cast<int>(n)};
      }
      for_column_blocks(n, columns_per_task(m, k), column_macs, [&](std::int64_t c0, std::int64_t c1) {
        // Column c of B starts at c when stored row-major (NoTrans), at c * ld when transposed.
        const Acc* b_cols = static_cast<const Acc*>(ob.data) + (ob.trans == CblasNoTrans ? c0 : c0 * ob.ld);
        blas_gemm<Acc>(oa.trans, ob.trans, static_cast<int>(m), static_cast<int>(c1 - c0), static_cast<int>(k),
                       static_cast<const Acc*>(oa.data), oa.ld, b_cols, ob.ld, acc.data() + c0, static_cast<int>(n),
                       b == 0 ? Acc(0) : Acc(1));
      });
    }
    if constexpr (std::is_same_v<T, Acc>) {
      for (std::int64_t i = 0; i < m * n; ++i) out[i] = canonical_nan(acc[i]);
    } else {
      round_product(acc.data(), out, m, n, static_cast<const Acc*>(nullptr), false);
    }
    return;
  }
  if (batches >= 2) {
    parallel_for(batches, rows_per_task(m * n, k), [&](std::int64_t b0, std::int64_t b1) {
      std::vector<Acc> pa, pb, pc;
      for (std::int64_t b = b0; b < b1; ++b) product(b, pa, pb, pc, false);
    });
  } else {
    std::vector<Acc> pa, pb, pc;
    for (std::int64_t b = 0; b < batches; ++b) product(b, pa, pb, pc, true);
  }
}

// ---- windows ----

struct Window {
  std::int64_t kh, kw, sh, sw, ph, pw;
  explicit Window(const KernelArgs& a)
      : kh(static_cast<std::int64_t>(a.scalars[0])), kw(static_cast<std::int64_t>(a.scalars[1])),
        sh(static_cast<std::int64_t>(a.scalars[2])), sw(static_cast<std::int64_t>(a.scalars[3])),
        ph(static_cast<std::int64_t>(a.scalars[4])), pw(static_cast<std::int64_t>(a.scalars[5])) {}
};

// Image planes per task: enough that a task does about kElementwiseGrain element operations.
std::int64_t planes_per_task(std::int64_t work_per_plane) {
  return std::max<std::int64_t>(1, kElementwiseGrain / std::max<std::int64_t>(work_per_plane, 1));
}

// x [N, C, H, W] (contiguous) -> cols [N, C*KH*KW, OH*OW]; padding reads as zero. Each row of cols is
// written one output row (oh) at a time: the columns ow whose input column lies inside the image are a
// strided run of the input row (contiguous at stride 1), those in the padding are zero; no division per
// element (the f32 twin runs this twice per convolution, on f32 inputs: bench/RESULTS.md).
template <class T>
void im2col_kernel(Backend&, const KernelArgs& a) {
  const Window w(a);
  const TensorView& x = a.in[0];
  const std::int64_t N = x.sizes[0], C = x.sizes[1], H = x.sizes[2], W = x.sizes[3];
  const std::int64_t L = a.out.sizes[2];
  const std::int64_t OW = (W + 2 * w.pw - w.kw) / w.sw + 1;
  const std::int64_t OH = OW > 0 ? L / OW : 0;
  const T* in = x.ptr<T>();
  T* out = a.out.ptr<T>();
  const T zero = convert<T>(0.0);
  parallel_for(N * C, planes_per_task(w.kh * w.kw * L), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t nc = b; nc < e; ++nc) {
      const T* plane = in + nc * H * W;
      T* rows = out + nc * w.kh * w.kw * L;  // (n, c) owns KH*KW consecutive rows of cols
      for (std::int64_t ki = 0; ki < w.kh; ++ki) {
        for (std::int64_t kj = 0; kj < w.kw; ++kj) {
          T* row = rows + (ki * w.kw + kj) * L;
          // Output columns [ow0, ow1) read input columns ow * sw - pw + kj inside [0, W).
          const std::int64_t shift = kj - w.pw;  // input column of ow = 0
          const std::int64_t ow0 = std::min(OW, shift >= 0 ? 0 : (-shift + w.sw - 1) / w.sw);
          const std::int64_t ow1 = std::max(ow0, std::min(OW, W - shift > 0 ? (W - shift + w.sw - 1) / w.sw : 0));
          for (std::int64_t oh = 0; oh < OH; ++oh) {
            T* dst = row + oh * OW;
            const std::int64_t h = oh * w.sh - w.ph + ki;
            if (h < 0 || h >= H) {
              std::fill(dst, dst + OW, zero);
              continue;
            }
            const T* src = plane + h * W;
            std::fill(dst, dst + ow0, zero);
            if (w.sw == 1) {
              std::copy(src + ow0 + shift, src + ow1 + shift, dst + ow0);
            } else {
              for (std::int64_t ow = ow0; ow < ow1; ++ow) dst[ow] = src[ow * w.sw + shift];
            }
            std::fill(dst + ow1, dst + OW, zero);
          }
        }
      }
    }
  });
}

// cols -> dx: each input element sums, in the accumulation type, the column entries that read it
// (kernel rows in order, then kernel columns), and is rounded once. At column stride 1 an output row is
// summed a kernel offset at a time over a row buffer: for each (ki, kj) the entries it gives the row are
// one contiguous run of a cols row, so the adds vectorise; each element still receives its terms in the
// same order (ki, then kj) from the same zero, so the sums are those of the element-by-element loop below.
template <class T>
void col2im_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const Window w(a);
  const std::int64_t N = a.out.sizes[0], C = a.out.sizes[1], H = a.out.sizes[2], W = a.out.sizes[3];
  const std::int64_t OH = (H + 2 * w.ph - w.kh) / w.sh + 1, OW = (W + 2 * w.pw - w.kw) / w.sw + 1;
  const T* cols = a.in[0].ptr<T>();
  T* out = a.out.ptr<T>();
  parallel_for(N * C, planes_per_task(w.kh * w.kw * H * W), [&](std::int64_t b, std::int64_t e) {
    std::vector<Acc> acc(w.sw == 1 ? static_cast<std::size_t>(W) : 0);
    for (std::int64_t nc = b; nc < e; ++nc) {
      const T* rows = cols + nc * w.kh * w.kw * OH * OW;
      for (std::int64_t h = 0; h < H; ++h) {
        if (w.sw == 1) {
          std::fill(acc.begin(), acc.end(), Acc(0));
          for (std::int64_t ki = 0; ki < w.kh; ++ki) {
            const std::int64_t th = h + w.ph - ki;
            if (th < 0 || th % w.sh != 0 || th / w.sh >= OH) continue;
            for (std::int64_t kj = 0; kj < w.kw; ++kj) {
              // Input column x reads output column x + pw - kj, inside [0, OW).
              const std::int64_t shift = w.pw - kj;
              const std::int64_t x0 = std::max<std::int64_t>(0, -shift), x1 = std::min(W, OW - shift);
              const T* src = rows + (ki * w.kw + kj) * OH * OW + (th / w.sh) * OW + shift;
              Acc* dst = acc.data();
              for (std::int64_t x = x0; x < x1; ++x) dst[x] += convert<Acc>(src[x]);
            }
          }
          T* o = out + nc * H * W + h * W;
          for (std::int64_t x = 0; x < W; ++x) o[x] = convert<T>(canonical_nan(acc[x]));
          continue;
        }
        for (std::int64_t x = 0; x < W; ++x) {
          Acc s = 0;
          for (std::int64_t ki = 0; ki < w.kh; ++ki) {
            const std::int64_t th = h + w.ph - ki;
            if (th < 0 || th % w.sh != 0 || th / w.sh >= OH) continue;
            for (std::int64_t kj = 0; kj < w.kw; ++kj) {
              const std::int64_t tw = x + w.pw - kj;
              if (tw < 0 || tw % w.sw != 0 || tw / w.sw >= OW) continue;
              s += convert<Acc>(rows[(ki * w.kw + kj) * OH * OW + (th / w.sh) * OW + tw / w.sw]);
            }
          }
          out[nc * H * W + h * W + x] = convert<T>(canonical_nan(s));
        }
      }
    }
  });
}

// An integer that orders floats as `>` does for non-NaN values (both zeros map to 0): sign and magnitude
// bits turned into a signed integer.
inline std::int32_t order_key(std::uint32_t u) {
  const auto mag = static_cast<std::int32_t>(u & 0x7FFFFFFFu);
  const std::int32_t neg = -static_cast<std::int32_t>(u >> 31);  // 0 or -1
  return (mag ^ neg) - neg;
}

// The f32 2 x 2 windows of stride 2 of one output row that lie inside the plane: windows ow in [ow0, ow1)
// at plane rows h0, h0 + 1 and columns 2 ow - pw, + 1. max_pool2d_kernel's branch-free decisions, in the
// same order, with the chosen element's bits carried along instead of read back through its index, in a
// loop of its own that the compiler vectorises (stride-2 loads). Same values and indices as the per-window
// code (tests/kernels/window_kernels_test.cpp).
__attribute__((always_inline)) inline void max_pool_row_2x2s2_loop(const float* plane, std::int64_t W, std::int64_t h0,
                                                                   std::int64_t pw, std::int64_t ow0, std::int64_t ow1,
                                                                   float* out, std::int64_t* idx) {
  for (std::int64_t ow = ow0; ow < ow1; ++ow) {
    const std::int64_t p0 = h0 * W + ow * 2 - pw;
    std::int64_t best = p0;
    std::uint32_t best_bits;
    std::memcpy(&best_bits, plane + p0, sizeof best_bits);
    std::int64_t mk = order_key(0xFF800000u), m_nan = 0;  // m = -inf
    const std::int64_t at[4] = {p0, p0 + 1, p0 + W, p0 + W + 1};
    for (const std::int64_t p : at) {
      std::uint32_t u;
      std::memcpy(&u, plane + p, sizeof u);
      const std::int64_t v_nan = (std::int64_t{0x7F800000} - std::int64_t{u & 0x7FFFFFFFu}) >> 63;
      const std::int64_t vk = order_key(u);
      const std::int64_t take = v_nan | (~m_nan & ((mk - vk) >> 63));  // v != v || v > m
      const auto take32 = static_cast<std::uint32_t>(take);
      best = (p & take) | (best & ~take);
      best_bits = (u & take32) | (best_bits & ~take32);
      mk = (vk & take) | (mk & ~take);
      m_nan = (v_nan & take) | (m_nan & ~take);
    }
    std::memcpy(out + ow, &best_bits, sizeof best_bits);
    idx[ow] = best;
  }
}
void max_pool_row_2x2s2_baseline(const float* plane, std::int64_t W, std::int64_t h0, std::int64_t pw, std::int64_t ow0,
                                 std::int64_t ow1, float* out, std::int64_t* idx) {
  max_pool_row_2x2s2_loop(plane, W, h0, pw, ow0, ow1, out, idx);
}
#if defined(__x86_64__)
__attribute__((target("avx2"))) void max_pool_row_2x2s2_avx2(const float* plane, std::int64_t W, std::int64_t h0,
                                                              std::int64_t pw, std::int64_t ow0, std::int64_t ow1,
                                                              float* out, std::int64_t* idx) {
  max_pool_row_2x2s2_loop(plane, W, h0, pw, ow0, ow1, out, idx);
}
#endif
using MaxPoolRowFn = void (*)(const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, float*,
                              std::int64_t*);
MaxPoolRowFn max_pool_row_2x2s2() {
#if defined(__x86_64__)
  static const MaxPoolRowFn fn = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? &max_pool_row_2x2s2_avx2 : &max_pool_row_2x2s2_baseline;
  }();
  return fn;
#else
  return &max_pool_row_2x2s2_baseline;
#endif
}

// NaN wins, as in PyTorch: a NaN replaces the running maximum whenever it is met.
template <class T>
void max_pool2d_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const Window w(a);
  const TensorView& x = a.in[0];
  const std::int64_t N = x.sizes[0], C = x.sizes[1], H = x.sizes[2], W = x.sizes[3];
  const std::int64_t OH = a.out.sizes[2], OW = a.out.sizes[3];
  const T* in = x.ptr<T>();
  T* out = a.out.ptr<T>();
  std::int64_t* idx = a.aux[0].ptr<std::int64_t>();
  parallel_for(N * C, planes_per_task(w.kh * w.kw * OH * OW), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t nc = b; nc < e; ++nc) {
      const T* plane = in + nc * H * W;
      for (std::int64_t oh = 0; oh < OH; ++oh) {
        // f32 2 x 2 windows of stride 2 (the usual pooling): the columns whose windows lie inside the plane,
        // [fast0, fast1), go through the row loop above; the edges, and every other shape, window by window.
        std::int64_t fast0 = 0, fast1 = 0;
        if constexpr (std::is_same_v<T, float>) {
          const std::int64_t h0 = oh * w.sh - w.ph;
          if (w.kh == 2 && w.kw == 2 && w.sw == 2 && h0 >= 0 && h0 + 2 <= H && W - 2 + w.pw >= 0) {
            fast0 = std::min(OW, (w.pw + 1) / 2);                         // 2 ow - pw >= 0
            fast1 = std::max(fast0, std::min(OW, (W - 2 + w.pw) / 2 + 1));  // 2 ow - pw + 2 <= W
            max_pool_row_2x2s2()(plane, W, h0, w.pw, fast0, fast1, out + nc * OH * OW + oh * OW,
                                 idx + nc * OH * OW + oh * OW);
          }
        }
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          if (ow == fast0 && fast1 > fast0) {
            ow = fast1 - 1;
            continue;
          }
          const std::int64_t h0 = oh * w.sh - w.ph, w0 = ow * w.sw - w.pw;
          const std::int64_t o = nc * OH * OW + oh * OW + ow;
          if (w.kh == 2 && w.kw == 2 && h0 >= 0 && w0 >= 0 && h0 + 2 <= H && w0 + 2 <= W) {
            // A 2 x 2 window inside the plane (the usual pooling): the loop below unrolled, same order.
            const std::int64_t p0 = h0 * W + w0;
            const std::int64_t at[4] = {p0, p0 + 1, p0 + W, p0 + W + 1};
            std::int64_t best = p0;
            if constexpr (std::is_same_v<Acc, float>) {
              // The same decisions (v > m || v != v) made on the floats' bits as integers: the compiler
              // selects instead of branching, which random data mispredicts. order_key(v) > order_key(m) is
              // v > m for non-NaN values; once m is a NaN only a NaN replaces it, as v > NaN is false.
              // Masks are 0 or -1 (all bits), made by arithmetic shifts: GCC turns even integer `?:` and
              // bool logic here back into branches.
              std::int64_t mk = order_key(0xFF800000u), m_nan = 0;  // m = -inf
              for (const std::int64_t p : at) {
                const float v = convert<float>(plane[p]);
                std::uint32_t u;
                std::memcpy(&u, &v, sizeof u);
                const std::int64_t v_nan = (std::int64_t{0x7F800000} - std::int64_t{u & 0x7FFFFFFFu}) >> 63;
                const std::int64_t vk = order_key(u);
                const std::int64_t take = v_nan | (~m_nan & ((mk - vk) >> 63));  // v != v || v > m
                best = (p & take) | (best & ~take);
                mk = (vk & take) | (mk & ~take);
                m_nan = (v_nan & take) | (m_nan & ~take);
              }
            } else {
              Acc m = -std::numeric_limits<Acc>::infinity();
              for (const std::int64_t p : at) {
                const Acc v = convert<Acc>(plane[p]);
                if (v > m || v != v) {
                  m = v;
                  best = p;
                }
              }
            }
            out[o] = plane[best];
            idx[o] = best;
            continue;
          }
          Acc m = -std::numeric_limits<Acc>::infinity();
          std::int64_t best = std::max<std::int64_t>(h0, 0) * W + std::max<std::int64_t>(w0, 0);
          for (std::int64_t h = std::max<std::int64_t>(h0, 0); h < std::min(h0 + w.kh, H); ++h) {
            for (std::int64_t c = std::max<std::int64_t>(w0, 0); c < std::min(w0 + w.kw, W); ++c) {
              const Acc v = convert<Acc>(plane[h * W + c]);
              if (v > m || v != v) {
                m = v;
                best = h * W + c;
              }
            }
          }
          out[o] = plane[best];
          idx[o] = best;
        }
      }
    }
  });
}

// Each input element sums the gradients of the windows whose maximum it was, in window order (oh, then
// ow) from zero, and is rounded once. Done as a scatter: the windows are walked in that order and each
// adds its gradient to the element its index names, when that element lies in the window (an index from
// max_pool2d always does); an element no window chose stays zero.
template <class T>
void max_pool2d_backward_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const Window w(a);
  const std::int64_t N = a.out.sizes[0], C = a.out.sizes[1], H = a.out.sizes[2], W = a.out.sizes[3];
  const std::int64_t OH = a.in[0].sizes[2], OW = a.in[0].sizes[3];
  const T* g = a.in[0].ptr<T>();
  const std::int64_t* idx = a.in[1].ptr<std::int64_t>();
  T* out = a.out.ptr<T>();
  parallel_for(N * C, planes_per_task(w.kh * w.kw * H * W), [&](std::int64_t b, std::int64_t e) {
    std::vector<Acc> scratch(std::is_same_v<T, Acc> ? 0 : static_cast<std::size_t>(H * W));
    for (std::int64_t nc = b; nc < e; ++nc) {
      const T* gp = g + nc * OH * OW;
      const std::int64_t* ip = idx + nc * OH * OW;
      Acc* acc = nullptr;
      if constexpr (std::is_same_v<T, Acc>) {
        acc = out + nc * H * W;
      } else {
        acc = scratch.data();
      }
      std::fill(acc, acc + H * W, Acc(0));
      for (std::int64_t oh = 0; oh < OH; ++oh) {
        const std::int64_t h0 = oh * w.sh - w.ph;
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t i = ip[oh * OW + ow];
          if (i < 0 || i >= H * W) continue;
          const std::int64_t h = i / W, x = i - h * W, w0 = ow * w.sw - w.pw;
          if (h < h0 || h >= h0 + w.kh || x < w0 || x >= w0 + w.kw) continue;
          acc[i] += convert<Acc>(gp[oh * OW + ow]);
        }
      }
      T* o = out + nc * H * W;
      for (std::int64_t j = 0; j < H * W; ++j) o[j] = convert<T>(canonical_nan(acc[j]));
    }
  });
}

// ---- embedding and nll ----

template <class T>
void embedding_kernel(Backend&, const KernelArgs& a) {
  const T* weight = a.in[0].ptr<T>();
  const std::int64_t* index = a.in[1].ptr<std::int64_t>();
  const std::int64_t n = a.in[1].numel, d = a.in[0].sizes[1];
  T* out = a.out.ptr<T>();
  parallel_for(n, rows_grain(d), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      for (std::int64_t j = 0; j < d; ++j) out[i * d + j] = weight[index[i] * d + j];
    }
  });
}

// Rows of the gradient are added into their vocabulary row in index order, in the accumulation type.
template <class T>
void embedding_backward_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const std::int64_t* index = a.in[1].ptr<std::int64_t>();
  const std::int64_t n = a.in[1].numel, V = a.out.sizes[0], d = a.out.sizes[1];
  T* out = a.out.ptr<T>();
  std::vector<Acc> acc(static_cast<std::size_t>(V * d), Acc(0));
  parallel_for(d, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = b; j < e; ++j) acc[index[i] * d + j] += convert<Acc>(g[i * d + j]);
    }
  });
  for (std::int64_t i = 0; i < V * d; ++i) out[i] = convert<T>(canonical_nan(acc[i]));
}

template <class T>
void nll_rows_kernel(Backend&, const KernelArgs& a) {
  const T* logp = a.in[0].ptr<T>();
  const std::int64_t* target = a.in[1].ptr<std::int64_t>();
  const std::int64_t rows = a.in[0].sizes[0], cols = a.in[0].sizes[1];
  const auto ignore = static_cast<std::int64_t>(a.scalars[0]);
  T* out = a.out.ptr<T>();
  for (std::int64_t r = 0; r < rows; ++r) {
    out[r] = target[r] == ignore ? convert<T>(0.0) : convert<T>(canonical_nan(-convert<acc_type<T>>(logp[r * cols + target[r]])));
  }
}

template <class T>
void nll_backward_rows_kernel(Backend&, const KernelArgs& a) {
  using Acc = acc_type<T>;
  const T* g = a.in[0].ptr<T>();
  const std::int64_t* target = a.in[1].ptr<std::int64_t>();
  const std::int64_t rows = a.out.sizes[0], cols = a.out.sizes[1];
  const auto ignore = static_cast<std::int64_t>(a.scalars[0]);
  const Acc divisor = static_cast<Acc>(a.scalars[1]);
  T* out = a.out.ptr<T>();
  const std::int64_t gstride = a.in[0].strides[0];
  for (std::int64_t i = 0; i < rows * cols; ++i) out[i] = convert<T>(0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (target[r] == ignore) continue;
    out[r * cols + target[r]] = convert<T>(canonical_nan(-convert<Acc>(g[r * gstride]) / divisor));
  }
}

}  // namespace

void register_nn_kernels(const KernelRegistrar& reg) {
  // One thread pool for the whole backend (kernels/parallel.h): gemm_kernel splits products itself.
  openblas_set_num_threads(1);
  auto floating = [&](auto tag) {
    using T = decltype(tag);
    constexpr DType D = dtype_of<T>::value;
    reg(Op::log, D, &unary_kernel<T, LogFn>);
    reg(Op::sqrt, D, &unary_kernel<T, SqrtFn>);
    reg(Op::rsqrt, D, &unary_kernel<T, RsqrtFn>);
    reg(Op::sigmoid, D, &unary_kernel<T, SigmoidFn>);
    reg(Op::tanh, D, &unary_kernel<T, TanhFn>);
    reg(Op::gelu, D, &gelu_kernel<T>);
    reg(Op::pow_scalar, D, &unary_kernel<T, PowFn>);
    reg(Op::clamp, D, &unary_kernel<T, ClampFn>);
    reg(Op::where, D, &where_kernel<T>);
    reg(Op::masked_fill, D, &masked_fill_kernel<T>);
    reg(Op::relu_backward, D, &binary_kernel<T, ReluBackwardFn>);
    reg(Op::gelu_backward, D, &gelu_backward_kernel<T>);
    reg(Op::sigmoid_backward, D, &binary_kernel<T, SigmoidBackwardFn>);
    reg(Op::tanh_backward, D, &binary_kernel<T, TanhBackwardFn>);
    reg(Op::clamp_backward, D, &binary_kernel<T, ClampBackwardFn>);
    reg(Op::bce, D, &binary_kernel<T, BceFn>);
    reg(Op::bce_backward, D, &ternary_kernel<T, BceBackwardFn>);
    reg(Op::bce_logits, D, &binary_kernel<T, BceLogitsFn>);
    reg(Op::bce_logits_backward, D, &ternary_kernel<T, BceLogitsBackwardFn>);
    reg(Op::dropout, D, &dropout_kernel<T>);
    reg(Op::masked_scale, D, &masked_scale_kernel<T>);
    reg(Op::sum_rows, D, &sum_rows_kernel<T>);
    reg(Op::softmax_rows, D, &softmax_rows_kernel<T, false>);
    reg(Op::log_softmax_rows, D, &softmax_rows_kernel<T, true>);
    reg(Op::softmax_backward_rows, D, &softmax_backward_rows_kernel<T, false>);
    reg(Op::log_softmax_backward_rows, D, &softmax_backward_rows_kernel<T, true>);
    reg(Op::layer_norm_rows, D, &layer_norm_rows_kernel<T>);
    reg(Op::layer_norm_backward_rows, D, &layer_norm_backward_rows_kernel<T>);
    reg(Op::layer_norm_param_grad, D, &layer_norm_param_grad_kernel<T>);
    reg(Op::gemm, D, &gemm_kernel<T>);
    reg(Op::im2col, D, &im2col_kernel<T>);
    reg(Op::col2im, D, &col2im_kernel<T>);
    reg(Op::max_pool2d, D, &max_pool2d_kernel<T>);
    reg(Op::max_pool2d_backward, D, &max_pool2d_backward_kernel<T>);
    reg(Op::embedding, D, &embedding_kernel<T>);
    reg(Op::embedding_backward, D, &embedding_backward_kernel<T>);
    reg(Op::nll_rows, D, &nll_rows_kernel<T>);
    reg(Op::nll_backward_rows, D, &nll_backward_rows_kernel<T>);
    reg(Op::rsub_scalar, D, &binary_scalar_kernel<T, RsubFn>);
    reg(Op::reciprocal, D, &unary_kernel<T, ReciprocalFn>);
    reg(Op::abs, D, &unary_kernel<T, AbsFn>);
    reg(Op::log1p, D, &unary_kernel<T, Log1pFn>);
    reg(Op::expm1, D, &unary_kernel<T, Expm1Fn>);
    reg(Op::abs_backward, D, &binary_kernel<T, AbsBackwardFn>);
    reg(Op::logsigmoid, D, &unary_kernel<T, LogSigmoidFn>);
    reg(Op::logsigmoid_backward, D, &binary_kernel<T, LogSigmoidBackwardFn>);
    reg(Op::softplus, D, &unary_kernel<T, SoftplusFn>);
    reg(Op::softplus_backward, D, &binary_kernel<T, SoftplusBackwardFn>);
    reg(Op::silu, D, &unary_kernel<T, SiluFn>);
    reg(Op::silu_backward, D, &binary_kernel<T, SiluBackwardFn>);
    reg(Op::maximum, D, &binary_kernel<T, MaximumFn>);
    reg(Op::minimum, D, &binary_kernel<T, MinimumFn>);
    reg(Op::maximum_backward, D, &ternary_kernel<T, MaximumBackwardFn>);
    reg(Op::minimum_backward, D, &ternary_kernel<T, MinimumBackwardFn>);
    reg(Op::std_backward, D, &binary_kernel<T, StdBackwardFn>);
    reg(Op::max_rows, D, &extreme_rows_kernel<T, true>);
    reg(Op::min_rows, D, &extreme_rows_kernel<T, false>);
    reg(Op::var_rows, D, &var_rows_kernel<T>);
    reg(Op::evenly_distribute_rows, D, &evenly_distribute_rows_kernel<T>);
    reg(Op::index_backward_rows, D, &index_backward_rows_kernel<T>);
  };
  floating(double{});
  floating(float{});
  floating(f16{});
  floating(bf16{});
  // argmax is chosen by its output dtype (i64); the input's dtype is dispatched inside.
  reg(Op::argmax_rows, DType::i64, [](Backend& be, const KernelArgs& a) {
    visit_dtype(a.in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) argmax_rows_kernel<T>(be, a);
    });
  });
}

}  // namespace ampscope::cpu
