// Round trips through the HDF5 trace: every field of every table written by TraceWriter comes back
// from TraceReader as it was given (text of any length, whole: format_version 4),
// including NaN, infinities, -0, subnormal doubles and empty strings; rows are selected by step range;
// small chunks exercise chunks rewritten at step ends, and a tiny queue exercises back-pressure.
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <hdf5.h>

#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kDenormal = 4.9406564584124654e-324;  // the smallest positive double

TEST(trace_roundtrip_test, keeps_every_field_of_every_table) {
  TempDir dir;
  const auto path = dir.file("all.h5");

  StepRow step0 = testing::numbered_step(0);
  StepRow step1 = testing::numbered_step(1);
  step1.loss = kNaN;
  step1.scale_after = kInf;
  step1.grad_norm = -kInf;
  step1.lr = -0.0;
  step1.time_ms = kDenormal;

  OpRow plain = testing::numbered_op(0, 0);
  OpRow odd = testing::numbered_op(1, 1);
  odd.phase = Phase::scaler;
  odd.op = "";
  odd.module = "";
  odd.in_dtypes = "";
  odd.out_dtype = "bool";
  odd.shape = "[]";
  odd.autocast = "";
  odd.health.min = kNaN;
  odd.health.max = kInf;
  odd.health.absmax = -kInf;
  odd.health.mean = -0.0;
  odd.health.rms = kDenormal;
  odd.health.numel = std::numeric_limits<std::int64_t>::max();
  odd.cast_overflow = std::numeric_limits<std::int64_t>::min();
  OpRow optimizer = testing::numbered_op(1, 2);
  optimizer.phase = Phase::optimizer;
  OpRow backward = testing::numbered_op(1, 3);
  backward.phase = Phase::backward;
  backward.health.max = 1.7976931348623157e308;

  GradRow grad;
  grad.step = 1;
  grad.param = "blocks.3.attn.qkv.weight";
  grad.dtype = "bf16";
  grad.nan = 1;
  grad.pos_inf = 2;
  grad.neg_inf = 3;
  grad.zero = 4;
  grad.absmax = kInf;
  grad.norm = kNaN;
  grad.unscaled = true;
  GradRow grad_before = grad;
  grad_before.unscaled = false;
  grad_before.absmax = 65504.0;
  grad_before.norm = 1e300;

  EventRow event{.step = 1, .seq = 3, .kind = "origin", .op = "linear", .module = "blocks.3.attn.qkv",
                 .detail = "3 NaN, 1 +inf in the output of linear; inputs finite"};
  EventRow step_event{.step = 1, .seq = -1, .kind = "skipped_step", .op = "", .module = "", .detail = ""};

  HistogramRow hist;
  hist.step = 1;
  hist.seq = 3;
  hist.tensor = "output";
  for (std::size_t i = 0; i < hist.bins.size(); ++i) hist.bins[i] = static_cast<std::int64_t>(i * 1000 + 7);
  HistogramRow grad_hist;
  grad_hist.step = 1;
  grad_hist.seq = -1;
  grad_hist.tensor = "blocks.3.attn.qkv.weight";
  grad_hist.bins[kHistBins - 1] = 5;  // the NaN bin

  DumpRow dump{.step = 1, .seq = 3, .op = "linear", .module = "blocks.3.attn.qkv", .tensor = "input 0", .dtype = "f16",
               .shape = "[2, 3]", .values = {1.0, -2.5, kNaN, kInf, -kInf, -0.0}};
  DumpRow empty_dump{.step = 1, .seq = 3, .op = "linear", .module = "blocks.3.attn.qkv", .tensor = "output",
                     .dtype = "f16", .shape = "[0]", .values = {}};
  DumpRow long_dump{.step = 1, .seq = 4, .op = "matmul", .module = "m", .tensor = "output", .dtype = "f32",
                    .shape = "[50]", .values = {}};
  for (int i = 0; i < 50; ++i) long_dump.values.push_back(i * 0.5 - 3.0);

  const RunInfo run = testing::sample_run();
  {
    // Chunks of 4 rows (16 dump values): tables span several chunks and steps end inside chunks.
    TraceWriter w(path, run, {.chunk_rows = 4});
    w.write(step0);
    w.write(plain);
    w.end_step(0);
    w.write(odd);
    w.write(optimizer);
    w.write(backward);
    w.write(grad_before);
    w.write(grad);
    w.write(event);
    w.write(step_event);
    w.write(hist);
    w.write(grad_hist);
    w.write(dump);
    w.write(empty_dump);
    w.write(long_dump);
    w.write(step1);
    w.end_step(1);
    w.close();
  }

  TraceReader r(path);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.format_version(), kFormatVersion);
  EXPECT_EQ(r.run_info().precision, run.precision);
  EXPECT_EQ(r.run_info().device, run.device);
  EXPECT_EQ(r.run_info().model, run.model);
  EXPECT_EQ(r.run_info().seed, run.seed);
  EXPECT_EQ(r.run_info().config, run.config);
  EXPECT_EQ(r.last_flushed_step(), 1);

  const std::vector<StepRow> steps = r.steps();
  ASSERT_EQ(steps.size(), 2u);
  testing::expect_same_step(step0, steps[0]);
  testing::expect_same_step(step1, steps[1]);

  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), 4u);
  testing::expect_same_op(plain, ops[0]);
  testing::expect_same_op(odd, ops[1]);
  testing::expect_same_op(optimizer, ops[2]);
  testing::expect_same_op(backward, ops[3]);

  const std::vector<GradRow> grads = r.grads();
  ASSERT_EQ(grads.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const GradRow& e = i == 0 ? grad_before : grad;
    EXPECT_EQ(grads[i].step, e.step);
    EXPECT_EQ(grads[i].param, e.param);
    EXPECT_EQ(grads[i].dtype, e.dtype);
    EXPECT_EQ(grads[i].nan, e.nan);
    EXPECT_EQ(grads[i].pos_inf, e.pos_inf);
    EXPECT_EQ(grads[i].neg_inf, e.neg_inf);
    EXPECT_EQ(grads[i].zero, e.zero);
    EXPECT_SAME_DOUBLE(e.absmax, grads[i].absmax);
    EXPECT_SAME_DOUBLE(e.norm, grads[i].norm);
    EXPECT_EQ(grads[i].unscaled, e.unscaled);
  }

  const std::vector<EventRow> events = r.events();
  ASSERT_EQ(events.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const EventRow& e = i == 0 ? event : step_event;
    EXPECT_EQ(events[i].step, e.step);
    EXPECT_EQ(events[i].seq, e.seq);
    EXPECT_EQ(events[i].kind, e.kind);
    EXPECT_EQ(events[i].op, e.op);
    EXPECT_EQ(events[i].module, e.module);
    EXPECT_EQ(events[i].detail, e.detail);
  }

  const std::vector<HistogramRow> hists = r.histograms();
  ASSERT_EQ(hists.size(), 2u);
  EXPECT_EQ(hists[0].step, 1);
  EXPECT_EQ(hists[0].seq, 3);
  EXPECT_EQ(hists[0].tensor, "output");
  EXPECT_EQ(hists[0].bins, hist.bins);
  EXPECT_EQ(hists[1].seq, -1);
  EXPECT_EQ(hists[1].tensor, grad_hist.tensor);
  EXPECT_EQ(hists[1].bins, grad_hist.bins);

  const std::vector<DumpRow> dumps = r.dumps();
  ASSERT_EQ(dumps.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const DumpRow& e = i == 0 ? dump : i == 1 ? empty_dump : long_dump;
    EXPECT_EQ(dumps[i].step, e.step);
    EXPECT_EQ(dumps[i].seq, e.seq);
    EXPECT_EQ(dumps[i].op, e.op);
    EXPECT_EQ(dumps[i].module, e.module);
    EXPECT_EQ(dumps[i].tensor, e.tensor);
    EXPECT_EQ(dumps[i].dtype, e.dtype);
    EXPECT_EQ(dumps[i].shape, e.shape);
    ASSERT_EQ(dumps[i].values.size(), e.values.size());
    for (std::size_t k = 0; k < e.values.size(); ++k) EXPECT_SAME_DOUBLE(e.values[k], dumps[i].values[k]);
  }

  const RowCounts counts = r.row_counts();
  EXPECT_EQ(counts.steps, 2);
  EXPECT_EQ(counts.ops, 4);
  EXPECT_EQ(counts.grads, 2);
  EXPECT_EQ(counts.events, 2);
  EXPECT_EQ(counts.histograms, 2);
  EXPECT_EQ(counts.dumps, 3);
}

