// tests/train/fp8_train_test.cpp: `ampscope train --precision fp8` (cli/run.cpp with core/fp8_linear.h) on the
// mlp sample: trains to a finite loss close to the bf16 run's, keeping every Linear in bf16 is the bf16 run
// bit for bit, the options are recorded only in FP8 runs, and mistyped or conflicting options are refused.
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <bit>
#include <filesystem>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "cli/run.h"
#include "cli/run_options_io.h"
#include "cli/train_command.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/random.h"
#include "samples/task.h"
#include "probes/trace/reader.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

TrainConfig mlp(Precision p, std::uint64_t seed, std::int64_t steps = 30) {
  TrainConfig c;
  c.sample = "mlp";
  c.precision = p;
  c.steps = steps;
  c.batch = 8;
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

// How close an FP8 run's loss stays to the bf16 run's. Step 0 is a forward pass on the same weights: the
// losses differ only by the FP8 rounding of the three Linears' operands (E4M3: 4 significant bits, a
// relative error up to 2^-4 per element, unbiased under round-to-nearest, so it averages out over the 64- to
// 256-term sums); measured over seeds 0 to 4 and the three recipe/format combinations below, the step-0
// losses (about 2.3) differ by at most 0.005, and the bound 0.05 is ten times that. After 30 steps the runs
// have drifted apart through the updates: the final losses (0.13 to 0.27) differed by at most 6% of the bf16
// loss, and the bound is 15%. A broken GEMM (a wrong operand or transposition, a scale applied twice or not
// at all) moves the loss far more than either bound; a run that matches bf16 exactly is checked separately
// (it would mean no FP8 ran).
constexpr double kStep0Tolerance = 0.05;
constexpr double kFinalRelativeTolerance = 0.15;

struct Variant {
  const char* name;
  std::string recipe, format;
};

TEST(fp8_train_test, the_mlp_sample_trains_to_a_finite_loss_close_to_the_bf16_run) {
  const Variant variants[] = {{"delayed hybrid", "delayed", "hybrid"},
                              {"current hybrid", "current", "hybrid"},
                              {"delayed e4m3", "delayed", "e4m3"}};
  for (std::uint64_t seed : {0u, 3u}) {
    const TrainResult bf16 = train(mlp(Precision::bf16, seed));
    for (const Variant& v : variants) {
      SCOPED_TRACE(::testing::Message() << v.name << ", seed " << seed);
      TrainConfig c = mlp(Precision::fp8, seed);
      c.fp8_recipe = v.recipe;
      c.fp8_format = v.format;
      const TrainResult fp8 = train(c);
      ASSERT_EQ(fp8.losses.size(), 30u);
      for (double l : fp8.losses) ASSERT_TRUE(std::isfinite(l));
      EXPECT_NE(fp8.losses, bf16.losses) << "the FP8 GEMMs ran";
      EXPECT_NEAR(fp8.losses.front(), bf16.losses.front(), kStep0Tolerance);
      EXPECT_LT(fp8.final_loss, bf16.losses.front() / 4) << "it trained";
      EXPECT_NEAR(fp8.final_loss, bf16.final_loss, kFinalRelativeTolerance * bf16.final_loss);
    }
  }
}

// With every Linear kept in bf16 nothing is quantized: the run is the bf16 run, loss for loss, bit for bit.
TEST(fp8_train_test, keeping_every_linear_in_bf16_is_the_bf16_run_bit_for_bit) {
  const TrainResult bf16 = train(mlp(Precision::bf16, 2, 8));
  TrainConfig c = mlp(Precision::fp8, 2, 8);
  c.fp8_keep_bf16 = {"fc*"};
  EXPECT_EQ(train(c).losses, bf16.losses);
  c.fp8_keep_bf16 = {"fc3"};  // one of three: an FP8 run again
  EXPECT_NE(train(c).losses, bf16.losses);
}

TEST(fp8_train_test, the_fp8_options_are_recorded_in_fp8_runs_only) {
  TrainConfig c = mlp(Precision::fp8, 0);
  c.fp8_amax_algo = "most_recent";
  c.fp8_keep_bf16 = {"fc3"};
  const nlohmann::json j = nlohmann::json::parse(run_config_json(c));
  EXPECT_EQ(j.at("precision"), "fp8");
  EXPECT_EQ(j.at("fp8_recipe"), "delayed");
  EXPECT_EQ(j.at("fp8_format"), "hybrid");
  EXPECT_EQ(j.at("fp8_amax_history"), 1024);
  EXPECT_EQ(j.at("fp8_amax_algo"), "most_recent");
  EXPECT_EQ(j.at("fp8_margin"), 0);
  EXPECT_EQ(j.at("fp8_keep_bf16"), nlohmann::json::array({"fc3"}));
  const RecordedRun back = read_run_config(j);
  EXPECT_EQ(back.config.fp8_amax_algo, "most_recent");
  EXPECT_EQ(back.config.fp8_keep_bf16, std::vector<std::string>{"fc3"});
  const nlohmann::json plain = nlohmann::json::parse(run_config_json(mlp(Precision::bf16, 0)));
  for (const auto& [key, value] : plain.items()) EXPECT_EQ(key.rfind("fp8", 0), std::string::npos) << key;
}

// An FP8 run writes a trace (format_version 9, precision fp8) with one /fp8 row per step for every operand of
// every FP8 Linear, and none for a Linear kept in bf16. The rows' numbers are the probe's (tests/probes/
// fp8_stats_test.cpp checks them against a reference); here: what the run's shapes and recipe fix.
TEST(fp8_train_test, an_fp8_run_writes_a_trace_with_a_row_for_every_fp8_linear_and_operand) {
  const std::string path = (testing::process_scratch_dir("ampscope_fp8_train") / "fp8.h5").string();
  TrainConfig c = mlp(Precision::fp8, 1, 5);
  c.probe = "health";
  c.out = path;
  c.fp8_keep_bf16 = {"fc3"};
  train(c);
  trace::TraceReader r(path);
  EXPECT_EQ(r.format_version(), 9);
  EXPECT_EQ(r.run_info().precision, "fp8");
  const std::vector<trace::Fp8Row> rows = r.fp8();
  ASSERT_EQ(rows.size(), 5u * 2 * 3);
  std::map<std::tuple<std::int64_t, std::string, std::string>, const trace::Fp8Row*> seen;
  for (const trace::Fp8Row& row : rows) {
    EXPECT_TRUE(seen.emplace(std::tuple{row.step, row.module, row.operand}, &row).second) << row.module << " " << row.operand;
    EXPECT_EQ(row.format, row.operand == "grad_output" ? "e5m2" : "e4m3");  // HYBRID
    EXPECT_LE(row.nonzero, row.numel);
    EXPECT_GE(row.rel_rms_error, 0.0);
    EXPECT_LT(row.rel_rms_error, 0.1) << "E4M3/E5M2 keep 3/2 mantissa bits: a few percent";
  }
  for (std::int64_t step = 0; step < 5; ++step) {
    for (const char* module : {"fc1", "fc2"}) {
      for (const char* operand : {"input", "weight", "grad_output"}) {
        const auto it = seen.find({step, module, operand});
        ASSERT_NE(it, seen.end()) << "step " << step << " " << module << " " << operand;
        // Delayed scaling: step 0 casts with the initial scale 1; later steps with 448 (or 57344) / amax history.
        if (step == 0) {
          EXPECT_EQ(it->second->scale, 1.0);
        }
        if (step > 0) {
          EXPECT_GT(it->second->scale, 1.0) << module << " " << operand;
        }
      }
    }
  }
  // The weight's operand covers the whole parameter every step.
  EXPECT_EQ(seen.at({0, "fc1", "weight"})->numel, seen.at({4, "fc1", "weight"})->numel);
}

TEST(fp8_train_test, mistyped_or_conflicting_options_are_refused_with_what_to_do) {
  EXPECT_THROW_MSG(run_train({"--precision", "fp8", "--fp8-amax-history", "0"}), Error,
                   "--fp8-amax-history: 0 is not allowed; expected an integer from 1 to 1048576");
  EXPECT_THROW_MSG(run_train({"--precision", "fp8", "--fp8-margin", "-2"}), Error,
                   "--fp8-margin: -2 is not allowed; expected an integer from 0 to 64");
  EXPECT_THROW_MSG(run_train({"--precision", "fp8", "--fp8-keep-bf16", "fc4"}), Error,
                   "--fp8-keep-bf16: 'fc4' matches no module of the 'mlp' model; its modules are fc1, relu1, fc2, "
                   "relu2, fc3\nhint: name a module path");
  EXPECT_THROW_MSG(run_train({"--precision", "bf16", "--fp8-recipe", "current"}), Error,
                   "--fp8-recipe is set but the precision is bf16: the FP8 options apply only to --precision fp8\n"
                   "hint: add --precision fp8, or leave --fp8-recipe out");
  EXPECT_THROW(run_train({"--precision", "fp8", "--fp8-recipe", "delay"}), CLI::ValidationError);
  EXPECT_THROW(run_train({"--precision", "fp8", "--fp8-amax-algo", "mostrecent"}), CLI::ValidationError);
  EXPECT_THROW(run_train({"--precision", "fp9"}), CLI::ValidationError);
  TrainConfig cuda = mlp(Precision::fp8, 0, 1);
  cuda.device = "cuda";
  EXPECT_THROW_MSG(train(cuda), Error,
                   "--precision fp8 with --device cuda: FP8 runs on the CPU backend so far (the CUDA FP8 kernels "
                   "have not run on a GPU yet)\nhint: use --device cpu (or auto) for fp8, or --precision bf16 on the "
                   "GPU");
}

// The modules with /fp8 rows in a trace, and those rows' count.
std::set<std::string> fp8_modules(const std::string& path, std::size_t* rows = nullptr) {
  trace::TraceReader r(path);
  std::set<std::string> out;
  const std::vector<trace::Fp8Row> all = r.fp8();
  for (const trace::Fp8Row& row : all) out.insert(row.module);
  if (rows != nullptr) *rows = all.size();
  return out;
}

// --fp8-keep-first-last keeps the first and last Linear modules of the model's registration order in bf16: on
// the mlp (fc1, fc2, fc3) only fc2 runs in FP8; on the GPT-style transformer sample (2 blocks, each attention's
// qkv and proj and the MLP's fc1 and fc2, then the head: samples/models.cpp and core/nn.h's block) the first
// block's qkv and the head stay bf16 and the other 7 Linears run in FP8.
TEST(fp8_train_test, keep_first_last_keeps_the_first_and_last_registered_linear_in_bf16) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_fp8_first_last");
  TrainConfig c = mlp(Precision::fp8, 1, 2);
  c.probe = "health";
  c.out = (dir / "mlp.h5").string();
  c.fp8_keep_first_last = true;
  train(c);
  std::size_t rows = 0;
  EXPECT_EQ(fp8_modules(c.out, &rows), (std::set<std::string>{"fc2"}));
  EXPECT_EQ(rows, 2u * 3);
  c.fp8_keep_first_last = false;
  c.out = (dir / "mlp_all.h5").string();
  train(c);
  EXPECT_EQ(fp8_modules(c.out), (std::set<std::string>{"fc1", "fc2", "fc3"}));

  TrainConfig t = mlp(Precision::fp8, 1, 1);
  t.sample = "transformer";
  t.batch = 2;
  t.probe = "health";
  t.out = (dir / "gpt_all.h5").string();
  train(t);
  const std::set<std::string> all = fp8_modules(t.out);
  t.fp8_keep_first_last = true;
  t.out = (dir / "gpt.h5").string();
  train(t);
  std::set<std::string> expected = all;
  ASSERT_EQ(expected.erase("blocks.0.attn.qkv"), 1u) << "the first Linear registered";
  ASSERT_EQ(expected.erase("head"), 1u) << "the last Linear registered";
  EXPECT_EQ(all.size(), 9u);
  EXPECT_EQ(fp8_modules(t.out), expected);
  EXPECT_TRUE(expected.count("blocks.1.attn.qkv") == 1 && expected.count("blocks.0.attn.proj") == 1);
}

