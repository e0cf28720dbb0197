// tests/autocast/autocast_probe_test.cpp: why each op ran in its dtype, as a probe hook hears it
// (core/probe_hook.h), and the overrides of core/autocast.h.
//
// An event carries the policy from the table, a reason, the casts autocast inserted and the output. Only
// ops the user called are reported: the sub and mul inside mse_loss are not, while the steps of a
// composite (cross_entropy's log_softmax and nll_loss, attention's bmm/mul/masked_fill/softmax/bmm) are,
// each with the module it ran in. Overrides replace the table's policy inside enabled regions only and
// say so in the reason.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/nn.h"
#include "core/ops.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "core/tensor.h"
#include "samples/models.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

using probe::AutocastPolicy;

// What a probe saw of one op, copied out of the event (whose fields are references).
struct SeenOp {
  std::string op;
  std::string scope;
  probe::AutocastInfo autocast;
  std::vector<DType> inputs;  // of the defined inputs, after autocast's casts
  DType output = DType::f32;
};

class RecordingHook : public probe::Hook {
 public:
  void on_op(const probe::OpEvent& e) override {
    SeenOp seen{std::string(e.op), e.scope, e.autocast, {}, e.output.dtype()};
    for (const Tensor& t : e.inputs) {
      if (t.defined()) seen.inputs.push_back(t.dtype());
    }
    ops.push_back(std::move(seen));
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const SeenOp& op : ops) out.push_back(op.op);
    return out;
  }
  std::vector<std::pair<std::string, std::string>> names_and_scopes() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const SeenOp& op : ops) out.emplace_back(op.op, op.scope);
    return out;
  }
  std::vector<SeenOp> ops;
};

// Wants linear only, and counts how often it was asked.
class LinearOnlyHook : public RecordingHook {
 public:
  bool wants_op(std::string_view op, const std::string&) override {
    ++asked;
    return op == "linear";
  }
  int asked = 0;
};

Tensor param(Tensor t) {
  t.requires_grad_();
  return t;
}

bool contains(const std::string& text, std::string_view piece) { return text.find(piece) != std::string::npos; }

// ---- why this dtype ----

TEST(autocast_probe_test, linear_reports_lower_precision_fp_and_the_casts_of_all_three_inputs) {
  Generator gen(1);
  const Tensor x = randn({2, 4}, gen), w = param(randn({3, 4}, gen)), b = param(randn({3}, gen));
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    linear(x, w, b);
  }
  ASSERT_EQ(hook->ops.size(), 1u);
  const SeenOp& e = hook->ops[0];
  EXPECT_EQ(e.op, "linear");
  EXPECT_EQ(e.scope, "");
  EXPECT_TRUE(e.autocast.active);
  EXPECT_FALSE(e.autocast.overridden);
  EXPECT_EQ(e.autocast.policy, AutocastPolicy::lower_precision_fp);
  EXPECT_EQ(probe::policy_name(e.autocast.policy), "lower_precision_fp");
  EXPECT_TRUE(contains(e.autocast.reason, "lower_precision_fp")) << e.autocast.reason;
  ASSERT_EQ(e.autocast.casts.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(e.autocast.casts[i].input, i);
    EXPECT_EQ(e.autocast.casts[i].from, DType::f32);
    EXPECT_EQ(e.autocast.casts[i].to, DType::f16);
  }
  EXPECT_EQ(e.inputs, (std::vector<DType>{DType::f16, DType::f16, DType::f16})) << "the inputs as the op saw them";
  EXPECT_EQ(e.output, DType::f16);
}

TEST(autocast_probe_test, softmax_reports_fp32_set_opt_dtype_with_no_casts_and_an_f32_output) {
  Generator gen(2);
  const Tensor x = randn({2, 5}, gen, {.dtype = DType::f16});
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    softmax(x, 1);
  }
  ASSERT_EQ(hook->ops.size(), 1u);
  const SeenOp& e = hook->ops[0];
  EXPECT_TRUE(e.autocast.active);
  EXPECT_EQ(e.autocast.policy, AutocastPolicy::fp32_set_opt_dtype);
  EXPECT_TRUE(contains(e.autocast.reason, "fp32_set_opt_dtype")) << e.autocast.reason;
  EXPECT_TRUE(e.autocast.casts.empty());
  EXPECT_EQ(e.inputs, (std::vector<DType>{DType::f16}));
  EXPECT_EQ(e.output, DType::f32);
}

