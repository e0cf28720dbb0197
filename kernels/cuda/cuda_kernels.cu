// CUDA kernels for the element-wise ops, through the same functors and conversions as the CPU backend.
// Two sections: kernels (one generic grid-stride kernel and the per-op bodies it runs), then launchers.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/convert.h"
#include "core/philox.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/functors.h"

namespace ampscope::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------------------

// One generic element-wise kernel: a grid-stride loop calling body(i) for every linear index. Bodies
// index through TensorView::offset_of, so any strided or broadcast input works unchanged.
template <class Body>
__global__ void linear_kernel(std::int64_t n, Body body) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) body(i);
}

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

template <class T, class Fn>
struct UnaryBody {
  TensorView out, in;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    out.ptr<T>()[i] = convert<T>(Fn{}(convert<Acc>(in.ptr<T>()[in.offset_of(i)])));
  }
};

template <class T, class Fn>
struct BinaryBody {
  TensorView out, a, b;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    out.ptr<T>()[i] =
        convert<T>(Fn{}(convert<Acc>(a.ptr<T>()[a.offset_of(i)]), convert<Acc>(b.ptr<T>()[b.offset_of(i)])));
  }
};

template <class T, class Fn>
struct BinaryScalarBody {
  TensorView out, a;
  acc_type<T> scalar;
  __device__ void operator()(std::int64_t i) const {
    using Acc = acc_type<T>;
    out.ptr<T>()[i] = convert<T>(Fn{}(convert<Acc>(a.ptr<T>()[a.offset_of(i)]), scalar));
  }
};

// ---- launchers -----------------------------------------------------------------------------------

template <class Body>
cudaError_t launch_linear(std::int64_t n, const Body& body, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest.
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 4096);
  linear_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, body);
  return cudaGetLastError();
}

template <class T>
constexpr bool is_float_like() {
  return std::is_floating_point_v<T> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
}

template <class T, class Fn>
cudaError_t launch_unary_typed(const KernelArgs& a, cudaStream_t s) {
  return launch_linear(a.out.numel, UnaryBody<T, Fn>{a.out, a.in[0]}, s);
}
template <class T, class Fn>
cudaError_t launch_binary_typed(const KernelArgs& a, cudaStream_t s) {
  return launch_linear(a.out.numel, BinaryBody<T, Fn>{a.out, a.in[0], a.in[1]}, s);
}
template <class T, class Fn>
cudaError_t launch_binary_scalar_typed(const KernelArgs& a, cudaStream_t s) {
  return launch_linear(a.out.numel,
                       BinaryScalarBody<T, Fn>{a.out, a.in[0], static_cast<acc_type<T>>(a.scalars[0])}, s);
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

cudaError_t launch_elementwise(Op op, const KernelArgs& a, cudaStream_t s) {
  return visit_dtype(a.out.dtype, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    if constexpr (!is_float_like<T>()) {
      return cudaErrorInvalidValue;  // never registered for non-floating dtypes
    } else {
      switch (op) {
        case Op::add: return launch_binary_typed<T, AddFn>(a, s);
        case Op::sub: return launch_binary_typed<T, SubFn>(a, s);
        case Op::mul: return launch_binary_typed<T, MulFn>(a, s);
        case Op::div: return launch_binary_typed<T, DivFn>(a, s);
        case Op::add_scalar: return launch_binary_scalar_typed<T, AddFn>(a, s);
        case Op::mul_scalar: return launch_binary_scalar_typed<T, MulFn>(a, s);
        case Op::neg: return launch_unary_typed<T, NegFn>(a, s);
        case Op::relu: return launch_unary_typed<T, ReluFn>(a, s);
        case Op::exp: return launch_unary_typed<T, ExpFn>(a, s);
        default: return cudaErrorInvalidValue;
      }
    }
  });
}

}  // namespace ampscope::cuda
