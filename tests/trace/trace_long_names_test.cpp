// Names longer than format_version 3's fields (op names were cut at 31 bytes, module paths at 63) recorded
// from a user's own module tree and custom op by the probe, as a user's loop records them: they come back
// whole from the reader, and `ampscope report` prints them whole, in its text and in its JSON.
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/report_command.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

// 60 characters: past the old 31-byte op field.
const std::string kLongOp = "scaled_reciprocal_of_the_row_norms_with_a_sixty_char_op_name";

// A module that runs its one child: nesting these builds a module path as long as a user's wrappers make it.
class Wrapper : public nn::Module {
 public:
  Wrapper(const std::string& child_name, std::shared_ptr<nn::Module> child) : nn::Module("Wrapper") {
    child_ = register_module(child_name, std::move(child));
  }

 protected:
  Tensor forward(const Tensor& x) override { return (*child_)(x); }

 private:
  std::shared_ptr<nn::Module> child_;
};

// The innermost module: a custom op (recorded under kLongOp) whose backward divides by the row norms of
// its input, which are zero for a zero row: its gradient is inf from finite inputs, an origin.
class Reciprocal : public nn::Module {
 public:
  Reciprocal() : nn::Module("Reciprocal") {}

 protected:
  Tensor forward(const Tensor& x) override {
    Tensor out;
    {
      NoGradGuard no_grad;
      out = mul(x, 2.0);
    }
    const Tensor saved = x.detach();
    return autograd::record(kLongOp, out, {x}, [saved](const Tensor& grad, const std::vector<bool>&) {
      return std::vector<Tensor>{div(grad, saved)};
    });
  }
};

TEST(trace_long_names_test, a_user_module_tree_and_custom_op_keep_their_long_names_through_trace_and_report) {
  // Module names joined by dots: "encoder.block_11_layer_1_DenseReluDense_wrapper_00. ..." up to 200 bytes.
  std::vector<std::string> names;
  std::string path;
  for (int i = 0; path.size() < 200; ++i) {
    names.push_back(fmt::format("block_11_layer_1_DenseReluDense_wrapper_{:02}", i));
    path += (path.empty() ? "" : ".") + names.back();
  }
  // The last name is cut so that the path is exactly 200 bytes.
  const std::size_t over = path.size() - 200;
  names.back().resize(names.back().size() - over);
  path.resize(200);
  ASSERT_EQ(path.size(), 200u);
  std::shared_ptr<nn::Module> model = std::make_shared<Reciprocal>();
  for (std::size_t i = names.size(); i-- > 1;) model = std::make_shared<Wrapper>(names[i], model);
  auto root = std::make_shared<Wrapper>(names[0], model);

  TempDir dir;
  const auto trace_path = dir.file("long.h5");
  {
    auto writer = std::make_shared<TraceWriter>(trace_path, RunInfo{.precision = "fp32", .device = "cpu", .model = "user tree",
                                                                    .seed = 3, .config = "{}"});
    auto probe = std::make_shared<probe::Probe>(writer, probe::ProbeOptions{});
    probe::HookGuard installed(probe);
    Generator gen(3);
    probe::StepScope scope(0);
    Tensor x = randn({2, 4}, gen);
    x = mul(x, from_values({1.0, 0.0}, {2, 1}));  // row 1 is zero
    Tensor w = randn({4, 4}, gen);
    w.requires_grad_(true);
    Tensor loss = mean((*root)(mul(x, sum(w))));
    loss.backward();
    scope.end({.step = 0, .loss = loss.item()});
    probe->flush();
    writer->close();
  }

  TraceReader r(trace_path);
  bool backward = false;
  for (const OpRow& o : r.ops()) {
    if (o.op != kLongOp) continue;
    EXPECT_EQ(o.module, path);
    backward |= o.phase == Phase::backward;
    if (o.phase == Phase::backward) {
      EXPECT_TRUE(o.origin) << "the zero row's gradient is inf from finite inputs";
    }
  }
  EXPECT_TRUE(backward) << "the custom op's backward node was not recorded under its 60-character name";

  std::ostringstream text, json, err;
  EXPECT_EQ(samples::run_report({.trace = trace_path.string()}, text, err), samples::kExitFound) << err.str();
  EXPECT_NE(text.str().find(kLongOp), std::string::npos) << text.str();
  EXPECT_NE(text.str().find(path), std::string::npos) << text.str();
  EXPECT_EQ(samples::run_report({.trace = trace_path.string(), .json = true}, json, err), samples::kExitFound) << err.str();
  EXPECT_NE(json.str().find("\"" + kLongOp + "\""), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"" + path + "\""), std::string::npos) << json.str();
}

}  // namespace
}  // namespace ampscope::trace
