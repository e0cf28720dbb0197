// Small traces for the viewer's tests, written with the real TraceWriter: a run whose step 1 has an op
// creating NaN (an origin) and is skipped with a scale backoff, a healthy run, and a file that is not HDF5.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>

#include "probes/trace/writer.h"
#include "tests/test_support.h"

namespace ampscope::viewer::testing {

inline std::filesystem::path fixture_dir() {
  return ampscope::testing::process_scratch_dir("ampscope_viewer_test");
}

inline trace::OpRow op_row(std::int64_t step, std::int64_t seq, const std::string& module, const std::string& op,
                           const std::string& dtype, double absmax) {
  trace::OpRow r;
  r.step = step;
  r.seq = seq;
  r.phase = trace::Phase::forward;
  r.op = op;
  r.module = module;
  r.in_dtypes = dtype + "," + dtype;
  r.out_dtype = dtype;
  r.shape = "[4, 8]";
  r.health.numel = 32;
  r.health.min = -absmax;
  r.health.max = absmax;
  r.health.absmax = absmax;
  r.health.mean = absmax / 4;
  r.health.rms = absmax / 2;
  return r;
}

// steps: 4 (0..3). With nan_at_step1: step 1's op seq 1 (fc2 linear, f16) has 5 NaN from finite inputs, step
// 1 is skipped and the scale halves; ops after it in that step carry the NaN. Provenance: seq 0 takes data
// and two parameters, each later seq takes the one before it and two parameters.
// One step's op rows of the fixtures: fc1, fc2 (linear) and head (softmax) chained; with `nan`, fc2 creates NaN
// (the origin) and the ops after it carry it.
inline void write_fixture_ops(trace::TraceWriter& w, std::int64_t step, bool nan, int ops_per_step) {
  for (int seq = 0; seq < ops_per_step; ++seq) {
    trace::OpRow r = op_row(step, seq, seq == 0 ? "fc1" : (seq == 1 ? "fc2" : "head"), seq == 2 ? "softmax" : "linear",
                            "f16", 10.0 * (seq + 1) + static_cast<double>(step));
    r.inputs = {seq == 0 ? trace::kInputData : seq - 1, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
    if (nan && seq >= 1) {
      r.health.nan = 5;
      r.origin = seq == 1;
    }
    w.write(r);
  }
}

inline std::filesystem::path write_fixture(const std::filesystem::path& path, bool nan_at_step1, int ops_per_step = 3) {
  trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "fixture", .seed = 7, .config = "{}"});
  double scale = 1024;
  for (std::int64_t step = 0; step < 4; ++step) {
    const bool bad = nan_at_step1 && step == 1;
    write_fixture_ops(w, step, bad, ops_per_step);
    trace::StepRow s;
    s.step = step;
    s.loss = bad ? std::numeric_limits<double>::quiet_NaN() : 2.0 - 0.1 * static_cast<double>(step);
    s.scale = scale;
    s.found_inf = bad;
    s.skipped = bad;
    s.scale_after = bad ? scale / 2 : scale;
    s.grad_norm = bad ? std::numeric_limits<double>::infinity() : 1.0;
    s.lr = 1e-3;
    w.write(s);
    if (bad) {
      w.write(trace::EventRow{.step = step, .seq = 1, .kind = "origin", .op = "linear", .module = "fc2",
                              .detail = "5 NaN in the output of linear; inputs finite"});
    }
    scale = s.scale_after;
    w.end_step(step);
  }
  w.close();
  return path;
}

// One healthy step with one op (seq 0, "attn" bmm with an f32 output) and the exponent histogram of its
// output (level full): 1000 values in [1, 2), 200 in [2^14, 2^15), and `infs` infinities in the inf bin.
inline std::filesystem::path write_histogram_fixture(const std::filesystem::path& path, std::int64_t infs) {
  trace::TraceWriter w(path, {.precision = "fp32", .device = "cpu", .model = "fixture", .seed = 3, .config = "{}"});
  trace::OpRow r = op_row(0, 0, "attn", "bmm", "f32", 30000);
  r.health.numel = 1200 + infs;
  r.health.pos_inf = infs;
  w.write(r);
  trace::HistogramRow h;
  h.step = 0;
  h.seq = 0;
  h.tensor = "output";
  h.bins[static_cast<std::size_t>(0 - trace::kHistMinExponent)] = 1000;
  h.bins[static_cast<std::size_t>(14 - trace::kHistMinExponent)] = 200;
  h.bins[trace::kHistBins - 2] = infs;
  w.write(h);
  trace::StepRow s;
  s.step = 0;
  s.loss = 1.0;
  s.grad_norm = 1.0;
  s.lr = 1e-3;
  w.write(s);
  w.end_step(0);
  w.close();
  return path;
}

