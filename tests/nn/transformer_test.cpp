// tests/nn/transformer_test.cpp: CausalSelfAttention and TransformerBlock of core/nn.h: parameter names
// and shapes as in a PyTorch GPT-2-style block, the forward pass against a reference written here in
// double, gradients (present for every parameter, and equal to central finite differences in f64), and
// the module paths recorded as scopes on autograd nodes.
//
// The reference follows the definitions, not the code under test: LayerNorm with the biased variance,
// q/k/v as the three d-wide column blocks of the qkv projection with head h in columns h*hd..(h+1)*hd of
// each, softmax(q k^T / sqrt(hd)) over keys j <= i, heads concatenated, then proj; tanh-GELU MLP; pre-LN
// residuals x + attn(ln1(x)), then + mlp(ln2(.)).
#include "core/nn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
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

using Matrix = std::vector<double>;  // row-major, sizes passed alongside

// ---- reference in double ----

Matrix ref_linear(const Matrix& x, int rows, int in, const Tensor& weight, const Tensor& bias) {
  const int out = static_cast<int>(weight.size(0));
  const Matrix w = weight.values(), b = bias.values();
  Matrix y(static_cast<std::size_t>(rows) * out);
  for (int r = 0; r < rows; ++r) {
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  }
  return y;
}

Matrix ref_layer_norm(const Matrix& x, int rows, int d, const Tensor& weight, const Tensor& bias) {
  const Matrix w = weight.values(), b = bias.values();
  Matrix y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < d; ++i) mean += x[r * d + i] / d;
    for (int i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean) / d;
    for (int i = 0; i < d; ++i) y[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + 1e-5) * w[i] + b[i];
  }
  return y;
}

// x: [B*T, d] rows, batch-major.
Matrix ref_attention(const Matrix& x, int batch, int time, int d, int heads, const nn::Module& attn) {
  const auto qkv_mod = std::dynamic_pointer_cast<nn::Linear>(attn.child("qkv"));
  const auto proj_mod = std::dynamic_pointer_cast<nn::Linear>(attn.child("proj"));
  const Matrix qkv = ref_linear(x, batch * time, d, qkv_mod->weight(), qkv_mod->bias());
  const int hd = d / heads;
  Matrix merged(static_cast<std::size_t>(batch) * time * d, 0.0);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < time; ++i) {
        auto at = [&](int t, int part, int e) { return qkv[(b * time + t) * 3 * d + part * d + h * hd + e]; };
        std::vector<double> p(time, 0.0);
        double mx = -1e300, z = 0;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int e = 0; e < hd; ++e) s += at(i, 0, e) * at(j, 1, e);
          p[j] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= i; ++j) z += (p[j] = std::exp(p[j] - mx));
        for (int e = 0; e < hd; ++e) {
          double s = 0;
          for (int j = 0; j <= i; ++j) s += p[j] / z * at(j, 2, e);
          merged[(b * time + i) * d + h * hd + e] = s;
        }
      }
    }
  }
  return ref_linear(merged, batch * time, d, proj_mod->weight(), proj_mod->bias());
}

Matrix ref_block(const Matrix& x, int batch, int time, int d, int heads, const nn::Module& block) {
  const int rows = batch * time;
  auto ln = [&](const char* name, const Matrix& v) {
    const auto m = block.child(name);
    return ref_layer_norm(v, rows, d, m->parameter("weight"), m->parameter("bias"));
  };
  const Matrix a = ref_attention(ln("ln1", x), batch, time, d, heads, *block.child("attn"));
  Matrix h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) h[i] = x[i] + a[i];
  const auto mlp = std::dynamic_pointer_cast<nn::Sequential>(block.child("mlp"));
  const auto fc = std::dynamic_pointer_cast<nn::Linear>((*mlp)[0]);
  const auto out = std::dynamic_pointer_cast<nn::Linear>((*mlp)[2]);
  Matrix u = ref_linear(ln("ln2", h), rows, d, fc->weight(), fc->bias());
  for (double& v : u) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  const Matrix m = ref_linear(u, rows, 4 * d, out->weight(), out->bias());
  for (std::size_t i = 0; i < h.size(); ++i) h[i] += m[i];
  return h;
}

// ---- tests ----

