// The reader's two ways to a row agree: chunks stored by the writer's own pipeline are decoded by the
// reader (stored bytes, inflate, unshuffle), anything else goes through HDF5's H5Dread. Checked against
// rows rebuilt independently from what was written: a trace read in many small step ranges (steps
// written out of order, as the flight recorder does, rows outside steps, steps ending inside chunks),
// the same trace rewritten by h5repack with other filters or layouts, and a trace one of whose chunks
// was rewritten with a filter skipped (HDF5's filter mask), which only HDF5 can decode; and two readers
// of one trace in one process.
#include <hdf5.h>
#include <zlib.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

// The rows written to a trace, in the order written: (step, seq) of each op and grad row.
struct Written {
  std::vector<std::pair<std::int64_t, std::int64_t>> ops;
  std::vector<std::int64_t> steps;  // /steps rows
};

GradRow numbered_grad(std::int64_t step, std::int64_t k) {
  GradRow g;
  g.step = step;
  g.param = fmt::format("blocks.{}.mlp.fc{}.weight", k, k % 2 + 1);
  g.dtype = k % 2 ? "f16" : "f32";
  g.nan = k;
  g.pos_inf = step;
  g.neg_inf = step + k;
  g.zero = 7 * k;
  g.absmax = 0.5 + static_cast<double>(step) / 8.0;
  g.norm = static_cast<double>(k) * 0.125;
  g.unscaled = k % 2 == 1;
  return g;
}

HistogramRow numbered_histogram(std::int64_t step, std::int64_t seq) {
  HistogramRow h;
  h.step = step;
  h.seq = seq;
  h.tensor = seq < 0 ? "fc1.weight" : "output";
  for (std::size_t i = 0; i < h.bins.size(); ++i) h.bins[i] = static_cast<std::int64_t>(i) * (step + 1) + seq;
  return h;
}

// 40 steps of 23 ops in chunks of 16 rows (steps end inside chunks; a read spans several batches of
// chunks). Steps 10-14 are held back and written, oldest first, after step 15 ends, as the flight
// recorder writes an anomalous step's history; rows of step -1 (outside steps) come between steps.
Written write_mixed_trace(const std::filesystem::path& path) {
  Written written;
  TraceWriter w(path, testing::sample_run(), {.chunk_rows = 16});
  auto write_ops = [&](std::int64_t step) {
    for (std::int64_t seq = 0; seq < 23; ++seq) {
      w.write(testing::numbered_op(step, seq));
      written.ops.emplace_back(step, seq);
    }
    for (std::int64_t k = 0; k < 3; ++k) w.write(numbered_grad(step, k));
    w.write(numbered_histogram(step, 1));
    w.write(EventRow{step, 2, "origin", "linear", "fc1", fmt::format("step {}", step)});
  };
  for (std::int64_t step = 0; step < 40; ++step) {
    const bool held = step >= 10 && step < 15;
    if (!held) write_ops(step);
    if (step == 15) {
      for (std::int64_t earlier = 10; earlier < 15; ++earlier) write_ops(earlier);
    }
    if (step % 9 == 4) {
      w.write(testing::numbered_op(-1, step));
      written.ops.emplace_back(-1, step);
    }
    w.write(testing::numbered_step(step));
    written.steps.push_back(step);
    w.end_step(step);
  }
  w.close();
  return written;
}

// The op rows with begin <= step < end, as written, in the order written.
std::vector<OpRow> expected_ops(const Written& written, std::int64_t begin, std::int64_t end) {
  std::vector<OpRow> rows;
  for (auto [step, seq] : written.ops) {
    if (step >= begin && step < end) rows.push_back(testing::numbered_op(step, seq));
  }
  return rows;
}

void expect_same_ops(const std::vector<OpRow>& expected, const std::vector<OpRow>& actual, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(fmt::format("row {}", i));
    testing::expect_same_op(expected[i], actual[i]);
    if (::testing::Test::HasFailure()) return;  // the first wrong row says enough
  }
}

