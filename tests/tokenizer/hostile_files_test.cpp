// The tokenizer on files made to hurt it and on texts too large to hold (issue 36): encode_file reads --text
// a chunk at a time and must give exactly encode()'s ids whatever the chunk size (pieces, special tokens and
// UTF-8 sequences cut by a chunk's end included) in memory that does not grow with the text; FIFOs,
// devices and folders in every file slot (vocab.json, merges.txt, tokenizer.json, the text) are refused by
// name without blocking; JSON nested 10^6 levels deep in vocab.json and tokenizer.json is a clean error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/bpe_tokenizer.h"
#include "tests/support/hostile_files.h"
#include "tests/test_support.h"
#include "tests/tokenizer/tokenizer_files.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

Ids encode_file(const BpeTokenizer& t, const fs::path& path, std::size_t chunk) {
  Ids ids;
  t.encode_file(path, [&](const std::int32_t* p, std::size_t n) { ids.insert(ids.end(), p, p + n); }, chunk);
  return ids;
}

// Texts made of what moves the pre-tokenizer's boundaries: words, runs of spaces and newlines (the pattern's
// \s+(?!\S) looks past them), contractions ('s 're), digits, the special token (also cut short), UTF-8 of 2,
// 3 and 4 bytes, and bytes that are no UTF-8.
std::string random_text(std::mt19937_64& rng, std::size_t length) {
  static const std::vector<std::string> parts = {
      "hello", "world", " the", "the", " ", "  ", "   ", "\n", "\n\n", " \n ", "\t", "'s", "'re", "'", "12", "345",
      "<|endoftext|>", "<|endof", "<|", "caf\xc3\xa9", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\xff", "\xc3",
      "!!", "?", "S", "a", " w", " wor", "ld", "\xe2\x80\x83"};  // the last: U+2003, a space that is not ASCII
  std::string s;
  while (s.size() < length) s += parts[std::uniform_int_distribution<std::size_t>(0, parts.size() - 1)(rng)];
  return s;
}

TEST(tokenizer_hostile_test, encode_file_gives_encodes_ids_for_every_chunk_size) {
  const auto dir = testing::write_gpt2_files(testing::full_byte_vocab(), "stream");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  const fs::path text = dir / "text.txt";
  std::mt19937_64 rng(36);
  int texts = 0;
  for (int k = 0; k < 200; ++k) {
    const std::string s = random_text(rng, std::uniform_int_distribution<std::size_t>(0, 3000)(rng));
    testing::write_text(text, s);
    const Ids whole = t.encode(s);
    for (std::size_t chunk : {1, 2, 3, 5, 8, 13, 44, 45, 46, 64, 100, 1000, 1 << 20}) {
      ASSERT_EQ(encode_file(t, text, chunk), whole) << "text " << k << ", chunk " << chunk;
    }
    ++texts;
  }
  EXPECT_EQ(texts, 200);
}

// The process's peak resident memory (VmHWM) after resetting it to the current size, in bytes, around `f`;
// nullopt where the kernel does not let a process reset it.
std::optional<long> peak_growth(const std::function<void()>& f) {
  const auto read_kb = [](const char* key) -> long {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
    return -1;
  };
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // "reset the peak resident set size" (Documentation/filesystems/proc.rst)
    if (!reset) return std::nullopt;
  }
  const long before = read_kb("VmRSS:");
  if (read_kb("VmHWM:") > before + 1024) return std::nullopt;  // the reset did not take
  f();
  return (read_kb("VmHWM:") - before) * 1024;
}

TEST(tokenizer_hostile_test, encode_file_memory_does_not_grow_with_the_text) {
  const auto dir = testing::write_gpt2_files(testing::full_byte_vocab(), "memory");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  // 48 MiB of text; reading it whole cost 25-50 bytes a byte (1.2-2.4 GB), a chunk at a time it is the chunk,
  // the pre-tokenizer's 16 bytes per character of it, and the cache.
  const fs::path text = dir / "big.txt";
  {
    std::mt19937_64 rng(5);
    const std::string block = random_text(rng, 1 << 20);
    std::ofstream out(text, std::ios::binary);
    for (int k = 0; k < 48; ++k) out << block;
  }
  std::size_t count = 0;
  const auto growth = peak_growth([&] { t.encode_file(text, [&](const std::int32_t*, std::size_t n) { count += n; }); });
  if (!growth) GTEST_SKIP() << "this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)";
  std::printf("encoded 48 MiB of text into %zu ids; peak RSS grew by %.1f MiB\n", count, *growth / 1048576.0);
  EXPECT_GT(count, 10'000'000u);
  EXPECT_LT(*growth, 40L << 20) << "memory grew with the text";
}

