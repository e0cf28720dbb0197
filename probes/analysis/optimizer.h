// probes/analysis/optimizer.h: diagnoses of parameters that the optimizer itself turned NaN or infinite, from
// the trace's "nonfinite_update" events (docs/trace-format.md, /events; recorded by the probe for parameters
// stored in f16/bf16 when an update made finite elements non-finite). Trace rows in, conclusions out.
//
// The rule (docs/report-format.md, optimizer_eps_underflow): Adam or AdamW whose eps rounds to 0 in the dtype
// of its state (f16: any eps at or below 2^-25; 1e-8 is one), so that where the second moment v is 0 (a
// gradient exactly 0, or one whose square underflowed) the denominator sqrt(v) + eps is 0 and the update
// m / 0 is NaN (m = 0) or infinite. Other non-finite updates are diagnosed as "unknown", with what the event
// recorded. Only a step whose forward pass and whose gradient of that parameter were finite is judged: an
// update of non-finite gradients is propagation, not an origin.
//
//   for (analysis::Diagnosis& d : analysis::optimizer_diagnoses(step, events, grads)) report(d);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// True when a non-negative x, as the optimizer's f32 arithmetic holds it, rounds to 0 in `dtype` ("f16", "bf16",
// "f32"): it is at most half that dtype's smallest subnormal (f16: 2^-25; the tie goes to the even 0).
bool rounds_to_zero_in(double x, const std::string& dtype);

// One diagnosis per "nonfinite_update" event of `step` whose parameter's gradient rows (when there are any) are
// finite; phase optimizer, op the optimizer's name, module the parameter's name.
std::vector<Diagnosis> optimizer_diagnoses(std::int64_t step, std::span<const trace::EventRow> events,
                                           std::span<const trace::GradRow> grads);

}  // namespace ampscope::analysis
