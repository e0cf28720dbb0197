#include "probes/analysis/op_traits.h"

#include <string>
#include <unordered_map>

namespace ampscope::analysis {
namespace {

using K = OpKind;
using F = OpFlag;
using R = OpRange;
using A = AutocastList;
constexpr F kNoFlag = F::none;
constexpr R kNoRange = R::none;

// ---- the table: one line per op, grouped by kind (op_traits.h says what each column means) ----
// {op, kind, flags, range, autocast list[, recorded]}
constexpr OpTraits kOpTraits[] = {
    // elementwise: each output element from the same input element (and fixed scalars). The ops autocast
    // keeps in f32 (reference/amp-semantics.md 2.4) are those f16 cannot hold: exp overflows, log and pow lose
    // precision.
    {"relu", K::elementwise, F::zeros_by_design | F::passes_zeros | F::element_table, kNoRange, A::none},
    {"gelu", K::elementwise, F::element_table, kNoRange, A::none},
    {"silu", K::elementwise, F::element_table, kNoRange, A::none},
    {"logsigmoid", K::elementwise, kNoFlag, kNoRange, A::none},
    {"softplus", K::elementwise, kNoFlag, kNoRange, A::fp32},
    {"exp", K::elementwise, F::exponential | F::element_table, R::positive, A::fp32},
    {"expm1", K::elementwise, F::exponential, kNoRange, A::fp32},
    {"log", K::elementwise, F::logarithm | F::nan_below_zero | F::zero_input_inf | F::element_table, kNoRange, A::fp32},
    {"log1p", K::elementwise, kNoFlag, kNoRange, A::fp32},
    {"sqrt", K::elementwise, F::nan_below_zero | F::zero_input_inf | F::passes_zeros | F::element_table, kNoRange,
     A::none},
    {"rsqrt", K::elementwise, F::divides | F::nan_below_zero | F::zero_input_inf | F::element_table, kNoRange, A::fp32},
    {"reciprocal", K::elementwise, F::divides | F::zero_input_inf, kNoRange, A::fp32},
    {"pow", K::elementwise, F::nan_below_zero | F::passes_zeros | F::element_table, kNoRange, A::fp32},
    {"neg", K::elementwise, F::negates | F::passes_zeros | F::element_table, kNoRange, A::none},
    {"abs", K::elementwise, F::passes_zeros | F::element_table, kNoRange, A::none},
    {"clamp", K::elementwise, F::clamps_low | F::passes_zeros | F::element_table, kNoRange, A::none},
    {"clamp_min", K::elementwise, F::clamps_low | F::passes_zeros, kNoRange, A::none},
    {"clamp_max", K::elementwise, F::passes_zeros, kNoRange, A::none},
    {"mul", K::elementwise, F::passes_zeros | F::element_table | F::scales, kNoRange, A::none},
    {"div", K::elementwise, F::divides | F::passes_zeros | F::element_table | F::scales, kNoRange, A::none},

    // additive: add and subtract. rsub is what `1 - t` records (c - x).
    {"add", K::additive, F::passes_zeros | F::element_table, kNoRange, A::none},
    {"sub", K::additive, F::passes_zeros | F::element_table, kNoRange, A::none},
    {"rsub", K::additive, F::negates | F::element_table, kNoRange, A::none},

    // saturating: element-wise, flat towards +-1 (sigmoid(z) rounds to exactly 1 once z passes
    // (significand bits + 2) ln 2).
    {"sigmoid", K::saturating, F::element_table, R::unit, A::none},
    {"tanh", K::saturating, F::element_table, R::signed_unit, A::none},

    // reduction: sums of many terms. sum is on autocast's fp32_set_opt_dtype list (f32 unless a dtype is
    // given); mean runs in its input's dtype.
    {"sum", K::reduction, F::passes_zeros, kNoRange, A::fp32_set_opt_dtype},
    {"mean", K::reduction, F::passes_zeros, kNoRange, A::none},

    // statistic: reductions over squared deviations.
    {"var", K::statistic, kNoFlag, kNoRange, A::none},
    {"std", K::statistic, kNoFlag, kNoRange, A::none},

    // selecting: some of the input's entries, as they are.
    {"max", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"min", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"amax", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"amin", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"maximum", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"minimum", K::selecting, F::selects | F::passes_zeros, kNoRange, A::none},
    {"argmax", K::selecting, F::selects, kNoRange, A::none},
    {"max_pool2d", K::selecting, F::selects | F::zeros_by_design, kNoRange, A::none},
    {"embedding", K::selecting, F::selects | F::zeros_by_design, kNoRange, A::none},

    // mask_fill: where picks entries of two tensors by a mask; masked_fill writes a scalar where the mask is
    // set, -inf for a causal mask (so its -inf is on purpose; where's -inf came in through an input).
    {"where", K::mask_fill, F::selects | F::zeros_by_design, kNoRange, A::none},
    {"masked_fill", K::mask_fill, F::selects | F::zeros_by_design | F::mask_neg_inf, kNoRange, A::none},

    // layout: the same values in another shape, order or place. Views record an autograd node only (a
    // backward row); embedding_padding_idx is the models' identity on an embedding's weight whose backward
    // zeroes the padding row's gradient (models/hf_models.cpp).
    {"view", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none},
    {"reshape", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none},
    {"expand", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none},
    {"slice", K::layout, F::hands_on | F::passes_zeros | F::selects, kNoRange, A::none},
    {"clone", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none},
    {"transpose", K::layout, F::passes_zeros, kNoRange, A::none},
    {"permute", K::layout, F::passes_zeros, kNoRange, A::none},
    {"cat", K::layout, F::passes_zeros, kNoRange, A::none},
    {"embedding_padding_idx", K::layout, kNoFlag, kNoRange, A::none},

    // cast: to another dtype (an explicit .to(); autocast's own casts are part of the op they feed). Where
    // it overflows or flushes is counted on its row (probes/probe.h).
    {"to", K::cast, F::hands_on | F::passes_zeros, kNoRange, A::none},

    // matmul: matrix products and convolutions, on autocast's lower_precision_fp list. Attention is a
    // composite: its steps (bmm, softmax, ...) are recorded, each in the dtype attention's inputs were cast to.
    {"matmul", K::matmul, kNoFlag, kNoRange, A::lower_precision_fp},
    {"bmm", K::matmul, kNoFlag, kNoRange, A::lower_precision_fp},
    {"linear", K::matmul, kNoFlag, kNoRange, A::lower_precision_fp},
    {"conv2d", K::matmul, kNoFlag, kNoRange, A::lower_precision_fp},
    {"scaled_dot_product_attention", K::matmul, kNoFlag, kNoRange, A::lower_precision_fp, Recorded::composite},

    // norm: on the fp32 list (it sums many terms).
    {"layer_norm", K::norm, kNoFlag, kNoRange, A::fp32},

    // softmax: normalisation over a row; fp32_set_opt_dtype (f32 unless a dtype is given).
    {"softmax", K::softmax, kNoFlag, R::unit, A::fp32_set_opt_dtype},
    {"log_softmax", K::softmax, kNoFlag, kNoRange, A::fp32_set_opt_dtype},

    // loss: on the fp32 list, but binary_cross_entropy, which autocast bans (its input is usually a sigmoid's
    // f16 output, which has lost the probabilities near 0 and 1). nll_loss picks the target's entry of each
    // row; cross_entropy is a composite (log_softmax, then nll_loss).
    {"nll_loss", K::loss, F::selects, kNoRange, A::fp32},
    {"mse_loss", K::loss, kNoFlag, kNoRange, A::fp32},
    {"binary_cross_entropy_with_logits", K::loss, kNoFlag, kNoRange, A::fp32},
    {"binary_cross_entropy", K::loss, kNoFlag, kNoRange, A::banned},
    {"cross_entropy", K::loss, F::selects, kNoRange, A::none, Recorded::composite},

    // random: draws random numbers, so the twin never runs its body again.
    {"dropout", K::random, F::zeros_by_design, kNoRange, A::none},

    // Names this runtime never records (PyTorch's), as the rules have always read them in traces written
    // elsewhere.
    {"log2", K::elementwise, F::logarithm | F::nan_below_zero | F::zero_input_inf, kNoRange, A::none, Recorded::never},
    {"log10", K::elementwise, F::logarithm | F::nan_below_zero | F::zero_input_inf, kNoRange, A::none, Recorded::never},
    {"gather", K::selecting, F::selects, kNoRange, A::none, Recorded::never},
    {"index_select", K::selecting, F::selects, kNoRange, A::none, Recorded::never},
    {"contiguous", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none, Recorded::never},
    {"squeeze", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none, Recorded::never},
    {"unsqueeze", K::layout, F::hands_on | F::passes_zeros, kNoRange, A::none, Recorded::never},
    {"zeros", K::factory, F::zeros_by_design, kNoRange, A::none, Recorded::never},
};

}  // namespace

std::span<const OpTraits> op_traits_table() { return kOpTraits; }

const OpTraits* find_op_traits(std::string_view op) {
  // Asked once or more per trace row: a hash lookup, built on first use.
  static const std::unordered_map<std::string_view, const OpTraits*> by_name = [] {
    std::unordered_map<std::string_view, const OpTraits*> m;
    for (const OpTraits& t : kOpTraits) m.emplace(t.op, &t);
    return m;
  }();
  const auto it = by_name.find(op);
  return it == by_name.end() ? nullptr : it->second;
}

std::string_view kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::none: return "none";
    case OpKind::elementwise: return "elementwise";
    case OpKind::additive: return "additive";
    case OpKind::saturating: return "saturating";
    case OpKind::reduction: return "reduction";
    case OpKind::statistic: return "statistic";
    case OpKind::selecting: return "selecting";
    case OpKind::mask_fill: return "mask_fill";
    case OpKind::layout: return "layout";
    case OpKind::cast: return "cast";
    case OpKind::matmul: return "matmul";
    case OpKind::norm: return "norm";
    case OpKind::softmax: return "softmax";
    case OpKind::loss: return "loss";
    case OpKind::random: return "random";
    case OpKind::factory: return "factory";
  }
  return "?";
}

std::string_view autocast_list_name(AutocastList l) {
  switch (l) {
    case AutocastList::none: return "none";
    case AutocastList::lower_precision_fp: return "lower_precision_fp";
    case AutocastList::fp32: return "fp32";
    case AutocastList::fp32_set_opt_dtype: return "fp32_set_opt_dtype";
    case AutocastList::promote: return "promote";
    case AutocastList::banned: return "banned";
  }
  return "?";
}

}  // namespace ampscope::analysis
