// The CPU's col2im and max_pool2d backward (kernels/cpu/nn_kernels.cpp) sum row by row (col2im at column
// stride 1) and as a scatter over the windows (pooling). Their contract is the element-by-element definition
// in docs/numerics.md, which the CUDA kernels follow bit for bit: each input element sums, in the
// accumulation type and from zero, its terms in a fixed order (col2im: kernel rows, then kernel columns;
// pooling: windows in (oh, ow) order, those whose argmax it is), then is rounded once. That definition is
// written out here independently and compared bit for bit, for strides 1 and 2, padding, overlapping
// pooling windows, f32, f16 and f64, with NaN, infinities, signed zeros and subnormals in the inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/convert.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/functors.h"

namespace ampscope {
namespace {

struct Win {
  std::int64_t kh, kw, sh, sw, ph, pw;
};

// Random values of dtype d with edge cases planted every 23 elements.
Tensor edgy(const Shape& shape, DType d, std::uint64_t seed) {
  Generator gen(seed);
  Tensor t = randn(shape, gen).contiguous();
  float* p = static_cast<float*>(t.data());
  const float inf = std::numeric_limits<float>::infinity();
  const float cases[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e-41f, -3e38f, 3e38f};
  for (std::int64_t i = 0, c = 0; i < t.numel(); i += 23, ++c) p[i] = cases[c % 8];
  // Ties for the pooling: neighbours with equal values, and +0 beside -0.
  for (std::int64_t i = 5; i < t.numel(); i += 29) p[i] = p[i - 1];
  for (std::int64_t i = 12; i + 1 < t.numel(); i += 31) {
    p[i] = 0.0f;
    p[i + 1] = -0.0f;
  }
  return t.to(d);
}

Tensor run(Op op, DType d, const Shape& out_shape, DType out_dtype, const std::vector<Tensor>& ins, const Win& w) {
  Tensor out = Tensor::empty(out_shape, {out_dtype, Device::cpu()});
  out.fill_(77.0);  // a sentinel: an element the kernel forgets to write shows
  KernelArgs a;
  a.out = out.kernel_view();
  for (std::size_t i = 0; i < ins.size(); ++i) a.in[i] = ins[i].kernel_view();
  a.num_inputs = static_cast<int>(ins.size());
  const double s[6] = {double(w.kh), double(w.kw), double(w.sh), double(w.sw), double(w.ph), double(w.pw)};
  for (int i = 0; i < 6; ++i) a.scalars[i] = s[i];
  backend_for(Device::cpu()).run(op, d, a);
  return out;
}

// Element i of t as the accumulation type of d (float, or double for f64).
double element(const Tensor& t, std::int64_t i) { return t.to(DType::f64).data_as<double>()[i]; }

template <class Acc>
std::uint64_t stored_bits(Acc s, DType d) {
  // Rounded once to d, as the kernels store (convert<T>(canonical_nan(sum))); returned as the bits of d.
  const Acc c = canonical_nan(s);
  std::uint64_t b = 0;
  auto put = [&](auto v) { std::memcpy(&b, &v, sizeof v); };
  switch (d) {
    case DType::f16: put(convert<f16>(c)); break;
    case DType::bf16: put(convert<bf16>(c)); break;
    case DType::f32: put(static_cast<float>(c)); break;
    default: put(static_cast<double>(c)); break;
  }
  return b;
}
std::uint64_t bits_at(const Tensor& t, std::int64_t i) {
  std::uint64_t b = 0;
  const auto size = static_cast<std::size_t>(dtype_size(t.dtype()));
  std::memcpy(&b, static_cast<const char*>(t.data()) + static_cast<std::size_t>(i) * size, size);
  return b;
}

template <class Acc>
void check_col2im(DType d, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, const Win& w) {
  const std::int64_t OH = (H + 2 * w.ph - w.kh) / w.sh + 1, OW = (W + 2 * w.pw - w.kw) / w.sw + 1;
  const Tensor cols = edgy({N, C * w.kh * w.kw, OH * OW}, d, 7 + static_cast<std::uint64_t>(H * W));
  const Tensor got = run(Op::col2im, d, {N, C, H, W}, d, {cols}, w);
  const std::vector<double> cv = [&] {
    const Tensor c64 = cols.to(DType::f64);
    return std::vector<double>(c64.data_as<double>(), c64.data_as<double>() + c64.numel());
  }();
  for (std::int64_t nc = 0; nc < N * C; ++nc) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t x = 0; x < W; ++x) {
        Acc s = 0;
        for (std::int64_t ki = 0; ki < w.kh; ++ki) {
          for (std::int64_t kj = 0; kj < w.kw; ++kj) {
            const std::int64_t th = h + w.ph - ki, tw = x + w.pw - kj;
            if (th < 0 || tw < 0 || th % w.sh || tw % w.sw || th / w.sh >= OH || tw / w.sw >= OW) continue;
            s += static_cast<Acc>(cv[static_cast<std::size_t>((nc * w.kh * w.kw + ki * w.kw + kj) * OH * OW +
                                                              th / w.sh * OW + tw / w.sw)]);
          }
        }
        const std::int64_t i = nc * H * W + h * W + x;
        ASSERT_EQ(bits_at(got, i), stored_bits(s, d))
            << dtype_name(d) << " col2im k " << w.kh << "x" << w.kw << " s " << w.sh << "x" << w.sw << " p " << w.ph
            << "x" << w.pw << " at " << i << ": got " << element(got, i) << ", expected " << s;
      }
    }
  }
}

