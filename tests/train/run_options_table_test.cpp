// The one table of the run's options (samples/run_options.h): every field of TrainConfig has a row, and
// every row survives each surface the table derives: the command line, a TOML config file (the command
// line over the file over the defaults) and the config JSON a trace records and `ampscope fix` reads back.
// The tests iterate over the table itself, with a non-default value per row made from its type, so a row
// added later is tested the same way without a line here.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "cli/run_options_io.h"
#include "samples/run_options.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

// The number of fields of an aggregate: the most initializers `T{...}` accepts (each an AnyField, which
// converts to any type; only declared, never called).
struct AnyField {
  template <class T>
  operator T() const;  // NOLINT: implicit on purpose
};
template <class T, class... A>
constexpr std::size_t field_count() {
  if constexpr (requires { T{std::declval<A>()..., std::declval<AnyField>()}; }) {
    return field_count<T, A..., AnyField>();
  } else {
    return sizeof...(A);
  }
}

// A valid value other than the default, from the row's type alone.
OptionValue other_value(const RunOption& row) {
  const OptionValue d = row.get(TrainConfig{});
  switch (row.type) {
    case OptionType::text: return "x-" + std::string(row.name);
    case OptionType::path: return "/elsewhere/" + std::string(row.name);  // absolute: no folder is prepended
    case OptionType::choice:
      for (std::string_view c : row.choices)
        if (c != std::get<std::string>(d)) return std::string(c);
      break;
    case OptionType::integer: return std::get<std::int64_t>(d) + 3;
    case OptionType::seed: return std::uint64_t{12345};
    case OptionType::number: return std::get<double>(d) * 2 + 0.25;
    case OptionType::flag: return !std::get<bool>(d);
    case OptionType::list: return std::vector<std::string>{"a.*", "b"};
  }
  ADD_FAILURE() << row.name << ": no other value";
  return d;
}

// An integer or a number as the command line and TOML write it (the shortest text that reads back exactly).
std::string scalar_text(const OptionValue& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (const auto* u = std::get_if<std::uint64_t>(&v)) return std::to_string(*u);
  if (const auto* x = std::get_if<double>(&v)) return fmt::format("{}", *x);
  ADD_FAILURE() << "not a scalar: " << option_value_text(v);
  return "";
}

// The words of the command line that give `value` (the option's, negated where the row is).
std::vector<std::string> cli_words(const RunOption& row, const OptionValue& field_value) {
  TrainConfig c;
  row.set(c, field_value);
  const OptionValue v = row.option_value(c);
  const std::string name = "--" + std::string(row.name);
  if (row.type == OptionType::flag) {
    EXPECT_TRUE(std::get<bool>(v)) << name << ": its non-default value cannot be given as a flag";
    return {name};
  }
  if (const auto* list = std::get_if<std::vector<std::string>>(&v)) {
    std::vector<std::string> words;
    for (const std::string& item : *list) words.insert(words.end(), {name, item});
    return words;
  }
  if (const auto* text = std::get_if<std::string>(&v)) return {name, *text};
  return {name, scalar_text(v)};
}

// The same value as a TOML line.
std::string toml_line(const RunOption& row, const OptionValue& field_value) {
  TrainConfig c;
  row.set(c, field_value);
  const OptionValue v = row.option_value(c);
  std::string text;
  if (const auto* s = std::get_if<std::string>(&v)) {
    text = fmt::format("\"{}\"", *s);
  } else if (const auto* b = std::get_if<bool>(&v)) {
    text = *b ? "true" : "false";
  } else if (const auto* list = std::get_if<std::vector<std::string>>(&v)) {
    for (const std::string& item : *list) text += fmt::format("{}\"{}\"", text.empty() ? "" : ", ", item);
    text = "[" + text + "]";
  } else if (const auto* x = std::get_if<double>(&v)) {
    text = fmt::format("{:.17g}", *x);
    if (text.find_first_of(".e") == std::string::npos) text += ".0";  // a TOML float
  } else {
    text = scalar_text(v);
  }
  return fmt::format("{} = {}\n", row.name, text);
}

