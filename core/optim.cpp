#include "core/optim.h"


#include <algorithm>
#include <cmath>
#include <numbers>
#include <typeinfo>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/probe_hook.h"

namespace ampscope::optim {

namespace {

// A double as Python's str() writes it ("0.1", "1.0", "inf", "1e-05"), so messages read as PyTorch's.
std::string py_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // "1" -> "1.0"; leaves 1e-05, inf, nan
  return s;
}

// The type PyTorch's kernels do their arithmetic in (at::opmath_type): float for f16, bf16 and f32.
DType opmath(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// A scalar as a kernel of compute type `m` holds it.
double as_opmath(double v, DType m) { return m == DType::f64 ? v : static_cast<double>(static_cast<float>(v)); }

// PyTorch's fused element-wise ops compute a whole expression in opmath and round once into the result;
// a chain of our ops in opmath followed by one conversion does the same (exactly so for f32, where
// every intermediate is a float either way).

// torch.add(a, b, alpha=alpha): a + alpha * b.
Tensor fused_add(const Tensor& a, const Tensor& b, double alpha, DType out) {
  const DType m = opmath(out);
  return add(a.to(m), mul(b.to(m), alpha)).to(out);
}

// torch.lerp(a, b, w) with a scalar weight; the two forms of ATen's Lerp.h, chosen on |w| < 0.5.
Tensor fused_lerp(const Tensor& a, const Tensor& b, double w, DType out) {
  const DType m = opmath(out);
  const Tensor am = a.to(m), bm = b.to(m);
  const double wm = as_opmath(w, m);
  if (std::fabs(wm) < 0.5) return add(am, mul(sub(bm, am), wm)).to(out);
  const double one_minus_w = m == DType::f64 ? 1.0 - wm : static_cast<double>(1.0f - static_cast<float>(wm));
  return sub(bm, mul(sub(bm, am), one_minus_w)).to(out);
}

// torch.addcmul(a, b, c, value=v): a + v * (b * c), in the order of ATen's CUDA kernel.
Tensor fused_addcmul(const Tensor& a, const Tensor& b, const Tensor& c, double value, DType out) {
  const DType m = opmath(out);
  return add(a.to(m), mul(mul(b.to(m), c.to(m)), value)).to(out);
}

// torch.addcdiv(a, b, c, value=v), a + v * (b / c), is Adam's last step: Optimizer::apply_update.

// torch.maximum, exact and NaN-propagating: argmax over the pair picks the larger (NaN counts as the
// largest, the first on ties).
Tensor exact_maximum(const Tensor& a, const Tensor& b) {
  const Tensor pair = cat({a.reshape({1, -1}), b.reshape({1, -1})}, 0);
  const Tensor take_b = argmax(pair, 0).to(DType::boolean);
  return where(take_b, b.reshape({-1}), a.reshape({-1})).reshape(a.shape());
}

// |x|, exact: one of the two terms is zero; a NaN stays NaN.
Tensor exact_abs(const Tensor& x) { return add(relu(x), relu(neg(x))); }

std::string group_suffix(std::size_t g) { return fmt::format(" (parameter group {})", g); }

// The PyTorch text, with the optimizer's name in front and the group (when it is a group's value) after.
[[noreturn]] void invalid(const std::string& optimizer, const std::string& what, const std::string& where) {
  throw Error(fmt::format("{}: {}{}", optimizer, what, where));
}

}  // namespace

// ---- Optimizer ----

Optimizer::Optimizer(std::string name, std::vector<std::string_view> keys, Hyperparameters defaults)
    : name_(std::move(name)), keys_(std::move(keys)), defaults_(defaults) {}

void Optimizer::init(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults) {
  defaults_ = resolve(defaults_, defaults, "");
  check(defaults_, "");
  if (groups.empty()) {
    throw Error(fmt::format("{}: optimizer got an empty parameter list\nhint: pass the model's parameters (tensors "
                            "that require grad)",
                            name_));
  }
  for (ParamGroupSpec& g : groups) add_param_group(std::move(g));
}

Hyperparameters Optimizer::resolve(const Hyperparameters& base, const OptimizerOptions& o,
                                   const std::string& where) const {
  Hyperparameters h = base;
  auto take = [&](const auto& field, std::string_view key, auto& dest) {
    if (!field.has_value()) return;
    if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
      throw Error(fmt::format("{}: option '{}'{} is not a hyper-parameter of {}\nhint: {} has {}", name_, key, where,
                              name_, name_, fmt::join(keys_, ", ")));
    }
    dest = *field;
  };
  take(o.lr, "lr", h.lr);
  take(o.momentum, "momentum", h.momentum);
  take(o.dampening, "dampening", h.dampening);
  take(o.nesterov, "nesterov", h.nesterov);
  take(o.betas, "betas", h.betas);
  take(o.eps, "eps", h.eps);
  take(o.amsgrad, "amsgrad", h.amsgrad);
  take(o.weight_decay, "weight_decay", h.weight_decay);
  take(o.maximize, "maximize", h.maximize);
  return h;
}

