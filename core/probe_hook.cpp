#include "core/probe_hook.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace ampscope::probe {
namespace {
std::mutex g_mutex;
std::shared_ptr<Hook> g_hook;       // owner
std::atomic<Hook*> g_raw{nullptr};  // what the hot path reads
}  // namespace

std::string_view policy_name(AutocastPolicy policy) {
  switch (policy) {
    case AutocastPolicy::none: return "none";
    case AutocastPolicy::lower_precision_fp: return "lower_precision_fp";
    case AutocastPolicy::fp32: return "fp32";
    case AutocastPolicy::fp32_set_opt_dtype: return "fp32_set_opt_dtype";
    case AutocastPolicy::promote: return "promote";
    case AutocastPolicy::banned: return "banned";
  }
  return "?";
}

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::scaler: return "scaler";
  }
  return "?";
}

namespace {
std::atomic<std::int64_t> g_step{-1};
std::atomic<std::int64_t> g_seq{0};
// Ops outside any step (step -1) count on their own, never reset: every pass outside steps gets seqs
// no earlier one had, so a row of step -1 names the right producer.
std::atomic<std::int64_t> g_outside_seq{0};

// What happened in the open step that probe::Step must know: which optimizers stepped and which scalers
// updated (detail::note_acted), and whether unscaled gradients reached the hook.
struct OpenStep {
  std::mutex mutex;
  bool open = false;
  bool grads_reported = false;
  std::vector<const void*> acted;
};
OpenStep g_open;

void reset_open_step(bool open) {
  std::lock_guard<std::mutex> lock(g_open.mutex);
  g_open.open = open;
  g_open.grads_reported = false;
  g_open.acted.clear();
}
}  // namespace

std::int64_t current_step() { return g_step.load(); }
std::int64_t next_seq() { return g_step.load() < 0 ? g_outside_seq.fetch_add(1) : g_seq.fetch_add(1); }

StepScope::StepScope(std::int64_t step) : step_(step) {
  g_step.store(step);
  g_seq.store(0);
  reset_open_step(true);
  if (Hook* h = hook()) h->on_step_begin(step);
}

void StepScope::end(const StepSummary& summary) {
  if (ended_) return;
  ended_ = true;
  // The step is over whatever the hook does: a hook that throws must not leave the clock inside it.
  struct Close {
    ~Close() {
      g_step.store(-1);
      reset_open_step(false);
    }
  } close;
  if (Hook* h = hook()) h->on_step_end(summary);
}

StepScope::~StepScope() {
  if (ended_) return;
  g_step.store(-1);
  reset_open_step(false);
  if (Hook* h = hook()) {
    try {
      h->on_step_abandoned(step_);
    } catch (...) {
      // A destructor must not throw (it may run while an exception unwinds the step); the hook's own
      // error surfaces at its next call or its flush.
    }
  }
}

bool unscaled_grads_reported() {
  std::lock_guard<std::mutex> lock(g_open.mutex);
  return g_open.grads_reported;
}

namespace detail {
void note_acted(const void* object) {
  std::lock_guard<std::mutex> lock(g_open.mutex);
  if (g_open.open && std::find(g_open.acted.begin(), g_open.acted.end(), object) == g_open.acted.end()) {
    g_open.acted.push_back(object);
  }
}

bool acted_in_open_step(const void* object) {
  std::lock_guard<std::mutex> lock(g_open.mutex);
  return g_open.open && std::find(g_open.acted.begin(), g_open.acted.end(), object) != g_open.acted.end();
}
}  // namespace detail

void report_grads(const std::vector<Tensor>& params, bool unscaled, bool before_all_reduce) {
  Hook* h = hook();
  if (h == nullptr) return;
  std::vector<std::pair<std::string, Tensor>> grads;
  grads.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    grads.emplace_back(params[i].name().empty() ? "parameter " + std::to_string(i) : params[i].name(), g);
  }
  h->on_grads(GradEvent{current_step(), unscaled, grads, before_all_reduce});
  if (unscaled && !before_all_reduce) {
    std::lock_guard<std::mutex> lock(g_open.mutex);
    g_open.grads_reported = g_open.open;
  }
}

void report_params(const std::vector<Tensor>& params) {
  Hook* h = hook();
  if (h == nullptr || !h->wants_params()) return;
  std::vector<std::pair<std::string, Tensor>> named;
  named.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    named.emplace_back(params[i].name().empty() ? "parameter " + std::to_string(i) : params[i].name(), params[i]);
  }
  h->on_params(ParamsEvent{current_step(), named});
}

std::string_view change_name(ScalerEvent::Change change) {
  switch (change) {
    case ScalerEvent::Change::kept: return "kept";
    case ScalerEvent::Change::growth: return "growth";
    case ScalerEvent::Change::backoff: return "backoff";
    case ScalerEvent::Change::explicit_scale: return "explicit_scale";
  }
  return "?";
}

Hook* hook() { return g_raw.load(std::memory_order_acquire); }

void set_hook(std::shared_ptr<Hook> h) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_raw.store(h.get(), std::memory_order_release);
  g_hook = std::move(h);
}

HookGuard::HookGuard(std::shared_ptr<Hook> h) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    previous_ = g_hook;
  }
  set_hook(std::move(h));
}

HookGuard::~HookGuard() { set_hook(std::move(previous_)); }

}  // namespace ampscope::probe
