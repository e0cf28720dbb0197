// Dataflow provenance (probes/analysis/internal/provenance.h): the root-cause walks upstream from an origin
// and the silent damage downstream of it.
#include "probes/analysis/internal/provenance.h"

#include "probes/analysis/internal/reach.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/op_traits.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

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

// ---- amplification: the op that made an overflow's values that large ----

namespace {

// The largest input an exp of this dtype can take: ln of its largest finite value.
double exp_limit(const std::string& dtype) { return dtype == "f16" ? std::log(kF16Max) : std::log(3.4028234663852886e38); }

// A row's shape, "[16, 12, 64]" -> {16, 12, 64}; empty when it does not parse.
std::vector<std::int64_t> dims_of(const std::string& shape) {
  std::vector<std::int64_t> out;
  std::int64_t v = 0;
  bool any = false;
  for (char ch : shape) {
    if (ch >= '0' && ch <= '9') {
      v = v * 10 + (ch - '0');
      any = true;
    } else if (any) {
      out.push_back(v);
      v = 0;
      any = false;
    }
  }
  return out;
}

// The inputs of a row that are outputs of recorded ops: `main`, the one the values come through (most elements,
// then largest absmax: the operand the output's shape comes from), and `other`; and, when only one is a row,
// the marker of the first input that is not (a scalar factor records none, a weight a parameter).
struct RowInputs {
  const OpRow* main = nullptr;
  std::size_t main_at = 0;
  const OpRow* other = nullptr;
  std::int64_t other_marker = trace::kInputNone;
  int rows = 0;
};
RowInputs row_inputs(const OpRow& r, const SeqIndex& idx) {
  RowInputs in;
  bool marker = false;
  for (std::size_t i = 0; i < trace::kOpInputs; ++i) {
    const OpRow* q = producer_of(r, i, idx);
    if (q == nullptr) {
      if (!marker && i > 0 && (r.inputs[i] == trace::kInputParameter || r.inputs[i] == trace::kInputData)) {
        in.other_marker = r.inputs[i];
        marker = true;
      }
      continue;
    }
    ++in.rows;
    const bool larger = in.main == nullptr || q->health.numel > in.main->health.numel ||
                        (q->health.numel == in.main->health.numel && q->health.absmax > in.main->health.absmax);
    if (larger) {
      if (in.main != nullptr && in.other == nullptr) in.other = in.main;
      in.main = q;
      in.main_at = i;
    } else if (in.other == nullptr) {
      in.other = q;
    }
  }
  return in;
}

// What kind of amplifier a row is, from the op table and its inputs.
Amplification::Kind amplifier_kind(const OpRow& r, const RowInputs& in) {
  const OpKind kind = op_kind(r.op);
  const bool two_activations =
      in.rows == 2 && in.other != nullptr && in.other->health.numel == in.main->health.numel;
  if (kind == OpKind::matmul) return in.rows == 2 ? Amplification::Kind::product : Amplification::Kind::weight;
  if (kind == OpKind::norm) return Amplification::Kind::weight;
  if (op_has(r.op, OpFlag::scales)) {
    if (two_activations) return Amplification::Kind::product;
    // A division scales its dividend only.
    if (!op_has(r.op, OpFlag::divides) || in.main_at == 0) return Amplification::Kind::factor;
  }
  return Amplification::Kind::other;
}

// Ops that cannot amplify: their output holds their inputs' values (or a fill, or a sum of two operands), so
// an output far larger than the input the walk follows came from an operand it does not follow.
bool carries(OpKind kind) {
  return kind == OpKind::additive || kind == OpKind::mask_fill || kind == OpKind::layout || kind == OpKind::cast ||
         kind == OpKind::selecting;
}

// The first forward row of the step that takes r's output as an input.
const OpRow* consumer_of(const OpRow& r, std::span<const OpRow> ops) {
  for (const OpRow& o : ops) {
    if (o.phase != Phase::forward || o.seq <= r.seq) continue;
    if (std::find(o.inputs.begin(), o.inputs.end(), r.seq) != o.inputs.end()) return &o;
  }
  return nullptr;
}

// A product of two activations that nothing scales down: neither operand is the output of a scaling op, and its
// output reaches a softmax or an exp through ops that only carry it (a mask, a view) without one. The op it
// reaches, or "" when it is scaled (or reaches something else).
std::string unscaled_consumer(const OpRow& product, const RowInputs& in, std::span<const OpRow> ops) {
  for (const OpRow* q : {in.main, in.other})
    if (q != nullptr && op_has(q->op, OpFlag::scales)) return "";
  const OpRow* at = &product;
  for (int guard = 0; guard < 8; ++guard) {
    const OpRow* c = consumer_of(*at, ops);
    if (c == nullptr || op_has(c->op, OpFlag::scales)) return "";
    if (op_kind(c->op) == OpKind::softmax || op_has(c->op, OpFlag::exponential)) return c->op;
    if (!carries(op_kind(c->op))) return "";
    at = c;
  }
  return "";
}

// The dimension a product a @ b sums over: a's last, when b's row (before a transposing view) has it last or
// second to last; 0 when the shapes do not say.
std::int64_t inner_dimension(const OpRow& product, const SeqIndex& idx) {
  const OpRow* a = producer_of(product, 0, idx);
  const OpRow* b = producer_of(product, 1, idx);
  if (a == nullptr || b == nullptr) return 0;
  const std::vector<std::int64_t> da = dims_of(a->shape), db = dims_of(b->shape);
  if (da.empty() || db.size() < 2) return 0;
  return da.back() == db.back() || da.back() == db[db.size() - 2] ? da.back() : 0;
}

std::string gain_text(double g) { return fmt::format("{:.3g}x", g); }

// The evidence of the amplifier's link.
std::string amplifier_evidence(const Amplification& a, const SeqIndex& idx) {
  const OpRow& r = *a.op;
  const std::string values = a.overflowed ? fmt::format("absmax {} -> beyond {} (inf)", number(a.in_absmax), kF16Max)
                                          : fmt::format("absmax {} -> {}", number(a.in_absmax), number(a.out_absmax));
  const std::string larger = fmt::format("made |x| {}{} larger: {}", a.overflowed ? "at least " : "", gain_text(a.gain),
                                         values);
  switch (a.kind) {
    case Amplification::Kind::factor: {
      const bool divides = op_has(r.op, OpFlag::divides);
      std::string by;
      if (a.other != nullptr)
        by = fmt::format("the output of {} (absmax {})", place(*a.other), number(a.other->health.absmax));
      else if (a.other_marker == trace::kInputParameter)
        by = "a parameter";
      else
        by = "a constant";
      const std::string factor = a.overflowed ? "" : ", about " + about(divides ? 1 / a.gain : a.gain);
      return fmt::format("{}, a {} by {}{}, {}", where_text(r), divides ? "division" : "multiplication", by, factor,
                         larger);
    }
    case Amplification::Kind::product: {
      std::string text = fmt::format("{}, a product of {} (absmax {}) and {} (absmax {}), {}", where_text(r),
                                     place(*a.input), number(a.input->health.absmax), place(*a.other),
                                     number(a.other->health.absmax), larger);
      if (a.unscaled)
        text += a.inner > 0 ? fmt::format("; it sums {} terms and nothing scales them by 1/sqrt({}) = {:.3g} before {}",
                                          a.inner, a.inner, 1 / std::sqrt(static_cast<double>(a.inner)), a.consumer)
                            : fmt::format("; nothing scales it by 1/sqrt(d) before {}", a.consumer);
      return text;
    }
    case Amplification::Kind::weight:
      return fmt::format("{} {} (its weights: {}'s output grows with their size)", where_text(r), larger, r.op);
    case Amplification::Kind::other: break;
  }
  (void)idx;
  return fmt::format("{} {}", where_text(r), larger);
}

}  // namespace

