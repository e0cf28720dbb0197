// Swamped updates (issue 20): a user who trains a model stored in f16 (model.to(f16), the optimizer on those
// parameters, no f32 master weights) loses every update smaller than half an ulp of the value it is added to.
// The loop below is written as a user writes one from docs/api.md: a small regressor whose features pass
// through a per-feature gain initialised to ones (as a LayerNorm's weight is) and a temperature initialised to 4,
// trained with plain SGD at a small learning rate. Near 1, f16's ulp is 2^-10 (2^-11 just below 1), so an
// update of about 1e-4 rounds away: the gain and the temperature (ulp 2^-8 at 4) stop learning, while the
// linear layers' weights (|w| < 0.2, ulp at most 2^-13) keep theirs.
//
// What is expected comes from an independent computation in this test: each step's update u = -lr * g is
// computed from the gradient the loop sees, in float as PyTorch's opmath does, p + u rounded to f16 here in
// double (round half to even on 11 significand bits), and compared with the parameter before and after the
// step. The trace's /updates rows must hold exactly those counts; the report must name exactly the
// parameters this computation finds stalled (over half of their non-zero updates rounded away).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "core/nn.h"
#include "core/ops.h"
#include "core/optim.h"
#include "probes/analysis/analysis.h"
#include "probes/analysis/render.h"
#include "probes/analysis/updates.h"
#include "probes/probe.h"
#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/report_command.h"
#include "tests/test_support.h"

namespace ampscope::testing {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) { return process_scratch_dir("ampscope_swamped") / name; }

struct GainedRegressor : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit GainedRegressor(Generator& gen) : Module("GainedRegressor") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(64, 32, gen));
    register_parameter("gain", ones({32}));
    register_parameter("temperature", full({1}, 4.0));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(32, 1, gen));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = tanh((*fc1)(x)) * parameter("gain");
    return (*fc2)(h) * parameter("temperature");
  }
};

// f16 round to nearest, ties to even, for values below f16's largest (every value here is): 11 significand
// bits, and a fixed quantum of 2^-24 under the smallest normal 2^-14 (subnormals).
double round_f16(double x) {
  if (x == 0) return 0;
  const int e = std::max(-14, static_cast<int>(std::floor(std::log2(std::fabs(x)))));
  const double quantum = std::ldexp(1.0, e - 10);
  return std::nearbyint(x / quantum) * quantum;  // the default rounding mode: half to even
}

struct Expected {
  std::int64_t numel = 0, nonzero = 0, swamped = 0;
  double param_abs_mean = 0, update_abs_mean = 0;
};

struct SwampRun {
  std::map<std::pair<std::int64_t, std::string>, Expected> expected;  // by (step, parameter)
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> final_values;
};

constexpr double kLr = 1e-3;

