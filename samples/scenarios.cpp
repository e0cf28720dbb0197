// The failure scenarios of `ampscope train --scenario NAME` (docs/scenarios.md). Each one changes a
// sample's configuration, model, data or loss so that a failure people hit in real mixed-precision
// training happens, deterministically for a seed, at a known op, module and step.
//
// A scenario sets what its failure needs (its sample; no scaler; no zero_grad) and proposes steps,
// batch, learning rate and scaler settings only where the user left them at their defaults, so
// `--steps 100` or `--lr 1e-4` still mean what they say. It never touches the precision: the same
// scenario in fp32 or bf16 is the comparison that shows the failure is f16's.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "samples/models.h"
#include "samples/task.h"

namespace ampscope::samples {
namespace {

constexpr double kF16Min = -65504.0;  // torch.finfo(torch.float16).min
constexpr double kRawFeature = 1e5;   // scale-collapse: a feature in raw units
constexpr double kConfidentLogits = 40.0;  // log-zero: fc3 weights scaled by this
constexpr double kSmallLossWeight = 1.0 / (1 << 20);  // grad-underflow: 2^-20

// ---- configuration: required values always, proposals only over defaults ----

const TrainConfig& defaults() {
  static const TrainConfig kDefaults{};
  return kDefaults;
}
void propose_steps(TrainConfig& c, std::int64_t steps) {
  if (c.steps == defaults().steps) c.steps = steps;
}
void propose_batch(TrainConfig& c, std::int64_t batch) {
  if (c.batch == defaults().batch) c.batch = batch;
}
void propose_lr(TrainConfig& c, double lr) {
  if (c.lr == defaults().lr) c.lr = lr;
}
void propose_growth_interval(TrainConfig& c, std::int64_t interval) {
  if (c.growth_interval == defaults().growth_interval) c.growth_interval = interval;
}

// ---- weights ----

Tensor parameter_named(nn::Module& model, std::string_view name) {
  std::string known;
  for (const auto& [n, t] : model.named_parameters()) {
    if (n == name) return t;
    known += (known.empty() ? "" : ", ") + n;
  }
  throw Error(fmt::format("scenario: the model has no parameter '{}'; it has: {}", name, known));
}

// Multiplies rows [begin, end) of a parameter (all of it by default) by `factor`, in place: the drawn
// initialisation keeps its pattern, only its magnitude changes.
void scale_rows(nn::Module& model, std::string_view name, double factor, std::int64_t begin = 0,
                std::int64_t end = -1) {
  Tensor p = parameter_named(model, name);
  NoGradGuard no_grad;
  const std::int64_t rows = p.dim() == 0 ? 1 : p.size(0);
  if (end < 0) end = rows;
  const std::int64_t row = p.numel() / rows;
  std::vector<double> v = p.values();
  for (std::int64_t i = begin * row; i < end * row; ++i) v[static_cast<std::size_t>(i)] *= factor;
  p.copy_(from_values(v, p.shape(), {p.dtype(), p.device()}));
}

// ---- model variants: a sample's data and loss with another model ----

class VariantTask final : public SampleTask {
 public:
  // `model` null keeps the sample's own model; `transform` (optional) rewrites each batch.
  VariantTask(std::unique_ptr<SampleTask> sample, std::shared_ptr<nn::Module> model,
              std::function<Batch(Batch)> transform = {})
      : sample_(std::move(sample)), model_(std::move(model)), transform_(std::move(transform)) {}
  nn::Module& model() override { return model_ ? *model_ : sample_->model(); }
  Batch batch(std::int64_t step) override {
    Batch b = sample_->batch(step);
    return transform_ ? transform_(std::move(b)) : b;
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
  std::shared_ptr<nn::Module> model_;
  std::function<Batch(Batch)> transform_;
};

// The sample's task, for its data and loss only: its own model is drawn from a scratch generator, so the
// variant's parameters come from `gen` exactly as a sample's would.
std::unique_ptr<SampleTask> sample_data(std::string_view sample, const TrainConfig& c) {
  Generator scratch(c.seed);
  return find_sample(sample).make(c, scratch);
}

// masked-softmax: self-attention written by hand, the way much pre-fused code was. The additive float
// mask holds torch.finfo(torch.float16).min for every masked pair: causal (key after query), padded key
// and padded query, the first `pad` positions being padding (left-padded prompts). The terms add up, so
// a padded query's row holds -131008 or less: finite in f32, beyond f16. The softmax is computed in f16,
// as code that calls .half() on the scores (or an f16 fused kernel) does.
class HandWrittenAttention final : public nn::Module {
 public:
  HandWrittenAttention(std::int64_t d_model, std::int64_t n_heads, std::int64_t pad, Generator& gen)
      : Module("HandWrittenAttention"), d_(d_model), h_(n_heads), pad_(pad) {
    qkv_ = register_module("qkv", std::make_shared<nn::Linear>(d_model, 3 * d_model, gen));
    proj_ = register_module("proj", std::make_shared<nn::Linear>(d_model, d_model, gen));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const std::int64_t b = x.size(0), t = x.size(1), hd = d_ / h_;
    const Tensor qkv = (*qkv_)(x);
    auto heads = [&](std::int64_t part) {
      return qkv.slice(2, part * d_, (part + 1) * d_).reshape({b, t, h_, hd}).transpose(1, 2);  // [B, H, T, hd]
    };
    const Tensor q = heads(0), k = heads(1), v = heads(2);
    Tensor scores = mul(matmul(q, k.transpose(2, 3)), 1.0 / std::sqrt(static_cast<double>(hd)));
    scores = add(scores, mask(t, x.device()));  // an f16 score plus the f32 mask is f32
    Tensor probs;
    {
      const AutocastOverrideGuard f16_softmax(
          AutocastOverride{.op = "softmax", .module = name(), .precision = ampscope::Precision::lower});
      probs = softmax(scores, -1);
    }
    const Tensor y = matmul(probs, v).transpose(1, 2).reshape({b, t, d_});
    return (*proj_)(y);
  }

