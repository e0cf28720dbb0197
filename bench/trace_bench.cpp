// The HDF5 trace writer: op rows per second through TraceWriter (caller thread + writer thread, rows
// compressed and flushed at every step end, file closed), and bytes on disk per op row for a realistic
// health-level trace: a 4-block tiny GPT's forward and backward op sequence under f16 autocast, module
// paths like "blocks.3.attn.qkv", statistics that drift from step to step as in training, gradient rows
// before and after unscaling, one /steps row per step. Targets (issue 5): >= 1,000,000 op rows/s, and
// <= 64 bytes per op row; issue 37: >= 3M op rows/s at 10,000 rows a step, <= 32 bytes per op row on the
// health trace. Results: bench/RESULTS.md.
// Two kinds of statistics (issue 37): the default cases write them as the probe does (probes/stats.cpp:
// min and max are values of the op's output dtype, absmax = max(|min|, |max|), mean and rms full doubles;
// a gradient's absmax an f32 value and its norm a double, the unscaled row's exactly the scaled row's over
// the power-of-two loss scale), so their bytes per row are a real trace's; the `_random_stats` cases draw
// min, max and absmax as independent doubles, which no probed tensor has: the worst case for the writer's
// compression.
// Each benchmark reads its file back and counts its rows (op rows, gradient rows, steps) against what it
// wrote, and the health trace's first step's op rows field by field; when they differ it stops with an
// error naming both and the program exits 1 (ctest's bench_trace_premises runs four cases once each for
// that check).
//
//   build/bench/trace_bench --benchmark_filter=throughput
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"

