// `ampscope fix`: proves a remedy by re-running the run with it. See cli/fix_command.h.
#include "cli/fix_command.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <iostream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/fix.h"
#include "probes/trace/reader.h"
#include "cli/report_command.h"
#include "cli/run.h"

namespace ampscope::samples {
namespace {

using nlohmann::ordered_json;

double json_number(const nlohmann::json& v, double fallback) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return INFINITY;
    if (s == "-inf") return -INFINITY;
  }
  return fallback;
}

// The configuration `ampscope train` recorded (the trace's root attribute `config`), as it ran: the
// scenario's configure() had already been applied, and applying it again on the re-run changes nothing.
TrainConfig config_from_json(const std::string& text, const std::string& trace) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  if (!j.is_object() || !j.contains("sample") || !j.contains("precision") || !j.contains("steps")) {
    throw Error(fmt::format("'{}' was not written by `ampscope train` (it has no run configuration: a user's own "
                            "training loop?); `ampscope fix` needs a run it can repeat.\nhint: apply the report's "
                            "remedies in your own loop and compare the new trace with `ampscope diff`",
                            trace));
  }
  TrainConfig c;
  c.sample = j.value("sample", c.sample);
  c.precision = parse_precision(j.value("precision", std::string("fp16")));
  c.device = j.value("device", c.device);
  c.steps = j.value("steps", c.steps);
  c.batch = j.value("batch", c.batch);
  c.lr = json_number(j.value("lr", nlohmann::json(c.lr)), c.lr);
  c.seed = j.value("seed", c.seed);
  c.scenario = j.value("scenario", c.scenario);
  c.init_scale = json_number(j.value("init_scale", nlohmann::json(c.init_scale)), c.init_scale);
  c.growth_interval = j.value("growth_interval", c.growth_interval);
  c.use_scaler = j.value("use_scaler", c.use_scaler);
  c.probe = j.value("probe", c.probe);
  c.sample_every = j.value("sample_every", c.sample_every);
  c.max_grad_norm = json_number(j.value("max_grad_norm", nlohmann::json(c.max_grad_norm)), c.max_grad_norm);
  c.zero_grad = j.value("zero_grad", c.zero_grad);
  c.autocast_fp32 = j.value("autocast_fp32", std::vector<std::string>{});
  c.data_dir = j.value("data", c.data_dir);
  c.text_file = j.value("text", c.text_file);
  c.resume = j.value("resume", c.resume);
  c.model_dir = j.value("model", c.model_dir);
  c.tokens_file = j.value("tokens", c.tokens_file);
  c.context = j.value("context", c.context);
  c.eval = j.value("eval", c.eval);
  c.fp16_clamp = j.value("fp16_clamp", c.fp16_clamp);
  c.checkpoint = j.value("checkpoint", c.checkpoint);
  c.checkpoint_every = j.value("checkpoint_every", c.checkpoint_every);
  c.keep_checkpoints = j.value("keep_checkpoints", c.keep_checkpoints);
  c.scenario_applied = true;
  return c;
}

// A name safe in a file name: letters, digits, '.', '-' and '_'; everything else becomes '_'.
std::string safe_name(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
                    ch == '-' || ch == '_';
    out += ok ? ch : '_';
  }
  while (!out.empty() && (out.front() == '.' || out.front() == '_')) out.erase(out.begin());
  return out.empty() ? "remedy" : out;
}

struct Candidate {
  std::string name;   // file-safe: "fp32", "bf16", "autocast-fp32-blocks.0.attn", "lr-0.0005"
  std::string kind;   // remedy kind, or "fp32" for the reference
  std::string flag;   // the option that applies it, as `ampscope train` spells it
  std::string text;
  TrainConfig config;
  std::string remedy_flag{};  // Remedy::flag of the report's remedy (what mark_verified matches on)
  std::int64_t from_step = 0;  // resumed from a kept checkpoint at this step, or 0
  bool retried = false;        // failed from the checkpoint, then re-run from step 0
};

struct ResumePoint {
  std::string path;
  std::int64_t step = 0;  // 0: none, start at step 0
};

// The last kept checkpoint (--keep-checkpoints) at or before `step`: the one a re-run through `step`
// can start from. Kept checkpoints exist at the multiples of checkpoint_every.
ResumePoint resume_point(const TrainConfig& ran, std::int64_t step) {
  if (!ran.keep_checkpoints || ran.checkpoint.empty() || ran.checkpoint_every < 1) return {};
  for (std::int64_t n = step / ran.checkpoint_every * ran.checkpoint_every; n > 0; n -= ran.checkpoint_every) {
    const std::string path = kept_checkpoint_path(ran.checkpoint, n);
    if (std::filesystem::is_regular_file(path)) return {path, n};
  }
  return {};
}