// Every table of `r` equals what write_mixed_trace wrote.
void expect_mixed_trace(TraceReader& r, const Written& written) {
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), r.ops(), "all ops");
  expect_same_ops(expected_ops(written, 10, 16), r.ops(10, 16), "ops of steps 10-15");
  const std::vector<StepRow> steps = r.steps();
  ASSERT_EQ(steps.size(), written.steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) testing::expect_same_step(testing::numbered_step(written.steps[i]), steps[i]);
  // Grads, histograms and events follow the ops' order of steps.
  std::vector<std::int64_t> step_order;
  for (auto [step, seq] : written.ops) {
    if (step >= 0 && seq == 0) step_order.push_back(step);
  }
  const std::vector<GradRow> grads = r.grads();
  const std::vector<HistogramRow> histograms = r.histograms();
  const std::vector<EventRow> events = r.events();
  ASSERT_EQ(grads.size(), 3 * step_order.size());
  ASSERT_EQ(histograms.size(), step_order.size());
  ASSERT_EQ(events.size(), step_order.size());
  for (std::size_t i = 0; i < step_order.size(); ++i) {
    const std::int64_t step = step_order[i];
    for (std::int64_t k = 0; k < 3; ++k) {
      const GradRow e = numbered_grad(step, k);
      const GradRow& a = grads[3 * i + static_cast<std::size_t>(k)];
      EXPECT_EQ(a.step, e.step);
      EXPECT_EQ(a.param, e.param);
      EXPECT_EQ(a.dtype, e.dtype);
      EXPECT_EQ(a.nan, e.nan);
      EXPECT_EQ(a.pos_inf, e.pos_inf);
      EXPECT_EQ(a.neg_inf, e.neg_inf);
      EXPECT_EQ(a.zero, e.zero);
      EXPECT_SAME_DOUBLE(e.absmax, a.absmax);
      EXPECT_SAME_DOUBLE(e.norm, a.norm);
      EXPECT_EQ(a.unscaled, e.unscaled);
    }
    const HistogramRow h = numbered_histogram(step, 1);
    EXPECT_EQ(histograms[i].step, h.step);
    EXPECT_EQ(histograms[i].seq, h.seq);
    EXPECT_EQ(histograms[i].tensor, h.tensor);
    EXPECT_EQ(histograms[i].bins, h.bins);
    EXPECT_EQ(events[i].step, step);
    EXPECT_EQ(events[i].seq, 2);
    EXPECT_EQ(events[i].kind, "origin");
    EXPECT_EQ(events[i].op, "linear");
    EXPECT_EQ(events[i].module, "fc1");
    EXPECT_EQ(events[i].detail, fmt::format("step {}", step));
  }
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.last_flushed_step(), 39);
}

TEST(trace_read_paths_test, reads_ops_in_many_small_step_ranges_as_the_full_read) {
  TempDir dir;
  const auto path = dir.file("mixed.h5");
  const Written written = write_mixed_trace(path);
  TraceReader r(path);
  const std::vector<OpRow> all = r.ops();
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), all, "all ops");
  // Ranges of 1, 2, 3 and 7 steps over every step, from step -1 on; and each range's rows equal the
  // full read's rows of those steps, in the same order.
  for (std::int64_t width : {1, 2, 3, 7}) {
    std::size_t total = 0;
    for (std::int64_t begin = -1; begin < 42; begin += width) {
      const std::vector<OpRow> rows = r.ops(begin, begin + width);
      std::vector<OpRow> from_all;
      for (const OpRow& row : all) {
        if (row.step >= begin && row.step < begin + width) from_all.push_back(row);
      }
      expect_same_ops(from_all, rows, fmt::format("steps [{}, {}) against the full read", begin, begin + width));
      expect_same_ops(expected_ops(written, begin, begin + width), rows, fmt::format("steps [{}, {}) as written", begin, begin + width));
      total += rows.size();
      if (HasFailure()) return;
    }
    EXPECT_EQ(total, all.size()) << "ranges of " << width << " steps";
  }
  EXPECT_TRUE(r.ops(kFirstStep, -1).empty());
  EXPECT_TRUE(r.ops(40, kLastStep).empty());
}

TEST(trace_read_paths_test, two_readers_of_one_trace_in_one_process_see_every_row) {
  // As `ampscope diff a.h5 a.h5` opens it: HDF5 shares the file and its datasets between the readers.
  TempDir dir;
  const auto path = dir.file("twice.h5");
  const Written written = write_mixed_trace(path);
  TraceReader first(path);
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), first.ops(), "the first reader");
  TraceReader second(path);
  EXPECT_EQ(second.row_counts().ops, static_cast<std::int64_t>(written.ops.size()));
  expect_same_ops(expected_ops(written, 12, 13), second.ops(12, 13), "step 12 from the second reader");
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), second.ops(), "the second reader");
  expect_same_ops(expected_ops(written, 30, 40), first.ops(30, 40), "the first reader again");
}

bool have_h5repack() {
  std::string out;
  return testing::run_command("h5repack --version", out) == 0;
}

