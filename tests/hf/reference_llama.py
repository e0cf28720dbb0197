"""Llama and Mistral (LlamaForCausalLM / MistralForCausalLM, eager attention) in plain PyTorch, written from
transformers' models/llama/modeling_llama.py (v4.48: LlamaRMSNorm, LlamaRotaryEmbedding with the default
rope, apply_rotary_pos_emb, repeat_kv, eager_attention_forward, LlamaMLP, the causal mask of
_prepare_4d_causal_attention_mask_with_cache_position) and models/mistral/modular_mistral.py (no biases,
head_dim, sliding-window mask), not from ampscope's C++. Usage: reference_llama.py FOLDER TOKENS B T."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as rc  # noqa: E402


class Llama(nn.Module):
    def __init__(self, tensors, config, policy):
        super().__init__()
        self.p = policy
        self.c = config
        names = dict(tensors)
        if not any(k.startswith("model.") for k in names):  # a LlamaModel checkpoint
            names = {k if k.startswith("lm_head.") else "model." + k: v for k, v in names.items()}
        self.pad = config.get("pad_token_id")
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.clone()) for k, v in names.items()
                                   if not k.endswith("rotary_emb.inv_freq")})
        self.mistral = config["model_type"] == "mistral"
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.tied = config.get("tie_word_embeddings", False)
        self.window = config.get("sliding_window") if self.mistral else None
        # LlamaRotaryEmbedding, default rope: inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim)
        base = config.get("rope_theta", 10000.0)
        dim = self.head_dim
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    def W(self, name):
        key = name.replace(".", "__")
        return self.w[key] if key in self.w else None

    def rms(self, prefix, x):  # LlamaRMSNorm.forward
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = self.p.pow(x, 2).mean(-1, keepdim=True)
        x = x * self.p.rsqrt(variance + self.eps)
        return self.W(prefix + ".weight") * x.to(input_dtype)

    def lin(self, prefix, x):
        return self.p.linear(x, self.W(prefix + ".weight"), self.W(prefix + ".bias"))

    def rotary(self, x, position_ids):  # LlamaRotaryEmbedding.forward (autocast disabled inside)
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)

    @staticmethod
    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    @staticmethod
    def repeat_kv(h, n):
        b, kv, s, d = h.shape
        if n == 1:
            return h
        return h[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)

    def mask(self, T, dtype):
        min_dtype = torch.finfo(dtype).min
        cache_position = torch.arange(T)
        target = T + 1
        m = torch.full((T, target), fill_value=min_dtype, dtype=dtype)
        m = torch.triu(m, diagonal=1)
        m *= torch.arange(target) > cache_position.reshape(-1, 1)
        if self.window is not None:  # create_sliding_window_causal_mask: also hide kv <= q - window
            too_old = torch.arange(target)[None, :] <= cache_position.reshape(-1, 1) - self.window
            m = m.masked_fill(too_old, min_dtype)
        return m[None, None, :, :T]

    def attn(self, prefix, x, cos, sin, mask):
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q = self.lin(prefix + ".q_proj", x).view(shape).transpose(1, 2)
        k = self.lin(prefix + ".k_proj", x).view(shape).transpose(1, 2)
        v = self.lin(prefix + ".v_proj", x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (self.rotate_half(q) * sin)
        k = (k * cos) + (self.rotate_half(k) * sin)
        n = self.heads // self.kv_heads
        k, v = self.repeat_kv(k, n), self.repeat_kv(v, n)
        w = self.p.scale(self.p.matmul(q, k.transpose(2, 3)), self.head_dim ** -0.5)
        w = w + mask[:, :, :, : k.shape[-2]]
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        out = self.p.matmul(w, v).transpose(1, 2).contiguous()
        out = out.reshape(B, T, -1).contiguous()
        return self.lin(prefix + ".o_proj", out)

    def mlp(self, prefix, x):
        return self.lin(prefix + ".down_proj", self.p.silu(self.lin(prefix + ".gate_proj", x)) * self.lin(prefix + ".up_proj", x))

    def forward(self, ids):
        T = ids.size(1)
        h = F.embedding(ids, self.W("model.embed_tokens.weight"), padding_idx=self.pad)
        position_ids = torch.arange(T).unsqueeze(0)
        mask = self.mask(T, h.dtype)
        cos, sin = self.rotary(h, position_ids)
        for i in range(self.c["num_hidden_layers"]):
            p = "model.layers.%d" % i
            residual = h
            h = residual + self.attn(p + ".self_attn", self.rms(p + ".input_layernorm", h), cos, sin, mask)
            residual = h
            h = residual + self.mlp(p + ".mlp", self.rms(p + ".post_attention_layernorm", h))
        h = self.rms("model.norm", h)
        head = self.W("model.embed_tokens.weight") if self.tied else self.W("lm_head.weight")
        return self.p.linear(h, head)


if __name__ == "__main__":
    rc.main(Llama)
