#!/usr/bin/env bash
# tests/train/block_findings_test.sh: the report's block-scaled findings (issue 35, docs/fp8.md "Block-scaled
# diagnoses") on the weather-station scenarios (samples/scenarios.cpp: the mlp with one raw feature, air pressure in
# hPa, about 1013), with the findings' numbers recomputed here from the trace's /blocks rows with h5py (not from
# what the report printed), and `ampscope fix` re-running each remedy:
#   - mx-floor-clipping (--precision mxfp8, --mx-scale floor): mx_floor_clipping on fc1 input rowwise, the
#     pressure's block clipped (1013 = 1.98 x 2^9: the floor scale is 2^(9 - 8) = 2, 1013 / 2 = 506 > 448); remedy
#     --mx-scale round-up, verified: the re-run's /blocks rows have no saturated value in any finite block and its
#     final loss is within the tolerance computed here from the bf16 run's own losses (2 sigma of their second
#     differences, docs/fp8.md "The loss tolerance");
#   - nvfp4-outlier (--precision nvfp4): block_outlier on fc1 input rowwise at block (0, 0) (the pressure is feature
#     0 of every row: its 1x16 block's scale is 1013 / 6, and the 15 values of order 1 beside it round to 0); remedy
#     --fp8-keep-bf16 fc1, re-run by fix (fc1 leaves /blocks);
#   - nvfp4-batch-outlier (--precision nvfp4 --nvfp4-no-rht): one record per batch of 64 is 50x the others (a storm
#     day); block_outlier on fc1 input columnwise (the weight gradient's copy, blocked along the batch), not rowwise,
#     and downstream of it on fc2 input columnwise and fc2 grad_output rowwise, every flagged block holding the storm
#     record; the outlier bar recomputed from the null model's formula (docs/fp8.md); remedies drop --nvfp4-no-rht
#     and --fp8-keep-bf16 fc1, each re-run by fix and its verdict recomputed here where the finding was named (fc1's
#     input columnwise copy not flattened, final loss within the tolerance; flattened copies elsewhere reported in
#     same_kind_elsewhere); the transform leaves no input copy flattened;
#   - block_copy_mismatch (fc1's and fc2's input copies in the storm run, the underflow bar derived from the counts)
#     and block_error_dominates (fc1 in the weather-station MXFP8 run), recomputed from the rows and fixed with `fix
#     --finding KIND`: --fp8-keep-bf16 fc1 re-run and its verdict recomputed (fc1 out of /blocks, final loss within
#     the tolerance; fc2's input copies still apart, reported as the same kind elsewhere);
#   - rules not written for these: the mlp sample in mxfp8 (round-up, the default) has no mx_floor_clipping and no
#     block_outlier; the scenarios in bf16 have no block findings (no /blocks rows) and no NaN/Inf;
#   - false alarms: the plain mlp (no outlier planted; 5 steps, seeds 0 and 1) in mxfp8 round-up and floor, nvfp4 and
#     nvfp4 --nvfp4-no-rht has no block finding of any kind, in its report or by the rules recomputed here.
#   block_findings_test.sh AMPSCOPE_BINARY SCRATCH_DIR
set -uo pipefail
ampscope=${1:?usage: block_findings_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
work=${2:?usage: block_findings_test.sh AMPSCOPE_BINARY SCRATCH_DIR}
rm -rf "$work" && mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

run() { "$@" >"$work/out.txt" 2>"$work/err.txt" || { [[ $? == 1 ]] || { fail "'$*' failed"; cat "$work/err.txt" >&2; }; }; }

run "$ampscope" train --scenario mx-floor-clipping --device cpu --seed 0 --precision mxfp8 --out "$work/mx.h5"
run "$ampscope" train --scenario nvfp4-outlier --device cpu --seed 0 --precision nvfp4 --out "$work/nv.h5"
run "$ampscope" train --sample mlp --device cpu --steps 10 --seed 0 --precision mxfp8 --fp8-keep-bf16 fc3 --out "$work/mlp_mx.h5"
run "$ampscope" train --scenario nvfp4-outlier --device cpu --seed 0 --precision bf16 --out "$work/bf16.h5"
# False alarms: the plain mlp (Gaussian-like activations and gradients, no outlier planted) in both MXFP8 scale rules
# and NVFP4 with and without the transform, two seeds, 5 steps each (the head kept in bf16 as the scenarios do).
for seed in 0 1; do
  run "$ampscope" train --sample mlp --device cpu --steps 5 --seed $seed --precision mxfp8 --fp8-keep-bf16 fc3 --out "$work/null_mx_up_$seed.h5"
  run "$ampscope" train --sample mlp --device cpu --steps 5 --seed $seed --precision mxfp8 --mx-scale floor --fp8-keep-bf16 fc3 --out "$work/null_mx_floor_$seed.h5"
  run "$ampscope" train --sample mlp --device cpu --steps 5 --seed $seed --precision nvfp4 --fp8-keep-bf16 fc3 --out "$work/null_nv_$seed.h5"
  run "$ampscope" train --sample mlp --device cpu --steps 5 --seed $seed --precision nvfp4 --nvfp4-no-rht --fp8-keep-bf16 fc3 --out "$work/null_nv_norht_$seed.h5"
done
nulls="null_mx_up_0 null_mx_floor_0 null_nv_0 null_nv_norht_0 null_mx_up_1 null_mx_floor_1 null_nv_1 null_nv_norht_1"
for name in mx nv mlp_mx bf16 $nulls; do
  run "$ampscope" report --json "$work/$name.h5"
  cp "$work/out.txt" "$work/$name.json"
  run "$ampscope" report "$work/$name.h5"
  cp "$work/out.txt" "$work/$name.txt"
done
(cd "$work" && "$ampscope" fix --json mx.h5 >"$work/mx.fix.out" 2>"$work/mx.fix.err") || fail "fix mx.h5 failed: $(cat "$work/mx.fix.err")"
(cd "$work" && "$ampscope" fix --json nv.h5 >"$work/nv.fix.out" 2>"$work/nv.fix.err") || fail "fix nv.h5 failed: $(cat "$work/nv.fix.err")"
# The storm-day mlp under NVFP4 with the transform off: fix exits 1 when no remedy verifies, which the Python below
# checks against its own verdicts.
run "$ampscope" train --scenario nvfp4-batch-outlier --device cpu --seed 0 --precision nvfp4 --nvfp4-no-rht --out "$work/storm.h5"
run "$ampscope" report --json "$work/storm.h5"
cp "$work/out.txt" "$work/storm.json"
(cd "$work" && "$ampscope" fix --json storm.h5 >"$work/storm.fix.out" 2>"$work/storm.fix.err"; echo $? >"$work/storm.fix.rc")
# The other two rules, each fixed with --finding: the storm run's copy mismatch, the weather-station MXFP8 run's
# dominating error. Each writes its own results file (fix --json names it after the trace): copy the first aside.
cp "$work/storm.fix.json" "$work/storm.outlier.fix.json"
(cd "$work" && "$ampscope" fix --json --finding block_copy_mismatch storm.h5 >"$work/storm.mm.out" 2>"$work/storm.mm.err") ||
  fail "fix --finding block_copy_mismatch storm.h5 failed: $(cat "$work/storm.mm.err")"
cp "$work/storm.fix.json" "$work/storm.mismatch.fix.json"
cp "$work/mx.fix.json" "$work/mx.clip.fix.json"
(cd "$work" && "$ampscope" fix --json --finding block_error_dominates mx.h5 >"$work/mx.ed.out" 2>"$work/mx.ed.err") ||
  fail "fix --finding block_error_dominates mx.h5 failed: $(cat "$work/mx.ed.err")"
cp "$work/mx.fix.json" "$work/mx.dominates.fix.json"
cp "$work/mx.clip.fix.json" "$work/mx.fix.json"
cp "$work/storm.outlier.fix.json" "$work/storm.fix.json"

/usr/bin/python3 - "$work" <<'PY' || fail "findings: see above"
import json, math, sys
import h5py

work = sys.argv[1]
bad = []

def rows(path):
    with h5py.File(path, "r") as fh:
        if "blocks" not in fh:
            return []
        strings, data = fh["strings"][()], fh["string_bytes"][()].tobytes()
        name = lambda i: data[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]].decode()
        out = []
        for r in fh["blocks"][()]:
            d = {k: r[k].item() for k in r.dtype.names if k not in ("module", "operand", "copy", "format")}
            d.update(module=name(r["module"]), operand=name(r["operand"]), copy=name(r["copy"]), format=name(r["format"]))
            out.append(d)
        return out

