// tests/autograd/autograd_test.cpp: the engine of core/autograd.h, with gradients small enough to work
// out by hand (the values in the comments): accumulation into .grad, no_grad and detach, casts, freed
// graphs and retain_graph, the errors for misuse, and scope names on recorded nodes.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using ::ampscope::testing::reference_f16;

Tensor leaf(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f32) {
  Tensor t = from_values(values, shape, {dtype});
  t.requires_grad_();
  return t;
}

TEST(autograd_test, accumulates_gradients_across_two_backward_calls) {
  Tensor w = leaf({1.0, 2.0}, {2});
  EXPECT_FALSE(w.grad().defined()) << "no gradient before any backward()";
  sum(mul(w, w)).backward();  // d/dw sum(w^2) = 2w = [2, 4]
  EXPECT_EQ(w.grad().values(), (std::vector<double>{2.0, 4.0}));
  sum(mul(w, w)).backward();  // a second graph adds another 2w
  EXPECT_EQ(w.grad().values(), (std::vector<double>{4.0, 8.0}));
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_FALSE(w.grad().requires_grad()) << "the accumulation itself is not recorded";
}

TEST(autograd_test, sums_the_gradients_of_two_uses_of_one_leaf_in_one_graph) {
  Tensor w = leaf({1.0, -2.0}, {2});
  // L = sum(3w + w*w): dL/dw = 3 + 2w = [5, -1]; the mul uses w twice as well.
  sum(add(mul(w, 3.0), mul(w, w))).backward();
  EXPECT_EQ(w.grad().values(), (std::vector<double>{5.0, -1.0}));
}

TEST(autograd_test, uses_one_accumulator_node_for_every_use_of_a_leaf) {
  Tensor w = leaf({1.0}, {1});
  const Tensor a = mul(w, 2.0), b = mul(w, 3.0);
  ASSERT_EQ(a.grad_fn()->next().size(), 1u);
  ASSERT_EQ(b.grad_fn()->next().size(), 1u);
  EXPECT_EQ(a.grad_fn()->next()[0], b.grad_fn()->next()[0]);
  EXPECT_EQ(a.grad_fn()->next()[0]->op(), "AccumulateGrad");
}

TEST(autograd_test, records_nothing_inside_no_grad_guard) {
  Tensor w = leaf({1.0, 2.0}, {2});
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    const Tensor y = exp(mul(w, 2.0));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_TRUE(y.is_leaf());
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled()) << "a nested guard restores the outer guard's mode, not 'on'";
  }
  EXPECT_TRUE(grad_enabled());
  const Tensor z = mul(w, 2.0);
  EXPECT_TRUE(z.requires_grad());
  ASSERT_NE(z.grad_fn(), nullptr);
  EXPECT_EQ(z.grad_fn()->op(), "mul");
}

TEST(autograd_test, detach_cuts_the_graph) {
  Tensor w = leaf({1.0, 3.0}, {2});
  const Tensor y = mul(w, 2.0).detach();
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  // L = sum(y * w) with y = 2w held constant: dL/dw = y = [2, 6], not 4w = [4, 12].
  sum(mul(y, w)).backward();
  EXPECT_EQ(w.grad().values(), (std::vector<double>{2.0, 6.0}));
}

TEST(autograd_test, detach_shares_the_data_of_the_original) {
  Tensor w = leaf({1.0, 3.0}, {2});
  const Tensor d = w.detach();
  EXPECT_TRUE(d.shares_storage_with(w));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(w.requires_grad()) << "detach leaves the original alone";
}

TEST(autograd_test, gives_an_f32_parameter_an_f32_grad_through_an_f16_cast) {
  // w = 0.1f is not exact in f16: w16 = f16(0.1) = 0.0999755859375. L = sum(w16 * w16) has dL/dw16 =
  // 2 w16 (exact in f16, a doubling), and the cast's backward widens it to f32 unchanged.
  Tensor w = leaf({0.1, -3.0}, {2});
  const Tensor w16 = w.to(DType::f16);
  EXPECT_EQ(w16.dtype(), DType::f16);
  ASSERT_NE(w16.grad_fn(), nullptr);
  EXPECT_EQ(w16.grad_fn()->op(), "to");
  sum(mul(w16, w16)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().values(), (std::vector<double>{2.0 * reference_f16(0.1f), -6.0}));
}

