// core/block_recipe.cpp: the block-scaled recipes' copies of a Linear's operands (see block_recipe.h).
#include "core/block_recipe.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

namespace {

std::vector<float> transposed(std::span<const float> m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return t;
}

}  // namespace

std::string_view block_format_name(BlockFormat format) { return format == BlockFormat::mxfp8 ? "mxfp8" : "nvfp4"; }

std::int64_t block_format_block(BlockFormat format) { return format == BlockFormat::mxfp8 ? kMxBlock : kNvfp4Block; }

std::string_view recipe_copy_name(bool columnwise) { return columnwise ? "columnwise" : "rowwise"; }

RecipeCopy block_recipe_quantize(std::span<const float> matrix, std::int64_t R, std::int64_t C, Fp8Operand operand,
                                 bool columnwise, const BlockRecipe& recipe, std::uint64_t& random_offset) {
  if (R < 0 || C < 0 || static_cast<std::uint64_t>(R) * static_cast<std::uint64_t>(C) != matrix.size()) {
    throw ShapeError(fmt::format("block_recipe_quantize: {} values do not make a {}x{} matrix\nhint: pass the "
                                 "operand's R * C values in row-major order",
                                 matrix.size(), R, C));
  }
  RecipeCopy out;
  out.operand = operand;
  out.columnwise = columnwise;
  if (recipe.format == BlockFormat::mxfp8) {
    out.rows = R;
    out.cols = C;
    out.seen.assign(matrix.begin(), matrix.end());
    out.tensor = quantize_mxfp8(out.seen, R, C,
                                {.axis = columnwise ? BlockAxis::along_column : BlockAxis::along_row,
                                 .element = Fp8Format::e4m3,
                                 .rule = recipe.mx_scale});
    return out;
  }
  const bool weight = operand == Fp8Operand::weight;
  const bool grad = operand == Fp8Operand::grad_output;
  if (columnwise) {
    out.seen = transposed(matrix, R, C);
    out.rows = C;
    out.cols = R;
    // The wgrad GEMM's operands (x and dy columnwise): the transform runs along N, the rows of the transpose.
    if (!weight && recipe.nvfp4_rht) {
      if (R % kRhtSize != 0) {
        throw ShapeError(fmt::format("NVFP4 {} (columnwise): the Hadamard transform runs over 16 values along the "
                                     "wgrad contraction, but the operand has {} rows\nhint: make the batch's rows a "
                                     "multiple of 16",
                                     fp8_operand_name(operand), R));
      }
      out.seen = random_hadamard_transform(out.seen);
    }
  } else {
    out.seen.assign(matrix.begin(), matrix.end());
    out.rows = R;
    out.cols = C;
  }
  Nvfp4Options o{.tile = weight ? Nvfp4Tile::square_16x16 : Nvfp4Tile::row_1x16,
                 .stochastic_rounding = grad,
                 .stream = {}};
  if (grad) {
    o.stream = {.seed = recipe.sr_seed, .offset = random_offset};
    random_offset += (static_cast<std::uint64_t>(out.seen.size()) + 3) / 4;
  }
  out.tensor = quantize_nvfp4(out.seen, out.rows, out.cols, o);
  return out;
}

BlockStats block_recipe_stats(const RecipeCopy& copy) {
  if (const auto* mx = std::get_if<MxTensor>(&copy.tensor)) return mxfp8_block_stats(copy.seen, *mx);
  return nvfp4_block_stats(copy.seen, std::get<Nvfp4Tensor>(copy.tensor));
}

std::vector<RecipeCopyRef> linear_forward_copies(bool input_needs_grad, bool weight_needs_grad) {
  std::vector<RecipeCopyRef> copies{{Fp8Operand::input, false}, {Fp8Operand::weight, false}};
  if (input_needs_grad) copies.push_back({Fp8Operand::weight, true});
  if (weight_needs_grad) copies.push_back({Fp8Operand::input, true});
  return copies;
}

std::vector<RecipeCopyRef> linear_backward_copies(bool input_needs_grad, bool weight_needs_grad) {
  std::vector<RecipeCopyRef> copies;
  if (input_needs_grad) copies.push_back({Fp8Operand::grad_output, false});
  if (weight_needs_grad) copies.push_back({Fp8Operand::grad_output, true});
  return copies;
}

void check_block_linear(BlockFormat format, std::string_view what, const std::string& module, std::int64_t rows,
                        std::int64_t in_features, std::int64_t out_features, bool needs_grad) {
  const std::int64_t b = block_format_block(format);
  if (in_features % b == 0 && out_features % b == 0 && (!needs_grad || rows % b == 0)) return;
  const std::string_view blocks = format == BlockFormat::mxfp8
                                      ? "1x32 blocks along each GEMM's contraction dimension"
                                      : "1x16 blocks along each GEMM's contraction dimension and 16x16 weight tiles";
  throw ShapeError(fmt::format(
      "{}: linear in '{}': {} quantizes in {}, so in_features, out_features{} must be multiples of {}, but the weight "
      "is [{}, {}] and the input has {} rows\nhint: keep this Linear in bf16 (--fp8-keep-bf16 '{}'), or make its "
      "sizes{} multiples of {}",
      what, module, block_format_name(format), blocks, needs_grad ? " and the input's rows" : "", b, out_features,
      in_features, rows, module, needs_grad ? " and the batch's rows" : "", b));
}

}  // namespace ampscope
