#include "core/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/distributed/process_group.h"

namespace ampscope {

namespace {

constexpr const char* kScaleNoneFix =
    "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration.";

// A 0-dim f32 value that is 0 when every element of `grad` is finite and NaN otherwise: x - x is 0 for
// every finite x and NaN for inf and NaN, and a sum of zeros and NaNs can neither overflow nor cancel.
// One element-wise op and one reduction on the gradient's device, without a comparison op.
// PyTorch's kernel tests finiteness on a float even for f64 gradients (isfinite_ensure_cuda_math takes
// a float), so an f64 value beyond the f32 range counts as non-finite; we copy that.
Tensor non_finite_flag(const Tensor& grad) {
  const Tensor x = grad.dtype() == DType::f64 ? grad.to(DType::f32) : grad;
  return sum(sub(x, x), DType::f32);
}

// grad *= inv_scale in place, in the kernel's op-math type (float; double for f64) and rounded once,
// which is what mul with a scalar computes; 1 is PyTorch's exact pass-through (NaN payloads kept).
// Our NaN results are the canonical NaN, where the GPU would keep the payload through the multiply.
void unscale_in_place(Tensor& grad, float inv_scale) {
  if (inv_scale == 1.0f) return;
  grad.copy_(mul(grad, static_cast<double>(inv_scale)));
}

// Sets found_inf (any shape with one element) to 1 where `flags` (a sum of non_finite_flag values) is
// NaN, on the device: float -> bool is x != 0, so NaN is true.
void set_found_inf(Tensor& found_inf, const Tensor& flags) {
  found_inf.copy_(masked_fill(found_inf, flags.to(DType::boolean), 1.0));  // a 0-dim mask broadcasts
}

// The GPU fast path (issue 10): where the gradients' backend has fused AMP kernels (the CUDA backend,
// core/backend.h: fused_amp_available), one multi-tensor launch sets found_inf and unscales them all,
// with the bits of the unfused ops above. Not while a probe listens: it wants each gradient's own flag
// and sees the gradients before unscaling. Returns false (nothing done) where the unfused path must run:
// CPU tensors always.
bool try_fused_unscale(Device device, const std::vector<Tensor>& grads, Tensor& found_inf, float inv_scale,
                       bool probe_listening) {
  if (probe_listening) return false;
  Backend& backend = backend_for(device);
  if (!backend.fused_amp_available()) return false;
  std::vector<TensorView> views;
  for (const Tensor& g : grads) {
    if (!g.is_contiguous()) return false;
    views.push_back(g.kernel_view());
  }
  backend.fused_non_finite_check_and_unscale(views, static_cast<float*>(found_inf.data()), inv_scale);
  return true;
}

// Inf and NaN counts of one gradient, on the host, judged on floats as the kernel judges them. Only
// run for gradients whose flag said so, and only while a probe listens.
probe::NonFiniteGrad count_non_finite(const Tensor& grad, std::string name) {
  probe::NonFiniteGrad out{std::move(name)};
  for (double v : grad.values()) {
    const float f = static_cast<float>(v);
    if (std::isnan(f)) {
      ++out.nan_count;
    } else if (std::isinf(f)) {
      ++out.inf_count;
    }
  }
  return out;
}

// A double as Python's str() writes it ("65536.0", "1e-05", "inf"), so values read as PyTorch's.
std::string py_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";
  return s;
}

double number(const StateDict& state, const char* key) {
  const auto it = state.find(key);
  if (it == state.end()) {
    throw GradScalerError(fmt::format("GradScaler.load_state_dict: the state dict has no key '{}'\nhint: pass what "
                                      "GradScaler.state_dict() returned",
                                      key));
  }
  if (const double* d = std::get_if<double>(&it->second)) return *d;
  if (const std::int64_t* i = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*i);
  throw GradScalerError(fmt::format("GradScaler.load_state_dict: '{}' must be a number", key));
}

std::int64_t integer(const StateDict& state, const char* key) {
  const double v = number(state, key);
  if (v != std::floor(v) || !std::isfinite(v)) {
    throw GradScalerError(fmt::format("GradScaler.load_state_dict: '{}' must be an integer, got {}", key, v));
  }
  return static_cast<std::int64_t>(v);
}

bool boolean(const StateDict& state, const char* key) {
  const StateValue& v = state.at(key);
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  throw GradScalerError(fmt::format("GradScaler.load_state_dict: '{}' must be a bool", key));
}

void check_extensions(const LossScaleExtensions& e, double init_scale) {
  if (e.hysteresis < 1) {
    throw GradScalerError(fmt::format("GradScaler: hysteresis must be >= 1 (1 turns it off), got {}", e.hysteresis));
  }
  if (e.min_scale && !(*e.min_scale > 0.0 && *e.min_scale <= init_scale)) {
    throw GradScalerError(fmt::format("GradScaler: min_scale must be > 0 and <= init_scale, got min_scale={} "
                                      "init_scale={}",
                                      py_float(*e.min_scale), py_float(init_scale)));
  }
  if (e.max_scale && !(*e.max_scale >= init_scale)) {
    throw GradScalerError(fmt::format("GradScaler: max_scale must be >= init_scale, got max_scale={} init_scale={}",
                                      py_float(*e.max_scale), py_float(init_scale)));
  }
  if (e.raise_at_min_scale && !e.min_scale) {
    throw GradScalerError(
        "GradScaler: raise_at_min_scale needs a min_scale to compare the scale with\nhint: DeepSpeed's default "
        "is min_scale = 1.0");
  }
}

}  // namespace

