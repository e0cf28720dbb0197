// Bad token files, each refused with a TokenFileError whose message names the file, says where and what
// is wrong, and gives a hint.
#include <gtest/gtest.h>

#include "models/token_data.h"
#include "tests/test_support.h"
#include "tests/tokens/token_test_util.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using testing::append_le;
using testing::Bytes;
using testing::le_values;
using testing::make_npy;
using testing::write_bytes;
using testing::write_text;

fs::path scratch() { return testing::process_scratch_dir("ampscope_bad_token_files"); }

fs::path npy(const std::string& name, const Bytes& b) {
  const fs::path p = scratch() / name;
  write_bytes(p, b);
  return p;
}

fs::path txt(const std::string& name, const std::string& s) {
  const fs::path p = scratch() / name;
  write_text(p, s);
  return p;
}

const std::string kI4x3 = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";

TEST(bad_token_files_test, every_message_names_the_file_and_gives_a_hint) {
  const fs::path p = npy("magic.npy", Bytes{'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0});
  EXPECT_THROW_MSG(load_tokens(p), TokenFileError, "token file '" + p.string() + "'", "\nhint: ");
}

TEST(bad_token_files_test, refuses_unknown_extensions_listing_the_three_formats) {
  const fs::path p = txt("tokens.npz", "1 2 3");
  EXPECT_THROW_MSG(load_tokens(p), TokenFileError, "extension '.npz'", ".npy", ".bin", ".txt");
  EXPECT_THROW_MSG(load_tokens(txt("tokens", "1 2 3")), TokenFileError, "extension ''", ".npy", ".bin", ".txt");
}

TEST(bad_token_files_test, refuses_missing_files_folders_and_empty_files) {
  EXPECT_THROW_MSG(load_tokens(scratch() / "absent.txt"), TokenFileError, "absent.txt", "cannot open",
                   "No such file");
  fs::create_directories(scratch() / "folder.npy");
  EXPECT_THROW_MSG(load_tokens(scratch() / "folder.npy"), TokenFileError, "not a regular file");
  for (const char* name : {"empty.npy", "empty.bin", "empty.txt"}) {
    EXPECT_THROW_MSG(load_tokens(txt(name, "")), TokenFileError, name, "empty (0 bytes)");
  }
  EXPECT_THROW_MSG(load_tokens(txt("blank.txt", " \n\t\n")), TokenFileError, "4 bytes are all whitespace",
                   "no tokens");
  EXPECT_THROW_MSG(load_tokens(npy("zero.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (0,), }",
                                                        {}))),
                   TokenFileError, "shape (0,) holds no tokens");
  EXPECT_THROW_MSG(load_tokens(npy("zero2.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 0), }",
                                                         {}))),
                   TokenFileError, "shape (3, 0) holds no tokens");
}

TEST(bad_token_files_test, refuses_a_wrong_magic_and_a_truncated_npy_prefix) {
  EXPECT_THROW_MSG(load_tokens(txt("text.npy", "1 2 3 4 5 6 7 8")), TokenFileError, "not a .npy file",
                   "\\x93NUMPY", "31 20 32 20", ".txt");
  EXPECT_THROW_MSG(load_tokens(npy("short_magic.npy", Bytes{0x93, 'N', 'U', 'M'})), TokenFileError,
                   "truncated", "4 bytes end inside the 6-byte magic");
  EXPECT_THROW_MSG(load_tokens(npy("short_version.npy", Bytes{0x93, 'N', 'U', 'M', 'P', 'Y', 1})), TokenFileError,
                   "truncated", "inside the format version");
  EXPECT_THROW_MSG(load_tokens(npy("short_len.npy", Bytes{0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0x40, 0})),
                   TokenFileError, "truncated", "inside the 4-byte header length of version 2.0");
  Bytes v4 = make_npy(1, kI4x3, le_values({1, 2, 3}, 4));
  v4[6] = 4;
  EXPECT_THROW_MSG(load_tokens(npy("v4.npy", v4)), TokenFileError, "format version 4.0", "1.0, 2.0, 3.0");
}

