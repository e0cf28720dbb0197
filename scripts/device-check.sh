#!/usr/bin/env bash
# Builds here, then runs the test programs on the GPU machine lent through the device tool, in one call.
#
#   scripts/device-check.sh pack      # here: build (CUDA on) and pack build/ into .device/bundle.tar.gz
#   scripts/device-check.sh run       # there: every test program, GPU tests included, then the sanitizers
#   scripts/device-check.sh sanitize  # there: only compute-sanitizer memcheck + racecheck on the CUDA tests
#
# With the device tool: run `pack` here, then run(command="scripts/device-check.sh run", carry=[".device"]).
# CTest files hold this machine's paths, so `run` calls the test programs directly. It writes the
# device name to $OUT/device.txt and every log into one archive, $OUT/logs.tar.gz (the device tool brings
# back only a few files), so the results come back; the console shows a summary line per program.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

case "${1:-}" in
  pack)
    scripts/setup.sh -DAMPSCOPE_CUDA=ON
    rm -rf .device && mkdir -p .device
    ../shared/tools/device-bundle.sh build .device
    ;;
  run|sanitize)
    out=${OUT:-.device/out}
    logs=.device/logs
    mkdir -p "$out" "$logs"
    trap 'tar czf "$out/logs.tar.gz" -C "$logs" . || true' EXIT
    [ -d .device/bundle ] || tar xzf .device/bundle.tar.gz -C .device
    export LD_LIBRARY_PATH="$root/.device/bundle/lib:${LD_LIBRARY_PATH:-}"
    export AMPSCOPE_REQUIRE_GPU=1  # a GPU test that would skip fails instead
    tests=.device/bundle/bin/tests
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$out/device.txt"
    status=0
    if [ "$1" = run ]; then
      # Every test program (what ctest runs, minus ctest's paths from the build machine), then the demo.
      for t in "$tests"/*_tests; do
        echo "== $t"
        "$t" --gtest_brief=1 > "$logs/$(basename "$t").txt" 2>&1 || status=1
        grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$(basename "$t").txt" | sort | uniq -c | head -5
      done
      .device/bundle/bin/bin/ampscope demo --device cuda > "$logs/demo.txt" 2>&1 || status=1
      tail -n 5 "$logs/demo.txt"
    fi
    # compute-sanitizer over the tests that run CUDA kernels: memcheck (out-of-bounds and misaligned
    # accesses, leaks of device memory, failed API calls) and racecheck (shared-memory hazards).
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$sanitizer" ]; then
      for tool in memcheck racecheck; do
        for spec in "kernels_tests:cuda_*" "autograd_tests:*cuda*" "scaler_tests:fused_*" "optim_tests:fused_*" \
                    "probes_tests:stats_cuda_test.*"; do
          prog=${spec%%:*} filter=${spec#*:}
          log="$logs/sanitizer-$tool-$prog.txt"
          echo "== compute-sanitizer --tool $tool $prog --gtest_filter=$filter"
          "$sanitizer" --tool "$tool" --error-exitcode 1 "$tests/$prog" --gtest_brief=1 --gtest_filter="$filter" \
            > "$log" 2>&1 || status=1
          tail -n 3 "$log"
        done
      done
    else
      echo "compute-sanitizer not found: the sanitizer runs did not happen" | tee "$out/sanitizer-missing.txt"
      status=1
    fi
    exit $status
    ;;
  *)
    echo "usage: $0 pack|run|sanitize   (see the comment at the top of this script)" >&2
    exit 2
    ;;
esac
