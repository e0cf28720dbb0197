// tests/analysis/user_models.cpp: the user models of user_models.h. Everything here uses only the public
// API a user has (docs/api.md); nothing reaches into probes/ or core/ internals.
#include "tests/analysis/user_models.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/grad_scaler.h"
#include "core/nn.h"
#include "core/optim.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"

namespace ampscope::user_models {

std::string_view model_name(Model model) {
  switch (model) {
    case Model::tagger: return "tagger";
    case Model::handnorm: return "handnorm";
    case Model::lse: return "lse";
    case Model::rmsnorm: return "rmsnorm";
    case Model::pairs: return "pairs";
    case Model::attention: return "attention";
  }
  return "?";
}

std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

std::int64_t RunResult::skipped_steps() const {
  std::int64_t n = 0;
  for (bool s : skipped) n += s ? 1 : 0;
  return n;
}

void apply_override(RunConfig& config, const std::string& pattern, bool is_op) {
  config.f32_overrides.push_back({pattern, is_op});
}

void set_precision(RunConfig& config, Precision precision) { config.precision = precision; }

namespace {

// ---- data: built before the probe is installed, so no data op is in the trace ----

// Row-major values of a [rows, cols] tensor of 0/1 (or class indices) from a rule.
Tensor one_hot(const std::vector<std::int64_t>& labels, std::int64_t classes) {
  std::vector<double> v(labels.size() * static_cast<std::size_t>(classes), 0.0);
  for (std::size_t i = 0; i < labels.size(); ++i) v[i * static_cast<std::size_t>(classes) + labels[i]] = 1.0;
  return from_values(v, {static_cast<std::int64_t>(labels.size()), classes});
}

struct Batch {
  Tensor x, y;            // y: targets as the loss wants them (0/1 tags, one-hot, class indices, values)
  Tensor y_index;         // class indices (i64) where the model is a classifier
};

// ======================================================================================================
// 1. tagger: a residual MLP tagger (32 -> 64 -> 2 residual blocks -> LayerNorm -> Linear(64, 8)), 8
// independent tags, AdamW, and the user's own binary cross-entropy on probabilities:
//     s = sigmoid(z);  loss = -mean(y * log(s) + (1 - y) * log(1 - s))
// Under autocast the head's linear runs in f16, so z and sigmoid(z) are f16 (sigmoid is on no autocast
// list). f16 has no value between 1 - 2^-11 = 0.99951 and 1, so sigmoid(z) rounds to exactly 1.0 once
// z > ln(2^12) = 8.32; then 1 - s (add(neg(s), 1), in f16) cancels to exactly 0, log (autocast: f32) of 0
// is -inf, and for a tag whose y = 1 the term (1 - y) * log(1 - s) is 0 * -inf = NaN. The tags are a
// linear rule of the inputs and every step sees the same batch, so AdamW at lr 1e-2 makes the model
// confident within a few steps. In f32 sigmoid only reaches 1.0 past z = 16.6, which this run never sees.
// ======================================================================================================

struct ResidualBlock : nn::Module {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  ResidualBlock(std::int64_t width, Generator& gen) : Module("ResidualBlock") {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{width}));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(width, width, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(width, width, gen));
  }
  Tensor forward(const Tensor& x) override { return add(x, (*fc2)(gelu((*fc1)((*norm)(x))))); }
};

struct Tagger : nn::Module {
  std::shared_ptr<nn::Linear> stem, head;
  std::shared_ptr<nn::Sequential> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
  explicit Tagger(Generator& gen) : Module("Tagger") {
    stem = register_module("stem", std::make_shared<nn::Linear>(32, 64, gen));
    blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    blocks->push_back(std::make_shared<ResidualBlock>(64, gen));
    blocks->push_back(std::make_shared<ResidualBlock>(64, gen));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(Shape{64}));
    head = register_module("head", std::make_shared<nn::Linear>(64, 8, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*norm)((*blocks)((*stem)(x)))); }
};

Batch tagger_data(Generator& gen) {
  const Tensor x = randn({64, 32}, gen);
  const Tensor teacher = randn({32, 8}, gen);
  const std::vector<double> t = matmul(x, teacher).values();
  std::vector<double> y(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) y[i] = t[i] > 0 ? 1.0 : 0.0;
  return {x, from_values(y, {64, 8}), Tensor()};
}

