// Llama (LlamaForCausalLM) and Mistral (MistralForCausalLM) from a Hugging Face config, op for op as
// transformers' modeling_llama.py (v4.48+, eager attention) and modular_mistral.py run them. The semantics
// are listed in models/hf_models.h.
#include <cmath>

#include <fmt/format.h>

#include "core/io/json_limits.h"
#include "core/ops.h"
#include "models/hf_models.h"

namespace ampscope::samples::hf::detail {

namespace {

using ampscope::detail::text_excerpt;

struct LlamaConfig {
  bool mistral;
  std::int64_t vocab, positions, hidden, intermediate, layers, heads, kv_heads, head_dim;
  std::optional<std::int64_t> pad, sliding_window;
  double eps, init_range, rope_theta;
  bool attention_bias, mlp_bias, tied;
};

LlamaConfig parse(const Config& c) {
  LlamaConfig l{};
  l.mistral = c.string("model_type", "llama") == "mistral";
  l.vocab = c.positive_int("vocab_size");
  l.positions = c.positive_int("max_position_embeddings");
  l.hidden = c.positive_int("hidden_size");
  l.intermediate = c.positive_int("intermediate_size");
  l.layers = c.positive_int("num_hidden_layers");
  l.heads = c.positive_int("num_attention_heads");
  l.kv_heads = c.positive_int("num_key_value_heads", l.heads);  // null or absent: as many as heads (HF)
  if (l.heads % l.kv_heads != 0) {
    c.refuse("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})", l.kv_heads, l.heads),
             "fix num_key_value_heads");
  }
  if (c.has("head_dim")) {
    l.head_dim = c.positive_int("head_dim");
  } else {
    if (l.hidden % l.heads != 0) {
      c.refuse("num_attention_heads", fmt::format("({}) must divide hidden_size ({}) when head_dim is not given",
                                                  l.heads, l.hidden),
               "give head_dim or fix the sizes");
    }
    l.head_dim = l.hidden / l.heads;
  }
  if (l.head_dim % 2 != 0) {
    c.refuse("head_dim", fmt::format("is {}: rotary embeddings rotate pairs, so it must be even", l.head_dim),
             "fix head_dim (or hidden_size / num_attention_heads)");
  }
  // RMSNorm multiplies by rsqrt(mean(x^2) + eps): a zero or negative epsilon gives Inf or NaN on a zero row.
  l.eps = c.positive_number("rms_norm_eps", 1e-6);
  l.init_range = c.number("initializer_range", 0.02);
  // inv_freq = 1 / theta^(2i/d): a theta of 0 or below makes the angles Inf or NaN.
  l.rope_theta = c.positive_number("rope_theta", 10000.0);
  const std::string act = c.string("hidden_act", "silu");
  if (act != "silu") {
    c.refuse("hidden_act", fmt::format("is '{}', which ampscope does not implement for {}", text_excerpt(act),
                                       l.mistral ? "mistral" : "llama"),
             "supported: silu (Llama's and Mistral's)");
  }
  if (c.has("rope_scaling")) {
    const nlohmann::json& rs = c.json().at("rope_scaling");
    std::string kind = "an unknown kind";
    if (rs.is_object()) {
      for (const char* k : {"rope_type", "type"}) {
        if (rs.contains(k) && rs.at(k).is_string()) kind = "'" + text_excerpt(rs.at(k).get<std::string>()) + "'";
      }
    }
    c.refuse("rope_scaling", fmt::format("asks for {} RoPE scaling, which ampscope does not implement", kind),
             "ampscope implements the default rotary embedding only (rope_scaling null); use a checkpoint without "
             "scaling, or set it to null if the context stays within the original length");
  }
  if (c.has("partial_rotary_factor") && c.number("partial_rotary_factor", 1.0) != 1.0) {
    c.refuse("partial_rotary_factor", "is not 1, which ampscope does not implement", "use a full rotary embedding");
  }
  // Mistral's layers have no biases whatever the config says (modular_mistral.py).
  l.attention_bias = !l.mistral && c.boolean("attention_bias", false);
  l.mlp_bias = !l.mistral && c.boolean("mlp_bias", false);
  l.tied = c.boolean("tie_word_embeddings", false);
  l.pad = c.optional_int("pad_token_id");
  if (l.pad && (*l.pad < 0 || *l.pad >= l.vocab)) {
    c.refuse("pad_token_id", fmt::format("({}) is not a token id below vocab_size ({})", *l.pad, l.vocab),
             "fix pad_token_id or set it to null");
  }
  if (l.mistral && c.has("sliding_window")) l.sliding_window = c.positive_int("sliding_window");
  (void)c.number("attention_dropout", 0.0);  // read (type-checked) and ignored: dropout is off
  return l;
}

// What every layer's attention needs for one forward pass, computed once by the model as HF does
// (position_embeddings and causal_mask are passed down to the layers).
struct ForwardContext {
  Tensor cos, sin;  // [1, 1, T, head_dim] in the hidden states' dtype
  Tensor mask;      // [1, 1, T, T] in the hidden states' dtype: 0 or finfo.min
};

// rotate_half(x) = cat(-x2, x1) over the last dimension.
Tensor rotate_half(const Tensor& x) {
  const std::int64_t d = x.size(-1);
  return cat({neg(x.slice(-1, d / 2, d)), x.slice(-1, 0, d / 2)}, -1);
}

// repeat_kv: [B, kv, T, d] -> [B, kv * n, T, d], each key/value head repeated n times in place.
Tensor repeat_kv(const Tensor& x, std::int64_t n) {
  if (n == 1) return x;
  const std::int64_t B = x.size(0), kv = x.size(1), T = x.size(2), d = x.size(3);
  return x.reshape({B, kv, 1, T, d}).expand({B, kv, n, T, d}).reshape({B, kv * n, T, d});
}

class LlamaRMSNorm : public nn::Module {
 public:
  LlamaRMSNorm(WeightSource& src, const std::string& path, std::int64_t dim, double eps)
      : nn::Module("LlamaRMSNorm"), eps_(eps) {
    register_parameter("weight", src.take(path + ".weight", {dim}, init_ones()));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const DType input_dtype = x.dtype();
    const Tensor h = x.to(DType::f32);
    const Tensor variance = mean(pow(h, 2.0), {-1}, true);
    const Tensor normed = mul(h, rsqrt(add(variance, eps_)));
    return mul(parameter("weight"), normed.to(input_dtype));
  }