// The tagger's failure as the probe records it (docs/scenarios.md): s = sigmoid(z) rounds to 1 in f16, 1 - s
// (neg, then add) cancels to exact zeros, log gives -inf. The rows of one step, healthy or failing:
//   seq 0 linear in head (data, parameter, parameter) -> seq 1 sigmoid -> seq 2 neg -> seq 3 add -> seq 4 log
// (the loss's ops are outside any module). Failing: sigmoid's max is exactly 1, the add holds 5 exact zeros,
// and the log 5 -inf (an origin).
inline std::vector<trace::OpRow> tagger_ops(std::int64_t step, bool bad) {
  trace::OpRow z = op_row(step, 0, "head", "linear", "f16", 12);
  z.inputs = {trace::kInputData, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
  trace::OpRow s = op_row(step, 1, "", "sigmoid", "f16", bad ? 1.0 : 0.99);
  s.health.min = 0.01;
  s.inputs = {0, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  trace::OpRow n = op_row(step, 2, "", "neg", "f16", s.health.max);
  n.health.min = -s.health.max;
  n.health.max = -0.01;
  n.inputs = {1, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  trace::OpRow a = op_row(step, 3, "", "add", "f16", 0.99);
  a.health.min = 0;
  a.health.zero = bad ? 5 : 0;
  a.inputs = {2, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  trace::OpRow l = op_row(step, 4, "", "log", "f16", bad ? std::numeric_limits<double>::quiet_NaN() : 4.6);
  l.inputs = {3, trace::kInputNone, trace::kInputNone, trace::kInputNone};
  if (bad) {
    l.health.neg_inf = 5;
    l.health.min = -4.6;
    l.health.max = -0.01;
    l.health.absmax = 4.6;
    l.origin = true;
  }
  return {z, s, n, a, l};
}

// Two steps of tagger_ops: step 0 healthy, step 1 failing (skipped, the scale halves).
inline std::filesystem::path write_tagger_fixture(const std::filesystem::path& path) {
  trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "tagger", .seed = 5, .config = "{}"});
  for (std::int64_t step = 0; step < 2; ++step) {
    const bool bad = step == 1;
    for (const trace::OpRow& r : tagger_ops(step, bad)) w.write(r);
    trace::StepRow s;
    s.step = step;
    s.loss = bad ? std::numeric_limits<double>::quiet_NaN() : 0.7;
    s.scale = 1024;
    s.scale_after = bad ? 512 : 1024;
    s.found_inf = s.skipped = bad;
    s.grad_norm = bad ? std::numeric_limits<double>::infinity() : 1.0;
    s.lr = 1e-3;
    w.write(s);
    w.end_step(step);
  }
  w.close();
  return path;
}

// For the first anomaly at open (viewer/document.h, early_anomaly): `steps` steps (0..steps-1) of 3 op rows each
// (fc1 linear, fc2 linear, head softmax; f16). At origin_step (>= 0) fc2's linear (seq 1) creates 5 NaN from finite
// inputs (an origin row) and head's softmax carries them, the step is skipped and the scale halves, as the probe
// records it: with origin_events, an "origin" event (seq 1) and the scaler's "skipped_step" and "scale_backoff"
// events. At skipped_step (>= 0) every op row is finite but the scaler found inf in the gradients and skipped
// the step (a backward overflow the scaler handles): a "grad_overflow" of fc1.weight and "skipped_step" event
// with skipped_events. `extra` events are written after the step whose number they carry (or at the end when no
// recorded step has it).
struct EarlyFixture {
  int steps = 6;
  std::int64_t origin_step = -1;
  bool origin_events = true;
  std::int64_t skipped_step = -1;
  bool skipped_events = true;
  std::vector<trace::EventRow> extra;
};
inline std::filesystem::path write_early_fixture(const std::filesystem::path& path, const EarlyFixture& f) {
  trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "fixture", .seed = 11, .config = "{}"});
  double scale = 1024;
  auto extra_of = [&](std::int64_t step) {
    for (const trace::EventRow& e : f.extra)
      if (e.step == step) w.write(e);
  };
  for (std::int64_t step = 0; step < f.steps; ++step) {
    const bool origin = step == f.origin_step, skipped = origin || step == f.skipped_step;
    write_fixture_ops(w, step, origin, 3);
    trace::StepRow s;
    s.step = step;
    s.loss = origin ? std::numeric_limits<double>::quiet_NaN() : 2.0 - 0.1 * static_cast<double>(step);
    s.scale = scale;
    s.found_inf = s.skipped = skipped;
    s.scale_after = skipped ? scale / 2 : scale;
    s.grad_norm = skipped ? std::numeric_limits<double>::infinity() : 1.0;
    s.lr = 1e-3;
    w.write(s);
    if (origin && f.origin_events) {
      w.write(trace::EventRow{.step = step, .seq = 1, .kind = "origin", .op = "linear", .module = "fc2",
                              .detail = "5 NaN in the output of linear; inputs finite"});
    }
    if (skipped && !origin && f.skipped_events) {
      w.write(trace::EventRow{.step = step, .seq = 3, .kind = "grad_overflow", .op = "", .module = "fc1.weight",
                              .detail = "fc1.weight: 2 inf, 0 NaN in its scaled gradient"});
    }
    if (skipped && (origin ? f.origin_events : f.skipped_events)) {
      w.write(trace::EventRow{.step = step, .seq = 4, .kind = "skipped_step", .op = "", .module = "",
                              .detail = "SGD skipped its step"});
      w.write(trace::EventRow{.step = step, .seq = 5, .kind = "scale_backoff", .op = "", .module = "",
                              .detail = "scale halved"});
    }
    extra_of(step);
    scale = s.scale_after;
    w.end_step(step);
  }
  for (const trace::EventRow& e : f.extra)
    if (e.step < 0 || e.step >= f.steps) w.write(e);
  w.close();
  return path;
}

