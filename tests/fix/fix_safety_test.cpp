// `ampscope fix` on traces from elsewhere (issue 36) and its replay of every recorded option (issue 29).
// The hostile traces are made as a sender would: a real `ampscope train` trace whose root attribute `config`
// is rewritten and whose checksum attributes_crc32 is recomputed (the documented recipe), or whose step
// numbers are shifted in every table with the /index checksums recomputed; links and FIFOs are planted
// beside it. Each case goes through run_fix, the command's own entry point, and checks what it must not do
// from the outside: the files a planted link points at keep their bytes and their mtime, a refusal comes
// before any re-run (no progress line), a FIFO is refused without being opened (an open would block the
// test, which ctest's timeout would report).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "probes/trace/hdf5_io.h"
#include "probes/trace/layout.h"
#include "probes/trace/reader.h"
#include "cli/fix_command.h"
#include "cli/report_command.h"
#include "cli/run.h"
#include "cli/run_options_io.h"
#include "tests/test_support.h"

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;
using samples::TrainConfig;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = process_scratch_dir("ampscope_fix_safety") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// A short attention-overflow run (its first anomaly at step 0) in `dir`.
fs::path train_into(const fs::path& dir, const std::function<void(TrainConfig&)>& tweak = {}) {
  TrainConfig c;
  c.scenario = "attention-overflow";
  c.device = "cpu";
  c.steps = 4;
  c.out = (dir / "t.h5").string();
  if (tweak) tweak(c);
  samples::train(c);
  return c.out;
}

struct FixRun {
  int status = -1;
  std::string out, err;
  nlohmann::json doc;
};

FixRun fix(samples::FixRequest request) {
  std::ostringstream out, err;
  FixRun r;
  r.status = samples::run_fix(request, out, err);
  r.out = out.str();
  r.err = err.str();
  if (request.json && !r.out.empty() && r.out.front() == '{') r.doc = nlohmann::json::parse(r.out);
  return r;
}

// Whether any re-run started ("fix: NAME: N steps in ..." or "fix: NAME: failed: ...").
bool any_rerun(const std::string& err) {
  static const std::regex progress(R"((^|\n)fix: [^ ]+: (\d+ steps in|failed: ))");
  return std::regex_search(err, progress);
}

// The trace's config JSON, edited, written back with its checksum recomputed (docs/trace-format.md).
void forge_config(const fs::path& trace_path, const std::function<void(nlohmann::ordered_json&)>& edit) {
  trace::RunInfo info;
  std::int64_t version = 0;
  {
    trace::TraceReader reader(trace_path);
    info = reader.run_info();
    version = reader.format_version();
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(info.config);
  edit(j);
  info.config = j.dump();
  const hid_t file = H5Fopen(trace_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Adelete(file, "config"), 0);
  const trace::detail::Io io(trace_path.string(), "forge");
  trace::detail::write_text_attribute(io, file, "/", "config", info.config);
  trace::detail::rewrite_int_attribute(io, file, "/", "attributes_crc32",
                                       trace::detail::root_attributes_crc32(trace::kFormat, version, info));
  H5Fclose(file);
}

// Adds `offset` to the step of every row of every table and of /index, recomputing /index's checksums.
void shift_steps(const fs::path& trace_path, std::int64_t offset) {
  { trace::TraceReader reader(trace_path); }  // registers the trace's chunk filter with HDF5
  const hid_t file = H5Fopen(trace_path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  auto rows_of = [](hid_t ds) {
    const hid_t space = H5Dget_space(ds);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    H5Sclose(space);
    return n;
  };
  for (int t = 0; t < trace::detail::kDataTableCount; ++t) {
    const std::string path = trace::detail::table_path(static_cast<trace::detail::Table>(t));
    if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) continue;
    const hid_t ds = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
    const hid_t file_type = H5Dget_type(ds);
    const bool has_step = H5Tget_class(file_type) == H5T_COMPOUND && H5Tget_member_index(file_type, "step") >= 0;
    H5Tclose(file_type);
    const hsize_t n = rows_of(ds);
    if (has_step && n > 0) {
      const hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t));
      H5Tinsert(mt, "step", 0, H5T_NATIVE_INT64);
      std::vector<std::int64_t> steps(n);
      ASSERT_GE(H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), 0) << path;
      for (std::int64_t& s : steps) s += offset;
      ASSERT_GE(H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), 0) << path;
      H5Tclose(mt);
    }
    H5Dclose(ds);
  }
  // /index: the step and the row counts, read by name into an IndexRecord, and its checksum recomputed.
  const hid_t ds = H5Dopen2(file, "/index", H5P_DEFAULT);
  const hid_t file_type = H5Dget_type(ds);
  const hid_t mt = H5Tcreate(H5T_COMPOUND, sizeof(trace::detail::IndexRecord));
  H5Tinsert(mt, "step", offsetof(trace::detail::IndexRecord, step), H5T_NATIVE_INT64);
  H5Tinsert(mt, "crc32", offsetof(trace::detail::IndexRecord, crc32), H5T_NATIVE_INT64);
  int tables = 0;
  for (int t = 0; t < trace::detail::kDataTableCount; ++t) {
    const std::string name(trace::detail::table_name(static_cast<trace::detail::Table>(t)));
    if (H5Tget_member_index(file_type, name.c_str()) < 0) continue;
    H5Tinsert(mt, name.c_str(), offsetof(trace::detail::IndexRecord, rows) + 8 * static_cast<std::size_t>(t), H5T_NATIVE_INT64);
    tables = t + 1;
  }
  H5Tclose(file_type);
  std::vector<trace::detail::IndexRecord> index(rows_of(ds));
  ASSERT_GE(H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, index.data()), 0);
  const std::int64_t version = tables == trace::detail::kDataTableCount ? 8 : tables == trace::detail::kV7DataTables ? 7 : tables == trace::detail::kV6DataTables ? 6 : 5;
  for (auto& r : index) {
    r.step += offset;
    r.crc32 = trace::detail::index_crc32(r, version);
  }
  ASSERT_GE(H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, index.data()), 0);
  H5Tclose(mt);
  H5Dclose(ds);
  H5Fclose(file);
}