TEST(autograd_test, refuses_a_second_backward_through_a_freed_graph_naming_the_op) {
  Tensor w = leaf({0.5, 1.5}, {2});
  Tensor loss;
  {
    ScopeGuard scope("head");
    loss = sum(exp(w));
  }
  loss.backward();
  ASSERT_NE(loss.grad_fn(), nullptr);
  EXPECT_TRUE(loss.grad_fn()->released()) << "backward() frees the graph's saved tensors";
  EXPECT_THROW_MSG(loss.backward(), Error, "second time", "'sum' in 'head'", "freed", "retain_graph=true");
}

TEST(autograd_test, frees_every_node_of_the_graph_not_only_the_root) {
  Tensor w = leaf({0.5, 1.5}, {2});
  const Tensor e = exp(w);
  const Tensor loss = sum(mul(e, 2.0));
  loss.backward();
  EXPECT_TRUE(e.grad_fn()->released()) << "exp's saved output is freed too";
  // A new root over the old, freed exp node: the engine reaches it and refuses, naming exp.
  EXPECT_THROW_MSG(sum(e).backward(), Error, "'exp'", "retain_graph");
}

TEST(autograd_test, retain_graph_allows_a_second_backward_that_accumulates) {
  Tensor w = leaf({0.0, 1.0}, {2});
  const Tensor loss = sum(mul(w, w));
  loss.backward(Tensor(), true);  // 2w = [0, 2]
  EXPECT_FALSE(loss.grad_fn()->released());
  loss.backward();  // once more: [0, 4]
  EXPECT_EQ(w.grad().values(), (std::vector<double>{0.0, 4.0}));
  EXPECT_TRUE(loss.grad_fn()->released()) << "the second backward() did not retain the graph";
}

TEST(autograd_test, refuses_backward_of_a_non_scalar_without_a_gradient_naming_the_element_count) {
  Tensor w = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor y = mul(w, 2.0);
  EXPECT_THROW_MSG(y.backward(), Error, "backward:", "only for scalar outputs", "6 elements", "[2, 3]", "hint:");
}

TEST(autograd_test, back_propagates_an_explicit_gradient_from_a_non_scalar) {
  Tensor w = leaf({1, 2, 3}, {3});
  mul(w, 2.0).backward(from_values({1.0, -1.0, 0.5}, {3}));  // 2 * gradient
  EXPECT_EQ(w.grad().values(), (std::vector<double>{2.0, -2.0, 1.0}));
}

TEST(autograd_test, refuses_backward_of_a_tensor_that_does_not_require_grad) {
  const Tensor x = from_values({1.0}, {});
  EXPECT_THROW_MSG(x.backward(), Error, "backward:", "does not require grad", "hint:");
}

TEST(autograd_test, refuses_to_turn_off_requires_grad_on_a_non_leaf_naming_its_op) {
  Tensor w = leaf({1.0}, {1});
  Tensor y = mul(w, 2.0);
  // As in PyTorch: asking an op's output to require grad is a no-op, turning it off is an error.
  EXPECT_NO_THROW(y.requires_grad_(true));
  EXPECT_TRUE(y.requires_grad());
  EXPECT_THROW_MSG(y.requires_grad_(false), Error, "requires_grad_:", "output of 'mul'", "not a leaf", "detach()");
}

TEST(autograd_test, refuses_requires_grad_on_an_integer_tensor) {
  Tensor i = arange(3, {DType::i64});
  EXPECT_THROW_MSG(i.requires_grad_(), DTypeError, "requires_grad_:", "only floating", "i64");
  Tensor b = from_values({1, 0}, {2}, {DType::boolean});
  EXPECT_THROW_MSG(b.requires_grad_(), DTypeError, "bool");
}

TEST(autograd_test, refuses_in_place_writes_to_a_leaf_that_requires_grad_outside_no_grad) {
  Tensor w = leaf({1.0, 2.0}, {2});
  w.set_name("fc.weight");
  EXPECT_THROW_MSG(w.fill_(0.0), Error, "fill_:", "'fc.weight'", "requires grad", "NoGradGuard");
  EXPECT_THROW_MSG(w.copy_(from_values({5.0, 6.0}, {2})), Error, "copy_:", "'fc.weight'", "NoGradGuard");
  EXPECT_EQ(w.values(), (std::vector<double>{1.0, 2.0})) << "a refused write leaves the data alone";
}

