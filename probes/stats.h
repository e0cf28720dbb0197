// probes/stats.h: what the probe measures in a tensor, in one pass over its elements: counts of NaN,
// +inf, -inf, zero and subnormal values, min/max/absmax/mean/rms of the finite values (accumulated in
// double), the exponent histogram of trace_schema.h, and what a cast did (finite values that became
// inf, non-zero values that became zero).
//
//   TensorStats s = tensor_stats(x, /*with_histogram=*/true);
//   if (s.health.pos_inf > 0) fmt::print("{} +inf, absmax of the rest {}\n", s.health.pos_inf, s.health.absmax);
//   CastCounts c = cast_counts(x, x.to(DType::f16));   // c.overflow: values >= 65520 in magnitude
//
// Subnormal means subnormal in the tensor's own dtype: below 2^-14 in magnitude for f16, 2^-126 for
// bf16 and f32, 2^-1022 for f64. CPU tensors are read in place (strided views too, element by
// element in row-major order) and split over the CPU backend's threads when large.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "probes/trace/schema.h"

namespace ampscope::probe {

struct TensorStats {
  trace::TensorHealth health;
  // Sum of the squares of the finite values, in double: rms^2 * finite count, kept exact for norms.
  double sum_sq = 0;
  std::array<std::int64_t, trace::kHistBins> histogram{};  // all zero unless asked for

  std::int64_t non_finite() const { return health.nan + health.pos_inf + health.neg_inf; }
  // torch.linalg.vector_norm: NaN if any value is NaN, else inf if any is infinite, else the L2 norm.
  double norm() const;
};

// One pass over `t` (any dtype; integer and bool tensors have no NaN, inf or subnormal values). Undefined
// or empty tensors give numel 0 and NaN moments. A view whose elements fill a block of memory without gaps
// or overlaps (a transpose or permute of a contiguous tensor) is read in memory order (in_memory_order), so
// it has the same statistics, bits included, as the contiguous tensor it permutes; other views are read in
// their own (row-major) order.
TensorStats tensor_stats(const Tensor& t, bool with_histogram = false);

// `t` with its dimensions permuted into memory order (strides descending) when that permutation is
// contiguous: the same values, laid out as a contiguous tensor of the same storage offset. Otherwise (already
// contiguous, a broadcast, a slice with gaps, overlapping strides) `t` itself.
Tensor in_memory_order(const Tensor& t);

// The builds of tensor_stats' loop over contiguous f32, f16 and bf16 values without a histogram (stats.cpp): the
// baseline (SSE2 on x86-64), AVX2 (with F16C and FMA) and AVX-512 (F, VL, BW, DQ). They add the same values in
// the same order, so every build gives the same bits; the widest the CPU supports runs. For tests and benchmarks:
// supported_stats_loops() lists this CPU's builds, narrowest first (baseline always), and set_stats_loop chooses
// one for the whole process and returns the one before (an Error naming it when the CPU cannot run it).
enum class StatsLoop { baseline, avx2, avx512 };
std::vector<StatsLoop> supported_stats_loops();
StatsLoop set_stats_loop(StatsLoop loop);
std::string_view stats_loop_name(StatsLoop loop);  // "baseline", "avx2", "avx512"

// The histogram bin of a value stored in `dtype`: floor(log2 |v|) + 64 for exponents -64 .. 63 (larger
// values go to the top bin), then the subnormal bin (values subnormal in `dtype`, and anything below
// 2^-64), zero, inf (either sign) and NaN. Bin indices are those of trace::HistogramRow::bins.
int histogram_bin(double value, DType dtype);
inline constexpr int kSubnormalBin = trace::kHistMaxExponent - trace::kHistMinExponent + 1;
inline constexpr int kZeroBin = kSubnormalBin + 1;
inline constexpr int kInfBin = kSubnormalBin + 2;
inline constexpr int kNanBin = kSubnormalBin + 3;

// The smallest positive normal value of a floating dtype (0 for integer dtypes).
double smallest_normal(DType dtype);

// What casting `source` into `result` (same shape) lost: finite values that became +-inf (overflow) and
// non-zero finite values that became zero (underflow). Only floating results count; a cast to an integer
// dtype truncates rather than underflows, and gives zeros.
struct CastCounts {
  std::int64_t overflow = 0;
  std::int64_t underflow = 0;
};
CastCounts cast_counts(const Tensor& source, const Tensor& result);

// Parameter checksums (/checksums, docs/trace-format.md): a 64-bit checksum of `size` bytes. The bytes are taken
// as 64-bit little-endian words w_i (the last one padded with zero bytes), and
//   checksum = mix(size) + sum over i of mix(w_i + (i + 1) * 0x9E3779B97F4A7C15)   (mod 2^64)
// with mix the finalizer of splitmix64 (a bijection of 64-bit values). A change confined to one word therefore
// always changes the checksum (one term changes, the others do not); independent changes in several words
// collide with probability about 2^-64. The sum has no order, so a device could reduce it in parallel to the
// same bits. Not a cryptographic hash: it detects drift, not tampering.
std::uint64_t checksum_bytes(const void* data, std::size_t size);
// The checksum of a tensor's elements in its dtype's storage, row-major (a view is made contiguous first; a CUDA
// tensor is copied to the host).
std::uint64_t tensor_checksum(const Tensor& t);
// The combined checksum of several checksums, in order: checksum_bytes over them as 8-byte little-endian words.
std::uint64_t combine_checksums(const std::vector<std::uint64_t>& checksums);

// Up to `max_elements` values of `t`, row-major, widened to double (for dumps).
std::vector<double> leading_values(const Tensor& t, std::int64_t max_elements);

// ---- statistics queued now and read later (the probe on CUDA: no host sync per op) ----
// A ring of result slots: launch() queues the statistics of a tensor as its values are now (behind the work
// already queued on its device) and returns a slot, or -1 when every slot is taken; read() hands the result
// back and frees the slot. The probe reads its slots once per step, or when the ring fills.
class DeferredStats {
 public:
  virtual ~DeferredStats() = default;
  virtual int capacity() const = 0;
  virtual int free_slots() const = 0;
  virtual int launch(const Tensor& t, bool with_histogram) = 0;
  virtual TensorStats read(int slot) = 0;
  // Whether `t` lives where this queue computes (else the caller uses tensor_stats).
  virtual bool takes(const Tensor& t) const = 0;
};
// The statistics ring of `device`'s backend (core/backend.h, Backend::make_stats_queue), or null when the
// backend has none (the CPU backend: tensor_stats reads its tensors in place). Floating tensors go to the
// device kernel as they are; integer and bool tensors are widened to f64 on the device first, which gives
// the values tensor_stats widens them to, so the same statistics.
std::unique_ptr<DeferredStats> device_stats_queue(Device device, int slots);
// A queue of `slots` slots for CPU tensors that computes with tensor_stats at launch and hands the result
// back at read: the probe's deferred path without a GPU (its tests).
std::unique_ptr<DeferredStats> host_stats_queue(int slots);
// A device's result as tensor_stats reports it: counts, sum_sq, the histogram when asked for, and min, max,
// absmax, mean = sum / finite and rms = sqrt(sum_sq / finite) when a value is finite (NaN otherwise).
TensorStats stats_from_device(const DeviceStatsResult& r, bool with_histogram);
// cast_counts from the statistics of the source and of the result: a cast maps NaN to NaN, +-inf to +-inf and
// zero to zero, so the result's extra infinities are the finite values that overflowed and its extra zeros the
// non-zero values that flushed. 0 and 0 for a result that is not floating (as cast_counts).
CastCounts cast_counts_from_stats(const TensorStats& source, const TensorStats& result, DType result_dtype);

struct Fp8QuantizeEvent;    // core/probe_hook.h
struct BlockQuantizeEvent;  // core/probe_hook.h

// The steps whose amax an FP8 operand's delayed-scaling history holds. The history rolls at the end of a step only
// when a cast of that step recorded an amax other than 0 (core/fp8_recipe.h delayed_scaling_update), so slot k of a
// history of len entries (k >= 1) holds the amax of the (len - k)-th latest such step, and slot 0 the current
// step's. The probe tells it every cast (recorded steps or not) and asks it for a slot's step. Kept as runs of
// consecutive steps, at most len steps in all: a run that trains every step holds one run.
class Fp8HistorySteps {
 public:
  // A cast in `step` that recorded `amax` (steps in ascending order).
  void note_cast(std::int64_t step, float amax, std::size_t history_len);
  // The step whose amax slot `slot` of a history of `history_len` entries holds, as of a cast in `step`; -1 when
  // the history is older than the casts told (a probe attached after the run began).
  std::int64_t slot_step(std::size_t slot, std::size_t history_len, std::int64_t step) const;

