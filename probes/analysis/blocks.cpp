#include "probes/analysis/blocks.h"
#include "probes/analysis/precision.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ampscope::analysis {

namespace {

int operand_rank(const std::string& operand) { return operand == "input" ? 0 : operand == "weight" ? 1 : 2; }
int copy_rank(const std::string& copy) { return copy == "rowwise" ? 0 : 1; }
int format_rank(const std::string& format) { return format == "mxfp8" ? 0 : 1; }

// Indices of the copies whose `fraction` is above 0, highest first (stable: copies' order on ties), at most
// kBlockWorst.
template <typename Fraction>
std::vector<std::size_t> worst(const std::vector<BlockCopySummary>& copies, Fraction fraction) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < copies.size(); ++i)
    if (fraction(copies[i]) > 0) out.push_back(i);
  std::stable_sort(out.begin(), out.end(), [&](std::size_t a, std::size_t b) { return fraction(copies[a]) > fraction(copies[b]); });
  if (out.size() > kBlockWorst) out.resize(kBlockWorst);
  return out;
}

BlockCopySummary summarize(const BlockCopyRows& c) {
  BlockCopySummary s;
  s.module = c.module;
  s.operand = c.operand;
  s.copy = c.copy;
  s.format = c.format;
  s.what_if = c.what_if;
  std::set<std::int64_t> steps;
  std::vector<double> medians;
  double error_sum = 0;
  for (const trace::BlockRow* r : c.rows) {
    steps.insert(r->step);
    s.rows = r->rows;
    s.cols = r->cols;
    s.nonzero += r->nonzero;
    s.nonfinite += r->nonfinite;
    s.underflow += r->underflow;
    s.saturated += r->saturated;
    s.blocks += r->blocks;
    s.blocks_clipped += r->blocks_clipped;
    s.blocks_nan += r->blocks_nan;
    const double u = trace::block_fraction(r->underflow, r->nonzero);
    const double sat = trace::block_fraction(r->saturated, r->nonzero);
    if (u > s.worst_underflow_fraction) s.worst_underflow_fraction = u, s.worst_underflow_step = r->step;
    if (sat > s.worst_saturated_fraction) s.worst_saturated_fraction = sat, s.worst_saturated_step = r->step;
    if (r->max_range_block >= 0 && (s.max_range_block < 0 || r->max_block_range > s.max_block_range)) {
      s.max_block_range = r->max_block_range;
      s.max_range_step = r->step;
      s.max_range_block = r->max_range_block;
      s.max_range_row = r->max_range_row;
      s.max_range_col = r->max_range_col;
    }
    if (r->worst_block >= 0 && r->worst_block_underflow > s.worst_block_underflow) {
      s.worst_block_underflow = r->worst_block_underflow;
      s.worst_block_step = r->step;
      s.worst_block = r->worst_block;
      s.worst_block_row = r->worst_block_row;
      s.worst_block_col = r->worst_block_col;
    }
    // NaN (no block with a scale) is skipped; -inf (a zero NVFP4 block scale) is a real minimum.
    if (!std::isnan(r->scale_log2_min)) {
      if (!(s.scale_log2_min <= r->scale_log2_min)) s.scale_log2_min = r->scale_log2_min;
      if (!(s.scale_log2_max >= r->scale_log2_max)) s.scale_log2_max = r->scale_log2_max;
      medians.push_back(r->scale_log2_median);
    }
    s.max_rel_rms_error = std::max(s.max_rel_rms_error, r->rel_rms_error);
    error_sum += r->rel_rms_error;
  }
  if (!medians.empty()) {
    std::sort(medians.begin(), medians.end());
    s.scale_log2_median = medians[(medians.size() - 1) / 2];
  }
  s.steps = static_cast<std::int64_t>(steps.size());
  s.underflow_fraction = trace::block_fraction(s.underflow, s.nonzero);
  s.saturated_fraction = trace::block_fraction(s.saturated, s.nonzero);
  s.mean_rel_rms_error = c.rows.empty() ? 0.0 : error_sum / static_cast<double>(c.rows.size());
  return s;
}

}  // namespace