def losses(path):
    with h5py.File(path, "r") as fh:
        return [float(x) for x in fh["steps"]["loss"]]

def findings(name):
    return json.load(open(f"{work}/{name}.json"))["fp8_findings"]

def close(a, b):
    return abs(a - b) <= 1e-12 * max(1.0, abs(b))

# --- The derived bars (docs/fp8.md "Block-scaled diagnoses"), recomputed here from the null model's formula with a
# different quadrature (Gauss-Legendre panels, not the code's Simpson): a block of n iid Gaussian values whose scale
# is set by its amax M; a value under t M rounds to 0 (NVFP4: t = (1 + 2^-4) / 24, E2M1 rounding under 0.25 of an
# element with M at 6 x a scale rounded up by at most 2^-4; MXFP8: t = 2^-10 / 224); NVFP4 gradients are rounded
# stochastically (a value y under one half-element h = 2 t M to 0 with chance 1 - y / h). Given M, the other n - 1
# values are half-normal under M, each lost with chance q(M), so the count X is binomial(n - 1, q(M)).
import numpy as np

def null_tail(n, t, stochastic):
    xg, wg = np.polynomial.legendre.leggauss(64)
    edges = np.linspace(0.0, 12.0, 241)
    m = np.concatenate([(b - a) / 2 * xg + (a + b) / 2 for a, b in zip(edges[:-1], edges[1:])])
    w = np.concatenate([(b - a) / 2 * wg for a, b in zip(edges[:-1], edges[1:])])
    erf = np.vectorize(math.erf)
    F = lambda y: erf(y / math.sqrt(2))
    c = math.sqrt(2 / math.pi)
    dens = n * c * np.exp(-m * m / 2) * F(m) ** (n - 1)  # the amax's density
    if stochastic:
        h = 2 * t * m
        lost = F(h) - c * (1 - np.exp(-h * h / 2)) / h  # the integral of (1 - y / h) f(y) over [0, h]
    else:
        lost = F(t * m)
    q = np.clip(lost / F(m), 1e-300, 1 - 1e-16)
    tail = [1.0]
    for k in range(1, n + 1):
        js = np.arange(k, n)
        if len(js) == 0:
            tail.append(0.0)
            continue
        lc = np.array([math.lgamma(n) - math.lgamma(j + 1) - math.lgamma(n - j) for j in js])
        pmf = np.exp(lc[:, None] + js[:, None] * np.log(q)[None, :] + (n - 1 - js)[:, None] * np.log1p(-q)[None, :])
        tail.append(float(np.sum(w * dens * pmf.sum(axis=0))))
    return tail

