// The trace reader. It opens every trace with SWMR read access first: that is what works on a file being
// written and on one whose writer was killed (whose superblock still says "open for writing", so a plain
// open fails; we never clear that flag, as h5clear would, since the file is the user's). Files that do
// not support SWMR (not written by ampscope) are opened plainly, to say what they are.
//
// How many rows of each table to trust comes from the last row of /index, which the writer appends
// after flushing all tables: rows past it may be half-written by a killed writer.
//
// Rows are selected by step through a step index: the runs of equal steps in each table's row order.
// /index cannot give it: rows need not be written in step order (the probe's flight recorder writes
// the history of an anomalous step after the end_step of the steps it holds, and rows outside steps
// say step -1), so the index is built from the rows' own `step` fields, read once per row. A complete trace
// whose writer saw a table's rows come in step order says so (the table's attribute steps_ascending = 1): that
// table's rows of a range of steps are then found by binary search on `step`, reading a few chunks, where the
// index reads every chunk (4.8 s at 100M op rows: the viewer's first step waited for it; issue 37). The rows
// read that way are checked to lie in the range asked, since the attribute comes with the file.
//
// Chunks stored with exactly the writer's pipeline (shuffle, then deflate, of our record type) are read
// as stored bytes (H5Dread_chunk) and decoded here: inflated on up to two threads with the SSE2
// Adler-32 and transpose of trace_codec.h, where HDF5's filters run byte by byte; every HDF5 call stays
// on the calling thread. The step index then needs only each chunk's first 8 byte columns (the `step`
// field, first in every record): 8 of an /ops record's 209 bytes (477 in format_version 3). Everything else goes through
// H5Dread: a file rewritten by h5repack or h5py with other filters or types, a chunk with a filter
// skipped, a chunk whose bytes do not decode (HDF5 then says what is wrong), and, in a trace still being
// written, the chunk holding the last trusted row, which the writer may rewrite (and move) at any time.
//
// Texts (format_version 4) are ids into /strings: the trusted rows of /strings and bytes of /string_bytes
// are loaded through H5Dread when rows first need them (and extended after a refresh), each entry checked
// once (inside the bytes, CRC-32, UTF-8); decoding threads then share the table read-only. Versions 1 to
// 3 are read with their fixed-width records (trace_layout_v3.h). /precision and /updates came with format_version 5:
// older traces have none, and read as traces without precision or update rows. /checksums and the /grads field
// before_all_reduce came with 6: older traces read as having no checksums and no rows before an all-reduce (their
// /grads records are read through H5Dread into zeroed records, so the absent field is 0).
// /precision's phase came with 6 too: format 5 rows are read with their own record (PrecisionRecordV5) as forward rows.
// /blocks came with 8: older traces have no block-scaled rows.
// /fp8 came with 7: older traces have no FP8 rows. Its fields from dynamic_range on are optional (the first format 7
// traces lack them): such rows read with Fp8Row's "not recorded" values, through H5Dread into blank records.
#include "probes/trace/reader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <stdexcept>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/io/json_limits.h"

#include "probes/trace/codec.h"
#include "probes/trace/hdf5_io.h"
#include "probes/trace/layout.h"
#include "probes/trace/layout_v3.h"
#include "probes/trace/writer.h"

namespace ampscope::trace {

using namespace detail;

namespace {

constexpr std::size_t kReadBlockRows = 8192;  // rows read (and decoded) per H5Dread
constexpr std::size_t kBatchChunks = 64;       // stored chunks held at once by a direct read
constexpr const char* kDamageHint =
    "the file may be truncated or damaged; if the run that writes it is still going, try again";

std::size_t index_of(Table t) { return static_cast<std::size_t>(t); }

// Consecutive rows [first, last) of one step.
struct StepRun {
  std::int64_t step, first, last;
};

// Rows [first, last) of one chunk, to go to out[out] onwards.
struct Piece {
  std::int64_t first, last;
  std::size_t out;
};

// One chunk of a direct read: its stored bytes and the pieces wanted from it.
struct ChunkJob {
  std::int64_t chunk = 0;
  std::size_t pieces_begin = 0, pieces_end = 0;
  std::vector<std::byte> stored;
  bool direct = false;  // stored holds the chunk's bytes, all filters applied
  bool failed = false;  // they did not decode: read the pieces with H5Dread
};

// What a decoding thread keeps between chunks.
struct Worker {
  std::unique_ptr<ChunkDecoder> decoder;
  std::vector<std::byte> records;  // a chunk's records, unshuffled
};

// Decodes one record into `row`, its texts from `strings` (format_version 4); false (with the message)
// on an unknown phase name or a text id that is not a sound row of /strings.
template <class Record, class Row>
bool decode_into(const Record& record, const StringTable& strings, Row& row, std::string& error, const OpTexts& texts) {
  try {
    if constexpr (requires { decode(record, strings, row, texts); }) {
      decode(record, strings, row, texts);  // in place: the row's strings keep their memory
    } else if constexpr (requires { decode(record, strings); }) {
      row = decode(record, strings);
    } else {
      row = decode(record);
    }
    return true;
  } catch (const std::invalid_argument& e) {
    error = e.what();
    return false;
  }
}

// A damaged text for a message: at most 60 characters, bytes outside printable ASCII escaped.
std::string printable(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size() && i < 60; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out += c >= 0x20 && c < 0x7F ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  if (text.size() > 60) out += "...";
  return out;
}

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
  // The step index: runs of rows [0, indexed) of each table.
  std::array<std::vector<StepRun>, kDataTableCount> runs;
  std::array<std::int64_t, kDataTableCount> indexed{};
  // Tables of a complete trace whose writer wrote every row in step order (the attribute steps_ascending = 1):
  // a step's rows are found by binary search, reading a few chunks, instead of through the index of every row.
  std::array<bool, kDataTableCount> ascending{};
  // The steps of the chunk the binary search read last, per table (chunk -1: none).
  struct Probe {
    std::int64_t chunk = -1;
    std::vector<std::int64_t> steps;
  };
  std::array<Probe, kDataTableCount> probes;
  // Rows per chunk of the tables whose chunks we decode ourselves (0: H5Dread only).
  std::array<std::size_t, kDataTableCount> direct_rows{};
  std::array<std::array<Worker, 2>, kDataTableCount> workers;
  std::vector<std::byte> stored;  // a chunk's stored bytes, for the step index
  std::uint64_t file_size = 0;
  // Rows per chunk of every chunked table (0: not chunked), for the check that trusted rows are stored.
  std::array<std::size_t, kDataTableCount> chunk_rows{};
  std::array<std::int64_t, kDataTableCount> stored_checked{};  // rows whose chunks were found stored
  // Damage found that leaves the rest readable (TraceReader::damage): in the root attributes, and in
  // /index and the tables (recomputed at each refresh).
  std::vector<std::string> attribute_damage, index_damage;
  std::vector<ChunkJob> spare;    // stored-bytes buffers of the last direct read, reused
  // format_version 4: the texts of /strings rows [0, strings.size()), loaded when rows first need them
  // (and extended when a refresh trusts more rows); string_damage notes the damaged ones.
  StringTable strings;
  std::vector<std::string> string_damage;
  OpTexts op_texts;  // the /ops text fields the read under way decodes (TraceReader::ops)

