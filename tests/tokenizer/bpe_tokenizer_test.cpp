// GPT-2's byte-level BPE (models/bpe_tokenizer.h) on the hand-made vocabulary of tokenizer_files.h. Every
// expected id list below was worked by hand from GPT-2's algorithm (openai/gpt-2 src/encoder.py): the
// pre-token split the pattern gives, then for each piece the merge rounds (the lowest-ranked adjacent pair,
// every occurrence merged left to right, repeat), then the vocabulary ids. "r3" is merge rank 3.
//
// No Debian package holds Hugging Face's tokenizers or transformers (apt-cache policy python3-tokenizers
// python3-transformers: none in bookworm), so no cross-check against them runs here; the pre-tokenization
// is checked against GPT-2's own regex module in gpt2_regex_reference_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <set>

#include "tests/tokenizer/tokenizer_files.h"

namespace ampscope {
namespace {

using samples::BpeTokenizer;
using samples::TokenizerError;
using Ids = std::vector<std::int32_t>;
using Pieces = std::vector<std::string>;

const BpeTokenizer& hand() {
  static const BpeTokenizer t = [] {
    const auto dir = testing::write_gpt2_files(testing::hand_vocab(), "hand");
    return BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  }();
  return t;
}

TEST(bpe_tokenizer_test, byte_table_is_gpt2s) {
  // Printable bytes map to themselves: '!' .. '~', U+00A1 .. U+00AC, U+00AE .. U+00FF (188 bytes). The other
  // 68 take U+0100 onwards in byte order: 0x00..0x20 -> U+0100..U+0120, 0x7F -> U+0121, 0x80..0xA0 ->
  // U+0122..U+0142, 0xAD -> U+0143.
  EXPECT_EQ(BpeTokenizer::byte_symbol('A'), "A");
  EXPECT_EQ(BpeTokenizer::byte_symbol('!'), "!");
  EXPECT_EQ(BpeTokenizer::byte_symbol('~'), "~");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0x00), "\u0100");
  EXPECT_EQ(BpeTokenizer::byte_symbol('\n'), "\u010A");
  EXPECT_EQ(BpeTokenizer::byte_symbol(' '), "\u0120");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0x7F), "\u0121");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0x80), "\u0122");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xA0), "\u0142");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xA1), "\u00A1");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xAC), "\u00AC");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xAD), "\u0143");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xAE), "\u00AE");
  EXPECT_EQ(BpeTokenizer::byte_symbol(0xFF), "\u00FF");
}

TEST(bpe_tokenizer_test, splits_text_as_gpt2s_pattern_does) {
  // Runs of whitespace: each run but the last keeps all but its last character, which goes with the word
  // after it; the run at the end stays whole. 'a', ' ', ' b', '   \n\n', ' x', '  '.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a  b   \n\n x  "), (Pieces{"a", " ", " b", "   \n\n", " x", "  "}));
  // Only U+0020 joins a word: a tab or newline before a word is a piece of its own.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("\t\tx"), (Pieces{"\t", "\t", "x"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a\r\n"), (Pieces{"a", "\r\n"}));
  // U+3000 (ideographic space) is White_Space: the run "  \u3000" before x keeps "  ", then the lone
  // U+3000 (not U+0020, so it cannot join x) is its own piece.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("  \u3000x"), (Pieces{"  ", "\u3000", "x"}));
  // U+001C is not White_Space (Python's str.isspace says it is; the regex module's \s does not): it is
  // "other", so the space before it joins it.
  EXPECT_EQ(BpeTokenizer::pre_tokenize(" \x1c" "b"), (Pieces{" \x1c", "b"}));
  // Numbers: Nd, No (superscript two U+00B2), Nl (roman numeral twelve U+216B) run together, apart from letters.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("x\u00B22 y"), (Pieces{"x", "\u00B22", " y"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a\u216B3"), (Pieces{"a", "\u216B3"}));
  // Letters: Lt (U+01C5) and Lm (U+02B0) are letters; a combining accent (U+0301, Mn) is not, so a
  // decomposed "é" splits.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("\u01C5a\u02B0"), (Pieces{"\u01C5a\u02B0"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("e\u0301"), (Pieces{"e", "\u0301"}));
  // Contractions, lower case only, tried before anything else; ' otherwise is punctuation.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("it's"), (Pieces{"it", "'s"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("IT'S"), (Pieces{"IT", "'", "S"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("'sa"), (Pieces{"'s", "a"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize(" 'll"), (Pieces{" '", "ll"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("!!'s"), (Pieces{"!!'", "s"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("we're they've I'm we'll I'd"),
            (Pieces{"we", "'re", " they", "'ve", " I", "'m", " we", "'ll", " I", "'d"}));
  // Bytes that are not UTF-8: each is one character of class other, so it runs with punctuation and takes
  // a space before it. \xe6\x97 is 日 without its last byte: two invalid bytes.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("he\xffll"), (Pieces{"he", "\xff", "ll"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a \xe6\x97!b"), (Pieces{"a", " \xe6\x97!", "b"}));
  // Overlong "/" (C0 AF) and a UTF-16 surrogate (ED A0 80) are not UTF-8 either.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a\xc0\xaf" "b\xed\xa0\x80"), (Pieces{"a", "\xc0\xaf", "b", "\xed\xa0\x80"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize(""), Pieces{});
}

