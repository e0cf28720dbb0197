// Loading and saving T5 folders: the parameter names and module paths are HF's, the tied embedding may be
// stored under any of its names (copies must agree), missing and misshapen weights are refused with every name,
// unknown tensors are reported, and load_model sends T5 folders to load_seq2seq.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/io/safetensors.h"
#include "models/hf_t5.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
namespace hf = samples::hf;
using nlohmann::json;

json one_block(json c) {
  c["num_layers"] = 1;
  c["num_decoder_layers"] = 1;
  return c;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const hf::ModelError& e) {
    return e.what();
  }
  return "(no ModelError)";
}

TEST(t5_loading_test, parameter_names_are_hfs_state_dict_names_in_its_order) {
  Generator gen(1);
  auto model = hf::make_seq2seq(one_block(t5_test::v1_0_config()), gen);
  std::vector<std::string> names;
  for (const auto& [n, p] : model->named_parameters()) names.push_back(n);
  // T5ForConditionalGeneration(config).state_dict() without the tied encoder/decoder.embed_tokens copies.
  const std::vector<std::string> expected = {
      "shared.weight",
      "encoder.block.0.layer.0.SelfAttention.q.weight",
      "encoder.block.0.layer.0.SelfAttention.k.weight",
      "encoder.block.0.layer.0.SelfAttention.v.weight",
      "encoder.block.0.layer.0.SelfAttention.o.weight",
      "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      "encoder.block.0.layer.0.layer_norm.weight",
      "encoder.block.0.layer.1.DenseReluDense.wi.weight",
      "encoder.block.0.layer.1.DenseReluDense.wo.weight",
      "encoder.block.0.layer.1.layer_norm.weight",
      "encoder.final_layer_norm.weight",
      "decoder.block.0.layer.0.SelfAttention.q.weight",
      "decoder.block.0.layer.0.SelfAttention.k.weight",
      "decoder.block.0.layer.0.SelfAttention.v.weight",
      "decoder.block.0.layer.0.SelfAttention.o.weight",
      "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      "decoder.block.0.layer.0.layer_norm.weight",
      "decoder.block.0.layer.1.EncDecAttention.q.weight",
      "decoder.block.0.layer.1.EncDecAttention.k.weight",
      "decoder.block.0.layer.1.EncDecAttention.v.weight",
      "decoder.block.0.layer.1.EncDecAttention.o.weight",
      "decoder.block.0.layer.1.layer_norm.weight",
      "decoder.block.0.layer.2.DenseReluDense.wi.weight",
      "decoder.block.0.layer.2.DenseReluDense.wo.weight",
      "decoder.block.0.layer.2.layer_norm.weight",
      "decoder.final_layer_norm.weight",
  };
  EXPECT_EQ(names, expected);

  auto gated = hf::make_seq2seq(one_block(t5_test::v1_1_config()), gen);
  std::set<std::string> g;
  for (const auto& [n, p] : gated->named_parameters()) g.insert(n);
  EXPECT_TRUE(g.count("encoder.block.0.layer.1.DenseReluDense.wi_0.weight"));
  EXPECT_TRUE(g.count("encoder.block.0.layer.1.DenseReluDense.wi_1.weight"));
  EXPECT_FALSE(g.count("encoder.block.0.layer.1.DenseReluDense.wi.weight"));
  EXPECT_TRUE(g.count("lm_head.weight"));
  // Shapes: q/k/v [heads * d_kv, d_model], o the reverse, the bias table [buckets, heads].
  for (const auto& [n, p] : gated->named_parameters()) {
    if (n == "encoder.block.0.layer.0.SelfAttention.q.weight") {
      EXPECT_EQ(p.shape(), (Shape{18, 16}));
    }
    if (n == "encoder.block.0.layer.0.SelfAttention.o.weight") {
      EXPECT_EQ(p.shape(), (Shape{16, 18}));
    }
    if (n == "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight") {
      EXPECT_EQ(p.shape(), (Shape{8, 3}));
    }
    if (n == "lm_head.weight") {
      EXPECT_EQ(p.shape(), (Shape{48, 16}));
    }
  }
}

