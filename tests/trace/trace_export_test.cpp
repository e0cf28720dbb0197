// `ampscope export TRACE --csv DIR` (cli/export_command.h): every exported value equals the reader's
// (the CSV parsed back by an RFC 4180 parser written here, numbers by strtod, bit for bit), hostile texts
// are quoted as RFC 4180 says, numbers read back exactly, and the errors and exit statuses: a missing trace,
// a DIR that is a file, a file that is not a trace, a damaged trace exported as far as it reads.
#include <hdf5.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "probes/trace/reader.h"
#include "probes/trace/writer.h"
#include "cli/export_command.h"
#include "tests/trace/trace_test_util.h"

namespace ampscope::trace {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// RFC 4180: fields separated by commas, records by line breaks; a field in double quotes may hold commas,
// line breaks and doubled quotes.
std::vector<std::vector<std::string>> parse_csv(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, was_quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = true;
    } else if (c == ',') {
      row.push_back(field);
      field.clear();
      was_quoted = false;
    } else if (c == '\n') {
      row.push_back(field);
      rows.push_back(row);
      row.clear();
      field.clear();
      was_quoted = false;
    } else {
      field += c;
    }
  }
  EXPECT_TRUE(row.empty() && field.empty() && !quoted) << path << " does not end with a line break";
  return rows;
}

// A CSV file as a header and rows of fields by column name.
struct Csv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  const std::string& at(std::size_t row, const std::string& column) const {
    const auto it = std::find(header.begin(), header.end(), column);
    EXPECT_NE(it, header.end()) << "no column " << column;
    return rows.at(row).at(static_cast<std::size_t>(it - header.begin()));
  }
};

Csv read_csv(const fs::path& path) {
  auto all = parse_csv(path);
  Csv csv;
  if (all.empty()) return csv;
  csv.header = all.front();
  csv.rows.assign(all.begin() + 1, all.end());
  for (const auto& r : csv.rows) EXPECT_EQ(r.size(), csv.header.size()) << path;
  return csv;
}

// The exact double a CSV number reads as (strtod: the C library's correctly rounded conversion).
double number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  EXPECT_EQ(*end, '\0') << "not a number: '" << text << "'";
  return v;
}
std::int64_t integer(const std::string& text) { return std::stoll(text); }
bool boolean(const std::string& text) {
  EXPECT_TRUE(text == "true" || text == "false") << text;
  return text == "true";
}

// Texts a CSV writer must quote, or must not mangle.
const std::vector<std::string> kHostile = {
    "a,b",           "say \"hi\"",   "line\nbreak", "cr\rlf",         " leading",     "trailing ",  "",
    "0",             "nan",          "=SUM(A1)",    "\xE6\xA8\xA1\xE5\x9D\x97.\xC3\xA9", "\"", ",", std::string(300, 'm') + ",x"};