TEST(transformer_test, sequential_of_blocks_names_parameters_like_pytorch) {
  Generator gen(0);
  nn::Sequential blocks;
  for (int i = 0; i < 2; ++i) blocks.push_back(std::make_shared<nn::TransformerBlock>(8, 2, 0.1, gen));
  std::vector<std::string> expected;
  std::vector<Shape> shapes;
  for (const std::string i : {"0", "1"}) {
    const std::vector<std::pair<std::string, Shape>> block = {
        {"ln1.weight", {8}},       {"ln1.bias", {8}},     {"attn.qkv.weight", {24, 8}}, {"attn.qkv.bias", {24}},
        {"attn.proj.weight", {8, 8}}, {"attn.proj.bias", {8}}, {"ln2.weight", {8}},          {"ln2.bias", {8}},
        {"mlp.0.weight", {32, 8}}, {"mlp.0.bias", {32}},  {"mlp.2.weight", {8, 32}},    {"mlp.2.bias", {8}}};
    for (const auto& [name, shape] : block) {
      expected.push_back(i + "." + name);
      shapes.push_back(shape);
    }
  }
  const auto named = blocks.named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (std::size_t k = 0; k < named.size(); ++k) {
    EXPECT_EQ(named[k].first, expected[k]);
    EXPECT_EQ(named[k].second.name(), expected[k]);
    EXPECT_EQ(named[k].second.shape(), shapes[k]) << expected[k];
  }
  std::vector<std::string> modules;
  for (const auto& [path, m] : blocks[0]->named_modules()) modules.push_back(m->describe());
  EXPECT_EQ(modules, (std::vector<std::string>{
                         "TransformerBlock '0'", "LayerNorm '0.ln1'", "CausalSelfAttention '0.attn'",
                         "Linear '0.attn.qkv'", "Linear '0.attn.proj'", "Dropout '0.attn.dropout'", "LayerNorm '0.ln2'",
                         "Sequential '0.mlp'", "Linear '0.mlp.0'", "GELU '0.mlp.1'", "Linear '0.mlp.2'"}));
}

TEST(transformer_test, attention_rejects_a_width_that_heads_cannot_split) {
  Generator gen(0);
  EXPECT_THROW_MSG(nn::CausalSelfAttention(10, 3, 0.0, gen), ampscope::ShapeError,
                   "CausalSelfAttention: d_model 10 is not divisible by n_heads 3", "1, 2, 5, 10");
  EXPECT_EQ(gen.offset(), 0u);  // refused before drawing anything
  nn::CausalSelfAttention attn(8, 2, 0.0, gen);
  EXPECT_THROW_MSG(attn(ampscope::zeros({2, 8})), ampscope::ShapeError, "CausalSelfAttention", "[batch, time, 8]",
                   "[2, 8]");
}

TEST(transformer_test, attention_forward_matches_a_causal_softmax_in_double) {
  Generator gen(21);
  nn::CausalSelfAttention attn(8, 2, 0.0, gen);
  const Tensor x = ampscope::randn({2, 5, 8}, gen);
  const Tensor y = attn(x);
  ASSERT_EQ(y.shape(), (Shape{2, 5, 8}));
  const Matrix ref = ref_attention(x.values(), 2, 5, 8, 2, attn);
  const Matrix got = y.values();
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 2e-5) << i;
  // Causality: changing the last step leaves every earlier output as it was.
  Tensor x2 = x.clone();
  for (int e = 0; e < 8; ++e) x2.set({0, 4, e}, 10.0);
  const Matrix got2 = attn(x2).values();
  for (int t = 0; t < 4; ++t) {
    for (int e = 0; e < 8; ++e) EXPECT_EQ(got2[t * 8 + e], got[t * 8 + e]) << t << "," << e;
  }
}

TEST(transformer_test, block_forward_matches_the_pre_layer_norm_reference_in_double) {
  Generator gen(5);
  nn::TransformerBlock block(8, 2, 0.0, gen);
  // Non-trivial LayerNorm affine parameters, so that their use is checked too.
  {
    ampscope::NoGradGuard no_grad;
    for (const char* ln : {"ln1", "ln2"}) {
      const auto m = block.child(ln);
      Tensor(m->parameter("weight")).copy_(ampscope::add(ampscope::rand({8}, gen), 0.5));
      Tensor(m->parameter("bias")).copy_(ampscope::sub(ampscope::rand({8}, gen), 0.5));
    }
  }
  const Tensor x = ampscope::randn({2, 4, 8}, gen);
  const Matrix got = block(x).values();
  const Matrix ref = ref_block(x.values(), 2, 4, 8, 2, block);
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 5e-5 * (1 + std::fabs(ref[i]))) << i;
}

TEST(transformer_test, backward_gives_every_parameter_a_gradient_of_its_shape) {
  Generator gen(17);
  nn::Sequential blocks;
  for (int i = 0; i < 2; ++i) blocks.push_back(std::make_shared<nn::TransformerBlock>(8, 2, 0.1, gen));
  const Tensor x = ampscope::randn({2, 5, 8}, gen);
  const Tensor r = ampscope::randn({2, 5, 8}, gen);  // a random projection: no gradient cancels by symmetry
  ampscope::sum(ampscope::mul(blocks(x), r)).backward();
  for (const auto& [name, p] : blocks.named_parameters()) {
    SCOPED_TRACE(name);
    const Tensor g = p.grad();
    ASSERT_TRUE(g.defined());
    EXPECT_EQ(g.shape(), p.shape());
    EXPECT_EQ(g.dtype(), DType::f32);
    double norm = 0;
    for (double v : g.values()) {
      EXPECT_TRUE(std::isfinite(v));
      norm += v * v;
    }
    EXPECT_GT(norm, 0.0);
  }
}

