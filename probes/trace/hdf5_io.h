// probes/trace/hdf5_io.h: the HDF5 plumbing the trace writer and reader share (internal to ampscope_trace):
// one owning handle per HDF5 id type, the one checked call wrapper whose exception carries HDF5's error
// stack with the file and dataset, a guard that keeps HDF5 from printing errors to stderr, and the file
// driver the writer uses so that a full disk is a clean error.
//
//   detail::Io io(path, "read");
//   detail::File file(io.check(H5Fopen(...), "H5Fopen", "/"));   // throws TraceError on failure
//
//   detail::StorageFailure storage;                      // the writer: lives longer than the file
//   io.watch(storage);                                   // every checked call also checks the disk
//   detail::PropertyList fapl = detail::write_access(io, storage);   // H5Fcreate(path, ..., fapl.get())
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/io/hdf5_support.h"
#include "probes/trace/error.h"

namespace ampscope::trace::detail {

// The handles, the error-stack text and the quiet guard are shared with checkpoints (core/io/hdf5_support.h).
inline std::string take_hdf5_errors() { return hdf5::take_errors(); }
using QuietHdf5Errors = hdf5::QuietErrors;

// What went wrong underneath a file being written (a full disk, a quota, an I/O error), as the file
// driver of write_access() saw it: the first failed write, truncate or close.
struct StorageFailure {
  int error = 0;          // its errno; 0 while nothing failed
  std::string operation;  // "writing 4096 bytes at byte 12288"
  bool failed() const { return error != 0; }
  // "no space left on device", "disk quota exceeded", ...: strerror's text, lower case.
  std::string problem() const;
};

// The file being written or read, for messages: every error starts "cannot VERB trace 'PATH': ".
class Io {
 public:
  Io(std::string path, std::string_view verb) : path_(std::move(path)), verb_(verb) {}

  const std::string& path() const { return path_; }
  // A hint added to every failed HDF5 call's message (the reader: the file may be damaged; the writer:
  // which steps the file holds).
  void set_call_hint(std::string hint) { call_hint_ = std::move(hint); }
  // From now on every check() also fails, with the storage's problem ("no space left on device") rather
  // than HDF5's, once the file driver of write_access() has seen a write fail. `storage` must outlive this.
  void watch(const StorageFailure& storage) { storage_ = &storage; }

  [[noreturn]] void fail(std::string_view problem, std::string_view hint = {}) const;

  // The one check of every HDF5 call: a negative result throws with the call, the object (a dataset or
  // attribute in the file) and HDF5's own error stack; a failed write underneath (see watch) throws with
  // its problem, even though HDF5 itself saw no error.
  template <class T>
  T check(T result, std::string_view call, std::string_view object) const {
    if (result < 0) fail_call(call, object);
    if (storage_ != nullptr && storage_->failed()) {
      // The call succeeded for HDF5: an id it made would reach no handle, and keep the file open.
      if constexpr (std::is_same_v<T, hid_t>) H5Idec_ref(result);
      fail_call(call, object);
    }
    return result;
  }

 private:
  [[noreturn]] void fail_call(std::string_view call, std::string_view object) const;
  std::string path_;
  std::string_view verb_;
  std::string call_hint_;
  const StorageFailure* storage_ = nullptr;
};

using hdf5::Attribute;
using hdf5::Dataset;
using hdf5::Dataspace;
using hdf5::Datatype;
using hdf5::File;
using hdf5::Group;
using hdf5::PropertyList;

// A file access property list for creating a file to write through our file driver: HDF5's POSIX one
// ("sec2") call for call (the same bytes in the file, which any HDF5 reader reads) until a write,
// truncate or close fails. That failure is recorded in `storage`, and from then on the file on disk is
// left as it was: HDF5's later writes (its metadata, as it closes the file) are kept in memory, read
// back from there, and reported as done. So HDF5 never sees a failed write: one that fails inside HDF5
// leaves its caches inconsistent, and closing such a file, or the library at exit, crashes, loops or
// prints to stderr. The file keeps what was durable before the failure, as if the writer had been
// killed then; check() reports the failure (see watch).
PropertyList write_access(const Io& io, StorageFailure& storage);

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
