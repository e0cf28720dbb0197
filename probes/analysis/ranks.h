// probes/analysis/ranks.h: a data-parallel run's traces, one per rank (`ampscope train --ddp --out run.h5`
// writes run.rank0.h5, run.rank1.h5, ...): finding a run's rank traces from one name, a trace's rank, and the
// two comparisons `ampscope diff` makes of them (docs/distributed.md, "Comparing data-parallel runs"):
//  - two runs of N ranks each (an fp16 run against an fp32 one, a run against a changed one): rank r of a
//    against rank r of b for every r, each an ordinary diff (analysis_diff.h), and the first divergence
//    across the ranks (diff_ranks);
//  - two ranks of one run: they train on different shares of the batch, so their forward values and losses
//    differ by design; what must be identical on every rank is what the all-reduce and the GradScaler's one
//    decision made: the gradients after the all-reduce and each step's scale, skip and gradient norm
//    (check_rank_pair).
// Reads only trace rows: no runtime, no MPI; the viewer uses it too.
//
//   std::vector<std::string> a = analysis::rank_siblings({"fp16.h5"}), b = analysis::rank_siblings({"fp32.h5"});
//   analysis::RankDiffReport d = analysis::diff_ranks(a, b);
//   if (d.first) fmt::print("rank {} parts first, at step {}\n", d.first->rank, d.first->step);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "probes/analysis/diff.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"

