# A bf16 classifier with a hand-written, "sharpened" cross-entropy in a loss module. With a small temperature
# the softmax of the sharpened logits underflows to exactly 0 for the unlikely classes, and log(0) = -inf.
# `--exp` instead writes the softmax by hand with exp(), which overflows bf16 once a logit passes ~88.7.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--temperature", type=float, default=0.002)
parser.add_argument("--exp", action="store_true")
args = parser.parse_args()
torch.manual_seed(3)


class SharpCrossEntropy(nn.Module):
    def __init__(self, temperature, by_hand):
        super().__init__()
        self.temperature = temperature
        self.by_hand = by_hand

    def forward(self, logits, target):
        z = logits / self.temperature
        if self.by_hand:
            e = torch.exp(z)
            p = e / e.sum(dim=-1, keepdim=True)
        else:
            p = torch.softmax(z, dim=-1)
        onehot = nn.functional.one_hot(target, z.shape[-1]).to(p.dtype)
        return -(onehot * torch.log(p)).sum(dim=-1).mean()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
        self.criterion = SharpCrossEntropy(args.temperature, args.exp)

    def forward(self, x, y):
        return self.criterion(self.body(x), y)


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for i in range(2):
    x, y = torch.randn(8, 16), torch.randint(0, 8, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = net(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {i} loss {loss.item()}")