// ---- FP8 state in checkpoints (core/io/fp8_checkpoint.h) ----

// A run of the mlp sample with the delayed recipe writing a trace with /fp8 rows, history 4 so that the
// histories fill up and roll within the run.
TrainConfig delayed_run(const std::filesystem::path& dir, const std::string& name, std::int64_t steps) {
  TrainConfig c = mlp(Precision::fp8, 3, steps);
  c.probe = "health";
  c.fp8_amax_history = 4;
  c.out = (dir / (name + ".h5")).string();
  return c;
}

// The /fp8 rows of steps [from, ...), every field.
std::vector<std::string> fp8_rows(const std::string& path, std::int64_t from) {
  trace::TraceReader r(path);
  std::vector<std::string> out;
  for (const trace::Fp8Row& row : r.fp8()) {
    if (row.step < from) continue;
    out.push_back(fmt::format("{} {} {} {} {} {} {} {} {} {:a} {:a} {:a}", row.step, row.module, row.operand, row.format,
                              row.numel, row.nonzero, row.underflow, row.subnormal, row.saturated, row.amax, row.scale,
                              row.rel_rms_error));
  }
  return out;
}

// Rewrites checkpoint `from` to `to` through the checkpoint API, with `edit` applied to its "run" state and its
// other states: how a test makes a checkpoint ampscope would have written otherwise (an older one, a damaged one).
void rewrite_checkpoint(const std::filesystem::path& from, const std::filesystem::path& to, const TrainConfig& config,
                        const std::function<void(std::map<std::string, StateDict>&)>& edit) {
  Generator gen(config.seed);
  std::vector<std::string> warnings;
  const std::unique_ptr<SampleTask> task = make_task(config, gen, warnings);
  optim::AdamW opt(task->model().parameters(), optim::OptimizerOptions{.lr = 1e-3, .weight_decay = 0.0});
  Checkpoint ck{.model = &task->model(), .optimizer = &opt, .generators = {{"model", &gen}},
                .states = {{"scaler", StateDict{}}, {"run", StateDict{}}, {"fp8", StateDict{}}}};
  load_checkpoint(from, ck);
  edit(ck.states);
  save_checkpoint(to, ck);
}

