// core/io/safetensors.cpp: the safetensors reader (mmap + checks) and writer. See core/io/safetensors.h.
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/io/input_file.h"
#include "core/io/output_file.h"
#include "core/io/json_limits.h"

namespace ampscope::safetensors {

static_assert(std::endian::native == std::endian::little,
              "the safetensors reader copies little-endian bytes as they are; a big-endian host needs byte swaps");

namespace {

constexpr const char* kSupported = "supported: F32, F16, BF16, F64, I64";

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, const std::string& hint) {
  throw FormatError(fmt::format("safetensors file '{}': {}\nhint: {}", path.string(), what, hint));
}

const char* kBadFileHint = "the file is damaged or not a safetensors file; download or write it again";

}  // namespace

std::string stored_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
    case DType::boolean: break;
  }
  throw DTypeError(fmt::format("safetensors: dtype '{}' cannot be stored ({})\nhint: convert the tensor first",
                               ampscope::dtype_name(dtype), kSupported));
}

std::optional<DType> from_stored_name(std::string_view name) {
  if (name == "F32") return DType::f32;
  if (name == "F16") return DType::f16;
  if (name == "BF16") return DType::bf16;
  if (name == "F64") return DType::f64;
  if (name == "I64") return DType::i64;
  return std::nullopt;
}

struct File::Mapping {
  const unsigned char* data = nullptr;
  std::uint64_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data != nullptr && size > 0) munmap(const_cast<unsigned char*>(data), size);
  }
};

namespace {

// The header as the parser hands it out: one compact record per top-level key, in document order, holding
// what the checks need and no JSON value (a header of 10^6 tensors is 10^6 records of 64 bytes, their names
// in one pool). What only a message needs (an unsupported dtype's text, an unknown field, a bad shape
// entry, the metadata) is kept aside, for the few entries that have it.
struct RawEntry {
  std::uint64_t name_at = 0;  // in HeaderReader::names_
  std::uint32_t name_size = 0;
  std::uint32_t rare = UINT32_MAX;  // index in HeaderReader::rare_, or none
  std::uint64_t shape_at = 0;       // in HeaderReader::dims_: the shape entries up to the first bad one
  std::uint32_t shape_size = 0;
  std::uint32_t offsets_count = 0;  // the values "data_offsets" holds
  std::uint64_t offsets[2] = {0, 0};
  std::int8_t dtype = -1;  // the DType when "dtype" names a supported one
  bool is_object = false, metadata = false;
  bool has_dtype = false, has_shape = false, has_offsets = false;
  bool dtype_is_string = false, shape_is_array = false, offsets_ok = true;
};

struct RareFields {
  std::string dtype;                   // a dtype string that names no supported dtype
  std::optional<std::string> unknown;  // the first unknown field, in name order
  std::optional<std::string> bad_dim;  // the first shape entry that is not a non-negative integer, as JSON
  std::map<std::string, std::optional<std::string>> meta;  // "__metadata__": nullopt where not a string
};

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64};

std::int8_t dtype_code(std::string_view name) {
  const auto d = from_stored_name(name);
  if (!d) return -1;
  for (std::size_t i = 0; i < std::size(kDTypes); ++i)
    if (kDTypes[i] == *d) return static_cast<std::int8_t>(i);
  return -1;
}

// nlohmann's SAX interface over a header. The parser keeps its own nesting on the heap, and every step here
// is constant time: the parser callback used before made nlohmann rescan the top-level object after each
// entry (40,000 entries took 13 s, 10^6 hours).
class HeaderReader {
 public:
  using json = nlohmann::json;

