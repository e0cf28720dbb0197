#include "probes/analysis/analysis.h"
#include "probes/analysis/op_traits.h"
#include "probes/analysis/optimizer.h"
#include "probes/analysis/precision.h"
#include "probes/analysis/updates.h"
#include "probes/analysis/scaler_calibration.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "probes/analysis/f16_ranges.h"

namespace ampscope::analysis {
namespace {

using trace::EventRow;
using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

// A mask's fill writes -inf on purpose (masked_fill, a causal mask): only its NaN and +inf are anomalies.
std::int64_t non_finite(const OpRow& r) {
  const std::int64_t neg = (r.phase == Phase::forward && op_has(r.op, OpFlag::mask_neg_inf)) ? 0 : r.health.neg_inf;
  return r.health.nan + r.health.pos_inf + neg;
}

std::string counts_text(const trace::TensorHealth& h) {
  std::vector<std::string> parts;
  if (h.nan > 0) parts.push_back(fmt::format("{} NaN", h.nan));
  if (h.pos_inf > 0) parts.push_back(fmt::format("{} +inf", h.pos_inf));
  if (h.neg_inf > 0) parts.push_back(fmt::format("{} -inf", h.neg_inf));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string place(const OpRow& r) {
  std::string s = r.phase == Phase::backward ? fmt::format("the backward of {}", r.op) : r.op;
  return r.module.empty() ? s + " (outside any module)" : fmt::format("{} in {}", s, r.module);
}

// A wildcard over numbered children ("blocks.0.attn" -> "blocks.*.attn") for the same layer in every block.
std::string wildcard(const std::string& module) {
  std::string out, part;
  bool changed = false;
  auto flush = [&] {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!out.empty()) out += '.';
    out += digits ? "*" : part;
    changed |= digits;
    part.clear();
  };
  for (char c : module) {
    if (c == '.') flush(); else part += c;
  }
  flush();
  return changed ? out : "";
}

std::string cause_of(const OpRow& r) {
  const auto& h = r.health;
  const bool inf = h.pos_inf + h.neg_inf > 0;
  if (op_has(r.op, OpFlag::logarithm) && (h.neg_inf > 0 || h.nan > 0)) return "log_of_zero";
  if (r.phase == Phase::backward) return "gradient_overflow";
  if (r.cast_overflow > 0) return "f16_overflow";
  if (op_has(r.op, OpFlag::exponential) && h.pos_inf > 0) return "exp_overflow";
  if (op_has(r.op, OpFlag::divides) && inf) return "division_by_zero";
  if (inf && r.out_dtype == "f16") return "f16_overflow";
  if (!inf && h.nan > 0) return "invalid_operation";
  return "unknown";
}

// ---- remedies ----

// An epsilon (or clamp bound) for an op of this dtype: 1e-4 in f16 (normal there: 1e-8 and 1e-5 are not),
// 1e-8 otherwise.
double safe_epsilon(const std::string& dtype) { return dtype == "f16" ? 1e-4 : 1e-8; }

std::string number(double v) { return fmt::format("{:.6g}", v); }

Remedy autocast_remedy(const std::string& module, const std::string& op, const std::string& why) {
  Remedy m;
  m.kind = "autocast_fp32";
  m.pattern_is_op = module.empty();
  m.pattern = m.pattern_is_op ? op : module;
  m.flag = fmt::format("--autocast-fp32 {}", autocast_pattern(m.pattern));
  m.code = fmt::format("AutocastOverrideGuard keep_f32({{.{} = \"{}\", .precision = Precision::f32}});  // around the "
                       "forward pass",
                       m.pattern_is_op ? "op" : "module", m.pattern);
  m.text = fmt::format("run {} in f32{}", m.pattern_is_op ? fmt::format("every {} op", op) : fmt::format("module {}", module),
                       why.empty() ? "" : ": " + why);
  return m;
}

Remedy every_block_remedy(const std::string& module) {
  const std::string wild = wildcard(module);
  if (wild.empty()) return {};
  Remedy m = autocast_remedy(wild, "", "the same layer in every block");
  return m;
}

Remedy bf16_remedy() {
  Remedy m;
  m.kind = "bf16";
  m.text = "train in bf16: the same exponent range as f32, so values beyond f16's range, too large or too small, "
           "stay representable (it has fewer significant bits than f16)";
  m.flag = "--precision bf16";
  m.code = "AutocastGuard autocast(DType::bf16);  // instead of DType::f16; bf16 needs no GradScaler";
  return m;
}

Remedy lr_remedy(double current) {
  Remedy m;
  m.kind = "learning_rate";
  const bool known = std::isfinite(current) && current > 0;
  m.value = known ? current / 10 : 0;
  m.text = known ? fmt::format("lower the learning rate (this run: {}; try {}) or add warm-up", number(current), number(m.value))
                 : "lower the learning rate or add warm-up";
  m.flag = known ? fmt::format("--lr {}", number(m.value)) : "--lr <smaller>";
  m.code = known ? fmt::format("opt.param_groups()[0].options.lr = {};", number(m.value))
                 : "opt.param_groups()[0].options.lr /= 10;";
  return m;
}

Remedy simple(const char* kind, std::string text, std::string flag, std::string code, double value = 0) {
  Remedy m;
  m.kind = kind;
  m.text = std::move(text);
  m.flag = std::move(flag);
  m.code = std::move(code);
  m.value = value;
  return m;
}

std::string dtype_words(const std::string& dtype) { return dtype.empty() ? "its dtype" : dtype; }

}  // namespace

std::string autocast_pattern(const std::string& module) { return "'" + module + "'"; }

Remedy detail::keep_f32_remedy(const std::string& module, const std::string& op, const std::string& why) {
  return autocast_remedy(module, op, why);
}

namespace {

// ---- remedies by cause ----
// Remedies for a diagnosis, best first (remedies_of, below): one function per cause, chosen from the table
// kRemediesByCause. Nothing dtype-specific for fp32 runs (no f32 override, no bf16); bf16 only for range
// problems; constants representable (and normal) in the dtype of the op they protect.

// What every cause's remedies are worded from: the run's precision, the op to keep in f32 and how it can be
// reached, and the epsilon or clamp bound that survives its dtype.
struct RemedyContext {
  const Diagnosis& d;
  const OpRow& r;
  bool from_mask = false;  // NaN from a mask's -inf (a fully masked row through softmax)
  bool low = false;        // an fp16 or bf16 run
  bool f16 = false;        // an fp16 run
  // An op outside any autocast region runs in its inputs' dtype: an autocast override cannot reach it, an
  // explicit cast can. The op to keep in f32 is the chain's root when there is one (where the rounding
  // happened), else the origin.
  bool outside_autocast = false;
  // An op called with an explicit dtype (softmax(x, dim, DType::f16)) runs as called under autocast: an
  // override cannot reach it either; the call's dtype argument can.
  bool dtype_given = false;
  std::string target_dtype, target_place, target_op;
  // Keep the root op in f32 when the chain names one (the op that saturated or underflowed), else the origin.
  std::string f32_module, f32_op;
  // The op whose output the chain starts from (the root), for wording.
  std::string root_op, dtype;
  double eps = 0;
  std::string eps_why;

  RemedyContext(const Diagnosis& diagnosis, const OpRow& row, const std::string& run_precision, bool mask)
      : d(diagnosis), r(row), from_mask(mask) {
    // Rows analysed without run info (hand-built traces): the op's own dtypes say what the run was.
    const std::string precision =
        !run_precision.empty() ? run_precision
        : (r.out_dtype == "f16" || r.in_dtypes.find("f16") != std::string::npos) &&
                r.in_dtypes.find("bf16") == std::string::npos
            ? "fp16"
        : (r.out_dtype == "bf16" || r.in_dtypes.find("bf16") != std::string::npos) ? "bf16"
                                                                                   : "fp32";
    low = precision == "fp16" || precision == "bf16";
    f16 = precision == "fp16";
    const ChainLink* root_link = d.chain.empty() ? nullptr : &d.chain.front();
    outside_autocast = (root_link ? root_link->autocast.empty() : d.autocast.empty()) && r.phase == Phase::forward;
    dtype_given = (root_link ? root_link->autocast : d.autocast).find("a dtype was given") != std::string::npos;
    target_dtype = root_link ? root_link->out_dtype : r.out_dtype;
    target_place = root_link ? (root_link->module.empty() ? root_link->op + " (outside any module)"
                                                          : fmt::format("{} in {}", root_link->op, root_link->module))
                             : place(r);
    target_op = root_link ? root_link->op : r.op;
    f32_module = root_link ? root_link->module : d.module;
    f32_op = root_link ? root_link->op : d.op;
    root_op = root_link ? root_link->op : "";
    dtype = root_link ? root_link->out_dtype : r.out_dtype;
    // In an fp16 run the value a clamp or an epsilon protects may be f16 wherever the op itself ran (a log runs
    // in f32 on autocast's cast of an f16 1 - s): a bound that survives f16 is right in every case.
    eps = safe_epsilon(f16 ? "f16" : dtype);
    eps_why = eps == 1e-4 ? " (1e-4 is a normal f16 value; 1e-8 rounds to 0 in f16 and 1e-5 is subnormal)" : "";
  }

