// The trace writer: the caller's thread packs rows into one chunk buffer per table; compression threads
// turn chunks into the bytes HDF5's shuffle + deflate filters would store; the writer thread, the only
// one that calls HDF5 after the file is created, puts them into the file with H5Dwrite_chunk, in order.
// How the file stays readable and compact:
//  - Every dataset and attribute is created before H5Fstart_swmr_write (SWMR forbids creating objects
//    afterwards); `complete` is created as 0 and overwritten in place at close, which SWMR allows.
//  - A chunk filled between two step ends is compressed and written once. A step that ends inside a
//    chunk makes us compress and write the chunk's rows so far (the rest zeros, beyond the dataset's
//    extent), and again at each step end until it is full; so each step end costs compressing up to a
//    chunk. Chunks are therefore sized from the first step (about four steps' rows) unless the options
//    fix them, and the tables are created at the first step end. Where chunks are small (under 256 rows:
//    short steps), a partial chunk is coded by ChunkCodec alone in deflate's fixed codes when that fits in
//    the table's last full chunk's size (newest_full), which skips what zlib spent most of such a step end
//    on: building a block's Huffman codes and scanning the zeros of the rows still to come. Such a step end
//    (its chunks 64 KiB or less, whole) is compressed by the writer thread itself: the compression threads
//    are not woken for it (kWriterCompresses). All these threads can be made to run at a higher nice value than
//    the caller's (TraceWriterOptions::thread_nice, 0 by default), so that they work in the training threads' gaps.
//  - Under SWMR, HDF5 never reuses the space of a chunk that moves, so a rewritten chunk must keep its
//    size: its bytes are padded with zeros to a slot sized from earlier full chunks (the deflate stream
//    ends before the padding, and the decoder stops there). A chunk that outgrows its slot moves, and
//    its old slot is lost. (Storing unfinished chunks unshuffled, to compress each row only once, does
//    not work: HDF5 keeps a chunk's first filter mask when it rewrites the chunk in place.)
//  - A flush (end_step, flush, close) H5Dflush-es every dataset written since the last one, then appends
//    a row to /index with every table's row count and flushes that. Rows beyond the last /index row may
//    be half-written if the writer is killed; readers trust /index, so a killed trace shows whole steps.
//  - A write the file system refuses (a full disk) ends all writing, through our copy of HDF5's POSIX
//    driver (detail::write_access): the file stays as a kill would leave it, and HDF5 closes it cleanly.
#include "probes/trace/writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "probes/trace/codec.h"
#include "probes/trace/hdf5_io.h"
#include "probes/trace/layout.h"

namespace ampscope::trace {

using namespace detail;

namespace {

constexpr std::size_t kIndexChunk = 64;          // /index: a row per flush
constexpr std::size_t kMaxChunkBytes = 2 << 20;  // automatic chunks: at most this much raw data
// HDF5's metadata cache for the file, fixed at this size. Its default grows from 2 MiB up to 32 MiB: an
// appending writer never reads back the chunk index blocks of chunks it finished, but they stay cached
// until the cache is full, so the process grew about 12 bytes a step for tens of thousands of steps.
// What a step touches (object headers, the index blocks of the chunks being appended) takes 8 to 14 KiB
// in the traces of the samples, scenarios and --twin --probe full runs; HDF5 read nothing back at 32 KiB.
constexpr std::size_t kMetadataCacheBytes = 64 << 10;
// Flushes between two H5garbage_collect() calls: HDF5 keeps the blocks of evicted metadata in free lists
// of its own (up to 16 MiB by default) rather than giving them back.
constexpr std::uint64_t kFlushesPerCollect = 1024;

std::size_t index_of(Table t) { return static_cast<std::size_t>(t); }

using Totals = std::array<std::int64_t, kDataTableCount>;
using ChunkRows = std::array<std::size_t, kTableCount>;

// The most rows an automatic chunk of `table` may have: 1024 (deflate gains little beyond; 16384 for
// 8-byte dump values, 65536 for the bytes of texts), and at most 2 MiB. A first step with more rows
// makes the writer choose chunk sizes before it ends.
std::size_t max_automatic_rows(Table table) {
  const std::size_t most = table == Table::dump_values ? 16384 : table == Table::string_bytes ? 65536 : 1024;
  return std::min(most, std::bit_floor(kMaxChunkBytes / record_size(table)));
}

// Automatic chunk rows: about four first steps' worth, in multiples of 64, within limits. A step end
// recompresses the unfinished chunk, so its cost grows with the chunk; a chunk needs a few hundred rows
// to deflate well. Short steps (small models) get small chunks and cheap step ends.
std::size_t automatic_rows(Table table, std::size_t first_step_rows) {
  const std::size_t least = table == Table::dump_values ? 1024 : table == Table::string_bytes ? 4096 : 64;
  const std::size_t rows = (4 * std::max<std::size_t>(first_step_rows, 1) + 63) / 64 * 64;
  return std::clamp(rows, least, std::max(least, max_automatic_rows(table)));
}

// Chunk rows when the options fix them: chunk_rows for most tables, fewer for the 1 KiB histogram
// records and the tables that get a row per step, more for 8-byte dump values and the bytes of texts.
std::size_t fixed_rows(Table table, std::size_t chunk_rows) {
  switch (table) {
    case Table::steps: return std::min(chunk_rows, kIndexChunk);
    case Table::histograms: return std::max<std::size_t>(1, chunk_rows / 4);
    case Table::dump_values: return chunk_rows * 4;
    case Table::string_bytes: return chunk_rows * 32;
    default: return chunk_rows;
  }
}

// A unit of work for the writer thread, in the order the caller gave it: creating the tables, a chunk
// of one table (whole, or the rows so far at a step end), a flush, or the close.
struct Job {
  enum class Kind { create, chunk, flush, close };
  Kind kind = Kind::chunk;
  Table table = Table::steps;
  std::int64_t chunk = 0;           // chunk index in its table
  std::size_t rows = 0;             // records in the chunk so far
  std::vector<std::byte> records;   // rows * record_size(table) bytes
  std::vector<std::byte> stored;    // the chunk's bytes in the file, from a compression thread
  bool encoded = false;
  std::exception_ptr encode_error;
  std::size_t weight = 1;           // what the job counts against the queue's capacity
  ChunkRows chunks{};               // create: rows per chunk of each table
  std::int64_t step = -1;           // flush and close: the step recorded in /index
  Totals totals{};                  // flush and close: rows of each table so far
  bool complete = false;            // close: set the root attribute complete = 1
  std::array<bool, kDataTableCount> ascending{};  // close: tables whose rows came in step order
};

// The HDF5 file: created with its root attributes on the caller's thread, then used by the writer
// thread only.
class FileWriter {
 public:
  FileWriter(const std::filesystem::path& path, const RunInfo& info, int compression)
      : io_(path.string(), "write"), compression_(compression) {
    // A full disk (or any failed write) is then a clean error naming it, and leaves the file as it was.
    io_.watch(storage_);
    io_.set_call_hint("the trace holds no complete step");
    const QuietHdf5Errors quiet;
    PropertyList fapl = write_access(io_, storage_);
    io_.check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "H5Pset_libver_bounds", "/");
    // Memory that does not grow with the run (see kMetadataCacheBytes). Neither changes a byte of the file.
    H5AC_cache_config_t mdc{};
    mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    io_.check(H5Pget_mdc_config(fapl.get(), &mdc), "H5Pget_mdc_config", "/");
    mdc.set_initial_size = true;
    mdc.initial_size = mdc.min_size = mdc.max_size = kMetadataCacheBytes;
    mdc.incr_mode = H5C_incr__off;
    mdc.flash_incr_mode = H5C_flash_incr__off;
    mdc.decr_mode = H5C_decr__off;
    io_.check(H5Pset_mdc_config(fapl.get(), &mdc), "H5Pset_mdc_config", "/");
    // Every chunk bypasses the chunk cache (H5Dwrite_chunk, /index's too since issue 37); HDF5 may still cache a
    // chunk it reads: room for one /index chunk. The default (1 MiB) kept 146 finished /index chunks.
    io_.check(H5Pset_cache(fapl.get(), 0, 7, kIndexChunk * record_size(Table::index), 1.0), "H5Pset_cache", "/");
    file_ = File(io_.check(H5Fcreate(io_.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), "H5Fcreate", "/"));

