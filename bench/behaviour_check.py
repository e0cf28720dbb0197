"""Helpers of bench/behaviour_check.sh (run with Debian's /usr/bin/python3: numpy and h5py). Subcommands:

  models DIR            write DIR/gpt2/ and DIR/t5/ (config.json + model.safetensors: tiny, random, seeded, so
                        every call writes the same bytes) and DIR/tokens.txt (400 token ids below 96)
  csv SRC DST           copy each SRC/*.csv to DST, leaving out the columns of EXCLUDED_CSV; a file with none of
                        them is copied byte for byte; prints the data rows copied
  json SRC DST          write the JSON document SRC to DST one value per line (diff-friendly), leaving out the
                        keys of EXCLUDED_JSON at any depth; numbers keep their text exactly as written
  h5meta TRACE          print what the CSV export does not show of a trace: every root attribute (the config and
                        probe JSON, attributes_crc32 included), and each dataset's type, shape, chunks, filters
                        and attributes

What is excluded, and why, is said in bench/behaviour_check.sh's header.
"""
import csv
import io
import json
import os
import struct
import sys

# Wall time: differs between two runs of the same binary (docs/trace-format.md, /steps).
EXCLUDED_CSV = {"steps.csv": {"time_ms"}}
# The report and diff JSON hold no wall time (docs/report-format.md): nothing to leave out today.
EXCLUDED_JSON = set()


# ---------------------------------------------------------------------------------------------------- models
def write_safetensors(path, tensors):
    """tensors: (name, float32 numpy array) in order. 8-byte little-endian header length, JSON header (padded
    with spaces to a multiple of 8), then the raw little-endian data."""
    header, chunks, offset = {}, [], 0
    for name, a in tensors:
        data = a.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def write_folder(folder, config, tensors):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
        f.write("\n")
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)


