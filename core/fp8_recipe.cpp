// core/fp8_recipe.cpp: TransformerEngine's delayed and current scaling (see fp8_recipe.h for the sources).
#include "core/fp8_recipe.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

namespace ampscope {

DelayedScalingState make_delayed_scaling_state(const DelayedScaling& recipe) {
  if (recipe.history_len < 1) {
    throw Fp8RecipeError("delayed scaling: amax history length " + std::to_string(recipe.history_len) +
                         " is not at least 1\nhint: use a length of 1 or more (TransformerEngine's default is 1024)");
  }
  if (!std::isfinite(recipe.margin)) {
    throw Fp8RecipeError("delayed scaling: margin " + std::to_string(recipe.margin) +
                         " is not finite\nhint: use a finite margin such as 0 (the default) or 1");
  }
  DelayedScalingState state;
  state.amax_history.assign(static_cast<std::size_t>(recipe.history_len), 0.0f);
  return state;
}

void record_amax(DelayedScalingState& state, float amax) {
  if (amax < 0.0f) {
    throw Fp8RecipeError("record_amax: amax " + std::to_string(amax) +
                         " is negative\nhint: an amax is the largest absolute value of a tensor, never below 0");
  }
  if (state.amax_history.empty()) {
    throw Fp8RecipeError("record_amax: the state has no amax history\nhint: make it with make_delayed_scaling_state");
  }
  // atomicMaxFloat on non-negative floats compares their bits as integers: NaN (0x7FC00000 and up) is
  // above inf (0x7F800000), which is above every finite value.
  std::uint32_t old_bits;
  std::uint32_t new_bits;
  std::memcpy(&old_bits, &state.amax_history[0], sizeof old_bits);
  std::memcpy(&new_bits, &amax, sizeof new_bits);
  if (new_bits > old_bits) state.amax_history[0] = amax;
}

void delayed_scaling_update(DelayedScalingState& state, const DelayedScaling& recipe, Fp8Format format) {
  std::vector<float>& h = state.amax_history;
  if (h.size() != static_cast<std::size_t>(recipe.history_len)) {
    throw Fp8RecipeError("delayed scaling: the state's amax history has " + std::to_string(h.size()) +
                         " entries but the recipe says " + std::to_string(recipe.history_len) +
                         "\nhint: make the state from the same recipe (make_delayed_scaling_state)");
  }
  const float last_amax = h[0];
  float amax = 0.0f;
  if (last_amax != 0.0f) {
    // The max covers every entry before the roll: slots 1 .. len-1 and the current one. std::fmax, like
    // CUDA's fmaxf, returns the other operand when one is NaN.
    for (const float a : h) amax = std::fmax(amax, a);
    const std::size_t n = h.size();
    for (std::size_t i = 1; i + 1 < n; ++i) h[i] = h[i + 1];
    if (n > 1) h[n - 1] = last_amax;
    h[0] = 0.0f;
  }
  if (recipe.algo == AmaxAlgo::most_recent) amax = last_amax;

  // TE: scaled_max = fp8_dtype_max * std::pow(2.f, -margin), in float; then one float division.
  const float scaled_max = fp8_max(format) * std::pow(2.0f, -recipe.margin);
  float scale = state.scale;
  if (std::isfinite(amax) && amax > 0.0f) scale = scaled_max / amax;
  if (std::isinf(scale)) scale = FLT_MAX;
  state.scale = scale;
  state.scale_inv = 1.0f / scale;
}

float current_scaling_scale(float amax, Fp8Format format, const CurrentScaling& recipe) {
  if (amax < recipe.amax_epsilon) amax = recipe.amax_epsilon;  // NaN compares false and stays
  if (std::isinf(amax) || amax == 0.0f || std::isnan(amax)) return 1.0f;
  float scale = fp8_max(format) / amax;
  if (std::isinf(scale)) scale = FLT_MAX;
  if (recipe.power_2_scale) {
    // Clearing the 23 mantissa bits rounds a positive normal float down to a power of two.
    std::uint32_t bits;
    std::memcpy(&bits, &scale, sizeof bits);
    bits &= 0xFF800000u;
    std::memcpy(&scale, &bits, sizeof scale);
  }
  return scale;
}

std::vector<std::uint8_t> quantize_fp8(std::span<const float> x, float scale, Fp8Format format) {
  std::vector<std::uint8_t> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) q[i] = quantize_fp8(x[i], scale, format);
  return q;
}

std::vector<float> dequantize_fp8(std::span<const std::uint8_t> q, float scale_inv, Fp8Format format) {
  std::vector<float> x(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) x[i] = dequantize_fp8(q[i], scale_inv, format);
  return x;
}

std::vector<std::uint8_t> quantize_fp8(const Tensor& x, float scale, Fp8Format format) {
  if (x.dtype() != DType::f32) {
    throw DTypeError("quantize_fp8: the tensor is " + std::string(dtype_name(x.dtype())) + " of shape " +
                     shape_str(x.shape()) + ", but FP8 quantization reads f32\nhint: convert it first with x.to(DType::f32)");
  }
  if (!x.device().is_cpu()) {
    throw DeviceError("quantize_fp8: the tensor is on " + x.device().str() +
                      ", but FP8 quantization runs on the host\nhint: copy it first with x.to(Device::cpu())");
  }
  const Tensor c = x.contiguous();
  return quantize_fp8(std::span<const float>(c.data_as<float>(), static_cast<std::size_t>(c.numel())), scale, format);
}

Tensor dequantize_fp8_tensor(std::span<const std::uint8_t> q, const Shape& shape, float scale_inv, Fp8Format format) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  if (static_cast<std::int64_t>(q.size()) != n) {
    throw ShapeError("dequantize_fp8_tensor: " + std::to_string(q.size()) + " codes do not fill shape " +
                     shape_str(shape) + " (" + std::to_string(n) +
                     " elements)\nhint: pass the shape of the tensor the codes were quantized from");
  }
  const std::vector<float> x = dequantize_fp8(q, scale_inv, format);
  return from_values(std::vector<double>(x.begin(), x.end()), shape, {.dtype = DType::f32});
}

}  // namespace ampscope
