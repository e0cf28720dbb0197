// cli/report_command.h: the `ampscope report` and `ampscope diff` subcommands: a trace's diagnosis (or
// two traces' comparison) as text or JSON (docs/report-format.md), with exit statuses a CI job can gate on.
// The work is in run_report / run_diff, which write to the streams given and return the exit status, so
// tests call them without a subprocess; the classes only wire them to CLI11.
//
//   std::ostringstream out, err;
//   int status = run_report({.trace = "run.h5", .json = true}, out, err);   // 0 healthy, 1 anomalies, 2 error
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/analysis/ranks.h"

namespace ampscope::samples {

// Exit statuses of both commands.
inline constexpr int kExitClean = 0;     // report: no anomaly; diff: no divergence beyond the threshold
inline constexpr int kExitFound = 1;     // report: anomalies found; diff: the runs diverge
inline constexpr int kExitUsage = 2;     // a usage error, a missing or unreadable file, a file that is not a trace

// An error's text without the HDF5 error stack it may carry ("HDF5 error stack:" and the frames under it,
// up to a "hint:" line): those lines help a developer, not a user; every command shows them only with
// --verbose.
std::string without_hdf5_stack(const std::string& text);

struct ReportRequest {
  std::string trace{};
  // A data-parallel run's traces, one per rank (`ampscope train --ddp --out run.h5` writes run.rank0.h5 ...):
  // with two or more, the report is the multi-rank one (the first origin across ranks, with its rank; which
  // ranks' gradients held NaN/inf that step; then each rank's own report) and `trace` is not read.
  std::vector<std::string> rank_traces{};
  bool json = false;
  std::string output{};       // write here instead of `out` ("" for `out`)
  bool colour = false;        // ANSI colours in the text (the command decides: terminal, NO_COLOR, --no-colour)
  bool progress = false;      // progress of a big trace on `err`
  bool verbose = false;       // errors keep HDF5's error stack
  analysis::AnalysisOptions analysis{};
};

struct DiffRequest {
  std::string a{}, b{};
  bool json = false;
  std::string output{};
  bool colour = false;
  bool progress = false;
  bool verbose = false;
  analysis::DiffOptions diff{};
};

// Analyse / compare, write the result to `out` (or request.output) and messages to `err`; returns one of the
// exit statuses above. File errors are reported on `err`, never thrown.
int run_report(const ReportRequest& request, std::ostream& out, std::ostream& err);

// The traces of the data-parallel run `given` names (probes/analysis/ranks.h, shared with the viewer).
using analysis::rank_siblings;
// `diff` of a data-parallel run's traces (docs/distributed.md, "Comparing data-parallel runs"): when a and b
// each name a run of N ranks (one name finds its siblings, as report does), rank r is compared with rank r
// (analysis::diff_ranks); when they are two ranks of one run, the op-by-op diff comes after the check of
// what must be identical on every rank (analysis::check_rank_pair), whose outcome is the exit status.
int run_diff(const DiffRequest& request, std::ostream& out, std::ostream& err);

// True when the text may be coloured: stdout is a terminal, NO_COLOR is unset and --no-colour was not given.
bool colour_wanted(bool no_colour);

class ReportCommand {
 public:
  explicit ReportCommand(CLI::App& app);
  bool parsed() const;
  int run(bool verbose = false);

 private:
  CLI::App* cmd_ = nullptr;
  ReportRequest request_;
  std::vector<std::string> traces_;
  bool no_colour_ = false;
};

class DiffCommand {
 public:
  explicit DiffCommand(CLI::App& app);
  bool parsed() const;
  int run(bool verbose = false);

 private:
  CLI::App* cmd_ = nullptr;
  DiffRequest request_;
  bool no_colour_ = false;
};

}  // namespace ampscope::samples