std::string Optimizer::param_label(const Tensor& p, std::size_t index, std::size_t group) const {
  if (p.defined() && !p.name().empty()) return fmt::format("parameter '{}'", p.name());
  return fmt::format("parameter #{} of group {}", index, group);
}

void Optimizer::add_param_group(ParamGroupSpec spec) {
  const std::size_t g = groups_.size();
  if (sharded_) {
    throw Error(fmt::format("{}: add_param_group on a sharded optimizer: the new parameters would belong to no "
                            "rank\nhint: add every group before sharding it (ShardedOptimizer)",
                            name_));
  }
  ParamGroup group;
  group.options = resolve(defaults_, spec.options, group_suffix(g));
  check(group.options, group_suffix(g));
  for (std::size_t i = 0; i < spec.params.size(); ++i) {
    const Tensor& p = spec.params[i];
    const std::string label = param_label(p, i, g);
    if (!p.defined()) {
      throw Error(
          fmt::format("{}: {} is an undefined tensor\nhint: pass the parameter tensors themselves", name_, label));
    }
    if (!p.is_leaf()) {
      throw Error(fmt::format("{}: can't optimize a non-leaf Tensor: {} is the output of '{}', so stepping it would "
                              "not change the tensor the model uses\nhint: pass the leaf tensor the model holds (the "
                              "one requires_grad_() was called on), or detach() this one and call requires_grad_() on "
                              "the copy",
                              name_, label, p.grad_fn()->op()));
    }
    if (!p.requires_grad()) {
      throw Error(fmt::format("{}: {} does not require grad, so it would never receive a gradient\nhint: call "
                              "requires_grad_() on it before building the optimizer, or leave it out",
                              name_, label));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (spec.params[j].id() == p.id()) {
        throw Error(fmt::format("{}: {} appears twice in parameter group {} (positions {} and {})\nhint: list each "
                                "tensor once",
                                name_, label, g, j, i));
      }
    }
    for (std::size_t h = 0; h < groups_.size(); ++h) {
      for (const Tensor& q : groups_[h].params) {
        if (q.id() == p.id()) {
          throw Error(fmt::format("{}: some parameters appear in more than one parameter group: {} is in group {} and "
                                  "group {}\nhint: list each tensor in exactly one group",
                                  name_, label, h, g));
        }
      }
    }
  }
  group.params = std::move(spec.params);
  groups_.push_back(std::move(group));
}

namespace {
bool try_fused_step(Optimizer& opt);
}  // namespace

void Optimizer::step() {
  probe::detail::note_acted(this);  // probe::Step refuses to take a second step in the same training step
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // updates are not the model's ops: no autocast, no probe events
  // The fused paths (the CPU's and CUDA's) take f32 parameters only, so no update they make can be swamped:
  // they report none.
  // Sharded (ZeRO-1), both paths update this rank's parameters only; after_step_ then brings the others'.
  if (!try_fused_step(*this)) {  // f32 parameters on a backend with fused steps take the fused path
    const bool reporting = probe::hook() != nullptr;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      ParamGroup& group = groups_[g];
      for (std::size_t i = 0; i < group.params.size(); ++i) {
        Tensor& p = group.params[i];
        const Tensor grad = p.grad();
        if (!grad.defined() || !owns(p)) continue;
        if (reporting) update_label_ = p.name().empty() ? fmt::format("group {}, parameter {}", g, i) : p.name();
        update(p, grad, state_[p.id()], group.options);
      }
    }
  }
  if (after_step_) after_step_();
}

