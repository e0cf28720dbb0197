// The task of `ampscope train --model DIR --tokens FILE`: an architecture loaded from a Hugging Face model
// folder (models/hf_models.h), trained or evaluated on a token file in fixed windows (models/token_data.h).
#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops.h"
#include "models/bpe_tokenizer.h"
#include "models/hf_models.h"
#include "models/hf_t5.h"
#include "models/token_data.h"
#include "samples/task.h"

namespace ampscope::samples {
namespace {

// The run's token ids: --text encoded by the folder's own GPT-2 tokenizer (vocab.json + merges.txt, or
// tokenizer.json) a megabyte at a time into ids of 2 bytes each, or --tokens opened (a .npy or .bin file is
// read by window as batches need it); each checked against the vocabulary. Memory does not hold the text,
// nor a token file's ids.
TokenSequence run_tokens(const TrainConfig& c, std::int64_t vocab) {
  if (!c.text_file.empty()) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_folder(c.model_dir);
    TokenSequence tokens;
    tokenizer.encode_file(c.text_file, [&](const std::int32_t* ids, std::size_t n) { tokens.append(ids, n); });
    // The ids came from the folder's own tokenizer, not from a token file made elsewhere: an id past the
    // model's vocabulary means the folder's config.json and tokenizer disagree.
    if (tokens.max_id() >= vocab) {
      throw Error(fmt::format(
          "--text '{}': the model folder's own tokenizer ({}, {} ids) made ids up to {} from this text, past the model's "
          "vocabulary of {} ids (0 to {}, config.json's vocab_size)\nhint: the folder's config.json and its "
          "tokenizer disagree: a model whose vocab_size is at least {} is needed for this tokenizer's ids; check "
          "that config.json and the tokenizer's files belong to the same model",
          c.text_file, tokenizer.source(), tokenizer.vocab_size(), tokens.max_id(), vocab, vocab - 1,
          tokenizer.vocab_size()));
    }
    return tokens;
  }
  TokenSequence tokens = TokenSequence::open(c.tokens_file);
  check_vocabulary(tokens, vocab, c.tokens_file);
  return tokens;
}

std::string data_option(const TrainConfig& c) {
  return c.text_file.empty() ? "--tokens '" + c.tokens_file + "'" : "--text '" + c.text_file + "'";
}

hf::LoadOptions load_options(const TrainConfig& c) { return {.allow_nonfinite = c.model_allow_nonfinite}; }

// What the load accepted that a user must hear of: weights holding NaN or Inf (allowed explicitly), then
// tensors the architecture does not use.
void warn_unexpected(const TrainConfig& c, const hf::LoadReport& report, const std::string& type,
                     std::vector<std::string>& warnings) {
  for (const std::string& line : report.nonfinite) {
    warnings.push_back(fmt::format("--model '{}': the weights hold NaN or Inf (allowed): {}", c.model_dir, line));
  }
  if (report.unexpected.empty()) return;
  std::string names;
  for (std::size_t i = 0; i < report.unexpected.size() && i < 8; ++i) names += (i ? ", " : "") + report.unexpected[i];
  warnings.push_back(fmt::format("--model '{}': {} tensor(s) in the checkpoint are not weights of the '{}' "
                                 "architecture and were not loaded: {}{}",
                                 c.model_dir, report.unexpected.size(), type, names,
                                 report.unexpected.size() > 8 ? ", ..." : ""));
}

class ModelFolderTask final : public SampleTask {
 public:
  ModelFolderTask(const TrainConfig& c, std::vector<std::string>& warnings) {
    hf::LoadedModel loaded = hf::load_model(c.model_dir, load_options(c));
    model_ = std::move(loaded.model);
    warn_unexpected(c, loaded.report, model_->model_type(), warnings);
    tokens_ = run_tokens(c, model_->vocab_size());
    const std::int64_t max_positions = model_->max_positions();
    context_ = c.context > 0 ? c.context : std::min<std::int64_t>(max_positions, 256);
    if (context_ > max_positions) {
      throw Error(fmt::format("--context {} is more than the '{}' model's {} positions\nhint: give --context {} or less",
                              context_, model_->model_type(), max_positions, max_positions));
    }
    batch_ = c.batch > 0 ? c.batch : 1;
    // Fails here, naming how many tokens one window needs, rather than at the first step.
    windows_ = window_count(tokens_.size(), context_, /*seq2seq=*/false);
    if (windows_ < 1) {
      throw Error(fmt::format("{}: {} tokens make no window of --context {} (one needs {} tokens)", data_option(c),
                              tokens_.size(), context_, context_ + 1));
    }
  }

