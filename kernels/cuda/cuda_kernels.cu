// CUDA kernels for creation, copies and every element-wise op (with their backward functors, the losses
// and dropout), through the same functors and conversions as the CPU backend (kernels/cpu/elementwise.h
// and nn_kernels.cpp): load, widen to the accumulation type, apply the functor, round once on store.
// Two sections: kernels (the bodies one generic grid-stride kernel runs), then launchers.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/convert.h"
#include "core/philox.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/functors.h"

namespace ampscope::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------------------
// Bodies index through TensorView::offset_of, so strided and broadcast (stride 0) inputs work unchanged;
// outputs of element-wise ops are contiguous (core/backend.h), fill and copy write through views.

template <class T>
struct FillBody {
  TensorView out;
  T value;
  __device__ void operator()(std::int64_t i) const { out.ptr<T>()[out.offset_of(i)] = value; }
};

template <class To, class From>
struct CopyBody {
  TensorView out, in;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<To>()[out.offset_of(i)] = convert<To>(in.ptr<From>()[in.offset_of(i)]);
  }
};

template <class T>
struct ArangeBody {
  TensorView out;
  double start, step;
  __device__ void operator()(std::int64_t i) const {
    if constexpr (std::is_same_v<T, std::int64_t>) {
      out.ptr<T>()[i] = static_cast<std::int64_t>(start) + i * static_cast<std::int64_t>(step);
    } else {
      out.ptr<T>()[i] = convert<T>(start + static_cast<double>(i) * step);
    }
  }
};

template <class T>
struct UniformBody {
  TensorView out;
  std::uint64_t seed, offset;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<T>()[i] = uniform_at<T>(seed, offset, static_cast<std::uint64_t>(i));
  }
};

template <class T>
struct NormalBody {
  TensorView out;
  std::uint64_t seed, offset;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<T>()[i] = convert<T>(normal_at(seed, offset, static_cast<std::uint64_t>(i)));
  }
};

template <class T>
__device__ acc_type<T> load_acc(const TensorView& v, std::int64_t i) {
  return convert<acc_type<T>>(v.ptr<T>()[v.offset_of(i)]);
}

// out[i] = fn(in[0][i], ..., in[N-1][i]), every input of dtype T (cpu::unary/binary/ternary_kernel).
template <class T, class Fn, int N>
struct MapBody {
  TensorView out;
  TensorView in[N];
  Fn fn;
  __device__ void operator()(std::int64_t i) const {
    if constexpr (N == 1) {
      out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(in[0], i)));
    } else if constexpr (N == 2) {
      out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(in[0], i), load_acc<T>(in[1], i)));
    } else {
      out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(in[0], i), load_acc<T>(in[1], i), load_acc<T>(in[2], i)));
    }
  }
};

// out[i] = fn(in[i], scalar), the scalar already in the accumulation type (cpu::binary_scalar_kernel).
template <class T, class Fn>
struct ScalarBody {
  TensorView out, in;
  acc_type<T> scalar;
  Fn fn;
  __device__ void operator()(std::int64_t i) const { out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(in, i), scalar)); }
};

// Values are moved, not converted: where and masked_fill keep a NaN's bits, as on the CPU.
template <class T>
struct WhereBody {
  TensorView out, cond, x, y;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<T>()[i] = cond.ptr<bool>()[cond.offset_of(i)] ? x.ptr<T>()[x.offset_of(i)] : y.ptr<T>()[y.offset_of(i)];
  }
};

template <class T>
struct MaskedFillBody {
  TensorView out, x, mask;
  T value;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<T>()[i] = mask.ptr<bool>()[mask.offset_of(i)] ? value : x.ptr<T>()[x.offset_of(i)];
  }
};

// Element i is kept when the i-th float of the Philox stream is below 1 - p: the CPU's draw exactly.
template <class T>
struct DropoutBody {
  TensorView out, keep, in;
  std::uint64_t seed, offset;
  float keep_prob;
  MaskedScaleFn fn;
  __device__ void operator()(std::int64_t i) const {
    const bool k = uniform_at<float>(seed, offset, static_cast<std::uint64_t>(i)) < keep_prob;
    keep.ptr<bool>()[i] = k;
    out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(in, i), k));
  }
};

