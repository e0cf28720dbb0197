#!/usr/bin/env bash
# tests/train/block_twin_test.sh: the f32 twin of a block-scaled run (issue 35; probes/twin.h "Block-scaled
# Linears", docs/fp8.md "Training in MXFP8 and NVFP4"): `ampscope train --sample mlp --precision nvfp4 --twin` (fc3,
# 10 outputs, kept in bf16), and the mx-floor-clipping scenario in MXFP8 with and without --twin; their reports and `ampscope fix --finding block_error_dominates`, each checked against numbers read back from
# the trace with h5py and recomputed here (not from what the report printed):
#   - the twin changes nothing in the run: the same losses as the untwinned run, bit for bit;
#   - every block-scaled Linear (fc1, fc2) has a forward and a backward row per step, whose local error is at most
#     one bf16 rounding (2^-8: the block GEMM in f32 is the local reference), while its accumulated error (against the
#     unquantized f32 Linear) is far larger; fc3 (bf16) keeps the ordinary rows;
#   - block_error_dominates names the Linear with the largest mean jump (acc_mean_rel / max(in_acc_mean_rel, 2^-8)
#     over its forward rows), recomputed here with its mean errors, worst step, the next Linear, and the bound (its
#     mean accumulated error above NVFP4's unit roundoff 0.25); remedy --fp8-keep-bf16 MODULE;
#   - PRECISION's jump entries of the block Linears are block_quantization [nvfp4 -> bf16] with that remedy first;
#     the same on mx-floor-clipping (fc1, over E4M3's 0.0625);
#   - a bf16 run with --what-if nvfp4 --twin: its Linears twinned as bf16 ones (what-if copies are not the GEMM's);
#   - the untwinned runs keep the /blocks rule (twin false in the JSON, "no twin rows" in the text; it names fc1 on
#     mx-floor-clipping);
#   - fix re-runs the remedy: applied, the Linear out of the re-run's /blocks rows, its verdict recomputed from the
#     bf16 run's losses (docs/fp8.md "The loss tolerance");
#   - `ampscope diff --threshold 0` against a bf16 run of the same seed (docs/fp8.md "Confirming with a bf16 run"): the
#     runs depart first at step 0's fc1 (every op before it the same in both traces), and for fix's re-run with fc1
#     kept in bf16 at fc2 (fc1's step-0 row now the same); each first divergence's difference recomputed from the two
#     traces' /ops rows (|rms_a - rms_b| and |mean_a - mean_b| over the larger rms), and the losses' differences.
#   block_twin_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: block_twin_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: block_twin_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
run() { "$@" >"$work/out.txt" 2>"$work/err.txt" || { [[ $? == 1 ]] || { fail "'$*' failed"; cat "$work/err.txt" >&2; }; }; }

common=(--sample mlp --device cpu --steps 6 --seed 0 --fp8-keep-bf16 fc3)
run "$ampscope" train "${common[@]}" --precision nvfp4 --twin --out "$work/nv.h5"
run "$ampscope" train "${common[@]}" --precision nvfp4 --out "$work/plain.h5"
# The weather-station MXFP8 scenario (docs/scenarios.md), whose /blocks rule fires: with and without the twin.
run "$ampscope" train --scenario mx-floor-clipping --device cpu --seed 0 --precision mxfp8 --out "$work/mx.h5"
run "$ampscope" train --scenario mx-floor-clipping --device cpu --seed 0 --precision mxfp8 --twin --out "$work/mxt.h5"
# A bf16 run measured by --what-if: its /blocks rows are statistics of GEMMs it did not run, so its Linears are
# twinned as bf16 ones (no block_quantization entry, no block_error_dominates).
run "$ampscope" train --sample mlp --device cpu --steps 3 --seed 0 --precision bf16 --what-if nvfp4 --fp8-keep-bf16 fc3 --twin --out "$work/wi.h5"
for name in nv plain mx mxt wi; do
  run "$ampscope" report --json "$work/$name.h5"
  cp "$work/out.txt" "$work/$name.json"
  run "$ampscope" report "$work/$name.h5"
  cp "$work/out.txt" "$work/$name.txt"
