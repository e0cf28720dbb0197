#!/usr/bin/env bash
# The GPU check's plumbing, here, without a GPU (ctest device_check_dry_run): scripts/device-check.sh run --dry
# over this build's programs (a bundle of links, scripts/device-bundle.sh --link), with three fake test programs
# added: one that segfaults in its test, one that hangs (its time limit is 5 s here), one that
# segfaults as soon as it starts. The script must write each of them down as what it is and carry on: every real
# test program started and passed its first test, the training part ran on the CPU, every GPU part says
# "not run: no GPU", the summary ends with the three failures, and the logs come back as one archive. Then part 1
# on the GPU path, with fake programs that check the environment and arguments each pass gives them.
#   tests/device/dry_run_test.sh BUILD_DIR WORK_DIR
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD_DIR WORK_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
"$root/scripts/device-bundle.sh" --link "$build" "$work" || exit 1
tests=$work/bundle/bin/tests
real=$(cd "$tests" && ls -- *_tests)

# A program that lists one test and segfaults in it, one that hangs in it, one that crashes when asked its tests.
fake() {  # fake NAME BEHAVIOUR_WHEN_LISTING BEHAVIOUR_WHEN_RUN
  printf '#!/bin/sh\ncase "$*" in *--gtest_list_tests*) %s ;; esac\necho "[ RUN      ] %s_test.dies"\n%s\n' \
    "$2" "${1%_tests}" "$3" > "$tests/$1"
  chmod +x "$tests/$1"
}
fake crash_tests 'printf "crash_test.\n  dies\n"; exit 0' 'kill -SEGV $$'
fake hang_tests 'printf "hang_test.\n  dies\n"; exit 0' 'exec sleep 600'
fake broken_tests 'kill -SEGV $$' 'exit 0'

OUT=$work/out AMPSCOPE_CHECK_TIMEOUTS=hang_tests=5 AMPSCOPE_CHECK_JOBS=2 NO_GPU=1 \
  "$root/scripts/device-check.sh" run --bundle "$work/bundle" > "$work/console.txt" 2>&1
rc=$?
md=$work/out/device-check.md
status=0
check() {  # check DESCRIPTION REGEX: the summary must hold a line matching REGEX (grep -E)
  if ! grep -qE -- "$2" "$md"; then echo "FAIL: $1: no line matching /$2/ in $md"; status=1; fi
}
[ -f "$md" ] || { echo "FAIL: no summary $md (exit $rc)"; cat "$work/console.txt"; exit 1; }
[ "$rc" -eq 1 ] || { echo "FAIL: exit status $rc, expected 1 (the fake programs fail)"; status=1; }
check "the dry mode is named" '^- mode: no GPU \(dry run\)'
check "every program finds its libraries" '^- ldd: all [0-9]+ programs find every library'
check "the crash is a crash, in its test" '^\| crash_tests \| CRASHED: SIGSEGV in crash_test\.dies \(0 passed\) \|'
check "the hang is a timeout, in its test" '^\| hang_tests \| TIMED OUT after 5 s in hang_test\.dies \(0 passed\) \|'
check "a program that cannot list its tests" '^- broken_tests: \*\*could not list its tests\*\*: CRASHED: SIGSEGV'
for t in $real; do check "$t ran its first test" "^\| $t \| passed \(1 passed\) \|"; done
check "the GPU tests are not run" '^not run: no GPU \(dry run\)$'
check "part 1b's total" "^1b: $(echo "$real" | wc -w) of $(($(echo "$real" | wc -w) + 2)) passed; not passed: .*crash_tests \(CRASHED: SIGSEGV in crash_test\.dies\)"
for s in mlp cnn transformer; do for p in fp16 bf16; do check "$s $p trained on the CPU" "^\| $s $p cpu \| passed: 2 steps of '$s' in $p"; done; done
check "eight scenarios" '^### 2b\. The 8 scenarios'
check "log-zero's first anomaly" '^\| log-zero \| CPU only \(CUDA not run: no GPU \(dry run\)\) \| step 0, forward, log \(outside any module\)'
check "a checkpoint resumed on the CPU continues bit for bit" '^- cpu -> cpu: resumed: (final loss [^;]+); uninterrupted on cpu: \1$'
check "the sanitizers are not run" '^not run: no GPU \(dry run\) \(compute-sanitizer: '
check "the measurements are not run" '^not run: no GPU \(dry run\)'
check "the result counts the three fakes" '^\*\*Result: FAILED\*\* \(3 failing items\)'
# Each part is in the summary once, in order.
order=$(grep -E '^## [1-4]\.' "$md" | cut -c1-5 | paste -sd' ' -)
[ "$order" = "## 1. ## 2. ## 3. ## 4." ] || { echo "FAIL: the parts in the summary: '$order'"; status=1; }
# The logs archive holds the crash's own log.
members=$(tar tzf "$work/out/device-check-logs.tar.gz" 2>/dev/null)
grep -qx 'logs/1b/crash_tests.txt' <<< "$members" || { echo "FAIL: device-check-logs.tar.gz lacks logs/1b/crash_tests.txt"; status=1; }
if [ $status -ne 0 ]; then echo "--- $md"; cat "$md"; else echo "dry run: all checks passed ($(grep -c '' "$md") summary lines)"; fi

