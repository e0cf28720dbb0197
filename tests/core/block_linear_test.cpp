// tests/core/block_linear_test.cpp: block-scaled Linear GEMMs (core/block_linear.h, --precision mxfp8|nvfp4)
// against a reference written here.
//
// The reference quantizes each operand copy with core/block_scaled.h directly (tested on its own in
// block_scaled_test.cpp), choosing here which tensor, which axis or tile, which Hadamard transform and which
// stochastic-rounding offset each GEMM's operands get (what block_linear.h documents), decodes the codes by their
// formulas in double (E4M3 and E2M1 elements, E8M0 and E4M3 scales), and multiplies. Two comparisons per GEMM:
// - bit for bit with the documented order: products of decoded element * block scale (exact in float) summed in
//   float over k ascending, times fl(global_decode_a * global_decode_b) (NVFP4; 1 for MXFP8), plus the bias in
//   float, rounded once to bf16;
// - against the exact value in double within the bound derived in accumulation_bound().
// The inputs hold outliers so that each operand's rowwise and columnwise copies differ: a GEMM fed the wrong copy,
// the wrong transform or the wrong random offset fails the bit-for-bit comparison.
#include "core/block_linear.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/block_scaled.h"
#include "core/block_stats.h"
#include "core/io/checkpoint.h"
#include "core/io/fp8_checkpoint.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

float bf16_round(float f) {  // round to nearest even on the top 16 bits (no NaN here)
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &u, sizeof u);
  return f;
}

// E4M3: (-1)^s 2^(e-7) (1 + m/8), or (-1)^s m 2^-9 for e = 0; 0x7F/0xFF NaN.
double e4m3_ref(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
// E2M1: (-1)^s 2^(e-1) (1 + m/2), or (-1)^s m/2 for e = 0.
double e2m1_ref(int code) {
  const int s = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? m / 2.0 : std::ldexp(1.0 + m / 2.0, e - 1);
  return s ? -mag : mag;
}

// One GEMM operand as the reference sees it: [rows, k] decoded element * block scale, and the global decode.
struct RefOperand {
  std::int64_t rows = 0, k = 0;
  std::vector<double> v;
  float global_decode = 1.0f;
};

std::vector<float> transpose(const std::vector<float>& m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return t;
}

// MXFP8 copy of m [R, C]: rowwise -> [R, C]; columnwise (32x1 blocks down the columns) -> [C, R].
RefOperand ref_mx(const std::vector<float>& m, std::int64_t R, std::int64_t C, bool columnwise, MxScaleRule rule) {
  const MxTensor q = quantize_mxfp8(m, R, C, {.axis = columnwise ? BlockAxis::along_column : BlockAxis::along_row,
                                              .element = Fp8Format::e4m3, .rule = rule});
  RefOperand o;
  o.rows = columnwise ? C : R;
  o.k = columnwise ? R : C;
  o.v.resize(m.size());
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t scale_index =
          static_cast<std::size_t>(columnwise ? (r / 32) * C + c : r * (C / 32) + c / 32);
      const double value = e4m3_ref(q.codes[static_cast<std::size_t>(r * C + c)]) * std::ldexp(1.0, q.scales[scale_index] - 127);
      o.v[static_cast<std::size_t>(columnwise ? c * R + r : r * C + c)] = value;
    }
  }
  return o;
}

// NVFP4 quantization of m [R, C] as given (the caller transposes and transforms first).
RefOperand ref_nv(const std::vector<float>& m, std::int64_t R, std::int64_t C, bool tile_2d, bool sr, std::uint64_t seed,
                  std::uint64_t offset) {
  Nvfp4Options options;
  options.tile = tile_2d ? Nvfp4Tile::square_16x16 : Nvfp4Tile::row_1x16;
  options.stochastic_rounding = sr;
  options.stream = {.seed = seed, .offset = offset};
  const Nvfp4Tensor q = quantize_nvfp4(m, R, C, options);
  RefOperand o;
  o.rows = R;
  o.k = C;
  o.global_decode = q.global_decode_scale;
  o.v.resize(m.size());
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t s = static_cast<std::size_t>(tile_2d ? (r / 16) * (C / 16) + c / 16 : r * (C / 16) + c / 16);
      o.v[static_cast<std::size_t>(r * C + c)] = e2m1_ref(q.codes[static_cast<std::size_t>(r * C + c)]) * e4m3_ref(q.scales[s]);
    }
  }
  return o;
}

