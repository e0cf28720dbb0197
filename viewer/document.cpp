#include "viewer/document.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <span>

#include <fmt/format.h>

#include "probes/analysis/fix.h"
#include "viewer/view_model.h"

namespace ampscope::viewer {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Thrown from a progress callback to stop a job whose window has closed.
struct Cancelled {};

bool ready(const std::future<StepData>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}
template <class T>
bool is_ready(const std::future<T>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace

std::shared_mutex& refresh_gate() {
  static std::shared_mutex m;
  return m;
}

namespace {

template <class Row>
std::map<std::int64_t, std::vector<Row>> by_step(std::vector<Row> rows) {
  std::map<std::int64_t, std::vector<Row>> out;
  for (auto& r : rows) out[r.step].push_back(std::move(r));
  return out;
}

// A block's op rows grouped by step where they lie (spans into the block, which a stable sort puts in step order
// when it is not already), each step's rows in the order they were written: what by_step gives, without moving
// every row into a vector of its step (issue 37).
std::map<std::int64_t, std::span<const trace::OpRow>> group_by_step(std::vector<trace::OpRow>& rows) {
  auto by_step_order = [](const trace::OpRow& x, const trace::OpRow& y) { return x.step < y.step; };
  if (!std::is_sorted(rows.begin(), rows.end(), by_step_order)) std::stable_sort(rows.begin(), rows.end(), by_step_order);
  std::map<std::int64_t, std::span<const trace::OpRow>> out;
  for (auto first = rows.begin(); first != rows.end();) {
    auto last = std::find_if(first, rows.end(), [&](const trace::OpRow& r) { return r.step != first->step; });
    out.emplace_hint(out.end(), first->step, std::span<const trace::OpRow>(&*first, static_cast<std::size_t>(last - first)));
    first = last;
  }
  return out;
}

// analysis::analyse(reader) with the reader lock taken per block of steps rather than for the whole run,
// so the selected step's rows can be read in between.
analysis::Report analyse_in_turns(SharedReader& shared, const analysis::AnalysisOptions& options,
                                  JobControl& control) {
  std::unique_lock lock(shared.mutex);
  trace::TraceReader& reader = shared.reader;
  analysis::Analyser a(options);
  a.set_run(reader.run_info(), reader.path().string(), reader.complete());
  const std::vector<trace::StepRow> steps = reader.steps();
  const trace::RowCounts counts = reader.row_counts();
  lock.unlock();
  control.total = counts.ops;
  std::map<std::int64_t, const trace::StepRow*> step_rows;
  for (const auto& r : steps) step_rows[r.step] = &r;
  std::vector<std::int64_t> numbers;
  for (const auto& [n, _] : step_rows) numbers.push_back(n);
  // At least 1: a trace without steps or ops yet (a live run that has just started) divides by it.
  const std::int64_t per_step =
      std::max<std::int64_t>(1, numbers.empty() ? counts.ops : counts.ops / static_cast<std::int64_t>(numbers.size()));
  const std::size_t block = static_cast<std::size_t>(std::max<std::int64_t>(1, options.rows_per_read / per_step));
  std::int64_t done = 0;
  std::vector<trace::OpRow> op_rows;  // one block's rows; its memory is reused by the next block
  for (std::size_t i = 0; i == 0 || i < numbers.size(); i += block) {
    if (control.cancel) throw Cancelled{};
    // The last block is open-ended: rows of a step without a step row (a killed run's last step) count too.
    const std::int64_t begin = i == 0 ? trace::kFirstStep : numbers[i];
    const std::int64_t end = i + block >= numbers.size() ? trace::kLastStep : numbers[i + block];
    lock.lock();
    reader.ops(begin, end, op_rows);
    auto grads = by_step(reader.grads(begin, end));
    auto events = by_step(reader.events(begin, end));
    auto histograms = by_step(reader.histograms(begin, end));
    lock.unlock();
    const auto ops = group_by_step(op_rows);
    std::map<std::int64_t, bool> here;
    for (auto it = step_rows.lower_bound(begin); it != step_rows.end() && it->first < end; ++it) here[it->first] = true;
    for (const auto& [n, _] : ops) here[n] = true;
    for (const auto& [n, _] : grads) here[n] = true;
    for (const auto& [n, _] : events) here[n] = true;
    for (const auto& [n, _] : histograms) here[n] = true;
    for (const auto& [n, _] : here) {
      auto row = step_rows.find(n);
      const auto it = ops.find(n);
      const std::span<const trace::OpRow> step_ops = it == ops.end() ? std::span<const trace::OpRow>{} : it->second;
      a.add_step(n, row == step_rows.end() ? nullptr : row->second, step_ops, grads[n], events[n], histograms[n]);
      done += static_cast<std::int64_t>(step_ops.size());
    }
    control.done = done;
    if (numbers.empty()) break;
  }
  analysis::Report report = a.finish();
  lock.lock();
  report.damage = reader.damage();  // what the reader found damaged: the Overview shows it
  return report;
}

}  // namespace

// The rows of a table read by (reader.*read)(begin, end), a block of steps per turn of the reader's lock, so the
// selected step's rows wait little; then the rows after the last recorded step (an unfinished one).
template <class Row>
std::vector<Row> read_in_turns(SharedReader& reader, JobControl& control, const std::vector<std::int64_t>& steps,
                               std::vector<Row> (trace::TraceReader::*read)(std::int64_t, std::int64_t)) {
  constexpr std::size_t kStepsPerTurn = 64;
  control.total = static_cast<std::int64_t>(steps.size()) + 1;
  std::vector<Row> rows;
  for (std::size_t i = 0; i <= steps.size(); i += kStepsPerTurn) {
    if (control.cancel) throw Cancelled();
    const std::int64_t begin = i == 0 ? trace::kFirstStep : steps[i];
    const std::int64_t end = i + kStepsPerTurn >= steps.size() ? trace::kLastStep : steps[i + kStepsPerTurn];
    std::lock_guard lock(reader.mutex);
    auto block = (reader.reader.*read)(begin, end);
    rows.insert(rows.end(), std::make_move_iterator(block.begin()), std::make_move_iterator(block.end()));
    control.done = static_cast<std::int64_t>(std::min(i + kStepsPerTurn, steps.size() + 1));
    if (end == trace::kLastStep) break;
  }
  return rows;
}

namespace {

// At most this many /events rows are read at open (about 0.1 s): every f16 run writes cast_underflow events, so a
// long run without an anomaly event early on could otherwise read its whole /events before the first frame.
constexpr std::int64_t kEarlyEventRows = 100000;

// TraceDocument::early_anomaly: /events read from the first recorded step on, 1, 2, 4... steps at a time (no range
// expected to hold more than kEarlyEventRows), so a trace whose first anomaly is early reads little of /events; past
// kEarlyEventRows rows the step rows alone decide. Each range is found by binary search (or the table's step index).
std::optional<EarlyAnomaly> find_early_anomaly(trace::TraceReader& reader, const std::vector<trace::StepRow>& steps,
                                               std::int64_t event_rows) {
  const std::optional<EarlyAnomaly> from_steps = early_anomaly(steps, {});
  if (event_rows <= 0) return from_steps;
  std::vector<std::int64_t> numbers;
  numbers.reserve(steps.size());
  for (const trace::StepRow& r : steps) numbers.push_back(r.step);
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  const std::int64_t per_step = std::max<std::int64_t>(1, event_rows / static_cast<std::int64_t>(std::max<std::size_t>(1, numbers.size())));
  const std::size_t widest = static_cast<std::size_t>(std::max<std::int64_t>(1, kEarlyEventRows / per_step));
  std::int64_t read = 0;
  try {
    for (std::size_t i = 0, width = 1; i < numbers.size() && read < kEarlyEventRows;
         i += width, width = std::min(widest, width * 2)) {
      if (from_steps && numbers[i] > from_steps->step) break;  // no event before /steps' own can come after it
      const std::size_t j = std::min(numbers.size(), i + width);
      const std::int64_t begin = numbers[i];
      const std::int64_t end = j < numbers.size() ? numbers[j] : numbers.back() == trace::kLastStep ? trace::kLastStep : numbers.back() + 1;
      const std::vector<trace::EventRow> events = reader.events(begin, end);
      read += static_cast<std::int64_t>(events.size());
      const bool found = std::any_of(events.begin(), events.end(), [&](const trace::EventRow& e) {
        return is_anomaly_event(e.kind) && std::binary_search(numbers.begin(), numbers.end(), e.step);
      });
      // An event in this range comes before any later range's; /steps' flag may still come before it.
      if (found) return early_anomaly(steps, events);
    }
  } catch (const std::exception&) {
    // A damaged /events: the analysis reports it; the step rows alone decide here.
  }
  return from_steps;
}

}  // namespace

StepData read_step(SharedReader& shared, std::int64_t step) {
  const auto t0 = Clock::now();
  std::lock_guard lock(shared.mutex);
  trace::TraceReader& reader = shared.reader;
  static std::atomic<std::uint64_t> loads{0};
  StepData d;
  d.step = step;
  d.load_id = ++loads;
  // step + 1 would overflow for the last representable step (--step 9223372036854775807).
  const std::int64_t end = step == trace::kLastStep ? trace::kLastStep : step + 1;
  d.ops = reader.ops(step, end);
  d.histograms = reader.histograms(step, end);
  d.events = reader.events(step, end);
  d.read_ms = ms_since(t0);
  return d;
}

std::unique_ptr<TraceDocument> TraceDocument::open(const std::filesystem::path& path, Options options) {
  const auto t0 = Clock::now();
  std::unique_ptr<TraceDocument> doc(new TraceDocument());
  doc->options_ = options;
  doc->path_ = path;
  try {
    // No job has the reader yet: no lock needed.
    doc->reader_ = std::make_shared<SharedReader>(path);
    trace::TraceReader& r = doc->reader_->reader;
    doc->run_ = r.run_info();
    doc->complete_ = r.complete();
    doc->counts_ = r.row_counts();
    doc->steps_ = r.steps();
    doc->early_ = find_early_anomaly(r, doc->steps_, doc->counts_.events);
  } catch (const std::exception& e) {
    // TraceError says what is wrong with the file; anything else (bad_alloc on a damaged size) is shown too.
    doc->error_ = e.what();
    if (doc->error_.empty()) doc->error_ = "cannot read " + path.string();
    doc->reader_.reset();
    return doc;
  }
  doc->last_refresh_ = Clock::now();
  doc->open_ms_ = ms_since(t0);
  if (options.analyse && options.read_early_step && doc->early_) doc->start_step_job(doc->early_->step);
  if (options.analyse) doc->start_analysis();
  return doc;
}

TraceDocument::~TraceDocument() {
  if (analysis_control_) analysis_control_->cancel = true;
  if (precision_control_) precision_control_->cancel = true;
  if (fp8_control_) fp8_control_->cancel = true;
  if (blocks_control_) blocks_control_->cancel = true;
  if (analysis_.valid()) analysis_.wait();
  if (precision_job_.valid()) precision_job_.wait();
  if (fp8_job_.valid()) fp8_job_.wait();
  if (blocks_job_.valid()) blocks_job_.wait();
  if (step_job_.valid()) step_job_.wait();
}

void TraceDocument::start_precision() {
  if (!ok() || counts_.precision == 0) return;
  if (precision_job_.valid()) {
    reprecision_ = true;
    return;
  }
  precision_error_.clear();
  auto control = std::make_shared<JobControl>();
  precision_control_ = control;
  auto reader = reader_;
  std::vector<std::int64_t> steps;
  for (const trace::StepRow& r : steps_) steps.push_back(r.step);
  precision_job_ = std::async(std::launch::async, [reader, control, steps = std::move(steps)]() {
    return precision_map(read_in_turns(*reader, *control, steps, &trace::TraceReader::precision));
  });
}

void TraceDocument::start_fp8() {
  if (!ok() || !has_fp8_panel(counts_)) return;
  if (fp8_job_.valid()) {
    refp8_ = true;
    return;
  }
  fp8_error_.clear();
  auto control = std::make_shared<JobControl>();
  fp8_control_ = control;
  auto reader = reader_;
  std::vector<std::int64_t> steps;
  for (const trace::StepRow& r : steps_) steps.push_back(r.step);
  fp8_job_ = std::async(std::launch::async, [reader, control, steps = std::move(steps)]() {
    return fp8_map(read_in_turns(*reader, *control, steps, &trace::TraceReader::fp8));
  });
}

void TraceDocument::start_blocks() {
  if (!ok() || !has_blocks_panel(counts_)) return;
  if (blocks_job_.valid()) {
    reblocks_ = true;
    return;
  }
  blocks_error_.clear();
  auto control = std::make_shared<JobControl>();
  blocks_control_ = control;
  auto reader = reader_;
  std::vector<std::int64_t> steps;
  for (const trace::StepRow& r : steps_) steps.push_back(r.step);
  blocks_job_ = std::async(std::launch::async, [reader, control, steps = std::move(steps)]() {
    return block_map(read_in_turns(*reader, *control, steps, &trace::TraceReader::blocks));
  });
}

void TraceDocument::enable_analysis() {
  options_.analyse = true;
  if (!report_ && !analysis_.valid()) start_analysis();
}

void TraceDocument::start_analysis() {
  start_precision();
  start_fp8();
  start_blocks();
  if (!ok() || analysis_.valid()) return;
  analysis_error_.clear();
  auto control = std::make_shared<JobControl>();
  analysis_control_ = control;
  auto reader = reader_;
  const auto options = options_.analysis;
  const std::string path = path_.string();
  analysis_ = std::async(std::launch::async, [reader, options, control, path]() {
    analysis::Report report = analyse_in_turns(*reader, options, *control);
    // Remedies `ampscope fix` verified (its results file beside the trace); a damaged one is a note only.
    if (const std::string note = analysis::mark_verified(report, path); !note.empty())
      std::fprintf(stderr, "ampscope-view: %s\n", note.c_str());
    return report;
  });
}

void TraceDocument::select_step(std::int64_t step) {
  if (!ok()) return;
  // The same step again: nothing to do, unless its read failed; then this is the way to retry it.
  if (selected_ && *selected_ == step && step_error_.empty()) return;
  selected_ = step;
  step_error_.clear();
  if (step_ && step_->step == step) return;  // its rows are in: read at open (the early anomaly's step)
  if (!step_job_.valid()) start_step_job(step);
  // Otherwise poll() starts the job for the latest selection when the running one ends.
}

void TraceDocument::start_step_job(std::int64_t step) {
  step_job_step_ = step;
  auto reader = reader_;
  step_job_ = std::async(std::launch::async, [reader, step]() { return read_step(*reader, step); });
}

bool TraceDocument::poll() {
  if (!ok()) return false;
  bool changed = false;
  if (is_ready(analysis_)) {
    try {
      report_ = analysis_.get();
      analysis_error_.clear();
    } catch (const Cancelled&) {
    } catch (const std::exception& e) {
      analysis_error_ = std::string("analysis failed: ") + e.what();
    }
    changed = true;
    if (reanalyse_) {
      reanalyse_ = false;
      start_analysis();
    }
  }
  if (is_ready(precision_job_)) {
    try {
      precision_ = precision_job_.get();
      precision_error_.clear();
    } catch (const Cancelled&) {
    } catch (const std::exception& e) {
      precision_error_ = std::string("cannot read the precision rows: ") + e.what();
    }
    changed = true;
    if (reprecision_) {
      reprecision_ = false;
      start_precision();
    }
  }
  if (is_ready(fp8_job_)) {
    try {
      fp8_ = fp8_job_.get();
      fp8_error_.clear();
    } catch (const Cancelled&) {
    } catch (const std::exception& e) {
      fp8_error_ = std::string("cannot read the FP8 rows: ") + e.what();
    }
    changed = true;
    if (refp8_) {
      refp8_ = false;
      start_fp8();
    }
  }
  if (is_ready(blocks_job_)) {
    try {
      blocks_ = blocks_job_.get();
      blocks_error_.clear();
    } catch (const Cancelled&) {
    } catch (const std::exception& e) {
      blocks_error_ = std::string("cannot read the block-scaled rows: ") + e.what();
    }
    changed = true;
    if (reblocks_) {
      reblocks_ = false;
      start_blocks();
    }
  }
  if (ready(step_job_)) {
    const std::int64_t job_step = step_job_step_;
    try {
      StepData d = step_job_.get();
      step_ = std::move(d);
    } catch (const std::exception& e) {
      // A step selected while this one was read must still be read, not shown this step's error.
      if (selected_ && *selected_ == job_step) {
        step_error_ = fmt::format("cannot read the rows of step {}: {}", job_step, e.what());
      }
    }
    changed = true;
    if (selected_ && (!step_ || step_->step != *selected_) && step_error_.empty()) start_step_job(*selected_);
  }
  if (!complete_ && Clock::now() - last_refresh_ >= options_.live_interval) {
    refresh_live();
    changed = true;
  }
  return changed;
}

void TraceDocument::refresh_live() {
  last_refresh_ = Clock::now();
  // Not now if a background job is reading, or a comparison has a second reader open: next time.
  std::unique_lock gate(refresh_gate(), std::try_to_lock);
  if (!gate.owns_lock()) return;
  std::unique_lock lock(reader_->mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  trace::TraceReader& reader = reader_->reader;
  try {
    reader.refresh();
    const std::int64_t after = steps_.empty() ? trace::kFirstStep : steps_.back().step + 1;
    auto fresh = reader.steps(after, trace::kLastStep);
    counts_ = reader.row_counts();
    complete_ = reader.complete();
    if (fresh.empty() && !complete_) return;
    steps_.insert(steps_.end(), fresh.begin(), fresh.end());
    // The analysis saw fewer steps: run it again (after the running one, if any).
    if (analysis_.valid()) {
      reanalyse_ = true;
    } else if (options_.analyse) {
      start_analysis();
    }
  } catch (const std::exception& e) {
    analysis_error_ = std::string("refresh failed: ") + e.what();
  }
}

void TraceDocument::wait_idle() {
  for (;;) {
    if (analysis_.valid()) analysis_.wait();
    if (precision_job_.valid()) precision_job_.wait();
    if (fp8_job_.valid()) fp8_job_.wait();
    if (blocks_job_.valid()) blocks_job_.wait();
    if (step_job_.valid()) step_job_.wait();
    poll();
    if (!analysis_.valid() && !precision_job_.valid() && !fp8_job_.valid() && !blocks_job_.valid() && !step_job_.valid()) return;
  }
}

Comparison::Comparison(const std::filesystem::path& a, const std::filesystem::path& b, Options options) {
  auto control = control_;
  job_ = std::async(std::launch::async, [a, b, options = std::move(options), control]() {
    // Readers of its own, opened, used and closed on this thread: no document waits for the diff. The
    // gate keeps live refreshes off the files while these second handles are open.
    std::shared_lock gate(refresh_gate());
    trace::TraceReader ra(a), rb(b);
    return analysis::diff(ra, rb, options.diff, [&options, control](std::int64_t done, std::int64_t total) {
      control->done = done;
      control->total = total;
      if (options.on_progress) options.on_progress(done, total);
      if (control->cancel) throw Cancelled{};
    });
  });
}

Comparison::~Comparison() {
  control_->cancel = true;
  if (job_.valid()) job_.wait();
}

bool Comparison::poll() {
  if (!is_ready(job_)) return false;
  try {
    report_ = job_.get();
  } catch (const Cancelled&) {
  } catch (const std::exception& e) {
    error_ = std::string("comparison failed: ") + e.what();
  }
  return true;
}

}  // namespace ampscope::viewer
