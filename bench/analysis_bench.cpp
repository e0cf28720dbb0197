// The analysis of traces of 1,000,000 op rows (issue 7): analysis::diff of two runs and analysis::analyse
// of one, each read from its HDF5 file as `ampscope diff` and `ampscope report` would. Target: each
// within 2 s on the development machine, with memory bounded by the rows read at once, not by the trace.
// The traces are written once, by a child process (so its memory does not count in this process's peak),
// into the temp folder: a tiny GPT of 29 blocks, 1000 op rows per step (forward, backward, scaler),
// 1000 steps, at level health, under a GradScaler at 65536 (backward rows hold values scaled by it, as a
// real fp16 run records them). Run a overflows once in forward (3/4 of the way, blocks.20.mlp.fc2's linear:
// +inf in its f16 output, an inf loss, the step skipped and the scale halved), which the report must diagnose
// as f16_overflow (an isolated overflow in backward alone would be the scaler's job, no anomaly). Run b has the same
// op sequence and the same overflow, with every statistic perturbed by about 0.1% and one planted
// divergence: at the middle step (500), blocks.7.attn's score matmul (its first matmul) twice as large, an
// rms difference the diff judges (against the threshold 0.2; absmax alone it only shows). Run c is the
// same model in fp32 (no casts, f32 everywhere, no scaler and no overflow: 884 rows per step, the same
// perturbation and planted divergence), the realistic partner of an fp16 run, whose steps differ in their
// op sequence and so take the aligner's hashed path, with every linear and matmul a dtype difference.
// `read_ops` reads run a's op rows in the same blocks as the diff does, without comparing anything: the
// reader's share of the diff's time; `open_and_index` the part of that spent opening the file and
// building the reader's step index. Results: bench/RESULTS.md.
//
// Each benchmark checks its own premise (rows counted; the diffs find the planted divergence where it was
// planted and the dtype differences and casts the runs have; the report finds the overflow and nothing
// else) and, when it breaks, stops with an error naming what it expected and what it found; the program
// then exits 1. `--steps N` writes N steps instead of 1000 (the planted divergence at N / 2): ctest runs
// `analysis_bench --steps 20` for those checks (tests/CMakeLists.txt, bench_premises).
//
//   build/bench/analysis_bench    # counters: the process's peak RSS before and after (getrusage ru_maxrss),
//                                 # and the benchmark's own peak (VmHWM, reset before it starts), in MiB
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probes/analysis/analysis.h"
#include "probes/analysis/diff.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"

