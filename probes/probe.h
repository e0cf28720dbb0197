// probes/probe.h: the probe that watches a training run through core's hook (core/probe_hook.h) and
// writes what it saw as trace rows (probes/trace/schema.h) to a sink: per-op dtypes and tensor health,
// gradients before and after unscaling, scaler decisions, and the anomalies it finds as ops run.
//
//   auto sink = std::make_shared<trace::TraceWriter>(...);        // or any trace::Sink
//   auto probe = std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::health});
//   probe::HookGuard installed(probe);
//   for (std::int64_t n = 0; ...; ++n) {
//     probe::Step step(n);                                        // rows are grouped and written per step
//     ... forward under autocast, scaler.scale(loss).backward() ...
//     step.finish(loss, opt, scaler);                             // step + update; the /steps row is written
//   }
//   probe->flush();                                               // a step left open, if any
//
// Levels (each adds to the one before):
//   off     no op or gradient rows; /steps rows and scaler events only.
//   dtype   one OpRow per op: step, seq, phase, op, module, input and output dtypes, shape, autocast's
//           reason. No pass over the data, so no statistics and no anomaly detection.
//   health  the output's TensorHealth; cast overflow/underflow counts of casts (the op "to", input 0
//           to output, and autocast's casts of an op, summed; casts served by the weight-cast cache
//           were counted where they were made); GradRows; anomaly detection (below).
//           Swamped updates (/updates): one UpdateRow per f16/bf16 parameter an optimizer updated (core/probe_hook.h
//           UpdateEvent), counting the elements whose update rounding lost. Costs a copy of the parameter, its
//           update and its new value to the host per parameter and step, and only for f16/bf16 parameters.
//           FP8 operands (/fp8, --precision fp8): one Fp8Row per operand an FP8 Linear quantized (core/probe_hook.h
//           Fp8QuantizeEvent): underflow, subnormal and saturation counts and the quantization error (stats.h
//           fp8_operand_row), a pass over the operand's values and codes already on the host.
//           Block-scaled operands (/blocks, --precision mxfp8|nvfp4 and --what-if): one BlockRow per operand copy
//           the runtime quantized or measured (core/probe_hook.h BlockQuantizeEvent, stats.h block_operand_row):
//           the statistics the runtime computed, copied; no pass over the data here.
//   full    an exponent histogram of every op output and of every unscaled gradient. A backward
//           node's histograms are named "output" for the gradient its OpRow describes (the first
//           defined one) and "output i" for the gradient of its input i otherwise.
//
// Anomalies (health and full; they need a pass over the output): an op whose output holds NaN or inf
// while every defined floating input is finite is an *origin* (OpRow.origin, an "origin" event; an input
// that autocast cast is judged by its value before the cast, so an overflowing autocast cast makes its
// op the origin). One whose inputs already held NaN or inf *propagates*: one "propagate" event per op
// and module per step, its detail saying how many more times it happened. A backward node is judged the
// same way, its input being the gradient it received. Cast overflows are events ("cast_overflow"), and
// so are cast underflows ("cast_underflow", not counted as an anomaly: small values flush to zero in
// every f16 run). The first origin of the run can dump the op's inputs and outputs (DumpRows, at most
// dump_max_elements values each).
//
// Sampling and the flight recorder: op, gradient, histogram and dump rows and op events are recorded on
// steps whose number is a multiple of `every`; on other steps wants_op answers false and the probe costs
// one call per op. With `flight_recorder`, every step is recorded at the configured level and kept in
// memory (the last `recorder_steps` steps), but a step is written only if it is sampled or had an anomaly
// (origin, propagate, cast overflow, non-finite gradient, gradient overflow found by the scaler, skipped
// step); an anomalous step first writes the kept steps before it that were not written, so the lead-up
// is there too. /steps rows and scaler events are written for every step, sampled or not: the scale
// history must be complete. Every row of a table reaches the sink in step order; sink.end_step(step)
// follows the rows of each step (a kept step written late comes before the end_step of the anomalous
// step that wrote it). Ops outside any StepScope are not recorded (an evaluation pass is no step) unless
// ProbeOptions::outside_steps is set; then they are written as they come, with step -1.
//
// Gradients before a data-parallel all-reduce (GradEvent::before_all_reduce, reported by the training loop) are
// GradRows like the others, marked before_all_reduce, on the same steps and with the same filters; they get no
// histogram. With `checksums`, the parameters after each step are checksummed (ChecksumRows), every step.
//
// Statistics on a device (docs/cuda.md, "What synchronises"): the statistics of CUDA tensors are computed on
// the device (Backend::make_stats_queue, a ring of kDeviceStatsSlots slots), queued as each op and GradEvent
// of a step comes and read once per step, when it ends, not per op (earlier only when the ring is full, or an op
// must be read at once: one with tensors on another device or more tensors than the ring holds). An op's rows are completed when its slots are read, in the order the ops
// ran, so the trace holds the same rows in the same order as if each op were read at once; the sums behind
// mean and rms add in the device's order (kernels/cuda/stats_cuda.h bounds the difference). Until then the op's
// tensors are kept alive, and while the run's first origin is still to be dumped, a copy of the leading values
// of each tensor it would dump. counters() is current after each step's end. CPU tensors are read in place at
// once, as before. What still waits for the device per use: the dump of the first origin, the /updates rows
// (f16/bf16 parameters), the parameter checksums, and ops outside steps (outside_steps), read at once.
//
// Provenance: each OpRow's `inputs` names the rows of the same step that produced the op's inputs (the
// stamps of core/probe_hook.h, Producer), or a marker (trace::kInputParameter, kInputData, ...).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/probe_hook.h"
#include "core/training_step.h"  // probe::Step, the training loop's side of the probe: one include for both
#include "probes/stats.h"
#include "probes/trace/schema.h"

