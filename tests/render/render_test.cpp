// The text and JSON renderings of probes/analysis/render.h on hand-filled Report and DiffReport structs: the
// text's first line names the first anomaly (or says the run is clean), colour only when asked, the JSON
// parses back (nlohmann, independently of the writer's code) with every field of the structs, and NaN and
// the infinities, which JSON cannot hold, come back as null and "inf"/"-inf" (docs/report-format.md).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "probes/analysis/render.h"

namespace ampscope::analysis {
namespace {

using nlohmann::json;
using trace::Phase;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& piece) { return text.find(piece) != std::string::npos; }

std::size_t count_of(const std::string& text, const std::string& piece) {
  std::size_t n = 0;
  for (std::size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + piece.size())) ++n;
  return n;
}

// The attention-overflow diagnosis as docs/scenarios.md describes it, then a recurring scale collapse.
Report overflow_report() {
  Report rep;
  rep.path = "run-fp16.h5";
  rep.run = {.precision = "fp16", .device = "cpu", .model = "transformer", .seed = 7, .config = R"({"steps": 6})"};
  rep.steps = 6;
  rep.op_rows = 1200;
  rep.grad_rows = 96;
  Diagnosis d;
  d.step = 0;
  d.seq = 14;
  d.phase = Phase::forward;
  d.module = "blocks.0.attn";
  d.op = "bmm";
  d.in_dtypes = "f16,f16";
  d.out_dtype = "f16";
  d.autocast = "bmm is on the lower_precision_fp list: runs in f16";
  d.cause = "f16_overflow";
  d.evidence = {"12 +inf of 4096 values in the f16 [4, 32, 32] output of bmm in blocks.0.attn at step 0 (inputs finite)",
                "output absmax of the finite values 6.1e+04; beyond f16 max 65504 became inf"};
  d.downstream_nonfinite = 31;
  d.loss_nonfinite = true;
  d.gradients = {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                 "blocks.0.attn.proj.bias", "blocks.0.ln1.weight", "blocks.0.ln1.bias", "head.weight"};
  d.skipped_steps = 6;
  d.remedy = "run it in f32: --autocast-fp32 'blocks.0.attn' (every block: --autocast-fp32 'blocks.*.attn')";
  d.occurrences = 6;
  d.last_step = 5;
  rep.anomalies.push_back(d);
  Diagnosis c;
  c.step = 4;
  c.seq = std::numeric_limits<std::int64_t>::max();
  c.phase = Phase::scaler;
  c.cause = "scale_collapse";
  c.evidence = {"the scale went 65536 -> 0.5"};
  c.skipped_steps = 6;
  c.remedy = "fix the recurring origin (bmm in blocks.0.attn)";
  c.last_step = 4;
  rep.anomalies.push_back(c);
  HeadroomWarning w;
  w.kind = "near_f16_max";
  w.step = 2;
  w.seq = 3;
  w.module = "blocks.1.mlp.fc";
  w.op = "linear";
  w.tensor = "output";
  w.dtype = "f16";
  w.absmax = 40000;
  w.message = "absmax 4e+04 of the f16 output of linear in blocks.1.mlp.fc is within a factor 2 of 65504";
  w.occurrences = 3;
  w.last_step = 5;
  rep.warnings.push_back(w);
  ScalerHealth& s = rep.scaler;
  s.used = true;
  s.steps = 6;
  s.skipped = 6;
  s.skip_rate = 1.0;
  s.longest_skip_run = 6;
  s.first_skip = 0;
  s.last_skip = 5;
  s.backoffs = 6;
  s.scale_start = 65536;
  s.scale_min = 1024;
  s.scale_max = 65536;
  s.scale_end = 1024;
  s.verdict = "persistent";
  s.message = "every step skipped: an overflow that backing off does not cure";
  return rep;
}

Report healthy_report() {
  Report rep;
  rep.path = "clean.h5";
  rep.run = {.precision = "fp32", .device = "cpu", .model = "mlp", .seed = 0, .config = "{}"};
  rep.steps = 4;
  rep.op_rows = 80;
  rep.grad_rows = 24;
  rep.scaler.steps = 4;
  return rep;
}

