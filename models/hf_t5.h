// models/hf_t5.h: T5 encoder-decoder models (T5ForConditionalGeneration) loaded from Hugging Face model
// folders (config.json with model_type "t5", plus model.safetensors or an index and its shards), built from
// ampscope nn modules whose paths are the checkpoint's own names, so a trace says
// "encoder.block.1.layer.1.DenseReluDense.wo" or "decoder.block.0.layer.1.EncDecAttention.q".
//
//   auto loaded = ampscope::samples::hf::load_seq2seq("t5-small/");    // ModelError when weights are missing
//   Tensor logits = loaded.model->forward2(encoder_ids, decoder_ids);  // i64 [B, S], [B, T] -> [B, T, vocab]
//   Tensor loss = ampscope::samples::hf::seq2seq_loss(logits, labels);  // mean cross-entropy over the labels
//   ampscope::samples::hf::save_seq2seq(*loaded.model, "out/");         // config.json + model.safetensors
//
// Semantics are those of transformers' models/t5/modeling_t5.py (v4.4x, eager attention, no cache), op for
// op, so autocast casts the same tensors:
//   h = shared(ids) (run as "encoder.embed_tokens" / "decoder.embed_tokens", the same tensor as "shared");
//   per block: h = h + SelfAttention(layer_norm(h)) [clamp], decoder only: h = h + EncDecAttention(
//   layer_norm(h), encoder output) [clamp], h = h + DenseReluDense(layer_norm(h)) [clamp]; then
//   final_layer_norm. logits = lm_head(decoder output), the output first multiplied by d_model^-0.5 when the
//   head is tied to "shared" (tie_word_embeddings, true by default: T5 v1.0); an untied lm_head (v1.1, flan)
//   is not scaled.
//   T5LayerNorm: variance = x.to(f32).pow(2).mean(-1, keepdim); x * rsqrt(variance + layer_norm_epsilon),
//     cast to the weight's dtype when that is f16 or bf16; weight * that. No mean, no bias.
//   DenseReluDense: feed_forward_proj "relu": wo(relu(wi(x))); "gated-gelu": wo(gelu_new(wi_0(x)) * wi_1(x)),
//     gelu_new being HF's NewGELUActivation composite 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). The
//     input of wo is cast to wo's weight dtype first, as HF does (under autocast an f32 -> f16 round trip).
//     feed_forward_proj is read as T5Config reads it (ACT or gated-ACT); ACT may be relu, gelu (erf) or
//     gelu_new; others are refused.
//   Attention (q, k, v, o without bias; num_heads heads of d_kv): scores = q k^T, NOT scaled by
//     1/sqrt(d_kv); plus the position bias: relative_attention_bias (an embedding of
//     relative_attention_num_buckets rows by num_heads, in block 0's layer.0.SelfAttention only, shared by
//     the other blocks of its stack) looked up at relative_position_bucket(key - query), bidirectional in the
//     encoder, causal in the decoder; the sum is kept in the scores' dtype (HF adds in place). The decoder's
//     self-attention then hides later keys with masked_fill(finfo(scores dtype).min) (HF adds finfo(f32).min
//     to the bias instead, which under f16 autocast makes those scores -inf: the softmax is the same, 0 there,
//     but ampscope's probe would see an inf that is no overflow). softmax in f32, cast back to the scores'
//     dtype, times v, heads merged, o. Cross-attention (EncDecAttention) has no position bias.
//   Dropout is off (dropout_rate is read and ignored), as in HF's eval().
//
// HF's fp16 clamp (set_clamp_inf(true); off by default): where HF's T5Block clamps (after the self-attention,
// cross-attention and feed-forward residual adds), when the hidden states hold +-inf, they are clamped to
// +-(65504 - 1000) with the clamp op (recorded in the block's scope, "encoder.block.1"), and the firing is
// noted in clamp_events(). HF's condition is "the hidden states are f16", which holds when the model itself
// is f16 (model.half()); under f16 autocast the residual stream stays f32 (f32 embeddings plus f16
// sublayer outputs), so HF never clamps there. ampscope applies the clamp in both cases (f16 hidden states,
// or f16 autocast active), so that the option shows in an fp16 autocast run what the clamp would hide. When
// no inf is present nothing is done (HF's clamp to +-65504 changes no f16 value).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/nn.h"
#include "core/random.h"
#include "core/tensor.h"
#include "models/hf_models.h"

namespace ampscope::samples::hf {

// One firing of the fp16 clamp: in which block, after which sublayer, how many values were +-inf.
struct ClampEvent {
  std::string block;       // "encoder.block.1"
  std::string after;       // the sublayer whose residual add it followed: "layer.1.DenseReluDense"
  std::int64_t inf_count;  // elements that were +-inf before the clamp
};

// An encoder-decoder language model: forward2(encoder ids i64 [B, S], decoder ids i64 [B, T]) -> logits
// [B, T, vocab] (in the autocast dtype under autocast, as HF's lm_head gives them). Parameter names and
// module paths are the checkpoint's own. nn::Module's one-tensor call is refused (Error with a hint).
class Seq2SeqLM : public nn::Module {
 public:
  using nn::Module::Module;
  // Runs the model with this module's path as the scope (what operator() does for one input), so every op
  // is recorded under its module path. ShapeError for ids that are not i64 [B, S] / [B, T] with the same B.
  Tensor forward2(const Tensor& encoder_input, const Tensor& decoder_input);

