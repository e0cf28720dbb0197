#!/usr/bin/env bash
# The GPU check (docs/cuda.md, "Running the checks on a GPU"): pack here, run there in one call of the device tool.
#
#   scripts/device-check.sh pack               here: the shared CUDA build (build-device/, sm_90) and its bundle,
#                                              .device/bundle.tar.xz; prints the size, fails over 56 MiB
#   scripts/device-check.sh pack --size-only [BUILD]
#                                              here: an upper bound of that size measured on a build that exists
#                                              (default build/, CI's static one), nothing built (ctest device_bundle_size)
#   scripts/device-check.sh run [--dry] [--full] [--bundle DIR] [--only PARTS]
#                                              there: the check, every result in $OUT/device-check.md, written as it
#                                              goes, and the logs in $OUT/device-check-logs.tar.gz
#   scripts/device-check.sh sanitize           there: only the compute-sanitizer part (run --only sanitize)
#
# With the device tool, after `pack` here: run(command="scripts/device-check.sh run", carry=[".device"], timeout_s=600).
#
# `run` works in four parts, in this order, each appending its outcome and figures to the summary at once:
#   1. correctness: the CUDA tests each in its own process under CUDA_LAUNCH_BLOCKING=1 (a fault names its kernel),
#      then every test program side by side in shards, the CUDA-touching ones first, with AMPSCOPE_REQUIRE_GPU=1,
#      then the CUDA backend's tests without memory pools (AMPSCOPE_CUDA_NO_POOLS=1);
#   2. training: `ampscope train --device cuda` on the samples (fp16, bf16), each failure scenario on the CPU and
#      on CUDA with the reports' first anomaly compared, a GPT-2-small folder the script writes, checkpoints
#      moved between the CPU and CUDA;
#   3. compute-sanitizer memcheck and racecheck on the CUDA tests, where the sanitizer starts;
#   4. measurements: the statistics kernel against a device copy, the probe's overhead, step times against
#      PyTorch eager (bench/pytorch_bench.py) when the machine's Python has torch with CUDA.
# Every program runs under `timeout` in a scratch folder of its own; a crash, a failure or a timeout is written
# down and the script goes on. Past the time budget, what is left is marked "not run: out of time".
#
# --dry (or NO_GPU=1, or a machine without a GPU) runs what needs no GPU: unpacking, finding the libraries
# (ldd), listing and starting every program (each test program's first test; all of them with --full),
# `ampscope train` and the scenarios on the CPU, a checkpoint saved and resumed on the CPU, and writes the
# summary with every GPU part marked "not run: no GPU". --bundle DIR uses an unpacked bundle (e.g. one that
# scripts/device-bundle.sh --link made from any build) instead of .device/bundle.tar.xz.
#
# Environment: OUT (default out/device-check), AMPSCOPE_CHECK_BUDGET (seconds for the whole run, default 450),
# AMPSCOPE_CHECK_TEST_TIMEOUT (seconds per test program or shard, default 300; AMPSCOPE_CHECK_TIMEOUTS="PROGRAM=SECONDS
# ..." for some), AMPSCOPE_CHECK_JOBS (programs
# side by side, default the number of cores), STEPS and WARMUP (the timed runs of part 4, default 100 and 20).
# Exit status: 0 when every part that ran passed, 1 when something failed, 2 on a usage error.
set -uo pipefail  # not -e: a failing step is written down, never stops the script
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 2

usage() { { echo "usage:"; sed -n "3,13p" "${BASH_SOURCE[0]}" | sed "s/^# \{0,1\}//"; } >&2; exit 2; }

# ------------------------------------------------------------------------------------------------------ pack
pack() {
  if [ "${1:-}" = --size-only ]; then
    exec "$root/scripts/device-bundle.sh" --size-only "${2:-$root/build}"
  fi
  [ $# -eq 0 ] || usage
  local build=${AMPSCOPE_DEVICE_BUILD:-$root/build-device}
  # Shared libraries: the device code once, in libampscope_kernels_cuda.so, instead of in every program; sm_90
  # only (the GPU machines lent are H100/H200); no viewer; no MPI (the GPU machine has no Open MPI: NCCL's and
  # the single-process groups run there); bench/ for hf_bench.
  local flags=(-DBUILD_SHARED_LIBS=ON -DAMPSCOPE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DAMPSCOPE_VIEWER=OFF
               -DAMPSCOPE_MPI=OFF -DAMPSCOPE_BENCH=ON -DAMPSCOPE_TESTS=ON)
  if command -v ccache >/dev/null 2>&1; then
    flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  echo "pack: configuring $build"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" || exit 1
  # Only what the bundle holds (scripts/device-bundle.sh): the test programs, the command, hf_bench.
  local targets
  targets=$(cmake --build "$build" --target help | sed -n '/^cmake_/d; s/^\([a-z0-9_]*_tests\): .*/\1/p' | tr '\n' ' ')
  echo "pack: building ampscope hf_bench $targets"
  cmake --build "$build" --parallel "${AMPSCOPE_BUILD_JOBS:-$(nproc)}" --target ampscope hf_bench $targets || exit 1
  rm -rf "$root/.device" && mkdir -p "$root/.device"
  "$root/scripts/device-bundle.sh" "$build" "$root/.device"
}

# ------------------------------------------------------------------------------------------------------ run
dry=0 full=0 bundle_arg="" only="correctness,train,sanitize,measure"
parse_run() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --dry) dry=1 ;;
      --full) full=1 ;;
      --bundle) [ $# -ge 2 ] || usage; bundle_arg=$(cd "$2" 2>/dev/null && pwd) || { echo "device-check: no folder $2" >&2; exit 2; }; shift ;;
      --only) [ $# -ge 2 ] || usage; only=$2; shift ;;
      *) echo "device-check: unknown option '$1'" >&2; usage ;;
    esac
    shift
  done
  [ "${NO_GPU:-0}" = 1 ] && dry=1
  local p
  for p in ${only//,/ }; do
    case "$p" in correctness | train | sanitize | measure) ;; *) echo "device-check: unknown part '$p' (correctness, train, sanitize, measure)" >&2; exit 2 ;; esac
  done
}
part_on() { [[ ",$only," == *",$1,"* ]]; }

