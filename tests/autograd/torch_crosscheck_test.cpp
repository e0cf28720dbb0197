// tests/autograd/torch_crosscheck_test.cpp: the ops for hand-written losses against PyTorch itself.
// Debian's python3-torch (1.13, CPU) runs the same ops on the same f32 inputs (with ties, so the tie
// rules are compared too) and prints every forward value and every input gradient of
// sum(out * w) as exact hexadecimal floats; the runtime must agree within a few float roundings (the
// CPU kernels of PyTorch and ours may order or fuse the float math differently) and exactly for the
// ops that only select values. Skipped, with the reason, where /usr/bin/python3 cannot import torch
// (scripts/setup.sh does not install python3-torch: it is large and optional).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/python_reference.h"

namespace ampscope {
namespace {

const std::vector<double> kX = {1.5, -2.0, 0.25, 3.0, -0.5, 3.0, 2.0, -2.0, 0.75, -1.25, 0.0, 1.0};
const std::vector<double> kY = {1.5, 2.5, -0.75, 3.0, 1.0, -3.5, 2.0, 0.5, 0.75, 2.25, -1.5, 0.125};

// The weighting of sum(out * w): (i mod 7 - 3) / 4 over the flattened output, written the same way in
// the script.
Tensor weights(const Tensor& out) {
  std::vector<double> w(static_cast<std::size_t>(out.numel()));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = (static_cast<double>(i % 7) - 3.0) / 4.0;
  return from_values(w, out.shape());
}

struct Case {
  std::string name;
  int inputs;          // 1: x; 2: x and y
  std::string python;  // a lambda over (x) or (x, y) returning a tensor or a (values, indices) pair
  std::function<std::vector<Tensor>(const Tensor&, const Tensor&)> ours;  // values (and indices)
  bool exact;          // only selects or moves values: the same bits
};

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  return {
      {"abs", 1, "lambda x: x.abs()", [](const Tensor& x, const Tensor&) { return V{abs(x)}; }, true},
      {"log1p", 1, "lambda x: (x + 3).log1p()", [](const Tensor& x, const Tensor&) { return V{log1p(x + 3.0)}; }, false},
      {"expm1", 1, "lambda x: x.expm1()", [](const Tensor& x, const Tensor&) { return V{expm1(x)}; }, false},
      {"logsigmoid", 1, "lambda x: F.logsigmoid(x * 4)", [](const Tensor& x, const Tensor&) { return V{logsigmoid(x * 4.0)}; },
       false},
      {"softplus", 1, "lambda x: F.softplus(x, beta=2, threshold=3)",
       [](const Tensor& x, const Tensor&) { return V{softplus(x, 2.0, 3.0)}; }, false},
      {"silu", 1, "lambda x: F.silu(x * 3)", [](const Tensor& x, const Tensor&) { return V{silu(x * 3.0)}; }, false},
      {"clamp_min", 1, "lambda x: torch.clamp_min(x, 0.25)", [](const Tensor& x, const Tensor&) { return V{clamp_min(x, 0.25)}; },
       true},
      {"clamp_max", 1, "lambda x: torch.clamp_max(x, 2.0)", [](const Tensor& x, const Tensor&) { return V{clamp_max(x, 2.0)}; },
       true},
      {"maximum", 2, "lambda x, y: torch.maximum(x, y)", [](const Tensor& x, const Tensor& y) { return V{maximum(x, y)}; }, true},
      {"minimum", 2, "lambda x, y: torch.minimum(x, y)", [](const Tensor& x, const Tensor& y) { return V{minimum(x, y)}; }, true},
      {"max", 1, "lambda x: x.max()", [](const Tensor& x, const Tensor&) { return V{max(x)}; }, true},
      {"min", 1, "lambda x: x.min()", [](const Tensor& x, const Tensor&) { return V{min(x)}; }, true},
      {"max_dim", 1, "lambda x: tuple(torch.max(x, 1, keepdim=True))",
       [](const Tensor& x, const Tensor&) {
         const ValuesAndIndices r = max(x, 1, true);
         return V{r.values, r.indices};
       },
       true},
      {"min_dim", 1, "lambda x: tuple(torch.min(x, 0))",
       [](const Tensor& x, const Tensor&) {
         const ValuesAndIndices r = min(x, 0);
         return V{r.values, r.indices};
       },
       true},
      {"amax", 1, "lambda x: x.amax(1)", [](const Tensor& x, const Tensor&) { return V{amax(x, {1})}; }, true},
      {"amin", 1, "lambda x: x.amin((0, 1), keepdim=True)",
       [](const Tensor& x, const Tensor&) { return V{amin(x, {0, 1}, true)}; }, true},
      {"var", 1, "lambda x: torch.var(x, 1, correction=1)", [](const Tensor& x, const Tensor&) { return V{var(x, {1})}; }, false},
      {"var_population", 1, "lambda x: torch.var(x, 0, correction=0, keepdim=True)",
       [](const Tensor& x, const Tensor&) { return V{var(x, {0}, 0.0, true)}; }, false},
      {"std", 1, "lambda x: torch.std(x, (0, 1), correction=2)",
       [](const Tensor& x, const Tensor&) { return V{std(x, {0, 1}, 2.0)}; }, false},
      {"rsub", 1, "lambda x: 1.5 - x", [](const Tensor& x, const Tensor&) { return V{1.5 - x}; }, false},
      {"scalar_over_tensor", 1, "lambda x: 2 / (x + 5)", [](const Tensor& x, const Tensor&) { return V{2.0 / (x + 5.0)}; },
       false},
      {"expression", 2, "lambda x, y: (x * y - 0.5) / (y + 4) + (-x)",
       [](const Tensor& x, const Tensor& y) { return V{(x * y - 0.5) / (y + 4.0) + (-x)}; }, false},
  };
}

std::string hex_list(const std::vector<double>& v) {
  std::string s;
  for (double d : v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a ", d);
    s += buf;
  }
  return s;
}

// name -> list of values ("abs.out", "abs.grad0", "max_dim.indices").
std::map<std::string, std::vector<double>> run_torch(const std::filesystem::path& dir) {
  std::ostringstream py;
  py << "import torch\nimport torch.nn.functional as F\n"
        "X = [float.fromhex(s) for s in '"
     << hex_list(kX) << "'.split()]\nY = [float.fromhex(s) for s in '" << hex_list(kY)
     << "'.split()]\n"
        "def report(name, ts):\n"
        "    print(name, ' '.join(float(v).hex() for v in ts.detach().reshape(-1).tolist()))\n"
        "def check(name, n, f):\n"
        "    ins = [torch.tensor(X).reshape(3, 4).requires_grad_(), torch.tensor(Y).reshape(3, 4).requires_grad_()][:n]\n"
        "    out = f(*ins)\n"
        "    values = out[0] if isinstance(out, tuple) else out\n"
        "    w = ((torch.arange(values.numel()) % 7) - 3).float().div(4).reshape(values.shape)\n"
        "    (values * w).sum().backward()\n"
        "    report(name + '.out', values)\n"
        "    if isinstance(out, tuple): report(name + '.indices', out[1].double())\n"
        "    for i, t in enumerate(ins): report(name + '.grad' + str(i), t.grad)\n";
  for (const Case& c : cases()) py << "check('" << c.name << "', " << c.inputs << ", " << c.python << ")\n";
  const auto script = dir / "crosscheck.py";
  std::ofstream(script) << py.str();
  std::string out;
  const int rc = testing::run_shell("/usr/bin/python3 " + script.string(), out);
  if (rc != 0) throw std::runtime_error("the PyTorch script failed:\n" + out);
  return testing::parse_named_values(out);
}

void expect_agree(const std::string& what, const std::vector<double>& ours, const std::vector<double>& torch, bool exact) {
  ASSERT_EQ(ours.size(), torch.size()) << what;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    if (std::isnan(torch[i]) || std::isnan(ours[i])) {
      EXPECT_TRUE(std::isnan(torch[i]) && std::isnan(ours[i])) << what << " [" << i << "]: ours " << ours[i] << ", torch " << torch[i];
      continue;
    }
    // Not exact: a few float roundings apart (8 units of 2^-24 of the larger magnitude, or of 1 near 0).
    const double tol = exact ? 0.0 : 8 * 0x1p-24 * std::max({std::fabs(torch[i]), std::fabs(ours[i]), 1e-3});
    EXPECT_LE(std::fabs(ours[i] - torch[i]), tol) << what << " [" << i << "]: ours " << ours[i] << ", torch " << torch[i];
  }
}

