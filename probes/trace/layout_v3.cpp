#include "probes/trace/layout_v3.h"

#include <cstring>

#include "probes/trace/layout.h"

namespace ampscope::trace::detail::v3 {
namespace {

static_assert(sizeof(OpRecord) == 16 + kPhaseWidth + kOpWidth + kModuleWidth + kDTypesWidth + kDTypeWidth + kShapeWidth +
                                      kReasonWidth + 6 * 8 + 5 * 8 + 2 * 8 + 1 + kOpInputs * 8,
              "OpRecord must be packed: it is the file's compound type byte for byte");

#define AMPSCOPE_I64(R, f) b.i64(#f, offsetof(R, f))
#define AMPSCOPE_F64(R, f) b.f64(#f, offsetof(R, f))
#define AMPSCOPE_FLAG(R, f) b.flag(#f, offsetof(R, f))
#define AMPSCOPE_TEXT(R, f) b.text(#f, offsetof(R, f), sizeof(R::f))

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

#undef AMPSCOPE_I64
#undef AMPSCOPE_F64
#undef AMPSCOPE_FLAG
#undef AMPSCOPE_TEXT

template <std::size_t N>
std::string get(const char (&field)[N]) {
  return get_text(field, N);
}

}  // namespace

std::string get_text(const char* field, std::size_t width) { return std::string(field, strnlen(field, width)); }

std::size_t record_size(Table table) {
  switch (table) {
    case Table::ops: return sizeof(OpRecord);
    case Table::grads: return sizeof(GradRecord);
    case Table::events: return sizeof(EventRecord);
    case Table::histograms: return sizeof(HistogramRecord);
    case Table::dumps: return sizeof(DumpRecord);
    default: return 0;
  }
}

Datatype record_type(const Io& io, Table table) {
  switch (table) {
    case Table::ops: return op_type(io);
    case Table::grads: return grad_type(io);
    case Table::events: return event_type(io);
    case Table::histograms: return histogram_type(io);
    case Table::dumps: return dump_type(io);
    default: io.fail("no format_version 3 layout of this table");
  }
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

}  // namespace ampscope::trace::detail::v3