  nn::Module& model() override { return *model_; }
  Batch batch(std::int64_t step) override {
    TokenBatch b = causal_lm_batch(tokens_, context_, batch_, step);
    return {b.x, b.y, {}};
  }
  // The mean cross-entropy over all B*T targets (Hugging Face's causal LM loss, labels already shifted).
  Tensor loss(const Tensor& logits, const Tensor& y) override {
    const std::int64_t vocab = logits.size(-1);
    return cross_entropy(logits.reshape({-1, vocab}), y.reshape({-1}));
  }
  double default_lr() const override { return 5e-5; }  // the Hugging Face Trainer's default
  std::string identity() const override { return model_->model_type(); }
  void save_model(const std::filesystem::path& folder) override { hf::save_model(*model_, folder); }

 private:
  std::shared_ptr<hf::CausalLM> model_;
  TokenSequence tokens_;
  std::int64_t context_ = 0, batch_ = 1, windows_ = 0;
};

// An encoder-decoder folder (T5): window k is tokens[k*T, k*T + T) (T even), its first T/2 tokens the
// encoder input, its last T/2 the labels, the decoder input the labels shifted right behind
// decoder_start_token_id (models/token_data.h); the loss is the mean cross-entropy over the labels.
class Seq2SeqFolderTask final : public SampleTask {
 public:
  Seq2SeqFolderTask(const TrainConfig& c, std::vector<std::string>& warnings) {
    hf::LoadedSeq2Seq loaded = hf::load_seq2seq(c.model_dir, load_options(c));
    model_ = std::move(loaded.model);
    model_->set_clamp_inf(c.fp16_clamp);
    warn_unexpected(c, loaded.report, model_->model_type(), warnings);
    tokens_ = run_tokens(c, model_->vocab_size());
    // T5 has no position limit (relative buckets); the default window is its training length capped at 256.
    context_ = c.context > 0 ? c.context : std::min<std::int64_t>(model_->max_positions(), 256);
    if (context_ % 2 != 0 || context_ < 2) {
      throw Error(fmt::format("--context {}: a T5 window is half encoder input, half labels, so it must be even "
                              "and at least 2\nhint: give --context {}",
                              context_, context_ < 2 ? 2 : context_ + 1));
    }
    batch_ = c.batch > 0 ? c.batch : 1;
    window_count(tokens_.size(), context_, /*seq2seq=*/true);  // throws naming the need
  }

  nn::Module& model() override { return *model_; }
  Batch batch(std::int64_t step) override {
    Seq2SeqBatch b = seq2seq_batch(tokens_, context_, batch_, step, model_->decoder_start_token_id());
    return {b.encoder_input, b.labels, b.decoder_input};
  }
  Tensor forward(const Batch& batch) override { return model_->forward2(batch.x, batch.decoder_input); }
  Tensor loss(const Tensor& logits, const Tensor& labels) override { return hf::seq2seq_loss(logits, labels); }
  double default_lr() const override { return 5e-5; }
  std::string identity() const override { return model_->model_type(); }
  void save_model(const std::filesystem::path& folder) override { hf::save_seq2seq(*model_, folder); }

 private:
  std::shared_ptr<hf::Seq2SeqLM> model_;
  TokenSequence tokens_;
  std::int64_t context_ = 0, batch_ = 1;
};

}  // namespace

std::unique_ptr<SampleTask> make_model_task(const TrainConfig& config, std::vector<std::string>& warnings) {
  if (config.fp16_clamp && !hf::is_seq2seq_folder(config.model_dir)) {
    throw Error(fmt::format("--fp16-clamp is Hugging Face's T5 clamp, and '{}' is not a T5 folder\nhint: leave "
                            "--fp16-clamp out",
                            config.model_dir));
  }
  if (hf::is_seq2seq_folder(config.model_dir)) return std::make_unique<Seq2SeqFolderTask>(config, warnings);
  return std::make_unique<ModelFolderTask>(config, warnings);
}

}  // namespace ampscope::samples
