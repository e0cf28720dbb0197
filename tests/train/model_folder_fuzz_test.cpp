// Fuzzing whole model folders, as `ampscope train --model` reads them: seeded mutants of a valid tiny GPT-2
// and a tiny T5 folder — config.json with flipped, deleted or inserted bytes and with its numbers replaced
// by edge values (0, -1, huge, fractions, strings), model.safetensors with flipped or truncated bytes — each
// either loads (then a forward pass on in-vocabulary ids runs and gives logits of the expected shape) or
// throws ampscope::Error (ModelError, safetensors::FormatError) naming a problem. Never a crash, and never
// an allocation the files do not justify: a config claiming a model far larger than its weights is refused
// with the missing or wrong-shaped weights, not by running out of memory. The mutants made to hurt (issue
// 36) must be refused with the message that names what they are: a config value nested 130 to 10^6 levels
// deep, a number past double's range (1e999, named with its key), a weight holding NaN or Inf (or an F64
// 1e300, Inf once loaded; named by tensor), and a FIFO or a /dev/zero link as config.json or
// model.safetensors (named, never a hang). AMPSCOPE_FUZZ_CASES sets the number of mutants per folder
// (default 150), AMPSCOPE_FUZZ_SEED the first seed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/random.h"
#include "models/hf_models.h"
#include "models/hf_t5.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/support/fuzz.h"
#include "tests/support/hostile_files.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// What a mutant made to hurt must be refused with: a piece of the message, and the FIFO to open for writing
// should the load block on it.
struct Expected {
  std::string piece;
  fs::path fifo;
};

