# A linear model written with elementwise ops (features times per-feature weights, summed), stored in f16 and
# trained with loss scaling at GradScaler's default initial scale (2^16), as a user writes it. torch 1.13's
# GradScaler is CUDA-only, so the script brings a stand-in subclass that does its kernels' work with plain
# torch ops (on the CPU, f16 matrix products are not implemented, elementwise ops are). The targets are in the
# tens, so the unscaled gradients are about 50: scaled by 2^16 they overflow f16 in backward, every step is
# skipped while the scale halves each step, and within the run the scale never gets low enough (below 65504 /
# 50); at 1024 nothing overflows and the model trains. Usage: scaled_f16_train.py [--steps N]
import sys
import warnings

import torch
import torch.nn as nn

STEPS = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 6


class CpuGradScaler(torch.cuda.amp.GradScaler):
    def __init__(self, init_scale, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(init_scale, growth_factor, backoff_factor, growth_interval, enabled=False)
        self._enabled = True
        self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
        self._growth_interval = growth_interval
        self._init_scale = float(init_scale)
        self._scale_value = None
        self._tracker = 0
        self._per_optimizer_states = {}

    def scale(self, loss):
        if self._scale_value is None:
            self._scale_value = self._init_scale
        return loss * self._scale_value

    def get_scale(self):
        return self._init_scale if self._scale_value is None else self._scale_value

    def _get_growth_tracker(self):
        return self._tracker

    def unscale_(self, optimizer):
        state = self._per_optimizer_states.setdefault(id(optimizer), {"unscaled": False})
        if state["unscaled"]:
            return
        found = torch.zeros(())
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(1.0 / self._scale_value)
                        found += (~torch.isfinite(p.grad)).any().float()
        state["found_inf_per_device"] = {"cpu": found}
        state["unscaled"] = True

    def step(self, optimizer, *args, **kwargs):
        self.unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        if sum(v.item() for v in state["found_inf_per_device"].values()) == 0:
            return optimizer.step(*args, **kwargs)
        return None

    def update(self):
        found = any(sum(v.item() for v in s["found_inf_per_device"].values()) > 0
                    for s in self._per_optimizer_states.values())
        if found:
            self._scale_value *= self._backoff_factor
            self._tracker = 0
        else:
            self._tracker += 1
            if self._tracker == self._growth_interval:
                self._scale_value *= self._growth_factor
                self._tracker = 0
        self._per_optimizer_states = {}


torch.manual_seed(6)


class PerFeature(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return (x * self.weight).sum(-1) + self.bias


x = torch.randn(64, 16)
y = (x @ torch.randn(16)) * 7 + 21
model = PerFeature(16).half()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = CpuGradScaler(2.0 ** 16)
x = x.half()
for step in range(STEPS):
    opt.zero_grad()
    loss = (model(x).float() - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    print("step %d loss %.9g scale %g" % (step, loss.item(), scaler.get_scale()))
