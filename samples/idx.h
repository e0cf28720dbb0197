// samples/idx.h: a validating reader of the IDX files MNIST is distributed in, under both naming
// conventions (LeCun's train-images-idx3-ubyte, Kaggle's train-images.idx3-ubyte; labels and t10k-* the
// same way), plain or gzipped (.gz, recognised by its magic bytes 1f 8b and decompressed with zlib).
//
//   Dataset d = load_mnist("data/mnist", "train");   // d.x f32 [60000, 1, 28, 28] in [0, 1], d.y i64
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "samples/synthetic.h"

namespace ampscope::samples {

struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;  // unsigned bytes, row-major
};

// The most a gzipped IDX file may decompress to (1 GiB; the MNIST training images are 47 MB), so a
// damaged or hostile .gz cannot take all memory.
inline constexpr std::size_t kMaxIdxBytes = std::size_t{1} << 30;

// Reads an IDX file of unsigned bytes (type 0x08), plain or gzip (by content, whatever its name). Throws
// Error naming the file for: a damaged or truncated gzip stream (zlib's reason); contents that are not
// IDX (the first bytes, and what they look like: a zip or xz archive, an HTML page, text); an
// unsupported element type; a truncated file or trailing bytes; a gzip file that would decompress past
// kMaxIdxBytes; a file that is not a regular file (a FIFO, a device: never opened) or larger than
// kMaxIdxBytes itself (core/io/input_file.h).
IdxArray read_idx(const std::string& path);

// The file of `split` ("train" or "t10k") and `kind` ("images", idx3; "labels", idx1) in `dir`: the first
// that exists of split-kind-idxN-ubyte, split-kind.idxN-ubyte, and each with .gz; a folder of that name
// holding a file of the same name (as Kaggle's archive unpacks) counts too. Throws Error listing every
// name it looked for when none exists, and for a `dir` that is a file (naming its folder).
std::string find_idx_file(const std::string& dir, const std::string& split, const std::string& kind);

// `split` is "train" or "t10k". Checks that images are N x 28 x 28 and labels N, with the same N, and
// labels below 10.
Dataset load_mnist(const std::string& dir, const std::string& split);

}  // namespace ampscope::samples
