// tests/hf/tiny_configs.h: the tiny GPT-2 and Llama configurations the Hugging Face folder tests build their
// models from (vocabulary 64, width 32, two layers), one definition for every test that writes a folder.
#pragma once

#include <nlohmann/json.hpp>

namespace ampscope::testing {

inline nlohmann::json tiny_gpt2_config() {
  return {{"model_type", "gpt2"}, {"vocab_size", 64}, {"n_positions", 16}, {"n_embd", 32}, {"n_layer", 2},
          {"n_head", 4}};
}

inline nlohmann::json tiny_llama_config() {
  return {{"model_type", "llama"},     {"vocab_size", 64},         {"max_position_embeddings", 32},
          {"hidden_size", 32},         {"intermediate_size", 48},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4},  {"num_key_value_heads", 2}, {"tie_word_embeddings", false}};
}

}  // namespace ampscope::testing
