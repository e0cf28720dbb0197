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

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/distributed/process_group.h"
#include "core/io/hdf5_support.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"
#include "cli/report_command.h"

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
class Progress {
 public:
  Progress(std::string label, bool terminal) : label_(std::move(label)), terminal_(terminal) {}

  void operator()(const StepReport& r) {
    const std::int64_t done = r.step + 1;
    if (first_ < 0) first_ = r.step;  // a resumed run starts counting at its first step
    const double rate = r.seconds > 0 ? static_cast<double>(done - first_) / r.seconds : 0;
    const double left = rate > 0 ? static_cast<double>(r.total - done) / rate : -1;
    const std::string line = fmt::format("{} step {}/{}  loss {:.4g}  scale {:g}  skipped {}  NaN/Inf origins {}  {:.1f} steps/s  "
                                         "{} left",
                                         label_, done, r.total, r.loss, r.scale, r.skipped_so_far, r.anomalies_so_far,
                                         rate, format_duration(left));
    if (terminal_) {
      fmt::print("\r{:<110}", line);
      if (done == r.total) fmt::print("\n");
      std::fflush(stdout);
    } else {
      const std::int64_t every = std::max<std::int64_t>(1, r.total / 20);
      if (done % every == 0 || done == r.total || r.skipped) fmt::print("{}\n", line);
    }
  }

 private:
  std::string label_;
  bool terminal_;
  std::int64_t first_ = -1;
};

// "--lr: -1 is not allowed; expected a finite number > 0 (0: the sample's default)": one line naming the
// option, the value and what is allowed.
[[noreturn]] void bad_value(std::string_view option, const std::string& value, std::string_view allowed) {
  throw Error(fmt::format("--{}: {} is not allowed; expected {}", option, value, allowed));
}

std::string number_text(double v) { return fmt::format("{}", v); }

