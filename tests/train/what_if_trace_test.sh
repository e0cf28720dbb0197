#!/usr/bin/env bash
# tests/train/what_if_trace_test.sh: `ampscope train --what-if` (core/what_if.h) leaves the run alone, from the binary
# itself: the mlp sample in bf16 and in fp8, with and without `--what-if mxfp8,nvfp4` (its last Linear, 10 outputs,
# left out with --fp8-keep-bf16 fc3), must print the same losses and write traces whose every dataset is the same
# bits, apart from /steps' time_ms (wall time), /blocks (the what-if rows), the string table they add to (and
# /index's counts and checksums of those) and the recorded config (which names --what-if and the measured formats'
# options). Bad uses exit 2 with the message naming what to do, and a Linear the format cannot block stops the run
# with its name.
#   what_if_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: what_if_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: what_if_trace_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect STATUS "message piece" args...: `ampscope train` (mlp, batch 32) exits STATUS with the piece on stderr
expect() {
  local want=$1 piece=$2
  shift 2
  "$ampscope" train --sample mlp --device cpu --batch 32 "$@" >"$work/out.txt" 2>"$work/err.txt"
  local status=$?
  if [[ $status != "$want" ]]; then
    fail "'train $*' exited $status, expected $want"
    cat "$work/err.txt" >&2
  elif [[ -n $piece ]] && ! grep -qF -- "$piece" "$work/err.txt"; then
    fail "'train $*': stderr lacks '$piece':"
    cat "$work/err.txt" >&2
  fi
}

for precision in bf16 fp8; do
  # An fp8 run keeps fc3 in bf16 in both runs (the option changes an fp8 run; a bf16 run refuses it without --what-if).
  keep=()
  [[ $precision == fp8 ]] && keep=(--fp8-keep-bf16 fc3)
  expect 0 "" --steps 4 --seed 3 --precision "$precision" --out "$work/plain-$precision.h5" "${keep[@]}"
  cp "$work/out.txt" "$work/plain-$precision.txt"
  expect 0 "" --steps 4 --seed 3 --precision "$precision" --out "$work/what-if-$precision.h5" \
    --what-if mxfp8,nvfp4 --fp8-keep-bf16 fc3
  cp "$work/out.txt" "$work/what-if-$precision.txt"
  # The printed losses (the lines that name one).
  if ! diff <(grep -o "loss [0-9.]*" "$work/plain-$precision.txt") <(grep -o "loss [0-9.]*" "$work/what-if-$precision.txt") >&2 ||
    [[ $(grep -c "loss [0-9]" "$work/plain-$precision.txt") -lt 2 ]]; then
    fail "$precision: the losses printed with --what-if differ from the run without it"
  fi
  /usr/bin/python3 - "$work/plain-$precision.h5" "$work/what-if-$precision.h5" <<'PY' || fail "$precision: traces differ (above)"
import sys, json
import h5py, numpy as np

a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
checked, bad = 0, []

def datasets(f):
    out = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out

da, db = datasets(a), datasets(b)
missing = sorted(set(da) - set(db))
if missing:
    bad.append(f"datasets missing with --what-if: {missing}")
# /blocks (format 8) holds the what-if run's own rows, every one marked what_if; the plain run's is empty.
if "blocks" in da and len(da["blocks"]) != 0:
    bad.append(f"the run without --what-if wrote {len(da['blocks'])} /blocks rows")
if "blocks" not in db or len(db["blocks"]) == 0 or not np.all(db["blocks"]["what_if"][()] == 1):
    bad.append("the --what-if run's /blocks rows are missing or not all marked what_if")
# The string table also holds the names the /blocks rows intern (operand, copy, format), so it, and /index's counts
# and checksums of it and of /blocks, grow; every string of the plain run must still be there, and every other table
# (whose string ids are compared as they are) must be the same bits.
def strings(f):
    data = f["string_bytes"][()].tobytes()
    return {data[o:o + n] for o, n in zip(f["strings"]["offset"][()], f["strings"]["length"][()])}