void Optimizer::set_shard(const std::vector<Tensor>& owned, std::function<void()> after_step) {
  std::unordered_set<const void*> ids;
  for (const Tensor& p : owned) {
    bool found = false;
    for (const ParamGroup& group : groups_) {
      for (const Tensor& q : group.params) found = found || q.id() == p.id();
    }
    if (!found) {
      throw Error(fmt::format("{}: set_shard: {} is not one of this optimizer's parameters\nhint: shard the "
                              "optimizer's own parameters (param_groups())",
                              name_, p.name().empty() ? std::string("a tensor") : fmt::format("'{}'", p.name())));
    }
    ids.insert(p.id());
  }
  const bool on = !owned.empty() || after_step;
  sharded_ = on;
  owned_ = std::move(ids);
  after_step_ = std::move(after_step);
}

void Optimizer::apply_update(Tensor& param, const Tensor& update, double eps, const Tensor* second_moment) {
  // fused_add / fused_addcdiv's last step: add in opmath, round once into the parameter's dtype.
  const Tensor after = add(param.to(update.dtype()), update).to(param.dtype());
  if (param.dtype() == DType::f16 || param.dtype() == DType::bf16) {
    if (probe::Hook* hook = probe::hook()) {
      hook->on_update(
          probe::UpdateEvent{probe::current_step(), update_label_, param, update, after, name_, eps, second_moment});
    }
  }
  param.copy_(after);
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        NoGradGuard no_grad;
        grad.fill_(0.0);
      }
    }
  }
}

ParamState& Optimizer::state(const Tensor& param) {
  for (const ParamGroup& group : groups_) {
    for (const Tensor& p : group.params) {
      if (p.id() == param.id()) return state_[p.id()];
    }
  }
  throw Error(fmt::format("{}: {} is not one of this optimizer's parameters", name_,
                          param.name().empty() ? std::string("the tensor") : fmt::format("'{}'", param.name())));
}

const ParamState* Optimizer::find_state(const Tensor& param) const {
  const auto it = state_.find(param.id());
  return it == state_.end() ? nullptr : &it->second;
}

// ---- SGD ----

namespace {
const std::vector<std::string_view> kSgdKeys = {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"};
const std::vector<std::string_view> kAdamKeys = {"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"};

std::vector<ParamGroupSpec> one_group(std::vector<Tensor> params) {
  std::vector<ParamGroupSpec> groups;
  if (!params.empty()) groups.push_back({.params = std::move(params), .options = {}});
  return groups;
}

Hyperparameters adam_defaults(double weight_decay) {
  Hyperparameters h;
  h.weight_decay = weight_decay;
  return h;
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, const OptimizerOptions& options) : SGD(one_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults)
    : Optimizer("SGD", kSgdKeys, Hyperparameters{}) {
  init(std::move(groups), defaults);
}

void SGD::check(const Hyperparameters& h, const std::string& where) const {
  // PyTorch's checks, in its order; NaN fails them too.
  if (!(h.lr >= 0.0)) invalid(name(), "Invalid learning rate: " + py_float(h.lr), where);
  if (!(h.momentum >= 0.0)) invalid(name(), "Invalid momentum value: " + py_float(h.momentum), where);
  if (!(h.weight_decay >= 0.0)) invalid(name(), "Invalid weight_decay value: " + py_float(h.weight_decay), where);
  if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0)) {
    invalid(name(), "Nesterov momentum requires a momentum and zero dampening", where);
  }
}

void SGD::update(Tensor& param, const Tensor& grad, ParamState& state, const Hyperparameters& h) {
  // _single_tensor_sgd, op for op.
  Tensor g = h.maximize ? neg(grad) : grad;
  if (h.weight_decay != 0.0) g = fused_add(g, param, h.weight_decay, result_type(g, param));
  if (h.momentum != 0.0) {
    Tensor& buf = state.momentum_buffer;
    if (!buf.defined()) {
      buf = g.clone();  // a copy: g may be the parameter's own gradient
    } else {
      buf.copy_(fused_add(mul(buf, h.momentum), g, 1.0 - h.dampening, buf.dtype()));
    }
    g = h.nesterov ? fused_add(g, buf, h.momentum, result_type(g, buf)) : buf;
  }
  // fused_add(param, g, -lr), its update u = -lr * g computed apart so that a probe can see it.
  apply_update(param, mul(g.to(opmath(param.dtype())), -h.lr));
}

// ---- Adam, AdamW ----