std::vector<BlockCopyRows> group_block_rows(std::span<const trace::BlockRow> rows) {
  using Key = std::tuple<std::string, int, int, int, bool>;
  std::map<Key, BlockCopyRows> by_copy;
  for (const trace::BlockRow& r : rows) {
    BlockCopyRows& c = by_copy[Key{r.module, operand_rank(r.operand), copy_rank(r.copy), format_rank(r.format), r.what_if}];
    if (c.rows.empty()) c = BlockCopyRows{r.module, r.operand, r.copy, r.format, r.what_if, {}};
    c.rows.push_back(&r);
  }
  std::vector<BlockCopyRows> out;
  out.reserve(by_copy.size());
  for (auto& [key, c] : by_copy) {
    std::stable_sort(c.rows.begin(), c.rows.end(), [](const trace::BlockRow* a, const trace::BlockRow* b) { return a->step < b->step; });
    out.push_back(std::move(c));
  }
  return out;
}

BlockSection analyse_blocks(std::span<const trace::BlockRow> rows) {
  BlockSection out;
  out.rows = static_cast<std::int64_t>(rows.size());
  if (rows.empty()) return out;
  std::set<std::int64_t> steps;
  std::set<std::string> modules;
  for (const trace::BlockRow& r : rows) {
    steps.insert(r.step);
    modules.insert(r.module);
    out.what_if_rows += r.what_if ? 1 : 0;
  }
  out.steps = static_cast<std::int64_t>(steps.size());
  out.modules = static_cast<std::int64_t>(modules.size());
  out.first_step = *steps.begin();
  out.last_step = *steps.rbegin();
  for (const BlockCopyRows& c : group_block_rows(rows)) out.copies.push_back(summarize(c));
  out.worst_underflow = worst(out.copies, [](const BlockCopySummary& c) { return c.underflow_fraction; });
  out.worst_saturation = worst(out.copies, [](const BlockCopySummary& c) { return c.saturated_fraction; });
  return out;
}

BlockNull block_null(const std::string& format, const std::string& operand) {
  if (format == "mxfp8") return {32, std::ldexp(1.0, -10) / 224.0, false};
  return {operand == "weight" ? 256 : 16, (1.0 + std::ldexp(1.0, -4)) / 24.0, operand == "grad_output"};
}

std::vector<double> block_null_tail(const BlockNull& null) {
  const std::int64_t n = null.values;
  std::vector<double> tail(static_cast<std::size_t>(n + 1), 0.0);
  if (n < 1) return tail;
  // The half-normal's density and distribution: f(y) = 2 phi(y), F(y) = erf(y / sqrt 2).
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0), c = std::sqrt(2.0 / std::acos(-1.0));
  const auto F = [&](double y) { return std::erf(y * inv_sqrt2); };
  // The chance one of the other values (half-normal under M) rounds to 0. Stochastic rounding: a value y under the
  // smallest element h = 2 zero_below M goes to 0 with chance 1 - y / h, whose integral against f over [0, h] is
  // F(h) - (c / h)(1 - exp(-h^2 / 2)).
  const auto q = [&](double m) {
    const double fm = F(m);
    double lost = 0;
    if (!null.stochastic) {
      lost = F(null.zero_below * m);
    } else {
      const double h = 2 * null.zero_below * m;
      lost = F(h) - c * -std::expm1(-h * h / 2) / h;
    }
    return std::clamp(lost / fm, 0.0, 1.0);
  };
  // Simpson's rule over M in (0, 12]: the amax of up to 256 half-normals is past 12 with chance under 1e-30.
  constexpr int kIntervals = 4000;
  constexpr double kTop = 12.0;
  const double h = kTop / kIntervals;
  std::vector<double> log_choose(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j)
    log_choose[static_cast<std::size_t>(j)] = std::lgamma(static_cast<double>(n)) - std::lgamma(static_cast<double>(j + 1)) -
                                              std::lgamma(static_cast<double>(n - j));
  std::vector<double> pmf(static_cast<std::size_t>(n));
  for (int i = 1; i <= kIntervals; ++i) {  // the integrand is 0 at M = 0 (F(0)^(n-1) = 0 for n > 1; n = 1: X = 0)
    const double m = h * i;
    const double weight = (i == kIntervals ? 1.0 : (i % 2 == 1 ? 4.0 : 2.0)) * h / 3.0;
    const double fm = F(m);
    const double density = static_cast<double>(n) * c * std::exp(-m * m / 2) * std::pow(fm, static_cast<double>(n - 1));
    if (!(density > 0)) continue;
    const double p = q(m);
    // Binomial(n - 1, p) in logs (p^j under double's range for j near 256), summed from the top for the tail.
    for (std::int64_t j = 0; j < n; ++j) {
      const double lp = (j == 0 ? 0.0 : static_cast<double>(j) * std::log(p)) +
                        (n - 1 - j == 0 ? 0.0 : static_cast<double>(n - 1 - j) * std::log1p(-p));
      pmf[static_cast<std::size_t>(j)] = p <= 0 ? (j == 0 ? 1.0 : 0.0) : p >= 1 ? (j == n - 1 ? 1.0 : 0.0)
                                                                               : std::exp(log_choose[static_cast<std::size_t>(j)] + lp);
    }
    double above = 0;
    for (std::int64_t k = n - 1; k >= 0; --k) {
      above += pmf[static_cast<std::size_t>(k)];
      tail[static_cast<std::size_t>(k)] += weight * density * above;
    }
  }
  tail[0] = 1.0;  // exactly: the integral of the amax's density, less Simpson's error
  return tail;
}

