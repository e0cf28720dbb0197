// cli/demo.h: `ampscope demo`, a tour of the tensors and backends: exact FP16/BF16 rounding, views,
// seeded random tensors, broadcasting arithmetic, and (when a GPU is present) the CUDA backend
// computing the same bits as the CPU backend.
#pragma once

#include <string>

namespace ampscope {

struct DemoOptions {
  std::string device = "auto";  // auto | cpu | cuda
  unsigned long long seed = 0;
};

// Prints the tour to stdout. Returns 0 when every cross-check passed, 1 when one did not.
int run_demo(const DemoOptions& options);

}  // namespace ampscope