// A file outside the trace's folder that a planted link points at.
fs::path victim(const std::string& name) {
  const fs::path dir = process_scratch_dir("ampscope_fix_safety") / "elsewhere";
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << "precious bytes of " << name << "\n";
  return p;
}

TEST(fix_safety_test, a_twin_run_is_re_run_with_the_twin_and_every_recorded_option) {
  const fs::path dir = fresh_dir("replay");
  const fs::path trace = train_into(dir, [](TrainConfig& c) {
    c.twin = true;
    c.twin_every = 2;
    c.twin_backward = false;
    c.seed = 5;
    c.init_scale = 1024;
    c.growth_interval = 7;
    c.max_grad_norm = 0.5;
    c.probe = "full";
  });
  const FixRun r = fix({.trace = trace.string(), .after = 1, .json = true});
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_EQ(r.doc["replayed"]["twin"], true);
  EXPECT_EQ(r.doc["replayed"]["twin_every"], 2);
  EXPECT_TRUE(r.doc["not_replayed"].empty()) << r.doc["not_replayed"].dump();
  // Which recorded values a remedy of each kind changes (the rest must be the recorded ones).
  const std::map<std::string, std::set<std::string>> changes = {
      {"original", {}}, {"fp32", {"precision"}}, {"bf16", {"precision"}}, {"autocast_fp32", {"autocast_fp32"}},
      {"learning_rate", {"lr"}}, {"init_scale", {"init_scale"}}};
  samples::RecordedRun original;
  {
    trace::TraceReader reader(trace);
    original = samples::read_run_config(nlohmann::json::parse(reader.run_info().config));
  }
  for (const auto& run : r.doc["runs"]) {
    SCOPED_TRACE(run["name"].get<std::string>());
    ASSERT_TRUE(changes.count(run["kind"])) << run["kind"];
    trace::TraceReader reader(run["trace"].get<std::string>());
    const samples::RecordedRun again = samples::read_run_config(nlohmann::json::parse(reader.run_info().config));
    EXPECT_EQ(again.keys, original.keys);
    for (const samples::RunOption& row : samples::run_options()) {
      if (row.json_key.empty() || row.json_key == "steps" || changes.at(run["kind"]).count(std::string(row.json_key))) continue;
      EXPECT_EQ(row.get(again.config), row.get(original.config)) << row.json_key;
    }
    EXPECT_EQ(again.config.steps, 2);  // through step 0 and --after 1
    // The twin ran: rows in /precision wherever an op ran in f16 (the fp32 reference has none to twin).
    if (run["kind"] != "fp32") {
      EXPECT_GT(reader.row_counts().precision, 0) << "the twin was not replayed";
    }
  }
}

