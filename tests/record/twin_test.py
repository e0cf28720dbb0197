#!/usr/bin/python3
# `ampscope record --twin` (python/ampscope/torch/_twin.py): the /precision rows of a recorded PyTorch run.
#  1. A bf16 linear, softmax and layer norm (scripts/twin_ops.py saves its input, parameters and outputs): each
#     row's local and accumulated errors equal errors computed here, in f64, from references made with plain
#     torch f64 ops and the error measures of probes/twin.h written out element by element (no code shared with
#     the recorder).
#  1c. Nodes whose backward reads their output or the forward's statistics (layer_norm, tanh, sigmoid, exp,
#     softmax, log_softmax; scripts/twin_backward_ops.py saves each node's gradients): each backward row equals
#     errors against f64 gradients from each op's derivative written out here.
#  2. One definition: the recorder's compare() and the runtime's probe::compare() (run by the twin_compare
#     program) give the same numbers on the same values: the recorded ops' outputs against their f32
#     recomputation, and made-up edge cases (flips, saturation, subnormal and non-finite references); and our
#     runtime's probe::Twin on the same forward and bf16 values (twin_compare --ops) gives the same rows.
#  3. A script whose bf16 running total swamps its terms (scripts/bf16_running_sum.py): `ampscope report` of
#     the --twin trace names the op and module in PRECISION; without --twin PRECISION says it was not recorded.
#  4. The Python API (ampscope.torch.record(..., twin=True)) writes the same rows as `ampscope record --twin`.
# Usage: twin_test.py AMPSCOPE TWIN_COMPARE WORK_DIR. Exit 77 (skipped) when this Python has no torch or h5py.
import json
import math
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # importing harness leaves no __pycache__ in the source tree
from harness import HERE, SCRIPTS, arguments, check, finish, require  # noqa: E402

h5py, np, torch = require("h5py", "numpy", "torch")
AMPSCOPE, TWIN_COMPARE, WORK = arguments("AMPSCOPE", "TWIN_COMPARE", "WORK_DIR")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
from ampscope.torch._twin import compare as recorder_compare  # noqa: E402

os.makedirs(WORK, exist_ok=True)


def record(name, script, *args, twin=True):
    out = os.path.join(WORK, name + ".h5")
    if os.path.exists(out):
        os.remove(out)
    cmd = [AMPSCOPE, "record", "--out", out] + (["--twin"] if twin else []) + ["--", sys.executable,
                                                                             os.path.join(SCRIPTS, script), *args]
    return subprocess.run(cmd, capture_output=True, text=True), out


def precision_rows(path):
    with h5py.File(path, "r") as f:
        strings, raw = f["strings"][()], f["string_bytes"][()]

        def text(i):
            return bytes(raw[strings[i]["offset"]:strings[i]["offset"] + strings[i]["length"]]).decode()

        p = f["precision"][()]
        rows = []
        for r in p:
            d = {k: r[k] for k in p.dtype.names}
            for k in ("op", "module", "out_dtype", "phase"):
                d[k] = text(d[k])
            rows.append(d)
    return rows


# ---- the error measures of probes/twin.h, element by element, in f64 (written from its comment) ----
FORMATS = {"f16": (11, -14, 65504.0), "bf16": (8, -126, 3.3895313892515355e38), "f32": (24, -126, 3.4028234663852886e38)}


def errors_f64(y, r, dtype, op=""):
    p, emin, top = FORMATS[dtype]
    y = [float(v) for v in np.asarray(y, dtype=np.float64).ravel()]
    r = [float(v) for v in np.asarray(r, dtype=np.float64).ravel()]
    finite_r = [abs(v) for v in r if math.isfinite(v)]
    floor = max(2.0 ** emin, (max(finite_r) if finite_r else 0.0) * 2.0 ** -p)
    out = {"counted": 0, "max_rel": 0.0, "sum": 0.0, "max_ulp": 0.0, "flips": 0, "exact": 0, "bins": [0] * 26}
    for yi, ri in zip(y, r):
        if not math.isfinite(ri):
            continue
        if not math.isfinite(yi):
            out["flips"] += 1
            continue
        flip = (yi == 0 and ri != 0) or (abs(yi) == top and abs(ri) < top) or \
            (op in ("sigmoid", "tanh") and abs(yi) == 1 and abs(ri) != 1)
        err = abs(yi - ri)
        rel = err / max(abs(ri), floor)
        if flip:
            out["flips"] += 1
        elif rel == 0:
            out["exact"] += 1
        else:
            out["bins"][min(max(int(math.floor(-math.log2(rel))), 0), 25)] += 1
        e = emin if ri == 0 else max(math.frexp(ri)[1] - 1, emin)
        out["max_ulp"] = max(out["max_ulp"], err / 2.0 ** (e - (p - 1)))
        out["max_rel"] = max(out["max_rel"], rel)
        out["sum"] += rel
        out["counted"] += 1
    out["mean_rel"] = out["sum"] / out["counted"] if out["counted"] else 0.0
    out["bits"] = p if out["max_rel"] == 0 else min(max(-math.log2(out["max_rel"]), 0.0), p)
    return out