void write_hostile_trace(const fs::path& path) {
  TraceWriter w(path, {.precision = "bf16", .device = "cpu", .model = "model, \"quoted\"", .seed = 9, .config = "{\"a\": 1}"},
                {.chunk_rows = 4});
  for (std::int64_t step = 0; step < 3; ++step) {
    for (std::int64_t seq = 0; seq < static_cast<std::int64_t>(kHostile.size()); ++seq) {
      OpRow o = testing::numbered_op(step, seq);
      o.module = kHostile[static_cast<std::size_t>(seq)];
      o.op = kHostile[static_cast<std::size_t>((seq + 3) % kHostile.size())];
      o.inputs = {seq - 1, kInputParameter, kInputData, kInputNone};
      if (seq == 1) o.health.min = kNaN, o.health.max = kInf, o.health.absmax = -kInf, o.health.mean = -0.0;
      if (seq == 2) o.health.mean = 1.0 / 3.0, o.health.rms = 4.9406564584124654e-324;
      w.write(o);
    }
    w.write(GradRow{.step = step, .param = kHostile[static_cast<std::size_t>(step)], .dtype = "f32", .nan = step, .absmax = 0.1, .norm = kNaN,
                    .unscaled = step % 2 == 1});
    // A --ddp rank's own gradient before the all-reduce (format_version 6): written first in the trace's order,
    // after the row above here.
    w.write(GradRow{.step = step, .param = kHostile[static_cast<std::size_t>(step)], .dtype = "f32", .pos_inf = 1 + step,
                    .absmax = 0.25, .norm = kInf, .unscaled = false, .before_all_reduce = true});
    // Parameter checksums (format_version 6): one whose top bit is set (a uint64 above INT64_MAX), and the combined.
    w.write(ChecksumRow{.step = step, .param = kHostile[static_cast<std::size_t>(step) + 1], .checksum = 0xFFFFFFFFFFFFFFF0ull + step});
    w.write(ChecksumRow{.step = step, .param = "", .checksum = 12345});
    w.write(EventRow{.step = step, .seq = 1, .kind = "origin", .op = "log", .module = kHostile[2], .detail = "3 NaN, 1 +inf \"here\""});
    HistogramRow h{.step = step, .seq = -1, .tensor = kHostile[0]};
    for (int b = 0; b < kHistBins; ++b) h.bins[static_cast<std::size_t>(b)] = b * (step + 1);
    w.write(h);
    // The f32 twin's row: a hostile module, and a cond that is NaN (ops without one) or not.
    PrecisionRow pr{.step = step, .seq = step + 1, .op = "rsub", .module = kHostile[static_cast<std::size_t>(step) + 3],
                         .out_dtype = "f16", .numel = 64 + step, .local = step % 2 == 0, .local_max_rel = 1.0 / 3.0,
                         .local_mean_rel = 4.9406564584124654e-324, .local_max_ulp = 0.5, .acc_max_rel = 1, .acc_mean_rel = 0.93,
                         .acc_max_ulp = 2049, .in_acc_max_rel = 5.1e-5, .in_acc_mean_rel = 1e-5, .flips = 60 + step,
                         .bits = 0, .cond = step == 1 ? kNaN : 2.5e4, .followed = step != 2};
    // Its histogram: with the flips, numel elements in all (64 + step = 60 + step flips, 3 in buckets, 1 exact).
    pr.error_bins[static_cast<std::size_t>(step)] = 1;
    pr.phase = step == 1 ? Phase::backward : Phase::forward;  // format_version 6
    pr.error_bins[kErrorBins - 1] = 2;
    pr.exact = 1;
    w.write(pr);
    // A swamped-update row: a hostile parameter name, a subnormal mean.
    w.write(UpdateRow{.step = step, .param = kHostile[static_cast<std::size_t>(step) + 1], .dtype = step == 1 ? "bf16" : "f16",
                      .numel = 100 + step, .nonzero = 90 + step, .swamped = 80 + step, .param_abs_mean = 1.0 / 3.0,
                      .update_abs_mean = step == 2 ? 4.9406564584124654e-324 : 1e-4});
    StepRow s = testing::numbered_step(step);
    if (step == 1) s.loss = kNaN, s.lr = -0.0;
    w.write(s);
    w.end_step(step);
  }
  w.write(DumpRow{.step = 2, .seq = 1, .op = "exp", .module = kHostile[0], .tensor = "input 0", .dtype = "f16", .shape = "[3]",
                  .values = {1.5, -kInf, kNaN}});
  w.close();
}

