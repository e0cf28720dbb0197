// cli/train_command.h: the `ampscope train` subcommand: every option with its default in --help, a
// TOML --config file for the same settings, progress, Ctrl-C, --compare, --list-samples/--list-scenarios.
//
//   CLI::App app;  TrainCommand train(app);  CLI11_PARSE(app, argc, argv);  if (train.parsed()) return train.run();
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/run.h"
#include "samples/run_options.h"

namespace ampscope::samples {

class RunOptionsCli;

// Checks every value of a resolved configuration (each on its own by the table's checks, then what must fit
// together); throws Error with one line naming the option, the
// value and what is allowed. Files named by --config, --data, --text and --resume must exist as the
// right kind (folder or readable regular file); --data and --text only with the sample that reads them.
void validate_config(const TrainConfig& config);

class TrainCommand {
 public:
  explicit TrainCommand(CLI::App& app);
  ~TrainCommand();
  bool parsed() const;
  int run();  // throws ampscope::Error on bad values and files
  // The configuration the parsed options and the --config file give (options win); `compare` is set
  // when --compare was asked for. Checks the sample and scenario names.
  TrainConfig resolve(bool& compare) const;

 private:
  // The runs of one command (one, or two with --compare); `leader`: this process prints (rank 0).
  int run_plan(const TrainConfig& config, bool compare, bool leader);

  CLI::App* cmd_ = nullptr;
  std::unique_ptr<RunOptionsCli> options_;  // the run's options (samples/run_options.h)
  std::string config_file_;
  bool compare_ = false;
  bool overwrite_ = false;  // --overwrite: replace existing traces (and their results files)
  bool list_samples_ = false;
  bool list_scenarios_ = false;
};

}  // namespace ampscope::samples
