// The differentiable ops: shape and dtype checks, the kernel calls, and each op's backward.
//
// Pattern: an op computes its result with grad mode off (so its internal reshapes and casts are not
// recorded), then records one node whose backward captures detached copies of what it needs.
// Composite ops (cross_entropy, scaled_dot_product_attention) instead call recorded ops, so each step
// shows in the graph under its own name.
#include "core/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/block_linear.h"
#include "core/fp8_linear.h"
#include "core/what_if.h"

namespace ampscope {

namespace {

using Grads = std::vector<Tensor>;
using Needs = std::vector<bool>;

// "linear" or "linear (in module 'fc1')": the prefix of every error message.
std::string label(std::string_view op) {
  const std::string& scope = current_scope();
  return scope.empty() ? std::string(op) : fmt::format("{} (in module '{}')", op, scope);
}

std::int64_t wrap(std::int64_t d, std::int64_t ndim, std::string_view op, const Shape& shape) {
  const std::int64_t n = std::max<std::int64_t>(ndim, 1);  // a 0-dim tensor accepts 0 and -1
  if (d < -n || d >= n) {
    throw IndexError(fmt::format("{}: dimension {} is out of range for a tensor of shape {} (valid: {} to {})",
                                 label(op), d, shape_str(shape), -n, n - 1));
  }
  return d < 0 ? d + n : d;
}

std::int64_t numel_of(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
}

void check_floating(std::string_view op, const Tensor& t, std::string_view what = "input") {
  if (!is_floating(t.dtype())) {
    throw DTypeError(fmt::format("{}: {} must be floating (f32, f16, bf16 or f64), got {} of shape {}", label(op), what,
                                 dtype_name(t.dtype()), shape_str(t.shape())));
  }
}

void check_same_dtype(std::string_view op, const Tensor& a, std::string_view a_name, const Tensor& b,
                      std::string_view b_name) {
  if (b.defined() && a.dtype() != b.dtype()) {
    throw DTypeError(fmt::format("{}: {} is {} but {} is {}; both must have the same dtype\n"
                                 "hint: cast one with .to(DType::...); autocast casts f32, f16 and bf16 inputs of "
                                 "matrix products for you, but never f64",
                                 label(op), a_name, dtype_name(a.dtype()), b_name, dtype_name(b.dtype())));
  }
}

// Compute type for a result dtype: f16/bf16 math happens in float.
DType compute_dtype(DType result) { return (result == DType::f16 || result == DType::bf16) ? DType::f32 : result; }
DType acc_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// Ops whose result is always floating (true division, exp): integer and bool inputs give f32.
DType floating_result(DType t) { return is_floating(t) ? t : DType::f32; }

int category(DType t) { return t == DType::boolean ? 0 : t == DType::i64 ? 1 : 2; }

// The higher-priority operand's dtype wins unless the lower-priority one is of a higher category.
DType combine(DType higher, DType lower) {
  return category(lower) > category(higher) ? promote_types(higher, lower) : higher;
}

// Runs `fn` with grad mode off: an op's internal steps are not part of the graph.
template <class Fn>
auto untracked(Fn&& fn) {
  NoGradGuard guard;
  return fn();
}

// An element-wise kernel over inputs broadcast to `shape`, output in `dtype`.
Tensor map(std::string_view op, Op kernel, const Shape& shape, DType dtype, std::initializer_list<Tensor> inputs,
           std::initializer_list<double> scalars = {}) {
  Tensor out = Tensor::empty(shape, {dtype, inputs.begin()->device()});
  run_kernel(op, kernel, out, inputs, scalars);
  return out;
}

// The gradient of a broadcast input: summed back to its shape, in its dtype.
Tensor reduce_grad(const Tensor& g, const Tensor& input) { return sum_to(g, input.shape()).to(input.dtype()); }

// A bound as PyTorch's kernels see it: Scalar::to<scalar_t>(), rounded to the tensor's dtype (f64 ->
// f32 -> f16/bf16). Comparing a stored value with the rounded bound or with the exact one selects the
// same values in the forward, but only the rounded one lets the gradient through at x == bound.
double round_to_dtype(double v, DType t) {
  switch (t) {
    case DType::f32: return static_cast<double>(static_cast<float>(v));
    case DType::f16: return static_cast<double>(static_cast<float>(convert<f16>(v)));
    case DType::bf16: return static_cast<double>(static_cast<float>(convert<bf16>(v)));
    default: return v;
  }
}

// ---- element-wise helpers ----

Tensor binary_forward(std::string_view op, Op kernel, const Tensor& a, const Tensor& b, bool floating_only) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), label(op));
  const DType result = floating_only ? floating_result(result_type(a, b)) : result_type(a, b);
  if (a.dtype() == result && b.dtype() == result) return map(op, kernel, shape, result, {a, b});
  // Mixed dtypes: widen both inputs to the compute type, compute, and round once to the result dtype.
  // This is what PyTorch's CUDA kernels do: TensorIterator does not cast CUDA inputs to the common dtype
  // but loads each one with fetch_and_cast to the functor's argument type, which is the op-math type
  // (float). So f16[n] * f32 0-dim tensor uses the f32 value unrounded, and i64 -> float is one rounding.
  const DType compute = compute_dtype(result);
  return map(op, kernel, shape, compute, {a.to(compute), b.to(compute)}).to(result);
}

Tensor scalar_forward(std::string_view op, Op kernel, const Tensor& a, double scalar) {
  const DType result = result_type(a, scalar);
  return map(op, kernel, a.shape(), result, {a.to(result)}, {scalar});
}

// A unary op: the output in `result` dtype (the input's, or f32 for integer inputs of floating ops).
Tensor unary_forward(std::string_view op, Op kernel, const Tensor& a, bool floating_only,
                     std::initializer_list<double> scalars = {}) {
  const DType result = floating_only ? floating_result(a.dtype()) : a.dtype();
  return map(op, kernel, a.shape(), result, {a.to(result)}, scalars);
}

// The gradient of a unary op from a fused backward kernel (g, saved) -> dx.
Tensor backward_map(std::string_view op, Op kernel, const Tensor& g, const Tensor& saved,
                    std::initializer_list<double> scalars = {}) {
  return map(op, kernel, g.shape(), g.dtype(), {g, saved.to(g.dtype())}, scalars);
}

// Records a unary op whose backward is a fused kernel over (g, saved), with up to two scalars.
Tensor record_unary(std::string_view op, const Tensor& out, const Tensor& input, Op backward_kernel, const Tensor& saved,
                    double s0 = 0.0, double s1 = 0.0) {
  if (!autograd::any_requires_grad({input})) return out;
  return autograd::record(op, out, {input}, [=, s = saved.detach(), in_dtype = input.dtype()](const Tensor& g, const Needs&) {
    return Grads{backward_map(op, backward_kernel, g, s, {s0, s1}).to(in_dtype)};
  });
}

// ---- reduction helpers ----

std::vector<std::int64_t> normalize_dims(std::string_view op, const Tensor& a, const std::vector<std::int64_t>& dims) {
  std::vector<std::int64_t> out;
  if (dims.empty()) {
    for (std::int64_t d = 0; d < a.dim(); ++d) out.push_back(d);
    return out;
  }
  for (std::int64_t d : dims) {
    const std::int64_t w = wrap(d, a.dim(), op, a.shape());
    if (a.dim() == 0) continue;
    if (std::find(out.begin(), out.end(), w) != out.end()) {
      throw IndexError(fmt::format("{}: dimension {} appears more than once in the dimensions to reduce", label(op), w));
    }
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Shape of a reduction's result, with reduced dimensions kept as 1 or dropped.
Shape reduced_shape(const Shape& shape, const std::vector<std::int64_t>& dims, bool keepdim) {
  Shape out;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) {
      out.push_back(shape[d]);
    } else if (keepdim) {
      out.push_back(1);
    }
  }
  return out;
}

// Moves `dims` last and views the tensor as [rows, cols], cols = the product of those dimensions.
// The permutation as_rows applies: the kept dims in order, then the reduced ones in `dims`' order.
Shape rows_first(const Tensor& a, const std::vector<std::int64_t>& dims) {
  Shape perm;
  for (std::int64_t d = 0; d < a.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  }
  for (std::int64_t d : dims) perm.push_back(d);
  return perm;
}

// On the CPU, a reduction whose rows as_rows would have to copy (the permuted view is not contiguous)
// but whose view sum_rows reads fast in place: the reduced elements' last dim dense (a convolution's
// bias gradient: sum of [N, C, H, W] over N, H, W), or one kept dim, dense (a linear layer's bias
// gradient: the column sums of [rows, out]). Returns the number of kept dims, 0 for as_rows' copy.
std::int64_t strided_row_dims(const Tensor& a, const std::vector<std::int64_t>& dims) {
  if (!a.device().is_cpu() || dims.empty() || a.numel() == 0) return 0;
  const std::int64_t kept = a.dim() - static_cast<std::int64_t>(dims.size());
  if (kept < 1) return 0;
  const Tensor p = a.permute(rows_first(a, dims));
  if (p.is_contiguous()) return 0;
  const bool dense_runs = p.strides().back() == 1;
  const bool dense_rows = kept == 1 && p.strides()[0] == 1;
  return dense_runs || dense_rows ? kept : 0;
}

Tensor as_rows(const Tensor& a, const std::vector<std::int64_t>& dims) {
  Shape perm;
  std::int64_t cols = 1;
  for (std::int64_t d = 0; d < a.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  }
  for (std::int64_t d : dims) {
    perm.push_back(d);
    cols *= a.size(d);
  }
  const std::int64_t rows = cols == 0 ? numel_of(reduced_shape(a.shape(), dims, false)) : a.numel() / cols;
  return a.permute(perm).contiguous().reshape({rows, cols});
}

// The inverse of as_rows: a [rows, cols] tensor back to `shape` (a permuted view of it).
Tensor from_rows(const Tensor& r, const Shape& shape, const std::vector<std::int64_t>& dims) {
  if (shape.empty()) return r.reshape({});
  Shape perm, permuted;
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(shape.size()); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
  }
  for (std::int64_t d : dims) perm.push_back(d);
  Shape inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    permuted.push_back(shape[perm[i]]);
    inverse[perm[i]] = static_cast<std::int64_t>(i);
  }
  return r.reshape(permuted).permute(inverse);
}

// Sum over dims with out = sum * factor / divisor, computed in out_dtype's accumulation type.
Tensor reduce_rows(std::string_view op, const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim,
                   DType out_dtype, double factor, double divisor) {
  const Tensor src = a.to(out_dtype);
  if (const std::int64_t row_dims = strided_row_dims(src, dims); row_dims > 0) {
    // The CPU sums the permuted view where it lies (sum_rows' scalar 2: how many leading dims index the
    // rows); same additions, same bits, no copy (kernels/cpu/nn_kernels.cpp, sum_strided_rows).
    Tensor out = Tensor::empty({numel_of(reduced_shape(a.shape(), dims, false))}, {out_dtype, a.device()});
    run_kernel_general(op, Op::sum_rows, {out}, {src.permute(rows_first(src, dims))},
                       {factor, divisor, static_cast<double>(row_dims)});
    return out.reshape(reduced_shape(a.shape(), dims, keepdim));
  }
  const Tensor rows = as_rows(src, dims);
  Tensor out = Tensor::empty({rows.size(0)}, {out_dtype, a.device()});
  run_kernel_general(op, Op::sum_rows, {out}, {rows}, {factor, divisor});
  return out.reshape(reduced_shape(a.shape(), dims, keepdim));
}

// The gradient of a reduction, broadcast back over the reduced dimensions.
Tensor expand_grad(const Tensor& g, const Shape& input_shape, const std::vector<std::int64_t>& dims) {
  return g.reshape(reduced_shape(input_shape, dims, true)).expand(input_shape);
}

// PyTorch's mean factor: (number of outputs) / (number of inputs), in the accumulation type.
double mean_factor(DType dtype, std::int64_t outputs, std::int64_t inputs) {
  if (dtype == DType::f64) return static_cast<double>(outputs) / static_cast<double>(inputs);
  return static_cast<double>(static_cast<float>(outputs) / static_cast<float>(inputs));
}

// ---- matrix product helper ----

