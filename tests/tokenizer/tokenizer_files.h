// tests/tokenizer/tokenizer_files.h: the hand-made GPT-2 style vocabulary and merges the tokenizer tests
// share, and writers of the three file forms (vocab.json + merges.txt, tokenizer.json with "a b" merges or
// with ["a", "b"] merges).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "models/bpe_tokenizer.h"
#include "tests/test_support.h"

namespace ampscope::testing {

struct Vocab {
  std::vector<std::string> tokens;                           // token k has id k
  std::vector<std::pair<std::string, std::string>> merges;  // rank k is merges[k]
};

// Byte symbols as GPT-2's table gives them (worked out by hand; the tests check the table separately):
// 0x20 ' ' -> U+0120 "Ġ", 0x0A '\n' -> U+010A "Ċ", 0x80..0xA0 -> U+0122..U+0142, printable bytes themselves.
//
// The vocabulary of the hand-worked tests. The comment after each token is the bytes it stands for.
inline Vocab hand_vocab() {
  Vocab v;
  v.tokens = {
      "!",        // 0
      "'",        // 1
      "?",        // 2
      "1",        // 3
      "2",        // 4
      "3",        // 5
      "4",        // 6
      "5",        // 7
      "a",        // 8
      "b",        // 9
      "d",        // 10
      "h",        // 11
      "i",        // 12
      "l",        // 13
      "o",        // 14
      "t",        // 15
      "w",        // 16
      "S",        // 17
      "\u0120",   // 18 "Ġ" = byte 0x20, the space
      "\u010A",   // 19 "Ċ" = byte 0x0A, the newline
      "\u00C2",   // 20 "Â" = byte 0xC2
      "\u00B2",   // 21 "²" = byte 0xB2
      "\u00E6",   // 22 "æ" = byte 0xE6
      "\u013E",   // 23 "ľ" = byte 0x9C (U+0122 + 0x9C - 0x80)
      "\u00AC",   // 24 "¬" = byte 0xAC
      "\u00F0",   // 25 "ð" = byte 0xF0
      "\u0141",   // 26 "Ł" = byte 0x9F
      "\u013A",   // 27 "ĺ" = byte 0x98
      "\u0122",   // 28 "Ģ" = byte 0x80
      "\u00FF",   // 29 "ÿ" = byte 0xFF
      "\u00E9",   // 30 "é" = byte 0xE9 (one byte: Latin-1's é, not UTF-8's)
      "\u0142",   // 31 "ł" = byte 0xA0
      "he",       // 32
      "ll",       // 33
      "or",       // 34
      "hell",     // 35
      "hello",    // 36
      "\u0120w",  // 37 " w"
      "\u0120wor",        // 38 " wor"
      "ld",               // 39
      "\u0120world",      // 40 " world"
      "\u0120t",          // 41 " t"
      "\u0120the",        // 42 " the"
      "'s",               // 43
      "12",               // 44
      "\u00C3\u00A9",     // 45 "Ã©" = bytes C3 A9, UTF-8's é
      "ca",               // 46
      "caf",              // 47
      "caf\u00C3\u00A9",  // 48 "café"
      "\u00E6\u0139",     // 49 "æĹ" = bytes E6 97
      "\u00E6\u0139\u00A5",  // 50 "æĹ¥" = bytes E6 97 A5, 日
      "\u0120\u0120",        // 51 two spaces
      "\u010A\u010A",        // 52 two newlines
      "!!",                  // 53
      "<|endoftext|>",       // 54
  };
  v.merges = {
      {"\u0120", "t"},                  // 0
      {"h", "e"},                       // 1
      {"l", "l"},                       // 2
      {"o", "r"},                       // 3
      {"he", "ll"},                     // 4
      {"hell", "o"},                    // 5
      {"\u0120", "w"},                  // 6
      {"\u0120w", "or"},                // 7
      {"l", "d"},                       // 8
      {"\u0120wor", "ld"},              // 9
      {"\u0120t", "he"},                // 10
      {"'", "s"},                       // 11
      {"1", "2"},                       // 12
      {"\u00C3", "\u00A9"},             // 13 Ã ©
      {"c", "a"},                       // 14
      {"ca", "f"},                      // 15
      {"caf", "\u00C3\u00A9"},          // 16
      {"\u00E6", "\u0139"},             // 17 æ Ĺ
      {"\u00E6\u0139", "\u00A5"},       // 18 æĹ ¥
      {"\u0120", "\u0120"},             // 19
      {"\u010A", "\u010A"},             // 20
      {"!", "!"},                       // 21
  };
  return v;
}

// The hand vocabulary grown to hold all 256 byte symbols, so that every byte string can be encoded.
inline Vocab full_byte_vocab() {
  Vocab v = hand_vocab();
  std::vector<std::string> have(v.tokens.begin(), v.tokens.end());
  for (unsigned b = 0; b < 256; ++b) {
    const std::string s = samples::BpeTokenizer::byte_symbol(static_cast<unsigned char>(b));
    bool found = false;
    for (const auto& t : have) found = found || t == s;
    if (!found) v.tokens.push_back(s);
  }
  return v;  // every merge's result is already in the hand vocabulary
}

inline std::string json_string(const std::string& s) {
  // Tokens are valid UTF-8; escape what JSON requires.
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

inline std::string vocab_json_text(const Vocab& v) {
  std::string s = "{";
  for (std::size_t k = 0; k < v.tokens.size(); ++k)
    s += (k ? ", " : "") + json_string(v.tokens[k]) + ": " + std::to_string(k);
  return s + "}";
}

inline std::string merges_txt_text(const Vocab& v) {
  std::string s = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) s += a + " " + b + "\n";
  return s;
}

// As Hugging Face's tokenizers writes a GPT-2 tokenizer.json (the fields that matter here).
inline std::string tokenizer_json_text(const Vocab& v, bool pair_merges) {
  std::string merges;
  for (std::size_t k = 0; k < v.merges.size(); ++k) {
    const auto& [a, b] = v.merges[k];
    if (k) merges += ", ";
    if (pair_merges) {
      merges += '[';
      merges += json_string(a);
      merges += ", ";
      merges += json_string(b);
      merges += ']';
    } else {
      merges += json_string(a + " " + b);
    }
  }
  std::string added;
  for (std::size_t k = 0; k < v.tokens.size(); ++k)
    if (v.tokens[k] == "<|endoftext|>")
      added = "{\"id\": " + std::to_string(k) +
              ", \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
              "\"normalized\": true, \"special\": true}";
  return "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": [" + added +
         "], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
         "\"trim_offsets\": true, \"use_regex\": true}, \"post_processor\": {\"type\": \"ByteLevel\", "
         "\"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true}, \"decoder\": {\"type\": "
         "\"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}, \"model\": "
         "{\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": \"\", "
         "\"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": " +
         vocab_json_text(v) + ", \"merges\": [" + merges + "]}}";
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A folder `name` under this process's scratch folder with vocab.json + merges.txt of `v`.
inline std::filesystem::path write_gpt2_files(const Vocab& v, const std::string& name) {
  const auto dir = process_scratch_dir("ampscope_tokenizer") / name;
  write_text(dir / "vocab.json", vocab_json_text(v));
  write_text(dir / "merges.txt", merges_txt_text(v));
  return dir;
}

// A folder `name` with tokenizer.json of `v`.
inline std::filesystem::path write_tokenizer_json(const Vocab& v, const std::string& name, bool pair_merges) {
  const auto dir = process_scratch_dir("ampscope_tokenizer") / name;
  write_text(dir / "tokenizer.json", tokenizer_json_text(v, pair_merges));
  return dir;
}

}  // namespace ampscope::testing
