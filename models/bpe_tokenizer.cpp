// GPT-2's byte-level BPE (models/bpe_tokenizer.h). Written from the algorithm of openai/gpt-2's
// src/encoder.py and Hugging Face's GPT2Tokenizer; docs/checkpoints.md ("Tokenizing text: --text") states
// every rule this file follows, including the choices where those two do not say (bytes that are not
// UTF-8, damaged files).
#include "models/bpe_tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <queue>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/io/input_file.h"
#include "core/io/json_limits.h"

namespace ampscope::samples {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr const char* kUseTokensHint =
    "hint: --text reads GPT-2's byte-level BPE only; tokenize the text with the model's own tokenizer and pass "
    "the ids with --tokens";
constexpr const char* kDamagedHint =
    "hint: the file is damaged or not the model's tokenizer; download it again, or tokenize with the model's own "
    "tokenizer and pass the ids with --tokens";
// The most a tokenizer file may hold (GPT-2's vocab.json is 1 MB, the largest tokenizer.json files ~20 MB).
constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{1} << 30;

[[noreturn]] void fail(const std::string& file, const std::string& what, const std::string& hint = kDamagedHint) {
  throw TokenizerError(fmt::format("tokenizer file '{}': {}\n{}", file, what, hint));
}

std::string read_file(const fs::path& path) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (!exists)
    throw TokenizerError(fmt::format("tokenizer file '{}' does not exist\nhint: --text needs the model folder's "
                                     "vocab.json and merges.txt, or its tokenizer.json",
                                     path.string()));
  // A regular file only, checked before open() (a FIFO would block it; /dev/zero would never end).
  std::string bytes;
  if (auto problem = detail::read_input_file(path, kMaxFileBytes, bytes)) {
    using Kind = detail::FileProblem::Kind;
    fail(path.string(), problem->describe(),
         problem->kind == Kind::not_regular   ? "hint: give the path of a file"
         : problem->kind == Kind::too_large   ? kDamagedHint
         : problem->kind == Kind::cannot_open ? "hint: check the permissions"
                                              : "hint: check the file system");
  }
  return bytes;
}

// ---- UTF-8 -------------------------------------------------------------------------------------------

// The length of the valid UTF-8 sequence at s[i] (Unicode's table 3-7: no overlong forms, no surrogates,
// nothing past U+10FFFF) and its code point; 0 when the byte there starts no valid sequence.
int utf8_sequence(std::string_view s, std::size_t i, char32_t& cp) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = b(i);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 == 0xE0) { len = 3; lo = 0xA0; }
  else if (b0 >= 0xE1 && b0 <= 0xEC) len = 3;
  else if (b0 == 0xED) { len = 3; hi = 0x9F; }
  else if (b0 >= 0xEE && b0 <= 0xEF) len = 3;
  else if (b0 == 0xF0) { len = 4; lo = 0x90; }
  else if (b0 >= 0xF1 && b0 <= 0xF3) len = 4;
  else if (b0 == 0xF4) { len = 4; hi = 0x8F; }
  else return 0;
  if (i + static_cast<std::size_t>(len) > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (int k = 2; k < len; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  char32_t v = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) v = (v << 6) | (b(i + k) & 0x3F);
  cp = v;
  return len;
}

