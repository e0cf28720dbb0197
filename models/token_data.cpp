// models/token_data.cpp: the token-file readers (.npy, .bin, .txt) and the window batching. See
// models/token_data.h.
#include "models/token_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/io/input_file.h"

namespace ampscope::samples {

static_assert(std::endian::native == std::endian::little,
              "the token readers take little-endian values as they are; a big-endian host needs byte swaps");

// What a TokenSequence holds: its ids in memory (2 bytes each while every id fits, 4 once one does not), or
// where they are in its open file.
struct TokenSequence::Storage {
  std::int64_t count = 0;
  std::int32_t max_id = -1;
  std::vector<std::uint16_t> narrow;
  std::vector<std::int32_t> wide;
  bool is_wide = false;
  // On disk: `count` little-endian elements of `element` bytes (1, 2: unsigned; 4, 8: signed) from byte `at`.
  bool on_disk = false;
  detail::InputFile file;
  std::filesystem::path path;
  std::uint64_t at = 0;
  std::size_t element = 0;
};

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& what, const std::string& hint) {
  throw TokenFileError(fmt::format("token file '{}': {}\nhint: {}", path.string(), what, hint));
}

constexpr const char* kRewriteNpyHint = "the file is damaged or was not written by numpy; write it again with "
                                        "np.save(path, np.array(ids, dtype=np.int32))";

// Opens a token file: a regular file only, refused before open() (a FIFO would block it, a device never end).
detail::InputFile open_token_file(const fs::path& path) {
  detail::InputFile f;
  if (auto problem = detail::open_input_file(path, f)) {
    fail(path, problem->describe(),
         problem->kind == detail::FileProblem::Kind::not_regular
             ? "--tokens takes a .npy, .bin or .txt file of token ids"
             : "check the path and permissions");
  }
  return f;
}

// The whole of an open file, memory-mapped read-only (nothing mapped for an empty file), for the headers and
// the text of a .txt file. release_before() hands the pages read so far back to the kernel, so that reading
// a large file through the mapping does not keep it in the process's memory.
class MappedFile {
 public:
  MappedFile(const detail::InputFile& input, const fs::path& path) : size_(static_cast<std::size_t>(input.size())) {
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, input.fd(), 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        fail(path, fmt::format("cannot memory-map its {} bytes: {}", size_, std::strerror(e)),
             "check that the file is readable and fits the address space");
      }
      data_ = static_cast<const unsigned char*>(p);
    }
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), size_);
  }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  void release_before(std::size_t offset) const {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t end = offset / page * page;
    if (data_ != nullptr && end > 0) madvise(const_cast<unsigned char*>(data_), end, MADV_DONTNEED);
  }

 private:
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

bool starts_with(const MappedFile& f, std::string_view prefix) {
  return f.size() >= prefix.size() && std::memcmp(f.data(), prefix.data(), prefix.size()) == 0;
}

// A byte for a message: 'a', or \x93 for one that is not printable ASCII.
std::string show_byte(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte \\x{:02x}", c);
}

// "3 bytes: 93 4e 55": the first bytes of a file, for a message.
std::string first_bytes(const MappedFile& f) {
  std::string out;
  for (std::size_t i = 0; i < f.size() && i < 8; ++i) out += fmt::format("{}{:02x}", i ? " " : "", f.data()[i]);
  return out;
}

template <class T>
T read_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // the host is little-endian (static_assert above)
  return v;
}

// Refuses an id no token file may hold (negative, or past int32); `where` says which element it is.
template <class Where>
void check_id(std::int64_t id, const fs::path& path, Where where) {
  if (id < 0) {
    fail(path, fmt::format("{} holds {}: token ids are never negative", where(), id),
         "write the token ids only (no padding -1 or label -100 masks)");
  }
  if (id > kMaxTokenId) {
    fail(path, fmt::format("{} holds {}, above 2^31 - 1 = {}, the largest token id this reader takes", where(), id,
                           kMaxTokenId),
         "no tokenizer has a vocabulary that large; check the dtype the ids were written with");
  }
}

// ---------------------------------------------------------------------------------------------- .npy

struct NpyHeader {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::uint64_t>> shape;
};

// The header is a Python dict literal, e.g. {'descr': '<i4', 'fortran_order': False, 'shape': (3,), }
// padded with spaces and ended by '\n'. This parses the subset numpy writes (and numpy's reader accepts for
// these three keys): strings in single or double quotes, True/False, tuples of non-negative integers
// (an 'L' suffix as Python 2 wrote them), whitespace anywhere between, trailing commas.
class NpyHeaderParser {
 public:
  NpyHeaderParser(const unsigned char* text, std::size_t size, std::size_t file_offset, const fs::path& path)
      : p_(text), n_(size), base_(file_offset), path_(path) {}