namespace ampscope::trace {
namespace {

// The run's size (--steps): the planted divergence sits in the middle step, the overflow 3/4 of the way.
std::int64_t run_steps = 1000;
std::int64_t planted_step = 500;
std::int64_t overflow_step = 750;
constexpr int kBlocks = 29;  // 2 * (6 + 17 * 29) + 2 = 1000 op rows per step
constexpr double kScale = 65536;  // the fp16 runs' loss scale until the overflow halves it

// Where the divergence is planted (run b and c, forward) and where run a and b overflow (forward).
constexpr const char* kPlantedModule = "blocks.7.attn";
constexpr std::int64_t kPlantedNumel = 16 * 4 * 64 * 64;  // the score matmul, not the one with v
constexpr const char* kOverflowModule = "blocks.20.mlp.fc2";

bool is_planted(const OpRow& r) {
  return r.phase == Phase::forward && r.op == "matmul" && r.module == kPlantedModule && r.health.numel == kPlantedNumel;
}
bool is_overflow(const OpRow& r) { return r.phase == Phase::forward && r.op == "linear" && r.module == kOverflowModule; }

struct OpTemplate {
  Phase phase;
  std::string op, module, in_dtypes, out_dtype, shape, autocast;
  std::int64_t numel;
  double scale;
};

// One step of a tiny GPT under f16 autocast (fp16) or without autocast (fp32: no casts, f32 throughout).
std::vector<OpTemplate> gpt_step(bool fp16) {
  const std::string lp = fp16 ? " is on the lower_precision_fp list: runs in f16" : "";
  const std::string fp32 = fp16 ? " is on the fp32 list: runs in f32" : "";
  const std::string half = fp16 ? "f16" : "f32";
  std::vector<OpTemplate> fwd;
  auto add = [&](std::string op, std::string module, std::string in, std::string out, std::string shape, std::string why,
                 std::int64_t numel, double scale) {
    fwd.push_back({Phase::forward, std::move(op), std::move(module), std::move(in), std::move(out), std::move(shape),
                   std::move(why), numel, scale});
  };
  const auto why = [&](const char* op, const std::string& reason) { return reason.empty() ? std::string() : op + reason; };
  const std::string h3 = fmt::format("{0},{0},{0}", half), h2 = fmt::format("{0},{0}", half);
  const std::int64_t act = 16 * 64 * 128, att = 16 * 4 * 64 * 64;
  add("embedding", "tok_emb", "f32,i64", "f32", "[16, 64, 128]", "", act, 1.0);
  add("embedding", "pos_emb", "f32,i64", "f32", "[1, 64, 128]", "", 64 * 128, 0.02);
  add("add", "", "f32,f32", "f32", "[16, 64, 128]", "", act, 1.0);
  for (int b = 0; b < kBlocks; ++b) {
    const std::string p = fmt::format("blocks.{}", b);
    add("layer_norm", p + ".ln1", "f32,f32,f32", "f32", "[16, 64, 128]", why("layer_norm", fp32), act, 1.0);
    if (fp16) add("to", p + ".attn.qkv", "f32", "f16", "[16, 64, 128]", "", act, 1.0);
    add("linear", p + ".attn.qkv", h3, half, "[16, 64, 384]", why("linear", lp), 3 * act, 0.8);
    add("view", p + ".attn", half, half, "[16, 64, 3, 4, 32]", "", 3 * act, 0.8);
    add("matmul", p + ".attn", h2, half, "[16, 4, 64, 64]", why("matmul", lp), att, 4.0);
    add("mul", p + ".attn", half, half, "[16, 4, 64, 64]", "", att, 0.7);
    add("masked_fill", p + ".attn", half + ",bool", half, "[16, 4, 64, 64]", "", att, 0.7);
    add("softmax", p + ".attn", half, "f32", "[16, 4, 64, 64]", why("softmax", fp32), att, 0.03);
    if (fp16) add("to", p + ".attn", "f32", "f16", "[16, 4, 64, 64]", "", att, 0.03);
    add("matmul", p + ".attn", h2, half, "[16, 4, 64, 32]", why("matmul", lp), act, 0.5);
    add("linear", p + ".attn.proj", h3, half, "[16, 64, 128]", why("linear", lp), act, 0.5);
    add("add", p, "f32," + half, "f32", "[16, 64, 128]", "", act, 1.2);
    add("layer_norm", p + ".ln2", "f32,f32,f32", "f32", "[16, 64, 128]", why("layer_norm", fp32), act, 1.0);
    add("linear", p + ".mlp.fc1", h3, half, "[16, 64, 512]", why("linear", lp), 4 * act, 1.0);
    add("gelu", p + ".mlp.act", half, half, "[16, 64, 512]", "", 4 * act, 0.5);
    add("linear", p + ".mlp.fc2", h3, half, "[16, 64, 128]", why("linear", lp), act, 0.6);
    add("add", p, "f32," + half, "f32", "[16, 64, 128]", "", act, 1.4);
  }
  add("layer_norm", "ln_f", "f32,f32,f32", "f32", "[16, 64, 128]", why("layer_norm", fp32), act, 1.0);
  add("linear", "head", h2, half, "[16, 64, 256]", why("linear", lp), 16 * 64 * 256, 2.0);
  add("cross_entropy", "", half + ",i64", "f32", "[]", why("cross_entropy", fp32), 1, 5.5);
  std::vector<OpTemplate> step = fwd;
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    OpTemplate b = *it;
    b.phase = Phase::backward;
    b.autocast.clear();
    b.scale = it->scale * 1e-3;
    step.push_back(std::move(b));
  }
  step.push_back({Phase::scaler, "unscale_", "", "f32", "f32", "[]", "", 1, 1.0});
  step.push_back({Phase::scaler, "update", "", "f32", "f32", "[]", "", 1, 65536.0});
  return step;
}

// Writes one run. Statistics drift from step to step; `noise` perturbs each one (same base values for
// every run: the base comes from its own generator, the noise from another). An fp16 run has a GradScaler
// and overflows once (overflow_step); `plant` doubles the planted op's output at planted_step.
void write_run(const std::filesystem::path& path, bool fp16, double noise, bool plant) {
  const std::vector<OpTemplate> reference = gpt_step(true), own = gpt_step(fp16);
  TraceWriter w(path, {.precision = fp16 ? "fp16" : "fp32", .device = "cpu", .model = "tiny_gpt", .seed = 1,
                       .config = fmt::format(R"({{"blocks": {}}})", kBlocks)});
  std::mt19937_64 base_rng(42), noise_rng(7);
  // One distribution per engine: a normal distribution keeps the second value of each pair it draws, so
  // sharing one would let the noise shift the base values.
  std::normal_distribution<double> normal, noise_normal;
  std::uniform_real_distribution<double> uniform;
  OpRow row;
  double scale = fp16 ? kScale : 1.0;
  for (std::int64_t step = 0; step < run_steps; ++step) {
    std::int64_t seq = 0;
    bool overflowed = false;
    std::size_t k = 0;
    for (const OpTemplate& ref : reference) {
      // The base values are drawn for every op of the fp16 sequence, so an fp32 run (no casts) sees the
      // same values for the ops it shares: its casts are skipped after drawing.
      const double s = ref.scale * std::exp(0.05 * normal(base_rng));
      const double u1 = uniform(base_rng), m = normal(base_rng), r = normal(base_rng);
      if (!fp16 && ref.op == "to") continue;
      const OpTemplate& t = own[k++];
      auto perturb = [&](double v) { return noise > 0 ? v * (1 + noise * noise_normal(noise_rng)) : v; };
      row.step = step;
      row.seq = seq++;
      row.phase = t.phase;
      row.op = t.op;
      row.module = t.module;
      row.in_dtypes = t.in_dtypes;
      row.out_dtype = t.out_dtype;
      row.shape = t.shape;
      row.autocast = t.autocast;
      TensorHealth& h = row.health;
      h.numel = t.numel;
      h.absmax = perturb(4 * s * (1 + 0.1 * u1));
      h.max = h.absmax;
      h.min = -h.absmax;
      h.mean = perturb(s * 0.01 * m);
      h.rms = perturb(s * (1 + 0.05 * r));
      h.nan = h.pos_inf = h.neg_inf = 0;
      row.origin = false;
      // A GradScaler run records its backward values multiplied by the scale (the diff divides them back).
      if (t.phase == Phase::backward) {
        for (double* x : {&h.absmax, &h.max, &h.min, &h.mean, &h.rms}) *x *= scale;
      }
      if (plant && step == planted_step && is_planted(row)) {
        for (double* x : {&h.absmax, &h.max, &h.min, &h.mean, &h.rms}) *x *= 2;
      }
      if (fp16 && step == overflow_step && is_overflow(row)) {
        h.pos_inf = 3;
        row.origin = true;
        overflowed = true;
      }
      w.write(row);
    }
    StepRow sr;
    sr.step = step;
    sr.loss = 5.5 * std::exp(-static_cast<double>(step) / 2000.0) * (1 + (noise > 0 ? 1e-3 : 0));
    if (overflowed) sr.loss = std::numeric_limits<double>::infinity();
    sr.scale = scale;
    sr.found_inf = sr.skipped = overflowed;
    sr.scale_after = overflowed ? scale / 2 : scale;
    scale = sr.scale_after;
    w.write(sr);
    w.end_step(step);
  }
  w.close();
}

// Where the traces go: a folder of this process under the temp folder, removed at the end; or, with --cache DIR
// (or $AMPSCOPE_BENCH_CACHE), DIR/analysis-bench-<steps>, kept and reused by the next run of the same size (a
// trace of 100M rows takes minutes to write).
std::filesystem::path cache_root;  // empty: no cache
std::filesystem::path folder() {
  if (!cache_root.empty()) return cache_root / fmt::format("analysis-bench-{}", run_steps);
  static const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("ampscope-analysis-bench-{}", getpid());
  return dir;
}
// Written after the three traces are complete: what wrote them. A cached folder without it (a run stopped
// while writing) or with another generator's is written again.
constexpr const char* kCacheStamp = "analysis_bench generator 2 (scaled backward rows, rms plant, forward overflow)";
std::filesystem::path stamp_file() { return folder() / "complete"; }
// The stamp's line: the generator, the size, and the runs written (--write-only writes a and b alone, which
// bench/large_trace_bench.sh uses; the benchmarks need c too).
std::string stamp_line(bool with_c) { return fmt::format("{} steps {} runs {}\n", kCacheStamp, run_steps, with_c ? "abc" : "ab"); }
bool cached_traces_ready(bool need_c) {
  if (cache_root.empty()) return false;
  std::FILE* f = std::fopen(stamp_file().c_str(), "r");
  if (f == nullptr) return false;
  char line[256] = {};
  const bool read = std::fgets(line, sizeof line, f) != nullptr;
  std::fclose(f);
  return read && (std::string(line) == stamp_line(true) || (!need_c && std::string(line) == stamp_line(false)));
}
std::filesystem::path run_a() { return folder() / "a-fp16.h5"; }
std::filesystem::path run_b() { return folder() / "b-fp16-perturbed.h5"; }
std::filesystem::path run_c() { return folder() / "c-fp32.h5"; }

// The process's peak resident memory so far (getrusage): it only grows, so a benchmark raises it only
// when it needs more than everything before it.
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

// Linux can reset the peak (VmHWM) to the current resident size ("5" into /proc/self/clear_refs), which
// gives each benchmark its own peak. Returns false where that is not allowed.
bool reset_own_peak() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

double own_peak_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lf kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib / 1024.0;
}

