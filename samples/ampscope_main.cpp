// The `ampscope` command. Library code throws; this is the one place that turns an error into a
// message and an exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <string_view>

#include "core/error.h"
#include "samples/demo.h"
#include "samples/report_command.h"
#include "samples/train_command.h"

namespace {

// The subcommand the command line names: its first argument that is not an option.
std::string_view subcommand_of(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] != '-') return argv[i];
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampscope: find out why mixed-precision (FP16/BF16) training goes wrong"};
  app.require_subcommand(1);

  ampscope::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand("demo", "Show the tensors and backends at work: exact FP16/BF16 rounding, "
                                                  "views, seeded random tensors, and CPU/GPU agreement");
  demo_cmd->add_option("--device", demo.device, "Where to run: auto (the GPU when one is present), cpu or cuda[:N]")
      ->capture_default_str();
  demo_cmd->add_option("--seed", demo.seed, "Seed of the random tensors")->capture_default_str();

  ampscope::samples::TrainCommand train(app);
  ampscope::samples::ReportCommand report(app);
  ampscope::samples::DiffCommand diff(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);  // prints the message (or the help, status 0)
    // report and diff promise 2 for a usage error, so a CI job can tell it from "anomalies found" (1);
    // CLI11's own parse-error statuses are 100 and up.
    const std::string_view sub = subcommand_of(argc, argv);
    if (status != 0 && (report.parsed() || diff.parsed() || sub == "report" || sub == "diff"))
      return ampscope::samples::kExitUsage;
    return status;
  }
  try {
    if (demo_cmd->parsed()) return ampscope::run_demo(demo);
    if (train.parsed()) return train.run();
    if (report.parsed()) return report.run();
    if (diff.parsed()) return diff.run();
  } catch (const ampscope::Error& e) {
    fmt::print(stderr, "ampscope: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ampscope: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
