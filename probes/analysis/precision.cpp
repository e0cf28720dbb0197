// The PRECISION section and the rankings of the f32 twin's rows (probes/analysis/precision.h).
#include "probes/analysis/precision.h"
#include "probes/analysis/internal/reach.h"
#include "probes/analysis/op_traits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace ampscope::analysis {

using detail::f32_remedies;
using trace::PrecisionRow;

int significand_bits_of(std::string_view dtype) {
  if (dtype == "f16") return 11;
  if (dtype == "bf16") return 8;
  if (dtype == "f64") return 53;
  return 24;
}

namespace {
double unit_of(std::string_view dtype) { return std::ldexp(1.0, -significand_bits_of(dtype)); }
}  // namespace

std::string reference_of(const PrecisionRow& row) {
  if (row.out_dtype == "f64" || (row.out_dtype == "f32" && row.local)) return "f64";
  return "f32";
}

double precision_jump(const PrecisionRow& row) {
  return row.acc_mean_rel / std::max(row.in_acc_mean_rel, unit_of(row.out_dtype));
}

namespace {
bool backward(const PrecisionRow& r) { return r.phase == trace::Phase::backward; }
}  // namespace

std::vector<PrecisionRow> rank_by_jump(const std::vector<PrecisionRow>& rows) {
  std::map<std::pair<std::string, std::string>, PrecisionRow> best;
  for (const PrecisionRow& r : rows) {
    if (backward(r)) continue;
    auto [it, fresh] = best.emplace(std::make_pair(r.op, r.module), r);
    if (!fresh && precision_jump(r) > precision_jump(it->second)) it->second = r;
  }
  std::vector<PrecisionRow> out;
  for (auto& [key, r] : best) out.push_back(r);
  std::stable_sort(out.begin(), out.end(), [](const PrecisionRow& a, const PrecisionRow& b) {
    const double ja = precision_jump(a), jb = precision_jump(b);
    if (ja != jb) return ja > jb;
    return a.step != b.step ? a.step < b.step : a.seq < b.seq;
  });
  return out;
}

namespace {
// The rows of one phase, each (op, module) with its row of the largest local mean relative error.
std::vector<PrecisionRow> rank_local_of(const std::vector<PrecisionRow>& rows, bool backward_rows) {
  std::map<std::pair<std::string, std::string>, PrecisionRow> best;
  for (const PrecisionRow& r : rows) {
    if (!r.local || backward(r) != backward_rows) continue;
    auto [it, fresh] = best.emplace(std::make_pair(r.op, r.module), r);
    if (!fresh && r.local_mean_rel > it->second.local_mean_rel) it->second = r;
  }
  std::vector<PrecisionRow> out;
  for (auto& [key, r] : best) out.push_back(r);
  std::stable_sort(out.begin(), out.end(), [](const PrecisionRow& a, const PrecisionRow& b) {
    if (a.local_mean_rel != b.local_mean_rel) return a.local_mean_rel > b.local_mean_rel;
    return a.step != b.step ? a.step < b.step : a.seq < b.seq;
  });
  return out;
}
}  // namespace

std::vector<PrecisionRow> rank_by_local(const std::vector<PrecisionRow>& rows) { return rank_local_of(rows, false); }
std::vector<PrecisionRow> rank_backward(const std::vector<PrecisionRow>& rows) { return rank_local_of(rows, true); }

