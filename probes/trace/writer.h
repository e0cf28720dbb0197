// probes/trace/writer.h: the HDF5 trace file sink. Rows are packed into the file's record layout on the
// caller's thread and handed over a chunk at a time; compression threads (for a short step's end, the writer
// thread) shuffle and deflate chunks as HDF5's filters would, and one writer thread appends them to chunked,
// extendible datasets (one per table) of a file in SWMR mode, so the trace can be read while it is written and
// survives the writer being killed: end_step() makes every row given so far durable. The queue is bounded: write()
// blocks while it is full. The file format is documented field by field in docs/trace-format.md.
//
//   trace::TraceWriter w("run.h5", {.precision = "fp16", .device = "cpu", .model = "mlp", .seed = 1, .config = "{}"});
//   w.write(trace::OpRow{...});
//   w.end_step(0);   // flushed by the writer thread: a reader, or a crash, sees step 0 complete
//   w.close();       // root attribute complete = 1
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>

#include "probes/trace/error.h"
#include "probes/trace/schema.h"

namespace ampscope::trace {

struct TraceWriterOptions {
  // Rows (all tables together) handed over by write() and not yet in the file; write() blocks while
  // more are waiting (a whole chunk is always accepted). Memory stays below about queue_rows records
  // plus their compressed copies, and one chunk per table being filled on the caller's side.
  std::size_t queue_rows = 1 << 14;
  // Rows per HDF5 chunk of /ops, /grads, /events and /dumps (other tables: see docs/trace-format.md).
  // A chunk filled between two step ends is compressed once; a step that ends inside a chunk makes the
  // writer compress the chunk's rows so far again, so small chunks suit short steps and large ones
  // compress better. 0 (the default): about four times the first step's rows of each table, chosen at
  // the first end_step(), which is when the tables are created and readers can first open the file.
  std::size_t chunk_rows = 0;
  // Deflate level, 0 (chunks stored raw) to 9; HDF5's byte shuffle filter runs before deflate.
  int compression = 1;
  // Threads that compress chunks in parallel, besides the one that writes the file.
  int compression_threads = 2;
  // Added to the nice value of the writer's threads (the writer thread and the compression threads; the caller's
  // keeps its own), up to 19: the kernel then prefers the training threads when both want a core, and the writer
  // does its work in their gaps. On two cores shared with a short training step, a writer thread woken at each
  // step end at the same priority cost the step more than its own CPU (issue 37). Its work is the same: a writer
  // that cannot keep up still fills the queue, and write() then waits for it. 0 (the default) leaves them as the
  // caller's: since the CPU pool's spinning threads yield to a ready thread (kernels/parallel.h), 10 measured the same
  // as 0 on the MLP's probe_bench (bench/RESULTS.md, 2026-11-29 13:15), and a writer that lags holds more of the
  // queue's buffers, and a killed run loses more of its last steps.
  int thread_nice = 0;
  // When the process receives SIGTERM, say so in the trace's lock file before it ends (writer_state reads
  // it), so that a writer asked to stop is told from one that died: mpirun sends SIGTERM to the other ranks
  // of a data-parallel run when one rank dies. Installs a SIGTERM handler (once, only over SIGTERM's default
  // action) that writes the note and then ends the process as SIGTERM would. `ampscope train` turns it on.
  bool note_termination = false;
};

class TraceWriter final : public Sink {
 public:
  // Creates (or truncates) the file and writes the root attributes; throws TraceError when it cannot.
  TraceWriter(const std::filesystem::path& path, const RunInfo& info, TraceWriterOptions options = {});
  // Without close(), the rows given so far are written and the file is closed with complete = 0, as
  // after an exception in the training loop. Never throws.
  ~TraceWriter() override;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // The root attributes are written when the file is created: begin() accepts only the same run info.
  void begin(const RunInfo& info) override;

  // Errors on the writer thread (a full disk, an HDF5 failure) are thrown by the next call of the
  // caller's thread (write, end_step, flush or close), as TraceError. A write the file system refuses
  // ("no space left on device") stops all writing: the file keeps the steps flushed before it (the
  // message says up to which), as if the writer had been killed then, and HDF5 prints nothing.
  void write(const StepRow& row) override;
  void write(const OpRow& row) override;
  void write(const GradRow& row) override;
  void write(const EventRow& row) override;
  void write(const HistogramRow& row) override;
  void write(const DumpRow& row) override;
  void write(const PrecisionRow& row) override;
  void write(const UpdateRow& row) override;
  void write(const ChecksumRow& row) override;
  void write(const Fp8Row& row) override;
  void write(const BlockRow& row) override;

  // Queues a flush of every row given so far (H5Dflush of each dataset, then a row of /index) and
  // returns without waiting for it.
  void end_step(std::int64_t step) override;
  // Like end_step, but waits until the rows are written and flushed.
  void flush();
  // Writes everything, sets complete = 1, closes the file and stops the thread. A second call does nothing.
  void close() override;

  const std::filesystem::path& path() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// How the writer of a trace stands, from its lock file ("<trace>.lock", which a writer takes while it writes
// and removes when it closes, but a process that ends without closing leaves): `writing`, a writer holds the
// trace now; `terminated`, none does, and the last one noted that SIGTERM ended its process
// (note_termination). Neither, for a trace not closed by its writer: the writer's process died without
// notice (SIGKILL, a crash), or the file was copied or cut while being written.
struct WriterState {
  bool writing = false;
  bool terminated = false;
};
WriterState writer_state(const std::filesystem::path& trace);

}  // namespace ampscope::trace
