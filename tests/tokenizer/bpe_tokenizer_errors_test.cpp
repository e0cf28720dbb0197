// Tokenizer files that cannot be used: each is refused with a TokenizerError that names the file, where in it,
// and what is wrong, with a hint. Then seeded mutants of valid files (byte flips, truncations, inserted and
// deleted bytes, edited digits and punctuation): every mutant either loads or throws TokenizerError, never
// crashes; one that loads encodes text to ids that decode back to that text, or throws TokenizerError naming
// a piece. AMPSCOPE_FUZZ_CASES sets the number of mutants per file (default 300), AMPSCOPE_FUZZ_SEED the
// first seed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>

#include "tests/support/fuzz.h"
#include "tests/tokenizer/tokenizer_files.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
using samples::BpeTokenizer;
using samples::TokenizerError;
using Ids = std::vector<std::int32_t>;

fs::path scratch(const std::string& name) {
  const fs::path dir = testing::process_scratch_dir("ampscope_tokenizer") / name;
  fs::create_directories(dir);
  return dir;
}

// vocab.json `vocab` and merges.txt `merges` in a fresh folder.
fs::path gpt2_folder(const std::string& name, const std::string& vocab, const std::string& merges) {
  const fs::path dir = scratch(name);
  testing::write_text(dir / "vocab.json", vocab);
  testing::write_text(dir / "merges.txt", merges);
  return dir;
}

