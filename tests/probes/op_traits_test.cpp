// tests/probes/op_traits_test.cpp: the table of op traits (probes/analysis/op_traits.h) against what the
// runtime does. Every op name that real runs record has a line (recorded: yes), so a new op in core or the
// models fails here until the table says what it is; the autocast column is core's policy table, op by op and
// line by line; the table itself is consistent (one line per op, kinds that imply a flag carry it).
//
// The runs: every sample at fp32, fp16 and bf16, every scenario (its own precision and configuration), and
// tiny Hugging Face folders (GPT-2, Llama, T5 v1.0 and v1.1) at the three precisions, T5 in fp16 with
// Hugging Face's clamp too; each through train() with a probe at level dtype writing to a memory sink, so the
// names are those a trace of that run holds, forward and backward. The references are independent of the
// table: the sinks' rows, core's autocast_policy() and the lines of core/autocast.cpp's kPolicyTable.
#include "probes/analysis/op_traits.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/run.h"
#include "core/autocast.h"
#include "core/probe_hook.h"
#include "core/random.h"
#include "models/hf_models.h"
#include "models/hf_t5.h"
#include "probes/probe.h"
#include "tests/hf_t5/t5_test_util.h"
#include "tests/probes/memory_sink.h"
#include "tests/test_support.h"