GradScalerOptions megatron_scaler_options() {
  GradScalerOptions o;
  o.init_scale = 4294967296.0;  // 2^32
  o.growth_interval = 1000;
  o.extensions.hysteresis = 2;
  o.extensions.min_scale = 1.0;
  return o;
}

GradScalerOptions deepspeed_scaler_options() {
  GradScalerOptions o;
  o.init_scale = 65536.0;  // initial_scale_power 16
  o.growth_interval = 1000;
  o.extensions.hysteresis = 2;
  o.extensions.min_scale = 1.0;
  o.extensions.raise_at_min_scale = true;
  return o;
}

// ---- the unscale kernel ----

void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, Tensor& found_inf, const Tensor& inv_scale) {
  const char* op = "non_finite_check_and_unscale_";
  // PyTorch's checks and texts, then what was passed.
  if (!inv_scale.defined() || inv_scale.numel() != 1) {
    throw ShapeError(fmt::format("{}: inv_scale must be a 1-element tensor.\n  inv_scale has shape {}", op,
                                 inv_scale.defined() ? shape_str(inv_scale.shape()) : "(undefined)"));
  }
  if (!found_inf.defined() || found_inf.numel() != 1) {
    throw ShapeError(fmt::format("{}: found_inf must be a 1-element tensor.\n  found_inf has shape {}", op,
                                 found_inf.defined() ? shape_str(found_inf.shape()) : "(undefined)"));
  }
  if (inv_scale.dtype() != DType::f32) {
    throw DTypeError(fmt::format("{}: inv_scale must be a float tensor.\n  inv_scale is {}, not f32", op,
                                 dtype_name(inv_scale.dtype())));
  }
  if (found_inf.dtype() != DType::f32) {
    throw DTypeError(fmt::format("{}: found_inf must be a float tensor.\n  found_inf is {}, not f32", op,
                                 dtype_name(found_inf.dtype())));
  }
  if (grads.empty()) return;
  const Device device = grads.front().device();
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined()) throw Error(fmt::format("{}: grads[{}] is an undefined tensor", op, i));
    if (!is_floating(g.dtype())) {
      throw DTypeError(fmt::format("{}: grads[{}] is {}; only floating gradients can be unscaled", op, i,
                                   dtype_name(g.dtype())));
    }
    if (g.device() != device) {
      throw DeviceError(fmt::format("{}: all grads must be on one device, but grads[0] is on {} and grads[{}] on {}",
                                    op, device.str(), i, g.device().str()));
    }
  }
  if (found_inf.device() != device || inv_scale.device() != device) {
    throw DeviceError(fmt::format("{}: found_inf ({}) and inv_scale ({}) must be on the grads' device ({})", op,
                                  found_inf.device().str(), inv_scale.device().str(), device.str()));
  }
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;
  const auto inv = static_cast<float>(inv_scale.item());
  if (try_fused_unscale(device, grads, found_inf, inv, /*probe_listening=*/false)) return;
  Tensor flags;
  for (const Tensor& g : grads) {
    const Tensor f = non_finite_flag(g);
    flags = flags.defined() ? add(flags, f) : f;
  }
  set_found_inf(found_inf, flags);
  for (Tensor g : grads) unscale_in_place(g, inv);
}