TEST(bad_token_files_test, refuses_a_truncated_header_and_a_lying_header_length) {
  // kI4x3 is 57 characters; with its '\n', 10 + 58 = 68 bytes, padded to 128: the header length is 118 and
  // the data starts at byte 128.
  const Bytes good = make_npy(1, kI4x3, le_values({1, 2, 3}, 4));
  // Cut inside the header: 30 bytes leave 20 after the length field, not 118.
  const Bytes cut(good.begin(), good.begin() + 30);
  EXPECT_THROW_MSG(load_tokens(npy("cut.npy", cut)), TokenFileError, "header length 118 (at byte offset 8) runs past "
                                                                     "the end of the file: only 20 bytes follow");
  // A length larger than the file.
  Bytes big = good;
  big[8] = 0xff;
  big[9] = 0x7f;
  EXPECT_THROW_MSG(load_tokens(npy("big.npy", big)), TokenFileError, "header length 32767", "runs past the end");
  // A length too small: the header text stops inside the dict.
  Bytes small = good;
  small[8] = 20;
  EXPECT_THROW_MSG(load_tokens(npy("small.npy", small)), TokenFileError, ".npy header at byte offset",
                   "the header is bytes 10 to 30");
  // A header that is not numpy's dict at all, or lacks a key, or repeats one, or has another.
  EXPECT_THROW_MSG(load_tokens(npy("list.npy", make_npy(1, "['<i4', False, (3,)]", le_values({1, 2, 3}, 4)))),
                   TokenFileError, "at byte offset 10", "does not start with '{'");
  EXPECT_THROW_MSG(load_tokens(npy("noshape.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False}",
                                                           le_values({1, 2, 3}, 4)))),
                   TokenFileError, "lacks the key 'shape'");
  EXPECT_THROW_MSG(load_tokens(npy("twice.npy", make_npy(1, "{'descr': '<i4', 'descr': '<i8', 'fortran_order': False, "
                                                            "'shape': (3,)}",
                                                         le_values({1, 2, 3}, 4)))),
                   TokenFileError, "the key 'descr' appears twice", "byte offset 27");
  EXPECT_THROW_MSG(load_tokens(npy("extra.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), "
                                                            "'strides': (4,)}",
                                                         le_values({1, 2, 3}, 4)))),
                   TokenFileError, "unknown key 'strides'");
  EXPECT_THROW_MSG(load_tokens(npy("open.npy", make_npy(1, "{'descr': '<i4", le_values({1, 2, 3}, 4), false))),
                   TokenFileError, "a string that is never closed");
  EXPECT_THROW_MSG(load_tokens(npy("struct.npy", make_npy(1, "{'descr': [('a', '<i4')], 'fortran_order': False, "
                                                             "'shape': (3,)}",
                                                          le_values({1, 2, 3}, 4)))),
                   TokenFileError, "structured dtype");
  EXPECT_THROW_MSG(load_tokens(npy("huge.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': "
                                                           "(99999999999999999999,)}",
                                                        le_values({1, 2, 3}, 4)))),
                   TokenFileError, "past 64 bits");
  EXPECT_THROW_MSG(load_tokens(npy("manyd.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': "
                                                            "(4294967296, 4294967296, 16)}",
                                                         le_values({1, 2, 3}, 4)))),
                   TokenFileError, "more elements than 64 bits can count");
}

TEST(bad_token_files_test, refuses_unsupported_dtypes_naming_the_supported_ones) {
  for (const char* d : {"<f4", ">i4", "<u4", "|i1", "<i2", "|b1", "<U3", "O"}) {
    const fs::path p = npy("dtype.npy", make_npy(1, std::string("{'descr': '") + d + "', 'fortran_order': False, "
                                                    "'shape': (3,), }",
                                                 le_values({1, 2, 3}, 4)));
    EXPECT_THROW_MSG(load_tokens(p), TokenFileError, std::string("dtype '") + d + "'", "is not supported",
                     "'<i4' (int32), '<i8' (int64), '<u2' (uint16), '|u1' (uint8)", "astype('<i4')");
  }
  const fs::path f = npy("f8.npy", make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", Bytes(8)));
  EXPECT_THROW_MSG(load_tokens(f), TokenFileError, "floating point and token ids are integers");
  const fs::path b = npy("be.npy", make_npy(1, "{'descr': '>i8', 'fortran_order': False, 'shape': (1,), }", Bytes(8)));
  EXPECT_THROW_MSG(load_tokens(b), TokenFileError, "big-endian and token files are little-endian");
}

TEST(bad_token_files_test, refuses_fortran_order_and_0_d_arrays) {
  EXPECT_THROW_MSG(load_tokens(npy("f.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': True, 'shape': (3,), }",
                                                     le_values({1, 2, 3}, 4)))),
                   TokenFileError, "Fortran (column-major) order", "hint: save it in C order",
                   "np.ascontiguousarray");
  EXPECT_THROW_MSG(load_tokens(npy("scalar.npy", make_npy(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (), }",
                                                          le_values({7}, 4)))),
                   TokenFileError, "0-d array", "np.atleast_1d");
}

TEST(bad_token_files_test, refuses_data_shorter_or_longer_than_the_shape) {
  // The header makes the data start at byte 128 (see above); shape (3,) of '<i4' needs 12 bytes.
  EXPECT_THROW_MSG(load_tokens(npy("short.npy", make_npy(1, kI4x3, le_values({1, 2}, 4)))), TokenFileError,
                   "the data is shorter than its shape", "shape (3,) of '<i4' needs 12 bytes, the file holds 8 after "
                   "its 128-byte header", "truncated");
  Bytes longer = make_npy(1, kI4x3, le_values({1, 2, 3}, 4));
  longer.push_back(0);
  EXPECT_THROW_MSG(load_tokens(npy("long.npy", longer)), TokenFileError, "the data is longer than its shape",
                   "the file holds 13");
}

