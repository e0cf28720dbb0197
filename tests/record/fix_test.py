#!/usr/bin/python3
# `ampscope fix` on runs `ampscope record` recorded (docs/pytorch.md, "Proving a fix"), with scripts written as
# users write them: the run's command, folder and kept environment in the trace; nothing run without --run (a
# marker file the script writes stays absent); the f32-module remedy of a bf16 loss verified, its re-run's
# losses equal to a plain torch run of the same script with that module in f32 by hand (no recorder), and the
# report of the re-run clean; a script whose anomaly f32 keeps too (no remedy verifiable); traces whose recorded
# command, environment or folder were edited (the checksum recomputed); record's remedy options against values
# worked by hand (a GradScaler's schedule, the learning rate) and their usage errors; the learning-rate remedy of
# a bf16 Poisson regression whose exp overflows and the initial-scale remedy of an f16 model whose scaled
# gradients overflow, each verified by `fix --run`, the re-runs' /steps against plain runs with the remedy
# written in by hand; on a pseudo-terminal, fix without --run asks, and runs nothing on "n", everything on "yes".
# Usage: fix_test.py AMPSCOPE_BINARY WORK_DIR. Exit 77 (skipped) when this Python has no torch or h5py.
import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
import zlib

sys.dont_write_bytecode = True  # importing harness leaves no __pycache__ in the source tree
from harness import PYTHON, SCRIPTS, arguments, check, finish, require  # noqa: E402

h5py, np, _ = require("h5py", "numpy", "torch")  # torch: the scripts need it
AMPSCOPE, WORK = arguments("AMPSCOPE_BINARY", "WORK_DIR")
AMPSCOPE, WORK = os.path.abspath(AMPSCOPE), os.path.realpath(WORK) if os.path.exists(WORK) else WORK
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
WORK = os.path.realpath(WORK)
KEPT = ["CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED"]


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, cwd=kw.pop("cwd", WORK), **kw)


def config_of(path):
    with h5py.File(path, "r") as f:
        c = f.attrs["config"]
        return json.loads(c.decode() if isinstance(c, bytes) else c)


def steps_of(path):
    with h5py.File(path, "r") as f:
        return f["steps"][()]


