// samples/run_options.h: the one definition of the run's options. One row per field of TrainConfig
// (samples/task.h): the option's name, its type, the field it sets (whose default is TrainConfig's own),
// the values `ampscope train` allows, its help, and how a trace's config JSON records it. Everything else
// is derived from this table by cli/run_options_io.h: the command-line options and the TOML keys of
// `ampscope train`, the merge (command line over config file over defaults), the config JSON written into
// every trace and the JSON `ampscope fix` reads back and replays. A field added to TrainConfig without a
// row fails tests/train/run_options_table_test.cpp.
//
//   for (const RunOption& o : run_options()) fmt::print("--{}  {}\n", o.name, o.help);
//   const RunOption& lr = find_run_option("lr");
//   if (auto bad = lr.refusal(config)) ...  // bad->value "nan", bad->expected "a finite number > 0 (...)"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "samples/task.h"

namespace ampscope::samples {

// The largest --batch accepted (a batch beyond it would not fit in memory for any sample).
inline constexpr std::int64_t kMaxBatch = 65536;
// The longest --fp8-amax-history (one float per step per quantized tensor) and the largest --fp8-margin
// (448 / 2^64 is already far below any amax a scale is made for).
inline constexpr std::int64_t kMaxFp8AmaxHistory = 1 << 20;
inline constexpr std::int64_t kMaxFp8Margin = 64;

// TrainConfig's fields that are not options, so have no row: `scenario_applied` (set by `ampscope fix`
// when it replays a recorded configuration), `process_group` (the group a --ddp run is one rank of) and
// `keep_losses` (whether train() keeps every step's loss in memory: a library caller's choice; `ampscope
// train` turns it off, since its on_step already sees each step).
inline constexpr std::size_t kInternalTrainConfigFields = 3;

enum class OptionType {
  text,    // a string
  path,    // a string naming a file or folder: relative to a config file's folder when it comes from one
  choice,  // one of `choices`
  integer, // std::int64_t
  seed,    // std::uint64_t (0 and up)
  number,  // double
  flag,    // bool: a flag on the command line (given: true)
  list,    // strings; a repeatable option, a TOML array
};

// When the trace's config JSON (the root attribute `config`) holds a field. The JSON lists the fields in
// table order; these conditions keep it the text it has always been.
enum class Recorded {
  always,
  with_checkpoint,  // only when the run saved a checkpoint (`checkpoint` set)
  with_model,       // only in a model-folder run (`model` set)
  without_model,    // only in a run of a sample (`model` not set): a model-folder run trains no sample
  with_ranks,       // only in a run of more than one rank, after its `world_size` and `rank`
  with_fp8,         // only in an FP8 run (`precision` fp8): the per-tensor recipes' options
  with_quantized,   // in a run whose Linears are quantized (`precision` fp8, mxfp8 or nvfp4): --fp8-keep-*
  with_mxfp8,       // only in an MXFP8 run (`precision` mxfp8)
  with_nvfp4,       // only in an NVFP4 run (`precision` nvfp4)
  never,            // not recorded: RunOption::not_recorded says why
};

// How a recorded path is written: as the run was given it, or made absolute ("" stays "").
enum class RecordedPath { as_given, absolute, absolute_in_model_runs };

// A value as the surfaces see it (a precision as its name).
using OptionValue = std::variant<std::string, std::int64_t, std::uint64_t, double, bool, std::vector<std::string>>;

// What a refused value was and what is allowed: "-1", "an integer >= 0".
struct Refusal {
  std::string value;
  std::string expected;
};

using OptionField = std::variant<std::string TrainConfig::*, std::int64_t TrainConfig::*, std::uint64_t TrainConfig::*,
                                 double TrainConfig::*, bool TrainConfig::*, std::vector<std::string> TrainConfig::*,
                                 Precision TrainConfig::*>;

struct RunOption {
  std::string_view name;  // the command-line option without its dashes, and the TOML key: "init-scale"
  OptionType type;
  OptionField field;
  std::string_view help;
  std::string_view json_key{};  // the key in the trace's config JSON; "" with Recorded::never
  Recorded recorded = Recorded::always;
  bool recorded_when_set = false;  // recorded only when it differs from the default (eval, fp16_clamp, ...)
  RecordedPath recorded_path = RecordedPath::as_given;
  std::string_view not_recorded{};  // why a field is not recorded (Recorded::never)
  // The option says the opposite of the field (--no-scaler: use_scaler = false; its JSON key is the field's).
  bool negated = false;
  // Given (and, for a flag, true), the option also turns this flag on: --twin-every N implies --twin.
  std::string_view implies{};
  // false: no command-line option and no TOML key (zero_grad, which only the scenarios change); the
  // config JSON still records it and `ampscope fix` replays it.
  bool user_option = true;
  std::vector<std::string_view> choices{};  // OptionType::choice
  // train's check of one value: nullopt when allowed.
  std::optional<Refusal> (*check)(const OptionValue& field_value) = nullptr;

  // The field's value in `config` (not negated; a precision as its name).
  OptionValue get(const TrainConfig& config) const;
  // Sets the field (not negated). Throws Error on a value of the wrong type, or an unknown precision.
  void set(TrainConfig& config, const OptionValue& value) const;
  // The option's value: the field's, negated where the option is (--no-scaler true: use_scaler false).
  OptionValue option_value(const TrainConfig& config) const;
  // Applies the option's value as the command line or a config file gives it: the field (negated where
  // the option is) and what it implies.
  void apply(TrainConfig& config, const OptionValue& option_value) const;
  bool is_default(const TrainConfig& config) const;
  // train's check of this field's value in `config`; nullopt when allowed.
  std::optional<Refusal> refusal(const TrainConfig& config) const;
};

// Every option, in the order the trace's config JSON lists them (and `ampscope train --help` shows them).
const std::vector<RunOption>& run_options();
// The row of an option name ("init-scale") or a JSON key ("init_scale"); null when none.
const RunOption* find_run_option(std::string_view name);
const RunOption* find_recorded_option(std::string_view json_key);

// A value as messages show it: "0.001", "nan", "'a b'", "true", "['x', 'y']".
std::string option_value_text(const OptionValue& value);

// train's check of every field of `config`: throws Error "--lr: nan is not allowed; expected a finite number
// > 0 (0: the sample's default)" for the first value it refuses, in table order.
void check_run_options(const TrainConfig& config);

}  // namespace ampscope::samples
