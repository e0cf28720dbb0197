// probes/analysis/op_traits.h: what each op is, in one table (op_traits.cpp, one line per op, grouped by
// kind): its kind, what it does to NaN, inf and zeros, the open range its values stay in, the autocast list
// core/autocast.cpp puts it on, and whether this runtime records it. The probe (the runtime side), the
// analysis, its remedies, the diff, the precision rankings and the twin ask here; none of them keeps a set of
// op names of its own. An op the table does not know (a user's own op, a name from another recorder) has no
// trait: every question about it answers false, kind and range none.
//
//   if (op_has(row.op, OpFlag::zeros_by_design)) ...        // relu, a mask, dropout: zeros are its job
//   if (op_kind(row.op) == OpKind::additive) ...            // add, sub, rsub
//   const OpTraits* t = find_op_traits("softmax");          // null for an op the table does not know
//
// Code that works out one op's own algebra or wording (a - b is a difference, sigmoid's remedy is
// binary_cross_entropy_with_logits) names that op; a question about what kind of op a row is asks here.
// tests/probes/op_traits_test.cpp checks the table against the op names real runs record (every sample in
// fp32/fp16/bf16, every scenario, Hugging Face folders) and the autocast column against core's policy table.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace ampscope::analysis {

// What an op computes, as the rules that read a trace need to tell ops apart.
enum class OpKind : std::uint8_t {
  none,         // not in the table
  elementwise,  // each output element from the same element of its inputs (and fixed scalars)
  additive,     // add, sub, rsub: element-wise; exact zeros from non-zero inputs are a cancellation
  saturating,   // sigmoid, tanh: element-wise, flattening towards +-1 where its resolution runs out
  reduction,    // sum, mean: add many terms up (conditioned by sum |x| / |sum x|)
  statistic,    // var, std: a reduction over squared deviations (not a plain sum)
  selecting,    // returns some of its input's entries as they are (max, a pool, an embedding's rows)
  mask_fill,    // where, masked_fill: entries from one tensor or the other (or a fill value) by a mask
  layout,       // views and copies: the same values in another shape or order
  cast,         // to: the same values in another dtype
  matmul,       // matrix products and convolutions
  norm,         // layer_norm
  softmax,      // softmax, log_softmax: normalise over a row
  loss,         // a loss reducing a batch to one number
  random,       // dropout: draws random numbers
  factory,      // makes a tensor from no input (zeros)
};

// What an op does to NaN, inf and zeros, and what the analysis's walks upstream may assume of it. Bits.
enum class OpFlag : std::uint32_t {
  none = 0,
  // The -inf it writes is on purpose (masked_fill's fill value: a causal mask), not an overflow; only its NaN
  // and +inf are anomalies.
  mask_neg_inf = 1u << 0,
  // -inf at 0 (log, log2, log10).
  logarithm = 1u << 1,
  // Grows as exp: +inf from finite inputs (exp above 11.09 in f16, 88.7 in f32).
  exponential = 1u << 2,
  // inf from a zero divisor (div, reciprocal, rsqrt).
  divides = 1u << 3,
  // NaN for negative inputs (sqrt, rsqrt, the logs; pow of a negative base with a fractional exponent).
  nan_below_zero = 1u << 4,
  // A zero in its input makes an inf whatever its other operands: in its output (log, reciprocal, rsqrt) or
  // in its gradient (sqrt: 1 / (2 sqrt x)). Not pow: whether 0 breaks it depends on the exponent.
  zero_input_inf = 1u << 5,
  // Exact zeros in its output are its job (relu of negatives, a mask, dropout, a pooled or looked-up zero),
  // not a rounding: a walk upstream for the op that made zeros stops here.
  zeros_by_design = 1u << 6,
  // A zero (or a value at a boundary) in an input can reach its output as it is: a walk upstream for the op
  // that made zeros goes through it.
  passes_zeros = 1u << 7,
  // Hands its input's values on unchanged (a view, a copy, a cast): a negative value in stays negative out.
  hands_on = 1u << 8,
  // Its output is its tensor input negated (neg; rsub, c - x, whose zeros are where x equals c).
  negates = 1u << 9,
  // Returns some of its input's entries as they are, so it can return exactly the right values while other
  // entries are NaN/inf (a loss picking the target's column, a mask, a pool): finite output from non-finite
  // input is not damage.
  selects = 1u << 10,
  // Lifts its input to a lower bound (clamp, clamp_min): zeros it still returns mean the bound rounded to 0.
  clamps_low = 1u << 11,
  // Its CPU kernel computes each element alone, from its value: the twin may compute a large f16/bf16 input
  // by a table of the op on all 65536 values (probes/twin.cpp).
  element_table = 1u << 12,
  // Multiplies its tensor input by a factor (mul, div: a scalar, a parameter, or a smaller tensor such as a
  // temperature): a factor far from 1 makes every value that many times larger or smaller (the root walk's
  // amplification, docs/report-format.md).
  scales = 1u << 13,
};
constexpr OpFlag operator|(OpFlag a, OpFlag b) {
  return static_cast<OpFlag>(static_cast<std::uint32_t>(a) | static_cast<std::uint32_t>(b));
}
constexpr bool any(OpFlag a, OpFlag b) { return (static_cast<std::uint32_t>(a) & static_cast<std::uint32_t>(b)) != 0; }

// The open interval its values stay in mathematically: an output at exactly an end of it is saturation (the
// format's resolution or range ran out).
enum class OpRange : std::uint8_t {
  none,         // no such bound (or not in the table)
  unit,         // (0, 1): sigmoid, softmax
  signed_unit,  // (-1, 1): tanh
  positive,     // (0, inf): exp
};

// The list core/autocast.cpp's policy table puts the op on (probe::AutocastPolicy's names; the analysis
// cannot include core).
enum class AutocastList : std::uint8_t { none, lower_precision_fp, fp32, fp32_set_opt_dtype, promote, banned };

// Whether a trace of this runtime can hold a row of the op.
enum class Recorded : std::uint8_t {
  yes,        // an op core or the models dispatch, or an autograd node they record
  composite,  // a composite whose steps are recorded instead (cross_entropy, scaled_dot_product_attention)
  never,      // a name other recorders use (PyTorch's), kept so their traces read the same
};

struct OpTraits {
  std::string_view op;
  OpKind kind = OpKind::none;
  OpFlag flags = OpFlag::none;
  OpRange range = OpRange::none;
  AutocastList autocast = AutocastList::none;
  Recorded recorded = Recorded::yes;
};

// Every line of the table, in its order.
std::span<const OpTraits> op_traits_table();
// The line of an op, or null.
const OpTraits* find_op_traits(std::string_view op);

// Questions about one op (false, none for an op the table does not know).
inline bool op_has(std::string_view op, OpFlag flag) {
  const OpTraits* t = find_op_traits(op);
  return t != nullptr && any(t->flags, flag);
}
inline OpKind op_kind(std::string_view op) {
  const OpTraits* t = find_op_traits(op);
  return t == nullptr ? OpKind::none : t->kind;
}
inline OpRange op_range(std::string_view op) {
  const OpTraits* t = find_op_traits(op);
  return t == nullptr ? OpRange::none : t->range;
}

std::string_view kind_name(OpKind kind);               // "elementwise", ...
std::string_view autocast_list_name(AutocastList l);   // "lower_precision_fp", ... ("none")

}  // namespace ampscope::analysis
