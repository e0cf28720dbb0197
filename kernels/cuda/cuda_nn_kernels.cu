// CUDA kernels for the training runtime's ops that are not element-wise: rows (sum, argmax, softmax,
// log_softmax and their backward, layer norm and its gradients), windows (im2col, col2im, max pooling),
// embedding, nll (and the count of its mean divisor, Backend::count_not_equal) and the epilogue of a cuBLAS
// matrix product. The row ops and argmax are the CPU's own
// code: kernels/row_functors.h's functions, run here by a WarpRow (one warp per row; its sums are
// lane_tree_sum's additions in lane_tree_sum's order) or by one thread per row. The other kernels mirror
// their CPU kernel in kernels/cpu/nn_kernels.cpp operation for operation: every other sum runs on one
// thread in the CPU's order, and nothing accumulates with atomics, so results are deterministic and,
// where the math library is not involved, the CPU's bits.
// Two sections: kernels (bodies run by the generic kernels of cuda_common.cuh), then launchers.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <math_constants.h>

#include "core/convert.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/functors.h"
#include "kernels/row_functors.h"

namespace ampscope::cuda {
namespace {

// ---- kernels: rows (one warp per row) ------------------------------------------------------------

template <class T>
struct SumRowsBody {
  const T* in;
  T* out;
  std::int64_t cols;
  acc_type<T> factor, divisor;
  __device__ void operator()(std::int64_t r, int lane) const {
    const WarpRow team{lane};
    const T s = sum_row(team, in + r * cols, cols, factor, divisor);
    if (team.leader()) out[r] = s;
  }
};

template <class T, bool kLog>
struct SoftmaxRowsBody {
  const T* in;
  T* out;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r, int lane) const {
    softmax_row<kLog>(WarpRow{lane}, in + r * cols, out + r * cols, cols);
  }
};

template <class T, bool kLog>
struct SoftmaxBackwardRowsBody {
  const T* g;
  const T* y;
  T* out;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r, int lane) const {
    softmax_backward_row<kLog>(WarpRow{lane}, g + r * cols, y + r * cols, out + r * cols, cols);
  }
};

template <class T>
struct LayerNormRowsBody {
  const T* x;
  const T* w;     // may be null
  const T* bias;  // may be null
  T* out;
  acc_type<T>* mean_out;
  acc_type<T>* rstd_out;
  std::int64_t cols;
  acc_type<T> eps;
  __device__ void operator()(std::int64_t r, int lane) const {
    layer_norm_row(WarpRow{lane}, x + r * cols, w, bias, out + r * cols, cols, eps, mean_out + r, rstd_out + r);
  }
};

template <class T>
struct LayerNormBackwardRowsBody {
  const T* g;
  const T* x;
  const acc_type<T>* mean;
  const acc_type<T>* rstd;
  const T* w;  // may be null
  T* out;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r, int lane) const {
    layer_norm_backward_row(WarpRow{lane}, g + r * cols, x + r * cols, w, out + r * cols, cols, mean[r], rstd[r]);
  }
};

// ---- kernels: one thread per output element ------------------------------------------------------

template <class T>
struct ArgmaxRowsBody {
  const T* in;
  std::int64_t* out;
  std::int64_t cols;
  __device__ void operator()(std::int64_t r) const { out[r] = argmax_row(in + r * cols, cols); }
};

// ---- kernels: rows of the loss-writing reductions (one thread per row; kernels/row_functors.h's row
// math, so the CPU's order and bits) ----

template <class T, bool kMax>
struct ExtremeRowsBody {
  const T* in;
  T* out;
  std::int64_t* index;  // may be null
  std::int64_t cols;
  __device__ void operator()(std::int64_t r) const {
    const T* row = in + r * cols;
    const std::int64_t j = row_extreme_index<kMax, acc_type<T>>(row, cols);
    out[r] = row[j];
    if (index) index[r] = j;
  }
};

template <class T>
struct VarRowsBody {
  const T* in;
  T* out;
  std::int64_t cols;
  acc_type<T> correction;
  bool take_sqrt;
  __device__ void operator()(std::int64_t r) const {
    const acc_type<T> v = row_variance<acc_type<T>>(in + r * cols, cols, correction);
    out[r] = convert<T>(canonical_nan(take_sqrt ? std::sqrt(v) : v));
  }
};