// The user's loss, with the two knobs: a clamp before each log, or the fused loss on the logits.
Tensor tagger_loss(const Tensor& z, const Tensor& y, const RunConfig& c) {
  if (c.use_logits_loss) return binary_cross_entropy_with_logits(z, y);
  const Tensor s = sigmoid(z);
  Tensor p = s;
  Tensor q = add(neg(s), 1.0);  // 1 - s
  if (c.clamp_eps) {
    p = clamp(p, *c.clamp_eps, std::nullopt);
    q = clamp(q, *c.clamp_eps, std::nullopt);
  }
  const Tensor one_minus_y = add(neg(y), 1.0);
  return neg(mean(add(mul(y, log(p)), mul(one_minus_y, log(q)))));
}

// ======================================================================================================
// 2. handnorm: an MLP (20 -> 32 -> 32 -> 4) with batch normalisation written by hand after each ReLU,
//     y = (x - mean) / sqrt(var + eps) * weight + bias,   eps = 1e-8 as users copy it,
// statistics over the batch, SGD with momentum 0.9, cross-entropy. The inputs are non-negative tabular
// features (counts and a one-hot column), so a ReLU unit whose weights turn negative is zero for every row
// of the batch: its column is constant, x - mean = 0 and var = 0 exactly. In f32 var + 1e-8 = 1e-8,
// sqrt = 1e-4 and 0 / 1e-4 = 0: harmless. In f16 (the ReLU output of an f16 linear keeps the whole
// normalisation in f16: sub, mul, mean, add, sqrt and div are on no autocast list) 1e-8 is below half of
// f16's smallest subnormal (2^-24 = 5.96e-8), so var + 1e-8 rounds to 0, sqrt(0) = 0 and 0 / 0 = NaN.
// The features are counts shifted to [-1, 3) plus a one-hot column that is 1 on every row; the large
// learning rate (0.5, momentum 0.9) kills a ReLU unit after a few steps (seed 3: step 4, in norm1).
// init_scale 1024: at 65536 the scaler's first steps overflow in the backward of sqrt and div (1 / sqrt
// of a small var times the scale), skips that would hide where the forward NaN starts.
// ======================================================================================================

struct HandNorm : nn::Module {
  double eps;
  std::int64_t constant_columns = 0;  // of the last input: columns equal on every row (read by the test)
  HandNorm(std::int64_t features, double eps_) : Module("HandNorm"), eps(eps_) {
    register_parameter("weight", ones({features}));
    register_parameter("bias", zeros({features}));
  }
  Tensor forward(const Tensor& x) override {
    const std::vector<double> v = x.values();
    const std::int64_t rows = x.size(0), cols = x.size(1);
    constant_columns = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      bool same = true;
      for (std::int64_t r = 1; r < rows && same; ++r) same = v[static_cast<std::size_t>(r * cols + c)] == v[static_cast<std::size_t>(c)];
      constant_columns += same ? 1 : 0;
    }
    const Tensor mu = mean(x, {0}, true);
    const Tensor d = sub(x, mu);
    const Tensor var = mean(mul(d, d), {0}, true);
    const Tensor normed = div(d, sqrt(add(var, eps)));
    return add(mul(normed, parameter("weight")), parameter("bias"));
  }
};

struct NormMLP : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, head;
  std::shared_ptr<HandNorm> norm1, norm2;
  NormMLP(Generator& gen, double eps) : Module("NormMLP") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(20, 32, gen));
    norm1 = register_module("norm1", std::make_shared<HandNorm>(32, eps));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 32, gen));
    norm2 = register_module("norm2", std::make_shared<HandNorm>(32, eps));
    head = register_module("head", std::make_shared<nn::Linear>(32, 4, gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = (*norm1)(relu((*fc1)(x)));
    return (*head)((*norm2)(relu((*fc2)(h))));
  }
};

