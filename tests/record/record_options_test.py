#!/usr/bin/python3
# `ampscope record`'s options on scripts written as users write them (tests/record/scripts): the optimizer's ops left
# out by default and kept by --record-optimizer (gradient clipping with them), --ops and --modules, the levels off,
# dtype and full (histograms), --sample-every's unrecorded steps, and refused options. Row counts, statistics and
# histograms are checked against values computed here in f64 from what plain torch produced (capture.py), not
# against what the recorder printed.
# Usage: record_options_test.py AMPSCOPE_BINARY WORK_DIR. Exit 77 (skipped) when this Python has no torch or h5py.
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # importing harness leaves no __pycache__ in the source tree
from harness import HERE, PYTHON, SCRIPTS, arguments, check, finish, require  # noqa: E402

h5py, np, torch = require("h5py", "numpy", "torch")
from trace_rows import close, health_f64, histogram_f64, histograms, norm_bound, ops, stat_ok  # noqa: E402
AMPSCOPE, WORK = arguments("AMPSCOPE_BINARY", "WORK_DIR")
os.makedirs(WORK, exist_ok=True)


def record(name, script, *args, extra=(), capture=True):
    out = os.path.join(WORK, name + ".h5")
    if os.path.exists(out):
        os.remove(out)
    cmd = [AMPSCOPE, "record", "--out", out, *extra, "--", PYTHON]
    if capture:
        cmd += [os.path.join(HERE, "capture.py"), os.path.join(WORK, name + ".npz")]
    cmd += [os.path.join(SCRIPTS, script), *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    check(p.returncode == 0, "%s: exit %d: %s" % (name, p.returncode, p.stderr[-400:]))
    return out, (np.load(os.path.join(WORK, name + ".npz")) if capture else None), p


def per_step(rows, s, phase=None):
    return [(r["phase"], r["op"], r["module"]) for r in rows if r["step"] == s and (phase is None or r["phase"] == phase)]


def stats(r):
    return tuple(float(r[k]) for k in ("numel", "nan", "pos_inf", "neg_inf", "zero", "min", "max", "mean", "rms"))


MLP_FORWARD = [("forward", "linear", "fc1"), ("forward", "tanh", ""), ("forward", "linear", "fc2"),
               ("forward", "log_softmax", ""), ("forward", "nll_loss", "")]
MLP_BACKWARD = [("backward", "nll_loss", ""), ("backward", "log_softmax", ""), ("backward", "linear", "fc2"),
                ("backward", "tanh", ""), ("backward", "linear", "fc1")]

# --- 1. the optimizer's ops: left out by default, clip_grad_norm_ with them; --record-optimizer keeps both -------
for bf16 in (False, True):
    tag = "_bf16" if bf16 else ""
    flags = ["--bf16"] if bf16 else []
    out, ref, p = record("clip" + tag, "clipped_train.py", *flags)
    rows, steps, grads, gnames, complete, _ = ops(out)
    losses = [float(l.split()[3]) for l in p.stdout.splitlines() if l.startswith("step ")]
    clip_norms = [float(l.split()[5]) for l in p.stdout.splitlines() if l.startswith("step ")]
    check(complete == 1 and len(steps) == 3, "clip%s: complete %d, %d steps" % (tag, complete, len(steps)))
    for s in range(3):
        # Exactly the model's and the loss's ops: no row of the clipping (norms, the multiply of each gradient)
        # and none of AdamW's, which would otherwise be forward rows outside every module and optimizer rows.
        check(per_step(rows, s) == MLP_FORWARD + MLP_BACKWARD, "clip%s step %d: rows %s" % (tag, s, per_step(rows, s)))
    # /steps' grad_norm is the norm the optimizer received: after clipping to 0.5 (clip_grad_norm_ returns the norm
    # before), so the clipped ones are 0.5 within clip_grad_norm_'s 1e-6 epsilon; the last step's from the
    # gradients plain torch left (capture.py), in f64.
    for s in range(3):
        want = min(clip_norms[s], 0.5 * clip_norms[s] / (clip_norms[s] + 1e-6))
        check(close(float(steps["grad_norm"][s]), want, 1e-5), "clip%s step %d: grad_norm %r, clipped %r" % (
            tag, s, float(steps["grad_norm"][s]), want))
    check(all(close(float(steps["loss"][s]), losses[s], 1e-5) for s in range(3)), "clip%s: losses" % tag)
    out_all, _, _ = record("clip_all" + tag, "clipped_train.py", *flags, extra=("--record-optimizer",))
    rows_all = ops(out_all)[0]
    for s in range(3):
        got = per_step(rows_all, s)
        # The forward and backward rows are the same, then the optimizer phase: clipping's ops first (norms of the
        # four gradients, then the multiplies that scale them), then AdamW's, all outside every module.
        check(got[:10] == MLP_FORWARD + MLP_BACKWARD, "clip_all%s step %d: first rows %s" % (tag, s, got[:10]))
        opt = got[10:]
        check(len(opt) > 8 and all(ph == "optimizer" and m == "" for ph, _, m in opt),
              "clip_all%s step %d: optimizer rows %s" % (tag, s, opt))
        names = [o for _, o, _ in opt]
        check("mul" in names[:12] and ("linalg_vector_norm" in names[:6] or "norm" in names[:6]),
              "clip_all%s step %d: clipping's ops first in the optimizer phase: %s" % (tag, s, names[:12]))
    same = [stats(a) == stats(b) for a, b in zip([r for r in ops(out)[0]], [r for r in rows_all if r["phase"] != "optimizer"])]
    check(len(same) == 30 and all(same), "clip%s: forward and backward statistics differ with --record-optimizer" % tag)

# --- 2. --ops and --modules: what they leave out, and the rows they keep unchanged -----------------------------
out_ref, ref, _ = record("mlp", "mlp_train.py", "--steps", "3")
rows_ref, steps_ref, grads_ref, gnames_ref = ops(out_ref)[:4]
out, _, _ = record("ops_linear", "mlp_train.py", "--steps", "3", extra=("--ops", "linear"))
rows, steps, grads, gnames = ops(out)[:4]
for s in range(3):
    check(per_step(rows, s) == [("forward", "linear", "fc1"), ("forward", "linear", "fc2"), ("backward", "linear", "fc2"),
                                ("backward", "linear", "fc1")], "--ops linear step %d: %s" % (s, per_step(rows, s)))
fc2 = [r for r in rows if r["step"] == 0 and r["phase"] == "forward" and r["module"] == "fc2"][0]
check([int(i) for i in fc2["inputs"]] == [-4, -2, -2, -1], "--ops linear: fc2 reads relu, left out (-4): %s" % list(fc2["inputs"]))
kept = [r for r in rows_ref if r["op"] == "linear"]
check(len(kept) == len(rows) == 12 and all(stats(a) == stats(b) for a, b in zip(kept, rows)),
      "--ops linear: the linear rows differ from the unfiltered run's")
fwd_lin = [r for r in rows if r["phase"] == "forward"]
for i, r in enumerate(fwd_lin):  # and from plain torch's outputs, in f64
    h = health_f64(ref["linear_%d" % i])
    check(all(stat_ok(r, h, k) for k in ("min", "max", "mean", "rms")) and int(r["numel"]) == h["numel"],
          "--ops linear: linear %d statistics against the f64 reference" % i)
check(sorted(set(gnames)) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], "--ops linear: grads %s" % sorted(set(gnames)))

