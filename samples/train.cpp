// The training loop of `ampscope train`.
#include "samples/train.h"

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
#include "core/checkpoint.h"
#include "core/error.h"
#include "core/grad_scaler.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/training_step.h"
#include "samples/recording.h"

namespace ampscope::samples {
namespace {

DType lower_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f16; }

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_status().device_count > 0 ? Device::cuda() : Device::cpu();
  if (name != "cpu" && name.rfind("cuda", 0) != 0) {
    throw Error(fmt::format("unknown device '{}'; valid: auto, cpu, cuda, cuda:N", name));
  }
  return Device::parse(name);
}

// The run's configuration as JSON (the trace's root attribute `config`): every option that shapes what the
// trace holds. Non-finite numbers are written as strings ("nan", "inf"), so the text stays valid JSON.
std::string run_config_json(const TrainConfig& c) {
  auto number = [](double v) -> nlohmann::ordered_json {
    if (std::isfinite(v)) return v;
    return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  };
  nlohmann::ordered_json j;
  j["sample"] = c.sample;
  j["precision"] = std::string(precision_name(c.precision));
  j["device"] = c.device;
  j["steps"] = c.steps;
  j["batch"] = c.batch;
  j["lr"] = number(c.lr);
  j["seed"] = c.seed;
  j["scenario"] = c.scenario;
  j["init_scale"] = number(c.init_scale);
  j["growth_interval"] = c.growth_interval;
  j["use_scaler"] = c.use_scaler;
  j["probe"] = c.probe;
  j["sample_every"] = c.sample_every;
  j["twin"] = c.twin;
  j["twin_every"] = c.twin_every;
  j["max_grad_norm"] = number(c.max_grad_norm);
  j["zero_grad"] = c.zero_grad;
  j["autocast_fp32"] = c.autocast_fp32;
  j["data"] = c.data_dir;
  j["text"] = c.text_file;
  j["resume"] = c.resume;
  return j.dump();
}

}  // namespace