 private:
  double eps_;
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(WeightSource& src, const std::string& path, const LlamaConfig& l,
                 std::shared_ptr<ForwardContext> context)
      : nn::Module(l.mistral ? "MistralAttention" : "LlamaAttention"),
        heads_(l.heads),
        kv_heads_(l.kv_heads),
        head_dim_(l.head_dim),
        context_(std::move(context)) {
    const auto proj = [&](const char* name, std::int64_t in, std::int64_t out) {
      return register_module(name, std::make_shared<Linear>(src, path + "." + name, in, out, l.attention_bias,
                                                            l.init_range));
    };
    q_proj_ = proj("q_proj", l.hidden, l.heads * l.head_dim);
    k_proj_ = proj("k_proj", l.hidden, l.kv_heads * l.head_dim);
    v_proj_ = proj("v_proj", l.hidden, l.kv_heads * l.head_dim);
    o_proj_ = proj("o_proj", l.heads * l.head_dim, l.hidden);
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const std::int64_t B = x.size(0), T = x.size(1);
    const auto heads = [&](const Tensor& t) { return t.view({B, T, -1, head_dim_}).transpose(1, 2); };
    Tensor q = heads((*q_proj_)(x));
    Tensor k = heads((*k_proj_)(x));
    Tensor v = heads((*v_proj_)(x));
    const ForwardContext& c = *context_;
    // apply_rotary_pos_emb: (q * cos) + (rotate_half(q) * sin), in Python's order of evaluation (one statement
    // per product: C++ leaves the order of a call's arguments open), so the op sequence, and the occurrences
    // `ampscope diff` pairs rows by, match a PyTorch run's.
    const Tensor q_cos = mul(q, c.cos);
    q = add(q_cos, mul(rotate_half(q), c.sin));
    const Tensor k_cos = mul(k, c.cos);
    k = add(k_cos, mul(rotate_half(k), c.sin));
    // eager_attention_forward
    k = repeat_kv(k, heads_ / kv_heads_);
    v = repeat_kv(v, heads_ / kv_heads_);
    Tensor w = mul(matmul(q, k.transpose(2, 3)), std::pow(static_cast<double>(head_dim_), -0.5));
    w = add(w, c.mask);
    w = softmax(w, -1, DType::f32).to(q.dtype());
    const Tensor out = matmul(w, v).transpose(1, 2).contiguous().reshape({B, T, -1});
    return (*o_proj_)(out);
  }

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
  std::shared_ptr<ForwardContext> context_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, o_proj_;
};

class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(WeightSource& src, const std::string& path, const LlamaConfig& l)
      : nn::Module(l.mistral ? "MistralMLP" : "LlamaMLP") {
    gate_proj_ = register_module(
        "gate_proj", std::make_shared<Linear>(src, path + ".gate_proj", l.hidden, l.intermediate, l.mlp_bias, l.init_range));
    up_proj_ = register_module(
        "up_proj", std::make_shared<Linear>(src, path + ".up_proj", l.hidden, l.intermediate, l.mlp_bias, l.init_range));
    down_proj_ = register_module("down_proj", std::make_shared<Linear>(src, path + ".down_proj", l.intermediate,
                                                                       l.hidden, l.mlp_bias, l.init_range));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor gate = silu((*gate_proj_)(x))  /* F.silu, one op */;
    return (*down_proj_)(mul(gate, (*up_proj_)(x)));
  }

