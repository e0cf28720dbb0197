// Files written beside inputs from elsewhere: never through a planted name (core/io/output_file.h).
#include "core/io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {
namespace {

constexpr std::size_t kBufferBytes = std::size_t{1} << 20;

std::string named(std::string_view what, const std::filesystem::path& path) {
  return what.empty() ? fmt::format("'{}'", path.string()) : fmt::format("{} '{}'", what, path.string());
}

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The folder a file named `path` lives in ("" is the working folder).
std::filesystem::path folder_of(const std::filesystem::path& path) {
  return path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
}

}  // namespace

void refuse_unsafe_output(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw Error(fmt::format("cannot examine {}: {}", named(what, path), std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return;  // replaced by a rename, never written through
  if (S_ISLNK(st.st_mode)) {
    std::vector<char> target(4096);
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size() - 1);
    const std::string points = n > 0 ? std::string(target.data(), static_cast<std::size_t>(n)) : std::string("?");
    throw Error(fmt::format("{} is a symbolic link (to '{}'); ampscope never writes through a link, which could "
                            "overwrite whatever it points at\nhint: remove the link (a file that came with a trace may "
                            "point anywhere), or write elsewhere",
                            named(what, path), points));
  }
  throw Error(fmt::format("{} exists and is {}, not a regular file; ampscope will not write to it\nhint: remove it, "
                          "or write elsewhere",
                          named(what, path), kind_of(st.st_mode)));
}

OutputFile::OutputFile(std::filesystem::path target, std::string_view what)
    : target_(std::move(target)), what_(what) {
  refuse_unsafe_output(target_, what_);
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path folder = folder_of(target_);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    temporary_ = folder / fmt::format(".{}.tmp-{}-{}", target_.filename().string(), ::getpid(), counter.fetch_add(1));
    // O_EXCL: a name that exists (a link or a file planted in advance) is never opened; O_NOFOLLOW says so twice.
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ >= 0) return;
    if (errno != EEXIST) break;
  }
  throw Error(fmt::format("cannot write {}: {} (creating '{}')\nhint: check that its folder exists and is writable",
                          named(what_, target_), std::strerror(errno), temporary_.string()));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temporary_.empty()) ::unlink(temporary_.c_str());
}

void OutputFile::write_through(std::string_view bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      throw Error(fmt::format("cannot write {}: {}{}", named(what_, target_), std::strerror(error),
                              error == ENOSPC ? "\nhint: free some space on its disk, or write elsewhere" : ""));
    }
    done += static_cast<std::size_t>(n);
  }
}

void OutputFile::flush() {
  write_through(buffer_);
  buffer_.clear();
}

void OutputFile::write(std::string_view bytes) {
  if (fd_ < 0) throw Error(fmt::format("{} is already committed", named(what_, target_)));
  if (bytes.size() >= kBufferBytes) {  // a tensor of a model: written as it is, not copied into the buffer
    flush();
    write_through(bytes);
    return;
  }
  buffer_.append(bytes);
  if (buffer_.size() >= kBufferBytes) flush();
}

void OutputFile::commit(bool durable) {
  if (fd_ < 0) throw Error(fmt::format("{} is already committed", named(what_, target_)));
  flush();
  const int fd = fd_;
  fd_ = -1;
  if (durable && ::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error(fmt::format("cannot write {}: {}{}", named(what_, target_), std::strerror(error),
                            error == ENOSPC ? "\nhint: free some space on its disk, or write elsewhere" : ""));
  }
  if (::close(fd) != 0) {
    throw Error(fmt::format("cannot write {}: {}", named(what_, target_), std::strerror(errno)));
  }
  refuse_unsafe_output(target_, what_);  // again: a link may have appeared while it was written
  if (::rename(temporary_.c_str(), target_.c_str()) != 0) {
    throw Error(fmt::format("cannot rename '{}' to {}: {}", temporary_.string(), named(what_, target_),
                            std::strerror(errno)));
  }
  committed_ = true;
}

void write_output_file(const std::filesystem::path& target, std::string_view bytes, std::string_view what) {
  OutputFile file(target, what);
  file.write(bytes);
  file.commit();
}

void publish_output_file(const std::filesystem::path& finished, const std::filesystem::path& target,
                         std::string_view what) {
  refuse_unsafe_output(target, what);
  if (::rename(finished.c_str(), target.c_str()) != 0) {
    throw Error(fmt::format("cannot move '{}' to {}: {}", finished.string(), named(what, target), std::strerror(errno)));
  }
}

void copy_to_output_file(const std::filesystem::path& source, const std::filesystem::path& target,
                         std::string_view what) {
  OutputFile file(target, what);
  const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Error(fmt::format("cannot read '{}': {}", source.string(), std::strerror(errno)));
  std::vector<char> block(kBufferBytes);
  for (;;) {
    const ssize_t n = ::read(in, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(in);
      throw Error(fmt::format("cannot read '{}': {}", source.string(), std::strerror(error)));
    }
    if (n == 0) break;
    file.write(std::string_view(block.data(), static_cast<std::size_t>(n)));
  }
  ::close(in);
  file.commit();
}

PrivateFolder::PrivateFolder(const std::filesystem::path& parent, std::string_view prefix) {
  const std::filesystem::path folder = parent.empty() ? std::filesystem::path(".") : parent;
  std::string name = (folder / fmt::format(".{}-XXXXXX", prefix)).string();
  if (::mkdtemp(name.data()) == nullptr) {
    throw Error(fmt::format("cannot create a folder in '{}': {}\nhint: check that it is writable", folder.string(),
                            std::strerror(errno)));
  }
  path_ = name;
}

PrivateFolder::~PrivateFolder() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // removes links themselves, never what they point at
}

}  // namespace ampscope
