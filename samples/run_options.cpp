// The table of the run's options (samples/run_options.h): one row per TrainConfig field.
#include "samples/run_options.h"

#include <cmath>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope::samples {
namespace {

std::string number_text(double v) { return fmt::format("{}", v); }

// Checks of one value. Each names what `ampscope train` allows, as its messages always have.
template <std::int64_t kMin>
std::optional<Refusal> integer_at_least(const OptionValue& v, std::string_view expected) {
  const std::int64_t n = std::get<std::int64_t>(v);
  if (n >= kMin) return std::nullopt;
  return Refusal{std::to_string(n), std::string(expected)};
}

std::optional<Refusal> steps_check(const OptionValue& v) { return integer_at_least<0>(v, "an integer >= 0"); }
std::optional<Refusal> batch_check(const OptionValue& v) {
  const std::int64_t n = std::get<std::int64_t>(v);
  if (n >= 0 && n <= kMaxBatch) return std::nullopt;
  return Refusal{std::to_string(n), fmt::format("an integer from 1 to {} (0: the sample's default)", kMaxBatch)};
}
std::optional<Refusal> lr_check(const OptionValue& v) {
  const double x = std::get<double>(v);
  if (std::isfinite(x) && x >= 0) return std::nullopt;
  return Refusal{number_text(x), "a finite number > 0 (0: the sample's default)"};
}
std::optional<Refusal> sample_every_check(const OptionValue& v) { return integer_at_least<1>(v, "an integer >= 1"); }
std::optional<Refusal> twin_every_check(const OptionValue& v) {
  return integer_at_least<1>(v, "an integer >= 1 (1 twins every step)");
}
std::optional<Refusal> init_scale_check(const OptionValue& v) {
  const double x = std::get<double>(v);
  if (std::isfinite(x) && x > 0) return std::nullopt;
  return Refusal{number_text(x), "a finite number > 0 (a power of two such as 65536 is usual)"};
}
std::optional<Refusal> growth_interval_check(const OptionValue& v) { return integer_at_least<1>(v, "an integer >= 1"); }
std::optional<Refusal> max_grad_norm_check(const OptionValue& v) {
  const double x = std::get<double>(v);
  if (std::isfinite(x) && x >= 0) return std::nullopt;
  return Refusal{number_text(x), "a finite number >= 0 (0: no clipping)"};
}
std::optional<Refusal> checkpoint_every_check(const OptionValue& v) {
  return integer_at_least<0>(v, "an integer >= 0 (0: only at the end)");
}
std::optional<Refusal> context_check(const OptionValue& v) {
  return integer_at_least<0>(v, "an integer >= 1 (0: the model's maximum, capped at 256)");
}
std::optional<Refusal> globs_check(const OptionValue& v) {
  for (const std::string& pattern : std::get<std::vector<std::string>>(v)) {
    if (pattern.empty()) return Refusal{"''", "a glob naming ops or modules, e.g. 'blocks.*.attn.*' or 'softmax'"};
  }
  return std::nullopt;
}
std::optional<Refusal> probe_check(const OptionValue& v) {
  const std::string& level = std::get<std::string>(v);
  for (const char* known : {"off", "dtype", "health", "full"})
    if (level == known) return std::nullopt;
  return Refusal{level, "one of off, dtype, health, full"};
}
std::optional<Refusal> precision_check(const OptionValue& v) {
  const std::string& name = std::get<std::string>(v);
  for (const char* known : {"fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"})
    if (name == known) return std::nullopt;
  return Refusal{name, "one of fp32, fp16, bf16, fp8, mxfp8, nvfp4"};
}
std::optional<Refusal> one_of(const OptionValue& v, std::initializer_list<const char*> known, std::string_view expected) {
  const std::string& name = std::get<std::string>(v);
  for (const char* k : known)
    if (name == k) return std::nullopt;
  return Refusal{name, std::string(expected)};
}
std::optional<Refusal> fp8_recipe_check(const OptionValue& v) {
  return one_of(v, {"delayed", "current"}, "delayed or current");
}
std::optional<Refusal> fp8_format_check(const OptionValue& v) {
  return one_of(v, {"hybrid", "e4m3"}, "hybrid (E4M3 forward, E5M2 gradients) or e4m3");
}
std::optional<Refusal> mx_scale_check(const OptionValue& v) {
  return one_of(v, {"round-up", "floor"}, "round-up (NVIDIA's libraries) or floor (the OCP specification)");
}
std::optional<Refusal> fp8_amax_algo_check(const OptionValue& v) {
  return one_of(v, {"max", "most_recent"}, "max or most_recent");
}
std::optional<Refusal> fp8_amax_history_check(const OptionValue& v) {
  const std::int64_t n = std::get<std::int64_t>(v);
  if (n >= 1 && n <= kMaxFp8AmaxHistory) return std::nullopt;
  return Refusal{std::to_string(n), fmt::format("an integer from 1 to {} (1024 is TransformerEngine's default)",
                                                kMaxFp8AmaxHistory)};
}
std::optional<Refusal> fp8_margin_check(const OptionValue& v) {
  const std::int64_t n = std::get<std::int64_t>(v);
  if (n >= 0 && n <= kMaxFp8Margin) return std::nullopt;
  return Refusal{std::to_string(n), fmt::format("an integer from 0 to {} (the scale is divided by 2^margin)", kMaxFp8Margin)};
}
std::optional<Refusal> module_globs_check(const OptionValue& v) {
  for (const std::string& pattern : std::get<std::vector<std::string>>(v)) {
    if (pattern.empty()) return Refusal{"''", "a glob naming modules, e.g. 'fc3' or 'blocks.*.mlp.*'"};
  }
  return std::nullopt;
}

}  // namespace