TEST(t5_loading_test, ops_run_under_the_checkpoints_module_paths) {
  Generator gen(1);
  auto model = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  auto hook = std::make_shared<t5_test::Recorder>();
  Tensor ids = from_values({3, 4, 5, 6}, {1, 4}, {DType::i64});
  {
    probe::HookGuard guard(hook);
    NoGradGuard no_grad;
    model->forward2(ids, ids);
  }
  std::set<std::string> scopes;
  for (const auto& s : hook->ops) scopes.insert(s.scope + " " + s.op);
  for (const char* want : {"encoder.embed_tokens embedding", "decoder.embed_tokens embedding",
                           "encoder.block.0.layer.0.SelfAttention.relative_attention_bias embedding",
                           "decoder.block.0.layer.0.SelfAttention.relative_attention_bias embedding",
                           "encoder.block.1.layer.0.SelfAttention.q linear",
                           "encoder.block.1.layer.1.DenseReluDense.wo linear",
                           "decoder.block.0.layer.1.EncDecAttention.q linear",
                           "decoder.block.1.layer.2.DenseReluDense.wi linear", "encoder.final_layer_norm rsqrt",
                           "lm_head linear"}) {
    EXPECT_TRUE(scopes.count(want)) << want;
  }
  // The bias table is looked up once per stack (block 0's), never by block 1.
  for (const auto& s : hook->ops) EXPECT_EQ(s.scope.find("block.1.layer.0.SelfAttention.relative"), std::string::npos);
}

TEST(t5_loading_test, one_tensor_call_is_refused_with_a_hint) {
  Generator gen(1);
  auto model = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  Tensor ids = from_values({3, 4}, {1, 2}, {DType::i64});
  try {
    (*model)(ids);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "T5ForConditionalGeneration: an encoder-decoder model takes two inputs (encoder and decoder "
                           "token ids)\nhint: call forward2(encoder_input, decoder_input)");
  }
  EXPECT_THROW(model->forward2(ids, from_values({3, 4}, {2, 1}, {DType::i64})), ShapeError);
  EXPECT_THROW(model->forward2(ids.to(DType::f32), ids), ShapeError);
}

TEST(t5_loading_test, save_and_load_round_trip_the_weights_and_the_logits) {
  for (const json& config : {t5_test::v1_0_config(), t5_test::v1_1_config()}) {
    const fs::path dir =
        testing::process_scratch_dir("ampscope_t5_load") / config["feed_forward_proj"].get<std::string>();
    Generator gen(5);
    auto made = hf::make_seq2seq(config, gen);
    hf::save_seq2seq(*made, dir);
    auto loaded = hf::load_seq2seq(dir);
    EXPECT_TRUE(loaded.report.missing.empty());
    EXPECT_TRUE(loaded.report.unexpected.empty());
    EXPECT_TRUE(loaded.report.ignored.empty());
    EXPECT_EQ(loaded.model->model_type(), "t5");
    EXPECT_EQ(loaded.model->max_positions(), 512);  // absent from the tiny configs: T5's 512
    EXPECT_EQ(loaded.model->vocab_size(), 48);
    EXPECT_EQ(loaded.model->num_layers(), 2);
    EXPECT_EQ(loaded.model->num_decoder_layers(), 2);
    EXPECT_EQ(loaded.model->decoder_start_token_id(), config["decoder_start_token_id"].get<std::int64_t>());
    EXPECT_TRUE(hf::is_seq2seq_folder(dir));
    Tensor ids = from_values({3, 4, 5, 6, 7, 8}, {2, 3}, {DType::i64});
    NoGradGuard no_grad;
    EXPECT_EQ(made->forward2(ids, ids).values(), loaded.model->forward2(ids, ids).values());
    // The folder holds exactly what HF's safetensors hold: no tied copies.
    const auto names = safetensors::File::open(dir / "model.safetensors").tensors();
    for (const auto& info : names) {
      EXPECT_EQ(info.name.find("embed_tokens"), std::string::npos) << info.name;
      if (config.value("tie_word_embeddings", true)) {
        EXPECT_NE(info.name, "lm_head.weight");
      }
    }
  }
}

