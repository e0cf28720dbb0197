// core/error.h: the exceptions ampscope's library code throws. Only `main` exits; everything else throws
// one of these, with a message that names the op and the shapes, dtypes or devices involved, and a
// `hint:` line where a fix is known.
//
//   try { auto c = ampscope::add(a, b); }
//   catch (const ampscope::ShapeError& e) { fmt::print(stderr, "{}\n", e.what()); }
#pragma once

#include <stdexcept>
#include <string>

namespace ampscope {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shapes that do not fit together: broadcasting, reshape, concatenation, a matrix product.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A dtype an op cannot take, or two dtypes that cannot be combined.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// An unknown device, a device that is not there, or tensors on different devices.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// An index or dimension outside a tensor's range.
class IndexError : public Error {
 public:
  using Error::Error;
};

// A backend that has no kernel for an op at a dtype ("op 'conv2d' has no bf16 kernel on backend 'cpu'").
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// A failed CUDA or cuBLAS call, or an allocation the device could not satisfy.
class DeviceRuntimeError : public Error {
 public:
  using Error::Error;
};

}  // namespace ampscope