TEST(fix_safety_test, links_planted_under_its_output_names_are_refused_before_any_re_run_and_never_written) {
  const fs::path dir = fresh_dir("links");
  const fs::path trace = train_into(dir);
  for (const std::string name : {"t.fix.json", "t.fix-original.h5", "t.fix-bf16.h5"}) {
    SCOPED_TRACE(name);
    const fs::path target = victim(name + ".target");
    fs::create_symlink(target, dir / name);
    const FileSnapshot before = file_snapshot(target);
    const FixRun r = fix({.trace = trace.string(), .after = 1});
    EXPECT_EQ(r.status, samples::kExitUsage) << r.err;
    EXPECT_NE(r.err.find("'" + (dir / name).string() + "' is a symbolic link (to '" + target.string() + "')"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("ampscope never writes through a link"), std::string::npos) << r.err;
    EXPECT_FALSE(any_rerun(r.err)) << r.err;
    EXPECT_TRUE(file_snapshot(target) == before) << "the link's target was written";
    EXPECT_TRUE(fs::is_symlink(dir / name));
    fs::remove(dir / name);
  }
  // --output naming a link: the same.
  const fs::path target = victim("output.target");
  fs::create_symlink(target, dir / "mine.json");
  const FileSnapshot before = file_snapshot(target);
  const FixRun r = fix({.trace = trace.string(), .after = 1, .output = (dir / "mine.json").string()});
  EXPECT_EQ(r.status, samples::kExitUsage) << r.err;
  EXPECT_TRUE(file_snapshot(target) == before);
}

TEST(fix_safety_test, lock_file_links_beside_the_trace_are_never_followed) {
  const fs::path dir = fresh_dir("locks");
  const fs::path trace = train_into(dir);
  std::vector<std::pair<fs::path, FileSnapshot>> targets;
  for (const std::string name : {"t.h5.lock", "t.fix-original.h5.lock", "t.fix-fp32.h5.lock", "t.fix-bf16.h5.lock"}) {
    const fs::path target = victim(name + ".target");
    fs::create_symlink(target, dir / name);
    targets.emplace_back(target, file_snapshot(target));
  }
  // A dangling link: a lock file opened through it (O_CREAT) would create its target.
  const fs::path absent = process_scratch_dir("ampscope_fix_safety") / "elsewhere" / "never-created";
  fs::create_symlink(absent, dir / "t.fix-autocast-fp32-blocks.0.attn.h5.lock");
  const FixRun r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitClean) << r.err << r.out;
  for (const auto& [target, before] : targets) EXPECT_TRUE(file_snapshot(target) == before) << target;
  EXPECT_FALSE(fs::exists(absent));
  for (const std::string name : {"t.h5.lock", "t.fix-original.h5.lock"}) EXPECT_TRUE(fs::is_symlink(dir / name)) << name;
  // Nothing of the fix's own is left behind but its traces and results (no staging folder, no lock file).
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    EXPECT_TRUE(file.ends_with(".h5") || file.ends_with(".fix.json") || file.ends_with(".lock")) << file;
  }
}