TEST(trace_export_test, every_exported_value_equals_the_readers) {
  TempDir dir;
  const auto path = dir.file("hostile.h5");
  write_hostile_trace(path);
  const auto out_dir = dir.file("csv");
  std::ostringstream out, err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = out_dir.string(), .rows_per_read = 20}, out, err), samples::kExportDone)
      << err.str();
  EXPECT_EQ(err.str(), "");
  TraceReader r(path);

  const Csv run = read_csv(out_dir / "run.csv");
  ASSERT_EQ(run.rows.size(), 9u);
  EXPECT_EQ(run.rows[4], (std::vector<std::string>{"model", "model, \"quoted\""}));
  EXPECT_EQ(run.rows[1], (std::vector<std::string>{"format_version", std::to_string(kFormatVersion)}));
  EXPECT_EQ(run.rows[8], (std::vector<std::string>{"complete", "1"}));

  const Csv steps = read_csv(out_dir / "steps.csv");
  const auto step_rows = r.steps();
  ASSERT_EQ(steps.rows.size(), step_rows.size());
  for (std::size_t i = 0; i < step_rows.size(); ++i) {
    const StepRow& s = step_rows[i];
    EXPECT_EQ(integer(steps.at(i, "step")), s.step);
    EXPECT_SAME_DOUBLE(s.loss, number(steps.at(i, "loss")));
    EXPECT_SAME_DOUBLE(s.scale, number(steps.at(i, "scale")));
    EXPECT_SAME_DOUBLE(s.scale_after, number(steps.at(i, "scale_after")));
    EXPECT_EQ(boolean(steps.at(i, "found_inf")), s.found_inf);
    EXPECT_EQ(boolean(steps.at(i, "skipped")), s.skipped);
    EXPECT_EQ(integer(steps.at(i, "growth_tracker")), s.growth_tracker);
    EXPECT_SAME_DOUBLE(s.grad_norm, number(steps.at(i, "grad_norm")));
    EXPECT_SAME_DOUBLE(s.lr, number(steps.at(i, "lr")));
    EXPECT_SAME_DOUBLE(s.time_ms, number(steps.at(i, "time_ms")));
  }

  const Csv ops = read_csv(out_dir / "ops.csv");
  const auto op_rows = r.ops();
  ASSERT_EQ(ops.rows.size(), op_rows.size());
  ASSERT_EQ(ops.rows.size(), 3 * kHostile.size());
  for (std::size_t i = 0; i < op_rows.size(); ++i) {
    const OpRow& o = op_rows[i];
    EXPECT_EQ(integer(ops.at(i, "step")), o.step);
    EXPECT_EQ(integer(ops.at(i, "seq")), o.seq);
    EXPECT_EQ(ops.at(i, "phase"), phase_name(o.phase));
    EXPECT_EQ(ops.at(i, "op"), o.op);
    EXPECT_EQ(ops.at(i, "module"), o.module);
    EXPECT_EQ(ops.at(i, "module"), kHostile[i % kHostile.size()]);  // as written, too
    EXPECT_EQ(ops.at(i, "in_dtypes"), o.in_dtypes);
    EXPECT_EQ(ops.at(i, "out_dtype"), o.out_dtype);
    EXPECT_EQ(ops.at(i, "shape"), o.shape);
    EXPECT_EQ(ops.at(i, "autocast"), o.autocast);
    EXPECT_EQ(integer(ops.at(i, "numel")), o.health.numel);
    EXPECT_EQ(integer(ops.at(i, "nan")), o.health.nan);
    EXPECT_EQ(integer(ops.at(i, "pos_inf")), o.health.pos_inf);
    EXPECT_EQ(integer(ops.at(i, "neg_inf")), o.health.neg_inf);
    EXPECT_EQ(integer(ops.at(i, "zero")), o.health.zero);
    EXPECT_EQ(integer(ops.at(i, "subnormal")), o.health.subnormal);
    EXPECT_SAME_DOUBLE(o.health.min, number(ops.at(i, "min")));
    EXPECT_SAME_DOUBLE(o.health.max, number(ops.at(i, "max")));
    EXPECT_SAME_DOUBLE(o.health.absmax, number(ops.at(i, "absmax")));
    EXPECT_SAME_DOUBLE(o.health.mean, number(ops.at(i, "mean")));
    EXPECT_SAME_DOUBLE(o.health.rms, number(ops.at(i, "rms")));
    EXPECT_EQ(integer(ops.at(i, "cast_overflow")), o.cast_overflow);
    EXPECT_EQ(integer(ops.at(i, "cast_underflow")), o.cast_underflow);
    EXPECT_EQ(boolean(ops.at(i, "origin")), o.origin);
    for (int k = 0; k < kOpInputs; ++k) {
      EXPECT_EQ(integer(ops.at(i, fmt::format("inputs_{}", k))), o.inputs[static_cast<std::size_t>(k)]);
    }
  }

  const Csv grads = read_csv(out_dir / "grads.csv");
  const auto grad_rows = r.grads(kFirstStep, kLastStep, GradRows::all);
  ASSERT_EQ(grads.rows.size(), grad_rows.size());
  ASSERT_EQ(grad_rows.size(), 6u) << "each step's gradient row and the row before the all-reduce";
  EXPECT_EQ(r.grads().size(), 3u) << "grads() returns the rows the steps used";
  EXPECT_EQ(r.grads(kFirstStep, kLastStep, GradRows::before_all_reduce).size(), 3u);
  for (std::size_t i = 0; i < grad_rows.size(); ++i) {
    const GradRow& g = grad_rows[i];
    EXPECT_EQ(integer(grads.at(i, "step")), g.step);
    EXPECT_EQ(grads.at(i, "param"), g.param);
    EXPECT_EQ(grads.at(i, "dtype"), g.dtype);
    EXPECT_EQ(integer(grads.at(i, "nan")), g.nan);
    EXPECT_EQ(integer(grads.at(i, "pos_inf")), g.pos_inf);
    EXPECT_EQ(integer(grads.at(i, "neg_inf")), g.neg_inf);
    EXPECT_EQ(integer(grads.at(i, "zero")), g.zero);
    EXPECT_SAME_DOUBLE(g.absmax, number(grads.at(i, "absmax")));
    EXPECT_SAME_DOUBLE(g.norm, number(grads.at(i, "norm")));
    EXPECT_EQ(boolean(grads.at(i, "unscaled")), g.unscaled);
    EXPECT_EQ(boolean(grads.at(i, "before_all_reduce")), g.before_all_reduce);
    EXPECT_EQ(g.before_all_reduce, i % 2 == 1) << "as written: every second row";
  }
  EXPECT_EQ(grads.at(1, "pos_inf"), "1");
  EXPECT_EQ(grads.at(1, "norm"), "inf");

  const Csv checksums = read_csv(out_dir / "checksums.csv");
  EXPECT_EQ(checksums.header, (std::vector<std::string>{"step", "param", "checksum"}));
  const auto checksum_rows = r.checksums();
  ASSERT_EQ(checksums.rows.size(), 6u);
  ASSERT_EQ(checksum_rows.size(), 6u);
  for (std::size_t i = 0; i < checksum_rows.size(); ++i) {
    EXPECT_EQ(integer(checksums.at(i, "step")), checksum_rows[i].step);
    EXPECT_EQ(checksums.at(i, "param"), checksum_rows[i].param);
    EXPECT_EQ(std::stoull(checksums.at(i, "checksum")), checksum_rows[i].checksum);
  }
  EXPECT_EQ(checksums.at(0, "param"), kHostile[1]);  // as written
  EXPECT_EQ(checksums.at(0, "checksum"), "18446744073709551600");  // 2^64 - 16, in decimal
  EXPECT_EQ(checksums.at(5, "param"), "");
  EXPECT_EQ(checksums.at(5, "checksum"), "12345");

  const Csv events = read_csv(out_dir / "events.csv");
  const auto event_rows = r.events();
  ASSERT_EQ(events.rows.size(), event_rows.size());
  for (std::size_t i = 0; i < event_rows.size(); ++i) {
    const EventRow& e = event_rows[i];
    EXPECT_EQ(events.rows[i], (std::vector<std::string>{std::to_string(e.step), std::to_string(e.seq), e.kind, e.op, e.module, e.detail}));
  }

  const Csv hist = read_csv(out_dir / "histograms.csv");
  const auto hist_rows = r.histograms();
  ASSERT_EQ(hist.rows.size(), hist_rows.size());
  ASSERT_EQ(hist.header.size(), 3u + kHistBins);
  for (std::size_t i = 0; i < hist_rows.size(); ++i) {
    EXPECT_EQ(hist.at(i, "tensor"), hist_rows[i].tensor);
    for (int b = 0; b < kHistBins; ++b) EXPECT_EQ(integer(hist.at(i, fmt::format("bins_{}", b))), hist_rows[i].bins[static_cast<std::size_t>(b)]);
  }

  const Csv precision = read_csv(out_dir / "precision.csv");
  const auto precision_rows = r.precision();
  ASSERT_EQ(precision.rows.size(), 3u);
  ASSERT_EQ(precision_rows.size(), 3u);
  for (std::size_t i = 0; i < precision_rows.size(); ++i) {
    const PrecisionRow& p = precision_rows[i];
    EXPECT_EQ(integer(precision.at(i, "step")), p.step);
    EXPECT_EQ(integer(precision.at(i, "seq")), p.seq);
    EXPECT_EQ(precision.at(i, "op"), p.op);
    EXPECT_EQ(precision.at(i, "module"), p.module);
    EXPECT_EQ(precision.at(i, "module"), kHostile[i + 3]);  // as written, too
    EXPECT_EQ(precision.at(i, "out_dtype"), p.out_dtype);
    EXPECT_EQ(integer(precision.at(i, "numel")), p.numel);
    EXPECT_EQ(boolean(precision.at(i, "local")), p.local);
    EXPECT_SAME_DOUBLE(p.local_max_rel, number(precision.at(i, "local_max_rel")));
    EXPECT_SAME_DOUBLE(p.local_mean_rel, number(precision.at(i, "local_mean_rel")));
    EXPECT_SAME_DOUBLE(p.local_max_ulp, number(precision.at(i, "local_max_ulp")));
    EXPECT_SAME_DOUBLE(p.acc_max_rel, number(precision.at(i, "acc_max_rel")));
    EXPECT_SAME_DOUBLE(p.acc_mean_rel, number(precision.at(i, "acc_mean_rel")));
    EXPECT_SAME_DOUBLE(p.acc_max_ulp, number(precision.at(i, "acc_max_ulp")));
    EXPECT_SAME_DOUBLE(p.in_acc_max_rel, number(precision.at(i, "in_acc_max_rel")));
    EXPECT_SAME_DOUBLE(p.in_acc_mean_rel, number(precision.at(i, "in_acc_mean_rel")));
    EXPECT_EQ(integer(precision.at(i, "flips")), p.flips);
    EXPECT_SAME_DOUBLE(p.bits, number(precision.at(i, "bits")));
    EXPECT_SAME_DOUBLE(p.cond, number(precision.at(i, "cond")));
    EXPECT_EQ(boolean(precision.at(i, "followed")), p.followed);
    for (int b = 0; b < kErrorBins; ++b) {
      EXPECT_EQ(integer(precision.at(i, fmt::format("error_bins_{}", b))), b == static_cast<int>(i) ? 1 : b == kErrorBins - 1 ? 2 : 0)
          << "bucket " << b;
    }
    EXPECT_EQ(integer(precision.at(i, "exact")), 1);
    EXPECT_EQ(precision.at(i, "phase"), i == 1 ? "backward" : "forward");
    EXPECT_EQ(p.phase, i == 1 ? Phase::backward : Phase::forward);
  }
  EXPECT_EQ(precision.at(1, "cond"), "nan");

  const Csv updates = read_csv(out_dir / "updates.csv");
  const auto update_rows = r.updates();
  ASSERT_EQ(updates.rows.size(), 3u);
  ASSERT_EQ(update_rows.size(), 3u);
  for (std::size_t i = 0; i < update_rows.size(); ++i) {
    const UpdateRow& u = update_rows[i];
    EXPECT_EQ(integer(updates.at(i, "step")), u.step);
    EXPECT_EQ(updates.at(i, "param"), u.param);
    EXPECT_EQ(updates.at(i, "param"), kHostile[i + 1]);  // as written, too
    EXPECT_EQ(updates.at(i, "dtype"), u.dtype);
    EXPECT_EQ(integer(updates.at(i, "numel")), u.numel);
    EXPECT_EQ(integer(updates.at(i, "nonzero")), u.nonzero);
    EXPECT_EQ(integer(updates.at(i, "swamped")), u.swamped);
    EXPECT_EQ(integer(updates.at(i, "swamped")), 80 + static_cast<std::int64_t>(i));  // as written
    EXPECT_SAME_DOUBLE(u.param_abs_mean, number(updates.at(i, "param_abs_mean")));
    EXPECT_SAME_DOUBLE(u.update_abs_mean, number(updates.at(i, "update_abs_mean")));
  }
  EXPECT_EQ(updates.at(1, "dtype"), "bf16");
  EXPECT_SAME_DOUBLE(number(updates.at(2, "update_abs_mean")), 4.9406564584124654e-324);

  const Csv dumps = read_csv(out_dir / "dumps.csv");
  const Csv values = read_csv(out_dir / "dump_values.csv");
  const auto dump_rows = r.dumps();
  ASSERT_EQ(dumps.rows.size(), 1u);
  EXPECT_EQ(dumps.rows[0], (std::vector<std::string>{"0", "2", "1", "exp", kHostile[0], "input 0", "f16", "[3]", "3"}));
  ASSERT_EQ(values.rows.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(values.at(i, "dump"), "0");
    EXPECT_EQ(integer(values.at(i, "index")), static_cast<std::int64_t>(i));
    EXPECT_SAME_DOUBLE(dump_rows[0].values[i], number(values.at(i, "value")));
  }
  // One line per file on stdout, and no temporary file left behind.
  EXPECT_NE(out.str().find(fmt::format("wrote {} ({} rows)", (out_dir / "ops.csv").string(), op_rows.size())), std::string::npos) << out.str();
  for (const auto& entry : fs::directory_iterator(out_dir)) EXPECT_EQ(entry.path().extension(), ".csv") << entry.path();
}