  NpyHeader parse() {
    skip_space();
    expect('{', "the header does not start with '{' (numpy writes a dict: {'descr': ..., 'fortran_order': ..., "
                "'shape': ...})");
    NpyHeader h;
    for (;;) {
      skip_space();
      if (peek() == '}') {
        ++i_;
        break;
      }
      const std::size_t key_at = i_;
      const std::string key = parse_string("a key in quotes or '}'");
      skip_space();
      expect(':', "expected ':' after the key");
      skip_space();
      if (key == "descr") {
        if (h.descr) bad_at(key_at, "the key 'descr' appears twice");
        if (peek() == '[') {
          bad("'descr' is a list: a structured dtype (record array) holds no plain token ids",
              "save a plain integer array: np.save(path, np.array(ids, dtype=np.int32))");
        }
        h.descr = parse_string("the dtype string of 'descr'");
      } else if (key == "fortran_order") {
        if (h.fortran_order) bad_at(key_at, "the key 'fortran_order' appears twice");
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) bad_at(key_at, "the key 'shape' appears twice");
        h.shape = parse_tuple();
      } else {
        bad_at(key_at, fmt::format("unknown key '{}' (a .npy header holds 'descr', 'fortran_order' and 'shape')",
                                   printable(key)));
      }
      skip_space();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != '}') {
        bad("expected ',' or '}' after a value");
      }
    }
    skip_space();
    if (i_ != n_) bad(fmt::format("{} after the header's closing '}}'", show_byte(p_[i_])));
    if (!h.descr || !h.fortran_order || !h.shape) {
      std::string missing;
      if (!h.descr) missing += "'descr'";
      if (!h.fortran_order) missing += std::string(missing.empty() ? "" : ", ") + "'fortran_order'";
      if (!h.shape) missing += std::string(missing.empty() ? "" : ", ") + "'shape'";
      fail(path_, fmt::format("the .npy header (bytes {} to {}) lacks the key {}", base_, base_ + n_, missing),
           kRewriteNpyHint);
    }
    return h;
  }

 private:
  int peek() const { return i_ < n_ ? p_[i_] : -1; }
  void skip_space() {
    while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\t' || p_[i_] == '\n' || p_[i_] == '\r')) ++i_;
  }
  [[noreturn]] void bad_at(std::size_t at, const std::string& what, const std::string& hint = kRewriteNpyHint) const {
    const std::string found = at < n_ ? fmt::format("found {}", show_byte(p_[at])) : "found the end of the header";
    fail(path_, fmt::format("the .npy header at byte offset {}: {} ({}; the header is bytes {} to {})", base_ + at,
                            what, found, base_, base_ + n_),
         hint);
  }
  [[noreturn]] void bad(const std::string& what, const std::string& hint = kRewriteNpyHint) const {
    bad_at(i_, what, hint);
  }
  void expect(char c, const char* what) {
    if (peek() != c) bad(what);
    ++i_;
  }
  static std::string printable(const std::string& s) {
    std::string out;
    for (unsigned char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c)) : "?";
    return s.size() > 40 ? out + "..." : out;
  }
  std::string parse_string(const char* what) {
    const int q = peek();
    if (q != '\'' && q != '"') bad(fmt::format("expected {}", what));
    const std::size_t start = ++i_;
    while (i_ < n_ && p_[i_] != q) {
      if (p_[i_] == '\\') bad("a backslash escape, which no numpy header key or dtype holds");
      ++i_;
    }
    if (i_ >= n_) bad_at(start - 1, "a string that is never closed");
    std::string s(reinterpret_cast<const char*>(p_ + start), i_ - start);
    ++i_;
    return s;
  }
  bool parse_bool() {
    auto word = [&](std::string_view w) {
      return n_ - i_ >= w.size() && std::memcmp(p_ + i_, w.data(), w.size()) == 0;
    };
    if (word("True")) { i_ += 4; return true; }
    if (word("False")) { i_ += 5; return false; }
    bad("expected True or False for 'fortran_order'");
  }
  std::vector<std::uint64_t> parse_tuple() {
    expect('(', "expected a tuple such as (1000,) for 'shape'");
    std::vector<std::uint64_t> dims;
    for (;;) {
      skip_space();
      if (peek() == ')') {
        ++i_;
        return dims;
      }
      if (peek() < '0' || peek() > '9') bad("expected a non-negative integer or ')' in 'shape'");
      const std::size_t start = i_;
      std::uint64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const std::uint64_t d = static_cast<std::uint64_t>(peek() - '0');
        if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) bad_at(start, "a dimension of 'shape' past 64 bits");
        v = v * 10 + d;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2's long literal
      dims.push_back(v);
      skip_space();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != ')') {
        bad("expected ',' or ')' in 'shape'");
      }
    }
  }

  const unsigned char* p_;
  std::size_t n_;
  std::size_t i_ = 0;
  std::size_t base_;
  const fs::path& path_;
};

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

