// core/what_if.cpp: the --what-if measurement of block-scaled formats (see what_if.h).
#include "core/what_if.h"

#include <fnmatch.h>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/probe_hook.h"

namespace ampscope {

namespace {

thread_local std::shared_ptr<WhatIfContext> t_active;

// A tensor's values as f32, row-major, read without running an op (no probe event, no autograd node): the values
// of an f16/bf16/f32 tensor are exact in float.
std::vector<float> f32_values(const Tensor& t) {
  const std::vector<double> v = t.values();
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

WhatIfContext::WhatIfContext(WhatIfOptions options) : options_(std::move(options)) {}

bool WhatIfContext::covers(std::string_view module) const {
  const std::string path(module);
  for (const std::string& glob : options_.keep_bf16)
    if (::fnmatch(glob.c_str(), path.c_str(), 0) == 0) return false;
  return true;
}

void WhatIfContext::measure(const std::string& module, std::span<const float> matrix, std::int64_t R, std::int64_t C,
                            Fp8Operand operand, const std::vector<RecipeCopyRef>& copies) {
  probe::Hook* hook = probe::hook();
  if (hook == nullptr) return;
  // Copy by copy, each in every format: per format, the copies come in the recipe's order (its offsets' order).
  for (const RecipeCopyRef& ref : copies) {
    if (ref.operand != operand) continue;
    for (BlockFormat format : options_.formats) {
      const BlockRecipe recipe{.format = format,
                               .mx_scale = options_.mx_scale,
                               .nvfp4_rht = options_.nvfp4_rht,
                               .sr_seed = block_rounding_seed(options_.seed)};
      const RecipeCopy copy =
          block_recipe_quantize(matrix, R, C, operand, ref.columnwise, recipe, offsets_[static_cast<int>(format)]);
      const BlockStats stats = block_recipe_stats(copy);
      hook->on_block_quantize(probe::BlockQuantizeEvent{.step = probe::current_step(),
                                                        .module = module,
                                                        .operand = fp8_operand_name(operand),
                                                        .copy = recipe_copy_name(ref.columnwise),
                                                        .format = block_format_name(format),
                                                        .what_if = true,
                                                        .rows = copy.rows,
                                                        .cols = copy.cols,
                                                        .stats = stats});
    }
  }
}

WhatIfGuard::WhatIfGuard(std::shared_ptr<WhatIfContext> context) : previous_(std::move(t_active)) {
  t_active = std::move(context);
}
WhatIfGuard::~WhatIfGuard() { t_active = std::move(previous_); }

std::shared_ptr<WhatIfContext> active_what_if() { return t_active; }

std::shared_ptr<WhatIfContext> what_if_for_linear(const Tensor& x, const std::string& module) {
  if (t_active == nullptr || probe::hook() == nullptr) return nullptr;
  if (x.dtype() != DType::bf16 && x.dtype() != DType::f16) return nullptr;
  if (autograd::widening_target() || !t_active->covers(module)) return nullptr;
  return t_active;
}

void what_if_linear_forward(WhatIfContext& context, const std::string& module, const Tensor& x2, const Tensor& weight,
                            bool input_needs_grad, bool weight_needs_grad) {
  NoGradGuard no_grad;
  const std::int64_t rows = x2.size(0), in = weight.size(1), out = weight.size(0);
  const bool grads = input_needs_grad || weight_needs_grad;
  for (BlockFormat format : context.options().formats)
    check_block_linear(format, fmt::format("--what-if {}", block_format_name(format)), module, rows, in, out, grads);
  const std::vector<RecipeCopyRef> copies = linear_forward_copies(input_needs_grad, weight_needs_grad);
  // In the recipe's order per format: x rowwise, W rowwise, W columnwise, x columnwise. The order only matters for
  // stochastic rounding, which the forward copies do not use.
  const std::vector<float> xv = f32_values(x2), wv = f32_values(weight);
  context.measure(module, xv, rows, in, Fp8Operand::input, {copies[0]});
  context.measure(module, wv, out, in, Fp8Operand::weight, {copies[1]});
  for (std::size_t i = 2; i < copies.size(); ++i) {
    if (copies[i].operand == Fp8Operand::weight) {
      context.measure(module, wv, out, in, Fp8Operand::weight, {copies[i]});
    } else {
      context.measure(module, xv, rows, in, Fp8Operand::input, {copies[i]});
    }
  }
}

void what_if_linear_backward(WhatIfContext& context, const std::string& module, const Tensor& g2,
                             bool input_needs_grad, bool weight_needs_grad) {
  if (autograd::widening_target() || probe::hook() == nullptr) return;
  NoGradGuard no_grad;
  const std::vector<float> gv = f32_values(g2);
  context.measure(module, gv, g2.size(0), g2.size(1), Fp8Operand::grad_output,
                  linear_backward_copies(input_needs_grad, weight_needs_grad));
}

}  // namespace ampscope