RefOperand transposed(const RefOperand& o) {
  RefOperand t = o;
  t.rows = o.k;
  t.k = o.rows;
  for (std::int64_t r = 0; r < o.rows; ++r)
    for (std::int64_t c = 0; c < o.k; ++c) t.v[static_cast<std::size_t>(c * o.rows + r)] = o.v[static_cast<std::size_t>(r * o.k + c)];
  return t;
}

struct RefGemm {
  std::vector<float> ordered;
  std::vector<double> exact, abs_sum;
  std::int64_t inner = 0;
};

// C = A B^T, A [I, K], B [J, K].
RefGemm ref_gemm(const RefOperand& a, const RefOperand& b, const std::vector<float>& bias = {}) {
  EXPECT_EQ(a.k, b.k);
  const float alpha = a.global_decode * b.global_decode;
  RefGemm r;
  r.inner = a.k;
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t j = 0; j < b.rows; ++j) {
      float acc = 0.0f;
      double exact = 0, abs_sum = 0;
      for (std::int64_t p = 0; p < a.k; ++p) {
        const double prod = a.v[static_cast<std::size_t>(i * a.k + p)] * b.v[static_cast<std::size_t>(j * b.k + p)];
        acc += static_cast<float>(prod);  // exact: each factor has at most 4 significant bits
        exact += prod;
        abs_sum += std::fabs(prod);
      }
      float y = acc * alpha;
      double e = exact * a.global_decode * b.global_decode, s = abs_sum * a.global_decode * b.global_decode;
      if (!bias.empty()) {
        y += bias[static_cast<std::size_t>(j)];
        e += bias[static_cast<std::size_t>(j)];
        s += std::fabs(bias[static_cast<std::size_t>(j)]);
      }
      r.ordered.push_back(bf16_round(y));
      r.exact.push_back(e);
      r.abs_sum.push_back(s);
    }
  }
  return r;
}

// The f32 result's error: a sum of P exact products in any order is within gamma_(P-1) * sum|products| of the
// exact sum (Higham 3.1; u = 2^-24), the alpha product and its use add 2u relative and the bias u: within
// (P + 3) u / (1 - (P + 3) u) * abs_sum. Then the bf16 rounding: at most 2^-9 relative, bounded here by 2^-8 of
// the f32 value.
double accumulation_bound(double abs_sum, double exact, std::int64_t P) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(P + 3);
  const double f32_err = n * u / (1 - n * u) * abs_sum;
  return f32_err + std::ldexp(1.0, -8) * (std::fabs(exact) + f32_err);
}

void expect_matches(const std::vector<double>& got, const RefGemm& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.ordered.size()) << what;
  int mismatches = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] != static_cast<double>(ref.ordered[i]) && ++mismatches <= 5) {
      ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs " << ref.ordered[i];
    }
    EXPECT_LE(std::fabs(got[i] - ref.exact[i]), accumulation_bound(ref.abs_sum[i], ref.exact[i], ref.inner))
        << what << " element " << i;
  }
  EXPECT_EQ(mismatches, 0) << what;
}

std::vector<float> random_bf16(std::size_t n, double spread, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, spread);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(static_cast<float>(d(rng)));
  return v;
}

// A few outliers (`factor` times the spread) so that a block holding one is flattened in one copy and not in the
// other. MXFP8 needs a large factor: a power-of-two block scale moves a value's E4M3 rounding only once it reaches
// E4M3's subnormals, 2^-6 / 448 (about 2^-15) below the block's amax; so MXFP8 gets 2^16, and NVFP4 (E2M1: 6 / 0.5,
// a range of 12 in a block) 40.
void add_outliers(std::vector<float>& v, double spread, double factor, std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> at(0, v.size() - 1);
  for (int i = 0; i < 6; ++i) v[at(rng)] = bf16_round(static_cast<float>(factor * spread * (i % 2 ? -1 : 1)));
}

Tensor tensor_of(const std::vector<float>& v, const Shape& shape) {
  return from_values(std::vector<double>(v.begin(), v.end()), shape, {.dtype = DType::f32});
}

