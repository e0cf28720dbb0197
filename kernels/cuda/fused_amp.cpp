// Host side of the fused AMP kernels (kernels/cuda/fused_amp.h): argument checks, batching into
// launches of at most kFusedMaxTensors tensors, the f32 scalars exactly as the unfused ops round them,
// and the launches on the backend's stream (no host synchronisation).
#include "kernels/cuda/fused_amp.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_stream.h"
#include "kernels/cuda/fused_launch.h"

namespace ampscope::cuda {
namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("AMPSCOPE_FUSED_AMP");
    return env != nullptr && std::string(env) == "1";
  }();
  return flag;
}

std::atomic<std::uint64_t> g_fused_calls{0};

// Runs `launch(stream)` on the backend's own stream (cuda_stream.h): ordered after everything queued there
// and before anything queued after, with no host synchronisation at all. found_inf stays on the device: the
// fused optimizer steps read it there, and the one wait of a step is the caller's, where GradScaler copies
// found_inf to the host to decide whether the step was skipped (docs/cuda.md, "What synchronises").
template <class Launch>
void run_ordered(Backend& backend, const char* kernel, Launch&& launch) {
  const cudaStream_t stream = backend_stream(backend, kernel);
  check_stale_error(kernel);
  const cudaError_t status = launch(stream);
  if (status != cudaSuccess) check(status, fmt::format("launch of kernel '{}'", kernel));
  g_fused_calls.fetch_add(1);
}

void check_f32(const TensorView& v, std::int64_t numel, const char* op, const char* what, std::size_t index) {
  if (v.dtype != DType::f32) {
    throw DTypeError(fmt::format("{}: {} of tensor {} is {}; the fused kernels take f32 only\nhint: use the "
                                 "unfused step (cuda::set_fused_amp_enabled(false)) for other dtypes",
                                 op, what, index, dtype_name(v.dtype)));
  }
  if (!v.is_contiguous() || v.numel != numel) {
    throw ShapeError(fmt::format("{}: {} of tensor {} must be contiguous with {} elements (it has {})", op, what,
                                 index, numel, v.numel));
  }
}

// Fills batches of at most kFusedMaxTensors entries and launches each.
template <class Batch, class Fill, class Launch>
void for_each_batch(std::size_t count, Fill&& fill, Launch&& launch) {
  for (std::size_t first = 0; first < count; first += kFusedMaxTensors) {
    Batch batch;
    const std::size_t last = std::min(count, first + kFusedMaxTensors);
    for (std::size_t i = first; i < last; ++i) {
      auto& entry = batch.tensors[batch.count++];
      fill(i, entry);
      batch.max_numel = std::max(batch.max_numel, entry.numel);
    }
    launch(batch);
  }
}

}  // namespace

bool fused_amp_enabled() { return enabled_flag().load(); }
void set_fused_amp_enabled(bool enabled) { enabled_flag().store(enabled); }
std::uint64_t fused_amp_call_count() { return g_fused_calls.load(); }

void fused_non_finite_check_and_unscale(Backend& backend, const std::vector<TensorView>& grads, float* found_inf,
                                        float inv_scale) {
  const char* op = "fused_non_finite_check_and_unscale";
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const TensorView& g = grads[i];
    if (g.dtype != DType::f32 && g.dtype != DType::f64 && g.dtype != DType::f16 && g.dtype != DType::bf16) {
      throw DTypeError(fmt::format("{}: grads[{}] is {}; only floating gradients can be unscaled", op, i,
                                   dtype_name(g.dtype)));
    }
    if (!g.is_contiguous()) {
      throw ShapeError(fmt::format("{}: grads[{}] is not contiguous\nhint: the unfused path "
                                   "(non_finite_check_and_unscale_ with the fused kernels off) takes any strides",
                                   op, i));
    }
  }
  if (grads.empty()) return;
  run_ordered(backend, "fused_unscale", [&](cudaStream_t s) {
    cudaError_t status = cudaSuccess;
    for_each_batch<UnscaleBatch>(
        grads.size(), [&](std::size_t i, UnscaleTensor& t) { t = {grads[i].data, grads[i].numel, grads[i].dtype}; },
        [&](const UnscaleBatch& b) {
          if (status == cudaSuccess) status = launch_fused_unscale(b, found_inf, inv_scale, s);
        });
    return status;
  });
}

