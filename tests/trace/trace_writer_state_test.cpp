// trace::writer_state and TraceWriterOptions::note_termination: what a trace's lock file says about its writer
// after the writer's process ends without closing it. A SIGTERM (mpirun's, to the other ranks when one rank
// dies) is noted, and the process still ends by SIGTERM; a SIGKILL leaves no note; a writer without the option,
// or in a program with a SIGTERM handler of its own, notes nothing and changes nothing; the next writer of the
// path empties an old note; a hostile lock file (a FIFO, a link) is never waited on or followed. Each writer
// whose process is ended runs in a child process.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The nice value of each of this process's threads (field 19 of /proc/self/task/<tid>/stat), by thread id.
std::map<int, int> thread_nice_values() {
  std::map<int, int> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const std::string stat = read_text(entry.path() / "stat");
    // Fields after the command, which is in parentheses and may hold spaces: state is field 3, nice field 19.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int k = 3; k < 19 && rest >> field; ++k) {
    }
    int nice = 0;
    if (rest >> nice) out[std::stoi(entry.path().filename().string())] = nice;
  }
  return out;
}

// TraceWriterOptions::thread_nice: the writer thread and each compression thread run at the caller's nice value
// plus thread_nice (here 10 and 3, with 2 and 3 compression threads), the caller's own threads unchanged; 0 adds none.
TEST(trace_writer_state_test, the_writers_threads_run_at_a_lower_priority) {
  errno = 0;
  const int caller = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_EQ(errno, 0);
  if (caller > 9) GTEST_SKIP() << "the test runs at nice " << caller << ", too near 19 to tell";
  const std::map<int, int> before = thread_nice_values();
  for (const auto& [nice, threads] : {std::pair{10, 2}, std::pair{3, 3}, std::pair{0, 2}}) {
    TempDir dir;
    TraceWriter writer(dir.file("nice.h5"), testing::sample_run(), {.compression_threads = threads, .thread_nice = nice});
    // Each thread lowers itself when it starts, which may be after the constructor returns: up to 5 s.
    std::map<int, int> lowered, others;
    for (int wait = 0; wait < 500; ++wait) {
      lowered.clear();
      others.clear();
      for (const auto& [tid, value] : thread_nice_values()) {
        if (before.count(tid) > 0) {
          EXPECT_EQ(value, before.at(tid)) << "thread " << tid << " was there before the writer";
          continue;
        }
        (value == caller + nice ? lowered : others)[tid] = value;
      }
      if (others.empty() && lowered.size() == static_cast<std::size_t>(1 + threads)) break;
      usleep(10000);
    }
    EXPECT_EQ(lowered.size(), static_cast<std::size_t>(1 + threads)) << "thread_nice " << nice;
    EXPECT_TRUE(others.empty()) << "thread_nice " << nice << ": " << others.size() << " new threads at another nice value";
    writer.close();
  }
}

constexpr char kNote[] = "ampscope trace writer: ended by SIGTERM\n";

// A SIGTERM handler of the program's own: exits 42.
void own_handler(int) { _exit(42); }

struct Child {
  pid_t pid = -1;
};

// Starts a child that writes `steps` steps to `path`, flushes, tells the parent, and waits to be ended.
// `own_sigterm`: the program handles SIGTERM itself before the writer starts.
Child start_writer(const std::filesystem::path& path, int steps, bool note, bool own_sigterm = false) {
  int ready[2];
  if (pipe(ready) != 0) return {};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(ready[0]);
    if (own_sigterm) signal(SIGTERM, own_handler);
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 16, .note_termination = note});
    for (int step = 0; step < steps; ++step) {
      for (int seq = 0; seq < 4; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.flush();
    if (::write(ready[1], "r", 1) != 1) _exit(90);
    for (;;) pause();
  }
  ::close(ready[1]);
  char byte = 0;
  if (pid < 0 || ::read(ready[0], &byte, 1) != 1) {
    ::close(ready[0]);
    ADD_FAILURE() << "the writer's child did not start";
    return {};
  }
  ::close(ready[0]);
  return {pid};
}

// Ends the child with `signal_number`; returns waitpid's status.
int end_child(const Child& c, int signal_number) {
  kill(c.pid, signal_number);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return status;
}

