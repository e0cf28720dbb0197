// Autocast: the policy table, the thread-local region state, the weight-cast cache, overrides, and the
// dispatch every public op goes through.
#include "core/autocast.h"

#include <fnmatch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/error.h"

namespace ampscope {

namespace {

using probe::AutocastPolicy;

// ---- the policy table: one line per op, grouped by policy (reference/amp-semantics.md 2.4, 2.9) ----
struct PolicyLine {
  std::string_view op;
  AutocastPolicy policy;
};
constexpr PolicyLine kPolicyTable[] = {
    // lower_precision_fp: matrix products and convolutions, the ops tensor cores make fast and whose
    // float accumulation keeps them accurate. Eligible inputs are cast to the autocast dtype.
    {"matmul", AutocastPolicy::lower_precision_fp},
    {"bmm", AutocastPolicy::lower_precision_fp},
    {"linear", AutocastPolicy::lower_precision_fp},
    {"conv2d", AutocastPolicy::lower_precision_fp},
    {"scaled_dot_product_attention", AutocastPolicy::lower_precision_fp},

    // fp32: ops whose range or precision f16 cannot hold (exp overflows above 11.09, log and pow lose
    // precision, losses and norms sum many terms). Eligible inputs are cast to f32.
    {"exp", AutocastPolicy::fp32},
    {"log", AutocastPolicy::fp32},
    {"rsqrt", AutocastPolicy::fp32},
    {"pow", AutocastPolicy::fp32},
    {"log1p", AutocastPolicy::fp32},
    {"expm1", AutocastPolicy::fp32},
    {"reciprocal", AutocastPolicy::fp32},
    {"softplus", AutocastPolicy::fp32},
    {"layer_norm", AutocastPolicy::fp32},
    {"nll_loss", AutocastPolicy::fp32},
    {"mse_loss", AutocastPolicy::fp32},
    {"binary_cross_entropy_with_logits", AutocastPolicy::fp32},

    // fp32_set_opt_dtype: reductions that take a dtype argument. Without one, and with an eligible first
    // input, they compute and return f32; an explicit dtype is respected. Inputs are not cast.
    {"softmax", AutocastPolicy::fp32_set_opt_dtype},
    {"log_softmax", AutocastPolicy::fp32_set_opt_dtype},
    {"sum", AutocastPolicy::fp32_set_opt_dtype},

    // promote: none of our ops is on PyTorch's promote list (addcmul, addcdiv, cross, dot, ...); add,
    // mul, cat and where reach the same f32 result through built-in type promotion.
    // On no list (run in their inputs' dtype, as in PyTorch): rsub, abs, logsigmoid, clamp_min,
    // clamp_max, maximum, minimum (built-in promotion for mixed inputs), max, min, amax, amin, var, std,
    // silu.

    // banned: unsafe because a sigmoid usually precedes it, so its f16 input has already lost the
    // probabilities near 0 and 1 that the loss needs.
    {"binary_cross_entropy", AutocastPolicy::banned},
};

constexpr std::string_view kBannedMessage =
    "binary_cross_entropy is unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer. In this case, combine the "
    "two layers using binary_cross_entropy_with_logits, which is safe to autocast (it computes in f32).\n"
    "hint: replace binary_cross_entropy(sigmoid(x), y) by binary_cross_entropy_with_logits(x, y), or call it "
    "inside AutocastGuard(std::nullopt, /*enabled=*/false) with f32 inputs";

// ---- thread-local state ----
struct ThreadState {
  bool enabled = false;
  DType dtype = DType::f16;  // CUDA's default lower-precision dtype
  bool cache_enabled = true;
  int nesting = 0;
  int internal = 0;  // RuntimeInternalGuard depth
  int op_depth = 0;  // OpDispatch depth: > 0 inside an op
  int suppress = 0;  // inside a listed composite's steps
  std::string_view composite;  // the listed composite whose steps these are
};
thread_local ThreadState t_state;

// ---- the weight-cast cache (process-wide, as PyTorch's) ----
struct CacheEntry {
  Tensor source;  // keeps the parameter alive while its cast is cached, so its identity is not reused
  Tensor cast;
};
std::mutex g_cache_mutex;
std::unordered_map<const void*, CacheEntry> g_cache;

// ---- overrides ----
struct OverrideEntry {
  std::uint64_t id;
  AutocastOverride rule;
};
std::mutex g_override_mutex;
std::vector<OverrideEntry> g_overrides;
std::atomic<bool> g_have_overrides{false};
std::atomic<std::uint64_t> g_next_override{1};
std::atomic<std::uint64_t> g_op_index{0};

bool glob_matches(const std::string& pattern, std::string_view text) {
  return pattern.empty() || fnmatch(pattern.c_str(), std::string(text).c_str(), 0) == 0;
}

std::optional<AutocastOverride> find_override(std::string_view op, const std::string& scope) {
  if (!g_have_overrides.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard<std::mutex> lock(g_override_mutex);
  for (const OverrideEntry& e : g_overrides) {
    if (glob_matches(e.rule.op, op) && glob_matches(e.rule.module, scope)) return e.rule;
  }
  return std::nullopt;
}

std::string describe_override(const AutocastOverride& o, DType target) {
  std::string what;
  if (!o.op.empty()) what += fmt::format("op '{}'", o.op);
  if (!o.module.empty()) what += fmt::format("{}module '{}'", what.empty() ? "" : ", ", o.module);
  if (what.empty()) what = "every op";
  return fmt::format("override ({}) -> {}", what, dtype_name(target));
}

// CUDA, floating point, not f64 (2.2). Our CPU backend stands in for the GPU, so any device qualifies.
bool eligible(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16);
}

// A parameter-like tensor whose lower-precision cast may be cached (2.6): an f32 leaf that requires
// grad and is not a view (it owns its whole storage from the start).
bool cacheable(const Tensor& t, DType target) {
  return t_state.cache_enabled && target == t_state.dtype && t.dtype() == DType::f32 && t.requires_grad() &&
         t.is_leaf() && t.storage_offset() == 0 && t.is_contiguous();
}

// Casts args[i] to `target` when it is eligible and differs, recording the cast.
void cast_arg(std::vector<Tensor>& args, std::size_t i, DType target, probe::AutocastInfo& info) {
  Tensor& a = args[i];
  if (!eligible(a) || a.dtype() == target) return;
  const DType from = a.dtype();
  const Tensor source = a;
  bool hit = false;
  RuntimeInternalGuard internal;  // the cast is reported as part of the op (CastRecord), not as an op "to"
  if (cacheable(a, target)) {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto it = g_cache.find(a.id());
    if (it != g_cache.end()) {
      a = it->second.cast;
      hit = true;
    } else {
      Tensor cast = a.to(target);
      g_cache.emplace(a.id(), CacheEntry{a, cast});
      a = cast;
    }
  } else {
    a = a.to(target);
  }
  // The cast is part of the op, not a reported op: its result carries what was cast's producer, so the
  // steps of a composite (attention's bmm on cast q, k, v) name the rows that made their inputs.
  a.set_producer(source.producer().first, source.producer().second);
  info.casts.push_back({static_cast<int>(i), from, target, hit, source, a});
}

// The promote policy: start at the autocast dtype; f32 anywhere wins; an f16/bf16 mix is an error.
DType promote_target(std::string_view op, const std::vector<Tensor>& args) {
  DType result = t_state.dtype;
  for (const Tensor& a : args) {
    if (!eligible(a)) continue;
    if (result == DType::f32 || a.dtype() == DType::f32) {
      result = DType::f32;
    } else if (a.dtype() != result) {
      throw DTypeError(fmt::format("{}: Unexpected floating ScalarType in at::autocast::prioritize: {} in a {} "
                                   "autocast region",
                                   op, dtype_name(a.dtype()), dtype_name(t_state.dtype)));
    }
  }
  return result;
}

}  // namespace

// ---- regions ----

AutocastGuard::AutocastGuard(std::optional<DType> dtype, bool enabled, std::optional<bool> cache_enabled)
    : prev_enabled_(t_state.enabled), prev_dtype_(t_state.dtype), prev_cache_enabled_(t_state.cache_enabled) {
  const DType d = dtype.value_or(t_state.dtype);
  const bool supported = d == DType::f16 || d == DType::bf16;
  if (enabled && !supported) {
    throw DTypeError(fmt::format("autocast: the lower-precision dtype must be f16 or bf16, got {}\n"
                                 "hint: autocast only lowers precision; for f32 everywhere, run without it",
                                 dtype_name(d)));
  }
  t_state.enabled = enabled;
  // A disabled region given an unsupported dtype keeps the inherited one, so a nested enabled region
  // cannot inherit a dtype it must refuse.
  if (supported) t_state.dtype = d;
  t_state.cache_enabled = cache_enabled.value_or(t_state.cache_enabled);
  ++t_state.nesting;
}

AutocastGuard::~AutocastGuard() {
  if (--t_state.nesting == 0) clear_autocast_cache();
  t_state.enabled = prev_enabled_;
  t_state.dtype = prev_dtype_;
  t_state.cache_enabled = prev_cache_enabled_;
}

bool autocast_enabled() { return t_state.enabled; }
DType autocast_dtype() { return t_state.dtype; }
bool autocast_cache_enabled() { return t_state.cache_enabled; }

std::size_t autocast_cache_size() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return g_cache.size();
}