# The GPU path's plumbing (part 1 as it runs on a GPU), with fake programs that check what they are given:
# AMPSCOPE_CHECK_FAKE_GPU=1 makes the script take the GPU path without one. The fake kernels_tests (a CUDA-touching
# program: tests/kernels mentions the GPU) wants CUDA_LAUNCH_BLOCKING=1 and AMPSCOPE_REQUIRE_GPU=1 when run on its
# one CUDA test alone (1a), AMPSCOPE_REQUIRE_GPU=1, a shard count and no arguments when run whole (1b),
# AMPSCOPE_CUDA_NO_POOLS=1 on its CUDA tests, its FP8 tests and its block-scaled tests (1c); the fake autograd_tests
# lists 130 tests and runs only those of its shard (3 shards: 44, 43, 43). A fake test fails, naming what it lacked, when its environment is wrong.
gb=$work/gpu-bundle/bin/tests
mkdir -p "$gb" "$work/gpu-bundle/lib"
cat > "$gb/kernels_tests" <<'FAKE'
#!/bin/bash
[[ " $* " == *" --gtest_list_tests "* ]] && { printf 'cuda_backend_test.\n  allocates\ncpu_backend_test.\n  adds\n'; exit 0; }
want() { [ "${!1:-}" = "$2" ] || wrong="$wrong $1=${!1:-unset} (want $2)"; }
wrong="" tests=()
case "$*" in
  --gtest_filter=cuda_backend_test.allocates) want CUDA_LAUNCH_BLOCKING 1; want AMPSCOPE_REQUIRE_GPU 1; tests=(cuda_backend_test.allocates) ;;
  --gtest_filter=cuda_\*) want AMPSCOPE_CUDA_NO_POOLS 1; want AMPSCOPE_REQUIRE_GPU 1; want CUDA_LAUNCH_BLOCKING ""; tests=(cuda_backend_test.allocates) ;;
  --gtest_filter=fp8_cuda_\*) want AMPSCOPE_CUDA_NO_POOLS 1; want AMPSCOPE_REQUIRE_GPU 1; want CUDA_LAUNCH_BLOCKING ""; tests=(fp8_cuda_test.decodes) ;;
  --gtest_filter=block_scaled_cuda_\*) want AMPSCOPE_CUDA_NO_POOLS 1; want AMPSCOPE_REQUIRE_GPU 1; want CUDA_LAUNCH_BLOCKING ""; tests=(block_scaled_cuda_test.quantizes) ;;
  "") want AMPSCOPE_REQUIRE_GPU 1; want GTEST_TOTAL_SHARDS 1; want CUDA_LAUNCH_BLOCKING ""; tests=(cuda_backend_test.allocates cpu_backend_test.adds) ;;
  *) wrong="unexpected arguments: $*"; tests=(cuda_backend_test.allocates) ;;
esac
for t in "${tests[@]}"; do
  echo "[ RUN      ] $t"
  if [ -n "$wrong" ]; then echo "wrong environment:$wrong"; echo "[  FAILED  ] $t (0 ms)"; else echo "[       OK ] $t (0 ms)"; fi
done
[ -z "$wrong" ]
FAKE
cat > "$gb/autograd_tests" <<'FAKE'
#!/bin/bash
[[ " $* " == *" --gtest_list_tests "* ]] && { echo 'grad_test.'; for i in $(seq 0 129); do echo "  case_$i"; done; exit 0; }
if [ $# -ne 0 ] || [ "${GTEST_TOTAL_SHARDS:-}" != 3 ] || [ "${AMPSCOPE_REQUIRE_GPU:-}" != 1 ]; then
  echo "[ RUN      ] grad_test.case_0"; echo "args '$*', GTEST_TOTAL_SHARDS=${GTEST_TOTAL_SHARDS:-unset}"; echo "[  FAILED  ] grad_test.case_0 (0 ms)"; exit 1
fi
for i in $(seq 0 129); do
  [ $((i % 3)) -eq "$GTEST_SHARD_INDEX" ] && printf '[ RUN      ] grad_test.case_%d\n[       OK ] grad_test.case_%d (0 ms)\n' "$i" "$i"
done
exit 0
FAKE
chmod +x "$gb/kernels_tests" "$gb/autograd_tests"
OUT=$work/gpu-out AMPSCOPE_CHECK_FAKE_GPU=1 AMPSCOPE_CHECK_JOBS=2 \
  "$root/scripts/device-check.sh" run --only correctness --bundle "$work/gpu-bundle" > "$work/gpu-console.txt" 2>&1
rc=$?
md=$work/gpu-out/device-check.md
[ "$rc" -eq 0 ] || { echo "FAIL: the GPU path with fake programs: exit status $rc, expected 0"; status=1; }
check "1a: the CUDA test in its own process" '^1a: 1 of 1 passed\.$'
check "1b: the fake kernels_tests whole" '^\| kernels_tests \| passed \(2 passed\) \|'
for i in 1 2 3; do check "1b: autograd shard $i" "^\| autograd_tests \[$i/3\] \| passed \(4[34] passed\) \|"; done
check "1b's total" '^1b: 4 of 4 passed\.$'
check "1c: without memory pools" '^\| kernels_tests:cuda_\* \| passed \(1 passed\) \|'
check "1c: the FP8 kernels without memory pools" '^\| kernels_tests:fp8_cuda_\* \| passed \(1 passed\) \|'
check "1c: the block-scaled kernels without memory pools" '^\| kernels_tests:block_scaled_cuda_\* \| passed \(1 passed\) \|'
check "the result" '^\*\*Result: passed\*\*'
if [ $status -ne 0 ]; then echo "--- $md"; cat "$md"; else echo "GPU path with fake programs: all checks passed"; fi
exit $status
