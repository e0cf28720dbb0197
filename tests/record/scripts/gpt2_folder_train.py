"""A Hugging Face GPT-2 folder trained in plain PyTorch as a user writes it: nn.Module classes named as
transformers names them (h.0.attn.c_attn, h.0.mlp.c_fc, ...), the math of tests/hf/reference_gpt2.py (written
from transformers' modeling_gpt2.py), the folder read with tests/support/reference_io.py, the batches cut by
`ampscope train --model`'s window rule (docs/checkpoints.md, "The window rule"), AdamW (weight decay 0) and
gradient clipping at 1, as `ampscope train --model` trains. `ampscope diff` compares its trace with
ampscope's own run of the same folder (tests/record/pydiff_test.py).

Usage: gpt2_folder_train.py FOLDER TOKENS.txt --context T --batch B --steps N --lr LR
         [--max-grad-norm X] [--bf16 | --autocast] [--erf-gelu-block K]
--bf16 applies CUDA autocast's bf16 policy by hand (tests/hf/reference_common.py's Policy), as ampscope's
runtime does; --autocast runs the forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) instead
(the plain ops, torch's CPU policy); --erf-gelu-block K swaps the tanh of block K's GELU for erf: a planted difference."""
import math
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "hf"))
sys.path.insert(0, HERE)
import folder_train  # noqa: E402
import reference_common as rc  # noqa: E402
from reference_io import read_config, read_safetensors  # noqa: E402  (on the path reference_common set)

a = folder_train.arguments()
a.add_argument("--erf-gelu-block", type=int, default=-1)
args = a.parse_args()

config = read_config(args.folder)
tensors = {k[len("transformer."):] if k.startswith("transformer.") else k: v.float()
           for k, v in read_safetensors(os.path.join(args.folder, "model.safetensors")).items()}
P = rc.Policy(args.bf16)
D, H, EPS = config["n_embd"], config["n_head"], config.get("layer_norm_epsilon", 1e-5)


def weight(name):
    return nn.Parameter(tensors[name].clone())


class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D: addmm(bias, x.view(-1, nx), weight)
    def __init__(self, prefix):
        super().__init__()
        self.weight, self.bias = weight(prefix + ".weight"), weight(prefix + ".bias")

    def forward(self, x):
        y = P.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight)
        return y.view(x.size()[:-1] + (self.weight.size(1),))


class LayerNorm(nn.Module):
    def __init__(self, prefix):
        super().__init__()
        self.weight, self.bias = weight(prefix + ".weight"), weight(prefix + ".bias")

    def forward(self, x):
        return P.layer_norm(x, (D,), self.weight, self.bias, EPS)


class Attention(nn.Module):
    def __init__(self, prefix):
        super().__init__()
        self.c_attn, self.c_proj = Conv1D(prefix + ".c_attn"), Conv1D(prefix + ".c_proj")

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T, H, D // H).permute(0, 2, 1, 3) for t in (q, k, v))
        w = P.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype)
        causal = torch.tril(torch.ones((T, T), dtype=torch.bool)).view(1, 1, T, T)
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = P.softmax(w, -1).type(v.dtype)
        out = P.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(B, T, D)
        return self.c_proj(out)


class MLP(nn.Module):
    def __init__(self, prefix, erf):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(prefix + ".c_fc"), Conv1D(prefix + ".c_proj")
        self.erf = erf

    def act(self, x):
        # transformers' NewGELUActivation; the planted difference swaps its tanh for erf (the same ops otherwise)
        squash = torch.erf if self.erf else torch.tanh
        return P.scale(x, 0.5) * (1.0 + squash(math.sqrt(2.0 / math.pi) * (x + 0.044715 * P.pow(x, 3.0))))

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        p = "h.%d" % i
        self.ln_1, self.attn = LayerNorm(p + ".ln_1"), Attention(p + ".attn")
        self.ln_2, self.mlp = LayerNorm(p + ".ln_2"), MLP(p + ".mlp", i == args.erf_gelu_block)

    def forward(self, x):
        h = self.attn(self.ln_1(x)) + x
        return h + self.mlp(self.ln_2(h))


class Linear(nn.Linear):  # nn.Linear whose product follows the policy (plain F.linear in f32)
    def forward(self, x):
        return P.linear(x, self.weight, self.bias)


class GPT2LMHeadModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(config["vocab_size"], D)
        self.wpe = nn.Embedding(config["n_positions"], D)
        with torch.no_grad():
            self.wte.weight.copy_(tensors["wte.weight"])
            self.wpe.weight.copy_(tensors["wpe.weight"])
        self.h = nn.ModuleList(Block(i) for i in range(config["n_layer"]))
        self.ln_f = LayerNorm("ln_f")
        self.lm_head = Linear(D, config["vocab_size"], bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's tie_word_embeddings

    def forward(self, ids):
        T = ids.size(1)
        h = self.wte(ids) + self.wpe(torch.arange(0, T, dtype=torch.long).unsqueeze(0))
        for block in self.h:
            h = block(h)
        return self.lm_head(self.ln_f(h))


folder_train.train(GPT2LMHeadModel(), args)
