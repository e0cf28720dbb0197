// /updates (format_version 5): the swamped-update counts of f16/bf16 parameters. Every field read back by step
// range as written, a format_version 4 trace read as having none, and rows no probe writes refused with the row
// and the field named.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A row whose every field is distinct and depends on (step, i).
UpdateRow numbered_update(std::int64_t step, std::int64_t i) {
  return UpdateRow{.step = step,
                   .param = "blocks." + std::to_string(i) + ".ln.weight",
                   .dtype = i % 2 == 0 ? "f16" : "bf16",
                   .numel = 100 + i,
                   .nonzero = 90 + i - step,
                   .swamped = 10 * step + i,
                   .param_abs_mean = 1.0 + 0.125 * static_cast<double>(i),
                   .update_abs_mean = 1e-4 * static_cast<double>(step + 1)};
}

std::vector<UpdateRow> write_trace(const fs::path& path, int steps, int per_step, const UpdateRow* last = nullptr) {
  std::vector<UpdateRow> rows;
  TraceWriter w(path, testing::sample_run());
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < per_step; ++i) {
      rows.push_back(last != nullptr && s == steps - 1 && i == per_step - 1 ? *last : numbered_update(s, i));
      w.write(rows.back());
    }
    w.write(testing::numbered_step(s));
    w.end_step(s);
  }
  w.close();
  return rows;
}

void expect_same(const UpdateRow& want, const UpdateRow& got) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.param, want.param);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.nonzero, want.nonzero);
  EXPECT_EQ(got.swamped, want.swamped);
  EXPECT_SAME_DOUBLE(want.param_abs_mean, got.param_abs_mean);
  EXPECT_SAME_DOUBLE(want.update_abs_mean, got.update_abs_mean);
}

TEST(trace_updates_test, reads_back_every_field_of_every_row_by_step_range) {
  TempDir dir;
  const fs::path path = dir.file("u.h5");
  const std::vector<UpdateRow> rows = write_trace(path, 3, 4);
  TraceReader r(path);
  EXPECT_EQ(r.row_counts().updates, 12);
  const std::vector<UpdateRow> all = r.updates();
  ASSERT_EQ(all.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) expect_same(rows[i], all[i]);
  const std::vector<UpdateRow> middle = r.updates(1, 2);
  ASSERT_EQ(middle.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) expect_same(rows[4 + i], middle[i]);
}

TEST(trace_updates_test, a_format_version_4_trace_reads_with_an_empty_updates_table) {
  TraceReader r(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v4-mlp-log-zero-full.h5");
  EXPECT_EQ(r.format_version(), 4);
  EXPECT_TRUE(r.updates().empty());
  EXPECT_EQ(r.row_counts().updates, 0);
}

std::string updates_error(const fs::path& path) {
  try {
    TraceReader r(path);
    r.updates();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(read without an error)";
}

TEST(trace_updates_test, refuses_a_row_no_probe_writes_naming_the_row_and_the_field) {
  TempDir dir;
  struct Case {
    const char* name;
    UpdateRow row;
    const char* says;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {"dtype", {.step = 1, .param = "w", .dtype = "f32", .numel = 4, .nonzero = 4, .swamped = 0},
       "row 5 of '/updates': its field 'dtype' is 'f32', not f16 or bf16"},
      {"numel", {.step = 1, .param = "w", .dtype = "f16", .numel = -1}, "row 5 of '/updates': its field 'numel' is -1, not a count"},
      {"nonzero", {.step = 1, .param = "w", .dtype = "f16", .numel = 4, .nonzero = 5},
       "row 5 of '/updates': its field 'nonzero' is 5, more than numel (4)"},
      {"swamped", {.step = 1, .param = "w", .dtype = "f16", .numel = 9, .nonzero = 4, .swamped = 9},
       "row 5 of '/updates': its field 'swamped' is 9, more than nonzero (4)"},
      {"param_abs_mean", {.step = 1, .param = "w", .dtype = "bf16", .numel = 4, .param_abs_mean = nan},
       "row 5 of '/updates': its field 'param_abs_mean' is nan, not a finite non-negative number"},
      {"update_abs_mean", {.step = 1, .param = "w", .dtype = "bf16", .numel = 4, .update_abs_mean = inf},
       "row 5 of '/updates': its field 'update_abs_mean' is inf, not a finite non-negative number"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path path = dir.file(std::string(c.name) + ".h5");
    write_trace(path, 2, 3, &c.row);
    const std::string error = updates_error(path);
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace ampscope::trace