namespace {
// (op, module) -> step -> the largest acc_mean_rel of the step, floored at one rounding.
using Series = std::map<std::pair<std::string, std::string>, std::map<std::int64_t, double>>;

void add_to_series(Series& series, const PrecisionRow& r) {
  const double e = std::max(r.acc_mean_rel, unit_of(r.out_dtype));
  auto& per_step = series[{r.op, r.module}];
  const auto [it, fresh] = per_step.emplace(r.step, e);
  if (!fresh) it->second = std::max(it->second, e);
}

std::vector<PrecisionTrend> trends_of(const Series& series) {
  std::vector<PrecisionTrend> out;
  for (const auto& [key, per_step] : series) {
    if (per_step.size() < 2) continue;
    const double n = static_cast<double>(per_step.size());
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [step, err] : per_step) {
      const double x = static_cast<double>(step), y = std::log2(err);
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    PrecisionTrend t;
    t.op = key.first;
    t.module = key.second;
    t.steps = static_cast<std::int64_t>(per_step.size());
    t.bits_per_step = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    t.first = per_step.begin()->second;
    t.last = per_step.rbegin()->second;
    out.push_back(std::move(t));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const PrecisionTrend& a, const PrecisionTrend& b) { return a.bits_per_step > b.bits_per_step; });
  return out;
}
}  // namespace

std::vector<PrecisionTrend> precision_trends(const std::vector<PrecisionRow>& rows) {
  Series series;
  for (const PrecisionRow& r : rows) {
    if (!backward(r)) add_to_series(series, r);
  }
  return trends_of(series);
}

// ---- the PRECISION section ----

namespace {

constexpr std::size_t kListed = 5;        // entries per list
constexpr double kSignificant = 8;        // a jump of 3 bits beyond the inputs' error: remedies are proposed
constexpr double kCancelling = 8;         // cond from which an add/sub cancels
constexpr std::int64_t kLongChain = 8;    // calls of a chain from which it is an accumulation
constexpr double kGrowing = 0.05;         // bits per step from which a trend is listed

// What kind of op a row is (op_traits.h).
bool add_like(std::string_view op) { return op_kind(op) == OpKind::additive; }
bool reduction(std::string_view op) { return op_kind(op) == OpKind::reduction; }
bool saturating(std::string_view op) { return op_kind(op) == OpKind::saturating; }

std::string percent(double v) {
  if (!std::isfinite(v)) return fmt::format("{}", v);
  return fmt::format("{:.3g}%", 100 * v);
}
std::string g2(double v) { return fmt::format("{:.2g}", v); }

// A row and what the step's provenance says about it.
struct Scored {
  PrecisionRow row;
  double score = 0;             // max(chain jump, flip score)
  double in_error = 0;          // what entered it (a chain: its first call)
  double in_max_error = 0;
  std::int64_t calls = 1;       // calls in its chain
  std::vector<std::string> producers;
  std::vector<std::string> producer_dtypes;  // beside producers: each one's output dtype
  // Beside producers: each one's module and autocast reason; and the op's own reason (its /ops row): what an
  // f32 remedy can reach (internal/reach.h).
  std::vector<std::string> producer_modules, producer_autocast;
  std::string autocast;
  bool recorded = false;  // the op's /ops row was found
};

struct Chain {
  double in_error = 0, in_max_error = 0;
  std::int64_t calls = 1;
};

}  // namespace

struct PrecisionAnalyser::State {
  std::int64_t rows = 0;
  std::int64_t steps = 0;
  std::map<std::pair<std::string, std::string>, Scored> jump, local, cond;  // the best row per op of each list
  Series series;
  std::map<std::pair<std::string, std::string>, std::string> reference;  // each forward op's reference (the last row's)
  std::int64_t backward_rows = 0;
  std::map<std::pair<std::string, std::string>, PrecisionRow> backward;  // backward rows: the best per node's op
};

PrecisionAnalyser::PrecisionAnalyser() : state_(std::make_unique<State>()) {}
PrecisionAnalyser::~PrecisionAnalyser() = default;
PrecisionAnalyser::PrecisionAnalyser(PrecisionAnalyser&&) noexcept = default;
PrecisionAnalyser& PrecisionAnalyser::operator=(PrecisionAnalyser&&) noexcept = default;

