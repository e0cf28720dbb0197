// The two-trace diff (probes/analysis/diff.h). Both files are read a block of steps at a time, the blocks
// sized from the row counts so each holds about options.rows_per_read op rows per file; within a step the
// rows are paired by (phase, module, op, occurrence). Two runs of the same model usually record the same op
// sequence, so a step whose keys match position by position is paired without hashing; only steps that
// differ (an fp16 run's extra casts) build a map of the other run's rows.
#include "probes/analysis/diff.h"
#include "probes/analysis/op_traits.h"
#include "probes/analysis/scaler_calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ampscope::analysis {
namespace {

using trace::GradRow;
using trace::OpRow;
using trace::Phase;
using trace::StepRow;

constexpr double kInf = std::numeric_limits<double>::infinity();

// |x - y| / max(reference, floor); NaN stands for "no finite values", so two NaN agree and one NaN is
// infinitely far from any number.
double difference(double x, double y, double reference, double floor) {
  const bool nan_x = std::isnan(x), nan_y = std::isnan(y);
  if (nan_x && nan_y) return 0;
  if (nan_x || nan_y) return kInf;
  if (x == y) return 0;  // also two equal infinities, whose difference would be NaN
  if (std::isinf(x) || std::isinf(y)) return kInf;
  return std::fabs(x - y) / std::max(std::isnan(reference) ? 0.0 : reference, floor);
}

bool same_phase_and_module(const OpRow& x, const OpRow& y) { return x.phase == y.phase && x.module == y.module; }

bool same_key(const OpRow& x, const OpRow& y) { return x.phase == y.phase && x.op == y.op && x.module == y.module; }

struct KeyView {
  Phase phase;
  std::string_view module, op;
  bool operator==(const KeyView&) const = default;
};

struct KeyViewHash {
  std::size_t operator()(const KeyView& k) const noexcept {
    const std::size_t h = std::hash<std::string_view>{}(k.module);
    return (h * 31 + std::hash<std::string_view>{}(k.op)) * 31 + static_cast<std::size_t>(k.phase);
  }
};

KeyView key_of(const OpRow& r) { return {r.phase, r.module, r.op}; }

std::string dtypes_of(const OpRow& r) { return r.in_dtypes + " -> " + r.out_dtype; }

// The floating dtypes of a comma-separated list ("i64,f32" -> "f32"): the PyTorch recorder lists only floating
// inputs, our runtime lists token ids and masks too, and an integer input is not where precision parts.
std::string floating_dtypes(std::string_view list) {
  std::string out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view d = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    const bool integral = d == "bool" || (!d.empty() && (d[0] == 'i' || d[0] == 'u'));
    if (integral) continue;
    if (!out.empty()) out += ',';
    out += d;
  }
  return out;
}

// The health as compared: a backward row's magnitudes divided by the loss scale its step's backward used
// (exact: scales are powers of two). NaN scale: unknown, the magnitudes are left as recorded.
trace::TensorHealth unscaled_health(const OpRow& r, double scale) {
  trace::TensorHealth h = r.health;
  if (r.phase != Phase::backward || scale == 1 || !(scale > 0) || !std::isfinite(scale)) return h;
  for (double* x : {&h.min, &h.max, &h.absmax, &h.mean, &h.rms}) *x /= scale;
  return h;
}

// The boundaries a recorded output sits at (on the recorded values, before any division by the scale).
// Ops whose mathematical range is open (op_traits.h, OpRange): sigmoid and softmax in (0, 1), tanh in (-1, 1),
// exp in (0, inf);
// their output at exactly the end of that range is saturation (the format's resolution, or range, ran
// out). Any f16 or bf16 output: exactly the format's largest finite magnitude (a clamp or a rounding that
// hides an overflow).
// A mask fill (OpKind::mask_fill: where, masked_fill) writing its dtype's lowest finite value. Hugging Face's causal masks
// fill with torch.finfo(dtype).min, so an f32 run's scores hold -3.4e38 where an f16 run's hold -65504:
// different by construction, and both harmless (softmax gives 0 there). The op only copies values; what it
// copied is compared at the op that computed it, and the masked result at the softmax that follows.
// `traits`: the row's op's line of the table (find_op_traits), null for an op it does not know: looked up once per
// aligned pair (both rows have the same op), not at every question (a hash of the name each: issue 37).
bool is_mask_fill(const OpRow& r, const OpTraits* traits) {
  if (r.phase != Phase::forward || traits == nullptr || traits->kind != OpKind::mask_fill) return false;
  const double lowest = r.out_dtype == "f16"    ? 65504.0
                        : r.out_dtype == "bf16" ? 3.3895313892515355e38
                        : r.out_dtype == "f32"  ? 3.4028234663852886e38
                                                : 0.0;
  return lowest > 0 && r.health.min == -lowest;
}

unsigned pins_of(const OpRow& r, const OpTraits* traits) {
  if (is_mask_fill(r, traits)) return 0;
  const trace::TensorHealth& h = r.health;
  unsigned pins = 0;
  if (r.phase == Phase::forward) {
    const OpRange range = traits == nullptr ? OpRange::none : traits->range;  // the open range (op_traits.h): its ends are 0, -1 or 1
    const bool lower_zero = range == OpRange::unit || range == OpRange::positive;
    const bool upper_one = range == OpRange::unit || range == OpRange::signed_unit;
    if (lower_zero && h.zero > 0) pins |= kPinLower;
    if (range == OpRange::signed_unit && h.min == -1.0) pins |= kPinLower;
    if (upper_one && h.max == 1.0) pins |= kPinUpper;
  }
  const double top = r.out_dtype == "f16" ? 65504.0 : r.out_dtype == "bf16" ? 3.3895313892515355e38 : 0.0;
  if (top > 0 && (h.max == top || h.min == -top)) pins |= kPinDtypeMax;
  return pins;
}

