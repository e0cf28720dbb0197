// core/fp8_recipe.h: TransformerEngine's per-tensor FP8 scaling recipes as pure functions over their
// state, and the host-side tensor conversions that use a scale (the element math is core/float8.h).
//
//   DelayedScaling ds{.history_len = 16, .algo = AmaxAlgo::max, .margin = 0};
//   DelayedScalingState st = make_delayed_scaling_state(ds);   // scale 1, history all zero
//   std::vector<std::uint8_t> q = quantize_fp8(x, st.scale, Fp8Format::e4m3);  // this step's scale
//   record_amax(st, amax_of_x);                                 // what the cast saw
//   delayed_scaling_update(st, ds, Fp8Format::e4m3);            // end of step: next step's scale
//
//   float s = current_scaling_scale(amax_of_x, Fp8Format::e4m3, {.power_2_scale = true});
//
// What each follows (TransformerEngine, read at the sources named; no code copied):
// - Delayed scaling: transformer_engine/common/recipe/delayed_scaling.cu, `kernel_bulk` (the update
//   PyTorch's TE runs for every recipe state after the amax reduction), with the defaults of
//   transformer_engine/common/recipe/__init__.py `DelayedScaling` (margin 0, amax_history_len 1024,
//   amax_compute_algo "max"). docs/fp8.md walks through a worked example.
// - Current scaling: transformer_engine/common/recipe/recipe_common.cuh `compute_scale_from_amax`
//   (what the GPU runs for `Float8CurrentScaling`), cross-checked with the test reference
//   tests/pytorch/references/quantize_scale_calc.py; where the two differ (amax = inf) the kernel is
//   followed, see current_scaling_scale.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/float8.h"
#include "core/tensor.h"

namespace ampscope {

// A recipe setting or an amax no recipe can take (history length < 1, a non-finite margin, amax < 0).
class Fp8RecipeError : public Error {
 public:
  using Error::Error;
};

// How delayed scaling reduces the amax history to one amax (TE's amax_compute_algo).
enum class AmaxAlgo : std::uint8_t { max, most_recent };

struct DelayedScaling {
  std::int64_t history_len = 1024;  // TE amax_history_len
  AmaxAlgo algo = AmaxAlgo::max;    // TE amax_compute_algo
  float margin = 0.0f;              // TE margin: scale = fp8_max * 2^-margin / amax
};

// One quantized tensor's delayed-scaling state, as TE keeps it in its recipe state: amax_history[0] is
// the current step's amax (0 until a cast records one), [1 .. len-1] the previous steps' amaxes, oldest
// first; `scale` is what this step's casts multiply by, `scale_inv` what dequantization multiplies by.
struct DelayedScalingState {
  std::vector<float> amax_history;
  float scale = 1.0f;
  float scale_inv = 1.0f;
};

// A fresh state: history all zeros, scale and scale_inv 1 (TE initialises both to ones).
// Throws Fp8RecipeError if history_len < 1 or margin is not finite.
DelayedScalingState make_delayed_scaling_state(const DelayedScaling& recipe);

// Folds one cast's amax into amax_history[0]. TE's cast kernels fold each block's amax into this slot
// with an atomic max on the float's bits (atomicMaxFloat), so several casts of the same tensor in one
// step keep the largest, and a NaN (whose bits compare above every finite and inf) wins and stays.
// `amax` must be >= 0 or NaN (it is a max of absolute values); a negative amax throws Fp8RecipeError.
void record_amax(DelayedScalingState& state, float amax);

// The end-of-step update (TE kernel_bulk, per state):
// - if amax_history[0] != 0 (the module ran and saw a nonzero amax) the history rolls: the max is taken
//   over all len entries (fmaxf: a NaN entry is skipped, an inf wins), then entry i+1 moves to i, the
//   current amax moves to the last slot and slot 0 is cleared; with amax_history[0] == 0 the history is
//   left as it is and the max is 0 (TE PR #825: only modules that ran roll; a tensor whose amax was
//   exactly 0 counts as not having run);
// - amax = that max (AmaxAlgo::max) or amax_history[0] as it was (most_recent);
// - scale = (fp8_max * 2^-margin) / amax in float when amax is finite and > 0, else the previous scale;
//   an infinite result becomes FLT_MAX; scale_inv = 1 / scale.
void delayed_scaling_update(DelayedScalingState& state, const DelayedScaling& recipe, Fp8Format format);

struct CurrentScaling {
  bool power_2_scale = false;  // TE force_pow_2_scales: round the scale down to a power of two
  float amax_epsilon = 0.0f;   // TE amax_epsilon: amax below it is raised to it
};

// The scale current scaling uses for a tensor whose amax is `amax` (TE compute_scale_from_amax):
// amax < epsilon becomes epsilon; amax 0, inf or NaN gives 1; otherwise fp8_max / amax in float, inf
// becoming FLT_MAX, and with power_2_scale the mantissa bits cleared (rounding down to 2^k).
// TE's Python reference gives 0 for amax = inf (fp8_max / inf); the kernel, followed here, gives 1.
float current_scaling_scale(float amax, Fp8Format format, const CurrentScaling& recipe = {});

// Host-side tensor conversions over f32 data: q[i] = satfinite(RNE(x[i] * scale)) and
// x[i] = decode(q[i]) * scale_inv, element by element with core/float8.h's quantize_fp8/dequantize_fp8.
std::vector<std::uint8_t> quantize_fp8(std::span<const float> x, float scale, Fp8Format format);
std::vector<float> dequantize_fp8(std::span<const std::uint8_t> q, float scale_inv, Fp8Format format);

// The same for a Tensor: `x` must be an f32 tensor on the CPU (any strides; its elements are read in
// row-major order) and the codes come back row-major; dequantize_fp8_tensor makes an f32 CPU tensor of
// `shape` from them. A wrong dtype throws DTypeError, a GPU tensor DeviceError, a code count that does not
// match `shape` ShapeError.
std::vector<std::uint8_t> quantize_fp8(const Tensor& x, float scale, Fp8Format format);
Tensor dequantize_fp8_tensor(std::span<const std::uint8_t> q, const Shape& shape, float scale_inv, Fp8Format format);

}  // namespace ampscope
