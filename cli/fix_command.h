// cli/fix_command.h: `ampscope fix TRACE`: re-runs a run `ampscope train` recorded, once per remedy its
// report proposes that an option can apply (and once in fp32, the reference), through the first anomaly's
// step and --after steps more, and says which remedies remove the anomaly (docs/training.md, "fix").
// The trace is input from elsewhere: every recorded option is replayed (or the table says why not) only
// after train's own checks; inputs are read only from under the trace's folder unless named here (--data,
// --text, --model, --tokens); the re-runs stop at the steps the trace holds; every output is created new,
// never through a link (core/io/output_file.h). The plan (re-runs, steps, every file read and written) is
// printed before the first re-run starts. A trace of `ampscope record` is re-run by its recorded command
// (shown first, run only with --run, only a Python interpreter on a script, never through a shell) with the
// remedies `ampscope record`'s options apply from outside the script (docs/pytorch.md, "Proving a fix").
//
//   std::ostringstream out, err;
//   int status = run_fix({.trace = "run.h5", .after = 2}, out, err);  // 0 verified, 1 none, 2 error
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

namespace ampscope::samples {

struct FixRequest {
  std::string trace{};
  std::int64_t after = 10;    // steps re-run after the first anomaly's step
  bool json = false;          // print the results document instead of the table
  bool run = false;           // --run: a recorded PyTorch run's command may run (without it: the plan, exit 3)
  // Without --run, a recorded PyTorch run's plan ends with a question on `err` and the answer is read from here
  // (FixCommand sets std::cin when stdin and stderr are terminals): "y" or "yes" runs, anything else (or end of
  // input) runs nothing (exit 3). nullptr: no question, exit 3.
  std::istream* answer = nullptr;
  std::string output{};       // results file; "" for <trace stem>.fix.json beside the trace
  // The run's inputs named by the user (as given: relative to the working folder), instead of the paths the
  // trace records (which are read only from under the trace's folder).
  std::string data{};
  std::string text{};
  std::string model{};
  std::string tokens{};
  // --finding KIND: an FP8 run's finding to fix (its first of that kind) instead of the report's first finding.
  std::string finding{};
};

// Prints the plan on `err`, runs the re-runs, writes the results file and each re-run's trace beside the
// original, prints the table (or the JSON) on `out` and one progress line per re-run on `err`. Returns 0 when
// at least one remedy is verified, 1 when none is, 2 on errors (a trace `ampscope train` did not write, a
// recorded value train refuses, an input outside the trace's folder, an output name that is a link, every
// re-run failed) and 0 with "nothing to fix" for a healthy run.
int run_fix(const FixRequest& request, std::ostream& out, std::ostream& err);

// A trace of `ampscope record` without --run (and no "y" on a terminal): the plan and the re-runs' command lines
// were printed, nothing ran.
inline constexpr int kExitPlanOnly = 3;

// "run.h5" -> "run.fix.json"; "run.h5", "lr-0.0005" -> "run.fix-lr-0.0005.h5".
std::string fix_results_path(const std::string& trace);
std::string fix_trace_path(const std::string& trace, const std::string& remedy_name);

class FixCommand {
 public:
  explicit FixCommand(CLI::App& app);
  bool parsed() const;
  int run();

 private:
  CLI::App* cmd_ = nullptr;
  FixRequest request_;
};

}  // namespace ampscope::samples
