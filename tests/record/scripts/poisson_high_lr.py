# A Poisson regression (counts predicted as exp of a small MLP's output) stored in bf16 and trained with a
# learning rate too high for it, as a user writes it: each step overshoots further, the head's weights grow
# until its output passes 88.7 and exp overflows (bf16 has f32's range: f32 overflows there too), and the loss
# is inf. With a tenth of the learning rate it trains.
# Usage: poisson_high_lr.py [--lr LR] [--steps N]
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.3)
parser.add_argument("--steps", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(4)
features = torch.randn(64, 8)
true_w = torch.randn(8) * 0.5
counts = torch.poisson(torch.exp(features @ true_w + 1.0))


class Rate(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x))).squeeze(-1)  # the log of the rate


model = Rate().to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
x, y = features.to(torch.bfloat16), counts.to(torch.bfloat16)
for step in range(args.steps):
    opt.zero_grad()
    log_rate = model(x)
    loss = (torch.exp(log_rate) - y * log_rate).float().mean()
    loss.backward()
    opt.step()
    print("step %d loss %.9g" % (step, loss.item()))
