// The CPU backend's dispatch table and its strided loops, which every other op builds on.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/functors.h"

namespace ampscope {
namespace {

TEST(cpu_backend_test, says_which_op_and_dtype_pairs_it_supports) {
  const Backend& cpu = backend_for(Device::cpu());
  EXPECT_EQ(cpu.name(), "cpu");
  for (int t = 0; t < kNumDTypes; ++t) {
    const DType d = static_cast<DType>(t);
    EXPECT_TRUE(cpu.supports(Op::fill, d)) << dtype_name(d);
    EXPECT_TRUE(cpu.supports(Op::copy, d)) << dtype_name(d);
    EXPECT_EQ(cpu.supports(Op::add, d), is_floating(d)) << dtype_name(d);
    EXPECT_EQ(cpu.supports(Op::normal, d), is_floating(d)) << dtype_name(d);
  }
  EXPECT_FALSE(cpu.supports(Op::arange, DType::boolean));
}

TEST(cpu_backend_test, refuses_a_missing_kernel_with_op_dtype_and_backend_named) {
  Backend& cpu = backend_for(Device::cpu());
  const Tensor out = Tensor::empty({2}, {DType::boolean});
  KernelArgs args;
  args.out = out.kernel_view();
  try {
    cpu.run(Op::relu, DType::boolean, args);
    FAIL() << "expected UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "op 'relu' has no bool kernel on backend 'cpu'");
  }
}

// A permuted, sliced 3-d view large enough to be split over threads: every element must land where
// plain index arithmetic says, whichever chunk (and so whichever starting point of the cursor) it is in.
TEST(cpu_backend_test, strided_copy_matches_index_arithmetic_across_parallel_chunks) {
  const std::int64_t a = 37, b = 53, c = 61;  // primes, so chunk boundaries fall mid-row
  const Tensor base = arange(static_cast<double>(a * b * c), {DType::f64}).reshape({a, b, c});
  const Tensor view = base.permute({2, 0, 1}).slice(1, 1, a, 2);  // [c, (a-1)/2, b]
  const Tensor dense = view.contiguous();
  ASSERT_FALSE(view.is_contiguous());
  ASSERT_TRUE(dense.is_contiguous());
  const std::vector<double> got = dense.values();
  std::int64_t n = 0, wrong = 0;
  for (std::int64_t k = 0; k < c; ++k) {
    for (std::int64_t i = 1; i < a; i += 2) {
      for (std::int64_t j = 0; j < b; ++j, ++n) {
        const double expected = static_cast<double>((i * b + j) * c + k);
        if (got[n] != expected && wrong++ < 5) ADD_FAILURE() << "element " << n << ": " << got[n] << " != " << expected;
      }
    }
  }
  EXPECT_EQ(n, dense.numel());
  EXPECT_EQ(wrong, 0);
}

// A transposed f32 matrix made contiguous goes through 8 x 8 register blocks (kernels/cpu/cpu_backend.cpp,
// copy_transposed) with scalar edges: sizes that are not multiples of 8 or of the 32-element tiles, a batch
// dimension in front, and a source whose column stride is larger than its row count (a slice): every
// element must land where index arithmetic says, and keep its bits (NaN payloads, -0, subnormals included).
TEST(cpu_backend_test, transposed_f32_copy_moves_every_element_and_its_bits) {
  const std::int64_t batch = 3, rows = 77, cols = 45, pitch = 83;  // source [batch, cols, pitch], rows of it used
  std::vector<float> src(static_cast<std::size_t>(batch * cols * pitch));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f - 1000.0f;
  const std::uint32_t specials[] = {0x7FC01234u, 0x80000000u, 0x00000001u, 0xFF800000u};
  for (std::size_t s = 0; s < 4; ++s) std::memcpy(&src[s * 997 + 5], &specials[s], 4);
  Tensor base = Tensor::empty({batch, cols, pitch}, {DType::f32});
  std::memcpy(base.data(), src.data(), src.size() * sizeof(float));
  const Tensor view = base.slice(2, 0, rows).transpose(1, 2);  // [batch, rows, cols], strides (cols * pitch, 1, pitch)
  const Tensor dense = view.contiguous();
  ASSERT_TRUE(dense.is_contiguous());
  const auto* got = static_cast<const std::uint32_t*>(dense.data());
  std::int64_t wrong = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        std::uint32_t expected;
        std::memcpy(&expected, &src[static_cast<std::size_t>((b * cols + c) * pitch + r)], 4);
        const std::uint32_t value = got[(b * rows + r) * cols + c];
        if (value != expected && wrong++ < 5) {
          ADD_FAILURE() << "element [" << b << ", " << r << ", " << c << "]: bits " << std::hex << value << " != " << expected;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// im2col moves values: cols[n, (c * KH + ki) * KW + kj, oh * OW + ow] is x[n, c, oh * sh - ph + ki, ow * sw - pw + kj]
// where that lies inside the image, else 0 (the definition in core/backend.h, written out here as index
// arithmetic). Windows of every stride, padding and kernel size the kernel's row-wise copy treats apart: padding
// wider than a stride, a kernel as wide as the padded image, stride larger than the kernel, f32 and f16, and
// enough planes to be split over threads.
TEST(cpu_backend_test, im2col_places_every_element_where_index_arithmetic_says) {
  struct Case {
    std::int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
  };
  const Case cases[] = {{2, 3, 7, 9, 3, 3, 1, 1, 1, 1}, {1, 2, 5, 6, 2, 3, 2, 3, 1, 2}, {1, 1, 4, 4, 4, 4, 1, 1, 0, 0},
                        {1, 2, 6, 5, 1, 1, 3, 2, 0, 0}, {2, 1, 5, 5, 3, 5, 1, 1, 2, 2}, {1, 1, 3, 8, 2, 2, 1, 4, 1, 1},
                        {40, 16, 14, 14, 3, 3, 1, 1, 1, 1}};
  for (const DType dtype : {DType::f32, DType::f16}) {
    for (const Case& k : cases) {
      const std::int64_t oh = (k.h + 2 * k.ph - k.kh) / k.sh + 1, ow = (k.w + 2 * k.pw - k.kw) / k.sw + 1;
      // Values 1..2000 are exact in f16; none is 0, so a zero in cols is padding.
      std::vector<double> values(static_cast<std::size_t>(k.n * k.c * k.h * k.w));
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = 1.0 + static_cast<double>(i % 2000);
      const Tensor xs = from_values(values, {k.n, k.c, k.h, k.w}, {dtype});
      Tensor cols = Tensor::empty({k.n, k.c * k.kh * k.kw, oh * ow}, {dtype});
      run_kernel_general("im2col test", Op::im2col, {cols}, {xs},
                         {static_cast<double>(k.kh), static_cast<double>(k.kw), static_cast<double>(k.sh),
                          static_cast<double>(k.sw), static_cast<double>(k.ph), static_cast<double>(k.pw)});
      const std::vector<double> xv = xs.values(), got = cols.values();
      std::int64_t wrong = 0;
      for (std::int64_t n = 0; n < k.n; ++n) {
        for (std::int64_t c = 0; c < k.c; ++c) {
          for (std::int64_t ki = 0; ki < k.kh; ++ki) {
            for (std::int64_t kj = 0; kj < k.kw; ++kj) {
              for (std::int64_t i = 0; i < oh; ++i) {
                for (std::int64_t j = 0; j < ow; ++j) {
                  const std::int64_t r = i * k.sh - k.ph + ki, s = j * k.sw - k.pw + kj;
                  const double expected =
                      r < 0 || r >= k.h || s < 0 || s >= k.w ? 0.0 : xv[static_cast<std::size_t>(((n * k.c + c) * k.h + r) * k.w + s)];
                  const auto at = static_cast<std::size_t>(((n * k.c + c) * k.kh * k.kw + ki * k.kw + kj) * oh * ow + i * ow + j);
                  if (got[at] != expected && wrong++ < 5) {
                    ADD_FAILURE() << dtype_name(dtype) << " case " << k.h << "x" << k.w << " kernel " << k.kh << "x" << k.kw
                                  << " stride " << k.sh << "," << k.sw << " pad " << k.ph << "," << k.pw << ": cols at "
                                  << at << " is " << got[at] << ", expected " << expected;
                  }
                }
              }
            }
          }
        }
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// A convolution's weight gradient sums every image's product in one float accumulator; its sgemm calls are
// cut into blocks of output columns (kernels/cpu/nn_kernels.cpp, for_column_blocks). These shapes give 4
// uneven blocks (270 columns: 67, 68, 67, 68) with 16 x 1024 multiply-adds per column, and one where each
// call falls below OpenBLAS's small-matrix size (3 x 18 columns, 1 block): every element must be its f64
// sum of products within the float dot product's error bound, gamma_k * sum |terms|, at f32 and f64.
TEST(cpu_backend_test, conv2d_weight_gradient_in_column_blocks_is_the_f64_sum_over_the_batch) {
  struct Case { std::int64_t n, c, o, h, k; DType dtype; };
  for (const Case& cs : {Case{2, 30, 16, 34, 3, DType::f32}, Case{2, 30, 16, 34, 3, DType::f64},
                         Case{3, 2, 3, 7, 3, DType::f32}}) {
    Generator gen(11);
    const std::int64_t oh = cs.h - cs.k + 1;
    const Tensor x = randn({cs.n, cs.c, cs.h, cs.h}, gen).to(cs.dtype);
    Tensor w = randn({cs.o, cs.c, cs.k, cs.k}, gen).to(cs.dtype);
    w.requires_grad_();
    const Tensor g = randn({cs.n, cs.o, oh, oh}, gen).to(cs.dtype);
    conv2d(x, w).backward(g);
    ASSERT_TRUE(w.grad().defined());
    const std::vector<double> xv = x.values(), gv = g.values(), got = w.grad().values();
    const double unit = cs.dtype == DType::f64 ? 0x1p-53 : 0x1p-24;
    const double terms = static_cast<double>(cs.n * oh * oh);
    for (std::int64_t o = 0; o < cs.o; ++o) {
      for (std::int64_t c = 0; c < cs.c; ++c) {
        for (std::int64_t ki = 0; ki < cs.k; ++ki) {
          for (std::int64_t kj = 0; kj < cs.k; ++kj) {
            double ref = 0, mag = 0;
            for (std::int64_t n = 0; n < cs.n; ++n) {
              for (std::int64_t i = 0; i < oh; ++i) {
                for (std::int64_t j = 0; j < oh; ++j) {
                  const double t = gv[((n * cs.o + o) * oh + i) * oh + j] * xv[((n * cs.c + c) * cs.h + i + ki) * cs.h + j + kj];
                  ref += t;
                  mag += std::fabs(t);
                }
              }
            }
            const std::int64_t at = ((o * cs.c + c) * cs.k + ki) * cs.k + kj;
            // gamma_k = k u / (1 - k u), plus the final rounding to the dtype.
            const double bound = terms * unit / (1 - terms * unit) * mag + unit * std::fabs(ref);
            ASSERT_NEAR(got[at], ref, bound) << dtype_name(cs.dtype) << " c " << cs.c << " element " << at;
          }
        }
      }
    }
  }
}

// A convolution's input gradient runs on the CPU a few images at a time (column gradient, then col2im:
// core/ops.cpp, input_grad_chunk): these shapes have 8 x 3 x 3 x 48 x 48 column entries an image (663 KB in
// f32, 1.3 MB in f64), so the batch of 9 runs as images [0, 4) and [4, 9) in f32, [0, 2), [2, 4), [4, 6)
// and [6, 9) in f64. Every element of dx, in every
// image, must be its f64 sum of products within the float (double) error bound of the product's O terms and
// col2im's 9, with padding 1 at the borders; an image the chunks skip, or one read from another image's
// columns, is far outside it.
TEST(cpu_backend_test, conv2d_input_gradient_in_chunks_of_images_is_the_f64_sum) {
  for (const DType dtype : {DType::f32, DType::f64}) {
    const std::int64_t n = 9, c = 8, o = 4, h = 48, k = 3;  // padding 1: the output is h x h too
    Generator gen(23);
    Tensor x = randn({n, c, h, h}, gen).to(dtype);
    x.requires_grad_();
    const Tensor w = randn({o, c, k, k}, gen).to(dtype);
    const Tensor g = randn({n, o, h, h}, gen).to(dtype);
    Conv2dOptions opt;
    opt.padding_h = opt.padding_w = 1;
    conv2d(x, w, Tensor(), opt).backward(g);
    ASSERT_TRUE(x.grad().defined());
    const std::vector<double> wv = w.values(), gv = g.values(), got = x.grad().values();
    const double unit = dtype == DType::f64 ? 0x1p-53 : 0x1p-24;
    const double terms = static_cast<double>(o + k * k);
    std::int64_t checked = 0;
    for (std::int64_t b = 0; b < n; ++b) {
      for (std::int64_t ci = 0; ci < c; ++ci) {
        for (std::int64_t y = 0; y < h; ++y) {
          for (std::int64_t xx = 0; xx < h; ++xx) {
            double ref = 0, mag = 0;
            for (std::int64_t oi = 0; oi < o; ++oi) {
              for (std::int64_t ki = 0; ki < k; ++ki) {
                for (std::int64_t kj = 0; kj < k; ++kj) {
                  const std::int64_t oy = y + 1 - ki, ox = xx + 1 - kj;  // output position reading x[y][xx]
                  if (oy < 0 || oy >= h || ox < 0 || ox >= h) continue;
                  const double t = gv[((b * o + oi) * h + oy) * h + ox] * wv[((oi * c + ci) * k + ki) * k + kj];
                  ref += t;
                  mag += std::fabs(t);
                }
              }
            }
            const std::int64_t at = ((b * c + ci) * h + y) * h + xx;
            const double bound = terms * unit / (1 - terms * unit) * mag + unit * std::fabs(ref);
            ASSERT_NEAR(got[at], ref, bound) << dtype_name(dtype) << " image " << b << " element " << at;
            ++checked;
          }
        }
      }
    }
    EXPECT_EQ(checked, n * c * h * h);
  }
}

TEST(cpu_backend_test, binary_op_reads_broadcast_inputs_through_zero_strides) {
  // [3, 1] + [1, 4] with both inputs transposed views: out[i][j] = x[i] + 10 * y[j].
  const Tensor x = from_values({1, 2, 3}, {1, 3}).transpose(0, 1);          // [3, 1]
  const Tensor y = from_values({10, 20, 30, 40}, {4, 1}).transpose(0, 1);   // [1, 4]
  const std::vector<double> got = add(x, y).values();
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], (i + 1) + 10.0 * (j + 1));
  }
}

TEST(cpu_backend_test, relu_functor_lets_nan_through_and_zeroes_negatives) {
  const ReluFn relu;
  EXPECT_TRUE(std::isnan(relu(std::nanf(""))));
  EXPECT_EQ(relu(-3.0f), 0.0f);
  EXPECT_EQ(relu(2.5f), 2.5f);
  EXPECT_EQ(relu(-INFINITY), 0.0f);
  EXPECT_EQ(relu(INFINITY), INFINITY);
}

}  // namespace
}  // namespace ampscope