    const hid_t root = file_.get();
    write_text_attribute(io_, root, "/", "format", kFormat);
    write_int_attribute(io_, root, "/", "format_version", kFormatVersion);
    write_text_attribute(io_, root, "/", "precision", info.precision);
    write_text_attribute(io_, root, "/", "device", info.device);
    write_text_attribute(io_, root, "/", "model", info.model);
    write_int_attribute(io_, root, "/", "seed", info.seed);
    write_text_attribute(io_, root, "/", "config", info.config);
    write_text_attribute(io_, root, "/", "probe", info.probe);
    write_int_attribute(io_, root, "/", "complete", 0);
    // format_version 3: a checksum over the attributes above (HDF5 checksums the object header, not the
    // large values it stores elsewhere), so that a reader detects a changed byte in any of them.
    write_int_attribute(io_, root, "/", "attributes_crc32", root_attributes_crc32(kFormat, kFormatVersion, info));
  }

  // Creates every table, then starts SWMR writing: from here on readers can follow the file.
  void create_tables(const ChunkRows& chunks) {
    chunks_ = chunks;
    for (int t = 0; t < kTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      // /index is tiny and written with H5Dwrite: uncompressed, so its chunk is rewritten in place.
      create_dataset(table, table == Table::index ? 0 : compression_);
    }
    for (int t = 0; t < kDataTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      if (!text_fields(table).empty()) {
        write_text_attribute(io_, datasets_[index_of(table)].get(), table_path(table), "text_fields", text_fields(table));
      }
      // 0 until the close says otherwise: SWMR cannot create an attribute later, only overwrite one.
      if (has_steps(table)) write_int_attribute(io_, datasets_[index_of(table)].get(), table_path(table), kStepsAscending, 0);
    }
    const std::string hist = table_path(Table::histograms);
    write_int_attribute(io_, datasets_[index_of(Table::histograms)].get(), hist, "min_exponent", kHistMinExponent);
    write_int_attribute(io_, datasets_[index_of(Table::histograms)].get(), hist, "max_exponent", kHistMaxExponent);
    io_.check(H5Fstart_swmr_write(file_.get()), "H5Fstart_swmr_write", "/");
  }

  // Stores chunk `chunk` of `table`, which holds `rows` records, as `stored` (padded here when the
  // chunk will be rewritten).
  void write_chunk(Table table, std::int64_t chunk, std::size_t rows, std::vector<std::byte>& stored) {
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    const hid_t dataset = datasets_[t].get();
    const std::size_t chunk_rows = chunks_[t];
    const hsize_t first = static_cast<hsize_t>(chunk) * chunk_rows;
    const hsize_t size = first + rows;
    if (size > extent_[t]) {
      io_.check(H5Dset_extent(dataset, &size), "H5Dset_extent", where);
      extent_[t] = size;
    }
    Slot& slot = slots_[t];
    const bool full = rows == chunk_rows;
    if (slot.chunk != chunk) {  // the chunk's first write
      slot.chunk = chunk;
      slot.bytes = full ? stored.size() : slot_size(t, stored.size());
    } else if (stored.size() > slot.bytes) {
      slot.bytes = round_up(stored.size() + stored.size() / 8);  // the chunk moves; its old slot is lost
    }
    if (full) last_full_[t][full_count_[t]++ % last_full_[t].size()] = stored.size();
    stored.resize(std::max(stored.size(), slot.bytes), std::byte{0});
    io_.check(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, &first, stored.size(), stored.data()), "H5Dwrite_chunk", where);
    dirty_[t] = true;
  }

  void flush(std::int64_t step, const Totals& totals) {
    IndexRecord record{};
    record.step = step;
    for (int t = 0; t < kDataTableCount; ++t) {
      if (dirty_[t]) io_.check(H5Dflush(datasets_[t].get()), "H5Dflush", table_path(static_cast<Table>(t)));
      dirty_[t] = false;
      record.rows[t] = totals[static_cast<std::size_t>(t)];
    }
    record.crc32 = index_crc32(record, kFormatVersion);
    if (indexed_ && std::memcmp(&record, &last_index_, sizeof record) == 0) return;
    append_index(record);
    last_index_ = record;
    indexed_ = true;
    if (++flushes_ % kFlushesPerCollect == 0) H5garbage_collect();
    // What a failure from here on leaves readable, for its message.
    if (step != durable_step_) {
      durable_step_ = step;
      io_.set_call_hint(step < 0 ? std::string("the trace holds no complete step")
                                 : fmt::format("the trace holds the steps up to step {} (report and the viewer read them)", step));
    }
  }

  void close(std::int64_t step, const Totals& totals, bool complete, const std::array<bool, kDataTableCount>& ascending) {
    flush(step, totals);
    // Before `complete`: a reader that sees a complete trace sees these too (readers trust them only then).
    for (int t = 0; complete && t < kDataTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      if (has_steps(table) && ascending[static_cast<std::size_t>(t)] && datasets_[t].get() >= 0) {
        rewrite_int_attribute(io_, datasets_[t].get(), table_path(table), kStepsAscending, 1);
      }
    }
    if (complete) rewrite_int_attribute(io_, file_.get(), "/", "complete", 1);
    for (int t = 0; t < kTableCount; ++t) datasets_[t].close(io_, "H5Dclose", table_path(static_cast<Table>(t)));
    file_.close(io_, "H5Fclose", "/");
  }

 private:
  // Where a chunk that is rewritten at step ends lives: its index and the size of its space.
  struct Slot {
    std::int64_t chunk = -1;
    std::size_t bytes = 0;
  };