// The recorded text of a transformer run, each way a trace can name one.
TEST(fix_safety_test, reads_the_recorded_inputs_only_from_under_the_traces_folder_unless_the_user_names_them) {
  const fs::path dir = fresh_dir("inputs");
  const fs::path corpus = victim("corpus.txt");
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  // The sender trained on a file of theirs by an absolute path.
  const fs::path trace = train_into(dir, [&](TrainConfig& c) { c.text_file = corpus.string(); });
  const FileSnapshot before = file_snapshot(corpus);
  FixRun r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("the recorded run read '" + corpus.string() + "' (--text), an absolute path"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("hint: check that it is what you mean, and name it yourself: ampscope fix " + trace.string() +
                       " --text PATH"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(any_rerun(r.err));

  // /etc/passwd, as a sender would write it: refused, never opened.
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "/etc/passwd"; });
  r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("the recorded run read '/etc/passwd' (--text), an absolute path"), std::string::npos) << r.err;
  EXPECT_FALSE(any_rerun(r.err));

  // Relative paths lead from the trace's folder, not the working folder, and must stay under it.
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "../elsewhere/corpus.txt"; });
  r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("which leads to '" + corpus.string() + "', outside the trace's folder"), std::string::npos) << r.err;
  fs::create_symlink(corpus, dir / "link.txt");
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "link.txt"; });
  r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("outside the trace's folder"), std::string::npos) << r.err;
  // A FIFO is refused from its kind: were it opened, this test would block.
  ASSERT_EQ(::mkfifo((dir / "corpus.fifo").c_str(), 0600), 0);
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "corpus.fifo"; });
  r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("it is a FIFO (named pipe), not a regular file"), std::string::npos) << r.err;
  EXPECT_FALSE(any_rerun(r.err));
  EXPECT_TRUE(file_snapshot(corpus) == before);

  // A copy beside the trace, named relatively: read from there (this process's working folder is another).
  ASSERT_NE(fs::current_path(), dir);
  fs::copy_file(corpus, dir / "corpus.txt");
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "corpus.txt"; });
  r = fix({.trace = trace.string(), .after = 1, .json = true});
  EXPECT_EQ(r.status, samples::kExitClean) << r.err;
  EXPECT_EQ(r.doc["replayed"]["text"], (dir / "corpus.txt").string());
  EXPECT_NE(r.err.find("fix:   reads: " + (dir / "corpus.txt").string() + " (--text, recorded, under the trace's folder)"),
            std::string::npos)
      << r.err;
  // And the file the user names on the command line, wherever it is.
  forge_config(trace, [](nlohmann::ordered_json& j) { j["text"] = "/etc/passwd"; });
  r = fix({.trace = trace.string(), .after = 1, .json = true, .text = corpus.string()});
  EXPECT_EQ(r.status, samples::kExitClean) << r.err;
  EXPECT_EQ(r.doc["replayed"]["text"], corpus.string());
  // An input the recorded run did not have cannot be added.
  r = fix({.trace = trace.string(), .after = 1, .data = dir.string()});
  EXPECT_EQ(r.status, samples::kExitUsage);
  EXPECT_NE(r.err.find("--data: the recorded run read no folder of this kind"), std::string::npos) << r.err;
}

// Every value `ampscope train` refuses is refused in a trace too, before anything runs, naming its key.
TEST(fix_safety_test, recorded_values_train_refuses_are_refused_with_the_key_named) {
  const fs::path dir = fresh_dir("values");
  const fs::path clean = train_into(dir);
  struct Case {
    const char* key;
    nlohmann::ordered_json value;
    const char* message;
  };
  const Case cases[] = {
      {"lr", "nan", "the recorded configuration's 'lr' is nan, which `ampscope train` refuses (--lr: expected a finite number > 0"},
      {"lr", -0.001, "'lr' is -0.001, which `ampscope train` refuses"},
      {"init_scale", -1.0, "'init_scale' is -1, which `ampscope train` refuses (--init-scale: expected a finite number > 0"},
      {"init_scale", "inf", "'init_scale' is inf"},
      {"batch", -4, "'batch' is -4, which `ampscope train` refuses (--batch: expected an integer from 1 to 65536"},
      {"batch", 1000000, "'batch' is 1000000, which"},
      {"growth_interval", 0, "'growth_interval' is 0, which `ampscope train` refuses (--growth-interval: expected an integer >= 1)"},
      {"autocast_fp32", nlohmann::ordered_json::array({""}), "'autocast_fp32' is '', which"},
      {"sample_every", 0, "'sample_every' is 0, which"},
      {"twin_every", -2, "'twin_every' is -2, which"},
      {"steps", -1, "'steps' is -1, which"},
      {"max_grad_norm", "-inf", "'max_grad_norm' is -inf, which"},
      {"probe", "everything", "'probe' is everything, which `ampscope train` refuses (--probe: expected one of off, dtype, health, full)"},
      {"precision", "fp4", "unknown precision 'fp4'"},
      {"seed", -1, "the recorded configuration's 'seed' is -1; expected an integer >= 0"},
      {"scenario", "no-such-scenario", "the recorded configuration names unknown scenario 'no-such-scenario'"},
      {"twin", "yes", "the recorded configuration's 'twin' is \"yes\"; expected true or false"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.key) + " = " + k.value.dump());
    const fs::path trace = dir / "forged.h5";
    fs::copy_file(clean, trace, fs::copy_options::overwrite_existing);
    forge_config(trace, [&](nlohmann::ordered_json& j) { j[k.key] = k.value; });
    const FixRun r = fix({.trace = trace.string(), .after = 1});
    EXPECT_EQ(r.status, samples::kExitUsage) << r.err;
    EXPECT_NE(r.err.find(k.message), std::string::npos) << r.err;
    EXPECT_FALSE(any_rerun(r.err)) << r.err;
    EXPECT_FALSE(fs::exists(dir / "forged.fix-original.h5"));
  }
}