TEST(fp8_train_test, a_delayed_run_resumed_from_its_checkpoint_continues_it_bit_for_bit) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_fp8_resume");
  const TrainResult straight = train(delayed_run(dir, "straight", 8));
  TrainConfig first = delayed_run(dir, "first", 4);
  first.checkpoint = (dir / "ck.h5").string();
  const TrainResult a = train(first);
  TrainConfig second = delayed_run(dir, "second", 4);
  second.resume = first.checkpoint;
  const TrainResult b = train(second);
  EXPECT_TRUE(b.warnings.empty()) << b.warnings.front();
  std::vector<double> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  ASSERT_EQ(joined.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(joined[i]), std::bit_cast<std::uint64_t>(straight.losses[i])) << "step " << i;
  }
  const std::vector<std::string> rows = fp8_rows(delayed_run(dir, "straight", 8).out, 4);
  ASSERT_EQ(rows.size(), 4u * 3 * 3);
  EXPECT_EQ(fp8_rows(second.out, 4), rows);
  // Without the saved state (a checkpoint of an older ampscope: no "fp8" state, no marker) the resumed run starts
  // from scale 1 again, says so, and parts from the straight run: the comparison above can fail.
  rewrite_checkpoint(first.checkpoint, dir / "old.h5", first, [](std::map<std::string, StateDict>& states) {
    states.erase("fp8");
    states.at("run").erase("fp8_state");
  });
  TrainConfig old = delayed_run(dir, "old", 4);
  old.resume = (dir / "old.h5").string();
  const TrainResult c = train(old);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0], fmt::format("--resume: '{}' holds no FP8 scaling state (written before checkpoints held "
                                       "it): the delayed recipe starts again from scale 1 and empty amax histories, so "
                                       "the resumed run does not continue the saved one bit for bit",
                                       old.resume));
  EXPECT_NE(fp8_rows(old.out, 4), rows);
}

