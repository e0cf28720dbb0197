// models/hf_models.h: decoder-only language models loaded from Hugging Face model folders (config.json plus
// model.safetensors, or model.safetensors.index.json and its shards), built from ampscope nn modules whose
// paths are the checkpoint's own names, so a trace says "h.3.mlp.c_fc" or "model.layers.3.self_attn.q_proj".
//
//   auto loaded = ampscope::samples::hf::load_model("gpt2/");   // ModelError when weights are missing
//   for (const auto& name : loaded.report.unexpected) fmt::print("unused: {}\n", name);
//   Tensor logits = (*loaded.model)(tokens);                    // tokens i64 [B, T] -> [B, T, vocab]
//   ampscope::samples::hf::save_model(*loaded.model, "out/");   // config.json + model.safetensors
//
// Semantics are those of the Hugging Face transformers implementations, read from its sources (eager
// attention path): models/gpt2/modeling_gpt2.py and pytorch_utils.py (Conv1D) as of v4.4x, and
// models/llama/modeling_llama.py and models/mistral/modular_mistral.py as of v4.48+ (rotary embeddings
// computed once per forward at the model level, attention scaled by multiplying with head_dim**-0.5). Every
// op HF's forward runs is the same op here, in the same order, so autocast casts the same tensors:
//
// gpt2 (GPT2LMHeadModel): h = wte(ids) + wpe(0..T-1); per block h.N: h = attn(ln_1(h)) + h,
//   h = h + mlp(ln_2(h)); logits = linear(ln_f(h), lm_head weight). Conv1D layers (c_attn, c_proj, c_fc)
//   store weight [in, out]: y = x @ W + b, one addmm in HF, here linear(x, W^T, b) (one product, bias added
//   before the single rounding, as addmm). Attention: q, k, v split from c_attn, scores = matmul(q, k^T),
//   divided by a 0-dim tensor sqrt(head_dim) of the scores' dtype (when scale_attn_weights), causal mask by
//   where(tril, scores, finfo(scores dtype).min), softmax (f32 under autocast), cast back to v's dtype,
//   matmul with v, c_proj. Activations: "gelu_new" as HF's NewGELUActivation composite
//   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))) (pow is on autocast's f32 list, so under
//   autocast its result is f32, as in HF), "gelu_pytorch_tanh" (gelu tanh op), "gelu" (erf), "relu".
//   Refused: other activations, scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn,
//   add_cross_attention. The head is tied to wte unless tie_word_embeddings is false.
// llama / mistral (LlamaForCausalLM, MistralForCausalLM): h = embed_tokens(ids); cos, sin of the rotary
//   embedding (inv_freq = 1 / rope_theta^(2i/head_dim) in f32, angle = inv_freq * position rounded once in
//   f32, cat(angles, angles), cos and sin in f32, then cast to h's dtype); per layer: h = h +
//   self_attn(input_layernorm(h)), h = h + mlp(post_attention_layernorm(h)); logits =
//   lm_head(norm(h)). RMSNorm: x.to(f32), pow(2).mean(-1), x * rsqrt(var + eps), weight * that.to(input
//   dtype). Attention: q/k/v_proj (bias when attention_bias, llama only), heads [B, H, T, head_dim],
//   q*cos + rotate_half(q)*sin (rotate_half = cat(-x2, x1)), k likewise, repeat_kv for grouped-query
//   attention, matmul(q, k^T) * head_dim**-0.5 + mask (h's dtype: 0 where visible, finfo.min elsewhere;
//   mistral's sliding_window also hides keys at or before q - window), softmax(dtype=f32) cast to q's dtype,
//   matmul with v, o_proj. MLP: down_proj(silu(gate_proj(x)) * up_proj(x)) (biases when mlp_bias, llama
//   only). head_dim from the config when given. pad_token_id: as nn.Embedding(padding_idx), that row of
//   embed_tokens gets no gradient from the embedding lookup. Refused: hidden_act other than "silu",
//   rope_scaling other than null, partial_rotary_factor other than 1. pretraining_tp is ignored, as HF
//   v4.48+ does.
// Dropout is off (attn_pdrop, resid_pdrop, embd_pdrop, attention_dropout are read but ignored): ampscope
// runs are deterministic, and HF's model.eval() behaves the same.
//
// Parameter names (named_parameters()) are the checkpoint's: GPT-2's are GPT2Model's ("wte.weight",
// "h.0.attn.c_attn.weight", plus "lm_head.weight" when untied); Llama's are LlamaForCausalLM's
// ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"). Loading
// accepts both layouts HF's from_pretrained accepts: a GPT-2 checkpoint whose names carry "transformer."
// (as GPT2LMHeadModel.save_pretrained writes) has the prefix removed; a Llama checkpoint without "model."
// (LlamaModel's) gets it added. save_model writes the layout the model was loaded from (GPT-2 "" by
// default, Llama "model."), a tied head once, under the embedding's name, as HF writes it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/nn.h"
#include "core/random.h"
#include "core/tensor.h"

