// Token files written by numpy itself (tests/tokens/write_numpy.py, run with Debian's /usr/bin/python3):
// every supported dtype in format versions 1.0, 2.0 and 3.0 and as np.save writes it, 2-d and 3-d arrays,
// nanoGPT's .bin, and the arrays numpy writes that the reader refuses. Then the two lines of Python that
// docs/checkpoints.md gives for making --tokens, taken from the page and run on a fixed list of ids.
// Skips (saying why) when numpy is missing.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "models/token_data.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

const char* kPython = "/usr/bin/python3";

bool have_numpy() {
  if (!fs::exists(kPython)) return false;
  const int status = std::system((std::string(kPython) + " -c 'import numpy' 2>/dev/null").c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The files write_numpy.py writes, once per process.
const fs::path& numpy_dir() {
  static const fs::path dir = [] {
    const fs::path d = testing::process_scratch_dir("ampscope_tokens_numpy") / "files";
    fs::create_directories(d);
    const int rc = run(std::string(kPython) + " " + AMPSCOPE_SOURCE_DIR + "/tests/tokens/write_numpy.py '" +
                       d.string() + "'");
    if (rc != 0) throw std::runtime_error("write_numpy.py failed with status " + std::to_string(rc));
    return d;
  }();
  return dir;
}

#define SKIP_WITHOUT_NUMPY() \
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy is missing (Debian's python3-numpy, which python3-torch brings)"

TEST(numpy_files_test, reads_every_dtype_in_every_format_version_numpy_writes) {
  SKIP_WITHOUT_NUMPY();
  // The same lists as IDS in write_numpy.py, both written by hand.
  const std::map<std::string, Ids> expected = {
      {"i4", {0, 1, 50256, 65536, 2147483647}},
      {"i8", {0, 7, 50257, 128255, 2147483647}},
      {"u2", {0, 1, 255, 256, 50256, 65535}},
      {"u1", {0, 1, 104, 255}},
  };
  for (const auto& [name, ids] : expected) {
    for (const char* version : {"v1", "v2", "v3", "save"}) {
      const fs::path p = numpy_dir() / (name + "_" + version + ".npy");
      EXPECT_EQ(load_tokens(p), ids) << p;
    }
  }
}

TEST(numpy_files_test, reads_multidimensional_arrays_flattened_in_c_order) {
  SKIP_WITHOUT_NUMPY();
  EXPECT_EQ(load_tokens(numpy_dir() / "i4_2x3.npy"), (Ids{10, 11, 12, 20, 21, 22}));
  // np.arange(8).reshape(2, 2, 2) * 3
  EXPECT_EQ(load_tokens(numpy_dir() / "i8_2x2x2.npy"), (Ids{0, 3, 6, 9, 12, 15, 18, 21}));
}

TEST(numpy_files_test, reads_the_bin_nanogpt_writes_with_tofile) {
  SKIP_WITHOUT_NUMPY();
  EXPECT_EQ(load_tokens(numpy_dir() / "nanogpt.bin"), (Ids{0, 1, 255, 256, 50256, 65535}));
}

TEST(numpy_files_test, refuses_fortran_order_big_endian_and_float_arrays_numpy_wrote) {
  SKIP_WITHOUT_NUMPY();
  EXPECT_THROW_MSG(load_tokens(numpy_dir() / "fortran.npy"), TokenFileError, "Fortran", "shape (2, 3)",
                   "np.ascontiguousarray");
  EXPECT_THROW_MSG(load_tokens(numpy_dir() / "big_endian.npy"), TokenFileError, "dtype '>i4'", "big-endian");
  EXPECT_THROW_MSG(load_tokens(numpy_dir() / "float.npy"), TokenFileError, "dtype '<f4'", "floating point");
}

// The Python lines of docs/checkpoints.md's "Token files and batching" that write files: the lines of its
// first ```python block that call tofile( or np.save(.
std::vector<std::string> documented_writes() {
  std::ifstream in(std::string(AMPSCOPE_SOURCE_DIR) + "/docs/checkpoints.md");
  std::string line;
  bool in_section = false, in_block = false;
  std::vector<std::string> lines;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Token files and batching";
    if (!in_section) continue;
    if (line == "```python") {
      in_block = true;
    } else if (in_block && line == "```") {
      break;
    } else if (in_block && (line.find("tofile(") != std::string::npos || line.find("np.save(") != std::string::npos)) {
      lines.push_back(line);
    }
  }
  return lines;
}

TEST(numpy_files_test, the_documented_python_lines_write_files_the_reader_reads_back) {
  SKIP_WITHOUT_NUMPY();
  const std::vector<std::string> writes = documented_writes();
  ASSERT_EQ(writes.size(), 2u) << "docs/checkpoints.md's token section should hold a ```python block with a .bin "
                                  "line (tofile) and a .npy line (np.save)";
  const fs::path dir = testing::process_scratch_dir("ampscope_tokens_numpy") / "documented";
  fs::create_directories(dir);
  // What a tokenizer would return: GPT-2's ids of "Hello, world!<|endoftext|>" and one past uint8.
  std::string script = "import numpy as np\nids = [15496, 11, 995, 0, 50256, 256]\n";
  for (const std::string& w : writes) script += w + "\n";
  std::ofstream(dir / "snippet.py") << script;
  ASSERT_EQ(run("cd '" + dir.string() + "' && " + kPython + " snippet.py"), 0) << script;
  const Ids ids = {15496, 11, 995, 0, 50256, 256};
  EXPECT_EQ(load_tokens(dir / "tokens.bin"), ids);
  EXPECT_EQ(load_tokens(dir / "tokens.npy"), ids);
}

}  // namespace
}  // namespace ampscope::samples