  bool null() { return scalar(nullptr, std::nullopt); }
  bool boolean(bool v) { return scalar(&v, std::nullopt); }
  bool number_integer(json::number_integer_t v) { return scalar(json(v), std::nullopt); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(nullptr, v); }
  bool number_float(json::number_float_t v, const std::string&) { return scalar(json(v), std::nullopt); }
  bool string(std::string& v) {
    if (!capture_ && depth_ == 2 && slot_ == Slot::dtype) {
      RawEntry& e = entry();
      e.dtype_is_string = true;
      e.dtype = dtype_code(v);
      if (e.dtype < 0) rare().dtype = std::move(v);
      return true;
    }
    if (!capture_ && depth_ == 2 && slot_ == Slot::meta_value) {
      rare().meta[meta_key_] = std::move(v);
      return true;
    }
    return scalar(json(std::move(v)), std::nullopt);
  }
  bool binary(json::binary_t&) { return scalar(nullptr, std::nullopt); }  // not produced by the JSON parser

  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    if (capture_) {
      capture_key(k);
    } else if (depth_ == 1) {  // a tensor name, or __metadata__
      RawEntry e;
      e.name_at = names_.size();
      e.name_size = static_cast<std::uint32_t>(k.size());
      e.metadata = k == "__metadata__";
      names_ += k;
      entries_.push_back(e);
    } else if (depth_ == 2) {
      RawEntry& e = entry();
      if (e.metadata) {
        auto& meta = rare().meta;
        if (meta.count(k) != 0) duplicate_field(k);
        meta[k] = std::nullopt;  // until a string value arrives
        meta_key_ = k;
        slot_ = Slot::meta_value;
      } else if (k == "dtype") {
        if (e.has_dtype) duplicate_field(k);
        e.has_dtype = true;
        slot_ = Slot::dtype;
      } else if (k == "shape") {
        if (e.has_shape) duplicate_field(k);
        e.has_shape = true;
        slot_ = Slot::shape;
      } else if (k == "data_offsets") {
        if (e.has_offsets) duplicate_field(k);
        e.has_offsets = true;
        slot_ = Slot::offsets;
      } else {
        if (std::find(unknown_fields_.begin(), unknown_fields_.end(), k) != unknown_fields_.end()) duplicate_field(k);
        unknown_fields_.push_back(k);
        auto& unknown = rare().unknown;
        if (!unknown || k < *unknown) unknown = k;
        slot_ = Slot::other;
      }
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    error_ = e.what();
    if (error_.size() > 300) error_ = error_.substr(0, 297) + "...";
    return false;
  }

  std::string_view name(const RawEntry& e) const { return std::string_view(names_).substr(e.name_at, e.name_size); }

  std::vector<RawEntry> entries_;
  std::string names_;
  std::vector<std::uint64_t> dims_;
  std::vector<RareFields> rare_;
  std::string error_;  // the parser's message, when it stopped on a syntax error
  bool too_deep_ = false;
  bool root_is_object_ = false;
  // The first field repeated inside an entry, in document order, and that entry.
  std::optional<std::string> duplicate_field_;
  std::size_t duplicate_field_entry_ = 0;

 private:
  enum class Slot { none, dtype, shape, offsets, meta_value, other };

  RawEntry& entry() { return entries_.back(); }
  RareFields& rare() {
    RawEntry& e = entry();
    if (e.rare == UINT32_MAX) {
      e.rare = static_cast<std::uint32_t>(rare_.size());
      rare_.emplace_back();
    }
    return rare_[e.rare];
  }

  void duplicate_field(const std::string& k) {
    if (duplicate_field_) return;
    duplicate_field_ = k;
    duplicate_field_entry_ = entries_.size() - 1;
  }

  // A scalar where the handler is; `shown` makes its JSON text for a message (only built when needed),
  // `unsigned_value` is set for a non-negative integer.
  template <class Shown>
  bool scalar(Shown&& shown, std::optional<std::uint64_t> unsigned_value) {
    const auto text = [&] {
      if constexpr (std::is_same_v<std::decay_t<Shown>, std::nullptr_t>) {
        return unsigned_value ? json(*unsigned_value).dump() : json(nullptr).dump();
      } else if constexpr (std::is_same_v<std::decay_t<Shown>, bool*>) {
        return json(*shown).dump();
      } else {
        return shown.dump(-1, ' ', false, json::error_handler_t::replace);
      }
    };
    if (capture_) {
      capture_separator();
      capture_text(text());
    } else if (depth_ == 3 && slot_ == Slot::shape) {
      RawEntry& e = entry();
      if (e.rare == UINT32_MAX || !rare_[e.rare].bad_dim) {
        if (unsigned_value) {
          dims_.push_back(*unsigned_value);
          ++e.shape_size;
        } else {
          rare().bad_dim = text();
        }
      }
    } else if (depth_ == 3 && slot_ == Slot::offsets) {
      RawEntry& e = entry();
      if (unsigned_value && e.offsets_count < 2) e.offsets[e.offsets_count] = *unsigned_value;
      else e.offsets_ok = false;
      ++e.offsets_count;
    }
    return true;
  }