def edit_config(src, dst, change):
    """A copy of src whose config attribute was rewritten by change(config) and attributes_crc32 recomputed, as
    someone who knows the format would (docs/trace-format.md)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        a = f.attrs
        c = json.loads(a["config"].decode())
        change(c)
        t = json.dumps(c).encode()
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(len(t) + 1)
        tid.set_strpad(h5py.h5t.STR_NULLTERM)
        del a["config"]
        a.create("config", np.array(t + b"\0", dtype="S%d" % (len(t) + 1)), dtype=h5py.Datatype(tid))
        text = b"".join(n.encode() + b"\0" + (a[n] if isinstance(a[n], bytes) else str(int(a[n])).encode()) + b"\0"
                        for n in ["format", "format_version", "precision", "device", "model", "seed", "config", "probe"])
        a["attributes_crc32"] = np.int64(zlib.crc32(text))


BCE = os.path.join(SCRIPTS, "bce_by_hand.py")
MARKER = os.path.join(WORK, "marker.txt")
env = dict(os.environ, OMP_NUM_THREADS="1", AMPSCOPE_TEST_NOT_KEPT="secret")

# --- 1. the trace keeps what a re-run needs: the command as given, the folder, the kept variables -----------
bce = os.path.join(WORK, "bce.h5")
cmd = [PYTHON, "bce_by_hand.py", "--marker", MARKER]
shutil.copy(BCE, os.path.join(WORK, "bce_by_hand.py"))  # a user's script in the folder they run it from
p = run([AMPSCOPE, "record", "--out", "bce.h5", "--"] + cmd, env=env)
check(p.returncode == 0, "bce: record exit %d: %s" % (p.returncode, p.stderr[-400:]))
config = config_of(bce)
want_env = {k: env[k] for k in KEPT if k in env}
check(config.get("command") == cmd and config.get("cwd") == WORK and config.get("env") == want_env,
      "bce: config %s (want command %s, cwd %s, env %s)" % (config, cmd, WORK, want_env))
check(open(MARKER).read() == "ran\n", "bce: the recorded run did not write the marker")
os.remove(MARKER)

# --- 2. without --run: the plan and every re-run's command line, exit 3, nothing run, nothing written --------
p = run([AMPSCOPE, "fix", "--after", "2", "bce.h5"])
check(p.returncode == 3, "bce: fix without --run exit %d (3: plan only): %s" % (p.returncode, p.stderr[-400:]))
check(not os.path.exists(MARKER), "bce: fix without --run ran the script (the marker exists)")
left = sorted(n for n in os.listdir(WORK) if n.startswith("bce.fix") or n.startswith(".bce.fix"))
check(left == [], "bce: fix without --run wrote %s" % left)
check("fix:   recorded command: %s\n" % " ".join(cmd) in p.stderr and "fix:   recorded folder: %s\n" % WORK in p.stderr
      and "fix:   recorded environment: OMP_NUM_THREADS=1" in p.stderr, "bce: plan %s" % p.stderr[:800])
line = [x for x in p.stderr.splitlines() if x.startswith("fix:     autocast-fp32-criterion: ")]
want_line = ("fix:     autocast-fp32-criterion: cd %s && OMP_NUM_THREADS=1 %s record --out %s --autocast-fp32 criterion "
             "--stop-after 2 -- %s bce_by_hand.py --marker %s" % (WORK, os.path.realpath(AMPSCOPE),
                                                                 os.path.join(WORK, "bce.fix-autocast-fp32-criterion.h5"),
                                                                 PYTHON, MARKER))
check(line == [want_line], "bce: the re-run's command line %s, want %s" % (line, want_line))
check("nothing was run" in p.stderr and "then run again with --run" in p.stderr, "bce: no word that nothing ran")
# The printed line is exact: typed into a shell (by this test, not by fix), it records the remedied run.
if line:
    sh = run(["/bin/sh", "-c", line[0][len("fix:     autocast-fp32-criterion: "):]], env=env)
    manual = os.path.join(WORK, "bce.fix-autocast-fp32-criterion.h5")
    check(sh.returncode == 0 and len(steps_of(manual)) == 3, "bce: the printed command line: exit %d %s" % (
        sh.returncode, sh.stderr[-300:]))
    for leftover in (manual, MARKER):
        if os.path.exists(leftover):
            os.remove(leftover)

# --- 3. --run: the module kept in f32 removes the NaN; the fp32 reference too; the original keeps it ----------
p = run([AMPSCOPE, "fix", "--run", "--json", "--after", "2", "bce.h5"])
check(p.returncode == 0, "bce: fix --run exit %d: %s" % (p.returncode, p.stderr[-600:]))
try:
    doc = json.loads(p.stdout)  # the script's prints went to stderr: stdout is fix's JSON alone
except ValueError:
    doc = {"runs": []}
    check(False, "bce: fix --json's stdout is not JSON: %s" % p.stdout[:300])
runs = {r["name"]: r for r in doc["runs"]}
check(sorted(runs) == ["autocast-fp32-criterion", "fp32", "original"], "bce: runs %s" % sorted(runs))
if len(runs) == 3:
    o, f, m = runs["original"], runs["fp32"], runs["autocast-fp32-criterion"]
    check(o["ran"] and not o["anomaly_gone"] and o["first_anomaly"] == "step 0, log in criterion" and doc["reproduced"],
          "bce: original %s" % o)
    check(f["ran"] and f["anomaly_gone"] and f["flag"] == "--autocast off --stop-after 2", "bce: fp32 %s" % f)
    check(m["ran"] and m["applied"] and m["anomaly_gone"] and m["verified"] and m["kind"] == "cast_f32" and
          m["flag"] == "--autocast-fp32 criterion --stop-after 2" and m["remedy_text"].startswith("sigmoid in criterion"),
          "bce: the f32 module %s" % m)
    check(doc["reads"] == ["bce.h5", os.path.join(WORK, "bce_by_hand.py")], "bce: reads %s" % doc["reads"])
    check(doc["verified"] == 1 and doc["replayed"]["command"] == cmd and doc["replayed"]["cwd"] == WORK,
          "bce: verified %s, replayed %s" % (doc["verified"], doc["replayed"]))
    kinds = [a.split(":")[0] for a in doc["not_verifiable"]]
    check("stable_formulation" in kinds and "clamp" in kinds, "bce: not verifiable %s" % kinds)
check(open(MARKER).read() == "ran\n" * 3, "bce: the script ran %d times, not 3" % open(MARKER).read().count("ran"))
fixed = os.path.join(WORK, "bce.fix-autocast-fp32-criterion.h5")
# Reference: the same script, plain python (no recorder), its criterion's forward in f32 by hand.
src = open(BCE).read()
by_hand = src.replace("    def forward(self, logits, y):\n        p = torch.sigmoid(logits)",
                      "    def forward(self, logits, y):\n        logits, y = logits.float(), y.float()\n"
                      "        with torch.autocast('cpu', enabled=False):\n            return self.f32(logits, y)\n\n"
                      "    def f32(self, logits, y):\n        p = torch.sigmoid(logits)")
by_hand = by_hand.replace('print(f"step {step} loss {loss.item():.4f}")', "print(repr(loss.item()))")
check(by_hand != src and "self.f32" in by_hand, "bce: the reference script was not made")
ref_path = os.path.join(WORK, "bce_f32_by_hand.py")
open(ref_path, "w").write(by_hand)
ref = run([PYTHON, ref_path, "--steps", "3"], env=env)
want = [float(x) for x in ref.stdout.split()]
got = [float(s["loss"]) for s in steps_of(fixed)]
check(len(want) == 3 and len(got) == 3 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got, want)),
      "bce: the f32-module re-run's losses %s, plain torch with criterion in f32 %s" % (got, want))
plain = [float(s["loss"]) for s in steps_of(bce)]
check(all(np.isnan(plain[:3])), "bce: the original's losses are not NaN: %s" % plain)
with h5py.File(fixed, "r") as fh:
    o = fh["ops"][()]
    strings, data = fh["strings"][()], fh["string_bytes"][()]
    off = [n for n in strings.dtype.names if "offset" in n][0]
    ln = [n for n in strings.dtype.names if n in ("length", "size", "bytes", "count")][0]
    txt = lambda i: bytes(data[strings[i][off]:strings[i][off] + strings[i][ln]]).decode()  # noqa: E731
    crit = [(txt(r["op"]), txt(r["out_dtype"])) for r in o if txt(r["module"]) == "criterion" and txt(r["phase"]) == "forward"]
check(crit and all(d == "f32" for _, d in crit) and ("sigmoid", "f32") in crit,
      "bce: criterion's forward ops in the re-run %s" % crit[:8])
r = run([AMPSCOPE, "report", "--json", fixed])
check(r.returncode == 0 and json.loads(r.stdout).get("anomalies") == [], "bce: report of the re-run exit %d %s" % (
    r.returncode, r.stdout[:300]))
r = run([AMPSCOPE, "report", "--json", "bce.h5"])
rems = json.loads(r.stdout)["anomalies"][0]["remedies"]
marks = [(x["kind"], x["verified"]) for x in rems]
check([k for k, v in marks if v] == ["cast_f32"] and any(x["kind"] == "cast_f32" and x["text"].startswith(
      "sigmoid in criterion") and x["verified"] for x in rems), "bce: report's verified marks %s" % marks)

# --- 4. a loss that fails in f32 too: no remedy applies, and fix says so --------------------------------------
p = run([AMPSCOPE, "record", "--out", "sharp.h5", "--", PYTHON, os.path.join(SCRIPTS, "sharp_loss.py")])
check(p.returncode == 0, "sharp: record exit %d" % p.returncode)
p = run([AMPSCOPE, "fix", "--run", "--after", "1", "sharp.h5"])
check(p.returncode == 1, "sharp: fix exit %d (1: none verified): %s" % (p.returncode, p.stderr[-400:]))
check("0 remedies verified" in p.stdout and "no remedy applied from outside the script removes the anomaly, and it "
      "remains in f32 (autocast off)" in p.stdout and "not verifiable from outside the script: stable_formulation: use "
      "log_softmax" in p.stdout, "sharp: table %s" % p.stdout)
doc = json.load(open(os.path.join(WORK, "sharp.fix.json")))
check(doc["verified"] == 0 and [r["anomaly_gone"] for r in doc["runs"]] == [False] * len(doc["runs"]),
      "sharp: results %s" % [(r["name"], r["anomaly_gone"]) for r in doc["runs"]])

# --- 5. edited traces: what a trace may make fix run ----------------------------------------------------------
M2 = os.path.join(WORK, "edited-marker.txt")
cases = [
    ("sh", lambda c: c.update(command=["/bin/sh", "-c", "touch " + M2]), 2,
     "the recorded command (/bin/sh -c touch %s) runs '/bin/sh', which is not a Python interpreter; fix re-runs only "
     "python, python3 or python3.N" % M2),
    ("dash_c", lambda c: c.update(command=[PYTHON, "-c", "open(%r, 'w')" % M2]), 2,
     "runs code given on its command line ('-c'), not a script file"),
    ("env", lambda c: c.update(env={"LD_PRELOAD": "/tmp/x.so"}), 2,
     "the recorded environment sets 'LD_PRELOAD', which `ampscope record` never keeps"),
    ("cwd", lambda c: c.update(cwd="/nonexistent-ampscope-folder"), 2,
     "the recorded command ran in '/nonexistent-ampscope-folder', which does not exist"),
    ("pip", lambda c: c.update(command=[PYTHON, "-m", "pip", "install", "--target", M2, "nothing"]), 2,
     "runs the module 'pip', which is not a file of the recorded folder"),
    ("no_script", lambda c: c.update(command=[PYTHON, "missing_script.py"]), 2,
     "the recorded script 'missing_script.py' is not a file"),
    ("module", lambda c: c.update(command=[PYTHON, "-u", "-m", "bce_by_hand", "--marker", M2]), 3,
     "fix:   interpreter: %s; module: bce_by_hand\n" % PYTHON),
    # Another script of the user's, another marker: allowed by the rule, so shown, and not run without --run.
    ("other", lambda c: c.update(command=[PYTHON, "bce_by_hand.py", "--marker", M2]), 3,
     "fix:   recorded command: %s bce_by_hand.py --marker %s\n" % (PYTHON, M2)),
]
for name, change, status, text in cases:
    path = os.path.join(WORK, "edited-%s.h5" % name)
    edit_config(bce, path, change)
    args = [AMPSCOPE, "fix", path] + (["--run"] if status == 2 else [])
    p = run(args)
    check(p.returncode == status and text in p.stderr, "edited %s: exit %d (want %d): %s" % (
        name, p.returncode, status, p.stderr[-500:]))
    check(not os.path.exists(M2), "edited %s: something ran (the marker exists)" % name)
p = run([AMPSCOPE, "fix", "--data", WORK, "bce.h5"])
check(p.returncode == 2 and "--data: 'bce.h5' is a recorded PyTorch run, whose script reads its own inputs" in p.stderr,
      "--data on a PyTorch run: exit %d: %s" % (p.returncode, p.stderr[-300:]))
# An output name planted as a link is refused before anything runs.
os.remove(os.path.join(WORK, "bce.fix-original.h5"))
os.symlink("/etc/hostname", os.path.join(WORK, "bce.fix-original.h5"))
p = run([AMPSCOPE, "fix", "--run", "bce.h5"])
check(p.returncode == 2 and "is a symbolic link" in p.stderr and open(MARKER).read() == "ran\n" * 3,
      "planted link: exit %d: %s" % (p.returncode, p.stderr[-300:]))
os.remove(os.path.join(WORK, "bce.fix-original.h5"))

# --- 6. record's remedy options: a GradScaler's schedule and the learning rate, worked by hand ---------------
p = run([AMPSCOPE, "record", "--out", "sc.h5", "--init-scale", "256", "--growth-interval", "3", "--lr-factor", "0.5",
         "--", PYTHON, os.path.join(SCRIPTS, "scaler_train.py")])
check(p.returncode == 0, "scaler: record exit %d: %s" % (p.returncode, p.stderr[-300:]))
# init 256, growth after 3 clean steps (the script's own: 1024 and 2), step 2's batch holds an inf: back off.
got = [(float(s["scale"]), float(s["scale_after"]), int(s["growth_tracker"]), float(s["lr"])) for s in steps_of(
    os.path.join(WORK, "sc.h5"))]
want = [(256, 256, 1, 0.005), (256, 256, 2, 0.005), (256, 128, 0, 0.005), (128, 128, 1, 0.005)]
check(got == want, "scaler: steps %s, by hand %s" % (got, want))
applied = config_of(os.path.join(WORK, "sc.h5"))["remedies"]["applied"]
check(applied == {"init_scale": 1, "growth_interval": 1, "lr_factor": 1}, "scaler: applied %s" % applied)
for args, text in ((["--autocast", "fp8"], "--autocast fp8: expected bf16"),
                   (["--lr-factor", "0"], "--lr-factor 0: expected a finite number > 0"),
                   (["--growth-interval", "-2"], "--growth-interval -2: expected an integer >= 1"),
                   (["--init-scale", "-1"], "--init-scale -1: expected a finite number > 0")):
    p = run([AMPSCOPE, "record", "--out", "bad.h5"] + args + ["--", PYTHON, BCE, "--marker", M2])
    check(p.returncode == 2 and text in p.stderr and not os.path.exists(M2), "record %s: exit %d: %s" % (
        args, p.returncode, p.stderr[-300:]))
p = subprocess.run([AMPSCOPE, "record", "--out", os.path.join(WORK, "att.h5"), "--attach", "--stop-after", "1"],
                   input="", capture_output=True, text=True)
check(p.returncode == 2 and "--attach records a process that started itself" in p.stderr, "attach: %s" % p.stderr)

# --autocast bf16: an autocast region asking for f16 (which torch 1.13's CPU autocast refuses: the script fails
# on entering it) runs in bf16; the script's own print of the output's dtype says which ran.
f16 = os.path.join(WORK, "f16_region.py")
open(f16, "w").write("import torch, warnings\nwarnings.simplefilter('ignore')\ntorch.manual_seed(0)\n"
                     "m = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                     "with torch.autocast('cpu', dtype=torch.float16):\n    y = m(torch.randn(3, 4))\n"
                     "print(y.dtype)\ny.float().sum().backward()\nopt.step()\n")
p = run([AMPSCOPE, "record", "--out", "f16.h5", "--", PYTHON, f16])
check(p.returncode == 1 and "AutocastCPU only support Bfloat16" in p.stderr, "f16 region: exit %d: %s" % (
    p.returncode, p.stderr[-300:]))
p = run([AMPSCOPE, "record", "--out", "f16.h5", "--autocast", "bf16", "--", PYTHON, f16])
prec = ""
if os.path.exists(os.path.join(WORK, "f16.h5")):
    with h5py.File(os.path.join(WORK, "f16.h5"), "r") as fh:
        prec = fh.attrs["precision"].decode()
check(p.returncode == 0 and p.stdout.strip() == "torch.bfloat16" and prec == "bf16",
      "--autocast bf16: exit %d, the script saw %s, trace precision %s" % (p.returncode, p.stdout.strip(), prec))

# --- 7. the learning-rate and initial-scale remedies, end to end: each applied, re-run and verified; the re-runs'
# /steps rows against plain runs of the scripts with the remedy written in by hand (no recorder) ----------------


def fix_json(trace, after):
    p = run([AMPSCOPE, "fix", "--run", "--json", "--after", str(after), trace])
    try:
        return p, {r["name"]: r for r in json.loads(p.stdout)["runs"]}
    except (ValueError, KeyError):
        return p, {}


def plain_losses(script, *args):
    out = run([PYTHON, script, *args], env=env).stdout
    return [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]


# A Poisson regression in bf16 at lr 0.3: the head's weights grow until exp overflows at step 5; lr 0.03 trains.
p = run([AMPSCOPE, "record", "--out", "poisson.h5", "--", PYTHON, os.path.join(SCRIPTS, "poisson_high_lr.py")],
        env=env)
check(p.returncode == 0, "poisson: record exit %d: %s" % (p.returncode, p.stderr[-300:]))
p, runs = fix_json("poisson.h5", 1)
# The model is stored in bf16 (every gradient bf16) with no autocast region: "autocast off" would not be an f32 run
# (here: the run again), so fix runs no f32 reference and says why (docs/pytorch.md).
check(p.returncode == 0 and sorted(runs) == ["lr-0.03", "original"], "poisson: fix exit %d, runs %s: %s" % (
    p.returncode, sorted(runs), p.stderr[-500:]))
skipped = json.loads(p.stdout).get("fp32_reference_skipped", "") if p.stdout.strip() else ""
check(skipped.startswith("every recorded gradient is bf16 ") and
      "fix:   not run: the fp32 reference (--autocast off): every recorded gradient is bf16 " in p.stderr,
      "poisson: the skipped f32 reference is not explained: %r" % skipped)
if "lr-0.03" in runs:
    r = runs["lr-0.03"]
    flag = r["flag"].split()
    factor = float(flag[1]) if flag[:1] == ["--lr-factor"] else float("nan")
    check(r["kind"] == "learning_rate" and abs(factor * 0.3 - 0.03) < 1e-12 and flag[2:] == ["--stop-after", "6"] and
          r["applied"] and r["anomaly_gone"] and r["verified"] and r["first_anomaly"] == "none",
          "poisson: the learning-rate run %s" % r)
    check(not runs["original"]["anomaly_gone"] and runs["original"]["first_anomaly"] == "step 5, exp",
          "poisson: original %s" % runs["original"])
    fixed_steps = steps_of(os.path.join(WORK, "poisson.fix-lr-0.03.h5"))
    orig_steps = steps_of(os.path.join(WORK, "poisson.fix-original.h5"))
    lrs = sorted({float(s["lr"]) for s in fixed_steps})
    check(len(fixed_steps) == 7 and len(lrs) == 1 and abs(lrs[0] - 0.3 * factor) <= 1e-15,
          "poisson: the re-run's steps %d, lr %s (want 7 steps at 0.3 x %r)" % (len(fixed_steps), lrs, factor))
    want = plain_losses(os.path.join(SCRIPTS, "poisson_high_lr.py"), "--lr", repr(lrs[0] if lrs else 0.03), "--steps",
                        "7")
    got = [float(s["loss"]) for s in fixed_steps]
    check(len(want) == 7 and len(got) == 7 and all(np.isfinite(got)) and
          all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got, want)),
          "poisson: the re-run's losses %s, plain torch at that lr %s" % (got, want))
    o = [float(s["loss"]) for s in orig_steps]
    check(len(o) == 7 and all(np.isfinite(o[:5])) and not np.isfinite(o[5]) and
          {float(s["lr"]) for s in orig_steps} == {0.3}, "poisson: the original re-run's losses %s" % o)

# An f16 model at GradScaler's default scale (2^16): every step's gradients overflow and are skipped; 1024 trains.
p = run([AMPSCOPE, "record", "--out", "scaled.h5", "--", PYTHON, os.path.join(SCRIPTS, "scaled_f16_train.py")],
        env=env)
check(p.returncode == 0, "scaled: record exit %d: %s" % (p.returncode, p.stderr[-300:]))
p, runs = fix_json("scaled.h5", 3)
check(p.returncode == 0 and "init-scale-1024" in runs, "scaled: fix exit %d, runs %s: %s" % (
    p.returncode, sorted(runs), p.stderr[-500:]))
if "init-scale-1024" in runs:
    r = runs["init-scale-1024"]
    check(r["kind"] == "init_scale" and r["flag"] == "--init-scale 1024 --stop-after 3" and r["applied"] and
          r["anomaly_gone"] and r["verified"], "scaled: the initial-scale run %s" % r)
    others = {n: x["anomaly_gone"] for n, x in runs.items() if n not in ("original", "init-scale-1024")}
    check(others and not any(others.values()), "scaled: other remedies removed the overflow too: %s" % others)
    # Every step skipped: no gradient rows, so the f32 reference runs; the script enters no autocast region, so it
    # disabled none: not applied (it re-ran the run unchanged), and the table says so.
    check("fp32" in runs and runs["fp32"]["ran"] and not runs["fp32"]["applied"], "scaled: fp32 %s" % runs.get("fp32"))
    fixed = steps_of(os.path.join(WORK, "scaled.fix-init-scale-1024.h5"))
    got = [(float(s["scale"]), bool(s["skipped"])) for s in fixed]
    check(got == [(1024.0, False)] * 4, "scaled: the re-run's (scale, skipped) %s, want 1024 and none skipped" % got)
    src = open(os.path.join(SCRIPTS, "scaled_f16_train.py")).read()
    by_hand = src.replace("scaler = CpuGradScaler(2.0 ** 16)", "scaler = CpuGradScaler(1024.0)")
    check(by_hand != src, "scaled: the reference script was not made")
    open(os.path.join(WORK, "scaled_1024_by_hand.py"), "w").write(by_hand)
    want = plain_losses(os.path.join(WORK, "scaled_1024_by_hand.py"), "--steps", "4")
    loss = [float(s["loss"]) for s in fixed]
    check(len(want) == 4 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(loss, want)) and want[3] < want[0],
          "scaled: the re-run's losses %s, plain torch with init_scale 1024 by hand %s" % (loss, want))
    orig = [(float(s["scale"]), bool(s["skipped"]))
            for s in steps_of(os.path.join(WORK, "scaled.fix-original.h5"))]
    # By hand: 2^16 halved after each skipped step.
    check(orig == [(65536.0, True), (32768.0, True), (16384.0, True), (8192.0, True)],
          "scaled: the original re-run's (scale, skipped) %s" % orig)

# --- 8. on a terminal, without --run: fix asks after the plan; "n" runs nothing (exit 3), "y" runs the re-runs ---


def on_terminal(args, answer, timeout=240):
    """Runs args with stdin and stderr on a pseudo-terminal, answers `answer` once the question is shown; returns
    the exit status, what the terminal showed and stdout."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=slave, stdout=subprocess.PIPE, stderr=slave, cwd=WORK)
    os.close(slave)
    shown, answered, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                break
            if not chunk:
                break
            shown += chunk
        if not answered and b"[y/N] " in shown:
            os.write(master, answer.encode())
            answered = True
        if proc.poll() is not None and not ready:
            break
    os.close(master)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.returncode, shown.decode(errors="replace").replace("\r\n", "\n"), proc.stdout.read().decode()


