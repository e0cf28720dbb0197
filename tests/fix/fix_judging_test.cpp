// How `ampscope fix` judges a re-run's FP8 and block-scaled findings (cli/fix_judging.h; docs/fp8.md, "Judged where
// it was named"), on findings built by hand: a finding of the original's kind counts as the original only at its
// place, which for each kind is the part of the finding that says where the loss is (and not what evidence it
// gives): mx_floor_clipping and block_outlier a copy of a Linear's operand in one format, block_copy_mismatch the
// operand's pair of copies (its `copy` is the worse one of the run, which a remedy can swap), the error-dominates
// kinds the Linear, the per-tensor FP8 kinds the operand (it has one copy; a remedy such as --fp8-format hybrid
// changes its format, not its place). The expected verdicts and texts are written from those rules.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/fix_judging.h"
#include "probes/analysis/analysis.h"

namespace ampscope::samples {
namespace {

analysis::Fp8Finding finding(std::string kind, std::string module, std::string operand, std::string copy,
                             std::string format, std::int64_t first_step = 0) {
  analysis::Fp8Finding f;
  f.kind = std::move(kind);
  f.module = std::move(module);
  f.operand = std::move(operand);
  f.copy = std::move(copy);
  f.format = std::move(format);
  f.first_step = f.last_step = first_step;
  return f;
}

const FindingPlace kOutlier = place_of(finding("block_outlier", "fc1", "input", "columnwise", "nvfp4"));

TEST(fix_judging_test, a_finding_gone_where_it_was_named_is_gone_with_nothing_elsewhere) {
  const FindingVerdict v = judge_findings({}, kOutlier);
  EXPECT_TRUE(v.gone);
  EXPECT_EQ(v.first, "none");
  EXPECT_EQ(v.elsewhere, "");
  // Findings of other kinds at the same place are not this one's.
  const FindingVerdict w = judge_findings({finding("block_copy_mismatch", "fc1", "input", "columnwise", "nvfp4"),
                                           finding("mx_floor_clipping", "fc1", "input", "columnwise", "nvfp4")},
                                          kOutlier);
  EXPECT_TRUE(w.gone);
  EXPECT_EQ(w.first, "none");
  EXPECT_EQ(w.elsewhere, "");
}

TEST(fix_judging_test, a_finding_at_the_named_place_remains_and_names_its_first_step) {
  const FindingVerdict v = judge_findings({finding("block_outlier", "fc2", "grad_output", "rowwise", "nvfp4", 1),
                                           finding("block_outlier", "fc1", "input", "columnwise", "nvfp4", 3)},
                                          kOutlier);
  EXPECT_FALSE(v.gone);
  EXPECT_EQ(v.first, "step 3, input in fc1");
  // The one elsewhere is still reported beside it.
  EXPECT_EQ(v.elsewhere, "step 1, fc2 grad_output rowwise (nvfp4)");
}

TEST(fix_judging_test, the_same_kind_elsewhere_is_reported_as_elsewhere_not_as_the_original_remaining) {
  const FindingVerdict v = judge_findings({finding("block_outlier", "fc2", "input", "columnwise", "nvfp4", 0),
                                           finding("block_outlier", "fc2", "grad_output", "rowwise", "nvfp4", 2)},
                                          kOutlier);
  EXPECT_TRUE(v.gone);
  EXPECT_EQ(v.first, "none");
  EXPECT_EQ(v.elsewhere, "step 0, fc2 input columnwise (nvfp4)");  // the first of them, in the report's order
}

// One finding of `kind` at the named place (fc1 input rowwise, nvfp4) and the findings that differ from it in one
// field each: whether each counts as the original.
struct Variation {
  const char* what;
  analysis::Fp8Finding f;
};

std::vector<Variation> variations(const std::string& kind, const std::string& format) {
  return {{"identical", finding(kind, "fc1", "input", "rowwise", format)},
          {"another module", finding(kind, "fc2", "input", "rowwise", format)},
          {"another operand", finding(kind, "fc1", "weight", "rowwise", format)},
          {"another copy", finding(kind, "fc1", "input", "columnwise", format)},
          {"another format", finding(kind, "fc1", "input", "rowwise", format == "nvfp4" ? "mxfp8" : "e5m2")}};
}

void expect_matches(const std::string& kind, const std::string& format, std::vector<bool> want) {
  const FindingPlace named = place_of(finding(kind, "fc1", "input", "rowwise", format));
  const std::vector<Variation> vs = variations(kind, format);
  ASSERT_EQ(vs.size(), want.size());
  for (std::size_t i = 0; i < vs.size(); ++i) {
    EXPECT_EQ(same_place(named, vs[i].f), want[i]) << kind << ": " << vs[i].what;
    const FindingVerdict v = judge_findings({vs[i].f}, named);
    EXPECT_EQ(v.gone, !want[i]) << kind << ": " << vs[i].what;
    EXPECT_EQ(v.elsewhere.empty(), want[i]) << kind << ": " << vs[i].what;
  }
  // Another kind at the very place never matches.
  analysis::Fp8Finding other = vs[0].f;
  other.kind = kind == "block_outlier" ? "mx_floor_clipping" : "block_outlier";
  EXPECT_FALSE(same_place(named, other)) << kind;
}

TEST(fix_judging_test, each_kinds_place) {
  // module, operand, copy, format
  expect_matches("mx_floor_clipping", "mxfp8", {true, false, false, false, false});
  expect_matches("block_outlier", "nvfp4", {true, false, false, false, false});
  // module, operand, format: the copy named is the worse of the pair, not the place.
  expect_matches("block_copy_mismatch", "nvfp4", {true, false, false, true, false});
  // module: the Linear.
  expect_matches("block_error_dominates", "mxfp8", {true, false, true, true, true});
  expect_matches("fp8_error_dominates", "e4m3", {true, false, true, true, true});
  // module, operand (per-tensor FP8 has no copy; another format of the same operand is the same place).
  for (const char* kind : {"e4m3_grad_underflow", "stale_scale", "saturation"})
    expect_matches(kind, "e4m3", {true, false, false, true, true});
}

TEST(fix_judging_test, the_place_in_words_is_what_the_kind_compares) {
  EXPECT_EQ(place_text(place_of(finding("block_outlier", "fc1", "input", "columnwise", "nvfp4"))),
            "fc1 input columnwise (nvfp4)");
  EXPECT_EQ(place_text(place_of(finding("mx_floor_clipping", "fc1", "input", "rowwise", "mxfp8"))),
            "fc1 input rowwise (mxfp8)");
  EXPECT_EQ(place_text(place_of(finding("block_copy_mismatch", "fc2", "input", "columnwise", "nvfp4"))),
            "fc2 input copies (nvfp4)");
  EXPECT_EQ(place_text(place_of(finding("block_error_dominates", "fc1", "input", "rowwise", "mxfp8"))), "fc1");
  EXPECT_EQ(place_text(place_of(finding("fp8_error_dominates", "fc1", "weight", "", "e4m3"))), "fc1");
  EXPECT_EQ(place_text(place_of(finding("saturation", "fc1", "weight", "", "e4m3"))), "fc1 weight");
}

}  // namespace
}  // namespace ampscope::samples