inline std::filesystem::path write_not_hdf5(const std::filesystem::path& path) {
  std::ofstream(path) << "this is not an HDF5 file\n";
  return path;
}

// The f32 twin's rows (/precision) for the Precision panel: a row of an f16 op with 100 values (90 in bucket
// 11 of the error histogram, 10 exact), and a trace of them.
inline const double kUnit = std::ldexp(1.0, -11);  // one f16 rounding: the jump's least input error (2^-p)

inline trace::PrecisionRow twin_row(std::int64_t step, std::int64_t seq, const std::string& module, const std::string& op,
                             double acc_mean, double in_mean, double acc_max) {
  trace::PrecisionRow r;
  r.step = step;
  r.seq = seq;
  r.module = module;
  r.op = op;
  r.out_dtype = "f16";
  r.numel = 100;
  r.local = true;
  r.local_max_rel = std::ldexp(1.0, -12);
  r.local_mean_rel = std::ldexp(1.0, -13);
  r.local_max_ulp = 0.5;
  r.acc_max_rel = acc_max;
  r.acc_mean_rel = acc_mean;
  r.acc_max_ulp = 3;
  r.in_acc_max_rel = in_mean * 2;
  r.in_acc_mean_rel = in_mean;
  r.bits = acc_max == 0 ? 11 : std::min(11.0, -std::log2(acc_max));
  r.cond = std::numeric_limits<double>::quiet_NaN();
  r.error_bins[11] = 90;
  r.exact = 10;
  return r;
}

