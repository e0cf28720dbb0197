// The trace reader. It opens every trace with SWMR read access first: that is what works on a file being
// written and on one whose writer was killed (whose superblock still says "open for writing", so a plain
// open fails; we never clear that flag, as h5clear would, since the file is the user's). Files that do
// not support SWMR (not written by ampscope) are opened plainly, to say what they are.
//
// How many rows of each table to trust comes from the last row of /index, which the writer appends
// after flushing all tables: rows past it may be half-written by a killed writer.
#include "probes/trace_reader.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "probes/trace_hdf5.h"
#include "probes/trace_layout.h"

namespace ampscope::trace {

using namespace detail;

namespace {

constexpr std::size_t kReadBlockRows = 8192;  // rows read (and decoded) per H5Dread
constexpr const char* kDamageHint =
    "the file may be truncated or damaged; if the run that writes it is still going, try again";

std::size_t index_of(Table t) { return static_cast<std::size_t>(t); }

}  // namespace

struct TraceReader::State {
  std::filesystem::path path;
  Io io;
  File file;
  bool swmr = false;  // opened with SWMR read access: refresh() can see new rows
  RunInfo info;
  std::int64_t version = 0;
  bool complete = false;
  std::optional<std::int64_t> last_step;
  std::array<Datatype, kTableCount> types;      // the record types, our memory types
  std::array<Dataset, kTableCount> datasets;
  std::array<std::int64_t, kDataTableCount> rows{};          // trusted rows per table
  std::array<std::vector<std::int64_t>, kDataTableCount> step_column;  // steps of rows [0, size)

  explicit State(const std::filesystem::path& p) : path(p), io(p.string(), "read") {}

  void open() {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) io.fail("no such file", "check the path");
    if (std::filesystem::is_directory(path, ec)) io.fail("it is a folder, not a trace file");
    if (std::filesystem::file_size(path, ec) == 0) io.fail("the file is empty (not an HDF5 file)");
    const htri_t hdf5 = H5Fis_hdf5(io.path().c_str());
    if (hdf5 <= 0) {
      take_hdf5_errors();
      io.fail("not an HDF5 file (no HDF5 signature at its start)", "an ampscope trace is an HDF5 file written by the trace writer");
    }

