// kernels/cpu/fused_optim.h: one-pass SGD and Adam/AdamW steps on the CPU (Backend::fused_sgd_step,
// fused_adam_step of the CPU backend). An f32 AdamW step over GPT-2 small's 124M parameters is some
// fifteen element-wise ops, each a full pass over memory with its own temporary; these loops read
// param, grad and state once and write them once. Each element goes through the unfused path's
// functors (kernels/functors.h) in the unfused path's order with its f32 scalars (core/optim.cpp,
// SGD::update and Adam::update), so the results are its bits; the CUDA fused kernels
// (kernels/cuda/fused_amp_kernels.cu) compute the same sequence.
//
// On by default; AMPSCOPE_FUSED_OPTIM=0 in the environment (read once) or set_fused_optim_enabled(false)
// sends CPU optimizers back to the unfused ops, which is what the tests compare against.
//
//   cpu::set_fused_optim_enabled(false);  // opt.step() now runs Adam::update op by op
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.h"

namespace ampscope::cpu {

bool fused_optim_enabled();
void set_fused_optim_enabled(bool enabled);
// How many fused steps have run in this process: a fused-vs-unfused test checks that the fused run
// really took the fused path.
std::uint64_t fused_optim_call_count();

// found_inf: null, or a host f32 that skips the whole step when non-zero (nothing written). Tensors:
// f32, contiguous, param's numel each; a violation throws DTypeError/ShapeError before any is touched.
void fused_sgd_step(const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options, const float* found_inf);
void fused_adam_step(const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                     const float* found_inf);

}  // namespace ampscope::cpu
