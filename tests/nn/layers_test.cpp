// tests/nn/layers_test.cpp: the layers of core/nn.h: PyTorch's initialisation bounds, seeded
// reproducibility, forward passes against references computed here in double, Dropout's modes, and
// the errors that name the module.
//
// References:
//   * init bounds: PyTorch's reset_parameters (Linear, Conv2d): kaiming_uniform_(a=sqrt(5)) has gain
//     sqrt(2 / (1 + 5)) and bound gain * sqrt(3 / fan_in) = 1/sqrt(fan_in); the bias bound is
//     1/sqrt(fan_in) as well. LayerNorm: ones and zeros. Embedding: N(0, 1);
//   * forward values: the layer's own parameters widened to double and the formula written out in double
//     (linear, direct convolution, layer norm with the biased variance, tanh-GELU); f32 results are
//     compared with a tolerance of a few f32 roundings of the magnitudes summed.
#include "core/nn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "tests/test_support.h"

namespace {

using ampscope::DType;
using ampscope::from_values;
using ampscope::Generator;
using ampscope::Shape;
using ampscope::Tensor;
namespace nn = ampscope::nn;

// A few f32 roundings of the terms' magnitudes: what float accumulation can be off by.
constexpr double kF32Tol = 4e-7;

// A model class with named children (what users write), for messages with paths.
class Net : public nn::Module {
 public:
  Net() : Module("Net") {}
  template <class M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> m) {
    return register_module(name, std::move(m));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& [name, m] : children()) y = (*m)(y);
    return y;
  }
};

void expect_within_bound(const Tensor& t, double bound, const std::string& what) {
  const std::vector<double> v = t.values();
  ASSERT_FALSE(v.empty());
  // The f32 affine map can land on float(bound), which may exceed the real bound by half an ulp.
  const double limit = static_cast<float>(bound) * (1 + 1e-7);
  const double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
  EXPECT_LE(hi, limit) << what;
  EXPECT_GE(lo, -limit) << what;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

TEST(layers_test, linear_draws_weight_and_bias_from_one_over_sqrt_fan_in) {
  Generator gen(1);
  nn::Linear fc(100, 50, gen);
  EXPECT_EQ(fc.weight().shape(), (Shape{50, 100}));
  EXPECT_EQ(fc.bias().shape(), (Shape{50}));
  EXPECT_EQ(fc.weight().dtype(), DType::f32);
  expect_within_bound(fc.weight(), 0.1, "weight");
  expect_within_bound(fc.bias(), 0.1, "bias");  // 1/sqrt(in), not 1/sqrt(out)
  // 5000 draws cover the interval: P(max < 0.09) = 0.95^5000; the mean of U(-0.1, 0.1) has s.e. 0.0008.
  const std::vector<double> w = fc.weight().values();
  EXPECT_GT(*std::max_element(w.begin(), w.end()), 0.09);
  EXPECT_LT(*std::min_element(w.begin(), w.end()), -0.09);
  EXPECT_NEAR(mean_of(w), 0.0, 0.004);
  // Bias: 50 draws; P(all within +-0.05) = 0.5^50.
  const std::vector<double> b = fc.bias().values();
  EXPECT_GT(*std::max_element(b.begin(), b.end()) - *std::min_element(b.begin(), b.end()), 0.1);
}

TEST(layers_test, linear_draws_the_weight_then_the_bias_from_the_generator) {
  // Documented order: rand for the weight, then rand for the bias, each mapped u * 2b - b in f32.
  Generator gen(5);
  nn::Linear fc(4, 3, gen);
  Generator replay(5);
  const std::vector<double> uw = ampscope::rand({3, 4}, replay).values();
  const std::vector<double> ub = ampscope::rand({3}, replay).values();
  const float two_b = static_cast<float>(2.0 * 0.5), minus_b = static_cast<float>(-0.5);  // bound 1/sqrt(4)
  auto map = [&](double u) { return static_cast<double>(static_cast<float>(static_cast<float>(u) * two_b) + minus_b); };
  const std::vector<double> w = fc.weight().values(), b = fc.bias().values();
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], map(uw[i])) << i;
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], map(ub[i])) << i;
  EXPECT_EQ(gen.offset(), replay.offset());  // nothing else was drawn
}