start=$(date +%s)
budget=${AMPSCOPE_CHECK_BUDGET:-450}
test_timeout=${AMPSCOPE_CHECK_TEST_TIMEOUT:-300}
jobs_max=${AMPSCOPE_CHECK_JOBS:-$(nproc)}
failures=0
left() { echo $((budget - ($(date +%s) - start))); }
elapsed() { echo $(($(date +%s) - start)); }

# say: one line to the summary (at once, so a cut call still brings back what ran) and to the console.
say() { printf '%s\n' "$@" >> "$summary"; printf '%s\n' "$@"; }  # one line per argument
fail() { failures=$((failures + 1)); }
archive_logs() { tar czf "$out/device-check-logs.tar.gz.part" -C "$work" logs 2>/dev/null && mv "$out/device-check-logs.tar.gz.part" "$out/device-check-logs.tar.gz"; }
finish() {
  local rc=$?
  if [ -n "${summary:-}" ] && [ -f "$summary" ]; then
    if [ $failures -eq 0 ] && [ $rc -eq 0 ]; then
      say "" "**Result: passed** (everything that ran; see the parts above for what did not) in $(elapsed) s."
    else
      say "" "**Result: FAILED** ($failures failing items) in $(elapsed) s. Logs: device-check-logs.tar.gz."
    fi
  fi
  [ -n "${work:-}" ] && archive_logs
  [ -n "${work:-}" ] && [ "${AMPSCOPE_CHECK_KEEP:-0}" != 1 ] && rm -rf "$work"
}

signal_name() { local s; s=$(kill -l "$1" 2>/dev/null) && echo "SIG$s" || echo "signal $1"; }

