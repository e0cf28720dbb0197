"""Makes a trace of a `--model` run look as ampscope wrote it before issue 31: its config gains the unused
default "sample": "mlp" in front (what every --model trace recorded then); attributes_crc32 is recomputed
with docs/trace-format.md's recipe, so the trace is valid. Exit 3 when h5py is missing.

Usage: old_model_trace.py TRACE
"""
import json
import sys
import zlib

try:
    import h5py
    import numpy as np
except ImportError:
    sys.exit(3)

NAMES = ["format", "format_version", "precision", "device", "model", "seed", "config", "probe"]


def set_text(attrs, name, text):
    data = text.encode()
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(data) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    attrs.create(name, np.array(data, dtype="S%d" % (len(data) + 1)), dtype=h5py.Datatype(tid))


with h5py.File(sys.argv[1], "r+") as f:
    a = f.attrs
    config = json.loads(a["config"].decode())
    assert "sample" not in config, config
    set_text(a, "config", json.dumps({"sample": "mlp", **config}, separators=(",", ":")))
    text = b"".join(n.encode() + b"\0" + (a[n] if isinstance(a[n], bytes) else str(int(a[n])).encode()) + b"\0"
                    for n in NAMES)
    a.modify("attributes_crc32", np.int64(zlib.crc32(text)))
