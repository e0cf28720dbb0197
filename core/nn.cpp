#include "core/nn.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/error.h"

namespace ampscope::nn {

namespace {

std::string join_path(std::string_view prefix, std::string_view local) {
  if (prefix.empty()) return std::string(local);
  return fmt::format("{}.{}", prefix, local);
}

// PyTorch's rules for attribute names of modules: a dot would make paths ambiguous.
void check_local_name(const Module& owner, std::string_view kind, const std::string& name) {
  if (name.empty()) {
    throw Error(fmt::format("{}: cannot register a {} with an empty name", owner.describe(), kind));
  }
  if (name.find('.') != std::string::npos) {
    throw Error(fmt::format("{}: {} name '{}' contains '.'\nhint: dots separate the levels of a path; register the "
                            "{} in the module that should own it, under a name without dots",
                            owner.describe(), kind, name, kind));
  }
}

void check_positive(std::string_view layer, std::string_view what, std::int64_t value) {
  if (value <= 0) throw ShapeError(fmt::format("{}: {} must be positive, got {}", layer, what, value));
}

// U(-bound, bound): a uniform [0, 1) draw mapped with two f32 ops (each rounded once, as the same ops on
// the GPU would), so the values are the same on every backend for the same generator state.
Tensor uniform(const Shape& shape, double bound, Generator& gen) {
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // initialisation is not the model's forward pass
  return sub(mul(rand(shape, gen), 2.0 * bound), bound);
}

// A new leaf holding `data` (already converted, with no graph) that takes the place of `old`.
Tensor replace_parameter(const Tensor& old, Tensor data, const std::function<Tensor(const Tensor&)>& convert) {
  data.requires_grad_(true);
  data.set_name(old.name());
  const Tensor grad = old.grad();
  if (grad.defined()) data.set_grad(convert(grad));
  return data;
}

}  // namespace

// ---- Module ----------------------------------------------------------------------------------------

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

Tensor Module::operator()(const Tensor& x) {
  ScopeGuard scope(name_);
  return forward(x);
}

std::string Module::describe() const {
  return name_.empty() ? type_name_ : fmt::format("{} '{}'", type_name_, name_);
}

std::string Module::path_of(std::string_view local) const { return join_path(name_, local); }

void Module::check_name_free(std::string_view kind, const std::string& name, const std::string& what) const {
  std::string existing;
  for (const auto& [local, p] : parameters_) {
    if (local == name) existing = fmt::format("parameter '{}' (shape {})", path_of(local), shape_str(p.shape()));
  }
  for (const auto& [local, b] : buffers_) {
    if (local == name) existing = fmt::format("buffer '{}' (shape {})", path_of(local), shape_str(b.shape()));
  }
  for (const auto& [local, c] : children_) {
    if (local == name) existing = fmt::format("module {} '{}'", c->type_name(), path_of(local));
  }
  if (existing.empty()) return;
  throw Error(fmt::format("{}: cannot register {} '{}' ({}): the name is already taken by {}\nhint: give the {} "
                          "another name; each parameter, buffer and child of a module needs its own",
                          describe(), kind, name, what, existing, kind));
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  check_local_name(*this, "module", name);
  if (module == nullptr) {
    throw Error(fmt::format("{}: cannot register module '{}': the pointer is null", describe(), name));
  }
  if (module->contains(this)) {
    throw Error(fmt::format("{}: cannot register {} as its child '{}': it contains {} itself, which would make a "
                            "cycle",
                            describe(), module->describe(), name, describe()));
  }
  check_name_free("module", name, module->type_name());
  children_.emplace_back(name, module);
  module->set_path(path_of(name));
}

bool Module::contains(const Module* module) const {
  if (module == this) return true;
  for (const auto& [local, c] : children_) {
    if (c->contains(module)) return true;
  }
  return false;
}

void Module::set_path(std::string path) {
  name_ = std::move(path);
  for (auto& [local, p] : parameters_) p.set_name(path_of(local));
  for (auto& [local, b] : buffers_) b.set_name(path_of(local));
  for (auto& [local, c] : children_) c->set_path(path_of(local));
}

Tensor Module::register_parameter(std::string name, Tensor value) {
  check_local_name(*this, "parameter", name);
  if (!value.defined()) {
    throw Error(fmt::format("{}: cannot register parameter '{}': the tensor is undefined", describe(), name));
  }
  if (!is_floating(value.dtype())) {
    throw DTypeError(fmt::format("{}: parameter '{}' must have a floating dtype, got {} (shape {})\nhint: only "
                                 "floating tensors can be trained; keep integer state with register_buffer",
                                 describe(), name, dtype_name(value.dtype()), shape_str(value.shape())));
  }
  check_name_free("parameter", name, fmt::format("shape {}", shape_str(value.shape())));
  Tensor p = value.is_leaf() ? value : value.detach();
  p.requires_grad_(true);
  p.set_name(path_of(name));
  parameters_.emplace_back(std::move(name), p);
  return p;
}

Tensor Module::register_buffer(std::string name, Tensor value) {
  check_local_name(*this, "buffer", name);
  if (!value.defined()) {
    throw Error(fmt::format("{}: cannot register buffer '{}': the tensor is undefined", describe(), name));
  }
  check_name_free("buffer", name, fmt::format("shape {}", shape_str(value.shape())));
  Tensor b = value.requires_grad() ? value.detach() : value;
  b.set_name(path_of(name));
  buffers_.emplace_back(std::move(name), b);
  return b;
}

namespace {

template <class Entries>
auto find_entry(const Entries& entries, std::string_view name) {
  return std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == name; });
}