struct NpyDType {
  const char* descr;
  std::size_t size;
  const char* name;
};
constexpr NpyDType kNpyDTypes[] = {{"<i4", 4, "int32"}, {"<i8", 8, "int64"}, {"<u2", 2, "uint16"}, {"|u1", 1, "uint8"}};
constexpr const char* kNpySupported = "'<i4' (int32), '<i8' (int64), '<u2' (uint16), '|u1' (uint8)";

// Where a file's ids are: `count` little-endian elements of `size` bytes from byte `at`, each checked by
// scan_ids (negative or past int32 only possible for the signed 4- and 8-byte ones).
struct IdLayout {
  std::uint64_t at = 0, count = 0;
  std::size_t size = 0;
  const char* descr = "";  // for messages: '<i4', ...
};

IdLayout read_npy(const MappedFile& f, const fs::path& path) {
  const std::size_t size = f.size();
  const unsigned char* p = f.data();
  if (!starts_with(f, "\x93NUMPY")) {
    const bool prefix = size < 6 && std::memcmp(p, "\x93NUMPY", size) == 0;
    fail(path,
         prefix ? fmt::format("truncated: its {} bytes end inside the 6-byte magic \\x93NUMPY", size)
                : fmt::format("not a .npy file: it does not start with numpy's magic \\x93NUMPY (its first bytes are "
                              "{})",
                              first_bytes(f)),
         "write a .npy with np.save(path, np.array(ids, dtype=np.int32)); ids as text belong in a .txt file, raw "
         "uint16 in a .bin file");
  }
  if (size < 8) fail(path, fmt::format("truncated: its {} bytes end inside the format version", size), kRewriteNpyHint);
  const int major = p[6], minor = p[7];
  if (major < 1 || major > 3 || minor != 0) {
    fail(path, fmt::format("format version {}.{} at byte offset 6 is not one this reader knows (1.0, 2.0, 3.0)", major, minor),
         "write it with np.save, which writes version 1.0 (2.0 or 3.0 only for very large headers)");
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t header_at = 8 + length_bytes;
  if (size < header_at) {
    fail(path, fmt::format("truncated: its {} bytes end inside the {}-byte header length of version {}.0", size,
                           length_bytes, major),
         kRewriteNpyHint);
  }
  const std::size_t header_length = major == 1 ? read_le<std::uint16_t>(p + 8) : read_le<std::uint32_t>(p + 8);
  if (header_length > size - header_at) {
    fail(path, fmt::format("the header length {} (at byte offset 8) runs past the end of the file: only {} bytes follow "
                           "the length field",
                           header_length, size - header_at),
         "the file is truncated or its header length is wrong; write it again with np.save");
  }
  const NpyHeader h = NpyHeaderParser(p + header_at, header_length, header_at, path).parse();
  const NpyDType* dtype = nullptr;
  for (const NpyDType& d : kNpyDTypes)
    if (*h.descr == d.descr) dtype = &d;
  if (dtype == nullptr) {
    const std::string& d = *h.descr;
    std::string why;
    if (d.size() >= 2 && d[0] == '>') why = ": it is big-endian and token files are little-endian";
    else if (d.size() >= 2 && (d[1] == 'f' || d[1] == 'c')) why = ": it is floating point and token ids are integers";
    fail(path, fmt::format("dtype '{}' is not supported{}; supported: {}", d.substr(0, 40), why, kNpySupported),
         "convert the ids first: np.save(path, a.astype('<i4'))");
  }
  if (*h.fortran_order) {
    fail(path, fmt::format("the array of shape {} is stored in Fortran (column-major) order", shape_text(*h.shape)),
         "save it in C order: np.save(path, np.ascontiguousarray(a))");
  }
  if (h.shape->empty()) {
    fail(path, "a 0-d array (shape (), a single number) is not a sequence of tokens",
         "save a 1-d array of ids: np.save(path, np.atleast_1d(a))");
  }
  std::uint64_t count = 1;
  bool overflow = false;
  for (std::uint64_t d : *h.shape) {
    if (d != 0 && count > std::numeric_limits<std::uint64_t>::max() / d) overflow = true;
    else count *= d;
  }
  if (std::find(h.shape->begin(), h.shape->end(), 0) != h.shape->end()) {
    fail(path, fmt::format("the array of shape {} holds no tokens", shape_text(*h.shape)),
         "tokenize a non-empty text");
  }
  const std::size_t data_at = header_at + header_length;
  const std::uint64_t have = size - data_at;
  if (overflow || count > std::numeric_limits<std::uint64_t>::max() / dtype->size) {
    fail(path, fmt::format("shape {} has more elements than 64 bits can count; the file holds {} data bytes",
                           shape_text(*h.shape), have),
         kRewriteNpyHint);
  }
  const std::uint64_t need = count * dtype->size;
  if (have != need) {
    fail(path, fmt::format("the data is {} than its shape: shape {} of '{}' needs {} bytes, the file holds {} after "
                           "its {}-byte header",
                           have < need ? "shorter" : "longer", shape_text(*h.shape), dtype->descr, need, have, data_at),
         have < need ? "the file is truncated; write it again with np.save"
                     : "the header does not describe the data; write it again with np.save");
  }
  return {data_at, count, dtype->size, dtype->descr};
}

// ---------------------------------------------------------------------------------------------- .bin

// llm.c's token files (dev/data/data_common.py) are a 256-int32 header (magic 20240520, version 1 for
// uint16 or 2 for uint32 ids, the token count) and then the ids: read as raw uint16 they would give
// 512 wrong ids and, for version 2, twice as many wrong ones, so such a file is recognised and refused.
std::optional<int> llmc_version(const MappedFile& f) {
  if (f.size() < 1024) return std::nullopt;
  const auto magic = read_le<std::int32_t>(f.data());
  const auto version = read_le<std::int32_t>(f.data() + 4);
  const auto count = static_cast<std::uint64_t>(read_le<std::uint32_t>(f.data() + 8));
  if (magic != 20240520 || (version != 1 && version != 2)) return std::nullopt;
  if (1024 + count * (version == 1 ? 2 : 4) != f.size()) return std::nullopt;
  return version;
}

IdLayout read_bin(const MappedFile& f, const fs::path& path) {
  if (starts_with(f, "\x93NUMPY")) {
    fail(path, "a .npy file (it starts with numpy's magic \\x93NUMPY) named .bin; .bin is read as raw uint16",
         "rename it to end in .npy");
  }
  if (const auto version = llmc_version(f)) {
    fail(path, fmt::format("an llm.c token file (magic 20240520, version {}) with a 1024-byte header; .bin is read as "
                           "raw uint16 ids, as nanoGPT writes them",
                           *version),
         *version == 1 ? "drop the header: np.fromfile(path, dtype=np.uint16, offset=1024).tofile('tokens.bin')"
                       : "convert it: np.save('tokens.npy', np.fromfile(path, dtype=np.uint32, offset=1024).astype(np.int32))");
  }
  if (f.size() % 2 != 0) {
    fail(path, fmt::format("{} bytes, an odd number: a .bin token file is little-endian uint16 ids, 2 bytes each",
                           f.size()),
         "the file is truncated or not a nanoGPT token file; write it with np.array(ids, dtype=np.uint16).tofile(path)");
  }
  return {0, f.size() / 2, 2, "<u2"};
}

// ---------------------------------------------------------------------------------------------- .txt

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// One pass over the mapped text: every byte checked, the ids appended to `out` in batches, and the pages
// read handed back every 64 MiB, so that a large file is never all in memory at once.
void scan_txt(const MappedFile& f, const fs::path& path, TokenSequence& out) {
  const unsigned char* p = f.data();
  const std::size_t n = f.size();
  constexpr std::size_t kRelease = std::size_t{64} << 20;
  std::size_t released = 0;
  std::vector<std::int32_t> pending;
  pending.reserve(65536);
  const char* kHint = "a .txt token file holds non-negative decimal integers separated by spaces, tabs or newlines "
                      "(write it with ' '.join(map(str, ids)))";
  std::size_t count = 0, line = 1, line_start = 0;
  std::size_t i = 0;
  auto where = [&](std::size_t at) { return fmt::format("line {}, column {}", line, at - line_start + 1); };
  while (i < n) {
    if (i - released >= kRelease) {
      f.release_before(i);
      released = i;
    }
    const unsigned char c = p[i];
    if (is_space(c)) {
      if (c == '\n') {
        ++line;
        line_start = i + 1;
      }
      ++i;
      continue;
    }
    const std::size_t start = i;
    if (c == '-' && i + 1 < n && is_digit(p[i + 1])) {
      std::size_t e = i + 1;
      while (e < n && is_digit(p[e])) ++e;
      const std::string text(reinterpret_cast<const char*>(p + start), std::min<std::size_t>(e - start, 24));
      fail(path, fmt::format("{}: the negative id {}{}; token ids are never negative", where(start), text,
                             e - start > 24 ? "..." : ""),
           "write the token ids only (no padding -1 or label -100 masks)");
    }
    if (!is_digit(c)) {
      std::string what = fmt::format("{}: {} where an id or whitespace was expected", where(start), show_byte(c));
      std::string hint = kHint;
      if (c == ',' || c == '[' || c == ']') hint += "; a Python or JSON list needs its brackets and commas removed";
      if (c == 0x93 && starts_with(f, "\x93NUMPY")) hint = "the file is a .npy file: rename it to end in .npy";
      fail(path, what, hint);
    }
    std::uint64_t v = 0;
    bool too_large = false;
    while (i < n && is_digit(p[i])) {
      v = v * 10 + static_cast<std::uint64_t>(p[i] - '0');
      if (v > static_cast<std::uint64_t>(kMaxTokenId)) {
        too_large = true;
        v = static_cast<std::uint64_t>(kMaxTokenId) + 1;  // keeps the running value from overflowing
      }
      ++i;
    }
    if (too_large) {
      const std::string text(reinterpret_cast<const char*>(p + start), std::min<std::size_t>(i - start, 24));
      fail(path, fmt::format("{}: the id {}{} is above 2^31 - 1 = {}, the largest token id this reader takes",
                             where(start), text, i - start > 24 ? "..." : "", kMaxTokenId),
           "no tokenizer has a vocabulary that large; check what wrote the file");
    }
    if (i < n && !is_space(p[i])) {
      fail(path, fmt::format("{}: {} right after the digits {}; ids are decimal integers separated by whitespace",
                             where(i), show_byte(p[i]), std::string(reinterpret_cast<const char*>(p + start),
                                                                     std::min<std::size_t>(i - start, 24))),
           std::string(kHint) + (p[i] == ',' ? "; a Python or JSON list needs its brackets and commas removed" : ""));
    }
    pending.push_back(static_cast<std::int32_t>(v));
    if (pending.size() == pending.capacity()) {
      out.append(pending.data(), pending.size());
      pending.clear();
    }
    ++count;
  }
  out.append(pending.data(), pending.size());
  f.release_before(n);
  if (count == 0) {
    fail(path, fmt::format("its {} bytes are all whitespace: it holds no tokens", f.size()),
         "write the ids with ' '.join(map(str, ids))");
  }
}

// Element i of a file's raw bytes as an id (any value its dtype holds; checked by the caller).
std::int64_t element_id(const unsigned char* e, std::size_t size) {
  switch (size) {
    case 1: return *e;
    case 2: return read_le<std::uint16_t>(e);
    case 4: return read_le<std::int32_t>(e);
    default: return read_le<std::int64_t>(e);
  }
}

// Reads elements [begin, begin + count) of an on-disk sequence's file into `bytes`.
void read_elements(const TokenSequence::Storage& s, std::uint64_t begin, std::uint64_t count,
                   std::vector<unsigned char>& bytes) {
  bytes.resize(static_cast<std::size_t>(count) * s.element);
  if (auto problem = detail::read_at(s.file, s.at + begin * s.element, bytes.data(), bytes.size())) {
    fail(s.path, problem->describe(), "the file was changed or removed while it was in use; give the run a file "
                                      "nothing writes to");
  }
}

// Every id of a file, read in chunks of 1 MiB: each checked (negative, past int32) as load_tokens always
// did, naming the element and its byte offset, and the largest kept.
void scan_ids(TokenSequence::Storage& s, const char* descr) {
  const std::uint64_t chunk = (std::uint64_t{1} << 20) / s.element;
  std::vector<unsigned char> bytes;
  for (std::uint64_t begin = 0; begin < static_cast<std::uint64_t>(s.count); begin += chunk) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk, static_cast<std::uint64_t>(s.count) - begin);
    read_elements(s, begin, n, bytes);
    for (std::uint64_t k = 0; k < n; ++k) {
      const std::int64_t id = element_id(bytes.data() + k * s.element, s.element);
      if (s.element >= 4) {
        const std::uint64_t i = begin + k;
        check_id(id, s.path, [&] {
          return fmt::format("element {} (byte offset {}, dtype '{}')", i, s.at + i * s.element, descr);
        });
      }
      s.max_id = std::max(s.max_id, static_cast<std::int32_t>(id));
    }
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The window of the b-th sequence of step `step`: (step * batch + b) mod windows, without overflow.
std::int64_t window_of(std::int64_t step, std::int64_t batch, std::int64_t b, std::int64_t windows) {
  const auto k = (static_cast<unsigned __int128>(step) * static_cast<unsigned __int128>(batch) +
                  static_cast<unsigned __int128>(b)) %
                 static_cast<unsigned __int128>(windows);
  return static_cast<std::int64_t>(k);
}

void check_batch_args(const char* fn, std::int64_t batch, std::int64_t step) {
  if (batch < 1) throw Error(fmt::format("{}: batch {} is below 1\nhint: --batch takes a positive count", fn, batch));
  if (step < 0) throw Error(fmt::format("{}: step {} is negative", fn, step));
}

}  // namespace

