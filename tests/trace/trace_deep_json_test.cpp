// A trace whose config or probe attribute is JSON nested 10^6 levels deep (issue 36; anyone can write such a
// trace, checksums included): the reader leaves the attribute out with a damage note instead of handing it
// to what parses it later (the report, fix, the rank comparison), where building and printing the value
// recursed once per level and crashed at about 65,000; `ampscope report` on it then runs to its end. JSON as
// deep as the limit (128) is kept as it is.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "cli/report_command.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "tests/test_support.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;

fs::path write_trace(const std::string& name, const std::string& config, const std::string& probe) {
  const fs::path path = ampscope::testing::process_scratch_dir("ampscope_trace_deep_json") / name;
  fs::remove(path);
  RunInfo info = testing::sample_run();
  info.config = config;
  info.probe = probe;
  TraceWriter w(path, info);
  w.write(StepRow{.step = 0, .loss = 1.5});
  w.end_step(0);
  w.close();
  return path;
}

TEST(trace_deep_json_test, a_config_or_probe_nested_a_million_levels_deep_is_left_out_with_a_note) {
  std::string objects;
  for (int i = 0; i < 1'000'000; ++i) objects += "{\"a\":";
  const fs::path path = write_trace("deep.h5", "{\"lr\": " + std::string(1'000'000, '['), objects);
  const TraceReader r(path);
  ASSERT_EQ(r.damage().size(), 2u);
  // {"lr": puts the first '[' at byte 7 (level 2), so level 129 opens at byte 134; in the probe, level 129 is
  // the 129th {"a": (5 bytes each), at byte 640.
  EXPECT_EQ(r.damage()[0], "the root attribute 'config' is left out: its JSON arrays and objects nest deeper than 128 "
                           "levels (byte offset 134, at 'lr[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]"
                           "[0][0][0][0][0][0][0]...')");
  EXPECT_EQ(r.damage()[1].rfind("the root attribute 'probe' is left out: its JSON arrays and objects nest deeper than "
                                 "128 levels (byte offset 640, at 'a.a.a.",
                                 0),
            0u)
      << r.damage()[1];
  EXPECT_EQ(r.run_info().config, "");
  EXPECT_EQ(r.run_info().probe, "");
  EXPECT_EQ(r.row_counts().steps, 1);

  // The report reads it to its end (it crashed on the config before).
  std::ostringstream out, err;
  samples::ReportRequest request;
  request.trace = path.string();
  request.json = true;
  const int code = samples::run_report(request, out, err);
  EXPECT_TRUE(code == samples::kExitClean || code == samples::kExitFound) << code << err.str();
}

TEST(trace_deep_json_test, json_as_deep_as_the_limit_is_kept) {
  const std::string config = "{\"lr\": " + std::string(127, '[') + std::string(127, ']') + "}";  // 128 levels
  const fs::path path = write_trace("limit.h5", config, R"({"level": "summary"})");
  const TraceReader r(path);
  EXPECT_TRUE(r.damage().empty());
  EXPECT_EQ(r.run_info().config, config);
  // Not JSON at all: a note, and the text kept (older writers put a bare nan in the config).
  const TraceReader bad(write_trace("nan.h5", R"({"lr": nan})", ""));
  ASSERT_EQ(bad.damage().size(), 1u);
  EXPECT_EQ(bad.damage()[0], "the root attribute 'config' is not valid JSON");
  EXPECT_EQ(bad.run_info().config, R"({"lr": nan})");
}

}  // namespace
}  // namespace ampscope::trace
