"""An independent safetensors reference, written from the format's specification with struct, json and numpy.

  reference.py write PATH   writes the file the C++ test expects to read (values listed in EXPECTED)
  reference.py check PATH   reads the C++ writer's file and checks its values against EXPECTED
Exits 77 when numpy is missing (the C++ test skips then), 1 with a message on any mismatch.
"""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is missing")
    sys.exit(77)

# name -> (safetensors dtype, numpy dtype, shape, values). bf16 has no numpy type: its values are
# the f32 numbers whose lower 16 bits are zero, stored as their upper halves.
EXPECTED = {
    "f32": ("F32", "<f4", [2, 3], [1.5, -0.0, float("inf"), 1.401298464324817e-45, -3.25, 65504.0]),
    "f16": ("F16", "<f2", [4], [0.333251953125, -0.0, 5.960464477539063e-08, 65504.0]),
    "bf16": ("BF16", None, [3], [1.0, -2.5, 3.3895313892515355e38]),
    "f64": ("F64", "<f8", [2], [0.1, -1e-310]),
    "i64": ("I64", "<i8", [3], [-(2**63), 0, 2**63 - 1]),
    "scalar": ("F32", "<f4", [], [7.0]),
    "empty": ("F16", "<f2", [0, 2], []),
}
METADATA = {"format": "pt", "source": "reference.py"}


def encode(dtype, np_dtype, values):
    if dtype == "BF16":
        f32 = np.array(values, dtype="<f4").view("<u4")
        return (f32 >> 16).astype("<u2").tobytes()
    return np.array(values, dtype=np_dtype).tobytes()


def decode(dtype, np_dtype, raw):
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).view("<f4")
    return np.frombuffer(raw, dtype=np_dtype)


def write(path):
    header, buffer = {"__metadata__": METADATA}, b""
    for name, (dtype, np_dtype, shape, values) in EXPECTED.items():
        data = encode(dtype, np_dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buffer), len(buffer) + len(data)]}
        buffer += data
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + buffer)


def check(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 != 0:
        sys.exit(f"header length {n} is not a multiple of 8")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    buffer = blob[8 + n :]
    if header.pop("__metadata__", None) != METADATA:
        sys.exit("metadata differs")
    if list(header) != sorted(header):
        sys.exit(f"tensors not in name order: {list(header)}")
    if sorted(header) != sorted(EXPECTED):
        sys.exit(f"tensor names differ: {sorted(header)}")
    end = 0
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        dtype, np_dtype, shape, values = EXPECTED[name]
        begin, stop = entry["data_offsets"]
        if entry["dtype"] != dtype or entry["shape"] != shape or begin != end:
            sys.exit(f"{name}: entry {entry} does not match {dtype} {shape} at {end}")
        end = stop
        got = decode(dtype, np_dtype, buffer[begin:stop])
        want = np.array(values, dtype="<f8" if dtype != "I64" else "<i8")
        if got.shape != want.shape or not all(
            (g == w and np.signbit(g) == np.signbit(w)) for g, w in zip(got.tolist(), want.tolist())
        ):
            sys.exit(f"{name}: values {got.tolist()} differ from {want.tolist()}")
    if end != len(buffer):
        sys.exit(f"buffer is {len(buffer)} bytes, tensors cover {end}")
    print("ok")


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