done
grep -qF "block_quantization linear in fc1 [nvfp4 -> bf16]" "$work/nv.txt" ||
  fail "the report does not label fc1's jump block_quantization [nvfp4 -> bf16]"
for name in plain mx; do
  if grep -qF "block-scaled error dominates" "$work/$name.txt"; then
    grep -qF "no twin rows (run with --twin to measure it at the Linear's output)" "$work/$name.txt" ||
      fail "the untwinned $name report's block_error_dominates does not say it has no twin rows"
  fi
done
grep -qF "fc1 [mxfp8]: block-scaled error dominates (f32 twin)" "$work/mxt.txt" ||
  fail "the twinned mx-floor-clipping report does not name fc1 by the twin"
(cd "$work" && "$ampscope" fix --json --finding block_error_dominates nv.h5 >"$work/fix.out" 2>"$work/fix.err"; echo $? >"$work/fix.rc")
[[ $(cat "$work/fix.rc") == 0 || $(cat "$work/fix.rc") == 1 ]] || fail "fix --finding block_error_dominates: exit $(cat "$work/fix.rc"): $(cat "$work/fix.err")"
run "$ampscope" train --sample mlp --device cpu --steps 6 --seed 0 --precision bf16 --out "$work/bf16.h5"
# diff exits 1 when the runs diverge (at threshold 0 they do); run() accepts 1.
run "$ampscope" diff --json --threshold 0 "$work/nv.h5" "$work/bf16.h5"
cp "$work/out.txt" "$work/diff.json"
run "$ampscope" diff --json --threshold 0 "$work/nv.fix-fp8-keep-bf16-fc1.h5" "$work/bf16.h5"
cp "$work/out.txt" "$work/diff_kept.json"

/usr/bin/python3 - "$work" <<'PY' || fail "see above"
import json, math, sys
import h5py

work = sys.argv[1]
bad = []

def table(path, name):
    with h5py.File(path, "r") as fh:
        if name not in fh:
            return []
        strings, data = fh["strings"][()], fh["string_bytes"][()].tobytes()
        text = lambda i: data[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]].decode()
        kinds = fh[name].dtype
        out = []
        for r in fh[name][()]:
            d = {}
            for k in kinds.names:
                v = r[k]
                d[k] = v.tolist() if hasattr(v, "tolist") else v
            out.append(d)
        # The interned string columns of each table (indices into /strings).
        for col in ("op", "module", "out_dtype", "phase", "operand", "copy", "format"):
            if col in kinds.names:
                for d in out:
                    d[col] = text(d[col])
        return out

def losses(path):
    with h5py.File(path, "r") as fh:
        return [float(x) for x in fh["steps"]["loss"]]

# --- The twin leaves the run as it is.
if losses(f"{work}/nv.h5") != losses(f"{work}/plain.h5"):
    bad.append("the twinned nvfp4 run's losses differ from the untwinned run's")

prec = table(f"{work}/nv.h5", "precision")
blocks = [b for b in table(f"{work}/nv.h5", "blocks") if not b["what_if"]]
block_modules = sorted({b["module"] for b in blocks})
if block_modules != ["fc1", "fc2"]:
    bad.append(f"block-scaled Linears {block_modules}, expected fc1 and fc2 (fc3 kept in bf16)")
steps = sorted({p["step"] for p in prec})
if steps != list(range(6)):
    bad.append(f"twinned steps {steps}")
