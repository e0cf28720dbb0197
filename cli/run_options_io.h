// cli/run_options_io.h: the run's options (samples/run_options.h) on their surfaces: the command-line
// options of `ampscope train`, the keys of its TOML --config file, and the config JSON every trace records
// (written by the run, read back by `ampscope fix`). Each is a loop over the table; nothing here names a
// field, so a row added there is an option, a key and a recorded value at once.
//
//   CLI::App app;  CLI::App* train = app.add_subcommand("train");  RunOptionsCli options(*train);
//   ... parse ...
//   TrainConfig c;  bool compare = false;
//   apply_config_file("run.toml", c, compare);  // the file over the defaults
//   options.apply(c);                           // the command line over the file
//   const RecordedRun back = read_run_config(nlohmann::json::parse(run_config_json(c)));
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "samples/run_options.h"

namespace ampscope::samples {

// One command-line option per row of the table that is a user option (--name; flags for flags, repeatable
// for lists, the choices checked by CLI11 as they are parsed).
class RunOptionsCli {
 public:
  explicit RunOptionsCli(CLI::App& cmd);
  ~RunOptionsCli();
  RunOptionsCli(const RunOptionsCli&) = delete;
  RunOptionsCli& operator=(const RunOptionsCli&) = delete;
  // Applies the options the command line gave (only those), in table order, over `config`.
  void apply(TrainConfig& config) const;
  bool given(std::string_view name) const;

 private:
  struct Slot;
  std::vector<std::unique_ptr<Slot>> slots_;
};

// Applies a TOML file's keys (the option names: init-scale = 1024.0), in the file's order, over `config`;
// `compare` receives the file's `compare` key, the one key that is the command's rather than the run's.
// Paths are relative to the file's folder. A [train] table, when there is one, holds every key. Throws
// Error naming the file and the key.
void apply_config_file(const std::string& path, TrainConfig& config, bool& compare);

// The run's configuration as JSON (the trace's root attribute `config`): every recorded row, in table
// order, under its Recorded condition; `world_size` and `rank` in a run of more than one rank. Non-finite
// numbers are written as strings ("nan", "inf"), so the text stays valid JSON.
std::string run_config_json(const TrainConfig& config, int world_size = 1, int rank = 0);

// What a trace's config JSON says.
struct RecordedRun {
  TrainConfig config;                 // the recorded values; the defaults where the JSON has no key
  std::vector<std::string> keys;      // the table's keys the JSON holds, in its order
  std::int64_t world_size = 1;        // a --ddp run's number of ranks and this trace's rank
  std::int64_t rank = 0;
  std::vector<std::string> unknown;   // keys no row reads (options of another version of ampscope)
};

// Reads every recorded row of a config JSON object. Throws Error "the recorded configuration's 'batch' is
// \"x\"; expected an integer" for a value of the wrong type. Values are not checked here:
// check_run_options and validate_config do that.
RecordedRun read_run_config(const nlohmann::json& config);

// A value as a command line gives it: "--lr 0.001", "--no-scaler", "--autocast-fp32 'a' --autocast-fp32 'b'".
std::string option_text(const RunOption& option, const TrainConfig& config);

}  // namespace ampscope::samples
