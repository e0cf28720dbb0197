// T5 (T5ForConditionalGeneration) from Hugging Face folders: the modules, the relative position buckets, the
// fp16 clamp, load_seq2seq, make_seq2seq and save_seq2seq. Semantics: models/hf_t5.h.
#include "models/hf_t5.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/io/json_limits.h"
#include "core/io/safetensors.h"

namespace ampscope::samples::hf {

// ---- Seq2SeqLM --------------------------------------------------------------------------------------

Tensor Seq2SeqLM::forward2(const Tensor& encoder_input, const Tensor& decoder_input) {
  const std::string model = describe();
  const auto check = [&](const Tensor& ids, const char* which) {
    if (!ids.defined() || ids.dtype() != DType::i64 || ids.dim() != 2 || ids.size(0) < 1 || ids.size(1) < 1) {
      throw ShapeError(fmt::format("{}: the {} input must be i64 token ids of shape [B, T] (B, T >= 1), got {}", model,
                                   which,
                                   ids.defined() ? fmt::format("{} of shape {}", dtype_name(ids.dtype()),
                                                               shape_str(ids.shape()))
                                                 : std::string("an undefined tensor")));
    }
  };
  check(encoder_input, "encoder");
  check(decoder_input, "decoder");
  if (encoder_input.size(0) != decoder_input.size(0)) {
    throw ShapeError(fmt::format("{}: the encoder input has batch {} but the decoder input has batch {}\nhint: "
                                 "the two inputs are the two halves of the same sequences, one row each",
                                 model, encoder_input.size(0), decoder_input.size(0)));
  }
  clamp_events_.clear();
  ScopeGuard scope(name());
  return forward_seq2seq(encoder_input, decoder_input);
}

Tensor Seq2SeqLM::forward(const Tensor&) {
  throw Error(fmt::format("{}: an encoder-decoder model takes two inputs (encoder and decoder token ids)\nhint: call "
                          "forward2(encoder_input, decoder_input)",
                          describe()));
}

std::int64_t relative_position_bucket(std::int64_t relative_position, bool bidirectional, std::int64_t num_buckets,
                                      std::int64_t max_distance) {
  if (num_buckets < 2 || (bidirectional && num_buckets < 4) || max_distance < 1) {
    throw ModelError(fmt::format("relative_position_bucket: needs num_buckets >= {} and max_distance >= 1, got {} "
                                 "and {}\nhint: T5 checkpoints use 32 buckets and max distance 128",
                                 bidirectional ? 4 : 2, num_buckets, max_distance));
  }
  std::int64_t bucket = 0;
  std::int64_t n = num_buckets;
  std::int64_t distance = 0;
  if (bidirectional) {
    n /= 2;
    if (relative_position > 0) bucket += n;
    distance = relative_position < 0 ? -relative_position : relative_position;
  } else {
    distance = relative_position < 0 ? -relative_position : 0;
  }
  const std::int64_t max_exact = n / 2;
  if (distance < max_exact) return bucket + distance;
  // HF: max_exact + (log(d.float() / max_exact) / math.log(max_distance / max_exact) * (n - max_exact)).to(long):
  // the quotient and the log in f32, the Python double log(max_distance / max_exact) used as an f32 scalar,
  // truncation toward zero.
  const float ratio = static_cast<float>(distance) / static_cast<float>(max_exact);
  const float log_ratio = std::log(ratio);
  const auto log_span =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = (log_ratio / log_span) * static_cast<float>(n - max_exact);
  const std::int64_t large = std::min<std::int64_t>(max_exact + static_cast<std::int64_t>(scaled), n - 1);
  return bucket + large;
}

Tensor seq2seq_loss(const Tensor& logits, const Tensor& labels) {
  if (logits.dim() != 3 || labels.dim() != 2 || logits.size(0) != labels.size(0) || logits.size(1) != labels.size(1)) {
    throw ShapeError(fmt::format("seq2seq_loss: logits must be [B, T, V] and labels [B, T], got {} and {}",
                                 shape_str(logits.shape()), shape_str(labels.shape())));
  }
  // HF: CrossEntropyLoss(ignore_index=-100)(lm_logits.view(-1, V), labels.view(-1)).
  return cross_entropy(logits.reshape({-1, logits.size(2)}), labels.reshape({-1}), Reduction::mean, -100);
}

namespace {

using detail::Config;

// Parameter values come from the sources the decoders use (models/hf_models.h): a generator, a shape-only dry
// run or a checkpoint. T5's layers are HF's nn.Linear(bias=False) and nn.Embedding.
using detail::CheckpointSource;
using detail::Embedding;
using detail::Linear;
using detail::RandomSource;
using detail::ShapeOnlySource;
using Source = detail::WeightSource;

// ---- the configuration ----

struct T5Config {
  std::int64_t vocab_size, d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads;
  std::int64_t num_buckets, max_distance;
  double eps, factor;
  bool gated;
  std::string act;  // "relu", "gelu" (erf), "gelu_new" (tanh composite)
  bool tied;
  std::int64_t decoder_start_token_id;
  std::int64_t n_positions;
};

T5Config parse_config(const Config& c) {
  T5Config t{};
  // T5Config's defaults (configuration_t5.py) where a key is absent, as HF does.
  t.vocab_size = c.positive_int("vocab_size", 32128);
  t.d_model = c.positive_int("d_model", 512);
  t.d_kv = c.positive_int("d_kv", 64);
  t.d_ff = c.positive_int("d_ff", 2048);
  t.num_layers = c.positive_int("num_layers", 6);
  t.num_decoder_layers = c.positive_int("num_decoder_layers", t.num_layers);
  t.num_heads = c.positive_int("num_heads", 8);
  t.num_buckets = c.positive_int("relative_attention_num_buckets", 32);
  t.max_distance = c.positive_int("relative_attention_max_distance", 128);
  if (t.num_buckets < 4) {
    c.refuse("relative_attention_num_buckets", fmt::format("must be at least 4, got {}", t.num_buckets),
             "T5 checkpoints use 32");
  }
  t.eps = c.number("layer_norm_epsilon", 1e-6);
  if (!(t.eps > 0)) c.refuse("layer_norm_epsilon", fmt::format("must be positive, got {}", t.eps), "T5 uses 1e-06");
  t.factor = c.number("initializer_factor", 1.0);
  // T5Config: act_info = feed_forward_proj.split("-"); gated when it starts with "gated-"; "gated-gelu" is
  // gelu_new (the tanh approximation).
  const std::string proj = c.string("feed_forward_proj", "relu");
  std::string act = proj;
  t.gated = proj.rfind("gated-", 0) == 0;
  if (t.gated) act = proj.substr(6);
  if (proj == "gated-gelu") act = "gelu_new";
  if (act != "relu" && act != "gelu" && act != "gelu_new") {
    c.refuse("feed_forward_proj", fmt::format("is '{}', which ampscope does not build", ampscope::detail::text_excerpt(proj)),
             "supported: \"relu\" (T5 v1.0), \"gated-gelu\" (T5 v1.1, flan-t5), and \"gelu\", \"gelu_new\" or "
             "\"relu\" with or without \"gated-\"");
  }
  t.act = act;
  t.tied = c.boolean("tie_word_embeddings", true);
  t.n_positions = c.positive_int("n_positions", 512);
  const auto start = c.optional_int("decoder_start_token_id");
  const auto pad = c.optional_int("pad_token_id");
  t.decoder_start_token_id = start ? *start : (pad ? *pad : 0);
  if (t.decoder_start_token_id < 0 || t.decoder_start_token_id >= t.vocab_size) {
    c.refuse(start ? "decoder_start_token_id" : "pad_token_id",
             fmt::format("is {}, outside the vocabulary [0, {})", t.decoder_start_token_id, t.vocab_size),
             "T5 starts the decoder with the pad token, id 0");
  }
  return t;
}

// ---- layers ----

// Modules that run through a method with more than one input: their one-tensor forward is not used.
[[noreturn]] void not_callable(const nn::Module& m) {
  throw Error(fmt::format("{}: this T5 layer takes more than one input and is run by its stack, not called "
                          "with one tensor",
                          m.describe()));
}

class List : public nn::Module {
 public:
  List() : nn::Module("ModuleList") {}
  template <class M>
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    return register_module(std::to_string(children().size()), std::move(m));
  }

