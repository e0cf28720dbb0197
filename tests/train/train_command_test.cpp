// The `ampscope train` command line: option values, the TOML config file and its errors.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "cli/train_command.h"
#include "probes/trace/reader.h"
#include "tests/test_support.h"

namespace ampscope::samples {
namespace {

// Parses argv as `ampscope train ...` and runs the command.
int run_train(std::vector<std::string> args) {
  CLI::App app;
  TrainCommand train(app);
  args.insert(args.begin(), {"ampscope", "train"});
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return train.run();
}

std::string write_config(const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("ampscope_config_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << text;
  return path.string();
}

TEST(train_command_test, refuses_values_outside_the_valid_sets) {
  EXPECT_THROW(run_train({"--precision", "fp4"}), CLI::ValidationError);
  EXPECT_THROW(run_train({"--probe", "everything"}), CLI::ValidationError);
  EXPECT_THROW(run_train({"--seed", "-1"}), CLI::ValidationError);
  EXPECT_THROW_MSG(run_train({"--sample", "resnet"}), Error, "unknown sample 'resnet'", "mlp, cnn, transformer");
  EXPECT_THROW_MSG(run_train({"--scenario", "bogus"}), Error, "unknown scenario 'bogus'", "attention-overflow");
}

TEST(train_command_test, reads_a_toml_config_and_lets_the_command_line_win) {
  const std::string path = write_config(
      "[train]\nsample = \"cnn\"\nsteps = 3\nprecision = \"bf16\"\ninit-scale = 1024.0\n"
      "autocast-fp32 = [\"blocks.*.attn.*\"]\ncompare = true\n");
  CLI::App app;
  TrainCommand train(app);
  const std::vector<const char*> argv = {"ampscope", "train", "--config", path.c_str(), "--steps", "1"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  bool compare = false;
  const TrainConfig c = train.resolve(compare);
  EXPECT_EQ(c.sample, "cnn");
  EXPECT_EQ(c.steps, 1);  // the command line wins
  EXPECT_EQ(c.precision, Precision::bf16);
  EXPECT_EQ(c.init_scale, 1024.0);
  EXPECT_EQ(c.autocast_fp32, (std::vector<std::string>{"blocks.*.attn.*"}));
  EXPECT_TRUE(compare);
  std::filesystem::remove(path);
}

TEST(train_command_test, names_an_unknown_key_or_a_wrong_type_in_the_config_file) {
  std::string path = write_config("stepz = 3\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "unknown key 'stepz'", "steps", "init-scale");
  path = write_config("steps = \"three\"\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "'steps' must be an integer");
  path = write_config("steps = [\n");
  EXPECT_THROW_MSG(run_train({"--config", path}), Error, "cannot parse", "line");
  std::filesystem::remove(path);
}

// Every bad value is refused at parse time (before any training) with one line naming the option, the
// value and what is allowed.
struct BadOptionCase {
  std::vector<std::string> args;
  std::vector<std::string> message;  // pieces the error must contain
};

class BadOptionTest : public ::testing::TestWithParam<BadOptionCase> {};

TEST_P(BadOptionTest, is_refused_naming_the_option_the_value_and_what_is_allowed) {
  const BadOptionCase& c = GetParam();
  std::vector<std::string> args = {"--device", "cpu", "--steps", "1"};
  args.insert(args.end(), c.args.begin(), c.args.end());
  try {
    run_train(args);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& piece : c.message) EXPECT_NE(what.find(piece), std::string::npos) << what;
    EXPECT_EQ(what.find("HDF5 error stack"), std::string::npos) << what;
  }
}

std::string scratch_folder() {
  return ampscope::testing::process_scratch_dir("ampscope_opts").string();
}

std::string top_level_and_table_config() {
  static const std::string path = [] {
    const std::string p = scratch_folder() + "/mixed.toml";
    std::ofstream(p) << "steps = 3\n[train]\nsample = \"mlp\"\n";
    return p;
  }();
  return path;
}

// An IDX pair holding zero images (and zero labels): well-formed, and useless.
std::string empty_idx_folder() {
  const std::string dir = scratch_folder() + "/empty-mnist";
  std::filesystem::create_directories(dir);
  const unsigned char images[] = {0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
  const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 0};
  std::ofstream(dir + "/train-images-idx3-ubyte", std::ios::binary).write(reinterpret_cast<const char*>(images), sizeof images);
  std::ofstream(dir + "/train-labels-idx1-ubyte", std::ios::binary).write(reinterpret_cast<const char*>(labels), sizeof labels);
  return dir;
}

const std::string kPositiveLr = "a finite number > 0 (0: the sample's default)";
const std::string kPositiveScale = "a finite number > 0";

INSTANTIATE_TEST_SUITE_P(
    train_options, BadOptionTest,
    ::testing::Values(
        BadOptionCase{{"--lr", "-1"}, {"--lr: -1 is not allowed; expected ", kPositiveLr}},
        BadOptionCase{{"--lr", "-inf"}, {"--lr: -inf is not allowed", kPositiveLr}},
        BadOptionCase{{"--lr", "nan"}, {"--lr: nan is not allowed", kPositiveLr}},
        BadOptionCase{{"--lr", "inf"}, {"--lr: inf is not allowed", kPositiveLr}},
        BadOptionCase{{"--init-scale", "0"}, {"--init-scale: 0 is not allowed", kPositiveScale}},
        BadOptionCase{{"--init-scale", "-1"}, {"--init-scale: -1 is not allowed", kPositiveScale}},
        BadOptionCase{{"--init-scale", "nan"}, {"--init-scale: nan is not allowed", kPositiveScale}},
        BadOptionCase{{"--init-scale", "inf"}, {"--init-scale: inf is not allowed", kPositiveScale}},
        BadOptionCase{{"--batch", "100000000"}, {"--batch: 100000000 is not allowed", "from 1 to 65536"}},
        BadOptionCase{{"--batch", "-3"}, {"--batch: -3 is not allowed"}},
        BadOptionCase{{"--batch", "5000"}, {"--batch: 5000 is not allowed; expected at most 4096", "mlp sample"}},
        BadOptionCase{{"--sample-every", "0"}, {"--sample-every: 0 is not allowed", ">= 1"}},
        BadOptionCase{{"--twin-every", "0", "--out", "/tmp/ampscope-never-written.h5"},
                      {"--twin-every: 0 is not allowed", ">= 1 (1 twins every step)"}},
        BadOptionCase{{"--twin"}, {"--twin needs --out FILE"}},
        BadOptionCase{{"--twin", "--probe", "off", "--out", "/tmp/ampscope-never-written.h5"},
                      {"--twin needs a probe level other than off", "hint: --probe health"}},
        BadOptionCase{{"--growth-interval", "0"}, {"--growth-interval: 0 is not allowed", ">= 1"}},
        BadOptionCase{{"--max-grad-norm", "nan"}, {"--max-grad-norm: nan is not allowed", ">= 0"}},
        BadOptionCase{{"--max-grad-norm", "-1"}, {"--max-grad-norm: -1 is not allowed"}},
        BadOptionCase{{"--checkpoint-every", "-2"}, {"--checkpoint-every: -2 is not allowed"}},
        BadOptionCase{{"--checkpoint-every", "5"}, {"--checkpoint-every 5 needs --checkpoint"}},
        BadOptionCase{{"--sample", "mlp", "--scenario", "attention-overflow"},
                      {"--scenario attention-overflow runs the 'transformer' sample, but --sample is 'mlp'"}},
        BadOptionCase{{"--config", "/tmp"}, {"--config: cannot read '/tmp': it is a directory, not a regular file"}},
        BadOptionCase{{"--config", top_level_and_table_config()},
                      {"key 'steps' is outside the [train] table and would be ignored"}},
        BadOptionCase{{"--data", "/tmp"}, {"--data '/tmp': only the cnn sample reads IDX files", "is 'mlp'"}},
        BadOptionCase{{"--text", "/etc/hostname"}, {"--text '/etc/hostname': only the transformer sample reads text"}},
        BadOptionCase{{"--sample", "transformer", "--text", "/tmp"},
                      {"--text '/tmp': it is a directory, not a regular file"}},
        BadOptionCase{{"--sample", "cnn", "--data", "/etc/hostname"},
                      {"--data '/etc/hostname': not a folder but a file", "train-images.idx3-ubyte",
                       "hint: --data '/etc'"}},
        BadOptionCase{{"--sample", "cnn", "--data", "/nonexistent-mnist"}, {"--data '/nonexistent-mnist': no such folder"}},
        BadOptionCase{{"--sample", "cnn", "--data", empty_idx_folder()}, {"train-images-idx3-ubyte' holds no images"}},
        BadOptionCase{{"--resume", "/tmp"}, {"--resume '/tmp': it is a directory, not a regular file"}},
        BadOptionCase{{"--checkpoint", "/proc/ckpt.h5"}, {"--checkpoint '/proc/ckpt.h5': cannot write in the folder"}},
        BadOptionCase{{"--autocast-fp32", "blocks.*.atn.*"},
                      {"--autocast-fp32: 'blocks.*.atn.*' matches no module of the 'mlp' model", "fc1, relu1"}},
        BadOptionCase{{"--autocast-fp32", ""}, {"--autocast-fp32: '' is not allowed"}}));

TEST(train_command_test, a_glob_that_may_name_an_op_but_matches_no_module_is_warned_about_at_the_end) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_train({"--device", "cpu", "--steps", "1", "--autocast-fp32", "sofmax"}), 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: --autocast-fp32 'sofmax' matches no module of the 'mlp' model"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(run_train({"--device", "cpu", "--steps", "1", "--autocast-fp32", "fc*"}), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("warning"), std::string::npos);
}

TEST(train_command_test, paths_in_a_config_file_are_relative_to_its_folder_and_command_line_paths_to_the_working_one) {
  // <scratch>/project/configs/run.toml names its data folder and trace relative to itself; the test runs
  // in another working folder (the build's), so a path taken relative to it would not exist.
  const std::filesystem::path project = std::filesystem::path(scratch_folder()) / "project";
  std::filesystem::create_directories(project / "configs" / "mnist");
  std::filesystem::create_directories(project / "traces");
  unsigned char images[16 + 28 * 28] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
  const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 1, 5};
  std::ofstream(project / "configs" / "mnist" / "train-images.idx3-ubyte", std::ios::binary)
      .write(reinterpret_cast<const char*>(images), sizeof images);
  std::ofstream(project / "configs" / "mnist" / "train-labels.idx1-ubyte", std::ios::binary)
      .write(reinterpret_cast<const char*>(labels), sizeof labels);
  const std::filesystem::path config = project / "configs" / "run.toml";
  const std::string absolute_checkpoint = (project / "ck.h5").string();
  std::ofstream(config) << "[train]\nsample = \"cnn\"\nbatch = 1\nsteps = 1\ndevice = \"cpu\"\ndata = \"mnist\"\n"
                           "out = \"../traces/run.h5\"\ncheckpoint = \"" << absolute_checkpoint << "\"\n";
  ASSERT_NE(std::filesystem::current_path(), project / "configs");

  auto resolve = [&](std::vector<std::string> args) {
    CLI::App app;
    TrainCommand train(app);
    args.insert(args.begin(), {"ampscope", "train", "--config", config.string()});
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    bool compare = false;
    return train.resolve(compare);
  };
  const TrainConfig c = resolve({});
  EXPECT_EQ(c.data_dir, (project / "configs" / "mnist").string());
  EXPECT_EQ(c.out, (project / "traces" / "run.h5").string());
  EXPECT_EQ(c.checkpoint, absolute_checkpoint) << "absolute paths stay as they are";
  // On the command line, a relative path is the user's, relative to the working folder, unchanged.
  EXPECT_EQ(resolve({"--out", "here.h5"}).out, "here.h5");
  // And the run reads the config's data from there.
  EXPECT_EQ(run_train({"--config", config.string()}), 0);
  EXPECT_TRUE(std::filesystem::exists(project / "traces" / "run.h5"));
  EXPECT_TRUE(std::filesystem::exists(absolute_checkpoint));
}

TEST(train_command_test, a_scenario_without_sample_picks_the_scenarios_sample) {
  CLI::App app;
  TrainCommand train(app);
  const std::vector<const char*> argv = {"ampscope", "train", "--scenario", "attention-overflow"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  bool compare = false;
  EXPECT_EQ(train.resolve(compare).sample, "transformer");
}

// --twin-every N implies --twin, on the command line and in a config file; the config JSON a trace keeps
// records both (what `ampscope fix` and tools read back).
TEST(train_command_test, twin_every_implies_twin_on_the_command_line_and_in_a_config_file) {
  auto resolve = [](std::vector<std::string> args) {
    CLI::App app;
    TrainCommand train(app);
    args.insert(args.begin(), {"ampscope", "train", "--out", "/tmp/ampscope-never-written.h5"});
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    bool compare = false;
    return train.resolve(compare);
  };
  TrainConfig c = resolve({});
  EXPECT_FALSE(c.twin);
  c = resolve({"--twin"});
  EXPECT_TRUE(c.twin);
  EXPECT_EQ(c.twin_every, 1);
  c = resolve({"--twin-every", "5"});
  EXPECT_TRUE(c.twin);
  EXPECT_EQ(c.twin_every, 5);
  const std::string path = write_config("twin-every = 3\n");
  c = resolve({"--config", path});
  EXPECT_TRUE(c.twin);
  EXPECT_EQ(c.twin_every, 3);
  std::filesystem::remove(path);
  // --twin-forward-only implies --twin and leaves the backward nodes out, in the config JSON too.
  c = resolve({});
  EXPECT_TRUE(c.twin_backward);
  c = resolve({"--twin-forward-only"});
  EXPECT_TRUE(c.twin);
  EXPECT_FALSE(c.twin_backward);
  const std::string forward = write_config("twin-forward-only = true\n");
  c = resolve({"--config", forward});
  EXPECT_TRUE(c.twin);
  EXPECT_FALSE(c.twin_backward);
  std::filesystem::remove(forward);
  // --twin-f64 implies --twin, keeps the backward nodes, and is off unless asked for.
  c = resolve({});
  EXPECT_FALSE(c.twin_f64);
  c = resolve({"--twin-f64"});
  EXPECT_TRUE(c.twin);
  EXPECT_TRUE(c.twin_f64);
  EXPECT_TRUE(c.twin_backward);
  const std::string f64 = write_config("twin-f64 = true\n");
  c = resolve({"--config", f64});
  EXPECT_TRUE(c.twin);
  EXPECT_TRUE(c.twin_f64);
  std::filesystem::remove(f64);
  const std::string off = write_config("twin-f64 = false\n");
  c = resolve({"--config", off});
  EXPECT_FALSE(c.twin);
  EXPECT_FALSE(c.twin_f64);
  std::filesystem::remove(off);
}

}  // namespace
}  // namespace ampscope::samples

namespace ampscope::samples {
namespace {

std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `--out` names an existing trace: another run's record, refused before anything runs (issue 31: it was
// overwritten without a word, and the old run's run.fix.json stayed beside the new trace).
TEST(train_command_test, refuses_an_existing_trace_under_out_unless_told_to_overwrite_it) {
  namespace fs = std::filesystem;
  const fs::path dir = ampscope::testing::process_scratch_dir("ampscope_overwrite");
  const fs::path trace = dir / "run.h5";
  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--out", trace.string()}), 0);
  const auto first_size = fs::file_size(trace);
  // What `ampscope fix` leaves beside a trace, and an unrelated file with a similar name.
  std::ofstream(dir / "run.fix.json") << "{\"old\": true}";
  std::ofstream(dir / "run.fix-bf16.h5") << "old re-run";
  std::ofstream(dir / "run.fixed-notes.txt") << "mine";
  EXPECT_THROW_MSG(run_train({"--sample", "mlp", "--steps", "2", "--device", "cpu", "--out", trace.string()}), Error,
                   "--out: '" + trace.string() + "' exists (the trace of an earlier run); refusing to overwrite it",
                   "hint: give another --out, or --overwrite");
  EXPECT_EQ(fs::file_size(trace), first_size);  // untouched
  EXPECT_TRUE(fs::exists(dir / "run.fix.json"));

  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "2", "--device", "cpu", "--out", trace.string(), "--overwrite"}), 0);
  EXPECT_TRUE(fs::exists(trace));
  EXPECT_FALSE(fs::exists(dir / "run.fix.json")) << "the old run's results file describes another run";
  EXPECT_FALSE(fs::exists(dir / "run.fix-bf16.h5"));
  EXPECT_EQ(file_text(dir / "run.fixed-notes.txt"), "mine");  // not a results file of fix: kept

