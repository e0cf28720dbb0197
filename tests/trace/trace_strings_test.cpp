// The string table of format_version 4 (/strings, /string_bytes) under damage, and the older versions'
// fixed-width text: a text whose bytes, entry or count changed is never read as another name (the reader
// names the row, the field and the string), and the committed fixtures of format_version 1 to 3 read the
// texts HDF5 itself reads from their fixed-width fields.
#include <hdf5.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "probes/trace/layout.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const fs::path kFixtures = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures";

// Writes `value` into field `field` (int64) of row `row` of `table` through HDF5, which compresses the
// chunk again: a change that every chunk checksum agrees with.
void set_field(const fs::path& path, const char* table, const char* field, hsize_t row, std::int64_t value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t ds = H5Dopen2(file, table, H5P_DEFAULT);
  const hid_t type = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(type, field, 0, H5T_NATIVE_INT64);
  const hid_t space = H5Dget_space(ds);
  const hsize_t count = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &row, nullptr, &count, nullptr);
  const hid_t memory = H5Screate_simple(1, &count, nullptr);
  EXPECT_GE(H5Dwrite(ds, type, memory, space, H5P_DEFAULT, &value), 0);
  H5Sclose(memory);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(ds);
  H5Fclose(file);
}

void flip_text_byte(const fs::path& path, hsize_t at) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t ds = H5Dopen2(file, "/string_bytes", H5P_DEFAULT);
  const hid_t space = H5Dget_space(ds);
  const hsize_t count = 1;
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &at, nullptr, &count, nullptr);
  const hid_t memory = H5Screate_simple(1, &count, nullptr);
  unsigned char b = 0;
  EXPECT_GE(H5Dread(ds, H5T_NATIVE_UCHAR, memory, space, H5P_DEFAULT, &b), 0);
  b ^= 0x01;
  EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_UCHAR, memory, space, H5P_DEFAULT, &b), 0);
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(file);
}

// Two ops: texts in order of first use: "forward" 0, "linear" 1, "blocks.0.attn.qkv" 2, ...
void write_two_ops(const fs::path& path) {
  TraceWriter w(path, testing::sample_run());
  w.write(testing::numbered_op(0, 0));
  w.write(testing::numbered_op(0, 1));
  w.write(testing::numbered_step(0));
  w.close();
}