// ---- construction and copies ----

GradScaler::GradScaler(GradScalerOptions options)
    : device_type_(Device::parse(options.device).type),
      enabled_(options.enabled),
      init_scale_(options.init_scale),
      growth_factor_(options.growth_factor),
      backoff_factor_(options.backoff_factor),
      growth_interval_(options.growth_interval),
      extensions_(options.extensions),
      process_group_(options.process_group),
      init_hysteresis_tracker_(options.extensions.hysteresis) {
  if (enabled_ && device_type_ == DeviceType::cuda) {
    const CudaStatus cuda = cuda_status();
    if (cuda.device_count == 0) {
      // PyTorch warns and disables rather than failing, so that the same script runs without a GPU.
      disabled_reason_ = fmt::format("GradScaler is enabled, but CUDA is not available ({}). Disabling.", cuda.reason);
      std::fprintf(stderr, "warning: %s\nhint: GradScaler({.device = \"cpu\"}) scales on the CPU backend\n",
                   disabled_reason_.c_str());
      enabled_ = false;
    }
  }
  if (!enabled_) return;
  // `!(x > 1)` so that NaN is refused too, as Python's assert growth_factor > 1.0 refuses it.
  if (!(growth_factor_ > 1.0)) {
    throw GradScalerError(fmt::format("The growth factor must be > 1.0.\n  GradScaler: growth_factor={}",
                                      py_float(growth_factor_)));
  }
  if (!(backoff_factor_ < 1.0)) {
    throw GradScalerError(fmt::format("The backoff factor must be < 1.0.\n  GradScaler: backoff_factor={}",
                                      py_float(backoff_factor_)));
  }
  check_extensions(extensions_, init_scale_);
}

GradScaler::GradScaler(const GradScaler& other) { *this = other; }

GradScaler& GradScaler::operator=(const GradScaler& other) {
  if (!other.per_optimizer_states_.empty()) {
    throw GradScalerError(
        "A GradScaler instance may only be pickled at the beginning of an iteration, or at the end after "
        "scaler.update().\nhint: copy the scaler before its first unscale_()/step() of an iteration, or after "
        "update()");
  }
  if (this == &other) return *this;
  device_type_ = other.device_type_;
  enabled_ = other.enabled_;
  disabled_reason_ = other.disabled_reason_;
  // As PyTorch's __getstate__: the current values become the copy's initial values, its tensors absent.
  init_scale_ = other.get_scale();
  growth_factor_ = other.growth_factor_;
  backoff_factor_ = other.backoff_factor_;
  growth_interval_ = other.growth_interval_;
  init_growth_tracker_ = other.get_growth_tracker();
  extensions_ = other.extensions_;
  process_group_ = other.process_group_;
  init_hysteresis_tracker_ = other.scale_.defined() ? other.hysteresis_tracker_ : other.init_hysteresis_tracker_;
  scale_ = Tensor();
  scale_value_ = 0.0f;
  growth_tracker_.reset();
  hysteresis_tracker_ = init_hysteresis_tracker_;
  per_optimizer_states_.clear();
  order_ = other.order_;
  iteration_ = other.iteration_;
  return *this;
}

// ---- scale ----

void GradScaler::lazy_init(Device device) {
  if (scale_.defined()) return;
  scale_ = full({}, init_scale_, {DType::f32, device});
  scale_value_ = static_cast<float>(init_scale_);
  growth_tracker_ = init_growth_tracker_;
  hysteresis_tracker_ = init_hysteresis_tracker_;
}

Tensor GradScaler::scale(const Tensor& outputs) {
  if (!enabled_) return outputs;
  if (!outputs.defined()) throw GradScalerError("outputs must be a Tensor or an iterable of Tensors");
  lazy_init(outputs.device());
  // The multiply is the model's op (autograd records it, and a probe sees it: an f16 output can
  // overflow right here), so it is not run as a runtime-internal op.
  return mul(outputs, scale_.to(outputs.device()));
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& outputs) {
  if (!enabled_) return outputs;
  for (const Tensor& t : outputs) {
    if (!t.defined()) throw GradScalerError("outputs must be a Tensor or an iterable of Tensors");
  }
  if (outputs.empty()) return {};
  lazy_init(outputs.front().device());
  std::vector<std::pair<Device, Tensor>> copies;  // one copy of the scale per device per call
  std::vector<Tensor> out;
  out.reserve(outputs.size());
  for (const Tensor& t : outputs) {
    auto it = std::find_if(copies.begin(), copies.end(), [&](const auto& c) { return c.first == t.device(); });
    if (it == copies.end()) it = copies.insert(copies.end(), {t.device(), scale_.to(t.device())});
    out.push_back(mul(t, it->second));
  }
  return out;
}

