// Tools outside ampscope read a finished trace: HDF5's h5dump prints the tables' field names and
// values and the root attributes, and Debian's h5py (/usr/bin/python3; CI installs python3-h5py and
// hdf5-tools through scripts/setup.sh) reads /steps and /ops by field name and sees complete = 1.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

void write_small_trace(const std::filesystem::path& path) {
  TraceWriter w(path, testing::sample_run(), {.chunk_rows = 4});
  for (int step = 0; step < 3; ++step) {
    for (int seq = 0; seq < 5; ++seq) w.write(testing::numbered_op(step, seq));
    w.write(testing::numbered_step(step));
    w.end_step(step);
  }
  w.close();
}

bool have_h5dump() {
  std::string out;
  return testing::run_command("h5dump --version", out) == 0;
}

TEST(trace_tools_test, h5dump_prints_fields_values_and_attributes) {
  if (!have_h5dump()) GTEST_SKIP() << "h5dump is not installed (Debian: hdf5-tools; scripts/setup.sh installs it)";
  TempDir dir;
  const auto path = dir.file("dump.h5");
  write_small_trace(path);
  std::string out;
  // -r prints /string_bytes (one-byte integers) as text: the texts back to back, as docs/trace-format.md shows.
  ASSERT_EQ(testing::run_command("h5dump -d /steps -d /ops -d /strings -a /complete -a /format -r -w 0 -d /string_bytes " +
                                     path.string(),
                                 out),
            0)
      << out;
  for (const char* field : {"\"step\"", "\"loss\"", "\"scale_after\"", "\"found_inf\"", "\"growth_tracker\"", "\"time_ms\"",
                            "\"phase\"", "\"op\"", "\"module\"", "\"in_dtypes\"", "\"out_dtype\"", "\"absmax_xor\"", "\"rms\"",
                            "\"cast_overflow\"", "\"origin\"", "\"offset\"", "\"length\"", "\"crc32\""}) {
    EXPECT_NE(out.find(field), std::string::npos) << "h5dump output lacks the field " << field << ":\n" << out;
  }
  // Values as written: a loss of 5 / 3, the format name; texts in the order first written: op (0, 0)'s
  // phase, op, module, dtypes.
  for (const char* value : {"1.66667", "\"ampscope-trace\"", "TRUE", "\"forwardlinearblocks.0.attn.qkvf16,f16,f16f16[1, 128]"}) {
    EXPECT_NE(out.find(value), std::string::npos) << "h5dump output lacks " << value << ":\n" << out.substr(0, 4000);
  }
  EXPECT_NE(out.find("ATTRIBUTE \"complete\""), std::string::npos);
}

TEST(trace_tools_test, debian_h5py_reads_steps_ops_and_complete) {
  const std::string python = "/usr/bin/python3";
  std::string out;
  if (!std::filesystem::exists(python)) GTEST_SKIP() << python << " is missing (Debian: python3-h5py)";
  if (testing::run_command(python + " -c 'import h5py'", out) != 0) {
    GTEST_SKIP() << "Debian's h5py is missing (python3-h5py; scripts/setup.sh installs it): " << out;
  }
  TempDir dir;
  const auto path = dir.file("py.h5");
  write_small_trace(path);
  const auto script = dir.file("read.py");
  {
    std::ofstream s(script);
    s << "import sys, h5py\n"
         "f = h5py.File(sys.argv[1], 'r')\n"
         "print('complete', int(f.attrs['complete']))\n"
         // Fixed-length text attributes (format_version 3) read as bytes.
         "print('format', f.attrs['format'].decode(), int(f.attrs['format_version']), f.attrs['precision'].decode())\n"
         "import zlib\n"
         "a = f.attrs\n"
         "text = b''.join(n.encode() + b'\\0' + (a[n] if isinstance(a[n], bytes) else str(int(a[n])).encode()) + b'\\0'\n"
         "               for n in ['format', 'format_version', 'precision', 'device', 'model', 'seed', 'config', 'probe'])\n"
         "print('crc', zlib.crc32(text) == int(a['attributes_crc32']))\n"
         "steps = f['steps']\n"
         "print('steps', len(steps), list(steps['step']), round(float(steps['loss'][2]), 6), list(steps['found_inf']))\n"
         // Texts (format_version 4): ids into /strings, whose rows locate them in /string_bytes, with their CRC-32.
         "blob = f['string_bytes'][:].tobytes()\n"
         "s = f['strings'][:]\n"
         "texts = [blob[o:o + n].decode() for o, n in zip(s['offset'], s['length'])]\n"
         "print('texts crc', all(zlib.crc32(t.encode()) == c for t, c in zip(texts, s['crc32'])))\n"
         "ops = f['ops'][:]\n"
         "print('ops', len(ops), texts[ops['op'][0]], texts[ops['module'][4]], texts[ops['phase'][1]], float(ops['mean'][14]))\n";
  }
  ASSERT_EQ(testing::run_command(python + " " + script.string() + " " + path.string(), out), 0) << out;
  EXPECT_NE(out.find("complete 1"), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("format ampscope-trace {} ", kFormatVersion)), std::string::npos) << out;
  // docs/trace-format.md's recipe for checking attributes_crc32 by hand.
  EXPECT_NE(out.find("crc True"), std::string::npos) << out;
  EXPECT_NE(out.find("texts crc True"), std::string::npos) << out;
  // numbered_step: loss = 5 / (step + 1); found_inf on odd steps.
  EXPECT_NE(out.find("steps 3 [0, 1, 2] 1.666667 [False, True, False]"), std::string::npos) << out;
  // numbered_op: op "linear" when seq % 3 == 0, module blocks.(seq % 7), phase seq % 4, mean step*1000+seq+0.25.
  EXPECT_NE(out.find("ops 15 linear blocks.4.attn.qkv backward 2004.25"), std::string::npos) << out;
}

}  // namespace
}  // namespace ampscope::trace