template <class T>
struct EvenlyDistributeRowsBody {
  const T* g;
  const T* x;
  const T* v;
  T* out;
  std::int64_t cols;
  bool nan_matches;
  __device__ void operator()(std::int64_t r) const {
    using Acc = acc_type<T>;
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
};

template <class T>
struct IndexBackwardRowsBody {
  const T* g;
  const std::int64_t* index;
  T* out;
  std::int64_t cols;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = i / cols, j = i % cols;
    out[i] = j == index[r] ? g[r] : convert<T>(0.0);
  }
};

// One thread per column, rows in order (kernels/row_functors.h).
template <class T>
struct LayerNormParamGradBody {
  const T* g;
  const T* x;
  const acc_type<T>* mean;
  const acc_type<T>* rstd;
  T* dw;
  T* db;
  std::int64_t rows, cols;
  __device__ void operator()(std::int64_t c) const { layer_norm_param_grad_column(g, x, mean, rstd, rows, cols, c, dw, db); }
};

struct Window {
  std::int64_t kh, kw, sh, sw, ph, pw;
};
Window window_of(const KernelArgs& a) {
  return {static_cast<std::int64_t>(a.scalars[0]), static_cast<std::int64_t>(a.scalars[1]),
          static_cast<std::int64_t>(a.scalars[2]), static_cast<std::int64_t>(a.scalars[3]),
          static_cast<std::int64_t>(a.scalars[4]), static_cast<std::int64_t>(a.scalars[5])};
}

// cols [N, C*KH*KW, L] from x [N, C, H, W]; padding reads as zero. Element i = ((nc * KH + ki) * KW + kj) * L + l.
template <class T>
struct Im2colBody {
  const T* in;
  T* out;
  Window w;
  std::int64_t H, W, L, OW;
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t l = i % L;
    const std::int64_t kk = (i / L) % (w.kh * w.kw);
    const std::int64_t nc = i / (L * w.kh * w.kw);
    const std::int64_t ki = kk / w.kw, kj = kk % w.kw;
    const std::int64_t h = (l / OW) * w.sh - w.ph + ki, x = (l % OW) * w.sw - w.pw + kj;
    out[i] = (h >= 0 && h < H && x >= 0 && x < W) ? in[nc * H * W + h * W + x] : convert<T>(0.0);
  }
};

// dx[n, c, h, x] = the column entries that read it, summed kernel rows first, then kernel columns.
template <class T>
struct Col2imBody {
  const T* cols;
  T* out;
  Window w;
  std::int64_t H, W, OH, OW;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    const std::int64_t x = i % W, h = (i / W) % H, nc = i / (H * W);
    const T* rows = cols + nc * w.kh * w.kw * OH * OW;
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
    out[i] = convert<T>(canonical_nan(s));
  }
};

