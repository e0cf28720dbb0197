// tests/train/block_train_test.cpp: `ampscope train --precision mxfp8|nvfp4` (cli/run.cpp with core/block_linear.h)
// on the mlp and transformer samples: the runs train, repeat bit for bit, resume bit for bit (NVFP4's stochastic
// rounding included), record their options only where they apply, and refuse what they cannot run with the texts
// below. The GEMMs themselves are checked against a reference in tests/core/block_linear_test.cpp.
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "cli/run.h"
#include "cli/run_options_io.h"
#include "cli/train_command.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "probes/trace/reader.h"
#include "samples/task.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

// The mlp sample (fc1 64 -> 256, fc2 256 -> 256, fc3 256 -> 10): fc3's 10 outputs are no multiple of 32 or 16, so
// it stays bf16, as a user would keep it; the batch of 32 rows is the wgrad contraction and divides by both blocks.
TrainConfig mlp(Precision p, std::uint64_t seed, std::int64_t steps) {
  TrainConfig c;
  c.sample = "mlp";
  c.precision = p;
  c.steps = steps;
  c.batch = 32;
  c.device = "cpu";
  c.seed = seed;
  c.probe = "off";
  c.fp8_keep_bf16 = {"fc3"};
  return c;
}

// The transformer sample (d_model 128, context 64, vocab 256: every Linear divides, the head included).
TrainConfig transformer(Precision p, std::uint64_t seed, std::int64_t steps) {
  TrainConfig c;
  c.sample = "transformer";
  c.precision = p;
  c.steps = steps;
  c.batch = 2;
  c.device = "cpu";
  c.seed = seed;
  c.probe = "off";
  return c;
}

int run_train(std::vector<std::string> args) {
  CLI::App app;
  TrainCommand train(app);
  args.insert(args.begin(), {"ampscope", "train", "--steps", "1", "--device", "cpu"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return train.run();
}

double mean(const std::vector<double>& v, std::size_t first, std::size_t n) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(first), v.begin() + static_cast<std::ptrdiff_t>(first + n), 0.0) /
         static_cast<double>(n);
}

void expect_bitwise_equal(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(a[i]), std::bit_cast<std::uint64_t>(b[i])) << what << " step " << i;
}

struct Variant {
  const char* name;
  Precision precision;
  std::string mx_scale;
  bool rht;
};

// Each variant trains: the mean loss of the last 5 of 30 steps is below 80% of the first 5's (the bf16 run of
// the same seed goes from about 2.3 to about 1), every loss is finite, and the run is not the bf16 run (the
// quantization ran). Two runs of one seed are identical to the bit.
TEST(block_train_test, the_mlp_sample_trains_in_each_block_scaled_variant_and_repeats_bit_for_bit) {
  const Variant variants[] = {{"mxfp8 round-up", Precision::mxfp8, "round-up", true},
                              {"mxfp8 floor", Precision::mxfp8, "floor", true},
                              {"nvfp4", Precision::nvfp4, "round-up", true},
                              {"nvfp4 no rht", Precision::nvfp4, "round-up", false}};
  TrainConfig b = mlp(Precision::bf16, 0, 30);
  b.fp8_keep_bf16.clear();  // refused outside fp8, mxfp8, nvfp4
  const TrainResult bf16 = train(b);
  for (const Variant& v : variants) {
    TrainConfig c = mlp(v.precision, 0, 30);
    c.mx_scale = v.mx_scale;
    c.nvfp4_rht = v.rht;
    const TrainResult r = train(c);
    ASSERT_EQ(r.losses.size(), 30u) << v.name;
    for (double l : r.losses) EXPECT_TRUE(std::isfinite(l)) << v.name;
    EXPECT_LT(mean(r.losses, 25, 5), 0.8 * mean(r.losses, 0, 5)) << v.name;
    EXPECT_NE(r.losses, bf16.losses) << v.name;
    expect_bitwise_equal(train(c).losses, r.losses, v.name);
  }
}

// The transformer sample, every Linear block-scaled, with the probe on (the block statistics are computed for the
// hook): a few steps lower the loss, and a second run writes the same /steps losses.
TEST(block_train_test, the_transformer_sample_trains_in_mxfp8_and_nvfp4_and_repeats_bit_for_bit) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_block_transformer");
  for (Precision p : {Precision::mxfp8, Precision::nvfp4}) {
    TrainConfig c = transformer(p, 1, 8);
    c.probe = "health";
    c.out = (dir / fmt::format("{}.h5", precision_name(p))).string();
    const TrainResult r = train(c);
    ASSERT_EQ(r.losses.size(), 8u);
    EXPECT_LT(mean(r.losses, 5, 3), mean(r.losses, 0, 3)) << precision_name(p);
    trace::TraceReader trace(c.out);
    EXPECT_EQ(trace.run_info().precision, precision_name(p));
    c.out = (dir / fmt::format("{}-again.h5", precision_name(p))).string();
    expect_bitwise_equal(train(c).losses, r.losses, std::string(precision_name(p)));
  }
}

