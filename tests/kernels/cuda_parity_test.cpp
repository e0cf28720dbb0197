// The parity suite: every op of core/backend.h, in every dtype the CPU backend has it, run as a kernel on
// the CUDA backend and on the CPU backend (the executable specification) with the same inputs, and
// compared. Each test skips itself, saying why, where there is no usable GPU.
//
// Tolerances, per class of op (docs/cuda.md has the same table):
//
// - exact: the same bits, NaNs included. Both backends run the same functors (kernels/functors.h) and
//   conversions, the same operation order, no fused multiply-add (-ffp-contract=off, nvcc -fmad=false),
//   and +, -, *, /, sqrt are correctly rounded on both (nvcc's defaults -prec-div=true, -prec-sqrt=true,
//   -ftz=false). Row sums use lane_tree_sum's order on the CPU and a warp's shuffles on the GPU: the
//   same additions in the same order. So: fill, copy, arange, uniform, arithmetic, neg, relu, sqrt,
//   rsqrt, pow with the exponents 2, 3, 0.5, -0.5, -1, -2, clamp, where, masked_fill, the backward
//   functors that use no math library (relu, sigmoid, tanh, clamp), bce_backward, dropout and its mask,
//   masked_scale, sum_rows, argmax_rows, softmax_backward_rows, layer_norm (forward, backward, parameter
//   gradients), im2col, col2im, max pooling (values and argmax) and its backward, embedding and its
//   backward, nll and its backward, and the loss ops that use no math library (rsub, reciprocal, abs,
//   maximum, minimum and their backward, std_backward, the row extremes, var_rows, the even share of a
//   tie's gradient, the index backward). Layer norm's mean/rstd (kept in the accumulation type, never
//   canonicalised) only need to be NaN together, not to have the same NaN bits.
// - math: ops that call exp, log, log1p, expm1, tanh, erf or pow (log1p, expm1, logsigmoid, softplus). glibc and CUDA's libdevice are different
//   implementations (CUDA documents expf 2 ulp, tanhf 2, erff 2, powf 4, double exp/log 1 ulp, tanh/erf
//   2; glibc is within 1 ulp), so results may differ by a few units in the last place, and by more where
//   the formula cancels (gelu's 1 + erf(x) near x = -3, log_softmax's x - max - log(sum)). Bound:
//   |cuda - cpu| <= rtol * (|cpu| + scale), rtol = 16 ulp of the accumulation type (16 * 2^-52 in f64,
//   16 * 2^-23 in f32) or one ulp of the stored type for f16 (2^-10) and bf16 (2^-7), where a float
//   difference can flip one rounding; scale is the size of the terms that cancel (inputs up to ~8).
//   normal() is here too, with float's rtol in every dtype: Box-Muller in double through each side's
//   log/sin/cos, rounded to float (core/philox.h).
// - gemm: cuBLAS and OpenBLAS add the K products of a dot product in different orders (blocking,
//   split-K, tensor cores that accumulate with truncation, FMA). For each output element,
//   |cuda - cpu| <= 2 * K * u * sum_k |a_ik| |b_kj| + ulp_out(|cpu|), with u = 2^-23 for float
//   accumulation (2^-52 for f64), the standard bound on a dot product's rounding error for both orders
//   plus one rounding of the stored result (2^-10 |cpu| in f16, 2^-7 in bf16, 2^-23 in f32). With
//   AMPSCOPE_ALLOW_TF32=1 an f32 product rounds its inputs to 11 significant bits: + 2 * 2^-11 * sum.
//   Everything built on gemm inherits this bound: linear, matmul, bmm, conv2d (forward, input and weight
//   gradients: the weight gradient's K is the batch times the positions), attention.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_support.h"

#include "core/backend.h"
#include "core/error.h"
#include "core/format.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope {
namespace {

constexpr DType kFloating[] = {DType::f64, DType::f32, DType::f16, DType::bf16};

// math_in_float: the math class with float's rtol even for f64 output (normal(): float values widened).
enum class Check { exact, exact_nan_any, math, math_in_float, gemm };

// One kernel call: the op, the dtype that selects the kernel, the outputs' shapes and dtypes (out, then
// aux), the inputs as built on a device (the same values on both), and the scalars.
struct KernelCase {
  KernelCase(std::string name_, Op op_, DType dtype_, std::vector<std::pair<Shape, DType>> outs_,
             std::function<std::vector<Tensor>(Device)> inputs_ = nullptr, std::vector<double> scalars_ = {},
             std::uint64_t seed_ = 0, std::uint64_t offset_ = 0)
      : name(std::move(name_)), op(op_), dtype(dtype_), outs(std::move(outs_)), inputs(std::move(inputs_)),
        scalars(std::move(scalars_)), seed(seed_), offset(offset_) {}
  std::string name;
  Op op = Op::fill;
  DType dtype = DType::f32;
  std::vector<std::pair<Shape, DType>> outs;
  std::function<std::vector<Tensor>(Device)> inputs;
  std::vector<double> scalars;
  std::uint64_t seed = 0, offset = 0;
};

// Values ~ N(shift, scale^2) made on the CPU in f64 from a fixed seed, rounded to dtype, moved to device.
Tensor values(Device device, const Shape& shape, DType dtype, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  return add(mul(randn(shape, gen, {DType::f64}), scale), shift).to(dtype).to(device);
}

// Uniform values in [lo, hi).
Tensor uniform_values(Device device, const Shape& shape, DType dtype, std::uint64_t seed, double lo, double hi) {
  Generator gen(seed);
  return add(mul(rand(shape, gen, {DType::f64}), hi - lo), lo).to(dtype).to(device);
}

Tensor mask_values(Device device, const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  const std::vector<double> u = rand(shape, gen, {DType::f64}).values();
  std::vector<double> m(u.size());
  for (std::size_t i = 0; i < u.size(); ++i) m[i] = u[i] < 0.5 ? 1.0 : 0.0;
  return from_values(m, shape, {DType::boolean}).to(device);
}

Tensor index_values(Device device, const std::vector<double>& v) {
  return from_values(v, {static_cast<std::int64_t>(v.size())}, {DType::i64}).to(device);
}

std::vector<Tensor> run_case(const KernelCase& c, Device device) {
  const std::vector<Tensor> ins = c.inputs ? c.inputs(device) : std::vector<Tensor>{};
  std::vector<Tensor> outs;
  for (const auto& [shape, dtype] : c.outs) {
    // A sentinel in every output: an element one backend forgets to write shows as a difference.
    Tensor t = Tensor::empty(shape, {dtype, device});
    t.fill_(dtype == DType::boolean ? 1.0 : 77.0);
    outs.push_back(t);
  }
  KernelArgs a;
  a.out = outs[0].kernel_view();
  for (std::size_t i = 1; i < outs.size(); ++i) a.aux[i - 1] = outs[i].kernel_view();
  for (std::size_t i = 0; i < ins.size(); ++i) a.in[i] = ins[i].defined() ? ins[i].kernel_view() : TensorView{};
  a.num_inputs = static_cast<int>(ins.size());
  for (std::size_t i = 0; i < c.scalars.size(); ++i) a.scalars[i] = c.scalars[i];
  a.seed = c.seed;
  a.offset = c.offset;
  Backend& backend = backend_for(device);
  backend.run(c.op, c.dtype, a);
  backend.synchronize();
  return outs;
}

std::string hex_bits(const Tensor& host, std::size_t i) {
  const std::size_t size = dtype_size(host.dtype());
  std::uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(host.data()) + i * size, size);
  return fmt::format("0x{:0{}x}", bits, 2 * size);
}