BpeTokenizer load(const fs::path& dir) { return BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt"); }

const char* kMerges = "#version: 0.2\nh e\n";
const char* kVocab = R"({"h": 0, "e": 1, "he": 2})";

TEST(bpe_tokenizer_errors_test, refuses_a_vocab_json_that_is_not_an_object_of_integer_ids) {
  EXPECT_THROW_MSG(load(gpt2_folder("v1", R"({"h": 0, "e": )", kMerges)), TokenizerError, "vocab.json",
                   "not valid JSON", "hint:");
  EXPECT_THROW_MSG(load(gpt2_folder("v2", R"(["h", "e"])", kMerges)), TokenizerError, "vocab.json",
                   "the top level is a JSON array, not an object of token strings to integer ids");
  EXPECT_THROW_MSG(load(gpt2_folder("v3", R"({"h": 0, "e": "1"})", kMerges)), TokenizerError,
                   R"(the top level["e"] is "1", not an integer id)");
  EXPECT_THROW_MSG(load(gpt2_folder("v4", R"({"h": 0, "e": 1.5})", kMerges)), TokenizerError,
                   R"(the top level["e"] is 1.5, not an integer id)");
  EXPECT_THROW_MSG(load(gpt2_folder("v5", R"({"h": -1})", kMerges)), TokenizerError,
                   "id -1 of token \"h\" is outside [0, 2147483647)");
  EXPECT_THROW_MSG(load(gpt2_folder("v6", R"({"h": 0, "e": 0})", kMerges)), TokenizerError, "id 0 is given to token");
  // Not UTF-8 inside a string: the JSON parser refuses it.
  EXPECT_THROW_MSG(load(gpt2_folder("v7", "{\"h\xff\": 0}", kMerges)), TokenizerError, "not valid JSON");
}

TEST(bpe_tokenizer_errors_test, refuses_merges_lines_that_are_not_two_symbols) {
  EXPECT_THROW_MSG(load(gpt2_folder("m1", kVocab, "#version: 0.2\nhe\n")), TokenizerError, "merges.txt",
                   "line 2 is \"he\", not two symbols separated by one space");
  EXPECT_THROW_MSG(load(gpt2_folder("m2", kVocab, "#version: 0.2\nh e\nh  e\n")), TokenizerError,
                   "line 3 is \"h  e\", not two symbols");
  EXPECT_THROW_MSG(load(gpt2_folder("m3", kVocab, "#version: 0.2\nh e x\n")), TokenizerError,
                   "line 2 is \"h e x\"");
  EXPECT_THROW_MSG(load(gpt2_folder("m4", kVocab, "#version: 0.2\n h\n")), TokenizerError, "line 2 is \" h\"");
  EXPECT_THROW_MSG(load(gpt2_folder("m5", kVocab, "#version: 0.2\nh e\nh e\n")), TokenizerError,
                   "line 3: the merge \"h\" \"e\" appears twice (also at line 2)");
  EXPECT_THROW_MSG(load(gpt2_folder("m6", kVocab, "#version: 0.2\nh \xff\n")), TokenizerError,
                   "line 2 is not valid UTF-8: \"h \\xff\"");
}

TEST(bpe_tokenizer_errors_test, reads_merges_txt_line_ends_as_python_does) {
  // \r\n and \r end lines as \n does (Python's text mode); no header line, no final newline, empty lines.
  for (const char* merges : {"#version: 0.2\r\nh e\r\n", "h e", "\n\nh e\n\n", "#version: 0.2\rh e\r"}) {
    SCOPED_TRACE(merges);
    EXPECT_EQ(load(gpt2_folder("ends", kVocab, merges)).encode("he"), (Ids{2}));
  }
}

TEST(bpe_tokenizer_errors_test, allows_merges_outside_the_vocabulary_as_gpt2_does_and_names_a_missing_piece) {
  // GPT-2's encoder.py takes the merge ranks without looking at the vocabulary; only the pieces bpe() leaves
  // are looked up. So "q u" -> "qu" may be missing when "qu i" -> "qui" is there: "qui" encodes, "qu" does
  // not, and neither does "x", whose byte symbol is missing.
  const auto dir = gpt2_folder("unknown", R"({"q": 0, "u": 1, "i": 2, "qui": 3})", "#version: 0.2\nq u\nqu i\nz y\n");
  const auto t = load(dir);
  EXPECT_EQ(t.encode("qui"), (Ids{3}));
  EXPECT_EQ(t.encode("iq"), (Ids{2, 0}));
  // "quiqu": q u i q u; r0 (q,u) at both -> qu i qu; r1 (qu,i) -> qui qu: "qu" is missing.
  EXPECT_THROW_MSG(t.encode("quiqu"), TokenizerError, "the vocabulary has no token \"qu\" (bytes \"qu\")",
                   "the text's piece \"quiqu\" at byte 0", "hint:");
  EXPECT_THROW_MSG(t.encode("qui x"), TokenizerError, "no token \"\xc4\xa0\" (bytes \" \")");  // Ġ
  EXPECT_THROW_MSG(t.decode({3, 4}), TokenizerError, "id 4 (position 1) names no token");
}

TEST(bpe_tokenizer_errors_test, refuses_missing_files_with_what_is_missing) {
  const fs::path empty = scratch("empty");
  EXPECT_THROW_MSG(BpeTokenizer::from_files(empty / "vocab.json", empty / "merges.txt"), TokenizerError,
                   "vocab.json' does not exist", "hint:");
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(empty), TokenizerError,
                   "neither tokenizer.json nor vocab.json + merges.txt", "--tokens");
  const fs::path half = scratch("half");
  testing::write_text(half / "vocab.json", kVocab);
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(half), TokenizerError, "vocab.json is there but merges.txt is not");
  const fs::path sp = scratch("sentencepiece");
  testing::write_text(sp / "tokenizer.model", "x");
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(sp), TokenizerError, "SentencePiece tokenizer.model", "--tokens");
  EXPECT_THROW_MSG(BpeTokenizer::from_folder(empty / "nope"), TokenizerError, "is not a folder");
}

