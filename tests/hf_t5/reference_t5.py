"""A plain-PyTorch T5ForConditionalGeneration, written from Hugging Face's models/t5/modeling_t5.py semantics
(eager attention, no cache, dropout off), for tests/hf_t5/t5_reference_test.cpp.

  reference_t5.py FOLDER TOKENS B T

FOLDER holds config.json and model.safetensors (read by tests/support/reference_io.py, from the format's
specification). TOKENS is a text file of B*T whitespace-separated ids: row b is window b; its first T/2 ids
are the encoder input, its last T/2 the labels; the decoder input is the labels shifted right with
decoder_start_token_id in front (HF's _shift_right). Prints, one line each, a name and float.hex() values:
  logits_f32  the logits [B, T/2, vocab] of the initial weights
  logits_bf16 the same under bf16 autocast, with CUDA autocast's policy applied by hand (torch's CPU autocast
              has other op lists): linear and matmul take bf16-rounded inputs, accumulate in f32 and round the
              result once to bf16 (cuBLAS's mode); pow and rsqrt compute in f32; everything else runs in its
              inputs' dtype with PyTorch's type promotion (f32 + bf16 is f32). HF's in-place scores += bias
              keeps the scores' dtype.
  loss_0 loss_1 loss_2  mean cross-entropy over the labels before each of 3 AdamW steps (lr 1e-3, weight
                        decay 0)
Exits 77 when torch is missing.
"""
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch is missing")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from reference_io import hexes, read_config, read_safetensors  # noqa: E402


def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    # T5Attention._relative_position_bucket
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
                            * (num_buckets - max_exact)).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