  static std::size_t round_up(std::size_t n) { return (n + 63) / 64 * 64; }

  // Room for a chunk that now takes `stored` bytes and will grow to full: the largest of the last few
  // full chunks plus 1/32 (one run's data changes slowly, and a chunk that outgrows its slot costs the
  // slot), or, before any chunk was full, an extrapolation from this one.
  std::size_t slot_size(std::size_t t, std::size_t stored) const {
    const std::size_t full = *std::max_element(last_full_[t].begin(), last_full_[t].end());
    if (full > 0) return round_up(std::max(full + full / 32, stored));
    const std::size_t raw = chunks_[t] * record_size(static_cast<Table>(t));
    return round_up(std::max(stored, raw / 8));  // trace records deflate to a tenth or less
  }

  // The row goes into the last /index chunk, kept here, which is written whole with H5Dwrite_chunk (the dataset
  // has no filters, so the chunk is rewritten in place; its rows beyond the extent are zeros, HDF5's fill value, as
  // H5Dwrite through the chunk cache wrote them): a third of H5Dwrite's CPU on the writer thread, which went to
  // selections, the type path and the chunk cache (issue 37). Then the flush that makes it visible.
  void append_index(const IndexRecord& record) {
    static_assert(sizeof(IndexRecord) * kIndexChunk <= sizeof index_chunk_);
    const std::size_t t = index_of(Table::index);
    const std::string where = table_path(Table::index);
    const hid_t dataset = datasets_[t].get();
    const hsize_t row = extent_[t], size = row + 1;
    const hsize_t first = row / kIndexChunk * kIndexChunk;
    if (row == first) std::memset(index_chunk_, 0, sizeof index_chunk_);
    std::memcpy(index_chunk_ + (row - first) * sizeof record, &record, sizeof record);
    io_.check(H5Dset_extent(dataset, &size), "H5Dset_extent", where);
    extent_[t] = size;
    io_.check(H5Dwrite_chunk(dataset, H5P_DEFAULT, 0, &first, kIndexChunk * sizeof record, index_chunk_), "H5Dwrite_chunk", where);
    io_.check(H5Dflush(dataset), "H5Dflush", where);
  }