template <class Acc>
void check_pool_backward(DType d, std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, const Win& w) {
  const std::int64_t OH = (H + 2 * w.ph - w.kh) / w.sh + 1, OW = (W + 2 * w.pw - w.kw) / w.sw + 1;
  // The argmax from the forward kernel on values with ties and a NaN, then the backward.
  const Tensor x = edgy({N, C, H, W}, d, 11);
  Tensor y = Tensor::empty({N, C, OH, OW}, {d, Device::cpu()});
  Tensor index = Tensor::empty({N, C, OH, OW}, {DType::i64, Device::cpu()});
  {
    KernelArgs a;
    a.out = y.kernel_view();
    a.aux[0] = index.kernel_view();
    a.in[0] = x.kernel_view();
    a.num_inputs = 1;
    const double s[6] = {double(w.kh), double(w.kw), double(w.sh), double(w.sw), double(w.ph), double(w.pw)};
    for (int i = 0; i < 6; ++i) a.scalars[i] = s[i];
    backend_for(Device::cpu()).run(Op::max_pool2d, d, a);
  }
  // The forward pass against its definition: the first largest element of each window in row order, a
  // NaN replacing the running maximum whenever it is met; the value's bits moved.
  {
    const Tensor x64 = x.to(DType::f64);
    const double* xp = x64.data_as<double>();
    const std::int64_t* got_index = index.data_as<std::int64_t>();
    for (std::int64_t nc = 0; nc < N * C; ++nc) {
      for (std::int64_t oh = 0; oh < OH; ++oh) {
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t h0 = oh * w.sh - w.ph, w0 = ow * w.sw - w.pw;
          Acc m = -std::numeric_limits<Acc>::infinity();
          std::int64_t best = std::max<std::int64_t>(h0, 0) * W + std::max<std::int64_t>(w0, 0);
          for (std::int64_t h = std::max<std::int64_t>(h0, 0); h < std::min(h0 + w.kh, H); ++h) {
            for (std::int64_t c = std::max<std::int64_t>(w0, 0); c < std::min(w0 + w.kw, W); ++c) {
              const Acc v = static_cast<Acc>(xp[nc * H * W + h * W + c]);
              if (v > m || v != v) {
                m = v;
                best = h * W + c;
              }
            }
          }
          const std::int64_t o = nc * OH * OW + oh * OW + ow;
          ASSERT_EQ(got_index[o], best) << dtype_name(d) << " pool forward k " << w.kh << "x" << w.kw << " s " << w.sh
                                        << "x" << w.sw << " p " << w.ph << "x" << w.pw << " at " << o;
          ASSERT_EQ(bits_at(y, o), bits_at(x, nc * H * W + best)) << dtype_name(d) << " pool forward value at " << o;
        }
      }
    }
  }
  const Tensor g = edgy({N, C, OH, OW}, d, 13);
  const Tensor got = run(Op::max_pool2d_backward, d, {N, C, H, W}, d, {g, index}, w);
  const std::int64_t* ip = index.data_as<std::int64_t>();
  const Tensor g64 = g.to(DType::f64);
  const double* gp = g64.data_as<double>();
  for (std::int64_t nc = 0; nc < N * C; ++nc) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t xx = 0; xx < W; ++xx) {
        Acc s = 0;
        for (std::int64_t oh = 0; oh < OH; ++oh) {
          for (std::int64_t ow = 0; ow < OW; ++ow) {
            const bool inside = h >= oh * w.sh - w.ph && h < oh * w.sh - w.ph + w.kh && xx >= ow * w.sw - w.pw &&
                                xx < ow * w.sw - w.pw + w.kw;
            const std::int64_t o = nc * OH * OW + oh * OW + ow;
            if (inside && ip[o] == h * W + xx) s += static_cast<Acc>(gp[o]);
          }
        }
        const std::int64_t i = nc * H * W + h * W + xx;
        ASSERT_EQ(bits_at(got, i), stored_bits(s, d))
            << dtype_name(d) << " pool backward k " << w.kh << "x" << w.kw << " s " << w.sh << "x" << w.sw << " p "
            << w.ph << "x" << w.pw << " at " << i << ": got " << element(got, i) << ", expected " << s;
      }
    }
  }
}

