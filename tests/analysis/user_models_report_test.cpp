// The report on models the analysis rules were not written against (tests/analysis/user_models.h): for
// each, the first anomaly's origin, cause and root op, the evidence quoting the op that really produced the
// origin's input (dataflow provenance, not the row before it), and every remedy the report proposes
// applied to the same run and re-run: the anomaly must go away. What each model does in f16, and why, is
// worked out in user_models.cpp and checked against the run's own tensors in user_models_test.cpp; here
// the report must agree with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "probes/analysis/analysis.h"
#include "probes/analysis/render.h"
#include "probes/trace/reader.h"
#include "tests/analysis/user_models.h"
#include "tests/test_support.h"

namespace ampscope::user_models {
namespace {

using analysis::Diagnosis;
using analysis::Remedy;
using analysis::Report;
using analysis::render_text;
using ampscope::testing::reference_f16;

bool contains(const std::string& text, std::string_view piece) { return text.find(piece) != std::string::npos; }

class user_models_report_test : public ::testing::Test {
 protected:
  RunResult train(RunConfig c) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("ampscope_user_report_" + std::to_string(::getpid()) + "_" + std::to_string(paths_.size()) + ".h5");
    paths_.push_back(path);
    c.trace_path = path.string();
    return run(c);
  }
  static Report report_of(const RunResult& r) {
    trace::TraceReader reader(r.trace_path);
    Report rep = analysis::analyse(reader);
    // How the examples of docs/report-format.md ("Amplification") were made.
    if (std::getenv("AMPSCOPE_SHOW_REPORT") != nullptr) std::cout << render_text(rep);
    return rep;
  }
  void TearDown() override {
    for (const auto& p : paths_) std::filesystem::remove(p);
  }

  // Applies a remedy from the report to the run's config, the way its code form says; false when it needs
  // a change this harness cannot make (e.g. rewriting the loss with an op the API does not have).
  static bool apply(RunConfig& c, const Remedy& m) {
    if (m.kind == "autocast_fp32") {
      apply_override(c, m.pattern, m.pattern_is_op);
      return true;
    }
    if (m.kind == "bf16") {
      set_precision(c, Precision::bf16);
      return true;
    }
    if (m.kind == "learning_rate") {
      c.lr = m.value;
      return true;
    }
    if (m.kind == "clamp" && c.model == Model::tagger) {
      c.clamp_eps = m.value;
      return true;
    }
    if (m.kind == "epsilon" && c.model == Model::handnorm) {
      c.norm_eps = m.value;
      return true;
    }
    if (m.kind == "cast_f32" && (c.model == Model::lse || c.model == Model::pairs)) {
      c.loss_cast_f32 = true;  // the loss, after the autocast region, casts the logits to f32 first
      return true;
    }
    if (m.kind == "stable_formulation" && c.model == Model::pairs && contains(m.code, "amax")) {
      c.subtract_max = true;
      return true;
    }
    if (m.kind == "smaller_scale" && c.model == Model::pairs) {
      c.logit_scale = m.value;  // the learned scale starts there
      return true;
    }
    if (m.kind == "scale_scores" && c.model == Model::attention) {
      c.q_scale = m.value;  // q times the factor before the product
      return true;
    }
    if (m.kind == "stable_formulation" && c.model == Model::tagger && contains(m.code, "binary_cross_entropy_with_logits")) {
      c.use_logits_loss = true;
      return true;
    }
    return false;
  }

  // Every remedy of the first anomaly that the harness can apply is applied alone and re-run: no origin,
  // and a report without anomalies. Returns the kinds applied.
  std::vector<std::string> expect_every_remedy_works(const RunConfig& failing, const Diagnosis& d) {
    std::vector<std::string> applied;
    for (const Remedy& m : d.remedies) {
      RunConfig c = failing;
      if (!apply(c, m)) continue;
      const RunResult r = train(c);
      const std::optional<trace::OpRow> o = first_origin(r.trace_path);
      EXPECT_FALSE(o.has_value()) << m.kind << " (" << m.text << "): still an origin at step " << o->step << ", " << o->op
                                  << " in '" << o->module << "'";
      const Report rep = report_of(r);
      EXPECT_TRUE(rep.healthy()) << m.kind << ": " << (rep.anomalies.empty() ? "" : rep.anomalies.front().cause);
      applied.push_back(m.kind);
    }
    return applied;
  }