// One mutant of the folder's two files, from their valid bytes.
Expected mutate(std::mt19937_64& rng, const std::string& config, const std::string& weights, const fs::path& dir) {
  std::string c = config, w = weights;
  Expected expected;
  auto pick = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % std::max<std::uint64_t>(n, 1)); };
  // Whatever the last mutant left there (a FIFO would block the writes below, a link redirect them).
  fs::remove(dir / "config.json");
  fs::remove(dir / "model.safetensors");
  switch (rng() % 10) {
    case 0: {  // a number of config.json replaced by an edge value
      nlohmann::json j = nlohmann::json::parse(config);
      std::vector<std::string> keys;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_number()) keys.push_back(it.key());
      static const nlohmann::json values[] = {0, -1, 1, 3, 1000000, 4611686018427387904LL, 0.5, -0.0, 1e308, "12", nullptr, true};
      if (!keys.empty()) j[keys[pick(keys.size())]] = values[pick(std::size(values))];
      c = j.dump();
      break;
    }
    case 1:  // bytes of config.json flipped
      for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n && !c.empty(); ++i) c[pick(c.size())] ^= static_cast<char>(1 + rng() % 255);
      break;
    case 2:  // config.json cut or with a deleted or inserted byte
      if (rng() % 2 == 0) c.resize(pick(c.size()));
      else if (!c.empty()) c.erase(pick(c.size()), 1);
      else c.insert(c.begin(), static_cast<char>(rng()));
      break;
    case 3:  // a model_type or an activation replaced
    {
      nlohmann::json j = nlohmann::json::parse(config);
      static const char* types[] = {"gpt2", "llama", "t5", "bert", "", "GPT2"};
      j["model_type"] = types[pick(std::size(types))];
      c = j.dump();
      break;
    }
    case 4:  // bytes of the safetensors file flipped (header or data)
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
        const std::size_t at = rng() % 2 == 0 ? pick(std::min<std::size_t>(w.size(), 600)) : pick(w.size());
        w[at] ^= static_cast<char>(1 + rng() % 255);
      }
      break;
    case 5:  // the safetensors file truncated
      w.resize(pick(w.size()));
      break;
    case 6: {  // a value of config.json nested 130 to 10^6 levels deep, closed or not
      nlohmann::json j = nlohmann::json::parse(config);
      std::vector<std::string> keys;
      for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
      j[keys[pick(keys.size())]] = "@DEEP@";
      static const std::size_t depths[] = {130, 1000, 100'000, 1'000'000};
      const std::size_t depth = depths[pick(std::size(depths))];
      const std::string deep = rng() % 2 == 0 ? testing::deep_json(depth)
                                               : testing::deep_json(depth) + std::string(depth, ']');
      c = j.dump();
      c.replace(c.find("\"@DEEP@\""), 8, deep);
      expected.piece = "arrays and objects nest deeper than 128 levels";
      break;
    }
    case 7: {  // a number past double's range
      nlohmann::json j = nlohmann::json::parse(config);
      std::vector<std::string> keys;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_number()) keys.push_back(it.key());
      const std::string key = keys[pick(keys.size())];
      j[key] = "@BIG@";
      c = j.dump();
      const std::string big = rng() % 2 == 0 ? "1e999" : "-2.5e400";
      c.replace(c.find("\"@BIG@\""), 7, big);
      expected.piece = fmt::format("number overflow parsing '{}' at '{}'", big, key);
      break;
    }
    case 8: {  // a weight holding NaN or Inf, or an F64 1e300 (Inf once an f32 master weight)
      const fs::path valid = dir / "valid.safetensors";
      write(valid, weights);
      std::map<std::string, Tensor> tensors;
      {
        const auto file = safetensors::File::open(valid);
        for (const auto& t : file.tensors()) tensors[t.name] = file.load(t.name);
      }
      auto it = tensors.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(tensors.size())));
      std::vector<double> values = it->second.values();
      static const double bad[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(), 1e300};
      const double v = bad[pick(std::size(bad))];
      values[pick(values.size())] = v;
      it->second = from_values(values, it->second.shape(), {v == 1e300 ? DType::f64 : it->second.dtype()});
      safetensors::save(dir / "model.safetensors", {tensors.begin(), tensors.end()}, {{"format", "pt"}});
      write(dir / "config.json", c);
      expected.piece = fmt::format("tensor '{}'", it->first);
      return expected;
    }
    default: {  // a FIFO or a /dev/zero link as one of the two files
      const fs::path slot = dir / (rng() % 2 == 0 ? "config.json" : "model.safetensors");
      write(dir / "config.json", c);
      write(dir / "model.safetensors", w);
      if (rng() % 2 == 0) {
        expected.fifo = testing::make_fifo(slot);
        expected.piece = "not a regular file: it is a FIFO (named pipe)";
      } else {
        testing::make_link(slot, "/dev/zero");
        expected.piece = "not a regular file: it is a character device";
      }
      return expected;
    }
  }
  write(dir / "config.json", c);
  write(dir / "model.safetensors", w);
  return expected;
}

template <class Load>
void fuzz(const fs::path& valid, const std::string& name, Load&& load_and_run) {
  const std::string config = read(valid / "config.json"), weights = read(valid / "model.safetensors");
  const fs::path dir = valid.parent_path() / (name + "_mutant");
  fs::create_directories(dir);
  Expected expected;
  std::string label;
  const testing::FuzzTally tally = testing::run_mutants<Error>(
      "ampscope::Error", 150,
      [&](std::mt19937_64& rng, std::uint64_t seed, std::string& what) {
        expected = mutate(rng, config, weights, dir);
        what = label = name + " mutant " + std::to_string(seed);
        SCOPED_TRACE(what);
        if (expected.fifo.empty()) {
          load_and_run(dir);
          return;
        }
        // A FIFO: loaded on another thread, so that a load that blocks fails the test instead of hanging it.
        const std::string message = testing::refusal_within<Error>([&] { load_and_run(dir); }, {expected.fifo});
        throw Error(message);
      },
      [&](const Error& e) {
        const std::string message = e.what();
        EXPECT_GT(message.size(), 20u);
        if (!expected.piece.empty()) {
          EXPECT_NE(message.find(expected.piece), std::string::npos) << label << ": " << message.substr(0, 2000);
          EXPECT_LT(message.size(), 2000u) << label << ": a message that prints a value whole";
        }
      });
  const std::uint64_t cases = tally.cases, loaded = tally.loaded, refused = tally.refused;
  std::printf("%s folder fuzz: %llu mutants, %llu loaded and ran, %llu refused\n", name.c_str(),
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(loaded),
              static_cast<unsigned long long>(refused));
  EXPECT_EQ(loaded + refused, cases);
  EXPECT_GT(refused, 0u);
  EXPECT_GT(loaded, 0u);  // some mutants (an epsilon, a flipped data byte) still load and run
}