void clear_autocast_cache() {
  std::unordered_map<const void*, CacheEntry> dropped;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  dropped.swap(g_cache);
}

// ---- overrides ----

AutocastOverrideGuard::AutocastOverrideGuard(AutocastOverride rule) : id_(g_next_override.fetch_add(1)) {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  g_overrides.push_back({id_, std::move(rule)});
  g_have_overrides.store(true, std::memory_order_release);
}

AutocastOverrideGuard::~AutocastOverrideGuard() {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  g_overrides.erase(std::remove_if(g_overrides.begin(), g_overrides.end(),
                                   [this](const OverrideEntry& e) { return e.id == id_; }),
                    g_overrides.end());
  g_have_overrides.store(!g_overrides.empty(), std::memory_order_release);
}

std::vector<AutocastOverride> autocast_overrides() {
  std::lock_guard<std::mutex> lock(g_override_mutex);
  std::vector<AutocastOverride> out;
  for (const OverrideEntry& e : g_overrides) out.push_back(e.rule);
  return out;
}

probe::AutocastPolicy autocast_policy(std::string_view op) {
  for (const PolicyLine& line : kPolicyTable) {
    if (line.op == op) return line.policy;
  }
  return AutocastPolicy::none;
}

RuntimeInternalGuard::RuntimeInternalGuard() { ++t_state.internal; }
RuntimeInternalGuard::~RuntimeInternalGuard() { --t_state.internal; }