 private:
  std::vector<std::filesystem::path> paths_;
};

// Every constant a remedy proposes for an f16 run is a normal f16 number (f16's smallest normal is
// 2^-14 = 6.1e-5): a clamp of 1e-8 rounds to 0 and does nothing.
void expect_constants_survive_f16(const Diagnosis& d) {
  for (const Remedy& m : d.remedies) {
    if (m.kind != "clamp" && m.kind != "epsilon") continue;
    EXPECT_GE(reference_f16(static_cast<float>(m.value)), 6.103515625e-05) << m.kind << " " << m.value;
  }
}

bool has_kind(const Diagnosis& d, std::string_view kind) {
  return std::any_of(d.remedies.begin(), d.remedies.end(), [&](const Remedy& m) { return m.kind == kind; });
}

// ---- tagger: saturation -> cancellation -> log of zero ----

TEST_F(user_models_report_test, tagger_root_is_the_saturated_sigmoid_and_the_evidence_quotes_1_minus_s) {
  const RunConfig c = default_config(Model::tagger);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(d.step, o->step);
  EXPECT_EQ(d.op, "log");
  EXPECT_EQ(d.module, "loss");
  EXPECT_EQ(d.cause, "log_of_zero");
  EXPECT_EQ(d.root_cause, "saturation");
  ASSERT_GE(d.chain.size(), 3u);
  EXPECT_EQ(d.chain.front().op, "sigmoid");
  EXPECT_EQ(d.chain.front().role, "saturation");
  EXPECT_EQ(d.chain.back().op, "log");
  const bool cancels = std::any_of(d.chain.begin(), d.chain.end(),
                                   [](const analysis::ChainLink& l) { return l.op == "add" && l.role == "cancellation"; });
  EXPECT_TRUE(cancels) << "1 - s is add(neg(s), 1.0): it cancels to 0";
  // The log's input is 1 - s (the add fed by neg), whose zeros are one per saturated sigmoid: the log's -inf
  // count. The row before the log is 1 - y, whose zeros are the labels (the old evidence's mistake).
  const std::string zeros = fmt::format("holds {} exact zero", o->health.neg_inf);
  bool quoted = false;
  for (const std::string& e : d.evidence) quoted |= contains(e, "min of log input = 0: its input is the output of add") && contains(e, zeros);
  EXPECT_TRUE(quoted) << fmt::format("{}", fmt::join(d.evidence, "\n"));
  // A precision problem: bf16 (fewer significant bits) is not proposed; the stable formulation comes first.
  EXPECT_FALSE(has_kind(d, "bf16"));
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "stable_formulation");
  EXPECT_TRUE(contains(d.remedies.front().code, "binary_cross_entropy_with_logits"));
  expect_constants_survive_f16(d);
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_GE(applied.size(), 3u);  // formulation, clamp, f32 for the loss
}

TEST_F(user_models_report_test, tagger_with_a_1e_8_clamp_is_told_that_the_bound_rounds_to_0) {
  RunConfig c = default_config(Model::tagger);
  c.clamp_eps = 1e-8;  // the fix a user copies from fp32 code
  const Report rep = report_of(train(c));
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.root_cause, "saturation");
  const bool clamp_named = std::any_of(d.chain.begin(), d.chain.end(), [](const analysis::ChainLink& l) {
    return l.op == "clamp" && l.role == "underflow" && contains(l.evidence, "lower bound rounds to 0 in f16");
  });
  EXPECT_TRUE(clamp_named);
  for (const Remedy& m : d.remedies) EXPECT_FALSE(m.kind == "clamp" && m.value < 6.1e-5) << m.text;
  expect_constants_survive_f16(d);
}

TEST_F(user_models_report_test, tagger_in_fp32_gets_no_precision_specific_remedy) {
  // The fp32 run of the same model is clean, so the same rows are analysed as if the run had been fp32:
  // the remedies must then be about the math only (no f32 override, no bf16).
  const RunResult r = train(default_config(Model::tagger));
  trace::TraceReader reader(r.trace_path);
  std::vector<trace::StepRow> steps = reader.steps();
  std::vector<trace::OpRow> ops = reader.ops();
  analysis::Analyser a;
  trace::RunInfo info = reader.run_info();
  info.precision = "fp32";
  a.set_run(info);
  for (const trace::StepRow& s : steps) {
    std::vector<trace::OpRow> of;
    for (const auto& o : ops)
      if (o.step == s.step) of.push_back(o);
    a.add_step(s.step, &s, of, {});
  }
  const Report rep = a.finish();
  ASSERT_FALSE(rep.anomalies.empty());
  for (const Remedy& m : rep.anomalies.front().remedies) {
    EXPECT_NE(m.kind, "bf16");
    EXPECT_NE(m.kind, "autocast_fp32");
    EXPECT_FALSE(contains(m.text, "bf16")) << m.text;
  }
}

