// samples/idx.h: a validating reader of the IDX files MNIST is distributed in
// (train-images-idx3-ubyte, train-labels-idx1-ubyte, and t10k-* for the test set), uncompressed.
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

// Reads an IDX file of unsigned bytes (type 0x08). Throws Error naming the file for a wrong magic
// number, an unsupported element type, a truncated file or trailing bytes.
IdxArray read_idx(const std::string& path);

// `split` is "train" or "t10k". Checks that images are N x 28 x 28 and labels N, with the same N, and
// labels below 10.
Dataset load_mnist(const std::string& dir, const std::string& split);

}  // namespace ampscope::samples
