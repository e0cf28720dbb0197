// The training loop of `ampscope train`: a run that sets up, steps and saves over a SampleTask (a sample,
// a scenario's variant of one, or an architecture loaded from a model folder), so new kinds of task, and
// new kinds of run, are new implementations rather than new branches here.
#include "cli/run.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/io/checkpoint.h"
#include "core/io/output_file.h"
#include "core/distributed/data_parallel.h"
#include "core/error.h"
#include "core/block_linear.h"
#include "core/fp8_linear.h"
#include "core/io/fp8_checkpoint.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/training_step.h"
#include "core/distributed/zero_optimizer.h"
#include "cli/recording.h"
#include "cli/run_options_io.h"
#include "cli/suggest.h"
#include "core/what_if.h"

namespace ampscope::samples {

std::string kept_checkpoint_path(const std::string& checkpoint, std::int64_t step) {
  const std::filesystem::path p(checkpoint);
  return (p.parent_path() / fmt::format("{}.step-{}{}", p.stem().string(), step, p.extension().string())).string();
}

std::string rank_trace_path(const std::string& out, int rank) {
  const std::filesystem::path p(out);
  return (p.parent_path() / fmt::format("{}.rank{}{}", p.stem().string(), rank, p.extension().string())).string();
}

std::pair<std::int64_t, std::int64_t> rank_rows(std::int64_t batch, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) throw Error(fmt::format("rank_rows: rank {} of {} ranks", rank, ranks));
  if (batch % ranks != 0) {
    throw Error(fmt::format("--batch {} does not split evenly over {} ranks: --batch is the global batch, and each rank "
                            "trains on an equal share of it\nhint: give a --batch divisible by {} (e.g. {} or {})",
                            batch, ranks, ranks, batch / ranks * ranks == 0 ? ranks : batch / ranks * ranks,
                            (batch / ranks + 1) * ranks));
  }
  return {rank * batch / ranks, (rank + 1) * batch / ranks};
}

std::unique_ptr<SampleTask> make_task(const TrainConfig& config, Generator& gen, std::vector<std::string>& warnings) {
  if (!config.model_dir.empty()) return make_model_task(config, warnings);
  const Scenario* scenario = config.scenario.empty() ? nullptr : &find_scenario(config.scenario);
  std::unique_ptr<SampleTask> task = scenario != nullptr && scenario->make_task ? scenario->make_task(config, gen)
                                                                                : find_sample(config.sample).make(config, gen);
  if (scenario != nullptr && scenario->prepare) scenario->prepare(*task, gen);
  return task;
}

namespace {

// fp8 is bf16 autocast with the Linear GEMMs in FP8 on top (core/fp8_linear.h).
DType lower_dtype(Precision p) { return p == Precision::bf16 || quantized_linears(p) ? DType::bf16 : DType::f16; }

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_status().device_count > 0 ? Device::cuda() : Device::cpu();
  if (name != "cpu" && name.rfind("cuda", 0) != 0) {
    throw Error(fmt::format("unknown device '{}'; valid: auto, cpu, cuda, cuda:N", name));
  }
  return Device::parse(name);
}

// The run's configuration as JSON (the trace's root attribute `config`): the table's recorded options
// (cli/run_options_io.h), and this rank's place in a data-parallel run.
std::string config_json(const TrainConfig& c) {
  const bool ranks = c.process_group != nullptr && c.process_group->size() > 1;
  return run_config_json(c, ranks ? c.process_group->size() : 1, ranks ? c.process_group->rank() : 0);
}

// TransformerEngine's amax reduction over the data-parallel group (its delayed recipe reduces amaxes across the
// group before the scale update: every rank then keeps the same history and uses the same scales): each operand's
// amax of this step, amax_history[0] (the max this rank's casts folded), becomes the max over the ranks, in one max
// all-reduce of the f32 amaxes of every module's input, weight and grad_output in module-path order. The amaxes are
// never NaN (the casts' fmaxf fold skips NaN); an inf wins, and a module that ran on no rank stays 0 and rolls
// nothing. Every rank must hold the same modules (the same model, running the same Linears): a first all-reduce of
// the counts checks that, so that every rank refuses together rather than mismatching the second. Current scaling
// keeps no state: each rank casts its own tensors with their own scales, as TE's current recipe does on a
// data-parallel group.
void reduce_fp8_amaxes(Fp8Context& fp8, ProcessGroup& group) {
  if (fp8.options().recipe != Fp8Recipe::delayed) return;
  std::vector<std::string> modules;
  for (const auto& [module, state] : fp8.states()) modules.push_back(module);
  const auto n = static_cast<double>(modules.size());
  Tensor count = from_values({n, -n}, {2});  // max and -min of the counts; f32 holds them exactly
  group.all_reduce(count, ReduceOp::max);
  const std::vector<double> c = count.values();
  if (c[0] != n || -c[1] != n) {
    throw Error(fmt::format("--precision fp8 with --ddp: the ranks ran FP8 Linears in different numbers of modules "
                            "this step (from {} to {}; this rank {}), so their amaxes cannot be reduced module by "
                            "module\nhint: every rank must run the same Linears each step",
                            -c[1], c[0], modules.size()));
  }
  if (modules.empty()) return;
  constexpr Fp8Operand kOperands[] = {Fp8Operand::input, Fp8Operand::weight, Fp8Operand::grad_output};
  Tensor amax = Tensor::empty({static_cast<std::int64_t>(3 * modules.size())}, {.dtype = DType::f32});
  float* p = amax.data_as<float>();
  std::size_t i = 0;
  for (const std::string& m : modules)
    for (Fp8Operand o : kOperands) p[i++] = fp8.state(m).operand(o).amax_history.at(0);
  group.all_reduce(amax, ReduceOp::max);
  i = 0;
  for (const std::string& m : modules)
    for (Fp8Operand o : kOperands) fp8.state(m).operand(o).amax_history.at(0) = p[i++];
}

