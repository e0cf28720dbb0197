#include "probes/trace/layout.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <fmt/format.h>

#include "probes/trace/layout_v3.h"

namespace ampscope::trace::detail {
namespace {

// Records are the file's bytes, which are little-endian.
static_assert(std::endian::native == std::endian::little, "trace records assume a little-endian host");
static_assert(sizeof(OpRecord) == 16 + 7 * 8 + 6 * 8 + 5 * 8 + 2 * 8 + 1 + kOpInputs * 8,
              "OpRecord must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(OpRecordV8) == sizeof(OpRecord) && offsetof(OpRecordV8, absmax) == offsetof(OpRecord, absmax_xor),
              "format_version 9 changes only what /ops' absmax field holds");
static_assert(sizeof(IndexRecord) == 8 * (2 + kDataTableCount));
static_assert(sizeof(GradRecord) == 8 * 9 + 2, "GradRecord must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(ChecksumRecord) == 8 * 3, "ChecksumRecord must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(Fp8Record) == 8 * 17, "Fp8Record must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(BlockRecord) == 8 * 27 + 1, "BlockRecord must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(UpdateRecord) == 8 * 8, "UpdateRecord must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(PrecisionRecordV5) == 8 * 6 + 1 + 8 * 8 + 8 + 8 * 2 + 1 + 8 * kErrorBins + 8,
              "PrecisionRecordV5 must be packed: it is the file's compound type byte for byte");
static_assert(sizeof(PrecisionRecord) == sizeof(PrecisionRecordV5) + 8,
              "PrecisionRecord must be packed: it is the file's compound type byte for byte");

#define AMPSCOPE_I64(R, f) b.i64(#f, offsetof(R, f))
#define AMPSCOPE_F64(R, f) b.f64(#f, offsetof(R, f))
#define AMPSCOPE_FLAG(R, f) b.flag(#f, offsetof(R, f))

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

// /ops: format_version 9 (R = OpRecord) stores absmax_xor where 4 to 8 (OpRecordV8) store absmax.
template <class R>
Datatype op_type(const Io& io) {
  CompoundBuilder b(io, sizeof(R), Table::ops);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_I64(R, phase);
  AMPSCOPE_I64(R, op);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, in_dtypes);
  AMPSCOPE_I64(R, out_dtype);
  AMPSCOPE_I64(R, shape);
  AMPSCOPE_I64(R, autocast);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_I64(R, nan);
  AMPSCOPE_I64(R, pos_inf);
  AMPSCOPE_I64(R, neg_inf);
  AMPSCOPE_I64(R, zero);
  AMPSCOPE_I64(R, subnormal);
  AMPSCOPE_F64(R, min);
  AMPSCOPE_F64(R, max);
  if constexpr (std::is_same_v<R, OpRecord>) {
    b.add("absmax_xor", offsetof(R, absmax_xor), H5T_STD_U64LE);
  } else {
    AMPSCOPE_F64(R, absmax);
  }
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
  AMPSCOPE_I64(R, param);
  AMPSCOPE_I64(R, dtype);
  AMPSCOPE_I64(R, nan);
  AMPSCOPE_I64(R, pos_inf);
  AMPSCOPE_I64(R, neg_inf);
  AMPSCOPE_I64(R, zero);
  AMPSCOPE_F64(R, absmax);
  AMPSCOPE_F64(R, norm);
  AMPSCOPE_FLAG(R, unscaled);
  AMPSCOPE_FLAG(R, before_all_reduce);  // format_version 6
  return b.take();
}

Datatype checksum_type(const Io& io) {
  using R = ChecksumRecord;
  CompoundBuilder b(io, sizeof(R), Table::checksums);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, param);
  b.add("checksum", offsetof(R, checksum), H5T_STD_U64LE);
  return b.take();
}

Datatype event_type(const Io& io) {
  using R = EventRecord;
  CompoundBuilder b(io, sizeof(R), Table::events);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_I64(R, kind);
  AMPSCOPE_I64(R, op);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, detail);
  return b.take();
}

Datatype histogram_type(const Io& io) {
  using R = HistogramRecord;
  CompoundBuilder b(io, sizeof(R), Table::histograms);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_I64(R, tensor);
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
  AMPSCOPE_I64(R, op);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, tensor);
  AMPSCOPE_I64(R, dtype);
  AMPSCOPE_I64(R, shape);
  AMPSCOPE_I64(R, values_offset);
  AMPSCOPE_I64(R, values_count);
  return b.take();
}

Datatype string_type(const Io& io) {
  using R = StringRecord;
  CompoundBuilder b(io, sizeof(R), Table::strings);
  AMPSCOPE_I64(R, offset);
  AMPSCOPE_I64(R, length);
  AMPSCOPE_I64(R, crc32);
  return b.take();
}

// /precision: format_version 6 (R = PrecisionRecord) adds phase after the fields of 5 (PrecisionRecordV5).
template <class R>
Datatype precision_type(const Io& io) {
  CompoundBuilder b(io, sizeof(R), Table::precision);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, seq);
  AMPSCOPE_I64(R, op);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, out_dtype);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_FLAG(R, local);
  AMPSCOPE_F64(R, local_max_rel);
  AMPSCOPE_F64(R, local_mean_rel);
  AMPSCOPE_F64(R, local_max_ulp);
  AMPSCOPE_F64(R, acc_max_rel);
  AMPSCOPE_F64(R, acc_mean_rel);
  AMPSCOPE_F64(R, acc_max_ulp);
  AMPSCOPE_F64(R, in_acc_max_rel);
  AMPSCOPE_F64(R, in_acc_mean_rel);
  AMPSCOPE_I64(R, flips);
  AMPSCOPE_F64(R, bits);
  AMPSCOPE_F64(R, cond);
  AMPSCOPE_FLAG(R, followed);
  const hsize_t bins = kErrorBins;
  const Datatype array(io.check(H5Tarray_create2(H5T_STD_I64LE, 1, &bins), "H5Tarray_create2", "/precision"));
  b.add("error_bins", offsetof(R, error_bins), array.get());
  AMPSCOPE_I64(R, exact);
  if constexpr (std::is_same_v<R, PrecisionRecord>) AMPSCOPE_I64(R, phase);
  return b.take();
}

