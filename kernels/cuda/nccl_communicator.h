// kernels/cuda/nccl_communicator.h: the collectives of CUDA tensors between processes, on NCCL (shipped
// with the CUDA Toolkit: nccl.h, libnccl.so). Reached only through Backend::new_communicator_id and
// Backend::create_communicator (core/backend.h), which the CUDA backend implements with these; users get it
// from ProcessGroup::connect (core/distributed/process_group.h), which sends rank 0's id to the others over the group
// (MPI). Only built when the build has CUDA and NCCL (AMPSCOPE_WITH_NCCL).
//
//   std::string id = cuda::nccl_unique_id();                                  // rank 0; then broadcast
//   auto comm = cuda::make_nccl_communicator(device, stream, id, rank, size);  // every rank
#pragma once

#include <memory>
#include <string>

#include <cuda_runtime_api.h>

#include "core/distributed/communicator.h"

namespace ampscope::cuda {

// ncclGetUniqueId as bytes (NCCL_UNIQUE_ID_BYTES of them).
std::string nccl_unique_id();

// ncclCommInitRank on `device`; every collective is queued on `stream` (the CUDA backend's one stream, so
// it is ordered after the kernels that wrote its tensors and before those that read them). Throws
// DeviceRuntimeError with NCCL's text when NCCL fails, Error when `id` is not an id's size.
std::unique_ptr<Communicator> make_nccl_communicator(int device, cudaStream_t stream, const std::string& id, int rank,
                                                     int size);

}  // namespace ampscope::cuda