  bool open(bool array) {
    if (depth_ + 1 > detail::kMaxJsonDepth) {
      too_deep_ = true;
      return false;
    }
    if (capture_) {
      capture_open(array);
    } else if (depth_ == 0) {
      root_is_object_ = !array;
    } else if (depth_ == 1) {
      entry().is_object = !array;
      slot_ = Slot::none;
      unknown_fields_.clear();
    } else if (depth_ == 2) {
      RawEntry& e = entry();
      if (slot_ == Slot::shape) {
        e.shape_is_array = array;
        e.shape_at = dims_.size();
      } else if (slot_ == Slot::offsets) {
        e.offsets_ok = e.offsets_ok && array;
      }
      // A dtype or a metadata value that is an array or object stays "not a string".
    } else if (depth_ == 3 && slot_ == Slot::shape && (entry().rare == UINT32_MAX || !rare_[entry().rare].bad_dim)) {
      capture_ = true;  // a shape entry that is an array or object: its excerpt goes in the message
      capture_depth_ = depth_ + 1;
      captured_.clear();
      capture_open(array);
    } else if (depth_ == 3 && slot_ == Slot::offsets) {
      entry().offsets_ok = false;
      ++entry().offsets_count;
    }
    ++depth_;
    return true;
  }

  bool close() {
    --depth_;
    if (capture_) {
      capture_close();
      if (depth_ + 1 == capture_depth_) {
        capture_ = false;
        rare().bad_dim = captured_.size() > kExcerpt ? captured_.substr(0, kExcerpt - 3) + "..." : captured_;
      }
    }
    return true;
  }

  // The excerpt of a shape entry that is an array or object, written as compact JSON as it streams by (keys
  // in the file's order), cut once it is long enough for a message.
  static constexpr std::size_t kExcerpt = 60;
  void capture_text(const std::string& s) {
    if (captured_.size() <= kExcerpt) captured_ += s;
  }
  // Before a value or a key in the innermost captured container: a comma unless it is the first (a value
  // right after its key has had its separator).
  void capture_separator() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (captured_closers_.empty()) return;
    if (!captured_first_.back()) capture_text(",");
    captured_first_.back() = false;
  }
  void capture_open(bool array) {
    capture_separator();
    capture_text(array ? "[" : "{");
    captured_closers_.push_back(array ? ']' : '}');
    captured_first_.push_back(true);
  }
  void capture_close() {
    capture_text(std::string(1, captured_closers_.back()));
    captured_closers_.pop_back();
    captured_first_.pop_back();
  }
  void capture_key(const std::string& k) {
    capture_separator();
    capture_text(json(k).dump(-1, ' ', false, json::error_handler_t::replace) + ":");
    after_key_ = true;
  }

  std::size_t depth_ = 0;
  Slot slot_ = Slot::none;
  std::string meta_key_;
  std::vector<std::string> unknown_fields_;  // of the current entry, for duplicates
  bool capture_ = false;
  std::size_t capture_depth_ = 0;  // the depth_ inside the captured value
  std::string captured_;
  std::vector<char> captured_closers_;
  std::vector<bool> captured_first_;
  bool after_key_ = false;
};

// The names of the entries in name order (std::string's order, as nlohmann's object kept them before):
// sorted by their first 8 bytes, big-endian, then by the whole name only where those tie, so that the sort
// runs over a compact array instead of chasing each name.
std::vector<std::uint32_t> name_order(const HeaderReader& r) {
  struct Key {
    std::uint64_t prefix;
    std::uint32_t index;
  };
  std::vector<Key> keys(r.entries_.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::string_view n = r.name(r.entries_[i]);
    std::uint64_t prefix = 0;
    for (std::size_t k = 0; k < 8; ++k) prefix = (prefix << 8) | (k < n.size() ? static_cast<unsigned char>(n[k]) : 0u);
    keys[i] = {prefix, static_cast<std::uint32_t>(i)};
  }
  std::sort(keys.begin(), keys.end(), [&](const Key& a, const Key& b) {
    if (a.prefix != b.prefix) return a.prefix < b.prefix;
    const int c = r.name(r.entries_[a.index]).compare(r.name(r.entries_[b.index]));
    return c != 0 ? c < 0 : a.index < b.index;
  });
  std::vector<std::uint32_t> order(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) order[i] = keys[i].index;
  return order;
}

}  // namespace