TrainResult train(const TrainConfig& requested, const std::function<void(const StepReport&)>& on_step,
                  const std::atomic<bool>* stop) {
  TrainConfig config = requested;
  const Scenario* scenario = config.scenario.empty() ? nullptr : &find_scenario(config.scenario);
  if (scenario != nullptr && scenario->configure && !config.scenario_applied) scenario->configure(config);
  const SampleInfo& sample = find_sample(config.sample);
  if (config.batch <= 0) config.batch = sample.default_batch;
  if (config.steps < 0) throw Error(fmt::format("--steps must be at least 0, got {}", config.steps));
  if (config.sample_every < 1) throw Error(fmt::format("--sample-every must be at least 1, got {}", config.sample_every));
  const Device device = resolve_device(config.device);
  // A checkpoint that cannot be written must fail now, not after the whole run.
  if (!config.checkpoint.empty()) {
    const std::filesystem::path folder = std::filesystem::absolute(config.checkpoint).parent_path();
    if (!std::filesystem::is_directory(folder)) {
      throw Error(fmt::format("--checkpoint '{}': the folder '{}' does not exist\nhint: create it first, or choose "
                              "another path",
                              config.checkpoint, folder.string()));
    }
    // Writable: try it (access() would answer for the real user, and yes for root on a read-only mount).
    const std::filesystem::path probe = folder / fmt::format(".ampscope-write-test-{}", ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      throw Error(fmt::format("--checkpoint '{}': cannot write in the folder '{}': {}\nhint: choose a writable folder",
                              config.checkpoint, folder.string(), std::strerror(errno)));
    }
    ::close(fd);
    ::unlink(probe.c_str());
  }

  // A resumed run continues the checkpointed one: its seed (which decides the data stream) comes from
  // the checkpoint, and the sample must be the same.
  if (!config.resume.empty()) {
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
    const std::string saved_sample = std::get<std::string>(sample_it->second);
    if (saved_sample != config.sample) {
      throw Error(fmt::format("--resume: '{}' was written by a '{}' run, not '{}'\nhint: resume with --sample {}",
                              config.resume, saved_sample, config.sample, saved_sample));
    }
    // The precision decides whether a GradScaler state exists; the scenario changes model and data.
    for (const auto& [key, requested] : {std::pair<std::string, std::string>{"precision", std::string(precision_name(config.precision))},
                                         std::pair<std::string, std::string>{"scenario", config.scenario}}) {
      const auto it = run.find(key);
      const std::string saved = it == run.end() ? "" : std::get<std::string>(it->second);
      if (it != run.end() && saved != requested) {
        throw Error(fmt::format("--resume: '{}' was written by a run with {} '{}', not '{}'\nhint: resume with the "
                                "same --{} (a resumed run continues the same training)",
                                config.resume, key, saved, requested, key));
      }
    }
    config.seed = static_cast<std::uint64_t>(std::get<std::int64_t>(seed_it->second));
  }

  // Build: model parameters are drawn from the seed; the model then moves to the device. Parameters stay
  // f32 (master weights); autocast runs the ops in the lower precision.
  Generator gen(config.seed);
  std::unique_ptr<SampleTask> task = scenario != nullptr && scenario->make_task ? scenario->make_task(config, gen)
                                                                                : sample.make(config, gen);
  if (scenario != nullptr && scenario->prepare) scenario->prepare(*task, gen);
  nn::Module& model = task->model();
  model.to(device);
  const double lr = config.lr > 0 ? config.lr : task->default_lr();
  optim::AdamW opt(model.parameters(), {.lr = lr, .weight_decay = 0.0});
  const bool scaling = config.precision == Precision::fp16 && config.use_scaler;
  GradScaler scaler({.device = device.is_cpu() ? "cpu" : "cuda",
                     .init_scale = config.init_scale,
                     .growth_interval = config.growth_interval,
                     .enabled = scaling});

  std::vector<std::string> warnings;
  std::int64_t first_step = 0;
  const StateDict run_state = {{"sample", config.sample},
                               {"seed", static_cast<std::int64_t>(config.seed)},
                               {"precision", std::string(precision_name(config.precision))},
                               {"scenario", config.scenario}};
  if (!config.resume.empty()) {
    Checkpoint ck{.model = &model, .optimizer = &opt, .generators = {{"model", &gen}},
                  .states = {{"scaler", scaler.state_dict()}, {"run", StateDict{}}}};
    const CheckpointLoadReport loaded =
        load_checkpoint(config.resume, ck, {.allow_nonfinite = config.resume_allow_nonfinite});
    for (const std::string& w : loaded.warnings) warnings.push_back(fmt::format("--resume: {}", w));
    if (scaling) scaler.load_state_dict(ck.states.at("scaler"));
    first_step = ck.step;
  }

  // Overrides for what-if runs: each pattern keeps matching modules (or ops) in f32. Module paths are
  // known now: a pattern with a '.' can only name modules (op names have none), so one that matches no
  // module path is a typo and an error. A pattern without '.' may name an op, which is only known once it
  // runs: when it matches no module either, a warning says so at the end of the run.
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
      throw Error(fmt::format("--autocast-fp32: '{}' matches no module of the '{}' model; its modules are {}{}",
                              pattern, config.sample, examples, module_paths.size() > 6 ? ", ..." : ""));
    }
    warnings.push_back(fmt::format("--autocast-fp32 '{}' matches no module of the '{}' model ({}{}); it had an effect "
                                   "only if it names an op (softmax, linear, ...): check the trace",
                                   pattern, config.sample, examples, module_paths.size() > 6 ? ", ..." : ""));
  }
  std::vector<std::unique_ptr<AutocastOverrideGuard>> overrides;
  for (const std::string& pattern : config.autocast_fp32) {
    // One pattern names modules ("blocks.*.attn.*") or ops ("softmax"): match it against both.
    overrides.push_back(std::make_unique<AutocastOverrideGuard>(
        AutocastOverride{.op = pattern, .module = "", .precision = ampscope::Precision::f32}));
    overrides.push_back(std::make_unique<AutocastOverrideGuard>(
        AutocastOverride{.op = "", .module = pattern, .precision = ampscope::Precision::f32}));
  }

  Recording recording(config, run_config_json(config), device);

  TrainResult result;
  result.warnings = warnings;
  result.sample = config.sample;
  result.scenario = config.scenario;
  result.trace = recording.trace_path();
  const auto start = std::chrono::steady_clock::now();
  auto save = [&](std::int64_t next_step) {
    recording.quiesce();  // the trace writer's thread must not be inside HDF5 while the checkpoint is
    Checkpoint ck{.model = &model, .optimizer = &opt, .generators = {{"model", &gen}},
                  .states = {{"scaler", scaler.state_dict()}, {"run", run_state}}, .step = next_step};
    save_checkpoint(config.checkpoint, ck);
  };

  for (std::int64_t step = first_step; step < first_step + config.steps; ++step) {
    if (stop != nullptr && stop->load()) {
      result.interrupted = true;
      break;
    }
    probe::Step recorded(step);
    Batch batch = task->batch(step);
    batch.x = batch.x.to(device);
    batch.y = batch.y.to(device);
    if (config.zero_grad) opt.zero_grad();
    Tensor loss;
    {
      std::optional<AutocastGuard> autocast;
      if (config.precision != Precision::fp32) autocast.emplace(lower_dtype(config.precision));
      Tensor output = model(batch.x);
      loss = scenario != nullptr && scenario->loss ? scenario->loss(*task, output, batch.y)
                                                   : task->loss(output, batch.y);
    }
    scaler.scale(loss).backward();
    // finish(): unscale_, clip, scaler.step, scaler.update and the /steps row (core/training_step.h); the
    // scaler is disabled when not scaling, and finish() then reports the gradients itself. Without
    // clipping the norm is still measured: an infinite max_norm makes the clip coefficient 1, and
    // multiplying by 1 leaves every gradient bit unchanged.
    const probe::StepSummary summary = recorded.finish(
        loss, opt, scaler,
        {.max_grad_norm = config.max_grad_norm > 0 ? config.max_grad_norm : std::numeric_limits<double>::infinity()});
    const double scale = summary.scale;

    ++result.steps;
    result.skipped += summary.skipped ? 1 : 0;
    result.losses.push_back(summary.loss);
    result.scales.push_back(scale);
    result.final_loss = summary.loss;
    result.final_scale = summary.scale_after;
    if (!config.checkpoint.empty() && config.checkpoint_every > 0 && (step + 1) % config.checkpoint_every == 0) {
      save(step + 1);
    }
    if (on_step) {
      StepReport report;
      report.step = step;
      report.total = first_step + config.steps;
      report.loss = summary.loss;
      report.scale = scale;
      report.skipped = summary.skipped;
      report.skipped_so_far = result.skipped;
      report.anomalies_so_far = recording.anomalies();
      report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      on_step(report);
    }
  }
  if (!config.checkpoint.empty()) save(first_step + result.steps);
  result.anomalies = recording.anomalies();
  recording.close();
  return result;
}

}  // namespace ampscope::samples