namespace {

// block_null_tail of each null a run can hold, computed once.
const std::vector<double>& null_tail(const std::string& format, const std::string& operand) {
  static const std::vector<double> mx = block_null_tail(block_null("mxfp8", "input"));
  static const std::vector<double> nv = block_null_tail(block_null("nvfp4", "input"));
  static const std::vector<double> nv_grad = block_null_tail(block_null("nvfp4", "grad_output"));
  static const std::vector<double> nv_tile = block_null_tail(block_null("nvfp4", "weight"));
  if (format == "mxfp8") return mx;
  return operand == "weight" ? nv_tile : operand == "grad_output" ? nv_grad : nv;
}

}  // namespace

std::int64_t block_flattened_bar(const std::string& format, const std::string& operand, std::int64_t blocks) {
  const std::vector<double>& tail = null_tail(format, operand);
  // The chance per block that keeps the worst of `blocks` at or under kBlockFalseAlarm: 1 - (1 - a)^(1 / blocks).
  const double per_block = -std::expm1(std::log1p(-kBlockFalseAlarm) / static_cast<double>(std::max<std::int64_t>(blocks, 1)));
  for (std::size_t k = 1; k < tail.size(); ++k)
    if (tail[k] <= per_block) return static_cast<std::int64_t>(k);
  return static_cast<std::int64_t>(tail.size());
}

double block_null_loss(const std::string& format, const std::string& operand) {
  const std::vector<double>& tail = null_tail(format, operand);
  double sum = 0;
  for (std::size_t k = 1; k < tail.size(); ++k) sum += tail[k];
  return sum / static_cast<double>(tail.size() - 1);
}

double block_mismatch_bar(std::int64_t underflow_a, std::int64_t nonzero_a, std::int64_t underflow_b,
                          std::int64_t nonzero_b, double floor) {
  if (nonzero_a <= 0 || nonzero_b <= 0) return floor;
  const double p = static_cast<double>(underflow_a + underflow_b) / static_cast<double>(nonzero_a + nonzero_b);
  const double se = std::sqrt(p * (1 - p) * (1.0 / static_cast<double>(nonzero_a) + 1.0 / static_cast<double>(nonzero_b)));
  return std::max(floor, kBlockMismatchZ * se);
}

