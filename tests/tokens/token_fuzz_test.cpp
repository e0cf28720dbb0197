// Fuzzing the token-file readers with seeded mutants of valid .npy, .bin and .txt files: byte flips,
// truncations, inserted and deleted bytes, edits of the .npy header's digits and letters and of its length
// field, digits and whitespace of the text. Every mutant either throws TokenFileError or loads, never
// anything else and never a crash; one that loads must hold exactly what the mutant's bytes say, read by a
// reference written separately here (so no silent partial answer). AMPSCOPE_FUZZ_CASES sets the number of
// mutants per format (default 400, well under a second); AMPSCOPE_FUZZ_SEED the first seed.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <regex>
#include <sstream>

#include "models/token_data.h"
#include "tests/support/fuzz.h"
#include "tests/test_support.h"
#include "tests/tokens/token_test_util.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using testing::Bytes;
using Ids = std::vector<std::int32_t>;

Bytes mutate(const Bytes& original, std::size_t header_end, std::mt19937_64& rng, std::string& how) {
  Bytes b = original;
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return testing::pick(rng, lo, hi); };
  switch (pick(0, 5)) {
    case 0: testing::flip_byte(b, rng, how); break;              // flip bits anywhere
    case 1: testing::truncate(b, rng, how); break;               // truncate
    case 2: testing::insert_or_delete_byte(b, rng, how); break;  // insert or delete a byte
    case 3: {  // change a digit (the .npy header's shape, the text's ids)
      std::vector<std::size_t> digits;
      for (std::size_t i = 0; i < (header_end ? header_end : b.size()); ++i)
        if (std::isdigit(b[i])) digits.push_back(i);
      if (digits.empty()) break;
      const std::size_t at = digits[pick(0, digits.size() - 1)];
      const char* alphabet = "0123456789-+ \n,.xL";
      b[at] = static_cast<unsigned char>(alphabet[pick(0, std::strlen(alphabet) - 1)]);
      how = "digit at " + std::to_string(at);
      break;
    }
    case 4: {  // change a letter or punctuation of the .npy header (dtype, keys, True/False, quotes, brackets)
      if (header_end == 0) {  // text: whitespace into digits, digits into whitespace
        const std::size_t at = pick(0, b.size() - 1);
        b[at] = static_cast<unsigned char>(" \t\r\n7"[pick(0, 4)]);
        how = "text byte at " + std::to_string(at);
        break;
      }
      std::vector<std::size_t> marks;
      for (std::size_t i = 10; i < header_end; ++i)
        if (b[i] != ' ') marks.push_back(i);
      const std::size_t at = marks[pick(0, marks.size() - 1)];
      const char* alphabet = "<>|iuf12348'\"{}(),: TF\n";
      b[at] = static_cast<unsigned char>(alphabet[pick(0, std::strlen(alphabet) - 1)]);
      how = "header byte at " + std::to_string(at);
      break;
    }
    default: {  // a different .npy header length (or for the others, bytes appended)
      if (header_end == 0) {
        for (std::uint64_t k = pick(1, 3); k > 0; --k) b.push_back(static_cast<unsigned char>(pick(0, 255)));
        how = "append";
        break;
      }
      const std::uint64_t n = header_end - 10;
      const std::uint64_t choices[] = {n + 1, n - 1, n + 2, n - 2, 0, 1, 0xffff, pick(0, 0xffff)};
      const std::uint64_t m = choices[pick(0, 7)];
      b[8] = static_cast<unsigned char>(m);
      b[9] = static_cast<unsigned char>(m >> 8);
      how = "header length " + std::to_string(m);
      break;
    }
  }
  return b;
}

// The reference readers: what a mutant that loads must have given.
Ids reference_bin(const Bytes& b) {
  Ids out;
  for (std::size_t i = 0; i + 1 < b.size(); i += 2) out.push_back(b[i] | (b[i + 1] << 8));
  return out;
}

Ids reference_txt(const Bytes& b) {
  std::istringstream in(std::string(b.begin(), b.end()));
  Ids out;
  std::string word;
  while (in >> word) out.push_back(static_cast<std::int32_t>(std::stoll(word)));
  return out;
}