TokenSequence::TokenSequence() : s_(std::make_unique<Storage>()) {}
TokenSequence::TokenSequence(TokenSequence&&) noexcept = default;
TokenSequence& TokenSequence::operator=(TokenSequence&&) noexcept = default;
TokenSequence::~TokenSequence() = default;

TokenSequence TokenSequence::open(const std::filesystem::path& path) {
  const std::string ext = lower(path.extension().string());
  if (ext != ".npy" && ext != ".bin" && ext != ".txt") {
    fail(path,
         fmt::format("the extension '{}' is not one of the token file formats: .npy (numpy int32, int64, uint16 or "
                     "uint8), .bin (raw little-endian uint16, as nanoGPT writes), .txt (whitespace-separated integers)",
                     path.extension().string()),
         "the format is chosen by the extension: rename the file, or write one with np.save(path, np.array(ids, "
         "dtype=np.int32))");
  }
  detail::InputFile input = open_token_file(path);
  if (input.size() == 0) {
    fail(path, "the file is empty (0 bytes): it holds no tokens", "tokenize a non-empty text and write its ids");
  }
  TokenSequence seq;
  if (ext == ".txt") {
    const MappedFile f(input, path);
    scan_txt(f, path, seq);
    return seq;
  }
  IdLayout layout;
  {
    const MappedFile f(input, path);  // the headers only; the ids are read with pread, in chunks
    layout = ext == ".npy" ? read_npy(f, path) : read_bin(f, path);
  }
  Storage& s = *seq.s_;
  s.on_disk = true;
  s.file = std::move(input);
  s.path = path;
  s.at = layout.at;
  s.element = layout.size;
  s.count = static_cast<std::int64_t>(layout.count);
  scan_ids(s, layout.descr);
  return seq;
}