class T5:
    def __init__(self, tensors, config, bf16=False):
        self.bf16 = bf16
        c = config
        self.d_model = c.get("d_model", 512)
        self.d_kv = c.get("d_kv", 64)
        self.heads = c.get("num_heads", 8)
        self.n_enc = c.get("num_layers", 6)
        self.n_dec = c.get("num_decoder_layers") or self.n_enc
        self.buckets = c.get("relative_attention_num_buckets", 32)
        self.max_distance = c.get("relative_attention_max_distance", 128)
        self.eps = c.get("layer_norm_epsilon", 1e-6)
        proj = c.get("feed_forward_proj", "relu")
        self.gated = proj.startswith("gated-")
        # T5Config: ACT or gated-ACT; "gated-gelu" means gelu_new (the tanh approximation).
        self.act = "gelu_new" if proj == "gated-gelu" else proj[len("gated-"):] if self.gated else proj
        self.tied = c.get("tie_word_embeddings", True)
        self.start = c.get("decoder_start_token_id", c.get("pad_token_id", 0))
        # The trainable parameters: every stored tensor; the tied copies HF keeps under other names are the
        # same Parameter as shared.
        self.p = {}
        for name, t in tensors.items():
            if name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
                continue
            if name == "lm_head.weight" and self.tied:
                continue
            self.p[name] = torch.nn.Parameter(t.float().clone())

    def parameters(self):
        return list(self.p.values())

    def layer_norm(self, name, x):  # T5LayerNorm
        w = self.p[name + ".weight"]
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(self.to32(variance + self.eps))
        if w.dtype in (torch.float16, torch.bfloat16):
            x = x.to(w.dtype)
        return w * x

    def lp(self, t):  # an autocast cast to bf16, as f32 values
        return t.to(torch.bfloat16).to(torch.float32)

    def lin(self, name, x):
        w = self.p[name + ".weight"]
        if not self.bf16:
            return F.linear(x, w)
        return F.linear(self.lp(x), self.lp(w)).to(torch.bfloat16)

    def matmul(self, a, b):
        if not self.bf16:
            return torch.matmul(a, b)
        return torch.matmul(self.lp(a), self.lp(b)).to(torch.bfloat16)

    def to32(self, x):  # the input cast of an op on autocast's fp32 list (pow, rsqrt)
        return x.float() if self.bf16 else x

    def gelu_new(self, x):  # NewGELUActivation
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(self.to32(x), 3.0))))

    def dense(self, name, x):  # T5DenseActDense / T5DenseGatedActDense
        act = {"relu": F.relu, "gelu": F.gelu, "gelu_new": self.gelu_new}[self.act]
        if self.gated:
            h = act(self.lin(name + ".wi_0", x)) * self.lin(name + ".wi_1", x)
        else:
            h = act(self.lin(name + ".wi", x))
        w = self.p[name + ".wo.weight"]
        if h.dtype != w.dtype:  # HF casts wo's input to wo's weight dtype
            h = h.to(w.dtype)
        return self.lin(name + ".wo", h)

    def compute_bias(self, name, q_len, k_len, bidirectional):
        context = torch.arange(q_len, dtype=torch.long)[:, None]
        memory = torch.arange(k_len, dtype=torch.long)[None, :]
        bucket = relative_position_bucket(memory - context, bidirectional, self.buckets, self.max_distance)
        values = F.embedding(bucket, self.p[name + ".relative_attention_bias.weight"])  # [q, k, heads]
        return values.permute([2, 0, 1]).unsqueeze(0)

    def attention(self, name, x, kv, position_bias, mask):
        B, T = x.shape[:2]
        shape = lambda t: t.view(B, -1, self.heads, self.d_kv).transpose(1, 2)
        q = shape(self.lin(name + ".q", x))
        k = shape(self.lin(name + ".k", kv))
        v = shape(self.lin(name + ".v", kv))
        scores = self.matmul(q, k.transpose(3, 2))
        if position_bias is None:
            position_bias = torch.zeros((1, self.heads, T, k.shape[2]), dtype=scores.dtype)
        if mask is not None:
            position_bias = position_bias + mask
        scores = (scores.float() + position_bias).to(scores.dtype)  # HF: scores += position_bias (in place)
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = self.matmul(weights, v).transpose(1, 2).contiguous().view(B, -1, self.heads * self.d_kv)
        return self.lin(name + ".o", out)

    def stack(self, prefix, ids, encoder_out):
        decoder = encoder_out is not None
        h = F.embedding(ids, self.p["shared.weight"])
        T = ids.shape[1]
        mask = None
        if decoder:  # the causal mask HF builds: 0 where visible, finfo(f32).min after the query
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            mask = torch.zeros(T, T).masked_fill(causal, torch.finfo(torch.float32).min)[None, None]
        bias = self.compute_bias(prefix + ".block.0.layer.0.SelfAttention", T, T, not decoder)
        n = self.n_dec if decoder else self.n_enc
        for i in range(n):
            b = "%s.block.%d.layer." % (prefix, i)
            normed = self.layer_norm(b + "0.layer_norm", h)
            h = h + self.attention(b + "0.SelfAttention", normed, normed, bias, mask)
            if decoder:
                h = h + self.attention(b + "1.EncDecAttention", self.layer_norm(b + "1.layer_norm", h), encoder_out,
                                       None, None)
            ff = b + ("2" if decoder else "1")
            h = h + self.dense(ff + ".DenseReluDense", self.layer_norm(ff + ".layer_norm", h))
        return self.layer_norm(prefix + ".final_layer_norm", h)

    def __call__(self, encoder_ids, decoder_ids):
        enc = self.stack("encoder", encoder_ids, None)
        dec = self.stack("decoder", decoder_ids, enc)
        if self.tied:
            dec = dec * (self.d_model ** -0.5)
            return self.lin("shared", dec)
        return self.lin("lm_head", dec)


def main():
    folder, tokens_path, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = read_config(folder)
    tensors = read_safetensors(folder + "/model.safetensors")
    with open(tokens_path) as f:
        ids = torch.tensor([int(v) for v in f.read().split()], dtype=torch.int64)
    assert ids.numel() == B * T, (ids.numel(), B, T)
    windows = ids.reshape(B, T)
    encoder_ids, labels = windows[:, :T // 2], windows[:, T // 2:]
    model = T5(tensors, config)
    decoder_ids = labels.new_zeros(labels.shape)  # _shift_right
    decoder_ids[:, 1:] = labels[:, :-1].clone()
    decoder_ids[:, 0] = model.start
    with torch.no_grad():
        print("logits_f32", hexes(model(encoder_ids, decoder_ids)))
        print("logits_bf16", hexes(T5(tensors, config, bf16=True)(encoder_ids, decoder_ids)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for step in range(3):
        opt.zero_grad()
        logits = model(encoder_ids, decoder_ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        print("loss_%d" % step, float(loss).hex())
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
