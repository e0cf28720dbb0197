// core/grad_scaler.h: PyTorch's GradScaler (torch.amp.GradScaler): dynamic loss scaling for f16
// training, with its per-optimizer state machine, error texts, update rule and state_dict, plus the
// loss-scaling rules of Megatron-LM and DeepSpeed as opt-in extensions. Specification:
// reference/amp-semantics.md sections 1 and 4. Every update() is reported to the probe hook
// (core/probe_hook.h) when one is installed.
//
//   GradScaler scaler({.device = "cpu"});               // PyTorch's defaults: 65536, x2 every 2000, x0.5
//   for (...) {
//     opt.zero_grad();
//     Tensor loss = cross_entropy((*model)(x), y);
//     scaler.scale(loss).backward();                   // gradients of loss * 65536
//     scaler.unscale_(opt);                            // optional: gradients back to their true values
//     optim::clip_grad_norm_(model->parameters(), 1.0);
//     scaler.step(opt);                                // skipped when a gradient was inf or NaN
//     scaler.update();                                 // backs off or grows the scale
//   }
//
// Megatron-style hysteresis (back off only on the second overflow since the last growth):
//   GradScaler megatron({.device = "cpu", .extensions = {.hysteresis = 2, .min_scale = 1.0}});
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/optim.h"
#include "core/probe_hook.h"
#include "core/io/state_dict.h"
#include "core/tensor.h"

namespace ampscope {

class ProcessGroup;  // core/distributed/process_group.h

// A GradScaler used out of order (unscale_ twice, step before scale, update with nothing recorded), a
// configuration it refuses, a state dict it cannot load, or a scale that cannot go lower. The message
// starts with PyTorch's own text (or DeepSpeed's, for the minimum scale), then names the optimizer or
// values involved.
class GradScalerError : public Error {
 public:
  using Error::Error;
};

// Loss-scaling rules beyond PyTorch's, all off by default (reference section 4). With the defaults the
// scaler is exactly torch.amp.GradScaler.
struct LossScaleExtensions {
  // Megatron's hysteresis, DeepSpeed's delayed_shift: an overflow backs the scale off only when the
  // hysteresis tracker is down to 1; otherwise it only decrements the tracker (the step is still
  // skipped). A growth refills the tracker. 1 = off.
  std::int64_t hysteresis = 1;
  // DeepSpeed's consecutive_hysteresis: every clean step refills the tracker, so only `hysteresis`
  // overflows in a row back off.
  bool consecutive_hysteresis = false;
  // Bounds of the scale: a backoff never goes below min_scale, a growth never above max_scale (Apex
  // caps at 2^24). Unset = unbounded, as in PyTorch.
  std::optional<double> min_scale{};
  std::optional<double> max_scale{};
  // DeepSpeed's raise_error_at_min_scale: a backoff due while the scale already equals min_scale throws
  // "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run." Needs min_scale.
  bool raise_at_min_scale = false;

  bool any() const {
    return hysteresis != 1 || consecutive_hysteresis || min_scale || max_scale || raise_at_min_scale;
  }
};

// torch.amp.GradScaler's constructor arguments, with its defaults. `device` is the device type the
// scaler is for ("cuda" or "cpu"); its state lives on the device of the first tensor scale() sees.
// "cuda" without a usable GPU prints a warning and disables the scaler, as PyTorch does; use "cpu" to
// scale on the CPU backend.
struct GradScalerOptions {
  std::string device = "cuda";
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
  LossScaleExtensions extensions{};
  // Data parallelism: unscale_ all-reduces each found_inf with max over this group (not owned; it must
  // outlive the scaler) before anything reads it, so that every rank skips the same steps, as PyTorch's
  // ShardedGradScaler does. Every rank must then unscale_ the same optimizers in the same order, with
  // gradients on the same number of devices. Null (or a group of one): this process's found_inf only.
  ProcessGroup* process_group = nullptr;
};

// Megatron-LM's DynamicGradScaler as Megatron configures it for f16: initial 2^32, min 1, growth 2,
// backoff 0.5, interval 1000, hysteresis 2. Set .device before use.
GradScalerOptions megatron_scaler_options();
// DeepSpeed's DynamicLossScaler with its fp16 config defaults: initial 2^16, window 1000, hysteresis 2,
// min 1, raise at the minimum. Set .device (and .extensions.consecutive_hysteresis) as needed.
GradScalerOptions deepspeed_scaler_options();

// torch._amp_foreach_non_finite_check_and_unscale_: sets found_inf to 1 when any element of any grad is
// inf or NaN, and multiplies every grad in place by inv_scale (unless it is exactly 1), non-finite
// elements included. found_inf and inv_scale: 1-element f32 on the grads' device; found_inf is only ever
// set, never cleared. Grads: f32, f64, f16 or bf16 (mixed dtypes allowed), all on one device.
void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, Tensor& found_inf, const Tensor& inv_scale);

// scaler.step(opt, return_found_inf) is PyTorch's step(..., return_found_inf=True).
struct ReturnFoundInf {};
inline constexpr ReturnFoundInf return_found_inf{};

struct StepResult {
  bool stepped = false;    // the optimizer's step() ran
  bool found_inf = false;  // this optimizer's gradients held inf or NaN
};

class GradScaler {
 public:
  // Throws GradScalerError "The growth factor must be > 1.0." / "The backoff factor must be < 1.0."
  // (and for invalid extensions) when enabled; a disabled scaler checks nothing.
  explicit GradScaler(GradScalerOptions options = {});