struct Case {
  Fp8Recipe recipe;
  MxScaleRule rule;
  bool rht;
  const char* name;
};

class BlockLinear : public ::testing::TestWithParam<Case> {};

// One Linear ([2, 32, 64] input folded to 64 rows, weight [32, 64], bias) under bf16 autocast: y, dx and dW
// against the reference, db from the unquantized gradient.
TEST_P(BlockLinear, fprop_dgrad_and_wgrad_match_the_reference_bit_for_bit_and_the_exact_value_within_the_bound) {
  const Case c = GetParam();
  std::mt19937 rng(4321);
  const std::int64_t B = 2, T = 32, K = 64, N = 32, M = B * T;
  std::vector<float> x = random_bf16(static_cast<std::size_t>(M * K), 2.0, rng);
  std::vector<float> w = random_bf16(static_cast<std::size_t>(N * K), 0.1, rng);
  const std::vector<float> bias = random_bf16(static_cast<std::size_t>(N), 0.1, rng);
  std::vector<float> g = random_bf16(static_cast<std::size_t>(M * N), 1e-3, rng);
  const double factor = c.recipe == Fp8Recipe::mxfp8 ? 65536.0 : 40.0;
  add_outliers(x, 2.0, factor, rng);
  add_outliers(w, 0.1, factor, rng);
  add_outliers(g, 1e-3, factor, rng);

  Tensor xt = tensor_of(x, {B, T, K}).requires_grad_();
  Tensor wt = tensor_of(w, {N, K}).requires_grad_();
  Tensor bt = tensor_of(bias, {N}).requires_grad_();
  const std::uint64_t seed = 77;
  auto ctx = std::make_shared<Fp8Context>(
      Fp8Options{.recipe = c.recipe, .mx_scale = c.rule, .nvfp4_rht = c.rht, .sr_seed = seed});
  Tensor y;
  {
    AutocastGuard autocast(DType::bf16);
    Fp8Guard region(ctx);
    y = linear(xt, wt, bt);
  }
  ASSERT_EQ(y.dtype(), DType::bf16);
  ASSERT_EQ(y.shape(), (Shape{B, T, N}));
  y.backward(tensor_of(g, {B, T, N}).to(DType::bf16));

  RefOperand xr, wr, gr, wc, gc, xc;
  if (c.recipe == Fp8Recipe::mxfp8) {
    xr = ref_mx(x, M, K, false, c.rule);
    wr = ref_mx(w, N, K, false, c.rule);
    gr = ref_mx(g, M, N, false, c.rule);
    wc = ref_mx(w, N, K, true, c.rule);
    gc = ref_mx(g, M, N, true, c.rule);
    xc = ref_mx(x, M, K, true, c.rule);
    EXPECT_EQ(ctx->random_offset(), 0u) << "MXFP8 draws no random numbers";
  } else {
    xr = ref_nv(x, M, K, false, false, 0, 0);
    wr = ref_nv(w, N, K, true, false, 0, 0);
    wc = ref_nv(transpose(w, N, K), K, N, true, false, 0, 0);
    // The backward quantizes dy's rowwise copy (dgrad) first, then its columnwise copy (wgrad), each drawing
    // ceil(M * N / 4) Philox blocks from the context's offset, which starts at 0.
    const std::uint64_t blocks = static_cast<std::uint64_t>((M * N + 3) / 4);
    gr = ref_nv(g, M, N, false, true, seed, 0);
    std::vector<float> gt = transpose(g, M, N), xt_ = transpose(x, M, K);
    if (c.rht) {
      gt = random_hadamard_transform(gt);
      xt_ = random_hadamard_transform(xt_);
    }
    gc = ref_nv(gt, N, M, false, true, seed, blocks);
    xc = ref_nv(xt_, K, M, false, false, 0, 0);
    EXPECT_EQ(ctx->random_offset(), 2 * blocks);
  }
  expect_matches(y.values(), ref_gemm(xr, wr, bias), "fprop y = x W^T + b");
  expect_matches(xt.grad().values(), ref_gemm(gr, wc), "dgrad dx = dy W");
  expect_matches(wt.grad().values(), ref_gemm(gc, xc), "wgrad dW = dy^T x");
  const std::vector<double> db = bt.grad().values();
  for (std::int64_t j = 0; j < N; ++j) {
    double exact = 0, abs_sum = 0;
    for (std::int64_t m = 0; m < M; ++m) {
      exact += g[static_cast<std::size_t>(m * N + j)];
      abs_sum += std::fabs(g[static_cast<std::size_t>(m * N + j)]);
    }
    EXPECT_LE(std::fabs(db[static_cast<std::size_t>(j)] - exact), accumulation_bound(abs_sum, exact, M)) << j;
  }
  // The outliers make the copies matter: dgrad fed W's rowwise copy (transposed) instead of its columnwise one,
  // or wgrad fed x's rowwise copy, would give other bits (with NVFP4's 2D weight tiles W's two copies agree, as TE
  // designed them to; then x's copies still differ by their axis and, by default, the transform).
  if (c.recipe == Fp8Recipe::mxfp8) {
    EXPECT_NE(ref_gemm(gr, transposed(wr)).ordered, ref_gemm(gr, wc).ordered);
  }
  EXPECT_NE(ref_gemm(gc, transposed(xr)).ordered, ref_gemm(gc, xc).ordered);
}

