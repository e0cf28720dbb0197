// core/fp8_linear.h: FP8 Linear GEMMs as TransformerEngine runs a te.Linear under fp8_autocast, on the CPU.
//
//   auto fp8 = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::delayed});
//   {
//     AutocastGuard autocast(DType::bf16);
//     Fp8Guard fp8_region(fp8);                 // linear() on f16/bf16 inputs now runs its GEMMs in FP8
//     loss = task.loss(model(x), y);
//   }
//   loss.backward();                            // dgrad and wgrad in FP8 too (the context is kept by the graph)
//   fp8->end_step();                            // delayed scaling: every operand's history rolls, next scales
//
// What a Linear does under it (TE's transformer_engine/pytorch/module/linear.py, read at its fp8_gemm calls):
//   fprop  y  = Q(x)  Q(W)^T       input and weight quantized with their own per-tensor scales (E4M3)
//   dgrad  dx = Q(dy) Q(W)         the forward's quantized weight, grad_output quantized (E5M2 in HYBRID)
//   wgrad  dW = Q(dy)^T Q(x)       the forward's quantized input and the same quantized grad_output
//   dbias     = sum of dy over rows, from the unquantized grad_output (TE's fused bgrad-cast)
// Each GEMM multiplies the decoded FP8 values (exact in float), accumulates in f32 over the inner index in
// ascending order, multiplies the sum by scale_inv_a * scale_inv_b (one f32 product), adds the bias (fprop)
// in f32 and rounds once to the output dtype (the input's: bf16 under bf16 autocast). On a CUDA tensor the same
// functions run the CUDA backend's FP8 kernels (core/fp8_linear_device.cpp, kernels/cuda/fp8_cuda.h): the codes,
// amaxes and scales are the CPU's bit for bit; the GEMMs are the CPU's bits where they run the exact kernel, and
// within a documented bound where they run cuBLASLt's FP8 matmul, whose accumulation order is its own
// (docs/cuda.md, "FP8"). `ampscope train --precision fp8 --device cuda` is still refused (cli/run.cpp) until
// the GPU tests have passed on a GPU.
//
// A Linear is FP8 when an Fp8Guard is alive on the thread, its inputs are f16 or bf16 (the autocast dtype;
// a Linear an autocast override keeps in f32 stays f32, and so does the f32 twin's recompute) and its module
// path matches none of Fp8Options::keep_bf16. Per-module, per-operand delayed-scaling state lives in the
// context, keyed by module path (autograd::current_scope()); a module that did not run this step records
// no amax and its history does not roll (core/fp8_recipe.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/block_scaled.h"
#include "core/dtype.h"
#include "core/float8.h"
#include "core/fp8_recipe.h"
#include "core/tensor.h"

namespace ampscope {

// delayed and current: TE's per-tensor recipes (this file's GEMMs). mxfp8 and nvfp4: TE's MXFP8BlockScaling and
// NVFP4BlockScaling, block-scaled Linear GEMMs (core/block_linear.h) under the same guard, keep-bf16 globs and
// module coverage; they keep no scaling state (only NVFP4's stochastic-rounding offset, below).
enum class Fp8Recipe : std::uint8_t { delayed, current, mxfp8, nvfp4 };
// Whether a recipe is block-scaled (mxfp8, nvfp4).
inline bool is_block_recipe(Fp8Recipe r) { return r == Fp8Recipe::mxfp8 || r == Fp8Recipe::nvfp4; }
// TE's recipe.Format: HYBRID quantizes forward tensors (input, weight) to E4M3 and gradients to E5M2; E4M3
// quantizes all three to E4M3.
enum class Fp8FormatMix : std::uint8_t { hybrid, e4m3 };
// The three quantized operands of a Linear (TE's GEMM1_INPUT, GEMM1_WEIGHT, GRAD_OUTPUT1).
enum class Fp8Operand : std::uint8_t { input, weight, grad_output };

std::string_view fp8_operand_name(Fp8Operand operand);  // "input", "weight", "grad_output"
// The element format of an operand under a format mix.
Fp8Format fp8_operand_format(Fp8Operand operand, Fp8FormatMix mix);

struct Fp8Options {
  Fp8Recipe recipe = Fp8Recipe::delayed;
  Fp8FormatMix formats = Fp8FormatMix::hybrid;
  DelayedScaling delayed{};  // history 1024, max, margin 0 (TE's defaults)
  CurrentScaling current{};
  std::vector<std::string> keep_bf16{};  // module-path globs (fnmatch, * matches dots) kept out of FP8
  // mxfp8: how each 32-value block's E8M0 scale is chosen (core/block_scaled.h MxScaleRule; NVIDIA's round-up).
  MxScaleRule mx_scale = MxScaleRule::round_up;
  // nvfp4: the 16-point random Hadamard transform on the wgrad GEMM's operands (TE's default: on).
  bool nvfp4_rht = true;
  // nvfp4: the key of the Philox stream that stochastic rounding of gradients draws from (the run's seed, mixed:
  // see block_linear.h kStochasticRoundingKey). Offsets come from the context (take_random_blocks).
  std::uint64_t sr_seed = 0;
};

// One Linear's delayed-scaling state: one history and scale per quantized operand.
struct Fp8LinearState {
  DelayedScalingState input, weight, grad_output;
  DelayedScalingState& operand(Fp8Operand o);
  const DelayedScalingState& operand(Fp8Operand o) const;
};

// The FP8 state of a run: options and every Linear's scaling state. Shared (std::shared_ptr) with the
// autograd nodes of FP8 Linears, whose backward records grad_output's amax into it.
class Fp8Context {
 public:
  // Throws Fp8RecipeError for a history length < 1 or a margin that is not finite.
  explicit Fp8Context(Fp8Options options);

