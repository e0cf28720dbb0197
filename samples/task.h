// samples/task.h: the training loop behind `ampscope train`: a sample (model, data, loss), a precision,
// an optional failure scenario, the GradScaler, the probe and the trace, checkpoints, and progress.
//
//   TrainConfig c;
//   c.sample = "transformer";
//   c.precision = Precision::fp16;
//   c.scenario = "attention-overflow";
//   c.out = "run.h5";
//   TrainResult r = train(c, [](const StepReport& s) { /* progress */ });
//
// One step, written the PyTorch way:
//   zero_grad; { autocast (fp16/bf16) ; loss = task.loss(model(x), y) } ; scaler.scale(loss).backward();
//   scaler.unscale_(opt); grad_norm = clip_grad_norm_(params, max_norm); scaler.step(opt); scaler.update();
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/nn.h"
#include "core/distributed/process_group.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope::samples {

// fp8: bf16 autocast with the Linear GEMMs in FP8 as TransformerEngine runs them (core/fp8_linear.h). mxfp8 and
// nvfp4: bf16 autocast with block-scaled Linear GEMMs, as TE's MXFP8BlockScaling and NVFP4BlockScaling recipes
// (core/block_linear.h).
enum class Precision { fp32, fp16, bf16, fp8, mxfp8, nvfp4 };
std::string_view precision_name(Precision p);  // "fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4"
// fp8, mxfp8 or nvfp4: bf16 autocast with the Linear GEMMs quantized (an Fp8Context, --fp8-keep-bf16).
inline bool quantized_linears(Precision p) { return p == Precision::fp8 || p == Precision::mxfp8 || p == Precision::nvfp4; }
Precision parse_precision(std::string_view name);  // Error listing the valid names

struct TrainConfig {
  std::string sample = "mlp";
  Precision precision = Precision::fp16;
  std::string device = "auto";  // auto: the GPU when one is present, else the CPU
  std::int64_t steps = 50;
  std::int64_t batch = 0;       // 0: the sample's default
  double lr = 0;                // 0: the sample's default
  std::uint64_t seed = 0;
  std::string out;              // trace path; "" writes no trace
  std::string probe = "health"; // off, dtype, health, full
  std::int64_t sample_every = 1;
  // The f32 twin (probes/twin.h): every twin_every-th step's f16/bf16 ops computed again in f32, into the
  // trace's /precision table (needs a trace and a probe level other than off). Never changes the run.
  bool twin = false;
  std::int64_t twin_every = 1;
  // With the twin: also every autograd node whose backward ran in f16/bf16 (its local error,
  // docs/twin-backward.md). false (--twin-forward-only): the forward ops only, at about half the twin's cost.
  bool twin_backward = true;
  // With the twin: also every forward op that ran in f32, computed again in f64 (--twin-f64; probes/twin.h,
  // TwinOptions::f32_in_f64): where f32 itself loses digits. Slower: f64 comparisons take the scalar path.
  bool twin_f64 = false;
  // --what-if mxfp8,nvfp4 (core/what_if.h, docs/fp8.md "What-if statistics"): on a bf16 or fp8 run, every bf16
  // Linear's operands are also quantized as these block-scaled formats' recipes would, for the probe's statistics
  // only; the run is unchanged. Comma-separated format names; "" measures nothing.
  std::string what_if;
  // --precision fp8 (docs/fp8.md): TransformerEngine's recipe for the FP8 Linear GEMMs; refused with another
  // precision when set to anything but the default.
  std::string fp8_recipe = "delayed";     // delayed or current
  std::string fp8_format = "hybrid";      // hybrid (E4M3 forward, E5M2 gradients) or e4m3
  std::int64_t fp8_amax_history = 1024;   // delayed scaling's amax history length
  std::string fp8_amax_algo = "max";      // max or most_recent
  std::int64_t fp8_margin = 0;            // scale = fp8_max / amax / 2^margin
  std::vector<std::string> fp8_keep_bf16; // module globs whose Linears stay bf16
  bool fp8_keep_first_last = false;       // the first and last nn::Linear (registration order) stay bf16
  // --precision mxfp8: the E8M0 block-scale rule, round-up (NVIDIA's) or floor (the OCP specification's).
  std::string mx_scale = "round-up";
  // --precision nvfp4: the random Hadamard transform on the wgrad operands (--nvfp4-no-rht turns it off).
  bool nvfp4_rht = true;
  std::string scenario;         // "" for none
  double init_scale = 65536.0;
  std::int64_t growth_interval = 2000;
  bool use_scaler = true;       // fp16 only: bf16 and fp32 never scale
  std::vector<std::string> autocast_fp32;  // module or op globs forced to f32
  double max_grad_norm = 1.0;   // clip_grad_norm_; 0 disables clipping
  std::string checkpoint;       // save here
  std::int64_t checkpoint_every = 0;  // 0: only at the end, when checkpoint is set
  // Keep every periodic checkpoint as well, beside the latest: kept_checkpoint_path(checkpoint, step).
  // `ampscope fix` re-runs from the last one before the first anomaly instead of from step 0.
  bool keep_checkpoints = false;
  std::string resume;           // load from here before training
  bool resume_allow_nonfinite = false;  // accept NaN/Inf in the resumed parameters or optimizer state
  bool model_allow_nonfinite = false;   // accept NaN/Inf in --model's weights (hf::LoadOptions::allow_nonfinite)
  std::string data_dir;         // MNIST IDX files for cnn
  std::string text_file;        // text for transformer
  bool zero_grad = true;        // scenarios may turn it off (no-zero-grad)
  // The configuration is one the scenario already shaped (a trace's recorded `config`, replayed by
  // `ampscope fix`): train() does not apply the scenario's configure() again, so a remedy may change what
  // it sets (the scaler of grad-underflow, zero_grad of no-zero-grad). The model, data and loss changes
  // of the scenario still apply.
  bool scenario_applied = false;
  // A Hugging Face model folder (--model: config.json + safetensors) trained instead of a sample, on the
  // token file `tokens_file` in windows of `context` tokens (0: the model's maximum, capped at 256).
  std::string model_dir;
  std::string tokens_file;
  std::int64_t context = 0;
  bool eval = false;            // forward passes only: no backward, no optimizer, no scaler
  std::string save_model;       // write the trained weights here at the end (a folder, the model's own layout)
  bool fp16_clamp = false;      // T5 folders: Hugging Face's clamp of inf hidden states to +-(65504 - 1000)
  // Data-parallel training (--ddp; docs/distributed.md): the group of processes this run is one rank of
  // (not owned; it outlives the run). With more than one rank every rank builds the same task, takes its
  // share of each global batch (`batch` rows), and the gradients are averaged over the ranks before the
  // scaler and the optimizer see them. Null, or a group of one: a single-process run, bit for bit as without.
  ProcessGroup* process_group = nullptr;
  bool ddp = false;  // --ddp: the command makes the process group (also made when an MPI launcher started it)
  // ZeRO-1 (--shard-optimizer; core/distributed/zero_optimizer.h): with more than one rank, each rank keeps and updates
  // the optimizer state of its shard of the parameters only, and the updated parameters are broadcast from
  // their owners; bit for bit the unsharded run. With one rank (or no group) the shard is the whole state.
  bool shard_optimizer = false;
  // Keep each step's loss and scale in TrainResult::losses and scales: 16 bytes a step for the whole run (1.6 MB
  // per 100,000 steps), which a long run that does not read them (`ampscope train`: on_step sees each step)
  // should not hold. Off: both stay empty.
  bool keep_losses = true;
};