INSTANTIATE_TEST_SUITE_P(recipes, BlockLinear,
                         ::testing::Values(Case{Fp8Recipe::mxfp8, MxScaleRule::round_up, true, "mxfp8_round_up"},
                                           Case{Fp8Recipe::mxfp8, MxScaleRule::floor, true, "mxfp8_floor"},
                                           Case{Fp8Recipe::nvfp4, MxScaleRule::round_up, true, "nvfp4_rht"},
                                           Case{Fp8Recipe::nvfp4, MxScaleRule::round_up, false, "nvfp4_no_rht"}),
                         [](const auto& info) { return std::string(info.param.name); });

// An outlier at (0, 0) of a 32x32 matrix of 1e-3: in the rowwise copy it shares a block with row 0, in the columnwise
// copy with column 0. Round-up gives its blocks the scale 4 (1000 / 448 rounded up to a power of two), and 1e-3 / 4
// is below half of E4M3's smallest subnormal 2^-9: zero. Elsewhere 1e-3 keeps E4M3's 4 significant bits.
TEST(block_linear_test, an_operands_rowwise_and_columnwise_copies_differ_where_an_outlier_shares_only_one_block) {
  std::vector<float> m(32 * 32, bf16_round(1e-3f));
  m[0] = 1000.0f;
  auto mx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::mxfp8});
  const BlockOperand row = block_quantize_copy(m, 32, 32, Fp8Operand::weight, BlockCopy::rowwise, *mx, "fc");
  const BlockOperand col = block_quantize_copy(m, 32, 32, Fp8Operand::weight, BlockCopy::columnwise, *mx, "fc");
  ASSERT_EQ(row.values.size(), 1024u);
  ASSERT_EQ(col.values.size(), 1024u);
  const auto row_at = [&](int r, int c) { return row.values[static_cast<std::size_t>(r * 32 + c)]; };
  const auto col_at = [&](int r, int c) { return col.values[static_cast<std::size_t>(c * 32 + r)]; };  // [C, R]
  EXPECT_EQ(row_at(0, 0), 1024.0f);  // 1000 / 4 = 250 -> 256 (E4M3's quantum in [128, 256) is 16), times 4
  EXPECT_EQ(col_at(0, 0), 1024.0f);
  EXPECT_EQ(row_at(0, 1), 0.0f) << "row 0's block holds the outlier";
  EXPECT_NEAR(col_at(0, 1), 1e-3, 1e-3 / 16) << "column 1's block does not";
  EXPECT_EQ(col_at(1, 0), 0.0f) << "column 0's block holds the outlier";
  EXPECT_NEAR(row_at(1, 0), 1e-3, 1e-3 / 16) << "row 1's block does not";
  EXPECT_EQ(row.global_decode, 1.0f);

  // NVFP4: an input (1x16 blocks, no transform here) differs between its copies the same way; a weight (16x16
  // tiles) does not. The outlier is 10 here: 1000 would make global_encode 2688 / 1000 and the 1e-3 blocks' E4M3
  // scale 1e-3 * 2.688 / 6, below half of E4M3's smallest subnormal, so every block without the outlier would be
  // zero in both copies. With 10: global_encode 268.8, the outlier's block scale 448 (encode 0.6: 1e-3 -> 6e-4 -> 0
  // in E2M1), the other blocks' 0.0448 (1e-3 -> about 6 in E2M1, kept).
  m[0] = 10.0f;
  auto nv = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4, .nvfp4_rht = false});
  const BlockOperand in_row = block_quantize_copy(m, 32, 32, Fp8Operand::input, BlockCopy::rowwise, *nv, "fc");
  const BlockOperand in_col = block_quantize_copy(m, 32, 32, Fp8Operand::input, BlockCopy::columnwise, *nv, "fc");
  EXPECT_EQ(in_row.values[1], 0.0f) << "row 0's first block holds the outlier";
  EXPECT_NEAR(in_col.values[32] * in_col.global_decode, 1e-3, 1e-3 / 4) << "column 1's first block does not";
  const BlockOperand w_row = block_quantize_copy(m, 32, 32, Fp8Operand::weight, BlockCopy::rowwise, *nv, "fc");
  const BlockOperand w_col = block_quantize_copy(m, 32, 32, Fp8Operand::weight, BlockCopy::columnwise, *nv, "fc");
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 32; ++c)
      EXPECT_EQ(w_row.values[static_cast<std::size_t>(r * 32 + c)], w_col.values[static_cast<std::size_t>(c * 32 + r)]) << r << "," << c;
  EXPECT_EQ(w_row.global_decode, w_col.global_decode);
}

