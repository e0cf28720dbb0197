// An independent reference: tests/safetensors/reference.py writes a file from the specification with
// Python's struct and json and numpy, which the reader must read to the values listed there; and it reads
// the writer's file back and checks the same values. Skips when Debian's python3 or numpy is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sys/wait.h>

#include "core/io/safetensors.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;

struct Expected {
  const char* name;
  DType dtype;
  Shape shape;
  std::vector<double> values;
};

// The same values as EXPECTED in reference.py.
const std::vector<Expected>& expected() {
  static const std::vector<Expected> e = {
      {"f32", DType::f32, {2, 3}, {1.5, -0.0, INFINITY, 1.401298464324817e-45, -3.25, 65504.0}},
      {"f16", DType::f16, {4}, {0.333251953125, -0.0, 5.960464477539063e-08, 65504.0}},
      {"bf16", DType::bf16, {3}, {1.0, -2.5, 3.3895313892515355e38}},
      {"f64", DType::f64, {2}, {0.1, -1e-310}},
      {"scalar", DType::f32, {}, {7.0}},
      {"empty", DType::f16, {0, 2}, {}},
  };
  return e;
}

// Runs reference.py; returns its exit status (77: numpy missing).
int run_reference(const std::string& mode, const fs::path& file) {
  const std::string python = "/usr/bin/python3";
  if (!fs::exists(python)) return 77;
  const std::string cmd = python + " " + AMPSCOPE_SOURCE_DIR + "/tests/safetensors/reference.py " + mode + " '" +
                          file.string() + "'";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool same(double a, double b) { return a == b && std::signbit(a) == std::signbit(b) ? true : (std::isnan(a) && std::isnan(b)); }

TEST(safetensors_reference_test, reads_the_python_reference_file_and_python_reads_ours) {
  const fs::path dir = testing::process_scratch_dir("ampscope_safetensors_ref");
  const fs::path theirs = dir / "python.safetensors";
  const int rc = run_reference("write", theirs);
  if (rc == 77) GTEST_SKIP() << "/usr/bin/python3 with numpy is missing (Debian's python3-numpy); no reference";
  ASSERT_EQ(rc, 0) << "reference.py write failed";

  const auto f = safetensors::File::open(theirs);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"source", "reference.py"}}));
  for (const auto& e : expected()) {
    const Tensor t = f.load(e.name);
    EXPECT_EQ(t.dtype(), e.dtype) << e.name;
    EXPECT_EQ(t.shape(), e.shape) << e.name;
    const auto v = t.values();
    ASSERT_EQ(v.size(), e.values.size()) << e.name;
    for (std::size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(same(v[i], e.values[i])) << e.name << "[" << i << "] " << v[i];
  }
  const Tensor i = f.load("i64");
  ASSERT_EQ(i.dtype(), DType::i64);
  const std::int64_t* iv = i.data_as<std::int64_t>();
  EXPECT_EQ(iv[0], std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(iv[1], 0);
  EXPECT_EQ(iv[2], std::numeric_limits<std::int64_t>::max());

  std::vector<std::pair<std::string, Tensor>> ours;
  for (const auto& e : expected()) ours.emplace_back(e.name, from_values(e.values, e.shape, {e.dtype}));
  Tensor i64 = Tensor::empty({3}, {DType::i64});
  i64.data_as<std::int64_t>()[0] = std::numeric_limits<std::int64_t>::min();
  i64.data_as<std::int64_t>()[1] = 0;
  i64.data_as<std::int64_t>()[2] = std::numeric_limits<std::int64_t>::max();
  ours.emplace_back("i64", i64);
  const fs::path mine = dir / "ours.safetensors";
  safetensors::save(mine, ours, {{"format", "pt"}, {"source", "reference.py"}});
  EXPECT_EQ(run_reference("check", mine), 0) << "reference.py check refused our file (its message is above)";
}

}  // namespace
}  // namespace ampscope
