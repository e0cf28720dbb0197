// `ampscope report` and `ampscope diff`: open the traces, run the analysis or the comparison, print the text
// or the JSON, and turn the outcome into an exit status a CI job can gate on (docs/report-format.md).
#include "samples/report_command.h"
#include "samples/progress_line.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <ostream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "probes/analysis_fix.h"
#include "probes/analysis_render.h"
#include "probes/trace_reader.h"

namespace ampscope::samples {

std::string without_hdf5_stack(const std::string& text) {
  std::string out;
  bool in_stack = false;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    if (line.starts_with("HDF5 error stack:")) in_stack = true;
    else if (line.starts_with("hint:")) in_stack = false;
    if (!in_stack) {
      if (!out.empty()) out += '\n';
      out += line;
    }
    start = end + 1;
  }
  return out;
}

namespace {

// Below this many op rows an analysis takes well under a second: no progress line.
constexpr std::int64_t kProgressRows = 200000;

// The error text of a file problem, with a hint when the reader's message has none.
void print_file_error(std::ostream& err, std::string_view command, const std::string& what) {
  err << fmt::format("ampscope {}: error: {}\n", command, what);
  if (what.find("hint:") == std::string::npos)
    err << "hint: ampscope reads the HDF5 traces `ampscope train --out FILE` writes (docs/trace-format.md)\n";
}

// Writes the rendered document to request.output, or to `out`. False (with the message on err) when the
// file cannot be written.
bool deliver(const std::string& text, const std::string& output, std::ostream& out, std::ostream& err,
             std::string_view command) {
  if (output.empty()) {
    out << text << std::flush;
    return true;
  }
  std::ofstream file(output, std::ios::binary | std::ios::trunc);
  if (file) file << text;
  if (file) file.flush();
  if (!file) {
    err << fmt::format("ampscope {}: error: cannot write '{}'\nhint: check that its folder exists and is writable\n",
                       command, output);
    return false;
  }
  return true;
}

// A number from lo to hi (hi may be infinity: --threshold inf counts only NaN/inf and saturation differences).
// CLI11's Range and NonNegativeNumber let "nan" through (every comparison with NaN is false), and
// NonNegativeNumber prints DBL_MAX as its upper bound.
CLI::Validator number_in(double lo, double hi, std::string description) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !(v >= lo && v <= hi))
          return hi == std::numeric_limits<double>::infinity()
                     ? fmt::format("value {} is not a number of at least {}", text, lo)
                     : fmt::format("value {} is not a number from {} to {}", text, lo, hi);
        return {};
      },
      std::move(description));
}

bool diverged(const analysis::DiffReport& d) { return d.diverged(); }

}  // namespace

bool colour_wanted(bool no_colour) {
  if (no_colour) return false;
  const char* no_color = std::getenv("NO_COLOR");  // https://no-color.org: set at all means no colour
  if (no_color != nullptr) return false;
  return isatty(fileno(stdout)) != 0;
}