template <class Entries>
std::string entry_names(const Entries& entries) {
  if (entries.empty()) return "none";
  std::vector<std::string> names;
  for (const auto& e : entries) names.push_back(e.first);
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

bool Module::has_parameter(std::string_view name) const {
  return find_entry(parameters_, name) != parameters_.end();
}

const Tensor& Module::parameter(std::string_view name) const {
  const auto it = find_entry(parameters_, name);
  if (it == parameters_.end()) {
    throw IndexError(fmt::format("{} has no parameter '{}' (its parameters: {})", describe(), name,
                                 entry_names(parameters_)));
  }
  return it->second;
}

const Tensor& Module::buffer(std::string_view name) const {
  const auto it = find_entry(buffers_, name);
  if (it == buffers_.end()) {
    throw IndexError(fmt::format("{} has no buffer '{}' (its buffers: {})", describe(), name, entry_names(buffers_)));
  }
  return it->second;
}

std::shared_ptr<Module> Module::child(std::string_view name) const {
  const auto it = find_entry(children_, name);
  if (it == children_.end()) {
    throw IndexError(fmt::format("{} has no child module '{}' (its children: {})", describe(), name,
                                 entry_names(children_)));
  }
  return it->second;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out;
  std::unordered_set<const Module*> seen;  // a module shared by two parents is listed once, as in PyTorch
  std::function<void(const Module*, const std::string&)> visit = [&](const Module* m, const std::string& prefix) {
    if (!seen.insert(m).second) return;
    out.emplace_back(prefix, m);
    for (const auto& [local, c] : m->children_) visit(c.get(), join_path(prefix, local));
  };
  visit(this, "");
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  for (const auto& [path, m] : std::as_const(*this).named_modules()) out.emplace_back(path, const_cast<Module*>(m));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& [path, m] : named_modules()) {
    for (const auto& [local, p] : m->parameters_) {
      if (seen.insert(p.id()).second) out.emplace_back(join_path(path, local), p);
    }
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& [path, m] : named_modules()) {
    for (const auto& [local, b] : m->buffers_) {
      if (seen.insert(b.id()).second) out.emplace_back(join_path(path, local), b);
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  for (auto& [path, m] : named_modules()) m->training_ = on;
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) p.set_grad(Tensor());
}

template <class Fn>
void Module::convert_tensors(Fn&& convert) {
  NoGradGuard no_grad;
  RuntimeInternalGuard internal;  // converting a model is not one of its ops
  // Tied parameters are converted once and the new tensor put in every place that held the old one.
  std::vector<std::pair<const void*, Tensor>> done;
  auto converted = [&](const Tensor& old, bool is_parameter) -> Tensor {
    for (const auto& [id, t] : done) {
      if (id == old.id()) return t;
    }
    Tensor data = convert(old.detach());
    Tensor result = old;
    if (data.id() != old.id() && !data.shares_storage_with(old)) {
      if (is_parameter) {
        result = replace_parameter(old, data, convert);
      } else {
        data.set_name(old.name());
        result = data;
      }
    }
    done.emplace_back(old.id(), result);
    return result;
  };
  for (auto& [path, m] : named_modules()) {
    for (auto& [local, p] : m->parameters_) p = converted(p, true);
    for (auto& [local, b] : m->buffers_) b = converted(b, false);
  }
}

Module& Module::to(DType dtype) {
  if (!is_floating(dtype)) {
    throw DTypeError(fmt::format("{}: to({}): parameters can only be converted to a floating dtype (f64, f32, f16, "
                                 "bf16)",
                                 describe(), dtype_name(dtype)));
  }
  // Integer buffers (indices, counters) keep their dtype, as in PyTorch's Module.to(dtype).
  convert_tensors([dtype](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; });
  return *this;
}

Module& Module::to(Device device) {
  convert_tensors([device](const Tensor& t) { return t.to(device); });
  return *this;
}

// ---- Linear ----------------------------------------------------------------------------------------

Linear::Linear(std::int64_t in_features, std::int64_t out_features, Generator& gen, bool bias)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  check_positive("Linear", "in_features", in_features);
  check_positive("Linear", "out_features", out_features);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  register_parameter("weight", uniform({out_features, in_features}, bound, gen));
  if (bias) register_parameter("bias", uniform({out_features}, bound, gen));
}

