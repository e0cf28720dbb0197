#!/usr/bin/env bash
# ampscope as a subproject (issue 17): a consumer project (tests/install/subdir_consumer) with ampscope's
# source tree as its subfolder ampscope/ calls add_subdirectory(ampscope) and links ampscope::ampscope
# and ampscope::reader. Checks that ampscope's tests, benchmarks, samples and viewer stay off there
# (the consumer's CMakeLists fails otherwise), that the consumer's own core/tensor.h and ampscope's
# <ampscope/core/tensor.h> do not collide, and that the consumer trains (its loss falls).
#
#   tests/install/add_subdirectory_test.sh BUILD_DIR WORK_DIR WITH_CUDA(ON|OFF)
# BUILD_DIR is the main build, whose generator, compilers and launcher the consumer reuses; WITH_CUDA
# is what the main build has, so the subproject builds the same backends.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/install/common.sh"
if [ $# -ne 3 ]; then
  echo "usage: $0 BUILD_DIR WORK_DIR WITH_CUDA(ON|OFF)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
work=$2
with_cuda=$3
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
mapfile -t toolchain < <(consumer_cmake_args "$build" cuda)

project=$work/project
cp -r "$root/tests/install/subdir_consumer" "$project"
ln -s "$root" "$project/ampscope"
cmake -S "$project" -B "$work/build" "${toolchain[@]}" -DAMPSCOPE_CUDA="$with_cuda" >"$work/configure.log" ||
  { cat "$work/configure.log"; fail "configuring the add_subdirectory consumer"; }
cmake --build "$work/build" || fail "building the add_subdirectory consumer"
"$work/build/subdir_consumer" || fail "subdir_consumer did not train"
"$work/build/subdir_reader" || fail "subdir_reader failed"
echo "PASS"
