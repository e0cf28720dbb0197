// The writer when the file system refuses a write: at every file size from 0 to 64 KiB (a process file
// size limit, RLIMIT_FSIZE, makes each write past it fail with EFBIG, as a full disk fails it with ENOSPC;
// tests/trace/disk_full_test.sh fills a real tmpfs through `ampscope train`). Whatever write fails (the
// file's creation, the tables' creation and SWMR start, a chunk, a flush of /index, the close), the writer
// throws one clean error naming the file and the reason, HDF5 prints nothing, the process exits normally
// (HDF5's own cleanup at exit used to crash or loop on such a file), and the trace holds exactly the steps
// the message says, each row as written. Each size runs in a child process of its own.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

constexpr int kSteps = 30;
constexpr int kOpsPerStep = 40;

std::string read_all(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return text;
}

struct ChildRun {
  int status = 0;       // waitpid's
  std::string message;  // the TraceError caught, or "no error"
  std::string stderr_text;
};

// Writes kSteps steps of kOpsPerStep ops into `path` in a child process whose files may not grow past
// `limit` bytes. The child leaves with exit() (not _exit), so HDF5's cleanup at exit runs as in a program.
// Its stderr and its message go through pipes, which the limit does not apply to.
ChildRun write_with_size_limit(const std::filesystem::path& path, rlim_t limit) {
  int message_pipe[2], stderr_pipe[2];
  ChildRun run;
  if (pipe(message_pipe) != 0 || pipe(stderr_pipe) != 0) {
    ADD_FAILURE() << "pipe failed";
    return run;
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t child = fork();
  if (child == 0) {
    ::close(message_pipe[0]);
    ::close(stderr_pipe[0]);
    if (::dup2(stderr_pipe[1], 2) < 0) _exit(90);
    ::close(stderr_pipe[1]);
    signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing the process
    const rlimit fsize{limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &fsize) != 0) _exit(91);
    std::string message = "no error";
    try {
      TraceWriter w(path, testing::sample_run(), {.chunk_rows = 64, .compression = 1});
      for (int step = 0; step < kSteps; ++step) {
        for (int seq = 0; seq < kOpsPerStep; ++seq) w.write(testing::numbered_op(step, seq));
        w.write(testing::numbered_step(step));
        w.end_step(step);
      }
      w.close();
    } catch (const TraceError& e) {
      message = e.what();
    }
    // Far less than a pipe holds: never blocks.
    if (::write(message_pipe[1], message.data(), message.size()) != static_cast<ssize_t>(message.size())) _exit(92);
    ::close(message_pipe[1]);
    std::exit(0);
  }
  ::close(message_pipe[1]);
  ::close(stderr_pipe[1]);
  if (child < 0) {
    ADD_FAILURE() << "fork failed";
    ::close(message_pipe[0]);
    ::close(stderr_pipe[0]);
    return run;
  }
  run.stderr_text = read_all(stderr_pipe[0]);  // until the child exits
  run.message = read_all(message_pipe[0]);
  waitpid(child, &run.status, 0);
  return run;
}

TEST(trace_disk_full_test, a_failed_write_at_any_size_is_one_clean_error_and_leaves_the_steps_it_names) {
  int failures_seen = 0, with_steps = 0;
  for (rlim_t kib = 0; kib <= 64; ++kib) {
    SCOPED_TRACE(fmt::format("file size limit {} KiB", kib));
    TempDir dir;
    const std::filesystem::path path = dir.file("run.h5");
    const ChildRun run = write_with_size_limit(path, kib * 1024);
    ASSERT_TRUE(WIFEXITED(run.status)) << "the writer's process did not exit normally (signal "
                                       << (WIFSIGNALED(run.status) ? WTERMSIG(run.status) : 0) << ")";
    ASSERT_EQ(WEXITSTATUS(run.status), 0) << "the child could not set itself up";
    EXPECT_EQ(run.stderr_text, "") << "printed by HDF5 (or anyone) on stderr";

    if (run.message == "no error") {  // room enough: a complete trace
      TraceReader reader(path);
      EXPECT_TRUE(reader.complete());
      EXPECT_EQ(reader.steps().size(), static_cast<std::size_t>(kSteps));
      continue;
    }
    ++failures_seen;
    const std::string head = "cannot write trace '" + path.string() + "': file too large (";
    EXPECT_EQ(run.message.rfind(head, 0), 0u) << run.message;
    EXPECT_EQ(run.message.find("HDF5 error stack"), std::string::npos) << run.message;
    EXPECT_NE(run.message.find("; the file system allows no larger file: write the trace elsewhere"), std::string::npos)
        << run.message;

    std::smatch held;
    const std::regex holds(R"(\nhint: the trace holds the steps up to step (\d+) \(report and the viewer read them\); )");
    if (run.message.find("\nhint: the trace holds no complete step; ") != std::string::npos) {
      // Nothing durable: the file may not even be HDF5 yet; if it opens, it holds no step.
      try {
        TraceReader reader(path);
        EXPECT_TRUE(reader.steps().empty());
        EXPECT_TRUE(reader.ops().empty());
      } catch (const TraceError&) {
      }
      continue;
    }
    ASSERT_TRUE(std::regex_search(run.message, held, holds)) << run.message;
    ++with_steps;
    const int steps = std::stoi(held[1].str()) + 1;  // steps 0 to N - 1
    TraceReader reader(path);
    EXPECT_FALSE(reader.complete());
    EXPECT_TRUE(reader.damage().empty()) << reader.damage().front();
    const std::vector<StepRow> step_rows = reader.steps();
    ASSERT_EQ(step_rows.size(), static_cast<std::size_t>(steps));
    for (int step = 0; step < steps; ++step) testing::expect_same_step(testing::numbered_step(step), step_rows[step]);
    const std::vector<OpRow> ops = reader.ops();
    ASSERT_EQ(ops.size(), static_cast<std::size_t>(steps * kOpsPerStep));
    for (std::size_t i = 0; i < ops.size(); ++i) {
      testing::expect_same_op(testing::numbered_op(static_cast<std::int64_t>(i) / kOpsPerStep,
                                                   static_cast<std::int64_t>(i) % kOpsPerStep),
                              ops[i]);
    }
  }
  // The sizes cover the cases: failures before any step was durable, and after some were.
  EXPECT_GT(failures_seen, 10);
  EXPECT_GT(with_steps, 5);
}

// The file system's refusal to create the file is said as the system says it, with what to do, not as
// HDF5's error stack: here the path names a folder.
TEST(trace_disk_full_test, a_refused_creation_says_the_systems_reason) {
  TempDir dir;
  const std::filesystem::path path = dir.file("folder.h5");
  std::filesystem::create_directory(path);
  const std::string head = "cannot write trace '" + path.string() +
                           "': is a directory (creating it, in H5Fcreate on '/')\nhint: the trace holds no complete step; "
                           "the path names a folder: give the trace a file name";
  try {
    TraceWriter w(path, testing::sample_run());
    ADD_FAILURE() << "a folder was opened as a trace";
  } catch (const TraceError& e) {
    EXPECT_EQ(std::string(e.what()), head);
  }
  EXPECT_TRUE(std::filesystem::is_directory(path));
  EXPECT_FALSE(std::filesystem::exists(dir.file("folder.h5.lock")));  // released with the writer
}

}  // namespace
}  // namespace ampscope::trace
