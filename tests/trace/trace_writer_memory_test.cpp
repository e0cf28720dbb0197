// The writer's memory does not grow with the run (issue 36: `ampscope train --out` grew about 120 bytes a
// step, 12 MB per 100,000 steps). What grew was HDF5's, on the writer's behalf: its chunk cache kept every
// finished /index chunk (7 KiB each) up to 1 MiB, and its metadata cache kept the index blocks of every
// finished chunk, growing from 2 MiB towards 32 MiB. Here the heap in use (glibc's mallinfo2, every thread's
// arena) is measured at two quiet points of one writer, after flush(): after a warm-up and 10,000 steps
// later. Small chunks (8 rows, a chunk or more a step) make the old growth show in seconds: about 120
// bytes a step, 1.2 MB between the two points; a small queue keeps the writer's own recycled buffers
// (bounded by the queue, whatever the run) from masking or faking it. bench/writer_rss.sh measures the
// RSS of a real 100,000-step `ampscope train` run.
#include <malloc.h>

#include <cstddef>
#include <string>

#include <gtest/gtest.h>

#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

std::size_t heap_in_use() { return mallinfo2().uordblks; }

TEST(trace_writer_memory_test, heap_in_use_stays_flat_over_ten_thousand_steps_after_warm_up) {
  TempDir dir;
  TraceWriter w(dir.file("run.h5"), testing::sample_run(), {.queue_rows = 256, .chunk_rows = 8});
  std::size_t warm = 0;
  constexpr int kWarmUp = 5000, kSteps = 15000;
  for (int step = 0; step < kSteps; ++step) {
    for (int seq = 0; seq < 8; ++seq) w.write(testing::numbered_op(step, seq));
    w.write(testing::numbered_step(step));
    w.end_step(step);
    if (step + 1 == kWarmUp) {
      w.flush();
      warm = heap_in_use();
    }
  }
  w.flush();
  const std::size_t after = heap_in_use();
  // 64 KiB over 10,000 steps is 6.5 bytes a step: a tenth of a 1 MB growth over 100,000 steps, and far
  // below the old 120 bytes.
  EXPECT_LT(after, warm + (64 << 10)) << "the heap grew from " << warm << " to " << after << " bytes over "
                                      << kSteps - kWarmUp << " steps";
  w.close();
}

}  // namespace
}  // namespace ampscope::trace
