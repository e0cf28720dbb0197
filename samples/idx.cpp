#include "samples/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/io/input_file.h"
#include "core/tensor.h"

namespace ampscope::samples {
namespace {

bool is_gzip(const std::vector<std::uint8_t>& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

bool starts_with(const std::vector<std::uint8_t>& b, std::string_view prefix) {
  return b.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), b.begin(),
                                                  [](char c, std::uint8_t u) { return static_cast<std::uint8_t>(c) == u; });
}

// "50 4b 03 04": the first bytes of a file, for a message.
std::string first_bytes(const std::vector<std::uint8_t>& b) {
  std::string out;
  for (std::size_t i = 0; i < b.size() && i < 8; ++i) out += fmt::format("{}{:02x}", i ? " " : "", b[i]);
  return out;
}

// What a file that is not IDX looks like, from its first bytes: ", which looks like ..." or "".
std::string looks_like(const std::vector<std::uint8_t>& b) {
  if (starts_with(b, "PK\x03\x04")) return ", the start of a zip archive: extract it first (unzip)";
  if (starts_with(b, "\xfd" "7zXZ")) return ", the start of an xz archive: extract it first (unxz)";
  if (starts_with(b, "BZh")) return ", the start of a bzip2 archive: extract it first (bunzip2)";
  if (starts_with(b, "\x89HDF")) return ", the start of an HDF5 file";
  // Text: an HTML page saved in place of the download, or some other text file.
  std::size_t printable = 0;
  const std::size_t n = std::min<std::size_t>(b.size(), 64);
  for (std::size_t i = 0; i < n; ++i) printable += (b[i] >= 0x20 && b[i] < 0x7f) || b[i] == '\n' || b[i] == '\r' || b[i] == '\t';
  if (n > 0 && printable == n) {
    std::string text(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
    if (text.find("<!doctype html") != std::string::npos || text.find("<html") != std::string::npos) {
      return ", an HTML page (a download that saved a web page instead of the file?)";
    }
    return ", text";
  }
  return "";
}

// The total size (header + data) that the IDX header at the front of `b` promises, once `b` holds the
// whole header; SIZE_MAX when the product of the dimensions overflows.
std::optional<std::size_t> promised_size(const std::vector<std::uint8_t>& b) {
  // Only for what read_idx accepts: magic 00 00, unsigned bytes, at least one dimension.
  if (b.size() < 4 || b[0] != 0 || b[1] != 0 || b[2] != 0x08 || b[3] == 0) return std::nullopt;
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(b[3]);
  if (b.size() < header) return std::nullopt;
  std::size_t total = 1;
  for (std::size_t d = 0; d < b[3]; ++d) {
    const std::uint8_t* p = &b[4 + 4 * d];
    const std::size_t n = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) | (std::size_t{p[2]} << 8) | p[3];
    if (n != 0 && total > std::numeric_limits<std::size_t>::max() / n) return std::numeric_limits<std::size_t>::max();
    total *= n;
  }
  return total > std::numeric_limits<std::size_t>::max() - header ? std::numeric_limits<std::size_t>::max()
                                                                   : total + header;
}

// Decompresses a gzip file (one or more members, RFC 1952), checking each member's CRC and length.
// Stops as soon as the output passes what the IDX header inside promises (or kMaxIdxBytes), so memory
// stays bounded by the promise.
std::vector<std::uint8_t> gunzip(const std::vector<std::uint8_t>& gz, const std::string& path) {
  if (gz.size() > UINT_MAX) {
    throw Error(fmt::format("'{}' is a gzip file of {} bytes, too large to read here\nhint: decompress it yourself "
                            "(gunzip) and give the folder the plain file",
                            path, gz.size()));
  }
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) throw Error(fmt::format("'{}': zlib could not start decompressing", path));
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&z};
  z.next_in = const_cast<Bytef*>(gz.data());
  z.avail_in = static_cast<uInt>(gz.size());
  std::vector<std::uint8_t> out;
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  for (;;) {
    const std::size_t had = out.size();
    out.resize(had + kChunk);
    z.next_out = out.data() + had;
    z.avail_out = static_cast<uInt>(kChunk);
    const int status = inflate(&z, Z_NO_FLUSH);
    out.resize(had + (kChunk - z.avail_out));
    const std::optional<std::size_t> promise = promised_size(out);
    if (promise && *promise <= kMaxIdxBytes && out.size() > *promise) {
      throw Error(fmt::format("IDX file '{}' (gzip) decompresses to more than the {} bytes its header promises: the "
                              "file is longer than its header says",
                              path, *promise));
    }
    if (out.size() > kMaxIdxBytes) {
      throw Error(fmt::format("'{}' (gzip) decompresses to more than {} bytes, the most this reader takes from a "
                              ".gz file{}\nhint: if the file is genuine, decompress it yourself (gunzip)",
                              path, kMaxIdxBytes,
                              promise ? fmt::format(" (its IDX header promises {} bytes)", *promise) : std::string()));
    }
    if (status == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      // Another gzip member follows (gzip files may be concatenated); anything else is damage.
      const std::size_t at = gz.size() - z.avail_in;
      if (z.avail_in >= 2 && gz[at] == 0x1f && gz[at + 1] == 0x8b) {
        inflateReset(&z);
        continue;
      }
      throw Error(fmt::format("'{}' holds {} bytes after the end of its gzip data\nhint: download the file again",
                              path, z.avail_in));
    }
    if (status == Z_DATA_ERROR || status == Z_NEED_DICT) {
      throw Error(fmt::format("'{}' is a gzip file whose data is damaged (zlib: {}) after {} decompressed bytes\n"
                              "hint: download the file again",
                              path, z.msg != nullptr ? z.msg : "invalid data", out.size()));
    }
    if (status == Z_MEM_ERROR) throw Error(fmt::format("'{}': zlib ran out of memory decompressing it", path));
    if (status == Z_BUF_ERROR || (status == Z_OK && z.avail_in == 0 && z.avail_out != 0)) {
      // No input left and the stream is not finished.
      throw Error(fmt::format("'{}' is a gzip file that ends early: its {} bytes stop before the end of the gzip "
                              "data, after {} decompressed bytes (an interrupted download?)\nhint: download the file "
                              "again",
                              path, gz.size(), out.size()));
    }
  }
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  // Through core/io/input_file.h: only a regular file is opened (a FIFO would block, /dev/zero never end),
  // and its size is checked before it is read.
  std::string raw;
  if (auto problem = detail::read_input_file(path, kMaxIdxBytes, raw)) {
    throw Error(fmt::format("cannot read IDX file '{}': {}\nhint: --data expects a folder with the MNIST files "
                            "(train-images-idx3-ubyte or train-images.idx3-ubyte, the labels likewise; .gz too), "
                            "regular files",
                            path, problem->describe()));
  }
  std::vector<std::uint8_t> bytes(raw.begin(), raw.end());
  raw = std::string();
  const bool gzipped = is_gzip(bytes);
  if (gzipped) bytes = gunzip(bytes, path);
  const std::string what = gzipped ? fmt::format("'{}' (gzip, decompressed)", path) : fmt::format("'{}'", path);
  if (bytes.size() < 4) {
    throw Error(fmt::format("IDX file {} is truncated: {} bytes, no header", what, bytes.size()));
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    throw Error(fmt::format("{} is not an IDX file: its first bytes are {}{}; an IDX file starts with 00 00, its "
                            "element type and its number of dimensions",
                            what, first_bytes(bytes), looks_like(bytes)));
  }
  if (bytes[2] != 0x08) {
    throw Error(fmt::format("IDX file {} holds element type {:#04x}; only unsigned bytes (0x08) are supported", what,
                            bytes[2]));
  }
  const int ndim = bytes[3];
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndim);
  if (ndim == 0 || bytes.size() < header) {
    throw Error(fmt::format("IDX file {} is truncated: {} dimensions need a {}-byte header, the file has {} bytes",
                            what, ndim, header, bytes.size()));
  }
  IdxArray a;
  for (int d = 0; d < ndim; ++d) {
    const std::uint8_t* p = &bytes[4 + 4 * d];
    a.dims.push_back((std::int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3]);
  }
  const std::size_t promised = *promised_size(bytes);
  if (promised == std::numeric_limits<std::size_t>::max()) {
    throw Error(fmt::format("IDX file {} has a header whose dimensions {} multiply past any file size", what,
                            shape_str(a.dims)));
  }
  if (bytes.size() != promised) {
    throw Error(fmt::format("IDX file {} has {} data bytes, but its header ({} dimensions) promises {}: the file is {}",
                            what, bytes.size() - header, ndim, promised - header,
                            bytes.size() < promised ? "truncated" : "longer than its header says"));
  }
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

