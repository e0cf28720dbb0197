#!/usr/bin/python3
# `ampscope diff` between ampscope's own run of a GPT-2 folder (`ampscope train --model`) and a plain-PyTorch
# run of the same folder, weights and batches recorded by `ampscope record` (tests/record/scripts/
# gpt2_folder_train.py: Hugging Face's module names, tests/hf/reference_gpt2.py's math). The two must align by
# module path and op and agree within a tolerance derived below; a difference planted in one block of the
# PyTorch script (its GELU's tanh swapped for erf) must be the first divergence, in that block's MLP.
# Usage: pydiff_test.py AMPSCOPE_BINARY WORK_DIR. Exit 77 (skipped) when this Python has no torch.
import json
import os
import struct
import subprocess
import sys

sys.dont_write_bytecode = True  # importing harness leaves no __pycache__ in the source tree
from harness import HERE, arguments, check, finish, require  # noqa: E402

torch, = require("torch")
AMPSCOPE, WORK = arguments("AMPSCOPE_BINARY", "WORK_DIR")
SCRIPT = os.path.join(HERE, "scripts", "gpt2_folder_train.py")
os.makedirs(WORK, exist_ok=True)


# Tiny GPT-2 and Llama folders (config.json, model.safetensors in Hugging Face's names) and a token file,
# written here.
D, L, V, POS, T, B, STEPS, LR = 32, 2, 64, 16, 8, 2, 3, 1e-3
g = torch.Generator().manual_seed(7)


def write_folder(name, config, tensors):
    folder = os.path.join(WORK, name)
    os.makedirs(folder, exist_ok=True)
    header, blobs, offset = {}, [], 0
    for key, t in tensors.items():
        raw = t.contiguous().numpy().astype("<f4").tobytes()
        header[key] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def rand(*shape, mean=0.0):
    return mean + 0.1 * torch.randn(*shape, generator=g)


gpt2 = {"wte.weight": rand(V, D), "wpe.weight": rand(POS, D)}
for i in range(L):
    p = "h.%d." % i
    gpt2.update({p + "ln_1.weight": rand(D, mean=1.0), p + "ln_1.bias": rand(D),
                 p + "attn.c_attn.weight": rand(D, 3 * D), p + "attn.c_attn.bias": rand(3 * D),
                 p + "attn.c_proj.weight": rand(D, D), p + "attn.c_proj.bias": rand(D),
                 p + "ln_2.weight": rand(D, mean=1.0), p + "ln_2.bias": rand(D),
                 p + "mlp.c_fc.weight": rand(D, 4 * D), p + "mlp.c_fc.bias": rand(4 * D),
                 p + "mlp.c_proj.weight": rand(4 * D, D), p + "mlp.c_proj.bias": rand(D)})
gpt2.update({"ln_f.weight": rand(D, mean=1.0), "ln_f.bias": rand(D)})
GPT2_PARAMS = len(gpt2)  # the head is tied to wte
folder = write_folder("gpt2", {"model_type": "gpt2", "vocab_size": V, "n_positions": POS, "n_embd": D, "n_layer": L,
                               "n_head": 4, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}, gpt2)
INNER = 48
llama = {"model.embed_tokens.weight": rand(V, D)}
for i in range(L):
    p = "model.layers.%d." % i
    llama.update({p + "input_layernorm.weight": rand(D, mean=1.0), p + "post_attention_layernorm.weight": rand(D, mean=1.0),
                  p + "mlp.gate_proj.weight": rand(INNER, D), p + "mlp.up_proj.weight": rand(INNER, D),
                  p + "mlp.down_proj.weight": rand(D, INNER)})
    llama.update({p + "self_attn.%s_proj.weight" % n: rand(D, D) for n in "qkvo"})
llama.update({"model.norm.weight": rand(D, mean=1.0), "lm_head.weight": rand(V, D)})
LLAMA_PARAMS = len(llama)
llama_folder = write_folder("llama", {
    "model_type": "llama", "vocab_size": V, "max_position_embeddings": 32, "hidden_size": D, "intermediate_size": INNER,
    "num_hidden_layers": L, "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": False}, llama)
tokens = os.path.join(WORK, "tokens.txt")
with open(tokens, "w") as f:
    f.write(" ".join(str(int(x)) for x in torch.randint(0, V, (200,), generator=torch.Generator().manual_seed(3))))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
    return p


