// core/probe_hook.h: what the runtime tells a probe, and how a probe listens. Core calls the installed
// hook; probes/ (statistics, recorder, HDF5 trace) implements it. Nothing here costs anything while no
// hook is installed, and a hook is asked first whether it wants an op at all (wants_op), so unwatched
// ops cost one virtual call.
//
//   struct Printer : probe::Hook {
//     void on_op(const probe::OpEvent& e) override { fmt::print("{} ran in {}\n", e.op, dtype_name(e.output.dtype())); }
//   };
//   probe::HookGuard guard(std::make_shared<Printer>());   // installed until guard goes out of scope
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace ampscope {
struct BlockStats;  // core/block_stats.h
}

namespace ampscope::probe {

// The autocast policies (reference/amp-semantics.md 2.3), plus `none` for ops on no list and for ops
// run outside autocast.
enum class AutocastPolicy { none, lower_precision_fp, fp32, fp32_set_opt_dtype, promote, banned };
std::string_view policy_name(AutocastPolicy policy);  // "lower_precision_fp", ...

// What part of a training step an event belongs to.
enum class Phase : std::uint8_t { forward, backward, optimizer, scaler };
std::string_view phase_name(Phase phase);  // "forward", "backward", "optimizer", "scaler"

// A cast autocast inserted in front of an op: input `input` went from `from` to `to`; `from_cache`
// when the weight-cast cache supplied it (the same cast tensor as an earlier op's). `source` and
// `result` are the tensors before and after (for counting values the cast overflowed or flushed).
struct CastRecord {
  int input = 0;
  DType from = DType::f32;
  DType to = DType::f32;
  bool from_cache = false;
  Tensor source{};
  Tensor result{};
};

// Why an op ran in the dtype it ran in.
struct AutocastInfo {
  bool active = false;                    // an autocast region was enabled for this op
  AutocastPolicy policy = AutocastPolicy::none;
  bool overridden = false;                // a user override (op name or module pattern) decided the dtype
  std::string reason;                     // "linear is on the lower_precision_fp list", "override 'blocks.*' -> f32"
  std::vector<CastRecord> casts;
};

// Provenance: while a hook is installed, the dispatcher and the autograd engine stamp every tensor a
// reported op writes (Tensor::set_producer) with the step and the seq of that op, after the hook has seen
// the op, so a probe can say which row produced each input of a later op. The seq is the op's seq, or:
struct Producer {
  static constexpr std::int64_t none = -1;        // no reported op wrote the tensor (data, constants, parameters)
  static constexpr std::int64_t unrecorded = -2;  // a reported op the hook did not want (filtered, not sampled)
  static constexpr std::int64_t summed = -3;      // backward: the sum of the gradients several nodes produced
};

// One op as the user called it (ops that an op calls internally are not reported separately), or, in
// the backward phase, one autograd node: then `op` is the forward op's name, `inputs` holds the
// gradient of its output and `outputs` the gradients of its inputs (undefined where none flows).
struct OpEvent {
  std::string_view op;           // "linear"
  const std::string& scope;      // module path, "" outside modules
  std::uint64_t index;           // running count of reported ops in this process
  std::int64_t step;             // the step set by StepScope (or set_step), -1 outside steps
  std::int64_t seq;              // order within the step, forward and backward events together
  Phase phase;
  const AutocastInfo& autocast;
  const std::vector<Tensor>& inputs;  // after autocast's casts; undefined for absent optional inputs
  const Tensor& output;               // the (first) output
  const std::vector<Tensor>& outputs; // every output (one for forward ops)
  // Forward ops whose body can run again (null for backward nodes and for ops dispatched without one:
  // "to", max/min along a dim): runs the op's body on other inputs (same count and order, any dtype the
  // op accepts) with the op's own scalar arguments, with autocast off, reporting nothing. A hook may call
  // it only from on_op, and only on ops that draw no random numbers (dropout would advance its generator).
  // The f32 twin (probes/twin.h) uses it.
  const std::function<Tensor(const std::vector<Tensor>&)>* recompute = nullptr;
  // Backward nodes (null for forward ops): runs the node's backward again on another incoming gradient (the
  // shape of inputs[0], any floating dtype) in `to` (f32, or f64): every tensor of a narrower floating dtype its
  // computation reads (the gradient, the node's saved tensors) widened exactly and every result made in `to`
  // (autograd::WidenTo), nothing reported. Returns one gradient per input, as `outputs` (undefined where none
  // flows). A hook may call it only from on_backward_op. The twin's backward (probes/twin.h) uses it.
  const std::function<std::vector<Tensor>(const Tensor&, DType)>* recompute_backward = nullptr;
};

// Gradients of parameters, reported after backward: by the GradScaler before and after unscale_, or by
// the training loop (report_grads) when it runs without a scaler.
struct GradEvent {
  std::int64_t step;
  bool unscaled;  // false: still multiplied by the loss scale
  const std::vector<std::pair<std::string, Tensor>>& grads;  // (parameter name, gradient)
  // A data-parallel rank's own gradients before the all-reduce (report_grads(..., before_all_reduce = true),
  // cli/run.cpp under --ddp); false for the gradients the step uses.
  bool before_all_reduce = false;
};

// The parameters after a step's optimizer step (and the GradScaler's update), reported by probe::Step::finish
// every step, sampled or not, to a hook whose wants_params() is true (the probe's parameter checksums).
struct ParamsEvent {
  std::int64_t step;
  const std::vector<std::pair<std::string, Tensor>>& params;  // (parameter name, parameter), the optimizer's order
};

// What the training loop knows at the end of a step (one row of a trace's /steps table).
struct StepSummary {
  std::int64_t step = 0;
  double loss = 0;
  double scale = 1;        // the scale this step's backward used (1 without a scaler)
  double scale_after = 1;  // after update()
  bool found_inf = false;
  bool skipped = false;
  std::int64_t growth_tracker = 0;
  double grad_norm = 0;    // unscaled
  double lr = 0;
  double time_ms = 0;
};

// A parameter whose gradient held non-finite values when the GradScaler unscaled it.
struct NonFiniteGrad {
  std::string name;  // Tensor::name(), or "group g, parameter i" when unnamed
  std::int64_t inf_count = 0;
  std::int64_t nan_count = 0;
};

// What the GradScaler did for one optimizer this iteration.
struct ScalerOptimizerReport {
  std::string optimizer;  // "Adam #0": the optimizer's name and its order of first use by this scaler
  bool found_inf = false;
  bool skipped = false;   // step() did not call the optimizer's step
  std::vector<NonFiniteGrad> non_finite;
};

// One GradScaler update(): the scale used for this iteration and what happened to it.
struct ScalerEvent {
  std::int64_t iteration = 0;      // number of update() calls before this one
  double scale = 0;                // the scale the iteration's loss was multiplied by
  std::vector<ScalerOptimizerReport> optimizers;
  enum class Change { kept, growth, backoff, explicit_scale } change = Change::kept;
  double new_scale = 0;
  std::int64_t growth_tracker = 0;      // after the update
  std::int64_t hysteresis_tracker = -1; // after the update; -1 when hysteresis is off
};
std::string_view change_name(ScalerEvent::Change change);  // "kept", "growth", "backoff", "explicit_scale"

// One parameter stored in f16 or bf16 that an optimizer (SGD, Adam, AdamW) is about to update, reported
// only while a hook is installed: `before` holds the parameter's values, `update` the value u the optimizer
// adds to each (in f32, the optimizer's arithmetic type: -lr * g for SGD, -step_size * m / denom for Adam),
// `after` what p + u rounds to in the parameter's dtype (what the parameter will hold; AdamW's decoupled
// weight decay is already in `before`). An element's update is *swamped* when u != 0 and after == before:
// the update was lost to rounding. The three tensors have the parameter's shape; the hook may read them.
// The optimizer's own part: its name, and for Adam and AdamW the eps added to the denominator and the second
// moment v it took the square root of (exp_avg_sq, or amsgrad's maximum), in the state's dtype; with them a
// hook can say why an update turned out NaN or infinite (an eps that is 0 in f16 over a v of 0).
struct UpdateEvent {
  std::int64_t step;          // current_step()
  const std::string& param;   // Tensor::name(), or "group g, parameter i" when unnamed
  const Tensor& before;
  const Tensor& update;
  const Tensor& after;
  std::string_view optimizer = {};                   // "SGD", "Adam", "AdamW"
  double eps = std::numeric_limits<double>::quiet_NaN();  // Adam, AdamW; NaN for SGD
  const Tensor* second_moment = nullptr;             // Adam, AdamW; null for SGD
};

// One operand of an FP8 Linear just quantized (core/fp8_linear.h fp8_quantize_operand, under --precision fp8):
// the unquantized values (f32, row-major), the codes they became, the format ("e4m3", "e5m2") and the recipe's
// numbers for this cast. Reported only while a hook is installed; the hook may read the spans during the call.
struct Fp8QuantizeEvent {
  std::int64_t step;               // current_step()
  const std::string& module;       // the Linear's module path
  std::string_view operand;        // "input", "weight", "grad_output"
  std::string_view format;         // "e4m3", "e5m2"
  std::span<const float> values;   // the unquantized operand, as f32
  std::span<const std::uint8_t> codes;
  float amax = 0;                  // max |x|, NaN skipped, as the recipe recorded it
  float scale = 1;                 // q = satfinite(RNE(x * scale))
  float scale_inv = 1;             // x ~ decode(q) * scale_inv
  // Delayed scaling: the operand's amax history just after this cast folded its amax into slot 0 (core/fp8_recipe.h
  // DelayedScalingState: [0] this step, [1 .. len-1] earlier steps, oldest first), and whether the recipe reduces it
  // by most_recent rather than max. Empty under current scaling.
  std::span<const float> amax_history = {};
  bool most_recent = false;
};

// A GEMM operand quantized to a block-scaled format: by a --precision mxfp8|nvfp4 run's Linear, or (what_if) only
// measured, on a run that trains in another precision, for --what-if (core/block_stats.h).
struct BlockQuantizeEvent {
  std::int64_t step;              // current_step()
  const std::string& module;      // the Linear's module path
  std::string_view operand;       // "input", "weight", "grad_output"
  std::string_view copy;          // "rowwise" (blocks along each row) or "columnwise" (down each column)
  std::string_view format;        // "mxfp8" or "nvfp4"
  bool what_if = false;           // statistics only: the run's GEMM did not use this quantization
  std::int64_t rows = 0, cols = 0;  // the quantized matrix
  const BlockStats& stats;
  // The copy the run's GEMM used (empty for what_if events): each element decoded times its block's scale, in the
  // quantized matrix's layout ([rows, cols] row-major: an MXFP8 columnwise copy is the [R, C] operand blocked down its
  // columns, an NVFP4 columnwise copy its transpose [C, R], after the Hadamard transform where applied), exact in f32;
  // and NVFP4's per-tensor decode scale, which the GEMM applies to its sum (1 for MXFP8). The f32 twin (probes/twin.h,
  // "Block-scaled Linears") rebuilds the GEMM from them. The hook may read the span during the call.
  std::span<const float> decoded = {};
  float global_decode = 1.0f;
};

class Hook {
 public:
  virtual ~Hook() = default;
  // Asked before an op's event is built (forward ops and backward nodes alike); return false to skip
  // it at no further cost.
  virtual bool wants_op(std::string_view op, const std::string& scope) { return true; }
  // Before a wanted forward op runs (for timing and ordering); the event follows in on_op.
  virtual void before_op(std::string_view op, const std::string& scope) {}
  virtual void on_op(const OpEvent& event) {}            // forward ops the user called
  virtual void on_backward_op(const OpEvent& event) {}   // autograd nodes as backward runs them
  virtual void on_grads(const GradEvent& event) {}
  virtual void on_scaler(const ScalerEvent& event) {}
  // An f16/bf16 parameter's update, before the optimizer writes it (see UpdateEvent).
  virtual void on_update(const UpdateEvent& event) {}
  // An FP8 Linear's operand, just quantized (see Fp8QuantizeEvent).
  virtual void on_fp8_quantize(const Fp8QuantizeEvent& event) {}
  // A block-scaled operand, quantized or measured (see BlockQuantizeEvent).
  virtual void on_block_quantize(const BlockQuantizeEvent& event) {}
  // Whether the hook wants the parameters after every optimizer step (on_params). Asked once per step.
  virtual bool wants_params() { return false; }
  virtual void on_params(const ParamsEvent& event) {}
  virtual void on_step_begin(std::int64_t step) {}
  virtual void on_step_end(const StepSummary& summary) {}
  // A step that ended without a summary: its StepScope (or probe::Step) was destroyed before end(),
  // typically because the loop's code threw. The hook closes the step; later events belong to no step.
  virtual void on_step_abandoned(std::int64_t step) {}
};

// The installed hook (process-wide), or null. Install with a HookGuard, or set_hook(nullptr) to remove.
Hook* hook();
void set_hook(std::shared_ptr<Hook> hook);

// ---- the run's clock: which step events belong to ----
std::int64_t current_step();  // -1 outside steps
std::int64_t next_seq();      // the next sequence number within the current step

// Marks a training step: sets the step (and resets the sequence) and tells the hook; end() reports
// the step's summary. The training loop owns one per step; probe::Step (core/training_step.h) owns one
// and fills the summary itself, which is what a loop should use.
class StepScope {
 public:
  explicit StepScope(std::int64_t step);
  // Ends the step: without end() (an exception left the step, or the loop never called it), the hook
  // hears on_step_abandoned and the step has no summary. Never throws: a hook's error is swallowed here.
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  void end(const StepSummary& summary);

