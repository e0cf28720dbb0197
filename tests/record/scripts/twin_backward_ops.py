# A small bf16 model whose ops' backward reads their output or the forward's statistics (layer norm, softmax,
# log_softmax, tanh, sigmoid, exp), one SGD step, written as a user writes it. With a path argument it saves
# each op's input, output, parameters and incoming gradient there (torch.save) for the twin test.
import sys

import torch
import torch.nn as nn

torch.manual_seed(11)
SAVE = sys.argv[1] if len(sys.argv) > 1 else None
saved = {}


def keep(name, t):
    """t's value, and the gradient that reaches it in backward, under `name` (for the test only)."""
    if SAVE:
        saved[name] = t.detach().clone()
        t.register_hook(lambda g: saved.update({"d" + name: g.detach().clone()}))
    return t


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(24)

    def forward(self, x):
        # Each op's input is used by that op alone, so the gradient reaching it is the op's node's own gradient.
        n = keep("n", self.norm(keep("x", x)))
        t = keep("t", torch.tanh(keep("a", n * 1.5)))
        s = keep("s", torch.sigmoid(keep("b", n * 2)))
        e = keep("e", torch.exp(keep("c", n * 0.5)))
        p = keep("p", torch.softmax(keep("u", t * 3), dim=-1))
        q = keep("q", torch.log_softmax(keep("v", s * 4), dim=-1))
        return p + q * 0.25 + e

model = Block().to(torch.bfloat16)
with torch.no_grad():
    model.norm.weight.uniform_(0.5, 1.5)
    model.norm.bias.uniform_(-0.5, 0.5)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = (torch.randn(6, 24) * 3 + 1).to(torch.bfloat16).requires_grad_()
y = model(x)
target = torch.randn(6, 24)
loss = ((y.float() - target) ** 2).mean()
loss.backward()
if SAVE:
    saved.update(gamma=model.norm.weight.detach().clone(), beta=model.norm.bias.detach().clone(),
                 dgamma=model.norm.weight.grad.clone(), dbeta=model.norm.bias.grad.clone())
    torch.save(saved, SAVE)
opt.step()
print("loss %.4f" % loss.item())