// Applies a TOML file's keys (the option names without dashes, e.g. init-scale = 1024.0) to the config.
void apply_config_file(const std::string& path, TrainConfig& c, bool& compare) {
  if (const std::string reason = hdf5::unreadable_reason(path.c_str()); !reason.empty()) {
    throw Error(fmt::format("--config: cannot read '{}': {}", path, reason));
  }
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("--config: cannot parse '{}': {} (line {}, column {})", path, e.description(),
                            e.source().begin.line, e.source().begin.column));
  }
  const toml::table* table = file["train"].as_table() != nullptr ? file["train"].as_table() : &file;
  // With a [train] table, every key belongs in it: a key outside would be silently ignored.
  if (table != &file) {
    for (const auto& [key, node] : file) {
      if (key.str() != "train") {
        throw Error(fmt::format("--config '{}': key '{}' is outside the [train] table and would be ignored; put "
                                "every key under [train], or use no table at all",
                                path, key.str()));
      }
    }
  }
  const std::vector<std::string> known = {"sample", "precision", "device", "steps", "batch", "lr", "seed", "out",
                                          "probe", "sample-every", "twin", "twin-every", "twin-forward-only", "twin-f64", "scenario", "init-scale", "growth-interval",
                                          "no-scaler", "autocast-fp32", "checkpoint", "checkpoint-every", "resume", "resume-allow-nonfinite",
                                          "data", "text", "compare", "max-grad-norm", "model", "tokens", "context",
                                          "eval", "save-model", "keep-checkpoints", "fp16-clamp"};
  // Paths in the file are relative to the file's folder (a config keeps working from any working folder);
  // absolute paths stay as they are. Paths on the command line stay relative to the working folder.
  const std::filesystem::path config_folder = std::filesystem::path(path).parent_path();
  auto file_path = [&](const std::string& p) {
    if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
    return (config_folder / p).lexically_normal().string();
  };
  for (const auto& [key, node] : *table) {
    const std::string k(key.str());
    auto need = [&](auto value, std::string_view type) {
      if (!value) throw Error(fmt::format("--config '{}': '{}' must be {}", path, k, type));
      return *value;
    };
    if (k == "sample") c.sample = need(node.value<std::string>(), "a string");
    else if (k == "precision") c.precision = parse_precision(need(node.value<std::string>(), "a string"));
    else if (k == "device") c.device = need(node.value<std::string>(), "a string");
    else if (k == "steps") c.steps = need(node.value<std::int64_t>(), "an integer");
    else if (k == "batch") c.batch = need(node.value<std::int64_t>(), "an integer");
    else if (k == "lr") c.lr = need(node.value<double>(), "a number");
    else if (k == "seed") {
      const std::int64_t seed = need(node.value<std::int64_t>(), "an integer");
      if (seed < 0) throw Error(fmt::format("--config '{}': 'seed' = {} is not allowed; expected an integer >= 0", path, seed));
      c.seed = static_cast<std::uint64_t>(seed);
    }
    else if (k == "out") c.out = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "probe") c.probe = need(node.value<std::string>(), "a string");
    else if (k == "sample-every") c.sample_every = need(node.value<std::int64_t>(), "an integer");
    else if (k == "twin") c.twin = need(node.value<bool>(), "true or false");
    else if (k == "twin-every") {
      c.twin_every = need(node.value<std::int64_t>(), "an integer");
      c.twin = true;  // as on the command line: --twin-every implies --twin
    }
    else if (k == "twin-forward-only") {
      c.twin_backward = !need(node.value<bool>(), "true or false");
      if (!c.twin_backward) c.twin = true;  // as on the command line: --twin-forward-only implies --twin
    }
    else if (k == "twin-f64") {
      c.twin_f64 = need(node.value<bool>(), "true or false");
      if (c.twin_f64) c.twin = true;  // as on the command line: --twin-f64 implies --twin
    }
    else if (k == "scenario") c.scenario = need(node.value<std::string>(), "a string");
    else if (k == "init-scale") c.init_scale = need(node.value<double>(), "a number");
    else if (k == "growth-interval") c.growth_interval = need(node.value<std::int64_t>(), "an integer");
    else if (k == "no-scaler") c.use_scaler = !need(node.value<bool>(), "true or false");
    else if (k == "checkpoint") c.checkpoint = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "checkpoint-every") c.checkpoint_every = need(node.value<std::int64_t>(), "an integer");
    else if (k == "resume") c.resume = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "resume-allow-nonfinite") c.resume_allow_nonfinite = need(node.value<bool>(), "true or false");
    else if (k == "data") c.data_dir = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "text") c.text_file = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "compare") compare = need(node.value<bool>(), "true or false");
    else if (k == "max-grad-norm") c.max_grad_norm = need(node.value<double>(), "a number");
    else if (k == "model") c.model_dir = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "tokens") c.tokens_file = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "context") c.context = need(node.value<std::int64_t>(), "an integer");
    else if (k == "eval") c.eval = need(node.value<bool>(), "true or false");
    else if (k == "keep-checkpoints") c.keep_checkpoints = need(node.value<bool>(), "true or false");
    else if (k == "fp16-clamp") c.fp16_clamp = need(node.value<bool>(), "true or false");
    else if (k == "save-model") c.save_model = file_path(need(node.value<std::string>(), "a string"));
    else if (k == "autocast-fp32") {
      const toml::array* arr = node.as_array();
      if (arr == nullptr) throw Error(fmt::format("--config '{}': 'autocast-fp32' must be an array of strings", path));
      for (const auto& item : *arr) c.autocast_fp32.push_back(need(item.value<std::string>(), "an array of strings"));
    } else {
      std::string list;
      for (const std::string& n : known) list += (list.empty() ? "" : ", ") + n;
      throw Error(fmt::format("--config '{}': unknown key '{}'; known keys: {}", path, k, list));
    }
  }
}

void print_summary(const std::string& label, const TrainConfig& c, const TrainResult& r) {
  fmt::print("{}: {} steps of '{}' in {}{}{}: {} skipped, {} NaN/Inf origins, final loss {:.4g}, final scale {:g}{}\n", label,
             r.steps, r.sample, precision_name(c.precision), r.scenario.empty() ? "" : " with scenario ", r.scenario,
             r.skipped, r.anomalies, r.final_loss, r.final_scale, r.interrupted ? " (interrupted by Ctrl-C)" : "");
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
  fmt::print("\nthe whole story: ampscope report {}\n                 ampscope diff {} {}\n", low_run.trace,
             fp32_run.trace, low_run.trace);
}

}  // namespace

