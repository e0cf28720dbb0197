# A two-layer residual MLP whose blocks run under activation checkpointing, as a user saves memory.
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(5)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(16) for _ in range(2)])
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x)
        return self.head(x)


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(2, 8, 16, requires_grad=True)
t = torch.randn(2, 8, 1)
for i in range(2):
    loss = ((model(x[i]) - t[i]) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step %d loss %.4f" % (i, loss.item()))
