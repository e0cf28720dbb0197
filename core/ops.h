// core/ops.h: the differentiable tensor ops of ampscope's training runtime.
//
// Every op here computes what the GPU computes: elements are loaded in the tensor's dtype, the math is
// done in float (double for f64) and rounded once on store; reductions and matrix products accumulate
// in float. A NaN that comes out of arithmetic is the canonical quiet NaN (kernels/functors.h). When
// grad mode is on and an input requires grad, each op records one autograd node named as the function
// ("linear", "softmax", ...). Binary element-wise ops broadcast as PyTorch does and pick the result
// dtype with PyTorch's type promotion: dimensioned tensors outrank zero-dimensional ones, which outrank
// plain scalars, unless the lower-ranked operand is of a higher category (bool < integer < floating).
//
//   Tensor h = relu(linear(x, w1, b1));                 // x [64, 784], w1 [128, 784] -> [64, 128]
//   Tensor loss = cross_entropy(linear(h, w2, b2), y);  // y: i64 class indices [64]
//   loss.backward();
//   Tensor d = mul(a, 0.1);   // the scalar stays a float (0.1f), as on the GPU, not f16(0.1)
//
// Shape, dtype and device errors name the op, the module it ran in (current_scope()) and the values.
#pragma once

#include <optional>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace ampscope {

// The shape two shapes broadcast to, or ShapeError naming `op`, both shapes and the dimension at fault.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op = "broadcast");

// torch.result_type for two tensors, and for a tensor and a floating scalar.
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, double scalar);

// Sums `grad` over broadcast dimensions so that it has `shape` (the reverse of broadcasting).
Tensor sum_to(const Tensor& grad, const Shape& shape);

// ---- element-wise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integer or bool inputs give f32

// Scalar forms: the scalar is kept in the op's compute type (float for f16/bf16/f32), not rounded to
// the tensor's dtype first. div by a scalar multiplies by its reciprocal computed in that type, which
// is what PyTorch's CUDA kernel does.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);

Tensor neg(const Tensor& a);
Tensor relu(const Tensor& a);     // NaN stays NaN, with its bits
enum class GeluApproximation { none, tanh };
Tensor gelu(const Tensor& a, GeluApproximation approximate = GeluApproximation::none);
Tensor sigmoid(const Tensor& a);
// x * sigmoid(x) (torch.nn.functional.silu, Llama's activation): one op, computed as x / (1 + exp(-x))
// in float for f16/bf16 and rounded once; floating inputs only. On no autocast list: it runs in its
// input's dtype.
Tensor silu(const Tensor& a);
Tensor tanh(const Tensor& a);
// Floating results: integer or bool inputs give f32, as in PyTorch.
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
// Bounds are optional (std::nullopt = none); NaN inputs stay NaN. Gradient flows where lo <= x <= hi.
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi);

// mask (bool) ? value : a. mask broadcasts to a's shape.
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
// cond (bool) ? a : b, broadcast together; a and b promoted as in add.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- reductions ----
// `dtype` (optional) is the output and accumulation dtype: sum(x_f16, {}, false, DType::f32) converts
// each element to f32 first (what autocast asks for). Without it the result has the input's dtype,
// accumulated in float. Dimensions may be negative; an empty list means all of them.
Tensor sum(const Tensor& a, std::optional<DType> dtype = std::nullopt);
Tensor sum(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& a);  // floating inputs only
Tensor mean(const Tensor& a, const std::vector<std::int64_t>& dims, bool keepdim = false);
// Index of the largest value along dim (i64, no gradient); the first one on ties, NaN counts as largest.
Tensor argmax(const Tensor& a, std::int64_t dim);

Tensor softmax(const Tensor& a, std::int64_t dim, std::optional<DType> dtype = std::nullopt);
Tensor log_softmax(const Tensor& a, std::int64_t dim, std::optional<DType> dtype = std::nullopt);

