#!/usr/bin/env bash
# Packs the programs the GPU check runs, with the libraries they need, for the GPU machine (docs/cuda.md,
# "Running the checks on a GPU"). scripts/device-check.sh pack calls it; it needs nothing outside the tree.
#
#   scripts/device-bundle.sh BUILD OUT_DIR          OUT_DIR/bundle.tar.xz from BUILD (the shared build pack makes);
#                                                   prints its size and largest members, fails over the limit
#   scripts/device-bundle.sh --link BUILD DIR       DIR/bundle: the same layout as links into BUILD, nothing copied
#                                                   (a dry run over any build, e.g. CI's static one)
#   scripts/device-bundle.sh --size-only BUILD      an upper bound of what pack's archive would weigh, measured on
#                                                   BUILD (CI's static build) without building anything; fails
#                                                   over the limit (the ctest device_bundle_size)
#
# The bundle: bundle/bin/<path in BUILD> for each program the check runs (every test program but the viewer's,
# bin/ampscope, bench/hf_bench), bundle/lib/ with every shared library they need (the project's own and
# Debian's), bundle/lib/fallback/ (the build's C++ runtime, used only where the machine's is older),
# bundle/MANIFEST (the commit, the build's settings, every file and its size, every source file's SHA-1).
# Never carried: the loader and the C library, and CUDA's driver, runtime, cuBLAS and NCCL (libnccl.so.2 alone
# is 218 MB), which the GPU machine has (scripts/device-env.sh finds them). Programs and the project's
# libraries are stripped. xz, not gzip: the Debian libraries (OpenBLAS, ICU's data) take 19 MiB, not 32.
#
# AMPSCOPE_BUNDLE_LIMIT_MIB (default 56): the most the archive may weigh (64 MiB travel, the tree included).
set -euo pipefail
limit_mib=${AMPSCOPE_BUNDLE_LIMIT_MIB:-56}

