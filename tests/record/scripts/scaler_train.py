# Loss scaling with a GradScaler on the CPU. torch 1.13's GradScaler is CUDA-only, so this script brings a
# subclass that does its two CUDA kernels' work with plain torch ops (as a CPU GradScaler would); step 2's batch
# holds an inf, so that step's gradients overflow, the optimizer step is skipped and the scale backs off.
import warnings

import torch
import torch.nn as nn


class CpuGradScaler(torch.cuda.amp.GradScaler):
    def __init__(self, init_scale, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(init_scale, growth_factor, backoff_factor, growth_interval, enabled=False)
        self._enabled = True
        self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
        self._growth_interval = growth_interval
        self._init_scale = float(init_scale)
        self._scale_value = None  # made at the first scale(), as GradScaler makes its scale tensor
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


torch.manual_seed(2)
net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
scaler = CpuGradScaler(1024.0, growth_interval=2)
for i in range(4):
    x = torch.randn(5, 6)
    if i == 2:
        x[0, 0] = float("inf")
    loss = net(x).square().mean()
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
