// /blocks and the precisions "mxfp8" and "nvfp4" (format_version 8): a block-scaled run's trace writes and reads
// back every field of every row by step range (NaN and -inf scales included), older traces read with no block rows
// (and may not claim the new precisions), and rows no probe writes are refused with the row and the field named.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "probes/trace/hdf5_io.h"
#include "probes/trace/layout.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

RunInfo block_run(const char* precision) {
  RunInfo info = testing::sample_run();
  info.precision = precision;
  return info;
}

// A row whose every field is distinct and depends on (step, i), consistent as a probe writes it: a 64 x 96 matrix
// (numel 6144); every third row has no scales (NaN) and every fifth a zero NVFP4 block scale (-inf minimum).
BlockRow numbered_block(std::int64_t step, std::int64_t i) {
  static const char* const operands[] = {"input", "weight", "grad_output"};
  BlockRow r;
  r.step = step;
  r.module = "blocks." + std::to_string(i / 6) + ".fc";
  r.operand = operands[i % 3];
  r.copy = i % 2 == 0 ? "rowwise" : "columnwise";
  r.format = i % 4 < 2 ? "mxfp8" : "nvfp4";
  r.what_if = i % 3 == 1;
  r.rows = 64;
  r.cols = 96;
  r.numel = 64 * 96;
  r.nonzero = 6000 - 7 * i - step;
  r.nonfinite = i % 5 == 3 ? 2 : 0;
  r.underflow = 11 * step + i;
  r.saturated = step + 2 * i;
  r.blocks = 192 + i;
  r.blocks_clipped = i % 7;
  r.blocks_nan = r.nonfinite > 0 ? 1 : 0;
  r.max_block_range = 3.25 + 0.5 * static_cast<double>(i) + static_cast<double>(step);
  r.max_range_block = (5 * i + step) % r.blocks;
  r.max_range_row = (i + step) % 64;
  r.max_range_col = 32 * (i % 3);
  if (r.underflow > 0) {
    r.worst_block = (3 * i + 1) % r.blocks;
    r.worst_block_underflow = 1 + (r.underflow - 1) / 2;
    r.worst_block_row = 16 * (i % 4);
    r.worst_block_col = 16 * (step % 6);
  }
  if (i % 3 == 2) {
    r.scale_log2_min = r.scale_log2_median = r.scale_log2_max = kNaN;
  } else {
    r.scale_log2_min = i % 5 == 0 ? -kInf : -10.0 - static_cast<double>(i);
    r.scale_log2_median = -4.5 + 0.25 * static_cast<double>(step);
    r.scale_log2_max = 2.0 + static_cast<double>(i);
  }
  r.rel_rms_error = 0.0078125 * static_cast<double>(i + 1) + 0.001 * static_cast<double>(step);
  return r;
}

std::vector<BlockRow> write_trace(const fs::path& path, int steps, int per_step, const BlockRow* last = nullptr,
                                  const char* precision = "mxfp8") {
  std::vector<BlockRow> rows;
  TraceWriter w(path, block_run(precision));
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < per_step; ++i) {
      rows.push_back(last != nullptr && s == steps - 1 && i == per_step - 1 ? *last : numbered_block(s, i));
      w.write(rows.back());
    }
    w.write(testing::numbered_step(s));
    w.end_step(s);
  }
  w.close();
  return rows;
}

void expect_same(const BlockRow& want, const BlockRow& got) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.module, want.module);
  EXPECT_EQ(got.operand, want.operand);
  EXPECT_EQ(got.copy, want.copy);
  EXPECT_EQ(got.format, want.format);
  EXPECT_EQ(got.what_if, want.what_if);
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.cols, want.cols);
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.nonzero, want.nonzero);
  EXPECT_EQ(got.nonfinite, want.nonfinite);
  EXPECT_EQ(got.underflow, want.underflow);
  EXPECT_EQ(got.saturated, want.saturated);
  EXPECT_EQ(got.blocks, want.blocks);
  EXPECT_EQ(got.blocks_clipped, want.blocks_clipped);
  EXPECT_EQ(got.blocks_nan, want.blocks_nan);
  EXPECT_SAME_DOUBLE(want.max_block_range, got.max_block_range);
  EXPECT_EQ(got.max_range_block, want.max_range_block);
  EXPECT_EQ(got.max_range_row, want.max_range_row);
  EXPECT_EQ(got.max_range_col, want.max_range_col);
  EXPECT_EQ(got.worst_block, want.worst_block);
  EXPECT_EQ(got.worst_block_underflow, want.worst_block_underflow);
  EXPECT_EQ(got.worst_block_row, want.worst_block_row);
  EXPECT_EQ(got.worst_block_col, want.worst_block_col);
  EXPECT_SAME_DOUBLE(want.scale_log2_min, got.scale_log2_min);
  EXPECT_SAME_DOUBLE(want.scale_log2_median, got.scale_log2_median);
  EXPECT_SAME_DOUBLE(want.scale_log2_max, got.scale_log2_max);
  EXPECT_SAME_DOUBLE(want.rel_rms_error, got.rel_rms_error);
}