for m in block_modules + ["fc3"]:
    for phase in ("forward", "backward"):
        rs = [p for p in prec if p["op"] == "linear" and p["module"] == m and p["phase"] == phase]
        if sorted(p["step"] for p in rs) != steps:
            bad.append(f"{m} {phase}: rows at steps {[p['step'] for p in rs]}, expected one per twinned step")
        for p in rs:
            if not p["local"] or p["local_max_rel"] > 2 ** -8:
                bad.append(f"{m} {phase} step {p['step']}: local max error {p['local_max_rel']} is more than one bf16 rounding")
    fwd = [p for p in prec if p["op"] == "linear" and p["module"] == m and p["phase"] == "forward"]
    if m in block_modules and any(p["acc_mean_rel"] < 4 * p["local_mean_rel"] for p in fwd):
        bad.append(f"{m}: accumulated error not far above the bf16 rounding: {[(p['acc_mean_rel'], p['local_mean_rel']) for p in fwd]}")

# --- block_error_dominates recomputed: per block-scaled Linear, the mean over its forward rows of
# acc_mean_rel / max(in_acc_mean_rel, 2^-8), and of the two errors; the largest mean jump named when its mean error
# passes the element's u (E2M1 0.25, E4M3 0.0625).
def measures(path):
    rows = table(path, "precision")
    blk = [b for b in table(path, "blocks") if not b["what_if"]]
    fmt = {b["module"]: b["format"] for b in blk}
    out = {}
    for m in sorted(fmt):
        fwd = sorted((p for p in rows if p["op"] == "linear" and p["module"] == m and p["phase"] == "forward"),
                     key=lambda p: (p["step"], p["seq"]))
        jumps = [p["acc_mean_rel"] / max(p["in_acc_mean_rel"], 2 ** -8) for p in fwd]
        worst = max(range(len(fwd)), key=lambda i: (jumps[i], -i))
        out[m] = dict(jump=sum(jumps) / len(jumps), error=sum(p["acc_mean_rel"] for p in fwd) / len(fwd),
                      in_error=sum(p["in_acc_mean_rel"] for p in fwd) / len(fwd), worst_step=fwd[worst]["step"],
                      worst_jump=jumps[worst], steps=len(fwd), u=0.25 if fmt[m] == "nvfp4" else 0.0625, format=fmt[m])
    return out

def check_dominates(name, path, expect):
    measure = measures(path)
    top = max(measure, key=lambda m: measure[m]["jump"])
    nxt = max((m for m in measure if m != top), key=lambda m: measure[m]["jump"])
    print(name, {m: {k: (round(v, 5) if isinstance(v, float) else v) for k, v in d.items()} for m, d in measure.items()})
    got = [f for f in json.load(open(f"{work}/{name}.json"))["fp8_findings"] if f["kind"] == "block_error_dominates"]
    want = measure[top]
    if top != expect or not want["error"] > want["u"]:
        bad.append(f"{name}: the recomputed top Linear {top} (expected {expect}) is not over its bound: {want}; the run no longer fits")
        return top
    if len(got) != 1:
        bad.append(f"{name}: block_error_dominates findings: {got}, expected one on {top}")
        return top
    f = got[0]
    close = lambda a, b: abs(a - b) <= 1e-9 * max(1.0, abs(b))
    if f["module"] != top or not f["twin"] or f["operand"] != "output" or f["format"] != want["format"]:
        bad.append(f"{name}: finding on {f['module']} (twin {f['twin']}, operand {f['operand']}), recomputed {top}")
    for key in ("jump", "error", "in_error", "worst_jump"):
        if not close(f[key], want[key]):
            bad.append(f"{name}: finding {key} {f[key]}, recomputed {want[key]}")
    if f["worst_step"] != want["worst_step"] or f["steps"] != want["steps"] or f["error_bound"] != want["u"]:
        bad.append(f"{name}: finding worst_step {f['worst_step']} steps {f['steps']} bound {f['error_bound']}, recomputed {want}")
    if f["next_module"] != nxt or not close(f["next_jump"], measure[nxt]["jump"]) or not close(f["next_error"], measure[nxt]["error"]):
        bad.append(f"{name}: finding next {f['next_module']} {f['next_jump']}, recomputed {nxt} {measure[nxt]['jump']}")
    if [r["command_line"] for r in f["remedies"]] != [f"--fp8-keep-bf16 {top}"]:
        bad.append(f"{name}: finding remedies {f['remedies']}")
    return top