Datatype update_type(const Io& io) {
  using R = UpdateRecord;
  CompoundBuilder b(io, sizeof(R), Table::updates);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, param);
  AMPSCOPE_I64(R, dtype);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_I64(R, nonzero);
  AMPSCOPE_I64(R, swamped);
  AMPSCOPE_F64(R, param_abs_mean);
  AMPSCOPE_F64(R, update_abs_mean);
  return b.take();
}

Datatype fp8_type(const Io& io) {
  using R = Fp8Record;
  CompoundBuilder b(io, sizeof(R), Table::fp8);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, operand);
  AMPSCOPE_I64(R, format);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_I64(R, nonzero);
  AMPSCOPE_I64(R, underflow);
  AMPSCOPE_I64(R, subnormal);
  AMPSCOPE_I64(R, saturated);
  AMPSCOPE_F64(R, amax);
  AMPSCOPE_F64(R, scale);
  AMPSCOPE_F64(R, rel_rms_error);
  AMPSCOPE_F64(R, dynamic_range);
  AMPSCOPE_F64(R, quantized_dynamic_range);
  AMPSCOPE_I64(R, history_len);
  AMPSCOPE_F64(R, history_amax);
  AMPSCOPE_I64(R, history_amax_step);
  return b.take();
}

Datatype block_type(const Io& io) {
  using R = BlockRecord;
  CompoundBuilder b(io, sizeof(R), Table::blocks);
  AMPSCOPE_I64(R, step);
  AMPSCOPE_I64(R, module);
  AMPSCOPE_I64(R, operand);
  AMPSCOPE_I64(R, copy);
  AMPSCOPE_I64(R, format);
  AMPSCOPE_FLAG(R, what_if);
  AMPSCOPE_I64(R, rows);
  AMPSCOPE_I64(R, cols);
  AMPSCOPE_I64(R, numel);
  AMPSCOPE_I64(R, nonzero);
  AMPSCOPE_I64(R, nonfinite);
  AMPSCOPE_I64(R, underflow);
  AMPSCOPE_I64(R, saturated);
  AMPSCOPE_I64(R, blocks);
  AMPSCOPE_I64(R, blocks_clipped);
  AMPSCOPE_I64(R, blocks_nan);
  AMPSCOPE_F64(R, max_block_range);
  AMPSCOPE_I64(R, max_range_block);
  AMPSCOPE_I64(R, max_range_row);
  AMPSCOPE_I64(R, max_range_col);
  AMPSCOPE_I64(R, worst_block);
  AMPSCOPE_I64(R, worst_block_underflow);
  AMPSCOPE_I64(R, worst_block_row);
  AMPSCOPE_I64(R, worst_block_col);
  AMPSCOPE_F64(R, scale_log2_min);
  AMPSCOPE_F64(R, scale_log2_median);
  AMPSCOPE_F64(R, scale_log2_max);
  AMPSCOPE_F64(R, rel_rms_error);
  return b.take();
}

// /index: step, a count per table the version has, then crc32 from format_version 3.
Datatype index_type(const Io& io, std::int64_t version) {
  using R = IndexRecord;
  CompoundBuilder b(io, sizeof(R), Table::index);
  AMPSCOPE_I64(R, step);
  for (int t = 0; t < kDataTableCount; ++t) {
    if (!has_table(static_cast<Table>(t), version)) continue;
    const std::string name(table_name(static_cast<Table>(t)));
    b.i64(name.c_str(), offsetof(R, rows) + sizeof(std::int64_t) * static_cast<std::size_t>(t));
  }
  AMPSCOPE_I64(R, crc32);
  return b.take();
}

#undef AMPSCOPE_I64
#undef AMPSCOPE_F64
#undef AMPSCOPE_FLAG

std::string text_of(const StringTable& strings, TextId id, std::string_view field) {
  return std::string(strings.text(id, field));
}

}  // namespace

CompoundBuilder::CompoundBuilder(const Io& io, std::size_t size, Table table)
    : io_(io), where_(table_path(table)), type_(io.check(H5Tcreate(H5T_COMPOUND, size), "H5Tcreate", where_)),
      bool_(bool_type(io)) {}

void CompoundBuilder::add(const char* name, std::size_t offset, hid_t member) {
  io_.check(H5Tinsert(type_.get(), name, offset, member), "H5Tinsert", where_);
}

void CompoundBuilder::text(const char* name, std::size_t offset, std::size_t width) {
  const Datatype t = fixed_text_type(io_, width);
  add(name, offset, t.get());
}

std::string_view table_name(Table table) {
  switch (table) {
    case Table::steps: return "steps";
    case Table::ops: return "ops";
    case Table::grads: return "grads";
    case Table::events: return "events";
    case Table::histograms: return "histograms";
    case Table::dumps: return "dumps";
    case Table::dump_values: return "dump_values";
    case Table::strings: return "strings";
    case Table::string_bytes: return "string_bytes";
    case Table::precision: return "precision";
    case Table::updates: return "updates";
    case Table::checksums: return "checksums";
    case Table::fp8: return "fp8";
    case Table::blocks: return "blocks";
    case Table::index: return "index";
  }
  return "?";
}

