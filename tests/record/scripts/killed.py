# Trains, and is killed with SIGKILL in the middle of step 3's forward pass (as an OOM killer would).
import os
import signal

import torch
import torch.nn as nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for i in range(6):
    h = net[0](torch.randn(4, 8))
    if i == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    loss = net[2](net[1](h)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
