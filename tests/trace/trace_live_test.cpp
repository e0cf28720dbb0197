// A trace is readable while its writer runs (HDF5 SWMR: the reader sees rows grow at each step end, and
// h5py can follow it too), and a writer killed with SIGKILL mid-run leaves a trace that opens with every
// step flushed before the kill, whole (texts new in each step included), and complete = 0. Before the
// first step end (tables not created yet) the reader says to try again. Writers run in child processes, since HDF5 does not let one
// process open a file for writing and for SWMR reading at once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

constexpr int kOps = 37;

// numbered_op with a module path new in every step and longer than a chunk of /string_bytes at
// chunk_rows 16 (512 bytes) for some rows: each step end flushes texts, some across chunk boundaries.
OpRow live_op(std::int64_t step, std::int64_t seq) {
  OpRow o = testing::numbered_op(step, seq);
  o.module = fmt::format("step{}.", step) + std::string(static_cast<std::size_t>(20 * seq), 'm');
  return o;
}

void write_step(TraceWriter& w, int step) {
  for (int seq = 0; seq < kOps; ++seq) w.write(live_op(step, seq));
  w.write(testing::numbered_step(step));
  w.end_step(step);
}

void send(int fd, char c) {
  if (write(fd, &c, 1) != 1) _exit(3);
}

char receive(int fd) {
  char c = 0;
  return read(fd, &c, 1) == 1 ? c : '\0';
}

// Every row of steps [0, steps) as live_op / numbered_step made them, and nothing else.
void expect_whole_steps(TraceReader& r, int steps) {
  const std::vector<StepRow> step_rows = r.steps();
  ASSERT_EQ(step_rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) testing::expect_same_step(testing::numbered_step(s), step_rows[static_cast<std::size_t>(s)]);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), static_cast<std::size_t>(steps * kOps));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    testing::expect_same_op(live_op(static_cast<std::int64_t>(i / kOps), static_cast<std::int64_t>(i % kOps)), ops[i]);
  }
}

TEST(trace_live_test, a_killed_writer_leaves_every_flushed_step) {
  constexpr int kFlushed = 5;
  // Chunks of 16 rows (several per step, steps ending inside chunks) and automatic chunks.
  for (auto [delay_us, chunk_rows] : {std::pair{0, 16}, std::pair{3000, 0}, std::pair{20000, 16}, std::pair{20000, 0}}) {
    SCOPED_TRACE(fmt::format("killed {} us after the flush, chunk_rows {}", delay_us, chunk_rows));
    TempDir dir;
    const auto path = dir.file("killed.h5");
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(ready[0]);
      TraceWriter w(path, testing::sample_run(), {.chunk_rows = static_cast<std::size_t>(chunk_rows)});
      for (int step = 0; step < kFlushed; ++step) write_step(w, step);
      w.flush();  // steps 0..4 are in the file
      send(ready[1], 'f');
      for (int step = kFlushed; step < 1000000; ++step) write_step(w, step);  // until killed
      _exit(0);
    }
    close(ready[1]);
    ASSERT_EQ(receive(ready[0]), 'f');
    usleep(static_cast<useconds_t>(delay_us));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    close(ready[0]);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer finished before it was killed";

    TraceReader r(path);
    EXPECT_FALSE(r.complete());
    ASSERT_TRUE(r.last_flushed_step().has_value());
    const int flushed = static_cast<int>(*r.last_flushed_step()) + 1;
    EXPECT_GE(flushed, kFlushed);
    expect_whole_steps(r, flushed);
  }
}

TEST(trace_live_test, a_reader_sees_rows_grow_while_the_writer_runs) {
  constexpr int kSteps = 3;
  TempDir dir;
  const auto path = dir.file("live.h5");
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 16});
    for (int step = 0; step < kSteps; ++step) {
      write_step(w, step);
      w.flush();
      send(to_parent[1], 's');
      if (receive(to_child[0]) != 'a') _exit(2);
    }
    w.close();
    send(to_parent[1], 'c');
    _exit(0);
  }
  close(to_parent[1]);
  close(to_child[0]);

  ASSERT_EQ(receive(to_parent[0]), 's');
  TraceReader r(path);
  EXPECT_FALSE(r.complete());
  expect_whole_steps(r, 1);
  for (int step = 1; step < kSteps; ++step) {
    send(to_child[1], 'a');
    ASSERT_EQ(receive(to_parent[0]), 's');
    r.refresh();
    EXPECT_FALSE(r.complete());
    expect_whole_steps(r, step + 1);
  }

  // While the writer still holds the file, h5py follows it in SWMR mode too.
  std::string out;
  if (testing::run_command("/usr/bin/python3 -c 'import h5py'", out) == 0) {
    const std::string script = "import h5py; f = h5py.File('" + path.string() +
                               "', 'r', swmr=True, libver='latest'); print('rows', len(f['index']) > 0, int(f['index'][-1]['ops']))";
    ASSERT_EQ(testing::run_command("/usr/bin/python3 -c \"" + script + "\"", out), 0) << out;
    EXPECT_NE(out.find("rows True " + std::to_string(kSteps * kOps)), std::string::npos) << out;
  }

  send(to_child[1], 'a');
  ASSERT_EQ(receive(to_parent[0]), 'c');
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  r.refresh();
  EXPECT_TRUE(r.complete());
  expect_whole_steps(r, kSteps);
  close(to_parent[0]);
  close(to_child[1]);
}

TEST(trace_live_test, says_to_try_again_before_the_first_step_ends) {
  TempDir dir;
  const auto path = dir.file("early.h5");
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    TraceWriter w(path, testing::sample_run());  // automatic chunks: tables come at the first step end
    w.write(testing::numbered_op(0, 0));
    send(to_parent[1], 'w');
    if (receive(to_child[0]) != 'a') _exit(2);
    w.end_step(0);
    w.close();
    _exit(0);
  }
  close(to_parent[1]);
  close(to_child[0]);
  ASSERT_EQ(receive(to_parent[0]), 'w');
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "HDF5 cannot open it",
                   "its writer has not finished a step yet (the tables are created at the first step end)", "try again");
  send(to_child[1], 'a');
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  TraceReader r(path);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.ops().size(), 1u);
  close(to_parent[0]);
  close(to_child[1]);
}

}  // namespace
}  // namespace ampscope::trace
