// tests/support/python_reference.h: running an independent Python/PyTorch reference (Debian's /usr/bin/python3
// with python3-torch) from a test and reading back what it printed, one line per named result:
//   NAME VALUE VALUE ...      (values as Python's float.hex() or any form strtod reads)
// The scripts share tests/support/reference_io.py (the safetensors reader and the printing).
//
//   const std::string why = testing::torch_missing("T5 is compared with PyTorch 1.13 where it is");
//   if (!why.empty()) GTEST_SKIP() << why;
//   auto ref = testing::run_python_reference("tests/hf_t5/reference_t5.py", {folder.string(), "2"});
//   testing::expect_close("f32 logits", ours, ref.at("logits_f32"), 1e-5);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ampscope::testing {

// Runs a shell command; `output` gets its standard output and error. Returns pclose's status (0: exit 0).
inline int run_shell(const std::string& command, std::string& output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  return ::pclose(pipe);
}

// "" where /usr/bin/python3 imports torch; otherwise the skip message, ending in `where_compared` (what the
// test compares with PyTorch where it is installed).
inline std::string torch_missing(const std::string& where_compared) {
  std::string out;
  if (!std::filesystem::exists("/usr/bin/python3") || run_shell("/usr/bin/python3 -c 'import torch'", out) != 0) {
    return "Debian's python3-torch is not installed (apt-get install python3-torch); " + where_compared;
  }
  return "";
}

// name -> values, from lines "NAME V V ...".
inline std::map<std::string, std::vector<double>> parse_named_values(const std::string& text) {
  std::map<std::string, std::vector<double>> result;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name, value;
    fields >> name;
    std::vector<double>& v = result[name];
    while (fields >> value) v.push_back(std::strtod(value.c_str(), nullptr));
  }
  return result;
}

// Runs /usr/bin/python3 on `script` (relative to the source tree) with `args` (each single-quoted) and parses
// its output; throws, with the script's output, when it fails.
inline std::map<std::string, std::vector<double>> run_python_reference(const std::string& script,
                                                                       const std::vector<std::string>& args) {
  std::string cmd = "/usr/bin/python3 " + std::string(AMPSCOPE_SOURCE_DIR) + "/" + script;
  for (const std::string& a : args) cmd += " '" + a + "'";
  std::string out;
  if (run_shell(cmd, out) != 0) throw std::runtime_error(script + " failed:\n" + out);
  return parse_named_values(out);
}

inline double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(std::max<std::size_t>(v.size(), 1)));
}

// |ours - ref| <= tol * max(|ref|, rms(ref)): relative per element, with the tensor's rms as the floor for
// elements near zero (the relative error of an element that is almost 0 says nothing). Reports the first five
// failing elements, and records the worst relative error as the test property WHAT_worst_relative.
inline void expect_close(const std::string& what, const std::vector<double>& ours, const std::vector<double>& ref,
                         double tol) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  const double floor = rms(ref);
  int shown = 0;
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(ours[i] - ref[i]) / std::max(std::fabs(ref[i]), floor);
    worst = std::max(worst, err);
    if (!(err <= tol) && shown++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: ours " << ours[i] << ", reference " << ref[i] << " (relative " << err
                    << " > " << tol << ")";
    }
  }
  ::testing::Test::RecordProperty(what + "_worst_relative", std::to_string(worst));
}

}  // namespace ampscope::testing
