// Loading and saving Hugging Face folders: config errors, missing, unexpected and wrong-shaped weights, the
// layouts HF accepts, f16/bf16 stored weights, shards, round trips, and the module paths a trace shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "core/ops.h"
#include "core/io/safetensors.h"
#include "models/hf_models.h"
#include "tests/hf/tiny_configs.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
namespace hf = samples::hf;
using nlohmann::json;

json gpt2_config() { return testing::tiny_gpt2_config(); }
json llama_config() { return testing::tiny_llama_config(); }

fs::path scratch(const std::string& name) {
  const fs::path dir = testing::process_scratch_dir("ampscope_hf_models") / name;
  fs::remove_all(dir);
  return dir;
}

fs::path saved(const json& config, const std::string& name, std::uint64_t seed = 1) {
  Generator gen(seed);
  auto model = hf::make_model(config, gen);
  const fs::path dir = scratch(name);
  hf::save_model(*model, dir);
  return dir;
}

void write_config(const fs::path& dir, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
}

std::map<std::string, Tensor> stored(const fs::path& dir) { return safetensors::load_folder(dir); }

void write_tensors(const fs::path& dir, const std::map<std::string, Tensor>& tensors) {
  safetensors::save(dir / "model.safetensors", {tensors.begin(), tensors.end()}, {{"format", "pt"}});
}

std::map<std::string, std::vector<double>> param_values(hf::CausalLM& m) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, p] : m.named_parameters()) out[name] = p.values();
  return out;
}

