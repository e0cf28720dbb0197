// The run's options on the command line, in a TOML file and in a trace's config JSON (cli/run_options_io.h).
#include "cli/run_options_io.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/error.h"
#include "core/io/hdf5_support.h"

namespace ampscope::samples {

// The option's storage for CLI11: one member per type, the one of the row's type bound.
struct RunOptionsCli::Slot {
  const RunOption* row = nullptr;
  CLI::Option* option = nullptr;
  std::string text;
  std::int64_t integer = 0;
  std::uint64_t unsigned_value = 0;
  double number = 0;
  bool flag = false;
  std::vector<std::string> list;

  OptionValue value() const {
    switch (row->type) {
      case OptionType::text:
      case OptionType::path:
      case OptionType::choice: return text;
      case OptionType::integer: return integer;
      case OptionType::seed: return unsigned_value;
      case OptionType::number: return number;
      case OptionType::flag: return true;  // given
      case OptionType::list: return list;
    }
    return text;
  }
};

RunOptionsCli::RunOptionsCli(CLI::App& cmd) {
  const TrainConfig defaults;
  for (const RunOption& row : run_options()) {
    if (!row.user_option) continue;
    auto slot = std::make_unique<Slot>();
    Slot& s = *slot;
    s.row = &row;
    const std::string name = "--" + std::string(row.name);
    const std::string help(row.help);
    const OptionValue initial = row.option_value(defaults);
    switch (row.type) {
      case OptionType::text:
      case OptionType::path:
      case OptionType::choice:
        s.text = std::get<std::string>(initial);
        s.option = cmd.add_option(name, s.text, help);
        if (!s.text.empty()) s.option->capture_default_str();
        if (!row.choices.empty()) s.option->check(CLI::IsMember(std::vector<std::string>(row.choices.begin(), row.choices.end())));
        break;
      case OptionType::integer:
        s.integer = std::get<std::int64_t>(initial);
        s.option = cmd.add_option(name, s.integer, help)->capture_default_str();
        break;
      case OptionType::seed:
        s.unsigned_value = std::get<std::uint64_t>(initial);
        // CLI11 would read "-1" into an unsigned value as 2^64 - 1 without a word.
        s.option = cmd.add_option(name, s.unsigned_value, help)
                       ->capture_default_str()
                       ->check(CLI::Validator(
                           [](std::string& value) {
                             return !value.empty() && value.find_first_not_of("0123456789") == std::string::npos
                                        ? std::string()
                                        : fmt::format("{} is not allowed; expected an integer >= 0", value);
                           },
                           "INT >= 0"));
        break;
      case OptionType::number:
        s.number = std::get<double>(initial);
        s.option = cmd.add_option(name, s.number, help)->capture_default_str();
        break;
      case OptionType::flag:
        s.option = cmd.add_flag(name, s.flag, help);
        break;
      case OptionType::list:
        s.option = cmd.add_option(name, s.list, help);
        break;
    }
    slots_.push_back(std::move(slot));
  }
}

RunOptionsCli::~RunOptionsCli() = default;

void RunOptionsCli::apply(TrainConfig& config) const {
  for (const auto& s : slots_)
    if (s->option->count() > 0) s->row->apply(config, s->value());
}

bool RunOptionsCli::given(std::string_view name) const {
  for (const auto& s : slots_)
    if (s->row->name == name) return s->option->count() > 0;
  return false;
}

namespace {

// One TOML value as the row's type; throws naming the file, the key and the type wanted.
OptionValue toml_value(const RunOption& row, const toml::node& node, const std::string& path,
                       const std::filesystem::path& folder) {
  const std::string key(row.name);
  auto need = [&](auto value, std::string_view type) {
    if (!value) throw Error(fmt::format("--config '{}': '{}' must be {}", path, key, type));
    return *value;
  };
  switch (row.type) {
    case OptionType::text:
    case OptionType::choice: return need(node.value<std::string>(), "a string");
    case OptionType::path: {
      // Relative to the file's folder (a config keeps working from any working folder); absolute paths
      // stay as they are.
      const std::string p = need(node.value<std::string>(), "a string");
      if (p.empty() || std::filesystem::path(p).is_absolute()) return p;
      return (folder / p).lexically_normal().string();
    }
    case OptionType::integer: return need(node.value<std::int64_t>(), "an integer");
    case OptionType::seed: {
      const std::int64_t seed = need(node.value<std::int64_t>(), "an integer");
      if (seed < 0) {
        throw Error(fmt::format("--config '{}': '{}' = {} is not allowed; expected an integer >= 0", path, key, seed));
      }
      return static_cast<std::uint64_t>(seed);
    }
    case OptionType::number: return need(node.value<double>(), "a number");
    case OptionType::flag: return need(node.value<bool>(), "true or false");
    case OptionType::list: {
      const toml::array* items = node.as_array();
      if (items == nullptr) throw Error(fmt::format("--config '{}': '{}' must be an array of strings", path, key));
      std::vector<std::string> list;
      for (const auto& item : *items) list.push_back(need(item.value<std::string>(), "an array of strings"));
      return list;
    }
  }
  throw Error(fmt::format("--config '{}': '{}' has a type this version cannot read", path, key));
}

}  // namespace

void apply_config_file(const std::string& path, TrainConfig& config, bool& compare) {
  if (const std::string reason = hdf5::unreadable_reason(path.c_str()); !reason.empty()) {
    throw Error(fmt::format("--config: cannot read '{}': {}", path, reason));
  }
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("--config: cannot parse '{}': {} (line {}, column {})", path, e.description(),
                            e.source().begin.line, e.source().begin.column));
  }
  const toml::table* table = file["train"].as_table() != nullptr ? file["train"].as_table() : &file;
  // With a [train] table, every key belongs in it: a key outside would be silently ignored.
  if (table != &file) {
    for (const auto& [key, node] : file) {
      if (key.str() != "train") {
        throw Error(fmt::format("--config '{}': key '{}' is outside the [train] table and would be ignored; put "
                                "every key under [train], or use no table at all",
                                path, key.str()));
      }
    }
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  for (const auto& [key, node] : *table) {
    const std::string k(key.str());
    if (k == "compare") {
      const std::optional<bool> value = node.value<bool>();
      if (!value) throw Error(fmt::format("--config '{}': 'compare' must be true or false", path));
      compare = *value;
      continue;
    }
    const RunOption* row = find_run_option(k);
    if (row == nullptr || !row->user_option) {
      std::string list;
      for (const RunOption& o : run_options())
        if (o.user_option) list += fmt::format("{}{}", list.empty() ? "" : ", ", o.name);
      throw Error(fmt::format("--config '{}': unknown key '{}'; known keys: {}, compare", path, k, list));
    }
    row->apply(config, toml_value(*row, node, path, folder));
  }
}