TEST(trace_export_test, every_exported_column_is_documented) {
  // docs/trace-format.md's "CSV export" table names each file's columns: every header column of an export
  // is there, in the file's line (inputs_N, bins_N and error_bins_N as their ranges).
  TempDir dir;
  const auto path = dir.file("hostile.h5");
  write_hostile_trace(path);
  std::ostringstream out, err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = dir.file("csv").string()}, out, err), samples::kExportDone);
  std::ifstream in(fs::path(AMPSCOPE_SOURCE_DIR) / "docs" / "trace-format.md");
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t section = page.find("## CSV export");
  ASSERT_NE(section, std::string::npos);
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.file("csv"))) {
    const std::string name = entry.path().filename().string();
    const std::size_t at = page.find("| `" + name + "` |", section);
    ASSERT_NE(at, std::string::npos) << name << " is not in the CSV export table";
    const std::string line = page.substr(at, page.find('\n', at) - at);
    const auto rows = parse_csv(entry.path());
    for (const std::string& column : rows.front()) {
      std::string documented = "`" + column + "`";
      if (column.rfind("inputs_", 0) == 0) documented = "`inputs_0` .. `inputs_3`";
      if (column.rfind("bins_", 0) == 0) documented = "`bins_0` .. `bins_131`";
      if (column.rfind("error_bins_", 0) == 0) documented = "`error_bins_0` .. `error_bins_25`";
      EXPECT_NE(line.find(documented), std::string::npos) << name << ": column " << column << " is not documented in: " << line;
    }
    ++files;
  }
  EXPECT_EQ(files, 13u);  // run, steps, ops, grads, events, histograms, dumps, dump_values, precision, updates, checksums, fp8,
                         // blocks
}