def ours(name, precision, model=None):
    out = os.path.join(WORK, name + ".h5")
    if os.path.exists(out):
        os.remove(out)
    # --max-grad-norm 0: the recorder's /grads are the gradients the optimizer received (after a script's
    # clipping), ours those before clipping; without clipping both are the same gradients.
    p = run([AMPSCOPE, "train", "--model", model or folder, "--tokens", tokens, "--context", str(T), "--batch", str(B),
             "--steps", str(STEPS), "--lr", str(LR), "--max-grad-norm", "0", "--precision", precision, "--out", out])
    check(p.returncode == 0, "ampscope train %s exits 0 (got %d)" % (name, p.returncode))
    return out


def pytorch(name, *extra, script=SCRIPT, model=None):
    out = os.path.join(WORK, name + ".h5")
    if os.path.exists(out):
        os.remove(out)
    p = run([AMPSCOPE, "record", "--out", out, "--", sys.executable, script, model or folder, tokens, "--context", str(T),
             "--batch", str(B), "--steps", str(STEPS), "--lr", str(LR), "--max-grad-norm", "0", *extra])
    check(p.returncode == 0, "ampscope record %s exits 0 (got %d)" % (name, p.returncode))
    return out


def diff(a, b, threshold):
    p = subprocess.run([AMPSCOPE, "diff", a, b, "--json", "--threshold", repr(threshold)], capture_output=True,
                       text=True)
    check(p.returncode in (0, 1), "ampscope diff exits 0 or 1 (got %d): %s" % (p.returncode, p.stderr))
    if p.returncode not in (0, 1):
        finish()  # the check above failed: exit 1
    return json.loads(p.stdout)


# The f32 tolerance. Both runs compute the same math in f32 with different summation orders and libm, so at
# step 0 an op's result differs by its roundoff: about K u relative for a reduction of length K (u = 2^-24),
# K at most 4 D = 128 here, plus what the ops before it passed on (about 50 ops deep): 50 * 128 * 2^-24 = 4e-4
# at most, typically far less (random-walk errors). From step 1 on, AdamW's first steps move each weight by
# lr * m / (sqrt(v) + eps), about +-lr whatever the gradient's size, so a weight whose gradient is at the
# rounding level (its sign decided by the summation order) can move by 2 lr = 2e-3 in one run more than in the
# other: 2% of a weight (rms 0.1), diluted in an op's rms over its K inputs (2% / sqrt(K) < 2e-3 for K >= 100)
# and across the elements. The recorder's own statistics add their f32 accumulation (docs/pytorch.md, "Statistics"):
# a mean within gamma_(n-1) * mean|x| <= gamma_(n-1) * rms, an rms within about gamma_n / 2 of itself, for the n at
# most 4 D * D = 4096 elements of a row here: 2.4e-4 of the op's rms at most. So 1e-3 of an op's largest rms: above
# both bounds for healthy rows (4e-4 + 2.4e-4; measured when written: 6e-5 at most over 3 steps), and far below the
# planted difference (erf(z) - tanh(z) reaches 0.08 at z ~ 1, several percent of the GELU's output).
F32_TOL = 1e-3

a = ours("ours_f32", "fp32")
b = pytorch("torch_f32")
d = diff(a, b, F32_TOL)
check(d["producer_a"] == "ampscope" and d["producer_b"] == "pytorch",
      "producers named: ampscope, pytorch (got %s, %s)" % (d["producer_a"], d["producer_b"]))
check(d["steps_compared"] == STEPS, "%d steps compared (got %d)" % (STEPS, d["steps_compared"]))
check(d["first_divergence"] is None, "f32: no op divergence beyond %g (got %s)" % (F32_TOL, d["first_divergence"]))
check(d["first_loss_divergence"] is None, "f32: losses agree")
check(d["first_grad_divergence"] is None,
      "f32: gradients agree (got %s)" % (d["first_grad_divergence"] and d["first_grad_divergence"]["param"]))
check(d["grads_aligned"] == STEPS * GPT2_PARAMS,
      "every parameter's gradient aligned in every step (got %d)" % d["grads_aligned"])
