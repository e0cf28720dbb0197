// core/ops.h: element-wise tensor ops (forward only; autograd arrives with the training runtime).
// A NaN that comes out of arithmetic is the canonical quiet NaN (kernels/functors.h), on every backend.
// Binary ops broadcast as PyTorch does and pick the result dtype with PyTorch's type promotion:
// dimensioned tensors outrank zero-dimensional ones, which outrank plain scalars, unless the
// lower-ranked operand is of a higher category (bool < integer < floating).
//
//   Tensor c = add(a, b);          // a: [4, 1] f16, b: [3] f16 -> [4, 3] f16, computed in float
//   Tensor d = mul(a, 0.1);        // the scalar stays a float (0.1f), as on the GPU, not f16(0.1)
#pragma once

#include "core/tensor.h"

namespace ampscope {

// The shape two shapes broadcast to, or ShapeError naming `op`, both shapes and the dimension at fault.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op = "broadcast");

// torch.result_type for two tensors, and for a tensor and a floating scalar.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, double scalar);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// Scalar forms: the scalar is kept in the op's compute type (float for f16/bf16/f32), not rounded to
// the tensor's dtype first. div by a scalar multiplies by its reciprocal computed in that type, which
// is what PyTorch's CUDA kernel does.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);

// div(a, b) is true division: integer or bool inputs give f32, as torch.div does.

Tensor neg(const Tensor& a);
Tensor relu(const Tensor& a);  // NaN stays NaN, with its bits
Tensor exp(const Tensor& a);   // integer or bool input gives f32, as torch.exp does

}  // namespace ampscope
