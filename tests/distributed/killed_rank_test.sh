#!/bin/bash
# A rank that dies or leaves must not hang the others: each mode of killed_rank (see killed_rank.cpp) runs
# under `timeout 60 mpirun -np 2`; die and leave must end with a non-zero status well before the timeout
# (within 30 s; Open MPI ends the job about a second after a rank dies, the group's 2 s shutdown timeout
# ends it after a rank leaves), clean with status 0. Skips (77) without an MPI launcher.
#   tests/distributed/killed_rank_test.sh LAUNCHER PROGRAM
set -u
launcher=$1 program=$2
if [ -z "$launcher" ]; then
  echo "skipped: this build has no MPI process group (AMPSCOPE_MPI=OFF, or no MPI launcher was found at configure time); install Open MPI (openmpi-bin, libopenmpi-dev: scripts/setup.sh) and configure with -DAMPSCOPE_MPI=ON"
  exit 77
fi
if ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: the MPI launcher '$launcher' is not there any more; install openmpi-bin (scripts/setup.sh)"
  exit 77
fi
failures=0
for mode in die leave clean; do
  log=$(mktemp)
  start=$(date +%s%N)
  timeout 60 "$launcher" --oversubscribe -np 2 "$program" "$mode" >"$log" 2>&1
  status=$?
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "== $mode: exit status $status after ${elapsed_ms} ms"
  sed 's/^/   | /' "$log" | head -40
  if ! grep -q "rank 0: first all_reduce done (3)" "$log"; then
    echo "FAIL: $mode: rank 0 did not finish the first all_reduce with the sum 3"
    failures=$((failures + 1))
  fi
  if [ "$mode" = clean ]; then
    [ "$status" -eq 0 ] || { echo "FAIL: clean: status $status, expected 0"; failures=$((failures + 1)); }
  else
    if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
      echo "FAIL: $mode: status $status (0: the job did not notice; 124/137: it hung until timeout killed it)"
      failures=$((failures + 1))
    elif [ "$elapsed_ms" -gt 30000 ]; then
      echo "FAIL: $mode: the job took ${elapsed_ms} ms to end (bound 30 s)"
      failures=$((failures + 1))
    fi
    if grep -q "second all_reduce done" "$log"; then
      echo "FAIL: $mode: a second all_reduce completed without rank 1"
      failures=$((failures + 1))
    fi
    if [ "$mode" = leave ] && ! grep -q "aborting the MPI job" "$log"; then
      echo "FAIL: leave: rank 1 did not say it aborts the job"
      failures=$((failures + 1))
    fi
  fi
  rm -f "$log"
done
[ "$failures" -eq 0 ] && echo "killed_rank_test: all modes ended as expected"
exit $((failures > 0))
