// core/fp8_linear_device.h: the GPU half of core/fp8_linear.h's fp8_quantize_operand and fp8_gemm, which call
// these for operands that are not on the CPU. Internal to core (fp8_linear.cpp is its only user); the kernels
// are the device backend's (fp8_device_kernels, core/backend.h; kernels/cuda/fp8_cuda.h).
#pragma once

#include <string>

#include "core/fp8_linear.h"

namespace ampscope {

// fp8_quantize_operand for a 2-D tensor on a GPU (the caller checked the shape). Throws DeviceError where the
// device's backend has no FP8 kernels.
Fp8Quantized fp8_quantize_operand_device(const Tensor& matrix, Fp8Operand operand, const Fp8Options& options,
                                         Fp8LinearState* state, const std::string& module);

// fp8_gemm for operands on a GPU (the caller checked the inner sizes).
Tensor fp8_gemm_device(const Fp8Quantized& a, bool transpose_a, const Fp8Quantized& b, bool transpose_b,
                       DType out_dtype, const Tensor& bias);

}  // namespace ampscope