std::string_view field_name(Table table) {
  switch (table) {
    case Table::dump_values: return "value";
    case Table::string_bytes: return "byte";
    default: return "row";
  }
}

std::string table_path(Table table) {
  std::string path = "/";
  path += table_name(table);
  return path;
}

bool has_steps(Table table) {
  return table != Table::dump_values && table != Table::strings && table != Table::string_bytes && table != Table::index;
}

std::string_view text_fields(Table table) {
  switch (table) {
    case Table::ops: return "phase,op,module,in_dtypes,out_dtype,shape,autocast";
    case Table::grads: return "param,dtype";
    case Table::events: return "kind,op,module,detail";
    case Table::histograms: return "tensor";
    case Table::dumps: return "op,module,tensor,dtype,shape";
    case Table::precision: return "op,module,out_dtype,phase";
    case Table::updates: return "param,dtype";
    case Table::checksums: return "param";
    case Table::fp8: return "module,operand,format";
    case Table::blocks: return "module,operand,copy,format";
    default: return "";
  }
}

int data_tables(std::int64_t version) {
  return version >= 8 ? kDataTableCount : version == 7 ? kV7DataTables : version == 6 ? kV6DataTables : version == 5 ? kV5DataTables : version == 4 ? kV4DataTables : kLegacyDataTables;
}

bool has_table(Table table, std::int64_t version) {
  return table == Table::index || static_cast<int>(table) < data_tables(version);
}

std::int64_t crc32_of(const void* data, std::size_t size) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(data);
  // zlib's crc32 takes a uInt length: feed it in pieces.
  for (std::size_t at = 0; at < size; at += 1u << 30) {
    const std::size_t n = std::min<std::size_t>(size - at, 1u << 30);
    crc = ::crc32(crc, bytes + at, static_cast<uInt>(n));
  }
  return static_cast<std::int64_t>(crc);
}

bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1Fu; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0Fu; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07u; }
    else return false;
    if (text.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xC0u) != 0x80u) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