TEST(layers_test, conv2d_bound_uses_channels_times_kernel_area) {
  Generator gen(2);
  nn::Conv2d conv(3, 8, 5, gen);
  EXPECT_EQ(conv.weight().shape(), (Shape{8, 3, 5, 5}));
  EXPECT_EQ(conv.bias().shape(), (Shape{8}));
  const double bound = 1.0 / std::sqrt(75.0);
  expect_within_bound(conv.weight(), bound, "weight");
  expect_within_bound(conv.bias(), bound, "bias");
  const std::vector<double> w = conv.weight().values();  // 600 draws: P(max|w| < 0.9 b) = 0.9^600
  double max_abs = 0;
  for (double x : w) max_abs = std::max(max_abs, std::fabs(x));
  EXPECT_GT(max_abs, 0.9 * bound);
  EXPECT_FALSE(nn::Conv2d(3, 8, 5, gen, 1, 0, /*bias=*/false).bias().defined());
}

TEST(layers_test, same_seed_gives_identical_parameters_and_another_seed_different_ones) {
  auto build = [](std::uint64_t seed) {
    Generator gen(seed);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Embedding>(11, 8, gen));
    model->push_back(std::make_shared<nn::TransformerBlock>(8, 2, 0.0, gen));
    model->push_back(std::make_shared<nn::Conv2d>(2, 3, 3, gen));
    return model;
  };
  const auto a = build(7)->named_parameters(), b = build(7)->named_parameters(), c = build(8)->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_EQ(a[i].second.values(), b[i].second.values());
    const bool constant = a[i].first.find("ln") != std::string::npos;  // LayerNorm: ones and zeros, no draw
    if (constant) {
      EXPECT_EQ(a[i].second.values(), c[i].second.values());
    } else {
      EXPECT_NE(a[i].second.values(), c[i].second.values());
    }
  }
}

TEST(layers_test, linear_forward_equals_a_matmul_in_double) {
  Generator gen(11);
  nn::Linear fc(3, 4, gen);
  const std::vector<double> xs = {0.5, -1.25, 2.0, 3.0, 0.125, -0.75};
  const Tensor y = fc(from_values(xs, {2, 3}));
  ASSERT_EQ(y.shape(), (Shape{2, 4}));
  const std::vector<double> w = fc.weight().values(), b = fc.bias().values(), got = y.values();
  for (int n = 0; n < 2; ++n) {
    for (int o = 0; o < 4; ++o) {
      double ref = b[o], mag = std::fabs(b[o]);
      for (int i = 0; i < 3; ++i) {
        ref += xs[n * 3 + i] * w[o * 3 + i];
        mag += std::fabs(xs[n * 3 + i] * w[o * 3 + i]);
      }
      EXPECT_NEAR(got[n * 4 + o], ref, kF32Tol * mag) << "n=" << n << " o=" << o;
    }
  }
}

TEST(layers_test, linear_keeps_leading_dimensions) {
  Generator gen(0);
  nn::Linear fc(4, 6, gen, /*bias=*/false);
  EXPECT_EQ(fc.named_parameters().size(), 1u);
  EXPECT_EQ(fc(ampscope::ones({2, 3, 4})).shape(), (Shape{2, 3, 6}));
}

TEST(layers_test, conv2d_forward_equals_a_direct_convolution_in_double) {
  Generator gen(4);
  nn::Conv2d conv(2, 3, 3, gen, /*stride=*/2, /*padding=*/1);
  const Shape xs_shape = {1, 2, 5, 5};
  const Tensor x = ampscope::randn(xs_shape, gen);
  const Tensor y = conv(x);
  ASSERT_EQ(y.shape(), (Shape{1, 3, 3, 3}));  // (5 + 2 - 3) / 2 + 1 = 3
  const std::vector<double> xv = x.values(), w = conv.weight().values(), b = conv.bias().values(), got = y.values();
  for (int o = 0; o < 3; ++o) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        double ref = b[o], mag = std::fabs(b[o]);
        for (int c = 0; c < 2; ++c) {
          for (int ki = 0; ki < 3; ++ki) {
            for (int kj = 0; kj < 3; ++kj) {
              const int r = i * 2 + ki - 1, s = j * 2 + kj - 1;
              if (r < 0 || r >= 5 || s < 0 || s >= 5) continue;
              const double term = xv[(c * 5 + r) * 5 + s] * w[((o * 2 + c) * 3 + ki) * 3 + kj];
              ref += term;
              mag += std::fabs(term);
            }
          }
        }
        EXPECT_NEAR(got[(o * 3 + i) * 3 + j], ref, kF32Tol * mag) << o << "," << i << "," << j;
      }
    }
  }
}

TEST(layers_test, max_pool2d_takes_the_largest_value_of_each_window) {
  nn::MaxPool2d pool(2);  // stride defaults to the kernel size
  const Tensor y = pool(ampscope::arange(16).reshape({1, 1, 4, 4}));
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.values(), (std::vector<double>{5, 7, 13, 15}));
  nn::MaxPool2d overlapping(3, 1);
  EXPECT_EQ(overlapping(ampscope::arange(16).reshape({1, 1, 4, 4})).values(), (std::vector<double>{10, 11, 14, 15}));
}