  void create_dataset(Table table, int compression) {
    const std::size_t t = index_of(table);
    const std::string where = table_path(table);
    types_[t] = record_type(io_, table);

    PropertyList dcpl(io_.check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", where));
    const hsize_t chunk = chunks_[t];
    io_.check(H5Pset_chunk(dcpl.get(), 1, &chunk), "H5Pset_chunk", where);
    if (compression > 0) {
      // The pipeline ChunkCodec reproduces: shuffle (byte k of every record together, so near-constant
      // columns become runs), then deflate. Readers decode with HDF5's own filters.
      io_.check(H5Pset_shuffle(dcpl.get()), "H5Pset_shuffle", where);
      io_.check(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(compression)), "H5Pset_deflate", where);
    }
    // Modification times would rewrite every object header at every flush, for nothing.
    io_.check(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times", where);

    const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
    Dataspace space(io_.check(H5Screate_simple(1, &zero, &unlimited), "H5Screate_simple", where));
    datasets_[t] = Dataset(io_.check(
        H5Dcreate2(file_.get(), where.c_str(), types_[t].get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
        "H5Dcreate2", where));
  }

  StorageFailure storage_;  // first: the file driver records into it until the file is closed
  Io io_;
  int compression_;
  ChunkRows chunks_{};
  File file_;
  std::array<Datatype, kTableCount> types_;
  std::array<Dataset, kTableCount> datasets_;
  std::array<hsize_t, kTableCount> extent_{};
  std::array<bool, kTableCount> dirty_{};
  std::array<Slot, kTableCount> slots_{};
  std::array<std::array<std::size_t, 8>, kTableCount> last_full_{};  // sizes of recent full chunks
  std::array<std::size_t, kTableCount> full_count_{};
  IndexRecord last_index_{};
  alignas(8) unsigned char index_chunk_[kIndexChunk * sizeof(IndexRecord)]{};  // /index's last chunk (append_index)
  bool indexed_ = false;
  std::int64_t durable_step_ = -1;  // the step of the last /index row
  std::uint64_t flushes_ = 0;       // /index rows appended
};

// The byte ranges of a table's floating-point fields (and /ops' absmax_xor), merged where adjacent:
// ChunkCodec deflates their columns with zlib's run-length strategy (and may store their random-looking
// mantissa bytes). None for /grads: a GradScaler run writes each parameter's gradient before unscaling and
// after, and the unscaled row's absmax and norm are the scaled row's divided by a power of two, the same
// mantissa bytes one step's parameters further down the column, which only the default strategy's string
// matches find (issue 37: trace_bench's health trace 11.6 -> 7.7 bytes a gradient row; run-length coding
// matches only the byte before).
std::vector<ByteRange> float_columns(const Io& io, Table table) {
  if (table == Table::grads) return {};
  const Datatype type = record_type(io, table);
  const std::string where = table_path(table);
  std::vector<ByteRange> ranges;
  auto add = [&](std::size_t begin, std::size_t size) {
    if (!ranges.empty() && ranges.back().end == begin) {
      ranges.back().end = begin + size;
    } else {
      ranges.push_back({begin, begin + size});
    }
  };
  const H5T_class_t type_class = io.check(H5Tget_class(type.get()), "H5Tget_class", where);
  if (type_class == H5T_FLOAT) {
    add(0, H5Tget_size(type.get()));
    return ranges;
  }
  if (type_class != H5T_COMPOUND) return ranges;  // the bytes of texts
  const int members = io.check(H5Tget_nmembers(type.get()), "H5Tget_nmembers", where);
  for (int m = 0; m < members; ++m) {
    const unsigned i = static_cast<unsigned>(m);
    // /ops' absmax_xor (format_version 9) is an f64's bits XOR another's: zeros in the probe's rows, which
    // run-length coding takes fastest, and otherwise mantissa bytes as random as absmax's were (stored).
    const bool float_bits = table == Table::ops && H5Tget_member_offset(type.get(), i) == offsetof(OpRecord, absmax_xor);
    if (!float_bits && io.check(H5Tget_member_class(type.get(), i), "H5Tget_member_class", where) != H5T_FLOAT) continue;
    const Datatype member(io.check(H5Tget_member_type(type.get(), i), "H5Tget_member_type", where));
    add(H5Tget_member_offset(type.get(), i), H5Tget_size(member.get()));
  }
  return ranges;
}

bool same_run(const RunInfo& a, const RunInfo& b) {
  return a.precision == b.precision && a.device == b.device && a.model == b.model && a.seed == b.seed && a.config == b.config;
}

// ---- termination notes (TraceWriterOptions::note_termination) ----
//
// A writer whose process receives SIGTERM writes kTerminationNote into its lock file before the process
// ends as SIGTERM ends it. The lock file outlives a process that ends without closing its writer, so a
// reader (writer_state) tells a writer that was asked to stop (mpirun asks the other ranks when one rank
// dies) from one that died without a word (SIGKILL, a crash, the out-of-memory killer). The handler only
// reads atomics and calls pwrite, sigaction and raise, which are async-signal-safe.

constexpr char kTerminationNote[] = "ampscope trace writer: ended by SIGTERM\n";
constexpr std::size_t kNotedSlots = 64;  // writers noted at once; more are simply not noted
// The lock files' descriptors plus one (0: a free slot).
std::array<std::atomic<int>, kNotedSlots> noted_locks{};
struct sigaction previous_term {};

void note_termination(int signal_number) {
  for (std::atomic<int>& slot : noted_locks) {
    const int fd = slot.load() - 1;
    if (fd >= 0) {
      const ssize_t ignored = ::pwrite(fd, kTerminationNote, sizeof kTerminationNote - 1, 0);
      (void)ignored;
    }
  }
  // Then what SIGTERM did before: the default action (the handler is installed only over it), on return.
  ::sigaction(signal_number, &previous_term, nullptr);
  ::raise(signal_number);
}

// Installs the handler once, and only where SIGTERM still has its default action: a program that handles
// SIGTERM itself keeps its handler (its writers are then not noted).
bool install_termination_note() {
  static const bool installed = [] {
    struct sigaction current {};
    if (::sigaction(SIGTERM, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) != 0 ||
        current.sa_handler != SIG_DFL) {
      return false;
    }
    previous_term = current;
    struct sigaction mine {};
    mine.sa_handler = note_termination;
    sigemptyset(&mine.sa_mask);
    mine.sa_flags = SA_RESTART;
    return ::sigaction(SIGTERM, &mine, nullptr) == 0;
  }();
  return installed;
}

// Refuses (Io::fail) a name that exists as anything but a regular file: a symbolic link (to anything: a
// writer never writes through one, which would overwrite whatever it points at), a FIFO, a device, a socket.
// `what` says which file it is ("its lock file", "the trace").
void refuse_planted_name(const Io& io, const std::string& path, std::string_view what) {
  struct stat st {};
  // A folder is left to the open that follows, whose own error says so ("is a directory").
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return;
  if (S_ISLNK(st.st_mode)) {
    std::string points(4096, '\0');
    const ssize_t n = ::readlink(path.c_str(), points.data(), points.size() - 1);
    points.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    io.fail(fmt::format("{} '{}' is a symbolic link (to '{}'); a trace writer never writes through a link, which "
                        "could overwrite whatever it points at",
                        what, path, n > 0 ? points : std::string("?")),
            "remove the link (a file that came with a trace may point anywhere), or write the trace elsewhere");
  }
  const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  io.fail(fmt::format("{} '{}' exists and is {}, not a regular file; a trace writer will not write to it", what, path,
                      kind),
          "remove it, or write the trace elsewhere");
}

// One writer per trace: an advisory lock (flock) on "<trace>.lock", taken before the trace is created
// (HDF5's H5Fcreate truncates the file before its own lock, and an SWMR writer drops that lock so that
// readers can open the file) and held until the writer is gone. Readers only test it (writer_state, and the
// reader's own check), never waiting, so they are never blocked. The lock file is removed by its holder
// before it lets go; a process that locked a lock file which was removed meanwhile sees that the path no
// longer names it, and tries again. The lock dies with its process, so a killed run never blocks the next
// one; the file stays, empty or with the termination note (above), which the next writer empties.
class OutputLock {
 public:
  OutputLock(const std::filesystem::path& trace, bool note_termination) : path_(trace.string() + ".lock") {
    take(trace);
    if (note_termination && install_termination_note()) {
      for (std::atomic<int>& slot : noted_locks) {
        int free = 0;
        if (slot.compare_exchange_strong(free, fd_ + 1)) {
          slot_ = &slot;
          break;
        }
      }
    }
  }
  ~OutputLock() {
    if (slot_ != nullptr) slot_->store(0);
    if (fd_ < 0) return;
    ::unlink(path_.c_str());  // while still holding the lock (see above)
    ::close(fd_);
  }
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  void take(const std::filesystem::path& trace) {
    const Io io(trace.string(), "write");
    for (int attempt = 0; attempt < 100; ++attempt) {
      // A trace's folder may have come from elsewhere, with a link or a FIFO planted at the lock file's name:
      // the lock is written (emptied, the termination note) and must never reach what a link points at, nor
      // block on a FIFO. Refused by lstat() first (so not even a device is opened), then by O_NOFOLLOW and
      // O_NONBLOCK for a name swapped in meanwhile, and fstat() of what was opened.
      refuse_planted_name(io, path_, "its lock file");
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
      if (fd_ < 0 && errno == ELOOP) refuse_planted_name(io, path_, "its lock file");
      if (fd_ >= 0) {
        struct stat opened {};
        if (::fstat(fd_, &opened) != 0 || !S_ISREG(opened.st_mode)) {
          ::close(fd_);
          fd_ = -1;
          io.fail(fmt::format("its lock file '{}' is not a regular file", path_),
                  "remove it (a file that came with a trace may be anything), or write the trace elsewhere");
        }
      }
      if (fd_ < 0) {
        const StorageFailure failure{.error = errno, .operation = {}};
        io.fail(fmt::format("cannot create its lock file '{}': {}", path_, failure.problem()),
                failure.error == ENOSPC || failure.error == EDQUOT
                    ? "free space on its file system, or write the trace elsewhere"
                    : "the trace's folder must be writable");
      }
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int error = errno;
        ::close(fd_);
        fd_ = -1;
        if (error == EWOULDBLOCK) {
          io.fail("another process is writing this trace (it holds the lock file '" + path_ + "')",
                  "give this run another --out; two writers would corrupt the trace (readers such as report and the "
                  "viewer may open it meanwhile)");
        }
        io.fail(fmt::format("cannot lock '{}': {}", path_, std::strerror(error)));
      }
      struct stat held {}, named {};
      if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
          held.st_dev == named.st_dev) {
        // Ours. A lock file a process left (killed) may hold its termination note: not this writer's.
        if (::ftruncate(fd_, 0) != 0) {
          const int error = errno;
          ::close(fd_);
          fd_ = -1;
          io.fail(fmt::format("cannot empty its lock file '{}': {}", path_, std::strerror(error)));
        }
        return;
      }
      ::close(fd_);  // a lock file its holder removed as we opened it: try again
      fd_ = -1;
    }
    io.fail(fmt::format("cannot take the lock file '{}': it keeps being replaced", path_));
  }

  std::string path_;
  int fd_ = -1;
  std::atomic<int>* slot_ = nullptr;  // this lock's slot in noted_locks, if noted
};

