// End-to-end training on the CPU backend: the runtime's ops, autograd, modules and optimizers together.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/optim.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

// Fraction of rows whose largest logit is the label.
double accuracy(const Tensor& logits, const Tensor& labels) {
  const std::vector<double> predicted = argmax(logits, 1).values();
  const std::vector<double> truth = labels.values();
  int right = 0;
  for (std::size_t i = 0; i < truth.size(); ++i) right += predicted[i] == truth[i] ? 1 : 0;
  return static_cast<double>(right) / static_cast<double>(truth.size());
}

struct Split {
  samples::Dataset train, test;
};

// 1024 points of 4 Gaussian classes in 20 dimensions, half for training and half held out.
Split blobs() {
  Generator data_gen(7);
  const samples::Dataset all = samples::make_blobs({.samples = 1024, .features = 20, .classes = 4}, data_gen);
  return {{all.x.slice(0, 0, 512), all.y.slice(0, 0, 512)}, {all.x.slice(0, 512, 1024), all.y.slice(0, 512, 1024)}};
}

TEST(training_test, mlp_learns_a_synthetic_classification_task_to_over_95_percent_in_f32) {
  const Split data = blobs();
  Generator gen(0);
  auto model = samples::make_mlp({.in_features = 20, .hidden = 64, .classes = 4}, gen);
  optim::Adam opt(model->parameters(), {.lr = 1e-2});
  {
    NoGradGuard no_grad;
    model->eval();
    // A fresh model guesses: about one class in four. This makes the 95% below a claim about training.
    EXPECT_LT(accuracy((*model)(data.test.x), data.test.y), 0.6);
  }
  model->train();
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 60; ++step) {
    // Mini-batches of 128 from the 512 training points, in order.
    const std::int64_t b = (step % 4) * 128;
    Tensor loss = cross_entropy((*model)(data.train.x.slice(0, b, b + 128)), data.train.y.slice(0, b, b + 128));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
  }
  NoGradGuard no_grad;
  model->eval();
  const double acc = accuracy((*model)(data.test.x), data.test.y);
  EXPECT_GT(acc, 0.95) << "held-out accuracy after 60 Adam steps; loss went from " << first_loss << " to " << last_loss;
  EXPECT_LT(last_loss, first_loss);
}

TEST(training_test, the_same_mlp_trains_in_f16_storage_without_crashing) {
  const Split data = blobs();
  Generator gen(0);
  auto model = samples::make_mlp({.in_features = 20, .hidden = 64, .classes = 4}, gen);
  model->to(DType::f16);
  for (const Tensor& p : model->parameters()) ASSERT_EQ(p.dtype(), DType::f16) << p.name();
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  const Tensor x = data.train.x.to(DType::f16);
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 40; ++step) {
    const std::int64_t b = (step % 4) * 128;
    Tensor loss = cross_entropy((*model)(x.slice(0, b, b + 128)), data.train.y.slice(0, b, b + 128));
    ASSERT_EQ(loss.dtype(), DType::f16);
    ASSERT_TRUE(std::isfinite(loss.item())) << "step " << step;
    opt.zero_grad();
    loss.backward();
    for (const Tensor& p : model->parameters()) ASSERT_EQ(p.grad().dtype(), DType::f16) << p.name();
    opt.step();
    if (step == 0) first_loss = loss.item();
    last_loss = loss.item();
  }
  EXPECT_LT(last_loss, first_loss);
  NoGradGuard no_grad;
  EXPECT_GT(accuracy((*model)(data.test.x.to(DType::f16)), data.test.y), 0.9);
}

TEST(training_test, cnn_and_transformer_take_a_training_step_and_reduce_their_loss) {
  Generator gen(1);
  auto cnn = samples::make_mnist_cnn(gen);
  const samples::Dataset images = samples::make_random_images(8, gen);
  optim::SGD cnn_opt(cnn->parameters(), {.lr = 0.05});
  double before = 0;
  for (int step = 0; step < 3; ++step) {
    Tensor loss = cross_entropy((*cnn)(images.x), images.y);
    if (step == 0) before = loss.item();
    cnn_opt.zero_grad();
    loss.backward();
    cnn_opt.step();
  }
  EXPECT_LT(cross_entropy((*cnn)(images.x), images.y).item(), before);

  samples::TinyTransformer gpt({.vocab = 16, .context = 8, .d_model = 16, .n_heads = 2, .n_layers = 1}, gen);
  const samples::Dataset tokens = samples::make_token_sequences(4, 8, 16, gen);
  optim::AdamW opt(gpt.parameters(), {.lr = 1e-2});
  auto lm_loss = [&] { return cross_entropy(gpt(tokens.x).reshape({32, 16}), tokens.y.reshape({32})); };
  const double start = lm_loss().item();
  for (int step = 0; step < 5; ++step) {
    Tensor loss = lm_loss();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(lm_loss().item(), start);
}

}  // namespace
}  // namespace ampscope