TEST(trace_writer_state_test, a_sigterm_is_noted_and_still_ends_the_process_as_sigterm_does) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  const Child c = start_writer(path, 3, /*note=*/true);
  ASSERT_GT(c.pid, 0);
  EXPECT_TRUE(writer_state(path).writing);
  const int status = end_child(c, SIGTERM);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the process did not end by a signal (status " << status << ")";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(read_text(dir.file("run.h5.lock")), kNote);
  const WriterState s = writer_state(path);
  EXPECT_FALSE(s.writing);
  EXPECT_TRUE(s.terminated);
  TraceReader reader(path);  // the steps flushed before are there, as after any kill
  EXPECT_FALSE(reader.complete());
  EXPECT_EQ(reader.steps().size(), 3u);
  EXPECT_EQ(reader.last_flushed_step(), 2);
}

TEST(trace_writer_state_test, a_sigkill_leaves_no_note) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  const Child c = start_writer(path, 2, /*note=*/true);
  ASSERT_GT(c.pid, 0);
  const int status = end_child(c, SIGKILL);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  const WriterState s = writer_state(path);
  EXPECT_FALSE(s.writing);
  EXPECT_FALSE(s.terminated);
  EXPECT_EQ(read_text(dir.file("run.h5.lock")), "");
}

TEST(trace_writer_state_test, without_the_option_or_over_a_programs_own_handler_nothing_is_noted) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  const Child plain = start_writer(path, 1, /*note=*/false);
  ASSERT_GT(plain.pid, 0);
  const int status = end_child(plain, SIGTERM);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(writer_state(path).terminated);

  // The program's handler stays the program's: it runs (exit 42), and no note is written.
  const auto other = dir.file("own.h5");
  const Child own = start_writer(other, 1, /*note=*/true, /*own_sigterm=*/true);
  ASSERT_GT(own.pid, 0);
  const int own_status = end_child(own, SIGTERM);
  ASSERT_TRUE(WIFEXITED(own_status)) << "status " << own_status;
  EXPECT_EQ(WEXITSTATUS(own_status), 42);
  EXPECT_FALSE(writer_state(other).terminated);
}

TEST(trace_writer_state_test, the_next_writer_of_the_path_empties_an_old_note) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  const Child first = start_writer(path, 1, /*note=*/true);
  ASSERT_GT(first.pid, 0);
  end_child(first, SIGTERM);
  ASSERT_TRUE(writer_state(path).terminated);
  // A second run on the same path, killed without notice: the old note must not speak for it.
  const Child second = start_writer(path, 1, /*note=*/true);
  ASSERT_GT(second.pid, 0);
  const WriterState live = writer_state(path);
  EXPECT_TRUE(live.writing);
  EXPECT_FALSE(live.terminated);
  end_child(second, SIGKILL);
  EXPECT_FALSE(writer_state(path).terminated);

  // And a writer that closes removes its lock file: nothing to say.
  {
    TraceWriter w(path, testing::sample_run());
    w.close();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("run.h5.lock")));
  const WriterState closed = writer_state(path);
  EXPECT_FALSE(closed.writing);
  EXPECT_FALSE(closed.terminated);
}

TEST(trace_writer_state_test, a_hostile_lock_file_is_never_waited_on_nor_followed) {
  TempDir dir;
  const auto path = dir.file("run.h5");
  // A FIFO: opening it for reading would block until a writer came; writer_state returns at once.
  ASSERT_EQ(mkfifo(dir.file("run.h5.lock").c_str(), 0644), 0);
  const WriterState fifo = writer_state(path);
  EXPECT_FALSE(fifo.writing);
  EXPECT_FALSE(fifo.terminated);
  std::filesystem::remove(dir.file("run.h5.lock"));
  // A link to a file holding the note: not followed.
  std::ofstream(dir.file("elsewhere")) << kNote;
  std::filesystem::create_symlink(dir.file("elsewhere"), dir.file("run.h5.lock"));
  EXPECT_FALSE(writer_state(path).terminated);
  // The note with anything after it is not the note.
  std::filesystem::remove(dir.file("run.h5.lock"));
  std::ofstream(dir.file("run.h5.lock")) << kNote << "more";
  EXPECT_FALSE(writer_state(path).terminated);
}

}  // namespace
}  // namespace ampscope::trace
