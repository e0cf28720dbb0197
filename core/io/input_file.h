// core/io/input_file.h (internal): opening and reading files that come from elsewhere (model folders,
// tokenizer and token files, --text) so that no file can block the program or make it read without end.
//
// Only regular files are opened. A FIFO would block open() until something writes to it; a character device
// (a config.json linked to /dev/zero) has no size and never ends; opening some devices has effects of its
// own. So the path is stat()ed first (symbolic links followed: Hugging Face's cache links every file of a
// snapshot to a blob) and anything else is refused before open(); open() then uses O_NONBLOCK, so a FIFO
// swapped in between cannot block it either, and fstat() checks the file actually opened. Sizes are checked
// against the caller's limit before anything is read.
//
//   ampscope::detail::InputFile f;
//   if (auto problem = ampscope::detail::open_input_file(path, f)) throw MyError(problem->describe());
//   ::pread(f.fd(), buffer, n, offset);  // f.size() bytes, a regular file
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace ampscope::detail {

// Why a file was not opened or read.
struct FileProblem {
  enum class Kind {
    cannot_open,  // stat() or open() failed: `what` is the system's text ("No such file or directory")
    not_regular,  // `what` names what it is instead: "a FIFO (named pipe)", "a directory", "a character device"
    too_large,    // `size` is more than `limit`
    read_failed,  // `what` is the system's text, or says the file changed size while it was read
  };
  Kind kind = Kind::cannot_open;
  std::string what;
  std::uint64_t size = 0, limit = 0;
  int error = 0;  // errno for cannot_open and read_failed

  // One phrase for a message: "cannot open it: No such file or directory", "not a regular file: it is a FIFO
  // (named pipe)", "it is 5000000 bytes, more than the 1048576 this reader takes", "cannot read it: ...".
  std::string describe() const {
    switch (kind) {
      case Kind::cannot_open: return "cannot open it: " + what;
      case Kind::not_regular: return "not a regular file: it is " + what;
      case Kind::too_large: return fmt::format("it is {} bytes, more than the {} this reader takes", size, limit);
      case Kind::read_failed: break;
    }
    return "cannot read it: " + what;
  }
};

// What a file that is not regular is, for a message: "a FIFO (named pipe)", ...
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

class InputFile;
inline std::optional<FileProblem> open_input_file(const std::filesystem::path& path, InputFile& out);

// A read-only descriptor of a regular file, closed with the object. Movable.
class InputFile {
 public:
  InputFile() = default;
  InputFile(InputFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  InputFile& operator=(InputFile&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = std::exchange(other.fd_, -1);
      size_ = other.size_;
    }
    return *this;
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { close(); }

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }  // at open
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  friend std::optional<FileProblem> open_input_file(const std::filesystem::path& path, InputFile& out);
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Opens `path` into `out` when it is a regular file; otherwise the problem (and `out` stays closed).
inline std::optional<FileProblem> open_input_file(const std::filesystem::path& path, InputFile& out) {
  out.close();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    return FileProblem{FileProblem::Kind::cannot_open, std::strerror(e), 0, 0, e};
  }
  if (!S_ISREG(st.st_mode)) return FileProblem{FileProblem::Kind::not_regular, file_kind(st.st_mode)};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    return FileProblem{FileProblem::Kind::cannot_open, std::strerror(e), 0, 0, e};
  }
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return FileProblem{FileProblem::Kind::cannot_open, std::strerror(e), 0, 0, e};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FileProblem{FileProblem::Kind::not_regular, file_kind(st.st_mode)};
  }
  out.fd_ = fd;
  out.size_ = static_cast<std::uint64_t>(st.st_size);
  return std::nullopt;
}

// Reads exactly `size` bytes at `offset` (pread, EINTR retried); a short read (the file shrank) or an error
// is a read_failed problem.
inline std::optional<FileProblem> read_at(const InputFile& f, std::uint64_t offset, void* into, std::size_t size) {
  auto* p = static_cast<char*>(into);
  while (size > 0) {
    const ssize_t n = ::pread(f.fd(), p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      return FileProblem{FileProblem::Kind::read_failed, std::strerror(e), 0, 0, e};
    }
    if (n == 0) {
      return FileProblem{FileProblem::Kind::read_failed,
                         fmt::format("it ended at byte {}, before the {} bytes it held when opened; it changed while "
                                     "it was read",
                                     offset, f.size())};
    }
    p += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return std::nullopt;
}

// The whole of a regular file of at most max_bytes into `out`.
inline std::optional<FileProblem> read_input_file(const std::filesystem::path& path, std::uint64_t max_bytes,
                                                  std::string& out) {
  out.clear();
  InputFile f;
  if (auto problem = open_input_file(path, f)) return problem;
  if (f.size() > max_bytes) return FileProblem{FileProblem::Kind::too_large, {}, f.size(), max_bytes};
  out.resize(static_cast<std::size_t>(f.size()));
  if (auto problem = read_at(f, 0, out.data(), out.size())) {
    out.clear();
    return problem;
  }
  return std::nullopt;
}

}  // namespace ampscope::detail