struct Case {
  const char* name;
  std::string text;
  Ids ids;
};

TEST(bpe_tokenizer_test, encodes_edge_cases_to_the_ids_worked_by_hand) {
  const std::vector<Case> cases = {
      // "hello": h e l l o; r1 (h,e) -> he l l o; r2 (l,l) -> he ll o; r4 -> hell o; r5 -> hello = 36.
      // " world": Ġ w o r l d; r3 (o,r) -> Ġ w or l d; r6 (Ġ,w) -> Ġw or l d; r7 -> Ġwor l d; r8 (l,d) ->
      // Ġwor ld; r9 -> Ġworld = 40.
      {"two words", "hello world", {36, 40}},
      // A leading space belongs to the word: Ġ t h e; r0 (Ġ,t) -> Ġt h e; r1 -> Ġt he; r10 -> Ġthe = 42.
      {"leading space", " the", {42}},
      // Without it: t h e; r1 -> t he; (t,he) has no rank: t=15, he=32.
      {"no leading space", "the", {15, 32}},
      // "\n\n" before a word splits into "\n", "\n" (the run less its last character, then the last one
      // alone), so r20 (Ċ,Ċ) never sees both. "world" without a space: r3 -> w or l d; r8 -> w or ld.
      {"newlines before a word", "hello\n\nworld", {36, 19, 19, 16, 34, 39}},
      // At the end the run stays whole: Ċ Ċ; r20 -> ĊĊ = 52.
      {"newlines at the end", "hello\n\n", {36, 52}},
      // "a", "  ", " the": Ġ Ġ r19 -> ĠĠ = 51; " the" = 42.
      {"three spaces before a word", "a   the", {8, 51, 42}},
      // "a", "   ": Ġ Ġ Ġ; r19 at both pairs, left to right: the first takes Ġ Ġ, the second is gone -> ĠĠ Ġ.
      {"three spaces at the end", "a   ", {8, 51, 18}},
      // "  hello" -> " ", " hello"; Ġ h e l l o: r1, r2, r4, r5 -> Ġ hello ((Ġ,hello) has no rank).
      {"two leading spaces", "  hello", {18, 18, 36}},
      // "12", " 345": 1 2 r12 -> 12 = 44; Ġ 3 4 5 has no ranked pair.
      {"digits", "12 345", {44, 18, 5, 6, 7}},
      // Letters and digits are different pieces: "he", "12".
      {"digits after letters", "he12", {32, 44}},
      // "he", "'s" (' s r11 -> 's = 43), " he" (Ġ h e; r1 -> Ġ he), "'ll" (' l l; r2 -> ' ll), " he", "'d".
      {"contractions", "he's he'll he'd", {32, 43, 18, 32, 1, 33, 18, 32, 1, 10}},
      // Upper case is no contraction: "he", "'", "S".
      {"upper-case contraction", "he'S", {32, 1, 17}},
      // "'s" is matched before letters: "'s", "a".
      {"contraction then letter", "'sa", {43, 8}},
      // "hello", "!!!", " world": ! ! ! r21 at both pairs left to right -> !! ! = 53, 0.
      {"punctuation run", "hello!!! world", {36, 53, 0, 40}},
      // "a", " ?!": Ġ ? ! has no ranked pair.
      {"space before punctuation", "a ?!", {8, 18, 2, 0}},
      // "café" = c a f C3 A9 -> c a f Ã ©; r13 (Ã,©) -> c a f Ã©; r14 -> ca f Ã©; r15 -> caf Ã©; r16 -> cafÃ©.
      {"accented letter", "caf\u00e9", {48}},
      // 日本 = E6 97 A5 E6 9C AC, both Lo: one piece æ Ĺ ¥ æ ľ ¬; r17 (æ,Ĺ) at 0 only -> æĹ ¥ æ ľ ¬; r18 ->
      // æĹ¥ æ ľ ¬ = 50, 22, 23, 24.
      {"CJK", "\u65e5\u672c", {50, 22, 23, 24}},
      // With a space: Ġ æ Ĺ ¥ æ ľ ¬; r17, r18 -> Ġ æĹ¥ æ ľ ¬.
      {"CJK after a space", " \u65e5\u672c", {18, 50, 22, 23, 24}},
      // 😀 = F0 9F 98 80 (So, other) runs with "!": "he", "😀!" = ð Ł ĺ Ģ ! (no ranked pair).
      {"emoji", "he\U0001F600!", {32, 25, 26, 27, 28, 0}},
      // 0xFF is no UTF-8: one "other" character between letters: "he", "\xff" (ÿ = 29), "ll" (r2).
      {"invalid byte between letters", "he\xffll", {32, 29, 33}},
      // A lone continuation byte 0x80 runs with punctuation: Ģ ! !; r21 -> Ģ !!.
      {"lone continuation byte", "\x80!!", {28, 53}},
      // 日 without its last byte: E6 97 are two invalid bytes, "other", with the space: Ġ æ Ĺ; r17 -> Ġ æĹ.
      {"truncated UTF-8", " \xe6\x97", {18, 49}},
      // Latin-1 é (E9 alone) is invalid UTF-8: "caf" (r14, r15 -> caf = 47), "\xe9" = byte symbol é = 30,
      // not UTF-8's é (45).
      {"Latin-1 byte", "caf\xe9", {47, 30}},
      // GPT-2's special token is matched in the text before the pattern: "a", <|endoftext|> = 54, "b".
      {"special token", "a<|endoftext|>b", {8, 54, 9}},
      // U+00A0 (no-break space, C2 A0) is White_Space: "a", "\u00a0" (Â ł), "b".
      {"no-break space", "a\u00a0b", {8, 20, 31, 9}},
      // Lower rank first, not left first: Ġ w o r d; r3 (o,r) -> Ġ w or d; r6 -> Ġw or d; r7 -> Ġwor d.
      {"rank order", " word", {38, 10}},
      // Overlapping occurrences of one pair: l l l; r2 takes the left pair -> ll l.
      {"overlapping pair", "lll", {33, 13}},
      {"empty", "", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(hand().encode(c.text), c.ids);
    EXPECT_EQ(hand().decode(c.ids), c.text);
  }
}

TEST(bpe_tokenizer_test, follows_gpt2s_rounds_when_a_merge_of_merges_ranks_first) {
  // Merges: r0 (xx, x), r1 (x, x). GPT-2 on "xxxxx": the only ranked pair is (x,x) (r1): every occurrence,
  // left to right -> xx xx x. Now (xx, x) (r0) exists at the end -> xx xxx. A greedy one-merge-at-a-time
  // BPE would give xxx xx instead (it would merge (xx, x) as soon as the first xx appears).
  testing::Vocab v;
  v.tokens = {"x", "xx", "xxx"};
  v.merges = {{"xx", "x"}, {"x", "x"}};
  const auto dir = testing::write_gpt2_files(v, "rounds");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  EXPECT_EQ(t.encode("xxxxx"), (Ids{1, 2}));
  // "xxx": r1 -> xx x; r0 -> xxx.
  EXPECT_EQ(t.encode("xxx"), (Ids{2}));
  // "xxxx": r1 -> xx xx; no ranked pair left.
  EXPECT_EQ(t.encode("xxxx"), (Ids{1, 1}));
}

TEST(bpe_tokenizer_test, reports_the_vocabulary_it_read) {
  EXPECT_EQ(hand().vocab_size(), 55);
  EXPECT_EQ(hand().token_id("\u0120the"), 42);
  EXPECT_EQ(hand().token_id("the"), -1);
  EXPECT_NE(hand().source().find("vocab.json + "), std::string::npos);
}

std::string random_bytes(std::mt19937_64& rng, std::size_t n) {
  // Three kinds of text, so the pattern's branches all run: uniform bytes; ASCII words and spaces; UTF-8 of
  // random code points (some letters, numbers, spaces) with a few bytes broken.
  std::string s;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int kind = pick(0, 2);
  static const char* ascii = "aehlorst dw12'!? \n\t";
  while (s.size() < n) {
    if (kind == 0) {
      s += static_cast<char>(pick(0, 255));
    } else if (kind == 1) {
      s += ascii[pick(0, 18)];
    } else {
      static const char32_t cps[] = {U'a', U' ', U'\u00e9', U'\u65e5', U'\U0001F600', U'\u3000', U'\u00b2',
                                     U'\'', U's', U'\n', U'5', U'\u0301'};
      const char32_t cp = cps[pick(0, 11)];
      std::string u;
      if (cp < 0x80) u += static_cast<char>(cp);
      else if (cp < 0x800) { u += static_cast<char>(0xC0 | (cp >> 6)); u += static_cast<char>(0x80 | (cp & 0x3F)); }
      else if (cp < 0x10000) {
        u += static_cast<char>(0xE0 | (cp >> 12)); u += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        u += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        u += static_cast<char>(0xF0 | (cp >> 18)); u += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        u += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); u += static_cast<char>(0x80 | (cp & 0x3F));
      }
      if (pick(0, 20) == 0) u.pop_back();  // a truncated sequence
      s += u;
    }
  }
  return s;
}

