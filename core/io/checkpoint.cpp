// core/io/checkpoint.cpp: the HDF5 layout of checkpoints (core/io/checkpoint.h), written with HDF5 1.10's C API.
//
// How tensors are stored, and why. Every tensor is a contiguous dataset whose HDF5 datatype says what
// the numbers are: f64 and f32 as IEEE_F64LE / IEEE_F32LE, i64 as STD_I64LE, bool as h5py's enum of
// int8 {FALSE = 0, TRUE = 1}, and the two 16-bit floats as HDF5 float types of 16 bits:
//   f16   sign 15, exponent 10..14 (bias 15),  mantissa 0..9  - IEEE binary16, as h5py writes numpy float16
//   bf16  sign 15, exponent 7..14  (bias 127), mantissa 0..6  - the top half of an IEEE binary32
// (HDF5 1.10 has no predefined 16-bit float; both are derived from IEEE_F32LE by h5py's recipe.) We
// prefer these to raw 16-bit integers plus a "dtype" attribute because the file then describes itself:
// h5dump prints values, h5py reads f16 as numpy float16 and bf16 (which numpy lacks) as float32, with
// HDF5 converting exactly. Exactness does not suffer: we read with a memory type equal to the file's
// type, and HDF5 converts nothing between equal types, so every bit pattern (NaN payloads, -0,
// subnormals) comes back as it was written. Datasets are neither chunked nor compressed, and the file
// uses HDF5's default (oldest) format version, so any HDF5 1.8+ reader opens it. No SWMR: a checkpoint
// is written once, to a temporary file, and only becomes visible by rename.
//
// Checksums (version 2). HDF5 1.10's default format checksums none of this: a flipped byte in a tensor
// or in an attribute's value reads back as a different number without a word. So every dataset carries
// an attribute ampscope_crc32 (zlib's CRC-32 over its link name, type class and size, dimensions and
// raw bytes), and every object holding values as attributes carries ampscope_crc32 = u32[n], one CRC
// per other attribute in name order (over name, type class and size, element count and raw bytes), so
// a mismatch names the one value. Strings are fixed-length (version 1 wrote variable-length ones, which
// live in HDF5's global heap: unchecksummed, and a flipped byte there can crash HDF5 itself).
//
// Writing. The file is built in memory (HDF5's core driver, no backing store) and its image is written
// with plain write() + fsync() to the temporary file. HDF5 therefore never meets a full disk: when
// HDF5 itself failed a write there, the file stayed open inside the library with dirty metadata, and
// the library's clean-up at exit flushed it again and crashed (SIGSEGV) or looped ("infinite loop
// closing library"). A failing write() is ours to report, and nothing is left open.
//
// Errors: HDF5's automatic printing is off while a checkpoint is read or written (and restored after);
// every call goes through Io::check, which on failure copies HDF5's error stack into the message.
#include "core/io/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/io/hdf5_support.h"

namespace ampscope {
namespace {

// Memory types are the file types, which are little-endian.
static_assert(std::endian::native == std::endian::little, "checkpoints assume a little-endian host");

constexpr std::string_view kFormatName = "ampscope checkpoint";
// The checksum attribute of every dataset and of every object holding value attributes (version 2).
constexpr const char* kCrcName = "ampscope_crc32";

// ---- errors ----------------------------------------------------------------------------------------

using hdf5::take_errors;
using QuietHdf5Errors = hdf5::QuietErrors;

// The file being saved or loaded, for messages: every error starts "cannot load checkpoint 'PATH': ".
class Io {
 public:
  Io(const std::filesystem::path& path, std::string_view verb) : path_(path.string()), verb_(verb) {}

  // Loading a version 2 file: every value read is checked against its checksum.
  bool verify_checksums = false;

  [[noreturn]] void fail(std::string_view problem, std::string_view hint = {}) const {
    std::string message = fmt::format("cannot {} checkpoint '{}': {}", verb_, path_, problem);
    if (!hint.empty()) message += fmt::format("\nhint: {}", hint);
    throw CheckpointError(message);
  }

  // The one check of every HDF5 call: a negative result throws with the call, the object (a path in
  // the file) and HDF5's own error stack.
  template <class T>
  T check(T result, std::string_view call, std::string_view object) const {
    if (result < 0) fail(fmt::format("{} failed on '{}'\nHDF5 error stack:\n{}", call, object, take_errors()));
    return result;
  }

 private:
  std::string path_;
  std::string_view verb_;
};

// ---- handles ---------------------------------------------------------------------------------------

using hdf5::Attribute;
using hdf5::Dataset;
using hdf5::Dataspace;
using hdf5::Datatype;
using hdf5::File;
using hdf5::Group;

std::string child_path(std::string_view parent, std::string_view name) {
  return parent == "/" ? fmt::format("/{}", name) : fmt::format("{}/{}", parent, name);
}

// ---- datatypes -------------------------------------------------------------------------------------

Datatype copy_type(const Io& io, hid_t predefined) { return Datatype(io.check(H5Tcopy(predefined), "H5Tcopy", "/")); }

// A 16-bit HDF5 float from IEEE_F32LE: fields first, then the size (HDF5 refuses the other order).
Datatype float16_type(const Io& io, std::size_t exponent_bits, std::size_t bias) {
  Datatype t = copy_type(io, H5T_IEEE_F32LE);
  const std::size_t mantissa_bits = 15 - exponent_bits;
  io.check(H5Tset_fields(t.get(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits), "H5Tset_fields", "/");
  io.check(H5Tset_size(t.get(), 2), "H5Tset_size", "/");
  io.check(H5Tset_ebias(t.get(), bias), "H5Tset_ebias", "/");
  return t;
}

// h5py's bool: an enum over int8 with FALSE = 0 and TRUE = 1, read by h5py as numpy bool.
Datatype bool_type(const Io& io) {
  Datatype t(io.check(H5Tenum_create(H5T_NATIVE_INT8), "H5Tenum_create", "/"));
  const std::int8_t no = 0, yes = 1;
  io.check(H5Tenum_insert(t.get(), "FALSE", &no), "H5Tenum_insert", "/");
  io.check(H5Tenum_insert(t.get(), "TRUE", &yes), "H5Tenum_insert", "/");
  return t;
}

// Variable-length UTF-8 strings: what version 1 wrote; read only.
Datatype string_type(const Io& io) {
  Datatype t = copy_type(io, H5T_C_S1);
  io.check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size", "/");
  io.check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", "/");
  return t;
}

// Fixed-length UTF-8 strings of `size` bytes, padded with NULs (what version 2 writes: h5py reads them as
// bytes). HDF5 refuses a size of 0, so an empty string takes one NUL byte.
Datatype fixed_string_type(const Io& io, std::size_t size) {
  Datatype t = copy_type(io, H5T_C_S1);
  io.check(H5Tset_size(t.get(), std::max<std::size_t>(size, 1)), "H5Tset_size", "/");
  io.check(H5Tset_strpad(t.get(), H5T_STR_NULLPAD), "H5Tset_strpad", "/");
  io.check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", "/");
  return t;
}

// ---- checksums -------------------------------------------------------------------------------------

// zlib's CRC-32 fed in pieces; lengths go in as 64-bit numbers so that no two inputs run together.
class Crc {
 public:
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const Bytef*>(data);
    while (n > 0) {
      const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, std::numeric_limits<uInt>::max()));
      value_ = ::crc32(value_, p, chunk);
      p += chunk;
      n -= chunk;
    }
  }
  void number(std::uint64_t v) { bytes(&v, sizeof v); }
  void text(std::string_view t) {
    number(t.size());
    bytes(t.data(), t.size());
  }
  std::uint32_t value() const { return static_cast<std::uint32_t>(value_); }

 private:
  uLong value_ = ::crc32(0L, Z_NULL, 0);
};

// The checksum of one stored value: its name, its HDF5 type's class and size, its dimensions (or element
// count) and its raw bytes.
std::uint32_t value_crc(const Io& io, std::string_view name, hid_t type, const std::vector<hsize_t>& dims,
                        const void* data, std::size_t size, std::string_view where) {
  Crc crc;
  crc.text(name);
  crc.number(static_cast<std::uint64_t>(io.check(H5Tget_class(type), "H5Tget_class", where)));
  crc.number(H5Tget_size(type));
  crc.number(dims.size());
  for (hsize_t d : dims) crc.number(d);
  crc.bytes(data, size);
  return crc.value();
}

[[noreturn]] void checksum_mismatch(const Io& io, std::string_view where, std::uint32_t stored, std::uint32_t computed) {
  io.fail(fmt::format("'{}' does not match its checksum (stored {:08x}, computed {:08x}): the file was changed "
                      "after it was saved",
                      where, stored, computed),
          "a damaged checkpoint cannot be trusted; resume from an earlier one");
}