// ---- handnorm: a variance of exactly 0 plus an epsilon that rounds to 0 ----

TEST_F(user_models_report_test, handnorm_root_is_the_epsilon_that_rounds_to_zero) {
  const RunConfig c = default_config(Model::handnorm);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  const std::optional<trace::OpRow> o = first_origin(r.trace_path);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(d.step, o->step);
  EXPECT_EQ(d.op, "div");
  EXPECT_EQ(d.module, o->module);
  EXPECT_EQ(d.root_cause, "underflow");
  ASSERT_FALSE(d.chain.empty());
  EXPECT_EQ(d.chain.front().op, "add");
  EXPECT_TRUE(contains(d.chain.front().evidence, "the constant rounds to 0 in f16")) << d.chain.front().evidence;
  // The remedy is an epsilon that survives f16, then f32 for the norm, then bf16 (a range problem).
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "epsilon");
  EXPECT_TRUE(has_kind(d, "bf16"));
  expect_constants_survive_f16(d);
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_GE(applied.size(), 2u);
}

// ---- lse: exp overflows outside autocast, where an override cannot reach ----

TEST_F(user_models_report_test, lse_outside_autocast_is_told_to_cast_not_to_override) {
  const RunConfig c = default_config(Model::lse);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.op, "exp");
  EXPECT_EQ(d.cause, "exp_overflow");
  // An autocast override does nothing here (user_models_test shows it); the report must not propose one.
  EXPECT_FALSE(has_kind(d, "autocast_fp32"));
  EXPECT_TRUE(has_kind(d, "cast_f32"));
  EXPECT_TRUE(has_kind(d, "bf16"));  // exp's overflow is a range problem
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_GE(applied.size(), 2u);
}

// ---- rmsnorm: an overflow that a later op absorbs into finite, wrong values ----

TEST_F(user_models_report_test, rmsnorm_names_the_silent_damage) {
  const RunConfig c = default_config(Model::rmsnorm);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.op, "mul");
  EXPECT_EQ(d.module, "blocks.1.norm");
  EXPECT_EQ(d.cause, "f16_overflow");
  EXPECT_FALSE(d.loss_nonfinite);  // silent: the loss stays finite
  ASSERT_FALSE(d.absorbed_by.empty());
  EXPECT_TRUE(contains(d.absorbed_by.front(), "rsqrt")) << d.absorbed_by.front();
  EXPECT_GT(d.silently_wrong, 0);
  bool told = false;
  for (const std::string& e : d.evidence) told |= contains(e, "silent damage") && contains(e, "does not show it");
  EXPECT_TRUE(told) << fmt::format("{}", fmt::join(d.evidence, "\n"));
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_GE(applied.size(), 2u);  // f32 for the norm, bf16
}

// ---- pairs and attention: overflows whose values an op upstream amplified (root cause amplification) ----

// The rows of one step of a trace by seq.
std::map<std::int64_t, trace::OpRow> rows_of_step(const std::string& path, std::int64_t step) {
  trace::TraceReader reader(path);
  std::map<std::int64_t, trace::OpRow> rows;
  for (const trace::OpRow& r : reader.ops())
    if (r.step == step && r.phase == trace::Phase::forward) rows.emplace(r.seq, r);
  return rows;
}

// The recorded inputs of a row that are outputs of rows of its step.
std::vector<trace::OpRow> producers(const std::map<std::int64_t, trace::OpRow>& rows, const trace::OpRow& r) {
  std::vector<trace::OpRow> out;
  for (std::int64_t in : r.inputs)
    if (auto it = rows.find(in); in >= 0 && it != rows.end()) out.push_back(it->second);
  return out;
}

