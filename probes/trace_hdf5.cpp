#include "probes/trace_hdf5.h"

#include <fmt/format.h>

#include <vector>

namespace ampscope::trace::detail {

void Io::fail(std::string_view problem, std::string_view hint) const {
  std::string message = fmt::format("cannot {} trace '{}': {}", verb_, path_, problem);
  if (!hint.empty()) message += fmt::format("\nhint: {}", hint);
  throw TraceError(message);
}

void Io::fail_call(std::string_view call, std::string_view object) const {
  fail(fmt::format("{} failed on '{}'\nHDF5 error stack:\n{}", call, object, take_hdf5_errors()), call_hint_);
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

}  // namespace

void write_text_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::string_view value) {
  const Datatype type = variable_text_type(io);
  const std::string text(value);  // NUL-terminated
  const char* pointer = text.c_str();
  write_attribute(io, object, where, name, type.get(), &pointer);
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
    const Datatype memory = variable_text_type(io);
    char* value = nullptr;
    io.check(H5Aread(a->attr.get(), memory.get(), &value), "H5Aread", a->path);
    std::string text = value ? value : "";
    H5free_memory(value);
    return text;
  }
  const std::size_t size = H5Tget_size(a->type.get());
  if (size == 0) io.fail(fmt::format("attribute '{}' has a string type of size 0", a->path));
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

}  // namespace ampscope::trace::detail