// The file (and memory) type of a tensor dtype.
Datatype tensor_type(const Io& io, DType dtype) {
  switch (dtype) {
    case DType::f64: return copy_type(io, H5T_IEEE_F64LE);
    case DType::f32: return copy_type(io, H5T_IEEE_F32LE);
    case DType::f16: return float16_type(io, 5, 15);
    case DType::bf16: return float16_type(io, 8, 127);
    case DType::i64: return copy_type(io, H5T_STD_I64LE);
    case DType::boolean: return bool_type(io);
  }
  io.fail(fmt::format("dtype {} has no HDF5 type", static_cast<int>(dtype)));
}

bool types_equal(const Io& io, hid_t a, hid_t b, std::string_view object) {
  return io.check(H5Tequal(a, b), "H5Tequal", object) > 0;
}

// The dtype whose type equals `type`, if any.
std::optional<DType> dtype_of_type(const Io& io, hid_t type, std::string_view object) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i64, DType::boolean}) {
    if (types_equal(io, type, tensor_type(io, d).get(), object)) return d;
  }
  return std::nullopt;
}

// "a 4-byte HDF5 integer type", for messages about types we do not read.
std::string describe_type(const Io& io, hid_t type, std::string_view object) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  std::string_view name = "other";
  switch (cls) {
    case H5T_INTEGER: name = "integer"; break;
    case H5T_FLOAT: name = "float"; break;
    case H5T_STRING: name = "string"; break;
    case H5T_ENUM: name = "enum"; break;
    case H5T_COMPOUND: name = "compound"; break;
    case H5T_ARRAY: name = "array"; break;
    default: break;
  }
  if (cls == H5T_STRING && H5Tis_variable_str(type) > 0) return "a variable-length HDF5 string type";
  return fmt::format("a {}-byte HDF5 {} type", size, name);
}

// ---- groups, links, attributes ---------------------------------------------------------------------

Group create_group(const Io& io, hid_t loc, std::string_view parent, std::string_view name) {
  const std::string path = child_path(parent, name);
  return Group(io.check(H5Gcreate2(loc, std::string(name).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                        "H5Gcreate2", path));
}

bool has_link(const Io& io, hid_t loc, std::string_view parent, std::string_view name) {
  return io.check(H5Lexists(loc, std::string(name).c_str(), H5P_DEFAULT), "H5Lexists", child_path(parent, name)) > 0;
}

// Opens parent/name, which must be a group (else an error names it).
Group open_group(const Io& io, hid_t loc, std::string_view parent, std::string_view name) {
  const std::string path = child_path(parent, name);
  const hid_t id = io.check(H5Oopen(loc, std::string(name).c_str(), H5P_DEFAULT), "H5Oopen", path);
  if (H5Iget_type(id) != H5I_GROUP) {
    H5Oclose(id);
    io.fail(fmt::format("'{}' is not a group", path), "the file was not written by ampscope's save_checkpoint");
  }
  return Group(id);
}

Dataset open_dataset(const Io& io, hid_t loc, std::string_view parent, std::string_view name) {
  const std::string path = child_path(parent, name);
  const hid_t id = io.check(H5Oopen(loc, std::string(name).c_str(), H5P_DEFAULT), "H5Oopen", path);
  if (H5Iget_type(id) != H5I_DATASET) {
    H5Oclose(id);
    io.fail(fmt::format("'{}' is not a dataset", path), "the file was not written by ampscope's save_checkpoint");
  }
  return Dataset(id);
}

// The names of a group's links (children), in name order.
std::vector<std::string> link_names(const Io& io, hid_t group, std::string_view path) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  io.check(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), "H5Literate", path);
  return names;
}

std::vector<std::string> attribute_names(const Io& io, hid_t object, std::string_view path) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  io.check(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names), "H5Aiterate2", path);
  return names;
}

