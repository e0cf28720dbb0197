#!/usr/bin/env bash
# Every code block in docs/ that claims to be a complete program builds and runs, exactly as printed, against
# an installed ampscope package (issue 31: the docs' own loop did not build out of tree). A complete block is
# a ```cpp fence whose line before is the marker
#
#   <!-- complete program: NAME -->
#
# Each such block is written to a project of its own (main.cpp as printed, a CMakeLists.txt that runs
# find_package(ampscope) and links ampscope::ampscope), built against PREFIX, and run in an empty folder.
#
#   tests/install/doc_programs.sh SOURCE_DIR PREFIX WORK_DIR [CMAKE_ARGS...]
# Called by tests/install/out_of_tree_test.sh with its installed prefix. Exit 0: every block built and ran.
set -euo pipefail
root=$1 prefix=$2 work=$3
shift 3
mkdir -p "$work"
found=0
for doc in "$root"/docs/*.md; do
  # NAME<TAB>first line<TAB>last line of each marked block's code, 1-based, fences excluded.
  while IFS=$'\t' read -r name first last; do
    found=$((found + 1))
    dir=$work/$name
    rm -rf "$dir" && mkdir -p "$dir/src" "$dir/run"
    sed -n "${first},${last}p" "$doc" >"$dir/src/main.cpp"
    cat >"$dir/src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(doc_program_$name LANGUAGES CXX)
find_package(ampscope CONFIG REQUIRED)
add_executable(program main.cpp)
target_link_libraries(program PRIVATE ampscope::ampscope)
CMAKE
    echo "== $(basename "$doc"): '$name' (lines $first-$last)"
    cmake -S "$dir/src" -B "$dir/build" "$@" -DCMAKE_PREFIX_PATH="$prefix" >"$dir/configure.log" 2>&1 \
      || { cat "$dir/configure.log"; echo "FAIL: configuring the docs' program '$name' ($doc)"; exit 1; }
    cmake --build "$dir/build" >"$dir/build.log" 2>&1 \
      || { cat "$dir/build.log"; echo "FAIL: the docs' program '$name' ($doc, lines $first-$last) does not build as printed"; exit 1; }
    (cd "$dir/run" && "$dir/build/program" >"$dir/run.log" 2>&1) \
      || { cat "$dir/run.log"; echo "FAIL: the docs' program '$name' ($doc) exited $?"; exit 1; }
    echo "   built and ran: $(wc -l <"$dir/run.log") lines of output, files written: $(ls "$dir/run" | tr '\n' ' ')"
  done < <(awk '
    /<!-- complete program: [A-Za-z0-9_-]+ -->/ { match($0, /complete program: [A-Za-z0-9_-]+/); name = substr($0, RSTART + 18, RLENGTH - 18); next_fence = 1; next }
    next_fence && /^```cpp/ { start = NR + 1; in_block = 1; next_fence = 0; next }
    next_fence { next_fence = 0 }
    in_block && /^```/ { printf "%s\t%d\t%d\n", name, start, NR - 1; in_block = 0 }
  ' "$doc")
done
if [ "$found" -eq 0 ]; then
  echo "FAIL: no block in $root/docs is marked '<!-- complete program: NAME -->' (the marker must precede the fence)"
  exit 1
fi
echo "doc_programs: $found complete program(s) built and ran"