// ---- the per-optimizer state machine ----

void GradScaler::check_scale_growth_tracker(const char* function) const {
  if (!scale_.defined()) {
    // Two spaces after "None.", as in PyTorch's message.
    throw GradScalerError(fmt::format("Attempted {} but _scale is None.  {}\nhint: call scaler.scale(loss) (and "
                                      "backward() on the result) before unscale_(), step() and update()",
                                      function, kScaleNoneFix));
  }
}

GradScaler::OptimizerState& GradScaler::state_of(const optim::Optimizer& optimizer) {
  for (OptimizerState& s : per_optimizer_states_) {
    if (s.optimizer == &optimizer) return s;
  }
  // Keyed by address, as PyTorch keys by id(): an optimizer created where a destroyed one lived takes
  // over its number.
  const auto [it, fresh] = order_.try_emplace(&optimizer, order_.size());
  OptimizerState& s = per_optimizer_states_.emplace_back();
  s.optimizer = &optimizer;
  s.order = it->second;
  return s;
}

std::string GradScaler::optimizer_label(const OptimizerState& state) const {
  return fmt::format("{} #{}", state.optimizer->name(), state.order);
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  check_scale_growth_tracker("unscale_");
  OptimizerState& state = state_of(optimizer);
  if (state.stage == Stage::unscaled) {
    throw GradScalerError(fmt::format("unscale_() has already been called on this optimizer since the last "
                                      "update().\n  optimizer: {}\nhint: unscale_() each optimizer at most once per "
                                      "iteration; step() does it when you have not",
                                      optimizer_label(state)));
  }
  if (state.stage == Stage::stepped) {
    throw GradScalerError(fmt::format("unscale_() is being called after step().\n  optimizer: {}\nhint: call "
                                      "unscale_() between backward() and step()",
                                      optimizer_label(state)));
  }

  // Collect first: an f16 gradient is refused before any gradient is touched (the stage stays READY).
  struct Grad {
    Tensor grad;
    std::string name;
    Tensor flag;
  };
  std::vector<std::pair<Device, std::vector<Grad>>> by_device;
  const std::vector<optim::ParamGroup>& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& p = groups[g].params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      std::string name = p.name().empty() ? fmt::format("group {}, parameter {}", g, i) : p.name();
      if (grad.dtype() == DType::f16) {
        throw DTypeError(fmt::format(
            "Attempting to unscale FP16 gradients.\n  optimizer {}: parameter '{}' (shape {}) has an f16 gradient\n"
            "hint: keep the parameters (and so their gradients) in f32 and let autocast run the ops in f16; "
            "f16 gradients would lose the small values that loss scaling exists to keep",
            optimizer_label(state), name, shape_str(grad.shape())));
      }
      auto it = std::find_if(by_device.begin(), by_device.end(),
                             [&](const auto& d) { return d.first == grad.device(); });
      if (it == by_device.end()) it = by_device.insert(by_device.end(), {grad.device(), {}});
      it->second.push_back({std::move(grad), std::move(name), Tensor()});
    }
  }

  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // the checks are the scaler's, not the model's ops
  // Reciprocal in double, then rounded to float: an f32 division can be inexact under fast-math.
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_value_));
  // PyTorch groups by device and then dtype for its multi-tensor kernel; every result here is per
  // tensor, so grouping by device (one found_inf per device) gives the same values.
  std::vector<std::pair<Device, Tensor>> found_inf_per_device;
  std::vector<bool> fused(by_device.size(), false);  // devices whose grads the fused kernel has unscaled
  for (std::size_t d = 0; d < by_device.size(); ++d) {
    auto& [device, grads] = by_device[d];
    Tensor found_inf = zeros({}, {DType::f32, device});
    if (device.is_cuda()) {
      std::vector<Tensor> tensors;
      for (const Grad& g : grads) tensors.push_back(g.grad);
      fused[d] = try_fused_unscale(device, tensors, found_inf, inv_scale, probe::hook() != nullptr);
    }
    if (!fused[d]) {
      Tensor flags;
      for (Grad& g : grads) {
        g.flag = non_finite_flag(g.grad);
        flags = flags.defined() ? add(flags, g.flag) : g.flag;
      }
      set_found_inf(found_inf, flags);
    }
    found_inf_per_device.emplace_back(device, std::move(found_inf));
  }
  // Every rank's verdict: one rank's overflow skips the step on all of them (ShardedGradScaler's
  // all-reduce of found_inf with max). Before any read, so that step() and update() see the group's.
  if (process_group_ != nullptr && process_group_->size() > 1) {
    for (auto& [device, found_inf] : found_inf_per_device) process_group_->all_reduce(found_inf, ReduceOp::max);
  }
  state.found_inf_per_device = std::move(found_inf_per_device);
  state.found.reset();
  state.non_finite.clear();

  // Which gradients overflowed, counted before they are unscaled (a clipped gradient no longer says).
  // found_inf is read on the host here rather than in step(), which reads it anyway (the value is kept),
  // so a clean step costs nothing extra; the per-gradient reads and counts happen only on overflow.
  if (probe::hook() != nullptr && read_found(state)) {
    for (auto& [device, grads] : by_device) {
      for (const Grad& g : grads) {
        if (g.flag.item() != 0.0) state.non_finite.push_back(count_non_finite(g.grad, g.name));
      }
    }
  }

  // Probes see the gradients as backward left them (still scaled), then unscaled.
  std::vector<Tensor> params;
  if (probe::hook() != nullptr) {
    for (const optim::ParamGroup& group : groups) params.insert(params.end(), group.params.begin(), group.params.end());
    probe::report_grads(params, /*unscaled=*/false);
  }
  for (std::size_t d = 0; d < by_device.size(); ++d) {
    if (fused[d]) continue;
    for (Grad& g : by_device[d].second) unscale_in_place(g.grad, inv_scale);
  }
  if (!params.empty()) probe::report_grads(params, /*unscaled=*/true);
  state.stage = Stage::unscaled;
}