// Writes a scalar (count 0) or 1-D (count n) attribute.
void write_attribute(const Io& io, hid_t object, std::string_view path, std::string_view name, hid_t type,
                     const void* data, std::optional<hsize_t> count = std::nullopt) {
  const std::string where = fmt::format("{}@{}", path, name);
  Dataspace space(count ? io.check(H5Screate_simple(1, &*count, nullptr), "H5Screate_simple", where)
                        : io.check(H5Screate(H5S_SCALAR), "H5Screate", where));
  Attribute attr(io.check(H5Acreate2(object, std::string(name).c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                          "H5Acreate2", where));
  io.check(H5Awrite(attr.get(), type, data), "H5Awrite", where);
}

void write_f64(const Io& io, hid_t object, std::string_view path, std::string_view name, double value) {
  write_attribute(io, object, path, name, copy_type(io, H5T_IEEE_F64LE).get(), &value);
}
void write_i64(const Io& io, hid_t object, std::string_view path, std::string_view name, std::int64_t value) {
  write_attribute(io, object, path, name, copy_type(io, H5T_STD_I64LE).get(), &value);
}
void write_u64(const Io& io, hid_t object, std::string_view path, std::string_view name, std::uint64_t value) {
  write_attribute(io, object, path, name, copy_type(io, H5T_STD_U64LE).get(), &value);
}
void write_bool(const Io& io, hid_t object, std::string_view path, std::string_view name, bool value) {
  const std::int8_t v = value ? 1 : 0;
  write_attribute(io, object, path, name, bool_type(io).get(), &v);
}
void write_string(const Io& io, hid_t object, std::string_view path, std::string_view name, const std::string& value) {
  write_attribute(io, object, path, name, fixed_string_type(io, value.size()).get(), value.c_str());
}

// An open attribute with its type and element count, for the typed readers below.
struct OpenAttribute {
  Attribute attr;
  Datatype type;
  hssize_t count = 0;
  bool scalar = false;
  std::string where;  // "/optimizer/param_groups/0@lr"
};

OpenAttribute open_attribute(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  OpenAttribute a;
  a.where = fmt::format("{}@{}", path, name);
  if (io.check(H5Aexists(object, std::string(name).c_str()), "H5Aexists", a.where) <= 0) {
    io.fail(fmt::format("'{}' has no attribute '{}'", path, name),
            "the file was not written by this version of save_checkpoint, or was edited");
  }
  a.attr = Attribute(io.check(H5Aopen(object, std::string(name).c_str(), H5P_DEFAULT), "H5Aopen", a.where));
  a.type = Datatype(io.check(H5Aget_type(a.attr.get()), "H5Aget_type", a.where));
  Dataspace space(io.check(H5Aget_space(a.attr.get()), "H5Aget_space", a.where));
  a.count = io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", a.where);
  a.scalar = io.check(H5Sget_simple_extent_type(space.get()), "H5Sget_simple_extent_type", a.where) == H5S_SCALAR;
  return a;
}

// The checksum of one attribute's value (see value_crc). Variable-length values are refused: version 2
// never writes them, and their bytes live outside the attribute.
std::uint32_t attribute_crc(const Io& io, hid_t object, std::string_view path, const std::string& name) {
  const std::string where = fmt::format("{}@{}", path, name);
  const Attribute attr(io.check(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen", where));
  const Datatype type(io.check(H5Aget_type(attr.get()), "H5Aget_type", where));
  const H5T_class_t cls = io.check(H5Tget_class(type.get()), "H5Tget_class", where);
  if (cls == H5T_VLEN || cls == H5T_REFERENCE || io.check(H5Tis_variable_str(type.get()), "H5Tis_variable_str",
                                                          where) > 0) {
    io.fail(fmt::format("'{}' holds a variable-length value, which checkpoints of version 2 never hold", where),
            "the file was not written by save_checkpoint, or was edited");
  }
  const Dataspace space(io.check(H5Aget_space(attr.get()), "H5Aget_space", where));
  const hssize_t count = io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", where);
  const std::size_t size = H5Tget_size(type.get());
  // An attribute lives in an object header (64 KiB at most); a larger claim is damage, not data.
  if (size == 0 || count < 0 || static_cast<std::uint64_t>(count) * size > (std::uint64_t{1} << 16)) {
    io.fail(fmt::format("'{}' claims {} values of {} bytes, more than an attribute can hold", where, count, size),
            "the file is damaged; resume from an earlier checkpoint");
  }
  std::vector<unsigned char> bytes(static_cast<std::size_t>(count) * size + 1);
  io.check(H5Aread(attr.get(), type.get(), bytes.data()), "H5Aread", where);
  return value_crc(io, name, type.get(), {static_cast<hsize_t>(count)}, bytes.data(), bytes.size() - 1, where);
}

// The names of an object's attributes other than its checksum, in name order.
std::vector<std::string> value_names(const Io& io, hid_t object, std::string_view path) {
  std::vector<std::string> names = attribute_names(io, object, path);
  std::erase(names, std::string(kCrcName));
  return names;
}

// Writes the checksum of every attribute `object` holds (call it after the last one is written).
void seal_attributes(const Io& io, hid_t object, std::string_view path) {
  std::vector<std::uint32_t> crcs;
  for (const std::string& name : value_names(io, object, path)) crcs.push_back(attribute_crc(io, object, path, name));
  if (crcs.empty()) return;
  write_attribute(io, object, path, kCrcName, H5T_STD_U32LE, crcs.data(), hsize_t{crcs.size()});
}

// Checks every attribute of `object` against the checksums seal_attributes wrote (version 2 files only).
void verify_attributes(const Io& io, hid_t object, std::string_view path) {
  if (!io.verify_checksums) return;
  const std::vector<std::string> names = value_names(io, object, path);
  if (names.empty()) return;
  const std::string where = fmt::format("{}@{}", path, kCrcName);
  if (io.check(H5Aexists(object, kCrcName), "H5Aexists", where) <= 0) {
    io.fail(fmt::format("'{}' holds values ({}) but no checksum ('{}')", path, fmt::join(names, ", "), where),
            "the file was not written by save_checkpoint, or was edited");
  }
  const Attribute attr(io.check(H5Aopen(object, kCrcName, H5P_DEFAULT), "H5Aopen", where));
  const Datatype type(io.check(H5Aget_type(attr.get()), "H5Aget_type", where));
  const Dataspace space(io.check(H5Aget_space(attr.get()), "H5Aget_space", where));
  const hssize_t count = io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", where);
  if (io.check(H5Tget_class(type.get()), "H5Tget_class", where) != H5T_INTEGER ||
      static_cast<std::size_t>(count) != names.size()) {
    io.fail(fmt::format("'{}' holds {} values ({}), but its checksum '{}' covers {}", path, names.size(),
                        fmt::join(names, ", "), where, count),
            "a value was added or removed after the file was saved; resume from an earlier checkpoint");
  }
  std::vector<std::uint32_t> stored(names.size());
  io.check(H5Aread(attr.get(), H5T_NATIVE_UINT32, stored.data()), "H5Aread", where);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::uint32_t computed = attribute_crc(io, object, path, names[i]);
    if (computed != stored[i]) checksum_mismatch(io, fmt::format("{}@{}", path, names[i]), stored[i], computed);
  }
}

// A dataset's checksum attribute (seal_dataset) and its check (verify_dataset).
void seal_dataset(const Io& io, hid_t dset, std::string_view path, std::uint32_t crc) {
  write_attribute(io, dset, path, kCrcName, H5T_STD_U32LE, &crc);
}

void verify_dataset(const Io& io, hid_t dset, std::string_view path, std::uint32_t computed) {
  if (!io.verify_checksums) return;
  const std::string where = fmt::format("{}@{}", path, kCrcName);
  if (io.check(H5Aexists(dset, kCrcName), "H5Aexists", where) <= 0) {
    io.fail(fmt::format("dataset '{}' has no checksum ('{}')", path, where),
            "the file was not written by save_checkpoint, or was edited");
  }
  const Attribute attr(io.check(H5Aopen(dset, kCrcName, H5P_DEFAULT), "H5Aopen", where));
  const Dataspace space(io.check(H5Aget_space(attr.get()), "H5Aget_space", where));
  if (io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", where) != 1) {
    io.fail(fmt::format("'{}' is not one checksum", where), "the file was not written by save_checkpoint, or was edited");
  }
  std::uint32_t stored = 0;
  io.check(H5Aread(attr.get(), H5T_NATIVE_UINT32, &stored), "H5Aread", where);
  if (stored != computed) checksum_mismatch(io, path, stored, computed);
}

std::string_view base_name(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// The kinds of value an attribute can hold, as save_checkpoint writes them.
enum class ValueKind { f64, i64, u64, boolean, string, other };

ValueKind kind_of(const Io& io, const OpenAttribute& a) {
  const hid_t t = a.type.get();
  if (types_equal(io, t, copy_type(io, H5T_IEEE_F64LE).get(), a.where)) return ValueKind::f64;
  if (types_equal(io, t, copy_type(io, H5T_STD_I64LE).get(), a.where)) return ValueKind::i64;
  if (types_equal(io, t, copy_type(io, H5T_STD_U64LE).get(), a.where)) return ValueKind::u64;
  if (types_equal(io, t, bool_type(io).get(), a.where)) return ValueKind::boolean;
  if (io.check(H5Tget_class(t), "H5Tget_class", a.where) == H5T_STRING) return ValueKind::string;
  return ValueKind::other;
}

std::string_view kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::f64: return "a 64-bit float";
    case ValueKind::i64: return "a 64-bit signed integer";
    case ValueKind::u64: return "a 64-bit unsigned integer";
    case ValueKind::boolean: return "a bool";
    case ValueKind::string: return "a string";
    case ValueKind::other: return "of a type ampscope does not read";
  }
  return "?";
}

void expect_kind(const Io& io, const OpenAttribute& a, ValueKind want, hssize_t count) {
  const ValueKind got = kind_of(io, a);
  const bool shape_ok = count == 0 ? a.scalar : (!a.scalar && a.count == count);
  if (got != want || !shape_ok) {
    const std::string want_text =
        count == 0 ? fmt::format("a scalar, {}", kind_name(want))
                   : fmt::format("{} values, each {}", count, kind_name(want));
    io.fail(fmt::format("attribute '{}' holds {} value(s), {} ({}), but {} is expected", a.where, a.count,
                        kind_name(got), describe_type(io, a.type.get(), a.where), want_text),
            "the file was not written by this version of save_checkpoint, or was edited");
  }
}

template <class T>
T read_number(const Io& io, hid_t object, std::string_view path, std::string_view name, ValueKind kind, hid_t memory) {
  const OpenAttribute a = open_attribute(io, object, path, name);
  expect_kind(io, a, kind, 0);
  T value{};
  io.check(H5Aread(a.attr.get(), memory, &value), "H5Aread", a.where);
  return value;
}

double read_f64(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  return read_number<double>(io, object, path, name, ValueKind::f64, H5T_NATIVE_DOUBLE);
}
std::int64_t read_i64(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  return read_number<std::int64_t>(io, object, path, name, ValueKind::i64, H5T_NATIVE_INT64);
}
std::uint64_t read_u64(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  return read_number<std::uint64_t>(io, object, path, name, ValueKind::u64, H5T_NATIVE_UINT64);
}

bool read_bool_value(const Io& io, const OpenAttribute& a) {
  std::int8_t v = 0;
  io.check(H5Aread(a.attr.get(), bool_type(io).get(), &v), "H5Aread", a.where);
  return v != 0;
}
bool read_bool(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  const OpenAttribute a = open_attribute(io, object, path, name);
  expect_kind(io, a, ValueKind::boolean, 0);
  return read_bool_value(io, a);
}

// Variable-length strings (what we write and h5py writes for str) and fixed-length ones (numpy bytes).
std::string read_string_value(const Io& io, const OpenAttribute& a) {
  const hid_t t = a.type.get();
  if (io.check(H5Tis_variable_str(t), "H5Tis_variable_str", a.where) > 0) {
    char* raw = nullptr;
    io.check(H5Aread(a.attr.get(), t, &raw), "H5Aread", a.where);
    std::string value = raw != nullptr ? std::string(raw) : std::string();
    H5free_memory(raw);
    return value;
  }
  const std::size_t size = H5Tget_size(t);
  std::string value(size, '\0');
  io.check(H5Aread(a.attr.get(), t, value.data()), "H5Aread", a.where);
  value.resize(std::strlen(value.c_str()));
  return value;
}
std::string read_string(const Io& io, hid_t object, std::string_view path, std::string_view name) {
  const OpenAttribute a = open_attribute(io, object, path, name);
  expect_kind(io, a, ValueKind::string, 0);
  return read_string_value(io, a);
}

// ---- tensors ---------------------------------------------------------------------------------------

void write_tensor(const Io& io, hid_t loc, std::string_view parent, std::string_view name, const Tensor& tensor) {
  const std::string path = child_path(parent, name);
  Tensor host;
  {
    NoGradGuard no_grad;
    host = tensor.detach().to(Device::cpu()).contiguous();
  }
  std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
  Dataspace space(dims.empty() ? io.check(H5Screate(H5S_SCALAR), "H5Screate", path)
                               : io.check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                          "H5Screate_simple", path));
  const Datatype type = tensor_type(io, host.dtype());
  Dataset dset(io.check(H5Dcreate2(loc, std::string(name).c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT),
                        "H5Dcreate2", path));
  static const char kNoElements = 0;  // HDF5 refuses a null buffer even for zero elements
  const void* data = host.numel() > 0 ? host.data() : &kNoElements;
  io.check(H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", path);
  const std::size_t size = static_cast<std::size_t>(host.numel()) * dtype_size(host.dtype());
  seal_dataset(io, dset.get(), path, value_crc(io, name, type.get(), dims, data, size, path));
}

// A tensor dataset's header, read before its values so mismatches are reported without reading data.
struct TensorHeader {
  std::string path;
  std::optional<DType> dtype;  // null: a type no dtype maps to
  std::string type_text;       // "f16", or describe_type's text
  Shape shape;
};

TensorHeader read_header(const Io& io, const Dataset& dset, std::string path) {
  TensorHeader h;
  h.path = std::move(path);
  const Datatype type(io.check(H5Dget_type(dset.get()), "H5Dget_type", h.path));
  h.dtype = dtype_of_type(io, type.get(), h.path);
  h.type_text = h.dtype ? std::string(dtype_name(*h.dtype)) : describe_type(io, type.get(), h.path);
  const Dataspace space(io.check(H5Dget_space(dset.get()), "H5Dget_space", h.path));
  const H5S_class_t cls = io.check(H5Sget_simple_extent_type(space.get()), "H5Sget_simple_extent_type", h.path);
  if (cls == H5S_NULL) io.fail(fmt::format("dataset '{}' has no dataspace (H5S_NULL)", h.path));
  if (cls == H5S_SIMPLE) {
    const int rank = io.check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", h.path);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    io.check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims", h.path);
    h.shape.assign(dims.begin(), dims.end());
  }
  return h;
}