// ---- matrix products ----
// matmul: a [..., M, K] @ b [K, N] or b [..., K, N] with the same leading dimensions; 1-D a or b are
// treated as a row or column vector and that dimension is dropped, as in torch.matmul. Inputs must
// have the same dtype; products accumulate in float and the result is rounded once to that dtype.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B, M, K] @ [B, K, N]
// x [..., in] @ weight [out, in]^T + bias [out]; the bias is added before the single rounding. Inside an
// Fp8Guard, on f16/bf16 inputs of a module no keep glob names, the forward and backward GEMMs run on FP8
// copies of their operands instead (core/fp8_linear.h).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- convolution and pooling (NCHW) ----
struct Conv2dOptions {
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t padding_h = 0, padding_w = 0;
};
// x [N, C, H, W], weight [O, C, KH, KW], bias [O] (optional): im2col + one matrix product per image.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Conv2dOptions options = {});

struct Pool2dOptions {
  std::int64_t kernel_h = 2, kernel_w = 2;
  std::int64_t stride_h = 0, stride_w = 0;  // 0: the kernel size, as in PyTorch
  std::int64_t padding_h = 0, padding_w = 0;
};
// NaN in a window wins, as in PyTorch.
Tensor max_pool2d(const Tensor& x, Pool2dOptions options = {});

// ---- normalisation, embedding, dropout, concatenation ----
// Normalises over the trailing dimensions given by normalized_shape; weight and bias (optional) have
// that shape and the input's dtype. Mean and variance are computed in float (double for f64).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// indices (i64, any shape) select rows of weight [V, D]: result [..., D] in weight's dtype.
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p), from gen's Philox stream
// (the same values on every backend). Identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
// All tensors share dtype and device and agree on every dimension but `dim`.
Tensor cat(const std::vector<Tensor>& tensors, std::int64_t dim);

// ---- losses ----
enum class Reduction { none, mean, sum };
// logp [N, C] (log-probabilities), target [N] (i64). Mean divides by the number of targets that are
// not ignore_index.
Tensor nll_loss(const Tensor& logp, const Tensor& target, Reduction reduction = Reduction::mean,
                std::int64_t ignore_index = -100);
// log_softmax over dimension 1, then nll_loss: two recorded ops, as in PyTorch.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::mean,
                     std::int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
// input holds probabilities in [0, 1]; each log is clamped at -100, as in PyTorch.
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        Reduction reduction = Reduction::mean);

// ---- ops for hand-written losses ----
// Each has PyTorch's semantics and autocast policy: log1p, expm1, softplus and reciprocal are on the
// fp32 list (f16/bf16 inputs compute and return f32 under autocast); the others are on no list and run
// in their inputs' dtype. Gradients are PyTorch's formulas (derivatives.yaml), composed of the same
// rounded steps where PyTorch composes them.
//
//   Tensor z = maximum(x, zeros({}));                        // NaN in x stays NaN
//   Tensor lse = add(log(sum(exp(sub(x, max(x, 1, true).values)), {1}, true)), max(x, 1, true).values);
//   Tensor loss = mean(softplus(neg(margin)));               // = -logsigmoid(margin), stably