TEST(bpe_tokenizer_test, decode_of_encode_is_the_identity_on_arbitrary_bytes) {
  const auto dir = testing::write_gpt2_files(testing::full_byte_vocab(), "full");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  std::mt19937_64 rng(19);
  for (int k = 0; k < 3000; ++k) {
    const std::string x = random_bytes(rng, std::uniform_int_distribution<std::size_t>(0, 200)(rng));
    const Ids ids = t.encode(x);
    for (std::int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.vocab_size()) << "case " << k;
    ASSERT_EQ(t.decode(ids), x) << "case " << k;
    // Pre-tokens cover the text exactly, in order.
    std::string joined;
    for (const auto& p : BpeTokenizer::pre_tokenize(x)) joined += p;
    ASSERT_EQ(joined, x) << "case " << k;
  }
  // Every single byte, alone and after a space, is its byte symbol's token.
  for (unsigned b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    EXPECT_EQ(t.decode(t.encode(one)), one);
    EXPECT_EQ(t.encode(one), Ids{t.token_id(BpeTokenizer::byte_symbol(static_cast<unsigned char>(b)))});
  }
}

TEST(bpe_tokenizer_test, tokenizer_json_gives_the_ids_of_vocab_json_and_merges_txt) {
  const auto v = testing::full_byte_vocab();
  const auto dir = testing::write_gpt2_files(v, "pair_files");
  const auto files = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  // Both merge forms: "a b" strings (tokenizers before 0.20) and ["a", "b"] pairs (newer files).
  const auto strings = BpeTokenizer::from_folder(testing::write_tokenizer_json(v, "json_strings", false));
  const auto pairs = BpeTokenizer::from_folder(testing::write_tokenizer_json(v, "json_pairs", true));
  EXPECT_EQ(strings.vocab_size(), files.vocab_size());
  std::vector<std::string> texts = {"hello world", " the", "hello\n\nworld", "a   ", "12 345", "he's he'll he'd",
                                    "caf\u00e9", "\u65e5\u672c", "he\xffll", "a<|endoftext|>b", " word", "lll"};
  std::mt19937_64 rng(7);
  for (int k = 0; k < 300; ++k) texts.push_back(random_bytes(rng, 120));
  for (const auto& x : texts) {
    const Ids want = files.encode(x);
    EXPECT_EQ(strings.encode(x), want);
    EXPECT_EQ(pairs.encode(x), want);
    EXPECT_EQ(pairs.decode(want), x);
  }
  // The hand-worked ids hold through tokenizer.json as well.
  EXPECT_EQ(pairs.encode("hello world"), (Ids{36, 40}));
  EXPECT_EQ(pairs.encode("a<|endoftext|>b"), (Ids{8, 54, 9}));
}