std::string ops_error(const fs::path& path) {
  try {
    TraceReader r(path);
    r.ops();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

TEST(trace_strings_test, a_changed_text_byte_is_refused_naming_the_row_field_and_string) {
  TempDir dir;
  const auto path = dir.file("t.h5");
  write_two_ops(path);
  flip_text_byte(path, 8);  // "forward" is bytes 0-6; "linear" starts at 7: its 'i' becomes 'h'
  EXPECT_NE(ops_error(path).find("row 0 of '/ops': its field 'op' names string 1 of '/strings', which is damaged: its checksum does not "
                                 "match its text"),
            std::string::npos)
      << ops_error(path);
  // The steps, which name no text, still read; the damage note names the string.
  TraceReader r(path);
  EXPECT_EQ(r.steps().size(), 1u);
  EXPECT_THROW(r.ops(), TraceError);
  ASSERT_EQ(r.damage().size(), 1u);
  EXPECT_EQ(r.damage()[0].rfind("1 of the ", 0), 0u) << r.damage()[0];
  EXPECT_NE(r.damage()[0].find("(first string 1: its checksum does not match its text)"), std::string::npos) << r.damage()[0];
}

TEST(trace_strings_test, an_entry_pointing_elsewhere_or_outside_the_bytes_is_refused) {
  TempDir dir;
  const auto path = dir.file("t.h5");
  write_two_ops(path);
  set_field(path, "/strings", "offset", 1, 0);  // "linear" now points at "forwar": its checksum disagrees
  EXPECT_NE(ops_error(path).find("names string 1 of '/strings', which is damaged: its checksum does not match its text"), std::string::npos)
      << ops_error(path);
  write_two_ops(path);
  set_field(path, "/strings", "length", 2, std::int64_t{1} << 40);
  EXPECT_NE(ops_error(path).find("its field 'module' names string 2 of '/strings', which is damaged: its bytes lie outside "
                                 "'/string_bytes'"),
            std::string::npos)
      << ops_error(path);
}

TEST(trace_strings_test, a_text_id_that_names_no_string_is_refused) {
  TempDir dir;
  const auto path = dir.file("t.h5");
  for (const std::int64_t id : {std::int64_t{-1}, std::int64_t{1} << 62, std::int64_t{9999}}) {
    write_two_ops(path);
    set_field(path, "/ops", "module", 1, id);
    const std::string expected = fmt::format("row 1 of '/ops': its field 'module' names string {}, but '/strings' holds", id);
    EXPECT_NE(ops_error(path).find(expected), std::string::npos) << ops_error(path);
  }
  // An unknown phase name (a valid text that is no phase) is refused as in every version.
  write_two_ops(path);
  set_field(path, "/ops", "phase", 0, 1);  // "linear"
  EXPECT_NE(ops_error(path).find("row 0 of '/ops': unknown phase 'linear'"), std::string::npos) << ops_error(path);
}

TEST(trace_strings_test, rows_a_refresh_trusts_find_their_texts_whatever_the_order_of_flushes) {
  // A live reader loads texts as later steps bring them: step 1's new module is there after a refresh.
  TempDir dir;
  const auto path = dir.file("live.h5");
  TraceWriter w(path, testing::sample_run(), {.chunk_rows = 2});
  w.write(testing::numbered_op(0, 0));
  w.write(testing::numbered_step(0));
  w.flush();
  TraceReader r(path);
  ASSERT_EQ(r.ops().size(), 1u);
  OpRow later = testing::numbered_op(1, 0);
  later.module = std::string(500, 'z') + ".new";
  w.write(later);
  w.write(testing::numbered_step(1));
  w.flush();
  r.refresh();
  const auto ops = r.ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[1].module, later.module);
  w.close();
}

// --- older versions: the texts HDF5 reads from the fixed-width fields ---

struct RawOp {
  std::int64_t step, seq;
  char op[32];
  char module[64];
  char shape[48];
};

std::vector<RawOp> raw_ops(const fs::path& path) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(file, 0);
  const hid_t ds = H5Dopen2(file, "/ops", H5P_DEFAULT);
  const hid_t type = H5Tcreate(H5T_COMPOUND, sizeof(RawOp));
  H5Tinsert(type, "step", HOFFSET(RawOp, step), H5T_NATIVE_INT64);
  H5Tinsert(type, "seq", HOFFSET(RawOp, seq), H5T_NATIVE_INT64);
  auto text = [&](const char* name, std::size_t offset, std::size_t width) {
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, width);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    H5Tset_cset(t, H5T_CSET_UTF8);  // as the file's: HDF5 converts no character set to another
    H5Tinsert(type, name, offset, t);
    H5Tclose(t);
  };
  text("op", HOFFSET(RawOp, op), 32);
  text("module", HOFFSET(RawOp, module), 64);
  text("shape", HOFFSET(RawOp, shape), 48);
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  std::vector<RawOp> rows(n);
  EXPECT_GE(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), 0);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(ds);
  H5Fclose(file);
  return rows;
}

TEST(trace_strings_test, the_fixtures_of_format_versions_1_to_3_read_the_texts_hdf5_reads) {
  // Steps: what h5dump -H shows as the extent of /steps.
  for (const auto& [name, version, steps] : {std::tuple{"v1-mlp-log-zero.h5", 1, 3u}, {"v2-mlp-log-zero-full.h5", 2, 4u},
                                             {"v3-mlp-log-zero-full.h5", 3, 4u}}) {
    SCOPED_TRACE(name);
    const fs::path path = kFixtures / name;
    const std::vector<RawOp> raw = raw_ops(path);
    TraceReader r(path);
    EXPECT_EQ(r.format_version(), version);
    EXPECT_TRUE(r.damage().empty());
    const auto ops = r.ops();
    ASSERT_EQ(ops.size(), raw.size());
    ASSERT_GT(ops.size(), 20u);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(ops[i].step, raw[i].step);
      EXPECT_EQ(ops[i].seq, raw[i].seq);
      EXPECT_EQ(ops[i].op, std::string(raw[i].op));
      EXPECT_EQ(ops[i].module, std::string(raw[i].module));
      EXPECT_EQ(ops[i].shape, std::string(raw[i].shape));
    }
    EXPECT_EQ(r.steps().size(), steps);
    EXPECT_FALSE(r.events().empty());
  }
}

}  // namespace
}  // namespace ampscope::trace