// The dataset's values as a new CPU tensor of its own dtype, bit for bit.
Tensor read_values(const Io& io, const Dataset& dset, const TensorHeader& h) {
  if (!h.dtype) io.fail(fmt::format("dataset '{}' is {}, which is no tensor dtype", h.path, h.type_text));
  Tensor out = Tensor::empty(h.shape, {*h.dtype, Device::cpu()});
  const Datatype type = tensor_type(io, *h.dtype);
  static char no_elements = 0;
  void* data = out.numel() > 0 ? out.data() : &no_elements;
  io.check(H5Dread(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dread", h.path);
  const std::vector<hsize_t> dims(h.shape.begin(), h.shape.end());
  const std::size_t size = static_cast<std::size_t>(out.numel()) * dtype_size(*h.dtype);
  verify_dataset(io, dset.get(), h.path, value_crc(io, base_name(h.path), type.get(), dims, data, size, h.path));
  return out;
}

void write_string_list(const Io& io, hid_t loc, std::string_view parent, std::string_view name,
                       const std::vector<std::string>& values) {
  const std::string path = child_path(parent, name);
  const hsize_t n = values.size();
  Dataspace space(io.check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple", path));
  std::size_t width = 1;
  for (const std::string& v : values) width = std::max(width, v.size());
  const Datatype type = fixed_string_type(io, width);
  Dataset dset(io.check(H5Dcreate2(loc, std::string(name).c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT,
                                   H5P_DEFAULT),
                        "H5Dcreate2", path));
  std::vector<char> packed(std::max<std::size_t>(values.size(), 1) * width, '\0');  // NUL-padded, one row each
  for (std::size_t i = 0; i < values.size(); ++i) std::memcpy(packed.data() + i * width, values[i].data(), values[i].size());
  io.check(H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), "H5Dwrite", path);
  seal_dataset(io, dset.get(), path, value_crc(io, name, type.get(), {n}, packed.data(), values.size() * width, path));
}

std::vector<std::string> read_string_list(const Io& io, hid_t loc, std::string_view parent, std::string_view name) {
  const std::string path = child_path(parent, name);
  const Dataset dset = open_dataset(io, loc, parent, name);
  const Datatype file_type(io.check(H5Dget_type(dset.get()), "H5Dget_type", path));
  const Dataspace space(io.check(H5Dget_space(dset.get()), "H5Dget_space", path));
  const int rank = io.check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", path);
  const hssize_t n = io.check(H5Sget_simple_extent_npoints(space.get()), "H5Sget_simple_extent_npoints", path);
  const bool is_string = io.check(H5Tget_class(file_type.get()), "H5Tget_class", path) == H5T_STRING;
  const bool variable = is_string && io.check(H5Tis_variable_str(file_type.get()), "H5Tis_variable_str", path) > 0;
  // Version 2 writes fixed-length strings (one NUL-padded row each), version 1 variable-length ones.
  if (!is_string || rank != 1 || variable == io.verify_checksums) {
    io.fail(fmt::format("dataset '{}' is {} of rank {}, but a list of {} strings is expected", path,
                        describe_type(io, file_type.get(), path), rank,
                        io.verify_checksums ? "fixed-length" : "variable-length"),
            "the file was not written by save_checkpoint, or was edited");
  }
  if (!variable) {
    const std::size_t width = H5Tget_size(file_type.get());
    // A list of parameter names: a claim beyond 1 GiB is damage, not data.
    if (width == 0 || static_cast<std::uint64_t>(n) * width > (std::uint64_t{1} << 30)) {
      io.fail(fmt::format("dataset '{}' claims {} strings of {} bytes", path, n, width),
              "the file is damaged; resume from an earlier checkpoint");
    }
    std::vector<char> packed(static_cast<std::size_t>(n) * width + 1, '\0');
    io.check(H5Dread(dset.get(), file_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), "H5Dread", path);
    verify_dataset(io, dset.get(), path,
                   value_crc(io, name, file_type.get(), {static_cast<hsize_t>(n)}, packed.data(), packed.size() - 1, path));
    std::vector<std::string> values;
    for (hssize_t i = 0; i < n; ++i) {
      const char* row = packed.data() + static_cast<std::size_t>(i) * width;
      values.emplace_back(row, strnlen(row, width));
    }
    return values;
  }
  std::vector<char*> raw(static_cast<std::size_t>(n) + 1, nullptr);  // + 1: a valid pointer when n is 0
  const Datatype memory = string_type(io);
  io.check(H5Dread(dset.get(), memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), "H5Dread", path);
  std::vector<std::string> values;
  for (hssize_t i = 0; i < n; ++i) {
    const char* value = raw[static_cast<std::size_t>(i)];
    values.emplace_back(value != nullptr ? value : "");
  }
  io.check(H5Dvlen_reclaim(memory.get(), space.get(), H5P_DEFAULT, raw.data()), "H5Dvlen_reclaim", path);
  return values;
}

// ---- names -----------------------------------------------------------------------------------------

// Names become HDF5 link names: no '/', not empty, not ".".
void check_link_name(const Io& io, std::string_view what, const std::string& name) {
  if (name.empty() || name == "." || name.find('/') != std::string::npos) {
    io.fail(fmt::format("{} name '{}' cannot be stored: names must be non-empty, not '.', and contain no '/'", what,
                        name),
            "rename it (module and parameter names come from register_module / register_parameter)");
  }
}

std::vector<std::pair<std::string, Tensor>> model_tensors(const nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> all = model.named_parameters();
  for (auto& entry : model.named_buffers()) all.push_back(std::move(entry));
  return all;
}

// Each optimizer group's parameter names, checked to be usable as keys.
std::vector<std::vector<std::string>> optimizer_names(const Io& io, const optim::Optimizer& opt) {
  std::vector<std::vector<std::string>> names;
  std::set<std::string> seen;
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g) {
    names.emplace_back();
    const auto& params = opt.param_groups()[g].params;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].name();
      if (name.empty()) {
        io.fail(fmt::format("{} parameter {} of group {} has no name, and optimizer state is stored by name",
                            opt.name(), i, g),
                "register the tensor in an nn::Module, or name it with Tensor::set_name");
      }
      if (!seen.insert(name).second) {
        io.fail(fmt::format("{} holds two parameters named '{}', and optimizer state is stored by name", opt.name(),
                            name),
                "give each tensor a distinct name (Tensor::set_name)");
      }
      check_link_name(io, "optimizer parameter", name);
      names.back().push_back(name);
    }
  }
  return names;
}