void PrecisionAnalyser::add_step(std::int64_t, std::span<const trace::OpRow> ops, std::span<const PrecisionRow> rows) {
  State& st = *state_;
  if (rows.empty()) return;
  st.rows += static_cast<std::int64_t>(rows.size());
  ++st.steps;
  std::unordered_map<std::int64_t, const trace::OpRow*> op_of;
  for (const trace::OpRow& o : ops) {
    if (o.phase == trace::Phase::forward) op_of.emplace(o.seq, &o);
  }
  // Rows in seq order, so a chain's earlier calls are seen first.
  std::vector<const PrecisionRow*> ordered;
  for (const PrecisionRow& r : rows) {
    if (!backward(r)) {
      ordered.push_back(&r);
      continue;
    }
    // Backward rows (local error only) rank among themselves, by their local mean relative error.
    ++st.backward_rows;
    const auto [it, fresh] = st.backward.emplace(std::make_pair(r.op, r.module), r);
    if (!fresh && r.local_mean_rel > it->second.local_mean_rel) it->second = r;
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const PrecisionRow* a, const PrecisionRow* b) { return a->seq < b->seq; });
  std::unordered_map<std::int64_t, Chain> chain_of;  // seq -> its chain so far
  std::unordered_map<std::int64_t, const PrecisionRow*> row_of;
  for (const PrecisionRow* p : ordered) {
    const PrecisionRow& r = *p;
    row_of[r.seq] = p;
    Scored s;
    s.row = r;
    s.in_error = r.in_acc_mean_rel;
    s.in_max_error = r.in_acc_max_rel;
    Chain chain{r.in_acc_mean_rel, r.in_acc_max_rel, 1};
    bool inherited_flips = false;  // an input's producer already had outputs at a boundary: passed on, not new
    if (const auto o = op_of.find(r.seq); o != op_of.end()) {
      s.autocast = o->second->autocast;
      s.recorded = true;
      for (const std::int64_t in : o->second->inputs) {
        if (in < 0) continue;
        if (const auto producer = op_of.find(in); producer != op_of.end()) {
          s.producers.push_back(producer->second->op);
          s.producer_dtypes.push_back(producer->second->out_dtype);
          s.producer_modules.push_back(producer->second->module);
          s.producer_autocast.push_back(producer->second->autocast);
        }
        const auto earlier = row_of.find(in);
        // Outputs at 1 of a saturating producer are not this op's outputs at 0 (1 - s cancelling): only a
        // producer's flips at the same kind of boundary are passed on.
        if (earlier != row_of.end() && earlier->second->flips > 0 && !saturating(earlier->second->op)) inherited_flips = true;
        // A call fed by an earlier call of the same op in the same module continues that call's chain.
        if (earlier == row_of.end() || earlier->second->op != r.op || earlier->second->module != r.module) continue;
        const Chain& c = chain_of[in];
        if (c.calls + 1 > chain.calls) chain = Chain{c.in_error, c.in_max_error, c.calls + 1};
      }
    }
    chain_of[r.seq] = chain;
    const double unit = unit_of(r.out_dtype);
    s.calls = chain.calls;
    if (chain.calls > 1) {
      s.in_error = chain.in_error;
      s.in_max_error = chain.in_max_error;
    }
    const double jump = r.acc_mean_rel / std::max(s.in_error, unit);
    // Flips count for ops that ran in f16/bf16 (an f32 op's flips come from its inputs' error, which its jump
    // measures); a saturating op's outputs at 1 keep their own value to within a rounding, so they count half:
    // the op that subtracts them from 1, where the digits are lost, ranks above it.
    double flip_score = 0;
    if (r.local && r.numel > 0 && !inherited_flips) {
      flip_score = static_cast<double>(r.flips) / static_cast<double>(r.numel) / unit;
      if (saturating(r.op)) flip_score /= 2;
    }
    s.score = std::max(jump, flip_score);
    const auto key = std::make_pair(r.op, r.module);
    auto keep = [&](std::map<std::pair<std::string, std::string>, Scored>& list, double value, auto value_of) {
      const auto it = list.find(key);
      if (it == list.end()) {
        list.emplace(key, s).first->second.score = value;
      } else if (value > value_of(it->second)) {
        it->second = s;
        it->second.score = value;
      }
    };
    if (std::isfinite(s.score)) keep(st.jump, s.score, [](const Scored& x) { return x.score; });
    if (r.local) keep(st.local, r.local_mean_rel, [](const Scored& x) { return x.score; });
    if (std::isfinite(r.cond)) keep(st.cond, r.cond, [](const Scored& x) { return x.score; });
    add_to_series(st.series, r);
    st.reference[key] = reference_of(r);
  }
}

