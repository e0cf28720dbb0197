// tests/distributed/distributed_test_support.h: the process group the distributed tests share. The test
// program is started twice by ctest: as a plain process (the single-process group) and under
// `mpirun --oversubscribe -np 2` and `-np 3` (the MPI group); main() (main.cpp) makes the group with
// make_process_group(), as a user's program would, and every test uses it. Every rank runs every test and
// makes the same collective calls in the same order, so assertions after a collective use EXPECT (a
// failing ASSERT would return early and leave the other ranks waiting).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <ostream>
#include <string>

#include "core/error.h"
#include "core/distributed/process_group.h"
#include "cli/run.h"

namespace ampscope::testing {

ProcessGroup& test_group();

// The piece size the tests give the MPI group (ProcessGroupOptions::mpi_segment_bytes): small, so that
// tensors of a few thousand elements cross piece boundaries and split unevenly between ranks.
inline constexpr std::size_t kTestSegmentBytes = 1000;

// Rank 0 makes a fresh folder under the temporary directory (ampscope-STEM-XXXXXX) and tells the others its name:
// every rank writes its traces there and reads the one checkpoint. Collective: every rank calls it.
inline std::filesystem::path shared_temp_folder(ProcessGroup& g, const std::string& stem) {
  std::string name;
  if (g.rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("ampscope-" + stem + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw Error("mkdtemp failed for " + pattern);
    name = pattern;
  }
  return g.broadcast_bytes(name, 0);
}

// A short training run of a sample for the data-parallel tests (ddp_test, zero_test): --batch divisible by
// 1, 2 and 3 (the ctest entries' rank counts), no probe.
inline samples::TrainConfig small_run(const std::string& sample, samples::Precision precision) {
  samples::TrainConfig c;
  c.sample = sample;
  c.precision = precision;
  c.device = "cpu";
  c.steps = sample == "mlp" ? 4 : 3;
  c.batch = sample == "transformer" ? 6 : 12;
  c.seed = 3;
  c.probe = "off";
  return c;
}

// A parameterised training test's case: a sample in a precision.
struct Case {
  std::string sample;
  samples::Precision precision;
};
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.sample << " " << samples::precision_name(c.precision); }

}  // namespace ampscope::testing