std::string to_utf8(std::string_view text) {
  if (valid_utf8(text)) return std::string(text);
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    // The longest well-formed character starting here (1 to 4 bytes), or U+FFFD for this byte.
    std::size_t n = 0;
    for (std::size_t k = 1; k <= 4 && i + k <= text.size(); ++k) {
      if (valid_utf8(text.substr(i, k))) {
        n = k;
        break;
      }
    }
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::size_t record_size(Table table, std::int64_t version) {
  if (table == Table::index) return 8 * (1 + static_cast<std::size_t>(data_tables(version))) + (version >= 3 ? 8 : 0);
  if (version < 4) {
    if (const std::size_t size = v3::record_size(table); size > 0) return size;
  }
  switch (table) {
    case Table::steps: return sizeof(StepRecord);
    case Table::ops: return sizeof(OpRecord);
    case Table::grads: return sizeof(GradRecord);
    case Table::events: return sizeof(EventRecord);
    case Table::histograms: return sizeof(HistogramRecord);
    case Table::dumps: return sizeof(DumpRecord);
    case Table::dump_values: return sizeof(double);
    case Table::strings: return sizeof(StringRecord);
    case Table::string_bytes: return 1;
    case Table::precision: return version < 6 ? sizeof(PrecisionRecordV5) : sizeof(PrecisionRecord);
    case Table::updates: return sizeof(UpdateRecord);
    case Table::checksums: return sizeof(ChecksumRecord);
    case Table::fp8: return sizeof(Fp8Record);
    case Table::blocks: return sizeof(BlockRecord);
    case Table::index: return sizeof(IndexRecord);
  }
  return 0;
}

Datatype record_type(const Io& io, Table table, std::int64_t version) {
  if (table == Table::index) return index_type(io, version);
  if (version < 4 && v3::record_size(table) > 0) return v3::record_type(io, table);
  switch (table) {
    case Table::steps: return step_type(io);
    case Table::ops: return version < 9 ? op_type<OpRecordV8>(io) : op_type<OpRecord>(io);
    case Table::grads: return grad_type(io);
    case Table::events: return event_type(io);
    case Table::histograms: return histogram_type(io);
    case Table::dumps: return dump_type(io);
    case Table::dump_values: return copy_type(io, H5T_IEEE_F64LE);
    case Table::strings: return string_type(io);
    case Table::string_bytes: return copy_type(io, H5T_STD_U8LE);
    case Table::precision:
      return version < 6 ? precision_type<PrecisionRecordV5>(io) : precision_type<PrecisionRecord>(io);
    case Table::updates: return update_type(io);
    case Table::checksums: return checksum_type(io);
    case Table::fp8: return fp8_type(io);
    case Table::blocks: return block_type(io);
    case Table::index: break;
  }
  io.fail("unknown table");
}

// --- the string table ---

void StringTable::append(const StringRecord* records, std::size_t count) {
  const auto held = static_cast<std::int64_t>(bytes_.size());
  for (std::size_t i = 0; i < count; ++i) {
    const StringRecord& r = records[i];
    Entry e{r.offset, r.length, nullptr};
    if (r.offset < 0 || r.length < 0 || r.offset > held || r.length > held - r.offset) {
      e.damage = "its bytes lie outside '/string_bytes'";
    } else {
      const std::string_view text(bytes_.data() + r.offset, static_cast<std::size_t>(r.length));
      if (crc32_of(text.data(), text.size()) != r.crc32) e.damage = "its checksum does not match its text";
      else if (!valid_utf8(text)) e.damage = "its text is not UTF-8";
    }
    if (e.damage != nullptr && damaged_++ == 0) first_damage_ = fmt::format("string {}: {}", entries_.size(), e.damage);
    entries_.push_back(e);
  }
}

void StringTable::refuse(TextId id, std::string_view field) const {
  if (id < 0 || static_cast<std::uint64_t>(id) >= entries_.size()) {
    throw std::invalid_argument(
        fmt::format("its field '{}' names string {}, but '/strings' holds {} strings", field, id, entries_.size()));
  }
  const Entry& e = entries_[static_cast<std::size_t>(id)];
  throw std::invalid_argument(fmt::format("its field '{}' names string {} of '/strings', which is damaged: {}", field, id, e.damage));
}

// --- rows ---

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

void encode(const OpRow& row, OpRecord& r, TextIds& ids) {
  r.step = row.step;
  r.seq = row.seq;
  r.phase = ids.id(phase_name(row.phase));
  r.op = ids.id(row.op);
  r.module = ids.id(row.module);
  r.in_dtypes = ids.id(row.in_dtypes);
  r.out_dtype = ids.id(row.out_dtype);
  r.shape = ids.id(row.shape);
  r.autocast = ids.id(row.autocast);
  const TensorHealth& h = row.health;
  r.numel = h.numel;
  r.nan = h.nan;
  r.pos_inf = h.pos_inf;
  r.neg_inf = h.neg_inf;
  r.zero = h.zero;
  r.subnormal = h.subnormal;
  r.min = h.min;
  r.max = h.max;
  r.absmax_xor = std::bit_cast<std::uint64_t>(h.absmax) ^ derived_absmax_bits(h.min, h.max);
  r.mean = h.mean;
  r.rms = h.rms;
  r.cast_overflow = row.cast_overflow;
  r.cast_underflow = row.cast_underflow;
  r.origin = row.origin;
  std::memcpy(r.inputs, row.inputs.data(), sizeof r.inputs);
}

void encode(const GradRow& row, GradRecord& r, TextIds& ids) {
  r.step = row.step;
  r.param = ids.id(row.param);
  r.dtype = ids.id(row.dtype);
  r.nan = row.nan;
  r.pos_inf = row.pos_inf;
  r.neg_inf = row.neg_inf;
  r.zero = row.zero;
  r.absmax = row.absmax;
  r.norm = row.norm;
  r.unscaled = row.unscaled;
  r.before_all_reduce = row.before_all_reduce;
}

void encode(const EventRow& row, EventRecord& r, TextIds& ids) {
  r.step = row.step;
  r.seq = row.seq;
  r.kind = ids.id(row.kind);
  r.op = ids.id(row.op);
  r.module = ids.id(row.module);
  r.detail = ids.id(row.detail);
}

void encode(const HistogramRow& row, HistogramRecord& r, TextIds& ids) {
  r.step = row.step;
  r.seq = row.seq;
  r.tensor = ids.id(row.tensor);
  std::memcpy(r.bins, row.bins.data(), sizeof r.bins);
}

void encode(const DumpRow& row, DumpRecord& r, TextIds& ids) {
  r.step = row.step;
  r.seq = row.seq;
  r.op = ids.id(row.op);
  r.module = ids.id(row.module);
  r.tensor = ids.id(row.tensor);
  r.dtype = ids.id(row.dtype);
  r.shape = ids.id(row.shape);
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

OpRow decode(const OpRecord& r, const StringTable& s) {
  OpRow row;
  decode(r, s, row);
  return row;
}

namespace {
template <class R>
void decode_op(const R& r, const StringTable& s, OpRow& row, const OpTexts& texts) {
  row.step = r.step;
  row.seq = r.seq;
  row.phase = parse_phase(s.text(r.phase, "phase"));
  // assign, not a new string: a text longer than the small-string buffer reuses the row's memory. A text not asked
  // for is not looked up either (nor checked: its id may name a damaged string unnoticed).
  auto text = [&](bool wanted, std::string& field, TextId id, std::string_view name) {
    if (wanted) {
      field.assign(s.text(id, name));
    } else {
      field.clear();
    }
  };
  text(texts.op, row.op, r.op, "op");
  text(texts.module, row.module, r.module, "module");
  text(texts.in_dtypes, row.in_dtypes, r.in_dtypes, "in_dtypes");
  text(texts.out_dtype, row.out_dtype, r.out_dtype, "out_dtype");
  text(texts.shape, row.shape, r.shape, "shape");
  text(texts.autocast, row.autocast, r.autocast, "autocast");
  TensorHealth& h = row.health;
  h.numel = r.numel;
  h.nan = r.nan;
  h.pos_inf = r.pos_inf;
  h.neg_inf = r.neg_inf;
  h.zero = r.zero;
  h.subnormal = r.subnormal;
  h.min = r.min;
  h.max = r.max;
  if constexpr (std::is_same_v<R, OpRecord>) {
    h.absmax = std::bit_cast<double>(r.absmax_xor ^ derived_absmax_bits(r.min, r.max));
  } else {
    h.absmax = r.absmax;
  }
  h.mean = r.mean;
  h.rms = r.rms;
  row.cast_overflow = r.cast_overflow;
  row.cast_underflow = r.cast_underflow;
  row.origin = r.origin != 0;
  std::memcpy(row.inputs.data(), r.inputs, sizeof r.inputs);
}
}  // namespace

void decode(const OpRecord& r, const StringTable& s, OpRow& row, const OpTexts& texts) { decode_op(r, s, row, texts); }
void decode(const OpRecordV8& r, const StringTable& s, OpRow& row, const OpTexts& texts) { decode_op(r, s, row, texts); }

GradRow decode(const GradRecord& r, const StringTable& s) {
  GradRow row;
  row.step = r.step;
  row.param = text_of(s, r.param, "param");
  row.dtype = text_of(s, r.dtype, "dtype");
  row.nan = r.nan;
  row.pos_inf = r.pos_inf;
  row.neg_inf = r.neg_inf;
  row.zero = r.zero;
  row.absmax = r.absmax;
  row.norm = r.norm;
  row.unscaled = r.unscaled != 0;
  if (r.before_all_reduce != 0 && r.before_all_reduce != 1) {
    throw std::invalid_argument(fmt::format("its field 'before_all_reduce' is {}, not a flag (0 or 1)", r.before_all_reduce));
  }
  row.before_all_reduce = r.before_all_reduce == 1;
  return row;
}

EventRow decode(const EventRecord& r, const StringTable& s) {
  EventRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.kind = text_of(s, r.kind, "kind");
  row.op = text_of(s, r.op, "op");
  row.module = text_of(s, r.module, "module");
  row.detail = text_of(s, r.detail, "detail");
  return row;
}

HistogramRow decode(const HistogramRecord& r, const StringTable& s) {
  HistogramRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.tensor = text_of(s, r.tensor, "tensor");
  std::memcpy(row.bins.data(), r.bins, sizeof r.bins);
  return row;
}

DumpRow decode(const DumpRecord& r, const StringTable& s) {
  DumpRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.op = text_of(s, r.op, "op");
  row.module = text_of(s, r.module, "module");
  row.tensor = text_of(s, r.tensor, "tensor");
  row.dtype = text_of(s, r.dtype, "dtype");
  row.shape = text_of(s, r.shape, "shape");
  return row;
}

void encode(const PrecisionRow& row, PrecisionRecord& r, TextIds& ids) {
  r.step = row.step;
  r.seq = row.seq;
  r.op = ids.id(row.op);
  r.module = ids.id(row.module);
  r.out_dtype = ids.id(row.out_dtype);
  r.numel = row.numel;
  r.local = row.local;
  r.local_max_rel = row.local_max_rel;
  r.local_mean_rel = row.local_mean_rel;
  r.local_max_ulp = row.local_max_ulp;
  r.acc_max_rel = row.acc_max_rel;
  r.acc_mean_rel = row.acc_mean_rel;
  r.acc_max_ulp = row.acc_max_ulp;
  r.in_acc_max_rel = row.in_acc_max_rel;
  r.in_acc_mean_rel = row.in_acc_mean_rel;
  r.flips = row.flips;
  r.bits = row.bits;
  r.cond = row.cond;
  r.followed = row.followed;
  for (int i = 0; i < kErrorBins; ++i) r.error_bins[i] = row.error_bins[static_cast<std::size_t>(i)];
  r.exact = row.exact;
  r.phase = ids.id(phase_name(row.phase));
}

namespace {
// A flag field of a record: 0 or 1.
bool flag_of(std::int8_t v, std::string_view field) {
  if (v != 0 && v != 1) throw std::invalid_argument(fmt::format("its field '{}' is {}, not a flag (0 or 1)", field, v));
  return v == 1;
}
// An error measure or a bit count: 0 or more (+inf included), never NaN.
double measure_of(double v, std::string_view field) {
  if (!(v >= 0)) throw std::invalid_argument(fmt::format("its field '{}' is {}, not a non-negative number", field, v));
  return v;
}
std::int64_t count_of(std::int64_t v, std::string_view field) {
  if (v < 0) throw std::invalid_argument(fmt::format("its field '{}' is {}, not a count (0 or more)", field, v));
  return v;
}
}  // namespace

namespace {
template <class R>
PrecisionRow decode_precision(const R& r, const StringTable& s) {
  PrecisionRow row;
  row.step = r.step;
  row.seq = r.seq;
  row.op = text_of(s, r.op, "op");
  row.module = text_of(s, r.module, "module");
  row.out_dtype = text_of(s, r.out_dtype, "out_dtype");
  if (row.out_dtype != "f16" && row.out_dtype != "bf16" && row.out_dtype != "f32" && row.out_dtype != "f64") {
    throw std::invalid_argument(
        fmt::format("its field 'out_dtype' is '{}', not a floating dtype (f16, bf16, f32, f64)", row.out_dtype));
  }
  row.numel = count_of(r.numel, "numel");
  row.local = flag_of(r.local, "local");
  row.local_max_rel = measure_of(r.local_max_rel, "local_max_rel");
  row.local_mean_rel = measure_of(r.local_mean_rel, "local_mean_rel");
  row.local_max_ulp = measure_of(r.local_max_ulp, "local_max_ulp");
  row.acc_max_rel = measure_of(r.acc_max_rel, "acc_max_rel");
  row.acc_mean_rel = measure_of(r.acc_mean_rel, "acc_mean_rel");
  row.acc_max_ulp = measure_of(r.acc_max_ulp, "acc_max_ulp");
  row.in_acc_max_rel = measure_of(r.in_acc_max_rel, "in_acc_max_rel");
  row.in_acc_mean_rel = measure_of(r.in_acc_mean_rel, "in_acc_mean_rel");
  row.flips = count_of(r.flips, "flips");
  row.bits = measure_of(r.bits, "bits");
  if (r.cond < 0) throw std::invalid_argument(fmt::format("its field 'cond' is {}, not a condition number (NaN or 0 or more)", r.cond));
  row.cond = r.cond;
  row.followed = flag_of(r.followed, "followed");
  // The histogram counts each element once at most: its counts are counts, and with flips add up to numel or less.
  std::int64_t total = row.flips;
  for (int i = 0; i < kErrorBins; ++i) {
    const std::int64_t n = r.error_bins[i];
    if (n < 0) throw std::invalid_argument(fmt::format("its field 'error_bins' has {} at bucket {}, not a count (0 or more)", n, i));
    row.error_bins[static_cast<std::size_t>(i)] = n;
    total = n > row.numel - total ? row.numel + 1 : total + n;
  }
  row.exact = count_of(r.exact, "exact");
  total = row.exact > row.numel - total ? row.numel + 1 : total + row.exact;
  if (total > row.numel) {
    throw std::invalid_argument(fmt::format(
        "its fields 'error_bins', 'exact' and 'flips' count more elements than its numel ({}): each element is counted once",
        row.numel));
  }
  return row;
}
}  // namespace

PrecisionRow decode(const PrecisionRecordV5& r, const StringTable& s) { return decode_precision(r, s); }

PrecisionRow decode(const PrecisionRecord& r, const StringTable& s) {
  PrecisionRow row = decode_precision(r, s);
  row.phase = parse_phase(s.text(r.phase, "phase"));
  if (row.phase != Phase::forward && row.phase != Phase::backward) {
    throw std::invalid_argument(fmt::format("its field 'phase' is '{}', not forward or backward", phase_name(row.phase)));
  }
  return row;
}

void encode(const UpdateRow& row, UpdateRecord& r, TextIds& ids) {
  r.step = row.step;
  r.param = ids.id(row.param);
  r.dtype = ids.id(row.dtype);
  r.numel = row.numel;
  r.nonzero = row.nonzero;
  r.swamped = row.swamped;
  r.param_abs_mean = row.param_abs_mean;
  r.update_abs_mean = row.update_abs_mean;
}

UpdateRow decode(const UpdateRecord& r, const StringTable& s) {
  UpdateRow row;
  row.step = r.step;
  row.param = text_of(s, r.param, "param");
  row.dtype = text_of(s, r.dtype, "dtype");
  if (row.dtype != "f16" && row.dtype != "bf16") {
    throw std::invalid_argument(fmt::format("its field 'dtype' is '{}', not f16 or bf16", row.dtype));
  }
  row.numel = count_of(r.numel, "numel");
  row.nonzero = count_of(r.nonzero, "nonzero");
  row.swamped = count_of(r.swamped, "swamped");
  if (row.nonzero > row.numel) {
    throw std::invalid_argument(fmt::format("its field 'nonzero' is {}, more than numel ({})", row.nonzero, row.numel));
  }
  if (row.swamped > row.nonzero) {
    throw std::invalid_argument(fmt::format("its field 'swamped' is {}, more than nonzero ({})", row.swamped, row.nonzero));
  }
  for (const auto& [v, field] : {std::pair{r.param_abs_mean, "param_abs_mean"}, std::pair{r.update_abs_mean, "update_abs_mean"}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      throw std::invalid_argument(fmt::format("its field '{}' is {}, not a finite non-negative number", field, v));
    }
  }
  row.param_abs_mean = r.param_abs_mean;
  row.update_abs_mean = r.update_abs_mean;
  return row;
}

void encode(const ChecksumRow& row, ChecksumRecord& r, TextIds& ids) {
  r.step = row.step;
  r.param = ids.id(row.param);
  r.checksum = row.checksum;
}

ChecksumRow decode(const ChecksumRecord& r, const StringTable& s) {
  ChecksumRow row;
  row.step = r.step;
  row.param = text_of(s, r.param, "param");
  row.checksum = r.checksum;
  return row;
}

void encode(const Fp8Row& row, Fp8Record& r, TextIds& ids) {
  r.step = row.step;
  r.module = ids.id(row.module);
  r.operand = ids.id(row.operand);
  r.format = ids.id(row.format);
  r.numel = row.numel;
  r.nonzero = row.nonzero;
  r.underflow = row.underflow;
  r.subnormal = row.subnormal;
  r.saturated = row.saturated;
  r.amax = row.amax;
  r.scale = row.scale;
  r.rel_rms_error = row.rel_rms_error;
  r.dynamic_range = row.dynamic_range;
  r.quantized_dynamic_range = row.quantized_dynamic_range;
  r.history_len = row.history_len;
  r.history_amax = row.history_amax;
  r.history_amax_step = row.history_amax_step;
}

Fp8Row decode(const Fp8Record& r, const StringTable& s) {
  Fp8Row row;
  row.step = r.step;
  row.module = text_of(s, r.module, "module");
  row.operand = text_of(s, r.operand, "operand");
  if (row.operand != "input" && row.operand != "weight" && row.operand != "grad_output") {
    throw std::invalid_argument(fmt::format("its field 'operand' is \"{}\", not input, weight or grad_output", row.operand));
  }
  row.format = text_of(s, r.format, "format");
  if (row.format != "e4m3" && row.format != "e5m2") {
    throw std::invalid_argument(fmt::format("its field 'format' is \"{}\", not e4m3 or e5m2", row.format));
  }
  if (r.numel < 0) throw std::invalid_argument(fmt::format("its field 'numel' is {}, a negative count", r.numel));
  if (r.nonzero < 0 || r.nonzero > r.numel) {
    throw std::invalid_argument(fmt::format("its field 'nonzero' is {}, not between 0 and numel ({})", r.nonzero, r.numel));
  }
  for (const auto& [field, v] : {std::pair<const char*, std::int64_t>{"underflow", r.underflow}, {"subnormal", r.subnormal},
                                 {"saturated", r.saturated}}) {
    if (v < 0 || v > r.nonzero) {
      throw std::invalid_argument(fmt::format("its field '{}' is {}, not between 0 and nonzero ({})", field, v, r.nonzero));
    }
  }
  if (r.underflow + r.subnormal + r.saturated > r.nonzero) {
    throw std::invalid_argument(fmt::format("its fields underflow, subnormal and saturated add up to {}, more than nonzero ({})",
                                            r.underflow + r.subnormal + r.saturated, r.nonzero));
  }
  for (const auto& [field, v] : {std::pair<const char*, double>{"scale", r.scale}, {"rel_rms_error", r.rel_rms_error}}) {
    if (!(v >= 0)) throw std::invalid_argument(fmt::format("its field '{}' is {}, not a non-negative number", field, v));
  }
  row.numel = r.numel;
  row.nonzero = r.nonzero;
  row.underflow = r.underflow;
  row.subnormal = r.subnormal;
  row.saturated = r.saturated;
  row.amax = r.amax;
  row.scale = r.scale;
  row.rel_rms_error = r.rel_rms_error;
  // The optional columns: history_len -1 is what the reader leaves in a record whose file lacks them
  // (blank_record); such a row keeps Fp8Row's "not recorded" values.
  if (r.history_len == -1) return row;
  for (const auto& [field, v] : {std::pair<const char*, double>{"dynamic_range", r.dynamic_range},
                                 {"quantized_dynamic_range", r.quantized_dynamic_range}}) {
    if (!(v >= 0)) throw std::invalid_argument(fmt::format("its field '{}' is {}, not a non-negative number", field, v));
  }
  if (r.history_len < 0) {
    throw std::invalid_argument(fmt::format("its field 'history_len' is {}, neither a length (0 or more) nor -1", r.history_len));
  }
  if (r.history_amax < 0) {
    throw std::invalid_argument(fmt::format("its field 'history_amax' is {}, a negative amax", r.history_amax));
  }
  if (r.history_amax_step < -1 || r.history_amax_step > r.step) {
    throw std::invalid_argument(fmt::format("its field 'history_amax_step' is {}, neither -1 nor a step up to the row's ({})",
                                            r.history_amax_step, r.step));
  }
  row.dynamic_range = r.dynamic_range;
  row.quantized_dynamic_range = r.quantized_dynamic_range;
  row.history_len = r.history_len;
  row.history_amax = r.history_amax;
  row.history_amax_step = r.history_amax_step;
  return row;
}

void encode(const BlockRow& row, BlockRecord& r, TextIds& ids) {
  r.step = row.step;
  r.module = ids.id(row.module);
  r.operand = ids.id(row.operand);
  r.copy = ids.id(row.copy);
  r.format = ids.id(row.format);
  r.what_if = row.what_if ? 1 : 0;
  r.rows = row.rows;
  r.cols = row.cols;
  r.numel = row.numel;
  r.nonzero = row.nonzero;
  r.nonfinite = row.nonfinite;
  r.underflow = row.underflow;
  r.saturated = row.saturated;
  r.blocks = row.blocks;
  r.blocks_clipped = row.blocks_clipped;
  r.blocks_nan = row.blocks_nan;
  r.max_block_range = row.max_block_range;
  r.max_range_block = row.max_range_block;
  r.max_range_row = row.max_range_row;
  r.max_range_col = row.max_range_col;
  r.worst_block = row.worst_block;
  r.worst_block_underflow = row.worst_block_underflow;
  r.worst_block_row = row.worst_block_row;
  r.worst_block_col = row.worst_block_col;
  r.scale_log2_min = row.scale_log2_min;
  r.scale_log2_median = row.scale_log2_median;
  r.scale_log2_max = row.scale_log2_max;
  r.rel_rms_error = row.rel_rms_error;
}

namespace {

// A block number and its origin: -1 with -1, -1, or a block of the copy whose origin lies in the matrix or is -1, -1
// (not placed: the probe did not know the copy's layout, probes/stats.h block_place).
void check_block(const BlockRecord& r, const char* block_field, std::int64_t block, const char* row_field, std::int64_t row,
                 const char* col_field, std::int64_t col) {
  if (block < -1 || block >= r.blocks) {
    throw std::invalid_argument(fmt::format("its field '{}' is {}, neither -1 nor one of the row's {} blocks", block_field, block, r.blocks));
  }
  if (block == -1) {
    if (row != -1 || col != -1) {
      throw std::invalid_argument(fmt::format("its fields '{}' and '{}' are {} and {}, not -1 with {} -1", row_field, col_field,
                                              row, col, block_field));
    }
    return;
  }
  if (row == -1 && col == -1) return;
  if (row < 0 || row >= r.rows || col < 0 || col >= r.cols) {
    throw std::invalid_argument(fmt::format("its fields '{}' and '{}' are {} and {}, outside the {} x {} matrix", row_field,
                                            col_field, row, col, r.rows, r.cols));
  }
}

}  // namespace

BlockRow decode(const BlockRecord& r, const StringTable& s) {
  BlockRow row;
  row.step = r.step;
  row.module = text_of(s, r.module, "module");
  row.operand = text_of(s, r.operand, "operand");
  if (row.operand != "input" && row.operand != "weight" && row.operand != "grad_output") {
    throw std::invalid_argument(fmt::format("its field 'operand' is \"{}\", not input, weight or grad_output", row.operand));
  }
  row.copy = text_of(s, r.copy, "copy");
  if (row.copy != "rowwise" && row.copy != "columnwise") {
    throw std::invalid_argument(fmt::format("its field 'copy' is \"{}\", not rowwise or columnwise", row.copy));
  }
  row.format = text_of(s, r.format, "format");
  if (row.format != "mxfp8" && row.format != "nvfp4") {
    throw std::invalid_argument(fmt::format("its field 'format' is \"{}\", not mxfp8 or nvfp4", row.format));
  }
  if (r.what_if != 0 && r.what_if != 1) {
    throw std::invalid_argument(fmt::format("its field 'what_if' is {}, not 0 or 1", static_cast<int>(r.what_if)));
  }
  for (const auto& [field, v] : {std::pair<const char*, std::int64_t>{"rows", r.rows}, {"cols", r.cols}, {"numel", r.numel},
                                 {"nonzero", r.nonzero}, {"nonfinite", r.nonfinite}, {"underflow", r.underflow},
                                 {"saturated", r.saturated}, {"blocks", r.blocks}, {"blocks_clipped", r.blocks_clipped},
                                 {"blocks_nan", r.blocks_nan}, {"worst_block_underflow", r.worst_block_underflow}}) {
    if (v < 0) throw std::invalid_argument(fmt::format("its field '{}' is {}, a negative count", field, v));
  }
  // rows * cols without overflow: numel is a count of values held in memory, far below 2^63.
  if ((r.cols != 0 && r.rows > r.numel / r.cols) || r.rows * r.cols != r.numel) {
    throw std::invalid_argument(fmt::format("its field 'numel' is {}, not rows x cols ({} x {})", r.numel, r.rows, r.cols));
  }
  if (r.nonzero > r.numel - r.nonfinite) {
    throw std::invalid_argument(fmt::format("its fields nonzero and nonfinite add up to more than numel ({} + {} > {})", r.nonzero,
                                            r.nonfinite, r.numel));
  }
  if (r.underflow > r.nonzero - r.saturated) {
    throw std::invalid_argument(fmt::format("its fields underflow and saturated add up to more than nonzero ({} + {} > {})",
                                            r.underflow, r.saturated, r.nonzero));
  }
  if (r.blocks > r.numel) throw std::invalid_argument(fmt::format("its field 'blocks' is {}, more than numel ({})", r.blocks, r.numel));
  for (const auto& [field, v] : {std::pair<const char*, std::int64_t>{"blocks_clipped", r.blocks_clipped}, {"blocks_nan", r.blocks_nan}}) {
    if (v > r.blocks) throw std::invalid_argument(fmt::format("its field '{}' is {}, more than blocks ({})", field, v, r.blocks));
  }
  check_block(r, "max_range_block", r.max_range_block, "max_range_row", r.max_range_row, "max_range_col", r.max_range_col);
  check_block(r, "worst_block", r.worst_block, "worst_block_row", r.worst_block_row, "worst_block_col", r.worst_block_col);
  if (r.worst_block_underflow > r.underflow || (r.worst_block == -1) != (r.worst_block_underflow == 0)) {
    throw std::invalid_argument(fmt::format("its field 'worst_block_underflow' is {}, not between 1 and underflow ({}) with a "
                                            "worst_block, nor 0 without one",
                                            r.worst_block_underflow, r.underflow));
  }
  for (const auto& [field, v] : {std::pair<const char*, double>{"max_block_range", r.max_block_range}, {"rel_rms_error", r.rel_rms_error}}) {
    if (!(v >= 0) || std::isinf(v)) {
      throw std::invalid_argument(fmt::format("its field '{}' is {}, not a finite non-negative number", field, v));
    }
  }
  const double lo = r.scale_log2_min, mid = r.scale_log2_median, hi = r.scale_log2_max;
  const int nans = std::isnan(lo) + std::isnan(mid) + std::isnan(hi);
  if (nans != 0 && nans != 3) {
    throw std::invalid_argument(fmt::format("its fields scale_log2_min, scale_log2_median and scale_log2_max are {}, {} and {}: "
                                            "NaN beside numbers",
                                            lo, mid, hi));
  }
  if (nans == 0 && (!(lo <= mid && mid <= hi) || hi == std::numeric_limits<double>::infinity())) {
    throw std::invalid_argument(fmt::format("its fields scale_log2_min, scale_log2_median and scale_log2_max are {}, {} and {}: "
                                            "not in order below +inf",
                                            lo, mid, hi));
  }
  row.what_if = r.what_if != 0;
  row.rows = r.rows;
  row.cols = r.cols;
  row.numel = r.numel;
  row.nonzero = r.nonzero;
  row.nonfinite = r.nonfinite;
  row.underflow = r.underflow;
  row.saturated = r.saturated;
  row.blocks = r.blocks;
  row.blocks_clipped = r.blocks_clipped;
  row.blocks_nan = r.blocks_nan;
  row.max_block_range = r.max_block_range;
  row.max_range_block = r.max_range_block;
  row.max_range_row = r.max_range_row;
  row.max_range_col = r.max_range_col;
  row.worst_block = r.worst_block;
  row.worst_block_underflow = r.worst_block_underflow;
  row.worst_block_row = r.worst_block_row;
  row.worst_block_col = r.worst_block_col;
  row.scale_log2_min = lo;
  row.scale_log2_median = mid;
  row.scale_log2_max = hi;
  row.rel_rms_error = r.rel_rms_error;
  return row;
}

// --- checksums ---

std::int64_t index_crc32(const IndexRecord& r, std::int64_t version) {
  const int tables = data_tables(version);
  unsigned char bytes[8 * (1 + kDataTableCount)];
  auto put = [&](std::size_t at, std::int64_t v) {
    for (std::size_t b = 0; b < 8; ++b) bytes[at * 8 + b] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * b));
  };
  put(0, r.step);
  for (int t = 0; t < tables; ++t) put(1 + static_cast<std::size_t>(t), r.rows[t]);
  return crc32_of(bytes, 8 * (1 + static_cast<std::size_t>(tables)));
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
  return crc32_of(text.data(), text.size());
}

}  // namespace ampscope::trace::detail
