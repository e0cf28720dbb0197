// Model folders made to hurt the loader (issue 36): FIFOs and /dev/zero in every file slot (config.json,
// model.safetensors, the index, a shard: refused by name, never a hang), config.json too large or nested
// 10^6 levels deep (a clean error, never a crash), a number past double's range named with its key, values
// refused for what they mean (rope_theta and epsilons at or below 0), and weights holding NaN or Inf (an F64
// 1e300 too, Inf once an f32 master weight) refused by tensor name unless allowed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "core/io/safetensors.h"
#include "models/hf_models.h"
#include "models/hf_t5.h"
#include "tests/support/hostile_files.h"
#include "tests/hf/tiny_configs.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
namespace hf = samples::hf;
using nlohmann::json;

json gpt2_config() { return testing::tiny_gpt2_config(); }
json llama_config() { return testing::tiny_llama_config(); }

fs::path saved(const json& config, const std::string& name) {
  Generator gen(1);
  auto model = hf::make_model(config, gen);
  const fs::path dir = testing::process_scratch_dir("ampscope_hf_hostile") / name;
  fs::remove_all(dir);
  hf::save_model(*model, dir);
  return dir;
}

void write_text(const fs::path& p, const std::string& text) {
  fs::remove(p);
  std::ofstream(p, std::ios::binary) << text;
}

std::string load_refusal(const fs::path& dir, const std::vector<fs::path>& fifos = {}) {
  return testing::refusal_within<Error>([&] { (void)hf::load_model(dir); }, fifos);
}

TEST(hf_hostile_test, a_fifo_or_a_device_in_any_file_slot_is_refused_by_name_without_blocking) {
  const fs::path dir = saved(gpt2_config(), "slots");
  const fs::path config = dir / "config.json", weights = dir / "model.safetensors";
  const std::string config_text = [&] {
    std::ifstream in(config);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  fs::rename(config, dir / "config.saved");
  testing::make_fifo(config);
  std::string m = load_refusal(dir, {config});
  EXPECT_EQ(m, fmt::format("{}: not a regular file: it is a FIFO (named pipe)\nhint: config.json must be a regular file "
                           "(a FIFO or a device is never read)",
                           config.string()));
  EXPECT_NE(testing::refusal_within<Error>([&] { (void)hf::is_seq2seq_folder(dir); }, {config}).find("FIFO"),
            std::string::npos);
  testing::make_link(config, "/dev/zero");
  m = load_refusal(dir);
  EXPECT_NE(m.find("config.json: not a regular file: it is a character device"), std::string::npos) << m;
  fs::remove(config);
  fs::rename(dir / "config.saved", config);

  fs::rename(weights, dir / "weights.saved");
  testing::make_fifo(weights);
  m = load_refusal(dir, {weights});
  EXPECT_NE(m.find("model.safetensors': not a regular file: it is a FIFO (named pipe)"), std::string::npos) << m;
  testing::make_link(weights, "/dev/zero");
  m = load_refusal(dir);
  EXPECT_NE(m.find("model.safetensors': not a regular file: it is a character device"), std::string::npos) << m;
  fs::remove(weights);

  // The sharded form: the index, then a shard.
  const fs::path index = dir / "model.safetensors.index.json";
  testing::make_fifo(index);
  m = load_refusal(dir, {index});
  EXPECT_NE(m.find("model.safetensors.index.json': not a regular file: it is a FIFO"), std::string::npos) << m;
  fs::remove(index);
  fs::rename(dir / "weights.saved", dir / "shard-1.safetensors");
  json map = json::object();
  const auto shard = safetensors::File::open(dir / "shard-1.safetensors");
  for (const auto& t : shard.tensors()) map[t.name] = "shard-1.safetensors";
  write_text(index, json{{"weight_map", map}}.dump());
  EXPECT_NO_THROW((void)hf::load_model(dir));
  fs::rename(dir / "shard-1.safetensors", dir / "weights.saved");
  testing::make_fifo(dir / "shard-1.safetensors");
  m = load_refusal(dir, {dir / "shard-1.safetensors"});
  EXPECT_NE(m.find("shard-1.safetensors': not a regular file: it is a FIFO"), std::string::npos) << m;
  (void)config_text;
}

TEST(hf_hostile_test, a_config_too_large_is_refused_before_it_is_read) {
  const fs::path dir = saved(gpt2_config(), "large");
  const fs::path config = dir / "config.json";
  fs::resize_file(config, hf::detail::kMaxConfigBytes + 1);  // sparse: the original text, then zeros
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   config.string() + ": it is 16777217 bytes, more than the 16777216 this reader takes", "hint:");
}

