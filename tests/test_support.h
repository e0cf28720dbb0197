// tests/test_support.h: helpers shared by the test programs.
//
//   EXPECT_THROW_MSG(add(a, b), ShapeError, "add:", "[2, 3]", "[4]");
#pragma once

#include <cmath>
#include <cstdlib>
#include <limits>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <initializer_list>
#include <string>
#include <string_view>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/backend.h"

namespace ampscope::testing {

// A scratch folder for this test process ("<tmp>/<prefix>_<pid>"), created on first use and removed with
// everything in it when the process exits, so test runs leave nothing behind in the temporary folder.
inline std::filesystem::path process_scratch_dir(const std::string& prefix) {
  struct Folder {
    std::filesystem::path path;
    ~Folder() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Folder folder{std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()))};
  std::filesystem::create_directories(folder.path);
  return folder.path;
}

// A file's bytes and its modification time, to show that a command neither wrote nor touched it (the
// target of a link planted under an output's name).
//   const FileSnapshot before = file_snapshot(target);  ...  EXPECT_EQ(file_snapshot(target), before);
struct FileSnapshot {
  std::string bytes;
  timespec mtime{};
  bool operator==(const FileSnapshot& o) const {
    return bytes == o.bytes && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};
inline FileSnapshot file_snapshot(const std::filesystem::path& p) {
  FileSnapshot s;
  std::ifstream f(p, std::ios::binary);
  s.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  s.mtime = st.st_mtim;
  return s;
}

}  // namespace ampscope::testing

// Skips a GPU test, with the reason, where no CUDA device is usable; fails it instead when the
// environment sets AMPSCOPE_REQUIRE_GPU=1 (scripts/device-check.sh does), so a GPU machine whose driver
// is broken cannot pass by skipping everything.
#define SKIP_WITHOUT_GPU()                                                                          \
  do {                                                                                              \
    const ::ampscope::CudaStatus status_ = ::ampscope::cuda_status();                               \
    if (status_.device_count == 0) {                                                                \
      const char* require_ = std::getenv("AMPSCOPE_REQUIRE_GPU");                                   \
      if (require_ != nullptr && std::string(require_) == "1") {                                    \
        FAIL() << "AMPSCOPE_REQUIRE_GPU=1 but no usable CUDA device: " << status_.reason;          \
      }                                                                                             \
      GTEST_SKIP() << "no usable CUDA device: " << status_.reason;                                  \
    }                                                                                               \
  } while (0)

// Checks that `statement` throws exactly `exception_type` (or a subclass) and that what() contains every
// one of the given pieces; prints the whole message when a piece is missing.
#define EXPECT_THROW_MSG(statement, exception_type, ...)                                            \
  do {                                                                                              \
    bool caught_ = false;                                                                           \
    try {                                                                                           \
      statement;                                                                                    \
    } catch (const exception_type& e_) {                                                            \
      caught_ = true;                                                                               \
      const std::string what_ = e_.what();                                                          \
      for (const std::string& piece_ : std::initializer_list<std::string>{__VA_ARGS__}) {        \
        EXPECT_NE(what_.find(piece_), std::string::npos)                                            \
            << "message of " #exception_type " lacks \"" << piece_ << "\"; message was:\n" << what_; \
      }                                                                                             \
    } catch (const std::exception& e_) {                                                            \
      ADD_FAILURE() << #statement " threw a different exception than " #exception_type ": " << e_.what(); \
      caught_ = true;                                                                               \
    }                                                                                               \
    if (!caught_) ADD_FAILURE() << #statement " did not throw " #exception_type;                  \
  } while (0)

namespace ampscope::testing {

// Reference f16 rounding of a float: g++'s own host _Float16 (IEEE round-to-nearest-even, independent of
// core/float16.h).
inline double reference_f16(float x) { return static_cast<double>(static_cast<_Float16>(x)); }

// Reference bf16 rounding of a float, written differently from core/float16.h: bf16 keeps 8 significant
// bits, so the values around |x| are the multiples of q = 2^(e - 7), e = floor(log2 |x|) clamped at -126
// (subnormals). |x| / q is exact in double; nearbyint rounds it to nearest even in the default rounding
// mode. A result of 2^128 or more has overflowed to infinity. NaN, infinities and zeros pass through.
inline double reference_bf16(float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0.0f) return x;
  const double ax = std::fabs(static_cast<double>(x));
  int e = std::ilogb(ax);
  if (e < -126) e = -126;
  const double q = std::ldexp(1.0, e - 7);
  double r = std::nearbyint(ax / q) * q;
  if (r >= std::ldexp(1.0, 128)) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, static_cast<double>(x));
}

}  // namespace ampscope::testing
