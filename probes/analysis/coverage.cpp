// What the probe's set-up may have hidden (probes/analysis/internal/coverage.h).
#include "probes/analysis/internal/coverage.h"

#include "probes/analysis/internal/reach.h"
#include "probes/analysis/internal/remedies.h"

#include <algorithm>
#include <exception>

#include <fnmatch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace ampscope::analysis::detail {

namespace {

std::string globs_text(const std::vector<std::string>& globs) {
  std::vector<std::string> q;
  for (const std::string& g : globs) q.push_back("'" + g + "'");
  return fmt::format("{}", fmt::join(q, ", "));
}

}  // namespace

// What the probe's set-up (the root attribute `probe`) may have hidden, as notes and as evidence on the
// diagnoses it concerns.
void coverage(Report& rep, const std::set<std::string>& overrides_applied,
              const std::set<std::pair<std::string, std::string>>& outside_autocast) {
  Coverage& c = rep.coverage;
  if (rep.steps == 0)
    c.notes.push_back("the trace holds no step: a probe records ops only inside a probe::StepScope (an op outside "
                      "any step is recorded only with ProbeOptions::outside_steps)");
  if (rep.run.probe.empty()) {
    if (!rep.anomalies.empty())
      c.notes.push_back("this trace does not say how the probe was set up (an older trace, or a writer given no "
                        "probe description): if it filtered ops or sampled steps, the origin may be in an op it did "
                        "not record");
    return;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(rep.run.probe);
    c.level = j.value("level", "");
    c.ops = j.value("ops", std::vector<std::string>{});
    c.modules = j.value("modules", std::vector<std::string>{});
    c.every = j.value("every", std::int64_t{1});
    c.flight_recorder = j.value("flight_recorder", false);
    std::set<std::string> unmatched;
    for (const auto& o : j.value("autocast_overrides", nlohmann::json::array())) {
      const std::string op = o.value("op", ""), module = o.value("module", ""), to = o.value("precision", "f32");
      for (const std::string& g : {op, module})
        if (!g.empty() && overrides_applied.count(g) == 0) unmatched.insert(g);
      c.autocast_overrides.push_back(!op.empty() && !module.empty()
                                         ? fmt::format("op '{}' in module '{}' -> {}", op, module, to)
                                         : !op.empty() ? fmt::format("op '{}' -> {}", op, to)
                                                       : fmt::format("module '{}' -> {}", module, to));
    }
    // ampscope train installs each --autocast-fp32 glob twice (as an op glob and as a module glob): a glob
    // is unmatched when neither decided an op's dtype.
    for (const std::string& g : overrides_applied) unmatched.erase(g);
    for (const std::string& g : unmatched) {
      // Ops the glob names (by op or by module) that ran outside autocast: the override was right about them,
      // it just cannot reach them.
      std::vector<std::string> named;
      for (const auto& [op, module] : outside_autocast) {
        if (fnmatch(g.c_str(), op.c_str(), 0) != 0 && fnmatch(g.c_str(), module.c_str(), 0) != 0) continue;
        named.push_back(place_of(op, module));
      }
      if (!named.empty()) {
        const std::size_t n = named.size();
        if (n > 3) named.resize(3);
        c.notes.push_back(fmt::format("the autocast override '{}' decided no recorded op's dtype: the ops it names ({}{}) "
                                      "ran outside any autocast region, where an override does nothing; cast their "
                                      "input to f32 instead (Tensor x32 = x.to(DType::f32);), or run them inside the "
                                      "region",
                                      g, fmt::join(named, ", "), n > 3 ? fmt::format(" and {} more", n - 3) : ""));
        continue;
      }
      c.notes.push_back(fmt::format("the autocast override '{}' decided no recorded op's dtype: a typo, or a pattern that "
                                    "names neither an op nor the module path an op runs in (a module's own ops run "
                                    "in its path, its children's in theirs)",
                                    g));
    }
    c.known = true;
  } catch (const std::exception& e) {
    c.notes.push_back(fmt::format("the trace's probe description is not valid JSON ({}): what the probe recorded "
                                  "is unknown",
                                  e.what()));
    return;
  }
  const bool filtered = !c.ops.empty() || !c.modules.empty();
  if (filtered) {
    std::vector<std::string> what;
    if (!c.ops.empty()) what.push_back("ops " + globs_text(c.ops));
    if (!c.modules.empty()) what.push_back("modules " + globs_text(c.modules));
    c.notes.push_back(fmt::format("the probe recorded only {}: an origin in any other op is invisible here, and "
                                  "the first anomaly recorded may be downstream of it; record every op to be sure",
                                  fmt::join(what, " in ")));
  }
  if (c.every > 1)
    c.notes.push_back(fmt::format("ops were recorded every {} steps{}: an origin in another step is seen only if "
                                  "its step was kept",
                                  c.every, c.flight_recorder ? " (the flight recorder also kept anomalous steps and "
                                                               "the steps before them)"
                                                             : ""));
  if (c.level == "off" || c.level == "dtype")
    c.notes.push_back(fmt::format("probe level {}: no statistics, so no NaN/inf can be found in ops", c.level));
  if (!filtered) return;
  for (Diagnosis& d : rep.anomalies) {
    if (d.op.empty() || d.cause == "nonfinite_input" || d.cause == "nonfinite_weights") {
      const bool has = std::any_of(d.remedies.begin(), d.remedies.end(),
                                   [](const Remedy& m) { return m.kind == "record_every_op"; });
      if (has) continue;
      d.evidence.push_back("the probe did not record every op (see the coverage notes): the true origin may be "
                           "an op it never saw");
      d.remedies.insert(d.remedies.begin(),
                        simple("record_every_op",
                               "first record every op (no op or module filter) and run again to find the origin; "
                               "the remedies after this one answer what this trace shows, which may be downstream",
                               "", "probe::ProbeOptions options;  // no .ops / .modules filter"));
      d.remedy = remedy_text(d.remedies);
    }
  }
}

}  // namespace ampscope::analysis::detail