TEST(autocast_probe_test, fp32_op_reports_the_cast_up_and_not_the_integer_target) {
  Generator gen(3);
  const Tensor logp = log_softmax(randn({3, 4}, gen, {.dtype = DType::f16}), 1, DType::f16);
  const Tensor target = from_values({0, 1, 3}, {3}, {.dtype = DType::i64});
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    nll_loss(logp, target);
  }
  ASSERT_EQ(hook->ops.size(), 1u);
  const SeenOp& e = hook->ops[0];
  EXPECT_EQ(e.autocast.policy, AutocastPolicy::fp32);
  ASSERT_EQ(e.autocast.casts.size(), 1u);
  EXPECT_EQ(e.autocast.casts[0].input, 0);
  EXPECT_EQ(e.autocast.casts[0].from, DType::f16);
  EXPECT_EQ(e.autocast.casts[0].to, DType::f32);
  EXPECT_EQ(e.inputs, (std::vector<DType>{DType::f32, DType::i64}));
  EXPECT_EQ(e.output, DType::f32);
}

TEST(autocast_probe_test, relu_reports_policy_none) {
  Generator gen(4);
  const Tensor x = randn({4}, gen, {.dtype = DType::f16});
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    relu(x);
  }
  ASSERT_EQ(hook->ops.size(), 1u);
  const SeenOp& e = hook->ops[0];
  EXPECT_TRUE(e.autocast.active);
  EXPECT_EQ(e.autocast.policy, AutocastPolicy::none);
  EXPECT_TRUE(e.autocast.casts.empty());
  EXPECT_EQ(e.output, DType::f16);
}

TEST(autocast_probe_test, ops_outside_a_region_are_reported_inactive) {
  Generator gen(5);
  const Tensor x = randn({2, 4}, gen), w = param(randn({3, 4}, gen));
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  linear(x, w);
  {
    AutocastGuard disabled(std::nullopt, /*enabled=*/false);
    linear(x, w);
  }
  ASSERT_EQ(hook->ops.size(), 2u);
  for (const SeenOp& e : hook->ops) {
    EXPECT_FALSE(e.autocast.active);
    EXPECT_EQ(e.autocast.policy, AutocastPolicy::none);
    EXPECT_TRUE(e.autocast.casts.empty());
    EXPECT_EQ(e.output, DType::f32);
  }
}

TEST(autocast_probe_test, ops_called_inside_another_op_are_not_reported) {
  Generator gen(6);
  const Tensor a = randn({3, 4}, gen, {.dtype = DType::f16}), b = randn({3, 4}, gen, {.dtype = DType::f16});
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    mse_loss(a, b);  // computes sub and mul inside
  }
  mse_loss(a, b);
  EXPECT_EQ(hook->names(), (std::vector<std::string>{"mse_loss", "mse_loss"}));
  ASSERT_EQ(hook->ops.size(), 2u);
  EXPECT_EQ(hook->ops[0].autocast.policy, AutocastPolicy::fp32);
  EXPECT_EQ(hook->ops[0].autocast.casts.size(), 2u);
  EXPECT_EQ(hook->ops[0].output, DType::f32);
  EXPECT_EQ(hook->ops[1].output, DType::f16);
}

// A classifier whose loss is part of its forward, so cross_entropy runs inside a module's scope.
class ClassifierWithLoss : public nn::Module {
 public:
  ClassifierWithLoss(Generator& gen, Tensor labels) : Module("ClassifierWithLoss"), labels_(std::move(labels)) {
    fc_ = register_module("fc", std::make_shared<nn::Linear>(4, 3, gen));
  }