struct Batch {
  Tensor x;
  Tensor y;
  Tensor decoder_input;  // an encoder-decoder model's second input; undefined for the others
};

// What a run trains: a model, its data and its loss. The samples (samples/tasks.cpp), the scenarios'
// variants of them and the architectures loaded from Hugging Face folders (samples/model_task.cpp) all
// implement it; the run (train()) sets up, steps and saves over it and knows none of them. Data are
// deterministic functions of the step (and the seed the task was built with), so a resumed run sees
// the same batches.
class SampleTask {
 public:
  virtual ~SampleTask() = default;
  virtual nn::Module& model() = 0;
  virtual Batch batch(std::int64_t step) = 0;
  virtual Tensor loss(const Tensor& output, const Tensor& y) = 0;
  virtual double default_lr() const = 0;
  // The model's output for a batch: model()(batch.x), unless the model takes more than one input.
  virtual Tensor forward(const Batch& batch) { return model()(batch.x); }
  // What the run trains, for checkpoints (a resumed run must train the same thing) and the trace's
  // model field: the sample's name, or "gpt2", "llama", ... for a model folder.
  virtual std::string identity() const = 0;
  // Writes the weights (--save-model): DIR/model.safetensors with every parameter under its name, unless
  // the task has a layout of its own (a model folder writes config.json and the checkpoint's names).
  virtual void save_model(const std::filesystem::path& folder);
};

// The task a configuration trains: the model folder's (model_dir), the scenario's variant, or the sample's.
// `warnings` receives what the run should say at its end (unexpected weights in a checkpoint, ...).
std::unique_ptr<SampleTask> make_task(const TrainConfig& config, Generator& gen, std::vector<std::string>& warnings);
// The task of a Hugging Face model folder (config.model_dir) on config.tokens_file (samples/model_task.cpp).
std::unique_ptr<SampleTask> make_model_task(const TrainConfig& config, std::vector<std::string>& warnings);

struct SampleInfo {
  std::string name;
  std::string description;
  std::int64_t default_batch;
  std::function<std::unique_ptr<SampleTask>(const TrainConfig&, Generator&)> make;
};
const std::vector<SampleInfo>& sample_registry();
const SampleInfo& find_sample(std::string_view name);  // Error: "unknown sample 'x'; known: mlp, cnn, transformer"

// A failure scenario: changes to the configuration, the model, the data or the loss that reproduce a
// failure people hit in real training (docs/scenarios.md). Defined in samples/scenarios.cpp.
struct Scenario {
  std::string name;
  std::string description;   // one line for --list-scenarios
  std::string sample;        // the sample it is written for
  std::string expect;        // what the trace shows: op, module and kind of the first anomaly
  // Builds the task instead of the sample's own (a model variant the failure needs); optional.
  std::function<std::unique_ptr<SampleTask>(const TrainConfig&, Generator&)> make_task;
  // Adjusts the configuration before anything is built (no scaler, a high lr, ...).
  std::function<void(TrainConfig&)> configure;
  // Changes the freshly built task (weights, data) before training.
  std::function<void(SampleTask&, Generator&)> prepare;
  // Replaces task.loss when set (a hand-written loss that underflows).
  std::function<Tensor(SampleTask&, const Tensor& output, const Tensor& y)> loss;
};
const std::vector<Scenario>& scenario_registry();
const Scenario& find_scenario(std::string_view name);

}  // namespace ampscope::samples