TEST(fp8_train_test, a_checkpoint_of_other_fp8_settings_or_with_damaged_fp8_state_is_refused) {
  const std::filesystem::path dir = testing::process_scratch_dir("ampscope_fp8_resume_refused");
  TrainConfig first = delayed_run(dir, "first", 2);
  first.probe = "off";
  first.out.clear();
  first.checkpoint = (dir / "ck.h5").string();
  train(first);
  TrainConfig c = mlp(Precision::fp8, 3, 1);
  c.resume = first.checkpoint;
  c.fp8_amax_history = 4;
  c.fp8_format = "e4m3";
  EXPECT_THROW_MSG(train(c), CheckpointError,
                   fmt::format("--resume: '{}' was written by an FP8 run with --fp8-recipe delayed --fp8-format hybrid "
                               "--fp8-amax-history 4 --fp8-amax-algo max --fp8-margin 0, not --fp8-recipe delayed "
                               "--fp8-format e4m3 --fp8-amax-history 4 --fp8-amax-algo max --fp8-margin 0: its scales "
                               "would not continue under these settings\nhint: resume with the saved FP8 options, or "
                               "train from the start with the new ones",
                               c.resume));
  c.fp8_format = "hybrid";
  c.fp8_recipe = "current";
  EXPECT_THROW_MSG(train(c), CheckpointError, "written by an FP8 run with --fp8-recipe delayed --fp8-format hybrid "
                                              "--fp8-amax-history 4 --fp8-amax-algo max --fp8-margin 0, not "
                                              "--fp8-recipe current --fp8-format hybrid: its scales");
  c.fp8_recipe = "delayed";
  c.fp8_amax_history = 1024;
  EXPECT_THROW_MSG(train(c), CheckpointError, "--fp8-amax-history 4 --fp8-amax-algo max --fp8-margin 0, not "
                                              "--fp8-recipe delayed --fp8-format hybrid --fp8-amax-history 1024");
  c.fp8_amax_history = 4;
  // Damaged states, each refused naming the key (the checkpoint's own checksums pass: rewritten by the API).
  const auto damaged = [&](const char* name, const std::function<void(StateDict&)>& edit, const std::string& message) {
    const std::filesystem::path path = dir / name;
    rewrite_checkpoint(first.checkpoint, path, first, [&](std::map<std::string, StateDict>& s) { edit(s.at("fp8")); });
    c.resume = path.string();
    SCOPED_TRACE(name);
    EXPECT_THROW_MSG(train(c), CheckpointError, fmt::format("--resume: '{}': the FP8 state's {}", c.resume, message));
  };
  damaged("count.h5", [](StateDict& s) { s["modules"] = std::int64_t{1000000}; },
          "'modules' is 1000000; the model has 6 module(s) that could hold FP8 state");
  damaged("extra.h5", [](StateDict& s) { s["module.9"] = std::string("fc1"); },
          "'modules' is 3, but the state holds 29 keys, not the 28 that makes");
  damaged("path.h5", [](StateDict& s) { s["module.0"] = std::string("fc9"); }, "'module.0' names 'fc9', no module");
  damaged("twice.h5", [](StateDict& s) { s["module.1"] = s.at("module.0"); }, "'module.1' names 'fc1' a second time");
  damaged("length.h5", [](StateDict& s) { s["module.0.weight.amax_history"] = zeros({5}, {DType::f32}); },
          "'module.0.weight.amax_history' is a f32 tensor of shape [5], not f32 [4]");
  damaged("negative.h5", [](StateDict& s) { s["module.1.input.amax_history"] = full({4}, -1.0, {DType::f32}); },
          "'module.1.input.amax_history' holds a negative amax (-1)");
  damaged("scale.h5", [](StateDict& s) { s["module.0.grad_output.scale"] = from_values({2.0, 0.25}, {2}, {DType::f32}); },
          "'module.0.grad_output.scale' is scale 2 with scale_inv 0.25");
  damaged("type.h5", [](StateDict& s) { s["recipe"] = 1.0; }, "'recipe' is not a string");
  damaged("version.h5", [](StateDict& s) { s.erase("version"); }, "'version' is missing");
}

}  // namespace
}  // namespace ampscope::samples