 private:
  Tensor mask(std::int64_t t, Device device) const {
    std::vector<double> m(static_cast<std::size_t>(t * t), 0.0);
    for (std::int64_t i = 0; i < t; ++i) {
      for (std::int64_t j = 0; j < t; ++j) {
        double& e = m[static_cast<std::size_t>(i * t + j)];
        if (j > i) e += kF16Min;     // causal
        if (j < pad_) e += kF16Min;  // padded key
        if (i < pad_) e += kF16Min;  // padded query
      }
    }
    return from_values(m, {t, t}, {DType::f32, device});
  }

  std::int64_t d_, h_, pad_;
  std::shared_ptr<nn::Linear> qkv_, proj_;
};

// A pre-LN block as nn::TransformerBlock, with the hand-written attention.
class HandWrittenBlock final : public nn::Module {
 public:
  HandWrittenBlock(std::int64_t d, std::int64_t heads, std::int64_t pad, Generator& gen) : Module("TransformerBlock") {
    ln1_ = register_module("ln1", std::make_shared<nn::LayerNorm>(Shape{d}));
    attn_ = register_module("attn", std::make_shared<HandWrittenAttention>(d, heads, pad, gen));
    ln2_ = register_module("ln2", std::make_shared<nn::LayerNorm>(Shape{d}));
    mlp_ = register_module("mlp", std::make_shared<nn::Sequential>());
    mlp_->push_back(std::make_shared<nn::Linear>(d, 4 * d, gen));
    mlp_->push_back(std::make_shared<nn::GELU>(GeluApproximation::tanh));
    mlp_->push_back(std::make_shared<nn::Linear>(4 * d, d, gen));
  }

 protected:
  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, (*attn_)((*ln1_)(x)));
    return add(h, (*mlp_)((*ln2_)(h)));
  }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_, ln2_;
  std::shared_ptr<HandWrittenAttention> attn_;
  std::shared_ptr<nn::Sequential> mlp_;
};

// The transformer sample's model (same names, sizes and draw order) with hand-written attention.
class HandWrittenTransformer final : public nn::Module {
 public:
  static constexpr std::int64_t kVocab = 256, kContext = 64, kWidth = 128, kHeads = 4, kLayers = 2, kPad = 8;

