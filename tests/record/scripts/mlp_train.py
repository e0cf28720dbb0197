# A small MLP classifier trained the way a user writes it; `--bf16` trains under CPU autocast.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--exit-status", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(1234)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = torch.randn(args.steps, 16, 32)
labels = torch.randint(0, 10, (args.steps, 16))
for i in range(args.steps):
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
        logits = model(data[i])
        loss = F.cross_entropy(logits, labels[i])
    loss.backward()
    opt.step()
    print(f"step {i} loss {loss.item():.4f}")
raise SystemExit(args.exit_status)
