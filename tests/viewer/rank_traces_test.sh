#!/bin/bash
# The viewer's rank_view_real_run tests on a real data-parallel run: `mpirun -np 2 ampscope train --ddp` of the
# rank-bad-batch scenario (rank 1's share holds a bad row at step 3), then viewer_tests with AMPSCOPE_RANK_RUN
# naming the run (tests/viewer/rank_view_test.cpp). Skips (77) without an MPI launcher.
#   tests/viewer/rank_traces_test.sh LAUNCHER AMPSCOPE VIEWER_TESTS
set -u
launcher=$1 ampscope=$(realpath "$2") viewer_tests=$(realpath "$3")
if [ -z "$launcher" ] || ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: this build has no MPI launcher (AMPSCOPE_MPI=OFF, or Open MPI is not installed: scripts/setup.sh)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if ! timeout 120 "$launcher" --oversubscribe -np 2 "$ampscope" train --scenario rank-bad-batch --precision fp16 \
    --steps 6 --batch 32 --device cpu --out "$dir/run.h5" --ddp >"$dir/log" 2>&1; then
  echo "the 2-rank run failed:"
  cat "$dir/log"
  exit 1
fi
AMPSCOPE_RANK_RUN="$dir/run.h5" "$viewer_tests" --gtest_filter='rank_view_real_run.*'