TokenSequence TokenSequence::from_ids(const std::vector<std::int32_t>& ids) {
  TokenSequence seq;
  seq.append(ids.data(), ids.size());
  return seq;
}

void TokenSequence::append(const std::int32_t* ids, std::size_t count) {
  Storage& s = *s_;
  if (s.on_disk) throw Error("TokenSequence::append: the sequence is read from its file; only in-memory ones grow");
  for (std::size_t i = 0; i < count; ++i) {
    const std::int32_t id = ids[i];
    if (id < 0) throw Error(fmt::format("TokenSequence::append: id {} is negative", id));
    if (!s.is_wide && id > 65535) {
      s.wide.assign(s.narrow.begin(), s.narrow.end());
      std::vector<std::uint16_t>().swap(s.narrow);
      s.is_wide = true;
    }
    if (s.is_wide) s.wide.push_back(id);
    else s.narrow.push_back(static_cast<std::uint16_t>(id));
    s.max_id = std::max(s.max_id, id);
  }
  s.count += static_cast<std::int64_t>(count);
}

std::int64_t TokenSequence::size() const { return s_->count; }
std::int32_t TokenSequence::max_id() const { return s_->max_id; }
bool TokenSequence::on_disk() const { return s_->on_disk; }

void TokenSequence::read(std::int64_t begin, std::int64_t count, std::int64_t* out) const {
  const Storage& s = *s_;
  if (begin < 0 || count < 0 || begin > s.count || count > s.count - begin) {
    throw Error(fmt::format("TokenSequence::read: ids [{}, {}) are outside the {} ids", begin, begin + count, s.count));
  }
  if (s.on_disk) {
    std::vector<unsigned char> bytes;
    read_elements(s, static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(count), bytes);
    for (std::int64_t k = 0; k < count; ++k) out[k] = element_id(bytes.data() + k * s.element, s.element);
  } else if (s.is_wide) {
    std::copy(s.wide.begin() + begin, s.wide.begin() + begin + count, out);
  } else {
    std::copy(s.narrow.begin() + begin, s.narrow.begin() + begin + count, out);
  }
}

