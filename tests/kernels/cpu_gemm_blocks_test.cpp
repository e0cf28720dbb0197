// The CPU backend's f32 products (kernels/cpu/nn_kernels.cpp, gemm_kernel and for_row_blocks) cut a product's
// rows into at most 8 blocks whose bounds depend on the shapes only, so that its bits do not depend on the
// thread count. The blocks a thread runs back to back are one sgemm call when every block is above OpenBLAS's
// small-matrix size (10^6 multiply-adds): OpenBLAS's packed path sums an element the same way whatever the
// number of rows in the call, and one call packs the right-hand operand once instead of once a block (issue 37).
// Each case here is checked bit for bit against OpenBLAS called block by block, the way the backend called it
// before (the blocks recomputed here from the rule, not read from the backend), at whatever pool size the
// program runs with (AMPSCOPE_NUM_THREADS=1: one call for all blocks; 2: two calls). The cases just under the
// size are shapes where one call over all rows gives other bits than the blocks (checked below), so merging
// them would fail here.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cblas.h>
#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"

namespace ampscope {
namespace {

struct GemmShape {
  std::int64_t m, n, k;
  bool ta, tb;  // A stored as [k, m] (used transposed), B stored as [n, k]
};

// The row blocks' bounds as the backend cuts them: about 2^20 multiply-adds a block, at most 8 blocks.
std::int64_t row_blocks(const GemmShape& s) {
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(s.n * s.k, 1));
  return std::clamp<std::int64_t>(s.m / grain, 1, 8);
}

void sgemm_rows(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c,
                std::int64_t r0, std::int64_t r1) {
  const int lda = static_cast<int>(s.ta ? s.m : s.k), ldb = static_cast<int>(s.tb ? s.k : s.n);
  const float* rows = a.data() + (s.ta ? r0 : r0 * lda);
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(r1 - r0), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, rows, lda, b.data(), ldb,
              0.0f, c.data() + r0 * s.n, static_cast<int>(s.n));
}

// OpenBLAS on one thread, as the backend runs it (register_nn_kernels): its own threads split a call
// differently and can change the bits, and the backend may not have been started yet by the first case.
void sgemm_single_threaded() { openblas_set_num_threads(1); }

std::vector<float> block_by_block(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) {
  sgemm_single_threaded();
  std::vector<float> c(static_cast<std::size_t>(s.m * s.n));
  const std::int64_t blocks = row_blocks(s);
  for (std::int64_t blk = 0; blk < blocks; ++blk) sgemm_rows(s, a, b, c, s.m * blk / blocks, s.m * (blk + 1) / blocks);
  return c;
}

// The backend's product of the same operands: a Tensor per operand in its stored layout, transposed by view
// where the shape says so (what linear's x @ w^T and a weight gradient's g^T @ x give the kernel).
std::vector<float> backend_product(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b) {
  const std::vector<double> av(a.begin(), a.end()), bv(b.begin(), b.end());
  Tensor ta = from_values(av, s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k});
  Tensor tb = from_values(bv, s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n});
  if (s.ta) ta = ta.transpose(0, 1);
  if (s.tb) tb = tb.transpose(0, 1);
  const Tensor c = matmul(ta, tb).contiguous();
  EXPECT_EQ(c.dtype(), DType::f32);
  const auto* p = static_cast<const float*>(c.data());
  return std::vector<float>(p, p + s.m * s.n);
}

// Deterministic values of both signs and many exponents, so that sums round differently in another order.
std::vector<float> operand(std::int64_t count, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(count));
  std::uint32_t x = seed;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<std::int32_t>(x >> 8) - (1 << 23)) * 0x1p-23f * (1.0f + static_cast<float>(x & 7));
  }
  return v;
}

std::int64_t differing(const std::vector<float>& x, const std::vector<float>& y) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

TEST(cpu_gemm_blocks_test, f32_products_are_the_bits_of_sgemm_called_block_by_block) {
  // Above 10^6 multiply-adds a block (merged into one call a thread): the MLP's first layer forward (x @ w^T)
  // and weight gradient (g^T @ x), a hidden layer's input gradient (g @ w), uneven blocks (203 rows in 8:
  // 25 and 26), both operands transposed. Under it (kept block by block): 76 x 191 x 504 in 7 blocks of
  // 10-11 rows (962,640 multiply-adds the smallest) and 35 x 335 x 707 in 8 blocks of 4-5 rows.
  const GemmShape shapes[] = {{128, 256, 784, false, true}, {256, 784, 128, true, false}, {128, 256, 256, false, false},
                          {203, 300, 500, false, true}, {203, 300, 500, true, true},  {76, 191, 504, false, false},
                          {35, 335, 707, false, false}};
  for (const GemmShape& s : shapes) {
    const std::vector<float> a = operand(s.m * s.k, 17), b = operand(s.k * s.n, 29);
    const std::vector<float> want = block_by_block(s, a, b);
    const std::vector<float> got = backend_product(s, a, b);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(differing(got, want), 0) << s.m << " x " << s.n << " x " << s.k << " ta " << s.ta << " tb " << s.tb;
  }
}