Tensor Linear::bias() const { return has_parameter("bias") ? parameter("bias") : Tensor(); }

Tensor Linear::forward(const Tensor& x) {
  if (x.dim() == 0) {
    throw ShapeError(fmt::format("{}: expected {} input features, got a 0-d tensor\nhint: a Linear input has its "
                                 "features in the last dimension, e.g. [batch, {}]",
                                 describe(), in_features_, in_features_));
  }
  const std::int64_t got = x.size(-1);
  if (got != in_features_) {
    throw ShapeError(fmt::format("{}: expected {} input features, got {} (input shape {})\nhint: the layer before "
                                 "produces {} features per sample; construct this Linear with in_features = {}, or "
                                 "check the Flatten/reshape in front of it",
                                 describe(), in_features_, got, shape_str(x.shape()), got, got));
  }
  return linear(x, weight(), bias());
}

// ---- Conv2d ----------------------------------------------------------------------------------------

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel_size, Generator& gen,
               std::int64_t stride, std::int64_t padding, bool bias)
    : Module("Conv2d"),
      in_channels_(in_channels),
      out_channels_(out_channels),
      kernel_size_(kernel_size),
      stride_(stride),
      padding_(padding) {
  check_positive("Conv2d", "in_channels", in_channels);
  check_positive("Conv2d", "out_channels", out_channels);
  check_positive("Conv2d", "kernel_size", kernel_size);
  check_positive("Conv2d", "stride", stride);
  if (padding < 0) throw ShapeError(fmt::format("Conv2d: padding must not be negative, got {}", padding));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels * kernel_size * kernel_size));
  register_parameter("weight", uniform({out_channels, in_channels, kernel_size, kernel_size}, bound, gen));
  if (bias) register_parameter("bias", uniform({out_channels}, bound, gen));
}

Tensor Conv2d::bias() const { return has_parameter("bias") ? parameter("bias") : Tensor(); }

Tensor Conv2d::forward(const Tensor& x) {
  if (x.dim() != 4) {
    throw ShapeError(fmt::format("{}: expected a 4-d input [N, C, H, W], got shape {}\nhint: add the batch "
                                 "dimension with reshape, e.g. x.reshape({{1, C, H, W}})",
                                 describe(), shape_str(x.shape())));
  }
  if (x.size(1) != in_channels_) {
    throw ShapeError(fmt::format("{}: expected {} input channels, got {} (input shape {})\nhint: construct this "
                                 "Conv2d with in_channels = {}, or check that the input is laid out NCHW (channels "
                                 "in dimension 1)",
                                 describe(), in_channels_, x.size(1), shape_str(x.shape()), x.size(1)));
  }
  const std::int64_t h = x.size(2) + 2 * padding_, w = x.size(3) + 2 * padding_;
  if (h < kernel_size_ || w < kernel_size_) {
    throw ShapeError(fmt::format("{}: the input is {}x{} after padding {}, smaller than the {}x{} kernel (input "
                                 "shape {})",
                                 describe(), h, w, padding_, kernel_size_, kernel_size_, shape_str(x.shape())));
  }
  return conv2d(x, weight(), bias(),
                {.stride_h = stride_, .stride_w = stride_, .padding_h = padding_, .padding_w = padding_});
}

