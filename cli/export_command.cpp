// `ampscope export TRACE --csv DIR`: reads every table of a trace, in blocks of whole steps, and writes a
// CSV file per table (docs/trace-format.md, "CSV export"). Each file is written under a temporary name and
// renamed when whole, so DIR never holds a half-written file under a final name.
#include "cli/export_command.h"
#include "cli/progress_line.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <ostream>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/io/output_file.h"
#include "probes/trace/reader.h"
#include "cli/report_command.h"

namespace ampscope::samples {

namespace fs = std::filesystem;

std::string csv_field(std::string_view text) {
  const bool quote = text.find_first_of(",\"\r\n") != std::string_view::npos ||
                     (!text.empty() && (text.front() == ' ' || text.back() == ' ' || text.front() == '\t' || text.back() == '\t'));
  if (!quote) return std::string(text);
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

std::string csv_number(double value) {
  if (std::isnan(value)) return "nan";
  return fmt::format("{}", value);  // fmt's shortest representation that reads back to the same double
}

namespace {

std::string csv_bool(bool value) { return value ? "true" : "false"; }

// One CSV file: written under a temporary name of its own and renamed to NAME by commit(), never through a
// name planted in DIR (core/io/output_file.h); destroyed uncommitted, the temporary file goes.
class CsvFile {
 public:
  CsvFile(const fs::path& dir, const std::string& name, const std::vector<std::string>& header) : file_(dir / name) {
    row(header);
  }
  void row(const std::vector<std::string>& fields) {
    line_.clear();
    for (std::size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) line_ += ',';
      line_ += fields[i];
    }
    line_ += '\n';
    file_.write(line_);
    ++rows_;
  }
  std::int64_t rows() const { return rows_ - 1; }  // the header is not a row
  const fs::path& path() const { return file_.target(); }
  void commit() { file_.commit(); }

 private:
  OutputFile file_;
  std::string line_;
  std::int64_t rows_ = 0;
};

std::string num(std::int64_t v) { return std::to_string(v); }

// Step ranges [begin, end) that cover every step (kFirstStep .. kLastStep), each about rows_per_read op
// rows of the steps /steps lists; the step numbers are kept to split a range that fails to read.
struct Blocks {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::vector<std::int64_t> numbers;  // the steps of /steps, sorted
};

Blocks step_blocks(const std::vector<std::int64_t>& steps, std::int64_t op_rows, std::int64_t rows_per_read) {
  Blocks b;
  b.numbers = steps;
  std::sort(b.numbers.begin(), b.numbers.end());
  b.numbers.erase(std::unique(b.numbers.begin(), b.numbers.end()), b.numbers.end());
  const auto& n = b.numbers;
  const std::int64_t per_step = std::max<std::int64_t>(1, n.empty() ? op_rows : op_rows / static_cast<std::int64_t>(n.size()));
  const auto block = static_cast<std::size_t>(std::max<std::int64_t>(1, rows_per_read / per_step));
  for (std::size_t i = 0; i == 0 || i < n.size(); i += block) {
    const std::int64_t begin = i == 0 ? trace::kFirstStep : n[i];
    const std::int64_t end = i + block >= n.size() ? trace::kLastStep : n[i + block];
    b.ranges.emplace_back(begin, end);
    if (n.empty()) break;
  }
  return b;
}

std::string range_text(std::int64_t begin, std::int64_t end) {
  if (begin == trace::kFirstStep && end == trace::kLastStep) return "every step";
  if (end != trace::kLastStep && begin != trace::kFirstStep && end == begin + 1) return fmt::format("step {}", begin);
  const std::string from = begin == trace::kFirstStep ? "the first" : std::to_string(begin);
  const std::string to = end == trace::kLastStep ? "the last" : std::to_string(end - 1);
  return fmt::format("steps {} to {}", from, to);
}

class Exporter {
 public:
  Exporter(const ExportRequest& request, trace::TraceReader& reader, const fs::path& dir, std::ostream& out, std::ostream& err)
      : request_(request), reader_(reader), dir_(dir), out_(out), err_(err) {}

  // Reads [begin, end) with `read` and writes its rows with `write`; a range that fails is split at the
  // steps inside it, and what still fails is noted as lost.
  template <class Row>
  void export_range(const std::string& table, std::int64_t begin, std::int64_t end,
                    const std::function<std::vector<Row>(std::int64_t, std::int64_t)>& read,
                    const std::function<void(const Row&)>& write, const Blocks& blocks, std::int64_t& done,
                    const std::function<void(std::int64_t)>& progress) {
    std::vector<Row> rows;
    try {
      rows = read(begin, end);
    } catch (const trace::TraceError& e) {
      // Split at the steps inside the range (each step alone), unless it is one step already.
      std::vector<std::int64_t> cuts;
      for (const std::int64_t s : blocks.numbers) {
        if (s > begin && s < end) cuts.push_back(s);
        if (s + 1 > begin && s + 1 < end && s + 1 != trace::kLastStep) cuts.push_back(s + 1);
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      if (cuts.empty()) {
        lose(table, begin, end, e.what());
        return;
      }
      std::int64_t from = begin;
      cuts.push_back(end);
      for (const std::int64_t to : cuts) {
        try {
          for (const Row& r : read(from, to)) write(r);
        } catch (const trace::TraceError& inner) {
          lose(table, from, to, inner.what());
        }
        from = to;
      }
      return;
    }
    for (const Row& r : rows) write(r);
    done += static_cast<std::int64_t>(rows.size());
    progress(done);
  }

  template <class Row>
  void export_table(const std::string& name, const std::vector<std::string>& header, std::int64_t total,
                    const std::function<std::vector<Row>(std::int64_t, std::int64_t)>& read,
                    const std::function<std::vector<std::string>(const Row&)>& fields, const Blocks& blocks) {
    CsvFile file(dir_, name + ".csv", header);
    ProgressLine line(err_, request_.progress && total >= request_.progress_rows, "exporting " + name + ".csv");
    const std::function<void(std::int64_t)> progress = [&](std::int64_t done) { line(done, total); };
    std::int64_t done = 0;
    const std::function<void(const Row&)> write = [&](const Row& r) { file.row(fields(r)); };
    for (const auto& [begin, end] : blocks.ranges) export_range<Row>(name, begin, end, read, write, blocks, done, progress);
    line.clear();
    file.commit();
    out_ << fmt::format("wrote {} ({} rows)\n", file.path().string(), file.rows());
  }

  void lose(const std::string& table, std::int64_t begin, std::int64_t end, const std::string& what) {
    const std::string message = request_.verbose ? what : without_hdf5_stack(what);
    damage_.push_back(fmt::format("{}.csv: the rows of {} could not be read and are missing: {}", table, range_text(begin, end), message));
  }

  std::vector<std::string>& damage() { return damage_; }

 private:
  const ExportRequest& request_;
  trace::TraceReader& reader_;
  fs::path dir_;
  std::ostream& out_;
  std::ostream& err_;
  std::vector<std::string> damage_;
};

// The export, one function per table (or pair of tables), in the order of the files. Each writes its file
// (or files) and the line "wrote FILE (N rows)"; rows that cannot be read are noted in the exporter.

// run.csv: the root attributes, the config and probe JSON among them.
void export_run(const fs::path& dir, trace::TraceReader& reader, std::ostream& out) {
  using namespace trace;
  const RunInfo& info = reader.run_info();
  CsvFile run(dir, "run.csv", {"attribute", "value"});
  run.row({"format", csv_field(kFormat)});
  run.row({"format_version", num(reader.format_version())});
  run.row({"precision", csv_field(info.precision)});
  run.row({"device", csv_field(info.device)});
  run.row({"model", csv_field(info.model)});
  run.row({"seed", num(info.seed)});
  run.row({"config", csv_field(info.config)});
  run.row({"probe", csv_field(info.probe)});
  run.row({"complete", reader.complete() ? "1" : "0"});
  run.commit();
  out << fmt::format("wrote {} ({} rows)\n", run.path().string(), run.rows());
}

// Blocks of whole steps from /steps (every step at once when /steps cannot be read), and /steps itself.
Blocks read_step_blocks(Exporter& ex, trace::TraceReader& reader, const ExportRequest& request,
                        std::vector<trace::StepRow>& steps) {
  using namespace trace;
  std::vector<std::int64_t> numbers;
  try {
    steps = reader.steps();
    for (const StepRow& s : steps) numbers.push_back(s.step);
  } catch (const TraceError& e) {
    ex.lose("steps", kFirstStep, kLastStep, e.what());
  }
  return step_blocks(numbers, reader.row_counts().ops, request.rows_per_read);
}

// steps.csv: written from the rows read for the blocks.
void export_steps(const fs::path& dir, const std::vector<trace::StepRow>& steps, std::ostream& out) {
  using namespace trace;
  CsvFile file(dir, "steps.csv", {"step", "loss", "scale", "scale_after", "found_inf", "skipped", "growth_tracker", "grad_norm", "lr", "time_ms"});
  for (const StepRow& s : steps) {
    file.row({num(s.step), csv_number(s.loss), csv_number(s.scale), csv_number(s.scale_after), csv_bool(s.found_inf),
              csv_bool(s.skipped), num(s.growth_tracker), csv_number(s.grad_norm), csv_number(s.lr), csv_number(s.time_ms)});
  }
  file.commit();
  out << fmt::format("wrote {} ({} rows)\n", file.path().string(), file.rows());
}

// ops.csv: the op rows, read a block of whole steps at a time.
void export_ops(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  std::vector<std::string> op_header = {"step", "seq", "phase", "op", "module", "in_dtypes", "out_dtype", "shape", "autocast", "numel",
                                        "nan", "pos_inf", "neg_inf", "zero", "subnormal", "min", "max", "absmax", "mean", "rms",
                                        "cast_overflow", "cast_underflow", "origin"};
  for (int i = 0; i < kOpInputs; ++i) op_header.push_back(fmt::format("inputs_{}", i));
  ex.export_table<OpRow>(
      "ops", op_header, counts.ops, [&](std::int64_t b, std::int64_t e) { return reader.ops(b, e); },
      [](const OpRow& o) {
        const TensorHealth& h = o.health;
        std::vector<std::string> f = {num(o.step), num(o.seq), std::string(phase_name(o.phase)), csv_field(o.op), csv_field(o.module),
                                      csv_field(o.in_dtypes), csv_field(o.out_dtype), csv_field(o.shape), csv_field(o.autocast),
                                      num(h.numel), num(h.nan), num(h.pos_inf), num(h.neg_inf), num(h.zero), num(h.subnormal),
                                      csv_number(h.min), csv_number(h.max), csv_number(h.absmax), csv_number(h.mean), csv_number(h.rms),
                                      num(o.cast_overflow), num(o.cast_underflow), csv_bool(o.origin)};
        for (const std::int64_t i : o.inputs) f.push_back(num(i));
        return f;
      },
      blocks);
}

void export_grads(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<GradRow>(
      "grads", {"step", "param", "dtype", "nan", "pos_inf", "neg_inf", "zero", "absmax", "norm", "unscaled", "before_all_reduce"},
      counts.grads, [&](std::int64_t b, std::int64_t e) { return reader.grads(b, e, GradRows::all); },
      [](const GradRow& g) {
        return std::vector<std::string>{num(g.step), csv_field(g.param), csv_field(g.dtype), num(g.nan), num(g.pos_inf), num(g.neg_inf),
                                        num(g.zero), csv_number(g.absmax), csv_number(g.norm), csv_bool(g.unscaled),
                                        csv_bool(g.before_all_reduce)};
      },
      blocks);
}

void export_events(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<EventRow>(
      "events", {"step", "seq", "kind", "op", "module", "detail"}, counts.events,
      [&](std::int64_t b, std::int64_t e) { return reader.events(b, e); },
      [](const EventRow& e) {
        return std::vector<std::string>{num(e.step), num(e.seq), csv_field(e.kind), csv_field(e.op), csv_field(e.module), csv_field(e.detail)};
      },
      blocks);
}

void export_histograms(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  std::vector<std::string> hist_header = {"step", "seq", "tensor"};
  for (int i = 0; i < kHistBins; ++i) hist_header.push_back(fmt::format("bins_{}", i));
  ex.export_table<HistogramRow>(
      "histograms", hist_header, counts.histograms, [&](std::int64_t b, std::int64_t e) { return reader.histograms(b, e); },
      [](const HistogramRow& h) {
        std::vector<std::string> f = {num(h.step), num(h.seq), csv_field(h.tensor)};
        for (const std::int64_t n : h.bins) f.push_back(num(n));
        return f;
      },
      blocks);
}

// The f32 twin's rows (format_version 5; a header only for older traces and runs without --twin).
void export_precision(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  std::vector<std::string> precision_header = {
      "step",        "seq",          "op",           "module",         "out_dtype",       "numel", "local",
      "local_max_rel", "local_mean_rel", "local_max_ulp", "acc_max_rel", "acc_mean_rel", "acc_max_ulp",
      "in_acc_max_rel", "in_acc_mean_rel", "flips", "bits", "cond", "followed"};
  for (int i = 0; i < kErrorBins; ++i) precision_header.push_back(fmt::format("error_bins_{}", i));
  precision_header.push_back("exact");
  precision_header.push_back("phase");  // format_version 6 (format 5 rows: forward)
  ex.export_table<PrecisionRow>(
      "precision", precision_header,
      counts.precision, [&](std::int64_t b, std::int64_t e) { return reader.precision(b, e); },
      [](const PrecisionRow& p) {
        std::vector<std::string> f{num(p.step),
                                        num(p.seq),
                                        csv_field(p.op),
                                        csv_field(p.module),
                                        csv_field(p.out_dtype),
                                        num(p.numel),
                                        csv_bool(p.local),
                                        csv_number(p.local_max_rel),
                                        csv_number(p.local_mean_rel),
                                        csv_number(p.local_max_ulp),
                                        csv_number(p.acc_max_rel),
                                        csv_number(p.acc_mean_rel),
                                        csv_number(p.acc_max_ulp),
                                        csv_number(p.in_acc_max_rel),
                                        csv_number(p.in_acc_mean_rel),
                                        num(p.flips),
                                        csv_number(p.bits),
                                        csv_number(p.cond),
                                        csv_bool(p.followed)};
        for (const std::int64_t n : p.error_bins) f.push_back(num(n));
        f.push_back(num(p.exact));
        f.push_back(std::string(phase_name(p.phase)));
        return f;
      },
      blocks);
}

// Swamped-update counts of f16/bf16 parameters (format_version 5; a header only for older traces and runs
// whose parameters are f32).
void export_updates(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<UpdateRow>(
      "updates", {"step", "param", "dtype", "numel", "nonzero", "swamped", "param_abs_mean", "update_abs_mean"},
      counts.updates, [&](std::int64_t b, std::int64_t e) { return reader.updates(b, e); },
      [](const UpdateRow& u) {
        return std::vector<std::string>{num(u.step),    csv_field(u.param), csv_field(u.dtype),
                                        num(u.numel),   num(u.nonzero),     num(u.swamped),
                                        csv_number(u.param_abs_mean), csv_number(u.update_abs_mean)};
      },
      blocks);
}

// Parameter checksums after each step (format_version 6; a header only for older traces and single-process runs).
void export_checksums(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<ChecksumRow>(
      "checksums", {"step", "param", "checksum"}, counts.checksums,
      [&](std::int64_t b, std::int64_t e) { return reader.checksums(b, e); },
      [](const ChecksumRow& c) {
        return std::vector<std::string>{num(c.step), csv_field(c.param), fmt::format("{}", c.checksum)};
      },
      blocks);
}

// FP8 operand statistics (format_version 7; a header only for older traces and runs that are not fp8).
void export_fp8(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<Fp8Row>(
      "fp8",
      {"step", "module", "operand", "format", "numel", "nonzero", "underflow", "subnormal", "saturated", "amax", "scale",
       "rel_rms_error", "dynamic_range", "quantized_dynamic_range", "history_len", "history_amax", "history_amax_step"},
      counts.fp8, [&](std::int64_t b, std::int64_t e) { return reader.fp8(b, e); },
      [](const Fp8Row& r) {
        return std::vector<std::string>{num(r.step),          csv_field(r.module), csv_field(r.operand), csv_field(r.format),
                                        num(r.numel),         num(r.nonzero),      num(r.underflow),     num(r.subnormal),
                                        num(r.saturated),     csv_number(r.amax),  csv_number(r.scale),
                                        csv_number(r.rel_rms_error), csv_number(r.dynamic_range),
                                        csv_number(r.quantized_dynamic_range), num(r.history_len),
                                        csv_number(r.history_amax), num(r.history_amax_step)};
      },
      blocks);
}

// Block-scaled operand statistics (format_version 8; a header only for older traces and runs that neither train in
// mxfp8/nvfp4 nor ask --what-if). what_if is true/false, as the other flags.
void export_block_rows(Exporter& ex, trace::TraceReader& reader, const trace::RowCounts& counts, const Blocks& blocks) {
  using namespace trace;
  ex.export_table<BlockRow>(
      "blocks",
      {"step", "module", "operand", "copy", "format", "what_if", "rows", "cols", "numel", "nonzero", "nonfinite", "underflow",
       "saturated", "blocks", "blocks_clipped", "blocks_nan", "max_block_range", "max_range_block", "max_range_row",
       "max_range_col", "worst_block", "worst_block_underflow", "worst_block_row", "worst_block_col", "scale_log2_min",
       "scale_log2_median", "scale_log2_max", "rel_rms_error"},
      counts.blocks, [&](std::int64_t b, std::int64_t e) { return reader.blocks(b, e); },
      [](const BlockRow& r) {
        return std::vector<std::string>{num(r.step),
                                        csv_field(r.module),
                                        csv_field(r.operand),
                                        csv_field(r.copy),
                                        csv_field(r.format),
                                        csv_bool(r.what_if),
                                        num(r.rows),
                                        num(r.cols),
                                        num(r.numel),
                                        num(r.nonzero),
                                        num(r.nonfinite),
                                        num(r.underflow),
                                        num(r.saturated),
                                        num(r.blocks),
                                        num(r.blocks_clipped),
                                        num(r.blocks_nan),
                                        csv_number(r.max_block_range),
                                        num(r.max_range_block),
                                        num(r.max_range_row),
                                        num(r.max_range_col),
                                        num(r.worst_block),
                                        num(r.worst_block_underflow),
                                        num(r.worst_block_row),
                                        num(r.worst_block_col),
                                        csv_number(r.scale_log2_min),
                                        csv_number(r.scale_log2_median),
                                        csv_number(r.scale_log2_max),
                                        csv_number(r.rel_rms_error)};
      },
      blocks);
}

// Dumps are few and small (the probe bounds them): read at once, values into their own file.
void export_dumps(Exporter& ex, trace::TraceReader& reader, const fs::path& dir, const Blocks& blocks,
                  std::ostream& out) {
  using namespace trace;
  CsvFile dumps(dir, "dumps.csv", {"dump", "step", "seq", "op", "module", "tensor", "dtype", "shape", "values_count"});
  CsvFile values(dir, "dump_values.csv", {"dump", "index", "value"});
  std::int64_t id = 0, done = 0;
  const std::function<void(std::int64_t)> progress = [](std::int64_t) {};  // dumps are few: no progress line
  const std::function<void(const DumpRow&)> write = [&](const DumpRow& d) {
    dumps.row({num(id), num(d.step), num(d.seq), csv_field(d.op), csv_field(d.module), csv_field(d.tensor), csv_field(d.dtype),
               csv_field(d.shape), num(static_cast<std::int64_t>(d.values.size()))});
    for (std::size_t i = 0; i < d.values.size(); ++i) values.row({num(id), num(static_cast<std::int64_t>(i)), csv_number(d.values[i])});
    ++id;
  };
  const std::function<std::vector<DumpRow>(std::int64_t, std::int64_t)> read = [&](std::int64_t b, std::int64_t e) {
    return reader.dumps(b, e);
  };
  ex.export_range<DumpRow>("dumps", kFirstStep, kLastStep, read, write, blocks, done, progress);
  dumps.commit();
  values.commit();
  out << fmt::format("wrote {} ({} rows)\n", dumps.path().string(), dumps.rows());
  out << fmt::format("wrote {} ({} rows)\n", values.path().string(), values.rows());
}

void export_all(const ExportRequest& request, trace::TraceReader& reader, const fs::path& dir, std::ostream& out, std::ostream& err,
                std::vector<std::string>& damage) {
  Exporter ex(request, reader, dir, out, err);
  const trace::RowCounts counts = reader.row_counts();
  export_run(dir, reader, out);
  std::vector<trace::StepRow> steps;
  const Blocks blocks = read_step_blocks(ex, reader, request, steps);
  export_steps(dir, steps, out);
  export_ops(ex, reader, counts, blocks);
  export_grads(ex, reader, counts, blocks);
  export_events(ex, reader, counts, blocks);
  export_histograms(ex, reader, counts, blocks);
  export_precision(ex, reader, counts, blocks);
  export_updates(ex, reader, counts, blocks);
  export_checksums(ex, reader, counts, blocks);
  export_fp8(ex, reader, counts, blocks);
  export_block_rows(ex, reader, counts, blocks);
  export_dumps(ex, reader, dir, blocks, out);
  damage.insert(damage.end(), ex.damage().begin(), ex.damage().end());
}

}  // namespace

int run_export(const ExportRequest& request, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& what, const std::string& hint) {
    err << fmt::format("ampscope export: error: {}\n", request.verbose ? what : without_hdf5_stack(what));
    if (!hint.empty() && what.find("hint:") == std::string::npos) err << "hint: " << hint << "\n";
    return kExportFailed;
  };
  if (request.dir.empty()) return fail("no output folder: give --csv DIR", "ampscope export TRACE --csv DIR");
  const fs::path dir(request.dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return fail(fmt::format("'{}' exists and is not a folder", request.dir), "give --csv a folder (it is created when missing)");
  }
  std::optional<trace::TraceReader> reader;
  try {
    reader.emplace(request.trace);
  } catch (const trace::TraceError& e) {
    return fail(e.what(), "ampscope reads the HDF5 traces `ampscope train --out FILE` writes (docs/trace-format.md)");
  }
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return fail(fmt::format("cannot create the folder '{}': {}", request.dir, ec.message()), "check that its parent is writable");
  }
  std::vector<std::string> damage = reader->damage();
  try {
    export_all(request, *reader, dir, out, err, damage);
  } catch (const Error& e) {
    return fail(e.what(), "check that the folder is writable and the disk has room");
  }
  // Texts damaged in /strings are noted by the reader as the rows are read.
  for (const std::string& d : reader->damage()) {
    if (std::find(damage.begin(), damage.end(), d) == damage.end()) damage.push_back(d);
  }
  if (!reader->complete()) {
    err << fmt::format("ampscope export: note: '{}' is incomplete (its writer did not close it: killed, failed or still running); "
                       "exported the rows it had flushed\n",
                       request.trace);
  }
  for (const std::string& d : damage) err << "ampscope export: damaged: " << d << "\n";
  return damage.empty() ? kExportDone : kExportDamaged;
}