check(d["dtype_differences"] == [], "f32: no dtype differences (got %s)" % d["dtype_differences"])
# Every op of the model has a partner: what is only in ours is the backward of views (the recorder folds
# views into the op they came from), what is only in PyTorch's is outside the model's modules (the optimizer).
only_a = {(u["phase"], u["op"]) for u in d["only_in_a"]}
check(all(ph == "backward" and op in ("transpose", "view", "permute", "slice", "clone", "reshape")
          for ph, op in only_a), "only in ours: backward rows of views (got %s)" % sorted(only_a))
only_b_forward_in_model = [u for u in d["only_in_b"] if u["module"] != "" and u["phase"] != "optimizer"]
check(only_b_forward_in_model == [], "nothing of the model's modules only in PyTorch's run (got %s)"
      % only_b_forward_in_model)
largest = max((x["max_rel"] for x in d["largest"]), default=0)
check(0 < largest < F32_TOL, "the largest f32 difference is above 0 and below the tolerance (got %g)" % largest)
print("f32: %d op rows aligned, largest difference %.3g of an op's rms" % (d["ops_aligned"], largest))

# The planted difference: block 1's GELU uses erf where GPT-2's uses tanh. tanh is then only in ours and erf
# only in PyTorch's run (both in h.1.mlp), and the first aligned op that parts is the GELU's next op there:
# the add of 1 + erf(...) (occurrence 1 of add in h.1.mlp), in step 0's forward, which names tanh and erf as
# the ops before it that have no partner.
b2 = pytorch("torch_f32_erf", "--erf-gelu-block", "1")
d2 = diff(a, b2, F32_TOL)
f = d2["first_divergence"]
check(f is not None, "planted: a first divergence")
if f is not None:
    k = f["key"]
    check((k["step"], k["phase"], k["module"], k["op"], k["occurrence"]) == (0, "forward", "h.1.mlp", "add", 1),
          "planted: first divergence at step 0, forward, h.1.mlp add #1 (got %s)" % k)
    check(f["max_rel"] > 10 * F32_TOL, "planted: the difference is far above the tolerance (got %g)" % f["max_rel"])
    check((f["unpaired_before_a"], f["unpaired_before_b"]) == (["tanh"], ["erf"]),
          "planted: the first divergence names tanh (ours) and erf (PyTorch's) as the unpaired ops before it "
          "(got %s, %s)" % (f["unpaired_before_a"], f["unpaired_before_b"]))
only = lambda rows: {(u["module"], u["op"]) for u in rows if u["phase"] == "forward"}  # noqa: E731
check(("h.1.mlp", "tanh") in only(d2["only_in_a"]) and ("h.1.mlp", "erf") in only(d2["only_in_b"]),
      "planted: tanh only in ours, erf only in PyTorch's, in h.1.mlp")
check(("h.0.mlp", "tanh") not in only(d2["only_in_a"]), "planted: block 0's tanh still aligned")

# bf16. ampscope's runtime runs CUDA autocast's policy; the script applies the same policy by hand
# (tests/hf/reference_common.py's Policy: products of bf16-rounded inputs computed in f32 and rounded once, as
# cuBLAS does; softmax and layer_norm in f32), so its products are recorded as f32 ops where ours are bf16 ops
# (dtype differences of exactly those ops, checked below), and its backward computes in f32 where ours
# rounds each gradient product to bf16. Each such rounding moves an element by at most half a bf16 unit
# (2^-9 relative), and an op's rms by at most that much; what earlier ops pass on adds a comparable
# disturbance. The tolerance is two bf16 units, 2 * 2^-8 (tests/hf/hf_reference_test.cpp's kBf16Tol, the
# same reasoning): measured when written, 2.1e-3 at most over 3 steps (the backward of attention's matmul).
BF16_TOL = 2 * 2.0 ** -8

a = ours("ours_bf16", "bf16")
b = pytorch("torch_bf16", "--bf16")
d = diff(a, b, BF16_TOL)
check(d["first_divergence"] is None, "bf16: no op divergence beyond %g (got %s)" % (
    BF16_TOL, d["first_divergence"] and (d["first_divergence"]["key"], d["first_divergence"]["max_rel"])))
check(d["first_loss_divergence"] is None, "bf16: losses agree")
check(d["first_grad_divergence"] is None,
      "bf16: gradients agree (got %s)" % (d["first_grad_divergence"] and d["first_grad_divergence"]["param"]))