// The remedy applied to the configuration; false when no option applies this kind (code-only remedies).
bool apply(const analysis::Remedy& m, TrainConfig& c, std::string& flag) {
  if (m.kind == "autocast_fp32" && !m.pattern.empty()) {
    c.autocast_fp32.push_back(m.pattern);
    flag = m.flag;
    return true;
  }
  if (m.kind == "bf16") {
    c.precision = Precision::bf16;
    flag = "--precision bf16";
    return true;
  }
  if (m.kind == "learning_rate" && m.value > 0 && std::isfinite(m.value)) {
    c.lr = m.value;
    flag = fmt::format("--lr {}", m.value);
    return true;
  }
  if (m.kind == "init_scale" && m.value > 0 && std::isfinite(m.value)) {
    c.init_scale = m.value;
    flag = fmt::format("--init-scale {}", m.value);
    return true;
  }
  if (m.kind == "enable_scaler") {
    c.use_scaler = true;
    flag = "(without --no-scaler)";
    return true;
  }
  if (m.kind == "zero_grad") {
    c.zero_grad = true;
    flag = "(zero_grad every step)";
    return true;
  }
  return false;
}

struct Outcome {
  bool ran = false;
  std::string error;          // a re-run that failed
  bool applied = true;        // the re-run's recorded config shows the change (a scenario may force it back)
  bool gone = false;
  std::string first;          // "step 3, softmax in blocks.0.attn" or "none"
  double final_loss = NAN;
  double seconds_per_step = NAN;
  std::string trace;
  std::int64_t steps = 0;
};

// The re-run's anomalies of the original's kind (Diagnosis::cause), counted over the steps re-run.
Outcome measure(const Candidate& cand, const std::string& cause, std::ostream& err) {
  Outcome o;
  o.trace = cand.config.out;
  const auto t0 = std::chrono::steady_clock::now();
  TrainResult r;
  try {
    r = train(cand.config);
  } catch (const std::exception& e) {
    o.error = e.what();
    err << fmt::format("fix: {}: failed: {}\n", cand.name, o.error);
    return o;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.ran = true;
  o.steps = r.steps;
  o.final_loss = r.final_loss;
  o.seconds_per_step = r.steps > 0 ? secs / static_cast<double>(r.steps) : NAN;
  trace::TraceReader reader(cand.config.out);
  const TrainConfig ran = config_from_json(reader.run_info().config, cand.config.out);
  if (cand.kind == "enable_scaler") o.applied = ran.use_scaler;
  if (cand.kind == "zero_grad") o.applied = ran.zero_grad;
  const analysis::Report rep = analysis::analyse(reader);
  o.first = "none";
  o.gone = true;
  for (const analysis::Diagnosis& d : rep.anomalies) {
    if (d.cause != cause) continue;
    o.gone = false;
    o.first = fmt::format("step {}, {}{}", d.step, d.op.empty() ? d.cause : d.op,
                          d.module.empty() ? "" : " in " + d.module);
    break;
  }
  if (!o.applied) o.gone = false;
  err << fmt::format("fix: {}: {} steps in {:.1f}s: {}\n", cand.name, r.steps, secs,
                     !o.applied ? "not applied"
                                : (o.gone ? "anomaly gone" : "anomaly remains"));
  return o;
}

}  // namespace

std::string fix_results_path(const std::string& trace) { return analysis::fix_results_path(trace); }

std::string fix_trace_path(const std::string& trace, const std::string& remedy_name) {
  const std::filesystem::path p(trace);
  return (p.parent_path() / (p.stem().string() + ".fix-" + safe_name(remedy_name) + ".h5")).string();
}