bool valid_utf8(std::string_view s) {
  char32_t cp = 0;
  for (std::size_t i = 0; i < s.size();) {
    const int n = utf8_sequence(s, i, cp);
    if (n == 0) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- GPT-2's byte-to-unicode table ---------------------------------------------------------------------

struct ByteTable {
  std::array<char32_t, 256> to_unicode{};
  std::array<std::string, 256> symbol;            // to_unicode as UTF-8
  std::unordered_map<char32_t, unsigned char> to_byte;
  ByteTable() {
    // '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF keep their own code point; the other 68 bytes (controls,
    // space, DEL, U+0080..U+00A0, the soft hyphen U+00AD) take U+0100, U+0101, ... in byte order.
    const auto printable = [](unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    char32_t next = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
      to_unicode[b] = printable(b) ? static_cast<char32_t>(b) : next++;
      append_utf8(symbol[b], to_unicode[b]);
      to_byte[to_unicode[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

std::string to_symbols(std::string_view bytes) {
  const ByteTable& t = byte_table();
  std::string out;
  for (unsigned char b : bytes) out += t.symbol[b];
  return out;
}

// A vocabulary string's bytes: each byte symbol back to its byte. A character that is no byte symbol (a
// hand-added token) stands for its own UTF-8 bytes; encode never produces such a token.
std::string symbols_to_bytes(std::string_view symbols) {
  const ByteTable& t = byte_table();
  std::string out;
  char32_t cp = 0;
  for (std::size_t i = 0; i < symbols.size();) {
    const int n = utf8_sequence(symbols, i, cp);
    if (n == 0) {  // not reachable for strings from the JSON parser, which checks UTF-8
      out += symbols[i++];
      continue;
    }
    auto it = t.to_byte.find(cp);
    if (it != t.to_byte.end()) out += static_cast<char>(it->second);
    else out.append(symbols.substr(i, static_cast<std::size_t>(n)));
    i += static_cast<std::size_t>(n);
  }
  return out;
}

// Bytes shown in a message: printable ASCII as is, the rest as \xNN; the first 80 bytes, then "...".
std::string shown(std::string_view bytes) { return detail::text_excerpt(bytes, 80); }

// ---- pre-tokenization ----------------------------------------------------------------------------------

// The pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ sorts characters
// into four classes. \s is Unicode's White_Space property (what Python's `regex` module matches; U+001C..
// U+001F are not in it), \p{L} the categories Lu Ll Lt Lm Lo, \p{N} Nd Nl No. A byte that starts no valid
// UTF-8 sequence is one character of class other.
enum class Class : unsigned char { letter, number, space, other };

Class classify(char32_t cp) {
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) return Class::space;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return Class::letter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return Class::number;
    default:
      return Class::other;
  }
}

const std::array<Class, 128>& ascii_classes() {
  static const std::array<Class, 128> table = [] {
    std::array<Class, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = classify(c);
    return t;
  }();
  return table;
}

struct Char {
  std::size_t begin;  // byte offset
  char32_t cp;        // the code point; for an invalid byte, 0xFFFFFFFF
  Class cls;
};

// Calls piece(begin, end) for each pre-token of `text`, in order; the pieces cover the text exactly.
void split_pieces(std::string_view text, const std::function<void(std::size_t, std::size_t)>& piece) {
  const auto& ascii = ascii_classes();
  std::vector<Char> chars;
  chars.reserve(text.size());
  char32_t cp = 0;
  for (std::size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      chars.push_back({i, b, ascii[b]});
      ++i;
      continue;
    }
    const int n = utf8_sequence(text, i, cp);
    if (n == 0) {
      chars.push_back({i, 0xFFFFFFFF, Class::other});
      ++i;
    } else {
      chars.push_back({i, cp, classify(cp)});
      i += static_cast<std::size_t>(n);
    }
  }
  const std::size_t n = chars.size();
  const auto at = [&](std::size_t k) { return k < n ? chars[k].begin : text.size(); };
  const auto cp_at = [&](std::size_t k) { return k < n ? chars[k].cp : char32_t{0}; };
  std::size_t i = 0;
  while (i < n) {
    std::size_t end = i;
    // 's 't 're 've 'm 'll 'd: the contractions, lower case only, tried first.
    if (chars[i].cp == U'\'') {
      const char32_t c1 = cp_at(i + 1), c2 = cp_at(i + 2);
      if (c1 == U's' || c1 == U't' || c1 == U'm' || c1 == U'd') end = i + 2;
      else if ((c1 == U'r' && c2 == U'e') || (c1 == U'v' && c2 == U'e') || (c1 == U'l' && c2 == U'l')) end = i + 3;
    }
    if (end == i) {
      // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020, then a run of one class.
      std::size_t j = i;
      if (chars[i].cp == U' ' && i + 1 < n && chars[i + 1].cls != Class::space) j = i + 1;
      if (chars[j].cls != Class::space) {
        end = j + 1;
        while (end < n && chars[end].cls == chars[j].cls) ++end;
      } else {
        // `\s+(?!\S)` then `\s+`: a run of whitespace, less its last character when something follows it,
        // so that a following word keeps one space; a lone whitespace character before a word is its own.
        std::size_t k = i;
        while (k < n && chars[k].cls == Class::space) ++k;
        end = (k == n || k - i == 1) ? k : k - 1;
      }
    }
    piece(at(i), at(end));
    i = end;
  }
}

// ---- JSON helpers -------------------------------------------------------------------------------------

// The file's JSON, its nesting bounded (core/io/json_limits.h): every message below may print a value.
Json parse_json(const std::string& file, const std::string& bytes) {
  Json j;
  if (auto problem = detail::parse_json(bytes, j)) {
    fail(file, problem->too_deep ? problem->what : fmt::format("not valid JSON: {}", problem->what));
  }
  return j;
}

// A value for a message: compact JSON, at most 80 characters.
std::string shown_json(const Json& v) { return detail::json_excerpt(v, 80); }
std::string json_quoted(const std::string& s) { return shown_json(Json(s)); }

// A JSON value that must be null or absent, or equal to a value that changes nothing.
bool is_null_or(const Json& obj, const char* key, const std::function<bool(const Json&)>& harmless) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || harmless(*it);
}

}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------------------

struct BpeTokenizer::Impl {
  std::string source;
  // Vocabulary: its strings (byte symbols) and ids; the bytes of every id.
  std::unordered_map<std::string, std::int32_t> vocab;
  std::unordered_map<std::int32_t, std::string> id_bytes;
  std::int64_t size = 0;
  // Symbols: the 256 byte symbols first (symbol b is byte b), then every symbol the merges name.
  std::vector<std::string> symbols;
  std::unordered_map<std::string, std::int32_t> symbol_index;
  std::vector<std::int32_t> symbol_vocab;  // the vocabulary id of each symbol, or -1
  // Merges: (left symbol, right symbol) -> (rank, merged symbol).
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges;
  // Special tokens: raw bytes matched in the text before pre-tokenization, longest first per first byte.
  std::array<std::vector<std::pair<std::string, std::int32_t>>, 256> specials;
  std::size_t max_special = 0;  // the longest special token's bytes
  bool ignore_merges = false;

  static std::uint64_t key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  std::int32_t intern(const std::string& s) {
    auto [it, inserted] = symbol_index.emplace(s, static_cast<std::int32_t>(symbols.size()));
    if (inserted) symbols.push_back(s);
    return it->second;
  }

  void init_symbols() {
    for (unsigned b = 0; b < 256; ++b) intern(byte_table().symbol[b]);
  }

  // `file` and `where(k)` name merge k in messages.
  void add_merges(const std::string& file, const std::vector<std::pair<std::string, std::string>>& pairs,
                  const std::function<std::string(std::size_t)>& where) {
    std::unordered_map<std::uint64_t, std::size_t> first_seen;
    for (std::size_t k = 0; k < pairs.size(); ++k) {
      const std::int32_t a = intern(pairs[k].first);
      const std::int32_t b = intern(pairs[k].second);
      const std::uint64_t pk = key(a, b);
      auto [seen, fresh] = first_seen.emplace(pk, k);
      if (!fresh)
        fail(file, fmt::format("{}: the merge {} {} appears twice (also at {}): its rank is ambiguous", where(k),
                               json_quoted(pairs[k].first), json_quoted(pairs[k].second), where(seen->second)));
      const std::int32_t ab = intern(pairs[k].first + pairs[k].second);
      merges.emplace(pk, std::make_pair(static_cast<std::int32_t>(k), ab));
    }
  }

  void add_token(const std::string& file, const std::string& where, const std::string& token, std::int64_t id,
                 const std::string& bytes) {
    if (id < 0 || id >= INT32_MAX)
      fail(file, fmt::format("{}: id {} of token {} is outside [0, {})", where, id, json_quoted(token), INT32_MAX));
    const auto id32 = static_cast<std::int32_t>(id);
    auto [it, fresh] = id_bytes.emplace(id32, bytes);
    if (!fresh && it->second != bytes)
      fail(file, fmt::format("{}: id {} is given to token {} and to another token (bytes \"{}\" and \"{}\")", where,
                             id, json_quoted(token), shown(bytes), shown(it->second)));
    size = std::max<std::int64_t>(size, id + 1);
  }

  void read_vocab(const std::string& file, const Json& v, const std::string& path) {
    if (!v.is_object())
      fail(file, fmt::format("{} is a JSON {}, not an object of token strings to integer ids", path, v.type_name()));
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string where = fmt::format("{}[{}]", path, json_quoted(it.key()));
      if (!it->is_number_integer())
        fail(file, fmt::format("{} is {}, not an integer id", where, shown_json(*it)));
      const std::int64_t id = it->is_number_unsigned()
                                  ? static_cast<std::int64_t>(std::min<std::uint64_t>(it->get<std::uint64_t>(), INT64_MAX))
                                  : it->get<std::int64_t>();
      add_token(file, where, it.key(), id, symbols_to_bytes(it.key()));
      vocab[it.key()] = static_cast<std::int32_t>(id);
    }
  }

  void add_special(const std::string& content, std::int32_t id) {
    max_special = std::max(max_special, content.size());
    auto& list = specials[static_cast<unsigned char>(content[0])];
    list.emplace_back(content, id);
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }

  void finish() {
    symbol_vocab.assign(symbols.size(), -1);
    for (std::size_t s = 0; s < symbols.size(); ++s) {
      auto it = vocab.find(symbols[s]);
      if (it != vocab.end()) symbol_vocab[s] = it->second;
    }
  }

  // GPT-2's bpe(): repeatedly take the adjacent pair of lowest rank and merge every occurrence of it, left
  // to right, until no pair has a rank. Done with a heap of (rank, position) so a long piece costs
  // O(n log n) rather than GPT-2's O(n^2); each round pops all entries of the lowest rank (one pair) in
  // position order and merges those still present, exactly as GPT-2's left-to-right scan does.
  void bpe(std::string_view piece, std::size_t offset, std::vector<std::int32_t>& out) const {
    const std::size_t n = piece.size();
    if (ignore_merges) {
      auto it = vocab.find(to_symbols(piece));
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    std::vector<std::int32_t> sym(n);
    std::vector<std::int64_t> next(n), prev(n);
    for (std::size_t i = 0; i < n; ++i) {
      sym[i] = static_cast<unsigned char>(piece[i]);
      next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
      prev[i] = static_cast<std::int64_t>(i) - 1;
    }
    std::vector<bool> alive(n, true);
    using Entry = std::pair<std::int32_t, std::int64_t>;  // (rank, position of the pair's left symbol)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    const auto rank_at = [&](std::int64_t p) -> const std::pair<std::int32_t, std::int32_t>* {
      if (p < 0 || next[p] < 0) return nullptr;
      auto it = merges.find(key(sym[p], sym[next[p]]));
      return it == merges.end() ? nullptr : &it->second;
    };
    const auto push = [&](std::int64_t p) {
      if (const auto* r = rank_at(p)) heap.emplace(r->first, p);
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<std::int64_t>(i));
    std::vector<std::int64_t> round, merged;
    while (!heap.empty()) {
      const std::int32_t rank = heap.top().first;
      round.clear();
      while (!heap.empty() && heap.top().first == rank) {
        round.push_back(heap.top().second);
        heap.pop();
      }
      merged.clear();
      for (std::int64_t p : round) {
        const auto* r = alive[p] ? rank_at(p) : nullptr;
        if (r == nullptr || r->first != rank) continue;  // gone, or consumed by a merge of this round
        const std::int64_t q = next[p];
        sym[p] = r->second;
        alive[q] = false;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        merged.push_back(p);
      }
      for (std::int64_t p : merged) {
        if (!alive[p]) continue;
        push(prev[p]);
        push(p);
      }
    }
    for (std::int64_t p = 0; p >= 0; p = next[p]) {
      const std::int32_t id = symbol_vocab[sym[p]];
      if (id < 0) {
        const std::string& s = symbols[sym[p]];
        throw TokenizerError(fmt::format(
            "{}: the vocabulary has no token {} (bytes \"{}\"), which BPE makes of the text's piece \"{}\" at byte "
            "{}\nhint: the vocabulary and the merges do not belong together (every byte symbol, and every piece "
            "the merges can leave, must be in the vocabulary); use the model's own files, or --tokens",
            source, json_quoted(s), shown(symbols_to_bytes(s)), shown(piece), offset));
      }
      out.push_back(id);
    }
  }

  // Repeated pieces (" the", "\n") are looked up, not merged again: GPT-2's encoder caches the same way. Long
  // pieces are not kept, and the cache is emptied when it reaches kMaxCached pieces, so it stays bounded
  // however long the text.
  struct PieceHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceCache = std::unordered_map<std::string, std::vector<std::int32_t>, PieceHash, std::equal_to<>>;
  static constexpr std::size_t kMaxCached = std::size_t{1} << 17;

  // Encodes text (which starts at byte `base` of the whole text) and hands the ids to emit(ids, n) in order.
  // With at_end, all of it; otherwise only as far as nothing after the end of `text` could change: the ids
  // are then exactly those the whole text gives there. Returns how many bytes were encoded.
  //
  // Why a margin of the longest special token + 32 bytes is enough: a special token is recognised only where
  // it starts at least longest + 16 bytes before the end, so all of it is there; a pre-token is emitted only
  // where it ends at least longest + 32 bytes before the end, and the pattern decides where a pre-token ends
  // by looking at most two characters (8 bytes) past it; so neither a special token starting in the held
  // bytes nor a UTF-8 sequence cut by the end (its last 3 bytes) can change what was emitted. What is not
  // emitted is passed again, with more text after it, by the next call.
  template <class Emit>
  std::size_t encode_some(std::string_view text, std::size_t base, bool at_end, PieceCache& cache,
                          Emit&& emit) const {
    const std::size_t n = text.size();
    const std::size_t hold = max_special + 32;
    if (!at_end && n <= hold) return 0;
    const std::size_t special_limit = at_end ? n : n - (max_special + 16);
    const std::size_t emit_limit = at_end ? n : n - hold;
    std::vector<std::int32_t> ids;
    // The pieces of text[from, to): all of them, or only those that end by emit_limit. Returns where the
    // last one emitted ends.
    const auto encode_plain = [&](std::size_t from, std::size_t to, bool all) {
      std::size_t done = from;
      bool stopped = false;
      split_pieces(text.substr(from, to - from), [&](std::size_t b, std::size_t e) {
        if (stopped || (!all && from + e > emit_limit)) {
          stopped = true;
          return;
        }
        const std::string_view piece = text.substr(from + b, e - b);
        done = from + e;
        auto it = cache.find(piece);
        if (it != cache.end()) {
          emit(it->second.data(), it->second.size());
          return;
        }
        ids.clear();
        bpe(piece, base + from + b, ids);
        emit(ids.data(), ids.size());
        if (piece.size() <= 64) {
          if (cache.size() >= kMaxCached) cache.clear();
          cache.emplace(std::string(piece), ids);
        }
      });
      return done;
    };
    std::size_t start = 0;  // of the text not yet encoded
    for (std::size_t i = 0; i < special_limit;) {
      const auto& candidates = specials[static_cast<unsigned char>(text[i])];
      const std::pair<std::string, std::int32_t>* hit = nullptr;
      for (const auto& c : candidates)
        if (text.compare(i, c.first.size(), c.first) == 0) {
          hit = &c;
          break;
        }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      encode_plain(start, i, true);
      emit(&hit->second, 1);
      i += hit->first.size();
      start = i;
    }
    if (at_end) {
      encode_plain(start, n, true);
      return n;
    }
    return encode_plain(start, n, false);
  }

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 16);
    PieceCache cache;
    encode_some(text, 0, true, cache,
                [&](const std::int32_t* ids, std::size_t count) { out.insert(out.end(), ids, ids + count); });
    return out;
  }
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_files(const fs::path& vocab_json, const fs::path& merges_txt) {
  auto impl = std::make_unique<Impl>();
  impl->source = vocab_json.string() + " + " + merges_txt.string();
  impl->init_symbols();
  const std::string vfile = vocab_json.string();
  impl->read_vocab(vfile, parse_json(vfile, read_file(vocab_json)), "the top level");

  const std::string mfile = merges_txt.string();
  const std::string text = read_file(merges_txt);
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<std::size_t> lines;
  // Lines end with \n, \r\n or \r (Python's text mode reads all three so). A first line starting with
  // "#version" is the header; empty lines hold no merge.
  std::size_t line_no = 0;
  for (std::size_t i = 0; i <= text.size();) {
    std::size_t e = i;
    while (e < text.size() && text[e] != '\n' && text[e] != '\r') ++e;
    const std::string_view line(text.data() + i, e - i);
    ++line_no;
    if (e < text.size() && text[e] == '\r' && e + 1 < text.size() && text[e + 1] == '\n') ++e;
    const std::size_t next = e + 1;
    if (!(line_no == 1 && line.substr(0, 8) == "#version") && !line.empty()) {
      if (!valid_utf8(line)) fail(mfile, fmt::format("line {} is not valid UTF-8: \"{}\"", line_no, shown(line)));
      const std::size_t sp = line.find(' ');
      if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string_view::npos)
        fail(mfile, fmt::format("line {} is \"{}\", not two symbols separated by one space (a merge, e.g. \"Ġ t\")",
                                line_no, shown(line)));
      pairs.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
      lines.push_back(line_no);
    }
    i = next;
  }
  impl->add_merges(mfile, pairs, [&](std::size_t k) { return fmt::format("line {}", lines[k]); });
  // GPT-2's one special token, as encoder.py and GPT2Tokenizer treat it.
  auto eot = impl->vocab.find("<|endoftext|>");
  if (eot != impl->vocab.end()) impl->add_special(eot->first, eot->second);
  impl->finish();
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(const fs::path& tokenizer_json) {
  auto impl = std::make_unique<Impl>();
  const std::string file = tokenizer_json.string();
  impl->source = file;
  impl->init_symbols();
  const Json root = parse_json(file, read_file(tokenizer_json));
  if (!root.is_object()) fail(file, fmt::format("the top level is a JSON {}, not an object", root.type_name()));
  auto m = root.find("model");
  if (m == root.end() || !m->is_object()) fail(file, "\"model\" is missing or not an object");
  const Json& model = *m;
  std::string type;
  if (auto t = model.find("type"); t != model.end()) {
    if (!t->is_string()) fail(file, fmt::format("model.type is {}, not a string", shown_json(*t)));
    type = t->get<std::string>();
  } else if (model.contains("merges")) {
    type = "BPE";  // files written before the field existed: only BPE has merges
  }
  if (type != "BPE")
    fail(file, fmt::format("model.type is {}, not \"BPE\": a {} tokenizer is not GPT-2's byte-level BPE",
                           type.empty() ? "missing" : json_quoted(type), type.empty() ? "non-BPE" : shown(type)),
         kUseTokensHint);
  const auto unsupported = [&](const std::string& what) { fail(file, what, kUseTokensHint); };
  if (!is_null_or(model, "dropout", [](const Json& v) { return v.is_number() && v.get<double>() == 0.0; }))
    unsupported(fmt::format("model.dropout is {}: BPE dropout samples merges at random", shown_json(model["dropout"])));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or(model, k, [](const Json& v) { return v.is_string() && v.get<std::string>().empty(); }))
      unsupported(fmt::format("model.{} is {}, which byte-level BPE does not use", k, shown_json(model[k])));
  if (!is_null_or(model, "byte_fallback", [](const Json& v) { return v.is_boolean() && !v.get<bool>(); }))
    unsupported(fmt::format("model.byte_fallback is {}: that is SentencePiece-style BPE",
                            shown_json(model["byte_fallback"])));
  if (auto im = model.find("ignore_merges"); im != model.end() && !im->is_null()) {
    if (!im->is_boolean()) fail(file, fmt::format("model.ignore_merges is {}, not true or false", shown_json(*im)));
    impl->ignore_merges = im->get<bool>();
  }
  if (!is_null_or(root, "normalizer", [](const Json&) { return false; }))
    unsupported(fmt::format("normalizer is {}; GPT-2's tokenizer has none",
                            root["normalizer"].is_object() && root["normalizer"].contains("type")
                                ? shown_json(root["normalizer"]["type"])
                                : shown_json(root["normalizer"])));
  auto pre = root.find("pre_tokenizer");
  if (pre == root.end() || !pre->is_object() || !pre->contains("type") || (*pre)["type"] != "ByteLevel")
    unsupported(fmt::format("pre_tokenizer is {}, not GPT-2's ByteLevel",
                            pre == root.end()                                  ? "missing"
                            : pre->is_object() && pre->contains("type") ? shown_json((*pre)["type"])
                                                                               : shown_json(*pre)));
  if (!is_null_or(*pre, "add_prefix_space", [](const Json& v) { return v.is_boolean() && !v.get<bool>(); }))
    unsupported(fmt::format("pre_tokenizer.add_prefix_space is {}; GPT-2's is false",
                            shown_json((*pre)["add_prefix_space"])));
  if (!is_null_or(*pre, "use_regex", [](const Json& v) { return v.is_boolean() && v.get<bool>(); }))
    unsupported(fmt::format("pre_tokenizer.use_regex is {}: the text is not split by GPT-2's pattern",
                            shown_json((*pre)["use_regex"])));

  auto v = model.find("vocab");
  if (v == model.end()) fail(file, "model.vocab is missing");
  impl->read_vocab(file, *v, "model.vocab");

  auto mg = model.find("merges");
  if (mg == model.end() || !mg->is_array()) fail(file, "model.merges is missing or not an array");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (std::size_t k = 0; k < mg->size(); ++k) {
    const Json& e = (*mg)[k];
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const std::size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos)
        fail(file, fmt::format("model.merges[{}] is {}, not two symbols separated by one space", k, shown_json(e)));
      pairs.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string() &&
               !e[0].get<std::string>().empty() && !e[1].get<std::string>().empty()) {  // ["a", "b"]
      pairs.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      fail(file, fmt::format("model.merges[{}] is {}, neither \"a b\" nor [\"a\", \"b\"]", k, shown_json(e)));
    }
  }
  impl->add_merges(file, pairs, [](std::size_t k) { return fmt::format("model.merges[{}]", k); });

  if (auto at = root.find("added_tokens"); at != root.end() && !at->is_null()) {
    if (!at->is_array()) fail(file, fmt::format("added_tokens is a JSON {}, not an array", at->type_name()));
    for (std::size_t k = 0; k < at->size(); ++k) {
      const Json& e = (*at)[k];
      const std::string where = fmt::format("added_tokens[{}]", k);
      if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || !e.contains("content") ||
          !e["content"].is_string() || e["content"].get<std::string>().empty())
        fail(file, fmt::format("{} is {}, not an object with an integer \"id\" and a non-empty \"content\"", where,
                               shown_json(e)));
      for (const char* flag : {"lstrip", "rstrip", "single_word"})
        if (!is_null_or(e, flag, [](const Json& f) { return f.is_boolean() && !f.get<bool>(); }))
          unsupported(fmt::format("{} ({}) has {}: {}, which this reader does not implement", where,
                                  shown_json(e["content"]), flag, shown_json(e[flag])));
      const std::string content = e["content"].get<std::string>();
      const std::int64_t id = e["id"].is_number_unsigned()
                                  ? static_cast<std::int64_t>(std::min<std::uint64_t>(e["id"].get<std::uint64_t>(), INT64_MAX))
                                  : e["id"].get<std::int64_t>();
      impl->add_token(file, where, content, id, content);
      impl->add_special(content, static_cast<std::int32_t>(id));
    }
  }
  impl->finish();
  return BpeTokenizer(std::move(impl));
}

