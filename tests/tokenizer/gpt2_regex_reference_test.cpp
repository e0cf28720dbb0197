// The tokenizer against GPT-2's own machinery: gpt2_reference.py splits random texts with the `regex` module
// openai/gpt-2 uses (Debian's python3-regex, Unicode 15.0 like the ICU 72 ampscope links) and GPT-2's
// pattern, reads bytes that are not UTF-8 with Python's surrogateescape, and merges with GPT-2's rounds. The
// pre-tokens and the ids must agree exactly, for text drawn from all of Unicode (letters, marks, numbers of
// every script, every kind of space, emoji, unassigned code points) with bytes that are not UTF-8 mixed in.
// Skipped, with the reason, where /usr/bin/python3 lacks the regex module (scripts/setup.sh installs it).
//
// Hugging Face's tokenizers and transformers are not packaged by Debian (apt-cache policy python3-tokenizers
// python3-transformers: none), so they are not used here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include <sys/wait.h>

#include "tests/tokenizer/tokenizer_files.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
using samples::BpeTokenizer;

std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

void append_utf8(std::string& s, char32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string random_text(std::mt19937_64& rng) {
  auto pick = [&](std::uint32_t lo, std::uint32_t hi) { return std::uniform_int_distribution<std::uint32_t>(lo, hi)(rng); };
  // Every character White_Space or str.isspace() holds, and the ones either might be thought to.
  static const char32_t spaces[] = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x20, 0x20,
                                    0x85, 0xA0, 0x1680, 0x180E, 0x2000, 0x2007, 0x200A, 0x200B, 0x2028, 0x2029,
                                    0x202F, 0x205F, 0x3000, 0xFEFF};
  static const char* ascii_bits[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "''", "hello", " the",
                                     "123", "!!", "?", "\"", "-", "_"};
  std::string s;
  const std::uint32_t n = pick(0, 40);
  for (std::uint32_t k = 0; k < n; ++k) {
    switch (pick(0, 9)) {
      case 0: s += ascii_bits[pick(0, 17)]; break;
      case 1: append_utf8(s, spaces[pick(0, 25)]); break;
      case 2: s += static_cast<char>(pick(0x20, 0x7E)); break;
      case 3: append_utf8(s, pick(0x80, 0x7FF)); break;  // Latin, Greek, Cyrillic, Hebrew, Arabic, marks
      case 4: {  // anywhere in the BMP but the surrogates
        std::uint32_t cp = pick(0x800, 0xFFFD);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp -= 0x800;
        append_utf8(s, cp);
        break;
      }
      case 5: append_utf8(s, pick(0x10000, 0x10FFFF)); break;  // astral: emoji, CJK extensions, unassigned
      case 6: append_utf8(s, pick(0x1F300, 0x1FAFF)); break;   // emoji
      case 7: {  // bytes that are not UTF-8
        static const char* bad[] = {"\x80", "\xbf", "\xc0\xaf", "\xc1", "\xe6\x97", "\xed\xa0\x80", "\xf0\x9f",
                                    "\xf4\x90\x80\x80", "\xf5", "\xfe", "\xff", "\xc3"};
        s += bad[pick(0, 11)];
        break;
      }
      case 8: append_utf8(s, pick(0x300, 0x36F)); break;  // combining marks
      default: {  // digits and other numbers of many scripts
        static const char32_t numbers[] = {0x0660, 0x06F5, 0x0967, 0x0E51, 0xFF13, 0x00B2, 0x00BD, 0x2155, 0x2460,
                                           0x216B, 0x3007, 0x1D7D8, 0x10107};
        append_utf8(s, numbers[pick(0, 12)]);
        break;
      }
    }
  }
  return s;
}

std::vector<std::string> hex_fields(const std::string& line) {
  std::istringstream in(line.substr(1));
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

TEST(gpt2_regex_reference_test, pre_tokens_and_ids_match_gpt2s_regex_and_merges_on_random_unicode) {
  const fs::path script = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "tokenizer" / "gpt2_reference.py";
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const auto v = testing::full_byte_vocab();
  const fs::path dir = testing::write_gpt2_files(v, "regex_reference");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  std::mt19937_64 rng(2019);
  std::vector<std::string> texts;
  for (int k = 0; k < 2000; ++k) texts.push_back(random_text(rng));
  {
    std::ofstream out(dir / "texts.hex");
    for (const auto& x : texts) out << hex(x) << "\n";
  }
  const std::string cmd = "/usr/bin/python3 '" + script.string() + "' '" + (dir / "vocab.json").string() + "' '" +
                          (dir / "merges.txt").string() + "' '" + (dir / "texts.hex").string() + "' '" +
                          (dir / "reference.txt").string() + "'";
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3)
    GTEST_SKIP() << "/usr/bin/python3 has no regex module (Debian's python3-regex; scripts/setup.sh installs it)";
  ASSERT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "reference.txt");
  std::string pieces_line, ids_line;
  int mismatches = 0;
  for (std::size_t k = 0; k < texts.size(); ++k) {
    ASSERT_TRUE(std::getline(in, pieces_line) && std::getline(in, ids_line)) << "reference ends at text " << k;
    std::vector<std::string> got;
    for (const auto& p : BpeTokenizer::pre_tokenize(texts[k])) got.push_back(hex(p));
    std::vector<std::string> ids;
    for (std::int32_t id : t.encode(texts[k])) ids.push_back(std::to_string(id));
    const bool same = got == hex_fields(pieces_line) && ids == hex_fields(ids_line);
    if (!same && ++mismatches <= 5) {
      std::string ours, our_ids;
      for (const auto& p : got) ours += " " + p;
      for (const auto& i : ids) our_ids += " " + i;
      ADD_FAILURE() << "text " << k << " (hex " << hex(texts[k]) << ")\n  regex: " << pieces_line << "\n  ours:  P"
                    << ours << "\n  regex ids: " << ids_line << "\n  our ids:   I" << our_ids;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace ampscope
