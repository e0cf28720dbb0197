// core/block_recipe.h: what TransformerEngine's block-scaled recipes (MXFP8BlockScaling, NVFP4BlockScaling) quantize
// of a Linear, in one place: which copies of which operand, in which layout, with which transform and rounding.
// Both users call it, so that "the what-if statistics equal a real run's" holds by construction: the --what-if
// measurement (core/what_if.h) and the runtime's block-scaled Linear (--precision mxfp8|nvfp4).
//
//   std::uint64_t offset = 0;  // the run's stochastic-rounding offset, advanced by every gradient copy
//   BlockRecipe recipe{.format = BlockFormat::nvfp4, .sr_seed = block_rounding_seed(run_seed)};
//   RecipeCopy c = block_recipe_quantize(dy, N, out, Fp8Operand::grad_output, /*columnwise=*/true, recipe, offset);
//   BlockStats s = block_recipe_stats(c);   // over c.seen, the values the quantizer saw
//
// A Linear y = x W^T with x [N, in], W [out, in] and dy [N, out] runs three GEMMs, each contracting over k with both
// operands blocked along k, each copy quantized from the high-precision tensor:
//   fprop  y  = x W^T    x rowwise (blocks along in)    W rowwise (along in)
//   dgrad  dx = dy W     dy rowwise (along out)         W columnwise (down out)
//   wgrad  dW = dy^T x   dy columnwise (down N)         x columnwise (down N)
// MXFP8: 1x32 blocks (32x1 for the columnwise copies: core/block_scaled.h BlockAxis), E4M3 elements for all three
// operands (TE's MXFP8BlockScaling default), the E8M0 scale by BlockRecipe::mx_scale. The columnwise copy is the
// [R, C] matrix blocked down its columns.
// NVFP4 (TE's NVFP4BlockScaling defaults): inputs and gradients in 1x16 blocks, weights in 16x16 tiles; a columnwise
// copy is the quantization of the transpose [C, R] (its own global amax, as TE's); the wgrad operands (the columnwise
// copies of x and dy) go through the 16-point random Hadamard transform along N first (BlockRecipe::nvfp4_rht);
// gradients (both copies of dy) are rounded stochastically from the Philox stream (sr_seed, offset), the offset
// advanced by ceil(n / 4) blocks per copy so that no two copies of a run share random bits.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/block_scaled.h"
#include "core/block_stats.h"
#include "core/fp8_linear.h"

namespace ampscope {

enum class BlockFormat : std::uint8_t { mxfp8, nvfp4 };
std::string_view block_format_name(BlockFormat format);  // "mxfp8", "nvfp4"
// The block size along the contraction: 32 (mxfp8), 16 (nvfp4).
std::int64_t block_format_block(BlockFormat format);

// The key mixed into the run's seed for NVFP4's stochastic rounding, so that it never draws from the stream the
// run's own generator uses (keyed by the seed itself: parameters, data, dropout).
inline constexpr std::uint64_t kBlockRoundingKey = 0x9E3779B97F4A7C15ull;
inline std::uint64_t block_rounding_seed(std::uint64_t run_seed) { return run_seed ^ kBlockRoundingKey; }

struct BlockRecipe {
  BlockFormat format = BlockFormat::mxfp8;
  MxScaleRule mx_scale = MxScaleRule::round_up;  // mxfp8: NVIDIA's rule, the libraries' default
  bool nvfp4_rht = true;                         // nvfp4: the Hadamard transform on the wgrad operands
  std::uint64_t sr_seed = 0;                     // nvfp4: the Philox key of stochastic rounding
};

// One copy of an operand as the recipe quantizes it.
struct RecipeCopy {
  Fp8Operand operand = Fp8Operand::input;
  bool columnwise = false;
  // The quantized matrix: [R, C] (NVFP4's columnwise copies: [C, R], the transpose) and the values the quantizer
  // saw (after the transpose and the Hadamard transform), row-major.
  std::int64_t rows = 0, cols = 0;
  std::vector<float> seen;
  std::variant<MxTensor, Nvfp4Tensor> tensor;
};
std::string_view recipe_copy_name(bool columnwise);  // "rowwise", "columnwise"

// Quantizes one copy of a Linear operand, `matrix` being the operand as the Linear holds it, [R, C] row-major f32
// (x [N, in], W [out, in], dy [N, out]). `random_offset` is the run's stochastic-rounding offset: an NVFP4 gradient
// copy draws from (recipe.sr_seed, random_offset) and advances it by ceil(seen.size() / 4); other copies leave it.
// ShapeError (core/block_scaled.h's) when the blocked dimensions do not divide; check_block_linear first for a
// message naming the Linear.
RecipeCopy block_recipe_quantize(std::span<const float> matrix, std::int64_t R, std::int64_t C, Fp8Operand operand,
                                 bool columnwise, const BlockRecipe& recipe, std::uint64_t& random_offset);

// mxfp8_block_stats or nvfp4_block_stats of the copy, over the values its quantizer saw.
BlockStats block_recipe_stats(const RecipeCopy& copy);

// The copies a Linear quantizes, in the order it quantizes them (the order stochastic rounding's offsets follow).
// Forward: x rowwise and W rowwise (fprop); W columnwise when x needs a gradient (dgrad), x columnwise when W does
// (wgrad) (TE's quantizers make both usages in one cast). Backward: dy rowwise when x needs a gradient, dy columnwise
// when W does.
struct RecipeCopyRef {
  Fp8Operand operand;
  bool columnwise;
};
std::vector<RecipeCopyRef> linear_forward_copies(bool input_needs_grad, bool weight_needs_grad);
std::vector<RecipeCopyRef> linear_backward_copies(bool input_needs_grad, bool weight_needs_grad);

// Refuses a Linear the format cannot block: in_features and out_features must be multiples of the block (32 for
// mxfp8, 16 for nvfp4: the fprop and dgrad contractions, NVFP4's weight tiles), and so must the input's rows (the
// wgrad contraction) when gradients are needed. ShapeError: "<what> linear in '<module>': ..." with a hint naming
// --fp8-keep-bf16. `what` says who asks ("--precision mxfp8", "--what-if nvfp4").
void check_block_linear(BlockFormat format, std::string_view what, const std::string& module, std::int64_t rows,
                        std::int64_t in_features, std::int64_t out_features, bool needs_grad);

}  // namespace ampscope