// With a probe hook installed, each quantized copy is reported once, in the order the Linear quantizes them, with
// the quantized matrix's shape and statistics over its values.
struct Recorder : probe::Hook {
  std::vector<std::string> seen;
  void on_block_quantize(const probe::BlockQuantizeEvent& e) override {
    seen.push_back(fmt::format("{} {} {} {} {}x{} {} {}", e.module, e.operand, e.copy, e.format, e.rows, e.cols,
                               e.stats.numel, e.what_if));
  }
};

TEST(block_linear_test, each_quantized_copy_is_reported_to_the_probe_hook) {
  for (Fp8Recipe recipe : {Fp8Recipe::mxfp8, Fp8Recipe::nvfp4}) {
    auto recorder = std::make_shared<Recorder>();
    probe::HookGuard guard(recorder);
    Tensor x = from_values(std::vector<double>(64 * 32, 0.5), {64, 32}, {.dtype = DType::f32}).requires_grad_();
    Tensor w = from_values(std::vector<double>(32 * 32, 0.25), {32, 32}, {.dtype = DType::f32}).requires_grad_();
    auto ctx = std::make_shared<Fp8Context>(Fp8Options{.recipe = recipe});
    Tensor y;
    {
      AutocastGuard autocast(DType::bf16);
      Fp8Guard region(ctx);
      y = linear(x, w);
    }
    y.backward(ones({64, 32}).to(DType::bf16));
    const std::string f = recipe == Fp8Recipe::mxfp8 ? "mxfp8" : "nvfp4";
    // NVFP4's columnwise copies are quantizations of the transpose: their shapes are the transpose's.
    const bool t = recipe == Fp8Recipe::nvfp4;
    EXPECT_EQ(recorder->seen, (std::vector<std::string>{
                                  fmt::format(" input rowwise {} 64x32 2048 false", f),
                                  fmt::format(" weight rowwise {} 32x32 1024 false", f),
                                  fmt::format(" weight columnwise {} 32x32 1024 false", f),
                                  fmt::format(" input columnwise {} {} 2048 false", f, t ? "32x64" : "64x32"),
                                  fmt::format(" grad_output rowwise {} 64x32 2048 false", f),
                                  fmt::format(" grad_output columnwise {} {} 2048 false", f, t ? "32x64" : "64x32"),
                              }));
  }
}

// docs/fp8.md's worked GEMM: x = (500, 1, ..., 1), every W value 0.5, MXFP8 round-up: 512 * 0.5 + 31 * 0.5 = 271.5,
// rounded to bf16: 272 (the unquantized product is 265.5).
TEST(block_linear_test, the_worked_mxfp8_gemm_of_the_docs) {
  std::vector<double> x(32, 1.0);
  x[0] = 500.0;
  const Tensor xt = from_values(x, {1, 32}, {.dtype = DType::f32});
  const Tensor w = from_values(std::vector<double>(32 * 32, 0.5), {32, 32}, {.dtype = DType::f32});
  auto mx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::mxfp8});
  AutocastGuard autocast(DType::bf16);
  Fp8Guard region(mx);
  const Tensor y = linear(xt, w);
  ASSERT_EQ(y.dtype(), DType::bf16);
  for (double v : y.values()) EXPECT_EQ(v, 272.0);
}