// Call before the benchmark's loop: returns the process's peak so far.
double start_memory() {
  const double before = peak_rss_mib();
  reset_own_peak();
  return before;
}

void report_memory(benchmark::State& state, double before, std::int64_t rows) {
  state.counters["maxrss_MiB_before"] = before;
  state.counters["maxrss_MiB_after"] = peak_rss_mib();
  state.counters["own_peak_MiB"] = own_peak_mib();
  state.SetItemsProcessed(state.iterations() * rows);
}

// A broken premise: the benchmark stops with an error naming what it expected and what it found, and the
// program exits 1 (Google Benchmark alone would report the error and exit 0).
bool premise_broken = false;

// Collects the premises that do not hold, "what: expected X, found Y".
class Premises {
 public:
  template <class T, class U>
  void expect(const std::string& what, const T& expected, const U& found) {
    if (!(expected == found)) problems_.push_back(fmt::format("{}: expected {}, found {}", what, expected, found));
  }
  void fail(std::string problem) { problems_.push_back(std::move(problem)); }
  // True when every premise held; otherwise reports them and stops the benchmark.
  bool check(benchmark::State& state, const char* benchmark_name) {
    if (problems_.empty()) return true;
    const std::string text = fmt::format("premise broken: {}", fmt::join(problems_, "; "));
    std::fprintf(stderr, "analysis_bench: %s: %s\n", benchmark_name, text.c_str());
    premise_broken = true;
    state.SkipWithError(text.c_str());
    return false;
  }

