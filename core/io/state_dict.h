// core/io/state_dict.h: the key -> value maps that stateful runtime objects (GradScaler, optimizers,
// generators, modules) save and load, as PyTorch's state_dict() does. Checkpoints (core/io/checkpoint.h)
// write them to HDF5 and read them back; values keep their exact type (a double stays a double, a step
// count stays an integer, a tensor keeps its dtype and bits).
//
//   StateDict sd = scaler.state_dict();          // {"scale": 65536.0, "growth_factor": 2.0, ..., "_growth_tracker": 0}
//   double s = std::get<double>(sd.at("scale"));
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include "core/tensor.h"

namespace ampscope {

using StateValue = std::variant<double, std::int64_t, bool, std::string, Tensor>;
using StateDict = std::map<std::string, StateValue>;

}  // namespace ampscope