File File::open(const std::filesystem::path& path) {
  File f;
  f.path_ = path;
  detail::InputFile input;
  if (auto problem = detail::open_input_file(path, input)) {
    if (problem->kind == detail::FileProblem::Kind::not_regular)
      fail(path, fmt::format("not a regular file: it is {}", problem->what), "give the path of a .safetensors file");
    fail(path, fmt::format("cannot open: {}", problem->what), "check the path and permissions");
  }
  auto map = std::make_shared<Mapping>();
  map->size = input.size();
  if (map->size > 0) {
    void* p = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, input.fd(), 0);
    if (p == MAP_FAILED) {
      int e = errno;
      fail(path, fmt::format("cannot memory-map {} bytes: {}", map->size, std::strerror(e)),
           "check that the file is readable and fits the address space");
    }
    map->data = static_cast<const unsigned char*>(p);
  }
  input.close();
  const std::uint64_t size = map->size;
  if (size < 8) fail(path, fmt::format("file is {} bytes, shorter than the 8-byte header length", size), kBadFileHint);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | map->data[i];
  if (n < 2) fail(path, fmt::format("header length {} is below 2 (the smallest JSON object, {{}})", n), kBadFileHint);
  if (n > kMaxHeaderBytes)
    fail(path, fmt::format("header length {} exceeds the {} byte limit", n, kMaxHeaderBytes), kBadFileHint);
  if (n > size - 8)
    fail(path, fmt::format("header length {} runs past the end of the file ({} bytes after the length)", n, size - 8),
         "the file is truncated; download or write it again");
  const char* hdr = reinterpret_cast<const char*>(map->data + 8);
  if (hdr[0] != '{') fail(path, "header does not start with '{' (it must be a JSON object)", kBadFileHint);

  HeaderReader reader;
  // Room for the most entries a header of n bytes can hold (each takes at least ~40 bytes of JSON), so the
  // records are never copied as they grow; pages not used are never touched.
  reader.entries_.reserve(n / 40 + 1);
  reader.names_.reserve(n);
  const bool parsed = nlohmann::json::sax_parse(hdr, hdr + n, &reader);
  if (reader.too_deep_) {
    fail(path, fmt::format("header nests arrays and objects deeper than {} levels (byte offset {} of the header)",
                           detail::kMaxJsonDepth,
                           detail::json_limits_detail::too_deep_offset(std::string_view(hdr, n), detail::kMaxJsonDepth)),
         kBadFileHint);
  }
  if (!parsed) fail(path, fmt::format("header is not valid UTF-8 JSON: {}", reader.error_), kBadFileHint);
  const std::vector<RawEntry>& raw = reader.entries_;

  // Name order: the order the checks run in and tensors() lists.
  const std::vector<std::uint32_t> by_name = name_order(reader);
  // The first duplicate key in document order: a tensor name repeated at entry k (its second occurrence),
  // or a field repeated inside entry j; the name comes first when k <= j (it is read before k's fields).
  std::optional<std::size_t> repeated_name;
  for (std::size_t i = 1; i < by_name.size(); ++i) {
    if (reader.name(raw[by_name[i]]) == reader.name(raw[by_name[i - 1]]) &&
        (!repeated_name || by_name[i] < *repeated_name))
      repeated_name = by_name[i];
  }
  if (repeated_name && (!reader.duplicate_field_ || *repeated_name <= reader.duplicate_field_entry_)) {
    fail(path, fmt::format("header has a duplicate key: tensor name '{}'", reader.name(raw[*repeated_name])),
         kBadFileHint);
  }
  if (reader.duplicate_field_) {
    fail(path, fmt::format("header has a duplicate key: field '{}' of entry '{}'", *reader.duplicate_field_,
                           reader.name(raw[reader.duplicate_field_entry_])),
         kBadFileHint);
  }
  if (!reader.root_is_object_) fail(path, "header is not a JSON object", kBadFileHint);

  const std::uint64_t buffer = size - 8 - n;
  static const RareFields kNoRareFields;
  f.tensors_.reserve(raw.size());
  for (std::uint32_t index : by_name) {
    const RawEntry& e = raw[index];
    const RareFields& rare = e.rare == UINT32_MAX ? kNoRareFields : reader.rare_[e.rare];
    const std::string_view name = reader.name(e);
    if (e.metadata) {
      if (!e.is_object) fail(path, "\"__metadata__\" is not an object of strings", kBadFileHint);
      for (const auto& [key, value] : rare.meta) {
        if (!value) fail(path, fmt::format("\"__metadata__\" entry '{}' is not a string", key), kBadFileHint);
        f.metadata_[key] = *value;
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail(path, fmt::format("tensor '{}': {}", name, what), kBadFileHint); };
    if (!e.is_object) bad("entry is not an object with \"dtype\", \"shape\" and \"data_offsets\"");
    if (!e.has_dtype) bad("entry lacks the \"dtype\" field");
    if (!e.has_shape) bad("entry lacks the \"shape\" field");
    if (!e.has_offsets) bad("entry lacks the \"data_offsets\" field");
    if (rare.unknown) bad(fmt::format("entry has an unknown field \"{}\"", *rare.unknown));
    if (!e.dtype_is_string) bad("\"dtype\" is not a string");
    if (e.dtype < 0) bad(fmt::format("dtype '{}' is not supported ({})", rare.dtype, kSupported));
    TensorInfo info;
    info.name = std::string(name);
    info.dtype = kDTypes[e.dtype];
    info.dtype_name = stored_name(info.dtype);
    if (!e.shape_is_array) bad("\"shape\" is not an array");
    std::uint64_t count = 1;
    bool overflow = false;
    info.shape.reserve(e.shape_size);
    for (std::uint32_t k = 0; k < e.shape_size; ++k) {
      const std::uint64_t v = reader.dims_[e.shape_at + k];
      if (v > static_cast<std::uint64_t>(INT64_MAX)) bad(fmt::format("shape entry {} is too large", v));
      info.shape.push_back(static_cast<std::int64_t>(v));
      if (v != 0 && count > UINT64_MAX / v) overflow = true;
      else count *= v;
    }
    if (rare.bad_dim) bad(fmt::format("shape entry {} is not a non-negative integer", *rare.bad_dim));
    if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) { count = 0; overflow = false; }
    const std::uint64_t esize = dtype_size(info.dtype);
    if (overflow || count > UINT64_MAX / esize)
      bad(fmt::format("shape {} has more bytes than 64 bits can count", shape_str(info.shape)));
    if (!e.offsets_ok || e.offsets_count != 2)
      bad("\"data_offsets\" is not an array of two non-negative integers [begin, end]");
    info.begin = e.offsets[0];
    info.end = e.offsets[1];
    if (info.end < info.begin) bad(fmt::format("data_offsets [{}, {}] end before they begin", info.begin, info.end));
    if (info.end - info.begin != count * esize)
      bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", shape_str(info.shape),
                      info.dtype_name, count * esize, info.begin, info.end, info.end - info.begin));
    if (info.end > buffer)
      bad(fmt::format("data_offsets [{}, {}] run past the end of the {}-byte buffer", info.begin, info.end, buffer));
    f.tensors_.push_back(std::move(info));
  }
  // The spec: the buffer is entirely indexed, without holes or overlaps.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(f.tensors_.size());
  for (const auto& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < pos)
      fail(path, fmt::format("tensor '{}' (bytes [{}, {}]) overlaps tensor '{}' (bytes [{}, {}])", t->name, t->begin,
                             t->end, prev->name, prev->begin, prev->end), kBadFileHint);
    if (t->begin > pos)
      fail(path, fmt::format("bytes [{}, {}] of the buffer belong to no tensor (before tensor '{}')", pos, t->begin,
                             t->name), kBadFileHint);
    pos = t->end;
    prev = t;
  }
  if (pos != buffer)
    fail(path, fmt::format("bytes [{}, {}] at the end of the buffer belong to no tensor", pos, buffer),
         "the file has trailing bytes; write it again");
  // tensors_ is in name order already (the checks ran in it).
  f.buffer_start_ = 8 + n;
  f.map_ = std::move(map);
  return f;
}