TEST(hf_models_test, module_paths_and_parameter_names_are_the_checkpoints) {
  Generator gen(0);
  auto gpt2 = hf::make_model(gpt2_config(), gen);
  std::vector<std::string> modules;
  for (const auto& [name, m] : gpt2->named_modules()) modules.push_back(name);
  for (const char* path : {"wte", "wpe", "h.1.ln_1", "h.1.attn.c_attn", "h.1.attn.c_proj", "h.1.mlp.c_fc",
                           "h.1.mlp.c_proj", "ln_f", "lm_head"}) {
    EXPECT_NE(std::find(modules.begin(), modules.end(), path), modules.end()) << path;
  }
  const auto params = gpt2->named_parameters();
  EXPECT_EQ(params.front().first, "wte.weight");
  EXPECT_EQ(params.back().first, "ln_f.bias");  // tied head: no lm_head.weight of its own
  EXPECT_EQ(params.size(), 2u + 2u * 12u + 2u);
  EXPECT_EQ(gpt2->model_type(), "gpt2");
  EXPECT_EQ(gpt2->max_positions(), 16);

  auto llama = hf::make_model(llama_config(), gen);
  modules.clear();
  for (const auto& [name, m] : llama->named_modules()) modules.push_back(name);
  for (const char* path : {"model.embed_tokens", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                           "model.layers.1.mlp.gate_proj", "model.layers.1.input_layernorm",
                           "model.layers.1.post_attention_layernorm", "model.norm", "lm_head"}) {
    EXPECT_NE(std::find(modules.begin(), modules.end(), path), modules.end()) << path;
  }
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : llama->named_parameters()) shapes[name] = p.shape();
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (Shape{16, 32}));  // 2 kv heads of 8
  EXPECT_EQ(shapes.at("lm_head.weight"), (Shape{64, 32}));
  EXPECT_EQ(shapes.count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

TEST(hf_models_test, init_follows_hf_init_weights) {
  json c = gpt2_config();
  c["initializer_range"] = 0.5;
  Generator gen(3);
  auto m = hf::make_model(c, gen);
  const auto v = param_values(*m);
  EXPECT_EQ(v.at("h.0.ln_1.weight"), std::vector<double>(32, 1.0));
  EXPECT_EQ(v.at("h.0.attn.c_attn.bias"), std::vector<double>(96, 0.0));
  const auto stddev = [](const std::vector<double>& x) {
    double s = 0;
    for (double e : x) s += e * e;
    return std::sqrt(s / static_cast<double>(x.size()));
  };
  EXPECT_NEAR(stddev(v.at("wte.weight")), 0.5, 0.05);
  EXPECT_NEAR(stddev(v.at("h.0.mlp.c_fc.weight")), 0.5, 0.05);
  EXPECT_NEAR(stddev(v.at("h.0.mlp.c_proj.weight")), 0.5 / 2.0, 0.03);  // / sqrt(2 * n_layer)
  json l = llama_config();
  l["pad_token_id"] = 3;
  auto llama = hf::make_model(l, gen);
  const Tensor emb = llama->named_parameters().front().second;
  EXPECT_EQ(emb.slice(0, 3, 4).values(), std::vector<double>(32, 0.0));  // the padding row
}

TEST(hf_models_test, save_then_load_round_trips_bit_for_bit) {
  for (const json& c : {gpt2_config(), llama_config()}) {
    Generator gen(5);
    auto model = hf::make_model(c, gen);
    const fs::path dir = scratch("round_trip_" + c["model_type"].get<std::string>());
    hf::save_model(*model, dir);
    auto loaded = hf::load_model(dir);
    EXPECT_TRUE(loaded.report.missing.empty());
    EXPECT_TRUE(loaded.report.unexpected.empty());
    EXPECT_EQ(param_values(*loaded.model), param_values(*model));
    EXPECT_EQ(loaded.model->config(), c);
    EXPECT_EQ(json::parse(std::ifstream(dir / "config.json")), c);
  }
  // The files hold what HF writes: GPT2Model's names, the tied head once; LlamaForCausalLM's names.
  const auto g = stored(saved(gpt2_config(), "names_gpt2"));
  EXPECT_EQ(g.count("wte.weight"), 1u);
  EXPECT_EQ(g.count("lm_head.weight"), 0u);
  EXPECT_EQ(g.at("h.0.attn.c_attn.weight").shape(), (Shape{32, 96}));  // Conv1D: [in, out]
  const auto l = stored(saved(llama_config(), "names_llama"));
  EXPECT_EQ(l.count("model.layers.1.self_attn.o_proj.weight"), 1u);
  EXPECT_EQ(l.count("lm_head.weight"), 1u);
}

TEST(hf_models_test, f16_and_bf16_checkpoints_load_into_f32_exactly) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const fs::path dir = saved(gpt2_config(), "half_" + std::string(dtype_name(dtype)));
    std::map<std::string, Tensor> half;
    for (auto& [name, t] : stored(dir)) half[name] = t.to(dtype);
    write_tensors(dir, half);
    auto loaded = hf::load_model(dir);
    for (const auto& [name, p] : loaded.model->named_parameters()) {
      EXPECT_EQ(p.dtype(), DType::f32) << name;
      EXPECT_EQ(p.values(), half.at(name).values()) << name;  // values() widens exactly
    }
  }
}

TEST(hf_models_test, a_sharded_folder_loads) {
  const fs::path dir = saved(llama_config(), "sharded");
  const auto all = stored(dir);
  fs::remove(dir / "model.safetensors");
  std::vector<std::pair<std::string, Tensor>> a, b;
  json map;
  for (const auto& [name, t] : all) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b).emplace_back(name, t);
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  safetensors::save(dir / "model-00001-of-00002.safetensors", a);
  safetensors::save(dir / "model-00002-of-00002.safetensors", b);
  std::ofstream(dir / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", map}}.dump();
  auto loaded = hf::load_model(dir);
  for (const auto& [name, p] : loaded.model->named_parameters()) EXPECT_EQ(p.values(), all.at(name).values()) << name;
  // Saving into that folder would be shadowed by the index: refused.
  EXPECT_THROW_MSG(hf::save_model(*loaded.model, dir), hf::ModelError, "model.safetensors.index.json", "new folder");
}