Adam::Adam(std::vector<Tensor> params, const OptimizerOptions& options)
    : Adam(one_group(std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults)
    : Adam("Adam", adam_defaults(0.0), /*decoupled_weight_decay=*/false) {
  init(std::move(groups), defaults);
}

Adam::Adam(std::string name, Hyperparameters defaults, bool decoupled_weight_decay)
    : Optimizer(std::move(name), kAdamKeys, defaults), decoupled_weight_decay_(decoupled_weight_decay) {}

void Adam::check(const Hyperparameters& h, const std::string& where) const {
  if (!(h.lr >= 0.0)) invalid(name(), "Invalid learning rate: " + py_float(h.lr), where);
  if (!(h.eps >= 0.0)) invalid(name(), "Invalid epsilon value: " + py_float(h.eps), where);
  for (int i = 0; i < 2; ++i) {
    if (!(h.betas[i] >= 0.0 && h.betas[i] < 1.0)) {
      invalid(name(), fmt::format("Invalid beta parameter at index {}: {}", i, py_float(h.betas[i])), where);
    }
  }
  if (!(h.weight_decay >= 0.0)) invalid(name(), "Invalid weight_decay value: " + py_float(h.weight_decay), where);
}

void Adam::update(Tensor& param, const Tensor& grad, ParamState& state, const Hyperparameters& h) {
  // _single_tensor_adam / _single_tensor_adamw (not capturable, not differentiable), op for op.
  const auto [beta1, beta2] = h.betas;
  if (!state.exp_avg.defined()) {
    const TensorOptions like{param.dtype(), param.device()};
    state.exp_avg = zeros(param.shape(), like);
    state.exp_avg_sq = zeros(param.shape(), like);
  }
  state.step += 1;

  Tensor g = h.maximize ? neg(grad) : grad;
  if (h.weight_decay != 0.0) {
    if (decoupled_weight_decay_) {
      param.copy_(mul(param, 1.0 - h.lr * h.weight_decay));
    } else {
      g = fused_add(g, param, h.weight_decay, result_type(g, param));
    }
  }

  Tensor& exp_avg = state.exp_avg;
  Tensor& exp_avg_sq = state.exp_avg_sq;
  exp_avg.copy_(fused_lerp(exp_avg, g, 1.0 - beta1, exp_avg.dtype()));
  exp_avg_sq.copy_(fused_addcmul(mul(exp_avg_sq, beta2), g, g, 1.0 - beta2, exp_avg_sq.dtype()));

  // The Python-side scalars, in double.
  const double step = static_cast<double>(state.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, step);
  const double bias_correction2 = 1.0 - std::pow(beta2, step);
  const double step_size = h.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  Tensor second = exp_avg_sq;
  if (h.amsgrad) {
    // Created here rather than with the others, so that amsgrad can be switched on mid-run.
    if (!state.max_exp_avg_sq.defined()) state.max_exp_avg_sq = zeros(param.shape(), {param.dtype(), param.device()});
    state.max_exp_avg_sq.copy_(exact_maximum(state.max_exp_avg_sq, exp_avg_sq));
    second = state.max_exp_avg_sq;
  }
  const Tensor denom = add(div(sqrt(second), bias_correction2_sqrt), h.eps);
  // fused_addcdiv(param, exp_avg, denom, -step_size), its update u = -step_size * m / denom computed apart.
  const DType m = opmath(param.dtype());
  apply_update(param, mul(div(exp_avg.to(m), denom.to(m)), -step_size), h.eps, &second);
}

AdamW::AdamW(std::vector<Tensor> params, const OptimizerOptions& options)
    : AdamW(one_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroupSpec> groups, const OptimizerOptions& defaults)
    : Adam("AdamW", adam_defaults(1e-2), /*decoupled_weight_decay=*/true) {
  init(std::move(groups), defaults);
}

// ---- registry ----

void OptimizerRegistry::add(std::string name, OptimizerFactory factory) {
  if (factories_.contains(name)) {
    throw Error(fmt::format("optimizer registry: '{}' is already registered\nhint: pick another name", name));
  }
  factories_.emplace(std::move(name), std::move(factory));
}

std::unique_ptr<Optimizer> OptimizerRegistry::create(std::string_view name, std::vector<ParamGroupSpec> groups,
                                                     const OptimizerOptions& options) const {
  const auto it = factories_.find(name);
  if (it == factories_.end()) {
    throw Error(fmt::format("unknown optimizer '{}'; known optimizers: {}", name, fmt::join(names(), ", ")));
  }
  return it->second(std::move(groups), options);
}

bool OptimizerRegistry::contains(std::string_view name) const { return factories_.find(name) != factories_.end(); }

std::vector<std::string> OptimizerRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, factory] : factories_) out.push_back(name);
  return out;  // std::map keeps them sorted
}

