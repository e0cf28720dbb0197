// The CPU backend: memory from the C++ heap, kernels as loops over strided views, split over the cores.
#include "kernels/cpu/cpu_backend.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "core/convert.h"
#include "core/error.h"
#include "core/philox.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/half_convert.h"
#include "kernels/cpu/fused_optim.h"
#include "kernels/cpu/nn_kernels.h"
#include "kernels/parallel.h"
#include "kernels/functors.h"

namespace ampscope {
namespace {

using cpu::StridedCursor;
using cpu::binary_kernel;
using cpu::binary_scalar_kernel;
using cpu::unary_kernel;

// ---- kernels -------------------------------------------------------------------------------------

template <class T>
void fill_kernel(Backend&, const KernelArgs& a) {
  const T value = convert<T>(a.scalars[0]);
  T* out = a.out.ptr<T>();
  if (a.out.is_contiguous()) {
    cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) out[i] = value;
    });
    return;
  }
  cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    StridedCursor<1> c(a.out, {&a.out}, b);
    for (std::int64_t i = b; i < e; ++i, c.next()) out[c.offset(0)] = value;
  });
}

#if defined(__x86_64__)
bool has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
// dst[i * dst_stride + j] = src[i + j * src_stride] for i, j < 8: eight columns of the source loaded as
// rows, transposed by unpacking pairs, then quadruples, then swapping 128-bit halves.
__attribute__((target("avx2"))) void transpose_8x8_avx2(const float* src, std::int64_t src_stride, float* dst,
                                                       std::int64_t dst_stride) {
  __m256 v[8], t[8];
  for (int j = 0; j < 8; ++j) v[j] = _mm256_loadu_ps(src + j * src_stride);
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(v[j], v[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(v[j], v[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    v[j] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(1, 0, 1, 0));
    v[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], _MM_SHUFFLE(3, 2, 3, 2));
    v[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(1, 0, 1, 0));
    v[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // v[0..3] hold rows 0, 1, 2, 3 (low halves) and 4, 5, 6, 7 (high halves) of columns 0-3; v[4..7] of columns 4-7.
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(v[i], v[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(v[i], v[i + 4], 0x31));
  }
}
#else
bool has_avx2() { return false; }
void transpose_8x8_avx2(const float*, std::int64_t, float*, std::int64_t) {}
#endif

// A transposed matrix (a weight's gradient when the model uses W.t(): the gradient arrives as a
// transposed view and is made contiguous) copied row by row reads one element per cache line. Copying
// tiles keeps both sides in cache. Values move unchanged, so the bits are those of any other order.
// Taken when out is contiguous and the input's last two dimensions are a transposed dense block.
template <class To, class From>
bool copy_transposed(const KernelArgs& a) {
  constexpr std::int64_t kTile = 32;
  const TensorView& in = a.in[0];
  const int nd = a.out.ndim;
  if (nd < 2 || !a.out.is_contiguous()) return false;
  const std::int64_t rows = a.out.sizes[nd - 2], cols = a.out.sizes[nd - 1];
  const std::int64_t col_stride = in.strides[nd - 1];
  if (in.strides[nd - 2] != 1 || col_stride == 1 || rows < kTile || cols < kTile) return false;
  TensorView outer = in;  // the dimensions in front of the matrix
  outer.ndim = nd - 2;
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  const std::int64_t tasks = a.out.numel / (rows * cols) * row_tiles;
  const From* src_base = in.ptr<From>();
  To* dst_base = a.out.ptr<To>();
  cpu::parallel_for(tasks, std::max<std::int64_t>(1, cpu::kElementwiseGrain / (kTile * cols)),
                    [&](std::int64_t b, std::int64_t e) {
                      for (std::int64_t t = b; t < e; ++t) {
                        const std::int64_t m = t / row_tiles, r0 = (t % row_tiles) * kTile;
                        const std::int64_t r1 = std::min(rows, r0 + kTile);
                        const From* src = src_base + outer.offset_of(m);
                        To* dst = dst_base + m * rows * cols;
                        for (std::int64_t c0 = 0; c0 < cols; c0 += kTile) {
                          const std::int64_t c1 = std::min(cols, c0 + kTile);
                          std::int64_t r = r0;
                          if constexpr (std::is_same_v<To, float> && std::is_same_v<From, float>) {
                            // Whole 8 x 8 blocks in registers (a weight gradient's or a bias gradient's
                            // transposed rows in the transformers: 5% of the tiny GPT's step when copied one
                            // element at a time); the tile's edges below.
                            if (has_avx2()) {
                              for (; r + 8 <= r1; r += 8) {
                                std::int64_t c = c0;
                                for (; c + 8 <= c1; c += 8) transpose_8x8_avx2(src + r + c * col_stride, col_stride, dst + r * cols + c, cols);
                                for (std::int64_t i = r; i < r + 8; ++i) {
                                  for (std::int64_t cc = c; cc < c1; ++cc) dst[i * cols + cc] = src[i + cc * col_stride];
                                }
                              }
                            }
                          }
                          for (; r < r1; ++r) {
                            for (std::int64_t c = c0; c < c1; ++c) dst[r * cols + c] = convert<To>(src[r + c * col_stride]);
                          }
                        }
                      }
                    });
  return true;
}

template <class To, class From>
void copy_typed(const KernelArgs& a) {
  const From* in = a.in[0].ptr<From>();
  To* out = a.out.ptr<To>();
  if (copy_transposed<To, From>(a)) return;
  if (a.out.is_contiguous() && a.in[0].is_contiguous()) {
    cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
      // The casts autocast makes (f32 weights to f16/bf16, f16/bf16 gradients back to f32) in bulk.
      if constexpr (ampscope::detail::is_half_v<To> && std::is_same_v<From, float>) {
        cpu::narrow(in + b, out + b, e - b);
      } else if constexpr (detail::is_half_v<From> && std::is_same_v<To, float>) {
        cpu::widen(in + b, out + b, e - b);
      } else {
        for (std::int64_t i = b; i < e; ++i) out[i] = convert<To>(in[i]);
      }
    });
    return;
  }
  cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    cpu::for_each_row<2>(a.out, {&a.out, &a.in[0]}, b, e, [&](std::int64_t, std::int64_t n, const auto& off, const auto& st) {
      To* o = out + off[0];
      const From* x = in + off[1];
      for (std::int64_t j = 0; j < n; ++j) o[j * st[0]] = convert<To>(x[j * st[1]]);
    });
  });
}