namespace detail {

namespace {
// Applies autocast to a user-level op's arguments: the table's policy or an override.
void apply_autocast(std::string_view op, std::vector<Tensor>& args, bool dtype_given, probe::AutocastInfo& info,
                    std::optional<DType>& set_dtype) {
  info.active = true;
  info.policy = autocast_policy(op);
  const DType lower = t_state.dtype;
  if (auto o = find_override(op, current_scope())) {
    const DType target = o->precision == Precision::f32 ? DType::f32 : lower;
    info.overridden = true;
    info.reason = fmt::format("{} (the table says {})", describe_override(*o, target), probe::policy_name(info.policy));
    for (std::size_t i = 0; i < args.size(); ++i) cast_arg(args, i, target, info);
    return;
  }
  switch (info.policy) {
    case AutocastPolicy::lower_precision_fp:
      info.reason = fmt::format("{} is on the lower_precision_fp list: runs in {}", op, dtype_name(lower));
      for (std::size_t i = 0; i < args.size(); ++i) cast_arg(args, i, lower, info);
      break;
    case AutocastPolicy::fp32:
      info.reason = fmt::format("{} is on the fp32 list: runs in f32", op);
      for (std::size_t i = 0; i < args.size(); ++i) cast_arg(args, i, DType::f32, info);
      break;
    case AutocastPolicy::fp32_set_opt_dtype:
      if (!dtype_given && !args.empty() && eligible(args[0])) {
        set_dtype = DType::f32;
        info.reason = fmt::format("{} is on the fp32_set_opt_dtype list: computes and returns f32", op);
      } else {
        info.reason = fmt::format("{} is on the fp32_set_opt_dtype list, but {}: runs as called", op,
                                  dtype_given ? "a dtype was given" : "its input is not eligible");
      }
      break;
    case AutocastPolicy::promote: {
      const DType target = promote_target(op, args);
      info.reason = fmt::format("{} is on the promote list: inputs promoted to {}", op, dtype_name(target));
      for (std::size_t i = 0; i < args.size(); ++i) cast_arg(args, i, target, info);
      break;
    }
    case AutocastPolicy::banned:
      throw Error(fmt::format("{}: {}", op, kBannedMessage));
    case AutocastPolicy::none:
      info.reason = fmt::format("{} is on no autocast list: runs in its inputs' dtype", op);
      break;
  }
}
}  // namespace

OpDispatch::OpDispatch(std::string_view op, std::vector<Tensor> args, bool dtype_given)
    : op_(op), args_(std::move(args)) {
  outer_ = t_state.op_depth == 0 && t_state.internal == 0;
  if (outer_ && t_state.enabled) {
    // Inside a listed composite (attention) the table does not apply to its steps: they run in the
    // dtype the composite's inputs were cast to, as PyTorch runs a wrapped op with autocast off. An
    // override still applies ("keep attention's softmax in f32" must work), and a later step then casts
    // that f32 result back to the composite's dtype, as a user doing it by hand would.
    if (t_state.suppress > 0 && !find_override(op_, current_scope())) {
      info_.active = true;
      info_.reason = fmt::format("a step of {} (lower_precision_fp): runs in {}", t_state.composite,
                                 dtype_name(t_state.dtype));
      for (std::size_t i = 0; i < args_.size(); ++i) cast_arg(args_, i, t_state.dtype, info_);
    } else {
      apply_autocast(op_, args_, dtype_given, info_, set_dtype_);
    }
  }
  ++t_state.op_depth;
  if (outer_) {
    if (probe::Hook* h = probe::hook()) {
      const std::string& scope = current_scope();
      wanted_ = h->wants_op(op_, scope);
      if (wanted_) h->before_op(op_, scope);
    }
  }
}

OpDispatch::~OpDispatch() { --t_state.op_depth; }

Tensor OpDispatch::finish(Tensor out, const std::function<Tensor(const std::vector<Tensor>&)>* recompute) {
  if (!outer_) return out;
  probe::Hook* h = probe::hook();
  if (h == nullptr) return out;
  const std::int64_t step = probe::current_step();
  if (!wanted_) {
    // Downstream ops must not mistake this output for data: say that an op the probe skipped wrote it.
    const bool passthrough = std::any_of(args_.begin(), args_.end(),
                                         [&](const Tensor& a) { return a.defined() && out.defined() && a.id() == out.id(); });
    if (out.defined() && !passthrough) out.set_producer(step, probe::Producer::unrecorded);
    return out;
  }
  const std::int64_t seq = probe::next_seq();
  const std::vector<Tensor> outputs{out};
  const probe::OpEvent event{op_, current_scope(), g_op_index.fetch_add(1), step, seq, probe::Phase::forward,
                             info_, args_, out, outputs, recompute};
  h->on_op(event);
  // An op that hands back one of its inputs unchanged (a no-op reshape) leaves that tensor's producer.
  const bool passthrough = std::any_of(args_.begin(), args_.end(),
                                       [&](const Tensor& a) { return a.defined() && out.defined() && a.id() == out.id(); });
  if (out.defined() && !passthrough) out.set_producer(step, seq);
  return out;
}

std::uint64_t next_op_index() { return g_op_index.fetch_add(1); }

std::vector<Tensor> autocast_composite_inputs(std::string_view op, std::vector<Tensor> args, bool& suppress_steps) {
  suppress_steps = false;
  if (t_state.op_depth > 0 || t_state.internal > 0 || !t_state.enabled || t_state.suppress > 0) return args;
  probe::AutocastInfo info;
  std::optional<DType> unused;
  apply_autocast(op, args, true, info, unused);
  suppress_steps = true;
  return args;
}

SuppressAutocast::SuppressAutocast(bool on, std::string_view composite) : on_(on) {
  if (!on_) return;
  ++t_state.suppress;
  previous_ = t_state.composite;
  t_state.composite = composite;
}
SuppressAutocast::~SuppressAutocast() {
  if (!on_) return;
  --t_state.suppress;
  t_state.composite = previous_;
}

}  // namespace detail
}  // namespace ampscope
