// cli/program.h: how the user ran `ampscope` (argv[0]), so that commands a command suggests ("ampscope report
// run.h5") can be pasted as printed even when ampscope is not on PATH. main() sets it once.
//
//   set_program_path(argv[0]);   // in main
//   program_path();              // "build/bin/ampscope", or "ampscope" when run from PATH
#pragma once

#include <string>

namespace ampscope::samples {

inline std::string& program_path_storage() {
  static std::string path = "ampscope";
  return path;
}
inline void set_program_path(std::string path) { program_path_storage() = std::move(path); }
inline const std::string& program_path() { return program_path_storage(); }

}  // namespace ampscope::samples
