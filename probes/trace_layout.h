// probes/trace_layout.h: how each trace table's rows are laid out in the HDF5 file (internal to
// ampscope_trace; docs/trace-format.md is the description for readers). Each table is a 1-D dataset of
// one compound type, whose fields are those of the row structs in probes/trace_schema.h, in that order.
// The records below are byte-for-byte the file's compound types, so HDF5 converts nothing on write, and
// text fields are fixed-length strings of the widths below: fixed strings cost nothing in the row
// once shuffled and deflated, where variable-length ones would live, uncompressed, on HDF5's global heap.
//
//   detail::OpRecord r; detail::encode(row, r);   // row: a trace::OpRow
//   trace::OpRow back = detail::decode(r);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "probes/trace_hdf5.h"
#include "probes/trace_schema.h"

namespace ampscope::trace::detail {

// Widths of the text fields, in bytes, their terminating NUL included: a field holds width - 1 bytes
// of text. A longer text keeps its first (width - 4) bytes, cut back to a UTF-8 character boundary,
// followed by "..." (kTruncationMarker).
inline constexpr std::size_t kPhaseWidth = 12;    // "optimizer"
inline constexpr std::size_t kOpWidth = 32;       // "scaled_dot_product_attention"
inline constexpr std::size_t kModuleWidth = 64;   // "blocks.0.attn.qkv"
inline constexpr std::size_t kNameWidth = 80;     // parameter and tensor names: "blocks.0.attn.qkv.weight"
inline constexpr std::size_t kDTypesWidth = 32;   // "f16,f16,f16"
inline constexpr std::size_t kDTypeWidth = 8;     // "bf16"
inline constexpr std::size_t kShapeWidth = 48;    // "[64, 128]"
inline constexpr std::size_t kReasonWidth = 128;  // autocast's reason
inline constexpr std::size_t kKindWidth = 32;     // event kinds
inline constexpr std::size_t kDetailWidth = 256;  // event details
inline constexpr std::size_t kTensorWidth = 16;   // dumps: "input 0", "output"
inline constexpr std::string_view kTruncationMarker = "...";

// Every dataset of a trace. dump_values holds the values of all dumps back to back (/dumps rows point
// into it); index holds one row per flush, the table sizes that flush made durable.
enum class Table : int { steps, ops, grads, events, histograms, dumps, dump_values, index };
inline constexpr int kTableCount = 8;
inline constexpr int kDataTableCount = 7;  // every table but index
std::string_view table_name(Table table);  // "steps", ..., "dump_values", "index"
std::string table_path(Table table);        // "/steps", ...

// Writes `text` into a fixed field, NUL-terminated and padded, truncated with the marker when too long.
void put_text(char* field, std::size_t width, std::string_view text);
// The text of a fixed field: up to the first NUL, or all `width` bytes.
std::string get_text(const char* field, std::size_t width);

struct [[gnu::packed]] StepRecord {
  std::int64_t step;
  double loss, scale, scale_after;
  std::int8_t found_inf, skipped;
  std::int64_t growth_tracker;
  double grad_norm, lr, time_ms;
};

struct [[gnu::packed]] OpRecord {
  std::int64_t step, seq;
  char phase[kPhaseWidth];
  char op[kOpWidth];
  char module[kModuleWidth];
  char in_dtypes[kDTypesWidth];
  char out_dtype[kDTypeWidth];
  char shape[kShapeWidth];
  char autocast[kReasonWidth];
  std::int64_t numel, nan, pos_inf, neg_inf, zero, subnormal;
  double min, max, absmax, mean, rms;
  std::int64_t cast_overflow, cast_underflow;
  std::int8_t origin;
  std::int64_t inputs[kOpInputs];  // format_version 2
};

struct [[gnu::packed]] GradRecord {
  std::int64_t step;
  char param[kNameWidth];
  char dtype[kDTypeWidth];
  std::int64_t nan, pos_inf, neg_inf, zero;
  double absmax, norm;
  std::int8_t unscaled;
};

struct [[gnu::packed]] EventRecord {
  std::int64_t step, seq;
  char kind[kKindWidth];
  char op[kOpWidth];
  char module[kModuleWidth];
  char detail[kDetailWidth];
};

struct [[gnu::packed]] HistogramRecord {
  std::int64_t step, seq;
  char tensor[kNameWidth];
  std::int64_t bins[kHistBins];
};

// values_offset and values_count locate the dump's values in /dump_values.
struct [[gnu::packed]] DumpRecord {
  std::int64_t step, seq;
  char op[kOpWidth];
  char module[kModuleWidth];
  char tensor[kTensorWidth];
  char dtype[kDTypeWidth];
  char shape[kShapeWidth];
  std::int64_t values_offset, values_count;
};

// Row counts of the data tables after a flush, in Table order.
struct [[gnu::packed]] IndexRecord {
  std::int64_t step;  // the step whose end (or the close) caused the flush
  std::int64_t rows[kDataTableCount];
  std::int64_t crc32;  // format_version 3: index_crc32 of the fields above (0 in older traces)
};

// CRC-32 (zlib's) of an /index row's step and row counts, as 8 little-endian bytes each.
std::int64_t index_crc32(const IndexRecord& r);

// The root attribute `attributes_crc32` (format_version 3): zlib's CRC-32 of, for each root attribute in
// the order format, format_version, precision, device, model, seed, config, probe, its name, a NUL, its
// value (text as it is, integers in decimal) and a NUL.
std::int64_t root_attributes_crc32(std::string_view format, std::int64_t version, const RunInfo& info);

std::size_t record_size(Table table);
// The compound type of a table's records: the file type and the memory type alike.
Datatype record_type(const Io& io, Table table);

void encode(const StepRow& row, StepRecord& r);
void encode(const OpRow& row, OpRecord& r);
void encode(const GradRow& row, GradRecord& r);
void encode(const EventRow& row, EventRecord& r);
void encode(const HistogramRow& row, HistogramRecord& r);
// values_offset and values_count are set by the writer.
void encode(const DumpRow& row, DumpRecord& r);

StepRow decode(const StepRecord& r);
OpRow decode(const OpRecord& r);          // throws std::invalid_argument on an unknown phase name
GradRow decode(const GradRecord& r);
EventRow decode(const EventRecord& r);
HistogramRow decode(const HistogramRecord& r);
DumpRow decode(const DumpRecord& r);      // values are filled in by the reader

}  // namespace ampscope::trace::detail
