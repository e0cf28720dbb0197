// Block-scaled Linear GEMMs on the CPU (core/block_linear.h).
#include "core/block_linear.h"

#include <utility>
#include <variant>

#include <fmt/format.h>

#include "core/block_recipe.h"
#include "core/block_stats.h"
#include "core/cpu_gemm.h"
#include "core/error.h"
#include "core/float8.h"
#include "core/probe_hook.h"

namespace ampscope {
namespace {

std::vector<float> transposed(std::span<const float> m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return t;
}

void report(const std::string& module, Fp8Operand operand, BlockCopy copy, std::string_view format, std::int64_t rows,
            std::int64_t cols, const BlockStats& stats, std::span<const float> decoded, float global_decode) {
  probe::Hook* hook = probe::hook();
  hook->on_block_quantize(probe::BlockQuantizeEvent{.step = probe::current_step(),
                                                    .module = module,
                                                    .operand = fp8_operand_name(operand),
                                                    .copy = block_copy_name(copy),
                                                    .format = format,
                                                    .what_if = false,
                                                    .rows = rows,
                                                    .cols = cols,
                                                    .stats = stats,
                                                    .decoded = decoded,
                                                    .global_decode = global_decode});
}

// The copy's values in the quantized matrix's layout ([q.rows, q.cols] row-major), each element decoded times its
// block's scale (exact in float: MX elements times powers of two; E2M1's 2 significant bits times E4M3's 4).
std::vector<float> decoded_values(const RecipeCopy& q) {
  if (const auto* mx = std::get_if<MxTensor>(&q.tensor)) return dequantize_mxfp8(*mx);  // element * 2^(code - 127)
  const Nvfp4Tensor& t = std::get<Nvfp4Tensor>(q.tensor);
  const bool tiles = t.options.tile == Nvfp4Tile::square_16x16;
  std::vector<float> values(q.seen.size());
  const std::int64_t scale_cols = q.cols / kNvfp4Block;
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const std::int64_t block = tiles ? (r / kNvfp4Block) * scale_cols + c / kNvfp4Block : r * scale_cols + c / kNvfp4Block;
      const std::size_t i = static_cast<std::size_t>(r * q.cols + c);
      values[i] = e2m1_to_float(t.codes[i]) * fp8_to_float(t.scales[static_cast<std::size_t>(block)], Fp8Format::e4m3);
    }
  }
  return values;
}

std::int64_t block_of(Fp8Recipe recipe) { return recipe == Fp8Recipe::mxfp8 ? kMxBlock : kNvfp4Block; }

}  // namespace

std::string_view block_copy_name(BlockCopy copy) { return copy == BlockCopy::rowwise ? "rowwise" : "columnwise"; }

BlockOperand block_quantize_copy(std::span<const float> matrix, std::int64_t R, std::int64_t C, Fp8Operand operand,
                                 BlockCopy copy, Fp8Context& context, const std::string& module) {
  if (static_cast<std::int64_t>(matrix.size()) != R * C) {
    throw ShapeError(fmt::format("block_quantize_copy: {} values for a {}x{} matrix", matrix.size(), R, C));
  }
  const Fp8Options& options = context.options();
  if (!is_block_recipe(options.recipe)) throw Error("block_quantize_copy: the context's recipe is not mxfp8 or nvfp4");
  // The layouts, transform and rounding are block_recipe_quantize's, which --what-if uses too: one description of
  // what each recipe quantizes, so the what-if statistics are the real run's by construction.
  const BlockRecipe recipe{.format = options.recipe == Fp8Recipe::mxfp8 ? BlockFormat::mxfp8 : BlockFormat::nvfp4,
                           .mx_scale = options.mx_scale,
                           .nvfp4_rht = options.nvfp4_rht,
                           .sr_seed = options.sr_seed};
  std::uint64_t offset = context.random_offset();
  const RecipeCopy q = block_recipe_quantize(matrix, R, C, operand, copy == BlockCopy::columnwise, recipe, offset);
  context.set_random_offset(offset);
  std::vector<float> decoded = decoded_values(q);
  const float global_decode = recipe.format == BlockFormat::nvfp4 ? std::get<Nvfp4Tensor>(q.tensor).global_decode_scale : 1.0f;
  if (probe::hook() != nullptr) {
    report(module, operand, copy, block_format_name(recipe.format), q.rows, q.cols, block_recipe_stats(q), decoded,
           global_decode);
  }
  // An MX columnwise copy is the [R, C] matrix blocked down its columns; the GEMM contracts over R. An NVFP4
  // columnwise copy is already the transpose, [C, R].
  return block_operand_from_decoded(std::move(decoded), q.rows, q.cols,
                                    recipe.format == BlockFormat::mxfp8 && q.columnwise, global_decode);
}