TEST(cpu_gemm_blocks_test, the_cases_under_the_size_would_change_in_one_call) {
  // The premise of the cases under 10^6 multiply-adds a block: one sgemm call over all their rows gives
  // other bits than their blocks (OpenBLAS's small-matrix kernels add in another order), so a backend that
  // merged them would fail the test above. If OpenBLAS changes and this fails, find such shapes again.
  for (const GemmShape& s : {GemmShape{76, 191, 504, false, false}, GemmShape{35, 335, 707, false, false}}) {
    const std::vector<float> a = operand(s.m * s.k, 17), b = operand(s.k * s.n, 29);
    std::vector<float> one_call(static_cast<std::size_t>(s.m * s.n));
    sgemm_single_threaded();
    sgemm_rows(s, a, b, one_call, 0, s.m);
    EXPECT_GT(differing(one_call, block_by_block(s, a, b)), 0) << s.m << " x " << s.n << " x " << s.k;
  }
}

// A convolution's weight gradient, sum_b g[b] @ cols[b]^T in one float accumulator, cuts its sgemm calls into
// at most 4 blocks of output columns, and (issue 37) a thread's blocks are one call by the same rule: every
// block here is above 10^6 multiply-adds. Checked bit for bit against OpenBLAS called block by block with
// beta 0 for the first image and 1 after, the way the backend called it before, with the im2col columns
// written out here: the sample CNN's conv2 (288 columns in 4 blocks of 72) and 30 input channels (270 columns:
// 67, 68, 67, 68), 3 images each.
TEST(cpu_gemm_blocks_test, conv2d_weight_gradient_is_the_bits_of_sgemm_called_column_block_by_block) {
  for (const std::int64_t c : {32, 30}) {
    const std::int64_t n = 3, o = 64, h = 26, kk = 3, oh = h - kk + 1, l = oh * oh, ckk = c * kk * kk;
    const std::vector<float> xv = operand(n * c * h * h, 41), gv = operand(n * o * l, 43), wv = operand(o * ckk, 47);
    Tensor w = from_values(std::vector<double>(wv.begin(), wv.end()), {o, c, kk, kk});
    w.requires_grad_();
    conv2d(from_values(std::vector<double>(xv.begin(), xv.end()), {n, c, h, h}), w)
        .backward(from_values(std::vector<double>(gv.begin(), gv.end()), {n, o, oh, oh}));
    ASSERT_TRUE(w.grad().defined());
    const Tensor got_t = w.grad().contiguous();
    ASSERT_EQ(got_t.dtype(), DType::f32);
    const auto* gp = static_cast<const float*>(got_t.data());
    const std::vector<float> got(gp, gp + o * ckk);

    sgemm_single_threaded();
    const std::int64_t grain = std::max<std::int64_t>(64, (std::int64_t{1} << 20) / (o * l));
    const std::int64_t blocks = std::clamp<std::int64_t>(ckk / grain, 1, 4);
    ASSERT_EQ(blocks, 4);
    std::vector<float> want(static_cast<std::size_t>(o * ckk)), cols(static_cast<std::size_t>(ckk * l));
    for (std::int64_t b = 0; b < n; ++b) {
      for (std::int64_t ch = 0; ch < c; ++ch) {
        for (std::int64_t ki = 0; ki < kk; ++ki) {
          for (std::int64_t kj = 0; kj < kk; ++kj) {
            for (std::int64_t i = 0; i < oh; ++i) {
              for (std::int64_t j = 0; j < oh; ++j) {
                cols[((ch * kk + ki) * kk + kj) * l + i * oh + j] = xv[((b * c + ch) * h + i + ki) * h + j + kj];
              }
            }
          }
        }
      }
      for (std::int64_t blk = 0; blk < blocks; ++blk) {
        const std::int64_t c0 = ckk * blk / blocks, c1 = ckk * (blk + 1) / blocks;
        // C[:, c0:c1] (+)= g[b] [o, l] @ cols[c0:c1, :]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(o), static_cast<int>(c1 - c0),
                    static_cast<int>(l), 1.0f, gv.data() + b * o * l, static_cast<int>(l), cols.data() + c0 * l,
                    static_cast<int>(l), b == 0 ? 0.0f : 1.0f, want.data() + c0, static_cast<int>(ckk));
      }
    }
    EXPECT_EQ(differing(got, want), 0) << c << " input channels";
  }
}

}  // namespace
}  // namespace ampscope
