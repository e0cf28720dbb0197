// tests/trace/trace_test_util.h: helpers shared by the trace tests: temporary folders, rows with a
// distinct value in every field, field-by-field comparisons that treat NaN as equal to NaN and tell
// -0 from +0, and running a command to capture its output.
//
//   TempDir dir;  auto path = dir.file("run.h5");
//   expect_same_op(expected, actual);
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "probes/trace/schema.h"

namespace ampscope::trace::testing {

// A fresh folder under the system's temporary folder, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() / fmt::format("ampscope-trace-test-{}-{}", getpid(), counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path file(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline RunInfo sample_run() {
  return {.precision = "fp16", .device = "cpu", .model = "tiny_gpt", .seed = 1234, .config = R"({"lr": 0.001, "steps": 10})"};
}

// Equal as stored: both NaN, or the same value with the same sign (so -0 differs from +0).
inline bool same_double(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

#define EXPECT_SAME_DOUBLE(expected, actual) \
  EXPECT_TRUE(::ampscope::trace::testing::same_double(expected, actual)) << #actual " is " << (actual) << ", expected " << (expected)

// Deterministic rows: field values depend on (step, seq), so a row read back can be checked against
// one rebuilt independently.
inline OpRow numbered_op(std::int64_t step, std::int64_t seq) {
  OpRow r;
  r.step = step;
  r.seq = seq;
  r.phase = static_cast<Phase>(seq % 4);
  r.op = seq % 3 == 0 ? "linear" : "layer_norm";
  r.module = fmt::format("blocks.{}.attn.qkv", seq % 7);
  r.in_dtypes = "f16,f16,f16";
  r.out_dtype = "f16";
  r.shape = fmt::format("[{}, 128]", seq + 1);
  r.autocast = "linear is on the lower_precision_fp list: runs in f16";
  r.health.numel = 128 * (seq + 1);
  r.health.nan = step;
  r.health.pos_inf = seq;
  r.health.neg_inf = step + seq;
  r.health.zero = 3 * seq;
  r.health.subnormal = seq % 5;
  r.health.min = -0.5 * static_cast<double>(step) - static_cast<double>(seq) / 1024.0;
  r.health.max = 1.0 + static_cast<double>(step) / 3.0;
  r.health.absmax = 1e-3 * static_cast<double>(seq + 1);
  r.health.mean = static_cast<double>(step * 1000 + seq) + 0.25;
  r.health.rms = std::sqrt(static_cast<double>(seq + 1));
  r.cast_overflow = seq % 2;
  r.cast_underflow = seq % 3;
  r.origin = seq % 11 == 0;
  return r;
}

inline StepRow numbered_step(std::int64_t step) {
  StepRow r;
  r.step = step;
  r.loss = 5.0 / static_cast<double>(step + 1);
  r.scale = 65536.0;
  r.scale_after = step % 2 ? 32768.0 : 65536.0;
  r.found_inf = step % 2 == 1;
  r.skipped = step % 2 == 1;
  r.growth_tracker = step % 3;
  r.grad_norm = 0.1 * static_cast<double>(step);
  r.lr = 1e-3;
  r.time_ms = 12.5 + static_cast<double>(step);
  return r;
}

inline void expect_same_op(const OpRow& e, const OpRow& a) {
  EXPECT_EQ(e.step, a.step);
  EXPECT_EQ(e.seq, a.seq);
  EXPECT_EQ(phase_name(e.phase), phase_name(a.phase));
  EXPECT_EQ(e.op, a.op);
  EXPECT_EQ(e.module, a.module);
  EXPECT_EQ(e.in_dtypes, a.in_dtypes);
  EXPECT_EQ(e.out_dtype, a.out_dtype);
  EXPECT_EQ(e.shape, a.shape);
  EXPECT_EQ(e.autocast, a.autocast);
  EXPECT_EQ(e.health.numel, a.health.numel);
  EXPECT_EQ(e.health.nan, a.health.nan);
  EXPECT_EQ(e.health.pos_inf, a.health.pos_inf);
  EXPECT_EQ(e.health.neg_inf, a.health.neg_inf);
  EXPECT_EQ(e.health.zero, a.health.zero);
  EXPECT_EQ(e.health.subnormal, a.health.subnormal);
  EXPECT_SAME_DOUBLE(e.health.min, a.health.min);
  EXPECT_SAME_DOUBLE(e.health.max, a.health.max);
  EXPECT_SAME_DOUBLE(e.health.absmax, a.health.absmax);
  EXPECT_SAME_DOUBLE(e.health.mean, a.health.mean);
  EXPECT_SAME_DOUBLE(e.health.rms, a.health.rms);
  EXPECT_EQ(e.cast_overflow, a.cast_overflow);
  EXPECT_EQ(e.cast_underflow, a.cast_underflow);
  EXPECT_EQ(e.origin, a.origin);
}

inline void expect_same_step(const StepRow& e, const StepRow& a) {
  EXPECT_EQ(e.step, a.step);
  EXPECT_SAME_DOUBLE(e.loss, a.loss);
  EXPECT_SAME_DOUBLE(e.scale, a.scale);
  EXPECT_SAME_DOUBLE(e.scale_after, a.scale_after);
  EXPECT_EQ(e.found_inf, a.found_inf);
  EXPECT_EQ(e.skipped, a.skipped);
  EXPECT_EQ(e.growth_tracker, a.growth_tracker);
  EXPECT_SAME_DOUBLE(e.grad_norm, a.grad_norm);
  EXPECT_SAME_DOUBLE(e.lr, a.lr);
  EXPECT_SAME_DOUBLE(e.time_ms, a.time_ms);
}

// Runs a shell command; returns its exit status and puts its standard output (and error) in `output`.
inline int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ampscope::trace::testing
