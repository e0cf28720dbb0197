#!/usr/bin/env python3
"""PyTorch 2.x eager baseline for issue 10's benchmarks (bench/gpu_bench.sh runs it on the GPU machine).

The three sample models of samples/models.cpp with the shapes and default batches of samples/tasks.cpp,
trained as `ampscope train` trains them (cli/run.cpp): torch.autocast(float16 or bfloat16), GradScaler
(f16 only, init 65536, interval 2000), AdamW(weight_decay=0), unscale_ + clip_grad_norm_(1.0), step,
update, zero_grad(set_to_none=True). Initialisation does not matter for timing. Then torch.matmul at the
products' shapes. Prints Markdown tables; nothing is written to bench/RESULTS.md.

  python3 bench/pytorch_bench.py [--steps 200] [--warmup 20] [--precision fp16|bf16|both]
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the sample models (samples/models.cpp) ----

def make_mlp():  # MLP 64-256-256-10 (fc1, relu, fc2, relu, fc3)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def make_cnn():  # the classic MNIST CNN: conv 1->32 k3, relu, conv 32->64 k3, relu, maxpool 2, 9216->128->10
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(1), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))


class CausalSelfAttention(nn.Module):  # qkv side by side (GPT-2's c_attn), proj, dropout 0
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        heads = lambda z: z.view(b, t, self.h, d // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):  # pre-LN: x + attn(ln1(x)), then h + mlp(ln2(h)); GELU tanh form
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, h)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class TinyTransformer(nn.Module):  # vocab 256, context 64, d 128, 4 heads, 2 blocks
    def __init__(self, vocab=256, context=64, d=128, heads=4, layers=2):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t, device=tokens.device))
        return self.head(self.ln_f(self.blocks(x)))


def samples(device):
    """name -> (model, x, y, loss_fn); default batches of samples/tasks.cpp: mlp 64, cnn 32, transformer 8."""
    g = torch.Generator(device="cpu").manual_seed(0)
    mlp_x = torch.randn(64, 64, generator=g)
    mlp_y = torch.randint(0, 10, (64,), generator=g)
    cnn_x = torch.rand(32, 1, 28, 28, generator=g)
    cnn_y = torch.randint(0, 10, (32,), generator=g)
    tok = torch.randint(0, 256, (8, 65), generator=g)
    flat_ce = lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return {
        "mlp": (make_mlp(), mlp_x, mlp_y, F.cross_entropy, 1e-3),
        "cnn": (make_cnn(), cnn_x, cnn_y, F.cross_entropy, 1e-3),
        "transformer": (TinyTransformer(), tok[:, :64], tok[:, 1:], flat_ce, 3e-3),
    }


def time_training(name, model, x, y, loss_fn, lr, dtype, steps, warmup, device):
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_interval=2000, enabled=dtype == torch.float16)

    def step():
        with torch.autocast("cuda", dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    # Whole-loop time over many steps (what a training run sees), and per-step times with a sync after
    # each (the median is robust to a slow outlier).
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    loop_ms = (time.perf_counter() - t0) * 1e3 / steps
    per = []
    for _ in range(min(steps, 100)):
        t1 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t1) * 1e3)
    # The premise (after timing): the model trained on the GPU, to a finite loss.
    where = {str(p.device) for p in model.parameters()}
    if not math.isfinite(loss.item()) or any(not d.startswith("cuda") for d in where):
        raise SystemExit(f"pytorch_bench: premise broken: expected {name} on cuda with a finite loss, found "
                         f"parameters on {sorted(where)}, loss {loss.item()}")
    return loop_ms, statistics.median(per)


# Products of the sample models (M x K x N), plus a large square one; the same list as the
# gpu_timing.DISABLED_matrix_products_f16_and_bf16 measurement in tests/probes/stats_cuda_test.cpp.
MATMUL_SHAPES = [(64, 64, 256, "mlp fc1"), (64, 256, 256, "mlp fc2"), (32, 9216, 128, "cnn fc1"),
                 (512, 128, 384, "transformer qkv"), (512, 128, 512, "transformer mlp"),
                 (4096, 4096, 4096, "large square")]


def time_matmul(m, k, n, dtype, device, reps=20):
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    # Per call with a sync after it: the same method as the ampscope side, whose backend stream is not
    # exported (so small shapes include one host round trip on both sides).
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) * 1e3)
    # Device time with CUDA events over back-to-back calls (no host round trip).
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.matmul(a, b)
    stop.record()
    stop.synchronize()
    return statistics.median(per), start.elapsed_time(stop) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--precision", choices=["fp16", "bf16", "both"], default="both")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pytorch_bench: no CUDA device (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # ampscope's default: exact f32 products
    torch.backends.cudnn.allow_tf32 = False
    precisions = {"fp16": torch.float16, "bf16": torch.bfloat16}
    chosen = list(precisions) if args.precision == "both" else [args.precision]
    print(f"# PyTorch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print("\n## training step (autocast + GradScaler for fp16, AdamW, clip 1.0), eager\n")
    print("| sample | precision | batch | ms/step (loop) | ms/step (median, synced) |")
    print("|---|---|---|---|---|")
    for name, (model, x, y, loss_fn, lr) in samples(device).items():
        for p in chosen:
            loop_ms, med_ms = time_training(name, model, x, y, loss_fn, lr, precisions[p], args.steps, args.warmup,
                                            device)
            print(f"| {name} | {p} | {x.shape[0]} | {loop_ms:.3f} | {med_ms:.3f} |")
    print("\n## torch.matmul\n")
    print("| shape (M x K x N) | what | dtype | ms (synced call, median) | ms (events, back to back) | TFLOP/s (events) |")
    print("|---|---|---|---|---|---|")
    for p in ["fp16", "bf16"]:
        for m, k, n, what in MATMUL_SHAPES:
            synced, events = time_matmul(m, k, n, precisions[p], device)
            print(f"| {m} x {k} x {n} | {what} | {p} | {synced:.4f} | {events:.4f} | "
                  f"{2.0 * m * k * n / events / 1e9:.2f} |")


if __name__ == "__main__":
    main()