  explicit State(const std::filesystem::path& p) : path(p), io(p.string(), "read") {}

  void open() {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      // "demo-fp16" for demo-fp16.h5 is the usual slip: name the file that is there.
      std::filesystem::path with_h5 = path;
      with_h5 += ".h5";
      io.fail("no such file", std::filesystem::exists(with_h5, ec) ? fmt::format("did you mean '{}'?", with_h5.string())
                                                                     : std::string("check the path"));
    }
    if (std::filesystem::is_directory(path, ec)) io.fail("it is a folder, not a trace file");
    // Only regular files this user may read (core/io/hdf5_support.h, shared with checkpoints): HDF5 would block
    // for ever on a FIFO and call an unreadable file "not an HDF5 file".
    if (const std::string reason = hdf5::unreadable_reason(io.path().c_str()); !reason.empty()) {
      io.fail(reason, "an ampscope trace is a regular HDF5 file written by ampscope train --out");
    }
    file_size = std::filesystem::file_size(path, ec);
    if (ec) io.fail(fmt::format("its size cannot be read: {}", ec.message()));
    if (file_size == 0) io.fail("the file is empty (not an HDF5 file)");
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
    // /index first: the tables opened after its last row was read hold at least the rows it counts.
    open_table(Table::index);
    const std::optional<IndexRecord> last = read_last_index();
    for (int t = 0; t < kDataTableCount; ++t) {
      if (has_table(static_cast<Table>(t), version)) open_table(static_cast<Table>(t));
    }
    const std::string hist = table_path(Table::histograms);
    const hid_t histograms = datasets[index_of(Table::histograms)].get();
    for (auto [name, expected] : {std::pair{"min_exponent", kHistMinExponent}, std::pair{"max_exponent", kHistMaxExponent}}) {
      const std::optional<std::int64_t> value = read_int_attribute(io, histograms, hist, name);
      if (value && *value != expected) {
        io.fail(fmt::format("'{}' has {} = {}, but this build of ampscope uses {}", hist, name, *value, expected));
      }
    }
    trust_rows(last, false);
    // Only a complete trace: its rows no longer change, and its writer wrote the attribute at its close.
    for (int t = 0; complete && t < kDataTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      if (!has_table(table, version) || !has_steps(table) || table == Table::dumps) continue;
      const std::optional<std::int64_t> value = read_int_attribute(io, datasets[t].get(), table_path(table), kStepsAscending);
      ascending[t] = value == 1;
    }
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
      io.fail(fmt::format("not an ampscope trace: the root attribute 'format' is \"{}\", expected \"{}\"", printable(*format),
                          kFormat));
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
    if (version >= 2) info.probe = required_text("probe");
    const std::int64_t complete_value = required_int("complete");
    if (version >= 3) {
      // Every byte of the attributes above, checked (HDF5 checksums only part of where it stores them).
      const std::int64_t stored = required_int("attributes_crc32");
      const std::int64_t actual = root_attributes_crc32(*format, version, info);
      if (stored != actual) {
        io.fail(fmt::format("the root attributes are damaged: their checksum attributes_crc32 is {}, their text gives {}",
                            stored, actual),
                kDamageHint);
      }
    }
    // Then their values, against the schema (docs/trace-format.md).
    for (const auto& [name, text] : {std::pair<const char*, const std::string*>{"precision", &info.precision},
                                     {"device", &info.device}, {"model", &info.model}, {"config", &info.config},
                                     {"probe", &info.probe}}) {
      if (!valid_utf8(*text)) io.fail(fmt::format("the root attribute '{}' is not valid UTF-8 text: damaged", name), kDamageHint);
    }
    // fp8 came with format_version 7, mxfp8 and nvfp4 with 8: in an older trace each is damage like any other
    // unknown name.
    const bool known_precision = info.precision == "fp32" || info.precision == "fp16" || info.precision == "bf16" ||
                                 (version >= 7 && info.precision == "fp8") ||
                                 (version >= 8 && (info.precision == "mxfp8" || info.precision == "nvfp4"));
    if (!known_precision) {
      io.fail(fmt::format("the root attribute 'precision' is \"{}\", not {}: damaged", printable(info.precision),
                          version >= 8   ? "fp32, fp16, bf16, fp8, mxfp8 or nvfp4"
                          : version >= 7 ? "fp32, fp16, bf16 or fp8"
                                         : "fp32, fp16 or bf16"),
              kDamageHint);
    }
    if (complete_value != 0 && complete_value != 1) {
      io.fail(fmt::format("the root attribute 'complete' is {}, not 0 or 1: damaged", complete_value), kDamageHint);
    }
    complete = complete_value == 1;
    // A config or probe description that is not JSON leaves the tables readable: a note, not an error
    // (older ampscope wrote a config with a bare nan in it). One nested deeper than any ampscope writes is
    // left out (its text emptied, with a note): whatever parses it later (the report, fix, the rank
    // comparison) would build a value that recursion over it (dump(), copies) cannot handle, a crash at
    // about 65,000 levels. Checked without building a value (core/io/json_limits.h).
    attribute_damage.clear();
    for (const auto& [name, text] : {std::pair<const char*, std::string*>{"config", &info.config}, {"probe", &info.probe}}) {
      if (text->empty()) continue;
      const auto problem = ampscope::detail::check_json(*text);
      if (problem && problem->too_deep) {
        attribute_damage.push_back(fmt::format("the root attribute '{}' is left out: its JSON {}", name, problem->what));
        text->clear();
      } else if (problem) {
        attribute_damage.push_back(fmt::format("the root attribute '{}' is not valid JSON", name));
      }
    }
  }