bool File::contains(std::string_view name) const {
  // tensors_ is in name order: a binary search, so that a sharded folder's index of n names costs n log n.
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name;
}

const TensorInfo& File::info(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name)
    throw FormatError(fmt::format("safetensors file '{}' has no tensor '{}' ({} tensors)\nhint: list the names "
                                  "with File::tensors()", path_.string(), name, tensors_.size()));
  return *it;
}

Tensor File::load(std::string_view name, std::optional<DType> as) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(t.shape, TensorOptions{t.dtype, Device::cpu()});
  if (t.end > t.begin) std::memcpy(out.data(), map_->data + buffer_start_ + t.begin, t.end - t.begin);
  return as ? out.to(*as) : out;
}

void save(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
          const std::map<std::string, std::string>& metadata) {
  auto bad = [&](const std::string& what, const std::string& hint) {
    throw Error(fmt::format("safetensors save '{}': {}\nhint: {}", path.string(), what, hint));
  };
  std::map<std::string, Tensor> sorted;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) bad("a tensor has an empty name", "give every tensor a name");
    if (name == "__metadata__") bad("'__metadata__' is reserved for the metadata", "rename the tensor");
    if (!t.defined()) bad(fmt::format("tensor '{}' is undefined", name), "pass defined tensors only");
    if (t.dtype() == DType::boolean)
      bad(fmt::format("tensor '{}' is bool, which this writer does not store ({})", name, kSupported),
          "convert it, e.g. t.to(DType::i64)");
    if (!sorted.emplace(name, t).second) bad(fmt::format("tensor name '{}' appears twice", name), "rename one");
  }
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  std::uint64_t pos = 0;
  for (const auto& [name, t] : sorted) {
    Tensor c = t.to(Device::cpu()).contiguous();
    const std::uint64_t bytes = static_cast<std::uint64_t>(c.numel()) * dtype_size(c.dtype());
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = stored_name(c.dtype());
    entry["shape"] = c.shape();
    entry["data_offsets"] = std::vector<std::uint64_t>{pos, pos + bytes};
    header[name] = std::move(entry);
    pos += bytes;
    host.push_back(c);
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  // Through an OutputFile (core/io/output_file.h): a fresh temporary name created with O_EXCL | O_NOFOLLOW and
  // renamed over `path`; a link, FIFO or folder at `path` is refused before anything is written (a model
  // folder may hold names someone else planted: a link there must not send the weights to what it points at).
  {
    OutputFile file(path, "the safetensors file");
    unsigned char len[8];
    const std::uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    file.write(std::string_view(reinterpret_cast<const char*>(len), 8));
    file.write(json);
    for (const Tensor& c : host) {
      if (c.numel() == 0) continue;
      file.write(std::string_view(static_cast<const char*>(c.data()),
                                  static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype())));
    }
    file.commit(/*durable=*/true);
  }
}