Batch handnorm_data(Generator& gen) {
  // 19 non-negative "count" features in [0, 4) and a one-hot column that is 1 on every row of this
  // batch (one category only); labels from a linear rule.
  const std::int64_t n = 32;
  const std::vector<double> r = rand({n, 19}, gen).values();
  std::vector<double> x;
  x.reserve(static_cast<std::size_t>(n) * 20);
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < 19; ++j) x.push_back(4.0 * r[static_cast<std::size_t>(i * 19 + j)] - 1.0);
    x.push_back(1.0);
  }
  const Tensor xt = from_values(x, {n, 20});
  const Tensor labels = argmax(matmul(xt, randn({20, 4}, gen)), 1);
  return {xt, labels, labels};
}

// ======================================================================================================
// 3. lse: a classifier (16 -> 64 -> 10, GELU, Adam) whose loss the user wrote as a log-sum-exp by hand,
//     loss = mean(log(sum(exp(logits), 1)) - sum(logits * onehot(label), 1)),
// computed, as many training loops do, after the autocast region has closed, on the logits it returned.
// Those logits are f16 (the head's linear), and outside autocast exp runs in its input's dtype: f16,
// whose largest finite value 65504 is exp(11.09). (Inside the region autocast's table would run exp in
// f32, so the knobs loss_in_autocast and loss_cast_f32 (logits.to(f32) first) are the user-side fixes; an
// AutocastOverrideGuard on exp does nothing out here, because overrides apply only inside enabled
// autocast regions.) Same batch every step and Adam at lr 2e-2:
// the logit of the right class passes 11.09 after a few steps; exp gives inf, the sum inf, log inf and
// the loss inf; in backward exp's gradient is 0 * inf = NaN, so every step after is skipped and the
// parameters never move again.
// ======================================================================================================

struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> fc1, head;
  explicit Classifier(Generator& gen) : Module("Classifier") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(16, 64, gen));
    head = register_module("head", std::make_shared<nn::Linear>(64, 10, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)(gelu((*fc1)(x))); }
};

Batch lse_data(Generator& gen) {
  const Tensor x = randn({64, 16}, gen);
  const Tensor labels = argmax(matmul(x, randn({16, 10}, gen)), 1);
  std::vector<std::int64_t> l;
  for (double v : labels.values()) l.push_back(static_cast<std::int64_t>(v));
  return {x, one_hot(l, 10), labels};
}

Tensor lse_loss(const Tensor& logits_in, const Tensor& onehot, bool cast_f32) {
  const Tensor logits = cast_f32 ? logits_in.to(DType::f32) : logits_in;
  const Tensor lse = log(sum(exp(logits), {1}));
  const Tensor picked = sum(mul(logits, onehot), {1});
  return mean(sub(lse, picked));
}

// ======================================================================================================
// 4. rmsnorm: a regression MLP on raw sensor readings (8 features, not standardised), SGD, MSE:
//     blocks.0 = Linear(8, 32) + GELU;  blocks.1 = RMSNorm (hand-written) + Linear(32, 32);  head Linear(32, 1)
// with the norm written as users copy it, x * rsqrt(mean(x * x, -1) + 1e-6). Four batches are cycled;
// the readings of batches 0-2 are in [0, 100), those of batch 3 come from a sensor that reads four times
// higher, [0, 400) (outliers a raw-data pipeline lets through). On batch 3 blocks.0's output passes 256
// on some rows: x * x runs in f16 (mul is on no autocast list) and overflows to inf for |x| > 255.9, so
// mean(x * x) of such a row is inf (+ 1e-6 too), rsqrt (autocast: f32) of inf is exactly 0, and x * 0 = 0:
// the row's normalised features are all zero and blocks.1's output for it is exactly blocks.1.fc's bias.
// No NaN: the loss stays finite, the gradients are finite (d rsqrt / d m = -0.5 * inf^-1.5 = 0), no step
// is skipped; only the ops before rsqrt (mul, mean, add) show an inf. In f32 or bf16 x * x is far from
// overflowing. init_scale 1024: at 65536 the scaler's first steps overflow in backward (the MSE of
// predictions off by ~10 times the scale), skips that have nothing to do with the norm.
// ======================================================================================================