    // A SWMR reader retries a metadata read whose checksum fails, in case the writer was in the middle
    // of writing it, waiting twice as long each time: n attempts wait about 2^n ns in all. 27 give a
    // writer 0.1 s to finish; the default 100 would make a damaged file hang its reader for ever.
    PropertyList fapl(io.check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", "/"));
    io.check(H5Pset_metadata_read_attempts(fapl.get(), 27), "H5Pset_metadata_read_attempts", "/");
    hid_t id = H5Fopen(io.path().c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl.get());
    if (id >= 0) {
      swmr = true;
    } else {
      const std::string swmr_errors = take_hdf5_errors();
      id = H5Fopen(io.path().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      if (id < 0) {
        take_hdf5_errors();
        io.fail(fmt::format("HDF5 cannot open it\nHDF5 error stack:\n{}", swmr_errors),
                "the file may be truncated or damaged; or its writer has not finished a step yet (the tables are "
                "created at the first step end): if that run is still going, try again");
      }
    }
    file = File(id);
    io.set_call_hint(kDamageHint);

    read_root_attributes();
    for (int t = 0; t < kTableCount; ++t) open_table(static_cast<Table>(t));
    const std::string hist = table_path(Table::histograms);
    const hid_t histograms = datasets[index_of(Table::histograms)].get();
    for (auto [name, expected] : {std::pair{"min_exponent", kHistMinExponent}, std::pair{"max_exponent", kHistMaxExponent}}) {
      const std::optional<std::int64_t> value = read_int_attribute(io, histograms, hist, name);
      if (value && *value != expected) {
        io.fail(fmt::format("'{}' has {} = {}, but this build of ampscope uses {}", hist, name, *value, expected));
      }
    }
    refresh_rows();
  }

  std::string required_text(const char* name) {
    std::optional<std::string> v = read_text_attribute(io, file.get(), "/", name);
    if (!v) io.fail(fmt::format("the root attribute '{}' is missing", name));
    return *v;
  }

  std::int64_t required_int(const char* name) {
    std::optional<std::int64_t> v = read_int_attribute(io, file.get(), "/", name);
    if (!v) io.fail(fmt::format("the root attribute '{}' is missing", name));
    return *v;
  }

  void read_root_attributes() {
    const std::optional<std::string> format = read_text_attribute(io, file.get(), "/", "format");
    if (!format) {
      io.fail("not an ampscope trace: the root attribute 'format' is missing",
              fmt::format("an ampscope trace has the root attribute format = \"{}\"", kFormat));
    }
    if (*format != kFormat) {
      io.fail(fmt::format("not an ampscope trace: the root attribute 'format' is \"{}\", expected \"{}\"", *format, kFormat));
    }
    version = required_int("format_version");
    if (version > kFormatVersion) {
      io.fail(fmt::format("its format_version is {}, newer than this build of ampscope reads (format_version {})", version,
                          kFormatVersion),
              "read it with a newer ampscope");
    }
    if (version < 1) io.fail(fmt::format("its format_version is {}, which is not valid (versions start at 1)", version));
    info.precision = required_text("precision");
    info.device = required_text("device");
    info.model = required_text("model");
    info.seed = required_int("seed");
    info.config = required_text("config");
    complete = required_int("complete") == 1;
  }

  void open_table(Table table) {
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    if (io.check(H5Lexists(file.get(), where.c_str(), H5P_DEFAULT), "H5Lexists", where) <= 0) {
      io.fail(fmt::format("the dataset '{}' is missing", where));
    }
    datasets[t] = Dataset(io.check(H5Dopen2(file.get(), where.c_str(), H5P_DEFAULT), "H5Dopen2", where));
    types[t] = record_type(io, table);
    Dataspace space(io.check(H5Dget_space(datasets[t].get()), "H5Dget_space", where));
    const int rank = io.check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", where);
    if (rank != 1) io.fail(fmt::format("the dataset '{}' has {} dimensions, expected 1", where, rank));
    Datatype file_type(io.check(H5Dget_type(datasets[t].get()), "H5Dget_type", where));
    const H5T_class_t expected = H5Tget_class(types[t].get());
    const H5T_class_t actual = io.check(H5Tget_class(file_type.get()), "H5Tget_class", where);
    if (actual != expected) {
      io.fail(fmt::format("the dataset '{}' holds {}, expected {}", where, actual == H5T_COMPOUND ? "records" : "plain values",
                          expected == H5T_COMPOUND ? "records" : "plain values"));
    }
    if (expected != H5T_COMPOUND) return;
    // HDF5 matches fields by name when the types differ; every field we read must be there.
    const int members = io.check(H5Tget_nmembers(types[t].get()), "H5Tget_nmembers", where);
    for (int m = 0; m < members; ++m) {
      char* name = H5Tget_member_name(types[t].get(), static_cast<unsigned>(m));
      const std::string field = name ? name : "?";
      H5free_memory(name);
      if (H5Tget_member_index(file_type.get(), field.c_str()) < 0) {
        take_hdf5_errors();
        io.fail(fmt::format("the dataset '{}' has no field '{}'", where, field));
      }
    }
  }

  std::int64_t extent(Table table) {
    const std::string where = table_path(table);
    Dataspace space(io.check(H5Dget_space(datasets[index_of(table)].get()), "H5Dget_space", where));
    hsize_t size = 0;
    io.check(H5Sget_simple_extent_dims(space.get(), &size, nullptr), "H5Sget_simple_extent_dims", where);
    return static_cast<std::int64_t>(size);
  }

  void refresh_dataset(Table table) {
    if (swmr) io.check(H5Drefresh(datasets[index_of(table)].get()), "H5Drefresh", table_path(table));
  }

  // Trusts, per table, the rows counted by the last complete row of /index.
  void refresh_rows() {
    refresh_dataset(Table::index);
    const std::int64_t n = extent(Table::index);
    IndexRecord last{};
    last_step.reset();
    if (n > 0) {
      const std::int64_t first = std::max<std::int64_t>(0, n - 2);
      std::vector<IndexRecord> tail = read_records<IndexRecord>(Table::index, first, n - first);
      last = tail.back();
      // A reader can see /index grow before its newest row's bytes: such a row reads as zeros.
      if (tail.size() == 2) {
        for (int t = 0; t < kDataTableCount; ++t) {
          if (tail[1].rows[t] < tail[0].rows[t]) last = tail[0];
        }
      }
      last_step = std::int64_t{last.step};
    }
    for (int t = 0; t < kDataTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      refresh_dataset(table);
      const std::int64_t size = extent(table);
      if (last.rows[t] < 0) io.fail(fmt::format("'/index' gives {} a negative row count", table_path(table)), kDamageHint);
      rows[t] = std::min(last.rows[t], size);
      if (static_cast<std::int64_t>(step_column[t].size()) > rows[t]) step_column[t].resize(static_cast<std::size_t>(rows[t]));
    }
  }

  void refresh() {
    if (!swmr || complete) return;
    // The root group's header holds `complete`; refreshing it drops the cached copy.
    Group root(io.check(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2", "/"));
    io.check(H5Orefresh(root.get()), "H5Orefresh", "/");
    complete = required_int("complete") == 1;
    refresh_rows();
  }

  template <class Record>
  std::vector<Record> read_records(Table table, std::int64_t start, std::int64_t count) {
    std::vector<Record> records(static_cast<std::size_t>(count));
    if (count == 0) return records;
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    const hsize_t first = static_cast<hsize_t>(start), n = static_cast<hsize_t>(count);
    Dataspace file_space(io.check(H5Dget_space(datasets[t].get()), "H5Dget_space", where));
    io.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &first, nullptr, &n, nullptr), "H5Sselect_hyperslab", where);
    Dataspace memory_space(io.check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple", where));
    io.check(H5Dread(datasets[t].get(), types[t].get(), memory_space.get(), file_space.get(), H5P_DEFAULT, records.data()),
             "H5Dread", where);
    return records;
  }

  // The step of every trusted row of a table, read once (only the `step` field) and extended as it grows.
  const std::vector<std::int64_t>& steps_of(Table table) {
    const std::size_t t = index_of(table);
    std::vector<std::int64_t>& column = step_column[t];
    const std::int64_t have = static_cast<std::int64_t>(column.size());
    if (have >= rows[t]) return column;
    const std::string where = table_path(table);
    Datatype step_only(io.check(H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t)), "H5Tcreate", where));
    io.check(H5Tinsert(step_only.get(), "step", 0, H5T_NATIVE_INT64), "H5Tinsert", where);
    const hsize_t first = static_cast<hsize_t>(have), n = static_cast<hsize_t>(rows[t] - have);
    column.resize(static_cast<std::size_t>(rows[t]));
    Dataspace file_space(io.check(H5Dget_space(datasets[t].get()), "H5Dget_space", where));
    io.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &first, nullptr, &n, nullptr), "H5Sselect_hyperslab", where);
    Dataspace memory_space(io.check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple", where));
    const herr_t status = H5Dread(datasets[t].get(), step_only.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                                  column.data() + have);
    if (status < 0) column.resize(static_cast<std::size_t>(have));
    io.check(status, "H5Dread", where);
    return column;
  }

