#!/usr/bin/env python3
"""PyTorch CPU baseline for training_bench's f32 cases (issue 37): the same models, shapes and step.

One step = zero_grad(set_to_none), forward, cross-entropy, backward (no optimizer), as training_bench's
step_loop does. Models as samples/models.cpp builds them: MLP 784-256-256-10 batch 128; the MNIST CNN
(conv 1->32 k3, relu, conv 32->64 k3, relu, maxpool 2, 9216->128->10) batch 64 on 28x28; the tiny GPT
(2 pre-LN blocks, d 128, 4 heads, context 64, vocabulary 256, tanh GELU) batch 16; GPT-2-small shapes (12
blocks, d 768, 12 heads, vocabulary 50257, untied head) batch 1, context 256. Attention is written as
the ampscope op computes it (bmm, scale, causal masked_fill, softmax, bmm): PyTorch 1.13 has no
scaled_dot_product_attention. Prints one line per model: `name wall_ms cpu_ms steps param_tensors param_elements
threads` (medians per step; cpu_ms is the process's CPU time, all threads, the fairer figure on a loaded machine; the
last three what ran, for bench/cpu_vs_pytorch.sh's premise: the parameters' tensors and elements, torch's threads).

  /usr/bin/python3 bench/pytorch_cpu_step.py --threads 1 [--models mlp,cnn,transformer,gpt2_small] [--seconds 2]
"""
import argparse
import math
import os
import statistics
import sys
import time


def _threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return None


# Debian's torch 1.13 multiplies matrices with the system BLAS (OpenBLAS), whose own thread pool
# torch.set_num_threads does not size: at --threads 1 its products ran on both cores (CPU time twice the wall
# time: CNN 80 ms wall for 160 ms CPU; 2026-11-29). These pools read their variables once, when torch is
# imported, so they are set first: OpenBLAS at one thread, torch's OpenMP pool at --threads. That is PyTorch's
# fastest setting here at 2 threads as well (same day, quiet machine, ms a step wall for mlp, cnn, tiny GPT:
# OpenBLAS 1 / OpenMP 2: 2.0, 48.9, 43.1; OpenBLAS 2 / OpenMP 2: 2.7, 54.4, 68.3; OpenBLAS 2 / OpenMP 1: 2.8,
# 64.3, 96.0: the two pools oversubscribe the cores). A variable the caller set is left alone.
_threads = _threads_from_argv()
if _threads is not None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

import torch  # noqa: E402 (after the thread variables, which torch's libraries read when loaded)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.h
        q, k, v = self.qkv(x).split(d, dim=2)
        heads = lambda z: z.reshape(b, t, self.h, hd).transpose(1, 2).reshape(b * self.h, t, hd)
        scores = torch.bmm(heads(q), heads(k).transpose(1, 2)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        y = torch.bmm(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), heads(v))
        return self.proj(y.reshape(b, self.h, t, hd).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, h)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class TinyTransformer(nn.Module):
    def __init__(self, vocab, context, d, heads, layers):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(t))
        return self.head(self.ln_f(self.blocks(x)))


def case(name):
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        return m, torch.randn(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g)
    if name == "cnn":
        m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(1), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10))
        return m, torch.rand(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    if name == "transformer":
        m = TinyTransformer(256, 64, 128, 4, 2)
        return m, torch.randint(0, 256, (16, 64), generator=g), torch.randint(0, 256, (16, 64), generator=g)
    if name == "gpt2_small":
        m = TinyTransformer(50257, 256, 768, 12, 12)
        return m, torch.randint(0, 50257, (1, 256), generator=g), torch.randint(0, 50257, (1, 256), generator=g)
    raise SystemExit(f"pytorch_cpu_step: unknown model {name!r}\nhint: one of mlp, cnn, transformer, gpt2_small")


def step(model, x, y):
    for p in model.parameters():
        p.grad = None
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--models", default="mlp,cnn,transformer")
    ap.add_argument("--seconds", type=float, default=2.0, help="time spent per model after warm-up")
    ap.add_argument("--min-steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    for name in args.models.split(","):
        model, x, y = case(name)
        for _ in range(2):
            step(model, x, y)
        times, cpu = [], []
        t_end = time.perf_counter() + args.seconds
        while len(times) < args.min_steps or time.perf_counter() < t_end:
            t0, c0 = time.perf_counter(), time.process_time()
            loss = step(model, x, y)
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        # The premise: a finite loss and a gradient for every parameter.
        if not math.isfinite(loss.item()) or any(p.grad is None for p in model.parameters()):
            raise SystemExit(f"pytorch_cpu_step: premise broken for {name}: loss {loss.item()} or a missing gradient")
        params = list(model.parameters())
        print(f"{name} {statistics.median(times):.3f} {statistics.median(cpu):.3f} {len(times)} {len(params)} "
              f"{sum(p.numel() for p in params)} {torch.get_num_threads()}", flush=True)


if __name__ == "__main__":
    main()