// out [B, M, N] = a [B, M, K] @ b [B, K, N] (+ bias), in out_dtype.
Tensor gemm(std::string_view op, const Tensor& a, const Tensor& b, DType out_dtype, const Tensor& bias = Tensor(),
            bool bias_per_row = false) {
  Tensor out = Tensor::empty({a.size(0), a.size(1), b.size(2)}, {out_dtype, a.device()});
  run_kernel_general(op, Op::gemm, {out}, {a, b, bias}, {bias_per_row ? 1.0 : 0.0, 0.0});
  return out;
}

// sum_b a[b] @ b[b] as one [M, N] product, accumulated before rounding once.
Tensor gemm_sum_batches(std::string_view op, const Tensor& a, const Tensor& b, DType out_dtype) {
  Tensor out = Tensor::empty({1, a.size(1), b.size(2)}, {out_dtype, a.device()});
  run_kernel_general(op, Op::gemm, {out}, {a, b}, {0.0, 1.0});
  return out;
}

Tensor transpose_last(const Tensor& t) { return t.transpose(-2, -1); }

void check_same_device(std::string_view op, const Tensor& a, const Tensor& b) {
  if (b.defined() && a.device() != b.device()) {
    throw DeviceError(fmt::format("{}: expected all tensors on the same device, got {} and {}\n"
                                  "hint: move one of them with .to(Device::parse(\"{}\"))",
                                  label(op), a.device().str(), b.device().str(), a.device().str()));
  }
}

// Host copy of an i64 index tensor, for range checks before a kernel reads through it.
std::vector<std::int64_t> host_indices(const Tensor& t) {
  const Tensor host = t.contiguous().to(Device::cpu());
  const std::int64_t* p = host.data_as<std::int64_t>();
  return std::vector<std::int64_t>(p, p + host.numel());
}

Tensor apply_reduction(std::string_view op, const Tensor& per_element, Reduction reduction) {
  switch (reduction) {
    case Reduction::none: return per_element;
    case Reduction::sum:
      return reduce_rows(op, per_element, normalize_dims(op, per_element, {}), false, per_element.dtype(), 1.0, 1.0);
    case Reduction::mean:
      return reduce_rows(op, per_element, normalize_dims(op, per_element, {}), false, per_element.dtype(),
                         mean_factor(per_element.dtype(), 1, per_element.numel()), 1.0);
  }
  return per_element;
}

// The incoming gradient of a loss, as a tensor of the per-element shape (a view for mean and sum).
Tensor loss_grad(const Tensor& g, const Shape& shape, Reduction reduction) {
  return reduction == Reduction::none ? g : g.reshape(Shape(shape.size(), 1)).expand(shape);
}

}  // namespace

// ---- broadcasting and promotion ----

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {  // align from the right
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(fmt::format("{}: shapes {} and {} cannot be broadcast: dimension {} is {} in the first and {} "
                                   "in the second",
                                   op, shape_str(a), shape_str(b),
                                   static_cast<std::int64_t>(i) - static_cast<std::int64_t>(n), da, db));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

DType result_type(const Tensor& a, const Tensor& b) {
  const bool a_dim = a.dim() > 0, b_dim = b.dim() > 0;
  if (a_dim == b_dim) return promote_types(a.dtype(), b.dtype());
  return a_dim ? combine(a.dtype(), b.dtype()) : combine(b.dtype(), a.dtype());
}

DType result_type(const Tensor& a, double) {
  // A floating scalar has the default dtype (f32) and the lowest priority.
  return combine(a.dtype(), DType::f32);
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const std::int64_t lead = grad.dim() - static_cast<std::int64_t>(shape.size());
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  }
  if (dims.empty()) return grad.reshape(shape);
  return untracked([&] { return reduce_rows("sum_to", grad, dims, false, grad.dtype(), 1.0, 1.0).reshape(shape); });
}

// ---- element-wise ----