int run_report(const ReportRequest& request, std::ostream& out, std::ostream& err) {
  analysis::Report rep;
  try {
    trace::TraceReader reader(request.trace);
    ProgressLine progress(err, request.progress, fmt::format("analysing {}", request.trace), "op rows", kProgressRows);
    rep = analysis::analyse(reader, request.analysis, std::ref(progress));
    progress.clear();
    rep.path = request.trace;  // as the user wrote it
  } catch (const trace::TraceError& e) {
    print_file_error(err, "report", request.verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
    return kExitUsage;
  } catch (const Error& e) {
    err << fmt::format("ampscope report: error: {}\n", request.verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
    return kExitUsage;
  }
  // Remedies `ampscope fix` verified (its results file beside the trace); a damaged file is only a note.
  if (const std::string note = analysis::mark_verified(rep, request.trace); !note.empty())
    err << "ampscope report: " << note << "\n";
  // The text says so itself; JSON or a file would hide it from the person who ran the command.
  if (!rep.complete && (request.json || !request.output.empty()))
    err << fmt::format("ampscope report: note: '{}' is incomplete (its writer did not close it: killed, failed or still "
                       "running); analysed the {} steps it holds\n",
                       request.trace, rep.steps);
  analysis::TextStyle style;
  style.colour = request.colour && request.output.empty();
  const std::string text = request.json ? analysis::render_json(rep) : analysis::render_text(rep, style);
  if (!deliver(text, request.output, out, err, "report")) return kExitUsage;
  return rep.healthy() ? kExitClean : kExitFound;
}

int run_diff(const DiffRequest& request, std::ostream& out, std::ostream& err) {
  analysis::DiffReport d;
  try {
    trace::TraceReader a(request.a);
    trace::TraceReader b(request.b);
    ProgressLine progress(err, request.progress, "comparing", "op rows", kProgressRows);
    d = analysis::diff(a, b, request.diff, std::ref(progress));
    progress.clear();
    d.path_a = request.a;
    d.path_b = request.b;
    for (const auto* r : {&a, &b})
      if (!r->complete())
        err << fmt::format("ampscope diff: note: '{}' is incomplete (its writer did not close it: killed, failed or "
                           "still running); compared the steps it holds\n",
                           r->path().string());
  } catch (const trace::TraceError& e) {
    print_file_error(err, "diff", request.verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
    return kExitUsage;
  } catch (const Error& e) {
    err << fmt::format("ampscope diff: error: {}\n", request.verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
    return kExitUsage;
  }
  analysis::TextStyle style;
  style.colour = request.colour && request.output.empty();
  const std::string text = request.json ? analysis::render_json(d) : analysis::render_text(d, style);
  if (!deliver(text, request.output, out, err, "diff")) return kExitUsage;
  return diverged(d) ? kExitFound : kExitClean;
}

ReportCommand::ReportCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("report", "Explain every NaN/Inf of a trace: where it started, why, how it spread, "
                                      "what to change. Exit status: 0 healthy, 1 anomalies found, 2 usage or file error");
  ReportRequest& r = request_;
  cmd_->add_option("trace", r.trace, "The HDF5 trace `ampscope train --out` wrote")->required();
  cmd_->add_flag("--json", r.json, "Print JSON (schema: docs/report-format.md) instead of text");
  cmd_->add_option("--output,-o", r.output, "Write the report to this file instead of stdout");
  cmd_->add_flag("--no-colour,--no-color", no_colour_, "No terminal colours (also when NO_COLOR is set)");
  cmd_->add_option("--headroom-factor", r.analysis.headroom_factor,
                   "Warn about finite outputs whose absmax comes within this factor of f16's largest value 65504")
      ->capture_default_str()
      ->check(number_in(1.0, 1000.0, "FLOAT in [1 - 1000]"));
  cmd_->add_option("--underflow-fraction", r.analysis.underflow_fraction,
                   "Warn when at least this fraction of a tensor's values are subnormal or flush to zero")
      ->capture_default_str()
      ->check(number_in(0.0, 1.0, "FLOAT in [0 - 1]"));
}

bool ReportCommand::parsed() const { return cmd_->parsed(); }

int ReportCommand::run(bool verbose) {
  ReportRequest r = request_;
  r.verbose = verbose;
  r.colour = !r.json && colour_wanted(no_colour_);
  r.progress = isatty(fileno(stderr)) != 0;
  return run_report(r, std::cout, std::cerr);
}

DiffCommand::DiffCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("diff", "Compare two traces (typically fp16 against fp32 with the same seed): first "
                                    "divergence, loss curves, per-op differences, dtype differences. Exit status: 0 no "
                                    "divergence beyond the threshold, 1 divergence, 2 usage or file error");
  DiffRequest& r = request_;
  cmd_->add_option("a", r.a, "The first trace (a)")->required();
  cmd_->add_option("b", r.b, "The second trace (b)")->required();
  cmd_->add_flag("--json", r.json, "Print JSON (schema: docs/report-format.md) instead of text");
  cmd_->add_option("--output,-o", r.output, "Write the comparison to this file instead of stdout");
  cmd_->add_option("--threshold", r.diff.threshold,
                   "Difference of an op's rms or mean (against the op's largest rms so far), of a gradient's norm or of "
                   "the loss (against its largest so far) above which the runs diverge")
      ->capture_default_str()
      ->check(number_in(0.0, std::numeric_limits<double>::infinity(), "FLOAT >= 0"));
  cmd_->add_flag("--no-colour,--no-color", no_colour_, "No terminal colours (also when NO_COLOR is set)");
}

bool DiffCommand::parsed() const { return cmd_->parsed(); }

int DiffCommand::run(bool verbose) {
  DiffRequest r = request_;
  r.verbose = verbose;
  r.colour = !r.json && colour_wanted(no_colour_);
  r.progress = isatty(fileno(stderr)) != 0;
  return run_diff(r, std::cout, std::cerr);
}

}  // namespace ampscope::samples
