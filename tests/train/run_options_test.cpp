// The run's own options beyond the samples: --eval (forward passes only) and --save-model (the trained
// weights as safetensors), and the refusals of options that do not fit together. The model-folder runs
// (--model, --tokens) have their own tests in tests/hf/.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/io/checkpoint.h"
#include "core/error.h"
#include "core/random.h"
#include "core/io/safetensors.h"
#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "cli/run.h"
#include "cli/train_command.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("ampscope_run_options_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

int run_train(std::vector<std::string> args) {
  CLI::App app;
  TrainCommand train(app);
  args.insert(args.begin(), {"ampscope", "train"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return train.run();
}

TrainConfig mlp(Precision p, std::int64_t steps) {
  TrainConfig c;
  c.sample = "mlp";
  c.precision = p;
  c.steps = steps;
  c.batch = 8;
  c.device = "cpu";
  c.seed = 3;
  return c;
}

// An evaluation of a checkpoint sees the weights a training run had at that step: the loss --eval reports
// for step 3 after resuming a 3-step checkpoint is the loss a 4-step training run computed at step 3 (its
// forward pass runs before its update), bit for bit; and evaluation changes nothing, so every later eval
// step is the same forward pass on the next batch, and a second evaluation gives the same losses.
TEST(run_options_test, eval_of_a_checkpoint_reports_the_losses_training_computed_there_and_changes_nothing) {
  for (Precision p : {Precision::fp32, Precision::fp16, Precision::bf16}) {
    SCOPED_TRACE(std::string(precision_name(p)));
    const auto dir = temp_dir(std::string("eval_") + std::string(precision_name(p)));
    TrainConfig four = mlp(p, 4);
    const TrainResult trained = train(four);
    TrainConfig three = mlp(p, 3);
    three.checkpoint = (dir / "ck.h5").string();
    train(three);

    TrainConfig eval = mlp(p, 1);
    eval.resume = three.checkpoint;
    eval.eval = true;
    eval.out = (dir / "eval.h5").string();
    const TrainResult evaluated = train(eval);
    ASSERT_EQ(evaluated.losses.size(), 1u);
    EXPECT_EQ(evaluated.losses[0], trained.losses[3]);
    EXPECT_EQ(evaluated.skipped, 0);

    trace::TraceReader reader(eval.out);
    const std::vector<trace::StepRow> steps = reader.steps();
    ASSERT_EQ(steps.size(), 1u);
    EXPECT_EQ(steps[0].step, 3);
    EXPECT_EQ(steps[0].loss, trained.losses[3]);
    EXPECT_EQ(steps[0].grad_norm, 0.0);  // no gradients: documented as 0, not NaN (NaN would read as non-finite)
    EXPECT_EQ(steps[0].scale, 1.0);
    EXPECT_FALSE(steps[0].skipped);
    EXPECT_TRUE(reader.grads().empty());
    EXPECT_FALSE(reader.ops().empty());  // the forward pass is recorded
    const analysis::Report report = analysis::analyse(reader);
    EXPECT_TRUE(report.anomalies.empty());
    EXPECT_NE(report.scaler.message.find("evaluation run (--eval)"), std::string::npos) << report.scaler.message;
  }
  // Unchanged weights: evaluating 3 steps from the start gives, at each step, the loss the untrained model
  // has on that batch, which a fresh 1-step training run computes for step 0, and a second evaluation the
  // same numbers.
  TrainConfig eval = mlp(Precision::fp16, 3);
  eval.eval = true;
  const TrainResult a = train(eval), b = train(eval);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.losses[0], train(mlp(Precision::fp16, 1)).losses[0]);
}

// --save-model writes every parameter, bit for bit, as the checkpoint of the same run holds it.
TEST(run_options_test, save_model_writes_the_trained_parameters_as_the_checkpoint_holds_them) {
  const auto dir = temp_dir("save");
  TrainConfig c = mlp(Precision::fp16, 2);
  c.checkpoint = (dir / "ck.h5").string();
  c.save_model = (dir / "weights").string();  // created
  train(c);
  const auto file = safetensors::File::open(dir / "weights" / "model.safetensors");
  EXPECT_EQ(file.metadata().at("format"), "pt");

  // A fresh mlp, its parameters replaced by the checkpoint's.
  TrainConfig fresh = mlp(Precision::fp16, 0);
  Generator gen(99);
  std::vector<std::string> warnings;
  std::unique_ptr<SampleTask> task = make_task(fresh, gen, warnings);
  Checkpoint ck{.model = &task->model(), .states = {{"scaler", StateDict{}}, {"run", StateDict{}}}};
  load_checkpoint(c.checkpoint, ck);
  std::size_t count = 0;
  for (const auto& [name, p] : task->model().named_parameters()) {
    ASSERT_TRUE(file.contains(name)) << name;
    const Tensor saved = file.load(name);
    EXPECT_EQ(saved.dtype(), DType::f32);
    EXPECT_EQ(saved.shape(), p.shape());
    EXPECT_EQ(saved.values(), p.values()) << name;
    ++count;
  }
  EXPECT_EQ(file.tensors().size(), count);
  EXPECT_GT(count, 0u);
}

TEST(run_options_test, options_that_do_not_fit_together_are_refused_naming_both) {
  const auto dir = temp_dir("refused");
  const std::string tokens = (dir / "t.txt").string();
  EXPECT_THROW_MSG(run_train({"--tokens", tokens}), Error, "--tokens is read only with --model");
  EXPECT_THROW_MSG(run_train({"--context", "16"}), Error, "--context is read only with --model");
  EXPECT_THROW_MSG(run_train({"--model", dir.string()}), Error, "needs --tokens FILE");
  EXPECT_THROW_MSG(run_train({"--model", (dir / "none").string(), "--tokens", tokens}), Error, "no such folder");
  EXPECT_THROW_MSG(run_train({"--model", dir.string(), "--sample", "cnn", "--tokens", tokens}), Error,
                   "--sample cnn both name what to train");
  EXPECT_THROW_MSG(run_train({"--model", dir.string(), "--scenario", "log-zero", "--tokens", tokens}), Error,
                   "cannot be combined with --model");
  EXPECT_THROW_MSG(run_train({"--eval", "--checkpoint", (dir / "c.h5").string()}), Error, "--checkpoint with --eval");
  EXPECT_THROW_MSG(run_train({"--eval", "--save-model", (dir / "w").string()}), Error, "--save-model with --eval");
  EXPECT_THROW_MSG(run_train({"--context", "-1"}), Error, "--context", "-1");
  EXPECT_THROW_MSG(run_train({"--save-model", "/nonexistent-ampscope/x/y", "--steps", "1"}), Error, "--save-model",
                   "does not exist");
}

}  // namespace
}  // namespace ampscope::samples
