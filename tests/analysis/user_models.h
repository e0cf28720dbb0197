// tests/analysis/user_models.h: models the analysis rules were NOT written against, written as a user
// writes them with the public API (docs/api.md): nn modules, ops, AutocastGuard, GradScaler, AdamW/Adam/
// SGD, probe::Probe + trace::TraceWriter at level health. Each trains for a few steps on the CPU backend
// and writes a trace, in fp32, fp16 (autocast + GradScaler) or bf16, so a test can check that the f16
// failure happens, that fp32 is clean, and that a remedy, applied through the config, makes it go away.
//
//   RunConfig c = default_config(Model::tagger);       // the failing f16 run
//   c.trace_path = "/tmp/tagger.h5";
//   RunResult r = run(c);                               // trains and writes the trace
//   std::optional<trace::OpRow> o = first_origin(r.trace_path);   // step, op, module of the first NaN/inf
//   apply_override(c, "sigmoid", /*is_op=*/true);       // the same run with sigmoid kept in f32
//
// The models and what goes wrong in f16 (each .cpp section says why, with the numbers):
//   tagger    residual MLP tagger, hand-written BCE on sigmoid probabilities: sigmoid rounds to 1.0,
//             1 - s cancels to 0, log(0) = -inf, 0 * -inf = NaN (the loss).
//   handnorm  MLP with batch normalisation written by hand, (x - mean) / sqrt(var + 1e-8), after a ReLU:
//             a unit dead over the whole batch has var 0, 1e-8 rounds to 0 in f16, 0 / 0 = NaN.
//   lse       classifier whose loss is log(sum(exp(logits))) - logit[label], computed after the autocast
//             region on the f16 logits: exp runs in f16 and overflows once a logit passes 11.09.
//   rmsnorm   regression MLP whose blocks.1 has a hand-written RMS norm x * rsqrt(mean(x * x)): on a
//             batch of large raw readings x * x overflows f16 for |x| > 256, rsqrt(inf) = 0, the block's
//             output becomes its bias on those rows. Silent: finite loss, finite gradients, no skip.
//   pairs     dual encoder matching two views of the same record, CLIP-style: cosine similarities times a
//             learned logit scale started at 100, the user's cross-entropy written by hand after the
//             autocast region: the scale makes the logits 100 times the similarities, exp (f16, outside
//             autocast) overflows once a logit passes 11.09.
//   attention sequence classifier with attention written by hand on raw readings, scores = q k^T without
//             the 1/sqrt(d): the 64-term dot products of q and k pass 65504 and bmm returns inf.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "probes/trace/schema.h"

namespace ampscope::user_models {

enum class Model { tagger, handnorm, lse, rmsnorm, pairs, attention };
std::string_view model_name(Model model);

enum class Precision { fp32, fp16, bf16 };
std::string_view precision_name(Precision precision);

// One autocast override that keeps matching ops in f32 (AutocastOverrideGuard with Precision::f32):
// `pattern` is a glob on the op name (is_op) or on the module path of the op.
struct F32Override {
  std::string pattern;
  bool is_op = true;
};

struct RunConfig {
  Model model = Model::tagger;
  Precision precision = Precision::fp16;  // fp16 and bf16: forward and loss inside AutocastGuard
  std::int64_t steps = 20;
  std::uint64_t seed = 0;   // the model's initialisation and the data
  double lr = 1e-3;
  double init_scale = 65536.0;
  bool use_scaler = true;   // a GradScaler (fp16 and bf16 runs only; fp32 never scales)
  std::vector<F32Override> f32_overrides{};  // applied for the whole run
  // tagger: clamp(s, eps) and clamp(1 - s, eps) before each log (nullopt: no clamp, the user's code),
  // or binary_cross_entropy_with_logits on the logits instead of the hand-written loss.
  std::optional<double> clamp_eps{};
  bool use_logits_loss = false;
  // handnorm: the eps of the hand-written normalisation, sqrt(var + eps).
  double norm_eps = 1e-8;
  // lse: where the loss runs. false (the user's code): after the autocast region, on the f16 logits, so
  // exp runs in f16. true: inside the region, where autocast's table runs exp in f32.
  bool loss_in_autocast = false;
  // lse and pairs: the loss casts the logits to f32 first (logits.to(DType::f32)), so exp runs in f32 outside
  // the region too.
  bool loss_cast_f32 = false;
  // pairs: the logit scale's initial value (the parameter starts at its log), and the loss written as a
  // stable log-sum-exp (the row's max subtracted before exp).
  double logit_scale = 100.0;
  bool subtract_max = false;
  // attention: q multiplied by this factor before the product (1: the user's code, no 1/sqrt(d)).
  double q_scale = 1.0;
  // Record the f32 twin too (probe::Twin around the probe, as `ampscope train --twin`): /precision rows.
  bool twin = false;
  // The trace (probe level health). Required.
  std::string trace_path{};
};

// The failing f16 run of each model: precision fp16, its seed, lr and step count.
RunConfig default_config(Model model);

// Remedy helpers, so that a test (or a remedy from the report) can re-run the same config changed.
void apply_override(RunConfig& config, const std::string& pattern, bool is_op);
void set_precision(RunConfig& config, Precision precision);

struct RunResult {
  std::string trace_path;
  std::vector<double> losses;          // per step, as loss.item() saw it (NaN/inf kept)
  std::vector<bool> skipped;           // per step: the GradScaler skipped the optimizer step
  std::int64_t origins = 0;            // the probe's count of NaN/inf origins
  std::int64_t first_nonfinite_loss = -1;  // step, -1 when every loss was finite
  // Per step, the model's output (the logits or predictions), widened to double: a test derives from
  // these what the f16 rounding must do, independently of the probe.
  std::vector<std::vector<double>> outputs;
  // handnorm only: per step, for norm1 and norm2 (module path, count), the columns of the norm's input
  // that hold the same value on every row of the batch (a ReLU unit dead over the batch): var = 0.
  std::vector<std::vector<std::pair<std::string, std::int64_t>>> constant_columns;
  // pairs only: per step, the similarities (before the logit scale) and the logit scale, as computed.
  std::vector<std::vector<double>> similarities;
  std::vector<double> logit_scales;
  // attention only: per step, q and k as the scores' bmm took them (row-major [batch, T, 64]).
  std::vector<std::vector<double>> queries, keys;
  // rmsnorm only: per step, the input of blocks.1.norm (row-major [batch, 32]).
  std::vector<std::vector<double>> norm_inputs;
  // rmsnorm only: per step, how many rows of blocks.1's output were exactly blocks.1.fc's bias (what
  // the block gives when its norm returns zeros), computed from the tensors, not from the trace.
  std::vector<std::int64_t> bias_rows;
  std::int64_t batch = 0;              // rows per step
  std::int64_t skipped_steps() const;
};

// Trains the model as `config` says and writes the trace; throws on a bad config.
RunResult run(const RunConfig& config);

// The first op row of the trace marked as a NaN/inf origin (in step, then seq order), if any.
std::optional<trace::OpRow> first_origin(const std::string& trace_path);
// Op rows of the trace whose output held NaN or inf.
std::int64_t nonfinite_op_rows(const std::string& trace_path);

}  // namespace ampscope::user_models
