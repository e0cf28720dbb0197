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

namespace ampscope::samples {

static_assert(std::endian::native == std::endian::little,
              "the token readers take little-endian values as they are; a big-endian host needs byte swaps");

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& path, const std::string& what, const std::string& hint) {
  throw TokenFileError(fmt::format("token file '{}': {}\nhint: {}", path.string(), what, hint));
}

constexpr const char* kRewriteNpyHint = "the file is damaged or was not written by numpy; write it again with "
                                        "np.save(path, np.array(ids, dtype=np.int32))";

// The whole file, memory-mapped read-only (nothing mapped for an empty file).
class MappedFile {
 public:
  explicit MappedFile(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, fmt::format("cannot open it: {}", std::strerror(errno)), "check the path and permissions");
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path, "not a regular file", "--tokens takes a .npy, .bin or .txt file of token ids");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        fail(path, fmt::format("cannot memory-map its {} bytes: {}", size_, std::strerror(e)),
             "check that the file is readable and fits the address space");
      }
      data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), size_);
  }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

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

std::vector<std::int32_t> read_npy(const MappedFile& f, const fs::path& path) {
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
  std::vector<std::int32_t> out(static_cast<std::size_t>(count));
  const unsigned char* data = p + data_at;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const unsigned char* e = data + i * dtype->size;
    std::int64_t id = 0;
    switch (dtype->size) {
      case 1: id = *e; break;
      case 2: id = read_le<std::uint16_t>(e); break;
      case 4: id = read_le<std::int32_t>(e); break;
      default: id = read_le<std::int64_t>(e); break;
    }
    check_id(id, path, [&] {
      return fmt::format("element {} (byte offset {}, dtype '{}')", i, data_at + i * dtype->size, dtype->descr);
    });
    out[i] = static_cast<std::int32_t>(id);
  }
  return out;
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

std::vector<std::int32_t> read_bin(const MappedFile& f, const fs::path& path) {
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
  std::vector<std::int32_t> out(f.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = read_le<std::uint16_t>(f.data() + 2 * i);
  return out;
}

// ---------------------------------------------------------------------------------------------- .txt

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

// Two passes over the mapped text: the first checks every byte and counts the ids, the second (with `out`
// sized to the count) stores them, so the result is allocated once.
std::size_t scan_txt(const MappedFile& f, const fs::path& path, std::vector<std::int32_t>* out) {
  const unsigned char* p = f.data();
  const std::size_t n = f.size();
  const char* kHint = "a .txt token file holds non-negative decimal integers separated by spaces, tabs or newlines "
                      "(write it with ' '.join(map(str, ids)))";
  std::size_t count = 0, line = 1, line_start = 0;
  std::size_t i = 0;
  auto where = [&](std::size_t at) { return fmt::format("line {}, column {}", line, at - line_start + 1); };
  while (i < n) {
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
    if (out != nullptr) (*out)[count] = static_cast<std::int32_t>(v);
    ++count;
  }
  return count;
}

std::vector<std::int32_t> read_txt(const MappedFile& f, const fs::path& path) {
  const std::size_t count = scan_txt(f, path, nullptr);
  if (count == 0) {
    fail(path, fmt::format("its {} bytes are all whitespace: it holds no tokens", f.size()),
         "write the ids with ' '.join(map(str, ids))");
  }
  std::vector<std::int32_t> out(count);
  scan_txt(f, path, &out);
  return out;
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

std::vector<std::int32_t> load_tokens(const std::filesystem::path& path) {
  const std::string ext = lower(path.extension().string());
  if (ext != ".npy" && ext != ".bin" && ext != ".txt") {
    fail(path,
         fmt::format("the extension '{}' is not one of the token file formats: .npy (numpy int32, int64, uint16 or "
                     "uint8), .bin (raw little-endian uint16, as nanoGPT writes), .txt (whitespace-separated integers)",
                     path.extension().string()),
         "the format is chosen by the extension: rename the file, or write one with np.save(path, np.array(ids, "
         "dtype=np.int32))");
  }
  const MappedFile f(path);
  if (f.size() == 0) {
    fail(path, "the file is empty (0 bytes): it holds no tokens", "tokenize a non-empty text and write its ids");
  }
  if (ext == ".npy") return read_npy(f, path);
  if (ext == ".bin") return read_bin(f, path);
  return read_txt(f, path);
}

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

TokenBatch causal_lm_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step) {
  check_batch_args("causal_lm_batch", batch, step);
  const std::int64_t windows = window_count(static_cast<std::int64_t>(tokens.size()), context, false);
  TokenBatch out{Tensor::empty({batch, context}, {DType::i64}), Tensor::empty({batch, context}, {DType::i64})};
  std::int64_t* x = out.x.data_as<std::int64_t>();
  std::int64_t* y = out.y.data_as<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int32_t* w = tokens.data() + window_of(step, batch, b, windows) * context;
    for (std::int64_t t = 0; t < context; ++t) {
      x[b * context + t] = w[t];
      y[b * context + t] = w[t + 1];
    }
  }
  return out;
}

Seq2SeqBatch seq2seq_batch(const std::vector<std::int32_t>& tokens, std::int64_t context, std::int64_t batch,
                           std::int64_t step, std::int64_t decoder_start_token_id) {
  check_batch_args("seq2seq_batch", batch, step);
  if (decoder_start_token_id < 0) {
    throw Error(fmt::format("seq2seq_batch: decoder_start_token_id {} is negative\nhint: take it from the model's "
                            "config.json (T5: 0, the pad id)",
                            decoder_start_token_id));
  }
  const std::int64_t windows = window_count(static_cast<std::int64_t>(tokens.size()), context, true);
  const std::int64_t half = context / 2;
  Seq2SeqBatch out{Tensor::empty({batch, half}, {DType::i64}), Tensor::empty({batch, half}, {DType::i64}),
                   Tensor::empty({batch, half}, {DType::i64})};
  std::int64_t* enc = out.encoder_input.data_as<std::int64_t>();
  std::int64_t* dec = out.decoder_input.data_as<std::int64_t>();
  std::int64_t* lab = out.labels.data_as<std::int64_t>();
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int32_t* w = tokens.data() + window_of(step, batch, b, windows) * context;
    for (std::int64_t t = 0; t < half; ++t) {
      enc[b * half + t] = w[t];
      lab[b * half + t] = w[half + t];
      dec[b * half + t] = t == 0 ? decoder_start_token_id : w[half + t - 1];
    }
  }
  return out;
}

}  // namespace ampscope::samples
