// kernels/cuda/collective_kernels.cu: the rank fold of a max collective (kernels/cuda/collective_launch.h).
#include "kernels/cuda/collective_launch.h"

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/rank_fold.h"

namespace ampscope::cuda {

namespace {

template <class S, class Widen>
struct FoldBody {
  const S* base;
  int nparts;
  std::int64_t stride;
  S* dst;
  __device__ void operator()(std::int64_t i) const { dst[i] = rank_fold_max(base, nparts, stride, i, Widen{}); }
};

template <class S, class Widen>
cudaError_t fold(const void* parts, int nparts, std::int64_t stride, std::int64_t offset, std::int64_t n, void* out,
                 cudaStream_t stream) {
  return launch_linear(n, FoldBody<S, Widen>{static_cast<const S*>(parts) + offset, nparts, stride, static_cast<S*>(out)},
                       stream);
}

}  // namespace

cudaError_t launch_rank_fold_max(DType dtype, const void* parts, int nparts, std::int64_t stride, std::int64_t offset,
                                 std::int64_t n, void* out, cudaStream_t stream) {
  if (nparts < 1) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::f32: return fold<float, WidenSame>(parts, nparts, stride, offset, n, out, stream);
    case DType::f64: return fold<double, WidenSame>(parts, nparts, stride, offset, n, out, stream);
    case DType::f16: return fold<std::uint16_t, WidenF16Bits>(parts, nparts, stride, offset, n, out, stream);
    case DType::bf16: return fold<std::uint16_t, WidenBf16Bits>(parts, nparts, stride, offset, n, out, stream);
    case DType::i64: return fold<std::int64_t, WidenSame>(parts, nparts, stride, offset, n, out, stream);
    case DType::boolean: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace ampscope::cuda
