// The remedies of a diagnosis (probes/analysis/internal/remedies.h): one function per cause, chosen from the
// table kRemediesByCause, each worded for both `ampscope train` and the user's own loop.
#include "probes/analysis/internal/remedies.h"

#include "probes/analysis/internal/reach.h"
#include "probes/analysis/internal/rows.h"
#include "probes/analysis/op_traits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampscope::analysis {
namespace detail {

using trace::OpRow;
using trace::Phase;

namespace {

// An epsilon (or clamp bound) for an op of this dtype: 1e-4 in f16 (normal there: 1e-8 and 1e-5 are not),
// 1e-8 otherwise.
double safe_epsilon(const std::string& dtype) { return dtype == "f16" ? 1e-4 : 1e-8; }

std::string dtype_words(const std::string& dtype) { return dtype.empty() ? "its dtype" : dtype; }

std::string gain_words(double gain) { return fmt::format("{:.3g} times", gain); }

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
  // The op to keep in f32: the chain's root when there is one (where the rounding happened), else the origin;
  // how a remedy reaches it (an override, a cast, the call's dtype) is reach.h's to decide.
  F32Target target;
  // The op whose output the chain starts from (the root), for wording.
  std::string root_op, dtype;
  double eps = 0;
  std::string eps_why;

  const Amplification* amp = nullptr;  // the amplifier of an overflow (root cause amplification)

  RemedyContext(const Diagnosis& diagnosis, const OpRow& row, const std::string& run_precision, bool mask,
                const Amplification* amplification)
      : d(diagnosis), r(row), from_mask(mask), amp(amplification) {
    // Rows analysed without run info (hand-built traces): the op's own dtypes say what the run was.
    const std::string precision =
        !run_precision.empty() ? run_precision
        : (r.out_dtype == "f16" || r.in_dtypes.find("f16") != std::string::npos) &&
                r.in_dtypes.find("bf16") == std::string::npos
            ? "fp16"
        : (r.out_dtype == "bf16" || r.in_dtypes.find("bf16") != std::string::npos) ? "bf16"
                                                                                   : "fp32";
    low = precision == "fp16" || precision == "bf16" || precision == "fp8";  // fp8: bf16 autocast, FP8 Linears
    f16 = precision == "fp16";
    // An amplifier is not where the overflow happens: keeping it in f32 is its own remedy (the values then stay
    // f32 up to the origin), so the cause's f32 remedy keeps the origin.
    const ChainLink* root_link = d.chain.empty() || d.root_cause == "amplification" ? nullptr : &d.chain.front();
    target.op = root_link ? root_link->op : d.op;
    target.module = root_link ? root_link->module : d.module;
    target.dtype = root_link ? root_link->out_dtype : r.out_dtype;
    target.autocast = root_link ? root_link->autocast : d.autocast;
    target.phase = r.phase;
    root_op = root_link ? root_link->op : "";
    dtype = root_link ? root_link->out_dtype : r.out_dtype;
    // In an fp16 run the value a clamp or an epsilon protects may be f16 wherever the op itself ran (a log runs
    // in f32 on autocast's cast of an f16 1 - s): a bound that survives f16 is right in every case.
    eps = safe_epsilon(f16 ? "f16" : dtype);
    eps_why = eps == 1e-4 ? " (1e-4 is a normal f16 value; 1e-8 rounds to 0 in f16 and 1e-5 is subnormal)" : "";
  }