// The numbers of one aligned pair, computed for every pair; an OpDiff (with its strings) is built only for
// the pairs the report keeps.
struct PairStats {
  double rel_absmax = 0, rel_mean = 0, rel_rms = 0, rel_zeros = 0, max_rel = 0;
  const char* stat = "rms";
  unsigned pins_a = 0, pins_b = 0;
  bool nonfinite_differs = false;
  bool dtype_differs = false;
  bool magnitudes_compared = true;  // false: a backward row whose step's loss scale one run does not know, a mask fill
  bool zeros_gained = false;
};

double zero_fraction(const trace::TensorHealth& h) {
  return h.numel > 0 ? static_cast<double>(h.zero) / static_cast<double>(h.numel) : 0.0;
}

// The largest magnitudes an op (one key: phase, module, op, occurrence) has had in either run, in the steps
// compared so far: the reference its differences are measured against.
struct Peak {
  double absmax = 0, rms = 0;
  void add(const trace::TensorHealth& h) {
    if (std::isfinite(h.absmax)) absmax = std::max(absmax, std::fabs(h.absmax));
    if (std::isfinite(h.rms)) rms = std::max(rms, std::fabs(h.rms));
  }
};

// An op's key across steps (phase, module, op, occurrence), owned, and looked up by a view of a row.
struct PeakView {
  Phase phase;
  std::string_view module, op;
  std::int64_t occurrence;
};
struct PeakKey {
  Phase phase;
  std::string module, op;
  std::int64_t occurrence;
  bool operator==(const PeakView& v) const {
    return phase == v.phase && occurrence == v.occurrence && module == v.module && op == v.op;
  }
  bool operator==(const PeakKey& k) const { return *this == PeakView{k.phase, k.module, k.op, k.occurrence}; }
};
struct PeakHash {
  using is_transparent = void;
  std::size_t operator()(const PeakView& k) const noexcept {
    return KeyViewHash{}(KeyView{k.phase, k.module, k.op}) * 31 + static_cast<std::size_t>(k.occurrence);
  }
  std::size_t operator()(const PeakKey& k) const noexcept {
    return (*this)(PeakView{k.phase, k.module, k.op, k.occurrence});
  }
};

// `peak` (optional) holds the op's largest magnitudes of earlier steps and takes this pair's. `traits`: the pair's
// op's (find_op_traits(x.op); x and y have the same op).
PairStats compare(const OpRow& x, const OpRow& y, const OpTraits* traits, double floor, double threshold, double scale_x,
                  double scale_y, Peak* peak = nullptr) {
  PairStats s;
  const bool backward = x.phase == Phase::backward;
  s.magnitudes_compared =
      (!backward || (std::isfinite(scale_x) && std::isfinite(scale_y))) && !is_mask_fill(x, traits) && !is_mask_fill(y, traits);
  if (s.magnitudes_compared) {
    const trace::TensorHealth a = unscaled_health(x, scale_x), b = unscaled_health(y, scale_y);
    Peak here;
    if (peak != nullptr) here = *peak;
    here.add(a);
    here.add(b);
    if (peak != nullptr) *peak = here;
    // Each statistic against the op's magnitude: its largest rms (absmax) in either run so far; the mean
    // against the rms too (|mean| <= rms), since a mean near 0 is a difference of nearly equal sums.
    s.rel_absmax = difference(a.absmax, b.absmax, here.absmax, floor);
    s.rel_rms = difference(a.rms, b.rms, here.rms, floor);
    s.rel_mean = difference(a.mean, b.mean, here.rms, floor);
  }
  // absmax is one element and does not decide (probes/analysis/diff.h).
  s.rel_zeros = std::fabs(zero_fraction(x.health) - zero_fraction(y.health));
  s.max_rel = s.rel_mean;
  s.stat = "mean";
  if (s.rel_rms >= s.max_rel) {
    s.max_rel = s.rel_rms;
    s.stat = "rms";
  }
  // New exact zeros name the divergence when they moved the magnitudes too (the zeroed values mattered);
  // zeros alone, with the magnitudes within the threshold, are values too small to matter flushed to 0.
  s.zeros_gained = s.rel_zeros > threshold && s.max_rel > threshold;
  if (s.zeros_gained) s.stat = "zeros";
  s.pins_a = pins_of(x, traits);
  s.pins_b = pins_of(y, traits);
  if (s.pins_a != s.pins_b) {
    // The distance to the boundary went to 0 in one run only: a relative difference of exactly 1.
    s.max_rel = std::max(s.max_rel, 1.0);
    s.stat = "saturation";
  }
  const trace::TensorHealth &a = x.health, &b = y.health;
  s.nonfinite_differs = a.nan != b.nan || a.pos_inf != b.pos_inf || a.neg_inf != b.neg_inf;
  if (s.nonfinite_differs) {
    s.max_rel = kInf;
    s.stat = "nonfinite";
  }
  s.dtype_differs = x.out_dtype != y.out_dtype || (x.in_dtypes != y.in_dtypes &&
                                                   floating_dtypes(x.in_dtypes) != floating_dtypes(y.in_dtypes));
  return s;
}

