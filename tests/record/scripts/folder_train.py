"""What gpt2_folder_train.py and llama_folder_train.py share: their command line (each adds its planted
difference) and the training loop of `ampscope train --model` (the window rule of docs/checkpoints.md, AdamW
with weight decay 0, gradient clipping, one loss line a step)."""
import argparse

import torch
import torch.nn.functional as F


def arguments():
    """The shared options; the caller adds its own and parses."""
    a = argparse.ArgumentParser()
    a.add_argument("folder")
    a.add_argument("tokens")
    a.add_argument("--context", type=int, required=True)
    a.add_argument("--batch", type=int, required=True)
    a.add_argument("--steps", type=int, required=True)
    a.add_argument("--lr", type=float, required=True)
    a.add_argument("--max-grad-norm", type=float, default=1.0)  # 0: no clipping
    a.add_argument("--bf16", action="store_true")
    # The forward and the loss under PyTorch's own CPU autocast, as a user writes a bf16 script (the model's ops
    # plain, no policy by hand): torch's CPU policy, not the CUDA one ampscope's runtime follows.
    a.add_argument("--autocast", action="store_true")
    return a


def train(model, args):
    with open(args.tokens) as f:
        ids = torch.tensor([int(v) for v in f.read().split()], dtype=torch.int64)
    T, B = args.context, args.batch
    windows = (ids.numel() - 1) // T
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    for step in range(args.steps):
        # The window rule: step s takes windows s*B .. s*B + B - 1 (mod the number of whole windows) of T + 1
        # tokens.
        batch = torch.stack([ids[((step * B + r) % windows) * T:((step * B + r) % windows) * T + T + 1]
                             for r in range(B)])
        x, y = batch[:, :T], batch[:, 1:]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            loss = F.cross_entropy(model(x).reshape(B * T, -1).float(), y.reshape(B * T))
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        print("step %d loss %.6f" % (step, float(loss)))
