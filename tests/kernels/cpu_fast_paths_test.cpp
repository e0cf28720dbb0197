// The CPU backend's fast paths that must give the bits of the code they replace (issue 37):
// - softmax and log_softmax over rows, forward and backward, with each exp computed once and a row's exps
//   together (kernels/cpu/nn_kernels.cpp; kernels/cpu/exp_kernels.h's vector expf) against the shared row
//   functions softmax_row and softmax_backward_row run by a SerialRow (kernels/row_functors.h), which the
//   backend called before, on f32, f64, f16 and bf16, rows of many lengths and rows with NaN, infinities and
//   huge values, enough rows that the pool splits them;
// - masked_fill with a mask repeating one dense block (a causal mask broadcast over batch and heads)
//   against plain index arithmetic, and the masks that must take the general path (a mask broadcast in
//   a middle dimension, a transposed mask, a strided input);
// - sums over dims whose rows are not contiguous, read in place (kernels/cpu/nn_kernels.cpp,
//   sum_strided_rows: a convolution's bias gradient, column sums) against the same sums of the
//   permuted copy's contiguous rows, which the backend summed before;
// - a product's epilogue, which leaves blocks without a bias or a NaN as they are: every NaN canonical;
// - gelu's tanh form on f32, whose forward stores each tanh for its backward (core/ops.cpp), against
//   GeluFn and GeluBackwardFn element by element, through autograd, on a contiguous and a transposed input.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/convert.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/functors.h"
#include "kernels/row_functors.h"

namespace ampscope {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row r of the test matrix: deterministic values over a range wide enough to give exps from 1 down to
// underflow, with special rows planted.
std::vector<double> row_values(std::int64_t r, std::int64_t cols) {
  std::vector<double> v(static_cast<std::size_t>(cols));
  std::uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 1);
  for (auto& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = (static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5) * (r % 4 == 0 ? 60.0 : 8.0);
  }
  if (cols > 2) {
    switch (r % 9) {
      case 1: v[1] = std::numeric_limits<double>::quiet_NaN(); break;
      case 2: v[cols / 2] = kInf; break;
      case 3: for (auto& x : v) x = -kInf; break;  // a fully masked row: every output NaN
      case 4: v[0] = -kInf; v[cols - 1] = -kInf; break;
      case 5: v[2] = 1e30; break;  // beyond f16's range: the stored value is inf there
      case 6:  // the maximum a zero of each sign (which compare equal), the rest far below
        for (auto& x : v) x = -200.0;
        v[cols / 3] = -0.0;
        v[cols - 1] = 0.0;
        break;
      default: break;
    }
  }
  return v;
}

template <class T>
std::uint64_t bits_of(T v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

// softmax and log_softmax forward and backward (y.backward(g)) through the CPU backend against the shared row
// functions run serially, which the backend called before; g: other deterministic values, with a NaN and an
// infinity planted in some rows.
template <class T>
void check_softmax_rows_bits(DType dtype) {
  for (std::int64_t cols : {1, 2, 7, 15, 16, 17, 31, 32, 33, 64, 100, 257, 1000}) {
    // At least 3 x 16384 elements so that the rows are split over the pool's threads.
    const std::int64_t rows = std::max<std::int64_t>(45, 3 * 16384 / cols + 5);
    std::vector<double> all, grads;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::vector<double> v = row_values(r, cols);
      all.insert(all.end(), v.begin(), v.end());
      std::vector<double> gv = row_values(r + 7 * rows, cols);
      if (r % 9 == 3) gv = row_values(r + 1, cols);  // no -inf rows in g: a NaN row there says nothing new
      grads.insert(grads.end(), gv.begin(), gv.end());
    }
    const Tensor g = from_values(grads, {rows, cols}, {dtype});
    const T* gs = g.contiguous().data_as<T>();
    for (const bool log : {false, true}) {
      const Tensor x = from_values(all, {rows, cols}, {dtype}).requires_grad_();
      const Tensor y = log ? log_softmax(x, 1) : softmax(x, 1);
      ASSERT_EQ(y.dtype(), dtype);
      y.backward(g);
      ASSERT_TRUE(x.grad().defined());
      const T* xs = x.contiguous().data_as<T>();
      const T* ys = y.contiguous().data_as<T>();
      const T* ds = x.grad().contiguous().data_as<T>();
      std::vector<T> expected(static_cast<std::size_t>(cols)), expected_dx(static_cast<std::size_t>(cols));
      const char* what = log ? "log_softmax" : "softmax";
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t o = r * cols;
        if (log) {
          softmax_row<true>(SerialRow{}, xs + o, expected.data(), cols);
          softmax_backward_row<true>(SerialRow{}, gs + o, ys + o, expected_dx.data(), cols);
        } else {
          softmax_row<false>(SerialRow{}, xs + o, expected.data(), cols);
          softmax_backward_row<false>(SerialRow{}, gs + o, ys + o, expected_dx.data(), cols);
        }
        for (std::int64_t j = 0; j < cols; ++j) {
          ASSERT_EQ(bits_of(ys[o + j]), bits_of(expected[static_cast<std::size_t>(j)]))
              << what << " " << dtype_name(dtype) << " cols " << cols << " row " << r << " element " << j;
          ASSERT_EQ(bits_of(ds[o + j]), bits_of(expected_dx[static_cast<std::size_t>(j)]))
              << what << " backward " << dtype_name(dtype) << " cols " << cols << " row " << r << " element " << j;
        }
      }
    }
  }
}

