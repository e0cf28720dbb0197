// GPT-2 (GPT2LMHeadModel) from a Hugging Face config, op for op as transformers' modeling_gpt2.py runs it
// (eager attention). The semantics are listed in models/hf_models.h.
#include <cmath>

#include <fmt/format.h>

#include "core/io/json_limits.h"
#include "core/ops.h"
#include "models/hf_models.h"

namespace ampscope::samples::hf::detail {

namespace {

using ampscope::detail::text_excerpt;

enum class Activation { gelu_new, gelu_tanh, gelu, relu };

struct Gpt2Config {
  std::int64_t vocab, positions, embd, layers, heads, inner;
  double eps, init_range;
  Activation activation;
  bool scale_attn_weights, tied;
};

// GPT2Config's attribute_map lets "hidden_size" stand for n_embd and so on; both spellings are read.
std::int64_t aliased(const Config& c, const std::string& key, const std::string& alias) {
  if (c.has(key) && c.has(alias) && c.positive_int(key) != c.positive_int(alias)) {
    c.refuse(key, fmt::format("({}) and its alias '{}' ({}) disagree", c.positive_int(key), alias, c.positive_int(alias)),
             "keep one of the two keys");
  }
  return c.has(alias) && !c.has(key) ? c.positive_int(alias) : c.positive_int(key);
}

Gpt2Config parse(const Config& c) {
  Gpt2Config g{};
  g.vocab = c.positive_int("vocab_size");
  g.positions = aliased(c, "n_positions", "max_position_embeddings");
  g.embd = aliased(c, "n_embd", "hidden_size");
  g.layers = aliased(c, "n_layer", "num_hidden_layers");
  g.heads = aliased(c, "n_head", "num_attention_heads");
  if (g.embd % g.heads != 0) {
    c.refuse("n_head", fmt::format("({}) must divide n_embd ({})", g.heads, g.embd), "fix n_head or n_embd");
  }
  g.inner = c.positive_int("n_inner", 4 * g.embd);
  // LayerNorm divides by sqrt(var + eps): a zero or negative epsilon gives NaN or Inf on a constant input.
  g.eps = c.positive_number("layer_norm_epsilon", 1e-5);
  g.init_range = c.number("initializer_range", 0.02);
  const std::string act = c.string("activation_function", "gelu_new");
  if (act == "gelu_new") {
    g.activation = Activation::gelu_new;
  } else if (act == "gelu_pytorch_tanh") {
    g.activation = Activation::gelu_tanh;
  } else if (act == "gelu") {
    g.activation = Activation::gelu;
  } else if (act == "relu") {
    g.activation = Activation::relu;
  } else {
    c.refuse("activation_function", fmt::format("is '{}', which ampscope does not implement", text_excerpt(act)),
             "supported: gelu_new (GPT-2's), gelu_pytorch_tanh, gelu, relu");
  }
  g.scale_attn_weights = c.boolean("scale_attn_weights", true);
  if (c.boolean("scale_attn_by_inverse_layer_idx", false)) {
    c.refuse("scale_attn_by_inverse_layer_idx", "is true, which ampscope does not implement",
             "set it to false (only models trained with it need it)");
  }
  if (c.boolean("reorder_and_upcast_attn", false)) {
    c.refuse("reorder_and_upcast_attn", "is true, which ampscope does not implement (HF then computes attention in "
             "f32 with baddbmm under autocast disabled)",
             "set it to false, or keep attention in f32 with an autocast override (--autocast-fp32 'h.*.attn*')");
  }
  if (c.boolean("add_cross_attention", false)) {
    c.refuse("add_cross_attention", "is true: an encoder-decoder GPT-2 is not a causal language model",
             "use a decoder-only GPT-2 checkpoint");
  }
  g.tied = c.boolean("tie_word_embeddings", true);
  (void)c.number("attn_pdrop", 0.1);  // read (type-checked) and ignored: dropout is off
  (void)c.number("resid_pdrop", 0.1);
  (void)c.number("embd_pdrop", 0.1);
  return g;
}

class GPT2Attention : public nn::Module {
 public:
  GPT2Attention(WeightSource& src, const std::string& path, const Gpt2Config& g)
      : nn::Module("GPT2Attention"), embd_(g.embd), heads_(g.heads), scale_(g.scale_attn_weights) {
    c_attn_ = register_module("c_attn", std::make_shared<Conv1D>(src, path + ".c_attn", g.embd, 3 * g.embd, g.init_range));
    c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(src, path + ".c_proj", g.embd, g.embd,
                                                                 g.init_range / std::sqrt(2.0 * g.layers)));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const std::int64_t B = x.size(0), T = x.size(1), hd = embd_ / heads_;
    const Tensor qkv = (*c_attn_)(x);
    const auto split_heads = [&](std::int64_t i) {
      return qkv.slice(2, i * embd_, (i + 1) * embd_).view({B, T, heads_, hd}).permute({0, 2, 1, 3});
    };
    const Tensor q = split_heads(0), k = split_heads(1), v = split_heads(2);
    Tensor w = matmul(q, k.transpose(-1, -2));
    if (scale_) w = div(w, full({}, std::sqrt(static_cast<double>(hd)), {w.dtype()}));
    // The causal mask: where(tril, w, finfo(w.dtype).min), as HF's `bias` buffer sliced to [T, T].
    Tensor tril = Tensor::empty({T, T}, {DType::boolean});
    bool* m = tril.data_as<bool>();
    for (std::int64_t i = 0; i < T; ++i) {
      for (std::int64_t j = 0; j < T; ++j) m[i * T + j] = j <= i;
    }
    w = where(tril.to(w.device()), w, full({}, finfo_min(w.dtype()), {w.dtype(), w.device()}));
    w = softmax(w, -1).to(v.dtype());
    const Tensor out = matmul(w, v).permute({0, 2, 1, 3}).contiguous().view({B, T, embd_});
    return (*c_proj_)(out);
  }