// A step end whose chunks are at most this many bytes, whole (a partial chunk's cost grows with its chunk, zeros
// included), has them compressed by the writer thread alone (see push_all): the MLP sample's three, 36 KB; a health
// trace of 148 op rows a step has a 134 KB /ops chunk. (Counting only the rows so far, trace_bench's 150 op rows a
// step in 1024-row chunks lost 6-21% of its rows a second: 214 KB chunks compressed one after another.)
constexpr std::size_t kWriterCompresses = 64 << 10;

// Hashes std::string and std::string_view alike, so the interner looks texts up without a copy.
struct TextHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};

// The interner keeps at most this many bytes of texts; past it, it starts afresh (a text seen before
// then gets a second id: the trace stays correct and memory stays bounded, whatever the run writes).
constexpr std::size_t kMaxInternedBytes = std::size_t{32} << 20;

}  // namespace

struct TraceWriter::State {
  // The chunk being filled on the caller's side, per table. Before the tables exist it holds the first
  // step's rows, however many (up to max_automatic_rows).
  struct Staging {
    std::vector<std::byte> bytes;  // room for chunk_rows records
    std::size_t rows = 0;          // records in it
    std::size_t handed = 0;        // of which were handed over at the last step end
    std::int64_t chunk = 0;        // its index
  };

  std::unique_ptr<OutputLock> lock;  // first member: released after everything else (the file) is closed
  std::filesystem::path path;
  RunInfo info;
  TraceWriterOptions options;
  bool created = false;                                              // the tables (and chunk sizes) exist
  ChunkRows chunks{};                                                // rows per chunk, once created
  std::array<std::vector<ByteRange>, kDataTableCount> float_ranges;  // per table, for ChunkCodec
  std::array<Staging, kDataTableCount> staging;
  std::vector<std::unique_ptr<Job>> step_jobs;  // hand_over_step's, kept for its capacity
  std::int64_t last_step = -1;
  bool closed = false;
  // Per table, whether every row so far came with a step no smaller than the row before's (the flight recorder
  // writes an anomalous step's history after later steps; rows outside steps say -1), and the last row's step.
  std::array<bool, kDataTableCount> ascending = [] {
    std::array<bool, kDataTableCount> a;
    a.fill(true);
    return a;
  }();
  std::array<std::int64_t, kDataTableCount> last_row_step = [] {
    std::array<std::int64_t, kDataTableCount> a;
    a.fill(std::numeric_limits<std::int64_t>::min());
    return a;
  }();

  void note_step(Table table, std::int64_t step) {
    const std::size_t t = index_of(table);
    ascending[t] = ascending[t] && step >= last_row_step[t];
    last_row_step[t] = step;
  }

  // The texts written so far and their ids (rows of /strings), on the caller's thread.
  struct Interner final : TextIds {
    State* state = nullptr;
    std::unordered_map<std::string, TextId, TextHash, std::equal_to<>> ids;
    std::size_t held = 0;            // bytes of the texts in `ids`
    TextId next = 0;                 // rows of /strings so far
    std::int64_t bytes = 0;          // bytes of /string_bytes so far
    TextId id(std::string_view text) override {
      if (const auto it = ids.find(text); it != ids.end()) return it->second;
      if (held + text.size() > kMaxInternedBytes) {
        ids.clear();
        held = 0;
      }
      state->write_text(to_utf8(text), bytes);
      const TextId id = next++;
      ids.emplace(std::string(text), id);
      held += text.size() + 64;  // the map's node and the string's header, roughly
      return id;
    }
  } interner;

  // Shared with the writer and compression threads, under `mutex`.
  std::mutex mutex;
  std::condition_variable work_ready;    // the writer waits for jobs
  std::condition_variable encode_ready;  // compression threads wait for chunks
  std::condition_variable encoded;       // the writer waits for a chunk's bytes
  std::condition_variable progress;      // the caller waits for room in the queue, or for a job to finish
  std::deque<std::unique_ptr<Job>> queue;
  std::deque<Job*> to_encode;
  std::size_t queued = 0;                // weight of the jobs queued or being written
  std::uint64_t jobs_pushed = 0;
  std::uint64_t jobs_done = 0;
  std::array<std::vector<std::vector<std::byte>>, kDataTableCount> spare;  // record buffers, per table
  std::array<std::vector<std::vector<std::byte>>, kDataTableCount> spare_stored;  // compressed chunks, per table
  std::exception_ptr error;
  bool failed = false;
  // `failed`, for the caller's check at every row without taking `mutex` (set under it, with `error`, by the
  // writer thread; read with acquire, then `error` under the mutex): the caller took the lock, which the
  // compression and writer threads also take, once a row (issue 37).
  std::atomic<bool> failed_seen{false};
  bool stopping = false;                 // compression threads: exit when idle
  // Per table, the newest full chunk the compression threads encoded: (its index + 1) << 32 | its stored bytes (0:
  // none yet). Its bytes are the most a partial chunk may take when ChunkCodec writes it with fixed codes (encode's
  // partial_budget): the writer thread keeps room for the largest of the last eight full chunks it wrote, and 1/32
  // more, for each chunk it rewrites (FileWriter::slot_size), and a partial chunk's jobs come after every full chunk
  // before it, so the newest one encoded is one of those eight (with up to eight compression threads; with more, a
  // chunk could at worst outgrow its room and move, as zlib's partial chunks may).
  std::array<std::atomic<std::uint64_t>, kDataTableCount> newest_full{};

  std::unique_ptr<FileWriter> file;      // the writer thread's
  std::thread writer;
  std::vector<std::thread> compressors;

  std::int64_t total(std::size_t t) const {
    return staging[t].chunk * static_cast<std::int64_t>(chunks[t]) + static_cast<std::int64_t>(staging[t].rows);
  }
  Totals totals() const {
    Totals out{};
    for (std::size_t t = 0; t < kDataTableCount; ++t) out[t] = total(t);
    return out;
  }

  // Every call of the caller's thread starts here: the writer thread's error, or a call after close().
  void check_error() {
    if (failed_seen.load(std::memory_order_acquire)) {
      std::lock_guard lock(mutex);
      std::rethrow_exception(error);
    }
    if (closed) Io(path.string(), "write").fail("the trace writer was already closed");
  }