namespace ampscope::samples::hf {

// A config.json that cannot be used (not JSON, a missing key, a wrong type, a refused setting), an unknown
// model_type, missing weights, wrong shapes. The message names the folder, the key or tensor, and what to do
// (a hint: line).
class ModelError : public Error {
 public:
  using Error::Error;
};

// What loading did with the checkpoint's tensors, by the checkpoint's names.
//   missing: parameters the checkpoint lacks (load_model throws before returning when there are any);
//   unexpected: tensors no parameter took (not used; listed so a user sees a mismatched checkpoint);
//   ignored: known buffers HF stores or used to store (GPT-2's attn.bias and attn.masked_bias, Llama's
//            rotary_emb.inv_freq), and a tied head's lm_head.weight when it equals the embedding;
//   nonfinite: with LoadOptions::allow_nonfinite, one line per weight the model took that holds NaN or Inf
//            once loaded as f32 (safetensors::NonFiniteTensor::describe()); without it there are none (the
//            load is refused).
struct LoadReport {
  std::vector<std::string> missing, unexpected, ignored, nonfinite;
};

// How a load treats what it could take but should not without being told.
struct LoadOptions {
  // Accept weights that hold NaN or Inf once loaded as f32 master weights (an F64 1e300 is Inf in f32). Off:
  // ModelError naming each such tensor, its file and where its first one is, as a resumed checkpoint's are
  // (CheckpointLoadOptions::allow_nonfinite): a run would start from NaN and its report blame the data. Tensors
  // the model does not take (report.unexpected, report.ignored) are not checked.
  bool allow_nonfinite = false;
};

// A causal language model: forward(tokens i64 [B, T]) -> logits [B, T, vocab] (under autocast in the
// autocast dtype, as HF's lm_head gives them). Parameter names and module paths are the checkpoint's own.
class CausalLM : public nn::Module {
 public:
  using nn::Module::Module;
  virtual std::string model_type() const = 0;      // "gpt2", "llama", "mistral"
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int64_t max_positions() const = 0;  // n_positions / max_position_embeddings
  virtual std::int64_t num_layers() const = 0;     // n_layer / num_hidden_layers
  // The tensors under the names a Hugging Face folder stores them (a tied head once, under the name HF
  // writes), in the layout the model was loaded from, for saving.
  virtual std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() = 0;
  const nlohmann::json& config() const { return config_; }  // the parsed config.json, as read

  // The layout's prefix: "" or "transformer." for GPT-2, "model." or "" for Llama (set by load_model).
  const std::string& checkpoint_prefix() const { return checkpoint_prefix_; }
  void set_checkpoint_prefix(std::string prefix) { checkpoint_prefix_ = std::move(prefix); }