// NaN wins, as in PyTorch: a NaN replaces the running maximum whenever it is met.
template <class T>
struct MaxPoolBody {
  const T* in;
  T* out;
  std::int64_t* idx;
  Window w;
  std::int64_t H, W, OH, OW;
  __device__ void operator()(std::int64_t o) const {
    using Acc = acc_type<T>;
    const std::int64_t ow = o % OW, oh = (o / OW) % OH, nc = o / (OH * OW);
    const T* plane = in + nc * H * W;
    const std::int64_t h0 = oh * w.sh - w.ph, w0 = ow * w.sw - w.pw;
    const std::int64_t h_begin = h0 > 0 ? h0 : 0, w_begin = w0 > 0 ? w0 : 0;
    const std::int64_t h_end = h0 + w.kh < H ? h0 + w.kh : H, w_end = w0 + w.kw < W ? w0 + w.kw : W;
    Acc m = minus_infinity<Acc>();
    std::int64_t best = h_begin * W + w_begin;
    for (std::int64_t h = h_begin; h < h_end; ++h) {
      for (std::int64_t c = w_begin; c < w_end; ++c) {
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
};

// Each input element gathers the gradients of the windows whose maximum it was, windows in order.
template <class T>
struct MaxPoolBackwardBody {
  const T* g;
  const std::int64_t* idx;
  T* out;
  Window w;
  std::int64_t H, W, OH, OW;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    const std::int64_t x = i % W, h = (i / W) % H, nc = i / (H * W);
    const T* gp = g + nc * OH * OW;
    const std::int64_t* ip = idx + nc * OH * OW;
    const std::int64_t ph0 = (h + w.ph < w.kh) ? 0 : (h + w.ph - w.kh) / w.sh + 1;
    const std::int64_t ph1 = (h + w.ph) / w.sh + 1 < OH ? (h + w.ph) / w.sh + 1 : OH;
    const std::int64_t pw0 = (x + w.pw < w.kw) ? 0 : (x + w.pw - w.kw) / w.sw + 1;
    const std::int64_t pw1 = (x + w.pw) / w.sw + 1 < OW ? (x + w.pw) / w.sw + 1 : OW;
    Acc s = 0;
    for (std::int64_t oh = ph0; oh < ph1; ++oh) {
      for (std::int64_t ow = pw0; ow < pw1; ++ow) {
        if (ip[oh * OW + ow] == h * W + x) s += convert<Acc>(gp[oh * OW + ow]);
      }
    }
    out[i] = convert<T>(canonical_nan(s));
  }
};

template <class T>
struct EmbeddingBody {
  const T* weight;
  const std::int64_t* index;
  T* out;
  std::int64_t d, rows;
  // An out-of-range index (reported by the index check, launch_index_check) reads nothing: its row is NaN.
  __device__ void operator()(std::int64_t i) const {
    const std::int64_t r = index[i / d];
    out[i] = r >= 0 && r < rows ? weight[r * d + i % d] : convert<T>(CUDART_NAN);
  }
};

// One thread per embedding column j adds the gradient rows into acc in index order: the CPU's order,
// and no two threads ever write the same element, so no atomics.
template <class T>
struct EmbeddingBackwardBody {
  const T* g;
  const std::int64_t* index;
  acc_type<T>* acc;
  std::int64_t n, d, rows;
  __device__ void operator()(std::int64_t j) const {
    for (std::int64_t i = 0; i < n; ++i) {
      if (index[i] < 0 || index[i] >= rows) continue;  // reported by the index check; written nowhere
      acc[index[i] * d + j] += convert<acc_type<T>>(g[i * d + j]);
    }
  }
};

// out[i] = round(canonical(acc[i])); acc may be out itself (f32, f64), read and written by one thread.
template <class T>
struct RoundAccBody {
  const acc_type<T>* acc;
  T* out;
  __device__ void operator()(std::int64_t i) const { out[i] = convert<T>(canonical_nan(acc[i])); }
};

template <class T>
struct NllRowsBody {
  const T* logp;
  const std::int64_t* target;
  T* out;
  std::int64_t cols, ignore;
  __device__ void operator()(std::int64_t r) const {
    const std::int64_t t = target[r];
    // An out-of-range target (reported by the index check) reads nothing: NaN.
    out[r] = t == ignore                ? convert<T>(0.0)
             : (t < 0 || t >= cols)     ? convert<T>(CUDART_NAN)
                                        : convert<T>(canonical_nan(-convert<acc_type<T>>(logp[r * cols + t])));
  }
};

template <class T>
struct NllBackwardRowsBody {
  const T* g;
  std::int64_t gstride;
  const std::int64_t* target;
  T* out;
  std::int64_t cols, ignore;
  acc_type<T> divisor;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    const std::int64_t r = i / cols, c = i % cols;
    const std::int64_t t = target[r];
    out[i] = (t != ignore && c == t) ? convert<T>(canonical_nan(-convert<Acc>(g[r * gstride]) / divisor)) : convert<T>(0.0);
  }
};

// out = round(c + bias) per element of a [B, M, N] product held in the accumulation type.
template <class T>
struct GemmEpilogueBody {
  const acc_type<T>* c;
  const acc_type<T>* bias;  // null without bias
  T* out;
  bool bias_per_row;
  std::int64_t m, n;
  __device__ void operator()(std::int64_t i) const {
    acc_type<T> v = c[i];
    if (bias) {
      const std::int64_t within = i % (m * n);
      v += bias[bias_per_row ? within / n : within % n];
    }
    out[i] = convert<T>(canonical_nan(v));
  }
};

// ---- launchers -----------------------------------------------------------------------------------

template <class T>
cudaError_t launch_nn_typed(Op op, const KernelArgs& a, cudaStream_t s) {
  using Acc = acc_type<T>;
  const TensorView& x = a.in[0];
  switch (op) {
    case Op::sum_rows:
      return launch_warp_rows(x.sizes[0],
                              SumRowsBody<T>{x.ptr<T>(), a.out.ptr<T>(), x.sizes[1], static_cast<Acc>(a.scalars[0]),
                                             static_cast<Acc>(a.scalars[1])},
                              s);
    case Op::softmax_rows:
      return launch_warp_rows(x.sizes[0], SoftmaxRowsBody<T, false>{x.ptr<T>(), a.out.ptr<T>(), x.sizes[1]}, s);
    case Op::log_softmax_rows:
      return launch_warp_rows(x.sizes[0], SoftmaxRowsBody<T, true>{x.ptr<T>(), a.out.ptr<T>(), x.sizes[1]}, s);
    case Op::softmax_backward_rows:
      return launch_warp_rows(
          x.sizes[0], SoftmaxBackwardRowsBody<T, false>{x.ptr<T>(), a.in[1].ptr<T>(), a.out.ptr<T>(), x.sizes[1]}, s);
    case Op::log_softmax_backward_rows:
      return launch_warp_rows(
          x.sizes[0], SoftmaxBackwardRowsBody<T, true>{x.ptr<T>(), a.in[1].ptr<T>(), a.out.ptr<T>(), x.sizes[1]}, s);
    case Op::layer_norm_rows:
      return launch_warp_rows(
          x.sizes[0],
          LayerNormRowsBody<T>{x.ptr<T>(), a.in[1].data ? a.in[1].ptr<T>() : nullptr,
                               a.in[2].data ? a.in[2].ptr<T>() : nullptr, a.out.ptr<T>(), a.aux[0].ptr<Acc>(),
                               a.aux[1].ptr<Acc>(), x.sizes[1], static_cast<Acc>(a.scalars[0])},
          s);
    case Op::layer_norm_backward_rows:
      return launch_warp_rows(
          a.in[1].sizes[0],
          LayerNormBackwardRowsBody<T>{x.ptr<T>(), a.in[1].ptr<T>(), a.in[2].ptr<Acc>(), a.in[3].ptr<Acc>(),
                                       a.in[4].data ? a.in[4].ptr<T>() : nullptr, a.out.ptr<T>(), a.in[1].sizes[1]},
          s);
    case Op::layer_norm_param_grad:
      return launch_linear(a.in[1].sizes[1],
                           LayerNormParamGradBody<T>{x.ptr<T>(), a.in[1].ptr<T>(), a.in[2].ptr<Acc>(),
                                                     a.in[3].ptr<Acc>(), a.out.ptr<T>(), a.aux[0].ptr<T>(),
                                                     a.in[1].sizes[0], a.in[1].sizes[1]},
                           s);
    case Op::im2col: {
      const Window w = window_of(a);
      const std::int64_t W = x.sizes[3];
      return launch_linear(a.out.numel,
                           Im2colBody<T>{x.ptr<T>(), a.out.ptr<T>(), w, x.sizes[2], W, a.out.sizes[2],
                                         (W + 2 * w.pw - w.kw) / w.sw + 1},
                           s);
    }
    case Op::col2im: {
      const Window w = window_of(a);
      const std::int64_t H = a.out.sizes[2], W = a.out.sizes[3];
      return launch_linear(a.out.numel,
                           Col2imBody<T>{x.ptr<T>(), a.out.ptr<T>(), w, H, W, (H + 2 * w.ph - w.kh) / w.sh + 1,
                                         (W + 2 * w.pw - w.kw) / w.sw + 1},
                           s);
    }
    case Op::max_pool2d:
      return launch_linear(a.out.numel,
                           MaxPoolBody<T>{x.ptr<T>(), a.out.ptr<T>(), a.aux[0].ptr<std::int64_t>(), window_of(a),
                                          x.sizes[2], x.sizes[3], a.out.sizes[2], a.out.sizes[3]},
                           s);
    case Op::max_pool2d_backward:
      return launch_linear(a.out.numel,
                           MaxPoolBackwardBody<T>{x.ptr<T>(), a.in[1].ptr<std::int64_t>(), a.out.ptr<T>(), window_of(a),
                                                  a.out.sizes[2], a.out.sizes[3], x.sizes[2], x.sizes[3]},
                           s);
    case Op::embedding:
      return launch_linear(a.out.numel,
                           EmbeddingBody<T>{x.ptr<T>(), a.in[1].ptr<std::int64_t>(), a.out.ptr<T>(), x.sizes[1], x.sizes[0]},
                           s);
    case Op::nll_rows:
      return launch_linear(x.sizes[0],
                           NllRowsBody<T>{x.ptr<T>(), a.in[1].ptr<std::int64_t>(), a.out.ptr<T>(), x.sizes[1],
                                          static_cast<std::int64_t>(a.scalars[0])},
                           s);
    case Op::nll_backward_rows:
      return launch_linear(a.out.numel,
                           NllBackwardRowsBody<T>{x.ptr<T>(), x.strides[0], a.in[1].ptr<std::int64_t>(), a.out.ptr<T>(),
                                                  a.out.sizes[1], static_cast<std::int64_t>(a.scalars[0]),
                                                  static_cast<Acc>(a.scalars[1])},
                           s);
    case Op::max_rows:
      return launch_linear(x.sizes[0],
                           ExtremeRowsBody<T, true>{x.ptr<T>(), a.out.ptr<T>(),
                                                    a.aux[0].data ? a.aux[0].ptr<std::int64_t>() : nullptr, x.sizes[1]},
                           s);
    case Op::min_rows:
      return launch_linear(x.sizes[0],
                           ExtremeRowsBody<T, false>{x.ptr<T>(), a.out.ptr<T>(),
                                                     a.aux[0].data ? a.aux[0].ptr<std::int64_t>() : nullptr, x.sizes[1]},
                           s);
    case Op::var_rows:
      return launch_linear(x.sizes[0],
                           VarRowsBody<T>{x.ptr<T>(), a.out.ptr<T>(), x.sizes[1], static_cast<Acc>(a.scalars[0]),
                                          a.scalars[1] == 1.0},
                           s);
    case Op::evenly_distribute_rows:
      return launch_linear(a.in[1].sizes[0],
                           EvenlyDistributeRowsBody<T>{x.ptr<T>(), a.in[1].ptr<T>(), a.in[2].ptr<T>(), a.out.ptr<T>(),
                                                       a.in[1].sizes[1], a.scalars[0] == 1.0},
                           s);
    case Op::index_backward_rows:
      return launch_linear(a.out.numel,
                           IndexBackwardRowsBody<T>{x.ptr<T>(), a.in[1].ptr<std::int64_t>(), a.out.ptr<T>(),
                                                    a.out.sizes[1]},
                           s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool is_nn_op(Op op) {
  switch (op) {
    case Op::sum_rows: case Op::argmax_rows: case Op::softmax_rows: case Op::log_softmax_rows:
    case Op::softmax_backward_rows: case Op::log_softmax_backward_rows: case Op::layer_norm_rows:
    case Op::layer_norm_backward_rows: case Op::layer_norm_param_grad: case Op::im2col: case Op::col2im:
    case Op::max_pool2d: case Op::max_pool2d_backward: case Op::embedding: case Op::nll_rows:
    case Op::nll_backward_rows: case Op::max_rows: case Op::min_rows: case Op::var_rows:
    case Op::evenly_distribute_rows: case Op::index_backward_rows:
      return true;
    default:
      return false;
  }
}

cudaError_t launch_nn(Op op, const KernelArgs& a, cudaStream_t s) {
  if (op == Op::argmax_rows) {  // chosen by its i64 output; the input's dtype is dispatched here
    return visit_dtype(a.in[0].dtype, [&](auto tag) -> cudaError_t {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        return cudaErrorInvalidValue;
      } else {
        return launch_linear(a.in[0].sizes[0],
                             ArgmaxRowsBody<T>{a.in[0].ptr<T>(), a.out.ptr<std::int64_t>(), a.in[0].sizes[1]}, s);
      }
    });
  }
  return visit_dtype(a.out.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;  // never registered for non-floating dtypes
    } else {
      return launch_nn_typed<T>(op, a, s);
    }
  });
}

cudaError_t launch_embedding_backward(const KernelArgs& a, void* acc, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;
    } else {
      using Acc = acc_type<T>;
      const std::int64_t n = a.in[1].numel, d = a.out.sizes[1];
      auto* acc_p = static_cast<Acc*>(acc);
      cudaError_t status = cudaMemsetAsync(acc_p, 0, static_cast<std::size_t>(a.out.numel) * sizeof(Acc), s);
      if (status != cudaSuccess) return status;
      status = launch_linear(d, EmbeddingBackwardBody<T>{a.in[0].ptr<T>(), a.in[1].ptr<std::int64_t>(), acc_p, n, d, a.out.sizes[0]},
                           s);
      if (status != cudaSuccess) return status;
      return launch_linear(a.out.numel, RoundAccBody<T>{acc_p, a.out.ptr<T>()}, s);
    }
  });
}