  // Waits for room, then queues the job (and its chunk for compression); returns its number. Throws
  // the writer's error, if any.
  std::uint64_t push(std::unique_ptr<Job> job) {
    std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return failed || queued == 0 || queued + job->weight <= options.queue_rows; });
    if (failed) std::rethrow_exception(error);
    return enqueue(std::move(job), lock);
  }

  // push() for the jobs of a step end (its unfinished chunks, then the flush), all at once: one wait for
  // room for them together (or for an empty queue), the queue locked once, and the threads woken after.
  // Pushed one by one, each woke the writer thread, which then waited for the lock the caller took for
  // the next; on two cores that ping-pong cost the caller most of its time in end_step (issue 37).
  std::uint64_t push_all(std::vector<std::unique_ptr<Job>>& jobs) {
    std::size_t weight = 0;
    for (const auto& job : jobs) weight += job->weight;
    std::unique_lock lock(mutex);
    progress.wait(lock, [&] { return failed || queued == 0 || queued + weight <= options.queue_rows; });
    if (failed) std::rethrow_exception(error);
    std::uint64_t id = 0;
    int compress = 0;
    std::size_t chunk_bytes = 0;
    for (auto& job : jobs) {
      compress += job->kind == Job::Kind::chunk ? 1 : 0;
      if (job->kind == Job::Kind::chunk) chunk_bytes += chunks[index_of(job->table)] * record_size(job->table);
      id = queue_locked(std::move(job));
    }
    jobs.clear();
    lock.unlock();
    // The compression threads first: the writer thread's first job waits for them anyway. A short step's chunks
    // (kWriterCompresses bytes or less, whole) are left to the writer thread, which compresses a chunk that no
    // compression thread took: one thread woken instead of three, on two cores shared with the training step.
    if (chunk_bytes > kWriterCompresses) {
      for (int i = 0; i < std::min(compress, options.compression_threads); ++i) encode_ready.notify_one();
    }
    work_ready.notify_one();
    return id;
  }

  std::uint64_t enqueue(std::unique_ptr<Job> job, std::unique_lock<std::mutex>& lock) {
    const bool compress = job->kind == Job::Kind::chunk;
    const std::uint64_t id = queue_locked(std::move(job));
    lock.unlock();
    work_ready.notify_one();
    if (compress) encode_ready.notify_one();
    return id;
  }

  // Queues the job (and its chunk for compression), under `mutex`; returns its number.
  std::uint64_t queue_locked(std::unique_ptr<Job> job) {
    queued += job->weight;
    if (job->kind == Job::Kind::chunk) {
      auto& pool = spare_stored[index_of(job->table)];
      if (!pool.empty()) {
        job->stored = std::move(pool.back());
        pool.pop_back();
      }
      to_encode.push_back(job.get());
    }
    queue.push_back(std::move(job));
    return ++jobs_pushed;
  }

  // A recycled record buffer of table t (any size), or an empty one.
  std::vector<std::byte> spare_buffer(std::size_t t) {
    std::lock_guard lock(mutex);
    auto& pool = spare[t];
    if (pool.empty()) return {};
    std::vector<std::byte> b = std::move(pool.back());
    pool.pop_back();
    return b;
  }

  // Fixes the chunk sizes (from the first step's rows, unless the options fix them) and has the writer
  // thread create the tables.
  void create_tables() {
    for (int t = 0; t < kTableCount; ++t) {
      const Table table = static_cast<Table>(t);
      const std::size_t i = index_of(table);
      if (table == Table::index) {
        chunks[i] = kIndexChunk;
      } else {
        chunks[i] = options.chunk_rows > 0 ? fixed_rows(table, options.chunk_rows) : automatic_rows(table, staging[i].rows);
        staging[i].bytes.resize(chunks[i] * record_size(table));
      }
    }
    created = true;
    auto job = std::make_unique<Job>();
    job->kind = Job::Kind::create;
    job->chunks = chunks;
    push(std::move(job));
    for (std::size_t t = 0; t < kDataTableCount; ++t) {
      if (staging[t].rows == chunks[t]) hand_over(t);
    }
  }

  // Hands over the chunk being filled: the buffer itself when full (a fresh one takes its place),
  // else a copy of its rows so far.
  void hand_over(std::size_t t) { push(chunk_job(t)); }

  // The job hand_over(t) queues.
  std::unique_ptr<Job> chunk_job(std::size_t t) {
    Staging& s = staging[t];
    const Table table = static_cast<Table>(t);
    auto job = std::make_unique<Job>();
    job->kind = Job::Kind::chunk;
    job->table = table;
    job->chunk = s.chunk;
    job->rows = s.rows;
    // What it holds in memory, and will once compressed, in records of a few hundred bytes.
    job->weight = table == Table::string_bytes ? (s.rows + 255) / 256 : s.rows;
    if (s.rows == chunks[t]) {
      job->records = std::move(s.bytes);
      s.bytes = spare_buffer(t);
      s.bytes.resize(chunks[t] * record_size(table));
      ++s.chunk;
      s.rows = 0;
      s.handed = 0;
    } else {
      job->records = spare_buffer(t);
      // Every buffer of a table holds a whole chunk: a recycled one never grows (a heap of buffers of
      // every size in between, left by a long run's ups and downs, would grow the process instead).
      job->records.reserve(chunks[t] * record_size(table));
      job->records.assign(s.bytes.begin(), s.bytes.begin() + static_cast<std::ptrdiff_t>(s.rows * record_size(table)));
      s.handed = s.rows;
    }
    return job;
  }

  // A step end (end_step, flush): every chunk with rows not handed over yet, then `flush`, a flush job
  // whose totals it sets, queued together (push_all); returns the flush's number.
  std::uint64_t hand_over_step(std::unique_ptr<Job> flush) {
    if (!created) create_tables();
    std::vector<std::unique_ptr<Job>>& jobs = step_jobs;
    jobs.clear();  // what a push_all that threw left
    for (std::size_t t = 0; t < kDataTableCount; ++t) {
      if (staging[t].rows > staging[t].handed) jobs.push_back(chunk_job(t));
    }
    flush->totals = totals();
    jobs.push_back(std::move(flush));
    return push_all(jobs);
  }

  // Hands over every chunk with rows not handed over yet.
  void hand_over_partial() {
    if (!created) create_tables();
    for (std::size_t t = 0; t < kDataTableCount; ++t) {
      if (staging[t].rows > staging[t].handed) hand_over(t);
    }
  }

  // Room for `count` more records of `table` at the end of its staging buffer: up to the end of the
  // chunk, or, before the tables exist, up to max_automatic_rows (growing the buffer). Returns how many
  // fit (at least one).
  std::size_t room(Table table, std::size_t count) {
    Staging& s = staging[index_of(table)];
    const std::size_t size = record_size(table);
    if (created) return std::min(count, chunks[index_of(table)] - s.rows);
    const std::size_t n = std::min(count, max_automatic_rows(table) - s.rows);
    if ((s.rows + n) * size > s.bytes.size()) s.bytes.resize(std::max(2 * s.bytes.size(), (s.rows + n) * size));
    return n;
  }

  // Counts `count` records written at the end of `table`'s buffer, and hands the chunk over when full.
  void added(Table table, std::size_t count) {
    const std::size_t t = index_of(table);
    staging[t].rows += count;
    if (!created) {
      if (staging[t].rows == max_automatic_rows(table)) create_tables();  // hands over what is full
    } else if (staging[t].rows == chunks[t]) {
      hand_over(t);
    }
  }

  // One record, appended to the table's buffer. It is encoded first: its new texts go to /strings and
  // /string_bytes before it, so a flush that holds the row holds its texts.
  template <class Record, class Row>
  void write_record(Table table, const Row& row) {
    check_error();
    note_step(table, row.step);
    Record record;
    if constexpr (std::is_same_v<Record, StepRecord>) {
      encode(row, record);
    } else {
      encode(row, record, interner);
    }
    append_record(table, &record, sizeof record);
  }

  void append_record(Table table, const void* record, std::size_t size) {
    room(table, 1);
    Staging& s = staging[index_of(table)];
    std::memcpy(s.bytes.data() + s.rows * size, record, size);
    added(table, 1);
  }

  // A new text: its bytes at the end of /string_bytes (`end` bytes so far, advanced), its row in /strings.
  void write_text(const std::string& text, std::int64_t& end) {
    const StringRecord record{end, static_cast<std::int64_t>(text.size()), crc32_of(text.data(), text.size())};
    append_record(Table::strings, &record, sizeof record);
    const Table table = Table::string_bytes;
    const char* bytes = text.data();
    std::size_t count = text.size();
    while (count > 0) {
      const std::size_t n = room(table, count);
      Staging& s = staging[index_of(table)];
      std::memcpy(s.bytes.data() + s.rows, bytes, n);
      added(table, n);
      bytes += n;
      count -= n;
    }
    end += static_cast<std::int64_t>(text.size());
  }

  // Many plain values (dump values), split at chunk ends.
  void write_values(const double* values, std::size_t count) {
    const Table table = Table::dump_values;
    while (count > 0) {
      const std::size_t n = room(table, count);
      Staging& s = staging[index_of(table)];
      std::memcpy(s.bytes.data() + s.rows * sizeof(double), values, n * sizeof(double));
      added(table, n);
      values += n;
      count -= n;
    }
  }

  using Codecs = std::map<Table, std::unique_ptr<ChunkCodec>>;  // a thread's, one per table it has seen

  // Compresses the job's chunk into job.stored (its error, if any, into job.encode_error), with the thread's codecs.
  void encode_job(Job& job, Codecs& codecs) {
    try {
      const std::size_t t = index_of(job.table);
      auto& codec = codecs[job.table];
      if (!codec) codec = std::make_unique<ChunkCodec>(record_size(job.table), chunks[t], options.compression, float_ranges[t]);
      const bool full = job.rows == chunks[t];
      const std::size_t budget = full ? 0 : newest_full[t].load(std::memory_order_relaxed) & 0xFFFFFFFFu;
      codec->encode(job.records.data(), job.rows, job.stored, budget);
      if (full && job.stored.size() <= 0xFFFFFFFFu) {
        const std::uint64_t mine = (static_cast<std::uint64_t>(job.chunk) + 1) << 32 | job.stored.size();
        std::uint64_t seen = newest_full[t].load(std::memory_order_relaxed);
        while ((seen >> 32) < (mine >> 32) && !newest_full[t].compare_exchange_weak(seen, mine, std::memory_order_relaxed)) {
        }
      }
    } catch (...) {
      job.encode_error = std::current_exception();
    }
  }

  void run_compressor() {
    Codecs codecs;
    for (;;) {
      Job* job;
      {
        std::unique_lock lock(mutex);
        encode_ready.wait(lock, [&] { return stopping || !to_encode.empty(); });
        if (to_encode.empty()) return;
        job = to_encode.front();
        to_encode.pop_front();
      }
      encode_job(*job, codecs);
      {
        std::lock_guard lock(mutex);
        job->encoded = true;
      }
      encoded.notify_all();
    }
  }

  void process(Job& job) {
    switch (job.kind) {
      case Job::Kind::create: file->create_tables(job.chunks); break;
      case Job::Kind::chunk:
        if (job.encode_error) std::rethrow_exception(job.encode_error);
        file->write_chunk(job.table, job.chunk, job.rows, job.stored);
        break;
      case Job::Kind::flush: file->flush(job.step, job.totals); break;
      case Job::Kind::close: file->close(job.step, job.totals, job.complete, job.ascending); break;
    }
  }

  void run_writer() {
    const QuietHdf5Errors quiet;  // this thread's HDF5 errors become exceptions, not stderr output
    Codecs codecs;                // for the chunks it compresses itself
    for (;;) {
      std::unique_ptr<Job> job;
      bool ok;
      {
        std::unique_lock lock(mutex);
        work_ready.wait(lock, [&] { return !queue.empty(); });
        job = std::move(queue.front());
        queue.pop_front();
        // A chunk no compression thread took yet is compressed here (a short step's end: push_all woke none);
        // one that a compression thread holds is waited for, even when only discarding.
        bool mine = false;
        if (job->kind == Job::Kind::chunk && !job->encoded) {
          const auto waiting = std::find(to_encode.begin(), to_encode.end(), job.get());
          mine = waiting != to_encode.end();
          if (mine) {
            to_encode.erase(waiting);
          } else {
            encoded.wait(lock, [&] { return job->encoded; });
          }
        }
        ok = !failed;
        if (mine) {
          lock.unlock();
          if (ok) encode_job(*job, codecs);
          lock.lock();
          job->encoded = true;
        }
      }
      if (ok) {
        try {
          process(*job);
        } catch (...) {
          std::lock_guard lock(mutex);
          error = std::current_exception();
          failed = true;
          failed_seen.store(true, std::memory_order_release);
        }
      }
      const bool stop = job->kind == Job::Kind::close;
      if (stop) file.reset();  // closes whatever a failure left open, quietly
      {
        std::lock_guard lock(mutex);
        queued -= job->weight;
        ++jobs_done;
        // Buffers are recycled, never freed: there are never more than the queue holds at its fullest,
        // and fresh ones cost more in page faults than zlib's time on small chunks.
        if (job->kind == Job::Kind::chunk) {
          spare[index_of(job->table)].push_back(std::move(job->records));
          spare_stored[index_of(job->table)].push_back(std::move(job->stored));
        }
      }
      progress.notify_all();
      if (stop) return;
    }
  }

  // Hands everything over, queues the close and waits for the threads. Never throws.
  void finish(bool complete) noexcept {
    closed = true;
    try {
      hand_over_partial();
    } catch (...) {
      // The writer failed: its error is in `error`, and it discards work from now on.
    }
    auto job = std::make_unique<Job>();
    job->kind = Job::Kind::close;
    job->step = last_step;
    job->totals = totals();
    job->complete = complete;
    job->ascending = ascending;
    {
      std::unique_lock lock(mutex);
      enqueue(std::move(job), lock);  // even when the queue is full: the close must reach the thread
    }
    writer.join();
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    encode_ready.notify_all();
    for (std::thread& c : compressors) c.join();
  }
};

