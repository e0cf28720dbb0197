# A bf16 model (linear, softmax, layer norm) trained two steps under CPU autocast. `api_twin.py OUT` records
# both steps itself with the Python API and the twin (ampscope.torch.record(OUT, twin=True)); run under
# `ampscope record --twin` it records nothing itself, so the two traces can be compared row for row.
import sys

import torch
import torch.nn as nn

import ampscope.torch as amp

torch.manual_seed(9)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        p = torch.softmax(torch.tanh(self.fc(x)) * 4, dim=-1)
        return self.norm(p.float())


model = Head()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(2, 8, 32)


def train():
    for i in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(data[i])
        loss = y.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step %d loss %.9g" % (i, loss.item()))


if amp.recording():
    train()
else:
    with amp.record(sys.argv[1], optimizers=[opt], twin=True):
        train()