// Trains the regressor in f16 storage with SGD; records a trace at `trace_path` unless it is empty (then no
// hook is installed at all). dtype f32 trains the same model with f32 parameters.
SwampRun train(const fs::path& trace_path, DType dtype = DType::f16, std::int64_t steps = 14) {
  Generator gen(11);
  GainedRegressor model(gen);
  model.to(dtype);
  optim::SGD opt(model.parameters(), {.lr = kLr});
  const Tensor x = randn({128, 64}, gen).to(dtype);
  const Tensor y = randn({128, 1}, gen).to(dtype);

  std::shared_ptr<trace::TraceWriter> writer;
  std::shared_ptr<probe::Probe> probe;
  std::unique_ptr<probe::HookGuard> watching;
  if (!trace_path.empty()) {
    probe::ProbeOptions options{.level = probe::Level::health};
    trace::RunInfo info{.precision = dtype == DType::f16 ? "fp16" : "fp32", .device = "cpu", .model = "gained-regressor",
                        .seed = 11, .config = "{}"};
    info.probe = probe::describe(options);
    writer = std::make_shared<trace::TraceWriter>(trace_path, info);
    probe = std::make_shared<probe::Probe>(writer, options);
    watching = std::make_unique<probe::HookGuard>(probe);
  }

  SwampRun run;
  for (std::int64_t n = 0; n < steps; ++n) {
    probe::Step step(n);
    opt.zero_grad();
    const Tensor loss = mse_loss(model(x), y);
    loss.backward();
    // What the optimizer is about to do, computed here from the gradient: u = -lr * g in float.
    std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> before;  // values, updates
    for (const auto& [name, p] : model.named_parameters()) {
      std::vector<double> u;
      for (double g : p.grad().values()) u.push_back(static_cast<double>(static_cast<float>(g) * static_cast<float>(-kLr)));
      before[name] = {p.values(), u};
    }
    run.losses.push_back(step.finish(loss, opt).loss);
    for (const auto& [name, p] : model.named_parameters()) {
      const auto& [pv, u] = before.at(name);
      const std::vector<double> after = p.values();
      Expected e;
      e.numel = static_cast<std::int64_t>(pv.size());
      double p_sum = 0, u_sum = 0;
      for (std::size_t i = 0; i < pv.size(); ++i) {
        if (u[i] == 0) continue;
        ++e.nonzero;
        // p + u is exact in double (an f16 plus a float this close), then f32 rounding (PyTorch's opmath
        // add), then f16: the same value as rounding once here unless the f32 sum sat on an f16 tie, which
        // the comparison below with the parameter the run produced would catch.
        const double sum = static_cast<double>(static_cast<float>(pv[i] + u[i]));
        const double predicted = dtype == DType::f16 ? round_f16(sum) : sum;
        EXPECT_EQ(predicted, after[i]) << name << "[" << i << "] at step " << n << ": p " << pv[i] << " u " << u[i];
        if (predicted == pv[i]) ++e.swamped;
        p_sum += std::fabs(pv[i]);
        u_sum += std::fabs(u[i]);
      }
      if (e.nonzero > 0) {
        e.param_abs_mean = p_sum / static_cast<double>(e.nonzero);
        e.update_abs_mean = u_sum / static_cast<double>(e.nonzero);
      }
      run.expected[{n, name}] = e;
    }
  }
  for (const auto& [name, p] : model.named_parameters()) run.final_values[name] = p.values();
  watching.reset();
  if (probe) probe->flush();
  if (writer) writer->close();
  return run;
}

TEST(swamped_updates_test, the_trace_counts_every_f16_parameters_rounded_away_updates_as_computed_independently) {
  const fs::path path = scratch("counts.h5");
  const SwampRun run = train(path);
  trace::TraceReader reader(path);
  const std::vector<trace::UpdateRow> rows = reader.updates();
  EXPECT_EQ(reader.row_counts().updates, static_cast<std::int64_t>(rows.size()));
  ASSERT_EQ(rows.size(), run.expected.size()) << "one row per f16 parameter and step";
  for (const trace::UpdateRow& r : rows) {
    SCOPED_TRACE(r.param + " at step " + std::to_string(r.step));
    const auto it = run.expected.find({r.step, r.param});
    ASSERT_NE(it, run.expected.end());
    const Expected& e = it->second;
    EXPECT_EQ(r.dtype, "f16");
    EXPECT_EQ(r.numel, e.numel);
    EXPECT_EQ(r.nonzero, e.nonzero);
    EXPECT_EQ(r.swamped, e.swamped);
    EXPECT_NEAR(r.param_abs_mean, e.param_abs_mean, 1e-12 * e.param_abs_mean);
    EXPECT_NEAR(r.update_abs_mean, e.update_abs_mean, 1e-12 * e.update_abs_mean);
  }
  // The premise of the planted losses: the gain and the temperature lose nearly all their updates, the
  // linear layers keep nearly all of theirs.
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> totals;
  for (const auto& [key, e] : run.expected) {
    totals[key.second].first += e.swamped;
    totals[key.second].second += e.nonzero;
  }
  for (const auto& [name, t] : totals) {
    const double fraction = static_cast<double>(t.first) / static_cast<double>(t.second);
    if (name == "gain" || name == "temperature") {
      EXPECT_GT(fraction, 0.9) << name;
    } else {
      EXPECT_LT(fraction, 0.5) << name;  // fc1's smallest gradients are swamped too, but a minority
    }
  }
}

