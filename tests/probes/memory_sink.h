// tests/probes/memory_sink.h: a trace sink that keeps every row in memory, in arrival order, for the
// probe tests to read back.
//
//   auto sink = std::make_shared<MemorySink>();
//   probe::HookGuard installed(std::make_shared<probe::Probe>(sink));
//   ...
//   EXPECT_EQ(sink->ops_of_step(0).size(), 3u);
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/probe_hook.h"
#include "probes/probe.h"
#include "probes/trace/schema.h"

namespace ampscope::testing {

struct MemorySink : trace::Sink {
  std::vector<trace::StepRow> steps;
  std::vector<trace::OpRow> ops;
  std::vector<trace::GradRow> grads;
  std::vector<trace::EventRow> events;
  std::vector<trace::HistogramRow> histograms;
  std::vector<trace::DumpRow> dumps;
  std::vector<std::int64_t> ended;  // end_step calls, in order

  void write(const trace::StepRow& r) override { steps.push_back(r); }
  void write(const trace::OpRow& r) override { ops.push_back(r); }
  void write(const trace::GradRow& r) override { grads.push_back(r); }
  void write(const trace::EventRow& r) override { events.push_back(r); }
  void write(const trace::HistogramRow& r) override { histograms.push_back(r); }
  void write(const trace::DumpRow& r) override { dumps.push_back(r); }
  void end_step(std::int64_t step) override { ended.push_back(step); }

  std::vector<trace::OpRow> ops_of_step(std::int64_t step) const {
    std::vector<trace::OpRow> out;
    for (const trace::OpRow& r : ops) {
      if (r.step == step) out.push_back(r);
    }
    return out;
  }
  std::vector<trace::EventRow> events_of_kind(std::string_view kind) const {
    std::vector<trace::EventRow> out;
    for (const trace::EventRow& r : events) {
      if (r.kind == kind) out.push_back(r);
    }
    return out;
  }
  // The steps that have op rows, in order of first appearance.
  std::vector<std::int64_t> steps_with_ops() const {
    std::vector<std::int64_t> out;
    for (const trace::OpRow& r : ops) {
      if (out.empty() || out.back() != r.step) out.push_back(r.step);
    }
    return out;
  }
};

// A probe writing into a MemorySink, installed for the fixture's lifetime.
struct Probed {
  explicit Probed(probe::ProbeOptions options = {})
      : sink(std::make_shared<MemorySink>()), probe(std::make_shared<probe::Probe>(sink, options)), guard(probe) {}
  std::shared_ptr<MemorySink> sink;
  std::shared_ptr<probe::Probe> probe;
  probe::HookGuard guard;
};

}  // namespace ampscope::testing