  virtual std::string model_type() const = 0;  // "t5"
  virtual std::int64_t vocab_size() const = 0;
  // decoder_start_token_id from the config (T5: 0, the pad token); pad_token_id when the config has none.
  virtual std::int64_t decoder_start_token_id() const = 0;
  // The sequence length the model was trained with (config n_positions; 512, T5's, when absent). Not a limit:
  // relative position buckets cover any length; a context default can use it.
  virtual std::int64_t max_positions() const = 0;
  virtual std::int64_t num_layers() const = 0;          // encoder blocks (num_layers)
  virtual std::int64_t num_decoder_layers() const = 0;  // decoder blocks (num_decoder_layers)
  // The tensors under the names a Hugging Face folder stores them ("shared.weight", ..., "lm_head.weight"
  // when untied; a tied head and the stacks' embed_tokens are not written, as HF's safetensors omit them).
  virtual std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() = 0;
  const nlohmann::json& config() const { return config_; }  // the parsed config.json, as read

  // ---- HF's fp16 clamp (see the top of this file) ----
  void set_clamp_inf(bool on) { clamp_inf_ = on; }
  bool clamp_inf() const { return clamp_inf_; }
  // The firings of the last forward2 call, in order (cleared when forward2 starts).
  const std::vector<ClampEvent>& clamp_events() const { return clamp_events_; }
  // Firings since the model was built (or reset_clamp_count()).
  std::int64_t clamp_count() const { return clamp_count_; }
  void reset_clamp_count() { clamp_count_ = 0; }

 protected:
  virtual Tensor forward_seq2seq(const Tensor& encoder_input, const Tensor& decoder_input) = 0;
  Tensor forward(const Tensor& x) override;  // throws: an encoder-decoder model takes two inputs
  void note_clamp(ClampEvent event) {
    clamp_events_.push_back(std::move(event));
    ++clamp_count_;
  }

  nlohmann::json config_;

 private:
  bool clamp_inf_ = false;
  std::vector<ClampEvent> clamp_events_;
  std::int64_t clamp_count_ = 0;
};

struct LoadedSeq2Seq {
  std::shared_ptr<Seq2SeqLM> model;
  LoadReport report;
};

// Whether DIR/config.json names an encoder-decoder model_type ("t5"): load it with load_seq2seq, not
// load_model. ModelError when config.json cannot be read or is not JSON.
bool is_seq2seq_folder(const std::filesystem::path& folder);

// Reads DIR/config.json (model_type "t5"), builds the model and loads DIR's safetensors (f16/bf16/f64 weights
// become f32 master weights). The tied embedding may be stored as "shared.weight" or only as
// "encoder.embed_tokens.weight" / "decoder.embed_tokens.weight"; copies under the other names, and a tied
// "lm_head.weight", are ignored when equal to it and refused (ModelError) when they differ. The decoder's
// "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", which old checkpoints carry and HF
// ignores, is ignored too. Missing weights: ModelError listing them all; wrong shapes: ModelError naming each
// tensor with both shapes; weights holding NaN or Inf: ModelError naming them, unless options.allow_nonfinite
// (LoadOptions, models/hf_models.h); other tensors are listed in report.unexpected. Config errors name the key.
LoadedSeq2Seq load_seq2seq(const std::filesystem::path& folder, const LoadOptions& options = {});

// A randomly initialised T5 from a config, with HF's _init_weights (initializer_factor f): shared and an
// untied lm_head N(0, f); q N(0, f (d_model d_kv)^-1/2), k and v N(0, f d_model^-1/2), o N(0, f (num_heads
// d_kv)^-1/2), relative_attention_bias N(0, f d_model^-1/2); wi, wi_0, wi_1 N(0, f d_model^-1/2), wo
// N(0, f d_ff^-1/2); layer norms f. Drawn from gen in parameter order.
std::shared_ptr<Seq2SeqLM> make_seq2seq(const nlohmann::json& config, Generator& gen);

// Writes DIR/config.json and DIR/model.safetensors (checkpoint_tensors(), metadata {"format": "pt"}).
// Refuses a DIR holding model.safetensors.index.json.
void save_seq2seq(Seq2SeqLM& model, const std::filesystem::path& folder);

// Mean cross-entropy of logits [B, T, V] against labels i64 [B, T] over all labels (ignore_index -100, as
// HF's CrossEntropyLoss): log_softmax (f32 under autocast) and nll_loss.
Tensor seq2seq_loss(const Tensor& logits, const Tensor& labels);

// T5's relative position bucket (HF's T5Attention._relative_position_bucket) of relative_position = key
// position - query position. Bidirectional (encoder): half the buckets for keys after the query (offset
// num_buckets/2), the other half for the rest, by |relative_position|; causal (decoder): only keys at or
// before the query, by -min(relative_position, 0), later keys all in bucket 0. Within a half (n buckets),
// distances below n/2 have a bucket each; larger ones share log-spaced buckets n/2 + trunc(log(d / (n/2)) /
// log(max_distance / (n/2)) * (n - n/2)) up to n - 1, computed in f32 as HF does.
std::int64_t relative_position_bucket(std::int64_t relative_position, bool bidirectional, std::int64_t num_buckets,
                                      std::int64_t max_distance);

// The fp16 clamp's bound: torch.finfo(torch.float16).max - 1000.
inline constexpr double kT5ClampValue = 65504.0 - 1000.0;

}  // namespace ampscope::samples::hf
