// probes/trace/layout.h: how each trace table's rows are laid out in the HDF5 file, format_version 9
// (internal to ampscope_trace; docs/trace-format.md is the description for readers; the layouts of
// versions 1 to 3, which the reader still reads, are in probes/trace/layout_v3.h). Each table is a 1-D
// dataset of one compound type, whose fields are those of the row structs in probes/trace/schema.h, in
// that order. The records below are byte-for-byte the file's compound types, so HDF5 converts nothing.
//
// Every text field (op names, module paths, dtypes, shapes, event kinds and details, parameter names,
// the phase) is an int64 id: the row of /strings that locates the text in /string_bytes and holds its
// CRC-32. Texts are interned, so a name repeated on every row costs 8 bytes, which shuffle and deflate
// shrink to almost nothing, and no text is ever cut, however long.
//
//   detail::OpRecord r; detail::encode(row, r, ids);      // ids: a detail::TextIds that interns texts
//   trace::OpRow back = detail::decode(r, strings);       // strings: the trace's detail::StringTable
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "probes/trace/hdf5_io.h"
#include "probes/trace/schema.h"

namespace ampscope::trace::detail {

// Every dataset of a trace. dump_values holds the values of all dumps back to back (/dumps rows point
// into it); strings locates each text in string_bytes (format_version 4); precision holds the f32 twin's
// rows and updates the swamped-update counts of f16/bf16 parameters (format_version 5); index holds one row per flush, the table sizes that flush made durable.
enum class Table : int {
  steps, ops, grads, events, histograms, dumps, dump_values, strings, string_bytes, precision, updates, checksums, fp8,
  blocks, index
};
inline constexpr int kTableCount = 15;
inline constexpr int kDataTableCount = 14;   // every table but index
inline constexpr int kLegacyDataTables = 7;  // format_version 1 to 3: the tables before strings
inline constexpr int kV4DataTables = 9;      // format_version 4: the tables before precision
inline constexpr int kV5DataTables = 11;     // format_version 5: the tables before checksums
inline constexpr int kV6DataTables = 12;     // format_version 6: the tables before fp8
inline constexpr int kV7DataTables = 13;     // format_version 7: the tables before blocks
// The data tables a trace of this format_version has: the first 7, 9, 11, 12, 13 or 14 of Table's order.
int data_tables(std::int64_t version);
std::string_view table_name(Table table);    // "steps", ..., "string_bytes", "index"
std::string_view field_name(Table table);    // what a row of the table is, for messages: "value", "byte", "row"
std::string table_path(Table table);         // "/steps", ...
// Whether a trace of this format_version has the table.
bool has_table(Table table, std::int64_t version);

// The fields of a table that are text ids, comma-separated ("phase,op,module,..."; "" for a table with
// none): the writer stores this as the table's attribute `text_fields`, so tools can find them.
std::string_view text_fields(Table table);
// Whether the table's rows have a `step` field (every data table but /dump_values, /strings and /string_bytes):
// the writer gives each the attribute `steps_ascending` (docs/trace-format.md).
bool has_steps(Table table);
// That attribute's name: 1 when every row of the table came with a step no smaller than the row before's, written
// by the writer at a clean close; 0 otherwise (and while the trace is written). Traces before it lack it.
inline constexpr const char* kStepsAscending = "steps_ascending";

// A row of a text table: the id of a text is the row's index in /strings.
using TextId = std::int64_t;

struct [[gnu::packed]] StepRecord {
  std::int64_t step;
  double loss, scale, scale_after;
  std::int8_t found_inf, skipped;
  std::int64_t growth_tracker;
  double grad_norm, lr, time_ms;
};

// absmax_xor (format_version 9): absmax's bits XOR derived_absmax_bits(min, max), so 0 in every row where absmax
// is max(|min|, |max|), as the probe writes it (probes/stats.cpp): a column of zeros costs almost nothing after
// shuffle + deflate, where a stored absmax cost as much as min or max (issue 37). Any absmax, NaN payloads
// included, comes back bit for bit. An unsigned field under a new name, so no reader takes it for absmax.
struct [[gnu::packed]] OpRecord {
  std::int64_t step, seq;
  TextId phase, op, module, in_dtypes, out_dtype, shape, autocast;
  std::int64_t numel, nan, pos_inf, neg_inf, zero, subnormal;
  double min, max;
  std::uint64_t absmax_xor;
  double mean, rms;
  std::int64_t cast_overflow, cast_underflow;
  std::int8_t origin;
  std::int64_t inputs[kOpInputs];
};
// /ops in format_version 4 to 8: the same bytes with absmax stored as it is.
struct [[gnu::packed]] OpRecordV8 {
  std::int64_t step, seq;
  TextId phase, op, module, in_dtypes, out_dtype, shape, autocast;
  std::int64_t numel, nan, pos_inf, neg_inf, zero, subnormal;
  double min, max, absmax, mean, rms;
  std::int64_t cast_overflow, cast_underflow;
  std::int8_t origin;
  std::int64_t inputs[kOpInputs];
};

// The bits of max(|min|, |max|) as numpy's np.maximum(np.abs(min), np.abs(max)) computes it (docs/trace-format.md
// gives that recipe): |min| when it is NaN, else |max| when it is NaN, else the larger (either when equal: the same
// bits, as |x| has no sign). Defined for every pair of doubles, so absmax_xor round-trips any absmax.
inline std::uint64_t derived_absmax_bits(double min, double max) {
  const double a = std::fabs(min), b = std::fabs(max);
  const double d = a != a ? a : b != b ? b : a < b ? b : a;  // x != x: NaN, without <cmath>'s isnan overloads
  return std::bit_cast<std::uint64_t>(d);
}

// before_all_reduce: format_version 6 (absent from older traces, whose rows read it as 0).
struct [[gnu::packed]] GradRecord {
  std::int64_t step;
  TextId param, dtype;
  std::int64_t nan, pos_inf, neg_inf, zero;
  double absmax, norm;
  std::int8_t unscaled;
  std::int8_t before_all_reduce;
};

struct [[gnu::packed]] EventRecord {
  std::int64_t step, seq;
  TextId kind, op, module, detail;
};

struct [[gnu::packed]] HistogramRecord {
  std::int64_t step, seq;
  TextId tensor;
  std::int64_t bins[kHistBins];
};

// values_offset and values_count locate the dump's values in /dump_values.
struct [[gnu::packed]] DumpRecord {
  std::int64_t step, seq;
  TextId op, module, tensor, dtype, shape;
  std::int64_t values_offset, values_count;
};

// local and followed are flags; cond is NaN for ops that have none; error_bins and exact: the accumulated
// errors' histogram (PrecisionRow); phase (format_version 6, last): "forward" or "backward".
struct [[gnu::packed]] PrecisionRecord {
  std::int64_t step, seq;
  TextId op, module, out_dtype;
  std::int64_t numel;
  std::int8_t local;
  double local_max_rel, local_mean_rel, local_max_ulp;
  double acc_max_rel, acc_mean_rel, acc_max_ulp;
  double in_acc_max_rel, in_acc_mean_rel;
  std::int64_t flips;
  double bits, cond;
  std::int8_t followed;
  std::int64_t error_bins[kErrorBins];
  std::int64_t exact;
  TextId phase;
};
// /precision in format_version 5: the same fields without phase (every row a forward row).
struct [[gnu::packed]] PrecisionRecordV5 {
  std::int64_t step, seq;
  TextId op, module, out_dtype;
  std::int64_t numel;
  std::int8_t local;
  double local_max_rel, local_mean_rel, local_max_ulp;
  double acc_max_rel, acc_mean_rel, acc_max_ulp;
  double in_acc_max_rel, in_acc_mean_rel;
  std::int64_t flips;
  double bits, cond;
  std::int8_t followed;
  std::int64_t error_bins[kErrorBins];
  std::int64_t exact;
};

struct [[gnu::packed]] UpdateRecord {
  std::int64_t step;
  TextId param, dtype;
  std::int64_t numel, nonzero, swamped;
  double param_abs_mean, update_abs_mean;
};

// /checksums (format_version 6): checksum is the 64-bit value's bits (an unsigned 64-bit field).
struct [[gnu::packed]] ChecksumRecord {
  std::int64_t step;
  TextId param;
  std::uint64_t checksum;
};

// /fp8 (format_version 7). The fields from dynamic_range on are optional: the first format 7 traces lack them
// (kFp8OptionalFields; the reader fills Fp8Row's "not recorded" values then).
struct [[gnu::packed]] Fp8Record {
  std::int64_t step;
  TextId module, operand, format;
  std::int64_t numel, nonzero, underflow, subnormal, saturated;
  double amax, scale, rel_rms_error;
  double dynamic_range, quantized_dynamic_range;
  std::int64_t history_len;
  double history_amax;
  std::int64_t history_amax_step;
};
// A record as the reader lays it out before HDF5 fills it: zero, except that an Fp8Record says history_len -1,
// which a file without the optional /fp8 fields leaves there (HDF5 keeps a field the file lacks as it was).
template <class Record>
Record blank_record() {
  Record r{};
  if constexpr (requires { r.history_amax_step; }) r.history_len = -1;
  return r;
}
inline constexpr std::string_view kFp8OptionalFields[] = {"dynamic_range", "quantized_dynamic_range", "history_len",
                                                          "history_amax", "history_amax_step"};

// /blocks (format_version 8): BlockRow's fields in order; what_if is a flag.
struct [[gnu::packed]] BlockRecord {
  std::int64_t step;
  TextId module, operand, copy, format;
  std::int8_t what_if;
  std::int64_t rows, cols, numel, nonzero, nonfinite, underflow, saturated, blocks, blocks_clipped, blocks_nan;
  double max_block_range;
  std::int64_t max_range_block, max_range_row, max_range_col;
  std::int64_t worst_block, worst_block_underflow, worst_block_row, worst_block_col;
  double scale_log2_min, scale_log2_median, scale_log2_max, rel_rms_error;
};

// A text: bytes [offset, offset + length) of /string_bytes (UTF-8, no NUL), and zlib's CRC-32 of them.
struct [[gnu::packed]] StringRecord {
  std::int64_t offset, length, crc32;
};

// Row counts of the data tables after a flush, in Table order (format_version 1 to 3: the first seven;
// 4: the first nine; 5: the first eleven; 6: the first twelve; 7: the first thirteen).
struct [[gnu::packed]] IndexRecord {
  std::int64_t step;  // the step whose end (or the close) caused the flush
  std::int64_t rows[kDataTableCount];
  std::int64_t crc32;  // format_version 3 and later: index_crc32 of the fields above (0 in older traces)
};

// CRC-32 (zlib's) of an /index row's step and row counts as 8 little-endian bytes each: seven counts in
// format_version 3, nine in 4, eleven in 5, twelve in 6, thirteen in 7, fourteen from 8.
std::int64_t index_crc32(const IndexRecord& r, std::int64_t version);

// zlib's CRC-32 of `size` bytes.
std::int64_t crc32_of(const void* data, std::size_t size);

// The root attribute `attributes_crc32` (format_version 3): zlib's CRC-32 of, for each root attribute in
// the order format, format_version, precision, device, model, seed, config, probe, its name, a NUL, its
// value (text as it is, integers in decimal) and a NUL.
std::int64_t root_attributes_crc32(std::string_view format, std::int64_t version, const RunInfo& info);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view text);
// `text` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD: what the writer stores.
std::string to_utf8(std::string_view text);