OpDiff make_diff(const OpRow& x, const OpRow& y, std::int64_t occurrence, const PairStats& s, double scale_x,
                 double scale_y) {
  OpDiff d;
  d.key = {.step = x.step, .phase = x.phase, .module = x.module, .op = x.op, .occurrence = occurrence};
  d.step_b = y.step;
  d.seq_a = x.seq;
  d.seq_b = y.seq;
  d.dtypes_a = dtypes_of(x);
  d.dtypes_b = dtypes_of(y);
  const bool backward = x.phase == Phase::backward;
  d.scale_a = backward ? scale_x : 1.0;
  d.scale_b = backward ? scale_y : 1.0;
  d.magnitudes_compared = s.magnitudes_compared;
  d.a = unscaled_health(x, d.scale_a);
  d.b = unscaled_health(y, d.scale_b);
  d.rel_absmax = s.rel_absmax;
  d.rel_mean = s.rel_mean;
  d.rel_rms = s.rel_rms;
  d.rel_zeros = s.rel_zeros;
  d.pins_a = s.pins_a;
  d.pins_b = s.pins_b;
  d.max_rel = s.max_rel;
  d.stat = s.stat;
  d.nonfinite_differs = s.nonfinite_differs;
  d.dtype_differs = s.dtype_differs;
  return d;
}

bool diverges(const PairStats& s, double threshold) {
  return s.nonfinite_differs || s.pins_a != s.pins_b || s.max_rel > threshold;
}

// Pairs the rows of one step: the k-th row of a key in `a` with the k-th of the same key in `b`.
class StepAligner {
 public:
  void align(std::span<const OpRow> a, std::span<const OpRow> b) {
    a_ = a;
    pairs_.clear();
    only_a_.clear();
    only_b_.clear();
    occurrence_.clear();
    bool same = a.size() == b.size();
    for (std::size_t i = 0; same && i < a.size(); ++i) same = same_key(a[i], b[i]);
    if (same) {
      for (std::size_t i = 0; i < a.size(); ++i) pairs_.emplace_back(i, i);
      return;
    }
    rows_b_.clear();
    for (std::size_t j = 0; j < b.size(); ++j) rows_b_[key_of(b[j])].indices.push_back(j);
    occurrence_.resize(a.size());
    paired_b_.assign(b.size(), false);
    for (std::size_t i = 0; i < a.size(); ++i) {
      // A key b lacks gets an empty entry, so a's occurrences of it are counted too.
      Partners& p = rows_b_[key_of(a[i])];
      occurrence_[i] = static_cast<std::int64_t>(p.next);
      if (p.next < p.indices.size()) {
        pairs_.emplace_back(i, p.indices[p.next]);
        paired_b_[p.indices[p.next]] = true;
      } else {
        only_a_.push_back(i);
      }
      ++p.next;
    }
    for (std::size_t j = 0; j < b.size(); ++j) {
      if (!paired_b_[j]) only_b_.push_back(j);
    }
  }

  // The occurrence of a's row i among the rows of its key, counted on first use in the fast path.
  std::int64_t occurrence(std::size_t i) {
    if (occurrence_.empty()) {
      std::unordered_map<KeyView, std::int64_t, KeyViewHash> seen;
      occurrence_.resize(a_.size());
      for (std::size_t k = 0; k < a_.size(); ++k) occurrence_[k] = seen[key_of(a_[k])]++;
    }
    return occurrence_[i];
  }

  const std::vector<std::pair<std::size_t, std::size_t>>& pairs() const { return pairs_; }
  const std::vector<std::size_t>& only_a() const { return only_a_; }
  const std::vector<std::size_t>& only_b() const { return only_b_; }

 private:
  struct Partners {
    std::vector<std::size_t> indices;
    std::size_t next = 0;
  };
  std::span<const OpRow> a_;
  std::vector<std::pair<std::size_t, std::size_t>> pairs_;
  std::vector<std::size_t> only_a_, only_b_;
  std::vector<std::int64_t> occurrence_;
  std::unordered_map<KeyView, Partners, KeyViewHash> rows_b_;
  std::vector<bool> paired_b_;
};

// Groups by a text key in order of first appearance.
template <class Item>
class Groups {
 public:
  Item& at(const std::string& key, bool& created) {
    auto [it, inserted] = index_.try_emplace(key, items_.size());
    created = inserted;
    if (inserted) items_.emplace_back();
    return items_[it->second];
  }
  std::vector<Item> take() { return std::move(items_); }

 private:
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<Item> items_;
};

std::string group_key(const OpRow& r) {
  std::string k(trace::phase_name(r.phase));
  k += '\x1f';
  k += r.module;
  k += '\x1f';
  k += r.op;
  return k;
}

// "Better" = kept first among the largest differences: larger, then earlier.
bool larger(const OpDiff& x, const OpDiff& y) {
  if (x.max_rel != y.max_rel) return x.max_rel > y.max_rel;
  return std::tie(x.key.step, x.seq_a) < std::tie(y.key.step, y.seq_a);
}

class Comparison {
 public:
  Comparison(DiffReport& report, const DiffOptions& options)
      : report_(report), options_(options), cross_producer_(report.producers_differ()) {}

