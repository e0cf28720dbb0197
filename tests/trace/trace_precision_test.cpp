// tests/trace/trace_precision_test.cpp: the /precision table (format_version 5; its phase field 6): rows written
// and read back field for field, a format_version 4 trace read as one without precision rows, a format_version 5
// trace read with forward rows only, damaged rows refused naming the row and the field, and `ampscope train
// --twin` writing one row per twinned op and per twinned backward node.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "probes/trace/layout.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/run.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const fs::path kFixtures = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures";

// A row whose every field is distinct and depends on (step, seq).
PrecisionRow numbered_precision(std::int64_t step, std::int64_t seq) {
  PrecisionRow r;
  r.step = step;
  r.seq = seq;
  r.op = seq % 2 == 0 ? "rsub" : "sigmoid";
  r.module = seq % 3 == 0 ? "" : "blocks." + std::to_string(seq) + ".mlp";
  r.out_dtype = seq % 2 == 0 ? "f16" : "bf16";
  r.numel = 64 + seq;
  r.local = seq % 2 == 0;
  r.local_max_rel = 1e-4 * static_cast<double>(seq + 1);
  r.local_mean_rel = 2e-5 * static_cast<double>(seq + 1);
  r.local_max_ulp = 0.5 + static_cast<double>(seq);
  r.acc_max_rel = 1.0 + static_cast<double>(step);
  r.acc_mean_rel = 0.25 + static_cast<double>(seq);
  r.acc_max_ulp = 4096.0 * static_cast<double>(seq + 1);
  r.in_acc_max_rel = 5.1e-5 * static_cast<double>(step + 1);
  r.in_acc_mean_rel = 1.5e-5 * static_cast<double>(step + 1);
  r.flips = 3 * seq;
  r.bits = 11.0 - static_cast<double>(seq % 11);
  r.cond = seq % 2 == 0 ? 1e4 + static_cast<double>(seq) : std::numeric_limits<double>::quiet_NaN();
  r.followed = seq % 4 != 1;
  r.phase = seq % 3 == 2 ? Phase::backward : Phase::forward;
  return r;
}

void expect_same(const PrecisionRow& want, const PrecisionRow& got) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_EQ(got.op, want.op);
  EXPECT_EQ(got.module, want.module);
  EXPECT_EQ(got.out_dtype, want.out_dtype);
  EXPECT_EQ(got.numel, want.numel);
  EXPECT_EQ(got.local, want.local);
  EXPECT_SAME_DOUBLE(want.local_max_rel, got.local_max_rel);
  EXPECT_SAME_DOUBLE(want.local_mean_rel, got.local_mean_rel);
  EXPECT_SAME_DOUBLE(want.local_max_ulp, got.local_max_ulp);
  EXPECT_SAME_DOUBLE(want.acc_max_rel, got.acc_max_rel);
  EXPECT_SAME_DOUBLE(want.acc_mean_rel, got.acc_mean_rel);
  EXPECT_SAME_DOUBLE(want.acc_max_ulp, got.acc_max_ulp);
  EXPECT_SAME_DOUBLE(want.in_acc_max_rel, got.in_acc_max_rel);
  EXPECT_SAME_DOUBLE(want.in_acc_mean_rel, got.in_acc_mean_rel);
  EXPECT_EQ(got.flips, want.flips);
  EXPECT_SAME_DOUBLE(want.bits, got.bits);
  EXPECT_SAME_DOUBLE(want.cond, got.cond);
  EXPECT_EQ(got.followed, want.followed);
  EXPECT_EQ(got.phase, want.phase);
}

// Writes `steps` steps of `per_step` precision rows (and a step row each) to `path`.
std::vector<PrecisionRow> write_trace(const fs::path& path, int steps, int per_step) {
  std::vector<PrecisionRow> rows;
  TraceWriter w(path, testing::sample_run());
  for (int s = 0; s < steps; ++s) {
    for (int q = 0; q < per_step; ++q) {
      rows.push_back(numbered_precision(s, q));
      w.write(rows.back());
    }
    w.write(testing::numbered_step(s));
    w.end_step(s);
  }
  w.close();
  return rows;
}

