// probes/trace/reader.h: reads an ampscope trace (docs/trace-format.md): a finished one, one still being
// written (HDF5 SWMR: call refresh() to see new rows), or one whose writer was killed (every step flushed
// before the kill is there). Rows are read by step range, table by table, into the structs of
// probes/trace/schema.h. Needs only HDF5: no runtime, no CUDA.
//
//   trace::TraceReader r("run.h5");            // throws TraceError: not HDF5, not a trace, newer version...
//   for (const trace::OpRow& op : r.ops(10, 12)) fmt::print("{} {} {}\n", op.step, op.op, op.health.absmax);
//   if (!r.complete()) fmt::print("the run did not finish (or is still running)\n");
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "probes/trace/error.h"
#include "probes/trace/schema.h"

namespace ampscope::trace {

// Row counts of the tables, as far as the last flush the reader has seen.
struct RowCounts {
  std::int64_t steps = 0, ops = 0, grads = 0, events = 0, histograms = 0, dumps = 0;
  std::int64_t precision = 0;  // format_version 5 (0 for older traces)
  std::int64_t updates = 0;    // format_version 5 (0 for older traces)
  std::int64_t checksums = 0;  // format_version 6 (0 for older traces)
  std::int64_t fp8 = 0;        // format_version 7 (0 for older traces)
  std::int64_t blocks = 0;     // format_version 8 (0 for older traces)
};

// Which /grads rows grads() returns: the gradients the step used (after a data-parallel all-reduce: the only
// rows of a single-process run and of traces before format_version 6), a --ddp rank's own gradients before
// the all-reduce (format_version 6), or both, as written.
enum class GradRows { used, before_all_reduce, all };

inline constexpr std::int64_t kFirstStep = std::numeric_limits<std::int64_t>::min();
inline constexpr std::int64_t kLastStep = std::numeric_limits<std::int64_t>::max();

class TraceReader {
 public:
  // Opens and checks the file: TraceError when it is missing, not HDF5, damaged, not an ampscope trace,
  // or of a newer format_version than this build reads (kFormatVersion).
  explicit TraceReader(const std::filesystem::path& path);
  ~TraceReader();
  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;

  const std::filesystem::path& path() const;
  const RunInfo& run_info() const;
  std::int64_t format_version() const;
  // True once the writer closed the file cleanly (root attribute complete = 1). False while it is still
  // being written, and forever when the writer was killed or failed.
  bool complete() const;
  // The step of the last flush seen (the last end_step before it), if any.
  std::optional<std::int64_t> last_flushed_step() const;
  RowCounts row_counts() const;
  // Damage found in a trace whose rest is readable, one note each (empty for a sound trace): an /index
  // row that is damaged (its rows then come from the rows before it, or from the tables of a complete
  // trace), rows counted but not in the file ("N rows lost"; lost /steps rows are lost steps), a config or
  // probe attribute that is not JSON. Damage that leaves nothing trustworthy throws TraceError instead.
  std::vector<std::string> damage() const;

  // Sees what a writer still running has flushed since the open or the last refresh (no-op otherwise).
  void refresh();

  // Rows with begin <= step < end, in the order they were written.
  std::vector<StepRow> steps(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  std::vector<OpRow> ops(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // The same rows into `rows`, replacing what it held. A caller reading /ops block by block through one vector
  // reuses its memory: a fresh vector of 200,000 rows (70 MB) at every block costs the kernel's page faults
  // and zeroing again, about a third of a report's system time (issue 37).
  void ops(std::int64_t begin, std::int64_t end, std::vector<OpRow>& rows);
  // The same with only the text fields `texts` asks for (the others empty; traces before format_version 4, whose
  // texts are fixed-width fields, fill them all): a pass that reads few of them decodes less. A text left out is not
  // checked either: its row reads even when that string of /strings is damaged.
  void ops(std::int64_t begin, std::int64_t end, std::vector<OpRow>& rows, const OpTexts& texts);
  std::vector<GradRow> grads(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep, GradRows which = GradRows::used);
  std::vector<EventRow> events(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  std::vector<HistogramRow> histograms(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  std::vector<DumpRow> dumps(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // The f32 twin's rows (format_version 5; none in older traces, nor in a run without --twin).
  std::vector<PrecisionRow> precision(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // Swamped-update counts of f16/bf16 parameters (format_version 5; none in older traces, nor in a run whose
  // parameters are f32).
  std::vector<UpdateRow> updates(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // Parameter checksums after each step (format_version 6; none in older traces, nor in a single-process run).
  std::vector<ChecksumRow> checksums(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // FP8 operand statistics (format_version 7; none in older traces, nor in a run that is not --precision fp8).
  std::vector<Fp8Row> fp8(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);
  // Block-scaled operand statistics (format_version 8; none in older traces, nor in a run that neither trains in
  // mxfp8/nvfp4 nor asks --what-if).
  std::vector<BlockRow> blocks(std::int64_t begin = kFirstStep, std::int64_t end = kLastStep);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ampscope::trace