tails = {}
def tail_of(fmt, operand):
    if fmt == "mxfp8":
        key = (32, 2 ** -10 / 224, False)
    else:
        key = (256 if operand == "weight" else 16, (1 + 2 ** -4) / 24, operand == "grad_output")
    if key not in tails:
        tails[key] = null_tail(*key)
    return tails[key]

def outlier_bar(fmt, operand, blocks):
    # The smallest count the worst of `blocks` null blocks reaches with chance at most 1e-3 per copy-step.
    tail = tail_of(fmt, operand)
    per_block = 1 - (1 - 1e-3) ** (1 / max(blocks, 1))
    return next((k for k in range(1, len(tail)) if tail[k] <= per_block), len(tail))

def null_loss(fmt, operand):
    tail = tail_of(fmt, operand)
    return sum(tail[1:]) / (len(tail) - 1)

# Anchors worked from the formula above (docs/fp8.md quotes them): NVFP4 1x16 P(X >= 9) = 1.04e-6, so 256 blocks
# reach 9 with chance 2.7e-4 and 8 (P = 1.18e-5) with 3.0e-3: bar 9; 1024 blocks: 10. The mean loss 7.2%.
assert outlier_bar("nvfp4", "input", 256) == 9 and outlier_bar("nvfp4", "input", 1024) == 10
assert abs(null_loss("nvfp4", "input") - 0.0723) < 5e-4

# --- mx-floor-clipping: recompute mx_floor_clipping of fc1 input rowwise from the rows (E4M3's u = 2^-4).
mx = [r for r in rows(f"{work}/mx.h5") if not r["what_if"]]
sel = [r for r in mx if (r["module"], r["operand"], r["copy"]) == ("fc1", "input", "rowwise")]
flag = [r for r in sel if r["saturated"] > 0 and r["blocks_clipped"] > 0 and r["rel_rms_error"] > 2 ** -4]
if len(flag) != len(sel) or not sel:
    bad.append(f"mx: expected every step of fc1 input rowwise clipped past rounding, got {len(flag)} of {len(sel)}")
# The pressure clips in most rows: at least half of each step's 64 rows (feature 0 in [896, 1024) hPa).
for r in sel:
    if r["saturated"] < 32:
        bad.append(f"mx: step {r['step']}: only {r['saturated']} values saturated in fc1's input rows")