TEST(render_test, first_line_names_the_first_anomaly_with_its_dtypes_and_autocast_reason) {
  const std::vector<std::string> lines = lines_of(render_text(overflow_report()));
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "FIRST ANOMALY: step 0, forward, bmm in blocks.0.attn (f16,f16 -> f16; autocast: bmm is on the "
                      "lower_precision_fp list: runs in f16)");
  EXPECT_EQ(lines[1].rfind("  cause: f16_overflow: ", 0), 0u) << lines[1];
  EXPECT_TRUE(contains(lines[1], "65504")) << lines[1];  // the explanation names f16's largest value
  // The fix is within the first lines, before any detail.
  bool fix = false;
  for (std::size_t i = 0; i < 5 && i < lines.size(); ++i)
    fix |= lines[i].rfind("  fix: run it in f32: --autocast-fp32 'blocks.0.attn'", 0) == 0;
  EXPECT_TRUE(fix) << render_text(overflow_report());
}

TEST(render_test, text_gives_every_anomaly_as_a_card_then_scaler_headroom_and_summary) {
  const std::string text = render_text(overflow_report());
  EXPECT_TRUE(contains(text, "  1 more anomaly below")) << text;
  EXPECT_TRUE(contains(text, "ANOMALIES (2)")) << text;
  EXPECT_TRUE(contains(text, "[1] f16_overflow bmm in blocks.0.attn")) << text;
  EXPECT_TRUE(contains(text, "[2] scale_collapse the GradScaler (no single op)")) << text;
  EXPECT_TRUE(contains(text, "op #14 of the step")) << text;
  EXPECT_FALSE(contains(text, std::to_string(std::numeric_limits<std::int64_t>::max()))) << text;  // no seq for step-level
  // Evidence lines quoted as recorded; 7 gradients, 5 named, "and 2 more".
  EXPECT_TRUE(contains(text, "- output absmax of the finite values 6.1e+04; beyond f16 max 65504 became inf")) << text;
  EXPECT_TRUE(contains(text, "31 later ops of step 0 turned non-finite; the loss was non-finite; non-finite gradients of 7 "
                             "parameters (blocks.0.attn.qkv.weight, blocks.0.attn.qkv.bias, blocks.0.attn.proj.weight, "
                             "blocks.0.attn.proj.bias, blocks.0.ln1.weight and 2 more); 6 steps skipped from step 0 on"))
      << text;
  EXPECT_TRUE(contains(text, "6 times (steps 0 to 5)")) << text;
  EXPECT_TRUE(contains(text, "SCALER: persistent: every step skipped")) << text;
  EXPECT_TRUE(contains(text, "6 of 6 steps skipped (100.0%), longest run 6, first at step 0, last at step 5; "
                             "scale 65536 -> 1024 (min 1024, max 65536); 0 growths, 6 backoffs"))
      << text;
  EXPECT_TRUE(contains(text, "HEADROOM WARNINGS (1)")) << text;
  EXPECT_TRUE(contains(text, "near_f16_max step 2, linear in blocks.1.mlp.fc [f16]: absmax 4e+04")) << text;
  EXPECT_TRUE(contains(text, "(3 times, last at step 5)")) << text;
  const std::vector<std::string> lines = lines_of(text);
  EXPECT_EQ(lines.back(), "SUMMARY: 2 anomalies (first: f16_overflow at step 0, bmm in blocks.0.attn); 1 headroom warning; "
                          "scaler persistent (6 of 6 steps skipped)");
}

TEST(render_test, healthy_run_says_no_nan_or_inf_on_its_first_line) {
  const std::string text = render_text(healthy_report());
  EXPECT_EQ(lines_of(text)[0], "OK: no NaN/Inf found in 4 steps (80 op rows, 24 gradient rows)");
  EXPECT_FALSE(contains(text, "ANOMALIES")) << text;
  EXPECT_TRUE(contains(text, "SCALER: no_scaler")) << text;
  EXPECT_EQ(lines_of(text).back(), "SUMMARY: healthy: no NaN/Inf; 0 headroom warnings; scaler no_scaler");
}