TEST(fix_safety_test, step_numbers_shifted_to_10_to_the_12_start_no_run) {
  const fs::path dir = fresh_dir("shifted");
  const fs::path trace = train_into(dir);
  const std::int64_t shift = 1000000000000;
  shift_steps(trace, shift);
  forge_config(trace, [&](nlohmann::ordered_json& j) { j["steps"] = 2 * shift; });
  {
    trace::TraceReader reader(trace);
    ASSERT_EQ(reader.steps().front().step, shift) << "the forgery must read as a valid trace";
  }
  const FixRun r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage) << r.err << r.out;
  EXPECT_NE(r.err.find("its first anomaly is at step 1000000000000, but the trace holds 4 step row(s), so at most 4 "
                       "steps of a run"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(any_rerun(r.err));
}

TEST(fix_safety_test, when_every_re_run_fails_it_exits_2_with_the_reason) {
  const fs::path dir = fresh_dir("failing");
  const fs::path trace = train_into(dir);
  forge_config(trace, [](nlohmann::ordered_json& j) { j["device"] = "tpu"; });
  const FixRun r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitUsage) << r.err << r.out;
  EXPECT_NE(r.err.find("ampscope fix: error: every re-run failed; the first: unknown device 'tpu'"), std::string::npos)
      << r.err;
}

// A --ddp trace: fix starts no ranks, replays the rest (--shard-optimizer included) and says so.
TEST(fix_safety_test, a_data_parallel_trace_is_re_run_in_one_process_and_the_table_says_so) {
  const fs::path dir = fresh_dir("ranks");
  const fs::path trace = train_into(dir, [](TrainConfig& c) { c.batch = 4; });
  forge_config(trace, [](nlohmann::ordered_json& j) {
    j["world_size"] = 2;
    j["rank"] = 1;
    j["shard_optimizer"] = true;
  });
  const FixRun r = fix({.trace = trace.string(), .after = 1});
  EXPECT_EQ(r.status, samples::kExitClean) << r.err << r.out;
  EXPECT_NE(r.out.find("not replayed: --ddp 2 ranks (this trace: rank 1): fix starts no ranks: each re-run is one "
                       "process training on the whole global batch (--batch 4)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("fix:   not replayed: --ddp 2 ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--shard-optimizer"), std::string::npos) << r.err;  // in the replayed options
}

TEST(fix_safety_test, the_plan_names_every_file_read_and_written_before_the_first_re_run) {
  const fs::path dir = fresh_dir("plan");
  const fs::path trace = train_into(dir);
  const FixRun r = fix({.trace = trace.string(), .after = 1, .json = true});
  ASSERT_EQ(r.status, samples::kExitClean) << r.err;
  const std::size_t first_run = r.err.find("fix: original: ");
  ASSERT_NE(first_run, std::string::npos) << r.err;
  const std::string plan = r.err.substr(0, first_run);
  EXPECT_NE(plan.find("fix:   each re-run: steps 0..1 (2 of the recorded 4; the trace holds 4 step rows)"), std::string::npos)
      << plan;
  EXPECT_NE(plan.find("fix:   reads: " + trace.string() + " (the trace)"), std::string::npos) << plan;
  for (const auto& run : r.doc["runs"]) {
    EXPECT_NE(plan.find("fix:   writes: " + run["trace"].get<std::string>() + "\n"), std::string::npos) << run["trace"];
  }
  EXPECT_NE(plan.find("fix:   writes: " + samples::fix_results_path(trace.string()) + " (the results)"), std::string::npos);
  // What it wrote is what it said.
  std::set<std::string> written;
  for (const auto& entry : fs::directory_iterator(dir)) written.insert(entry.path().string());
  std::set<std::string> said = {trace.string(), samples::fix_results_path(trace.string())};
  for (const auto& run : r.doc["runs"]) said.insert(run["trace"].get<std::string>());
  EXPECT_EQ(written, said);
}

}  // namespace
}  // namespace ampscope::testing
