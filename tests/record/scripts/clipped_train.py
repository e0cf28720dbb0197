# An MLP trained the way many users write it: AdamW, gradient clipping with clip_grad_norm_ imported by name,
# `--bf16` under CPU autocast. It prints each step's loss and the norm clip_grad_norm_ returned.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_

parser = argparse.ArgumentParser()
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(99)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(24, 48)
        self.fc2 = nn.Linear(48, 6)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
data = torch.randn(args.steps, 20, 24)
labels = torch.randint(0, 6, (args.steps, 20))
for i in range(args.steps):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        loss = F.cross_entropy(model(data[i]), labels[i])
    loss.backward()
    norm = clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {i} loss {loss.item():.6f} norm {float(norm):.9g}")