TEST(trace_export_test, quotes_fields_as_rfc_4180_says) {
  EXPECT_EQ(samples::csv_field("linear"), "linear");
  EXPECT_EQ(samples::csv_field(""), "");
  EXPECT_EQ(samples::csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(samples::csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(samples::csv_field("\""), "\"\"\"\"");
  EXPECT_EQ(samples::csv_field("line\nbreak"), "\"line\nbreak\"");
  EXPECT_EQ(samples::csv_field("cr\r"), "\"cr\r\"");
  EXPECT_EQ(samples::csv_field(" pad"), "\" pad\"");
  EXPECT_EQ(samples::csv_field("blocks.0.attn"), "blocks.0.attn");
  // A raw line of ops.csv, as a spreadsheet gets it: the module "a,b" quoted, in_dtypes "f16,f16,f16" too.
  TempDir dir;
  const auto path = dir.file("one.h5");
  {
    TraceWriter w(path, testing::sample_run());
    OpRow o = testing::numbered_op(0, 0);
    o.module = "a,\"b\"";
    w.write(o);
    w.close();
  }
  std::ostringstream out, err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = dir.file("csv").string()}, out, err), samples::kExportDone) << err.str();
  std::ifstream in(dir.file("csv") / "ops.csv");
  std::string header, line;
  std::getline(in, header);
  std::getline(in, line);
  EXPECT_EQ(line.rfind("0,0,forward,linear,\"a,\"\"b\"\"\",\"f16,f16,f16\",f16,\"[1, 128]\",", 0), 0u) << line;
}

