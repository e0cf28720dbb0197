// tests/twin/block_twin_test.cpp: the f32 twin on block-scaled Linears (probes/twin.h, "Block-scaled Linears";
// issue 35). A Linear under bf16 autocast and an MXFP8 or NVFP4 region rounds twice: its operands' copies to the block
// format, its f32 GEMM to bf16. The twin's rows must keep the two apart: local errors (labelled bf16) are the bf16
// rounding of the block GEMM alone, accumulated errors are against the unquantized Linear in f32. Both are checked
// against references computed here: each copy quantized with core/block_scaled.h's quantizers directly (the layouts,
// transposes, Hadamard transform and stochastic-rounding stream written out from docs/fp8.md, not taken from the
// runtime's recipe code), decoded element by element, the GEMM summed in f32 in ascending order as core/block_linear.h
// defines it; and the unquantized product in f64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/block_scaled.h"
#include "core/fp8_linear.h"
#include "core/ops.h"
#include "probes/twin.h"
#include "tests/test_support.h"
#include "tests/twin/twin_test_support.h"

namespace ampscope {
namespace {

using testing::Errors;
using testing::errors_of;
using testing::exact_product;
using testing::quantized_linear_step;

struct Case {
  const char* name;
  Fp8Recipe recipe;
  MxScaleRule mx_scale = MxScaleRule::round_up;
  bool rht = true;
};
std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

constexpr std::uint64_t kSrSeed = 0x5eed;

std::vector<float> transpose(const std::vector<float>& m, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = m[static_cast<std::size_t>(r * cols + c)];
  return t;
}

// A GEMM operand of the test's own: [rows, k] row-major, decoded element times block scale; alpha NVFP4's global
// decode scale (1 for MXFP8).
struct Op {
  std::int64_t rows = 0, k = 0;
  std::vector<float> v;
  float alpha = 1.0f;
};

// MXFP8: along_row blocks of the [R, C] matrix (k = C), or along_column ones (the GEMM contracts over R: the decoded
// matrix transposed to [C, R]).
Op mx_copy(const std::vector<float>& m, std::int64_t R, std::int64_t C, bool columnwise, MxScaleRule rule) {
  const MxTensor q = quantize_mxfp8(m, R, C, {.axis = columnwise ? BlockAxis::along_column : BlockAxis::along_row, .rule = rule});
  const std::vector<float> d = dequantize_mxfp8(q);
  return columnwise ? Op{C, R, transpose(d, R, C), 1.0f} : Op{R, C, d, 1.0f};
}

// NVFP4: the rowwise copy quantizes [R, C]; the columnwise copy quantizes the transpose [C, R], after the Hadamard
// transform along R (each run of 16 of a row of the transpose) when `rht` and the copy is a wgrad operand. Weights in 16x16 tiles; gradients rounded
// stochastically from (kSrSeed, offset). Decoded as e2m1 times the E4M3 block scale; the global decode scale is alpha.
Op nv_copy(const std::vector<float>& m, std::int64_t R, std::int64_t C, bool columnwise, bool weight, bool grad,
           bool rht, std::uint64_t& offset) {
  std::vector<float> seen = columnwise ? transpose(m, R, C) : m;
  const std::int64_t rows = columnwise ? C : R, cols = columnwise ? R : C;
  // The wgrad operands only (x and dy columnwise; W's columnwise copy feeds the dgrad): runs of 16 along R.
  if (columnwise && rht && !weight) seen = random_hadamard_transform(seen);
  Nvfp4Options o{.tile = weight ? Nvfp4Tile::square_16x16 : Nvfp4Tile::row_1x16, .stochastic_rounding = grad,
                 .stream = {.seed = kSrSeed, .offset = offset}};
  const Nvfp4Tensor q = quantize_nvfp4(seen, rows, cols, o);
  if (grad) offset += (static_cast<std::uint64_t>(seen.size()) + 3) / 4;
  Op out{rows, cols, std::vector<float>(seen.size()), q.global_decode_scale};
  const std::int64_t scale_cols = cols / 16;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t b = weight ? (r / 16) * scale_cols + c / 16 : r * scale_cols + c / 16;
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      out.v[i] = e2m1_to_float(q.codes[i]) * fp8_to_float(q.scales[static_cast<std::size_t>(b)], Fp8Format::e4m3);
    }
  }
  return out;
}

