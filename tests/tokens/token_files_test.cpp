// Token files read back to ids written by hand: .npy bytes built in the test from the format's description
// (every dtype, versions 1.0, 2.0 and 3.0, headers as numpy writes them and as a hand-written file may
// hold them), raw uint16 .bin files and .txt files with every kind of whitespace.
#include <gtest/gtest.h>

#include "models/token_data.h"
#include "tests/test_support.h"
#include "tests/tokens/token_test_util.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using testing::Bytes;
using testing::le_values;
using testing::make_npy;
using testing::write_bytes;
using testing::write_text;

fs::path scratch() { return testing::process_scratch_dir("ampscope_token_files"); }

using Ids = std::vector<std::int32_t>;

TEST(token_files_test, reads_npy_int32_version_1_as_numpy_writes_it) {
  const fs::path p = scratch() / "i4.npy";
  write_bytes(p, make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (5,), }",
                          le_values({0, 1, 50256, 65536, 2147483647}, 4)));
  EXPECT_EQ(load_tokens(p), (Ids{0, 1, 50256, 65536, 2147483647}));
}

TEST(token_files_test, reads_npy_int64_uint16_and_uint8) {
  const fs::path i8 = scratch() / "i8.npy", u2 = scratch() / "u2.npy", u1 = scratch() / "u1.npy";
  write_bytes(i8, make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }",
                           le_values({0, 7, 128255, 2147483647}, 8)));
  write_bytes(u2, make_npy(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }",
                           le_values({0, 256, 50256, 65535}, 2)));
  write_bytes(u1, make_npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", Bytes{0, 104, 255}));
  EXPECT_EQ(load_tokens(i8), (Ids{0, 7, 128255, 2147483647}));
  EXPECT_EQ(load_tokens(u2), (Ids{0, 256, 50256, 65535}));
  EXPECT_EQ(load_tokens(u1), (Ids{0, 104, 255}));
}

TEST(token_files_test, reads_npy_versions_2_and_3_with_their_4_byte_header_length) {
  const fs::path v2 = scratch() / "v2.npy", v3 = scratch() / "v3.npy";
  write_bytes(v2, make_npy(2, "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", le_values({5, 6, 7}, 2)));
  write_bytes(v3, make_npy(3, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", le_values({9, 8}, 8)));
  EXPECT_EQ(load_tokens(v2), (Ids{5, 6, 7}));
  EXPECT_EQ(load_tokens(v3), (Ids{9, 8}));
}

TEST(token_files_test, reads_any_shape_flattened_in_c_order) {
  const fs::path p = scratch() / "2x3.npy";
  // [[10, 11, 12], [20, 21, 22]] in C order: rows one after the other.
  write_bytes(p, make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
                          le_values({10, 11, 12, 20, 21, 22}, 4)));
  EXPECT_EQ(load_tokens(p), (Ids{10, 11, 12, 20, 21, 22}));
}

TEST(token_files_test, reads_headers_in_other_spellings_numpy_also_accepts) {
  // Double quotes, keys in another order, no trailing comma, no padding or newline, Python 2's 3L, and a
  // header padded to 16 bytes as numpy before 1.24 wrote it.
  const fs::path a = scratch() / "a.npy", b = scratch() / "b.npy", c = scratch() / "c.npy";
  write_bytes(a, make_npy(1, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<i4\"}", le_values({1, 2, 3}, 4),
                          /*pad=*/false));
  write_bytes(b, make_npy(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3L,), }\n", le_values({4, 5, 6}, 2),
                          /*pad=*/false));
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }";
  header += std::string((16 - (10 + header.size() + 1) % 16) % 16, ' ') + "\n";
  write_bytes(c, make_npy(1, header, le_values({42}, 4), /*pad=*/false));
  EXPECT_EQ(load_tokens(a), (Ids{1, 2, 3}));
  EXPECT_EQ(load_tokens(b), (Ids{4, 5, 6}));
  EXPECT_EQ(load_tokens(c), (Ids{42}));
}

TEST(token_files_test, reads_a_nanogpt_bin_of_little_endian_uint16) {
  const fs::path p = scratch() / "train.bin";
  // 50256 = 0xc450 -> bytes 50 c4; 65535 -> ff ff; 258 = 0x0102 -> 02 01.
  write_bytes(p, Bytes{0x00, 0x00, 0x50, 0xc4, 0xff, 0xff, 0x02, 0x01});
  EXPECT_EQ(load_tokens(p), (Ids{0, 50256, 65535, 258}));
}

TEST(token_files_test, reads_txt_with_tabs_newlines_and_runs_of_spaces) {
  const fs::path p = scratch() / "ids.txt";
  write_text(p, "  15496 11\t\t995\n\n0   50256\r\n007\v1\f2147483647\n");
  EXPECT_EQ(load_tokens(p), (Ids{15496, 11, 995, 0, 50256, 7, 1, 2147483647}));
  const fs::path q = scratch() / "one.txt";
  write_text(q, "3");  // no final newline
  EXPECT_EQ(load_tokens(q), (Ids{3}));
}

TEST(token_files_test, chooses_the_format_by_extension_whatever_its_case) {
  const fs::path p = scratch() / "IDS.TXT", b = scratch() / "X.Bin";
  write_text(p, "1 2");
  write_bytes(b, Bytes{1, 0, 2, 0});
  EXPECT_EQ(load_tokens(p), (Ids{1, 2}));
  EXPECT_EQ(load_tokens(b), (Ids{1, 2}));
  // The same bytes as text under .bin are uint16 ids: "1 2" is 3 bytes, odd, and refused.
  const fs::path t = scratch() / "text.bin";
  write_text(t, "1 2");
  EXPECT_THROW_MSG(load_tokens(t), TokenFileError, "3 bytes, an odd number");
}

}  // namespace
}  // namespace ampscope::samples