namespace {

std::vector<RunOption> make_table() {
  using T = OptionType;
  using R = Recorded;
  using C = TrainConfig;
  std::vector<RunOption> rows;
  // The order is the config JSON's (traces written before this table had it too), then --help's.
  rows.push_back({.name = "sample", .type = T::text, .field = &C::sample,
                  .help = "Sample model: mlp, cnn or transformer (see --list-samples)", .json_key = "sample",
                  .recorded = R::without_model});
  rows.push_back({.name = "precision", .type = T::choice, .field = &C::precision,
                  .help = "Precision of the ops: fp32, fp16 (autocast + GradScaler), bf16, fp8 (bf16 autocast with the "
                          "Linear GEMMs in FP8 as TransformerEngine runs them), or mxfp8 / nvfp4 (bf16 autocast with "
                          "block-scaled Linear GEMMs, as TE's MXFP8BlockScaling / NVFP4BlockScaling); the last three "
                          "on the CPU only so far",
                  .json_key = "precision", .choices = {"fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"},
                  .check = precision_check});
  rows.push_back({.name = "device", .type = T::text, .field = &C::device,
                  .help = "auto (the GPU when one is present), cpu, cuda or cuda:N", .json_key = "device"});
  rows.push_back({.name = "steps", .type = T::integer, .field = &C::steps, .help = "Optimizer steps to run",
                  .json_key = "steps", .check = steps_check});
  rows.push_back({.name = "batch", .type = T::integer, .field = &C::batch, .help = "Batch size (0: the sample's default)",
                  .json_key = "batch", .check = batch_check});
  rows.push_back({.name = "lr", .type = T::number, .field = &C::lr,
                  .help = "Learning rate of AdamW (0: the sample's default)", .json_key = "lr", .check = lr_check});
  rows.push_back({.name = "seed", .type = T::seed, .field = &C::seed, .help = "Seed of parameters, data and dropout",
                  .json_key = "seed"});
  rows.push_back({.name = "out", .type = T::path, .field = &C::out, .help = "Trace file to write (HDF5); empty: no trace",
                  .recorded = R::never,
                  .not_recorded = "the trace's own path (a re-run writes a trace of its own)"});
  rows.push_back({.name = "scenario", .type = T::text, .field = &C::scenario,
                  .help = "Failure scenario to reproduce (see --list-scenarios)", .json_key = "scenario"});
  rows.push_back({.name = "init-scale", .type = T::number, .field = &C::init_scale,
                  .help = "GradScaler's initial loss scale", .json_key = "init_scale", .check = init_scale_check});
  rows.push_back({.name = "growth-interval", .type = T::integer, .field = &C::growth_interval,
                  .help = "Clean steps before the GradScaler doubles the scale", .json_key = "growth_interval",
                  .check = growth_interval_check});
  rows.push_back({.name = "no-scaler", .type = T::flag, .field = &C::use_scaler, .help = "Train fp16 without loss scaling",
                  .json_key = "use_scaler", .negated = true});
  rows.push_back({.name = "probe", .type = T::choice, .field = &C::probe, .help = "Probe level: off, dtype, health or full",
                  .json_key = "probe", .choices = {"off", "dtype", "health", "full"}, .check = probe_check});
  rows.push_back({.name = "sample-every", .type = T::integer, .field = &C::sample_every,
                  .help = "Write every Nth step (steps with anomalies are always written)", .json_key = "sample_every",
                  .check = sample_every_check});
  rows.push_back({.name = "twin", .type = T::flag, .field = &C::twin,
                  .help = "Compute every f16/bf16 op and backward node of every recorded step again in f32 (the f32 "
                          "twin) and record how much precision each lost (the trace's /precision table; the report's "
                          "PRECISION section); the run itself is unchanged, a twinned step costs about 1.9x to 2.3x an "
                          "untwinned one",
                  .json_key = "twin"});
  rows.push_back({.name = "twin-every", .type = T::integer, .field = &C::twin_every,
                  .help = "Twin only every Nth step (implies --twin)", .json_key = "twin_every", .implies = "twin",
                  .check = twin_every_check});
  rows.push_back({.name = "twin-forward-only", .type = T::flag, .field = &C::twin_backward,
                  .help = "Twin the forward ops only, not the backward nodes (implies --twin; about 1.5x to 1.9x a step)",
                  .json_key = "twin_backward", .negated = true, .implies = "twin"});
  rows.push_back({.name = "twin-f64", .type = T::flag, .field = &C::twin_f64,
                  .help = "Also twin the forward ops that ran in f32, in f64 (implies --twin): where f32 itself loses "
                          "digits, in fp32 runs too; f16/bf16 ops are still twinned in f32. Slower than --twin",
                  .json_key = "twin_f64", .implies = "twin"});
  rows.push_back({.name = "what-if", .type = T::text, .field = &C::what_if,
                  .help = "On a bf16 or fp8 run: also quantize every bf16 Linear's operands as these block-scaled "
                          "formats would (mxfp8, nvfp4 or both, comma-separated), without using the result, and record "
                          "each copy's blockwise statistics (underflow, saturation, block dynamic range, scales, error) "
                          "in the trace; the run itself is unchanged. --fp8-keep-bf16 and --fp8-keep-first-last leave "
                          "Linears out, as a real run in the format would",
                  .json_key = "what_if", .recorded_when_set = true});
  rows.push_back({.name = "fp8-recipe", .type = T::choice, .field = &C::fp8_recipe,
                  .help = "--precision fp8: TransformerEngine's scaling recipe, delayed (each tensor's scale from its "
                          "amax history, used the next step) or current (from the tensor's own amax)",
                  .json_key = "fp8_recipe", .recorded = R::with_fp8, .choices = {"delayed", "current"},
                  .check = fp8_recipe_check});
  rows.push_back({.name = "fp8-format", .type = T::choice, .field = &C::fp8_format,
                  .help = "--precision fp8: hybrid (inputs and weights E4M3, gradients E5M2) or e4m3 (all three E4M3)",
                  .json_key = "fp8_format", .recorded = R::with_fp8, .choices = {"hybrid", "e4m3"},
                  .check = fp8_format_check});
  rows.push_back({.name = "fp8-amax-history", .type = T::integer, .field = &C::fp8_amax_history,
                  .help = "--precision fp8 with the delayed recipe: steps of amax history per tensor",
                  .json_key = "fp8_amax_history", .recorded = R::with_fp8, .check = fp8_amax_history_check});
  rows.push_back({.name = "fp8-amax-algo", .type = T::choice, .field = &C::fp8_amax_algo,
                  .help = "--precision fp8 with the delayed recipe: the amax the scale uses, max (of the history) or "
                          "most_recent (the last step's)",
                  .json_key = "fp8_amax_algo", .recorded = R::with_fp8, .choices = {"max", "most_recent"},
                  .check = fp8_amax_algo_check});
  rows.push_back({.name = "fp8-margin", .type = T::integer, .field = &C::fp8_margin,
                  .help = "--precision fp8 with the delayed recipe: scale = fp8_max / amax / 2^margin",
                  .json_key = "fp8_margin", .recorded = R::with_fp8, .check = fp8_margin_check});
  rows.push_back({.name = "fp8-keep-bf16", .type = T::list, .field = &C::fp8_keep_bf16,
                  .help = "--precision fp8, mxfp8 or nvfp4: keep the Linears of modules matching this glob in bf16 "
                          "(repeatable), e.g. 'fc3'",
                  .json_key = "fp8_keep_bf16", .recorded = R::with_quantized, .check = module_globs_check});
  rows.push_back({.name = "fp8-keep-first-last", .type = T::flag, .field = &C::fp8_keep_first_last,
                  .help = "--precision fp8, mxfp8 or nvfp4: keep the model's first and last Linear modules in bf16 (in "
                          "registration order, the order of the model's module list)",
                  .json_key = "fp8_keep_first_last", .recorded = R::with_quantized});
  rows.push_back({.name = "mx-scale", .type = T::choice, .field = &C::mx_scale,
                  .help = "--precision mxfp8 (or --what-if mxfp8): how each 32-value block's power-of-two scale is chosen: round-up (amax / "
                          "448 rounded up, NVIDIA's libraries: never clips) or floor (2^(floor(log2 amax) - 8), the OCP "
                          "specification: can clip a block's largest values)",
                  .json_key = "mx_scale", .recorded = R::with_mxfp8, .choices = {"round-up", "floor"},
                  .check = mx_scale_check});
  rows.push_back({.name = "nvfp4-no-rht", .type = T::flag, .field = &C::nvfp4_rht,
                  .help = "--precision nvfp4 (or --what-if nvfp4): no random Hadamard transform on the weight-gradient GEMM's operands "
                          "(TransformerEngine applies it by default)",
                  .json_key = "nvfp4_rht", .recorded = R::with_nvfp4, .negated = true});
  rows.push_back({.name = "max-grad-norm", .type = T::number, .field = &C::max_grad_norm,
                  .help = "Clip gradients to this norm after unscaling (0: no clipping)", .json_key = "max_grad_norm",
                  .check = max_grad_norm_check});
  rows.push_back({.name = "zero-grad", .type = T::flag, .field = &C::zero_grad,
                  .help = "Clear the gradients before every step (only the no-zero-grad scenario turns it off)",
                  .json_key = "zero_grad", .user_option = false});
  rows.push_back({.name = "autocast-fp32", .type = T::list, .field = &C::autocast_fp32,
                  .help = "Keep ops or modules matching this glob in f32 under autocast (repeatable); * matches dots "
                          "too: e.g. 'blocks.*.attn' (the ops the attention modules run themselves: bmm, softmax) or "
                          "'blocks.*.attn*' (their children qkv and proj too)",
                  .json_key = "autocast_fp32", .check = globs_check});
  rows.push_back({.name = "data", .type = T::path, .field = &C::data_dir,
                  .help = "Folder with the MNIST IDX files for the cnn sample (train-images-idx3-ubyte or Kaggle's "
                          "train-images.idx3-ubyte, the labels likewise; plain or .gz)",
                  .json_key = "data"});
  rows.push_back({.name = "text", .type = T::path, .field = &C::text_file,
                  .help = "Text file for the transformer sample (default: built-in synthetic text), or for a --model "
                          "folder with GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt, or tokenizer.json): "
                          "encoded by it (instead of --tokens)",
                  .json_key = "text", .recorded_path = RecordedPath::absolute_in_model_runs});
  rows.push_back({.name = "resume", .type = T::path, .field = &C::resume,
                  .help = "Continue from this checkpoint, bit for bit", .json_key = "resume"});
  rows.push_back({.name = "resume-allow-nonfinite", .type = T::flag, .field = &C::resume_allow_nonfinite,
                  .help = "Resume even when the checkpoint's parameters or optimizer state hold NaN or Inf (refused "
                          "otherwise)",
                  .recorded = R::never,
                  .not_recorded = "how a checkpoint was loaded, not what the run trained (`ampscope fix` resumes only "
                                  "from the run's own kept checkpoints, which precede its first anomaly)"});
  rows.push_back({.name = "checkpoint", .type = T::path, .field = &C::checkpoint,
                  .help = "Save a checkpoint here (at the end, and every --checkpoint-every)", .json_key = "checkpoint",
                  .recorded = R::with_checkpoint, .recorded_path = RecordedPath::absolute});
  rows.push_back({.name = "checkpoint-every", .type = T::integer, .field = &C::checkpoint_every,
                  .help = "Save the checkpoint every N steps (0: only at the end)", .json_key = "checkpoint_every",
                  .recorded = R::with_checkpoint, .check = checkpoint_every_check});
  rows.push_back({.name = "keep-checkpoints", .type = T::flag, .field = &C::keep_checkpoints,
                  .help = "Keep every periodic checkpoint too, as FILE's stem + .step-N (the state before step N); "
                          "`ampscope fix` then re-runs from the last one before the first anomaly",
                  .json_key = "keep_checkpoints", .recorded = R::with_checkpoint});
  rows.push_back({.name = "model", .type = T::path, .field = &C::model_dir,
                  .help = "Hugging Face model folder to train instead of a sample: config.json (model_type gpt2, "
                          "llama, mistral or t5) and model.safetensors or a sharded index (docs/checkpoints.md); its "
                          "data: --tokens, or --text when the folder has GPT-2's byte-level BPE tokenizer",
                  .json_key = "model", .recorded = R::with_model, .recorded_path = RecordedPath::absolute});
  rows.push_back({.name = "tokens", .type = T::path, .field = &C::tokens_file,
                  .help = "Token ids for --model (or --text instead): .npy (int32, int64, uint16), .bin (uint16, as "
                          "nanoGPT writes) or .txt (whitespace-separated integers); `ampscope tokenize` writes them",
                  .json_key = "tokens", .recorded = R::with_model, .recorded_path = RecordedPath::absolute});
  rows.push_back({.name = "context", .type = T::integer, .field = &C::context,
                  .help = "Tokens per window for --model (0: the model's maximum positions, capped at 256)",
                  .json_key = "context", .recorded = R::with_model, .check = context_check});
  rows.push_back({.name = "fp16-clamp", .type = T::flag, .field = &C::fp16_clamp,
                  .help = "T5 folders: Hugging Face's fp16 clamp (inf hidden states clamped to +-(65504 - 1000) after "
                          "each sublayer); off by default, so the overflow shows; the report says when it fired",
                  .json_key = "fp16_clamp", .recorded = R::with_model, .recorded_when_set = true});
  rows.push_back({.name = "model-allow-nonfinite", .type = T::flag, .field = &C::model_allow_nonfinite,
                  .help = "Load a --model folder whose weights hold NaN or Inf (refused otherwise, naming each tensor); "
                          "the run's warnings list them",
                  .json_key = "model_allow_nonfinite", .recorded = R::with_model, .recorded_when_set = true});
  rows.push_back({.name = "eval", .type = T::flag, .field = &C::eval,
                  .help = "Forward passes only (no backward, optimizer or scaler), recorded and analysed like "
                          "training steps",
                  .json_key = "eval", .recorded_when_set = true});
  rows.push_back({.name = "save-model", .type = T::path, .field = &C::save_model,
                  .help = "Write the trained weights to this folder at the end (a --model run: config.json and "
                          "model.safetensors in the checkpoint's own names; a sample: model.safetensors)",
                  .recorded = R::never,
                  .not_recorded = "where the weights went after the run, not what it trained (`ampscope fix` never "
                                  "writes model folders)"});
  rows.push_back({.name = "ddp", .type = T::flag, .field = &C::ddp,
                  .help = "Data-parallel training, one process per rank: start with mpirun -np N (also on when an MPI "
                          "launcher started the process); --batch is the global batch, --out FILE writes FILE's stem + "
                          ".rankR per rank (docs/distributed.md)",
                  .recorded = R::never,
                  .not_recorded = "the number of ranks is recorded instead (`world_size` and `rank`, in runs of more "
                                  "than one rank)"});
  rows.push_back({.name = "shard-optimizer", .type = T::flag, .field = &C::shard_optimizer,
                  .help = "With --ddp: ZeRO-1, each rank keeps and updates the optimizer state (AdamW's exp_avg, "
                          "exp_avg_sq) of its shard of the parameters only (whole parameters, largest first, each to "
                          "the rank holding the fewest elements) and broadcasts what it updated; bit for bit the "
                          "unsharded run, the state's memory divided by up to N. Checkpoints are the unsharded file; "
                          "--resume works on any number of ranks that divides --batch. With one rank: the whole "
                          "state, as without it (docs/distributed.md)",
                  .json_key = "shard_optimizer", .recorded = R::with_ranks, .recorded_when_set = true});
  return rows;
}

}  // namespace