// A folder written from `tensors` (by name) with the v1.0 config.
fs::path write_folder(const std::string& name, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const json& config = t5_test::v1_0_config()) {
  const fs::path dir = testing::process_scratch_dir("ampscope_t5_load") / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  safetensors::save(dir / "model.safetensors", tensors, {{"format", "pt"}});
  return dir;
}

std::vector<std::pair<std::string, Tensor>> tensors_of(hf::Seq2SeqLM& m) { return m.checkpoint_tensors(); }

Tensor find(const std::vector<std::pair<std::string, Tensor>>& t, const std::string& name) {
  for (const auto& [n, v] : t) {
    if (n == name) return v;
  }
  return {};
}

TEST(t5_loading_test, tied_copies_under_hfs_other_names_are_ignored_when_equal) {
  Generator gen(5);
  auto made = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  auto t = tensors_of(*made);
  const Tensor shared = find(t, "shared.weight");
  // What older save_pretrained files hold: every tied name, plus the decoder's unused cross-attention table.
  t.emplace_back("encoder.embed_tokens.weight", shared.clone());
  t.emplace_back("decoder.embed_tokens.weight", shared.clone());
  t.emplace_back("lm_head.weight", shared.clone());
  t.emplace_back("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", zeros({8, 4}));
  t.emplace_back("extra.tensor", zeros({2}));
  auto loaded = hf::load_seq2seq(write_folder("all_names", t));
  EXPECT_EQ(loaded.report.ignored,
            (std::vector<std::string>{"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
                                      "decoder.embed_tokens.weight", "encoder.embed_tokens.weight", "lm_head.weight"}));
  EXPECT_EQ(loaded.report.unexpected, (std::vector<std::string>{"extra.tensor"}));

  // Only a stack's embed_tokens, no shared.weight: it is the shared embedding.
  auto only = tensors_of(*made);
  for (auto& [n, v] : only) {
    if (n == "shared.weight") n = "encoder.embed_tokens.weight";
  }
  auto from_alias = hf::load_seq2seq(write_folder("alias", only));
  EXPECT_EQ(from_alias.model->child("shared")->parameter("weight").values(), shared.values());
}

TEST(t5_loading_test, tied_copies_that_differ_are_refused) {
  Generator gen(5);
  auto made = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  auto t = tensors_of(*made);
  t.emplace_back("decoder.embed_tokens.weight", zeros(find(t, "shared.weight").shape()));
  const fs::path dir = write_folder("differ", t);
  EXPECT_EQ(message_of([&] { hf::load_seq2seq(dir); }),
            dir.string() + ": 'decoder.embed_tokens.weight' differs from 'shared.weight', but T5 ties it to the shared "
                           "embedding\nhint: keep one copy of the embedding (HF ties encoder.embed_tokens and "
                           "decoder.embed_tokens to shared)");
  auto h = tensors_of(*made);
  h.emplace_back("lm_head.weight", zeros(find(h, "shared.weight").shape()));
  const fs::path head = write_folder("head_differs", h);
  EXPECT_EQ(message_of([&] { hf::load_seq2seq(head); }),
            head.string() + ": 'lm_head.weight' differs from 'shared.weight', but T5 ties it to the shared embedding "
                            "(tie_word_embeddings is true, or absent)\nhint: set \"tie_word_embeddings\": false in "
                            "config.json to use the checkpoint's head as its own parameter");
}