std::vector<std::int32_t> TokenSequence::to_vector() const {
  std::vector<std::int32_t> out(static_cast<std::size_t>(size()));
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<std::int64_t> ids;
  for (std::int64_t begin = 0; begin < size(); begin += kChunk) {
    const std::int64_t n = std::min(kChunk, size() - begin);
    ids.resize(static_cast<std::size_t>(n));
    read(begin, n, ids.data());
    std::copy(ids.begin(), ids.end(), out.begin() + begin);
  }
  return out;
}

std::vector<std::int32_t> load_tokens(const std::filesystem::path& path) { return TokenSequence::open(path).to_vector(); }

void check_vocabulary(const std::vector<std::int32_t>& tokens, std::int64_t vocab, const std::filesystem::path& path) {
  if (vocab < 1) throw Error(fmt::format("check_vocabulary: vocabulary size {} is below 1", vocab));
  std::optional<std::size_t> first;
  std::size_t outside = 0;
  std::int32_t largest = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      if (!first) first = i;
      ++outside;
      largest = std::max(largest, tokens[i]);
    }
  }
  if (first) {
    fail(path, fmt::format("element {} holds id {}, outside the model's vocabulary of {} ids (0 to {}); {} of the {} "
                           "ids are outside it, the largest is {}",
                           *first, tokens[*first], vocab, vocab - 1, outside, tokens.size(), largest),
         "the ids were made by another tokenizer than the model's; tokenize the text with the tokenizer in the model's "
         "folder");
  }
}

