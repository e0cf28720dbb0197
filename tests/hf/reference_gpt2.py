"""GPT-2 (GPT2LMHeadModel, eager attention) in plain PyTorch, written from transformers'
models/gpt2/modeling_gpt2.py, pytorch_utils.py (Conv1D) and activations.py (NewGELUActivation), not from
ampscope's C++. Usage: reference_gpt2.py FOLDER TOKENS B T (see reference_common.py for the output)."""
import math
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as rc  # noqa: E402


class GPT2(nn.Module):
    def __init__(self, tensors, config, policy):
        super().__init__()
        self.p = policy
        self.c = config
        names = dict(tensors)
        if any(k.startswith("transformer.") for k in names):
            names = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in names.items()}
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.clone()) for k, v in names.items()
                                   if not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")})
        self.n_embd = config["n_embd"]
        self.n_head = config["n_head"]
        self.tied = config.get("tie_word_embeddings", True)

    def W(self, name):
        return self.w[name.replace(".", "__")]

    def conv1d(self, prefix, x):  # Conv1D.forward: addmm(bias, x.view(-1, nx), weight).view(..., nf)
        size_out = x.size()[:-1] + (self.W(prefix + ".weight").size(1),)
        y = self.p.addmm(self.W(prefix + ".bias"), x.reshape(-1, x.size(-1)), self.W(prefix + ".weight"))
        return y.view(size_out)

    def ln(self, prefix, x):
        return self.p.layer_norm(x, (self.n_embd,), self.W(prefix + ".weight"), self.W(prefix + ".bias"),
                                 self.c.get("layer_norm_epsilon", 1e-5))

    def act(self, x):
        name = self.c.get("activation_function", "gelu_new")
        assert name == "gelu_new", name
        return self.p.scale(x, 0.5) * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * self.p.pow(x, 3.0))))

    def attn(self, prefix, x):
        B, T, D = x.shape
        hd = D // self.n_head
        q, k, v = self.conv1d(prefix + ".c_attn", x).split(D, dim=2)
        split = lambda t: t.view(B, T, self.n_head, hd).permute(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        w = self.p.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        causal = torch.tril(torch.ones((T, T), dtype=torch.bool)).view(1, 1, T, T)
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = self.p.softmax(w, -1)
        w = w.type(v.dtype)
        out = self.p.matmul(w, v)
        out = out.permute(0, 2, 1, 3).contiguous().view(B, T, D)
        return self.conv1d(prefix + ".c_proj", out)

    def forward(self, ids):
        T = ids.size(1)
        pos = torch.arange(0, T, dtype=torch.long).unsqueeze(0)
        h = nn.functional.embedding(ids, self.W("wte.weight")) + nn.functional.embedding(pos, self.W("wpe.weight"))
        for i in range(self.c["n_layer"]):
            p = "h.%d" % i
            residual = h
            h = self.attn(p + ".attn", self.ln(p + ".ln_1", h)) + residual
            residual = h
            h = residual + self.conv1d(p + ".mlp.c_proj", self.act(self.conv1d(p + ".mlp.c_fc", self.ln(p + ".ln_2", h))))
        h = self.ln("ln_f", h)
        head = self.W("wte.weight") if self.tied else self.W("lm_head.weight")
        return self.p.linear(h, head)


if __name__ == "__main__":
    rc.main(GPT2)
