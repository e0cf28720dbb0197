// core/distributed/mpi_process_group.h (internal: not installed, cmake/headers.cmake): the MPI process group's factory.
// The group itself lives in mpi_process_group.cpp, the only file that includes mpi.h, so no public header
// needs MPI's; it is compiled only when the build has MPI (AMPSCOPE_MPI). Users call make_process_group()
// (core/distributed/process_group.h).
#pragma once

#include <memory>

#include "core/distributed/process_group.h"

namespace ampscope::detail {

// MPI_Init_thread (MPI_THREAD_FUNNELED) unless MPI is already initialised, then a group over a duplicate of
// MPI_COMM_WORLD. One MPI group per process at a time, created and used on one thread; MPI cannot be
// started again once the group that started it is gone (MPI_Finalize is final), so a second group after
// that throws.
std::unique_ptr<ProcessGroup> make_mpi_process_group(const ProcessGroupOptions& options);

}  // namespace ampscope::detail
