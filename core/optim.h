// core/optim.h: optimizers (SGD, Adam, AdamW), learning-rate schedules and gradient clipping, with
// PyTorch 2.x's single-tensor (foreach=False) formulas and defaults.
//
// Each update is written as the same sequence of ops as torch.optim's _single_tensor_sgd / _adam /
// _adamw, and each of PyTorch's fused element-wise ops (add with alpha, lerp, addcmul, addcdiv) is
// computed in float and rounded once into the tensor's dtype, so f32 and f16 parameters get the values
// PyTorch's CUDA kernels give them (without their FMA contraction). Python-side scalars (bias
// corrections, step sizes) are computed in double, then used as the ops' scalars. Schedulers set each
// group's lr from PyTorch's closed forms (_get_closed_form_lr).
//
//   optim::AdamW opt(model_params, {.lr = 3e-4, .weight_decay = 0.1});
//   optim::SequentialLR sched(opt, {std::make_shared<optim::LinearLR>(opt, 0.1, 1.0, 100),
//                                   std::make_shared<optim::CosineAnnealingLR>(opt, 900)}, {100});
//   loss.backward();
//   Tensor norm = optim::clip_grad_norm_(model_params, 1.0);
//   opt.step(); opt.zero_grad(); sched.step();
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/tensor.h"

namespace ampscope::optim {

// ---- hyper-parameters and parameter groups ----

// What a caller sets, for a whole optimizer or for one parameter group; an unset field takes the
// optimizer's default (for a group: the value given to the optimizer, else PyTorch's default). Setting
// a field the optimizer does not have (momentum for Adam) is an error.
//   SGD:        lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false
//   Adam:       lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8, weight_decay = 0, amsgrad = false, maximize = false
//   AdamW:      as Adam, but weight_decay = 1e-2 (decoupled: p *= 1 - lr * weight_decay)
struct OptimizerOptions {
  std::optional<double> lr{};
  std::optional<double> momentum{};
  std::optional<double> dampening{};
  std::optional<bool> nesterov{};
  std::optional<std::array<double, 2>> betas{};  // .betas = {{0.9, 0.99}}
  std::optional<double> eps{};
  std::optional<bool> amsgrad{};
  std::optional<double> weight_decay{};
  std::optional<bool> maximize{};
};

// The resolved hyper-parameters of one group. Each optimizer reads only its own fields.
struct Hyperparameters {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  bool amsgrad = false;
  double weight_decay = 0.0;
  bool maximize = false;
};

// A group as the caller gives it: {.params = {w, b}, .options = {.lr = 0.1}}.
struct ParamGroupSpec {
  std::vector<Tensor> params{};
  OptimizerOptions options{};  // initialisers keep -Wextra quiet about fields a designated list omits
};

// A group as the optimizer holds it. Schedulers write options.lr; initial_lr is the lr the first
// scheduler found (PyTorch's group['initial_lr']), the base of every schedule.
struct ParamGroup {
  std::vector<Tensor> params;
  Hyperparameters options;
  std::optional<double> initial_lr;
};

// What an optimizer keeps for one parameter, created lazily (in the parameter's dtype and device) at
// its first step. Undefined tensors are state the optimizer has not needed. Read and write it freely
// (checkpoints): the next step() continues from whatever is here.
struct ParamState {
  Tensor momentum_buffer;  // SGD with momentum != 0
  Tensor exp_avg;          // Adam, AdamW
  Tensor exp_avg_sq;
  Tensor max_exp_avg_sq;   // with amsgrad
  std::int64_t step = 0;   // Adam, AdamW: steps taken (PyTorch keeps it as a float tensor)
};

// ---- optimizers ----

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& name() const { return name_; }  // "SGD", "Adam", "AdamW"

  // One update of every parameter that has a gradient (the others are skipped and get no state),
  // under a NoGradGuard. Parameters are updated in place: the same Tensor handles see the new values.
  void step();
  // set_to_none clears each gradient (PyTorch's default); otherwise fills it with zeros in place.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Checks the group's parameters and options as the constructor does.
  void add_param_group(ParamGroupSpec group);

