// The CPU backend's dispatch table and its strided loops, which every other op builds on.
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/ops.h"
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
