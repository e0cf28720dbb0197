// kernels/cpu/cpu_backend.h: the CPU backend, the executable specification of every op. Element math
// comes from kernels/functors.h; values are stored in the tensor's dtype and computed on in float
// (double for f64), rounded once on store, exactly as the CUDA backend does.
//
//   std::unique_ptr<Backend> cpu = make_cpu_backend();
#pragma once

#include <memory>

#include "core/backend.h"

namespace ampscope {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace ampscope