std::optional<Amplification> amplification_walk(Diagnosis& d, const OpRow& origin, const SeqIndex& idx,
                                                std::span<const OpRow> ops) {
  if (origin.inputs[0] == trace::kInputUnknown || origin.phase != Phase::forward) return std::nullopt;
  const bool exp_origin = d.cause == "exp_overflow";
  if (!exp_origin && d.cause != "f16_overflow") return std::nullopt;
  Amplification a;
  a.limit = exp_origin ? exp_limit(origin.out_dtype) : kF16Max;
  // The origin amplified itself unless it is the exp (its overflow is the cause itself) or its input overflowed
  // on the cast to f16 (the values came from an op upstream, in f32).
  const OpRow* p = &origin;
  if (exp_origin || origin.cast_overflow > 0) {
    p = row_inputs(origin, idx).main;
    if (p != nullptr && exp_origin) a.reached = p->health.absmax;
  }
  // The ops from the origin upstream (origin first), and the most upstream amplifier among them.
  struct Visited {
    const OpRow* op;
    RowInputs in;
    double gain, in_absmax, out_absmax;
    bool overflowed;
  };
  std::vector<Visited> path;
  std::size_t root = 0;  // index in path + 1, 0 when none
  const double least = a.limit * std::ldexp(1.0, -10);
  for (int guard = 0; p != nullptr && guard < 32; ++guard) {
    const RowInputs in = row_inputs(*p, idx);
    if (in.main == nullptr) break;  // data or parameters only: what entered is not in the trace
    const Amplification::Kind kind = amplifier_kind(*p, in);
    const OpRow* through = in.main;
    if (kind == Amplification::Kind::product && in.other != nullptr && in.other->health.absmax > in.main->health.absmax)
      through = in.other;
    const double in_absmax = through->health.absmax;
    if (!(in_absmax > 0) || !std::isfinite(in_absmax)) break;
    const bool overflowed = p == &origin && non_finite(*p) > 0;
    const double out_absmax = overflowed ? std::max(p->health.absmax, kF16Max) : p->health.absmax;
    const double gain = out_absmax / in_absmax;
    path.push_back({p, in, gain, in_absmax, out_absmax, overflowed});
    const OpKind op_kind_ = op_kind(p->op);
    // A product of two activations is as large as its operands make it (x * x, q k^T): it amplifies only where
    // it lacks the scale it should have, a dot product nothing scales before the softmax or exp it feeds.
    const bool counts = kind != Amplification::Kind::product || !unscaled_consumer(*p, in, ops).empty();
    if (carries(op_kind_) || op_kind_ == OpKind::softmax) {
      if (gain >= kAmplifies) break;  // an operand the walk does not follow made the values larger
    } else if (counts && gain >= kAmplifies && out_absmax >= least) {
      root = path.size();
    }
    if (op_kind_ == OpKind::norm || op_kind_ == OpKind::softmax) break;
    p = through;
  }
  if (root == 0) return std::nullopt;

  const Visited& v = path[root - 1];
  a.op = v.op;
  a.kind = amplifier_kind(*v.op, v.in);
  a.input = v.in.main;
  a.other = v.in.other;
  if (a.kind == Amplification::Kind::product && a.other != nullptr && a.other->health.absmax > a.input->health.absmax)
    std::swap(a.input, a.other);
  if (a.kind == Amplification::Kind::factor && v.in.rows == 1) a.other_marker = v.in.other_marker;
  a.gain = v.gain;
  a.in_absmax = v.in_absmax;
  a.out_absmax = v.out_absmax;
  a.overflowed = v.overflowed;
  if (a.kind == Amplification::Kind::product) {
    a.consumer = unscaled_consumer(*v.op, v.in, ops);
    a.unscaled = !a.consumer.empty();
    if (op_kind(v.op->op) == OpKind::matmul) a.inner = inner_dimension(*v.op, idx);
  }
  // The amplifier computed in f32 cures the overflow when everything after it keeps f32 and f32 holds the
  // result: exp's f32 range ends at 88.7; an f16 overflow is far inside f32's.
  a.f32_path = !exp_origin || a.reached < exp_limit("f32");
  for (std::size_t i = 0; i + 1 < root; ++i) a.f32_path &= keeps_f32_input(path[i].op->autocast);
  if (exp_origin) a.f32_path &= keeps_f32_input(origin.autocast);

  std::vector<ChainLink> chain;  // root first
  ChainLink amplifier = link(*v.op, "amplification", amplifier_evidence(a, idx));
  amplifier.factor = a.gain;
  chain.push_back(std::move(amplifier));
  for (std::size_t i = root - 1; i-- > 0;) {
    const Visited& w = path[i];
    if (w.op == &origin) break;
    chain.push_back(link(*w.op, "passes on",
                         fmt::format("{} carries the values on (absmax {} -> {})", where_text(*w.op),
                                     number(w.in_absmax), number(w.out_absmax))));
  }
  if (a.op != &origin) {
    const std::string what =
        exp_origin ? fmt::format("exp of values up to {} overflows {} above {:.4g}", number(a.reached), origin.out_dtype,
                                 a.limit)
                   : fmt::format("its results passed {}'s largest value, {}", origin.out_dtype, kF16Max);
    chain.push_back(link(origin, "origin", fmt::format("{} returned {}: {}", where_text(origin),
                                                       counts_text(origin.health), what)));
  }
  d.root_cause = "amplification";
  d.chain = std::move(chain);
  return a;
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