def gpt2_folder(folder, rng):
    """GPT2LMHeadModel's shapes (Conv1D weights [in, out]), names without the "transformer." prefix, tied head."""
    c = {"model_type": "gpt2", "vocab_size": 96, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4,
         "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "initializer_range": 0.02}
    d, inner, std = c["n_embd"], 4 * c["n_embd"], c["initializer_range"]
    normal = lambda *shape: rng.normal(0.0, std, shape)  # noqa: E731
    ln = lambda: [(".weight", 1.0 + rng.normal(0.0, 0.1, (d,))), (".bias", rng.normal(0.0, 0.02, (d,)))]  # noqa: E731
    t = [("wte.weight", normal(c["vocab_size"], d)), ("wpe.weight", normal(c["n_positions"], d))]
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        t += [(p + "ln_1" + s, v) for s, v in ln()]
        t += [(p + "attn.c_attn.weight", normal(d, 3 * d)), (p + "attn.c_attn.bias", normal(3 * d)),
              (p + "attn.c_proj.weight", normal(d, d)), (p + "attn.c_proj.bias", normal(d))]
        t += [(p + "ln_2" + s, v) for s, v in ln()]
        t += [(p + "mlp.c_fc.weight", normal(d, inner)), (p + "mlp.c_fc.bias", normal(inner)),
              (p + "mlp.c_proj.weight", normal(inner, d)), (p + "mlp.c_proj.bias", normal(d))]
    t += [("ln_f" + s, v) for s, v in ln()]
    write_folder(folder, c, t)


def t5_folder(folder, rng):
    """T5 v1.0 (relu feed-forward, head tied to shared), HF's names; torch Linear weights [out, in]."""
    c = {"model_type": "t5", "vocab_size": 96, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
         "num_decoder_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8,
         "relative_attention_max_distance": 16, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0,
         "feed_forward_proj": "relu", "dropout_rate": 0.1, "is_encoder_decoder": True, "pad_token_id": 0,
         "eos_token_id": 1, "decoder_start_token_id": 0}
    d, inner, ff, heads = c["d_model"], c["num_heads"] * c["d_kv"], c["d_ff"], c["num_heads"]
    normal = lambda std, *shape: rng.normal(0.0, std, shape)  # noqa: E731
    norm = lambda: 1.0 + rng.normal(0.0, 0.1, (d,))  # noqa: E731

    def attention(p, bias):
        t = [(p + "q.weight", normal((d * c["d_kv"]) ** -0.5, inner, d)), (p + "k.weight", normal(d ** -0.5, inner, d)),
             (p + "v.weight", normal(d ** -0.5, inner, d)), (p + "o.weight", normal(inner ** -0.5, d, inner))]
        if bias:
            t.append((p + "relative_attention_bias.weight", normal(d ** -0.5, c["relative_attention_num_buckets"], heads)))
        return t

    def feed_forward(p):
        return [(p + "DenseReluDense.wi.weight", normal(d ** -0.5, ff, d)),
                (p + "DenseReluDense.wo.weight", normal(ff ** -0.5, d, ff)), (p + "layer_norm.weight", norm())]

    t = [("shared.weight", normal(1.0, c["vocab_size"], d))]
    for stack, layers in (("encoder", c["num_layers"]), ("decoder", c["num_decoder_layers"])):
        for i in range(layers):
            p = f"{stack}.block.{i}.layer."
            t += attention(p + "0.SelfAttention.", i == 0) + [(p + "0.layer_norm.weight", norm())]
            if stack == "decoder":
                t += attention(p + "1.EncDecAttention.", False) + [(p + "1.layer_norm.weight", norm())]
            t += feed_forward(p + ("2." if stack == "decoder" else "1."))
        t.append((f"{stack}.final_layer_norm.weight", norm()))
    write_folder(folder, c, t)


def models(out):
    import numpy as np

    gpt2_folder(os.path.join(out, "gpt2"), np.random.default_rng(5))
    t5_folder(os.path.join(out, "t5"), np.random.default_rng(7))
    with open(os.path.join(out, "tokens.txt"), "w") as f:  # a fixed, non-repeating pattern below 96
        f.write("\n".join(" ".join(str((i * 37 + i // 7) % 96) for i in range(r, r + 20)) for r in range(0, 400, 20)))
        f.write("\n")


# ---------------------------------------------------------------------------------------------------- csv
def copy_csv(src, dst):
    os.makedirs(dst, exist_ok=True)
    rows = 0
    for name in sorted(os.listdir(src)):
        if not name.endswith(".csv"):
            continue
        with open(os.path.join(src, name), "rb") as f:
            data = f.read()
        rows += max(0, data.count(b"\n") - 1)  # a row's text may hold a line break: close enough for a count
        drop = EXCLUDED_CSV.get(name, set())
        if drop:
            table = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
            keep = [i for i, column in enumerate(table[0]) if column not in drop] if table else []
            out = io.StringIO()
            w = csv.writer(out, lineterminator="\n")
            for row in table:
                w.writerow([row[i] for i in keep if i < len(row)])
            data = out.getvalue().encode("utf-8")
        with open(os.path.join(dst, name), "wb") as f:
            f.write(data)
    print(rows)


# ---------------------------------------------------------------------------------------------------- json
class Number(str):
    """A JSON number kept as the text the program wrote."""


def render(v, indent, out):
    pad = " " * indent
    if isinstance(v, dict):
        items = [(k, x) for k, x in v.items() if k not in EXCLUDED_JSON]
        if not items:
            out.append("{}")
            return
        out.append("{\n")
        for n, (k, x) in enumerate(items):
            out.append(pad + " " + json.dumps(k, ensure_ascii=False) + ": ")
            render(x, indent + 1, out)
            out.append(",\n" if n + 1 < len(items) else "\n")
        out.append(pad + "}")
    elif isinstance(v, list):
        if not v:
            out.append("[]")
            return
        out.append("[\n")
        for n, x in enumerate(v):
            out.append(pad + " ")
            render(x, indent + 1, out)
            out.append(",\n" if n + 1 < len(v) else "\n")
        out.append(pad + "]")
    elif isinstance(v, Number):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(json.dumps(v, ensure_ascii=False))
    else:
        out.append(json.dumps(v))  # true, false, null


def normalize_json(src, dst):
    with open(src, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = json.loads(text, parse_float=Number, parse_int=Number)
    except ValueError as e:  # not JSON (an error message, an empty output): compared as it is
        with open(dst, "w", encoding="utf-8") as f:
            f.write(text if text else "(empty)\n")
        return
    out = []
    render(doc, 0, out)
    with open(dst, "w", encoding="utf-8") as f:
        f.write("".join(out) + "\n")


# ---------------------------------------------------------------------------------------------------- h5meta
def h5meta(path):
    import h5py

    def value(v):
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        return str(v.tolist() if hasattr(v, "tolist") else v)

    with h5py.File(path, "r") as f:
        for k in sorted(f.attrs):
            print(f"/ @{k} = {value(f.attrs[k])}")
        names = []
        f.visit(names.append)
        for name in sorted(names):
            obj = f[name]
            if isinstance(obj, h5py.Dataset):
                print(f"/{name}: dtype {obj.dtype.descr} shape {obj.shape} chunks {obj.chunks} "
                      f"filters {obj.compression} {obj.compression_opts} shuffle {obj.shuffle}")
            else:
                print(f"/{name}: group")
            for k in sorted(obj.attrs):
                print(f"/{name} @{k} = {value(obj.attrs[k])}")


def main(argv):
    commands = {"models": (models, 1), "csv": (copy_csv, 2), "json": (normalize_json, 2), "h5meta": (h5meta, 1)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) != 2 + commands[argv[1]][1]:
        sys.exit(__doc__)
    fn, _ = commands[argv[1]]
    fn(*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