struct RMSNorm : nn::Module {
  std::int64_t zero_rows = 0;  // rows of the last output that were all exactly zero (what the test reads)
  std::vector<double> input;   // the last input's values (the test derives which squares overflow f16)
  RMSNorm() : Module("RMSNorm") {}
  Tensor forward(const Tensor& x) override {
    input = x.values();
    const Tensor out = mul(x, rsqrt(add(mean(mul(x, x), {-1}, true), 1e-6)));
    const std::vector<double> v = out.values();
    const std::int64_t cols = out.size(-1);
    zero_rows = 0;
    for (std::size_t r = 0; r * static_cast<std::size_t>(cols) < v.size(); ++r) {
      bool all_zero = true;
      for (std::int64_t c = 0; c < cols && all_zero; ++c) all_zero = v[r * static_cast<std::size_t>(cols) + c] == 0.0;
      zero_rows += all_zero ? 1 : 0;
    }
    return out;
  }
};

struct MLPBlock : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  MLPBlock(std::int64_t in, std::int64_t out, Generator& gen) : Module("MLPBlock") {
    fc = register_module("fc", std::make_shared<nn::Linear>(in, out, gen));
  }
  Tensor forward(const Tensor& x) override { return gelu((*fc)(x)); }
};

struct NormBlock : nn::Module {
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<nn::Linear> fc;
  NormBlock(std::int64_t width, Generator& gen) : Module("NormBlock") {
    norm = register_module("norm", std::make_shared<RMSNorm>());
    fc = register_module("fc", std::make_shared<nn::Linear>(width, width, gen));
  }
  Tensor forward(const Tensor& x) override { return (*fc)((*norm)(x)); }
};

struct Regressor : nn::Module {
  std::shared_ptr<nn::Sequential> blocks;
  std::shared_ptr<NormBlock> block1;
  std::shared_ptr<nn::Linear> head;
  explicit Regressor(Generator& gen) : Module("Regressor") {
    blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    blocks->push_back(std::make_shared<MLPBlock>(8, 32, gen));
    block1 = blocks->push_back(std::make_shared<NormBlock>(32, gen));
    head = register_module("head", std::make_shared<nn::Linear>(32, 1, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*blocks)(x)); }
};

std::vector<Batch> rmsnorm_data(Generator& gen) {
  // Four batches of 32 rows, cycled. The readings of batches 0-2 are in [0, 100); batch 3 comes from a
  // sensor that reads four times higher, [0, 400) (outliers a raw-data pipeline lets through). The
  // target is a positive linear rule scaled to a few units.
  const Tensor rule = rand({1, 8}, gen);
  std::vector<Batch> batches;
  for (int b = 0; b < 4; ++b) {
    const Tensor x = mul(rand({32, 8}, gen), b == 3 ? 400.0 : 100.0);
    batches.push_back({x, sum(mul(x, mul(rule, 0.01)), {1}, true), Tensor()});
  }
  return batches;
}

// ======================================================================================================
// 5. pairs: a dual encoder that matches two views of the same record (CLIP-style): each view through its
// own tower (Linear(24, 64) + GELU + Linear(64, 32)), both embeddings normalised by hand to unit length,
// their cosine similarities times a learned logit scale,
//     logits = exp(logit_scale) * (a / |a|) (b / |b|)^T,   logit_scale = log(100) at the start,
// and the user's symmetric cross-entropy written by hand after the autocast region (each row's and each
// column's log-sum-exp minus the matching pair's logit). The user started the scale at 100, the value
// CLIP clamps it to, rather than CLIP's 1/0.07. The similarities are in [-1, 1]; the scale makes the
// logits 100 times larger, and the logits are f16 (the matmul's dtype: a 0-dim f32 factor does not
// promote them), so outside autocast exp runs in f16 and overflows once a logit passes ln(65504) = 11.09.
// With the scale at 10 the logits stay within [-10, 10] and nothing overflows; in f32 exp reaches 88.7.
// init_scale 1024: at 65536 the scaler's first steps overflow in the backward of the scale's mul.
// ======================================================================================================

struct Tower : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Tower(std::int64_t in, Generator& gen) : Module("Tower") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, 64, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(64, 32, gen));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(gelu((*fc1)(x))); }
};