TEST(cpu_fast_paths, softmax_rows_give_the_shared_row_functions_bits) {
  check_softmax_rows_bits<float>(DType::f32);
  check_softmax_rows_bits<double>(DType::f64);
  check_softmax_rows_bits<f16>(DType::f16);
  check_softmax_rows_bits<bf16>(DType::bf16);
}

// masked_fill(x, mask, value) against out[i] = mask[index of i in the mask's shape] ? value : x[i].
void check_masked_fill(const Tensor& x, const Tensor& mask_small, const std::string& what) {
  const Tensor out = masked_fill(x, mask_small, -1e9);
  const std::vector<double> xs = x.values(), got = out.values(), ms = mask_small.values();
  const Shape& shape = x.shape();
  const Shape& mshape = mask_small.shape();
  ASSERT_EQ(got.size(), xs.size());
  const double fill = from_values({-1e9}, {1}, {x.dtype()}).item();
  const std::size_t nd = shape.size(), md = mshape.size();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    // The mask's element for x's index i: x's trailing dimensions, size-1 mask dimensions at 0.
    std::size_t rest = i, moff = 0, mstride = 1;
    for (std::size_t k = 0; k < nd; ++k) {
      const std::size_t d = nd - 1 - k;
      const auto idx = static_cast<std::size_t>(rest % static_cast<std::size_t>(shape[d]));
      rest /= static_cast<std::size_t>(shape[d]);
      if (k < md) {
        const auto msize = static_cast<std::size_t>(mshape[md - 1 - k]);
        moff += (msize == 1 ? 0 : idx) * mstride;
        mstride *= msize;
      }
    }
    const double expected = ms[moff] != 0 ? fill : xs[i];
    ASSERT_EQ(bits_of(got[i]), bits_of(expected)) << what << " element " << i;
  }
}

TEST(cpu_fast_paths, masked_fill_with_a_broadcast_mask_matches_index_arithmetic) {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    const std::string dn(dtype_name(d));
    // [B, H, T, T] with T = 37, so that the parallel chunks start inside a mask block.
    const std::int64_t b = 6, h = 5, t = 37;
    std::vector<double> xv(static_cast<std::size_t>(b * h * t * t));
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37 * static_cast<double>(i)) * 3;
    const Tensor x = from_values(xv, {b, h, t, t}, {d});
    std::vector<double> causal(static_cast<std::size_t>(t * t)), odd(static_cast<std::size_t>(t * t));
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t j = 0; j < t; ++j) {
        causal[static_cast<std::size_t>(i * t + j)] = j > i ? 1 : 0;
        odd[static_cast<std::size_t>(i * t + j)] = (i * 7 + j * 3) % 5 == 0 ? 1 : 0;
      }
    }
    const Tensor causal_mask = from_values(causal, {t, t}, {DType::boolean});
    check_masked_fill(x, causal_mask, dn + " causal [T, T]");
    check_masked_fill(x, from_values(odd, {t, t}, {DType::boolean}), dn + " irregular [T, T]");
    check_masked_fill(x, causal_mask.reshape({1, 1, t, t}), dn + " causal [1, 1, T, T]");
    // A mask per head broadcast over the batch: [H, T, T] repeats one block of H * T * T.
    std::vector<double> per_head(static_cast<std::size_t>(h * t * t));
    for (std::size_t i = 0; i < per_head.size(); ++i) per_head[i] = (i * 11) % 7 < 3 ? 1 : 0;
    check_masked_fill(x, from_values(per_head, {h, t, t}, {DType::boolean}), dn + " per head [H, T, T]");
    // A mask over the batch broadcast over heads: a stride-0 dimension inside, so the general path.
    std::vector<double> per_batch(static_cast<std::size_t>(b * t * t));
    for (std::size_t i = 0; i < per_batch.size(); ++i) per_batch[i] = (i * 5) % 3 == 0 ? 1 : 0;
    check_masked_fill(x, from_values(per_batch, {b, 1, t, t}, {DType::boolean}), dn + " per batch [B, 1, T, T]");
    // A mask over the last dimension only, and a full mask of x's shape.
    std::vector<double> last(static_cast<std::size_t>(t));
    for (std::int64_t j = 0; j < t; ++j) last[static_cast<std::size_t>(j)] = j % 4 == 1 ? 1 : 0;
    check_masked_fill(x, from_values(last, {t}, {DType::boolean}), dn + " last dimension [T]");
    std::vector<double> full(xv.size());
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = (i * 13) % 11 < 4 ? 1 : 0;
    check_masked_fill(x, from_values(full, {b, h, t, t}, {DType::boolean}), dn + " full");
    // A transposed input (not contiguous: the general path), against the same arithmetic on its values.
    const Tensor xt = x.transpose(2, 3);
    ASSERT_FALSE(xt.is_contiguous());
    check_masked_fill(xt, causal_mask, dn + " transposed input");
    // A transposed mask block (its block is not dense in row-major order: the general path).
    const Tensor mt = causal_mask.transpose(0, 1);
    ASSERT_FALSE(mt.is_contiguous());
    check_masked_fill(x, mt, dn + " transposed mask");
  }
}