constexpr std::string_view kStateFields[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

using StateMember = Tensor optim::ParamState::*;

StateMember state_field(std::string_view name) {
  if (name == "momentum_buffer") return &optim::ParamState::momentum_buffer;
  if (name == "exp_avg") return &optim::ParamState::exp_avg;
  if (name == "exp_avg_sq") return &optim::ParamState::exp_avg_sq;
  if (name == "max_exp_avg_sq") return &optim::ParamState::max_exp_avg_sq;
  return nullptr;
}

// ---- saving ----------------------------------------------------------------------------------------

void write_model(const Io& io, hid_t root, const nn::Module& model) {
  const Group group = create_group(io, root, "/", "model");
  for (const auto& [name, tensor] : model_tensors(model)) {
    check_link_name(io, "model parameter", name);
    write_tensor(io, group.get(), "/model", name, tensor);
  }
}

void write_optimizer(const Io& io, hid_t root, const optim::Optimizer& opt) {
  const std::vector<std::vector<std::string>> names = optimizer_names(io, opt);
  const Group group = create_group(io, root, "/", "optimizer");
  write_string(io, group.get(), "/optimizer", "type", opt.name());
  seal_attributes(io, group.get(), "/optimizer");
  const Group groups = create_group(io, group.get(), "/optimizer", "param_groups");
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g) {
    const optim::ParamGroup& pg = opt.param_groups()[g];
    const std::string path = fmt::format("/optimizer/param_groups/{}", g);
    const Group gg = create_group(io, groups.get(), "/optimizer/param_groups", std::to_string(g));
    const optim::Hyperparameters& h = pg.options;
    write_f64(io, gg.get(), path, "lr", h.lr);
    write_f64(io, gg.get(), path, "momentum", h.momentum);
    write_f64(io, gg.get(), path, "dampening", h.dampening);
    write_bool(io, gg.get(), path, "nesterov", h.nesterov);
    write_attribute(io, gg.get(), path, "betas", copy_type(io, H5T_IEEE_F64LE).get(), h.betas.data(), hsize_t{2});
    write_f64(io, gg.get(), path, "eps", h.eps);
    write_bool(io, gg.get(), path, "amsgrad", h.amsgrad);
    write_f64(io, gg.get(), path, "weight_decay", h.weight_decay);
    write_bool(io, gg.get(), path, "maximize", h.maximize);
    if (pg.initial_lr) write_f64(io, gg.get(), path, "initial_lr", *pg.initial_lr);
    seal_attributes(io, gg.get(), path);
    write_string_list(io, gg.get(), path, "params", names[g]);
  }
  const Group states = create_group(io, group.get(), "/optimizer", "state");
  for (std::size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const optim::ParamState* s = opt.find_state(params[i]);
      if (s == nullptr) continue;
      bool any = s->step != 0;
      for (std::string_view field : kStateFields) any = any || (s->*state_field(field)).defined();
      if (!any) continue;  // a parameter that never had a gradient: same as no state
      const std::string& name = names[g][i];
      const std::string path = child_path("/optimizer/state", name);
      const Group ps = create_group(io, states.get(), "/optimizer/state", name);
      write_i64(io, ps.get(), path, "step", s->step);
      seal_attributes(io, ps.get(), path);
      for (std::string_view field : kStateFields) {
        const Tensor& t = s->*state_field(field);
        if (t.defined()) write_tensor(io, ps.get(), path, field, t);
      }
    }
  }
}

void write_state_dict(const Io& io, hid_t parent, const std::string& name, const StateDict& state) {
  check_link_name(io, "state", name);
  const std::string path = child_path("/states", name);
  const Group group = create_group(io, parent, "/states", name);
  for (const auto& [key, value] : state) {
    check_link_name(io, fmt::format("state '{}' key", name), key);
    if (key == kCrcName) {
      io.fail(fmt::format("state '{}' key '{}' is reserved for the checksum of the state's values", name, key),
              "rename the key");
    }
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, double>) write_f64(io, group.get(), path, key, v);
          else if constexpr (std::is_same_v<V, std::int64_t>) write_i64(io, group.get(), path, key, v);
          else if constexpr (std::is_same_v<V, bool>) write_bool(io, group.get(), path, key, v);
          else if constexpr (std::is_same_v<V, std::string>) write_string(io, group.get(), path, key, v);
          else {
            if (!v.defined()) io.fail(fmt::format("state '{}' key '{}' holds an undefined tensor", name, key));
            write_tensor(io, group.get(), path, key, v);
          }
        },
        value);
  }
  seal_attributes(io, group.get(), path);
}

void write_checkpoint(const Io& io, hid_t file, const Checkpoint& what) {
  const Group root(io.check(H5Gopen2(file, "/", H5P_DEFAULT), "H5Gopen2", "/"));
  write_string(io, root.get(), "/", "format", std::string(kFormatName));
  write_i64(io, root.get(), "/", "format_version", kCheckpointFormatVersion);
  write_i64(io, root.get(), "/", "step", what.step);
  seal_attributes(io, root.get(), "/");
  if (what.model != nullptr) write_model(io, root.get(), *what.model);
  if (what.optimizer != nullptr) write_optimizer(io, root.get(), *what.optimizer);
  if (!what.generators.empty()) {
    const Group group = create_group(io, root.get(), "/", "generators");
    for (const auto& [name, gen] : what.generators) {
      check_link_name(io, "generator", name);
      if (gen == nullptr) io.fail(fmt::format("generator '{}' is a null pointer", name));
      const std::string path = child_path("/generators", name);
      const Group g = create_group(io, group.get(), "/generators", name);
      write_u64(io, g.get(), path, "seed", gen->seed());
      write_u64(io, g.get(), path, "offset", gen->offset());
      seal_attributes(io, g.get(), path);
    }
  }
  if (!what.states.empty()) {
    const Group group = create_group(io, root.get(), "/", "states");
    for (const auto& [name, state] : what.states) write_state_dict(io, group.get(), name, state);
  }
}

// Flushes a file's (or directory's) data to the disk, so the rename that follows cannot become durable
// before the data it points to. Returns 0 or the errno of the failure.
int sync_path(const std::filesystem::path& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0) return errno;
  const int result = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return result;
}

// ---- loading: phase 1 reads and checks, touching nothing ------------------------------------------

struct PreparedModel {
  std::vector<std::pair<Tensor, Tensor>> copies;  // (live tensor, value on the live tensor's device)
};

struct PreparedOptimizer {
  std::vector<optim::Hyperparameters> options;
  std::vector<std::optional<double>> initial_lrs;
  std::vector<std::pair<Tensor, optim::ParamState>> states;  // for every parameter, empty when none saved
};

// What a load does with NaN and Inf in model tensors and optimizer state.
struct NonFinitePolicy {
  bool allow = false;
  std::vector<std::string>* warnings = nullptr;  // where an allowed one is reported
};

// Refuses (or, when allowed, reports) NaN and Inf in a floating-point tensor read from the file.
void check_finite(const Io& io, const Tensor& host, const std::string& what, const std::string& path,
                  const NonFinitePolicy& policy) {
  const DType d = host.dtype();
  if (d != DType::f64 && d != DType::f32 && d != DType::f16 && d != DType::bf16) return;
  Tensor wide;
  {
    NoGradGuard no_grad;
    wide = host.to(DType::f64).contiguous();  // exact for every narrower float, NaN and Inf included
  }
  const auto* v = static_cast<const double*>(wide.data());
  std::int64_t nans = 0, infs = 0, first = -1;
  for (std::int64_t i = 0; i < wide.numel(); ++i) {
    if (std::isnan(v[i])) ++nans;
    else if (std::isinf(v[i])) ++infs;
    else continue;
    if (first < 0) first = i;
  }
  if (nans + infs == 0) return;
  const std::string text = fmt::format("{} ('{}') holds {} NaN and {} Inf of its {} values (the first at flat index {})",
                                       what, path, nans, infs, wide.numel(), first);
  if (policy.allow) {
    if (policy.warnings != nullptr) policy.warnings->push_back(fmt::format("loaded although {}", text));
    return;
  }
  io.fail(text, "the run had diverged when it saved; resume from an earlier checkpoint, or accept it explicitly "
                "(CheckpointLoadOptions::allow_nonfinite; ampscope train --resume-allow-nonfinite)");
}

// Compares a checkpoint tensor's header with the live tensor it is for; `what` is "parameter 'fc1.weight'".
void check_fits(const Io& io, const TensorHeader& h, const std::string& what, const Tensor& live,
                std::string_view live_side, std::string_view dtype_hint) {
  if (!h.dtype || *h.dtype != live.dtype()) {
    io.fail(fmt::format("{} ('{}') is {} in the checkpoint but {} in the {}", what, h.path, h.type_text,
                        dtype_name(live.dtype()), live_side),
            dtype_hint);
  }
  if (h.shape != live.shape()) {
    io.fail(fmt::format("{} ('{}') has shape {} in the checkpoint but {} in the {}", what, h.path, shape_str(h.shape),
                        shape_str(live.shape()), live_side),
            "build the model with the configuration of the run that saved the checkpoint");
  }
}