namespace ampscope::trace {
namespace {

// One op of the model's step, with the typical size of its output's statistics.
struct OpTemplate {
  Phase phase;
  std::string op, module, in_dtypes, out_dtype, shape, autocast;
  std::int64_t numel;
  double scale;       // typical |value|
  double zero_share;  // share of exact zeros (activations after gelu, masked scores)
};

std::vector<OpTemplate> tiny_gpt_step(int blocks) {
  const std::string lp = " is on the lower_precision_fp list: runs in f16";
  const std::string fp32 = " is on the fp32 list: runs in f32";
  const std::string promote = " is on the promote list: inputs promoted to f32";
  std::vector<OpTemplate> fwd;
  auto add = [&](std::string op, std::string module, std::string in, std::string out, std::string shape, std::string reason,
                 std::int64_t numel, double scale, double zeros = 0) {
    fwd.push_back({Phase::forward, std::move(op), std::move(module), std::move(in), std::move(out), std::move(shape),
                   std::move(reason), numel, scale, zeros});
  };
  const std::int64_t act = 16 * 64 * 128;
  add("embedding", "tok_emb", "f32,i64", "f32", "[16, 64, 128]", "", act, 1.0);
  add("embedding", "pos_emb", "f32,i64", "f32", "[1, 64, 128]", "", 64 * 128, 0.02);
  add("add", "", "f32,f32", "f32", "[16, 64, 128]", "add" + promote, act, 1.0);
  for (int b = 0; b < blocks; ++b) {
    const std::string p = fmt::format("blocks.{}", b);
    add("layer_norm", p + ".ln1", "f32,f32,f32", "f32", "[16, 64, 128]", "layer_norm" + fp32, act, 1.0);
    add("to", p + ".attn.qkv", "f32", "f16", "[16, 64, 128]", "", act, 1.0);
    add("linear", p + ".attn.qkv", "f16,f16,f16", "f16", "[16, 64, 384]", "linear" + lp, 3 * act, 0.8);
    add("view", p + ".attn", "f16", "f16", "[16, 64, 3, 4, 32]", "", 3 * act, 0.8);
    add("matmul", p + ".attn", "f16,f16", "f16", "[16, 4, 64, 64]", "matmul" + lp, 16 * 4 * 64 * 64, 4.0);
    add("mul", p + ".attn", "f16", "f16", "[16, 4, 64, 64]", "", 16 * 4 * 64 * 64, 0.7);
    add("masked_fill", p + ".attn", "f16,bool", "f16", "[16, 4, 64, 64]", "", 16 * 4 * 64 * 64, 0.7);
    add("softmax", p + ".attn", "f16", "f32", "[16, 4, 64, 64]", "softmax" + fp32, 16 * 4 * 64 * 64, 0.03, 0.49);
    add("to", p + ".attn", "f32", "f16", "[16, 4, 64, 64]", "", 16 * 4 * 64 * 64, 0.03, 0.49);
    add("matmul", p + ".attn", "f16,f16", "f16", "[16, 4, 64, 32]", "matmul" + lp, act, 0.5);
    add("linear", p + ".attn.proj", "f16,f16,f16", "f16", "[16, 64, 128]", "linear" + lp, act, 0.5);
    add("add", p, "f32,f16", "f32", "[16, 64, 128]", "add" + promote, act, 1.2);
    add("layer_norm", p + ".ln2", "f32,f32,f32", "f32", "[16, 64, 128]", "layer_norm" + fp32, act, 1.0);
    add("linear", p + ".mlp.fc1", "f16,f16,f16", "f16", "[16, 64, 512]", "linear" + lp, 4 * act, 1.0);
    add("gelu", p + ".mlp.act", "f16", "f16", "[16, 64, 512]", "", 4 * act, 0.5, 0.001);
    add("linear", p + ".mlp.fc2", "f16,f16,f16", "f16", "[16, 64, 128]", "linear" + lp, act, 0.6);
    add("add", p, "f32,f16", "f32", "[16, 64, 128]", "add" + promote, act, 1.4);
  }
  add("layer_norm", "ln_f", "f32,f32,f32", "f32", "[16, 64, 128]", "layer_norm" + fp32, act, 1.0);
  add("linear", "head", "f16,f16", "f16", "[16, 64, 256]", "linear" + lp, 16 * 64 * 256, 2.0);
  add("cross_entropy", "", "f16,i64", "f32", "[]", "cross_entropy" + fp32, 1, 5.5);
  // Backward: one node per forward op, newest first, gradients an order of magnitude smaller.
  std::vector<OpTemplate> step = fwd;
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    OpTemplate b = *it;
    b.phase = Phase::backward;
    b.autocast.clear();
    b.scale = it->scale * 1e-3;
    b.zero_share = it->zero_share;
    step.push_back(std::move(b));
  }
  return step;
}

std::vector<std::string> parameter_names(int blocks) {
  std::vector<std::string> names = {"tok_emb.weight", "pos_emb.weight"};
  for (int b = 0; b < blocks; ++b) {
    for (const char* m : {"ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc1", "mlp.fc2"}) {
      names.push_back(fmt::format("blocks.{}.{}.weight", b, m));
      names.push_back(fmt::format("blocks.{}.{}.bias", b, m));
    }
  }
  for (const char* n : {"ln_f.weight", "ln_f.bias", "head.weight"}) names.emplace_back(n);
  return names;
}

// How the generator draws an op row's min, max and absmax and a gradient row's absmax and norm.
enum class Stats {
  // As the probe writes them (probes/stats.cpp, probes/probe.cpp record_grads): min and max are values of
  // the row's out dtype (a tensor's elements; an f16 value as a double has 42 zero mantissa bits), absmax
  // is max(|min|, |max|) bit for bit; mean and rms are sums divided in double (every bit random). A
  // gradient (f32 parameters under autocast) has an f32 absmax and a double norm, and its unscaled row is
  // the scaled row divided by the power-of-two loss scale, exactly.
  probe,
  // min, max and absmax drawn apart as random doubles, and every gradient row drawn apart: no probed tensor
  // has such statistics (trace_bench's only generator until issue 37); the writer's worst case.
  random,
};

// `value` rounded to nearest even in `dtype` ("f16", "bf16", "f32"; anything else: kept as a double), as
// an element of a tensor of that dtype is. Values stay far from overflow here.
double in_dtype(double value, std::string_view dtype) {
  int digits = 53, min_exponent = -1022;
  if (dtype == "f16") {
    digits = 11, min_exponent = -14;
  } else if (dtype == "bf16") {
    digits = 8, min_exponent = -126;
  } else if (dtype == "f32") {
    digits = 24, min_exponent = -126;
  }
  if (value == 0 || !std::isfinite(value)) return value;
  const double quantum = std::ldexp(1.0, std::max(std::ilogb(value), min_exponent) - (digits - 1));
  return std::nearbyint(value / quantum) * quantum;
}

// Produces the rows of successive training steps, with statistics that drift like a real run's.
class TraceGenerator {
 public:
  explicit TraceGenerator(Stats stats = Stats::probe, int blocks = 4)
      : stats_(stats), ops_(tiny_gpt_step(blocks)), params_(parameter_names(blocks)) {}