  // Keeps the target op in f32, in low-precision runs only: by the call's dtype argument, by a cast of its
  // input (outside autocast), or by an autocast override (and the same override for every block).
  void keep_f32(std::vector<Remedy>& out, const std::string& why) const {
    if (!low) return;
    if (dtype_given && (target_dtype == "f16" || target_dtype == "bf16")) {
      out.push_back(simple("cast_f32",
                           fmt::format("{} was called with an explicit dtype, {}, which autocast respects (an "
                                       "override cannot reach it): ask for f32 in the call{}",
                                       target_place, target_dtype, why.empty() ? "" : " (" + why + ")"),
                           "", fmt::format("Tensor y = {}(x, dim, DType::f32);  // not the input's {}", target_op,
                                           target_dtype)));
      return;
    }
    if (outside_autocast && (target_dtype == "f16" || target_dtype == "bf16")) {
      Remedy m = simple("cast_f32",
                        fmt::format("{} ran outside autocast, in its inputs' {} (an autocast override cannot reach "
                                    "it): cast its input to f32 first{}",
                                    target_place, target_dtype, why.empty() ? "" : " (" + why + ")"),
                        "", fmt::format("Tensor x32 = x.to(DType::f32);  // then {}(x32, ...)", target_op));
      out.push_back(std::move(m));
      return;
    }
    out.push_back(autocast_remedy(f32_module, f32_op, why));
    Remedy every = every_block_remedy(f32_module);
    if (!every.kind.empty()) out.push_back(std::move(every));
  }
};

// A difference that cannot be negative went below 0 before a sqrt, rsqrt, log or pow (negative_walk): compute
// it without the cancellation.
void negative_difference_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  out.push_back(simple("stable_formulation",
                       "compute the variance from the deviations, var(x, dims, 0) or mean((x - m) * (x - m)), "
                       "not as E[x^2] - E[x]^2: that difference cancels, below 0, when the mean is large against "
                       "the spread",
                       "", "Tensor v = var(x, {0}, /*correction=*/0, /*keepdim=*/true);  // not mean(x * x) - m * m"));
  out.push_back(simple("clamp",
                       fmt::format("clamp the difference at 0 before the {} (a stopgap: it hides how wrong the "
                                   "difference is)",
                                   c.r.op),
                       "", "Tensor safe = clamp_min(v, 0.0);  // then sqrt(safe + eps)", 0.0));
  c.keep_f32(out, fmt::format("{} has 13 more significant bits, so the difference cancels later (a delay, not a cure)",
                              "f32"));
  // no bf16: a cancellation is a precision problem, which bf16 makes worse
}

// Zeros that a root-cause walk explained (a log of 0, a division by 0 or 0/0 from a saturation, a
// cancellation or an underflow upstream): a stable formulation where one is known, then a bound on the zeros.
void zeros_root_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  const Diagnosis& d = c.d;
  if (c.root_op == "sigmoid" && d.cause == "log_of_zero") {
    out.push_back(simple("stable_formulation",
                         "compute the loss from the logits, not from sigmoid's probabilities: "
                         "binary_cross_entropy_with_logits(z, y) never rounds a probability to 0 or 1",
                         "", "Tensor loss = binary_cross_entropy_with_logits(z, y);  // instead of s = sigmoid(z), "
                             "then log(s) and log(1 - s); or by hand: -mean(y * logsigmoid(z) + (1 - y) * "
                             "logsigmoid(-z))"));
  } else if (std::any_of(d.chain.begin(), d.chain.end(), [](const ChainLink& l) { return l.op == "softmax"; })) {
    out.push_back(simple("stable_formulation",
                         "use log_softmax (or cross_entropy on the logits) instead of log(softmax(x)): it never "
                         "takes the log of a probability that rounded to 0",
                         "", "Tensor logp = log_softmax(x, -1);  // instead of log(softmax(x, -1))"));
  }
  if (d.cause == "log_of_zero") {
    Remedy m = simple("clamp",
                      fmt::format("clamp the log's input away from 0: clamp(p, {}){} (a stopgap: the gradient is 0 "
                                  "where it clamps)",
                                  number(c.eps), c.eps_why),
                      "", fmt::format("Tensor safe = clamp_min(p, {});  // then log(safe)", number(c.eps)), c.eps);
    out.push_back(std::move(m));
  } else {
    out.push_back(simple("epsilon",
                         fmt::format("add an epsilon to the denominator that survives {}: {}{}", dtype_words(c.dtype),
                                     number(c.eps), c.eps_why),
                         "", fmt::format("Tensor denom = denominator + {};", number(c.eps)), c.eps));
  }
  if (c.low)
    c.keep_f32(out, d.root_cause == "saturation" || d.root_cause == "cancellation"
                        ? fmt::format("{} has more significant bits, so {} saturates later (a delay, not a cure)",
                                      "f32", c.root_op.empty() ? "the op" : c.root_op)
                        : "");
  // An underflow is a range problem: bf16 has f32's range. Saturation and cancellation are precision
  // problems, which bf16 (fewer significant bits than f16) makes worse.
  if (c.f16 && d.root_cause == "underflow") out.push_back(bf16_remedy());
}

void exp_overflow_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  out.push_back(simple("stable_formulation",
                       "subtract the row's max before exp (softmax, log_softmax and cross_entropy do it for you): "
                       "exp of a value above 11.09 overflows f16",
                       "", "Tensor e = exp(x - amax(x, {-1}, true));  // or softmax / log_softmax / cross_entropy"));
  c.keep_f32(out, "exp overflows f32 only above 88.7");
  if (c.f16) out.push_back(bf16_remedy());
}

// A division by zero with no root cause found; with one, the zeros' remedies.
void division_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  if (!c.d.root_cause.empty()) {
    zeros_root_remedies(c, out);
    return;
  }
  out.push_back(simple("epsilon",
                       fmt::format("add an epsilon to the denominator that survives {} ({}){}, or mask the zero "
                                   "entries",
                                   dtype_words(c.r.out_dtype), number(c.eps), c.eps_why),
                       "", fmt::format("Tensor denom = denominator + {};", number(c.eps)), c.eps));
  c.keep_f32(out, "");
}

// NaN from finite inputs: a difference cancelled below 0, zeros a walk explained, a mask's -inf, or an
// extreme value in a mask.
void invalid_operation_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  const Diagnosis& d = c.d;
  if (d.root_cause == "cancellation" && !d.chain.empty() && op_has(c.r.op, OpFlag::nan_below_zero)) {
    negative_difference_remedies(c, out);
  } else if (!d.root_cause.empty()) {
    zeros_root_remedies(c, out);
  } else if (c.from_mask) {
    // 0 / 0 of a row the mask filled with -inf: the same in every dtype, so no f32 or bf16 remedy.
    out.push_back(simple("finite_mask",
                         "fill the mask with a large finite negative value instead of -inf (a row that is masked "
                         "everywhere then gets a uniform softmax instead of 0 / 0), or drop fully masked rows",
                         "", "Tensor masked = masked_fill(scores, mask, -1e4);  // not -inf: finite in f16 too"));
  } else {
    out.push_back(simple("finite_mask",
                         "mask with a finite value rather than the dtype's extreme (inf - inf and 0 * inf give NaN)",
                         "", "Tensor masked = masked_fill(scores, mask, -1e4);  // not -inf, not the dtype's minimum"));
    c.keep_f32(out, "");
    // no bf16: a NaN from finite inputs is not shown to be a range problem (bf16 has fewer bits)
  }
}

void f16_overflow_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  const OpRow& r = c.r;
  c.keep_f32(out, r.cast_overflow > 0 ? "the cast to f16 is what overflows" : "f32's range ends at 3.4e38");
  if (c.f16) out.push_back(bf16_remedy());
  if (r.cast_overflow > 0)
    out.push_back(simple("rescale_input",
                         fmt::format("rescale what feeds {}: standardise the data or activations{}", place(r),
                                     op_kind(r.op) == OpKind::softmax
                                         ? "; with an additive mask, mask with a value that stays within f16 once "
                                           "the terms are summed, not the dtype's minimum"
                                         : ""),
                         "", ""));
}

void gradient_overflow_remedies(const RemedyContext&, std::vector<Remedy>& out) {
  out.push_back(simple("init_scale",
                       "lower the GradScaler's initial scale; an occasional overflow that the scaler skips and "
                       "backs off is normal, a persistent one means the loss or the learning rate is too large",
                       "--init-scale 1024", "GradScaler scaler({.init_scale = 1024});", 1024));
}

Remedy zero_grad_remedy() {
  return simple("zero_grad",
                "clear gradients every step (optimizer.zero_grad()), or every accumulation window when "
                "accumulating on purpose",
                "", "opt.zero_grad();  // at the start of every step");
}

void accumulating_gradients_remedies(const RemedyContext&, std::vector<Remedy>& out) {
  out.push_back(zero_grad_remedy());
}

void nonfinite_input_remedies(const RemedyContext&, std::vector<Remedy>& out) {
  out.push_back(simple("clean_data", "check the data: the batch already held NaN or inf before the first op "
                                     "(filter or clean it)",
                       "", "if (!isfinite(batch)) skip it  // e.g. count NaN/inf with the probe's statistics"));
}

// Any other cause: in a low-precision run, whether it is the precision's at all.
void compare_fp32_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  if (c.low)
    out.push_back(simple("compare_fp32", "compare with an fp32 run of the same seed to see whether the failure is the "
                                         "precision's",
                         "--precision fp32", "// run the same loop without AutocastGuard and GradScaler"));
}

using RemedyFn = void (*)(const RemedyContext&, std::vector<Remedy>&);
struct CauseRemedies {
  std::string_view cause;
  RemedyFn add;
};
// The causes of cause_of() and the rules, each with its remedies; any other cause gets compare_fp32_remedies.
constexpr CauseRemedies kRemediesByCause[] = {
    {"log_of_zero", zeros_root_remedies},
    {"division_by_zero", division_remedies},
    {"invalid_operation", invalid_operation_remedies},
    {"exp_overflow", exp_overflow_remedies},
    {"f16_overflow", f16_overflow_remedies},
    {"gradient_overflow", gradient_overflow_remedies},
    {"accumulating_gradients", accumulating_gradients_remedies},
    {"nonfinite_input", nonfinite_input_remedies},
};

// Remedies for a diagnosis of row r, best first.
std::vector<Remedy> remedies_of(const Diagnosis& d, const OpRow& r, const std::string& run_precision,
                                bool from_mask = false) {
  const RemedyContext context(d, r, run_precision, from_mask);
  RemedyFn add = compare_fp32_remedies;
  for (const CauseRemedies& c : kRemediesByCause)
    if (c.cause == d.cause) add = c.add;
  std::vector<Remedy> out;
  add(context, out);
  return out;
}

std::string remedy_text(const std::vector<Remedy>& remedies) {
  std::vector<std::string> parts;
  for (const Remedy& m : remedies) {
    std::string t = m.text;
    if (!m.flag.empty()) t += fmt::format(" ({})", m.flag);
    parts.push_back(std::move(t));
  }
  return fmt::format("{}", fmt::join(parts, "; or "));
}

// ---- dataflow provenance ----

// The rows of one step by seq.
using SeqIndex = std::unordered_map<std::int64_t, const OpRow*>;

const OpRow* producer_of(const OpRow& r, std::size_t i, const SeqIndex& idx) {
  if (i >= r.inputs.size() || r.inputs[i] < 0) return nullptr;
  auto it = idx.find(r.inputs[i]);
  return it == idx.end() ? nullptr : it->second;
}