cudaError_t launch_gemm_epilogue(const GemmEpilogue& e, cudaStream_t s) {
  return visit_dtype(e.out.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;
    } else {
      using Acc = acc_type<T>;
      return launch_linear(e.out.numel,
                           GemmEpilogueBody<T>{static_cast<const Acc*>(e.acc), static_cast<const Acc*>(e.bias),
                                               e.out.ptr<T>(), e.bias_per_row, e.m, e.n},
                           s);
    }
  });
}

// ---- the device-side index check (cuda_launch.h, IndexCheck) ----
namespace {

// Lowers record->first_position to the smallest out-of-range position, while no earlier check has
// recorded an error (the first error is kept until the host reads it).
__global__ void index_check_kernel(const std::int64_t* indices, std::int64_t n, std::int64_t limit,
                                   std::int64_t ignore, bool has_ignore, IndexCheckRecord* record) {
  if (record->launch != 0) return;
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t v = indices[i];
    if (has_ignore && v == ignore) continue;
    if (v < 0 || v >= limit) atomicMin(&record->first_position, static_cast<unsigned long long>(i));
  }
}

// One thread: names the error found by index_check_kernel (the index at the smallest position, the
// limit, and the launch it belongs to). The indices are still alive: stream order.
__global__ void index_check_finish_kernel(const std::int64_t* indices, std::int64_t limit, std::uint64_t launch,
                                          IndexCheckRecord* record) {
  if (record->launch != 0 || record->first_position == kIndexCheckNone) return;
  record->index = indices[record->first_position];
  record->limit = limit;
  record->launch = launch;
}

}  // namespace