f = [x for x in findings("mx") if x["kind"] == "mx_floor_clipping"]
if [(x["module"], x["operand"], x["copy"]) for x in f] != [("fc1", "input", "rowwise")]:
    bad.append(f"mx: mx_floor_clipping findings {[(x['module'], x['operand'], x['copy']) for x in f]}")
else:
    x = f[0]
    want = dict(count=sum(r["saturated"] for r in flag), nonzero=sum(r["nonzero"] for r in flag),
                blocks_clipped=sum(r["blocks_clipped"] for r in flag), steps=len(flag),
                first_step=min(r["step"] for r in flag), last_step=max(r["step"] for r in flag))
    for k, v in want.items():
        if x[k] != v:
            bad.append(f"mx: mx_floor_clipping {k} {x[k]} != {v} (recomputed)")
    if not close(x["error"], max(r["rel_rms_error"] for r in flag)):
        bad.append(f"mx: error {x['error']} != the largest flagged rel_rms_error")
    if [m["command_line"] for m in x["remedies"]] != ["--mx-scale round-up"]:
        bad.append(f"mx: remedies {x['remedies']}")
# Round-up never clips, so no other rule's remedy repeats what the run used; and weights clipped by the floor rule
# within rounding (RMS error under 2^-4) are no finding.
for x in findings("mx"):
    if x["operand"] == "weight":
        bad.append(f"mx: a weight finding {x['kind']} (weights clip within rounding)")

# --- nvfp4-outlier: block_outlier at fc1 input rowwise, block (0, 0), 15 of 16 zeroed.
nv = [r for r in rows(f"{work}/nv.h5") if not r["what_if"]]
sel = [r for r in nv if (r["module"], r["operand"], r["copy"]) == ("fc1", "input", "rowwise")]
range_bound = math.log2(6 / 0.25)  # E2M1: largest 6, values under half the smallest non-zero (0.5) round to 0
flag = [r for r in sel if r["max_block_range"] > range_bound and r["underflow"] / r["nonzero"] > 0.02
        and r["worst_block_underflow"] >= outlier_bar("nvfp4", "input", r["blocks"])]
f = [x for x in findings("nv") if x["kind"] == "block_outlier"]
if [(x["module"], x["operand"], x["copy"]) for x in f] != [("fc1", "input", "rowwise")]:
    bad.append(f"nv: block_outlier findings {[(x['module'], x['operand'], x['copy']) for x in f]}")
elif len(flag) != len(sel):
    bad.append(f"nv: expected every step flagged, {len(flag)} of {len(sel)}")
else:
    x = f[0]
    best = max(flag, key=lambda r: (r["worst_block_underflow"], -r["step"]))
    want = dict(count=sum(r["underflow"] for r in flag), nonzero=sum(r["nonzero"] for r in flag),
                block_zeroed=best["worst_block_underflow"], block_row=best["worst_block_row"],
                block_col=best["worst_block_col"], block_step=best["step"], block_values=16,
                block_bar=outlier_bar("nvfp4", "input", best["blocks"]))
    for k, v in want.items():
        if x[k] != v:
            bad.append(f"nv: block_outlier {k} {x[k]} != {v} (recomputed)")
    # By hand: the pressure is feature 0, so the flattened block starts at column 0 and keeps only the pressure.
    if x["block_col"] != 0 or x["block_zeroed"] != 15:
        bad.append(f"nv: the flattened block is at col {x['block_col']} with {x['block_zeroed']} zeroed, expected col 0, 15")
    if not close(x["range_bound"], range_bound):
        bad.append(f"nv: range bound {x['range_bound']} != log2(24)")
    cmds = [m["command_line"] for m in x["remedies"]]
    if cmds != ["--fp8-keep-bf16 fc1"]:  # rowwise: no Hadamard transform there; the run keeps fc3 only
        bad.append(f"nv: remedies {cmds}")

# --- rules on runs they were not written for.
kinds = {x["kind"] for x in findings("mlp_mx")}
if kinds & {"mx_floor_clipping", "block_outlier"}:
    bad.append(f"mlp in mxfp8 (round-up): findings {kinds}")
if any(x["kind"].startswith("block_") or x["kind"] == "mx_floor_clipping" for x in findings("bf16")):
    bad.append("the scenario in bf16 has block findings")
if json.load(open(f"{work}/bf16.json"))["anomalies"]:
    bad.append("the scenario in bf16 has NaN/Inf anomalies")

