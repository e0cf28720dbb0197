// The viewer reads the traces of the issue-17 user loop (tests/userloop/hand_loss_loop.h: a loop written
// from docs/api.md alone, with a hand-written BCE): the document opens the f16 trace, its analysis names
// the same origin as `ampscope report` (tests/userloop/user_loop_test.cpp), and the origin step's rows
// carry the op names the loss recorded (rsub for `1 - s`, logsigmoid, amax).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "tests/test_support.h"
#include "tests/userloop/hand_loss_loop.h"
#include "viewer/document.h"

namespace ampscope::viewer {
namespace {

namespace fs = std::filesystem;

bool has_op(const StepData& data, const std::string& op, const std::string& module) {
  return std::any_of(data.ops.begin(), data.ops.end(),
                     [&](const trace::OpRow& r) { return r.op == op && r.module == module; });
}

TEST(user_loop_view_test, the_viewer_opens_the_naive_loop_and_shows_its_origin_and_the_loss_ops) {
  const fs::path path = testing::process_scratch_dir("ampscope_userloop_view") / "naive-fp16.h5";
  testing::train_hand_loss(path, "fp16", testing::LossForm::naive);
  auto doc = TraceDocument::open(path);
  ASSERT_TRUE(doc->ok()) << doc->error();
  EXPECT_TRUE(doc->complete());
  EXPECT_EQ(doc->steps().size(), 30u);
  doc->wait_idle();
  ASSERT_NE(doc->report(), nullptr) << doc->analysis_error();
  ASSERT_FALSE(doc->report()->anomalies.empty());
  const analysis::Diagnosis& d = doc->report()->anomalies.front();
  EXPECT_EQ(d.op, "log");
  EXPECT_EQ(d.module, "loss");
  EXPECT_EQ(d.root_cause, "saturation");
  doc->select_step(d.step);
  doc->wait_idle();
  ASSERT_NE(doc->step_data(), nullptr) << doc->step_error();
  EXPECT_TRUE(has_op(*doc->step_data(), "rsub", "loss"));
  EXPECT_TRUE(has_op(*doc->step_data(), "sigmoid", "loss"));
  EXPECT_TRUE(has_op(*doc->step_data(), "amax", "loss"));
  fs::remove(path);
}

}  // namespace
}  // namespace ampscope::viewer
