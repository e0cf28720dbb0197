#include <fmt/format.h>

#include "core/error.h"
#include "samples/train.h"

namespace ampscope::samples {

const std::vector<Scenario>& scenario_registry() {
  static const std::vector<Scenario> kScenarios = {};
  return kScenarios;
}

const Scenario& find_scenario(std::string_view name) {
  std::string known;
  for (const Scenario& s : scenario_registry()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(fmt::format("unknown scenario '{}'; known scenarios: {}\nhint: ampscope train --list-scenarios", name,
                          known.empty() ? "(none)" : known));
}

}  // namespace ampscope::samples