std::size_t tensor_inputs(const OpRow& r) {
  std::size_t n = 0;
  for (std::int64_t v : r.inputs) n += v != trace::kInputNone ? 1 : 0;
  return n;
}

std::string where_text(const OpRow& r) {
  return fmt::format("{} ({} {}, seq {})", place(r), r.out_dtype, r.shape, r.seq);
}

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

struct Key {
  std::string op, module, cause;
  Phase phase;
  bool operator<(const Key& o) const {
    return std::tie(op, module, cause, phase) < std::tie(o.op, o.module, o.cause, o.phase);
  }
};

struct WarningKey {
  std::string kind, module, op, tensor;
  Phase phase;
  bool operator<(const WarningKey& o) const {
    return std::tie(kind, module, op, tensor, phase) < std::tie(o.kind, o.module, o.op, o.tensor, o.phase);
  }
};

// What the rules need to remember of a step once its rows are gone.
struct StepFacts {
  bool has_ops = false;
  bool nonfinite = false;  // some op output held NaN/inf (masked_fill's -inf aside)
  bool origin = false;
  int grad_state = -1;     // -1 no gradient rows, 1 every gradient exactly zero, 0 otherwise
};

// The growth interval the run's config names ("growth_interval": N in the JSON text), 2000 otherwise.
std::int64_t growth_interval_of(const trace::RunInfo& run) {
  const std::string key = "\"growth_interval\"";
  const auto at = run.config.find(key);
  if (at == std::string::npos) return 2000;
  std::size_t i = run.config.find(':', at + key.size());
  if (i == std::string::npos) return 2000;
  ++i;
  while (i < run.config.size() && run.config[i] == ' ') ++i;
  std::int64_t v = 0;
  bool any = false;
  while (i < run.config.size() && run.config[i] >= '0' && run.config[i] <= '9') {
    v = v * 10 + (run.config[i++] - '0');
    any = true;
  }
  return any && v > 0 ? v : 2000;
}

// Whether the run was an evaluation (`ampscope train --eval` writes "eval":true in its config): forward
// passes only, so no gradients and no scaler.
bool is_evaluation(const trace::RunInfo& run) { return run.config.find("\"eval\":true") != std::string::npos; }

bool is_low(const std::string& dtype) { return dtype == "f16" || dtype == "bf16"; }

// A warning about the output of op row r.
HeadroomWarning warning_at(const char* kind, const OpRow& r) {
  HeadroomWarning w;
  w.kind = kind;
  w.step = r.step;
  w.seq = r.seq;
  w.phase = r.phase;
  w.module = r.module;
  w.op = r.op;
  w.tensor = "output";
  w.dtype = r.out_dtype;
  return w;
}

std::string fraction_text(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

}  // namespace

namespace {

std::string globs_text(const std::vector<std::string>& globs) {
  std::vector<std::string> q;
  for (const std::string& g : globs) q.push_back("'" + g + "'");
  return fmt::format("{}", fmt::join(q, ", "));
}

// What the probe's set-up (the root attribute `probe`) may have hidden, as notes and as evidence on the
// diagnoses it concerns.
void coverage(Report& rep, const std::set<std::string>& overrides_applied) {
  Coverage& c = rep.coverage;
  if (rep.steps == 0)
    c.notes.push_back("the trace holds no step: a probe records ops only inside a probe::StepScope (an op outside "
                      "any step is recorded only with ProbeOptions::outside_steps)");
  if (rep.run.probe.empty()) {
    if (!rep.anomalies.empty())
      c.notes.push_back("this trace does not say how the probe was set up (an older trace, or a writer given no "
                        "probe description): if it filtered ops or sampled steps, the origin may be in an op it did "
                        "not record");
    return;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(rep.run.probe);
    c.level = j.value("level", "");
    c.ops = j.value("ops", std::vector<std::string>{});
    c.modules = j.value("modules", std::vector<std::string>{});
    c.every = j.value("every", std::int64_t{1});
    c.flight_recorder = j.value("flight_recorder", false);
    std::set<std::string> unmatched;
    for (const auto& o : j.value("autocast_overrides", nlohmann::json::array())) {
      const std::string op = o.value("op", ""), module = o.value("module", ""), to = o.value("precision", "f32");
      for (const std::string& g : {op, module})
        if (!g.empty() && overrides_applied.count(g) == 0) unmatched.insert(g);
      c.autocast_overrides.push_back(!op.empty() && !module.empty()
                                         ? fmt::format("op '{}' in module '{}' -> {}", op, module, to)
                                         : !op.empty() ? fmt::format("op '{}' -> {}", op, to)
                                                       : fmt::format("module '{}' -> {}", module, to));
    }
    // ampscope train installs each --autocast-fp32 glob twice (as an op glob and as a module glob): a glob
    // is unmatched when neither decided an op's dtype.
    for (const std::string& g : overrides_applied) unmatched.erase(g);
    for (const std::string& g : unmatched)
      c.notes.push_back(fmt::format("the autocast override '{}' decided no recorded op's dtype: a typo, or a pattern that "
                                    "names neither an op nor the module path an op runs in (a module's own ops run "
                                    "in its path, its children's in theirs)",
                                    g));
    c.known = true;
  } catch (const std::exception& e) {
    c.notes.push_back(fmt::format("the trace's probe description is not valid JSON ({}): what the probe recorded "
                                  "is unknown",
                                  e.what()));
    return;
  }
  const bool filtered = !c.ops.empty() || !c.modules.empty();
  if (filtered) {
    std::vector<std::string> what;
    if (!c.ops.empty()) what.push_back("ops " + globs_text(c.ops));
    if (!c.modules.empty()) what.push_back("modules " + globs_text(c.modules));
    c.notes.push_back(fmt::format("the probe recorded only {}: an origin in any other op is invisible here, and "
                                  "the first anomaly recorded may be downstream of it; record every op to be sure",
                                  fmt::join(what, " in ")));
  }
  if (c.every > 1)
    c.notes.push_back(fmt::format("ops were recorded every {} steps{}: an origin in another step is seen only if "
                                  "its step was kept",
                                  c.every, c.flight_recorder ? " (the flight recorder also kept anomalous steps and "
                                                               "the steps before them)"
                                                             : ""));
  if (c.level == "off" || c.level == "dtype")
    c.notes.push_back(fmt::format("probe level {}: no statistics, so no NaN/inf can be found in ops", c.level));
  if (!filtered) return;
  for (Diagnosis& d : rep.anomalies) {
    if (d.op.empty() || d.cause == "nonfinite_input") {
      const bool has = std::any_of(d.remedies.begin(), d.remedies.end(),
                                   [](const Remedy& m) { return m.kind == "record_every_op"; });
      if (has) continue;
      d.evidence.push_back("the probe did not record every op (see the coverage notes): the true origin may be "
                           "an op it never saw");
      d.remedies.insert(d.remedies.begin(),
                        simple("record_every_op",
                               "first record every op (no op or module filter) and run again to find the origin; "
                               "the remedies after this one answer what this trace shows, which may be downstream",
                               "", "probe::ProbeOptions options;  // no .ops / .modules filter"));
      d.remedy = remedy_text(d.remedies);
    }
  }
}

}  // namespace

namespace {

// ---- provenance: the root-cause walks and silent damage ----

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


// ---- scaler health ----

// The scaler's verdict on the run (ScalerHealth::verdict and message), from the counts scaler_health() made;
// longest_clean: the longest run of unskipped steps.
void judge_scaler(ScalerHealth& sh, const std::vector<StepRow>& steps, const trace::RunInfo& run_info,
                  std::int64_t longest_clean) {
  // The settle window: the first max(20, 10%) steps, where a too-high initial scale backs off.
  const std::int64_t n = sh.steps;
  const std::int64_t window = std::max<std::int64_t>(20, n / 10);
  std::int64_t late_steps = 0, late_skips = 0, late_run = 0, late_longest = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (static_cast<std::int64_t>(i) < window) continue;
    ++late_steps;
    if (steps[i].skipped) {
      ++late_skips;
      late_longest = std::max(late_longest, ++late_run);
    } else {
      late_run = 0;
    }
  }
  const std::int64_t interval = growth_interval_of(run_info);
  const std::string trajectory = fmt::format("scale {} -> {} (min {}, max {})", sh.scale_start, sh.scale_end,
                                             sh.scale_min, sh.scale_max);
  const std::string skips = fmt::format("{} of {} steps skipped ({}), longest run {}", sh.skipped, n,
                                        fraction_text(sh.skip_rate), sh.longest_skip_run);
  if (!sh.used && is_evaluation(run_info)) {
    sh.verdict = "no_scaler";
    sh.message = "an evaluation run (--eval): forward passes only, no gradients to scale";
  } else if (!sh.used) {
    sh.verdict = "no_scaler";
    sh.message = "the scale is 1 at every step: no loss scaling (fine in fp32 and bf16; fp16 gradients can "
                 "underflow without it)";
  } else if (sh.scale_min < 1) {
    sh.verdict = "collapsed";
    sh.message = fmt::format("the scale collapsed below 1: {}; {}. Backing off cannot fix an overflow that "
                             "comes back every step",
                             trajectory, skips);
  } else if ((late_steps > 0 && (static_cast<double>(late_skips) > 0.05 * static_cast<double>(late_steps) ||
                                 late_longest > 5)) ||
             (late_steps == 0 && (sh.longest_skip_run > 5 || sh.skip_rate > 0.5))) {
    sh.verdict = "persistent";
    sh.message = fmt::format("skipping persists: {}; {}. An overflow keeps coming back", skips, trajectory);
  } else if (sh.growths == 0 && n > interval) {
    sh.verdict = "never_grows";
    sh.message = fmt::format("the scale never grew in {} steps (growth interval {}; longest run of unskipped "
                             "steps {}): {}; {}",
                             n, interval, longest_clean, trajectory,
                             longest_clean < interval ? "skips keep resetting the growth tracker"
                                                      : "a clean run long enough to grow did not");
  } else if (sh.skipped > 0 && late_skips == 0 && late_steps > 0) {
    sh.verdict = "settled";
    sh.message = fmt::format("{} early skip{} while the scale backed off from {} (normal), none after step {}; {}",
                             sh.skipped, sh.skipped == 1 ? "" : "s", sh.scale_start, sh.last_skip, trajectory);
  } else {
    sh.verdict = "healthy";
    sh.message = sh.skipped == 0 ? fmt::format("no step skipped; {}", trajectory)
                                 : fmt::format("occasional skips: {}; {}", skips, trajectory);
  }
}