bool GradScaler::read_found(OptimizerState& state) const {
  if (!state.found) {
    bool found = false;
    for (const auto& [device, t] : state.found_inf_per_device) found = found || t.item() != 0.0;
    state.found = found;
  }
  return *state.found;
}

bool GradScaler::step(optim::Optimizer& optimizer) { return step(optimizer, return_found_inf).stepped; }

StepResult GradScaler::step(optim::Optimizer& optimizer, ReturnFoundInf) {
  if (!enabled_) {
    optimizer.step();
    return {true, false};
  }
  check_scale_growth_tracker("step");
  OptimizerState& state = state_of(optimizer);
  if (state.stage == Stage::stepped) {
    throw GradScalerError(fmt::format("step() has already been called since the last update().\n  optimizer: {}\n"
                                      "hint: call scaler.update() once per iteration, after every optimizer's step()",
                                      optimizer_label(state)));
  }
  if (state.stage == Stage::ready) unscale_(optimizer);
  if (state.found_inf_per_device.empty()) {
    throw GradScalerError(fmt::format("No inf checks were recorded for this optimizer.\n  optimizer: {} has no "
                                      "parameter with a gradient\nhint: call backward() on the scaled loss before "
                                      "step()",
                                      optimizer_label(state)));
  }
  // Skipping leaves the parameters and the optimizer's state (Adam's step count) untouched; the
  // gradients stay unscaled, possibly non-finite.
  const bool found = read_found(state);
  if (!found) optimizer.step();
  state.skipped = found;
  state.stage = Stage::stepped;
  return {!found, found};
}

Tensor GradScaler::step(optim::Optimizer& optimizer, const std::function<Tensor()>& closure) {
  if (enabled_) {
    throw GradScalerError(
        "Closure use is not currently supported if GradScaler is enabled.\nhint: compute the loss, call "
        "scaler.scale(loss).backward(), then scaler.step(optimizer) without a closure");
  }
  Tensor loss = closure();
  optimizer.step();
  return loss;
}

// ---- update ----

void GradScaler::set_scale(double value) {
  scale_value_ = static_cast<float>(value);
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;
  scale_.fill_(static_cast<double>(scale_value_));
}