// The number of rows of a dataset, read with HDF5 itself.
hsize_t dataset_rows(const std::filesystem::path& path, const char* name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(file);
  return n;
}

TEST(trace_roundtrip_test, keeps_every_text_whole_however_long) {
  // Format_version 3 cut op names at 31 bytes and module paths at 63 (and every other text at its field's
  // width); format_version 4 keeps texts in a string table. Lengths past those widths, texts spanning
  // several chunks of /string_bytes (chunk_rows 3: 96 bytes), multi-byte UTF-8 and an embedded NUL.
  TempDir dir;
  const auto path = dir.file("long.h5");
  OpRow a = testing::numbered_op(0, 0);
  a.op = "binary_cross_entropy_with_logits_and_a_sixty_character_names";  // 60 characters
  ASSERT_EQ(a.op.size(), 60u);
  a.module = "encoder";
  while (a.module.size() < 200) a.module += ".block.11.layer.1.DenseReluDense";
  a.module.resize(200);
  a.autocast = std::string(300, 'r');
  a.in_dtypes = "f16";
  for (int i = 0; i < 40; ++i) a.in_dtypes += ",f16";  // cat of 41 tensors
  a.shape = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]";
  OpRow b = testing::numbered_op(0, 1);
  b.module = "\xC3\xA9";
  for (int i = 0; i < 100; ++i) b.module += ".\xE6\xA8\xA1\xE5\x9D\x97";  // ".模块" x 100
  b.op = std::string("nul\0inside", 10);
  OpRow c = a;  // the same texts again: stored once
  c.seq = 2;
  GradRow g{.step = 0, .param = std::string(500, 'p') + ".weight", .dtype = "f16"};
  EventRow e{.step = 0, .seq = 0, .kind = std::string(40, 'k'), .op = a.op, .module = a.module, .detail = std::string(1000, 'd')};
  HistogramRow h{.step = 0, .seq = 0, .tensor = g.param};
  DumpRow d{.step = 0, .seq = 0, .op = a.op, .module = a.module, .tensor = "input 0 of a long op", .dtype = "f16", .shape = a.shape, .values = {1.5}};
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 3});
    w.write(a);
    w.write(b);
    w.write(c);
    w.write(g);
    w.write(e);
    w.write(h);
    w.write(d);
    w.write(testing::numbered_step(0));
    w.end_step(0);
    w.close();
  }
  TraceReader r(path);
  EXPECT_EQ(r.format_version(), kFormatVersion);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), 3u);
  testing::expect_same_op(a, ops[0]);
  testing::expect_same_op(b, ops[1]);
  testing::expect_same_op(c, ops[2]);
  ASSERT_EQ(r.grads().size(), 1u);
  EXPECT_EQ(r.grads()[0].param, g.param);
  ASSERT_EQ(r.events().size(), 1u);
  EXPECT_EQ(r.events()[0].kind, e.kind);
  EXPECT_EQ(r.events()[0].module, e.module);
  EXPECT_EQ(r.events()[0].detail, e.detail);
  ASSERT_EQ(r.histograms().size(), 1u);
  EXPECT_EQ(r.histograms()[0].tensor, g.param);
  ASSERT_EQ(r.dumps().size(), 1u);
  EXPECT_EQ(r.dumps()[0].op, a.op);
  EXPECT_EQ(r.dumps()[0].tensor, d.tensor);
  EXPECT_EQ(r.dumps()[0].shape, a.shape);
  EXPECT_TRUE(r.damage().empty());
  // One row of /strings per distinct text given (a set of them), and their bytes back to back.
  std::set<std::string> distinct;
  for (const OpRow& o : {a, b, c}) {
    for (const std::string& t : {std::string(phase_name(o.phase)), o.op, o.module, o.in_dtypes, o.out_dtype, o.shape, o.autocast})
      distinct.insert(t);
  }
  for (const std::string& t : {g.param, g.dtype, e.kind, e.op, e.module, e.detail, h.tensor, d.op, d.module, d.tensor, d.dtype, d.shape})
    distinct.insert(t);
  EXPECT_EQ(dataset_rows(path, "/strings"), distinct.size());
  std::size_t bytes = 0;
  for (const std::string& t : distinct) bytes += t.size();
  EXPECT_EQ(dataset_rows(path, "/string_bytes"), bytes);
}

