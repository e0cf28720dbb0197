// The remedies of a diagnosis (probes/analysis/internal/remedies.h): one function per cause, chosen from the
// table kRemediesByCause, each worded for both `ampscope train` and the user's own loop.
#include "probes/analysis/internal/remedies.h"

#include "probes/analysis/internal/rows.h"
#include "probes/analysis/op_traits.h"
#include "probes/analysis/precision.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampscope::analysis {
namespace detail {

using trace::OpRow;
using trace::Phase;

namespace {

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

// An epsilon (or clamp bound) for an op of this dtype: 1e-4 in f16 (normal there: 1e-8 and 1e-5 are not),
// 1e-8 otherwise.
double safe_epsilon(const std::string& dtype) { return dtype == "f16" ? 1e-4 : 1e-8; }

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

std::string dtype_words(const std::string& dtype) { return dtype.empty() ? "its dtype" : dtype; }

}  // namespace

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

Remedy simple(const char* kind, std::string text, std::string flag, std::string code, double value) {
  Remedy m;
  m.kind = kind;
  m.text = std::move(text);
  m.flag = std::move(flag);
  m.code = std::move(code);
  m.value = value;
  return m;
}

Remedy zero_grad_remedy() {
  return simple("zero_grad",
                "clear gradients every step (optimizer.zero_grad()), or every accumulation window when "
                "accumulating on purpose",
                "", "opt.zero_grad();  // at the start of every step");
}

}  // namespace detail

std::string autocast_pattern(const std::string& module) { return "'" + module + "'"; }

Remedy detail::keep_f32_remedy(const std::string& module, const std::string& op, const std::string& why) {
  return autocast_remedy(module, op, why);
}

namespace detail {
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

}  // namespace

// Remedies for a diagnosis of row r, best first.
std::vector<Remedy> remedies_of(const Diagnosis& d, const OpRow& r, const std::string& run_precision,
                                bool from_mask) {
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

}  // namespace detail
}  // namespace ampscope::analysis