namespace ampscope::probe {

enum class Level { off, dtype, health, full };
std::string_view level_name(Level level);  // "off", "dtype", "health", "full"
// Throws Error "unknown probe level 'x' (known levels: off, dtype, health, full)".
Level parse_level(std::string_view name);
const std::vector<std::string_view>& level_names();

// The slots of the probe's statistics ring on a device: the most tensors read at once (about 1.1 KiB of pinned
// host memory each).
inline constexpr int kDeviceStatsSlots = 1024;

struct ProbeOptions {
  Level level = Level::health;
  // Globs (fnmatch: *, ?, [..]) on the op name ("linear", "to") and on the module path of the op
  // ("blocks.*.attn.*"); an op is recorded when it matches one of each list, an empty list matching
  // everything. Module globs also select gradients, by the module of the parameter ("fc1" for
  // "fc1.weight").
  std::vector<std::string> ops{};
  std::vector<std::string> modules{};
  std::int64_t every = 1;  // record steps whose number is a multiple of this
  bool flight_recorder = false;
  std::int64_t recorder_steps = 4;  // steps kept by the flight recorder, the current one included
  bool dump_first_origin = true;
  std::int64_t dump_max_elements = 4096;  // per dumped tensor
  // Ops outside any StepScope (an evaluation pass after the step, a check before training) are not
  // recorded unless this is set; they then get step -1 and belong to no step.
  bool outside_steps = false;
  // Parameter checksums (/checksums, format_version 6): after every step's optimizer step, sampled or not and
  // at every level, a checksum of each parameter and the combined one (probes/stats.h tensor_checksum).
  // `ampscope train --ddp` sets it, so the multi-rank report can find the step where ranks' parameters parted.
  bool checksums = false;
};

// How a probe with these options is set up, as JSON text for the trace's root attribute `probe`
// (trace::RunInfo::probe): level, op and module filters, sampling, the flight recorder, whether ops
// outside steps are recorded, and the autocast overrides installed when it is called. A report uses it to
// say what a filter or sampling may have hidden.
//   trace::RunInfo info{...};  info.probe = probe::describe(options);   // before creating the writer
std::string describe(const ProbeOptions& options);

class Probe : public Hook {
 public:
  // Throws Error for an `every` or `recorder_steps` below 1 or a negative dump size.
  Probe(std::shared_ptr<trace::Sink> sink, ProbeOptions options = {});
  ~Probe() override;  // flushes (errors from the sink are swallowed there: call flush() to see them)
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;

