// nll_loss's mean on a GPU (issue 30, docs/cuda.md "What synchronises"): core/ops.cpp no longer counts the
// targets on the host there; the backend counts them on the device (Backend::count_not_equal) into a value of
// the accumulation type, and core divides by it with the element-wise div kernel in that type, then rounds to
// the loss's dtype (divide_by_count). The forward is then round(sum / count) and the backward
// -round(g / count), where the CPU kernels compute round(sum * 1 / divisor) and round(-g / divisor). These
// tests run that composition of CPU kernels (no GPU needed) against nll_loss's CPU result and gradient, bit
// for bit, in every floating dtype, with counts that make the divisions inexact; a division in the wrong
// type (f32 for f64, f16 for f16) or by a reciprocal fails them. The device path itself is compared with the
// CPU in tests/probes/sync_cuda_test.cpp (GPU).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

// Equal as stored values: the same double (f16/bf16/f32 widen exactly), zeros' signs included; any NaN
// matches a NaN (the CPU and the composition both store the canonical NaN, which widening keeps a NaN).
bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

DType acc_of(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// `rows` targets in [0, classes), every k-th one replaced by -100 (ignored).
std::vector<double> targets_with_ignored(std::int64_t rows, std::int64_t classes, std::int64_t every) {
  std::vector<double> t;
  for (std::int64_t i = 0; i < rows; ++i) {
    t.push_back(every > 0 && i % every == 0 ? -100.0 : double((i * 7 + 3) % classes));
  }
  return t;
}

std::int64_t counted(const std::vector<double>& t) {
  std::int64_t n = 0;
  for (double v : t) n += v != -100.0 ? 1 : 0;
  return n;
}

struct Case {
  DType dtype;
  std::int64_t rows, classes, every;  // every: the period of ignored targets (0: none)
};

class NllDivisorTest : public ::testing::TestWithParam<Case> {};

TEST_P(NllDivisorTest, the_device_paths_division_gives_the_cpu_kernels_bits) {
  const Case c = GetParam();
  Generator gen(1234 + c.rows);
  const Tensor logits = mul(randn({c.rows, c.classes}, gen, {DType::f64}), 3.0);
  const Tensor logp = log_softmax(logits, 1).to(c.dtype).detach().requires_grad_();
  const std::vector<double> tv = targets_with_ignored(c.rows, c.classes, c.every);
  const Tensor target = from_values(tv, {c.rows}, {DType::i64});
  const DType acc = acc_of(c.dtype);
  // The count as Backend::count_not_equal leaves it: counted in integers, rounded once to the acc type.
  const Tensor count = from_values({double(counted(tv))}, {}, {acc});

  const Tensor loss = nll_loss(logp, target, Reduction::mean);
  const Tensor per = nll_loss(logp.detach(), target, Reduction::none);
  // Forward: the sum of the per-row losses in the acc type (the sum_rows kernel with factor and divisor 1),
  // divided there, rounded to the dtype.
  const Tensor composed = div(sum(per, acc), count).to(c.dtype);
  EXPECT_TRUE(same_value(loss.item(), composed.item())) << loss.item() << " vs " << composed.item();

  // Backward with an incoming gradient that is not 1, so g / count rounds: -round(g / count) at each counted
  // target, 0 elsewhere.
  const double g_value = 0.7;
  const Tensor g = from_values({g_value}, {}, {c.dtype});
  loss.backward(g);
  const std::vector<double> dx = logp.grad().values();
  const double q = neg(div(g.to(acc), count).to(c.dtype)).item();
  for (std::int64_t i = 0; i < c.rows; ++i) {
    for (std::int64_t k = 0; k < c.classes; ++k) {
      const double want = tv[i] != -100.0 && double(k) == tv[i] ? q : 0.0;
      ASSERT_TRUE(same_value(dx[i * c.classes + k], want)) << "row " << i << " class " << k << ": "
                                                            << dx[i * c.classes + k] << " vs " << want;
    }
  }
}

// Counts 3, 7, 11, 999 and 1000 (with ignored targets), and 0: every target ignored, 0 / 0 = NaN in both.
INSTANTIATE_TEST_SUITE_P(dtypes_and_counts, NllDivisorTest,
                         ::testing::Values(Case{DType::f32, 4, 5, 4}, Case{DType::f16, 4, 5, 4},
                                         Case{DType::bf16, 4, 5, 4}, Case{DType::f64, 4, 5, 4},
                                         Case{DType::f32, 7, 3, 0}, Case{DType::f16, 11, 6, 0},
                                         Case{DType::bf16, 1000, 9, 1000}, Case{DType::f16, 1000, 9, 1000},
                                         Case{DType::f64, 1000, 9, 1000}, Case{DType::f32, 1000, 9, 0},
                                         Case{DType::f16, 3, 4, 1}, Case{DType::f32, 3, 4, 1}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(info.param.rows) +
                                  "_rows_every_" + std::to_string(info.param.every);
                         });

// A worked value, independent of the kernels: f16 log-probabilities -1, -2, -3 with the middle target
// ignored: (1 + 3) / 2 = 2 exactly; with g = 1, the gradient is -1/2 at the two counted targets.
TEST(nll_divisor_test, a_hand_worked_mean_with_an_ignored_target) {
  const Tensor logp =
      from_values({-1, -9, -9, -9, -2, -9, -9, -9, -3}, {3, 3}, {DType::f16}).detach().requires_grad_();
  const Tensor target = from_values({0, -100, 2}, {3}, {DType::i64});
  const Tensor loss = nll_loss(logp, target);
  EXPECT_EQ(loss.item(), 2.0);
  loss.backward();
  EXPECT_EQ(logp.grad().values(), (std::vector<double>{-0.5, 0, 0, 0, 0, 0, 0, 0, -0.5}));
}

TEST(nll_divisor_test, the_cpu_backend_has_no_device_count_and_says_so) {
  Backend& cpu = backend_for(Device::cpu());
  const Tensor idx = from_values({1, 2}, {2}, {DType::i64});
  Tensor out = Tensor::empty({}, {DType::f32});
  EXPECT_THROW_MSG(cpu.count_not_equal(idx.kernel_view(), -100, out.kernel_view()), UnsupportedError,
                   "count_not_equal: backend 'cpu' has no device count kernel",
                   "hint: count the indices on the host");
}

// The CPU path still checks at once, with the host check's text (the GPU reports the same text later).
TEST(nll_divisor_test, cpu_indices_are_still_checked_before_the_kernel) {
  const Tensor logp = full({2, 3}, -1.0, {DType::f32});
  EXPECT_THROW_MSG(nll_loss(logp, from_values({1, 3}, {2}, {DType::i64})), IndexError,
                   "nll_loss: target 3 (row 1) is out of bounds for 3 classes");
  EXPECT_THROW_MSG(embedding(from_values({0, -1}, {2}, {DType::i64}), full({4, 2}, 1.0, {DType::f32})), IndexError,
                   "embedding: index -1 at position 1 is out of range for 4 embeddings");
}

}  // namespace
}  // namespace ampscope
