// How a remedy reaches an op to compute it in f32 (probes/analysis/internal/reach.h).
#include "probes/analysis/internal/reach.h"

#include <algorithm>

#include <fmt/format.h>

namespace ampscope::analysis {

std::string autocast_pattern(const std::string& module) { return "'" + module + "'"; }

namespace detail {
namespace {

// A wildcard over numbered children ("blocks.0.attn" -> "blocks.*.attn") for the same layer in every block.
std::string wildcard(const std::string& module) {
  std::string out, part;
  bool changed = false;
  auto flush = [&] {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!out.empty()) out += '.';
    out += digits ? "*" : part;
    changed |= digits;
    part.clear();
  };
  for (char c : module) {
    if (c == '.') flush(); else part += c;
  }
  flush();
  return changed ? out : "";
}

Remedy autocast_remedy(const std::string& module, const std::string& op, const std::string& why) {
  Remedy m;
  m.kind = "autocast_fp32";
  m.pattern_is_op = module.empty();
  m.pattern = m.pattern_is_op ? op : module;
  m.flag = fmt::format("--autocast-fp32 {}", autocast_pattern(m.pattern));
  m.code = fmt::format("AutocastOverrideGuard keep_f32({{.{} = \"{}\", .precision = Precision::f32}});  // around the "
                       "forward pass",
                       m.pattern_is_op ? "op" : "module", m.pattern);
  m.text = fmt::format("run {} in f32{}", m.pattern_is_op ? fmt::format("every {} op", op) : fmt::format("module {}", module),
                       why.empty() ? "" : ": " + why);
  return m;
}

Remedy every_block_remedy(const std::string& module) {
  const std::string wild = wildcard(module);
  if (wild.empty()) return {};
  Remedy m = autocast_remedy(wild, "", "the same layer in every block");
  return m;
}

Remedy code_remedy(std::string text, std::string code) {
  Remedy m;
  m.kind = "cast_f32";
  m.text = std::move(text);
  m.code = std::move(code);
  return m;
}

bool low(const std::string& dtype) { return dtype == "f16" || dtype == "bf16"; }

}  // namespace

Reach reach_of(std::string_view autocast_reason, trace::Phase phase) {
  if (autocast_reason.empty() && phase == trace::Phase::forward) return Reach::outside_autocast;
  if (autocast_reason.find("a dtype was given") != std::string_view::npos) return Reach::explicit_dtype;
  return Reach::autocast;
}

bool keeps_f32_input(std::string_view reason) {
  if (reason.empty()) return true;
  // An override states its target ("override (op 'x') -> f32 (the table says ...)"); the table's own reasons
  // name the list ("... is on the fp32 list: runs in f32"), and a composite's steps "(lower_precision_fp)".
  if (reason.rfind("override (", 0) == 0) return reason.find(") -> f32") != std::string_view::npos;
  return reason.find("lower_precision_fp") == std::string_view::npos &&
         reason.find("a dtype was given") == std::string_view::npos;
}

std::string place_of(const std::string& op, const std::string& module) {
  return module.empty() ? op + " (outside any module)" : fmt::format("{} in {}", op, module);
}

void f32_remedies(const F32Target& t, const std::string& why, std::vector<Remedy>& out, bool every_block) {
  const Reach reach = t.recorded ? reach_of(t.autocast, t.phase) : Reach::autocast;
  const std::string at = place_of(t.op, t.module);
  if (reach == Reach::explicit_dtype && low(t.dtype)) {
    out.push_back(code_remedy(fmt::format("{} was called with an explicit dtype, {}, which autocast respects (an "
                                          "override cannot reach it): ask for f32 in the call{}",
                                          at, t.dtype, why.empty() ? "" : " (" + why + ")"),
                              fmt::format("Tensor y = {}(x, dim, DType::f32);  // not the input's {}", t.op, t.dtype)));
    return;
  }
  if (reach == Reach::outside_autocast && low(t.dtype)) {
    out.push_back(code_remedy(fmt::format("{} ran outside autocast, in its inputs' {} (an autocast override cannot "
                                          "reach it): cast its input to f32 first{}",
                                          at, t.dtype, why.empty() ? "" : " (" + why + ")"),
                              fmt::format("Tensor x32 = x.to(DType::f32);  // then {}(x32, ...)", t.op)));
    return;
  }
  const std::string module = t.by_op ? "" : t.module;
  out.push_back(autocast_remedy(module, t.op, why));
  if (!every_block) return;
  Remedy every = every_block_remedy(module);
  if (!every.kind.empty()) out.push_back(std::move(every));
}

}  // namespace detail
}  // namespace ampscope::analysis