top = check_dominates("nv", f"{work}/nv.h5", "fc1")
check_dominates("mxt", f"{work}/mxt.h5", "fc1")
doc = json.load(open(f"{work}/nv.json"))

# --- PRECISION: the block Linears' jump entries.
for e in doc["precision"]["by_jump"]:
    if e["op"] != "linear" or e["phase"] != "forward":
        continue
    if e["module"] in block_modules:
        if e["fp8"] != "nvfp4" or e["kind"] != "block_quantization":
            bad.append(f"jump entry of {e['module']}: fp8 {e['fp8']!r} kind {e['kind']}")
        if e["remedies"] and e["remedies"][0]["flag"] != f"--fp8-keep-bf16 '{e['module']}'":
            bad.append(f"jump entry of {e['module']}: first remedy {e['remedies'][0]}")
    elif e["fp8"] != "" or e["kind"] == "block_quantization":
        bad.append(f"jump entry of the bf16 Linear {e['module']} marked {e['fp8']!r} {e['kind']}")

wi = json.load(open(f"{work}/wi.json"))
if not any(b["what_if"] for b in table(f"{work}/wi.h5", "blocks")):
    bad.append("the --what-if run recorded no what-if /blocks rows")
for e in wi["precision"]["by_jump"] + wi["precision"]["by_trend"]:
    if e["fp8"] != "" or e["kind"] == "block_quantization":
        bad.append(f"--what-if run: {e['op']} in {e['module']} marked {e['fp8']!r} {e['kind']}")
if any(f["kind"] == "block_error_dominates" for f in wi["fp8_findings"]):
    bad.append("--what-if run: a block_error_dominates finding")
# Had the twin taken a what-if copy for the GEMM's, its bit-for-bit check would have failed and left the Linear
# without rows: every Linear has its forward and backward rows on each of the 3 steps.
wi_rows = table(f"{work}/wi.h5", "precision")
for m in ("fc1", "fc2", "fc3"):
    for phase in ("forward", "backward"):
        got = sorted(p["step"] for p in wi_rows if p["op"] == "linear" and p["module"] == m and p["phase"] == phase)
        if got != [0, 1, 2]:
            bad.append(f"--what-if run: {m} {phase} rows at steps {got}")

# --- The untwinned runs: the /blocks rule, said so (it fires on mx-floor-clipping, fc1).
for name in ("plain", "mx"):
    for f in json.load(open(f"{work}/{name}.json"))["fp8_findings"]:
        if f["kind"] == "block_error_dominates" and f["twin"]:
            bad.append(f"the untwinned {name} run's block_error_dominates says twin")
if [f["module"] for f in json.load(open(f"{work}/mx.json"))["fp8_findings"] if f["kind"] == "block_error_dominates"] != ["fc1"]:
    bad.append("the untwinned mx-floor-clipping run has no /blocks block_error_dominates on fc1")

# --- fix: the remedy re-run, its verdict recomputed.
fix = json.load(open(f"{work}/nv.fix.json"))
if fix["cause"] != "fp8:block_error_dominates" or not fix["reproduced"]:
    bad.append(f"fix: cause {fix['cause']}, reproduced {fix['reproduced']}")
runs = {r["name"]: r for r in fix["runs"]}
remedy = [r for r in fix["runs"] if r["remedy_flag"] == f"--fp8-keep-bf16 {top}"]
if len(remedy) != 1 or "bf16" not in runs:
    bad.append(f"fix: runs {[r['remedy_flag'] for r in fix['runs']]}")
