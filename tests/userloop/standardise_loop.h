// tests/userloop/standardise_loop.h: a user's regression model that standardises its hidden features by
// hand, written from docs/api.md, not shaped to any rule of the analysis. The sensor readings sit around 100
// with a spread of 0.5 (raw, not centred), so the hidden features have means far larger than their spread.
//
//   naive:  v = mean(h * h, 0) - m * m            (E[x^2] - E[x]^2)
//   stable: v = var(h, {0}, 0, true)              (the deviations first: the report's remedy)
//   clamped: v = clamp_min(mean(h * h, 0) - m * m, 0)
//   out = (h - m) / sqrt(v + 1e-4)
//
// In f16 a square near 10^4 is rounded to a multiple of 8 (f16 keeps 11 significant bits: the spacing in
// [8192, 16384) is 2^13 / 2^10 = 8), while the true variance is about 10^-2, so E[x^2] - E[x]^2 is a
// difference of two numbers each off by up to 4: it comes out as a multiple of the spacing, often negative.
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

enum class VarianceForm { naive, stable, clamped };

struct Standardiser : nn::Module {
  std::shared_ptr<nn::Linear> features, head;
  VarianceForm form;
  Standardiser(Generator& gen, VarianceForm form_) : Module("Standardiser"), form(form_) {
    features = register_module("features", std::make_shared<nn::Linear>(4, 8, gen));
    head = register_module("head", std::make_shared<nn::Linear>(8, 1, gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*features)(x);
    Tensor normalised;
    {
      ScopeGuard in_norm("norm");
      const Tensor m = mean(h, {0}, true);
      Tensor v;
      if (form == VarianceForm::stable) v = var(h, {0}, /*correction=*/0, /*keepdim=*/true);
      else v = mean(h * h, {0}, true) - m * m;
      if (form == VarianceForm::clamped) v = clamp_min(v, 0.0);
      normalised = (h - m) / sqrt(v + 1e-4);
    }
    return (*head)(normalised);
  }
};

// Returns the loss of every step; fp16: autocast f16 with a GradScaler.
inline std::vector<double> train_standardiser(const std::filesystem::path& trace_path, VarianceForm form,
                                              std::int64_t steps = 5) {
  Generator gen(11);
  Standardiser model(gen, form);
  optim::SGD opt(model.parameters(), {.lr = 1e-3});
  GradScaler scaler({.device = "cpu"});
  probe::ProbeOptions options{.level = probe::Level::health};
  trace::RunInfo info{.precision = "fp16", .device = "cpu", .model = "standardiser", .seed = 11, .config = "{}"};
  info.probe = probe::describe(options);
  auto writer = std::make_shared<trace::TraceWriter>(trace_path, info);
  auto probe = std::make_shared<probe::Probe>(writer, options);
  probe::HookGuard watching(probe);

  const Tensor x = randn({32, 4}, gen) * 0.5 + 100.0;  // readings near 100, spread 0.5
  const Tensor y = randn({32, 1}, gen);
  std::vector<double> losses;
  for (std::int64_t n = 0; n < steps; ++n) {
    probe::Step step(n);
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast;
      loss = mse_loss(model(x), y);
    }
    scaler.scale(loss).backward();
    losses.push_back(step.finish(loss, opt, scaler).loss);
  }
  writer->close();
  return losses;
}

}  // namespace ampscope::testing