// 1 ulp of a stored value relative to its magnitude, for the dtype's significand.
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64: return 0x1p-52;
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: return 0x1p-23;
  }
}

// The math class's relative tolerance (see the comment at the top).
double math_rtol(DType dtype) {
  switch (dtype) {
    case DType::f64: return 16 * 0x1p-52;
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: return 16 * 0x1p-23;
  }
}

// Compares one output, printing the first few differing pairs. `bound` (gemm) holds one absolute bound
// per element before the output's own rounding is added.
void expect_parity(const Tensor& cpu_t, const Tensor& gpu_t, const std::string& what, Check check, double scale = 1.0,
                   const std::vector<double>& bound = {}) {
  ASSERT_EQ(cpu_t.shape(), gpu_t.shape()) << what;
  const Tensor cpu = cpu_t.contiguous(), gpu = gpu_t.contiguous().to(Device::cpu());
  const std::vector<double> a = cpu.values(), b = gpu.values();
  const std::size_t size = dtype_size(cpu.dtype());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    bool ok = false;
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    switch (check) {
      case Check::exact:
        ok = std::memcmp(static_cast<const char*>(cpu.data()) + i * size, static_cast<const char*>(gpu.data()) + i * size,
                         size) == 0;
        break;
      case Check::exact_nan_any:
        ok = both_nan || std::memcmp(static_cast<const char*>(cpu.data()) + i * size,
                                     static_cast<const char*>(gpu.data()) + i * size, size) == 0;
        break;
      case Check::math:
      case Check::math_in_float: {
        const DType tol = check == Check::math_in_float && cpu.dtype() == DType::f64 ? DType::f32 : cpu.dtype();
        ok = both_nan || a[i] == b[i] || std::fabs(a[i] - b[i]) <= math_rtol(tol) * (std::fabs(a[i]) + scale);
        break;
      }
      case Check::gemm:
        ok = both_nan || a[i] == b[i] ||
             std::fabs(a[i] - b[i]) <= bound.at(i) + unit_roundoff(cpu.dtype()) * std::fabs(a[i]);
        break;
    }
    if (!ok && differ++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " of " << a.size() << ": cpu " << format_value(a[i], cpu.dtype())
                    << " (" << hex_bits(cpu, i) << ") cuda " << format_value(b[i], cpu.dtype()) << " ("
                    << hex_bits(gpu, i) << ")";
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " elements differ";
}

// Runs the case on both backends and compares every output (aux outputs with `aux_check`).
void check_case(const KernelCase& c, Check check, double scale = 1.0, Check aux_check = Check::exact) {
  SCOPED_TRACE(c.name);
  const std::vector<Tensor> cpu = run_case(c, Device::cpu());
  const std::vector<Tensor> gpu = run_case(c, Device::cuda());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const std::string what = fmt::format("{} {} output {}", c.name, dtype_name(c.dtype), i);
    expect_parity(cpu[i], gpu[i], what, i == 0 ? check : aux_check, scale);
  }
}

// ---- element-wise ----

TEST(cuda_parity_test, creation_and_copies_match_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (int t = 0; t < kNumDTypes; ++t) {
    const DType d = static_cast<DType>(t);
    check_case({"fill", Op::fill, d, {{{5, 7}, d}}, nullptr, {70000.5}}, Check::exact);
    // A strided (transposed) f32 source converted to d.
    check_case({"copy", Op::copy, d, {{{6, 5}, d}},
                [](Device dev) { return std::vector<Tensor>{values(dev, {5, 6}, DType::f32, 1, 3e4).transpose(0, 1)}; }},
               Check::exact);
    if (d != DType::boolean) check_case({"arange", Op::arange, d, {{{200}, d}}, nullptr, {-3.0, 0.1}}, Check::exact);
  }
}

TEST(cuda_parity_test, random_streams_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    KernelCase c{"uniform", Op::uniform, d, {{{1001}, d}}, nullptr, {}, 31337, 5};
    check_case(c, Check::exact);
    c.name = "normal";
    c.op = Op::normal;
    check_case(c, Check::math_in_float, 4.0);
  }
}

// out = fn(inputs), inputs broadcast (stride 0) and strided (a transposed view), as run_kernel passes them.
std::vector<Tensor> pair_inputs(Device dev, DType d, double scale) {
  const Tensor x = values(dev, {100, 8}, d, 11, scale).transpose(0, 1);  // [8, 100], strided
  const Tensor y = values(dev, {100}, d, 12, scale).expand({8, 100});     // broadcast rows
  return {x, y};
}