template <class T>
struct MaskedScaleBody {
  TensorView out, g, keep;
  MaskedScaleFn fn;
  __device__ void operator()(std::int64_t i) const {
    out.ptr<T>()[i] = convert<T>(fn(load_acc<T>(g, i), keep.ptr<bool>()[keep.offset_of(i)]));
  }
};

// ---- launchers -----------------------------------------------------------------------------------

template <class T, class Fn, int N>
cudaError_t launch_map(const KernelArgs& a, cudaStream_t s) {
  MapBody<T, Fn, N> body{a.out, {}, make_functor<Fn>(a.scalars.data())};
  for (int k = 0; k < N; ++k) body.in[k] = a.in[k];
  return launch_linear(a.out.numel, body, s);
}

template <class T, class Fn>
cudaError_t launch_scalar(const KernelArgs& a, cudaStream_t s) {
  return launch_linear(a.out.numel,
                       ScalarBody<T, Fn>{a.out, a.in[0], static_cast<acc_type<T>>(a.scalars[0]),
                                         make_functor<Fn>(a.scalars.data())},
                       s);
}

template <class T>
cudaError_t launch_dropout(const KernelArgs& a, cudaStream_t s) {
  const double scale = a.scalars[1];
  return launch_linear(a.out.numel,
                       DropoutBody<T>{a.out, a.aux[0], a.in[0], a.seed, a.offset,
                                      static_cast<float>(1.0 - a.scalars[0]), MaskedScaleFn(&scale)},
                       s);
}

}  // namespace

cudaError_t launch_fill(const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_linear(a.out.numel, FillBody<T>{a.out, convert<T>(a.scalars[0])}, s);
  });
}

cudaError_t launch_copy(const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto to) {
    return visit_dtype(a.in[0].dtype, [&](auto from) {
      return launch_linear(a.out.numel, CopyBody<decltype(to), decltype(from)>{a.out, a.in[0]}, s);
    });
  });
}

cudaError_t launch_arange(const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      return cudaErrorInvalidValue;  // never registered: arange has no bool kernel
    } else {
      return launch_linear(a.out.numel, ArangeBody<T>{a.out, a.scalars[0], a.scalars[1]}, s);
    }
  });
}

cudaError_t launch_uniform(const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;  // never registered for non-floating dtypes
    } else {
      return launch_linear(a.out.numel, UniformBody<T>{a.out, a.seed, a.offset}, s);
    }
  });
}

cudaError_t launch_normal(const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;  // never registered for non-floating dtypes
    } else {
      return launch_linear(a.out.numel, NormalBody<T>{a.out, a.seed, a.offset}, s);
    }
  });
}

bool is_elementwise_op(Op op) {
  switch (op) {
    case Op::add: case Op::sub: case Op::mul: case Op::div: case Op::add_scalar: case Op::mul_scalar:
    case Op::neg: case Op::relu: case Op::exp: case Op::log: case Op::sqrt: case Op::rsqrt: case Op::sigmoid:
    case Op::tanh: case Op::gelu: case Op::pow_scalar: case Op::clamp: case Op::where: case Op::masked_fill:
    case Op::relu_backward: case Op::gelu_backward: case Op::sigmoid_backward: case Op::tanh_backward:
    case Op::clamp_backward: case Op::bce: case Op::bce_backward: case Op::bce_logits:
    case Op::bce_logits_backward: case Op::dropout: case Op::masked_scale:
    case Op::rsub_scalar: case Op::reciprocal: case Op::abs: case Op::log1p: case Op::expm1:
    case Op::abs_backward: case Op::logsigmoid: case Op::logsigmoid_backward: case Op::softplus:
    case Op::softplus_backward: case Op::maximum: case Op::minimum: case Op::maximum_backward:
    case Op::minimum_backward: case Op::std_backward: case Op::silu: case Op::silu_backward:
      return true;
    default:
      return false;
  }
}

