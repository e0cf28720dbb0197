// kernels/row_functors.h: the row ops (sum_rows, argmax, softmax and log_softmax with their backward,
// layer norm with its input and parameter gradients, and the rows of the loss-writing reductions), each
// written once as a __host__ __device__ function over one row. The CPU backend (kernels/cpu/nn_kernels.cpp)
// calls them with a SerialRow, one thread walking the row; the CUDA backend (kernels/cuda/cuda_nn_kernels.cu)
// with a WarpRow (kernels/cuda/cuda_common.cuh), one warp of 32 lanes sharing it. The team decides only who
// handles which element; what is computed, in which order it is added and how it is rounded is the row
// function's, and the CPU tests run that code (tests/kernels/row_functors_test.cpp drives it serially
// against f64 references).
//
//   softmax_row<false>(SerialRow{}, x, y, n);            // y = softmax(x) over n elements
//   softmax_row<false>(WarpRow{lane}, x, y, n);          // the same, each lane taking j = lane, lane + 32, ...
//
// A team has four members, each called by every thread of the team:
//   sum<Acc>(n, load)   load(0) + ... + load(n - 1) in lane_tree_sum's order (kernels/functors.h); every
//                       thread gets the result.
//   max<Acc>(n, load)   the first NaN among the loads if there is one, else the first largest value
//                       (-inf for n = 0); every thread gets it.
//   for_each(n, f)      f(j) once for every j < n, by some thread of the team.
//   leader()            true on exactly one thread: the one that stores a row's single results.
// The GPU cannot add a row sequentially in parallel, so the order of additions is the warp's: lane k adds
// elements k, k + 32, ... from +0, then the 32 partial sums fold in halves. SerialRow performs exactly those
// additions in that order (lane_tree_sum), so the GPU's sums are the CPU's bits (docs/numerics.md).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/convert.h"
#include "kernels/functors.h"

