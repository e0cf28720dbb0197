// The `ampscope` command. Library code throws; this is the one place that turns an error into a
// message and an exit status.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "cli/demo.h"
#include "cli/export_command.h"
#include "cli/fix_command.h"
#include "cli/record_command.h"
#include "cli/program.h"
#include "cli/report_command.h"
#include "cli/suggest.h"
#include "cli/tokenize_command.h"
#include "cli/train_command.h"

namespace {

// Before CLI11 parses: a missing or unknown command gets a message naming the commands (CLI11's own is "A
// subcommand is required", even when one was typed), a "did you mean" for a typo, and the viewer's program
// for `ampscope view`. Returns the exit status to end with, or -1 to go on.
int check_command(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  int first = 1;
  while (first < argc && std::string_view(argv[first]) == "--verbose") ++first;  // the one option before a command
  if (first >= argc) {
    fmt::print(stderr, "ampscope: error: no command given; the commands are {}\nhint: ampscope train --help, or "
               "ampscope --help for every command\n", listed);
    return ampscope::samples::kExitUsage;
  }
  const std::string typed = argv[first];
  if (typed.starts_with("-") || std::find(names.begin(), names.end(), typed) != names.end()) return -1;
  std::string hint;
  if (typed == "view" || typed == "viewer" || typed == "ampscope-view") {
    hint = "the viewer is a program of its own: ampscope-view TRACE.h5 [TRACE2.h5]";
  } else if (const std::string near = ampscope::samples::closest_name(typed, names); !near.empty()) {
    hint = fmt::format("did you mean 'ampscope {}'?", near);
  } else {
    hint = "ampscope --help describes each command";
  }
  fmt::print(stderr, "ampscope: error: unknown command '{}'; the commands are {}\nhint: {}\n", typed, listed, hint);
  return ampscope::samples::kExitUsage;
}

// CLI11's parse errors in ampscope's voice: the `ampscope: error:` prefix every other error has, the
// command named, "did you mean" for a mistyped option, and a hint. `command` is the subcommand typed (may be
// null when none parsed).
std::string explain_parse_error(const CLI::ParseError& e, const CLI::App* command, int argc, char** argv) {
  const std::string name = command ? "ampscope " + command->get_name() : std::string("ampscope");
  const std::string help = fmt::format("hint: {} --help lists its options", name);
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && command != nullptr) {
    // Which typed words are unknown options, and the known option each is closest to.
    std::vector<std::string> known;
    for (const CLI::Option* o : command->get_options()) {
      for (const std::string& l : o->get_lnames()) known.push_back("--" + l);
      for (const std::string& sn : o->get_snames()) known.push_back("-" + sn);
    }
    for (int i = 1; i < argc; ++i) {
      std::string word = argv[i];
      if (!word.starts_with("-") || word == "-" || word == "--") continue;
      if (const auto eq = word.find('='); eq != std::string::npos) word.resize(eq);
      if (std::find(known.begin(), known.end(), word) != known.end()) continue;
      const std::string near = ampscope::samples::closest_name(word, known);
      return fmt::format("{}: unknown option '{}'{}\n{}", name, word,
                         near.empty() ? "" : fmt::format("; did you mean '{}'?", near), help);
    }
    return fmt::format("{}: {}\n{}", name, what, help);
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // "Could not convert: --steps = 1.5"
    const std::string prefix = "Could not convert: ";
    if (what.starts_with(prefix)) {
      const std::string rest = what.substr(prefix.size());
      if (const auto eq = rest.find(" = "); eq != std::string::npos) {
        const std::string option = rest.substr(0, eq), value = rest.substr(eq + 3);
        const CLI::Option* o = command ? command->get_option_no_throw(option) : nullptr;
        const std::string type = o ? o->get_type_name() : "";
        const std::string expected = type == "INT" || type == "UINT" ? "a whole number"
                                     : type == "FLOAT"              ? "a number"
                                                                    : "a value of " + (type.empty() ? "its type" : type);
        return fmt::format("{}: {}: '{}' is not {}\n{}", name, option, value, expected, help);
      }
    }
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && command != nullptr) {
    if (command->get_name() == "diff")
      return fmt::format("{}: needs two traces, a and b: ampscope diff A.h5 B.h5 (the first is the reference)\n{}",
                         name, help);
    // "trace is required": a positional argument.
    if (what.ends_with(" is required")) {
      const std::string arg = what.substr(0, what.size() - std::string(" is required").size());
      return fmt::format("{}: the {} argument is missing\n{}", name, arg, help);
    }
  }
  return fmt::format("{}: {}\n{}", name, what, help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 0) ampscope::samples::set_program_path(argv[0]);
  CLI::App app{"ampscope: find out why mixed-precision (FP16/BF16) training goes wrong"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("--verbose", verbose, "On errors, also print HDF5's own error stack");

  ampscope::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand("demo", "Show the tensors and backends at work: exact FP16/BF16 rounding, "
                                                  "views, seeded random tensors, and CPU/GPU agreement");
  demo_cmd->add_option("--device", demo.device, "Where to run: auto (the GPU when one is present), cpu or cuda[:N]")
      ->capture_default_str();
  demo_cmd->add_option("--seed", demo.seed, "Seed of the random tensors")->capture_default_str();

  ampscope::samples::TrainCommand train(app);
  ampscope::samples::ReportCommand report(app);
  ampscope::samples::DiffCommand diff(app);
  ampscope::samples::ExportCommand export_cmd(app);
  ampscope::samples::FixCommand fix(app);
  ampscope::samples::RecordCommand record(app);
  ampscope::samples::TokenizeCommand tokenize(app);
  // --verbose after the subcommand's name works too.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) sub->fallthrough();
  if (const int status = check_command(app, argc, argv); status >= 0) return status;

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help and the like: printed, status 0
    const CLI::App* command = nullptr;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      if (sub->parsed()) command = sub;
    fmt::print(stderr, "ampscope: error: {}\n", explain_parse_error(e, command, argc, argv));
    // Every command exits 2 on a usage error (docs/training.md), so a CI job can tell it from "anomalies
    // found" (1); CLI11's own parse-error statuses are 100 and up.
    return ampscope::samples::kExitUsage;
  }
  try {
    if (demo_cmd->parsed()) return ampscope::run_demo(demo);
    if (train.parsed()) return train.run();
    if (report.parsed()) return report.run(verbose);
    if (diff.parsed()) return diff.run(verbose);
    if (export_cmd.parsed()) return export_cmd.run(verbose);
    if (fix.parsed()) return fix.run();
    if (record.parsed()) return record.run(argv[0]);
    if (tokenize.parsed()) return tokenize.run();
  } catch (const ampscope::Error& e) {
    // Usage and file errors (a bad value, a missing or damaged file): 2, as report and diff.
    fmt::print(stderr, "ampscope: error: {}\n", verbose ? std::string(e.what()) : ampscope::samples::without_hdf5_stack(e.what()));
    return ampscope::samples::kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ampscope: internal error: {}\n", e.what());
    return ampscope::samples::kExitUsage;
  }
  return 0;
}