TEST(hf_hostile_test, json_nested_a_million_levels_deep_in_config_json_is_a_clean_error) {
  const fs::path dir = saved(gpt2_config(), "deep");
  const fs::path config = dir / "config.json";
  write_text(config, testing::deep_json(1'000'000));
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   config.string() + ": arrays and objects nest deeper than 128 levels (byte offset 128, at '[0][0]",
                   "hint: restore the file");
  // A value: the first bracket after the prefix opens level 2, so level 129 opens 127 bytes later.
  const std::string prefix = "{\"model_type\": \"gpt2\", \"n_embd\": ";
  write_text(config, prefix + testing::deep_json(1'000'000));
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   fmt::format("nest deeper than 128 levels (byte offset {}, at 'n_embd[0][0]", prefix.size() + 127));
  write_text(config, "{\"task_specific_params\": " + testing::deep_json_objects(1'000'000));
  EXPECT_THROW_MSG(hf::is_seq2seq_folder(dir), hf::ModelError, "nest deeper than 128 levels", "at "
                   "'task_specific_params.a.a.a");
  // 120 levels is allowed; the value is shown as a 60-character excerpt, not printed whole.
  json c = gpt2_config();
  write_text(config, c.dump().substr(0, c.dump().size() - 1) + ", \"n_inner\": " + std::string(120, '[') +
                         std::string(120, ']') + "}");
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   "key 'n_inner' must be an integer, got " + std::string(57, '[') + "... (an array)");
}

TEST(hf_hostile_test, a_number_past_doubles_range_is_named_with_its_file_and_key) {
  const fs::path dir = saved(llama_config(), "overflow");
  const fs::path config = dir / "config.json";
  json c = llama_config();
  std::string text = c.dump();
  text.insert(text.size() - 1, ", \"rope_theta\": 1e999");
  write_text(config, text);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   config.string() + ": not valid JSON: [json.exception.out_of_range.406] number overflow parsing "
                                     "'1e999' at 'rope_theta'",
                   "hint:");
}

TEST(hf_hostile_test, values_are_checked_against_their_meaning_with_the_key_named) {
  const fs::path llama = saved(llama_config(), "meaning_llama");
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"rope_theta", 0}, {"rope_theta", -10000.0}, {"rms_norm_eps", 0.0}, {"rms_norm_eps", -1e-6}}) {
    json c = llama_config();
    c[key] = value;
    write_text(llama / "config.json", c.dump());
    EXPECT_THROW_MSG(hf::load_model(llama), hf::ModelError,
                     fmt::format("key '{}' must be a positive number, got {}", key, value.dump()), "hint:");
  }
  const fs::path gpt2 = saved(gpt2_config(), "meaning_gpt2");
  json c = gpt2_config();
  c["layer_norm_epsilon"] = -1e-5;
  write_text(gpt2 / "config.json", c.dump());
  EXPECT_THROW_MSG(hf::load_model(gpt2), hf::ModelError, "key 'layer_norm_epsilon' must be a positive number, got -1e-05",
                   "(the default is 1e-05)");
  c = gpt2_config();
  c["n_head"] = 3;  // 32 is not a multiple of 3
  write_text(gpt2 / "config.json", c.dump());
  EXPECT_THROW_MSG(hf::load_model(gpt2), hf::ModelError, "key 'n_head' (3) must divide n_embd (32)");
  // Positive values load.
  c = llama_config();
  c["rope_theta"] = 1e-3;
  c["rms_norm_eps"] = 1e-30;
  write_text(llama / "config.json", c.dump());
  EXPECT_NO_THROW((void)hf::load_model(llama));
}