TrainCommand::TrainCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("train", "Train a sample model with probes and write an HDF5 trace");
  TrainConfig& c = config_;
  cmd_->add_option("--sample", c.sample, "Sample model: mlp, cnn or transformer (see --list-samples)")
      ->capture_default_str();
  cmd_->add_option("--precision", precision_, "Precision of the ops: fp32, fp16 (autocast + GradScaler) or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  cmd_->add_option("--device", c.device, "auto (the GPU when one is present), cpu, cuda or cuda:N")->capture_default_str();
  cmd_->add_option("--steps", c.steps, "Optimizer steps to run")->capture_default_str();
  cmd_->add_option("--batch", c.batch, "Batch size (0: the sample's default)")->capture_default_str();
  cmd_->add_option("--lr", c.lr, "Learning rate of AdamW (0: the sample's default)")->capture_default_str();
  // CLI11 would read "-1" into the unsigned seed as 2^64 - 1 without a word.
  cmd_->add_option("--seed", c.seed, "Seed of parameters, data and dropout")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& value) {
            return !value.empty() && value.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : fmt::format("{} is not allowed; expected an integer >= 0", value);
          },
          "INT >= 0"));
  cmd_->add_option("--out", c.out, "Trace file to write (HDF5); empty: no trace")->capture_default_str();
  cmd_->add_option("--probe", c.probe, "Probe level: off, dtype, health or full")
      ->capture_default_str()
      ->check(CLI::IsMember({"off", "dtype", "health", "full"}));
  cmd_->add_option("--sample-every", c.sample_every, "Write every Nth step (steps with anomalies are always written)")
      ->capture_default_str();
  cmd_->add_flag("--twin", c.twin,
                 "Compute every f16/bf16 op and backward node of every recorded step again in f32 (the f32 twin) "
                 "and record how much precision each lost (the trace's /precision table; the report's PRECISION "
                 "section); the run itself is unchanged, a twinned step costs about 1.9x to 2.3x an untwinned one");
  cmd_->add_option("--twin-every", c.twin_every, "Twin only every Nth step (implies --twin)")->capture_default_str();
  cmd_->add_flag("--twin-forward-only", twin_forward_only_,
                 "Twin the forward ops only, not the backward nodes (implies --twin; about 1.5x to 1.9x a step)");
  cmd_->add_flag("--twin-f64", c.twin_f64,
                 "Also twin the forward ops that ran in f32, in f64 (implies --twin): where f32 itself loses digits, "
                 "in fp32 runs too; f16/bf16 ops are still twinned in f32. Slower than --twin");
  cmd_->add_option("--scenario", c.scenario, "Failure scenario to reproduce (see --list-scenarios)");
  cmd_->add_option("--init-scale", c.init_scale, "GradScaler's initial loss scale")->capture_default_str();
  cmd_->add_option("--growth-interval", c.growth_interval, "Clean steps before the GradScaler doubles the scale")
      ->capture_default_str();
  cmd_->add_flag("--no-scaler", no_scaler_, "Train fp16 without loss scaling");
  cmd_->add_option("--autocast-fp32", c.autocast_fp32,
                   "Keep ops or modules matching this glob in f32 under autocast (repeatable); * matches dots "
                   "too: e.g. 'blocks.*.attn' (the ops the attention modules run themselves: bmm, softmax) or "
                   "'blocks.*.attn*' (their children qkv and proj too)");
  cmd_->add_option("--max-grad-norm", c.max_grad_norm, "Clip gradients to this norm after unscaling (0: no clipping)")
      ->capture_default_str();
  cmd_->add_option("--checkpoint", c.checkpoint, "Save a checkpoint here (at the end, and every --checkpoint-every)");
  cmd_->add_option("--checkpoint-every", c.checkpoint_every, "Save the checkpoint every N steps (0: only at the end)")
      ->capture_default_str();
  cmd_->add_flag("--keep-checkpoints", c.keep_checkpoints,
                 "Keep every periodic checkpoint too, as FILE's stem + .step-N (the state before step N); "
                 "`ampscope fix` then re-runs from the last one before the first anomaly");
  cmd_->add_option("--resume", c.resume, "Continue from this checkpoint, bit for bit");
  cmd_->add_flag("--resume-allow-nonfinite", c.resume_allow_nonfinite,
                 "Resume even when the checkpoint's parameters or optimizer state hold NaN or Inf (refused otherwise)");
  cmd_->add_option("--data", c.data_dir, "Folder with the MNIST IDX files for the cnn sample (train-images-idx3-ubyte "
                                         "or Kaggle's train-images.idx3-ubyte, the labels likewise; plain or .gz)");
  cmd_->add_option("--text", c.text_file, "Text file for the transformer sample (default: built-in synthetic text), or "
                                         "for a --model folder with GPT-2's tokenizer (vocab.json + merges.txt, or "
                                         "tokenizer.json): encoded by it");
  cmd_->add_option("--model", c.model_dir,
                   "Hugging Face model folder to train instead of a sample: config.json (model_type gpt2 or llama) "
                   "and model.safetensors or a sharded index (docs/checkpoints.md); needs --tokens");
  cmd_->add_option("--tokens", c.tokens_file,
                   "Token ids for --model: .npy (int32, int64, uint16), .bin (uint16, as nanoGPT writes) or .txt "
                   "(whitespace-separated integers)");
  cmd_->add_option("--context", c.context,
                   "Tokens per window for --model (0: the model's maximum positions, capped at 256)")
      ->capture_default_str();
  cmd_->add_flag("--fp16-clamp", c.fp16_clamp,
                 "T5 folders: Hugging Face's fp16 clamp (inf hidden states clamped to +-(65504 - 1000) after each "
                 "sublayer); off by default, so the overflow shows; the report says when it fired");
  cmd_->add_flag("--eval", c.eval, "Forward passes only (no backward, optimizer or scaler), recorded and analysed "
                                   "like training steps");
  cmd_->add_option("--save-model", c.save_model,
                   "Write the trained weights to this folder at the end (a --model run: config.json and "
                   "model.safetensors in the checkpoint's own names; a sample: model.safetensors)");
  cmd_->add_flag("--ddp", c.ddp,
                 "Data-parallel training, one process per rank: start with mpirun -np N (also on when an MPI "
                 "launcher started the process); --batch is the global batch, --out FILE writes FILE's stem + "
                 ".rankR per rank (docs/distributed.md)");
  cmd_->add_flag("--shard-optimizer", c.shard_optimizer,
                 "With --ddp: ZeRO-1, each rank keeps and updates the optimizer state (AdamW's exp_avg, exp_avg_sq) "
                 "of its shard of the parameters only (whole parameters, largest first, each to the rank holding "
                 "the fewest elements) and broadcasts what it updated; bit for bit the unsharded run, the state's "
                 "memory divided by up to N. Checkpoints are the unsharded file; --resume works on any number "
                 "of ranks that divides --batch. With one rank: the whole state, as without it (docs/distributed.md)");
  cmd_->add_flag("--compare", compare_, "Run fp32 and the chosen precision with the same seed; write both traces");
  cmd_->add_option("--config", config_file_, "TOML file with the same settings (keys as the option names: "
                                             "init-scale = 1024.0; paths relative to the file's folder); "
                                             "command-line options win");
  cmd_->add_flag("--list-samples", list_samples_, "List the sample models and exit");
  cmd_->add_flag("--list-scenarios", list_scenarios_, "List the failure scenarios and exit");
}