check(d["ops_aligned"] > 0 and d["steps_compared"] == STEPS, "bf16: %d steps compared" % STEPS)
by_hand = {"linear", "matmul", "softmax", "log_softmax", "mul"}  # what Policy computes in f32 and rounds
other = [(x["module"], x["op"], x["dtypes_a"], x["dtypes_b"]) for x in d["dtype_differences"]
         if x["op"] not in by_hand or "bf16" in x["dtypes_b"]]
check(other == [], "bf16: dtypes differ only where the script computes by hand in f32 (got %s)" % other)
only_a = {(u["phase"], u["op"]) for u in d["only_in_a"]}
check(all(op in ("transpose", "view", "permute", "slice", "clone", "reshape", "to") for _, op in only_a),
      "bf16: only in ours: views and casts (got %s)" % sorted(only_a))
largest_bf16 = max((x["max_rel"] for x in d["largest"]), default=0)
check(0 < largest_bf16 < BF16_TOL, "bf16: largest difference in (0, tolerance) (got %g)" % largest_bf16)
print("bf16: %d op rows aligned, largest difference %.3g of an op's rms" % (d["ops_aligned"], largest_bf16))

b2 = pytorch("torch_bf16_erf", "--bf16", "--erf-gelu-block", "0")
d2 = diff(a, b2, BF16_TOL)
f = d2["first_divergence"]
check(f is not None and (f["key"]["step"], f["key"]["phase"], f["key"]["module"], f["key"]["op"],
                         f["key"]["occurrence"]) == (0, "forward", "h.0.mlp", "add", 1),
      "bf16 planted in block 0: first divergence at step 0, forward, h.0.mlp add #1 (got %s)" % (f and f["key"]))

# bf16 under PyTorch's own autocast: the same script with its ops plain and the forward and loss inside
# torch.autocast("cpu", dtype=torch.bfloat16) (--autocast), as a user writes a bf16 script. Its policy is the
# CPU one: linear and matmul run in bf16 as in ours (no dtype difference there, unlike the by-hand run above), but
# pow, softmax and log_softmax, which CUDA's policy (ours) runs in f32, stay in bf16, and with them the
# element-wise ops after them (GELU's mul, add and tanh). Each of those rounds its elements to bf16, a relative
# error of at most half a bf16 unit (2^-9) per element, of either sign; an op's statistics (its rms) average
# that over its elements (512 at least here), so the rounding moves them by far less than the half unit each
# element can move; the products and the backward round as in ours. The reasoning above for the by-hand run
# holds, with the same tolerance, two bf16 units: measured when written, 3.2e-3 at most over 3 steps (the
# backward of attention's matmul in h.1), and the planted erf far above it (1.9e-2).
a = ours("ours_bf16", "bf16")
b = pytorch("torch_bf16_autocast", "--autocast")
d = diff(a, b, BF16_TOL)
check(d["first_divergence"] is None and d["first_loss_divergence"] is None and d["first_grad_divergence"] is None,
      "bf16 autocast: no divergence beyond %g (got %s)" % (
          BF16_TOL, d["first_divergence"] and (d["first_divergence"]["key"], d["first_divergence"]["max_rel"])))
check(d["ops_aligned"] > 0 and d["steps_compared"] == STEPS and d["grads_aligned"] == STEPS * GPT2_PARAMS,
      "bf16 autocast: %d steps, every gradient compared (got %d, %d)" % (STEPS, d["steps_compared"], d["grads_aligned"]))
cpu_bf16 = {"pow", "softmax", "log_softmax", "mul", "add", "tanh"}  # bf16 under CPU autocast, f32 in ours
diffs = [(x["module"], x["op"], x["dtypes_a"], x["dtypes_b"]) for x in d["dtype_differences"]]
# log_softmax: its input is bf16 in ours, f32 in the script's (it casts the logits with .float() before the loss).
check(diffs and all(op in cpu_bf16 and ("bf16" in db or op == "log_softmax") for _, op, _, db in diffs),
      "bf16 autocast: dtypes differ only at the element-wise ops CPU autocast leaves in bf16 (got %s)" % diffs)
check(not any(op in ("linear", "matmul") for _, op, _, _ in diffs), "bf16 autocast: products in bf16 in both runs")
check(all(op in ("transpose", "view", "permute", "slice", "clone", "reshape", "to") for _, op in
          {(u["phase"], u["op"]) for u in d["only_in_a"]}) and d["only_in_b"] == [],
      "bf16 autocast: only in ours: views and casts; nothing only in PyTorch's (got %s, %s)" % (
          sorted({(u["phase"], u["op"]) for u in d["only_in_a"]}), d["only_in_b"][:5]))