OptionValue RunOption::get(const TrainConfig& config) const {
  return std::visit(
      [&](auto member) -> OptionValue {
        using V = std::remove_cvref_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<V, Precision>) {
          return std::string(precision_name(config.*member));
        } else {
          return config.*member;
        }
      },
      field);
}

void RunOption::set(TrainConfig& config, const OptionValue& value) const {
  std::visit(
      [&](auto member) {
        using V = std::remove_cvref_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<V, Precision>) {
          const std::string* name = std::get_if<std::string>(&value);
          if (name == nullptr) throw Error(fmt::format("--{}: expected a precision name", this->name));
          config.*member = parse_precision(*name);
        } else {
          const V* v = std::get_if<V>(&value);
          if (v == nullptr) throw Error(fmt::format("--{}: a value of the wrong type", this->name));
          config.*member = *v;
        }
      },
      field);
}

OptionValue RunOption::option_value(const TrainConfig& config) const {
  OptionValue v = get(config);
  if (negated) v = !std::get<bool>(v);
  return v;
}

void RunOption::apply(TrainConfig& config, const OptionValue& value) const {
  OptionValue v = value;
  if (negated) v = !std::get<bool>(v);
  set(config, v);
  const bool on = type != OptionType::flag || std::get<bool>(value);
  if (!implies.empty() && on) find_run_option(implies)->set(config, true);
}