struct Pairs : nn::Module {
  std::shared_ptr<Tower> view_a, view_b;
  std::vector<double> last_similarities;  // of the last forward (read by the test)
  double last_scale = 0;
  Pairs(Generator& gen, double scale) : Module("Pairs") {
    view_a = register_module("view_a", std::make_shared<Tower>(24, gen));
    view_b = register_module("view_b", std::make_shared<Tower>(24, gen));
    register_parameter("logit_scale", full({}, std::log(scale)));
  }
  // x: [2, batch, 24], the two views of each record.
  Tensor forward(const Tensor& x) override {
    const std::int64_t n = x.size(1), f = x.size(2);
    const Tensor a = unit((*view_a)(x.slice(0, 0, 1).reshape({n, f})));
    const Tensor b = unit((*view_b)(x.slice(0, 1, 2).reshape({n, f})));
    const Tensor similarities = matmul(a, b.transpose(0, 1));
    const Tensor scale = exp(parameter("logit_scale"));
    last_similarities = similarities.values();
    last_scale = scale.item();
    return mul(similarities, scale);
  }
  static Tensor unit(const Tensor& z) { return div(z, sqrt(sum(mul(z, z), {-1}, true))); }
};

Batch pairs_data(Generator& gen) {
  // 32 records; view b is a fixed linear mixing of view a plus noise, so matching pairs can be learned.
  const Tensor a = randn({32, 24}, gen);
  const Tensor b = add(matmul(a, mul(randn({24, 24}, gen), 0.2)), mul(randn({32, 24}, gen), 0.1));
  std::vector<double> x = a.values();
  for (double v : b.values()) x.push_back(v);
  std::vector<double> eye(32 * 32, 0.0);
  for (std::size_t i = 0; i < 32; ++i) eye[i * 32 + i] = 1.0;
  return {from_values(x, {2, 32, 24}), from_values(eye, {32, 32}), Tensor()};
}

// The user's symmetric cross-entropy on the logits, with the knobs a remedy turns: the logits cast to f32
// first, or the row's max subtracted before exp.
Tensor pairs_loss(const Tensor& logits_in, const Tensor& eye, const RunConfig& c) {
  const Tensor logits = c.loss_cast_f32 ? logits_in.to(DType::f32) : logits_in;
  auto one_way = [&](const Tensor& z) {
    const Tensor shifted = c.subtract_max ? sub(z, amax(z, {1}, true)) : z;
    const Tensor lse = log(sum(exp(shifted), {1}));
    const Tensor picked = sum(mul(shifted, eye), {1});
    return mean(sub(lse, picked));
  };
  return mul(add(one_way(logits), one_way(logits.transpose(0, 1))), 0.5);
}

// ======================================================================================================
// 6. attention: a sequence classifier on raw sensor readings (16 sequences of 12 steps, 8 readings each,
// in [0, 410): not standardised), with single-head attention written by hand,
//     q, k, v = Linear(8, 64)(x);   scores = bmm(q, k^T);   out = bmm(softmax(scores, -1), v)
// (the 1/sqrt(d) of scaled dot-product attention forgotten), mean over the sequence, Linear(64, 4),
// cross-entropy, Adam. The readings share a large common level, so q and k at every position point nearly
// the same way and are large (absmax about 500): their 64-term dot products pass 65504, and under autocast
// bmm runs in f16 and returns inf there. Multiplying q by 1/sqrt(64) = 0.125 before the product keeps the
// scores 8 times smaller (under 16000 over the run); in f32 they are far from its range, and bf16 has f32's. init_scale
// 128: the raw readings make v, and so the head's gradients, large; at 1024 the scaler's first step
// overflows in the head's backward, a skip that has nothing to do with the scores.
// ======================================================================================================

