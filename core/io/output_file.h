// core/io/output_file.h: files written beside inputs that came from elsewhere. A folder someone sent (a
// trace and what lies beside it) may hold a symbolic link, a FIFO or a device under the very name a command
// is about to write: opening that name would write through the link (overwriting whatever it points at) or
// block. Every file ampscope writes next to such inputs goes through here: it is created under a fresh
// temporary name with O_CREAT | O_EXCL | O_NOFOLLOW (a name planted in advance is never opened) and renamed
// over its target at the end, which replaces a name and never follows it; a target that exists as anything
// but a regular file is refused, naming it, before anything is written.
//
//   OutputFile f("run.fix.json");   // refuses a link named run.fix.json; creates .run.fix.json.tmp-PID-N
//   f.write(text);
//   f.commit();                     // renamed to run.fix.json (destroyed uncommitted: the temporary goes)
//   write_output_file("steps.csv", text);  // the same in one call
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace ampscope {

// Throws Error when `path` exists as anything but a regular file (a symbolic link, even to a regular file;
// a FIFO, a device, a socket, a folder): such a name is never written through or replaced. `what` names the
// file in the message ("the results file"); "" for a plain "'PATH'".
void refuse_unsafe_output(const std::filesystem::path& path, std::string_view what = "");

class OutputFile {
 public:
  // Checks the target (refuse_unsafe_output) and creates the temporary file beside it (mode 0644 less the
  // umask). Throws Error naming the file and the system's reason.
  explicit OutputFile(std::filesystem::path target, std::string_view what = "");
  ~OutputFile();  // without commit(): closes and removes the temporary file
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Buffered (a piece of 1 MiB or more, a model's tensor, is written at once rather than copied); throws Error
  // ("No space left on device", ...) naming the file.
  void write(std::string_view bytes);
  // Writes what is buffered, closes, checks the target again and renames the temporary file over it.
  // durable: fsync()s the file first, so that the name never points at bytes still in the page cache (model
  // weights, which a crash must not leave half written under their final name).
  void commit(bool durable = false);
  const std::filesystem::path& target() const { return target_; }
  const std::filesystem::path& temporary() const { return temporary_; }

 private:
  void flush();
  void write_through(std::string_view bytes);
  std::filesystem::path target_, temporary_;
  std::string what_;
  std::string buffer_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `target` through an OutputFile.
void write_output_file(const std::filesystem::path& target, std::string_view bytes, std::string_view what = "");

// Moves a finished file (written where nobody else could plant names: a PrivateFolder) to `target`, by
// rename, after refuse_unsafe_output(target). Both must be on one file system (the same folder's subfolder).
void publish_output_file(const std::filesystem::path& finished, const std::filesystem::path& target,
                         std::string_view what = "");

// Copies `source` to `target` through an OutputFile (a kept checkpoint: the latest one copied).
void copy_to_output_file(const std::filesystem::path& source, const std::filesystem::path& target,
                         std::string_view what = "");

// A fresh folder of this process's own (mkdtemp, mode 0700) inside `parent`, named ".PREFIX-XXXXXX": files a
// library writes by name (an HDF5 trace and its lock file) are written here, where no name can have been
// planted, then published. Removed with what it holds when destroyed.
class PrivateFolder {
 public:
  PrivateFolder(const std::filesystem::path& parent, std::string_view prefix);
  ~PrivateFolder();
  PrivateFolder(const PrivateFolder&) = delete;
  PrivateFolder& operator=(const PrivateFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace ampscope