out, _, _ = record("modules_fc2", "mlp_train.py", "--steps", "3", extra=("--modules", "fc2", "--ops", "linear", "--ops", "relu"))
rows, steps, grads, gnames = ops(out)[:4]
for s in range(3):
    check(per_step(rows, s) == [("forward", "linear", "fc2"), ("backward", "linear", "fc2")],
          "--modules fc2: step %d rows %s" % (s, per_step(rows, s)))
check(sorted(set(gnames)) == ["fc2.bias", "fc2.weight"] and len(gnames) == 6, "--modules fc2: grads %s" % gnames)
want = {n: g for n, g in zip(gnames_ref, grads_ref) if n.startswith("fc2.")}
check(all(close(float(g["norm"]), float(want[n]["norm"]), 1e-15) for n, g in zip(gnames, grads) if g["step"] == 2),
      "--modules fc2: grad norms differ from the unfiltered run's")
check(all(close(float(a), float(b), 1e-15) for a, b in zip(steps["grad_norm"], steps_ref["grad_norm"])),
      "--modules fc2: /steps grad_norm is the whole step's (all parameters)")
out, _, _ = record("modules_outside", "mlp_train.py", "--steps", "1", extra=("--modules", ""))
check(per_step(ops(out)[0], 0) == [("forward", "relu", ""), ("forward", "log_softmax", ""), ("forward", "nll_loss", ""),
                                   ("backward", "nll_loss", ""), ("backward", "log_softmax", ""), ("backward", "relu", "")],
      "--modules '': the ops outside every module: %s" % per_step(ops(out)[0], 0))

