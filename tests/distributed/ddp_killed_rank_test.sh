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
# The multi-rank report: rank 1 ended early. Both traces may hold the same steps (rank 0 waited for rank 1's
# gradients); what tells them apart is that rank 0's end was mpirun's SIGTERM, noted beside its trace.
"$ampscope" report run.h5 >report.txt 2>report.err
status=$?
echo "   ampscope report run.h5: exit status $status"
sed -n '1,/^no NaN\/Inf origin\|^first origin/p' report.txt | sed 's/^/   | /'
if [ "$status" -ne 1 ]; then
  echo "FAIL: the report of a run whose rank 1 was killed exited $status, expected 1 (not healthy)"
  sed 's/^/   | /' report.err
  failures=$((failures + 1))
fi
if ! grep -q '^  rank 1: run\.rank1\.h5 ([0-9]* steps, [0-9]* anomalies, ENDED EARLY)$' report.txt ||
   ! grep -q '^rank 1 ENDED EARLY: its trace stops at step [0-9]* without being closed by its writer' report.txt; then
  echo "FAIL: the report does not name rank 1 as the rank that ended early"
  failures=$((failures + 1))
fi
if grep -q 'rank 0 ENDED EARLY\|rank 0: run\.rank0\.h5 (.*ENDED EARLY' report.txt; then
  echo "FAIL: the report names rank 0, which mpirun ended after rank 1 died"
  failures=$((failures + 1))
fi
"$ampscope" report run.h5 --json >report.json 2>report-json.err
status=$?
if [ "$status" -ne 1 ]; then
  echo "FAIL: the JSON report exited $status, expected 1"
  failures=$((failures + 1))
fi
if ! python3 - report.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["unfinished"]
assert j["ended_early"] == [1], f"ended_early is {j['ended_early']}, expected [1]"
ends = {e["rank"]: e for e in j["ranks"]}
assert ends[1]["ended_early"] and not ends[1]["complete"] and not ends[1]["terminated"], ends[1]
assert not ends[0]["ended_early"] and not ends[0]["complete"], ends[0]
PY
then
  echo "FAIL: the JSON report's unfinished: ended_early, ranks"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] && echo "PASS" || exit 1
