// `ampscope train`: options (command line and TOML config file), progress on the terminal, Ctrl-C, the
// fp32-vs-low-precision comparison, and the end-of-run summary.
#include "cli/train_command.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/distributed/process_group.h"
#include "core/io/hdf5_support.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/analysis/fix.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"
#include "cli/report_command.h"
#include "cli/program.h"
#include "cli/run_options_io.h"

namespace ampscope::samples {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_sigint(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// "run.h5" -> "run-fp32.h5"
std::string with_suffix(const std::string& path, std::string_view suffix) {
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::string(suffix) + p.extension().string())).string();
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// Progress: rewritten in place on a terminal, a plain line now and then otherwise.
// How the user ran this program, for commands the summary suggests: "ampscope" when it was found on PATH,
// else the path it was run by ("build/bin/ampscope"), so the suggestion can be pasted as it is.
std::string program() {
  const std::string& invoked = program_path();
  return invoked.find('/') == std::string::npos ? "ampscope" : invoked;
}

std::string steps_text(std::int64_t n) { return fmt::format("{} step{}", n, n == 1 ? "" : "s"); }

// The progress of a run. Steps are counted from 0 as report and diff count them ("step 4, 5/50 done"); the
// scale shown is the one the step used (the summary's is the scale after the last update). On a terminal the
// line is rewritten in place; elsewhere (a log, mpirun) about 20 lines a run, the first skipped step, and at
// most one line a second besides: a run whose every step is skipped no longer writes one line a step.
class Progress {
 public:
  Progress(std::string label, bool terminal) : label_(std::move(label)), terminal_(terminal) {}

  void operator()(const StepReport& r) {
    const std::int64_t done = r.step + 1;
    if (first_ < 0) first_ = r.step;  // a resumed run starts counting at its first step
    const double rate = r.seconds > 0 ? static_cast<double>(done - first_) / r.seconds : 0;
    const double left = rate > 0 ? static_cast<double>(r.total - done) / rate : -1;
    const std::string line = fmt::format("{} step {} ({}/{} done)  loss {:.4g}  scale used {:g}  skipped {}  NaN/Inf "
                                         "origins {}  {:.1f} steps/s  {} left",
                                         label_, r.step, done, r.total, r.loss, r.scale, r.skipped_so_far,
                                         r.anomalies_so_far, rate, format_duration(left));
    if (terminal_) {
      fmt::print("\r{:<110}", line);
      if (done == r.total) fmt::print("\n");
      std::fflush(stdout);
      return;
    }
    const std::int64_t every = std::max<std::int64_t>(1, r.total / 20);
    const bool first_skip = r.skipped && r.skipped_so_far == 1;
    const bool scheduled = done % every == 0 && r.seconds - last_printed_ >= 1.0;
    if (first_skip || scheduled || done == r.total) {
      fmt::print("{}\n", line);
      last_printed_ = r.seconds;
    }
  }

