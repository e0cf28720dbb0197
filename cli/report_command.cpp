// `ampscope report` and `ampscope diff`: open the traces, run the analysis or the comparison, print the text
// or the JSON, and turn the outcome into an exit status a CI job can gate on (docs/report-format.md).
#include "cli/report_command.h"
#include "cli/progress_line.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/output_file.h"
#include "probes/analysis/fix.h"
#include "probes/analysis/ranks.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"

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
  // Created new and renamed into place: never written through a link planted under the name.
  try {
    write_output_file(output, text);
  } catch (const Error& e) {
    err << fmt::format("ampscope {}: error: {}\n", command, e.what());
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

namespace {

// Inside a catch block of `report` or `diff`: prints the error being handled (a trace that could not be read
// with print_file_error, any other Error as one line; HDF5's error stack only with --verbose) and returns
// the usage-error status.
int command_failed(std::string_view command, bool verbose, std::ostream& err) {
  try {
    throw;
  } catch (const trace::TraceError& e) {
    print_file_error(err, command, verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
  } catch (const Error& e) {
    err << fmt::format("ampscope {}: error: {}\n", command, verbose ? std::string(e.what()) : without_hdf5_stack(e.what()));
  }
  return kExitUsage;
}

// A parameter's gradient that held NaN/inf, and which.
struct NonFiniteGradient {
  std::string param;
  bool nan = false, inf = false;
};

struct RankReport {
  int rank = 0;
  std::string path;
  analysis::Report report;
  std::map<std::int64_t, std::vector<std::string>> nonfinite_grads;  // step -> parameters, as /grads recorded
  // format_version 6: the rank's own gradients before the all-reduce: the steps recorded, and those that held
  // NaN/inf (step -> parameters, in the order recorded).
  std::set<std::int64_t> before_steps;
  std::map<std::int64_t, std::vector<NonFiniteGradient>> nonfinite_before;
  // format_version 6: the parameter checksums after each step: step -> (parameter -> checksum), "" the combined.
  std::map<std::int64_t, std::vector<std::pair<std::string, std::uint64_t>>> checksums;
  analysis::RankEnd end;  // how its trace ended: closed, still written, or not (a killed rank)
};

// Where the ranks' parameters first differ (their /checksums rows after the same step).
struct Drift {
  std::int64_t step = -1;  // -1: no difference
  std::vector<std::pair<int, std::vector<std::string>>> ranks;  // each rank that differs from rank 0: the parameters
  std::int64_t steps_compared = 0;   // steps every rank has checksums for
  std::int64_t steps_differing = 0;  // of those, steps where some rank differs from rank 0
};

// Compares every rank's checksums with rank 0's, step by step, over the steps every rank recorded.
Drift find_drift(const std::vector<RankReport>& ranks) {
  Drift drift;
  if (ranks.empty()) return drift;
  for (const auto& [step, reference] : ranks.front().checksums) {
    bool everywhere = true;
    for (const RankReport& r : ranks) everywhere = everywhere && r.checksums.count(step) > 0;
    if (!everywhere) continue;
    ++drift.steps_compared;
    std::map<std::string, std::uint64_t> ref(reference.begin(), reference.end());
    bool differs = false;
    std::vector<std::pair<int, std::vector<std::string>>> at_step;
    for (std::size_t k = 1; k < ranks.size(); ++k) {
      const auto& theirs = ranks[k].checksums.at(step);
      std::map<std::string, std::uint64_t> other(theirs.begin(), theirs.end());
      std::vector<std::string> params;
      for (const auto& [param, sum] : reference) {  // rank 0's order: registration order, the combined last
        if (param.empty()) continue;
        const auto it = other.find(param);
        if (it == other.end() || it->second != sum) params.push_back(param);
      }
      for (const auto& [param, sum] : theirs) {  // a parameter rank 0 does not have
        if (!param.empty() && ref.count(param) == 0) params.push_back(param);
      }
      const bool combined_differs = other.count("") && ref.count("") && other.at("") != ref.at("");
      if (params.empty() && combined_differs) params.push_back("(the combined checksum)");
      if (!params.empty()) {
        differs = true;
        at_step.emplace_back(ranks[k].rank, std::move(params));
      }
    }
    if (!differs) continue;
    ++drift.steps_differing;
    if (drift.step < 0) {
      drift.step = step;
      drift.ranks = std::move(at_step);
    }
  }
  return drift;
}

// "NaN", "inf" or "NaN and inf": what a set of gradients held.
std::string held(const std::vector<NonFiniteGradient>& grads) {
  bool nan = false, inf = false;
  for (const NonFiniteGradient& g : grads) {
    nan = nan || g.nan;
    inf = inf || g.inf;
  }
  return nan && inf ? "NaN and inf" : nan ? "NaN" : "inf";
}

// The rank a trace's writer was: its config's "rank" (absent: not a data-parallel trace).
int rank_of(const trace::RunInfo& run, const std::string& path) {
  const nlohmann::json config = nlohmann::json::parse(run.config, nullptr, false);
  if (config.is_discarded() || !config.is_object() || !config.contains("rank") || !config.contains("world_size")) {
    throw Error(fmt::format("'{}' is not a trace of a data-parallel run (its config has no rank); give the traces "
                            "`ampscope train --ddp --out` wrote (NAME.rank0.h5, NAME.rank1.h5, ...)",
                            path));
  }
  return config.at("rank").get<int>();
}

int run_multi_rank_report(const ReportRequest& request, std::ostream& out, std::ostream& err) {
  std::vector<RankReport> ranks;
  try {
    for (const std::string& path : request.rank_traces) {
      trace::TraceReader reader(path);
      RankReport r;
      r.path = path;
      r.rank = rank_of(reader.run_info(), path);
      r.report = analysis::analyse(reader, request.analysis);
      r.report.path = path;
      for (const trace::GradRow& g : reader.grads()) {
        if (g.nan + g.pos_inf + g.neg_inf == 0) continue;
        std::vector<std::string>& params = r.nonfinite_grads[g.step];  // scaled and unscaled rows: once each
        if (std::find(params.begin(), params.end(), g.param) == params.end()) params.push_back(g.param);
      }
      for (const trace::GradRow& g : reader.grads(trace::kFirstStep, trace::kLastStep, trace::GradRows::before_all_reduce)) {
        r.before_steps.insert(g.step);
        if (g.nan + g.pos_inf + g.neg_inf == 0) continue;
        std::vector<NonFiniteGradient>& params = r.nonfinite_before[g.step];
        if (std::none_of(params.begin(), params.end(), [&](const NonFiniteGradient& n) { return n.param == g.param; })) {
          params.push_back({g.param, g.nan > 0, g.pos_inf + g.neg_inf > 0});
        }
      }
      for (const trace::ChecksumRow& c : reader.checksums()) r.checksums[c.step].emplace_back(c.param, c.checksum);
      r.end = analysis::rank_end_of(reader, r.rank);
      ranks.push_back(std::move(r));
    }
  } catch (const Error&) {
    return command_failed("report", request.verbose, err);
  }
  std::sort(ranks.begin(), ranks.end(), [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].rank != static_cast<int>(i)) {
      err << fmt::format("ampscope report: error: the traces are not ranks 0 to {} of one run ('{}' is rank {})\n",
                         ranks.size() - 1, ranks[i].path, ranks[i].rank);
      return kExitUsage;
    }
  }
  // The first origin across ranks: by step, then phase, then seq (a rank's own order); ties keep the lower rank.
  const RankReport* first_rank = nullptr;
  const analysis::Diagnosis* first = nullptr;
  for (const RankReport& r : ranks) {
    for (const analysis::Diagnosis& d : r.report.anomalies) {
      const auto key = std::make_tuple(d.step, static_cast<int>(d.phase), d.seq);
      if (first == nullptr || key < std::make_tuple(first->step, static_cast<int>(first->phase), first->seq)) {
        first = &d;
        first_rank = &r;
      }
    }
  }
  const auto where = [](const analysis::Diagnosis& d) {
    return d.module.empty() ? (d.op.empty() ? std::string("the step") : d.op) : d.module;
  };
  // A rank whose trace ended before the others' (killed): named, and the run is not healthy.
  std::vector<analysis::RankEnd> rank_ends;
  for (const RankReport& r : ranks) rank_ends.push_back(r.end);
  const analysis::RankEnds ends = analysis::rank_ends(std::move(rank_ends));
  nlohmann::ordered_json j;
  std::string text = fmt::format("data-parallel run: {} ranks\n", ranks.size());
  j["ranks"] = ranks.size();
  for (const RankReport& r : ranks) {
    const std::string status = analysis::end_status(ends, r.rank);
    text += fmt::format("  rank {}: {} ({} steps, {} anomalies{})\n", r.rank, r.path, r.report.steps,
                        r.report.anomalies.size(), status.empty() ? "" : ", " + status);
    j["traces"].push_back(r.path);
  }
  text += analysis::render_text(ends);
  if (!ends.finished()) {  // only then: a finished run's JSON is as it was
    nlohmann::ordered_json per_rank = nlohmann::ordered_json::array();
    for (const analysis::RankEnd& e : ends.ranks)
      per_rank.push_back({{"rank", e.rank}, {"complete", e.complete}, {"writing", e.writing}, {"terminated", e.terminated},
                          {"last_step", e.last_step ? nlohmann::ordered_json(*e.last_step) : nullptr},
                          {"ended_early", std::count(ends.ended_early.begin(), ends.ended_early.end(), e.rank) > 0}});
    j["unfinished"] = {{"ended_early", ends.ended_early}, {"ranks", per_rank}};
  }
  if (first == nullptr) {
    text += "no NaN/Inf origin on any rank\n";
    j["first_origin"] = nullptr;
  } else {
    text += fmt::format("first origin across ranks: rank {}: {} in {} at step {} ({}, {}, seq {})\n", first_rank->rank,
                        first->cause, where(*first), first->step, first->op, trace::phase_name(first->phase), first->seq);
    j["first_origin"] = {{"rank", first_rank->rank}, {"step", first->step},
                         {"phase", std::string(trace::phase_name(first->phase))}, {"seq", first->seq},
                         {"cause", first->cause}, {"module", first->module}, {"op", first->op}};
    // The gradient story of that step. /grads holds each rank's gradients after the all-reduce (what
    // unscale_ saw), so a non-finite gradient on a rank without an origin came from another rank.
    std::vector<int> with, without;
    for (const RankReport& r : ranks) (r.nonfinite_grads.count(first->step) ? with : without).push_back(r.rank);
    nlohmann::ordered_json grads = nlohmann::ordered_json::array();
    for (const RankReport& r : ranks) {
      const auto it = r.nonfinite_grads.find(first->step);
      grads.push_back({{"rank", r.rank},
                       {"parameters", it == r.nonfinite_grads.end() ? std::vector<std::string>{} : it->second}});
    }
    j["nonfinite_gradients_after_all_reduce"] = grads;
    // Each rank's own gradients before the all-reduce (format_version 6), when every rank recorded them at
    // this step: which ranks' gradients broke on their own.
    const bool before_recorded = std::all_of(ranks.begin(), ranks.end(), [&](const RankReport& r) {
      return r.before_steps.count(first->step) > 0;
    });
    std::vector<std::string> broke, finite;
    if (before_recorded) {
      nlohmann::ordered_json before = nlohmann::ordered_json::array();
      for (const RankReport& r : ranks) {
        const auto it = r.nonfinite_before.find(first->step);
        std::vector<std::string> params;
        if (it != r.nonfinite_before.end()) {
          for (const NonFiniteGradient& g : it->second) params.push_back(g.param);
          broke.push_back(fmt::format("rank {}'s gradient of {}{} held {}", r.rank, params.front(),
                                      params.size() > 1 ? fmt::format(" (and {} more)", params.size() - 1) : "",
                                      held(it->second)));
        } else {
          finite.push_back(fmt::format("rank {}'s", r.rank));
        }
        before.push_back({{"rank", r.rank}, {"parameters", params}});
      }
      j["nonfinite_gradients_before_all_reduce"] = before;
    } else {
      j["nonfinite_gradients_before_all_reduce"] = nullptr;  // not recorded (a trace before format_version 6)
    }
    if (before_recorded && !broke.empty() && without.empty()) {
      text += fmt::format("gradients at step {}: {} before the all-reduce{}; after it every rank's did\n", first->step,
                          fmt::join(broke, "; "),
                          finite.empty() ? "" : fmt::format(" ({} were finite)", fmt::join(finite, ", ")));
    } else if (without.empty()) {
      const auto& params = first_rank->nonfinite_grads.at(first->step);
      text += fmt::format("gradients at step {}: rank {}'s overflow reached every rank through the all-reduce: after "
                          "it every rank's gradient of {}{} held NaN/inf\n",
                          first->step, first_rank->rank, params.front(),
                          params.size() > 1 ? fmt::format(" (and {} more)", params.size() - 1) : "");
    } else if (!with.empty()) {
      text += fmt::format("gradients at step {}: NaN/inf after the all-reduce on ranks {} only (the ranks' gradients "
                          "differ: not a plain data-parallel run?)\n",
                          first->step, fmt::join(with, ", "));
    }
  }
  // The ranks' parameters (format_version 6 checksums): the first step after which they differ.
  const bool checksums_recorded =
      std::all_of(ranks.begin(), ranks.end(), [](const RankReport& r) { return !r.checksums.empty(); });
  const Drift drift = checksums_recorded ? find_drift(ranks) : Drift{};
  j["checksums_recorded"] = checksums_recorded;
  j["checksum_steps_compared"] = drift.steps_compared;
  if (!checksums_recorded) {
    text += "parameters across ranks: not compared (no parameter checksums: traces before format_version 6)\n";
    j["parameter_drift"] = nullptr;
  } else if (drift.step < 0) {
    text += fmt::format("parameters across ranks: the same on every rank after each of the {} steps compared\n",
                        drift.steps_compared);
    j["parameter_drift"] = nullptr;
  } else {
    std::size_t count = 0;
    for (const auto& [rank, params] : drift.ranks) count += params.size();
    const auto& [rank, params] = drift.ranks.front();
    text += fmt::format("parameters diverged across ranks at step {}: rank {}'s {} differs from rank 0's{}; they "
                        "differ after {} of the {} steps compared\n",
                        drift.step, rank, params.front(), count > 1 ? fmt::format(" (and {} more)", count - 1) : "",
                        drift.steps_differing, drift.steps_compared);
    nlohmann::ordered_json differing = nlohmann::ordered_json::array();
    for (const auto& [r, ps] : drift.ranks) differing.push_back({{"rank", r}, {"parameters", ps}});
    j["parameter_drift"] = {{"step", drift.step}, {"reference_rank", 0}, {"ranks", differing},
                            {"steps_differing", drift.steps_differing}};
  }
  const bool healthy = drift.step < 0 && ends.finished() &&
                       std::all_of(ranks.begin(), ranks.end(), [](const RankReport& r) { return r.report.healthy(); });
  std::vector<std::string> reports;
  for (const RankReport& r : ranks) {
    analysis::TextStyle style;
    style.colour = request.colour && request.output.empty();
    text += fmt::format("\n== rank {} ({}) ==\n", r.rank, r.path) + analysis::render_text(r.report, style);
    j["reports"].push_back(nlohmann::ordered_json::parse(analysis::render_json(r.report)));
  }
  if (!deliver(request.json ? j.dump(2) + "\n" : text, request.output, out, err, "report")) return kExitUsage;
  return healthy ? kExitClean : kExitFound;
}

}  // namespace

int run_report(const ReportRequest& request, std::ostream& out, std::ostream& err) {
  if (request.rank_traces.size() >= 2) return run_multi_rank_report(request, out, err);
  analysis::Report rep;
  try {
    trace::TraceReader reader(request.trace);
    ProgressLine progress(err, request.progress, fmt::format("analysing {}", request.trace), "op rows", kProgressRows);
    rep = analysis::analyse(reader, request.analysis, std::ref(progress));
    progress.clear();
    rep.path = request.trace;  // as the user wrote it
  } catch (const Error&) {
    return command_failed("report", request.verbose, err);
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

namespace {

// Two data-parallel runs of N ranks each, rank r against rank r (analysis::diff_ranks).
// The note for a trace whose writer did not close it.
std::string incomplete_note(const std::string& path) {
  return fmt::format("ampscope diff: note: '{}' is incomplete (its writer did not close it: killed, failed or still "
                     "running); compared the steps it holds\n",
                     path);
}

int run_rank_diff(const DiffRequest& request, const std::vector<std::string>& a, const std::vector<std::string>& b,
                  std::ostream& out, std::ostream& err) {
  analysis::RankDiffReport d;
  try {
    d = analysis::diff_ranks(a, b, request.diff);
  } catch (const Error&) {
    return command_failed("diff", request.verbose, err);
  }
  for (const std::string& path : d.incomplete) err << incomplete_note(path);
  analysis::TextStyle style;
  style.colour = request.colour && request.output.empty();
  if (!deliver(request.json ? analysis::render_json(d) : analysis::render_text(d, style), request.output, out, err, "diff"))
    return kExitUsage;
  return d.diverged() ? kExitFound : kExitClean;
}

bool same_files(const std::vector<std::string>& x, const std::vector<std::string>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::error_code ec;
    if (!std::filesystem::equivalent(x[i], y[i], ec)) return false;
  }
  return true;
}

}  // namespace

int run_diff(const DiffRequest& request, std::ostream& out, std::ostream& err) {
  // A name that stands for a data-parallel run (run.h5 beside run.rank0.h5 ..., or one of the rank files) on
  // both sides, of two different runs: rank by rank. Two ranks of the same run fall through to the two-trace
  // diff below, which checks them as ranks of one run.
  const std::vector<std::string> ranks_a = rank_siblings({request.a}), ranks_b = rank_siblings({request.b});
  if (!ranks_a.empty() && !ranks_b.empty() && !same_files(ranks_a, ranks_b))
    return run_rank_diff(request, ranks_a, ranks_b, out, err);
  for (const auto& [name, ranks, other, other_name] : {std::tuple{&request.a, &ranks_a, &ranks_b, &request.b},
                                                        std::tuple{&request.b, &ranks_b, &ranks_a, &request.a}}) {
    if (!ranks->empty() && other->empty() && !std::filesystem::exists(*name) && std::filesystem::exists(*other_name)) {
      err << fmt::format("ampscope diff: error: '{}' names a {}-rank data-parallel run ({} ...) and the other trace is "
                         "one process's: rank r is compared with rank r of another data-parallel run\nhint: to compare "
                         "one rank with that trace, name the rank's file ({})\n",
                         *name, ranks->size(), ranks->front(), ranks->front());
      return kExitUsage;
    }
  }
  analysis::DiffReport d;
  std::optional<analysis::RankPairCheck> pair;
  try {
    trace::TraceReader a(request.a);
    trace::TraceReader b(request.b);
    ProgressLine progress(err, request.progress, "comparing", "op rows", kProgressRows);
    d = analysis::diff(a, b, request.diff, std::ref(progress));
    progress.clear();
    d.path_a = request.a;
    d.path_b = request.b;
    if (analysis::same_run(a.run_info(), b.run_info()) &&
        analysis::rank_place(a.run_info())->rank != analysis::rank_place(b.run_info())->rank)
      pair = analysis::check_rank_pair(a, b);
    for (const auto* r : {&a, &b})
      if (!r->complete()) err << incomplete_note(r->path().string());
  } catch (const Error&) {
    return command_failed("diff", request.verbose, err);
  }
  analysis::TextStyle style;
  style.colour = request.colour && request.output.empty();
  std::string text = request.json ? analysis::render_json(d) : analysis::render_text(d, style);
  if (pair && request.json) {
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text);
    doc["ranks_of_one_run"] = nlohmann::ordered_json::parse(analysis::render_json_object(*pair));
    text = doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  } else if (pair) {
    text = analysis::render_text(*pair, style) + "\n" + text;
  }
  if (!deliver(text, request.output, out, err, "diff")) return kExitUsage;
  // Two ranks of one run: their values differ by design; what must be identical decides.
  if (pair) return pair->agree() ? kExitClean : kExitFound;
  return diverged(d) ? kExitFound : kExitClean;
}

ReportCommand::ReportCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("report", "Explain every NaN/Inf of a trace: where it started, why, how it spread, "
                                      "what to change. Exit status: 0 healthy, 1 anomalies found, 2 usage or file error");
  ReportRequest& r = request_;
  cmd_->add_option("trace", traces_,
                   "The HDF5 trace `ampscope train --out` wrote; for a --ddp run, every rank's trace (run.rank0.h5 "
                   "run.rank1.h5 ...) or one of them (its siblings are found): the multi-rank report")
      ->required();
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
  r.rank_traces = rank_siblings(traces_);
  if (r.rank_traces.empty()) r.trace = traces_.front();
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
  cmd_->add_option("a", r.a,
                   "The first trace (a); for a --ddp run, run.h5 or one of its rank traces: every rank is compared "
                   "with the same rank of b")
      ->required();
  cmd_->add_option("b", r.b,
                   "The second trace (b); a rank trace of the same run as a: the two ranks are checked for what must "
                   "be identical on every rank")
      ->required();
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
