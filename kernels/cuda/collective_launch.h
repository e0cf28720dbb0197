// kernels/cuda/collective_launch.h: the launcher of kernels/cuda/collective_kernels.cu (used by
// nccl_communicator.cpp for max, which NCCL's own ncclMax computes with fmaxf and so loses NaN).
//
//   check(launch_rank_fold_max(DType::f32, gathered, size, n, rank * m, m, out, stream));
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace ampscope::cuda {

// out[i] = rank_fold_max over p of parts[p * stride + offset + i], for i < n (kernels/rank_fold.h): the
// MPI group's max bit for bit. parts holds nparts blocks of `stride` elements of `dtype` (f32, f64, f16,
// bf16, i64; cudaErrorInvalidValue for another). Queued on `stream`.
cudaError_t launch_rank_fold_max(DType dtype, const void* parts, int nparts, std::int64_t stride, std::int64_t offset,
                                 std::int64_t n, void* out, cudaStream_t stream);

}  // namespace ampscope::cuda