// An NVFP4 run's checkpoint holds the stochastic-rounding offset: 4 + 4 resumed steps are the 8 straight steps to
// the bit (an MXFP8 run too, which draws nothing). The saved offset is the count of Philox blocks the 4 steps drew.
TEST(block_train_test, an_nvfp4_run_resumed_from_its_checkpoint_continues_it_bit_for_bit) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_block_resume");
  for (Precision p : {Precision::nvfp4, Precision::mxfp8}) {
    const TrainResult straight = train(mlp(p, 5, 8));
    TrainConfig first = mlp(p, 5, 4);
    first.checkpoint = (dir / fmt::format("{}.h5", precision_name(p))).string();
    const TrainResult a = train(first);
    TrainConfig second = mlp(p, 5, 4);
    second.resume = first.checkpoint;
    const TrainResult b = train(second);
    EXPECT_TRUE(b.warnings.empty()) << b.warnings.front();
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    expect_bitwise_equal(joined, straight.losses, std::string(precision_name(p)));
  }
  const std::string ck = (dir / "nvfp4.h5").string();
  Checkpoint peek{.states = {{"block", StateDict{}}, {"run", StateDict{}}}};
  load_checkpoint(ck, peek, {});
  const std::int64_t offset = std::get<std::int64_t>(peek.states.at("block").at("random_offset"));
  // Each step quantizes fc2's gradient (32 x 256) twice (dgrad's rowwise copy, wgrad's columnwise one) and fc1's
  // once (its input is data: no dgrad), ceil(8192 / 4) = 2048 blocks each.
  EXPECT_EQ(offset, 4 * 3 * 2048);
}

TEST(block_train_test, options_that_do_not_apply_and_what_block_scaled_runs_cannot_do_are_refused_with_what_to_do) {
  EXPECT_THROW_MSG(run_train({"--precision", "bf16", "--mx-scale", "floor"}), Error,
                   "--mx-scale is set but the precision is bf16: it applies only to --precision mxfp8\nhint: add "
                   "--precision mxfp8, or leave --mx-scale out");
  EXPECT_THROW_MSG(run_train({"--precision", "nvfp4", "--mx-scale", "floor"}), Error,
                   "--mx-scale is set but the precision is nvfp4: it applies only to --precision mxfp8\nhint: add "
                   "--precision mxfp8, or leave --mx-scale out");
  EXPECT_THROW_MSG(run_train({"--precision", "mxfp8", "--nvfp4-no-rht"}), Error,
                   "--nvfp4-no-rht is set but the precision is mxfp8: it applies only to --precision nvfp4\nhint: add "
                   "--precision nvfp4, or leave --nvfp4-no-rht out");
  EXPECT_THROW_MSG(run_train({"--precision", "fp8", "--nvfp4-no-rht"}), Error,
                   "--nvfp4-no-rht is set but the precision is fp8: it applies only to --precision nvfp4");
  EXPECT_THROW_MSG(run_train({"--precision", "mxfp8", "--fp8-recipe", "current"}), Error,
                   "--fp8-recipe does not apply to --precision mxfp8: block-scaled recipes keep no per-tensor scale "
                   "(no recipe, amax history, margin or format choice: every block gets its own scale)\nhint: leave "
                   "--fp8-recipe out (--mx-scale chooses MXFP8's scale rule)");
  for (const char* option : {"--fp8-amax-history", "--fp8-margin"}) {
    EXPECT_THROW_MSG(run_train({"--precision", "nvfp4", option, "2"}), Error,
                     fmt::format("{} does not apply to --precision nvfp4: block-scaled recipes keep no per-tensor "
                                 "scale (no recipe, amax history, margin or format choice: every block gets its own "
                                 "scale)\nhint: leave {} out",
                                 option, option));
  }
  EXPECT_THROW_MSG(run_train({"--precision", "mxfp8", "--fp8-format", "e4m3"}), Error,
                   "--fp8-format does not apply to --precision mxfp8");
  EXPECT_THROW_MSG(run_train({"--precision", "bf16", "--fp8-keep-bf16", "fc3"}), Error,
                   "--fp8-keep-bf16 is set but the precision is bf16: it applies only to --precision fp8, mxfp8 or "
                   "nvfp4 (Linears with quantized GEMMs)\nhint: add --precision fp8 (or mxfp8, nvfp4), or leave "
                   "--fp8-keep-bf16 out");
  EXPECT_THROW(run_train({"--precision", "mxfp8", "--mx-scale", "ceil"}), CLI::ValidationError);
  for (Precision p : {Precision::mxfp8, Precision::nvfp4}) {
    TrainConfig cuda = mlp(p, 0, 1);
    cuda.device = "cuda";
    const std::string name(precision_name(p));
    EXPECT_THROW_MSG(train(cuda), Error,
                     fmt::format("--precision {} with --device cuda: block-scaled Linear GEMMs run on the CPU backend "
                                 "only (there are no CUDA kernels for them yet)\nhint: use --device cpu (or auto) for "
                                 "{}, or --precision bf16 on the GPU",
                                 name, name));
  }
  // A Linear the blocks do not divide, named with its shapes: the mlp's fc3 (10 outputs) when not kept in bf16.
  TrainConfig c = mlp(Precision::mxfp8, 0, 1);
  c.fp8_keep_bf16.clear();
  EXPECT_THROW_MSG(train(c), ShapeError,
                   "linear in 'fc3': --precision mxfp8 quantizes in 1x32 blocks along each GEMM's contraction "
                   "dimension, so in_features, out_features and the input's rows must be multiples of 32, but the "
                   "weight is [10, 256] and the input has 32 rows\nhint: keep this Linear in bf16 (ampscope train: "
                   "--fp8-keep-bf16 'fc3'), or make its sizes and the batch's rows multiples of 32");
  c.fp8_keep_bf16 = {"fc3"};
  c.batch = 8;  // the wgrad contraction: 8 rows
  EXPECT_THROW_MSG(train(c), ShapeError, "linear in 'fc1':", "the weight is [256, 64] and the input has 8 rows");
  c.fp8_keep_first_last = true;  // fc1 and fc3 in bf16: fc2 still sees 8 rows
  c.fp8_keep_bf16.clear();
  EXPECT_THROW_MSG(train(c), ShapeError, "linear in 'fc2':");
}

