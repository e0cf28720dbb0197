#!/usr/bin/env bash
# tests/trace/fp8_columns_test.sh: the optional /fp8 columns (docs/trace-format.md: dynamic_range,
# quantized_dynamic_range, history_len, history_amax, history_amax_step), from the binary itself:
#  - a delayed-recipe run (history 3, so the window slides within 8 steps): each row's history_amax and
#    history_amax_step equal what this script derives from the rows' own amax column by TransformerEngine's rule
#    (the window: the last history_len - 1 steps that rolled, and this one; a step whose amax is 0 does not roll),
#    and the next step's scale is fp8_max / history_amax in float32; the same with --fp8-amax-algo most_recent;
#  - a current-scaling run: no history (history_len 0);
#  - export --csv and report --json carry the columns, equal to h5py's reading of the trace;
#  - the format 7 fixture written before the columns (tests/fixtures/v7-mlp-fp8.h5) still exports, its old columns
#    equal to h5py's, the new ones "not recorded" (nan, -1).
#   fp8_columns_test.sh AMPSCOPE_BINARY SCRATCH_DIR SOURCE_DIR
set -uo pipefail
ampscope=${1:?usage: fp8_columns_test.sh AMPSCOPE_BINARY SCRATCH_DIR SOURCE_DIR}
work=${2:?usage: fp8_columns_test.sh AMPSCOPE_BINARY SCRATCH_DIR SOURCE_DIR}
source_dir=${3:?usage: fp8_columns_test.sh AMPSCOPE_BINARY SCRATCH_DIR SOURCE_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$@" >"$work/out.txt" 2>"$work/err.txt" || { fail "'$*' exited $?"; cat "$work/err.txt" >&2; }; }

/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null || { echo "SKIP: /usr/bin/python3 lacks h5py or numpy"; exit 77; }

common=(train --sample mlp --device cpu --steps 8 --seed 3 --precision fp8)
run "$ampscope" "${common[@]}" --fp8-amax-history 3 --out "$work/max.h5"
run "$ampscope" "${common[@]}" --fp8-amax-history 3 --fp8-amax-algo most_recent --out "$work/recent.h5"
run "$ampscope" "${common[@]}" --fp8-recipe current --out "$work/current.h5"
for name in max recent current; do
  run "$ampscope" export "$work/$name.h5" --csv "$work/$name-csv"
  "$ampscope" report --json "$work/$name.h5" >"$work/$name.json" 2>"$work/err.txt"
  [[ $? -le 1 ]] || fail "report --json $name exited with an error: $(cat "$work/err.txt")"
done
cp "$source_dir/tests/fixtures/v7-mlp-fp8.h5" "$work/v7.h5"
run "$ampscope" export "$work/v7.h5" --csv "$work/v7-csv"

/usr/bin/python3 - "$work" <<'PY' || fail "see above"
import csv, json, math, os, sys
import h5py, numpy as np
work = sys.argv[1]

def rows_of(name):
    with h5py.File(os.path.join(work, name + ".h5"), "r") as f:
        strings, data = f["strings"][:], f["string_bytes"][:].tobytes()
        text = lambda i: data[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]].decode()
        t = f["fp8"][:]
        out = []
        for r in t:
            d = {k: r[k] for k in t.dtype.names}
            for k in ("module", "operand", "format"):
                d[k] = text(d[k])
            out.append(d)
        return out, t.dtype.names

def check_csv(name, rows, names):
    got = list(csv.DictReader(open(os.path.join(work, name + "-csv", "fp8.csv"))))
    assert len(got) == len(rows), (name, len(got), len(rows))
    for g, r in zip(got, rows):
        for k in names:
            v = r[k]
            if isinstance(v, str):
                assert g[k] == v, (name, k, g[k], v)
            elif np.issubdtype(type(v), np.integer):
                assert int(g[k]) == int(v), (name, k, g[k], v)
            else:
                assert (math.isnan(float(g[k])) and math.isnan(v)) or float(g[k]) == float(v), (name, k, g[k], v)
    return got

new = ("dynamic_range", "quantized_dynamic_range", "history_len", "history_amax", "history_amax_step")
fp8_max = {"e4m3": np.float32(448), "e5m2": np.float32(57344)}
for name, most_recent in (("max", False), ("recent", True)):
    rows, names = rows_of(name)
    assert all(k in names for k in new), names
    assert len(rows) == 8 * 9, len(rows)
    check_csv(name, rows, names)
    by_operand = {}
    for r in rows:
        by_operand.setdefault((r["module"], r["operand"]), []).append(r)
    length, spikes = 3, 0
    for key, list_ in by_operand.items():
        list_.sort(key=lambda r: r["step"])
        rolled = []  # (step, amax) of the steps whose history rolled
        for i, r in enumerate(list_):
            s, a = int(r["step"]), np.float32(r["amax"])
            assert r["history_len"] == length, r
            assert 0 <= r["quantized_dynamic_range"] and 0 < r["dynamic_range"] < 64, r
            if a == 0:
                want, want_step = 0.0, -1
            elif most_recent:
                want, want_step = float(a), s
            else:
                window = rolled[-(length - 1):] + [(s, a)]
                want = max(float(x) for _, x in window if not math.isnan(x))
                want_step = next(st for st, x in window if float(x) == want)
                spikes += want_step != s
            assert r["history_amax"] == want and r["history_amax_step"] == want_step, (name, key, s, r, want, want_step)
            if a != 0:
                rolled.append((s, a))
            if i + 1 < len(list_):
                nxt = np.float32(list_[i + 1]["scale"])
                expect = fp8_max[r["format"]] / np.float32(want) if want > 0 and math.isfinite(want) else np.float32(r["scale"])
                assert nxt == expect, (name, key, s, nxt, expect)
    if not most_recent:
        assert spikes > 0, "no step's scale came from an earlier step: the window was not exercised"
    doc = json.load(open(os.path.join(work, name + ".json")))
    for o in doc["fp8"]["operands"]:
        last = by_operand[(o["module"], o["operand"])][-1]
        assert o["last_history_len"] == length and o["last_history_amax"] == last["history_amax"], (o, last)
        assert o["last_history_amax_step"] == last["history_amax_step"], (o, last)
        assert o["last_dynamic_range"] == last["dynamic_range"], (o, last)
        assert o["max_dynamic_range"] == max(r["dynamic_range"] for r in by_operand[(o["module"], o["operand"])]), o

rows, names = rows_of("current")
check_csv("current", rows, names)
for r in rows:
    assert r["history_len"] == 0 and r["history_amax"] == 0 and r["history_amax_step"] == -1, r

# The fixture: the old columns as h5py reads them, the new ones not recorded.
rows, names = rows_of("v7")
assert not any(k in names for k in new), names
got = check_csv("v7", rows, names)
assert len(got) == 27
for g in got:
    assert g["dynamic_range"] == "nan" and g["quantized_dynamic_range"] == "nan" and g["history_amax"] == "nan", g
    assert g["history_len"] == "-1" and g["history_amax_step"] == "-1", g
PY

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "fp8 columns: all checks passed"
