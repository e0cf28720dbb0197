#include "probes/analysis/fp8.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace ampscope::analysis {

namespace {

int operand_rank(const std::string& operand) { return operand == "input" ? 0 : operand == "weight" ? 1 : 2; }

// Indices of the operands whose `fraction` is above 0, highest first (a stable sort keeps operands' order on
// ties), at most kFp8Worst.
template <typename Fraction>
std::vector<std::size_t> worst(const std::vector<Fp8OperandSummary>& operands, Fraction fraction) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < operands.size(); ++i)
    if (fraction(operands[i]) > 0) out.push_back(i);
  std::stable_sort(out.begin(), out.end(),
                   [&](std::size_t a, std::size_t b) { return fraction(operands[a]) > fraction(operands[b]); });
  if (out.size() > kFp8Worst) out.resize(kFp8Worst);
  return out;
}

}  // namespace

Fp8Section analyse_fp8(std::span<const trace::Fp8Row> rows) {
  Fp8Section out;
  out.rows = static_cast<std::int64_t>(rows.size());
  if (rows.empty()) return out;
  std::set<std::int64_t> steps;
  std::set<std::string> modules;
  // (module, operand's rank) -> its rows in step order
  std::map<std::tuple<std::string, int>, std::vector<const trace::Fp8Row*>> by_operand;
  for (const trace::Fp8Row& r : rows) {
    steps.insert(r.step);
    modules.insert(r.module);
    by_operand[{r.module, operand_rank(r.operand)}].push_back(&r);
  }
  out.steps = static_cast<std::int64_t>(steps.size());
  out.modules = static_cast<std::int64_t>(modules.size());
  out.first_step = *steps.begin();
  out.last_step = *steps.rbegin();
  for (auto& [key, list] : by_operand) {
    std::stable_sort(list.begin(), list.end(), [](const trace::Fp8Row* a, const trace::Fp8Row* b) { return a->step < b->step; });
    Fp8OperandSummary s;
    s.module = list.front()->module;
    s.operand = list.front()->operand;
    s.format = list.front()->format;
    std::set<std::int64_t> own_steps;
    for (const trace::Fp8Row* r : list) {
      own_steps.insert(r->step);
      s.nonzero += r->nonzero;
      s.underflow += r->underflow;
      s.subnormal += r->subnormal;
      s.saturated += r->saturated;
      s.max_rel_rms_error = std::max(s.max_rel_rms_error, r->rel_rms_error);
      const double u = trace::fp8_fraction(r->underflow, r->nonzero);
      const double sat = trace::fp8_fraction(r->saturated, r->nonzero);
      if (u > s.worst_underflow_fraction) {
        s.worst_underflow_fraction = u;
        s.worst_underflow_step = r->step;
      }
      if (sat > s.worst_saturated_fraction) {
        s.worst_saturated_fraction = sat;
        s.worst_saturated_step = r->step;
      }
      s.last_amax = r->amax;
      s.last_scale = r->scale;
    }
    s.steps = static_cast<std::int64_t>(own_steps.size());
    s.underflow_fraction = trace::fp8_fraction(s.underflow, s.nonzero);
    s.subnormal_fraction = trace::fp8_fraction(s.subnormal, s.nonzero);
    s.saturated_fraction = trace::fp8_fraction(s.saturated, s.nonzero);
    out.operands.push_back(std::move(s));
  }
  out.worst_underflow = worst(out.operands, [](const Fp8OperandSummary& s) { return s.underflow_fraction; });
  out.worst_saturation = worst(out.operands, [](const Fp8OperandSummary& s) { return s.saturated_fraction; });
  return out;
}

}  // namespace ampscope::analysis