TEST(trace_export_test, numbers_read_back_to_the_same_bits) {
  // Random bit patterns (every exponent, subnormals, both zeros) and the special values: strtod of the
  // text gives the same double (NaN: a NaN).
  std::mt19937_64 rng(17);
  std::vector<double> values = {0.0, -0.0, kInf, -kInf, kNaN, 1.0 / 3.0, 0.1, 65504.0, 4.9406564584124654e-324,
                                std::numeric_limits<double>::max(), std::numeric_limits<double>::min(), 1e23, 5e-324};
  for (int i = 0; i < 200000; ++i) values.push_back(std::bit_cast<double>(rng()));
  for (const double v : values) {
    const std::string text = samples::csv_number(v);
    const double back = std::strtod(text.c_str(), nullptr);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(back)) << text;
      EXPECT_EQ(text, "nan");
    } else {
      ASSERT_EQ(std::bit_cast<std::uint64_t>(back), std::bit_cast<std::uint64_t>(v)) << text;
    }
  }
  EXPECT_EQ(samples::csv_number(-0.0), "-0");
  EXPECT_EQ(samples::csv_number(-kInf), "-inf");
  EXPECT_EQ(samples::csv_number(0.1), "0.1");
}

TEST(trace_export_test, says_what_is_wrong_and_exits_2) {
  TempDir dir;
  std::ostringstream out, err;
  // A missing trace: nothing is created.
  EXPECT_EQ(samples::run_export({.trace = dir.file("missing.h5").string(), .dir = dir.file("csv").string()}, out, err),
            samples::kExportFailed);
  EXPECT_NE(err.str().find("ampscope export: error: cannot read trace '" + dir.file("missing.h5").string() + "': no such file"),
            std::string::npos)
      << err.str();
  EXPECT_FALSE(fs::exists(dir.file("csv")));
  // DIR is a file.
  const auto trace = dir.file("t.h5");
  {
    TraceWriter w(trace, testing::sample_run());
    w.write(testing::numbered_step(0));
    w.close();
  }
  std::ofstream(dir.file("taken")) << "x";
  err.str("");
  EXPECT_EQ(samples::run_export({.trace = trace.string(), .dir = dir.file("taken").string()}, out, err), samples::kExportFailed);
  EXPECT_EQ(err.str(), fmt::format("ampscope export: error: '{}' exists and is not a folder\nhint: give --csv a folder (it is created "
                                   "when missing)\n",
                                   dir.file("taken").string()));
  // Not a trace.
  std::ofstream(dir.file("text.h5")) << "not hdf5";
  err.str("");
  EXPECT_EQ(samples::run_export({.trace = dir.file("text.h5").string(), .dir = dir.file("csv").string()}, out, err), samples::kExportFailed);
  EXPECT_NE(err.str().find("not an HDF5 file"), std::string::npos) << err.str();
  // A folder that exists is used; files of the same names are replaced.
  fs::create_directories(dir.file("csv"));
  std::ofstream(dir.file("csv") / "steps.csv") << "old";
  err.str("");
  EXPECT_EQ(samples::run_export({.trace = trace.string(), .dir = dir.file("csv").string()}, out, err), samples::kExportDone) << err.str();
  EXPECT_EQ(read_csv(dir.file("csv") / "steps.csv").rows.size(), 1u);
}