PreparedModel read_model(const Io& io, hid_t root, const nn::Module& model, const NonFinitePolicy& finite) {
  if (!has_link(io, root, "/", "model")) {
    io.fail("the file holds no model (no '/model' group)", "it was saved without one; leave Checkpoint::model null");
  }
  const Group group = open_group(io, root, "/", "model");
  const auto live = model_tensors(model);
  std::set<std::string> live_names;
  for (const auto& entry : live) live_names.insert(entry.first);
  for (const std::string& name : link_names(io, group.get(), "/model")) {
    if (live_names.count(name) == 0) {
      io.fail(fmt::format("the checkpoint has parameter '{}' ('/model/{}'), which the model does not have", name, name),
              "the checkpoint was saved from a different model; build the model the saving run built");
    }
  }
  std::set<std::string> buffers;
  for (const auto& entry : model.named_buffers()) buffers.insert(entry.first);
  PreparedModel prepared;
  for (const auto& [name, tensor] : live) {
    if (!has_link(io, group.get(), "/model", name)) {
      io.fail(fmt::format("the checkpoint has no parameter '{}' ('/model/{}'), which the model has", name, name),
              "the checkpoint was saved from a different model; build the model the saving run built");
    }
    const Dataset dset = open_dataset(io, group.get(), "/model", name);
    const TensorHeader h = read_header(io, dset, child_path("/model", name));
    check_fits(io, h, fmt::format("parameter '{}'", name), tensor, "model",
               fmt::format("convert the model with to(DType::{}) before loading, as the saving run did (and build the "
                           "optimizer after that)",
                           h.type_text));
    const Tensor values = read_values(io, dset, h);
    check_finite(io, values, fmt::format("{} '{}'", buffers.count(name) > 0 ? "buffer" : "parameter", name), h.path,
                 finite);
    prepared.copies.emplace_back(tensor, values.to(tensor.device()));
  }
  return prepared;
}

PreparedOptimizer read_optimizer(const Io& io, hid_t root, optim::Optimizer& opt, const NonFinitePolicy& finite) {
  if (!has_link(io, root, "/", "optimizer")) {
    io.fail("the file holds no optimizer (no '/optimizer' group)",
            "it was saved without one; leave Checkpoint::optimizer null");
  }
  const std::vector<std::vector<std::string>> names = optimizer_names(io, opt);
  const Group group = open_group(io, root, "/", "optimizer");
  verify_attributes(io, group.get(), "/optimizer");
  const std::string type = read_string(io, group.get(), "/optimizer", "type");
  if (type != opt.name()) {
    io.fail(fmt::format("the checkpoint holds {} state, but the optimizer is {}", type, opt.name()),
            fmt::format("build a {} optimizer, as the saving run did", type));
  }
  const Group groups = open_group(io, group.get(), "/optimizer", "param_groups");
  const std::vector<std::string> group_names = link_names(io, groups.get(), "/optimizer/param_groups");
  if (group_names.size() != opt.param_groups().size()) {
    io.fail(fmt::format("the checkpoint's {} has {} parameter group(s), but the optimizer has {}", type,
                        group_names.size(), opt.param_groups().size()),
            "build the optimizer with the parameter groups of the saving run");
  }
  PreparedOptimizer prepared;
  std::map<std::string, Tensor> live;  // parameter name -> tensor
  for (std::size_t g = 0; g < names.size(); ++g) {
    const std::string gname = std::to_string(g);
    const std::string path = child_path("/optimizer/param_groups", gname);
    if (!has_link(io, groups.get(), "/optimizer/param_groups", gname)) {
      io.fail(fmt::format("'{}' is missing", path), "the file was not written by save_checkpoint, or was edited");
    }
    const Group gg = open_group(io, groups.get(), "/optimizer/param_groups", gname);
    verify_attributes(io, gg.get(), path);
    const std::vector<std::string> saved = read_string_list(io, gg.get(), path, "params");
    const std::set<std::string> saved_set(saved.begin(), saved.end());
    const std::set<std::string> live_set(names[g].begin(), names[g].end());
    for (const std::string& name : names[g]) {
      if (saved_set.count(name) == 0) {
        io.fail(fmt::format("the optimizer's group {} holds parameter '{}', which the checkpoint's group {} lacks", g,
                            name, g),
                "build the optimizer over the same parameters (and groups) as the saving run");
      }
    }
    for (const std::string& name : saved) {
      if (live_set.count(name) == 0) {
        io.fail(fmt::format("the checkpoint's optimizer group {} holds parameter '{}', which the optimizer's group {} "
                            "does not",
                            g, name, g),
                "build the optimizer over the same parameters (and groups) as the saving run");
      }
    }
    optim::Hyperparameters h;
    h.lr = read_f64(io, gg.get(), path, "lr");
    h.momentum = read_f64(io, gg.get(), path, "momentum");
    h.dampening = read_f64(io, gg.get(), path, "dampening");
    h.nesterov = read_bool(io, gg.get(), path, "nesterov");
    {
      const OpenAttribute betas = open_attribute(io, gg.get(), path, "betas");
      expect_kind(io, betas, ValueKind::f64, 2);
      io.check(H5Aread(betas.attr.get(), H5T_NATIVE_DOUBLE, h.betas.data()), "H5Aread", betas.where);
    }
    h.eps = read_f64(io, gg.get(), path, "eps");
    h.amsgrad = read_bool(io, gg.get(), path, "amsgrad");
    h.weight_decay = read_f64(io, gg.get(), path, "weight_decay");
    h.maximize = read_bool(io, gg.get(), path, "maximize");
    std::optional<double> initial_lr;
    if (io.check(H5Aexists(gg.get(), "initial_lr"), "H5Aexists", path + "@initial_lr") > 0) {
      initial_lr = read_f64(io, gg.get(), path, "initial_lr");
    }
    prepared.options.push_back(h);
    prepared.initial_lrs.push_back(initial_lr);
    const auto& params = opt.param_groups()[g].params;
    for (std::size_t i = 0; i < params.size(); ++i) live.emplace(names[g][i], params[i]);
  }

  const Group states = open_group(io, group.get(), "/optimizer", "state");
  std::map<std::string, optim::ParamState> loaded;
  for (const std::string& name : link_names(io, states.get(), "/optimizer/state")) {
    const auto it = live.find(name);
    if (it == live.end()) {
      io.fail(fmt::format("the checkpoint has optimizer state for '{}', which is not a parameter of the optimizer",
                          name),
              "build the optimizer over the same parameters as the saving run");
    }
    const Tensor& param = it->second;
    const std::string path = child_path("/optimizer/state", name);
    const Group ps = open_group(io, states.get(), "/optimizer/state", name);
    verify_attributes(io, ps.get(), path);
    optim::ParamState s;
    s.step = read_i64(io, ps.get(), path, "step");
    for (const std::string& field : link_names(io, ps.get(), path)) {
      const StateMember member = state_field(field);
      if (member == nullptr) {
        io.fail(fmt::format("'{}' holds '{}', which is not optimizer state (expected momentum_buffer, exp_avg, "
                            "exp_avg_sq, max_exp_avg_sq)",
                            path, field),
                "the file was not written by save_checkpoint, or was edited");
      }
      const Dataset dset = open_dataset(io, ps.get(), path, field);
      const TensorHeader h = read_header(io, dset, child_path(path, field));
      check_fits(io, h, fmt::format("optimizer state {} of '{}'", field, name), param, "parameter",
                 fmt::format("convert the model with to(DType::{}) before building the optimizer, as the saving run "
                             "did",
                             h.type_text));
      const Tensor values = read_values(io, dset, h);
      check_finite(io, values, fmt::format("optimizer state {} of '{}'", field, name), h.path, finite);
      s.*member = values.to(param.device());
    }
    loaded.emplace(name, std::move(s));
  }
  for (const auto& [name, param] : live) {
    const auto it = loaded.find(name);
    prepared.states.emplace_back(param, it == loaded.end() ? optim::ParamState{} : std::move(it->second));
  }
  return prepared;
}

std::pair<std::uint64_t, std::uint64_t> read_generator(const Io& io, hid_t root, const std::string& name) {
  auto missing = [&] {
    io.fail(fmt::format("the file holds no generator '{}' (no '/generators/{}')", name, name),
            "it was saved without it; leave it out of Checkpoint::generators");
  };
  if (!has_link(io, root, "/", "generators")) missing();
  const Group group = open_group(io, root, "/", "generators");
  if (!has_link(io, group.get(), "/generators", name)) missing();
  const std::string path = child_path("/generators", name);
  const Group g = open_group(io, group.get(), "/generators", name);
  verify_attributes(io, g.get(), path);
  return {read_u64(io, g.get(), path, "seed"), read_u64(io, g.get(), path, "offset")};
}

std::string_view value_kind_name(const StateValue& v) {
  switch (v.index()) {
    case 0: return "a double";
    case 1: return "an integer";
    case 2: return "a bool";
    case 3: return "a string";
    default: return "a tensor";
  }
}