TraceWriter::TraceWriter(const std::filesystem::path& path, const RunInfo& info, TraceWriterOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = path;
  s.info = info;
  s.interner.state = &s;
  s.options = options;
  const Io io(path.string(), "write");
  if (options.queue_rows == 0) io.fail("queue_rows is 0", "use at least 1 (16384 is the default)");
  if (options.compression < 0 || options.compression > 9) {
    io.fail(fmt::format("compression level {} is outside 0..9", options.compression), "0 turns deflate off; 1 is the default");
  }
  if (options.compression_threads < 1) {
    io.fail(fmt::format("compression_threads is {}", options.compression_threads), "use at least 1 (2 is the default)");
  }
  if (options.thread_nice < 0 || options.thread_nice > 19) {
    io.fail(fmt::format("thread_nice {} is outside 0..19", options.thread_nice),
            "0 (the default) leaves the writer's threads at the caller's priority; 19 is the lowest");
  }
  if (info.precision != "fp32" && info.precision != "fp16" && info.precision != "bf16" && info.precision != "fp8" &&
      info.precision != "mxfp8" && info.precision != "nvfp4") {
    io.fail(fmt::format("precision '{}' is not one of fp32, fp16, bf16, fp8, mxfp8, nvfp4", info.precision));
  }
  const std::filesystem::path folder = path.parent_path();
  std::error_code ec;
  if (!folder.empty() && !std::filesystem::is_directory(folder, ec)) {
    io.fail(fmt::format("folder '{}' does not exist", folder.string()), "create it first, or choose another path");
  }
  {
    const QuietHdf5Errors quiet;
    for (std::size_t t = 0; t < kDataTableCount; ++t) s.float_ranges[t] = float_columns(io, static_cast<Table>(t));
  }
  // The trace's own name: HDF5 creates it by open(O_TRUNC), which would follow a link planted there (--out in a
  // folder someone sent) and truncate what it points at. Refused here, and again by the driver's O_NOFOLLOW.
  refuse_planted_name(io, path.string(), "the trace");
  // Before the file: a second writer must not truncate it.
  s.lock = std::make_unique<OutputLock>(path, options.note_termination);
  s.file = std::make_unique<FileWriter>(path, info, options.compression);
  // The writer's threads' nice value: the caller's plus thread_nice (a thread's own, Linux: setpriority of its id),
  // best effort (a value the system refuses leaves them as they are).
  errno = 0;
  const int caller_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  const bool lower = errno == 0 && options.thread_nice > 0;
  const int nice = lower ? std::min(19, caller_nice + options.thread_nice) : 0;
  auto lower_priority = [lower, nice] {
    if (lower) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), nice);
  };
  s.writer = std::thread([&s, lower_priority] {
    lower_priority();
    s.run_writer();
  });
  for (int i = 0; i < options.compression_threads; ++i) {
    s.compressors.emplace_back([&s, lower_priority] {
      lower_priority();
      s.run_compressor();
    });
  }
  if (options.chunk_rows > 0) s.create_tables();  // readers can open the trace at once
}

