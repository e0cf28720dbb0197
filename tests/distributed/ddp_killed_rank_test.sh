#!/bin/bash
# A data-parallel run whose rank dies: `mpirun -np 2 ampscope train --ddp` on a long run, rank 1 killed
# (SIGKILL) once both traces hold steps. The job must end with a non-zero status (mpirun passes on the
# killed rank's, 137) within 30 s of the kill
# (Open MPI ends it when a rank leaves without MPI_Finalize), and each rank's trace must still be readable
# up to its last flushed step: `ampscope export` writes its /steps table with at least one row. Skips (77)
# without an MPI launcher.
#   tests/distributed/ddp_killed_rank_test.sh LAUNCHER AMPSCOPE
set -u
launcher=$1 ampscope=$(realpath "$2")
if [ -z "$launcher" ]; then
  echo "skipped: this build has no MPI process group (AMPSCOPE_MPI=OFF, or no MPI launcher was found at configure time); install Open MPI (openmpi-bin, libopenmpi-dev: scripts/setup.sh) and configure with -DAMPSCOPE_MPI=ON"
  exit 77
fi
if ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: the MPI launcher '$launcher' is not there any more; install openmpi-bin (scripts/setup.sh)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
timeout 120 "$launcher" --oversubscribe -np 2 "$ampscope" train --sample mlp --precision fp16 --steps 1000000 \
  --batch 8 --out run.h5 --ddp >log 2>&1 &
job=$!
# The ranks are mpirun's children; rank 1 is the one whose environment says so.
rank1=""
for _ in $(seq 1 600); do
  for pid in $(ps -o pid= --ppid "$job" 2>/dev/null; for p in $(ps -o pid= --ppid "$job" 2>/dev/null); do ps -o pid= --ppid "$p"; done); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then rank1=$pid; fi
  done
  [ -n "$rank1" ] && [ -s run.rank0.h5 ] && [ -s run.rank1.h5 ] && break
  kill -0 "$job" 2>/dev/null || break  # the job ended by itself
  sleep 0.1
done
if [ -z "$rank1" ]; then
  echo "FAIL: rank 1 was not found among mpirun's processes"; sed 's/^/   | /' log | head -20; kill "$job" 2>/dev/null; exit 1
fi
sleep 3  # let both ranks write (and flush) some steps
start=$(date +%s%N)
kill -KILL "$rank1"
wait "$job"
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "== rank 1 (pid $rank1) killed: mpirun's exit status $status after ${elapsed_ms} ms"
sed 's/^/   | /' log | tr '\r' '\n' | tail -8
failures=0
# mpirun reports the killed rank's signal (137 = 128 + SIGKILL); timeout's own is 124 (SIGTERM first).
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
  echo "FAIL: status $status (0: the job did not notice; 124: it hung until timeout ended it)"
  failures=$((failures + 1))
elif [ "$elapsed_ms" -gt 30000 ]; then
  echo "FAIL: the job took ${elapsed_ms} ms to end after the kill (bound 30 s)"
  failures=$((failures + 1))
fi
for r in 0 1; do
  if ! "$ampscope" export "run.rank$r.h5" --csv "csv$r" >"export$r.log" 2>&1; then
    echo "FAIL: run.rank$r.h5 is not readable:"; sed 's/^/   | /' "export$r.log"; failures=$((failures + 1)); continue
  fi
  rows=$(( $(wc -l <"csv$r/steps.csv") - 1 ))
  echo "   run.rank$r.h5: $rows /steps rows readable"
  if [ "$rows" -lt 1 ]; then echo "FAIL: run.rank$r.h5 holds no step"; failures=$((failures + 1)); fi
done
[ "$failures" -eq 0 ] && echo "PASS" || exit 1
