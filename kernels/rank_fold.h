// kernels/rank_fold.h: the max of one element over the ranks of a collective, as a left fold in rank order
// (core/distributed/process_group.h's rule): NaN if any rank's element is NaN, and then the lowest rank's
// NaN with its bits; otherwise the largest value, a tie (+0 and -0) keeping the lower rank's. The MPI group
// folds so on the host (core/distributed/mpi_process_group.cpp); the NCCL communicator gathers the ranks'
// elements and folds them with this on the GPU (kernels/cuda/collective_kernels.cu), because NCCL's own max
// (fmaxf) drops a NaN. Elements are the dtype's storage (f16 and bf16 as their 16 bits) and compare through
// `widen`, which is exact.
//
//   float m = rank_fold_max(parts, 3, n, i, WidenSame{});   // parts[p * n + i], p = 0, 1, 2
#pragma once

#include <cstdint>

#include "core/float16.h"

namespace ampscope {

struct WidenSame {
  template <class T> AMPSCOPE_HD T operator()(T x) const { return x; }
};
struct WidenF16Bits {
  AMPSCOPE_HD float operator()(std::uint16_t b) const { return detail::f16_bits_to_float(b); }
};
struct WidenBf16Bits {
  AMPSCOPE_HD float operator()(std::uint16_t b) const { return detail::bf16_bits_to_float(b); }
};

// The fold of parts[p * stride + i] over p = 0 .. nparts - 1 (nparts >= 1).
template <class S, class Widen>
AMPSCOPE_HD S rank_fold_max(const S* parts, int nparts, std::int64_t stride, std::int64_t i, Widen widen) {
  S acc = parts[i];
  auto a = widen(acc);
  if (a != a) return acc;  // rank 0's NaN
  for (int p = 1; p < nparts; ++p) {
    const S x = parts[static_cast<std::int64_t>(p) * stride + i];
    const auto v = widen(x);
    if (v != v) return x;  // the lowest rank's NaN, its bits kept
    if (v > a) {
      acc = x;
      a = v;
    }
  }
  return acc;
}

}  // namespace ampscope