 private:
  std::vector<std::string> problems_;
};

// What the generator writes, counted from its templates (not from the files): rows per step, and per
// step the rows only the fp16 run has (its casts) and the aligned rows whose dtypes differ from fp32's.
struct Expected {
  std::int64_t rows_fp16 = 0, rows_fp32 = 0, casts = 0, dtype_differences = 0;
};
Expected expected() {
  const std::vector<OpTemplate> a = gpt_step(true), c = gpt_step(false);
  Expected e;
  e.rows_fp16 = static_cast<std::int64_t>(a.size());
  e.rows_fp32 = static_cast<std::int64_t>(c.size());
  std::size_t k = 0;
  for (const OpTemplate& t : a) {
    if (t.op == "to") {
      ++e.casts;
      continue;
    }
    const OpTemplate& u = c.at(k++);
    if (t.in_dtypes != u.in_dtypes || t.out_dtype != u.out_dtype) ++e.dtype_differences;
  }
  return e;
}

std::string key_text(const analysis::OpKey& k) {
  return fmt::format("step {} {} {} in '{}' (occurrence {})", k.step, phase_name(k.phase), k.op, k.module, k.occurrence);
}

// Reads run a's op rows in blocks of 200 steps (as diff does at rows_per_read 200,000) and drops them.
void read_ops(benchmark::State& state) {
  const double before = start_memory();
  std::int64_t rows = 0;
  for (auto _ : state) {
    TraceReader r(run_a());
    rows = 0;
    for (std::int64_t s = 0; s < run_steps; s += 200) rows += static_cast<std::int64_t>(r.ops(s, s + 200).size());
  }
  Premises p;
  p.expect("op rows read from run a", run_steps * expected().rows_fp16, rows);
  if (!p.check(state, "read_ops")) return;
  report_memory(state, before, rows);
}