TEST(cuda_parity_test, arithmetic_and_exactly_rounded_functions_match_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const std::vector<std::pair<Shape, DType>> out = {{{8, 100}, d}};
    for (Op op : {Op::add, Op::sub, Op::mul, Op::div}) {
      check_case({std::string(op_name(op)), op, d, out, [d](Device dev) { return pair_inputs(dev, d, 300.0); }},
                 Check::exact);
    }
    auto x_only = [d](Device dev) { return std::vector<Tensor>{pair_inputs(dev, d, 300.0)[0]}; };
    check_case({"add_scalar", Op::add_scalar, d, out, x_only, {0.1}}, Check::exact);
    check_case({"mul_scalar (overflows f16)", Op::mul_scalar, d, out, x_only, {257.0}}, Check::exact);
    // sqrt and rsqrt of negative values give the canonical NaN on both sides.
    for (Op op : {Op::neg, Op::relu, Op::sqrt, Op::rsqrt}) {
      check_case({std::string(op_name(op)), op, d, out, x_only}, Check::exact);
    }
    for (double p : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0}) {
      check_case({fmt::format("pow {}", p), Op::pow_scalar, d, out, x_only, {p}}, Check::exact);
    }
    check_case({"clamp", Op::clamp, d, out, x_only, {-50.0, 70.0}}, Check::exact);
    check_case({"clamp without a lower bound", Op::clamp, d, out, x_only, {-INFINITY, 70.0}}, Check::exact);
    check_case({"where", Op::where, d, out,
                [d](Device dev) {
                  const std::vector<Tensor> xy = pair_inputs(dev, d, 3.0);
                  return std::vector<Tensor>{mask_values(dev, {8, 100}, 13), xy[0], xy[1]};
                }},
               Check::exact);
    check_case({"masked_fill", Op::masked_fill, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{pair_inputs(dev, d, 3.0)[0], mask_values(dev, {100}, 14).expand({8, 100})};
                },
                {-1e9}},
               Check::exact);
    // Backward functors without a math library call.
    for (Op op : {Op::relu_backward, Op::sigmoid_backward, Op::tanh_backward}) {
      check_case({std::string(op_name(op)), op, d, out, [d](Device dev) { return pair_inputs(dev, d, 2.0); }},
                 Check::exact);
    }
    check_case({"clamp_backward", Op::clamp_backward, d, out, [d](Device dev) { return pair_inputs(dev, d, 2.0); },
                {-0.5, 0.7}},
               Check::exact);
    check_case({"bce_backward", Op::bce_backward, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {8, 100}, d, 15), uniform_values(dev, {8, 100}, d, 16, 0.0, 1.0),
                                             uniform_values(dev, {8, 100}, d, 17, 0.0, 1.0)};
                }},
               Check::exact);
  }
}

TEST(cuda_parity_test, special_values_through_arithmetic_give_the_same_bits) {
  SKIP_WITHOUT_GPU();
  const std::vector<double> s = {0.0, -0.0, 1.0, -1.0, INFINITY, -INFINITY, NAN, -NAN, 65504.0, 65520.0, 6e-8, 3e38};
  const auto n = static_cast<std::int64_t>(s.size());
  for (DType d : kFloating) {
    auto inputs = [&, d](Device dev) {
      return std::vector<Tensor>{from_values(s, {n, 1}, {d}).to(dev).expand({n, n}),
                                 from_values(s, {1, n}, {d}).to(dev).expand({n, n})};
    };
    for (Op op : {Op::add, Op::sub, Op::mul, Op::div, Op::relu_backward, Op::sigmoid_backward, Op::tanh_backward,
                  Op::maximum, Op::minimum, Op::abs_backward, Op::std_backward}) {
      check_case({std::string(op_name(op)) + " specials", op, d, {{{n, n}, d}}, inputs}, Check::exact);
    }
  }
}

// NaNs with payloads, each sign, among ordinary values, as raw bits of `d` (from_values would give only
// the canonical NaN). Rows of 8: the payload patterns first, then finite values and infinities.
Tensor nan_payload_values(Device dev, DType d, std::int64_t rows) {
  const Shape shape = {rows, 8};
  Tensor t = from_values(std::vector<double>(static_cast<std::size_t>(rows * 8), 1.5), shape, {d});
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint64_t k = static_cast<std::uint64_t>(r) + 1;
    for (std::int64_t c = 0; c < 8; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * 8 + c);
      switch (d) {
        case DType::f32: {
          const std::uint32_t bits[8] = {0x7FC00000u | static_cast<std::uint32_t>(k), 0xFFC00000u | static_cast<std::uint32_t>(k * 77),
                                         0x7F800000u | static_cast<std::uint32_t>(k), 0x7FFFFFFFu,
                                         0x3FC00000u, 0xBF800000u, 0x7F800000u, 0x80000000u};
          std::memcpy(static_cast<std::uint32_t*>(t.data()) + i, &bits[c], 4);
          break;
        }
        case DType::f64: {
          const std::uint64_t bits[8] = {0x7FF8000000000000ull | k, 0xFFF8000000000000ull | (k * 77),
                                         0x7FF0000000000000ull | k, 0x7FFFFFFFFFFFFFFFull,
                                         0x3FF8000000000000ull, 0xBFF0000000000000ull, 0xFFF0000000000000ull, 0ull};
          std::memcpy(static_cast<std::uint64_t*>(t.data()) + i, &bits[c], 8);
          break;
        }
        case DType::f16: {
          const std::uint16_t bits[8] = {static_cast<std::uint16_t>(0x7E00u | (k & 0x1FF)),
                                         static_cast<std::uint16_t>(0xFE00u | ((k * 77) & 0x1FF)),
                                         static_cast<std::uint16_t>(0x7C00u | ((k & 0x1FF) + 1)), 0x7FFFu,
                                         0x3E00u, 0xBC00u, 0x7C00u, 0x8000u};
          std::memcpy(static_cast<std::uint16_t*>(t.data()) + i, &bits[c], 2);
          break;
        }
        case DType::bf16: {
          const std::uint16_t bits[8] = {static_cast<std::uint16_t>(0x7FC0u | (k & 0x3F)),
                                         static_cast<std::uint16_t>(0xFFC0u | ((k * 77) & 0x3F)),
                                         static_cast<std::uint16_t>(0x7F80u | ((k & 0x3F) + 1)), 0x7FFFu,
                                         0x3FC0u, 0xBF80u, 0x7F80u, 0x8000u};
          std::memcpy(static_cast<std::uint16_t*>(t.data()) + i, &bits[c], 2);
          break;
        }
        default: break;
      }
    }
  }
  return t.to(dev);
}