std::string tokenizer_json_with(const std::string& from, const std::string& to) {
  std::string s = testing::tokenizer_json_text(testing::hand_vocab(), false);
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

BpeTokenizer load_json(const std::string& name, const std::string& text) {
  const fs::path dir = scratch(name);
  testing::write_text(dir / "tokenizer.json", text);
  return BpeTokenizer::from_folder(dir);
}

TEST(bpe_tokenizer_errors_test, refuses_tokenizer_json_kinds_other_than_byte_level_bpe_by_name) {
  EXPECT_THROW_MSG(load_json("wp", R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"a": 0}}})"),
                   TokenizerError, "tokenizer.json", "model.type is \"WordPiece\", not \"BPE\"", "--tokens");
  EXPECT_THROW_MSG(load_json("uni", R"({"model": {"type": "Unigram", "vocab": [["a", -1.0]]}})"), TokenizerError,
                   "model.type is \"Unigram\", not \"BPE\"", "--tokens");
  EXPECT_THROW_MSG(load_json("notype", R"({"model": {"vocab": {"a": 0}}})"), TokenizerError,
                   "model.type is missing");
  // Llama 3 style: a Sequence of a Split with its own pattern and ByteLevel without the regex.
  EXPECT_THROW_MSG(load_json("seq", tokenizer_json_with(R"("pre_tokenizer": {"type": "ByteLevel")",
                                                        R"("pre_tokenizer": {"type": "Sequence")")),
                   TokenizerError, "pre_tokenizer is \"Sequence\", not GPT-2's ByteLevel", "--tokens");
  EXPECT_THROW_MSG(load_json("meta", tokenizer_json_with(R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})",
                                                         R"("pre_tokenizer": null)")),
                   TokenizerError, "pre_tokenizer is null, not GPT-2's ByteLevel");
  EXPECT_THROW_MSG(load_json("prefix", tokenizer_json_with(R"("ByteLevel", "add_prefix_space": false, "trim_offsets": true)",
                                                           R"("ByteLevel", "add_prefix_space": true, "trim_offsets": true)")),
                   TokenizerError, "pre_tokenizer.add_prefix_space is true; GPT-2's is false");
  EXPECT_THROW_MSG(load_json("noregex", tokenizer_json_with(R"("trim_offsets": true, "use_regex": true}, "post)",
                                                            R"("trim_offsets": true, "use_regex": false}, "post)")),
                   TokenizerError, "pre_tokenizer.use_regex is false");
  EXPECT_THROW_MSG(load_json("norm", tokenizer_json_with(R"("normalizer": null)", R"("normalizer": {"type": "NFC"})")),
                   TokenizerError, "normalizer is \"NFC\"; GPT-2's tokenizer has none");
  EXPECT_THROW_MSG(load_json("fallback", tokenizer_json_with(R"("byte_fallback": false)", R"("byte_fallback": true)")),
                   TokenizerError, "model.byte_fallback is true");
  EXPECT_THROW_MSG(load_json("dropout", tokenizer_json_with(R"("dropout": null)", R"("dropout": 0.1)")),
                   TokenizerError, "model.dropout is 0.1");
  EXPECT_THROW_MSG(load_json("suffix", tokenizer_json_with(R"("end_of_word_suffix": "")", R"("end_of_word_suffix": "</w>")")),
                   TokenizerError, "model.end_of_word_suffix is \"</w>\"");
  EXPECT_THROW_MSG(load_json("lstrip", tokenizer_json_with(R"("lstrip": false)", R"("lstrip": true)")),
                   TokenizerError, "added_tokens[0] (\"<|endoftext|>\") has lstrip: true");
}

TEST(bpe_tokenizer_errors_test, refuses_damaged_tokenizer_json_with_the_json_path) {
  EXPECT_THROW_MSG(load_json("merge5", tokenizer_json_with(R"("merges": [)", R"("merges": [5, )")), TokenizerError,
                   "model.merges[0] is 5, neither \"a b\" nor [\"a\", \"b\"]");
  EXPECT_THROW_MSG(load_json("merge3", tokenizer_json_with(R"("merges": [)", R"("merges": [["a", "b", "c"], )")),
                   TokenizerError, "model.merges[0] is [\"a\",\"b\",\"c\"]");
  EXPECT_THROW_MSG(load_json("mergesp", tokenizer_json_with(R"("merges": [)", R"("merges": ["ab", )")),
                   TokenizerError, "model.merges[0] is \"ab\", not two symbols separated by one space");
  EXPECT_THROW_MSG(load_json("vocabarr", tokenizer_json_with(R"("vocab": {)", R"("vocab": [{)")), TokenizerError,
                   "not valid JSON");
  EXPECT_THROW_MSG(load_json("vocabid", tokenizer_json_with(R"("!": 0)", R"("!": null)")), TokenizerError,
                   R"(model.vocab["!"] is null, not an integer id)");
  EXPECT_THROW_MSG(load_json("added", tokenizer_json_with(R"({"id": 54, )", R"({"id": 3, )")), TokenizerError,
                   "added_tokens[0]: id 3 is given to token \"<|endoftext|>\" and to another token");
  EXPECT_THROW_MSG(load_json("top", "[1, 2]"), TokenizerError, "the top level is a JSON array, not an object");
}

// ---- fuzz ---------------------------------------------------------------------------------------------