  void step(std::span<const OpRow> a, std::span<const OpRow> b, double scale_a, double scale_b, std::int64_t step_b) {
    aligner_.align(a, b);
    // Two steps of a run usually record the same op sequence: while a's rows [0, i] have the keys of slots_ (a
    // step before, position by position), row i's occurrence is its slot's, and so are its peak and its op's
    // traits, found without hashing its names (issue 37: the hashing was a tenth of a diff).
    std::size_t first_miss = kNone;
    bool gap = false;      // a row of a before this pair is unpaired
    std::size_t next = 0;  // the row of a after the last pair
    for (const auto& [i, j] : aligner_.pairs()) {
      const OpRow &x = a[i], &y = b[j];
      gap = gap || i != next;
      next = i + 1;
      const bool hit = first_miss == kNone && !gap && i < slots_.size() && slots_[i].phase == x.phase &&
                       slots_[i].op == x.op && slots_[i].module == x.module;
      Slot missed;
      if (!hit) {
        if (first_miss == kNone) first_miss = i;
        const std::int64_t occurrence = aligner_.occurrence(i);
        Slot& slot = gap ? missed : slot_at(i);  // rows [0, i] of a, all paired, become the slots from here on
        slot = {x.phase, x.module, x.op, occurrence, &peak(x, occurrence), find_op_traits(x.op)};
      }
      const Slot& slot = hit || !gap ? slots_[i] : missed;
      Peak& op_peak = *slot.peak;
      ++report_.ops_aligned;
      // Two producers may describe an op by different tensors: for a backward row of weight * x, our runtime
      // records the weight's gradient, the PyTorch recorder the one that flows on to another op. Rows whose
      // sizes differ are then listed, not judged (a reshaped view of the same tensor, [16, 96] against
      // [2, 8, 96], has the same size and is compared).
      if (cross_producer_ && x.health.numel != y.health.numel) {
        add_different_tensors(x, y);
        continue;
      }
      const PairStats s = compare(x, y, slot.traits, options_.floor, options_.threshold, scale_a, scale_b, &op_peak);
      if (s.dtype_differs) add_dtype_difference(x, y);
      const bool divergent = diverges(s, options_.threshold);
      const std::optional<OpDiff>& earliest = report_.first_divergence;
      const bool first = divergent && (!earliest || (earliest->key.step == x.step && x.seq < earliest->seq_a));
      const bool keep = s.max_rel > 0 && options_.largest > 0 &&
                        (largest_.size() < options_.largest || s.max_rel >= largest_.front().max_rel);
      if (!first && !keep) continue;
      OpDiff d = make_diff(x, y, slot.occurrence, s, scale_a, scale_b);
      d.step_b = step_b;
      if (keep) offer(d);
      if (first) {
        // The unpaired ops just before it in its module (a's only_a/only_b are in row order).
        for (std::size_t k : aligner_.only_a())
          if (same_phase_and_module(a[k], x) && a[k].seq < x.seq) d.unpaired_before_a.push_back(a[k].op);
        for (std::size_t k : aligner_.only_b())
          if (same_phase_and_module(b[k], y) && b[k].seq < y.seq) d.unpaired_before_b.push_back(b[k].op);
        report_.first_divergence = std::move(d);
      }
    }
    for (std::size_t i : aligner_.only_a()) add_unmatched(only_a_, a[i]);
    for (std::size_t j : aligner_.only_b()) add_unmatched(only_b_, b[j]);
    // The slots now describe this step where it differed from them: all of it when every row was paired in
    // order (a shorter step leaves the rest unused), else only the rows before the first difference, which the
    // two steps share.
    gap = gap || next != a.size();
    if (first_miss != kNone) slots_.resize(gap ? first_miss : a.size());
  }

  Peak& peak(const OpRow& r, std::int64_t occurrence) {
    const PeakView view{r.phase, r.module, r.op, occurrence};
    auto it = peaks_.find(view);
    if (it == peaks_.end()) it = peaks_.emplace(PeakKey{r.phase, r.module, r.op, occurrence}, Peak{}).first;
    return it->second;
  }

  void finish() {
    std::sort(largest_.begin(), largest_.end(), larger);
    report_.largest = std::move(largest_);
    report_.dtype_differences = dtypes_.take();
    report_.only_in_a = only_a_.take();
    report_.only_in_b = only_b_.take();
    report_.different_tensors = different_.take();
  }

 private:
  // A min-heap (the smallest kept difference on top) of at most options.largest entries.
  void offer(const OpDiff& d) {
    if (largest_.size() < options_.largest) {
      largest_.push_back(d);
      std::push_heap(largest_.begin(), largest_.end(), larger);
    } else if (larger(d, largest_.front())) {
      std::pop_heap(largest_.begin(), largest_.end(), larger);
      largest_.back() = d;
      std::push_heap(largest_.begin(), largest_.end(), larger);
    }
  }

  void add_different_tensors(const OpRow& x, const OpRow& y) {
    std::string key = group_key(x);
    key += '\x1f';
    key += x.shape;
    key += '>';
    key += y.shape;
    bool created = false;
    DifferentTensors& g = different_.at(key, created);
    if (created) {
      g.phase = x.phase;
      g.module = x.module;
      g.op = x.op;
      g.shape_a = x.shape;
      g.shape_b = y.shape;
      g.first_step = x.step;
    }
    ++g.count;
  }