TEST(trace_roundtrip_test, stores_text_that_is_not_utf8_with_replacement_characters) {
  // Trace text is UTF-8 (h5py decodes it, JSON needs it): a byte that is not part of a well-formed
  // character is stored as U+FFFD (EF BF BD), the rest as given.
  TempDir dir;
  const auto path = dir.file("bytes.h5");
  OpRow o = testing::numbered_op(0, 0);
  o.module = "ok.\xFF.\xC3\xA9.\xC3.\xED\xA0\x80";  // 0xFF; é; a lone lead byte; an encoded surrogate
  {
    TraceWriter w(path, testing::sample_run());
    w.write(o);
    w.close();
  }
  TraceReader r(path);
  ASSERT_EQ(r.ops().size(), 1u);
  EXPECT_EQ(r.ops()[0].module, "ok.\xEF\xBF\xBD.\xC3\xA9.\xEF\xBF\xBD.\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(trace_roundtrip_test, selects_rows_by_step_range_in_written_order) {
  TempDir dir;
  const auto path = dir.file("range.h5");
  // Steps written out of order, as a flight recorder writing an anomalous step's history would.
  const std::vector<std::int64_t> order = {5, 3, 4, 0, 7};
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 3});
    for (std::int64_t step : order) {
      for (std::int64_t seq = 0; seq < 4; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.close();
  }
  TraceReader r(path);
  const std::vector<OpRow> ops = r.ops(3, 5);
  ASSERT_EQ(ops.size(), 8u);
  for (std::size_t i = 0; i < 8; ++i) testing::expect_same_op(testing::numbered_op(i < 4 ? 3 : 4, static_cast<std::int64_t>(i % 4)), ops[i]);
  EXPECT_TRUE(r.ops(1, 3).empty());
  EXPECT_TRUE(r.ops(8, 100).empty());
  const std::vector<StepRow> steps = r.steps(4, 8);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].step, 5);
  EXPECT_EQ(steps[1].step, 4);
  EXPECT_EQ(steps[2].step, 7);
  EXPECT_EQ(r.ops().size(), 20u);
  EXPECT_EQ(r.last_flushed_step(), 7);
}

