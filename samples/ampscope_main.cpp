// The `ampscope` command. Library code throws; this is the one place that turns an error into a
// message and an exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "samples/demo.h"
#include "samples/train_command.h"

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

  CLI11_PARSE(app, argc, argv);
  try {
    if (demo_cmd->parsed()) return ampscope::run_demo(demo);
    if (train.parsed()) return train.run();
  } catch (const ampscope::Error& e) {
    fmt::print(stderr, "ampscope: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ampscope: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