TEST(swamped_updates_test, the_report_names_exactly_the_parameters_that_stopped_learning_with_the_f32_master_weights_remedy) {
  const fs::path path = scratch("report.h5");
  const SwampRun run = train(path);
  // Stalled by the independent counts: over half of the non-zero updates of the last kSwampedWindow steps.
  const std::int64_t last = static_cast<std::int64_t>(run.losses.size()) - 1;
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> window;
  for (const auto& [key, e] : run.expected) {
    if (key.first <= last - analysis::kSwampedWindow) continue;
    window[key.second].first += e.swamped;
    window[key.second].second += e.nonzero;
  }
  std::set<std::string> stalled;
  for (const auto& [name, t] : window) {
    if (2 * t.first > t.second) stalled.insert(name);
  }
  ASSERT_EQ(stalled, (std::set<std::string>{"gain", "temperature"})) << "the planted parameters must be the stalled ones";

  std::ostringstream out, err;
  samples::ReportRequest request;
  request.trace = path.string();
  request.json = true;
  samples::run_report(request, out, err);
  ASSERT_TRUE(err.str().empty()) << err.str();
  const nlohmann::json rep = nlohmann::json::parse(out.str());
  const nlohmann::json& sw = rep["swamped"];
  EXPECT_TRUE(sw["recorded"].get<bool>());
  EXPECT_EQ(sw["window"], analysis::kSwampedWindow);
  EXPECT_EQ(sw["last_step"], last);
  EXPECT_EQ(sw["params"], 6);  // fc1.weight, fc1.bias, gain, temperature, fc2.weight, fc2.bias
  std::set<std::string> named;
  for (const auto& p : sw["stalled"]) {
    const std::string name = p["param"];
    named.insert(name);
    const auto& [swamped, nonzero] = window.at(name);
    EXPECT_EQ(p["swamped"], swamped) << name;
    EXPECT_EQ(p["nonzero"], nonzero) << name;
    EXPECT_DOUBLE_EQ(p["fraction"].get<double>(), static_cast<double>(swamped) / static_cast<double>(nonzero));
    // The evidence: the update is under half an ulp of the parameter's magnitude.
    EXPECT_LT(p["update_abs_mean"].get<double>(), p["half_ulp"].get<double>()) << name;
    ASSERT_EQ(p["remedies"].size(), 1u);
    EXPECT_EQ(p["remedies"][0]["kind"], "master_weights_f32");
    const std::string text = p["remedies"][0]["text"];
    EXPECT_NE(text.find("keep f32 master weights"), std::string::npos) << text;
    EXPECT_NE(text.find("a larger learning rate is not the remedy"), std::string::npos) << text;
  }
  EXPECT_EQ(named, stalled);
  // Half an ulp of f16 at the gain's magnitude (about 1, its first updates took it just under: [0.5, 1), ulp
  // 2^-11) and the temperature's (4 or just under: [2, 4), ulp 2^-9, or [4, 8), ulp 2^-8).
  for (const auto& p : sw["stalled"]) {
    const double magnitude = p["param_abs_mean"].get<double>(), half_ulp = p["half_ulp"].get<double>();
    if (p["param"] == "gain") {
      EXPECT_NEAR(magnitude, 1.0, 0.01);
      EXPECT_EQ(half_ulp, magnitude < 1.0 ? std::ldexp(1.0, -12) : std::ldexp(1.0, -11));
    } else {
      EXPECT_NEAR(magnitude, 4.0, 0.04);
      EXPECT_EQ(half_ulp, magnitude < 4.0 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -9));
    }
  }

  // The text report says the same, naming both and the remedy.
  std::ostringstream text_out, text_err;
  request.json = false;
  samples::run_report(request, text_out, text_err);
  const std::string text = text_out.str();
  if (std::getenv("AMPSCOPE_SHOW_SWAMPED") != nullptr) std::fprintf(stderr, "%s", text.c_str());
  EXPECT_NE(text.find("SWAMPED UPDATES: 2 of 6 f16/bf16 parameters stopped learning"), std::string::npos) << text;
  EXPECT_NE(text.find("gain [f16]"), std::string::npos) << text;
  EXPECT_NE(text.find("temperature [f16]"), std::string::npos) << text;
  EXPECT_EQ(text.find("fc1.weight [f16]"), std::string::npos) << text;
  EXPECT_NE(text.find("a larger learning rate is not the remedy"), std::string::npos) << text;
}

TEST(swamped_updates_test, counting_swamped_updates_leaves_the_run_bit_identical) {
  const SwampRun watched = train(scratch("watched.h5"));
  const SwampRun plain = train(fs::path());  // no hook installed
  ASSERT_EQ(watched.losses.size(), plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(watched.losses[i]), std::bit_cast<std::uint64_t>(plain.losses[i])) << "step " << i;
  }
  for (const auto& [name, values] : plain.final_values) {
    const std::vector<double>& w = watched.final_values.at(name);
    ASSERT_EQ(w.size(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(w[i]), std::bit_cast<std::uint64_t>(values[i])) << name << "[" << i << "]";
    }
  }
}