TEST(tokenizer_hostile_test, a_fifo_a_device_or_a_folder_as_the_text_is_refused_by_name_without_blocking) {
  const auto dir = testing::write_gpt2_files(testing::full_byte_vocab(), "text_slots");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  const auto noop = [](const std::int32_t*, std::size_t) {};
  const fs::path fifo = testing::make_fifo(dir / "fifo.txt");
  std::string m = testing::refusal_within<TokenizerError>([&] { t.encode_file(fifo, noop); }, {fifo});
  EXPECT_EQ(m, fmt::format("text file '{}': not a regular file: it is a FIFO (named pipe)\nhint: --text takes a "
                           "regular file of text (UTF-8 or any bytes)",
                           fifo.string()));
  const fs::path zero = testing::make_link(dir / "zero.txt", "/dev/zero");
  m = testing::refusal_within<TokenizerError>([&] { t.encode_file(zero, noop); });
  EXPECT_NE(m.find("zero.txt': not a regular file: it is a character device"), std::string::npos) << m;
  m = testing::refusal_within<TokenizerError>([&] { t.encode_file(dir, noop); });
  EXPECT_NE(m.find("not a regular file: it is a directory"), std::string::npos) << m;
  m = testing::refusal_within<TokenizerError>([&] { t.encode_file(dir / "absent.txt", noop); });
  EXPECT_NE(m.find("absent.txt': cannot open it: No such file or directory"), std::string::npos) << m;
}

TEST(tokenizer_hostile_test, a_fifo_or_a_device_as_a_tokenizer_file_is_refused_by_name_without_blocking) {
  const auto v = testing::full_byte_vocab();
  for (const char* slot : {"vocab.json", "merges.txt"}) {
    const auto dir = testing::write_gpt2_files(v, std::string("slot_") + slot);
    const fs::path fifo = testing::make_fifo(dir / slot);
    std::string m = testing::refusal_within<TokenizerError>([&] { (void)BpeTokenizer::from_folder(dir); }, {fifo});
    EXPECT_NE(m.find(fmt::format("tokenizer file '{}': not a regular file: it is a FIFO (named pipe)", fifo.string())),
              std::string::npos)
        << m;
    testing::make_link(dir / slot, "/dev/zero");
    m = testing::refusal_within<TokenizerError>([&] { (void)BpeTokenizer::from_folder(dir); });
    EXPECT_NE(m.find("not a regular file: it is a character device"), std::string::npos) << m;
  }
  const auto dir = testing::write_tokenizer_json(v, "slot_tokenizer_json", true);
  const fs::path fifo = testing::make_fifo(dir / "tokenizer.json");
  std::string m = testing::refusal_within<TokenizerError>([&] { (void)BpeTokenizer::from_folder(dir); }, {fifo});
  EXPECT_NE(m.find("tokenizer.json': not a regular file: it is a FIFO (named pipe)"), std::string::npos) << m;
  testing::make_link(dir / "tokenizer.json", "/dev/zero");
  m = testing::refusal_within<TokenizerError>([&] { (void)BpeTokenizer::from_folder(dir); });
  EXPECT_NE(m.find("tokenizer.json': not a regular file: it is a character device"), std::string::npos) << m;
}

TEST(tokenizer_hostile_test, json_nested_a_million_levels_deep_is_a_clean_error) {
  const auto v = testing::full_byte_vocab();
  // vocab.json: the top level, and a token's id.
  auto dir = testing::write_gpt2_files(v, "deep_vocab");
  testing::write_text(dir / "vocab.json", testing::deep_json(1'000'000));
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(dir), TokenizerError, "vocab.json': arrays and objects nest deeper than "
                   "128 levels (byte offset 128, at '[0][0][0]", "hint:");
  testing::write_text(dir / "vocab.json", "{\"a\": " + testing::deep_json_objects(1'000'000));
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(dir), TokenizerError,
                   "arrays and objects nest deeper than 128 levels (byte offset 641, at 'a.a.a.a.");
  // tokenizer.json: deep inside the model, and in added_tokens.
  dir = testing::write_tokenizer_json(v, "deep_tokenizer_json", true);
  testing::write_text(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"dropout\": " +
                                                   testing::deep_json(1'000'000));
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(dir), TokenizerError, "tokenizer.json': arrays and objects nest deeper "
                   "than 128 levels", "at 'model.dropout[0][0]");
  // As deep as allowed: read, and the offending value shown as a short excerpt, not printed whole.
  const std::string deep_ok = std::string(120, '[') + std::string(120, ']');
  testing::write_text(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"dropout\": " + deep_ok + "}}");
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(dir), TokenizerError,
                   "model.dropout is " + std::string(77, '[') + "...: BPE dropout");
}

}  // namespace
}  // namespace ampscope::samples
