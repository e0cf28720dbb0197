# Shared by the tests in tests/install: reading the main build's settings, so that a consumer project is
# configured with the same generator, compilers and compiler launcher (ccache) as the build under test.
# Sourced, not run.

# cache_value BUILD_DIR NAME: the value of NAME in BUILD_DIR/CMakeCache.txt, empty when absent.
cache_value() {
  sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt" | head -n 1
}

# consumer_cmake_args BUILD_DIR [cuda]: -G and -D arguments that repeat the build's toolchain choices, one
# per line; with `cuda`, its CUDA compiler, launcher and architectures too (for a project that compiles
# ampscope's CUDA sources; a find_package consumer must find the CUDA Toolkit by itself, as a user's does).
consumer_cmake_args() {
  local build=$1 value name names
  names=(CMAKE_BUILD_TYPE CMAKE_CXX_COMPILER CMAKE_C_COMPILER CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER)
  if [ "${2:-}" = cuda ]; then
    names+=(CMAKE_CUDA_COMPILER CMAKE_CUDA_COMPILER_LAUNCHER CMAKE_CUDA_ARCHITECTURES)
  fi
  value=$(cache_value "$build" CMAKE_GENERATOR)
  if [ -n "$value" ]; then printf '%s\n' -G "$value"; fi
  for name in "${names[@]}"; do
    value=$(cache_value "$build" "$name")
    if [ -n "$value" ] && [[ "$value" != *-NOTFOUND ]]; then printf '%s\n' "-D$name=$value"; fi
  done
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
