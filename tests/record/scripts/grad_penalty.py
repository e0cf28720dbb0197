# A regressor trained with a gradient penalty computed by torch.autograd.grad (as in WGAN-GP).
import torch
import torch.nn as nn

torch.manual_seed(5)
net = nn.Sequential(nn.Linear(4, 16), nn.Softplus(), nn.Linear(16, 1))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
for i in range(3):
    x = torch.randn(10, 4, requires_grad=True)
    out = net(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    loss = (out - 1).pow(2).mean() + 0.1 * (g.norm(dim=1) - 1).pow(2).mean()
    opt.zero_grad()
    torch.autograd.backward(loss)
    opt.step()