namespace {

// The producer to keep in f32 when a value was rounded before the op that exposes it: its index in
// s.producers (the first input with a producer that is not an add/sub is the likeliest; the report names the
// first), or -1 when there is none.
int first_producer_index(const Scored& s) {
  for (std::size_t i = 0; i < s.producers.size(); ++i) {
    if (!add_like(s.producers[i])) return static_cast<int>(i);
  }
  return s.producers.empty() ? -1 : 0;
}

bool low_precision_name(std::string_view dtype) { return dtype == "f16" || dtype == "bf16"; }

std::string place(const std::string& op, const std::string& module) {
  return module.empty() ? op : fmt::format("{} in {}", op, module);
}

PrecisionEntry entry_of(const Scored& s) {
  const PrecisionRow& r = s.row;
  PrecisionEntry e;
  e.op = r.op;
  e.module = r.module;
  e.out_dtype = r.out_dtype;
  e.reference = reference_of(r);
  e.step = r.step;
  e.seq = r.seq;
  e.score = s.score;
  e.calls = s.calls;
  e.in_error = s.in_error;
  e.in_max_error = s.in_max_error;
  e.error = r.acc_mean_rel;
  e.max_error = r.acc_max_rel;
  e.local_error = r.local_mean_rel;
  e.local_max_error = r.local_max_rel;
  e.bits = r.bits;
  e.cond = r.cond;
  e.flips = r.flips;
  e.numel = r.numel;
  e.producers = s.producers;
  e.producer_dtypes = s.producer_dtypes;
  return e;
}

// kind, evidence and remedies of an entry of the jump list.
void explain(PrecisionEntry& e, const Scored& s) {
  const std::string& op = e.op;
  const int at = first_producer_index(s);
  const std::string producer = at < 0 ? "" : s.producers[static_cast<std::size_t>(at)];
  // Whether the op and that producer ran in f16/bf16 (an autocast override can keep them in f32) or in f32
  // already (only an f64 twin, --twin-f64, sees an f32 op lose digits of its own: computing it in f64 is the
  // remedy, by hand).
  const bool op_low = low_precision_name(e.out_dtype);
  const bool producer_low = at >= 0 && low_precision_name(s.producer_dtypes[static_cast<std::size_t>(at)]);
  const std::string& ref = e.reference;
  const bool cancels = add_like(op) && std::isfinite(e.cond) && e.cond >= kCancelling;
  if (cancels) e.kind = "cancellation";
  else if (e.calls >= kLongChain) e.kind = "accumulation";
  else if (saturating(op) && e.flips > 0) e.kind = "saturation";
  else if (reduction(op)) e.kind = "reduction";
  else if (e.flips > 0) e.kind = "boundary";
  else e.kind = "rounding";

  std::string text;
  if (e.kind == "accumulation") {
    text = fmt::format("over a chain of {} calls, each fed by the one before, the error grew from {} entering the first to {} "
                       "(mean; max {}) leaving the worst",
                       e.calls, g2(e.in_error), percent(e.error), percent(e.max_error));
  } else {
    text = fmt::format("inputs agree with {} to {} (mean relative error; max {}), its output is {} off (max {})", ref,
                       g2(e.in_error), g2(e.in_max_error), percent(e.error), percent(e.max_error));
  }
  if (e.flips > 0) {
    const char* boundary = saturating(op) ? "exactly 1 in magnitude" : "0, inf or the largest finite value";
    text += fmt::format("; {} of {} outputs are {} where {}'s are not", e.flips, e.numel, boundary, ref);
  }
  if (e.kind == "cancellation") {
    text += fmt::format("; |a| + |b| is up to {} times |a {} b|: cancellation", g2(e.cond), op == "add" ? "+" : "-");
  } else if (e.kind == "reduction" && std::isfinite(e.cond)) {
    text += fmt::format("; sum |x| is up to {} times |sum x|", g2(e.cond));
  } else if (e.kind == "accumulation") {
    text += fmt::format(": a running {} in {} stops growing once the total dwarfs each term", op == "add" ? "sum" : op,
                        e.out_dtype);
  } else if (e.kind == "saturation") {
    text += ": saturation";
  }
  text += fmt::format(" (step {}, seq {})", e.step, e.seq);
  e.evidence = std::move(text);

  if (e.score < kSignificant) return;
  // An f32 op measured against f64 (--twin-f64) that only rounded (no cancellation, chain, saturation or boundary:
  // a long f32 dot product, whose outputs near zero lose digits to its accumulation) gets remedies only when it
  // lost more than f16 keeps (a mean error of 2^-11 or more): a few of f32's 24 bits lost in a matmul is what
  // f32 arithmetic is, not something to change.
  if (e.kind == "rounding" && e.reference == "f64" && !op_low && !(e.error >= std::ldexp(1.0, -11))) return;
  // The op itself (by its module, or by its name outside any module), or the producer of its first input (every
  // op of that name), computed in f32 by whatever reaches it (internal/reach.h): an autocast override, or, for
  // an op that ran outside autocast, a cast of its input.
  auto keep_f32 = [&](const std::string& why) {
    f32_remedies({.op = op, .module = e.module, .dtype = e.out_dtype, .autocast = s.autocast, .recorded = s.recorded}, why,
                 e.remedies,
                 /*every_block=*/false);
  };
  auto keep_producer_f32 = [&](const std::string& why) {
    const auto i = static_cast<std::size_t>(at);
    f32_remedies({.op = producer, .module = s.producer_modules[i], .dtype = s.producer_dtypes[i],
                  .autocast = s.producer_autocast[i], .by_op = true},
                 why, e.remedies, /*every_block=*/false);
  };
  auto code_only = [&](const char* kind, std::string text, std::string code) {
    Remedy m;
    m.kind = kind;
    m.text = std::move(text);
    m.code = std::move(code);
    e.remedies.push_back(std::move(m));
  };
  // An f32 op (and what feeds it unrounded) computed in f64, by hand: no autocast option widens f32.
  auto compute_f64 = [&](const std::string& what, const std::string& why) {
    code_only("compute_f64",
              fmt::format("compute {} in f64 and round to f32 once at the end: {}f32 keeps 24 significand bits, f64 53",
                          what, why.empty() ? "" : why + "; "),
              "Tensor y = f(x.to(DType::f64)).to(DType::f32);  // the ops between the casts run in f64");
  };
  // The op itself one dtype wider: in f32 when it ran in f16/bf16; an f32 op that lost the digits in its inputs
  // has its f16/bf16 producer kept in f32; an f32 op that lost them itself (an f64 twin's row) is computed in f64.
  auto keep_op_wider = [&](const std::string& why) {
    if (op_low) {
      keep_f32(why);
    } else if (producer_low) {
      keep_producer_f32(fmt::format("{} ran in {} already; its input came from {}, computed in {}", place(op, e.module),
                           e.out_dtype, producer, s.producer_dtypes[static_cast<std::size_t>(at)]));
    } else if (s.row.local) {
      compute_f64(place(op, e.module), "");
    }
  };
  if (e.kind == "cancellation") {
    if (producer == "sigmoid") {
      code_only("stable_formulation",
                "compute the loss from the logits: binary_cross_entropy_with_logits (log(sigmoid(z)) = logsigmoid(z), "
                "log(1 - sigmoid(z)) = logsigmoid(-z)) instead of sigmoid, then 1 - s: s rounds to 1 and 1 - s cancels",
                "Tensor loss = binary_cross_entropy_with_logits(logits, y);  // not log(1 - sigmoid(logits))");
    } else if (producer == "softmax") {
      code_only("stable_formulation", "use log_softmax (or cross_entropy on the logits) instead of subtracting from softmax's "
                                      "probabilities, which round to 1",
                "Tensor logp = log_softmax(logits, -1);");
    }
    if (producer_low) {
      // The value was rounded before the subtraction exposed it: its producer is what must run in f32.
      keep_producer_f32(
          fmt::format("its output feeds {} unrounded, so the nearly equal values keep their difference", place(op, e.module)));
    } else if (!producer.empty() && !op_low && s.row.local) {
      // Both ran in f32: the producer's output must reach the subtraction unrounded, so both run in f64.
      compute_f64(fmt::format("{} and {}", producer, place(op, e.module)),
                  fmt::format("{}'s output must reach the {} unrounded", producer, op));
    }
    code_only("reorder",
              "reorder the computation so that nearly equal values are not subtracted after rounding: subtract before "
              "the values are rounded (on the inputs of the ops that made them), or center them first",
              "// e.g. (x - y) * w instead of x * w - y * w");
  } else if (e.kind == "accumulation") {
    const char* wider = op_low ? "f32" : "f64";
    code_only(op_low ? "accumulate_f32" : "accumulate_f64",
              fmt::format("accumulate in {}: start the running total as an {} tensor{}; in {} each small term is rounded away once "
                          "the total is 2^{} times larger",
                          wider, wider, op_low ? " (or use sum(), which accumulates in f32)" : "", e.out_dtype,
                          significand_bits_of(e.out_dtype)),
              op_low ? "Tensor acc = zeros(shape, DType::f32);  for (...) acc = acc + x.to(DType::f32);"
                     : "Tensor acc = zeros(shape, DType::f64);  for (...) acc = acc + x.to(DType::f64);");
    code_only("reorder", "add the small terms together first (pairwise, or a sum over a stacked tensor), then add them to the total",
              "Tensor total = sum(stack(terms), 0);");
  } else if (e.kind == "saturation") {
    if (op == "sigmoid") {
      code_only("stable_formulation",
                "keep the logits: binary_cross_entropy_with_logits or logsigmoid on them instead of sigmoid's output, which "
                "rounds to exactly 1",
                "Tensor loss = binary_cross_entropy_with_logits(logits, y);");
    }
    keep_op_wider(fmt::format("{} keeps {}'s outputs below 1", op_low ? "f32" : "f64", op));
  } else if (e.kind == "reduction") {
    if (op_low) {
      code_only("accumulate_f32", "accumulate the reduction in f32: cast its input to f32 first (sum(x.to(DType::f32)))",
                "Tensor total = sum(x.to(DType::f32));");
      keep_op_wider("");
    } else if (s.row.local) {
      code_only("accumulate_f64", "accumulate the reduction in f64: cast its input to f64 first (sum(x.to(DType::f64)))",
                "Tensor total = sum(x.to(DType::f64)).to(DType::f32);");
    } else {
      keep_op_wider("");
    }
  } else {
    keep_op_wider("");
  }
}

std::vector<const Scored*> top(const std::map<std::pair<std::string, std::string>, Scored>& list) {
  std::vector<const Scored*> out;
  for (const auto& [key, s] : list) out.push_back(&s);
  std::stable_sort(out.begin(), out.end(), [](const Scored* a, const Scored* b) {
    if (a->score != b->score) return a->score > b->score;
    return a->row.step != b->row.step ? a->row.step < b->row.step : a->row.seq < b->row.seq;
  });
  if (out.size() > kListed) out.resize(kListed);
  return out;
}

}  // namespace