TEST(swamped_updates_test, adam_and_adamw_report_what_the_parameters_show_and_the_same_parameters_stall) {
  // Adam's update is about lr per element whatever the gradient's size (m / sqrt(v)), so at lr 1e-4 the gain
  // (|p| about 1, half an ulp 2^-12 or 2^-11) and the temperature (4: 2^-9) lose theirs while the linear
  // layers' weights (|w| < 0.18, half an ulp at most 2^-14 = 6.1e-5) keep most. Every gradient element here
  // is non-zero, so every update is, and the swamped ones are exactly the elements the step left unchanged.
  // eps is 1e-4, as a user training in f16 must set it: the default 1e-8 rounds to 0 in f16, and v = (1 - beta2)
  // g^2 underflows there, so denom is 0 and the updates are infinite (the parameters turn NaN).
  for (const bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    const fs::path path = scratch(decoupled ? "adamw.h5" : "adam.h5");
    Generator gen(11);
    GainedRegressor model(gen);
    model.to(DType::f16);
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled) {
      opt = std::make_unique<optim::AdamW>(model.parameters(), optim::OptimizerOptions{.lr = 1e-4, .eps = 1e-4, .weight_decay = 0.0});
    } else {
      opt = std::make_unique<optim::Adam>(model.parameters(), optim::OptimizerOptions{.lr = 1e-4, .eps = 1e-4});
    }
    const Tensor x = randn({128, 64}, gen).to(DType::f16);
    const Tensor y = randn({128, 1}, gen).to(DType::f16);
    probe::ProbeOptions options{.level = probe::Level::health};
    trace::RunInfo info{.precision = "fp16", .device = "cpu", .model = "gained-regressor", .seed = 11, .config = "{}"};
    info.probe = probe::describe(options);
    auto writer = std::make_shared<trace::TraceWriter>(path, info);
    auto probe = std::make_shared<probe::Probe>(writer, options);
    std::map<std::pair<std::int64_t, std::string>, std::pair<std::int64_t, std::int64_t>> observed;  // (changed?, numel)
    {
      probe::HookGuard watching(probe);
      for (std::int64_t n = 0; n < 12; ++n) {
        probe::Step step(n);
        opt->zero_grad();
        const Tensor loss = mse_loss(model(x), y);
        loss.backward();
        std::map<std::string, std::vector<double>> before;
        for (const auto& [name, p] : model.named_parameters()) {
          for (double g : p.grad().values()) ASSERT_NE(g, 0.0) << name << ": the test's premise (dense gradients)";
          before[name] = p.values();
        }
        step.finish(loss, *opt);
        for (const auto& [name, p] : model.named_parameters()) {
          const std::vector<double> after = p.values();
          std::int64_t unchanged = 0;
          for (std::size_t i = 0; i < after.size(); ++i) unchanged += after[i] == before.at(name)[i];
          observed[{n, name}] = {unchanged, static_cast<std::int64_t>(after.size())};
        }
      }
    }
    probe->flush();
    writer->close();
    trace::TraceReader reader(path);
    const std::vector<trace::UpdateRow> rows = reader.updates();
    ASSERT_EQ(rows.size(), observed.size());
    for (const trace::UpdateRow& r : rows) {
      const auto& [unchanged, numel] = observed.at({r.step, r.param});
      EXPECT_EQ(r.numel, numel) << r.param;
      EXPECT_EQ(r.nonzero, numel) << r.param << " at step " << r.step;
      EXPECT_EQ(r.swamped, unchanged) << r.param << " at step " << r.step;
    }
    const analysis::Report rep = analysis::analyse(reader);
    std::set<std::string> named;
    for (const analysis::SwampedParam& p : rep.swamped.stalled) named.insert(p.param);
    std::string all;
    for (const analysis::SwampedParam& p : rep.swamped.all) all += p.param + ": " + p.evidence + "\n";
    EXPECT_EQ(named, (std::set<std::string>{"gain", "temperature"})) << all;
  }
}

TEST(swamped_updates_test, an_f32_model_writes_no_update_rows_and_the_report_shows_no_section) {
  const fs::path path = scratch("f32.h5");
  train(path, DType::f32, 3);
  trace::TraceReader reader(path);
  EXPECT_TRUE(reader.updates().empty());
  const analysis::Report rep = analysis::analyse(reader);
  EXPECT_FALSE(rep.swamped.recorded());
  EXPECT_EQ(analysis::render_text(rep).find("SWAMPED UPDATES"), std::string::npos);
}

}  // namespace
}  // namespace ampscope::testing