  std::size_t ops_per_step() const { return ops_.size(); }

  template <class Fn>
  void op_rows(std::int64_t step, Fn&& emit) {
    OpRow row;
    for (std::size_t i = 0; i < ops_.size(); ++i) {
      const OpTemplate& t = ops_[i];
      row.step = step;
      row.seq = static_cast<std::int64_t>(i);
      row.phase = t.phase;
      row.op = t.op;
      row.module = t.module;
      row.in_dtypes = t.in_dtypes;
      row.out_dtype = t.out_dtype;
      row.shape = t.shape;
      row.autocast = t.autocast;
      const double s = t.scale * std::exp(0.05 * normal_(rng_));  // drifts, like training
      TensorHealth& h = row.health;
      h.numel = t.numel;
      h.zero = static_cast<std::int64_t>(t.zero_share * static_cast<double>(t.numel) * (1 + 0.1 * normal_(rng_)));
      h.subnormal = t.out_dtype == "f16" && t.phase == Phase::backward ? static_cast<std::int64_t>(uniform_(rng_) * 40) : 0;
      const double peak = 4 * s * (1 + 0.1 * uniform_(rng_));
      const double hi = peak * (0.8 + 0.2 * uniform_(rng_));
      const double lo = -peak * (0.8 + 0.2 * uniform_(rng_));
      h.mean = s * 0.01 * normal_(rng_);
      h.rms = s * (1 + 0.05 * normal_(rng_));
      if (stats_ == Stats::random) {
        h.absmax = peak;
        h.max = hi;
        h.min = lo;
      } else if (t.numel == 1) {  // one element (the loss): every statistic is that value
        h.min = h.max = h.mean = in_dtype(hi, t.out_dtype);
        h.absmax = h.rms = std::fabs(h.min);
      } else {
        h.max = in_dtype(hi, t.out_dtype);
        h.min = in_dtype(lo, t.out_dtype);
        h.absmax = std::max(std::fabs(h.min), std::fabs(h.max));
      }
      emit(row);
    }
  }

  template <class Fn>
  void grad_rows(std::int64_t step, double scale, Fn&& emit) {
    GradRow row;
    if (stats_ == Stats::probe) {
      norms_.resize(params_.size());
      absmaxes_.resize(params_.size());
    }
    for (int unscaled = 0; unscaled < 2; ++unscaled) {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        row.step = step;
        row.param = params_[i];
        row.dtype = "f32";
        row.zero = 0;
        row.unscaled = unscaled != 0;
        if (stats_ == Stats::random) {
          const double norm = 0.1 * std::exp(0.1 * normal_(rng_));
          row.absmax = norm * 0.3 * (unscaled ? 1.0 : scale);
          row.norm = norm * (unscaled ? 1.0 : scale);
        } else if (unscaled == 0) {  // the scaled gradient: an f32 absmax, a double norm
          const double norm = 0.1 * std::exp(0.1 * normal_(rng_));
          absmaxes_[i] = row.absmax = in_dtype(norm * 0.3 * (1 + 0.1 * uniform_(rng_)) * scale, "f32");
          norms_[i] = row.norm = norm * scale;
        } else {  // unscaling multiplies every element by 1 / scale, exact for a power of two
          row.absmax = absmaxes_[i] / scale;
          row.norm = norms_[i] / scale;
        }
        emit(row);
      }
    }
  }

