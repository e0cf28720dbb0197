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


def ops_absmax(o):
    """/ops' absmax: format_version 9 stores absmax_xor, its bits XOR those of max(|min|, |max|)
    (docs/trace-format.md); older traces store absmax."""
    if "absmax_xor" not in o.dtype.names:
        return o["absmax"]
    derived = np.maximum(np.abs(o["min"]), np.abs(o["max"]))
    return (derived.view(np.uint64) ^ o["absmax_xor"]).view(np.float64)


def ops(path):
    with h5py.File(path, "r") as f:
        o = f["ops"][()]
        rows = []
        names = {k: text(f, o[k]) for k in ("phase", "op", "module", "out_dtype", "in_dtypes", "shape")}
        absmax = ops_absmax(o)
        for i in range(len(o)):
            r = {k: o[k][i] for k in o.dtype.names}
            r.update({k: names[k][i] for k in names})
            r["absmax"] = absmax[i]
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


# The recorder's sums for an f32, bf16 or f16 tensor are accumulated in f32 (docs/pytorch.md, "Statistics"): in any
# order of the n - 1 additions, |sum - exact| <= gamma_(n-1) * sum|x_i| (gamma_k = k u / (1 - k u), u = 2^-24), and
# the sum of squares within gamma_n * sum x_i^2 + n * 2^-149 (each square rounded once, by u relative or by half
# the smallest subnormal spacing, 2^-150, where it underflows). The bounds below add the last double roundings
# (the division by n, the square root: 2^-52 relative each) and the reference's own f64 summation error
# (n * 2^-53 of the same sums), so that a statistic outside them is wrong, not rounded.
U32, U64 = 2.0 ** -24, 2.0 ** -53


def gamma(k, u=U32):
    return k * u / (1 - k * u)


def moment_bounds(fin):
    """(mean bound, rms bound, sum of squares, its bound) for the finite values fin (f64 numpy) as the recorder's
    f32-accumulated statistics may differ from their exact values."""
    m = fin.size
    if m == 0:
        return 0.0, 0.0, 0.0, 0.0
    s1, q = float(np.abs(fin).sum()), float((fin * fin).sum())
    mean = float(fin.sum()) / m
    mean_bound = (gamma(m - 1) + gamma(m, U64)) * s1 / m + 4 * U64 * abs(mean)
    q_bound = (gamma(m) + gamma(m, U64)) * q + m * 2.0 ** -149
    rms = (q / m) ** 0.5
    # |sqrt(a) - sqrt(b)| <= |a - b| / sqrt(b); the all-zero tensor has q = 0, summed exactly (bound 0).
    rms_bound = (q_bound / m) / rms + 4 * U64 * rms if rms > 0 else 0.0
    return mean_bound, rms_bound, q, q_bound


def health_f64(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    fin = x[np.isfinite(x)]
    mean_bound, rms_bound, _, _ = moment_bounds(fin)
    return {"numel": x.size, "nan": int(np.isnan(x).sum()), "pos_inf": int((x == np.inf).sum()),
            "neg_inf": int((x == -np.inf).sum()), "zero": int((fin == 0).sum()), "min": fin.min(), "max": fin.max(),
            "absmax": np.abs(fin).max(), "mean": fin.mean(), "rms": np.sqrt((fin * fin).mean()),
            "mean_bound": mean_bound, "rms_bound": rms_bound}


def stat_ok(row, h, k):
    """A recorded statistic k against health_f64's reference h: the extremes exactly (values of the tensor; 1e-12
    for the conversions on the way), the mean and rms within the derived bounds above."""
    if k in ("mean", "rms"):
        return abs(float(row[k]) - float(h[k])) <= h[k + "_bound"]
    return close(float(row[k]), float(h[k]))


def norm_bound(grads):
    """(f64 norm, bound) of the gradients (f64 numpy arrays) taken together, as the recorder's grad_norm may differ
    from it: each gradient's sum of squares within moment_bounds' bound, the total's square root as above."""
    q = q_bound = 0.0
    for g in grads:
        _, _, qg, bg = moment_bounds(np.asarray(g, dtype=np.float64).ravel())
        q, q_bound = q + qg, q_bound + bg
    norm = q ** 0.5
    return norm, (q_bound / norm + 8 * U64 * norm if norm > 0 else 0.0)


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