ExportCommand::ExportCommand(CLI::App& app) {
  cmd_ = app.add_subcommand(
      "export",
      "Write every table of a trace as CSV files in a folder: run.csv (root attributes), steps.csv, ops.csv, grads.csv, "
      "events.csv, histograms.csv, dumps.csv, dump_values.csv, precision.csv, updates.csv and checksums.csv, one row per trace row "
      "with a header row; "
      "columns as the "
      "trace's fields (docs/trace-format.md, section 'CSV export'). Texts are whole and quoted when they need it, numbers "
      "read back exactly (nan, inf, -inf), booleans are true/false. Exit status: 0 exported, 1 the trace is damaged (what "
      "could be read was exported; stderr names the rest), 2 usage or file error");
  ExportRequest& r = request_;
  cmd_->add_option("trace", r.trace, "The HDF5 trace `ampscope train --out` wrote")->required();
  cmd_->add_option("--csv", r.dir, "Folder to write the CSV files to (created when missing; files of the same names are replaced)")
      ->required();
  cmd_->footer(
      "Columns (units and meanings: docs/trace-format.md):\n"
      "  run.csv          attribute, value (format, format_version, precision, device, model, seed, config, probe, complete)\n"
      "  steps.csv        step, loss, scale, scale_after, found_inf, skipped, growth_tracker, grad_norm, lr, time_ms\n"
      "  ops.csv          step, seq, phase, op, module, in_dtypes, out_dtype, shape, autocast, numel, nan, pos_inf,\n"
      "                   neg_inf, zero, subnormal, min, max, absmax, mean, rms, cast_overflow, cast_underflow, origin,\n"
      "                   inputs_0 .. inputs_3 (the seq of the row that produced each input, or a negative marker)\n"
      "  grads.csv        step, param, dtype, nan, pos_inf, neg_inf, zero, absmax, norm, unscaled, before_all_reduce\n"
      "                   (true: a --ddp rank's own gradient before the all-reduce)\n"
      "  events.csv       step, seq, kind, op, module, detail\n"
      "  histograms.csv   step, seq, tensor, bins_0 .. bins_131 (bin i < 128: values with floor(log2|x|) = i - 64;\n"
      "                   128 subnormal, 129 zero, 130 inf, 131 NaN)\n"
      "  dumps.csv        dump, step, seq, op, module, tensor, dtype, shape, values_count\n"
      "  dump_values.csv  dump (its row in dumps.csv), index (row-major), value\n"
      "  precision.csv    step, seq, op, module, out_dtype, numel, local, local_max_rel, local_mean_rel, local_max_ulp,\n"
      "                   acc_max_rel, acc_mean_rel, acc_max_ulp, in_acc_max_rel, in_acc_mean_rel, flips, bits, cond,\n"
      "                   followed, error_bins_0 .. error_bins_25, exact (the f32 twin's rows: `ampscope train --twin`;\n"
      "                   empty without it)\n"
      "  updates.csv      step, param, dtype, numel, nonzero, swamped, param_abs_mean, update_abs_mean (f16/bf16\n"
      "                   parameters' updates rounded away; empty when the parameters are f32)\n"
      "  checksums.csv    step, param, checksum (each parameter's 64-bit checksum after every step, param \"\" the\n"
      "                   combined one; a --ddp rank's; empty otherwise)");
}

bool ExportCommand::parsed() const { return cmd_->parsed(); }

int ExportCommand::run(bool verbose) {
  ExportRequest r = request_;
  r.verbose = verbose;
  r.progress = isatty(fileno(stderr)) != 0;
  return run_export(r, std::cout, std::cerr);
}

}  // namespace ampscope::samples