 private:
  std::string label_;
  bool terminal_;
  std::int64_t first_ = -1;
  double last_printed_ = -1e9;
};

void print_summary(const std::string& label, const TrainConfig& c, const TrainResult& r) {
  fmt::print("{}: {} of '{}' in {}{}{}: {} skipped, {} NaN/Inf origins, final loss {:.4g}, scale after the last step "
             "{:g}{}\n",
             label, steps_text(r.steps), r.sample, precision_name(c.precision), r.scenario.empty() ? "" : " with scenario ",
             r.scenario, r.skipped, r.anomalies, r.final_loss, r.final_scale,
             r.interrupted ? " (interrupted by Ctrl-C)" : "");
  if (!r.trace.empty()) fmt::print("  trace: {}\n", r.trace);
}

// After --compare: where the low-precision run parts from the fp32 one and its first anomaly, in a few
// lines; `ampscope diff` and `ampscope report` give the whole story.
void print_comparison(const TrainConfig& low, const TrainResult& fp32_run, const TrainResult& low_run, bool colour) {
  if (fp32_run.trace.empty() || low_run.trace.empty()) {
    fmt::print("compare: no traces to compare (give --out to write them)\n");
    return;
  }
  analysis::TextStyle style;
  style.colour = colour;
  style.brief = true;
  const std::string name(precision_name(low.precision));
  {
    trace::TraceReader a(fp32_run.trace), b(low_run.trace);
    fmt::print("\ncompare fp32 (a) with {} (b):\n{}", name, analysis::render_text(analysis::diff(a, b), style));
  }
  trace::TraceReader reader(low_run.trace);
  fmt::print("\n{} run:\n{}", name, analysis::render_text(analysis::analyse(reader), style));
  const std::string self = program();
  fmt::print("\nthe whole story: {} report {}\n                 {} diff {} {}\n", self, low_run.trace, self,
             fp32_run.trace, low_run.trace);
}

// The trace this process will write for `c` (a rank of a data-parallel run writes its own, run.rankN.h5).
std::string trace_path_of(const TrainConfig& c) {
  if (c.process_group != nullptr && c.process_group->size() > 1) return rank_trace_path(c.out, c.process_group->rank());
  return c.out;
}

// What `ampscope fix` left beside a trace: its results file and its re-runs' traces (<stem>.fix-NAME.h5).
std::vector<std::filesystem::path> fix_sidecars(const std::filesystem::path& trace) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  const std::filesystem::path results = analysis::fix_results_path(trace.string());
  if (std::filesystem::symlink_status(results, ec).type() != std::filesystem::file_type::not_found && !ec)
    found.push_back(results);
  const std::filesystem::path folder = trace.parent_path().empty() ? "." : trace.parent_path();
  const std::string prefix = trace.stem().string() + ".fix-";
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(prefix) && name.ends_with(".h5")) found.push_back(it->path());
  }
  return found;
}

// An existing trace under --out is another run's record: refused unless --overwrite, which removes it and
// the results files `ampscope fix` wrote for it (they describe the old run). Links are removed, never followed.
// A lock file ("<trace>.lock") that is not a regular file (a link or a FIFO someone planted) is removed by
// --overwrite too, by name; without it the writer refuses it, naming it. A regular lock file stays: a writer
// may hold it.
void prepare_outputs(const std::vector<TrainConfig>& plan, bool overwrite) {
  for (const TrainConfig& c : plan) {
    if (c.out.empty()) continue;
    const std::filesystem::path trace = trace_path_of(c);
    std::error_code ec;
    const std::filesystem::path lock = trace.string() + ".lock";
    const auto lock_type = std::filesystem::symlink_status(lock, ec).type();
    if (overwrite && lock_type != std::filesystem::file_type::not_found &&
        lock_type != std::filesystem::file_type::regular && lock_type != std::filesystem::file_type::directory) {
      std::filesystem::remove(lock);
    }
    const auto type = std::filesystem::symlink_status(trace, ec).type();
    if (type == std::filesystem::file_type::not_found) continue;
    if (!overwrite && type == std::filesystem::file_type::symlink) {
      throw Error(fmt::format("--out: '{}' is a symbolic link (to '{}'); ampscope never writes a trace through a link, "
                              "which could overwrite whatever it points at\nhint: give another --out, or --overwrite "
                              "to replace the link itself (what it points at is left alone)",
                              trace.string(), std::filesystem::read_symlink(trace, ec).string()));
    }
    if (!overwrite) {
      throw Error(fmt::format("--out: '{}' exists (the trace of an earlier run); refusing to overwrite it\n"
                              "hint: give another --out, or --overwrite to replace it and the results files "
                              "`ampscope fix` wrote beside it",
                              trace.string()));
    }
    if (type == std::filesystem::file_type::directory)
      throw Error(fmt::format("--out: '{}' is a folder; --overwrite replaces trace files only", trace.string()));
    for (const std::filesystem::path& p : fix_sidecars(trace)) std::filesystem::remove(p);
    std::filesystem::remove(trace);
  }
}

}  // namespace