StateDict read_state_dict(const Io& io, hid_t root, const std::string& name, const StateDict& expected) {
  auto missing = [&] {
    io.fail(fmt::format("the file holds no state '{}' (no '/states/{}')", name, name),
            "it was saved without it; leave it out of Checkpoint::states");
  };
  if (!has_link(io, root, "/", "states")) missing();
  const Group group = open_group(io, root, "/", "states");
  if (!has_link(io, group.get(), "/states", name)) missing();
  const std::string path = child_path("/states", name);
  const Group sg = open_group(io, group.get(), "/states", name);
  verify_attributes(io, sg.get(), path);
  StateDict state;
  for (const std::string& key : value_names(io, sg.get(), path)) {
    const OpenAttribute a = open_attribute(io, sg.get(), path, key);
    const ValueKind kind = kind_of(io, a);
    if (!a.scalar || kind == ValueKind::other || kind == ValueKind::u64) {
      io.fail(fmt::format("state '{}' key '{}' ('{}') is {} with {} value(s); a state value is one double, integer, "
                          "bool or string",
                          name, key, a.where, describe_type(io, a.type.get(), a.where), a.count),
              "the file was not written by save_checkpoint, or was edited");
    }
    switch (kind) {
      case ValueKind::f64: {
        double v = 0;
        io.check(H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v), "H5Aread", a.where);
        state.emplace(key, v);
        break;
      }
      case ValueKind::i64: {
        std::int64_t v = 0;
        io.check(H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v), "H5Aread", a.where);
        state.emplace(key, v);
        break;
      }
      case ValueKind::boolean: state.emplace(key, read_bool_value(io, a)); break;
      default: state.emplace(key, read_string_value(io, a)); break;
    }
  }
  for (const std::string& key : link_names(io, sg.get(), path)) {
    const Dataset dset = open_dataset(io, sg.get(), path, key);
    const TensorHeader h = read_header(io, dset, child_path(path, key));
    state.emplace(key, read_values(io, dset, h));
  }
  if (expected.empty()) return state;

  for (const auto& [key, want] : expected) {
    const auto it = state.find(key);
    if (it == state.end()) {
      io.fail(fmt::format("state '{}' lacks key '{}' (expected {})", name, key, value_kind_name(want)),
              "the checkpoint was saved by a different version of the program, or without this setting");
    }
    const StateValue& got = it->second;
    if (got.index() != want.index()) {
      io.fail(fmt::format("state '{}' key '{}' is {} in the checkpoint, but {} is expected", name, key,
                          value_kind_name(got), value_kind_name(want)),
              "the checkpoint was saved by a different version of the program");
    }
    if (const Tensor* wt = std::get_if<Tensor>(&want); wt != nullptr && wt->defined()) {
      const Tensor& gt = std::get<Tensor>(got);
      if (gt.dtype() != wt->dtype() || gt.shape() != wt->shape()) {
        io.fail(fmt::format("state '{}' key '{}' is a {} tensor of shape {} in the checkpoint, but a {} tensor of "
                            "shape {} is expected",
                            name, key, dtype_name(gt.dtype()), shape_str(gt.shape()), dtype_name(wt->dtype()),
                            shape_str(wt->shape())));
      }
    }
  }
  for (const auto& [key, value] : state) {
    if (expected.count(key) == 0) {
      io.fail(fmt::format("state '{}' has key '{}' ({}), which is not expected", name, key, value_kind_name(value)),
              "the checkpoint was saved by a different version of the program; pass an empty StateDict to accept "
              "any keys");
    }
  }
  return state;
}

// The whole-file checksum (from this version on): a 512-byte user block before HDF5's superblock holds
// kUserBlockMagic, the byte count after the block (u64 LE) and zlib's CRC-32 of those bytes (u32 LE).
// HDF5 1.10's default format checksums none of its own metadata, and a flipped byte in an object header
// can crash HDF5 itself (H5Fclose, found by tests/trace/trace_fuzz_test.cpp): with the check done first,
// HDF5 only ever parses the bytes that were saved.
constexpr std::size_t kUserBlockBytes = 512;
constexpr char kUserBlockMagic[32] = "ampscope checkpoint file crc32";

std::uint32_t file_crc(const unsigned char* data, std::uint64_t n) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::uint64_t>(n, std::uint64_t{1} << 30));
    crc = ::crc32(crc, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

// Checks the user block's checksum of `path` before HDF5 sees it. Files without the block (saved before it
// existed) pass; a file whose HDF5 signature sits after a user block without our magic is refused (the
// block itself is damaged).
void verify_file_checksum(const Io& io, const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return;  // open_checkpoint says why
  std::vector<unsigned char> block(kUserBlockBytes + 8);
  const std::size_t got = std::fread(block.data(), 1, block.size(), f);
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const bool magic = got >= sizeof kUserBlockMagic + 12 && std::memcmp(block.data(), kUserBlockMagic, sizeof kUserBlockMagic) == 0;
  const bool signature_after_block = got == block.size() && std::memcmp(block.data() + kUserBlockBytes, kSignature, 8) == 0;
  if (!magic) {
    std::fclose(f);
    if (signature_after_block) {
      io.fail("its checksum block (the first 512 bytes) is damaged", "a damaged checkpoint cannot be trusted; use an earlier one");
    }
    return;
  }
  std::uint64_t rest = 0;
  std::uint32_t stored = 0;
  for (int i = 0; i < 8; ++i) rest |= std::uint64_t{block[sizeof kUserBlockMagic + i]} << (8 * i);
  for (int i = 0; i < 4; ++i) stored |= std::uint32_t{block[sizeof kUserBlockMagic + 8 + i]} << (8 * i);
  std::fseek(f, static_cast<long>(kUserBlockBytes), SEEK_SET);
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::uint64_t total = 0;
  std::vector<unsigned char> buffer(std::size_t{1} << 20);
  for (std::size_t n; (n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0;) {
    crc = ::crc32(crc, buffer.data(), static_cast<uInt>(n));
    total += n;
  }
  std::fclose(f);
  if (total != rest) {
    io.fail(fmt::format("it holds {} bytes after its checksum block, but was saved with {}: it was cut short or extended",
                        total, rest),
            "a checkpoint cut short (disk full, copied while being written) cannot be repaired; use an earlier one");
  }
  if (static_cast<std::uint32_t>(crc) != stored) {
    io.fail(fmt::format("its bytes do not match the file checksum (stored {:08x}, computed {:08x}): the file was changed "
                        "after it was saved",
                        stored, static_cast<std::uint32_t>(crc)),
            "a damaged checkpoint cannot be trusted; resume from an earlier one");
  }
}

// Opens an existing checkpoint for reading, with messages for the common ways a path is not one.
File open_checkpoint(const Io& io, const std::filesystem::path& path) {
  // Only regular files we may read: HDF5 blocks forever on a FIFO and calls an unreadable file "not HDF5".
  if (const std::string reason = hdf5::unreadable_reason(path.c_str()); !reason.empty()) io.fail(reason);
  verify_file_checksum(io, path);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0) {
    io.fail(fmt::format("it is not an HDF5 file ({} bytes, no HDF5 signature)", ec ? 0 : size),
            "checkpoints are written by save_checkpoint; is this the right path?");
  }
  io.check(is_hdf5, "H5Fis_hdf5", "/");
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    io.fail(fmt::format("HDF5 cannot open it ({} bytes; it may be truncated or damaged)\nHDF5 error stack:\n{}",
                        ec ? 0 : size, take_errors()),
            "a checkpoint cut short (disk full, copied while being written) cannot be repaired; use an earlier one");
  }
  return File(id);
}

// Removes temporary files of `target` (".NAME.tmp-PID-N") left by saves whose process no longer exists:
// a save killed half-way (kill -9, out of memory) leaves one. A file of a live process is left alone, as
// that process may be saving right now; so is one whose PID was reused by an unrelated process (it goes
// once that process ends). PIDs are those of this machine's PID namespace: a folder shared between
// machines (NFS) can hold files of PIDs that mean nothing here, and those are removed too when no local
// process has the PID, which is safe for a target that only one machine writes.
void remove_stale_temporaries(const std::filesystem::path& directory, const std::string& target) {
  const std::string prefix = fmt::format(".{}.tmp-", target);
  std::error_code ec;
  std::filesystem::directory_iterator it(directory, ec);
  if (ec) return;  // the save reports an unusable folder itself
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string_view rest = std::string_view(name).substr(prefix.size());  // "PID-N"
    const std::size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string_view::npos || dash + 1 == rest.size()) continue;
    const std::string_view pid_text = rest.substr(0, dash), counter = rest.substr(dash + 1);
    auto digits = [](std::string_view t) { return std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }); };
    if (!digits(pid_text) || !digits(counter) || pid_text.size() > 9) continue;
    const auto pid = static_cast<pid_t>(std::stol(std::string(pid_text)));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (EPERM: alive, another user's)
    std::error_code ignored;
    std::filesystem::remove(entry.path(), ignored);
  }
}