 protected:
  Tensor forward(const Tensor& x) override { return cross_entropy((*fc_)(x), labels_); }

 private:
  Tensor labels_;
  std::shared_ptr<nn::Linear> fc_;
};

TEST(autocast_probe_test, cross_entropy_steps_are_reported_one_by_one_with_their_module) {
  Generator gen(7);
  auto model = std::make_shared<nn::Sequential>();
  model->register_module("clf", std::make_shared<ClassifierWithLoss>(gen, from_values({2, 0}, {2}, {.dtype = DType::i64})));
  const Tensor x = randn({2, 4}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  Tensor loss;
  {
    AutocastGuard region;
    loss = (*model)(x);
  }
  using Step = std::pair<std::string, std::string>;
  EXPECT_EQ(hook->names_and_scopes(),
            (std::vector<Step>{{"linear", "clf.fc"}, {"log_softmax", "clf"}, {"nll_loss", "clf"}}));
  ASSERT_EQ(hook->ops.size(), 3u);
  EXPECT_EQ(hook->ops[0].output, DType::f16);
  EXPECT_EQ(hook->ops[1].autocast.policy, AutocastPolicy::fp32_set_opt_dtype);
  EXPECT_EQ(hook->ops[1].output, DType::f32);
  EXPECT_EQ(hook->ops[2].autocast.policy, AutocastPolicy::fp32);
  EXPECT_EQ(hook->ops[2].output, DType::f32);
  EXPECT_EQ(loss.dtype(), DType::f32);
}

TEST(autocast_probe_test, attention_steps_are_reported_one_by_one_with_their_module) {
  Generator gen(8);
  auto model = std::make_shared<nn::Sequential>();
  model->register_module("attn", std::make_shared<nn::CausalSelfAttention>(8, 2, 0.0, gen));
  const Tensor x = randn({1, 3, 8}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    EXPECT_EQ((*model)(x).dtype(), DType::f16);
  }
  using Step = std::pair<std::string, std::string>;
  EXPECT_EQ(hook->names_and_scopes(), (std::vector<Step>{{"linear", "attn.qkv"},
                                                         {"bmm", "attn"},
                                                         {"mul", "attn"},
                                                         {"masked_fill", "attn"},
                                                         {"softmax", "attn"},
                                                         {"bmm", "attn"},
                                                         {"linear", "attn.proj"},
                                                         {"dropout", "attn.dropout"}}));
  // Attention is lower_precision_fp as a whole: its steps all run in f16, softmax included, and insert
  // no casts of their own.
  for (std::size_t i = 1; i <= 5 && i < hook->ops.size(); ++i) {
    EXPECT_EQ(hook->ops[i].output, DType::f16) << hook->ops[i].op;
    EXPECT_TRUE(hook->ops[i].autocast.casts.empty()) << hook->ops[i].op;
    EXPECT_TRUE(hook->ops[i].autocast.active) << hook->ops[i].op;
  }
}

TEST(autocast_probe_test, wants_op_returning_false_suppresses_the_event) {
  Generator gen(9);
  const Tensor x = randn({2, 4}, gen), w = param(randn({3, 4}, gen));
  auto hook = std::make_shared<LinearOnlyHook>();
  probe::HookGuard installed(hook);
  {
    AutocastGuard region;
    softmax(relu(linear(x, w)), 1);
  }
  EXPECT_EQ(hook->names(), (std::vector<std::string>{"linear"}));
  EXPECT_EQ(hook->asked, 3) << "asked about linear, relu and softmax";
}

TEST(autocast_probe_test, hook_guard_restores_the_previous_hook) {
  Generator gen(10);
  const Tensor x = randn({3}, gen);
  auto outer = std::make_shared<RecordingHook>();
  auto inner = std::make_shared<RecordingHook>();
  {
    probe::HookGuard outer_installed(outer);
    {
      probe::HookGuard inner_installed(inner);
      relu(x);
    }
    relu(x);
  }
  relu(x);
  EXPECT_EQ(inner->ops.size(), 1u);
  EXPECT_EQ(outer->ops.size(), 1u);
  EXPECT_EQ(probe::hook(), nullptr);
}

// ---- overrides ----

TEST(autocast_override_test, op_override_runs_softmax_in_f16_and_says_so) {
  Generator gen(11);
  const Tensor x = randn({2, 5}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  AutocastOverrideGuard lower_softmax({.op = "softmax", .precision = Precision::lower});
  Tensor y;
  {
    AutocastGuard region;
    y = softmax(x, 1);
  }
  ASSERT_EQ(y.dtype(), DType::f16);
  {
    // The same as casting by hand and calling softmax without autocast.
    const Tensor expected = softmax(x.to(DType::f16), 1);
    EXPECT_EQ(y.values(), expected.values());
  }
  ASSERT_GE(hook->ops.size(), 1u);
  const SeenOp& e = hook->ops[0];
  EXPECT_TRUE(e.autocast.overridden);
  EXPECT_TRUE(contains(e.autocast.reason, "override")) << e.autocast.reason;
  EXPECT_TRUE(contains(e.autocast.reason, "softmax")) << e.autocast.reason;
  EXPECT_EQ(e.autocast.policy, AutocastPolicy::fp32_set_opt_dtype) << "the table's policy is still reported";
  ASSERT_EQ(e.autocast.casts.size(), 1u);
  EXPECT_EQ(e.autocast.casts[0].from, DType::f32);
  EXPECT_EQ(e.autocast.casts[0].to, DType::f16);
  EXPECT_EQ(e.output, DType::f16);
}

TEST(autocast_override_test, module_override_keeps_attention_linears_in_f32_while_mlp_linears_run_in_f16) {
  Generator gen(12);
  auto model = std::make_shared<samples::TinyTransformer>(
      samples::TinyTransformerConfig{.vocab = 16, .context = 8, .d_model = 16, .n_heads = 2, .n_layers = 2}, gen);
  const Tensor tokens = from_values({1, 5, 9, 2, 0, 15, 3, 3}, {2, 4}, {.dtype = DType::i64});
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastOverrideGuard keep_attention_f32({.module = "blocks.*.attn.*", .precision = Precision::f32});
    AutocastGuard region;
    EXPECT_EQ((*model)(tokens).dtype(), DType::f16) << "the head is not overridden";
  }
  std::vector<std::pair<std::string, DType>> linears;
  for (const SeenOp& e : hook->ops) {
    if (e.op != "linear") continue;
    linears.emplace_back(e.scope, e.output);
    const bool in_attention = e.scope.find(".attn.") != std::string::npos;
    EXPECT_EQ(e.autocast.overridden, in_attention) << e.scope;
    if (in_attention) {
      EXPECT_TRUE(contains(e.autocast.reason, "blocks.*.attn.*")) << e.scope << ": " << e.autocast.reason;
      EXPECT_TRUE(contains(e.autocast.reason, "f32")) << e.scope << ": " << e.autocast.reason;
      EXPECT_EQ(e.inputs, (std::vector<DType>{DType::f32, DType::f32, DType::f32})) << e.scope;
    } else {
      EXPECT_EQ(e.autocast.policy, AutocastPolicy::lower_precision_fp) << e.scope;
    }
  }
  const DType f32 = DType::f32, f16 = DType::f16;
  EXPECT_EQ(linears, (std::vector<std::pair<std::string, DType>>{{"blocks.0.attn.qkv", f32},
                                                                 {"blocks.0.attn.proj", f32},
                                                                 {"blocks.0.mlp.0", f16},
                                                                 {"blocks.0.mlp.2", f16},
                                                                 {"blocks.1.attn.qkv", f32},
                                                                 {"blocks.1.attn.proj", f32},
                                                                 {"blocks.1.mlp.0", f16},
                                                                 {"blocks.1.mlp.2", f16},
                                                                 {"head", f16}}));
}

TEST(autocast_override_test, overrides_have_no_effect_outside_a_region) {
  Generator gen(13);
  const Tensor x = randn({2, 5}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  AutocastOverrideGuard lower_softmax({.op = "softmax", .precision = Precision::lower});
  const Tensor y = softmax(x, 1);
  Tensor y_disabled;
  {
    AutocastGuard disabled(std::nullopt, /*enabled=*/false);
    y_disabled = softmax(x, 1);
  }
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y_disabled.dtype(), DType::f32);
  ASSERT_EQ(hook->ops.size(), 2u);
  EXPECT_FALSE(hook->ops[0].autocast.overridden);
  EXPECT_FALSE(hook->ops[1].autocast.overridden);
  EXPECT_TRUE(hook->ops[0].autocast.casts.empty());
}

TEST(autocast_override_test, override_is_removed_when_its_guard_dies) {
  Generator gen(14);
  const Tensor x = randn({2, 5}, gen, {.dtype = DType::f16});
  AutocastGuard region;
  {
    AutocastOverrideGuard lower_softmax({.op = "softmax", .precision = Precision::lower});
    EXPECT_EQ(softmax(x, 1).dtype(), DType::f16);
  }
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  EXPECT_EQ(softmax(x, 1).dtype(), DType::f32);
  ASSERT_EQ(hook->ops.size(), 1u);
  EXPECT_FALSE(hook->ops[0].autocast.overridden);
}

TEST(autocast_override_test, op_and_module_fields_must_both_match) {
  // {op = "linear", module = "fc2"}: the linear in fc2 is forced to f32, the linear in fc1 is not.
  Generator gen(15);
  auto model = std::make_shared<nn::Sequential>();
  model->register_module("fc1", std::make_shared<nn::Linear>(4, 4, gen));
  model->register_module("fc2", std::make_shared<nn::Linear>(4, 2, gen));
  const Tensor x = randn({3, 4}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard installed(hook);
  {
    AutocastOverrideGuard f32_fc2({.op = "linear", .module = "fc2", .precision = Precision::f32});
    AutocastGuard region;
    EXPECT_EQ((*model)(x).dtype(), DType::f32);
  }
  ASSERT_EQ(hook->ops.size(), 2u);
  EXPECT_EQ(hook->ops[0].scope, "fc1");
  EXPECT_EQ(hook->ops[0].output, DType::f16);
  EXPECT_FALSE(hook->ops[0].autocast.overridden);
  EXPECT_EQ(hook->ops[1].scope, "fc2");
  EXPECT_EQ(hook->ops[1].output, DType::f32);
  EXPECT_TRUE(hook->ops[1].autocast.overridden);
  // fc1's f16 output is cast up to f32 for fc2, and fc2's weight is used as it is.
  ASSERT_EQ(hook->ops[1].autocast.casts.size(), 1u);
  EXPECT_EQ(hook->ops[1].autocast.casts[0].input, 0);
  EXPECT_EQ(hook->ops[1].autocast.casts[0].from, DType::f16);
}

TEST(autocast_probe_test, an_op_override_reaches_the_steps_of_attention) {
  // "Keep attention's softmax in f32" is the first fix a user tries; it must apply inside the composite.
  Generator gen(3);
  const Tensor q = randn({1, 3, 4}, gen), k = randn({1, 3, 4}, gen), v = randn({1, 3, 4}, gen);
  auto hook = std::make_shared<RecordingHook>();
  probe::HookGuard guard(hook);
  AutocastOverrideGuard keep({.op = "softmax", .precision = Precision::f32});
  AutocastGuard region;
  scaled_dot_product_attention(q, k, v, true);
  bool saw_softmax = false;
  for (const SeenOp& op : hook->ops) {
    if (op.op == "softmax") {
      saw_softmax = true;
      EXPECT_EQ(op.output, DType::f32);
      EXPECT_TRUE(op.autocast.overridden);
      EXPECT_NE(op.autocast.reason.find("override"), std::string::npos) << op.autocast.reason;
    } else if (op.op == "bmm") {
      EXPECT_EQ(op.output, DType::f16) << "the other steps stay in the lower dtype";
    }
  }
  EXPECT_TRUE(saw_softmax);
}

}  // namespace
}  // namespace ampscope
