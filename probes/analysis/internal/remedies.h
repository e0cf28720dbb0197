// probes/analysis/internal/remedies.h: the remedies of a diagnosis, best first, each in the two forms a user
// needs (the `ampscope train` option and the C++ for their own loop): remedies_of() picks one function per
// cause from the table kRemediesByCause (remedies.cpp); the single remedies below are what other rules add.
// Internal to the analysis library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
//
//   d.remedies = remedies_of(d, origin_row, rep.run.precision);
//   d.remedy = remedy_text(d.remedies);
#pragma once

#include <string>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/analysis/internal/provenance.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// Remedies for a diagnosis of row r, best first. run_precision: the run's ("fp16", ...; "" when unknown: the
// row's dtypes say). from_mask: the NaN came from a mask's -inf. amplification: what the root walk found
// amplified an overflow's values (d.root_cause "amplification"): its remedies come first.
std::vector<Remedy> remedies_of(const Diagnosis& d, const trace::OpRow& r, const std::string& run_precision,
                                bool from_mask = false, const Amplification* amplification = nullptr);
// The remedies' texts in one paragraph, each with its option: "...  (--lr 0.001); or ...".
std::string remedy_text(const std::vector<Remedy>& remedies);

Remedy simple(const char* kind, std::string text, std::string flag, std::string code, double value = 0);
Remedy bf16_remedy();
Remedy lr_remedy(double current);  // current: the run's learning rate (NaN when unknown)
Remedy zero_grad_remedy();

}  // namespace ampscope::analysis::detail