const Win kWindows[] = {{3, 3, 1, 1, 0, 0}, {3, 2, 2, 1, 1, 0}, {2, 3, 1, 2, 0, 1}, {1, 1, 1, 1, 0, 0},
                        {5, 5, 1, 1, 2, 2}, {3, 3, 2, 2, 1, 1}, {2, 2, 1, 1, 0, 0}};

TEST(window_kernels_test, col2im_sums_each_element_kernel_rows_then_columns_and_rounds_once) {
  for (const Win& w : kWindows) {
    check_col2im<float>(DType::f32, 2, 3, 9, 11, w);
    check_col2im<float>(DType::f16, 1, 2, 7, 6, w);
    check_col2im<double>(DType::f64, 1, 2, 8, 5, w);
  }
}

TEST(window_kernels_test, max_pool2d_picks_each_windows_first_maximum_and_its_backward_sums_in_window_order) {
  // Pooling windows with padding at most half the kernel (what max_pool2d accepts); stride 1 overlaps them.
  // 2 x 2 windows inside the plane take the forward kernel's branch-free path; f32 ones of column stride 2
  // its vectorised row loop (the columns inside the plane, with padding and without, the edges window by
  // window), which the 37-column planes run in full vectors and a tail.
  const Win pools[] = {{2, 2, 2, 2, 0, 0}, {2, 2, 1, 1, 0, 0}, {3, 3, 1, 1, 1, 1}, {3, 2, 2, 2, 1, 1},
                       {3, 3, 2, 1, 0, 0}, {2, 2, 2, 2, 1, 1}, {2, 2, 1, 2, 0, 1}, {2, 2, 2, 2, 1, 0}};
  for (const Win& w : pools) {
    check_pool_backward<float>(DType::f32, 2, 3, 9, 10, w);
    check_pool_backward<float>(DType::f32, 2, 2, 7, 37, w);
    check_pool_backward<float>(DType::f32, 1, 1, 4, 36, w);
    check_pool_backward<float>(DType::bf16, 1, 2, 7, 6, w);
    check_pool_backward<double>(DType::f64, 1, 2, 8, 8, w);
  }
}

}  // namespace
}  // namespace ampscope
