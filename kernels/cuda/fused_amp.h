// kernels/cuda/fused_amp.h: the fused AMP kernels of the GPU fast path (issue 10): one multi-tensor
// launch that checks every gradient for inf/NaN and unscales it (reference section 1.6), the scale
// update on the device (section 1.9), and one-kernel SGD/Adam/AdamW steps that read found_inf on the
// device and leave parameters and state untouched when it is set. Each computes the bits of the unfused
// per-op path (core/grad_scaler.cpp, core/optim.cpp): the same functors (kernels/functors.h), in the
// same order, with the same f32 scalars. Host code only (no CUDA headers needed to include it); only
// built with AMPSCOPE_WITH_CUDA. core calls these for CUDA tensors; everything else stays unfused.
//
//   float* found = ...;  // 1-element f32 on the grads' device, zeroed by the caller
//   cuda::fused_non_finite_check_and_unscale(backend, {g1.kernel_view(), g2.kernel_view()}, found, 0.5f);
//   cuda::fused_sgd_step(backend, tensors, {.lr = 0.1}, found);   // skipped on the device if *found != 0
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/tensor_view.h"

namespace ampscope::cuda {

// Whether core uses the fused kernels for CUDA tensors. Off by default until the fused-vs-unfused tests
// have passed on a GPU (docs/cuda.md); AMPSCOPE_FUSED_AMP=1 in the environment (read once) or
// set_fused_amp_enabled(true) turns them on. The unfused per-op path is what the tests compare against.
bool fused_amp_enabled();
void set_fused_amp_enabled(bool enabled);
// How many fused calls (unscale, scale update, SGD, Adam) have launched kernels in this process: the
// tests compare it before and after a step, so that a fused-vs-unfused comparison cannot pass by
// quietly running the unfused path twice.
std::uint64_t fused_amp_call_count();

// _amp_foreach_non_finite_check_and_unscale_: found_inf (device pointer, one f32) is set to 1 when any
// element of any grad is inf or NaN, tested on a float (an f64 beyond the f32 range counts); every grad
// is multiplied in place by inv_scale in its op-math type (float; double for f64) and rounded once,
// non-finite elements included, unless inv_scale is exactly 1. Grads: contiguous, f32, f64, f16 or
// bf16 (mixed), all on `backend`'s device. One launch per 48 tensors. Throws DTypeError/ShapeError
// (non-floating or non-contiguous grad) before any grad is touched, DeviceRuntimeError on a CUDA failure.
void fused_non_finite_check_and_unscale(Backend& backend, const std::vector<TensorView>& grads, float* found_inf,
                                        float inv_scale);

// _amp_update_scale_ on the device, one thread: scale (f32) and growth_tracker (i32) updated in place
// from found_inf (f32), exactly as section 1.9 (products in double rounded once to f32, no lower bound,
// growth refused when it would reach inf, tracker reset even then).
void fused_update_scale(Backend& backend, float* scale, std::int32_t* growth_tracker, const float* found_inf,
                        double growth_factor, double backoff_factor, std::int64_t growth_interval);

// One parameter of a fused SGD step. All f32, contiguous, the same numel. momentum_buffer: null data
// when momentum is 0; first_step: the buffer is written from the gradient (PyTorch's buf = g.clone()).
struct FusedSgdTensor {
  TensorView param, grad, momentum_buffer;
  bool first_step = false;
};
struct FusedSgdOptions {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
};
// SGD (_single_tensor_sgd's ops, fused). found_inf: null, or a device f32 that skips the whole step when
// non-zero (nothing written).
void fused_sgd_step(Backend& backend, const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options,
                    const float* found_inf);

// One parameter of a fused Adam/AdamW step. All f32, contiguous, the same numel; max_exp_avg_sq only
// with amsgrad. step is the step count after this step's increment (host bookkeeping: the bias
// corrections are computed from it in double on the host, as the unfused path does).
struct FusedAdamTensor {
  TensorView param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
  std::int64_t step = 1;
};
struct FusedAdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool amsgrad = false, maximize = false;
  bool decoupled_weight_decay = false;  // AdamW
};
void fused_adam_step(Backend& backend, const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                     const float* found_inf);

}  // namespace ampscope::cuda
