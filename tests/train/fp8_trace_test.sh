#!/usr/bin/env bash
# tests/train/fp8_trace_test.sh: an FP8 run writes a trace, and every reading command works on it, from the binary
# itself (issue 34): `train --precision fp8 --out` on the mlp sample, then `report` (text and --json), `export --csv`
# and `diff` against the bf16 run of the same seed. Each shows precision fp8, and the /fp8 rows are there: three
# operands (input, weight, grad_output) of each of the three Linears (fc1, fc2, fc3) per step.
#   fp8_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: fp8_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: fp8_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect STATUS cmd...: the command exits with one of the statuses (space-separated), its output kept in $work/out.txt
expect() {
  local want=$1
  shift
  "$@" >"$work/out.txt" 2>"$work/err.txt"
  local status=$?
  if [[ " $want " != *" $status "* ]]; then
    fail "'$*' exited $status, expected $want"
    cat "$work/err.txt" >&2
  fi
}

expect 0 "$ampscope" train --sample mlp --device cpu --steps 4 --seed 1 --precision fp8 --out "$work/fp8.h5"
expect 0 "$ampscope" train --sample mlp --device cpu --steps 4 --seed 1 --precision bf16 --out "$work/bf16.h5"
[[ -f "$work/fp8.h5" ]] || fail "train --precision fp8 --out wrote no trace"

# report: 0 healthy, 1 anomalies found; 2 would be an error.
expect "0 1" "$ampscope" report "$work/fp8.h5"
grep -qF "fp8" "$work/out.txt" || fail "report does not name the precision fp8"
grep -qF "FP8 OPERANDS:" "$work/out.txt" || fail "report has no FP8 OPERANDS section"
cp "$work/out.txt" "$work/report.txt"

expect "0 1" "$ampscope" report --json "$work/fp8.h5"
cp "$work/out.txt" "$work/report.json"
/usr/bin/python3 - "$work/report.json" <<'PY' || fail "report --json: see above"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["run"]["precision"] == "fp8", doc["run"]["precision"]
f = doc["fp8"]
assert f["recorded"] is True and f["modules"] == 3, f
got = {(o["module"], o["operand"]) for o in f["operands"]}
want = {(m, o) for m in ("fc1", "fc2", "fc3") for o in ("input", "weight", "grad_output")}
assert got == want, got
for o in f["operands"]:
    assert o["steps"] == 4, o
    assert o["format"] == ("e5m2" if o["operand"] == "grad_output" else "e4m3"), o
    assert 0 <= o["underflow_fraction"] <= 1 and 0 <= o["saturated_fraction"] <= 1, o
PY

expect 0 "$ampscope" export "$work/fp8.h5" --csv "$work/csv"
/usr/bin/python3 - "$work/csv" <<'PY' || fail "export --csv: see above"
import csv, sys, os
d = sys.argv[1]
run = {r["attribute"]: r["value"] for r in csv.DictReader(open(os.path.join(d, "run.csv")))}
assert run["precision"] == "fp8" and run["format_version"] == "9", run
rows = list(csv.DictReader(open(os.path.join(d, "fp8.csv"))))
assert len(rows) == 4 * 3 * 3, len(rows)
for r in rows:
    assert int(r["underflow"]) + int(r["subnormal"]) + int(r["saturated"]) <= int(r["nonzero"]) <= int(r["numel"]), r
PY

# diff: 0 the runs agree within the threshold, 1 they part; 2 would be an error.
expect "0 1" "$ampscope" diff "$work/bf16.h5" "$work/fp8.h5"
grep -qF "fp8" "$work/out.txt" || fail "diff does not name the precision fp8"
expect "0 1" "$ampscope" diff --json "$work/bf16.h5" "$work/fp8.h5"
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); s=json.dumps(d); assert "\"fp8\"" in s, "no fp8 in the diff JSON"' \
  "$work/out.txt" || fail "diff --json does not name fp8"

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "ok: an fp8 run's trace: report, report --json, export --csv, diff"