bool RunOption::is_default(const TrainConfig& config) const { return get(config) == get(TrainConfig{}); }

std::optional<Refusal> RunOption::refusal(const TrainConfig& config) const {
  if (check == nullptr) return std::nullopt;
  return check(get(config));
}

const std::vector<RunOption>& run_options() {
  static const std::vector<RunOption> table = make_table();
  return table;
}

const RunOption* find_run_option(std::string_view name) {
  for (const RunOption& o : run_options())
    if (o.name == name) return &o;
  return nullptr;
}

const RunOption* find_recorded_option(std::string_view json_key) {
  for (const RunOption& o : run_options())
    if (!o.json_key.empty() && o.json_key == json_key) return &o;
  return nullptr;
}

std::string option_value_text(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::remove_cvref_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          return fmt::format("'{}'", v);
        } else if constexpr (std::is_same_v<V, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
          std::string text;
          for (const std::string& s : v) text += fmt::format("{}'{}'", text.empty() ? "" : ", ", s);
          return "[" + text + "]";
        } else {
          return fmt::format("{}", v);
        }
      },
      value);
}

void check_run_options(const TrainConfig& config) {
  for (const RunOption& o : run_options()) {
    if (const std::optional<Refusal> bad = o.refusal(config)) {
      throw Error(fmt::format("--{}: {} is not allowed; expected {}", o.name, bad->value, bad->expected));
    }
  }
}

}  // namespace ampscope::samples