  const Fp8Options& options() const { return options_; }
  // Whether a Linear at this module path runs in FP8 (no keep_bf16 glob matches it).
  bool covers(std::string_view module) const;
  // The module's state, made (scales 1, histories zero) the first time it is asked for.
  Fp8LinearState& state(const std::string& module);
  // Every module's state, by path (empty until a Linear ran in FP8).
  const std::map<std::string, Fp8LinearState>& states() const { return states_; }
  // The end of a step (TE's amax reduction and scale update after the backward): with delayed scaling,
  // delayed_scaling_update on every operand of every module (one that ran no cast does not roll); with
  // current scaling nothing (there is no state).
  void end_step();

  // nvfp4's stochastic rounding: the Philox offset the next quantization of n values draws from, which this call
  // advances by ceil(n / 4) blocks (core/philox.h: element i uses block offset + i / 4), so no two quantizations of
  // a run share a block. The order of the calls (the run's order of backward GEMMs) makes a run reproducible.
  std::uint64_t take_random_blocks(std::uint64_t n);
  std::uint64_t random_offset() const { return random_offset_; }
  void set_random_offset(std::uint64_t offset) { random_offset_ = offset; }  // a resumed run's (checkpoint)

 private:
  Fp8Options options_;
  std::map<std::string, Fp8LinearState> states_;
  std::uint64_t random_offset_ = 0;
};

// Makes `context` the thread's FP8 region for its lifetime (nestable; a null context turns FP8 off inside).
class Fp8Guard {
 public:
  explicit Fp8Guard(std::shared_ptr<Fp8Context> context);
  ~Fp8Guard();
  Fp8Guard(const Fp8Guard&) = delete;
  Fp8Guard& operator=(const Fp8Guard&) = delete;

 private:
  std::shared_ptr<Fp8Context> previous_;
};

// The thread's FP8 region now (null outside every Fp8Guard).
std::shared_ptr<Fp8Context> active_fp8_context();

// One operand quantized: row-major codes of a [rows, cols] matrix and the scale that made them. The codes are
// in `codes` for a CPU operand, in device memory (`device_codes`, rows * cols bytes) for a GPU one.
struct Fp8Quantized {
  std::vector<std::uint8_t> codes;
  Device device = Device::cpu();
  std::shared_ptr<const std::uint8_t> device_codes;  // freed through the device's backend
  std::int64_t rows = 0, cols = 0;
  Fp8Format format = Fp8Format::e4m3;
  float amax = 0.0f;       // max |x| of the unquantized values, NaNs skipped (TE folds with fmaxf)
  float scale = 1.0f;      // q = satfinite(RNE(x * scale))
  float scale_inv = 1.0f;  // x ~ decode(q) * scale_inv
};

// Quantizes a 2-D CPU tensor (any floating dtype, any strides; read as f32) for `operand` under the context's
// recipe: delayed scaling uses the state's current scale and records this tensor's amax into its history;
// current scaling computes the scale from this amax (current_scaling_scale). A CUDA tensor is quantized on its
// device (the same codes and amax; the amax is read back to the host, a synchronisation per operand). With a
// probe hook installed, reports the cast (probe::Fp8QuantizeEvent) as the operand of `module` (for a CUDA
// operand, after copying its values and codes to the host).
Fp8Quantized fp8_quantize_operand(const Tensor& matrix, Fp8Operand operand, const Fp8Options& options,
                                  Fp8LinearState* state, const std::string& module = {});

// C = op(A) op(B) with op(X) = X or X^T: C[i][j] = sum_p op(A)[i][p] op(B)[p][j] over decoded values in f32,
// p ascending, then C * (a.scale_inv * b.scale_inv) + bias[j] in f32, rounded once to `out_dtype`. The result
// is a new [I, J] tensor on the operands' device. `bias` (optional) has J elements. ShapeError if the inner sizes
// differ, DeviceError if the operands (or the bias) are on different devices.
Tensor fp8_gemm(const Fp8Quantized& a, bool transpose_a, const Fp8Quantized& b, bool transpose_b, DType out_dtype,
                const Tensor& bias = Tensor());

}  // namespace ampscope