TEST(transformer_test, block_gradients_equal_central_differences_in_f64) {
  Generator gen(23);
  nn::TransformerBlock block(4, 2, 0.0, gen);
  block.to(DType::f64);
  const Tensor x = ampscope::randn({1, 3, 4}, gen, {.dtype = DType::f64});
  const Tensor r = ampscope::randn({1, 3, 4}, gen, {.dtype = DType::f64});
  auto loss = [&] { return ampscope::sum(ampscope::mul(block(x), r)); };
  loss().backward();

  // A handful of entries in every kind of parameter: qkv (through the head split), proj, LayerNorm, MLP.
  const std::map<std::string, std::vector<std::int64_t>> probes = {
      {"attn.qkv.weight", {0, 5, 17, 47}}, {"attn.qkv.bias", {1, 6, 11}}, {"attn.proj.weight", {3, 14}},
      {"ln1.weight", {0, 3}},              {"ln2.bias", {2}},             {"mlp.0.weight", {7, 60}},
      {"mlp.2.bias", {1}}};
  const double h = 1e-6;
  int checked = 0;
  for (const auto& [name, p] : block.named_parameters()) {
    const auto it = probes.find(name);
    if (it == probes.end()) continue;
    Tensor flat = p.detach().view({p.numel()});  // shares storage: writes reach the parameter
    const Matrix analytic = p.grad().values();
    for (std::int64_t k : it->second) {
      ampscope::NoGradGuard no_grad;
      const double v = flat.at({k});
      flat.set({k}, v + h);
      const double up = loss().item();
      flat.set({k}, v - h);
      const double down = loss().item();
      flat.set({k}, v);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[k], numeric, 1e-6 * (1 + std::fabs(numeric))) << name << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 15);  // every probe above found its parameter
}

TEST(transformer_test, records_the_module_path_as_the_scope_of_each_node) {
  Generator gen(0);
  class Net : public nn::Module {
   public:
    explicit Net(Generator& gen) : Module("Net") {
      blocks = register_module("blocks", std::make_shared<nn::Sequential>());
      for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<nn::TransformerBlock>(8, 2, 0.0, gen));
    }
    std::shared_ptr<nn::Sequential> blocks;

   protected:
    Tensor forward(const Tensor& x) override { return (*blocks)(x); }
  } net(gen);

  const Tensor y = net(ampscope::randn({1, 3, 8}, gen));
  ASSERT_NE(y.grad_fn(), nullptr);
  // The last op is the second block's MLP residual.
  EXPECT_EQ(y.grad_fn()->op(), "add");
  EXPECT_EQ(y.grad_fn()->scope(), "blocks.1");

  std::map<std::string, std::set<std::string>> scopes_by_op;
  std::set<const ampscope::autograd::Node*> seen;
  std::vector<std::shared_ptr<ampscope::autograd::Node>> stack = {y.grad_fn()};
  while (!stack.empty()) {
    const auto node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node.get()).second) continue;
    scopes_by_op[node->op()].insert(node->scope());
    for (const auto& next : node->next()) stack.push_back(next);
  }
  for (const std::string b : {"blocks.0", "blocks.1"}) {
    SCOPED_TRACE(b);
    EXPECT_TRUE(scopes_by_op["linear"].count(b + ".attn.qkv"));
    EXPECT_TRUE(scopes_by_op["linear"].count(b + ".attn.proj"));
    EXPECT_TRUE(scopes_by_op["linear"].count(b + ".mlp.0"));
    EXPECT_TRUE(scopes_by_op["linear"].count(b + ".mlp.2"));
    EXPECT_TRUE(scopes_by_op["layer_norm"].count(b + ".ln1"));
    EXPECT_TRUE(scopes_by_op["layer_norm"].count(b + ".ln2"));
    EXPECT_TRUE(scopes_by_op["gelu"].count(b + ".mlp.1"));
    EXPECT_TRUE(scopes_by_op["softmax"].count(b + ".attn"));  // inside scaled_dot_product_attention
    EXPECT_TRUE(scopes_by_op["add"].count(b));                // the residuals
  }
  // Every linear node ran in a Linear module, nowhere else.
  for (const std::string& s : scopes_by_op["linear"]) {
    const bool in_linear = s.ends_with(".qkv") || s.ends_with(".proj") || s.ends_with(".0") || s.ends_with(".2");
    EXPECT_TRUE(in_linear) << s;
  }
}

}  // namespace
