#!/usr/bin/env bash
# Builds here, then runs the test programs on the GPU machine lent through the device tool, in one call.
#
#   scripts/device-check.sh pack      # here: build (CUDA on) and pack build/ into .device/bundle.tar.gz
#   scripts/device-check.sh run       # there: unpack and run every test program, GPU tests included
#
# With the device tool: run `pack` here, then run(command="scripts/device-check.sh run", carry=[".device"]).
# CTest files hold this machine's paths, so `run` calls the test programs directly. It writes the
# device name and the test output to $OUT (or .device/out) so the results come back.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

case "${1:-}" in
  pack)
    scripts/setup.sh -DAMPSCOPE_CUDA=ON
    rm -rf .device && mkdir -p .device
    ../shared/tools/device-bundle.sh build .device
    ;;
  run)
    out=${OUT:-.device/out}
    mkdir -p "$out"
    tar xzf .device/bundle.tar.gz -C .device
    export LD_LIBRARY_PATH="$root/.device/bundle/lib:${LD_LIBRARY_PATH:-}"
    export AMPSCOPE_REQUIRE_GPU=1  # a GPU test that would skip fails instead
    { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; } | tee "$out/device.txt"
    status=0
    for t in .device/bundle/bin/tests/*_tests; do
      echo "== $t"
      "$t" --gtest_brief=1 2>&1 | tee "$out/$(basename "$t").txt" || status=1
    done
    .device/bundle/bin/bin/ampscope demo --device cuda 2>&1 | tee "$out/demo.txt" || status=1
    exit $status
    ;;
  *)
    echo "usage: $0 pack|run   (see the comment at the top of this script)" >&2
    exit 2
    ;;
esac