cudaError_t launch_index_check(const IndexCheck& c, IndexCheckRecord* record, IndexCheckRecord* host_copy,
                               cudaStream_t s) {
  if (c.n > 0) {
    const std::int64_t blocks = linear_blocks(c.n);
    index_check_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(c.indices, c.n, c.limit, c.ignore,
                                                                          c.has_ignore, record);
    if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
    index_check_finish_kernel<<<1, 1, 0, s>>>(c.indices, c.limit, c.launch, record);
    if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  }
  // The record reaches pinned host memory behind the check, so that whoever synchronises next reads it
  // there without another wait.
  return cudaMemcpyAsync(host_copy, record, sizeof(IndexCheckRecord), cudaMemcpyDeviceToHost, s);
}

// ---- nll_loss's mean divisor (cuda_launch.h, launch_count_not_equal) ----
namespace {

constexpr int kCountThreads = 256;

// One block: each thread counts its stride of the indices in 64-bit integers, the block adds the counts
// (integers: the order does not matter), and thread 0 rounds the total once to Out, as the CPU's
// static_cast<Acc>(count) does (a conversion in the default round-to-nearest-even mode).
template <class Out>
__global__ void count_not_equal_kernel(const std::int64_t* indices, std::int64_t n, std::int64_t ignore, Out* out) {
  __shared__ unsigned long long partial[kCountThreads];
  unsigned long long count = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += kCountThreads) count += indices[i] != ignore ? 1u : 0u;
  partial[threadIdx.x] = count;
  __syncthreads();
  for (int width = kCountThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = static_cast<Out>(static_cast<std::int64_t>(partial[0]));
}

}  // namespace

cudaError_t launch_count_not_equal(const std::int64_t* indices, std::int64_t n, std::int64_t ignore, void* out,
                                   bool f64, cudaStream_t s) {
  if (f64) {
    count_not_equal_kernel<double><<<1, kCountThreads, 0, s>>>(indices, n, ignore, static_cast<double*>(out));
  } else {
    count_not_equal_kernel<float><<<1, kCountThreads, 0, s>>>(indices, n, ignore, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

}  // namespace ampscope::cuda