// The fields of the configuration that may differ between the ranks of one run: the device (each rank its
// own GPU) and the rank itself.
constexpr const char* kRankLocalFields[] = {"device", "rank"};

// Ranks started with different options would train different things while averaging their gradients:
// every rank compares every rank's configuration with rank 0's, and all refuse together, naming the
// first field that differs and both values.
void check_same_config(ProcessGroup& group, const TrainConfig& config) {
  nlohmann::ordered_json mine = nlohmann::ordered_json::parse(config_json(config));
  for (const char* field : kRankLocalFields) mine.erase(field);
  const std::vector<std::string> all = group.all_gather_bytes(mine.dump());
  const nlohmann::ordered_json first = nlohmann::ordered_json::parse(all.front());
  for (std::size_t r = 1; r < all.size(); ++r) {
    const nlohmann::ordered_json other = nlohmann::ordered_json::parse(all[r]);
    if (other == first) continue;
    std::string field;
    for (const auto& [key, value] : first.items()) {
      if (!other.contains(key) || other.at(key) != value) {
        field = key;
        break;
      }
    }
    if (field.empty()) {
      for (const auto& [key, value] : other.items()) {
        if (!first.contains(key)) {
          field = key;
          break;
        }
      }
    }
    auto shown = [&](const nlohmann::ordered_json& j) { return j.contains(field) ? j.at(field).dump() : std::string("(not set)"); };
    throw Error(fmt::format("the ranks of this --ddp run were started differently: '{}' is {} on rank 0 and {} on "
                            "rank {}\nhint: start every rank with the same options (only the device may differ)",
                            field, shown(first), shown(other), r));
  }
}