TrainCommand::TrainCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("train", "Train a sample model with probes and write an HDF5 trace");
  // Every option of the run, from the table (samples/run_options.h); then the command's own.
  options_ = std::make_unique<RunOptionsCli>(*cmd_);
  cmd_->add_flag("--compare", compare_, "Run fp32 and the chosen precision with the same seed; write both traces");
  cmd_->add_option("--config", config_file_, "TOML file with the same settings (keys as the option names: "
                                             "init-scale = 1024.0; paths relative to the file's folder); "
                                             "command-line options win");
  cmd_->add_flag("--overwrite", overwrite_,
                 "Replace a trace that --out names if it exists, with the old run's results files beside it "
                 "(<stem>.fix.json, <stem>.fix-*.h5); without it an existing trace is refused");
  cmd_->add_flag("--list-samples", list_samples_, "List the sample models and exit");
  cmd_->add_flag("--list-scenarios", list_scenarios_, "List the failure scenarios and exit");
}

TrainCommand::~TrainCommand() = default;

bool TrainCommand::parsed() const { return cmd_->parsed(); }

TrainConfig TrainCommand::resolve(bool& compare) const {
  TrainConfig config;
  compare = false;
  // Defaults, then the --config file, then the options given on the command line.
  if (!config_file_.empty()) apply_config_file(config_file_, config, compare);
  options_->apply(config);
  auto given = [&](const char* name) { return options_->given(name); };
  compare = compare || compare_;
  if (!config.model_dir.empty()) {
    // A model folder replaces the sample: options that only a sample reads are errors, not silently ignored.
    if (given("sample") || config.sample != TrainConfig{}.sample) {
      throw Error(fmt::format("--model '{}' and --sample {} both name what to train; give one of them",
                              config.model_dir, config.sample));
    }
    if (!config.scenario.empty()) {
      throw Error(fmt::format("--scenario {} runs a sample model and cannot be combined with --model; leave one out",
                              config.scenario));
    }
    validate_config(config);
    return config;
  }
  // Validate names before any work, so a typo costs nothing.
  find_sample(config.sample);
  if (!config.scenario.empty()) {
    const Scenario& scenario = find_scenario(config.scenario);
    // A scenario is written for one sample: without --sample it picks it, with another one it is an error
    // (it used to run the scenario's sample silently).
    const bool sample_given = given("sample") || config.sample != TrainConfig{}.sample;
    if (sample_given && config.sample != scenario.sample) {
      throw Error(fmt::format("--scenario {} runs the '{}' sample, but --sample is '{}'; leave --sample out or "
                              "give --sample {}",
                              config.scenario, scenario.sample, config.sample, scenario.sample));
    }
    config.sample = scenario.sample;
  }
  validate_config(config);
  return config;
}