TEST_F(user_models_report_test, pairs_root_is_the_mul_by_the_logit_scale_100_times_the_similarities) {
  const RunConfig c = default_config(Model::pairs);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.op, "exp");
  EXPECT_EQ(d.module, "loss");
  EXPECT_EQ(d.cause, "exp_overflow");
  EXPECT_EQ(d.root_cause, "amplification");
  ASSERT_GE(d.chain.size(), 2u);
  const analysis::ChainLink& root = d.chain.front();
  EXPECT_EQ(root.op, "mul");
  EXPECT_EQ(root.role, "amplification");
  EXPECT_EQ(d.chain.back().op, "exp");
  // The factor, from the recorded absmax of the mul's output and of its input (the similarity matrix, the
  // input with as many elements as the output; the other is the 0-dim scale, exp of the parameter).
  const auto rows = rows_of_step(r.trace_path, d.step);
  const trace::OpRow& mul = rows.at(root.seq);
  const std::vector<trace::OpRow> in = producers(rows, mul);
  ASSERT_EQ(in.size(), 2u);
  const trace::OpRow& sim = in[0].health.numel >= in[1].health.numel ? in[0] : in[1];
  const trace::OpRow& scale = in[0].health.numel >= in[1].health.numel ? in[1] : in[0];
  EXPECT_EQ(sim.op, "matmul");
  EXPECT_EQ(scale.op, "exp");
  EXPECT_EQ(scale.health.numel, 1);
  const double factor = mul.health.absmax / sim.health.absmax;
  EXPECT_DOUBLE_EQ(root.factor, factor);
  // And from the run's own tensors: the similarities' largest magnitude and the logits' (each product
  // rounded once to f16), about the scale of 100 (f16 rounding moves it by under 2^-11).
  double sim_max = 0, logit_max = 0;
  for (double v : r.similarities[0]) {
    sim_max = std::max(sim_max, std::fabs(v));
    logit_max = std::max(logit_max, std::fabs(reference_f16(static_cast<float>(v) * static_cast<float>(r.logit_scales[0]))));
  }
  EXPECT_DOUBLE_EQ(sim.health.absmax, sim_max);
  EXPECT_DOUBLE_EQ(mul.health.absmax, logit_max);
  EXPECT_NEAR(factor, 100.0, 100.0 * std::ldexp(1.0, -10));
  const std::string quoted = fmt::format("made |x| {:.3g}x larger: absmax {:.6g} -> {:.6g}", factor, sim_max, logit_max);
  EXPECT_TRUE(contains(root.evidence, quoted)) << root.evidence << "\nwanted: " << quoted;
  EXPECT_TRUE(contains(root.evidence, "a multiplication by the output of exp")) << root.evidence;
  // The first remedy is a smaller factor that keeps exp's input (the logits) within half of ln(65504) on this
  // batch: value * largest similarity <= 11.09 / 2.
  ASSERT_FALSE(d.remedies.empty());
  const Remedy& smaller = d.remedies.front();
  EXPECT_EQ(smaller.kind, "smaller_scale");
  EXPECT_GT(smaller.value, 0);
  EXPECT_LE(smaller.value * sim_max, std::log(65504.0) / 2);
  // The scale computed in f32: mul ran under autocast (on no list: an override reaches it), and everything
  // after it (the loss, outside autocast) keeps f32: an autocast override for mul, not a cast.
  const auto f32 = std::find_if(d.remedies.begin(), d.remedies.end(), [](const Remedy& m) {
    return m.kind == "autocast_fp32" && m.pattern == "mul";
  });
  EXPECT_NE(f32, d.remedies.end()) << d.remedy;
  // Every remedy applied and re-run: no origin, no anomaly.
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_EQ(applied.size(), d.remedies.size()) << fmt::format("{}", fmt::join(applied, ", "));
}