TEST(bpe_tokenizer_test, ignore_merges_takes_a_piece_that_is_a_whole_token_as_it_is) {
  // No merges at all, and ignore_merges: " world" and "hello" are whole tokens (40, 36); "lll" is not, so
  // it stays three byte symbols l l l (13 each).
  testing::Vocab v = testing::hand_vocab();
  v.merges.clear();
  std::string json = testing::tokenizer_json_text(v, true);
  const std::string from = "\"byte_fallback\": false";
  json.replace(json.find(from), from.size(), from + ", \"ignore_merges\": true");
  const auto dir = testing::process_scratch_dir("ampscope_tokenizer") / "ignore_merges";
  testing::write_text(dir / "tokenizer.json", json);
  const auto t = BpeTokenizer::from_folder(dir);
  EXPECT_EQ(t.encode("hello world"), (Ids{36, 40}));
  EXPECT_EQ(t.encode("lll"), (Ids{13, 13, 13}));
}

TEST(bpe_tokenizer_test, from_folder_prefers_tokenizer_json_and_else_reads_vocab_and_merges) {
  const auto v = testing::hand_vocab();
  const auto dir = testing::write_gpt2_files(v, "both");
  testing::write_tokenizer_json(v, "both", true);
  EXPECT_NE(BpeTokenizer::from_folder(dir).source().find("tokenizer.json"), std::string::npos);
  const auto only = testing::write_gpt2_files(v, "only_gpt2");
  EXPECT_NE(BpeTokenizer::from_folder(only).source().find("merges.txt"), std::string::npos);
  EXPECT_EQ(BpeTokenizer::from_folder(only).encode("hello world"), (Ids{36, 40}));
}