// C = A B^T: sum over k ascending of fl(a * b) in f32 from 0, times fl(alpha_a * alpha_b): the block GEMM before its
// bf16 rounding (no bias here).
std::vector<double> block_product(const Op& a, const Op& b) {
  const float alpha = a.alpha * b.alpha;
  std::vector<double> c;
  for (std::int64_t i = 0; i < a.rows; ++i) {
    for (std::int64_t j = 0; j < b.rows; ++j) {
      float s = 0;
      for (std::int64_t p = 0; p < a.k; ++p) s += a.v[static_cast<std::size_t>(i * a.k + p)] * b.v[static_cast<std::size_t>(j * b.k + p)];
      c.push_back(static_cast<double>(s * alpha));
    }
  }
  return c;
}

// bf16 values (random, with a few large ones so that blocks differ in range): what an autocast cast leaves unchanged.
std::vector<double> bf16_values(std::size_t n, double spread, std::mt19937& rng) {
  std::normal_distribution<double> d(0.0, spread);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = d(rng) * (i % 37 == 5 ? 40.0 : 1.0);
  return from_values(v, {static_cast<std::int64_t>(n)}, {DType::bf16}).to(DType::f32).values();
}
std::vector<float> as_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// The hook the twin wraps: counts the block copies it hears (the probe's /blocks rows come from them).
struct CopyCounter : probe::Hook {
  int copies = 0;
  void on_block_quantize(const probe::BlockQuantizeEvent&) override { ++copies; }
};

const probe::PrecisionRow& linear_row(const std::vector<probe::PrecisionRow>& rows, trace::Phase phase) {
  for (const probe::PrecisionRow& r : rows)
    if (r.op == "linear" && r.phase == phase) return r;
  throw std::runtime_error("no twin row for linear");
}

// Every element of `y` (bf16) is `reference` rounded to bf16: the reference is the GEMM the run computed.
void expect_rounds_to(const std::vector<double>& y, const std::vector<double>& reference, const char* what) {
  ASSERT_EQ(y.size(), reference.size());
  const std::vector<double> r =
      from_values(reference, {static_cast<std::int64_t>(reference.size())}, {DType::f32}).to(DType::bf16).to(DType::f32).values();
  std::int64_t differ = 0;
  for (std::size_t i = 0; i < y.size(); ++i) differ += y[i] != r[i];
  EXPECT_EQ(differ, 0) << what << ": the test's block GEMM does not round to the run's output";
}

class BlockTwin : public ::testing::TestWithParam<Case> {};