// s - a as one op recorded as "rsub" (torch.rsub; what Python records for `1 - t`); the scalar stays in
// the compute type, as in sub.
Tensor rsub(const Tensor& a, double s);
Tensor reciprocal(const Tensor& a);  // 1 / a (fp32 under autocast); gradient -g / a^2 as -g * (y * y)
Tensor abs(const Tensor& a);         // a NaN keeps its payload; gradient g * sign(a), 0 at 0 and at NaN
Tensor log1p(const Tensor& a);       // log(1 + a), accurate near 0; gradient g / (a + 1)
Tensor expm1(const Tensor& a);       // exp(a) - 1, accurate near 0; gradient g * (y + 1)
// log(sigmoid(a)) = min(a, 0) - log1p(exp(-|a|)), which never overflows (torch.nn.functional.logsigmoid).
Tensor logsigmoid(const Tensor& a);
// log1p(exp(beta a)) / beta, and a itself where beta a > threshold (torch.nn.functional.softplus).
Tensor softplus(const Tensor& a, double beta = 1.0, double threshold = 20.0);
// clamp with one bound, recorded under its own name. As in PyTorch the bound is first rounded to the
// input's dtype (so the gradient flows at an input equal to the rounded bound); NaN stays NaN.
Tensor clamp_min(const Tensor& a, double min);
Tensor clamp_max(const Tensor& a, double max);
// Element-wise maximum and minimum of two tensors, broadcast and promoted as in add. A NaN in either
// wins; equal values (-0 and +0) give the first operand. Gradient: to the larger (smaller) operand, half
// to each on a tie, all of it to both where a NaN makes the comparison false (PyTorch's formula).
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);

// The largest (smallest) element of a non-empty tensor, as a 0-dim tensor; NaN if there is one. The
// gradient is shared evenly among the elements equal to the result (the NaNs, if it is NaN).
Tensor max(const Tensor& a);
Tensor min(const Tensor& a);
// Over one dimension (negative counts from the end), like torch.return_types.max: the values and the
// i64 index of the first largest (smallest) one along dim, the first NaN where there is one. The
// gradient goes to that index only. The dimension must not be empty.
struct ValuesAndIndices {
  Tensor values;
  Tensor indices;
};
ValuesAndIndices max(const Tensor& a, std::int64_t dim, bool keepdim = false);
ValuesAndIndices min(const Tensor& a, std::int64_t dim, bool keepdim = false);
// torch.max(a, b) and torch.min(a, b) of two tensors are maximum and minimum (recorded under those names).
inline Tensor max(const Tensor& a, const Tensor& b) { return maximum(a, b); }
inline Tensor min(const Tensor& a, const Tensor& b) { return minimum(a, b); }
// Over several dimensions (all for an empty list), values only. The gradient is shared evenly among
// the elements equal to the result; a NaN result equals nothing, so its gradient is NaN (as PyTorch's
// (g / count) * mask gives it).
Tensor amax(const Tensor& a, const std::vector<std::int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const std::vector<std::int64_t>& dims = {}, bool keepdim = false);

// Variance and standard deviation over dims (all for an empty list): sum (x - mean)^2 / (N - correction)
// with N the number of reduced elements; correction 1 is Bessel's (the default, as in PyTorch) and 0 the
// population variance. N <= correction divides by 0: inf, or NaN where every deviation is 0 (one element,
// an empty tensor). Computed in float (double for f64) in two passes and rounded once. The gradient is
// (2 / (N - correction)) g (x - mean), and std's is var's at g / (2 std), 0 where std is 0.
Tensor var(const Tensor& a, const std::vector<std::int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);
Tensor std(const Tensor& a, const std::vector<std::int64_t>& dims = {}, double correction = 1.0, bool keepdim = false);

// ---- operators: exactly the functions above, so they record the same ops with the same bits ----
// Tensor op Tensor: add, sub, mul, div; -t: neg; t op s and s + t, s * t: add, sub, mul, div with the
// scalar. s - t is rsub(t, s) and s / t is mul(reciprocal(t), s): what PyTorch records for `1 - t` and
// `2 / t` (so under autocast 2 / t is f32, reciprocal being on the fp32 list). Scalars are floating: an
// i64 tensor times 2 gives f32, where PyTorch keeps i64 for an integer scalar.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator/(double s, const Tensor& a) { return mul(reciprocal(a), s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- attention ----
// q, k, v [B, T, D] or [B, H, T, D]: softmax(q k^T * scale (+ causal mask)) v, as separate recorded
// ops (bmm, mul, masked_fill, softmax, bmm) so each step is visible. scale defaults to 1/sqrt(D).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace ampscope
