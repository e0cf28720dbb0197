// One writer per trace: a second TraceWriter on the same path fails at once with a clear message and
// leaves the first run's trace intact; readers open the trace while it is being written; the lock is
// released (and its file removed) when the writer is done, or when its process dies.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

void write_step(TraceWriter& w, std::int64_t step) {
  w.write(testing::numbered_step(step));
  w.write(testing::numbered_op(step, 0));
  w.end_step(step);
}

TEST(trace_writer_lock_test, a_second_writer_of_the_same_trace_fails_at_start_and_readers_are_not_blocked) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  {
    TraceWriter first(path, testing::sample_run(), {.chunk_rows = 16});
    write_step(first, 0);
    first.flush();
    EXPECT_TRUE(std::filesystem::exists(path.string() + ".lock"));
    EXPECT_THROW_MSG(TraceWriter second(path, testing::sample_run(), {.chunk_rows = 16}), TraceError,
                     "cannot write trace '" + path.string() + "'", "another process is writing this trace",
                     "hint: give this run another --out");
    {
      TraceReader reader(path);  // a reader is not blocked by the writer's lock
      EXPECT_EQ(reader.row_counts().steps, 1);
    }
    write_step(first, 1);  // the failed second writer did not truncate or damage the file
    first.close();
  }
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".lock"));
  {
    TraceReader reader(path);
    EXPECT_TRUE(reader.complete());
    EXPECT_EQ(reader.row_counts().steps, 2);
  }
  TraceWriter again(path, testing::sample_run(), {.chunk_rows = 16});  // free again once the writer is gone
  again.close();
}

TEST(trace_writer_lock_test, the_lock_of_a_killed_writer_does_not_block_the_next_run) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 16});
    write_step(w, 0);
    w.flush();
    std::_Exit(0);  // dies without closing: the lock file stays, its lock goes with the process
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_TRUE(std::filesystem::exists(path.string() + ".lock"));
  TraceWriter next(path, testing::sample_run(), {.chunk_rows = 16});
  next.close();
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".lock"));
}

}  // namespace
}  // namespace ampscope::trace
