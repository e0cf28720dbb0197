# A model stored in bf16 (a linear, a softmax, a layer norm), one SGD step, written as a user writes it; with a
# path argument it saves its input, parameters and each op's output there (torch.save) for the twin test.
# With --autocast as a second argument the model stays in f32 and runs under CPU autocast (bf16).
import sys

import torch
import torch.nn as nn

torch.manual_seed(7)
saved = {}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        self.h = self.fc(x)
        if self.training and len(sys.argv) > 1:
            self.h.register_hook(lambda g: saved.update(dh=g.detach().clone()))  # the linear's incoming gradient
        self.p = torch.softmax(self.h * 4, dim=-1)
        # torch 1.13's CPU layer_norm refuses a bf16 input with f32 weights (autocast leaves it so): cast it.
        return self.norm(self.p.to(self.norm.weight.dtype))


AUTOCAST = "--autocast" in sys.argv
model = Head() if AUTOCAST else Head().to(torch.bfloat16)
with torch.no_grad():
    model.norm.weight.uniform_(0.5, 1.5)
    model.norm.bias.uniform_(-0.5, 0.5)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 32) if AUTOCAST else torch.randn(8, 32).to(torch.bfloat16)
with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
    y = model(x)
loss = y.float().pow(2).mean()
loss.backward()
if len(sys.argv) > 1:
    torch.save({"x": x, "w": model.fc.weight.detach().clone(), "b": model.fc.bias.detach().clone(),
                "h": model.h.detach(), "hs": (model.h * 4).detach(), "p": model.p.detach(), "y": y.detach(),
                "gamma": model.norm.weight.detach().clone(), "beta": model.norm.bias.detach().clone(),
                "dh": saved["dh"], "dw": model.fc.weight.grad.clone(), "db": model.fc.bias.grad.clone()}, sys.argv[1])
opt.step()
