// samples/models.h: the example models that `ampscope train`, the benchmarks and the tests run. Their
// module names (fc1, conv2, blocks.0.attn.qkv, ...) are what a user sees in every report.
//
//   Generator gen(0);
//   auto mlp = make_mlp({.in_features = 20, .hidden = 64, .classes = 4}, gen);
//   Tensor logits = (*mlp)(x);                        // x [N, 20] -> [N, 4]
//   auto cnn = make_mnist_cnn(gen);                   // x [N, 1, 28, 28] -> [N, 10]
//   auto gpt = std::make_shared<TinyTransformer>(TinyTransformerConfig{}, gen);
//   Tensor next = (*gpt)(tokens);                     // tokens i64 [B, T] -> logits [B, T, vocab]
#pragma once

#include <cstdint>
#include <memory>

#include "core/nn.h"

namespace ampscope::samples {

struct MlpConfig {
  std::int64_t in_features = 20;
  std::int64_t hidden = 64;
  std::int64_t classes = 4;
};
// fc1 -> relu1 -> fc2 -> relu2 -> fc3, as a Sequential with named children.
std::shared_ptr<nn::Sequential> make_mlp(const MlpConfig& config, Generator& gen);

// The classic PyTorch MNIST example: conv1 (1->32, 3x3) relu, conv2 (32->64, 3x3) relu, pool (2x2),
// flatten, fc1 (9216->128) relu, fc2 (128->10). Input [N, 1, 28, 28].
std::shared_ptr<nn::Sequential> make_mnist_cnn(Generator& gen);

struct TinyTransformerConfig {
  std::int64_t vocab = 64;
  std::int64_t context = 32;
  std::int64_t d_model = 64;
  std::int64_t n_heads = 4;
  std::int64_t n_layers = 2;
  double dropout = 0.0;
};

// A GPT-style language model: token and position embeddings (tok_emb, pos_emb), pre-LayerNorm blocks
// (blocks.0, blocks.1, ...), a final LayerNorm (ln_f) and a head (head). tokens i64 [B, T], T <= context.
class TinyTransformer : public nn::Module {
 public:
  TinyTransformer(const TinyTransformerConfig& config, Generator& gen);
  const TinyTransformerConfig& config() const { return config_; }

 protected:
  Tensor forward(const Tensor& tokens) override;

 private:
  TinyTransformerConfig config_;
  std::shared_ptr<nn::Embedding> tok_emb_, pos_emb_;
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace ampscope::samples