void validate_config(const TrainConfig& c) {
  check_run_options(c);  // each value on its own (the table's checks); then what must fit together
  if (c.model_dir.empty()) {
    for (const auto& [flag, value] : {std::pair<const char*, bool>{"--tokens", !c.tokens_file.empty()},
                                      std::pair<const char*, bool>{"--context", c.context != 0},
                                      std::pair<const char*, bool>{"--fp16-clamp", c.fp16_clamp}}) {
      if (value) {
        throw Error(fmt::format("{} is read only with --model (a Hugging Face model folder); the samples make their "
                                "own data\nhint: add --model DIR, or leave {} out",
                                flag, flag));
      }
    }
  } else {
    if (!std::filesystem::is_directory(c.model_dir)) {
      throw Error(fmt::format("--model '{}': no such folder; expected a Hugging Face model folder holding config.json "
                              "and model.safetensors (or model.safetensors.index.json and its shards)",
                              c.model_dir));
    }
    if (c.tokens_file.empty() && c.text_file.empty()) {
      throw Error(fmt::format("--model '{}' needs --tokens FILE (token ids: .npy, .bin or .txt) or --text FILE (a "
                              "text the folder's GPT-2 tokenizer encodes)\nhint: docs/checkpoints.md shows how to "
                              "write token ids from any tokenizer in two lines of Python",
                              c.model_dir));
    }
    if (!c.tokens_file.empty() && !c.text_file.empty()) {
      throw Error("--tokens and --text both give the data of a --model run; give one of them");
    }
    if (!c.tokens_file.empty()) {
      if (const std::string reason = hdf5::unreadable_reason(c.tokens_file.c_str()); !reason.empty()) {
        throw Error(fmt::format("--tokens '{}': {}; expected a readable token file (.npy, .bin or .txt)",
                                c.tokens_file, reason));
      }
    } else if (const std::string reason = hdf5::unreadable_reason(c.text_file.c_str()); !reason.empty()) {
      throw Error(fmt::format("--text '{}': {}; expected a readable text file", c.text_file, reason));
    }
    if (!c.data_dir.empty()) {
      throw Error("--data is read by the cnn sample only; a --model run reads --tokens or --text\nhint: leave --data out");
    }
  }
  if (c.eval && !c.checkpoint.empty()) {
    throw Error("--checkpoint with --eval: an evaluation changes no weights, so there is nothing to save\nhint: leave "
                "--checkpoint out (--resume with --eval evaluates a checkpoint)");
  }
  if (c.eval && !c.save_model.empty()) throw Error("--save-model with --eval: an evaluation changes no weights\nhint: leave --save-model out");
  check_fp8_run(c);
  check_what_if_run(c);
  if (c.twin && c.out.empty()) {
    throw Error("--twin needs --out FILE: the twin's rows go to the trace's /precision table");
  }
  if (c.twin && c.probe == "off") {
    throw Error("--twin needs a probe level other than off: the twin computes again the ops the probe records\n"
                "hint: --probe health (the default)");
  }
  if (c.keep_checkpoints && c.checkpoint_every < 1) {
    throw Error("--keep-checkpoints keeps the periodic checkpoints, and there are none\nhint: add --checkpoint FILE "
                "--checkpoint-every N");
  }
  if (c.checkpoint_every > 0 && c.checkpoint.empty()) {
    throw Error(fmt::format("--checkpoint-every {} needs --checkpoint FILE (where to save)", c.checkpoint_every));
  }
  // Options a sample would ignore are errors: the user expects them to matter.
  if (!c.data_dir.empty()) {
    if (c.sample != "cnn") {
      throw Error(fmt::format("--data '{}': only the cnn sample reads IDX files, and this run's sample is '{}'", c.data_dir,
                              c.sample));
    }
    if (std::filesystem::is_regular_file(c.data_dir)) {
      // A file is refused rather than taken for its folder: which split and which labels the user meant is
      // not knowable from one file.
      const std::filesystem::path parent = std::filesystem::path(c.data_dir).parent_path();
      throw Error(fmt::format("--data '{}': not a folder but a file; --data takes the folder that holds the MNIST "
                              "files (train-images-idx3-ubyte and train-labels-idx1-ubyte, or Kaggle's "
                              "train-images.idx3-ubyte and train-labels.idx1-ubyte, plain or .gz)\nhint: --data '{}'",
                              c.data_dir, parent.empty() ? "." : parent.string()));
    }
    if (!std::filesystem::is_directory(c.data_dir)) {
      throw Error(fmt::format("--data '{}': no such folder; expected the folder holding the MNIST files "
                              "(train-images-idx3-ubyte and train-labels-idx1-ubyte, or Kaggle's names, plain or .gz)",
                              c.data_dir));
    }
  }
  if (!c.text_file.empty() && c.model_dir.empty()) {
    if (c.sample != "transformer") {
      throw Error(fmt::format("--text '{}': only the transformer sample reads text, and this run's sample is '{}'",
                              c.text_file, c.sample));
    }
    if (const std::string reason = hdf5::unreadable_reason(c.text_file.c_str()); !reason.empty()) {
      throw Error(fmt::format("--text '{}': {}; expected a readable text file", c.text_file, reason));
    }
  }
  if (!c.resume.empty()) {
    if (const std::string reason = hdf5::unreadable_reason(c.resume.c_str()); !reason.empty()) {
      throw Error(fmt::format("--resume '{}': {}; expected a checkpoint written by --checkpoint", c.resume, reason));
    }
  }
}