 protected:
  Tensor forward(const Tensor&) override { not_callable(*this); }
};

class T5LayerNorm : public nn::Module {
 public:
  T5LayerNorm(Source& s, const std::string& path, std::int64_t dim, double eps, double factor)
      : nn::Module("T5LayerNorm"), eps_(eps) {
    register_parameter("weight", s.take(path + ".weight", {dim}, detail::init_constant(factor)));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor& w = parameter("weight");
    // The variance in f32 whatever x's dtype; x itself is multiplied as it is (f32 * f16 promotes to f32).
    const Tensor variance = mean(pow(x.to(DType::f32), 2.0), {-1}, true);
    Tensor h = mul(x, rsqrt(add(variance, eps_)));
    if (w.dtype() == DType::f16 || w.dtype() == DType::bf16) h = h.to(w.dtype());
    return mul(w, h);
  }

 private:
  double eps_;
};

// HF's NewGELUActivation, op for op (pow is on autocast's f32 list, so under autocast the result is f32).
Tensor gelu_new(const Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  // In Python's order (0.5 * input first; C++ leaves the order of a call's arguments open), so the op
  // sequence matches a PyTorch run's for `ampscope diff`.
  const Tensor half = mul(x, 0.5);
  const Tensor inner = mul(add(x, mul(pow(x, 3.0), 0.044715)), c);
  return mul(half, add(tanh(inner), 1.0));
}

class DenseReluDense : public nn::Module {
 public:
  DenseReluDense(Source& s, const std::string& path, const T5Config& c)
      : nn::Module(c.gated ? "T5DenseGatedActDense" : "T5DenseActDense"), gated_(c.gated), act_(c.act) {
    const double in_std = c.factor * std::pow(static_cast<double>(c.d_model), -0.5);
    const double out_std = c.factor * std::pow(static_cast<double>(c.d_ff), -0.5);
    if (gated_) {
      wi_0_ = register_module("wi_0", std::make_shared<Linear>(s, path + ".wi_0", c.d_model, c.d_ff, false, in_std));
      wi_1_ = register_module("wi_1", std::make_shared<Linear>(s, path + ".wi_1", c.d_model, c.d_ff, false, in_std));
    } else {
      wi_ = register_module("wi", std::make_shared<Linear>(s, path + ".wi", c.d_model, c.d_ff, false, in_std));
    }
    wo_ = register_module("wo", std::make_shared<Linear>(s, path + ".wo", c.d_ff, c.d_model, false, out_std));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    Tensor h;
    if (gated_) {
      // hidden_gelu = act(wi_0(x)), then hidden_linear = wi_1(x), as HF runs them.
      const Tensor gate = activate((*wi_0_)(x));
      h = mul(gate, (*wi_1_)(x));
    } else {
      h = activate((*wi_)(x));
    }
    // HF casts wo's input to wo's weight dtype (kept in f32 for 8-bit flan-t5-xxl); under autocast with f32
    // weights this is an f16 -> f32 -> f16 round trip around wo's own cast, which changes no value.
    if (h.dtype() != wo_->weight().dtype()) h = h.to(wo_->weight().dtype());
    return (*wo_)(h);
  }

