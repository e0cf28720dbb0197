// kernels/cpu/nn_kernels.h: registration of the CPU backend's training-runtime kernels (element-wise math
// and derivatives, rows, matrix products, windows, embedding, losses), defined in nn_kernels.cpp.
//
//   register_nn_kernels([this](Op op, DType t, KernelFn fn) { register_kernel(op, t, fn); });
#pragma once

#include <functional>

#include "core/backend.h"

namespace ampscope::cpu {

using KernelRegistrar = std::function<void(Op, DType, KernelFn)>;
void register_nn_kernels(const KernelRegistrar& reg);

}  // namespace ampscope::cpu
