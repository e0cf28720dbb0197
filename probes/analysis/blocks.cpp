#include "probes/analysis/blocks.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

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

}  // namespace ampscope::analysis