// Record size and compound type of a table in the given format_version (older versions: the layouts of
// trace_layout_v3.h; /index: the fields that version has, laid out as IndexRecord). The file type and
// the memory type alike.
std::size_t record_size(Table table, std::int64_t version = kFormatVersion);
Datatype record_type(const Io& io, Table table, std::int64_t version = kFormatVersion);

// Builds a compound type member by member; `table` names it in messages.
class CompoundBuilder {
 public:
  CompoundBuilder(const Io& io, std::size_t size, Table table);
  void add(const char* name, std::size_t offset, hid_t member);
  void i64(const char* name, std::size_t offset) { add(name, offset, H5T_STD_I64LE); }
  void f64(const char* name, std::size_t offset) { add(name, offset, H5T_IEEE_F64LE); }
  void flag(const char* name, std::size_t offset) { add(name, offset, bool_.get()); }
  void text(const char* name, std::size_t offset, std::size_t width);
  Datatype take() { return std::move(type_); }

 private:
  const Io& io_;
  std::string where_;
  Datatype type_;
  Datatype bool_;
};

// Where encode() gets the id of a text: the writer interns it, appending new texts to /strings.
class TextIds {
 public:
  virtual ~TextIds() = default;
  virtual TextId id(std::string_view text) = 0;
};