std::string find_idx_file(const std::string& dir, const std::string& split, const std::string& kind) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    const fs::path parent = fs::path(dir).parent_path();
    throw Error(fmt::format("'{}' is a file; the MNIST reader takes the folder that holds the IDX files\nhint: give "
                            "its folder, '{}'",
                            dir, parent.empty() ? "." : parent.string()));
  }
  const std::string n = kind == "images" ? "3" : "1";
  const std::vector<std::string> names = {split + "-" + kind + "-idx" + n + "-ubyte",
                                          split + "-" + kind + ".idx" + n + "-ubyte",
                                          split + "-" + kind + "-idx" + n + "-ubyte.gz",
                                          split + "-" + kind + ".idx" + n + "-ubyte.gz"};
  for (const std::string& name : names) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) return p.string();
    // Kaggle's archive unpacks some files as a folder of that name holding the file.
    if (fs::is_directory(p, ec) && fs::is_regular_file(p / name, ec)) return (p / name).string();
  }
  // A name that is there but is not a regular file (a FIFO, a link to a device): said, rather than "no file".
  for (const std::string& name : names) {
    const fs::path p = fs::path(dir) / name;
    const auto type = fs::status(p, ec).type();
    if (type != fs::file_type::not_found && type != fs::file_type::directory && type != fs::file_type::none &&
        type != fs::file_type::regular) {
      throw Error(fmt::format("MNIST {} {} file '{}' is not a regular file ({}); it is not read\nhint: --data expects "
                              "a folder of regular IDX files",
                              split, kind, p.string(),
                              type == fs::file_type::fifo      ? "a FIFO (named pipe)"
                              : type == fs::file_type::character ? "a character device"
                              : type == fs::file_type::block     ? "a block device"
                              : type == fs::file_type::socket    ? "a socket"
                                                                 : "not a file"));
    }
  }
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
  throw Error(fmt::format("no MNIST {} {} file in '{}': looked for {}", split, kind, dir, list));
}