TEST(trace_read_paths_test, reads_a_trace_rewritten_by_h5repack_as_the_original) {
  if (!have_h5repack()) GTEST_SKIP() << "h5repack is not installed (Debian: hdf5-tools; scripts/setup.sh installs it)";
  TempDir dir;
  const auto original = dir.file("original.h5");
  const Written written = write_mixed_trace(original);
  // No filters; shuffle + deflate as HDF5 itself compresses (other chunk bytes, other chunk sizes);
  // deflate without shuffle; and no chunks at all.
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"no_filters", "-f NONE"},
      {"shuffle_gzip", "-f SHUF -f GZIP=1"},
      {"shuffle_gzip_rechunked", "-f SHUF -f GZIP=1 -l CHUNK=100"},
      {"gzip_only", "-f GZIP=6"},
      {"contiguous", "-l CONTI"},
  };
  for (const auto& [name, options] : variants) {
    SCOPED_TRACE("h5repack " + options);
    const auto repacked = dir.file(name + ".h5");
    std::string out;
    ASSERT_EQ(testing::run_command(fmt::format("h5repack {} {} {}", options, original.string(), repacked.string()), out), 0) << out;
    TraceReader r(repacked);
    expect_mixed_trace(r, written);
    if (HasFailure()) return;
  }
}

// Rewrites chunk `chunk` of /ops shuffled but not deflated, with the filter mask saying so (bit 1:
// the second filter, deflate, skipped), as HDF5 stores a chunk whose optional deflate failed.
void store_chunk_without_deflate(const std::filesystem::path& path, hsize_t chunk_rows, hsize_t chunk) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t ops = H5Dopen2(file, "/ops", H5P_DEFAULT);
  ASSERT_GE(ops, 0);
  const hsize_t offset = chunk * chunk_rows;
  hsize_t size = 0;
  ASSERT_GE(H5Dget_chunk_storage_size(ops, &offset, &size), 0);
  std::vector<Bytef> stored(size);
  std::uint32_t mask = 0;
  ASSERT_GE(H5Dread_chunk(ops, H5P_DEFAULT, &offset, &mask, stored.data()), 0);
  ASSERT_EQ(mask, 0u);
  const hid_t type = H5Dget_type(ops);
  std::vector<Bytef> shuffled(chunk_rows * H5Tget_size(type));
  H5Tclose(type);
  uLongf length = static_cast<uLongf>(shuffled.size());
  // The writer pads chunks it rewrites: inflate the stream itself, not what follows it.
  z_stream z{};
  ASSERT_EQ(inflateInit(&z), Z_OK);
  z.next_in = stored.data();
  z.avail_in = static_cast<uInt>(stored.size());
  z.next_out = shuffled.data();
  z.avail_out = static_cast<uInt>(length);
  ASSERT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  ASSERT_EQ(z.total_out, length);
  inflateEnd(&z);
  ASSERT_GE(H5Dwrite_chunk(ops, H5P_DEFAULT, 0x2, &offset, shuffled.size(), shuffled.data()), 0);
  H5Dclose(ops);
  H5Fclose(file);
}

TEST(trace_read_paths_test, reads_a_chunk_stored_with_a_filter_skipped_through_hdf5) {
  TempDir dir;
  const auto path = dir.file("masked.h5");
  const Written written = write_mixed_trace(path);
  store_chunk_without_deflate(path, 16, 3);  // rows 48-63: steps 2 and 3
  store_chunk_without_deflate(path, 16, 40);
  TraceReader r(path);
  expect_mixed_trace(r, written);
  expect_same_ops(expected_ops(written, 2, 3), r.ops(2, 3), "step 2, partly in the rewritten chunk");
}

// 40 steps of 23 ops (step 20 has none) in chunks of 16 rows, every table in step order: what a run writes without
// a flight recorder.
Written write_ordered_trace(const std::filesystem::path& path, bool close = true) {
  Written written;
  TraceWriter w(path, testing::sample_run(), {.chunk_rows = 16});
  for (std::int64_t step = 0; step < 40; ++step) {
    for (std::int64_t seq = 0; step != 20 && seq < 23; ++seq) {
      w.write(testing::numbered_op(step, seq));
      written.ops.emplace_back(step, seq);
    }
    for (std::int64_t k = 0; k < 3; ++k) w.write(numbered_grad(step, k));
    w.write(numbered_histogram(step, 1));
    w.write(testing::numbered_step(step));
    written.steps.push_back(step);
    w.end_step(step);
  }
  if (close) w.close();
  return written;
}