  StepRow step_row(std::int64_t step) {
    StepRow row;
    row.step = step;
    row.loss = 5.5 * std::exp(-static_cast<double>(step) / 2000.0) + 0.05 * normal_(rng_);
    row.scale = 65536.0;
    row.scale_after = 65536.0;
    row.growth_tracker = step % 2000;
    row.grad_norm = 0.5 + 0.1 * normal_(rng_);
    row.lr = 3e-4 * std::min(1.0, static_cast<double>(step + 1) / 100.0);
    row.time_ms = 58.0 + 2.0 * normal_(rng_);
    return row;
  }

 private:
  Stats stats_;
  std::vector<OpTemplate> ops_;
  std::vector<std::string> params_;
  std::vector<double> norms_, absmaxes_;  // Stats::probe: the step's scaled gradient rows
  std::mt19937_64 rng_{42};
  std::normal_distribution<double> normal_;
  std::uniform_real_distribution<double> uniform_;
};

// --keep DIR: the traces are written into DIR and left there (named after the case), for trace_breakdown.
std::filesystem::path keep_dir;

std::filesystem::path bench_file(std::string_view name) {
  if (!keep_dir.empty()) return keep_dir / fmt::format("{}.h5", name);
  return std::filesystem::temp_directory_path() / fmt::format("ampscope-trace-bench-{}-{}.h5", name, getpid());
}

void done_with(const std::filesystem::path& path) {
  if (keep_dir.empty()) std::filesystem::remove(path);
}

// CPU seconds used so far by every thread of this process: on a shared machine, where the wall time
// depends on what else runs, CPU time per row is the steadier measure of the writer's cost.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A broken premise (the file does not hold the rows written): the benchmark stops with an error and the
// program exits 1 (Google Benchmark alone would report the error and exit 0).
bool premise_broken = false;

// Reads `path` back and compares its row counts with what was written; false (and the benchmark stopped)
// when they differ.
bool rows_counted(benchmark::State& state, const char* name, const std::filesystem::path& path, const RowCounts& wrote) {
  std::string problems;
  try {
    const RowCounts found = TraceReader(path).row_counts();
    const auto expect = [&](const char* what, std::int64_t want, std::int64_t got) {
      if (want != got) problems += fmt::format("{}{}: expected {}, found {}", problems.empty() ? "" : "; ", what, want, got);
    };
    expect("op rows", wrote.ops, found.ops);
    expect("gradient rows", wrote.grads, found.grads);
    expect("step rows", wrote.steps, found.steps);
  } catch (const std::exception& e) {
    problems = fmt::format("the trace written could not be read back: {}", e.what());
  }
  if (problems.empty()) return true;
  const std::string text = "premise broken: " + problems;
  std::fprintf(stderr, "trace_bench: %s: %s\n", name, text.c_str());
  premise_broken = true;
  state.SkipWithError(text.c_str());
  return false;
}

// Whether two doubles are the same bits (NaN payloads and the sign of zero included).
bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

