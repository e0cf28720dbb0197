// The BLOCK-SCALED FORMATS section (probes/analysis/blocks.h) on a trace written here with hand-chosen /blocks rows:
// the report's text, its JSON section "blocks" and export's blocks.csv give back the numbers put in, and the
// fractions, medians and worst lists equal the arithmetic done by hand below (not what the code printed).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/export_command.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/blocks.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::analysis {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

trace::BlockRow row(std::int64_t step, const char* module, const char* operand, const char* copy, const char* format, bool what_if,
                    std::int64_t rows, std::int64_t cols, std::int64_t blocks) {
  trace::BlockRow r;
  r.step = step, r.module = module, r.operand = operand, r.copy = copy, r.format = format, r.what_if = what_if;
  r.rows = rows, r.cols = cols, r.numel = rows * cols, r.blocks = blocks;
  return r;
}

// A: fc1's input, rowwise MXFP8, trained: 32 x 96, 1 x 32 blocks, 3 a row (block b at row b / 3, col 32 (b % 3)).
// B: fc1's weight, NVFP4 what-if: 64 x 32 in 16 x 16 tiles, 2 a row. C: fc2's grad_output, columnwise MXFP8, all
// zeros at step 1 (no nonzero value, no scale).
std::vector<trace::BlockRow> hand_rows() {
  std::vector<trace::BlockRow> rows;
  auto a = [&](std::int64_t step) { return row(step, "fc1", "input", "rowwise", "mxfp8", false, 32, 96, 96); };
  auto b = [&](std::int64_t step) { return row(step, "fc1", "weight", "rowwise", "nvfp4", true, 64, 32, 8); };
  trace::BlockRow r = a(0);
  r.nonzero = 1000, r.underflow = 10, r.max_block_range = 5.0, r.max_range_block = 2, r.max_range_row = 0, r.max_range_col = 64;
  r.worst_block = 3, r.worst_block_underflow = 4, r.worst_block_row = 1, r.worst_block_col = 0;
  r.scale_log2_min = -8, r.scale_log2_median = -4, r.scale_log2_max = -1, r.rel_rms_error = 0.02;
  rows.push_back(r);
  r = b(0);
  r.nonzero = 1000, r.underflow = 120, r.max_block_range = 3.0, r.max_range_block = 1, r.max_range_row = 0, r.max_range_col = 16;
  r.worst_block = 2, r.worst_block_underflow = 100, r.worst_block_row = 16, r.worst_block_col = 0;
  r.scale_log2_min = -kInf, r.scale_log2_median = -6, r.scale_log2_max = -2, r.rel_rms_error = 0.2;
  rows.push_back(r);
  r = a(1);
  r.nonzero = 1000, r.underflow = 30, r.saturated = 5, r.blocks_clipped = 2, r.max_block_range = 7.5, r.max_range_block = 5;
  r.max_range_row = 1, r.max_range_col = 64, r.worst_block = 7, r.worst_block_underflow = 9, r.worst_block_row = 2;
  r.worst_block_col = 32, r.scale_log2_min = -9, r.scale_log2_median = -3, r.scale_log2_max = 0, r.rel_rms_error = 0.04;
  rows.push_back(r);
  r = b(1);
  r.nonzero = 1000, r.underflow = 80, r.saturated = 10, r.blocks_clipped = 1, r.max_block_range = 2.0, r.max_range_block = 0;
  r.max_range_row = 0, r.max_range_col = 0, r.worst_block = 5, r.worst_block_underflow = 40, r.worst_block_row = 32;
  r.worst_block_col = 16, r.scale_log2_min = -7, r.scale_log2_median = -5, r.scale_log2_max = -3, r.rel_rms_error = 0.1;
  rows.push_back(r);
  r = row(1, "fc2", "grad_output", "columnwise", "mxfp8", false, 32, 32, 32);  // all zeros: everything at its "none"
  rows.push_back(r);
  r = a(2);
  r.nonzero = 800, r.nonfinite = 4, r.blocks_nan = 1, r.max_block_range = 6.0, r.max_range_block = 0, r.max_range_row = 0;
  r.max_range_col = 0, r.rel_rms_error = 0.01;  // no scales: NaN, left out of the medians
  rows.push_back(r);
  return rows;
}

fs::path write_hand_trace(const trace::testing::TempDir& dir) {
  const fs::path path = dir.file("hand.h5");
  trace::RunInfo info = trace::testing::sample_run();
  info.precision = "bf16";  // trained A and C in mxfp8 on a bf16 run is not physical, but the rows are what is tested
  trace::TraceWriter w(path, info);
  const std::vector<trace::BlockRow> rows = hand_rows();
  for (std::int64_t s = 0; s < 3; ++s) {
    for (const trace::BlockRow& r : rows)
      if (r.step == s) w.write(r);
    w.write(trace::testing::numbered_step(s));
    w.end_step(s);
  }
  w.close();
  return path;
}