// What the GradScaler did over the run (/steps): its growths, backoffs and skips, the longest run of skips,
// the range of the scale, and the verdict.
ScalerHealth scaler_health(const std::vector<StepRow>& steps, const trace::RunInfo& run_info) {
  ScalerHealth sh;
  sh.steps = static_cast<std::int64_t>(steps.size());
  std::int64_t run = 0, clean_run = 0, longest_clean = 0;
  for (const StepRow& s : steps) {
    if (s.scale != 1 || s.scale_after != 1) sh.used = true;
    if (s.scale_after > s.scale) ++sh.growths;
    if (s.scale_after < s.scale) ++sh.backoffs;
    if (s.skipped) {
      ++sh.skipped;
      if (sh.first_skip < 0) sh.first_skip = s.step;
      sh.last_skip = s.step;
      sh.longest_skip_run = std::max(sh.longest_skip_run, ++run);
      clean_run = 0;
    } else {
      run = 0;
      longest_clean = std::max(longest_clean, ++clean_run);
    }
  }
  if (!steps.empty()) {
    sh.skip_rate = static_cast<double>(sh.skipped) / static_cast<double>(steps.size());
    sh.scale_start = steps.front().scale;
    sh.scale_end = steps.back().scale_after;
    sh.scale_min = sh.scale_max = sh.scale_start;
    for (const StepRow& s : steps) {
      sh.scale_min = std::min({sh.scale_min, s.scale, s.scale_after});
      sh.scale_max = std::max({sh.scale_max, s.scale, s.scale_after});
    }
  }
  judge_scaler(sh, steps, run_info, longest_clean);
  return sh;
}

// Skipped steps from `step` on.
std::int64_t skipped_from(const std::vector<StepRow>& steps, std::int64_t step) {
  std::int64_t n = 0;
  for (const StepRow& s : steps) n += (s.step >= step && s.skipped) ? 1 : 0;
  return n;
}

// ---- what the analyser remembers across steps ----

// The forward ops of the last few steps (absmax of their finite outputs), for "the values grew" evidence.
struct RecentOutputs {
  struct Seen {
    std::string module, op;
    double absmax;
  };
  static constexpr std::size_t kRecentSteps = 4;
  std::deque<std::pair<std::int64_t, std::vector<Seen>>> recent;

  // The absmax of the k-th (module, op) forward row in each recent step where it was finite.
  std::vector<std::pair<std::int64_t, double>> history(const OpRow& r, std::span<const OpRow> ops) const {
    std::int64_t k = 0;
    for (const OpRow& o : ops)
      if (&o != &r && o.seq < r.seq && o.phase == r.phase && o.op == r.op && o.module == r.module) ++k;
    std::vector<std::pair<std::int64_t, double>> out;
    for (const auto& [step, seen] : recent) {
      std::int64_t i = 0;
      for (const Seen& x : seen) {
        if (x.op != r.op || x.module != r.module) continue;
        if (i++ == k) {
          if (std::isfinite(x.absmax)) out.emplace_back(step, x.absmax);
          break;
        }
      }
    }
    return out;
  }

  void remember(std::int64_t step, std::span<const OpRow> ops) {
    std::vector<Seen> seen;
    seen.reserve(ops.size());
    for (const OpRow& o : ops)
      if (o.phase == Phase::forward)
        seen.push_back({o.module, o.op, non_finite(o) == 0 ? o.health.absmax : std::nan("")});
    recent.emplace_back(step, std::move(seen));
    if (recent.size() > kRecentSteps) recent.pop_front();
  }
};

// The later steps that were non-finite from their first op, with no origin of their own.
struct LaterSteps {
  std::int64_t later_steps = 0, first_later = -1, last_later = -1;
  std::string first_op;    // the first non-finite op of the first later step
  void note(std::int64_t step, std::span<const OpRow> ops) {
    if (first_later < 0) {
      const OpRow* first = nullptr;
      for (const OpRow& o : ops)
        if (non_finite(o) > 0 && (first == nullptr || o.seq < first->seq)) first = &o;
      first_later = step;
      if (first != nullptr) first_op = place(*first);
    }
    ++later_steps;
    last_later = step;
  }
};

}  // namespace

struct Analyser::State {
  PrecisionAnalyser precision;
  AnalysisOptions options;
  Report rep;
  bool finished = false;
  std::int64_t last_step = std::numeric_limits<std::int64_t>::min();

  // What the steps so far left behind.
  std::vector<StepRow> steps;
  std::map<std::int64_t, StepFacts> facts;
  std::map<std::int64_t, double> lr_of;
  std::set<std::string> params;                // every parameter with a gradient row
  std::set<std::string> overrides_applied;     // globs of autocast overrides that decided some op's dtype
  bool any_nonfinite = false;
  RecentOutputs recent;

  // Diagnoses and warnings by key, to count a recurrence on the first one (add, warn).
  std::map<Key, std::size_t> index;
  std::map<WarningKey, std::size_t> warning_index;

  // A step that was not skipped although its gradients were non-finite (no scaler to catch them): the
  // optimizer wrote NaN/inf into the weights, so later steps are non-finite from their first op without any
  // origin. Those steps follow from the diagnosis of that step; they are not non-finite input data.
  struct Applied : LaterSteps {
    std::int64_t step = -1;  // the first such step, -1 when none
    double scale = 1;
  } applied;

  // Parameters the optimizer itself turned NaN/inf (analysis_optimizer.h): later steps that are non-finite from
  // their first op follow from that diagnosis (the weights hold NaN/inf), not from the data.
  struct OptimizerWrote : LaterSteps {
    std::int64_t step = -1;  // the first step with such a diagnosis, -1 when none
  } optimizer_wrote;

  // Diagnoses of skipped steps that may be the scaler calibrating (forward and loss finite, only
  // gradients overflowed): decided in finish(), when the later steps are known.
  std::map<std::int64_t, std::vector<Diagnosis>> pending_calibration;

  // Adds a diagnosis or counts a recurrence of one already seen.
  void add(Diagnosis d, std::int64_t step, bool* was_new = nullptr);
  bool seen(const Diagnosis& d) const { return index.count(Key{d.op, d.module, d.cause, d.phase}) > 0; }
  // Adds a warning or counts a recurrence of one already seen.
  void warn(HeadroomWarning w);

  // ---- add_step(): the rules of one step ----

  // One diagnosis per origin row of a step (or a recurrence of one seen before): its cause, evidence, root-cause
  // chain, propagation, silent damage and remedies. Backward origins of a step that may be the scaler
  // calibrating wait in pending_calibration.
  void origins(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row, std::span<const GradRow> grads,
               std::span<const EventRow> events, const SeqIndex& idx);
  // Propagation within the step: later non-finite ops, the loss, the gradients.
  void propagation(Diagnosis& d, std::span<const OpRow> ops, const OpRow* origin, const StepRow* step_row,
                   std::span<const GradRow> grads) const;
  // An output that was finite in the steps before and grew past f16's range: the weights grew, so the
  // learning rate is the first suspect (a jump in one step: far too high; a steady climb: too high for f16).
  void grown(Diagnosis& d, const OpRow& r, std::span<const OpRow> ops);
  // Non-finite forward outputs in a step without origin: the data were non-finite before the first op.
  void nonfinite_input(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
                       std::span<const GradRow> grads);
  // Warnings about values near f16's limits: outputs near its largest value, subnormal outputs, values a cast
  // flushed to zero, and (at level full) values below its smallest subnormal.
  void headroom(std::span<const OpRow> ops, std::span<const GradRow> grads, std::span<const trace::HistogramRow> hists);

  // ---- finish(): what the whole run shows, in the order finish() runs it (after scaler_health()) ----
  void decide_calibration();
  std::vector<std::int64_t> stale_steps() const;
  void propagation_over_steps();
  void later_steps_evidence();
  void gradient_underflow();
  void scale_collapse();
};

// ---- the rules of one step (Analyser::add_step) ----

void Analyser::State::add(Diagnosis d, std::int64_t step, bool* was_new) {
  Key k{d.op, d.module, d.cause, d.phase};
  auto found = index.find(k);
  if (found != index.end()) {
    Diagnosis& first = rep.anomalies[found->second];
    if (step != first.last_step) ++first.occurrences;
    first.last_step = std::max(first.last_step, step);
    if (was_new) *was_new = false;
    return;
  }
  d.last_step = step;
  index.emplace(k, rep.anomalies.size());
  rep.anomalies.push_back(std::move(d));
  if (was_new) *was_new = true;
}

void Analyser::State::warn(HeadroomWarning w) {
  WarningKey k{w.kind, w.module, w.op, w.tensor, w.phase};
  auto found = warning_index.find(k);
  if (found != warning_index.end()) {
    HeadroomWarning& first = rep.warnings[found->second];
    if (w.step != first.last_step) ++first.occurrences;
    first.last_step = std::max(first.last_step, w.step);
    return;
  }
  w.last_step = w.step;
  warning_index.emplace(k, rep.warnings.size());
  rep.warnings.push_back(std::move(w));
}

void Analyser::State::propagation(Diagnosis& d, std::span<const OpRow> ops, const OpRow* origin,
                                  const StepRow* step_row, std::span<const GradRow> grads) const {
  for (const OpRow& o : ops) {
    if (origin != nullptr && o.seq <= origin->seq) continue;
    if (&o != origin && !o.origin && non_finite(o) > 0) ++d.downstream_nonfinite;
  }
  d.loss_nonfinite = step_row != nullptr && !std::isfinite(step_row->loss);
  std::set<std::string> seen_params;
  for (const GradRow& g : grads)
    if (g.nan + g.pos_inf + g.neg_inf > 0 && seen_params.insert(g.param).second) d.gradients.push_back(g.param);
}