namespace {

nlohmann::ordered_json json_value(const RunOption& row, const TrainConfig& config) {
  const OptionValue value = row.get(config);
  if (const auto* text = std::get_if<std::string>(&value)) {
    const bool absolute = row.recorded_path == RecordedPath::absolute ||
                          (row.recorded_path == RecordedPath::absolute_in_model_runs && !config.model_dir.empty());
    if (absolute && !text->empty()) return std::filesystem::absolute(*text).lexically_normal().string();
    return *text;
  }
  if (const auto* number = std::get_if<double>(&value)) {
    if (std::isfinite(*number)) return *number;
    return std::isnan(*number) ? "nan" : (*number > 0 ? "inf" : "-inf");
  }
  return std::visit([](const auto& v) { return nlohmann::ordered_json(v); }, value);
}

}  // namespace

std::string run_config_json(const TrainConfig& config, int world_size, int rank) {
  nlohmann::ordered_json j;
  bool ranks_written = false;
  for (const RunOption& row : run_options()) {
    switch (row.recorded) {
      case Recorded::never: continue;
      case Recorded::always: break;
      case Recorded::with_checkpoint:
        if (config.checkpoint.empty()) continue;
        break;
      case Recorded::with_model:
        if (config.model_dir.empty()) continue;
        break;
      case Recorded::without_model:
        if (!config.model_dir.empty()) continue;
        break;
      case Recorded::with_fp8:
        if (config.precision != Precision::fp8) continue;
        break;
      // A --what-if run reads the options that leave Linears out of it and the scale rule and transform of the formats
      // it measures (and `ampscope fix` replays them).
      case Recorded::with_quantized:
        if (!quantized_linears(config.precision) && config.what_if.empty()) continue;
        break;
      case Recorded::with_mxfp8:
        if (config.precision != Precision::mxfp8 && config.what_if.find("mxfp8") == std::string::npos) continue;
        break;
      case Recorded::with_nvfp4:
        if (config.precision != Precision::nvfp4 && config.what_if.find("nvfp4") == std::string::npos) continue;
        break;
      case Recorded::with_ranks:
        if (world_size <= 1) continue;
        if (!ranks_written) {
          // The rank is rank-local: the ranks compare their configurations without it.
          j["world_size"] = world_size;
          j["rank"] = rank;
          ranks_written = true;
        }
        break;
    }
    if (row.recorded_when_set && row.is_default(config)) continue;
    j[std::string(row.json_key)] = json_value(row, config);
  }
  if (world_size > 1 && !ranks_written) {
    j["world_size"] = world_size;
    j["rank"] = rank;
  }
  return j.dump();
}