// The texts of a trace, as the reader loaded them from /strings and /string_bytes: every entry checked
// (inside the bytes, CRC-32, UTF-8) when it is added. Read-only afterwards, so decoding threads share it.
class StringTable {
 public:
  // Appends bytes of /string_bytes (those after the ones held), then entries (the rows of /strings after
  // the ones held), each checked against the bytes held.
  void append_bytes(std::string_view bytes) { bytes_.append(bytes); }
  void append(const StringRecord* records, std::size_t count);
  std::size_t size() const { return entries_.size(); }
  std::size_t bytes() const { return bytes_.size(); }
  std::size_t damaged() const { return damaged_; }
  // The first damaged entry's description ("" when none).
  const std::string& first_damage() const { return first_damage_; }
  // The text of `id`, named `field` in messages; throws std::invalid_argument when the id is not a row
  // of /strings or names a damaged one.
  std::string_view text(TextId id, std::string_view field) const {
    // Inline: asked once per text field of every row read (seven an /ops row); the message is built out of line.
    if (id < 0 || static_cast<std::uint64_t>(id) >= entries_.size() || entries_[static_cast<std::size_t>(id)].damage != nullptr) {
      refuse(id, field);
    }
    const Entry& e = entries_[static_cast<std::size_t>(id)];
    return std::string_view(bytes_.data() + e.offset, static_cast<std::size_t>(e.length));
  }