// Opens run a and reads step 0's rows: the reader's first ops() call builds its step index from the
// leading `step` bytes of every chunk of /ops (a small inflate per chunk, not a pass over the table).
void open_and_index(benchmark::State& state) {
  std::int64_t rows = 0;
  for (auto _ : state) {
    TraceReader r(run_a());
    rows = static_cast<std::int64_t>(r.ops(0, 1).size());
    benchmark::DoNotOptimize(rows);
  }
  Premises p;
  p.expect("op rows of step 0", expected().rows_fp16, rows);
  p.check(state, "open_and_index");
}

// The diff of run a with b_path, which must find the planted divergence first, where it was planted (the
// fp16-fp32 pair's overflow comes later; the planted divergence is not in run a, so it is first whichever
// of a and b_path it is counted in).
void diff_runs(benchmark::State& state, const std::filesystem::path& b_path, bool fp32, const char* name) {
  const double before = start_memory();
  const Expected e = expected();
  std::int64_t rows = 0;
  analysis::DiffReport d;
  for (auto _ : state) {
    TraceReader a(run_a()), b(b_path);
    d = analysis::diff(a, b, {.rows_per_read = state.range(0)});
    rows = a.row_counts().ops + b.row_counts().ops;
    benchmark::DoNotOptimize(d.ops_aligned);
  }
  Premises p;
  const std::int64_t rows_b = fp32 ? e.rows_fp32 : e.rows_fp16;
  p.expect("op rows in both traces", run_steps * (e.rows_fp16 + rows_b), rows);
  p.expect("steps compared", run_steps, d.steps_compared);
  p.expect("op rows aligned", run_steps * rows_b, d.ops_aligned);
  if (!d.first_divergence) {
    p.fail(fmt::format("first divergence: expected step {} forward matmul in '{}' (occurrence 0), found none",
                       planted_step, kPlantedModule));
  } else {
    const analysis::OpDiff& f = *d.first_divergence;
    const analysis::OpKey want{.step = planted_step, .phase = Phase::forward, .module = kPlantedModule, .op = "matmul"};
    const bool at_plant = f.key.step == want.step && f.key.phase == want.phase && f.key.module == want.module &&
                          f.key.op == want.op && f.key.occurrence == want.occurrence;
    if (!at_plant) {
      p.fail(fmt::format("first divergence: expected {}, found {} ({}, max_rel {:.3g})", key_text(want),
                         key_text(f.key), f.stat, f.max_rel));
    } else {
      p.expect("the planted divergence's statistic", std::string("rms"), f.stat);
    }
  }
  // Both fp16 runs overflow in the same step (both losses inf: no difference); the fp32 run does not.
  const std::string want_loss = fp32 ? fmt::format("step {}", overflow_step) : "none";
  const std::string found_loss = d.first_loss_divergence ? fmt::format("step {}", *d.first_loss_divergence) : "none";
  p.expect("first loss divergence", want_loss, found_loss);
  std::int64_t only_a = 0, only_b = 0, dtypes = 0;
  for (const analysis::Unmatched& u : d.only_in_a) only_a += u.count;
  for (const analysis::Unmatched& u : d.only_in_b) only_b += u.count;
  for (const analysis::DtypeDifference& g : d.dtype_differences) dtypes += g.count;
  p.expect("rows only in run a (its casts)", fp32 ? run_steps * e.casts : 0, only_a);
  p.expect("rows only in the other run", 0, only_b);
  p.expect("aligned rows with a dtype difference", fp32 ? run_steps * e.dtype_differences : 0, dtypes);
  if (!p.check(state, name)) return;
  state.counters["first_divergence_step"] = static_cast<double>(d.first_divergence->key.step);
  state.counters["ops_aligned"] = static_cast<double>(d.ops_aligned);
  report_memory(state, before, rows);
}

