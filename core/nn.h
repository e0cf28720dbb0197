// core/nn.h: neural-network modules with PyTorch's names, defaults and parameter order.
//
// A Module owns named parameters, buffers and child modules. Its full path ("blocks.0.attn.qkv") is
// given when a parent registers it, and re-given to every descendant and parameter when the parent is
// itself registered later, so a module is named correctly whatever order a model is built in. Each
// parameter is a leaf that requires grad, whose Tensor::name() is its full path ("blocks.0.attn.qkv.weight"),
// so autograd and optimizer errors can say which parameter is at fault. Calling a module (operator())
// pushes its path as the autograd scope (core/autograd.h), so every node its ops record, and every op
// error, names the module; the layers' own checks throw ShapeError/DTypeError naming it too.
//
//   Generator gen(0);
//   auto model = std::make_shared<nn::Sequential>();
//   auto fc1 = model->push_back(std::make_shared<nn::Linear>(784, 128, gen));  // "0"; draws 0.weight, 0.bias
//   model->push_back(std::make_shared<nn::ReLU>());                          // "1"
//   model->push_back(std::make_shared<nn::Linear>(128, 10, gen));            // "2"
//   model->to(DType::f16);                 // f16 storage; build optimizers after this
//   Tensor loss = cross_entropy((*model)(x), y);
//   loss.backward();                       // grads for "0.weight", "0.bias", "2.weight", "2.bias"
//
// Initialisation is seeded and reproducible: each layer draws from the Generator given to its
// constructor, at construction, weight first and then bias, in construction order (a composite layer
// constructs its children in the order they are registered). The same seed and the same construction
// order give the same parameters bit for bit on every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope::nn {

class Module {
 public:
  // type_name is the class name shown in messages ("Linear").
  explicit Module(std::string type_name);
  virtual ~Module() = default;
  // A module is shared (std::shared_ptr) between its parent and its user, never copied: a copy would
  // alias the parameters under a second path.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Runs forward() with this module's path as the autograd scope. Call this, not forward().
  Tensor operator()(const Tensor& x);

  const std::string& name() const { return name_; }            // full path; "" for the root
  const std::string& type_name() const { return type_name_; }  // "Linear"
  std::string describe() const;                                // "Linear 'fc1'" ("Linear" for a root)

  // ---- building ----
  // Registers a child under `name` (no dots) and gives it, and everything below it, its full path.
  // Returns the same typed pointer, so a layer can keep it: qkv_ = register_module("qkv", make_shared<Linear>(...)).
  // A name already used by a parameter, buffer or child of this module is rejected (Error naming both).
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "register_module takes a module");
    add_child(std::move(name), module);
    return module;
  }
  // Makes `value` a leaf that requires grad (a non-leaf is detached first; the dtype must be floating),
  // names it with its full path and returns it. Modules read their parameters back with parameter(),
  // never from a Tensor kept aside: to(DType) and to(Device) replace the stored tensors.
  Tensor register_parameter(std::string name, Tensor value);
  // State that is not trained (running statistics, masks); converted by to() when floating.
  Tensor register_buffer(std::string name, Tensor value);

  // ---- this module's own entries, by local name ----
  bool has_parameter(std::string_view name) const;
  const Tensor& parameter(std::string_view name) const;  // IndexError listing the names it has
  const Tensor& buffer(std::string_view name) const;
  std::shared_ptr<Module> child(std::string_view name) const;

  // ---- the whole tree ----
  // Depth-first in registration order, as PyTorch: this module's parameters, then each child's.
  // Names are relative to this module (on the root they equal each Tensor::name()). A tensor registered
  // twice (tied weights) is listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // This module first (named ""), then every descendant, depth-first. The pointers are owned by the tree.
  std::vector<std::pair<std::string, Module*>> named_modules();
  std::vector<std::pair<std::string, const Module*>> named_modules() const;
  std::int64_t num_parameters() const;  // total element count

  // ---- modes and state ----
  void train(bool on = true);  // recursive; only Dropout behaves differently today
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();  // every parameter's grad becomes undefined (PyTorch's set_to_none=True)

  // Converts every floating parameter and buffer of the tree in place: each stored tensor is replaced
  // by a new leaf of `dtype` (f64, f32, f16 or bf16) that requires grad and keeps its name; a gradient
  // already there is converted too. This is how a model is trained "in f16 storage". Tensors already of
  // that dtype are kept as they are. Optimizers hold the parameter tensors, so build them after to().
  Module& to(DType dtype);
  // The same for devices (Device::cuda() throws if no GPU is usable). Build optimizers after it too.
  Module& to(Device device);

 protected:
  virtual Tensor forward(const Tensor& x) = 0;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

 private:
  void add_child(std::string name, std::shared_ptr<Module> module);
  void check_name_free(std::string_view kind, const std::string& name, const std::string& what) const;
  std::string path_of(std::string_view local) const;
  void set_path(std::string path);
  bool contains(const Module* module) const;  // this module or one of its descendants
  template <class Fn>
  void convert_tensors(Fn&& convert);

  std::string type_name_;
  std::string name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// ---- layers ----