TEST(render_test, headroom_line_says_none_plainly_only_when_nothing_went_wrong) {
  // Healthy and without warnings, in f16: "none".
  Report f16_healthy = healthy_report();
  f16_healthy.run.precision = "fp16";
  EXPECT_TRUE(contains(render_text(f16_healthy, TextStyle{}),
                       "HEADROOM: none (no op came within the headroom factor of f16's range, nothing flushed to zero)"));
  // An overflow without other warnings: the overflow itself is not a headroom warning, and the line says so
  // instead of a bare "none" under an anomaly.
  Report rep = overflow_report();
  rep.warnings.clear();
  const std::string text = render_text(rep, TextStyle{});
  EXPECT_TRUE(contains(text, "HEADROOM: no warnings besides the anomalies above (no other op came within the headroom "
                             "factor of f16's range, nothing else flushed to zero)"))
      << text;
  EXPECT_FALSE(contains(text, "HEADROOM: none")) << text;
}

// near_f16_max looks only at f16 outputs and gradients: a run in another precision must not be told that no
// op came near f16's range, as if that had been checked; the line names the precision instead.
TEST(render_test, headroom_line_of_a_run_without_f16_names_its_precision) {
  const std::string f32 = render_text(healthy_report(), TextStyle{});  // precision fp32
  EXPECT_TRUE(contains(f32, "HEADROOM: none (nothing flushed to zero; the headroom factor applies to f16 outputs and "
                            "gradients, and this run's precision is fp32)"))
      << f32;
  EXPECT_FALSE(contains(f32, "f16's range")) << f32;
  Report bf16 = overflow_report();
  bf16.run.precision = "bf16";
  bf16.warnings.clear();
  const std::string text = render_text(bf16, TextStyle{});
  EXPECT_TRUE(contains(text, "HEADROOM: no warnings besides the anomalies above (nothing else flushed to zero; the "
                             "headroom factor applies to f16 outputs and gradients, and this run's precision is bf16)"))
      << text;
  EXPECT_FALSE(contains(text, "within the headroom factor of f16's range")) << text;
}

TEST(render_test, incomplete_trace_carries_a_visible_note_near_the_top) {
  Report rep = healthy_report();
  rep.complete = false;
  const std::vector<std::string> lines = lines_of(render_text(rep));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1].rfind("NOTE: the trace is incomplete: its writer did not close it", 0), 0u) << lines[1];
  EXPECT_TRUE(contains(lines.back(), "trace incomplete")) << lines.back();
}

TEST(render_test, lists_at_most_max_items_anomalies_then_says_how_many_more) {
  Report rep = overflow_report();
  for (int i = 0; i < 4; ++i) {
    Diagnosis d = rep.anomalies.front();
    d.step = 10 + i;
    d.module = "blocks." + std::to_string(i + 1) + ".attn";
    rep.anomalies.push_back(d);
  }
  const std::string text = render_text(rep, {.max_items = 3});
  EXPECT_TRUE(contains(text, "[3] ")) << text;
  EXPECT_FALSE(contains(text, "[4] ")) << text;
  EXPECT_TRUE(contains(text, "... and 3 more (--json lists them all)")) << text;
}

TEST(render_test, writes_ansi_colours_only_when_asked) {
  const Report rep = overflow_report();
  EXPECT_FALSE(contains(render_text(rep), "\x1b["));
  EXPECT_FALSE(contains(render_text(healthy_report()), "\x1b["));
  const std::string coloured = render_text(rep, {.colour = true});
  EXPECT_TRUE(contains(coloured, "\x1b[1;31mFIRST ANOMALY:\x1b[0m")) << coloured;
  EXPECT_EQ(count_of(coloured, "\x1b[") % 2, 0u);  // every colour is reset
  EXPECT_TRUE(contains(render_text(healthy_report(), {.colour = true}), "\x1b[1;32mOK: no NaN/Inf found"));
}

TEST(render_test, brief_report_is_only_the_answer) {
  const std::string text = render_text(overflow_report(), {.brief = true});
  EXPECT_TRUE(contains(text, "FIRST ANOMALY: step 0")) << text;
  EXPECT_TRUE(contains(text, "fix: ")) << text;
  EXPECT_TRUE(contains(text, "  1 more anomaly (ampscope report lists them)")) << text;
  EXPECT_FALSE(contains(text, "ANOMALIES (")) << text;
  EXPECT_FALSE(contains(text, "SUMMARY:")) << text;
  EXPECT_LE(lines_of(text).size(), 6u) << text;
}

