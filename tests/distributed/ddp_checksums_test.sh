#!/bin/bash
# The /checksums of a data-parallel run against an independent implementation of the documented formula
# (docs/trace-format.md, /checksums; Python integers, mod 2^64): `mpirun -np 2 ampscope train --ddp
# --save-model` writes rank 0's weights after the last step, and each parameter's checksum computed in Python
# from those bytes must equal the one both ranks' traces recorded after that step, and the combined one must be
# the checksum of the parameters' checksums. Skips (77) without an MPI launcher or without h5py.
#   tests/distributed/ddp_checksums_test.sh LAUNCHER AMPSCOPE
set -u
launcher=$1 ampscope=$(realpath "$2")
if [ -z "$launcher" ] || ! command -v "$launcher" >/dev/null 2>&1; then
  echo "skipped: this build has no MPI launcher (AMPSCOPE_MPI=OFF, or openmpi-bin is missing: scripts/setup.sh)"
  exit 77
fi
if ! /usr/bin/python3 -c "import h5py" 2>/dev/null; then
  echo "skipped: Debian's /usr/bin/python3 with python3-h5py is needed (scripts/setup.sh)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
if ! timeout 120 "$launcher" --oversubscribe -np 2 "$ampscope" train --sample mlp --steps 3 --batch 8 --device cpu \
    --out run.h5 --save-model model --ddp >log 2>&1; then
  echo "FAIL: the run failed"; sed 's/^/   | /' log | tail -20; exit 1
fi
/usr/bin/python3 - <<'PY'
import json, struct, sys
import h5py

M = (1 << 64) - 1
def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def checksum(data):
    n = len(data)
    data += bytes(-n % 8)
    total = mix(n)
    for i in range(len(data) // 8):
        total += mix((int.from_bytes(data[8 * i:8 * i + 8], "little") + (i + 1) * 0x9E3779B97F4A7C15) & M)
    return total & M

blob = open("model/model.safetensors", "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
weights = {k: blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
failures = 0
for rank in (0, 1):
    with h5py.File(f"run.rank{rank}.h5", "r") as f:
        s = f["strings"][:]
        text = f["string_bytes"][:].tobytes()
        names = [text[o:o + l].decode() for o, l in zip(s["offset"], s["length"])]
        rows = [(int(r["step"]), names[r["param"]], int(r["checksum"])) for r in f["checksums"][:]]
    steps = sorted({r[0] for r in rows})
    if steps != [0, 1, 2]:
        print(f"FAIL: rank {rank}: checksum rows for steps {steps}, not 0 to 2"); failures += 1; continue
    last = [(p, c) for st, p, c in rows if st == 2]
    params = [(p, c) for p, c in last if p]
    if [p for p, _ in params] != ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]:
        print(f"FAIL: rank {rank}: parameters {[p for p, _ in params]}"); failures += 1
    for p, c in params:
        if checksum(weights[p]) != c:
            print(f"FAIL: rank {rank}: {p}: recorded {c}, Python {checksum(weights[p])}"); failures += 1
    combined = [c for p, c in last if not p]
    want = checksum(b"".join(c.to_bytes(8, "little") for _, c in params))
    if combined != [want]:
        print(f"FAIL: rank {rank}: combined {combined}, Python {want}"); failures += 1
print("checksums: every recorded checksum equals the Python reference" if failures == 0 else f"{failures} failures")
sys.exit(1 if failures else 0)
PY