TEST(trace_roundtrip_test, writes_every_row_through_a_queue_of_one_row) {
  TempDir dir;
  const auto path = dir.file("tiny_queue.h5");
  constexpr int kSteps = 20, kOps = 37;
  {
    TraceWriter w(path, testing::sample_run(), {.queue_rows = 1, .chunk_rows = 5, .compression_threads = 1});
    for (int step = 0; step < kSteps; ++step) {
      for (int seq = 0; seq < kOps; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.close();
  }
  TraceReader r(path);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), static_cast<std::size_t>(kSteps * kOps));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    testing::expect_same_op(testing::numbered_op(static_cast<std::int64_t>(i / kOps), static_cast<std::int64_t>(i % kOps)), ops[i]);
  }
  EXPECT_EQ(r.steps().size(), static_cast<std::size_t>(kSteps));
}

TEST(trace_roundtrip_test, stores_chunks_raw_when_compression_is_off) {
  TempDir dir;
  const auto path = dir.file("raw.h5");
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 8, .compression = 0});
    for (int seq = 0; seq < 20; ++seq) w.write(testing::numbered_op(0, seq));
    w.end_step(0);
    for (int seq = 20; seq < 30; ++seq) w.write(testing::numbered_op(0, seq));
    w.close();
  }
  TraceReader r(path);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), 30u);
  for (std::size_t i = 0; i < ops.size(); ++i) testing::expect_same_op(testing::numbered_op(0, static_cast<std::int64_t>(i)), ops[i]);
}