TEST(render_test, report_json_parses_back_with_every_field_and_the_schema_version) {
  const Report rep = overflow_report();
  const json j = json::parse(render_json(rep));
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(j["kind"], "report");
  EXPECT_EQ(j["path"], "run-fp16.h5");
  EXPECT_EQ(j["run"]["precision"], "fp16");
  EXPECT_EQ(j["run"]["model"], "transformer");
  EXPECT_EQ(j["run"]["seed"], 7);
  EXPECT_EQ(j["run"]["config"], R"({"steps": 6})");
  EXPECT_EQ(j["complete"], true);
  EXPECT_EQ(j["healthy"], false);
  EXPECT_EQ(j["steps"], 6);
  EXPECT_EQ(j["op_rows"], 1200);
  EXPECT_EQ(j["grad_rows"], 96);
  ASSERT_EQ(j["anomalies"].size(), 2u);
  const json& a = j["anomalies"][0];
  EXPECT_EQ(a["step"], 0);
  EXPECT_EQ(a["seq"], 14);
  EXPECT_EQ(a["phase"], "forward");
  EXPECT_EQ(a["module"], "blocks.0.attn");
  EXPECT_EQ(a["op"], "bmm");
  EXPECT_EQ(a["in_dtypes"], "f16,f16");
  EXPECT_EQ(a["out_dtype"], "f16");
  EXPECT_EQ(a["autocast"], "bmm is on the lower_precision_fp list: runs in f16");
  EXPECT_EQ(a["cause"], "f16_overflow");
  EXPECT_TRUE(contains(a["explanation"].get<std::string>(), "65504"));
  EXPECT_EQ(a["evidence"].size(), 2u);
  EXPECT_EQ(a["downstream_nonfinite"], 31);
  EXPECT_EQ(a["loss_nonfinite"], true);
  EXPECT_EQ(a["gradients"].size(), 7u);
  EXPECT_EQ(a["gradients"][6], "head.weight");
  EXPECT_EQ(a["skipped_steps"], 6);
  EXPECT_EQ(a["remedy"], rep.anomalies[0].remedy);
  EXPECT_EQ(a["occurrences"], 6);
  EXPECT_EQ(a["last_step"], 5);
  EXPECT_TRUE(j["anomalies"][1]["seq"].is_null());  // a step-level diagnosis has no op
  EXPECT_EQ(j["anomalies"][1]["phase"], "scaler");
  ASSERT_EQ(j["warnings"].size(), 1u);
  const json& w = j["warnings"][0];
  EXPECT_EQ(w["kind"], "near_f16_max");
  EXPECT_EQ(w["seq"], 3);
  EXPECT_EQ(w["tensor"], "output");
  EXPECT_EQ(w["absmax"], 40000.0);
  EXPECT_EQ(w["fraction"], 0.0);
  EXPECT_EQ(w["occurrences"], 3);
  const json& s = j["scaler"];
  EXPECT_EQ(s["used"], true);
  EXPECT_EQ(s["skip_rate"], 1.0);
  EXPECT_EQ(s["longest_skip_run"], 6);
  EXPECT_EQ(s["scale_start"], 65536.0);
  EXPECT_EQ(s["scale_end"], 1024.0);
  EXPECT_EQ(s["verdict"], "persistent");
  for (const char* key : {"steps", "skipped", "first_skip", "last_skip", "growths", "backoffs", "scale_min", "scale_max",
                          "message"})
    EXPECT_TRUE(s.contains(key)) << key;
}

TEST(render_test, report_json_writes_nan_as_null_and_infinities_as_strings) {
  Report rep = healthy_report();
  rep.scaler.scale_min = kNaN;
  rep.scaler.scale_max = kInf;
  rep.scaler.scale_end = -kInf;
  const std::string text = render_json(rep);
  EXPECT_FALSE(contains(text, "NaN"));
  const json j = json::parse(text);
  EXPECT_TRUE(j["scaler"]["scale_min"].is_null());
  EXPECT_EQ(j["scaler"]["scale_max"], "inf");
  EXPECT_EQ(j["scaler"]["scale_end"], "-inf");
  EXPECT_EQ(j["healthy"], true);
  EXPECT_TRUE(j["anomalies"].is_array() && j["anomalies"].empty());
}

// ---- diff ----