// Builds the whole checkpoint in memory (HDF5's core driver, nothing touches the disk) and returns the
// file's image.
std::vector<unsigned char> checkpoint_image(const Io& io, const Checkpoint& what) {
  const hdf5::PropertyList fapl(io.check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", "/"));
  io.check(H5Pset_fapl_core(fapl.get(), std::size_t{1} << 20, false), "H5Pset_fapl_core", "/");
  // A user block (which HDF5, h5py and h5dump skip) holds the checksum of everything after it: checked
  // before HDF5 parses anything (see verify_file_checksum).
  const hdf5::PropertyList fcpl(io.check(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate", "/"));
  io.check(H5Pset_userblock(fcpl.get(), kUserBlockBytes), "H5Pset_userblock", "/");
  File file(io.check(H5Fcreate("ampscope-checkpoint-in-memory.h5", H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                     "H5Fcreate", "(in memory)"));
  write_checkpoint(io, file.get(), what);
  io.check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "H5Fflush", "(in memory)");
  const ssize_t size = io.check(H5Fget_file_image(file.get(), nullptr, 0), "H5Fget_file_image", "(in memory)");
  std::vector<unsigned char> image(static_cast<std::size_t>(size));
  io.check(H5Fget_file_image(file.get(), image.data(), image.size()), "H5Fget_file_image", "(in memory)");
  file.close(io, "H5Fclose", "(in memory)");
  // HDF5 1.10's image starts at the superblock, without the user block it reserved: put the block in front.
  static constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (image.size() >= 8 && std::memcmp(image.data(), kSignature, 8) == 0) {
    image.insert(image.begin(), kUserBlockBytes, 0);
  } else if (image.size() < kUserBlockBytes + 8 || std::memcmp(image.data() + kUserBlockBytes, kSignature, 8) != 0) {
    io.fail("HDF5's file image has its signature neither at 0 nor after the user block");
  }
  std::fill_n(image.begin(), kUserBlockBytes, 0);
  std::memcpy(image.data(), kUserBlockMagic, sizeof kUserBlockMagic);
  const std::uint64_t rest = image.size() - kUserBlockBytes;
  const std::uint32_t crc = file_crc(image.data() + kUserBlockBytes, rest);
  for (int i = 0; i < 8; ++i) image[sizeof kUserBlockMagic + i] = static_cast<unsigned char>(rest >> (8 * i));
  for (int i = 0; i < 4; ++i) image[sizeof kUserBlockMagic + 8 + i] = static_cast<unsigned char>(crc >> (8 * i));
  return image;
}

// Writes `image` to a new file `path` and flushes it to the disk. Returns "" or what failed.
std::string write_file(const std::filesystem::path& path, const std::vector<unsigned char>& image) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("creating '{}' failed: {}", path.string(), std::strerror(errno));
  std::string problem;
  std::size_t done = 0;
  while (done < image.size() && problem.empty()) {
    const ssize_t n = ::write(fd, image.data() + done, image.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      problem = fmt::format("writing '{}' failed after {} of {} bytes: {}", path.string(), done, image.size(),
                            n < 0 ? std::strerror(errno) : "no progress");
    } else {
      done += static_cast<std::size_t>(n);
    }
  }
  if (problem.empty() && ::fsync(fd) != 0) {
    problem = fmt::format("flushing '{}' to disk failed: {}", path.string(), std::strerror(errno));
  }
  if (::close(fd) != 0 && problem.empty()) {
    problem = fmt::format("closing '{}' failed: {}", path.string(), std::strerror(errno));
  }
  return problem;
}

}  // namespace

// ---- the public functions --------------------------------------------------------------------------

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& what) {
  const Io io(path, "save");
  const QuietHdf5Errors quiet;
  std::filesystem::path directory = path.parent_path();
  if (directory.empty()) directory = ".";
  std::error_code ec;
  if (path.filename().empty()) io.fail("the path names no file");
  if (!std::filesystem::exists(directory, ec)) {
    io.fail(fmt::format("directory '{}' does not exist", directory.string()), "create it first");
  }
  if (!std::filesystem::is_directory(directory, ec)) io.fail(fmt::format("'{}' is not a directory", directory.string()));
  remove_stale_temporaries(directory, path.filename().string());
  const std::vector<unsigned char> image = checkpoint_image(io, what);
  // Beside the target, so the rename stays within one file system (and so is atomic). The name is
  // unique per process and call; a crash can leave one behind (the next save removes it), never a
  // damaged target.
  static std::atomic<std::uint64_t> counter{0};
  const std::filesystem::path temporary =
      directory / fmt::format(".{}.tmp-{}-{}", path.filename().string(), ::getpid(), counter.fetch_add(1));
  try {
    if (const std::string problem = write_file(temporary, image); !problem.empty()) {
      io.fail(problem, problem.find(std::strerror(ENOSPC)) != std::string::npos
                           ? "the disk is full; the previous checkpoint (if any) is untouched. Free some space, or "
                             "choose another --checkpoint folder"
                           : "");
    }
    std::filesystem::rename(temporary, path, ec);
    if (ec) io.fail(fmt::format("renaming '{}' over it failed: {}", temporary.string(), ec.message()));
  } catch (...) {
    std::filesystem::remove(temporary, ec);
    throw;
  }
  // Makes the rename itself durable. Some file systems refuse fsync on a directory; the checkpoint is
  // complete either way, so that is not an error.
  sync_path(directory, true);
}

CheckpointLoadReport load_checkpoint(const std::filesystem::path& path, Checkpoint& into,
                                     const CheckpointLoadOptions& options) {
  Io io(path, "load");
  CheckpointLoadReport report;
  const NonFinitePolicy finite{.allow = options.allow_nonfinite, .warnings = &report.warnings};
  const QuietHdf5Errors quiet;
  const File file = open_checkpoint(io, path);
  const Group root(io.check(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2", "/"));

  // Phase 1: read and check everything; nothing live changes here.
  if (io.check(H5Aexists(root.get(), "format"), "H5Aexists", "/@format") <= 0 ||
      read_string(io, root.get(), "/", "format") != kFormatName) {
    io.fail(fmt::format("it is an HDF5 file but not an ampscope checkpoint (its root has no format = \"{}\" attribute)",
                        kFormatName),
            "checkpoints are written by save_checkpoint; is this a trace file?");
  }
  const std::int64_t version = read_i64(io, root.get(), "/", "format_version");
  if (version < 1 || version > kCheckpointFormatVersion) {
    io.fail(fmt::format("its format version is {}, but this build reads versions 1 to {}", version,
                        kCheckpointFormatVersion),
            version > kCheckpointFormatVersion ? "it was written by a newer ampscope; load it with that version" : "");
  }
  // A version 2 file whose version number was damaged to 1 still has its checksums: verify them, and the
  // root's own check names the damaged format_version.
  const bool has_checksums =
      version >= 2 || io.check(H5Aexists(root.get(), kCrcName), "H5Aexists", fmt::format("/@{}", kCrcName)) > 0;
  report.format_version = version;
  report.checksums_verified = has_checksums;
  io.verify_checksums = has_checksums;
  if (has_checksums) {
    verify_attributes(io, root.get(), "/");
  } else {
    report.warnings.push_back(fmt::format("'{}' is a version {} checkpoint, which has no checksums: its values were "
                                          "checked for shape, type and NaN/Inf, but damage to them cannot be detected "
                                          "(save it again to get checksums)",
                                          path.string(), version));
  }
  const std::int64_t step = read_i64(io, root.get(), "/", "step");
  PreparedModel model;
  if (into.model != nullptr) model = read_model(io, root.get(), *into.model, finite);
  PreparedOptimizer optimizer;
  if (into.optimizer != nullptr) optimizer = read_optimizer(io, root.get(), *into.optimizer, finite);
  std::vector<std::pair<Generator*, std::pair<std::uint64_t, std::uint64_t>>> generators;
  for (const auto& [name, gen] : into.generators) {
    if (gen == nullptr) io.fail(fmt::format("generator '{}' is a null pointer", name));
    generators.emplace_back(gen, read_generator(io, root.get(), name));
  }
  std::map<std::string, StateDict> states;
  for (const auto& [name, expected] : into.states) {
    states.emplace(name, read_state_dict(io, root.get(), name, expected));
  }

  // Phase 2: apply. Nothing below reads the file or can fail on its contents.
  {
    NoGradGuard no_grad;  // parameters are leaves that require grad; this copy is not part of any graph
    for (auto& [live, value] : model.copies) live.copy_(value);
  }
  if (into.optimizer != nullptr) {
    auto& groups = into.optimizer->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      groups[g].options = optimizer.options[g];
      groups[g].initial_lr = optimizer.initial_lrs[g];
    }
    for (auto& [param, state] : optimizer.states) into.optimizer->state(param) = std::move(state);
  }
  for (auto& [gen, seed_offset] : generators) {
    gen->manual_seed(seed_offset.first);
    gen->set_offset(seed_offset.second);
  }
  for (auto& [name, state] : states) into.states[name] = std::move(state);
  into.step = step;
  return report;
}

}  // namespace ampscope
