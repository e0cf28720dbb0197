// FP8 Linear GEMMs on a GPU (core/fp8_linear_device.h): the CPU path's steps (core/fp8_linear.cpp) with the
// element work done by the device backend's FP8 kernels. The recipe state stays on the host: the amax is read
// back after each cast (one synchronisation per operand, as TE's delayed recipe does not need, but the CPU's
// state and the probe's statistics do).
#include "core/fp8_linear_device.h"

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "core/backend.h"
#include "core/error.h"
#include "core/probe_hook.h"

namespace ampscope {
namespace {

const Fp8DeviceKernels& kernels_for(Device device, std::string_view what) {
  const Fp8DeviceKernels* k = fp8_device_kernels(device);
  if (k == nullptr) {
    throw DeviceError(fmt::format("{} on {}: this build has no FP8 kernels for that device\nhint: use --device cpu",
                                  what, device.str()));
  }
  return *k;
}

// rows * cols bytes of device memory, freed through the backend when the last owner lets go.
std::shared_ptr<std::uint8_t> device_bytes(Backend& backend, std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(n, 1);
  auto* p = static_cast<std::uint8_t*>(backend.allocate(bytes));
  return std::shared_ptr<std::uint8_t>(p, [&backend, bytes](std::uint8_t* q) { backend.deallocate(q, bytes); });
}

// One pass of the quantize kernel: codes into `codes`, the amax returned (read back to the host).
float quantize_pass(Backend& backend, const Fp8DeviceKernels& k, const TensorView& x, float scale, Fp8Format format,
                    std::uint8_t* codes) {
  const std::shared_ptr<std::uint8_t> amax_mem = device_bytes(backend, sizeof(float));
  float* amax = reinterpret_cast<float*>(amax_mem.get());
  const float zero = 0.0f;
  backend.copy_from_host(amax, &zero, sizeof(float));
  k.quantize(backend, Fp8QuantizeArgs{x, codes, amax, scale, format});
  float host = 0.0f;
  backend.copy_to_host(&host, amax, sizeof(float));
  return host;
}

}  // namespace

Fp8Quantized fp8_quantize_operand_device(const Tensor& matrix, Fp8Operand operand, const Fp8Options& options,
                                         Fp8LinearState* state, const std::string& module) {
  const Fp8DeviceKernels& k = kernels_for(matrix.device(), fmt::format("FP8 {}", fp8_operand_name(operand)));
  Backend& backend = backend_for(matrix.device());
  const std::size_t n = static_cast<std::size_t>(matrix.numel());
  Fp8Quantized q;
  q.rows = matrix.size(0);
  q.cols = matrix.size(1);
  q.format = fp8_operand_format(operand, options.formats);
  q.device = matrix.device();
  const std::shared_ptr<std::uint8_t> codes = device_bytes(backend, n);
  const TensorView x = matrix.kernel_view();
  if (options.recipe == Fp8Recipe::delayed) {
    if (state == nullptr) throw Error("fp8_quantize_operand: delayed scaling needs the module's state");
    DelayedScalingState& s = state->operand(operand);
    q.scale = s.scale;  // computed at the end of the previous step
    q.scale_inv = s.scale_inv;
    q.amax = quantize_pass(backend, k, x, q.scale, q.format, codes.get());
    record_amax(s, q.amax);
  } else {
    // Current scaling needs this tensor's amax before its scale: one pass for the amax (its codes are
    // overwritten), one with the scale.
    q.amax = quantize_pass(backend, k, x, 1.0f, q.format, codes.get());
    q.scale = current_scaling_scale(q.amax, q.format, options.current);
    q.scale_inv = 1.0f / q.scale;
    (void)quantize_pass(backend, k, x, q.scale, q.format, codes.get());
  }
  q.device_codes = codes;
  if (probe::Hook* hook = probe::hook()) {
    // The statistics compare each value with its code: both brought to the host, as the CPU path has them.
    const Tensor values = matrix.to(DType::f32).contiguous().to(Device::cpu());
    std::vector<std::uint8_t> host_codes(n);
    if (n > 0) backend.copy_to_host(host_codes.data(), codes.get(), n);
    hook->on_fp8_quantize(probe::Fp8QuantizeEvent{probe::current_step(), module, fp8_operand_name(operand),
                                                  q.format == Fp8Format::e4m3 ? "e4m3" : "e5m2",
                                                  std::span<const float>(values.data_as<float>(), n), host_codes,
                                                  q.amax, q.scale, q.scale_inv});
  }
  return q;
}

Tensor fp8_gemm_device(const Fp8Quantized& a, bool transpose_a, const Fp8Quantized& b, bool transpose_b,
                       DType out_dtype, const Tensor& bias) {
  if (a.device.type != b.device.type || a.device.index != b.device.index) {
    throw DeviceError(fmt::format("fp8_gemm: the operands are on {} and {}\nhint: quantize both on one device",
                                  a.device.str(), b.device.str()));
  }
  const Device device = a.device;
  const Fp8DeviceKernels& k = kernels_for(device, "fp8_gemm");
  if (a.device_codes == nullptr || b.device_codes == nullptr) {
    throw Error("fp8_gemm: an operand on the GPU without device codes (not made by fp8_quantize_operand)");
  }
  const std::int64_t I = transpose_a ? a.cols : a.rows;
  const std::int64_t J = transpose_b ? b.rows : b.cols;
  Tensor bias_f;
  if (bias.defined()) {
    if (bias.numel() != J) throw ShapeError(fmt::format("fp8_gemm: bias of {} elements for {} columns", bias.numel(), J));
    if (bias.device().type != device.type || bias.device().index != device.index) {
      throw DeviceError(fmt::format("fp8_gemm: the bias is on {}, the operands on {}\nhint: move the bias to {}",
                                    bias.device().str(), device.str(), device.str()));
    }
    bias_f = bias.to(DType::f32).contiguous();
  }
  Tensor out = Tensor::empty({I, J}, {out_dtype, device});
  Fp8GemmArgs g;
  g.a = a.device_codes.get();
  g.a_rows = a.rows;
  g.a_cols = a.cols;
  g.a_format = a.format;
  g.transpose_a = transpose_a;
  g.b = b.device_codes.get();
  g.b_rows = b.rows;
  g.b_cols = b.cols;
  g.b_format = b.format;
  g.transpose_b = transpose_b;
  g.alpha = a.scale_inv * b.scale_inv;  // one f32 product, as the CPU's
  if (bias_f.defined()) g.bias = bias_f.kernel_view();
  g.out = out.kernel_view();
  // TransformerEngine's defaults: fprop (input times weight^T, the only GEMM of a Linear with B transposed)
  // without the split accumulator, dgrad and wgrad with it.
  g.fast_accumulation = !transpose_a && transpose_b;
  k.gemm(backend_for(device), g);
  return out;
}

}  // namespace ampscope