namespace ampscope::analysis {

// The traces of the data-parallel run `given` names: all the names when there are several; for one name,
// its siblings STEM.rank0.EXT, STEM.rank1.EXT, ... when it is one of them (run.rank1.h5) or when it names
// the run's --out (run.h5) and no such file exists but run.rank0.h5 does. Empty when `given` is one
// ordinary trace (or fewer than two siblings exist).
std::vector<std::string> rank_siblings(const std::vector<std::string>& given);

// A trace's place in its data-parallel run: its config's "rank" and "world_size" (`train --ddp` writes both).
struct RankPlace {
  int rank = 0;
  int world_size = 1;
};
// Nullopt for a trace that is not a rank of a data-parallel run (a config without both fields, or not JSON).
std::optional<RankPlace> rank_place(const trace::RunInfo& run);

// True when the two traces are ranks of one run's configuration: both carry a rank, of the same world size,
// and their configs are equal without the rank-local fields ("rank" and "device", as the ranks compare
// them when they start). Their ranks may be equal (the same file twice).
bool same_run(const trace::RunInfo& a, const trace::RunInfo& b);

// ---- how each rank's trace ended (the multi-rank report) ----

// One rank's trace: whether its writer closed it, whether a writer holds it now, whether the last writer
// noted a SIGTERM (trace::writer_state), and its last durable step (the last /index row's).
struct RankEnd {
  int rank = 0;
  bool complete = false;
  bool writing = false;
  bool terminated = false;
  std::optional<std::int64_t> last_step;
  // Not closed and not being written: the rank's process ended before the run did.
  bool stopped() const { return !complete && !writing; }
};

// Which ranks ended early. A rank ended early when its trace was not closed, nobody writes it, and either it
// stops at an earlier step than another rank's (fewer durable steps), or, all stopping at the same step, its
// writer died without notice while another rank's was closed, is still writing, or was ended by SIGTERM
// (mpirun's, to the other ranks, after one died). Every rank stopped at one step without notice: the traces
// cannot tell which went first (`together`).
struct RankEnds {
  std::vector<RankEnd> ranks;     // by rank
  std::vector<int> ended_early;   // the ranks that ended early, ascending
  std::vector<int> stopped;       // every rank whose trace was not closed and is not being written
  bool together = false;          // stopped ranks, none of which can be named
  // The run as a whole finished (or is still running): no rank stopped.
  bool finished() const { return stopped.empty(); }
};
RankEnds rank_ends(std::vector<RankEnd> ranks);
// A rank's trace as RankEnd sees it: its reader's complete() and last_flushed_step(), its lock file.
RankEnd rank_end_of(const trace::TraceReader& reader, int rank);

// The lines the multi-rank report prints about it (empty when every rank finished or is still running), and
// its status for one rank's line of the list ("" when closed; "ENDED EARLY", "ended by SIGTERM",
// "incomplete: still being written", "incomplete: not closed by its writer").
std::string render_text(const RankEnds& ends);
std::string end_status(const RankEnds& ends, int rank);

// ---- two ranks of one run ----

// Something that must be the same on every rank and is not. `what`: "scale", "scale_after", "skipped",
// "found_inf", "growth_tracker", "grad_norm", "lr" (a /steps field), "gradient" (a /grads row: its dtype,
// NaN/inf or zero counts, absmax or norm), "gradient in one rank only", "step in one rank only".
struct RankMismatch {
  std::int64_t step = 0;
  std::string what;
  std::string param;           // the parameter, for a gradient
  std::string value_a, value_b; // as text, exactly ("0.0123456789012345", "true", "NaN 0, +inf 3")
};

struct RankPairCheck {
  RankPlace a, b;
  std::int64_t steps_compared = 0;   // steps recorded by both ranks
  std::int64_t grads_compared = 0;   // gradient rows (step, parameter, scaled or unscaled) recorded by both
  std::int64_t mismatch_count = 0;
  std::vector<RankMismatch> mismatches;  // the first kMaxMismatches, in step order (per step: /steps, then /grads)
  bool agree() const { return mismatch_count == 0; }
};
inline constexpr std::size_t kMaxMismatches = 20;

// Compares, bit for bit, what the all-reduce and the shared GradScaler decision make identical on every
// rank: each step's scale, scale_after, skipped, found_inf, growth_tracker, grad_norm and lr, and each /grads
// row (the gradients after the all-reduce) by (step, parameter, unscaled). The loss, the time and every op
// row differ by design (each rank's own share of the batch) and are not compared here. Throws Error when the
// traces are not two ranks of one run (same_run).
RankPairCheck check_rank_pair(trace::TraceReader& a, trace::TraceReader& b);

// The lines `ampscope diff` prints first for two ranks of one run, and the JSON object ranks_of_one_run.
std::string render_text(const RankPairCheck& check, const TextStyle& style = {});
std::string render_json_object(const RankPairCheck& check);  // one JSON object (no trailing newline)

// ---- two runs of N ranks each ----

// Where a rank's diff parts first, and what the earliest of them across ranks is.
struct RankDivergence {
  int rank = 0;
  std::int64_t step = 0, step_b = 0;  // a's step, and b's own (they differ when steps pair by update)
  // "op" (DiffReport::first_divergence), "loss" (first_loss_divergence) or "gradient" (first_grad_divergence)
  std::string kind;
  trace::Phase phase = trace::Phase::forward;  // for an op
  std::int64_t seq = -1;                        // for an op: its seq in a
  std::string module{}, op{}, param{}, stat{};  // op: module, op, stat; gradient: param, stat
  std::string detail{};                         // the diff's own sentence ("NaN/inf counts differ: ...")
};

// A rank's earliest divergence: by step, then by where in the step it happens (a forward op, the loss, a
// backward op, the gradients after the backward, an optimizer or scaler op), then by seq. Nullopt when the
// rank's diff does not diverge.
std::optional<RankDivergence> first_divergence_of(const DiffReport& d, int rank);

struct RankDiffReport {
  int ranks = 0;
  std::vector<std::string> paths_a, paths_b;  // by rank
  std::vector<DiffReport> diffs;              // by rank: rank r of a against rank r of b
  std::vector<std::optional<RankDivergence>> firsts;  // by rank
  // The earliest across ranks: by step, then where in the step (first_divergence_of), then the rank.
  std::optional<RankDivergence> first;
  // The traces whose writer did not close them (killed, failed or still running: only the steps they hold were
  // compared), a's then b's, by rank.
  std::vector<std::string> incomplete;
  bool diverged() const { return first.has_value(); }
};

// Opens every trace, checks that each side holds ranks 0 to N-1 of one run of N ranks (any order given) and
// that both have the same N, and diffs rank r with rank r. Throws Error (mismatched rank counts, a trace
// without a rank, ranks missing or repeated) naming the traces, and TraceError for a file that cannot be read.
RankDiffReport diff_ranks(const std::vector<std::string>& paths_a, const std::vector<std::string>& paths_b,
                          const DiffOptions& options = {});

std::string render_text(const RankDiffReport& d, const TextStyle& style = {});
std::string render_json(const RankDiffReport& d);

}  // namespace ampscope::analysis
