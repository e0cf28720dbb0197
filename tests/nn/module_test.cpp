// tests/nn/module_test.cpp: the Module tree of core/nn.h: paths, parameter order and names, duplicate
// names, modes, zero_grad, scopes and dtype/device conversion.
//
// Expected names and orders are PyTorch's: named_parameters() walks named_modules() depth-first and
// lists each module's own parameters before its children's (torch.nn.Module.named_parameters).
#include "core/nn.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "tests/test_support.h"

namespace {

using ampscope::DType;
using ampscope::Generator;
using ampscope::Shape;
using ampscope::Tensor;
namespace nn = ampscope::nn;

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// Registers parameters before and after a child, so that "own parameters first" is visible.
class Toy : public nn::Module {
 public:
  explicit Toy(Generator& gen) : Module("Toy") {
    register_parameter("scale", ampscope::ones({2}));
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2, gen));
    register_parameter("shift", ampscope::zeros({2}));
  }
  std::shared_ptr<nn::Linear> fc;

 protected:
  Tensor forward(const Tensor& x) override {
    return ampscope::add(ampscope::mul((*fc)(x), parameter("scale")), parameter("shift"));
  }
};

// A container with named children, run in order (like a user's model class).
class Holder : public nn::Module {
 public:
  Holder() : Module("Holder") {}
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& [name, m] : children()) y = (*m)(y);
    return y;
  }
};

// Remembers the autograd scope its forward ran in.
class ScopeProbe : public nn::Module {
 public:
  ScopeProbe() : Module("ScopeProbe") {}
  std::string seen;

 protected:
  Tensor forward(const Tensor& x) override {
    seen = ampscope::current_scope();
    return x;
  }
};

TEST(module_test, lists_own_parameters_before_children_in_registration_order) {
  Generator gen(0);
  Toy toy(gen);
  EXPECT_EQ(names_of(toy.named_parameters()), (std::vector<std::string>{"scale", "shift", "fc.weight", "fc.bias"}));
  const std::vector<Tensor> params = toy.parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[2].shape(), (Shape{2, 3}));
  EXPECT_EQ(params[3].shape(), (Shape{2}));
  EXPECT_EQ(toy.num_parameters(), 2 + 2 + 6 + 2);
}

TEST(module_test, names_each_parameter_tensor_with_its_full_path) {
  Generator gen(0);
  Holder root;
  root.add("toy", std::make_shared<Toy>(gen));
  for (const auto& [name, p] : root.named_parameters()) EXPECT_EQ(p.name(), name);
  EXPECT_EQ(names_of(root.named_parameters()),
            (std::vector<std::string>{"toy.scale", "toy.shift", "toy.fc.weight", "toy.fc.bias"}));
}

TEST(module_test, gives_the_full_path_to_a_module_registered_below_a_parent_that_is_named_later) {
  Generator gen(0);
  auto inner = std::make_shared<nn::Sequential>();
  auto fc = inner->push_back(std::make_shared<nn::Linear>(3, 2, gen));
  const Tensor weight = fc->weight();  // a handle taken before any parent exists
  EXPECT_EQ(fc->name(), "0");
  EXPECT_EQ(weight.name(), "0.weight");

  auto encoder = std::make_shared<Holder>();
  encoder->add("layers", inner);
  EXPECT_EQ(fc->name(), "layers.0");
  EXPECT_EQ(weight.name(), "layers.0.weight");

  Holder root;
  root.add("encoder", encoder);
  EXPECT_EQ(inner->name(), "encoder.layers");
  EXPECT_EQ(fc->name(), "encoder.layers.0");
  EXPECT_EQ(weight.name(), "encoder.layers.0.weight");
  EXPECT_EQ(fc->bias().name(), "encoder.layers.0.bias");
  EXPECT_EQ(fc->describe(), "Linear 'encoder.layers.0'");
  EXPECT_EQ(root.describe(), "Holder");

  // Names relative to the module asked, as in PyTorch; the tensor keeps the root-relative path.
  EXPECT_EQ(names_of(encoder->named_parameters()), (std::vector<std::string>{"layers.0.weight", "layers.0.bias"}));
  // A module added after its parent is named still gets the whole path.
  auto late = inner->push_back(std::make_shared<nn::Linear>(2, 2, gen));
  EXPECT_EQ(late->weight().name(), "encoder.layers.1.weight");
}

TEST(module_test, lists_modules_depth_first_starting_with_itself) {
  Generator gen(0);
  Holder root;
  auto toy = root.add("toy", std::make_shared<Toy>(gen));
  root.add("act", std::make_shared<nn::ReLU>());
  std::vector<std::string> paths;
  for (const auto& [path, m] : root.named_modules()) paths.push_back(path + ":" + m->type_name());
  EXPECT_EQ(paths, (std::vector<std::string>{":Holder", "toy:Toy", "toy.fc:Linear", "act:ReLU"}));
  ASSERT_EQ(root.named_children().size(), 2u);
  EXPECT_EQ(root.named_children()[0].second, toy);
  EXPECT_EQ(root.child("toy"), toy);
}