mode=pack
case "${1:-}" in --link | --size-only) mode=${1#--}; shift ;; esac
usage="usage: $0 [--link|--size-only] BUILD [OUT_DIR]   (see the comment at the top of this script)"
if [ "$mode" = size-only ]; then [ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }; else [ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }; fi
[ -f "$1/CMakeCache.txt" ] || { echo "device-bundle: $1 is not a CMake build folder (no CMakeCache.txt)"$'\n'"hint: scripts/device-check.sh pack builds one" >&2; exit 2; }
build=$(cd "$1" && pwd -P)

cache() { grep -m 1 "^$1:" "$build/CMakeCache.txt" | sed 's/^[^=]*=//'; return 0; }  # empty when not set
source_dir=$(cache CMAKE_HOME_DIRECTORY)

# The programs the check runs (scripts/device-check.sh): paths relative to BUILD.
programs=()
for f in "$build"/tests/*_tests "$build/bin/ampscope" "$build/bench/hf_bench"; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  case "$(basename "$f")" in viewer_tests) continue ;; esac  # the viewer is not part of the GPU check
  programs+=("${f#"$build"/}")
done
[ ${#programs[@]} -gt 0 ] || { echo "device-bundle: no test programs under $build/tests" >&2; exit 1; }

# Never carried: the loader, the C and C++ runtime (every Linux has them), CUDA's (the GPU machine's), and, for
# --size-only, Open MPI's: CI builds the MPI group, the bundle's build does not (no MPI on the GPU machine).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvrtc|libnvJitLink)'
[ "$mode" = size-only ] && skip="${skip%)}|libmpi|libopen-rte|libopen-pal)"

# The shared libraries a set of ELF files needs, by walking their DT_NEEDED entries (not ldd's flat list, so
# that what only a skipped library needs is not carried either). Prints "name path" lines.
declare -A where=() seen=()
needed_closure() {
  local queue=("$@") f name path
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    while read -r name path; do where[$name]=$path; done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
    while read -r name; do
      [[ $name =~ $skip ]] && continue
      [ -n "${seen[$name]:-}" ] && continue
      path=${where[$name]:-}
      if [ -z "$path" ]; then echo "device-bundle: $f needs $name, which is not found here" >&2; exit 1; fi
      seen[$name]=1
      echo "$name $path"
      queue+=("$path")
    done < <(objdump -p "$f" | awk '$1 == "NEEDED" {print $2}')
  done
}
# The C++ runtime, for lib/fallback: used there only where the machine's own is older than the build's.
fallback=()
for n in libstdc++.so.6 libgcc_s.so.1; do
  f=$(ldd "$build/${programs[0]}" | awk -v n="$n" '$1 == n && $3 ~ /^\// { print $3 }')
  [ -n "$f" ] && fallback+=("$f")
done
closure=$(mktemp)
needed_closure "${programs[@]/#/$build/}" > "$closure"
mapfile -t libs < "$closure"
rm -f "$closure"

commit=$(git -C "$source_dir" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$source_dir" status --porcelain --untracked-files=no 2>/dev/null | sed -n 1p)
manifest() {  # manifest BUNDLE_DIR: what the run script reads back (the commit and the build's settings)
  {
    echo "commit $commit${dirty:+ (with uncommitted changes)}"
    echo "packed $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
    echo "build $build"
    echo "source $source_dir"
    for v in CMAKE_BUILD_TYPE BUILD_SHARED_LIBS CMAKE_CUDA_ARCHITECTURES AMPSCOPE_MPI; do
      echo "cmake $v=$(cache "$v")"
    done
    (cd "$1" && find . \( -type f -o -type l \) -not -name MANIFEST | sort | while read -r f; do echo "file ${f#./} $(stat -L -c %s "$f")"; done)
    # The compiled sources' SHA-1 as they are now (uncommitted edits included): `run` checks the tree against them.
    (cd "$source_dir" && git ls-files -z -- '*.cpp' '*.h' '*.cu' '*.cuh' '*CMakeLists.txt' '*.cmake' '*.cmake.in' 2>/dev/null |
      xargs -0 -r sha1sum 2>/dev/null | sed 's/^/src /')
  } > "$1/MANIFEST"
}

case "$mode" in
  link)
    out=$2/bundle
    rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
    for p in "${programs[@]}"; do mkdir -p "$out/bin/$(dirname "$p")"; ln -s "$build/$p" "$out/bin/$p"; done
    for l in "${libs[@]}"; do ln -sf "${l#* }" "$out/lib/${l%% *}"; done
    mkdir -p "$out/lib/fallback"
    for f in "${fallback[@]}"; do ln -sf "$f" "$out/lib/fallback/$(basename "$f")"; done
    manifest "$out"
    echo "linked ${#programs[@]} programs and ${#libs[@]} libraries into $out"
    ;;

  pack)
    if [ "$(cache BUILD_SHARED_LIBS)" != ON ]; then
      echo "device-bundle: warning: $build is a static build: every program carries all the device code again" >&2
    fi
    mkdir -p "$2"
    out=$(cd "$2" && pwd)
    stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/bundle/bin" "$stage/bundle/lib"
    for p in "${programs[@]}"; do
      mkdir -p "$stage/bundle/bin/$(dirname "$p")"
      strip --strip-all -o "$stage/bundle/bin/$p" "$build/$p"
    done
    for l in "${libs[@]}"; do
      name=${l%% *} path=${l#* }
      case "$(realpath "$path")" in
        "$build"/*) strip --strip-unneeded -o "$stage/bundle/lib/$name" "$path" ;;  # the project's: dynamic symbols stay
        *) cp -L "$path" "$stage/bundle/lib/$name" ;;
      esac
    done
    mkdir -p "$stage/bundle/lib/fallback"
    for f in "${fallback[@]}"; do cp -L "$f" "$stage/bundle/lib/fallback/$(basename "$f")"; done
    manifest "$stage/bundle"
    rm -f "$out/bundle.tar.xz"
    # One block at -9 (64 MiB dictionary): threads would split the stream and lose ratio.
    tar -C "$stage" -cf - bundle | xz -9 -T1 > "$out/bundle.tar.xz.part"
    mv "$out/bundle.tar.xz.part" "$out/bundle.tar.xz"
    bytes=$(stat -c %s "$out/bundle.tar.xz")
    unpacked=$(du -sb "$stage/bundle" | cut -f1)
    awk -v p=${#programs[@]} -v l=${#libs[@]} -v f="$out/bundle.tar.xz" -v b="$bytes" -v u="$unpacked" -v m="$limit_mib" \
      'BEGIN { printf "bundled %d programs and %d libraries into %s: %.1f MiB (%.1f MiB unpacked); the limit is %d MiB\n", p, l, f, b / 1048576, u / 1048576, m }'
    echo "largest members (unpacked):"
    (cd "$stage/bundle" && find . -type f -printf '%s %P\n' | sort -rn | sed -n 1,8p |
      awk '{ printf "  %6.1f MiB  %s\n", $1 / 1048576, $2 }')
    if [ "$bytes" -gt $((limit_mib * 1048576)) ]; then
      rm -f "$out/bundle.tar.xz"  # so that nobody carries it
      echo "device-bundle: error: the archive is over the limit of $limit_mib MiB (64 MiB travel to the GPU machine, the tree included); removed" >&2
      echo "hint: build shared (BUILD_SHARED_LIBS=ON) for one architecture, as scripts/device-check.sh pack does, or bundle fewer programs" >&2
      exit 1
    fi
    ;;

  size-only)
    # CI's build is static: each program holds the libraries' code and the CUDA fat binary again, so it cannot
    # be packed as is. What the bundle's shared build would hold is measured from the same compilation instead:
    # each program's own objects and the GoogleTest archives it links, one copy of each project library (its
    # static archive: the objects a .so is linked from, the device code for every architecture CI builds), and
    # the Debian libraries found above. Every stand-in is at least as large as what it stands for (relocatable
    # objects keep relocations and symbol tables a stripped shared library drops; CI compiles sm_80 and sm_90
    # where the bundle has sm_90 only), and each file is compressed on its own (no sharing between files), so
    # this is an upper bound of the real archive; docs/cuda.md gives both numbers for one tree.
    stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/files"
    n=0
    add() { cp -L "$1" "$stage/files/$n-$(basename "$1")"; n=$((n + 1)); }
    gtest_dir=$(cache GTest_DIR)
    gtest_libs=$(cd "$gtest_dir/../.." 2>/dev/null && pwd || echo /usr/lib/x86_64-linux-gnu)
    for p in "${programs[@]}"; do
      target=$(basename "$p")
      # (not deeper: the install tests build whole consumer projects under tests/)
      objdir=$(find "$build" -maxdepth 3 -type d -path "*/CMakeFiles/$target.dir" -print -quit)
      [ -n "$objdir" ] || { echo "device-bundle: no objects of $target under $build" >&2; exit 1; }
      while IFS= read -r o; do add "$o"; done < <(find "$objdir" -name '*.o')
      case "$target" in
        *_tests) for a in libgtest.a libgtest_main.a libgmock.a; do [ -f "$gtest_libs/$a" ] && add "$gtest_libs/$a"; done ;;
      esac
    done
    while IFS= read -r a; do add "$a"; done < <(find "$build" -maxdepth 3 -name 'libampscope_*.a' -not -path '*/tests/*' -not -name '*viewer*')
    for l in "${libs[@]}"; do
      case "$(realpath "${l#* }")" in "$build"/*) ;; *) add "${l#* }" ;; esac
    done
    for f in "${fallback[@]}"; do add "$f"; done
    # Strip what a shared library would not carry (local symbols, debug sections), in place, then compress each
    # file alone, side by side.
    find "$stage/files" -name '*.o' -exec strip --strip-unneeded {} + 2>/dev/null || true
    find "$stage/files" -name '*.a' -exec strip --strip-unneeded {} + 2>/dev/null || true
    bytes=$(find "$stage/files" -type f -print0 | xargs -0 -n 1 -P "$(nproc)" sh -c 'xz -9 -T1 -c "$1" | wc -c' _ |
      awk '{ s += $1 } END { print s + 0 }')
    awk -v d="$build" -v b="$bytes" -v n="$n" -v m="$limit_mib" \
      'BEGIN { printf "size estimate of the GPU bundle from %s: at most %.1f MiB (%d files); the limit is %d MiB\n", d, b / 1048576, n, m }'
    if [ "$bytes" -gt $((limit_mib * 1048576)) ]; then
      echo "device-bundle: error: the bundle this tree makes would be over the limit of $limit_mib MiB" >&2
      echo "hint: scripts/device-check.sh pack prints the real size and its largest members; see docs/cuda.md" >&2
      exit 1
    fi
    ;;
esac
