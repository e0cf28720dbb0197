// tests/trace/trace_fuzz_test.cpp: damaged traces and checkpoints, fed to the trace reader, the analysis,
// the diff and the checkpoint loader in-process. Two parts:
//
//  - The reproducers of issue 16 (a flipped byte in the global heap of an older trace, a zeroed /index of
//    a complete trace, /ops resized to 2^31 unwritten rows, a changed attribute, counts past the tables),
//    each with the error or the marked partial result it must give.
//  - Seeded mutants of real traces (a healthy run, a run with anomalies at probe level full, a run
//    killed before it closed its trace, the committed format_version 1 to 5 fixtures) and of a
//    checkpoint: byte flips anywhere, flips inside the global heap collection (GCOL), truncations, zeroed
//    blocks, zeroed or edited /index rows, crafted table sizes, edited attributes, and edits of format_version
//    4's string table through HDF5 (a text's byte, an entry's field, a row's text id), and edits of a field
//    of format_version 5's /precision rows (the anomalies trace is run with the f32 twin, forward and backward:
//    format_version 6's phase is one of the text ids edited) and /updates rows (a
//    model trained in f16 storage writes them: the "f16 storage" trace). Each mutant runs in a
//    forked child with a time limit (alarm) and, without sanitizers, an address-space limit: a crash is a
//    signal, a hang SIGALRM, a blow-up bad_alloc or a large peak RSS, and each counts as a failure. So does
//    a result with fewer steps, op rows, precision rows or update rows than the original and no damage note, a row
//    text (op name, module, event, parameter, precision row, update row) other than the original's with no damage
//    note, and a
//    checkpoint that loads and then
//    trains to other numbers.
//
// AMPSCOPE_FUZZ_CASES sets the number of trace mutants (default sized for about a minute on 2 cores in
// CI, with a fifth as many checkpoint mutants); AMPSCOPE_FUZZ_SEED the first seed.
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "core/block_stats.h"
#include "core/error.h"
#include "core/probe_hook.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/analysis/render.h"
#include "probes/probe.h"
#include "probes/trace/writer.h"
#include "core/nn.h"
#include "core/optim.h"
#include "probes/trace/layout.h"
#include "probes/trace/reader.h"
#include "cli/run.h"
#include "tests/trace/trace_test_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define AMPSCOPE_FUZZ_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AMPSCOPE_FUZZ_SANITIZED 1
#endif
#endif
#ifndef AMPSCOPE_FUZZ_SANITIZED
#define AMPSCOPE_FUZZ_SANITIZED 0
#endif

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

const fs::path kFixtures = fs::path(AMPSCOPE_SOURCE_DIR) / "tests" / "fixtures";
constexpr bool kSanitized = AMPSCOPE_FUZZ_SANITIZED != 0;
constexpr unsigned kCaseSeconds = kSanitized ? 60 : 20;           // per case: more is a hang
constexpr std::uint64_t kMemoryLimit = std::uint64_t{2} << 30;  // address space (not under ASan) and peak RSS

std::vector<unsigned char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// --- the originals ---

struct Base {
  std::string name;
  fs::path path;
  bool complete = true;
  bool variable_length = false;  // format_version 1 or 2: text attributes in the global heap
  std::int64_t steps = 0, op_rows = 0, precision_rows = 0, update_rows = 0, block_rows = 0;
  // every text of every /ops, /events, /grads, /precision, /updates, /checksums and /blocks row
  std::array<std::vector<std::string>, 7> texts;
};

// The texts of a trace's rows, one line per row of /ops, /events, /grads (every row, those before an all-reduce
// included, with the flag), /precision, /updates, /checksums and /blocks (with their numbers): what a mutant must
// give back exactly unless it says it is damaged.
std::array<std::vector<std::string>, 7> texts_of(TraceReader& r) {
  std::array<std::vector<std::string>, 7> out;
  for (const OpRow& o : r.ops()) {
    out[0].push_back(fmt::format("op {} {} {} {} {} {} {} {} {}", o.step, o.seq, phase_name(o.phase), o.op, o.module, o.in_dtypes,
                                 o.out_dtype, o.shape, o.autocast));
  }
  for (const EventRow& e : r.events()) {
    out[1].push_back(fmt::format("event {} {} {} {} {} {}", e.step, e.seq, e.kind, e.op, e.module, e.detail));
  }
  for (const GradRow& g : r.grads(kFirstStep, kLastStep, GradRows::all)) {
    out[2].push_back(fmt::format("grad {} {} {} {} {}", g.step, g.param, g.dtype, g.unscaled, g.before_all_reduce));
  }
  for (const ChecksumRow& c : r.checksums()) out[5].push_back(fmt::format("checksum {} {} {}", c.step, c.param, c.checksum));
  for (const PrecisionRow& p : r.precision()) {
    out[3].push_back(fmt::format("precision {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", p.step, p.seq, p.op, p.module,
                                 p.out_dtype, p.numel, p.local, p.local_mean_rel, p.acc_mean_rel, p.in_acc_mean_rel, p.flips,
                                 p.followed, fmt::join(p.error_bins, ","), p.exact, phase_name(p.phase)));
  }
  for (const UpdateRow& u : r.updates()) {
    out[4].push_back(fmt::format("update {} {} {} {} {} {} {} {}", u.step, u.param, u.dtype, u.numel, u.nonzero, u.swamped,
                                 u.param_abs_mean, u.update_abs_mean));
  }
  for (const BlockRow& b : r.blocks()) {
    out[6].push_back(fmt::format("block {} {} {} {} {} {} {}x{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", b.step,
                                 b.module, b.operand, b.copy, b.format, b.what_if, b.rows, b.cols, b.nonzero, b.nonfinite,
                                 b.underflow, b.saturated, b.blocks, b.blocks_clipped, b.blocks_nan, b.max_block_range,
                                 b.max_range_block, b.max_range_row, b.max_range_col, b.worst_block, b.worst_block_underflow,
                                 b.worst_block_row, b.worst_block_col, b.scale_log2_min, b.scale_log2_median, b.scale_log2_max,
                                 b.rel_rms_error));
  }
  return out;
}

// A bf16 run measured for --what-if and trained in mxfp8 as the runtime reports it (core/probe_hook.h
// BlockQuantizeEvent), through the probe: a format 8 trace with /blocks rows (trained and what-if, NaN and -inf
// scales), 3 steps of 2 Linears x 3 operands x 2 copies.
void write_block_trace(const fs::path& out) {
  trace::RunInfo info{.precision = "mxfp8", .device = "cpu", .model = "blocks", .seed = 3, .config = "{}"};
  const probe::ProbeOptions options{.level = probe::Level::health};
  info.probe = probe::describe(options);
  auto writer = std::make_shared<TraceWriter>(out, info);
  auto watcher = std::make_shared<probe::Probe>(writer, options);
  {
    probe::HookGuard installed(watcher);
    for (std::int64_t n = 0; n < 3; ++n) {
      probe::StepScope step(n);
      for (const std::string module : {"fc1", "fc2"}) {
        for (const char* operand : {"input", "weight", "grad_output"}) {
          for (const char* copy : {"rowwise", "columnwise"}) {
            BlockStats s;
            s.numel = 64 * 64;
            s.nonzero = 4000 - n;
            s.underflow = 3 * n + (copy[0] == 'r' ? 1 : 0);
            s.saturated = operand[0] == 'w' ? n : 0;
            s.blocks = 128;
            s.blocks_clipped = s.saturated > 0 ? 1 : 0;
            s.max_block_range = 6.5 + static_cast<double>(n);
            s.max_range_block = 5 + n;
            if (s.underflow > 0) s.worst_block = 9, s.worst_block_underflow = s.underflow;
            if (n != 1) {
              s.scale_log2_min = operand[0] == 'g' ? -std::numeric_limits<double>::infinity() : -12;
              s.scale_log2_median = -6;
              s.scale_log2_max = 1;
            }
            s.rel_rms_error = 0.03 + 0.01 * static_cast<double>(n);
            probe::hook()->on_block_quantize(probe::BlockQuantizeEvent{
                .step = n, .module = module, .operand = operand, .copy = copy, .format = "mxfp8", .what_if = false,
                .rows = 64, .cols = 64, .stats = s});
            probe::hook()->on_block_quantize(probe::BlockQuantizeEvent{
                .step = n, .module = module, .operand = operand, .copy = copy, .format = "nvfp4", .what_if = true,
                .rows = 64, .cols = 64, .stats = s});
          }
        }
      }
      step.end(probe::StepSummary{.step = n, .loss = 1.0 / static_cast<double>(n + 1)});
    }
  }
  watcher->flush();
  writer->close();
}