// ---- MaxPool2d -------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(std::int64_t kernel_size, std::int64_t stride, std::int64_t padding)
    : Module("MaxPool2d"), kernel_size_(kernel_size), stride_(stride == 0 ? kernel_size : stride), padding_(padding) {
  check_positive("MaxPool2d", "kernel_size", kernel_size);
  check_positive("MaxPool2d", "stride", stride_);
  if (padding < 0) throw ShapeError(fmt::format("MaxPool2d: padding must not be negative, got {}", padding));
}

Tensor MaxPool2d::forward(const Tensor& x) {
  if (x.dim() != 4) {
    throw ShapeError(fmt::format("{}: expected a 4-d input [N, C, H, W], got shape {}", describe(),
                                 shape_str(x.shape())));
  }
  return max_pool2d(x, {.kernel_h = kernel_size_,
                        .kernel_w = kernel_size_,
                        .stride_h = stride_,
                        .stride_w = stride_,
                        .padding_h = padding_,
                        .padding_w = padding_});
}

// ---- LayerNorm -------------------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine)
    : Module("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps), affine_(elementwise_affine) {
  if (normalized_shape_.empty()) throw ShapeError("LayerNorm: normalized_shape must have at least one dimension");
  for (std::int64_t s : normalized_shape_) check_positive("LayerNorm", "every size in normalized_shape", s);
  if (affine_) {
    register_parameter("weight", ones(normalized_shape_));
    register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const std::size_t n = normalized_shape_.size();
  const Shape& shape = x.shape();
  const bool fits =
      shape.size() >= n && std::equal(normalized_shape_.begin(), normalized_shape_.end(), shape.end() - n);
  if (!fits) {
    const Shape trailing(shape.size() >= n ? shape.end() - n : shape.begin(), shape.end());
    throw ShapeError(fmt::format("{}: expected the input's trailing dimensions to be {}, got input shape {}\nhint: "
                                 "construct this LayerNorm with normalized_shape = {} or check the width (d_model) of "
                                 "the layers around it",
                                 describe(), shape_str(normalized_shape_), shape_str(shape), shape_str(trailing)));
  }
  if (!affine_) return layer_norm(x, normalized_shape_, Tensor(), Tensor(), eps_);
  return layer_norm(x, normalized_shape_, parameter("weight"), parameter("bias"), eps_);
}

// ---- Embedding -------------------------------------------------------------------------------------

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, Generator& gen)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  check_positive("Embedding", "num_embeddings", num_embeddings);
  check_positive("Embedding", "embedding_dim", embedding_dim);
  register_parameter("weight", randn({num_embeddings, embedding_dim}, gen));
}

Tensor Embedding::forward(const Tensor& x) {
  if (x.dtype() != DType::i64) {
    throw DTypeError(fmt::format("{}: indices must be i64, got {} (shape {})\nhint: token ids are indices into the "
                                 "{}-row table: build them as i64, or convert with .to(DType::i64)",
                                 describe(), dtype_name(x.dtype()), shape_str(x.shape()), num_embeddings_));
  }
  return embedding(x, weight());
}

// ---- Dropout ---------------------------------------------------------------------------------------

