#include "probes/trace/hdf5_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

namespace ampscope::trace::detail {

void Io::fail(std::string_view problem, std::string_view hint) const {
  std::string message = fmt::format("cannot {} trace '{}': {}", verb_, path_, problem);
  if (!hint.empty()) message += fmt::format("\nhint: {}", hint);
  throw TraceError(message);
}

void Io::fail_call(std::string_view call, std::string_view object) const {
  if (storage_ != nullptr && storage_->failed()) {
    // HDF5 saw no error (the driver took the failed write over): its stack has nothing to say.
    take_hdf5_errors();
    std::string_view advice;
    switch (storage_->error) {
      case ENOSPC:
      case EDQUOT: advice = "free space on its file system, or write the trace elsewhere"; break;
      case EFBIG: advice = "the file system allows no larger file: write the trace elsewhere"; break;
      case EACCES:
      case EPERM:
      case EROFS: advice = "the trace's folder must be writable, or write the trace elsewhere"; break;
      case EISDIR: advice = "the path names a folder: give the trace a file name"; break;
      default: advice = "check the file system (its kernel log may say more), or write the trace elsewhere"; break;
    }
    fail(fmt::format("{} ({}, in {} on '{}')", storage_->problem(), storage_->operation, call, object),
         call_hint_.empty() ? std::string(advice) : fmt::format("{}; {}", call_hint_, advice));
  }
  fail(fmt::format("{} failed on '{}'\nHDF5 error stack:\n{}", call, object, take_hdf5_errors()), call_hint_);
}

std::string StorageFailure::problem() const {
  std::string text = std::strerror(error);
  // strerror's "No space left on device" reads as part of our sentence.
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z' && !(text.size() > 1 && text[1] >= 'A' && text[1] <= 'Z')) {
    text[0] = static_cast<char>(text[0] - 'A' + 'a');
  }
  return text;
}

Datatype copy_type(const Io& io, hid_t predefined) { return Datatype(io.check(H5Tcopy(predefined), "H5Tcopy", "/")); }

Datatype fixed_text_type(const Io& io, std::size_t width) {
  Datatype t = copy_type(io, H5T_C_S1);
  io.check(H5Tset_size(t.get(), width), "H5Tset_size", "/");
  io.check(H5Tset_strpad(t.get(), H5T_STR_NULLTERM), "H5Tset_strpad", "/");
  io.check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", "/");
  return t;
}

Datatype variable_text_type(const Io& io) {
  Datatype t = copy_type(io, H5T_C_S1);
  io.check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size", "/");
  io.check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", "/");
  return t;
}

Datatype bool_type(const Io& io) {
  Datatype t(io.check(H5Tenum_create(H5T_NATIVE_INT8), "H5Tenum_create", "/"));
  const std::int8_t no = 0, yes = 1;
  io.check(H5Tenum_insert(t.get(), "FALSE", &no), "H5Tenum_insert", "/");
  io.check(H5Tenum_insert(t.get(), "TRUE", &yes), "H5Tenum_insert", "/");
  return t;
}

namespace {

std::string attribute_path(std::string_view where, const char* name) {
  return where == "/" ? fmt::format("/@{}", name) : fmt::format("{}@{}", where, name);
}

void write_attribute(const Io& io, hid_t object, std::string_view where, const char* name, hid_t type, const void* data) {
  const std::string path = attribute_path(where, name);
  Dataspace space(io.check(H5Screate(H5S_SCALAR), "H5Screate", path));
  Attribute attr(io.check(H5Acreate2(object, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), "H5Acreate2", path));
  io.check(H5Awrite(attr.get(), type, data), "H5Awrite", path);
}

// An open attribute with its type and number of elements, or nothing when it does not exist.
struct OpenAttribute {
  Attribute attr;
  Datatype type;
  hssize_t count = 0;
  std::string path;
};

std::optional<OpenAttribute> open_attribute(const Io& io, hid_t object, std::string_view where, const char* name) {
  OpenAttribute a;
  a.path = attribute_path(where, name);
  if (io.check(H5Aexists(object, name), "H5Aexists", a.path) <= 0) return std::nullopt;
  a.attr = Attribute(io.check(H5Aopen(object, name, H5P_DEFAULT), "H5Aopen", a.path));
  a.type = Datatype(io.check(H5Aget_type(a.attr.get()), "H5Aget_type", a.path));
  Dataspace space(io.check(H5Aget_space(a.attr.get()), "H5Aget_space", a.path));
  a.count = io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", a.path);
  return a;
}

std::string_view class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_ENUM: return "an enumeration";
    case H5T_COMPOUND: return "a compound";
    case H5T_ARRAY: return "an array";
    default: return "a value of another HDF5 class";
  }
}