TEST(module_test, rejects_a_taken_name_naming_both_entries) {
  Generator gen(0);
  Holder root;
  auto toy = root.add("toy", std::make_shared<Toy>(gen));
  // Child over child: both the new module's type and the one already there.
  EXPECT_THROW_MSG(toy->register_module("fc", std::make_shared<nn::ReLU>()), ampscope::Error, "Toy 'toy'",
                   "cannot register module 'fc' (ReLU)", "already taken by module Linear 'toy.fc'");
  // Parameter over parameter, with both shapes.
  EXPECT_THROW_MSG(toy->register_parameter("scale", ampscope::ones({5})), ampscope::Error,
                   "cannot register parameter 'scale' (shape [5])",
                   "already taken by parameter 'toy.scale' (shape [2])");
  // Across kinds.
  EXPECT_THROW_MSG(toy->register_buffer("fc", ampscope::ones({1})), ampscope::Error, "cannot register buffer 'fc'",
                   "already taken by module Linear 'toy.fc'");
  EXPECT_THROW_MSG(toy->register_module("shift", std::make_shared<nn::ReLU>()), ampscope::Error,
                   "cannot register module 'shift' (ReLU)", "already taken by parameter 'toy.shift'");
  // Nothing was added by the failed calls.
  EXPECT_EQ(toy->named_parameters().size(), 4u);
  EXPECT_EQ(toy->named_children().size(), 1u);
}

TEST(module_test, rejects_names_with_dots_empty_names_and_cycles) {
  Holder root;
  EXPECT_THROW_MSG(root.register_module("a.b", std::make_shared<nn::ReLU>()), ampscope::Error, "'a.b' contains '.'",
                   "hint:");
  EXPECT_THROW_MSG(root.register_parameter("", ampscope::ones({1})), ampscope::Error, "empty name");
  EXPECT_THROW_MSG(root.register_module("none", std::shared_ptr<nn::ReLU>()), ampscope::Error, "null");
  auto a = std::make_shared<Holder>();
  auto b = a->add("b", std::make_shared<Holder>());
  EXPECT_THROW_MSG(b->register_module("a", a), ampscope::Error, "cycle");
  EXPECT_THROW_MSG(a->register_module("self", a), ampscope::Error, "cycle");
}

TEST(module_test, makes_registered_parameters_leaves_that_require_grad) {
  Holder root;
  const Tensor plain = ampscope::ones({3});
  const Tensor p = root.register_parameter("p", plain);
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(p.is_leaf());
  EXPECT_EQ(p.name(), "p");

  // A tensor produced by a recorded op is cut from its graph first.
  const Tensor w = ampscope::ones({2}).requires_grad_();
  const Tensor produced = ampscope::mul(w, 3.0);
  ASSERT_FALSE(produced.is_leaf());
  const Tensor q = root.register_parameter("q", produced);
  EXPECT_TRUE(q.is_leaf());
  EXPECT_TRUE(q.requires_grad());
  EXPECT_EQ(q.values(), (std::vector<double>{3.0, 3.0}));

  EXPECT_THROW_MSG(root.register_parameter("steps", ampscope::zeros({1}, {.dtype = DType::i64})), ampscope::DTypeError,
                   "Holder", "parameter 'steps' must have a floating dtype, got i64", "register_buffer");
  const Tensor steps = root.register_buffer("steps", ampscope::zeros({1}, {.dtype = DType::i64}));
  EXPECT_FALSE(steps.requires_grad());
  EXPECT_EQ(names_of(root.named_buffers()), (std::vector<std::string>{"steps"}));
  EXPECT_EQ(root.buffer("steps").dtype(), DType::i64);
}

TEST(module_test, lookup_of_a_missing_parameter_lists_the_ones_there) {
  Generator gen(0);
  nn::Linear fc(2, 2, gen);
  EXPECT_THROW_MSG(fc.parameter("bais"), ampscope::IndexError, "Linear has no parameter 'bais'", "weight, bias");
  EXPECT_FALSE(nn::Linear(2, 2, gen, /*bias=*/false).bias().defined());
}

TEST(module_test, switches_train_and_eval_through_the_whole_tree) {
  Generator gen(0);
  Holder root;
  auto toy = root.add("toy", std::make_shared<Toy>(gen));
  for (const auto& [path, m] : root.named_modules()) EXPECT_TRUE(m->is_training()) << path;
  root.eval();
  for (const auto& [path, m] : root.named_modules()) EXPECT_FALSE(m->is_training()) << path;
  toy->train();  // a subtree alone
  EXPECT_FALSE(root.is_training());
  EXPECT_TRUE(toy->fc->is_training());
  root.train(true);
  for (const auto& [path, m] : root.named_modules()) EXPECT_TRUE(m->is_training()) << path;
}