void GradScaler::update() {
  probe::detail::note_acted(this);  // probe::Step refuses to update twice in one training step
  if (!enabled_) return;
  check_scale_growth_tracker("update");
  bool recorded = false;
  bool found = false;
  for (OptimizerState& s : per_optimizer_states_) {
    if (s.found_inf_per_device.empty()) continue;
    recorded = true;
    found = read_found(s) || found;
  }
  if (!recorded) {
    throw GradScalerError(
        "No inf checks were recorded prior to update.\nhint: call scaler.step(optimizer) (or unscale_) on "
        "at least one optimizer with gradients before update(), and update() once per iteration");
  }

  // Section 1.9 (_amp_update_scale_), with the extensions of section 4 where they are on. Products are
  // in double and rounded once to f32, as the CUDA kernel's float * double.
  const float old_scale = scale_value_;
  float new_scale = old_scale;
  auto change = probe::ScalerEvent::Change::kept;
  std::int64_t tracker = *growth_tracker_;
  std::int64_t hysteresis_tracker = hysteresis_tracker_;
  const LossScaleExtensions& ext = extensions_;
  if (found) {
    tracker = 0;
    if (ext.hysteresis > 1 && hysteresis_tracker > 1) {
      // Megatron keeps decrementing below 1 and backs off at <= 0; DeepSpeed stops at 1 and backs off at
      // 1. Both back off on the same steps; we keep DeepSpeed's form so the tracker never reads below 1.
      --hysteresis_tracker;
    } else {
      if (ext.raise_at_min_scale && ext.min_scale && old_scale == static_cast<float>(*ext.min_scale)) {
        // DeepSpeed raises before changing any state.
        throw GradScalerError(fmt::format(
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n  GradScaler: "
            "scale {} = min_scale, and the gradients overflowed again\nhint: they overflow even at the smallest "
            "scale: find the op that produces the inf/NaN (a probe trace shows it), or lower min_scale",
            py_float(old_scale)));
      }
      // No lower bound in PyTorch: the scale may go below 1, into subnormals, to 0.
      new_scale = static_cast<float>(static_cast<double>(old_scale) * backoff_factor_);
      if (ext.min_scale) new_scale = std::max(new_scale, static_cast<float>(*ext.min_scale));
      change = probe::ScalerEvent::Change::backoff;
    }
  } else {
    if (ext.consecutive_hysteresis) hysteresis_tracker = ext.hysteresis;
    const std::int64_t n = tracker + 1;
    // == as in PyTorch: an interval <= 0 never matches, so the scale never grows.
    if (n == growth_interval_) {
      float grown = static_cast<float>(static_cast<double>(old_scale) * growth_factor_);
      if (ext.max_scale) grown = std::min(grown, static_cast<float>(*ext.max_scale));
      if (std::isfinite(grown)) new_scale = grown;  // never grow to f32 inf
      tracker = 0;                                  // reset even when the growth was refused
      hysteresis_tracker = ext.hysteresis;
      if (new_scale > old_scale) change = probe::ScalerEvent::Change::growth;
    } else {
      tracker = n;
    }
  }
  growth_tracker_ = tracker;
  hysteresis_tracker_ = hysteresis_tracker;
  if (new_scale != old_scale) set_scale(new_scale);
  emit_event(old_scale, change);
  per_optimizer_states_.clear();
  ++iteration_;
}

void GradScaler::update(double new_scale) {
  probe::detail::note_acted(this);
  if (!enabled_) return;
  check_scale_growth_tracker("update");
  const double used = scale_value_;
  set_scale(new_scale);  // no positivity or finiteness check, as in PyTorch
  emit_event(used, probe::ScalerEvent::Change::explicit_scale);
  per_optimizer_states_.clear();
  ++iteration_;
}

void GradScaler::update(const Tensor& new_scale) {
  if (!enabled_) return;
  check_scale_growth_tracker("update");
  const bool ok = new_scale.defined() && new_scale.device().type == device_type_ && new_scale.numel() == 1 &&
                  !new_scale.requires_grad();
  if (!ok) {
    const std::string got =
        new_scale.defined()
            ? fmt::format("a {} tensor of shape {} on {}{}", dtype_name(new_scale.dtype()),
                          shape_str(new_scale.shape()), new_scale.device().str(),
                          new_scale.requires_grad() ? " that requires grad" : "")
            : std::string("an undefined tensor");
    throw GradScalerError(fmt::format(
        "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with "
        "requires_grad=False.\n  GradScaler for device '{}' got {}",
        device_type_ == DeviceType::cuda ? "cuda" : "cpu", got));
  }
  update(new_scale.item());
}

