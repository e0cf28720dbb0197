// core/io/fp8_checkpoint.h: an FP8 run's scaling state (core/fp8_linear.h Fp8Context) as the checkpoint's "fp8"
// StateDict, so that `ampscope train --precision fp8 --resume` with the delayed recipe continues the saved run
// bit for bit (docs/checkpoints.md, "FP8 state").
//
//   ck.states["fp8"] = fp8_state_dict(*fp8);                        // saving
//   load_fp8_state_dict(*fp8, ck.states.at("fp8"), modules, path);   // resuming, into a fresh context
//
// The keys (version 1; every one required, no others):
//   version       i64 1
//   recipe        "delayed" or "current";  format "hybrid" or "e4m3"
//   amax_history  i64, amax_algo "max" or "most_recent", margin f64: the delayed recipe's settings
//   modules       i64 n, the Linears that ran in FP8 (delayed recipe; 0 with current scaling, which keeps nothing)
//   module.<i>    the i-th one's module path (i from 0, in path order)
//   module.<i>.<operand>.amax_history   f32 [amax_history]   (operand: input, weight, grad_output)
//   module.<i>.<operand>.scale          f32 [2]: scale, scale_inv
// A file is hostile input: the settings must equal the context's (another recipe, format, history length,
// algorithm or margin would not continue the saved run: refused, naming both), n is at most the number of the
// model's modules, every path is one of them and appears once, every history has the recipe's length and no
// negative amax, every scale is finite and positive with scale_inv its reciprocal in float, as the recipe makes
// them. Anything else throws CheckpointError naming the file and the key, and leaves the context unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8_linear.h"
#include "core/io/state_dict.h"

namespace ampscope {

inline constexpr std::int64_t kFp8StateVersion = 1;

StateDict fp8_state_dict(const Fp8Context& context);

// Replaces the context's per-module states with the saved ones. `module_paths`: the model's module paths;
// `file`: the checkpoint, for messages.
void load_fp8_state_dict(Fp8Context& context, const StateDict& saved, const std::vector<std::string>& module_paths,
                         const std::string& file);

// A block-scaled run's state (recipe mxfp8 or nvfp4) as the checkpoint's "block" StateDict. The keys (version 1;
// every one required, no others):
//   version        i64 1
//   recipe         "mxfp8" or "nvfp4"; mx_scale "round-up" or "floor"; rht i64 0 or 1
//   random_offset  i64 >= 0: the Philox offset NVFP4's next stochastic rounding draws from
//                  (Fp8Context::random_offset), so that a resumed run continues bit for bit
// The settings must equal the context's (refused, naming both, otherwise); anything else throws CheckpointError
// naming the file and the key, and leaves the context unchanged.
inline constexpr std::int64_t kBlockStateVersion = 1;
StateDict block_state_dict(const Fp8Context& context);
void load_block_state_dict(Fp8Context& context, const StateDict& saved, const std::string& file);

}  // namespace ampscope