// A model trained as a user trains one in f16 storage (model.to(f16), SGD on its parameters, no master
// weights), with the probe: its trace has /updates rows. It also reports its gradients as a data-parallel loop
// does before its all-reduce, and has the probe checksum its parameters: /grads rows before_all_reduce and
// /checksums rows (format_version 6).
void train_f16_storage(const fs::path& out) {
  Generator gen(5);
  nn::Linear model(16, 8, gen);
  model.to(DType::f16);
  optim::SGD opt(model.parameters(), {.lr = 1e-3});
  const Tensor x = randn({32, 16}, gen).to(DType::f16), y = randn({32, 8}, gen).to(DType::f16);
  probe::ProbeOptions options{.level = probe::Level::health, .checksums = true};
  trace::RunInfo info{.precision = "fp16", .device = "cpu", .model = "f16-linear", .seed = 5, .config = "{}"};
  info.probe = probe::describe(options);
  auto writer = std::make_shared<TraceWriter>(out, info);
  auto watcher = std::make_shared<probe::Probe>(writer, options);
  {
    probe::HookGuard installed(watcher);
    for (std::int64_t n = 0; n < 4; ++n) {
      probe::Step step(n);
      opt.zero_grad();
      const Tensor loss = mse_loss(model(x), y);
      loss.backward();
      probe::report_grads(model.parameters(), /*unscaled=*/true, /*before_all_reduce=*/true);
      step.finish(loss, opt);
    }
  }
  watcher->flush();
  writer->close();
}

samples::TrainConfig config(const std::string& sample, std::int64_t steps, const fs::path& out, const std::string& scenario = "") {
  samples::TrainConfig c;
  c.sample = sample;
  c.device = "cpu";
  c.steps = steps;
  c.out = out.string();
  c.scenario = scenario;
  return c;
}

// Trains `config` into a trace; with `kill_after` the training process ends (_exit) right after that
// step, so the trace stays incomplete, as a killed run's does.
// Trains `config`; with `kill_after`, in a child process that is killed with SIGKILL once step `kill_after` has
// run and the trace writer's thread has made it durable (the reader sees it flushed): a trace whose writer
// died mid-run. The child waits at that step until it is killed, so the kill never races the writer's flush
// (which end_step only queues).
void train_trace(samples::TrainConfig config, std::optional<std::int64_t> kill_after = std::nullopt) {
  config.device = "cpu";
  if (!kill_after) {
    samples::train(config);
    return;
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    samples::train(config, [&](const samples::StepReport& r) {
      if (r.step != *kill_after) return;
      const char c = 'k';
      if (write(ready[1], &c, 1) != 1) _exit(2);
      for (;;) pause();  // until killed
    });
    _exit(1);
  }
  close(ready[1]);
  char c = 0;
  const bool reached = read(ready[0], &c, 1) == 1 && c == 'k';
  close(ready[0]);
  bool flushed = false;
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
       reached && !flushed && std::chrono::steady_clock::now() < deadline;) {
    try {
      TraceReader r(config.out);
      flushed = r.last_flushed_step() && *r.last_flushed_step() >= *kill_after;
    } catch (const std::exception&) {
      // Not readable yet: the writer has not flushed its first step.
    }
    if (!flushed) usleep(10000);
  }
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(reached) << "the training child did not reach step " << *kill_after;
  ASSERT_TRUE(flushed) << "the trace writer did not flush step " << *kill_after << " within 120 s";
  ASSERT_TRUE(WIFSIGNALED(status)) << "the training child ended before it was killed";
}

Base describe(std::string name, fs::path path) {
  Base b{.name = std::move(name), .path = std::move(path), .texts = {}};
  TraceReader r(b.path);
  b.complete = r.complete();
  b.variable_length = r.format_version() < 3;
  const analysis::Report rep = analysis::analyse(r);
  b.steps = rep.steps;
  b.op_rows = rep.op_rows;
  b.precision_rows = rep.precision.rows;
  b.update_rows = rep.swamped.rows;
  b.block_rows = rep.blocks.rows;
  b.texts = texts_of(r);
  EXPECT_TRUE(rep.damage.empty()) << b.name << ": " << rep.damage.front();
  return b;
}

// The originals, written once per process.
struct Corpus {
  TempDir dir;
  std::vector<Base> traces;
  fs::path checkpoint;
  std::vector<double> resumed_losses;  // what resuming from the intact checkpoint trains to
  samples::TrainConfig resume;

  Corpus() {
    const auto healthy = dir.file("healthy.h5");
    train_trace(config("mlp", 5, healthy));
    const auto anomalies = dir.file("anomalies.h5");
    samples::TrainConfig full = config("mlp", 3, anomalies, "log-zero");
    full.probe = "full";
    full.twin = true;  // /precision rows too
    train_trace(full);
    const auto killed = dir.file("killed.h5");
    train_trace(config("mlp", 50, killed), 3);
    traces.push_back(describe("healthy", healthy));
    traces.push_back(describe("anomalies", anomalies));
    traces.push_back(describe("killed", killed));
    traces.push_back(describe("v1 fixture", kFixtures / "v1-mlp-log-zero.h5"));
    traces.push_back(describe("v2 fixture", kFixtures / "v2-mlp-log-zero-full.h5"));
    traces.push_back(describe("v3 fixture", kFixtures / "v3-mlp-log-zero-full.h5"));
    traces.push_back(describe("v4 fixture", kFixtures / "v4-mlp-log-zero-full.h5"));
    const auto f16_storage = dir.file("f16-storage.h5");
    train_f16_storage(f16_storage);
    traces.push_back(describe("f16 storage", f16_storage));
    EXPECT_GT(traces[1].precision_rows, 0) << "the anomalies trace was run with --twin";
    EXPECT_GT(traces[7].update_rows, 0) << "the f16 storage trace has /updates rows";
    EXPECT_EQ(traces[7].texts[5].size(), 4u * 3u) << "the f16 storage trace has /checksums rows (2 parameters + combined, 4 steps)";
    EXPECT_EQ(traces[7].texts[2].size(), 4u * 4u) << "and /grads rows before the all-reduce beside the others";
    traces.push_back(describe("v5 fixture", kFixtures / "v5-mlp-twin.h5"));  // /precision without phase
    EXPECT_GT(traces[8].precision_rows, 0) << "the v5 fixture was run with --twin";
    traces.push_back(describe("v7 fixture", kFixtures / "v7-mlp-fp8.h5"));  // /fp8 without the optional columns
    const auto blocks = dir.file("blocks.h5");
    write_block_trace(blocks);
    traces.push_back(describe("blocks", blocks));
    EXPECT_EQ(traces[10].block_rows, 3 * 2 * 3 * 2 * 2) << "the blocks trace has /blocks rows";
    traces.push_back(describe("v8 fixture", kFixtures / "v8-transformer-fp16.h5"));  // /ops with absmax stored

    checkpoint = dir.file("ck.h5");
    samples::TrainConfig save = config("mlp", 2, "");
    save.checkpoint = checkpoint.string();
    samples::train(save);
    resume = config("mlp", 3, "");
    resume.resume = checkpoint.string();
    resumed_losses = samples::train(resume).losses;
  }
};

Corpus& corpus() {
  static Corpus c;
  return c;
}

// --- mutations ---

// Where the global heap collection holding variable-length attributes starts ("GCOL"), if any.
std::optional<std::size_t> global_heap(const std::vector<unsigned char>& bytes) {
  static const unsigned char sig[] = {'G', 'C', 'O', 'L'};
  const auto it = std::search(bytes.begin(), bytes.end(), std::begin(sig), std::end(sig));
  if (it == bytes.end()) return std::nullopt;
  return static_cast<std::size_t>(it - bytes.begin());
}

// Opens a complete trace for writing with HDF5 (negative when it cannot: an incomplete one).
hid_t open_rw(const fs::path& p) {
  H5E_auto2_t f = nullptr;
  void* d = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &f, &d);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t id = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Eset_auto2(H5E_DEFAULT, f, d);
  return id;
}

const char* const kTables[] = {"steps",   "ops",          "grads",    "events",       "histograms", "dumps",
                               "dump_values",  "strings",  "string_bytes", "precision", "updates", "checksums", "fp8",
                               "blocks"};

// The /index rows as step + 7 counts (9 in format_version 4, 11 from 5) and crc32 where the file has it, read
// and written by field name.
struct IndexRows {
  std::vector<detail::IndexRecord> rows;
  bool has_crc = false;
  int tables = detail::kLegacyDataTables;
  std::int64_t version() const {
    return tables == detail::kDataTableCount ? 8 : tables == detail::kV7DataTables ? 7 : tables == detail::kV6DataTables ? 6 : tables == detail::kV5DataTables ? 5 : tables == detail::kV4DataTables ? 4 : 3;
  }
};