TEST(trace_blocks_test, a_block_scaled_run_reads_back_its_precision_and_every_field_of_every_row_by_step_range) {
  for (const char* precision : {"mxfp8", "nvfp4", "bf16"}) {  // bf16: a --what-if run's rows
    SCOPED_TRACE(precision);
    TempDir dir;
    const fs::path path = dir.file("b.h5");
    const std::vector<BlockRow> rows = write_trace(path, 3, 12, nullptr, precision);
    TraceReader r(path);
    EXPECT_EQ(r.format_version(), 9);
    EXPECT_EQ(r.run_info().precision, precision);
    EXPECT_TRUE(r.damage().empty());
    EXPECT_EQ(r.row_counts().blocks, 36);
    EXPECT_EQ(r.row_counts().fp8, 0);
    const std::vector<BlockRow> all = r.blocks();
    ASSERT_EQ(all.size(), rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) expect_same(rows[i], all[i]);
    const std::vector<BlockRow> middle = r.blocks(1, 2);
    ASSERT_EQ(middle.size(), 12u);
    for (std::size_t i = 0; i < 12; ++i) expect_same(rows[12 + i], middle[i]);
    // The rows the generator made hold what the test is about: NaN scales, a -inf minimum, what-if rows.
    EXPECT_TRUE(std::isnan(all[2].scale_log2_median));
    EXPECT_EQ(all[0].scale_log2_min, -kInf);
    EXPECT_TRUE(all[1].what_if);
    EXPECT_FALSE(all[0].what_if);
  }
}

