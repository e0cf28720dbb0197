// cli/run.h: the training loop behind `ampscope train`: a task (samples/task.h: model, data, loss), a
// precision, an optional failure scenario, the GradScaler, the probe and the trace, checkpoints, and progress.
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
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/block_recipe.h"
#include "samples/task.h"

namespace ampscope::samples {

// What the loop reports after each step (for progress and tests).
struct StepReport {
  std::int64_t step = 0;        // 0-based
  std::int64_t total = 0;
  double loss = 0;
  double scale = 1;
  bool skipped = false;
  std::int64_t skipped_so_far = 0;
  std::int64_t anomalies_so_far = 0;
  double seconds = 0;           // since training started
};

struct TrainResult {
  std::string sample;           // as trained (a scenario may choose it)
  std::string scenario;
  std::int64_t steps = 0;       // steps run in this call
  std::int64_t skipped = 0;
  std::int64_t anomalies = 0;   // anomaly events the probe recorded
  double final_loss = 0;
  double final_scale = 1;
  std::string trace;            // path written, or ""
  bool interrupted = false;     // stopped early by the stop flag
  std::vector<std::string> warnings;  // one line each, for the end of the run (unmatched globs, ...)
  std::vector<double> losses;   // per step (with TrainConfig::keep_losses, the default)
  std::vector<double> scales;   // per step, the scale used (likewise)
  // Elements of optimizer state this rank held at the end (core/distributed/zero_optimizer.h's
  // optimizer_state_elements): with --shard-optimizer, its shard's only.
  std::int64_t optimizer_state_elements = 0;
};

// Where rank `rank` of a data-parallel run writes its trace: "run.h5", 1 -> "run.rank1.h5".
std::string rank_trace_path(const std::string& out, int rank);

// The rows of a global batch of `batch` rows that rank `rank` of `ranks` trains on: [r*B/N, (r+1)*B/N).
// Throws Error naming both numbers when the batch does not split evenly.
std::pair<std::int64_t, std::int64_t> rank_rows(std::int64_t batch, int rank, int ranks);

// Where a kept periodic checkpoint goes: "run/ck.h5", 40 -> "run/ck.step-40.h5" (the state before step 40).
std::string kept_checkpoint_path(const std::string& checkpoint, std::int64_t step);

// What --precision fp8, mxfp8 and nvfp4 cannot be combined with yet, checked before anything runs (train() checks
// it again): an option of one of them with a precision it does not apply to (--fp8-recipe, --fp8-format,
// --fp8-amax-*, --fp8-margin: fp8 only; --fp8-keep-*: fp8, mxfp8, nvfp4; --mx-scale: mxfp8; --nvfp4-no-rht: nvfp4),
// a CUDA device, and --twin with mxfp8 or nvfp4. Throws Error naming the option and what to do instead.
// (--resume restores the recipe's state from the checkpoint: core/io/fp8_checkpoint.h.)
void check_fp8_run(const TrainConfig& config);

// A run leaving the quantized precisions (the fp32 run of `train --compare`, fix's fp32 and bf16 references and its
// bf16 remedy) drops the options only those precisions take, which train refuses with another precision: the
// --fp8-* recipe options unless fp8, --fp8-keep-* unless fp8/mxfp8/nvfp4, --mx-scale unless mxfp8, --nvfp4-no-rht
// unless nvfp4, and --what-if unless fp8 (an fp32 or fp16 run refuses it, and the references measure the run, which
// is the same without it).
void leave_quantized_options(TrainConfig& config);

// --what-if's formats, in the order given ("mxfp8,nvfp4"; spaces around names allowed, a repeat counted once); empty
// for "". Throws Error naming a name that is not mxfp8 or nvfp4, with "did you mean" for a near miss.
std::vector<BlockFormat> what_if_formats(const std::string& what_if);

// What --what-if needs, checked before anything runs (train() checks it again): valid names, a bf16 or fp8 run (the
// formats' real runs are bf16 autocast with block-scaled Linears: an fp32 run has no bf16 Linear to measure, an fp16
// one measures other values), and a trace to record into (--out, a probe level other than off).
void check_what_if_run(const TrainConfig& config);

// Runs the training. `stop` (optional) is polled at every step boundary: set it from a signal handler
// to end cleanly with a complete trace.
TrainResult train(const TrainConfig& config, const std::function<void(const StepReport&)>& on_step = {},
                  const std::atomic<bool>* stop = nullptr);

}  // namespace ampscope::samples