  void add_dtype_difference(const OpRow& x, const OpRow& y) {
    std::string key = group_key(x);
    key += '\x1f';
    key += x.in_dtypes;
    key += '>';
    key += x.out_dtype;
    key += '\x1f';
    key += y.in_dtypes;
    key += '>';
    key += y.out_dtype;
    bool created = false;
    DtypeDifference& g = dtypes_.at(key, created);
    if (created) {
      g.phase = x.phase;
      g.module = x.module;
      g.op = x.op;
      g.dtypes_a = dtypes_of(x);
      g.dtypes_b = dtypes_of(y);
      g.first_step = x.step;
    }
    ++g.count;
  }

  void add_unmatched(Groups<Unmatched>& groups, const OpRow& r) {
    bool created = false;
    Unmatched& g = groups.at(group_key(r), created);
    if (created) {
      g.phase = r.phase;
      g.module = r.module;
      g.op = r.op;
      g.first_step = r.step;
    }
    ++g.count;
  }

  // An op of a step remembered by its position: its key, its occurrence, its peak (in peaks_, whose
  // entries never move) and its line of the op table (null: not in it).
  struct Slot {
    Phase phase = Phase::forward;
    std::string module, op;
    std::int64_t occurrence = 0;
    Peak* peak = nullptr;
    const OpTraits* traits = nullptr;
  };
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  Slot& slot_at(std::size_t i) {
    if (slots_.size() <= i) slots_.resize(i + 1);
    return slots_[i];
  }

  DiffReport& report_;
  const DiffOptions& options_;
  bool cross_producer_;  // the runs come from different producers (DiffReport::producers_differ)
  StepAligner aligner_;
  std::vector<OpDiff> largest_;
  Groups<DifferentTensors> different_;
  Groups<DtypeDifference> dtypes_;
  Groups<Unmatched> only_a_, only_b_;
  std::unordered_map<PeakKey, Peak, PeakHash, std::equal_to<>> peaks_;
  std::vector<Slot> slots_;  // the ops of the steps compared so far, by position (step above)
};

template <class Row>
void sort_by_step(std::vector<Row>& rows) {
  const auto by_step = [](const Row& x, const Row& y) { return x.step < y.step; };
  if (!std::is_sorted(rows.begin(), rows.end(), by_step)) std::stable_sort(rows.begin(), rows.end(), by_step);
}

// The end of the run of rows with the same step as rows[begin].
template <class Row>
std::size_t step_end(const std::vector<Row>& rows, std::size_t begin) {
  std::size_t end = begin;
  while (end < rows.size() && rows[end].step == rows[begin].step) ++end;
  return end;
}

bool has(const std::vector<std::int64_t>& sorted, std::int64_t step) {
  return std::binary_search(sorted.begin(), sorted.end(), step);
}

std::vector<std::int64_t> step_numbers(const std::vector<StepRow>& rows) {
  std::vector<std::int64_t> steps;
  steps.reserve(rows.size());
  for (const StepRow& r : rows) steps.push_back(r.step);
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

// One run's gradient of one parameter in one step, as compared: the row after unscale_, or (a run that
// recorded only the scaled one) the scaled row with the step's scale to divide by.
struct TrueGrad {
  const GradRow* row = nullptr;
  double divisor = 1;
};

std::vector<TrueGrad> true_gradients(std::span<const GradRow> rows, double scale) {
  std::unordered_map<std::string_view, std::size_t> index;
  std::vector<TrueGrad> out;
  for (const GradRow& r : rows) {
    auto [it, inserted] = index.try_emplace(r.param, out.size());
    if (inserted)
      out.push_back({&r, r.unscaled ? 1.0 : scale});
    else if (r.unscaled && !out[it->second].row->unscaled)
      out[it->second] = {&r, 1.0};
  }
  return out;
}

GradRow divided(const GradRow& r, double divisor) {
  GradRow g = r;
  if (divisor != 1 && divisor > 0 && std::isfinite(divisor)) {
    g.absmax /= divisor;
    g.norm /= divisor;
  }
  return g;
}

// The gradients of the steps both runs recorded, parameter by parameter, in a's order.
class GradComparison {
 public:
  GradComparison(DiffReport& report, const DiffOptions& options) : report_(report), options_(options) {}

  void step(std::span<const GradRow> a, std::span<const GradRow> b, double scale_a, double scale_b,
            std::int64_t step_b) {
    const std::vector<TrueGrad> ga = true_gradients(a, scale_a), gb = true_gradients(b, scale_b);
    std::unordered_map<std::string_view, const TrueGrad*> by_param;
    for (const TrueGrad& g : gb) by_param.emplace(g.row->param, &g);
    for (const TrueGrad& x : ga) {
      const auto found = by_param.find(x.row->param);
      if (found == by_param.end()) continue;
      const TrueGrad& y = *found->second;
      ++report_.grads_aligned;
      const bool known = std::isfinite(x.divisor) && std::isfinite(y.divisor);
      GradDiff d;
      d.step = x.row->step;
      d.step_b = step_b;
      d.param = x.row->param;
      d.scale_a = x.divisor;
      d.scale_b = y.divisor;
      d.a = divided(*x.row, x.divisor);
      d.b = divided(*y.row, y.divisor);
      if (known) {
        Peak& peak = peaks_[d.param];
        for (const GradRow* g : {&d.a, &d.b}) {
          if (std::isfinite(g->norm)) peak.rms = std::max(peak.rms, std::fabs(g->norm));
          if (std::isfinite(g->absmax)) peak.absmax = std::max(peak.absmax, std::fabs(g->absmax));
        }
        d.rel_norm = difference(d.a.norm, d.b.norm, peak.rms, options_.floor);
        d.rel_absmax = difference(d.a.absmax, d.b.absmax, peak.absmax, options_.floor);
      }
      d.max_rel = d.rel_norm;
      d.stat = "norm";
      d.nonfinite_differs = d.a.nan != d.b.nan || d.a.pos_inf != d.b.pos_inf || d.a.neg_inf != d.b.neg_inf;
      if (d.nonfinite_differs) {
        d.max_rel = kInf;
        d.stat = "nonfinite";
      }
      // The norm of a gradient with inf is inf (NaN with NaN): the counts say it.
      if (!d.nonfinite_differs && !std::isfinite(d.max_rel)) d.max_rel = 0;
      if (!report_.first_grad_divergence && (d.nonfinite_differs || d.max_rel > options_.threshold))
        report_.first_grad_divergence = std::move(d);
    }
  }

 private:
  DiffReport& report_;
  const DiffOptions& options_;
  std::unordered_map<std::string, Peak> peaks_;
};

// Steps a run skipped while its GradScaler calibrated (DiffReport::calibration_skips_a): skipped with a
// finite loss, a later unskipped step ran at a smaller scale (backing off cured it), and no earlier unskipped
// step had run at this scale or above (the scale was too high; the gradients had not grown). The analysis
// (scaler_health.cpp, "calibration") applies the same test (probes/analysis/scaler_calibration.h).
std::vector<std::int64_t> calibration_skips(std::vector<StepRow> rows) {
  std::sort(rows.begin(), rows.end(), [](const StepRow& x, const StepRow& y) { return x.step < y.step; });
  const detail::CleanScales clean = detail::clean_scales(rows);
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const StepRow& r = rows[i];
    if (r.skipped && std::isfinite(r.loss) && clean.min_after[i + 1] < r.scale && !(clean.max_before[i] >= r.scale))
      out.push_back(r.step);
  }
  return out;
}