TEST(torch_crosscheck_test, loss_ops_agree_with_pytorch_values_gradients_and_tie_rules) {
  const std::string why = testing::torch_missing("this cross-check compares with PyTorch 1.13 where it is");
  if (!why.empty()) GTEST_SKIP() << why;
  const auto dir = std::filesystem::temp_directory_path() / ("ampscope_crosscheck_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::map<std::string, std::vector<double>> torch;
  try {
    torch = run_torch(dir);
  } catch (const std::exception& e) {
    std::filesystem::remove_all(dir);
    FAIL() << e.what();
  }
  std::filesystem::remove_all(dir);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = from_values(kX, {3, 4}), y = from_values(kY, {3, 4});
    x.requires_grad_();
    y.requires_grad_();
    const std::vector<Tensor> out = c.ours(x, y);
    sum(mul(out[0], weights(out[0]))).backward();
    expect_agree(c.name + " values", out[0].values(), torch.at(c.name + ".out"), c.exact);
    if (out.size() > 1) expect_agree(c.name + " indices", out[1].values(), torch.at(c.name + ".indices"), true);
    const std::vector<Tensor> inputs = {x, y};
    for (int i = 0; i < c.inputs; ++i) {
      const std::string key = c.name + ".grad" + std::to_string(i);
      ASSERT_TRUE(inputs[i].grad().defined()) << key;
      expect_agree(key, inputs[i].grad().values(), torch.at(key), c.exact);
    }
  }
}

}  // namespace
}  // namespace ampscope