// Values whose sums round differently in another order: many magnitudes, both signs, a NaN and an inf
// in some of them (planted where `specials`).
Tensor wide_values(const Shape& shape, DType dtype, std::uint64_t seed, bool specials) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<std::size_t>(n));
  std::uint64_t state = seed;
  for (auto& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = (static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5) * std::ldexp(1.0, static_cast<int>(state % 13));
  }
  if (specials && n > 1000) {
    v[37] = std::numeric_limits<double>::quiet_NaN();
    v[n - 500] = kInf;
  }
  return from_values(v, shape).to(dtype);
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data());
  return std::vector<unsigned char>(p, p + c.numel() * static_cast<std::int64_t>(dtype_size(c.dtype())));
}

TEST(cpu_fast_paths, sums_over_strided_rows_give_the_bits_of_the_contiguous_copy) {
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    // A convolution's bias gradient: sum over N, H, W of [N, C, H, W], rows of H * W elements (676 and
    // 576, and 5 x 7 = 35: runs that start at every lane), enough channels that the pool splits them.
    for (const Shape& shape : {Shape{64, 32, 26, 26}, Shape{16, 64, 24, 24}, Shape{9, 40, 5, 7}}) {
      const Tensor x = wide_values(shape, dtype, 7 + shape[3], shape[3] == 26);
      const Tensor copy = x.permute({1, 0, 2, 3}).contiguous().reshape({shape[1], shape[0] * shape[2] * shape[3]});
      EXPECT_EQ(bytes_of(sum(x, {0, 2, 3})), bytes_of(sum(copy, {1}))) << dtype_name(dtype) << " " << shape_str(shape);
      EXPECT_EQ(bytes_of(mean(x, {0, 2, 3})), bytes_of(mean(copy, {1}))) << dtype_name(dtype) << " " << shape_str(shape);
    }
    // Column sums (a linear layer's bias gradient): 200 columns (blocks of 64 and a last one of 8), 1000
    // and 31 rows; and [B, T, O] over B and T, the rows of both dims in one run.
    for (const Shape& shape : {Shape{1000, 200}, Shape{31, 70}, Shape{1, 300}}) {
      const Tensor g = wide_values(shape, dtype, 3 + shape[0], shape[0] == 1000);
      EXPECT_EQ(bytes_of(sum(g, {0})), bytes_of(sum(g.transpose(0, 1).contiguous(), {1})))
          << dtype_name(dtype) << " " << shape_str(shape);
    }
    const Tensor g3 = wide_values({4, 50, 96}, dtype, 99, true);
    EXPECT_EQ(bytes_of(sum(g3, {0, 1})), bytes_of(sum(g3.reshape({200, 96}).transpose(0, 1).contiguous(), {1})))
        << dtype_name(dtype);
    // A view that is neither (the reduced dim strided, two kept dims): as_rows' copy, the same sums.
    const Tensor t = wide_values({30, 20, 10}, dtype, 5, false).permute({2, 0, 1});  // [10, 30, 20]
    EXPECT_EQ(bytes_of(sum(t, {1})), bytes_of(sum(t.permute({0, 2, 1}).contiguous(), {2}))) << dtype_name(dtype);
  }
}

