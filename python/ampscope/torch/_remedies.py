"""Remedies applied from outside the script (`ampscope record --autocast-fp32 GLOB ...`, what `ampscope fix`
runs to prove a remedy on a recorded PyTorch run; docs/pytorch.md, "Proving a fix").

The options arrive in AMPSCOPE_RECORD_OPTIONS["remedies"]:
- autocast_fp32: module path globs (fnmatch, matched against the recorder's module paths): each matching
  module's forward runs with autocast disabled and its floating positional inputs cast to f32, which is what
  `--autocast-fp32` means in ampscope's own runtime (ops that ran in bf16/f16 inside it run in f32);
- autocast: "bf16" (autocast regions asking for f16 get bf16) or "off" (every autocast region disabled: the
  f32 reference);
- init_scale, growth_interval: every GradScaler created gets them;
- lr_factor: every optimizer's param_groups' lr is multiplied by it when the optimizer is created (a scheduler
  made after it starts from the scaled value);
- stop_after: the recorder ends the process (status 0) right after that step's end is written.

`applied` counts what each remedy acted on; the recorder writes it into the trace's config ("remedies"), so
`ampscope fix` can tell a remedy that matched nothing ("not applied") from one that did not help.
"""
import fnmatch
import os
import sys

import torch


def _floating_to_f32(value):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype in (torch.float16, torch.bfloat16):
            return value.float()
        return value
    if isinstance(value, tuple):
        return tuple(_floating_to_f32(v) for v in value)
    if isinstance(value, list):
        return [_floating_to_f32(v) for v in value]
    return value


class Remedies:
    def __init__(self, options):
        options = options or {}
        self.globs = [str(g) for g in options.get("autocast_fp32", [])]
        self.autocast = options.get("autocast", "") or ""
        self.init_scale = options.get("init_scale")
        self.growth_interval = options.get("growth_interval")
        self.lr_factor = options.get("lr_factor")
        self.stop_after = options.get("stop_after")
        self.applied = {}
        self.f32_stack = []  # per module call: the autocast contexts entered for it, or None

    def any(self):
        return bool(self.globs or self.autocast or self.init_scale is not None or self.growth_interval is not None or
                    self.lr_factor is not None or self.stop_after is not None)

    def requested(self):
        r = {}
        if self.globs:
            r["autocast_fp32"] = self.globs
        if self.autocast:
            r["autocast"] = self.autocast
        for key in ("init_scale", "growth_interval", "lr_factor", "stop_after"):
            if getattr(self, key) is not None:
                r[key] = getattr(self, key)
        return r

    def count(self, key):
        self.applied[key] = self.applied.get(key, 0) + 1

    # ---------------------------------------------------------------- a module kept in f32
    def module_enter(self, path, inputs):
        """Called by the recorder's forward pre-hook with the module's path; returns the new inputs or None."""
        if not self.globs or not any(fnmatch.fnmatchcase(path, g) for g in self.globs):
            self.f32_stack.append(None)
            return None
        contexts = [torch.autocast("cpu", enabled=False)]
        if torch.cuda.is_available():
            contexts.append(torch.autocast("cuda", enabled=False))
        for c in contexts:
            c.__enter__()
        self.f32_stack.append(contexts)
        self.count("autocast_fp32:" + path)
        return _floating_to_f32(inputs)

    def module_exit(self):
        if not self.f32_stack:
            return
        contexts = self.f32_stack.pop()
        for c in reversed(contexts or []):
            c.__exit__(None, None, None)

    # ---------------------------------------------------------------- class wrappers (installed once)
    def install(self):
        if self.autocast in ("bf16", "off"):
            self._wrap_autocast()

    def _wrap_autocast(self):
        cls = torch.amp.autocast_mode.autocast
        original = cls.__init__
        remedies = self

        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if enabled:
                if remedies.autocast == "off":
                    enabled = False
                    remedies.count("autocast_off")
                elif dtype == torch.float16 or (dtype is None and device_type == "cuda"):
                    dtype = torch.bfloat16
                    remedies.count("autocast_bf16")
            original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        cls.__init__ = __init__

    def on_optimizer(self, optimizer):
        if self.lr_factor is None:
            return
        for group in optimizer.param_groups:
            if "lr" in group:
                group["lr"] = group["lr"] * float(self.lr_factor)
        self.count("lr_factor")

    def on_scaler(self, scaler):
        if self.init_scale is not None and hasattr(scaler, "_init_scale"):
            scaler._init_scale = float(self.init_scale)
            if getattr(scaler, "_scale", None) is not None:  # already made: start it at the new value
                scaler._scale.fill_(float(self.init_scale))
            self.count("init_scale")
        if self.growth_interval is not None and hasattr(scaler, "_growth_interval"):
            scaler._growth_interval = int(self.growth_interval)
            self.count("growth_interval")

    def stop_now(self, finished_step):
        return self.stop_after is not None and finished_step >= int(self.stop_after)


def end_process():
    """Ends the recorded process at a step boundary (stop_after): the script's own output is flushed, then
    os._exit, so no code of the script runs after the step (a `finally` that would train on is not run)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)
