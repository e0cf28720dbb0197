// core/autocast.h: PyTorch's CUDA autocast (torch.autocast("cuda", ...)), with its exact policy, on
// every backend: the CPU backend stands in for the GPU, so an op that runs in f16 on the GPU runs in f16
// here too. Specification: reference/amp-semantics.md section 2.
//
//   {
//     AutocastGuard autocast;                         // f16 (the CUDA default); AutocastGuard(DType::bf16)
//     Tensor logits = linear(x, w, b);                // f16: linear is on the lower_precision_fp list
//     Tensor loss = cross_entropy(logits, y);         // f32: log_softmax and nll_loss compute in f32
//   }                                                 // leaving the outermost region clears the cast cache
//   loss.backward();                                  // outside the region, as PyTorch asks
//
// The policy is one table (autocast.cpp), one line per op, grouped by policy. Every dispatched op tells
// the probe hook (core/probe_hook.h) which policy applied, the dtype it ran in and the casts inserted.
// Overrides force ops or modules to f32 or to the lower dtype, for what-if runs:
//
//   AutocastOverrideGuard keep_attention_f32({.module = "blocks.*.attn.*", .precision = Precision::f32});
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/probe_hook.h"
#include "core/tensor.h"

namespace ampscope {

// autocast(device_type="cuda", dtype=None, enabled=True, cache_enabled=None). A dtype of nullopt inherits
// this thread's current autocast dtype (f16 unless an enclosing region set bf16); cache_enabled of
// nullopt inherits the current flag. Only f16 and bf16 are accepted. Thread-local and nestable; a
// disabled region (enabled = false) counts for nesting, so leaving it never clears the cache.
class AutocastGuard {
 public:
  explicit AutocastGuard(std::optional<DType> dtype = std::nullopt, bool enabled = true,
                         std::optional<bool> cache_enabled = std::nullopt);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
  bool prev_cache_enabled_;
};

bool autocast_enabled();        // this thread, now
DType autocast_dtype();         // this thread's lower-precision dtype (f16 by default)
bool autocast_cache_enabled();
std::size_t autocast_cache_size();  // cast weights currently cached (process-wide)
void clear_autocast_cache();

// ---- overrides ----
enum class Precision { f32, lower };
// Matches an op when both non-empty fields match: `op` against the op name ("softmax"), `module`
// against the module path of the op ("blocks.0.attn.qkv"); both are globs (*, ?, [..]).
struct AutocastOverride {
  std::string op{};
  std::string module{};
  Precision precision = Precision::f32;
};
// Installs an override for its lifetime (process-wide; the first installed match wins). Applied only
// inside enabled autocast regions, instead of the op's policy, and reported as the reason.
class AutocastOverrideGuard {
 public:
  explicit AutocastOverrideGuard(AutocastOverride override_rule);
  ~AutocastOverrideGuard();
  AutocastOverrideGuard(const AutocastOverrideGuard&) = delete;
  AutocastOverrideGuard& operator=(const AutocastOverrideGuard&) = delete;

 private:
  std::uint64_t id_;
};

// The overrides installed now, in the order they are tried (for probes recording what shaped a run).
std::vector<AutocastOverride> autocast_overrides();

// The policy of an op name in the table (none for ops on no list).
probe::AutocastPolicy autocast_policy(std::string_view op);

// Ops the runtime calls on its own behalf (backward, optimizer and scaler updates, initialisation) run
// without autocast and are not reported to probes while this guard lives (thread-local, nestable).
class RuntimeInternalGuard {
 public:
  RuntimeInternalGuard();
  ~RuntimeInternalGuard();
  RuntimeInternalGuard(const RuntimeInternalGuard&) = delete;
  RuntimeInternalGuard& operator=(const RuntimeInternalGuard&) = delete;
};

namespace detail {

// One call of a public op, as core/ops.cpp dispatches it: autocast's casts applied to the arguments,
// then the op body with autocast off for everything it calls, then the probe event.
class OpDispatch {
 public:
  // `dtype_given`: for fp32_set_opt_dtype ops, whether the caller passed a dtype.
  OpDispatch(std::string_view op, std::vector<Tensor> args, bool dtype_given = true);
  ~OpDispatch();
  OpDispatch(const OpDispatch&) = delete;
  OpDispatch& operator=(const OpDispatch&) = delete;

  const Tensor& arg(std::size_t i) const { return args_[i]; }
  // For fp32_set_opt_dtype ops: the dtype autocast asks for (f32), or nullopt.
  std::optional<DType> set_dtype() const { return set_dtype_; }
  // Reports the op to the probe hook (if any wants it) and returns out. `recompute`: the op's body on other
  // arguments (probe::OpEvent::recompute), or null.
  Tensor finish(Tensor out, const std::function<Tensor(const std::vector<Tensor>&)>* recompute = nullptr);
  // Whether finish() will report the op to a hook (a user-level call that the installed hook wants).
  bool reported() const { return outer_ && wanted_; }

 private:
  std::string_view op_;
  std::vector<Tensor> args_;
  std::optional<DType> set_dtype_;
  probe::AutocastInfo info_;
  bool outer_ = false;   // a user-level call (not an op called from inside another op or the runtime)
  bool wanted_ = false;  // the probe hook asked for this op
};

// The process-wide running index of reported events (OpEvent::index).
std::uint64_t next_op_index();

// Composite ops (cross_entropy, scaled_dot_product_attention) do not take an OpDispatch: their steps
// are dispatched, and reported, one by one. A composite that autocast lists (attention is
// lower_precision_fp) casts its inputs with this and then runs its steps in that dtype, outside the
// table (only overrides apply to them).
std::vector<Tensor> autocast_composite_inputs(std::string_view op, std::vector<Tensor> args, bool& suppress_steps);
class SuppressAutocast {
 public:
  SuppressAutocast(bool on, std::string_view composite);
  ~SuppressAutocast();
  SuppressAutocast(const SuppressAutocast&) = delete;
  SuppressAutocast& operator=(const SuppressAutocast&) = delete;

 private:
  bool on_;
  std::string_view previous_;
};

}  // namespace detail
}  // namespace ampscope