 private:
  Tensor activate(const Tensor& x) const {
    if (act_ == "relu") return relu(x);
    if (act_ == "gelu") return gelu(x, GeluApproximation::none);
    return gelu_new(x);
  }
  bool gated_;
  std::string act_;
  std::shared_ptr<Linear> wi_, wi_0_, wi_1_, wo_;
};

class T5Attention : public nn::Module {
 public:
  T5Attention(Source& s, const std::string& path, const T5Config& c, bool has_bias, bool is_decoder)
      : nn::Module("T5Attention"),
        heads_(c.num_heads),
        d_kv_(c.d_kv),
        num_buckets_(c.num_buckets),
        max_distance_(c.max_distance),
        is_decoder_(is_decoder) {
    const auto d = static_cast<double>(c.d_model);
    const std::int64_t inner = c.num_heads * c.d_kv;
    q_ = register_module("q", std::make_shared<Linear>(s, path + ".q", c.d_model, inner, false,
                                                      c.factor * std::pow(d * static_cast<double>(c.d_kv), -0.5)));
    k_ = register_module(
        "k", std::make_shared<Linear>(s, path + ".k", c.d_model, inner, false, c.factor * std::pow(d, -0.5)));
    v_ = register_module(
        "v", std::make_shared<Linear>(s, path + ".v", c.d_model, inner, false, c.factor * std::pow(d, -0.5)));
    o_ = register_module("o", std::make_shared<Linear>(s, path + ".o", inner, c.d_model, false,
                                                      c.factor * std::pow(static_cast<double>(inner), -0.5)));
    if (has_bias) {
      bias_ = register_module("relative_attention_bias",
                              std::make_shared<Embedding>(s, path + ".relative_attention_bias", c.num_buckets,
                                                          c.num_heads, c.factor * std::pow(d, -0.5)));
    }
  }

