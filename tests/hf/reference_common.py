"""Shared by reference_gpt2.py and reference_llama.py: the token file, the autocast policy the references apply
by hand, and the driver that prints what the C++ test compares (the safetensors reader and the printing are
tests/support/reference_io.py's, shared with tests/hf_t5/reference_t5.py).

The bf16 mode mirrors PyTorch's CUDA autocast policy (which ampscope implements on every backend), not torch's
CPU autocast, whose op lists differ: matrix products (matmul, linear, addmm) take bf16-rounded inputs,
accumulate in f32 and round the result once to bf16 (cuBLAS's mode; computed here in f32 from the rounded
inputs); pow, rsqrt and layer_norm compute in f32; softmax without a dtype returns f32 for a bf16 input;
everything else runs in its inputs' dtype with PyTorch's type promotion. Two element-wise ops of bf16 tensors
compute differently on torch 1.13's CPU than in PyTorch's CUDA kernels, so the bf16 mode spells out the CUDA
semantics: a tensor times a Python scalar keeps the scalar in f32 (the CPU rounds it to bf16 first), and
F.silu computes x / (1 + exp(-x)) in f32 and rounds once (the CPU's bf16 silu differs in about 30% of
values).

Output (one line each): name followed by values as float.hex() strings:
  logits_bf16 (initial weights, bf16 policy), logits_f32 (initial weights), loss_0 loss_1 loss_2 (f32 mean
  cross-entropy over all B*T next-token targets before each of 3 AdamW steps, lr 1e-3, weight decay 0).
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from reference_io import hexes, read_config, read_safetensors  # noqa: E402

class Policy:
    """The ops autocast treats specially, in f32 mode (plain PyTorch) or bf16 mode (CUDA rules by hand)."""

    def __init__(self, bf16):
        self.bf16 = bf16

    def _lp(self, t):
        return t.to(torch.bfloat16).to(torch.float32)

    def _round(self, t):
        return t.to(torch.bfloat16) if self.bf16 else t

    def matmul(self, a, b):
        if not self.bf16:
            return torch.matmul(a, b)
        return self._round(torch.matmul(self._lp(a), self._lp(b)))

    def linear(self, x, w, b=None):
        if not self.bf16:
            return F.linear(x, w, b)
        return self._round(F.linear(self._lp(x), self._lp(w), None if b is None else self._lp(b)))

    def addmm(self, bias, x, w):
        if not self.bf16:
            return torch.addmm(bias, x, w)
        return self._round(torch.addmm(self._lp(bias), self._lp(x), self._lp(w)))

    def to32(self, t):  # an fp32-list op's input cast
        return t.float() if self.bf16 and t.dtype == torch.bfloat16 else t

    def pow(self, x, e):
        return torch.pow(self.to32(x), e)

    def rsqrt(self, x):
        return torch.rsqrt(self.to32(x))

    def layer_norm(self, x, shape, w, b, eps):
        return F.layer_norm(self.to32(x), shape, w, b, eps)

    def scale(self, x, s):  # x * python_float
        if self.bf16 and x.dtype == torch.bfloat16:
            return (x.float() * s).to(torch.bfloat16)
        return x * s

    def silu(self, x):
        if self.bf16 and x.dtype == torch.bfloat16:
            xf = x.float()
            return (xf / (1.0 + torch.exp(-xf))).to(torch.bfloat16)
        return F.silu(x)

    def softmax(self, x, dim):  # no dtype given: f32 out for a bf16 input (fp32_set_opt_dtype)
        if self.bf16 and x.dtype == torch.bfloat16:
            return F.softmax(x, dim=dim, dtype=torch.float32)
        return F.softmax(x, dim=dim)


def read_tokens(path, B, T):
    with open(path) as f:
        ids = [int(v) for v in f.read().split()]
    assert len(ids) == B * (T + 1), (len(ids), B, T)
    return torch.tensor(ids, dtype=torch.int64).reshape(B, T + 1)


def main(build):
    """build(tensors, config, policy) -> torch.nn.Module whose forward(ids) gives logits."""
    folder, tokens_path, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = read_config(folder)
    tensors = {k: v.float() for k, v in read_safetensors(folder + "/model.safetensors").items()}
    data = read_tokens(tokens_path, B, T)
    inputs, targets = data[:, :T], data[:, 1:]
    torch.manual_seed(0)
    with torch.no_grad():
        print("logits_bf16", hexes(build(tensors, config, Policy(True))(inputs)))
    model = build(tensors, config, Policy(False))
    with torch.no_grad():
        print("logits_f32", hexes(model(inputs)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for step in range(3):
        opt.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        print("loss_%d" % step, float(loss).hex())
        loss.backward()
        opt.step()
