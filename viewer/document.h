// viewer/document.h: a trace opened in the viewer. Opening reads only the run info and the /steps table,
// so a trace of millions of op rows opens at once; the ops (and histograms, events) of the selected step
// are read on demand on a background thread, and the analysis (probes/analysis/analysis.h) runs on another,
// reporting its progress. The document opens the file once; its jobs share that reader and take turns (a
// block of rows each) through the reader's own lock (SharedReader). A comparison opens its own readers,
// so it never waits for a document nor makes one wait. A trace still being written is refreshed about
// once a second and new steps are appended. A step whose read failed is read again when selected again.
// Nothing here throws: an unreadable file gives error().
//
//   auto doc = TraceDocument::open("run.h5");        // never throws
//   if (!doc->ok()) show(doc->error());
//   doc->select_step(3);
//   every frame: doc->poll();  if (const StepData* s = doc->step_data()) draw(s->ops);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/trace/reader.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {

// The rows of one step, read together.
struct StepData {
  std::int64_t step = 0;
  std::uint64_t load_id = 0;  // unique per read, across documents: tells a view its cached rows are stale
  std::vector<trace::OpRow> ops;
  std::vector<trace::HistogramRow> histograms;
  std::vector<trace::EventRow> events;
  double read_ms = 0;
};

// A reader and the lock its users take turns through: a TraceReader is used by one thread at a time.
struct SharedReader {
  explicit SharedReader(const std::filesystem::path& path) : reader(path) {}
  std::mutex mutex;
  trace::TraceReader reader;  // use only while holding mutex
};

// Reads one step's rows (ops, histograms, events), holding the reader's lock; throws TraceError.
StepData read_step(SharedReader& reader, std::int64_t step);

// Held shared by every job that has its own second reader of a file open (a comparison), and exclusively
// by a live refresh: an H5Drefresh while another handle of the same file is open breaks that handle's
// chunk lookups (probes/trace/reader.cpp), so a live trace is not refreshed while a comparison runs.
std::shared_mutex& refresh_gate();

// Progress of a background job, and a way to stop it when the window closes.
struct JobControl {
  std::atomic<std::int64_t> done{0}, total{0};
  std::atomic<bool> cancel{false};
  double fraction() const {
    const auto t = total.load();
    return t > 0 ? static_cast<double>(done.load()) / static_cast<double>(t) : 0.0;
  }
};

class TraceDocument {
 public:
  struct Options {
    bool analyse = true;                                 // start the analysis at open
    // With analyse: read the early anomaly's step (early_anomaly()) before the analysis takes the reader, so a window
    // that shows it (app.h) has its rows without waiting for the analysis's first block. Off when another step will be
    // shown (--step, trace b).
    bool read_early_step = true;
    std::chrono::milliseconds live_interval{1000};       // refresh period of a trace still being written
    // Smaller blocks than analyse()'s default, so the selected step's rows wait less for their turn.
    analysis::AnalysisOptions analysis{.rows_per_read = 50000};
  };

  // Never throws: a file that cannot be read gives a document whose error() says why.
  static std::unique_ptr<TraceDocument> open(const std::filesystem::path& path, Options options);
  static std::unique_ptr<TraceDocument> open(const std::filesystem::path& path) { return open(path, Options{}); }
  ~TraceDocument();  // stops and waits for the background jobs

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::filesystem::path& path() const { return path_; }
  const trace::RunInfo& run_info() const { return run_; }
  const std::vector<trace::StepRow>& steps() const { return steps_; }
  const trace::RowCounts& counts() const { return counts_; }
  bool complete() const { return complete_; }
  bool live() const { return ok() && !complete_; }
  double open_ms() const { return open_ms_; }
  // The first anomaly the trace's /events and /steps name (view_model.h, early_anomaly), found at open from /steps
  // (already read) and the /events rows of the first steps: a few reads of /events from the first step on, each
  // range twice the last, until one holds an anomaly event of a recorded step (or passes the first step /steps
  // flags), at most 100,000 event rows (then /steps alone decides). No /ops row is read. nullopt when neither table names one, when /events is absent (format versions
  // before it) and /steps flags nothing, or for a live trace's steps written after the open. A damaged /events is
  // left to the analysis to report: then /steps alone decides.
  const std::optional<EarlyAnomaly>& early_anomaly() const { return early_; }

  // Picks up finished background work and, for a live trace, refreshes about once a second. Call once a
  // frame from the UI thread; true when something visible changed.
  bool poll();

  // The analysis: null until it has finished; its progress meanwhile; its error if it failed.
  const analysis::Report* report() const { return report_ ? &*report_ : nullptr; }
  bool analysing() const { return analysis_.valid(); }
  double analysis_progress() const { return analysis_control_ ? analysis_control_->fraction() : 0.0; }
  const std::string& analysis_error() const { return analysis_error_; }
  void start_analysis();
  // Starts the analysis of a document opened without it (Options::analyse false: a data-parallel run's
  // ranks not shown yet), and runs it again after live refreshes from then on. Nothing when it has run.
  void enable_analysis();