// Statistics whose mantissas look random, in chunks of 1024 rows, 700 a step: the writer puts their low bytes in
// stored deflate blocks (probes/trace/codec.h), in partial chunks rewritten at step ends and in full ones. Both
// the reader and HDF5's own shuffle + deflate filters (H5Dread) give back every value bit for bit, the special
// values among them included.
TEST(trace_roundtrip_test, keeps_random_statistics_of_large_chunks_through_hdf5s_own_filters) {
  TempDir dir;
  const auto path = dir.file("random.h5");
  std::mt19937_64 gen(2026);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0), sign(-1.0, 1.0);
  const auto value = [&] { return (sign(gen) < 0 ? -1.0 : 1.0) * std::exp2(exponent(gen)); };
  std::vector<OpRow> written;
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 1024});
    for (std::int64_t step = 0; step < 3; ++step) {
      for (std::int64_t seq = 0; seq < 700; ++seq) {
        OpRow row = testing::numbered_op(step, seq);
        for (double* x : {&row.health.min, &row.health.max, &row.health.absmax, &row.health.mean, &row.health.rms}) *x = value();
        if (seq == 5) row.health.min = kNaN;
        if (seq == 6) row.health.max = -kInf;
        if (seq == 7) row.health.mean = -0.0;
        if (seq == 8) row.health.rms = kDenormal;
        w.write(row);
        written.push_back(row);
      }
      w.end_step(step);
    }
    w.close();
  }
  TraceReader r(path);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), written.size());
  for (std::size_t i = 0; i < ops.size(); ++i) testing::expect_same_op(written[i], ops[i]);

  // format_version 9 stores absmax as absmax_xor: its bits XOR those of max(|min|, |max|), computed here as the
  // docs' numpy recipe does (np.maximum returns a NaN operand, the first when both are).
  struct Statistics {
    std::int64_t step, seq;
    double min, max;
    std::uint64_t absmax_xor;
    double mean, rms;
  };
  const auto absmax_of = [](const Statistics& s) {
    const double a = std::fabs(s.min), b = std::fabs(s.max);
    const double derived = std::isnan(a) ? a : std::isnan(b) ? b : std::max(a, b);
    return std::bit_cast<double>(std::bit_cast<std::uint64_t>(derived) ^ s.absmax_xor);
  };
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t dataset = H5Dopen2(file, "/ops", H5P_DEFAULT);
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(Statistics));
  H5Tinsert(type, "step", offsetof(Statistics, step), H5T_NATIVE_INT64);
  H5Tinsert(type, "seq", offsetof(Statistics, seq), H5T_NATIVE_INT64);
  H5Tinsert(type, "min", offsetof(Statistics, min), H5T_NATIVE_DOUBLE);
  H5Tinsert(type, "max", offsetof(Statistics, max), H5T_NATIVE_DOUBLE);
  H5Tinsert(type, "absmax_xor", offsetof(Statistics, absmax_xor), H5T_NATIVE_UINT64);
  H5Tinsert(type, "mean", offsetof(Statistics, mean), H5T_NATIVE_DOUBLE);
  H5Tinsert(type, "rms", offsetof(Statistics, rms), H5T_NATIVE_DOUBLE);
  std::vector<Statistics> rows(written.size());
  const herr_t read = H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data());
  H5Tclose(type);
  H5Dclose(dataset);
  H5Fclose(file);
  ASSERT_GE(read, 0);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const OpRow& e = written[i];
    ASSERT_EQ(rows[i].step, e.step);
    ASSERT_EQ(rows[i].seq, e.seq);
    EXPECT_SAME_DOUBLE(e.health.min, rows[i].min);
    EXPECT_SAME_DOUBLE(e.health.max, rows[i].max);
    EXPECT_SAME_DOUBLE(e.health.absmax, absmax_of(rows[i]));
    EXPECT_SAME_DOUBLE(e.health.mean, rows[i].mean);
    EXPECT_SAME_DOUBLE(e.health.rms, rows[i].rms);
  }
}