if not strings(a) <= strings(b):
    bad.append(f"strings of the plain run missing with --what-if: {sorted(strings(a) - strings(b))[:5]}")
grown = {"strings", "string_bytes", "index.strings", "index.string_bytes", "index.blocks", "index.crc32"}
for name, x in da.items():
    if name not in db or name in ("blocks", "strings", "string_bytes"):
        continue
    y = db[name]
    xv, yv = x[()], y[()]
    if x.dtype.names:  # a compound table: compare field by field, without the wall time
        for field in x.dtype.names:
            if field == "time_ms" or f"{name}.{field}" in grown:
                continue
            if not np.array_equal(xv[field], yv[field], equal_nan=xv[field].dtype.kind == "f"):
                bad.append(f"{name}.{field}")
            checked += 1
    else:
        same = (np.array_equal(xv, yv, equal_nan=True) if getattr(xv, "dtype", None) is not None and xv.dtype.kind == "f"
                else np.array_equal(xv, yv))
        if not same and not name.endswith("time_ms"):
            bad.append(name)
        checked += 1
config_a = json.loads(a.attrs["config"]) if "config" in a.attrs else {}
config_b = json.loads(b.attrs["config"]) if "config" in b.attrs else {}
if config_b.get("what_if") != "mxfp8,nvfp4" or config_b.get("fp8_keep_bf16") != ["fc3"]:
    bad.append(f"the what-if run's recorded config lacks what_if / fp8_keep_bf16: {config_b}")
# A bf16 run records the two options that leave Linears out only with --what-if.
# It also records the scale rule and transform of the formats --what-if measures.
for k in ("what_if", "mx_scale", "nvfp4_rht") + (("fp8_keep_bf16", "fp8_keep_first_last") if config_a.get("precision") == "bf16" else ()):
    config_b.pop(k, None)
if config_a != config_b:
    bad.append(f"the recorded configs differ beyond --what-if: {config_a} vs {config_b}")
if checked < 20:
    bad.append(f"only {checked} columns compared: the traces hold less than expected")
if bad:
    print("differ:", bad, file=sys.stderr)
    sys.exit(1)
PY
done

# Bad uses: exit 2 (the status of every refused option), nothing trained.
expect 2 "--what-if: 'mxfp9' is not a block-scaled format (did you mean 'mxfp8'?); expected mxfp8, nvfp4 or both" \
  --precision bf16 --out "$work/bad.h5" --what-if mxfp9
expect 2 "hint: --what-if nvfp4" --precision bf16 --out "$work/bad.h5" --what-if mxfp8,nvfp
expect 2 "--what-if: 'int8' is not a block-scaled format; expected" --precision bf16 --out "$work/bad.h5" --what-if int8
expect 2 "--what-if on an fp16 run" --precision fp16 --out "$work/bad.h5" --what-if nvfp4
expect 2 "hint: add --precision bf16 (or fp8)" --precision fp32 --out "$work/bad.h5" --what-if nvfp4
expect 2 "--what-if needs --out FILE" --precision bf16 --what-if nvfp4
expect 2 "--what-if needs a probe level other than off" --precision bf16 --out "$work/bad.h5" --what-if nvfp4 --probe off
expect 2 "--fp8-keep-bf16 is set but the precision is bf16" --precision bf16 --out "$work/bad.h5" --fp8-keep-bf16 fc3
# fc3 has 10 outputs: neither format can block it; the run stops at its first forward (exit 2: an Error).
expect 2 "--what-if mxfp8: linear in 'fc3': mxfp8 quantizes in 1x32 blocks" --precision bf16 --out "$work/odd.h5" \
  --what-if mxfp8
expect 2 "hint: keep this Linear in bf16 (--fp8-keep-bf16 'fc3')" --precision bf16 --out "$work/odd2.h5" --what-if nvfp4
# --fp8-keep-first-last leaves fc1 and fc3 out: it trains.
expect 0 "" --steps 1 --precision bf16 --out "$work/first-last.h5" --what-if nvfp4 --fp8-keep-first-last

[[ $failures == 0 ]] && echo "what_if_trace_test: the runs with --what-if are the runs without it"
exit $((failures > 0))
