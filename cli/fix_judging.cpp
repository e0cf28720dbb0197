// cli/fix_judging.cpp: see fix_judging.h.
#include "cli/fix_judging.h"

#include <fmt/format.h>

namespace ampscope::samples {

namespace {

bool error_dominates_kind(const std::string& kind) {
  return kind == "fp8_error_dominates" || kind == "block_error_dominates";
}

}  // namespace

FindingPlace place_of(const analysis::Fp8Finding& f) { return {f.kind, f.module, f.operand, f.copy, f.format}; }

bool same_place(const FindingPlace& named, const analysis::Fp8Finding& f) {
  if (f.kind != named.kind || f.module != named.module) return false;
  if (error_dominates_kind(named.kind)) return true;
  if (f.operand != named.operand) return false;
  if (!analysis::block_finding_kind(named.kind)) return true;  // per-tensor FP8: the operand is the place
  if (f.format != named.format) return false;
  return named.kind == "block_copy_mismatch" || f.copy == named.copy;
}

std::string place_text(const FindingPlace& p) {
  if (error_dominates_kind(p.kind)) return p.module;
  std::string text = p.module + " " + p.operand;
  if (!analysis::block_finding_kind(p.kind)) return text;
  if (p.kind == "block_copy_mismatch") text += " copies";
  else if (!p.copy.empty()) text += " " + p.copy;
  if (!p.format.empty()) text += " (" + p.format + ")";
  return text;
}

FindingVerdict judge_findings(const std::vector<analysis::Fp8Finding>& findings, const FindingPlace& named) {
  FindingVerdict v;
  for (const analysis::Fp8Finding& f : findings) {
    if (f.kind != named.kind) continue;
    if (same_place(named, f)) {
      if (!v.gone) continue;
      v.gone = false;
      v.first = fmt::format("step {}, {} in {}", f.first_step, f.operand, f.module);
    } else if (v.elsewhere.empty()) {
      v.elsewhere = fmt::format("step {}, {}", f.first_step, place_text(place_of(f)));
    }
  }
  return v;
}

}  // namespace ampscope::samples
