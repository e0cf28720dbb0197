# Reading a recorded trace back for the record tests (record_test.py, record_options_test.py): the /ops rows with
# their texts, /steps, /grads, /histograms, and the f64 references the tests compare them with.
import h5py
import numpy as np


def text(f, ids):
    strings, data = f["strings"], f["string_bytes"]
    table = strings[()]
    offset_field = [n for n in table.dtype.names if "offset" in n][0]
    length_field = [n for n in table.dtype.names if n in ("length", "size", "bytes", "count")][0]
    raw = data[()]
    return [bytes(raw[table[i][offset_field]:table[i][offset_field] + table[i][length_field]]).decode() for i in ids]


def ops(path):
    with h5py.File(path, "r") as f:
        o = f["ops"][()]
        rows = []
        names = {k: text(f, o[k]) for k in ("phase", "op", "module", "out_dtype", "in_dtypes", "shape")}
        for i in range(len(o)):
            r = {k: o[k][i] for k in o.dtype.names}
            r.update({k: names[k][i] for k in names})
            rows.append(r)
        steps = f["steps"][()]
        grads = f["grads"][()]
        gnames = text(f, grads["param"])
        complete = int(f.attrs["complete"])
        precision = f.attrs["precision"].decode()
    return rows, steps, grads, gnames, complete, precision


def histograms(path):
    """[(step, seq, tensor, bins as a list)] of /histograms (empty when the trace has none)."""
    with h5py.File(path, "r") as f:
        if "histograms" not in f or len(f["histograms"]) == 0:
            return []
        h = f["histograms"][()]
        names = text(f, h["tensor"])
        return [(int(h["step"][i]), int(h["seq"][i]), names[i], [int(b) for b in h["bins"][i]]) for i in range(len(h))]


def health_f64(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    fin = x[np.isfinite(x)]
    return {"numel": x.size, "nan": int(np.isnan(x).sum()), "pos_inf": int((x == np.inf).sum()),
            "neg_inf": int((x == -np.inf).sum()), "zero": int((fin == 0).sum()), "min": fin.min(), "max": fin.max(),
            "absmax": np.abs(fin).max(), "mean": fin.mean(), "rms": np.sqrt((fin * fin).mean())}


def histogram_f64(x, tiny):
    """The exponent histogram of docs/trace-format.md (/histograms) by numpy: bins[e + 64] for floor(log2|x|) = e
    in -64..63 (larger in the last), then subnormal (0 < |x| < tiny, the dtype's smallest normal, or below
    2^-64), zero, inf, NaN. frexp gives the exponent exactly (x = m * 2^k, m in [0.5, 1): e = k - 1)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    bins = [0] * 132
    bins[131] = int(np.isnan(x).sum())
    bins[130] = int(np.isinf(x).sum())
    a = np.abs(x[np.isfinite(x)])
    bins[129] = int((a == 0).sum())
    nz = a[a != 0]
    e = np.frexp(nz)[1].astype(np.int64) - 1
    sub = (nz < tiny) | (e < -64)
    bins[128] = int(sub.sum())
    for k in np.minimum(e[~sub], 63):
        bins[int(k) + 64] += 1
    return bins


def close(a, b, rel=1e-12):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)
