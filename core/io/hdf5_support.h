// core/io/hdf5_support.h: the HDF5 plumbing shared by checkpoints (core/io/checkpoint.cpp) and traces
// (probes/trace_*.cpp): one owning handle per HDF5 id type, the text of HDF5's error stack, and a guard
// that keeps HDF5 from printing errors to stderr. Header-only and free of the runtime (HDF5 and fmt
// only), so the trace library, which must build without the runtime, can use it too. Each user keeps
// its own checker (`Io`: the file, the verb and its own exception type) and passes it to close().
//
//   hdf5::QuietErrors quiet;
//   hdf5::File file(io.check(H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", "/"));
//   file.close(io, "H5Fclose", "/");   // checked; the destructor closes unchecked
#pragma once

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace ampscope::hdf5 {

// Copies the calling thread's HDF5 error stack into text (one line per frame, innermost last) and
// clears it.
inline std::string take_errors() {
  const hid_t stack = H5Eget_current_stack();  // a copy; the thread's stack is cleared
  if (stack < 0) return "  (HDF5's error stack could not be read)";
  std::string text;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto message = [](hid_t id) {
      char buffer[256] = {};
      H5E_type_t type;
      return H5Eget_msg(id, &type, buffer, sizeof buffer) > 0 ? std::string(buffer) : std::string("?");
    };
    *static_cast<std::string*>(data) += fmt::format("  {}(): {} [{}: {}]\n", e->func_name ? e->func_name : "?",
                                                    e->desc ? e->desc : "", message(e->maj_num), message(e->min_num));
    return 0;
  };
  H5Ewalk2(stack, H5E_WALK_DOWNWARD, walk, &text);
  H5Eclose_stack(stack);
  if (text.empty()) return "  (HDF5 reported no details)";
  text.pop_back();  // the last newline
  return text;
}

// Why `path` cannot be opened as an HDF5 file we read, before HDF5 sees it: "" when it is a regular file
// this process may read, else one phrase ("it does not exist", "it is a FIFO (named pipe), not a regular
// file", "permission denied"). Only regular files are opened: HDF5 would block forever on a FIFO and
// report a directory, a device or an unreadable file as "not an HDF5 file". Used by the trace reader
// and the checkpoint loader.
inline std::string unreadable_reason(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) {
    const int error = errno;
    if (error == ENOENT) return "it does not exist";
    if (error == EACCES) return "permission denied (a folder on its path cannot be searched)";
    return fmt::format("it cannot be examined: {}", std::strerror(error));
  }
  std::string_view kind;
  if (S_ISDIR(st.st_mode)) kind = "a directory";
  else if (S_ISFIFO(st.st_mode)) kind = "a FIFO (named pipe)";
  else if (S_ISCHR(st.st_mode)) kind = "a character device";
  else if (S_ISBLK(st.st_mode)) kind = "a block device";
  else if (S_ISSOCK(st.st_mode)) kind = "a socket";
  else if (!S_ISREG(st.st_mode)) kind = "not a file";
  if (!kind.empty()) return fmt::format("it is {}, not a regular file", kind);
  // The open itself tells whether we may read it (access() would ask about the real, not the effective,
  // user). A regular file never blocks here.
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == EACCES || error == EPERM) return "permission denied (the file is not readable by this user)";
    return fmt::format("it cannot be opened: {}", std::strerror(error));
  }
  ::close(fd);
  return {};
}

// Turns off HDF5's printing of errors to stderr while the guard lives: errors become exceptions with
// the same text instead. The previous handler is put back.
class QuietErrors {
 public:
  QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &function_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, function_, data_); }
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t function_ = nullptr;
  void* data_ = nullptr;
};

// One owning handle per HDF5 id type, closed by the matching H5?close. Movable, not copyable; the
// destructor never throws (a failed close there is ignored; close() reports it where it matters).
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports a failure through the caller's checker (closing a file flushes it, which can
  // fail).
  template <class Io>
  void close(const Io& io, std::string_view call, std::string_view object) {
    io.check(Close(std::exchange(id_, H5I_INVALID_HID)), call, object);
  }
  void reset() noexcept {
    if (id_ >= 0) Close(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using Attribute = Handle<H5Aclose>;
using PropertyList = Handle<H5Pclose>;

}  // namespace ampscope::hdf5