// Reads back step 0's op rows and compares them field by field with what `fresh` (a generator not yet used,
// made like the one that wrote the file) produces for step 0: the statistics the file holds are those
// written, so the bytes per row measure these statistics. False (and the benchmark stopped) when they differ.
bool first_step_read_back(benchmark::State& state, const std::filesystem::path& path, TraceGenerator& fresh) {
  std::vector<OpRow> want;
  fresh.op_rows(0, [&](const OpRow& r) { want.push_back(r); });
  std::string problem;
  try {
    const std::vector<OpRow> got = TraceReader(path).ops(0, 1);
    if (got.size() != want.size()) problem = fmt::format("step 0 has {} op rows, expected {}", got.size(), want.size());
    for (std::size_t i = 0; problem.empty() && i < got.size(); ++i) {
      const TensorHealth &g = got[i].health, &w = want[i].health;
      const bool same = got[i].op == want[i].op && got[i].module == want[i].module && g.numel == w.numel &&
                        g.zero == w.zero && g.subnormal == w.subnormal && same_bits(g.min, w.min) &&
                        same_bits(g.max, w.max) && same_bits(g.absmax, w.absmax) && same_bits(g.mean, w.mean) &&
                        same_bits(g.rms, w.rms);
      if (!same) {
        problem = fmt::format("step 0's op row {} reads back as {} {} min {} max {} absmax {}, written {} {} min {} max {} absmax {}",
                              i, got[i].op, got[i].module, g.min, g.max, g.absmax, want[i].op, want[i].module, w.min, w.max, w.absmax);
      }
    }
  } catch (const std::exception& e) {
    problem = fmt::format("the trace written could not be read back: {}", e.what());
  }
  if (problem.empty()) return true;
  const std::string text = "premise broken: " + problem;
  std::fprintf(stderr, "trace_bench: health_trace: %s\n", text.c_str());
  premise_broken = true;
  state.SkipWithError(text.c_str());
  return false;
}

const RunInfo kRun{.precision = "fp16", .device = "cpu", .model = "tiny_gpt", .seed = 1, .config = R"({"blocks": 4})"};

// Op rows per second through the writer: rows_per_step op rows (cycled from the tiny GPT's step), an
// end_step after each step, 200,000 rows per iteration, close() inside the timing so every row is on disk.
void throughput_of(benchmark::State& state, Stats stats) {
  const std::size_t rows_per_step = static_cast<std::size_t>(state.range(0));
  const int compression = static_cast<int>(state.range(1));
  constexpr std::int64_t kRows = 200000;
  TraceGenerator gen(stats);
  std::vector<OpRow> rows;  // pre-generated: the benchmark measures the writer, not the generator
  for (std::int64_t step = 0; static_cast<std::int64_t>(rows.size()) < kRows; ++step) {
    gen.op_rows(step, [&](const OpRow& r) { rows.push_back(r); });
  }
  rows.resize(kRows);
  const auto path = bench_file(fmt::format("throughput{}-{}-{}", stats == Stats::random ? "-random" : "", rows_per_step, compression));
  std::int64_t bytes = 0;
  const double cpu_before = process_cpu_seconds();
  for (auto _ : state) {
    TraceWriter w(path, kRun, {.compression = compression});
    std::int64_t step = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      OpRow& r = rows[i];
      r.step = step;
      w.write(r);
      if ((i + 1) % rows_per_step == 0) w.end_step(step++);
    }
    w.close();
    bytes = static_cast<std::int64_t>(std::filesystem::file_size(path));
  }
  const double cpu = process_cpu_seconds() - cpu_before;
  // Steps end after every rows_per_step rows; the rows of an unfinished last step are written too (close).
  const bool counted = rows_counted(state, "throughput", path, {.steps = 0, .ops = kRows});
  done_with(path);
  if (!counted) return;
  state.SetItemsProcessed(state.iterations() * kRows);
  state.counters["bytes/op_row"] = static_cast<double>(bytes) / kRows;
  state.counters["cpu_us/op_row"] = 1e6 * cpu / static_cast<double>(state.iterations() * kRows);
}

