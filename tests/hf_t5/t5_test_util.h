// Shared by the T5 tests: the tiny configurations of both variants, and a probe hook that notes which ops
// produced non-finite values and in which module.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/probe_hook.h"
#include "core/tensor.h"

namespace ampscope::t5_test {

// T5 v1.0 (t5-small's shape, shrunk): relu feed-forward, head tied to `shared` and scaled by d_model^-0.5.
// 8 buckets and max distance 16, so that the short test sequences reach the log-spaced buckets.
inline nlohmann::json v1_0_config() {
  return {{"model_type", "t5"},
          {"vocab_size", 48},
          {"d_model", 16},
          {"d_kv", 4},
          {"d_ff", 32},
          {"num_layers", 2},
          {"num_decoder_layers", 2},
          {"num_heads", 4},
          {"relative_attention_num_buckets", 8},
          {"relative_attention_max_distance", 16},
          {"layer_norm_epsilon", 1e-6},
          {"initializer_factor", 1.0},
          {"feed_forward_proj", "relu"},
          {"dropout_rate", 0.1},
          {"is_encoder_decoder", true},
          {"pad_token_id", 0},
          {"eos_token_id", 1},
          {"decoder_start_token_id", 0}};
}

// T5 v1.1 / flan-t5: gated-gelu feed-forward (wi_0, wi_1), untied lm_head, no scaling; d_kv * num_heads
// differs from d_model, as in t5-v1_1-large and flan-t5.
inline nlohmann::json v1_1_config() {
  nlohmann::json c = v1_0_config();
  c["feed_forward_proj"] = "gated-gelu";
  c["tie_word_embeddings"] = false;
  c["d_kv"] = 6;
  c["num_heads"] = 3;
  c["d_ff"] = 24;
  c["decoder_start_token_id"] = 2;  // not 0, so the shift-right's start token is visible in the test
  return c;
}

// What each forward op wrote: its name, module, and counts of +-inf and NaN in its output.
struct Seen {
  std::string op, scope;
  std::int64_t infs = 0, nans = 0;
};

class Recorder : public probe::Hook {
 public:
  void on_op(const probe::OpEvent& e) override {
    Seen s{std::string(e.op), e.scope};
    if (e.output.defined() && (e.output.dtype() == DType::f32 || e.output.dtype() == DType::f16 ||
                               e.output.dtype() == DType::bf16 || e.output.dtype() == DType::f64)) {
      for (double v : e.output.values()) {
        s.infs += std::isinf(v) ? 1 : 0;
        s.nans += std::isnan(v) ? 1 : 0;
      }
    }
    ops.push_back(std::move(s));
  }
  // The first op whose output held +-inf or NaN, or null.
  const Seen* first_nonfinite() const {
    for (const auto& s : ops) {
      if (s.infs > 0 || s.nans > 0) return &s;
    }
    return nullptr;
  }
  std::vector<Seen> ops;
};

}  // namespace ampscope::t5_test