// fp16 against its perturbed twin: same op sequence, the planted divergence at the middle step.
void diff_perturbed(benchmark::State& state) { diff_runs(state, run_b(), false, "diff_perturbed"); }
// fp16 against fp32: the casts are only in a, every linear/matmul differs in dtype.
void diff_fp32(benchmark::State& state) { diff_runs(state, run_c(), true, "diff_fp32"); }

// The report on run a: every row analysed, one anomaly, the planted overflow (f16_overflow).
void analyse_run(benchmark::State& state) {
  const double before = start_memory();
  std::int64_t rows = 0;
  analysis::Report rep;
  for (auto _ : state) {
    TraceReader r(run_a());
    rep = analysis::analyse(r);
    rows = r.row_counts().ops;
    benchmark::DoNotOptimize(rep.anomalies.size());
  }
  Premises p;
  p.expect("op rows in run a", run_steps * expected().rows_fp16, rows);
  p.expect("op rows analysed", run_steps * expected().rows_fp16, rep.op_rows);
  p.expect("steps analysed", run_steps, rep.steps);
  std::vector<std::string> found;
  for (const analysis::Diagnosis& g : rep.anomalies)
    found.push_back(fmt::format("{} at step {} {} {} in '{}'", g.cause, g.step, phase_name(g.phase), g.op, g.module));
  const std::string want =
      fmt::format("f16_overflow at step {} forward linear in '{}'", overflow_step, kOverflowModule);
  if (found.size() != 1 || found[0] != want)
    p.fail(fmt::format("anomalies: expected [{}], found [{}]", want, fmt::join(found, "; ")));
  if (!p.check(state, "analyse_run")) return;
  report_memory(state, before, rows);
}

// own_peak_MiB is each benchmark's own; ru_maxrss never goes down, so a benchmark that needed more
// memory than the ones before it is the one that raises maxrss_MiB_after.
BENCHMARK(open_and_index)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(read_ops)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(diff_perturbed)->ArgName("rows_per_read")->Arg(200000)->Arg(50000)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(diff_fp32)->ArgName("rows_per_read")->Arg(200000)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(analyse_run)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ampscope::trace

