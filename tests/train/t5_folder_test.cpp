// Issue 19's walkthrough as a test, through `ampscope train --model` on a T5 folder: T5's classic fp16 failure
// (a later encoder block's feed-forward output past 65504) found by the report in that block's
// DenseReluDense.wo, removed by `--autocast-fp32 '*.DenseReluDense.wo'` (Hugging Face's own answer: keep wo in
// f32), and Hugging Face's clamp (`--fp16-clamp`), which keeps the loss finite while the report still names
// the overflow and says the clamp absorbed it. The model: tests/hf_t5's tiny v1.0 T5 (d_model 16, d_ff 32,
// 2 + 2 blocks, vocabulary 48), encoder block 1's wo weights x40000 (still finite in f16: tests/hf_t5 checks
// the f32 forward stays finite and the f16 one overflows at that op).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/random.h"
#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "models/hf_t5.h"
#include "cli/run.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWoModule = "encoder.block.1.layer.1.DenseReluDense.wo";

fs::path t5_folder(const std::string& name, double wo_scale) {
  const fs::path dir = testing::process_scratch_dir("ampscope_t5_folder") / name;
  fs::remove_all(dir);
  Generator gen(3);
  auto model = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  {
    NoGradGuard no_grad;
    for (const auto& [n, p] : model->named_parameters()) {
      if (n != std::string(kWoModule) + ".weight") continue;
      std::vector<double> v = p.values();
      for (double& x : v) x *= wo_scale;
      Tensor(p).copy_(from_values(v, p.shape()));
    }
  }
  hf::save_seq2seq(*model, dir);
  std::ofstream tokens(dir / "tokens.txt");
  for (int i = 0; i < 200; ++i) tokens << (i * 7 + 3) % 48 << ' ';
  return dir;
}

TrainConfig t5_run(const fs::path& dir, const std::string& out) {
  TrainConfig c;
  c.model_dir = dir.string();
  c.tokens_file = (dir / "tokens.txt").string();
  c.context = 16;
  c.batch = 2;
  c.steps = 3;
  c.device = "cpu";
  c.out = (dir / out).string();
  return c;
}

analysis::Report report_of(const std::string& path) {
  trace::TraceReader reader(path);
  return analysis::analyse(reader);
}

TEST(t5_folder_test, a_healthy_t5_trains_in_fp16_with_t5s_windows_and_reports_nothing) {
  const fs::path dir = t5_folder("healthy", 1.0);
  TrainConfig c = t5_run(dir, "run.h5");
  c.steps = 6;
  c.lr = 1e-3;
  const TrainResult r = train(c);
  EXPECT_EQ(r.sample, "t5");
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(r.losses.back(), r.losses.front());  // 6 AdamW steps at lr 1e-3 on a periodic pattern
  // fp16 autocast changes the values by f16 roundings only (2^-11 relative each, a few dozen ops deep): the
  // losses stay within 1% of the fp32 run's.
  TrainConfig f32 = c;
  f32.precision = Precision::fp32;
  f32.out = (dir / "f32.h5").string();
  const TrainResult ref = train(f32);
  for (std::size_t i = 0; i < r.losses.size(); ++i) EXPECT_NEAR(r.losses[i], ref.losses[i], 0.01 * ref.losses[i]);
  const analysis::Report rep = report_of(c.out);
  EXPECT_TRUE(rep.anomalies.empty());
  for (const auto& w : rep.warnings) ADD_FAILURE() << w.message;
  // An odd context cannot split into encoder input and labels.
  TrainConfig odd = t5_run(dir, "odd.h5");
  odd.context = 15;
  EXPECT_THROW_MSG(train(odd), Error, "--context 15", "even");
}

TEST(t5_folder_test, the_wo_overflow_is_found_there_and_the_override_removes_it) {
  const fs::path dir = t5_folder("overflow", 40000.0);
  TrainConfig c = t5_run(dir, "run.h5");
  train(c);
  const analysis::Report rep = report_of(c.out);
  ASSERT_FALSE(rep.anomalies.empty());
  const analysis::Diagnosis& first = rep.anomalies.front();
  EXPECT_EQ(first.cause, "f16_overflow");
  EXPECT_EQ(first.module, kWoModule);
  EXPECT_EQ(first.step, 0);

  TrainConfig fixed = t5_run(dir, "fixed.h5");
  fixed.autocast_fp32 = {"*.DenseReluDense.wo"};
  const TrainResult r = train(fixed);
  for (double l : r.losses) EXPECT_TRUE(std::isfinite(l));
  for (const analysis::Diagnosis& d : report_of(fixed.out).anomalies) EXPECT_NE(d.cause, "f16_overflow");
}

// The clamp hides the overflow from the loss (finite), but the values were wrong: the report still names the
// overflow at wo, and the clamp (recorded as an op in the block's scope) among the ops that absorbed it.
TEST(t5_folder_test, the_fp16_clamp_keeps_the_loss_finite_and_the_report_says_it_fired) {
  const fs::path dir = t5_folder("clamp", 40000.0);
  TrainConfig c = t5_run(dir, "clamp.h5");
  c.fp16_clamp = true;
  const TrainResult r = train(c);
  EXPECT_TRUE(std::isfinite(r.losses[0]));
  const analysis::Report rep = report_of(c.out);
  ASSERT_FALSE(rep.anomalies.empty());
  const analysis::Diagnosis& first = rep.anomalies.front();
  EXPECT_EQ(first.cause, "f16_overflow");
  EXPECT_EQ(first.module, kWoModule);
  bool clamp_named = false;
  for (const std::string& a : first.absorbed_by) clamp_named |= a.find("clamp") != std::string::npos;
  EXPECT_TRUE(clamp_named) << "absorbed_by: " << ::testing::PrintToString(first.absorbed_by);
  // Not a T5 folder: the option is refused.
  TrainConfig gpt = c;
  gpt.model_dir = dir.parent_path().string();
  EXPECT_THROW(train(gpt), Error);
}

}  // namespace
}  // namespace ampscope::samples