trace::TensorHealth health(double absmax, std::int64_t pos_inf = 0) {
  trace::TensorHealth h;
  h.numel = 4096;
  h.pos_inf = pos_inf;
  h.min = -absmax;
  h.max = absmax;
  h.absmax = absmax;
  h.mean = absmax / 10;
  h.rms = absmax / 3;
  return h;
}

DiffReport planted_diff(std::int64_t steps) {
  DiffReport d;
  d.path_a = "run-fp32.h5";
  d.path_b = "run-fp16.h5";
  d.run_a = {.precision = "fp32", .device = "cpu", .model = "transformer", .seed = 7, .config = "{}"};
  d.run_b = {.precision = "fp16", .device = "cpu", .model = "transformer", .seed = 7, .config = "{}"};
  d.steps_compared = steps;
  d.ops_aligned = 100 * steps;
  for (std::int64_t s = 0; s < steps; ++s) {
    LossPoint p;
    p.step = s;
    p.in_a = p.in_b = true;
    p.loss_a = 5.0 - 0.01 * static_cast<double>(s);
    p.loss_b = s >= 37 ? kNaN : p.loss_a;
    p.rel = s >= 37 ? kInf : 0.0;
    p.scale_b = s >= 37 ? 65536.0 / static_cast<double>(1 << (s - 36 > 20 ? 20 : s - 36)) : 65536;
    p.skipped_b = s >= 37;
    d.losses.push_back(p);
  }
  if (steps > 37) d.first_loss_divergence = 37;
  OpDiff o;
  o.key = {.step = 37, .phase = Phase::forward, .module = "blocks.0.attn", .op = "bmm", .occurrence = 1};
  o.seq_a = 20;
  o.seq_b = 24;
  o.dtypes_a = "f32,f32 -> f32";
  o.dtypes_b = "f16,f16 -> f16";
  o.a = health(1.45e5);
  o.b = health(6.1e4, 12);
  o.rel_absmax = (1.45e5 - 6.1e4) / 1.45e5;
  o.max_rel = kInf;
  o.stat = "nonfinite";
  o.nonfinite_differs = true;
  o.dtype_differs = true;
  if (steps > 37) {
    d.first_divergence = o;
    d.largest = {o};
  }
  d.dtype_differences.push_back({.phase = Phase::forward, .module = "blocks.0.attn", .op = "bmm", .dtypes_a = "f32,f32 -> f32",
                                 .dtypes_b = "f16,f16 -> f16", .count = 2 * steps, .first_step = 0});
  d.only_in_b.push_back({.phase = Phase::forward, .module = "blocks.0.attn.qkv", .op = "to", .count = 3 * steps, .first_step = 0});
  d.steps_only_in_a = {steps, steps + 1};
  return d;
}

TEST(render_test, diff_text_starts_with_the_first_divergence_then_both_runs) {
  const std::vector<std::string> lines = lines_of(render_text(planted_diff(60)));
  ASSERT_GE(lines.size(), 6u);
  EXPECT_EQ(lines[0], "FIRST DIVERGENCE: step 37, bmm in blocks.0.attn (occurrence 1)");
  EXPECT_EQ(lines[1], "  NaN/inf counts differ: a none, b 12 +inf (absmax a 1.45e+05, b 6.1e+04)");
  EXPECT_EQ(lines[2], "  dtypes: a f32,f32 -> f32, b f16,f16 -> f16");
  EXPECT_EQ(lines[3], "LOSSES PART: step 37: a 4.63, b nan (difference inf of the largest loss so far)");
  const std::string text = render_text(planted_diff(60));
  EXPECT_TRUE(contains(text, "a: run-fp32.h5  (transformer, fp32, cpu, seed 7)")) << text;
  EXPECT_TRUE(contains(text, "b: run-fp16.h5  (transformer, fp16, cpu, seed 7)")) << text;
  EXPECT_TRUE(contains(text, "DTYPE DIFFERENCES (1)")) << text;
  EXPECT_TRUE(contains(text, "  bmm in blocks.0.attn: a f32,f32 -> f32, b f16,f16 -> f16 (120 rows, from step 0)")) << text;
  EXPECT_TRUE(contains(text, "ONLY IN A: nothing") || contains(text, "ONLY IN A (0 op rows)")) << text;
  EXPECT_TRUE(contains(text, "ONLY IN B (180 op rows)")) << text;
  EXPECT_TRUE(contains(text, "  to in blocks.0.attn.qkv: 180 rows, from step 0")) << text;
  EXPECT_TRUE(contains(text, "2 steps: 60, 61")) << text;  // steps only in a
  EXPECT_EQ(lines_of(text).back(), "SUMMARY: the runs part at step 37, at bmm in blocks.0.attn (occurrence 1) (nonfinite); "
                                   "120 op rows in other dtypes; 0 only in a, 180 only in b");
}

