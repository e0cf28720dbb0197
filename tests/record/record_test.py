#!/usr/bin/python3
# `ampscope record` end to end on scripts written as users write them (tests/record/scripts): each is run under
# the recorder and its trace read back with h5py; rows, dtypes, module paths and statistics are checked against
# values computed here from what plain torch produced (tests/record/capture.py), in f64, and against values
# worked out by hand (the GradScaler's schedule); the bad losses must be diagnosed by `ampscope report`.
# Usage: record_test.py AMPSCOPE_BINARY WORK_DIR. Exit 77 (skipped) when this Python has no torch or h5py.
import json
import os
import subprocess
import sys

sys.dont_write_bytecode = True  # importing harness leaves no __pycache__ in the source tree
from harness import HERE, PYTHON, SCRIPTS, arguments, check, finish, require  # noqa: E402

h5py, np, _ = require("h5py", "numpy", "torch")  # torch: the scripts need it
from trace_rows import close, health_f64, moment_bounds, norm_bound, ops, stat_ok, text  # noqa: E402
AMPSCOPE, WORK = arguments("AMPSCOPE_BINARY", "WORK_DIR")
os.makedirs(WORK, exist_ok=True)


def record(name, script, *args, capture=False, extra=()):
    out = os.path.join(WORK, name + ".h5")
    if os.path.exists(out):
        os.remove(out)
    cmd = [AMPSCOPE, "record", "--out", out, *extra, "--", PYTHON]
    if capture:
        cmd += [os.path.join(HERE, "capture.py"), os.path.join(WORK, name + ".npz")]
    cmd += [os.path.join(SCRIPTS, script), *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, out


# --- 1. MLP, f32 and bf16 autocast: rows, dtypes, module paths, statistics, gradients, exit status ---------
for bf16 in (False, True):
    name = "mlp_bf16" if bf16 else "mlp_f32"
    p, out = record(name, "mlp_train.py", "--steps", "3", *(["--bf16"] if bf16 else []), capture=True)
    check(p.returncode == 0, "%s: exit status %d: %s" % (name, p.returncode, p.stderr[-400:]))
    rows, steps, grads, gnames, complete, precision = ops(out)
    ref = np.load(os.path.join(WORK, name + ".npz"))
    check(complete == 1, "%s: complete = %d" % (name, complete))
    check(precision == ("bf16" if bf16 else "fp32"), "%s: precision %s" % (name, precision))
    check(list(steps["step"]) == [0, 1, 2], "%s: steps %s" % (name, list(steps["step"])))
    fwd_linear = [r for r in rows if r["phase"] == "forward" and r["op"] == "linear"]
    check([r["module"] for r in fwd_linear] == ["fc1", "fc2"] * 3, "%s: linear modules %s" % (name, [r["module"] for r in fwd_linear]))
    want_dtype = "bf16" if bf16 else "f32"
    for i, r in enumerate(fwd_linear):
        check(r["out_dtype"] == want_dtype and r["in_dtypes"] == ",".join([want_dtype] * 3),
              "%s: linear %d dtypes %s -> %s" % (name, i, r["in_dtypes"], r["out_dtype"]))
        check(str(ref["dtype_%d" % i]) == ("torch.bfloat16" if bf16 else "torch.float32"), "%s: captured dtype" % name)
        h = health_f64(ref["linear_%d" % i])
        for k in ("numel", "nan", "pos_inf", "neg_inf", "zero"):
            check(int(r[k]) == h[k], "%s: linear %d %s %d, f64 reference %d" % (name, i, k, r[k], h[k]))
        for k in ("min", "max", "absmax", "mean", "rms"):
            check(stat_ok(r, h, k), "%s: linear %d %s %r, f64 reference %r" % (name, i, k, r[k], h[k]))
    # Per step: forward linear, relu, linear, log_softmax, nll_loss; backward one row per node.
    per_step = [[(r["phase"], r["op"], r["module"]) for r in rows if r["step"] == s] for s in range(3)]
    fwd = [x for x in per_step[0] if x[0] == "forward"]
    check(fwd == [("forward", "linear", "fc1"), ("forward", "relu", ""), ("forward", "linear", "fc2"),
                  ("forward", "log_softmax", ""), ("forward", "nll_loss", "")], "%s: forward rows %s" % (name, fwd))
    bwd = [x for x in per_step[0] if x[0] == "backward"]
    check(bwd == [("backward", "nll_loss", ""), ("backward", "log_softmax", ""), ("backward", "linear", "fc2"),
                  ("backward", "relu", ""), ("backward", "linear", "fc1")], "%s: backward rows %s" % (name, bwd))
    # Provenance: relu reads fc1's linear, fc2's linear reads relu (through autocast's cast in bf16).
    s0 = [r for r in rows if r["step"] == 0]
    seq_of = {(r["phase"], r["op"], r["module"]): int(r["seq"]) for r in s0}
    relu = [r for r in s0 if r["op"] == "relu" and r["phase"] == "forward"][0]
    fc2 = [r for r in s0 if r["module"] == "fc2" and r["phase"] == "forward"][0]
    check(int(relu["inputs"][0]) == seq_of[("forward", "linear", "fc1")], "%s: relu's input %s" % (name, relu["inputs"]))
    check([int(i) for i in fc2["inputs"]] == [int(relu["seq"]), -2, -2, -1],
          "%s: fc2's inputs %s (relu, the weight, the bias)" % (name, list(fc2["inputs"])))
    # Gradients of the last step against the tensors themselves.
    last = grads[grads["step"] == 2]
    lnames = [n for n, s in zip(gnames, grads["step"]) if s == 2]
    check(sorted(lnames) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"], "%s: grad names %s" % (name, lnames))
    # Within the bound of their f32-accumulated sums of squares (trace_rows.norm_bound).
    for n, g in zip(lnames, last):
        want, bound = norm_bound([ref["grad:" + n]])
        check(abs(float(g["norm"]) - want) <= bound, "%s: grad norm of %s %r, f64 %r (bound %g)" % (name, n, g["norm"], want, bound))
    total, bound = norm_bound([ref[k] for k in ref.files if k.startswith("grad:")])
    check(abs(float(steps["grad_norm"][2]) - total) <= bound, "%s: step grad_norm %r, f64 %r (bound %g)" % (
        name, steps["grad_norm"][2], total, bound))
    check(all(abs(lr - 0.05) < 1e-15 for lr in steps["lr"]), "%s: lr %s" % (name, steps["lr"]))
    r = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
    check(r.returncode == 0, "%s: report exit %d: %s" % (name, r.returncode, r.stdout[:300]))

p, out = record("mlp_exit", "mlp_train.py", "--steps", "1", "--exit-status", "5")
check(p.returncode == 5, "the script's exit status 5 came back as %d" % p.returncode)

# --- 2. A small GPT, bf16: every row attributed to one of the model's modules ------------------------------
p, out = record("gpt", "gpt_train.py", "--bf16")
check(p.returncode == 0, "gpt: exit %d: %s" % (p.returncode, p.stderr[-400:]))
rows, steps, grads, gnames, complete, precision = ops(out)
modules = {""} | {"embed", "ln_f", "head"} | {"blocks.%d%s" % (b, s) for b in range(2) for s in
                                              ("", ".ln1", ".attn", ".attn.qkv", ".attn.proj", ".ln2", ".fc", ".out")}
check(all(r["module"] in modules for r in rows), "gpt: modules %s" % sorted({r["module"] for r in rows} - modules))
lin = [r["module"] for r in rows if r["step"] == 0 and r["phase"] == "forward" and r["op"] == "linear"]
check(lin == ["blocks.%d.%s" % (b, m) for b in range(2) for m in ("attn.qkv", "attn.proj", "fc", "out")] + ["head"],
      "gpt: linear rows %s" % lin)
blin = [r["module"] for r in rows if r["step"] == 0 and r["phase"] == "backward" and r["op"] == "linear"]
check(sorted(blin) == sorted(lin), "gpt: backward linear rows %s" % blin)
sm = [r for r in rows if r["step"] == 0 and r["op"] == "softmax" and r["phase"] == "forward"]
check([r["module"] for r in sm] == ["blocks.0.attn", "blocks.1.attn"], "gpt: softmax rows %s" % [r["module"] for r in sm])
ln = [r for r in rows if r["op"] == "layer_norm" and r["phase"] == "forward" and r["step"] == 0]
check(len(ln) == 5 and all(r["out_dtype"] == "f32" for r in ln), "gpt: layer_norm rows %s" % [(r["module"], r["out_dtype"]) for r in ln])
check(all(r["out_dtype"] == "bf16" for r in rows if r["op"] == "linear" and r["phase"] == "forward"), "gpt: bf16 linears")
fwd = [r for r in rows if r["phase"] == "forward"]
resolved = sum(1 for r in fwd for i in r["inputs"] if i >= 0 or i == -2)
unknown = sum(1 for r in fwd for i in r["inputs"] if i == -3)
# Data: the token ids (embedding), the mask (masked_fill), nothing else.
check(unknown <= 2 * 2 * 2, "gpt: %d forward inputs with no producer (resolved %d)" % (unknown, resolved))

# --- 3. bf16 losses that turn finite values into inf: diagnosed at the right op and module ------------------
for name, args, op, cause, root in (("sharp_softmax", (), "log", "log_of_zero", "softmax"),
                                    ("sharp_exp", ("--exp", "--temperature", "0.01"), "log", "log_of_zero", "div"),
                                    ("sharp_exp_overflow", ("--exp", "--temperature", "0.001"), "exp", None, None)):
    p, out = record(name, "sharp_loss.py", *args)
    check(p.returncode == 0, "%s: exit %d" % (name, p.returncode))
    r = subprocess.run([AMPSCOPE, "report", "--json", out], capture_output=True, text=True)
    check(r.returncode == 1, "%s: report exit %d (1: anomalies)" % (name, r.returncode))
    rep = json.loads(r.stdout)
    first = rep["diagnoses"][0] if "diagnoses" in rep else rep["anomalies"][0]
    flat = json.dumps(first)
    check(first.get("op") == op and first.get("module") == "criterion", "%s: first anomaly %s" % (name, flat[:300]))
    check(first.get("phase") == "forward" and int(first.get("step", -1)) == 0, "%s: at step 0 forward: %s" % (name, flat[:300]))
    if cause:
        check(first.get("cause") == cause, "%s: cause %s" % (name, first.get("cause")))
        chain = first.get("chain") or first.get("root_cause") or []
        check(root in json.dumps(chain), "%s: root-cause chain names %s: %s" % (name, root, json.dumps(chain)[:300]))
    # The same facts from the rows themselves: the first origin is that op, and its input is all finite.
    rows = ops(out)[0]
    origins = [x for x in rows if x["origin"]]
    check(origins and origins[0]["op"] == op and origins[0]["module"] == "criterion",
          "%s: first origin row %s" % (name, origins[:1]))

# --- 4. torch.autograd.grad (a gradient penalty) and torch.autograd.backward --------------------------------
p, out = record("grad_penalty", "grad_penalty.py")
check(p.returncode == 0, "grad_penalty: exit %d: %s" % (p.returncode, p.stderr[-300:]))
rows, steps, grads, gnames, complete, precision = ops(out)
check(len(steps) == 3, "grad_penalty: %d steps" % len(steps))
for s in range(3):
    phases = [r["phase"] for r in rows if r["step"] == s]
    # forward, then autograd.grad's backward, forward again (the penalty), backward; the optimizer's own ops are
    # left out without --record-optimizer (record_options_test.py records them)
    runs = [ph for i, ph in enumerate(phases) if i == 0 or phases[i - 1] != ph]
    check(runs == ["forward", "backward", "forward", "backward"], "grad_penalty step %d: phases %s" % (s, runs))
    # The first backward (autograd.grad of out.sum() w.r.t. x): the nodes of the two linears and the softplus.
    first_bwd = [(r["op"], r["module"]) for r in rows if r["step"] == s and r["phase"] == "backward"][:4]
    check(first_bwd[1:4] == [("linear", "2"), ("softplus", "1"), ("linear", "0")], "grad_penalty: %s" % first_bwd)
check(sorted(set(gnames)) == ["0.bias", "0.weight", "2.bias", "2.weight"], "grad_penalty: grads %s" % sorted(set(gnames)))

# --- 5. kill -9 in the middle of step 3: steps 0..2 readable, the file left incomplete ----------------------
p, out = record("killed", "killed.py")
check(p.returncode == 128 + 9, "killed: exit %d (137 wanted)" % p.returncode)
rows, steps, grads, gnames, complete, precision = ops(out)
check(list(steps["step"]) == [0, 1, 2] and complete == 0, "killed: steps %s complete %d" % (list(steps["step"]), complete))
check({int(r["step"]) for r in rows} == {0, 1, 2}, "killed: op rows of steps %s" % sorted({int(r["step"]) for r in rows}))
r = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
check(r.returncode == 0 and "incomplete" in r.stdout, "killed: report exit %d: %s" % (r.returncode, r.stdout[:200]))

# --- 6. GradScaler (a CPU stand-in following its API): scale, found_inf, skip, growth tracker ---------------
p, out = record("scaler", "scaler_train.py")
check(p.returncode == 0, "scaler: exit %d: %s" % (p.returncode, p.stderr[-300:]))
rows, steps, grads, gnames, complete, precision = ops(out)
# By hand: init 1024, growth every 2 clean steps, step 2's batch holds an inf.
want = [(1024, 1024, False, False, 1), (1024, 2048, False, False, 0), (2048, 1024, True, True, 0),
        (1024, 1024, False, False, 1)]
got = [(s["scale"], s["scale_after"], bool(s["found_inf"]), bool(s["skipped"]), int(s["growth_tracker"])) for s in steps]
check(got == want, "scaler: steps %s, by hand %s" % (got, want))
check(all(int(g["step"]) != 2 for g in grads), "scaler: gradients recorded for the skipped step")
r = subprocess.run([AMPSCOPE, "report", "--json", out], capture_output=True, text=True)
rep = json.loads(r.stdout)
flat = json.dumps(rep)
check('"skipped' in flat, "scaler: the report names no skipped step")
first = (rep.get("diagnoses") or rep.get("anomalies") or [{}])[0]
check(first.get("phase") != "backward", "scaler: a backward row taken as the origin of the bad batch: %s" % json.dumps(first)[:300])

# --- 7. sampling and usage errors --------------------------------------------------------------------------
p, out = record("sampled", "mlp_train.py", "--steps", "4", extra=("--sample-every", "2"))
rows, steps = ops(out)[:2]
check(len(steps) == 4 and {int(r["step"]) for r in rows} == {0, 2}, "sampled: ops of steps %s" % sorted({int(r["step"]) for r in rows}))
p = subprocess.run([AMPSCOPE, "record", "--out", os.path.join(WORK, "x.h5"), "--probe", "fulll", "--", PYTHON, "-c", "0"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "--probe fulll: unknown probe level" in p.stderr and "hint: the levels are off" in p.stderr,
      "--probe fulll: exit %d %s" % (p.returncode, p.stderr))
p = subprocess.run([AMPSCOPE, "record", "--out", os.path.join(WORK, "y.h5"), "--", PYTHON, "-c", "print(1)"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "no trace written" in p.stderr and not os.path.exists(os.path.join(WORK, "y.h5")),
      "no step: exit %d %s" % (p.returncode, p.stderr))

# --- 8. what the recorder cannot see op by op: a custom autograd.Function, activation checkpointing ----------
# Reference gradients from a plain run of the same script (no recorder): the gradient flowing into the custom
# Function's input (a tensor hook on it), and for the checkpointed blocks the gradient of block 0's input
# (the script's x requires grad; x.grad[0] is step 0's alone).
GRAB = """
import runpy, sys, numpy as np, torch
got = []
def pre(module, inputs):
    if type(module).__name__ == "Act" and inputs[0].requires_grad:
        inputs[0].register_hook(lambda g: got.append(g.detach().double().numpy()))
torch.nn.modules.module.register_module_forward_pre_hook(pre)
g = runpy.run_path(sys.argv[1], run_name="__main__")
arrays = {"act_grad_%d" % i: a for i, a in enumerate(got)}
if "x" in g and getattr(g["x"], "grad", None) is not None:
    arrays["x_grad_0"] = g["x"].grad[0].double().numpy()
np.savez(sys.argv[2], **arrays)
"""
for script in ("custom_function", "checkpointed"):
    ref_path = os.path.join(WORK, script + "_ref.npz")
    r = subprocess.run([PYTHON, "-c", GRAB, os.path.join(SCRIPTS, script + ".py"), ref_path], capture_output=True, text=True)
    check(r.returncode == 0, "%s: the plain run failed: %s" % (script, r.stderr[-300:]))

p, out = record("custom_function", "custom_function.py")
check(p.returncode == 0 and "note:" not in p.stderr, "custom_function: exit %d: %s" % (p.returncode, p.stderr[-300:]))
rows = ops(out)[0]
ref = np.load(os.path.join(WORK, "custom_function_ref.npz"))
for s in range(2):
    bwd = [(r["op"], r["module"]) for r in rows if r["step"] == s and r["phase"] == "backward"]
    check(bwd == [("nll_loss", ""), ("log_softmax", ""), ("linear", "fc2"), ("SquaredReLU", "act"), ("linear", "fc1")],
          "custom_function step %d: backward rows %s" % (s, bwd))
    row = [r for r in rows if r["step"] == s and r["op"] == "SquaredReLU"][0]
    h = health_f64(ref["act_grad_%d" % s])
    for k in ("numel", "nan", "zero"):
        check(int(row[k]) == h[k], "custom_function step %d: SquaredReLU %s %d, plain run %d" % (s, k, row[k], h[k]))
    for k in ("min", "max", "absmax", "mean", "rms"):
        check(stat_ok(row, h, k), "custom_function step %d: %s %r, plain run %r" % (s, k, row[k], h[k]))
    check(h["zero"] > 0, "custom_function: the reference gradient has no zeros (the relu's): a weak check")
with h5py.File(out, "r") as f:
    check(len(f["events"]) == 0, "custom_function: %d events (none wanted: the Function is recorded)" % len(f["events"]))

p, out = record("checkpointed", "checkpointed.py")
notes = [l for l in p.stderr.splitlines() if l.startswith("ampscope record: note: activation checkpointing")]
check(p.returncode == 0 and len(notes) == 1 and "'blocks.0'" in notes[0], "checkpointed: exit %d, notes %s" % (p.returncode, notes))
rows = ops(out)[0]
with h5py.File(out, "r") as f:
    ev = f["events"][()]
    kinds, mods, details = text(f, ev["kind"]), text(f, ev["module"]), text(f, ev["detail"])
check(kinds == ["unrecorded", "unrecorded"] and mods == ["blocks.0", "blocks.1"] and list(ev["step"]) == [0, 0],
      "checkpointed: events %s %s steps %s" % (kinds, mods, list(ev["step"])))
check(all("not recorded one by one" in d for d in details), "checkpointed: event details %s" % details)
ref = np.load(os.path.join(WORK, "checkpointed_ref.npz"))
for s in range(2):
    bwd = [(r["op"], r["module"]) for r in rows if r["step"] == s and r["phase"] == "backward"]
    check(bwd[-2:] == [("checkpoint", "blocks.1"), ("checkpoint", "blocks.0")], "checkpointed step %d: backward %s" % (s, bwd))
row = [r for r in rows if r["step"] == 0 and r["op"] == "checkpoint" and r["module"] == "blocks.0"][0]
h = health_f64(ref["x_grad_0"])
for k in ("min", "max", "absmax", "mean", "rms"):
    check(stat_ok(row, h, k), "checkpointed: blocks.0's backward %s %r, plain run %r" % (k, row[k], h[k]))

# --- 9. the Python API: a plain python3 run records two of its steps with ampscope.torch.record() ------------
env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), AMPSCOPE=AMPSCOPE)
api = os.path.join(SCRIPTS, "api_record.py")
plain = subprocess.run([PYTHON, api, "none"], capture_output=True, text=True, env=env)
want_loss = {int(l.split()[1]): float(l.split()[3]) for l in plain.stdout.splitlines() if l.startswith("step ")}
out = os.path.join(WORK, "api.h5")
r = subprocess.run([PYTHON, api, out], capture_output=True, text=True, env=env)
check(r.returncode == 0 and "recording True" in r.stdout and r.stdout.rstrip().endswith("step 3 loss %.9g" % want_loss[3]),
      "api: exit %d: %s %s" % (r.returncode, r.stdout[-300:], r.stderr[-300:]))
rows, steps, grads, gnames, complete, precision = ops(out)
check(complete == 1 and len(steps) == 2, "api: complete %d, %d steps" % (complete, len(steps)))
check(len(steps) == 2 and
      all(close(float(s["loss"]), want_loss[i + 1], 1e-7) for i, s in enumerate(steps)),
      "api: losses %s, the plain run's %s" % ([float(s["loss"]) for s in steps], want_loss))
fwd = [(r["op"], r["module"]) for r in rows if r["step"] == 0 and r["phase"] == "forward"]
check(fwd == [("linear", "0"), ("tanh", "1"), ("linear", "2"), ("log_softmax", ""), ("nll_loss", "")], "api: forward %s" % fwd)
out = os.path.join(WORK, "api_fail.h5")
r = subprocess.run([PYTHON, api, out, "--fail"], capture_output=True, text=True, env=env)
check(r.returncode == 0 and "raised" in r.stdout and "complete = 0" in r.stderr, "api --fail: %d %s" % (r.returncode, r.stderr[-300:]))
rows, steps, grads, gnames, complete, precision = ops(out)
check(complete == 0 and len(steps) == 1 and close(float(steps[0]["loss"]), want_loss[1], 1e-7),
      "api --fail: complete %d, steps %s" % (complete, list(steps["loss"])))
r = subprocess.run([AMPSCOPE, "record", "--out", os.path.join(WORK, "z.h5"), "--attach", "--", PYTHON, "-c", "0"],
                   capture_output=True, text=True)
check(r.returncode == 2 and "--attach reads the rows" in r.stderr and "hint:" in r.stderr, "--attach with a command: %s" % r.stderr)

# --- 10. two ranks with torch.distributed's gloo backend, rank 1 fed an inf in step 1's batch ----------------
import socket
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
out = os.path.join(WORK, "ddp.h5")
for rank in (0, 1):
    if os.path.exists(os.path.join(WORK, "ddp.rank%d.h5" % rank)):
        os.remove(os.path.join(WORK, "ddp.rank%d.h5" % rank))
procs = [subprocess.Popen([AMPSCOPE, "record", "--out", out, "--", PYTHON, os.path.join(SCRIPTS, "ddp_train.py"),
                           "--bad-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                                   RANK=str(rank))) for rank in (0, 1)]
results = [p.communicate(timeout=300) for p in procs]
for rank, (p, (so, se)) in enumerate(zip(procs, results)):
    path = os.path.join(WORK, "ddp.rank%d.h5" % rank)
    check(p.returncode == 0 and ("3 steps written to " + path) in se, "ddp rank %d: exit %d: %s" % (rank, p.returncode, se[-300:]))
    with h5py.File(path, "r") as f:
        config = json.loads(f.attrs["config"].decode() if isinstance(f.attrs["config"], bytes) else f.attrs["config"])
    check(config.get("rank") == rank and config.get("world_size") == 2, "ddp rank %d: config %s" % (rank, config))
check(not os.path.exists(out), "ddp: %s written besides the ranks' traces" % out)
rows = ops(os.path.join(WORK, "ddp.rank1.h5"))[0]
first = [r for r in rows if r["step"] == 1 and r["phase"] == "forward"][0]
check((first["op"], first["module"], int(first["pos_inf"]) > 0) == ("linear", "module.0", True), "ddp rank 1: step 1's first row %s %s" % (first["op"], first["module"]))
r = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
check(r.returncode == 1 and "data-parallel run: 2 ranks" in r.stdout and  # 1: anomalies found
      "first origin across ranks: rank 1: nonfinite_input in module.0 at step 1" in r.stdout,
      "ddp: report exit %d: %s" % (r.returncode, r.stdout[:400]))

# --- 11. causal attention (torch.triu mask + masked_fill(-inf) + softmax): the mask's -inf is no anomaly -----
# The -inf masked_fill writes is the mask (the probe's rule for its own runs, probes/probe.cpp judge_nonfinite):
# no origin, no event, no anomaly in the report; the NaN/inf of a real overflow in the same block (exp of a
# learned logit scale started at 100: e^100 > f32's largest) still reach the trace through the masked tensor.
p, out = record("causal_clean", "causal_attention.py", "--steps", "3")
check(p.returncode == 0, "causal_clean: exit %d: %s" % (p.returncode, p.stderr[-400:]))
rows = ops(out)[0]
mf = [r for r in rows if r["op"] == "masked_fill" and r["phase"] == "forward"]
# By hand: batch 4, 4 heads, 16 positions, 16 * 15 / 2 = 120 masked scores per head: 4 * 4 * 120 = 1920 -inf.
check(len(mf) == 6 and all(int(r["neg_inf"]) == 1920 and int(r["nan"]) + int(r["pos_inf"]) == 0 for r in mf),
      "causal_clean: masked_fill rows %s" % [(r["module"], int(r["neg_inf"])) for r in mf])
check(not any(int(r["origin"]) for r in rows), "causal_clean: origins %s" % [(r["op"], r["module"]) for r in rows if r["origin"]])
with h5py.File(out, "r") as f:
    check(len(f["events"]) == 0, "causal_clean: %d events (none wanted: the mask's -inf is on purpose)" % len(f["events"]))
r = subprocess.run([AMPSCOPE, "report", out], capture_output=True, text=True)
check(r.returncode == 0 and r.stdout.startswith("OK: no NaN/Inf found in 3 steps"),
      "causal_clean: report exit %d: %s" % (r.returncode, r.stdout[:400]))
p, out = record("causal_overflow", "causal_attention.py", "--steps", "2", "--logit-scale", "100")
check(p.returncode == 0, "causal_overflow: exit %d: %s" % (p.returncode, p.stderr[-400:]))
rows = [r for r in ops(out)[0] if r["step"] == 0 and r["phase"] == "forward"]
origins = [(r["op"], r["module"]) for r in rows if r["origin"]]
check(origins[:1] == [("exp", "blocks.0.attn")], "causal_overflow: origins %s" % origins)
mf = [r for r in rows if r["op"] == "masked_fill" and r["module"] == "blocks.0.attn"]
check(len(mf) == 1 and int(mf[0]["nan"]) + int(mf[0]["pos_inf"]) > 0 and not mf[0]["origin"],
      "causal_overflow: the masked scores %s" % [(int(r["nan"]), int(r["pos_inf"]), int(r["origin"])) for r in mf])
r = subprocess.run([AMPSCOPE, "report", "--json", out], capture_output=True, text=True)
check(r.returncode == 1, "causal_overflow: report exit %d (1: anomalies)" % r.returncode)
first = json.loads(r.stdout)["anomalies"][0]
check((first["op"], first["module"], first["cause"], first["step"]) == ("exp", "blocks.0.attn", "exp_overflow", 0),
      "causal_overflow: first anomaly %s" % json.dumps(first)[:300])
# A sequence that is all padding (masked as keys too): its rows are masked everywhere and softmax makes 0 / 0. The
# NaN is the softmax's (the probe's rule: NaN with no inf from an input holding only a mask's -inf), not the mask's.
p, out = record("causal_padded", "causal_attention.py", "--steps", "1", "--padded-sample")
check(p.returncode == 0, "causal_padded: exit %d: %s" % (p.returncode, p.stderr[-400:]))
rows = [r for r in ops(out)[0] if r["phase"] == "forward"]
origins = [(r["op"], r["module"]) for r in rows if r["origin"]]
# By hand: one sequence of 16 rows, 4 heads, 16 scores a row: 1024 NaN out of each softmax.
sm = [int(r["nan"]) for r in rows if r["op"] == "softmax" and r["module"] == "blocks.0.attn"]
check(origins[:1] == [("softmax", "blocks.0.attn")] and sm == [1024], "causal_padded: origins %s, softmax NaN %s" % (origins, sm))
r = subprocess.run([AMPSCOPE, "report", "--json", out], capture_output=True, text=True)
first = json.loads(r.stdout)["anomalies"][0] if r.returncode == 1 else {}
check((first.get("op"), first.get("module"), first.get("cause")) == ("softmax", "blocks.0.attn", "invalid_operation"),
      "causal_padded: report exit %d, first anomaly %s" % (r.returncode, json.dumps(first)[:300]))


# --- 12. the statistics themselves on tensors built to reach every path: NaN, +inf, -inf alone and together (a
# mask's -inf, the kind health() infers from the extremes), all non-finite, zeros and subnormals, in f32, bf16, f16
# and f64, contiguous or not; against numpy's f64 over the same values: counts and extremes exact, the mean and rms
# of f32, bf16 and f16 tensors within the bound of their f32-accumulated sums (trace_rows.moment_bounds), of f64
# ones at 1e-12. The check must be able to fail: the same statistics against a reference that lost one element (an
# off-by-one) are caught in every case where the bound is below that element's effect (n <= 96 here).
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import math  # noqa: E402
import random  # noqa: E402
import torch  # noqa: E402
from ampscope.torch import _recorder  # noqa: E402


def stats_f64(x, tiny, drop=False):
    a = x.double().numpy().ravel()
    if drop:  # the wrong reference: one finite element left out of the moments
        a = np.delete(a, int(np.flatnonzero(np.isfinite(a))[-1]))
    fin = a[np.isfinite(a)]
    counts = [a.size, int(np.isnan(a).sum()), int((a == np.inf).sum()), int((a == -np.inf).sum()), int((fin == 0).sum()),
              int(((fin != 0) & (np.abs(fin) < tiny)).sum())]
    if fin.size == 0:
        return counts, None, None
    return counts, [fin.min(), fin.max(), np.abs(fin).max(), fin.sum() / fin.size, math.sqrt((fin * fin).sum() / fin.size)], \
        moment_bounds(fin)[:2]


def moments_ok(got, moments, bounds, dtype):
    ok = all(close(float(g), float(w)) for g, w in zip(got[6:9], moments[:3]))
    if dtype == torch.float64:
        return ok and all(close(float(g), float(w)) for g, w in zip(got[9:], moments[3:]))
    return ok and all(abs(float(g) - float(w)) <= b for g, w, b in zip(got[9:], moments[3:], bounds))


rng = random.Random(12)
torch.manual_seed(12)
cases = caught = droppable = 0
for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
    tiny = torch.finfo(dtype).tiny
    for i in range(40):
        n = (1, 2, 6, 96, 4096, 65536)[i % 6]
        x = torch.randn(n, dtype=torch.float64) * 10 ** rng.uniform(-2, 2)
        # i // 6 picks what is planted: nothing, each kind alone, kinds together, everything non-finite
        plant = [(), ("ninf",), ("pinf",), ("nan",), ("zero", "sub"), ("ninf", "pinf"), ("nan", "ninf", "zero")][(i // 6) % 7]
        if i % 13 == 12:
            plant = ("all",)
        for kind in plant:
            idx = torch.randint(0, n, (max(1, n // rng.choice((2, 7, 100))),))
            value = {"ninf": -math.inf, "pinf": math.inf, "nan": math.nan, "zero": 0.0,
                     "sub": tiny * 2.0 ** -rng.randint(1, 8), "all": rng.choice((math.inf, -math.inf, math.nan))}[kind]
            if kind == "all":
                x[:] = value
            else:
                x[idx] = value
        if i % 5 == 4:
            x = x.abs()  # every finite value positive: the minimum over the finite values is not a stand-in's
        x = x.to(dtype)
        if n % 2 == 0 and i % 3 == 1:
            x = x.reshape(2, -1).t()  # not contiguous
        got = _recorder.health(x)
        counts, moments, bounds = stats_f64(x, tiny)
        what = "health of %s n=%d planted %s" % (str(dtype)[6:], n, ",".join(plant) or "nothing")
        ok = got[:6] == counts
        if moments is None:
            ok = ok and all(math.isnan(v) for v in got[6:])
        else:
            ok = ok and moments_ok(got, moments, bounds, dtype)
        check(ok, "%s: %r, numpy f64 %r %r (bounds %r)" % (what, got, counts, moments, bounds))
        cases += 1
        finite = int(torch.isfinite(x).sum())
        if 6 <= n <= 96 and finite >= 3 and dtype != torch.float64:
            _, wrong, _ = stats_f64(x, tiny, drop=True)
            droppable += 1
            caught += not moments_ok(got, wrong, bounds, dtype)
check(cases == 160, "statistics cases run: %d" % cases)
check(droppable >= 30 and caught == droppable, "a reference missing one element was caught in %d of %d cases" % (caught, droppable))

finish()
