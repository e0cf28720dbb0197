#include "probes/trace_layout.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

namespace ampscope::trace::detail {
namespace {

// Records are the file's bytes, which are little-endian.
static_assert(std::endian::native == std::endian::little, "trace records assume a little-endian host");
static_assert(sizeof(OpRecord) == 16 + kPhaseWidth + kOpWidth + kModuleWidth + kDTypesWidth + kDTypeWidth + kShapeWidth +
                                      kReasonWidth + 6 * 8 + 5 * 8 + 2 * 8 + 1 + kOpInputs * 8,
              "OpRecord must be packed: it is the file's compound type byte for byte");

// Builds a compound type member by member; `table` names it in messages.
class CompoundBuilder {
 public:
  CompoundBuilder(const Io& io, std::size_t size, Table table)
      : io_(io), where_(table_path(table)), type_(io.check(H5Tcreate(H5T_COMPOUND, size), "H5Tcreate", where_)) {}

  void add(const char* name, std::size_t offset, hid_t member) {
    io_.check(H5Tinsert(type_.get(), name, offset, member), "H5Tinsert", where_);
  }
  void i64(const char* name, std::size_t offset) { add(name, offset, H5T_STD_I64LE); }
  void f64(const char* name, std::size_t offset) { add(name, offset, H5T_IEEE_F64LE); }
  void flag(const char* name, std::size_t offset) { add(name, offset, bool_.get()); }
  void text(const char* name, std::size_t offset, std::size_t width) {
    const Datatype t = fixed_text_type(io_, width);
    add(name, offset, t.get());
  }
  Datatype take() { return std::move(type_); }

