"""What the plain-PyTorch references of the model tests share (tests/hf/reference_common.py,
tests/hf_t5/reference_t5.py): a safetensors reader written from the format's specification (8-byte
little-endian header length, JSON header, byte buffer), the folder's config.json, and the printing the C++
side reads back (tests/support/python_reference.h): one line per result, its name and its values as
float.hex() strings. A script finds this module with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
"""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64}


def read_safetensors(path):
    """name -> tensor, in the file's dtypes and shapes (the __metadata__ entry skipped)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buffer = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(buffer[begin:end])
        t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def read_config(folder):
    with open(folder + "/config.json") as f:
        return json.load(f)


def hexes(t):
    """A tensor's values, flattened, as float.hex() strings separated by spaces."""
    return " ".join(float(v).hex() for v in t.detach().double().reshape(-1).tolist())

