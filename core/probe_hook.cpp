#include "core/probe_hook.h"

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