TEST(hf_models_test, missing_weights_are_all_listed_and_refused) {
  const fs::path dir = saved(gpt2_config(), "missing");
  auto t = stored(dir);
  t.erase("h.1.mlp.c_fc.weight");
  t.erase("ln_f.bias");
  write_tensors(dir, t);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, dir.string(), "2 missing weights", "h.1.mlp.c_fc.weight",
                   "ln_f.bias", "hint:");
  // An untied Llama without its head.
  const fs::path ldir = saved(llama_config(), "missing_head");
  auto l = stored(ldir);
  l.erase("lm_head.weight");
  write_tensors(ldir, l);
  EXPECT_THROW_MSG(hf::load_model(ldir), hf::ModelError, "1 missing weight: lm_head.weight", "tie_word_embeddings");
}

TEST(hf_models_test, wrong_shapes_name_the_tensor_and_both_shapes) {
  const fs::path dir = saved(gpt2_config(), "wrong_shape");
  auto t = stored(dir);
  t["h.0.attn.c_attn.weight"] = t.at("h.0.attn.c_attn.weight").transpose(0, 1).contiguous();  // nn.Linear's layout
  write_tensors(dir, t);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "wrong shape: h.0.attn.c_attn.weight", "the checkpoint has [96, 32]",
                   "the config needs [32, 96]");
}

TEST(hf_models_test, unexpected_tensors_and_known_buffers_are_reported) {
  const fs::path dir = saved(gpt2_config(), "unexpected");
  auto t = stored(dir);
  t["h.0.attn.bias"] = full({1, 1, 16, 16}, 1.0);
  t["h.0.attn.masked_bias"] = full({}, -1e4);
  t["score.weight"] = zeros({2, 32});
  t["lm_head.weight"] = t.at("wte.weight");  // a tied head saved anyway: equal, so redundant
  write_tensors(dir, t);
  const auto loaded = hf::load_model(dir);
  EXPECT_EQ(loaded.report.unexpected, (std::vector<std::string>{"score.weight"}));
  EXPECT_EQ(loaded.report.ignored, (std::vector<std::string>{"h.0.attn.bias", "h.0.attn.masked_bias", "lm_head.weight"}));
  EXPECT_TRUE(loaded.report.missing.empty());
  // A tied head that differs from the embedding would be silently replaced by HF's tying: refused.
  t["lm_head.weight"] = zeros({64, 32});
  write_tensors(dir, t);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "'lm_head.weight' differs from 'wte.weight'",
                   "\"tie_word_embeddings\": false");
}

TEST(hf_models_test, both_hf_layouts_load_and_save_back_in_theirs) {
  // GPT2LMHeadModel.save_pretrained writes "transformer." names.
  const fs::path dir = saved(gpt2_config(), "prefixed_gpt2");
  const auto plain = stored(dir);
  std::map<std::string, Tensor> prefixed;
  for (const auto& [name, t] : plain) prefixed["transformer." + name] = t;
  write_tensors(dir, prefixed);
  auto loaded = hf::load_model(dir);
  EXPECT_EQ(loaded.model->checkpoint_prefix(), "transformer.");
  for (const auto& [name, p] : loaded.model->named_parameters()) EXPECT_EQ(p.values(), plain.at(name).values()) << name;
  const fs::path out = scratch("prefixed_gpt2_out");
  hf::save_model(*loaded.model, out);
  EXPECT_EQ(stored(out).count("transformer.h.1.mlp.c_fc.weight"), 1u);
  // LlamaModel's names lack "model.".
  json tied = llama_config();
  tied["tie_word_embeddings"] = true;
  const fs::path ldir = saved(tied, "bare_llama");
  std::map<std::string, Tensor> bare;
  for (const auto& [name, t] : stored(ldir)) bare[name.substr(6)] = t;
  write_tensors(ldir, bare);
  auto l = hf::load_model(ldir);
  EXPECT_EQ(l.model->checkpoint_prefix(), "");
  EXPECT_TRUE(l.report.unexpected.empty());
  EXPECT_EQ(l.model->named_parameters().front().first, "model.embed_tokens.weight");
}