TEST_P(BlockTwin, local_errors_are_the_bf16_rounding_of_the_block_gemm_and_accumulated_ones_hold_the_quantization) {
  const Case c = GetParam();
  const bool mx = c.recipe == Fp8Recipe::mxfp8;
  std::mt19937 rng(mx ? 5 : 9);
  const std::int64_t M = 32, K = 64, N = 32;
  const std::vector<double> x = bf16_values(M * K, 1.0, rng);
  const std::vector<double> w = bf16_values(N * K, 0.2, rng);
  const std::vector<double> g = bf16_values(M * N, 0.01, rng);
  Tensor xt = from_values(x, {M, K}, {DType::f32}).requires_grad_();
  Tensor wt = from_values(w, {N, K}, {DType::f32}).requires_grad_();
  auto counter = std::make_shared<CopyCounter>();
  auto twin = std::make_shared<probe::Twin>(counter);
  auto ctx = std::make_shared<Fp8Context>(
      Fp8Options{.recipe = c.recipe, .mx_scale = c.mx_scale, .nvfp4_rht = c.rht, .sr_seed = kSrSeed});
  const Tensor y = quantized_linear_step(twin, ctx, xt, wt, from_values(g, {M, N}, {DType::bf16}));
  EXPECT_EQ(counter->copies, 6) << "the twin forwards every copy (x and W both ways, dy both ways) to the hook it wraps";
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_TRUE(twin->uncovered().empty());

  // The test's copies, in the run's order (stochastic rounding's offsets follow it: dy rowwise, then columnwise).
  const std::vector<float> xf = as_float(x), wf = as_float(w), gf = as_float(g);
  std::uint64_t offset = 0;
  const Op x_row = mx ? mx_copy(xf, M, K, false, c.mx_scale) : nv_copy(xf, M, K, false, false, false, c.rht, offset);
  const Op w_row = mx ? mx_copy(wf, N, K, false, c.mx_scale) : nv_copy(wf, N, K, false, true, false, c.rht, offset);
  const Op w_col = mx ? mx_copy(wf, N, K, true, c.mx_scale) : nv_copy(wf, N, K, true, true, false, c.rht, offset);
  const Op x_col = mx ? mx_copy(xf, M, K, true, c.mx_scale) : nv_copy(xf, M, K, true, false, false, c.rht, offset);
  const Op g_row = mx ? mx_copy(gf, M, N, false, c.mx_scale) : nv_copy(gf, M, N, false, false, true, c.rht, offset);
  const Op g_col = mx ? mx_copy(gf, M, N, true, c.mx_scale) : nv_copy(gf, M, N, true, false, true, c.rht, offset);

  // Forward: y = x_row w_row^T. Local against that GEMM in f32 (the twin's reference, bit for bit: the same errors
  // to the last bit); accumulated against x w^T unquantized.
  const probe::PrecisionRow& fwd = linear_row(twin->rows(), trace::Phase::forward);
  EXPECT_EQ(fwd.out_dtype, "bf16");
  const std::vector<double> yv = y.to(DType::f32).values();
  const std::vector<double> y_block = block_product(x_row, w_row);
  expect_rounds_to(yv, y_block, "forward");
  const Errors local = errors_of(yv, y_block, DType::bf16);
  EXPECT_DOUBLE_EQ(fwd.local_max_rel, local.max_rel);
  EXPECT_NEAR(fwd.local_mean_rel, local.mean_rel, 1e-12);
  EXPECT_DOUBLE_EQ(fwd.local_max_ulp, local.max_ulp);
  EXPECT_LE(fwd.local_max_rel, std::ldexp(1.0, -8));  // one rounding to bf16
  EXPECT_LE(fwd.local_max_ulp, 0.5);
  const Errors acc = errors_of(yv, exact_product(x, false, K, w, true, K, M, K, N), DType::bf16);
  // The twin's unquantized reference is f32 (a sum of 64 products: within 64 * 2^-24 relative of f64's).
  EXPECT_NEAR(fwd.acc_max_rel, acc.max_rel, 1e-4 * acc.max_rel);
  EXPECT_NEAR(fwd.acc_mean_rel, acc.mean_rel, 1e-4 * acc.mean_rel);
  // E4M3's 3 mantissa bits, E2M1's 1: the quantization costs far more than bf16's rounding, and the rows say where.
  EXPECT_GT(fwd.acc_mean_rel, 4 * fwd.local_mean_rel);

  // Backward: dx = g_row w_col^T (contraction over N), dW = g_col x_col^T (over M, after the transform where
  // applied), each against its block GEMM in f32; the row takes the larger.
  const probe::PrecisionRow& bwd = linear_row(twin->rows(), trace::Phase::backward);
  EXPECT_EQ(bwd.out_dtype, "bf16");
  const std::vector<double> dx = xt.grad().values(), dw = wt.grad().values();
  const std::vector<double> dx_block = block_product(g_row, w_col), dw_block = block_product(g_col, x_col);
  expect_rounds_to(dx, dx_block, "dgrad");
  expect_rounds_to(dw, dw_block, "wgrad");
  const Errors ex = errors_of(dx, dx_block, DType::bf16);
  const Errors ew = errors_of(dw, dw_block, DType::bf16);
  EXPECT_DOUBLE_EQ(bwd.local_max_rel, std::max(ex.max_rel, ew.max_rel));
  EXPECT_NEAR(bwd.local_mean_rel, std::max(ex.mean_rel, ew.mean_rel), 1e-12);
  EXPECT_DOUBLE_EQ(bwd.local_max_ulp, std::max(ex.max_ulp, ew.max_ulp));
  EXPECT_LE(bwd.local_max_rel, std::ldexp(1.0, -8));
  // The unquantized dgrad and wgrad (what the twin compared with before: its widened backward) are far away.
  const Errors ex_exact = errors_of(dx, exact_product(g, false, N, w, false, K, M, N, K), DType::bf16);
  const Errors ew_exact = errors_of(dw, exact_product(g, true, N, x, false, K, N, M, K), DType::bf16);
  EXPECT_GT(ex_exact.mean_rel, 4 * bwd.local_mean_rel);
  EXPECT_GT(ew_exact.mean_rel, 4 * bwd.local_mean_rel);
}

