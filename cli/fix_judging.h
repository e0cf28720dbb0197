// cli/fix_judging.h: how `ampscope fix` judges a re-run's FP8 and block-scaled findings against the finding it
// fixes (docs/fp8.md, "Judged where it was named"): a finding of the same kind counts as the original only where
// the original was named; one of the kind elsewhere is reported as such, never as the original remaining.
//
//   const FindingPlace named = place_of(original);                  // from the original trace's report
//   const FindingVerdict v = judge_findings(rerun.fp8.findings, named);
//   // v.gone, v.first ("step 4, input in fc1" or "none"), v.elsewhere ("step 0, fc2 input columnwise (nvfp4)")
#pragma once

#include <string>
#include <vector>

#include "probes/analysis/analysis.h"

namespace ampscope::samples {

// Where a finding was named. What of it is the place depends on the kind (same_place).
struct FindingPlace {
  std::string kind, module, operand, copy, format;
};

FindingPlace place_of(const analysis::Fp8Finding& f);

// Whether `f` is a finding of `named`'s kind at `named`'s place: for mx_floor_clipping and block_outlier the same
// module, operand, copy and format; for block_copy_mismatch the same module, operand and format (its `copy` names
// the worse of the two copies, which may change between runs: evidence, not place); for fp8_error_dominates and
// block_error_dominates the same module (the finding is about the Linear; its worst operand is evidence); for the
// per-tensor FP8 kinds (e4m3_grad_underflow, stale_scale, saturation) the same module and operand (an operand has
// one copy, and a remedy may change its format: the same operand in another format is still the same place).
bool same_place(const FindingPlace& named, const analysis::Fp8Finding& f);

// The place in words, as much of it as same_place compares: "fc1 input rowwise (nvfp4)" (mx_floor_clipping,
// block_outlier), "fc1 input copies (nvfp4)" (block_copy_mismatch), "fc1" (the error-dominates kinds), "fc1 input"
// (the per-tensor FP8 kinds).
std::string place_text(const FindingPlace& p);

// A re-run's findings against the named one.
struct FindingVerdict {
  bool gone = true;          // no finding of the kind at the named place
  std::string first = "none";  // the first there: "step 4, input in fc1"
  std::string elsewhere;     // the first of the kind anywhere else: "step 0, fc2 input columnwise (nvfp4)"; "" if none
};
FindingVerdict judge_findings(const std::vector<analysis::Fp8Finding>& findings, const FindingPlace& named);

}  // namespace ampscope::samples