TEST(run_options_table_test, every_field_of_train_config_has_a_row_or_is_one_of_the_named_internal_fields) {
  static_assert(std::is_aggregate_v<TrainConfig>);
  EXPECT_EQ(field_count<TrainConfig>(), run_options().size() + kInternalTrainConfigFields)
      << "a field was added to TrainConfig without a row in samples/run_options.cpp (or the internal ones changed)";
  // Each row names a field of its own.
  std::set<std::string> names, keys;
  for (const RunOption& row : run_options()) {
    EXPECT_TRUE(names.insert(std::string(row.name)).second) << row.name;
    if (!row.json_key.empty()) {
      EXPECT_TRUE(keys.insert(std::string(row.json_key)).second) << row.json_key;
    }
    if (!row.implies.empty()) {
      EXPECT_NE(find_run_option(row.implies), nullptr) << row.implies;
    }
    // Setting this row's field changes no other row's value: no two rows share a field.
    TrainConfig c;
    row.set(c, other_value(row));
    EXPECT_NE(row.get(c), row.get(TrainConfig{})) << row.name;
    for (const RunOption& other : run_options()) {
      if (&other != &row) {
        EXPECT_EQ(other.get(c), other.get(TrainConfig{})) << row.name << " also sets " << other.name;
      }
    }
  }
}