TraceWriter::~TraceWriter() {
  if (!state_->closed) state_->finish(false);
}

const std::filesystem::path& TraceWriter::path() const { return state_->path; }

void TraceWriter::begin(const RunInfo& info) {
  if (same_run(info, state_->info)) return;
  Io(state_->path.string(), "write")
      .fail(fmt::format("begin() was given run info (model '{}', precision '{}', seed {}) that differs from the info "
                        "the file was created with (model '{}', precision '{}', seed {})",
                        info.model, info.precision, info.seed, state_->info.model, state_->info.precision,
                        state_->info.seed),
            "the root attributes are written when the file is created: pass the run info to TraceWriter's constructor");
}

void TraceWriter::write(const StepRow& row) { state_->write_record<StepRecord>(Table::steps, row); }
void TraceWriter::write(const OpRow& row) { state_->write_record<OpRecord>(Table::ops, row); }
void TraceWriter::write(const GradRow& row) { state_->write_record<GradRecord>(Table::grads, row); }
void TraceWriter::write(const EventRow& row) { state_->write_record<EventRecord>(Table::events, row); }
void TraceWriter::write(const HistogramRow& row) { state_->write_record<HistogramRecord>(Table::histograms, row); }
void TraceWriter::write(const PrecisionRow& row) { state_->write_record<PrecisionRecord>(Table::precision, row); }
void TraceWriter::write(const UpdateRow& row) { state_->write_record<UpdateRecord>(Table::updates, row); }
void TraceWriter::write(const ChecksumRow& row) { state_->write_record<ChecksumRecord>(Table::checksums, row); }
void TraceWriter::write(const Fp8Row& row) { state_->write_record<Fp8Record>(Table::fp8, row); }
void TraceWriter::write(const BlockRow& row) { state_->write_record<BlockRecord>(Table::blocks, row); }

void TraceWriter::write(const DumpRow& row) {
  State& s = *state_;
  s.check_error();
  s.note_step(Table::dumps, row.step);
  DumpRecord record;
  encode(row, record, s.interner);
  // The record points at its values in /dump_values: where the next value will go.
  record.values_offset = s.total(index_of(Table::dump_values));
  s.append_record(Table::dumps, &record, sizeof record);
  s.write_values(row.values.data(), row.values.size());
}

void TraceWriter::end_step(std::int64_t step) {
  State& s = *state_;
  s.check_error();
  s.last_step = step;
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::flush;
  job->step = step;
  s.hand_over_step(std::move(job));
}

void TraceWriter::flush() {
  State& s = *state_;
  s.check_error();
  auto job = std::make_unique<Job>();
  job->kind = Job::Kind::flush;
  job->step = s.last_step;
  const std::uint64_t id = s.hand_over_step(std::move(job));
  std::unique_lock lock(s.mutex);
  s.progress.wait(lock, [&] { return s.jobs_done >= id; });
  if (s.failed) std::rethrow_exception(s.error);
}

void TraceWriter::close() {
  State& s = *state_;
  if (s.closed) return;
  bool ok;
  {
    std::lock_guard lock(s.mutex);
    ok = !s.failed;
  }
  s.finish(ok);
  s.lock.reset();  // the file is closed: another run may write this path now
  if (s.failed) std::rethrow_exception(s.error);
}

WriterState writer_state(const std::filesystem::path& trace) {
  WriterState state;
  const std::string lock = trace.string() + ".lock";
  // A lock file is what a writer left, or anything anyone put there: a regular file only, never waited on.
  // lstat() first, so that nothing else is even opened (opening some devices has effects of its own); then
  // O_NONBLOCK | O_NOFOLLOW for a name swapped in meanwhile, and fstat() of what was opened.
  struct stat named {};
  if (::lstat(lock.c_str(), &named) != 0 || !S_ISREG(named.st_mode)) return state;
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return state;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    state.writing = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    char note[sizeof kTerminationNote] = {};
    const ssize_t n = ::pread(fd, note, sizeof note - 1, 0);
    state.terminated = !state.writing && st.st_size == static_cast<off_t>(sizeof kTerminationNote - 1) &&
                       n == static_cast<ssize_t>(sizeof kTerminationNote - 1) &&
                       std::memcmp(note, kTerminationNote, sizeof kTerminationNote - 1) == 0;
  }
  ::close(fd);  // releases the shared lock, if it was taken
  return state;
}

}  // namespace ampscope::trace