// Ops that only move values keep a NaN's bits on the CPU (the docs promise it): the GPU must store the
// same bits, not its own canonical NaN (PTX's abs and max leave a NaN's other bits unspecified).
TEST(cuda_parity_test, nan_payloads_through_value_moving_ops_keep_the_cpus_bits) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const std::vector<std::pair<Shape, DType>> out = {{{64, 8}, d}};
    auto x_only = [d](Device dev) { return std::vector<Tensor>{nan_payload_values(dev, d, 64)}; };
    for (Op op : {Op::abs, Op::neg, Op::relu}) check_case({std::string(op_name(op)) + " payloads", op, d, out, x_only}, Check::exact);
    check_case({"clamp payloads", Op::clamp, d, out, x_only, {-1.0, 1.0}}, Check::exact);
    check_case({"copy payloads (transposed source)", Op::copy, d, {{{8, 64}, d}},
                [d](Device dev) { return std::vector<Tensor>{nan_payload_values(dev, d, 64).transpose(0, 1)}; }},
               Check::exact);
    check_case({"where payloads", Op::where, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{mask_values(dev, {64, 8}, 41), nan_payload_values(dev, d, 64),
                                             values(dev, {64, 8}, d, 44)};
                }},
               Check::exact);
    check_case({"masked_fill payloads", Op::masked_fill, d, out,
                [d](Device dev) { return std::vector<Tensor>{nan_payload_values(dev, d, 64), mask_values(dev, {64, 8}, 42)}; },
                {-1e9}},
               Check::exact);
    for (Op op : {Op::maximum, Op::minimum}) {
      check_case({std::string(op_name(op)) + " payloads", op, d, out,
                  [d](Device dev) {
                    return std::vector<Tensor>{nan_payload_values(dev, d, 64), values(dev, {64, 8}, d, 43)};
                  }},
                 Check::exact);
    }
  }
}

TEST(cuda_parity_test, functions_from_the_math_library_match_the_cpu_within_a_few_ulp) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const std::vector<std::pair<Shape, DType>> out = {{{8, 100}, d}};
    auto x_only = [d](Device dev) { return std::vector<Tensor>{pair_inputs(dev, d, 3.0)[0]}; };
    for (Op op : {Op::exp, Op::sigmoid, Op::tanh}) check_case({std::string(op_name(op)), op, d, out, x_only}, Check::math, 1.0);
    check_case({"log", Op::log, d, out, [d](Device dev) { return std::vector<Tensor>{uniform_values(dev, {8, 100}, d, 18, 0.01, 50.0)}; }},
               Check::math, 8.0);
    check_case({"gelu erf", Op::gelu, d, out, x_only, {0.0}}, Check::math, 8.0);
    check_case({"gelu tanh", Op::gelu, d, out, x_only, {1.0}}, Check::math, 8.0);
    check_case({"pow 1.7", Op::pow_scalar, d, out,
                [d](Device dev) { return std::vector<Tensor>{uniform_values(dev, {8, 100}, d, 19, 0.0, 8.0)}; }, {1.7}},
               Check::math, 1.0);
    auto gx = [d](Device dev) { return pair_inputs(dev, d, 3.0); };
    check_case({"gelu_backward erf", Op::gelu_backward, d, out, gx, {0.0}}, Check::math, 8.0);
    check_case({"gelu_backward tanh", Op::gelu_backward, d, out, gx, {1.0}}, Check::math, 8.0);
    check_case({"bce", Op::bce, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{uniform_values(dev, {8, 100}, d, 20, 0.0, 1.0),
                                             uniform_values(dev, {8, 100}, d, 21, 0.0, 1.0)};
                }},
               Check::math, 8.0);
    check_case({"bce_logits", Op::bce_logits, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {8, 100}, d, 22, 3.0), uniform_values(dev, {8, 100}, d, 23, 0.0, 1.0)};
                }},
               Check::math, 8.0);
    check_case({"bce_logits_backward", Op::bce_logits_backward, d, out,
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {8, 100}, d, 24), values(dev, {8, 100}, d, 25, 3.0),
                                             uniform_values(dev, {8, 100}, d, 26, 0.0, 1.0)};
                }},
               Check::math, 1.0);
  }
}