# outcome LOG RC SECONDS TIMEOUT: one phrase for a gtest run (or any program: then by exit status only).
outcome() {
  local log=$1 rc=$2 secs=$3 tmo=$4 counts
  counts=$(awk '
    /^\[       OK \] / { ok++ }
    /^\[  SKIPPED \] .* \([0-9]+ ms\)/ { skipped++ }
    /^\[  FAILED  \] .* \([0-9]+ ms\)/ { failed++; n = $4; sub(/,$/, "", n); if (failed <= 4) names = names (failed > 1 ? ", " : "") n }
    /^\[ RUN      \] / { last = $4; open = 1 }
    /^\[       OK \] |^\[  FAILED  \] |^\[  SKIPPED \] / { open = 0 }
    END { printf "%d|%d|%d|%s|%s\n", ok, skipped, failed, names, open ? last : "" }' "$log")
  local ok skipped failed names last
  IFS='|' read -r ok skipped failed names last <<< "$counts"
  local tests="$ok passed"
  [ "$skipped" -gt 0 ] && tests="$tests, $skipped skipped"
  [ "$failed" -gt 0 ] && tests="$tests, $failed failed: $names$([ "$failed" -gt 4 ] && echo ", ...")"
  if [ "$rc" -eq 0 ]; then
    echo "passed ($tests)"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "TIMED OUT after ${tmo} s${last:+ in $last} ($tests)"
  elif [ "$rc" -gt 128 ]; then
    echo "CRASHED: $(signal_name $((rc - 128)))${last:+ in $last} ($tests)"
  elif [ "$failed" -gt 0 ]; then
    echo "FAILED ($tests)"
  else
    echo "FAILED: exit status $rc ($tests; last line: $(tail -n 1 "$log" | cut -c1-160))"
  fi
}

# run_one LABEL LOG TIMEOUT [VAR=VALUE ...] -- PROGRAM ARGS...: runs in a scratch folder of its own (cwd and
# TMPDIR), under `timeout`; prints "RC SECONDS".
run_one() {
  local label=$1 log=$2 tmo=$3; shift 3
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local scratch="$work/scratch/${label//[^A-Za-z0-9_.-]/_}"
  mkdir -p "$scratch" "$(dirname "$log")"
  local t0 rc
  t0=$(date +%s)
  (cd "$scratch" && exec env TMPDIR="$scratch" "${envs[@]}" timeout -k 10 "$tmo" "$@") > "$log" 2>&1 < /dev/null
  rc=$?
  rm -rf "$scratch"
  echo "$rc $(($(date +%s) - t0))"
}

# The time limit of a job: AMPSCOPE_CHECK_TIMEOUTS ("PROGRAM=SECONDS ...") for its program, else the default.
timeout_for() {
  local prog=${1%%[ :]*} w
  for w in ${AMPSCOPE_CHECK_TIMEOUTS:-}; do
    [ "${w%%=*}" = "$prog" ] && { echo "${w#*=}"; return; }
  done
  echo "$test_timeout"
}

# enqueue QUEUE LABEL PROGRAM ARGS ENV: one job. Fields are separated by the unit separator (0x1f), not a tab:
# `read` merges consecutive tabs, and an empty ARGS would shift ENV into the arguments.
enqueue() { printf '%s\x1f%s\x1f%s\x1f%s\n' "$2" "$3" "$4" "$5" >> "$1"; }

# The job queue of parts 1 and 3: one line per job (ARGS and ENV space-separated, no spaces inside), run side by side, at most $jobs_max at once. Rows are written as each job ends: every row when
# VERBOSE=1, else only those that did not pass. Each job's "LABEL<TAB>OUTCOME" goes to RESULTS.
run_queue() {
  local queue=$1 results=$2 verbose=$3 pass=$4
  local label prog args envs
  : > "$results"
  while IFS=$'\x1f' read -r label prog args envs; do
    local l
    l=$(left)
    if [ "$l" -lt 15 ]; then
      printf '%s\tnot run: out of time\n' "$label" >> "$results"
      continue
    fi
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    (
      tmo=$(timeout_for "$label")
      [ "$tmo" -gt "$l" ] && tmo=$l
      log="$work/logs/$pass/${label//[^A-Za-z0-9_.-]/_}.txt"
      # shellcheck disable=SC2086  # ARGS and ENV are word lists by construction
      read -r rc secs <<< "$(run_one "$label" "$log" "$tmo" $envs -- "$prog" $args)"
      o=$(outcome "$log" "$rc" "$secs" "$tmo")
      printf '%s\t%s\n' "$label" "$o" >> "$results"
      if [ "$verbose" = 1 ] || [[ $o != passed* ]]; then say "| $label | $o | $secs |"; fi
    ) &
  done < "$queue"
  wait
  local total notpassed
  total=$(wc -l < "$results")
  notpassed=$(awk -F'\t' '$2 !~ /^passed/' "$results" | wc -l)
  failures=$((failures + $(awk -F'\t' '$2 !~ /^(passed|not run)/' "$results" | wc -l)))
  say "" "$pass: $((total - notpassed)) of $total passed$([ "$notpassed" -gt 0 ] && echo "; not passed: $(awk -F'\t' '$2 !~ /^passed/ { sub(/ \(.*/, "", $2); printf "%s%s (%s)", n++ ? ", " : "", $1, $2 }' "$results" | cut -c1-1500)")."
  archive_logs
}

run_check() {
  parse_run "$@"
  out=${OUT:-$root/out/device-check}
  mkdir -p "$out"
  summary=$out/device-check.md
  work=$(mktemp -d "${TMPDIR:-/tmp}/ampscope-device.XXXXXX")
  # Readable by all, as /tmp is: tests that drop privileges (to check a permission error) must reach their files.
  chmod 755 "$work"
  mkdir -p "$work/logs"
  trap finish EXIT
  trap 'say "" "stopped by a signal after $(elapsed) s"; exit 143' TERM INT

  # ---- the machine
  local gpu=0 nogpu=""
  if [ "${AMPSCOPE_CHECK_FAKE_GPU:-0}" = 1 ]; then
    gpu=1  # tests/device/dry_run_test.sh: the GPU path's plumbing, with fake programs
  elif [ "$dry" = 1 ]; then
    nogpu="not run: no GPU (dry run)"
  elif ! command -v nvidia-smi >/dev/null 2>&1; then
    nogpu="not run: no GPU (no nvidia-smi on this machine)"
  elif ! nvidia-smi -L > "$work/logs/nvidia-smi.txt" 2>&1 || ! grep -q '^GPU ' "$work/logs/nvidia-smi.txt"; then
    nogpu="not run: no GPU (nvidia-smi lists none: $(head -n 1 "$work/logs/nvidia-smi.txt"))"
  else
    gpu=1
  fi
  : > "$summary"
  say "# ampscope device check" ""
  say "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); machine: $(hostname), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
  if [ "${AMPSCOPE_CHECK_FAKE_GPU:-0}" = 1 ]; then
    say "- GPU: assumed (AMPSCOPE_CHECK_FAKE_GPU=1: a test of this script with fake programs; nothing runs on a GPU)"
  elif [ $gpu = 1 ]; then
    say "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 4 | paste -sd';' -) (name, driver, memory, compute capability)"
  else
    say "- mode: ${nogpu#not run: }: every GPU part below says \"$nogpu\""
  fi
  say "- tree: $(git rev-parse --short HEAD 2>/dev/null || echo "no git metadata"); budget $budget s, $jobs_max programs side by side, $test_timeout s per program"

  # ---- the bundle
  local bundle t0
  t0=$(date +%s)
  if [ -n "$bundle_arg" ]; then
    bundle=$bundle_arg
  elif [ -f "$root/.device/bundle.tar.xz" ]; then
    if command -v xz >/dev/null 2>&1; then
      tar -C "$work" -xJf "$root/.device/bundle.tar.xz"
    else  # no xz binary: Python's tarfile reads it (lzma is part of CPython)
      "${PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$root/.device/bundle.tar.xz" "$work"
    fi || { say "- bundle: **could not unpack .device/bundle.tar.xz**"; fail; exit 1; }
    bundle=$work/bundle
  else
    say "- bundle: **none**: no .device/bundle.tar.xz and no --bundle DIR" "" \
        "hint: run scripts/device-check.sh pack here first, then carry .device (docs/cuda.md)"
    fail
    exit 1
  fi
  local manifest=$bundle/MANIFEST
  local bcommit bsource
  bcommit=$(sed -n 's/^commit //p' "$manifest" 2>/dev/null)
  bsource=$(sed -n 's/^source //p' "$manifest" 2>/dev/null)
  say "- bundle: $(du -sLh "$bundle" 2>/dev/null | cut -f1) unpacked in $(($(date +%s) - t0)) s; packed from ${bcommit:-?}, $(sed -n 's/^packed //p' "$manifest" 2>/dev/null); $(sed -n 's/^cmake //p' "$manifest" 2>/dev/null | paste -sd' ' -)"
  # Was the bundle built from these sources? The manifest holds each source file's SHA-1 at pack time (the
  # device tool's copy of the tree may have no git metadata to compare commits with).
  local stale
  stale=$(sed -n 's/^src //p' "$manifest" 2>/dev/null | sha1sum --check --quiet 2>/dev/null | sed 's/: .*//' | paste -sd' ' -)
  if [ -n "$stale" ]; then
    say "- **warning: the bundle was not built from this tree**; changed since \`pack\`: $(echo "$stale" | cut -c1-400) (run scripts/device-check.sh pack again)"
  elif grep -q '^src ' "$manifest" 2>/dev/null; then
    say "- the tree's sources are those the bundle was built from ($(grep -c '^src ' "$manifest") files compared)"
  fi
  # The test programs read the tree's files (tests/fixtures, docs) at the path they were built in; on another
  # machine that path is made a link to this tree.
  if [ -n "$bsource" ] && [ "$bsource" != "$root" ]; then
    if [ -e "$bsource" ] && [ ! -L "$bsource" ]; then
      say "- note: the test programs read their fixtures from $bsource (where they were built), not from this tree"
    elif mkdir -p "$(dirname "$bsource")" 2>/dev/null && ln -sfn "$root" "$bsource" 2>/dev/null; then
      say "- the test programs' source path $bsource now links to this tree ($root)"
    else
      say "- **warning**: could not link $bsource to this tree: the tests that read tests/fixtures or docs/ will fail"
    fi
  fi

  # ---- the libraries: the bundle's lib/ first, then where this machine keeps CUDA's (scripts/device-env.sh)
  # shellcheck source=scripts/device-env.sh
  . "$root/scripts/device-env.sh" "$bundle/lib" > "$work/logs/device-env.txt" 2>&1
  say "- libraries: $(sed 's/^device-env: //' "$work/logs/device-env.txt" | paste -sd';' - | sed 's/;/; /g')"
  local programs=() p outside=""
  while IFS= read -r p; do programs+=("$p"); done < <(cd "$bundle/bin" && find . \( -type f -o -type l \) -perm -u+x | sed 's|^\./||' | sort)
  declare -gA missing=()
  check_libraries
  # Built against Debian 12's C++ runtime (GLIBCXX_3.4.30): where this machine's is older, the bundle's own
  # copy (lib/fallback) goes on the path too. Not by default: a newer one serves the programs and Python alike.
  if grep -qE "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found" "$work/logs/ldd/"*.txt 2>/dev/null && [ -d "$bundle/lib/fallback" ]; then
    export LD_LIBRARY_PATH="$bundle/lib:$bundle/lib/fallback:$LD_LIBRARY_PATH"
    say "- this machine's C++ runtime is older than the build's: the bundle's libstdc++ and libgcc_s (lib/fallback) are used"
    check_libraries
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    say "- **programs that cannot start**:$(for p in "${!missing[@]}"; do printf ' %s (%s);' "$p" "${missing[$p]}"; done)"
    fail
  else
    say "- ldd: all ${#programs[@]} programs find every library; from outside the bundle: $outside"
  fi
  # A bundle must not reach back into the build it came from (it is not there on the GPU machine).
  local bbuild from_build
  bbuild=$(sed -n 's/^build //p' "$manifest" 2>/dev/null)
  from_build=$([ -n "$bbuild" ] && cat "$work/logs/ldd/"*.txt |
    awk -v b="$bbuild/" -v own="$bundle/lib/" '$3 ~ /^\// && index($3, b) == 1 && index($3, own) != 1 { print $1 }' | sort -u | paste -sd' ' -)
  if [ -n "$from_build" ]; then
    say "- **libraries found in the build folder $bbuild instead of the bundle**: $from_build"
    fail
  fi
  archive_logs

  local bin=$bundle/bin ampscope=$bundle/bin/bin/ampscope
  part_on correctness && part_correctness
  part_on train && part_train
  part_on sanitize && part_sanitize
  part_on measure && part_measure
  [ $failures -eq 0 ] || exit 1
  exit 0
}

# ldd on every program: fills missing[PROGRAM] (libraries not found, or a version this machine's lack: e.g. an
# older C library) and outside (what comes from outside the bundle: the C runtime and CUDA's, nothing else).
check_libraries() {
  mkdir -p "$work/logs/ldd"
  missing=() outside=""
  local p log m
  for p in "${programs[@]}"; do
    log="$work/logs/ldd/$(basename "$p").txt"
    ldd "$bundle/bin/$p" > "$log" 2>&1
    m=$(awk '$2 == "=>" && $3 == "not" { printf "%s%s", n++ ? " " : "", $1 }
             /version `.*. not found/ { match($0, /version `[^'"'"']*/); v = substr($0, RSTART + 9, RLENGTH - 9)
                                        if (!seen[v]++) printf "%s%s (too old here)", n++ ? " " : "", v }' "$log")
    [ -n "$m" ] && missing[$p]=$m
    outside="$outside $(awk -v b="$bundle/lib/" '$2 == "=>" && $3 ~ /^\// && index($3, b) != 1 { print $1 }' "$log")"
  done
  outside=$(printf '%s\n' $outside | sort -u | paste -sd' ' -)
  outside=${outside:-none}
}

# ------------------------------------------------------------------------------------------------------ part 1
# The test programs that touch CUDA (their folder's tests mention the GPU); they run first.
touches_cuda() {
  local dir=$root/tests/${1%_tests}
  [ -d "$dir" ] && grep -rqlE 'SKIP_WITHOUT_GPU|Device::cuda|cuda_status|make_cuda_backend' "$dir" 2>/dev/null
}

part_correctness() {
  say "" "## 1. Correctness" ""
  local tests=() t name
  for t in "${programs[@]}"; do [[ $t == tests/*_tests ]] && tests+=("$t"); done
  # CUDA-touching first, then the others, each group alphabetical.
  local ordered=()
  for t in "${tests[@]}"; do touches_cuda "$(basename "$t")" && ordered+=("$t"); done
  for t in "${tests[@]}"; do touches_cuda "$(basename "$t")" || ordered+=("$t"); done

  # Every program's tests (also what starts each program once); a program that cannot list them is written down.
  mkdir -p "$work/logs/list" "$work/lists"
  local listable=()
  for t in "${ordered[@]}"; do
    name=$(basename "$t")
    if [ -n "${missing[$t]:-}" ]; then
      say "- $name: **not started**: libraries not found: ${missing[$t]}"
      fail
      continue
    fi
    read -r rc secs <<< "$(run_one "list-$name" "$work/logs/list/$name.txt" 60 -- "$bin/$t" --gtest_list_tests)"
    if [ "$rc" -ne 0 ]; then
      say "- $name: **could not list its tests**: $(outcome "$work/logs/list/$name.txt" "$rc" "$secs" 60)"
      fail
      continue
    fi
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }' "$work/logs/list/$name.txt" | grep -v 'DISABLED_' > "$work/lists/$name" || true
    listable+=("$t")
  done
  local ntests
  ntests=$(cat "$work/lists/"* 2>/dev/null | wc -l)
  say "- ${#listable[@]} of ${#ordered[@]} test programs started and listed $ntests tests; CUDA-touching first: $(for t in "${ordered[@]}"; do touches_cuda "$(basename "$t")" && printf '%s ' "$(basename "$t")"; done)"

  # 1a. The GPU tests one per process, launches synchronous: a fault is reported by the kernel that made it,
  # and cannot poison the tests after it.
  local gpu_pattern=${AMPSCOPE_GPU_TEST_PATTERN:-cuda|gpu}
  local queue=$work/queue-1a
  : > "$queue"
  for t in "${listable[@]}"; do
    name=$(basename "$t")
    touches_cuda "$name" || continue
    grep -iE "$gpu_pattern" "$work/lists/$name" | while IFS= read -r test; do
      enqueue "$queue" "$name:$test" "$bin/$t" "--gtest_filter=$test" "CUDA_LAUNCH_BLOCKING=1 AMPSCOPE_REQUIRE_GPU=1"
    done
  done
  say "" "### 1a. The $(wc -l < "$queue") GPU tests, each in its own process, CUDA_LAUNCH_BLOCKING=1" ""
  if [ $gpu = 1 ]; then
    say "| test | outcome (rows only for those that did not pass) | s |" "|---|---|---|"
    run_queue "$queue" "$work/results-1a" 0 "1a"
  else
    say "$nogpu"
  fi

  # 1b. Every test program, sharded so that no program holds the others up.
  queue=$work/queue-1b
  : > "$queue"
  for t in "${listable[@]}"; do
    name=$(basename "$t")
    local n shards i
    n=$(wc -l < "$work/lists/$name")
    if [ $gpu = 0 ] && [ $full = 0 ]; then
      # Dry: each program once, on its first test (what starts it, the runner and the summary are exercised).
      enqueue "$queue" "$name" "$bin/$t" "--gtest_filter=$(head -n 1 "$work/lists/$name")" ""
      continue
    fi
    shards=$(((n + 59) / 60)); [ $shards -lt 1 ] && shards=1; [ $shards -gt 8 ] && shards=8
    for ((i = 0; i < shards; i++)); do
      local label=$name
      [ $shards -gt 1 ] && label="$name [$((i + 1))/$shards]"
      enqueue "$queue" "$label" "$bin/$t" "" \
        "GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i$([ $gpu = 1 ] && echo " AMPSCOPE_REQUIRE_GPU=1")"
    done
  done
  if [ $gpu = 1 ]; then
    say "" "### 1b. Every test program (AMPSCOPE_REQUIRE_GPU=1: a GPU test that would skip fails)" ""
  elif [ $full = 1 ]; then
    say "" "### 1b. Every test program, on the CPU (the GPU tests skip: $nogpu)" ""
  else
    say "" "### 1b. Every test program, dry: its first test only (on a GPU: all, AMPSCOPE_REQUIRE_GPU=1)" ""
  fi
  say "| program | outcome | s |" "|---|---|---|"
  run_queue "$queue" "$work/results-1b" 1 "1b"

  # 1c. The CUDA backend without stream-ordered memory pools (plain cudaMalloc), as on GPUs that lack them.
  say "" "### 1c. The CUDA backend's tests with AMPSCOPE_CUDA_NO_POOLS=1 (cudaMalloc instead of the pool)" ""
  if [ $gpu = 1 ] && [ -x "$bin/tests/kernels_tests" ]; then
    : > "$work/queue-1c"
    enqueue "$work/queue-1c" "kernels_tests:cuda_*" "$bin/tests/kernels_tests" "--gtest_filter=cuda_*" \
      "AMPSCOPE_CUDA_NO_POOLS=1 AMPSCOPE_REQUIRE_GPU=1"
    # The FP8 kernels' scratch and codes come from the same allocator.
    enqueue "$work/queue-1c" "kernels_tests:fp8_cuda_*" "$bin/tests/kernels_tests" "--gtest_filter=fp8_cuda_*" \
      "AMPSCOPE_CUDA_NO_POOLS=1 AMPSCOPE_REQUIRE_GPU=1"
    # The block-scaled conversions' (issue 35) buffers and scratch too.
    enqueue "$work/queue-1c" "kernels_tests:block_scaled_cuda_*" "$bin/tests/kernels_tests" \
      "--gtest_filter=block_scaled_cuda_*" "AMPSCOPE_CUDA_NO_POOLS=1 AMPSCOPE_REQUIRE_GPU=1"
    say "| program | outcome | s |" "|---|---|---|"
    run_queue "$work/queue-1c" "$work/results-1c" 1 "1c"
  else
    say "$nogpu"
  fi
}

# ------------------------------------------------------------------------------------------------------ part 2
# train_run LABEL ARGS...: `ampscope train ARGS` in the training folder; prints "RC SECONDS".
train_run() {
  local label=$1; shift
  run_one "train-$label" "$work/logs/train/$label.txt" "$(min_left 180)" -- "$ampscope" train "$@"
}
min_left() { local l; l=$(left); [ "$l" -lt "$1" ] && echo "$((l > 5 ? l : 5))" || echo "$1"; }
summary_line() { sed -n 's/^summary: //p' "$1" | tail -n 1; }

part_train() {
  local dev=cuda steps=50
  [ $gpu = 1 ] || { dev=cpu; steps=2; }
  local tdir=$work/train
  mkdir -p "$tdir" "$work/logs/train"
  say "" "## 2. Training with \`ampscope train\`" ""
  if [ ! -x "$ampscope" ]; then say "- **no bin/ampscope in the bundle**"; fail; return; fi
  if [ "$(left)" -lt 30 ]; then say "not run: out of time"; return; fi

  # 2a. The samples, side by side.
  say "### 2a. The samples on $dev ($steps steps, seed 1)$([ $gpu = 1 ] || echo "; on CUDA: $nogpu")" "" "| run | outcome | s |" "|---|---|---|"
  local s p
  for s in mlp cnn transformer; do
    for p in fp16 bf16; do
      (
        read -r rc secs <<< "$(train_run "$s-$p-$dev" --sample "$s" --precision "$p" --device "$dev" --steps "$steps" --seed 1 --out "$tdir/$s-$p-$dev.h5")"
        if [ "$rc" -eq 0 ]; then say "| $s $p $dev | passed: $(summary_line "$work/logs/train/$s-$p-$dev.txt") | $secs |"
        else say "| $s $p $dev | **$(outcome "$work/logs/train/$s-$p-$dev.txt" "$rc" "$secs" 180)** | $secs |"; echo x >> "$work/train-failures"; fi
        rm -f "$tdir/$s-$p-$dev.h5"
      ) &
      while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    done
  done
  wait

  # 2b. The failure scenarios (not the --ddp ones, nor those for a --precision fp8, mxfp8 or nvfp4: the FP8 and
  # block-scaled Linears are refused on CUDA until their kernels' own tests have passed on a GPU): the report's first
  # anomaly on CUDA must read as on the CPU.
  local scenarios=() line
  while IFS= read -r line; do
    [[ $line == *"for --ddp"* || $line == *"for --precision "* ]] && continue
    scenarios+=("${line%% *}")
  done < <("$ampscope" train --list-scenarios 2>/dev/null)
  say "" "### 2b. The ${#scenarios[@]} scenarios: the report's first anomaly on the CPU and on CUDA" "" "| scenario | outcome | first anomaly (CPU) |" "|---|---|---|"
  local sc
  for sc in "${scenarios[@]}"; do
    (
      local d first_cpu="" first_cuda="" rc secs
      for d in cpu $([ $gpu = 1 ] && echo cuda); do
        read -r rc secs <<< "$(train_run "$sc-$d" --scenario "$sc" --device "$d" --out "$tdir/$sc-$d.h5")"
        if [ "$rc" -ne 0 ]; then
          say "| $sc | **$d: $(outcome "$work/logs/train/$sc-$d.txt" "$rc" "$secs" 180)** | |"; echo x >> "$work/train-failures"; exit
        fi
        "$ampscope" report "$tdir/$sc-$d.h5" --no-colour -o "$work/logs/train/$sc-$d.report.txt" > /dev/null 2>&1
        rm -f "$tdir/$sc-$d.h5"
        local first
        first=$(sed -n '1s/^FIRST ANOMALY: //p' "$work/logs/train/$sc-$d.report.txt")
        [ "$d" = cpu ] && first_cpu=$first || first_cuda=$first
      done
      if [ $gpu = 0 ]; then
        say "| $sc | CPU only (CUDA $nogpu) | ${first_cpu:-(no anomaly)} |"
      elif [ "$first_cpu" = "$first_cuda" ] && [ -n "$first_cpu" ]; then
        say "| $sc | same on CUDA | $first_cpu |"
      else
        say "| $sc | **DIFFERENT on CUDA: ${first_cuda:-(no anomaly)}** | ${first_cpu:-(no anomaly)} |"; echo x >> "$work/train-failures"
      fi
    ) &
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
  done
  wait

  # 2c. A GPT-2-small folder (124M parameters) written here by hf_bench, trained on CUDA.
  say "" "### 2c. \`ampscope train --model\` on a GPT-2-small folder written by hf_bench (batch 1, context 256)" ""
  local hf=$bin/bench/hf_bench
  if [ ! -x "$hf" ]; then
    say "- **no bench/hf_bench in the bundle**"; fail
  elif [ $gpu = 0 ]; then
    read -r rc secs <<< "$(run_one hf_bench-usage "$work/logs/train/hf_bench-usage.txt" 30 -- "$hf")"
    say "- hf_bench starts (exit $rc: $(head -n 1 "$work/logs/train/hf_bench-usage.txt")); the training: $nogpu"
  elif [ "$(left)" -lt 60 ]; then
    say "not run: out of time"
  else
    read -r rc secs <<< "$(run_one hf_bench-write "$work/logs/train/hf_bench-write.txt" "$(min_left 120)" -- "$hf" write "$tdir/gpt2")"
    if [ "$rc" -ne 0 ]; then
      say "- **writing the folder: $(outcome "$work/logs/train/hf_bench-write.txt" "$rc" "$secs" 120)**"; fail
    else
      for p in fp16 bf16; do
        read -r rc secs <<< "$(train_run "gpt2-$p" --model "$tdir/gpt2" --tokens "$tdir/gpt2/tokens.txt" --context 256 --batch 1 --steps 10 --precision "$p" --device cuda --out "$tdir/gpt2-$p.h5")"
        if [ "$rc" -eq 0 ]; then say "- gpt2 $p: passed in $secs s: $(summary_line "$work/logs/train/gpt2-$p.txt")"
        else say "- gpt2 $p: **$(outcome "$work/logs/train/gpt2-$p.txt" "$rc" "$secs" 180)**"; fail; fi
        rm -f "$tdir/gpt2-$p.h5"
      done
    fi
  fi

  # 2d. Checkpoints between devices: 4 steps on one, 4 more resumed on the other, against 8 uninterrupted
  # steps there. The GradScaler's state must carry over exactly (the scale); the loss only within the
  # devices' rounding differences. On one device the resumed run is the uninterrupted one, bit for bit.
  say "" "### 2d. Checkpoints between devices (mlp fp16: 4 steps, then 4 resumed, against 8 uninterrupted)" ""
  local pairs=("cpu cpu")
  [ $gpu = 1 ] && pairs=("cpu cuda" "cuda cpu" "cuda cuda")
  local pair from to
  for pair in "${pairs[@]}"; do
    read -r from to <<< "$pair"
    local ck=$tdir/$from-$to.ckpt
    read -r rc secs <<< "$(train_run "ckpt-$from-$to-a" --sample mlp --precision fp16 --device "$from" --steps 4 --seed 1 --checkpoint "$ck")"
    [ "$rc" -eq 0 ] && read -r rc secs <<< "$(train_run "ckpt-$from-$to-b" --sample mlp --precision fp16 --device "$to" --steps 4 --seed 1 --resume "$ck")"
    local whole
    read -r whole secs <<< "$(train_run "ckpt-$to-whole" --sample mlp --precision fp16 --device "$to" --steps 8 --seed 1)"
    if [ "$rc" -ne 0 ] || [ "$whole" -ne 0 ]; then
      say "- $from -> $to: **a run failed** (logs train/ckpt-$from-$to-*.txt)"; fail; continue
    fi
    local resumed uninterrupted
    resumed=$(summary_line "$work/logs/train/ckpt-$from-$to-b.txt" | sed 's/.*final loss/final loss/')
    uninterrupted=$(summary_line "$work/logs/train/ckpt-$to-whole.txt" | sed 's/.*final loss/final loss/')
    if [ "$from" = "$to" ] && [ "$resumed" != "$uninterrupted" ]; then
      say "- $from -> $to: **resumed: $resumed; uninterrupted: $uninterrupted (must be equal)**"; fail
    elif [ "${resumed##*final scale }" != "${uninterrupted##*final scale }" ]; then
      say "- $from -> $to: **the scale differs: resumed: $resumed; uninterrupted: $uninterrupted**"; fail
    else
      say "- $from -> $to: resumed: $resumed; uninterrupted on $to: $uninterrupted"
    fi
  done
  [ -f "$work/train-failures" ] && failures=$((failures + $(wc -l < "$work/train-failures")))
  archive_logs
}

# ------------------------------------------------------------------------------------------------------ part 3
part_sanitize() {
  say "" "## 3. compute-sanitizer" ""
  local san
  san=$(command -v compute-sanitizer || true)
  [ -z "$san" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && san=/usr/local/cuda/bin/compute-sanitizer
  if [ $gpu = 0 ]; then say "$nogpu (compute-sanitizer: ${san:-not found})"; return; fi
  if [ -z "$san" ]; then say "not run: compute-sanitizer not found (PATH, /usr/local/cuda/bin)"; return; fi
  if [ "$(left)" -lt 60 ]; then say "not run: out of time"; return; fi
  # Does it start on this machine? Some refuse the device (virtualised GPUs, missing permissions).
  local first
  first=$(grep -m1 '^cuda_backend_test\.' "$work/lists/kernels_tests" 2>/dev/null)
  read -r rc secs <<< "$(run_one sanitizer-start "$work/logs/sanitize/start.txt" 90 AMPSCOPE_REQUIRE_GPU=1 -- "$san" --tool memcheck --error-exitcode 99 "$bin/tests/kernels_tests" --gtest_filter="${first:-cuda_backend_test.*}")"
  if ! grep -q '^\[==========\]' "$work/logs/sanitize/start.txt"; then
    say "not run: compute-sanitizer does not start here (exit $rc): $(grep -v '^\s*$' "$work/logs/sanitize/start.txt" | tail -n 2 | paste -sd' ' - | cut -c1-300)"
    return
  fi
  say "compute-sanitizer starts ($("$san" --version 2>/dev/null | grep -m1 -i version))." "" "| tool: program (filter) | outcome | s |" "|---|---|---|"
  local queue=$work/queue-3 tool spec
  : > "$queue"
  for tool in memcheck racecheck; do
    # The FP8 kernels without the 2^24-element encode sweeps (too slow under the tools; 1b runs them).
    for spec in "kernels_tests:cuda_backend_test.*:cuda_parity_test.*" \
                "kernels_tests:fp8_cuda_test.*-fp8_cuda_test.f32_patterns*:fp8_cuda_test.the_runtime_encoding*" \
                "kernels_tests:block_scaled_cuda_test.*" \
                "scaler_tests:*cuda*" "optim_tests:*cuda*" \
                "probes_tests:stats_cuda_test.*" "core_tests:*cuda*"; do
      local prog=${spec%%:*} filter=${spec#*:}
      [ -x "$bin/tests/$prog" ] || continue
      local extra="--tool $tool --error-exitcode 99"
      [ $tool = memcheck ] && extra="$extra --leak-check full"
      enqueue "$queue" "$tool: $prog ($filter)" "$san" "$extra $bin/tests/$prog --gtest_filter=$filter" "AMPSCOPE_REQUIRE_GPU=1"
    done
  done
  # The autograd CUDA cases under memcheck last: the longest, so they take what time is left.
  [ -x "$bin/tests/autograd_tests" ] && enqueue "$queue" "memcheck: autograd_tests (*cuda*)" "$san" \
    "--tool memcheck --error-exitcode 99 $bin/tests/autograd_tests --gtest_filter=*cuda*" "AMPSCOPE_REQUIRE_GPU=1"
  local saved=$test_timeout
  test_timeout=${AMPSCOPE_CHECK_SANITIZER_TIMEOUT:-150}
  run_queue "$queue" "$work/results-3" 1 "3"
  test_timeout=$saved
  # A sanitizer's findings: its ERROR SUMMARY lines.
  grep -h 'ERROR SUMMARY: [1-9]' "$work/logs/3/"*.txt 2>/dev/null | sort | uniq -c | while read -r line; do say "- $line"; done
}

# ------------------------------------------------------------------------------------------------------ part 4
part_measure() {
  say "" "## 4. Measurements" ""
  if [ $gpu = 0 ]; then
    say "$nogpu$(command -v "${PYTHON:-python3}" >/dev/null && echo " (PyTorch here: $("${PYTHON:-python3}" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none))")"
    return
  fi
  local steps=${STEPS:-100} warmup=${WARMUP:-20}
  mkdir -p "$work/logs/measure"
  # 4a. The statistics kernel's bandwidth against a device-to-device copy (goal: stats/copy >= 0.85), and
  # matrix products: the disabled gpu_timing tests.
  say "### 4a. Statistics kernel against a device copy (goal: stats/copy >= 0.85); matrix products" ""
  if [ "$(left)" -gt 60 ]; then
    read -r rc secs <<< "$(run_one gpu_timing "$work/logs/measure/gpu_timing.txt" "$(min_left 120)" AMPSCOPE_REQUIRE_GPU=1 -- "$bin/tests/probes_tests" --gtest_also_run_disabled_tests --gtest_filter='gpu_timing.*')"
    grep '^|' "$work/logs/measure/gpu_timing.txt" | while IFS= read -r line; do say "$line"; done
    [ "$rc" -eq 0 ] || { say "- **$(outcome "$work/logs/measure/gpu_timing.txt" "$rc" "$secs" 120)**"; fail; }
  else
    say "not run: out of time"
  fi
  archive_logs

  # 4b. ms per step, from two runs (WARMUP and WARMUP + STEPS steps) so that start-up cancels; the probe's
  # overhead at level health (goal: <= 1.05 x the step with the probe off), fp16 and bf16.
  say "" "### 4b. ampscope training step, ms (($warmup + $steps steps) - ($warmup steps)) / $steps; probe overhead (goal: health/off <= 1.05)" ""
  say "| sample | fp16 off | fp16 health | health/off | bf16 off |" "|---|---|---|---|---|"
  run_ms() {
    local label=$1; shift
    read -r rc secs <<< "$(run_one "m-$label" "$work/logs/measure/$label.txt" "$(min_left 120)" -- "$ampscope" train "$@")"
    [ "$rc" -eq 0 ] || return 1
    echo "$secs"
  }
  per_step() {  # per_step LABEL ARGS... -> ms per step (wall, whole seconds of two runs: use enough STEPS)
    local label=$1 a b t0 t1; shift
    t0=$(date +%s%N); run_ms "$label-short" --steps "$warmup" "$@" > /dev/null || return 1; t1=$(date +%s%N); a=$(((t1 - t0) / 1000000))
    t0=$(date +%s%N); run_ms "$label-long" --steps $((warmup + steps)) "$@" > /dev/null || return 1; t1=$(date +%s%N); b=$(((t1 - t0) / 1000000))
    awk -v a="$a" -v b="$b" -v n="$steps" 'BEGIN { printf "%.3f", (b - a) / n }'
  }
  local s
  for s in mlp cnn transformer; do
    if [ "$(left)" -lt 60 ]; then say "| $s | not run: out of time | | | |"; continue; fi
    local off health bf
    off=$(per_step "$s-fp16-off" --sample "$s" --precision fp16 --device cuda --seed 1 --probe off) || off=failed
    health=$(per_step "$s-fp16-health" --sample "$s" --precision fp16 --device cuda --seed 1 --probe health --out "$work/m.h5") || health=failed
    rm -f "$work/m.h5"
    bf=$(per_step "$s-bf16-off" --sample "$s" --precision bf16 --device cuda --seed 1 --probe off) || bf=failed
    say "| $s | $off | $health | $(awk -v a="$health" -v b="$off" 'BEGIN { if (b + 0 > 0 && a + 0 > 0) printf "%.2f", a / b; else print "-" }') | $bf |"
  done
  archive_logs

  # 4c. PyTorch eager on the same models (bench/pytorch_bench.py), in this machine's Python.
  say "" "### 4c. PyTorch eager AMP on the same models (bench/pytorch_bench.py)" ""
  local py=${PYTHON:-python3}
  if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > "$work/logs/measure/torch.txt" 2>&1; then
    say "not run: no PyTorch with CUDA in $py ($(tail -n 1 "$work/logs/measure/torch.txt"))"
  elif [ "$(left)" -lt 60 ]; then
    say "not run: out of time"
  else
    say "- PyTorch $("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1)"
    read -r rc secs <<< "$(run_one pytorch_bench "$work/logs/measure/pytorch_bench.txt" "$(min_left 240)" -- "$py" "$root/bench/pytorch_bench.py" --steps "$steps" --warmup "$warmup")"
    grep -E '^(\||#|$)' "$work/logs/measure/pytorch_bench.txt" | while IFS= read -r line; do say "$line"; done
    [ "$rc" -eq 0 ] || { say "- **$(outcome "$work/logs/measure/pytorch_bench.txt" "$rc" "$secs" 240)**"; fail; }
  fi
  say "" "- not measured by this script yet: the GPT-2-small step against PyTorch, and ampscope's fp16 losses against PyTorch's on the same weights and data"
  archive_logs
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run_check "$@" ;;
  sanitize) shift; run_check --only sanitize "$@" ;;
  *) usage ;;
esac