  explicit HandWrittenTransformer(Generator& gen) : Module("TinyTransformer") {
    tok_emb_ = register_module("tok_emb", std::make_shared<nn::Embedding>(kVocab, kWidth, gen));
    pos_emb_ = register_module("pos_emb", std::make_shared<nn::Embedding>(kContext, kWidth, gen));
    blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
    for (std::int64_t i = 0; i < kLayers; ++i) blocks_->push_back(std::make_shared<HandWrittenBlock>(kWidth, kHeads, kPad, gen));
    ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{kWidth}));
    head_ = register_module("head", std::make_shared<nn::Linear>(kWidth, kVocab, gen));
  }

 protected:
  Tensor forward(const Tensor& tokens) override {
    const Tensor positions = arange(static_cast<double>(tokens.size(1)), {DType::i64, tokens.device()});
    Tensor x = add((*tok_emb_)(tokens), (*pos_emb_)(positions));
    return (*head_)((*ln_f_)((*blocks_)(x)));
  }

 private:
  std::shared_ptr<nn::Embedding> tok_emb_, pos_emb_;
  std::shared_ptr<nn::Sequential> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> head_;
};

// ---- the scenarios ----

Scenario attention_overflow() {
  Scenario s;
  s.name = "attention-overflow";
  s.description = "transformer: q.k^T scores of block 0 exceed 65504 in f16: inf in the score bmm, NaN after softmax";
  s.sample = "transformer";
  s.expect =
      "origin: bmm (q k^T) in blocks.0.attn at step 0 (+inf scores), propagates to softmax (NaN) and the loss; "
      "every step skips and the scale halves";
  s.configure = [](TrainConfig& c) {
    c.sample = "transformer";
    propose_steps(c, 6);
    propose_batch(c, 4);
  };
  // The query and key projections of block 0 grown large, as long bf16 pretraining leaves them (OPT,
  // transformers #17437): q and k stay below 500 but their 32-term dot products pass 65504.
  s.prepare = [](SampleTask& task, Generator&) {
    constexpr double kGrowth = 120.0;
    constexpr std::int64_t kWidth = 128;  // rows [0, 128) of qkv are q, [128, 256) k, [256, 384) v
    for (const char* p : {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias"}) {
      scale_rows(task.model(), p, kGrowth, 0, 2 * kWidth);
    }
  };
  return s;
}

Scenario masked_softmax() {
  Scenario s;
  s.name = "masked-softmax";
  s.description = "transformer with hand-written attention: a float mask of -65504 terms, softmax in f16, NaN rows";
  s.sample = "transformer";
  s.expect =
      "origin: softmax in blocks.0.attn at step 0 (NaN in the padded rows: its f32 input, finite, held -131008, "
      "which the cast to f16 made -inf); every step skips and the scale halves";
  s.configure = [](TrainConfig& c) {
    c.sample = "transformer";
    propose_steps(c, 6);
    propose_batch(c, 4);
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    auto data = sample_data("transformer", c);
    return std::make_unique<VariantTask>(std::move(data), std::make_shared<HandWrittenTransformer>(gen));
  };
  return s;
}

Scenario activation_overflow() {
  Scenario s;
  s.name = "activation-overflow";
  s.description = "transformer: block 1's feed-forward output grows past 65504 as it trains (the T5 case)";
  s.sample = "transformer";
  s.expect =
      "origin: linear in blocks.1.mlp.2 at step 3 (+-inf: the feed-forward output, about 47000 at step 2, passes "
      "65504; inputs finite); then every step skips and the scale halves";
  s.configure = [](TrainConfig& c) {
    c.sample = "transformer";
    propose_steps(c, 8);
    propose_batch(c, 4);
    propose_lr(c, 2e-2);
  };
  // Block 1's feed-forward works at a scale of thousands, as T5's did after pre-training: its LayerNorm
  // gain is 5000 (the normalised input is at most sqrt(127) = 11.3, so ln2's output stays below 57000).
  // Training at lr 2e-2 then roughly doubles the feed-forward output every step.
  s.prepare = [](SampleTask& task, Generator&) { scale_rows(task.model(), "blocks.1.ln2.weight", 5000.0); };
  return s;
}

Scenario log_zero() {
  Scenario s;
  s.name = "log-zero";
  s.description = "mlp: loss written as nll(log(softmax(x))) with softmax in the logits' f16: log(0) = -inf";
  s.sample = "mlp";
  s.expect =
      "origin: log in the loss (outside any module) at step 0 (-inf where the f16 softmax flushed small "
      "probabilities to 0), then NaN gradients from its backward; every step skips and the scale halves";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 6);
  };
  // A confident classifier: the class scores of a sample span tens, so the smallest probabilities are
  // below f16's smallest subnormal (2^-24, about exp(-17)) but far above f32's (about exp(-103)).
  s.prepare = [](SampleTask& task, Generator&) { scale_rows(task.model(), "fc3.weight", kConfidentLogits); };
  // softmax asked for in the logits' own dtype, as code written for .half() models does: f16 under
  // autocast (an explicit dtype is respected), f32 in an fp32 run.
  s.loss = [](SampleTask&, const Tensor& out, const Tensor& y) {
    return nll_loss(log(softmax(out, 1, out.dtype())), y);
  };
  return s;
}