  // HF's compute_bias: relative_attention_bias(bucket(key - query)) [Tq, Tk, H] -> [H, Tq, Tk] (HF's leading
  // 1 is left to broadcasting). Runs in this module's scope.
  Tensor compute_bias(std::int64_t query_length, std::int64_t key_length) {
    ScopeGuard scope(name());
    std::vector<double> buckets(static_cast<std::size_t>(query_length * key_length));
    for (std::int64_t i = 0; i < query_length; ++i) {
      for (std::int64_t j = 0; j < key_length; ++j) {
        buckets[static_cast<std::size_t>(i * key_length + j)] =
            static_cast<double>(relative_position_bucket(j - i, !is_decoder_, num_buckets_, max_distance_));
      }
    }
    const Device device = bias_->weight().device();
    Tensor ids = from_values(buckets, {query_length, key_length}, {DType::i64}).to(device);
    return (*bias_)(ids).permute({2, 0, 1});
  }

  // hidden [B, T, d]; key_value [B, S, d] for cross-attention (undefined: self-attention); position_bias
  // [H, T, S] or undefined; causal hides keys after the query.
  Tensor attend(const Tensor& hidden, const Tensor& key_value, const Tensor& position_bias, bool causal) {
    ScopeGuard scope(name());
    const std::int64_t batch = hidden.size(0);
    const std::int64_t t = hidden.size(1);
    const Tensor& kv = key_value.defined() ? key_value : hidden;
    const auto heads = [&](const Tensor& x) { return x.reshape({batch, -1, heads_, d_kv_}).transpose(1, 2); };
    const Tensor q = heads((*q_)(hidden));
    const Tensor k = heads((*k_)(kv));
    const Tensor v = heads((*v_)(kv));
    Tensor scores = matmul(q, k.transpose(3, 2));  // [B, H, T, S], not scaled
    const DType dtype = scores.dtype();
    if (position_bias.defined()) {
      // HF: scores += position_bias (in place: computed in the promoted dtype, stored in the scores' dtype).
      scores = add(scores, position_bias).to(dtype);
    }
    if (causal) {
      const std::int64_t s = scores.size(3);
      std::vector<double> hide(static_cast<std::size_t>(t * s), 0.0);
      for (std::int64_t i = 0; i < t; ++i) {
        for (std::int64_t j = i + 1; j < s; ++j) hide[static_cast<std::size_t>(i * s + j)] = 1.0;
      }
      const Tensor mask = from_values(hide, {t, s}, {DType::boolean}).to(scores.device());
      scores = masked_fill(scores, mask, detail::finfo_min(dtype));
    }
    // HF: softmax(scores.float(), dim=-1).type_as(scores)
    const Tensor weights = softmax(scores.to(DType::f32), -1).to(dtype);
    const Tensor out = matmul(weights, v).transpose(1, 2).reshape({batch, t, heads_ * d_kv_});
    return (*o_)(out);
  }

 protected:
  Tensor forward(const Tensor&) override { not_callable(*this); }

 private:
  std::int64_t heads_, d_kv_, num_buckets_, max_distance_;
  bool is_decoder_;
  std::shared_ptr<Linear> q_, k_, v_, o_;
  std::shared_ptr<Embedding> bias_;
};

// layer.0 (self-attention) and, in the decoder, layer.1 (cross-attention): h + attention(layer_norm(h)).
class T5LayerAttention : public nn::Module {
 public:
  T5LayerAttention(Source& s, const std::string& path, const T5Config& c, bool cross, bool has_bias, bool is_decoder)
      : nn::Module(cross ? "T5LayerCrossAttention" : "T5LayerSelfAttention") {
    const std::string child = cross ? "EncDecAttention" : "SelfAttention";
    attention_ = register_module(child, std::make_shared<T5Attention>(s, path + "." + child, c, has_bias, is_decoder));
    layer_norm_ = register_module("layer_norm", std::make_shared<T5LayerNorm>(s, path + ".layer_norm", c.d_model,
                                                                              c.eps, c.factor));
  }
  T5Attention& attention() { return *attention_; }

  Tensor run(const Tensor& hidden, const Tensor& key_value, const Tensor& position_bias, bool causal) {
    ScopeGuard scope(name());
    const Tensor normed = (*layer_norm_)(hidden);
    return add(hidden, attention_->attend(normed, key_value, position_bias, causal));
  }