// A file the run writes at its end must be writable now, not after the whole run: its folder exists and
// a file can be created there (access() would answer for the real user, and yes for root on a read-only
// mount).
void check_writable_folder(std::string_view option, const std::string& path, const std::filesystem::path& folder) {
  if (!std::filesystem::is_directory(folder)) {
    throw Error(fmt::format("{} '{}': the folder '{}' does not exist\nhint: create it first, or choose another path",
                            option, path, folder.string()));
  }
  const std::filesystem::path probe = folder / fmt::format(".ampscope-write-test-{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(fmt::format("{} '{}': cannot write in the folder '{}': {}\nhint: choose a writable folder", option,
                            path, folder.string(), std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// What a checkpoint says about the run that wrote it ("run" state): read before anything is built, since its
// seed decides the parameters and the data.
struct SavedRun {
  std::string identity;  // the task's identity ("mlp", "gpt2", ...)
  std::uint64_t seed = 0;
  // ZeRO-1 / resume on another number of ranks: the ranks of the run that wrote it (unknown in checkpoints
  // written before the field existed). Whether its optimizer was sharded is recorded too, but changes
  // nothing here: the file is the same either way.
  std::optional<std::int64_t> world_size;
  // The global batch of the run that wrote it (unknown in checkpoints written before the field existed).
  std::optional<std::int64_t> batch;
  // An FP8 run's checkpoint holds its scaling state ("fp8", core/io/fp8_checkpoint.h): false in checkpoints
  // written before it did.
  bool fp8_state = false;
  // An MXFP8 or NVFP4 run's checkpoint holds its block-scaled state ("block": NVFP4's stochastic-rounding offset).
  bool block_state = false;
};

SavedRun peek_resume(const TrainConfig& config) {
  Checkpoint peek{.states = {{"run", StateDict{}}}};
  load_checkpoint(config.resume, peek, {.allow_nonfinite = config.resume_allow_nonfinite});
  const StateDict& run = peek.states.at("run");
  const auto sample_it = run.find("sample");
  const auto seed_it = run.find("seed");
  if (sample_it == run.end() || seed_it == run.end()) {
    throw Error(fmt::format("--resume: '{}' has no run configuration (sample, seed)\nhint: resume from a checkpoint "
                            "written by ampscope train --checkpoint",
                            config.resume));
  }
  // The precision decides whether a GradScaler state exists; the scenario changes model and data.
  for (const auto& [key, requested] :
       {std::pair<std::string, std::string>{"precision", std::string(precision_name(config.precision))},
        std::pair<std::string, std::string>{"scenario", config.scenario}}) {
    const auto it = run.find(key);
    const std::string saved = it == run.end() ? "" : std::get<std::string>(it->second);
    if (it != run.end() && saved != requested) {
      throw Error(fmt::format("--resume: '{}' was written by a run with {} '{}', not '{}'\nhint: resume with the "
                              "same --{} (a resumed run continues the same training)",
                              config.resume, key, saved, requested, key));
    }
  }
  SavedRun saved;
  saved.identity = std::get<std::string>(sample_it->second);
  saved.seed = static_cast<std::uint64_t>(std::get<std::int64_t>(seed_it->second));
  // ZeRO-1 / resume on another number of ranks.
  if (const auto it = run.find("world_size"); it != run.end() && std::holds_alternative<std::int64_t>(it->second)) {
    saved.world_size = std::get<std::int64_t>(it->second);
  }
  if (const auto it = run.find("batch"); it != run.end() && std::holds_alternative<std::int64_t>(it->second)) {
    saved.batch = std::get<std::int64_t>(it->second);
  }
  if (const auto it = run.find("fp8_state"); it != run.end() && std::holds_alternative<bool>(it->second)) {
    saved.fp8_state = std::get<bool>(it->second);
  }
  if (const auto it = run.find("block_state"); it != run.end() && std::holds_alternative<bool>(it->second)) {
    saved.block_state = std::get<bool>(it->second);
  }
  return saved;
}

// ZeRO-1 / resume on another number of ranks: a checkpoint holds the whole state whatever the number of
// ranks that wrote it and whether they sharded the optimizer, and every rank makes the same global batch,
// so a run may resume on any number of ranks that splits --batch evenly. This is the refusal when it does
// not, naming the checkpoint's ranks and the new ones (rank_rows' own message otherwise).
void check_resume_ranks(const TrainConfig& config, const SavedRun& saved, int ranks) {
  if (config.batch % ranks == 0) return;
  std::string divisors;  // those up to 64, then "..."
  for (std::int64_t d = 1; d <= config.batch; ++d) {
    if (config.batch % d != 0) continue;
    if (!divisors.empty()) divisors += ", ";
    if (d > 64) {
      divisors += "...";
      break;
    }
    divisors += fmt::format("{}", d);
  }
  const std::string written = saved.world_size ? fmt::format("was written by a run of {} rank(s)", *saved.world_size)
                                               : std::string("does not record how many ranks wrote it");
  const std::string instance =
      saved.world_size && config.batch % *saved.world_size == 0
          ? fmt::format(", for instance on the checkpoint's {}", *saved.world_size)
          : std::string();
  throw Error(fmt::format("--resume: '{}' {}; resuming it on {} ranks needs a global --batch that splits evenly over "
                          "{}, and --batch {} does not (every rank makes the same global batch and trains on an "
                          "equal share of it)\nhint: resume on a number of ranks that divides {} (mpirun -np N with N "
                          "one of {}){}",
                          config.resume, written, ranks, ranks, config.batch, config.batch, divisors, instance));
}

// Overrides for what-if runs: each pattern keeps matching modules (or ops) in f32. Module paths are known
// now: a pattern with a '.' can only name modules (op names have none), so one that matches no module
// path is a typo and an error. A pattern without '.' may name an op, which is only known once it runs:
// when it matches no module either, a warning says so at the end of the run.
std::vector<std::unique_ptr<AutocastOverrideGuard>> install_overrides(nn::Module& model, const TrainConfig& config,
                                                                      const std::string& what,
                                                                      std::vector<std::string>& warnings) {
  std::vector<std::string> module_paths;
  for (const auto& [name, module] : model.named_modules())
    if (!name.empty()) module_paths.push_back(name);
  for (const std::string& pattern : config.autocast_fp32) {
    const bool names_module = std::any_of(module_paths.begin(), module_paths.end(), [&](const std::string& path) {
      return ::fnmatch(pattern.c_str(), path.c_str(), 0) == 0;
    });
    if (names_module) continue;
    std::string examples;
    for (std::size_t i = 0; i < module_paths.size() && i < 6; ++i) examples += (i ? ", " : "") + module_paths[i];
    if (pattern.find('.') != std::string::npos) {
      throw Error(fmt::format("--autocast-fp32: '{}' matches no module of the '{}' model; its modules are {}{}", pattern,
                              what, examples, module_paths.size() > 6 ? ", ..." : ""));
    }
    warnings.push_back(fmt::format("--autocast-fp32 '{}' matches no module of the '{}' model ({}{}); it had an effect "
                                   "only if it names an op (softmax, linear, ...): check the trace",
                                   pattern, what, examples, module_paths.size() > 6 ? ", ..." : ""));
  }
  std::vector<std::unique_ptr<AutocastOverrideGuard>> overrides;
  for (const std::string& pattern : config.autocast_fp32) {
    // One pattern names modules ("blocks.*.attn.*") or ops ("softmax"): match it against both.
    overrides.push_back(std::make_unique<AutocastOverrideGuard>(
        AutocastOverride{.op = pattern, .module = "", .precision = ampscope::Precision::f32}));
    overrides.push_back(std::make_unique<AutocastOverrideGuard>(
        AutocastOverride{.op = "", .module = pattern, .precision = ampscope::Precision::f32}));
  }
  return overrides;
}

// The FP8 state of a --precision fp8 run. A --fp8-keep-bf16 glob must name a module of the model: one that
// names none is a typo, refused with the model's module paths.
std::shared_ptr<Fp8Context> make_fp8_context(nn::Module& model, const TrainConfig& config, const std::string& what) {
  std::vector<std::string> module_paths;
  for (const auto& [name, module] : model.named_modules())
    if (!name.empty()) module_paths.push_back(name);
  for (const std::string& pattern : config.fp8_keep_bf16) {
    const bool names_module = std::any_of(module_paths.begin(), module_paths.end(), [&](const std::string& path) {
      return ::fnmatch(pattern.c_str(), path.c_str(), 0) == 0;
    });
    if (names_module) continue;
    std::string examples;
    for (std::size_t i = 0; i < module_paths.size() && i < 6; ++i) examples += (i ? ", " : "") + module_paths[i];
    throw Error(fmt::format("--fp8-keep-bf16: '{}' matches no module of the '{}' model; its modules are {}{}\nhint: "
                            "name a module path (a glob: * matches dots too)",
                            pattern, what, examples, module_paths.size() > 6 ? ", ..." : ""));
  }
  Fp8Options options;
  options.recipe = config.fp8_recipe == "current" ? Fp8Recipe::current : Fp8Recipe::delayed;
  if (config.precision == Precision::mxfp8) options.recipe = Fp8Recipe::mxfp8;
  if (config.precision == Precision::nvfp4) options.recipe = Fp8Recipe::nvfp4;
  options.mx_scale = config.mx_scale == "floor" ? MxScaleRule::floor : MxScaleRule::round_up;
  options.nvfp4_rht = config.nvfp4_rht;
  options.sr_seed = config.seed ^ kStochasticRoundingKey;
  options.formats = config.fp8_format == "e4m3" ? Fp8FormatMix::e4m3 : Fp8FormatMix::hybrid;
  options.delayed = DelayedScaling{.history_len = config.fp8_amax_history,
                                   .algo = config.fp8_amax_algo == "most_recent" ? AmaxAlgo::most_recent : AmaxAlgo::max,
                                   .margin = static_cast<float>(config.fp8_margin)};
  options.keep_bf16 = config.fp8_keep_bf16;
  if (config.fp8_keep_first_last) {
    // The first and last nn::Linear in registration order (named_modules: depth-first, as the model registered
    // them), known before the first step runs; each kept by a glob matching its path alone.
    std::vector<std::string> linears;
    for (const auto& [name, module] : model.named_modules())
      if (dynamic_cast<const nn::Linear*>(module) != nullptr) linears.push_back(name);
    if (linears.empty()) {
      throw Error(fmt::format("--fp8-keep-first-last: the '{}' model has no Linear module (nn::Linear), so there is "
                              "no first or last one to keep\nhint: leave --fp8-keep-first-last out, or name the "
                              "modules with --fp8-keep-bf16",
                              what));
    }
    for (const std::string& path : {linears.front(), linears.back()}) {
      std::string glob;  // fnmatch's special characters escaped: the path matches itself only
      for (char ch : path) {
        if (ch == '*' || ch == '?' || ch == '[' || ch == '\\') glob += '\\';
        glob += ch;
      }
      options.keep_bf16.push_back(glob);
    }
  }
  return std::make_shared<Fp8Context>(std::move(options));
}

// One run: set up (configuration, task, optimizer, scaler, resume, overrides, recording), then step and
// save. Members are declared in the order they are built; the recording, built last, is closed first.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainConfig& requested);

  const TrainConfig& config() const { return config_; }
  std::int64_t first_step() const { return first_step_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  const std::string& identity() const { return identity_; }
  std::int64_t anomalies() const { return recording_->anomalies(); }
  const std::string& trace_path() const { return recording_->trace_path(); }
  std::int64_t optimizer_state_elements() const { return opt_ ? ampscope::optimizer_state_elements(*opt_) : 0; }

  // One training step (zero_grad, forward under autocast, scaled backward, unscale/clip/step/update), or
  // with --eval one forward pass; returns its /steps row.
  probe::StepSummary step(std::int64_t n);
  // The checkpoint (--checkpoint); a periodic one is also kept under kept_checkpoint_path when asked.
  void save_checkpoint(std::int64_t next_step, bool periodic);
  void save_model();
  void close() { recording_->close(); }

 private:
  TrainConfig config_;
  const Scenario* scenario_ = nullptr;
  Device device_;
  std::vector<std::string> warnings_;
  std::unique_ptr<Generator> gen_;
  std::unique_ptr<SampleTask> task_;
  std::string identity_;
  std::unique_ptr<optim::AdamW> opt_;  // null with --eval
  std::unique_ptr<GradScaler> scaler_;
  std::int64_t first_step_ = 0;
  StateDict run_state_;
  std::vector<std::unique_ptr<AutocastOverrideGuard>> overrides_;
  std::shared_ptr<Fp8Context> fp8_;  // --precision fp8; null otherwise
  std::shared_ptr<WhatIfContext> what_if_;  // --what-if; null otherwise
  std::optional<StateDict> resumed_fp8_;  // the resumed checkpoint's FP8 state, until fp8_ is made
  std::optional<StateDict> resumed_block_;  // the resumed checkpoint's block-scaled state, until fp8_ is made
  // Data parallelism (a group of more than one rank; null otherwise): rank_ of ranks_.
  ProcessGroup* group_ = nullptr;
  int rank_ = 0;
  int ranks_ = 1;
  std::unique_ptr<GradientAllReducer> reducer_;
  std::unique_ptr<ShardedOptimizer> zero_;  // ZeRO-1 (--shard-optimizer with more than one rank); else null
  std::unique_ptr<Recording> recording_;
};

TrainingRun::TrainingRun(const TrainConfig& requested) : config_(requested) {
  TrainConfig& config = config_;
  scenario_ = config.scenario.empty() ? nullptr : &find_scenario(config.scenario);
  if (scenario_ != nullptr && !config.model_dir.empty()) {
    throw Error(fmt::format("--scenario {} is written for the '{}' sample and cannot run with --model\nhint: leave "
                            "--scenario out; to reproduce a failure in a model folder, change its weights or data",
                            config.scenario, scenario_->sample));
  }
  if (scenario_ != nullptr && scenario_->configure && !config.scenario_applied) scenario_->configure(config);
  if (config.batch <= 0) config.batch = config.model_dir.empty() ? find_sample(config.sample).default_batch : 1;
  if (config.process_group != nullptr && config.process_group->size() > 1) {
    group_ = config.process_group;
    rank_ = group_->rank();
    ranks_ = group_->size();
    check_same_config(*group_, config);  // first: every check below then ends every rank the same way
    if (!config.resume.empty() && config.batch % ranks_ != 0) check_resume_ranks(config, peek_resume(config), ranks_);
    rank_rows(config.batch, rank_, ranks_);
    if (!config.out.empty()) config.out = rank_trace_path(config.out, rank_);
  }
  if (config.steps < 0) throw Error(fmt::format("--steps must be at least 0, got {}", config.steps));
  if (config.sample_every < 1) throw Error(fmt::format("--sample-every must be at least 1, got {}", config.sample_every));
  if (config.eval && !config.checkpoint.empty()) {
    throw Error("--checkpoint with --eval: an evaluation changes no weights, so there is nothing to save\nhint: leave "
                "--checkpoint out (--resume with --eval evaluates a checkpoint)");
  }
  if (config.eval && !config.save_model.empty()) {
    throw Error("--save-model with --eval: an evaluation changes no weights\nhint: leave --save-model out");
  }
  if (config.eval && config.shard_optimizer) {  // ZeRO-1
    throw Error("--shard-optimizer with --eval: an evaluation has no optimizer whose state could be sharded\nhint: "
                "leave --shard-optimizer out");
  }
  check_what_if_run(config);  // first: check_fp8_run lets --mx-scale/--nvfp4-no-rht through for what --what-if measures
  check_fp8_run(config);
  if ((config.precision == Precision::mxfp8 || config.precision == Precision::nvfp4) && ranks_ > 1) {
    throw Error(fmt::format("--precision {} with --ddp: block-scaled runs are single-rank so far (NVFP4's global amax "
                            "would have to be reduced across ranks, as TransformerEngine does for gathered tensors, "
                            "and neither recipe has been tested on several ranks)\nhint: train {} on one rank",
                            precision_name(config.precision), precision_name(config.precision)));
  }
  // FP8 and block-scaled GEMMs exist on the CPU backend only: auto picks the CPU for them (check_fp8_run refused a
  // GPU).
  device_ = quantized_linears(config.precision) && config.device == "auto" ? Device::cpu() : resolve_device(config.device);
  if (!config.checkpoint.empty()) {
    check_writable_folder("--checkpoint", config.checkpoint,
                          std::filesystem::absolute(config.checkpoint).parent_path());
    // Saved by rename, which would replace a link there rather than write through it; refused now, before the
    // run, rather than replaced silently (core/io/output_file.h).
    refuse_unsafe_output(config.checkpoint, "--checkpoint");
  }
  if (!config.save_model.empty()) {
    const std::filesystem::path folder = std::filesystem::absolute(config.save_model);
    if (std::filesystem::exists(folder) && !std::filesystem::is_directory(folder)) {
      throw Error(fmt::format("--save-model '{}' is a file; it names the folder to write\nhint: give a folder "
                              "(created when missing)",
                              config.save_model));
    }
    check_writable_folder("--save-model", config.save_model,
                          std::filesystem::is_directory(folder) ? folder : folder.parent_path());
    // The files it will write, checked now rather than after the run: a link (or FIFO) planted at either name
    // is refused, never written through (core/io/output_file.h; save_folder checks again when it writes).
    refuse_unsafe_output(folder / "config.json", "--save-model's config.json");
    refuse_unsafe_output(folder / "model.safetensors", "--save-model's model.safetensors");
  }

  // A resumed run continues the checkpointed one: its seed (which decides the data stream and a sample's
  // parameters) comes from the checkpoint, and it must train the same thing.
  std::optional<SavedRun> saved;
  if (!config.resume.empty()) {
    saved = peek_resume(config);
    config.seed = saved->seed;
    if (saved->world_size && *saved->world_size != ranks_) {  // ZeRO-1 / resume on another number of ranks
      warnings_.push_back(fmt::format("--resume: '{}' was written by a run of {} rank(s) and resumed on {}: the same "
                                      "training up to the order of the additions (the gradient sums), so not bit "
                                      "for bit the run it continues",
                                      config.resume, *saved->world_size, ranks_));
    }
    if (saved->batch && *saved->batch != config.batch) {  // allowed (memory), but not the run it continues
      warnings_.push_back(fmt::format("--resume: '{}' was written by a run with --batch {} and resumed with --batch {}: "
                                      "each step now draws other data, so this is not the run it continues\nhint: "
                                      "resume with --batch {} to continue it bit for bit",
                                      config.resume, *saved->batch, config.batch, *saved->batch));
    }
  }

  // Build: model parameters are drawn from the seed (or loaded from the model folder); the model then moves
  // to the device. Parameters stay f32 (master weights); autocast runs the ops in the lower precision.
  gen_ = std::make_unique<Generator>(config.seed);
  task_ = make_task(config, *gen_, warnings_);
  identity_ = task_->identity();
  if (saved && saved->identity != identity_) {
    const bool sample = config.model_dir.empty();
    throw Error(fmt::format("--resume: '{}' was written by a '{}' run, not '{}'\nhint: {}", config.resume,
                            saved->identity, identity_,
                            sample ? fmt::format("resume with --sample {}", saved->identity)
                                   : std::string("resume with the model folder (--model) the checkpoint was trained from")));
  }
  nn::Module& model = task_->model();
  model.to(device_);
  const double lr = config.lr > 0 ? config.lr : task_->default_lr();
  if (!config.eval) opt_ = std::make_unique<optim::AdamW>(model.parameters(), optim::OptimizerOptions{.lr = lr, .weight_decay = 0.0});
  // With --eval the scaler is never used, but a resumed fp16 checkpoint's scaler state still loads into it.
  const bool scaling = config.precision == Precision::fp16 && config.use_scaler;
  scaler_ = std::make_unique<GradScaler>(GradScalerOptions{.device = device_.is_cpu() ? "cpu" : "cuda",
                                                           .init_scale = config.init_scale,
                                                           .growth_interval = config.growth_interval,
                                                           .enabled = scaling,
                                                           .process_group = group_});
  run_state_ = {{"sample", identity_},
                {"seed", static_cast<std::int64_t>(config.seed)},
                {"precision", std::string(precision_name(config.precision))},
                {"scenario", config.scenario},
                // ZeRO-1 / resume on another number of ranks: what wrote it (the file is the same either way).
                {"world_size", static_cast<std::int64_t>(ranks_)},
                {"batch", config.batch},  // the global batch: a resume with another one is warned about
                {"sharded_optimizer", config.shard_optimizer && ranks_ > 1}};
  if (config.precision == Precision::fp8) run_state_["fp8_state"] = true;  // the "fp8" state is saved too
  if (config.precision == Precision::mxfp8 || config.precision == Precision::nvfp4) run_state_["block_state"] = true;
  if (!config.resume.empty()) {
    Checkpoint ck{.model = &model, .optimizer = opt_.get(), .generators = {{"model", gen_.get()}},
                  .states = {{"scaler", scaler_->state_dict()}, {"run", StateDict{}}}};
    if (saved->fp8_state) ck.states["fp8"] = StateDict{};  // any keys: load_fp8_state_dict checks them
    if (saved->block_state) ck.states["block"] = StateDict{};  // any keys: load_block_state_dict checks them
    const CheckpointLoadReport loaded =
        load_checkpoint(config.resume, ck, {.allow_nonfinite = config.resume_allow_nonfinite});
    for (const std::string& w : loaded.warnings) warnings_.push_back(fmt::format("--resume: {}", w));
    if (scaling) scaler_->load_state_dict(ck.states.at("scaler"));
    if (saved->fp8_state) resumed_fp8_ = ck.states.at("fp8");
    if (saved->block_state) resumed_block_ = ck.states.at("block");
    first_step_ = ck.step;
  }
  if (group_ != nullptr) {
    // Every rank starts from rank 0's parameters (the same seed gives the same ones; a model folder or a
    // checkpoint read differently would not), and averages its gradients with the others' every step.
    if (device_.is_cuda()) group_->connect(device_);
    NoGradGuard no_grad;
    for (const Tensor& p : model.parameters()) group_->broadcast(p, 0);
    reducer_ = std::make_unique<GradientAllReducer>(*group_, model.parameters());
    // ZeRO-1: after the checkpoint loaded (every rank read the whole state), each rank keeps its shard's.
    if (config.shard_optimizer && opt_) zero_ = std::make_unique<ShardedOptimizer>(*group_, *opt_);
  }
  overrides_ = install_overrides(model, config, identity_, warnings_);
  if (quantized_linears(config.precision) && config.precision != Precision::fp8) {
    fp8_ = make_fp8_context(model, config, identity_);
    // The precision matched the checkpoint's (peek_resume), so a block-scaled checkpoint holds the "block" state.
    if (resumed_block_) load_block_state_dict(*fp8_, *resumed_block_, config.resume);
  }
  if (config.precision == Precision::fp8) {
    fp8_ = make_fp8_context(model, config, identity_);
    if (resumed_fp8_) {
      std::vector<std::string> paths;
      for (const auto& [name, module] : model.named_modules()) paths.push_back(name);
      load_fp8_state_dict(*fp8_, *resumed_fp8_, paths, config.resume);
    } else if (!config.resume.empty() && config.fp8_recipe == "delayed") {
      warnings_.push_back(fmt::format(
          "--resume: '{}' holds no FP8 scaling state (written before checkpoints held it): the delayed recipe starts "
          "again from scale 1 and empty amax histories, so the resumed run does not continue the saved one bit for bit",
          config.resume));
    }
  }
  if (!config.what_if.empty()) {
    // The Linears a real run in the format would quantize: those the FP8 keep options leave in (make_fp8_context
    // checks the globs and turns --fp8-keep-first-last into two).
    const std::shared_ptr<Fp8Context> kept = fp8_ ? fp8_ : make_fp8_context(model, config, identity_);
    what_if_ = std::make_shared<WhatIfContext>(WhatIfOptions{.formats = what_if_formats(config.what_if),
                                                             .mx_scale = config.mx_scale == "floor"
                                                                             ? MxScaleRule::floor
                                                                             : MxScaleRule::round_up,
                                                             .nvfp4_rht = config.nvfp4_rht,
                                                             .seed = config.seed,
                                                             .keep_bf16 = kept->options().keep_bf16});
  }
  recording_ = std::make_unique<Recording>(config, config_json(config), device_, identity_);
}

probe::StepSummary TrainingRun::step(std::int64_t n) {
  probe::Step recorded(n);
  Batch batch = task_->batch(n);
  if (group_ != nullptr) {  // this rank's share of the global batch
    const auto [first, last] = rank_rows(config_.batch, rank_, ranks_);
    for (Tensor* t : {&batch.x, &batch.y, &batch.decoder_input}) {
      if (!t->defined()) continue;
      if (t->dim() == 0 || t->shape()[0] != config_.batch) {
        throw Error(fmt::format("--ddp: the '{}' task's batch has shape {}, not {} rows first; it cannot be split "
                                "between ranks",
                                identity_, shape_str(t->shape()), config_.batch));
      }
      *t = t->slice(0, first, last).contiguous();
    }
  }
  batch.x = batch.x.to(device_);
  batch.y = batch.y.to(device_);
  if (batch.decoder_input.defined()) batch.decoder_input = batch.decoder_input.to(device_);
  std::optional<NoGradGuard> no_grad;
  if (config_.eval) no_grad.emplace();
  if (opt_ && config_.zero_grad) opt_->zero_grad();
  Tensor loss;
  {
    std::optional<AutocastGuard> autocast;
    if (config_.precision != Precision::fp32) autocast.emplace(lower_dtype(config_.precision));
    Fp8Guard fp8_region(fp8_);  // null (no FP8) unless --precision fp8
    // --what-if: the forward's Linears measure their operands; their backward nodes keep the context for dy.
    WhatIfGuard what_if_region(what_if_);
    Tensor output = task_->forward(batch);
    loss = scenario_ != nullptr && scenario_->loss ? scenario_->loss(*task_, output, batch.y)
                                                   : task_->loss(output, batch.y);
  }
  if (config_.eval) {
    if (fp8_ && group_ != nullptr) reduce_fp8_amaxes(*fp8_, *group_);
    if (fp8_) fp8_->end_step();
    return recorded.finish_eval(loss);
  }
  scaler_->scale(loss).backward();
  // TE's scale update after the backward: every FP8 tensor's amax history rolls (those that ran) and the
  // next step's scales are computed; this step's were used already. Under --ddp the amaxes are reduced over the
  // ranks first (reduce_fp8_amaxes), as TE does, so every rank computes the same scales.
  if (fp8_ && group_ != nullptr) reduce_fp8_amaxes(*fp8_, *group_);
  if (fp8_) fp8_->end_step();
  if (reducer_) {
    // This rank's own gradients, before the all-reduce averages them (the /grads rows marked before_all_reduce):
    // the multi-rank report tells from them which rank's gradient broke first.
    probe::report_grads(task_->model().parameters(), /*unscaled=*/!scaler_->is_enabled(), /*before_all_reduce=*/true);
    reducer_->all_reduce();  // every rank's gradients become the ranks' mean, before unscale_
  }
  // finish(): unscale_, clip, scaler.step, scaler.update and the /steps row (core/training_step.h); the
  // scaler is disabled when not scaling, and finish() then reports the gradients itself. Without
  // clipping the norm is still measured: an infinite max_norm makes the clip coefficient 1, and
  // multiplying by 1 leaves every gradient bit unchanged.
  return recorded.finish(
      loss, *opt_, *scaler_,
      {.max_grad_norm = config_.max_grad_norm > 0 ? config_.max_grad_norm : std::numeric_limits<double>::infinity()});
}

void TrainingRun::save_checkpoint(std::int64_t next_step, bool periodic) {
  recording_->quiesce();  // the trace writer's thread must not be inside HDF5 while the checkpoint is
  // ZeRO-1: rank 0 gathers every rank's shard of the optimizer state, so the file is the unsharded one.
  if (zero_) zero_->consolidate_state(0);
  if (rank_ != 0) {  // the ranks' states are identical: rank 0 writes the one checkpoint
    group_->barrier();  // and every rank returns once it is complete (a --resume right after reads it)
    return;
  }
  Checkpoint ck{.model = &task_->model(), .optimizer = opt_.get(), .generators = {{"model", gen_.get()}},
                .states = {{"scaler", scaler_->state_dict()}, {"run", run_state_}}, .step = next_step};
  if (fp8_ && config_.precision == Precision::fp8) {
    ck.states["fp8"] = fp8_state_dict(*fp8_);  // after this step's end_step: the next step's scales
  } else if (fp8_) {
    ck.states["block"] = block_state_dict(*fp8_);  // where the next step's stochastic rounding draws from
  }
  ampscope::save_checkpoint(config_.checkpoint, ck);
  if (zero_) zero_->release_state();  // ZeRO-1: back to rank 0's own shard
  if (periodic && config_.keep_checkpoints) {
    const std::string kept = kept_checkpoint_path(config_.checkpoint, next_step);
    // A new file renamed into place: never written through a link planted under the kept name.
    copy_to_output_file(config_.checkpoint, kept, "the kept checkpoint");
  }
  if (group_ != nullptr) group_->barrier();
}

void TrainingRun::save_model() {
  // Written from CPU values whatever the device (safetensors::save copies to the CPU); by rank 0 only.
  if (rank_ != 0) return;
  task_->save_model(config_.save_model);
}

}  // namespace

namespace {
// Whether a --what-if run measures `format` (an unparsable --what-if is refused by check_what_if_run).
bool what_if_measures(const TrainConfig& config, BlockFormat format) {
  if (config.what_if.empty()) return false;
  try {
    const std::vector<BlockFormat> formats = what_if_formats(config.what_if);
    return std::find(formats.begin(), formats.end(), format) != formats.end();
  } catch (const Error&) {
    return false;
  }
}
}  // namespace

void leave_quantized_options(TrainConfig& c) {
  const TrainConfig defaults;
  if (c.precision != Precision::fp8) {
    c.what_if.clear();
    c.fp8_recipe = defaults.fp8_recipe;
    c.fp8_format = defaults.fp8_format;
    c.fp8_amax_history = defaults.fp8_amax_history;
    c.fp8_amax_algo = defaults.fp8_amax_algo;
    c.fp8_margin = defaults.fp8_margin;
  }
  if (!quantized_linears(c.precision)) {  // fp8, mxfp8 and nvfp4 share the --fp8-keep-* options
    c.fp8_keep_bf16.clear();
    c.fp8_keep_first_last = defaults.fp8_keep_first_last;
  }
  if (c.precision != Precision::mxfp8) c.mx_scale = defaults.mx_scale;
  if (c.precision != Precision::nvfp4) c.nvfp4_rht = defaults.nvfp4_rht;
}

void check_fp8_run(const TrainConfig& config) {
  const std::string_view precision = precision_name(config.precision);
  const bool block = config.precision == Precision::mxfp8 || config.precision == Precision::nvfp4;
  // Options that would do nothing in this run are refused, naming the first in table order.
  for (const RunOption& o : run_options()) {
    if (o.is_default(config)) continue;
    if (o.recorded == Recorded::with_fp8 && block) {
      throw Error(fmt::format("--{} does not apply to --precision {}: block-scaled recipes keep no per-tensor scale (no "
                              "recipe, amax history, margin or format choice: every block gets its own scale)\n"
                              "hint: leave --{} out{}",
                              o.name, precision, o.name,
                              config.precision == Precision::mxfp8 ? " (--mx-scale chooses MXFP8's scale rule)" : ""));
    }
    if (o.recorded == Recorded::with_fp8 && config.precision != Precision::fp8) {
      throw Error(fmt::format("--{} is set but the precision is {}: the FP8 options apply only to --precision fp8\n"
                              "hint: add --precision fp8, or leave --{} out",
                              o.name, precision, o.name));
    }
    // A --what-if run reads the options that leave Linears out, and the scale rule and transform of the formats it
    // measures.
    if (o.recorded == Recorded::with_quantized && !quantized_linears(config.precision) && config.what_if.empty()) {
      throw Error(fmt::format("--{} is set but the precision is {}: it applies only to --precision fp8, mxfp8 or nvfp4 "
                              "(Linears with quantized GEMMs)\nhint: add --precision fp8 (or mxfp8, nvfp4), or leave "
                              "--{} out",
                              o.name, precision, o.name));
    }
    if (o.recorded == Recorded::with_mxfp8 && config.precision != Precision::mxfp8 && !what_if_measures(config, BlockFormat::mxfp8)) {
      throw Error(fmt::format("--{} is set but the precision is {}: it applies only to --precision mxfp8\nhint: add "
                              "--precision mxfp8, or leave --{} out",
                              o.name, precision, o.name));
    }
    if (o.recorded == Recorded::with_nvfp4 && config.precision != Precision::nvfp4 && !what_if_measures(config, BlockFormat::nvfp4)) {
      throw Error(fmt::format("--{} is set but the precision is {}: it applies only to --precision nvfp4\nhint: add "
                              "--precision nvfp4, or leave --{} out",
                              o.name, precision, o.name));
    }
  }
  if (block) {
    if (config.device != "auto" && config.device != "cpu") {
      throw Error(fmt::format("--precision {} with --device {}: block-scaled Linear GEMMs run on the CPU backend only "
                              "(there are no CUDA kernels for them yet)\nhint: use --device cpu (or auto) for {}, or "
                              "--precision bf16 on the GPU",
                              precision, config.device, precision));
    }
    return;
  }
  if (config.precision != Precision::fp8) return;
  if (config.device != "auto" && config.device != "cpu") {
    throw Error(fmt::format("--precision fp8 with --device {}: FP8 runs on the CPU backend so far (the CUDA FP8 "
                            "kernels have not run on a GPU yet)\nhint: use --device cpu (or auto) for fp8, or "
                            "--precision bf16 on the GPU",
                            config.device));
  }
}

std::vector<BlockFormat> what_if_formats(const std::string& what_if) {
  std::vector<BlockFormat> formats;
  if (what_if.empty()) return formats;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = what_if.find(',', start);
    std::string name = what_if.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::size_t first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
    name = first == std::string::npos ? "" : name.substr(first, last - first + 1);
    std::optional<BlockFormat> format;
    if (name == "mxfp8") format = BlockFormat::mxfp8;
    if (name == "nvfp4") format = BlockFormat::nvfp4;
    if (!format) {
      const std::string near = closest_name(name, {"mxfp8", "nvfp4"});
      throw Error(fmt::format("--what-if: '{}' is not a block-scaled format{}; expected mxfp8, nvfp4 or both, "
                              "comma-separated\nhint: --what-if {}",
                              name, near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                              near.empty() ? "mxfp8,nvfp4" : near));
    }
    if (std::find(formats.begin(), formats.end(), *format) == formats.end()) formats.push_back(*format);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return formats;
}

void check_what_if_run(const TrainConfig& config) {
  if (config.what_if.empty()) return;
  (void)what_if_formats(config.what_if);
  if (config.precision != Precision::bf16 && config.precision != Precision::fp8) {
    throw Error(fmt::format("--what-if on an {} run: the what-if statistics measure the bf16 Linears of a bf16 or fp8 "
                            "run, the values a real block-scaled run (bf16 autocast) would quantize{}\nhint: add "
                            "--precision bf16 (or fp8)",
                            precision_name(config.precision),
                            config.precision == Precision::fp32   ? "; an fp32 run has none"
                            : config.precision == Precision::fp16 ? "; an fp16 run's Linears see other values"
                                                                  : "; this run already trains block-scaled, and its "
                                                                    "trace holds the real statistics"));
  }
  if (config.out.empty()) {
    throw Error("--what-if needs --out FILE: the what-if statistics are rows of the trace");
  }
  if (config.probe == "off") {
    throw Error("--what-if needs a probe level other than off: the probe records the what-if statistics\nhint: "
                "--probe health (the default)");
  }
}

TrainResult train(const TrainConfig& requested, const std::function<void(const StepReport&)>& on_step,
                  const std::atomic<bool>* stop) {
  TrainingRun run(requested);
  const TrainConfig& config = run.config();
  TrainResult result;
  result.warnings = run.warnings();
  result.sample = run.identity();
  result.scenario = config.scenario;
  result.trace = run.trace_path();
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t first = run.first_step();
  for (std::int64_t step = first; step < first + config.steps; ++step) {
    if (stop != nullptr && stop->load()) {
      result.interrupted = true;
      break;
    }
    const probe::StepSummary summary = run.step(step);
    ++result.steps;
    result.skipped += summary.skipped ? 1 : 0;
    if (config.keep_losses) {
      result.losses.push_back(summary.loss);
      result.scales.push_back(summary.scale);
    }
    result.final_loss = summary.loss;
    result.final_scale = summary.scale_after;
    if (!config.checkpoint.empty() && config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) {
      run.save_checkpoint(step + 1, /*periodic=*/true);
    }
    if (on_step) {
      StepReport report;
      report.step = step;
      report.total = first + config.steps;
      report.loss = summary.loss;
      report.scale = summary.scale;
      report.skipped = summary.skipped;
      report.skipped_so_far = result.skipped;
      report.anomalies_so_far = run.anomalies();
      report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      on_step(report);
    }
  }
  if (!config.checkpoint.empty()) run.save_checkpoint(first + result.steps, /*periodic=*/false);
  if (!config.save_model.empty()) run.save_model();
  result.anomalies = run.anomalies();
  result.optimizer_state_elements = run.optimizer_state_elements();
  run.close();
  return result;
}

}  // namespace ampscope::samples

