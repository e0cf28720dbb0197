// docs/examples/read_trace.py, the h5py + pandas example docs/trace-format.md quotes, run with Debian's
// /usr/bin/python3 on a trace written here (texts with commas, quotes, a line break, non-ASCII, a module
// named "nan", a 200-byte path) and on its CSV export: what it prints equals the reader's values (floats by
// repr, which reads back exactly; texts as JSON strings). Skips, saying why, without python3-h5py or
// python3-pandas (scripts/setup.sh installs both, so CI runs it).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/export_command.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const std::string kPython = "/usr/bin/python3";
const fs::path kExample = fs::path(AMPSCOPE_SOURCE_DIR) / "docs" / "examples" / "read_trace.py";

// A line the example printed, split into words; a word that starts with a quote is a JSON string (which
// may hold spaces), decoded.
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < line.size()) {
    if (line[i] == ' ') {
      ++i;
      continue;
    }
    if (line[i] == '"') {
      std::size_t j = i + 1;
      while (j < line.size() && line[j] != '"') j += line[j] == '\\' ? 2 : 1;
      out.push_back(nlohmann::json::parse(line.substr(i, j + 1 - i)).get<std::string>());
      i = j + 1;
    } else {
      const std::size_t j = std::min(line.find(' ', i), line.size());
      out.push_back(line.substr(i, j - i));
      i = j;
    }
  }
  return out;
}

double number(const std::string& text) { return std::strtod(text.c_str(), nullptr); }  // repr: "nan", "inf", "-0.0"

std::vector<std::vector<std::string>> lines_starting(const std::string& output, const std::string& label) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(label + " ", 0) == 0) out.push_back(words(line.substr(label.size() + 1)));
  }
  return out;
}

TEST(trace_python_example_test, read_trace_py_prints_the_readers_values_from_hdf5_and_from_csv) {
  std::string out;
  if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " is missing (Debian: python3-h5py python3-pandas)";
  if (testing::run_command(kPython + " -c 'import h5py'", out) != 0) {
    GTEST_SKIP() << "Debian's h5py is missing (python3-h5py; scripts/setup.sh installs it): " << out;
  }
  if (testing::run_command(kPython + " -c 'import pandas'", out) != 0) {
    GTEST_SKIP() << "Debian's pandas is missing (python3-pandas; scripts/setup.sh installs it): " << out;
  }
  TempDir dir;
  const auto path = dir.file("run.h5");
  const std::vector<std::string> modules = {"blocks.0.attn", "a,b \"quoted\"", "line\nbreak", "\xE6\xA8\xA1\xE5\x9D\x97", "nan", "0",
                                            std::string(200, 'p'), ""};
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 4});
    for (std::int64_t step = 0; step < 3; ++step) {
      for (std::int64_t seq = 0; seq < 8; ++seq) {
        OpRow o = testing::numbered_op(step, seq);
        o.module = modules[static_cast<std::size_t>(seq)];
        if (seq == 2) o.health.nan = 0, o.health.pos_inf = 0, o.health.neg_inf = 0;
        if (seq == 3) o.health.mean = std::nan("");
        if (seq == 4) o.health.mean = 1.0 / 3.0;
        o.inputs[0] = seq - 1;
        w.write(o);
      }
      StepRow s = testing::numbered_step(step);
      if (step == 2) s.loss = std::numeric_limits<double>::infinity();
      w.write(s);
      w.end_step(step);
    }
    w.close();
  }
  std::ostringstream export_out, export_err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = dir.file("csv").string()}, export_out, export_err), samples::kExportDone)
      << export_err.str();
  ASSERT_EQ(testing::run_command(fmt::format("{} {} {} {}", kPython, kExample.string(), path.string(), dir.file("csv").string()), out), 0)
      << out;

  TraceReader r(path);
  const auto steps = r.steps();
  const auto printed_steps = lines_starting(out, "step");
  ASSERT_EQ(printed_steps.size(), steps.size()) << out;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& p = printed_steps[i];
    ASSERT_EQ(p.size(), 4u) << out;
    EXPECT_EQ(std::stoll(p[0]), steps[i].step);
    EXPECT_SAME_DOUBLE(steps[i].loss, number(p[1]));
    EXPECT_SAME_DOUBLE(steps[i].scale, number(p[2]));
    EXPECT_EQ(p[3], steps[i].skipped ? "True" : "False");
  }
  const auto ops = r.ops();
  EXPECT_NE(out.find(fmt::format("ops {}\n", ops.size())), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("csv ops {}\n", ops.size())), std::string::npos) << out;
  for (const char* label : {"op", "csv op"}) {
    SCOPED_TRACE(label);
    const auto printed = lines_starting(out, label);
    ASSERT_EQ(printed.size(), std::min<std::size_t>(20, ops.size())) << out;
    for (std::size_t i = 0; i < printed.size(); ++i) {
      const auto& p = printed[i];
      ASSERT_EQ(p.size(), 8u) << out;
      EXPECT_EQ(std::stoll(p[0]), ops[i].step);
      EXPECT_EQ(std::stoll(p[1]), ops[i].seq);
      EXPECT_EQ(p[2], phase_name(ops[i].phase));
      EXPECT_EQ(p[3], ops[i].op);
      EXPECT_EQ(p[4], ops[i].module);
      EXPECT_SAME_DOUBLE(ops[i].health.mean, number(p[5]));
      // From h5py: format_version 9's absmax_xor and the docs' numpy recipe (from the CSV: the export's absmax).
      EXPECT_SAME_DOUBLE(ops[i].health.absmax, number(p[6]));
      EXPECT_EQ(std::stoll(p[7]), ops[i].inputs[0]);
    }
  }
  // The ops whose output holds NaN or inf, and their names.
  std::set<std::string> names;
  std::size_t nonfinite = 0;
  for (const OpRow& o : ops) {
    if (o.health.nan + o.health.pos_inf + o.health.neg_inf > 0) {
      ++nonfinite;
      names.insert(o.op);
    }
  }
  const auto printed = lines_starting(out, "nonfinite");
  ASSERT_EQ(printed.size(), 1u) << out;
  EXPECT_EQ(std::stoull(printed[0][0]), nonfinite);
  std::string expected_names;
  for (const std::string& n : names) expected_names += (expected_names.empty() ? "[\"" : ", \"") + n + "\"";
  EXPECT_NE(out.find(fmt::format("nonfinite {} {}]", nonfinite, expected_names)), std::string::npos) << out;
}

TEST(trace_python_example_test, the_trace_format_page_quotes_the_example_as_it_is) {
  // docs/trace-format.md shows read_texts, read_table and read_ops_csv of the example: word for word.
  auto text_of = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string example = text_of(kExample);
  const std::string page = text_of(fs::path(AMPSCOPE_SOURCE_DIR) / "docs" / "trace-format.md");
  for (const char* function : {"def read_texts(", "def read_table(", "def read_ops_csv("}) {
    const std::size_t begin = example.find(function);
    ASSERT_NE(begin, std::string::npos) << function;
    const std::size_t end = example.find("\n\n\n", begin);
    const std::string body = example.substr(begin, end - begin);
    EXPECT_NE(page.find(body), std::string::npos) << "docs/trace-format.md does not quote this part of read_trace.py:\n" << body;
  }
}

}  // namespace
}  // namespace ampscope::trace
