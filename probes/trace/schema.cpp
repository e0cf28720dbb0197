#include "probes/trace/schema.h"

#include <stdexcept>
#include <string>

namespace ampscope::trace {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::scaler: return "scaler";
  }
  return "?";
}

std::string_view input_marker_name(std::int64_t marker) {
  switch (marker) {
    case kInputNone: return "none";
    case kInputParameter: return "parameter";
    case kInputData: return "data";
    case kInputUnrecorded: return "unrecorded";
    case kInputSummed: return "summed";
    case kInputUnknown: return "unknown";
    case kInputOtherStep: return "other step";
    default: return marker >= 0 ? "" : "invalid";
  }
}

Phase parse_phase(std::string_view name) {
  for (Phase p : {Phase::forward, Phase::backward, Phase::optimizer, Phase::scaler}) {
    if (phase_name(p) == name) return p;
  }
  throw std::invalid_argument("unknown phase '" + std::string(name) +
                              "' (expected forward, backward, optimizer or scaler)");
}

}  // namespace ampscope::trace
