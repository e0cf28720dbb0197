// Only regular files are opened as traces: a FIFO, a device or a folder is refused at once with a message
// (a FIFO used to block the reader for ever inside HDF5), and a file this user may not read says
// "permission denied" instead of "not an HDF5 file". The same check (core/io/hdf5_support.h) guards the
// checkpoint loader (tests/checkpoint/load_errors_test.cpp).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

// A regression would block in open(): SIGALRM ends the test program instead of hanging CI.
class HangGuard {
 public:
  HangGuard() { ::alarm(20); }
  ~HangGuard() { ::alarm(0); }
};

TEST(trace_special_files_test, a_fifo_is_refused_at_once) {
  TempDir dir;
  const auto path = dir.file("pipe.h5");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  HangGuard guard;
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, "cannot read trace '" + path.string() + "'",
                   "it is a FIFO (named pipe), not a regular file", "hint: an ampscope trace is a regular HDF5 file");
}

TEST(trace_special_files_test, a_character_device_is_refused) {
  HangGuard guard;
  EXPECT_THROW_MSG(TraceReader r("/dev/null"), TraceError, "it is a character device, not a regular file");
}

TEST(trace_special_files_test, an_unreadable_file_says_permission_denied) {
  TempDir dir;
  const auto path = dir.file("secret.h5");
  std::ofstream(path) << "not even read";
  ASSERT_EQ(::chmod(path.c_str(), 0000), 0);
  // root reads everything: check as an unprivileged user in a child process.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(3);
    try {
      TraceReader r(path);
    } catch (const TraceError& e) {
      const std::string what = e.what();
      std::_Exit(what.find("permission denied") != std::string::npos &&
                         what.find("not an HDF5 file") == std::string::npos
                     ? 0
                     : 1);
    }
    std::_Exit(2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: wrong message, 2: opened, 3: could not drop privileges";
}

}  // namespace
}  // namespace ampscope::trace