namespace {

// NaN and Inf in a contiguous CPU tensor of a floating dtype, by its bits (no widened copy).
struct NonFiniteCount {
  std::int64_t nans = 0, infs = 0, first = -1;
};

template <class Bits, class Classify>
NonFiniteCount count_bits(const void* data, std::int64_t n, Classify classify) {
  NonFiniteCount c;
  const auto* p = static_cast<const Bits*>(data);
  for (std::int64_t i = 0; i < n; ++i) {
    const int kind = classify(p[i]);  // 0 finite, 1 NaN, 2 Inf
    if (kind == 0) continue;
    (kind == 1 ? c.nans : c.infs) += 1;
    if (c.first < 0) c.first = i;
  }
  return c;
}

NonFiniteCount count_nonfinite(const Tensor& t) {
  const Tensor c = t.contiguous();
  const std::int64_t n = c.numel();
  switch (c.dtype()) {
    case DType::f64:
      return count_bits<double>(c.data(), n, [](double v) { return std::isnan(v) ? 1 : std::isinf(v) ? 2 : 0; });
    case DType::f32:
      return count_bits<float>(c.data(), n, [](float v) { return std::isnan(v) ? 1 : std::isinf(v) ? 2 : 0; });
    case DType::f16:  // exponent all ones: Inf with a zero mantissa, else NaN
      return count_bits<std::uint16_t>(c.data(), n, [](std::uint16_t b) {
        return (b & 0x7C00) != 0x7C00 ? 0 : (b & 0x03FF) != 0 ? 1 : 2;
      });
    case DType::bf16:
      return count_bits<std::uint16_t>(c.data(), n, [](std::uint16_t b) {
        return (b & 0x7F80) != 0x7F80 ? 0 : (b & 0x007F) != 0 ? 1 : 2;
      });
    default:
      return {};
  }
}

// Loads one tensor; with `nonfinite`, records it there when it holds NaN or Inf once converted.
Tensor load_checked(const File& file, const std::string& name, std::optional<DType> as,
                    std::vector<NonFiniteTensor>* nonfinite) {
  Tensor t = file.load(name, as);
  if (nonfinite == nullptr) return t;
  const NonFiniteCount after = count_nonfinite(t);
  if (after.nans + after.infs == 0) return t;
  NonFiniteTensor record;
  record.name = name;
  record.file = file.path().string();
  record.stored_dtype = file.info(name).dtype_name;
  record.nans = after.nans;
  record.infs = after.infs;
  record.count = t.numel();
  record.first = after.first;
  if (file.info(name).dtype != t.dtype()) {
    // Which of them the file holds as finite values that the conversion took past the new dtype's range.
    const NonFiniteCount stored = count_nonfinite(file.load(name));
    record.overflowed = (after.nans + after.infs) - (stored.nans + stored.infs);
  }
  nonfinite->push_back(std::move(record));
  return t;
}

constexpr std::uint64_t kMaxIndexBytes = std::uint64_t{64} << 20;

[[noreturn]] void index_fail(const std::filesystem::path& index, const std::string& what, const std::string& hint) {
  throw FormatError(fmt::format("safetensors index '{}': {}\nhint: {}", index.string(), what, hint));
}

}  // namespace

