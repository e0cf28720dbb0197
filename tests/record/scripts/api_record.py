# A plain `python3 api_record.py OUT` run that records two of its four steps itself with the Python API.
# OUT "none": no recording (the reference run). --fail: the second recorded step raises inside the block.
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import ampscope.torch as at

out = sys.argv[1]
fail = "--fail" in sys.argv
torch.manual_seed(3)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 5, 8)
y = torch.randint(0, 3, (4, 5))


def train_step(i):
    loss = F.cross_entropy(model(x[i]), y[i])
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step %d loss %.9g" % (i, loss.item()))


train_step(0)
if out == "none":
    train_step(1)
    train_step(2)
else:
    try:
        with at.record(out, optimizers=[opt]):
            print("recording", at.recording())
            train_step(1)
            if fail:
                raise ValueError("planted")
            train_step(2)
    except ValueError:
        print("raised")
print("recording", at.recording())
train_step(3)