# --- ampscope fix: each remedy re-run; the re-runs' rows read here.
def tolerance(bf16_losses):
    l = bf16_losses[-5:]
    d2 = [l[i] - 2 * l[i - 1] + l[i - 2] for i in range(2, len(l))]
    return 2 * math.sqrt(sum(x * x for x in d2) / len(d2) / 6) / abs(bf16_losses[-1])

for name, kind, remedy in (("mx", "mx_floor_clipping", "--mx-scale round-up"), ("nv", "block_outlier", "--fp8-keep-bf16 fc1")):
    doc = json.load(open(f"{work}/{name}.fix.json"))
    if doc["cause"] != f"fp8:{kind}" or not doc["reproduced"]:
        bad.append(f"{name} fix: cause {doc['cause']}, reproduced {doc['reproduced']}")
        continue
    runs = {r["name"]: r for r in doc["runs"]}
    bf16 = losses(f"{work}/{runs['bf16']['trace']}")
    tol = tolerance(bf16)
    if not close(doc["loss_tolerance_vs_bf16"], tol):
        bad.append(f"{name} fix: tolerance {doc['loss_tolerance_vs_bf16']} != {tol} (from the bf16 run's losses)")
    r = [r for r in doc["runs"] if r["remedy_flag"] == remedy]
    if len(r) != 1:
        bad.append(f"{name} fix: no run of {remedy}")
        continue
    r = r[0]
    rerun = [x for x in rows(f"{work}/{r['trace']}") if not x["what_if"]]
    rel = (losses(f"{work}/{r['trace']}")[-1] - bf16[-1]) / abs(bf16[-1])
    if kind == "mx_floor_clipping":
        gone = rerun and all(x["saturated"] == 0 or x["rel_rms_error"] <= 2 ** -4 for x in rerun)
    else:
        gone = not any(x["module"] == "fc1" for x in rerun) and any(x["module"] == "fc2" for x in rerun)
    if r["finding_gone"] != bool(gone and abs(rel) <= tol) or r["verified"] != r["finding_gone"]:
        bad.append(f"{name} fix: {remedy}: gone {r['finding_gone']} verified {r['verified']}, recomputed: finding "
                   f"gone {gone}, loss vs bf16 {rel:+.4f} within {tol:.4f}: {abs(rel) <= tol}")
    if not gone:
        bad.append(f"{name} fix: {remedy} left the finding's cause in the re-run's rows")
    print(f"{name}: {remedy}: loss vs bf16 {rel:+.4f}, tolerance {tol:.4f}, verified {r['verified']}")

# --- nvfp4-batch-outlier with --nvfp4-no-rht: the rule recomputed on every copy (the widest block past the
# element's range, more than 2% of the copy to 0, the worst block at or over the outlier bar of its format, operand
# and block count, computed above), here and on fix's re-runs.
def element_range(fmt):
    return range_bound if fmt == "nvfp4" else math.log2(448 / 2 ** -10)  # E4M3: largest 448, under 2^-10 to 0

def outlier_rows(rs):
    return [r for r in rs if not r["what_if"] and r["worst_block"] >= 0 and r["nonzero"] > 0
            and r["max_block_range"] > element_range(r["format"]) and r["underflow"] / r["nonzero"] > 0.02
            and r["worst_block_underflow"] >= outlier_bar(r["format"], r["operand"], r["blocks"])]

def outlier_copies(rs):
    return {(r["module"], r["operand"], r["copy"]) for r in outlier_rows(rs)}

storm = [r for r in rows(f"{work}/storm.h5") if not r["what_if"]]
want_copies = outlier_copies(storm)
got = [x for x in findings("storm") if x["kind"] == "block_outlier"]
if {(x["module"], x["operand"], x["copy"]) for x in got} != want_copies:
    bad.append(f"storm: block_outlier on {[(x['module'], x['operand'], x['copy']) for x in got]}, recomputed {sorted(want_copies)}")
# The storm record is a whole row of the batch: along the features (rowwise) it is no outlier; along the batch
# (the weight gradient's copy) it is.
if ("fc1", "input", "columnwise") not in want_copies or ("fc1", "input", "rowwise") in want_copies:
    bad.append(f"storm: recomputed outlier copies {sorted(want_copies)}: expected fc1 input columnwise, not rowwise")
