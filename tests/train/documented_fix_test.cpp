// The advice the docs and `ampscope train --help` give for keeping attention in f32 must fix the README's
// demo (the transformer with the attention-overflow scenario, in fp16): each pattern they suggest is read
// from the help text and from docs/api.md and docs/amp.md, applied to that run the way a user would (the
// command-line option, or the C++ AutocastOverrideGuard the docs show), and the run must skip no step,
// record no NaN/inf origin, and analyse as healthy. The pattern the docs used to suggest,
// 'blocks.*.attn.*', is checked to still fail, so the test tells the two apart.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/autocast.h"
#include "probes/analysis/analysis.h"
#include "probes/trace/reader.h"
#include "cli/train_command.h"
#include "tests/test_support.h"

#ifndef AMPSCOPE_SOURCE_DIR
#error "AMPSCOPE_SOURCE_DIR must name the source tree (for the docs)"
#endif

namespace ampscope::samples {
namespace {

std::filesystem::path temp_dir() {
  return ampscope::testing::process_scratch_dir("ampscope_documented_fix");
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> matches(const std::string& text, const std::regex& re) {
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1].str());
  return out;
}

// The patterns `ampscope train --help` gives as examples on the --autocast-fp32 line.
std::vector<std::string> help_patterns() {
  CLI::App app;
  TrainCommand train(app);
  const std::string help = app.get_subcommand("train")->help();
  std::istringstream lines(help);
  std::string line, option_text;
  bool in_option = false;
  while (std::getline(lines, line)) {
    // The option's description may continue on following lines; it ends at the next option.
    if (line.find("--autocast-fp32") != std::string::npos) in_option = true;
    else if (in_option && line.find(" --") != std::string::npos) break;
    if (in_option) option_text += line + "\n";
  }
  EXPECT_FALSE(option_text.empty()) << "no --autocast-fp32 in:\n" << help;
  return matches(option_text, std::regex(R"re('([^'\s]+)')re"));  // quoted, without spaces: a glob
}

// The demo as the README runs it, fp16, with `args` added; parsed like the command line.
TrainConfig demo_config(const std::vector<std::string>& extra, const std::filesystem::path& out) {
  std::vector<std::string> args = {"ampscope", "train", "--sample", "transformer", "--scenario", "attention-overflow",
                                   "--precision", "fp16", "--device", "cpu", "--out", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  CLI::App app;
  TrainCommand train(app);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  bool compare = false;
  return train.resolve(compare);
}

struct Outcome {
  TrainResult result;
  analysis::Report report;
};

Outcome run_demo(const TrainConfig& c) {
  Outcome o;
  o.result = train(c);
  trace::TraceReader reader(c.out);
  o.report = analysis::analyse(reader);
  return o;
}

void expect_fixed(const Outcome& o, const std::string& how) {
  EXPECT_GT(o.result.steps, 0) << how;
  EXPECT_EQ(o.result.skipped, 0) << how << ": the scaler still skipped steps";
  EXPECT_EQ(o.result.anomalies, 0) << how << ": NaN/inf origins were still recorded";
  for (double loss : o.result.losses) EXPECT_TRUE(std::isfinite(loss)) << how;
  EXPECT_TRUE(o.report.healthy()) << how << ": the report still finds " << o.report.anomalies.size()
                                  << " anomalies, first: "
                                  << (o.report.anomalies.empty() ? "" : o.report.anomalies[0].cause);
}

TEST(documented_fix_test, the_demo_fails_without_a_fix_and_with_the_pattern_the_docs_used_to_give) {
  const Outcome plain = run_demo(demo_config({}, temp_dir() / "plain.h5"));
  EXPECT_EQ(plain.result.skipped, plain.result.steps);
  EXPECT_FALSE(plain.report.healthy());
  // 'blocks.*.attn.*' matches only the attention module's children (qkv, proj): the scores' bmm runs in
  // 'blocks.0.attn' itself and still overflows.
  const Outcome children = run_demo(demo_config({"--autocast-fp32", "blocks.*.attn.*"}, temp_dir() / "children.h5"));
  EXPECT_EQ(children.result.skipped, children.result.steps);
  EXPECT_FALSE(children.report.healthy());
}

TEST(documented_fix_test, every_pattern_train_help_suggests_fixes_the_demo) {
  const std::vector<std::string> patterns = help_patterns();
  ASSERT_FALSE(patterns.empty()) << "--autocast-fp32's help gives no example pattern";
  for (const std::string& p : patterns) {
    const auto out = temp_dir() / "help.h5";
    expect_fixed(run_demo(demo_config({"--autocast-fp32", p}, out)), "--autocast-fp32 '" + p + "' (from --help)");
  }
}

TEST(documented_fix_test, every_attention_pattern_in_the_api_and_amp_docs_fixes_the_demo) {
  // The C++ form the docs show, AutocastOverrideGuard({.module = "..."}), installed around the run, and the
  // command-line form they mention.
  std::set<std::string> modules, options;
  for (const char* doc : {"docs/api.md", "docs/amp.md"}) {
    const std::string text = read_text(std::filesystem::path(AMPSCOPE_SOURCE_DIR) / doc);
    for (const std::string& m : matches(text, std::regex(R"re(\.module = "([^"]*attn[^"]*)")re"))) modules.insert(m);
    for (const std::string& m : matches(text, std::regex(R"re(--autocast-fp32 '([^']*attn[^']*)')re"))) options.insert(m);
  }
  ASSERT_FALSE(modules.empty()) << "no AutocastOverrideGuard example for attention in docs/api.md or docs/amp.md";
  for (const std::string& m : modules) {
    AutocastOverrideGuard guard({.module = m, .precision = ampscope::Precision::f32});
    expect_fixed(run_demo(demo_config({}, temp_dir() / "api.h5")), "AutocastOverrideGuard({.module = \"" + m + "\"})");
  }
  ASSERT_FALSE(options.empty()) << "no --autocast-fp32 example for attention in docs/api.md or docs/amp.md";
  for (const std::string& p : options) {
    expect_fixed(run_demo(demo_config({"--autocast-fp32", p}, temp_dir() / "docs.h5")), "--autocast-fp32 '" + p + "' (docs)");
  }
}

}  // namespace
}  // namespace ampscope::samples
