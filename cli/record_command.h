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
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ampscope::samples {

struct RecordRequest {
  std::string out{};
  std::string probe = "health";      // "health" (the only level the Python recorder has so far)
  std::int64_t sample_every = 1;     // record ops every N steps (steps and gradients: every step)
  std::string python_dir{};          // the folder holding the `ampscope` package ("": found, see find_python_dir)
  std::vector<std::string> command{};
  bool attach = false;               // --attach: rows on stdin from ampscope.torch.record(), no command run
};

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