OptimizerRegistry& optimizer_registry() {
  static OptimizerRegistry registry = [] {
    OptimizerRegistry r;
    r.add("sgd", [](std::vector<ParamGroupSpec> g, const OptimizerOptions& o) {
      return std::make_unique<SGD>(std::move(g), o);
    });
    r.add("adam", [](std::vector<ParamGroupSpec> g, const OptimizerOptions& o) {
      return std::make_unique<Adam>(std::move(g), o);
    });
    r.add("adamw", [](std::vector<ParamGroupSpec> g, const OptimizerOptions& o) {
      return std::make_unique<AdamW>(std::move(g), o);
    });
    return r;
  }();
  return registry;
}

std::unique_ptr<Optimizer> make_optimizer(std::string_view name, std::vector<Tensor> params,
                                          const OptimizerOptions& options) {
  return optimizer_registry().create(name, one_group(std::move(params)), options);
}

// ---- learning-rate schedules ----

LRScheduler::LRScheduler(Optimizer& optimizer, ClosedForm closed_form, std::int64_t last_epoch)
    : optimizer_(&optimizer), closed_form_(std::move(closed_form)), last_epoch_(last_epoch) {
  if (last_epoch < -1) {
    throw Error(fmt::format("LRScheduler: last_epoch must be -1 (a fresh schedule) or an epoch >= 0, got {}",
                            last_epoch));
  }
  std::vector<ParamGroup>& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    ParamGroup& group = groups[i];
    if (last_epoch == -1) {
      if (!group.initial_lr) group.initial_lr = group.options.lr;
    } else if (!group.initial_lr) {
      throw Error(fmt::format("LRScheduler: param 'initial_lr' is not specified in param_groups[{}] when resuming an "
                              "optimizer\nhint: restore the optimizer's groups (with initial_lr) before the schedule, "
                              "or start it with last_epoch = -1",
                              i));
    }
    base_lrs_.push_back(*group.initial_lr);
  }
  step();
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::apply() {
  std::vector<ParamGroup>& groups = optimizer_->param_groups();
  last_lr_.clear();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    // A group added after the schedule started takes its own lr as its base, as it would in PyTorch
    // after re-creating the scheduler.
    if (i >= base_lrs_.size()) {
      if (!groups[i].initial_lr) groups[i].initial_lr = groups[i].options.lr;
      base_lrs_.push_back(*groups[i].initial_lr);
    }
    groups[i].options.lr = closed_form_(base_lrs_[i], last_epoch_);
    last_lr_.push_back(groups[i].options.lr);
  }
}

namespace {

LRScheduler::ClosedForm step_form(std::int64_t step_size, double gamma) {
  if (step_size <= 0) throw Error(fmt::format("StepLR: step_size must be positive, got {}", step_size));
  return [=](double base_lr, std::int64_t epoch) {
    return base_lr * std::pow(gamma, static_cast<double>(epoch / step_size));
  };
}

LRScheduler::ClosedForm cosine_form(std::int64_t t_max, double eta_min) {
  if (t_max <= 0) throw Error(fmt::format("CosineAnnealingLR: T_max must be positive, got {}", t_max));
  return [=](double base_lr, std::int64_t epoch) {
    return eta_min + (base_lr - eta_min) *
                         (1.0 + std::cos(std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max))) /
                         2.0;
  };
}

LRScheduler::ClosedForm linear_form(double start_factor, double end_factor, std::int64_t total_iters) {
  if (start_factor > 1.0 || !(start_factor > 0.0)) {
    throw Error(fmt::format("LinearLR: Starting multiplicative factor expected to be greater than 0 and less or equal "
                            "to 1. (got {})",
                            py_float(start_factor)));
  }
  if (end_factor > 1.0 || !(end_factor >= 0.0)) {
    throw Error(fmt::format("LinearLR: Ending multiplicative factor expected to be between 0 and 1. (got {})",
                            py_float(end_factor)));
  }
  if (total_iters <= 0) throw Error(fmt::format("LinearLR: total_iters must be positive, got {}", total_iters));
  return [=](double base_lr, std::int64_t epoch) {
    const double done = static_cast<double>(std::min(total_iters, epoch));
    return base_lr * (start_factor + (end_factor - start_factor) * done / static_cast<double>(total_iters));
  };
}