// --- variable-length strings (format_version 1 and 2), read without HDF5's global heap ---
//
// A variable-length string attribute stores, in the object header (checksummed), the string's length and
// a reference to an object in a global heap collection ("GCOL"), which HDF5 1.10 stores without any
// checksum. HDF5's own decoding of a damaged collection reads out of bounds or loops for ever (an object
// of size 0), and its read copies the heap object's size into a buffer sized by the header's length.
// So the reference is taken as raw bytes (a no-op conversion to an opaque type, below) and the
// collection is read from the file and walked here, every size checked against the bytes there are.

constexpr const char* kRawReferenceTag = "ampscope: raw variable-length reference";

// HDF5 conversion from a variable-length string (as stored on disk) to our opaque type of the same
// size: the bytes stay as they are, so H5Aread hands back the stored length and heap reference.
herr_t keep_reference_bytes(hid_t src, hid_t dst, H5T_cdata_t* cdata, size_t, size_t, size_t, void*, void*, hid_t) {
  switch (cdata->command) {
    case H5T_CONV_INIT: {
      if (H5Tis_variable_str(src) <= 0 || H5Tget_class(dst) != H5T_OPAQUE) return -1;
      char* tag = H5Tget_tag(dst);
      const bool ours = tag != nullptr && std::strcmp(tag, kRawReferenceTag) == 0;
      H5free_memory(tag);
      if (!ours || H5Tget_size(src) != H5Tget_size(dst)) return -1;
      cdata->need_bkg = H5T_BKG_NO;
      return 0;
    }
    case H5T_CONV_CONV: return 0;  // same size, same bytes
    case H5T_CONV_FREE: return 0;
    default: return -1;
  }
}

std::uint64_t little_endian(const unsigned char* p, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t b = 0; b < n; ++b) v |= std::uint64_t{p[b]} << (8 * b);
  return v;
}

}  // namespace