template <class To>
void copy_kernel(Backend&, const KernelArgs& a) {
  visit_dtype(a.in[0].dtype, [&](auto from) { copy_typed<To, decltype(from)>(a); });
}

template <class T>
void arange_kernel(Backend&, const KernelArgs& a) {
  using Acc = std::conditional_t<std::is_same_v<T, std::int64_t>, std::int64_t, double>;
  const Acc start = static_cast<Acc>(a.scalars[0]);
  const Acc step = static_cast<Acc>(a.scalars[1]);
  T* out = a.out.ptr<T>();
  cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) out[i] = convert<T>(start + static_cast<Acc>(i) * step);
  });
}

template <class T>
void uniform_kernel(Backend&, const KernelArgs& a) {
  T* out = a.out.ptr<T>();
  cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) out[i] = uniform_at<T>(a.seed, a.offset, static_cast<std::uint64_t>(i));
  });
}

template <class T>
void normal_kernel(Backend&, const KernelArgs& a) {
  T* out = a.out.ptr<T>();
  cpu::parallel_for(a.out.numel, cpu::kElementwiseGrain, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      out[i] = convert<T>(normal_at(a.seed, a.offset, static_cast<std::uint64_t>(i)));
    }
  });
}

// ---- the backend ---------------------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    for_all_dtypes([this](auto t) {
      using T = decltype(t);
      constexpr DType D = dtype_of<T>::value;
      register_kernel(Op::fill, D, &fill_kernel<T>);
      register_kernel(Op::copy, D, &copy_kernel<T>);
      if constexpr (!std::is_same_v<T, bool>) register_kernel(Op::arange, D, &arange_kernel<T>);
    });
    for_all_dtypes([this](auto t) {
      using T = decltype(t);
      constexpr DType D = dtype_of<T>::value;
      if constexpr (is_floating(D)) {
      register_kernel(Op::uniform, D, &uniform_kernel<T>);
      register_kernel(Op::normal, D, &normal_kernel<T>);
      register_kernel(Op::add, D, &binary_kernel<T, AddFn>);
      register_kernel(Op::sub, D, &binary_kernel<T, SubFn>);
      register_kernel(Op::mul, D, &binary_kernel<T, MulFn>);
      register_kernel(Op::div, D, &binary_kernel<T, DivFn>);
      register_kernel(Op::add_scalar, D, &binary_scalar_kernel<T, AddFn>);
      register_kernel(Op::mul_scalar, D, &binary_scalar_kernel<T, MulFn>);
      register_kernel(Op::neg, D, &unary_kernel<T, NegFn>);
      register_kernel(Op::relu, D, &unary_kernel<T, ReluFn>);
      register_kernel(Op::exp, D, &unary_kernel<T, ExpFn>);
      }
    });
    cpu::register_nn_kernels([this](Op op, DType dtype, KernelFn fn) { register_kernel(op, dtype, fn); });
    // A training step allocates and frees the same large buffers (im2col columns, activations) every
    // step. glibc would map and unmap each one and the next step would page-fault it in again; keeping
    // blocks up to 1 GiB in the heap lets them be reused, as a caching allocator would.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }

  void* allocate(std::size_t nbytes) override {
    // 64-byte alignment for vector loads; at least one byte so empty tensors still own a pointer.
    const std::size_t size = ((nbytes == 0 ? 1 : nbytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size);
    if (p == nullptr) {
      throw DeviceRuntimeError(fmt::format("cpu: out of memory allocating {} bytes", nbytes));
    }
    return p;
  }
  void deallocate(void* ptr, std::size_t) noexcept override { std::free(ptr); }

  void copy_from_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  void synchronize() override {}
  void parallel_for(std::int64_t n, std::int64_t grain,
                    const std::function<void(std::int64_t, std::int64_t)>& fn) override {
    cpu::parallel_for(n, grain, fn);
  }

  // Fused optimizer steps (kernels/cpu/fused_optim.h); the rest of the fused AMP path (unscale, scale
  // update) stays unfused on the CPU, so fused_amp_available() keeps its default, false.
  bool fused_optimizer_available() const override { return cpu::fused_optim_enabled(); }
  void fused_sgd_step(const std::vector<FusedSgdTensor>& tensors, const FusedSgdOptions& options,
                      const float* found_inf) override {
    cpu::fused_sgd_step(tensors, options, found_inf);
  }
  void fused_adam_step(const std::vector<FusedAdamTensor>& tensors, const FusedAdamOptions& options,
                       const float* found_inf) override {
    cpu::fused_adam_step(tensors, options, found_inf);
  }

 private:
  template <class Fn>
  static void for_all_dtypes(Fn&& fn) {
    for (int t = 0; t < kNumDTypes; ++t) visit_dtype(static_cast<DType>(t), fn);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace ampscope