 private:
  std::deque<std::pair<std::int64_t, std::int64_t>> runs_;  // [first, last] steps that rolled, ascending
  std::size_t count_ = 0;                                   // steps in runs_
};

// The /fp8 row of one quantized FP8 operand (trace::Fp8Row says what each count means), from the event's
// values and codes; step, module, operand, format, amax and scale are the event's. The history columns come
// from the event's amax_history (history_len 0 when it has none: current scaling), the step of history_amax from
// `steps` (-1 without it).
trace::Fp8Row fp8_operand_row(const Fp8QuantizeEvent& event, const Fp8HistorySteps* steps = nullptr);

// The first element (row, col) of block `block` of a block-scaled copy of a rows x cols matrix, by the layout of its
// scales (core/block_scaled.h): MXFP8 "rowwise" 1x32 blocks (scales rows x cols/32), "columnwise" 32x1 (rows/32 x
// cols); NVFP4 weights in 16x16 tiles (rows/16 x cols/16, either copy: the runtime quantizes weights with
// Nvfp4Tile::square_16x16), other NVFP4 operands in 1x16 blocks along the rows of the quantized matrix (the transpose
// for the columnwise copy). {-1, -1} for block -1 and for a block or shape the layout does not have. The event
// carries the block's number only (BlockStats), so the probe places it here and the report needs no tensor.
struct BlockPlace {
  std::int64_t row = -1, col = -1;
};
BlockPlace block_place(std::string_view format, std::string_view copy, std::string_view operand, std::int64_t rows,
                       std::int64_t cols, std::int64_t block);

// The /blocks row of one block-scaled operand copy (trace::BlockRow says what each field means): the event's names,
// shape and statistics, with the origins of its widest-range and worst-underflow blocks (block_place).
trace::BlockRow block_operand_row(const BlockQuantizeEvent& event);

}  // namespace ampscope::probe