namespace {

Fp8Remedy block_remedy(std::string option, std::string value, std::string command_line, std::string why) {
  return Fp8Remedy{std::move(option), std::move(value), std::move(command_line), std::move(why)};
}

bool kept(const BlockRunSettings& run, const std::string& module) {
  return std::find(run.keep_bf16.begin(), run.keep_bf16.end(), module) != run.keep_bf16.end();
}

// Values one block holds: MXFP8 1x32; NVFP4 16x16 weight tiles, 1x16 otherwise.
std::int64_t block_values(const std::string& format, const std::string& operand) {
  if (format == "mxfp8") return 32;
  return operand == "weight" ? 256 : 16;
}

void add_keep_bf16(Fp8Finding& f, const BlockRunSettings& run, const std::string& why) {
  if (!kept(run, f.module)) f.remedies.push_back(block_remedy("--fp8-keep-bf16", f.module, "--fp8-keep-bf16 " + f.module, why));
}

// Fills the step range and the summed counts of a finding from one flagged row.
void count_step(Fp8Finding& f, const trace::BlockRow& r, std::int64_t count, double fraction) {
  if (f.steps == 0) f.first_step = r.step;
  f.last_step = r.step;
  ++f.steps;
  f.nonzero += r.nonzero;
  f.count += count;
  if (fraction > f.worst_fraction || f.steps == 1) {
    f.worst_fraction = fraction;
    f.worst_step = r.step;
  }
}

std::optional<Fp8Finding> floor_clipping(const BlockCopyRows& c, const BlockRunSettings& run) {
  if (c.format != "mxfp8") return std::nullopt;
  const double u = block_unit_roundoff(c.format);
  Fp8Finding f;
  for (const trace::BlockRow* r : c.rows) {
    if (r->saturated <= 0 || r->blocks_clipped <= 0 || !(r->rel_rms_error > u)) continue;
    count_step(f, *r, r->saturated, trace::block_fraction(r->saturated, r->nonzero));
    f.blocks_clipped += r->blocks_clipped;
    f.error = std::max(f.error, r->rel_rms_error);
  }
  if (f.steps == 0) return std::nullopt;
  f.kind = "mx_floor_clipping";
  f.module = c.module;
  f.operand = c.operand;
  f.copy = c.copy;
  f.format = c.format;
  f.threshold = 0;
  f.error_bound = u;
  f.fraction = trace::block_fraction(f.count, f.nonzero);
  // Round-up never clips a finite block (core/block_scaled.h): the only rule that clips is the OCP floor.
  if (!run.known || run.mx_scale != "round-up")
    f.remedies.push_back(block_remedy("--mx-scale", "round-up", "--mx-scale round-up",
                                      "round each block's amax / 448 up into E8M0: no block's largest value clips"));
  return f;
}

std::optional<Fp8Finding> outlier(const BlockCopyRows& c, const BlockRunSettings& run) {
  const double range = block_element_range(c.format);
  const std::int64_t per_block = block_values(c.format, c.operand);
  Fp8Finding f;
  for (const trace::BlockRow* r : c.rows) {
    const double lost = trace::block_fraction(r->underflow, r->nonzero);
    if (r->worst_block < 0 || !(r->max_block_range > range) || !(lost > kFp8GradUnderflowThreshold)) continue;
    // The worst block against what the worst of this step's null blocks reaches (block_flattened_bar).
    const std::int64_t bar = block_flattened_bar(c.format, c.operand, r->blocks);
    if (r->worst_block_underflow < bar) continue;
    const bool first = f.steps == 0;
    count_step(f, *r, r->underflow, lost);
    // The block named: the one flattened most over the flagged steps (the first such).
    if (first || r->worst_block_underflow > f.block_zeroed) {
      f.block_bar = bar;
      f.block_zeroed = r->worst_block_underflow;
      f.block_row = r->worst_block_row;
      f.block_col = r->worst_block_col;
      f.block_range = r->max_block_range;
      f.block_step = r->step;
    }
  }
  if (f.steps == 0) return std::nullopt;
  f.kind = "block_outlier";
  f.module = c.module;
  f.operand = c.operand;
  f.copy = c.copy;
  f.format = c.format;
  f.threshold = kFp8GradUnderflowThreshold;
  f.fraction = trace::block_fraction(f.count, f.nonzero);
  f.block_values = per_block;
  f.range_bound = range;
  // The Hadamard transform runs only on the wgrad operands (the columnwise copies of the input and the gradient):
  // it spreads an outlier over 16 values of the contraction, so it is offered only there, and only when off.
  const bool rht_applies = c.format == "nvfp4" && c.copy == "columnwise" && c.operand != "weight";
  if (rht_applies && (!run.known || !run.nvfp4_rht))
    f.remedies.push_back(block_remedy("--nvfp4-rht", "on", "drop --nvfp4-no-rht",
                                      "the random Hadamard transform spreads the outlier over 16 values before the "
                                      "block scale is chosen"));
  add_keep_bf16(f, run, "keep this Linear's GEMMs in bf16, out of the block-scaled format");
  if (c.format == "mxfp8" && (!run.known || run.precision == "mxfp8"))
    f.remedies.push_back(block_remedy("--precision", "fp8", "--precision fp8",
                                      "per-tensor FP8 (a scale per tensor and operand, E5M2 gradients)"));
  return f;
}

// The rowwise and columnwise copies of one Linear's input or weight, step by step.
std::optional<Fp8Finding> copy_mismatch(const BlockCopyRows& row, const BlockCopyRows& col, const BlockRunSettings& run) {
  const double u = block_unit_roundoff(row.format);
  // The floor: the share a null copy of the operand's 1-D blocks loses (NVFP4's weight copies are the same 16x16
  // tiles both ways: their inputs' 1x16 block stands for the format).
  const double floor = block_null_loss(row.format, row.operand == "weight" ? "input" : row.operand);
  std::map<std::int64_t, const trace::BlockRow*> by_step;
  for (const trace::BlockRow* r : row.rows) by_step[r->step] = r;
  Fp8Finding f;
  double worst_gap = -1;
  for (const trace::BlockRow* c : col.rows) {
    const auto it = by_step.find(c->step);
    if (it == by_step.end()) continue;
    const trace::BlockRow* r = it->second;
    const double ur = trace::block_fraction(r->underflow, r->nonzero), uc = trace::block_fraction(c->underflow, c->nonzero);
    const double de = std::fabs(c->rel_rms_error - r->rel_rms_error), du = std::fabs(uc - ur);
    // The underflow bar from the step's own counts (block_mismatch_bar), never under what a null copy loses.
    const double bar = block_mismatch_bar(r->underflow, r->nonzero, c->underflow, c->nonzero, floor);
    if (!(de > u) && !(du > bar)) continue;
    // The copy that lost more, by what set the copies apart: the error, or the underflow.
    const bool by_error = de / u >= du / bar;
    const bool col_worse = by_error ? c->rel_rms_error > r->rel_rms_error : uc > ur;
    const trace::BlockRow* worse = col_worse ? c : r;
    const trace::BlockRow* other = col_worse ? r : c;
    if (f.steps == 0) f.first_step = c->step;
    f.last_step = c->step;
    ++f.steps;
    const double gap = std::max(de / u, du / bar);
    if (gap > worst_gap) {
      worst_gap = gap;
      f.threshold = bar;
      f.worst_step = c->step;
      f.copy = worse->copy;
      f.error = worse->rel_rms_error;
      f.other_error = other->rel_rms_error;
      f.worst_fraction = trace::block_fraction(worse->underflow, worse->nonzero);
      f.other_fraction = trace::block_fraction(other->underflow, other->nonzero);
    }
  }
  if (f.steps == 0) return std::nullopt;
  f.kind = "block_copy_mismatch";
  f.module = row.module;
  f.operand = row.operand;
  f.format = row.format;
  f.error_bound = u;
  // A floor-clipped copy differs from its unclipped twin (the rows of a block and the columns of a block hold
  // different largest values): round-up removes the clipping from both.
  if (row.format == "mxfp8" && (!run.known || run.mx_scale == "floor"))
    f.remedies.push_back(block_remedy("--mx-scale", "round-up", "--mx-scale round-up",
                                      "round each block's amax / 448 up into E8M0: no copy clips its largest values"));
  add_keep_bf16(f, run, "keep this Linear's GEMMs in bf16: forward and backward use the same values");
  return f;
}

// The f32 twin's measure (a trace with /precision rows of the block-scaled Linears: --twin): per Linear, over its
// forward rows, the mean of precision_jump (its output's accumulated mean relative error against the unquantized
// f32 Linear over its inputs'), the mean of that accumulated error and of its inputs'. The Linear with the largest
// mean jump is named when its mean accumulated error is above its element's unit roundoff; nullopt otherwise, or
// (twin false) when no block-scaled Linear has twin rows.
std::optional<Fp8Finding> twin_error_dominates(const std::vector<BlockCopyRows>& copies, const BlockRunSettings& run,
                                               std::span<const trace::PrecisionRow> twin, bool& measured) {
  measured = false;
  std::map<std::string, std::string> formats;  // the block-scaled Linears and their formats (trained copies)
  for (const BlockCopyRows& c : copies)
    if (!c.what_if && !c.rows.empty()) formats.emplace(c.module, c.format);
  struct Measure {
    std::int64_t rows = 0, first_step = 0, last_step = 0, worst_step = 0;
    double jump = 0, acc = 0, in = 0, worst_jump = -1, worst_acc = 0;
  };
  std::map<std::string, Measure> by_module;
  for (const trace::PrecisionRow& r : twin) {
    if (r.op != "linear" || r.phase != trace::Phase::forward || !r.local || !formats.contains(r.module)) continue;
    Measure& m = by_module[r.module];
    const double jump = precision_jump(r);
    if (m.rows == 0 || r.step < m.first_step) m.first_step = r.step;
    if (m.rows == 0 || r.step > m.last_step) m.last_step = r.step;
    ++m.rows;
    m.jump += jump;
    m.acc += r.acc_mean_rel;
    m.in += r.in_acc_mean_rel;
    if (jump > m.worst_jump) m.worst_jump = jump, m.worst_acc = r.acc_mean_rel, m.worst_step = r.step;
  }
  if (by_module.empty()) return std::nullopt;
  measured = true;
  for (auto& [module, m] : by_module) {
    const double n = static_cast<double>(m.rows);
    m.jump /= n, m.acc /= n, m.in /= n;
  }
  const std::string* top = nullptr;
  for (const auto& [module, m] : by_module)
    if (top == nullptr || m.jump > by_module.at(*top).jump) top = &module;
  const Measure& m = by_module.at(*top);
  const std::string& format = formats.at(*top);
  const double u = block_unit_roundoff(format);
  if (!(m.acc > u)) return std::nullopt;
  Fp8Finding f;
  f.kind = "block_error_dominates";
  f.twin = true;
  f.module = *top;
  f.operand = "output";  // the twin measures the Linear's output, not one copy
  f.format = format;
  f.error = m.acc;
  f.in_error = m.in;
  f.jump = m.jump;
  f.error_bound = u;
  f.threshold = u;
  f.fraction = f.error;
  f.steps = m.rows;
  f.first_step = m.first_step;
  f.last_step = m.last_step;
  f.worst_step = m.worst_step;
  f.worst_fraction = m.worst_acc;
  f.worst_jump = m.worst_jump;
  f.next_jump = -1;
  for (const auto& [module, n] : by_module)
    if (module != *top && n.jump > f.next_jump) f.next_jump = n.jump, f.next_error = n.acc, f.next_module = module;
  if (f.next_module.empty()) f.next_jump = 0;
  add_keep_bf16(f, run, "keep the Linear whose block-scaled error dominates in bf16");
  return f;
}

// The Linear whose mean relative RMS error of a copy, in units of its element's unit roundoff, is the largest, if
// above 1 (fp8_error_dominates' rule on the /blocks rows): the rule of a trace without twin rows for the Linears.
std::optional<Fp8Finding> error_dominates(const std::vector<BlockCopyRows>& copies, const BlockRunSettings& run,
                                          std::span<const trace::PrecisionRow> twin) {
  bool measured = false;
  std::optional<Fp8Finding> by_twin = twin_error_dominates(copies, run, twin, measured);
  if (measured) return by_twin;
  struct Worst {
    double error = -1, ratio = -1;
    const BlockCopyRows* copy = nullptr;
  };
  std::map<std::string, Worst> by_module;
  for (const BlockCopyRows& c : copies) {
    if (c.what_if || c.rows.empty()) continue;
    double sum = 0;
    for (const trace::BlockRow* r : c.rows) sum += r->rel_rms_error;
    const double mean = sum / static_cast<double>(c.rows.size());
    const double ratio = mean / block_unit_roundoff(c.format);
    Worst& w = by_module[c.module];
    if (ratio > w.ratio) w = {mean, ratio, &c};
  }
  const Worst* top = nullptr;
  std::string top_module;
  for (const auto& [module, w] : by_module)
    if (top == nullptr || w.ratio > top->ratio) top = &w, top_module = module;
  if (top == nullptr || !(top->ratio > 1)) return std::nullopt;
  const BlockCopyRows& c = *top->copy;
  Fp8Finding f;
  f.kind = "block_error_dominates";
  f.module = top_module;
  f.operand = c.operand;
  f.copy = c.copy;
  f.format = c.format;
  f.error = top->error;
  f.error_bound = block_unit_roundoff(c.format);
  f.threshold = f.error_bound;
  f.fraction = f.error;  // as fp8_error_dominates
  double next_ratio = -1;
  for (const auto& [module, w] : by_module)
    if (module != top_module && w.ratio > next_ratio) next_ratio = w.ratio, f.next_error = w.error, f.next_module = module;
  for (const trace::BlockRow* r : c.rows) {
    if (!(r->rel_rms_error > f.error_bound)) continue;
    if (f.steps == 0) f.first_step = r->step;
    f.last_step = r->step;
    ++f.steps;
    if (r->rel_rms_error > f.worst_fraction) f.worst_fraction = r->rel_rms_error, f.worst_step = r->step;
  }
  if (f.steps == 0) f.first_step = c.rows.front()->step, f.last_step = c.rows.back()->step;
  add_keep_bf16(f, run, "keep the Linear whose block-scaled error dominates in bf16");
  return f;
}

}  // namespace