# The storm record also passes through fc1 and its ReLU 50x larger than the calm ones: fc2's input columnwise copy
# (blocked along the batch, 1024 blocks: bar 10 of 16) loses 11 to 14 of 16 in the block beside it at every step,
# and its own gradient row, fc2's grad_output rowwise, holds a few hidden units dominating it (12 to 14 of 16 at
# steps 1, 2, 5-8). The measured bar this test used before (more than 12 of 16) missed most of these steps; the
# derived one reports them. They are the planted record's, not noise: every flagged step's worst block holds the
# storm record (its index in the batch is (37 step + 5) mod 64, samples/scenarios.cpp), and no rowwise input copy
# and no copy of fc1's gradient is flagged.
storm_at = lambda step: (37 * step + 5) % 64
for r in outlier_rows(storm):
    holds = (r["worst_block_col"] // 16 == storm_at(r["step"]) // 16 if r["copy"] == "columnwise" and r["operand"] == "input"
             else r["worst_block_row"] == storm_at(r["step"]) if r["copy"] == "rowwise" and r["operand"] == "grad_output"
             else False)
    if not holds:
        bad.append(f"storm: step {r['step']} {r['module']} {r['operand']} {r['copy']}: flagged block at row "
                   f"{r['worst_block_row']}, col {r['worst_block_col']} does not hold the storm record {storm_at(r['step'])}")
if want_copies != {("fc1", "input", "columnwise"), ("fc2", "input", "columnwise"), ("fc2", "grad_output", "rowwise")}:
    bad.append(f"storm: recomputed outlier copies {sorted(want_copies)}: expected fc1 and fc2 input columnwise, fc2 "
               "grad_output rowwise")
for x in got:
    place = (x["module"], x["operand"], x["copy"])
    flag = [r for r in outlier_rows(storm) if (r["module"], r["operand"], r["copy"]) == place]
    if (x["count"], x["nonzero"], x["steps"]) != (sum(r["underflow"] for r in flag), sum(r["nonzero"] for r in flag), len(flag)):
        bad.append(f"storm: {place}: count/nonzero/steps {x['count']}/{x['nonzero']}/{x['steps']} differ from the rows'")
    cmds = [m["command_line"] for m in x["remedies"]]
    # The transform runs on the wgrad operands only (columnwise input and gradient copies), off in this run.
    want_cmds = (["drop --nvfp4-no-rht"] if x["copy"] == "columnwise" else []) + [f"--fp8-keep-bf16 {x['module']}"]
    if cmds != want_cmds:
        bad.append(f"storm: {place}: remedies {cmds}, expected {want_cmds}")
    print(f"storm: {' '.join(place)}: {x['count']} of {x['nonzero']} to 0, block at row {x['block_row']}, col "
          f"{x['block_col']} lost {x['block_zeroed']} of 16 (bar {x['block_bar']})")

doc = json.load(open(f"{work}/storm.fix.json"))
bf16 = losses(f"{work}/{[r for r in doc['runs'] if r['name'] == 'bf16'][0]['trace']}")
tol = tolerance(bf16)
if doc["cause"] != "fp8:block_outlier" or not doc["reproduced"] or not close(doc["loss_tolerance_vs_bf16"], tol):
    bad.append(f"storm fix: cause {doc['cause']}, reproduced {doc['reproduced']}, tolerance {doc['loss_tolerance_vs_bf16']} vs {tol}")
# fix judges the finding where it was named (docs/fp8.md "Judged where it was named"): fc1's input columnwise copy
# (nvfp4); a re-run's flattened block on another copy is reported as the same kind elsewhere, not as the original.
named = ("fc1", "input", "columnwise")
ff = doc["first_finding"]
if (ff["module"], ff["op"], ff["copy"], ff["format"], ff["place"]) != named + ("nvfp4", "fc1 input columnwise (nvfp4)"):
    bad.append(f"storm fix: first_finding {ff}, expected {named} (nvfp4)")
any_verified = False
for r in doc["runs"]:
    if not r["remedy_flag"]:
        continue
    rerun = rows(f"{work}/{r['trace']}")
    left = outlier_copies(rerun)
    rel = (losses(f"{work}/{r['trace']}")[-1] - bf16[-1]) / abs(bf16[-1])
    verdict = named not in left and abs(rel) <= tol
    any_verified |= verdict
    if r["finding_gone"] != verdict or r["verified"] != verdict or not r["applied"]:
        bad.append(f"storm fix: {r['remedy_flag']}: gone {r['finding_gone']} verified {r['verified']} applied "
                   f"{r['applied']}; recomputed: outlier copies left {sorted(left)}, loss vs bf16 {rel:+.4f} within {tol:.4f}")
    if (r["first_finding"] == "none") != (named not in left):
        bad.append(f"storm fix: {r['remedy_flag']}: first_finding {r['first_finding']!r}, recomputed: named copy left {named in left}")
    elsewhere = left - {named}
    got_else = r["same_kind_elsewhere"]
    if (got_else is None) != (not elsewhere) or (got_else is not None and not any(
            got_else.endswith(f"{m} {o} {c} (nvfp4)") for m, o, c in elsewhere)):
        bad.append(f"storm fix: {r['remedy_flag']}: same_kind_elsewhere {got_else!r}, recomputed {sorted(elsewhere)}")
    if r["remedy_flag"] == "drop --nvfp4-no-rht":
        # The transform spreads the storm record over 16 records of the batch: no input copy keeps a flattened block.
        if any(c[1] == "input" and c[2] == "columnwise" for c in left):
            bad.append(f"storm fix: with the transform, input copies still flattened: {sorted(left)}")
    print(f"storm: {r['remedy_flag']}: loss vs bf16 {rel:+.4f}, tolerance {tol:.4f}, outlier copies left "
          f"{sorted(left)}, verified {r['verified']}")