 protected:
  Tensor forward(const Tensor&) override { not_callable(*this); }

 private:
  std::shared_ptr<T5Attention> attention_;
  std::shared_ptr<T5LayerNorm> layer_norm_;
};

// The last layer of a block: h + DenseReluDense(layer_norm(h)).
class T5LayerFF : public nn::Module {
 public:
  T5LayerFF(Source& s, const std::string& path, const T5Config& c) : nn::Module("T5LayerFF") {
    dense_ = register_module("DenseReluDense", std::make_shared<DenseReluDense>(s, path + ".DenseReluDense", c));
    layer_norm_ = register_module("layer_norm", std::make_shared<T5LayerNorm>(s, path + ".layer_norm", c.d_model,
                                                                              c.eps, c.factor));
  }

 protected:
  Tensor forward(const Tensor& x) override { return add(x, (*dense_)((*layer_norm_)(x))); }

 private:
  std::shared_ptr<DenseReluDense> dense_;
  std::shared_ptr<T5LayerNorm> layer_norm_;
};

// Notes a firing of the clamp in the model (defined after T5Model).
void record_clamp(Seq2SeqLM& model, ClampEvent event);

class T5Block : public nn::Module {
 public:
  T5Block(Source& s, const std::string& path, const T5Config& c, bool is_decoder, bool has_bias)
      : nn::Module("T5Block"), is_decoder_(is_decoder) {
    auto layers = register_module("layer", std::make_shared<List>());
    self_ = layers->add(std::make_shared<T5LayerAttention>(s, path + ".layer.0", c, false, has_bias, is_decoder));
    if (is_decoder) {
      cross_ = layers->add(std::make_shared<T5LayerAttention>(s, path + ".layer.1", c, true, false, is_decoder));
    }
    ff_ = layers->add(std::make_shared<T5LayerFF>(s, path + (is_decoder ? ".layer.2" : ".layer.1"), c));
  }
  T5LayerAttention& self_attention() { return *self_; }

  Tensor run(const Tensor& hidden, const Tensor& position_bias, const Tensor& encoder_output, Seq2SeqLM& model,
             bool clamp) {
    ScopeGuard scope(name());
    Tensor h = self_->run(hidden, Tensor(), position_bias, is_decoder_);
    if (clamp) h = clamp_inf(h, "layer.0.SelfAttention", model);
    if (is_decoder_) {
      h = cross_->run(h, encoder_output, Tensor(), false);
      if (clamp) h = clamp_inf(h, "layer.1.EncDecAttention", model);
    }
    h = (*ff_)(h);
    if (clamp) h = clamp_inf(h, is_decoder_ ? "layer.2.DenseReluDense" : "layer.1.DenseReluDense", model);
    return h;
  }

 protected:
  Tensor forward(const Tensor&) override { not_callable(*this); }

 private:
  Tensor clamp_inf(const Tensor& h, const char* after, Seq2SeqLM& model);

  bool is_decoder_;
  std::shared_ptr<T5LayerAttention> self_, cross_;
  std::shared_ptr<T5LayerFF> ff_;
};

class T5Stack : public nn::Module {
 public:
  T5Stack(Source& s, const std::string& path, const T5Config& c, bool is_decoder, std::shared_ptr<Embedding> shared)
      : nn::Module("T5Stack"), is_decoder_(is_decoder), shared_(std::move(shared)) {
    auto blocks = register_module("block", std::make_shared<List>());
    const std::int64_t n = is_decoder ? c.num_decoder_layers : c.num_layers;
    for (std::int64_t i = 0; i < n; ++i) {
      blocks_.push_back(
          blocks->add(std::make_shared<T5Block>(s, fmt::format("{}.block.{}", path, i), c, is_decoder, i == 0)));
    }
    final_layer_norm_ = register_module(
        "final_layer_norm", std::make_shared<T5LayerNorm>(s, path + ".final_layer_norm", c.d_model, c.eps, c.factor));
  }