TEST(autograd_test, allows_in_place_writes_to_a_leaf_inside_no_grad) {
  Tensor w = leaf({1.0, 2.0}, {2});
  {
    NoGradGuard guard;
    w.fill_(3.0);
    EXPECT_EQ(w.values(), (std::vector<double>{3.0, 3.0}));
    w.copy_(from_values({5.0, 6.0}, {2}));
  }
  EXPECT_EQ(w.values(), (std::vector<double>{5.0, 6.0}));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  sum(mul(w, w)).backward();  // still a working parameter: 2w = [10, 12]
  EXPECT_EQ(w.grad().values(), (std::vector<double>{10.0, 12.0}));
}

TEST(autograd_test, records_the_scope_guard_name_on_each_node) {
  Tensor w = leaf({1.0}, {1});
  EXPECT_EQ(current_scope(), "");
  Tensor inner, outer;
  {
    ScopeGuard encoder("encoder");
    outer = mul(w, 2.0);
    {
      ScopeGuard fc("encoder.fc1");
      EXPECT_EQ(current_scope(), "encoder.fc1");
      inner = exp(outer);
    }
    EXPECT_EQ(current_scope(), "encoder");
  }
  EXPECT_EQ(current_scope(), "");
  EXPECT_EQ(outer.grad_fn()->scope(), "encoder");
  EXPECT_EQ(inner.grad_fn()->scope(), "encoder.fc1");
  EXPECT_EQ(inner.grad_fn()->op(), "exp");
  EXPECT_EQ(sum(inner).grad_fn()->scope(), "");
}

TEST(autograd_test, runs_nodes_newest_first_so_a_shared_input_gets_every_contribution) {
  // A diamond: a = 2w feeds b = a * a and c = 3a; L = sum(b + c). dL/da = 2a + 3, dL/dw = 2 (2a + 3)
  // = 2 (4w + 3): for w = 1, 14. The node of a must run after both b's and c's, or one part is lost.
  Tensor w = leaf({1.0}, {1});
  const Tensor a = mul(w, 2.0);
  sum(add(mul(a, a), mul(a, 3.0))).backward();
  EXPECT_EQ(w.grad().values(), (std::vector<double>{14.0}));
}

TEST(autograd_test, gives_no_gradient_to_inputs_that_do_not_require_it) {
  Tensor w = leaf({2.0}, {1});
  const Tensor x = from_values({5.0}, {1});
  sum(mul(w, x)).backward();
  EXPECT_EQ(w.grad().values(), (std::vector<double>{5.0}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(autograd_test, copying_a_tensor_that_requires_grad_into_a_plain_buffer_is_refused) {
  // The copy would carry the values but not the gradient path: w's gradient would silently be 1, not 3.
  Tensor w = leaf({1.0, 2.0}, {2});
  w.set_name("w");
  Tensor buf = zeros({2});
  EXPECT_THROW_MSG(buf.copy_(mul(w, 2.0)), Error, "copy_:", "requires grad", "hint:");
  EXPECT_THROW_MSG(buf.copy_(w), Error, "'w'");
  NoGradGuard no_grad;
  EXPECT_NO_THROW(buf.copy_(w));
}

TEST(autograd_test, set_grad_refuses_a_gradient_of_another_dtype) {
  Tensor w = leaf({1.0, 2.0}, {2}, DType::f16);
  EXPECT_THROW_MSG(w.set_grad(zeros({2})), ShapeError, "set_grad:", "(f32)", "f16");
}

TEST(autograd_test, accumulates_into_the_existing_grad_tensor_in_place) {
  // A handle to .grad taken between two backward passes sees the sum, as in PyTorch.
  Tensor w = leaf({1.0, 2.0}, {2});
  sum(mul(w, 3.0)).backward();
  const Tensor held = w.grad();
  sum(mul(w, 4.0)).backward();
  EXPECT_EQ(held.values(), (std::vector<double>{7.0, 7.0}));
  EXPECT_TRUE(held.shares_storage_with(w.grad()));
}

}  // namespace
}  // namespace ampscope
