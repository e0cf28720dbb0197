"""A Hugging Face Llama folder trained in plain PyTorch as a user writes it: nn.Module classes named as
transformers names them (model.layers.0.self_attn.q_proj, model.layers.0.mlp.gate_proj, model.norm, ...), the
math of tests/hf/reference_llama.py (written from transformers' modeling_llama.py), the batches cut by
`ampscope train --model`'s window rule, AdamW (weight decay 0) and gradient clipping at 1, as gpt2_folder_train.py does for GPT-2.
Untied head, as many key/value heads as query heads, no biases, no pad token (the folders
tests/record/pydiff_test.py writes). Usage: llama_folder_train.py FOLDER TOKENS.txt --context T --batch B
--steps N --lr LR [--max-grad-norm X] [--bf16] [--relu-layer K] (layer K's MLP uses relu where Llama's uses SiLU: a planted
difference; --bf16 applies CUDA autocast's bf16 policy by hand, tests/hf/reference_common.py's Policy)."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "hf"))
sys.path.insert(0, HERE)
import folder_train  # noqa: E402
import reference_common as rc  # noqa: E402
from reference_io import read_config, read_safetensors  # noqa: E402

a = folder_train.arguments()
a.add_argument("--relu-layer", type=int, default=-1)
args = a.parse_args()

config = read_config(args.folder)
tensors = {k: v.float() for k, v in read_safetensors(os.path.join(args.folder, "model.safetensors")).items()}
P = rc.Policy(args.bf16)
D, H = config["hidden_size"], config["num_attention_heads"]
HD, EPS = D // H, config.get("rms_norm_eps", 1e-6)


class Linear(nn.Linear):  # nn.Linear whose product follows the policy (plain F.linear in f32)
    def __init__(self, name):
        w = tensors[name + ".weight"]
        super().__init__(w.size(1), w.size(0), bias=False)
        with torch.no_grad():
            self.weight.copy_(w)

    def forward(self, x):
        return P.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):  # LlamaRMSNorm
    def __init__(self, name):
        super().__init__()
        self.weight = nn.Parameter(tensors[name + ".weight"].clone())

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = P.pow(x, 2).mean(-1, keepdim=True)
        x = x * P.rsqrt(variance + EPS)
        return self.weight * x.to(dtype)


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class Attention(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.q_proj, self.k_proj = Linear(p + ".q_proj"), Linear(p + ".k_proj")
        self.v_proj, self.o_proj = Linear(p + ".v_proj"), Linear(p + ".o_proj")

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, -1, HD).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        w = P.scale(P.matmul(q, k.transpose(2, 3)), HD ** -0.5)
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        out = P.matmul(w, v).transpose(1, 2).contiguous().reshape(B, T, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, p, relu):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = Linear(p + ".gate_proj"), Linear(p + ".up_proj"), Linear(
            p + ".down_proj")
        self.relu = relu

    def forward(self, x):
        act = F.relu if self.relu else P.silu  # the planted difference: relu for SiLU in one layer
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, i):
        super().__init__()
        p = "model.layers.%d" % i
        self.input_layernorm, self.self_attn = RMSNorm(p + ".input_layernorm"), Attention(p + ".self_attn")
        self.post_attention_layernorm = RMSNorm(p + ".post_attention_layernorm")
        self.mlp = MLP(p + ".mlp", i == args.relu_layer)

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], D)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(tensors["model.embed_tokens.weight"])
        self.layers = nn.ModuleList(Layer(i) for i in range(config["num_hidden_layers"]))
        self.norm = RMSNorm("model.norm")


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Model()
        self.lm_head = Linear("lm_head")
        base = config.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / (base ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))

    def forward(self, ids):
        T = ids.size(1)
        h = self.model.embed_tokens(ids)
        # The rotary tables and the causal mask are constants of T: made without autograd, as data.
        with torch.no_grad():
            freqs = torch.outer(torch.arange(T).float(), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(h.dtype)[None], emb.sin().to(h.dtype)[None]
            mask = torch.full((T, T), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)[None, None]
        for layer in self.model.layers:
            h = layer(h, cos, sin, mask)
        return self.lm_head(self.model.norm(h))


folder_train.train(LlamaForCausalLM(), args)
