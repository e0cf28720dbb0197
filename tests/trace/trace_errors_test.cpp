// What the trace reader says about files it cannot read (missing, empty, not HDF5, random bytes,
// truncated, damaged, another HDF5 file, a newer format_version, a missing table), and what the writer
// says about bad options, a missing folder, conflicting run info, a call after close, and a failure on
// its own thread (a file size limit), which reaches the caller's next call. None of them crashes.
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

// EXPECT_THROW_MSG keeps its pieces as string_views of its arguments: built strings must outlive the
// macro, so they are named locals below, never temporaries.

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A finished trace of a few steps, with enough rows for several chunks.
void write_trace(const std::filesystem::path& path) {
  TraceWriter w(path, testing::sample_run(), {.chunk_rows = 64});
  for (int step = 0; step < 4; ++step) {
    for (int seq = 0; seq < 100; ++seq) w.write(testing::numbered_op(step, seq));
    w.write(testing::numbered_step(step));
    w.end_step(step);
  }
  w.close();
}

// Reads every table: a damaged file may open and fail only when the damaged part is read.
void read_everything(const std::filesystem::path& path) {
  TraceReader r(path);
  r.steps();
  r.ops();
  r.grads();
  r.events();
  r.histograms();
  r.dumps();
}

// Rewrites a root attribute of a finished trace in place, with HDF5's own API.
void set_root_attribute(const std::filesystem::path& path, const char* name, hid_t type, const void* value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  ASSERT_GE(attr, 0);
  EXPECT_GE(H5Awrite(attr, type, value), 0);
  H5Aclose(attr);
  H5Fclose(file);
}

TEST(trace_errors_test, names_a_missing_file) {
  TempDir dir;
  const auto path = dir.file("nothing.h5");
  const std::string where = "cannot read trace '" + path.string() + "'";
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "no such file");
}

TEST(trace_errors_test, says_an_empty_file_is_not_hdf5) {
  TempDir dir;
  const auto path = dir.file("empty.h5");
  write_bytes(path, "");
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "the file is empty (not an HDF5 file)");
}

TEST(trace_errors_test, says_a_text_file_is_not_hdf5) {
  TempDir dir;
  const auto path = dir.file("notes.h5");
  write_bytes(path, "step,loss\n0,5.5\n1,4.9\n");
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "not an HDF5 file (no HDF5 signature at its start)");
}

TEST(trace_errors_test, says_random_bytes_are_not_hdf5) {
  TempDir dir;
  const auto path = dir.file("random.h5");
  std::mt19937 gen(7);
  std::string bytes(8192, '\0');
  for (char& c : bytes) c = static_cast<char>(gen());
  write_bytes(path, bytes);
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "not an HDF5 file");
}

TEST(trace_errors_test, says_a_folder_is_not_a_trace) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("folder.h5"));
  EXPECT_THROW_MSG(TraceReader r(dir.file("folder.h5")), TraceError, "it is a folder, not a trace file");
}

TEST(trace_errors_test, reports_a_truncated_trace_with_the_file_name) {
  TempDir dir;
  const auto whole = dir.file("whole.h5");
  write_trace(whole);
  const std::string bytes = read_bytes(whole);
  for (double fraction : {0.05, 0.5, 0.9}) {
    const auto path = dir.file("truncated.h5");
    write_bytes(path, bytes.substr(0, static_cast<std::size_t>(static_cast<double>(bytes.size()) * fraction)));
    SCOPED_TRACE(fmt::format("kept {} of {} bytes", fraction, bytes.size()));
    const std::string where = "cannot read trace '" + path.string() + "'";
    EXPECT_THROW_MSG(read_everything(path), TraceError, where, "hint: the file may be truncated or damaged");
  }
}

TEST(trace_errors_test, reports_a_damaged_superblock) {
  TempDir dir;
  const auto path = dir.file("superblock.h5");
  write_trace(path);
  std::string bytes = read_bytes(path);
  for (std::size_t i = 12; i < 40; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);  // after the signature
  write_bytes(path, bytes);
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "HDF5 cannot open it", "HDF5 error stack:",
                   "hint: the file may be truncated or damaged");
}

TEST(trace_errors_test, reports_a_damaged_chunk_with_its_table) {
  TempDir dir;
  const auto path = dir.file("chunk.h5");
  write_trace(path);
  // Where the first chunk of /ops lies, as HDF5 itself says.
  haddr_t address = 0;
  hsize_t size = 0;
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t ops = H5Dopen2(file, "/ops", H5P_DEFAULT);
    const hsize_t origin = 0;
    unsigned filter_mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(ops, &origin, &filter_mask, &address, &size), 0);
    H5Dclose(ops);
    H5Fclose(file);
  }
  ASSERT_GT(size, 64u);
  std::string bytes = read_bytes(path);
  for (std::size_t i = address + size / 2; i < address + size / 2 + 32; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  write_bytes(path, bytes);
  TraceReader r(path);  // the metadata is intact
  EXPECT_EQ(r.steps().size(), 4u);
  const std::string where = "cannot read trace '" + path.string() + "'";
  EXPECT_THROW_MSG(r.ops(), TraceError, where, "H5Dread failed on '/ops'", "HDF5 error stack:");
}

