// core/io/safetensors.cpp: the safetensors reader (mmap + checks) and writer. See core/io/safetensors.h.
#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

File File::open(const std::filesystem::path& path) {
  File f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, fmt::format("cannot open: {}", std::strerror(errno)), "check the path and permissions");
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file", "give the path of a .safetensors file");
  }
  auto map = std::make_shared<Mapping>();
  map->size = static_cast<std::uint64_t>(st.st_size);
  if (map->size > 0) {
    void* p = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(path, fmt::format("cannot memory-map {} bytes: {}", map->size, std::strerror(e)),
           "check that the file is readable and fits the address space");
    }
    map->data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
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

  // Duplicate keys: nlohmann keeps the last silently, so the parser callback counts the top-level keys and
  // each entry's fields.
  std::set<std::string> top_keys;
  std::set<std::string> field_keys;  // of the entry named last
  std::string entry;
  std::string duplicate;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        std::string_view(hdr, n),
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (event == nlohmann::json::parse_event_t::key && duplicate.empty()) {
            const std::string key = parsed.get<std::string>();
            if (depth == 1) {
              if (!top_keys.insert(key).second) duplicate = fmt::format("tensor name '{}'", key);
              entry = key;
              field_keys.clear();
            } else if (depth == 2 && !field_keys.insert(key).second) {
              duplicate = fmt::format("field '{}' of entry '{}'", key, entry);
            }
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    fail(path, fmt::format("header is not valid UTF-8 JSON: {}", e.what()), kBadFileHint);
  }
  if (!duplicate.empty()) fail(path, fmt::format("header has a duplicate key: {}", duplicate), kBadFileHint);
  if (!header.is_object()) fail(path, "header is not a JSON object", kBadFileHint);

  const std::uint64_t buffer = size - 8 - n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) fail(path, "\"__metadata__\" is not an object of strings", kBadFileHint);
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          fail(path, fmt::format("\"__metadata__\" entry '{}' is not a string", m.key()), kBadFileHint);
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { fail(path, fmt::format("tensor '{}': {}", name, what), kBadFileHint); };
    if (!e.is_object()) bad("entry is not an object with \"dtype\", \"shape\" and \"data_offsets\"");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!e.contains(field)) bad(fmt::format("entry lacks the \"{}\" field", field));
    for (auto k = e.begin(); k != e.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        bad(fmt::format("entry has an unknown field \"{}\"", k.key()));
    if (!e["dtype"].is_string()) bad("\"dtype\" is not a string");
    TensorInfo info;
    info.name = name;
    info.dtype_name = e["dtype"].get<std::string>();
    auto dt = from_stored_name(info.dtype_name);
    if (!dt) bad(fmt::format("dtype '{}' is not supported ({})", info.dtype_name, kSupported));
    info.dtype = *dt;
    if (!e["shape"].is_array()) bad("\"shape\" is not an array");
    std::uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) bad(fmt::format("shape entry {} is not a non-negative integer", d.dump()));
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(INT64_MAX)) bad(fmt::format("shape entry {} is too large", v));
      info.shape.push_back(static_cast<std::int64_t>(v));
      if (v != 0 && count > UINT64_MAX / v) overflow = true;
      else count *= v;
    }
    if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) { count = 0; overflow = false; }
    const std::uint64_t esize = dtype_size(info.dtype);
    if (overflow || count > UINT64_MAX / esize)
      bad(fmt::format("shape {} has more bytes than 64 bits can count", shape_str(info.shape)));
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("\"data_offsets\" is not an array of two non-negative integers [begin, end]");
    info.begin = off[0].get<std::uint64_t>();
    info.end = off[1].get<std::uint64_t>();
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
  std::sort(f.tensors_.begin(), f.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  f.buffer_start_ = 8 + n;
  f.map_ = std::move(map);
  return f;
}

bool File::contains(std::string_view name) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const TensorInfo& t) { return t.name == name; });
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
  const std::filesystem::path tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) bad(fmt::format("cannot create '{}': {}", tmp.string(), std::strerror(errno)),
                  "check that the folder exists and is writable");
  auto write_all = [&](const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int e = errno;
        ::close(fd);
        std::filesystem::remove(tmp);
        bad(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(e)), "check the free disk space");
      }
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  };
  unsigned char len[8];
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  write_all(len, 8);
  write_all(json.data(), json.size());
  for (const Tensor& c : host)
    if (c.numel() > 0) write_all(c.data(), static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()));
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::filesystem::remove(tmp);
    bad(fmt::format("cannot flush '{}': {}", tmp.string(), std::strerror(errno)), "check the disk");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) bad(fmt::format("cannot rename '{}' to it: {}", tmp.string(), ec.message()), "check permissions");
}

std::map<std::string, Tensor> load_folder(const std::filesystem::path& folder, std::optional<DType> as) {
  std::map<std::string, Tensor> out;
  const auto single = folder / "model.safetensors";
  const auto index = folder / "model.safetensors.index.json";
  if (std::filesystem::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(fmt::format("safetensors index '{}' is not valid JSON: {}\nhint: download it again",
                                    index.string(), e.what()));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw FormatError(fmt::format("safetensors index '{}' has no \"weight_map\" object\nhint: download it again",
                                    index.string()));
    std::map<std::string, File> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw FormatError(fmt::format("safetensors index '{}': weight_map entry '{}' is not a file name",
                                      index.string(), it.key()));
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || shard == "." || shard.empty())
        throw FormatError(fmt::format("safetensors index '{}': tensor '{}' names shard '{}', which is not a file "
                                      "name in the folder", index.string(), it.key(), shard));
      auto s = shards.find(shard);
      if (s == shards.end()) {
        if (!std::filesystem::exists(folder / shard))
          throw FormatError(fmt::format("safetensors index '{}': tensor '{}' is in shard '{}', which is missing\n"
                                        "hint: download every shard the index names", index.string(), it.key(), shard));
        s = shards.emplace(shard, File::open(folder / shard)).first;
      }
      if (!s->second.contains(it.key()))
        throw FormatError(fmt::format("safetensors index '{}': tensor '{}' is not in shard '{}'\nhint: the index and "
                                      "the shards do not match; download them again", index.string(), it.key(), shard));
      out.emplace(it.key(), s->second.load(it.key(), as));
    }
    return out;
  }
  if (!std::filesystem::exists(single))
    throw FormatError(fmt::format("folder '{}' has neither model.safetensors nor model.safetensors.index.json\n"
                                  "hint: give a Hugging Face model folder", folder.string()));
  File f = File::open(single);
  for (const auto& t : f.tensors()) out.emplace(t.name, f.load(t.name, as));
  return out;
}

}  // namespace ampscope::safetensors
