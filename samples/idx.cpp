#include "samples/idx.h"

#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/error.h"
#include "core/tensor.h"

namespace ampscope::samples {

IdxArray read_idx(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("cannot open IDX file '{}'\nhint: --data expects a folder with the uncompressed MNIST "
                            "files (train-images-idx3-ubyte, train-labels-idx1-ubyte)",
                            path));
  }
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 4) throw Error(fmt::format("IDX file '{}' is truncated: {} bytes, no header", path, bytes.size()));
  if (bytes[0] != 0 || bytes[1] != 0) {
    throw Error(fmt::format("'{}' is not an IDX file: the magic number starts with {:#04x} {:#04x}, not 0x00 0x00"
                            "\nhint: a .gz file must be decompressed first (gunzip)",
                            path, bytes[0], bytes[1]));
  }
  if (bytes[2] != 0x08) {
    throw Error(fmt::format("IDX file '{}' holds element type {:#04x}; only unsigned bytes (0x08) are supported", path,
                            bytes[2]));
  }
  const int ndim = bytes[3];
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndim);
  if (ndim == 0 || bytes.size() < header) {
    throw Error(fmt::format("IDX file '{}' is truncated: {} dimensions need a {}-byte header, the file has {} bytes",
                            path, ndim, header, bytes.size()));
  }
  IdxArray a;
  std::size_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    const std::uint8_t* p = &bytes[4 + 4 * d];
    const std::int64_t n = (std::int64_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
    a.dims.push_back(n);
    count *= static_cast<std::size_t>(n);
  }
  if (bytes.size() != header + count) {
    throw Error(fmt::format("IDX file '{}' has {} data bytes, but its header ({} dimensions) promises {}: the file is {}",
                            path, bytes.size() - header, ndim, count,
                            bytes.size() < header + count ? "truncated" : "longer than its header says"));
  }
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

Dataset load_mnist(const std::string& dir, const std::string& split) {
  const std::string images_path = dir + "/" + split + "-images-idx3-ubyte";
  const std::string labels_path = dir + "/" + split + "-labels-idx1-ubyte";
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