cudaError_t launch_elementwise(Op op, const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;  // never registered for non-floating dtypes
    } else {
      switch (op) {
        case Op::add: return launch_map<T, AddFn, 2>(a, s);
        case Op::sub: return launch_map<T, SubFn, 2>(a, s);
        case Op::mul: return launch_map<T, MulFn, 2>(a, s);
        case Op::div: return launch_map<T, DivFn, 2>(a, s);
        case Op::add_scalar: return launch_scalar<T, AddFn>(a, s);
        case Op::mul_scalar: return launch_scalar<T, MulFn>(a, s);
        case Op::neg: return launch_map<T, NegFn, 1>(a, s);
        case Op::relu: return launch_map<T, ReluFn, 1>(a, s);
        case Op::exp: return launch_map<T, ExpFn, 1>(a, s);
        case Op::log: return launch_map<T, LogFn, 1>(a, s);
        case Op::sqrt: return launch_map<T, SqrtFn, 1>(a, s);
        case Op::rsqrt: return launch_map<T, RsqrtFn, 1>(a, s);
        case Op::sigmoid: return launch_map<T, SigmoidFn, 1>(a, s);
        case Op::tanh: return launch_map<T, TanhFn, 1>(a, s);
        case Op::gelu: return launch_map<T, GeluFn, 1>(a, s);
        case Op::pow_scalar: return launch_map<T, PowFn, 1>(a, s);
        case Op::clamp: return launch_map<T, ClampFn, 1>(a, s);
        case Op::relu_backward: return launch_map<T, ReluBackwardFn, 2>(a, s);
        case Op::gelu_backward: return launch_map<T, GeluBackwardFn, 2>(a, s);
        case Op::sigmoid_backward: return launch_map<T, SigmoidBackwardFn, 2>(a, s);
        case Op::tanh_backward: return launch_map<T, TanhBackwardFn, 2>(a, s);
        case Op::clamp_backward: return launch_map<T, ClampBackwardFn, 2>(a, s);
        case Op::bce: return launch_map<T, BceFn, 2>(a, s);
        case Op::bce_backward: return launch_map<T, BceBackwardFn, 3>(a, s);
        case Op::bce_logits: return launch_map<T, BceLogitsFn, 2>(a, s);
        case Op::bce_logits_backward: return launch_map<T, BceLogitsBackwardFn, 3>(a, s);
        case Op::where:
          return launch_linear(a.out.numel, WhereBody<T>{a.out, a.in[0], a.in[1], a.in[2]}, s);
        case Op::masked_fill:
          return launch_linear(a.out.numel, MaskedFillBody<T>{a.out, a.in[0], a.in[1], convert<T>(a.scalars[0])}, s);
        case Op::rsub_scalar: return launch_scalar<T, RsubFn>(a, s);
        case Op::reciprocal: return launch_map<T, ReciprocalFn, 1>(a, s);
        case Op::abs: return launch_map<T, AbsFn, 1>(a, s);
        case Op::log1p: return launch_map<T, Log1pFn, 1>(a, s);
        case Op::expm1: return launch_map<T, Expm1Fn, 1>(a, s);
        case Op::abs_backward: return launch_map<T, AbsBackwardFn, 2>(a, s);
        case Op::logsigmoid: return launch_map<T, LogSigmoidFn, 1>(a, s);
        case Op::logsigmoid_backward: return launch_map<T, LogSigmoidBackwardFn, 2>(a, s);
        case Op::softplus: return launch_map<T, SoftplusFn, 1>(a, s);
        case Op::softplus_backward: return launch_map<T, SoftplusBackwardFn, 2>(a, s);
        case Op::maximum: return launch_map<T, MaximumFn, 2>(a, s);
        case Op::minimum: return launch_map<T, MinimumFn, 2>(a, s);
        case Op::maximum_backward: return launch_map<T, MaximumBackwardFn, 3>(a, s);
        case Op::minimum_backward: return launch_map<T, MinimumBackwardFn, 3>(a, s);
        case Op::std_backward: return launch_map<T, StdBackwardFn, 2>(a, s);
        case Op::silu: return launch_map<T, SiluFn, 1>(a, s);
        case Op::silu_backward: return launch_map<T, SiluBackwardFn, 2>(a, s);
        case Op::dropout: return launch_dropout<T>(a, s);
        case Op::masked_scale:
          return launch_linear(a.out.numel, MaskedScaleBody<T>{a.out, a.in[0], a.in[1], MaskedScaleFn(a.scalars.data())},
                               s);
        default: return cudaErrorInvalidValue;
      }
    }
  });
}

}  // namespace ampscope::cuda