# --- 3. levels: full (histograms), dtype, off -------------------------------------------------------------------
for bf16 in (False, True):
    tag = "_bf16" if bf16 else ""
    out, ref, _ = record("full" + tag, "mlp_train.py", "--steps", "2", *(["--bf16"] if bf16 else []), extra=("--probe", "full"))
    rows, steps, grads, gnames = ops(out)[:4]
    hist = histograms(out)
    tiny = float(torch.finfo(torch.bfloat16 if bf16 else torch.float32).tiny)
    ops_hist = {(s, q): b for s, q, t, b in hist if q >= 0}
    check(len(ops_hist) == len(rows) == 20 and all(t == "output" for s, q, t, b in hist if q >= 0),
          "full%s: %d op histograms for %d rows" % (tag, len(ops_hist), len(rows)))
    for r in rows:  # every histogram counts the row's elements, its NaN/inf/zero counts in their bins
        b = ops_hist.get((int(r["step"]), int(r["seq"])))
        check(b is not None and sum(b) == int(r["numel"]) and b[129] == int(r["zero"]) and b[131] == int(r["nan"]),
              "full%s: histogram of step %d seq %d" % (tag, r["step"], r["seq"]))
    fwd_lin = [r for r in rows if r["phase"] == "forward" and r["op"] == "linear"]
    for i, r in enumerate(fwd_lin):
        want = histogram_f64(ref["linear_%d" % i], tiny)
        check(ops_hist[(int(r["step"]), int(r["seq"]))] == want, "full%s: linear %d's histogram against numpy's" % (tag, i))
    ghist = {(s, t): b for s, q, t, b in hist if q == -1}
    check(sorted(ghist) == sorted((s, n) for s in range(2) for n in ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight")),
          "full%s: gradient histograms %s" % (tag, sorted(ghist)))
    for n in ("fc1.weight", "fc2.bias"):
        want = histogram_f64(ref["grad:" + n], float(torch.finfo(torch.float32).tiny))  # parameters' grads are f32
        check(ghist[(1, n)] == want, "full%s: %s's gradient histogram against numpy's" % (tag, n))
    r = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
    check(r.returncode == 0, "full%s: report exit %d: %s" % (tag, r.returncode, r.stdout[-300:]))

out, _, _ = record("dtype", "mlp_train.py", "--steps", "2", "--bf16", extra=("--probe", "dtype"))
rows, steps, grads, gnames = ops(out)[:4]
check([x for x in per_step(rows, 1)] == [("forward", "linear", "fc1"), ("forward", "relu", ""), ("forward", "linear", "fc2"),
                                         ("forward", "log_softmax", ""), ("forward", "nll_loss", ""),
                                         ("backward", "nll_loss", ""), ("backward", "log_softmax", ""),
                                         ("backward", "linear", "fc2"), ("backward", "relu", ""), ("backward", "linear", "fc1")],
      "dtype: rows %s" % per_step(rows, 1))
check(all(r["out_dtype"] == "bf16" for r in rows if r["op"] == "linear" and r["phase"] == "forward") and
      all(float(r["rms"]) == 0 and int(r["numel"]) > 0 for r in rows) and len(histograms(out)) == 0, "dtype: rows without statistics")
out, ref, _ = record("off", "mlp_train.py", "--steps", "3", extra=("--probe", "off"))
rows, steps, grads, gnames = ops(out)[:4]
total = np.sqrt(sum((ref[k] ** 2).sum() for k in ref.files if k.startswith("grad:")))
check(len(rows) == 0 and len(grads) == 0 and len(steps) == 3, "off: %d rows, %d grads, %d steps" % (len(rows), len(grads), len(steps)))
check(close(float(steps["grad_norm"][2]), total, 1e-9), "off: step 2's grad_norm %r, f64 %r" % (steps["grad_norm"][2], total))

# --- 4. --sample-every: the unrecorded steps leave /steps right (their grad_norm in f64) --------------------------
out, ref, _ = record("every2", "mlp_train.py", "--steps", "4", extra=("--sample-every", "2"))
rows, steps, grads, gnames = ops(out)[:4]
check({int(r["step"]) for r in rows} == {0, 2} and {int(g["step"]) for g in grads} == {0, 2} and len(steps) == 4,
      "every2: rows of steps %s, grads of %s" % (sorted({int(r["step"]) for r in rows}), sorted({int(g["step"]) for g in grads})))
check(per_step(rows, 2) == per_step(rows_ref, 0), "every2: step 2's rows %s" % per_step(rows, 2))
# Step 2's first linear reads parameters the optimizer changed at an unrecorded step: still parameters (-2).
lin = [r for r in rows if r["step"] == 2 and r["phase"] == "forward" and r["module"] == "fc1"][0]
check([int(i) for i in lin["inputs"]][1:] == [-2, -2, -1], "every2: step 2's fc1 inputs %s" % list(lin["inputs"]))
total = np.sqrt(sum((ref[k] ** 2).sum() for k in ref.files if k.startswith("grad:")))
check(close(float(steps["grad_norm"][3]), total, 1e-9), "every2: unrecorded step 3's grad_norm %r, f64 %r" % (steps["grad_norm"][3], total))

# --- 5. provenance through backward: the seed is data, each node reads the one before --------------------------
s0 = [r for r in rows_ref if r["step"] == 0 and r["phase"] == "backward"]
check(int(s0[0]["inputs"][0]) == -3 and all(int(b["inputs"][0]) == int(a["seq"]) for a, b in zip(s0, s0[1:])),
      "backward provenance: %s" % [(r["op"], int(r["seq"]), list(map(int, r["inputs"]))) for r in s0])

# --- 6. --flight-recorder: an anomaly on an unsampled step gets its rows and the steps before it -------------------
# flight_train.py: step 3's batch holds an inf; the script drops that step's gradients and goes on. At
# --sample-every 4, steps 0 and 4 are sampled; step 3 is not.
MLP_FC = [("forward", "linear", "fc1"), ("forward", "relu", ""), ("forward", "linear", "fc2"),
          ("forward", "log_softmax", ""), ("forward", "nll_loss", "")]
MLP_FC_BACKWARD = [("backward", "nll_loss", ""), ("backward", "log_softmax", ""), ("backward", "linear", "fc2"),
                   ("backward", "relu", ""), ("backward", "linear", "fc1")]
for n, want_steps in ((0, [0, 4]), (3, [0, 1, 2, 3, 4]), (2, [0, 2, 3, 4]), (1, [0, 3, 4])):
    extra = ("--sample-every", "4") + (("--flight-recorder", str(n)) if n else ())
    out, ref, p = record("flight%d" % n, "flight_train.py", "--steps", "6", extra=extra)
    rows, steps, grads, gnames, complete, _ = ops(out)
    got = sorted({int(r["step"]) for r in rows})
    check(complete == 1 and len(steps) == 6 and got == want_steps,
          "flight %d: complete %d, %d steps, rows of steps %s (want %s)" % (n, complete, len(steps), got, want_steps))
    # Grads: none at step 3 (the script set them to None); the written finite steps have theirs.
    check(sorted({int(g["step"]) for g in grads}) == [s for s in want_steps if s != 3],
          "flight %d: grads of steps %s" % (n, sorted({int(g["step"]) for g in grads})))
    for s in want_steps:
        check(per_step(rows, s) == MLP_FC + MLP_FC_BACKWARD, "flight %d step %d: rows %s" % (n, s, per_step(rows, s)))
        # The linears against plain torch's outputs in f64 (capture.py: fc1 and fc2 of step s are calls 2s, 2s + 1),
        # the inf of step 3's batch included: counts exactly, moments over the finite values.
        for k, module in ((2 * s, "fc1"), (2 * s + 1, "fc2")):
            r = [r for r in rows if r["step"] == s and r["phase"] == "forward" and r["module"] == module][0]
            h = health_f64(ref["linear_%d" % k])
            check(all(int(r[c]) == int(h[c]) for c in ("numel", "nan", "pos_inf", "neg_inf", "zero")) and
                  all(stat_ok(r, h, c) for c in ("min", "max", "mean", "rms")),
                  "flight %d step %d %s: %s against the f64 reference %s" % (n, s, module, stats(r), h))
    # The inf reached fc1's output at step 3 (the f64 reference says how many), and the /ops rows stay in step order.
    h3 = health_f64(ref["linear_6"])
    check(h3["pos_inf"] + h3["neg_inf"] > 0, "flight_train.py: step 3's fc1 output holds no inf (%s)" % h3)
    order = [int(r["step"]) for r in rows]
    check(order == sorted(order), "flight %d: /ops rows out of step order: %s" % (n, order))
    # /steps is written for every step; the unsampled steps' grad_norm as plain torch's gradients give it at step 5.
    check([int(x) for x in steps["step"]] == list(range(6)), "flight %d: /steps %s" % (n, list(steps["step"])))
    # Step 5 is recorded (held) with the flight recorder: its norm from the f32-accumulated sums of squares.
    total, bound = norm_bound([ref[k] for k in ref.files if k.startswith("grad:")])
    check(abs(float(steps["grad_norm"][5]) - total) <= bound, "flight %d: step 5's grad_norm %r, f64 %r (bound %g)" % (
        n, steps["grad_norm"][5], total, bound))
    with h5py.File(out, "r") as f:
        import json
        probe = json.loads(f.attrs["probe"].decode() if isinstance(f.attrs["probe"], bytes) else f.attrs["probe"])
    check(probe.get("flight_recorder") == (n > 0) and probe.get("recorder_steps") == n,
          "flight %d: the trace's probe description %s" % (n, probe))

# --- 6b. the flight recorder through the Python API: record(flight_recorder=N) as --flight-recorder N above ------------
# api_flight.py: flight_train.py's model, data and loop inside `with ampscope.torch.record(OUT, sample_every=4,
# flight_recorder=N, optimizers=[opt])` in a plain python3 run (capture.py keeps plain torch's linear outputs).
import json  # noqa: E402
api_env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), AMPSCOPE=AMPSCOPE)
for n, want_steps in ((0, [0, 4]), (3, [0, 1, 2, 3, 4]), (2, [0, 2, 3, 4]), (1, [0, 3, 4])):
    out, npz = os.path.join(WORK, "api_flight%d.h5" % n), os.path.join(WORK, "api_flight%d.npz" % n)
    if os.path.exists(out):
        os.remove(out)
    p = subprocess.run([PYTHON, os.path.join(HERE, "capture.py"), npz, os.path.join(SCRIPTS, "api_flight.py"), out,
                        str(n)], capture_output=True, text=True, env=api_env)
    check(p.returncode == 0, "api flight %d: exit %d: %s" % (n, p.returncode, p.stderr[-400:]))
    ref = np.load(npz)
    rows, steps, grads, gnames, complete, _ = ops(out)
    got = sorted({int(r["step"]) for r in rows})
    check(complete == 1 and len(steps) == 6 and got == want_steps,
          "api flight %d: complete %d, %d steps, rows of steps %s (want %s)" % (n, complete, len(steps), got, want_steps))
    check(sorted({int(g["step"]) for g in grads}) == [s for s in want_steps if s != 3],
          "api flight %d: grads of steps %s" % (n, sorted({int(g["step"]) for g in grads})))
    for s in want_steps:
        check(per_step(rows, s) == MLP_FC + MLP_FC_BACKWARD, "api flight %d step %d: rows %s" % (n, s, per_step(rows, s)))
        for k, module in ((2 * s, "fc1"), (2 * s + 1, "fc2")):
            r = [r for r in rows if r["step"] == s and r["phase"] == "forward" and r["module"] == module][0]
            h = health_f64(ref["linear_%d" % k])
            check(all(int(r[c]) == int(h[c]) for c in ("numel", "nan", "pos_inf", "neg_inf", "zero")) and
                  all(stat_ok(r, h, c) for c in ("min", "max", "mean", "rms")),
                  "api flight %d step %d %s: %s against the f64 reference %s" % (n, s, module, stats(r), h))
    h3 = health_f64(ref["linear_6"])
    check(h3["pos_inf"] + h3["neg_inf"] > 0, "api_flight.py: step 3's fc1 output holds no inf (%s)" % h3)
    order = [int(r["step"]) for r in rows]
    check(order == sorted(order), "api flight %d: /ops rows out of step order: %s" % (n, order))
    check([int(x) for x in steps["step"]] == list(range(6)), "api flight %d: /steps %s" % (n, list(steps["step"])))
    # Step 5 is recorded (held) with the flight recorder: its norm from the f32-accumulated sums of squares.
    total, bound = norm_bound([ref[k] for k in ref.files if k.startswith("grad:")])
    check(abs(float(steps["grad_norm"][5]) - total) <= bound, "api flight %d: step 5's grad_norm %r, f64 %r (bound %g)" % (
        n, steps["grad_norm"][5], total, bound))
    with h5py.File(out, "r") as f:
        probe = json.loads(f.attrs["probe"].decode() if isinstance(f.attrs["probe"], bytes) else f.attrs["probe"])
    check(probe.get("flight_recorder") == (n > 0) and probe.get("recorder_steps") == n,
          "api flight %d: the trace's probe description %s" % (n, probe))

# --- 7. refused options ------------------------------------------------------------------------------------------
for args, want in ((["--opps", "linear"], "unknown option '--opps'; did you mean '--ops'?"),
                   (["--ops", ""], "--ops '': an empty glob matches no op"),
                   (["--probe", "histograms"], "--probe histograms: unknown probe level"),
                   (["--record-optimiser"], "did you mean '--record-optimizer'?"),
                   (["--flight-recorder", "3"], "--flight-recorder 3 keeps the steps that sampling leaves out, but "
                                                "--sample-every 1 records every step already"),
                   (["--flight-recorder", "3", "--sample-every", "4", "--probe", "off"], "--probe off records no ops"),
                   (["--flight-recorder", "-1", "--sample-every", "4"], "--flight-recorder -1: must be 0 (off) or more")):
    p = subprocess.run([AMPSCOPE, "record", "--out", os.path.join(WORK, "bad.h5"), *args, "--", PYTHON, "-c", "0"],
                       capture_output=True, text=True)
    check(p.returncode == 2 and want in p.stderr and "hint:" in p.stderr and not os.path.exists(os.path.join(WORK, "bad.h5")),
          "%s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))

finish()