 private:
  const Io& io_;
  std::string where_;
  Datatype type_;
  Datatype bool_ = bool_type(io_);
};

#define AMPSCOPE_I64(R, f) b.i64(#f, offsetof(R, f))
#define AMPSCOPE_F64(R, f) b.f64(#f, offsetof(R, f))
#define AMPSCOPE_FLAG(R, f) b.flag(#f, offsetof(R, f))
#define AMPSCOPE_TEXT(R, f) b.text(#f, offsetof(R, f), sizeof(R::f))

Datatype step_type(const Io& io) {
  using R = StepRecord;
  CompoundBuilder b(io, sizeof(R), Table::steps);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_F64(R, loss);
  AMPSCOPE_F64(R, scale);
  AMPSCOPE_F64(R, scale_after);
  AMPSCOPE_FLAG(R, found_inf);
  AMPSCOPE_FLAG(R, skipped);
  AMPSCOPE_I64(R, growth_tracker);
  AMPSCOPE_F64(R, grad_norm);
  AMPSCOPE_F64(R, lr);
  AMPSCOPE_F64(R, time_ms);
  return b.take();
}

Datatype op_type(const Io& io) {
  using R = OpRecord;
  CompoundBuilder b(io, sizeof(R), Table::ops);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_TEXT(R, phase);
  AMPSCOPE_TEXT(R, op);
  AMPSCOPE_TEXT(R, module);
  AMPSCOPE_TEXT(R, in_dtypes);
  AMPSCOPE_TEXT(R, out_dtype);
  AMPSCOPE_TEXT(R, shape);
  AMPSCOPE_TEXT(R, autocast);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_I64(R, nan);
  AMPSCOPE_I64(R, pos_inf);
  AMPSCOPE_I64(R, neg_inf);
  AMPSCOPE_I64(R, zero);
  AMPSCOPE_I64(R, subnormal);
  AMPSCOPE_F64(R, min);
  AMPSCOPE_F64(R, max);
  AMPSCOPE_F64(R, absmax);
  AMPSCOPE_F64(R, mean);
  AMPSCOPE_F64(R, rms);
  AMPSCOPE_I64(R, cast_overflow);
  AMPSCOPE_I64(R, cast_underflow);
  AMPSCOPE_FLAG(R, origin);
  const hsize_t inputs = kOpInputs;
  const Datatype array(io.check(H5Tarray_create2(H5T_STD_I64LE, 1, &inputs), "H5Tarray_create2", "/ops"));
  b.add("inputs", offsetof(R, inputs), array.get());
  return b.take();
}

Datatype grad_type(const Io& io) {
  using R = GradRecord;
  CompoundBuilder b(io, sizeof(R), Table::grads);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_TEXT(R, param);
  AMPSCOPE_TEXT(R, dtype);
  AMPSCOPE_I64(R, nan);
  AMPSCOPE_I64(R, pos_inf);
  AMPSCOPE_I64(R, neg_inf);
  AMPSCOPE_I64(R, zero);
  AMPSCOPE_F64(R, absmax);
  AMPSCOPE_F64(R, norm);
  AMPSCOPE_FLAG(R, unscaled);
  return b.take();
}

Datatype event_type(const Io& io) {
  using R = EventRecord;
  CompoundBuilder b(io, sizeof(R), Table::events);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_TEXT(R, kind);
  AMPSCOPE_TEXT(R, op);
  AMPSCOPE_TEXT(R, module);
  AMPSCOPE_TEXT(R, detail);
  return b.take();
}

Datatype histogram_type(const Io& io) {
  using R = HistogramRecord;
  CompoundBuilder b(io, sizeof(R), Table::histograms);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_TEXT(R, tensor);
  const hsize_t bins = kHistBins;
  const Datatype array(io.check(H5Tarray_create2(H5T_STD_I64LE, 1, &bins), "H5Tarray_create2", "/histograms"));
  b.add("bins", offsetof(R, bins), array.get());
  return b.take();
}

Datatype dump_type(const Io& io) {
  using R = DumpRecord;
  CompoundBuilder b(io, sizeof(R), Table::dumps);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_TEXT(R, op);
  AMPSCOPE_TEXT(R, module);
  AMPSCOPE_TEXT(R, tensor);
  AMPSCOPE_TEXT(R, dtype);
  AMPSCOPE_TEXT(R, shape);
  AMPSCOPE_I64(R, values_offset);
  AMPSCOPE_I64(R, values_count);
  return b.take();
}

Datatype index_type(const Io& io) {
  using R = IndexRecord;
  CompoundBuilder b(io, sizeof(R), Table::index);
  AMPSCOPE_I64(R, step);
  for (int t = 0; t < kDataTableCount; ++t) {
    const std::string name(table_name(static_cast<Table>(t)));
    b.i64(name.c_str(), offsetof(R, rows) + sizeof(std::int64_t) * static_cast<std::size_t>(t));
  }
  AMPSCOPE_I64(R, crc32);
  return b.take();
}

#undef AMPSCOPE_I64
#undef AMPSCOPE_F64
#undef AMPSCOPE_FLAG
#undef AMPSCOPE_TEXT

template <std::size_t N>
void put(char (&field)[N], std::string_view text) {
  put_text(field, N, text);
}
template <std::size_t N>
std::string get(const char (&field)[N]) {
  return get_text(field, N);
}

}  // namespace

std::string_view table_name(Table table) {
  switch (table) {
    case Table::steps: return "steps";
    case Table::ops: return "ops";
    case Table::grads: return "grads";
    case Table::events: return "events";
    case Table::histograms: return "histograms";
    case Table::dumps: return "dumps";
    case Table::dump_values: return "dump_values";
    case Table::index: return "index";
  }
  return "?";
}

std::string table_path(Table table) {
  std::string path = "/";
  path += table_name(table);
  return path;
}

void put_text(char* field, std::size_t width, std::string_view text) {
  if (text.size() < width) {
    std::memcpy(field, text.data(), text.size());
    std::memset(field + text.size(), 0, width - text.size());
    return;
  }
  std::size_t keep = width - 1 - kTruncationMarker.size();
  // Never split a UTF-8 sequence: back up while the first byte cut off continues a character.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  std::memcpy(field, text.data(), keep);
  std::memcpy(field + keep, kTruncationMarker.data(), kTruncationMarker.size());
  std::memset(field + keep + kTruncationMarker.size(), 0, width - keep - kTruncationMarker.size());
}

std::string get_text(const char* field, std::size_t width) { return std::string(field, strnlen(field, width)); }

std::size_t record_size(Table table) {
  switch (table) {
    case Table::steps: return sizeof(StepRecord);
    case Table::ops: return sizeof(OpRecord);
    case Table::grads: return sizeof(GradRecord);
    case Table::events: return sizeof(EventRecord);
    case Table::histograms: return sizeof(HistogramRecord);
    case Table::dumps: return sizeof(DumpRecord);
    case Table::dump_values: return sizeof(double);
    case Table::index: return sizeof(IndexRecord);
  }
  return 0;
}

Datatype record_type(const Io& io, Table table) {
  switch (table) {
    case Table::steps: return step_type(io);
    case Table::ops: return op_type(io);
    case Table::grads: return grad_type(io);
    case Table::events: return event_type(io);
    case Table::histograms: return histogram_type(io);
    case Table::dumps: return dump_type(io);
    case Table::dump_values: return copy_type(io, H5T_IEEE_F64LE);
    case Table::index: return index_type(io);
  }
  io.fail("unknown table");
}

void encode(const StepRow& row, StepRecord& r) {
  r.step = row.step;
  r.loss = row.loss;
  r.scale = row.scale;
  r.scale_after = row.scale_after;
  r.found_inf = row.found_inf;
  r.skipped = row.skipped;
  r.growth_tracker = row.growth_tracker;
  r.grad_norm = row.grad_norm;
  r.lr = row.lr;
  r.time_ms = row.time_ms;
}

void encode(const OpRow& row, OpRecord& r) {
  r.step = row.step;
  r.seq = row.seq;
  put(r.phase, phase_name(row.phase));
  put(r.op, row.op);
  put(r.module, row.module);
  put(r.in_dtypes, row.in_dtypes);
  put(r.out_dtype, row.out_dtype);
  put(r.shape, row.shape);
  put(r.autocast, row.autocast);
  const TensorHealth& h = row.health;
  r.numel = h.numel;
  r.nan = h.nan;
  r.pos_inf = h.pos_inf;
  r.neg_inf = h.neg_inf;
  r.zero = h.zero;
  r.subnormal = h.subnormal;
  r.min = h.min;
  r.max = h.max;
  r.absmax = h.absmax;
  r.mean = h.mean;
  r.rms = h.rms;
  r.cast_overflow = row.cast_overflow;
  r.cast_underflow = row.cast_underflow;
  r.origin = row.origin;
  std::memcpy(r.inputs, row.inputs.data(), sizeof r.inputs);
}

void encode(const GradRow& row, GradRecord& r) {
  r.step = row.step;
  put(r.param, row.param);
  put(r.dtype, row.dtype);
  r.nan = row.nan;
  r.pos_inf = row.pos_inf;
  r.neg_inf = row.neg_inf;
  r.zero = row.zero;
  r.absmax = row.absmax;
  r.norm = row.norm;
  r.unscaled = row.unscaled;
}

void encode(const EventRow& row, EventRecord& r) {
  r.step = row.step;
  r.seq = row.seq;
  put(r.kind, row.kind);
  put(r.op, row.op);
  put(r.module, row.module);
  put(r.detail, row.detail);
}

void encode(const HistogramRow& row, HistogramRecord& r) {
  r.step = row.step;
  r.seq = row.seq;
  put(r.tensor, row.tensor);
  std::memcpy(r.bins, row.bins.data(), sizeof r.bins);
}

void encode(const DumpRow& row, DumpRecord& r) {
  r.step = row.step;
  r.seq = row.seq;
  put(r.op, row.op);
  put(r.module, row.module);
  put(r.tensor, row.tensor);
  put(r.dtype, row.dtype);
  put(r.shape, row.shape);
  r.values_offset = 0;
  r.values_count = static_cast<std::int64_t>(row.values.size());
}

StepRow decode(const StepRecord& r) {
  StepRow row;
  row.step = r.step;
  row.loss = r.loss;
  row.scale = r.scale;
  row.scale_after = r.scale_after;
  row.found_inf = r.found_inf != 0;
  row.skipped = r.skipped != 0;
  row.growth_tracker = r.growth_tracker;
  row.grad_norm = r.grad_norm;
  row.lr = r.lr;
  row.time_ms = r.time_ms;
  return row;
}

OpRow decode(const OpRecord& r) {
  OpRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.phase = parse_phase(get(r.phase));
  row.op = get(r.op);
  row.module = get(r.module);
  row.in_dtypes = get(r.in_dtypes);
  row.out_dtype = get(r.out_dtype);
  row.shape = get(r.shape);
  row.autocast = get(r.autocast);
  TensorHealth& h = row.health;
  h.numel = r.numel;
  h.nan = r.nan;
  h.pos_inf = r.pos_inf;
  h.neg_inf = r.neg_inf;
  h.zero = r.zero;
  h.subnormal = r.subnormal;
  h.min = r.min;
  h.max = r.max;
  h.absmax = r.absmax;
  h.mean = r.mean;
  h.rms = r.rms;
  row.cast_overflow = r.cast_overflow;
  row.cast_underflow = r.cast_underflow;
  row.origin = r.origin != 0;
  std::memcpy(row.inputs.data(), r.inputs, sizeof r.inputs);
  return row;
}

GradRow decode(const GradRecord& r) {
  GradRow row;
  row.step = r.step;
  row.param = get(r.param);
  row.dtype = get(r.dtype);
  row.nan = r.nan;
  row.pos_inf = r.pos_inf;
  row.neg_inf = r.neg_inf;
  row.zero = r.zero;
  row.absmax = r.absmax;
  row.norm = r.norm;
  row.unscaled = r.unscaled != 0;
  return row;
}

EventRow decode(const EventRecord& r) {
  EventRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.kind = get(r.kind);
  row.op = get(r.op);
  row.module = get(r.module);
  row.detail = get(r.detail);
  return row;
}

HistogramRow decode(const HistogramRecord& r) {
  HistogramRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.tensor = get(r.tensor);
  std::memcpy(row.bins.data(), r.bins, sizeof r.bins);
  return row;
}

DumpRow decode(const DumpRecord& r) {
  DumpRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.op = get(r.op);
  row.module = get(r.module);
  row.tensor = get(r.tensor);
  row.dtype = get(r.dtype);
  row.shape = get(r.shape);
  return row;
}

}  // namespace ampscope::trace::detail