BlockOperand block_operand_from_decoded(std::vector<float> decoded, std::int64_t rows, std::int64_t cols,
                                        bool mx_columnwise, float global_decode) {
  if (static_cast<std::int64_t>(decoded.size()) != rows * cols) {
    throw ShapeError(fmt::format("block_operand_from_decoded: {} values for a {}x{} copy", decoded.size(), rows, cols));
  }
  BlockOperand out;
  out.rows = mx_columnwise ? cols : rows;
  out.k = mx_columnwise ? rows : cols;
  out.values = mx_columnwise ? transposed(decoded, rows, cols) : std::move(decoded);
  out.global_decode = global_decode;  // applied as the GEMM's alpha, as TE does
  return out;
}

Tensor block_gemm(const BlockOperand& a, const BlockOperand& b, DType out_dtype, const Tensor& bias) {
  if (a.k != b.k) {
    throw ShapeError(fmt::format("block_gemm: inner sizes differ ([{}, {}] times [{}, {}]^T)", a.rows, a.k, b.rows, b.k));
  }
  const std::int64_t I = a.rows, J = b.rows, K = a.k;
  std::vector<float> bias_f;
  if (bias.defined()) {
    if (bias.numel() != J) throw ShapeError(fmt::format("block_gemm: bias of {} elements for {} columns", bias.numel(), J));
    const Tensor bf = bias.to(DType::f32).contiguous().to(Device::cpu());
    bias_f.assign(bf.data_as<float>(), bf.data_as<float>() + J);
  }
  const std::vector<float> Bt = transposed(b.values, J, K);  // [K, J]
  const float alpha = a.global_decode * b.global_decode;
  Tensor out = Tensor::empty({I, J}, {DType::f32, Device::cpu()});
  decoded_gemm(a.values.data(), Bt.data(), out.data_as<float>(), I, K, J, alpha, bias_f.empty() ? nullptr : bias_f.data());
  return out.to(out_dtype);
}

void check_block_linear_shape(Fp8Recipe recipe, const std::string& module, std::int64_t rows, std::int64_t in_features,
                              std::int64_t out_features, bool needs_grad) {
  const std::int64_t b = block_of(recipe);
  const bool ok = in_features % b == 0 && out_features % b == 0 && (!needs_grad || rows % b == 0);
  if (ok) return;
  const char* name = recipe == Fp8Recipe::mxfp8 ? "mxfp8" : "nvfp4";
  const std::string what = recipe == Fp8Recipe::mxfp8 ? "1x32 blocks along each GEMM's contraction dimension"
                                                      : "1x16 blocks along each GEMM's contraction dimension and 16x16 "
                                                        "weight tiles";
  throw ShapeError(fmt::format(
      "linear in '{}': --precision {} quantizes in {}, so {} must be multiples of {}, but the "
      "weight is [{}, {}] and the input has {} rows\nhint: keep this Linear in bf16 (ampscope train: --fp8-keep-bf16 "
      "'{}'), or make its sizes{} multiples of {}",
      module, name, what, needs_grad ? "in_features, out_features and the input's rows" : "in_features and out_features", b, out_features, in_features, rows, module,
      needs_grad ? " and the batch's rows" : "", b));
}

}  // namespace ampscope