void fused_update_scale(Backend& backend, float* scale, std::int32_t* growth_tracker, const float* found_inf,
                        double growth_factor, double backoff_factor, std::int64_t growth_interval) {
  run_ordered(backend, "fused_update_scale", [&](cudaStream_t s) {
    return launch_fused_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                     growth_interval, s);
  });
}

void fused_sgd_step(Backend& backend, const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& o,
                    const float* found_inf) {
  const char* op = "fused_sgd_step";
  const bool has_momentum = o.momentum != 0.0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const FusedSgdTensor& t = tensors[i];
    check_f32(t.param, t.param.numel, op, "param", i);
    check_f32(t.grad, t.param.numel, op, "grad", i);
    if (has_momentum) {
      if (t.momentum_buffer.data == nullptr) {
        throw Error(fmt::format("{}: tensor {} has no momentum buffer but momentum is {}", op, i, o.momentum));
      }
      check_f32(t.momentum_buffer, t.param.numel, op, "momentum_buffer", i);
    }
  }
  // The unfused path's scalars, rounded as its ops round them (kernels/optim_functors.h).
  const SgdStep step = sgd_step(o);
  if (tensors.empty()) return;
  run_ordered(backend, "fused_sgd", [&](cudaStream_t stream) {
    cudaError_t status = cudaSuccess;
    for_each_batch<SgdBatch>(
        tensors.size(),
        [&](std::size_t i, SgdTensor& e) {
          const FusedSgdTensor& t = tensors[i];
          e = {t.param.ptr<float>(), t.grad.ptr<float>(), has_momentum ? t.momentum_buffer.ptr<float>() : nullptr,
               t.param.numel, t.first_step};
        },
        [&](const SgdBatch& b) {
          if (status == cudaSuccess) status = launch_fused_sgd(b, step, found_inf, stream);
        });
    return status;
  });
}

void fused_adam_step(Backend& backend, const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& o,
                     const float* found_inf) {
  const char* op = "fused_adam_step";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const FusedAdamTensor& t = tensors[i];
    check_f32(t.param, t.param.numel, op, "param", i);
    check_f32(t.grad, t.param.numel, op, "grad", i);
    check_f32(t.exp_avg, t.param.numel, op, "exp_avg", i);
    check_f32(t.exp_avg_sq, t.param.numel, op, "exp_avg_sq", i);
    if (o.amsgrad) check_f32(t.max_exp_avg_sq, t.param.numel, op, "max_exp_avg_sq", i);
    if (t.step < 1) throw Error(fmt::format("{}: tensor {} has step {}; it must be at least 1", op, i, t.step));
  }
  // The unfused path's scalars (Adam::update and its fused_* helpers in core/optim.cpp), rounded as its
  // ops round them (kernels/optim_functors.h).
  const AdamScalars scalars = adam_scalars(o);
  const AdamFlags flags = adam_flags(o);
  if (tensors.empty()) return;
  run_ordered(backend, "fused_adam", [&](cudaStream_t stream) {
    cudaError_t status = cudaSuccess;
    for_each_batch<AdamBatch>(
        tensors.size(),
        [&](std::size_t i, AdamTensor& e) {
          const FusedAdamTensor& t = tensors[i];
          e.param = t.param.ptr<float>();
          e.grad = t.grad.ptr<float>();
          e.exp_avg = t.exp_avg.ptr<float>();
          e.exp_avg_sq = t.exp_avg_sq.ptr<float>();
          e.max_exp_avg_sq = o.amsgrad ? t.max_exp_avg_sq.ptr<float>() : nullptr;
          e.numel = t.param.numel;
          e.bias_correction = adam_bias_correction(o, t.step);
        },
        [&](const AdamBatch& b) {
          if (status == cudaSuccess) status = launch_fused_adam(b, scalars, flags, found_inf, stream);
        });
    return status;
  });
}

}  // namespace ampscope::cuda
