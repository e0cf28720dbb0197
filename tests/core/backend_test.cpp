// tests/core/backend_test.cpp: the optional fused AMP hooks of core/backend.h, through which the GradScaler
// and the optimizers reach the CUDA backend's fused kernels. A backend without them (the CPU backend, the
// Backend base class) says so and refuses every hook with the message core/backend.h promises, touching
// nothing. (The CUDA backend's hooks are the fused kernels themselves: tests/scaler/fused_cuda_test.cpp
// and tests/optim/fused_cuda_test.cpp compare them with the unfused path on a GPU.)
//
// Where the expected values come from: the error text the contract promises (hook, backend, hint); the
// tensors' values are the ones written into them, which a refused hook must leave as they were.
#include "core/backend.h"

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace {

using ampscope::Backend;
using ampscope::Device;
using ampscope::DType;
using ampscope::Tensor;

TEST(backend_test, the_cpu_backend_has_no_fused_amp_path) {
  EXPECT_FALSE(ampscope::backend_for(Device::cpu()).fused_amp_available());
}

TEST(backend_test, a_backend_without_fused_amp_refuses_the_unscale_hook_and_touches_nothing) {
  Backend& cpu = ampscope::backend_for(Device::cpu());
  Tensor param = ampscope::from_values({1.0, 2.0}, {2});
  Tensor grad = ampscope::from_values({0.5, -4.0}, {2});
  Tensor moment = ampscope::from_values({0.25, 0.75}, {2});
  Tensor found = ampscope::zeros({1});

  EXPECT_THROW_MSG(cpu.fused_non_finite_check_and_unscale({grad.kernel_view()}, static_cast<float*>(found.data()),
                                                           0.5f),
                   ampscope::UnsupportedError,
                   "fused_non_finite_check_and_unscale: backend 'cpu' has no fused AMP kernels",
                   "hint: ask fused_amp_available() first and run the unfused ops when it is false");
  // The CPU backend has fused optimizer steps (kernels/cpu/fused_optim.h) but not the rest of the fast path.
  EXPECT_FALSE(cpu.fused_amp_available());
  EXPECT_EQ(param.values(), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(grad.values(), (std::vector<double>{0.5, -4.0}));
  EXPECT_EQ(moment.values(), (std::vector<double>{0.25, 0.75}));
  EXPECT_EQ(found.values(), (std::vector<double>{0.0}));
}

}  // namespace