  // Rows of `table` with begin <= step < end, decoded by `decode_block`, read a block at a time.
  template <class Record, class Row, class Decode>
  std::vector<Row> read_rows(Table table, std::int64_t begin, std::int64_t end, Decode decode_block) {
    const std::vector<std::int64_t>& steps = steps_of(table);
    std::vector<Row> out;
    std::size_t i = 0;
    while (i < steps.size()) {
      if (steps[i] < begin || steps[i] >= end) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < steps.size() && j - i < kReadBlockRows && steps[j] >= begin && steps[j] < end) ++j;
      const std::vector<Record> records =
          read_records<Record>(table, static_cast<std::int64_t>(i), static_cast<std::int64_t>(j - i));
      decode_block(records, static_cast<std::int64_t>(i), out);
      i = j;
    }
    return out;
  }

  template <class Record, class Row>
  std::vector<Row> read_plain(Table table, std::int64_t begin, std::int64_t end) {
    return read_rows<Record, Row>(table, begin, end, [&](const std::vector<Record>& records, std::int64_t first, std::vector<Row>& out) {
      for (std::size_t k = 0; k < records.size(); ++k) {
        try {
          out.push_back(decode(records[k]));
        } catch (const std::invalid_argument& e) {  // an unknown phase name
          io.fail(fmt::format("row {} of '{}': {}", first + static_cast<std::int64_t>(k), table_path(table), e.what()), kDamageHint);
        }
      }
    });
  }

  std::vector<DumpRow> read_dumps(std::int64_t begin, std::int64_t end) {
    const std::int64_t values = rows[index_of(Table::dump_values)];
    return read_rows<DumpRecord, DumpRow>(Table::dumps, begin, end,
                                          [&](const std::vector<DumpRecord>& records, std::int64_t first, std::vector<DumpRow>& out) {
      for (std::size_t k = 0; k < records.size(); ++k) {
        const DumpRecord& r = records[k];
        const std::int64_t offset = r.values_offset, count = r.values_count;
        if (offset < 0 || count < 0 || offset > values || count > values - offset) {
          io.fail(fmt::format("row {} of '/dumps' points at values [{}, {}) of '/dump_values', which has {} values",
                              first + static_cast<std::int64_t>(k), offset, offset + count, values),
                  kDamageHint);
        }
        DumpRow row = decode(r);
        row.values = read_records<double>(Table::dump_values, offset, count);
        out.push_back(std::move(row));
      }
    });
  }
};

