// probes/trace/layout_v3.h: the row layouts of format_version 1 to 3 (internal to ampscope_trace), which
// the reader still reads. Their text fields are fixed-length strings of the widths below (the NUL
// included); a longer text was cut to width - 4 bytes and "..." when it was written. format_version 4
// (probes/trace/layout.h) stores every text in /strings instead. /steps and /dump_values are the same
// in every version; /index is read into trace_layout.h's IndexRecord by field name.
//
//   const Datatype type = v3::record_type(io, Table::ops);   // the file type and the memory type
//   trace::OpRow row = v3::decode(record);                    // record: a v3::OpRecord read from the file
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "probes/trace/hdf5_io.h"
#include "probes/trace/schema.h"

namespace ampscope::trace::detail {
enum class Table : int;
}

namespace ampscope::trace::detail::v3 {

inline constexpr std::size_t kPhaseWidth = 12;    // "optimizer"
inline constexpr std::size_t kOpWidth = 32;       // op names
inline constexpr std::size_t kModuleWidth = 64;   // module paths
inline constexpr std::size_t kNameWidth = 80;     // parameter and tensor names
inline constexpr std::size_t kDTypesWidth = 32;   // "f16,f16,f16"
inline constexpr std::size_t kDTypeWidth = 8;     // "bf16"
inline constexpr std::size_t kShapeWidth = 48;    // "[64, 128]"
inline constexpr std::size_t kReasonWidth = 128;  // autocast's reason
inline constexpr std::size_t kKindWidth = 32;     // event kinds
inline constexpr std::size_t kDetailWidth = 256;  // event details
inline constexpr std::size_t kTensorWidth = 16;   // dumps: "input 0", "output"

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
  std::int64_t inputs[kOpInputs];  // format_version 2 and 3
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

struct [[gnu::packed]] DumpRecord {
  std::int64_t step, seq;
  char op[kOpWidth];
  char module[kModuleWidth];
  char tensor[kTensorWidth];
  char dtype[kDTypeWidth];
  char shape[kShapeWidth];
  std::int64_t values_offset, values_count;
};

// The text of a fixed field: up to the first NUL, or all `width` bytes.
std::string get_text(const char* field, std::size_t width);

// Record sizes and compound types of the tables whose layout format_version 4 changed (ops, grads,
// events, histograms, dumps); 0 / an error for the others.
std::size_t record_size(Table table);
Datatype record_type(const Io& io, Table table);

OpRow decode(const OpRecord& r);  // throws std::invalid_argument on an unknown phase name
GradRow decode(const GradRecord& r);
EventRow decode(const EventRecord& r);
HistogramRow decode(const HistogramRecord& r);
DumpRow decode(const DumpRecord& r);  // values are filled in by the reader

}  // namespace ampscope::trace::detail::v3