Scenario lr_explosion() {
  Scenario s;
  s.name = "lr-explosion";
  s.description = "mlp: learning rate 1.5 (1500x the sample's): the weights diverge and the logits overflow f16";
  s.sample = "mlp";
  s.expect =
      "origin: linear in fc3 at step 1 (-inf: one AdamW step at lr 1.5 takes the logits from 0.5 past 65504); "
      "then every step skips and the scale halves";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 8);
    propose_lr(c, 1.5);
  };
  return s;
}

Scenario grad_underflow() {
  Scenario s;
  s.name = "grad-underflow";
  s.description = "mlp in f16 without a scaler, loss averaged over ~1e6 elements: every gradient flushes to 0";
  s.sample = "mlp";
  s.expect =
      "no inf or NaN anywhere; from step 0 every f16 gradient is exactly 0 (the logits' gradients, at most "
      "2^-26, round to 0 in log_softmax's backward), so no parameter moves and the loss stays flat";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    c.use_scaler = false;
    propose_steps(c, 20);
  };
  // The gradient a loss hands each element it averages over is 1 / (number of elements): a loss averaged
  // over a million values (a dense per-pixel or per-token objective) gives gradients this small. Here
  // the sample's cross-entropy is divided by 2^20, so each logit's gradient is at most 2^-6 * 2^-20 =
  // 2^-26, below half of f16's smallest subnormal (2^-24).
  s.loss = [](SampleTask& task, const Tensor& out, const Tensor& y) {
    return mul(task.loss(out, y), kSmallLossWeight);
  };
  return s;
}

Scenario scale_collapse() {
  Scenario s;
  s.name = "scale-collapse";
  s.description = "mlp: a raw feature (values ~1e5) overflows f16 every step; the scale halves every step";
  s.sample = "mlp";
  s.expect =
      "origin: linear in fc1 at step 0 (its input overflows in autocast's cast to f16), NaN loss; every step "
      "skips and the scale halves every step";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 20);
  };
  // Feature 0 arrives in its raw units (a price, a count, a timestamp): around 1e5 instead of
  // standardised. Finite in f32, beyond f16, in every batch.
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    return std::make_unique<VariantTask>(find_sample("mlp").make(c, gen), nullptr, [](Batch b) {
      std::vector<double> x = b.x.values();
      const std::int64_t features = b.x.size(1);
      for (std::size_t i = 0; i < x.size(); i += static_cast<std::size_t>(features)) x[i] = kRawFeature * (1.0 + 0.1 * x[i]);
      b.x = from_values(x, b.x.shape(), {b.x.dtype(), b.x.device()});
      return b;
    });
  };
  return s;
}

Scenario no_zero_grad() {
  Scenario s;
  s.name = "no-zero-grad";
  s.description = "mlp: the loop never clears gradients; one overflow stays in .grad and every later step skips";
  s.sample = "mlp";
  s.expect =
      "origin: the backward of linear in fc3 at step 5 (the scale, doubled every step, reaches 2^21 and the "
      "scaled gradients overflow); the inf stays in .grad, so every later step skips and halves the scale "
      "with no new origin";
  // The scale grows every step, so the first overflow comes within a few steps instead of after
  // thousands (PyTorch's growth_interval is 2000).
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    c.zero_grad = false;
    propose_steps(c, 20);
    propose_growth_interval(c, 1);
  };
  return s;
}

// rank-bad-batch: one bad row in one step's data. Data-parallel, the global batch's last row is in the last
// rank's share ([r*B/N, (r+1)*B/N)), so only that rank's forward overflows; its gradient's inf reaches every
// rank through the all-reduce, and every rank skips the step.
constexpr std::int64_t kBadBatchStep = 3;
constexpr double kBadFeature = 1e6;