static Tensor add_impl(const Tensor& a, const Tensor& b) {
  Tensor out = untracked([&] { return binary_forward("add", Op::add, a, b, false); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("add", out, {a, b}, [a_info = a.detach(), b_info = b.detach()](const Tensor& g, const Needs& n) {
    return Grads{n[0] ? reduce_grad(g, a_info) : Tensor(), n[1] ? reduce_grad(g, b_info) : Tensor()};
  });
}

static Tensor sub_impl(const Tensor& a, const Tensor& b) {
  Tensor out = untracked([&] { return binary_forward("sub", Op::sub, a, b, false); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("sub", out, {a, b}, [a_info = a.detach(), b_info = b.detach()](const Tensor& g, const Needs& n) {
    return Grads{n[0] ? reduce_grad(g, a_info) : Tensor(), n[1] ? reduce_grad(neg(g), b_info) : Tensor()};
  });
}

static Tensor mul_impl(const Tensor& a, const Tensor& b) {
  Tensor out = untracked([&] { return binary_forward("mul", Op::mul, a, b, false); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("mul", out, {a, b}, [sa = a.detach(), sb = b.detach()](const Tensor& g, const Needs& n) {
    return Grads{n[0] ? reduce_grad(mul(g, sb), sa) : Tensor(), n[1] ? reduce_grad(mul(g, sa), sb) : Tensor()};
  });
}

static Tensor div_impl(const Tensor& a, const Tensor& b) {
  Tensor out = untracked([&] { return binary_forward("div", Op::div, a, b, true); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("div", out, {a, b}, [sa = a.detach(), sb = b.detach()](const Tensor& g, const Needs& n) {
    // PyTorch: grad / other, and -grad * self / (other * other).
    return Grads{n[0] ? reduce_grad(div(g, sb), sa) : Tensor(),
                 n[1] ? reduce_grad(div(mul(neg(g), sa), mul(sb, sb)), sb) : Tensor()};
  });
}

static Tensor add_impl(const Tensor& a, double b) {
  Tensor out = untracked([&] { return scalar_forward("add", Op::add_scalar, a, b); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("add", out, {a}, [dt = a.dtype()](const Tensor& g, const Needs&) { return Grads{g.to(dt)}; });
}

// x - s and x + (-s) are the same IEEE operation, so subtraction reuses the add kernel.
static Tensor sub_impl(const Tensor& a, double b) {
  Tensor out = untracked([&] { return scalar_forward("sub", Op::add_scalar, a, -b); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("sub", out, {a}, [dt = a.dtype()](const Tensor& g, const Needs&) { return Grads{g.to(dt)}; });
}

static Tensor mul_impl(const Tensor& a, double b) {
  Tensor out = untracked([&] { return scalar_forward("mul", Op::mul_scalar, a, b); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("mul", out, {a}, [b, dt = a.dtype()](const Tensor& g, const Needs&) {
    return Grads{mul(g, b).to(dt)};
  });
}

static Tensor div_impl(const Tensor& a, double b) {
  // PyTorch's CUDA kernel divides by a scalar as a multiplication by its reciprocal, computed in the
  // op's compute type (float for f16/bf16/f32). Doing the same keeps results bit-identical.
  const DType result = result_type(a, b);
  const double reciprocal = result == DType::f64 ? 1.0 / b : static_cast<double>(1.0f / static_cast<float>(b));
  Tensor out = untracked([&] { return scalar_forward("div", Op::mul_scalar, a, reciprocal); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("div", out, {a}, [reciprocal, dt = a.dtype()](const Tensor& g, const Needs&) {
    return Grads{untracked([&] { return scalar_forward("div", Op::mul_scalar, g, reciprocal); }).to(dt)};
  });
}

static Tensor neg_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("neg", Op::neg, a, false); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("neg", out, {a}, [](const Tensor& g, const Needs&) { return Grads{neg(g)}; });
}

static Tensor relu_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("relu", Op::relu, a, false); });
  return record_unary("relu", out, a, Op::relu_backward, out);
}

static Tensor gelu_impl(const Tensor& a, GeluApproximation approximate) {
  const double mode = approximate == GeluApproximation::tanh ? 1.0 : 0.0;
  check_floating("gelu", a);
  if (mode == 1.0 && a.device().is_cpu() && a.dtype() == DType::f32 && autograd::any_requires_grad({a})) {
    // The CPU's f32 tanh form keeps each element's tanh for the backward pass, which then does not compute
    // it again (in double, most of both loops: issue 37); one more f32 tensor the size of x is held until
    // backward. The backward's arithmetic from the stored tanh is the functor's, the same bits
    // (kernels/cpu/gelu_kernels.h); a gradient the fast loop cannot take goes through the functor.
    Tensor t;
    const Tensor x = a.contiguous();
    Tensor out = untracked([&] {
      Tensor y = Tensor::empty(a.shape(), {DType::f32, a.device()});
      t = Tensor::empty(a.shape(), {DType::f32, a.device()});
      run_kernel_general("gelu", Op::gelu, {y, t}, {x}, {mode});
      return y;
    });
    return autograd::record("gelu", out, {a}, [sx = x.detach(), st = t, mode](const Tensor& g, const Needs&) {
      if (g.dtype() != DType::f32 || g.shape() != sx.shape()) {
        return Grads{backward_map("gelu", Op::gelu_backward, g, sx, {mode}).to(DType::f32)};
      }
      Tensor gx = Tensor::empty(g.shape(), {DType::f32, g.device()});
      run_kernel_general("gelu", Op::gelu_backward, {gx}, {g.contiguous(), sx, st}, {mode});
      return Grads{gx};
    });
  }
  Tensor out = untracked([&] { return unary_forward("gelu", Op::gelu, a, false, {mode}); });
  return record_unary("gelu", out, a, Op::gelu_backward, a, mode);
}

static Tensor sigmoid_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("sigmoid", Op::sigmoid, a, true); });
  return record_unary("sigmoid", out, a, Op::sigmoid_backward, out);
}

// One kernel forward and one backward, as PyTorch's silu: f16/bf16 computed in float and rounded once.
static Tensor silu_impl(const Tensor& a) {
  check_floating("silu", a);
  Tensor out = untracked([&] { return unary_forward("silu", Op::silu, a, false); });
  return record_unary("silu", out, a, Op::silu_backward, a);
}

static Tensor tanh_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("tanh", Op::tanh, a, true); });
  return record_unary("tanh", out, a, Op::tanh_backward, out);
}

static Tensor exp_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("exp", Op::exp, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("exp", out, {a}, [y = out.detach()](const Tensor& g, const Needs&) { return Grads{mul(g, y)}; });
}

static Tensor log_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("log", Op::log, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("log", out, {a}, [x = a.detach()](const Tensor& g, const Needs&) { return Grads{div(g, x)}; });
}

// sqrt, rsqrt and pow have no backward kernel in PyTorch: autograd composes them from tensor ops, each
// rounded to the tensor's dtype. So do we, in PyTorch's order (derivatives.yaml).
static Tensor sqrt_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("sqrt", Op::sqrt, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("sqrt", out, {a}, [y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{div(g, mul(y, 2.0))};  // grad / (2 * result)
  });
}

static Tensor rsqrt_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("rsqrt", Op::rsqrt, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("rsqrt", out, {a}, [y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{mul(mul(g, -0.5), pow(y, 3.0))};  // -0.5 * grad * result.pow(3)
  });
}

static Tensor pow_impl(const Tensor& a, double exponent) {
  Tensor out = untracked([&] { return unary_forward("pow", Op::pow_scalar, a, true, {exponent}); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("pow", out, {a}, [x = a.detach(), exponent](const Tensor& g, const Needs&) {
    if (exponent == 0.0) return Grads{zeros(x.shape(), {g.dtype(), g.device()})};
    return Grads{mul(g, mul(pow(x, exponent - 1.0), exponent))};  // grad * (exponent * self.pow(exponent - 1))
  });
}

static Tensor clamp_impl(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  if (!lo && !hi) throw Error(fmt::format("{}: at least one of the bounds must be given", label("clamp")));
  check_floating("clamp", a);
  const double l = round_to_dtype(lo.value_or(-std::numeric_limits<double>::infinity()), a.dtype());
  const double h = round_to_dtype(hi.value_or(std::numeric_limits<double>::infinity()), a.dtype());
  Tensor out = untracked([&] { return unary_forward("clamp", Op::clamp, a, false, {l, h}); });
  return record_unary("clamp", out, a, Op::clamp_backward, a, l, h);
}

static Tensor masked_fill_impl(const Tensor& a, const Tensor& mask, double value) {
  if (mask.dtype() != DType::boolean) {
    throw DTypeError(fmt::format("{}: the mask must be bool, got {}", label("masked_fill"), dtype_name(mask.dtype())));
  }
  check_same_device("masked_fill", a, mask);
  const Shape shape = broadcast_shapes(a.shape(), mask.shape(), label("masked_fill"));
  if (shape != a.shape()) {
    throw ShapeError(fmt::format("{}: the mask of shape {} must broadcast to the input's shape {}, not widen it to {}",
                                 label("masked_fill"), shape_str(mask.shape()), shape_str(a.shape()), shape_str(shape)));
  }
  Tensor out = untracked([&] { return map("masked_fill", Op::masked_fill, shape, a.dtype(), {a, mask}, {value}); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("masked_fill", out, {a, Tensor()}, [m = mask.detach()](const Tensor& g, const Needs&) {
    return Grads{map("masked_fill", Op::masked_fill, g.shape(), g.dtype(), {g, m}, {0.0}), Tensor()};
  });
}

static Tensor where_impl(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (cond.dtype() != DType::boolean) {
    throw DTypeError(fmt::format("{}: the condition must be bool, got {}", label("where"), dtype_name(cond.dtype())));
  }
  check_same_device("where", cond, a);
  check_same_device("where", cond, b);
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), label("where")), b.shape(), label("where"));
  const DType result = result_type(a, b);
  Tensor out = untracked([&] { return map("where", Op::where, shape, result, {cond, a.to(result), b.to(result)}); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("where", out, {Tensor(), a, b},
                          [c = cond.detach(), sa = a.detach(), sb = b.detach()](const Tensor& g, const Needs& n) {
                            const Tensor zero = zeros({}, {g.dtype(), g.device()});
                            Tensor ga, gb;
                            if (n[1]) ga = reduce_grad(map("where", Op::where, g.shape(), g.dtype(), {c, g, zero}), sa);
                            if (n[2]) gb = reduce_grad(map("where", Op::where, g.shape(), g.dtype(), {c, zero, g}), sb);
                            return Grads{Tensor(), ga, gb};
                          });
}

// ---- ops for hand-written losses: element-wise ----

static Tensor rsub_impl(const Tensor& a, double b) {
  Tensor out = untracked([&] { return scalar_forward("rsub", Op::rsub_scalar, a, b); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("rsub", out, {a}, [dt = a.dtype()](const Tensor& g, const Needs&) {
    return Grads{neg(g).to(dt)};  // PyTorch: -grad (times alpha = 1)
  });
}

static Tensor reciprocal_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("reciprocal", Op::reciprocal, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("reciprocal", out, {a}, [y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{mul(neg(g), mul(y, y))};  // -grad * (result * result)
  });
}

static Tensor abs_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("abs", Op::abs, a, false); });
  return record_unary("abs", out, a, Op::abs_backward, a);
}

// log1p and expm1 have no backward kernel in PyTorch: autograd composes tensor ops, each rounded.
static Tensor log1p_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("log1p", Op::log1p, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("log1p", out, {a}, [x = a.detach()](const Tensor& g, const Needs&) {
    return Grads{div(g, add(x, 1.0))};  // grad / (self + 1)
  });
}

static Tensor expm1_impl(const Tensor& a) {
  Tensor out = untracked([&] { return unary_forward("expm1", Op::expm1, a, true); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("expm1", out, {a}, [y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{mul(g, add(y, 1.0))};  // grad * (result + 1)
  });
}

static Tensor logsigmoid_impl(const Tensor& a) {
  check_floating("logsigmoid", a);
  Tensor out = untracked([&] { return unary_forward("logsigmoid", Op::logsigmoid, a, false); });
  return record_unary("logsigmoid", out, a, Op::logsigmoid_backward, a);
}

static Tensor softplus_impl(const Tensor& a, double beta, double threshold) {
  check_floating("softplus", a);
  Tensor out = untracked([&] { return unary_forward("softplus", Op::softplus, a, false, {beta, threshold}); });
  return record_unary("softplus", out, a, Op::softplus_backward, a, beta, threshold);
}

static Tensor clamp_bound_impl(std::string_view op, const Tensor& a, double lo, double hi) {
  check_floating(op, a);
  const double l = round_to_dtype(lo, a.dtype()), h = round_to_dtype(hi, a.dtype());
  Tensor out = untracked([&] { return unary_forward(op, Op::clamp, a, false, {l, h}); });
  return record_unary(op, out, a, Op::clamp_backward, a, l, h);
}

// maximum / minimum: the backward compares the saved operands in the result's dtype (exact: promotion
// only widens) and sums each share back over its broadcast dimensions.
static Tensor pairwise_extreme_impl(std::string_view op, Op kernel, Op backward_kernel, const Tensor& a, const Tensor& b) {
  check_same_device(op, a, b);
  Tensor out = untracked([&] { return binary_forward(op, kernel, a, b, false); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record(op, out, {a, b}, [op, backward_kernel, sa = a.detach(), sb = b.detach()](const Tensor& g,
                                                                                                   const Needs& n) {
    const Tensor x = sa.to(g.dtype()), y = sb.to(g.dtype());
    Tensor ga, gb;
    if (n[0]) ga = reduce_grad(map(op, backward_kernel, g.shape(), g.dtype(), {g, x, y}), sa);
    if (n[1]) gb = reduce_grad(map(op, backward_kernel, g.shape(), g.dtype(), {g, y, x}), sb);
    return Grads{ga, gb};
  });
}

// ---- reductions ----

static Tensor sum_impl(const Tensor& a, const std::vector<std::int64_t>& dims_in, bool keepdim, std::optional<DType> dtype) {
  const DType out_dtype = dtype.value_or(a.dtype());
  if (!is_floating(out_dtype)) {
    throw DTypeError(fmt::format("{}: sums of {} tensors are not supported; pass dtype=f32 or cast first",
                                 label("sum"), dtype_name(out_dtype)));
  }
  const std::vector<std::int64_t> dims = normalize_dims("sum", a, dims_in);
  Tensor out = untracked([&] { return reduce_rows("sum", a, dims, keepdim, out_dtype, 1.0, 1.0); });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record("sum", out, {a}, [shape = a.shape(), dims, dt = a.dtype()](const Tensor& g, const Needs&) {
    return Grads{expand_grad(g, shape, dims).to(dt)};
  });
}

static Tensor mean_impl(const Tensor& a, const std::vector<std::int64_t>& dims_in, bool keepdim) {
  check_floating("mean", a);
  const std::vector<std::int64_t> dims = normalize_dims("mean", a, dims_in);
  const std::int64_t outputs = numel_of(reduced_shape(a.shape(), dims, false));
  const double factor = mean_factor(a.dtype(), outputs, a.numel());
  Tensor out = untracked([&] { return reduce_rows("mean", a, dims, keepdim, a.dtype(), factor, 1.0); });
  if (!autograd::any_requires_grad({a})) return out;
  const std::int64_t count = outputs == 0 ? 0 : a.numel() / std::max<std::int64_t>(outputs, 1);
  return autograd::record("mean", out, {a}, [shape = a.shape(), dims, count](const Tensor& g, const Needs&) {
    return Grads{div(expand_grad(g, shape, dims), static_cast<double>(count))};
  });
}

static Tensor argmax_impl(const Tensor& a, std::int64_t dim) {
  const std::int64_t d = wrap(dim, a.dim(), "argmax", a.shape());
  if (a.dim() > 0 && a.size(d) == 0) {
    throw IndexError(fmt::format("{}: dimension {} of shape {} is empty", label("argmax"), d, shape_str(a.shape())));
  }
  return untracked([&] {
    const std::vector<std::int64_t> dims = a.dim() == 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{d};
    const Tensor rows = as_rows(a, dims);
    Tensor out = Tensor::empty({rows.size(0)}, {DType::i64, a.device()});
    run_kernel_general("argmax", Op::argmax_rows, {out}, {rows});
    return out.reshape(reduced_shape(a.shape(), dims, false));
  });
}

// ---- ops for hand-written losses: reductions ----

namespace {
void check_reduced_dims_not_empty(std::string_view op, const Tensor& a, const std::vector<std::int64_t>& dims) {
  for (std::int64_t d : dims) {
    if (a.size(d) == 0) {
      throw IndexError(fmt::format("{}: dimension {} of shape {} is empty, and {} needs at least one element to "
                                   "reduce\nhint: reduce over the other dimensions, or check how the tensor was built",
                                   label(op), d, shape_str(a.shape()), op));
    }
  }
}

// The elements of each row of `rows` equal to that row's result share its gradient evenly.
Tensor evenly_distribute(std::string_view op, const Tensor& g, const Tensor& x, const Tensor& y,
                         const std::vector<std::int64_t>& dims, bool nan_matches) {
  const Tensor rows = as_rows(x, dims);
  const std::int64_t r = rows.size(0);
  Tensor dx = Tensor::empty(rows.shape(), {g.dtype(), g.device()});
  run_kernel_general(op, Op::evenly_distribute_rows, {dx},
                     {g.contiguous().reshape({r}), rows.to(g.dtype()), y.contiguous().reshape({r}).to(g.dtype())},
                     {nan_matches ? 1.0 : 0.0});
  return from_rows(dx, x.shape(), dims);
}
}  // namespace

static Tensor max_all_impl(std::string_view op, bool largest, const Tensor& a) {
  check_floating(op, a);
  if (a.numel() == 0) {
    throw IndexError(fmt::format("{}: the tensor of shape {} is empty, and {} needs at least one element\n"
                                 "hint: give a dimension ({}(x, dim)) to reduce the non-empty ones", label(op),
                                 shape_str(a.shape()), op, op));
  }
  const std::vector<std::int64_t> dims = normalize_dims(op, a, {});
  Tensor out = untracked([&] {
    const Tensor rows = a.contiguous().reshape({1, a.numel()});
    Tensor v = Tensor::empty({1}, {a.dtype(), a.device()});
    run_kernel_general(op, largest ? Op::max_rows : Op::min_rows, {v}, {rows});
    return v.reshape({});
  });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record(op, out, {a}, [op, dims, x = a.detach(), y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{evenly_distribute(op, g, x, y, dims, /*nan_matches=*/true)};
  });
}

static ValuesAndIndices max_dim_impl(std::string_view op, bool largest, const Tensor& a, std::int64_t dim, bool keepdim) {
  check_floating(op, a);
  const std::int64_t d = wrap(dim, a.dim(), op, a.shape());
  const std::vector<std::int64_t> dims = a.dim() == 0 ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{d};
  check_reduced_dims_not_empty(op, a, dims);
  const Shape out_shape = reduced_shape(a.shape(), dims, keepdim);
  Tensor index;
  Tensor out = untracked([&] {
    const Tensor rows = as_rows(a, dims);
    Tensor v = Tensor::empty({rows.size(0)}, {a.dtype(), a.device()});
    index = Tensor::empty({rows.size(0)}, {DType::i64, a.device()});
    run_kernel_general(op, largest ? Op::max_rows : Op::min_rows, {v, index}, {rows});
    return v.reshape(out_shape);
  });
  ValuesAndIndices result{out, index.reshape(out_shape)};
  if (!autograd::any_requires_grad({a})) return result;
  result.values = autograd::record(op, out, {a}, [op, dims, index, shape = a.shape()](const Tensor& g, const Needs&) {
    const std::int64_t r = index.numel();
    const std::int64_t cols = r == 0 ? 0 : numel_of(shape) / r;
    Tensor dx = Tensor::empty({r, cols}, {g.dtype(), g.device()});
    run_kernel_general(op, Op::index_backward_rows, {dx}, {g.contiguous().reshape({r}), index});
    return Grads{from_rows(dx, shape, dims)};
  });
  return result;
}

static Tensor amax_impl(std::string_view op, bool largest, const Tensor& a, const std::vector<std::int64_t>& dims_in,
                        bool keepdim) {
  check_floating(op, a);
  const std::vector<std::int64_t> dims = normalize_dims(op, a, dims_in);
  check_reduced_dims_not_empty(op, a, dims);
  Tensor out = untracked([&] {
    const Tensor rows = as_rows(a, dims);
    Tensor v = Tensor::empty({rows.size(0)}, {a.dtype(), a.device()});
    run_kernel_general(op, largest ? Op::max_rows : Op::min_rows, {v}, {rows});
    return v.reshape(reduced_shape(a.shape(), dims, keepdim));
  });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record(op, out, {a}, [op, dims, x = a.detach(), y = out.detach()](const Tensor& g, const Needs&) {
    return Grads{evenly_distribute(op, g, x, y, dims, /*nan_matches=*/false)};
  });
}

static Tensor var_impl(std::string_view op, bool take_sqrt, const Tensor& a, const std::vector<std::int64_t>& dims_in,
                       double correction, bool keepdim) {
  check_floating(op, a);
  const std::vector<std::int64_t> dims = normalize_dims(op, a, dims_in);
  Tensor out = untracked([&] {
    const Tensor rows = as_rows(a, dims);
    Tensor v = Tensor::empty({rows.size(0)}, {a.dtype(), a.device()});
    run_kernel_general(op, Op::var_rows, {v}, {rows}, {correction, take_sqrt ? 1.0 : 0.0});
    return v.reshape(reduced_shape(a.shape(), dims, keepdim));
  });
  if (!autograd::any_requires_grad({a})) return out;
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= a.size(d);
  return autograd::record(op, out, {a}, [=, x = a.detach(), y = out.detach()](const Tensor& g, const Needs&) {
    // std: var's backward at (grad / (result * 2)).masked_fill_(result == 0, 0).
    const Tensor gv = take_sqrt ? map(op, Op::std_backward, g.shape(), g.dtype(), {div(g, mul(y, 2.0)), y}) : g;
    // var: (2 / (N - correction)) * grad * (self - self.mean(dims, keepdim=true)), PyTorch's steps and order.
    const Tensor ge = gv.reshape(reduced_shape(x.shape(), dims, true));
    return Grads{mul(mul(ge, 2.0 / (static_cast<double>(n) - correction)), sub(x, mean(x, dims, true)))};
  });
}

namespace {
Tensor softmax_common(std::string_view op, const Tensor& a, std::int64_t dim, std::optional<DType> dtype, bool log) {
  const DType out_dtype = dtype.value_or(a.dtype());
  if (!is_floating(out_dtype)) {
    throw DTypeError(fmt::format("{}: the result dtype must be floating, got {}\nhint: pass dtype = f32, or cast the "
                                 "input first",
                                 label(op), dtype_name(out_dtype)));
  }
  const std::int64_t d = wrap(dim, a.dim(), op, a.shape());
  const Op kernel = log ? Op::log_softmax_rows : Op::softmax_rows;
  const Op backward_kernel = log ? Op::log_softmax_backward_rows : Op::softmax_backward_rows;
  // Rows along `d`: the dimension moved last, made contiguous; the result is moved back.
  auto along = [d](const Tensor& t) { return t.dim() == 0 ? t.reshape({1, 1}) : t.transpose(d, -1).contiguous(); };
  auto rows_of = [](const Tensor& t) { return t.reshape({t.numel() / std::max<std::int64_t>(t.shape().back(), 1), t.shape().back()}); };
  Tensor out = untracked([&] {
    const Tensor moved = along(a.to(out_dtype));
    Tensor y = Tensor::empty(moved.shape(), {out_dtype, a.device()});
    run_kernel_general(op, kernel, {rows_of(y)}, {rows_of(moved)});
    return a.dim() == 0 ? y.reshape({}) : y.transpose(d, -1);
  });
  if (!autograd::any_requires_grad({a})) return out;
  return autograd::record(op, out, {a}, [=, y = out.detach(), in_dtype = a.dtype()](const Tensor& g, const Needs&) {
    const Tensor gm = along(g), ym = along(y);
    Tensor dx = Tensor::empty(gm.shape(), {gm.dtype(), gm.device()});
    run_kernel_general(op, backward_kernel, {rows_of(dx)}, {rows_of(gm), rows_of(ym)});
    return Grads{(y.dim() == 0 ? dx.reshape({}) : dx.transpose(d, -1)).to(in_dtype)};
  });
}
}  // namespace

// ---- matrix products ----

static Tensor bmm_impl(const Tensor& a, const Tensor& b) {
  if (a.dim() != 3 || b.dim() != 3) {
    throw ShapeError(fmt::format("{}: expected two 3-D tensors [B, M, K] and [B, K, N], got {} and {}", label("bmm"),
                                 shape_str(a.shape()), shape_str(b.shape())));
  }
  if (a.size(0) != b.size(0) || a.size(2) != b.size(1)) {
    throw ShapeError(fmt::format("{}: shapes {} and {} do not fit: batch {} vs {}, inner dimension {} vs {}", label("bmm"),
                                 shape_str(a.shape()), shape_str(b.shape()), a.size(0), b.size(0), a.size(2), b.size(1)));
  }
  check_floating("bmm", a);
  check_same_dtype("bmm", a, "the first matrix", b, "the second");
  check_same_device("bmm", a, b);
  Tensor out = untracked([&] { return gemm("bmm", a, b, a.dtype()); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("bmm", out, {a, b}, [sa = a.detach(), sb = b.detach()](const Tensor& g, const Needs& n) {
    return Grads{n[0] ? gemm("bmm", g, transpose_last(sb), sa.dtype()) : Tensor(),
                 n[1] ? gemm("bmm", transpose_last(sa), g, sb.dtype()) : Tensor()};
  });
}

static Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  if (a.dim() == 0 || b.dim() == 0) {
    throw ShapeError(fmt::format("{}: both arguments need at least one dimension, got shapes {} and {}", label("matmul"),
                                 shape_str(a.shape()), shape_str(b.shape())));
  }
  check_floating("matmul", a);
  check_same_dtype("matmul", a, "the first matrix", b, "the second");
  check_same_device("matmul", a, b);
  // Bring both to 3-D: a [Ba, M, K], b [Bb, K, N] with Bb equal to Ba or 1 (a 2-D b shared by all).
  const bool a_vec = a.dim() == 1, b_vec = b.dim() == 1;
  const std::int64_t K = a.size(-1);
  const std::int64_t Kb = b_vec ? b.size(0) : b.size(-2);
  if (K != Kb) {
    throw ShapeError(fmt::format("{}: shapes {} and {} cannot be multiplied ({} columns vs {} rows)", label("matmul"),
                                 shape_str(a.shape()), shape_str(b.shape()), K, Kb));
  }
  Shape batch_a(a.shape().begin(), a.shape().end() - std::min<std::int64_t>(a.dim(), 2));
  Shape batch_b(b.shape().begin(), b.shape().end() - std::min<std::int64_t>(b.dim(), 2));
  if (b.dim() > 2 && batch_a != batch_b) {
    throw ShapeError(fmt::format("{}: batch dimensions {} and {} differ (broadcasting batch dimensions is not "
                                 "supported; expand one first)",
                                 label("matmul"), shape_str(batch_a), shape_str(batch_b)));
  }
  const std::int64_t M = a_vec ? 1 : a.size(-2);
  const std::int64_t N = b_vec ? 1 : b.size(-1);
  Shape out_shape = batch_a;  // equal to batch_b when b is batched (checked above)
  if (!a_vec) out_shape.push_back(M);
  if (!b_vec) out_shape.push_back(N);
  const bool shared_b = b.dim() <= 2;
  Tensor a3, b3;
  {
    NoGradGuard guard;
    if (shared_b) {
      // Every batch of a against one b: fold the batch into the rows, one product.
      a3 = a.reshape({1, a.numel() / std::max<std::int64_t>(K, 1), K});
      b3 = b.reshape({1, K, N});
    } else {
      const std::int64_t B = numel_of(batch_b);
      a3 = a.reshape({B, M, K});
      b3 = b.reshape({B, K, N});
    }
  }
  Tensor out = untracked([&] { return gemm("matmul", a3, b3, a.dtype()).reshape(out_shape); });
  if (!autograd::any_requires_grad({a, b})) return out;
  return autograd::record("matmul", out, {a, b},
                          [sa = a3.detach(), sb = b3.detach(), a_shape = a.shape(), b_shape = b.shape()](
                              const Tensor& g, const Needs& n) {
                            const Tensor g3 = g.reshape({sa.size(0), sa.size(1), sb.size(2)});
                            return Grads{n[0] ? gemm("matmul", g3, transpose_last(sb), sa.dtype()).reshape(a_shape) : Tensor(),
                                         n[1] ? gemm("matmul", transpose_last(sa), g3, sb.dtype()).reshape(b_shape) : Tensor()};
                          });
}

// linear() inside an Fp8Guard (core/fp8_linear.h): TE's fprop, dgrad and wgrad GEMMs on quantized operands.
// The checks have been made by linear_impl. The node's backward quantizes grad_output (recording its amax in
// the module's state); under the twin's widening it computes instead the unquantized product, as the bf16
// path's backward does, so that the twin measures what FP8 and bf16 together lost against f32.
// `what_if` (null unless --what-if measures this Linear: core/what_if.h) quantizes the operands again as a
// block-scaled recipe would, for its statistics only.
static Tensor fp8_linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8Context> fp8,
                              std::shared_ptr<WhatIfContext> what_if) {
  const std::string module = current_scope();
  const std::int64_t in = weight.size(1), out_features = weight.size(0);
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(in, 1);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Fp8LinearState* state = fp8->options().recipe == Fp8Recipe::delayed ? &fp8->state(module) : nullptr;
  auto qx = std::make_shared<Fp8Quantized>();
  auto qw = std::make_shared<Fp8Quantized>();
  // Which operands need gradients (read with grad mode still on): the copies a block-scaled recipe would make.
  const bool grads = autograd::any_requires_grad({x, weight, bias});
  const bool x_grad = grads && autograd::any_requires_grad({x}), w_grad = grads && autograd::any_requires_grad({weight});
  Tensor x2;
  Tensor out = untracked([&] {
    x2 = x.reshape({rows, in});
    *qx = fp8_quantize_operand(x2, Fp8Operand::input, fp8->options(), state, module);
    *qw = fp8_quantize_operand(weight, Fp8Operand::weight, fp8->options(), state, module);
    if (what_if) what_if_linear_forward(*what_if, module, x2, weight, x_grad, w_grad);
    return fp8_gemm(*qx, false, *qw, true, x.dtype(), bias).reshape(out_shape);
  });
  if (!grads) return out;
  return autograd::record(
      "linear", out, {x, weight, bias},
      [fp8, what_if, module, qx, qw, sx = x2.detach(), sw = weight.detach(), x_shape = x.shape(),
       has_bias = bias.defined()](const Tensor& g, const Needs& n) {
        const std::int64_t r = sx.size(0), o = sw.size(0), i = sw.size(1);
        const Tensor g2 = g.reshape({r, o});
        Tensor gx, gw, gb;
        if (autograd::widening_target()) {
          const Tensor g3 = g.reshape({1, r, o});
          if (n[0]) gx = gemm("linear", g3, sw.reshape({1, o, i}), sx.dtype()).reshape(x_shape);
          if (n[1]) gw = gemm("linear", transpose_last(g3), sx.reshape({1, r, i}), sw.dtype()).reshape({o, i});
        } else if (n[0] || n[1]) {
          Fp8LinearState* st = fp8->options().recipe == Fp8Recipe::delayed ? &fp8->state(module) : nullptr;
          const Fp8Quantized qg = fp8_quantize_operand(g2, Fp8Operand::grad_output, fp8->options(), st, module);
          if (what_if) what_if_linear_backward(*what_if, module, g2, n[0], n[1]);
          if (n[0]) gx = fp8_gemm(qg, false, *qw, false, sx.dtype()).reshape(x_shape);  // dgrad: Q(dy) Q(W)
          if (n[1]) gw = fp8_gemm(qg, true, *qx, false, sw.dtype());                    // wgrad: Q(dy)^T Q(x)
        }
        if (has_bias && n[2]) gb = sum_to(g2, {o});
        return Grads{gx, gw, gb};
      });
}

// A 2-D tensor's values as f32, row-major.
static std::vector<float> f32_values(const Tensor& t) {
  const Tensor f = t.to(DType::f32).contiguous();
  return std::vector<float>(f.data_as<float>(), f.data_as<float>() + f.numel());
}

// linear() inside an Fp8Guard whose recipe is mxfp8 or nvfp4 (core/block_linear.h): the forward quantizes the
// rowwise copies of x and W for fprop, and (as TE's quantizers make both usages in one cast) the columnwise copies
// the backward will need: W's when x needs a gradient (dgrad), x's when W does (wgrad). The backward quantizes dy's
// two copies. Under the twin's widening the backward is the unquantized product, as fp8_linear_impl's.
static Tensor block_linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, std::shared_ptr<Fp8Context> ctx) {
  const std::string module = current_scope();
  const std::int64_t in = weight.size(1), out_features = weight.size(0);
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(in, 1);
  const bool grads = autograd::any_requires_grad({x, weight, bias});
  if (!x.device().is_cpu()) {
    throw DeviceError(fmt::format("linear in '{}': block-scaled (mxfp8, nvfp4) Linear GEMMs run on the CPU only\n"
                                  "hint: run the model on the CPU",
                                  module));
  }
  check_block_linear_shape(ctx->options().recipe, module, rows, in, out_features, grads);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  // Asked here, not inside untracked(), where no tensor records a gradient.
  const bool x_grad = grads && autograd::any_requires_grad({x});
  const bool w_grad = grads && autograd::any_requires_grad({weight});
  auto qx_col = std::make_shared<BlockOperand>();
  auto qw_col = std::make_shared<BlockOperand>();
  Tensor x2;
  Tensor out = untracked([&] {
    x2 = x.reshape({rows, in});
    const std::vector<float> xv = f32_values(x2), wv = f32_values(weight);
    const BlockOperand qx = block_quantize_copy(xv, rows, in, Fp8Operand::input, BlockCopy::rowwise, *ctx, module);
    const BlockOperand qw =
        block_quantize_copy(wv, out_features, in, Fp8Operand::weight, BlockCopy::rowwise, *ctx, module);
    if (x_grad)
      *qw_col = block_quantize_copy(wv, out_features, in, Fp8Operand::weight, BlockCopy::columnwise, *ctx, module);
    if (w_grad)
      *qx_col = block_quantize_copy(xv, rows, in, Fp8Operand::input, BlockCopy::columnwise, *ctx, module);
    return block_gemm(qx, qw, x.dtype(), bias).reshape(out_shape);
  });
  if (!grads) return out;
  return autograd::record(
      "linear", out, {x, weight, bias},
      [ctx, module, qx_col, qw_col, sx = x2.detach(), sw = weight.detach(), x_shape = x.shape(),
       has_bias = bias.defined()](const Tensor& g, const Needs& n) {
        const std::int64_t r = sx.size(0), o = sw.size(0), i = sw.size(1);
        const Tensor g2 = g.reshape({r, o});
        Tensor gx, gw, gb;
        if (autograd::widening_target()) {
          const Tensor g3 = g.reshape({1, r, o});
          if (n[0]) gx = gemm("linear", g3, sw.reshape({1, o, i}), sx.dtype()).reshape(x_shape);
          if (n[1]) gw = gemm("linear", transpose_last(g3), sx.reshape({1, r, i}), sw.dtype()).reshape({o, i});
        } else if (n[0] || n[1]) {
          const std::vector<float> gv = f32_values(g2);
          if (n[0]) {  // dgrad: dx = dy W, contraction over out_features
            const BlockOperand qg = block_quantize_copy(gv, r, o, Fp8Operand::grad_output, BlockCopy::rowwise, *ctx, module);
            gx = block_gemm(qg, *qw_col, sx.dtype()).reshape(x_shape);
          }
          if (n[1]) {  // wgrad: dW = dy^T x, contraction over the rows
            const BlockOperand qg =
                block_quantize_copy(gv, r, o, Fp8Operand::grad_output, BlockCopy::columnwise, *ctx, module);
            gw = block_gemm(qg, *qx_col, sw.dtype());
          }
        }
        if (has_bias && n[2]) gb = sum_to(g2, {o});
        return Grads{gx, gw, gb};
      });
}

static Tensor linear_impl(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (weight.dim() != 2) {
    throw ShapeError(fmt::format("{}: weight must be 2-D [out_features, in_features], got {}", label("linear"),
                                 shape_str(weight.shape())));
  }
  if (x.dim() == 0 || x.size(-1) != weight.size(1)) {
    throw ShapeError(fmt::format("{}: the input has {} features (shape {}) but the weight {} expects {}\n"
                                 "hint: check the in_features of the layer against the flattened size of its input",
                                 label("linear"), x.dim() == 0 ? 0 : x.size(-1), shape_str(x.shape()),
                                 shape_str(weight.shape()), weight.size(1)));
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != weight.size(0))) {
    throw ShapeError(fmt::format("{}: bias of shape {} does not match out_features {}", label("linear"),
                                 shape_str(bias.shape()), weight.size(0)));
  }
  check_floating("linear", x);
  check_same_dtype("linear", x, "the input", weight, "the weight");
  check_same_dtype("linear", x, "the input", bias, "the bias");
  check_same_device("linear", x, weight);
  check_same_device("linear", x, bias);
  // --what-if (core/what_if.h): null, at the cost of one thread-local read, unless a WhatIfGuard is alive.
  std::shared_ptr<WhatIfContext> what_if = active_what_if() ? what_if_for_linear(x, current_scope()) : nullptr;
  if (std::shared_ptr<Fp8Context> fp8 = active_fp8_context();
      fp8 != nullptr && (x.dtype() == DType::bf16 || x.dtype() == DType::f16) && !autograd::widening_target() &&
      fp8->covers(current_scope())) {
    // A block-scaled run is never --what-if (check_what_if_run refuses it).
    if (is_block_recipe(fp8->options().recipe)) return block_linear_impl(x, weight, bias, std::move(fp8));
    return fp8_linear_impl(x, weight, bias, std::move(fp8), std::move(what_if));
  }
  const std::int64_t in = weight.size(1), out_features = weight.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor x3;
  {
    NoGradGuard guard;
    x3 = x.reshape({1, x.numel() / std::max<std::int64_t>(in, 1), in});
  }
  if (what_if) {
    // Which operands need gradients (with grad mode on): the copies a block-scaled recipe would make.
    const bool grads = autograd::any_requires_grad({x, weight, bias});
    const bool x_grad = grads && autograd::any_requires_grad({x}), w_grad = grads && autograd::any_requires_grad({weight});
    untracked([&] {
      what_if_linear_forward(*what_if, current_scope(), x3.reshape({x3.size(1), in}), weight, x_grad, w_grad);
      return 0;
    });
  }
  Tensor out = untracked([&] {
    const Tensor w3 = weight.transpose(0, 1).reshape({1, in, out_features});
    return gemm("linear", x3, w3, x.dtype(), bias, false).reshape(out_shape);
  });
  if (!autograd::any_requires_grad({x, weight, bias})) return out;
  return autograd::record(
      "linear", out, {x, weight, bias},
      [what_if, module = what_if ? current_scope() : std::string(), sx = x3.detach(), sw = weight.detach(),
       x_shape = x.shape(), has_bias = bias.defined()](const Tensor& g, const Needs& n) {
        const std::int64_t rows = sx.size(1), o = sw.size(0), i = sw.size(1);
        const Tensor g3 = g.reshape({1, rows, o});
        Tensor gx, gw, gb;
        if (what_if && (n[0] || n[1])) what_if_linear_backward(*what_if, module, g3.reshape({rows, o}), n[0], n[1]);
        if (n[0]) gx = gemm("linear", g3, sw.reshape({1, o, i}), sx.dtype()).reshape(x_shape);
        if (n[1]) gw = gemm("linear", transpose_last(g3), sx, sw.dtype()).reshape({o, i});
        if (has_bias && n[2]) gb = sum_to(g3.reshape({rows, o}), {o});
        return Grads{gx, gw, gb};
      });
}

// ---- convolution and pooling ----

// Images per step of a convolution's input gradient (column gradient, then col2im). On the CPU the
// column gradients ([C*KH*KW, OH*OW] an image, in the accumulation type) of a few images at a time stay in
// cache until col2im reads them; the whole batch's at once (the sample CNN's conv2: 42 MB) went out to
// memory after OpenBLAS had cleared them, and came back for the product and again for col2im: col2im and
// the clearing were 10.6% of the CNN's step at 1 thread, 6.4% in steps of 2 images (issue 37). Every
// image's product is the same sgemm call at any chunk size and col2im sums each input element from its
// own image's columns, so the chunk does not change a bit, nor depend on the thread count. An even number
// of images, at least 2 (gemm_kernel's per-batch path; as many images for each of 2 threads), about
// kInputGradChunkBytes of columns: 4 images of the sample CNN's conv2 (2.7 MB, in the L3 cache here; 2
// and 8 images cost the same CPU time at 1 and 2 threads, and each chunk is two forks and joins of the
// pool, so not fewer images).
inline constexpr std::int64_t kInputGradChunkBytes = std::int64_t{3} << 20;
static std::int64_t input_grad_chunk(std::int64_t images, std::int64_t image_bytes, const Device& device) {
  if (!device.is_cpu()) return images;  // one launch each on the GPU
  return 2 * std::max<std::int64_t>(1, kInputGradChunkBytes / std::max<std::int64_t>(2 * image_bytes, 1));
}

static Tensor conv2d_impl(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions o) {
  if (x.dim() != 4 || weight.dim() != 4) {
    throw ShapeError(fmt::format("{}: expected input [N, C, H, W] and weight [O, C, KH, KW], got {} and {}",
                                 label("conv2d"), shape_str(x.shape()), shape_str(weight.shape())));
  }
  if (x.size(1) != weight.size(1)) {
    throw ShapeError(fmt::format("{}: the input has {} channels (shape {}) but the weight {} expects {}", label("conv2d"),
                                 x.size(1), shape_str(x.shape()), shape_str(weight.shape()), weight.size(1)));
  }
  if (o.stride_h < 1 || o.stride_w < 1 || o.padding_h < 0 || o.padding_w < 0) {
    throw Error(fmt::format("{}: strides must be positive and padding non-negative, got stride ({}, {}) padding ({}, {})",
                            label("conv2d"), o.stride_h, o.stride_w, o.padding_h, o.padding_w));
  }
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const std::int64_t O = weight.size(0), KH = weight.size(2), KW = weight.size(3);
  const std::int64_t OH = (H + 2 * o.padding_h - KH) / o.stride_h + 1;
  const std::int64_t OW = (W + 2 * o.padding_w - KW) / o.stride_w + 1;
  if (H + 2 * o.padding_h < KH || W + 2 * o.padding_w < KW) {
    throw ShapeError(fmt::format("{}: the padded input ({} x {}) is smaller than the kernel ({} x {}); input shape {}",
                                 label("conv2d"), H + 2 * o.padding_h, W + 2 * o.padding_w, KH, KW, shape_str(x.shape())));
  }
  if (bias.defined() && (bias.dim() != 1 || bias.size(0) != O)) {
    throw ShapeError(fmt::format("{}: bias of shape {} does not match {} output channels", label("conv2d"),
                                 shape_str(bias.shape()), O));
  }
  check_floating("conv2d", x);
  check_same_dtype("conv2d", x, "the input", weight, "the weight");
  check_same_dtype("conv2d", x, "the input", bias, "the bias");
  check_same_device("conv2d", x, weight);
  check_same_device("conv2d", x, bias);
  const std::int64_t CKK = C * KH * KW, L = OH * OW;
  const std::initializer_list<double> window = {static_cast<double>(KH), static_cast<double>(KW),
                                                static_cast<double>(o.stride_h), static_cast<double>(o.stride_w),
                                                static_cast<double>(o.padding_h), static_cast<double>(o.padding_w)};
  const std::vector<double> win(window);
  Tensor cols;
  Tensor out = untracked([&] {
    cols = Tensor::empty({N, CKK, L}, {x.dtype(), x.device()});
    run_kernel_general("conv2d", Op::im2col, {cols}, {x.contiguous()}, window);
    const Tensor w3 = weight.reshape({1, O, CKK}).expand({N, O, CKK});
    return gemm("conv2d", w3, cols, x.dtype(), bias, true).reshape({N, O, OH, OW});
  });
  if (!autograd::any_requires_grad({x, weight, bias})) return out;
  return autograd::record(
      "conv2d", out, {x, weight, bias},
      [sc = cols.detach(), sw = weight.detach(), x_shape = x.shape(), win, has_bias = bias.defined()](const Tensor& g,
                                                                                                     const Needs& n) {
        const std::int64_t N = x_shape[0], O = sw.size(0), CKK = sc.size(1), L = sc.size(2);
        const Tensor g3 = g.reshape({N, O, L});
        Tensor gx, gw, gb;
        if (n[0]) {
          // The column gradient stays in the accumulation type until col2im has summed it.
          const DType acc = acc_dtype(sw.dtype());
          Tensor dx = Tensor::empty(x_shape, {acc, g.device()});
          const std::int64_t chunk = input_grad_chunk(N, CKK * L * static_cast<std::int64_t>(dtype_size(acc)), g.device());
          untracked([&] {
            for (std::int64_t i0 = 0; i0 < N; i0 += chunk) {
              const std::int64_t i1 = N - i0 < 2 * chunk ? N : i0 + chunk;  // no last chunk of fewer images
              const Tensor wt = sw.reshape({1, O, CKK}).transpose(1, 2).expand({i1 - i0, CKK, O});
              const Tensor dcols = gemm("conv2d", wt, g3.slice(0, i0, i1), acc);
              run_kernel_general("conv2d", Op::col2im, {dx.slice(0, i0, i1)}, {dcols},
                                 {win[0], win[1], win[2], win[3], win[4], win[5]});
              if (i1 == N) break;
            }
            return 0;
          });
          gx = dx.to(sw.dtype());
        }
        if (n[1]) {
          // sum_n g[n] @ cols[n]^T, accumulated over the whole batch before rounding once.
          gw = gemm_sum_batches("conv2d", g3, sc.transpose(1, 2), sw.dtype()).reshape(sw.shape());
        }
        if (has_bias && n[2]) gb = sum(g, {0, 2, 3});
        return Grads{gx, gw, gb};
      });
}

static Tensor max_pool2d_impl(const Tensor& x, Pool2dOptions o) {
  if (x.dim() != 4) {
    throw ShapeError(fmt::format("{}: expected input [N, C, H, W], got {}", label("max_pool2d"), shape_str(x.shape())));
  }
  check_floating("max_pool2d", x);
  const std::int64_t sh = o.stride_h == 0 ? o.kernel_h : o.stride_h, sw = o.stride_w == 0 ? o.kernel_w : o.stride_w;
  if (o.kernel_h < 1 || o.kernel_w < 1 || sh < 1 || sw < 1 || o.padding_h < 0 || o.padding_w < 0 ||
      o.padding_h > o.kernel_h / 2 || o.padding_w > o.kernel_w / 2) {
    throw Error(fmt::format("{}: kernel ({}, {}), stride ({}, {}) and padding ({}, {}) are invalid: sizes must be positive "
                            "and padding at most half the kernel",
                            label("max_pool2d"), o.kernel_h, o.kernel_w, sh, sw, o.padding_h, o.padding_w));
  }
  const std::int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  if (H + 2 * o.padding_h < o.kernel_h || W + 2 * o.padding_w < o.kernel_w) {
    throw ShapeError(fmt::format("{}: the input {} is smaller than the kernel ({} x {})", label("max_pool2d"),
                                 shape_str(x.shape()), o.kernel_h, o.kernel_w));
  }
  const std::int64_t OH = (H + 2 * o.padding_h - o.kernel_h) / sh + 1, OW = (W + 2 * o.padding_w - o.kernel_w) / sw + 1;
  const std::vector<double> win = {static_cast<double>(o.kernel_h), static_cast<double>(o.kernel_w),
                                   static_cast<double>(sh), static_cast<double>(sw),
                                   static_cast<double>(o.padding_h), static_cast<double>(o.padding_w)};
  Tensor index;
  Tensor out = untracked([&] {
    Tensor y = Tensor::empty({N, C, OH, OW}, {x.dtype(), x.device()});
    index = Tensor::empty({N, C, OH, OW}, {DType::i64, x.device()});
    run_kernel_general("max_pool2d", Op::max_pool2d, {y, index}, {x.contiguous()},
                       {win[0], win[1], win[2], win[3], win[4], win[5]});
    return y;
  });
  if (!autograd::any_requires_grad({x})) return out;
  return autograd::record("max_pool2d", out, {x}, [index, x_shape = x.shape(), win](const Tensor& g, const Needs&) {
    Tensor dx = Tensor::empty(x_shape, {g.dtype(), g.device()});
    run_kernel_general("max_pool2d", Op::max_pool2d_backward, {dx}, {g.contiguous(), index},
                       {win[0], win[1], win[2], win[3], win[4], win[5]});
    return Grads{dx};
  });
}

// ---- normalisation, embedding, dropout, concatenation ----

static Tensor layer_norm_impl(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps) {
  const auto nd = static_cast<std::int64_t>(normalized_shape.size());
  const bool fits = nd >= 1 && x.dim() >= nd && Shape(x.shape().end() - nd, x.shape().end()) == normalized_shape;
  if (!fits) {
    throw ShapeError(fmt::format("{}: normalized_shape {} does not match the trailing dimensions of the input {}\n"
                                 "hint: the layer was built for a last dimension of {}",
                                 label("layer_norm"), shape_str(normalized_shape), shape_str(x.shape()),
                                 normalized_shape.empty() ? 0 : normalized_shape.back()));
  }
  for (const Tensor* p : {&weight, &bias}) {
    if (p->defined() && p->shape() != normalized_shape) {
      throw ShapeError(fmt::format("{}: {} has shape {} but normalized_shape is {}", label("layer_norm"),
                                   p == &weight ? "weight" : "bias", shape_str(p->shape()), shape_str(normalized_shape)));
    }
  }
  check_floating("layer_norm", x);
  check_same_dtype("layer_norm", x, "the input", weight, "the weight");
  check_same_dtype("layer_norm", x, "the input", bias, "the bias");
  check_same_device("layer_norm", x, weight);
  check_same_device("layer_norm", x, bias);
  const std::int64_t cols = numel_of(normalized_shape), rows = cols == 0 ? 0 : x.numel() / cols;
  const DType acc = acc_dtype(x.dtype());
  Tensor mean_t, rstd_t, x2;
  Tensor out = untracked([&] {
    x2 = x.contiguous().reshape({rows, cols});
    Tensor y = Tensor::empty({rows, cols}, {x.dtype(), x.device()});
    mean_t = Tensor::empty({rows}, {acc, x.device()});
    rstd_t = Tensor::empty({rows}, {acc, x.device()});
    const Tensor w = weight.defined() ? weight.contiguous().reshape({cols}) : Tensor();
    const Tensor b = bias.defined() ? bias.contiguous().reshape({cols}) : Tensor();
    run_kernel_general("layer_norm", Op::layer_norm_rows, {y, mean_t, rstd_t}, {x2, w, b}, {eps});
    return y.reshape(x.shape());
  });
  if (!autograd::any_requires_grad({x, weight, bias})) return out;
  return autograd::record(
      "layer_norm", out, {x, weight, bias},
      [sx = x2.detach(), sw = weight.defined() ? weight.detach().contiguous().reshape({cols}) : Tensor(), mean_t, rstd_t,
       x_shape = x.shape(), normalized_shape, has_bias = bias.defined()](const Tensor& g, const Needs& n) {
        const Tensor g2 = g.contiguous().reshape(sx.shape());
        Tensor gx, gw, gb;
        if (n[0]) {
          Tensor dx = Tensor::empty(sx.shape(), {sx.dtype(), sx.device()});
          run_kernel_general("layer_norm", Op::layer_norm_backward_rows, {dx}, {g2, sx, mean_t, rstd_t, sw});
          gx = dx.reshape(x_shape);
        }
        if ((sw.defined() && n[1]) || (has_bias && n[2])) {
          Tensor dw = Tensor::empty({sx.size(1)}, {sx.dtype(), sx.device()});
          Tensor db = Tensor::empty({sx.size(1)}, {sx.dtype(), sx.device()});
          run_kernel_general("layer_norm", Op::layer_norm_param_grad, {dw, db}, {g2, sx, mean_t, rstd_t});
          if (sw.defined() && n[1]) gw = dw.reshape(normalized_shape);
          if (has_bias && n[2]) gb = db.reshape(normalized_shape);
        }
        return Grads{gx, gw, gb};
      });
}

static Tensor embedding_impl(const Tensor& indices, const Tensor& weight) {
  if (indices.dtype() != DType::i64) {
    throw DTypeError(fmt::format("{}: indices must be i64, got {} of shape {}\nhint: build them with DType::i64",
                                 label("embedding"), dtype_name(indices.dtype()), shape_str(indices.shape())));
  }
  if (weight.dim() != 2) {
    throw ShapeError(fmt::format("{}: weight must be 2-D [num_embeddings, dim], got {}", label("embedding"),
                                 shape_str(weight.shape())));
  }
  check_floating("embedding", weight, "weight");
  check_same_device("embedding", weight, indices);
  const std::int64_t V = weight.size(0), D = weight.size(1);
  // On the CPU the indices are checked here, before the kernel, and a bad one throws at once. On a GPU,
  // copying them here would make the host wait for the device on every call: the backend checks them on
  // the device instead and throws the same IndexError at its next host synchronisation (docs/cuda.md,
  // "What synchronises").
  if (indices.device().is_cpu()) {
    const std::vector<std::int64_t> idx = host_indices(indices);
    for (std::size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] < 0 || idx[i] >= V) {
        throw IndexError(fmt::format("{}: index {} at position {} is out of range for {} embeddings",
                                     label("embedding"), idx[i], i, V));
      }
    }
  }
  Shape out_shape = indices.shape();
  out_shape.push_back(D);
  const Tensor flat = untracked([&] { return indices.contiguous().reshape({indices.numel()}); });
  Tensor out = untracked([&] {
    Tensor y = Tensor::empty({flat.numel(), D}, {weight.dtype(), weight.device()});
    run_kernel_general("embedding", Op::embedding, {y}, {weight.contiguous(), flat});
    return y.reshape(out_shape);
  });
  if (!autograd::any_requires_grad({weight})) return out;
  return autograd::record("embedding", out, {Tensor(), weight}, [flat, V, D](const Tensor& g, const Needs&) {
    Tensor dw = Tensor::empty({V, D}, {g.dtype(), g.device()});
    run_kernel_general("embedding", Op::embedding_backward, {dw}, {g.contiguous().reshape({flat.numel(), D}), flat});
    return Grads{Tensor(), dw};
  });
}

static Tensor dropout_impl(const Tensor& x, double p, bool training, Generator& gen) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw Error(fmt::format("{}: probability has to be between 0 and 1, but got {}", label("dropout"), p));
  }
  if (!training || p == 0.0) return x;
  check_floating("dropout", x);
  // The scale is 1 / (1 - p) in the compute type, as PyTorch's kernel computes it.
  const double scale = p == 1.0 ? 0.0
                       : x.dtype() == DType::f64 ? 1.0 / (1.0 - p)
                                                 : static_cast<double>(1.0f / (1.0f - static_cast<float>(p)));
  const std::uint64_t offset = gen.advance(static_cast<std::uint64_t>(x.numel()));
  Tensor keep;
  Tensor out = untracked([&] {
    Tensor y = Tensor::empty(x.shape(), {x.dtype(), x.device()});
    keep = Tensor::empty(x.shape(), {DType::boolean, x.device()});
    run_kernel_general("dropout", Op::dropout, {y, keep}, {x}, {p, scale}, gen.seed(), offset);
    return y;
  });
  if (!autograd::any_requires_grad({x})) return out;
  return autograd::record("dropout", out, {x}, [keep, scale](const Tensor& g, const Needs&) {
    return Grads{map("dropout", Op::masked_scale, g.shape(), g.dtype(), {g, keep}, {scale})};
  });
}

static Tensor cat_impl(const std::vector<Tensor>& tensors, std::int64_t dim) {
  if (tensors.empty()) throw Error(fmt::format("{}: expected a non-empty list of tensors", label("cat")));
  const Tensor& first = tensors.front();
  if (first.dim() == 0) throw ShapeError(fmt::format("{}: zero-dimensional tensors cannot be concatenated", label("cat")));
  const std::int64_t d = wrap(dim, first.dim(), "cat", first.shape());
  DType result = first.dtype();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_device("cat", first, t);
    bool ok = t.dim() == first.dim();
    for (std::int64_t k = 0; ok && k < t.dim(); ++k) ok = k == d || t.size(k) == first.size(k);
    if (!ok) {
      throw ShapeError(fmt::format("{}: tensor {} has shape {}, which does not match {} (tensor 0) outside dimension {}",
                                   label("cat"), i, shape_str(t.shape()), shape_str(first.shape()), d));
    }
    result = promote_types(result, t.dtype());
    total += t.size(d);
  }
  Shape out_shape = first.shape();
  out_shape[d] = total;
  Tensor out = untracked([&] {
    Tensor y = Tensor::empty(out_shape, {result, first.device()});
    std::int64_t at = 0;
    for (const Tensor& t : tensors) {
      y.slice(d, at, at + t.size(d)).copy_(t);
      at += t.size(d);
    }
    return y;
  });
  if (!autograd::any_requires_grad(tensors)) return out;
  std::vector<std::pair<std::int64_t, DType>> parts;
  for (const Tensor& t : tensors) parts.emplace_back(t.size(d), t.dtype());
  return autograd::record("cat", out, tensors, [parts, d](const Tensor& g, const Needs& n) {
    Grads grads;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      grads.push_back(n[i] ? g.slice(d, at, at + parts[i].first).to(parts[i].second) : Tensor());
      at += parts[i].first;
    }
    return grads;
  });
}

// ---- losses ----

// x / count, divided in count's dtype (nll_loss's accumulation type: f32 for f32/f16/bf16, f64 for f64) and
// rounded to out_dtype: a GPU's nll_loss mean with its count on the device, bit for bit the CPU kernels'
// division by a host divisor. There sum_rows computes round(s * 1 / divisor) (s * 1 is exact), and
// nll_backward_rows round(-g / divisor): -g / d is -(g / d) exactly and round-to-nearest-even is symmetric,
// so dividing g here and letting the kernel compute -g' / 1 (exact) gives the same bits; one rounding to the
// accumulation type and one to out_dtype in both, NaN canonical in both.
static Tensor divide_by_count(std::string_view op, const Tensor& x, const Tensor& count, DType out_dtype) {
  const Tensor q = map(op, Op::div, x.shape(), count.dtype(), {x.to(count.dtype()), count});
  return q.to(out_dtype);
}

static Tensor nll_loss_impl(const Tensor& logp, const Tensor& target, Reduction reduction, std::int64_t ignore_index) {
  if (logp.dim() != 2 || target.dim() != 1 || target.size(0) != logp.size(0)) {
    throw ShapeError(fmt::format("{}: expected log-probabilities [N, C] and targets [N], got {} and {}", label("nll_loss"),
                                 shape_str(logp.shape()), shape_str(target.shape())));
  }
  if (target.dtype() != DType::i64) {
    throw DTypeError(fmt::format("{}: targets must be i64 class indices, got {}", label("nll_loss"),
                                 dtype_name(target.dtype())));
  }
  check_floating("nll_loss", logp);
  check_same_device("nll_loss", logp, target);
  const std::int64_t N = logp.size(0), C = logp.size(1);
  const bool on_host = logp.device().is_cpu();
  const bool mean = reduction == Reduction::mean;
  // The mean divides by the number of counted targets (0 / 0 = NaN when all are ignored). On the CPU the
  // targets are checked and counted here, and a bad one throws at once. On a GPU that would cost a host
  // wait per call: the nll kernels check the targets on the device (an IndexError at the backend's next
  // host synchronisation, docs/cuda.md), and the count is a device value, `count`, in the accumulation
  // type, divided on the device below in the CPU kernels' arithmetic.
  double divisor = 1.0;
  Tensor count;
  const Tensor tc = target.contiguous();
  if (on_host) {
    const std::vector<std::int64_t> t = host_indices(target);
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      if (t[i] == ignore_index) continue;
      if (t[i] < 0 || t[i] >= C) {
        throw IndexError(
            fmt::format("{}: target {} (row {}) is out of bounds for {} classes", label("nll_loss"), t[i], i, C));
      }
      ++counted;
    }
    if (mean) divisor = static_cast<double>(counted);
  } else if (mean) {
    count = untracked([&] {
      Tensor c = Tensor::empty({}, {acc_dtype(logp.dtype()), logp.device()});
      backend_for(logp.device()).count_not_equal(tc.kernel_view(), ignore_index, c.kernel_view());
      return c;
    });
  }
  Tensor out = untracked([&] {
    Tensor per = Tensor::empty({N}, {logp.dtype(), logp.device()});
    run_kernel_general("nll_loss", Op::nll_rows, {per}, {logp.contiguous(), tc}, {static_cast<double>(ignore_index)});
    if (reduction == Reduction::none) return per;
    if (!count.defined()) return reduce_rows("nll_loss", per, {0}, false, per.dtype(), 1.0, divisor);
    return divide_by_count("nll_loss", reduce_rows("nll_loss", per, {0}, false, count.dtype(), 1.0, 1.0), count,
                           per.dtype());
  });
  if (!autograd::any_requires_grad({logp})) return out;
  return autograd::record("nll_loss", out, {logp, Tensor()},
                          [tc, N, C, ignore_index, divisor, count, reduction](const Tensor& g, const Needs&) {
                            // On a GPU with mean, g / count first (as the CPU kernel's -g / divisor: see
                            // divide_by_count), then the kernel's -g' / 1, which is exact.
                            const Tensor gc = count.defined() ? divide_by_count("nll_loss", g, count, g.dtype()) : g;
                            const Tensor gn = loss_grad(gc, {N}, reduction);
                            Tensor dx = Tensor::empty({N, C}, {g.dtype(), g.device()});
                            run_kernel_general("nll_loss", Op::nll_backward_rows, {dx}, {gn, tc},
                                               {static_cast<double>(ignore_index), divisor});
                            return Grads{dx, Tensor()};
                          });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, std::int64_t ignore_index) {
  if (logits.dim() != 2) {
    throw ShapeError(fmt::format("{}: expected logits [N, C], got {}", label("cross_entropy"), shape_str(logits.shape())));
  }
  return nll_loss(log_softmax(logits, 1), target, reduction, ignore_index);
}

namespace {
void check_loss_pair(std::string_view op, const Tensor& input, const Tensor& target) {
  if (input.shape() != target.shape()) {
    throw ShapeError(fmt::format("{}: input {} and target {} must have the same shape", label(op),
                                 shape_str(input.shape()), shape_str(target.shape())));
  }
  check_floating(op, input);
  check_same_dtype(op, input, "the input", target, "the target");
  check_same_device(op, input, target);
}

// The gradient scale of a loss: 1 / numel for mean (as PyTorch divides), 1 otherwise.
Tensor scale_loss_grad(const Tensor& grad, std::int64_t numel, Reduction reduction) {
  return reduction == Reduction::mean ? div(grad, static_cast<double>(numel)) : grad;
}
}  // namespace

static Tensor mse_loss_impl(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_loss_pair("mse_loss", input, target);
  Tensor out = untracked([&] {
    const Tensor d = sub(input, target);
    return apply_reduction("mse_loss", mul(d, d), reduction);
  });
  if (!autograd::any_requires_grad({input, target})) return out;
  return autograd::record("mse_loss", out, {input, target},
                          [si = input.detach(), st = target.detach(), reduction](const Tensor& g, const Needs& n) {
                            // PyTorch: norm * (input - target) * grad, norm = 2 / numel for mean, else 2.
                            const double norm = reduction == Reduction::mean ? 2.0 / static_cast<double>(si.numel()) : 2.0;
                            const Tensor gi = mul(mul(sub(si, st), norm), loss_grad(g, si.shape(), reduction));
                            return Grads{n[0] ? gi : Tensor(), n[1] ? neg(gi) : Tensor()};
                          });
}

static Tensor binary_cross_entropy_impl(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_loss_pair("binary_cross_entropy", input, target);
  Tensor out = untracked([&] {
    return apply_reduction("binary_cross_entropy",
                           map("binary_cross_entropy", Op::bce, input.shape(), input.dtype(), {input, target}), reduction);
  });
  if (!autograd::any_requires_grad({input})) return out;
  return autograd::record("binary_cross_entropy", out, {input, Tensor()},
                          [si = input.detach(), st = target.detach(), reduction](const Tensor& g, const Needs&) {
                            const Tensor gi = map("binary_cross_entropy", Op::bce_backward, si.shape(), si.dtype(),
                                                  {loss_grad(g, si.shape(), reduction), si, st});
                            return Grads{scale_loss_grad(gi, si.numel(), reduction), Tensor()};
                          });
}

static Tensor binary_cross_entropy_with_logits_impl(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_loss_pair("binary_cross_entropy_with_logits", input, target);
  Tensor out = untracked([&] {
    return apply_reduction("binary_cross_entropy_with_logits",
                           map("binary_cross_entropy_with_logits", Op::bce_logits, input.shape(), input.dtype(),
                               {input, target}),
                           reduction);
  });
  if (!autograd::any_requires_grad({input, target})) return out;
  return autograd::record(
      "binary_cross_entropy_with_logits", out, {input, target},
      [si = input.detach(), st = target.detach(), reduction](const Tensor& g, const Needs& n) {
        const Tensor gl = loss_grad(g, si.shape(), reduction);
        Tensor gi, gt;
        if (n[0]) {
          gi = scale_loss_grad(map("binary_cross_entropy_with_logits", Op::bce_logits_backward, si.shape(), si.dtype(),
                                   {gl, si, st}),
                               si.numel(), reduction);
        }
        if (n[1]) gt = scale_loss_grad(neg(mul(si, gl)), si.numel(), reduction);  // d/dy = -x
        return Grads{gi, gt};
      });
}

// ---- attention ----

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    std::optional<double> scale) {
  if ((q.dim() != 3 && q.dim() != 4) || k.dim() != q.dim() || v.dim() != q.dim()) {
    throw ShapeError(fmt::format("{}: q, k and v must all be [B, T, D] or [B, H, T, D], got {}, {} and {}",
                                 label("scaled_dot_product_attention"), shape_str(q.shape()), shape_str(k.shape()),
                                 shape_str(v.shape())));
  }
  const std::int64_t T = q.size(-2), D = q.size(-1), S = k.size(-2);
  if (k.size(-1) != D || v.size(-2) != S) {
    throw ShapeError(fmt::format("{}: q {} and k {} must share the last dimension, and k and v {} the sequence length",
                                 label("scaled_dot_product_attention"), shape_str(q.shape()), shape_str(k.shape()),
                                 shape_str(v.shape())));
  }
  const Shape batch(q.shape().begin(), q.shape().end() - 2);
  const Shape k_batch(k.shape().begin(), k.shape().end() - 2), v_batch(v.shape().begin(), v.shape().end() - 2);
  if (k_batch != batch || v_batch != batch) {
    throw ShapeError(fmt::format("{}: q {}, k {} and v {} must have the same batch (and head) dimensions",
                                 label("scaled_dot_product_attention"), shape_str(q.shape()), shape_str(k.shape()),
                                 shape_str(v.shape())));
  }
  const std::int64_t B = numel_of(batch);
  // Autocast lists attention as lower_precision_fp: q, k and v are cast once, and its steps run with
  // autocast off (each is still reported to probes as its own op).
  bool suppress = false;
  const std::vector<Tensor> qkv = detail::autocast_composite_inputs("scaled_dot_product_attention", {q, k, v}, suppress);
  const detail::SuppressAutocast no_autocast(suppress, "scaled_dot_product_attention");
  const Tensor q3 = qkv[0].reshape({B, T, D}), k3 = qkv[1].reshape({B, S, D}), v3 = qkv[2].reshape({B, S, v.size(-1)});
  Tensor scores = mul(bmm(q3, k3.transpose(1, 2)), scale.value_or(1.0 / std::sqrt(static_cast<double>(D))));
  if (causal) {
    // True above the diagonal: query i may not look at keys j > i.
    std::vector<double> above(static_cast<std::size_t>(T * S));
    for (std::int64_t i = 0; i < T; ++i) {
      for (std::int64_t j = 0; j < S; ++j) above[i * S + j] = j > i ? 1.0 : 0.0;
    }
    const Tensor mask = from_values(above, {T, S}, {DType::boolean, q.device()});
    scores = masked_fill(scores, mask, -std::numeric_limits<double>::infinity());
  }
  Tensor out = bmm(softmax(scores, -1), v3);
  Shape out_shape = batch;
  out_shape.push_back(T);
  out_shape.push_back(v.size(-1));
  return out.reshape(out_shape);
}

// ---- the public ops: autocast, then the op, then the probe event (core/autocast.h) ----

namespace {
// What a body sees when the op is run again on other arguments (probe::OpEvent::recompute): the same
// arg()/set_dtype() as an OpDispatch.
struct RecomputeArgs {
  const std::vector<Tensor>& args;
  std::optional<DType> dtype;
  const Tensor& arg(std::size_t i) const { return args.at(i); }
  std::optional<DType> set_dtype() const { return dtype; }
};

// Runs `body` on the arguments as autocast leaves them, and reports the op.
template <class Body>
Tensor dispatched(std::string_view op, std::vector<Tensor> args, const Body& body, bool dtype_given = true) {
  detail::OpDispatch d(op, std::move(args), dtype_given);
  Tensor out = body(d);
  if (!d.reported()) return d.finish(std::move(out));
  const std::function<Tensor(const std::vector<Tensor>&)> again = [&](const std::vector<Tensor>& a) {
    return body(RecomputeArgs{a, d.set_dtype()});
  };
  return d.finish(std::move(out), &again);
}
template <class D>
std::optional<DType> dtype_or_autocast(std::optional<DType> given, const D& d) {
  return given ? given : d.set_dtype();
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  return dispatched("add", {a, b}, [](const auto& d) { return add_impl(d.arg(0), d.arg(1)); });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return dispatched("sub", {a, b}, [](const auto& d) { return sub_impl(d.arg(0), d.arg(1)); });
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return dispatched("mul", {a, b}, [](const auto& d) { return mul_impl(d.arg(0), d.arg(1)); });
}
Tensor div(const Tensor& a, const Tensor& b) {
  return dispatched("div", {a, b}, [](const auto& d) { return div_impl(d.arg(0), d.arg(1)); });
}
Tensor add(const Tensor& a, double b) {
  return dispatched("add", {a}, [b](const auto& d) { return add_impl(d.arg(0), b); });
}
Tensor sub(const Tensor& a, double b) {
  return dispatched("sub", {a}, [b](const auto& d) { return sub_impl(d.arg(0), b); });
}
Tensor mul(const Tensor& a, double b) {
  return dispatched("mul", {a}, [b](const auto& d) { return mul_impl(d.arg(0), b); });
}
Tensor div(const Tensor& a, double b) {
  return dispatched("div", {a}, [b](const auto& d) { return div_impl(d.arg(0), b); });
}
Tensor neg(const Tensor& a) { return dispatched("neg", {a}, [](const auto& d) { return neg_impl(d.arg(0)); }); }
Tensor relu(const Tensor& a) { return dispatched("relu", {a}, [](const auto& d) { return relu_impl(d.arg(0)); }); }
Tensor gelu(const Tensor& a, GeluApproximation approximate) {
  return dispatched("gelu", {a}, [approximate](const auto& d) { return gelu_impl(d.arg(0), approximate); });
}
Tensor sigmoid(const Tensor& a) {
  return dispatched("sigmoid", {a}, [](const auto& d) { return sigmoid_impl(d.arg(0)); });
}
Tensor silu(const Tensor& a) {
  return dispatched("silu", {a}, [](const auto& d) { return silu_impl(d.arg(0)); });
}
Tensor tanh(const Tensor& a) { return dispatched("tanh", {a}, [](const auto& d) { return tanh_impl(d.arg(0)); }); }
Tensor exp(const Tensor& a) { return dispatched("exp", {a}, [](const auto& d) { return exp_impl(d.arg(0)); }); }
Tensor log(const Tensor& a) { return dispatched("log", {a}, [](const auto& d) { return log_impl(d.arg(0)); }); }
Tensor sqrt(const Tensor& a) { return dispatched("sqrt", {a}, [](const auto& d) { return sqrt_impl(d.arg(0)); }); }
Tensor rsqrt(const Tensor& a) { return dispatched("rsqrt", {a}, [](const auto& d) { return rsqrt_impl(d.arg(0)); }); }
Tensor pow(const Tensor& a, double exponent) {
  return dispatched("pow", {a}, [exponent](const auto& d) { return pow_impl(d.arg(0), exponent); });
}
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  return dispatched("clamp", {a}, [lo, hi](const auto& d) { return clamp_impl(d.arg(0), lo, hi); });
}
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  return dispatched("masked_fill", {a, mask}, [value](const auto& d) { return masked_fill_impl(d.arg(0), d.arg(1), value); });
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return dispatched("where", {cond, a, b}, [](const auto& d) { return where_impl(d.arg(0), d.arg(1), d.arg(2)); });
}
Tensor sum(const Tensor& a, std::optional<DType> dtype) { return sum(a, {}, false, dtype); }
Tensor sum(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim, std::optional<DType> dtype) {
  return dispatched(
      "sum", {a}, [&](const auto& d) { return sum_impl(d.arg(0), dims, keepdim, dtype_or_autocast(dtype, d)); },
      dtype.has_value());
}
Tensor mean(const Tensor& a) { return mean(a, {}, false); }
Tensor mean(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim) {
  return dispatched("mean", {a}, [&](const auto& d) { return mean_impl(d.arg(0), dims, keepdim); });
}
Tensor argmax(const Tensor& a, std::int64_t dim) {
  return dispatched("argmax", {a}, [dim](const auto& d) { return argmax_impl(d.arg(0), dim); });
}
Tensor softmax(const Tensor& a, std::int64_t dim, std::optional<DType> dtype) {
  return dispatched(
      "softmax", {a},
      [&](const auto& d) { return softmax_common("softmax", d.arg(0), dim, dtype_or_autocast(dtype, d), false); },
      dtype.has_value());
}
Tensor log_softmax(const Tensor& a, std::int64_t dim, std::optional<DType> dtype) {
  return dispatched(
      "log_softmax", {a},
      [&](const auto& d) { return softmax_common("log_softmax", d.arg(0), dim, dtype_or_autocast(dtype, d), true); },
      dtype.has_value());
}
Tensor bmm(const Tensor& a, const Tensor& b) {
  return dispatched("bmm", {a, b}, [](const auto& d) { return bmm_impl(d.arg(0), d.arg(1)); });
}
Tensor matmul(const Tensor& a, const Tensor& b) {
  return dispatched("matmul", {a, b}, [](const auto& d) { return matmul_impl(d.arg(0), d.arg(1)); });
}
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return dispatched("linear", {x, weight, bias}, [](const auto& d) { return linear_impl(d.arg(0), d.arg(1), d.arg(2)); });
}
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options) {
  return dispatched("conv2d", {x, weight, bias},
                    [&](const auto& d) { return conv2d_impl(d.arg(0), d.arg(1), d.arg(2), options); });
}
Tensor max_pool2d(const Tensor& x, Pool2dOptions options) {
  return dispatched("max_pool2d", {x}, [&](const auto& d) { return max_pool2d_impl(d.arg(0), options); });
}
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias, double eps) {
  return dispatched("layer_norm", {x, weight, bias}, [&](const auto& d) {
    return layer_norm_impl(d.arg(0), normalized_shape, d.arg(1), d.arg(2), eps);
  });
}
Tensor embedding(const Tensor& indices, const Tensor& weight) {
  return dispatched("embedding", {indices, weight}, [](const auto& d) { return embedding_impl(d.arg(0), d.arg(1)); });
}
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  return dispatched("dropout", {x}, [&](const auto& d) { return dropout_impl(d.arg(0), p, training, gen); });
}
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim) {
  return dispatched("cat", tensors, [&](const auto& d) {
    std::vector<Tensor> args;
    for (std::size_t i = 0; i < tensors.size(); ++i) args.push_back(d.arg(i));
    return cat_impl(args, dim);
  });
}
Tensor nll_loss(const Tensor& logp, const Tensor& target, Reduction reduction, std::int64_t ignore_index) {
  return dispatched("nll_loss", {logp, target},
                    [&](const auto& d) { return nll_loss_impl(d.arg(0), d.arg(1), reduction, ignore_index); });
}
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return dispatched("mse_loss", {input, target},
                    [&](const auto& d) { return mse_loss_impl(d.arg(0), d.arg(1), reduction); });
}
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction) {
  return dispatched("binary_cross_entropy", {input, target},
                    [&](const auto& d) { return binary_cross_entropy_impl(d.arg(0), d.arg(1), reduction); });
}
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, Reduction reduction) {
  return dispatched("binary_cross_entropy_with_logits", {input, target}, [&](const auto& d) {
    return binary_cross_entropy_with_logits_impl(d.arg(0), d.arg(1), reduction);
  });
}


