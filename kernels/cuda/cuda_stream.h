// kernels/cuda/cuda_stream.h: the CUDA backend's stream, for the host code beside it (the fused AMP path,
// the statistics ring) that queues its own launches behind the backend's work instead of waiting for it.
//
//   const cudaStream_t s = cuda::backend_stream(backend);   // throws DeviceError for a non-CUDA backend
//   check(launch_fused_unscale(batch, found_inf, inv_scale, s), "fused_unscale");
#pragma once

#include <string>

#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace ampscope::cuda {

// The one stream every kernel of this CUDA backend runs on (cuda_backend.cpp). Throws DeviceError naming
// `who` when `backend` is not the CUDA backend.
cudaStream_t backend_stream(Backend& backend, const char* who);

// Names and clears an error an earlier call left in CUDA's last-error state before `what` is launched,
// the way the backend's dispatch does, so the new launch is not blamed for it.
void check_stale_error(const char* what);

struct IndexCheckRecord;  // cuda_launch.h
// The IndexError text of an out-of-range index the device check found in a launch of `op`: the text the
// host check of core/ops.cpp gives (embedding: "index I at position P is out of range for V embeddings";
// nll_rows, nll_backward_rows: "target T (row R) is out of bounds for C classes"), then a line naming the
// kernel whose check found it. Plain host code (tested without a GPU).
std::string index_error_text(Op op, const IndexCheckRecord& found);

}  // namespace ampscope::cuda