bool TrainCommand::parsed() const { return cmd_->parsed(); }

TrainConfig TrainCommand::resolve(bool& compare) const {
  TrainConfig config;
  compare = false;
  if (!config_file_.empty()) apply_config_file(config_file_, config, compare);
  // Options given on the command line override the file.
  auto given = [&](const char* name) { return cmd_->get_option(name)->count() > 0; };
  const TrainConfig& cli = config_;
  if (given("--sample")) config.sample = cli.sample;
  if (given("--precision") || config_file_.empty()) config.precision = parse_precision(precision_);
  if (given("--device")) config.device = cli.device;
  if (given("--steps") || config_file_.empty()) config.steps = cli.steps;
  if (given("--batch")) config.batch = cli.batch;
  if (given("--lr")) config.lr = cli.lr;
  if (given("--seed")) config.seed = cli.seed;
  if (given("--out")) config.out = cli.out;
  if (given("--probe")) config.probe = cli.probe;
  if (given("--sample-every")) config.sample_every = cli.sample_every;
  if (cli.twin) config.twin = true;
  if (given("--twin-every")) {
    config.twin_every = cli.twin_every;
    config.twin = true;
  }
  if (twin_forward_only_) {
    config.twin_backward = false;
    config.twin = true;
  }
  if (cli.twin_f64) {
    config.twin_f64 = true;
    config.twin = true;
  }
  if (given("--scenario")) config.scenario = cli.scenario;
  if (given("--init-scale")) config.init_scale = cli.init_scale;
  if (given("--growth-interval")) config.growth_interval = cli.growth_interval;
  if (no_scaler_) config.use_scaler = false;
  if (given("--autocast-fp32")) config.autocast_fp32 = cli.autocast_fp32;
  if (given("--max-grad-norm")) config.max_grad_norm = cli.max_grad_norm;
  if (given("--checkpoint")) config.checkpoint = cli.checkpoint;
  if (given("--checkpoint-every")) config.checkpoint_every = cli.checkpoint_every;
  if (given("--resume")) config.resume = cli.resume;
  if (cli.resume_allow_nonfinite) config.resume_allow_nonfinite = true;
  if (given("--data")) config.data_dir = cli.data_dir;
  if (given("--text")) config.text_file = cli.text_file;
  if (given("--model")) config.model_dir = cli.model_dir;
  if (given("--tokens")) config.tokens_file = cli.tokens_file;
  if (given("--context")) config.context = cli.context;
  if (cli.eval) config.eval = true;
  if (cli.ddp) config.ddp = true;
  if (cli.shard_optimizer) config.shard_optimizer = true;
  if (cli.keep_checkpoints) config.keep_checkpoints = true;
  if (cli.fp16_clamp) config.fp16_clamp = true;
  if (given("--save-model")) config.save_model = cli.save_model;
  compare = compare || compare_;
  if (!config.model_dir.empty()) {
    // A model folder replaces the sample: options that only a sample reads are errors, not silently ignored.
    if (given("--sample") || config.sample != TrainConfig{}.sample) {
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
    const bool sample_given = given("--sample") || config.sample != TrainConfig{}.sample;
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
  if (c.context < 0) bad_value("context", std::to_string(c.context), "an integer >= 1 (0: the model's maximum, capped at 256)");
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
  if (c.steps < 0) bad_value("steps", std::to_string(c.steps), "an integer >= 0");
  if (c.batch < 0 || c.batch > kMaxBatch) {
    bad_value("batch", std::to_string(c.batch), fmt::format("an integer from 1 to {} (0: the sample's default)", kMaxBatch));
  }
  if (!std::isfinite(c.lr) || c.lr < 0) bad_value("lr", number_text(c.lr), "a finite number > 0 (0: the sample's default)");
  if (c.sample_every < 1) bad_value("sample-every", std::to_string(c.sample_every), "an integer >= 1");
  if (c.twin_every < 1) bad_value("twin-every", std::to_string(c.twin_every), "an integer >= 1 (1 twins every step)");
  if (c.twin && c.out.empty()) {
    throw Error("--twin needs --out FILE: the twin's rows go to the trace's /precision table");
  }
  if (c.twin && c.probe == "off") {
    throw Error("--twin needs a probe level other than off: the twin computes again the ops the probe records\n"
                "hint: --probe health (the default)");
  }
  if (!std::isfinite(c.init_scale) || c.init_scale <= 0) {
    bad_value("init-scale", number_text(c.init_scale), "a finite number > 0 (a power of two such as 65536 is usual)");
  }
  if (c.growth_interval < 1) bad_value("growth-interval", std::to_string(c.growth_interval), "an integer >= 1");
  if (!std::isfinite(c.max_grad_norm) || c.max_grad_norm < 0) {
    bad_value("max-grad-norm", number_text(c.max_grad_norm), "a finite number >= 0 (0: no clipping)");
  }
  if (c.checkpoint_every < 0) bad_value("checkpoint-every", std::to_string(c.checkpoint_every), "an integer >= 0 (0: only at the end)");
  if (c.keep_checkpoints && c.checkpoint_every < 1) {
    throw Error("--keep-checkpoints keeps the periodic checkpoints, and there are none\nhint: add --checkpoint FILE "
                "--checkpoint-every N");
  }
  if (c.checkpoint_every > 0 && c.checkpoint.empty()) {
    throw Error(fmt::format("--checkpoint-every {} needs --checkpoint FILE (where to save)", c.checkpoint_every));
  }
  for (const std::string& pattern : c.autocast_fp32) {
    if (pattern.empty()) bad_value("autocast-fp32", "''", "a glob naming ops or modules, e.g. 'blocks.*.attn.*' or 'softmax'");
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
  bool interrupted = false;
  for (const TrainConfig& c : plan) {
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