TEST(bpe_tokenizer_test, encodes_megabytes_of_text_in_seconds) {
  // A vocabulary of 2000 words (3..9 letters) built up letter by letter after a space, 256 byte symbols, and
  // 4 MB of those words with punctuation and newlines: most pieces repeat, as in real text, so the cache
  // answers them. Then one 1 MB piece of a single letter, which GPT-2's quadratic bpe() could not finish.
  std::mt19937_64 rng(3);
  testing::Vocab v;
  for (unsigned b = 0; b < 256; ++b) v.tokens.push_back(BpeTokenizer::byte_symbol(static_cast<unsigned char>(b)));
  std::vector<std::string> words;
  std::set<std::string> known(v.tokens.begin(), v.tokens.end());
  for (int w = 0; w < 2000; ++w) {
    std::string word;
    const int len = std::uniform_int_distribution<int>(3, 9)(rng);
    for (int k = 0; k < len; ++k) word += static_cast<char>('a' + std::uniform_int_distribution<int>(0, 25)(rng));
    words.push_back(word);
    std::string sym = "\u0120";
    for (char c : word) {
      const std::string next = sym + c;
      if (known.insert(next).second) {
        v.merges.emplace_back(sym, std::string(1, c));
        v.tokens.push_back(next);
      }
      sym = next;
    }
  }
  v.merges.emplace_back("a", "a");
  v.tokens.push_back("aa");
  const auto dir = testing::write_gpt2_files(v, "perf");
  const auto t = BpeTokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  std::string text;
  while (text.size() < (4u << 20)) {
    text += " " + words[std::uniform_int_distribution<std::size_t>(0, words.size() - 1)(rng)];
    if (std::uniform_int_distribution<int>(0, 15)(rng) == 0) text += ".\n";
  }
  auto t0 = std::chrono::steady_clock::now();
  const Ids ids = t.encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %.1f MB into %zu tokens in %.2f s (%.1f MB/s)\n", text.size() / 1e6, ids.size(), seconds,
              text.size() / 1e6 / seconds);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_LT(seconds, 30.0) << "a few MB of text should take seconds";

  const std::string long_piece(1u << 20, 'a');
  t0 = std::chrono::steady_clock::now();
  const Ids aa = t.encode(long_piece);
  const double long_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("one 1 MB piece: %.2f s\n", long_seconds);
  EXPECT_EQ(aa.size(), (1u << 20) / 2);  // a a, left to right: 524288 "aa"
  EXPECT_LT(long_seconds, 30.0);
}

}  // namespace
}  // namespace ampscope