 private:
  struct Entry {
    std::int64_t offset = 0, length = 0;
    const char* damage = nullptr;  // why the entry is unusable; nullptr when it is sound
  };
  [[noreturn]] void refuse(TextId id, std::string_view field) const;
  std::string bytes_;
  std::vector<Entry> entries_;
  std::size_t damaged_ = 0;
  std::string first_damage_;
};

void encode(const StepRow& row, StepRecord& r);
void encode(const OpRow& row, OpRecord& r, TextIds& ids);
void encode(const GradRow& row, GradRecord& r, TextIds& ids);
void encode(const EventRow& row, EventRecord& r, TextIds& ids);
void encode(const HistogramRow& row, HistogramRecord& r, TextIds& ids);
// values_offset and values_count are set by the writer.
void encode(const DumpRow& row, DumpRecord& r, TextIds& ids);
void encode(const PrecisionRow& row, PrecisionRecord& r, TextIds& ids);
void encode(const UpdateRow& row, UpdateRecord& r, TextIds& ids);
void encode(const ChecksumRow& row, ChecksumRecord& r, TextIds& ids);
void encode(const Fp8Row& row, Fp8Record& r, TextIds& ids);
void encode(const BlockRow& row, BlockRecord& r, TextIds& ids);

// Each throws std::invalid_argument, naming the field, on a text id that is not a sound row of /strings
// and on an unknown phase name.
StepRow decode(const StepRecord& r);
// health.absmax is absmax_xor's value restored (OpRecordV8: the stored absmax).
OpRow decode(const OpRecord& r, const StringTable& strings);
// The same into `row`, every field assigned and its strings' memory kept: a reader filling a caller's block
// again (TraceReader::ops into a reused vector) then allocates nothing per row (issue 37).
void decode(const OpRecord& r, const StringTable& strings, OpRow& row, const OpTexts& texts = {});
void decode(const OpRecordV8& r, const StringTable& strings, OpRow& row, const OpTexts& texts = {});
// Also refuses, naming the field, a before_all_reduce that is not 0 or 1.
GradRow decode(const GradRecord& r, const StringTable& strings);
EventRow decode(const EventRecord& r, const StringTable& strings);
HistogramRow decode(const HistogramRecord& r, const StringTable& strings);
DumpRow decode(const DumpRecord& r, const StringTable& strings);  // values are filled in by the reader
// Also refuses, naming the field, an out_dtype that is not f16, bf16, f32 or f64, a negative numel or flips,
// a flag that is not 0 or 1, and an error or a bit count that is negative or NaN (cond may be NaN).
PrecisionRow decode(const PrecisionRecord& r, const StringTable& strings);
PrecisionRow decode(const PrecisionRecordV5& r, const StringTable& strings);  // format_version 5: forward rows
// Also refuses, naming the field, a dtype that is not f16 or bf16, a negative count, nonzero above numel,
// swamped above nonzero, and a mean that is negative, NaN or infinite.
UpdateRow decode(const UpdateRecord& r, const StringTable& strings);
ChecksumRow decode(const ChecksumRecord& r, const StringTable& strings);
// Also refuses, naming the field, an operand or format it does not know, a negative count, a nonzero above numel
// or a count above nonzero, and a scale or error that is negative or NaN.
Fp8Row decode(const Fp8Record& r, const StringTable& strings);
// Also refuses, naming the field, an operand, copy or format it does not know, a what_if that is not 0 or 1, a
// negative shape or count, numel not rows * cols, counts that contradict each other (nonzero + nonfinite above
// numel, underflow + saturated above nonzero, block counts above blocks, a block's underflow above underflow), a
// block number outside the copy's blocks, an origin outside the matrix or not -1 with its block, a range or error
// that is negative, NaN or infinite, and scales out of order, +inf, or NaN beside numbers.
BlockRow decode(const BlockRecord& r, const StringTable& strings);

}  // namespace ampscope::trace::detail