class BadRowTask final : public SampleTask {
 public:
  explicit BadRowTask(std::unique_ptr<SampleTask> sample) : sample_(std::move(sample)) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override {
    Batch b = sample_->batch(step);
    if (step != kBadBatchStep) return b;
    std::vector<double> x = b.x.values();
    const std::int64_t rows = b.x.size(0), features = b.x.size(1);
    x[static_cast<std::size_t>((rows - 1) * features)] = kBadFeature;  // the last row's feature 0
    b.x = from_values(x, b.x.shape(), {b.x.dtype(), b.x.device()});
    return b;
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
};

Scenario rank_bad_batch() {
  Scenario s;
  s.name = "rank-bad-batch";
  s.description = "mlp, for --ddp: at step 3 the batch's last row (the last rank's share) holds 1e6 in one feature";
  s.sample = "mlp";
  s.expect =
      "origin: linear in fc1 at step 3 (its input, 1e6, overflows in autocast's cast to f16), on the last rank "
      "only under --ddp; its gradients' inf reaches every rank through the all-reduce, so every rank skips "
      "step 3 and halves the scale; the other steps train normally";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 6);
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    return std::make_unique<BadRowTask>(find_sample("mlp").make(c, gen));
  };
  return s;
}

// rank-drift: the ranks' parameters part. Data-parallel ranks stay identical only because every rank applies the
// same averaged gradient to the same parameters; one value that differs on one rank (a nondeterministic kernel,
// an optimizer step computed differently, a flipped bit in one GPU's memory) is never corrected by the
// all-reduce, which averages gradients, not parameters. Here, as step 3 begins, every value of the last rank's
// fc2.weight moves by one ulp (the next float up), as if that rank's kernel had rounded the other way: its checksum
// after step 3 differs from the other ranks', and stays so. (A single value one ulp off can heal: once an update
// takes it across a power of two, both ranks' values may round to the same float.)
constexpr std::int64_t kDriftStep = 3;
constexpr const char* kDriftParameter = "fc2.weight";

class DriftTask final : public SampleTask {
 public:
  DriftTask(std::unique_ptr<SampleTask> sample, bool last_rank) : sample_(std::move(sample)), last_rank_(last_rank) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override {
    if (step == kDriftStep && last_rank_) nudge();
    return sample_->batch(step);
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  void nudge() {
    for (auto& [name, p] : model().named_parameters()) {
      if (name != kDriftParameter) continue;
      if (p.dtype() != DType::f32) {
        throw Error(fmt::format("--scenario rank-drift: {} is {}, not f32", name, dtype_name(p.dtype())));
      }
      NoGradGuard no_grad;
      std::vector<double> v = p.values();
      for (double& x : v) x = std::nextafter(static_cast<float>(x), std::numeric_limits<float>::infinity());
      p.copy_(from_values(v, p.shape(), {p.dtype(), p.device()}));
      return;
    }
    throw Error(fmt::format("--scenario rank-drift: the model has no parameter {}", kDriftParameter));
  }

  std::unique_ptr<SampleTask> sample_;
  bool last_rank_;
};

Scenario rank_drift() {
  Scenario s;
  s.name = "rank-drift";
  s.description = "mlp, for --ddp: as step 3 begins, every value of the last rank's fc2.weight is one ulp "
                  "higher (a kernel that rounded differently on one GPU)";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --ddp the multi-rank report finds the ranks' parameters diverged at step 3, naming "
      "fc2.weight on the last rank (its checksum differs from rank 0's from step 3 on)";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 6);
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    const bool last = c.process_group == nullptr || c.process_group->rank() == c.process_group->size() - 1;
    return std::make_unique<DriftTask>(find_sample("mlp").make(c, gen), last);
  };
  return s;
}

// fp8-stale-scale: one record in raw units in one step. A data pipeline that standardises features record by record
// and misses one (a malformed row whose feature 0 is a raw count, 1e5) hands the model a single outlier value in
// step kRawRecordStep. In bf16 nothing overflows (1e5 is far below bf16's max); under FP8's delayed recipe the
// input's amax of that step enters the amax history and sets the scale of every later step until it leaves the
// window (1024 steps by default).
constexpr std::int64_t kRawRecordStep = 3;