// The attribute steps_ascending of a table, read with HDF5 itself; nullopt when absent.
std::optional<std::int64_t> steps_ascending(const std::filesystem::path& path, const char* table) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  const hid_t dataset = H5Dopen2(file, table, H5P_DEFAULT);
  EXPECT_GE(dataset, 0);
  std::optional<std::int64_t> value;
  if (H5Aexists(dataset, "steps_ascending") > 0) {
    const hid_t attribute = H5Aopen(dataset, "steps_ascending", H5P_DEFAULT);
    std::int64_t v = -9;
    EXPECT_GE(H5Aread(attribute, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(attribute);
    value = v;
  }
  H5Dclose(dataset);
  H5Fclose(file);
  return value;
}

void set_steps_ascending(const std::filesystem::path& path, const char* table, std::int64_t value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t dataset = H5Dopen2(file, table, H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  const hid_t attribute = H5Aopen(dataset, "steps_ascending", H5P_DEFAULT);
  ASSERT_GE(attribute, 0);
  ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(attribute);
  H5Dclose(dataset);
  H5Fclose(file);
}

TEST(trace_read_paths_test, a_trace_written_in_step_order_says_so_and_reads_every_step_range_as_written) {
  TempDir dir;
  const auto path = dir.file("ordered.h5");
  const Written written = write_ordered_trace(path);
  for (const char* table : {"/ops", "/steps", "/grads", "/histograms", "/events", "/dumps", "/precision", "/fp8", "/blocks"}) {
    EXPECT_EQ(steps_ascending(path, table), 1) << table;
  }
  EXPECT_EQ(steps_ascending(path, "/dump_values"), std::nullopt);  // no steps there
  TraceReader r(path);
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), r.ops(), "all ops");
  // Ranges found by the binary search (of 1, 2, 3 and 7 steps, from before the first step to after the last, the
  // empty step 20 among them) hold exactly the rows written for them.
  for (std::int64_t width : {1, 2, 3, 7}) {
    for (std::int64_t begin = -2; begin < 43; begin += width) {
      expect_same_ops(expected_ops(written, begin, begin + width), r.ops(begin, begin + width),
                      fmt::format("steps [{}, {})", begin, begin + width));
      if (HasFailure()) return;
    }
  }
  EXPECT_TRUE(r.ops(20, 21).empty());
  EXPECT_TRUE(r.ops(kFirstStep, 0).empty());
  EXPECT_TRUE(r.ops(40, kLastStep).empty());
  const std::vector<GradRow> grads = r.grads(17, 19);
  ASSERT_EQ(grads.size(), 6u);
  for (std::size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(grads[i].param, numbered_grad(17 + static_cast<std::int64_t>(i / 3), static_cast<std::int64_t>(i % 3)).param);
  const std::vector<StepRow> steps = r.steps(38, kLastStep);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 38);
  EXPECT_EQ(steps[1].step, 39);
}

TEST(trace_read_paths_test, a_trace_with_rows_out_of_step_order_or_not_closed_is_not_marked_in_step_order) {
  TempDir dir;
  const auto mixed = dir.file("mixed.h5");
  write_mixed_trace(mixed);
  EXPECT_EQ(steps_ascending(mixed, "/ops"), 0);         // steps 10-14 after step 15, rows of step -1 between steps
  EXPECT_EQ(steps_ascending(mixed, "/grads"), 0);       // steps 10-14 after step 15
  EXPECT_EQ(steps_ascending(mixed, "/steps"), 1);       // written at each step's end, in order
  const auto unclosed = dir.file("unclosed.h5");
  write_ordered_trace(unclosed, false);  // the writer's destructor closes the file without `complete`
  EXPECT_EQ(steps_ascending(unclosed, "/ops"), 0);
  TraceReader r(unclosed);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.ops(12, 13).size(), 23u);
}

TEST(trace_read_paths_test, a_steps_ascending_attribute_that_lies_is_refused_as_damage_when_rows_show_it) {
  // The held-back steps 10-14 sit after step 15: a read of steps 10 to 15 from an attribute that says the rows are in
  // step order takes the rows from the first of step 10 or more (step 15's, after step 9's) to the first of step 15
  // or more as the binary search finds them: step 15's rows lie there, out of the range asked, and are refused. (What
  // such an attribute hides cannot always be seen: rows of a step outside the range searched are not read.)
  TempDir dir;
  const auto path = dir.file("lying.h5");
  const Written written = write_mixed_trace(path);
  set_steps_ascending(path, "/ops", 1);
  TraceReader r(path);
  // Steps 10 to 16: step 15's rows and then 10-14's, all in the range asked: read, in the order written.
  expect_same_ops(expected_ops(written, 10, 16), r.ops(10, 16), "steps [10, 16)");
  try {
    r.ops(10, 15);
    FAIL() << "expected a TraceError";
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("of '/ops': its step is "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("out of step order: the table's attribute 'steps_ascending' = 1 says its rows are "
                                         "in step order, and they are not (damaged)"),
              std::string::npos)
        << e.what();
  }
  // The whole table needs no search: every row, as written.
  expect_same_ops(expected_ops(written, kFirstStep, kLastStep), r.ops(), "all ops");
}

}  // namespace
}  // namespace ampscope::trace
