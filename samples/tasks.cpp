// The sample tasks of `ampscope train`: mlp, cnn, transformer, each with deterministic data.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>

#include <fmt/format.h>

#include "core/autograd.h"
#include "core/error.h"
#include "core/io/input_file.h"
#include "core/io/safetensors.h"
#include "core/ops.h"
#include "samples/idx.h"
#include "samples/models.h"
#include "samples/synthetic.h"
#include "samples/task.h"

namespace ampscope::samples {

// Here, beside the tasks, rather than in cli/: SampleTask's vtable lives with this, its first out-of-line
// virtual function, and ampscope_samples must not need ampscope_cli (a shared build links each library
// with its own dependencies only).
void SampleTask::save_model(const std::filesystem::path& folder) {
  std::filesystem::create_directories(folder);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : model().named_parameters()) tensors.emplace_back(name, p);
  safetensors::save(folder / "model.safetensors", tensors, {{"format", "pt"}, {"ampscope_task", identity()}});
}

namespace {

// Batch `step` of a fixed data set: consecutive slices, wrapping around.
// A batch larger than the data set is refused when the task is built (it used to run the whole set
// while the trace recorded the batch asked for).
void check_batch(std::int64_t batch, const Dataset& data, std::string_view what) {
  const std::int64_t n = data.x.size(0);
  if (batch > n) {
    throw Error(fmt::format("--batch: {} is not allowed; expected at most {}, the number of samples in {}", batch, n, what));
  }
}

Batch slice_batch(const Dataset& data, std::int64_t step, std::int64_t batch) {
  const std::int64_t n = data.x.size(0);
  const std::int64_t b = std::min(batch, n);
  const std::int64_t start = (step * b) % (n - b + 1);
  return {data.x.slice(0, start, start + b), data.y.slice(0, start, start + b), {}};
}

class MlpTask final : public SampleTask {
 public:
  MlpTask(const TrainConfig& c, Generator& gen) : batch_(c.batch) {
    model_ = make_mlp({.in_features = 64, .hidden = 256, .classes = 10}, gen);
    Generator data_gen(c.seed + 1000);
    data_ = make_blobs({.samples = 4096, .features = 64, .classes = 10, .spread = 1.0, .separation = 1.0}, data_gen);
    check_batch(batch_, data_, "the mlp sample's data set");
  }
  nn::Module& model() override { return *model_; }
  Batch batch(std::int64_t step) override { return slice_batch(data_, step, batch_); }
  Tensor loss(const Tensor& out, const Tensor& y) override { return cross_entropy(out, y); }
  double default_lr() const override { return 1e-3; }
  std::string identity() const override { return "mlp"; }

 private:
  std::int64_t batch_;
  std::shared_ptr<nn::Sequential> model_;
  Dataset data_;
};

// MNIST-shaped images where the class decides where a bright square sits, plus noise: learnable, and
// shaped like the real thing so the network is the classic one.
Dataset make_square_images(std::int64_t samples, Generator& gen) {
  NoGradGuard no_grad;
  std::vector<double> pixels(static_cast<std::size_t>(samples * 28 * 28));
  std::vector<double> labels(static_cast<std::size_t>(samples));
  const std::vector<double> noise = rand({samples, 28 * 28}, gen).values();
  for (std::int64_t s = 0; s < samples; ++s) {
    const std::int64_t label = s % 10;
    labels[s] = static_cast<double>(label);
    const std::int64_t top = 3 + (label / 5) * 12, left = 2 + (label % 5) * 5;
    for (std::int64_t i = 0; i < 28 * 28; ++i) {
      const std::int64_t r = i / 28, c = i % 28;
      const bool in_square = r >= top && r < top + 8 && c >= left && c < left + 5;
      pixels[s * 784 + i] = 0.3 * noise[s * 784 + i] + (in_square ? 0.7 : 0.0);
    }
  }
  return {from_values(pixels, {samples, 1, 28, 28}), from_values(labels, {samples}, {DType::i64})};
}

class CnnTask final : public SampleTask {
 public:
  CnnTask(const TrainConfig& c, Generator& gen) : batch_(c.batch) {
    model_ = make_mnist_cnn(gen);
    if (!c.data_dir.empty()) {
      data_ = load_mnist(c.data_dir, "train");
    } else {
      Generator data_gen(c.seed + 2000);
      data_ = make_square_images(1024, data_gen);
    }
    check_batch(batch_, data_, c.data_dir.empty() ? "the cnn sample's synthetic data set" : "the --data set");
  }
  nn::Module& model() override { return *model_; }
  Batch batch(std::int64_t step) override { return slice_batch(data_, step, batch_); }
  Tensor loss(const Tensor& out, const Tensor& y) override { return cross_entropy(out, y); }
  double default_lr() const override { return 1e-3; }
  std::string identity() const override { return "cnn"; }