TEST(trace_errors_test, says_another_hdf5_file_is_not_an_ampscope_trace) {
  TempDir dir;
  const auto path = dir.file("other.h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hsize_t n = 3;
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t data = H5Dcreate2(file, "weights", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(data);
  H5Sclose(space);
  H5Fclose(file);
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "not an ampscope trace: the root attribute 'format' is missing");
}

TEST(trace_errors_test, says_a_file_of_another_format_is_not_an_ampscope_trace) {
  TempDir dir;
  const auto path = dir.file("checkpoint.h5");
  write_trace(path);
  // Recreated as a variable-length string, as h5py writes a Python str (and format_version 1 and 2 did).
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Adelete(file, "format"), 0);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(attr, 0);
  const char* other = "ampscope checkpoint";
  EXPECT_GE(H5Awrite(attr, type, &other), 0);
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  H5Fclose(file);
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where,
                   "the root attribute 'format' is \"ampscope checkpoint\", expected \"ampscope-trace\"");
}

TEST(trace_errors_test, names_the_supported_version_for_a_newer_trace) {
  TempDir dir;
  const auto path = dir.file("future.h5");
  write_trace(path);
  const std::int64_t version = kFormatVersion + 1;
  set_root_attribute(path, "format_version", H5T_NATIVE_INT64, &version);
  const std::string where = path.string();
  const std::string problem = fmt::format(
      "its format_version is {}, newer than this build of ampscope reads (format_version {})", version, kFormatVersion);
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, problem, "hint: read it with a newer ampscope");
}

TEST(trace_errors_test, names_a_missing_table) {
  TempDir dir;
  const auto path = dir.file("no_tables.h5");
  write_trace(path);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Ldelete(file, "/grads", H5P_DEFAULT), 0);
  H5Fclose(file);
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceReader r(path), TraceError, where, "the dataset '/grads' is missing");
}

TEST(trace_errors_test, refuses_bad_writer_options_and_a_missing_folder) {
  TempDir dir;
  const auto path = dir.file("w.h5");
  const std::string where = path.string();
  EXPECT_THROW_MSG(TraceWriter(path, testing::sample_run(), {.queue_rows = 0}), TraceError, where, "queue_rows is 0");
  EXPECT_THROW_MSG(TraceWriter(path, testing::sample_run(), {.compression_threads = 0}), TraceError, "compression_threads is 0");
  EXPECT_THROW_MSG(TraceWriter(path, testing::sample_run(), {.compression = 12}), TraceError, "compression level 12 is outside 0..9");
  EXPECT_THROW_MSG(TraceWriter(path, testing::sample_run(), {.thread_nice = -1}), TraceError, "thread_nice -1 is outside 0..19",
                   "hint: 0 (the default) leaves the writer's threads at the caller's priority");
  EXPECT_THROW_MSG(TraceWriter(path, testing::sample_run(), {.thread_nice = 20}), TraceError, "thread_nice 20 is outside 0..19");
  RunInfo bad = testing::sample_run();
  bad.precision = "fp4";
  EXPECT_THROW_MSG(TraceWriter(path, bad), TraceError, "precision 'fp4' is not one of fp32, fp16, bf16, fp8, mxfp8, nvfp4");
  const auto nowhere = dir.file("missing") / "w.h5";
  const std::string file = "cannot write trace '" + nowhere.string() + "'";
  const std::string folder = "folder '" + dir.file("missing").string() + "' does not exist";
  EXPECT_THROW_MSG(TraceWriter(nowhere, testing::sample_run()), TraceError, file, folder);
}

TEST(trace_errors_test, refuses_other_run_info_in_begin_and_calls_after_close) {
  TempDir dir;
  const auto path = dir.file("w.h5");
  TraceWriter w(path, testing::sample_run());
  w.begin(testing::sample_run());  // the same: accepted
  RunInfo other = testing::sample_run();
  other.model = "mlp";
  EXPECT_THROW_MSG(w.begin(other), TraceError, "begin() was given run info (model 'mlp'",
                   "hint: the root attributes are written when the file is created");
  w.close();
  w.close();  // a second close does nothing
  EXPECT_THROW_MSG(w.write(testing::numbered_op(0, 0)), TraceError, "the trace writer was already closed");
  EXPECT_THROW_MSG(w.flush(), TraceError, "the trace writer was already closed");
}

// A file size limit makes the writer thread's HDF5 writes fail (EFBIG); the error must come back to
// the caller's thread on a later call, with the file name and the system's own reason (not HDF5's
// error stack: HDF5 never sees the failed write), and close() must not hang. Run in a child process,
// which reports the message it caught through a pipe. (trace_disk_full_test: every size up to 64 KiB.)
TEST(trace_errors_test, rethrows_a_writer_thread_failure_on_the_callers_next_call) {
  TempDir dir;
  const auto path = dir.file("full.h5");
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    std::string message = "no error";
    try {
      TraceWriter w(path, testing::sample_run(), {.chunk_rows = 256, .compression = 0});
      for (int step = 0; step < 1000; ++step) {
        for (int seq = 0; seq < 200; ++seq) w.write(testing::numbered_op(step, seq));
        w.end_step(step);
      }
      w.close();
    } catch (const TraceError& e) {
      message = e.what();
    }
    ssize_t ignored = write(fds[1], message.data(), message.size());
    (void)ignored;
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string message;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof buffer)) > 0) message.append(buffer, static_cast<std::size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the writer process did not exit normally (hung or crashed)";
  EXPECT_NE(message.find("cannot write trace '" + path.string() + "': file too large (writing "), std::string::npos)
      << message;
  EXPECT_NE(message.find("\nhint: the trace holds "), std::string::npos) << message;
  EXPECT_EQ(message.find("HDF5 error stack:"), std::string::npos) << message;
}

}  // namespace
}  // namespace ampscope::trace