TEST(t5_loading_test, missing_and_misshapen_weights_are_all_named) {
  Generator gen(5);
  auto made = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  std::vector<std::pair<std::string, Tensor>> t;
  for (auto& [n, v] : tensors_of(*made)) {
    if (n == "encoder.block.1.layer.1.DenseReluDense.wo.weight" || n == "decoder.final_layer_norm.weight") continue;
    if (n == "decoder.block.0.layer.1.EncDecAttention.q.weight") {
      t.emplace_back(n, zeros({16, 15}));
      continue;
    }
    t.emplace_back(n, v);
  }
  const fs::path dir = write_folder("missing", t);
  EXPECT_EQ(message_of([&] { hf::load_seq2seq(dir); }),
            dir.string() + ": the checkpoint does not fit the t5 config\n2 missing weights: "
                           "encoder.block.1.layer.1.DenseReluDense.wo.weight, decoder.final_layer_norm.weight\nwrong "
                           "shape: decoder.block.0.layer.1.EncDecAttention.q.weight: the checkpoint has [16, 15], the "
                           "config needs [16, 16]\nhint: the weights must come from a model with this config.json (same "
                           "sizes and block counts); a missing lm_head.weight with tie_word_embeddings false means the "
                           "head was not saved");
}

TEST(t5_loading_test, config_errors_name_the_key) {
  json c = t5_test::v1_0_config();
  c["feed_forward_proj"] = "gated-silu";
  Generator gen(1);
  EXPECT_EQ(message_of([&] { hf::make_seq2seq(c, gen); }),
            "config: key 'feed_forward_proj' is 'gated-silu', which ampscope does not build\nhint: supported: \"relu\" "
            "(T5 v1.0), \"gated-gelu\" (T5 v1.1, flan-t5), and \"gelu\", \"gelu_new\" or \"relu\" with or without "
            "\"gated-\"");
  c = t5_test::v1_0_config();
  c["d_model"] = -4;
  EXPECT_EQ(message_of([&] { hf::make_seq2seq(c, gen); }),
            "config: key 'd_model' must be a positive integer, got -4\nhint: fix the value in config.json");
  c = t5_test::v1_0_config();
  c["decoder_start_token_id"] = 48;
  EXPECT_EQ(message_of([&] { hf::make_seq2seq(c, gen); }),
            "config: key 'decoder_start_token_id' is 48, outside the vocabulary [0, 48)\nhint: T5 starts the decoder "
            "with the pad token, id 0");
  c = t5_test::v1_0_config();
  c["model_type"] = "bart";
  EXPECT_EQ(message_of([&] { hf::make_seq2seq(c, gen); }),
            "config: model_type is 'bart', but load_seq2seq builds T5 (model_type \"t5\")\nhint: load decoder-only "
            "models (gpt2, llama, mistral) with load_model");
}

TEST(t5_loading_test, load_model_sends_t5_folders_to_load_seq2seq) {
  Generator gen(5);
  auto made = hf::make_seq2seq(t5_test::v1_0_config(), gen);
  const fs::path dir = testing::process_scratch_dir("ampscope_t5_load") / "for_load_model";
  hf::save_seq2seq(*made, dir);
  EXPECT_EQ(message_of([&] { hf::load_model(dir); }),
            (dir / "config.json").string() +
                ": model_type 't5' is an encoder-decoder model, not a causal language model\nhint: load it with "
                "load_seq2seq (models/hf_t5.h); is_seq2seq_folder tells the kinds apart");
}

TEST(t5_loading_test, the_loss_is_the_mean_cross_entropy_over_every_label) {
  // logits [1, 2, 3]: row 0 = (0, 0, 0) -> -log(1/3) for any label; row 1 = (log 1, log 2, log 5) -> the
  // label 2's probability is 5/8.
  Tensor logits = from_values({0, 0, 0, 0, std::log(2.0), std::log(5.0)}, {1, 2, 3});
  Tensor labels = from_values({1, 2}, {1, 2}, {DType::i64});
  EXPECT_NEAR(hf::seq2seq_loss(logits, labels).item(), (std::log(3.0) + std::log(8.0 / 5.0)) / 2, 1e-6);
  // -100 is ignored, as HF's CrossEntropyLoss does.
  Tensor masked = from_values({-100, 2}, {1, 2}, {DType::i64});
  EXPECT_NEAR(hf::seq2seq_loss(logits, masked).item(), std::log(8.0 / 5.0), 1e-6);
}

}  // namespace
}  // namespace ampscope