int TrainCommand::run() {
  if (list_samples_) {
    for (const SampleInfo& s : sample_registry()) fmt::print("{:<12} {}\n", s.name, s.description);
    return 0;
  }
  if (list_scenarios_) {
    for (const Scenario& s : scenario_registry()) fmt::print("{:<20} {} (sample {})\n", s.name, s.description, s.sample);
    return 0;
  }
  bool compare = false;
  TrainConfig config = resolve(compare);
  // Data parallelism: the process group (MPI under a launcher, else one process); its ranks run this same
  // command. One group per process, made here and given to every run of the plan.
  std::unique_ptr<ProcessGroup> group;
  if (config.ddp || launched_by_mpi()) group = make_process_group();
  if (group != nullptr && group->size() > 1) {
    config.process_group = group.get();
    try {
      return run_plan(config, compare, group->rank() == 0);
    } catch (const std::exception& e) {
      // The other ranks would wait for this one in their next collective: end them all.
      fmt::print(stderr, "ampscope train: error (rank {} of {}): {}\n", group->rank(), group->size(), e.what());
      std::fflush(stderr);
      group->abort(kExitUsage);
    }
  }
  if (config.ddp) {
    fmt::print(stderr, "ampscope train: note: --ddp without an MPI launcher (or with one rank): training as one "
                       "process\nhint: mpirun -np N ampscope train ... --ddp (docs/distributed.md)\n");
  }
  if (config.shard_optimizer) {
    fmt::print(stderr, "ampscope train: note: --shard-optimizer {}: one process keeps the whole optimizer state, as "
                       "without it (the same bits)\nhint: mpirun -np N ampscope train ... --ddp --shard-optimizer "
                       "(docs/distributed.md)\n",
               config.ddp ? "with one rank" : "without --ddp or an MPI launcher");
  }
  return run_plan(config, compare, true);
}

int TrainCommand::run_plan(const TrainConfig& config, bool compare, bool leader) {
  g_stop.store(false);
  std::signal(SIGINT, on_sigint);
  const bool terminal = isatty(fileno(stdout)) != 0;
  std::vector<std::pair<TrainConfig, TrainResult>> runs;
  std::vector<TrainConfig> plan;
  if (compare) {
    TrainConfig fp32 = config, low = config;
    fp32.precision = Precision::fp32;
    leave_quantized_options(fp32);  // `--precision nvfp4 --mx-scale ... --compare`: those options are the low run's
    if (low.precision == Precision::fp32) low.precision = Precision::fp16;
    if (!config.out.empty()) {
      fp32.out = with_suffix(config.out, "fp32");
      low.out = with_suffix(config.out, precision_name(low.precision));
    }
    // Each run has its own checkpoint; a resumed comparison resumes each from its own.
    if (!config.checkpoint.empty()) {
      fp32.checkpoint = with_suffix(config.checkpoint, "fp32");
      low.checkpoint = with_suffix(config.checkpoint, precision_name(low.precision));
    }
    if (!config.resume.empty()) {
      fp32.resume = with_suffix(config.resume, "fp32");
      low.resume = with_suffix(config.resume, precision_name(low.precision));
    }
    plan = {fp32, low};
  } else {
    plan = {config};
  }
  prepare_outputs(plan, overwrite_);
  bool interrupted = false;
  for (TrainConfig& c : plan) {
    c.keep_losses = false;  // the progress line sees each step; a long run must not hold them all
    std::string sample = c.scenario.empty() ? c.sample : find_scenario(c.scenario).sample;
    if (!c.model_dir.empty()) {  // the folder's name: "[gpt2-tiny fp16]"
      const std::filesystem::path folder = std::filesystem::absolute(c.model_dir).lexically_normal();
      sample = (folder.has_filename() ? folder : folder.parent_path()).filename().string();
    }
    Progress progress(fmt::format("[{} {}]", sample, precision_name(c.precision)), terminal);
    // The ranks of a data-parallel run train in step: rank 0 speaks for them.
    const TrainResult r = leader ? train(c, std::ref(progress), &g_stop) : train(c, {}, &g_stop);
    if (leader) {
      print_summary("summary", c, r);  // at once: a later run's failure must not hide this one
      for (const std::string& w : r.warnings) fmt::print(stderr, "ampscope train: warning: {}\n", w);
    }
    std::fflush(stdout);
    runs.emplace_back(c, r);
    if (r.interrupted) {
      interrupted = true;
      break;
    }
  }
  std::signal(SIGINT, SIG_DFL);
  if (compare && !interrupted && runs.size() == 2 && leader)
    print_comparison(runs[1].first, runs[0].second, runs[1].second, terminal && std::getenv("NO_COLOR") == nullptr);
  return interrupted ? 130 : 0;  // 130: interrupted by SIGINT, as shells report it
}

}  // namespace ampscope::samples