def near(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b)) or abs(a - b) < 1e-300


# ---- 1. linear, softmax, layer norm against f64 ----
saved = os.path.join(WORK, "twin_ops.pt")
proc, out = record("twin_ops", "twin_ops.py", saved)
check(proc.returncode == 0, "twin_ops: exit status %d: %s" % (proc.returncode, proc.stderr[-400:]))
check("the backward of" not in proc.stderr, "twin_ops: a backward is noted as not recorded: %s" % proc.stderr[-600:])
rows = precision_rows(out)
T = torch.load(saved)
d = {k: v.to(torch.float64) for k, v in T.items()}
h_ref = d["x"] @ d["w"].t() + d["b"]  # the script's x and parameters are bf16 data: local = accumulated
hs_ref = 4 * h_ref
p_ref = torch.softmax(hs_ref, dim=-1)


def ln(v):
    mu = v.mean(-1, keepdim=True)
    var = ((v - mu) ** 2).mean(-1, keepdim=True)
    return (v - mu) / torch.sqrt(var + 1e-5) * d["gamma"] + d["beta"]


want = {
    ("linear", "fc"): (T["h"], h_ref, h_ref, None),
    ("softmax", ""): (T["p"], torch.softmax(d["hs"], dim=-1), p_ref, (T["hs"], hs_ref)),
    ("layer_norm", "norm"): (T["y"], ln(d["p"]), ln(p_ref), (T["p"], p_ref)),
}
# The f32 reference the twin uses differs from f64's by about 2^-24 relative: errors of bf16 values (2^-9 and
# more) agree to about 2^-15 relative; a histogram may move an element across a bucket boundary.
TOL = 2e-3
for (op, module), (y, local_ref, acc_ref, inp) in want.items():
    found = [r for r in rows if r["op"] == op and r["module"] == module and r["step"] == 0 and r["phase"] == "forward"]
    check(len(found) == 1, "%s in '%s': %d rows, want 1" % (op, module, len(found)))
    if not found:
        continue
    r = found[0]
    check(r["out_dtype"] == "bf16" and bool(r["local"]) and int(r["numel"]) == y.numel() and r["phase"] == "forward",
          "%s: out_dtype %s local %s numel %d" % (op, r["out_dtype"], r["local"], r["numel"]))
    loc = errors_f64(y.float(), local_ref, "bf16", op)
    acc = errors_f64(y.float(), acc_ref, "bf16", op)
    for field, ref in (("local_max_rel", loc["max_rel"]), ("local_mean_rel", loc["mean_rel"]),
                       ("local_max_ulp", loc["max_ulp"]), ("acc_max_rel", acc["max_rel"]),
                       ("acc_mean_rel", acc["mean_rel"]), ("acc_max_ulp", acc["max_ulp"])):
        check(ref > 0 and near(float(r[field]), ref, TOL), "%s: %s %r, f64 reference %r" % (op, field, r[field], ref))
    check(abs(float(r["bits"]) - acc["bits"]) < 0.01, "%s: bits %r, f64 %r" % (op, r["bits"], acc["bits"]))
    check(int(r["flips"]) == acc["flips"], "%s: flips %d, f64 %d" % (op, r["flips"], acc["flips"]))
    bins = [int(v) for v in r["error_bins"]]
    check(sum(bins) + int(r["exact"]) + int(r["flips"]) == acc["counted"] + 0 * acc["flips"],
          "%s: histogram counts %d elements, want %d" % (op, sum(bins) + int(r["exact"]) + int(r["flips"]),
                                                         acc["counted"]))
    moved = sum(abs(a - b) for a, b in zip(bins, acc["bins"]))
    check(moved <= max(2, y.numel() // 50), "%s: histogram %s, f64 %s" % (op, bins, acc["bins"]))
    if inp is None:
        check(float(r["in_acc_max_rel"]) == 0, "%s: in_acc_max_rel %r for script data" % (op, r["in_acc_max_rel"]))
    else:
        e = errors_f64(inp[0].float(), inp[1], "bf16")
        check(near(float(r["in_acc_max_rel"]), e["max_rel"], TOL) and near(float(r["in_acc_mean_rel"]), e["mean_rel"], TOL),
              "%s: inputs' error %r/%r, f64 %r/%r" % (op, r["in_acc_max_rel"], r["in_acc_mean_rel"], e["max_rel"],
                                                    e["mean_rel"]))
    check(bool(r["followed"]), "%s: followed is false" % op)
# The linear's node (backward): its weight's and bias's gradients (x wants none) against f64 from the incoming
# gradient the script saved: the largest max and mean over the two, counts summed (probes/twin.h, backward).
bw = [r for r in rows if r["phase"] == "backward" and r["op"] == "linear"]
check(len(bw) == 1, "linear's backward rows: %d, want 1" % len(bw))
if bw:
    r = bw[0]
    g = d["dh"]
    parts = [errors_f64(T["dw"].float(), g.t() @ d["x"], "bf16"), errors_f64(T["db"].float(), g.sum(0), "bf16")]
    check(r["module"] == "fc" and r["out_dtype"] == "bf16" and bool(r["local"]) and int(r["numel"]) == 16 * 32 + 16,
          "linear backward: module %s dtype %s numel %d" % (r["module"], r["out_dtype"], r["numel"]))
    for field, ref in (("local_max_rel", max(e["max_rel"] for e in parts)),
                       ("local_mean_rel", max(e["mean_rel"] for e in parts)),
                       ("local_max_ulp", max(e["max_ulp"] for e in parts))):
        check(ref > 0 and near(float(r[field]), ref, TOL), "linear backward: %s %r, f64 %r" % (field, r[field], ref))
    check(int(r["flips"]) == sum(e["flips"] for e in parts), "linear backward: flips %d" % r["flips"])
    check(float(r["acc_mean_rel"]) == 0 and math.isnan(float(r["cond"])), "linear backward: acc %r cond %r" % (
        r["acc_mean_rel"], r["cond"]))
    bins = [int(v) for v in r["error_bins"]]
    check(sum(bins) + int(r["exact"]) + int(r["flips"]) == 16 * 32 + 16, "linear backward: histogram %s" % bins)
# x * 4's node: its gradient is the incoming one times 4, exact in bf16.
mb = [r for r in rows if r["phase"] == "backward" and r["op"] == "mul"]
check(len(mb) == 1 and float(mb[0]["local_max_rel"]) == 0 and int(mb[0]["exact"]) > 0,
      "mul backward: %r" % [(r["local_max_rel"], r["exact"]) for r in mb])
check(len([r for r in rows if r["phase"] == "backward" and r["op"] in ("softmax", "layer_norm")]) == 2,
      "softmax's and layer_norm's nodes: %d backward rows, want 2" % len(
          [r for r in rows if r["phase"] == "backward" and r["op"] in ("softmax", "layer_norm")]))
# softmax's accumulated error is not its local one: the twin followed linear's and mul's f32 values.
sm = [r for r in rows if r["op"] == "softmax"]
if sm:
    check(float(sm[0]["acc_mean_rel"]) > float(sm[0]["local_mean_rel"]) * 1.2,
          "softmax: accumulated %r not above local %r" % (sm[0]["acc_mean_rel"], sm[0]["local_mean_rel"]))

# ---- 1c. the backward of nodes that read their output or the forward's statistics (scripts/twin_backward_ops.py):
# each node's gradients (saved by the script: each op's input feeds that op alone) against the f32 forward and
# backward on the node's inputs, here in f64 from the formulas of each op's derivative written out.
saved_bw = os.path.join(WORK, "twin_backward_ops.pt")
proc, out = record("twin_backward_ops", "twin_backward_ops.py", saved_bw)
check(proc.returncode == 0, "twin_backward_ops: exit status %d: %s" % (proc.returncode, proc.stderr[-400:]))
check("the backward of" not in proc.stderr, "twin_backward_ops: a backward noted as not recorded: %s" %
      proc.stderr[-600:])
rows_bw = precision_rows(out)
B = torch.load(saved_bw)
D = {k: v.to(torch.float64) for k, v in B.items()}


def layer_norm_grads(x, g, gamma, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    xhat = (x - mu) * rstd
    dxhat = g * gamma
    dx = rstd * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    return dx, (g * xhat).sum(0), g.sum(0)


sm_u = torch.softmax(D["u"], dim=-1)
sm_v = torch.softmax(D["v"], dim=-1)
sig = 1 / (1 + torch.exp(-D["b"]))
ln_ref = layer_norm_grads(D["x"], D["dn"], D["gamma"])
# op -> [(the node's gradient, its f64 reference)]
backward_want = {
    "layer_norm": [(B["dx"], ln_ref[0]), (B["dgamma"], ln_ref[1]), (B["dbeta"], ln_ref[2])],
    "tanh": [(B["da"], D["dt"] * (1 - torch.tanh(D["a"]) ** 2))],
    "sigmoid": [(B["db"], D["ds"] * sig * (1 - sig))],
    "exp": [(B["dc"], D["de"] * torch.exp(D["c"]))],
    "softmax": [(B["du"], sm_u * (D["dp"] - (D["dp"] * sm_u).sum(-1, keepdim=True)))],
    "log_softmax": [(B["dv"], D["dq"] - sm_v * D["dq"].sum(-1, keepdim=True))],
}
for op, pairs in backward_want.items():
    found = [r for r in rows_bw if r["op"] == op and r["phase"] == "backward"]
    check(len(found) == 1, "backward of %s: %d rows, want 1" % (op, len(found)))
    if not found:
        continue
    r = found[0]
    parts = [errors_f64(y.float(), ref, "bf16") for y, ref in pairs]
    numel = sum(y.numel() for y, _ in pairs)
    check(r["out_dtype"] == "bf16" and bool(r["local"]) and int(r["numel"]) == numel and
          r["module"] == ("norm" if op == "layer_norm" else ""),
          "backward of %s: module '%s' dtype %s numel %d, want %d" % (op, r["module"], r["out_dtype"], r["numel"],
                                                                    numel))
    for field, ref in (("local_max_rel", max(e["max_rel"] for e in parts)),
                       ("local_mean_rel", max(e["mean_rel"] for e in parts)),
                       ("local_max_ulp", max(e["max_ulp"] for e in parts))):
        check(ref > 0 and near(float(r[field]), ref, TOL), "backward of %s: %s %r, f64 %r" % (op, field, r[field], ref))
    check(int(r["flips"]) == sum(e["flips"] for e in parts), "backward of %s: flips %d, f64 %d" % (
        op, r["flips"], sum(e["flips"] for e in parts)))
    bins = [int(v) for v in r["error_bins"]]
    want_bins = [sum(e["bins"][i] for e in parts) for i in range(26)]
    check(sum(bins) + int(r["exact"]) + int(r["flips"]) == numel, "backward of %s: histogram counts %d, want %d" % (
        op, sum(bins) + int(r["exact"]) + int(r["flips"]), numel))
    moved = sum(abs(a - b) for a, b in zip(bins, want_bins))
    check(moved <= max(2, numel // 50), "backward of %s: histogram %s, f64 %s" % (op, bins, want_bins))

# ---- 1b. under CPU autocast: the linear's inputs are autocast's casts of f32 tensors, which the twin reads ----
saved_ac = os.path.join(WORK, "twin_ops_autocast.pt")
proc, out = record("twin_ops_autocast", "twin_ops.py", saved_ac, "--autocast")
check(proc.returncode == 0, "twin_ops --autocast: exit status %d: %s" % (proc.returncode, proc.stderr[-400:]))
rows_ac = precision_rows(out)
A = torch.load(saved_ac)
lin = [r for r in rows_ac if r["op"] == "linear" and r["phase"] == "forward"]
check(len(lin) == 1 and A["h"].dtype == torch.bfloat16, "autocast: %d linear rows, output %s" % (len(lin),
                                                                                              A["h"].dtype))
if lin:
    r = lin[0]
    wide = {k: A[k].to(torch.float64) for k in ("x", "w", "b")}
    cast = {k: A[k].to(torch.bfloat16).to(torch.float64) for k in ("x", "w", "b")}
    loc = errors_f64(A["h"].float(), cast["x"] @ cast["w"].t() + cast["b"], "bf16")
    acc = errors_f64(A["h"].float(), wide["x"] @ wide["w"].t() + wide["b"], "bf16")
    ins = [errors_f64(cast[k], wide[k], "bf16") for k in ("x", "w", "b")]
    for field, ref in (("local_max_rel", loc["max_rel"]), ("local_mean_rel", loc["mean_rel"]),
                       ("acc_max_rel", acc["max_rel"]), ("acc_mean_rel", acc["mean_rel"]),
                       ("acc_max_ulp", acc["max_ulp"]), ("in_acc_max_rel", max(e["max_rel"] for e in ins)),
                       ("in_acc_mean_rel", max(e["mean_rel"] for e in ins))):
        check(ref > 0 and near(float(r[field]), ref, TOL), "autocast linear: %s %r, f64 %r" % (field, r[field], ref))
    check(float(r["acc_mean_rel"]) > 2 * float(r["local_mean_rel"]), "autocast linear: the casts' rounding is not in "
          "the accumulated error (%r, local %r)" % (r["acc_mean_rel"], r["local_mean_rel"]))

# ---- 2. one definition: the recorder's compare() and probe::compare() on the same values ----


def cpp_compare(y, r, dtype, op):
    a, b = os.path.join(WORK, "y.f32"), os.path.join(WORK, "r.f32")
    np.asarray(y, dtype=np.float32).tofile(a)
    np.asarray(r, dtype=np.float32).tofile(b)
    p = subprocess.run([TWIN_COMPARE, dtype, op, a, b], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)


def same(py, cpp, what):
    check(cpp is not None, "%s: twin_compare failed" % what)
    if cpp is None:
        return
    for k in ("counted", "flips", "exact"):
        check(getattr(py, k) == cpp[k], "%s: %s %r, probe::compare %r" % (what, k, getattr(py, k), cpp[k]))
    for k in ("max_rel", "max_ulp", "bits"):
        check(getattr(py, k) == cpp[k], "%s: %s %r, probe::compare %r" % (what, k, getattr(py, k), cpp[k]))
    # The mean's sum: torch's (pairwise) against probe::compare's element order.
    check(near(py.mean_rel, cpp["mean_rel"], 1e-12), "%s: mean_rel %r, probe::compare %r" % (what, py.mean_rel,
                                                                                           cpp["mean_rel"]))
    check(list(py.error_bins) == cpp["error_bins"], "%s: histogram %s, probe::compare %s" % (what, py.error_bins,
                                                                                       cpp["error_bins"]))


x, w, b = T["x"].float(), T["w"].float(), T["b"].float()
local32 = {
    "linear": (T["h"], torch.addmm(b, x, w.t())),
    "softmax": (T["p"], torch.softmax(T["hs"].float(), dim=-1)),
    "layer_norm": (T["y"], torch.nn.functional.layer_norm(T["p"].float(), (16,), T["gamma"].float(),
                                                          T["beta"].float())),
}
for op, (y, r32) in local32.items():
    py = recorder_compare(y, r32, "bf16", op)
    same(py, cpp_compare(y.float().numpy(), r32.numpy(), "bf16", op), op)
    row = [r for r in rows if r["op"] == op and r["step"] == 0 and r["phase"] == "forward"]
    if row:  # the recorded row is that same comparison (torch's f32 recomputation is deterministic here)
        check(near(float(row[0]["local_mean_rel"]), py.mean_rel, 1e-9), "%s: row local_mean_rel %r, compare() on the "
              "test's f32 recomputation %r" % (op, row[0]["local_mean_rel"], py.mean_rel))

# Our runtime's twin (probe::Twin) on the same forward and the same bf16 values (twin_compare --ops): its rows
# equal the recorder's where both runtimes' bf16 ops give the same outputs. torch 1.13's CPU layer_norm in bf16
# is not f32's result rounded once (76 of these 128 outputs differ from it), ours is: its rows then differ
# (each twin measures its own op) and are compared only when torch's outputs are f32's rounded.
files = []
for k in ("x", "w", "b", "gamma", "beta"):
    files.append(os.path.join(WORK, k + ".f32"))
    T[k].float().numpy().tofile(files[-1])
p = subprocess.run([TWIN_COMPARE, "--ops", *files, "8", "32", "16"], capture_output=True, text=True)
check(p.returncode == 0, "twin_compare --ops: %s" % p.stderr)
ours = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
check([o["op"] for o in ours] == ["linear", "mul", "softmax", "layer_norm"], "runtime twin rows %r" %
      [o["op"] for o in ours])
ln_rounded = bool((torch.nn.functional.layer_norm(T["p"].float(), (16,), T["gamma"].float(), T["beta"].float())
                   .to(torch.bfloat16) == T["y"]).all())
fwd = [r for r in rows if r["phase"] == "forward" and r["step"] == 0][:4]
for o, r in zip(ours, fwd):
    if o["op"] == "layer_norm" and not ln_rounded:
        check(o["local_max_ulp"] <= 0.5 and float(r["local_max_ulp"]) > 8, "layer_norm: runtime %r ulps, torch %r"
              % (o["local_max_ulp"], r["local_max_ulp"]))
        print("note: torch's bf16 layer_norm is not f32's rounded: rows not compared with the runtime's twin")
        continue
    check(o["op"] == r["op"], "runtime row %s, recorded %s" % (o["op"], r["op"]))
    for k in ("local_max_rel", "local_mean_rel", "local_max_ulp", "acc_max_rel", "acc_mean_rel", "acc_max_ulp",
              "in_acc_max_rel", "in_acc_mean_rel"):
        check(near(float(r[k]), o[k], TOL) or (o[k] == 0 and float(r[k]) == 0),
              "%s: %s recorded %r, runtime's twin %r" % (o["op"], k, r[k], o[k]))
    check(int(r["flips"]) == o["flips"], "%s: flips recorded %d, runtime's twin %d" % (o["op"], r["flips"], o["flips"]))

rng = np.random.default_rng(5)
r = rng.standard_normal(200).astype(np.float32) * np.float32(3)
cases = []
for dtype, tdtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
    y = torch.from_numpy(r).to(tdtype).float().numpy().copy()
    top = FORMATS[dtype][2]
    y[0], r[0] = 0.0, 1e-3                       # flushed to 0
    y[1] = np.inf                                # inf where the reference is finite
    y[2], r[2] = np.float32(top), np.float32(min(top, 3e38) * 0.9)  # the largest finite value
    r[3] = np.nan                                # a reference that is not finite: left out
    y[4], r[4] = 0.0, 0.0                        # exact 0
    y[5], r[5] = 1.0, 0.9999                     # 1 where the reference is not: a flip for sigmoid and tanh
    y[6], r[6] = 1e-30, 1.5e-30                  # below f16's and bf16's normals: relative to the floor
    y[7], r[7] = -2.0, -2.0                      # exact
    y = torch.from_numpy(y).to(tdtype).float().numpy().copy()  # values the dtype holds (1e-30 is 0 in f16)
    for op in ("mul", "sigmoid"):
        cases.append((dtype, op, y.copy(), r.copy()))
for dtype, op, y, rr in cases:
    py = recorder_compare(torch.from_numpy(y), torch.from_numpy(rr), dtype, op)
    same(py, cpp_compare(y, rr, dtype, op), "edge cases %s %s" % (dtype, op))
    ref = errors_f64(y, rr, dtype, op)
    check(py.flips == ref["flips"] and py.exact == ref["exact"] and py.max_rel == ref["max_rel"] and
          py.max_ulp == ref["max_ulp"], "edge cases %s %s: compare() %r, f64 by element %r" % (
              dtype, op, (py.flips, py.exact, py.max_rel, py.max_ulp),
              (ref["flips"], ref["exact"], ref["max_rel"], ref["max_ulp"])))

# ---- 3. a bf16 running total that swamps its terms: the report names it ----
proc, out = record("running_sum", "bf16_running_sum.py")
check(proc.returncode == 0, "running_sum: exit status %d: %s" % (proc.returncode, proc.stderr[-400:]))
rep = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
section = rep.stdout[rep.stdout.find("PRECISION:"):]
check("PRECISION:" in rep.stdout and "twinned op rows over 3 steps" in section,
      "running_sum: report has no PRECISION section: %s" % rep.stdout[-800:])
lost = section.split("own rounding")[0]
check("[1] accumulation add in pool [bf16]" in lost,
      "running_sum: PRECISION does not name the running total first: %s" % lost[:800])
rep_json = subprocess.run([AMPSCOPE, "report", "--json", out], capture_output=True, text=True)
try:
    prec = json.loads(rep_json.stdout)["precision"]
    top = prec["by_jump"][0]
    check(prec["recorded"] and top["op"] == "add" and top["module"] == "pool" and top["kind"] == "accumulation",
          "running_sum: JSON by_jump[0] %r" % top)
    # Backward rows for the nodes of linear, add, div, relu (3 steps): 2 linears, 256 adds + 1 (+ 1.0), relu,
    # div per step.
    check(prec.get("backward_rows") == 3 * (2 + 257 + 1 + 1) and prec["backward"] and
          all(e["phase"] == "backward" for e in prec["backward"]),
          "running_sum: backward rows %r, entries %r" % (prec.get("backward_rows"), prec.get("backward", [])[:2]))
except (ValueError, KeyError, IndexError) as e:
    check(False, "running_sum: report --json: %s: %s" % (e, rep_json.stdout[:300]))
proc, out = record("running_sum_plain", "bf16_running_sum.py", twin=False)
rep = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
check("PRECISION: not recorded" in rep.stdout, "running_sum without --twin: %s" % rep.stdout[-400:])

# ---- 4. the Python API (ampscope.torch.record(..., twin=True), `ampscope record --attach`): the same rows as
# `ampscope record --twin` of the same script ----
api_out = os.path.join(WORK, "api_twin.h5")
if os.path.exists(api_out):
    os.remove(api_out)
api_env = dict(os.environ, AMPSCOPE=AMPSCOPE, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                                     "python"))
api = subprocess.run([sys.executable, os.path.join(SCRIPTS, "api_twin.py"), api_out], capture_output=True, text=True,
                     env=api_env)
check(api.returncode == 0, "api twin: exit status %d: %s" % (api.returncode, api.stderr[-400:]))
proc, whole_out = record("api_twin_whole", "api_twin.py")
check(proc.returncode == 0 and proc.stdout == api.stdout, "api twin under record --twin: exit %d, output %r (the "
      "API run's %r)" % (proc.returncode, proc.stdout, api.stdout))
if api.returncode == 0 and proc.returncode == 0:
    FIELDS = ("step", "op", "module", "phase", "out_dtype", "numel", "local", "local_max_rel", "local_mean_rel",
              "local_max_ulp", "acc_max_rel", "acc_mean_rel", "acc_max_ulp", "in_acc_max_rel", "in_acc_mean_rel",
              "flips", "exact")

    def key(r):
        return tuple(str(r[k]) if not isinstance(r[k], (float, np.floating)) else repr(float(r[k])) for k in FIELDS)

    a_rows, w_rows = precision_rows(api_out), precision_rows(whole_out)
    ops_seen = sorted({(r["op"], r["phase"]) for r in a_rows})
    check(len(a_rows) > 0 and [key(r) for r in a_rows] == [key(r) for r in w_rows],
          "api twin: %d rows, record --twin %d; first differing %r" % (
              len(a_rows), len(w_rows), next(((key(x), key(y)) for x, y in zip(a_rows, w_rows) if key(x) != key(y)),
                                            None)))
    for want_op in (("linear", "forward"), ("tanh", "backward"), ("softmax", "backward"), ("linear", "backward")):
        check(want_op in ops_seen, "api twin: no %s row (%s)" % (want_op, ops_seen))
    with h5py.File(api_out, "r") as f:
        c = f.attrs["config"]
        cfg = json.loads(c.decode() if isinstance(c, bytes) else c)
    check("twin" in cfg and "softmax" in cfg["twin"].get("backward", []), "api twin: config %s" % cfg.get("twin"))

finish()