else:
    r = remedy[0]
    rerun = [b for b in table(f"{work}/{r['trace']}", "blocks") if not b["what_if"]]
    kept = r["ran"] and r["applied"] and not any(b["module"] == top for b in rerun) and any(rerun)
    bf16 = losses(f"{work}/{runs['bf16']['trace']}")
    l = bf16[-5:]
    d2 = [l[i] - 2 * l[i - 1] + l[i - 2] for i in range(2, len(l))]
    tol = 2 * math.sqrt(sum(x * x for x in d2) / len(d2) / 6) / abs(bf16[-1])
    rel = (losses(f"{work}/{r['trace']}")[-1] - bf16[-1]) / abs(bf16[-1])
    verdict = kept and tol < 1 and abs(rel) <= tol
    if not kept:
        bad.append(f"fix: --fp8-keep-bf16 {top} not applied (ran {r['ran']}, applied {r['applied']}, {top} in the re-run's /blocks)")
    if r["finding_gone"] != verdict or r["verified"] != verdict:
        bad.append(f"fix: gone {r['finding_gone']} verified {r['verified']}; recomputed loss vs bf16 {rel:+.4f} within {tol:.4f}: {verdict}")
    print(f"fix: --fp8-keep-bf16 {top}: loss vs bf16 {rel:+.4f}, tolerance {tol:.4f}, verified {r['verified']}")

# --- diff against the bf16 run: where the runs depart, recomputed from /ops (same seed: same weights and batch at
# step 0, so every op before the first block-scaled Linear has the same statistics in both traces).
def step0_forward(path):
    return sorted((o for o in table(path, "ops") if o["step"] == 0 and o["phase"] == "forward"), key=lambda o: o["seq"])

def first_departure(a_path, b_path):
    a, b = step0_forward(a_path), step0_forward(b_path)
    for x, y in zip(a, b):
        if (x["op"], x["module"]) != (y["op"], y["module"]):
            return None, f"step 0 forward rows differ in order: {x['op']} {x['module']} vs {y['op']} {y['module']}"
        peak = max(x["rms"], y["rms"])
        rel = max(abs(x["rms"] - y["rms"]), abs(x["mean"] - y["mean"])) / peak if peak > 0 else 0.0
        if rel > 0:
            return (x["op"], x["module"], rel), None
    return None, "no step-0 forward row differs"

for name, trace, module in (("diff", "nv.h5", "fc1"), ("diff_kept", "nv.fix-fp8-keep-bf16-fc1.h5", "fc2")):
    d = json.load(open(f"{work}/{name}.json"))
    want, err = first_departure(f"{work}/{trace}", f"{work}/bf16.h5")
    f = d["first_divergence"]
    if err or f is None:
        bad.append(f"{name}: {err or 'no first divergence'}")
        continue
    k = f["key"]
    if (k["step"], k["phase"], k["op"], k["module"]) != (0, "forward", want[0], want[1]) or want[1] != module:
        bad.append(f"{name}: first divergence {k}, recomputed {want} (expected linear in {module})")
    elif abs(f["max_rel"] - want[2]) > 1e-6 * want[2]:
        bad.append(f"{name}: first divergence {f['max_rel']}, recomputed {want[2]}")
    la, lb = losses(f"{work}/{trace}"), losses(f"{work}/bf16.h5")
    for row in d["losses"]:
        s = row["step"]
        rel = abs(la[s] - lb[s]) / max(max(abs(v) for v in la[: s + 1]), max(abs(v) for v in lb[: s + 1]))
        if abs(row["rel"] - rel) > 1e-9:
            bad.append(f"{name}: step {s} loss difference {row['rel']}, recomputed {rel}")
    print(f"{name}: departs at step 0 linear in {want[1]} ({want[2]:.4f} of its rms); losses {[round(r['rel'], 4) for r in d['losses']]}")

for line in bad:
    print(line)
sys.exit(1 if bad else 0)
PY

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "block_twin: all passed"