hid_t index_memory_type(bool crc, int tables) {
  const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(detail::IndexRecord));
  H5Tinsert(t, "step", offsetof(detail::IndexRecord, step), H5T_NATIVE_INT64);
  for (int i = 0; i < tables; ++i) {
    H5Tinsert(t, kTables[i], offsetof(detail::IndexRecord, rows) + 8 * static_cast<std::size_t>(i), H5T_NATIVE_INT64);
  }
  if (crc) H5Tinsert(t, "crc32", offsetof(detail::IndexRecord, crc32), H5T_NATIVE_INT64);
  return t;
}

bool read_index(hid_t file, IndexRows& out) {
  const hid_t ds = H5Dopen2(file, "/index", H5P_DEFAULT);
  if (ds < 0) return false;
  const hid_t ft = H5Dget_type(ds);
  out.has_crc = H5Tget_member_index(ft, "crc32") >= 0;
  out.tables = H5Tget_member_index(ft, "blocks") >= 0      ? detail::kDataTableCount
               : H5Tget_member_index(ft, "fp8") >= 0       ? detail::kV7DataTables
               : H5Tget_member_index(ft, "checksums") >= 0 ? detail::kV6DataTables
               : H5Tget_member_index(ft, "precision") >= 0 ? detail::kV5DataTables
               : H5Tget_member_index(ft, "strings") >= 0   ? detail::kV4DataTables
                                                            : detail::kLegacyDataTables;
  H5Tclose(ft);
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  out.rows.assign(static_cast<std::size_t>(n), detail::IndexRecord{});
  const hid_t mt = index_memory_type(out.has_crc, out.tables);
  const herr_t ok = n == 0 ? 0 : H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.rows.data());
  H5Tclose(mt);
  H5Dclose(ds);
  return ok >= 0;
}

bool write_index(hid_t file, const IndexRows& in, bool fix_crc) {
  IndexRows rows = in;
  if (fix_crc && rows.has_crc) {
    for (auto& r : rows.rows) r.crc32 = detail::index_crc32(r, rows.version());
  }
  const hid_t ds = H5Dopen2(file, "/index", H5P_DEFAULT);
  if (ds < 0) return false;
  const hsize_t n = rows.rows.size();
  H5Dset_extent(ds, &n);
  const hid_t mt = index_memory_type(rows.has_crc, rows.tables);
  const herr_t ok = n == 0 ? 0 : H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.rows.data());
  H5Tclose(mt);
  H5Dclose(ds);
  return ok >= 0;
}

bool set_extent(hid_t file, const char* table, hsize_t rows) {
  const hid_t ds = H5Dopen2(file, fmt::format("/{}", table).c_str(), H5P_DEFAULT);
  if (ds < 0) return false;
  const herr_t ok = H5Dset_extent(ds, &rows);
  H5Dclose(ds);
  return ok >= 0;
}

// Rewrites a text attribute in place, keeping its type (so its size): the text cut or padded to fit.
bool set_text_attribute(hid_t file, const char* name, const std::string& text) {
  const hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  if (a < 0) return false;
  const hid_t t = H5Aget_type(a);
  herr_t ok = -1;
  if (H5Tis_variable_str(t) > 0) {
    const char* p = text.c_str();
    ok = H5Awrite(a, t, &p);
  } else {
    std::string buffer = text;
    buffer.resize(H5Tget_size(t), '\0');
    ok = H5Awrite(a, t, buffer.data());
  }
  H5Tclose(t);
  H5Aclose(a);
  return ok >= 0;
}

// Rows of a one-dimensional dataset (`count` from `first`) in `memory` type, read or written.
bool rows_io(hid_t file, const char* table, hid_t memory, hsize_t first, hsize_t count, void* data, bool write) {
  const hid_t ds = H5Dopen2(file, fmt::format("/{}", table).c_str(), H5P_DEFAULT);
  if (ds < 0) return false;
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  herr_t ok = -1;
  if (count > 0 && first + count <= n) {
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &first, nullptr, &count, nullptr);
    const hid_t mspace = H5Screate_simple(1, &count, nullptr);
    ok = write ? H5Dwrite(ds, memory, mspace, space, H5P_DEFAULT, data) : H5Dread(ds, memory, mspace, space, H5P_DEFAULT, data);
    H5Sclose(mspace);
  }
  H5Sclose(space);
  H5Dclose(ds);
  return ok >= 0;
}

hsize_t rows_of(hid_t file, const char* table) {
  const std::string path = fmt::format("/{}", table);
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return 0;  // older traces have no string table
  const hid_t ds = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (ds < 0) return 0;
  const hid_t space = H5Dget_space(ds);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  H5Dclose(ds);
  return n;
}

// Reads `field` (int64) of row `row` of `table`, passes it through `change` and writes it back (HDF5
// compresses the chunk again: a forgery whose chunk checksums are right). nullopt when it cannot.
std::optional<std::int64_t> edit_int_field(hid_t file, const char* table, const char* field, hsize_t row,
                                           const std::function<std::int64_t(std::int64_t)>& change) {
  const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t));
  H5Tinsert(t, field, 0, H5T_NATIVE_INT64);
  std::int64_t value = 0;
  std::optional<std::int64_t> done;
  if (rows_io(file, table, t, row, 1, &value, false)) {
    value = change(value);
    if (rows_io(file, table, t, row, 1, &value, true)) done = value;
  }
  H5Tclose(t);
  return done;
}

bool set_int_attribute(hid_t file, const char* name, std::int64_t value) {
  const hid_t a = H5Aopen(file, name, H5P_DEFAULT);
  if (a < 0) return false;
  const herr_t ok = H5Awrite(a, H5T_NATIVE_INT64, &value);
  H5Aclose(a);
  return ok >= 0;
}

// A /blocks field and a value no probe writes there (the row's own numbers make most of them contradictions: the
// test trace's rows are 64 x 64 with 128 blocks and 4000-odd nonzero values).
struct BlockEdit {
  const char* field;
  double value;
  bool real;  // an f64 field (else int64; what_if: the file's 8-bit enumeration)
};
const BlockEdit kBlockEdits[] = {
    {"numel", 4095, false},          {"nonzero", 5000, false},         {"underflow", -1, false},
    {"saturated", 4096, false},      {"blocks", 1e6, false},            {"blocks_nan", 129, false},
    {"max_range_block", 128, false}, {"max_range_row", 64, false},      {"worst_block_col", -5, false},
    {"worst_block_underflow", 1e9, false}, {"rows", -64, false},        {"module", -1, false},
    {"copy", 1e15, false},           {"max_block_range", NAN, true},    {"rel_rms_error", -0.5, true},
    {"scale_log2_max", INFINITY, true}, {"scale_log2_median", NAN, true}, {"what_if", 7, false},
};

bool edit_block_field(hid_t file, hsize_t row, const BlockEdit& e) {
  if (std::string_view(e.field) == "what_if") {
    const hid_t ds = H5Dopen2(file, "/blocks", H5P_DEFAULT);
    const hid_t file_type = H5Dget_type(ds);
    const hid_t member = H5Tget_member_type(file_type, static_cast<unsigned>(H5Tget_member_index(file_type, "what_if")));
    const hid_t t = H5Tcreate(H5T_COMPOUND, 1);
    H5Tinsert(t, "what_if", 0, member);
    std::int8_t v = static_cast<std::int8_t>(e.value);
    const bool ok = rows_io(file, "blocks", t, row, 1, &v, true);
    H5Tclose(t);
    H5Tclose(member);
    H5Tclose(file_type);
    H5Dclose(ds);
    return ok;
  }
  const hid_t t = H5Tcreate(H5T_COMPOUND, 8);
  H5Tinsert(t, e.field, 0, e.real ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64);
  double d = e.value;
  std::int64_t i = static_cast<std::int64_t>(e.value);
  const bool ok = rows_io(file, "blocks", t, row, 1, e.real ? static_cast<void*>(&d) : static_cast<void*>(&i), true);
  H5Tclose(t);
  return ok;
}