TEST(module_test, zero_grad_leaves_every_gradient_undefined) {
  Generator gen(0);
  Toy toy(gen);
  ampscope::sum(toy(ampscope::ones({4, 3}))).backward();
  for (const auto& [name, p] : toy.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  toy.zero_grad();
  for (const auto& [name, p] : toy.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
}

TEST(module_test, pushes_its_path_as_the_scope_while_it_runs) {
  Holder root;
  auto inner = root.add("inner", std::make_shared<Holder>());
  auto probe = inner->add("probe", std::make_shared<ScopeProbe>());
  EXPECT_EQ(ampscope::current_scope(), "");
  root(ampscope::ones({1}));
  EXPECT_EQ(probe->seen, "inner.probe");
  EXPECT_EQ(ampscope::current_scope(), "");  // restored after the call
}

TEST(module_test, to_f16_replaces_parameters_with_named_f16_leaves_in_the_same_order) {
  Generator gen(3);
  Holder root;
  auto toy = root.add("toy", std::make_shared<Toy>(gen));
  ampscope::sum(root(ampscope::ones({4, 3}))).backward();  // grads exist and must follow
  const auto before = root.named_parameters();

  root.to(DType::f16);
  const auto after = root.named_parameters();
  ASSERT_EQ(names_of(after), names_of(before));
  for (std::size_t i = 0; i < after.size(); ++i) {
    const Tensor& old = before[i].second;
    const Tensor& now = after[i].second;
    SCOPED_TRACE(after[i].first);
    EXPECT_EQ(now.dtype(), DType::f16);
    EXPECT_EQ(now.name(), after[i].first);
    EXPECT_TRUE(now.is_leaf());
    EXPECT_TRUE(now.requires_grad());
    EXPECT_EQ(now.shape(), old.shape());
    EXPECT_NE(now.id(), old.id());
    // Each value is the f16 rounding of the f32 one (reference: g++'s _Float16).
    const std::vector<double> a = old.values(), b = now.values();
    for (std::size_t j = 0; j < a.size(); ++j) {
      EXPECT_EQ(b[j], ampscope::testing::reference_f16(static_cast<float>(a[j])));
    }
    ASSERT_TRUE(now.grad().defined());
    EXPECT_EQ(now.grad().dtype(), DType::f16);
  }
  // The layer reads the new tensors.
  EXPECT_EQ(toy->fc->weight().dtype(), DType::f16);
  EXPECT_EQ(toy->fc->weight().id(), after[2].second.id());
  const Tensor y = root(ampscope::ones({4, 3}, {.dtype = DType::f16}));
  EXPECT_EQ(y.dtype(), DType::f16);
  EXPECT_TRUE(y.requires_grad());

  // Converting to the dtype already held keeps the tensors.
  root.to(DType::f16);
  EXPECT_EQ(root.named_parameters()[0].second.id(), after[0].second.id());
  root.to(DType::bf16);
  for (const auto& [name, p] : root.named_parameters()) EXPECT_EQ(p.dtype(), DType::bf16) << name;
}

TEST(module_test, to_converts_floating_buffers_only_and_refuses_integer_dtypes) {
  Holder root;
  root.register_buffer("running", ampscope::ones({2}));
  root.register_buffer("count", ampscope::zeros({1}, {.dtype = DType::i64}));
  root.to(DType::f16);
  EXPECT_EQ(root.buffer("running").dtype(), DType::f16);
  EXPECT_EQ(root.buffer("running").name(), "running");
  EXPECT_EQ(root.buffer("count").dtype(), DType::i64);
  EXPECT_THROW_MSG(root.to(DType::i64), ampscope::DTypeError, "Holder", "to(i64)", "floating");
}

TEST(module_test, tied_parameters_are_listed_once_and_stay_tied_after_to) {
  Generator gen(0);
  Holder root;
  auto a = root.add("a", std::make_shared<nn::Linear>(2, 2, gen));
  auto b = root.add("b", std::make_shared<Holder>());
  b->register_parameter("tied", a->weight());
  EXPECT_EQ(names_of(root.named_parameters()), (std::vector<std::string>{"a.weight", "a.bias"}));
  root.to(DType::f16);
  EXPECT_EQ(b->parameter("tied").id(), a->weight().id());
  EXPECT_EQ(a->weight().dtype(), DType::f16);
}

TEST(module_test, to_cuda_moves_every_parameter_and_keeps_names) {
  SKIP_WITHOUT_GPU();
  Generator gen(0);
  Toy toy(gen);
  toy.to(ampscope::Device::cuda());
  for (const auto& [name, p] : toy.named_parameters()) {
    EXPECT_TRUE(p.device().is_cuda()) << name;
    EXPECT_EQ(p.name(), name);
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << name;
  }
}

}  // namespace