  Tensor run(const Tensor& ids, const Tensor& encoder_output, Seq2SeqLM& model, bool clamp) {
    ScopeGuard scope(name());
    Tensor h;
    {
      // HF's self.embed_tokens is the shared embedding: the lookup runs in "encoder.embed_tokens".
      ScopeGuard embed_scope(name() + ".embed_tokens");
      h = embedding(ids, shared_->weight());
    }
    const std::int64_t t = ids.size(1);
    // Block 0's table, computed once and shared by every block of the stack (HF passes position_bias on).
    const Tensor position_bias = blocks_.front()->self_attention().attention().compute_bias(t, t);
    for (const auto& block : blocks_) h = block->run(h, position_bias, encoder_output, model, clamp);
    return (*final_layer_norm_)(h);
  }

 protected:
  Tensor forward(const Tensor&) override { not_callable(*this); }

 private:
  bool is_decoder_;
  std::shared_ptr<Embedding> shared_;
  std::vector<std::shared_ptr<T5Block>> blocks_;
  std::shared_ptr<T5LayerNorm> final_layer_norm_;
};

// HF's T5Block clamp, when the option is on: see hf_t5.h for when it applies.
Tensor T5Block::clamp_inf(const Tensor& h, const char* after, Seq2SeqLM& model) {
  const bool f16_run = h.dtype() == DType::f16 || (autocast_enabled() && autocast_dtype() == DType::f16);
  if (!f16_run) return h;
  std::int64_t infs = 0;
  {
    NoGradGuard no_grad;
    RuntimeInternalGuard internal;  // the check is not part of the model's math
    for (double v : h.values()) infs += std::isinf(v) ? 1 : 0;
  }
  if (infs == 0) return h;
  record_clamp(model, {name(), after, infs});
  return clamp(h, -kT5ClampValue, kT5ClampValue);
}

class T5Model : public Seq2SeqLM {
 public:
  T5Model(const Config& config, Source& s) : Seq2SeqLM("T5ForConditionalGeneration"), c_(parse_config(config)) {
    config_ = config.json();
    shared_ = register_module("shared", std::make_shared<Embedding>(s, "shared", c_.vocab_size, c_.d_model,
                                                                    c_.factor * 1.0));
    encoder_ = register_module("encoder", std::make_shared<T5Stack>(s, "encoder", c_, false, shared_));
    decoder_ = register_module("decoder", std::make_shared<T5Stack>(s, "decoder", c_, true, shared_));
    if (!c_.tied) {
      lm_head_ = register_module("lm_head", std::make_shared<Linear>(s, "lm_head", c_.d_model, c_.vocab_size, false,
                                                                     c_.factor * 1.0));
    }
  }

  std::string model_type() const override { return "t5"; }
  std::int64_t vocab_size() const override { return c_.vocab_size; }
  std::int64_t decoder_start_token_id() const override { return c_.decoder_start_token_id; }
  std::int64_t max_positions() const override { return c_.n_positions; }
  std::int64_t num_layers() const override { return c_.num_layers; }
  std::int64_t num_decoder_layers() const override { return c_.num_decoder_layers; }
  std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() override { return named_parameters(); }
  bool tied() const { return c_.tied; }
  void record_clamp(ClampEvent e) { note_clamp(std::move(e)); }

 protected:
  Tensor forward_seq2seq(const Tensor& encoder_input, const Tensor& decoder_input) override {
    const bool clamp = clamp_inf();
    const Tensor encoded = encoder_->run(encoder_input, Tensor(), *this, clamp);
    Tensor h = decoder_->run(decoder_input, encoded, *this, clamp);
    if (c_.tied) {
      // Mesh TensorFlow's rescale before the tied projection (HF: sequence_output * model_dim**-0.5).
      h = mul(h, std::pow(static_cast<double>(c_.d_model), -0.5));
      ScopeGuard scope("lm_head");
      return linear(h, shared_->weight());
    }
    return (*lm_head_)(h);
  }

 private:
  T5Config c_;
  std::shared_ptr<Embedding> shared_;
  std::shared_ptr<T5Stack> encoder_, decoder_;
  std::shared_ptr<Linear> lm_head_;
};

std::shared_ptr<T5Model> build(const Config& config, Source& source) {
  const std::string type = config.has("model_type") ? config.string("model_type", "") : "";
  if (type != "t5") {
    throw ModelError(fmt::format("{}: model_type is '{}', but load_seq2seq builds T5 (model_type \"t5\")\nhint: load "
                                 "decoder-only models (gpt2, llama, mistral) with load_model",
                                 config.where(), ampscope::detail::text_excerpt(type)));
  }
  return std::make_shared<T5Model>(config, source);
}

bool equal(const Tensor& a, const Tensor& b) { return a.shape() == b.shape() && a.values() == b.values(); }

void record_clamp(Seq2SeqLM& model, ClampEvent event) {
  static_cast<T5Model&>(model).record_clamp(std::move(event));
}

}  // namespace