struct HandAttention : nn::Module {
  std::shared_ptr<nn::Linear> q, k, v;
  double q_scale;
  std::vector<double> last_q, last_k;  // what the scores' bmm took (read by the test)
  HandAttention(Generator& gen, double q_scale_) : Module("HandAttention"), q_scale(q_scale_) {
    q = register_module("q", std::make_shared<nn::Linear>(8, 64, gen));
    k = register_module("k", std::make_shared<nn::Linear>(8, 64, gen));
    v = register_module("v", std::make_shared<nn::Linear>(8, 64, gen));
  }
  Tensor forward(const Tensor& x) override {
    Tensor queries = (*q)(x);
    if (q_scale != 1.0) queries = mul(queries, q_scale);
    const Tensor keys = (*k)(x);
    last_q = queries.values();
    last_k = keys.values();
    const Tensor scores = bmm(queries, keys.transpose(1, 2));
    return bmm(softmax(scores, -1), (*v)(x));
  }
};

struct SequenceClassifier : nn::Module {
  std::shared_ptr<HandAttention> attn;
  std::shared_ptr<nn::Linear> head;
  SequenceClassifier(Generator& gen, double q_scale) : Module("SequenceClassifier") {
    attn = register_module("attn", std::make_shared<HandAttention>(gen, q_scale));
    head = register_module("head", std::make_shared<nn::Linear>(64, 4, gen));
  }
  Tensor forward(const Tensor& x) override { return (*head)(mean((*attn)(x), {1})); }
};

Batch attention_data(Generator& gen) {
  // A common level per sequence in [100, 300), per-step variation of +-50, and the class's own reading
  // (feature `label`) 60 higher on every step: every reading in [0, 410). One sequence in four has the mark
  // of another class than its label (label noise: the loss never reaches 0).
  const std::vector<double> level = rand({16, 1, 1}, gen).values();
  const std::vector<double> noise = rand({16, 12, 8}, gen).values();
  std::vector<double> x(noise.size()), labels(16);
  for (std::size_t b = 0; b < 16; ++b) {
    labels[b] = static_cast<double>(b % 4);
    const std::size_t mark = b % 4 == 3 ? (b + 1) % 4 : b % 4;
    for (std::size_t t = 0; t < 12; ++t) {
      for (std::size_t f = 0; f < 8; ++f) {
        const std::size_t i = (b * 12 + t) * 8 + f;
        x[i] = 100.0 + 200.0 * level[b] + 100.0 * (noise[i] - 0.5) + (f == mark ? 60.0 : 0.0);
      }
    }
  }
  const Tensor y = from_values(labels, {16}, {.dtype = DType::i64});
  return {from_values(x, {16, 12, 8}), y, y};
}

// ---- the training loop, as docs/api.md shows it ----

std::string config_json(const RunConfig& c) {
  std::string overrides;
  for (const F32Override& o : c.f32_overrides) {
    if (!overrides.empty()) overrides += ", ";
    overrides += fmt::format("{{\"{}\": \"{}\"}}", o.is_op ? "op" : "module", o.pattern);
  }
  return fmt::format(
      "{{\"model\": \"{}\", \"precision\": \"{}\", \"steps\": {}, \"seed\": {}, \"lr\": {}, \"init_scale\": {}, "
      "\"use_scaler\": {}, \"autocast_fp32\": [{}], \"clamp_eps\": {}, \"use_logits_loss\": {}, \"norm_eps\": {}, "
      "\"loss_in_autocast\": {}, \"loss_cast_f32\": {}, \"logit_scale\": {}, \"subtract_max\": {}, \"q_scale\": {}, "
      "\"twin\": {}}}",
      model_name(c.model), precision_name(c.precision), c.steps, c.seed, c.lr, c.init_scale, c.use_scaler, overrides,
      c.clamp_eps ? fmt::format("{}", *c.clamp_eps) : std::string("null"), c.use_logits_loss, c.norm_eps,
      c.loss_in_autocast, c.loss_cast_f32, c.logit_scale, c.subtract_max, c.q_scale, c.twin);
}

}  // namespace

RunConfig default_config(Model model) {
  RunConfig c;
  c.model = model;
  c.precision = Precision::fp16;
  switch (model) {
    case Model::tagger: c.steps = 30; c.seed = 1; c.lr = 1e-2; break;
    case Model::handnorm: c.steps = 30; c.seed = 3; c.lr = 0.5; c.init_scale = 1024.0; break;
    case Model::lse: c.steps = 30; c.seed = 0; c.lr = 2e-2; break;
    case Model::rmsnorm: c.steps = 8; c.seed = 0; c.lr = 1e-4; c.init_scale = 1024.0; break;
    case Model::pairs: c.steps = 20; c.seed = 2; c.lr = 1e-3; c.init_scale = 1024.0; break;
    case Model::attention: c.steps = 12; c.seed = 4; c.lr = 1e-3; c.init_scale = 128.0; break;
  }
  return c;
}