// y = x W^T + b. x [..., in_features] -> [..., out_features]. weight [out, in] and bias [out] are drawn
// from U(-1/sqrt(in), 1/sqrt(in)), weight first (PyTorch's kaiming_uniform_(a=sqrt(5)) has that bound).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, bool bias = true);
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return out_features_; }
  const Tensor& weight() const { return parameter("weight"); }
  Tensor bias() const;  // undefined without bias

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t in_features_, out_features_;
};

// x [N, C, H, W] -> [N, out_channels, H', W'] with a square kernel. weight [out, in, k, k] and bias [out]
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels * k * k, weight first.
class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, Generator& gen,
         std::int64_t stride = 1, std::int64_t padding = 0, bool bias = true);
  std::int64_t in_channels() const { return in_channels_; }
  std::int64_t out_channels() const { return out_channels_; }
  std::int64_t kernel_size() const { return kernel_size_; }
  const Tensor& weight() const { return parameter("weight"); }
  Tensor bias() const;

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t in_channels_, out_channels_, kernel_size_, stride_, padding_;
};

// Square windows; stride 0 means the kernel size (PyTorch's stride=None).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(std::int64_t kernel_size, std::int64_t stride = 0, std::int64_t padding = 0);

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t kernel_size_, stride_, padding_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}

 protected:
  Tensor forward(const Tensor& x) override { return relu(x); }
};

class GELU : public Module {
 public:
  explicit GELU(GeluApproximation approximate = GeluApproximation::none) : Module("GELU"), approximate_(approximate) {}

 protected:
  Tensor forward(const Tensor& x) override { return gelu(x, approximate_); }

 private:
  GeluApproximation approximate_;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}

 protected:
  Tensor forward(const Tensor& x) override { return silu(x); }
};

// Normalises over the trailing dimensions `normalized_shape`. With elementwise_affine, weight (ones)
// and bias (zeros) of that shape; no random draws.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  Shape normalized_shape_;
  double eps_;
  bool affine_;
};

// A table of num_embeddings rows of size embedding_dim, drawn from N(0, 1). Takes i64 indices of any
// shape and returns [..., embedding_dim].
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen);
  const Tensor& weight() const { return parameter("weight"); }

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t num_embeddings_, embedding_dim_;
};

// Zeroes elements with probability p while training (scaling the rest by 1/(1-p)); identity in eval().
// Masks are drawn from `gen` at each forward pass, so gen must outlive the module, and the masks depend
// on everything drawn from gen before (initialisation included) - reproducible for the same program.
class Dropout : public Module {
 public:
  Dropout(double p, Generator& gen);
  double p() const { return p_; }

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  double p_;
  Generator* gen_;
};

// Merges dimensions start_dim..end_dim (negative counts from the end) into one.
class Flatten : public Module {
 public:
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1);

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t start_dim_, end_dim_;
};

// Runs its children in order; they are named "0", "1", ... as they are added.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return register_module(std::to_string(size()), std::move(module));
  }
  std::size_t size() const { return children().size(); }
  std::shared_ptr<Module> operator[](std::size_t index) const;  // IndexError past the end

 protected:
  Tensor forward(const Tensor& x) override;
};

// Multi-head causal self-attention, as in GPT-2. x [B, T, d_model] -> [B, T, d_model]:
// qkv = Linear(d, 3d) ("qkv"), split into heads [B, n_heads, T, d/n_heads],
// scaled_dot_product_attention(causal), heads merged, proj = Linear(d, d) ("proj"), Dropout(p) ("dropout").
// Draws qkv.weight, qkv.bias, proj.weight, proj.bias at construction, then dropout masks when training.
class CausalSelfAttention : public Module {
 public:
  // ShapeError when d_model is not divisible by n_heads.
  CausalSelfAttention(std::int64_t d_model, std::int64_t n_heads, double dropout_p, Generator& gen);
  std::int64_t d_model() const { return d_model_; }
  std::int64_t n_heads() const { return n_heads_; }

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t d_model_, n_heads_;
  std::shared_ptr<Linear> qkv_, proj_;
  std::shared_ptr<Dropout> dropout_;
};

// Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) with
// mlp = Sequential(Linear(d, 4d), GELU(tanh), Linear(4d, d)). Children: ln1, attn, ln2, mlp (in that
// construction order, so draws go attn.qkv, attn.proj, mlp.0, mlp.2).
class TransformerBlock : public Module {
 public:
  TransformerBlock(std::int64_t d_model, std::int64_t n_heads, double dropout_p, Generator& gen);

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Sequential> mlp_;
};

}  // namespace ampscope::nn
