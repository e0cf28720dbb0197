// The `ampscope train` command line: option values, the TOML config file and its errors.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "samples/train_command.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

// Parses argv as `ampscope train ...` and runs the command.
int run_train(std::vector<std::string> args) {
  CLI::App app;
  TrainCommand train(app);
  args.insert(args.begin(), {"ampscope", "train"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return train.run();
}

std::string write_config(const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_config_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << text;
  return path.string();
}

TEST(train_command_test, refuses_values_outside_the_valid_sets) {
  EXPECT_THROW(run_train({"--precision", "fp8"}), CLI::ValidationError);
  EXPECT_THROW(run_train({"--probe", "everything"}), CLI::ValidationError);
  EXPECT_THROW_MSG(run_train({"--sample", "resnet"}), Error, "unknown sample 'resnet'", "mlp, cnn, transformer");
  EXPECT_THROW_MSG(run_train({"--scenario", "bogus"}), Error, "unknown scenario 'bogus'", "attention-overflow");
}

TEST(train_command_test, reads_a_toml_config_and_lets_the_command_line_win) {
  const std::string path = write_config(
      "[train]\nsample = \"cnn\"\nsteps = 3\nprecision = \"bf16\"\ninit-scale = 1024.0\n"
      "autocast-fp32 = [\"blocks.*.attn.*\"]\ncompare = true\n");
  CLI::App app;
  TrainCommand train(app);
  const std::vector<const char*> argv = {"ampscope", "train", "--config", path.c_str(), "--steps", "1"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  bool compare = false;
  const TrainConfig c = train.resolve(compare);
  EXPECT_EQ(c.sample, "cnn");
  EXPECT_EQ(c.steps, 1);  // the command line wins
  EXPECT_EQ(c.precision, Precision::bf16);
  EXPECT_EQ(c.init_scale, 1024.0);
  EXPECT_EQ(c.autocast_fp32, (std::vector<std::string>{"blocks.*.attn.*"}));
  EXPECT_TRUE(compare);
  std::filesystem::remove(path);
}

TEST(train_command_test, names_an_unknown_key_or_a_wrong_type_in_the_config_file) {
  std::string path = write_config("stepz = 3\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "unknown key 'stepz'", "steps", "init-scale");
  path = write_config("steps = \"three\"\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "'steps' must be an integer");
  path = write_config("steps = [\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "cannot parse", "line");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ampscope::samples
