// core/what_if.h: "what-if" statistics of the block-scaled formats on a run that trains in another precision
// (ampscope train --what-if mxfp8,nvfp4 on a bf16 or fp8 run): every Linear whose inputs are bf16 or f16 (the
// autocast dtype, FP8 Linears included) also quantizes its operands as the format's recipe would and reports each
// copy's statistics to the probe (probe::BlockQuantizeEvent with what_if = true, core/block_stats.h), without using
// the result: the run's values, its random streams and its other probe events are those of the run without it.
//
//   auto what_if = std::make_shared<WhatIfContext>(WhatIfOptions{.formats = {BlockFormat::mxfp8}, .seed = seed});
//   { AutocastGuard autocast(DType::bf16); WhatIfGuard measured(what_if); loss = task.loss(model(x), y); }
//   loss.backward();        // grad_output's copies are measured here (the Linear's node keeps the context)
//
// The copies, their layouts, transforms and stochastic rounding are core/block_recipe.h's, the ones a
// --precision mxfp8|nvfp4 run quantizes, in its order (so NVFP4's stochastic-rounding offsets follow the same
// sequence). At step 0 (same weights, same batch) the weight copies and the first Linear's input copies are
// therefore those of the real run; later Linears see this run's activations, which a real block-scaled run has
// already changed. Measured only while a probe hook is installed (nothing else would see it); a Linear the twin
// recomputes (f32 inputs, or under its widening) is not measured.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/block_recipe.h"
#include "core/tensor.h"

namespace ampscope {

struct WhatIfOptions {
  std::vector<BlockFormat> formats = {};         // each measured, in this order
  MxScaleRule mx_scale = MxScaleRule::round_up;  // mxfp8's scale rule (the real run's --mx-scale)
  bool nvfp4_rht = true;                         // nvfp4's Hadamard transform on the wgrad operands
  std::uint64_t seed = 0;                        // the run's seed: stochastic rounding uses block_rounding_seed(seed)
  std::vector<std::string> keep_bf16 = {};       // module-path globs (fnmatch, * matches dots) not measured
};

class WhatIfContext {
 public:
  explicit WhatIfContext(WhatIfOptions options);
  const WhatIfOptions& options() const { return options_; }
  // Whether a Linear at this module path is measured (no keep_bf16 glob matches it).
  bool covers(std::string_view module) const;
  // Quantizes the listed copies of one operand ([R, C] row-major f32), each in every format, reporting each to the
  // installed hook. A Linear a format cannot block was refused before (check_block_linear).
  void measure(const std::string& module, std::span<const float> matrix, std::int64_t R, std::int64_t C,
               Fp8Operand operand, const std::vector<RecipeCopyRef>& copies);
  // A format's stochastic-rounding offset so far (advanced by each NVFP4 gradient copy, as the real run's).
  std::uint64_t random_offset(BlockFormat format) const { return offsets_[static_cast<int>(format)]; }

 private:
  WhatIfOptions options_;
  std::uint64_t offsets_[2] = {0, 0};
};

// Makes `context` the thread's what-if measurement for its lifetime (nestable; null turns it off inside).
class WhatIfGuard {
 public:
  explicit WhatIfGuard(std::shared_ptr<WhatIfContext> context);
  ~WhatIfGuard();
  WhatIfGuard(const WhatIfGuard&) = delete;
  WhatIfGuard& operator=(const WhatIfGuard&) = delete;

 private:
  std::shared_ptr<WhatIfContext> previous_;
};

// The thread's what-if context (null outside every WhatIfGuard).
std::shared_ptr<WhatIfContext> active_what_if();

// The Linear's side (core/ops.cpp). what_if_for_linear: the context that measures this Linear, or null (no guard,
// no hook, inputs not f16/bf16, the twin's widening, or a kept module). The forward measures x [N, in] and
// W [out, in] (refusing sizes a format cannot block, ShapeError from check_block_linear); the backward dy [N, out].
std::shared_ptr<WhatIfContext> what_if_for_linear(const Tensor& x, const std::string& module);
void what_if_linear_forward(WhatIfContext& context, const std::string& module, const Tensor& x2, const Tensor& weight,
                            bool input_needs_grad, bool weight_needs_grad);
void what_if_linear_backward(WhatIfContext& context, const std::string& module, const Tensor& g2,
                             bool input_needs_grad, bool weight_needs_grad);

}  // namespace ampscope
