// core/tensor_view.h: what a kernel sees of a tensor: a typed pointer to its first element, sizes and
// strides (in elements). Trivially copyable, so it is passed by value to CUDA kernels.
//
//   TensorView v = t.kernel_view();
//   std::int64_t off = v.offset_of(i);   // element offset of the i-th element in row-major order
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/float16.h"

namespace ampscope {

inline constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;  // first element (storage base + storage offset)
  DType dtype = DType::f32;
  int ndim = 0;
  std::int64_t numel = 0;
  std::int64_t sizes[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {};

  // Offset, in elements, of the element whose row-major linear index is `linear`.
  AMPSCOPE_HD std::int64_t offset_of(std::int64_t linear) const {
    std::int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const std::int64_t idx = linear % sizes[d];
      linear /= sizes[d];
      off += idx * strides[d];
    }
    return off;
  }

  // True when the elements are dense in row-major order (offset_of(i) == i).
  AMPSCOPE_HD bool is_contiguous() const {
    std::int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (sizes[d] != 1 && strides[d] != expected) return false;
      expected *= sizes[d];
    }
    return true;
  }

  template <class T>
  AMPSCOPE_HD T* ptr() const {
    return static_cast<T*>(data);
  }
};

}  // namespace ampscope
