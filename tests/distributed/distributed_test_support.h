// tests/distributed/distributed_test_support.h: the process group the distributed tests share. The test
// program is started twice by ctest: as a plain process (the single-process group) and under
// `mpirun --oversubscribe -np 2` and `-np 3` (the MPI group); main() (main.cpp) makes the group with
// make_process_group(), as a user's program would, and every test uses it. Every rank runs every test and
// makes the same collective calls in the same order, so assertions after a collective use EXPECT (a
// failing ASSERT would return early and leave the other ranks waiting).
#pragma once

#include "core/process_group.h"

namespace ampscope::testing {

ProcessGroup& test_group();

// The piece size the tests give the MPI group (ProcessGroupOptions::mpi_segment_bytes): small, so that
// tensors of a few thousand elements cross piece boundaries and split unevenly between ranks.
inline constexpr std::size_t kTestSegmentBytes = 1000;

}  // namespace ampscope::testing