 private:
  std::int64_t batch_;
  std::shared_ptr<nn::Sequential> model_;
  Dataset data_;
};

// A deterministic English-like byte stream: words from a small vocabulary in a repeating grammar, so a
// small model can learn something in a few steps.
std::string synthetic_text(std::size_t length, std::uint64_t seed) {
  static const char* const kWords[] = {"the", "model", "runs", "in", "half", "precision", "and", "scales",
                                       "its", "loss", "so", "small", "gradients", "survive", "until", "a",
                                       "value", "overflows", "to", "infinity", "then", "we", "look", "why"};
  constexpr std::size_t kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::string text;
  std::uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  while (text.size() < length) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    text += kWords[(state >> 33) % kCount];
    text += ((state >> 20) % 7 == 0) ? ". " : " ";
  }
  text.resize(length);
  return text;
}

// The transformer sample holds its text in memory (it draws windows anywhere in it), so the file is bounded:
// a user's corpus of more than this belongs to --model, whose tokenizer streams it. Opened through
// core/io/input_file.h: only a regular file (a FIFO would block open(), /dev/zero would be read until memory
// runs out), its size checked before anything is read.
constexpr std::uint64_t kMaxTextBytes = std::uint64_t{1} << 30;

std::string read_text_file(const std::string& path) {
  std::string text;
  if (auto problem = detail::read_input_file(path, kMaxTextBytes, text)) {
    using Kind = detail::FileProblem::Kind;
    const char* hint = problem->kind == Kind::too_large
                           ? "the transformer sample holds its text in memory; give a smaller file, or train a "
                             "--model folder, whose --text is streamed"
                       : problem->kind == Kind::not_regular ? "give a regular text file (not a pipe or a device)"
                                                            : "give a readable text file";
    throw Error(fmt::format("--text '{}': {}\nhint: {}", path, problem->describe(), hint));
  }
  return text;
}

class TransformerTask final : public SampleTask {
 public:
  TransformerTask(const TrainConfig& c, Generator& gen) : batch_(c.batch), seed_(c.seed) {
    model_ = std::make_shared<TinyTransformer>(
        TinyTransformerConfig{.vocab = 256, .context = 64, .d_model = 128, .n_heads = 4, .n_layers = 2}, gen);
    text_ = c.text_file.empty() ? synthetic_text(1 << 16, c.seed) : read_text_file(c.text_file);
    if (text_.size() < 66) {
      throw Error(fmt::format("--text: '{}' holds {} bytes; the transformer needs at least 66 (a context of 64 "
                              "plus the next byte)",
                              c.text_file, text_.size()));
    }
  }
  nn::Module& model() override { return *model_; }
  Batch batch(std::int64_t step) override {
    const std::int64_t T = 64;
    std::vector<double> x, y;
    // Window starts from the Philox stream of (seed, step): the same batch for the same step, always.
    Generator gen(seed_ + 3000);
    gen.set_offset(static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(batch_));
    const std::vector<double> u = rand({batch_}, gen, {DType::f64}).values();
    for (std::int64_t b = 0; b < batch_; ++b) {
      const auto start = static_cast<std::size_t>(u[b] * static_cast<double>(text_.size() - T - 1));
      for (std::int64_t t = 0; t < T; ++t) {
        x.push_back(static_cast<unsigned char>(text_[start + t]));
        y.push_back(static_cast<unsigned char>(text_[start + t + 1]));
      }
    }
    return {from_values(x, {batch_, T}, {DType::i64}), from_values(y, {batch_, T}, {DType::i64}), {}};
  }
  Tensor loss(const Tensor& out, const Tensor& y) override {
    return cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
  }
  double default_lr() const override { return 3e-3; }
  std::string identity() const override { return "transformer"; }

 private:
  std::int64_t batch_;
  std::uint64_t seed_;
  std::shared_ptr<TinyTransformer> model_;
  std::string text_;
};

template <class Task>
std::function<std::unique_ptr<SampleTask>(const TrainConfig&, Generator&)> factory() {
  return [](const TrainConfig& c, Generator& gen) { return std::make_unique<Task>(c, gen); };
}

}  // namespace

const std::vector<SampleInfo>& sample_registry() {
  static const std::vector<SampleInfo> kSamples = {
      {"mlp", "MLP 64-256-256-10 (fc1, fc2, fc3) on 10 Gaussian clusters", 64, factory<MlpTask>()},
      {"cnn", "the classic MNIST CNN (conv1, conv2, pool, fc1, fc2); synthetic digits, or --data DIR", 32,
       factory<CnnTask>()},
      {"transformer", "GPT-style byte model: 2 pre-LN blocks, width 128, 4 heads, context 64; --text FILE", 8,
       factory<TransformerTask>()},
  };
  return kSamples;
}

const SampleInfo& find_sample(std::string_view name) {
  std::string known;
  for (const SampleInfo& s : sample_registry()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(fmt::format("unknown sample '{}'; known samples: {}\nhint: ampscope train --list-samples", name, known));
}

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
    case Precision::mxfp8: return "mxfp8";
    case Precision::nvfp4: return "nvfp4";
  }
  return "?";
}

Precision parse_precision(std::string_view name) {
  for (Precision p : {Precision::fp32, Precision::fp16, Precision::bf16, Precision::fp8, Precision::mxfp8,
                      Precision::nvfp4}) {
    if (precision_name(p) == name) return p;
  }
  throw Error(fmt::format("unknown precision '{}'; valid: fp32, fp16, bf16, fp8, mxfp8, nvfp4", name));
}

}  // namespace ampscope::samples