Dropout::Dropout(double p, Generator& gen) : Module("Dropout"), p_(p), gen_(&gen) {
  if (!(p >= 0.0 && p <= 1.0)) throw Error(fmt::format("Dropout: p must be in [0, 1], got {}", p));
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

// ---- Flatten ---------------------------------------------------------------------------------------

Flatten::Flatten(std::int64_t start_dim, std::int64_t end_dim)
    : Module("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}

Tensor Flatten::forward(const Tensor& x) {
  const std::int64_t n = std::max<std::int64_t>(x.dim(), 1);  // a 0-d tensor flattens to one element, as in PyTorch
  auto wrap = [&](std::int64_t d, std::string_view what) {
    if (d < -n || d >= n) {
      throw IndexError(fmt::format("{}: {} {} is out of range for input shape {} (valid: {} to {})", describe(), what,
                                   d, shape_str(x.shape()), -n, n - 1));
    }
    return d < 0 ? d + n : d;
  };
  const std::int64_t start = wrap(start_dim_, "start_dim"), end = wrap(end_dim_, "end_dim");
  if (start > end) {
    throw IndexError(fmt::format("{}: start_dim {} comes after end_dim {} for input shape {}", describe(), start_dim_,
                                 end_dim_, shape_str(x.shape())));
  }
  if (x.dim() == 0) return x.reshape({1});
  Shape shape(x.shape().begin(), x.shape().begin() + start);
  std::int64_t merged = 1;
  for (std::int64_t d = start; d <= end; ++d) merged *= x.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + end + 1, x.shape().end());
  return x.reshape(shape);
}

// ---- Sequential ------------------------------------------------------------------------------------

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

std::shared_ptr<Module> Sequential::operator[](std::size_t index) const {
  if (index >= size()) {
    throw IndexError(fmt::format("{}: index {} is out of range (it holds {} modules)", describe(), index, size()));
  }
  return children()[index].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& [local, m] : children()) y = (*m)(y);
  return y;
}

// ---- CausalSelfAttention ---------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(std::int64_t d_model, std::int64_t n_heads, double dropout_p, Generator& gen)
    : Module("CausalSelfAttention"), d_model_(d_model), n_heads_(n_heads) {
  check_positive("CausalSelfAttention", "d_model", d_model);
  check_positive("CausalSelfAttention", "n_heads", n_heads);
  if (d_model % n_heads != 0) {
    std::vector<std::int64_t> divisors;
    for (std::int64_t k = 1; k <= d_model && divisors.size() < 16; ++k) {
      if (d_model % k == 0) divisors.push_back(k);
    }
    throw ShapeError(fmt::format("CausalSelfAttention: d_model {} is not divisible by n_heads {}\nhint: each head "
                                 "gets d_model / n_heads features; pick n_heads among the divisors of {} ({}{})",
                                 d_model, n_heads, d_model, fmt::join(divisors, ", "),
                                 divisors.size() == 16 ? ", ..." : ""));
  }
  qkv_ = register_module("qkv", std::make_shared<Linear>(d_model, 3 * d_model, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(d_model, d_model, gen));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(dropout_p, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.dim() != 3 || x.size(2) != d_model_) {
    throw ShapeError(fmt::format("{}: expected an input [batch, time, {}], got shape {}", describe(), d_model_,
                                 shape_str(x.shape())));
  }
  const std::int64_t b = x.size(0), t = x.size(1), d = d_model_, h = n_heads_, hd = d / h;
  const Tensor qkv = (*qkv_)(x);  // [B, T, 3D]: q, k and v side by side, as in GPT-2's c_attn
  auto heads = [&](std::int64_t part) {
    return qkv.slice(2, part * d, (part + 1) * d).reshape({b, t, h, hd}).transpose(1, 2);  // [B, H, T, hd]
  };
  const Tensor y = scaled_dot_product_attention(heads(0), heads(1), heads(2), /*causal=*/true);
  const Tensor merged = y.transpose(1, 2).reshape({b, t, d});
  return (*dropout_)((*proj_)(merged));
}

// ---- TransformerBlock ------------------------------------------------------------------------------

TransformerBlock::TransformerBlock(std::int64_t d_model, std::int64_t n_heads, double dropout_p, Generator& gen)
    : Module("TransformerBlock") {
  ln1_ = register_module("ln1", std::make_shared<LayerNorm>(Shape{d_model}));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(d_model, n_heads, dropout_p, gen));
  ln2_ = register_module("ln2", std::make_shared<LayerNorm>(Shape{d_model}));
  mlp_ = register_module("mlp", std::make_shared<Sequential>());
  mlp_->push_back(std::make_shared<Linear>(d_model, 4 * d_model, gen));
  mlp_->push_back(std::make_shared<GELU>(GeluApproximation::tanh));
  mlp_->push_back(std::make_shared<Linear>(4 * d_model, d_model, gen));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor h = add(x, (*attn_)((*ln1_)(x)));
  return add(h, (*mlp_)((*ln2_)(h)));
}

}  // namespace ampscope::nn