  bool wants_op(std::string_view op, const std::string& scope) override;
  void on_op(const OpEvent& event) override;
  void on_backward_op(const OpEvent& event) override;
  void on_grads(const GradEvent& event) override;
  void on_scaler(const ScalerEvent& event) override;
  void on_update(const UpdateEvent& event) override;
  void on_fp8_quantize(const Fp8QuantizeEvent& event) override;
  void on_block_quantize(const BlockQuantizeEvent& event) override;
  bool wants_params() override { return options_.checksums; }
  void on_params(const ParamsEvent& event) override;
  void on_step_begin(std::int64_t step) override;
  void on_step_end(const StepSummary& summary) override;
  // A step abandoned by an exception: ended as flush() ends it (no /steps row; its rows written if the
  // step is selected), so ops after it are outside steps again.
  void on_step_abandoned(std::int64_t step) override;

  // Ends a step left open (a StepScope still open, or one destroyed without end() while no probe was
  // installed to hear it: no /steps row) and writes it if it is selected. Call before closing the sink.
  void flush();

  const ProbeOptions& options() const { return options_; }

  // The deferred path without a GPU (tests): the statistics of tensors `queue` takes go through it, read as the
  // device ring is (see "Statistics on a device" above). Call before the first op.
  void use_deferred_stats(std::unique_ptr<DeferredStats> queue);

  // What the probe has found so far in this run.
  struct Counters {
    std::int64_t origins = 0;
    std::int64_t propagations = 0;    // ops, including those folded into one event
    std::int64_t cast_overflow = 0;   // values
    std::int64_t cast_underflow = 0;  // values
    std::int64_t grad_overflows = 0;  // parameters the scaler found non-finite
    std::int64_t skipped_steps = 0;
    std::int64_t steps_written = 0;  // steps whose op-level rows reached the sink
    std::int64_t stats_reads = 0;    // times the deferred statistics were read (once per step, or a full ring)
    // Values of CPU tensors whose statistics were asked for, and those of them served by the step's statistics
    // cache (an identical view of an unwritten storage read before in the step, or an unwritten clone of one).
    std::int64_t stats_values = 0;
    std::int64_t stats_values_cached = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  // The op-level rows of one step, kept until the step is written or falls out of the recorder.
  struct StepRecord {
    std::int64_t step = 0;
    std::vector<trace::OpRow> ops;
    std::vector<trace::GradRow> grads;
    std::vector<trace::EventRow> events;
    std::vector<trace::HistogramRow> histograms;
    std::vector<trace::DumpRow> dumps;
    std::vector<trace::UpdateRow> updates;
    std::vector<trace::Fp8Row> fp8;
    std::vector<trace::BlockRow> blocks;
    bool anomalous = false;
    bool written = false;
    // "op\0module\0phase" -> (index in events of the first propagate event, later occurrences)
    std::unordered_map<std::string, std::pair<std::size_t, std::int64_t>> propagated;
  };

  bool selected(std::int64_t step) const;
  bool module_wanted(std::string_view module) const;
  StepRecord* record_for(std::int64_t step);
  // One op's rows (probe.cpp, record_op and the functions it calls, in the order it calls them): the OpRow,
  // its health, its casts' overflow and underflow, and whether its NaN/inf are its own (an origin) or came in.
  void record_op(const OpEvent& event, trace::Phase phase);
  void record_op(const OpEvent& event, trace::Phase phase,
                 const std::array<std::int64_t, trace::kOpInputs>& producers);
  void record_grads(const GradEvent& event);