class RawRecordTask final : public SampleTask {
 public:
  explicit RawRecordTask(std::unique_ptr<SampleTask> sample) : sample_(std::move(sample)) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override {
    Batch b = sample_->batch(step);
    if (step != kRawRecordStep) return b;
    std::vector<double> x = b.x.values();
    x[0] = kRawFeature;  // the first record's feature 0, unstandardised
    b.x = from_values(x, b.x.shape(), {b.x.dtype(), b.x.device()});
    return b;
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
};

Scenario fp8_stale_scale() {
  Scenario s;
  s.name = "fp8-stale-scale";
  s.description = "mlp, for --precision fp8: at step 3 one record's feature 0 arrives in raw units (1e5)";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision fp8 (delayed recipe) fc1's input amax spikes at step 3, the scale of every "
      "later step is set by it (the amax history holds it for 1024 steps), and from step 4 about 12% of fc1's "
      "inputs quantize to zero (none did before): a stale_scale finding on fc1's input";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    return std::make_unique<RawRecordTask>(find_sample("mlp").make(c, gen));
  };
  return s;
}

// fp8-e4m3-grads: every tensor in E4M3. TransformerEngine offers Format.E4M3 beside HYBRID, and E4M3's extra mantissa
// bit reads like the better choice; for gradients it is not: they spread over more binades than E4M3's 2^18 below
// the scaled amax. Here the loss sharpens the softmax as contrastive and distillation losses do (logits / 0.05):
// once the model is confident the wrong classes' probabilities fall as exp(-gap / 0.05), and a step's gradients span
// 22 to 38 binades, which no per-tensor scale fits into E4M3. (A loss merely scaled down would not do it: the
// delayed scale follows the amax. The first step's underflow at the initial scale 1 is the recipe's start-up, not
// a finding: docs/fp8.md.)
constexpr double kLogitTemperature = 0.05;

class SharpenedLossTask final : public SampleTask {
 public:
  explicit SharpenedLossTask(std::unique_ptr<SampleTask> sample) : sample_(std::move(sample)) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override { return sample_->batch(step); }
  // The logits divided by the temperature, as a contrastive or distillation loss writes it.
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out * (1.0 / kLogitTemperature), y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
};

Scenario fp8_e4m3_grads() {
  Scenario s;
  s.name = "fp8-e4m3-grads";
  s.description =
      "mlp with its logits divided by 0.05 in the loss, for --precision fp8: every tensor in E4M3 (--fp8-format e4m3 "
      "unless given), gradients too";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision fp8 the gradients every Linear receives (grad_output) underflow in E4M3 once "
      "the model is confident (fc3's from step 4, 57% in step 9; step 0 is the recipe's start-up): "
      "e4m3_grad_underflow, remedy --fp8-format hybrid";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
    // Only an FP8 run has a format, and only where the user left HYBRID, the default.
    if (c.precision == Precision::fp8 && c.fp8_format == defaults().fp8_format) c.fp8_format = "e4m3";
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    return std::make_unique<SharpenedLossTask>(find_sample("mlp").make(c, gen));
  };
  return s;
}

// fp8-saturation: the top of a learning-rate sweep. At lr 0.5 (500x the mlp's) the weights and activations grow
// between steps faster than a delayed scale, computed from earlier steps' amaxes, follows: the values past the
// history's amax are clipped at +-max by satfinite, silently (bf16 trains on, diverging but finite).
Scenario fp8_saturation() {
  Scenario s;
  s.name = "fp8-saturation";
  s.description = "mlp, for --precision fp8: learning rate 0.5 (the top of a sweep): amaxes outgrow the delayed scale";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision fp8 (delayed recipe) every Linear's weight saturates from step 1 (fc1's weight "
      "100% in step 1): saturation findings, remedies --fp8-margin and --fp8-recipe current (both verify at fc1's "
      "weight, where the first finding was named; with the margin fc1's grad_output still saturates in step 1, reported "
      "as the same kind elsewhere)";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
    propose_lr(c, 0.5);
  };
  return s;
}

// The weather-station mlp: the mlp sample's 64 features with the first one replaced by the sea-level air pressure
// in hPa (1013 + 8 x, x the sample's own feature: the usual 990 to 1040), fed as read, unnormalized, as a user
// feeding a raw sensor column does. Every other feature is of order 1, so in fc1's input one value per row is a
// thousand times its neighbours. bf16 trains on it; the block-scaled formats meet it in the blocks that hold it.
constexpr double kPressureMean = 1013.0, kPressureSpread = 8.0;