 private:
  std::int64_t embd_, heads_;
  bool scale_;
  std::shared_ptr<Conv1D> c_attn_, c_proj_;
};

class GPT2MLP : public nn::Module {
 public:
  GPT2MLP(WeightSource& src, const std::string& path, const Gpt2Config& g)
      : nn::Module("GPT2MLP"), activation_(g.activation) {
    c_fc_ = register_module("c_fc", std::make_shared<Conv1D>(src, path + ".c_fc", g.embd, g.inner, g.init_range));
    c_proj_ = register_module("c_proj", std::make_shared<Conv1D>(src, path + ".c_proj", g.inner, g.embd,
                                                                 g.init_range / std::sqrt(2.0 * g.layers)));
  }

 protected:
  Tensor forward(const Tensor& x) override { return (*c_proj_)(act((*c_fc_)(x))); }

 private:
  Tensor act(const Tensor& x) const {
    switch (activation_) {
      case Activation::gelu_new: {
        // NewGELUActivation: 0.5 * x * (1.0 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3.0)))), in Python's
        // evaluation order.
        const Tensor half_x = mul(x, 0.5);
        const Tensor inner = mul(add(x, mul(pow(x, 3.0), 0.044715)), std::sqrt(2.0 / M_PI));
        return mul(half_x, add(tanh(inner), 1.0));
      }
      case Activation::gelu_tanh: return gelu(x, GeluApproximation::tanh);
      case Activation::gelu: return gelu(x, GeluApproximation::none);
      case Activation::relu: return relu(x);
    }
    return x;
  }

  Activation activation_;
  std::shared_ptr<Conv1D> c_fc_, c_proj_;
};

class GPT2Block : public nn::Module {
 public:
  GPT2Block(WeightSource& src, const std::string& path, const Gpt2Config& g) : nn::Module("GPT2Block") {
    ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(src, path + ".ln_1", g.embd, g.eps));
    attn_ = register_module("attn", std::make_shared<GPT2Attention>(src, path + ".attn", g));
    ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(src, path + ".ln_2", g.embd, g.eps));
    mlp_ = register_module("mlp", std::make_shared<GPT2MLP>(src, path + ".mlp", g));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor h = add((*attn_)((*ln_1_)(x)), x);   // attn_output + residual
    return add(h, (*mlp_)((*ln_2_)(h)));               // residual + feed_forward_hidden_states
  }

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<GPT2Attention> attn_;
  std::shared_ptr<GPT2MLP> mlp_;
};

class GPT2LMHeadModel : public CausalLM {
 public:
  GPT2LMHeadModel(const Config& c, WeightSource& src) : CausalLM("GPT2LMHeadModel"), g_(parse(c)) {
    config_ = c.json();
    wte_ = register_module("wte", std::make_shared<Embedding>(src, "wte", g_.vocab, g_.embd, g_.init_range));
    wpe_ = register_module("wpe", std::make_shared<Embedding>(src, "wpe", g_.positions, g_.embd, g_.init_range));
    h_ = register_module("h", std::make_shared<ModuleList>());
    for (std::int64_t i = 0; i < g_.layers; ++i) {
      h_->push_back(std::make_shared<GPT2Block>(src, fmt::format("h.{}", i), g_));
    }
    ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(src, "ln_f", g_.embd, g_.eps));
    if (g_.tied) {
      register_module("lm_head", std::make_shared<TiedHead>(wte_));
    } else {
      register_module("lm_head", std::make_shared<Linear>(src, "lm_head", g_.embd, g_.vocab, false, g_.init_range));
    }
  }

  std::string model_type() const override { return "gpt2"; }
  std::int64_t vocab_size() const override { return g_.vocab; }
  std::int64_t max_positions() const override { return g_.positions; }
  std::int64_t num_layers() const override { return g_.layers; }

  std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto& [name, p] : named_parameters()) {
      out.emplace_back(name.rfind("lm_head.", 0) == 0 ? name : checkpoint_prefix_ + name, p);
    }
    return out;
  }

 protected:
  Tensor forward(const Tensor& tokens) override {
    check_tokens(tokens, "GPT2LMHeadModel", g_.positions);
    const std::int64_t T = tokens.size(1);
    const Tensor positions = arange(static_cast<double>(T), {DType::i64, tokens.device()}).view({1, T});
    // inputs_embeds + position_embeds, in Python's order (C++ leaves the order of a call's arguments open), so
    // the op sequence matches a PyTorch run's.
    const Tensor inputs_embeds = (*wte_)(tokens);
    Tensor h = add(inputs_embeds, (*wpe_)(positions));
    h = (*h_)(h);
    return (*child("lm_head"))((*ln_f_)(h));
  }

 private:
  Gpt2Config g_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<ModuleList> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace

std::shared_ptr<CausalLM> build_gpt2(const Config& config, WeightSource& source) {
  return std::make_shared<GPT2LMHeadModel>(config, source);
}

}  // namespace ampscope::samples::hf::detail