int main(int argc, char** argv) {
  using namespace ampscope::trace;
  benchmark::Initialize(&argc, argv);
  // Our own options, after Google Benchmark has taken its own: --steps N (at least 8, so the planted
  // divergence, the middle step, and the overflow, 3/4 of the way, are distinct steps past the first),
  // --cache DIR (keep the traces there and reuse them; also $AMPSCOPE_BENCH_CACHE) and --write-only (write or
  // find runs a and b, print their folder, run no benchmark: bench/large_trace_bench.sh times the CLI on them).
  bool write_only = false;
  if (const char* env = std::getenv("AMPSCOPE_BENCH_CACHE"); env != nullptr && *env != '\0') cache_root = env;
  for (int i = 1; i < argc;) {
    const std::string arg = argv[i];
    int taken = 0;
    if (arg == "--steps") {
      char* end = nullptr;
      const long long n = i + 1 < argc ? std::strtoll(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || n < 8) {
        std::fprintf(stderr, "analysis_bench: error: --steps needs a whole number of at least 8, got '%s'\n"
                             "hint: analysis_bench --steps 20 runs the premise checks at a small size\n",
                     i + 1 < argc ? argv[i + 1] : "");
        return 2;
      }
      run_steps = n;
      planted_step = n / 2;
      overflow_step = 3 * n / 4;
      taken = 2;
    } else if (arg == "--cache") {
      if (i + 1 >= argc || *argv[i + 1] == '\0') {
        std::fprintf(stderr, "analysis_bench: error: --cache needs a folder\n"
                             "hint: analysis_bench --cache build/bench-cache keeps the traces there between runs\n");
        return 2;
      }
      cache_root = argv[i + 1];
      taken = 2;
    } else if (arg == "--write-only") {
      write_only = true;
      taken = 1;
    } else {
      ++i;
      continue;
    }
    for (int j = i; j + taken <= argc; ++j) argv[j] = argv[j + taken];
    argc -= taken;
  }
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::filesystem::create_directories(folder());
  bool written = cached_traces_ready(!write_only);
  if (written) {
    std::fprintf(stderr, "traces of %lld steps found in %s (cached)\n", static_cast<long long>(run_steps), folder().c_str());
  } else {
    std::filesystem::remove(stamp_file());
    // The writer's queues and the generator stay out of this process's peak memory.
    const pid_t child = fork();
    if (child == 0) {
      try {
        write_run(run_a(), true, 0.0, false);
        write_run(run_b(), true, 1e-3, true);
        if (!write_only) write_run(run_c(), false, 1e-3, true);
        if (!cache_root.empty()) {
          std::FILE* f = std::fopen(stamp_file().c_str(), "w");
          if (f == nullptr || std::fputs(stamp_line(!write_only).c_str(), f) < 0 ||
              std::fclose(f) != 0)
            throw std::runtime_error("cannot write " + stamp_file().string());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writing the traces failed: %s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    written = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  int rc = 1;
  if (written) {
    std::fprintf(stderr, "traces of %lld steps in %s: %.0f, %.0f MiB\n", static_cast<long long>(run_steps),
                 folder().c_str(), static_cast<double>(std::filesystem::file_size(run_a())) / (1 << 20),
                 static_cast<double>(std::filesystem::file_size(run_b())) / (1 << 20));
    rc = 0;
    if (write_only) {
      std::printf("%s\n", folder().c_str());
    } else {
      benchmark::RunSpecifiedBenchmarks();
      if (premise_broken) {
        std::fprintf(stderr, "analysis_bench: a benchmark's premise did not hold (above): its figures do not measure "
                             "what its name says\n");
        rc = 1;
      }
    }
  }
  benchmark::Shutdown();
  if (cache_root.empty()) std::filesystem::remove_all(folder());
  return rc;
}
