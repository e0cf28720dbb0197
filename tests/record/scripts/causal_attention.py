# A small causal language model trained in bf16 autocast, written as a user writes one: the attention masks
# the future with torch.triu + masked_fill(-inf) before the softmax (the -inf is the mask, on purpose). Its
# scores are scaled by a learned temperature, exp(logit_scale) as in cosine attention; `--logit-scale 100`
# starts that parameter where exp overflows (e^100 > f32's largest), a real overflow in the same block as the mask.
# `--padded-sample` makes the batch's last sequence all padding, masked as keys too: its rows are masked
# everywhere, and softmax of a row of -inf is 0 / 0 (NaN), a failure made by the softmax, not the mask.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--logit-scale", type=float, default=None)
parser.add_argument("--padded-sample", action="store_true")
args = parser.parse_args()
torch.manual_seed(11)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, logit_scale):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.logit_scale = nn.Parameter(torch.tensor(logit_scale))

    def forward(self, x, pad):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * self.logit_scale.exp()
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) | pad[:, None, None, :]
        scores = scores.masked_fill(mask, float('-inf'))
        att = torch.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, d, heads, logit_scale):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, logit_scale)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad):
        x = x + self.attn(self.ln1(x), pad)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, n_blocks=2, logit_scale=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads, logit_scale) for _ in range(n_blocks)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, pad):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, pad)
        return self.head(self.ln_f(x))


scale = args.logit_scale if args.logit_scale is not None else math.log(1 / math.sqrt(8))
model = TinyLM(logit_scale=scale)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 64, (args.steps, 4, 17))
for step in range(args.steps):
    x, y = tokens[step, :, :-1], tokens[step, :, 1:]
    pad = torch.zeros(x.shape, dtype=torch.bool)
    if args.padded_sample:
        pad[-1] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x, pad)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step %d loss %.4f" % (step, loss.item()))