rc = int(open(f"{work}/storm.fix.rc").read())
if rc != (0 if any_verified else 1):
    bad.append(f"storm fix: exit status {rc}, recomputed: some remedy verified {any_verified}")

# --- block_copy_mismatch on the storm run, recomputed: a Linear's input or weight whose rowwise and columnwise
# copies differ in one step by more than u (E2M1 2^-2, E4M3 2^-4) in RMS error or in underflow fraction by more than
# the underflow bar: 3.29 standard errors of the gap of two binomial fractions at the pooled rate (z for 1e-3
# two-sided), never under the share a null copy of the format's 1-D block loses (null_loss above: NVFP4 7.2%).
def mismatched(rs):
    by = {}
    for r in rs:
        if not r["what_if"] and r["operand"] != "grad_output" and r["nonzero"] > 0:
            by[(r["module"], r["operand"], r["format"], r["step"], r["copy"])] = r
    out = set()
    for (m, op, fmt, step, copy), r in by.items():
        c = by.get((m, op, fmt, step, "columnwise"))
        if copy != "rowwise" or c is None:
            continue
        u = 2 ** -2 if fmt == "nvfp4" else 2 ** -4
        de = abs(c["rel_rms_error"] - r["rel_rms_error"])
        du = abs(c["underflow"] / c["nonzero"] - r["underflow"] / r["nonzero"])
        p = (r["underflow"] + c["underflow"]) / (r["nonzero"] + c["nonzero"])
        se = math.sqrt(p * (1 - p) * (1 / r["nonzero"] + 1 / c["nonzero"]))
        bar = max(null_loss(fmt, "input"), 3.2905267314918945 * se)
        if de > u or du > bar:
            out.add((m, op))
    return out

want = mismatched(storm)
got = {(x["module"], x["operand"]) for x in findings("storm") if x["kind"] == "block_copy_mismatch"}
# fc1's input (the storm record's columnwise blocks lose 23% against the rowwise copy's 6%) and, under the derived
# bar, fc2's: the record passes through fc1 50x larger, and fc2's columnwise input copy (14% to 0, its flattened
# blocks above) loses 7 to 9 points more than its rowwise one (5.5%), over the floor of 7.2% the null loses (the
# counts alone put the bar at 1.5 points); the 10-point bar this test used before missed it.
if got != want or want != {("fc1", "input"), ("fc2", "input")}:
    bad.append(f"storm: block_copy_mismatch on {sorted(got)}, recomputed {sorted(want)} (expected fc1 and fc2 input)")

# --- block_error_dominates on the weather-station MXFP8 run, recomputed: per Linear, its copy with the largest mean
# relative RMS error in units of u; the Linear with the largest, if above 1.
ratios = {}
for (m, op, cp, fmt) in {(r["module"], r["operand"], r["copy"], r["format"]) for r in mx}:
    e = [r["rel_rms_error"] for r in mx if (r["module"], r["operand"], r["copy"], r["format"]) == (m, op, cp, fmt)]
    ratios[m] = max(ratios.get(m, -1), sum(e) / len(e) / (2 ** -4 if fmt == "mxfp8" else 2 ** -2))
top = max(ratios, key=ratios.get)
got = [x for x in findings("mx") if x["kind"] == "block_error_dominates"]
if ratios[top] <= 1 or [x["module"] for x in got] != [top]:
    bad.append(f"mx: block_error_dominates on {[x['module'] for x in got]}, recomputed {top} at {ratios[top]:.3f} u")
elif [m["command_line"] for m in got[0]["remedies"]] != [f"--fp8-keep-bf16 {top}"]:
    bad.append(f"mx: block_error_dominates remedies {got[0]['remedies']}")