TEST(hf_models_test, bad_configs_are_refused_with_the_key) {
  const fs::path dir = saved(gpt2_config(), "bad_config");
  write_config(dir, "{\"model_type\": \"gpt2\",");
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, (dir / "config.json").string(), "not valid JSON");
  write_config(dir, "[1, 2]");
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "must be a JSON object, got an array");
  json c = gpt2_config();
  c.erase("n_embd");
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "key 'n_embd' is missing", "hint:");
  c = gpt2_config();
  c["n_head"] = "4";
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "key 'n_head' must be an integer, got \"4\" (a string)");
  c = gpt2_config();
  c["layer_norm_epsilon"] = true;
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "key 'layer_norm_epsilon' must be a number");
  c = gpt2_config();
  c["n_head"] = 5;
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "key 'n_head' (5) must divide n_embd (32)");
  c = gpt2_config();
  c["model_type"] = "bert";
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "model_type 'bert' is not supported",
                   "supported: gpt2, llama, mistral");
  c.erase("model_type");
  write_config(dir, c.dump());
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "key 'model_type' is missing");
  fs::remove(dir / "config.json");
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "cannot open config.json");
}

TEST(hf_models_test, unimplemented_settings_are_refused_by_name) {
  Generator gen(0);
  const auto refuses = [&](json c, const std::string& key, const json& value, const std::string& piece) {
    c[key] = value;
    EXPECT_THROW_MSG(hf::make_model(c, gen), hf::ModelError, "key '" + key + "'", piece);
  };
  refuses(gpt2_config(), "activation_function", "quick_gelu", "'quick_gelu'");
  refuses(gpt2_config(), "scale_attn_by_inverse_layer_idx", true, "does not implement");
  refuses(gpt2_config(), "reorder_and_upcast_attn", true, "does not implement");
  refuses(gpt2_config(), "add_cross_attention", true, "not a causal language model");
  refuses(llama_config(), "hidden_act", "gelu", "'gelu'");
  refuses(llama_config(), "rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}, "'yarn' RoPE scaling");
  refuses(llama_config(), "num_key_value_heads", 3, "must divide num_attention_heads");
  refuses(llama_config(), "pad_token_id", 64, "below vocab_size");
}

TEST(hf_models_test, forward_checks_its_tokens) {
  Generator gen(0);
  auto m = hf::make_model(gpt2_config(), gen);
  EXPECT_THROW_MSG((*m)(zeros({1, 4})), ShapeError, "i64 token ids of shape [B, T]");
  EXPECT_THROW_MSG((*m)(zeros({1, 17}, {DType::i64})), ShapeError, "17 tokens per sequence", "16 positions");
  EXPECT_EQ((*m)(zeros({2, 16}, {DType::i64})).shape(), (Shape{2, 16, 64}));
}


// On a GPU the same models give the CPU's logits (cuBLAS and OpenBLAS sum in different orders: a few f32
// roundings apart). Skipped without a CUDA device.
TEST(hf_models_test, models_run_on_cuda_as_on_the_cpu) {
  SKIP_WITHOUT_GPU();
  json mistral = llama_config();
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 3;
  for (const json& c : {gpt2_config(), llama_config(), mistral}) {
    Generator gen(2);
    auto m = hf::make_model(c, gen);
    Tensor tokens = zeros({2, 8}, {DType::i64});
    for (std::int64_t i = 0; i < 16; ++i) tokens.set({i / 8, i % 8}, static_cast<double>((i * 7 + 3) % 64));
    const std::vector<double> cpu = (*m)(tokens).values();
    m->to(Device::cuda());
    const std::vector<double> gpu = (*m)(tokens.to(Device::cuda())).values();
    ASSERT_EQ(cpu.size(), gpu.size());
    for (std::size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_NEAR(gpu[i], cpu[i], 1e-5 * std::max(1.0, std::fabs(cpu[i]))) << c["model_type"] << " [" << i << "]";
    }
  }
}

}  // namespace
}  // namespace ampscope