// Which step of b is compared with which step of a. By step number (the identity), unless the runs'
// calibration skips differ: then by optimizer update (DiffReport::aligned_by_update).
struct StepPairing {
  bool by_update = false;
  std::map<std::int64_t, std::int64_t> a_to_b, b_to_a;  // paired steps (by_update only)
  std::vector<std::int64_t> unpaired_b;                  // b's steps past a's last (by_update only)

  StepPairing(const std::vector<std::int64_t>& steps_a, const std::vector<std::int64_t>& steps_b,
              const std::vector<std::int64_t>& calibration_a, const std::vector<std::int64_t>& calibration_b) {
    by_update = calibration_a != calibration_b;
    if (!by_update) return;
    std::vector<std::int64_t> rest_a, rest_b;
    for (std::int64_t s : steps_a)
      if (!has(calibration_a, s)) rest_a.push_back(s);
    for (std::int64_t s : steps_b)
      if (!has(calibration_b, s)) rest_b.push_back(s);
    for (std::size_t k = 0; k < rest_b.size(); ++k) {
      if (k < rest_a.size()) {
        a_to_b.emplace(rest_a[k], rest_b[k]);
        b_to_a.emplace(rest_b[k], rest_a[k]);
      } else {
        unpaired_b.push_back(rest_b[k]);
      }
    }
  }
  // b's step compared with a's step s (s itself when a's step has no partner or steps pair by number).
  std::int64_t b_of(std::int64_t s) const {
    if (!by_update) return s;
    const auto it = a_to_b.find(s);
    return it == a_to_b.end() ? s : it->second;
  }
  // The bound in b's numbering of a block of a's steps [.., a_bound).
  std::int64_t b_bound(std::int64_t a_bound) const {
    if (!by_update || a_bound == trace::kFirstStep || a_bound == trace::kLastStep) return a_bound;
    const auto it = a_to_b.lower_bound(a_bound);
    return it == a_to_b.end() ? trace::kLastStep : it->second;
  }
  // b's rows renumbered to the a step they are compared with; rows of b's steps without a partner (its
  // calibration skips, steps past a's last) are dropped. Rows outside any step (negative) are kept.
  template <class Row>
  void renumber_b(std::vector<Row>& rows) const {
    if (!by_update) return;
    std::erase_if(rows, [&](Row& r) {
      if (r.step < 0) return false;
      const auto it = b_to_a.find(r.step);
      if (it == b_to_a.end()) return true;
      r.step = it->second;
      return false;
    });
  }
};

// The loss scale each step's backward used, from a run's /steps rows: the step's own row, or for a step
// without one (its writer stopped before the step ended) the scale the step before left (scale_after);
// NaN (unknown) when no earlier step exists.
class LossScales {
 public:
  explicit LossScales(const std::vector<StepRow>& rows) {
    for (const StepRow& r : rows) rows_.push_back({r.step, r.scale, r.scale_after});
    std::sort(rows_.begin(), rows_.end(), [](const Entry& x, const Entry& y) { return x.step < y.step; });
  }
  double at(std::int64_t step) const {
    const auto after = std::upper_bound(rows_.begin(), rows_.end(), step,
                                        [](std::int64_t s, const Entry& e) { return s < e.step; });
    if (after == rows_.begin()) return std::numeric_limits<double>::quiet_NaN();
    const Entry& e = *(after - 1);
    return e.step == step ? e.scale : e.scale_after;
  }

 private:
  struct Entry {
    std::int64_t step;
    double scale, scale_after;
  };
  std::vector<Entry> rows_;
};

