// tests/twin/twin_test_support.h: what the twin's tests share: a sink that drops rows, a twin row by op name, the
// errors of values against an f64 reference as probes/twin.h defines them (computed here, independently of the
// twin), and a recorder that runs a loop with the probe and the twin writing a real trace, as `ampscope train
// --twin` sets them up, and returns the report's analysis of it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/dtype.h"
#include "core/fp8_linear.h"
#include "core/ops.h"
#include "probes/analysis/analysis.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "probes/twin.h"

namespace ampscope::testing {

struct NullSink : trace::Sink {
  void write(const trace::StepRow&) override {}
  void write(const trace::OpRow&) override {}
  void write(const trace::GradRow&) override {}
  void write(const trace::EventRow&) override {}
  void write(const trace::HistogramRow&) override {}
  void write(const trace::DumpRow&) override {}
};

// One step of a quantized Linear under `hook` (a twin, or a hook wrapping one): y = linear(x, w) under bf16 autocast
// inside `context`'s region, then its backward from `dy`; returns y.
inline Tensor quantized_linear_step(const std::shared_ptr<probe::Hook>& hook, const std::shared_ptr<Fp8Context>& context,
                                    const Tensor& x, const Tensor& w, const Tensor& dy) {
  probe::HookGuard installed(hook);
  probe::StepScope step(0);
  Tensor y;
  {
    AutocastGuard autocast(DType::bf16);
    Fp8Guard region(context);
    y = linear(x, w);
  }
  y.backward(dy);
  step.end({});
  return y;
}

// The unquantized product in f64: C[i][j] = sum_p A(i, p) B(p, j), A and B row-major, transposed on request.
inline std::vector<double> exact_product(const std::vector<double>& a, bool ta, std::int64_t a_cols, const std::vector<double>& b,
                                  bool tb, std::int64_t b_cols, std::int64_t I, std::int64_t P, std::int64_t J) {
  auto get = [](const std::vector<double>& x, bool t, std::int64_t cols, std::int64_t i, std::int64_t p) {
    return t ? x[static_cast<std::size_t>(p * cols + i)] : x[static_cast<std::size_t>(i * cols + p)];
  };
  std::vector<double> c;
  for (std::int64_t i = 0; i < I; ++i) {
    for (std::int64_t j = 0; j < J; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < P; ++p) s += get(a, ta, a_cols, i, p) * get(b, tb, b_cols, p, j);
      c.push_back(s);
    }
  }
  return c;
}

// The first row of op `op`; throws when the twin wrote none.
inline const probe::PrecisionRow& row_of(const std::vector<probe::PrecisionRow>& rows, const std::string& op) {
  for (const probe::PrecisionRow& r : rows) {
    if (r.op == op) return r;
  }
  throw std::runtime_error("no twin row for " + op);
}

// The errors of values `y` of dtype `dtype` (f16: p = 11, emin = -14; bf16: 8, -126; f32: 24, -126) against an
// exact reference `r`, as probes/twin.h defines them: relative error |y - r| / max(|r|, floor), floor the larger
// of 2^emin and 2^-p times the largest |r|; ulps of the dtype at r; flips where y is not finite, or 0 while r is
// not (non-finite y are left out of the errors).
struct Errors {
  double max_rel = 0, mean_rel = 0, max_ulp = 0;
  std::int64_t flips = 0;
};
inline Errors errors_of(const std::vector<double>& y, const std::vector<double>& r, DType dtype) {
  const int p = dtype == DType::f16 ? 11 : dtype == DType::bf16 ? 8 : 24;
  const int emin = dtype == DType::f16 ? -14 : -126;
  Errors e;
  double scale = 0;
  for (double v : r) scale = std::max(scale, std::fabs(v));
  const double floor = std::max(std::ldexp(1.0, emin), scale * std::ldexp(1.0, -p));
  std::int64_t counted = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) {
      ++e.flips;
      continue;
    }
    if (y[i] == 0 && r[i] != 0) ++e.flips;
    const double err = std::fabs(y[i] - r[i]);
    const double rel = err / std::max(std::fabs(r[i]), floor);
    const int exponent = r[i] == 0 ? emin : std::max(emin, static_cast<int>(std::floor(std::log2(std::fabs(r[i])))));
    e.max_rel = std::max(e.max_rel, rel);
    e.mean_rel += rel;
    e.max_ulp = std::max(e.max_ulp, err / std::ldexp(1.0, exponent - (p - 1)));
    ++counted;
  }
  if (counted > 0) e.mean_rel /= static_cast<double>(counted);
  return e;
}

// Records `steps` steps of `body` with the probe at level health wrapped in the twin (`options`, its sink set to
// the trace), both writing to a trace at `path` of run precision `precision`; returns the report's analysis.
inline analysis::Report record_twinned(const std::filesystem::path& path, std::int64_t steps,
                                       const std::function<void(std::int64_t)>& body, probe::TwinOptions options = {},
                                       const std::string& precision = "fp16") {
  auto writer = std::make_shared<trace::TraceWriter>(
      path, trace::RunInfo{.precision = precision, .device = "cpu", .model = "user", .seed = 0, .config = "{}"});
  auto probe = std::make_shared<probe::Probe>(writer);
  options.sink = writer;
  options.keep_rows = false;
  auto twin = std::make_shared<probe::Twin>(probe, options);
  {
    probe::HookGuard installed(twin);
    for (std::int64_t n = 0; n < steps; ++n) body(n);
  }
  probe->flush();
  writer->close();
  trace::TraceReader reader(path);
  return analysis::analyse(reader);
}

}  // namespace ampscope::testing