// Rows of the loss table: lines that start with the right-aligned step number.
std::vector<std::int64_t> loss_rows(const std::string& text) {
  std::vector<std::int64_t> steps;
  bool in_table = false;
  for (const std::string& line : lines_of(text)) {
    if (line.rfind("LOSS (a | b)", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (line.empty()) break;
    std::istringstream in(line);
    std::int64_t step = 0;
    if (in >> step) steps.push_back(step);
  }
  return steps;
}

TEST(render_test, diff_loss_table_has_every_step_when_few) {
  const std::vector<std::int64_t> rows = loss_rows(render_text(planted_diff(10)));
  ASSERT_EQ(rows.size(), 10u);
  for (std::int64_t s = 0; s < 10; ++s) EXPECT_EQ(rows[s], s);
}

TEST(render_test, diff_loss_table_samples_many_steps_and_keeps_the_divergence_step) {
  const std::string text = render_text(planted_diff(200));
  const std::vector<std::int64_t> rows = loss_rows(text);
  EXPECT_LE(rows.size(), 18u) << text;
  EXPECT_EQ(rows.front(), 0);
  EXPECT_EQ(rows.back(), 199);
  EXPECT_NE(std::find(rows.begin(), rows.end(), 37), rows.end()) << text;
  EXPECT_TRUE(contains(text, "<- first divergence")) << text;
  EXPECT_TRUE(contains(text, "  ...")) << text;  // gaps are shown
}

TEST(render_test, diff_without_divergence_says_so_first) {
  const std::string text = render_text(planted_diff(10));
  EXPECT_EQ(lines_of(text)[0],
            "NO OP DIVERGENCE: no aligned op differs by more than 0.2 of each op's largest rms so far (1000 aligned op rows)");
  EXPECT_EQ(lines_of(text)[1], "LOSSES AGREE: the losses stay within 0.2 of the largest loss so far");
  EXPECT_FALSE(contains(text, "\x1b["));
  EXPECT_TRUE(contains(render_text(planted_diff(10), {.colour = true}), "\x1b[1;32mNO OP DIVERGENCE"));
}

TEST(render_test, gradient_underflow_propagation_calls_its_gradients_all_zero_not_non_finite) {
  // gradient_underflow lists every parameter in `gradients` (docs/report-format.md): their gradients are 0.
  Report rep = healthy_report();
  Diagnosis d;
  d.step = 0;
  d.phase = Phase::backward;
  d.cause = "gradient_underflow";
  d.evidence = {"every gradient is exactly 0"};
  d.gradients = {"fc1.weight", "fc1.bias"};
  d.remedy = "enable the GradScaler";
  rep.anomalies.push_back(d);
  const std::string text = render_text(rep);
  EXPECT_TRUE(contains(text, "all-zero gradients of 2 parameters (fc1.weight, fc1.bias)")) << text;
  EXPECT_FALSE(contains(text, "non-finite gradients")) << text;
}

TEST(render_test, diff_without_a_step_in_both_runs_does_not_claim_the_losses_agree) {
  DiffReport d = planted_diff(3);
  d.steps_compared = 0;
  for (LossPoint& p : d.losses) p.in_a = false;
  const std::string text = render_text(d);
  EXPECT_EQ(lines_of(text)[1], "LOSSES: no step is recorded in both runs: nothing to compare") << text;
  EXPECT_FALSE(contains(text, "LOSSES AGREE")) << text;
}

TEST(render_test, brief_diff_gives_the_divergence_and_the_count_of_dtype_differences) {
  const std::string text = render_text(planted_diff(60), {.brief = true});
  EXPECT_TRUE(contains(text, "FIRST DIVERGENCE: step 37")) << text;
  EXPECT_TRUE(contains(text, "dtype differences: 120 op rows in 1 (phase, module, op) group")) << text;
  EXPECT_FALSE(contains(text, "LOSS (a | b)")) << text;
  EXPECT_LE(lines_of(text).size(), 6u) << text;
}

TEST(render_test, diff_json_parses_back_with_every_field) {
  const json j = json::parse(render_json(planted_diff(60)));
  EXPECT_EQ(j["schema_version"], kReportSchemaVersion);
  EXPECT_EQ(j["kind"], "diff");
  EXPECT_EQ(j["path_a"], "run-fp32.h5");
  EXPECT_EQ(j["run_b"]["precision"], "fp16");
  EXPECT_EQ(j["options"]["threshold"], 0.2);
  EXPECT_EQ(j["options"]["floor"], 0.0);
  EXPECT_EQ(j["scale_aware"], true);
  EXPECT_EQ(j["rows_outside_steps_a"], 0);
  EXPECT_EQ(j["grads_aligned"], 0);
  EXPECT_TRUE(j["first_grad_divergence"].is_null());
  EXPECT_EQ(j["options"]["largest"], 20);
  EXPECT_EQ(j["steps_compared"], 60);
  EXPECT_EQ(j["ops_aligned"], 6000);
  EXPECT_EQ(j["diverged"], true);
  ASSERT_EQ(j["losses"].size(), 60u);
  const json& l = j["losses"][37];
  EXPECT_EQ(l["step"], 37);
  EXPECT_EQ(l["loss_a"], 5.0 - 0.37);
  EXPECT_TRUE(l["loss_b"].is_null());  // NaN
  EXPECT_EQ(l["rel"], "inf");
  EXPECT_EQ(l["skipped_b"], true);
  EXPECT_EQ(l["scale_b"], 32768.0);
  EXPECT_EQ(j["first_loss_divergence"], 37);
  const json& f = j["first_divergence"];
  EXPECT_EQ(f["key"]["step"], 37);
  EXPECT_EQ(f["key"]["phase"], "forward");
  EXPECT_EQ(f["key"]["module"], "blocks.0.attn");
  EXPECT_EQ(f["key"]["op"], "bmm");
  EXPECT_EQ(f["key"]["occurrence"], 1);
  EXPECT_EQ(f["seq_a"], 20);
  EXPECT_EQ(f["seq_b"], 24);
  EXPECT_EQ(f["dtypes_b"], "f16,f16 -> f16");
  EXPECT_EQ(f["a"]["absmax"], 1.45e5);
  EXPECT_EQ(f["b"]["pos_inf"], 12);
  EXPECT_EQ(f["b"]["numel"], 4096);
  EXPECT_DOUBLE_EQ(f["rel_absmax"].get<double>(), (1.45e5 - 6.1e4) / 1.45e5);
  EXPECT_EQ(f["max_rel"], "inf");
  EXPECT_EQ(f["stat"], "nonfinite");
  EXPECT_EQ(f["nonfinite_differs"], true);
  EXPECT_EQ(f["dtype_differs"], true);
  EXPECT_EQ(f["scale_a"], 1.0);
  EXPECT_EQ(f["pinned_b"], json::array());
  EXPECT_EQ(f["magnitudes_compared"], true);
  EXPECT_EQ(j["largest"].size(), 1u);
  ASSERT_EQ(j["dtype_differences"].size(), 1u);
  EXPECT_EQ(j["dtype_differences"][0]["count"], 120);
  EXPECT_EQ(j["dtype_differences"][0]["dtypes_a"], "f32,f32 -> f32");
  EXPECT_TRUE(j["only_in_a"].empty());
  ASSERT_EQ(j["only_in_b"].size(), 1u);
  EXPECT_EQ(j["only_in_b"][0]["op"], "to");
  EXPECT_EQ(j["only_in_b"][0]["count"], 180);
  EXPECT_EQ(j["steps_only_in_a"], json::array({60, 61}));
  EXPECT_TRUE(j["steps_only_in_b"].empty());
}

TEST(render_test, diff_json_without_divergence_has_nulls) {
  const json j = json::parse(render_json(planted_diff(10)));
  EXPECT_EQ(j["diverged"], false);
  EXPECT_TRUE(j["first_divergence"].is_null());
  EXPECT_TRUE(j["first_loss_divergence"].is_null());
}

}  // namespace
}  // namespace ampscope::analysis
