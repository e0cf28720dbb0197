// kernels/cuda/cuda_launch.h: the launchers of kernels/cuda/cuda_kernels.cu and cuda_nn_kernels.cu, the
// only way into them. Each takes the stream to run on and returns the launch status (cudaGetLastError)
// for the caller to check; no exceptions cross the .cu boundary (nvcc 13 fails on fmt 9 at C++20).
//
//   if (cuda::is_elementwise_op(op)) check(cuda::launch_elementwise(op, args, stream), "softmax_rows");
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace ampscope::cuda {

// ---- cuda_kernels.cu: creation, copies, element-wise ops ----
cudaError_t launch_fill(const KernelArgs& args, cudaStream_t stream);
// Any dtype to any dtype, through any strides of out and in[0] (also packs gemm operands).
cudaError_t launch_copy(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_arange(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_uniform(const KernelArgs& args, cudaStream_t stream);
cudaError_t launch_normal(const KernelArgs& args, cudaStream_t stream);
// The element-wise ops: arithmetic, unary math, where/masked_fill, the backward functors, the binary
// cross-entropy losses, dropout and masked_scale, and the loss ops (rsub, reciprocal, abs, log1p, expm1,
// logsigmoid, softplus, maximum, minimum and their backward), silu and its backward. Floating output
// dtypes only.
bool is_elementwise_op(Op op);
cudaError_t launch_elementwise(Op op, const KernelArgs& args, cudaStream_t stream);

// ---- cuda_nn_kernels.cu: rows, windows, embedding, nll ----
// sum_rows, argmax_rows, softmax/log_softmax (+ backward), layer_norm (+ backward, param grad), im2col,
// col2im, max_pool2d (+ backward), embedding, nll_rows (+ backward), max_rows, min_rows, var_rows,
// evenly_distribute_rows, index_backward_rows.
bool is_nn_op(Op op);
cudaError_t launch_nn(Op op, const KernelArgs& args, cudaStream_t stream);
// embedding_backward: `acc` is out.numel elements of the accumulation type (out itself for f32/f64); it
// is zeroed here, summed into in index order, then rounded into out.
cudaError_t launch_embedding_backward(const KernelArgs& args, void* acc, cudaStream_t stream);

// ---- the device-side index check of embedding, embedding_backward, nll_rows and nll_backward_rows ----
// Indices are checked on the device, behind the work queued before them, instead of being copied to the
// host (a sync per op): the first out-of-range index lands in a device record, copied asynchronously to
// pinned host memory, which the backend reads at its next host synchronisation (cuda_backend.cpp,
// check_index_errors) and reports as IndexError naming the launch.
inline constexpr unsigned long long kIndexCheckNone = ~0ull;
struct IndexCheckRecord {
  unsigned long long first_position = kIndexCheckNone;  // the smallest out-of-range position
  std::int64_t index = 0;                                // the index found there
  std::int64_t limit = 0;                                // the valid range is [0, limit)
  std::uint64_t launch = 0;                              // the launch that found it (0: no error)
};
struct IndexCheck {
  const std::int64_t* indices = nullptr;
  std::int64_t n = 0;
  std::int64_t limit = 0;
  std::int64_t ignore = 0;  // an index skipped (nll's ignore_index) when has_ignore
  bool has_ignore = false;
  std::uint64_t launch = 1;  // non-zero: the backend's number for this launch
};
cudaError_t launch_index_check(const IndexCheck& check, IndexCheckRecord* record, IndexCheckRecord* host_copy,
                               cudaStream_t stream);

// nll_loss's mean divisor (Backend::count_not_equal): *out = the number of the n indices that differ from
// `ignore`, counted in 64-bit integers and rounded once to float (double when f64), in one block behind the
// work queued on `stream`. n may be 0 (then 0). The indices need not be in range (the nll kernels' own check
// reports those).
cudaError_t launch_count_not_equal(const std::int64_t* indices, std::int64_t n, std::int64_t ignore, void* out,
                                   bool f64, cudaStream_t stream);

// The last step of a matrix product: out[i] = round(acc[i] + bias), acc the [B, M, N] product in the
// accumulation type (float; double for f64 out), bias (or null) already in that type, one value per
// row (bias_per_row) or per column. acc may be out's own memory.
struct GemmEpilogue {
  TensorView out;
  const void* acc = nullptr;
  const void* bias = nullptr;
  bool bias_per_row = false;
  std::int64_t m = 0, n = 0;
};
cudaError_t launch_gemm_epilogue(const GemmEpilogue& epilogue, cudaStream_t stream);

}  // namespace ampscope::cuda