std::string mutate(const std::string& original, std::mt19937_64& rng, std::string& how) {
  std::string b = original;
  auto pick = [&](std::size_t lo, std::size_t hi) { return static_cast<std::size_t>(testing::pick(rng, lo, hi)); };
  switch (pick(0, 6)) {
    case 0: testing::flip_byte(b, rng, how); break;
    case 1: testing::truncate(b, rng, how); break;
    case 2: testing::insert_or_delete_byte(b, rng, how); break;
    case 3: {  // a digit (an id) changed
      std::vector<std::size_t> digits;
      for (std::size_t i = 0; i < b.size(); ++i)
        if (b[i] >= '0' && b[i] <= '9') digits.push_back(i);
      if (digits.empty()) break;
      const std::size_t at = digits[pick(0, digits.size() - 1)];
      b[at] = static_cast<char>('0' + pick(0, 9));
      how = "digit at " + std::to_string(at);
      break;
    }
    case 4: {  // a structural character
      const std::size_t at = pick(0, b.size() - 1);
      const char* alphabet = "\"{}[],: \n-0e\\";
      b[at] = alphabet[pick(0, 12)];
      how = "punctuation at " + std::to_string(at);
      break;
    }
    case 5: {  // several flips
      for (int k = 0; k < 4; ++k) b[pick(0, b.size() - 1)] ^= static_cast<char>(pick(1, 255));
      how = "four flips";
      break;
    }
    default: {  // a run of 100 to 10^6 '[' or '{' put in (issue 36: it crashed once printed, 65,000 deep)
      const std::size_t at = pick(0, b.size() - 1);
      const std::size_t count = pick(0, 1) == 0 ? pick(100, 1000) : pick(100'000, 1'000'000);
      b.insert(at, count, pick(0, 1) ? '[' : '{');
      how = "nesting run of " + std::to_string(count) + " at " + std::to_string(at);
      break;
    }
  }
  return b;
}

TEST(bpe_tokenizer_errors_test, mutated_files_load_and_encode_consistently_or_throw_tokenizer_error) {
  const auto v = testing::full_byte_vocab();
  const std::string vocab = testing::vocab_json_text(v), merges = testing::merges_txt_text(v);
  const std::string json_strings = testing::tokenizer_json_text(v, false);
  const std::string json_pairs = testing::tokenizer_json_text(v, true);
  const std::vector<std::string> texts = {"hello world", "he's he'll", "caf\u00e9 \u65e5\u672c", "a   \n\nb",
                                          "he\xffll \x80!!", "a<|endoftext|>b", "12 345"};
  const std::uint64_t cases = testing::fuzz_cases(300);
  const std::uint64_t seed = testing::fuzz_seed();
  const fs::path dir = scratch("fuzz");
  std::uint64_t loaded = 0, refused = 0, encode_refused = 0;
  // Which file is mutated: 0 vocab.json, 1 merges.txt, 2 tokenizer.json with "a b" merges, 3 with pairs.
  for (int which = 0; which < 4; ++which) {
    for (std::uint64_t c = 0; c < cases; ++c) {
      std::mt19937_64 rng(seed + c + 100000 * static_cast<std::uint64_t>(which));
      std::string how;
      const std::string& original = which == 0 ? vocab : which == 1 ? merges : which == 2 ? json_strings : json_pairs;
      const std::string mutant = mutate(original, rng, how);
      fs::remove(dir / "tokenizer.json");
      if (which < 2) {
        testing::write_text(dir / "vocab.json", which == 0 ? mutant : vocab);
        testing::write_text(dir / "merges.txt", which == 1 ? mutant : merges);
      } else {
        testing::write_text(dir / "tokenizer.json", mutant);
      }
      const std::string where = "file " + std::to_string(which) + " seed " + std::to_string(seed + c) + " (" + how + ")";
      std::optional<BpeTokenizer> t;
      try {
        t.emplace(BpeTokenizer::from_folder(dir));
        ++loaded;
      } catch (const TokenizerError&) {
        ++refused;
        continue;
      } catch (const std::exception& e) {
        FAIL() << where << ": not a TokenizerError: " << e.what();
      }
      for (const auto& x : texts) {
        try {
          const Ids ids = t->encode(x);
          ASSERT_EQ(t->decode(ids), x) << where;
        } catch (const TokenizerError&) {
          ++encode_refused;
        } catch (const std::exception& e) {
          FAIL() << where << ": encode threw something else than TokenizerError: " << e.what();
        }
      }
    }
  }
  EXPECT_GT(refused, 0u);
  EXPECT_GT(loaded, 0u);
  std::printf("tokenizer fuzz: %llu mutants, %llu loaded, %llu refused; %llu encodes refused\n",
              static_cast<unsigned long long>(4 * cases), static_cast<unsigned long long>(loaded),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(encode_refused));
}

}  // namespace
}  // namespace ampscope