TEST(trace_precision_test, reads_back_every_field_of_every_row_by_step_range) {
  TempDir dir;
  const fs::path path = dir.file("p.h5");
  const std::vector<PrecisionRow> rows = write_trace(path, 3, 5);
  TraceReader r(path);
  EXPECT_EQ(r.format_version(), 9);
  EXPECT_EQ(r.row_counts().precision, 15);
  const std::vector<PrecisionRow> all = r.precision();
  ASSERT_EQ(all.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    expect_same(rows[i], all[i]);
  }
  const std::vector<PrecisionRow> one = r.precision(1, 2);
  ASSERT_EQ(one.size(), 5u);
  for (const PrecisionRow& row : one) EXPECT_EQ(row.step, 1);
}

TEST(trace_precision_test, a_format_version_4_trace_reads_with_an_empty_precision_table) {
  TraceReader r(kFixtures / "v4-mlp-log-zero-full.h5");
  EXPECT_EQ(r.format_version(), 4);
  EXPECT_TRUE(r.damage().empty());
  EXPECT_TRUE(r.precision().empty());
  EXPECT_EQ(r.row_counts().precision, 0);
  // The rest reads as written: 4 steps of the mlp's log-zero scenario, each with its log origin.
  EXPECT_EQ(r.steps().size(), 4u);
  bool log_origin = false;
  for (const OpRow& op : r.ops()) log_origin = log_origin || (op.op == "log" && op.origin);
  EXPECT_TRUE(log_origin);
}

// A trace written by ampscope with format_version 5 (`ampscope train --sample mlp --steps 3 --twin`, the f32 twin
// of the forward pass only): its rows read, every one a forward row, and its report has no backward list.
TEST(trace_precision_test, a_format_version_5_trace_reads_its_rows_as_forward_rows) {
  TraceReader r(kFixtures / "v5-mlp-twin.h5");
  EXPECT_EQ(r.format_version(), 5);
  EXPECT_TRUE(r.damage().empty());
  const std::vector<PrecisionRow> rows = r.precision();
  ASSERT_EQ(rows.size(), 24u);  // 3 steps of the mlp's 8 twinned forward ops (h5py reads 24 rows)
  for (const PrecisionRow& row : rows) EXPECT_EQ(row.phase, Phase::forward);
  EXPECT_EQ(rows.front().step, 0);
  EXPECT_EQ(rows.back().step, 2);
  const auto linear = std::find_if(rows.begin(), rows.end(), [](const PrecisionRow& row) { return row.op == "linear"; });
  ASSERT_NE(linear, rows.end());
  EXPECT_TRUE(linear->local);
  EXPECT_EQ(linear->out_dtype, "f16");
}

// Writes `value` into `field` of row `row` of /precision through HDF5, as `memory` (a native type; -1 for a flag).
template <class T>
void set_field(const fs::path& path, const char* field, hid_t memory, hsize_t row, T value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t ds = H5Dopen2(file, "/precision", H5P_DEFAULT);
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(T));
  if (memory < 0) {
    // A flag: the file's own 8-bit enumeration, so HDF5 stores the byte as it is, whatever its value.
    const hid_t file_type = H5Dget_type(ds);
    const hid_t member = H5Tget_member_type(file_type, static_cast<unsigned>(H5Tget_member_index(file_type, field)));
    H5Tinsert(type, field, 0, member);
    H5Tclose(member);
    H5Tclose(file_type);
  } else {
    H5Tinsert(type, field, 0, memory);
  }
  const hid_t space = H5Dget_space(ds);
  const hsize_t one = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &row, nullptr, &one, nullptr);
  const hid_t mspace = H5Screate_simple(1, &one, nullptr);
  EXPECT_GE(H5Dwrite(ds, type, mspace, space, H5P_DEFAULT, &value), 0);
  H5Sclose(mspace);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(ds);
  H5Fclose(file);
}