TEST(bad_token_files_test, refuses_negative_ids_and_ids_past_int32_with_their_element_and_offset) {
  // Element 1 of '<i4' data starting at 128 (a 57-character header, as above): byte offset 132.
  EXPECT_THROW_MSG(load_tokens(npy("neg.npy", make_npy(1, kI4x3, le_values({5, -100, 3}, 4)))), TokenFileError,
                   "element 1 (byte offset 132, dtype '<i4') holds -100: token ids are never negative");
  // 2^31 in '<i8': element 2 at byte 128 + 16 = 144.
  EXPECT_THROW_MSG(load_tokens(npy("big.npy", make_npy(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                                                       le_values({0, 2147483647, 2147483648}, 8)))),
                   TokenFileError, "element 2 (byte offset 144, dtype '<i8') holds 2147483648, above 2^31 - 1");
}

TEST(bad_token_files_test, refuses_an_odd_bin_an_llmc_bin_and_a_npy_named_bin) {
  EXPECT_THROW_MSG(load_tokens(npy("odd.bin", Bytes{1, 0, 2, 0, 3})), TokenFileError, "5 bytes, an odd number",
                   "uint16", "tofile");
  // llm.c's header: int32 magic 20240520, version 1, token count 3, up to 256 int32s; then 3 uint16 ids.
  Bytes llmc;
  append_le(llmc, 20240520, 4);
  append_le(llmc, 1, 4);
  append_le(llmc, 3, 4);
  llmc.resize(1024, 0);
  append_le(llmc, 50256, 2);
  append_le(llmc, 11, 2);
  append_le(llmc, 0, 2);
  EXPECT_THROW_MSG(load_tokens(npy("llmc.bin", llmc)), TokenFileError, "llm.c token file", "version 1",
                   "offset=1024");
  // The same bytes with a token count that does not match the file are plain uint16 ids: 515 of them.
  llmc[8] = 4;
  EXPECT_EQ(load_tokens(npy("not_llmc.bin", llmc)).size(), 515u);
  EXPECT_THROW_MSG(load_tokens(npy("saved.bin", make_npy(1, kI4x3, le_values({1, 2, 3}, 4)))), TokenFileError,
                   "a .npy file", "named .bin", "rename it to end in .npy");
}

TEST(bad_token_files_test, refuses_txt_letters_signs_and_overflow_with_line_and_column) {
  EXPECT_THROW_MSG(load_tokens(txt("letter.txt", "1 2\n3 x4\n")), TokenFileError, "line 2, column 3: 'x' where an id",
                   "non-negative decimal integers");
  EXPECT_THROW_MSG(load_tokens(txt("suffix.txt", "1 2\n\n  34b\n")), TokenFileError,
                   "line 3, column 5: 'b' right after the digits 34");
  EXPECT_THROW_MSG(load_tokens(txt("neg.txt", "7 8\t-5 9")), TokenFileError,
                   "line 1, column 5: the negative id -5; token ids are never negative");
  EXPECT_THROW_MSG(load_tokens(txt("over.txt", "1\n2147483647 2147483648\n")), TokenFileError,
                   "line 2, column 12: the id 2147483648 is above 2^31 - 1 = 2147483647");
  EXPECT_THROW_MSG(load_tokens(txt("long.txt", "1 " + std::string(40, '9'))), TokenFileError,
                   "line 1, column 3: the id 999999999999999999999999... is above");
  EXPECT_THROW_MSG(load_tokens(txt("list.txt", "[1, 2, 3]")), TokenFileError, "line 1, column 1: '['",
                   "brackets and commas removed");
  EXPECT_THROW_MSG(load_tokens(txt("comma.txt", "1,2")), TokenFileError, "line 1, column 2: ','",
                   "brackets and commas removed");
  EXPECT_THROW_MSG(load_tokens(txt("float.txt", "1 2.5")), TokenFileError, "line 1, column 4: '.'");
  EXPECT_THROW_MSG(load_tokens(txt("plus.txt", "+1")), TokenFileError, "line 1, column 1: '+'");
  EXPECT_THROW_MSG(load_tokens(txt("nul.txt", std::string("1 \0 2", 5))), TokenFileError,
                   "line 1, column 3: byte \\x00");
  EXPECT_THROW_MSG(load_tokens(npy("npy.txt", make_npy(1, kI4x3, le_values({1, 2, 3}, 4)))), TokenFileError,
                   "byte \\x93", "rename it to end in .npy");
}

TEST(bad_token_files_test, check_vocabulary_names_the_first_id_outside_it) {
  const std::vector<std::int32_t> ids = {3, 9, 10, 2, 12, 11};
  check_vocabulary(ids, 13, "ids.txt");  // all below 13
  EXPECT_THROW_MSG(check_vocabulary(ids, 10, "ids.txt"), TokenFileError, "token file 'ids.txt'",
                   "element 2 holds id 10, outside the model's vocabulary of 10 ids (0 to 9)",
                   "3 of the 6 ids are outside it, the largest is 12", "another tokenizer");
  EXPECT_THROW_MSG(check_vocabulary(ids, 0, "ids.txt"), Error, "vocabulary size 0 is below 1");
}

}  // namespace
}  // namespace ampscope::samples