  // The state of a parameter of this optimizer (empty before its first step); throws for a tensor the
  // optimizer does not hold.
  ParamState& state(const Tensor& param);
  const ParamState* find_state(const Tensor& param) const;  // null when it has none yet
  // Forgets a parameter's state (the next step() starts it afresh); nothing happens when it has none.
  void erase_state(const Tensor& param) { state_.erase(param.id()); }

  // ---- sharding (ZeRO-1, core/distributed/zero_optimizer.h) ----
  // Restricts step() to the parameters in `owned` (the others are neither updated nor given state by it;
  // their state, if any, is left for the caller to free) and runs `after_step` at the end of every step(),
  // after the updates (ShardedOptimizer's exchange of the updated parameters between the ranks). Every
  // parameter of `owned` must be one of this optimizer's. set_shard({}, {}) ends the sharding.
  void set_shard(const std::vector<Tensor>& owned, std::function<void()> after_step);
  bool sharded() const { return sharded_; }
  // Whether step() updates this parameter: always without sharding.
  bool owns(const Tensor& param) const { return !sharded_ || owned_.contains(param.id()); }

 protected:
  // `keys` are the OptimizerOptions fields this optimizer has ("lr", "momentum", ...).
  Optimizer(std::string name, std::vector<std::string_view> keys, Hyperparameters defaults);
  // Resolves `defaults` over the constructor's, checks them, then adds each group.
  void init(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults);
  // Throws with PyTorch's text ("Invalid learning rate: -0.1") when a value is out of range.
  virtual void check(const Hyperparameters& h, const std::string& where) const = 0;
  // Updates one parameter from its gradient (same shape as the parameter).
  virtual void update(Tensor& param, const Tensor& grad, ParamState& state, const Hyperparameters& h) = 0;
  // param = round(param + update) in param's dtype, `update` being computed in the optimizer's arithmetic type
  // (f32; f64 for f64 parameters): the add of torch's fused add/addcdiv, with the same bits. While a probe
  // hook is installed and param is f16 or bf16, the hook hears it first (probe::Hook::on_update: which
  // elements' updates rounding loses); otherwise it costs nothing more. Adam passes its eps and the second moment
  // it divided by, which the hook hears with the update (probe::UpdateEvent).
  void apply_update(Tensor& param, const Tensor& update, double eps = std::numeric_limits<double>::quiet_NaN(),
                    const Tensor* second_moment = nullptr);

 private:
  Hyperparameters resolve(const Hyperparameters& base, const OptimizerOptions& options, const std::string& where) const;
  std::string param_label(const Tensor& p, std::size_t index, std::size_t group) const;

  std::string name_;
  std::vector<std::string_view> keys_;
  Hyperparameters defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const void*, ParamState> state_;  // by Tensor::id()
  bool sharded_ = false;
  std::unordered_set<const void*> owned_;  // by Tensor::id(), while sharded_
  std::function<void()> after_step_;
  std::string update_label_;  // the parameter step() is updating, set only while a probe hook is installed
};

// g = grad (negated when maximize); g += weight_decay * p; with momentum: buf = g on the first step,
// else buf = buf * momentum + (1 - dampening) * g, and g = nesterov ? g + momentum * buf : buf;
// p -= lr * g.
class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, const OptimizerOptions& options = {});
  explicit SGD(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults = {});

 protected:
  void check(const Hyperparameters& h, const std::string& where) const override;
  void update(Tensor& param, const Tensor& grad, ParamState& state, const Hyperparameters& h) override;
};

// step += 1; g += weight_decay * p; m = lerp(m, g, 1 - beta1); v = v * beta2 + (1 - beta2) * g * g;
// p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps). amsgrad divides by the
// running maximum of v instead.
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, const OptimizerOptions& options = {});
  explicit Adam(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults = {});

 protected:
  Adam(std::string name, Hyperparameters defaults, bool decoupled_weight_decay);
  void check(const Hyperparameters& h, const std::string& where) const override;
  void update(Tensor& param, const Tensor& grad, ParamState& state, const Hyperparameters& h) override;

 private:
  bool decoupled_weight_decay_;
};

// Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam step, which then has no
// weight-decay term.
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<Tensor> params, const OptimizerOptions& options = {});
  explicit AdamW(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults = {});
};

// ---- the registry of optimizers by name ----