void Analyser::State::origins(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
                              std::span<const GradRow> grads, std::span<const EventRow> events, const SeqIndex& idx) {
  // A skipped step whose forward pass and loss are finite: its backward origins may be calibration.
  bool forward_finite = true;
  for (const OpRow& r : ops) forward_finite &= r.phase != Phase::forward || non_finite(r) == 0;
  const bool maybe_calibration = step_row != nullptr && step_row->skipped && std::isfinite(step_row->loss) &&
                                 forward_finite && step_row->scale != 1.0;
  bool damage_told = false;
  for (const OpRow& r : ops) {
    if (!r.origin) continue;
    Diagnosis d;
    d.step = r.step;
    d.seq = r.seq;
    d.phase = r.phase;
    d.module = r.module;
    d.op = r.op;
    d.in_dtypes = r.in_dtypes;
    d.out_dtype = r.out_dtype;
    d.autocast = r.autocast;
    d.cause = cause_of(r);
    const bool deferred = maybe_calibration && r.phase == Phase::backward;
    if (!deferred && seen(d)) {
      add(std::move(d), step);
      continue;
    }
    const auto& h = r.health;
    if (non_finite(r) > 0)
      d.evidence.push_back(fmt::format("{} of {} values in the {} {} output of {} at step {} (inputs finite)",
                                       counts_text(h), h.numel, r.out_dtype, r.shape, place(r), r.step));
    else  // the row's statistics are those of the first output; another output (a weight's gradient) held them
      d.evidence.push_back(fmt::format("non-finite values in an output of {} at step {} other than its first "
                                       "({} {}), from finite inputs",
                                       place(r), r.step, r.out_dtype, r.shape));
    if (r.cast_overflow > 0)
      d.evidence.push_back(fmt::format("{} finite value{} overflowed on the cast to {} (largest finite f16 {})",
                                       r.cast_overflow, r.cast_overflow == 1 ? "" : "s", r.out_dtype, kF16Max));
    // With a cast overflow the inf entered through the input: the finite values say nothing about 65504.
    if (d.cause == "f16_overflow" && h.pos_inf + h.neg_inf > 0 && r.out_dtype == "f16" && std::isfinite(h.absmax) &&
        r.cast_overflow == 0)
      d.evidence.push_back(fmt::format("output absmax of the finite values {:.6g}; the results beyond f16 max {} "
                                       "became inf",
                                       h.absmax, kF16Max));
    if (d.cause == "log_of_zero") {
      if (r.inputs[0] != trace::kInputUnknown) {
        // The provenance names the row that produced the log's input.
        if (const OpRow* in = producer_of(r, 0, idx))
          d.evidence.push_back(fmt::format("min of log input = {}: its input is the output of {}, which holds {} "
                                           "exact zero{} of {}",
                                           number(in->health.min), where_text(*in), in->health.zero,
                                           in->health.zero == 1 ? "" : "s", in->health.numel));
        else
          d.evidence.push_back(fmt::format("the log's input is not the output of a recorded op of this step ({})",
                                           trace::input_marker_name(r.inputs[0])));
      } else {
        // No provenance (format_version 1): the op before the log in the same phase is the best guess.
        const OpRow* before = nullptr;
        for (const OpRow& o : ops)
          if (o.phase == r.phase && o.seq < r.seq && (before == nullptr || o.seq > before->seq)) before = &o;
        if (before != nullptr)
          d.evidence.push_back(fmt::format("the op recorded just before the log, {} ({}), holds {} exact zero{} "
                                           "(min {}); this trace has no provenance, so that it is the log's input "
                                           "is a guess",
                                           before->op, before->out_dtype, before->health.zero,
                                           before->health.zero == 1 ? "" : "s", number(before->health.min)));
      }
    }
    for (const EventRow& e : events) {
      if (e.step == r.step && e.seq == r.seq && (e.kind == "origin" || e.kind == "cast_overflow"))
        d.evidence.push_back(fmt::format("probe ({}): {}", e.kind, e.detail));
    }
    root_walk(d, r, idx);
    // NaN from a masked_fill's -inf (a fully masked row through softmax is 0 / 0 in every dtype).
    bool from_mask = false;
    for (std::size_t i = 0; i < trace::kOpInputs && d.cause == "invalid_operation"; ++i) {
      const OpRow* q = producer_of(r, i, idx);
      if (q != nullptr && op_has(q->op, OpFlag::mask_neg_inf) && q->health.neg_inf > 0) {
        from_mask = true;
        d.evidence.push_back(fmt::format("its input is the output of {}, which filled {} of {} values with -inf: "
                                         "a row masked everywhere is 0 / 0 in softmax, in any dtype",
                                         where_text(*q), q->health.neg_inf, q->health.numel));
      }
    }
    for (const ChainLink& l : d.chain)
      if (l.role != "origin") d.evidence.push_back(fmt::format("{}: {}", l.role, l.evidence));
    propagation(d, ops, &r, step_row, grads);
    if (!damage_told && r.phase == Phase::forward) {
      silent_damage(d, ops, idx, step_row);
      damage_told = true;
    }
    d.remedies = remedies_of(d, r, rep.run.precision, from_mask);
    if (d.cause == "f16_overflow" && r.cast_overflow == 0 && r.phase == Phase::forward) grown(d, r, ops);
    d.remedy = remedy_text(d.remedies);
    if (deferred) {
      d.evidence.push_back(fmt::format("the step's forward pass and loss ({}) were finite: only the scaled "
                                       "gradients overflowed",
                                       number(step_row->loss)));
      pending_calibration[step].push_back(std::move(d));
      continue;
    }
    add(std::move(d), step);
  }
}

// An output that was finite in the steps before and grew past f16's range: the weights grew, so the
// learning rate is the first suspect (a jump in one step: far too high; a steady climb: too high for f16).
void Analyser::State::grown(Diagnosis& d, const OpRow& r, std::span<const OpRow> ops) {
  const auto h = recent.history(r, ops);
  if (h.empty() || h.front().second * 4 > kF16Max) return;
  // Did the batch itself grow? The first op that reads the data (provenance) tells: when its output jumped
  // as much since the last step, the data, not the weights, carried the output past f16's range.
  const OpRow* entry = nullptr;
  for (const OpRow& o : ops) {
    if (o.phase != Phase::forward) continue;
    if (std::find(o.inputs.begin(), o.inputs.end(), trace::kInputData) != o.inputs.end()) {
      entry = &o;
      break;
    }
  }
  if (entry != nullptr && entry != &r && non_finite(*entry) == 0) {
    // Only when that op was steady over the steps before (the weights feeding it barely moved) and then
    // jumped with this batch: one earlier point cannot tell a larger batch from a large update.
    const auto eh = recent.history(*entry, ops);
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const auto& [_, a] : eh) {
      lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
    const bool steady = eh.size() >= 2 && lo > 0 && hi <= 1.5 * lo;
    if (steady && entry->health.absmax >= 2 * eh.back().second) {
      d.evidence.push_back(fmt::format("the batch was larger: {} on the data went from absmax {:.4g} (step {}) to "
                                       "{:.4g}, while this output went from {:.4g} past {}",
                                       where_text(*entry), eh.back().second, eh.back().first, entry->health.absmax,
                                       h.back().second, kF16Max));
      d.remedies.insert(d.remedies.begin(),
                        simple("rescale_input",
                               fmt::format("standardise the input data (this batch's values reach {:.4g}, {:.3g}x "
                                           "the last one's): f16 cannot hold what it produces in {}",
                                           entry->health.absmax, entry->health.absmax / eh.back().second, place(r)),
                               "", "x = div(sub(x, mean), std);  // per feature, with the training set's statistics"));
      return;
    }
  }
  std::vector<std::string> points;
  for (const auto& [step, absmax] : h) points.push_back(fmt::format("{:.4g} (step {})", absmax, step));
  d.evidence.push_back(fmt::format("the same output's absmax before: {}; then beyond {} at step {}: it grew "
                                   "{:.3g}x as the weights trained",
                                   fmt::join(points, ", "), kF16Max, r.step, kF16Max / h.front().second));
  auto lr = lr_of.find(h.back().first);
  Remedy lower = lr_remedy(lr == lr_of.end() ? std::nan("") : lr->second);
  if (h.size() == 1) {
    lower.text += fmt::format(": one optimizer step took this output from {:.4g} past f16's range; keeping it in "
                              "f32 or bf16 only trades the inf for a diverging loss",
                              h.front().second);
    d.remedies.insert(d.remedies.begin(), std::move(lower));
  } else {
    lower.text += ": the output climbed step after step (or regularise with weight decay); clamping to f16's range "
                  "is a stopgap that hides the growth";
    d.remedies.push_back(std::move(lower));
  }
}

// Non-finite forward outputs in a step without origin: the data were non-finite before the first op.
void Analyser::State::nonfinite_input(std::int64_t step, std::span<const OpRow> ops, const StepRow* step_row,
                                      std::span<const GradRow> grads) {
  const OpRow* first = nullptr;
  for (const OpRow& o : ops)
    if (o.phase == Phase::forward && non_finite(o) > 0 && (first == nullptr || o.seq < first->seq)) first = &o;
  if (first == nullptr) return;
  Diagnosis d;
  d.step = step;
  d.seq = first->seq;
  d.phase = first->phase;
  d.module = first->module;
  d.op = first->op;
  d.in_dtypes = first->in_dtypes;
  d.out_dtype = first->out_dtype;
  d.autocast = first->autocast;
  d.cause = "nonfinite_input";
  if (seen(d)) {
    add(std::move(d), step);
    return;
  }
  // Where its non-finite input came from, when the trace says: an op the probe did not record (a filter,
  // or sampling) is a hidden origin, not bad data.
  bool hidden = false;
  for (std::int64_t in : first->inputs) hidden |= in == trace::kInputUnrecorded;
  if (hidden) {
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}: an input came from an op of this step that "
                                     "the probe did not record (filtered out by its op or module globs), so the "
                                     "origin is upstream of what this trace holds",
                                     counts_text(first->health), place(*first), step));
    d.remedies.push_back(simple("record_every_op",
                                "record every op (no op or module filter, every step) and run again: the origin is "
                                "in an op this trace does not hold",
                                "--probe health --sample-every 1",
                                "probe::ProbeOptions options;  // no .ops / .modules filter, .every = 1"));
  } else {
    bool earlier = false;
    for (std::int64_t in : first->inputs) earlier |= in == trace::kInputOtherStep;
    d.evidence.push_back(fmt::format("{} in the output of {} at step {}, and no op of the step produced them from "
                                     "finite inputs: its input already held them{}",
                                     counts_text(first->health), place(*first), step,
                                     earlier ? " (a tensor computed before this step: data prepared with ops "
                                               "before the loop, or kept from an earlier step)"
                                             : ""));
    d.remedies = remedies_of(d, *first, rep.run.precision);
  }
  propagation(d, ops, first, step_row, grads);
  d.remedy = remedy_text(d.remedies);
  add(std::move(d), step);
}