TrainConfig parse_cli(const std::vector<std::string>& words, const TrainConfig& start = TrainConfig{}) {
  CLI::App app;
  CLI::App* cmd = app.add_subcommand("train");
  RunOptionsCli options(*cmd);
  std::vector<std::string> args = {"ampscope", "train"};
  args.insert(args.end(), words.begin(), words.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  TrainConfig c = start;
  options.apply(c);
  return c;
}

std::filesystem::path scratch_file(const std::string& name) {
  return ampscope::testing::process_scratch_dir("ampscope_run_options_table") / name;
}

TrainConfig from_toml(const std::string& text, bool& compare) {
  const auto path = scratch_file("config.toml");
  std::ofstream(path) << text;
  TrainConfig c;
  apply_config_file(path.string(), c, compare);
  return c;
}

TEST(run_options_table_test, every_user_option_round_trips_through_the_command_line) {
  for (const RunOption& row : run_options()) {
    if (!row.user_option) continue;
    SCOPED_TRACE(std::string(row.name));
    const OptionValue value = other_value(row);
    const TrainConfig c = parse_cli(cli_words(row, value));
    EXPECT_EQ(row.get(c), value) << option_value_text(row.get(c)) << " != " << option_value_text(value);
    // Given nothing, the defaults.
    EXPECT_EQ(row.get(parse_cli({})), row.get(TrainConfig{}));
  }
}

TEST(run_options_table_test, every_user_option_round_trips_through_a_toml_file_and_the_command_line_wins) {
  for (const RunOption& row : run_options()) {
    if (!row.user_option) continue;
    SCOPED_TRACE(std::string(row.name));
    const OptionValue value = other_value(row);
    bool compare = false;
    const TrainConfig file = from_toml(toml_line(row, value), compare);
    EXPECT_EQ(row.get(file), value) << option_value_text(row.get(file)) << " != " << option_value_text(value);
    EXPECT_FALSE(compare);
    // The command line over the file: the file says the default, the command line the other value.
    const TrainConfig both = parse_cli(cli_words(row, value), from_toml(toml_line(row, row.get(TrainConfig{})), compare));
    EXPECT_EQ(row.get(both), value);
    // A row that is not a user option is no TOML key either.
  }
  bool compare = false;
  for (const RunOption& row : run_options()) {
    if (row.user_option) continue;
    EXPECT_THROW_MSG(from_toml(toml_line(row, other_value(row)), compare), Error,
                     fmt::format("unknown key '{}'", row.name));
  }
}

TEST(run_options_table_test, every_recorded_option_round_trips_through_the_config_json_and_the_others_say_why_not) {
  for (const RunOption& row : run_options()) {
    SCOPED_TRACE(std::string(row.name));
    if (row.recorded == Recorded::never) {
      EXPECT_TRUE(row.json_key.empty());
      EXPECT_FALSE(row.not_recorded.empty()) << "a row that is not recorded says why";
      continue;
    }
    ASSERT_FALSE(row.json_key.empty());
    const OptionValue value = other_value(row);
    TrainConfig c;
    // The condition under which the row is recorded.
    if (row.recorded == Recorded::with_checkpoint && row.name != "checkpoint") c.checkpoint = "/elsewhere/ck.h5";
    if (row.recorded == Recorded::with_model && row.name != "model") c.model_dir = "/elsewhere/model";
    if (row.recorded == Recorded::with_fp8 || row.recorded == Recorded::with_quantized) c.precision = Precision::fp8;
    if (row.recorded == Recorded::with_mxfp8) c.precision = Precision::mxfp8;
    if (row.recorded == Recorded::with_nvfp4) c.precision = Precision::nvfp4;
    row.set(c, value);
    const int ranks = row.recorded == Recorded::with_ranks ? 2 : 1;
    const RecordedRun back = read_run_config(nlohmann::json::parse(run_config_json(c, ranks, ranks - 1)));
    EXPECT_EQ(row.get(back.config), value) << option_value_text(row.get(back.config)) << " != " << option_value_text(value);
    EXPECT_NE(std::find(back.keys.begin(), back.keys.end(), std::string(row.json_key)), back.keys.end());
    EXPECT_TRUE(back.unknown.empty());
    EXPECT_EQ(back.world_size, ranks);
    EXPECT_EQ(back.rank, ranks - 1);
  }
}

// The config JSON is the text traces have always held (docs/trace-format.md): written here by hand from the
// writer the table replaced (its keys, their order, their conditions and number forms), for the defaults
// and for a run that meets every condition (a checkpoint, a model folder, two ranks, a NaN lr).
TEST(run_options_table_test, the_config_json_is_the_text_traces_have_always_held) {
  EXPECT_EQ(run_config_json(TrainConfig{}),
            R"({"sample":"mlp","precision":"fp16","device":"auto","steps":50,"batch":0,"lr":0.0,"seed":0,)"
            R"("scenario":"","init_scale":65536.0,"growth_interval":2000,"use_scaler":true,"probe":"health",)"
            R"("sample_every":1,"twin":false,"twin_every":1,"twin_backward":true,"twin_f64":false,)"
            R"("max_grad_norm":1.0,"zero_grad":true,"autocast_fp32":[],"data":"","text":"","resume":""})");
  TrainConfig c;
  c.lr = std::nan("");
  c.init_scale = INFINITY;
  c.seed = 7;
  c.out = "not-recorded.h5";
  c.save_model = "not-recorded";
  c.ddp = true;
  c.resume_allow_nonfinite = true;
  c.text_file = "/t/../text.txt";
  c.checkpoint = "/ck/./a.h5";
  c.checkpoint_every = 5;
  c.keep_checkpoints = true;
  c.model_dir = "/m/gpt2";
  c.tokens_file = "";
  c.fp16_clamp = true;
  c.eval = true;
  c.shard_optimizer = true;
  c.autocast_fp32 = {"x", "y.*"};
  // A model-folder run trains no sample: `sample` is not recorded (traces before issue 31 had "mlp" there).
  EXPECT_EQ(run_config_json(c, 2, 1),
            R"({"precision":"fp16","device":"auto","steps":50,"batch":0,"lr":"nan","seed":7,)"
            R"("scenario":"","init_scale":"inf","growth_interval":2000,"use_scaler":true,"probe":"health",)"
            R"("sample_every":1,"twin":false,"twin_every":1,"twin_backward":true,"twin_f64":false,)"
            R"("max_grad_norm":1.0,"zero_grad":true,"autocast_fp32":["x","y.*"],"data":"","text":"/text.txt",)"
            R"("resume":"","checkpoint":"/ck/a.h5","checkpoint_every":5,"keep_checkpoints":true,"model":"/m/gpt2",)"
            R"("tokens":"","context":0,"fp16_clamp":true,"eval":true,"world_size":2,"rank":1,"shard_optimizer":true})");
  // One rank: no world_size, rank or shard_optimizer.
  const std::string single = run_config_json(c);
  EXPECT_EQ(single.find("world_size"), std::string::npos);
  EXPECT_EQ(single.find("shard_optimizer"), std::string::npos);
}

TEST(run_options_table_test, a_recorded_value_of_the_wrong_type_is_refused_naming_its_key) {
  auto read = [](const char* text) { return read_run_config(nlohmann::json::parse(text)); };
  EXPECT_THROW_MSG(read(R"({"batch": "64"})"), Error, "the recorded configuration's 'batch' is \"64\"; expected an integer");
  EXPECT_THROW_MSG(read(R"({"batch": 2.5})"), Error, "'batch' is 2.5; expected an integer");
  EXPECT_THROW_MSG(read(R"({"seed": -1})"), Error, "'seed' is -1; expected an integer >= 0");
  EXPECT_THROW_MSG(read(R"({"twin": 1})"), Error, "'twin' is 1; expected true or false");
  EXPECT_THROW_MSG(read(R"({"lr": "fast"})"), Error, "'lr' is \"fast\"; expected a number");
  EXPECT_THROW_MSG(read(R"({"autocast_fp32": ["a", 3]})"), Error, "'autocast_fp32'", "expected an array of strings");
  EXPECT_THROW_MSG(read(R"({"precision": "fp4"})"), Error, "unknown precision 'fp4'; valid: fp32, fp16, bf16, fp8, mxfp8, nvfp4");
  EXPECT_THROW_MSG(read(R"({"world_size": 0})"), Error, "'world_size' is 0; expected an integer >= 1");
  // Non-finite numbers are read back as written; train's checks refuse them later (check_run_options).
  const RecordedRun nan = read(R"({"lr": "nan", "init_scale": "-inf", "some_future_option": 3})");
  EXPECT_TRUE(std::isnan(nan.config.lr));
  EXPECT_EQ(nan.config.init_scale, -INFINITY);
  EXPECT_EQ(nan.unknown, std::vector<std::string>{"some_future_option"});
  EXPECT_THROW_MSG(check_run_options(nan.config), Error, "--lr: nan is not allowed; expected a finite number > 0");
}

// Each check of the table, on the value train refuses and the nearest one it allows (the boundaries come
// from the options' documented ranges in docs/training.md, not from the code).
TEST(run_options_table_test, each_check_refuses_just_outside_its_range_and_allows_its_edge) {
  struct Case {
    const char* option;
    OptionValue refused;
    OptionValue allowed;
    const char* message;
  };
  const Case cases[] = {
      {"steps", std::int64_t{-1}, std::int64_t{0}, "--steps: -1 is not allowed; expected an integer >= 0"},
      {"batch", std::int64_t{-1}, std::int64_t{0}, "--batch: -1 is not allowed"},
      {"batch", std::int64_t{65537}, std::int64_t{65536}, "--batch: 65537 is not allowed; expected an integer from 1 to 65536"},
      {"lr", -1e-9, 0.0, "--lr: -1e-09 is not allowed"},
      {"lr", INFINITY, 1e300, "--lr: inf is not allowed"},
      {"sample-every", std::int64_t{0}, std::int64_t{1}, "--sample-every: 0 is not allowed"},
      {"twin-every", std::int64_t{0}, std::int64_t{1}, "--twin-every: 0 is not allowed"},
      {"init-scale", 0.0, 1e-300, "--init-scale: 0 is not allowed"},
      {"init-scale", -1.0, 65536.0, "--init-scale: -1 is not allowed"},
      {"growth-interval", std::int64_t{0}, std::int64_t{1}, "--growth-interval: 0 is not allowed"},
      {"max-grad-norm", std::nan(""), 0.0, "--max-grad-norm: nan is not allowed"},
      {"checkpoint-every", std::int64_t{-1}, std::int64_t{0}, "--checkpoint-every: -1 is not allowed"},
      {"context", std::int64_t{-1}, std::int64_t{0}, "--context: -1 is not allowed"},
      {"autocast-fp32", std::vector<std::string>{"a", ""}, std::vector<std::string>{"a"}, "--autocast-fp32: '' is not allowed"},
      {"probe", std::string("everything"), std::string("off"), "--probe: everything is not allowed; expected one of off"},
      {"fp8-recipe", std::string("delay"), std::string("current"),
       "--fp8-recipe: delay is not allowed; expected delayed or current"},
      {"fp8-format", std::string("e5m2"), std::string("e4m3"),
       "--fp8-format: e5m2 is not allowed; expected hybrid (E4M3 forward, E5M2 gradients) or e4m3"},
      {"fp8-amax-algo", std::string("mean"), std::string("most_recent"),
       "--fp8-amax-algo: mean is not allowed; expected max or most_recent"},
      {"fp8-amax-history", std::int64_t{0}, std::int64_t{1},
       "--fp8-amax-history: 0 is not allowed; expected an integer from 1 to 1048576 (1024 is TransformerEngine's default)"},
      {"fp8-amax-history", std::int64_t{1048577}, std::int64_t{1048576}, "--fp8-amax-history: 1048577 is not allowed"},
      {"fp8-margin", std::int64_t{-1}, std::int64_t{0},
       "--fp8-margin: -1 is not allowed; expected an integer from 0 to 64 (the scale is divided by 2^margin)"},
      {"fp8-margin", std::int64_t{65}, std::int64_t{64}, "--fp8-margin: 65 is not allowed"},
      {"fp8-keep-bf16", std::vector<std::string>{""}, std::vector<std::string>{"fc3"},
       "--fp8-keep-bf16: '' is not allowed; expected a glob naming modules"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.option);
    const RunOption& row = *find_run_option(k.option);
    TrainConfig c;
    row.set(c, k.refused);
    EXPECT_THROW_MSG(check_run_options(c), Error, k.message);
    row.set(c, k.allowed);
    EXPECT_NO_THROW(check_run_options(c));
  }
}

}  // namespace
}  // namespace ampscope::samples
