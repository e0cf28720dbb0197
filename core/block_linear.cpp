// Block-scaled Linear GEMMs on the CPU (core/block_linear.h).
#include "core/block_linear.h"

#include <utility>

#include <fmt/format.h>

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
            std::int64_t cols, const BlockStats& stats) {
  probe::Hook* hook = probe::hook();
  hook->on_block_quantize(probe::BlockQuantizeEvent{.step = probe::current_step(),
                                                    .module = module,
                                                    .operand = fp8_operand_name(operand),
                                                    .copy = block_copy_name(copy),
                                                    .format = format,
                                                    .what_if = false,
                                                    .rows = rows,
                                                    .cols = cols,
                                                    .stats = stats});
}

BlockOperand mxfp8_copy(std::span<const float> m, std::int64_t R, std::int64_t C, Fp8Operand operand, BlockCopy copy,
                        const Fp8Options& options, const std::string& module) {
  // E4M3 for all three operands: TE's MXFP8BlockScaling default (fp8_format E4M3).
  const MxTensor q = quantize_mxfp8(m, R, C,
                                    {.axis = copy == BlockCopy::rowwise ? BlockAxis::along_row : BlockAxis::along_column,
                                     .element = Fp8Format::e4m3,
                                     .rule = options.mx_scale});
  if (probe::hook() != nullptr) report(module, operand, copy, "mxfp8", R, C, mxfp8_block_stats(m, q));
  std::vector<float> values = dequantize_mxfp8(q);  // element * 2^(code - 127): exact
  BlockOperand out;
  if (copy == BlockCopy::rowwise) {
    out.rows = R;
    out.k = C;
    out.values = std::move(values);
  } else {
    out.rows = C;
    out.k = R;
    out.values = transposed(values, R, C);
  }
  return out;
}

BlockOperand nvfp4_copy(std::span<const float> m, std::int64_t R, std::int64_t C, Fp8Operand operand, BlockCopy copy,
                        Fp8Context& context, const std::string& module) {
  const Fp8Options& options = context.options();
  // What TE's NVFP4BlockScaling does per operand (docs/fp8.md, "Training in MXFP8 and NVFP4"): weights in 16x16
  // tiles, inputs and gradients in 1x16; stochastic rounding for gradients only; the Hadamard transform only on
  // the wgrad GEMM's operands, i.e. the columnwise copies of the input and the gradient.
  const bool weight = operand == Fp8Operand::weight;
  const bool grad = operand == Fp8Operand::grad_output;
  const bool columnwise = copy == BlockCopy::columnwise;
  std::vector<float> quantized;  // the values the quantizer sees: [R, C], or [C, R] for the columnwise copy
  std::int64_t qr = R, qc = C;
  if (columnwise) {
    quantized = transposed(m, R, C);
    qr = C;
    qc = R;
    if (!weight && options.nvfp4_rht) {
      if (qc % kRhtSize != 0) {
        throw ShapeError(fmt::format("NVFP4 {} of {}: the Hadamard transform runs over 16 values along the wgrad "
                                     "contraction, but it has {} rows\nhint: make the batch's rows a multiple of 16",
                                     fp8_operand_name(operand), module, R));
      }
      quantized = random_hadamard_transform(quantized);
    }
  } else {
    quantized.assign(m.begin(), m.end());
  }
  Nvfp4Options o;
  o.tile = weight ? Nvfp4Tile::square_16x16 : Nvfp4Tile::row_1x16;
  o.stochastic_rounding = grad;
  if (grad) o.stream = {.seed = options.sr_seed, .offset = context.take_random_blocks(quantized.size())};
  const Nvfp4Tensor q = quantize_nvfp4(quantized, qr, qc, o);
  if (probe::hook() != nullptr) report(module, operand, copy, "nvfp4", qr, qc, nvfp4_block_stats(quantized, q));
  BlockOperand out;
  out.rows = qr;
  out.k = qc;
  out.global_decode = q.global_decode_scale;
  out.values.resize(quantized.size());
  const std::int64_t scale_cols = qc / kNvfp4Block;
  for (std::int64_t r = 0; r < qr; ++r) {
    for (std::int64_t c = 0; c < qc; ++c) {
      const std::int64_t block = weight ? (r / kNvfp4Block) * scale_cols + c / kNvfp4Block : r * scale_cols + c / kNvfp4Block;
      const std::size_t i = static_cast<std::size_t>(r * qc + c);
      // 2 significant bits times 4: exact in float.
      out.values[i] = e2m1_to_float(q.codes[i]) * fp8_to_float(q.scales[static_cast<std::size_t>(block)], Fp8Format::e4m3);
    }
  }
  return out;
}

std::int64_t block_of(Fp8Recipe recipe) { return recipe == Fp8Recipe::mxfp8 ? kMxBlock : kNvfp4Block; }

}  // namespace

std::string_view block_copy_name(BlockCopy copy) { return copy == BlockCopy::rowwise ? "rowwise" : "columnwise"; }

BlockOperand block_quantize_copy(std::span<const float> matrix, std::int64_t R, std::int64_t C, Fp8Operand operand,
                                 BlockCopy copy, Fp8Context& context, const std::string& module) {
  if (static_cast<std::int64_t>(matrix.size()) != R * C) {
    throw ShapeError(fmt::format("block_quantize_copy: {} values for a {}x{} matrix", matrix.size(), R, C));
  }
  switch (context.options().recipe) {
    case Fp8Recipe::mxfp8: return mxfp8_copy(matrix, R, C, operand, copy, context.options(), module);
    case Fp8Recipe::nvfp4: return nvfp4_copy(matrix, R, C, operand, copy, context, module);
    default: throw Error("block_quantize_copy: the context's recipe is not mxfp8 or nvfp4");
  }
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