bool is_seq2seq_folder(const std::filesystem::path& folder) {
  const nlohmann::json json = detail::read_config(folder);
  return json.is_object() && json.contains("model_type") && json.at("model_type").is_string() &&
         json.at("model_type").get<std::string>() == "t5";
}

LoadedSeq2Seq load_seq2seq(const std::filesystem::path& folder, const LoadOptions& options) {
  const nlohmann::json json = detail::read_config(folder);
  const Config config(json, (folder / "config.json").string());
  std::vector<safetensors::NonFiniteTensor> nonfinite;
  std::map<std::string, Tensor> stored = safetensors::load_folder(folder, DType::f32, &nonfinite);
  {
    // Validates the config (and refuses what is refused) before the weights are used.
    ShapeOnlySource dry(folder.string(), stored.size(),
                        "num_layers and num_decoder_layers with the checkpoint's block names");
    (void)build(config, dry);
  }
  LoadReport report;
  const std::string kEncEmbed = "encoder.embed_tokens.weight", kDecEmbed = "decoder.embed_tokens.weight";
  const std::string kStaleBias = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight";
  if (stored.erase(kStaleBias) != 0) report.ignored.push_back(kStaleBias);
  // The shared embedding under any of its tied names: "shared.weight" first, else a stack's embed_tokens.
  std::string shared_from = "shared.weight";
  if (stored.count("shared.weight") == 0) {
    for (const std::string& alias : {kEncEmbed, kDecEmbed}) {
      if (stored.count(alias) != 0) {
        stored["shared.weight"] = stored.at(alias);
        stored.erase(alias);
        shared_from = alias;
        break;
      }
    }
  }
  CheckpointSource source(std::move(stored));
  std::shared_ptr<T5Model> model = build(config, source);
  if (source.missing_.empty() && source.wrong_shapes_.empty()) {
    const Tensor& shared = model->child("shared")->parameter("weight");
    std::vector<std::string> copies = {kEncEmbed, kDecEmbed};
    if (model->tied()) copies.push_back("lm_head.weight");
    for (const std::string& name : copies) {
      auto it = source.tensors_.find(name);
      if (it == source.tensors_.end()) continue;
      if (!equal(it->second, shared)) {
        const bool head = name == "lm_head.weight";
        throw ModelError(fmt::format(
            "{}: '{}' differs from '{}', but T5 ties it to the shared embedding{}\nhint: {}", folder.string(), name,
            shared_from, head ? " (tie_word_embeddings is true, or absent)" : "",
            head ? "set \"tie_word_embeddings\": false in config.json to use the checkpoint's head as its own parameter"
                 : "keep one copy of the embedding (HF ties encoder.embed_tokens and decoder.embed_tokens to shared)"));
      }
      report.ignored.push_back(name);
      source.tensors_.erase(it);
    }
  }
  if (!source.missing_.empty() || !source.wrong_shapes_.empty()) {
    std::string msg = fmt::format("{}: the checkpoint does not fit the t5 config", folder.string());
    if (!source.missing_.empty()) {
      msg += fmt::format("\n{} missing weight{}: {}", source.missing_.size(), source.missing_.size() == 1 ? "" : "s",
                         fmt::join(source.missing_, ", "));
    }
    for (const auto& w : source.wrong_shapes_) msg += "\nwrong shape: " + w;
    msg += "\nhint: the weights must come from a model with this config.json (same sizes and block counts); a "
           "missing lm_head.weight with tie_word_embeddings false means the head was not saved";
    throw ModelError(msg);
  }
  for (const auto& [name, t] : source.tensors_) report.unexpected.push_back(name);
  std::sort(report.ignored.begin(), report.ignored.end());
  detail::check_nonfinite(folder, nonfinite, report, options);
  return {model, report};
}

std::shared_ptr<Seq2SeqLM> make_seq2seq(const nlohmann::json& config, Generator& gen) {
  RandomSource source(gen);
  return build(Config(config, "config"), source);
}

void save_seq2seq(Seq2SeqLM& model, const std::filesystem::path& folder) {
  detail::save_folder(model.config(), model.checkpoint_tensors(), folder);
}

}  // namespace ampscope::samples::hf