BlockRunSettings block_run_settings(const std::string& config_json) {
  BlockRunSettings s;
  const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (!j.is_object()) return s;
  const auto p = j.find("precision");
  if (p == j.end() || !p->is_string()) return s;
  s.precision = p->get<std::string>();
  if (const auto it = j.find("mx_scale"); it != j.end() && it->is_string()) s.mx_scale = it->get<std::string>();
  if (const auto it = j.find("nvfp4_rht"); it != j.end() && it->is_boolean()) s.nvfp4_rht = it->get<bool>();
  if (const auto it = j.find("fp8_keep_bf16"); it != j.end() && it->is_array())
    for (const auto& g : *it)
      if (g.is_string()) s.keep_bf16.push_back(g.get<std::string>());
  s.known = true;
  return s;
}

std::vector<Fp8Finding> block_findings(std::span<const trace::BlockRow> rows, const BlockRunSettings& run,
                                       std::span<const trace::PrecisionRow> twin) {
  std::vector<trace::BlockRow> trained;
  for (const trace::BlockRow& r : rows)
    if (!r.what_if) trained.push_back(r);
  const std::vector<BlockCopyRows> copies = group_block_rows(trained);
  std::vector<Fp8Finding> clipping, outliers, mismatch;
  for (const BlockCopyRows& c : copies) {
    if (auto f = floor_clipping(c, run)) clipping.push_back(std::move(*f));
    if (auto f = outlier(c, run)) outliers.push_back(std::move(*f));
    // The forward's copy against the backward's: the input (fprop rowwise, wgrad columnwise) and the weight (fprop
    // rowwise, dgrad columnwise). grad_output's two copies both feed the backward.
    if (c.copy == "rowwise" && c.operand != "grad_output") {
      for (const BlockCopyRows& d : copies)
        if (d.copy == "columnwise" && d.module == c.module && d.operand == c.operand && d.format == c.format)
          if (auto f = copy_mismatch(c, d, run)) mismatch.push_back(std::move(*f));
    }
  }
  std::vector<Fp8Finding> out = std::move(clipping);
  for (Fp8Finding& f : outliers) out.push_back(std::move(f));
  for (Fp8Finding& f : mismatch) out.push_back(std::move(f));
  if (auto f = error_dominates(copies, run, twin)) out.push_back(std::move(*f));
  return out;
}

}  // namespace ampscope::analysis