TEST(trace_export_test, a_damaged_trace_is_exported_as_far_as_it_reads_and_the_rest_is_named) {
  TempDir dir;
  const auto path = dir.file("damaged.h5");
  {
    TraceWriter w(path, testing::sample_run(), {.chunk_rows = 8});
    for (std::int64_t step = 0; step < 4; ++step) {
      for (std::int64_t seq = 0; seq < 8; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.close();
  }
  // Row 2 of step 2 (row 18 of /ops) names a text that does not exist, written through HDF5 (the chunk's
  // checksum is right): that step's rows cannot be read; the other steps' can.
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t ds = H5Dopen2(file, "/ops", H5P_DEFAULT);
    const hid_t type = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(type, "module", 0, H5T_NATIVE_INT64);
    const hid_t space = H5Dget_space(ds);
    const hsize_t first = 18, count = 1;
    H5Sselect_hyperslab(space, H5S_SELECT_SET, &first, nullptr, &count, nullptr);
    const hid_t memory = H5Screate_simple(1, &count, nullptr);
    const std::int64_t id = 100000;
    ASSERT_GE(H5Dwrite(ds, type, memory, space, H5P_DEFAULT, &id), 0);
    H5Sclose(memory);
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(ds);
    H5Fclose(file);
  }
  std::ostringstream out, err;
  const auto csv = dir.file("csv");
  // One step per read: the failing block is step 2 alone; with every step in one block, it is split.
  for (const std::int64_t per_read : {8, 1000}) {
    err.str("");
    EXPECT_EQ(samples::run_export({.trace = path.string(), .dir = csv.string(), .rows_per_read = per_read}, out, err), samples::kExportDamaged);
    EXPECT_NE(err.str().find("ampscope export: damaged: ops.csv: the rows of step 2 could not be read and are missing: cannot read trace "
                             "'" + path.string() + "': row 18 of '/ops': its field 'module' names string 100000, but '/strings' holds"),
              std::string::npos)
        << err.str();
    const Csv ops = read_csv(csv / "ops.csv");
    ASSERT_EQ(ops.rows.size(), 24u) << "steps 0, 1 and 3";
    for (std::size_t i = 0; i < ops.rows.size(); ++i) EXPECT_NE(ops.at(i, "step"), "2");
    EXPECT_EQ(read_csv(csv / "steps.csv").rows.size(), 4u);
  }
}

TEST(trace_export_test, shows_progress_of_a_big_table_on_stderr) {
  TempDir dir;
  const auto path = dir.file("p.h5");
  {
    TraceWriter w(path, testing::sample_run());
    for (std::int64_t step = 0; step < 4; ++step) {
      for (std::int64_t seq = 0; seq < 10; ++seq) w.write(testing::numbered_op(step, seq));
      w.write(testing::numbered_step(step));
      w.end_step(step);
    }
    w.close();
  }
  std::ostringstream out, err;
  ASSERT_EQ(samples::run_export({.trace = path.string(), .dir = dir.file("csv").string(), .progress = true, .progress_rows = 40,
                                 .rows_per_read = 10},
                                out, err),
            samples::kExportDone);
  EXPECT_NE(err.str().find("\rexporting ops.csv:  25.0% (10 of 40 rows)"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("\rexporting ops.csv: 100.0% (40 of 40 rows)"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("grads.csv"), std::string::npos) << "a table under progress_rows shows none";
}

}  // namespace
}  // namespace ampscope::trace