int run_fix(const FixRequest& request, std::ostream& out, std::ostream& err) {
  if (request.after < 0) {
    err << fmt::format("ampscope fix: --after {} is not allowed; expected an integer >= 0\n", request.after);
    return kExitUsage;
  }
  TrainConfig base;
  analysis::Report report;
  try {
    trace::TraceReader reader(request.trace);
    base = config_from_json(reader.run_info().config, request.trace);
    report = analysis::analyse(reader);
  } catch (const std::exception& e) {
    err << "ampscope fix: error: " << without_hdf5_stack(e.what()) << "\n";
    return kExitUsage;
  }
  if (report.anomalies.empty()) {
    out << fmt::format("{}: the report finds no anomaly: nothing to fix\n", request.trace);
    return kExitClean;
  }
  const analysis::Diagnosis& first = report.anomalies.front();
  // Through the first anomaly's step and `after` steps more (steps are 0-based), never past the run.
  base.steps = std::min(base.steps, first.step + 1 + request.after);
  // The re-runs start at step 0, or from the last kept checkpoint at or before the first anomaly's step
  // (--keep-checkpoints: "ck.step-N.h5" holds the state before step N) when the run kept them.
  const ResumePoint from = resume_point(base, first.step);
  base.resume.clear();
  base.checkpoint.clear();
  base.checkpoint_every = 0;
  base.keep_checkpoints = false;

  std::vector<Candidate> cands;
  std::set<std::string> seen;
  auto add = [&](Candidate c) {
    if (!seen.insert(c.name).second) return;
    c.config.out = fix_trace_path(request.trace, c.name);
    cands.push_back(std::move(c));
  };
  {
    Candidate orig{"original", "original", "", "the run as recorded (the baseline: step time, the anomaly again)", base};
    add(orig);
    Candidate ref{"fp32", "fp32", "--precision fp32", "the fp32 reference run", base};
    ref.config.precision = Precision::fp32;
    add(ref);
  }
  for (const analysis::Diagnosis& d : report.anomalies) {
    for (const analysis::Remedy& m : d.remedies) {
      Candidate c{"", m.kind, "", m.text, base};
      if (!apply(m, c.config, c.flag)) continue;
      c.remedy_flag = m.flag;
      c.name = m.kind == "autocast_fp32" ? "autocast-fp32-" + m.pattern
               : m.kind == "learning_rate" ? fmt::format("lr-{}", m.value)
               : m.kind == "init_scale" ? fmt::format("init-scale-{}", m.value)
                                          : m.kind;
      c.name = safe_name(c.name);
      add(std::move(c));
    }
  }

  // From the checkpoint: the runs in the recorded precision resume from it (a checkpoint's scaler state
  // belongs to its precision: runs in another precision start at step 0). When the original does not
  // fail again from the checkpoint (what caused it is not in a checkpoint: gradients left from earlier
  // steps, say), every run starts at step 0 after all.
  auto from_checkpoint = [&](std::vector<Candidate>& list) {
    for (Candidate& c : list) {
      if (from.step <= 0 || c.config.precision != base.precision) continue;
      c.config.resume = from.path;
      c.config.steps = base.steps - from.step;
      c.from_step = from.step;
    }
  };
  from_checkpoint(cands);
  std::vector<Outcome> outcomes;
  bool fell_back = false;
  auto from_step_0 = [&](Candidate& c) {
    c.config.resume.clear();
    c.config.steps = base.steps;
    c.from_step = 0;
  };
  for (std::size_t i = 0; i < cands.size(); ++i) {
    outcomes.push_back(measure(cands[i], first.cause, err));
    if (cands[i].from_step == 0) continue;
    if (i == 0 && outcomes[0].ran && outcomes[0].gone) {
      err << fmt::format("fix: the original did not fail again from checkpoint '{}' (step {}): what caused the "
                         "anomaly is not in a checkpoint; re-running every candidate from step 0\n",
                         from.path, from.step);
      fell_back = true;
      for (Candidate& c : cands) from_step_0(c);
      outcomes.back() = measure(cands[0], first.cause, err);
    } else if (i > 0 && !(outcomes[i].ran && outcomes[i].gone)) {
      // A remedy that acts before the checkpoint (a learning rate whose damage was done in earlier steps)
      // cannot work from it: it gets its chance from step 0.
      err << fmt::format("fix: {}: the anomaly remains from the checkpoint at step {}; trying it from step 0\n",
                         cands[i].name, from.step);
      from_step_0(cands[i]);
      cands[i].retried = true;
      outcomes.back() = measure(cands[i], first.cause, err);
    }
  }
  const Outcome& orig = outcomes[0];
  const Outcome& fp32 = outcomes[1];

  ordered_json doc;
  doc["trace"] = request.trace;
  doc["cause"] = first.cause;
  doc["first_anomaly"] = {{"step", first.step}, {"op", first.op}, {"module", first.module}};
  doc["steps_rerun"] = base.steps;
  if (from.step > 0) {
    doc["checkpoint"] = {{"path", from.path}, {"step", from.step}, {"used", !fell_back}};
  }
  doc["reproduced"] = orig.ran && !orig.gone;
  ordered_json list = ordered_json::array();
  int verified = 0;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    const Candidate& c = cands[i];
    const Outcome& o = outcomes[i];
    const bool is_remedy = i >= 2;
    const bool ok = is_remedy && o.ran && o.gone && doc["reproduced"].get<bool>();
    verified += ok ? 1 : 0;
    ordered_json e;
    e["name"] = c.name;
    e["kind"] = c.kind;
    e["flag"] = c.flag;
    e["remedy_flag"] = c.remedy_flag;
    e["trace"] = o.trace;
    e["from_step"] = c.from_step;
    if (c.retried) e["retried_from_step_0"] = true;
    e["ran"] = o.ran;
    if (!o.error.empty()) e["error"] = o.error;
    e["applied"] = o.applied;
    e["anomaly_gone"] = o.ran && o.gone;
    e["verified"] = ok;
    e["first_anomaly"] = o.first;
    const double rel = std::isfinite(o.final_loss) && std::isfinite(fp32.final_loss) && fp32.final_loss != 0
                           ? (o.final_loss - fp32.final_loss) / std::abs(fp32.final_loss)
                           : NAN;
    e["final_loss"] = std::isfinite(o.final_loss) ? ordered_json(o.final_loss) : ordered_json(nullptr);
    e["final_loss_vs_fp32"] = std::isfinite(rel) ? ordered_json(rel) : ordered_json(nullptr);
    const double t = o.seconds_per_step / orig.seconds_per_step;
    e["step_time_vs_original"] = std::isfinite(t) ? ordered_json(t) : ordered_json(nullptr);
    list.push_back(e);
  }
  doc["runs"] = list;
  doc["verified"] = verified;

  const std::string results = request.output.empty() ? fix_results_path(request.trace) : request.output;
  {
    std::ofstream f(results);
    f << doc.dump(2) << "\n";
    if (!f) {
      err << fmt::format("ampscope fix: error: cannot write the results file '{}'\n", results);
      return kExitUsage;
    }
  }
  if (request.json) {
    out << doc.dump(2) << "\n";
  } else {
    out << fmt::format("{}: first anomaly: {} at step {} ({}{}); re-ran steps 0..{}{}\n", request.trace, first.cause,
                       first.step, first.op.empty() ? "-" : first.op, first.module.empty() ? "" : " in " + first.module,
                       base.steps - 1, doc["reproduced"].get<bool>() ? "" : " (the re-run did NOT reproduce it)");
    if (from.step > 0 && !fell_back) {
      out << fmt::format("runs in {} resumed from {} (the state before step {}); the others ran from step 0, and a "
                         "remedy that failed from the checkpoint was tried again from step 0\n",
                         precision_name(base.precision), from.path, from.step);
    }
    out << fmt::format("{:<34} {:<8} {:<36} {:>10} {:>9}\n", "remedy", "gone", "first anomaly after it",
                       "loss/fp32", "time");
    for (const auto& e : list) {
      auto pct = [](const ordered_json& v) {
        return v.is_null() ? std::string("-") : fmt::format("{:+.1f}%", 100 * v.get<double>());
      };
      auto num = [](const ordered_json& v, const char* f) {
        return v.is_null() ? std::string("-") : fmt::format(fmt::runtime(f), v.get<double>());
      };
      out << fmt::format("{:<34} {:<8} {:<36} {:>10} {:>9}\n", e["name"].get<std::string>(),
                         e["kind"] == "original" ? "-" : (e["anomaly_gone"].get<bool>() ? "yes" : "no"),
                         e["first_anomaly"].get<std::string>(), pct(e["final_loss_vs_fp32"]),
                         num(e["step_time_vs_original"], "{:.2f}x"));
    }
    out << fmt::format("{} remed{} verified; results: {}\n", verified, verified == 1 ? "y" : "ies", results);
  }
  return verified > 0 ? kExitClean : kExitFound;
}

FixCommand::FixCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "fix", "Re-run a run `ampscope train` recorded, once per remedy its report proposes (and in fp32), through "
             "the first anomaly and --after steps more; say which remedies remove the anomaly. Exit 0: at least one "
             "verified (or nothing to fix), 1: none, 2: errors");
  cmd_->add_option("trace", request_.trace, "Trace written by `ampscope train`")->required();
  cmd_->add_option("--after", request_.after, "Steps re-run after the first anomaly's step")->capture_default_str();
  cmd_->add_flag("--json", request_.json, "Print the results document (run.fix.json) instead of the table");
  cmd_->add_option("--output", request_.output, "Results file (default: <trace stem>.fix.json beside the trace)");
}

bool FixCommand::parsed() const { return cmd_->parsed(); }

int FixCommand::run() { return run_fix(request_, std::cout, std::cerr); }

}  // namespace ampscope::samples