TEST(layers_test, layer_norm_starts_as_ones_and_zeros_and_normalises_the_trailing_dimensions) {
  nn::LayerNorm ln({4});
  EXPECT_EQ(ln.parameter("weight").values(), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(ln.parameter("bias").values(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(ln.eps(), 1e-5);
  const std::vector<double> xs = {1, 2, 3, 4, -2, 0.5, 0.25, 8};
  const std::vector<double> got = ln(from_values(xs, {2, 4})).values();
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 4; ++i) mean += xs[r * 4 + i] / 4;
    for (int i = 0; i < 4; ++i) var += (xs[r * 4 + i] - mean) * (xs[r * 4 + i] - mean) / 4;  // biased, as PyTorch
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(got[r * 4 + i], (xs[r * 4 + i] - mean) / std::sqrt(var + 1e-5), 2e-6) << r << "," << i;
    }
  }
  nn::LayerNorm plain({2, 4}, 1e-5, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.named_parameters().empty());
  EXPECT_EQ(plain(from_values(xs, {1, 2, 4})).shape(), (Shape{1, 2, 4}));
}

TEST(layers_test, embedding_rows_are_standard_normal_and_forward_selects_rows) {
  Generator gen(9);
  nn::Embedding table(1000, 16, gen);
  const std::vector<double> w = table.weight().values();
  const double m = mean_of(w);
  double var = 0;
  for (double x : w) var += (x - m) * (x - m) / static_cast<double>(w.size());
  EXPECT_NEAR(m, 0.0, 0.04);   // 16000 draws: s.e. 0.008
  EXPECT_NEAR(var, 1.0, 0.06);  // s.e. of the variance sqrt(2/16000) = 0.011

  const Tensor idx = from_values({3, 0, 3, 999}, {2, 2}, {.dtype = DType::i64});
  const Tensor y = table(idx);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 16}));
  const std::vector<double> got = y.values();
  const std::vector<int> rows = {3, 0, 3, 999};
  for (int k = 0; k < 4; ++k) {
    for (int d = 0; d < 16; ++d) EXPECT_EQ(got[k * 16 + d], w[rows[k] * 16 + d]) << k << "," << d;
  }
}

TEST(layers_test, dropout_zeroes_and_rescales_only_in_training) {
  Generator gen(13);
  Net net;
  auto drop = net.add("drop", std::make_shared<nn::Dropout>(0.25, gen));
  const Tensor x = ampscope::ones({4000});
  const std::vector<double> trained = net(x).values();
  int zeros = 0;
  for (double v : trained) {
    if (v == 0.0) {
      ++zeros;
    } else {
      EXPECT_NEAR(v, 1.0 / 0.75, 1e-6);  // survivors scaled by 1/(1-p)
    }
  }
  EXPECT_NEAR(zeros, 1000, 120);  // binomial(4000, 0.25): s.d. 27
  const std::uint64_t offset = gen.offset();
  net.eval();  // switched through the parent
  EXPECT_FALSE(drop->is_training());
  EXPECT_EQ(net(x).values(), x.values());
  EXPECT_EQ(gen.offset(), offset);  // eval draws nothing
  net.train();
  EXPECT_NE(net(x).values(), trained);  // a new mask from the advanced stream
  EXPECT_THROW_MSG(nn::Dropout(1.5, gen), ampscope::Error, "Dropout", "[0, 1]", "1.5");
}

TEST(layers_test, relu_and_gelu_apply_their_functions) {
  const std::vector<double> xs = {-2.0, -0.5, 0.0, 0.75, 3.0};
  const Tensor x = from_values(xs, {5});
  EXPECT_EQ(nn::ReLU()(x).values(), (std::vector<double>{0, 0, 0, 0.75, 3.0}));
  const std::vector<double> g = nn::GELU(ampscope::GeluApproximation::tanh)(x).values();
  const std::vector<double> e = nn::GELU()(x).values();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double tanh_ref = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    const double erf_ref = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    EXPECT_NEAR(g[i], tanh_ref, 1e-6) << v;
    EXPECT_NEAR(e[i], erf_ref, 1e-6) << v;
  }
}

TEST(layers_test, flatten_merges_the_dimensions_from_start_to_end) {
  const Tensor x = ampscope::zeros({2, 3, 4, 5});
  EXPECT_EQ(nn::Flatten()(x).shape(), (Shape{2, 60}));
  EXPECT_EQ(nn::Flatten(0, 1)(x).shape(), (Shape{6, 4, 5}));
  EXPECT_EQ(nn::Flatten(-2)(x).shape(), (Shape{2, 3, 20}));
  EXPECT_THROW_MSG(nn::Flatten(4)(x), ampscope::IndexError, "Flatten", "start_dim 4", "[2, 3, 4, 5]");
}