// Runs forms[i] from milestones[i - 1] on, restarted at its epoch 0 there.
LRScheduler::ClosedForm sequential_form(std::vector<LRScheduler::ClosedForm> forms,
                                        std::vector<std::int64_t> milestones) {
  return [forms = std::move(forms), milestones = std::move(milestones)](double base_lr, std::int64_t epoch) {
    const auto idx = static_cast<std::size_t>(std::upper_bound(milestones.begin(), milestones.end(), epoch) -
                                              milestones.begin());
    const std::int64_t local = idx == 0 ? epoch : epoch - milestones[idx - 1];
    return forms[idx](base_lr, local);
  };
}

LRScheduler::ClosedForm sequential_form(const Optimizer& optimizer,
                                        const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
                                        std::vector<std::int64_t> milestones) {
  if (schedulers.empty()) throw Error("SequentialLR: expects at least one scheduler");
  if (schedulers.size() != milestones.size() + 1) {
    throw Error(fmt::format("SequentialLR: Sequential Schedulers expects number of schedulers provided to be one more "
                            "than the number of milestone points, but got number of schedulers {} and the number of "
                            "milestones to be equal to {}",
                            schedulers.size(), milestones.size()));
  }
  std::vector<LRScheduler::ClosedForm> forms;
  for (std::size_t i = 0; i < schedulers.size(); ++i) {
    if (!schedulers[i]) throw Error(fmt::format("SequentialLR: scheduler {} is null", i));
    if (&schedulers[i]->optimizer() != &optimizer) {
      throw Error(fmt::format("SequentialLR: Sequential Schedulers expects all schedulers to belong to the same "
                              "optimizer, but got schedulers at index {} to be different than the optimizer passed in.",
                              i));
    }
    forms.push_back(schedulers[i]->closed_form());
  }
  for (std::size_t i = 0; i < milestones.size(); ++i) {
    if (milestones[i] <= 0 || (i > 0 && milestones[i] <= milestones[i - 1])) {
      throw Error(fmt::format("SequentialLR: milestones must be positive and increasing, got [{}]",
                              fmt::join(milestones, ", ")));
    }
  }
  return sequential_form(std::move(forms), std::move(milestones));
}

LRScheduler::ClosedForm warmup_cosine_form(std::int64_t warmup_iters, std::int64_t total_iters, double start_factor,
                                           double eta_min) {
  if (warmup_iters < 0 || total_iters <= warmup_iters) {
    throw Error(fmt::format("WarmupCosineLR: needs 0 <= warmup_iters < total_iters, got warmup_iters {} and "
                            "total_iters {}",
                            warmup_iters, total_iters));
  }
  LRScheduler::ClosedForm cosine = cosine_form(total_iters - warmup_iters, eta_min);
  if (warmup_iters == 0) return cosine;
  return sequential_form({linear_form(start_factor, 1.0, warmup_iters), std::move(cosine)}, {warmup_iters});
}

}  // namespace

StepLR::StepLR(Optimizer& optimizer, std::int64_t step_size, double gamma, std::int64_t last_epoch)
    : LRScheduler(optimizer, step_form(step_size, gamma), last_epoch) {}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, std::int64_t t_max, double eta_min, std::int64_t last_epoch)
    : LRScheduler(optimizer, cosine_form(t_max, eta_min), last_epoch) {}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, std::int64_t total_iters,
                   std::int64_t last_epoch)
    : LRScheduler(optimizer, linear_form(start_factor, end_factor, total_iters), last_epoch) {}

SequentialLR::SequentialLR(Optimizer& optimizer, const std::vector<std::shared_ptr<LRScheduler>>& schedulers,
                           std::vector<std::int64_t> milestones, std::int64_t last_epoch)
    : LRScheduler(optimizer, sequential_form(optimizer, schedulers, std::move(milestones)), last_epoch) {}

WarmupCosineLR::WarmupCosineLR(Optimizer& optimizer, std::int64_t warmup_iters, std::int64_t total_iters,
                               double start_factor, double eta_min, std::int64_t last_epoch)
    : LRScheduler(optimizer, warmup_cosine_form(warmup_iters, total_iters, start_factor, eta_min), last_epoch) {}

// ---- gradient clipping ----

