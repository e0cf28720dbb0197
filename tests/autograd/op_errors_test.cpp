// Bad input to the training ops: each error names the op, the module it ran in and the values.
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

TEST(op_errors_test, attention_refuses_q_k_v_with_different_batch_dimensions) {
  // [2, 3, 4, 8] against [3, 2, 4, 8] has the same element count: a reshape alone would mix batches and heads.
  const Tensor q = zeros({2, 3, 4, 8}), kv = zeros({3, 2, 4, 8});
  EXPECT_THROW_MSG(scaled_dot_product_attention(q, kv, kv), ShapeError, "scaled_dot_product_attention:",
                   "[2, 3, 4, 8]", "[3, 2, 4, 8]", "batch");
}

TEST(op_errors_test, softmax_refuses_an_integer_result_dtype) {
  EXPECT_THROW_MSG(softmax(zeros({2, 3}), 1, DType::i64), DTypeError, "softmax:", "i64", "hint:");
}

TEST(op_errors_test, errors_inside_a_module_scope_name_the_module) {
  ScopeGuard scope("blocks.0.attn");
  EXPECT_THROW_MSG(bmm(zeros({2, 3, 4}), zeros({2, 5, 6})), ShapeError, "bmm (in module 'blocks.0.attn')",
                   "[2, 3, 4]", "[2, 5, 6]");
}

TEST(op_errors_test, linear_names_both_feature_counts) {
  EXPECT_THROW_MSG(linear(zeros({64, 9216}), zeros({128, 960})), ShapeError, "linear:", "9216", "960", "hint:");
}

TEST(op_errors_test, nll_loss_of_a_nan_stores_the_canonical_nan) {
  const Tensor logp = full({1, 2}, std::numeric_limits<double>::quiet_NaN());
  const Tensor target = from_values({1}, {1}, {DType::i64});
  const Tensor loss = nll_loss(logp, target, Reduction::none);
  std::uint32_t bits = 0;
  std::memcpy(&bits, loss.data(), sizeof bits);
  EXPECT_EQ(bits, 0x7FFFFFFFu);
}

TEST(op_errors_test, nll_loss_names_an_out_of_range_target_and_its_row) {
  const Tensor target = from_values({1, 12}, {2}, {DType::i64});
  EXPECT_THROW_MSG(nll_loss(zeros({2, 10}), target), IndexError, "nll_loss:", "target 12", "row 1", "10 classes");
}

TEST(op_errors_test, embedding_names_an_out_of_range_index) {
  const Tensor idx = from_values({0, 7}, {2}, {DType::i64});
  EXPECT_THROW_MSG(embedding(idx, zeros({5, 3})), IndexError, "embedding:", "index 7", "position 1", "5 embeddings");
}

}  // namespace
}  // namespace ampscope
