// `ampscope report` and `ampscope diff` through run_report / run_diff (cli/report_command.h), on traces
// written in the test by short CPU training runs: exit 0 for a healthy run, 1 for a scenario (log-zero:
// docs/scenarios.md puts its first origin at log, outside any module, step 0), 2 with the reader's message
// for a missing file and a file that is not HDF5; JSON and --output; a trace whose writer never closed it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "probes/trace/writer.h"
#include "cli/report_command.h"
#include "cli/run.h"

namespace ampscope::samples {
namespace {

using nlohmann::json;

bool contains(const std::string& text, const std::string& piece) { return text.find(piece) != std::string::npos; }

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / fmt::format("ampscope_render_{}_{}", ::getpid(), name);
}

// One trace per (scenario, precision), written once per test program and removed at exit.
class Traces : public ::testing::Environment {
 public:
  static std::string get(const std::string& scenario, Precision precision) {
    const std::string key = fmt::format("{}-{}", scenario.empty() ? "plain" : scenario, precision_name(precision));
    auto found = paths().find(key);
    if (found != paths().end()) return found->second;
    const std::string path = temp_path(key + ".h5").string();
    TrainConfig c;
    c.sample = "mlp";
    c.scenario = scenario;
    c.precision = precision;
    c.device = "cpu";
    c.steps = 3;
    c.out = path;
    train(c);
    return paths().emplace(key, path).first->second;
  }
  void TearDown() override {
    for (const auto& [key, path] : paths()) std::filesystem::remove(path);
  }

 private:
  static std::map<std::string, std::string>& paths() {
    static std::map<std::string, std::string> p;
    return p;
  }
};
[[maybe_unused]] const auto* const kTraces = ::testing::AddGlobalTestEnvironment(new Traces);

struct Result {
  int status = -1;
  std::string out, err;
};

Result report(ReportRequest request) {
  std::ostringstream out, err;
  Result r;
  r.status = run_report(request, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

Result compare(DiffRequest request) {
  std::ostringstream out, err;
  Result r;
  r.status = run_diff(request, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

TEST(report_command_test, exits_0_on_a_healthy_run_and_says_so_first) {
  const Result r = report({.trace = Traces::get("", Precision::fp32)});
  EXPECT_EQ(r.status, kExitClean) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("OK: no NaN/Inf found in 3 steps", 0), 0u) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
  EXPECT_FALSE(contains(r.out, "\x1b[")) << r.out;
}

TEST(report_command_test, exits_1_on_the_log_zero_scenario_and_names_its_origin_first) {
  const Result r = report({.trace = Traces::get("log-zero", Precision::fp16)});
  EXPECT_EQ(r.status, kExitFound) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("FIRST ANOMALY: step 0, forward, log (outside any module)", 0), 0u) << r.out;
  EXPECT_TRUE(contains(r.out, "  cause: log_of_zero: ")) << r.out;
  EXPECT_TRUE(contains(r.out, "log_softmax")) << r.out;  // the remedy
}

TEST(report_command_test, colours_the_text_only_when_asked) {
  const std::string trace = Traces::get("log-zero", Precision::fp16);
  EXPECT_TRUE(contains(report({.trace = trace, .colour = true}).out, "\x1b["));
  EXPECT_FALSE(contains(report({.trace = trace, .json = true, .colour = true}).out, "\x1b["));  // JSON never
}

TEST(report_command_test, json_gives_the_same_diagnosis_as_the_text) {
  const Result r = report({.trace = Traces::get("log-zero", Precision::fp16), .json = true});
  EXPECT_EQ(r.status, kExitFound);
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema_version"], 2);
  EXPECT_EQ(j["healthy"], false);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["run"]["precision"], "fp16");
  EXPECT_EQ(j["run"]["model"], "mlp");
  ASSERT_FALSE(j["anomalies"].empty());
  EXPECT_EQ(j["anomalies"][0]["op"], "log");
  EXPECT_EQ(j["anomalies"][0]["module"], "");
  EXPECT_EQ(j["anomalies"][0]["cause"], "log_of_zero");
  EXPECT_EQ(j["anomalies"][0]["step"], 0);
}

TEST(report_command_test, writes_the_report_to_the_output_file_instead_of_stdout) {
  const auto file = temp_path("report.json");
  const Result r = report({.trace = Traces::get("", Precision::fp32), .json = true, .output = file.string()});
  EXPECT_EQ(r.status, kExitClean) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  std::ifstream in(file);
  const json j = json::parse(in);
  EXPECT_EQ(j["healthy"], true);
  std::filesystem::remove(file);
}

TEST(report_command_test, exits_2_when_the_output_file_cannot_be_written) {
  const Result r = report({.trace = Traces::get("", Precision::fp32), .output = "/nonexistent-folder/report.txt"});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_TRUE(contains(r.err, "ampscope report: error: cannot write '/nonexistent-folder/report.txt'")) << r.err;
  EXPECT_TRUE(contains(r.err, "hint:")) << r.err;
}

TEST(report_command_test, exits_2_on_a_missing_file_with_the_readers_message) {
  const Result r = report({.trace = "/no/such/run.h5"});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(contains(r.err, "ampscope report: error: cannot read trace '/no/such/run.h5': no such file")) << r.err;
  EXPECT_TRUE(contains(r.err, "hint:")) << r.err;
}

TEST(report_command_test, exits_2_on_a_file_that_is_not_hdf5) {
  const auto file = temp_path("notes.h5");
  std::ofstream(file) << "these are notes, not a trace\n";
  const Result r = report({.trace = file.string()});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_TRUE(contains(r.err, fmt::format("ampscope report: error: cannot read trace '{}': not an HDF5 file", file.string())))
      << r.err;
  EXPECT_TRUE(contains(r.err, "hint:")) << r.err;
  std::filesystem::remove(file);
}

TEST(report_command_test, exits_0_on_a_trace_without_any_step) {
  // `ampscope train --steps 0` writes one; its analysis divided by zero op rows per step (SIGFPE).
  const auto file = temp_path("no-steps.h5");
  {
    trace::TraceWriter w(file, {.precision = "fp16", .device = "cpu", .model = "mlp", .seed = 0, .config = "{}"});
    w.close();
  }
  const Result r = report({.trace = file.string()});
  EXPECT_EQ(r.status, kExitClean) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("OK: no NaN/Inf found in 0 steps", 0), 0u) << r.out;
  std::filesystem::remove(file);
}

TEST(report_command_test, refuses_nan_and_negative_values_of_the_numeric_options) {
  // CLI11's Range and NonNegativeNumber let "nan" through (every comparison with NaN is false); a NaN threshold
  // would make every finite difference "not above the threshold".
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"report", "--headroom-factor", "nan", "x.h5"},
        std::vector<std::string>{"report", "--underflow-fraction", "nan", "x.h5"},
        std::vector<std::string>{"report", "--underflow-fraction", "1.5", "x.h5"},
        std::vector<std::string>{"diff", "--threshold", "nan", "x.h5", "y.h5"},
        std::vector<std::string>{"diff", "--threshold", "-0.1", "x.h5", "y.h5"}}) {
    CLI::App app;
    ReportCommand report_cmd(app);
    DiffCommand diff_cmd(app);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes a reversed vector
    EXPECT_THROW(app.parse(reversed), CLI::ValidationError) << args[1] << " " << args[2];
  }
  CLI::App app;
  DiffCommand diff_cmd(app);
  std::vector<std::string> ok = {"y.h5", "x.h5", "inf", "--threshold", "diff"};  // only NaN/inf counts diverge
  EXPECT_NO_THROW(app.parse(ok));
}

