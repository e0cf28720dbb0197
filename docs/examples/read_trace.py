#!/usr/bin/python3
"""Reads a finished ampscope trace into pandas DataFrames with h5py (docs/trace-format.md quotes this file).

    /usr/bin/python3 docs/examples/read_trace.py run.h5 [CSV_DIR]

Prints each step, the first ops and the ops whose output holds NaN or inf. With CSV_DIR (what
`ampscope export run.h5 --csv CSV_DIR` wrote) it reads the ops from ops.csv too. Debian: python3-h5py,
python3-pandas. A CI test runs it on a trace the tests write and checks what it prints.
"""
import json
import sys

import h5py
import numpy as np
import pandas as pd


def read_texts(f):
    """Every text of the trace, indexed by its id: /strings locates each one in /string_bytes."""
    blob = f["string_bytes"][:].tobytes()
    s = f["strings"][:]
    return pd.Series([blob[o:o + n].decode() for o, n in zip(s["offset"], s["length"])], dtype=object)


def read_table(f, name, texts):
    """A table as a DataFrame: the fields named in its text_fields attribute become their texts, array
    fields (the inputs of /ops, the bins of /histograms) one column per element, /ops' absmax_xor absmax."""
    rows = f[name][:]
    text_fields = f[name].attrs["text_fields"].decode().split(",") if "text_fields" in f[name].attrs else []
    columns = {}
    for field in rows.dtype.names:
        values = rows[field]
        if values.ndim == 2:
            for i in range(values.shape[1]):
                columns[f"{field}_{i}"] = values[:, i]
        elif field in text_fields:
            columns[field] = texts[values].to_numpy()
        elif field == "absmax_xor":  # format_version 9: absmax's bits XOR those of max(|min|, |max|)
            derived = np.maximum(np.abs(rows["min"]), np.abs(rows["max"]))
            columns["absmax"] = (derived.view(np.uint64) ^ values).view(np.float64)
        else:
            columns[field] = values
    return pd.DataFrame(columns)


def read_ops_csv(csv_dir):
    """The same table from ops.csv: texts as strings (a module may be named "0" or "nan"), nan as NaN."""
    texts = ["phase", "op", "module", "in_dtypes", "out_dtype", "shape", "autocast"]
    ops = pd.read_csv(f"{csv_dir}/ops.csv", keep_default_na=False, dtype={c: str for c in texts})
    floats = ["min", "max", "absmax", "mean", "rms"]
    ops[floats] = ops[floats].astype(float)
    return ops


def show_ops(label, ops, count):
    for o in ops.head(count).itertuples():
        # json.dumps shows a text quoted; repr a float exactly.
        print(label, o.step, o.seq, o.phase, json.dumps(o.op), json.dumps(o.module), repr(o.mean), repr(o.absmax), o.inputs_0)


def main():
    with h5py.File(sys.argv[1], "r") as f:
        assert int(f.attrs["format_version"]) >= 4, "format_version 1 to 3 store texts in the rows: f['ops']['op'] gives bytes"
        texts = read_texts(f)
        steps = read_table(f, "steps", texts)
        ops = read_table(f, "ops", texts)
    print("steps", len(steps))
    for s in steps.itertuples():
        print("step", s.step, repr(s.loss), repr(s.scale), s.skipped)
    print("ops", len(ops))
    show_ops("op", ops, 20)
    nonfinite = ops[ops.nan + ops.pos_inf + ops.neg_inf > 0]
    print("nonfinite", len(nonfinite), json.dumps(sorted(set(nonfinite.op))))
    if len(sys.argv) > 2:
        csv = read_ops_csv(sys.argv[2])
        print("csv ops", len(csv))
        show_ops("csv op", csv, 20)


if __name__ == "__main__":
    main()
