// The distributed tests' main: one process group for the whole program (MPI can start once per process),
// made by make_process_group() from the launcher's environment. Only rank 0 prints GoogleTest's full
// output; the other ranks print their failures, prefixed with their rank. The exit status is non-zero on
// a rank where a test failed, which makes mpirun's non-zero too.
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/distributed/distributed_test_support.h"

namespace ampscope::testing {

namespace {

std::unique_ptr<ProcessGroup> g_group;

// The other ranks' printer: failures only, each line with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

ProcessGroup& test_group() { return *g_group; }

}  // namespace ampscope::testing

int main(int argc, char** argv) {
  using ampscope::ProcessGroup;
  namespace support = ampscope::testing;
  ::testing::InitGoogleTest(&argc, argv);
  try {
    ampscope::ProcessGroupOptions options;
    options.mpi_segment_bytes = support::kTestSegmentBytes;
    options.shutdown_timeout_s = 30;
    support::g_group = ampscope::make_process_group(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_tests: %s\n", e.what());
    return 2;
  }
  ProcessGroup& group = support::test_group();
  if (group.rank() == 0) {
    std::printf("distributed_tests: process group %s\n", group.describe().c_str());
  } else {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new support::RankFailurePrinter(group.rank()));
  }
  int status = 0;
  try {
    status = RUN_ALL_TESTS();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] distributed_tests: %s\n", group.rank(), e.what());
    group.abort(3);
  }
  support::g_group.reset();
  return status;
}