// /ops' absmax_xor (format_version 9) column of a finished trace, read with HDF5 alone.
std::vector<std::uint64_t> absmax_xor_column(const std::filesystem::path& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, "/ops", H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  std::vector<std::uint64_t> out(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(std::uint64_t));
  H5Tinsert(type, "absmax_xor", 0, H5T_NATIVE_UINT64);
  const herr_t read = H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Tclose(type);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  EXPECT_GE(read, 0);
  return out;
}

// absmax comes back bit for bit whatever it is: derived from min and max (absmax_xor 0, the probe's rows), or not
// (a NaN with a payload, a signalling NaN, -NaN, -0, inf, a value above both, NaN beside numbers and the reverse).
TEST(trace_roundtrip_test, keeps_every_absmax_bit_for_bit_and_stores_zero_when_derived) {
  TempDir dir;
  const auto path = dir.file("absmax.h5");
  const auto bits = [](std::uint64_t b) { return std::bit_cast<double>(b); };
  const double quiet = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double min, max, absmax;
    bool derived;  // absmax is max(|min|, |max|) as numpy computes it: absmax_xor must be 0
  };
  const std::vector<Case> cases = {
      {-3.0, 2.0, 3.0, true},
      {-0.5, 7.25, 7.25, true},
      {-0.0, 0.0, 0.0, true},
      {quiet, quiet, quiet, true},                  // an empty tensor's row: every statistic NaN
      {-2.0, 1.0, 5.0, false},                      // an absmax above both
      {-2.0, 1.0, -0.0, false},
      {-2.0, 1.0, kInf, false},
      {-2.0, 1.0, bits(0x7FF8000000001234), false},  // a quiet NaN's payload
      {-2.0, 1.0, bits(0x7FF0000000000001), false},  // a signalling NaN
      {-2.0, 1.0, bits(0xFFF8000000000000), false},  // -NaN
      {quiet, 4.0, 4.0, false},                      // derived is NaN (|min|), absmax a number
      {bits(0xFFF8000000000abc), bits(0x7FF800000000def0), bits(0x7FF8000000000abc), true},  // |min|'s NaN
      {1.0, bits(0x7FF800000000def0), bits(0x7FF800000000def0), true},                        // |max|'s NaN
      {-kInf, 1.0, kInf, true},
  };
  {
    TraceWriter w(path, testing::sample_run());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      OpRow row = testing::numbered_op(0, static_cast<std::int64_t>(i));
      row.health.min = cases[i].min;
      row.health.max = cases[i].max;
      row.health.absmax = cases[i].absmax;
      w.write(row);
    }
    w.end_step(0);
    w.close();
  }
  const std::vector<OpRow> ops = TraceReader(path).ops();
  const std::vector<std::uint64_t> xors = absmax_xor_column(path);
  ASSERT_EQ(ops.size(), cases.size());
  ASSERT_EQ(xors.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(ops[i].health.absmax), std::bit_cast<std::uint64_t>(cases[i].absmax));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(ops[i].health.min), std::bit_cast<std::uint64_t>(cases[i].min));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(ops[i].health.max), std::bit_cast<std::uint64_t>(cases[i].max));
    EXPECT_EQ(xors[i] == 0, cases[i].derived) << std::hex << xors[i];
  }
}