std::string NonFiniteTensor::describe() const {
  std::string text = fmt::format("tensor '{}' ('{}') holds {} NaN and {} Inf of its {} values (the first at flat index {})",
                                 name, file, nans, infs, count, first);
  if (overflowed > 0) {
    text += fmt::format("; {} of them are finite {} values in the file, beyond the range of the dtype they were "
                        "loaded as", overflowed, stored_dtype);
  }
  return text;
}

std::map<std::string, Tensor> load_folder(const std::filesystem::path& folder, std::optional<DType> as,
                                          std::vector<NonFiniteTensor>* nonfinite) {
  std::map<std::string, Tensor> out;
  const auto single = folder / "model.safetensors";
  const auto index = folder / "model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    std::string text;
    if (auto problem = detail::read_input_file(index, kMaxIndexBytes, text)) {
      index_fail(index, problem->describe(),
                 problem->kind == detail::FileProblem::Kind::too_large
                     ? "an index lists tensor names and shard files and is far smaller; download it again"
                     : "model.safetensors.index.json must be a regular, readable file; download it again");
    }
    nlohmann::json j;
    if (auto problem = detail::parse_json(text, j)) {
      throw FormatError(fmt::format("safetensors index '{}' is not valid JSON: {}\nhint: download it again",
                                    index.string(), problem->what));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw FormatError(fmt::format("safetensors index '{}' has no \"weight_map\" object\nhint: download it again",
                                    index.string()));
    std::map<std::string, File> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string name = detail::text_excerpt(it.key(), 200);
      if (!it.value().is_string())
        throw FormatError(fmt::format("safetensors index '{}': weight_map entry '{}' is not a file name",
                                      index.string(), name));
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || shard == "." || shard.empty())
        throw FormatError(fmt::format("safetensors index '{}': tensor '{}' names shard '{}', which is not a file "
                                      "name in the folder", index.string(), name, detail::text_excerpt(shard, 200)));
      auto s = shards.find(shard);
      if (s == shards.end()) {
        if (!std::filesystem::exists(folder / shard))
          throw FormatError(fmt::format("safetensors index '{}': tensor '{}' is in shard '{}', which is missing\n"
                                        "hint: download every shard the index names", index.string(), name,
                                        detail::text_excerpt(shard, 200)));
        s = shards.emplace(shard, File::open(folder / shard)).first;
      }
      if (!s->second.contains(it.key()))
        throw FormatError(fmt::format("safetensors index '{}': tensor '{}' is not in shard '{}'\nhint: the index and "
                                      "the shards do not match; download them again", index.string(), name,
                                      detail::text_excerpt(shard, 200)));
      out.emplace(it.key(), load_checked(s->second, it.key(), as, nonfinite));
    }
    return out;
  }
  if (!std::filesystem::exists(single))
    throw FormatError(fmt::format("folder '{}' has neither model.safetensors nor model.safetensors.index.json\n"
                                  "hint: give a Hugging Face model folder", folder.string()));
  File f = File::open(single);
  for (const auto& t : f.tensors()) out.emplace(t.name, load_checked(f, t.name, as, nonfinite));
  return out;
}

}  // namespace ampscope::safetensors
