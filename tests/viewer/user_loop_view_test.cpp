// The viewer reads the traces of the issue-17 user loop (tests/userloop/hand_loss_loop.h: a loop written
// from docs/api.md alone, with a hand-written BCE): the document opens the f16 trace, its analysis names
// the same origin as `ampscope report` (tests/userloop/user_loop_test.cpp), and the origin step's rows
// carry the op names the loss recorded (rsub for `1 - s`, logsigmoid, amax).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/test_support.h"
#include "tests/userloop/hand_loss_loop.h"
#include "viewer/document.h"
#include "viewer/view_model.h"

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

// The Compare panel pairs steps as `ampscope diff` does: the stable f16 run skipped step 0 while its scaler
// calibrated, so its step s + 1 is shown beside the f32 run's step s, and the summary says why.
TEST(user_loop_view_test, compare_pairs_the_steps_the_way_diff_did_after_a_calibration_skip) {
  const fs::path dir = testing::process_scratch_dir("ampscope_userloop_view");
  const fs::path f16 = dir / "stable-fp16.h5", f32 = dir / "stable-fp32.h5";
  testing::train_hand_loss(f16, "fp16", testing::LossForm::stable);
  testing::train_hand_loss(f32, "fp32", testing::LossForm::stable);
  EXPECT_EQ(paired_step_b(nullptr, 5), 5);  // before the diff is in: by number
  Comparison comparison(f16, f32);
  while (!comparison.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const analysis::DiffReport* d = comparison.report();
  ASSERT_NE(d, nullptr) << comparison.error();
  ASSERT_TRUE(d->aligned_by_update);
  EXPECT_EQ(paired_step_b(d, 5), 4);
  EXPECT_EQ(paired_step_b(d, 0), 0);  // a's calibration skip has no partner: shown by number
  const std::vector<KeyValue> rows = compare_summary(*d);
  EXPECT_TRUE(std::any_of(rows.begin(), rows.end(), [](const KeyValue& r) {
    return r.key == "paired by" && r.value == "optimizer update: calibration skips a 0, b none (not compared)";
  }));
  fs::remove(f16);
  fs::remove(f32);
}

}  // namespace
}  // namespace ampscope::viewer