std::string read_variable_text(const Io& io, hid_t object, hid_t attribute, hid_t type, const std::string& path) {
  static const herr_t registered = H5Tregister(H5T_PERS_SOFT, "ampscope raw vlen", type, H5T_NATIVE_OPAQUE,
                                               keep_reference_bytes);
  if (registered < 0) io.fail(fmt::format("cannot read attribute '{}': H5Tregister failed", path));
  auto damaged = [&](std::string_view what) -> std::string {
    io.fail(fmt::format("attribute '{}' is damaged: {}", path, what),
            "a variable-length text attribute (format_version 1 and 2) lives in HDF5's global heap, which has no "
            "checksum; the file is damaged");
  };

  // The file's address and length sizes, and where its addresses start (after a user block).
  const hid_t file_id = io.check(H5Iget_file_id(object), "H5Iget_file_id", path);
  File file(file_id);
  PropertyList fcpl(io.check(H5Fget_create_plist(file.get()), "H5Fget_create_plist", path));
  std::size_t address_size = 0, length_size = 0;
  io.check(H5Pget_sizes(fcpl.get(), &address_size, &length_size), "H5Pget_sizes", path);
  hsize_t user_block = 0;
  io.check(H5Pget_userblock(fcpl.get(), &user_block), "H5Pget_userblock", path);
  if (address_size < 2 || address_size > 8 || length_size < 2 || length_size > 8) {
    damaged(fmt::format("the file's address and length sizes are {} and {} bytes", address_size, length_size));
  }

  const std::size_t reference_size = 4 + address_size + 4;
  Datatype raw(io.check(H5Tcreate(H5T_OPAQUE, reference_size), "H5Tcreate", path));
  io.check(H5Tset_tag(raw.get(), kRawReferenceTag), "H5Tset_tag", path);
  std::vector<unsigned char> reference(reference_size);
  // (H5Aread fails, without reading anything, if the stored reference is not of this size.)
  io.check(H5Aread(attribute, raw.get(), reference.data()), "H5Aread", path);
  const std::uint64_t length = little_endian(reference.data(), 4);
  const std::uint64_t address = little_endian(reference.data() + 4, address_size);
  const std::uint64_t wanted = little_endian(reference.data() + 4 + address_size, 4);
  if (length == 0) return {};
  if (length > kMaxTextAttribute) damaged(fmt::format("it claims {} bytes of text", length));

  // The collection: "GCOL", version 1, 3 reserved bytes, its size; then objects, each an index (2 bytes),
  // a reference count (2), 4 reserved bytes, a size and the data padded to 8 bytes; index 0 is free space.
  std::ifstream in(io.path(), std::ios::binary);
  if (!in) damaged("the file cannot be opened to read it");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<std::uint64_t>(static_cast<std::streamoff>(in.tellg()));
  const std::uint64_t header_size = 8 + length_size;
  const std::uint64_t at = address + user_block;
  if (address >= file_size || at < address || at > file_size || file_size - at < header_size) {
    damaged(fmt::format("its heap collection at byte {} lies outside the file ({} bytes)", at, file_size));
  }
  unsigned char header[16] = {};
  in.seekg(static_cast<std::streamoff>(at));
  in.read(reinterpret_cast<char*>(header), static_cast<std::streamsize>(header_size));
  if (!in) damaged("its heap collection cannot be read");
  if (std::memcmp(header, "GCOL", 4) != 0 || header[4] != 1) damaged(fmt::format("no heap collection at byte {}", at));
  const std::uint64_t size = little_endian(header + 8, length_size);
  constexpr std::uint64_t kMinCollection = 4096, kMaxCollection = std::uint64_t{64} << 20;
  if (size < kMinCollection || size > kMaxCollection || size > file_size - at) {
    damaged(fmt::format("its heap collection at byte {} claims {} bytes", at, size));
  }
  std::vector<unsigned char> heap(static_cast<std::size_t>(size));
  in.seekg(static_cast<std::streamoff>(at));
  in.read(reinterpret_cast<char*>(heap.data()), static_cast<std::streamsize>(size));
  if (!in) damaged("its heap collection cannot be read");

  const std::uint64_t object_header = 8 + length_size;
  std::vector<bool> seen;
  std::optional<std::string> found;
  for (std::uint64_t p = header_size; p < size;) {
    if (size - p < object_header) break;  // too small for an object: free space
    const unsigned char* o = heap.data() + p;
    const std::uint64_t index = little_endian(o, 2), object_size = little_endian(o + 8, length_size);
    std::uint64_t need = 0;
    if (index == 0) {  // free space: its size includes its header and is a multiple of 8
      need = object_size;
      if (need < object_header || need % 8 != 0 || need > size - p) damaged("its heap collection's free space is damaged");
    } else {
      if (object_size > size - p - object_header) damaged(fmt::format("heap object {} claims {} bytes", index, object_size));
      need = object_header + (object_size + 7) / 8 * 8;
      if (need > size - p) damaged(fmt::format("heap object {} runs past its collection", index));
      if (seen.size() <= index) seen.resize(static_cast<std::size_t>(index) + 1);
      if (seen[static_cast<std::size_t>(index)]) damaged(fmt::format("heap object {} appears twice", index));
      seen[static_cast<std::size_t>(index)] = true;
      if (index == wanted) {
        if (object_size != length) {
          damaged(fmt::format("its heap object holds {} bytes, the attribute says {}", object_size, length));
        }
        found = std::string(reinterpret_cast<const char*>(o + object_header), static_cast<std::size_t>(object_size));
      }
    }
    p += need;
  }
  if (!found) damaged(fmt::format("its heap object {} is not in its collection", wanted));
  if (found->find('\0') != std::string::npos) damaged("its text contains a NUL byte");
  return *found;
}

void write_text_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::string_view value) {
  // A fixed-length string stored in the object header, never a variable-length one: HDF5 1.10 keeps those
  // in its global heap, which has no checksum, and a changed byte there crashes or hangs every reader.
  if (value.find('\0') != std::string_view::npos) {
    io.fail(fmt::format("the text of attribute '{}' contains a NUL byte", attribute_path(where, name)));
  }
  const Datatype type = fixed_text_type(io, value.size() + 1);
  const std::string text(value);  // NUL-terminated
  write_attribute(io, object, where, name, type.get(), text.c_str());
}