BpeTokenizer BpeTokenizer::from_folder(const fs::path& folder) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw TokenizerError(fmt::format("'{}' is not a folder\nhint: give the model folder that holds vocab.json and "
                                     "merges.txt, or tokenizer.json",
                                     folder.string()));
  if (fs::exists(folder / "tokenizer.json", ec)) return from_tokenizer_json(folder / "tokenizer.json");
  const bool vocab = fs::exists(folder / "vocab.json", ec), merges = fs::exists(folder / "merges.txt", ec);
  if (vocab && merges) return from_files(folder / "vocab.json", folder / "merges.txt");
  if (fs::exists(folder / "tokenizer.model", ec))
    throw TokenizerError(fmt::format("'{}' holds a SentencePiece tokenizer.model, not GPT-2's byte-level BPE\n{}",
                                     folder.string(), kUseTokensHint));
  throw TokenizerError(fmt::format(
      "'{}' has no tokenizer that --text reads: {}\nhint: --text needs vocab.json + merges.txt, or tokenizer.json; "
      "otherwise tokenize the text yourself and pass the ids with --tokens",
      folder.string(),
      vocab    ? "vocab.json is there but merges.txt is not"
      : merges ? "merges.txt is there but vocab.json is not"
               : "neither tokenizer.json nor vocab.json + merges.txt"));
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view bytes) const { return impl_->encode(bytes); }

