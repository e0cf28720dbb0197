// probes/analysis/precision.h: where precision was lost, from the f32 twin's rows (trace::PrecisionRow, the
// trace's /precision table): the rankings of the twin's rows (by the jump in accumulated error, by local error,
// by trend over steps) and the report's PRECISION section (analysis.h, PrecisionSection), built a step at a
// time beside the rest of the analysis. Trace rows in, conclusions out: no runtime.
//
//   std::vector<trace::PrecisionRow> rows = reader.precision();
//   for (const trace::PrecisionRow& r : analysis::rank_by_jump(rows)) fmt::print("{} {}: {}\n", r.op, r.module,
//                                                                                analysis::precision_jump(r));
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/trace/schema.h"

namespace ampscope::analysis {

// Significand bits of a dtype by name: f16 11, bf16 8, f32 24, f64 53 (24 for any other name).
int significand_bits_of(std::string_view dtype);

// What the twin computed a row's op in, the reference its errors are measured against (probes/twin.h): "f64"
// for a row whose output is f32 with local errors (an f32 op or autograd node twinned by `--twin-f64`) or whose
// output is f64; otherwise "f32" (f16/bf16 ops and nodes, an f32 op the f32 twin followed).
std::string reference_of(const trace::PrecisionRow& row);

// The jump in accumulated error at an op: the factor by which its output's accumulated mean relative error
// exceeds its inputs' (in_acc_mean_rel, taken as at least 2^-p of the output dtype, one rounding). The mean,
// not the max: one near-zero output of a matmul whose terms cancel is a large relative error of little
// consequence, while a cancellation that zeroes many outputs (1 - s with s rounded to 1) moves the mean.
// An op that passes on its inputs' error scores about 1; one that adds only its own rounding about 1 to 2.
double precision_jump(const trace::PrecisionRow& row);
// Where precision entered: the rows' ops (op and module), each with its row of the largest jump, largest
// jump first (ties: earlier step and seq first).
std::vector<trace::PrecisionRow> rank_by_jump(const std::vector<trace::PrecisionRow>& rows);
// The rows' ops (op and module), each with its row of the largest local mean relative error (what the op's
// own rounding costs), largest first (ties: earlier step and seq first); ops that ran in f32 are left out.
std::vector<trace::PrecisionRow> rank_by_local(const std::vector<trace::PrecisionRow>& rows);
// The backward rows (phase backward: an autograd node's local error, probes/twin.h): each node's op (the forward
// op and module it belongs to) with its row of the largest local mean relative error, largest first (ties:
// earlier step and seq first). rank_by_jump, rank_by_local and precision_trends take forward rows only.
std::vector<trace::PrecisionRow> rank_backward(const std::vector<trace::PrecisionRow>& rows);

// The trend of an op's accumulated error over steps: the least-squares slope of log2(acc_mean_rel) (as
// at least 2^-p of the output dtype) against the step, over the op's largest value per step; in bits per step
// lost (positive: the error grows). Ops seen on fewer than two steps are left out. Steepest first.
struct PrecisionTrend {
  std::string op, module;
  std::int64_t steps = 0;        // steps the op was twinned on
  double bits_per_step = 0;      // slope of log2(error)
  double first = 0, last = 0;    // acc_mean_rel on its first and last step
};
std::vector<PrecisionTrend> precision_trends(const std::vector<trace::PrecisionRow>& rows);

// Builds the PRECISION section a step at a time: each step's precision rows with the step's /ops rows (their
// provenance says which op produced each input: a chain of calls, the producer of a cancelled value).
class PrecisionAnalyser {
 public:
  PrecisionAnalyser();
  ~PrecisionAnalyser();
  PrecisionAnalyser(PrecisionAnalyser&&) noexcept;
  PrecisionAnalyser& operator=(PrecisionAnalyser&&) noexcept;
  void add_step(std::int64_t step, std::span<const trace::OpRow> ops, std::span<const trace::PrecisionRow> rows);
  PrecisionSection finish() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ampscope::analysis