  // Keeps the target op in f32, in low-precision runs only (reach.h: by an autocast override and the same one
  // for every block, by a cast of its input outside autocast, or by the call's dtype argument).
  void keep_f32(std::vector<Remedy>& out, const std::string& why) const {
    if (low) f32_remedies(target, why, out);
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

// ---- an overflow whose values an op upstream amplified (the root walk's amplification) ----

// x rounded to two significant digits, down or up: 10.68 -> 10 or 11, 0.1046 -> 0.1 or 0.11.
double two_digits(double x, bool up) {
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 1);
  const double digits = up ? std::ceil(x / unit - 1e-9) : std::floor(x / unit + 1e-9);
  return std::max(digits, 1.0) * unit;
}

// The factor at most (for a multiplication) that keeps the amplified values within half the limit the origin
// passed, on this batch: from exp's input when exp overflowed (the ops between pass the values on), from the
// amplifier's input when it overflowed itself; 0 when the trace cannot say (an overflow further downstream).
double safe_factor(const Amplification& a) {
  if (a.reached > 0) return a.gain * (a.limit / 2) / a.reached;
  if (a.overflowed) return (kF16Max / 2) / a.in_absmax;
  return 0;
}

void amplification_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  const Amplification& a = *c.amp;
  const OpRow& amp = *a.op;
  const std::string at = place_of(amp.op, amp.module);
  const std::string past = a.reached > 0 ? fmt::format("exp's input reached {}, past the {:.4g} exp can take in {}",
                                                       number(a.reached), a.limit, c.r.out_dtype)
                                         : fmt::format("the values passed {}'s largest, {}", c.r.out_dtype, kF16Max);
  if (a.grew) {
    Remedy lower = lr_remedy(a.lr);
    lower.text += fmt::format(": {} amplified the values, and {}", at, a.growth);
    out.push_back(std::move(lower));
  }
  // An amplifier that overflowed itself: its gain is a lower bound (65504 over its input's absmax).
  const std::string larger = (a.overflowed ? "at least " : "") + gain_words(a.gain);
  switch (a.kind) {
    case Amplification::Kind::factor: {
      const bool divides = op_has(amp.op, OpFlag::divides);
      const std::string now = a.overflowed ? fmt::format("{} {}", divides ? "at most" : "at least", about(divides ? 1 / a.gain : a.gain))
                                           : "about " + about(divides ? 1 / a.gain : a.gain);
      const double factor = safe_factor(a);
      const std::string bound = a.reached > 0 ? fmt::format("below {:.3g}", a.limit / 2) : fmt::format("below {}", kF16Max / 2);
      if (divides) {
        const double divisor = factor > 0 ? two_digits(1 / factor, /*up=*/true) : 0;
        out.push_back(simple(
            "temperature",
            divisor > 0
                ? fmt::format("divide by at least {} (a larger temperature) instead of {}: {} made the values {} "
                              "larger and {}; divided by {} they stay {} on this batch (a learned temperature: start "
                              "it there, or clamp it from below)",
                              number(divisor), now, at, larger, past, number(divisor), bound)
                : fmt::format("divide by a larger value (a larger temperature) than {}: {} made the values {} larger "
                              "and {}",
                              now, at, larger, past),
            "",
            divisor > 0 ? fmt::format("Tensor y = div(x, {});  // at least {}, not {}; a learned one: clamp_min(t, {})",
                                      number(divisor), number(divisor), now, number(divisor))
                        : fmt::format("Tensor y = div(x, t);  // t larger than {}", now),
            divisor));
      } else {
        const double at_most = factor > 0 ? two_digits(factor, /*up=*/false) : 0;
        out.push_back(simple(
            "smaller_scale",
            at_most > 0
                ? fmt::format("multiply by at most {} instead of {}: {} made the values {} larger and {}; "
                              "multiplied by {} they stay {} on this batch (a learned factor such as a logit scale: "
                              "start it there, or clamp it)",
                              number(at_most), now, at, larger, past, number(at_most), bound)
                : fmt::format("multiply by a smaller factor than {}: {} made the values {} larger and {}", now, at,
                              larger, past),
            "",
            at_most > 0 ? fmt::format("Tensor y = mul(x, {});  // at most {}, not {}; a learned one: clamp_max(s, {})",
                                      number(at_most), number(at_most), now, number(at_most))
                        : fmt::format("Tensor y = mul(x, s);  // s smaller than {}", now),
            at_most));
      }
      // The scale computed in f32: its output, and what follows it up to the origin, stay f32.
      if (c.low && a.f32_path)
        f32_remedies({.op = amp.op, .module = amp.module, .dtype = amp.out_dtype, .autocast = amp.autocast},
                     fmt::format("the scaled values then stay f32 up to {}, whose f32 range holds them", place(c.r)),
                     out);
      break;
    }
    case Amplification::Kind::product:
      if (a.unscaled) {
        const double scale = a.inner > 0 ? 1 / std::sqrt(static_cast<double>(a.inner)) : 0;
        const std::string by = a.inner > 0 ? fmt::format("1/sqrt({}) = {:.3g}", a.inner, scale) : "1/sqrt(d)";
        out.push_back(simple(
            "scale_scores",
            fmt::format("scale the product by {} ({} sums {} terms) as scaled dot-product attention does, and "
                        "before it is taken: multiply {}'s first operand by it{}",
                        by, at, a.inner > 0 ? fmt::format("{}", a.inner) : std::string("d"), amp.op,
                        a.overflowed ? fmt::format(" (scaling the result instead still overflows in {})", amp.op) : ""),
            "",
            fmt::format("Tensor scores = {}(mul(q, {}), k.transpose(-2, -1));  // q / sqrt(d) before the product",
                        amp.op, scale > 0 ? fmt::format("{:.6g}", scale) : std::string("1.0 / std::sqrt(d)")),
            scale));
      }
      break;
    case Amplification::Kind::weight:
      // Weights large from the start: changing the model comes after the cause's own remedies (f32 for the op
      // that overflowed, bf16), which an option applies; normalise_remedy() adds it there.
      break;
    case Amplification::Kind::other: break;
  }
}

// A matmul whose weights were large from the start (not grown: the learning rate is the remedy then): a norm
// on its output.
void normalise_remedy(const RemedyContext& c, std::vector<Remedy>& out) {
  if (c.amp == nullptr || c.amp->kind != Amplification::Kind::weight || c.amp->grew) return;
  const OpRow& amp = *c.amp->op;
  if (op_kind(amp.op) != OpKind::matmul) return;  // a norm's own weight: no norm to add
  // Its last dimension, from the row's shape ("[4, 64, 384]" -> "384").
  const auto open = amp.shape.find_last_of("[ ");
  const auto close = amp.shape.rfind(']');
  const std::string n = open == std::string::npos || close == std::string::npos || close <= open + 1
                            ? "n"
                            : amp.shape.substr(open + 1, close - open - 1);
  out.push_back(simple("normalise",
                       fmt::format("normalise what {} produces: a layer_norm over its last dimension ({}) bounds the "
                                   "values whatever the size of its weights (for attention's q and k: one on each, "
                                   "QK-norm); or initialise its weights smaller",
                                   place_of(amp.op, amp.module), n),
                       "", fmt::format("Tensor h = layer_norm(y, {{{}}});  // y = {}(x, ...): bounded whatever its "
                                       "weights",
                                       n, amp.op)));
}

void exp_overflow_remedies(const RemedyContext& c, std::vector<Remedy>& out) {
  if (c.amp != nullptr) amplification_remedies(c, out);
  // The limit of the dtype the exp ran in (its output's): ln of its largest finite value, 11.09 in f16; bf16 has
  // f32's exponent range, so its exp overflows where f32's does (88.72) and computing it in f32 does not help.
  const std::string& dtype = c.r.out_dtype;
  const double largest = dtype == "f16"    ? 65504.0
                         : dtype == "bf16" ? 0x1.fep127
                         : dtype == "f64"  ? std::numeric_limits<double>::max()
                                           : static_cast<double>(std::numeric_limits<float>::max());
  out.push_back(simple("stable_formulation",
                       fmt::format("subtract the row's max before exp (softmax, log_softmax and cross_entropy do it for "
                                   "you): exp of a value above {:.4g} overflows {}",
                                   std::log(largest), dtype.empty() ? "f32" : dtype),
                       "", "Tensor e = exp(x - amax(x, {-1}, true));  // or softmax / log_softmax / cross_entropy"));
  if (dtype == "f16") c.keep_f32(out, "exp overflows f32 only above 88.72");
  if (c.f16) out.push_back(bf16_remedy());
  normalise_remedy(c, out);
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
  if (c.amp != nullptr) amplification_remedies(c, out);
  c.keep_f32(out, r.cast_overflow > 0 ? "the cast to f16 is what overflows" : "f32's range ends at 3.4e38");
  if (c.f16) out.push_back(bf16_remedy());
  normalise_remedy(c, out);
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
                                bool from_mask, const Amplification* amplification) {
  const RemedyContext context(d, r, run_precision, from_mask, amplification);
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
