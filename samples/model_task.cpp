// The task of `ampscope train --model DIR --tokens FILE`: an architecture loaded from a Hugging Face model
// folder (samples/hf_models.h), trained or evaluated on a token file in fixed windows (samples/token_data.h).
#include <algorithm>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/error.h"
#include "core/ops.h"
#include "samples/bpe_tokenizer.h"
#include "samples/hf_models.h"
#include "samples/token_data.h"
#include "samples/train.h"

namespace ampscope::samples {
namespace {

class ModelFolderTask final : public SampleTask {
 public:
  ModelFolderTask(const TrainConfig& c, std::vector<std::string>& warnings) {
    hf::LoadedModel loaded = hf::load_model(c.model_dir);
    model_ = std::move(loaded.model);
    if (!loaded.report.unexpected.empty()) {
      std::string names;
      for (std::size_t i = 0; i < loaded.report.unexpected.size() && i < 8; ++i)
        names += (i ? ", " : "") + loaded.report.unexpected[i];
      warnings.push_back(fmt::format("--model '{}': {} tensor(s) in the checkpoint are not weights of the '{}' "
                                     "architecture and were not loaded: {}{}",
                                     c.model_dir, loaded.report.unexpected.size(), model_->model_type(), names,
                                     loaded.report.unexpected.size() > 8 ? ", ..." : ""));
    }
    if (!c.text_file.empty()) {
      // --text: the folder's own GPT-2 tokenizer (vocab.json + merges.txt, or tokenizer.json) on the file's bytes.
      const BpeTokenizer tokenizer = BpeTokenizer::from_folder(c.model_dir);
      std::ifstream in(c.text_file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) throw Error(fmt::format("--text '{}': cannot read the file", c.text_file));
      tokens_ = tokenizer.encode(bytes);
      check_vocabulary(tokens_, model_->vocab_size(), c.text_file);
    } else {
      tokens_ = load_tokens(c.tokens_file);
      check_vocabulary(tokens_, model_->vocab_size(), c.tokens_file);
    }
    const std::int64_t max_positions = model_->max_positions();
    context_ = c.context > 0 ? c.context : std::min<std::int64_t>(max_positions, 256);
    if (context_ > max_positions) {
      throw Error(fmt::format("--context {} is more than the '{}' model's {} positions\nhint: give --context {} or less",
                              context_, model_->model_type(), max_positions, max_positions));
    }
    batch_ = c.batch > 0 ? c.batch : 1;
    // Fails here, naming how many tokens one window needs, rather than at the first step.
    windows_ = window_count(static_cast<std::int64_t>(tokens_.size()), context_, /*seq2seq=*/false);
    if (windows_ < 1) {
      throw Error(fmt::format("{}: {} tokens make no window of --context {} (one needs {} tokens)",
                              c.text_file.empty() ? "--tokens '" + c.tokens_file + "'" : "--text '" + c.text_file + "'",
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
  std::vector<std::int32_t> tokens_;
  std::int64_t context_ = 0, batch_ = 1, windows_ = 0;
};

}  // namespace

std::unique_ptr<SampleTask> make_model_task(const TrainConfig& config, std::vector<std::string>& warnings) {
  return std::make_unique<ModelFolderTask>(config, warnings);
}

}  // namespace ampscope::samples
