// core/block_linear.h: block-scaled Linear GEMMs (MXFP8, NVFP4) as TransformerEngine's MXFP8BlockScaling and
// NVFP4BlockScaling recipes run a te.Linear, on the CPU. linear() inside an Fp8Guard whose context's recipe is
// Fp8Recipe::mxfp8 or nvfp4 (core/fp8_linear.h) runs here (core/ops.cpp block_linear_impl); the conversions are
// core/block_scaled.h's.
//
//   auto ctx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::mxfp8});
//   { AutocastGuard autocast(DType::bf16); Fp8Guard region(ctx); loss = task.loss(model(x), y); }
//   loss.backward();
//
// Each GEMM contracts over k; both of its operands are quantized with their blocks along k, each copy from the
// high-precision tensor (x [N, in], W [out, in], dy [N, out]):
//   fprop  y  = x W^T    x rowwise (blocks along in), W rowwise (along in)
//   dgrad  dx = dy W     dy rowwise (along out), W columnwise (down out)
//   wgrad  dW = dy^T x   dy columnwise (down N), x columnwise (down N)
//   dbias     = sum of dy over rows, unquantized (as the FP8 path)
// MXFP8: 1x32 blocks, E4M3 elements for all three operands (TE's MXFP8BlockScaling default format), one E8M0 scale
// per block by Fp8Options::mx_scale. NVFP4 (TE's NVFP4BlockScaling defaults): inputs and gradients in 1x16 blocks,
// weights in 16x16 tiles (both copies; the columnwise copy is the quantization of W^T, as TE's); gradients rounded
// stochastically (both copies); the wgrad operands (dy and x columnwise, i.e. dy^T and x^T) go through the 16-point
// random Hadamard transform along N first, unless Fp8Options::nvfp4_rht is false. docs/fp8.md ("Training in MXFP8
// and NVFP4") gives the sources of each choice.
//
// The GEMM: C[i][j] = sum over k ascending of fl(a[i][k] * b[j][k]) in f32, from 0, where a and b are each element
// decoded times its block's scale (MXFP8: the dequantized value, exact; NVFP4: e2m1 * e4m3 block scale, exact), then
// fl(C * fl(ga * gb)) with ga, gb NVFP4's per-tensor decode scales (1 for MXFP8, where the product is exact), then
// + bias[j] in f32, then one rounding to the output dtype (bf16 under bf16 autocast). The products are exact in f32
// except where they leave its range (subnormal or overflowing products of extreme block scales).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/fp8_linear.h"
#include "core/tensor.h"

namespace ampscope {

// Which copy of an operand: blocks along each row (rowwise) or down each column (columnwise).
enum class BlockCopy : std::uint8_t { rowwise, columnwise };
std::string_view block_copy_name(BlockCopy copy);  // "rowwise", "columnwise"

// NVFP4's stochastic rounding draws from the Philox stream keyed by the run's seed XOR this constant, so that it
// never shares a stream with the run's own generator (keyed by the seed itself: parameters, data, dropout).
inline constexpr std::uint64_t kStochasticRoundingKey = 0x9E3779B97F4A7C15ull;

// One quantized copy, laid out for the GEMM: [rows, k] row-major, the contraction along k.
struct BlockOperand {
  std::int64_t rows = 0, k = 0;
  std::vector<float> values;   // decoded element * block scale
  float global_decode = 1.0f;  // NVFP4's per-tensor decode scale; 1 for MXFP8
};

// Quantizes one copy of a Linear operand under the context's recipe (mxfp8 or nvfp4). `matrix` is the operand as
// the Linear holds it, [R, C] row-major f32 (x [N, in], W [out, in], dy [N, out]). rowwise: blocks along C, the
// result is [R, C] (k = C). columnwise: blocks down R, the result is [C, R] (k = R). The layouts, transform and
// rounding are core/block_recipe.h block_recipe_quantize's (what --what-if measures); NVFP4's stochastic rounding
// (grad_output) takes its offset from the context (Fp8Context::random_offset) and advances it. With a probe hook installed,
// reports the copy (probe::BlockQuantizeEvent with mxfp8_block_stats / nvfp4_block_stats over the values the
// quantizer saw: for NVFP4's columnwise copies the transpose, after the Hadamard transform where applied; the
// event's rows and cols are that quantized matrix's; its decoded span the copy's decoded values in that layout, the
// values the GEMM reads). ShapeError when the blocked dimensions do not divide.
BlockOperand block_quantize_copy(std::span<const float> matrix, std::int64_t R, std::int64_t C, Fp8Operand operand,
                                 BlockCopy copy, Fp8Context& context, const std::string& module);

// The GEMM operand of a copy from its decoded values in the quantized matrix's layout (probe::BlockQuantizeEvent::
// decoded, [rows, cols] row-major) and its per-tensor decode scale: [rows, cols] with k = cols, except an MXFP8
// columnwise copy (the [R, C] operand blocked down its columns), transposed to [cols, rows] so that k is the
// contraction. What block_quantize_copy returns, rebuilt from its event (the f32 twin's block GEMMs). ShapeError when
// the sizes do not match.
BlockOperand block_operand_from_decoded(std::vector<float> decoded, std::int64_t rows, std::int64_t cols,
                                        bool mx_columnwise, float global_decode);

// C = A B^T as above, A [I, K] and B [J, K]; `bias` (optional) has J elements. A new CPU [I, J] tensor of out_dtype.
// ShapeError when the k sizes differ.
Tensor block_gemm(const BlockOperand& a, const BlockOperand& b, DType out_dtype, const Tensor& bias = Tensor());

// Refuses a Linear whose sizes the recipe cannot block: in_features and out_features must be multiples of the
// block (32 for mxfp8, 16 for nvfp4: the fprop and dgrad contractions, and NVFP4's 16x16 weight tiles), and so must
// the input's rows (the wgrad contraction) when gradients are needed. ShapeError naming the module, the shapes and
// what to do.
void check_block_linear_shape(Fp8Recipe recipe, const std::string& module, std::int64_t rows, std::int64_t in_features,
                              std::int64_t out_features, bool needs_grad);

}  // namespace ampscope
