#!/usr/bin/env python3
"""PyTorch's side of bench/hf_bench.sh: the same GPT-2-small folder (written by `hf_bench write DIR`) loaded
and trained with PyTorch on the CPU, as `ampscope train --model DIR` trains it: batch 1, context 256, the
windows of docs/checkpoints.md, mean cross-entropy, AdamW(lr 5e-5, weight_decay 0), gradient clipping at 1.

The model is GPT-2 as Hugging Face's GPT2LMHeadModel computes it (Conv1D weights [in, out], tanh GELU,
attention scaled by 1/sqrt(head dim), causal mask, tied head), in plain PyTorch: transformers is not a Debian
package. One phase per process, so each peak RSS is the phase's own:

  /usr/bin/python3 bench/hf_pytorch_bench.py load DIR
  /usr/bin/python3 bench/hf_pytorch_bench.py f32 DIR [STEPS]
  /usr/bin/python3 bench/hf_pytorch_bench.py bf16 DIR [STEPS]   # torch.autocast('cpu', torch.bfloat16)

(PyTorch's CPU has no f16 matmul, so there is no fp16 phase on this side.)
"""
import json
import math
import os
import resource
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64, "I64": torch.int64}


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load_safetensors(path):
    """name -> f32 tensor, from the format's specification (8-byte length, JSON header, buffer)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + end]), dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = t.float() if t.is_floating_point() else t
    return out


class GPT2(torch.nn.Module):
    def __init__(self, config, weights):
        super().__init__()
        self.c = config
        # GPT-2's h.N.attn.bias and attn.masked_bias are buffers (the causal mask), not weights.
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v) for k, v in weights.items()
                                         if k.split(".")[-2:] not in (["attn", "bias"], ["attn", "masked_bias"])})

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def forward(self, ids):
        c = self.c
        B, T = ids.shape
        d, H = c["n_embd"], c["n_head"]
        x = self.w("wte.weight")[ids] + self.w("wpe.weight")[torch.arange(T)]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for i in range(c["n_layer"]):
            h = f"h.{i}."
            a = F.layer_norm(x, (d,), self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), c["layer_norm_epsilon"])
            qkv = torch.addmm(self.w(h + "attn.c_attn.bias"), a.reshape(-1, d), self.w(h + "attn.c_attn.weight"))
            q, k, v = qkv.reshape(B, T, 3 * d).split(d, dim=2)
            q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
            s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // H)
            s = torch.where(mask, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
            p = torch.softmax(s, dim=-1).type(v.dtype)
            o = torch.matmul(p, v).transpose(1, 2).reshape(B * T, d)
            x = x + torch.addmm(self.w(h + "attn.c_proj.bias"), o, self.w(h + "attn.c_proj.weight")).reshape(B, T, d)
            m = F.layer_norm(x, (d,), self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), c["layer_norm_epsilon"])
            m = F.gelu(torch.addmm(self.w(h + "mlp.c_fc.bias"), m.reshape(-1, d), self.w(h + "mlp.c_fc.weight")),
                       approximate="tanh")
            x = x + torch.addmm(self.w(h + "mlp.c_proj.bias"), m, self.w(h + "mlp.c_proj.weight")).reshape(B, T, d)
        x = F.layer_norm(x, (d,), self.w("ln_f.weight"), self.w("ln_f.bias"), c["layer_norm_epsilon"])
        return torch.matmul(x, self.w("wte.weight").t())


def main():
    phase, folder = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.manual_seed(0)
    config = json.load(open(os.path.join(folder, "config.json")))
    t0 = time.perf_counter()
    weights = load_safetensors(os.path.join(folder, "model.safetensors"))
    model = GPT2(config, weights)
    if phase == "load":
        seconds = time.perf_counter() - t0
        # The parameters loaded, for bench/hf_bench.sh's premise (ampscope's side loaded the same model).
        print(f"load: {seconds:.3f} s, peak RSS {peak_rss_mib():.0f} MiB "
              f"({sum(p.numel() for p in model.parameters())} parameters)")
        return
    ids = torch.tensor([int(t) for t in open(os.path.join(folder, "tokens.txt")).read().split()], dtype=torch.int64)
    T = 256
    windows = (len(ids) - 1) // T
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    times, losses = [], []
    for s in range(steps + 2):
        k = s % windows
        x, y = ids[k * T:k * T + T].unsqueeze(0), ids[k * T + 1:k * T + T + 1].unsqueeze(0)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=phase == "bf16"):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    times = sorted(times[2:])
    print(f"torch {phase}: step {1000 * statistics.median(times):.1f} ms (median of {len(times)}; min "
          f"{1000 * times[0]:.1f}, max {1000 * times[-1]:.1f}), peak RSS {peak_rss_mib():.0f} MiB "
          f"(threads {torch.get_num_threads()})")
    # The premise (after timing): every step ended with a finite loss.
    if not all(math.isfinite(l) for l in losses):
        sys.exit(f"hf_pytorch_bench: premise broken: expected a finite loss in every step, found {losses}")


if __name__ == "__main__":
    main()