  // Copies are PyTorch's pickling (and deepcopy): allowed only between iterations (no optimizer
  // unscaled or stepped since the last update()); the copy starts from the current scale and trackers,
  // its tensors re-created by its first scale().
  GradScaler(const GradScaler& other);
  GradScaler& operator=(const GradScaler& other);
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  // outputs * scale, where scale is a 0-dim f32 tensor: an f32 loss stays f32, a 0-dim f16 loss becomes
  // f32, a dimensioned f16 tensor stays f16 (PyTorch's promotion). Creates the scale on the output's
  // device at the first call. Disabled: returns outputs unchanged.
  Tensor scale(const Tensor& outputs);
  // Each tensor times the scale; the state is created on the first tensor's device.
  std::vector<Tensor> scale(const std::vector<Tensor>& outputs);

  // Divides the optimizer's gradients by the scale in place (multiplies by float(1 / double(scale)))
  // and records whether any was inf or NaN. At most once per optimizer per iteration, before step().
  void unscale_(optim::Optimizer& optimizer);

  // Unscales (unless unscale_ already did), then runs optimizer.step() unless this optimizer's
  // gradients held inf or NaN. Returns whether the optimizer stepped. Disabled: optimizer.step().
  bool step(optim::Optimizer& optimizer);
  StepResult step(optim::Optimizer& optimizer, ReturnFoundInf);
  // optimizer.step(closure) of PyTorch: refused while enabled ("Closure use is not currently supported
  // if GradScaler is enabled."); disabled, runs the closure, steps, and returns the closure's loss.
  Tensor step(optim::Optimizer& optimizer, const std::function<Tensor()>& closure);

  // Applies the update rule to the scale with the overflows recorded by every optimizer this
  // iteration, then starts the next iteration. Once per iteration, after the steps.
  void update();
  // Sets the scale (rounded to f32); the trackers keep their values.
  void update(double new_scale);
  // Same, from a 1-element tensor on the scaler's device type that does not require grad.
  void update(const Tensor& new_scale);

  // The scale the next iteration uses: init_scale before the first scale(); 1.0 when disabled.
  double get_scale() const;
  double get_growth_factor() const { return growth_factor_; }
  void set_growth_factor(double factor) { growth_factor_ = factor; }  // unchecked, as in PyTorch
  double get_backoff_factor() const { return backoff_factor_; }
  void set_backoff_factor(double factor) { backoff_factor_ = factor; }
  std::int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_interval(std::int64_t interval) { growth_interval_ = interval; }
  // PyTorch's _get_growth_tracker(): clean steps since the last growth or overflow (0 when disabled).
  std::int64_t get_growth_tracker() const;
  // Overflows still tolerated before a backoff (the extensions' hysteresis); -1 while hysteresis is off.
  std::int64_t get_hysteresis_tracker() const;
  bool is_enabled() const { return enabled_; }
  const LossScaleExtensions& extensions() const { return extensions_; }
  // Why a scaler asked to be enabled is not (no usable GPU for "cuda"); empty otherwise.
  const std::string& disabled_reason() const { return disabled_reason_; }

  // {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}, PyTorch's keys
  // and types, plus "hysteresis", "consecutive_hysteresis", "raise_at_min_scale", "min_scale",
  // "max_scale" (the last two when set) and "_hysteresis_tracker" when extensions are on. Disabled: {}.
  StateDict state_dict() const;
  // Loads what state_dict() wrote (also into a scaler configured differently, before or after its first
  // scale()). A dict without extension keys keeps this scaler's extensions and refills its hysteresis
  // tracker. Disabled: does nothing.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct OptimizerState {
    const optim::Optimizer* optimizer = nullptr;
    std::size_t order = 0;  // k in the name "SGD #k": the optimizer's order of first use by this scaler
    Stage stage = Stage::ready;
    std::vector<std::pair<Device, Tensor>> found_inf_per_device;  // devices that had gradients
    std::optional<bool> found;  // found_inf read on the host, once step() or update() needed it
    bool skipped = false;       // step() ran and did not call the optimizer's step
    std::vector<probe::NonFiniteGrad> non_finite;  // only with a probe hook and an overflow
  };

  OptimizerState& state_of(const optim::Optimizer& optimizer);
  void check_scale_growth_tracker(const char* function) const;
  void lazy_init(Device device);
  bool read_found(OptimizerState& state) const;
  void set_scale(double value);
  void emit_event(double scale_used, probe::ScalerEvent::Change change);
  std::string optimizer_label(const OptimizerState& state) const;

  DeviceType device_type_ = DeviceType::cuda;
  bool enabled_ = true;
  std::string disabled_reason_;
  double init_scale_ = 65536.0;
  double growth_factor_ = 2.0;
  double backoff_factor_ = 0.5;
  std::int64_t growth_interval_ = 2000;
  std::int64_t init_growth_tracker_ = 0;
  LossScaleExtensions extensions_;
  ProcessGroup* process_group_ = nullptr;
  std::int64_t init_hysteresis_tracker_ = 1;

  // The lazy state. PyTorch keeps the scale and an int32 growth tracker as device tensors so that its
  // update can run on the device without a host sync. The scale stays a 0-dim f32 tensor here because
  // scale() multiplies by it (that is what gives PyTorch's type promotion); scale_value_ mirrors it on
  // the host (every write goes through this class), so unscale_ needs no sync. The trackers are host
  // integers: update() reads found_inf on the host anyway, for the probe event and the extensions,
  // which are host logic in Megatron and DeepSpeed too. Absent (undefined / nullopt) until scale().
  Tensor scale_;
  float scale_value_ = 0.0f;
  std::optional<std::int64_t> growth_tracker_;
  std::int64_t hysteresis_tracker_ = 1;

  std::deque<OptimizerState> per_optimizer_states_;      // this iteration; references stay valid
  std::map<const optim::Optimizer*, std::size_t> order_;  // every optimizer this scaler has seen
  std::int64_t iteration_ = 0;                            // update() calls so far
};

}  // namespace ampscope