// A Linear whose sizes the blocks do not divide is refused before anything is quantized, naming the module and the
// shapes; without gradients the input's rows are free (only fprop runs).
TEST(block_linear_test, a_linear_whose_sizes_the_blocks_do_not_divide_is_refused_with_what_to_do) {
  auto mx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::mxfp8});
  const Tensor w = zeros({10, 64}).requires_grad_();
  const Tensor x = zeros({64, 64});
  AutocastGuard autocast(DType::bf16);
  Fp8Guard region(mx);
  EXPECT_THROW_MSG(linear(x, w), ShapeError,
                   "linear in '': --precision mxfp8 quantizes in 1x32 blocks along each GEMM's contraction dimension, so "
                   "in_features, out_features and the input's rows must be multiples of 32, but the weight is [10, 64] "
                   "and the input has 64 rows\nhint: keep this Linear in bf16 (ampscope train: --fp8-keep-bf16 ''), or "
                   "make its sizes and the batch's rows multiples of 32");
  Tensor w2 = zeros({32, 64});
  EXPECT_EQ(linear(zeros({3, 64}), w2).shape(), (Shape{3, 32}));  // no gradient: 3 rows are fine
  EXPECT_THROW_MSG(linear(zeros({3, 64}), w2.requires_grad_()), ShapeError, "and the input has 3 rows");
  auto nv = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4});
  Fp8Guard nv_region(nv);
  EXPECT_THROW_MSG(linear(zeros({16, 24}), zeros({16, 24})), ShapeError,
                   "--precision nvfp4 quantizes in 1x16 blocks along each GEMM's contraction dimension and 16x16 "
                   "weight tiles, so in_features and out_features must be multiples of 16, but the weight is [16, 24]");
}

// The checkpoint's "block" state: NVFP4's stochastic-rounding offset round-trips; a damaged or foreign state is
// refused naming the key, and the context keeps its offset.
TEST(block_linear_test, the_block_state_round_trips_and_a_damaged_or_foreign_one_is_refused) {
  auto nv = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4});
  EXPECT_EQ(nv->take_random_blocks(10), 0u);  // 10 values: ceil(10 / 4) = 3 blocks
  EXPECT_EQ(nv->take_random_blocks(1), 3u);
  const StateDict saved = block_state_dict(*nv);
  auto fresh = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4});
  load_block_state_dict(*fresh, saved, "ck.h5");
  EXPECT_EQ(fresh->random_offset(), 4u);

  auto other = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4});
  StateDict bad = saved;
  bad["random_offset"] = std::int64_t{-1};
  EXPECT_THROW_MSG(load_block_state_dict(*other, bad, "ck.h5"), CheckpointError, "'random_offset' is -1, below 0");
  bad = saved;
  bad["extra"] = std::int64_t{0};
  EXPECT_THROW_MSG(load_block_state_dict(*other, bad, "ck.h5"), CheckpointError, "comes with 6 keys, not the 5");
  bad = saved;
  bad.erase("rht");
  EXPECT_THROW_MSG(load_block_state_dict(*other, bad, "ck.h5"), CheckpointError, "'rht' is missing");
  bad = saved;
  bad["rht"] = std::int64_t{2};
  EXPECT_THROW_MSG(load_block_state_dict(*other, bad, "ck.h5"), CheckpointError, "'rht' is 2, not 0 or 1");
  EXPECT_EQ(other->random_offset(), 0u);
  auto mx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::mxfp8, .mx_scale = MxScaleRule::floor});
  EXPECT_THROW_MSG(load_block_state_dict(*mx, saved, "ck.h5"), CheckpointError,
                   "--resume: 'ck.h5' was written by a run with --precision nvfp4, not --precision mxfp8 --mx-scale "
                   "floor: it would not continue under these settings");
}

}  // namespace
}  // namespace ampscope