TEST(model_folder_fuzz_test, gpt2_folders_either_load_and_run_or_are_refused_with_an_error) {
  const fs::path root = testing::process_scratch_dir("ampscope_model_fuzz");
  Generator gen(1);
  nlohmann::json config = {{"model_type", "gpt2"}, {"vocab_size", 40}, {"n_positions", 16}, {"n_embd", 16},
                           {"n_layer", 2}, {"n_head", 2}, {"layer_norm_epsilon", 1e-5},
                           {"activation_function", "gelu_new"}, {"initializer_range", 0.02}};
  auto model = hf::make_model(config, gen);
  hf::save_model(*model, root / "gpt2");
  fuzz(root / "gpt2", "gpt2", [](const fs::path& dir) {
    hf::LoadedModel m = hf::load_model(dir);
    NoGradGuard no_grad;
    const std::int64_t vocab = m.model->vocab_size(), t = std::min<std::int64_t>(4, m.model->max_positions());
    std::vector<double> ids(static_cast<std::size_t>(t));
    for (std::int64_t i = 0; i < t; ++i) ids[i] = static_cast<double>(i % vocab);
    const Tensor logits = (*m.model)(from_values(ids, {1, t}, {DType::i64}));
    EXPECT_EQ(logits.shape(), (Shape{1, t, vocab}));
  });
}

// The fuzz's first hang, kept as a case of its own: a config.json whose layer count is a million beside two
// layers of weights is refused at once, by the checkpoint's tensor count, not built (a million blocks of
// modules) and not allocated (the shapes of a dry run hold one element each).
TEST(model_folder_fuzz_test, a_config_far_larger_than_its_weights_is_refused_without_building_it) {
  const fs::path root = testing::process_scratch_dir("ampscope_model_fuzz");
  Generator gen(1);
  nlohmann::json config = {{"model_type", "gpt2"}, {"vocab_size", 40}, {"n_positions", 16}, {"n_embd", 16},
                           {"n_layer", 2}, {"n_head", 2}, {"layer_norm_epsilon", 1e-5},
                           {"activation_function", "gelu_new"}, {"initializer_range", 0.02}};
  hf::save_model(*hf::make_model(config, gen), root / "huge");
  config["n_layer"] = 1000000;
  config["n_embd"] = 1 << 20;  // and 2^20-wide: a real allocation would be terabytes
  write(root / "huge" / "config.json", config.dump());
  EXPECT_THROW_MSG(hf::load_model(root / "huge"), hf::ModelError, "far more weights than the checkpoint");
}

TEST(model_folder_fuzz_test, t5_folders_either_load_and_run_or_are_refused_with_an_error) {
  const fs::path root = testing::process_scratch_dir("ampscope_model_fuzz");
  Generator gen(2);
  auto model = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  hf::save_seq2seq(*model, root / "t5");
  fuzz(root / "t5", "t5", [](const fs::path& dir) {
    hf::LoadedSeq2Seq m = hf::load_seq2seq(dir);
    NoGradGuard no_grad;
    const std::int64_t vocab = m.model->vocab_size();
    std::vector<double> v = {1, 2, 3, 0};
    for (double& x : v) x = static_cast<double>(static_cast<std::int64_t>(x) % vocab);
    const Tensor ids = from_values(v, {1, 4}, {DType::i64});
    const Tensor logits = m.model->forward2(ids, ids);
    EXPECT_EQ(logits.size(-1), vocab);
  });
}

}  // namespace
}  // namespace ampscope::samples