// For a .npy mutant that loaded: the ids its data holds by the dtype and the 1-d shape its header states
// (nullopt when the header is in a spelling this small reference does not follow).
std::optional<Ids> reference_npy(const Bytes& b) {
  const std::size_t n = b[8] | (b[9] << 8);
  const std::string header(b.begin() + 10, b.begin() + 10 + static_cast<std::ptrdiff_t>(n));
  std::smatch descr, shape;
  if (!std::regex_search(header, descr, std::regex("'descr': '([<|])([iu])([1248])'")) ||
      !std::regex_search(header, shape, std::regex("'shape': \\((\\d+),\\)"))) {
    return std::nullopt;
  }
  const int size = descr[3].str()[0] - '0';
  const bool is_signed = descr[2] == "i";
  const std::size_t count = std::stoull(shape[1]);
  Ids out;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t v = 0;
    for (int k = size - 1; k >= 0; --k) v = (v << 8) | b[10 + n + i * size + static_cast<std::size_t>(k)];
    std::int64_t s = static_cast<std::int64_t>(v);
    if (is_signed && size == 4) s = static_cast<std::int32_t>(v);
    out.push_back(static_cast<std::int32_t>(s));
  }
  return out;
}

struct Counts {
  std::uint64_t loaded = 0, refused = 0;
};

// Fatal assertions return from here; the caller's counts then show the shortfall.
void fuzz(const std::string& name, const Bytes& original, std::size_t header_end, Counts& counts) {
  const fs::path p = testing::process_scratch_dir("ampscope_token_fuzz") / name;
  const std::string ext = p.extension().string();
  const testing::FuzzTally tally = testing::run_mutants<TokenFileError>(
      "TokenFileError", 400, [&](std::mt19937_64& rng, std::uint64_t seed, std::string& what) {
        std::string how;
        const Bytes b = mutate(original, header_end, rng, how);
        testing::write_bytes(p, b);
        what = name + " seed " + std::to_string(seed) + " (" + how + ")";
        const Ids ids = load_tokens(p);
        ASSERT_FALSE(ids.empty()) << what;
        for (std::int32_t id : ids) ASSERT_GE(id, 0) << what;
        if (ext == ".bin") {
          ASSERT_EQ(ids, reference_bin(b)) << what;
        } else if (ext == ".txt") {
          ASSERT_EQ(ids, reference_txt(b)) << what;
        } else if (const auto expected = reference_npy(b)) {
          ASSERT_EQ(ids, *expected) << what;
        }
      });
  if (::testing::Test::HasFatalFailure()) return;
  counts.loaded += tally.loaded;
  counts.refused += tally.refused;
  const std::uint64_t cases = tally.cases;
  EXPECT_EQ(counts.loaded + counts.refused, cases);
  std::printf("token fuzz %s: %llu mutants, %llu loaded, %llu refused\n", name.c_str(),
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(counts.loaded),
              static_cast<unsigned long long>(counts.refused));
}

TEST(token_fuzz_test, npy_mutants_load_what_their_bytes_say_or_throw_a_token_file_error) {
  for (const char* descr : {"<i4", "<i8", "<u2", "|u1"}) {
    const int size = descr[2] - '0';
    const std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (12,), }";
    const Bytes b = testing::make_npy(1, header,
                                      testing::le_values({50256, 0, 1, 198, 13, 255, 11, 7, 30, 99, 2, 5}, size));
    const std::size_t header_end = 10 + (b[8] | (b[9] << 8));
    Counts c;
    fuzz(std::string("mutant_") + (descr + 1) + ".npy", b, header_end, c);
    EXPECT_GT(c.refused, 0u);  // the mutations reach the checks
    EXPECT_GT(c.loaded, 0u);   // and data flips stay valid
  }
}

TEST(token_fuzz_test, bin_mutants_load_what_their_bytes_say_or_throw_a_token_file_error) {
  Counts c;
  fuzz("mutant.bin", testing::le_values({50256, 0, 1, 198, 13, 65535, 11, 7, 30, 99, 2, 5}, 2), 0, c);
  EXPECT_GT(c.refused, 0u);
  EXPECT_GT(c.loaded, 0u);
}

TEST(token_fuzz_test, txt_mutants_load_what_their_text_says_or_throw_a_token_file_error) {
  const std::string text = "50256 0 1\t198\n13  255\r\n11 7 30\n\n99 2 2147483647\n";
  Counts c;
  fuzz("mutant.txt", Bytes(text.begin(), text.end()), 0, c);
  EXPECT_GT(c.refused, 0u);
  EXPECT_GT(c.loaded, 0u);
}

}  // namespace
}  // namespace ampscope::samples