enum class Kind {
  flip, heap_flip, truncate, zero_block, zero_index, edit_index, crafted_size, edit_attribute, edit_strings, edit_precision,
  edit_updates, edit_grads_flag, edit_blocks, count
};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::flip: return "byte flips";
    case Kind::heap_flip: return "global heap flips";
    case Kind::truncate: return "truncation";
    case Kind::zero_block: return "zeroed block";
    case Kind::zero_index: return "zeroed /index";
    case Kind::edit_index: return "edited /index";
    case Kind::crafted_size: return "crafted size";
    case Kind::edit_attribute: return "edited attribute";
    case Kind::edit_strings: return "edited string table";
    case Kind::edit_precision: return "edited /precision row";
    case Kind::edit_updates: return "edited /updates row";
    case Kind::edit_blocks: return "edited /blocks row";
    case Kind::edit_grads_flag: return "edited /grads before_all_reduce";
    default: return "?";
  }
}

// Byte-level mutations of `bytes`; the kinds that need HDF5 fall back to these when the file cannot be
// opened for writing (a killed trace). Returns what was done.
std::string mutate_bytes(std::vector<unsigned char>& bytes, Kind kind, std::mt19937_64& rng, bool variable_length) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % std::max<std::size_t>(n, 1)); };
  if (kind == Kind::heap_flip && variable_length) {
    if (const auto heap = global_heap(bytes)) {
      // The collection's header and objects: the attributes' text lies in its first few hundred bytes.
      const std::size_t span = std::min<std::size_t>(bytes.size() - *heap, pick(2) == 0 ? 64 : 1024);
      const std::size_t at = *heap + pick(span);
      const int bit = static_cast<int>(pick(8));
      bytes[at] ^= static_cast<unsigned char>(1u << bit);
      return fmt::format("bit {} of byte {} (global heap + {})", bit, at, at - *heap);
    }
  }
  if (kind == Kind::truncate) {
    const std::size_t keep = pick(bytes.size());
    bytes.resize(keep);
    return fmt::format("truncated to {} bytes", keep);
  }
  if (kind == Kind::zero_block) {
    const std::size_t n = 1 + pick(pick(2) == 0 ? 64 : 4096);
    const std::size_t at = pick(bytes.size());
    const std::size_t end = std::min(bytes.size(), at + n);
    std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin() + static_cast<std::ptrdiff_t>(end), 0);
    return fmt::format("zeroed bytes [{}, {})", at, end);
  }
  const std::size_t flips = 1 + pick(4);
  std::string what = "flipped";
  for (std::size_t i = 0; i < flips; ++i) {
    const std::size_t at = pick(bytes.size());
    const auto x = static_cast<unsigned char>(1 + pick(255));
    bytes[at] ^= x;
    what += fmt::format(" byte {} ^ 0x{:02x}", at, x);
  }
  return what;
}