  // The f32 twin's rows as the Precision panel's heatmap (view_model.h): read (a block of steps per turn of
  // the reader's lock) and built on a background thread when the analysis starts, for a trace with
  // /precision rows. Null until built (and for a trace without them); its error if the read failed.
  const PrecisionMap* precision() const { return precision_ ? &*precision_ : nullptr; }
  bool precision_loading() const { return precision_job_.valid(); }
  const std::string& precision_error() const { return precision_error_; }

  // The /fp8 rows of a --precision fp8 run as the FP8 panel's heatmap (view_model.h, Fp8Map): read and built on a
  // background thread as the precision map is, for a trace with /fp8 rows. Null until built (and for a trace
  // without them); its error if the read failed.
  const Fp8Map* fp8() const { return fp8_ ? &*fp8_ : nullptr; }
  bool fp8_loading() const { return fp8_job_.valid(); }
  const std::string& fp8_error() const { return fp8_error_; }

  // The /blocks rows (block-scaled formats, --what-if) as the Blocks panel's heatmap (view_model.h, BlockMap), read
  // and built as the FP8 map is, for a trace with /blocks rows.
  const BlockMap* blocks() const { return blocks_ ? &*blocks_ : nullptr; }
  bool blocks_loading() const { return blocks_job_.valid(); }
  const std::string& blocks_error() const { return blocks_error_; }

  // The step whose rows the panels show. The rows arrive later (step_data() null meanwhile). Selecting
  // the step already selected does nothing, unless its read failed (step_error()): then it is read again. Selecting
  // the step whose rows were read last (the early anomaly's, read at open) reads nothing again.
  void select_step(std::int64_t step);
  std::optional<std::int64_t> selected_step() const { return selected_; }
  const StepData* step_data() const { return step_ && selected_ && step_->step == *selected_ ? &*step_ : nullptr; }
  bool step_loading() const { return step_job_.valid() || (selected_ && !step_data() && step_error_.empty()); }
  const std::string& step_error() const { return step_error_; }

  // Waits until the analysis and the selected step's rows are in (headless screenshots, tests).
  void wait_idle();

 private:
  TraceDocument() = default;
  void refresh_live();
  void start_step_job(std::int64_t step);
  void start_precision();
  void start_fp8();
  void start_blocks();

  Options options_;
  std::filesystem::path path_;
  std::string error_;
  std::shared_ptr<SharedReader> reader_;  // shared with the jobs, used under its lock
  trace::RunInfo run_;
  std::vector<trace::StepRow> steps_;
  trace::RowCounts counts_;
  bool complete_ = true;
  double open_ms_ = 0;
  std::optional<EarlyAnomaly> early_;
  std::chrono::steady_clock::time_point last_refresh_;
  bool reanalyse_ = false;  // steps arrived while the analysis ran: run it again when it ends

  std::shared_ptr<JobControl> analysis_control_;
  std::future<analysis::Report> analysis_;
  std::optional<analysis::Report> report_;
  std::string analysis_error_;

  std::shared_ptr<JobControl> precision_control_;
  std::future<PrecisionMap> precision_job_;
  std::optional<PrecisionMap> precision_;
  std::string precision_error_;
  bool reprecision_ = false;  // steps arrived while the map was built: build it again when it ends

  std::shared_ptr<JobControl> fp8_control_;
  std::future<Fp8Map> fp8_job_;
  std::optional<Fp8Map> fp8_;
  std::string fp8_error_;
  bool refp8_ = false;  // steps arrived while the map was built: build it again when it ends

  std::shared_ptr<JobControl> blocks_control_;
  std::future<BlockMap> blocks_job_;
  std::optional<BlockMap> blocks_;
  std::string blocks_error_;
  bool reblocks_ = false;  // steps arrived while the map was built: build it again when it ends

  std::optional<std::int64_t> selected_;
  std::future<StepData> step_job_;
  std::int64_t step_job_step_ = 0;  // the step step_job_ reads: its failure is only news for that step
  std::optional<StepData> step_;
  std::string step_error_;
};

// Two traces compared (Compare panel): the diff of probes/analysis/diff.h on a background thread, over
// readers of its own that only that thread uses (opened and closed there), so the documents' step reads
// and analyses go on meanwhile.
class Comparison {
 public:
  struct Options {
    analysis::DiffOptions diff;
    // Called on the comparison's thread after each block of steps, with the rows done and the total
    // (tests hold a comparison half-way through with it); may throw to stop the comparison.
    analysis::DiffProgress on_progress;
  };
  Comparison(const std::filesystem::path& a, const std::filesystem::path& b, Options options);
  Comparison(const std::filesystem::path& a, const std::filesystem::path& b) : Comparison(a, b, Options{}) {}
  ~Comparison();  // stops the diff at its next block and waits for it
  bool poll();  // true when the diff has just finished
  const analysis::DiffReport* report() const { return report_ ? &*report_ : nullptr; }
  bool running() const { return job_.valid(); }
  double progress() const { return control_->fraction(); }
  const std::string& error() const { return error_; }

 private:
  std::shared_ptr<JobControl> control_ = std::make_shared<JobControl>();
  std::future<analysis::DiffReport> job_;
  std::optional<analysis::DiffReport> report_;
  std::string error_;
};

}  // namespace ampscope::viewer