// The ops for hand-written losses. Exact: rsub, reciprocal, abs, maximum/minimum and their backward
// (ties included: the inputs are on a coarse grid), std_backward, the row extremes with their indices,
// var_rows (two passes in lane_tree_sum's order, then a correctly rounded division and sqrt), the even
// share of a tie's gradient and the index backward. Math library: log1p, expm1, logsigmoid, softplus,
// silu and their backward.
TEST(cuda_parity_test, loss_ops_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const std::vector<std::pair<Shape, DType>> out = {{{8, 100}, d}};
    auto x_only = [d](Device dev) { return std::vector<Tensor>{pair_inputs(dev, d, 3.0)[0]}; };
    // Multiples of 1/2 in [-2, 2]: maximum, minimum and their backward meet many ties.
    auto grid = [d](Device dev, std::uint64_t seed) {
      Generator gen(seed);
      const std::vector<double> v = randn({8, 100}, gen, {DType::f64}).values();
      std::vector<double> r(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) r[i] = std::round(std::fmin(std::fmax(2.0 * v[i], -2.0), 2.0) * 2.0) / 2.0;
      return from_values(r, {8, 100}, {d}).to(dev);
    };
    check_case({"rsub_scalar", Op::rsub_scalar, d, out, x_only, {0.1}}, Check::exact);
    for (Op op : {Op::reciprocal, Op::abs}) check_case({std::string(op_name(op)), op, d, out, x_only}, Check::exact);
    for (Op op : {Op::maximum, Op::minimum}) {
      check_case({std::string(op_name(op)), op, d, out, [grid](Device dev) {
                    return std::vector<Tensor>{grid(dev, 101), grid(dev, 102)};
                  }},
                 Check::exact);
    }
    for (Op op : {Op::maximum_backward, Op::minimum_backward}) {
      check_case({std::string(op_name(op)), op, d, out, [d, grid](Device dev) {
                    return std::vector<Tensor>{values(dev, {8, 100}, d, 103), grid(dev, 101), grid(dev, 102)};
                  }},
                 Check::exact);
    }
    check_case({"abs_backward", Op::abs_backward, d, out, [d, grid](Device dev) {
                  return std::vector<Tensor>{values(dev, {8, 100}, d, 104), grid(dev, 105)};
                }},
               Check::exact);
    check_case({"std_backward", Op::std_backward, d, out, [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {8, 100}, d, 106), relu(values(dev, {8, 100}, d, 107))};
                }},
               Check::exact);
    for (Op op : {Op::log1p, Op::logsigmoid}) check_case({std::string(op_name(op)), op, d, out, x_only}, Check::math, 8.0);
    check_case({"log1p (> -1)", Op::log1p, d, out,
                [d](Device dev) { return std::vector<Tensor>{uniform_values(dev, {8, 100}, d, 108, -0.99, 20.0)}; }},
               Check::math, 1.0);
    check_case({"expm1", Op::expm1, d, out, x_only}, Check::math, 1.0);
    check_case({"softplus", Op::softplus, d, out, x_only, {1.0, 20.0}}, Check::math, 1.0);
    check_case({"softplus beta 2 threshold 3", Op::softplus, d, out, x_only, {2.0, 3.0}}, Check::math, 1.0);
    auto gx = [d](Device dev) { return pair_inputs(dev, d, 3.0); };
    check_case({"logsigmoid_backward", Op::logsigmoid_backward, d, out, gx}, Check::math, 1.0);
    check_case({"softplus_backward", Op::softplus_backward, d, out, gx, {1.0, 20.0}}, Check::math, 1.0);
    check_case({"softplus_backward beta 2 threshold 3", Op::softplus_backward, d, out, gx, {2.0, 3.0}}, Check::math, 1.0);
    // silu has no cancellation; its backward's 1 + x (1 - s) cancels near x = -1.28, terms up to |x| ~ 10.
    check_case({"silu", Op::silu, d, out, x_only}, Check::math, 1.0);
    check_case({"silu_backward", Op::silu_backward, d, out, gx}, Check::math, 16.0);
  }
}

TEST(cuda_parity_test, dropout_draws_the_same_mask_from_the_philox_stream) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const double p = 0.3;
    const double scale = d == DType::f64 ? 1.0 / (1.0 - p) : static_cast<double>(1.0f / (1.0f - static_cast<float>(p)));
    KernelCase c{"dropout", Op::dropout, d, {{{8, 100}, d}, {{8, 100}, DType::boolean}},
                 [d](Device dev) { return std::vector<Tensor>{pair_inputs(dev, d, 3.0)[0]}; }, {p, scale}, 7, 3};
    check_case(c, Check::exact);
    check_case({"masked_scale", Op::masked_scale, d, {{{8, 100}, d}},
                [d](Device dev) {
                  return std::vector<Tensor>{pair_inputs(dev, d, 3.0)[0], mask_values(dev, {8, 100}, 27)};
                },
                {scale}},
               Check::exact);
  }
}

// ---- rows ----

// Column counts around the warp's 32 lanes: one element, one more than a warp, a partial last pass, and
// a long row.
const std::vector<std::pair<std::int64_t, std::int64_t>> kRowShapes = {{7, 1}, {7, 33}, {7, 100}, {3, 5000}};

TEST(cuda_parity_test, row_sums_follow_the_warp_order_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    for (auto [rows, cols] : kRowShapes) {
      auto x = [d, rows, cols](Device dev) { return std::vector<Tensor>{values(dev, {rows, cols}, d, 30, 1e3)}; };
      const std::string shape = fmt::format(" [{}, {}]", rows, cols);
      check_case({"sum_rows" + shape, Op::sum_rows, d, {{{rows}, d}}, x, {1.0, 1.0}}, Check::exact);
      const double factor = d == DType::f64 ? 1.0 / cols : static_cast<double>(1.0f / static_cast<float>(cols));
      check_case({"mean rows" + shape, Op::sum_rows, d, {{{rows}, d}}, x, {factor, 1.0}}, Check::exact);
      check_case({"argmax_rows" + shape, Op::argmax_rows, DType::i64, {{{rows}, DType::i64}}, x}, Check::exact);
      check_case({"softmax_backward_rows" + shape, Op::softmax_backward_rows, d, {{{rows, cols}, d}},
                  [d, rows, cols](Device dev) {
                    return std::vector<Tensor>{values(dev, {rows, cols}, d, 31), uniform_values(dev, {rows, cols}, d, 32, 0, 1)};
                  }},
                 Check::exact);
      check_case({"softmax_rows" + shape, Op::softmax_rows, d, {{{rows, cols}, d}},
                  [d, rows, cols](Device dev) { return std::vector<Tensor>{values(dev, {rows, cols}, d, 33, 3.0)}; }},
                 Check::math, 1.0);
      check_case({"log_softmax_rows" + shape, Op::log_softmax_rows, d, {{{rows, cols}, d}},
                  [d, rows, cols](Device dev) { return std::vector<Tensor>{values(dev, {rows, cols}, d, 33, 3.0)}; }},
                 Check::math, 16.0);
      check_case({"log_softmax_backward_rows" + shape, Op::log_softmax_backward_rows, d, {{{rows, cols}, d}},
                  [d, rows, cols](Device dev) {
                    return std::vector<Tensor>{values(dev, {rows, cols}, d, 34), values(dev, {rows, cols}, d, 35, 1.0, -4.0)};
                  }},
                 Check::math, 8.0);
    }
  }
}