// HDF5-level mutations of a trace that HDF5 can open for writing; nullopt when it cannot.
// `shrunk`: a table was cut and /index rewritten to agree (its checksum recomputed, or absent before
// format_version 3): a self-consistent trace of fewer rows, which no reader can tell from a shorter run.
std::optional<std::string> mutate_with_hdf5(const fs::path& p, Kind kind, std::mt19937_64& rng, bool& shrunk) {
  auto pick = [&](std::uint64_t n) { return rng() % std::max<std::uint64_t>(n, 1); };
  const hid_t file = open_rw(p);
  if (file < 0) return std::nullopt;
  std::string what;
  IndexRows index;
  const bool have_index = read_index(file, index);
  const bool fix_crc = pick(2) == 0;  // a consistent forgery: the reader's value checks, not the checksum
  if (kind == Kind::zero_index && have_index) {
    const bool all = pick(2) == 0;
    for (std::size_t i = all ? 0 : index.rows.size() - std::min<std::size_t>(index.rows.size(), 1); i < index.rows.size(); ++i) {
      index.rows[i] = detail::IndexRecord{};
    }
    write_index(file, index, false);
    what = all ? "zeroed every /index row" : "zeroed the last /index row";
  } else if (kind == Kind::edit_index && have_index && !index.rows.empty()) {
    auto& row = index.rows[pick(3) == 0 ? pick(index.rows.size()) : index.rows.size() - 1];
    const std::size_t field = pick(1 + static_cast<std::uint64_t>(index.tables));
    std::int64_t v = field == 0 ? row.step : row.rows[field - 1];
    const std::int64_t values[] = {0, -1, v - 1, v + 1, v / 2, v * 2, std::int64_t{1} << 31, std::int64_t{1} << 62,
                                   std::numeric_limits<std::int64_t>::min(), static_cast<std::int64_t>(rng())};
    v = values[pick(std::size(values))];
    if (field == 0) row.step = v;
    else row.rows[field - 1] = v;
    if (pick(4) == 0) index.rows.resize(pick(index.rows.size() + 1));  // rows dropped
    write_index(file, index, fix_crc);
    what = fmt::format("/index field {} set to {}{}", field, v, fix_crc ? " (crc recomputed)" : "");
  } else if (kind == Kind::crafted_size && have_index && !index.rows.empty()) {
    const int t = static_cast<int>(pick(static_cast<std::uint64_t>(index.tables)));
    const hsize_t sizes[] = {hsize_t{1} << 31, hsize_t{1} << 40, static_cast<hsize_t>(index.rows.back().rows[t]) + 1 + pick(5000),
                             static_cast<hsize_t>(pick(static_cast<std::uint64_t>(index.rows.back().rows[t]) + 1))};
    const hsize_t size = sizes[pick(std::size(sizes))];
    set_extent(file, kTables[t], size);
    if (pick(2) == 0) {
      shrunk = size < static_cast<hsize_t>(index.rows.back().rows[t]) && (fix_crc || !index.has_crc);
      index.rows.back().rows[t] = static_cast<std::int64_t>(size);
      write_index(file, index, fix_crc);
    }
    what = fmt::format("/{} resized to {} rows", kTables[t], size);
  } else if (kind == Kind::edit_strings && rows_of(file, "strings") > 0) {
    // format_version 4's string table, edited through HDF5 (chunk checksums right): a byte of a text, a
    // field of an entry, or a row's text id set to one that names no string. (A row's id set to another
    // valid id is a consistent forgery, like a changed number: no reader can tell it from a real run.)
    const hsize_t strings = rows_of(file, "strings"), bytes = rows_of(file, "string_bytes");
    switch (pick(4)) {
      case 0: {
        const hsize_t at = pick(bytes);
        const std::int64_t x = static_cast<std::int64_t>(1 + pick(255));
        unsigned char b = 0;
        if (rows_io(file, "string_bytes", H5T_NATIVE_UCHAR, at, 1, &b, false)) {
          b ^= static_cast<unsigned char>(x);
          rows_io(file, "string_bytes", H5T_NATIVE_UCHAR, at, 1, &b, true);
        }
        what = fmt::format("byte {} of /string_bytes ^ 0x{:02x}", at, x);
        break;
      }
      case 1: {
        const char* fields[] = {"offset", "length", "crc32"};
        const char* field = fields[pick(3)];
        const hsize_t row = pick(strings);
        const std::int64_t delta = static_cast<std::int64_t>(pick(3)) == 0 ? std::int64_t{1} << 40 : 1 + static_cast<std::int64_t>(pick(7));
        const auto v = edit_int_field(file, "strings", field, row, [&](std::int64_t x) { return pick(2) == 0 ? x + delta : x - delta; });
        what = fmt::format("/strings row {} field {} set to {}", row, field, v ? *v : 0);
        break;
      }
      default: {
        const bool precision = rows_of(file, "precision") > 0 && pick(3) == 0;
        const char* table = precision ? "precision" : pick(2) == 0 ? "ops" : "events";
        const char* precision_fields[] = {"op", "module", "out_dtype", "phase"};  // phase: format_version 6
        const char* field = precision ? precision_fields[pick(std::size(precision_fields))]
                            : std::string_view(table) == "ops" ? (pick(2) == 0 ? "op" : "module") : "kind";
        const hsize_t rows = rows_of(file, table);
        const hsize_t row = pick(rows);
        const std::int64_t values[] = {-1, static_cast<std::int64_t>(strings), static_cast<std::int64_t>(strings) + 17,
                                       std::int64_t{1} << 62, std::numeric_limits<std::int64_t>::min()};
        const std::int64_t value = values[pick(std::size(values))];
        const auto v = edit_int_field(file, table, field, row, [&](std::int64_t) { return value; });
        what = fmt::format("/{} row {} field {} set to {}", table, row, field, v ? *v : 0);
        break;
      }
    }
  } else if (kind == Kind::edit_precision && rows_of(file, "precision") > 0) {
    // A field of a /precision row set to a value no twin writes (chunk checksums right): a negative count, a
    // NaN or negative error, a flag other than 0 or 1. The reader must refuse the row (naming it and the field).
    const hsize_t row = pick(rows_of(file, "precision"));
    const char* counts[] = {"numel", "flips", "exact"};
    const char* measures[] = {"local_max_rel", "local_mean_rel", "local_max_ulp", "acc_max_rel", "acc_mean_rel",
                              "acc_max_ulp", "in_acc_max_rel", "in_acc_mean_rel", "bits", "cond"};
    const char* flags[] = {"local", "followed"};
    const int which = static_cast<int>(pick(3));
    const char* field = which == 0 ? counts[pick(std::size(counts))] : which == 1 ? measures[pick(std::size(measures))] : flags[pick(2)];
    const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(double));
    bool ok = false;
    if (which == 0) {
      H5Tinsert(t, field, 0, H5T_NATIVE_INT64);
      std::int64_t v = -1 - static_cast<std::int64_t>(pick(1000));
      ok = rows_io(file, "precision", t, row, 1, &v, true);
    } else if (which == 1) {
      H5Tinsert(t, field, 0, H5T_NATIVE_DOUBLE);
      double v = pick(2) == 0 ? std::nan("") : -1.5;
      ok = rows_io(file, "precision", t, row, 1, &v, true);
    } else {
      // The file's own 8-bit enumeration: HDF5 then stores the byte as it is, though no member has its value.
      const hid_t ds = H5Dopen2(file, "/precision", H5P_DEFAULT);
      const hid_t file_type = H5Dget_type(ds);
      const hid_t member = H5Tget_member_type(file_type, static_cast<unsigned>(H5Tget_member_index(file_type, field)));
      H5Tinsert(t, field, 0, member);
      H5Tclose(member);
      H5Tclose(file_type);
      H5Dclose(ds);
      std::int8_t v = static_cast<std::int8_t>(2 + pick(100));
      ok = rows_io(file, "precision", t, row, 1, &v, true);
    }
    H5Tclose(t);
    what = fmt::format("/precision row {} field {} set to a value no twin writes{}", row, field, ok ? "" : " (failed)");
  } else if (kind == Kind::edit_updates && rows_of(file, "updates") > 0) {
    // A field of an /updates row set to a value no probe writes (chunk checksums right): a negative count, more
    // swamped than non-zero updates (or non-zero than elements), a NaN, negative or infinite mean. The reader
    // must refuse the row (naming it and the field).
    const hsize_t row = pick(rows_of(file, "updates"));
    const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(double));
    bool ok = false;
    const char* field = "";
    if (pick(2) == 0) {
      const char* counts[] = {"numel", "nonzero", "swamped"};
      field = counts[pick(3)];
      H5Tinsert(t, field, 0, H5T_NATIVE_INT64);
      // Negative; or past the count above it (nonzero past numel, swamped past nonzero): a huge value.
      std::int64_t v = pick(2) == 0 ? -1 - static_cast<std::int64_t>(pick(1000)) : std::int64_t{1} << 40;
      if (std::string_view(field) == "numel" && v > 0) v = -v;  // a huge numel is no contradiction by itself
      ok = rows_io(file, "updates", t, row, 1, &v, true);
    } else {
      field = pick(2) == 0 ? "param_abs_mean" : "update_abs_mean";
      H5Tinsert(t, field, 0, H5T_NATIVE_DOUBLE);
      const double values[] = {std::nan(""), -1.5, std::numeric_limits<double>::infinity()};
      double v = values[pick(3)];
      ok = rows_io(file, "updates", t, row, 1, &v, true);
    }
    H5Tclose(t);
    what = fmt::format("/updates row {} field {} set to a value no probe writes{}", row, field, ok ? "" : " (failed)");
  } else if (kind == Kind::edit_grads_flag && rows_of(file, "grads") > 0) {
    // The /grads flag before_all_reduce (format_version 6) of a row set to a byte no probe writes (2 to 101, in the
    // file's own 8-bit enumeration, chunk checksums right): the reader must refuse the row, naming it and the field.
    // (0 and 1 swapped would be a consistent forgery, which no checksum in the file can tell.) Older traces have no
    // such field: the edit fails and the mutant is the original.
    const hsize_t row = pick(rows_of(file, "grads"));
    const hid_t ds = H5Dopen2(file, "/grads", H5P_DEFAULT);
    const hid_t file_type = H5Dget_type(ds);
    const int index = H5Tget_member_index(file_type, "before_all_reduce");
    bool ok = false;
    std::int8_t v = 0;
    if (index >= 0) {
      const hid_t member = H5Tget_member_type(file_type, static_cast<unsigned>(index));
      const hid_t t = H5Tcreate(H5T_COMPOUND, 1);
      H5Tinsert(t, "before_all_reduce", 0, member);
      H5Tclose(member);
      if (rows_io(file, "grads", t, row, 1, &v, false)) {
        v = static_cast<std::int8_t>(2 + pick(100));
        ok = rows_io(file, "grads", t, row, 1, &v, true);
      }
      H5Tclose(t);
    }
    H5Tclose(file_type);
    H5Dclose(ds);
    what = fmt::format("/grads row {} before_all_reduce set to {}{}", row, v, ok ? "" : " (failed)");
  } else if (kind == Kind::edit_blocks && rows_of(file, "blocks") > 0) {
    // A field of a /blocks row set to a value no probe writes (chunk checksums right): the reader must refuse the row,
    // naming it and the field (edit_block_field).
    const hsize_t row = pick(rows_of(file, "blocks"));
    const BlockEdit& e = kBlockEdits[pick(std::size(kBlockEdits))];
    const bool ok = edit_block_field(file, row, e);
    what = fmt::format("/blocks row {} field {} set to {}{}", row, e.field, e.value, ok ? "" : " (failed)");
  } else if (kind == Kind::edit_attribute) {
    switch (pick(6)) {
      case 0: set_text_attribute(file, "precision", "fp64"); what = "precision fp64"; break;
      case 1: set_int_attribute(file, "complete", 7); what = "complete 7"; break;
      case 2: set_text_attribute(file, "config", "{\"lr\": nan"); what = "config not JSON"; break;
      case 3: set_text_attribute(file, "model", "\xff\xfe"); what = "model not UTF-8"; break;
      case 4: set_int_attribute(file, "format_version", static_cast<std::int64_t>(pick(5)) - 1); what = "format_version"; break;
      default: set_text_attribute(file, "device", "cuda:9"); what = "device changed"; break;
    }
  } else {
    H5Fclose(file);
    return std::nullopt;
  }
  H5Fclose(file);
  return what;
}

// --- running a case in a child ---

enum Result : int {
  kIntact = 0,      // read in full, no damage note
  kRefused = 3,     // an ampscope Error (TraceError, CheckpointError)
  kMarked = 4,      // read with a damage note (or an incomplete mark)
  kSilent = 5,      // fewer steps or rows than the original, or other numbers, and no note
  kUnexpected = 6,  // an exception that is not ampscope's
  kNoMemory = 7,    // bad_alloc
};

struct Tally {
  std::int64_t trials = 0, intact = 0, refused = 0, marked = 0, crashes = 0, hangs = 0, silent = 0, unexpected = 0,
               memory = 0;
  std::vector<std::string> failures;
  std::map<std::string, std::int64_t> by_kind_refused;
  void add(const Tally& o) {
    trials += o.trials, intact += o.intact, refused += o.refused, marked += o.marked, crashes += o.crashes, hangs += o.hangs;
    silent += o.silent, unexpected += o.unexpected, memory += o.memory;
    failures.insert(failures.end(), o.failures.begin(), o.failures.end());
  }
  std::int64_t failed() const { return crashes + hangs + silent + unexpected + memory; }
  std::string line() const {
    return fmt::format("{} trials: {} intact, {} refused with an error, {} read with a damage note; {} crashes, {} hangs, "
                       "{} silent, {} unexpected exceptions, {} over the memory bound",
                       trials, intact, refused, marked, crashes, hangs, silent, unexpected, memory);
  }
};

// Runs `body` in a child with the limits; `note` is where the child leaves a line for the parent.
struct Child {
  pid_t pid = -1;
  std::string label;
  fs::path note;
  fs::path mutant;  // removed when the case is done
};

Child start_child(const std::string& label, const fs::path& note, const std::function<int()>& body,
                  const fs::path& mutant = {}) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(kCaseSeconds);
    if (!kSanitized) {
      const rlimit limit{kMemoryLimit, kMemoryLimit};
      setrlimit(RLIMIT_AS, &limit);
    }
    int code = kUnexpected;
    try {
      code = body();
    } catch (const std::bad_alloc&) {
      code = kNoMemory;
    } catch (const std::exception& e) {
      std::ofstream(note) << "unexpected exception: " << e.what();
      code = kUnexpected;
    }
    std::fflush(nullptr);
    _exit(code);
  }
  return {pid, label, note, mutant};
}