TEST(cpu_fast_paths, gelu_tanh_backward_from_the_stored_tanh_gives_the_functors_bits) {
  const double mode = 1;
  const GeluFn fwd(&mode);
  const GeluBackwardFn bwd(&mode);
  for (const bool transposed : {false, true}) {
    // 37 x 1031 values over GELU's range, with NaN and infinities; transposed: a strided view of them.
    Tensor x = wide_values({37, 1031}, DType::f32, 77, true);
    if (transposed) x = x.transpose(0, 1);
    x.requires_grad_();
    const Tensor g = wide_values(x.shape(), DType::f32, 78, false);
    const Tensor y = gelu(x, GeluApproximation::tanh);
    y.backward(g);
    ASSERT_TRUE(x.grad().defined());
    const std::vector<double> xv = x.values(), gv = g.values(), yv = y.values(), dv = x.grad().values();
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const float xf = static_cast<float>(xv[i]), gf = static_cast<float>(gv[i]);
      ASSERT_EQ(bits_of(static_cast<float>(yv[i])), bits_of(fwd(xf))) << "forward at " << i << ", x = " << xf;
      ASSERT_EQ(bits_of(static_cast<float>(dv[i])), bits_of(bwd(gf, xf)))
          << "backward at " << i << ", x = " << xf << ", g = " << gf << (transposed ? " (transposed)" : "");
    }
  }
}

// A product's epilogue skips a block without a bias whose sums hold no NaN (kernels/cpu/nn_kernels.cpp,
// round_product): a NaN anywhere in a block, from a NaN operand (0x7FC00000 in f32) or from inf * 0 (x86's
// default NaN, 0xFFC00000), must still come out as the canonical 0x7FFFFFFF (docs/numerics.md), at every
// position of a block (the vector scan's lanes and its scalar tail), for f32 and f64, a single product
// (row blocks) and a batched one; every other element the sum (finite or infinite).
TEST(cpu_fast_paths, products_without_a_bias_still_canonicalise_every_nan) {
  for (const DType d : {DType::f32, DType::f64}) {
    for (const std::int64_t batches : {1, 3}) {
      const std::int64_t m = 300, k = 33, n = 37;  // 300 x 37 outputs: several row blocks, odd widths
      std::vector<double> av(static_cast<std::size_t>(batches * m * k)), bv(static_cast<std::size_t>(batches * k * n));
      for (std::size_t i = 0; i < av.size(); ++i) av[i] = static_cast<double>(static_cast<int>(i % 7) - 3);
      for (std::size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<double>(static_cast<int>(i % 5) - 2) * 0.5;
      // One NaN row a batch, at a row that moves, so the NaN falls at different offsets of the blocks; and
      // an inf in B's column 9 of the last batch: NaN where it meets a zero of A (all of that batch's row 0),
      // inf elsewhere. The reference: the same sums in double (small integers and halves: exact).
      for (std::int64_t b = 0; b < batches; ++b) {
        const std::int64_t r = (37 + 101 * b) % m;
        av[static_cast<std::size_t>((b * m + r) * k + 5)] = std::numeric_limits<double>::quiet_NaN();
      }
      const std::int64_t lb = batches - 1;
      for (std::int64_t p = 0; p < k; ++p) av[static_cast<std::size_t>((lb * m) * k + p)] = 0.0;
      bv[static_cast<std::size_t>((lb * k + 3) * n + 9)] = kInf;
      Tensor a = from_values(av, {batches, m, k}, {d}), bmat = from_values(bv, {batches, k, n}, {d});
      const Tensor y = batches == 1 ? matmul(a.reshape({m, k}), bmat.reshape({k, n})).reshape({1, m, n}) : bmm(a, bmat);
      const std::vector<double> got = y.values();
      const Tensor yc = y.contiguous();
      for (std::int64_t b = 0; b < batches; ++b) {
        for (std::int64_t r = 0; r < m; ++r) {
          for (std::int64_t c = 0; c < n; ++c) {
            const std::size_t i = static_cast<std::size_t>((b * m + r) * n + c);
            double ref = 0;
            for (std::int64_t p = 0; p < k; ++p) {
              ref += av[static_cast<std::size_t>((b * m + r) * k + p)] * bv[static_cast<std::size_t>((b * k + p) * n + c)];
            }
            if (std::isnan(ref)) {
              if (d == DType::f32) {
                ASSERT_EQ(bits_of(yc.data_as<float>()[i]), 0x7FFFFFFFu) << "f32 batches " << batches << " at " << i;
              } else {
                ASSERT_EQ(bits_of(yc.data_as<double>()[i]), 0x7FFFFFFFFFFFFFFFull) << "f64 batches " << batches << " at " << i;
              }
            } else {
              ASSERT_EQ(got[i], ref) << dtype_name(d) << " batches " << batches << " at " << i;  // small integers: exact
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ampscope