largest_ac = max((x["max_rel"] for x in d["largest"]), default=0)
check(0 < largest_ac < BF16_TOL, "bf16 autocast: largest difference in (0, tolerance) (got %g)" % largest_ac)
print("bf16 autocast: %d op rows aligned, largest difference %.3g of an op's rms" % (d["ops_aligned"], largest_ac))
b2 = pytorch("torch_bf16_autocast_erf", "--autocast", "--erf-gelu-block", "0")
f = diff(a, b2, BF16_TOL)["first_divergence"]
check(f is not None and (f["key"]["step"], f["key"]["phase"], f["key"]["module"], f["key"]["op"], f["key"]["occurrence"],
                         f["unpaired_before_a"], f["unpaired_before_b"]) ==
      (0, "forward", "h.0.mlp", "add", 1, ["tanh"], ["erf"]) and f["max_rel"] > 2 * BF16_TOL,
      "bf16 autocast planted in block 0: first divergence at step 0, forward, h.0.mlp add #1 after tanh/erf (got %s)" % (
          f and [f["key"], f["max_rel"], f["unpaired_before_a"], f["unpaired_before_b"]],))

# Llama (tests/record/scripts/llama_folder_train.py: tests/hf/reference_llama.py's math in nn.Modules named as
# transformers names them). RMSNorm's weight * x: our runtime's backward row is the weight's gradient ([32]),
# the recorder's the gradient that flows on ([2, 8, 32]): listed as different tensors, not judged. The same
# tolerances: the same math, 2 layers, reductions at most 48 long.
LLAMA = os.path.join(HERE, "scripts", "llama_folder_train.py")
for precision, tol, extra in (("fp32", F32_TOL, ()), ("bf16", BF16_TOL, ("--bf16",))):
    a = ours("ours_llama_" + precision, precision, model=llama_folder)
    b = pytorch("torch_llama_" + precision, *extra, script=LLAMA, model=llama_folder)
    d = diff(a, b, tol)
    what = "llama %s" % precision
    check(d["steps_compared"] == STEPS and d["grads_aligned"] == STEPS * LLAMA_PARAMS,
          "%s: %d steps and every gradient compared (got %d, %d)" % (what, STEPS, d["steps_compared"],
                                                                    d["grads_aligned"]))
    check(d["first_divergence"] is None and d["first_loss_divergence"] is None and d["first_grad_divergence"] is None,
          "%s: no divergence beyond %g (got %s)" % (what, tol, d["first_divergence"] and d["first_divergence"]["key"]))
    norms = {u["module"].rsplit(".", 1)[-1] for u in d["different_tensors"]}
    check(d["different_tensors"] and all(u["phase"] == "backward" and u["op"] == "mul" and u["shape_a"] == "[%d]" % D
                                         for u in d["different_tensors"])
          and norms == {"input_layernorm", "post_attention_layernorm", "norm"},
          "%s: different tensors only at the norms' backward mul (got %s)" % (what, d["different_tensors"]))
    largest = max((x["max_rel"] for x in d["largest"]), default=0)
    check(0 < largest < tol, "%s: largest difference in (0, tolerance) (got %g)" % (what, largest))
    print("%s: %d op rows aligned, largest difference %.3g of an op's rms" % (what, d["ops_aligned"], largest))
    if precision == "fp32":
        llama_f32 = a

# Planted: relu where Llama's MLP uses SiLU, in layer 1: the first divergence is the MLP's product of the
# activation and up_proj (mul in model.layers.1.mlp), naming silu (ours) and relu (PyTorch's) before it.
b = pytorch("torch_llama_relu", "--relu-layer", "1", script=LLAMA, model=llama_folder)
f = diff(llama_f32, b, F32_TOL)["first_divergence"]
check(f is not None and (f["key"]["step"], f["key"]["phase"], f["key"]["module"], f["key"]["op"], f["key"]["occurrence"],
                         f["unpaired_before_a"], f["unpaired_before_b"]) ==
      (0, "forward", "model.layers.1.mlp", "mul", 0, ["silu"], ["relu"]),
      "llama planted: first divergence at step 0, model.layers.1.mlp mul after silu/relu (got %s)" % (
          f and [f["key"], f["unpaired_before_a"], f["unpaired_before_b"]],))

finish()