void check_vocabulary(const TokenSequence& tokens, std::int64_t vocab, const std::filesystem::path& path) {
  if (vocab < 1) throw Error(fmt::format("check_vocabulary: vocabulary size {} is below 1", vocab));
  if (tokens.max_id() < vocab) return;
  // Some id is outside: read them all again, in chunks, to say which is first, how many and the largest.
  std::optional<std::int64_t> first;
  std::int64_t first_id = 0, outside = 0, largest = 0;
  constexpr std::int64_t kChunk = 1 << 20;
  std::vector<std::int64_t> ids;
  for (std::int64_t begin = 0; begin < tokens.size(); begin += kChunk) {
    const std::int64_t n = std::min(kChunk, tokens.size() - begin);
    ids.resize(static_cast<std::size_t>(n));
    tokens.read(begin, n, ids.data());
    for (std::int64_t k = 0; k < n; ++k) {
      if (ids[k] < vocab) continue;
      if (!first) {
        first = begin + k;
        first_id = ids[k];
      }
      ++outside;
      largest = std::max(largest, ids[k]);
    }
  }
  fail(path, fmt::format("element {} holds id {}, outside the model's vocabulary of {} ids (0 to {}); {} of the {} "
                         "ids are outside it, the largest is {}",
                         first.value_or(0), first_id, vocab, vocab - 1, outside, tokens.size(), largest),
       "the ids were made by another tokenizer than the model's; tokenize the text with the tokenizer in the model's "
       "folder");
}

std::int64_t window_count(std::int64_t tokens, std::int64_t context, bool seq2seq) {
  if (tokens < 0) throw Error(fmt::format("window_count: token count {} is negative", tokens));
  if (context < 1) throw Error(fmt::format("context {} is below 1\nhint: --context takes a positive length", context));
  if (seq2seq && (context < 2 || context % 2 != 0)) {
    throw Error(fmt::format("context {} is not an even number of at least 2: a T5 window is T/2 encoder tokens and "
                            "T/2 labels\nhint: give an even --context",
                            context));
  }
  const std::int64_t windows = seq2seq ? tokens / context : (tokens == 0 ? 0 : (tokens - 1) / context);
  if (windows == 0) {
    throw TokenFileError(fmt::format(
        "{} tokens make no whole window at context {}: one window needs {} tokens ({})\nhint: give a longer token "
        "file or a smaller --context",
        tokens, context, seq2seq ? context : context + 1,
        seq2seq ? fmt::format("{} encoder tokens and {} labels", context / 2, context / 2)
                : fmt::format("{} inputs, and the token after them as the last target", context)));
  }
  return windows;
}