  // ---- deferred statistics (a device's ring, or use_deferred_stats) ----
  // An op or a GradEvent whose statistics are queued: its own copy of the event, and its slots.
  struct Pending {
    bool is_op = true;
    std::string op, scope;
    std::uint64_t index = 0;
    std::int64_t step = 0, seq = 0;
    trace::Phase phase = trace::Phase::forward;
    Phase core_phase = Phase::forward;
    AutocastInfo autocast;
    std::vector<Tensor> inputs, outputs;
    Tensor output;
    std::array<std::int64_t, trace::kOpInputs> producers{};
    bool unscaled = false, before_all_reduce = false;
    std::vector<std::pair<std::string, Tensor>> grads;
    std::vector<std::pair<std::pair<const void*, bool>, int>> slots;  // ((tensor id, histogram), slot)
    std::unordered_map<const void*, Tensor> snapshots;               // tensor id -> leading values, copied
    std::unordered_map<const void*, TensorStats> host;                // tensors read in place (on the CPU)
  };
  // The queue for these tensors, made on first use for a device with a ring; null when they go to the host.
  DeferredStats* queue_for(const std::vector<Tensor>& tensors);
  // Queues `pending`'s statistics (`wanted`: tensor and histogram) and keeps it; false (nothing queued) when it
  // must be read at once: a tensor the queue does not take, or more tensors than the ring holds.
  bool defer(Pending pending, const std::vector<std::pair<Tensor, bool>>& wanted);
  // Reads every queued slot and completes the pending ops and gradients in the order they came.
  void drain();
  // What record_op and record_grads read: the queued result while one is being completed, else the tensor.
  TensorStats stats_of(const Tensor& t, bool with_histogram);
  // The same read without a histogram, as its health and sum of squares only (an op's outputs: no 1.1 KiB
  // TensorStats zeroed and copied per output).
  struct PlainStats;
  PlainStats plain_stats_of(const Tensor& t);
  CastCounts casts_of(const Tensor& source, const Tensor& result);
  std::vector<double> leading_of(const Tensor& t, std::int64_t max_elements);

  // ---- the step's statistics cache (CPU tensors) ----
  // What makes two reads the same read: the storage's serial (never reused, unlike its address) and its
  // version (core/tensor.h Storage: changed by every writable pointer handed out), the view's offset, shape,
  // strides and dtype, and the histogram flag (which of the two caches below). A contiguous view is keyed by
  // its element count alone (the pass over it does not depend on its shape; its key holds no shape, so making
  // one allocates nothing), a permuted one (a transpose) as the contiguous tensor it permutes (tensor_stats reads
  // it in memory order: the same pass), and an unwritten clone by the view it was copied from.
  struct StatsKey {
    std::uint64_t serial = 0, version = 0;
    std::int64_t offset = 0, numel = 0;
    DType dtype = DType::f32;
    bool contiguous = true;
    Shape sizes, strides;  // a strided view's; empty for a contiguous one
    bool operator==(const StatsKey&) const = default;
  };
  struct StatsKeyHash {
    std::size_t operator()(const StatsKey& k) const;
  };
  static StatsKey stats_key(const Tensor& t);
  TensorStats cached_hist(const Tensor& t);  // a read with a histogram
  // What a read without a histogram keeps: its histogram is all zero (stats.h), so the entry is a tenth of a
  // TensorStats and small enough for the allocator's per-thread cache.
  struct PlainStats {
    trace::TensorHealth health;
    double sum_sq = 0;
  };
  PlainStats cached_plain(const Tensor& t);

