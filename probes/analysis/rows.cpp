// What the analysis's files say about one recorded row, shared (probes/analysis/internal/rows.h).
#include "probes/analysis/internal/rows.h"

#include "probes/analysis/op_traits.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ampscope::analysis::detail {

using trace::OpRow;
using trace::Phase;

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

std::string number(double v) { return fmt::format("{:.6g}", v); }

std::string about(double x) {
  if (!(x > 0) || !std::isfinite(x)) return number(x);
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 1);
  return number(std::round(x / unit) * unit);
}

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

bool is_low(const std::string& dtype) { return dtype == "f16" || dtype == "bf16"; }

std::string fraction_text(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

}  // namespace ampscope::analysis::detail