 protected:
  nlohmann::json config_;
  std::string checkpoint_prefix_;
};

struct LoadedModel {
  std::shared_ptr<CausalLM> model;
  LoadReport report;
};

// Reads DIR/config.json, builds the architecture (model_type "gpt2", "llama" or "mistral"), loads DIR's
// safetensors (safetensors::load_folder; f16/bf16/f64 weights become f32 master weights, f16 and bf16
// exactly). Missing weights: ModelError listing them all (a run must refuse to start); wrong shapes:
// ModelError naming each tensor with both shapes; weights holding NaN or Inf: ModelError naming them, unless
// options.allow_nonfinite; unexpected tensors are in the report. Format errors of the files themselves are
// safetensors::FormatError. Every file is read only when it is a regular file (a FIFO or /dev/zero is
// refused by name), config.json up to 16 MiB with its JSON nesting bounded (core/io/json_limits.h).
LoadedModel load_model(const std::filesystem::path& folder, const LoadOptions& options = {});

// A randomly initialised model from a config, drawn from gen in parameter order with HF's _init_weights:
// Linear/Conv1D/Embedding weights normal(0, initializer_range) (GPT-2's c_proj weights
// normal(0, initializer_range / sqrt(2 * n_layer)); a padding_idx row 0), LayerNorm/RMSNorm weights 1,
// biases 0. Tests write tiny checkpoints with it.
std::shared_ptr<CausalLM> make_model(const nlohmann::json& config, Generator& gen);

// Writes DIR/config.json (config(), indented) and DIR/model.safetensors (checkpoint_tensors(), metadata
// {"format": "pt"}), creating DIR. Refuses a DIR holding model.safetensors.index.json (it would shadow the
// new file when loading).
void save_model(CausalLM& model, const std::filesystem::path& folder);

// ---- the pieces hf_gpt2.cpp, hf_llama.cpp and hf_t5.cpp share ----
namespace detail {

// A tensor of `shape` that holds one element (a zero, broadcast with stride 0): what a build that only checks
// shapes, or a missing or wrong-shaped weight about to be reported, gets instead of a real allocation, so a
// config.json that claims a far larger model than its weights is refused with the missing weights, not by
// running out of memory.
Tensor shape_placeholder(const Shape& shape);

// How a parameter is initialised when it is drawn rather than loaded.
struct Init {
  enum class Kind { normal, ones, zeros, constant } kind = Kind::normal;
  double std = 0.0;
  std::optional<std::int64_t> zero_row{};  // an embedding's padding_idx
  double value = 0.0;                      // Kind::constant's fill value
};
inline Init init_normal(double std, std::optional<std::int64_t> zero_row = std::nullopt) {
  return {Init::Kind::normal, std, zero_row, 0.0};
}
inline Init init_ones() { return {Init::Kind::ones, 0.0, std::nullopt, 0.0}; }
inline Init init_zeros() { return {Init::Kind::zeros, 0.0, std::nullopt, 0.0}; }
inline Init init_constant(double value) { return {Init::Kind::constant, 0.0, std::nullopt, value}; }  // T5's norms

// Where parameter values come from while a model is built: a generator or a checkpoint.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The value of parameter `name` (the model's own full name) of `shape`.
  virtual Tensor take(const std::string& name, const Shape& shape, const Init& init) = 0;
};

// Draws every parameter from `gen` in the order they are taken (make_model, make_seq2seq): normal(0, std)
// with an optional zero row, ones, zeros or a constant.
class RandomSource : public WeightSource {
 public:
  explicit RandomSource(Generator& gen) : gen_(gen) {}
  Tensor take(const std::string& name, const Shape& shape, const Init& init) override;

 private:
  Generator& gen_;
};

// Shapes only (placeholders, no memory), bounded by the checkpoint: the dry run that validates a config
// (and refuses what is refused) before the weights are used. A config that describes many more weights than
// the checkpoint's `held` tensors (n_layer 1000000 beside two layers of weights) is refused (ModelError naming
// `where`, with a hint to compare `compare`) before it costs a build.
class ShapeOnlySource : public WeightSource {
 public:
  ShapeOnlySource(std::string where, std::size_t held, std::string compare)
      : where_(std::move(where)), held_(held), left_(2 * held + 64), compare_(std::move(compare)) {}
  Tensor take(const std::string& name, const Shape& shape, const Init& init) override;

 private:
  std::string where_;
  std::size_t held_, left_;
  std::string compare_;
};

// Hands out a checkpoint's tensors (already renamed to the model's names) and remembers what was missing or of
// the wrong shape (a placeholder is handed out instead), so that the loader reports all of it at once.
class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(std::map<std::string, Tensor> tensors) : tensors_(std::move(tensors)) {}
  Tensor take(const std::string& name, const Shape& shape, const Init& init) override;

  std::vector<std::string> missing_;       // the model's names
  std::vector<std::string> wrong_shapes_;  // "name: the checkpoint has [..], the config needs [..]"
  std::map<std::string, Tensor> tensors_;  // what no parameter took
};

// FOLDER/config.json parsed (ModelError when it is not a regular file, is larger than kMaxConfigBytes, is not
// JSON, or nests arrays and objects deeper than core/io/json_limits.h's kMaxJsonDepth).
inline constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{16} << 20;
nlohmann::json read_config(const std::filesystem::path& folder);

// Refuses (ModelError) the weights the model took that hold NaN or Inf, naming each; with allow_nonfinite,
// lists them in report.nonfinite instead. `found` is what load_folder listed, by the checkpoint's names;
// those in report.unexpected or report.ignored are not the model's and are passed over.
void check_nonfinite(const std::filesystem::path& folder, const std::vector<safetensors::NonFiniteTensor>& found,
                     LoadReport& report, const LoadOptions& options);

