// probes/analysis/internal/provenance.h: what the dataflow provenance (trace::OpRow::inputs) says about an
// origin: the root-cause walk upstream from it, and the silent damage downstream. Internal to the analysis
// library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
//
//   root_walk(d, origin_row, idx);   // fills d.chain and d.root_cause when the walk finds a cause
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "probes/analysis/analysis.h"
#include "probes/analysis/internal/rows.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// From an origin that met zeros (a log of 0, a division by 0, 0/0) or negative values (a sqrt of a difference
// that cancelled below 0), walks the provenance upstream to the op that made them. Fills d.chain (root first)
// and d.root_cause; leaves both empty when the trace has no provenance or the walk finds no cause.
void root_walk(Diagnosis& d, const trace::OpRow& origin, const SeqIndex& idx);

// What made the values an overflow met that large (amplification_walk): the op that amplified them, the numbers
// its evidence quotes, and what its remedies need.
struct Amplification {
  enum class Kind {
    factor,   // mul or div by a factor (a scalar, a parameter, a smaller tensor such as a temperature)
    product,  // a product of two activations (bmm(q, k^T), x * x)
    weight,   // a product with weights (linear, matmul or conv with a parameter), or a norm's weight
    other,    // any other op (exp of a moderate value, a sum of many terms)
  };
  Kind kind = Kind::other;
  const trace::OpRow* op = nullptr;     // the amplifier: the chain's root
  const trace::OpRow* input = nullptr;  // the input the values came through (a product: its larger operand)
  const trace::OpRow* other = nullptr;  // a product's other operand; a factor that is the output of an op
  std::int64_t other_marker = trace::kInputNone;  // a factor that is no op's output: a scalar (none) or a parameter
  double gain = 0;                      // out_absmax / in_absmax
  double in_absmax = 0, out_absmax = 0;
  bool overflowed = false;  // the amplifier is the origin: out_absmax is f16's largest value, a lower bound
  // product: no op scales it (or its operands) down before the softmax or exp its output reaches (consumer).
  bool unscaled = false;
  std::string consumer;
  std::int64_t inner = 0;   // product: the dimension it sums over, from its operands' shapes (0: they do not say)
  // An exp origin: the largest input exp can take in its dtype (ln 65504 = 11.09 in f16, 88.7 in f32 and bf16)
  // and the absmax it took; 0 for an overflow past f16's largest value.
  double limit = 0, reached = 0;
  // Every op after it, the origin included, computes an f32 input in f32 (internal/reach.h keeps_f32_input),
  // and f32 holds what the origin computed: the amplifier computed in f32 removes the overflow.
  bool f32_path = false;
  // Set by the step's rules, which remember earlier steps: the amplifier's gain grew since (weights that grew
  // as they trained), the text saying so, and the run's learning rate at this step (NaN when unknown).
  bool grew = false;
  std::string growth;
  double lr = std::numeric_limits<double>::quiet_NaN();
};

// From an overflow (exp_overflow, or f16_overflow in the forward phase), walks the provenance upstream along the
// largest input to the op that amplified the values: the most upstream op on the way that made them at least 8
// times larger (kAmplifies) and brought them within 2^10 of the limit the origin passed. Adds and mask fills are
// not amplifiers, and the walk stops at one that made the values that much larger (an operand it does not
// follow made them) and after a norm or a softmax (their output does not grow with their input); a product of
// two activations amplifies only as a dot product nothing scales before the softmax or exp it feeds (the
// missing 1/sqrt(d)), otherwise the walk goes on to its larger operand. Fills d.chain (root first: roles
// "amplification", "passes on", "origin") and d.root_cause ("amplification").
std::optional<Amplification> amplification_walk(Diagnosis& d, const trace::OpRow& origin, const SeqIndex& idx,
                                                std::span<const trace::OpRow> ops);
inline constexpr double kAmplifies = 8;

// Silent damage: forward ops of the step that took NaN/inf in and returned finite values, and the ops
// downstream of them (their finite outputs are computed from wrong values): d.absorbed_by, d.silently_wrong
// and a sentence of evidence.
void silent_damage(Diagnosis& d, std::span<const trace::OpRow> ops, const SeqIndex& idx,
                   const trace::StepRow* step_row);

}  // namespace ampscope::analysis::detail