PrecisionSection PrecisionAnalyser::finish() const {
  const State& st = *state_;
  PrecisionSection sec;
  sec.rows = st.rows;
  sec.steps = st.steps;
  sec.ops = static_cast<std::int64_t>(st.series.size());
  for (const Scored* s : top(st.jump)) {
    PrecisionEntry e = entry_of(*s);
    explain(e, *s);
    sec.by_jump.push_back(std::move(e));
  }
  for (const Scored* s : top(st.local)) {
    PrecisionEntry e = entry_of(*s);
    e.kind = "rounding";
    e.evidence = fmt::format("its own rounding in {} costs {} (mean relative error; max {}, {} ulps) (step {}, seq {})",
                             e.out_dtype, g2(e.local_error), g2(e.local_max_error), g2(s->row.local_max_ulp), e.step, e.seq);
    sec.by_local.push_back(std::move(e));
  }
  sec.backward_rows = st.backward_rows;
  sec.backward_nodes = static_cast<std::int64_t>(st.backward.size());
  std::vector<const PrecisionRow*> nodes;
  for (const auto& [key, r] : st.backward) nodes.push_back(&r);
  std::stable_sort(nodes.begin(), nodes.end(), [](const PrecisionRow* a, const PrecisionRow* b) {
    if (a->local_mean_rel != b->local_mean_rel) return a->local_mean_rel > b->local_mean_rel;
    return a->step != b->step ? a->step < b->step : a->seq < b->seq;
  });
  for (const PrecisionRow* r : nodes) {
    if (sec.backward.size() == kListed) break;
    Scored scored;
    scored.row = *r;
    PrecisionEntry e = entry_of(scored);
    e.phase = "backward";
    e.kind = r->flips > 0 ? "boundary" : "rounding";
    e.score = r->local_mean_rel;
    e.error = r->local_mean_rel;  // a backward row has local errors only
    e.max_error = r->local_max_rel;
    std::string text = fmt::format("its own rounding in {} costs {} (mean relative error; max {}, {} ulps)", e.out_dtype,
                                   g2(r->local_mean_rel), g2(r->local_max_rel), g2(r->local_max_ulp));
    if (r->flips > 0) {
      text += fmt::format("; {} of {} gradient elements are 0, inf or the largest finite value where {}'s are not",
                          r->flips, r->numel, e.reference);
    }
    e.evidence = text + fmt::format(" (step {}, seq {})", e.step, e.seq);
    sec.backward.push_back(std::move(e));
  }
  for (const PrecisionTrend& t : trends_of(st.series)) {
    if (!(t.bits_per_step > kGrowing) || !(t.last > t.first)) continue;
    if (sec.by_trend.size() == kListed) break;
    PrecisionEntry e;
    e.op = t.op;
    e.module = t.module;
    e.kind = "growth";
    if (const auto it = st.reference.find({t.op, t.module}); it != st.reference.end()) e.reference = it->second;
    e.score = t.bits_per_step;
    e.bits_per_step = t.bits_per_step;
    e.steps = t.steps;
    e.first = t.first;
    e.last = t.last;
    e.error = t.last;
    e.evidence = fmt::format("its error grows by {:.2g} bits per step over {} twinned steps: {} on the first, {} on the last",
                             t.bits_per_step, t.steps, g2(t.first), g2(t.last));
    sec.by_trend.push_back(std::move(e));
  }
  for (const Scored* s : top(st.cond)) {
    PrecisionEntry e = entry_of(*s);
    e.kind = reduction(e.op) ? "reduction" : add_like(e.op) ? "cancellation" : "conditioning";
    e.evidence = reduction(e.op)
                     ? fmt::format("sum |x| is up to {} times |sum x|: its output's relative error is up to that many times "
                                   "its inputs' (step {}, seq {})",
                                   g2(e.cond), e.step, e.seq)
                     : fmt::format("|a| + |b| is up to {} times |a {} b|: its output's relative error is up to that many "
                                   "times its inputs' (step {}, seq {})",
                                   g2(e.cond), e.op == "add" ? "+" : "-", e.step, e.seq);
    sec.conditioning.push_back(std::move(e));
  }
  return sec;
}

}  // namespace ampscope::analysis