void GradScaler::emit_event(double scale_used, probe::ScalerEvent::Change change) {
  probe::Hook* hook = probe::hook();
  if (hook == nullptr) return;
  probe::ScalerEvent event;
  event.iteration = iteration_;
  event.scale = scale_used;
  std::vector<OptimizerState*> states;
  for (OptimizerState& s : per_optimizer_states_) states.push_back(&s);
  std::sort(states.begin(), states.end(), [](const auto* a, const auto* b) { return a->order < b->order; });
  for (OptimizerState* s : states) {
    probe::ScalerOptimizerReport report;
    report.optimizer = optimizer_label(*s);
    report.found_inf = !s->found_inf_per_device.empty() && read_found(*s);
    report.skipped = s->stage == Stage::stepped && s->skipped;
    report.non_finite = s->non_finite;
    event.optimizers.push_back(std::move(report));
  }
  event.change = change;
  event.new_scale = scale_value_;
  event.growth_tracker = get_growth_tracker();
  event.hysteresis_tracker = get_hysteresis_tracker();
  hook->on_scaler(event);
}

// ---- accessors and state dict ----

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return scale_.defined() ? static_cast<double>(scale_value_) : init_scale_;
}

std::int64_t GradScaler::get_growth_tracker() const {
  if (!enabled_) return 0;
  return growth_tracker_ ? *growth_tracker_ : init_growth_tracker_;
}

std::int64_t GradScaler::get_hysteresis_tracker() const {
  if (!enabled_ || extensions_.hysteresis <= 1) return -1;
  return scale_.defined() ? hysteresis_tracker_ : init_hysteresis_tracker_;
}

StateDict GradScaler::state_dict() const {
  if (!enabled_) return {};
  StateDict sd{{"scale", get_scale()},
               {"growth_factor", growth_factor_},
               {"backoff_factor", backoff_factor_},
               {"growth_interval", growth_interval_},
               {"_growth_tracker", get_growth_tracker()}};
  if (extensions_.any()) {
    sd["hysteresis"] = extensions_.hysteresis;
    sd["consecutive_hysteresis"] = extensions_.consecutive_hysteresis;
    sd["raise_at_min_scale"] = extensions_.raise_at_min_scale;
    if (extensions_.min_scale) sd["min_scale"] = *extensions_.min_scale;
    if (extensions_.max_scale) sd["max_scale"] = *extensions_.max_scale;
    sd["_hysteresis_tracker"] = scale_.defined() ? hysteresis_tracker_ : init_hysteresis_tracker_;
  }
  return sd;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!enabled_) return;
  if (state.empty()) {
    throw GradScalerError(
        "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.");
  }
  // Everything is read before anything is set, so a bad dict leaves the scaler as it was (PyTorch sets
  // the keys one by one and can stop half-way).
  const double scale = number(state, "scale");
  const double growth_factor = number(state, "growth_factor");
  const double backoff_factor = number(state, "backoff_factor");
  const std::int64_t growth_interval = integer(state, "growth_interval");
  const std::int64_t growth_tracker = integer(state, "_growth_tracker");
  LossScaleExtensions ext = extensions_;
  std::optional<std::int64_t> hysteresis_tracker;
  if (state.count("hysteresis") != 0) {
    ext = LossScaleExtensions{};
    ext.hysteresis = integer(state, "hysteresis");
    if (state.count("consecutive_hysteresis") != 0) {
      ext.consecutive_hysteresis = boolean(state, "consecutive_hysteresis");
    }
    if (state.count("raise_at_min_scale") != 0) ext.raise_at_min_scale = boolean(state, "raise_at_min_scale");
    if (state.count("min_scale") != 0) ext.min_scale = number(state, "min_scale");
    if (state.count("max_scale") != 0) ext.max_scale = number(state, "max_scale");
    if (state.count("_hysteresis_tracker") != 0) hysteresis_tracker = integer(state, "_hysteresis_tracker");
  }

  init_scale_ = scale;
  if (scale_.defined()) set_scale(scale);
  growth_factor_ = growth_factor;
  backoff_factor_ = backoff_factor;
  growth_interval_ = growth_interval;
  init_growth_tracker_ = growth_tracker;
  if (growth_tracker_) growth_tracker_ = growth_tracker;
  extensions_ = ext;
  init_hysteresis_tracker_ = hysteresis_tracker.value_or(ext.hysteresis);
  hysteresis_tracker_ = init_hysteresis_tracker_;
}

}  // namespace ampscope
