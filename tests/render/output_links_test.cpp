// Every command that writes beside an input writes through core/io/output_file.h (issue 36): a symbolic
// link, a FIFO or a device planted under an output name is refused and never written through; a regular
// file is replaced by rename. Checked through the commands' own entry points (report and diff --output,
// export's CSV files, train's kept checkpoints) and on OutputFile itself, from the outside: the target of a
// planted link keeps its bytes and its mtime, a dangling link's target is never created, a FIFO is refused
// without being opened (an open would block the test).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/io/output_file.h"
#include "cli/export_command.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "tests/test_support.h"

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = process_scratch_dir("ampscope_output_links") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A file outside `dir` and a link to it planted in `dir` under `name`.
fs::path plant_link(const fs::path& dir, const std::string& name) {
  const fs::path elsewhere = process_scratch_dir("ampscope_output_links") / "elsewhere";
  fs::create_directories(elsewhere);
  const fs::path target = elsewhere / (dir.filename().string() + "-" + name);
  std::ofstream(target) << "precious bytes\n";
  fs::create_symlink(target, dir / name);
  return target;
}

std::string trace_in(const fs::path& dir) {
  samples::TrainConfig c;
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 2;
  c.out = (dir / "t.h5").string();
  samples::train(c);
  return c.out;
}

TEST(output_links_test, output_file_replaces_a_regular_file_and_refuses_links_fifos_and_folders) {
  const fs::path dir = fresh_dir("unit");
  // A regular file is replaced, whole.
  std::ofstream(dir / "a.txt") << "old contents, longer than the new ones\n";
  write_output_file(dir / "a.txt", "new\n");
  EXPECT_EQ(file_snapshot(dir / "a.txt").bytes, "new\n");
  // A link, to a file or to nothing: refused, the target untouched (or never created).
  const fs::path target = plant_link(dir, "b.txt");
  const FileSnapshot before = file_snapshot(target);
  EXPECT_THROW_MSG(write_output_file(dir / "b.txt", "x", "the results file"), Error,
                   "the results file '" + (dir / "b.txt").string() + "' is a symbolic link (to '" + target.string() + "')",
                   "hint: remove the link");
  EXPECT_TRUE(file_snapshot(target) == before);
  const fs::path absent = dir.parent_path() / "elsewhere" / "never-created";
  fs::create_symlink(absent, dir / "c.txt");
  EXPECT_THROW_MSG(write_output_file(dir / "c.txt", "x"), Error, "is a symbolic link");
  EXPECT_FALSE(fs::exists(absent));
  // A FIFO: refused from its kind, never opened (an open for writing would block without a reader).
  ASSERT_EQ(::mkfifo((dir / "d.txt").c_str(), 0600), 0);
  EXPECT_THROW_MSG(write_output_file(dir / "d.txt", "x"), Error, "exists and is a FIFO (named pipe), not a regular file");
  fs::create_directories(dir / "e.txt");
  EXPECT_THROW_MSG(write_output_file(dir / "e.txt", "x"), Error, "exists and is a folder");
  // A link that appears while the file is written is refused at commit, and the temporary file goes.
  {
    OutputFile f(dir / "f.txt");
    f.write("data");
    const fs::path late = plant_link(dir, "f.txt");
    EXPECT_THROW_MSG(f.commit(), Error, "is a symbolic link");
    EXPECT_EQ(file_snapshot(late).bytes, "precious bytes\n");
  }
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(output_links_test, report_and_diff_output_files_are_never_written_through_a_link) {
  const fs::path dir = fresh_dir("report");
  const std::string trace = trace_in(dir);
  const fs::path target = plant_link(dir, "report.json");
  const FileSnapshot before = file_snapshot(target);
  std::ostringstream out, err;
  samples::ReportRequest report;
  report.trace = trace;
  report.json = true;
  report.output = (dir / "report.json").string();
  EXPECT_EQ(samples::run_report(report, out, err), samples::kExitUsage);
  EXPECT_NE(err.str().find("ampscope report: error: '" + report.output + "' is a symbolic link"), std::string::npos)
      << err.str();
  EXPECT_TRUE(file_snapshot(target) == before);

  samples::DiffRequest diff;
  diff.a = trace;
  diff.b = trace;
  diff.output = report.output;
  std::ostringstream dout, derr;
  EXPECT_EQ(samples::run_diff(diff, dout, derr), samples::kExitUsage);
  EXPECT_NE(derr.str().find("is a symbolic link"), std::string::npos) << derr.str();
  EXPECT_TRUE(file_snapshot(target) == before);
}

TEST(output_links_test, export_refuses_a_link_under_a_csv_name_and_never_follows_the_old_temporary_names) {
  const fs::path dir = fresh_dir("export");
  const std::string trace = trace_in(dir);
  const fs::path csv = dir / "csv";
  fs::create_directories(csv);
  // The names the export used to write first (NAME.tmp): links there are now simply never opened.
  const fs::path old_temporary = plant_link(csv, "run.csv.tmp");
  const FileSnapshot old_before = file_snapshot(old_temporary);
  const fs::path target = plant_link(csv, "steps.csv");
  const FileSnapshot before = file_snapshot(target);
  std::ostringstream out, err;
  EXPECT_EQ(samples::run_export({.trace = trace, .dir = csv.string()}, out, err), samples::kExportFailed);
  EXPECT_NE(err.str().find("'" + (csv / "steps.csv").string() + "' is a symbolic link"), std::string::npos) << err.str();
  EXPECT_TRUE(file_snapshot(target) == before);
  EXPECT_TRUE(file_snapshot(old_temporary) == old_before);
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(csv / "run.csv")));  // written before steps.csv, as a file
}

TEST(output_links_test, train_never_writes_a_kept_checkpoint_through_a_link) {
  const fs::path dir = fresh_dir("kept");
  const fs::path target = plant_link(dir, "ck.step-2.h5");
  const FileSnapshot before = file_snapshot(target);
  samples::TrainConfig c;
  c.sample = "mlp";
  c.device = "cpu";
  c.steps = 3;
  c.checkpoint = (dir / "ck.h5").string();
  c.checkpoint_every = 1;
  c.keep_checkpoints = true;
  EXPECT_THROW_MSG(samples::train(c), Error,
                   "the kept checkpoint '" + (dir / "ck.step-2.h5").string() + "' is a symbolic link");
  EXPECT_TRUE(file_snapshot(target) == before);
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "ck.step-1.h5")));  // the one before it, as a file
  // A link under the checkpoint's own name: refused before the run starts.
  const fs::path main_target = plant_link(dir, "main.h5");
  const FileSnapshot main_before = file_snapshot(main_target);
  c.checkpoint = (dir / "main.h5").string();
  c.keep_checkpoints = false;
  EXPECT_THROW_MSG(samples::train(c), Error, "--checkpoint '" + c.checkpoint + "' is a symbolic link");
  EXPECT_TRUE(file_snapshot(main_target) == main_before);
  EXPECT_TRUE(fs::is_symlink(dir / "main.h5"));
}

}  // namespace
}  // namespace ampscope::testing