namespace {

// The batching, over any source of ids: read(begin, count, out) puts ids [begin, begin + count) into out.
template <class Read>
TokenBatch causal_lm_batch_of(std::int64_t size, const Read& read, std::int64_t context, std::int64_t batch,
                              std::int64_t step) {
  check_batch_args("causal_lm_batch", batch, step);
  const std::int64_t windows = window_count(size, context, false);
  TokenBatch out{Tensor::empty({batch, context}, {DType::i64}), Tensor::empty({batch, context}, {DType::i64})};
  std::int64_t* x = out.x.data_as<std::int64_t>();
  std::int64_t* y = out.y.data_as<std::int64_t>();
  std::vector<std::int64_t> w(static_cast<std::size_t>(context + 1));
  for (std::int64_t b = 0; b < batch; ++b) {
    read(window_of(step, batch, b, windows) * context, context + 1, w.data());
    for (std::int64_t t = 0; t < context; ++t) {
      x[b * context + t] = w[t];
      y[b * context + t] = w[t + 1];
    }
  }
  return out;
}

template <class Read>
Seq2SeqBatch seq2seq_batch_of(std::int64_t size, const Read& read, std::int64_t context, std::int64_t batch,
                              std::int64_t step, std::int64_t decoder_start_token_id) {
  check_batch_args("seq2seq_batch", batch, step);
  if (decoder_start_token_id < 0) {
    throw Error(fmt::format("seq2seq_batch: decoder_start_token_id {} is negative\nhint: take it from the model's "
                            "config.json (T5: 0, the pad id)",
                            decoder_start_token_id));
  }
  const std::int64_t windows = window_count(size, context, true);
  const std::int64_t half = context / 2;
  Seq2SeqBatch out{Tensor::empty({batch, half}, {DType::i64}), Tensor::empty({batch, half}, {DType::i64}),
                   Tensor::empty({batch, half}, {DType::i64})};
  std::int64_t* enc = out.encoder_input.data_as<std::int64_t>();
  std::int64_t* dec = out.decoder_input.data_as<std::int64_t>();
  std::int64_t* lab = out.labels.data_as<std::int64_t>();
  std::vector<std::int64_t> w(static_cast<std::size_t>(context));
  for (std::int64_t b = 0; b < batch; ++b) {
    read(window_of(step, batch, b, windows) * context, context, w.data());
    for (std::int64_t t = 0; t < half; ++t) {
      enc[b * half + t] = w[t];
      lab[b * half + t] = w[half + t];
      dec[b * half + t] = t == 0 ? decoder_start_token_id : w[half + t - 1];
    }
  }
  return out;
}

auto vector_reader(const std::vector<std::int32_t>& tokens) {
  return [&tokens](std::int64_t begin, std::int64_t count, std::int64_t* out) {
    std::copy(tokens.begin() + begin, tokens.begin() + begin + count, out);
  };
}

auto sequence_reader(const TokenSequence& tokens) {
  return [&tokens](std::int64_t begin, std::int64_t count, std::int64_t* out) { tokens.read(begin, count, out); };
}

}  // namespace

TokenBatch causal_lm_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step) {
  return causal_lm_batch_of(static_cast<std::int64_t>(tokens.size()), vector_reader(tokens), context, batch, step);
}

TokenBatch causal_lm_batch(const TokenSequence& tokens, std::int64_t context, std::int64_t batch, std::int64_t step) {
  return causal_lm_batch_of(tokens.size(), sequence_reader(tokens), context, batch, step);
}

Seq2SeqBatch seq2seq_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step, std::int64_t decoder_start_token_id) {
  return seq2seq_batch_of(static_cast<std::int64_t>(tokens.size()), vector_reader(tokens), context, batch, step,
                          decoder_start_token_id);
}

Seq2SeqBatch seq2seq_batch(const TokenSequence& tokens, std::int64_t context, std::int64_t batch, std::int64_t step,
                           std::int64_t decoder_start_token_id) {
  return seq2seq_batch_of(tokens.size(), sequence_reader(tokens), context, batch, step, decoder_start_token_id);
}

}  // namespace ampscope::samples