  // --compare checks both traces it will write.
  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--compare", "--out",
                       (dir / "pair.h5").string()}), 0);
  EXPECT_THROW_MSG(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--compare", "--out",
                              (dir / "pair.h5").string()}),
                   Error, "pair-fp32.h5' exists");
}

// --compare's fp32 run leaves the options only the quantized precisions take (fp32 refuses them); the low run keeps
// them and records them.
TEST(train_command_test, compare_keeps_the_quantized_options_to_the_low_run) {
  namespace fs = std::filesystem;
  const fs::path dir = ampscope::testing::process_scratch_dir("ampscope_compare_quantized");
  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--precision", "mxfp8", "--mx-scale",
                       "floor", "--fp8-keep-first-last", "--compare", "--out", (dir / "quantized.h5").string()}),
            0);
  const auto config_of = [](const fs::path& trace) {
    return nlohmann::json::parse(trace::TraceReader(trace.string()).run_info().config);
  };
  const nlohmann::json fp32 = config_of(dir / "quantized-fp32.h5"), low = config_of(dir / "quantized-mxfp8.h5");
  EXPECT_EQ(fp32.at("precision"), "fp32");
  EXPECT_FALSE(fp32.contains("mx_scale"));
  EXPECT_EQ(low.at("precision"), "mxfp8");
  EXPECT_EQ(low.at("mx_scale"), "floor");
  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--precision", "fp8", "--fp8-recipe",
                       "current", "--compare", "--out", (dir / "perfp8.h5").string()}),
            0);
  EXPECT_EQ(config_of(dir / "perfp8-fp8.h5").at("fp8_recipe"), "current");
  EXPECT_FALSE(config_of(dir / "perfp8-fp32.h5").contains("fp8_recipe"));
}

// --overwrite removes a link planted under the trace's name; the file it points to is never written.
TEST(train_command_test, overwrite_removes_a_link_under_out_and_leaves_its_target_alone) {
  namespace fs = std::filesystem;
  const fs::path dir = ampscope::testing::process_scratch_dir("ampscope_overwrite_link");
  const fs::path target = dir / "precious.txt";
  std::ofstream(target) << "do not touch";
  const fs::path trace = dir / "linked.h5";
  fs::create_symlink(target, trace);
  // Without --overwrite: refused as the link it is (issue 36), naming what it points at.
  EXPECT_THROW_MSG(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--out", trace.string()}), Error,
                   "--out: '" + trace.string() + "' is a symbolic link (to '" + target.string() +
                       "'); ampscope never writes a trace through a link",
                   "hint: give another --out, or --overwrite to replace the link itself");
  ASSERT_EQ(run_train({"--sample", "mlp", "--steps", "1", "--device", "cpu", "--out", trace.string(), "--overwrite"}), 0);
  EXPECT_FALSE(fs::is_symlink(trace));
  EXPECT_EQ(file_text(target), "do not touch");
}

}  // namespace
}  // namespace ampscope::samples