class RawPressureTask final : public SampleTask {
 public:
  explicit RawPressureTask(std::unique_ptr<SampleTask> sample) : sample_(std::move(sample)) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override {
    Batch b = sample_->batch(step);
    NoGradGuard no_grad;
    std::vector<double> v = b.x.values();
    const std::int64_t features = b.x.size(b.x.dim() - 1);
    for (std::size_t i = 0; i < v.size(); i += static_cast<std::size_t>(features))
      v[i] = kPressureMean + kPressureSpread * v[i];
    b.x = from_values(v, b.x.shape(), {b.x.dtype()});
    return b;
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
};

// The mlp's last Linear has 10 outputs, which no block format blocks: a block-scaled run keeps it in bf16 (as a
// user must; TransformerEngine users keep the last layer in higher precision anyway).
void keep_head_for_blocks(TrainConfig& c) {
  if ((c.precision == Precision::mxfp8 || c.precision == Precision::nvfp4) &&
      std::find(c.fp8_keep_bf16.begin(), c.fp8_keep_bf16.end(), "fc3") == c.fp8_keep_bf16.end())
    c.fp8_keep_bf16.push_back("fc3");
}

std::unique_ptr<SampleTask> make_raw_pressure(const TrainConfig& c, Generator& gen) {
  return std::make_unique<RawPressureTask>(find_sample("mlp").make(c, gen));
}

// mx-floor-clipping: the weather-station mlp under MXFP8 with the OCP specification's scale rule, 2^(floor(log2
// amax) - 8): a block's amax lands in [256, 512) and values past 448 clip. Pressure around 1013 hPa has a mantissa
// of 1.98 (1013 = 1.98 x 2^9): in every row's block holding it the scale is 2 and the pressure, 506 after
// scaling, clips to 448 (896 hPa), 11.5% off, in most rows.
Scenario mx_floor_clipping() {
  Scenario s;
  s.name = "mx-floor-clipping";
  s.description = "mlp with one raw feature, air pressure in hPa (about 1013), for --precision mxfp8: the OCP floor "
                  "scale rule (--mx-scale floor unless given); fc3 kept in bf16";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision mxfp8 (floor rule) fc1's input rowwise copy clips the pressure in nearly every "
      "row (seed 0, 10 steps: 724 of 40960 values in 704 blocks, RMS error up to 10.6%): mx_floor_clipping, remedy "
      "--mx-scale round-up (verifies); the same clipping sets fc1's input copies apart (block_copy_mismatch) and "
      "makes fc1's error dominate (block_error_dominates)";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
    if (c.precision == Precision::mxfp8 && c.mx_scale == defaults().mx_scale) c.mx_scale = "floor";
    keep_head_for_blocks(c);
  };
  s.make_task = make_raw_pressure;
  return s;
}

// nvfp4-outlier: the same weather-station mlp under NVFP4. A 1x16 block holding the pressure gets the block scale
// 1013 / 6 (E2M1's largest element is 6): its 15 other values, of order 1, are under a quarter of that scale and
// round to 0. Every row's first block of fc1's input is flattened.
Scenario nvfp4_outlier() {
  Scenario s;
  s.name = "nvfp4-outlier";
  s.description = "mlp with one raw feature, air pressure in hPa (about 1013), for --precision nvfp4; fc3 kept in bf16";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision nvfp4 every row's first block of fc1's input loses 15 of its 16 values to the "
      "pressure's block scale (seed 0, 10 steps: 28.8% of fc1's input values to 0): block_outlier at fc1 input "
      "rowwise, block (0, 0), remedy --fp8-keep-bf16 fc1; fc1's and fc2's input copies apart (block_copy_mismatch)";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
    keep_head_for_blocks(c);
  };
  s.make_task = make_raw_pressure;
  return s;
}

// The storm-day mlp: the mlp sample's batches of 64 records, one of which comes from the tail of the data (a storm
// day among calm ones): all its features kStormFactor times the typical. Its position in the batch varies with the
// step, as a shuffled loader places it. Along the features it is an ordinary record, only larger: no rowwise block
// sees an outlier. Along the batch, the dimension the weight gradient contracts (dW = dy^T x), every 16-record
// block of a feature that holds it is dominated by it.
constexpr double kStormFactor = 50.0;