TEST(cuda_parity_test, rows_with_nans_infinities_ties_and_signed_zeros_resolve_as_on_the_cpu) {
  SKIP_WITHOUT_GPU();
  // Row 0: a NaN late in the row; row 1: an infinity; row 2: ties of the maximum in different lanes;
  // row 3: -0 before +0 as the maximum; row 4: all -inf.
  const std::int64_t cols = 70;
  std::vector<double> v(5 * cols, 0.0);
  for (std::int64_t j = 0; j < cols; ++j) {
    v[j] = std::sin(static_cast<double>(j));
    v[cols + j] = std::cos(static_cast<double>(j));
    v[2 * cols + j] = (j == 5 || j == 40 || j == 69) ? 2.0 : -1.0;
    v[3 * cols + j] = j == 3 ? -0.0 : j == 50 ? 0.0 : -2.0;
    v[4 * cols + j] = -INFINITY;
  }
  v[60] = NAN;
  v[cols + 10] = INFINITY;
  for (DType d : kFloating) {
    auto x = [&v, d](Device dev) { return std::vector<Tensor>{from_values(v, {5, cols}, {d}).to(dev)}; };
    check_case({"argmax_rows specials", Op::argmax_rows, DType::i64, {{{5}, DType::i64}}, x}, Check::exact);
    check_case({"sum_rows specials", Op::sum_rows, d, {{{5}, d}}, x, {1.0, 1.0}}, Check::exact);
    check_case({"softmax_rows specials", Op::softmax_rows, d, {{{5, cols}, d}}, x}, Check::math, 1.0);
    check_case({"log_softmax_rows specials", Op::log_softmax_rows, d, {{{5, cols}, d}}, x}, Check::math, 8.0);
  }
}

TEST(cuda_parity_test, loss_reductions_match_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  // Rows as in rows_with_nans...: a late NaN, an infinity, tied maxima in different lanes, -0 before +0,
  // all -inf; then ordinary rows of several lengths.
  const std::int64_t cols = 70;
  std::vector<double> v(5 * cols, 0.0);
  for (std::int64_t j = 0; j < cols; ++j) {
    v[j] = std::sin(static_cast<double>(j));
    v[cols + j] = std::cos(static_cast<double>(j));
    v[2 * cols + j] = (j == 5 || j == 40 || j == 69) ? 2.0 : -1.0;
    v[3 * cols + j] = j == 3 ? -0.0 : j == 50 ? 0.0 : -2.0;
    v[4 * cols + j] = -INFINITY;
  }
  v[60] = NAN;
  v[cols + 10] = INFINITY;
  for (DType d : kFloating) {
    std::vector<std::pair<std::string, std::function<std::vector<Tensor>(Device)>>> inputs = {
        {"specials", [&v, d](Device dev) { return std::vector<Tensor>{from_values(v, {5, cols}, {d}).to(dev)}; }}};
    for (const auto& [r, c] : kRowShapes) {
      inputs.emplace_back(fmt::format("[{}, {}]", r, c), [d, shape = Shape{r, c}](Device dev) {
        return std::vector<Tensor>{values(dev, shape, d, 110, 3.0)};
      });
    }
    for (const auto& [name, x] : inputs) {
      const std::int64_t rows = x(Device::cpu())[0].size(0);
      for (Op op : {Op::max_rows, Op::min_rows}) {
        const KernelCase c{std::string(op_name(op)) + " " + name, op, d, {{{rows}, d}, {{rows}, DType::i64}}, x};
        check_case(c, Check::exact);
        check_case({c.name + " without indices", op, d, {{{rows}, d}}, x}, Check::exact);
        // The even share among the elements equal to the extreme, with and without NaN matching NaN.
        const Tensor extreme = run_case(c, Device::cpu())[0];
        for (double nan_matches : {0.0, 1.0}) {
          check_case({fmt::format("evenly_distribute_rows {} {} nan {}", op_name(op), name, nan_matches),
                      Op::evenly_distribute_rows, d, {{x(Device::cpu())[0].shape(), d}},
                      [x, extreme, d, rows](Device dev) {
                        return std::vector<Tensor>{values(dev, {rows}, d, 111), x(dev)[0], extreme.to(dev)};
                      },
                      {nan_matches}},
                     Check::exact);
        }
        const Tensor index = run_case(c, Device::cpu())[1];
        check_case({"index_backward_rows " + name, Op::index_backward_rows, d, {{x(Device::cpu())[0].shape(), d}},
                    [index, d, rows](Device dev) { return std::vector<Tensor>{values(dev, {rows}, d, 112), index.to(dev)}; }},
                   Check::exact);
      }
      for (double correction : {0.0, 1.0, 70.0}) {
        for (double take_sqrt : {0.0, 1.0}) {
          check_case({fmt::format("var_rows {} correction {} sqrt {}", name, correction, take_sqrt), Op::var_rows, d,
                      {{{rows}, d}}, x, {correction, take_sqrt}},
                     Check::exact);
        }
      }
    }
  }
}

