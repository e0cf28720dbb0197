# A sequence classifier stored in bf16 whose pooling layer sums its time steps in a running total, as a user
# writes it: in bf16 the total swamps each new term long before anything overflows (nothing here overflows).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(3)


class SumPool(nn.Module):
    def forward(self, h):
        total = torch.zeros_like(h[:, 0])
        for t in range(h.shape[1]):
            total = total + h[:, t]
        return total / h.shape[1]


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.pool = SumPool()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.embed(x)) + 1.0))


model = Classifier().to(torch.bfloat16)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(3):
    x = torch.randn(16, 256, 8).to(torch.bfloat16)
    y = torch.randint(0, 4, (16,))
    opt.zero_grad()
    loss = F.cross_entropy(model(x).float(), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