RunResult run(const RunConfig& c) {
  if (c.trace_path.empty()) throw std::invalid_argument("user_models::run: trace_path is empty");
  if (c.steps < 1) throw std::invalid_argument("user_models::run: steps must be at least 1");
  Generator gen(c.seed);

  // The model, its data and its optimizer: everything a user builds before training.
  std::shared_ptr<nn::Module> model;
  RMSNorm* watched_norm = nullptr;
  Pairs* pairs = nullptr;
  HandAttention* hand_attention = nullptr;
  std::vector<HandNorm*> hand_norms;
  std::vector<Batch> batches;
  std::unique_ptr<optim::Optimizer> opt;
  switch (c.model) {
    case Model::tagger: {
      model = std::make_shared<Tagger>(gen);
      batches.push_back(tagger_data(gen));
      opt = std::make_unique<optim::AdamW>(model->parameters(), optim::OptimizerOptions{.lr = c.lr, .weight_decay = 0.01});
      break;
    }
    case Model::handnorm: {
      auto m = std::make_shared<NormMLP>(gen, c.norm_eps);
      hand_norms = {m->norm1.get(), m->norm2.get()};
      model = m;
      batches.push_back(handnorm_data(gen));
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::OptimizerOptions{.lr = c.lr, .momentum = 0.9});
      break;
    }
    case Model::lse: {
      model = std::make_shared<Classifier>(gen);
      batches.push_back(lse_data(gen));
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::OptimizerOptions{.lr = c.lr});
      break;
    }
    case Model::pairs: {
      auto m = std::make_shared<Pairs>(gen, c.logit_scale);
      pairs = m.get();
      model = m;
      batches.push_back(pairs_data(gen));
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::OptimizerOptions{.lr = c.lr});
      break;
    }
    case Model::attention: {
      auto m = std::make_shared<SequenceClassifier>(gen, c.q_scale);
      hand_attention = m->attn.get();
      model = m;
      batches.push_back(attention_data(gen));
      opt = std::make_unique<optim::Adam>(model->parameters(), optim::OptimizerOptions{.lr = c.lr});
      break;
    }
    case Model::rmsnorm: {
      auto m = std::make_shared<Regressor>(gen);
      watched_norm = m->block1->norm.get();
      model = m;
      batches = rmsnorm_data(gen);
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::OptimizerOptions{.lr = c.lr});
      break;
    }
  }

  const bool lower = c.precision != Precision::fp32;
  const DType lower_dtype = c.precision == Precision::bf16 ? DType::bf16 : DType::f16;
  GradScaler scaler({.device = "cpu", .init_scale = c.init_scale, .enabled = lower && c.use_scaler});

  std::vector<std::unique_ptr<AutocastOverrideGuard>> overrides;
  for (const F32Override& o : c.f32_overrides) {
    AutocastOverride rule;
    (o.is_op ? rule.op : rule.module) = o.pattern;
    rule.precision = ampscope::Precision::f32;
    overrides.push_back(std::make_unique<AutocastOverrideGuard>(rule));
  }

  // The probe's set-up, the overrides above included, in the trace (probe.h: before creating the writer).
  const probe::ProbeOptions options{.level = probe::Level::health};
  const trace::RunInfo info{.precision = std::string(precision_name(c.precision)),
                            .device = "cpu",
                            .model = std::string(model_name(c.model)),
                            .seed = static_cast<std::int64_t>(c.seed),
                            .config = config_json(c),
                            .probe = probe::describe(options)};
  auto writer = std::make_shared<trace::TraceWriter>(c.trace_path, info);
  auto probe = std::make_shared<probe::Probe>(writer, options);
  // With the twin, it wraps the probe and writes its /precision rows to the same trace (`ampscope train --twin`).
  std::shared_ptr<probe::Hook> hook = probe;
  if (c.twin) hook = std::make_shared<probe::Twin>(probe, probe::TwinOptions{.sink = writer, .keep_rows = false});
  RunResult result;
  result.trace_path = c.trace_path;
  result.batch = batches.front().x.size(0);
  {
    probe::HookGuard watching(hook);
    for (std::int64_t step = 0; step < c.steps; ++step) {
      probe::StepScope scope(step);
      const Batch& data = batches[static_cast<std::size_t>(step) % batches.size()];
      opt->zero_grad();
      Tensor loss;
      {
        // The forward pass (in autocast for fp16/bf16) and, for all but lse's user code, the loss in it.
        std::optional<AutocastGuard> autocast;
        if (lower) autocast.emplace(lower_dtype);
        const Tensor out = (*model)(data.x);
        result.outputs.push_back(out.values());
        switch (c.model) {
          case Model::tagger: {
            ScopeGuard in_loss("loss");
            loss = tagger_loss(out, data.y, c);
            break;
          }
          case Model::handnorm: {
            ScopeGuard in_loss("loss");
            loss = cross_entropy(out, data.y_index);
            break;
          }
          case Model::lse: {
            if (c.loss_in_autocast) {
              ScopeGuard in_loss("loss");
              loss = lse_loss(out, data.y, c.loss_cast_f32);
            } else {
              autocast.reset();  // the region closes; the loss below runs on the f16 logits
              ScopeGuard in_loss("loss");
              loss = lse_loss(out, data.y, c.loss_cast_f32);
            }
            break;
          }
          case Model::rmsnorm: {
            ScopeGuard in_loss("loss");
            loss = mse_loss(out, data.y);
            break;
          }
          case Model::pairs: {
            autocast.reset();  // the region closes; the user's loss runs on the f16 logits
            ScopeGuard in_loss("loss");
            loss = pairs_loss(out, data.y, c);
            break;
          }
          case Model::attention: {
            ScopeGuard in_loss("loss");
            loss = cross_entropy(out, data.y_index);
            break;
          }
        }
      }
      const double scale = scaler.get_scale();
      scaler.scale(loss).backward();
      const bool stepped = scaler.step(*opt);
      scaler.update();
      const double l = loss.item();
      result.losses.push_back(l);
      result.skipped.push_back(!stepped);
      if (!std::isfinite(l) && result.first_nonfinite_loss < 0) result.first_nonfinite_loss = step;
      if (pairs != nullptr) {
        result.similarities.push_back(pairs->last_similarities);
        result.logit_scales.push_back(pairs->last_scale);
      }
      if (hand_attention != nullptr) {
        result.queries.push_back(hand_attention->last_q);
        result.keys.push_back(hand_attention->last_k);
      }
      if (watched_norm != nullptr) {
        result.bias_rows.push_back(watched_norm->zero_rows);
        result.norm_inputs.push_back(watched_norm->input);
      }
      if (!hand_norms.empty()) {
        std::vector<std::pair<std::string, std::int64_t>> constant;
        for (const HandNorm* n : hand_norms) constant.emplace_back(n->name(), n->constant_columns);
        result.constant_columns.push_back(std::move(constant));
      }
      scope.end({.step = step, .loss = l, .scale = scale, .scale_after = scaler.get_scale(), .skipped = !stepped,
                 .lr = c.lr});
    }
    probe->flush();
  }
  writer->close();
  result.origins = probe->counters().origins;
  return result;
}

std::optional<trace::OpRow> first_origin(const std::string& trace_path) {
  trace::TraceReader reader(trace_path);
  std::optional<trace::OpRow> first;
  for (const trace::OpRow& row : reader.ops()) {
    if (!row.origin) continue;
    if (!first || row.step < first->step || (row.step == first->step && row.seq < first->seq)) first = row;
  }
  return first;
}

std::int64_t nonfinite_op_rows(const std::string& trace_path) {
  trace::TraceReader reader(trace_path);
  std::int64_t n = 0;
  for (const trace::OpRow& row : reader.ops()) {
    if (row.health.nan + row.health.pos_inf + row.health.neg_inf > 0) ++n;
  }
  return n;
}

}  // namespace ampscope::user_models