void Analyser::State::headroom(std::span<const OpRow> ops, std::span<const GradRow> grads,
                              std::span<const trace::HistogramRow> hists) {
  const bool f16_run = rep.run.precision == "fp16";
  const double factor = options.headroom_factor, frac = options.underflow_fraction;
  for (const OpRow& r : ops) {
    const auto& h = r.health;
    if (h.numel <= 0) continue;
    // Close to f16's largest value, still finite, in an f16 output. (f32 outputs are left alone: the
    // scaled loss and its gradient are large on purpose.) A mask's fill is not a warning: where and
    // masked_fill only copy values, and one whose largest magnitude is exactly f16's largest wrote the
    // dtype's extreme on purpose (Hugging Face's causal masks fill with finfo(f16).min = -65504); a copied
    // input near the limit is warned about at the op that computed it.
    const bool mask_fill = r.phase == Phase::forward && op_kind(r.op) == OpKind::mask_fill &&
                           h.absmax == kF16Max;
    if (r.out_dtype == "f16" && non_finite(r) == 0 && !mask_fill &&
        std::isfinite(h.absmax) && h.absmax * factor >= kF16Max) {
      HeadroomWarning w = warning_at("near_f16_max", r);
      w.absmax = h.absmax;
      w.message = fmt::format("absmax {:.6g} of the {} output of {} is within a factor {:.3g} of f16's max {} "
                                    "({:.3g}x headroom left)",
                                    h.absmax, r.out_dtype, place(r), factor, kF16Max, kF16Max / h.absmax);
      warn(std::move(w));
    }
    if (is_low(r.out_dtype) && h.subnormal > 0) {
      const double f = static_cast<double>(h.subnormal) / static_cast<double>(h.numel);
      if (f >= frac) {
        HeadroomWarning w = warning_at("subnormal", r);
        w.fraction = f;
        w.message = fmt::format("{} of {} values ({}) of the {} output of {} are subnormal: they keep few "
                                "significant bits and are next to flushing to zero",
                                h.subnormal, h.numel, fraction_text(f), r.out_dtype, place(r));
        warn(std::move(w));
      }
    }
    if (r.cast_underflow > 0) {
      const double f = static_cast<double>(r.cast_underflow) / static_cast<double>(h.numel);
      if (f >= frac) {
        HeadroomWarning w = warning_at("flush_to_zero", r);
        w.fraction = f;
        w.message = fmt::format("{} of {} values ({}) became 0 on the cast to {} in {}", r.cast_underflow, h.numel,
                                fraction_text(f), r.out_dtype, place(r));
        warn(std::move(w));
      }
    }
  }
  for (const GradRow& g : grads) {
    if (g.dtype == "f16" && g.nan + g.pos_inf + g.neg_inf == 0 && std::isfinite(g.absmax) &&
        g.absmax * factor >= kF16Max) {
      HeadroomWarning w;
      w.kind = "near_f16_max";
      w.step = g.step;
      w.phase = Phase::backward;
      w.tensor = g.param;
      w.dtype = g.dtype;
      w.absmax = g.absmax;
      w.message = fmt::format("the gradient of {} reached absmax {:.6g}, within a factor {:.3g} of f16's max {}",
                              g.param, g.absmax, factor, kF16Max);
      warn(std::move(w));
    }
  }
  // At level full: values below f16's smallest subnormal (2^-24) flush to zero in f16, or round up to it.
  if (!f16_run) return;
  for (const trace::HistogramRow& hr : hists) {
    // f16's zones (probes/analysis/f16_ranges.h); the tensor's dtype says what its subnormal bin holds.
    std::string_view dtype;
    for (const OpRow& r : ops) if (hr.seq >= 0 && r.seq == hr.seq) dtype = r.out_dtype;
    for (const GradRow& g : grads) if (hr.seq < 0 && g.param == hr.tensor) dtype = g.dtype;
    const half_ranges::ZoneCounts zones = half_ranges::f16_zone_counts(hr, dtype);
    const std::int64_t below = zones.below_f16(), nonzero = zones.nonzero_finite();
    if (nonzero == 0 || below == 0) continue;
    const double f = static_cast<double>(below) / static_cast<double>(nonzero);
    if (f < frac) continue;
    const OpRow* op = nullptr;
    if (hr.seq >= 0)
      for (const OpRow& r : ops)
        if (r.seq == hr.seq) op = &r;
    if (op != nullptr && op->out_dtype == "f16") continue;  // an f16 tensor shows this as subnormal/zero
    HeadroomWarning w;
    if (op != nullptr) w = warning_at("below_f16", *op);
    w.kind = "below_f16";
    w.step = hr.step;
    w.seq = hr.seq;
    if (op == nullptr) w.phase = Phase::backward;
    w.tensor = hr.tensor;
    w.fraction = f;
    w.message = op != nullptr
                    ? fmt::format("{} of {} non-zero values ({}) of the output of {} are below 2^-24, f16's smallest "
                                  "subnormal: in f16 they would flush to 0 (or, just under it, round up to 2^-24)",
                                  below, nonzero, fraction_text(f), place(*op))
                    : fmt::format("{} of {} non-zero values ({}) of the gradient of {} are below 2^-24, f16's "
                                  "smallest subnormal: in f16 they would flush to 0 (or, just under it, round up to 2^-24)",
                                  below, nonzero, fraction_text(f), hr.tensor);
    warn(std::move(w));
  }
}

// ---- what the whole run shows (Analyser::finish) ----

// ---- calibration: skips that a smaller scale cured ----

// A skipped step whose forward pass and loss were finite is the scaler calibrating when a later unskipped
// step ran at a smaller scale (the backoff cured it) and no earlier unskipped step had run at this scale or
// above (the gradients did not grow: the scale was too high, from the start or after a growth).
// A skip in the run's last step cannot show its cure: it is calibration when a skip at the same scale
// earlier in the run was (the same overshoot, cured before).
// One pass each way over /steps: the largest scale an unskipped step ran at before each step, and the
// smallest one after it (steps are in increasing order, each once).
void Analyser::State::decide_calibration() {
  ScalerHealth& sh = rep.scaler;
  const std::size_t n_steps = steps.size();
  const detail::CleanScales clean = detail::clean_scales(steps);
  const std::vector<double>& clean_max_before = clean.max_before;
  const std::vector<double>& clean_min_after = clean.min_after;
  std::set<double> cured_scales;
  const std::int64_t last_step_of_run = steps.empty() ? -1 : steps.back().step;
  for (auto& [step, diagnoses] : pending_calibration) {
    // Pending steps have a /steps row (origins() defers only those).
    const auto at = std::lower_bound(steps.begin(), steps.end(), step,
                                     [](const StepRow& s, std::int64_t k) { return s.step < k; });
    if (at == steps.end() || at->step != step) continue;
    const std::size_t i = static_cast<std::size_t>(at - steps.begin());
    const double scale = at->scale;
    bool cured = clean_min_after[i + 1] < scale;
    const bool fine_before = clean_max_before[i] >= scale;
    if (!cured && step == last_step_of_run && cured_scales.count(scale) > 0) cured = true;
    // At a scale that was fine before, the gradients grew: still the scaler's job when the skip is isolated
    // (the steps either side ran) and skips are rare overall (the verdict is not persistent); a run of such
    // skips, or many, is an anomaly.
    const bool prev_ran = i == 0 || !steps[i - 1].skipped;
    const bool next_ran = i + 1 == n_steps || !steps[i + 1].skipped;
    const bool occasional = prev_ran && next_ran && (sh.verdict == "healthy" || sh.verdict == "settled");
    if (cured && (!fine_before || occasional)) {
      cured_scales.insert(scale);
      ++sh.calibration_skips;
      sh.last_calibration_step = std::max(sh.last_calibration_step, step);
      continue;
    }
    const double lr = at->lr;
    for (Diagnosis& d : diagnoses) {
      d.evidence.push_back(
          !cured ? fmt::format("no later step ran unskipped at a smaller scale than this step's {}: backing off did "
                               "not cure it",
                               number(scale))
                 : fmt::format("an earlier step ran unskipped at scale {} or above: the gradients grew, it is not the "
                               "scaler calibrating",
                               number(scale)));
      // Gradients that grew past what a scale handled before point at the learning rate (or the loss) first;
      // an overflow no smaller scale cured, at the initial scale.
      Remedy lower = lr_remedy(lr);
      lower.text += ": the gradients grew until the scaled ones overflow f16";
      if (fine_before) d.remedies.insert(d.remedies.begin(), std::move(lower));
      else d.remedies.push_back(std::move(lower));
      d.remedy = remedy_text(d.remedies);
      add(std::move(d), step);
    }
  }
  pending_calibration.clear();
  if (sh.calibration_skips > 0 && sh.calibration_skips == sh.skipped &&
      (sh.verdict == "healthy" || sh.verdict == "persistent")) {
    // Every skip was the scaler settling: that is what the "settled" verdict means, whatever the run's length.
    sh.verdict = "settled";
    sh.message = fmt::format("{} skip{} while the scale backed off from {} (normal), none after step {}; scale {} -> {} "
                             "(min {}, max {})",
                             sh.skipped, sh.skipped == 1 ? "" : "s", sh.scale_start, sh.last_skip, sh.scale_start,
                             sh.scale_end, sh.scale_min, sh.scale_max);
  }
  if (sh.calibration_skips > 0) {
    sh.message += fmt::format("; {} skip{} up to step {} {} the scaler calibrating (gradients overflowed only at a "
                              "scale a smaller one cured): not anomalies",
                              sh.calibration_skips, sh.calibration_skips == 1 ? "" : "s", sh.last_calibration_step,
                              sh.calibration_skips == 1 ? "was" : "were");
  }
}

