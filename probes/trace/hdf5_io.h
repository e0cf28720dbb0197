// probes/trace/hdf5_io.h: the HDF5 plumbing the trace writer and reader share (internal to ampscope_trace):
// one owning handle per HDF5 id type, the one checked call wrapper whose exception carries HDF5's error
// stack with the file and dataset, and a guard that keeps HDF5 from printing errors to stderr.
//
//   detail::Io io(path, "read");
//   detail::File file(io.check(H5Fopen(...), "H5Fopen", "/"));   // throws TraceError on failure
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/io/hdf5_support.h"
#include "probes/trace/error.h"

namespace ampscope::trace::detail {

// The handles, the error-stack text and the quiet guard are shared with checkpoints (core/io/hdf5_support.h).
inline std::string take_hdf5_errors() { return hdf5::take_errors(); }
using QuietHdf5Errors = hdf5::QuietErrors;

// The file being written or read, for messages: every error starts "cannot VERB trace 'PATH': ".
class Io {
 public:
  Io(std::string path, std::string_view verb) : path_(std::move(path)), verb_(verb) {}

  const std::string& path() const { return path_; }
  // A hint added to every failed HDF5 call's message (the reader: the file may be damaged).
  void set_call_hint(std::string hint) { call_hint_ = std::move(hint); }

  [[noreturn]] void fail(std::string_view problem, std::string_view hint = {}) const;

  // The one check of every HDF5 call: a negative result throws with the call, the object (a dataset or
  // attribute in the file) and HDF5's own error stack.
  template <class T>
  T check(T result, std::string_view call, std::string_view object) const {
    if (result < 0) fail_call(call, object);
    return result;
  }

 private:
  [[noreturn]] void fail_call(std::string_view call, std::string_view object) const;
  std::string path_;
  std::string_view verb_;
  std::string call_hint_;
};

using hdf5::Attribute;
using hdf5::Dataset;
using hdf5::Dataspace;
using hdf5::Datatype;
using hdf5::File;
using hdf5::Group;
using hdf5::PropertyList;

Datatype copy_type(const Io& io, hid_t predefined);
// Fixed-length string of `width` bytes, NUL-terminated (so at most width - 1 bytes of text: h5dump then
// prints the text alone, not its padding), UTF-8.
Datatype fixed_text_type(const Io& io, std::size_t width);
// Variable-length UTF-8 string: what h5py writes for a Python str, and reads back as one.
Datatype variable_text_type(const Io& io);
// h5py's bool: an int8 enumeration {FALSE = 0, TRUE = 1}; numpy reads it as bool, h5dump as FALSE/TRUE.
Datatype bool_type(const Io& io);

// Root (or dataset) attributes, created before SWMR writing starts. `where` names the object in messages.
void write_text_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::string_view value);
void write_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::int64_t value);
// Overwrites an existing integer attribute in place (allowed while SWMR writing, unlike creating one).
void rewrite_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name, std::int64_t value);

// The longest text attribute a reader accepts (the run's config is the longest, a few KB).
inline constexpr std::size_t kMaxTextAttribute = std::size_t{16} << 20;

// Reading: nullopt when the attribute does not exist; a clear error when it has another type, or is
// longer than kMaxTextAttribute. Variable-length strings (format_version 1 and 2) are read by
// read_variable_text, never through HDF5's global heap code.
std::optional<std::string> read_text_attribute(const Io& io, hid_t object, std::string_view where, const char* name);
// A variable-length string attribute's text, read from its global heap collection by our own code, every
// size checked (HDF5 1.10's reader crashes or hangs on a damaged collection): TraceError when damaged.
std::string read_variable_text(const Io& io, hid_t object, hid_t attribute, hid_t type, const std::string& path);
std::optional<std::int64_t> read_int_attribute(const Io& io, hid_t object, std::string_view where, const char* name);

}  // namespace ampscope::trace::detail