// Writes FOLDER/config.json (config, indented) and FOLDER/model.safetensors (tensors, metadata
// {"format": "pt"}), creating FOLDER; refuses a FOLDER holding model.safetensors.index.json.
void save_folder(const nlohmann::json& config, const std::vector<std::pair<std::string, Tensor>>& tensors,
                 const std::filesystem::path& folder);

// Reading config.json: each accessor names the key and where it came from in its error; values are shown
// as short excerpts (core/io/json_limits.h's json_excerpt), never printed whole.
class Config {
 public:
  Config(const nlohmann::json& json, std::string where);  // where: "<folder>/config.json" or "config"
  const nlohmann::json& json() const { return json_; }
  const std::string& where() const { return where_; }
  bool has(const std::string& key) const;  // present and not null
  std::int64_t positive_int(const std::string& key) const;  // required
  std::int64_t positive_int(const std::string& key, std::int64_t fallback) const;
  std::optional<std::int64_t> optional_int(const std::string& key) const;  // null or absent: nullopt
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  // A number that must be above 0 (an epsilon, rope_theta): ModelError naming the key otherwise.
  double positive_number(const std::string& key, double fallback) const;
  [[noreturn]] void refuse(const std::string& key, const std::string& why, const std::string& hint) const;

 private:
  const nlohmann::json& json_;
  std::string where_;
};

// The most negative finite value of a floating dtype (torch.finfo(dtype).min).
double finfo_min(DType dtype);

// Layers with HF's names whose parameters come from a WeightSource.
class ModuleList : public nn::Module {
 public:
  ModuleList() : nn::Module("ModuleList") {}
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    items_.push_back(module);
    return register_module(std::to_string(items_.size() - 1), std::move(module));
  }
  const std::vector<std::shared_ptr<nn::Module>>& items() const { return items_; }

 protected:
  Tensor forward(const Tensor& x) override;  // runs the items in order

 private:
  std::vector<std::shared_ptr<nn::Module>> items_;
};

// torch.nn.Linear: y = x W^T + b, weight [out, in].
class Linear : public nn::Module {
 public:
  Linear(WeightSource& source, const std::string& path, std::int64_t in, std::int64_t out, bool bias, double std);
  const Tensor& weight() const { return parameter("weight"); }

 protected:
  Tensor forward(const Tensor& x) override;
};

// transformers' Conv1D: y = x W + b, weight [in, out].
class Conv1D : public nn::Module {
 public:
  Conv1D(WeightSource& source, const std::string& path, std::int64_t in, std::int64_t out, double std);

 protected:
  Tensor forward(const Tensor& x) override;
};

class LayerNorm : public nn::Module {
 public:
  LayerNorm(WeightSource& source, const std::string& path, std::int64_t dim, double eps);

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::int64_t dim_;
  double eps_;
};

// torch.nn.Embedding; with padding_idx, that row receives no gradient from the lookup (as in PyTorch).
class Embedding : public nn::Module {
 public:
  Embedding(WeightSource& source, const std::string& path, std::int64_t num, std::int64_t dim, double std,
            std::optional<std::int64_t> padding_idx = std::nullopt);
  const Tensor& weight() const { return parameter("weight"); }

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::optional<std::int64_t> padding_idx_;
};

// An output head that uses an embedding's weight (tied): logits = linear(x, embedding weight). It owns no
// parameter, so the tied weight is listed (and trained) once, under the embedding's name.
class TiedHead : public nn::Module {
 public:
  explicit TiedHead(std::shared_ptr<Embedding> embedding) : nn::Module("Linear"), embedding_(std::move(embedding)) {}

 protected:
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<Embedding> embedding_;
};

// Checks tokens for a model's forward: i64, [B, T] with B, T >= 1 and, when max_t > 0, T <= max_t.
void check_tokens(const Tensor& tokens, const std::string& model, std::int64_t max_t);

// The architectures (hf_gpt2.cpp, hf_llama.cpp). `prefix` is the checkpoint layout to record.
std::shared_ptr<CausalLM> build_gpt2(const Config& config, WeightSource& source);
std::shared_ptr<CausalLM> build_llama(const Config& config, WeightSource& source);

}  // namespace detail
}  // namespace ampscope::samples::hf