void finish_child(const Child& c, Tally& tally) {
  int status = 0;
  rusage usage{};
  wait4(c.pid, &status, 0, &usage);
  ++tally.trials;
  if (!c.mutant.empty()) {
    std::error_code ec;
    fs::remove(c.mutant, ec);
  }
  std::string note;
  if (fs::exists(c.note)) {
    std::ifstream in(c.note);
    std::getline(in, note, '\0');
    std::error_code ec;
    fs::remove(c.note, ec);
  }
  auto fail = [&](std::int64_t& counter, std::string_view what) {
    ++counter;
    if (tally.failures.size() < 20) tally.failures.push_back(fmt::format("{}: {} {}", c.label, what, note));
  };
  if (static_cast<std::uint64_t>(usage.ru_maxrss) * 1024 > kMemoryLimit) fail(tally.memory, "peak RSS over the bound");
  if (WIFSIGNALED(status)) {
    if (WTERMSIG(status) == SIGALRM) fail(tally.hangs, fmt::format("hang (over {} s)", kCaseSeconds));
    else fail(tally.crashes, fmt::format("crash (signal {})", WTERMSIG(status)));
    return;
  }
  switch (WEXITSTATUS(status)) {
    case kIntact: ++tally.intact; break;
    case kRefused: ++tally.refused; break;
    case kMarked: ++tally.marked; break;
    case kSilent: fail(tally.silent, "silent partial or changed result"); break;
    case kNoMemory: fail(tally.memory, "bad_alloc"); break;
    case kUnexpected: fail(tally.unexpected, "unexpected"); break;
    default: fail(tally.crashes, fmt::format("exit status {}", WEXITSTATUS(status)));  // sanitizer reports exit 1
  }
}

// What a trace mutant must give: an ampscope error, or a read whose loss of steps or rows carries a note.
int check_trace(const Base& base, const fs::path& mutant, const fs::path& note, bool shrunk = false) {
  try {
    TraceReader r(mutant);
    const analysis::Report rep = analysis::analyse(r);
    (void)analysis::render_text(rep);
    (void)analysis::render_json(rep);
    TraceReader original(base.path);
    const analysis::DiffReport d = analysis::diff(original, r);
    (void)analysis::render_text(d);
    (void)analysis::render_json(d);
    const bool marked = !rep.damage.empty() || (base.complete && !rep.complete);
    if (rep.steps < base.steps || rep.op_rows < base.op_rows || rep.precision.rows < base.precision_rows ||
        rep.swamped.rows < base.update_rows || rep.blocks.rows < base.block_rows) {
      if (marked) return kMarked;
      if (shrunk) return kIntact;  // a self-consistent shorter trace
      std::ofstream(note) << fmt::format("{} steps, {} op rows, {} precision rows, {} update rows, {} block rows of {}, {}, {}, {} "
                                         "and {}, no damage note",
                                         rep.steps, rep.op_rows, rep.precision.rows, rep.swamped.rows, rep.blocks.rows,
                                         base.steps, base.op_rows, base.precision_rows, base.update_rows, base.block_rows);
      return kSilent;
    }
    if (!rep.damage.empty() && d.damage_b.empty()) {
      std::ofstream(note) << "the diff lost the damage note";
      return kSilent;
    }
    if (marked) return kMarked;
    // Unmarked: every text of every row as written (a shorter forgery: those of the rows it has).
    const auto texts = texts_of(r);
    for (std::size_t t = 0; t < texts.size(); ++t) {
      const auto& got = texts[t];
      const auto& want = base.texts[t];
      for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        if (got[i] != want[i]) {
          std::ofstream(note) << fmt::format("row text '{}' reads as '{}', no damage note", want[i], got[i]);
          return kSilent;
        }
      }
      if (got.size() < want.size() && !shrunk) {
        std::ofstream(note) << fmt::format("{} of {} row texts ({}), no damage note", got.size(), want.size(), want.front());
        return kSilent;
      }
    }
    return kIntact;
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find(mutant.string()) == std::string::npos) {
      std::ofstream(note) << "the error does not name the file: " << what;
      return kUnexpected;
    }
    return kRefused;
  }
}

int check_checkpoint(const Corpus& c, const fs::path& mutant, const fs::path& note) {
  samples::TrainConfig config = c.resume;
  config.resume = mutant.string();
  try {
    const samples::TrainResult result = samples::train(config);
    if (result.losses != c.resumed_losses) {
      std::ofstream(note) << "the checkpoint loaded and trained to other losses";
      return kSilent;
    }
    return kIntact;
  } catch (const Error&) {
    return kRefused;
  }
}

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strtoll(v, nullptr, 10);
}

// Runs `cases` cases, two children at a time; `make(i)` builds case i in the parent and returns the
// child's label and body.
// The mutant of case i is dir/mutant-i.h5 (removed when the case is done).
Tally run_cases(std::int64_t cases, const fs::path& dir,
                const std::function<std::pair<std::string, std::function<int()>>(std::int64_t)>& make) {
  Tally tally;
  const std::size_t parallel = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
  std::vector<Child> running;
  for (std::int64_t i = 0; i < cases; ++i) {
    if (running.size() >= parallel) {
      finish_child(running.front(), tally);
      running.erase(running.begin());
    }
    auto [label, body] = make(i);
    running.push_back(start_child(label, dir / fmt::format("note-{}.txt", i), body, dir / fmt::format("mutant-{}.h5", i)));
  }
  for (const Child& c : running) finish_child(c, tally);
  return tally;
}

// --- the reproducers ---