using OptimizerFactory =
    std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroupSpec> groups, const OptimizerOptions& options)>;

class OptimizerRegistry {
 public:
  // Throws when the name is taken.
  void add(std::string name, OptimizerFactory factory);
  // Throws "unknown optimizer 'x'" with the list of known names.
  std::unique_ptr<Optimizer> create(std::string_view name, std::vector<ParamGroupSpec> groups,
                                    const OptimizerOptions& options = {}) const;
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted, for --help

 private:
  std::map<std::string, OptimizerFactory, std::less<>> factories_;
};

// The process-wide registry, holding "sgd", "adam" and "adamw".
OptimizerRegistry& optimizer_registry();

// optimizer_registry().create(name, one group holding params, options).
std::unique_ptr<Optimizer> make_optimizer(std::string_view name, std::vector<Tensor> params,
                                          const OptimizerOptions& options = {});

// ---- learning-rate schedules ----

// Sets every group's lr to closed_form(base_lr, epoch), base_lr being the group's initial_lr. The
// constructor takes the first step (epoch last_epoch + 1, so 0 for a fresh schedule), as PyTorch's does.
// A fresh schedule (last_epoch == -1) records each group's current lr as its initial_lr unless an
// earlier schedule already did; resuming (last_epoch >= 0) requires initial_lr to be there.
// The scheduler keeps a reference to the optimizer, which must outlive it.
class LRScheduler {
 public:
  using ClosedForm = std::function<double(double base_lr, std::int64_t epoch)>;

  LRScheduler(Optimizer& optimizer, ClosedForm closed_form, std::int64_t last_epoch = -1);
  virtual ~LRScheduler() = default;

  void step();  // advances the epoch and sets each group's lr
  std::int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  // The lr a group whose base lr is base_lr has at `epoch`.
  double lr_at(double base_lr, std::int64_t epoch) const { return closed_form_(base_lr, epoch); }
  const ClosedForm& closed_form() const { return closed_form_; }

 private:
  void apply();

  Optimizer* optimizer_;
  ClosedForm closed_form_;
  std::int64_t last_epoch_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
};

// base_lr * gamma^(epoch / step_size), integer division.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma = 0.1, std::int64_t last_epoch = -1);
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min = 0.0, std::int64_t last_epoch = -1);
};

// base_lr * (start + (end - start) * min(total_iters, epoch) / total_iters): a linear warm-up.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0,
           std::int64_t total_iters = 5, std::int64_t last_epoch = -1);
};

// schedulers[i] runs from milestones[i - 1] on, restarted at its epoch 0 there (PyTorch's SequentialLR,
// with every schedule in its closed form). All schedulers must belong to `optimizer`.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
               std::vector<std::int64_t> milestones, std::int64_t last_epoch = -1);
};

// LinearLR(start_factor, 1.0, warmup_iters) for the first warmup_iters epochs, then
// CosineAnnealingLR(total_iters - warmup_iters, eta_min): the usual "warm-up then cosine".
class WarmupCosineLR : public LRScheduler {
 public:
  WarmupCosineLR(Optimizer& optimizer, std::int64_t warmup_iters, std::int64_t total_iters,
                 double start_factor = 1.0 / 3.0, double eta_min = 0.0, std::int64_t last_epoch = -1);
};

// ---- gradient clipping ----

// torch.nn.utils.clip_grad_norm_: the norm of the per-gradient norms (each computed in float and
// rounded to its gradient's dtype, gradients grouped by device and dtype as PyTorch does), then every
// gradient is multiplied by min(max_norm / (total + 1e-6), 1). A non-finite total turns the gradients
// non-finite (as in PyTorch) unless error_if_nonfinite, which throws instead. Parameters without a
// gradient are skipped; with none at all the result is 0. norm_type: 2 or infinity.
// Returns the total norm as a 0-dim tensor.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// torch.nn.utils.get_total_norm: the total norm clip_grad_norm_ computes (the same bits), of the given
// tensors themselves (gradients: p.grad()), without changing them. Undefined tensors are skipped; with
// none at all the result is 0. norm_type: 2 or infinity. Returns a 0-dim tensor.
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0);

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

}  // namespace ampscope::optim