TEST(layers_test, sequential_names_children_by_position_and_runs_them_in_order) {
  Generator gen(0);
  nn::Sequential seq({std::make_shared<nn::Flatten>(), std::make_shared<nn::ReLU>()});
  auto fc = seq.push_back(std::make_shared<nn::Linear>(6, 2, gen));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq[2], fc);
  EXPECT_EQ(fc->name(), "2");
  EXPECT_EQ(seq[0]->type_name(), "Flatten");
  EXPECT_THROW_MSG(seq[3], ampscope::IndexError, "Sequential", "index 3", "3 modules");
  // relu(flatten(x)) then the linear: reference in double.
  const std::vector<double> xs = {1, -2, 3, -4, 5, -6};
  const std::vector<double> got = seq(from_values(xs, {1, 2, 3})).values();
  const std::vector<double> w = fc->weight().values(), b = fc->bias().values();
  for (int o = 0; o < 2; ++o) {
    double ref = b[o];
    for (int i = 0; i < 6; ++i) ref += std::max(xs[i], 0.0) * w[o * 6 + i];
    EXPECT_NEAR(got[o], ref, 1e-5) << o;
  }
}

// ---- errors name the module ----

TEST(layers_test, linear_fed_the_wrong_width_names_itself_and_both_sizes) {
  Generator gen(0);
  Net net;
  net.add("fc1", std::make_shared<nn::Linear>(960, 10, gen));
  EXPECT_THROW_MSG(net(ampscope::zeros({64, 9216})), ampscope::ShapeError,
                   "Linear 'fc1': expected 960 input features, got 9216 (input shape [64, 9216])",
                   "\nhint: ", "in_features = 9216");
}

TEST(layers_test, conv2d_fed_the_wrong_channel_count_names_itself_and_both_counts) {
  Generator gen(0);
  Net net;
  net.add("conv1", std::make_shared<nn::Conv2d>(3, 4, 3, gen));
  EXPECT_THROW_MSG(net(ampscope::zeros({8, 1, 28, 28})), ampscope::ShapeError,
                   "Conv2d 'conv1': expected 3 input channels, got 1 (input shape [8, 1, 28, 28])", "hint:");
  EXPECT_THROW_MSG(net(ampscope::zeros({3, 28, 28})), ampscope::ShapeError, "Conv2d 'conv1'", "4-d",
                   "[3, 28, 28]");
  EXPECT_THROW_MSG(net(ampscope::zeros({1, 3, 2, 2})), ampscope::ShapeError, "Conv2d 'conv1'", "2x2",
                   "3x3 kernel");
}

TEST(layers_test, layer_norm_fed_another_width_names_itself_and_both_shapes) {
  Net net;
  net.add("ln", std::make_shared<nn::LayerNorm>(Shape{64}));
  EXPECT_THROW_MSG(net(ampscope::zeros({2, 8, 32})), ampscope::ShapeError,
                   "LayerNorm 'ln': expected the input's trailing dimensions to be [64], got input shape [2, 8, 32]",
                   "normalized_shape = [32]");
}

TEST(layers_test, embedding_fed_floating_indices_names_itself_and_the_dtype) {
  Generator gen(0);
  Net net;
  net.add("wte", std::make_shared<nn::Embedding>(50, 8, gen));
  EXPECT_THROW_MSG(net(ampscope::zeros({2, 8})), ampscope::DTypeError,
                   "Embedding 'wte': indices must be i64, got f32 (shape [2, 8])", "DType::i64");
}

TEST(layers_test, nested_errors_carry_the_whole_path) {
  Generator gen(0);
  nn::Sequential blocks;
  blocks.push_back(std::make_shared<nn::TransformerBlock>(16, 4, 0.0, gen));
  EXPECT_THROW_MSG(blocks(ampscope::zeros({1, 3, 12})), ampscope::ShapeError, "LayerNorm '0.ln1'", "[16]",
                   "[1, 3, 12]");
}

TEST(layers_test, constructors_reject_sizes_that_cannot_work) {
  Generator gen(0);
  EXPECT_THROW_MSG(nn::Linear(0, 3, gen), ampscope::ShapeError, "Linear", "in_features", "0");
  EXPECT_THROW_MSG(nn::Conv2d(1, 1, 0, gen), ampscope::ShapeError, "Conv2d", "kernel_size");
  EXPECT_THROW_MSG(nn::LayerNorm(Shape{}), ampscope::ShapeError, "LayerNorm", "normalized_shape");
}

}  // namespace