TEST(report_command_test, analyses_a_trace_whose_writer_never_closed_it_with_a_note) {
  const auto file = temp_path("killed.h5");
  {
    trace::TraceWriter w(file, {.precision = "fp16", .device = "cpu", .model = "hand", .seed = 1, .config = "{}"});
    for (std::int64_t step = 0; step < 2; ++step) {
      trace::StepRow s;
      s.step = step;
      s.loss = 1.0;
      w.write(s);
      trace::OpRow op;
      op.step = step;
      op.seq = 0;
      op.op = "linear";
      op.module = "fc1";
      op.in_dtypes = "f16,f16,f16";
      op.out_dtype = "f16";
      op.shape = "[2, 2]";
      op.health.numel = 4;
      op.health.min = op.health.max = op.health.absmax = op.health.mean = op.health.rms = 1.0;
      w.write(op);
      w.end_step(step);
    }
  }  // destroyed without close(): complete = 0, as after a kill
  const Result text = report({.trace = file.string()});
  EXPECT_EQ(text.status, kExitClean) << text.out << text.err;
  EXPECT_TRUE(contains(text.out, "NOTE: the trace is incomplete")) << text.out;
  const Result js = report({.trace = file.string(), .json = true});
  EXPECT_EQ(json::parse(js.out)["complete"], false);
  EXPECT_TRUE(contains(js.err, "ampscope report: note: '" + file.string() + "' is incomplete")) << js.err;
  std::filesystem::remove(file);
}

TEST(diff_command_test, exits_0_when_a_trace_is_compared_with_itself) {
  const std::string trace = Traces::get("", Precision::fp32);
  const Result r = compare({.a = trace, .b = trace});
  EXPECT_EQ(r.status, kExitClean) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("NO OP DIVERGENCE", 0), 0u) << r.out;
}

TEST(diff_command_test, exits_1_when_fp16_log_zero_parts_from_fp32) {
  const Result r = compare({.a = Traces::get("log-zero", Precision::fp32), .b = Traces::get("log-zero", Precision::fp16),
                            .json = true});
  EXPECT_EQ(r.status, kExitFound) << r.out << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["diverged"], true);
  EXPECT_EQ(j["run_a"]["precision"], "fp32");
  EXPECT_EQ(j["run_b"]["precision"], "fp16");
  EXPECT_FALSE(j["dtype_differences"].empty());
}

TEST(diff_command_test, exits_2_when_either_trace_is_missing) {
  const Result r = compare({.a = Traces::get("", Precision::fp32), .b = "/no/such/b.h5"});
  EXPECT_EQ(r.status, kExitUsage);
  EXPECT_TRUE(contains(r.err, "ampscope diff: error: cannot read trace '/no/such/b.h5': no such file")) << r.err;
}

}  // namespace
}  // namespace ampscope::samples