// ---- ops for hand-written losses ----

Tensor rsub(const Tensor& a, double s) {
  return dispatched("rsub", {a}, [s](const auto& d) { return rsub_impl(d.arg(0), s); });
}
Tensor reciprocal(const Tensor& a) {
  return dispatched("reciprocal", {a}, [](const auto& d) { return reciprocal_impl(d.arg(0)); });
}
Tensor abs(const Tensor& a) { return dispatched("abs", {a}, [](const auto& d) { return abs_impl(d.arg(0)); }); }
Tensor log1p(const Tensor& a) { return dispatched("log1p", {a}, [](const auto& d) { return log1p_impl(d.arg(0)); }); }
Tensor expm1(const Tensor& a) { return dispatched("expm1", {a}, [](const auto& d) { return expm1_impl(d.arg(0)); }); }
Tensor logsigmoid(const Tensor& a) {
  return dispatched("logsigmoid", {a}, [](const auto& d) { return logsigmoid_impl(d.arg(0)); });
}
Tensor softplus(const Tensor& a, double beta, double threshold) {
  return dispatched("softplus", {a}, [=](const auto& d) { return softplus_impl(d.arg(0), beta, threshold); });
}
Tensor clamp_min(const Tensor& a, double min) {
  return dispatched("clamp_min", {a}, [min](const auto& d) {
    return clamp_bound_impl("clamp_min", d.arg(0), min, std::numeric_limits<double>::infinity());
  });
}
Tensor clamp_max(const Tensor& a, double max) {
  return dispatched("clamp_max", {a}, [max](const auto& d) {
    return clamp_bound_impl("clamp_max", d.arg(0), -std::numeric_limits<double>::infinity(), max);
  });
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return dispatched("maximum", {a, b}, [](const auto& d) {
    return pairwise_extreme_impl("maximum", Op::maximum, Op::maximum_backward, d.arg(0), d.arg(1));
  });
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return dispatched("minimum", {a, b}, [](const auto& d) {
    return pairwise_extreme_impl("minimum", Op::minimum, Op::minimum_backward, d.arg(0), d.arg(1));
  });
}
Tensor max(const Tensor& a) { return dispatched("max", {a}, [](const auto& d) { return max_all_impl("max", true, d.arg(0)); }); }
Tensor min(const Tensor& a) { return dispatched("min", {a}, [](const auto& d) { return max_all_impl("min", false, d.arg(0)); }); }
namespace {
ValuesAndIndices dispatched_dim(std::string_view op, bool largest, const Tensor& a, std::int64_t dim, bool keepdim) {
  detail::OpDispatch d(op, {a});
  ValuesAndIndices r = max_dim_impl(op, largest, d.arg(0), dim, keepdim);
  r.values = d.finish(r.values);
  return r;
}
}  // namespace
ValuesAndIndices max(const Tensor& a, std::int64_t dim, bool keepdim) { return dispatched_dim("max", true, a, dim, keepdim); }
ValuesAndIndices min(const Tensor& a, std::int64_t dim, bool keepdim) { return dispatched_dim("min", false, a, dim, keepdim); }
Tensor amax(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim) {
  return dispatched("amax", {a}, [&](const auto& d) { return amax_impl("amax", true, d.arg(0), dims, keepdim); });
}
Tensor amin(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim) {
  return dispatched("amin", {a}, [&](const auto& d) { return amax_impl("amin", false, d.arg(0), dims, keepdim); });
}
Tensor var(const Tensor& a, const std::vector<std::int64_t>& dims, double correction, bool keepdim) {
  return dispatched("var", {a}, [&](const auto& d) { return var_impl("var", false, d.arg(0), dims, correction, keepdim); });
}
Tensor std(const Tensor& a, const std::vector<std::int64_t>& dims, double correction, bool keepdim) {
  return dispatched("std", {a}, [&](const auto& d) { return var_impl("std", true, d.arg(0), dims, correction, keepdim); });
}

}  // namespace ampscope
