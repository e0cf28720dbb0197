// tests/userloop/hand_loss_loop.h: a training loop written as a user writes one from docs/api.md alone
// (the "A complete loop" section and the table of ops for writing a loss), not shaped to any rule of the
// analysis: a small binary classifier on raw, unstandardised features, and a binary cross-entropy written
// by hand with the operators and the new ops.
//
//   naive:  s = sigmoid(z);  -mean(y * log(s) + (1 - y) * log(1 - s))
//   stable: -mean(y * logsigmoid(z) + (1 - y) * logsigmoid(-z))       (what the report's remedy writes)
//
// Both add a small penalty on the largest logit, 1e-4 * amax(abs(z)), as a user might to keep logits in
// check. f16 rounds sigmoid(z) to exactly 1 once z > 12 ln 2 = 8.3 (f32 only past 24 ln 2 = 16.6), so the
// naive form computes 1 - s = 0 and log(0) = -inf for confident positives, and 0 * -inf = NaN.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "probes/probe.h"
#include "probes/trace/writer.h"

namespace ampscope::testing {

enum class LossForm { naive, stable };

struct HandLossRun {
  std::vector<double> losses;
  std::vector<bool> skipped;
  std::vector<double> scales;  // the scale each step's backward used
};

struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> hidden, out;
  explicit Classifier(Generator& gen) : Module("Classifier") {
    hidden = register_module("hidden", std::make_shared<nn::Linear>(4, 16, gen));
    out = register_module("out", std::make_shared<nn::Linear>(16, 1, gen));
  }
  Tensor forward(const Tensor& x) override { return (*out)(tanh((*hidden)(x))); }
};

// precision: "fp16" (autocast f16 with a GradScaler) or "fp32" (no autocast, no scaler).
inline HandLossRun train_hand_loss(const std::filesystem::path& trace_path, const std::string& precision, LossForm form,
                                   std::int64_t steps = 30) {
  const bool fp16 = precision == "fp16";
  Generator gen(7);
  Classifier model(gen);
  optim::AdamW opt(model.parameters(), {.lr = 0.05});
  GradScaler scaler({.device = "cpu", .enabled = fp16});  // disabled: finish() reports the gradients itself

  probe::ProbeOptions options{.level = probe::Level::health};
  trace::RunInfo info{.precision = precision, .device = "cpu", .model = "hand-bce", .seed = 7, .config = "{}"};
  info.probe = probe::describe(options);
  auto writer = std::make_shared<trace::TraceWriter>(trace_path, info);
  auto probe = std::make_shared<probe::Probe>(writer, options);
  probe::HookGuard watching(probe);

  // Raw sensor-like features (standard deviation 6), the label a linear rule of the first two.
  const Tensor x = randn({64, 4}, gen) * 6.0;
  const std::vector<double> features = x.values();
  std::vector<double> labels;
  for (std::size_t i = 0; i < 64; ++i) labels.push_back(features[4 * i] + 0.5 * features[4 * i + 1] > 0 ? 1.0 : 0.0);
  const Tensor y = from_values(labels, {64, 1});

  HandLossRun run;
  for (std::int64_t n = 0; n < steps; ++n) {
    probe::Step step(n);
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(DType::f16, /*enabled=*/fp16);
      const Tensor z = model(x);
      ScopeGuard in_loss("loss");
      Tensor bce;
      if (form == LossForm::naive) {
        const Tensor s = sigmoid(z);
        bce = -mean(y * log(s) + (1.0 - y) * log(1.0 - s));
      } else {
        bce = -mean(y * logsigmoid(z) + (1.0 - y) * logsigmoid(-z));
      }
      loss = bce + 1e-4 * amax(abs(z));
    }
    scaler.scale(loss).backward();
    const probe::StepSummary row = step.finish(loss, opt, scaler);
    run.losses.push_back(row.loss);
    run.skipped.push_back(row.skipped);
    run.scales.push_back(row.scale);
  }
  writer->close();
  return run;
}

}  // namespace ampscope::testing
