#!/usr/bin/env bash
# tests/train/what_if_equals_run_test.sh: issue 35's check "the what-if statistics of a format equal those of a run
# in that format at step 0 (same weights, same batch)", from the binary itself. The mlp sample (64-256-256-10; fc3,
# 10 outputs, kept in bf16 by every run) runs once with --precision bf16 --what-if mxfp8,nvfp4 and once with
# --precision mxfp8 and --precision nvfp4 (each with both MX scale rules / with and without the Hadamard transform,
# which --what-if measures as the real run would), same seed. The /blocks rows of step 0 are read with h5py and
# compared field by field.
#
# Which rows are comparable, and why: at step 0 both runs hold the same parameters (seeded, not yet updated) and
# draw the same batch, so
#   - every weight copy (rowwise, and columnwise where the Linear's input needs a gradient: fc2's, not fc1's, whose
#     input is the batch) quantizes the same bf16 weight: equal;
#   - the input copies of the first Linear (fc1, fed the batch itself) quantize the same values: equal;
#   - the inputs of later Linears (fc2) are the previous Linear's output, which the block-scaled run computed from
#     quantized operands and the bf16 run did not: they differ legitimately and are not compared (the test checks
#     they do differ, which shows the comparison would see a difference);
#   - grad_output copies start from the loss's gradient, a function of the (different) logits, and NVFP4 rounds them
#     stochastically: not compared.
#   what_if_equals_run_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: what_if_equals_run_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: what_if_equals_run_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

train() {
  local out=$1
  shift
  if ! "$ampscope" train --sample mlp --device cpu --batch 32 --steps 1 --seed 5 --fp8-keep-bf16 fc3 --out "$out" "$@" \
    >"$work/out.txt" 2>"$work/err.txt"; then
    fail "'train $*' failed"
    cat "$work/err.txt" >&2
  fi
}

# name: (what-if options, real-run options)
train "$work/whatif_roundup.h5" --precision bf16 --what-if mxfp8,nvfp4
train "$work/whatif_floor_northt.h5" --precision bf16 --what-if mxfp8,nvfp4 --mx-scale floor --nvfp4-no-rht
train "$work/mxfp8_roundup.h5" --precision mxfp8
train "$work/mxfp8_floor.h5" --precision mxfp8 --mx-scale floor
train "$work/nvfp4_rht.h5" --precision nvfp4
train "$work/nvfp4_northt.h5" --precision nvfp4 --nvfp4-no-rht

/usr/bin/python3 - "$work" <<'PY' || fail "step 0's what-if rows differ from the real runs' (above)"
import math, sys
import h5py

work = sys.argv[1]
FIELDS = ["rows", "cols", "numel", "nonzero", "nonfinite", "underflow", "saturated", "blocks", "blocks_clipped",
          "blocks_nan", "max_block_range", "max_range_block", "max_range_row", "max_range_col", "worst_block",
          "worst_block_underflow", "worst_block_row", "worst_block_col", "scale_log2_min", "scale_log2_median",
          "scale_log2_max", "rel_rms_error"]

def rows(path):
    with h5py.File(path, "r") as fh:
        strings, data = fh["strings"][()], fh["string_bytes"][()].tobytes()
        name = lambda i: data[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]].decode()
        out = {}
        for r in fh["blocks"][()]:
            if int(r["step"]) != 0:
                continue
            key = (name(r["module"]), name(r["operand"]), name(r["copy"]), name(r["format"]))
            row = {f: r[f].item() for f in FIELDS}
            row["what_if"] = bool(r["what_if"])
            if key in out:
                raise SystemExit(f"{path}: two step-0 rows for {key}")
            out[key] = row
        return out

def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b

bad = []
def compare(what_if_file, real_file, fmt):
    w, r = rows(f"{work}/{what_if_file}"), rows(f"{work}/{real_file}")
    comparable = [k for k in r if k[3] == fmt and (k[1] == "weight" or (k[1] == "input" and k[0] == "fc1"))]
    # fc1's input rowwise + columnwise, fc1's weight rowwise (its input, the batch, needs no gradient: no dgrad, so
    # no columnwise weight copy), fc2's weight rowwise + columnwise: 5 rows.
    if len(comparable) != 5:
        bad.append(f"{real_file}: expected 5 comparable step-0 rows, found {sorted(comparable)}")
    for k in comparable:
        if r[k]["what_if"]:
            bad.append(f"{real_file} {k}: a real run's row is marked what_if")
        if k not in w:
            bad.append(f"{what_if_file}: no what-if row for {k}")
            continue
        if not w[k]["what_if"]:
            bad.append(f"{what_if_file} {k}: not marked what_if")
        for f in FIELDS:
            if not same(w[k][f], r[k][f]):
                bad.append(f"{k} {f}: what-if {w[k][f]!r} vs {fmt} run {r[k][f]!r} ({what_if_file} / {real_file})")
    # The check can fail: fc2's input (fc1's output) did change under the block-scaled forward.
    k = ("fc2", "input", "rowwise", fmt)
    if k in w and k in r and all(same(w[k][f], r[k][f]) for f in FIELDS):
        bad.append(f"{k}: identical in both runs, though fc1's output was computed from quantized operands in one")
    # Nothing to compare would make the test pass vacuously: the rows carry real statistics.
    if not any(r[k]["underflow"] > 0 or r[k]["rel_rms_error"] > 0 for k in comparable):
        bad.append(f"{real_file}: every comparable row has zero error and underflow")
    return len(comparable)

n = compare("whatif_roundup.h5", "mxfp8_roundup.h5", "mxfp8")
n += compare("whatif_floor_northt.h5", "mxfp8_floor.h5", "mxfp8")
n += compare("whatif_roundup.h5", "nvfp4_rht.h5", "nvfp4")
n += compare("whatif_floor_northt.h5", "nvfp4_northt.h5", "nvfp4")
# The floor rule must be measured as such: MX floor and round-up rows of fc1's weight differ in their scales.
a = rows(f"{work}/mxfp8_roundup.h5")[("fc1", "weight", "rowwise", "mxfp8")]
b = rows(f"{work}/mxfp8_floor.h5")[("fc1", "weight", "rowwise", "mxfp8")]
if a["scale_log2_median"] == b["scale_log2_median"] and a["saturated"] == b["saturated"]:
    bad.append("--mx-scale floor and round-up gave the same fc1.weight statistics: the rule was not applied")
for line in bad:
    print(line)
print(f"compared {n} step-0 rows field by field ({len(FIELDS)} fields)")
sys.exit(1 if bad else 0)
PY

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "what_if_equals_run: all passed"