TEST(block_train_test, resuming_with_another_precision_or_other_block_settings_is_refused) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_block_resume_refused");
  TrainConfig first = mlp(Precision::nvfp4, 2, 1);
  first.checkpoint = (dir / "ck.h5").string();
  train(first);
  TrainConfig c = mlp(Precision::mxfp8, 2, 1);
  c.resume = first.checkpoint;
  EXPECT_THROW_MSG(train(c), Error,
                   fmt::format("--resume: '{}' was written by a run with precision 'nvfp4', not 'mxfp8'\nhint: resume "
                               "with the same --precision",
                               c.resume));
  c.precision = Precision::nvfp4;
  c.nvfp4_rht = false;
  EXPECT_THROW_MSG(train(c), CheckpointError,
                   fmt::format("--resume: '{}' was written by a run with --precision nvfp4, not --precision nvfp4 "
                               "--nvfp4-no-rht: it would not continue under these settings\nhint: resume with the "
                               "saved options, or train from the start with the new ones",
                               c.resume));
}

TEST(block_train_test, the_block_options_are_recorded_only_where_they_apply) {
  TrainConfig m = mlp(Precision::mxfp8, 0, 1);
  m.mx_scale = "floor";
  const nlohmann::json jm = nlohmann::json::parse(run_config_json(m));
  EXPECT_EQ(jm.at("precision"), "mxfp8");
  EXPECT_EQ(jm.at("mx_scale"), "floor");
  EXPECT_EQ(jm.at("fp8_keep_bf16"), nlohmann::json::array({"fc3"}));
  EXPECT_FALSE(jm.contains("nvfp4_rht"));
  EXPECT_FALSE(jm.contains("fp8_recipe"));
  EXPECT_EQ(read_run_config(jm).config.mx_scale, "floor");
  TrainConfig n = mlp(Precision::nvfp4, 0, 1);
  n.nvfp4_rht = false;
  const nlohmann::json jn = nlohmann::json::parse(run_config_json(n));
  EXPECT_EQ(jn.at("nvfp4_rht"), false);
  EXPECT_FALSE(jn.contains("mx_scale"));
  EXPECT_FALSE(read_run_config(jn).config.nvfp4_rht);
  const nlohmann::json plain = nlohmann::json::parse(run_config_json(mlp(Precision::fp8, 0, 1)));
  EXPECT_FALSE(plain.contains("mx_scale"));
  EXPECT_FALSE(plain.contains("nvfp4_rht"));
}

}  // namespace
}  // namespace ampscope::samples