namespace ampscope {
namespace {

namespace fs = std::filesystem;
namespace hf = samples::hf;
using analysis::find_op_traits;
using analysis::OpFlag;
using analysis::OpKind;
using analysis::OpTraits;
using analysis::Recorded;
using samples::Precision;
using samples::TrainConfig;

constexpr Precision kPrecisions[] = {Precision::fp32, Precision::fp16, Precision::bf16};

// op name -> the runs that recorded it ("mlp/fp16 forward", ...), at most a few each.
using Seen = std::map<std::string, std::vector<std::string>>;

void record_run(TrainConfig config, const std::string& name, Seen& seen) {
  config.device = "cpu";
  config.out.clear();  // no trace file: the probe below is the only hook
  auto sink = std::make_shared<testing::MemorySink>();
  {
    probe::HookGuard installed(std::make_shared<probe::Probe>(sink, probe::ProbeOptions{.level = probe::Level::dtype}));
    samples::train(config);
  }
  ASSERT_FALSE(sink->ops.empty()) << name << " recorded no op";
  for (const trace::OpRow& r : sink->ops) {
    std::vector<std::string>& runs = seen[r.op];
    const std::string where = name + " " + std::string(trace::phase_name(r.phase));
    if (runs.size() < 3 && std::find(runs.begin(), runs.end(), where) == runs.end()) runs.push_back(where);
  }
}

// A tiny model folder written by the project's own writers, with a token file below its vocabulary.
fs::path model_folder(const std::string& name, const nlohmann::json& config, bool seq2seq) {
  const fs::path dir = testing::process_scratch_dir("ampscope_op_traits") / name;
  fs::remove_all(dir);
  Generator gen(5);
  if (seq2seq) hf::save_seq2seq(*hf::make_seq2seq(config, gen), dir);
  else hf::save_model(*hf::make_model(config, gen), dir);
  const int vocab = config.at("vocab_size").get<int>();
  std::ofstream tokens(dir / "tokens.txt");
  for (int i = 0; i < 400; ++i) tokens << (i * 37 + i / 7) % vocab << (i % 20 == 19 ? '\n' : ' ');
  return dir;
}

nlohmann::json tiny_gpt2() {
  return {{"model_type", "gpt2"}, {"vocab_size", 96}, {"n_positions", 32}, {"n_embd", 32}, {"n_layer", 2},
          {"n_head", 4}, {"layer_norm_epsilon", 1e-5}, {"activation_function", "gelu_new"},
          {"initializer_range", 0.02}};
}

nlohmann::json tiny_llama() {
  return {{"model_type", "llama"}, {"vocab_size", 96}, {"max_position_embeddings", 64}, {"hidden_size", 32},
          {"intermediate_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6}, {"hidden_act", "silu"}, {"initializer_range", 0.02},
          {"rope_theta", 10000.0}, {"tie_word_embeddings", false}};
}

// Every op the runs above record, once per test program.
const Seen& recorded_ops() {
  static const Seen seen = [] {
    Seen s;
    for (const samples::SampleInfo& sample : samples::sample_registry()) {
      for (Precision p : kPrecisions) {
        TrainConfig c;
        c.sample = sample.name;
        c.precision = p;
        c.steps = 2;
        record_run(c, sample.name + "/" + std::string(samples::precision_name(p)), s);
      }
    }
    for (const samples::Scenario& scenario : samples::scenario_registry()) {
      TrainConfig c;
      c.scenario = scenario.name;
      record_run(c, scenario.name, s);
    }
    const std::vector<std::tuple<std::string, nlohmann::json, bool>> folders = {
        {"gpt2", tiny_gpt2(), false},
        {"llama", tiny_llama(), false},
        {"t5", t5_test::v1_0_config(), true},
        {"t5-v1_1", t5_test::v1_1_config(), true}};
    for (const auto& [name, config, seq2seq] : folders) {
      const fs::path dir = model_folder(name, config, seq2seq);
      for (Precision p : kPrecisions) {
        TrainConfig c;
        c.model_dir = dir.string();
        c.tokens_file = (dir / "tokens.txt").string();
        c.precision = p;
        c.steps = 2;
        c.batch = 2;
        c.context = 16;
        record_run(c, name + "/" + std::string(samples::precision_name(p)), s);
        if (seq2seq && p == Precision::fp16) {
          c.fp16_clamp = true;  // Hugging Face's clamp of inf hidden states: where, clamp, ...
          record_run(c, name + "/fp16 --fp16-clamp", s);
        }
      }
    }
    return s;
  }();
  return seen;
}

std::string runs_text(const std::vector<std::string>& runs) {
  std::string out;
  for (const std::string& r : runs) out += (out.empty() ? "" : ", ") + r;
  return out;
}

TEST(op_traits_test, every_op_a_real_run_records_has_a_line_that_says_the_runtime_records_it) {
  const Seen& seen = recorded_ops();
  // The runs cover the ops the samples, scenarios and architectures are made of: a check that read nothing
  // would pass for any table.
  for (const char* op : {"linear", "conv2d", "softmax", "log_softmax", "nll_loss", "layer_norm", "masked_fill",
                         "gelu", "silu", "rsqrt", "embedding", "view", "to"}) {
    EXPECT_EQ(seen.count(op), 1u) << op << " was expected in the runs";
  }
  std::vector<std::string> missing;
  for (const auto& [op, runs] : seen) {
    const OpTraits* t = find_op_traits(op);
    if (t == nullptr) {
      missing.push_back(op);
      ADD_FAILURE() << "'" << op << "' (recorded by " << runs_text(runs) << ") has no line in the table of op traits: "
                    << "add one to probes/analysis/op_traits.cpp saying what it is";
    } else {
      EXPECT_EQ(t->recorded, Recorded::yes) << "'" << op << "' is recorded by " << runs_text(runs)
                                            << ", but its line says this runtime never records it";
    }
  }
  EXPECT_TRUE(missing.empty());
}

TEST(op_traits_test, the_autocast_column_is_cores_policy_for_every_op) {
  for (const OpTraits& t : analysis::op_traits_table()) {
    EXPECT_EQ(analysis::autocast_list_name(t.autocast), probe::policy_name(autocast_policy(t.op)))
        << "the autocast column of '" << t.op << "' disagrees with core/autocast.cpp";
  }
}

TEST(op_traits_test, every_line_of_cores_policy_table_has_an_op_with_that_list) {
  // The lines of kPolicyTable as core/autocast.cpp writes them: {"op", AutocastPolicy::list},
  std::ifstream in(fs::path(AMPSCOPE_SOURCE_DIR) / "core" / "autocast.cpp");
  ASSERT_TRUE(in) << "cannot read core/autocast.cpp";
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  const std::size_t begin = source.find("kPolicyTable[] = {");
  ASSERT_NE(begin, std::string::npos) << "core/autocast.cpp has no kPolicyTable: update this test";
  const std::string table = source.substr(begin, source.find("\n};", begin) - begin);
  const std::regex line(R"re(\{"([a-z0-9_]+)",\s*AutocastPolicy::([a-z0-9_]+)\})re");
  std::int64_t lines = 0;
  for (auto it = std::sregex_iterator(table.begin(), table.end(), line); it != std::sregex_iterator(); ++it) {
    ++lines;
    const std::string op = (*it)[1], list = (*it)[2];
    const OpTraits* t = find_op_traits(op);
    if (t == nullptr) {
      ADD_FAILURE() << "'" << op << "' is on autocast's " << list << " list but has no line in the table of op traits";
      continue;
    }
    EXPECT_EQ(analysis::autocast_list_name(t->autocast), list) << op;
  }
  // 5 lower_precision_fp, 12 fp32, 3 fp32_set_opt_dtype and 1 banned line today: a parse that found far fewer
  // would check nothing.
  EXPECT_GE(lines, 20);
}

TEST(op_traits_test, each_op_has_one_line_and_kinds_that_imply_a_flag_carry_it) {
  std::set<std::string_view> names;
  for (const OpTraits& t : analysis::op_traits_table()) {
    EXPECT_TRUE(names.insert(t.op).second) << "'" << t.op << "' has two lines";
    EXPECT_EQ(find_op_traits(t.op), &t) << t.op;
    EXPECT_NE(t.kind, OpKind::none) << t.op;
    // Selecting ops and mask fills return input entries as they are: silent damage must not count them.
    if (t.kind == OpKind::selecting || t.kind == OpKind::mask_fill) {
      EXPECT_TRUE(analysis::any(t.flags, OpFlag::selects)) << t.op;
    }
    // A saturating op has an open range whose ends it can reach.
    if (t.kind == OpKind::saturating) {
      EXPECT_NE(t.range, analysis::OpRange::none) << t.op;
    }
    // A value handed on unchanged keeps its zeros too.
    if (analysis::any(t.flags, OpFlag::hands_on)) {
      EXPECT_TRUE(analysis::any(t.flags, OpFlag::passes_zeros)) << t.op;
    }
    // The twin's table stands for the op's body on one f16/bf16 input: no random op, no reduction.
    if (analysis::any(t.flags, OpFlag::element_table)) {
      EXPECT_TRUE(t.kind == OpKind::elementwise || t.kind == OpKind::additive || t.kind == OpKind::saturating) << t.op;
    }
  }
}

TEST(op_traits_test, an_op_the_table_does_not_know_has_no_trait) {
  for (const char* op : {"my_custom_op", "", "Linear", "softmax "}) {
    EXPECT_EQ(find_op_traits(op), nullptr) << "'" << op << "'";
    EXPECT_EQ(analysis::op_kind(op), OpKind::none);
    EXPECT_EQ(analysis::op_range(op), analysis::OpRange::none);
    EXPECT_FALSE(analysis::op_has(op, OpFlag::selects));
    EXPECT_FALSE(analysis::op_has(op, OpFlag::zeros_by_design));
  }
}

}  // namespace
}  // namespace ampscope
