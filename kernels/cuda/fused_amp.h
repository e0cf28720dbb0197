// kernels/cuda/fused_amp.h: the fused AMP kernels of the GPU fast path (issue 10): one multi-tensor
// launch that checks every gradient for inf/NaN and unscales it (reference section 1.6), the scale
// update on the device (section 1.9), and one-kernel SGD/Adam/AdamW steps that read found_inf on the
// device and leave parameters and state untouched when it is set. Each computes the bits of the unfused
// per-op path (core/grad_scaler.cpp, core/optim.cpp): the same functors (kernels/functors.h), in the
// same order, with the same f32 scalars. Host code only (no CUDA headers needed to include it); only
// built with AMPSCOPE_WITH_CUDA. core reaches them through the Backend interface (core/backend.h:
// fused_amp_available() and the fused_* hooks, which the CUDA backend implements with these functions);
// only kernels/cuda and the tests include this header.
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

// The argument structs are core's (core/backend.h), so that core reaches these kernels through the
// Backend interface (Backend::fused_sgd_step and friends, which the CUDA backend implements with the
// functions here) without including this header.
using ampscope::FusedAdamOptions;
using ampscope::FusedAdamTensor;
using ampscope::FusedSgdOptions;
using ampscope::FusedSgdTensor;

// SGD (_single_tensor_sgd's ops, fused). found_inf: null, or a device f32 that skips the whole step when
// non-zero (nothing written).
void fused_sgd_step(Backend& backend, const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options,
                    const float* found_inf);

// Adam/AdamW (_single_tensor_adam's ops, fused); found_inf as for SGD.
void fused_adam_step(Backend& backend, const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                     const float* found_inf);

}  // namespace ampscope::cuda