TEST(cuda_parity_test, layer_norm_and_its_gradients_match_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const DType acc = d == DType::f64 ? DType::f64 : DType::f32;
    for (auto [rows, cols] : kRowShapes) {
      for (bool affine : {true, false}) {
        const std::string name = fmt::format("layer_norm [{}, {}]{}", rows, cols, affine ? " affine" : "");
        auto x = [=](Device dev) { return values(dev, {rows, cols}, d, 40, 2.0, 5.0); };
        auto w = [=](Device dev) { return affine ? values(dev, {cols}, d, 41, 0.5, 1.0) : Tensor(); };
        auto b = [=](Device dev) { return affine ? values(dev, {cols}, d, 42, 0.5) : Tensor(); };
        check_case({name, Op::layer_norm_rows, d, {{{rows, cols}, d}, {{rows}, acc}, {{rows}, acc}},
                    [=](Device dev) { return std::vector<Tensor>{x(dev), w(dev), b(dev)}; }, {1e-5}},
                   Check::exact, 1.0, Check::exact_nan_any);
        // Saved statistics from the CPU's forward, given to both backward kernels.
        KernelCase fwd{name, Op::layer_norm_rows, d, {{{rows, cols}, d}, {{rows}, acc}, {{rows}, acc}},
                       [=](Device dev) { return std::vector<Tensor>{x(dev), w(dev), b(dev)}; }, {1e-5}};
        const std::vector<Tensor> stats = run_case(fwd, Device::cpu());
        auto g = [=](Device dev) { return values(dev, {rows, cols}, d, 43); };
        check_case({name + " backward", Op::layer_norm_backward_rows, d, {{{rows, cols}, d}},
                    [=](Device dev) {
                      return std::vector<Tensor>{g(dev), x(dev), stats[1].to(dev), stats[2].to(dev), w(dev)};
                    }},
                   Check::exact);
        check_case({name + " param grad", Op::layer_norm_param_grad, d, {{{cols}, d}, {{cols}, d}},
                    [=](Device dev) {
                      return std::vector<Tensor>{g(dev), x(dev), stats[1].to(dev), stats[2].to(dev)};
                    }},
                   Check::exact);
      }
    }
  }
}

// ---- windows, embedding, nll ----

TEST(cuda_parity_test, im2col_col2im_and_max_pooling_match_the_cpu_bit_for_bit) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    // x [2, 3, 7, 6], kernel 3 x 2, stride 2 x 1, padding 1 x 0: OH 4, OW 5, L 20, C*KH*KW 18.
    const std::vector<double> conv = {3, 2, 2, 1, 1, 0};
    check_case({"im2col", Op::im2col, d, {{{2, 18, 20}, d}},
                [d](Device dev) { return std::vector<Tensor>{values(dev, {2, 3, 7, 6}, d, 50)}; }, conv},
               Check::exact);
    check_case({"col2im", Op::col2im, d, {{{2, 3, 7, 6}, d}},
                [d](Device dev) { return std::vector<Tensor>{values(dev, {2, 18, 20}, d, 51)}; }, conv},
               Check::exact);
    // Pooling 3 x 2, stride 2 x 2, padding 1 x 1: OH 4, OW 4; a NaN and ties in the input.
    const std::vector<double> pool = {3, 2, 2, 2, 1, 1};
    auto x = [d](Device dev) {
      Tensor t = values(dev, {2, 3, 7, 6}, d, 52).to(Device::cpu()).clone();
      t.set({0, 1, 2, 2}, NAN);
      t.set({1, 2, 4, 1}, 9.0);
      t.set({1, 2, 4, 2}, 9.0);
      return std::vector<Tensor>{t.to(dev)};
    };
    const KernelCase fwd{"max_pool2d", Op::max_pool2d, d, {{{2, 3, 4, 4}, d}, {{2, 3, 4, 4}, DType::i64}}, x, pool};
    check_case(fwd, Check::exact);
    const Tensor index = run_case(fwd, Device::cpu())[1];
    check_case({"max_pool2d_backward", Op::max_pool2d_backward, d, {{{2, 3, 7, 6}, d}},
                [d, index](Device dev) { return std::vector<Tensor>{values(dev, {2, 3, 4, 4}, d, 53), index.to(dev)}; },
                pool},
               Check::exact);
  }
}

TEST(cuda_parity_test, embedding_and_its_backward_sum_in_index_order_as_on_the_cpu) {
  SKIP_WITHOUT_GPU();
  // Repeated indices: the backward adds rows 0, 3 and 9 several times, in index order.
  const std::vector<double> index = {3, 0, 9, 3, 3, 1, 0, 9, 2, 3, 7, 0};
  for (DType d : kFloating) {
    check_case({"embedding", Op::embedding, d, {{{12, 33}, d}},
                [&index, d](Device dev) { return std::vector<Tensor>{values(dev, {10, 33}, d, 60), index_values(dev, index)}; }},
               Check::exact);
    check_case({"embedding_backward", Op::embedding_backward, d, {{{10, 33}, d}},
                [&index, d](Device dev) {
                  return std::vector<Tensor>{values(dev, {12, 33}, d, 61, 1e3), index_values(dev, index)};
                }},
               Check::exact);
  }
}

TEST(cuda_parity_test, nll_and_its_backward_match_the_cpu_bit_for_bit_with_ignored_targets) {
  SKIP_WITHOUT_GPU();
  const std::vector<double> target = {4, 0, -100, 2, 2, 1, -100, 3, 0};
  for (DType d : kFloating) {
    check_case({"nll_rows", Op::nll_rows, d, {{{9}, d}},
                [&target, d](Device dev) { return std::vector<Tensor>{values(dev, {9, 5}, d, 70), index_values(dev, target)}; },
                {-100.0}},
               Check::exact);
    check_case({"nll_backward_rows", Op::nll_backward_rows, d, {{{9, 5}, d}},
                [&target, d](Device dev) { return std::vector<Tensor>{values(dev, {9}, d, 71), index_values(dev, target)}; },
                {-100.0, 7.0}},
               Check::exact);
    // The gradient of a mean: one value broadcast to every row (stride 0).
    check_case({"nll_backward_rows broadcast", Op::nll_backward_rows, d, {{{9, 5}, d}},
                [&target, d](Device dev) {
                  return std::vector<Tensor>{values(dev, {1}, d, 72).expand({9}), index_values(dev, target)};
                },
                {-100.0, 7.0}},
               Check::exact);
  }
}

// ---- matrix products ----