namespace ampscope {

// ---- the serial team (the CPU backend, and the tests) ----

struct SerialRow {
  template <class Acc, class Load>
  AMPSCOPE_HD Acc sum(std::int64_t n, const Load& load) const {
    return lane_tree_sum<Acc>(n, load);
  }
  // A NaN ends the scan: it is the answer, whatever follows.
  template <class Acc, class Load>
  AMPSCOPE_HD Acc max(std::int64_t n, const Load& load) const {
    Acc m = minus_infinity<Acc>();
    for (std::int64_t j = 0; j < n; ++j) {
      const Acc v = load(j);
      if (v != v) return v;
      if (v > m) m = v;
    }
    return m;
  }
  template <class F>
  AMPSCOPE_HD void for_each(std::int64_t n, const F& f) const {
    for (std::int64_t j = 0; j < n; ++j) f(j);
  }
  AMPSCOPE_HD bool leader() const { return true; }
};

// ---- pieces of the parallel row sum and maximum (the GPU's WarpRow; tests/kernels replays them serially) ----

// One thread's share of a row sum: elements first, first + stride, ... added in turn from +0. With
// first = lane and stride = 32 it is lane_tree_sum's lane `first`, before the lanes are folded.
template <class Acc, class Load>
AMPSCOPE_HD inline Acc strided_partial_sum(std::int64_t first, std::int64_t stride, std::int64_t n, const Load& load) {
  Acc s = Acc(0);
  for (std::int64_t j = first; j < n; j += stride) s += load(j);
  return s;
}

// One thread's candidate for the row maximum: its value and the element index it came from (kNoIndex
// when the thread saw no element).
template <class Acc>
struct MaxCandidate {
  static constexpr long long kNoIndex = 0x7FFFFFFFFFFFFFFFll;
  Acc value;
  long long index;
};

// The candidate of the thread that reads elements first, first + stride, ...: SerialRow::max over its
// elements, remembering where the answer came from.
template <class Acc, class Load>
AMPSCOPE_HD inline MaxCandidate<Acc> strided_max_candidate(std::int64_t first, std::int64_t stride, std::int64_t n,
                                                           const Load& load) {
  MaxCandidate<Acc> c{minus_infinity<Acc>(), MaxCandidate<Acc>::kNoIndex};
  for (std::int64_t j = first; j < n; j += stride) {
    const Acc v = load(j);
    if (v != v) return {v, j};
    if (v > c.value) c = {v, j};
  }
  return c;
}

// Whether candidate b replaces a when two threads' candidates are combined, so that any tree of
// combinations ends at SerialRow::max's answer: a NaN beats any number, and the earlier of two NaNs
// wins; otherwise the larger value, and the earlier of equal ones (so -0 and +0 resolve as on the CPU).
template <class Acc>
AMPSCOPE_HD inline bool replaces_max(const MaxCandidate<Acc>& b, const MaxCandidate<Acc>& a) {
  const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
  if (a_nan || b_nan) return b_nan && (!a_nan || b.index < a.index);
  return b.value > a.value || (b.value == a.value && b.index < a.index);
}

// ---- loads ----

template <class Acc, class T>
struct RowLoad {
  const T* row;
  AMPSCOPE_HD Acc operator()(std::int64_t j) const { return convert<Acc>(row[j]); }
};
template <class Acc, class T>
struct RowSquaredDeviation {
  const T* row;
  Acc mean;
  AMPSCOPE_HD Acc operator()(std::int64_t j) const {
    const Acc d = convert<Acc>(row[j]) - mean;
    return d * d;
  }
};

// ---- the row ops: forward ----

// sum(row) * factor / divisor (sum_rows: sum, mean), rounded once; returned to every thread, stored by
// the caller's leader.
template <class T, class Team>
AMPSCOPE_HD inline T sum_row(const Team& team, const T* x, std::int64_t n, acc_type<T> factor, acc_type<T> divisor) {
  using Acc = acc_type<T>;
  const Acc s = team.template sum<Acc>(n, RowLoad<Acc, T>{x});
  return convert<T>(canonical_nan(s * factor / divisor));
}

// softmax: y = exp(x - max) / sum(exp(x - max)); log_softmax: y = x - max - log(sum(exp(x - max))). A NaN
// anywhere in the row makes max NaN, and so every output (PyTorch's kernels do the same).
template <bool kLog, class T, class Team>
AMPSCOPE_HD inline void softmax_row(const Team& team, const T* x, T* y, std::int64_t n) {
  using Acc = acc_type<T>;
  const Acc m = team.template max<Acc>(n, RowLoad<Acc, T>{x});
  const Acc sum = team.template sum<Acc>(n, [&](std::int64_t j) { return std::exp(convert<Acc>(x[j]) - m); });
  if constexpr (kLog) {
    const Acc log_sum = std::log(sum);
    team.for_each(n, [&](std::int64_t j) { y[j] = convert<T>(canonical_nan(convert<Acc>(x[j]) - m - log_sum)); });
  } else {
    team.for_each(n, [&](std::int64_t j) { y[j] = convert<T>(canonical_nan(std::exp(convert<Acc>(x[j]) - m) / sum)); });
  }
}

// y = (x - mean) * rstd * w + b (w, b optional: null), mean and rstd = 1 / sqrt(var + eps) from two passes
// (the mean, then the mean of squared deviations: the biased variance), kept unrounded in Acc for the
// backward pass: the leader stores them to *mean_out and *rstd_out.
template <class T, class Team>
AMPSCOPE_HD inline void layer_norm_row(const Team& team, const T* x, const T* w, const T* b, T* y, std::int64_t n,
                                       acc_type<T> eps, acc_type<T>* mean_out, acc_type<T>* rstd_out) {
  using Acc = acc_type<T>;
  const Acc count = static_cast<Acc>(n);
  const Acc mean = team.template sum<Acc>(n, RowLoad<Acc, T>{x}) / count;
  const Acc var = team.template sum<Acc>(n, RowSquaredDeviation<Acc, T>{x, mean}) / count;
  const Acc rstd = Acc(1) / std::sqrt(var + eps);
  if (team.leader()) {
    *mean_out = mean;
    *rstd_out = rstd;
  }
  team.for_each(n, [&](std::int64_t j) {
    Acc v = (convert<Acc>(x[j]) - mean) * rstd;
    if (w) v = v * convert<Acc>(w[j]);
    if (b) v = v + convert<Acc>(b[j]);
    y[j] = convert<T>(canonical_nan(v));
  });
}

// ---- the row ops: backward ----

// softmax: dx = y (g - sum(g y)); log_softmax: dx = g - exp(y) sum(g).
template <bool kLog, class T, class Team>
AMPSCOPE_HD inline void softmax_backward_row(const Team& team, const T* g, const T* y, T* dx, std::int64_t n) {
  using Acc = acc_type<T>;
  if constexpr (kLog) {
    const Acc s = team.template sum<Acc>(n, RowLoad<Acc, T>{g});
    team.for_each(n, [&](std::int64_t j) {
      dx[j] = convert<T>(canonical_nan(convert<Acc>(g[j]) - std::exp(convert<Acc>(y[j])) * s));
    });
  } else {
    const Acc s = team.template sum<Acc>(n, [&](std::int64_t j) { return convert<Acc>(g[j]) * convert<Acc>(y[j]); });
    team.for_each(n, [&](std::int64_t j) {
      dx[j] = convert<T>(canonical_nan(convert<Acc>(y[j]) * (convert<Acc>(g[j]) - s)));
    });
  }
}

// dx = rstd / n * (n * gw - sum(gw) - xhat * sum(gw * xhat)), gw = g * w (g without w), xhat = (x - mean) * rstd.
template <class T, class Team>
AMPSCOPE_HD inline void layer_norm_backward_row(const Team& team, const T* g, const T* x, const T* w, T* dx,
                                                std::int64_t n, acc_type<T> mean, acc_type<T> rstd) {
  using Acc = acc_type<T>;
  const Acc count = static_cast<Acc>(n);
  auto gw = [&](std::int64_t j) { return w ? convert<Acc>(g[j]) * convert<Acc>(w[j]) : convert<Acc>(g[j]); };
  auto xhat = [&](std::int64_t j) { return (convert<Acc>(x[j]) - mean) * rstd; };
  const Acc sum_gw = team.template sum<Acc>(n, gw);
  const Acc sum_gw_xhat = team.template sum<Acc>(n, [&](std::int64_t j) { return gw(j) * xhat(j); });
  team.for_each(n, [&](std::int64_t j) {
    dx[j] = convert<T>(canonical_nan(rstd / count * (count * gw(j) - sum_gw - xhat(j) * sum_gw_xhat)));
  });
}

// Column c of layer norm's parameter gradients: dw[c] = sum_r g[r, c] xhat[r, c], db[c] = sum_r g[r, c],
// rows added in order by one thread (on both backends: a column's rows are far apart in memory).
template <class T>
AMPSCOPE_HD inline void layer_norm_param_grad_column(const T* g, const T* x, const acc_type<T>* mean,
                                                     const acc_type<T>* rstd, std::int64_t rows, std::int64_t cols,
                                                     std::int64_t c, T* dw, T* db) {
  using Acc = acc_type<T>;
  Acc sw = 0, sb = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const Acc gv = convert<Acc>(g[r * cols + c]);
    sw += gv * ((convert<Acc>(x[r * cols + c]) - mean[r]) * rstd[r]);
    sb += gv;
  }
  dw[c] = convert<T>(canonical_nan(sw));
  db[c] = convert<T>(canonical_nan(sb));
}