 private:
  std::int64_t step_;
  bool ended_ = false;
};

// Reports parameter gradients to the hook, if one is installed (named by Tensor::name()). The GradScaler
// calls it from unscale_; probe::Step calls it for a loop without a scaler.
// A data-parallel training loop also reports each rank's own gradients before its all-reduce, with
// before_all_reduce = true (they do not count as the step's reported gradients).
void report_grads(const std::vector<Tensor>& params, bool unscaled, bool before_all_reduce = false);
// Reports the parameters to the hook when one is installed and wants_params() (probe::Step::finish calls it
// after the optimizer step).
void report_params(const std::vector<Tensor>& params);
// Whether report_grads(..., unscaled=true) has reached a hook in the open step (false outside steps).
bool unscaled_grads_reported();

namespace detail {
// Optimizer::step() and GradScaler::update() note themselves in the open step, so probe::Step can refuse
// to step an optimizer or update a scaler that the loop already stepped or updated in this step (which
// would silently unscale the gradients twice and take two steps). Outside steps nothing is noted.
void note_acted(const void* object);
bool acted_in_open_step(const void* object);
}  // namespace detail

// Installs `hook` (null: none) until the guard goes out of scope, then reinstalls the previous one.
class HookGuard {
 public:
  explicit HookGuard(std::shared_ptr<Hook> hook);
  ~HookGuard();
  HookGuard(const HookGuard&) = delete;
  HookGuard& operator=(const HookGuard&) = delete;

 private:
  std::shared_ptr<Hook> previous_;
};

// Pauses the probe for a stretch of code, inside a step or outside: the installed hook hears nothing
// (no op, gradient, scaler or step event) until the guard goes out of scope, exceptions included, and
// is then reinstalled. For work that must not be in the trace (a metric, a validation pass, a check).
// Tensors made while paused carry no producer: later ops see them as data (trace::kInputData).
//   { probe::Paused paused;  accuracy = evaluate(model, held_out); }
class Paused {
 public:
  Paused() : guard_(nullptr) {}
  Paused(const Paused&) = delete;
  Paused& operator=(const Paused&) = delete;

 private:
  HookGuard guard_;
};

}  // namespace ampscope::probe
