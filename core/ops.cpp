#include "core/ops.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope {

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {  // align from the right
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(fmt::format("{}: shapes {} and {} cannot be broadcast: dimension {} is {} in the first and {} "
                                   "in the second",
                                   op, shape_str(a), shape_str(b), static_cast<std::int64_t>(i) - static_cast<std::int64_t>(n),
                                   da, db));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

int category(DType t) { return t == DType::boolean ? 0 : t == DType::i64 ? 1 : 2; }

// The higher-priority operand's dtype wins unless the lower-priority one is of a higher category.
DType combine(DType higher, DType lower) {
  return category(lower) > category(higher) ? promote_types(higher, lower) : higher;
}

// Compute type for a result dtype: f16/bf16 math happens in float.
DType compute_dtype(DType result) { return (result == DType::f16 || result == DType::bf16) ? DType::f32 : result; }

// Ops whose result is always floating (true division, exp): integer and bool inputs give the default
// floating dtype, f32, as in PyTorch.
DType floating_result(DType t) { return is_floating(t) ? t : DType::f32; }

Tensor binary(std::string_view op, Op kernel, const Tensor& a, const Tensor& b, bool floating_only = false) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  const DType result = floating_only ? floating_result(result_type(a, b)) : result_type(a, b);
  if (a.dtype() == result && b.dtype() == result) {
    Tensor out = Tensor::empty(shape, {result, a.device()});
    run_kernel(op, kernel, out, {a, b});
    return out;
  }
  // Mixed dtypes: widen both inputs to the compute type (exact for floating inputs; i64 -> float is the
  // same conversion PyTorch does on load), compute, and round once to the result dtype.
  const DType compute = compute_dtype(result);
  Tensor out = Tensor::empty(shape, {compute, a.device()});
  run_kernel(op, kernel, out, {a.to(compute), b.to(compute)});
  return out.to(result);
}

Tensor binary_scalar(std::string_view op, Op kernel, const Tensor& a, double scalar) {
  const DType result = result_type(a, scalar);
  const Tensor input = a.to(result);
  Tensor out = Tensor::empty(a.shape(), {result, a.device()});
  run_kernel(op, kernel, out, {input}, {scalar});
  return out;
}

Tensor unary(std::string_view op, Op kernel, const Tensor& a, bool floating_only = false) {
  const DType result = floating_only ? floating_result(a.dtype()) : a.dtype();
  Tensor out = Tensor::empty(a.shape(), {result, a.device()});
  run_kernel(op, kernel, out, {a.to(result)});
  return out;
}

}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  const bool a_dim = a.dim() > 0, b_dim = b.dim() > 0;
  if (a_dim == b_dim) return promote_types(a.dtype(), b.dtype());
  return a_dim ? combine(a.dtype(), b.dtype()) : combine(b.dtype(), a.dtype());
}

DType result_type(const Tensor& a, double) {
  // A floating scalar has the default dtype (f32) and the lowest priority.
  return combine(a.dtype(), DType::f32);
}

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", Op::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", Op::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", Op::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", Op::div, a, b, /*floating_only=*/true); }

Tensor add(const Tensor& a, double b) { return binary_scalar("add", Op::add_scalar, a, b); }
// x - s and x + (-s) are the same IEEE operation, so subtraction reuses the add kernel.
Tensor sub(const Tensor& a, double b) { return binary_scalar("sub", Op::add_scalar, a, -b); }
Tensor mul(const Tensor& a, double b) { return binary_scalar("mul", Op::mul_scalar, a, b); }

Tensor div(const Tensor& a, double b) {
  // PyTorch's CUDA kernel divides by a scalar as a multiplication by its reciprocal, computed in the
  // op's compute type (float for f16/bf16/f32). Doing the same keeps results bit-identical.
  const DType result = result_type(a, b);
  const double reciprocal = result == DType::f64 ? 1.0 / b : static_cast<double>(1.0f / static_cast<float>(b));
  return binary_scalar("div", Op::mul_scalar, a, reciprocal);
}

Tensor neg(const Tensor& a) { return unary("neg", Op::neg, a); }
Tensor relu(const Tensor& a) { return unary("relu", Op::relu, a); }
Tensor exp(const Tensor& a) { return unary("exp", Op::exp, a, /*floating_only=*/true); }

}  // namespace ampscope