TEST(blocks_report_test, the_section_sums_each_copy_over_its_steps_as_worked_by_hand) {
  const std::vector<trace::BlockRow> rows = hand_rows();
  const BlockSection s = analyse_blocks(rows);
  EXPECT_EQ(s.rows, 6);
  EXPECT_EQ(s.what_if_rows, 2);
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.modules, 2);
  ASSERT_EQ(s.copies.size(), 3u);
  const BlockCopySummary& a = s.copies[0];
  EXPECT_EQ(a.module + " " + a.operand + " " + a.copy + " " + a.format, "fc1 input rowwise mxfp8");
  EXPECT_FALSE(a.what_if);
  EXPECT_EQ(a.steps, 3);
  EXPECT_EQ(a.nonzero, 2800);
  EXPECT_EQ(a.underflow, 40);
  EXPECT_EQ(a.saturated, 5);
  EXPECT_EQ(a.nonfinite, 4);
  EXPECT_EQ(a.blocks, 3 * 96);
  EXPECT_EQ(a.blocks_clipped, 2);
  EXPECT_EQ(a.blocks_nan, 1);
  EXPECT_DOUBLE_EQ(a.underflow_fraction, 40.0 / 2800.0);
  EXPECT_DOUBLE_EQ(a.saturated_fraction, 5.0 / 2800.0);
  EXPECT_EQ(a.worst_underflow_step, 1);
  EXPECT_DOUBLE_EQ(a.worst_underflow_fraction, 0.03);
  EXPECT_EQ(a.worst_saturated_step, 1);
  EXPECT_DOUBLE_EQ(a.worst_saturated_fraction, 0.005);
  EXPECT_EQ(a.max_block_range, 7.5);
  EXPECT_EQ(a.max_range_step, 1);
  EXPECT_EQ(a.max_range_block, 5);
  EXPECT_EQ(a.max_range_row, 1);
  EXPECT_EQ(a.max_range_col, 64);
  EXPECT_EQ(a.worst_block_underflow, 9);
  EXPECT_EQ(a.worst_block_step, 1);
  EXPECT_EQ(a.worst_block, 7);
  EXPECT_EQ(a.worst_block_row, 2);
  EXPECT_EQ(a.worst_block_col, 32);
  EXPECT_EQ(a.scale_log2_min, -9);
  EXPECT_EQ(a.scale_log2_max, 0);
  EXPECT_EQ(a.scale_log2_median, -4);  // the lower middle of the steps' medians {-4, -3} (step 2 has none)
  EXPECT_EQ(a.max_rel_rms_error, 0.04);
  EXPECT_DOUBLE_EQ(a.mean_rel_rms_error, (0.02 + 0.04 + 0.01) / 3);
  const BlockCopySummary& b = s.copies[1];
  EXPECT_EQ(b.module + " " + b.operand + " " + b.copy + " " + b.format, "fc1 weight rowwise nvfp4");
  EXPECT_TRUE(b.what_if);
  EXPECT_DOUBLE_EQ(b.underflow_fraction, 200.0 / 2000.0);
  EXPECT_EQ(b.worst_underflow_step, 0);
  EXPECT_DOUBLE_EQ(b.worst_underflow_fraction, 0.12);
  EXPECT_DOUBLE_EQ(b.saturated_fraction, 10.0 / 2000.0);
  EXPECT_EQ(b.scale_log2_min, -kInf);
  EXPECT_EQ(b.scale_log2_median, -6);
  EXPECT_EQ(b.scale_log2_max, -2);
  EXPECT_EQ(b.worst_block_underflow, 100);
  EXPECT_EQ(b.worst_block_row, 16);
  const BlockCopySummary& c = s.copies[2];
  EXPECT_EQ(c.module + " " + c.operand + " " + c.copy, "fc2 grad_output columnwise");
  EXPECT_EQ(c.underflow_fraction, 0);
  EXPECT_EQ(c.max_range_block, -1);
  EXPECT_EQ(c.worst_block, -1);
  EXPECT_TRUE(std::isnan(c.scale_log2_min) && std::isnan(c.scale_log2_median) && std::isnan(c.scale_log2_max));
  EXPECT_EQ(s.worst_underflow, (std::vector<std::size_t>{1, 0}));   // 10% before 1.43%; C lost nothing
  EXPECT_EQ(s.worst_saturation, (std::vector<std::size_t>{1, 0}));  // 0.5% before 0.179%
  // The per-copy rows the diagnoses will judge: in step order, what-if apart.
  const std::vector<BlockCopyRows> copies = group_block_rows(rows);
  ASSERT_EQ(copies.size(), 3u);
  ASSERT_EQ(copies[0].rows.size(), 3u);
  EXPECT_EQ(copies[0].rows[2]->step, 2);
  EXPECT_TRUE(copies[1].what_if);
  EXPECT_EQ(copies[1].rows[1]->underflow, 80);
}

