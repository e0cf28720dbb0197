# A user's own activation as a torch.autograd.Function with a hand-written backward (a squared ReLU), in an
# MLP trained the usual way.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(11)


class SquaredReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.relu(x) ** 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * torch.relu(x)


class Act(nn.Module):
    def forward(self, x):
        return SquaredReLU.apply(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = Act()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(2, 8, 16)
y = torch.randint(0, 4, (2, 8))
for i in range(2):
    loss = F.cross_entropy(model(x[i]), y[i])
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("step %d loss %.4f" % (i, loss.item()))
