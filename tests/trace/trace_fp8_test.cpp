// /fp8 and the precision "fp8" (format_version 7): an FP8 run's trace writes and reads back every field of every
// row by step range, older traces read with no FP8 rows, and rows no probe writes are refused with the row and the
// field named.
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

RunInfo fp8_run() {
  RunInfo info = testing::sample_run();
  info.precision = "fp8";
  return info;
}

// A row whose every field is distinct and depends on (step, i).
Fp8Row numbered_fp8(std::int64_t step, std::int64_t i) {
  static const char* const operands[] = {"input", "weight", "grad_output"};
  return Fp8Row{.step = step,
                .module = "blocks." + std::to_string(i / 3) + ".fc",
                .operand = operands[i % 3],
                .format = i % 3 == 2 ? "e5m2" : "e4m3",
                .numel = 1000 + i,
                .nonzero = 900 + i - step,
                .underflow = 10 * step + i,
                .subnormal = 5 + i,
                .saturated = step,
                .amax = 3.5 + static_cast<double>(i),
                .scale = 448.0 / (3.5 + static_cast<double>(step)),
                .rel_rms_error = 0.0125 * static_cast<double>(i + 1),
                .dynamic_range = 10.5 + static_cast<double>(i),
                .quantized_dynamic_range = 9.25 + static_cast<double>(step),
                .history_len = i % 2 == 0 ? 1024 : 0,
                .history_amax = i % 2 == 0 ? 7.0 + static_cast<double>(step) : 0.0,
                .history_amax_step = i % 2 == 0 ? step - (i % 4 == 0 ? 1 : 0) : -1};
}

std::vector<Fp8Row> write_trace(const fs::path& path, int steps, int per_step, const Fp8Row* last = nullptr) {
  std::vector<Fp8Row> rows;
  TraceWriter w(path, fp8_run());
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < per_step; ++i) {
      rows.push_back(last != nullptr && s == steps - 1 && i == per_step - 1 ? *last : numbered_fp8(s, i));
      w.write(rows.back());
    }
    w.write(testing::numbered_step(s));
    w.end_step(s);
  }
  w.close();
  return rows;
}

void expect_same(const Fp8Row& want, const Fp8Row& got) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.module, want.module);
  EXPECT_EQ(got.operand, want.operand);
  EXPECT_EQ(got.format, want.format);
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.nonzero, want.nonzero);
  EXPECT_EQ(got.underflow, want.underflow);
  EXPECT_EQ(got.subnormal, want.subnormal);
  EXPECT_EQ(got.saturated, want.saturated);
  EXPECT_SAME_DOUBLE(want.amax, got.amax);
  EXPECT_SAME_DOUBLE(want.scale, got.scale);
  EXPECT_SAME_DOUBLE(want.rel_rms_error, got.rel_rms_error);
  EXPECT_SAME_DOUBLE(want.dynamic_range, got.dynamic_range);
  EXPECT_SAME_DOUBLE(want.quantized_dynamic_range, got.quantized_dynamic_range);
  EXPECT_EQ(got.history_len, want.history_len);
  EXPECT_SAME_DOUBLE(want.history_amax, got.history_amax);
  EXPECT_EQ(got.history_amax_step, want.history_amax_step);
}

TEST(trace_fp8_test, an_fp8_run_reads_back_its_precision_and_every_field_of_every_row_by_step_range) {
  TempDir dir;
  const fs::path path = dir.file("f.h5");
  const std::vector<Fp8Row> rows = write_trace(path, 3, 6);
  TraceReader r(path);
  EXPECT_EQ(r.format_version(), 9);
  EXPECT_EQ(r.run_info().precision, "fp8");
  EXPECT_TRUE(r.damage().empty());
  EXPECT_EQ(r.row_counts().fp8, 18);
  const std::vector<Fp8Row> all = r.fp8();
  ASSERT_EQ(all.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) expect_same(rows[i], all[i]);
  const std::vector<Fp8Row> middle = r.fp8(1, 2);
  ASSERT_EQ(middle.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) expect_same(rows[6 + i], middle[i]);
}

TEST(trace_fp8_test, older_traces_read_with_no_fp8_rows) {
  for (const char* name : {"v1-mlp-log-zero.h5", "v4-mlp-log-zero-full.h5", "v5-mlp-twin.h5"}) {
    SCOPED_TRACE(name);
    TraceReader r(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / name);
    EXPECT_LT(r.format_version(), 7);
    EXPECT_TRUE(r.fp8().empty());
    EXPECT_EQ(r.row_counts().fp8, 0);
    EXPECT_FALSE(r.steps().empty());
  }
}