// A format_version 8 trace (tests/fixtures/v8-transformer-fp16.h5: `ampscope train --sample transformer --device cpu
// --steps 2 --seed 1`, written at 8b480c1, before format 9) reads its stored absmax, as HDF5 reads the field.
TEST(trace_roundtrip_test, reads_the_absmax_a_format_8_trace_stores) {
  const auto path = std::filesystem::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures" / "v8-transformer-fp16.h5";
  TraceReader r(path);
  ASSERT_EQ(r.format_version(), 8);
  const std::vector<OpRow> ops = r.ops();
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, "/ops", H5P_DEFAULT);
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(double));
  H5Tinsert(type, "absmax", 0, H5T_NATIVE_DOUBLE);
  std::vector<double> stored(ops.size());
  const herr_t read = H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, stored.data());
  H5Tclose(type);
  H5Dclose(dataset);
  H5Fclose(file);
  ASSERT_GE(read, 0);
  ASSERT_GT(ops.size(), 100u);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint64_t>(ops[i].health.absmax), std::bit_cast<std::uint64_t>(stored[i])) << "row " << i;
  }
}

TEST(trace_roundtrip_test, leaves_complete_zero_when_destroyed_without_close) {
  TempDir dir;
  const auto path = dir.file("unclosed.h5");
  {
    TraceWriter w(path, testing::sample_run());
    w.write(testing::numbered_op(0, 0));
    w.end_step(0);
    w.write(testing::numbered_op(1, 0));  // after the last step end: written by the destructor
  }
  TraceReader r(path);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(r.ops().size(), 2u);
}

TEST(trace_roundtrip_test, reads_an_empty_trace) {
  TempDir dir;
  const auto path = dir.file("empty.h5");
  TraceWriter(path, testing::sample_run()).close();
  TraceReader r(path);
  EXPECT_TRUE(r.complete());
  EXPECT_TRUE(r.steps().empty());
  EXPECT_TRUE(r.ops().empty());
  EXPECT_TRUE(r.dumps().empty());
  EXPECT_EQ(r.last_flushed_step(), -1);  // flushed by close() before any end_step()
}

// The chunk size HDF5 reports for a dataset of a finished trace.
hsize_t chunk_rows_of(const std::filesystem::path& path, const char* dataset) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t data = H5Dopen2(file, dataset, H5P_DEFAULT);
  const hid_t dcpl = H5Dget_create_plist(data);
  hsize_t rows = 0;
  H5Pget_chunk(dcpl, 1, &rows);
  H5Pclose(dcpl);
  H5Dclose(data);
  H5Fclose(file);
  return rows;
}

TEST(trace_roundtrip_test, sizes_chunks_from_the_first_step) {
  TempDir dir;
  const auto path = dir.file("auto.h5");
  {
    TraceWriter w(path, testing::sample_run());
    for (int step = 0; step < 3; ++step) {
      for (int seq = 0; seq < 37; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.close();
  }
  // Four first steps' rows, rounded up to a multiple of 64; at least 64 (1024 for dump values).
  EXPECT_EQ(chunk_rows_of(path, "/ops"), 192u);
  EXPECT_EQ(chunk_rows_of(path, "/steps"), 64u);
  EXPECT_EQ(chunk_rows_of(path, "/grads"), 64u);
  EXPECT_EQ(chunk_rows_of(path, "/dump_values"), 1024u);
  TraceReader r(path);
  EXPECT_EQ(r.ops().size(), 3u * 37u);
}

TEST(trace_roundtrip_test, chooses_chunks_early_when_the_first_step_is_long) {
  TempDir dir;
  const auto path = dir.file("long_step.h5");
  constexpr int kRows = 9000;  // more than the largest automatic chunk of /ops (1024 rows)
  {
    TraceWriter w(path, testing::sample_run());
    for (int seq = 0; seq < kRows; ++seq) w.write(testing::numbered_op(0, seq));
    w.end_step(0);
    w.close();
  }
  EXPECT_EQ(chunk_rows_of(path, "/ops"), 1024u);
  TraceReader r(path);
  const std::vector<OpRow> ops = r.ops();
  ASSERT_EQ(ops.size(), static_cast<std::size_t>(kRows));
  for (std::size_t i = 0; i < ops.size(); i += 997) testing::expect_same_op(testing::numbered_op(0, static_cast<std::int64_t>(i)), ops[i]);
  testing::expect_same_op(testing::numbered_op(0, kRows - 1), ops.back());
}

}  // namespace
}  // namespace ampscope::trace
