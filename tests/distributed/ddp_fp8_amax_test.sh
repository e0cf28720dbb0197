#!/bin/bash
# --precision fp8 --ddp: the delayed recipe's amaxes are reduced over the ranks before each scale update, as
# TransformerEngine does (cli/run.cpp reduce_fp8_amaxes; docs/fp8.md), so both ranks cast with the same scales.
# `mpirun -np 2 ampscope train --ddp --precision fp8` on the mlp sample: each rank trains on its own half of each
# batch, so their input and grad_output amaxes differ. From the two ranks' /fp8 rows (h5py): in every step both
# ranks' scales are equal bit for bit, and equal to the scale computed here in f32 from the max of the two ranks'
# recorded amaxes over the earlier steps (history 1024 > steps: the window holds them all): fl(fp8_max / m), 1 in
# step 0. And the reduction is not vacuous: some amaxes differ between the ranks, and some scale differs from the
# one this rank's own amaxes alone would give. Skips (77) without an MPI launcher or without h5py.
#   tests/distributed/ddp_fp8_amax_test.sh LAUNCHER AMPSCOPE
set -u
launcher=$1 ampscope=$(realpath "$2")
if [ -z "$launcher" ] || ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: this build has no MPI launcher (AMPSCOPE_MPI=OFF, or openmpi-bin is missing: scripts/setup.sh)"
  exit 77
fi
if ! /usr/bin/python3 -c "import h5py, numpy" 2>/dev/null; then
  echo "skipped: Debian's /usr/bin/python3 with python3-h5py and numpy is needed (scripts/setup.sh)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
if ! timeout 120 "$launcher" --oversubscribe -np 2 "$ampscope" train --sample mlp --steps 6 --batch 16 --device cpu \
    --precision fp8 --out run.h5 --ddp >log 2>&1; then
  echo "FAIL: the run failed"; sed 's/^/   | /' log | tail -20; exit 1
fi
/usr/bin/python3 - <<'PY'
import sys
import h5py
import numpy as np

def rows(path):
    with h5py.File(path, "r") as f:
        s = f["strings"][:]
        text = f["string_bytes"][:].tobytes()
        names = [text[o:o + l].decode() for o, l in zip(s["offset"], s["length"])]
        return {(int(r["step"]), names[r["module"]], names[r["operand"]]):
                (names[r["format"]], np.float32(r["amax"]), np.float32(r["scale"])) for r in f["fp8"][:]}

r0, r1 = rows("run.rank0.h5"), rows("run.rank1.h5")
failures = 0
def fail(msg):
    global failures
    print("FAIL:", msg); failures += 1

if set(r0) != set(r1) or not r0:
    fail(f"the ranks recorded different /fp8 rows: {len(r0)} and {len(r1)}")
steps = sorted({k[0] for k in r0})
if steps != list(range(6)):
    fail(f"/fp8 rows for steps {steps}, not 0 to 5")
operands = sorted({k[1:] for k in r0})
if len(operands) != 9:
    fail(f"{len(operands)} operands, not 9 (fc1, fc2, fc3 x input, weight, grad_output)")
amax_differ = own_differs = 0
for module, operand in operands:
    fmax = np.float32(448.0 if r0[(0, module, operand)][0] == "e4m3" else 57344.0)
    reduced = own = np.float32(0)
    for t in steps:
        fmt0, a0, s0 = r0[(t, module, operand)]
        fmt1, a1, s1 = r1[(t, module, operand)]
        want = np.float32(1) if reduced == 0 else np.float32(fmax / reduced)
        if s0.tobytes() != s1.tobytes():
            fail(f"step {t} {module} {operand}: scales differ between the ranks ({s0!r}, {s1!r})")
        if s0.tobytes() != want.tobytes():
            fail(f"step {t} {module} {operand}: scale {s0!r}, expected {want!r} = {fmax} / max over ranks and steps {reduced!r}")
        own_scale = np.float32(1) if own == 0 else np.float32(fmax / own)
        if own_scale.tobytes() != want.tobytes():
            own_differs += 1
        if a0 != a1:
            amax_differ += 1
        reduced = max(reduced, a0, a1)
        own = max(own, a0)
if amax_differ == 0:
    fail("the ranks' amaxes never differ: the test shows nothing")
if own_differs == 0:
    fail("rank 0's own amaxes would give the same scales: the test shows nothing")
if not failures:
    print(f"{len(operands)} operands x {len(steps)} steps: scales equal on both ranks and to the reduced amaxes' "
          f"({amax_differ} amaxes differ between the ranks; {own_differs} scales differ from rank 0's own)")
sys.exit(1 if failures else 0)
PY
