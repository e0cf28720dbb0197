// A GPT-2-small-shaped model from a Hugging Face folder on the CPU backend (issue 18's benchmark): the
// time to load the folder, the step time of `ampscope train --model` in f32 and under fp16 (and bf16)
// autocast, and the peak memory of each, one phase per process so each peak is its own. bench/hf_bench.sh
// runs every phase and PyTorch's side (bench/hf_pytorch_bench.py) on the same folder in one go; results in
// bench/RESULTS.md.
//
//   build/bench/hf_bench write DIR                  # a random GPT-2-small folder (124M parameters) + tokens
//   build/bench/hf_bench load DIR                   # load time
//   build/bench/hf_bench fp32|fp16|bf16 DIR [STEPS]  # median step time over STEPS steps after 2 warm-up steps
//
// Model: 12 layers, d 768, 12 heads, vocabulary 50257, 1024 positions; batch 1, context 256; the probe off
// (the cost of the runtime itself; the probe's own cost is probe_bench's subject).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/random.h"
#include "models/hf_models.h"
#include "cli/run.h"

namespace {

using namespace ampscope;
namespace fs = std::filesystem;

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json gpt2_small() {
  return {{"model_type", "gpt2"},        {"vocab_size", 50257},   {"n_positions", 1024},
          {"n_embd", 768},               {"n_layer", 12},         {"n_head", 12},
          {"layer_norm_epsilon", 1e-5},  {"activation_function", "gelu_new"},
          {"initializer_range", 0.02},   {"resid_pdrop", 0.0},    {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},           {"tie_word_embeddings", true}};
}

int write(const fs::path& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  Generator gen(0);
  auto model = samples::hf::make_model(gpt2_small(), gen);
  samples::hf::save_model(*model, dir);
  // Tokens: enough for the steps of every phase at batch 1, context 256 (a window needs 257).
  std::ofstream tokens(dir / "tokens.txt");
  Generator ids(1);
  const std::vector<double> u = rand({64 * 257}, ids).values();
  for (double v : u) tokens << static_cast<int>(v * 50257) % 50257 << ' ';
  tokens << '\n';
  fmt::print("write: {:.2f} s ({} parameters), peak RSS {:.0f} MiB\n", seconds_since(t0),
             [&] { std::int64_t n = 0; for (const Tensor& p : model->parameters()) n += p.numel(); return n; }(),
             peak_rss_mib());
  return 0;
}

int load(const fs::path& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  samples::hf::LoadedModel loaded = samples::hf::load_model(dir);
  const double seconds = seconds_since(t0);
  // The parameters loaded, for bench/hf_bench.sh's premise (PyTorch's side loaded the same model).
  std::int64_t n = 0;
  for (const Tensor& p : loaded.model->parameters()) n += p.numel();
  fmt::print("load: {:.3f} s, peak RSS {:.0f} MiB ({} parameters)\n", seconds, peak_rss_mib(), n);
  return 0;
}

int step(const std::string& precision, const fs::path& dir, int steps) {
  samples::TrainConfig c;
  c.model_dir = dir.string();
  c.tokens_file = (dir / "tokens.txt").string();
  c.context = 256;
  c.batch = 1;
  c.steps = steps + 2;
  c.device = "cpu";
  c.probe = "off";
  c.precision = samples::parse_precision(precision);
  std::vector<double> at;
  std::vector<double> losses;
  samples::train(c, [&](const samples::StepReport& r) {
    at.push_back(r.seconds);
    losses.push_back(r.loss);
  });
  std::vector<double> times;
  for (std::size_t i = 2; i < at.size(); ++i) times.push_back(at[i] - at[i - 1]);
  std::sort(times.begin(), times.end());
  const double median = times.empty() ? 0 : times[times.size() / 2];
  fmt::print("{}: step {:.1f} ms (median of {}; min {:.1f}, max {:.1f}), peak RSS {:.0f} MiB\n", precision,
             1000 * median, times.size(), 1000 * times.front(), 1000 * times.back(), peak_rss_mib());
  // The premise (after timing): every step asked ran and ended with a finite loss; exit 1 otherwise.
  const auto bad = std::find_if(losses.begin(), losses.end(), [](double l) { return !std::isfinite(l); });
  if (static_cast<int>(at.size()) != c.steps || bad != losses.end()) {
    std::fprintf(stderr, "hf_bench: premise broken: expected %lld steps with a finite loss, found %zu steps%s\n",
                 static_cast<long long>(c.steps), at.size(),
                 bad == losses.end() ? "" : fmt::format(", loss {} at step {}", *bad, bad - losses.begin()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: hf_bench write|load|fp32|fp16|bf16 DIR [STEPS]\n");
    return 2;
  }
  const std::string phase = argv[1];
  const fs::path dir = argv[2];
  const int steps = argc > 3 ? std::atoi(argv[3]) : 5;
  try {
    if (phase == "write") return write(dir);
    if (phase == "load") return load(dir);
    if (phase == "fp32" || phase == "fp16" || phase == "bf16") return step(phase, dir, steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_bench: %s\n", e.what());
    return 2;
  }
  std::fprintf(stderr, "hf_bench: unknown phase '%s'\n", phase.c_str());
  return 2;
}