void write_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::int64_t value) {
  write_attribute(io, object, where, name, H5T_STD_I64LE, &value);
}

void rewrite_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::int64_t value) {
  const std::string path = attribute_path(where, name);
  Attribute attr(io.check(H5Aopen(object, name, H5P_DEFAULT), "H5Aopen", path));
  io.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), "H5Awrite", path);
}

std::optional<std::string> read_text_attribute(const Io& io, hid_t object, std::string_view where, const char* name) {
  std::optional<OpenAttribute> a = open_attribute(io, object, where, name);
  if (!a) return std::nullopt;
  const H5T_class_t cls = io.check(H5Tget_class(a->type.get()), "H5Tget_class", a->path);
  if (cls != H5T_STRING || a->count != 1) {
    io.fail(fmt::format("attribute '{}' is {} with {} element(s), expected one string", a->path, class_name(cls), a->count));
  }
  if (io.check(H5Tis_variable_str(a->type.get()), "H5Tis_variable_str", a->path) > 0) {
    // Never through HDF5's global heap (see read_variable_text): its own reads crash on a damaged heap.
    return read_variable_text(io, object, a->attr.get(), a->type.get(), a->path);
  }
  const std::size_t size = H5Tget_size(a->type.get());
  if (size == 0) io.fail(fmt::format("attribute '{}' has a string type of size 0", a->path));
  if (size > kMaxTextAttribute) {
    io.fail(fmt::format("attribute '{}' claims {} bytes of text, more than the {} a trace's attribute may hold", a->path, size,
                        kMaxTextAttribute));
  }
  std::vector<char> buffer(size + 1, '\0');
  io.check(H5Aread(a->attr.get(), a->type.get(), buffer.data()), "H5Aread", a->path);
  return std::string(buffer.data());  // up to the first NUL: null-padded and null-terminated alike
}

std::optional<std::int64_t> read_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name) {
  std::optional<OpenAttribute> a = open_attribute(io, object, where, name);
  if (!a) return std::nullopt;
  const H5T_class_t cls = io.check(H5Tget_class(a->type.get()), "H5Tget_class", a->path);
  if (cls != H5T_INTEGER || a->count != 1) {
    io.fail(fmt::format("attribute '{}' is {} with {} element(s), expected one integer", a->path, class_name(cls), a->count));
  }
  std::int64_t value = 0;
  io.check(H5Aread(a->attr.get(), H5T_NATIVE_INT64, &value), "H5Aread", a->path);
  return value;
}

// --- the writer's file driver (write_access) ---
//
// HDF5's sec2 driver, as its 1.10 sources and documentation describe it: pread/pwrite at HDF5's
// addresses, the file's size tracked as its end of file, truncated to HDF5's end of allocation when
// HDF5 asks, flock for HDF5's file locking. The same feature flags, so HDF5 allocates, aggregates and
// writes exactly as with sec2, and the file has no driver information in it: any reader opens it with
// the default driver. What differs is the failure of a write (see write_access).

namespace {

// What the property list carries to the open call (HDF5 copies it byte for byte).
struct DriverInfo {
  StorageFailure* storage;
};

// A write HDF5 made after the failure, kept in memory; later ones cover earlier ones.
struct AbsorbedWrite {
  haddr_t address;
  std::vector<unsigned char> bytes;
};

struct DriverState {
  int fd = -1;
  haddr_t eoa = 0;  // HDF5's end of allocation
  haddr_t eof = 0;  // the file's size, as HDF5 sees it (including absorbed writes)
  dev_t device = 0;
  ino_t inode = 0;
  StorageFailure* storage = nullptr;
  std::vector<AbsorbedWrite> absorbed;