Dataset load_mnist(const std::string& dir, const std::string& split) {
  const std::string images_path = find_idx_file(dir, split, "images");
  const std::string labels_path = find_idx_file(dir, split, "labels");
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
    throw Error(fmt::format("'{}' holds images of shape {}, expected [N, 28, 28]", images_path, shape_str(images.dims)));
  }
  if (labels.dims.size() != 1 || labels.dims[0] != images.dims[0]) {
    throw Error(fmt::format("'{}' holds {} labels for the {} images of '{}'", labels_path,
                            labels.dims.empty() ? 0 : labels.dims[0], images.dims[0], images_path));
  }
  const std::int64_t n = images.dims[0];
  if (n == 0) {
    throw Error(fmt::format("'{}' holds no images (its header says 0)\nhint: --data needs the MNIST training files "
                            "with at least one image",
                            images_path));
  }
  std::vector<double> x(images.data.size()), y(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = images.data[i] / 255.0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (labels.data[i] > 9) {
      throw Error(fmt::format("'{}': label {} at index {} is not a digit", labels_path, labels.data[i], i));
    }
    y[i] = labels.data[i];
  }
  return {from_values(x, {n, 1, 28, 28}), from_values(y, {n}, {DType::i64})};
}

}  // namespace ampscope::samples