std::string precision_error(const fs::path& path) {
  try {
    TraceReader r(path);
    r.precision();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "(read without an error)";
}

TEST(trace_precision_test, refuses_a_damaged_row_naming_the_row_and_the_field) {
  TempDir dir;
  struct Case {
    const char* field;
    std::function<void(const fs::path&)> damage;
    const char* says;
  };
  const Case cases[] = {
      {"flips", [](const fs::path& p) { set_field<std::int64_t>(p, "flips", H5T_NATIVE_INT64, 7, -3); },
       "row 7 of '/precision': its field 'flips' is -3, not a count (0 or more)"},
      {"numel", [](const fs::path& p) { set_field<std::int64_t>(p, "numel", H5T_NATIVE_INT64, 2, -1); },
       "row 2 of '/precision': its field 'numel' is -1, not a count (0 or more)"},
      {"acc_mean_rel",
       [](const fs::path& p) { set_field<double>(p, "acc_mean_rel", H5T_NATIVE_DOUBLE, 4, std::nan("")); },
       "row 4 of '/precision': its field 'acc_mean_rel' is nan, not a non-negative number"},
      {"cond", [](const fs::path& p) { set_field<double>(p, "cond", H5T_NATIVE_DOUBLE, 0, -2.0); },
       "row 0 of '/precision': its field 'cond' is -2, not a condition number (NaN or 0 or more)"},
      {"local", [](const fs::path& p) { set_field<std::int8_t>(p, "local", -1, 3, 7); },
       "row 3 of '/precision': its field 'local' is 7, not a flag (0 or 1)"},
      {"op", [](const fs::path& p) { set_field<std::int64_t>(p, "op", H5T_NATIVE_INT64, 5, 1 << 20); },
       "row 5 of '/precision': its field 'op' names string 1048576, but '/strings' holds"},
      {"out_dtype",
       [](const fs::path& p) {
         // Another row's op name as the dtype: a sound text that is not a dtype.
         set_field<std::int64_t>(p, "out_dtype", H5T_NATIVE_INT64, 6, 0);
       },
       "row 6 of '/precision': its field 'out_dtype' is"},
      {"phase",
       [](const fs::path& p) {
         // A sound text that is not a phase (string 0 is a row's op name).
         set_field<std::int64_t>(p, "phase", H5T_NATIVE_INT64, 1, 0);
       },
       "row 1 of '/precision': unknown phase"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    const fs::path path = dir.file(std::string(c.field) + ".h5");
    write_trace(path, 2, 5);
    c.damage(path);
    const std::string error = precision_error(path);
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
}

TEST(trace_precision_test, train_with_twin_writes_a_row_per_twinned_op_of_every_twinned_step) {
  TempDir dir;
  samples::TrainConfig c;
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 4;
  c.precision = samples::Precision::fp16;
  c.twin = true;
  c.twin_every = 2;
  c.out = dir.file("twin.h5").string();
  samples::train(c);
  TraceReader r(c.out);
  const std::vector<PrecisionRow> rows = r.precision();
  ASSERT_FALSE(rows.empty());
  std::vector<std::int64_t> steps;
  for (const PrecisionRow& row : rows) {
    if (steps.empty() || steps.back() != row.step) steps.push_back(row.step);
  }
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 2}));
  // Each row names an /ops row of its step and phase with the same op and module (and, forward, output dtype):
  // a backward row is an autograd node's, named by its forward op.
  const std::vector<OpRow> ops = r.ops();
  std::int64_t backward = 0;
  for (const PrecisionRow& row : rows) {
    const auto it = std::find_if(ops.begin(), ops.end(), [&](const OpRow& o) {
      return o.step == row.step && o.seq == row.seq && o.phase == row.phase;
    });
    ASSERT_NE(it, ops.end()) << row.op << " at step " << row.step << " seq " << row.seq;
    EXPECT_EQ(it->op, row.op);
    EXPECT_EQ(it->module, row.module);
    if (row.phase == Phase::forward) {
      EXPECT_EQ(it->out_dtype, row.out_dtype);
    }
    if (row.phase == Phase::backward) {
      ++backward;
      EXPECT_TRUE(row.local);
      EXPECT_EQ(row.acc_max_rel, 0.0);
    }
  }
  EXPECT_GT(backward, 0);  // the f16 linears' backward nodes
  // The mlp's first linear runs in f16 under autocast: twinned with local errors.
  const auto linear = std::find_if(rows.begin(), rows.end(), [](const PrecisionRow& row) { return row.op == "linear"; });
  ASSERT_NE(linear, rows.end());
  EXPECT_TRUE(linear->local);
  EXPECT_EQ(linear->out_dtype, "f16");
}

}  // namespace
}  // namespace ampscope::trace