void BpeTokenizer::encode_file(const fs::path& path,
                               const std::function<void(const std::int32_t*, std::size_t)>& on_ids,
                               std::size_t chunk_bytes) const {
  const auto refuse = [&](const detail::FileProblem& problem) {
    throw TokenizerError(fmt::format("text file '{}': {}\nhint: --text takes a regular file of text (UTF-8 or any "
                                     "bytes)",
                                     path.string(), problem.describe()));
  };
  detail::InputFile file;
  if (auto problem = detail::open_input_file(path, file)) refuse(*problem);
  const std::size_t chunk = std::max<std::size_t>(chunk_bytes, 1);
  Impl::PieceCache cache;
  std::string buffer;          // the text not yet encoded, from byte `offset` on
  std::uint64_t offset = 0, read = 0;
  for (;;) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, file.size() - read));
    if (want > 0) {
      const std::size_t had = buffer.size();
      buffer.resize(had + want);
      if (auto problem = detail::read_at(file, read, buffer.data() + had, want)) refuse(*problem);
      read += want;
    }
    const bool at_end = read == file.size();
    // (A single piece longer than a chunk, such as a megabyte without a space, makes the buffer grow until it
    // ends: nothing is encoded until then.)
    const std::size_t used = impl_->encode_some(buffer, offset, at_end, cache, on_ids);
    if (at_end) return;
    buffer.erase(0, used);
    offset += used;
  }
}

std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto it = impl_->id_bytes.find(ids[k]);
    if (it == impl_->id_bytes.end())
      throw TokenizerError(fmt::format("{}: id {} (position {}) names no token (the vocabulary has {} ids)\nhint: the "
                                       "ids were made with another tokenizer",
                                       impl_->source, ids[k], k, impl_->size));
    out += it->second;
  }
  return out;
}

std::int64_t BpeTokenizer::vocab_size() const { return impl_->size; }

std::int32_t BpeTokenizer::token_id(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::source() const { return impl_->source; }

std::string BpeTokenizer::byte_symbol(unsigned char b) { return byte_table().symbol[b]; }

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view bytes) {
  std::vector<std::string> out;
  split_pieces(bytes, [&](std::size_t b, std::size_t e) { out.emplace_back(bytes.substr(b, e - b)); });
  return out;
}

}  // namespace ampscope::samples
