#include "probes/analysis/optimizer.h"

#include <cmath>

#include <fmt/ranges.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ampscope::analysis {

namespace {

// The smallest positive subnormal of each floating dtype: f16 2^-24, bf16 2^-133, f32 2^-149.
double smallest_subnormal(const std::string& dtype) {
  if (dtype == "f16") return std::ldexp(1.0, -24);
  if (dtype == "bf16") return std::ldexp(1.0, -133);
  if (dtype == "f32") return std::ldexp(1.0, -149);
  return 0;  // f64 and unknown dtypes: nothing rounds to 0 here
}

std::string counts(std::int64_t nan, std::int64_t pos_inf, std::int64_t neg_inf) {
  std::vector<std::string> parts;
  if (nan > 0) parts.push_back(fmt::format("{} NaN", nan));
  if (pos_inf > 0) parts.push_back(fmt::format("{} +inf", pos_inf));
  if (neg_inf > 0) parts.push_back(fmt::format("{} -inf", neg_inf));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

bool rounds_to_zero_in(double x, const std::string& dtype) {
  const double tiny = smallest_subnormal(dtype);
  // The optimizer adds eps in f32 (its arithmetic type for f16, bf16 and f32 state) and rounds the sum once
  // into the state's dtype, so x is taken as f32 holds it first.
  const auto held = static_cast<double>(static_cast<float>(x));
  return tiny > 0 && held >= 0 && held <= tiny / 2;
}

std::vector<Diagnosis> optimizer_diagnoses(std::int64_t step, std::span<const trace::EventRow> events,
                                           std::span<const trace::GradRow> grads) {
  std::vector<Diagnosis> out;
  for (const trace::EventRow& e : events) {
    if (e.kind != "nonfinite_update" || e.step != step) continue;
    bool grad_nonfinite = false;
    for (const trace::GradRow& g : grads) grad_nonfinite |= g.param == e.module && g.nan + g.pos_inf + g.neg_inf > 0;
    if (grad_nonfinite) continue;  // the optimizer applied a non-finite gradient: propagation
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(e.detail);
    } catch (const nlohmann::json::exception&) {
      continue;  // a detail this reader cannot read says nothing it could cite
    }
    if (!j.is_object()) continue;
    const std::string dtype = j.value("dtype", std::string());
    const std::string state = j.value("state_dtype", dtype);
    const std::int64_t numel = j.value("numel", std::int64_t{0});
    const std::int64_t nan = j.value("nan", std::int64_t{0}), pos_inf = j.value("pos_inf", std::int64_t{0}),
                       neg_inf = j.value("neg_inf", std::int64_t{0});
    const bool has_eps = j.contains("eps") && j["eps"].is_number();
    const double eps = has_eps ? j["eps"].get<double>() : 0;
    const bool has_v = j.contains("v_zero") && j["v_zero"].is_number_integer();
    const std::int64_t v_zero = has_v ? j["v_zero"].get<std::int64_t>() : 0;

    Diagnosis d;
    d.step = step;
    d.seq = e.seq;
    d.phase = trace::Phase::optimizer;
    d.op = e.op;
    d.module = e.module;
    d.in_dtypes = dtype;
    d.out_dtype = dtype;
    d.evidence.push_back(fmt::format(
        "{}'s update at step {} turned {} of the {} elements of {} ({}) non-finite from finite values ({}): no op of "
        "the model made them, the optimizer did",
        e.op.empty() ? "the optimizer" : e.op, step, nan + pos_inf + neg_inf, numel, e.module, dtype,
        counts(nan, pos_inf, neg_inf)));
    const bool adam = e.op == "Adam" || e.op == "AdamW";
    if (adam && has_eps && rounds_to_zero_in(eps, state)) {
      d.cause = "optimizer_eps_underflow";
      const double tiny = smallest_subnormal(state);
      d.evidence.push_back(fmt::format(
          "its eps = {:g} rounds to 0 in {}, the dtype of its state (the smallest {} subnormal is {:.3g}; anything at "
          "or below half of it, {:.3g}, rounds to 0), so the denominator sqrt(v) + eps is 0 wherever v is 0",
          eps, state, state, tiny, tiny / 2));
      if (has_v) {
        d.evidence.push_back(fmt::format(
            "the second moment v was exactly 0 at {} of those {} elements (a gradient exactly 0 there, or one whose "
            "square underflowed {}): m / 0 there is NaN where m is 0 too and infinite where it is not",
            v_zero, nan + pos_inf + neg_inf, state));
      }
      Remedy master;
      master.kind = "master_weights_f32";
      master.text = fmt::format(
          "keep the parameters and the optimizer's state in f32 (f32 master weights) and run the ops in {} under "
          "autocast: eps = {:g} survives in f32, and so do the small second moments that flush to 0 in {}",
          dtype, eps, state);
      master.code = fmt::format(
          "// no model.to(DType::{}): parameters and Adam's state stay f32;  AutocastGuard autocast(DType::{});  // "
          "around the forward pass only, with a GradScaler for f16",
          dtype, dtype);
      d.remedies.push_back(std::move(master));
      // The smallest eps that stays non-zero: above half the smallest subnormal it rounds to that subnormal (f16:
      // 2^-24 = 5.96e-8), and then sqrt(v) + eps >= eps > 0 for every v >= 0, since rounding is monotonic. 6e-8
      // is the round figure just above 2^-24 for f16.
      const double least = state == "f16" ? 6e-8 : tiny;
      Remedy epsilon;
      epsilon.kind = "epsilon";
      epsilon.value = least;
      epsilon.text = fmt::format(
          "keep the {} state and give Adam an eps that {} can hold: any eps above {:.3g} rounds to at least {:.3g}, "
          "so sqrt(v) + eps is never 0 (eps = {:g} or more; a larger one, such as 1e-4, also bounds the update m / eps "
          "where v underflowed but m did not)",
          state, state, tiny / 2, tiny, least);
      epsilon.code = fmt::format("optim::{} opt(model.parameters(), {{.eps = {:g}}});", e.op, least);
      d.remedies.push_back(std::move(epsilon));
    } else {
      d.cause = "unknown";
      if (has_eps) d.evidence.push_back(fmt::format("its eps = {:g} is non-zero in {}", eps, state));
      Remedy compare;
      compare.kind = "compare_fp32";
      compare.text = fmt::format("compare with a run whose parameters are f32: the optimizer's update did not fit {}",
                                 dtype);
      compare.code = "// the same loop without model.to(DType::f16)";
      d.remedies.push_back(std::move(compare));
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace ampscope::analysis