// A format 7 trace written before the optional columns (tests/fixtures/v7-mlp-fp8.h5: `train --sample mlp --steps 3
// --seed 1 --precision fp8` by the ampscope of its time) reads every row, each with the "not recorded" values; a row
// written without them (history_len -1) reads back the same way.
TEST(trace_fp8_test, a_format_7_trace_without_the_optional_columns_reads_them_as_not_recorded) {
  TraceReader r(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v7-mlp-fp8.h5");
  EXPECT_EQ(r.format_version(), 7);
  EXPECT_TRUE(r.damage().empty());
  const std::vector<Fp8Row> rows = r.fp8();
  ASSERT_EQ(rows.size(), 27u);  // 3 steps x 3 Linears x 3 operands
  for (const Fp8Row& row : rows) {
    EXPECT_FALSE(fp8_has_range_columns(row));
    EXPECT_TRUE(std::isnan(row.dynamic_range));
    EXPECT_TRUE(std::isnan(row.quantized_dynamic_range));
    EXPECT_EQ(row.history_len, -1);
    EXPECT_TRUE(std::isnan(row.history_amax));
    EXPECT_EQ(row.history_amax_step, -1);
    EXPECT_GT(row.nonzero, 0);
    EXPECT_GT(row.scale, 0);
  }
  TempDir dir;
  Fp8Row bare = numbered_fp8(0, 0);
  bare.dynamic_range = bare.quantized_dynamic_range = bare.history_amax = std::numeric_limits<double>::quiet_NaN();
  bare.history_len = bare.history_amax_step = -1;
  const std::vector<Fp8Row> written = write_trace(dir.file("bare.h5"), 1, 1, &bare);
  TraceReader back(dir.file("bare.h5"));
  ASSERT_EQ(back.fp8().size(), 1u);
  expect_same(bare, back.fp8()[0]);
}

std::string fp8_error(const fs::path& path) {
  try {
    TraceReader r(path);
    r.fp8();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(read without an error)";
}

TEST(trace_fp8_test, refuses_a_row_no_probe_writes_naming_the_row_and_the_field) {
  TempDir dir;
  struct Case {
    const char* name;
    Fp8Row row;
    const char* says;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Fp8Row ok{.step = 1, .module = "fc1", .operand = "input", .format = "e4m3", .numel = 8, .nonzero = 6};
  auto with = [&](auto change) {
    Fp8Row r = ok;
    change(r);
    return r;
  };
  const Case cases[] = {
      {"operand", with([](Fp8Row& r) { r.operand = "bias"; }),
       "row 5 of '/fp8': its field 'operand' is \"bias\", not input, weight or grad_output"},
      {"format", with([](Fp8Row& r) { r.format = "e3m4"; }), "row 5 of '/fp8': its field 'format' is \"e3m4\", not e4m3 or e5m2"},
      {"numel", with([](Fp8Row& r) { r.numel = -1; }), "row 5 of '/fp8': its field 'numel' is -1, a negative count"},
      {"nonzero", with([](Fp8Row& r) { r.nonzero = 9; }), "row 5 of '/fp8': its field 'nonzero' is 9, not between 0 and numel (8)"},
      {"underflow", with([](Fp8Row& r) { r.underflow = 7; }),
       "row 5 of '/fp8': its field 'underflow' is 7, not between 0 and nonzero (6)"},
      {"sum", with([](Fp8Row& r) { r.underflow = 3, r.subnormal = 2, r.saturated = 2; }),
       "row 5 of '/fp8': its fields underflow, subnormal and saturated add up to 7, more than nonzero (6)"},
      {"scale", with([&](Fp8Row& r) { r.scale = nan; }), "row 5 of '/fp8': its field 'scale' is nan, not a non-negative number"},
      {"rel_rms_error", with([](Fp8Row& r) { r.rel_rms_error = -0.5; }),
       "row 5 of '/fp8': its field 'rel_rms_error' is -0.5, not a non-negative number"},
      // The optional columns, when a row has them (history_len not -1).
      {"dynamic_range", with([&](Fp8Row& r) { r.history_len = 16, r.quantized_dynamic_range = 1, r.history_amax = 1, r.dynamic_range = nan; }),
       "row 5 of '/fp8': its field 'dynamic_range' is nan, not a non-negative number"},
      {"quantized_dynamic_range", with([](Fp8Row& r) { r.history_len = 16, r.dynamic_range = 1, r.history_amax = 1, r.quantized_dynamic_range = -2; }),
       "row 5 of '/fp8': its field 'quantized_dynamic_range' is -2, not a non-negative number"},
      {"history_len", with([](Fp8Row& r) { r.history_len = -3, r.dynamic_range = 1, r.quantized_dynamic_range = 1; }),
       "row 5 of '/fp8': its field 'history_len' is -3, neither a length (0 or more) nor -1"},
      {"history_amax", with([](Fp8Row& r) { r.history_len = 16, r.dynamic_range = r.quantized_dynamic_range = 1, r.history_amax = -1; }),
       "row 5 of '/fp8': its field 'history_amax' is -1, a negative amax"},
      {"history_amax_step", with([](Fp8Row& r) { r.history_len = 16, r.dynamic_range = r.quantized_dynamic_range = 1, r.history_amax = 1, r.history_amax_step = 2; }),
       "row 5 of '/fp8': its field 'history_amax_step' is 2, neither -1 nor a step up to the row's (1)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path path = dir.file(std::string(c.name) + ".h5");
    write_trace(path, 2, 3, &c.row);
    const std::string error = fp8_error(path);
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace ampscope::trace
