// tests/autocast/autocast_region_test.cpp: the region semantics of AutocastGuard (reference/amp-semantics.md
// 2.1): the enabled flag, nesting, disabled regions inside enabled ones, dtype and cache_enabled
// inheritance, the dtype check, and thread-locality. An op's output dtype is the observable: matmul
// of two f32 matrices gives f32 with autocast off and the region's dtype with it on.
#include <future>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

struct Operands {
  Tensor a, b;
};

Operands f32_operands() {
  Generator gen(3);
  Tensor a = randn({2, 3}, gen);
  Tensor b = randn({3, 2}, gen);
  return {a, b};
}

Tensor parameter(const Shape& shape) {
  Generator gen(4);
  Tensor p = randn(shape, gen);
  p.requires_grad_();
  return p;
}

TEST(autocast_region_test, enabled_flag_is_true_inside_a_region_and_false_after) {
  const Operands m = f32_operands();
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f32);
  {
    AutocastGuard region;
    EXPECT_TRUE(autocast_enabled());
    EXPECT_EQ(autocast_dtype(), DType::f16) << "f16 is CUDA's default lower-precision dtype";
    EXPECT_TRUE(autocast_cache_enabled());
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f16);
  }
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), DType::f16);
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f32);
}

TEST(autocast_region_test, nested_regions_restore_the_outer_dtype_when_they_end) {
  const Operands m = f32_operands();
  AutocastGuard outer(DType::f16);
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f16);
  {
    AutocastGuard inner(DType::bf16);
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::bf16);
  }
  EXPECT_TRUE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), DType::f16);
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f16);
}

TEST(autocast_region_test, disabled_region_inside_an_enabled_one_runs_ops_in_their_input_dtypes) {
  const Operands m = f32_operands();
  const Tensor w = parameter({4, 3});
  AutocastGuard outer;
  const Tensor h = linear(m.a, w);  // f16, and w's f16 cast is now cached
  ASSERT_EQ(h.dtype(), DType::f16);
  ASSERT_EQ(autocast_cache_size(), 1u);
  {
    AutocastGuard disabled(std::nullopt, /*enabled=*/false);
    EXPECT_FALSE(autocast_enabled());
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f32);
    EXPECT_EQ(relu(h).dtype(), DType::f16) << "an earlier f16 result stays f16";
    EXPECT_EQ(softmax(h, 1).dtype(), DType::f16) << "no fp32_set_opt_dtype either";
    EXPECT_EQ(linear(m.a, w).dtype(), DType::f32);
  }
  EXPECT_TRUE(autocast_enabled());
  EXPECT_EQ(autocast_cache_size(), 1u) << "leaving a nested (disabled) region must not clear the cache";
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f16);
}

TEST(autocast_region_test, nested_region_without_a_dtype_inherits_bf16_from_the_enclosing_region) {
  const Operands m = f32_operands();
  AutocastGuard outer(DType::bf16);
  {
    AutocastGuard inner;
    EXPECT_EQ(autocast_dtype(), DType::bf16);
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::bf16);
  }
  {
    // A disabled region inherits it too, and an enabled one inside that still sees bf16.
    AutocastGuard disabled(std::nullopt, false);
    AutocastGuard reenabled;
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::bf16);
  }
}

TEST(autocast_region_test, nested_region_inherits_cache_enabled_unless_it_sets_it) {
  const Operands m = f32_operands();
  const Tensor w = parameter({4, 3});
  AutocastGuard outer(std::nullopt, true, /*cache_enabled=*/false);
  EXPECT_FALSE(autocast_cache_enabled());
  {
    AutocastGuard inner;
    EXPECT_FALSE(autocast_cache_enabled());
    linear(m.a, w);
    EXPECT_EQ(autocast_cache_size(), 0u);
  }
  {
    AutocastGuard inner(std::nullopt, true, /*cache_enabled=*/true);
    EXPECT_TRUE(autocast_cache_enabled());
    linear(m.a, w);
    EXPECT_EQ(autocast_cache_size(), 1u);
  }
  EXPECT_FALSE(autocast_cache_enabled());
}

TEST(autocast_region_test, rejects_f32_as_the_lower_precision_dtype) {
  EXPECT_THROW_MSG(AutocastGuard region(DType::f32), DTypeError, "autocast", "f16 or bf16", "got f32", "hint:");
  EXPECT_THROW_MSG(AutocastGuard region(DType::f64), DTypeError, "f16 or bf16", "got f64");
  // The failed constructor changed nothing.
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), DType::f16);
  const Operands m = f32_operands();
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f32);
}

TEST(autocast_region_test, region_on_one_thread_does_not_affect_another_thread) {
  const Operands m = f32_operands();
  {
    AutocastGuard region;
    bool other_enabled = true;
    DType other_dtype = DType::f16;
    std::thread other([&] {
      other_enabled = autocast_enabled();
      other_dtype = matmul(m.a, m.b).dtype();
    });
    other.join();
    EXPECT_FALSE(other_enabled);
    EXPECT_EQ(other_dtype, DType::f32);
    EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f16);
  }
  // The other way round: a bf16 region held open on another thread leaves this one alone.
  std::promise<DType> entered;
  std::promise<void> checked;
  std::future<void> checked_future = checked.get_future();
  std::thread other([&] {
    AutocastGuard region(DType::bf16);
    entered.set_value(matmul(m.a, m.b).dtype());
    checked_future.wait();
  });
  EXPECT_EQ(entered.get_future().get(), DType::bf16);
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(matmul(m.a, m.b).dtype(), DType::f32);
  checked.set_value();
  other.join();
}

TEST(autocast_region_test, a_disabled_region_given_f32_does_not_pass_it_on_to_a_nested_region) {
  AutocastGuard off(DType::f32, /*enabled=*/false);
  EXPECT_FALSE(autocast_enabled());
  AutocastGuard inner;  // inherits the dtype: must still be a lower-precision one
  EXPECT_TRUE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), DType::f16);
}

}  // namespace
}  // namespace ampscope