namespace {

// torch.linalg.vector_norm(x, ord) for ord 2 or inf: accumulated in float, rounded to x's dtype.
Tensor vector_norm_of(const Tensor& x, bool inf_norm) {
  if (x.numel() == 0) return zeros({}, {x.dtype(), x.device()});
  if (inf_norm) {
    // max |x|, exact in any dtype; argmax counts NaN as the largest, so a NaN comes out as the norm.
    // (ops.h has no max reduction yet, so the index makes one trip to the host per gradient.)
    const Tensor flat = x.reshape({-1});
    const Tensor magnitude = exact_abs(flat);
    const auto at = static_cast<std::int64_t>(argmax(magnitude, 0).item());
    return magnitude.slice(0, at, at + 1).reshape({}).clone();
  }
  const Tensor xm = x.to(opmath(x.dtype()));
  return sqrt(sum(mul(xm, xm))).to(x.dtype());
}

bool check_norm_type(const char* function, double norm_type) {
  const bool inf_norm = std::isinf(norm_type) && norm_type > 0;
  if (!inf_norm && norm_type != 2.0) {
    throw Error(fmt::format("{}: norm_type {} is not supported\nhint: use 2.0 or infinity "
                            "(optim::kInfNorm)",
                            function, py_float(norm_type)));
  }
  return inf_norm;
}

// PyTorch groups the tensors by (device, dtype), in order of first appearance, and stacks the per-tensor
// norms group after group: that order decides how the total's sum rounds.
std::vector<std::pair<std::pair<Device, DType>, std::vector<Tensor>>> group_by_device_and_dtype(
    const std::vector<Tensor>& tensors) {
  std::vector<std::pair<std::pair<Device, DType>, std::vector<Tensor>>> groups;
  for (const Tensor& g : tensors) {
    const std::pair<Device, DType> key{g.device(), g.dtype()};
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {}});
      it = std::prev(groups.end());
    }
    it->second.push_back(g);
  }
  return groups;
}

Tensor total_norm_of(const std::vector<std::pair<std::pair<Device, DType>, std::vector<Tensor>>>& groups,
                     bool inf_norm) {
  const Device first_device = groups.front().second.front().device();
  std::vector<Tensor> norms;
  DType total_dtype = groups.front().first.second;
  for (const auto& [key, members] : groups) {
    total_dtype = promote_types(total_dtype, key.second);
    for (const Tensor& g : members) norms.push_back(vector_norm_of(g, inf_norm));
  }
  std::vector<Tensor> stacked;
  for (const Tensor& n : norms) stacked.push_back(n.to(first_device).to(total_dtype).reshape({1}));
  return vector_norm_of(cat(stacked, 0), inf_norm);
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type) {
  const bool inf_norm = check_norm_type("get_total_norm", norm_type);
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;
  std::vector<Tensor> defined;
  for (const Tensor& t : tensors) {
    if (t.defined()) defined.push_back(t);
  }
  if (defined.empty()) return zeros({});
  return total_norm_of(group_by_device_and_dtype(defined), inf_norm);
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  const bool inf_norm = check_norm_type("clip_grad_norm_", norm_type);
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return zeros({});

  const auto groups = group_by_device_and_dtype(grads);
  const Tensor total = total_norm_of(groups, inf_norm);

  if (error_if_nonfinite && !std::isfinite(total.item())) {
    throw Error(fmt::format("clip_grad_norm_: The total norm of order {} for gradients from `parameters` is "
                            "non-finite, so it cannot be clipped. To disable this error and scale the gradients by "
                            "the non-finite norm anyway, set `error_if_nonfinite=False`\nhint: a gradient holds inf "
                            "or NaN; with mixed precision, unscale the gradients with the GradScaler before clipping "
                            "and let it skip the step",
                            py_float(norm_type)));
  }

  // max_norm / (total + 1e-6) is Tensor.__rtruediv__, i.e. reciprocal(total + 1e-6) * max_norm.
  const Tensor one = full({}, 1.0, {total.dtype(), total.device()});
  const Tensor clip_coef = mul(div(one, add(total, 1e-6)), max_norm);
  const Tensor clamped = clamp(clip_coef, std::nullopt, 1.0);
  for (const auto& [key, members] : groups) {
    // Converted to the gradients' dtype first, as the kernel loads it for a mul_ into them.
    const Tensor coef = clamped.to(key.first).to(key.second);
    for (const Tensor& g : members) {
      Tensor target = g;
      target.copy_(mul(g, coef));
    }
  }
  return total;
}

