// cli/record_command.h: `ampscope record --out run.h5 -- python3 train.py ARGS...`: runs an unmodified PyTorch
// script under the pure-Python recorder (python/ampscope/torch, docs/pytorch.md) and writes what it sends with
// the project's trace writer, so a PyTorch run's trace is made by the same code as ours.
//
// The child gets a pipe's write end (its number in AMPSCOPE_RECORD_FD), the probe options as JSON in
// AMPSCOPE_RECORD_OPTIONS, and a PYTHONPATH whose first folder holds a sitecustomize.py that starts the
// recorder. It sends one JSON array per line (python/ampscope/torch/_channel.py); this process keeps a step's
// rows until the step's end_step record arrives, then writes them and flushes the trace: a script killed
// mid-step leaves every step it finished, in a file whose `complete` attribute stays 0.
//
//   RecordRequest r{.out = "run.h5", .command = {"python3", "train.py"}};
//   int status = run_record(r, std::cerr);   // the script's exit status (128 + signal when killed)
#pragma once

#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace ampscope::samples {

struct RecordRequest {
  std::string out{};
  std::string probe = "health";      // off, dtype, health or full (probes/probe.h Level)
  std::int64_t sample_every = 1;     // record ops and gradients every N steps (/steps: every step)
  std::vector<std::string> ops{};    // op name globs (empty: every op), as probe::ProbeOptions::ops
  std::vector<std::string> modules{};  // module path globs (empty: every module), as probe::ProbeOptions::modules
  bool record_optimizer = false;     // the optimizer's and clip_grad_norm_'s aten ops as optimizer-phase rows
  // --flight-recorder N: with --sample-every, every step is recorded and held; an unsampled step with an anomaly is
  // written with the N - 1 steps before it (probes/probe.h, the flight recorder). 0: off.
  std::int64_t flight_recorder = 0;
  std::string python_dir{};          // the folder holding the `ampscope` package ("": found, see find_python_dir)
  std::vector<std::string> command{};
  bool attach = false;               // --attach: rows on stdin from ampscope.torch.record(), no command run
  // Remedies the recorder applies from outside the script (python/ampscope/torch/_remedies.py; what `ampscope
  // fix` re-runs a recorded PyTorch run with, docs/pytorch.md "Proving a fix"). Unset: empty, NaN, 0 or -1.
  std::vector<std::string> autocast_fp32{};  // module path globs run with autocast off and f32 inputs
  std::string autocast{};                    // "bf16": f16 autocast regions get bf16; "off": autocast disabled
  double init_scale = std::numeric_limits<double>::quiet_NaN();  // every GradScaler's initial scale
  std::int64_t growth_interval = 0;          // every GradScaler's growth interval
  double lr_factor = std::numeric_limits<double>::quiet_NaN();   // every optimizer's lr times this
  std::int64_t stop_after = -1;              // the process ends (status 0) after this step
  // --twin: the recorder computes every recorded f16/bf16 forward op again in f32 (python/ampscope/torch/
  // _twin.py) and sends /precision rows; forward only (no backward rows for PyTorch runs).
  bool twin = false;
  // Set by `ampscope fix` only: the folder the command runs in ("": this process's), environment variables
  // set for it (names from kKeptEnvironment), and the script's stdout sent to stderr (fix's stdout is its own).
  std::string cwd{};
  std::vector<std::pair<std::string, std::string>> env{};
  bool stdout_to_stderr = false;
};

// The environment variables a recorded run keeps in its trace's config ("env") and `ampscope fix` sets again
// for its re-runs: those that change a PyTorch run's numbers or devices. No other name is recorded or set.
inline constexpr const char* kKeptEnvironment[] = {"CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG",
                                                   "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED"};

// The remedy options of `request` as `ampscope record` spells them ("--autocast-fp32 criterion --stop-after 3").
std::vector<std::string> remedy_arguments(const RecordRequest& request);

// Where the `ampscope` Python package is: $AMPSCOPE_PYTHON_DIR, else the installed copy next to the program
// (<prefix>/share/ampscope/python), else the source tree's python/. Throws Error naming the places tried.
std::string find_python_dir(const std::string& program_path);

// Runs the command, writes the trace, returns the command's exit status (128 + signal when a signal ended it);
// a bad request or a recorder that sent a bad record throws Error.
int run_record(const RecordRequest& request, std::ostream& err);

class RecordCommand {
 public:
  explicit RecordCommand(CLI::App& app);
  bool parsed() const;
  int run(const char* program_path);

 private:
  CLI::App* cmd_ = nullptr;
  RecordRequest request_;
};

}  // namespace ampscope::samples