 private:
  std::shared_ptr<Linear> gate_proj_, up_proj_, down_proj_;
};

class LlamaDecoderLayer : public nn::Module {
 public:
  LlamaDecoderLayer(WeightSource& src, const std::string& path, const LlamaConfig& l,
                    std::shared_ptr<ForwardContext> context)
      : nn::Module(l.mistral ? "MistralDecoderLayer" : "LlamaDecoderLayer") {
    // HF's construction order: self_attn, mlp, input_layernorm, post_attention_layernorm.
    self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(src, path + ".self_attn", l, context));
    mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(src, path + ".mlp", l));
    input_layernorm_ = register_module(
        "input_layernorm", std::make_shared<LlamaRMSNorm>(src, path + ".input_layernorm", l.hidden, l.eps));
    post_attention_layernorm_ = register_module(
        "post_attention_layernorm",
        std::make_shared<LlamaRMSNorm>(src, path + ".post_attention_layernorm", l.hidden, l.eps));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, (*self_attn_)((*input_layernorm_)(x)));      // residual + hidden_states
    return add(h, (*mlp_)((*post_attention_layernorm_)(h)));
  }

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMLP> mlp_;
  std::shared_ptr<LlamaRMSNorm> input_layernorm_, post_attention_layernorm_;
};

class LlamaModel : public nn::Module {
 public:
  LlamaModel(WeightSource& src, const LlamaConfig& l)
      : nn::Module(l.mistral ? "MistralModel" : "LlamaModel"), l_(l), context_(std::make_shared<ForwardContext>()) {
    embed_tokens_ = register_module("embed_tokens", std::make_shared<Embedding>(src, "model.embed_tokens", l.vocab,
                                                                                l.hidden, l.init_range, l.pad));
    layers_ = register_module("layers", std::make_shared<ModuleList>());
    for (std::int64_t i = 0; i < l.layers; ++i) {
      layers_->push_back(std::make_shared<LlamaDecoderLayer>(src, fmt::format("model.layers.{}", i), l, context_));
    }
    norm_ = register_module("norm", std::make_shared<LlamaRMSNorm>(src, "model.norm", l.hidden, l.eps));
  }
  std::shared_ptr<Embedding> embed_tokens() const { return embed_tokens_; }

 protected:
  Tensor forward(const Tensor& tokens) override {
    const Tensor h = (*embed_tokens_)(tokens);
    const std::int64_t T = tokens.size(1);
    set_context(T, h.dtype(), h.device());
    struct Clear {  // the context holds tensors of this pass only
      ForwardContext& c;
      ~Clear() { c = ForwardContext{}; }
    } clear{*context_};
    return (*norm_)((*layers_)(h));
  }