// The loss curves side by side, every step of either run; the first step whose losses part.
void compare_losses(DiffReport& report, const std::vector<StepRow>& a, const std::vector<StepRow>& b,
                    const std::vector<std::int64_t>& all_steps, const StepPairing& pairing) {
  std::unordered_map<std::int64_t, const StepRow*> row_a, row_b;
  double peak = 0;  // the largest finite |loss| of either run so far
  for (const StepRow& r : a) row_a.try_emplace(r.step, &r);
  for (const StepRow& r : b) row_b.try_emplace(r.step, &r);
  report.losses.reserve(all_steps.size());
  for (std::int64_t s : all_steps) {
    LossPoint p;
    p.step = s;
    p.step_b = pairing.b_of(s);
    auto fa = row_a.find(s);
    auto fb = row_b.find(s);
    if (fa != row_a.end()) {
      p.in_a = true;
      p.loss_a = fa->second->loss;
      p.scale_a = fa->second->scale;
      p.skipped_a = fa->second->skipped;
    }
    if (fb != row_b.end()) {
      p.in_b = true;
      p.loss_b = fb->second->loss;
      p.scale_b = fb->second->scale;
      p.skipped_b = fb->second->skipped;
    }
    if (p.in_a && p.in_b) {
      ++report.steps_compared;
      for (double l : {p.loss_a, p.loss_b})
        if (std::isfinite(l)) peak = std::max(peak, std::fabs(l));
      p.rel = difference(p.loss_a, p.loss_b, peak, report.options.floor);
      if (!report.first_loss_divergence && p.rel > report.options.threshold) report.first_loss_divergence = s;
    } else if (p.in_a) {
      report.steps_only_in_a.push_back(s);
    } else {
      report.steps_only_in_b.push_back(s);
    }
    report.losses.push_back(p);
  }
}

}  // namespace

std::string producer_of(const trace::RunInfo& run) {
  // The recorder writes "recorder": "ampscope.torch" first in its config; a config that is not JSON (a hostile
  // or foreign file) is ours by default: the reader has checked the rest of the format.
  const nlohmann::json config = nlohmann::json::parse(run.config, nullptr, false);
  if (config.is_object()) {
    const auto it = config.find("recorder");
    if (it != config.end() && it->is_string() && *it == "ampscope.torch") return "pytorch";
  }
  return "ampscope";
}

std::vector<OpDiff> diff_ops(std::span<const trace::OpRow> a, std::span<const trace::OpRow> b, const DiffOptions& options,
                             double scale_a, double scale_b) {
  // Rows of several steps are aligned step by step, as diff() does.
  std::vector<OpRow> rows_a(a.begin(), a.end()), rows_b(b.begin(), b.end());
  sort_by_step(rows_a);
  sort_by_step(rows_b);
  std::vector<OpDiff> out;
  StepAligner aligner;
  std::size_t i = 0, j = 0;
  while (i < rows_a.size()) {
    const std::size_t ie = step_end(rows_a, i);
    const std::int64_t s = rows_a[i].step;
    while (j < rows_b.size() && rows_b[j].step < s) ++j;
    const std::size_t jb = j;
    while (j < rows_b.size() && rows_b[j].step == s) ++j;
    const std::span<const OpRow> step_a(rows_a.data() + i, ie - i), step_b(rows_b.data() + jb, j - jb);
    aligner.align(step_a, step_b);
    for (const auto& [pi, pj] : aligner.pairs()) {
      const PairStats s = compare(step_a[pi], step_b[pj], find_op_traits(step_a[pi].op), options.floor, options.threshold,
                                  scale_a, scale_b);
      out.push_back(make_diff(step_a[pi], step_b[pj], aligner.occurrence(pi), s, scale_a, scale_b));
    }
    i = ie;
  }
  return out;
}