// A realistic health-level trace: `steps` training steps of the tiny GPT (op rows, gradient rows
// before and after unscaling, a step row, end_step), at the default options. Reports the file's bytes
// per op row (everything in the file counted) and op rows per second.
void health_trace_of(benchmark::State& state, Stats stats) {
  const std::int64_t steps = state.range(0);
  const int compression = static_cast<int>(state.range(1));
  const auto path = bench_file(fmt::format("health{}-{}-{}", stats == Stats::random ? "-random" : "", steps, compression));
  std::int64_t op_rows = 0, bytes = 0;
  const double cpu_before = process_cpu_seconds();
  for (auto _ : state) {
    state.PauseTiming();
    TraceGenerator gen(stats);
    state.ResumeTiming();
    op_rows = 0;
    TraceWriter w(path, kRun, {.compression = compression});
    for (std::int64_t step = 0; step < steps; ++step) {
      gen.op_rows(step, [&](const OpRow& r) {
        w.write(r);
        ++op_rows;
      });
      gen.grad_rows(step, 65536.0, [&](const GradRow& r) { w.write(r); });
      w.write(gen.step_row(step));
      w.end_step(step);
    }
    w.close();
    bytes = static_cast<std::int64_t>(std::filesystem::file_size(path));
  }
  const double cpu = process_cpu_seconds() - cpu_before;
  // What one step writes, counted from the generator (not from the loop above): its ops, its parameters'
  // gradients before and after unscaling, one /steps row.
  TraceGenerator gen(stats);
  const std::int64_t params = static_cast<std::int64_t>(parameter_names(4).size());
  const RowCounts wrote{.steps = steps, .ops = steps * static_cast<std::int64_t>(gen.ops_per_step()), .grads = steps * 2 * params};
  const bool counted = rows_counted(state, "health_trace", path, wrote) && first_step_read_back(state, path, gen);
  done_with(path);
  if (!counted) return;
  state.SetItemsProcessed(state.iterations() * op_rows);
  state.counters["cpu_us/op_row"] = 1e6 * cpu / static_cast<double>(state.iterations() * op_rows);
  state.counters["ops/step"] = static_cast<double>(op_rows) / static_cast<double>(steps);
  state.counters["bytes/op_row"] = static_cast<double>(bytes) / static_cast<double>(op_rows);
  state.counters["MiB"] = static_cast<double>(bytes) / (1 << 20);
}

void throughput(benchmark::State& state) { throughput_of(state, Stats::probe); }
void throughput_random_stats(benchmark::State& state) { throughput_of(state, Stats::random); }
void health_trace(benchmark::State& state) { health_trace_of(state, Stats::probe); }
void health_trace_random_stats(benchmark::State& state) { health_trace_of(state, Stats::random); }

BENCHMARK(throughput)
    ->ArgNames({"rows_per_step", "deflate"})
    ->Args({150, 1})
    ->Args({1000, 1})
    ->Args({10000, 1})
    ->Args({1000, 4})
    ->Args({1000, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(throughput_random_stats)
    ->ArgNames({"rows_per_step", "deflate"})
    ->Args({10000, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(health_trace)->ArgNames({"steps", "deflate"})->Args({1000, 1})->Args({1000, 4})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(health_trace_random_stats)->ArgNames({"steps", "deflate"})->Args({1000, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace ampscope::trace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Our own option, after Google Benchmark has taken its own: --keep DIR.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--keep") continue;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "trace_bench: error: --keep needs a folder\nhint: trace_bench --keep /tmp/traces, then "
                           "trace_breakdown /tmp/traces/health-1000-1.h5\n");
      return 2;
    }
    ampscope::trace::keep_dir = argv[i + 1];
    std::filesystem::create_directories(ampscope::trace::keep_dir);
    for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2];
    argc -= 2;
    break;
  }
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ampscope::trace::premise_broken) {
    std::fprintf(stderr, "trace_bench: a benchmark's premise did not hold (above): its figures do not measure what its "
                         "name says\n");
    return 1;
  }
  return 0;
}
