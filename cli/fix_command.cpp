// `ampscope fix`: proves a remedy by re-running the run with it. See cli/fix_command.h.
//
// A trace is a file from elsewhere ("here is my trace, why does it NaN?"), and fix runs what it describes,
// so the trace is treated as hostile input: its recorded configuration passes train's own checks (the table
// of samples/run_options.h), the files it names are read only from under the trace's folder (a path the
// trace records is never followed out of it: the user names such files on the command line), the re-runs
// stop at the steps the trace holds, and nothing is written through a name planted beside it. A run of
// `ampscope record` (a PyTorch script) is re-run by its recorded command, under the rule of "A recorded
// PyTorch run" below (docs/pytorch.md, "Proving a fix").
#include "cli/fix_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <ostream>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/hdf5_support.h"
#include "core/io/output_file.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/fix.h"
#include "probes/trace/reader.h"
#include "cli/fix_judging.h"
#include "cli/record_command.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "cli/run_options_io.h"
#include "cli/train_command.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// ---- The recorded run ----------------------------------------------------------------------------------

// The configuration `ampscope train` recorded (the trace's root attribute `config`), as it ran: the
// scenario's configure() had already been applied, and applying it again on the re-run changes nothing.
// What it trained is a `sample`, or a `model` folder (whose runs record no sample; older traces of them
// recorded the unused default "mlp" as well, which the model folder overrides).
RecordedRun read_recorded(const std::string& text, const std::string& trace) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool trains_something = j.is_object() && (j.contains("sample") || j.contains("model"));
  if (!trains_something || !j.contains("precision") || !j.contains("steps")) {
    throw Error(fmt::format("'{}' was not written by `ampscope train` (it has no run configuration: a user's own "
                            "training loop?); `ampscope fix` needs a run it can repeat.\nhint: apply the report's "
                            "remedies in your own loop and compare the new trace with `ampscope diff`",
                            trace));
  }
  try {
    RecordedRun run = read_run_config(j);
    run.config.scenario_applied = true;
    return run;
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': {}; fix re-runs only a configuration `ampscope train` would run\nhint: the trace "
                            "was edited or damaged: record the run again with `ampscope train`",
                            trace, e.what()));
  }
}

// train's checks of every recorded value (a trace whose attributes were edited, with their checksum
// recomputed, can hold any value): refused with the recorded key named.
void check_recorded_values(const RecordedRun& run, const std::string& trace) {
  for (const RunOption& row : run_options()) {
    const std::optional<Refusal> bad = row.refusal(run.config);
    if (!bad) continue;
    throw Error(fmt::format("'{}': the recorded configuration's '{}' is {}, which `ampscope train` refuses (--{}: "
                            "expected {}); fix re-runs only what train would run\nhint: the trace was edited or "
                            "damaged: record the run again with `ampscope train`",
                            trace, row.json_key, bad->value, row.name, bad->expected));
  }
  try {
    if (run.config.model_dir.empty()) find_sample(run.config.sample);
    if (!run.config.scenario.empty()) find_scenario(run.config.scenario);
  } catch (const Error& e) {
    throw Error(fmt::format("'{}': the recorded configuration names {}", trace, e.what()));
  }
}

// An option of the recorded run that the re-runs do not repeat, and why (the plan and the table say so).
struct NotReplayed {
  std::string option;
  std::string value;
  std::string why;
};

std::vector<NotReplayed> not_replayed(const RecordedRun& run) {
  const TrainConfig& c = run.config;
  std::vector<NotReplayed> notes;
  if (run.world_size > 1) {
    notes.push_back({"--ddp", fmt::format("{} ranks (this trace: rank {})", run.world_size, run.rank),
                     fmt::format("fix starts no ranks: each re-run is one process training on the whole global batch "
                                 "(--batch {}), the same training up to the order of the gradient sums; a failure of "
                                 "one rank alone may not reproduce",
                                 c.batch)});
  }
  if (!c.resume.empty()) {
    notes.push_back({"--resume", fmt::format("'{}'", c.resume),
                     "the re-runs start at step 0 (or at a checkpoint the run kept beside the trace)"});
  }
  if (!c.checkpoint.empty()) {
    notes.push_back({"--checkpoint", fmt::format("'{}'", c.checkpoint),
                     "fix saves no checkpoints (it resumes from the run's kept ones, found beside the trace)"});
  }
  for (const std::string& key : run.unknown) {
    notes.push_back({key, "", "not an option of this version of ampscope"});
  }
  return notes;
}

// ---- Inputs --------------------------------------------------------------------------------------------

// A file or folder a re-run reads.
struct Input {
  std::string option;  // "--text"
  std::string path;    // as the re-runs open it
  bool user_named = false;
};

bool is_within(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

// A folder the run reads (a model folder, MNIST's files): a folder, and every entry in it a regular file or
// a folder; with `root`, every link in it leads to within root.
void check_folder(const std::string& option, const fs::path& folder, const fs::path* root) {
  struct stat st {};
  const bool exists = ::stat(folder.c_str(), &st) == 0;
  if (!exists || !S_ISDIR(st.st_mode)) {
    throw Error(fmt::format("{} '{}': {}", option, folder.string(), exists ? "not a folder" : "no such folder"));
  }
  if (root == nullptr) return;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, ec)) {
    const fs::path p = entry.path();
    if (fs::is_symlink(fs::symlink_status(p, ec))) {
      const fs::path target = fs::canonical(p, ec);
      if (ec || !is_within(target, *root)) {
        throw Error(fmt::format("{} '{}': its entry '{}' is a link that leads outside the trace's folder ('{}'); fix "
                                "reads only files under the trace's folder unless you name them\nhint: check the "
                                "folder, and name it yourself: {} DIR",
                                option, folder.string(), p.filename().string(), ec ? "?" : target.string(), option));
      }
    }
    const fs::file_status status = fs::status(p, ec);
    if (!fs::is_regular_file(status) && !fs::is_directory(status)) {
      throw Error(fmt::format("{} '{}': its entry '{}' is not a regular file (a FIFO, a device, a socket or a broken "
                              "link); fix opens none of those\nhint: remove it",
                              option, folder.string(), p.filename().string()));
    }
  }
}

void check_input(const std::string& option, const fs::path& path, bool folder, const fs::path* root) {
  if (folder) return check_folder(option, path, root);
  // Examined before it is opened: a FIFO would block the open.
  if (const std::string reason = hdf5::unreadable_reason(path.c_str()); !reason.empty()) {
    throw Error(fmt::format("{} '{}': {}; fix reads regular files only", option, path.string(), reason));
  }
}

// Where a path the trace records leads: relative to the trace's folder, and within it. An absolute path is
// not followed: the trace's author chose it.
fs::path confined_path(const std::string& option, const std::string& recorded, const fs::path& folder,
                       const fs::path& root, const std::string& trace) {
  const std::string hint = fmt::format("hint: check that it is what you mean, and name it yourself: ampscope fix {} {} "
                                       "PATH",
                                       trace, option);
  if (fs::path(recorded).is_absolute()) {
    throw Error(fmt::format("'{}': the recorded run read '{}' ({}), an absolute path; fix reads nothing a trace names "
                            "outside the trace's own folder\n{}",
                            trace, recorded, option, hint));
  }
  const fs::path resolved = (folder / recorded).lexically_normal();
  std::error_code ec;
  const fs::path real = fs::canonical(resolved, ec);
  if (ec) {
    throw Error(fmt::format("'{}': the recorded run read '{}' ({}), which is not at '{}' (paths a trace records are "
                            "relative to its folder)\n{}",
                            trace, recorded, option, resolved.string(), hint));
  }
  if (!is_within(real, root)) {
    throw Error(fmt::format("'{}': the recorded run read '{}' ({}), which leads to '{}', outside the trace's folder "
                            "'{}'; fix reads only files under the trace's folder unless you name them\n{}",
                            trace, recorded, option, real.string(), root.string(), hint));
  }
  return resolved;
}

// The inputs of the re-runs, set in `base`: each override the user named, else the recorded path resolved
// against (and confined to) the trace's folder.
std::vector<Input> resolve_inputs(TrainConfig& base, const FixRequest& request, const fs::path& folder,
                                  const fs::path& root) {
  struct Slot {
    const char* name;
    bool folder;
    const std::string& override_path;
  };
  const Slot slots[] = {{"data", true, request.data},
                        {"model", true, request.model},
                        {"tokens", false, request.tokens},
                        {"text", false, request.text}};
  std::vector<Input> inputs;
  for (const Slot& slot : slots) {
    const RunOption& row = *find_run_option(slot.name);
    const std::string option = "--" + std::string(slot.name);
    const std::string recorded = std::get<std::string>(row.get(base));
    if (!slot.override_path.empty()) {
      if (recorded.empty()) {
        throw Error(fmt::format("{}: the recorded run read no {}; fix replays the run as recorded and cannot add one\n"
                                "hint: leave {} out",
                                option, slot.folder ? "folder of this kind" : "file of this kind", option));
      }
      check_input(option, slot.override_path, slot.folder, nullptr);
      row.set(base, slot.override_path);
      inputs.push_back({option, slot.override_path, true});
      continue;
    }
    if (recorded.empty()) continue;
    const fs::path path = confined_path(option, recorded, folder, root, request.trace);
    check_input(option, path, slot.folder, &root);
    row.set(base, path.string());
    inputs.push_back({option, path.string(), false});
  }
  return inputs;
}

struct ResumePoint {
  std::string path;
  std::int64_t step = 0;  // 0: none, start at step 0
};

