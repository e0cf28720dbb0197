// The CPU backend's F16C fast path changes no bit of a training run: every sample trained in fp16 (autocast
// + GradScaler) and bf16 with the fast f16/bf16 conversions (kernels/half_convert.h) and again on the
// portable path (what AMPSCOPE_NO_F16C=1 selects) writes the same trace: each step's loss, scale and
// gradient norm, every op row's statistics (forward and backward) and every gradient row compared exactly.
// On a CPU without F16C both runs take the portable path and the test says so.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <tuple>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "kernels/half_convert.h"
#include "probes/trace/reader.h"
#include "cli/run.h"

namespace ampscope::samples {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::filesystem::path run(const std::string& sample, Precision precision, bool fast, const std::filesystem::path& dir) {
  const bool was = cpu::f16c_active();
  cpu::set_f16c_enabled(fast);
  TrainConfig c;
  c.sample = sample;
  c.precision = precision;
  c.steps = 3;
  c.batch = 4;
  c.device = "cpu";
  c.probe = "health";
  c.out = (dir / (sample + "_" + std::string(precision_name(precision)) + (fast ? "_fast.h5" : "_portable.h5"))).string();
  train(c);
  cpu::set_f16c_enabled(was);
  return c.out;
}

class f16c_identity : public ::testing::TestWithParam<std::tuple<std::string, Precision>> {};

TEST_P(f16c_identity, a_training_run_writes_the_same_trace_with_and_without_f16c) {
  if (!cpu::cpu_has_f16c()) std::cout << "note: this CPU has no F16C/AVX2; both runs take the portable path\n";
  const auto dir = std::filesystem::temp_directory_path() / ("ampscope_f16c_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto [sample, precision] = GetParam();
  trace::TraceReader fast(run(sample, precision, true, dir)), portable(run(sample, precision, false, dir));

  const std::vector<trace::StepRow> sf = fast.steps(), sp = portable.steps();
  ASSERT_EQ(sf.size(), 3u);
  ASSERT_EQ(sf.size(), sp.size());
  for (std::size_t i = 0; i < sf.size(); ++i) {
    EXPECT_TRUE(same_bits(sf[i].loss, sp[i].loss)) << "step " << i << ": " << sf[i].loss << " vs " << sp[i].loss;
    EXPECT_TRUE(same_bits(sf[i].scale_after, sp[i].scale_after)) << "step " << i;
    EXPECT_TRUE(same_bits(sf[i].grad_norm, sp[i].grad_norm)) << "step " << i;
    EXPECT_EQ(sf[i].skipped, sp[i].skipped) << "step " << i;
  }
  const std::vector<trace::OpRow> of = fast.ops(), op = portable.ops();
  ASSERT_EQ(of.size(), op.size());
  ASSERT_GT(of.size(), 0u);
  int shown = 0;
  for (std::size_t i = 0; i < of.size(); ++i) {
    const trace::TensorHealth &a = of[i].health, &b = op[i].health;
    const bool same = of[i].op == op[i].op && of[i].out_dtype == op[i].out_dtype && a.numel == b.numel &&
                      a.nan == b.nan && a.pos_inf == b.pos_inf && a.neg_inf == b.neg_inf && a.zero == b.zero &&
                      a.subnormal == b.subnormal && same_bits(a.min, b.min) && same_bits(a.max, b.max) &&
                      same_bits(a.absmax, b.absmax) && same_bits(a.mean, b.mean) && same_bits(a.rms, b.rms);
    if (!same && shown++ < 5) {
      ADD_FAILURE() << "step " << of[i].step << " seq " << of[i].seq << " " << of[i].op << " in '" << of[i].module
                    << "' (" << of[i].out_dtype << "): mean " << a.mean << " vs " << b.mean << ", rms " << a.rms
                    << " vs " << b.rms;
    }
  }
  EXPECT_EQ(shown, 0) << "op rows that differ";
  const std::vector<trace::GradRow> gf = fast.grads(), gp = portable.grads();
  ASSERT_EQ(gf.size(), gp.size());
  for (std::size_t i = 0; i < gf.size(); ++i) {
    EXPECT_TRUE(same_bits(gf[i].norm, gp[i].norm) && same_bits(gf[i].absmax, gp[i].absmax))
        << gf[i].param << " at step " << gf[i].step;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(train, f16c_identity,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "transformer"),
                                            ::testing::Values(Precision::fp16, Precision::bf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::string(precision_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace ampscope::samples
