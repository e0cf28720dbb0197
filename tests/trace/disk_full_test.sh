#!/usr/bin/env bash
# tests/trace/disk_full_test.sh: `ampscope train --out` on a disk that fills up. A 1 MiB tmpfs is pre-filled to
# leave N KiB free, for every N from 0 to 64 (tmpfs hands out whole 4 KiB pages, so N KiB free is N rounded
# down to a page; each size is run anyway), and a 40-step run writes its trace there. Each run must either
# finish (exit 0, a complete trace) or stop cleanly: exit 2, stderr exactly two lines, "ampscope: error: cannot
# write trace 'FILE': no space left on device (...)" and a hint saying which steps the trace holds, nothing
# printed by HDF5 itself, no crash; the trace then holds exactly those steps, as h5py (an independent reader)
# and `ampscope report` read it. Mounting needs root (CAP_SYS_ADMIN): without it the test is skipped (77).
#   disk_full_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=$(realpath "${1:?usage: disk_full_test.sh AMPSCOPE_BINARY SCRATCH_DIR}")
work=${2:?usage: disk_full_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
python=/usr/bin/python3
mnt="$work/mnt"
if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt"; fi
rm -rf "$work" && mkdir -p "$mnt"
if ! mount_error=$(mount -t tmpfs -o size=1024k,mode=0755 tmpfs "$mnt" 2>&1); then
  echo "SKIP: cannot mount a tmpfs to fill (user id $(id -u); mounting needs root): $mount_error"
  exit 77
fi
trap 'umount "$mnt" 2>/dev/null' EXIT
if ! "$python" -c 'import h5py' 2>/dev/null; then
  echo "SKIP: $python has no h5py (Debian's python3-h5py), the independent reader of the traces"
  exit 77
fi

failures=0
fail() {
  echo "FAIL ($1 KiB free): $2" >&2
  failures=$((failures + 1))
}

# holds_steps TRACE LAST: h5py reads the trace; its last /index row ended step LAST and counts LAST + 1 /steps
# rows, steps 0 to LAST, and every table holds the rows that row counts (the file is whole up to there).
holds_steps() {
  "$python" - "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
path, last = sys.argv[1], int(sys.argv[2])
# A trace its writer did not close (killed, or stopped by the full disk) opens in SWMR mode only.
with h5py.File(path, "r", swmr=True, libver="latest") as f:
    assert f.attrs["complete"] == 0, "complete is not 0"
    index = f["index"][:]
    assert len(index) > 0, "no /index row"
    row = index[-1]
    assert row["step"] == last, f"last /index row ends step {row['step']}, expected {last}"
    assert row["steps"] == last + 1, f"last /index row counts {row['steps']} /steps rows, expected {last + 1}"
    steps = f["steps"][: row["steps"]]["step"]
    assert np.array_equal(steps, np.arange(last + 1)), f"/steps holds steps {steps}"
    for name in ("ops", "grads", "strings", "string_bytes"):
        n = int(row[name])
        assert f[name].shape[0] >= n, f"/{name} has {f[name].shape[0]} rows, /index counts {n}"
        f[name][:n]  # every chunk inflates (h5py checks HDF5's filters)
    ops = f["ops"][: row["ops"]]
    assert len(ops) > 0 and ops["step"].max() == last, "the /ops rows do not reach the last step"
EOF
}

# holds_no_step TRACE: the file is not HDF5 yet, or h5py finds no /index row of a step.
holds_no_step() {
  "$python" - "$1" <<'EOF'
import sys, h5py
try:
    f = h5py.File(sys.argv[1], "r", swmr=True, libver="latest")
except OSError:
    sys.exit(0)
with f:
    if "index" in f:
        index = f["index"][:]
        assert len(index) == 0 or index[-1]["step"] < 0, f"/index holds step {index[-1]['step']}"
EOF
}

finished=0
stopped_with_steps=0
stopped_without=0
for kib in $(seq 0 64); do
  find "$mnt" -mindepth 1 -delete
  head -c $(((1024 - kib) * 1024)) /dev/zero >"$mnt/fill" 2>/dev/null
  trace="$mnt/run.h5"
  (cd "$work" && "$ampscope" train --device cpu --sample mlp --steps 40 --out "$trace") >"$work/out.txt" 2>"$work/err.txt"
  status=$?
  if [[ $status == 0 ]]; then
    finished=$((finished + 1))
    "$ampscope" report "$trace" --json >"$work/report.json" 2>&1 || fail "$kib" "report of the finished trace failed"
    grep -q '"complete": true' "$work/report.json" || fail "$kib" "the finished trace is not complete"
    grep -q '"steps": 40,' "$work/report.json" || fail "$kib" "the finished trace does not hold 40 steps"
    continue
  fi
  if [[ $status != 2 ]]; then
    fail "$kib" "exit status $status, expected 0 or 2; stderr: $(cat "$work/err.txt")"
    continue
  fi
  lines=$(wc -l <"$work/err.txt")
  first=$(sed -n 1p "$work/err.txt")
  hint=$(sed -n 2p "$work/err.txt")
  if [[ $lines != 2 ]]; then
    fail "$kib" "stderr has $lines lines, expected the error and its hint:"
    cat "$work/err.txt" >&2
  fi
  if [[ $first != "ampscope: error: cannot write trace '$trace': no space left on device ("*")" ]]; then
    fail "$kib" "unexpected error line: $first"
  fi
  if [[ $hint =~ ^hint:\ the\ trace\ holds\ the\ steps\ up\ to\ step\ ([0-9]+)\ \(report\ and\ the\ viewer\ read\ them\)\;\ free\ space\ on\ its\ file\ system,\ or\ write\ the\ trace\ elsewhere$ ]]; then
    last=${BASH_REMATCH[1]}
    stopped_with_steps=$((stopped_with_steps + 1))
    holds_steps "$trace" "$last" 2>"$work/py.txt" || fail "$kib" "the trace does not hold steps 0 to $last: $(tail -1 "$work/py.txt")"
    "$ampscope" report "$trace" --json >"$work/report.json" 2>"$work/report-err.txt"
    report_status=$?
    [[ $report_status == 0 || $report_status == 1 ]] || fail "$kib" "report exited $report_status: $(cat "$work/report-err.txt")"
    grep -q "\"steps\": $((last + 1))," "$work/report.json" || fail "$kib" "report does not analyse $((last + 1)) steps"
    grep -q '"complete": false' "$work/report.json" || fail "$kib" "report does not call the trace incomplete"
  elif [[ $hint == "hint: the trace holds no complete step; free space on its file system, or write the trace elsewhere" ]]; then
    stopped_without=$((stopped_without + 1))
    holds_no_step "$trace" 2>"$work/py.txt" || fail "$kib" "the trace holds a step: $(tail -1 "$work/py.txt")"
  else
    fail "$kib" "unexpected hint line: $hint"
  fi
done

echo "disk_full_test: 65 sizes: $finished finished, $stopped_with_steps stopped with steps, $stopped_without stopped before any"
# The sizes must reach every case, or the test proves less than it says.
if ((finished == 0 || stopped_with_steps == 0 || stopped_without == 0)); then
  echo "FAIL: the sizes did not reach every case (finished, stopped with steps, stopped before any)" >&2
  failures=$((failures + 1))
fi
if ((failures > 0)); then
  echo "disk_full_test: $failures failure(s)" >&2
  exit 1
fi
echo "disk_full_test: passed"
