// Dataflow provenance (probes/analysis/internal/provenance.h): the root-cause walks upstream from an origin
// and the silent damage downstream of it.
#include "probes/analysis/internal/provenance.h"

#include "probes/analysis/internal/rows.h"
#include "probes/analysis/op_traits.h"

#include <cmath>
#include <set>

#include <fmt/format.h>

namespace ampscope::analysis::detail {

using trace::OpRow;
using trace::Phase;
using trace::StepRow;

namespace {

// The argument z above which sigmoid(z) rounds to exactly 1 in a dtype: (mantissa bits + 2) ln 2.
double sigmoid_one_at(const std::string& dtype) {
  const int bits = dtype == "f16" ? 10 : dtype == "bf16" ? 7 : dtype == "f64" ? 52 : 23;
  return (bits + 2) * std::log(2.0);
}

// An op whose mathematical range is open (op_traits.h, OpRange), at a boundary of it: "" when not. Which end
// it reached comes from the table; the sentence says what that means for the op.
std::string saturation_of(const OpRow& r) {
  const auto& h = r.health;
  const OpRange range = op_range(r.op);
  if (h.numel <= 0 || range == OpRange::none) return "";
  switch (range) {
    case OpRange::unit:
      if (op_kind(r.op) == OpKind::softmax) {  // probabilities over a row
        if (h.max == 1.0)
          return fmt::format("{} returned a probability of exactly 1.0 (the others of its row are then exactly 0)",
                             where_text(r));
        if (h.zero > 0) return fmt::format("{} returned {} probabilities of exactly 0 of {}", where_text(r), h.zero, h.numel);
        return "";
      }
      if (h.max == 1.0)
        return fmt::format("{} returned exactly 1.0 (max {}): {} rounds sigmoid(z) to 1 once z > {:.3g}", where_text(r),
                           number(h.max), r.out_dtype, sigmoid_one_at(r.out_dtype));
      if (h.zero > 0)
        return fmt::format("{} returned {} exact zeros of {}: {}(z) is never 0, {} rounds it to 0 for very negative z",
                           where_text(r), h.zero, h.numel, r.op, r.out_dtype);
      return "";
    case OpRange::signed_unit:
      if (h.max == 1.0 || h.min == -1.0)
        return fmt::format("{} returned exactly {}: {} never reaches it, {} rounds it there", where_text(r),
                           h.max == 1.0 ? "1.0" : "-1.0", r.op, r.out_dtype);
      return "";
    case OpRange::positive:
      if (h.zero > 0)
        return fmt::format("{} returned {} exact zeros of {}: {} is never 0, it underflowed", where_text(r), h.zero,
                           h.numel, r.op);
      return "";
    case OpRange::none: break;
  }
  return "";
}

// Ops whose output holds zeros by design (a ReLU of negative values, a mask, dropout): zeros there are not a
// rounding, so a root-cause walk stops at them.
bool zero_by_design(const OpRow& r, const SeqIndex& idx) {
  if (op_has(r.op, OpFlag::zeros_by_design)) return true;
  // A softmax over a row a mask filled with -inf: its exact zeros (and a 1 where one entry is left) are the
  // mask's, in any dtype.
  if (r.op == "softmax") {
    for (std::size_t i = 0; i < trace::kOpInputs; ++i) {
      const OpRow* q = producer_of(r, i, idx);
      if (q != nullptr && op_has(q->op, OpFlag::mask_neg_inf) && q->health.neg_inf > 0) return true;
    }
  }
  return false;
}

// Ops that add or subtract (rsub is what `1 - t` records): where exact zeros from inputs without any are
// a cancellation.
bool adds_or_subtracts(const OpRow& r) { return op_kind(r.op) == OpKind::additive; }

// add or sub, whose first operand keeps its sign (not rsub, c - x, which negates x).
bool add_or_sub(const OpRow& r) { return adds_or_subtracts(r) && !op_has(r.op, OpFlag::negates); }

// rsub, c - x: its exact zeros are where x equals c, not zeros of x.
bool subtracts_from_constant(const OpRow& r) { return adds_or_subtracts(r) && op_has(r.op, OpFlag::negates); }

// Ops that hand their input's values on (up to sign, layout, dtype or a constant factor): a zero or a
// boundary value in the input stays one in the output.
bool passes_on(const OpRow& r) { return op_has(r.op, OpFlag::passes_zeros); }

ChainLink link(const OpRow& r, std::string role, std::string evidence) {
  ChainLink l;
  l.seq = r.seq;
  l.phase = r.phase;
  l.op = r.op;
  l.module = r.module;
  l.out_dtype = r.out_dtype;
  l.autocast = r.autocast;
  l.role = std::move(role);
  l.evidence = std::move(evidence);
  return l;
}

// From an origin that returned NaN for negative inputs (sqrt, rsqrt, log or pow of a value below 0), walks
// the provenance upstream through ops that hand the negative values on (adding a constant such as an
// epsilon, casts, views) to a difference of two operands that are never negative (a - b, or a + (-b)): a
// quantity that cannot be negative, such as a variance computed as E[x^2] - E[x]^2, that rounding cancelled
// below 0. Fills d.chain and d.root_cause ("cancellation") and returns true when it finds one.
bool negative_walk(Diagnosis& d, const OpRow& origin, const SeqIndex& idx) {
  if (!op_has(origin.op, OpFlag::nan_below_zero) || origin.health.nan == 0) return false;
  const OpRow* p = producer_of(origin, 0, idx);
  if (p == nullptr || !(p->health.min < 0)) return false;
  const auto non_negative = [](const OpRow* q) { return q != nullptr && q->health.numel > 0 && q->health.min >= 0; };
  std::vector<ChainLink> rev;  // origin first
  rev.push_back(link(origin, "origin",
                     fmt::format("{} returned {} NaN from an input holding negative values (min {}): {} of a "
                                 "negative number is NaN",
                                 where_text(origin), origin.health.nan, number(p->health.min), origin.op)));
  for (int guard = 0; p != nullptr && guard < 16; ++guard) {
    const std::size_t n = tensor_inputs(*p);
    const bool adds_constant = n == 1 && add_or_sub(*p);
    if (op_has(p->op, OpFlag::hands_on) || adds_constant) {
      rev.push_back(link(*p, "passes on",
                         fmt::format("{} hands the negative values on (min {}){}", where_text(*p), number(p->health.min),
                                     adds_constant ? ": adding a constant (an epsilon) does not lift them above 0"
                                                   : "")));
      p = producer_of(*p, 0, idx);
      continue;
    }
    if (n == 2 && add_or_sub(*p)) {
      const OpRow* a = producer_of(*p, 0, idx);
      const OpRow* b = producer_of(*p, 1, idx);
      // a + (-b): the negated operand's own input is the subtrahend.
      const OpRow* b_source = b != nullptr && p->op == "add" && b->op == "neg" ? producer_of(*b, 0, idx) : b;
      const bool difference = p->op == "sub" || (b != nullptr && b->op == "neg");
      if (!difference || !non_negative(a) || !non_negative(b_source)) return false;
      rev.push_back(link(*p, "cancellation",
                         fmt::format("{} returned negative values (min {}) as the difference of two operands that "
                                     "are never negative here ({} min {}, {} min {}): a quantity that cannot be "
                                     "negative, such as a variance computed as E[x^2] - E[x]^2, cancelled below 0 "
                                     "in {}",
                                     where_text(*p), number(p->health.min), a->op, number(a->health.min),
                                     b_source->op, number(b_source->health.min), p->out_dtype)));
      d.root_cause = "cancellation";
      d.chain.assign(rev.rbegin(), rev.rend());
      return true;
    }
    return false;
  }
  return false;
}

}  // namespace

// From an origin that met zeros (a log of 0, a division by 0, 0/0), walks the provenance upstream to the
// op that made the zeros, and from a cancellation on to an operand that saturated. Fills d.chain (root
// first) and d.root_cause; leaves both empty when the trace has no provenance or the walk finds no cause.
void root_walk(Diagnosis& d, const OpRow& origin, const SeqIndex& idx) {
  if (origin.inputs[0] == trace::kInputUnknown) return;
  if (negative_walk(d, origin, idx)) return;
  std::vector<std::size_t> starts;
  // Where the zeros that broke the origin entered: its only input (a log, 1/x), or a division's divisor
  // first, then its dividend (0/0).
  if (op_has(origin.op, OpFlag::zero_input_inf)) starts = {0};
  else if (op_has(origin.op, OpFlag::divides)) starts = {1, 0};
  else if (d.cause == "invalid_operation") starts = {0, 1, 2};
  else return;
  const OpRow* p = nullptr;
  for (std::size_t i : starts) {
    const OpRow* q = producer_of(origin, i, idx);
    if (q != nullptr && q->health.zero > 0) {
      p = q;
      break;
    }
  }
  if (p == nullptr) return;
  std::vector<ChainLink> rev;  // origin first
  rev.push_back(link(origin, "origin", fmt::format("{} returned {} from an input holding exact zeros", where_text(origin),
                                                   counts_text(origin.health))));
  std::string root;
  // An epsilon (or a clamp's lower bound) that should have lifted the zeros but rounds to 0 in the dtype:
  // the root unless the walk finds an op upstream that made the zeros by rounding.
  std::size_t vanished = 0;  // index in rev + 1, 0 when none
  for (int guard = 0; p != nullptr && guard < 64 && root.empty(); ++guard) {
    const OpRow* zin = nullptr;
    // c - x (rsub, what `1 - s` records) makes its zeros where x equals c, not from zeros in x.
    for (std::size_t i = 0; i < trace::kOpInputs && !subtracts_from_constant(*p); ++i) {
      const OpRow* q = producer_of(*p, i, idx);
      if (q != nullptr && q->health.zero > 0) {
        zin = q;
        break;
      }
    }
    if (zin != nullptr && passes_on(*p)) {
      const bool clamps_low = op_has(p->op, OpFlag::clamps_low);
      if (vanished == 0 && ((add_or_sub(*p) && tensor_inputs(*p) == 1 && p->health.zero >= zin->health.zero) ||
                            (clamps_low && p->health.zero > 0))) {
        rev.push_back(link(*p, "underflow",
                           clamps_low
                               ? fmt::format("{} still holds {} exact zeros: its lower bound rounds to 0 in {} (in "
                                             "f16 anything up to 2^-25 = 3e-8 does, 1e-8 included)",
                                             where_text(*p), p->health.zero, p->out_dtype)
                               : fmt::format("{} adds a constant to an input with {} exact zeros and still holds {}: "
                                             "the constant rounds to 0 in {} (in f16 anything up to 2^-25 = 3e-8 "
                                             "does, an epsilon of 1e-8 included)",
                                             where_text(*p), zin->health.zero, p->health.zero, p->out_dtype)));
        vanished = rev.size();
      } else {
        rev.push_back(link(*p, "passes on",
                           fmt::format("{} passes on exact zeros ({} of {}) from its input", where_text(*p),
                                       p->health.zero, p->health.numel)));
      }
      p = zin;
      continue;
    }
    if (zero_by_design(*p, idx)) break;  // relu, a mask: zeros that are the op's job, not a rounding
    if (zin != nullptr) {
      // Its input held zeros already (a matmul of a row of relu zeros): they came from upstream.
      rev.push_back(link(*p, "passes on",
                         fmt::format("{} holds {} exact zeros of {}, and its input already held zeros",
                                     where_text(*p), p->health.zero, p->health.numel)));
      p = zin;
      continue;
    }
    if (p->op == "softmax" && p->health.zero > 0) {
      // Its exact zeros are exp(x - max) below the dtype's smallest subnormal: a range problem (bf16 and f32
      // reach exp(-92) and exp(-103); f16 stops at 2^-24, about exp(-16.6)).
      rev.push_back(link(*p, "underflow",
                         fmt::format("{} returned {} probabilities of exactly 0 of {}: exp of a score minus the "
                                     "row's max fell below the smallest subnormal of {}{}",
                                     where_text(*p), p->health.zero, p->health.numel, p->out_dtype,
                                     p->out_dtype == "f16" ? " (2^-24 = 6e-8, about exp(-16.6))" : "")));
      root = "underflow";
      break;
    }
    if (std::string sat = saturation_of(*p); !sat.empty()) {
      rev.push_back(link(*p, "saturation", std::move(sat)));
      root = "saturation";
      break;
    }
    if (adds_or_subtracts(*p)) {
      rev.push_back(link(*p, "cancellation",
                         fmt::format("{} returned {} exact zeros of {} from inputs that held none: the values it "
                                     "combines cancel exactly in {}",
                                     where_text(*p), p->health.zero, p->health.numel, p->out_dtype)));
      root = "cancellation";
      // An operand pinned at a boundary (sigmoid rounded to 1, so 1 - s is 0), through ops that pass it on.
      for (std::size_t i = 0; i < trace::kOpInputs && root == "cancellation"; ++i) {
        std::vector<ChainLink> passed;
        const OpRow* q = producer_of(*p, i, idx);
        for (int depth = 0; q != nullptr && depth < 6; ++depth) {
          if (std::string sat = saturation_of(*q); !sat.empty() && !zero_by_design(*q, idx)) {
            for (ChainLink& l : passed) rev.push_back(std::move(l));
            rev.push_back(link(*q, "saturation", std::move(sat)));
            root = "saturation";
            break;
          }
          if (!passes_on(*q) || tensor_inputs(*q) != 1) break;
          passed.push_back(link(*q, "passes on",
                                fmt::format("{} passes the values on (min {}, max {})", where_text(*q),
                                            number(q->health.min), number(q->health.max))));
          q = producer_of(*q, 0, idx);
        }
      }
      break;
    }
    rev.push_back(link(*p, "underflow",
                       fmt::format("{} returned {} exact zeros of {} from inputs that held none{}", where_text(*p),
                                   p->health.zero, p->health.numel,
                                   p->cast_underflow > 0
                                       ? fmt::format(" ({} values flushed to zero on a cast)", p->cast_underflow)
                                       : ": the results are below the smallest subnormal of " + p->out_dtype)));
    root = "underflow";
  }
  if (root.empty() && vanished > 0) {
    rev.resize(vanished);  // the links above the vanished constant explain nothing more
    root = "underflow";
  }
  if (root.empty()) return;
  d.root_cause = root;
  d.chain.assign(rev.rbegin(), rev.rend());
}

// Silent damage: forward ops of the step that took NaN/inf in and returned finite values, and the ops
// downstream of them (their finite outputs are computed from wrong values).
void silent_damage(Diagnosis& d, std::span<const OpRow> ops, const SeqIndex& idx, const StepRow* step_row) {
  if (ops.empty() || ops.front().inputs[0] == trace::kInputUnknown) return;
  std::set<std::int64_t> wrong;
  std::vector<const OpRow*> absorbing;
  // Ops that select some of their input's entries (a loss picking the target's column, a mask, a pool)
  // can return exactly the right values while other entries are non-finite: not damage.
  for (const OpRow& r : ops) {
    if (r.phase != Phase::forward || non_finite(r) > 0 || r.health.numel <= 0 || op_has(r.op, OpFlag::selects))
      continue;
    for (std::size_t i = 0; i < trace::kOpInputs; ++i) {
      const OpRow* q = producer_of(r, i, idx);
      if (q != nullptr && q->phase == Phase::forward && non_finite(*q) > 0) {
        absorbing.push_back(&r);
        wrong.insert(r.seq);
        break;
      }
    }
  }
  if (absorbing.empty()) return;
  std::int64_t later = 0;
  for (const OpRow& r : ops) {
    if (r.phase != Phase::forward || wrong.count(r.seq) > 0) continue;
    for (std::int64_t in : r.inputs) {
      if (in >= 0 && wrong.count(in) > 0) {
        wrong.insert(r.seq);
        if (non_finite(r) == 0) ++later;
        break;
      }
    }
  }
  for (const OpRow* r : absorbing) d.absorbed_by.push_back(fmt::format("{} (seq {})", place(*r), r->seq));
  d.silently_wrong = later;
  const OpRow& a = *absorbing.front();
  const OpRow* fed = nullptr;
  for (std::size_t i = 0; i < trace::kOpInputs && fed == nullptr; ++i) {
    const OpRow* q = producer_of(a, i, idx);
    if (q != nullptr && non_finite(*q) > 0) fed = q;
  }
  d.evidence.push_back(fmt::format(
      "silent damage: {} took in {} (from {}) and returned finite values (absmax {}, {} exact zeros of {}); its "
      "output{} and {} later op{} of step {} are wrong but finite{}",
      where_text(a), fed ? counts_text(fed->health) : std::string("non-finite values"), fed ? where_text(*fed) : "?",
      number(a.health.absmax), a.health.zero, a.health.numel,
      absorbing.size() > 1 ? fmt::format(" (and those of {} more ops like it)", absorbing.size() - 1) : "", later,
      later == 1 ? "" : "s", a.step,
      step_row != nullptr && std::isfinite(step_row->loss)
          ? fmt::format(", and the loss ({}) does not show it", number(step_row->loss))
          : ""));
}

}  // namespace ampscope::analysis::detail