TEST(blocks_report_test, report_text_json_and_export_give_back_the_rows_of_a_trace) {
  trace::testing::TempDir dir;
  const fs::path path = write_hand_trace(dir);
  trace::TraceReader reader(path);
  const Report rep = analyse(reader);
  ASSERT_EQ(rep.blocks.rows, 6);
  const std::string text = render_text(rep);
  for (const std::string& want : {
           std::string("BLOCK-SCALED FORMATS: 3 operand copies of 2 Linears over 3 recorded steps (0 to 2); 2 of 6 rows "
                       "what-if (measured only: the run did not train in that format)"),
           // 40 / 2800 = 1.428...%, 5 / 2800 = 0.1786%; step 1: 30 / 1000, 5 / 1000.
           std::string("fc1 input rowwise [mxfp8]: underflow 1.43% to 0 (step 1: 3%), saturated 0.179% (step 1: 0.5%); error "
                       "4% rms at most"),
           std::string("widest block 7.5 binades (block 5 at row 1, col 64, step 1); most lost in one block: 9 (block 7 at row "
                       "2, col 32, step 1); block scales 2^-9 .. 2^0 (median 2^-4)"),
           std::string("fc1 weight rowwise [nvfp4, what-if]: would underflow 10% to 0 (step 0: 12%), would saturate 0.5% "
                       "(step 1: 1%); error 20% rms at most"),
           std::string("block scales 2^-inf .. 2^-2 (median 2^-6)"),
           std::string("fc2 grad_output columnwise [mxfp8]: underflow 0% to 0"),
           std::string("no block holds two non-zero magnitudes; block scales 2^nan .. 2^nan (median 2^nan)"),
           std::string("worst by underflow: fc1 weight rowwise [nvfp4, what-if] would underflow 10% in nvfp4; fc1 input rowwise "
                       "[mxfp8] 1.43%"),
           std::string("worst by saturation: fc1 weight rowwise [nvfp4, what-if] would saturate 0.5% in nvfp4; fc1 input "
                       "rowwise [mxfp8] 0.179%"),
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << "missing: " << want << "\n" << text;
  }
  const nlohmann::json doc = nlohmann::json::parse(render_json(rep));
  const nlohmann::json& j = doc.at("blocks");
  EXPECT_EQ(j.at("recorded"), true);
  EXPECT_EQ(j.at("rows"), 6);
  EXPECT_EQ(j.at("what_if_rows"), 2);
  EXPECT_EQ(j.at("worst_underflow"), nlohmann::json::array({1, 0}));
  ASSERT_EQ(j.at("copies").size(), 3u);
  const nlohmann::json& a = j.at("copies")[0];
  EXPECT_EQ(a.at("module"), "fc1");
  EXPECT_EQ(a.at("what_if"), false);
  EXPECT_EQ(a.at("underflow"), 40);
  EXPECT_DOUBLE_EQ(a.at("underflow_fraction").get<double>(), 40.0 / 2800.0);
  EXPECT_EQ(a.at("max_range_row"), 1);
  EXPECT_EQ(a.at("max_range_col"), 64);
  EXPECT_EQ(a.at("worst_block_col"), 32);
  EXPECT_EQ(a.at("scale_log2_median"), -4.0);
  const nlohmann::json& b = j.at("copies")[1];
  EXPECT_EQ(b.at("what_if"), true);
  EXPECT_EQ(b.at("format"), "nvfp4");
  EXPECT_EQ(b.at("scale_log2_min"), "-inf");  // JSON has no infinity (docs/report-format.md)
  EXPECT_TRUE(j.at("copies")[2].at("scale_log2_min").is_null());
  // Export: blocks.csv, one line per row as written, in the trace's order.
  std::ostringstream out, err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = dir.file("csv").string()}, out, err), samples::kExportDone)
      << err.str();
  std::ifstream csv(dir.file("csv") / "blocks.csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0],
            "step,module,operand,copy,format,what_if,rows,cols,numel,nonzero,nonfinite,underflow,saturated,blocks,blocks_clipped,"
            "blocks_nan,max_block_range,max_range_block,max_range_row,max_range_col,worst_block,worst_block_underflow,"
            "worst_block_row,worst_block_col,scale_log2_min,scale_log2_median,scale_log2_max,rel_rms_error");
  EXPECT_EQ(lines[2], "0,fc1,weight,rowwise,nvfp4,true,64,32,2048,1000,0,120,0,8,0,0,3,1,0,16,2,100,16,0,-inf,-6,-2,0.2");
  EXPECT_EQ(lines[5], "1,fc2,grad_output,columnwise,mxfp8,false,32,32,1024,0,0,0,0,32,0,0,0,-1,-1,-1,-1,0,-1,-1,nan,nan,nan,0");
  EXPECT_EQ(lines[6], "2,fc1,input,rowwise,mxfp8,false,32,96,3072,800,4,0,0,96,0,1,6,0,0,0,-1,0,-1,-1,nan,nan,nan,0.01");
}

}  // namespace
}  // namespace ampscope::analysis
