#!/usr/bin/env bash
# The installed CMake package, used as a user would use it (issue 17):
#   1. `cmake --install` the build into a prefix, then move the prefix elsewhere (it must be relocatable:
#      no installed text file may name the source or build folder);
#   2. check the installed headers: every quoted include resolves inside the prefix, no backend internal
#      (kernels/, CUDA headers) is installed or included;
#   3. build samples/custom_model as a project of its own with find_package(ampscope) against the prefix,
#      run it (a few training steps writing a trace), and read that trace with the installed
#      `ampscope report`; it links the CUDA runtime and cuBLAS exactly when the build has CUDA;
#   4. build tests/install/reader_consumer with the `reader` component alone, check that it links neither
#      OpenBLAS nor CUDA, and compare its row counts of the trace with h5py's (an independent reader);
#   5. build and run every code block docs/ marks as a complete program, exactly as printed
#      (tests/install/doc_programs.sh).
#
#   tests/install/out_of_tree_test.sh BUILD_DIR WORK_DIR WITH_CUDA(ON|OFF)
# Registered with ctest (tests/CMakeLists.txt) as install_out_of_tree; needs a complete build.
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
mapfile -t toolchain < <(consumer_cmake_args "$build")

echo "== 1. install into a prefix, then move the prefix"
cmake --install "$build" --prefix "$work/prefix-at-install" >"$work/install.log"
mv "$work/prefix-at-install" "$work/prefix"
prefix=$work/prefix
config=$(find "$prefix" -name ampscopeConfig.cmake)
[ -n "$config" ] || fail "no ampscopeConfig.cmake under $prefix"
[ -n "$(find "$prefix" -name ampscopeConfigVersion.cmake)" ] || fail "no ampscopeConfigVersion.cmake under $prefix"
if leaks=$(grep -rlIF -e "$root" -e "$build" -e "prefix-at-install" "$prefix"); then
  fail "installed files name the source, build or install-time folder: $leaks"
fi

echo "== 2. installed headers"
include=$prefix/include
[ -f "$include/ampscope/core/ops.h" ] || fail "no ampscope/core/ops.h under $include"
# The tokenizer and the token files docs/checkpoints.md shows (issue 31), not the architectures (nlohmann).
for h in models/bpe_tokenizer.h models/token_data.h; do
  [ -f "$include/ampscope/$h" ] || fail "no ampscope/$h under $include"
done
[ ! -e "$include/ampscope/models/hf_models.h" ] || fail "models/hf_models.h (which includes nlohmann/json) is installed"
[ ! -e "$include/ampscope/kernels" ] || fail "backend internals installed: $include/ampscope/kernels"
[ -z "$(find "$include" -name '*.h' ! -path "$include/ampscope/*")" ] || fail "headers outside $include/ampscope"
while IFS= read -r header; do
  while IFS= read -r included; do
    case "$included" in
      ampscope/kernels/*) fail "$header includes the backend internal $included" ;;
      ampscope/*) [ -f "$include/$included" ] || fail "$header includes $included, which is not installed" ;;
      *) fail "$header includes \"$included\", which is not under ampscope/" ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$header")
  if grep -qE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(cuda|cublas|hdf5|nlohmann)' "$header"; then
    fail "$header includes a CUDA, HDF5 or JSON header"
  fi
done < <(find "$include" -name '*.h')

echo "== 3. samples/custom_model against the prefix"
cmake -S "$root/samples/custom_model" -B "$work/custom_model" "${toolchain[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/custom_model-configure.log" || { cat "$work/custom_model-configure.log"; fail "configuring custom_model"; }
cmake --build "$work/custom_model" || fail "building custom_model"
trace=$work/custom.h5
"$work/custom_model/custom_model_example" "$trace" || fail "custom_model_example failed"
[ -s "$trace" ] || fail "custom_model_example wrote no trace at $trace"
"$prefix/bin/ampscope" report "$trace" >"$work/report.txt" || { cat "$work/report.txt"; fail "ampscope report failed"; }
grep -qF "$trace" "$work/report.txt" || { cat "$work/report.txt"; fail "the report does not name $trace"; }
libs=$(ldd "$work/custom_model/custom_model_example")
if [ "$with_cuda" = ON ]; then
  grep -q libcudart <<<"$libs" || fail "a CUDA build's consumer does not link the CUDA runtime"
  # cuBLAS is loaded when the first CUDA GEMM runs (kernels/cuda/cublas_library.h), never at start.
  ! grep -q libcublas <<<"$libs" || fail "a CUDA build's consumer links cuBLAS, which should be loaded at run time"
else
  ! grep -q libcudart <<<"$libs" || fail "a build without CUDA gave its consumer the CUDA runtime"
fi
grep -q libopenblas <<<"$libs" || grep -q libblas <<<"$libs" || fail "custom_model does not link OpenBLAS"

echo "== 4. a reader-only consumer"
cmake -S "$root/tests/install/reader_consumer" -B "$work/reader" "${toolchain[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/reader-configure.log" || { cat "$work/reader-configure.log"; fail "configuring reader_consumer"; }
cmake --build "$work/reader" || fail "building reader_consumer"
libs=$(ldd "$work/reader/trace_summary")
if grep -qE 'libcudart|libcublas|libopenblas|libblas' <<<"$libs"; then
  fail "ampscope::reader brought the runtime's libraries: $libs"
fi
summary=$("$work/reader/trace_summary" "$trace") || fail "trace_summary failed"
echo "trace_summary: $summary"
read -r _ steps _ ops _ complete _ <<<"$summary"
[ "$complete" = 1 ] || fail "trace_summary says the trace is not complete"
if /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  expected=$(/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r'); print(len(f['steps']), len(f['ops']))" "$trace")
  [ "$expected" = "$steps $ops" ] || fail "trace_summary counted $steps steps and $ops op rows, h5py $expected"
else
  echo "note: Debian's python3-h5py is not installed; the row counts were not compared with h5py"
fi
echo "== 5. the docs' complete programs, as printed"
"$root/tests/install/doc_programs.sh" "$root" "$prefix" "$work/doc_programs" "${toolchain[@]}" || fail "a docs program"
echo "PASS"