// ---- rows of the loss-writing reductions and argmax: one thread per row on both backends ----

// Index of the first largest (kMax) or smallest value of a row; the first NaN if there is one (NaN
// counts as the extreme, as in PyTorch's max, min, argmax). n >= 1.
template <bool kMax, class Acc, class T>
AMPSCOPE_HD inline std::int64_t row_extreme_index(const T* row, std::int64_t n) {
  std::int64_t best = 0;
  Acc m = convert<Acc>(row[0]);
  for (std::int64_t j = 1; j < n && m == m; ++j) {
    const Acc v = convert<Acc>(row[j]);
    if (v != v || (kMax ? v > m : v < m)) {
      m = v;
      best = j;
    }
  }
  return best;
}

// argmax_rows: the first index of the row's maximum, the first NaN counting as the maximum; 0 for an
// empty row (core refuses argmax over an empty dimension before any kernel runs).
template <class T>
AMPSCOPE_HD inline std::int64_t argmax_row(const T* row, std::int64_t n) {
  return n < 1 ? 0 : row_extreme_index<true, acc_type<T>>(row, n);
}

// sum (x - mean)^2 / max(n - correction, 0) in two passes (the mean, then the squared deviations), each
// summed in lane_tree_sum's order: PyTorch's divisor, so correction >= n gives inf (or NaN for 0 / 0).
template <class Acc, class T>
AMPSCOPE_HD inline Acc row_variance(const T* row, std::int64_t n, Acc correction) {
  const Acc mean = lane_tree_sum<Acc>(n, RowLoad<Acc, T>{row}) / static_cast<Acc>(n);
  const Acc m2 = lane_tree_sum<Acc>(n, RowSquaredDeviation<Acc, T>{row, mean});
  const Acc dof = static_cast<Acc>(n) - correction;
  return m2 / (dof > Acc(0) ? dof : Acc(0));
}

// Whether x is one of the elements that reduced to v: equal (so -0 and +0 both), or both NaN when
// NaN counts (the full max/min; amax/amin compare with == only, as PyTorch does).
template <class Acc>
AMPSCOPE_HD inline bool selected_by(Acc x, Acc v, bool nan_matches) {
  return x == v || (nan_matches && x != x && v != v);
}

}  // namespace ampscope
