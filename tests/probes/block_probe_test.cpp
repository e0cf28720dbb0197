// Block-scaled operand statistics through the probe (probe::BlockQuantizeEvent -> trace::BlockRow -> /blocks): where a
// block's first element lies in each scale layout (worked by hand from core/block_scaled.h's layouts), which events
// become rows (level, recorded steps, module globs), and a trace the probe wrote read back by Debian's h5py as a
// user reads it.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "core/block_recipe.h"
#include "core/block_stats.h"
#include "core/probe_hook.h"
#include "probes/probe.h"
#include "probes/stats.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::probe {
namespace {

namespace fs = std::filesystem;

// Where block b starts: every layout, worked by hand. MXFP8 rowwise 64 x 96: 96 / 32 = 3 blocks a row, so block 7 is
// row 7 / 3 = 2, the 7 % 3 = 1st block, col 32. Columnwise: 64 / 32 = 2 block rows of 96 blocks; block 100 is block
// row 1 (row 32), col 4. NVFP4 weight 32 x 48 in 16 x 16 tiles: 2 x 3 tiles, tile 4 = (1, 1) at (16, 16). NVFP4
// input 4 x 48 in 1 x 16 blocks: 3 a row, block 5 = (1, 2) at (1, 32); its columnwise copy (the transpose, 48 x 4
// is not a multiple of 16 wide) has no layout.
TEST(block_probe_test, block_place_puts_each_layouts_blocks_where_the_scales_say) {
  auto at = [](const char* format, const char* copy, const char* operand, std::int64_t rows, std::int64_t cols, std::int64_t b) {
    const BlockPlace p = block_place(format, copy, operand, rows, cols, b);
    return std::pair{p.row, p.col};
  };
  EXPECT_EQ(at("mxfp8", "rowwise", "input", 64, 96, 0), std::pair(std::int64_t{0}, std::int64_t{0}));
  EXPECT_EQ(at("mxfp8", "rowwise", "input", 64, 96, 7), std::pair(std::int64_t{2}, std::int64_t{32}));
  EXPECT_EQ(at("mxfp8", "rowwise", "weight", 64, 96, 191), std::pair(std::int64_t{63}, std::int64_t{64}));
  EXPECT_EQ(at("mxfp8", "columnwise", "grad_output", 64, 96, 100), std::pair(std::int64_t{32}, std::int64_t{4}));
  EXPECT_EQ(at("mxfp8", "columnwise", "input", 64, 96, 95), std::pair(std::int64_t{0}, std::int64_t{95}));
  EXPECT_EQ(at("nvfp4", "rowwise", "weight", 32, 48, 4), std::pair(std::int64_t{16}, std::int64_t{16}));
  EXPECT_EQ(at("nvfp4", "columnwise", "weight", 32, 48, 5), std::pair(std::int64_t{16}, std::int64_t{32}));
  EXPECT_EQ(at("nvfp4", "rowwise", "input", 4, 48, 5), std::pair(std::int64_t{1}, std::int64_t{32}));
  EXPECT_EQ(at("nvfp4", "columnwise", "grad_output", 48, 16, 47), std::pair(std::int64_t{47}, std::int64_t{0}));
  // Nothing to place: no block, a block past the last, a shape the layout cannot have, an unknown format.
  const std::pair none{std::int64_t{-1}, std::int64_t{-1}};
  EXPECT_EQ(at("mxfp8", "rowwise", "input", 64, 96, -1), none);
  EXPECT_EQ(at("mxfp8", "rowwise", "input", 64, 96, 192), none);
  EXPECT_EQ(at("mxfp8", "columnwise", "input", 64, 96, 192), none);
  EXPECT_EQ(at("mxfp8", "rowwise", "input", 4, 40, 0), none);
  EXPECT_EQ(at("nvfp4", "columnwise", "input", 48, 4, 0), none);
  EXPECT_EQ(at("nvfp4", "rowwise", "weight", 8, 16, 0), none);  // 8 rows: no 16 x 16 tile
  EXPECT_EQ(at("e4m3", "rowwise", "input", 64, 96, 0), none);
}

BlockStats stats_for(std::int64_t step, int k) {
  BlockStats s;
  s.numel = 64 * 96;
  s.nonzero = 6000 - k;
  s.nonfinite = k == 2 ? 3 : 0;
  s.underflow = 10 * step + k;
  s.saturated = k;
  s.blocks = 192;
  s.blocks_clipped = k > 0 ? 1 : 0;
  s.blocks_nan = k == 2 ? 1 : 0;
  s.max_block_range = 9.5 + static_cast<double>(step);
  s.max_range_block = 7;
  if (s.underflow > 0) s.worst_block = 100 + k, s.worst_block_underflow = s.underflow;
  if (k == 1) {
    s.scale_log2_min = -std::numeric_limits<double>::infinity();
    s.scale_log2_median = -3;
    s.scale_log2_max = 2;
  } else if (k == 0) {
    s.scale_log2_min = -12, s.scale_log2_median = -5, s.scale_log2_max = -1;
  }  // k == 2: NaN scales (no block with a scale)
  s.rel_rms_error = 0.0625 + 0.001 * static_cast<double>(step) + 0.01 * k;
  return s;
}

// Events of steps 0 to 3 from fc1 (three operand copies) and head; the probe records every second step, fc* only.
std::shared_ptr<trace::TraceWriter> write_probe_trace(const fs::path& path, Level level) {
  const ProbeOptions options{.level = level, .modules = {"fc*"}, .every = 2};
  trace::RunInfo info{.precision = "mxfp8", .device = "cpu", .model = "blocks", .seed = 1, .config = "{}"};
  info.probe = describe(options);
  auto writer = std::make_shared<trace::TraceWriter>(path, info);
  auto probe = std::make_shared<Probe>(writer, options);
  {
    HookGuard installed(probe);
    for (std::int64_t n = 0; n < 4; ++n) {
      StepScope step(n);
      for (const std::string module : {"fc1", "head"}) {
        const BlockStats a = stats_for(n, 0), b = stats_for(n, 1), c = stats_for(n, 2);
        hook()->on_block_quantize({.step = n, .module = module, .operand = "input", .copy = "rowwise", .format = "mxfp8",
                                   .what_if = false, .rows = 64, .cols = 96, .stats = a});
        hook()->on_block_quantize({.step = n, .module = module, .operand = "grad_output", .copy = "columnwise",
                                   .format = "mxfp8", .what_if = false, .rows = 64, .cols = 96, .stats = b});
        hook()->on_block_quantize({.step = n, .module = module, .operand = "weight", .copy = "rowwise", .format = "nvfp4",
                                   .what_if = true, .rows = 64, .cols = 96, .stats = c});
      }
      step.end(StepSummary{.step = n, .loss = 1.0});
    }
  }
  probe->flush();
  writer->close();
  return writer;
}

TEST(block_probe_test, the_probe_turns_events_of_recorded_steps_and_wanted_modules_into_rows_h5py_reads) {
  const std::string python = "/usr/bin/python3";
  std::string out;
  if (!fs::exists(python) || trace::testing::run_command(python + " -c 'import h5py'", out) != 0) {
    GTEST_SKIP() << "Debian's h5py is missing (python3-h5py; scripts/setup.sh installs it): " << out;
  }
  trace::testing::TempDir dir;
  const fs::path path = dir.file("blocks.h5");
  write_probe_trace(path, Level::health);
  const fs::path script = dir.file("read.py");
  {
    std::ofstream s(script);
    // As docs/trace-format.md tells a user: texts are ids into /strings, located in /string_bytes.
    s << "import sys, math, h5py\n"
         "f = h5py.File(sys.argv[1], 'r')\n"
         "print('version', int(f.attrs['format_version']), f.attrs['precision'].decode())\n"
         "blob = f['string_bytes'][:].tobytes()\n"
         "s = f['strings'][:]\n"
         "texts = [blob[o:o + n].decode() for o, n in zip(s['offset'], s['length'])]\n"
         "b = f['blocks'][:]\n"
         "print('rows', len(b), 'index', int(f['index'][-1]['blocks']))\n"
         "for r in b:\n"
         "    print('row', int(r['step']), texts[r['module']], texts[r['operand']], texts[r['copy']], texts[r['format']],\n"
         "          bool(r['what_if']), int(r['rows']), int(r['cols']), int(r['numel']), int(r['nonzero']), int(r['nonfinite']),\n"
         "          int(r['underflow']), int(r['saturated']), int(r['blocks']), int(r['blocks_clipped']), int(r['blocks_nan']),\n"
         "          float(r['max_block_range']), int(r['max_range_block']), int(r['max_range_row']), int(r['max_range_col']),\n"
         "          int(r['worst_block']), int(r['worst_block_underflow']), int(r['worst_block_row']), int(r['worst_block_col']),\n"
         "          float(r['scale_log2_min']), float(r['scale_log2_median']), float(r['scale_log2_max']),\n"
         "          repr(float(r['rel_rms_error'])))\n";
  }
  ASSERT_EQ(trace::testing::run_command(python + " " + script.string() + " " + path.string(), out), 0) << out;
  EXPECT_NE(out.find("version " + std::to_string(trace::kFormatVersion) + " mxfp8"), std::string::npos) << out;
  // Steps 0 and 2 (every 2), fc1 only (head is not fc*): 2 x 3 rows.
  EXPECT_NE(out.find("rows 6 index 6"), std::string::npos) << out;
  // Step 2, the input's rowwise copy (k = 0): underflow 20, worst block 100 at row 100 / 3 = 33, col (100 % 3) * 32
  // = 32; widest block 7 at row 2, col 32; range 9.5 + 2; error 0.0625 + 0.002.
  EXPECT_NE(out.find("row 2 fc1 input rowwise mxfp8 False 64 96 6144 6000 0 20 0 192 0 0 11.5 7 2 32 100 20 33 32 -12.0 -5.0 "
                     "-1.0 "),
            std::string::npos)
      << out;
  // The columnwise grad_output (k = 1) at step 0: underflow 1 in block 101 = block row 1 (row 32), col 5; block 7 at
  // (0, 7); a zero block scale (-inf).
  EXPECT_NE(out.find("row 0 fc1 grad_output columnwise mxfp8 False 64 96 6144 5999 0 1 1 192 1 0 9.5 7 0 7 101 1 32 5 -inf "
                     "-3.0 2.0 "),
            std::string::npos)
      << out;
  // The what-if NVFP4 weight (k = 2) at step 2: 16 x 16 tiles, 4 x 6 of them; block 7 = tile (1, 1) at (16, 16);
  // block 102 is past the 24 tiles (these hand-made stats say 192 blocks, as 1 x 16 blocks would have): not placed,
  // -1 -1, and the row still reads; NaN scales.
  EXPECT_NE(out.find("row 2 fc1 weight rowwise nvfp4 True 64 96 6144 5998 3 22 2 192 1 1 11.5 7 16 16 102 22 -1 -1 nan nan "
                     "nan "),
            std::string::npos)
      << out;
  // Level dtype writes no /blocks rows (a pass-free level), as for /fp8.
  const fs::path quiet = dir.file("dtype.h5");
  write_probe_trace(quiet, Level::dtype);
  EXPECT_TRUE(trace::TraceReader(quiet).blocks().empty());
}

// block_place against the layouts the runtime really quantizes (core/block_recipe.h, which --precision mxfp8|nvfp4
// and --what-if both call): a matrix of ones with one outlier 1024 at (r, c) of the operand as the Linear holds it
// gives exactly one block with a range (log2 1024 = 10 binades), the one holding the outlier; the probe's placement
// of that block (from its number and the quantized matrix's shape) must be a block origin that contains the
// outlier's position in the quantized matrix: (r, c), or (c, r) for NVFP4's columnwise copies (the transpose).
// Every block number also agrees with core/block_stats.h block_origin of the quantized tensor itself.
TEST(block_probe_test, block_place_agrees_with_the_runtimes_quantized_layouts) {
  struct Case {
    BlockFormat format;
    Fp8Operand operand;
    bool columnwise;
    std::int64_t R, C, r, c;
  };
  const Case cases[] = {
      {BlockFormat::mxfp8, Fp8Operand::input, false, 64, 96, 37, 70},
      {BlockFormat::mxfp8, Fp8Operand::input, true, 64, 96, 37, 70},
      {BlockFormat::mxfp8, Fp8Operand::weight, true, 96, 64, 90, 3},
      {BlockFormat::mxfp8, Fp8Operand::grad_output, false, 32, 64, 31, 63},
      {BlockFormat::nvfp4, Fp8Operand::weight, false, 32, 48, 20, 37},
      {BlockFormat::nvfp4, Fp8Operand::weight, true, 32, 48, 20, 37},
      {BlockFormat::nvfp4, Fp8Operand::input, false, 32, 48, 5, 40},
      {BlockFormat::nvfp4, Fp8Operand::input, true, 32, 48, 5, 40},
      {BlockFormat::nvfp4, Fp8Operand::grad_output, true, 48, 16, 33, 9},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(testing::Message() << block_format_name(k.format) << " " << fp8_operand_name(k.operand) << " "
                                    << recipe_copy_name(k.columnwise) << " outlier at (" << k.r << ", " << k.c << ")");
    std::vector<float> m(static_cast<std::size_t>(k.R * k.C), 1.0f);
    m[static_cast<std::size_t>(k.r * k.C + k.c)] = 1024.0f;
    // No Hadamard transform: it would spread the outlier over 16 values of the wgrad copies.
    const BlockRecipe recipe{.format = k.format, .nvfp4_rht = false, .sr_seed = 1};
    std::uint64_t offset = 0;
    const RecipeCopy q = block_recipe_quantize(m, k.R, k.C, k.operand, k.columnwise, recipe, offset);
    const BlockStats s = block_recipe_stats(q);
    ASSERT_DOUBLE_EQ(s.max_block_range, 10.0);
    const bool transposed = k.format == BlockFormat::nvfp4 && k.columnwise;
    const std::int64_t qr = transposed ? k.c : k.r, qc = transposed ? k.r : k.c;
    const std::int64_t br = k.format == BlockFormat::mxfp8 ? (k.columnwise ? 32 : 1) : (k.operand == Fp8Operand::weight ? 16 : 1);
    const std::int64_t bc = k.format == BlockFormat::mxfp8 ? (k.columnwise ? 1 : 32) : 16;
    const std::string_view format = block_format_name(k.format);
    const BlockPlace p = block_place(format, recipe_copy_name(k.columnwise), fp8_operand_name(k.operand), q.rows,
                                     q.cols, s.max_range_block);
    EXPECT_EQ(p.row, qr / br * br);
    EXPECT_EQ(p.col, qc / bc * bc);
    for (std::int64_t b = 0; b < s.blocks; ++b) {
      const BlockOrigin o = std::visit([&](const auto& t) { return block_origin(t, b); }, q.tensor);
      const BlockPlace pb = block_place(format, recipe_copy_name(k.columnwise), fp8_operand_name(k.operand), q.rows,
                                        q.cols, b);
      ASSERT_EQ(pb.row, o.row) << "block " << b;
      ASSERT_EQ(pb.col, o.col) << "block " << b;
    }
  }
}

}  // namespace
}  // namespace ampscope::probe