// The last checkpoint the run kept (--keep-checkpoints) at or before `step`, looked for beside the trace
// under the recorded checkpoint's file name (its recorded folder is not followed): "ck.step-N.h5" holds the
// state before step N, at the multiples of checkpoint_every.
ResumePoint resume_point(const TrainConfig& ran, std::int64_t step, const fs::path& folder, const fs::path& root) {
  if (!ran.keep_checkpoints || ran.checkpoint.empty() || ran.checkpoint_every < 1) return {};
  const fs::path name = fs::path(ran.checkpoint).filename();
  if (name.empty() || name == "." || name == "..") return {};
  // The folder's names, not a probe of every multiple: a step number is bounded by the trace, the folder's
  // entries by the folder.
  const std::string prefix = name.stem().string() + ".step-";
  const std::string suffix = name.extension().string();
  ResumePoint best;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder.empty() ? fs::path(".") : folder, ec)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with(prefix) || !file.ends_with(suffix) || file.size() <= prefix.size() + suffix.size()) continue;
    const std::string digits = file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::int64_t n = std::stoll(digits);
    if (n <= 0 || n > step || n % ran.checkpoint_every != 0 || n <= best.step) continue;
    const fs::path path = kept_checkpoint_path((folder / name).string(), n);
    const fs::path real = fs::canonical(path, ec);
    if (ec || !is_within(real, root) || !hdf5::unreadable_reason(path.c_str()).empty()) continue;
    best = {path.string(), n};
  }
  return best;
}

// ---- Candidates ----------------------------------------------------------------------------------------

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
  std::string name;   // as the table shows it: "fp32", "bf16", "autocast-fp32-blocks.*.attn", "lr-0.0005"
  std::string kind;   // remedy kind, or "fp32" for the reference
  std::string flag;   // the option that applies it, as `ampscope train` spells it
  std::string text;
  TrainConfig config;
  std::string remedy_flag{};  // Remedy::flag of the report's remedy (what mark_verified matches on)
  std::int64_t from_step = 0;  // resumed from a kept checkpoint at this step, or 0
  bool retried = false;        // failed from the checkpoint, then re-run from step 0
  std::string trace{};         // where its trace ends up (beside the original)
  RecordRequest record{};      // a recorded PyTorch run's re-run: the remedy options of `ampscope record`
  std::string remedy_text{};   // the remedy's text where its flag is "" (cast_f32): what mark_verified matches
  bool reference = false;      // a reference run (fp32, and bf16 for FP8 findings), not a remedy
};

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

// An FP8 finding's cause in the plan (FixPlan::first.cause): "fp8:" and the finding's kind. A run without a
// NaN/Inf anomaly whose report has FP8 findings is fixed for the first finding's kind (docs/fp8.md).
constexpr std::string_view kFp8Cause = "fp8:";

// What the plan fixes, in the plan's and the table's words: an FP8 finding is not an anomaly (nothing went
// NaN or inf), so it is not called one.
std::string first_what(const analysis::Diagnosis& first) {
  return first.cause.starts_with(kFp8Cause) ? "first FP8 finding" : "first anomaly";
}

// An FP8 remedy (analysis::Fp8Remedy) applied to the configuration: false when it changes nothing (the run
// already used it) or names an option fix does not know. --fp8-margin takes `margin` (the largest of the
// findings': the option is one for every operand).
bool apply_fp8(const analysis::Fp8Remedy& r, std::int64_t margin, TrainConfig& c, std::string& flag, std::string& name) {
  if (r.option == "--fp8-format" && (r.value == "hybrid" || r.value == "e4m3") && c.fp8_format != r.value) {
    c.fp8_format = r.value;
  } else if (r.option == "--fp8-recipe" && (r.value == "current" || r.value == "delayed") && c.fp8_recipe != r.value) {
    c.fp8_recipe = r.value;
  } else if (r.option == "--fp8-amax-algo" && (r.value == "most_recent" || r.value == "max") &&
             c.fp8_recipe == "delayed" && c.fp8_amax_algo != r.value) {
    c.fp8_amax_algo = r.value;
  } else if (r.option == "--fp8-amax-history" && c.fp8_recipe == "delayed") {
    // Only ever shorter: a longer history holds a spike longer.
    std::int64_t n = 0;
    const auto [end, ec] = std::from_chars(r.value.data(), r.value.data() + r.value.size(), n);
    if (ec != std::errc() || end != r.value.data() + r.value.size() || n < 1 || n >= c.fp8_amax_history) return false;
    c.fp8_amax_history = n;
  } else if (r.option == "--fp8-keep-bf16" && !r.value.empty() &&
             std::find(c.fp8_keep_bf16.begin(), c.fp8_keep_bf16.end(), r.value) == c.fp8_keep_bf16.end()) {
    c.fp8_keep_bf16.push_back(r.value);
  } else if (r.option == "--mx-scale" && r.value == "round-up" && c.precision == Precision::mxfp8 &&
             c.mx_scale != r.value) {
    c.mx_scale = r.value;
  } else if (r.option == "--nvfp4-rht" && r.value == "on" && c.precision == Precision::nvfp4 && !c.nvfp4_rht) {
    // The transform is on by default: the remedy drops --nvfp4-no-rht.
    c.nvfp4_rht = true;
    flag = r.command_line;
    name = "nvfp4-rht";
    return true;
  } else if (r.option == "--precision" && r.value == "fp8" && c.precision == Precision::mxfp8) {
    // Per-tensor FP8 in place of MXFP8: the block options go (leave_quantized_options), the keep options stay.
    c.precision = Precision::fp8;
    leave_quantized_options(c);
  } else if (r.option == "--fp8-margin" && c.fp8_recipe == "delayed" && margin > c.fp8_margin) {
    c.fp8_margin = margin;
    flag = fmt::format("--fp8-margin {}", margin);
    name = fmt::format("fp8-margin-{}", margin);
    return true;
  } else {
    return false;
  }
  flag = r.command_line;
  name = r.option.substr(2) + "-" + r.value;
  return true;
}

// The original, the fp32 reference, and one run per remedy an option can apply, each once.
std::vector<Candidate> candidates_of(const TrainConfig& base, const analysis::Report& report, const std::string& trace,
                                     const std::string& kind_to_fix) {
  std::vector<Candidate> cands;
  std::set<std::string> seen;
  std::set<std::string> files;
  auto add = [&](Candidate c) {
    if (!seen.insert(c.name).second) return;
    // The trace's file name is the name made file-safe ('*' -> '_'); two names that become one file get a number.
    c.trace = fix_trace_path(trace, c.name);
    for (int n = 2; !files.insert(c.trace).second; ++n) c.trace = fix_trace_path(trace, fmt::format("{}-{}", c.name, n));
    cands.push_back(std::move(c));
  };
  add({"original", "original", "", "the run as recorded (the baseline: step time, the anomaly again)", base});
  Candidate ref{"fp32", "fp32", "--precision fp32", "the fp32 reference run", base};
  ref.config.precision = Precision::fp32;
  ref.reference = true;
  leave_quantized_options(ref.config);
  add(std::move(ref));
  if (report.anomalies.empty() && kind_to_fix.starts_with(kFp8Cause)) {
    // Fixing FP8 findings: the bf16 run (what FP8 is measured against: fp8_error_dominates' loss tolerance, and
    // every FP8 re-run's loss/bf16), then the remedies of the findings of the kind fixed.
    Candidate bf16{"bf16", "bf16_reference", "--precision bf16", "the bf16 reference run (FP8 measured against it)", base};
    bf16.config.precision = Precision::bf16;
    bf16.reference = true;
    leave_quantized_options(bf16.config);
    add(std::move(bf16));
    const std::string kind = kind_to_fix.substr(kFp8Cause.size());
    std::int64_t margin = 0;
    for (const analysis::Fp8Finding& f : report.fp8.findings)
      if (f.kind == kind) margin = std::max<std::int64_t>(margin, f.margin);
    for (const analysis::Fp8Finding& f : report.fp8.findings) {
      if (f.kind != kind) continue;
      for (const analysis::Fp8Remedy& r : f.remedies) {
        Candidate c{"", r.option.substr(2), "", r.why, base};
        std::replace(c.kind.begin(), c.kind.end(), '-', '_');
        if (!apply_fp8(r, margin, c.config, c.flag, c.name)) continue;
        c.remedy_flag = c.flag;  // what mark_verified matches a finding's remedy on (its command line)
        add(std::move(c));
      }
    }
  }
  for (const analysis::Diagnosis& d : report.anomalies) {
    for (const analysis::Remedy& m : d.remedies) {
      Candidate c{"", m.kind, "", m.text, base};
      if (!apply(m, c.config, c.flag)) continue;
      leave_quantized_options(c.config);
      c.remedy_flag = m.flag;
      c.name = m.kind == "autocast_fp32" ? "autocast-fp32-" + m.pattern
               : m.kind == "learning_rate" ? fmt::format("lr-{}", m.value)
               : m.kind == "init_scale" ? fmt::format("init-scale-{}", m.value)
                                          : m.kind;
      add(std::move(c));
    }
  }
  return cands;
}

// ---- A recorded PyTorch run (`ampscope record -- python3 train.py`) -------------------------------------
//
// Its trace's config holds the command as it was given, the folder it ran in and the kept environment
// variables (kKeptEnvironment). That command is code a file chose, so before anything runs:
// - it is shown, with the folder, the environment and the exact command line of every re-run, and nothing
//   runs without --run (exit 3 then);
// - it runs only a Python interpreter (python, python3, python3.N; the recorder works only inside Python) on
//   a script file that exists in the recorded folder, or a module (-m); code on the command line (-c, or a
//   script on stdin) and interpreter options other than a known harmless few are refused;
// - it is run with fork and exec, never through a shell, in the recorded folder (which must exist and be a
//   folder), with only the kept variables set from the trace (no other name a trace holds is set);
// - each re-run's trace is written in a private folder and moved beside the original (the output folder):
//   nothing fix writes is placed by a name the trace chose. What the script itself writes is its own.