// The folder's weights with `name` replaced by `values` stored as `dtype`.
void replace_weight(const fs::path& dir, const std::string& name, const std::vector<double>& values, DType dtype) {
  auto tensors = safetensors::load_folder(dir);
  const Shape shape = tensors.at(name).shape();
  std::vector<double> full(static_cast<std::size_t>(tensors.at(name).numel()), 0.25);
  std::copy(values.begin(), values.end(), full.begin());
  tensors[name] = from_values(full, shape, {dtype});
  safetensors::save(dir / "model.safetensors", {tensors.begin(), tensors.end()}, {{"format", "pt"}});
}

TEST(hf_hostile_test, weights_holding_nan_or_inf_are_refused_by_name_unless_allowed) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const fs::path dir = saved(gpt2_config(), "nonfinite");
  const std::string file = (dir / "model.safetensors").string();
  // h.0.attn.c_attn.weight is [32, 96]: 3072 values; NaN at flat 5 and 6, -Inf at 9.
  replace_weight(dir, "h.0.attn.c_attn.weight", {0, 0, 0, 0, 0, nan, nan, 0, 0, -inf}, DType::f32);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError,
                   fmt::format("{}: 1 weight of the checkpoint holds NaN or Inf:\ntensor 'h.0.attn.c_attn.weight' ('{}') "
                               "holds 2 NaN and 1 Inf of its 3072 values (the first at flat index 5)\nhint: the weights "
                               "are damaged",
                               dir.string(), file),
                   "hf::LoadOptions::allow_nonfinite; ampscope train --model-allow-nonfinite");
  // Allowed: loaded, the values kept, each tensor listed.
  const hf::LoadedModel loaded = hf::load_model(dir, {.allow_nonfinite = true});
  ASSERT_EQ(loaded.report.nonfinite.size(), 1u);
  EXPECT_EQ(loaded.report.nonfinite[0], fmt::format("tensor 'h.0.attn.c_attn.weight' ('{}') holds 2 NaN and 1 Inf of "
                                                    "its 3072 values (the first at flat index 5)",
                                                    file));
  for (const auto& [name, p] : loaded.model->named_parameters()) {
    if (name == "h.0.attn.c_attn.weight") {
      EXPECT_TRUE(std::isnan(p.values()[5]));
    }
  }

  // F64 weights of 1e300 are finite in the file and Inf as f32 master weights; a second tensor too.
  replace_weight(dir, "h.0.attn.c_attn.weight", {0.5}, DType::f32);
  replace_weight(dir, "wpe.weight", {0.5, 1e300, -1e300}, DType::f64);
  replace_weight(dir, "ln_f.bias", {0, 0, nan}, DType::bf16);
  EXPECT_THROW_MSG(hf::load_model(dir), hf::ModelError, "2 weights of the checkpoint hold NaN or Inf:",
                   fmt::format("tensor 'ln_f.bias' ('{}') holds 1 NaN and 0 Inf of its 32 values (the first at flat "
                               "index 2)",
                               file),
                   fmt::format("tensor 'wpe.weight' ('{}') holds 0 NaN and 2 Inf of its 512 values (the first at flat "
                               "index 1); 2 of them are finite F64 values in the file, beyond the range of the dtype "
                               "they were loaded as",
                               file));
}