INSTANTIATE_TEST_SUITE_P(formats, BlockTwin,
                         ::testing::Values(Case{"mxfp8_round_up", Fp8Recipe::mxfp8, MxScaleRule::round_up},
                                           Case{"mxfp8_floor", Fp8Recipe::mxfp8, MxScaleRule::floor},
                                           Case{"nvfp4_rht", Fp8Recipe::nvfp4, MxScaleRule::round_up, true},
                                           Case{"nvfp4_no_rht", Fp8Recipe::nvfp4, MxScaleRule::round_up, false}),
                         case_name);

// Sits between the runtime and the twin and doubles the values of the input's rowwise copy it passes on: the twin
// then holds a copy that is not the one the GEMM used. Everything else is passed on unchanged.
struct Forger : probe::Hook {
  std::shared_ptr<probe::Twin> twin;
  explicit Forger(std::shared_ptr<probe::Twin> t) : twin(std::move(t)) {}
  bool wants_op(std::string_view op, const std::string& scope) override { return twin->wants_op(op, scope); }
  void before_op(std::string_view op, const std::string& scope) override { twin->before_op(op, scope); }
  void on_op(const probe::OpEvent& e) override { twin->on_op(e); }
  void on_backward_op(const probe::OpEvent& e) override { twin->on_backward_op(e); }
  void on_step_begin(std::int64_t step) override { twin->on_step_begin(step); }
  void on_step_end(const probe::StepSummary& s) override { twin->on_step_end(s); }
  void on_block_quantize(const probe::BlockQuantizeEvent& e) override {
    if (e.operand != "input" || e.copy != "rowwise") return twin->on_block_quantize(e);
    std::vector<float> doubled(e.decoded.begin(), e.decoded.end());
    for (float& v : doubled) v *= 2;
    probe::BlockQuantizeEvent forged = e;
    forged.decoded = doubled;
    twin->on_block_quantize(forged);
  }
};

// The twin checks that its block GEMM rounds to the op's output bit for bit: a copy that is not the one the GEMM used
// makes the Linear uncovered (no row), and its backward node too (its forward was not compared), never a wrong row.
TEST(block_twin_test, copies_that_are_not_the_gemms_make_the_linear_uncovered) {
  std::mt19937 rng(3);
  const std::int64_t M = 32, K = 32, N = 32;
  const std::vector<double> x = bf16_values(M * K, 1.0, rng), w = bf16_values(N * K, 0.2, rng);
  Tensor xt = from_values(x, {M, K}, {DType::f32}).requires_grad_();
  Tensor wt = from_values(w, {N, K}, {DType::f32}).requires_grad_();
  auto twin = std::make_shared<probe::Twin>(std::make_shared<CopyCounter>());
  auto ctx = std::make_shared<Fp8Context>(Fp8Options{.recipe = Fp8Recipe::nvfp4});
  quantized_linear_step(std::make_shared<Forger>(twin), ctx, xt, wt,
                        from_values(std::vector<double>(static_cast<std::size_t>(M * N), 1.0), {M, N}, {DType::bf16}));
  for (const probe::PrecisionRow& r : twin->rows()) EXPECT_NE(r.op, "linear") << "a row from the wrong copy";
  const auto& uncovered = twin->uncovered();
  ASSERT_TRUE(uncovered.contains("linear"));
  EXPECT_EQ(uncovered.at("linear"), 1);
  ASSERT_TRUE(uncovered.contains("backward of linear"));
  EXPECT_EQ(uncovered.at("backward of linear"), 1);
}

}  // namespace
}  // namespace ampscope