  std::array<std::int64_t, trace::kOpInputs> input_producers(const OpEvent& event) const;
  // The statistics of an op's outputs, one pass each; `primary` is the output its row describes (the first
  // defined one, -1 when none); the NaN/inf counts are summed over all of them. `histograms` only when asked for
  // (level full; empty otherwise: a TensorStats per output is 1.1 KiB to allocate, zero and copy for nothing).
  struct OutputStats {
    std::vector<trace::TensorHealth> health;
    std::vector<std::array<std::int64_t, trace::kHistBins>> histograms;
    int primary = -1;
    std::int64_t nan = 0, pos_inf = 0, neg_inf = 0;
  };
  OutputStats output_stats(const OpEvent& event, bool histograms);
  // Counts what the op's casts overflowed and flushed to zero (an explicit `to`, and autocast's casts of its
  // inputs not served by the weight-cast cache) into its row and the counters, with an event each; true when
  // a cast overflowed.
  bool count_casts(const OpEvent& event, bool backward, trace::OpRow& row, std::vector<trace::EventRow>& events);
  // An input as the anomaly rule judges it: its values before autocast's cast.
  struct JudgedInput {
    std::string label;  // "input 1 before autocast", "the incoming gradient"
    TensorStats stats;
    bool mask = false;  // its only non-finite values are the -inf a mask's fill of this step wrote
  };
  std::vector<JudgedInput> judged_inputs(const OpEvent& event, bool backward, const trace::OpRow& row);
  // Whether the op's output held NaN/inf (a mask's intended -inf aside), and if so whether it made them (an
  // origin) or an input or the step's forward pass did (a propagation): the row's flag, the event, the counters.
  bool judge_nonfinite(const OpEvent& event, trace::Phase phase, const OutputStats& out, trace::OpRow& row,
                       std::vector<trace::EventRow>& events);
  void record_origin(const OpEvent& event, bool backward, int primary, bool made_inf,
                     const std::vector<JudgedInput>& inputs, const std::string& what, trace::OpRow& row,
                     std::vector<trace::EventRow>& events);
  void dump_origin(const OpEvent& event, const trace::OpRow& row, int primary);  // the run's first origin
  // One "propagate" event per op, module and phase per step; later ones are counted on it.
  void record_propagation(const OpEvent& event, trace::Phase phase, const JudgedInput* first_bad,
                          const std::string& what, const trace::OpRow& row, std::vector<trace::EventRow>& events);
  void emit(trace::OpRow row);
  void emit(trace::GradRow row);
  void emit(trace::HistogramRow row);
  void emit(trace::DumpRow row);
  void emit(trace::UpdateRow row);
  void emit(trace::Fp8Row row);
  void emit(trace::BlockRow row);
  void emit_event(trace::EventRow row, bool anomaly);
  void mark_anomaly(std::int64_t step);
  void record_nonfinite_update(const UpdateEvent& event, const std::vector<double>& before,
                               const std::vector<double>& after);
  void end_step(const std::optional<StepSummary>& summary);
  void write_record(StepRecord& record);

  std::shared_ptr<trace::Sink> sink_;
  ProbeOptions options_;
  bool recording_ = false;  // whether ops are recorded now
  bool open_ = false;       // between on_step_begin and the step's end
  std::int64_t step_ = -1;
  std::deque<StepRecord> recent_;                           // the last steps, the open one at the back
  std::vector<trace::EventRow> step_events_;                // scaler events of the open step
  std::optional<ScalerEvent> last_scaler_;                  // the open step's last scaler update
  std::unordered_map<std::string, bool> loose_propagated_;  // propagate events outside steps
  // Per FP8 operand ("module\noperand"): the steps its delayed-scaling history holds (stats.h).
  std::unordered_map<std::string, Fp8HistorySteps> fp8_history_steps_;
  bool dumped_ = false;
  // The last step whose forward pass held a NaN/inf (origin or propagated).
  std::int64_t forward_anomaly_step_ = std::numeric_limits<std::int64_t>::min();
  Counters counters_;
  std::unique_ptr<DeferredStats> deferred_;
  bool device_queue_tried_ = false;
  std::deque<Pending> pending_;
  // While a pending item is completed: its results by (tensor id, histogram), its snapshots.
  const std::unordered_map<const void*, TensorStats>* resolved_plain_ = nullptr;
  const std::unordered_map<const void*, TensorStats>* resolved_hist_ = nullptr;
  const std::unordered_map<const void*, Tensor>* snapshots_ = nullptr;
  // Emptied at every step's begin and end, and each when it holds kStatsCacheEntries: reads without a histogram,
  // and reads with one (level full), never served by each other (stats.cpp sums in another order for a histogram).
  std::unordered_map<StatsKey, PlainStats, StatsKeyHash> stats_cache_;
  std::unordered_map<StatsKey, TensorStats, StatsKeyHash> hist_cache_;
  static constexpr std::size_t kStatsCacheEntries = 4096;
  // The rows of the last step recorded, per table: a new step's record reserves as many, so a step's rows are
  // not moved again and again as its vectors grow (what is written is the same).
  std::size_t last_ops_ = 0, last_grads_ = 0;
};

}  // namespace ampscope::probe
