// The verified mark: reads `ampscope fix`'s results file. See probes/analysis/fix.h.
#include "probes/analysis/fix.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ampscope::analysis {
namespace {

constexpr std::uintmax_t kMaxResultsBytes = std::uintmax_t{16} << 20;

}  // namespace

std::string fix_results_path(const std::string& trace) {
  const std::filesystem::path p(trace);
  return (p.parent_path() / (p.stem().string() + ".fix.json")).string();
}

std::string mark_verified(Report& report, const std::string& trace) {
  const std::string path = fix_results_path(trace);
  std::error_code ec;
  // Examined before it is opened: a FIFO or a device planted under the name is never opened (it could block
  // or never end).
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  auto ignored = [&](const std::string& why) { return fmt::format("NOTE: ignoring '{}': {}", path, why); };
  // `ampscope fix` writes a few kilobytes; a file far larger is not one of its results.
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxResultsBytes) {
    return ignored(fmt::format("it is larger than {} MiB, far more than `ampscope fix` writes; run `ampscope fix` again",
                               kMaxResultsBytes >> 20));
  }
  std::ifstream f(path, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  if (!f && !f.eof()) return ignored("cannot read it");
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return ignored("it is not JSON (damaged?); run `ampscope fix` again");
  const auto* runs = doc.contains("runs") && doc["runs"].is_array() ? &doc["runs"] : nullptr;
  // An FP8 fix names its "first_finding"; any other its "first_anomaly".
  const char* first_key = doc.contains("first_finding") ? "first_finding" : "first_anomaly";
  const auto* first = doc.contains(first_key) && doc[first_key].is_object() ? &doc[first_key] : nullptr;
  if (runs == nullptr || first == nullptr || !doc.contains("cause") || !doc["cause"].is_string())
    return ignored("it lacks 'runs', 'cause' or 'first_anomaly' (damaged?); run `ampscope fix` again");
  // The file belongs to this run only when it names the same first anomaly (a trace written again since
  // `ampscope fix` ran has another story).
  // An FP8 run without anomalies: fix proved the remedies of its first FP8 finding (cause "fp8:" and the kind).
  // fix --finding KIND proves the remedies of the first finding of that kind: the file's cause names it.
  const bool fp8 = report.anomalies.empty() && !report.fp8.findings.empty();
  if (report.anomalies.empty() && !fp8)
    return ignored("the report finds no anomaly, the results file describes one");
  const nlohmann::json& step = (*first)["step"];
  const nlohmann::json& op = (*first)["op"];
  const Fp8Finding* fixed = nullptr;
  if (fp8) {
    fixed = &report.fp8.findings.front();
    const std::string doc_cause = doc["cause"].get<std::string>();
    for (const Fp8Finding& f : report.fp8.findings)
      if ("fp8:" + f.kind == doc_cause) {
        fixed = &f;
        break;
      }
  }
  const std::string cause = fp8 ? "fp8:" + fixed->kind : report.anomalies.front().cause;
  const std::int64_t first_step = fp8 ? fixed->first_step : report.anomalies.front().step;
  const std::string first_op = fp8 ? fixed->operand : report.anomalies.front().op;
  if (doc["cause"] != cause || !step.is_number_integer() || step.get<std::int64_t>() != first_step || !op.is_string() ||
      op.get<std::string>() != first_op)
    return ignored("it was written for another run (its first anomaly differs); run `ampscope fix` again");
  for (const nlohmann::json& r : *runs) {
    if (!r.is_object()) return ignored("an entry of 'runs' is not an object (damaged?)");
    const auto verified = r.find("verified");
    const auto kind = r.find("kind");
    const auto flag = r.find("remedy_flag");
    if (verified == r.end() || !verified->is_boolean() || kind == r.end() || !kind->is_string() ||
        flag == r.end() || !flag->is_string())
      return ignored("an entry of 'runs' lacks 'verified', 'kind' or 'remedy_flag' (damaged?)");
  }
  for (const nlohmann::json& r : *runs) {
    if (!r["verified"].get<bool>()) continue;
    // A remedy without a flag (cast_f32, verified on a recorded PyTorch run by keeping its op's module in f32)
    // is told from others of its kind by its text ("remedy_text"), when the entry has one.
    const auto text = r.find("remedy_text");
    const bool by_text = text != r.end() && text->is_string();
    for (Diagnosis& diag : report.anomalies)
      for (Remedy& m : diag.remedies)
        if (m.kind == r["kind"].get<std::string>() && m.flag == r["remedy_flag"].get<std::string>() &&
            (!by_text || m.text == text->get<std::string>()))
          m.verified = true;
    // An FP8 remedy: by its command line (fix tries the largest margin of the findings, so a finding whose own
    // margin is smaller is not marked: that margin was not tried).
    for (Fp8Finding& f : report.fp8.findings)
      for (Fp8Remedy& m : f.remedies)
        if (fp8 && f.kind == fixed->kind && m.command_line == r["remedy_flag"].get<std::string>()) m.verified = true;
  }
  return "";
}

}  // namespace ampscope::analysis