class StormRecordTask final : public SampleTask {
 public:
  explicit StormRecordTask(std::unique_ptr<SampleTask> sample) : sample_(std::move(sample)) {}
  nn::Module& model() override { return sample_->model(); }
  Batch batch(std::int64_t step) override {
    Batch b = sample_->batch(step);
    NoGradGuard no_grad;
    std::vector<double> v = b.x.values();
    const std::int64_t features = b.x.size(b.x.dim() - 1);
    const std::int64_t records = b.x.numel() / features;
    const std::int64_t storm = (step * 37 + 5) % records;
    for (std::int64_t j = 0; j < features; ++j) v[static_cast<std::size_t>(storm * features + j)] *= kStormFactor;
    b.x = from_values(v, b.x.shape(), {b.x.dtype()});
    return b;
  }
  Tensor loss(const Tensor& out, const Tensor& y) override { return sample_->loss(out, y); }
  double default_lr() const override { return sample_->default_lr(); }
  std::string identity() const override { return sample_->identity(); }

 private:
  std::unique_ptr<SampleTask> sample_;
};

// nvfp4-batch-outlier: the storm-day mlp under NVFP4, for a run with --nvfp4-no-rht (the Hadamard transform off, as
// a user turning it off for speed does). The columnwise copy of fc1's input, blocked along the batch, gives the
// storm record's block the scale 50 |x| / 6: the 15 calm records beside it round to 0.
Scenario nvfp4_batch_outlier() {
  Scenario s;
  s.name = "nvfp4-batch-outlier";
  s.description = "mlp where one record per batch of 64 is a storm day, its features 50x the typical, for "
                  "--precision nvfp4 --nvfp4-no-rht; fc3 kept in bf16";
  s.sample = "mlp";
  s.expect =
      "no NaN/Inf; under --precision nvfp4 --nvfp4-no-rht the columnwise copy of fc1's input (the weight gradient's, "
      "blocked along the batch) loses the calm records beside the storm record (seed 0, 10 steps: 22.9% of its values "
      "to 0, 15 of 16 in the worst block): block_outlier on fc1 input columnwise (and downstream on fc2 input "
      "columnwise and fc2 grad_output rowwise, their flattened blocks holding the storm record), remedies drop "
      "--nvfp4-no-rht and --fp8-keep-bf16 fc1: ampscope fix verifies --fp8-keep-bf16 fc1 (0.2% over the bf16 run's "
      "loss; fc2's flattened copies reported as the same kind elsewhere), not the transform (it clears the input "
      "copies, but the final loss ends 19.3% over the bf16 run's, tolerance 9.2%); block_copy_mismatch on fc1's and "
      "fc2's inputs, remedy --fp8-keep-bf16 fc1 (verified for fc1's: 0.2% over the bf16 run's loss)";
  s.configure = [](TrainConfig& c) {
    c.sample = "mlp";
    propose_steps(c, 10);
    keep_head_for_blocks(c);
  };
  s.make_task = [](const TrainConfig& c, Generator& gen) -> std::unique_ptr<SampleTask> {
    return std::make_unique<StormRecordTask>(find_sample("mlp").make(c, gen));
  };
  return s;
}

}  // namespace

const std::vector<Scenario>& scenario_registry() {
  static const std::vector<Scenario> kScenarios = {attention_overflow(), masked_softmax(), activation_overflow(),
                                                   log_zero(),           lr_explosion(),   grad_underflow(),
                                                   scale_collapse(),     no_zero_grad(),   rank_bad_batch(),
                                                   rank_drift(),         fp8_stale_scale(),  fp8_e4m3_grads(),
                                                   fp8_saturation(),     mx_floor_clipping(), nvfp4_outlier(),
                                                   nvfp4_batch_outlier()};
  return kScenarios;
}

const Scenario& find_scenario(std::string_view name) {
  std::string known;
  for (const Scenario& s : scenario_registry()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(fmt::format("unknown scenario '{}'; known scenarios: {}\nhint: ampscope train --list-scenarios", name,
                          known.empty() ? "(none)" : known));
}

}  // namespace ampscope::samples
