// cli/progress_line.h: the progress line the commands write on stderr for long work ("analysing
// run.h5:  42.0% (84000 of 200000 op rows)"), rewritten in place with "\r" and cleared when done.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <fmt/format.h>

namespace ampscope::samples {

class ProgressLine {
 public:
  // `label` starts the line, `unit` names what is counted; totals below `min_total` show nothing (work that
  // ends before a person would look).
  ProgressLine(std::ostream& err, bool enabled, std::string label, std::string unit = "rows", std::int64_t min_total = 0)
      : err_(err), enabled_(enabled), label_(std::move(label)), unit_(std::move(unit)), min_total_(min_total) {}
  ~ProgressLine() { clear(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  void operator()(std::int64_t done, std::int64_t total) {
    if (!enabled_ || total < min_total_) return;
    const double pct = total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
    err_ << fmt::format("\r{}: {:5.1f}% ({} of {} {})", label_, pct, done, total, unit_) << std::flush;
    shown_ = true;
  }
  void clear() {
    if (shown_) err_ << "\r\x1b[K" << std::flush;
    shown_ = false;
  }

 private:
  std::ostream& err_;
  bool enabled_;
  std::string label_, unit_;
  std::int64_t min_total_;
  bool shown_ = false;
};

}  // namespace ampscope::samples