// ---- the GPU fast path (issue 10) ----

namespace {

// One fused kernel per group (the backend's fused AMP hooks, core/backend.h; the CUDA backend's
// kernels/cuda/fused_amp.h) instead of SGD::update / Adam::update's ops per parameter, with the same
// bits. Taken only when every parameter with a gradient (every one this rank owns, when sharded), its gradient
// and its state are contiguous f32 tensors on one device whose backend has the fused kernels switched on;
// anything else (the CPU backend, f16 parameters, views) runs the unfused loop. The state is created here as the unfused path creates it.
bool try_fused_step(Optimizer& opt) {
  // Exactly these classes: a subclass may override update(), which the fused kernels would bypass.
  const std::type_info& type = typeid(opt);
  const bool sgd = type == typeid(SGD);
  const bool decoupled = type == typeid(AdamW);
  if (!sgd && !decoupled && type != typeid(Adam)) return false;
  std::optional<Device> device;
  auto usable = [&](const Tensor& t, const Tensor& p) {
    return !t.defined() || (t.device() == p.device() && t.dtype() == DType::f32 && t.is_contiguous() &&
                            t.shape() == p.shape());
  };
  for (const ParamGroup& group : opt.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor grad = p.grad();
      if (!grad.defined() || !opt.owns(p)) continue;
      if (device && *device != p.device()) return false;
      if (!device && !backend_for(p.device()).fused_optimizer_available()) return false;
      device = p.device();
      if (p.dtype() != DType::f32 || !p.is_contiguous() || !usable(grad, p)) return false;
      if (const ParamState* st = opt.find_state(p)) {
        if (!usable(st->momentum_buffer, p) || !usable(st->exp_avg, p) || !usable(st->exp_avg_sq, p) ||
            !usable(st->max_exp_avg_sq, p)) {
          return false;
        }
      }
    }
  }
  if (!device) return false;
  Backend& backend = backend_for(*device);
  for (const ParamGroup& group : opt.param_groups()) {
    const Hyperparameters& h = group.options;
    if (sgd) {
      std::vector<FusedSgdTensor> tensors;
      for (const Tensor& p : group.params) {
        const Tensor grad = p.grad();
        if (!grad.defined() || !opt.owns(p)) continue;
        ParamState& st = opt.state(p);
        const bool first = h.momentum != 0.0 && !st.momentum_buffer.defined();
        if (first) st.momentum_buffer = zeros(p.shape(), {DType::f32, p.device()});  // the kernel writes g
        tensors.push_back({p.kernel_view(), grad.kernel_view(),
                           h.momentum != 0.0 ? st.momentum_buffer.kernel_view() : TensorView{}, first});
      }
      backend.fused_sgd_step(tensors,
                             {.lr = h.lr, .momentum = h.momentum, .dampening = h.dampening,
                              .weight_decay = h.weight_decay, .nesterov = h.nesterov, .maximize = h.maximize},
                             /*found_inf=*/nullptr);
    } else {
      std::vector<FusedAdamTensor> tensors;
      for (const Tensor& p : group.params) {
        const Tensor grad = p.grad();
        if (!grad.defined() || !opt.owns(p)) continue;
        ParamState& st = opt.state(p);
        const TensorOptions like{DType::f32, p.device()};
        if (!st.exp_avg.defined()) {
          st.exp_avg = zeros(p.shape(), like);
          st.exp_avg_sq = zeros(p.shape(), like);
        }
        if (h.amsgrad && !st.max_exp_avg_sq.defined()) st.max_exp_avg_sq = zeros(p.shape(), like);
        st.step += 1;
        tensors.push_back({p.kernel_view(), grad.kernel_view(), st.exp_avg.kernel_view(), st.exp_avg_sq.kernel_view(),
                           h.amsgrad ? st.max_exp_avg_sq.kernel_view() : TensorView{}, st.step});
      }
      backend.fused_adam_step(tensors,
                              {.lr = h.lr, .beta1 = h.betas[0], .beta2 = h.betas[1], .eps = h.eps,
                               .weight_decay = h.weight_decay, .amsgrad = h.amsgrad, .maximize = h.maximize,
                               .decoupled_weight_decay = decoupled},
                              /*found_inf=*/nullptr);
    }
  }
  return true;
}

}  // namespace

}  // namespace ampscope::optim