TEST(hf_hostile_test, tensors_the_model_does_not_take_are_not_checked) {
  const fs::path dir = saved(gpt2_config(), "unused_nan");
  auto tensors = safetensors::load_folder(dir);
  tensors["h.0.attn.masked_bias"] = from_values({std::nan("")}, {}, {DType::f32});  // ignored buffer
  tensors["extra.weight"] = from_values({std::nan(""), 1}, {2}, {DType::f32});      // unexpected
  safetensors::save(dir / "model.safetensors", {tensors.begin(), tensors.end()}, {{"format", "pt"}});
  const hf::LoadedModel loaded = hf::load_model(dir);
  EXPECT_TRUE(loaded.report.nonfinite.empty());
  EXPECT_EQ(loaded.report.unexpected, std::vector<std::string>{"extra.weight"});
}

TEST(hf_hostile_test, t5_weights_holding_nan_are_refused_by_name) {
  const json config = {{"model_type", "t5"}, {"vocab_size", 32}, {"d_model", 16}, {"d_kv", 4},     {"d_ff", 24},
                       {"num_layers", 1},    {"num_heads", 2},   {"relative_attention_num_buckets", 8}};
  Generator gen(2);
  auto model = hf::make_seq2seq(config, gen);
  const fs::path dir = testing::process_scratch_dir("ampscope_hf_hostile") / "t5_nan";
  fs::remove_all(dir);
  hf::save_seq2seq(*model, dir);
  replace_weight(dir, "encoder.final_layer_norm.weight", {1, std::nan("")}, DType::f32);
  EXPECT_THROW_MSG(hf::load_seq2seq(dir), hf::ModelError, "1 weight of the checkpoint holds NaN or Inf:",
                   "tensor 'encoder.final_layer_norm.weight'", "(the first at flat index 1)");
  EXPECT_EQ(hf::load_seq2seq(dir, {.allow_nonfinite = true}).report.nonfinite.size(), 1u);
}

TEST(hf_hostile_test, save_model_never_writes_through_a_link_at_its_names) {
  const fs::path dir = saved(gpt2_config(), "links");
  const fs::path victim = dir.parent_path() / "victim.txt";
  write_text(victim, "keep me");
  const auto victim_text = [&] {
    std::ifstream in(victim);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const hf::LoadedModel loaded = hf::load_model(dir);
  // A link at either name the folder is written under: refused before either file is written, naming it; the
  // link stays a link and what it points at keeps its bytes.
  for (const auto& [name, what] : {std::pair{"config.json", "the model's config.json"},
                                   std::pair{"model.safetensors", "the safetensors file"}}) {
    const fs::path moved = dir / (std::string(name) + ".real");
    fs::rename(dir / name, moved);
    testing::make_link(dir / name, victim);
    const std::string other = std::string(name) == "config.json" ? "model.safetensors" : "config.json";
    const auto other_before = fs::last_write_time(dir / other);
    EXPECT_THROW_MSG(hf::save_model(*loaded.model, dir), Error,
                     fmt::format("{} '{}' is a symbolic link (to '{}'); ampscope never writes through a link", what,
                                 (dir / name).string(), victim.string()));
    EXPECT_EQ(victim_text(), "keep me") << name;
    EXPECT_TRUE(fs::is_symlink(dir / name)) << name;
    EXPECT_EQ(fs::last_write_time(dir / other), other_before) << other << " was written before the refusal";
    fs::remove(dir / name);
    fs::rename(moved, dir / name);
  }
  // Links at the temporary names the writers used before they took fresh ones (core/io/output_file.h): never
  // opened, so the save succeeds and what they point at keeps its bytes.
  for (const char* tmp : {"config.json.tmp", "model.safetensors.tmp"}) testing::make_link(dir / tmp, victim);
  EXPECT_NO_THROW(hf::save_model(*loaded.model, dir));
  EXPECT_EQ(victim_text(), "keep me");
  EXPECT_NO_THROW((void)hf::load_model(dir));
}

}  // namespace
}  // namespace ampscope
