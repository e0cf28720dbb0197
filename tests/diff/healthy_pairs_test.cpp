// Healthy runs against their fp32 twins: every sample (mlp, cnn, transformer), trained in fp16 (autocast and
// the GradScaler) and in bf16 with the same seed as an fp32 run, must not diverge: no first divergence of
// an op, the losses or the gradients (ampscope diff's exit status 0). Before the diff was scale-aware every
// such pair "diverged" at step 0 in the backward of the loss (its rows hold values 65536 times the fp32
// ones). The seeds include the ones whose healthy differences were the largest measured when the
// threshold was chosen (cnn seeds 2 and 3, probes/analysis/diff.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "probes/analysis/diff.h"
#include "probes/trace/reader.h"
#include "cli/run.h"

namespace ampscope::analysis {
namespace {

using trace::OpRow;
using trace::Phase;

std::filesystem::path temp_trace(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("ampscope_healthy_" + std::to_string(::getpid()) + "_" + name + ".h5");
}

struct Removed {
  std::vector<std::filesystem::path> paths;
  ~Removed() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove(p, ec);
  }
};

std::filesystem::path train_run(Removed& files, const std::string& sample, samples::Precision precision, std::uint64_t seed,
                                std::int64_t steps) {
  const std::filesystem::path path =
      temp_trace(fmt::format("{}_{}_{}", sample, samples::precision_name(precision), seed));
  files.paths.push_back(path);
  samples::TrainConfig c;
  c.sample = sample;
  c.precision = precision;
  c.device = "cpu";
  c.steps = steps;
  c.seed = seed;
  c.out = path.string();
  samples::train(c);
  return path;
}

void expect_healthy_pairs(const std::string& sample, const std::vector<std::uint64_t>& seeds, std::int64_t steps) {
  Removed files;
  for (std::uint64_t seed : seeds) {
    const std::filesystem::path fp32 = train_run(files, sample, samples::Precision::fp32, seed, steps);
    for (samples::Precision low : {samples::Precision::fp16, samples::Precision::bf16}) {
      SCOPED_TRACE(fmt::format("{} seed {} {}", sample, seed, samples::precision_name(low)));
      const std::filesystem::path other = train_run(files, sample, low, seed, steps);
      trace::TraceReader a(fp32), b(other);
      const DiffReport d = diff(a, b);
      EXPECT_FALSE(d.first_divergence.has_value())
          << "step " << d.first_divergence->key.step << " " << d.first_divergence->key.op << " in '"
          << d.first_divergence->key.module << "' (" << d.first_divergence->stat << " " << d.first_divergence->max_rel << ")";
      EXPECT_FALSE(d.first_loss_divergence.has_value());
      EXPECT_FALSE(d.first_grad_divergence.has_value())
          << "step " << d.first_grad_divergence->step << " " << d.first_grad_divergence->param << " "
          << d.first_grad_divergence->max_rel;
      EXPECT_FALSE(d.diverged());
      EXPECT_EQ(d.steps_compared, steps);
      EXPECT_GT(d.ops_aligned, 0);
      EXPECT_GT(d.grads_aligned, 0);
      if (low != samples::Precision::fp16) continue;
      // The fp16 run's backward rows are recorded multiplied by its loss scale (65536: no step skipped, no
      // growth within 2000 steps), read from the traces without the diff: the first backward row of step 0
      // (the backward of the loss; b's own first is the backward of the scaler's mul) has an rms 65536 times
      // the fp32 one, to f16's rounding.
      const std::vector<trace::StepRow> steps_b = b.steps();
      ASSERT_FALSE(steps_b.empty());
      EXPECT_EQ(steps_b.front().scale, 65536.0);
      const std::vector<OpRow> rows_a = a.ops(0, 1), rows_b = b.ops(0, 1);
      const auto ra = std::find_if(rows_a.begin(), rows_a.end(), [](const OpRow& r) { return r.phase == Phase::backward; });
      ASSERT_NE(ra, rows_a.end());
      const auto rb = std::find_if(rows_b.begin(), rows_b.end(), [&](const OpRow& r) {
        return r.phase == Phase::backward && r.op == ra->op && r.module == ra->module;
      });
      ASSERT_NE(ra, rows_a.end());
      ASSERT_NE(rb, rows_b.end());
      ASSERT_GT(ra->health.rms, 0.0);
      EXPECT_NEAR(rb->health.rms / ra->health.rms / 65536.0, 1.0, 1e-2) << ra->op << " / " << rb->op;
    }
  }
}

TEST(diff_healthy_pairs_test, mlp_fp16_and_bf16_do_not_diverge_from_fp32) { expect_healthy_pairs("mlp", {1, 2, 3}, 30); }

TEST(diff_healthy_pairs_test, cnn_fp16_and_bf16_do_not_diverge_from_fp32) { expect_healthy_pairs("cnn", {2, 3}, 10); }

TEST(diff_healthy_pairs_test, transformer_fp16_and_bf16_do_not_diverge_from_fp32) {
  expect_healthy_pairs("transformer", {1, 2}, 10);
}

}  // namespace
}  // namespace ampscope::analysis