# --- fix re-runs of both: keep the Linear in bf16. Verified when the re-run has no finding of the kind (recomputed:
# no mismatched copies; for block_error_dominates the remedy applied, the Linear gone from /blocks) and its final
# loss is within the tolerance of the bf16 run's.
for name, kind, trace, remedy in (("storm.mismatch", "block_copy_mismatch", "storm", "--fp8-keep-bf16 fc1"),
                                  ("mx.dominates", "block_error_dominates", "mx", f"--fp8-keep-bf16 {top}")):
    doc = json.load(open(f"{work}/{name}.fix.json"))
    if doc["cause"] != f"fp8:{kind}" or not doc["reproduced"]:
        bad.append(f"{name} fix: cause {doc['cause']}, reproduced {doc['reproduced']}")
        continue
    bf16 = losses(f"{work}/{[r for r in doc['runs'] if r['name'] == 'bf16'][0]['trace']}")
    tol = tolerance(bf16)
    if not close(doc["loss_tolerance_vs_bf16"], tol):
        bad.append(f"{name} fix: tolerance {doc['loss_tolerance_vs_bf16']} != {tol}")
    r = [r for r in doc["runs"] if r["remedy_flag"] == remedy]
    if len(r) != 1:
        bad.append(f"{name} fix: no run of {remedy}")
        continue
    r = r[0]
    rerun = rows(f"{work}/{r['trace']}")
    module = remedy.split()[-1]
    rel = (losses(f"{work}/{r['trace']}")[-1] - bf16[-1]) / abs(bf16[-1])
    kept = not any(x["module"] == module for x in rerun) and any(not x["what_if"] for x in rerun)
    # Judged where it was named (the Linear's input copies; for block_error_dominates the Linear): out of /blocks.
    gone = kept and (kind == "block_error_dominates" or (module, "input") not in mismatched(rerun))
    verdict = gone and abs(rel) <= tol
    if r["finding_gone"] != verdict or r["verified"] != verdict or not verdict:
        bad.append(f"{name} fix: {remedy}: gone {r['finding_gone']} verified {r['verified']}; recomputed: {module} "
                   f"out of /blocks {kept}, finding gone {gone}, loss vs bf16 {rel:+.4f} within {tol:.4f}")
    if kind == "block_copy_mismatch":
        # fc2's input copies stay apart without fc1 (the storm record still reaches fc2): the same kind elsewhere,
        # reported as such and not counted as the original remaining.
        elsewhere = mismatched(rerun) - {(module, "input")}
        got_else = r["same_kind_elsewhere"]
        if (got_else is None) != (not elsewhere) or (got_else is not None and not any(
                got_else.endswith(f"{m} {o} copies (nvfp4)") for m, o in elsewhere)):
            bad.append(f"{name} fix: same_kind_elsewhere {got_else!r}, recomputed {sorted(elsewhere)}")
    print(f"{name}: {remedy}: loss vs bf16 {rel:+.4f}, tolerance {tol:.4f}, verified {r['verified']}, elsewhere "
          f"{r.get('same_kind_elsewhere')}")

# --- False alarms: the plain mlp in MXFP8 (round-up and floor) and NVFP4 (with and without the transform) has no
# block finding in its report, and none by the rules recomputed here; its NVFP4 copies do lose values (worst blocks
# of 4 to 8 of 16, 22 to 25 of a 256-value weight tile), so the bars are met by real rows, not by empty ones.
block_kinds = {"mx_floor_clipping", "block_outlier", "block_copy_mismatch", "block_error_dominates"}
for seed in (0, 1):
    for cfg in ("mx_up", "mx_floor", "nv", "nv_norht"):
        name = f"null_{cfg}_{seed}"
        rs = [r for r in rows(f"{work}/{name}.h5") if not r["what_if"]]
        got = [(x["kind"], x["module"], x["operand"], x.get("copy")) for x in findings(name) if x["kind"] in block_kinds]
        if not rs or got or outlier_copies(rs) or mismatched(rs):
            bad.append(f"{name}: {len(rs)} rows, block findings {got}, recomputed outliers {sorted(outlier_copies(rs))}, "
                       f"mismatches {sorted(mismatched(rs))}")
        if cfg.startswith("nv") and not max(r["worst_block_underflow"] for r in rs if r["operand"] != "weight") >= 4:
            bad.append(f"{name}: no 1x16 block lost 4 values: the run is not what this check assumes")

for line in bad:
    print(line)
sys.exit(1 if bad else 0)
PY

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "block_findings: all passed"
