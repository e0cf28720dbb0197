// step_digest: one training step (forward, cross-entropy, backward) of training_bench's models at its shapes
// and seeds, printed as the loss's bits and a 64-bit FNV-1a hash of every parameter gradient's bytes. Two
// builds (or two thread counts) that print the same lines computed the same bits; bench/RESULTS.md uses it to
// show that a faster kernel kept the step's results (issue 37).
//
//   AMPSCOPE_NUM_THREADS=1 build/bench/step_digest mlp,cnn,transformer f32,f16 > before.txt
//   build/bench/step_digest gpt2_small f32
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "samples/models.h"
#include "samples/synthetic.h"

namespace ampscope {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

std::uint64_t fnv1a(const Tensor& t) {
  const Tensor host = t.contiguous().to(Device::cpu());
  const auto* p = static_cast<const unsigned char*>(host.data());
  const std::size_t n = static_cast<std::size_t>(host.numel()) * dtype_size(host.dtype());
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void digest(const std::string& name, nn::Module& model, const Tensor& x, const Tensor& y, bool tokens) {
  Tensor out = model(x);
  if (tokens) out = out.reshape({-1, out.size(-1)});
  const Tensor loss = cross_entropy(out, tokens ? y.reshape({-1}) : y);
  loss.backward();
  const double v = loss.to(DType::f64).item();
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  std::printf("%s loss %.9g %016llx\n", name.c_str(), v, static_cast<unsigned long long>(bits));
  for (const auto& [pname, p] : model.named_parameters()) {
    std::printf("%s grad %s %016llx\n", name.c_str(), pname.c_str(), static_cast<unsigned long long>(fnv1a(p.grad())));
  }
}

int run(const std::string& models, const std::string& dtypes) {
  for (const std::string& m : split(models)) {
    for (const std::string& dt : split(dtypes)) {
      const DType dtype = dt == "f16" ? DType::f16 : dt == "bf16" ? DType::bf16 : DType::f32;
      const std::string name = m + "/" + dt;
      if (m == "mlp") {
        Generator gen(1);
        auto model = samples::make_mlp({.in_features = 784, .hidden = 256, .classes = 10}, gen);
        model->to(dtype);
        const samples::Dataset d = samples::make_blobs({.samples = 128, .features = 784, .classes = 10}, gen);
        digest(name, *model, d.x.to(dtype), d.y, false);
      } else if (m == "cnn") {
        Generator gen(2);
        auto model = samples::make_mnist_cnn(gen);
        model->to(dtype);
        const samples::Dataset d = samples::make_random_images(64, gen);
        digest(name, *model, d.x.to(dtype), d.y, false);
      } else if (m == "transformer" || m == "gpt2_small") {
        const bool small = m == "transformer";
        Generator gen(small ? 3 : 4);
        const samples::TinyTransformerConfig config =
            small ? samples::TinyTransformerConfig{.vocab = 256, .context = 64, .d_model = 128, .n_heads = 4, .n_layers = 2}
                  : samples::TinyTransformerConfig{.vocab = 50257, .context = 256, .d_model = 768, .n_heads = 12, .n_layers = 12};
        samples::TinyTransformer model(config, gen);
        model.to(dtype);
        const samples::Dataset d = samples::make_token_sequences(small ? 16 : 1, small ? 64 : 256, config.vocab, gen);
        digest(name, model, d.x, d.y, true);
      } else {
        std::fprintf(stderr, "step_digest: unknown model '%s'\nhint: use mlp, cnn, transformer or gpt2_small\n", m.c_str());
        return 2;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace ampscope

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: step_digest MODELS [DTYPES]   (MODELS: mlp,cnn,transformer,gpt2_small; DTYPES: f32,f16,bf16)\n");
    return 2;
  }
  return ampscope::run(argv[1], argc > 2 ? argv[2] : "f32");
}