// Steps 0..3, twinned on 0 and 2 (--twin-every 2); /ops rows at step 0 only. The jumps, acc_mean_rel / max(in_acc_mean_rel, 2^-11):
//   rsub  (no module)  step 0: 0.25 / 2^-11 = 512; step 2: 0.5 / 2^-11 = 1024   -> first
//   sigmoid (no module) 2^-11 / 2^-11 = 1                                       -> second
//   linear fc1 #0: 2^-12 / 2^-11 = 0.5; #1 (step 0 only): 0.75 * 2^-11 / 2^-11 = 0.75 -> third (its best: 0.75)
inline std::filesystem::path write_twin_fixture(const std::filesystem::path& path) {
  trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "twin fixture", .seed = 1, .config = "{}"});
  for (std::int64_t step = 0; step < 4; ++step) {
    if (step == 0) {
      // /ops rows for step 0 only: step 2's twin rows stand alone, as a step --sample-every did not write.
      w.write(op_row(step, 0, "fc1", "linear", "f16", 4));
      w.write(op_row(step, 1, "", "sigmoid", "f16", 1));
      w.write(op_row(step, 2, "", "rsub", "f16", 1));
      w.write(op_row(step, 3, "fc1", "linear", "f32", 4));
    }
    if (step % 2 == 0) {
      w.write(twin_row(step, 0, "fc1", "linear", std::ldexp(1.0, -12), 0, std::ldexp(1.0, -10)));
      trace::PrecisionRow sig = twin_row(step, 1, "", "sigmoid", kUnit, std::ldexp(1.0, -12), std::ldexp(1.0, -11));
      sig.flips = step == 0 ? 2 : 0;
      sig.error_bins[11] -= sig.flips;  // each element counted once: the flipped ones are not in a bucket
      w.write(sig);
      trace::PrecisionRow sub = twin_row(step, 2, "", "rsub", step == 0 ? 0.25 : 0.5, kUnit, step == 0 ? 0.25 : 1.0);
      sub.cond = 8192;
      w.write(sub);
      if (step == 0) {
        trace::PrecisionRow f32 = twin_row(step, 3, "fc1", "linear", 0.75 * kUnit, kUnit, std::ldexp(1.0, -9));
        f32.out_dtype = "f32";
        f32.local = false;
        f32.local_max_rel = f32.local_mean_rel = f32.local_max_ulp = 0;
        w.write(f32);
      }
    }
    trace::StepRow s;
    s.step = step;
    s.loss = 1;
    w.write(s);
    w.end_step(step);
  }
  w.close();
  return path;
}

// Rank traces of a data-parallel run, with the config `ampscope train --ddp` writes (rank, world_size): 4 steps of
// one op row (fc1 linear, absmax 10 + rank).
// Rank r's loss at step s: its own share's (different on each rank); the scale and gradient norm are the run's
// (the same on every rank). With bad_rank_1, rank 1's step 2 loss is NaN, its op there an origin, and every
// rank skips step 2 and halves the scale.
inline double planted_loss(int rank, std::int64_t step) { return 2.0 - 0.25 * static_cast<double>(step) + 0.5 * rank; }

inline std::filesystem::path write_rank(const std::filesystem::path& path, int rank, int world, bool bad_rank_1 = false,
                                 double lr = 0.01) {
  trace::TraceWriter w(path, {.precision = "fp16", .device = "cpu", .model = "mlp", .seed = 3,
                              .config = fmt::format(R"({{"sample": "mlp", "device": "cpu", "lr": {}, "world_size": {}, "rank": {}}})",
                                                    lr, world, rank)});
  double scale = 1024;
  for (std::int64_t step = 0; step < 4; ++step) {
    const bool skip = bad_rank_1 && step == 2;
    const bool origin = skip && rank == 1;
    trace::OpRow r = op_row(step, 0, "fc1", "linear", "f16", 10.0 + rank);
    r.inputs = {trace::kInputData, trace::kInputParameter, trace::kInputParameter, trace::kInputNone};
    if (origin) {
      r.health.pos_inf = 4;
      r.origin = true;
    }
    w.write(r);
    trace::StepRow s;
    s.step = step;
    s.loss = origin ? std::numeric_limits<double>::quiet_NaN() : planted_loss(rank, step);
    s.scale = scale;
    s.found_inf = skip;
    s.skipped = skip;
    s.scale_after = skip ? scale / 2 : scale;
    s.grad_norm = skip ? std::numeric_limits<double>::infinity() : 1.0 + 0.125 * static_cast<double>(step);
    s.lr = 0.01;
    w.write(s);
    if (origin)
      w.write(trace::EventRow{.step = step, .seq = 0, .kind = "origin", .op = "linear", .module = "fc1",
                              .detail = "4 +inf in the output of linear; inputs finite"});
    scale = s.scale_after;
    w.end_step(step);
  }
  w.close();
  return path;
}

}  // namespace ampscope::viewer::testing
