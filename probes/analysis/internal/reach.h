// probes/analysis/internal/reach.h: the one place that decides how a remedy can make an op compute in f32, from
// the autocast reason its /ops row recorded (trace::OpRow::autocast, docs/trace-format.md), and words that
// remedy. Every section that proposes f32 (the anomalies' remedies, their amplification root causes, the
// PRECISION section) asks here, so none proposes an autocast override for an op no override can reach.
// Internal to the analysis library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
//
//   f32_remedies({.op = "exp", .module = "loss", .dtype = "f16", .autocast = row.autocast}, "why", out);
//   // outside autocast ("" reason): a cast_f32 remedy (cast its input to f32); under autocast: autocast_fp32
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// How an op can be made to compute in f32.
enum class Reach {
  // It ran under autocast, as autocast's policy table (or an override) decided: an autocast override
  // (AutocastOverrideGuard, `ampscope train --autocast-fp32`) reaches it, whatever list it is on (an op on no
  // list too: the override comes before the table).
  autocast,
  // It ran under autocast but was called with an explicit dtype (softmax(x, dim, DType::f16)), which autocast
  // respects: only the call's dtype argument reaches it.
  explicit_dtype,
  // It ran outside any autocast region (its row has no autocast reason), in its inputs' dtype: an override
  // does nothing there; a cast of its input to f32 does (and what follows it outside autocast stays f32).
  outside_autocast,
};
// From the row's autocast reason and the phase of the row it is judged for (a backward row has no reason of
// its own: it is reached through its forward op, so only forward rows count as outside autocast).
Reach reach_of(std::string_view autocast_reason, trace::Phase phase);

// Whether an op that ran under autocast, given an f32 input, keeps computing in f32 (the fp32 list, no list,
// promote, an override to f32), rather than casting it back to f16/bf16 (lower_precision_fp, a step of a
// composite that runs in it, a dtype given in the call). Outside autocast: true (it runs in its inputs' dtype).
bool keeps_f32_input(std::string_view autocast_reason);

// An op to compute in f32.
struct F32Target {
  std::string op, module;  // module "" outside any module
  std::string dtype;       // the dtype it ran in (its output's)
  std::string autocast;    // its row's autocast reason ("" outside autocast)
  trace::Phase phase = trace::Phase::forward;
  // The override names every op of this name (an op pattern) rather than the op's module (a module pattern,
  // or the op when it is outside any module).
  bool by_op = false;
  // false: no /ops row says how it ran (a probe that filtered it out): an override is assumed to reach it.
  bool recorded = true;
};

// Appends the remedies that make `t` compute in f32, best first, each saying `why` (may be ""):
//   explicit_dtype, ran in f16/bf16    cast_f32: ask for f32 in the call's dtype argument;
//   outside_autocast, ran in f16/bf16  cast_f32: cast its input to f32 first;
//   otherwise                          autocast_fp32: an override for its module (or the op), and, with
//                                      every_block, the same for the layer in every block (blocks.*.attn).
void f32_remedies(const F32Target& t, const std::string& why, std::vector<Remedy>& out, bool every_block = true);

// "div in loss", "div (outside any module)".
std::string place_of(const std::string& op, const std::string& module);

}  // namespace ampscope::analysis::detail