TEST(trace_blocks_test, older_traces_read_with_no_block_rows) {
  for (const char* name : {"v1-mlp-log-zero.h5", "v4-mlp-log-zero-full.h5", "v5-mlp-twin.h5", "v7-mlp-fp8.h5"}) {
    SCOPED_TRACE(name);
    TraceReader r(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / name);
    EXPECT_LT(r.format_version(), 8);
    EXPECT_TRUE(r.blocks().empty());
    EXPECT_EQ(r.row_counts().blocks, 0);
    EXPECT_FALSE(r.steps().empty());
  }
  // The format 7 fixture's /fp8 rows still read beside the empty /blocks.
  TraceReader v7(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v7-mlp-fp8.h5");
  EXPECT_EQ(v7.fp8().size(), 27u);
}

// mxfp8 and nvfp4 came with format_version 8: a format 7 trace that claims one (its attribute checksum recomputed,
// so only the schema can tell) is damaged, as an fp8 format 6 trace is.
TEST(trace_blocks_test, a_format_7_trace_that_claims_a_block_scaled_precision_is_damaged) {
  for (const char* precision : {"mxfp8", "nvfp4"}) {
    SCOPED_TRACE(precision);
    TempDir dir;
    const fs::path path = dir.file("v7.h5");
    fs::copy_file(fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v7-mlp-fp8.h5", path);
    RunInfo info;
    { info = TraceReader(path).run_info(); }
    info.precision = precision;
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    ASSERT_GE(H5Adelete(file, "precision"), 0);
    const detail::Io io(path.string(), "forge");
    detail::write_text_attribute(io, file, "/", "precision", info.precision);
    detail::rewrite_int_attribute(io, file, "/", "attributes_crc32", detail::root_attributes_crc32(kFormat, 7, info));
    H5Fclose(file);
    std::string error = "(read without an error)";
    try {
      TraceReader r(path);
    } catch (const TraceError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(fmt::format("the root attribute 'precision' is \"{}\", not fp32, fp16, bf16 or fp8: damaged", precision)),
              std::string::npos)
        << error;
  }
}

std::string blocks_error(const fs::path& path) {
  try {
    TraceReader r(path);
    r.blocks();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(read without an error)";
}

TEST(trace_blocks_test, refuses_a_row_no_probe_writes_naming_the_row_and_the_field) {
  TempDir dir;
  struct Case {
    const char* name;
    BlockRow row;
    const char* says;
  };
  BlockRow ok;
  ok.step = 1, ok.module = "fc1", ok.operand = "input", ok.copy = "rowwise", ok.format = "nvfp4";
  ok.rows = 4, ok.cols = 32, ok.numel = 128, ok.nonzero = 100, ok.nonfinite = 2, ok.underflow = 10, ok.saturated = 5;
  ok.blocks = 8, ok.blocks_clipped = 2, ok.blocks_nan = 1;
  ok.max_block_range = 7.5, ok.max_range_block = 3, ok.max_range_row = 1, ok.max_range_col = 16;
  ok.worst_block = 6, ok.worst_block_underflow = 4, ok.worst_block_row = 3, ok.worst_block_col = 0;
  ok.scale_log2_min = -9, ok.scale_log2_median = -3, ok.scale_log2_max = 1, ok.rel_rms_error = 0.09;
  auto with = [&](auto change) {
    BlockRow r = ok;
    change(r);
    return r;
  };
  const Case cases[] = {
      {"operand", with([](BlockRow& r) { r.operand = "bias"; }),
       "row 5 of '/blocks': its field 'operand' is \"bias\", not input, weight or grad_output"},
      {"copy", with([](BlockRow& r) { r.copy = "diagonal"; }), "row 5 of '/blocks': its field 'copy' is \"diagonal\", not rowwise or columnwise"},
      {"format", with([](BlockRow& r) { r.format = "e4m3"; }), "row 5 of '/blocks': its field 'format' is \"e4m3\", not mxfp8 or nvfp4"},
      {"negative", with([](BlockRow& r) { r.nonfinite = -1; }), "row 5 of '/blocks': its field 'nonfinite' is -1, a negative count"},
      {"numel", with([](BlockRow& r) { r.numel = 127; }), "row 5 of '/blocks': its field 'numel' is 127, not rows x cols (4 x 32)"},
      {"numel overflow", with([](BlockRow& r) { r.rows = std::int64_t{1} << 33, r.cols = std::int64_t{1} << 31, r.numel = 0; }),
       "row 5 of '/blocks': its field 'numel' is 0, not rows x cols (8589934592 x 2147483648)"},
      {"nonzero", with([](BlockRow& r) { r.nonzero = 127; }),
       "row 5 of '/blocks': its fields nonzero and nonfinite add up to more than numel (127 + 2 > 128)"},
      {"underflow", with([](BlockRow& r) { r.underflow = 96; }),
       "row 5 of '/blocks': its fields underflow and saturated add up to more than nonzero (96 + 5 > 100)"},
      {"blocks", with([](BlockRow& r) { r.blocks = 129; }), "row 5 of '/blocks': its field 'blocks' is 129, more than numel (128)"},
      {"blocks_clipped", with([](BlockRow& r) { r.blocks_clipped = 9; }),
       "row 5 of '/blocks': its field 'blocks_clipped' is 9, more than blocks (8)"},
      {"max_range_block", with([](BlockRow& r) { r.max_range_block = 8; }),
       "row 5 of '/blocks': its field 'max_range_block' is 8, neither -1 nor one of the row's 8 blocks"},
      {"max_range origin", with([](BlockRow& r) { r.max_range_col = 32; }),
       "row 5 of '/blocks': its fields 'max_range_row' and 'max_range_col' are 1 and 32, outside the 4 x 32 matrix"},
      {"half an origin", with([](BlockRow& r) { r.worst_block_row = -1; }),
       "row 5 of '/blocks': its fields 'worst_block_row' and 'worst_block_col' are -1 and 0, outside the 4 x 32 matrix"},
      {"no block, an origin", with([](BlockRow& r) { r.max_range_block = -1; }),
       "row 5 of '/blocks': its fields 'max_range_row' and 'max_range_col' are 1 and 16, not -1 with max_range_block -1"},
      {"worst_block_underflow", with([](BlockRow& r) { r.worst_block_underflow = 11; }),
       "row 5 of '/blocks': its field 'worst_block_underflow' is 11, not between 1 and underflow (10) with a worst_block, nor 0 "
       "without one"},
      {"max_block_range", with([&](BlockRow& r) { r.max_block_range = kNaN; }),
       "row 5 of '/blocks': its field 'max_block_range' is nan, not a finite non-negative number"},
      {"rel_rms_error", with([&](BlockRow& r) { r.rel_rms_error = kInf; }),
       "row 5 of '/blocks': its field 'rel_rms_error' is inf, not a finite non-negative number"},
      {"scale NaN beside numbers", with([&](BlockRow& r) { r.scale_log2_median = kNaN; }),
       "row 5 of '/blocks': its fields scale_log2_min, scale_log2_median and scale_log2_max are -9, nan and 1: NaN beside numbers"},
      {"scale order", with([](BlockRow& r) { r.scale_log2_max = -4; }),
       "row 5 of '/blocks': its fields scale_log2_min, scale_log2_median and scale_log2_max are -9, -3 and -4: not in order "
       "below +inf"},
      {"scale +inf", with([&](BlockRow& r) { r.scale_log2_max = kInf; }),
       "row 5 of '/blocks': its fields scale_log2_min, scale_log2_median and scale_log2_max are -9, -3 and inf: not in order "
       "below +inf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path path = dir.file(std::string(c.name) + ".h5");
    write_trace(path, 2, 3, &c.row);
    const std::string error = blocks_error(path);
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
  // The row the cases edit reads back as it is, and so does a block the probe could not place (origin -1, -1).
  const fs::path sound = dir.file("sound.h5");
  write_trace(sound, 2, 3, &ok);
  TraceReader r(sound);
  ASSERT_EQ(r.blocks().size(), 6u);
  expect_same(ok, r.blocks()[5]);
  BlockRow unplaced = ok;
  unplaced.worst_block_row = unplaced.worst_block_col = -1;
  write_trace(dir.file("unplaced.h5"), 1, 1, &unplaced);
  ASSERT_EQ(TraceReader(dir.file("unplaced.h5")).blocks().size(), 1u);
  expect_same(unplaced, TraceReader(dir.file("unplaced.h5")).blocks()[0]);
}

}  // namespace
}  // namespace ampscope::trace