for leftover in [n for n in os.listdir(WORK) if n.startswith("bce.fix")] + ["marker.txt"]:
    if os.path.exists(os.path.join(WORK, leftover)):
        os.remove(os.path.join(WORK, leftover))
question = "fix: run the 3 re-runs above (the recorded command, from the trace)? [y/N] "
status, shown, stdout = on_terminal([AMPSCOPE, "fix", "--after", "0", "bce.h5"], "n\n")
check(status == 3 and question in shown and "fix:     autocast-fp32-criterion: cd " in shown.split(question)[0] and
      "fix: nothing was run" in shown, "terminal, answer n: exit %d, shown %s" % (status, shown[-700:]))
check(not os.path.exists(MARKER) and not [n for n in os.listdir(WORK) if n.startswith("bce.fix")],
      "terminal, answer n: something ran or was written: %s" % sorted(os.listdir(WORK)))
status, shown, stdout = on_terminal([AMPSCOPE, "fix", "--after", "0", "bce.h5"], " Yes\n")
check(status == 0 and question in shown and "1 remedy verified" in stdout, "terminal, answer yes: exit %d, shown %s, "
      "stdout %s" % (status, shown[-500:], stdout[-500:]))
check(os.path.exists(MARKER) and open(MARKER).read() == "ran\n" * 3, "terminal, answer yes: the script did not run 3 "
      "times")
if os.path.exists(os.path.join(WORK, "bce.fix.json")):
    doc = json.load(open(os.path.join(WORK, "bce.fix.json")))
    check([(r["name"], r["anomaly_gone"]) for r in doc["runs"]] == [("original", False), ("fp32", True),
                                                                    ("autocast-fp32-criterion", True)],
          "terminal, answer yes: results %s" % [(r["name"], r["anomaly_gone"]) for r in doc["runs"]])
else:
    check(False, "terminal, answer yes: no results file")
# Stdin on a terminal but stderr not (the question would not be seen): no question, exit 3.
master, slave = pty.openpty()
p = subprocess.run([AMPSCOPE, "fix", "--after", "0", "bce.h5"], stdin=slave, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, cwd=WORK, timeout=60)
os.close(slave)
os.close(master)
check(p.returncode == 3 and b"[y/N]" not in p.stderr, "stdin on a terminal, stderr a pipe: exit %d: %s" % (
    p.returncode, p.stderr[-300:]))

finish()