namespace {

std::string shown(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

OptionValue recorded_value(const RunOption& row, const nlohmann::json& v) {
  auto wrong = [&](std::string_view expected) -> Error {
    return Error(fmt::format("the recorded configuration's '{}' is {}; expected {}", row.json_key, shown(v), expected));
  };
  switch (row.type) {
    case OptionType::text:
    case OptionType::path:
    case OptionType::choice:
      if (!v.is_string()) throw wrong("a string");
      return v.get<std::string>();
    case OptionType::integer:
      if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw wrong("an integer of at most 63 bits");
      if (!v.is_number_integer()) throw wrong("an integer");
      return v.get<std::int64_t>();
    case OptionType::seed:
      if (!v.is_number_unsigned()) throw wrong("an integer >= 0");
      return v.get<std::uint64_t>();
    case OptionType::number:
      if (v.is_number()) return v.get<double>();
      if (v == "nan") return std::nan("");
      if (v == "inf") return std::numeric_limits<double>::infinity();
      if (v == "-inf") return -std::numeric_limits<double>::infinity();
      throw wrong("a number");
    case OptionType::flag:
      if (!v.is_boolean()) throw wrong("true or false");
      return v.get<bool>();
    case OptionType::list: {
      if (!v.is_array()) throw wrong("an array of strings");
      std::vector<std::string> list;
      for (const nlohmann::json& item : v) {
        if (!item.is_string()) throw wrong("an array of strings");
        list.push_back(item.get<std::string>());
      }
      return list;
    }
  }
  throw wrong("a value this version can read");
}

}  // namespace

RecordedRun read_run_config(const nlohmann::json& config) {
  if (!config.is_object()) throw Error("the recorded configuration is not a JSON object");
  RecordedRun run;
  for (const auto& [key, value] : config.items()) {
    if (key == "world_size" || key == "rank") {
      if (!value.is_number_integer() || value.get<std::int64_t>() < (key == "rank" ? 0 : 1)) {
        throw Error(fmt::format("the recorded configuration's '{}' is {}; expected an integer >= {}", key, shown(value),
                                key == "rank" ? 0 : 1));
      }
      (key == "rank" ? run.rank : run.world_size) = value.get<std::int64_t>();
      continue;
    }
    const RunOption* row = find_recorded_option(key);
    if (row == nullptr) {
      run.unknown.push_back(key);
      continue;
    }
    row->set(run.config, recorded_value(*row, value));
    run.keys.push_back(key);
  }
  return run;
}

std::string option_text(const RunOption& option, const TrainConfig& config) {
  const std::string name = "--" + std::string(option.name);
  const OptionValue value = option.option_value(config);
  if (option.type == OptionType::flag) return std::get<bool>(value) ? name : "";
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    std::string text;
    for (const std::string& item : *list) text += fmt::format("{}{} '{}'", text.empty() ? "" : " ", name, item);
    return text;
  }
  if (const auto* text = std::get_if<std::string>(&value)) return fmt::format("{} '{}'", name, *text);
  return fmt::format("{} {}", name, option_value_text(value));
}

}  // namespace ampscope::samples
