// cli/train_command.h: the `ampscope train` subcommand: every option with its default in --help, a
// TOML --config file for the same settings, progress, Ctrl-C, --compare, --list-samples/--list-scenarios.
//
//   CLI::App app;  TrainCommand train(app);  CLI11_PARSE(app, argc, argv);  if (train.parsed()) return train.run();
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/run.h"

namespace ampscope::samples {

// The largest --batch accepted (a batch beyond it would not fit in memory for any sample).
inline constexpr std::int64_t kMaxBatch = 65536;

// Checks every value of a resolved configuration; throws Error with one line naming the option, the
// value and what is allowed. Files named by --config, --data, --text and --resume must exist as the
// right kind (folder or readable regular file); --data and --text only with the sample that reads them.
void validate_config(const TrainConfig& config);

class TrainCommand {
 public:
  explicit TrainCommand(CLI::App& app);
  bool parsed() const;
  int run();  // throws ampscope::Error on bad values and files
  // The configuration the parsed options and the --config file give (options win); `compare` is set
  // when --compare was asked for. Checks the sample and scenario names.
  TrainConfig resolve(bool& compare) const;

 private:
  // The runs of one command (one, or two with --compare); `leader`: this process prints (rank 0).
  int run_plan(const TrainConfig& config, bool compare, bool leader);

  CLI::App* cmd_ = nullptr;
  TrainConfig config_;
  std::string precision_ = "fp16";
  std::string config_file_;
  bool no_scaler_ = false;
  bool twin_forward_only_ = false;
  bool compare_ = false;
  bool list_samples_ = false;
  bool list_scenarios_ = false;
};

}  // namespace ampscope::samples