 private:
  // LlamaRotaryEmbedding (default rope) and the causal mask, on the host, as HF computes them in f32.
  void set_context(std::int64_t T, DType dtype, Device device) {
    const std::int64_t d = l_.head_dim, half = d / 2;
    std::vector<double> cos_v(static_cast<std::size_t>(T * d)), sin_v(cos_v.size());
    const float base = static_cast<float>(l_.rope_theta);
    for (std::int64_t i = 0; i < half; ++i) {
      // inv_freq = 1.0 / (base ** (arange(0, dim, 2).float() / dim)), each step in f32.
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(d);
      const float inv_freq = 1.0f / std::pow(base, exponent);
      for (std::int64_t t = 0; t < T; ++t) {
        const float angle = inv_freq * static_cast<float>(t);  // the f32 product inv_freq @ position_ids
        const double c = static_cast<double>(std::cos(angle)), s = static_cast<double>(std::sin(angle));
        for (const std::int64_t col : {i, i + half}) {  // emb = cat(freqs, freqs)
          cos_v[static_cast<std::size_t>(t * d + col)] = c;
          sin_v[static_cast<std::size_t>(t * d + col)] = s;
        }
      }
    }
    context_->cos = from_values(cos_v, {1, 1, T, d}).to(dtype).to(device);
    context_->sin = from_values(sin_v, {1, 1, T, d}).to(dtype).to(device);
    // Additive mask in the hidden states' dtype: 0 where key j is visible from query i (j <= i, and with a
    // sliding window i - j < window), finfo(dtype).min elsewhere.
    std::vector<double> mask(static_cast<std::size_t>(T * T));
    const double lowest = finfo_min(dtype);
    for (std::int64_t i = 0; i < T; ++i) {
      for (std::int64_t j = 0; j < T; ++j) {
        const bool visible = j <= i && (!l_.sliding_window || i - j < *l_.sliding_window);
        mask[static_cast<std::size_t>(i * T + j)] = visible ? 0.0 : lowest;
      }
    }
    context_->mask = from_values(mask, {1, 1, T, T}, {dtype}).to(device);
  }

  LlamaConfig l_;
  std::shared_ptr<ForwardContext> context_;
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<LlamaRMSNorm> norm_;
};

class LlamaForCausalLM : public CausalLM {
 public:
  LlamaForCausalLM(const Config& c, WeightSource& src)
      : CausalLM(c.string("model_type", "llama") == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"),
        l_(parse(c)) {
    config_ = c.json();
    checkpoint_prefix_ = "model.";
    model_ = register_module("model", std::make_shared<LlamaModel>(src, l_));
    if (l_.tied) {
      register_module("lm_head", std::make_shared<TiedHead>(model_->embed_tokens()));
    } else {
      register_module("lm_head", std::make_shared<Linear>(src, "lm_head", l_.hidden, l_.vocab, false, l_.init_range));
    }
  }

  std::string model_type() const override { return l_.mistral ? "mistral" : "llama"; }
  std::int64_t vocab_size() const override { return l_.vocab; }
  std::int64_t max_positions() const override { return l_.positions; }
  std::int64_t num_layers() const override { return l_.layers; }

  std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (auto& [name, p] : named_parameters()) {
      // Our names carry "model."; a LlamaModel layout ("" prefix) drops it.
      const bool base = name.rfind("model.", 0) == 0;
      out.emplace_back(base ? checkpoint_prefix_ + name.substr(6) : name, p);
    }
    return out;
  }

 protected:
  Tensor forward(const Tensor& tokens) override {
    check_tokens(tokens, type_name(), 0);
    return (*child("lm_head"))((*model_)(tokens));
  }

 private:
  LlamaConfig l_;
  std::shared_ptr<LlamaModel> model_;
};

}  // namespace

std::shared_ptr<CausalLM> build_llama(const Config& config, WeightSource& source) {
  return std::make_shared<LlamaForCausalLM>(config, source);
}

}  // namespace ampscope::samples::hf::detail
