// probes/analysis/internal/rows.h: what the analysis's files say about one recorded op row (its non-finite
// count, where it ran, its numbers as text) and the provenance index of a step (which row produced an input).
// Internal to the analysis library (not installed: cmake/headers.cmake installs probes/*/*.h, not this folder).
//
//   SeqIndex idx;  for (const OpRow& r : ops) idx.emplace(r.seq, &r);
//   if (const OpRow* p = producer_of(row, 0, idx)) evidence = where_text(*p);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "probes/trace/schema.h"

namespace ampscope::analysis::detail {

// NaN and inf in the row's output; a mask's fill writes -inf on purpose (masked_fill, a causal mask): only its
// NaN and +inf are anomalies.
std::int64_t non_finite(const trace::OpRow& r);
// "3 NaN, 1 +inf".
std::string counts_text(const trace::TensorHealth& h);
// "div in loss", "the backward of exp in head", "div (outside any module)".
std::string place(const trace::OpRow& r);
// A number as the report writes it (up to 6 significant digits).
std::string number(double v);
// A factor to two significant digits, as a person writes it: 100.3 -> "100", 0.00997 -> "0.01".
std::string about(double x);

// The rows of one step by seq.
using SeqIndex = std::unordered_map<std::int64_t, const trace::OpRow*>;
// The row of the step whose op produced input i of r, or null (a marker, or a row not in idx).
const trace::OpRow* producer_of(const trace::OpRow& r, std::size_t i, const SeqIndex& idx);
// How many inputs r has (tensor or marker; kInputNone aside).
std::size_t tensor_inputs(const trace::OpRow& r);
// "div in loss (f16 [64, 64], seq 12)".
std::string where_text(const trace::OpRow& r);

bool is_low(const std::string& dtype);  // f16 or bf16
std::string fraction_text(double f);    // "12.5%"

}  // namespace ampscope::analysis::detail