// The gemm bound of the comment at the top, per output element, from the inputs' values on the host.
std::vector<double> gemm_bound(const Tensor& A, const Tensor& B, const Tensor& out, bool sum_batches) {
  const std::vector<double> a = A.to(Device::cpu()).contiguous().values(), b = B.to(Device::cpu()).contiguous().values();
  const std::int64_t nb = A.size(0), m = A.size(1), k = A.size(2), n = B.size(2);
  const bool f64 = out.dtype() == DType::f64;
  const bool f32_inputs = A.dtype() == DType::f32 && B.dtype() == DType::f32;
  const char* tf32 = std::getenv("AMPSCOPE_ALLOW_TF32");
  const bool allow_tf32 = tf32 != nullptr && std::string(tf32) == "1" && f32_inputs && !f64;
  const double u = f64 ? 0x1p-52 : 0x1p-23;
  std::vector<double> bound(static_cast<std::size_t>(out.numel()), 0.0);
  for (std::int64_t bi = 0; bi < nb; ++bi) {
    const std::int64_t ob = sum_batches ? 0 : bi;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t kk = 0; kk < k; ++kk) s += std::fabs(a[(bi * m + i) * k + kk]) * std::fabs(b[(bi * k + kk) * n + j]);
        bound[(ob * m + i) * n + j] += s;
      }
    }
  }
  const double total_k = static_cast<double>(sum_batches ? nb * k : k);
  for (double& x : bound) x *= 2 * total_k * u + (allow_tf32 ? 2 * 0x1p-11 : 0.0);
  return bound;
}

struct GemmCase {
  std::string name;
  std::function<std::vector<Tensor>(Device)> inputs;  // A, B, bias (maybe undefined)
  bool bias_per_row = false;
  bool sum_batches = false;
  DType out = DType::f32;
};

void check_gemm(const GemmCase& g) {
  SCOPED_TRACE(g.name);
  const std::vector<Tensor> ins = g.inputs(Device::cpu());
  const Shape out_shape = {g.sum_batches ? 1 : ins[0].size(0), ins[0].size(1), ins[1].size(2)};
  const KernelCase c{g.name, Op::gemm, g.out, {{out_shape, g.out}}, g.inputs,
                     {g.bias_per_row ? 1.0 : 0.0, g.sum_batches ? 1.0 : 0.0}};
  const Tensor cpu = run_case(c, Device::cpu())[0];
  const Tensor gpu = run_case(c, Device::cuda())[0];
  expect_parity(cpu, gpu, fmt::format("{} -> {}", g.name, dtype_name(g.out)), Check::gemm, 1.0,
                gemm_bound(ins[0], ins[1], cpu, g.sum_batches));
}

TEST(cuda_parity_test, gemm_matches_the_cpu_within_the_dot_product_error_bound) {
  SKIP_WITHOUT_GPU();
  for (DType d : kFloating) {
    const DType acc = d == DType::f64 ? DType::f64 : DType::f32;
    check_gemm({"contiguous [3, 5, 37] @ [3, 37, 6]",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {3, 5, 37}, d, 80), values(dev, {3, 37, 6}, d, 81), Tensor()};
                },
                false, false, d});
    check_gemm({"transposed views with a bias per column",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {3, 37, 5}, d, 82).transpose(1, 2),
                                             values(dev, {3, 6, 37}, d, 83).transpose(1, 2), values(dev, {6}, d, 84)};
                },
                false, false, d});
    check_gemm({"one matrix shared by the batch (stride 0) with a bias per row (conv2d)",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {1, 5, 37}, d, 85).expand({3, 5, 37}),
                                             values(dev, {3, 37, 6}, d, 86), values(dev, {5}, d, 87)};
                },
                true, false, d});
    check_gemm({"a layout cuBLAS cannot read (every other column), packed first",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {2, 5, 74}, d, 88).slice(2, 0, 74, 2), values(dev, {2, 37, 6}, d, 89),
                                             Tensor()};
                },
                false, false, d});
    check_gemm({"sum over the batch before one rounding (conv2d weight gradient)",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {4, 5, 37}, d, 90), values(dev, {4, 6, 37}, d, 91).transpose(1, 2),
                                             Tensor()};
                },
                false, true, d});
    check_gemm({"K = 0 leaves only the bias",
                [d](Device dev) {
                  return std::vector<Tensor>{Tensor::empty({2, 3, 0}, {d, dev}), Tensor::empty({2, 0, 4}, {d, dev}),
                                             values(dev, {4}, d, 92)};
                },
                false, false, d});
    // Inputs in the storage dtype, output in the accumulation type (conv2d's column gradient).
    check_gemm({"f16/bf16 inputs into a float output",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {2, 5, 37}, d, 93), values(dev, {2, 37, 6}, d, 94), Tensor()};
                },
                false, false, acc});
    // A product whose f16 result overflows must be inf on both (the overflow a user must see).
    check_gemm({"an f16 overflow stays inf",
                [d](Device dev) {
                  return std::vector<Tensor>{full({1, 2, 64}, 40.0, {d, dev}), full({1, 64, 3}, 40.0, {d, dev}), Tensor()};
                },
                false, false, d});
  }
  // Mixed input dtypes are widened to float, as the CPU does.
  check_gemm({"f16 @ f32 into f32",
              [](Device dev) {
                return std::vector<Tensor>{values(dev, {2, 5, 37}, DType::f16, 95), values(dev, {2, 37, 6}, DType::f32, 96),
                                           Tensor()};
              },
              false, false, DType::f32});
}

// A larger product, where cuBLAS picks tensor-core and split-K kernels the small ones do not reach.
TEST(cuda_parity_test, a_large_gemm_stays_within_the_bound) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    check_gemm({"[1, 96, 2048] @ [1, 2048, 80]",
                [d](Device dev) {
                  return std::vector<Tensor>{values(dev, {1, 96, 2048}, d, 97), values(dev, {1, 2048, 80}, d, 98), Tensor()};
                },
                false, false, d});
  }
}

// ---- the table ----

TEST(cuda_parity_test, the_cuda_backend_has_a_kernel_for_every_op_and_dtype_the_cpu_has) {
  SKIP_WITHOUT_GPU();
  const Backend& cpu = backend_for(Device::cpu());
  const Backend& gpu = backend_for(Device::cuda());
  for (int o = 0; o < kNumOps; ++o) {
    for (int t = 0; t < kNumDTypes; ++t) {
      const Op op = static_cast<Op>(o);
      const DType d = static_cast<DType>(t);
      EXPECT_EQ(cpu.supports(op, d), gpu.supports(op, d)) << op_name(op) << " " << dtype_name(d);
    }
  }
}

}  // namespace
}  // namespace ampscope