DiffReport diff(trace::TraceReader& a, trace::TraceReader& b, const DiffOptions& options, const DiffProgress& progress) {
  if (options.rows_per_read < 1) {
    throw Error(fmt::format("diff: rows_per_read must be at least 1, got {}\nhint: the default, 200000, holds about "
                            "100 MB of rows per file",
                            options.rows_per_read));
  }
  DiffReport report;
  report.path_a = a.path().string();
  report.path_b = b.path().string();
  report.run_a = a.run_info();
  report.run_b = b.run_info();
  report.producer_a = producer_of(report.run_a);
  report.producer_b = producer_of(report.run_b);
  report.options = options;
  report.damage_a = a.damage();
  report.damage_b = b.damage();

  const std::vector<StepRow> step_rows_a = a.steps(), step_rows_b_own = b.steps();
  report.calibration_skips_a = calibration_skips(step_rows_a);
  report.calibration_skips_b = calibration_skips(step_rows_b_own);
  const StepPairing pairing(step_numbers(step_rows_a), step_numbers(step_rows_b_own), report.calibration_skips_a,
                            report.calibration_skips_b);
  report.aligned_by_update = pairing.by_update;
  // From here on b's steps carry the numbers of the a steps they are compared with.
  std::vector<StepRow> step_rows_b = step_rows_b_own;
  pairing.renumber_b(step_rows_b);
  std::vector<StepRow> step_rows_a_compared = step_rows_a;
  if (pairing.by_update)
    std::erase_if(step_rows_a_compared, [&](const StepRow& r) { return has(report.calibration_skips_a, r.step); });
  const std::vector<std::int64_t> steps_a = step_numbers(step_rows_a_compared), steps_b = step_numbers(step_rows_b);
  std::vector<std::int64_t> all_steps;
  std::set_union(steps_a.begin(), steps_a.end(), steps_b.begin(), steps_b.end(), std::back_inserter(all_steps));
  compare_losses(report, step_rows_a_compared, step_rows_b, all_steps, pairing);
  for (std::int64_t s : pairing.unpaired_b) report.steps_only_in_b.push_back(s);

  // Blocks of whole steps; the first reaches down to the smallest step and the last up to the largest,
  // so op rows outside steps (-1) and those of a truncated last step are read too.
  const trace::RowCounts counts_a = a.row_counts(), counts_b = b.row_counts();
  const auto per_step = [](std::int64_t rows, std::size_t steps) {
    return rows / std::max<std::int64_t>(1, static_cast<std::int64_t>(steps));
  };
  const std::int64_t rows_per_step =
      std::max<std::int64_t>({1, per_step(counts_a.ops, steps_a.size()), per_step(counts_b.ops, steps_b.size())});
  const std::size_t steps_per_block =
      static_cast<std::size_t>(std::max<std::int64_t>(1, options.rows_per_read / rows_per_step));
  const std::int64_t total = counts_a.ops + counts_b.ops;
  std::int64_t done = 0;

  const LossScales scales_a(step_rows_a), scales_b_own(step_rows_b_own);
  const auto scale_b_at = [&](std::int64_t s) { return scales_b_own.at(pairing.b_of(s)); };
  Comparison comparison(report, options);
  GradComparison gradients(report, options);
  std::vector<OpRow> rows_a, rows_b;  // one block's rows of each run; their memory is reused by the next block
  // The texts the comparison reads: never the autocast reason; shapes only where rows of different producers are
  // listed as different tensors (Comparison::add_different_tensors).
  const trace::OpTexts texts{.shape = report.producers_differ(), .autocast = false};
  for (std::size_t k = 0; k == 0 || k < all_steps.size(); k += steps_per_block) {
    const std::int64_t begin = k == 0 ? trace::kFirstStep : all_steps[k];
    const std::int64_t end = k + steps_per_block >= all_steps.size() ? trace::kLastStep : all_steps[k + steps_per_block];
    a.ops(begin, end, rows_a, texts);
    b.ops(pairing.b_bound(begin), pairing.b_bound(end), rows_b, texts);
    done += static_cast<std::int64_t>(rows_a.size() + rows_b.size());
    pairing.renumber_b(rows_b);
    sort_by_step(rows_a);
    sort_by_step(rows_b);
    std::size_t i = 0, j = 0;
    while (i < rows_a.size() || j < rows_b.size()) {
      const std::int64_t s = std::min(i < rows_a.size() ? rows_a[i].step : trace::kLastStep,
                                      j < rows_b.size() ? rows_b[j].step : trace::kLastStep);
      const std::size_t ie = i < rows_a.size() && rows_a[i].step == s ? step_end(rows_a, i) : i;
      const std::size_t je = j < rows_b.size() && rows_b[j].step == s ? step_end(rows_b, j) : j;
      // A step recorded in one run only is in steps_only_in_a/b; its ops are not listed again one by one.
      // So is a step both runs finished whose ops only one recorded (the other's --sample-every left them out).
      const bool both = has(steps_a, s) && has(steps_b, s);
      if (s < 0) {
        // Outside any step (an evaluation pass between steps): not a step, and not compared.
        report.rows_outside_steps_a += static_cast<std::int64_t>(ie - i);
        report.rows_outside_steps_b += static_cast<std::int64_t>(je - j);
      } else if (both && ie == i && je > j) {
        report.steps_only_in_b.push_back(s);
      } else if (both && je == j && ie > i) {
        report.steps_only_in_a.push_back(s);
      } else if (has(steps_a, s) == has(steps_b, s)) {
        comparison.step({rows_a.data() + i, ie - i}, {rows_b.data() + j, je - j}, scales_a.at(s), scale_b_at(s),
                        pairing.b_of(s));
      }
      i = ie;
      j = je;
    }
    std::vector<GradRow> grads_a = a.grads(begin, end), grads_b = b.grads(pairing.b_bound(begin), pairing.b_bound(end));
    pairing.renumber_b(grads_b);
    sort_by_step(grads_a);
    sort_by_step(grads_b);
    i = 0;
    j = 0;
    while (i < grads_a.size() || j < grads_b.size()) {
      const std::int64_t s = std::min(i < grads_a.size() ? grads_a[i].step : trace::kLastStep,
                                      j < grads_b.size() ? grads_b[j].step : trace::kLastStep);
      const std::size_t ie = i < grads_a.size() && grads_a[i].step == s ? step_end(grads_a, i) : i;
      const std::size_t je = j < grads_b.size() && grads_b[j].step == s ? step_end(grads_b, j) : j;
      if (s >= 0 && has(steps_a, s) == has(steps_b, s) && ie > i && je > j)
        gradients.step({grads_a.data() + i, ie - i}, {grads_b.data() + j, je - j}, scales_a.at(s), scale_b_at(s),
                       pairing.b_of(s));
      i = ie;
      j = je;
    }
    if (progress) progress(done, total);
  }
  comparison.finish();
  std::sort(report.steps_only_in_a.begin(), report.steps_only_in_a.end());
  std::sort(report.steps_only_in_b.begin(), report.steps_only_in_b.end());
  return report;
}

}  // namespace ampscope::analysis