// Runs `body` in a child with the limits; fails the test on a crash, hang or blow-up.
int isolated(const std::function<int()>& body) {
  TempDir dir;
  const Child c = start_child("reproducer", dir.file("note.txt"), body);
  int status = 0;
  waitpid(c.pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string error_of(const fs::path& p) {
  try {
    TraceReader r(p);
    analysis::analyse(r);
  } catch (const TraceError& e) {
    return e.what();
  }
  return "";
}

// Each /blocks edit the seeded mutants make, on the first row of the blocks trace (step 0, fc1's rowwise input, with
// scales and a worst block): the reader (through analyse, as report does) refuses it with an error naming the file,
// '/blocks', the row and the field, and crashes on none.
TEST(trace_fuzz_test, every_blocks_edit_is_refused_naming_the_table_row_and_field) {
  const Base& blocks = corpus().traces[10];
  ASSERT_EQ(blocks.name, "blocks");
  TempDir dir;
  for (const BlockEdit& e : kBlockEdits) {
    SCOPED_TRACE(e.field);
    const fs::path path = dir.file(fmt::format("edit-{}.h5", e.field));
    fs::copy_file(blocks.path, path);
    const hid_t file = open_rw(path);
    ASSERT_GE(file, 0);
    ASSERT_TRUE(edit_block_field(file, 0, e));
    H5Fclose(file);
    const std::string error = error_of(path);
    EXPECT_NE(error.find("row 0 of '/blocks': its field"), std::string::npos) << error;
    EXPECT_NE(error.find(e.field), std::string::npos) << error;
    EXPECT_NE(error.find(path.string()), std::string::npos) << error;
  }
}

TEST(trace_fuzz_test, every_bit_of_an_old_traces_global_heap_objects_gives_an_error_or_a_read) {
  // Issue 16: a flipped byte in the GCOL block of a format_version 2 trace segfaulted H5HG_read or looped
  // in H5HG__protect. Every bit of the collection's header and of its objects' index and size fields
  // (the free space's included), one at a time, in children; the seeded mutants flip the text too.
  const fs::path fixture = kFixtures / "v2-mlp-log-zero-full.h5";
  const std::vector<unsigned char> original = read_bytes(fixture);
  const auto heap = global_heap(original);
  ASSERT_TRUE(heap) << "the v2 fixture has its variable-length attributes in a global heap collection";
  TempDir dir;
  std::vector<std::size_t> fields;  // byte offsets in the file
  for (std::size_t b = 0; b < 16; ++b) fields.push_back(*heap + b);
  std::size_t objects_end = *heap + 16;  // past the last object before the free space (index 0)
  for (;;) {
    for (std::size_t b : {0, 1, 8, 9, 10, 11, 12, 13, 14, 15}) fields.push_back(objects_end + b);
    if (objects_end + 16 > original.size() || (original[objects_end] | original[objects_end + 1]) == 0) break;
    std::uint64_t size = 0;
    for (int b = 0; b < 8; ++b) size |= std::uint64_t{original[objects_end + 8 + static_cast<std::size_t>(b)]} << (8 * b);
    objects_end += 16 + (size + 7) / 8 * 8;
  }
  objects_end += 16;  // the free-space object's header
  ASSERT_EQ(fields.size(), 16u + 10u * 7u) << "six text attributes and the free space";
  Tally tally = run_cases(static_cast<std::int64_t>(fields.size() * 8), dir.file(""), [&](std::int64_t i) {
    const std::size_t at = fields[static_cast<std::size_t>(i / 8)];
    const int bit = static_cast<int>(i % 8);
    const fs::path mutant = dir.file(fmt::format("mutant-{}.h5", i));
    std::vector<unsigned char> bytes = original;
    bytes[at] ^= static_cast<unsigned char>(1u << bit);
    write_bytes(mutant, bytes);
    const Base base = corpus().traces[4];  // the v2 fixture
    return std::pair{fmt::format("bit {} of heap byte {}", bit, at - *heap),
                     std::function<int()>([base, mutant, note = dir.file(fmt::format("note-{}.txt", i))] {
                       return check_trace(base, mutant, note);
                     })};
  });
  for (const auto& f : tally.failures) ADD_FAILURE() << f;
  EXPECT_EQ(tally.failed(), 0) << tally.line();
  EXPECT_GT(tally.refused, 0) << tally.line();  // damaged sizes and signatures are errors
  RecordProperty("heap_flips", tally.line());
  fmt::print("global heap bit flips: {}\n", tally.line());

  // Named: an object size changed, so it no longer matches the attribute's length.
  std::vector<unsigned char> bytes = original;
  bytes[*heap + 16 + 8] ^= 0x40;  // the size of the collection's first object
  const fs::path damaged = dir.file("size.h5");
  write_bytes(damaged, bytes);
  EXPECT_NE(error_of(damaged).find("is damaged"), std::string::npos) << error_of(damaged);
  // The free space's size set to 0, which made HDF5 loop for ever.
  bytes = original;
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(objects_end - 8), bytes.begin() + static_cast<std::ptrdiff_t>(objects_end), 0);
  write_bytes(damaged, bytes);
  EXPECT_EQ(isolated([&] { return error_of(damaged).find("free space is damaged") != std::string::npos ? 0 : 1; }), 0)
      << error_of(damaged);
}

TEST(trace_fuzz_test, a_zeroed_index_of_a_complete_trace_is_read_whole_and_marked_damaged) {
  // Issue 16: an attention-overflow run whose /index was zeroed read as "OK: no NaN/Inf found in 0 steps".
  TempDir dir;
  const auto path = dir.file("att.h5");
  train_trace(config("transformer", 3, path, "attention-overflow"));
  std::int64_t steps = 0, rows = 0;
  {
    TraceReader r(path);
    const auto rep = analysis::analyse(r);
    steps = rep.steps, rows = rep.op_rows;
    ASSERT_FALSE(rep.healthy());
  }
  const hid_t file = open_rw(path);
  ASSERT_GE(file, 0);
  IndexRows index;
  ASSERT_TRUE(read_index(file, index));
  for (auto& r : index.rows) r = detail::IndexRecord{};
  ASSERT_TRUE(write_index(file, index, false));
  H5Fclose(file);

  std::optional<TraceReader> r(std::in_place, path);
  const analysis::Report rep = analysis::analyse(*r);
  r.reset();  // HDF5 opens a file once per process: closed before it is opened for writing below
  EXPECT_EQ(rep.steps, steps);
  EXPECT_EQ(rep.op_rows, rows);
  EXPECT_FALSE(rep.healthy());
  ASSERT_FALSE(rep.damage.empty());
  EXPECT_NE(rep.damage.front().find("rows of '/index' are damaged"), std::string::npos) << rep.damage.front();
  const std::string text = analysis::render_text(rep);
  EXPECT_EQ(text.rfind("DAMAGED: ", 0), 0u) << text;
  EXPECT_NE(analysis::render_json(rep).find("\"damage\": [\n"), std::string::npos);

  // The same with a consistent forgery (checksums recomputed over the zeros): the complete trace's
  // tables hold more rows than its last /index row counts.
  const hid_t again = open_rw(path);
  ASSERT_GE(again, 0);
  ASSERT_TRUE(write_index(again, index, true));
  H5Fclose(again);
  TraceReader forged(path);
  const analysis::Report rep2 = analysis::analyse(forged);
  EXPECT_EQ(rep2.steps, steps);
  ASSERT_EQ(rep2.damage.size(), 1u);
  EXPECT_NE(rep2.damage[0].find("does not count every row of this complete trace (0 of 3 rows of '/steps'"), std::string::npos)
      << rep2.damage[0];

  // And the diff says which run is damaged.
  TraceReader a(path), b(path);
  const analysis::DiffReport d = analysis::diff(a, b);
  EXPECT_EQ(d.damage_a.size(), 1u);
  EXPECT_NE(analysis::render_text(d).find("DAMAGED: run b: "), std::string::npos);
}

TEST(trace_fuzz_test, a_table_resized_to_2_31_unwritten_rows_is_refused_without_reading_them) {
  // Issue 16: /ops resized to 2^31 rows with a matching last /index row made report grow to 24 GB.
  TempDir dir;
  const auto path = dir.file("big.h5");
  fs::copy_file(corpus().traces[0].path, path);
  const hid_t file = open_rw(path);
  ASSERT_GE(file, 0);
  ASSERT_TRUE(set_extent(file, "ops", hsize_t{1} << 31));
  IndexRows index;
  ASSERT_TRUE(read_index(file, index));
  index.rows.back().rows[1] = std::int64_t{1} << 31;
  ASSERT_TRUE(write_index(file, index, true));
  H5Fclose(file);
  // In a child under the memory limit: a read of the rows would fail with bad_alloc there.
  EXPECT_EQ(isolated([&] {
              return error_of(path).find("'/ops' claims 2147483648 rows") != std::string::npos ? 0 : 1;
            }),
            0)
      << error_of(path);
}

TEST(trace_fuzz_test, counts_past_the_tables_are_rows_lost_and_an_undercounting_last_row_is_used_with_a_note) {
  TempDir dir;
  const Base& killed = corpus().traces[2];
  ASSERT_FALSE(killed.complete);
  // A killed trace cannot be opened for writing; edit a complete one's /index, then take complete back.
  const auto path = dir.file("lost.h5");
  fs::copy_file(corpus().traces[0].path, path);
  const hid_t file = open_rw(path);
  ASSERT_GE(file, 0);
  IndexRows index;
  ASSERT_TRUE(read_index(file, index));
  index.rows.back().rows[0] += 10;  // 10 steps more than /steps holds
  ASSERT_TRUE(write_index(file, index, true));
  ASSERT_TRUE(set_int_attribute(file, "complete", 0));
  H5Fclose(file);
  // complete is outside attributes_crc32 (the writer rewrites it at close): the trace reads as incomplete.
  {
    TraceReader r(path);
    EXPECT_FALSE(r.complete());
    const auto damage = r.damage();
    ASSERT_EQ(damage.size(), 1u);
    EXPECT_NE(damage[0].find("rows of '/steps', which holds 5: 10 rows lost"), std::string::npos) << damage[0];
    EXPECT_EQ(r.steps().size(), 5u);
  }

  // A last row that counts fewer rows than the one before it is damage: the one before is used.
  const hid_t again = open_rw(path);
  ASSERT_GE(again, 0);
  index.rows.back() = index.rows[index.rows.size() - 2];
  index.rows.back().rows[1] -= 1;
  ASSERT_TRUE(write_index(again, index, true));
  H5Fclose(again);
  TraceReader s(path);
  ASSERT_EQ(s.damage().size(), 1u);
  EXPECT_NE(s.damage()[0].find("fewer rows or an earlier step than row"), std::string::npos) << s.damage()[0];
}

TEST(trace_fuzz_test, a_fifo_or_a_device_at_the_lock_file_is_never_opened_when_the_reader_asks_for_a_writer) {
  // An incomplete trace whose last /index row is zeros: the reader asks the lock file whether a writer is still
  // writing that row. A lock file came with the trace, from whoever sent it; a FIFO there used to block that
  // open() for ever (issue 36). Read in a child process whose alarm ends it if it blocks.
  TempDir dir;
  const auto path = dir.file("pending.h5");
  fs::copy_file(corpus().traces[0].path, path);
  const hid_t file = open_rw(path);
  ASSERT_GE(file, 0);
  IndexRows index;
  ASSERT_TRUE(read_index(file, index));
  index.rows.back() = detail::IndexRecord{};
  ASSERT_TRUE(write_index(file, index, false));
  ASSERT_TRUE(set_int_attribute(file, "complete", 0));
  H5Fclose(file);
  const std::string lock = path.string() + ".lock";
  for (const std::string kind : {"fifo", "device"}) {
    fs::remove(lock);
    if (kind == "fifo") ASSERT_EQ(::mkfifo(lock.c_str(), 0600), 0);
    else fs::create_symlink("/dev/zero", lock);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(20);
      try {
        TraceReader r(path);
        // No writer holds it, so the zero row is damage, with a note (not a row still being written).
        const auto damage = r.damage();
        std::_Exit(!r.complete() && damage.size() == 1 && damage[0].find("zeros") != std::string::npos ? 0 : 1);
      } catch (...) {
        std::_Exit(2);
      }
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        << kind << ": the reader blocked on the lock file for 20 s";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << kind << ": status " << status << " (1: not read as an incomplete trace with a damage note, 2: refused)";
  }
}

TEST(trace_fuzz_test, root_attributes_are_checked_against_their_checksum_and_schema) {
  TempDir dir;
  const auto path = dir.file("attr.h5");
  auto edited = [&](const char* name, const std::string& text) {
    fs::remove(path);
    fs::copy_file(corpus().traces[0].path, path);
    const hid_t file = open_rw(path);
    EXPECT_GE(file, 0);
    EXPECT_TRUE(set_text_attribute(file, name, text));
    H5Fclose(file);
    return error_of(path);
  };
  // A changed byte in a format_version 3 attribute: the checksum.
  EXPECT_NE(edited("model", "mlq").find("the root attributes are damaged: their checksum attributes_crc32"), std::string::npos);
  EXPECT_NE(edited("precision", "fp17").find("attributes_crc32"), std::string::npos);
  // Older traces have no checksum: their values are checked.
  const auto old = dir.file("old.h5");
  auto edited_old = [&](const char* name, const std::string& text) {
    fs::remove(old);
    fs::copy_file(kFixtures / "v2-mlp-log-zero-full.h5", old);
    const hid_t file = open_rw(old);
    EXPECT_GE(file, 0);
    EXPECT_TRUE(set_text_attribute(file, name, text));
    H5Fclose(file);
  };
  edited_old("precision", "fp64");
  EXPECT_NE(error_of(old).find("the root attribute 'precision' is \"fp64\", not fp32, fp16 or bf16"), std::string::npos)
      << error_of(old);
  // fp8 came with format_version 7: an older trace that claims it is damaged, as before.
  edited_old("precision", "fp8");
  EXPECT_NE(error_of(old).find("the root attribute 'precision' is \"fp8\", not fp32, fp16 or bf16"), std::string::npos)
      << error_of(old);
  edited_old("model", "\xc3\x28");
  EXPECT_NE(error_of(old).find("'model' is not valid UTF-8"), std::string::npos) << error_of(old);
  edited_old("config", "{\"lr\": nan}");
  {
    TraceReader r(old);
    ASSERT_EQ(r.damage().size(), 1u);
    EXPECT_EQ(r.damage()[0], "the root attribute 'config' is not valid JSON");
  }
  const hid_t file = open_rw(old);
  ASSERT_TRUE(set_int_attribute(file, "complete", 2));
  H5Fclose(file);
  EXPECT_NE(error_of(old).find("the root attribute 'complete' is 2, not 0 or 1"), std::string::npos) << error_of(old);
}

TEST(trace_fuzz_test, old_traces_are_read_without_the_global_heap_and_say_so_nowhere) {
  // The fixtures of format_version 1 and 2 read as they did: attributes from their collection, no damage.
  for (const char* name : {"v1-mlp-log-zero.h5", "v2-mlp-log-zero-full.h5"}) {
    TraceReader r(kFixtures / name);
    EXPECT_LT(r.format_version(), 3);
    EXPECT_EQ(r.run_info().model, "mlp");
    EXPECT_EQ(r.run_info().precision, "fp16");
    EXPECT_NE(r.run_info().config.find("\"scenario\""), std::string::npos);
    EXPECT_TRUE(r.damage().empty());
  }
}

// --- the seeded mutants ---

TEST(trace_fuzz_test, seeded_trace_mutants_never_crash_hang_blow_up_or_lose_rows_silently) {
  const Corpus& c = corpus();
  const std::int64_t cases = env_int("AMPSCOPE_FUZZ_CASES", kSanitized ? 300 : 1000);
  const auto seed = static_cast<std::uint64_t>(env_int("AMPSCOPE_FUZZ_SEED", 16));
  TempDir dir;
  std::map<std::string, Tally> by_kind;
  std::vector<std::vector<unsigned char>> originals;
  for (const Base& b : c.traces) originals.push_back(read_bytes(b.path));
  std::vector<std::string> kinds(static_cast<std::size_t>(cases));
  const auto started = std::chrono::steady_clock::now();
  const Tally tally = run_cases(cases, dir.file(""), [&](std::int64_t i) {
    std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(i));
    const std::size_t b = rng() % c.traces.size();
    const Base& base = c.traces[b];
    auto kind = static_cast<Kind>(rng() % static_cast<std::uint64_t>(Kind::count));
    const fs::path mutant = dir.file(fmt::format("mutant-{}.h5", i));
    std::vector<unsigned char> bytes = originals[b];
    std::string what;
    bool shrunk = false;
    if (kind >= Kind::zero_index) {
      write_bytes(mutant, bytes);
      if (auto done = mutate_with_hdf5(mutant, kind, rng, shrunk)) {
        what = *done;
      } else {
        kind = Kind::flip;
      }
    }
    if (what.empty()) {
      what = mutate_bytes(bytes, kind, rng, base.variable_length);
      write_bytes(mutant, bytes);
    }
    kinds[static_cast<std::size_t>(i)] = kind_name(kind);
    const std::string label = fmt::format("case {} (seed {}): {} of {}: {}", i, seed, kind_name(kind), base.name, what);
    const fs::path note = dir.file(fmt::format("note-{}.txt", i));
    return std::pair{label, std::function<int()>([&base, mutant, note, shrunk] { return check_trace(base, mutant, note, shrunk); })};
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& f : tally.failures) ADD_FAILURE() << f;
  EXPECT_EQ(tally.failed(), 0) << tally.line();
  EXPECT_EQ(tally.trials, cases);
  // The mutants reach every outcome: intact (flips in unused bytes), errors and damage notes.
  EXPECT_GT(tally.refused, 0);
  EXPECT_GT(tally.marked, 0);
  fmt::print("trace mutants (seed {}, {:.1f} s{}): {}\n", seed, seconds, kSanitized ? ", sanitized" : "", tally.line());
}

TEST(trace_fuzz_test, seeded_checkpoint_mutants_are_refused_or_load_the_same_numbers) {
  const Corpus& c = corpus();
  const std::int64_t cases = std::max<std::int64_t>(1, env_int("AMPSCOPE_FUZZ_CASES", kSanitized ? 300 : 1000) / 5);
  const auto seed = static_cast<std::uint64_t>(env_int("AMPSCOPE_FUZZ_SEED", 16));
  TempDir dir;
  const std::vector<unsigned char> original = read_bytes(c.checkpoint);
  const auto started = std::chrono::steady_clock::now();
  const Tally tally = run_cases(cases, dir.file(""), [&](std::int64_t i) {
    std::mt19937_64 rng(seed * 7919u + static_cast<std::uint64_t>(i));
    const auto kind = static_cast<Kind>(rng() % 4);  // flips, heap flips (none here: flips), truncation, zeroed block
    std::vector<unsigned char> bytes = original;
    // Case 0 is the control: the checkpoint as saved must load and train to the same losses.
    const std::string what = i == 0 ? std::string("unchanged (control)") : mutate_bytes(bytes, kind, rng, false);
    const fs::path mutant = dir.file(fmt::format("mutant-{}.h5", i));
    write_bytes(mutant, bytes);
    const fs::path note = dir.file(fmt::format("note-{}.txt", i));
    return std::pair{fmt::format("checkpoint case {} (seed {}): {}", i, seed, what),
                     std::function<int()>([&c, mutant, note] { return check_checkpoint(c, mutant, note); })};
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& f : tally.failures) ADD_FAILURE() << f;
  EXPECT_EQ(tally.failed(), 0) << tally.line();
  EXPECT_GT(tally.refused, 0);
  EXPECT_GE(tally.intact, 1) << "the unchanged checkpoint did not load";
  fmt::print("checkpoint mutants (seed {}, {:.1f} s{}): {}\n", seed, seconds, kSanitized ? ", sanitized" : "", tally.line());
}

}  // namespace
}  // namespace ampscope::trace
