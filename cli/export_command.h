// cli/export_command.h: the `ampscope export TRACE --csv DIR` subcommand: every table of a trace as a
// CSV file (run.csv, steps.csv, ops.csv, grads.csv, events.csv, histograms.csv, dumps.csv,
// dump_values.csv; columns in docs/trace-format.md, "CSV export"), texts whole, numbers exact. A damaged
// trace is exported as far as it can be read, and what could not be is said. The work is in run_export,
// which writes to the streams given and returns the exit status, so tests call it without a subprocess.
//
//   std::ostringstream out, err;
//   int status = run_export({.trace = "run.h5", .dir = "csv"}, out, err);   // 0 done, 1 damaged, 2 error
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

namespace ampscope::samples {

// Exit statuses (as report and diff: 2 is a usage or file error).
inline constexpr int kExportDone = 0;     // every table exported
inline constexpr int kExportDamaged = 1;  // the trace is damaged: what could be read was exported, the rest is named
inline constexpr int kExportFailed = 2;   // nothing exported: a usage error, a missing or unreadable trace, DIR unusable

struct ExportRequest {
  std::string trace{};
  std::string dir{};                       // created when missing; files of the same names are replaced
  bool progress = false;                   // progress of a big trace on `err`
  std::int64_t progress_rows = 200000;     // tables of fewer rows show no progress
  std::int64_t rows_per_read = 65536;      // op rows read at a time (whole steps): memory stays bounded
  bool verbose = false;                    // errors keep HDF5's error stack
};

// Exports, writes one line per file written to `out` and messages to `err`; returns one of the statuses above.
int run_export(const ExportRequest& request, std::ostream& out, std::ostream& err);

// A CSV field: as it is, or in double quotes (quotes doubled) when it holds a comma, a quote, a line
// break or leading or trailing spaces (RFC 4180).
std::string csv_field(std::string_view text);
// A double that reads back to the same bits: the shortest such decimal; "nan", "inf", "-inf", "-0".
std::string csv_number(double value);

class ExportCommand {
 public:
  explicit ExportCommand(CLI::App& app);
  bool parsed() const;
  int run(bool verbose = false);

 private:
  CLI::App* cmd_ = nullptr;
  ExportRequest request_;
};

}  // namespace ampscope::samples