struct TorchRun {
  std::vector<std::string> command;
  std::string cwd;
  std::vector<std::pair<std::string, std::string>> env;
  std::string interpreter;  // where exec finds command[0] (shown in the plan)
  std::string script;       // the script file, resolved in cwd ("" with -m)
  std::string module;       // -m MODULE
  double lr = NAN;          // the first recorded step's learning rate (the lr remedy is a factor of it)
  std::int64_t stop_after = 0;
};

bool is_python_name(const std::string& name) {
  if (!name.starts_with("python")) return false;
  const std::string rest = name.substr(6);
  return rest.find_first_not_of("0123456789.") == std::string::npos && !rest.starts_with(".");
}

bool is_executable_file(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

bool has_nul(const std::string& s) { return s.find('\0') != std::string::npos; }

TorchRun read_torch_run(const nlohmann::json& j, const std::string& trace) {
  const std::string edited = "hint: the trace was edited or damaged: record the run again with `ampscope record "
                             "--out run.h5 -- python3 train.py`";
  if (!j.contains("command") || !j.contains("cwd")) {
    throw Error(fmt::format("'{}' records a PyTorch run but not the command that ran it (recorded with "
                            "ampscope.torch.record(), or by an older ampscope): fix has nothing to re-run\nhint: record "
                            "the script with `ampscope record --out run.h5 -- python3 train.py`, then fix that trace",
                            trace));
  }
  TorchRun run;
  const nlohmann::json& cmd = j["command"];
  if (!cmd.is_array() || cmd.empty() || cmd.size() > 4096) {
    throw Error(fmt::format("'{}': the recorded command is not a list of 1 to 4096 words\n{}", trace, edited));
  }
  for (const nlohmann::json& w : cmd) {
    if (!w.is_string() || w.get<std::string>().empty() || w.get<std::string>().size() > 65536 ||
        has_nul(w.get<std::string>())) {
      throw Error(fmt::format("'{}': a word of the recorded command is not a non-empty text without NUL bytes\n{}",
                              trace, edited));
    }
    run.command.push_back(w.get<std::string>());
  }
  if (!j["cwd"].is_string() || has_nul(j["cwd"].get<std::string>()) ||
      !fs::path(j["cwd"].get<std::string>()).is_absolute()) {
    throw Error(fmt::format("'{}': the recorded folder is not an absolute path\n{}", trace, edited));
  }
  run.cwd = j["cwd"].get<std::string>();
  if (j.contains("env")) {
    if (!j["env"].is_object()) throw Error(fmt::format("'{}': the recorded 'env' is not an object\n{}", trace, edited));
    for (const auto& [name, value] : j["env"].items()) {
      const bool kept = std::any_of(std::begin(kKeptEnvironment), std::end(kKeptEnvironment),
                                    [&](const char* k) { return name == k; });
      if (!kept) {
        throw Error(fmt::format("'{}': the recorded environment sets '{}', which `ampscope record` never keeps (it "
                                "keeps only {}); fix sets no other variable a trace names\n{}",
                                trace, name, fmt::join(kKeptEnvironment, ", "), edited));
      }
      if (!value.is_string() || has_nul(value.get<std::string>())) {
        throw Error(fmt::format("'{}': the recorded environment's '{}' is not a text\n{}", trace, name, edited));
      }
      run.env.emplace_back(name, value.get<std::string>());
    }
  }
  if (j.contains("world_size") && j["world_size"].is_number_integer() && j["world_size"].get<std::int64_t>() > 1) {
    throw Error(fmt::format("'{}' is one rank of a torch.distributed run; fix starts no ranks\nhint: apply the "
                            "report's remedies with `ampscope record`'s options on every rank yourself",
                            trace));
  }
  return run;
}

// The rule above, checked on the recorded command: throws naming the word that breaks it.
void check_torch_command(TorchRun& run, const std::string& trace) {
  const std::string shown = fmt::format("{}", fmt::join(run.command, " "));
  const std::string hint = "hint: a recorded command is code from a file: check the trace; to run something else, run "
                           "it yourself under `ampscope record` with the remedy's options";
  struct stat st {};
  if (::stat(run.cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw Error(fmt::format("'{}': the recorded command ran in '{}', which {}; fix runs it only in the folder it was "
                            "recorded in\nhint: record the run again where it runs now",
                            trace, run.cwd, ::stat(run.cwd.c_str(), &st) != 0 ? "does not exist" : "is not a folder"));
  }
  const fs::path exe(run.command[0]);
  if (!is_python_name(exe.filename().string())) {
    throw Error(fmt::format("'{}': the recorded command ({}) runs '{}', which is not a Python interpreter; fix re-runs "
                            "only python, python3 or python3.N (the recorder works only inside Python), never through "
                            "a shell\n{}",
                            trace, shown, run.command[0], hint));
  }
  if (run.command[0].find('/') != std::string::npos) {
    const fs::path p = exe.is_absolute() ? exe : fs::path(run.cwd) / exe;
    if (!is_executable_file(p)) {
      throw Error(fmt::format("'{}': the recorded interpreter '{}' is not an executable file here\nhint: record the "
                              "run again with the interpreter it trains with",
                              trace, p.string()));
    }
    run.interpreter = p.lexically_normal().string();
  } else {
    const char* path = std::getenv("PATH");
    std::string dirs = path != nullptr ? path : "";
    for (std::size_t start = 0; start <= dirs.size();) {
      const std::size_t colon = std::min(dirs.find(':', start), dirs.size());
      const std::string dir = dirs.substr(start, colon - start);
      start = colon + 1;
      if (dir.empty()) continue;
      if (is_executable_file(fs::path(dir) / exe)) {
        run.interpreter = (fs::path(dir) / exe).string();
        break;
      }
    }
    if (run.interpreter.empty()) {
      throw Error(fmt::format("'{}': the recorded interpreter '{}' is not on PATH\nhint: put it on PATH, or record "
                              "the run again with its full path",
                              trace, run.command[0]));
    }
  }
  // Interpreter options: those that change nothing of what runs (unbuffered, no .pyc, isolation, warnings).
  static const std::set<std::string> kHarmless = {"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-q", "-b", "-bb"};
  for (std::size_t i = 1; i < run.command.size(); ++i) {
    const std::string& a = run.command[i];
    if (a == "-W" || a == "-X") {
      ++i;
      continue;
    }
    if (kHarmless.count(a) > 0) continue;
    if (a == "-m") {
      if (i + 1 >= run.command.size() || run.command[i + 1].find_first_not_of(
                                             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") !=
                                             std::string::npos) {
        throw Error(fmt::format("'{}': the recorded command ({}) has -m without a module name\n{}", trace, shown, hint));
      }
      // Only a module of the recorded folder's own (python -m looks there first): `-m pip install ...` from a
      // trace installs, it does not train.
      run.module = run.command[i + 1];
      std::string rel = run.module;
      std::replace(rel.begin(), rel.end(), '.', '/');
      const fs::path base = fs::path(run.cwd) / rel;
      const fs::path file = fs::path(base.string() + ".py"), main = base / "__main__.py";
      struct stat fst {};
      const bool found = (::stat(file.c_str(), &fst) == 0 && S_ISREG(fst.st_mode)) ||
                         (::stat(main.c_str(), &fst) == 0 && S_ISREG(fst.st_mode));
      if (!found) {
        throw Error(fmt::format("'{}': the recorded command ({}) runs the module '{}', which is not a file of the "
                                "recorded folder ('{}' or '{}'); fix runs only a script file or a module of the "
                                "folder the run was recorded in\n{}",
                                trace, shown, run.module, file.string(), main.string(), hint));
      }
      run.script = (::stat(file.c_str(), &fst) == 0 ? file : main).lexically_normal().string();
      return;
    }
    if (a.starts_with("-c") || a == "-") {
      throw Error(fmt::format("'{}': the recorded command ({}) runs code given {} ('{}'), not a script file: fix runs "
                              "only a script file or a module (-m) the command names\n{}",
                              trace, shown, a == "-" ? "on its standard input" : "on its command line", a, hint));
    }
    if (a.starts_with("-")) {
      throw Error(fmt::format("'{}': the recorded command ({}) gives the interpreter the option '{}', which fix does "
                              "not pass on (it passes only {} -W, -X and -m)\n{}",
                              trace, shown, a, fmt::join(kHarmless, " "), hint));
    }
    const fs::path script = fs::path(a).is_absolute() ? fs::path(a) : fs::path(run.cwd) / a;
    if (::stat(script.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw Error(fmt::format("'{}': the recorded script '{}' is not a file (looked for '{}')\nhint: record the run "
                              "again where the script is",
                              trace, a, script.string()));
    }
    run.script = script.lexically_normal().string();
    return;
  }
  throw Error(fmt::format("'{}': the recorded command ({}) names no script\n{}", trace, shown, hint));
}

// ---- The plan ------------------------------------------------------------------------------------------

struct FixPlan {
  std::string trace;
  fs::path folder;  // the trace's folder ("" for the working folder)
  RecordedRun recorded;
  analysis::Diagnosis first;
  FindingPlace named;          // an FP8 or block finding's place (kind "" for an anomaly)
  TrainConfig base;            // what every re-run replays (then each changes its remedy)
  std::int64_t step_rows = 0;  // rows of the trace's /steps
  std::int64_t held = 0;       // steps the trace can account for: its rows times sample_every
  ResumePoint from;
  std::vector<Input> inputs;
  std::vector<NotReplayed> skipped;
  std::vector<Candidate> cands;
  std::string results;  // the results file
  std::optional<TorchRun> torch;    // a run `ampscope record` recorded: its command is what the re-runs run
  std::vector<std::string> advice;  // remedies that cannot be applied from outside the script
  // Why the f32 reference is not run ("" when it is): a recorded run whose gradients are all f16/bf16 (parameters
  // stored low), which "autocast off" would not make f32 (no_autocast_reason).
  std::string reference_skipped;
};

std::int64_t saturating_product(std::int64_t a, std::int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > std::numeric_limits<std::int64_t>::max() / b ? std::numeric_limits<std::int64_t>::max() : a * b;
}

// How many steps each re-run takes: through the first anomaly's step and `after` more, never past the
// recorded run, and never past what the trace holds: step numbers a trace's author shifted to 10^12 start
// no 10^12-step run.
std::int64_t steps_to_rerun(const FixPlan& plan, std::int64_t after) {
  const std::int64_t step = plan.first.step;
  const std::int64_t k = plan.base.sample_every;
  if (step < 0 || step >= plan.held) {
    throw Error(fmt::format("'{}': its {} is at step {}, but the trace holds {} step row(s){}, so at most "
                            "{} steps of a run; fix re-runs from step 0 and will not start a run longer than the trace "
                            "shows (its step numbers were shifted, or the run was resumed from a checkpoint)\nhint: "
                            "re-run it yourself with `ampscope train`",
                            plan.trace, first_what(plan.first), step, plan.step_rows,
                            k > 1 ? fmt::format(" at --sample-every {}", k) : "", plan.held));
  }
  const std::int64_t through = step + 1 > std::numeric_limits<std::int64_t>::max() - after
                                   ? std::numeric_limits<std::int64_t>::max()
                                   : step + 1 + after;
  return std::min({plan.base.steps, through, plan.held});
}

// The plan for a run `ampscope record` recorded: its command, checked (check_torch_command), re-run until the
// first anomaly's step plus `after`, once per remedy the recorder can apply.
std::vector<Candidate> torch_candidates(const analysis::Report& report, const TorchRun& run, const std::string& trace,
                                        std::vector<std::string>& advice, std::string& reference_skipped);

std::optional<FixPlan> make_torch_plan(const FixRequest& request, trace::TraceReader& reader,
                                       const nlohmann::json& config) {
  FixPlan plan;
  plan.trace = request.trace;
  for (const auto& [option, value] : {std::pair<const char*, const std::string&>{"--data", request.data},
                                     {"--text", request.text}, {"--model", request.model},
                                     {"--tokens", request.tokens}}) {
    if (!value.empty()) {
      throw Error(fmt::format("{}: '{}' is a recorded PyTorch run, whose script reads its own inputs; {} names an input "
                              "of an `ampscope train` run\nhint: leave {} out",
                              option, request.trace, option, option));
    }
  }
  TorchRun run = read_torch_run(config, request.trace);
  check_torch_command(run, request.trace);
  const analysis::Report report = analysis::analyse(reader);
  plan.step_rows = reader.row_counts().steps;
  if (report.anomalies.empty()) return std::nullopt;
  plan.first = report.anomalies.front();
  if (plan.first.step < 0) throw Error(fmt::format("'{}': its first anomaly has no step", request.trace));
  const std::vector<trace::StepRow> steps = reader.steps();
  if (!steps.empty()) run.lr = steps.front().lr;
  run.stop_after = plan.first.step > std::numeric_limits<std::int64_t>::max() - request.after
                       ? std::numeric_limits<std::int64_t>::max() - 1
                       : plan.first.step + request.after;
  plan.folder = fs::path(request.trace).parent_path();
  plan.base.steps = run.stop_after + 1;  // the table's "re-ran steps 0..N"
  plan.cands = torch_candidates(report, run, request.trace, plan.advice, plan.reference_skipped);
  plan.torch = std::move(run);
  plan.results = request.output.empty() ? fix_results_path(request.trace) : request.output;
  for (const Candidate& c : plan.cands) refuse_unsafe_output(c.trace, "the re-run's trace");
  refuse_unsafe_output(plan.results, "the results file");
  return plan;
}

// Everything fix will do, decided and checked before the first re-run: any refusal costs nothing.
// nullopt: the report finds no anomaly.
std::optional<FixPlan> make_plan(const FixRequest& request) {
  FixPlan plan;
  plan.trace = request.trace;
  if (const std::string reason = hdf5::unreadable_reason(request.trace.c_str()); !reason.empty()) {
    throw Error(fmt::format("cannot read '{}': {}\nhint: ampscope fix reads the HDF5 traces `ampscope train --out "
                            "FILE` writes",
                            request.trace, reason));
  }
  analysis::Report report;
  {
    trace::TraceReader reader(request.trace);
    const nlohmann::json config = nlohmann::json::parse(reader.run_info().config, nullptr, false);
    if (config.is_object() && config.value("recorder", nlohmann::json()) == "ampscope.torch") {
      return make_torch_plan(request, reader, config);
    }
    plan.recorded = read_recorded(reader.run_info().config, request.trace);
    check_recorded_values(plan.recorded, request.trace);
    report = analysis::analyse(reader);
    plan.step_rows = reader.row_counts().steps;
  }
  if (!request.finding.empty() && (!report.anomalies.empty() || report.fp8.findings.empty())) {
    throw Error(fmt::format("--finding {}: '{}' {}; --finding chooses among an FP8 run's findings\nhint: leave "
                            "--finding out",
                            request.finding, request.trace,
                            report.anomalies.empty() ? "has no FP8 finding" : "has a NaN/Inf anomaly, which fix fixes first"));
  }
  if (!report.anomalies.empty()) {
    plan.first = report.anomalies.front();
  } else if (!report.fp8.findings.empty()) {
    // No NaN/Inf anomaly, but FP8 findings (calibration): fix proves the remedies of the first one's kind, or of
    // the first finding of --finding's kind.
    const analysis::Fp8Finding* chosen = &report.fp8.findings.front();
    if (!request.finding.empty()) {
      chosen = nullptr;
      std::string kinds;
      for (const analysis::Fp8Finding& f : report.fp8.findings) {
        if (chosen == nullptr && f.kind == request.finding) chosen = &f;
        if (kinds.find(f.kind) == std::string::npos) kinds += (kinds.empty() ? "" : ", ") + f.kind;
      }
      if (chosen == nullptr)
        throw Error(fmt::format("--finding {}: the report of '{}' has no FP8 finding of that kind; it has: {}\nhint: "
                                "name one of those, or leave --finding out to fix the first",
                                request.finding, request.trace, kinds));
    }
    const analysis::Fp8Finding& f = *chosen;
    plan.first.cause = std::string(kFp8Cause) + f.kind;
    plan.first.step = f.first_step;
    plan.first.module = f.module;
    plan.first.op = f.operand;
    plan.named = place_of(f);
  } else {
    return std::nullopt;
  }
  plan.folder = fs::path(request.trace).parent_path();
  const fs::path root = fs::canonical(plan.folder.empty() ? fs::path(".") : plan.folder);
  plan.base = plan.recorded.config;
  plan.held = saturating_product(plan.step_rows, plan.base.sample_every);
  plan.base.steps = steps_to_rerun(plan, request.after);
  plan.inputs = resolve_inputs(plan.base, request, plan.folder, root);
  plan.skipped = not_replayed(plan.recorded);
  // The re-runs start at step 0, or from the last kept checkpoint at or before the first anomaly's step
  // (--keep-checkpoints: "ck.step-N.h5" holds the state before step N) when the run kept them.
  plan.from = resume_point(plan.base, plan.first.step, plan.folder, root);
  plan.base.resume.clear();
  plan.base.checkpoint.clear();
  plan.base.checkpoint_every = 0;
  plan.base.keep_checkpoints = false;
  plan.cands = candidates_of(plan.base, report, request.trace, plan.first.cause);
  for (Candidate& c : plan.cands) {
    c.config.out = c.trace;  // for train's checks; each run writes in the private folder (run_candidates)
    validate_config(c.config);
  }
  plan.results = request.output.empty() ? fix_results_path(request.trace) : request.output;
  // Every output name, before anything runs: a link planted under one is refused now, not after the runs.
  for (const Candidate& c : plan.cands) refuse_unsafe_output(c.trace, "the re-run's trace");
  refuse_unsafe_output(plan.results, "the results file");
  return plan;
}

// The recorded options the re-runs replay, as `ampscope train` spells them (those that differ from the
// defaults; paths as the re-runs open them).
std::string replayed_options(const TrainConfig& base) {
  std::string text;
  for (const RunOption& row : run_options()) {
    if (row.recorded == Recorded::never || row.is_default(base)) continue;
    const std::string option =
        row.user_option ? option_text(row, base) : fmt::format("({} {})", row.json_key, option_value_text(row.get(base)));
    if (!option.empty()) text += (text.empty() ? "" : " ") + option;
  }
  return text;
}

void print_plan(const FixPlan& plan, std::ostream& err) {
  const analysis::Diagnosis& first = plan.first;
  if (!plan.named.kind.empty())
    err << fmt::format("fix: plan for {}: {} {} at step {} ({}): a re-run's finding of this kind counts as this one "
                       "only there\n",
                       plan.trace, first_what(first), first.cause, first.step, place_text(plan.named));
  else
    err << fmt::format("fix: plan for {}: {} {} at step {} ({}{})\n", plan.trace, first_what(first), first.cause,
                       first.step, first.op.empty() ? "-" : first.op, first.module.empty() ? "" : " in " + first.module);
  err << fmt::format("fix:   each re-run: steps 0..{} ({} of the recorded {}; the trace holds {} step rows){}\n",
                     plan.base.steps - 1, plan.base.steps, plan.recorded.config.steps, plan.step_rows,
                     plan.from.step > 0 ? fmt::format(", in {} from the kept checkpoint at step {}",
                                                      precision_name(plan.base.precision), plan.from.step)
                                        : "");
  err << fmt::format("fix:   replays: ampscope train {}\n", replayed_options(plan.base));
  for (const NotReplayed& n : plan.skipped) {
    err << fmt::format("fix:   not replayed: {}{}: {}\n", n.option, n.value.empty() ? "" : " " + n.value, n.why);
  }
  std::string runs;
  for (const Candidate& c : plan.cands) runs += fmt::format("{}{}{}", runs.empty() ? "" : ", ", c.name, c.flag.empty() ? "" : " (" + c.flag + ")");
  err << fmt::format("fix:   re-runs ({}): {}\n", plan.cands.size(), runs);
  err << fmt::format("fix:   reads: {} (the trace)\n", plan.trace);
  for (const Input& in : plan.inputs) {
    err << fmt::format("fix:   reads: {} ({}, {})\n", in.path, in.option,
                       in.user_named ? "named on the command line" : "recorded, under the trace's folder");
  }
  if (plan.from.step > 0) err << fmt::format("fix:   reads: {} (the kept checkpoint)\n", plan.from.path);
  for (const Candidate& c : plan.cands) err << fmt::format("fix:   writes: {}\n", c.trace);
  err << fmt::format("fix:   writes: {} (the results)\n", plan.results);
}

// ---- Running -------------------------------------------------------------------------------------------

struct Outcome {
  bool ran = false;
  std::string error;          // a re-run that failed
  bool applied = true;        // the re-run's recorded config shows the change (a scenario may force it back)
  bool gone = false;
  std::string first;          // "step 3, softmax in blocks.0.attn" or "none"
  // An FP8 or block finding: the re-run's first finding of the kind elsewhere than where the original was named
  // ("step 2, fc2 input columnwise (nvfp4)"), "" when none; it does not count as the original remaining.
  std::string elsewhere;
  double final_loss = NAN;
  std::vector<double> losses;  // every recorded step's loss, in step order (the bf16 reference's sets the tolerance)
  double seconds_per_step = NAN;
  std::string trace;
  std::int64_t steps = 0;
};

// Whether the re-run in `reader` still has an anomaly of `cause`: o.gone, and o.first, its first one
// ("step 3, softmax in blocks.0.attn") or "none". Shared by the re-runs of train and of recorded scripts.
// An FP8 or block finding (`named`, from the original's report) is judged where it was named (fix_judging.h
// judge_findings): o.first is the one there ("step 4, input in fc1"), o.elsewhere the first of the kind elsewhere.
void judge_rerun(trace::TraceReader& reader, const std::string& cause, const FindingPlace& named, Outcome& o) {
  const analysis::Report rep = analysis::analyse(reader);
  o.first = "none";
  o.gone = true;
  if (cause.starts_with(kFp8Cause)) {
    if (named.kind.empty()) {
      // No place named (a plan that did not come from a finding): any finding of the kind is the original's.
      const std::string kind = cause.substr(kFp8Cause.size());
      for (const analysis::Fp8Finding& f : rep.fp8.findings) {
        if (f.kind != kind) continue;
        o.gone = false;
        o.first = fmt::format("step {}, {} in {}", f.first_step, f.operand, f.module);
        break;
      }
      return;
    }
    const FindingVerdict v = judge_findings(rep.fp8.findings, named);
    o.gone = v.gone;
    o.first = v.first;
    o.elsewhere = v.elsewhere;
    return;
  }
  for (const analysis::Diagnosis& d : rep.anomalies) {
    if (d.cause != cause) continue;
    o.gone = false;
    o.first = fmt::format("step {}, {}{}", d.step, d.op.empty() ? d.cause : d.op, d.module.empty() ? "" : " in " + d.module);
    break;
  }
}

// Runs one candidate, writing its trace in `staging` (a folder of this process's own, where no name can
// have been planted) and moving it beside the original when complete; counts the re-run's anomalies of the
// original's kind (Diagnosis::cause).
Outcome measure(const Candidate& cand, const std::string& cause, const FindingPlace& named, const PrivateFolder& staging,
                std::ostream& err) {
  Outcome o;
  o.trace = cand.trace;
  TrainConfig config = cand.config;
  config.out = (staging.path() / fs::path(cand.trace).filename()).string();
  const auto t0 = std::chrono::steady_clock::now();
  TrainResult r;
  try {
    r = train(config);
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
  {
    trace::TraceReader reader(config.out);
    for (const trace::StepRow& row : reader.steps()) o.losses.push_back(row.loss);
    const TrainConfig ran = read_recorded(reader.run_info().config, config.out).config;
    if (cand.kind == "enable_scaler") o.applied = ran.use_scaler;
    if (cand.kind == "zero_grad") o.applied = ran.zero_grad;
    if (cand.kind == "fp8_format") o.applied = ran.fp8_format == cand.config.fp8_format;
    if (cand.kind == "fp8_recipe") o.applied = ran.fp8_recipe == cand.config.fp8_recipe;
    if (cand.kind == "fp8_margin") o.applied = ran.fp8_margin == cand.config.fp8_margin;
    if (cand.kind == "fp8_amax_algo") o.applied = ran.fp8_amax_algo == cand.config.fp8_amax_algo;
    if (cand.kind == "fp8_amax_history") o.applied = ran.fp8_amax_history == cand.config.fp8_amax_history;
    if (cand.kind == "fp8_keep_bf16") o.applied = ran.fp8_keep_bf16 == cand.config.fp8_keep_bf16;
    if (cand.kind == "mx_scale") o.applied = ran.mx_scale == cand.config.mx_scale;
    if (cand.kind == "nvfp4_rht") o.applied = ran.nvfp4_rht == cand.config.nvfp4_rht;
    if (cand.kind == "precision") o.applied = ran.precision == cand.config.precision;
    judge_rerun(reader, cause, named, o);
  }
  publish_output_file(config.out, cand.trace, "the re-run's trace");
  if (!o.applied) o.gone = false;
  const char* what = cause.starts_with(kFp8Cause) ? "finding" : "anomaly";
  // Where the finding was named, and the same kind elsewhere when the re-run has it there.
  const std::string at = named.kind.empty() ? "" : " at " + place_text(named);
  const std::string also = o.elsewhere.empty() ? "" : fmt::format("; the same kind now at {}", o.elsewhere);
  err << fmt::format("fix: {}: {} steps in {:.1f}s: {}\n", cand.name, r.steps, secs,
                     !o.applied ? "not applied" : fmt::format("{} {}{}{}", what, o.gone ? "gone" : "remains", at, also));
  return o;
}

// The module a cast_f32 remedy names ("sigmoid in criterion ran outside autocast ..."): the op of the
// diagnosis (its origin or a link of its root-cause chain) whose place the remedy's text starts with.
std::string module_of_cast(const analysis::Remedy& m, const analysis::Diagnosis& d) {
  std::vector<std::pair<std::string, std::string>> places = {{d.op, d.module}};
  for (const analysis::ChainLink& l : d.chain) places.emplace_back(l.op, l.module);
  for (const auto& [op, module] : places) {
    if (!module.empty() && !op.empty() && m.text.starts_with(op + " in " + module + " ")) return module;
  }
  return "";
}

// Why the f32 reference (every autocast region disabled) of a recorded run would not be an f32 run, or "": every
// recorded gradient is f16/bf16, so the parameters are stored in f16/bf16 (no f32 master weights; under autocast
// they stay f32), and their ops run in f16/bf16 with autocast on or off: without an autocast region the re-run is
// the run again. A trace without gradient rows says nothing here: the reference runs, and its re-run's trace says
// afterwards whether it disabled any autocast region (measure_torch: "not applied" when none).
std::string no_autocast_reason(const analysis::Report& report) {
  if (report.grad_dtypes.empty()) return "";
  for (const std::string& d : report.grad_dtypes)
    if (d != "f16" && d != "bf16") return "";
  return fmt::format("every recorded gradient is {} (the parameters are stored in f16/bf16, without f32 master "
                     "weights): with autocast off its ops still run in f16/bf16, so that re-run would not be an f32 "
                     "reference (without an autocast region, it would be the run again)",
                     fmt::join(report.grad_dtypes, "/"));
}

// The original, the f32 reference (autocast off; skipped, with the reason in reference_skipped, for a run with no
// autocast region) and one re-run per remedy `ampscope record` can apply from outside the script; the others go
// to `advice`.
std::vector<Candidate> torch_candidates(const analysis::Report& report, const TorchRun& run, const std::string& trace,
                                        std::vector<std::string>& advice, std::string& reference_skipped) {
  std::vector<Candidate> cands;
  std::set<std::string> seen, files;
  auto add = [&](Candidate c) {
    if (!seen.insert(c.name).second) return;
    c.record.stop_after = run.stop_after;
    c.flag = fmt::format("{}", fmt::join(remedy_arguments(c.record), " "));
    c.trace = fix_trace_path(trace, c.name);
    for (int n = 2; !files.insert(c.trace).second; ++n) c.trace = fix_trace_path(trace, fmt::format("{}-{}", c.name, n));
    cands.push_back(std::move(c));
  };
  add({"original", "original", "", "the run as recorded (the baseline: step time, the anomaly again)", {}});
  reference_skipped = no_autocast_reason(report);
  if (reference_skipped.empty()) {
    Candidate ref{"fp32", "fp32", "", "the f32 reference: every autocast region disabled", {}};
    ref.record.autocast = "off";
    ref.reference = true;  // not a remedy: never counted as verified
    add(std::move(ref));
  }
  for (const analysis::Diagnosis& d : report.anomalies) {
    for (const analysis::Remedy& m : d.remedies) {
      Candidate c{"", m.kind, "", m.text, {}};
      c.remedy_flag = m.flag;
      if (m.kind == "autocast_fp32" && !m.pattern.empty() && !m.pattern_is_op) {
        c.record.autocast_fp32 = {m.pattern};
        c.name = "autocast-fp32-" + m.pattern;
      } else if (const std::string module = m.kind == "cast_f32" ? module_of_cast(m, d) : "";
                 m.kind == "cast_f32" && !module.empty()) {
        // Its input cast to f32 by hand, applied to the op's module: autocast off and f32 inputs inside it.
        c.record.autocast_fp32 = {module};
        c.name = "autocast-fp32-" + module;
        c.remedy_text = m.text;
      } else if (m.kind == "bf16") {
        c.record.autocast = "bf16";
        c.name = "bf16";
      } else if (m.kind == "learning_rate" && m.value > 0 && std::isfinite(m.value) && run.lr > 0 &&
                 std::isfinite(run.lr)) {
        c.record.lr_factor = m.value / run.lr;
        c.name = fmt::format("lr-{}", m.value);
      } else if (m.kind == "init_scale" && m.value > 0 && std::isfinite(m.value)) {
        c.record.init_scale = m.value;
        c.name = fmt::format("init-scale-{}", m.value);
      } else {
        const std::string line = fmt::format("{}: {}", m.kind, m.text);
        if (std::find(advice.begin(), advice.end(), line) == advice.end()) advice.push_back(line);
        continue;
      }
      add(std::move(c));
    }
  }
  return cands;
}

// A word as a POSIX shell reads it back: bare when it holds only safe characters, else in single quotes.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,+-@%") ==
                        std::string::npos) {
    return w;
  }
  std::string out = "'";
  for (char ch : w) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string program_path() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("ampscope") : exe.string();
}

// The exact command line of a re-run, as a user would type it to run it by hand.
std::string torch_command_line(const TorchRun& run, const Candidate& c) {
  std::vector<std::string> words;
  for (const auto& [name, value] : run.env) words.push_back(name + "=" + value);
  words.push_back(program_path());
  words.insert(words.end(), {"record", "--out", fs::absolute(c.trace).lexically_normal().string()});
  for (const std::string& a : remedy_arguments(c.record)) words.push_back(a);
  words.push_back("--");
  words.insert(words.end(), run.command.begin(), run.command.end());
  std::string line = "cd " + shell_word(run.cwd) + " &&";
  for (const std::string& w : words) line += " " + shell_word(w);
  return line;
}

void print_torch_plan(const FixPlan& plan, std::ostream& err) {
  const analysis::Diagnosis& first = plan.first;
  const TorchRun& run = *plan.torch;
  err << fmt::format("fix: plan for {}: first anomaly {} at step {} ({}{})\n", plan.trace, first.cause, first.step,
                     first.op.empty() ? "-" : first.op, first.module.empty() ? "" : " in " + first.module);
  err << fmt::format("fix:   recorded command: {}\n", fmt::join(run.command, " "));
  err << fmt::format("fix:   recorded folder: {}\n", run.cwd);
  err << fmt::format("fix:   interpreter: {}; {}: {}\n", run.interpreter, run.module.empty() ? "script" : "module",
                     run.module.empty() ? run.script : run.module);
  std::string env;
  for (const auto& [name, value] : run.env) env += fmt::format("{}{}={}", env.empty() ? "" : " ", name, value);
  err << fmt::format("fix:   recorded environment: {}\n", env.empty() ? "(none kept)" : env);
  err << fmt::format("fix:   each re-run: the script, ended after step {} (the first anomaly's step + --after)\n",
                     run.stop_after);
  err << fmt::format("fix:   re-runs ({}), each exactly this command (no shell):\n", plan.cands.size());
  for (const Candidate& c : plan.cands) err << fmt::format("fix:     {}: {}\n", c.name, torch_command_line(run, c));
  if (!plan.reference_skipped.empty())
    err << fmt::format("fix:   not run: the fp32 reference (--autocast off): {}\n", plan.reference_skipped);
  for (const std::string& a : plan.advice) err << fmt::format("fix:   not verifiable from outside the script: {}\n", a);
  err << fmt::format("fix:   reads: {} (the trace)\n", plan.trace);
  for (const Candidate& c : plan.cands) err << fmt::format("fix:   writes: {}\n", c.trace);
  err << fmt::format("fix:   writes: {} (the results)\n", plan.results);
}

// Runs one re-run of a recorded PyTorch run under `ampscope record` (its trace written in `staging`, then
// moved beside the original), and judges it as measure() judges a train re-run.
Outcome measure_torch(const Candidate& cand, const std::string& cause, const TorchRun& run,
                      const PrivateFolder& staging, std::ostream& err) {
  Outcome o;
  o.trace = cand.trace;
  RecordRequest r = cand.record;
  r.out = (staging.path() / fs::path(cand.trace).filename()).string();
  r.command = run.command;
  r.cwd = run.cwd;
  r.env = run.env;
  r.stdout_to_stderr = true;  // fix's stdout is its table or JSON
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  try {
    r.python_dir = find_python_dir("");
    status = run_record(r, err);
  } catch (const std::exception& e) {
    o.error = e.what();
    err << fmt::format("fix: {}: failed: {}\n", cand.name, o.error);
    return o;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!hdf5::unreadable_reason(r.out.c_str()).empty()) {
    o.error = fmt::format("the script exited with status {} before it finished a step: no trace", status);
    err << fmt::format("fix: {}: failed: {}\n", cand.name, o.error);
    return o;
  }
  o.ran = true;
  {
    trace::TraceReader reader(r.out);
    const std::vector<trace::StepRow> steps = reader.steps();
    o.steps = static_cast<std::int64_t>(steps.size());
    if (!steps.empty()) o.final_loss = steps.back().loss;
    for (const trace::StepRow& row : steps) o.losses.push_back(row.loss);
    o.seconds_per_step = o.steps > 0 ? secs / static_cast<double>(o.steps) : NAN;
    // What the recorder applied (the trace's config "remedies"): a remedy that acted on nothing (a glob that
    // matched no module, no GradScaler to set) is "not applied", not "did not help".
    const nlohmann::json config = nlohmann::json::parse(reader.run_info().config, nullptr, false);
    auto applied = [&](const std::string& prefix) {
      if (!config.is_object() || !config.contains("remedies") || !config["remedies"].is_object()) return false;
      const nlohmann::json& a = config["remedies"].value("applied", nlohmann::json::object());
      if (!a.is_object()) return false;
      for (const auto& [key, n] : a.items()) {
        if (key.starts_with(prefix) && n.is_number_integer() && n.get<std::int64_t>() > 0) return true;
      }
      return false;
    };
    if (!cand.record.autocast_fp32.empty()) o.applied = applied("autocast_fp32:");
    if (cand.record.autocast == "bf16") o.applied = applied("autocast_bf16");
    // The f32 reference disabled no autocast region: the script ran none (a model stored in f16/bf16), so the
    // re-run was the run again, not an f32 run.
    if (cand.record.autocast == "off") o.applied = applied("autocast_off");
    if (!std::isnan(cand.record.lr_factor)) o.applied = applied("lr_factor");
    if (!std::isnan(cand.record.init_scale)) o.applied = applied("init_scale");
    judge_rerun(reader, cause, FindingPlace{}, o);
  }
  publish_output_file(r.out, cand.trace, "the re-run's trace");
  if (!o.applied) o.gone = false;
  err << fmt::format("fix: {}: {} steps in {:.1f}s (the script's status {}): {}\n", cand.name, o.steps, secs, status,
                     !o.applied ? "not applied" : (o.gone ? "anomaly gone" : "anomaly remains"));
  return o;
}

// Runs every candidate. From a kept checkpoint: the runs in the recorded precision resume from it (a
// checkpoint's scaler state belongs to its precision: runs in another precision start at step 0). When the
// original does not fail again from the checkpoint (what caused it is not in a checkpoint: gradients left
// from earlier steps, say), every run starts at step 0 after all. Returns whether it fell back so.
bool run_candidates(FixPlan& plan, std::vector<Outcome>& outcomes, std::ostream& err) {
  const PrivateFolder staging(plan.folder, fs::path(plan.trace).stem().string() + ".fix");
  std::vector<Candidate>& cands = plan.cands;
  for (Candidate& c : cands) {
    if (plan.from.step <= 0 || c.config.precision != plan.base.precision) continue;
    c.config.resume = plan.from.path;
    c.config.steps = plan.base.steps - plan.from.step;
    c.from_step = plan.from.step;
  }
  auto from_step_0 = [&](Candidate& c) {
    c.config.resume.clear();
    c.config.steps = plan.base.steps;
    c.from_step = 0;
  };
  bool fell_back = false;
  const std::string& cause = plan.first.cause;
  for (std::size_t i = 0; i < cands.size(); ++i) {
    if (plan.torch) {
      outcomes.push_back(measure_torch(cands[i], cause, *plan.torch, staging, err));
      continue;
    }
    outcomes.push_back(measure(cands[i], cause, plan.named, staging, err));
    if (cands[i].from_step == 0) continue;
    if (i == 0 && outcomes[0].ran && outcomes[0].gone) {
      err << fmt::format("fix: the original did not fail again from checkpoint '{}' (step {}): what caused the "
                         "anomaly is not in a checkpoint; re-running every candidate from step 0\n",
                         plan.from.path, plan.from.step);
      fell_back = true;
      for (Candidate& c : cands) from_step_0(c);
      outcomes.back() = measure(cands[0], cause, plan.named, staging, err);
    } else if (i > 0 && !(outcomes[i].ran && outcomes[i].gone)) {
      // A remedy that acts before the checkpoint (a learning rate whose damage was done in earlier steps)
      // cannot work from it: it gets its chance from step 0.
      err << fmt::format("fix: {}: the anomaly remains from the checkpoint at step {}; trying it from step 0\n",
                         cands[i].name, plan.from.step);
      from_step_0(cands[i]);
      cands[i].retried = true;
      outcomes.back() = measure(cands[i], cause, plan.named, staging, err);
    }
  }
  return fell_back;
}

// ---- Results -------------------------------------------------------------------------------------------

ordered_json results_document(const FixPlan& plan, const std::vector<Outcome>& outcomes, bool fell_back) {
  const analysis::Diagnosis& first = plan.first;
  const Outcome& orig = outcomes[0];
  // The f32 reference, when it ran (a recorded run without autocast has none: FixPlan::reference_skipped).
  static const Outcome kNotRun;
  const Outcome* fp32_run = &kNotRun;
  for (std::size_t i = 0; i < plan.cands.size(); ++i)
    if (plan.cands[i].kind == "fp32") fp32_run = &outcomes[i];
  const Outcome& fp32 = *fp32_run;
  // An FP8 finding is calibration, not an anomaly: its keys say "finding" (first_finding, finding_gone).
  const bool fp8 = first.cause.starts_with(kFp8Cause);
  const char* first_key = fp8 ? "first_finding" : "first_anomaly";
  const char* gone_key = fp8 ? "finding_gone" : "anomaly_gone";
  // The bf16 reference of an FP8 fix: fp8_error_dominates is judged by the final loss against it.
  const Outcome* bf16 = nullptr;
  for (std::size_t i = 0; i < plan.cands.size(); ++i)
    if (plan.cands[i].kind == "bf16_reference" && outcomes[i].ran) bf16 = &outcomes[i];
  const auto vs = [](const Outcome& o, const Outcome* ref) {
    return ref != nullptr && std::isfinite(o.final_loss) && std::isfinite(ref->final_loss) && ref->final_loss != 0
               ? (o.final_loss - ref->final_loss) / std::abs(ref->final_loss)
               : NAN;
  };
  const bool by_loss = first.cause == std::string(kFp8Cause) + "fp8_error_dominates" ||
                       first.cause == std::string(kFp8Cause) + "block_error_dominates";
  // The other block-scaled findings: gone from the re-run's /blocks rows, and its final loss within the tolerance
  // of the bf16 run's (docs/fp8.md, "Block-scaled diagnoses").
  const bool block_kind = first.cause.starts_with(kFp8Cause) &&
                          analysis::block_finding_kind(first.cause.substr(kFp8Cause.size()));
  ordered_json doc;
  doc["trace"] = plan.trace;
  doc["cause"] = first.cause;
  doc[first_key] = {{"step", first.step}, {"op", first.op}, {"module", first.module}};
  // Where an FP8 or block finding was named: a re-run's finding counts as it only there (runs[].same_kind_elsewhere).
  if (!plan.named.kind.empty()) {
    doc[first_key]["copy"] = plan.named.copy;
    doc[first_key]["format"] = plan.named.format;
    doc[first_key]["place"] = place_text(plan.named);
  }
  // Derived from the bf16 run's own last losses (analysis.h fp8_loss_tolerance); NaN (null) when they cannot say.
  const double tolerance = bf16 != nullptr ? analysis::fp8_loss_tolerance(bf16->losses) : NAN;
  if (by_loss || block_kind) doc["loss_tolerance_vs_bf16"] = std::isfinite(tolerance) ? ordered_json(tolerance) : ordered_json(nullptr);
  doc["steps_rerun"] = plan.base.steps;
  if (plan.from.step > 0) {
    doc["checkpoint"] = {{"path", plan.from.path}, {"step", plan.from.step}, {"used", !fell_back}};
  }
  const bool reproduced = orig.ran && !orig.gone;
  doc["reproduced"] = reproduced;
  ordered_json list = ordered_json::array();
  int verified = 0;
  for (std::size_t i = 0; i < plan.cands.size(); ++i) {
    const Candidate& c = plan.cands[i];
    const Outcome& o = outcomes[i];
    const bool is_remedy = i > 0 && !c.reference;
    const double rel_bf16 = vs(o, bf16);
    // fp8_error_dominates: gone when the re-run's final loss is within the tolerance of the bf16 run's
    // (docs/fp8.md); the original is judged on its finding (reproduced).
    const bool within = std::isfinite(rel_bf16) && tolerance < 1 && std::abs(rel_bf16) <= tolerance;
    const bool gone = by_loss && is_remedy   ? o.ran && o.applied && within
                      : block_kind && is_remedy ? o.ran && o.gone && within
                                                : o.ran && o.gone;
    const bool ok = is_remedy && gone && reproduced;
    verified += ok ? 1 : 0;
    ordered_json e;
    e["name"] = c.name;
    e["kind"] = c.kind;
    e["flag"] = c.flag;
    e["remedy_flag"] = c.remedy_flag;
    if (!c.remedy_text.empty()) e["remedy_text"] = c.remedy_text;
    e["trace"] = o.trace;
    e["from_step"] = c.from_step;
    if (c.retried) e["retried_from_step_0"] = true;
    e["ran"] = o.ran;
    if (!o.error.empty()) e["error"] = o.error;
    e["applied"] = o.applied;
    e[gone_key] = gone;
    e["verified"] = ok;
    e[first_key] = o.first;
    if (fp8) e["same_kind_elsewhere"] = o.elsewhere.empty() ? ordered_json(nullptr) : ordered_json(o.elsewhere);
    const double rel = std::isfinite(o.final_loss) && std::isfinite(fp32.final_loss) && fp32.final_loss != 0
                           ? (o.final_loss - fp32.final_loss) / std::abs(fp32.final_loss)
                           : NAN;
    e["final_loss"] = std::isfinite(o.final_loss) ? ordered_json(o.final_loss) : ordered_json(nullptr);
    e["final_loss_vs_fp32"] = std::isfinite(rel) ? ordered_json(rel) : ordered_json(nullptr);
    if (fp8) e["final_loss_vs_bf16"] = std::isfinite(rel_bf16) ? ordered_json(rel_bf16) : ordered_json(nullptr);
    const double t = o.seconds_per_step / orig.seconds_per_step;
    e["step_time_vs_original"] = std::isfinite(t) ? ordered_json(t) : ordered_json(nullptr);
    list.push_back(e);
  }
  doc["runs"] = list;
  doc["verified"] = verified;
  // What was replayed, what was not and why, and what was read.
  if (plan.torch) {
    doc["replayed"] = {{"command", plan.torch->command}, {"cwd", plan.torch->cwd}, {"stop_after", plan.torch->stop_after}};
    ordered_json env = ordered_json::object();
    for (const auto& [name, value] : plan.torch->env) env[name] = value;
    doc["replayed"]["env"] = env;
    doc["not_verifiable"] = plan.advice;
    if (!plan.reference_skipped.empty()) doc["fp32_reference_skipped"] = plan.reference_skipped;
  } else {
    doc["replayed"] = ordered_json::parse(run_config_json(plan.base));
  }
  ordered_json skipped = ordered_json::array();
  for (const NotReplayed& n : plan.skipped) skipped.push_back({{"option", n.option}, {"value", n.value}, {"why", n.why}});
  doc["not_replayed"] = skipped;
  ordered_json reads = ordered_json::array({plan.trace});
  if (plan.torch) reads.push_back(plan.torch->script);
  for (const Input& in : plan.inputs) reads.push_back(in.path);
  if (plan.from.step > 0) reads.push_back(plan.from.path);
  doc["reads"] = reads;
  return doc;
}

void print_table(const FixPlan& plan, const ordered_json& doc, bool fell_back, std::ostream& out) {
  const analysis::Diagnosis& first = plan.first;
  const bool fp8 = first.cause.starts_with(kFp8Cause);
  out << fmt::format("{}: {}: {} at step {} ({}{}); re-ran steps 0..{}{}\n", plan.trace, first_what(first),
                     first.cause, first.step, first.op.empty() ? "-" : first.op,
                     first.module.empty() ? "" : " in " + first.module, plan.base.steps - 1,
                     doc["reproduced"].get<bool>() ? "" : " (the re-run did NOT reproduce it)");
  if (doc.contains("loss_tolerance_vs_bf16")) {
    if (doc["loss_tolerance_vs_bf16"].is_number() && doc["loss_tolerance_vs_bf16"].get<double>() >= 1)
      out << fmt::format("gone: never by loss here: the bf16 run's loss noise over its last {} steps is {:.0f}% of "
                         "its final loss (2 sigma), so its final loss measures nothing (docs/fp8.md)\n",
                         analysis::kFp8LossNoiseSteps, 100 * doc["loss_tolerance_vs_bf16"].get<double>());
    else if (doc["loss_tolerance_vs_bf16"].is_number())
      out << fmt::format("gone: the final loss within {:.1f}% of the bf16 run's (2 sigma of the bf16 run's loss noise "
                         "over its last {} steps: docs/fp8.md)\n",
                         100 * doc["loss_tolerance_vs_bf16"].get<double>(), analysis::kFp8LossNoiseSteps);
    else
      out << "gone: never by loss here: the bf16 run has fewer than 3 finite losses to measure its noise from "
             "(docs/fp8.md)\n";
  }
  const char* first_key = fp8 ? "first_finding" : "first_anomaly";
  const char* gone_key = fp8 ? "finding_gone" : "anomaly_gone";
  if (plan.from.step > 0 && !fell_back) {
    out << fmt::format("runs in {} resumed from {} (the state before step {}); the others ran from step 0, and a "
                       "remedy that failed from the checkpoint was tried again from step 0\n",
                       precision_name(plan.base.precision), plan.from.path, plan.from.step);
  }
  out << fmt::format("{:<34} {:<8} {:<36} {:>10}{} {:>9}\n", "remedy", "gone",
                     fp8 ? "finding after it" : "first anomaly after it", "loss/fp32",
                     fp8 ? fmt::format(" {:>10}", "loss/bf16") : "", "time");
  for (const auto& e : doc["runs"]) {
    auto pct = [](const ordered_json& v) {
      return v.is_null() ? std::string("-") : fmt::format("{:+.1f}%", 100 * v.get<double>());
    };
    auto num = [](const ordered_json& v, const char* f) {
      return v.is_null() ? std::string("-") : fmt::format(fmt::runtime(f), v.get<double>());
    };
    const bool reference = e["kind"] == "original" || e["kind"] == "fp32" || e["kind"] == "bf16_reference";
    out << fmt::format("{:<34} {:<8} {:<36} {:>10}{} {:>9}\n", e["name"].get<std::string>(),
                       e["kind"] == "original" || (fp8 && reference) ? "-" : (e[gone_key].get<bool>() ? "yes" : "no"),
                       e[first_key].get<std::string>(), pct(e["final_loss_vs_fp32"]),
                       fp8 ? fmt::format(" {:>10}", pct(e["final_loss_vs_bf16"])) : "",
                       num(e["step_time_vs_original"], "{:.2f}x"));
  }
  for (const auto& e : doc["runs"]) {
    if (!e.contains("same_kind_elsewhere") || e["same_kind_elsewhere"].is_null()) continue;
    out << fmt::format("{}: the same kind now at {}, not where it was named ({}): not counted as the finding "
                       "remaining\n",
                       e["name"].get<std::string>(), e["same_kind_elsewhere"].get<std::string>(),
                       doc[first_key]["place"].get<std::string>());
  }
  for (const NotReplayed& n : plan.skipped) {
    out << fmt::format("not replayed: {}{}: {}\n", n.option, n.value.empty() ? "" : " " + n.value, n.why);
  }
  for (const std::string& a : plan.advice) out << fmt::format("not verifiable from outside the script: {}\n", a);
  const int verified = doc["verified"].get<int>();
  if (doc.contains("fp32_reference_skipped"))
    out << fmt::format("not run: the fp32 reference (--autocast off): {}\n", doc["fp32_reference_skipped"].get<std::string>());
  ordered_json fp32;
  for (const ordered_json& r : doc["runs"])
    if (r["kind"] == "fp32") fp32 = r;
  if (plan.torch && fp32.is_object() && fp32["ran"].get<bool>() && !fp32["applied"].get<bool>())
    out << "the fp32 reference (--autocast off) disabled no autocast region (the script enters none): it re-ran the "
           "run unchanged, not in f32\n";
  if (plan.torch && verified == 0 && fp32.is_object() && fp32["ran"].get<bool>() && fp32["applied"].get<bool>() &&
      !fp32["anomaly_gone"].get<bool>()) {
    out << "no remedy applied from outside the script removes the anomaly, and it remains in f32 (autocast off): not a "
           "precision problem; the remedy is in the script (above: not verifiable from outside the script)\n";
  }
  out << fmt::format("{} remed{} verified; results: {}\n", verified, verified == 1 ? "y" : "ies", plan.results);
}

// On a terminal, without --run: the question after the plan, and whether the answer read is "y" or "yes" (any
// case, surrounding blanks ignored). No stream, end of input or any other answer: no.
bool answered_yes(std::istream* in, std::size_t reruns, std::ostream& err) {
  if (in == nullptr) return false;
  err << fmt::format("fix: run the {} re-run{} above (the recorded command, from the trace)? [y/N] ", reruns,
                     reruns == 1 ? "" : "s");
  err.flush();
  std::string line;
  if (!std::getline(*in, line)) {
    err << "\n";
    return false;
  }
  const auto first = line.find_first_not_of(" \t\r");
  const auto last = line.find_last_not_of(" \t\r");
  std::string word = first == std::string::npos ? "" : line.substr(first, last - first + 1);
  for (char& ch : word) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return word == "y" || word == "yes";
}

}  // namespace

std::string fix_results_path(const std::string& trace) { return analysis::fix_results_path(trace); }

std::string fix_trace_path(const std::string& trace, const std::string& remedy_name) {
  const fs::path p(trace);
  return (p.parent_path() / (p.stem().string() + ".fix-" + safe_name(remedy_name) + ".h5")).string();
}

int run_fix(const FixRequest& request, std::ostream& out, std::ostream& err) {
  if (request.after < 0) {
    err << fmt::format("ampscope fix: --after {} is not allowed; expected an integer >= 0\n", request.after);
    return kExitUsage;
  }
  auto fail = [&](const std::exception& e) {
    err << "ampscope fix: error: " << without_hdf5_stack(e.what()) << "\n";
    return kExitUsage;
  };
  std::optional<FixPlan> plan;
  try {
    plan = make_plan(request);
  } catch (const std::exception& e) {
    return fail(e);
  }
  if (!plan) {
    out << fmt::format("{}: the report finds no anomaly: nothing to fix\n", request.trace);
    return kExitClean;
  }
  if (plan->torch) {
    print_torch_plan(*plan, err);
    if (!request.run && !answered_yes(request.answer, plan->cands.size(), err)) {
      err << "fix: nothing was run: the re-runs run the recorded command above, which came from the trace; check it "
             "and the folder, then run again with --run\n";
      return kExitPlanOnly;
    }
  } else {
    print_plan(*plan, err);
  }
  std::vector<Outcome> outcomes;
  ordered_json doc;
  bool fell_back = false;
  try {
    fell_back = run_candidates(*plan, outcomes, err);
    doc = results_document(*plan, outcomes, fell_back);
    write_output_file(plan->results, doc.dump(2) + "\n", "the results file");
  } catch (const std::exception& e) {
    return fail(e);
  }
  if (request.json) {
    out << doc.dump(2) << "\n";
  } else {
    print_table(*plan, doc, fell_back, out);
  }
  const auto ran = std::find_if(outcomes.begin(), outcomes.end(), [](const Outcome& o) { return o.ran; });
  if (ran == outcomes.end()) {
    err << fmt::format("ampscope fix: error: every re-run failed; the first: {}\n", outcomes.front().error);
    return kExitUsage;
  }
  return doc["verified"].get<int>() > 0 ? kExitClean : kExitFound;
}

FixCommand::FixCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "fix", "Re-run a run `ampscope train` or `ampscope record` recorded, once per remedy its report proposes (and "
             "in fp32, unless a recorded PyTorch run used no autocast region: then that re-run would be the run again), "
             "through the first anomaly and --after steps more; say which remedies remove the anomaly. The "
             "plan (re-runs, steps, every file read and written; for a recorded PyTorch run its command and each "
             "re-run's command line) is printed first. Exit 0: at least one verified (or nothing to fix), 1: none, "
             "2: errors (every re-run failed, a recorded value train refuses, a recorded command fix does not run, "
             "an input outside the trace's folder, an output name that is a link), 3: a recorded PyTorch run "
             "without --run (nothing ran; on a terminal fix asks first and runs on 'y')");
  cmd_->add_option("trace", request_.trace, "Trace written by `ampscope train` or `ampscope record`")->required();
  cmd_->add_option("--after", request_.after, "Steps re-run after the first anomaly's step")->capture_default_str();
  cmd_->add_flag("--run", request_.run, "Run a recorded PyTorch run's command (shown first; without --run fix shows "
                                       "the plan and exits 3, or on a terminal asks y/N)");
  cmd_->add_option("--finding", request_.finding,
                   "An FP8 run's finding kind to fix (stale_scale, saturation, e4m3_grad_underflow, "
                   "fp8_error_dominates) instead of its first");
  cmd_->add_flag("--json", request_.json, "Print the results document (run.fix.json) instead of the table");
  cmd_->add_option("--output,-o", request_.output, "Results file (default: <trace stem>.fix.json beside the trace)");
  // The trace's own paths are read only from under its folder; these name the inputs from anywhere.
  cmd_->add_option("--data", request_.data, "The MNIST folder the run read (instead of the one the trace records)");
  cmd_->add_option("--text", request_.text, "The text file the run read (instead of the one the trace records)");
  cmd_->add_option("--model", request_.model, "The model folder the run trained (instead of the one the trace records)");
  cmd_->add_option("--tokens", request_.tokens, "The token file the run read (instead of the one the trace records)");
}

bool FixCommand::parsed() const { return cmd_->parsed(); }

int FixCommand::run() {
  // A person at a terminal is asked before a recorded command runs; a script or a pipe gets the plan, exit 3.
  if (!request_.run && isatty(STDIN_FILENO) == 1 && isatty(STDERR_FILENO) == 1) request_.answer = &std::cin;
  return run_fix(request_, std::cout, std::cerr);
}

}  // namespace ampscope::samples