// Skipped steps whose ops are all finite, after the first origin: the scaler found inf in gradients no op
// of the step produced, so the inf stayed in .grad: gradients are never cleared.
std::vector<std::int64_t> Analyser::State::stale_steps() const {
  std::vector<std::int64_t> stale;
  std::int64_t first_origin_step = -1;
  for (const auto& [step, f] : facts)
    if (f.origin) {
      first_origin_step = step;
      break;
    }
  if (first_origin_step >= 0) {
    for (const StepRow& s : steps) {
      auto f = facts.find(s.step);
      if (s.step > first_origin_step && s.skipped && f != facts.end() && !f->second.nonfinite && f->second.has_ops)
        stale.push_back(s.step);
    }
  }
  return stale;
}

// Each diagnosis's consequences over the run (its later non-finite ops, the loss, the skipped steps from its
// step on); a gradient overflow followed by stale skipped steps (stale_steps) is gradients that accumulate.
void Analyser::State::propagation_over_steps() {
  const std::vector<std::int64_t> stale = stale_steps();
  for (Diagnosis& d : rep.anomalies) {
    d.skipped_steps = skipped_from(steps, d.step);
    d.evidence.push_back(fmt::format("{} later op{} of step {} turned non-finite{}; the loss was {}; {} step{} "
                                     "skipped from step {} on",
                                     d.downstream_nonfinite, d.downstream_nonfinite == 1 ? "" : "s", d.step,
                                     d.silently_wrong > 0 || !d.absorbed_by.empty()
                                         ? fmt::format(" and {} more are silently wrong (finite, from absorbed "
                                                       "NaN/inf)",
                                                       d.silently_wrong + static_cast<std::int64_t>(d.absorbed_by.size()))
                                         : "",
                                     d.loss_nonfinite ? "non-finite" : "finite", d.skipped_steps,
                                     d.skipped_steps == 1 ? "" : "s", d.step));
    if (d.cause == "gradient_overflow" && stale.size() >= 2) {
      d.cause = "accumulating_gradients";
      d.evidence.push_back(fmt::format("{} later skipped step{} (first {}) had no non-finite op: the inf stayed in "
                                       ".grad, so gradients are never cleared",
                                       stale.size(), stale.size() == 1 ? "" : "s", stale.front()));
      std::vector<std::string> norms;
      for (const StepRow& s : steps)
        if (s.step <= d.step) norms.push_back(fmt::format("{:.4g}", s.grad_norm));
      d.evidence.push_back(fmt::format("grad_norm up to step {}: {}", d.step, fmt::join(norms, ", ")));
      d.remedies = {zero_grad_remedy()};
      d.remedy = remedy_text(d.remedies);
    }
  }
}

// Steps made non-finite by weights that the optimizer, or an applied non-finite step, turned NaN/inf: evidence
// of the diagnosis that explains them, not diagnoses of their own.
void Analyser::State::later_steps_evidence() {
  // Steps made non-finite by weights the optimizer itself turned NaN/inf: evidence of that diagnosis.
  if (optimizer_wrote.later_steps > 0) {
    const auto& w = optimizer_wrote;
    for (Diagnosis& d : rep.anomalies) {
      if (d.step != w.step || d.phase != Phase::optimizer) continue;
      d.evidence.push_back(fmt::format(
          "the weights it wrote hold NaN/inf: {} later step{} ({} to {}) turned non-finite from their first op ({}) "
          "with no new origin",
          w.later_steps, w.later_steps == 1 ? "" : "s", w.first_later, w.last_later,
          w.first_op.empty() ? "?" : w.first_op));
      break;
    }
  }

  // Steps made non-finite by weights that an applied non-finite step corrupted: evidence of the diagnosis of
  // that step (or the last one before it), not diagnoses of their own.
  if (applied.later_steps > 0) {
    const auto& a = applied;
    Diagnosis* cause = nullptr;
    for (Diagnosis& d : rep.anomalies)
      if (d.step <= a.step && (cause == nullptr || d.step > cause->step)) cause = &d;
    if (cause == nullptr && !rep.anomalies.empty()) cause = &rep.anomalies.front();
    if (cause != nullptr) {
      cause->evidence.push_back(fmt::format(
          "step {} was not skipped ({}), so the optimizer applied its non-finite gradients: the weights hold "
          "NaN/inf, and {} later step{} ({} to {}) turned non-finite from their first op ({}) with no new origin",
          a.step, a.scale == 1 ? "the scale is 1: no GradScaler to skip it" : "the scaler did not skip it",
          a.later_steps, a.later_steps == 1 ? "" : "s", a.first_later, a.last_later,
          a.first_op.empty() ? "?" : a.first_op));
      cause->remedies.push_back(simple("enable_scaler",
                                       "never apply a step whose gradients are non-finite (a GradScaler skips it), so "
                                       "one bad step cannot write NaN/inf into the weights",
                                       "", "GradScaler scaler;  // scaler.scale(loss).backward(); scaler.step(opt); "
                                           "scaler.update();"));
      cause->remedy = remedy_text(cause->remedies);
    }
  }
}

// ---- gradient underflow: nothing non-finite, and every gradient exactly zero at most steps ----

void Analyser::State::gradient_underflow() {
  const ScalerHealth& sh = rep.scaler;
  std::int64_t grad_steps = 0, zero_steps = 0, first_zero = -1, last_grad_step = 0;
  for (const auto& [step, f] : facts) {
    if (f.grad_state < 0) continue;
    ++grad_steps;
    last_grad_step = step;
    if (f.grad_state == 1) {
      ++zero_steps;
      if (first_zero < 0) first_zero = step;
    }
  }
  if (!any_nonfinite && grad_steps > 0 && zero_steps * 2 > grad_steps) {
    Diagnosis d;
    d.step = first_zero;
    d.phase = Phase::backward;
    d.cause = "gradient_underflow";
    d.occurrences = zero_steps;
    d.evidence.push_back(fmt::format("every gradient ({} parameters: {}) is exactly 0 (norm 0, absmax 0) at {} of "
                                     "{} recorded steps, from step {}; no NaN or inf anywhere",
                                     params.size(), fmt::join(params, ", "), zero_steps, grad_steps, first_zero));
    if (!steps.empty())
      d.evidence.push_back(fmt::format("the loss went {:.6g} -> {:.6g}: no parameter moved", steps.front().loss,
                                       steps.back().loss));
    if (!sh.used) {
      d.evidence.push_back("the scale is 1 at every step: no loss scaler");
      d.remedies.push_back(simple("enable_scaler",
                                  "enable the GradScaler (ampscope train uses one in fp16 unless --no-scaler is "
                                  "given: drop it): it multiplies the loss so small gradients stay above f16's "
                                  "smallest subnormal (2^-24)",
                                  "",
                                  "GradScaler scaler({.init_scale = 65536});  // scaler.scale(loss).backward(); "
                                  "scaler.step(opt); scaler.update();",
                                  65536));
    } else {
      d.evidence.push_back(fmt::format("the scale ran between {} and {}", sh.scale_min, sh.scale_max));
      const double higher = std::max(65536.0, sh.scale_max * 256);
      d.remedies.push_back(simple("init_scale",
                                  "raise the initial scale so the scaled gradients stay above f16's smallest "
                                  "subnormal (2^-24)",
                                  fmt::format("--init-scale {}", number(higher)),
                                  fmt::format("GradScaler scaler({{.init_scale = {}}});", number(higher)), higher));
    }
    if (rep.run.precision == "fp16") d.remedies.push_back(bf16_remedy());
    d.remedy = remedy_text(d.remedies);
    d.gradients.assign(params.begin(), params.end());
    d.last_step = last_grad_step;
    rep.anomalies.push_back(std::move(d));
  }
}

// ---- scale collapse: the scale fell below 1 while skipping ----

void Analyser::State::scale_collapse() {
  const ScalerHealth& sh = rep.scaler;
  if (sh.used && sh.scale_min < 1) {
    const StepRow* below = nullptr;
    for (const StepRow& s : steps) {
      if (s.skipped && s.scale_after < 1) {
        below = &s;
        break;
      }
    }
    if (below != nullptr) {
      Diagnosis d;
      d.step = below->step;
      d.seq = std::numeric_limits<std::int64_t>::max();
      d.phase = Phase::scaler;
      d.cause = "scale_collapse";
      // Propagation as for any diagnosis: from its own step on (the skips before it are in the evidence).
      d.skipped_steps = skipped_from(steps, below->step);
      d.loss_nonfinite = !std::isfinite(below->loss);
      d.last_step = below->step;
      d.evidence.push_back(fmt::format("the scale went {} -> {} (min {}); {} of {} steps skipped, the longest run {}",
                                       sh.scale_start, sh.scale_end, sh.scale_min, sh.skipped, sh.steps,
                                       sh.longest_skip_run));
      const Diagnosis* recurring = nullptr;
      for (const Diagnosis& a : rep.anomalies)
        if (a.seq != d.seq && (recurring == nullptr || a.occurrences > recurring->occurrences)) recurring = &a;
      if (recurring != nullptr) {
        d.evidence.push_back(fmt::format("the same origin ({} in {}, {}) came back in {} steps: the overflow is "
                                         "not transient, so backing off cannot fix it",
                                         recurring->op, recurring->module.empty() ? "no module" : recurring->module,
                                         recurring->cause, recurring->occurrences));
        d.remedies = recurring->remedies;
        d.remedy = fmt::format("fix the recurring origin ({} in {}: {}); raising the initial scale or lowering the "
                               "minimum scale only delays the collapse",
                               recurring->op, recurring->module.empty() ? "no module" : recurring->module,
                               recurring->remedy);
      } else {
        d.remedies.push_back(lr_remedy(steps.empty() ? std::nan("") : steps.front().lr));
        d.remedy = "find the overflow the scaler keeps meeting (non-finite gradients every step); " +
                   remedy_text(d.remedies);
      }
      rep.anomalies.push_back(std::move(d));
    }
  }
}

Analyser::Analyser(AnalysisOptions options) : state_(std::make_unique<State>()) { state_->options = options; }
Analyser::~Analyser() = default;
Analyser::Analyser(Analyser&&) noexcept = default;
Analyser& Analyser::operator=(Analyser&&) noexcept = default;

void Analyser::set_run(const trace::RunInfo& run, std::string path, bool complete) {
  state_->rep.run = run;
  state_->rep.path = std::move(path);
  state_->rep.complete = complete;
}

