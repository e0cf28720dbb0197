#!/usr/bin/env bash
# Sets up if needed (Debian packages, configure, incremental build; see scripts/setup.sh), then runs
# every test with ctest. Arguments go to setup.sh's configure step, e.g. -DAMPSCOPE_CUDA=OFF.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${AMPSCOPE_BUILD_DIR:-$root/build}

"$root/scripts/setup.sh" "$@"
echo "test: running ctest in $build_dir"
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)"