  bool failed() const { return storage->failed(); }
  void record(int error, std::string operation) {
    if (failed()) return;  // the first failure is the one to report
    storage->error = error;
    storage->operation = std::move(operation);
  }
};

// HDF5 sees the public part, which must come first; it fills it in after open.
struct DriverFile {
  H5FD_t pub;
  DriverState* state;
};
static_assert(std::is_standard_layout_v<DriverFile>, "HDF5 casts H5FD_t* to the driver's file struct");

DriverState& state_of(const H5FD_t* file) { return *reinterpret_cast<const DriverFile*>(file)->state; }

constexpr haddr_t kMaxAddress = (haddr_t{1} << (8 * sizeof(off_t) - 1)) - 1;

bool bad_region(haddr_t address, std::size_t size) {
  return address == HADDR_UNDEF || address > kMaxAddress || size > kMaxAddress - address;
}

H5FD_t* driver_open(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) noexcept {
  const auto* info = static_cast<const DriverInfo*>(H5Pget_driver_info(fapl));
  if (info == nullptr || info->storage == nullptr || name == nullptr || *name == '\0' || maxaddr == 0 ||
      maxaddr == HADDR_UNDEF || maxaddr > kMaxAddress) {
    return nullptr;
  }
  int o_flags = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o_flags |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o_flags |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o_flags |= O_EXCL;
  // A writer never follows a link at the trace's name (it would truncate and overwrite what the link points
  // at: TraceWriter refuses one by name first); readers do (a trace linked from elsewhere is read as any file).
  if (flags & H5F_ACC_RDWR) o_flags |= O_NOFOLLOW;
  const int fd = ::open(name, o_flags | O_CLOEXEC, 0666);
  if (fd < 0) {
    // HDF5 first tries an open without creating (is the file open already?), which fails on a new
    // file: only the creating open's failure is the file system's.
    if (flags & H5F_ACC_CREAT) {
      const int error = errno;
      if (!info->storage->failed()) {
        info->storage->error = error;
        info->storage->operation = "creating it";
      }
    }
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  try {
    auto state = std::make_unique<DriverState>();
    state->fd = fd;
    state->eof = static_cast<haddr_t>(st.st_size);
    state->device = st.st_dev;
    state->inode = st.st_ino;
    state->storage = info->storage;
    auto* file = new DriverFile{};
    file->state = state.release();
    return &file->pub;
  } catch (...) {
    ::close(fd);
    return nullptr;
  }
}

herr_t driver_close(H5FD_t* file) noexcept {
  auto* f = reinterpret_cast<DriverFile*>(file);
  DriverState* state = f->state;
  // A failed close (NFS reports a full disk here) fails nothing in HDF5, which would keep the file open
  // and loop at exit trying to close it: it is recorded, like a failed write.
  if (::close(state->fd) != 0) state->record(errno, "closing it");
  delete state;
  delete f;
  return 0;
}

int driver_compare(const H5FD_t* a, const H5FD_t* b) noexcept {
  const DriverState& x = state_of(a);
  const DriverState& y = state_of(b);
  if (x.device != y.device) return x.device < y.device ? -1 : 1;
  if (x.inode != y.inode) return x.inode < y.inode ? -1 : 1;
  return 0;
}

herr_t driver_query(const H5FD_t*, unsigned long* flags) noexcept {
  // sec2's: what makes HDF5 lay the file out as it does with the default driver, and allow SWMR.
  *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
           H5FD_FEAT_AGGREGATE_SMALLDATA | H5FD_FEAT_POSIX_COMPAT_HANDLE | H5FD_FEAT_SUPPORTS_SWMR_IO |
           H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}

haddr_t driver_get_eoa(const H5FD_t* file, H5FD_mem_t) noexcept { return state_of(file).eoa; }

herr_t driver_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t address) noexcept {
  if (address == HADDR_UNDEF || address > kMaxAddress) return -1;
  state_of(file).eoa = address;
  return 0;
}

haddr_t driver_get_eof(const H5FD_t* file, H5FD_mem_t) noexcept { return state_of(file).eof; }

herr_t driver_get_handle(H5FD_t* file, hid_t, void** handle) noexcept {
  if (handle == nullptr) return -1;
  *handle = &state_of(file).fd;
  return 0;
}

herr_t driver_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t address, std::size_t size, void* buffer) noexcept {
  DriverState& state = state_of(file);
  if (bad_region(address, size)) return -1;
  auto* out = static_cast<unsigned char*>(buffer);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(state.fd, out + done, size - done, static_cast<off_t>(address + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (n == 0) {  // past the end of the file: zeros, as sec2 reads them
      std::memset(out + done, 0, size - done);
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  // After a failure, what HDF5 wrote since is in memory, not in the file.
  for (const AbsorbedWrite& w : state.absorbed) {
    const haddr_t begin = std::max(address, w.address);
    const haddr_t end = std::min<haddr_t>(address + size, w.address + w.bytes.size());
    if (begin < end) {
      std::memcpy(out + (begin - address), w.bytes.data() + (begin - w.address), static_cast<std::size_t>(end - begin));
    }
  }
  return 0;
}

herr_t driver_write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t address, std::size_t size, const void* buffer) noexcept {
  DriverState& state = state_of(file);
  if (bad_region(address, size)) return -1;
  const auto* in = static_cast<const unsigned char*>(buffer);
  std::size_t done = 0;
  while (!state.failed() && done < size) {
    const ssize_t n = ::pwrite(state.fd, in + done, size - done, static_cast<off_t>(address + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // A short write leaves the bytes that fit, where HDF5 had allocated space nothing points at yet
      // (or rewritten in place: on most file systems a rewrite needs no new space).
      state.record(n < 0 ? errno : ENOSPC, fmt::format("writing {} bytes at byte {}", size, address));
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (state.failed()) {
    try {
      state.absorbed.push_back({address, std::vector<unsigned char>(in, in + size)});
    } catch (...) {
      return -1;  // out of memory: HDF5 fails the call
    }
  }
  state.eof = std::max<haddr_t>(state.eof, address + size);
  return 0;
}

herr_t driver_truncate(H5FD_t* file, hid_t, hbool_t) noexcept {
  DriverState& state = state_of(file);
  if (state.eoa == state.eof) return 0;
  if (!state.failed() && ::ftruncate(state.fd, static_cast<off_t>(state.eoa)) != 0) {
    state.record(errno, fmt::format("setting its size to {} bytes", state.eoa));
  }
  state.eof = state.eoa;
  return 0;
}

herr_t driver_lock(H5FD_t* file, hbool_t rw) noexcept {
  if (::flock(state_of(file).fd, (rw ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return 0;
  return errno == ENOSYS ? 0 : -1;  // a file system without locks: as HDF5 does by default
}

herr_t driver_unlock(H5FD_t* file) noexcept {
  if (::flock(state_of(file).fd, LOCK_UN) == 0) return 0;
  return errno == ENOSYS ? 0 : -1;
}

hid_t registered_driver = H5I_INVALID_HID;

herr_t driver_terminate() noexcept {
  registered_driver = H5I_INVALID_HID;  // the library is closing: register again if it is reopened
  return 0;
}

const H5FD_class_t kDriverClass = {
    .name = "ampscope_sec2",
    .maxaddr = kMaxAddress,
    .fc_degree = H5F_CLOSE_WEAK,
    .terminate = driver_terminate,
    .sb_size = nullptr,  // no driver information in the file: it is a plain sec2 file
    .sb_encode = nullptr,
    .sb_decode = nullptr,
    .fapl_size = sizeof(DriverInfo),  // copied byte for byte by HDF5
    .fapl_get = nullptr,
    .fapl_copy = nullptr,
    .fapl_free = nullptr,
    .dxpl_size = 0,
    .dxpl_copy = nullptr,
    .dxpl_free = nullptr,
    .open = driver_open,
    .close = driver_close,
    .cmp = driver_compare,
    .query = driver_query,
    .get_type_map = nullptr,
    .alloc = nullptr,  // HDF5 allocates addresses itself, as for sec2
    .free = nullptr,
    .get_eoa = driver_get_eoa,
    .set_eoa = driver_set_eoa,
    .get_eof = driver_get_eof,
    .get_handle = driver_get_handle,
    .read = driver_read,
    .write = driver_write,
    .flush = nullptr,  // pwrite hands everything to the kernel at once, as sec2
    .truncate = driver_truncate,
    .lock = driver_lock,
    .unlock = driver_unlock,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

}  // namespace

PropertyList write_access(const Io& io, StorageFailure& storage) {
  static std::mutex registering;
  hid_t driver;
  {
    std::lock_guard lock(registering);
    if (registered_driver < 0 || H5Iis_valid(registered_driver) <= 0) {
      registered_driver = io.check(H5FDregister(&kDriverClass), "H5FDregister", "/");
    }
    driver = registered_driver;
  }
  PropertyList fapl(io.check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", "/"));
  const DriverInfo info{&storage};
  io.check(H5Pset_driver(fapl.get(), driver, &info), "H5Pset_driver", "/");
  return fapl;
}

}  // namespace ampscope::trace::detail