void Analyser::add_step(std::int64_t step, const StepRow* step_row, std::span<const OpRow> ops,
                        std::span<const GradRow> grads, std::span<const EventRow> events,
                        std::span<const trace::HistogramRow> histograms,
                        std::span<const trace::PrecisionRow> precision) {
  State& st = *state_;
  if (st.finished) throw std::logic_error("Analyser::add_step after finish()");
  if (step <= st.last_step)
    throw std::invalid_argument(fmt::format("Analyser::add_step: step {} after step {}; steps must come in "
                                            "increasing order, each once",
                                            step, st.last_step));
  st.last_step = step;
  if (step_row != nullptr) st.steps.push_back(*step_row);
  st.rep.op_rows += static_cast<std::int64_t>(ops.size());
  st.rep.grad_rows += static_cast<std::int64_t>(grads.size());

  if (!ops.empty()) st.rep.provenance |= ops.front().inputs[0] != trace::kInputUnknown;
  StepFacts& f = st.facts[step];
  f.has_ops = !ops.empty();
  // Which autocast overrides decided a dtype: the reason reads "override (op 'x', module 'y') -> f32".
  for (const OpRow& r : ops) {
    if (r.autocast.rfind("override (", 0) != 0) continue;
    const std::size_t close = r.autocast.find(") -> ");
    for (std::size_t q = r.autocast.find('\''); q != std::string::npos && q < close;) {
      const std::size_t e = r.autocast.find('\'', q + 1);
      if (e == std::string::npos) break;
      st.overrides_applied.insert(r.autocast.substr(q + 1, e - q - 1));
      q = r.autocast.find('\'', e + 1);
    }
  }
  for (const OpRow& r : ops) {
    f.origin |= r.origin;
    f.nonfinite |= non_finite(r) > 0;
  }
  st.any_nonfinite |= f.nonfinite;
  for (const GradRow& g : grads) {
    st.params.insert(g.param);
    const bool zero = g.norm == 0 && g.absmax == 0 && g.zero > 0;
    f.grad_state = (f.grad_state != 0 && zero) ? 1 : 0;
  }

  if (step_row != nullptr) st.lr_of[step] = step_row->lr;
  SeqIndex idx;
  if (f.origin || f.nonfinite) {
    idx.reserve(ops.size());
    for (const OpRow& r : ops) idx.emplace(r.seq, &r);
  }
  if (f.origin) {
    st.origins(step, ops, step_row, grads, events, idx);
  } else if (f.nonfinite && st.optimizer_wrote.step >= 0) {
    st.optimizer_wrote.note(step, ops);
  } else if (f.nonfinite && st.applied.step >= 0 && !st.rep.anomalies.empty()) {
    st.applied.note(step, ops);
  } else if (f.nonfinite) {
    st.nonfinite_input(step, ops, step_row, grads);
  }
  if (!f.nonfinite) {  // the optimizer turned finite weights NaN/inf (analysis_optimizer.h)
    for (Diagnosis& d : optimizer_diagnoses(step, events, grads)) {
      d.remedy = remedy_text(d.remedies);
      if (st.optimizer_wrote.step < 0) st.optimizer_wrote.step = step;
      st.add(std::move(d), step);
    }
  }
  if (st.applied.step < 0 && step_row != nullptr && !step_row->skipped) {
    bool nonfinite_grads = !std::isfinite(step_row->grad_norm);
    for (const GradRow& g : grads) nonfinite_grads |= g.nan + g.pos_inf + g.neg_inf > 0;
    if (nonfinite_grads) {
      st.applied.step = step;
      st.applied.scale = step_row->scale;
    }
  }
  st.headroom(ops, grads, histograms);
  st.recent.remember(step, ops);
  st.precision.add_step(step, ops, precision);
}

Report Analyser::finish() {
  State& st = *state_;
  if (st.finished) throw std::logic_error("Analyser::finish called twice");
  st.finished = true;
  Report& rep = st.rep;
  rep.precision = st.precision.finish();
  const std::vector<StepRow>& steps = st.steps;
  // Rows outside steps (step -1: an evaluation pass the probe was asked to record) are no step of their own.
  std::int64_t numbered = 0;
  for (const auto& [step, _] : st.facts) numbered += step >= 0 ? 1 : 0;
  rep.steps = static_cast<std::int64_t>(std::max<std::size_t>(steps.size(), static_cast<std::size_t>(numbered)));
  rep.scaler = scaler_health(steps, rep.run);
  st.decide_calibration();
  st.propagation_over_steps();
  st.later_steps_evidence();
  st.gradient_underflow();
  st.scale_collapse();
  coverage(rep, st.overrides_applied);

  std::stable_sort(rep.anomalies.begin(), rep.anomalies.end(), [](const Diagnosis& a, const Diagnosis& b) {
    return std::tie(a.step, a.seq) < std::tie(b.step, b.seq);
  });
  std::stable_sort(rep.warnings.begin(), rep.warnings.end(), [](const HeadroomWarning& a, const HeadroomWarning& b) {
    return std::tie(a.step, a.seq) < std::tie(b.step, b.seq);
  });
  return std::move(rep);
}

namespace {

// Groups rows by step, moving them (the reader's blocks are large: no copy per row).
template <class Row>
std::map<std::int64_t, std::vector<Row>> by_step(std::vector<Row>&& rows) {
  std::map<std::int64_t, std::vector<Row>> out;
  for (Row& r : rows) out[r.step].push_back(std::move(r));
  return out;
}

// The same for rows the caller keeps (hand-built traces).
template <class Row>
std::map<std::int64_t, std::vector<Row>> by_step(const std::vector<Row>& rows) {
  return by_step(std::vector<Row>(rows));
}

template <class Row>
std::span<const Row> rows_of(const std::map<std::int64_t, std::vector<Row>>& m, std::int64_t step) {
  auto it = m.find(step);
  return it == m.end() ? std::span<const Row>{} : std::span<const Row>(it->second);
}

void feed(Analyser& a, const std::map<std::int64_t, const StepRow*>& step_rows,
          std::map<std::int64_t, std::vector<OpRow>>& ops, const std::map<std::int64_t, std::vector<GradRow>>& grads,
          const std::map<std::int64_t, std::vector<EventRow>>& events,
          const std::map<std::int64_t, std::vector<trace::HistogramRow>>& hists,
          const std::map<std::int64_t, std::vector<trace::PrecisionRow>>& precision, std::int64_t begin, std::int64_t end) {
  std::set<std::int64_t> all;
  for (const auto& [s, _] : step_rows) if (s >= begin && s < end) all.insert(s);
  for (const auto& [s, _] : ops) all.insert(s);
  for (const auto& [s, _] : grads) all.insert(s);
  for (const auto& [s, _] : events) all.insert(s);
  for (const auto& [s, _] : hists) all.insert(s);
  for (const auto& [s, _] : precision) all.insert(s);
  for (std::int64_t s : all) {
    auto row = step_rows.find(s);
    // The rules read a step's ops in seq order; a file written in order is already sorted.
    std::span<const OpRow> step_ops;
    if (auto it = ops.find(s); it != ops.end()) {
      auto by_seq = [](const OpRow& x, const OpRow& y) { return x.seq < y.seq; };
      if (!std::is_sorted(it->second.begin(), it->second.end(), by_seq))
        std::stable_sort(it->second.begin(), it->second.end(), by_seq);
      step_ops = it->second;
    }
    a.add_step(s, row == step_rows.end() ? nullptr : row->second, step_ops, rows_of(grads, s), rows_of(events, s),
               rows_of(hists, s), rows_of(precision, s));
  }
}

}  // namespace

Report analyse(const std::vector<StepRow>& steps, const std::vector<OpRow>& ops, const std::vector<GradRow>& grads,
               const std::vector<EventRow>& events, const std::vector<trace::HistogramRow>& histograms,
               const AnalysisOptions& options, const std::vector<trace::PrecisionRow>& precision) {
  Analyser a(options);
  std::map<std::int64_t, const StepRow*> step_rows;
  for (const StepRow& s : steps) step_rows[s.step] = &s;
  auto ops_by_step = by_step(ops);
  feed(a, step_rows, ops_by_step, by_step(grads), by_step(events), by_step(histograms), by_step(precision),
       trace::kFirstStep, trace::kLastStep);
  return a.finish();
}

Report analyse(trace::TraceReader& reader, const AnalysisOptions& options, const Progress& progress) {
  Analyser a(options);
  a.set_run(reader.run_info(), reader.path().string(), reader.complete());
  const std::vector<StepRow> steps = reader.steps();
  const trace::RowCounts counts = reader.row_counts();
  std::map<std::int64_t, const StepRow*> step_rows;
  for (const StepRow& s : steps) step_rows[s.step] = &s;

  // Blocks of whole steps, about rows_per_read op rows each; the first block starts at the smallest step
  // number and the last one is open-ended, so rows of a step without a step row are read too.
  std::vector<std::int64_t> numbers;
  for (const auto& [s, _] : step_rows) numbers.push_back(s);
  // At least 1: a trace without steps (or without op rows) has nothing to divide by.
  const std::int64_t per_step = std::max<std::int64_t>(
      1, numbers.empty() ? counts.ops : counts.ops / static_cast<std::int64_t>(numbers.size()));
  const std::size_t block = static_cast<std::size_t>(std::max<std::int64_t>(1, options.rows_per_read / per_step));
  std::int64_t done = 0;
  for (std::size_t i = 0; i == 0 || i < numbers.size(); i += block) {
    const std::int64_t begin = i == 0 ? trace::kFirstStep : numbers[i];
    const std::int64_t end = i + block >= numbers.size() ? trace::kLastStep : numbers[i + block];
    std::map<std::int64_t, const StepRow*> rows_here;
    for (auto it = step_rows.lower_bound(begin); it != step_rows.end() && it->first < end; ++it) rows_here.insert(*it);
    auto ops = by_step(reader.ops(begin, end));
    for (const auto& [_, v] : ops) done += static_cast<std::int64_t>(v.size());
    feed(a, rows_here, ops, by_step(reader.grads(begin, end)), by_step(reader.events(begin, end)),
         by_step(reader.histograms(begin, end)), by_step(reader.precision(begin, end)), begin, end);
    if (progress) progress(done, counts.ops);
    if (numbers.empty()) break;
  }
  Report report = a.finish();
  report.swamped = analyse_updates(reader.updates());  // one row per f16/bf16 parameter and step: small
  report.damage = reader.damage();
  return report;
}

}  // namespace ampscope::analysis