TEST_F(user_models_report_test, attention_root_is_the_unscaled_bmm_of_q_and_k) {
  const RunConfig c = default_config(Model::attention);
  const RunResult r = train(c);
  const Report rep = report_of(r);
  ASSERT_FALSE(rep.anomalies.empty());
  const Diagnosis& d = rep.anomalies.front();
  EXPECT_EQ(d.op, "bmm");
  EXPECT_EQ(d.module, "attn");
  EXPECT_EQ(d.cause, "f16_overflow");
  EXPECT_EQ(d.root_cause, "amplification");
  ASSERT_EQ(d.chain.size(), 1u);  // the bmm amplified and overflowed itself
  const analysis::ChainLink& root = d.chain.front();
  EXPECT_EQ(root.op, "bmm");
  EXPECT_EQ(root.seq, d.seq);
  // The factor: at least 65504 over the larger of q's and k's recorded absmax (its output overflowed, so
  // 65504 is a lower bound of its largest result); q and k as the run computed them agree with the rows.
  const auto rows = rows_of_step(r.trace_path, d.step);
  const std::vector<trace::OpRow> in = producers(rows, rows.at(root.seq));
  ASSERT_EQ(in.size(), 2u);
  double q_max = 0, k_max = 0;
  for (double v : r.queries[0]) q_max = std::max(q_max, std::fabs(v));
  for (double v : r.keys[0]) k_max = std::max(k_max, std::fabs(v));
  EXPECT_DOUBLE_EQ(in[0].health.absmax, q_max);
  EXPECT_DOUBLE_EQ(in[1].health.absmax, k_max);
  const double larger = std::max(in[0].health.absmax, in[1].health.absmax);
  EXPECT_DOUBLE_EQ(root.factor, 65504.0 / larger);
  EXPECT_TRUE(contains(root.evidence, fmt::format("made |x| at least {:.3g}x larger: absmax {:.6g} -> beyond 65504",
                                                  65504.0 / larger, larger)))
      << root.evidence;
  EXPECT_TRUE(contains(root.evidence, "it sums 64 terms and nothing scales them by 1/sqrt(64) = 0.125 before softmax"))
      << root.evidence;
  // The first remedy scales q by 1/sqrt(64) before the product.
  ASSERT_FALSE(d.remedies.empty());
  EXPECT_EQ(d.remedies.front().kind, "scale_scores");
  EXPECT_DOUBLE_EQ(d.remedies.front().value, 0.125);
  EXPECT_TRUE(contains(d.remedies.front().code, "bmm(mul(q, 0.125)")) << d.remedies.front().code;
  const auto applied = expect_every_remedy_works(c, d);
  EXPECT_EQ(applied.size(), d.remedies.size()) << fmt::format("{}", fmt::join(applied, ", "));
}

// ---- ops outside autocast: a cast, never an override, in every section that proposes f32 ----

TEST_F(user_models_report_test, the_precision_section_proposes_a_cast_for_the_loss_after_the_autocast_region) {
  // pairs with a healthy scale, twinned: its loss, written after the autocast region, runs in f16.
  RunConfig c = default_config(Model::pairs);
  c.logit_scale = 10;
  c.twin = true;
  const RunResult r = train(c);
  const Report rep = report_of(r);
  EXPECT_TRUE(rep.healthy());
  ASSERT_TRUE(rep.precision.recorded());
  // What ran outside autocast, from the trace: the loss's rows have no autocast reason.
  const auto rows = rows_of_step(r.trace_path, 0);
  std::set<std::string> outside;
  for (const auto& [seq, row] : rows)
    if (row.autocast.empty()) outside.insert(row.op + "@" + row.module);
  ASSERT_FALSE(outside.empty());
  std::int64_t casts = 0;
  for (const analysis::PrecisionEntry& e : rep.precision.by_jump) {
    for (const Remedy& m : e.remedies) {
      // An override would name an op or module whose rows all ran outside autocast: it could do nothing.
      if (m.kind == "autocast_fp32") {
        bool reaches = false;
        for (const auto& [seq, row] : rows)
          reaches |= !row.autocast.empty() && (m.pattern_is_op ? row.op == m.pattern : row.module == m.pattern);
        EXPECT_TRUE(reaches) << e.op << " in '" << e.module << "': " << m.text;
      }
      if (m.kind == "cast_f32") {
        ++casts;
        EXPECT_TRUE(contains(m.text, "ran outside autocast")) << m.text;
      }
    }
  }
  EXPECT_GT(casts, 0) << render_text(rep);
  // The cast applied (the logits to f32 before the loss): no entry of the loss has remedies any more.
  RunConfig cast = c;
  cast.loss_cast_f32 = true;
  const Report fixed = report_of(train(cast));
  EXPECT_TRUE(fixed.healthy());
  ASSERT_TRUE(fixed.precision.recorded());
  for (const analysis::PrecisionEntry& e : fixed.precision.by_jump)
    EXPECT_FALSE(e.module == "loss" && !e.remedies.empty()) << e.op << ": " << e.evidence;
}

TEST_F(user_models_report_test, an_override_that_names_only_ops_outside_autocast_is_said_so_not_called_a_typo) {
  RunConfig c = default_config(Model::pairs);
  c.logit_scale = 10;
  apply_override(c, "loss", /*is_op=*/false);  // what --autocast-fp32 'loss' installs as a module glob
  const Report rep = report_of(train(c));
  bool told = false;
  for (const std::string& n : rep.coverage.notes) {
    if (!contains(n, "override 'loss'")) continue;
    told = contains(n, "ran outside any autocast region") && contains(n, "exp in loss");
    EXPECT_FALSE(contains(n, "typo")) << n;
  }
  EXPECT_TRUE(told) << fmt::format("{}", fmt::join(rep.coverage.notes, "\n"));
}

}  // namespace
}  // namespace ampscope::user_models
