# A bf16 binary classifier on raw (unstandardised) features, with binary cross-entropy written by hand in a loss
# module, as it is often written: p = sigmoid(logits), -(y log p + (1 - y) log(1 - p)). Under CPU autocast the
# head's linear runs in bf16 and so does the sigmoid after it: above a logit of about 5.5, sigmoid rounds to
# exactly 1 in bf16 (1 - 2^-9 is the last value below 1), log(1 - p) is -inf and the loss is NaN. In f32 the
# largest logits here (about 12) stay below 1 after the sigmoid, and the loss is finite.
# `--marker FILE` writes FILE first (tests check that `ampscope fix` without --run ran nothing).
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--marker", default="")
args = parser.parse_args()
if args.marker:
    with open(args.marker, "a") as f:
        f.write("ran\n")
torch.manual_seed(0)


class BinaryCrossEntropy(nn.Module):
    def forward(self, logits, y):
        p = torch.sigmoid(logits)
        return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
        self.head = nn.Linear(32, 1)
        self.criterion = BinaryCrossEntropy()

    def forward(self, x, y):
        return self.criterion(self.head(self.body(x)).squeeze(-1), y)


model = Classifier()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
w_true = torch.randn(8)
for step in range(args.steps):
    x = torch.randn(64, 8) * 20  # raw features, never standardised
    y = (x @ w_true > 0).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
