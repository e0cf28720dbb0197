// T5 (both variants) against the plain-PyTorch reference tests/hf_t5/reference_t5.py, written from Hugging
// Face's modeling_t5.py, run by Debian's python3-torch (1.13, CPU) on the same safetensors folder, written here
// by make_seq2seq + save_seq2seq. Compared: f32 logits within 1e-5 relative, the losses of three AdamW
// steps within 1e-5, and the logits under bf16 autocast within two bf16 units (derived below). The batch comes
// from samples/token_data's seq2seq_batch (the reference splits and shifts the windows itself). Skipped, with
// the reason, where /usr/bin/python3 cannot import torch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/optim.h"
#include "models/hf_t5.h"
#include "models/token_data.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/support/python_reference.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
namespace hf = samples::hf;
using nlohmann::json;
using testing::expect_close;
using testing::rms;

constexpr std::int64_t kB = 2, kT = 16;  // two windows of 16 tokens: 8 encoder inputs, 8 labels each

// kB * kT token ids from a fixed LCG.
std::vector<std::int32_t> make_tokens(std::int64_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kB * kT));
  std::uint64_t s = 4242;
  for (auto& id : ids) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    id = static_cast<std::int32_t>((s >> 33) % static_cast<std::uint64_t>(vocab));
  }
  return ids;
}

// bf16 tolerance. Ours and the reference run every op in the same dtype (the reference applies CUDA autocast's
// policy by hand), so they differ only where an f32 result that is then rounded to bf16 differs in its last f32
// bits (summation order in the products; tanh, rsqrt, exp a unit or so apart). Such a difference flips a bf16
// rounding only when the f32 value lies within it of a rounding boundary, and a flip moves that element by one
// bf16 unit (2^-8 relative). The logits are one product rounded once to bf16 (one unit) whose inputs may carry
// such flips from the layers before, each moving a dot product by far less than its rms. Two units of 2^-8 of
// max(|value|, rms) cover the final rounding plus one flip-sized disturbance, and stay well below the gap
// between the f32 and bf16 logits (checked: that gap must exceed the tolerance). On these four models the bf16
// logits in fact come out bit for bit equal to the reference's.
constexpr double kBf16Tol = 2 * 0x1p-8;

void compare_with_reference(const json& config, const std::string& name) {
  const std::string why = testing::torch_missing("T5 is compared with PyTorch 1.13 where it is");
  if (!why.empty()) GTEST_SKIP() << why;
  const fs::path dir = testing::process_scratch_dir("ampscope_t5_ref") / name;
  {
    Generator gen(11);
    auto made = hf::make_seq2seq(config, gen);
    hf::save_seq2seq(*made, dir);
  }
  auto loaded = hf::load_seq2seq(dir);
  hf::Seq2SeqLM& model = *loaded.model;
  const auto ids = make_tokens(model.vocab_size());
  const fs::path tokens = dir / "tokens.txt";
  {
    std::ofstream f(tokens);
    for (auto id : ids) f << id << ' ';
  }
  const auto ref = testing::run_python_reference(
      "tests/hf_t5/reference_t5.py", {dir.string(), tokens.string(), std::to_string(kB), std::to_string(kT)});
  const samples::Seq2SeqBatch batch = samples::seq2seq_batch(ids, kT, kB, 0, model.decoder_start_token_id());
  ASSERT_EQ(batch.decoder_input.at({0, 0}), static_cast<double>(config.value("decoder_start_token_id", 0)));

  std::vector<double> logits;
  {
    NoGradGuard no_grad;
    logits = model.forward2(batch.encoder_input, batch.decoder_input).values();
  }
  expect_close(name + " f32 logits", logits, ref.at("logits_f32"), 1e-5);
  std::vector<double> bf16;
  {
    NoGradGuard no_grad;
    AutocastGuard autocast(DType::bf16);
    const Tensor out = model.forward2(batch.encoder_input, batch.decoder_input);
    EXPECT_EQ(out.dtype(), DType::bf16);
    bf16 = out.to(DType::f32).values();
  }
  expect_close(name + " bf16 logits", bf16, ref.at("logits_bf16"), kBf16Tol);
  // bf16 must really be bf16: its logits differ from f32 by more than the tolerance somewhere.
  double gap = 0;
  const double floor = rms(logits);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    gap = std::max(gap, std::fabs(bf16[i] - logits[i]) / std::max(std::fabs(logits[i]), floor));
  }
  EXPECT_GT(gap, kBf16Tol) << name << ": bf16 autocast logits are as close to f32 as the tolerance";

  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.0});
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    const Tensor loss = hf::seq2seq_loss(model.forward2(batch.encoder_input, batch.decoder_input), batch.labels);
    losses.push_back(loss.item());
    loss.backward();
    opt.step();
  }
  for (int s = 0; s < 3; ++s) {
    const auto& r = ref.at("loss_" + std::to_string(s));
    ASSERT_EQ(r.size(), 1u);
    EXPECT_NEAR(losses[s], r[0], 1e-5 * std::fabs(r[0])) << name << " loss of step " << s;
  }
  EXPECT_GT(std::fabs(losses[2] - losses[0]), 1e-3) << "the AdamW steps must change the loss";
}

TEST(t5_reference_test, t5_v1_0_relu_tied_head_matches_pytorch_in_f32_and_training) {
  compare_with_reference(t5_test::v1_0_config(), "v1_0");
}

TEST(t5_reference_test, t5_v1_1_gated_gelu_untied_head_matches_pytorch_in_f32_and_training) {
  compare_with_reference(t5_test::v1_1_config(), "v1_1");
}

TEST(t5_reference_test, the_other_feed_forwards_t5config_accepts_match_pytorch) {
  json gelu = t5_test::v1_0_config();  // ACT2FN["gelu"]: the exact (erf) GELU
  gelu["feed_forward_proj"] = "gelu";
  compare_with_reference(gelu, "gelu");
  json gated_relu = t5_test::v1_1_config();
  gated_relu["feed_forward_proj"] = "gated-relu";
  compare_with_reference(gated_relu, "gated_relu");
}

}  // namespace
}  // namespace ampscope
