# The model of bench/record_bench.sh, written as a user writes a train.py: a bf16 (CPU autocast) two-block
# GPT-style transformer with d 256, AdamW, cross-entropy. It knows nothing of ampscope. It prints the median
# wall time of its steps after the first two (warm-up: allocator, autocast's caches, the recorder's first
# labelling), and their mean (a sampled run's recorded steps are every Nth: the mean carries them, the median
# hides them), so start-up and import costs stay out of the ratio. --clock cpu: this process's CPU time
# (time.process_time, all its threads) in place of wall time: steadier than wall time on a machine loaded by others,
# where a step waits for a core as long as it runs (bench/RESULTS.md); an `ampscope record` writer process is not
# counted. Its last line names the folder of the ampscope package recording it ("none" when run plain).
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--d", type=int, default=256)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=64)
parser.add_argument("--vocab", type=int, default=512)
parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
args = parser.parse_args()
clock = time.process_time if args.clock == "cpu" else time.perf_counter
torch.manual_seed(0)
torch.set_num_threads(1)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads=4, blocks=2, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, :idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


model = GPT(args.vocab, args.d, seq=args.seq)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1))
times = []
for i in range(args.steps):
    start = clock()
    x, y = data[i, :, :-1], data[i, :, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(clock() - start)
print("step_ms median %.3f mean %.3f" % (statistics.median(times[2:]) * 1000.0, statistics.mean(times[2:]) * 1000.0))
# For bench/record_bench.sh's premise (after timing): which recorder, if any, ran in this process (the ampscope
# package `ampscope record` put on the path), so a baseline run is known to have used BASE_PYTHON_DIR's.
recorder = sys.modules.get("ampscope")
print("recorder", os.path.dirname(os.path.dirname(os.path.realpath(recorder.__file__))) if recorder else "none")