  void open_table(Table table) {
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    if (io.check(H5Lexists(file.get(), where.c_str(), H5P_DEFAULT), "H5Lexists", where) <= 0) {
      io.fail(fmt::format("the dataset '{}' is missing", where));
    }
    datasets[t] = Dataset(io.check(H5Dopen2(file.get(), where.c_str(), H5P_DEFAULT), "H5Dopen2", where));
    types[t] = record_type(io, table, version);
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
    if (t < kDataTableCount) {
      PropertyList dcpl(io.check(H5Dget_create_plist(datasets[t].get()), "H5Dget_create_plist", where));
      hsize_t chunk = 0;
      if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED && H5Pget_chunk(dcpl.get(), 1, &chunk) == 1) {
        chunk_rows[t] = static_cast<std::size_t>(chunk);
      }
      H5Eclear2(H5E_DEFAULT);
    }
    if (expected != H5T_COMPOUND) return;
    if (t < kDataTableCount) direct_rows[t] = direct_chunk_rows(table, file_type.get());
    // HDF5 matches fields by name when the types differ; every field we read must be there.
    const int members = io.check(H5Tget_nmembers(types[t].get()), "H5Tget_nmembers", where);
    for (int m = 0; m < members; ++m) {
      char* name = H5Tget_member_name(types[t].get(), static_cast<unsigned>(m));
      const std::string field = name ? name : "?";
      H5free_memory(name);
      if (H5Tget_member_index(file_type.get(), field.c_str()) < 0) {
        take_hdf5_errors();
        // Fields a version added are absent from older traces; their rows get the "unknown" value.
        if (version < 2 && table == Table::ops && field == "inputs") continue;
        if (version < 3 && table == Table::index && field == "crc32") continue;
        if (version < 6 && table == Table::grads && field == "before_all_reduce") continue;  // reads as 0
        // The optional /fp8 columns (format 7 traces written before them): "not recorded" (blank_record).
        if (table == Table::fp8 && std::ranges::find(kFp8OptionalFields, field) != std::end(kFp8OptionalFields)) continue;
        io.fail(fmt::format("the dataset '{}' has no field '{}'", where, field));
      }
    }
  }

  // Rows per chunk when the table's chunks can be decoded here: chunked, shuffle then deflate and no
  // other filter, and records of exactly our type (so bytes are fields, as the writer stores them).
  // 0 otherwise: h5repack, h5py and older layouts are read through H5Dread.
  std::size_t direct_chunk_rows(Table table, hid_t file_type) {
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    if (io.check(H5Tequal(file_type, types[t].get()), "H5Tequal", where) <= 0) return 0;
    PropertyList dcpl(io.check(H5Dget_create_plist(datasets[t].get()), "H5Dget_create_plist", where));
    if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return 0;
    hsize_t chunk = 0;
    if (H5Pget_chunk(dcpl.get(), 1, &chunk) != 1 || chunk == 0) return 0;
    if (io.check(H5Pget_nfilters(dcpl.get()), "H5Pget_nfilters", where) != 2) return 0;
    for (unsigned i = 0; i < 2; ++i) {
      unsigned flags = 0, values[8] = {};
      std::size_t count = 8;
      const H5Z_filter_t filter = io.check(H5Pget_filter2(dcpl.get(), i, &flags, &count, values, 0, nullptr, nullptr),
                                           "H5Pget_filter2", where);
      if (filter != (i == 0 ? H5Z_FILTER_SHUFFLE : H5Z_FILTER_DEFLATE)) return 0;
      // The shuffle's element size, set when the dataset was created: the record's.
      if (i == 0 && count >= 1 && values[0] != record_size(table, version)) return 0;
    }
    const std::size_t bytes = static_cast<std::size_t>(chunk) * record_size(table, version);
    if (bytes > (std::size_t{1} << 30)) return 0;
    return static_cast<std::size_t>(chunk);
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

  // Whether an /index row is intact: its checksum (format_version 3), else plausible values.
  bool index_row_intact(const IndexRecord& r) const {
    if (version >= 3) return r.crc32 == index_crc32(r, version);
    if (r.step < -1) return false;
    for (int t = 0; t < kDataTableCount; ++t) {
      if (r.rows[t] < 0) return false;
    }
    return true;
  }

  // Whether a writer holds the trace's lock ("<trace>.lock", flock'ed by TraceWriter while it writes; a
  // killed writer's lock is released with its process). Only then can a last /index row still be on its
  // way to the file.
  // The lock file came with the trace, from whoever sent it: writer_state() opens it only when it is a regular
  // file (lstat first, then O_NONBLOCK | O_NOFOLLOW), so a FIFO or a device planted there neither blocks nor is
  // read, and a link is not followed; anything else counts as no writer.
  bool writer_alive() const { return writer_state(io.path()).writing; }

  // The last intact row of /index that counts no fewer rows than the rows before it (nullopt when it has
  // none). Every row is read and checked; what is damaged becomes a note in index_damage. A last row of
  // zeros in an incomplete trace is a row its writer is still writing when the writer is alive; when no
  // writer holds the trace, nobody will finish it, and it is damage (a killed writer, or a file cut there).
  std::optional<IndexRecord> read_last_index() {
    std::optional<bool> alive;
    auto pending = [&] {
      if (!alive) alive = writer_alive();
      return *alive;
    };
    const std::int64_t n = extent(Table::index);
    last_step.reset();
    // /index is not compressed: each row it claims takes its bytes in the file.
    const std::uint64_t row_bytes = record_size(Table::index, version);
    if (static_cast<std::uint64_t>(n) > (file_size + 64 * row_bytes) / row_bytes) {
      io.fail(fmt::format("'/index' claims {} rows, more than the file ({} bytes) can hold: damaged", n, file_size), kDamageHint);
    }
    std::optional<IndexRecord> accepted;
    std::int64_t accepted_row = -1, bad = 0;
    std::string first_bad;
    auto note = [&](std::string text) {
      if (++bad == 1) first_bad = std::move(text);
    };
    for (std::int64_t first = 0; first < n; first += static_cast<std::int64_t>(kReadBlockRows)) {
      const std::int64_t count = std::min<std::int64_t>(n - first, static_cast<std::int64_t>(kReadBlockRows));
      const std::vector<IndexRecord> block = read_records<IndexRecord>(Table::index, first, count);
      for (std::int64_t k = 0; k < count; ++k) {
        const IndexRecord& r = block[static_cast<std::size_t>(k)];
        const std::int64_t row = first + k;
        if (!index_row_intact(r)) {
          // A reader can see /index grow before its newest row's bytes: such a row reads as zeros.
          const IndexRecord zero{};
          if (row == n - 1 && !complete && std::memcmp(&r, &zero, sizeof r) == 0) {
            if (pending()) continue;
            note(fmt::format("row {}: zeros, and no writer holds the trace to finish it", row));
            continue;
          }
          note(fmt::format("row {}: {}", row, version >= 3 ? "its checksum does not match" : "a negative step or row count"));
          continue;
        }
        if (accepted) {
          bool fewer = r.step < accepted->step;
          for (int t = 0; t < kDataTableCount; ++t) fewer = fewer || r.rows[t] < accepted->rows[t];
          if (fewer) {
            const IndexRecord zero{};
            if (row == n - 1 && !complete && std::memcmp(&r, &zero, sizeof r) == 0) {
              if (pending()) continue;
              note(fmt::format("row {}: zeros, and no writer holds the trace to finish it", row));
              continue;
            }
            note(fmt::format("row {}: fewer rows or an earlier step than row {}", row, accepted_row));
            continue;
          }
        }
        accepted = r;
        accepted_row = row;
      }
    }
    index_damage.clear();
    if (bad > 0) index_damage.push_back(fmt::format("{} of the {} rows of '/index' are damaged (first {})", bad, n, first_bad));
    if (accepted) last_step = std::int64_t{accepted->step};
    return accepted;
  }

  // Trusts, per table, the rows counted by `last`, checked against the tables: never more than a table
  // holds, every row of a complete trace (whose last /index row counts them all, unless /index is
  // damaged), only rows whose chunks are stored, and never more than the file could hold compressed.
  // Datasets just opened need no H5Drefresh, and must
  // not get one: when the process has the same file open twice (`ampscope diff a.h5 a.h5`), HDF5 1.10
  // shares the dataset between the handles, and an H5Drefresh through the second breaks the chunk
  // lookups of both (a read of /index chunk 15 then returns chunk 0).
  void trust_rows(const std::optional<IndexRecord>& last, bool refresh_datasets) {
    // zlib's deflate expands at most 1032 times (a long run of one byte); shuffle does not change that.
    constexpr std::uint64_t kMaxExpansion = 1100;
    std::vector<std::string> recounted;  // tables of a complete trace that /index undercounts
    for (int t = 0; t < kDataTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      const std::string where = table_path(table);
      if (!has_table(table, version)) continue;
      if (refresh_datasets) refresh_dataset(table);
      const std::int64_t size = extent(table);
      std::int64_t want = last ? last->rows[t] : 0;
      if (want > size) {
        index_damage.push_back(fmt::format("'/index' counts {} rows of '{}', which holds {}: {} rows lost", want, where, size,
                                           want - size));
        want = size;
      } else if (complete && want < size) {
        // A complete trace's last /index row counts every row: /index is damaged, the table is whole.
        recounted.push_back(fmt::format("{} of {} rows of '{}'", want, size, where));
        want = size;
      }
      const std::uint64_t bytes = static_cast<std::uint64_t>(want) * record_size(table, version);
      if (static_cast<std::uint64_t>(want) > file_size * kMaxExpansion / record_size(table, version) + 1) {
        io.fail(fmt::format("'{}' claims {} {}s ({} bytes), more than a file of {} bytes can hold: damaged", where, want,
                            field_name(table), bytes, file_size),
                kDamageHint);
      }
      // Rows in chunks that were never written would read as zeros.
      if (chunk_rows[t] > 0 && want > 0) {
        const auto per = static_cast<std::int64_t>(chunk_rows[t]);
        // Chunks found stored stay stored (a refresh checks only the new ones).
        for (std::int64_t chunk = stored_checked[t] / per; chunk * per < want; ++chunk) {
          hsize_t offset = static_cast<hsize_t>(chunk * per), stored = 0;
          if (H5Dget_chunk_storage_size(datasets[t].get(), &offset, &stored) < 0 || stored == 0) {
            H5Eclear2(H5E_DEFAULT);
            index_damage.push_back(fmt::format("rows {} to {} of '{}' are counted but not stored: {} rows lost", chunk * per,
                                               want - 1, where, want - chunk * per));
            want = chunk * per;
            break;
          }
        }
      }
      rows[t] = want;
      // Whole chunks only: the writer rewrites a partly filled one.
      if (chunk_rows[t] > 0) {
        const auto per = static_cast<std::int64_t>(chunk_rows[t]);
        stored_checked[t] = std::max(stored_checked[t], want / per * per);
      }
      trim_index(static_cast<std::size_t>(t));
    }
    if (!recounted.empty()) {
      index_damage.push_back(fmt::format("the last intact row of '/index' does not count every row of this complete trace ({}): "
                                         "read every row the tables hold",
                                         fmt::join(recounted, ", ")));
    }
  }

  void refresh() {
    if (!swmr || complete) return;
    // The root group's header holds `complete`; refreshing it drops the cached copy.
    Group root(io.check(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2", "/"));
    io.check(H5Orefresh(root.get()), "H5Orefresh", "/");
    complete = required_int("complete") == 1;
    refresh_dataset(Table::index);
    trust_rows(read_last_index(), true);
  }

  template <class Record>
  std::vector<Record> read_records(Table table, std::int64_t start, std::int64_t count) {
    std::vector<Record> records(static_cast<std::size_t>(count));
    read_records_into(table, start, count, records.data());
    return records;
  }

  // Rows [start, start + count) through H5Dread, converted to `type` (the table's record type unless
  // given): HDF5's filters, whatever they are.
  void read_records_into(Table table, std::int64_t start, std::int64_t count, void* records, hid_t type = -1) {
    if (count == 0) return;
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    const hsize_t first = static_cast<hsize_t>(start), n = static_cast<hsize_t>(count);
    Dataspace file_space(io.check(H5Dget_space(datasets[t].get()), "H5Dget_space", where));
    io.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &first, nullptr, &n, nullptr), "H5Sselect_hyperslab", where);
    Dataspace memory_space(io.check(H5Screate_simple(1, &n, nullptr), "H5Screate_simple", where));
    io.check(H5Dread(datasets[t].get(), type >= 0 ? type : types[t].get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                     records),
             "H5Dread", where);
  }

  // --- the step index ---

  // Appends the steps of rows [indexed, indexed + count) to the runs.
  void append_steps(std::size_t t, const std::int64_t* steps, std::int64_t count) {
    std::vector<StepRun>& r = runs[t];
    std::int64_t row = indexed[t];
    for (std::int64_t i = 0; i < count; ++i, ++row) {
      if (steps[i] < -1) fail_row(static_cast<Table>(t), row, fmt::format("its step is {}, not a step (-1 or more)", steps[i]));
      if (!r.empty() && r.back().step == steps[i] && r.back().last == row) {
        ++r.back().last;
      } else {
        r.push_back({steps[i], row, row + 1});
      }
    }
    indexed[t] = row;
  }

  // Forgets rows past the trusted ones (a refresh never shrinks them, but the index must not outlive them).
  void trim_index(std::size_t t) {
    if (indexed[t] <= rows[t]) return;
    std::vector<StepRun>& r = runs[t];
    while (!r.empty() && r.back().first >= rows[t]) r.pop_back();
    if (!r.empty()) r.back().last = std::min(r.back().last, rows[t]);
    indexed[t] = rows[t];
  }

  // The `step` field of rows [start, start + count) through H5Dread.
  void read_steps(Table table, std::int64_t start, std::int64_t count, std::int64_t* steps) {
    const std::string where = table_path(table);
    Datatype step_only(io.check(H5Tcreate(H5T_COMPOUND, sizeof(std::int64_t)), "H5Tcreate", where));
    io.check(H5Tinsert(step_only.get(), "step", 0, H5T_NATIVE_INT64), "H5Tinsert", where);
    read_records_into(table, start, count, steps, step_only.get());
  }

  // Whether chunk `chunk` of table t has its final bytes: the writer rewrites a chunk at step ends until
  // it is full, so in a trace still being written (or killed) the chunk of the last trusted row may change,
  // and move, between two HDF5 calls. HDF5 reads that one.
  bool settled(std::size_t t, std::int64_t chunk) const {
    const auto chunk_rows = static_cast<std::int64_t>(direct_rows[t]);
    return complete || !swmr || (chunk + 1) * chunk_rows <= rows[t];
  }

  // The stored bytes of a chunk into `bytes`: false when they cannot be had with all filters applied.
  bool read_stored_chunk(std::size_t t, std::int64_t chunk, std::vector<std::byte>& bytes) {
    const hid_t dataset = datasets[t].get();
    hsize_t offset = static_cast<hsize_t>(chunk) * direct_rows[t], size = 0;
    if (H5Dget_chunk_storage_size(dataset, &offset, &size) < 0 || size == 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    bytes.resize(static_cast<std::size_t>(size));
    std::uint32_t skipped = 0;
    if (H5Dread_chunk(dataset, H5P_DEFAULT, &offset, &skipped, bytes.data()) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    return skipped == 0;  // a bit per filter HDF5 skipped when it wrote the chunk
  }

  Worker& worker(std::size_t t, std::size_t k) {
    Worker& w = workers[t][k];
    if (!w.decoder) {
      w.decoder = std::make_unique<ChunkDecoder>(record_size(static_cast<Table>(t), version), direct_rows[t]);
      w.records.resize(direct_rows[t] * record_size(static_cast<Table>(t), version));
    }
    return w;
  }

  // The `step` field of rows [first, last) of chunk `chunk` of table t (a table we decode ourselves) into
  // steps: from the chunk's leading byte columns when its stored bytes inflate, else through H5Dread.
  void chunk_steps(Table table, std::int64_t chunk, std::int64_t first, std::int64_t last, std::int64_t* steps) {
    const std::size_t t = index_of(table);
    const std::int64_t origin = chunk * static_cast<std::int64_t>(direct_rows[t]);
    ChunkDecoder& decoder = *worker(t, 0).decoder;
    if (settled(t, chunk) && read_stored_chunk(t, chunk, stored) &&
        decoder.inflate_prefix(stored.data(), stored.size(), sizeof(std::int64_t) * direct_rows[t])) {
      // Byte b of row i's step is at shuffled[b * chunk_rows + i].
      const std::byte* columns = decoder.shuffled();
      for (std::int64_t i = first; i < last; ++i) {
        std::uint64_t value = 0;
        for (std::size_t b = 0; b < sizeof value; ++b) {
          value |= std::to_integer<std::uint64_t>(columns[b * direct_rows[t] + static_cast<std::size_t>(i - origin)]) << (8 * b);
        }
        steps[i - first] = static_cast<std::int64_t>(value);
      }
    } else {
      read_steps(table, first, last - first, steps);
    }
  }

  // Extends the step index of table t to its trusted rows.
  void index_steps(Table table) {
    const std::size_t t = index_of(table);
    const std::int64_t want = rows[t];
    if (indexed[t] >= want) return;
    std::vector<std::int64_t> steps;
    if (direct_rows[t] == 0) {
      steps.resize(static_cast<std::size_t>(want - indexed[t]));
      read_steps(table, indexed[t], want - indexed[t], steps.data());
      append_steps(t, steps.data(), want - indexed[t]);
      return;
    }
    const auto chunk_rows = static_cast<std::int64_t>(direct_rows[t]);
    steps.resize(direct_rows[t]);
    for (std::int64_t chunk = indexed[t] / chunk_rows; indexed[t] < want; ++chunk) {
      const std::int64_t origin = chunk * chunk_rows, first = indexed[t], last = std::min(want, origin + chunk_rows);
      chunk_steps(table, chunk, first, last, steps.data());
      append_steps(t, steps.data(), last - first);
    }
  }

  // The step of row `row` of table t (a trusted row), for the binary search: its chunk's steps are read once
  // and kept, since the search's last probes fall in one chunk.
  std::int64_t step_at(Table table, std::int64_t row) {
    const std::size_t t = index_of(table);
    std::int64_t step = 0;
    if (direct_rows[t] == 0) {
      read_steps(table, row, 1, &step);
    } else {
      const auto chunk_rows = static_cast<std::int64_t>(direct_rows[t]);
      const std::int64_t chunk = row / chunk_rows, origin = chunk * chunk_rows;
      Probe& p = probes[t];
      if (p.chunk != chunk) {
        const std::int64_t last = std::min(rows[t], origin + chunk_rows);
        p.chunk = -1;  // until its steps are in
        p.steps.resize(static_cast<std::size_t>(last - origin));
        chunk_steps(table, chunk, origin, last, p.steps.data());
        p.chunk = chunk;
      }
      step = p.steps[static_cast<std::size_t>(row - origin)];
    }
    if (step < -1) fail_row(table, row, fmt::format("its step is {}, not a step (-1 or more)", step));
    return step;
  }

  // The first row of table t whose step is `step` or more (its rows in step order: `ascending`).
  std::int64_t first_row_from(Table table, std::int64_t step) {
    std::int64_t low = 0, high = rows[index_of(table)];
    while (low < high) {
      const std::int64_t mid = low + (high - low) / 2;
      if (step_at(table, mid) < step) {
        low = mid + 1;
      } else {
        high = mid;
      }
    }
    return low;
  }

  // The rows of an `ascending` table read for [begin, end) must have steps in it: the attribute that let the
  // binary search find them is a file's word, from whoever sent it, and a damaged one is refused here.
  template <class Row>
  void check_ascending(Table table, std::int64_t first, std::span<const Row> rows_read, std::int64_t begin, std::int64_t end) {
    for (std::size_t i = 0; i < rows_read.size(); ++i) {
      const std::int64_t step = rows_read[i].step;
      if (step < begin || step >= end) {
        fail_row(table, first + static_cast<std::int64_t>(i),
                 fmt::format("its step is {}, out of step order: the table's attribute '{}' = 1 says its rows are in step "
                             "order, and they are not (damaged)",
                             step, kStepsAscending));
      }
    }
  }

  // Rows of table t with begin <= step < end, as ranges in row order.
  std::vector<std::pair<std::int64_t, std::int64_t>> row_ranges(Table table, std::int64_t begin, std::int64_t end) {
    if (ascending[index_of(table)]) {
      const std::int64_t first = begin == kFirstStep ? 0 : first_row_from(table, begin);
      const std::int64_t last = first_row_from(table, end);
      if (first >= last) return {};
      return {{first, last}};
    }
    index_steps(table);
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (const StepRun& run : runs[index_of(table)]) {
      if (run.step < begin || run.step >= end) continue;
      if (!ranges.empty() && ranges.back().second == run.first) {
        ranges.back().second = run.last;
      } else {
        ranges.emplace_back(run.first, run.last);
      }
    }
    return ranges;
  }

  [[noreturn]] void fail_row(Table table, std::int64_t row, const std::string& error) {
    io.fail(fmt::format("row {} of '{}': {}", row, table_path(table), error), kDamageHint);
  }

  // --- reading rows ---

  // Rows [first, last) through H5Dread, decoded into out[at] onwards.
  template <class Record, class Row>
  void read_through_hdf5(Table table, std::int64_t first, std::int64_t last, std::vector<Row>& out, std::size_t at,
                         std::vector<Record>& buffer) {
    std::string error;
    while (first < last) {
      const std::int64_t n = std::min<std::int64_t>(last - first, static_cast<std::int64_t>(kReadBlockRows));
      // Zeroed (a field an older version lacks reads as 0), but for the optional /fp8 fields (blank_record).
      buffer.assign(static_cast<std::size_t>(n), blank_record<Record>());
      read_records_into(table, first, n, buffer.data());
      for (std::int64_t k = 0; k < n; ++k) {
        if (!decode_into(buffer[static_cast<std::size_t>(k)], strings, out[at++], error, op_texts)) fail_row(table, first + k, error);
      }
      first += n;
    }
  }

  // Inflates a chunk and decodes its pieces; marks it failed when its bytes do not decode. Runs on any
  // thread: no HDF5 here.
  template <class Record, class Row>
  void decode_chunk(Worker& w, std::size_t chunk_rows, ChunkJob& job, std::span<const Piece> pieces, std::vector<Row>& out,
                    std::int64_t& bad_row, std::string& error) {
    if (!w.decoder->inflate(job.stored.data(), job.stored.size())) {
      job.failed = true;
      return;
    }
    const std::int64_t origin = job.chunk * static_cast<std::int64_t>(chunk_rows);
    for (const Piece& p : pieces) {
      const auto count = static_cast<std::size_t>(p.last - p.first);
      w.decoder->unshuffle(static_cast<std::size_t>(p.first - origin), count, w.records.data());
      const auto* records = reinterpret_cast<const Record*>(w.records.data());
      for (std::size_t k = 0; k < count; ++k) {
        if (!decode_into(records[k], strings, out[p.out + k], error, op_texts)) {
          bad_row = p.first + static_cast<std::int64_t>(k);
          return;
        }
      }
    }
  }

  // The pieces of `jobs` decoded into `out`: the calling thread reads stored chunks (HDF5) while a
  // second thread starts inflating them, then both inflate and decode what is left.
  template <class Record, class Row>
  void run_batch(Table table, std::span<ChunkJob> jobs, const std::vector<Piece>& pieces, std::vector<Row>& out,
                 std::vector<Record>& buffer) {
    const std::size_t t = index_of(table);
    std::mutex mutex;
    std::condition_variable ready_cv;
    std::size_t ready = 0;  // jobs whose stored bytes were read
    std::atomic<std::size_t> next{0};
    struct Outcome {
      std::int64_t bad_row = -1;
      std::string error;
      std::exception_ptr exception;
    };
    std::array<Outcome, 2> outcomes;
    auto work = [&](std::size_t k) {
      Worker& w = workers[t][k];
      Outcome& o = outcomes[k];
      try {
        for (;;) {
          const std::size_t i = next.fetch_add(1);
          if (i >= jobs.size()) return;
          {
            std::unique_lock lock(mutex);
            ready_cv.wait(lock, [&] { return ready > i; });
          }
          ChunkJob& job = jobs[i];
          if (!job.direct) continue;
          decode_chunk<Record>(w, direct_rows[t], job, std::span(pieces).subspan(job.pieces_begin, job.pieces_end - job.pieces_begin),
                               out, o.bad_row, o.error);
          if (o.bad_row >= 0) return;
        }
      } catch (...) {
        o.exception = std::current_exception();
      }
    };
    worker(t, 0);
    const bool two = jobs.size() >= 2 && std::thread::hardware_concurrency() >= 2;
    if (two) worker(t, 1);
    std::thread helper;
    try {
      if (two) helper = std::thread(work, 1);
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        ChunkJob& job = jobs[i];
        job.failed = false;
        job.direct = settled(t, job.chunk) && read_stored_chunk(t, job.chunk, job.stored);
        {
          std::lock_guard lock(mutex);
          ready = i + 1;
        }
        ready_cv.notify_one();
      }
    } catch (...) {
      {
        std::lock_guard lock(mutex);
        ready = jobs.size();
      }
      ready_cv.notify_all();
      if (helper.joinable()) helper.join();
      throw;
    }
    work(0);
    if (helper.joinable()) helper.join();
    for (const Outcome& o : outcomes) {
      if (o.exception) std::rethrow_exception(o.exception);
    }
    // Chunks we could not decode go through HDF5, which decodes them or says what is wrong.
    for (ChunkJob& job : jobs) {
      if (job.direct && !job.failed) continue;
      for (std::size_t p = job.pieces_begin; p < job.pieces_end; ++p) {
        read_through_hdf5(table, pieces[p].first, pieces[p].last, out, pieces[p].out, buffer);
      }
    }
    std::int64_t bad_row = -1;
    std::string error;
    for (const Outcome& o : outcomes) {
      if (o.bad_row >= 0 && (bad_row < 0 || o.bad_row < bad_row)) {
        bad_row = o.bad_row;
        error = o.error;
      }
    }
    if (bad_row >= 0) fail_row(table, bad_row, error);
  }

  // Rows of `table` with begin <= step < end, in row order.
  template <class Record, class Row>
  std::vector<Row> read_plain(Table table, std::int64_t begin, std::int64_t end) {
    std::vector<Row> out;
    read_plain<Record, Row>(table, begin, end, out);
    return out;
  }

  // The same into `out`, replacing its rows: every row is assigned whole (decode_into), so the rows it held,
  // and its memory, are reused.
  template <class Record, class Row>
  void read_plain(Table table, std::int64_t begin, std::int64_t end, std::vector<Row>& out) {
    const auto ranges = row_ranges(table, begin, end);
    read_ranges<Record, Row>(table, ranges, out);
    if (ascending[index_of(table)] && !ranges.empty()) check_ascending<Row>(table, ranges.front().first, out, begin, end);
  }

  // Rows in `ranges` (in row order) into `out`, replacing its rows.
  template <class Record, class Row>
  void read_ranges(Table table, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges, std::vector<Row>& out) {
    const std::size_t t = index_of(table);
    std::size_t total = 0;
    for (const auto& [first, last] : ranges) total += static_cast<std::size_t>(last - first);
    out.resize(total);
    std::vector<Record> buffer;
    if (direct_rows[t] == 0) {
      std::size_t at = 0;
      for (const auto& [first, last] : ranges) {
        read_through_hdf5(table, first, last, out, at, buffer);
        at += static_cast<std::size_t>(last - first);
      }
      return;
    }
    // Split the ranges at chunk boundaries, a job per chunk, and decode a batch of chunks at a time.
    const auto chunk_rows = static_cast<std::int64_t>(direct_rows[t]);
    std::vector<ChunkJob> jobs;
    std::vector<Piece> pieces;
    std::size_t at = 0;
    auto flush = [&] {
      if (jobs.empty()) return;
      run_batch<Record, Row>(table, jobs, pieces, out, buffer);
      // Keep the stored-bytes buffers of the batch for the next one.
      std::vector<ChunkJob> keep(jobs.size());
      for (std::size_t i = 0; i < jobs.size(); ++i) keep[i].stored = std::move(jobs[i].stored);
      spare = std::move(keep);
      jobs.clear();
      pieces.clear();
    };
    for (auto [first, last] : ranges) {  // in row order: so are the jobs
      std::int64_t next_row = first;
      while (next_row < last) {
        const std::int64_t chunk = next_row / chunk_rows;
        const std::int64_t piece_last = std::min(last, (chunk + 1) * chunk_rows);
        if (jobs.empty() || jobs.back().chunk != chunk) {
          if (jobs.size() == kBatchChunks) flush();
          ChunkJob job;
          job.chunk = chunk;
          if (!spare.empty()) {
            job.stored = std::move(spare.back().stored);
            spare.pop_back();
          }
          job.pieces_begin = job.pieces_end = pieces.size();
          jobs.push_back(std::move(job));
        }
        pieces.push_back({next_row, piece_last, at});
        jobs.back().pieces_end = pieces.size();
        at += static_cast<std::size_t>(piece_last - next_row);
        next_row = piece_last;
      }
    }
    flush();
  }

  // format_version 4: loads the texts of the /strings rows trusted since the last call (every row read
  // refers only to texts flushed with or before it). A text whose entry is damaged is noted here and
  // refused when a row names it.
  void load_strings() {
    if (version < 4) return;
    const auto want = static_cast<std::size_t>(rows[index_of(Table::strings)]);
    if (strings.size() >= want) return;
    const auto held = static_cast<std::int64_t>(strings.bytes());
    const std::int64_t more = rows[index_of(Table::string_bytes)] - held;
    if (more > 0) {
      std::string bytes(static_cast<std::size_t>(more), '\0');
      read_records_into(Table::string_bytes, held, more, bytes.data());
      strings.append_bytes(bytes);
    }
    for (std::size_t first = strings.size(); first < want; first += kReadBlockRows) {
      const std::size_t n = std::min(want - first, kReadBlockRows);
      const std::vector<StringRecord> block =
          read_records<StringRecord>(Table::strings, static_cast<std::int64_t>(first), static_cast<std::int64_t>(n));
      strings.append(block.data(), block.size());
    }
    string_damage.clear();
    if (strings.damaged() > 0) {
      string_damage.push_back(fmt::format("{} of the {} strings of '/strings' are damaged (first {}); rows that name them "
                                          "cannot be read",
                                          strings.damaged(), strings.size(), strings.first_damage()));
    }
  }

  // Rows of a table with text fields: the v4 record with the string table, or the older fixed-text one.
  template <class Record, class LegacyRecord, class Row>
  std::vector<Row> read_text_rows(Table table, std::int64_t begin, std::int64_t end) {
    std::vector<Row> out;
    read_text_rows<Record, LegacyRecord, Row>(table, begin, end, out);
    return out;
  }
  template <class Record, class LegacyRecord, class Row>
  void read_text_rows(Table table, std::int64_t begin, std::int64_t end, std::vector<Row>& out) {
    if (version < 4) return read_plain<LegacyRecord, Row>(table, begin, end, out);
    load_strings();
    read_plain<Record, Row>(table, begin, end, out);
  }

  std::vector<DumpRow> read_dumps(std::int64_t begin, std::int64_t end) {
    if (version < 4) return read_dumps_as<v3::DumpRecord>(begin, end);
    load_strings();
    return read_dumps_as<DumpRecord>(begin, end);
  }

  template <class Record>
  std::vector<DumpRow> read_dumps_as(std::int64_t begin, std::int64_t end) {
    const std::int64_t values = rows[index_of(Table::dump_values)];
    std::vector<DumpRow> out;
    for (auto [first, last] : row_ranges(Table::dumps, begin, end)) {
      for (std::int64_t block = first; block < last; block += static_cast<std::int64_t>(kReadBlockRows)) {
        const std::int64_t n = std::min<std::int64_t>(last - block, static_cast<std::int64_t>(kReadBlockRows));
        const std::vector<Record> records = read_records<Record>(Table::dumps, block, n);
        for (std::size_t k = 0; k < records.size(); ++k) {
          const Record& r = records[k];
          const std::int64_t offset = r.values_offset, count = r.values_count;
          if (offset < 0 || count < 0 || offset > values || count > values - offset) {
            io.fail(fmt::format("row {} of '/dumps' points at values [{}, {}) of '/dump_values', which has {} values",
                                block + static_cast<std::int64_t>(k), offset, offset + count, values),
                    kDamageHint);
          }
          DumpRow row;
          std::string error;
          if (!decode_into(r, strings, row, error, OpTexts{})) fail_row(Table::dumps, block + static_cast<std::int64_t>(k), error);
          row.values = read_records<double>(Table::dump_values, offset, count);
          out.push_back(std::move(row));
        }
      }
    }
    return out;
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

std::vector<std::string> TraceReader::damage() const {
  std::vector<std::string> notes = state_->attribute_damage;
  notes.insert(notes.end(), state_->index_damage.begin(), state_->index_damage.end());
  notes.insert(notes.end(), state_->string_damage.begin(), state_->string_damage.end());
  return notes;
}

RowCounts TraceReader::row_counts() const {
  const auto& r = state_->rows;
  return {r[index_of(Table::steps)],  r[index_of(Table::ops)],        r[index_of(Table::grads)],
          r[index_of(Table::events)], r[index_of(Table::histograms)], r[index_of(Table::dumps)],
          r[index_of(Table::precision)], r[index_of(Table::updates)], r[index_of(Table::checksums)],
          r[index_of(Table::fp8)], r[index_of(Table::blocks)]};
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
  std::vector<OpRow> rows;
  ops(begin, end, rows);
  return rows;
}

void TraceReader::ops(std::int64_t begin, std::int64_t end, std::vector<OpRow>& rows) { ops(begin, end, rows, OpTexts{}); }

void TraceReader::ops(std::int64_t begin, std::int64_t end, std::vector<OpRow>& rows, const OpTexts& texts) {
  const QuietHdf5Errors quiet;
  state_->op_texts = texts;
  struct Restore {  // every other read decodes every text
    OpTexts& texts;
    ~Restore() { texts = OpTexts{}; }
  } restore{state_->op_texts};
  if (state_->version < 9) {  // absmax as it is; 9 stores absmax_xor
    state_->read_text_rows<OpRecordV8, v3::OpRecord, OpRow>(Table::ops, begin, end, rows);
  } else {
    state_->read_text_rows<OpRecord, v3::OpRecord, OpRow>(Table::ops, begin, end, rows);
  }
  if (state_->version < 2) {
    for (OpRow& row : rows) row.inputs.fill(kInputUnknown);  // format_version 1 has no provenance
  }
}

std::vector<GradRow> TraceReader::grads(std::int64_t begin, std::int64_t end, GradRows which) {
  const QuietHdf5Errors quiet;
  std::vector<GradRow> rows = state_->read_text_rows<GradRecord, v3::GradRecord, GradRow>(Table::grads, begin, end);
  if (which != GradRows::all) {
    const bool before = which == GradRows::before_all_reduce;
    std::erase_if(rows, [before](const GradRow& g) { return g.before_all_reduce != before; });
  }
  return rows;
}

std::vector<EventRow> TraceReader::events(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_text_rows<EventRecord, v3::EventRecord, EventRow>(Table::events, begin, end);
}

std::vector<HistogramRow> TraceReader::histograms(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_text_rows<HistogramRecord, v3::HistogramRecord, HistogramRow>(Table::histograms, begin, end);
}

std::vector<DumpRow> TraceReader::dumps(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  return state_->read_dumps(begin, end);
}

std::vector<PrecisionRow> TraceReader::precision(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  if (state_->version < 5) return {};  // the table came with format_version 5
  state_->load_strings();
  // format_version 5 has no phase: its rows are the forward twin's.
  if (state_->version < 6) return state_->read_plain<PrecisionRecordV5, PrecisionRow>(Table::precision, begin, end);
  return state_->read_plain<PrecisionRecord, PrecisionRow>(Table::precision, begin, end);
}

std::vector<UpdateRow> TraceReader::updates(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  if (state_->version < 5) return {};  // the table came with format_version 5
  state_->load_strings();
  return state_->read_plain<UpdateRecord, UpdateRow>(Table::updates, begin, end);
}

std::vector<ChecksumRow> TraceReader::checksums(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  if (state_->version < 6) return {};  // the table came with format_version 6
  state_->load_strings();
  return state_->read_plain<ChecksumRecord, ChecksumRow>(Table::checksums, begin, end);
}

std::vector<Fp8Row> TraceReader::fp8(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  if (state_->version < 7) return {};  // the table came with format_version 7
  state_->load_strings();
  return state_->read_plain<Fp8Record, Fp8Row>(Table::fp8, begin, end);
}

std::vector<BlockRow> TraceReader::blocks(std::int64_t begin, std::int64_t end) {
  const QuietHdf5Errors quiet;
  if (state_->version < 8) return {};  // the table came with format_version 8
  state_->load_strings();
  return state_->read_plain<BlockRecord, BlockRow>(Table::blocks, begin, end);
}

}  // namespace ampscope::trace