namespace ampscope::trace::detail {

std::int64_t index_crc32(const IndexRecord& r) {
  unsigned char bytes[8 * (1 + kDataTableCount)];
  auto put = [&](std::size_t at, std::int64_t v) {
    for (std::size_t b = 0; b < 8; ++b) bytes[at * 8 + b] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * b));
  };
  put(0, r.step);
  for (int t = 0; t < kDataTableCount; ++t) put(1 + static_cast<std::size_t>(t), r.rows[t]);
  return static_cast<std::int64_t>(::crc32(0L, bytes, sizeof bytes));
}

std::int64_t root_attributes_crc32(std::string_view format, std::int64_t version, const RunInfo& info) {
  std::string text;
  auto add = [&](std::string_view name, std::string_view value) {
    text.append(name);
    text.push_back('\0');
    text.append(value);
    text.push_back('\0');
  };
  add("format", format);
  add("format_version", std::to_string(version));
  add("precision", info.precision);
  add("device", info.device);
  add("model", info.model);
  add("seed", std::to_string(info.seed));
  add("config", info.config);
  add("probe", info.probe);
  uLong crc = ::crc32(0L, Z_NULL, 0);
  // zlib's crc32 takes a uInt length: feed it in pieces.
  for (std::size_t at = 0; at < text.size(); at += 1u << 30) {
    const std::size_t n = std::min<std::size_t>(text.size() - at, 1u << 30);
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(text.data() + at), static_cast<uInt>(n));
  }
  return static_cast<std::int64_t>(crc);
}

}  // namespace ampscope::trace::detail
