# A small MLP trained the way a user writes it, with one corrupt sample: step --bad-step's batch holds an inf (a
# broken record in the data). The script drops that step's gradients when its loss is not finite (the optimizer
# still steps: no update) and goes on, so the steps around it are finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--bad-step", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(4321)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(args.steps, 16, 32)
data[args.bad_step, 5, 7] = float("inf")
labels = torch.randint(0, 10, (args.steps, 16))
for i in range(args.steps):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(data[i]), labels[i])
    loss.backward()
    if not math.isfinite(loss.item()):
        opt.zero_grad(set_to_none=True)  # skip the bad batch
    opt.step()
    print(f"step {i} loss {loss.item():.4f}")
