#include "samples/models.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ampscope::samples {

std::shared_ptr<nn::Sequential> make_mlp(const MlpConfig& c, Generator& gen) {
  auto m = std::make_shared<nn::Sequential>();
  m->register_module("fc1", std::make_shared<nn::Linear>(c.in_features, c.hidden, gen));
  m->register_module("relu1", std::make_shared<nn::ReLU>());
  m->register_module("fc2", std::make_shared<nn::Linear>(c.hidden, c.hidden, gen));
  m->register_module("relu2", std::make_shared<nn::ReLU>());
  m->register_module("fc3", std::make_shared<nn::Linear>(c.hidden, c.classes, gen));
  return m;
}

std::shared_ptr<nn::Sequential> make_mnist_cnn(Generator& gen) {
  auto m = std::make_shared<nn::Sequential>();
  m->register_module("conv1", std::make_shared<nn::Conv2d>(1, 32, 3, gen));
  m->register_module("relu1", std::make_shared<nn::ReLU>());
  m->register_module("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, gen));
  m->register_module("relu2", std::make_shared<nn::ReLU>());
  m->register_module("pool", std::make_shared<nn::MaxPool2d>(2));
  m->register_module("flatten", std::make_shared<nn::Flatten>(1));
  m->register_module("fc1", std::make_shared<nn::Linear>(9216, 128, gen));
  m->register_module("relu3", std::make_shared<nn::ReLU>());
  m->register_module("fc2", std::make_shared<nn::Linear>(128, 10, gen));
  return m;
}

TinyTransformer::TinyTransformer(const TinyTransformerConfig& config, Generator& gen)
    : Module("TinyTransformer"), config_(config) {
  tok_emb_ = register_module("tok_emb", std::make_shared<nn::Embedding>(config.vocab, config.d_model, gen));
  pos_emb_ = register_module("pos_emb", std::make_shared<nn::Embedding>(config.context, config.d_model, gen));
  blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
  for (std::int64_t i = 0; i < config.n_layers; ++i) {
    blocks_->push_back(std::make_shared<nn::TransformerBlock>(config.d_model, config.n_heads, config.dropout, gen));
  }
  ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{config.d_model}));
  head_ = register_module("head", std::make_shared<nn::Linear>(config.d_model, config.vocab, gen));
}

Tensor TinyTransformer::forward(const Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.size(1) > config_.context) {
    throw ShapeError(fmt::format("{}: expected tokens [B, T] with T <= {} (the context), got {}", describe(),
                                 config_.context, shape_str(tokens.shape())));
  }
  const std::int64_t T = tokens.size(1);
  const Tensor positions = arange(static_cast<double>(T), {DType::i64, tokens.device()});
  // [B, T, d] + [T, d]: the position embedding broadcasts over the batch.
  Tensor x = add((*tok_emb_)(tokens), (*pos_emb_)(positions));
  x = (*blocks_)(x);
  return (*head_)((*ln_f_)(x));
}

}  // namespace ampscope::samples