TraceReader::TraceReader(const std::filesystem::path& path) : state_(std::make_unique<State>(path)) {
  const QuietHdf5Errors quiet;
  state_->open();
}

TraceReader::~TraceReader() = default;
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;

const std::filesystem::path& TraceReader::path() const { return state_->path; }
const RunInfo& TraceReader::run_info() const { return state_->info; }
std::int64_t TraceReader::format_version() const { return state_->version; }
bool TraceReader::complete() const { return state_->complete; }
std::optional<std::int64_t> TraceReader::last_flushed_step() const { return state_->last_step; }

RowCounts TraceReader::row_counts() const {
  const auto& r = state_->rows;
  return {r[index_of(Table::steps)], r[index_of(Table::ops)],        r[index_of(Table::grads)],
          r[index_of(Table::events)], r[index_of(Table::histograms)], r[index_of(Table::dumps)]};
}

void TraceReader::refresh() {
  const QuietHdf5Errors quiet;
  state_->refresh();
}

std::vector<StepRow> TraceReader::steps(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_plain<StepRecord, StepRow>(Table::steps, begin, end);
}

std::vector<OpRow> TraceReader::ops(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_plain<OpRecord, OpRow>(Table::ops, begin, end);
}

std::vector<GradRow> TraceReader::grads(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_plain<GradRecord, GradRow>(Table::grads, begin, end);
}

std::vector<EventRow> TraceReader::events(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_plain<EventRecord, EventRow>(Table::events, begin, end);
}

std::vector<HistogramRow> TraceReader::histograms(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_plain<HistogramRecord, HistogramRow>(Table::histograms, begin, end);
}

std::vector<DumpRow> TraceReader::dumps(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_dumps(begin, end);
}

}  // namespace ampscope::trace
